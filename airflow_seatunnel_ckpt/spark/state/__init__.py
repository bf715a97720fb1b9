"""Keyed state on executors: a key set for de-duplication and a key -> value map.

How one update works (the design measured in ``bench/bench_spark_stage.py``):

1. The input is repartitioned by the key into exactly ``key_groups`` partitions.
   Spark's hash partitioning puts a row in partition ``pmod(hash(key), G)`` -- the same
   JVM expression that defines the key group -- so partition ``g`` holds key group
   ``g`` and nothing else (checked on every row).
2. One ``mapInArrow`` task per key group loads the key group's chain (full part +
   deltas) straight from the checkpoint store, filters or merges the rows, streams the
   result on, and at the end of its input writes the key group's new part: a delta with
   only the changed keys, or a full part when the core's chain bound says so. Nothing
   of the state passes through the driver.
3. The task reports the part's reference (path, size, CRC32C) in a small JSON file of
   the update's report folder in the store (below the attempt's staging), written once
   the part is complete -- the same on a classic session and through Spark Connect. A
   key group with no changes reports none and keeps its previous chain (incremental
   checkpoints: unchanged key groups are not rewritten).

The update runs when the stage's output is computed (normally by a sink write), so the
data makes one pass. Part names carry the attempt *and* a per-task token, so a retried,
speculative or repeated evaluation never overwrites a part another evaluation reported;
the runner keeps one report per key group and removes the other parts.

Where each step lives:

- :mod:`.settings` -- :class:`StateSettings`, the one typed object the runner builds per
  state and Spark ships to the tasks (kinds, aggregates, store locations, part policy);
- :mod:`.executor` -- what runs on the executors, one task per key group: de-duplicate
  (a scalar Arrow UDF over the keys), merge or read (``mapInArrow``) and load/write the
  key group's parts (steps 2 and 3);
- :mod:`.reports` -- the report protocol between the tasks and the driver;
- :mod:`.keyed` -- the driver side: :class:`KeySet`, :class:`KeyValueState`, the
  repartitioning of step 1 and the reconciliation of the reports into chains.
"""

from airflow_seatunnel_ckpt.spark.state.executor import dedup_keep, merge_partition, read_partition
from airflow_seatunnel_ckpt.spark.state.keyed import KeyedState, KeySet, KeyValueState
from airflow_seatunnel_ckpt.spark.state.reports import PartReport, ReportFolder
from airflow_seatunnel_ckpt.spark.state.settings import (
    DEFAULT_CHUNK_ROWS,
    KEY_GROUP_COLUMN,
    Aggregate,
    PartPolicy,
    StateError,
    StateKind,
    StateSettings,
    StoreLocation,
)

__all__ = [
    "DEFAULT_CHUNK_ROWS",
    "KEY_GROUP_COLUMN",
    "Aggregate",
    "KeySet",
    "KeyValueState",
    "KeyedState",
    "PartPolicy",
    "PartReport",
    "ReportFolder",
    "StateError",
    "StateKind",
    "StateSettings",
    "StoreLocation",
    "dedup_keep",
    "merge_partition",
    "read_partition",
]
