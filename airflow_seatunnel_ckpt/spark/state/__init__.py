"""Keyed state on executors: a key set for de-duplication and a key -> value map.

One update: the input is repartitioned by the key into exactly ``key_groups`` partitions
(Spark's ``pmod(hash(key), G)``, the expression that defines the key group, checked on
every row); one ``mapInArrow`` task per key group loads its chain from the store, filters
or merges the rows, and writes the key group's new part (a delta of the changed keys, or a
full part when the chain bound says so); it reports the part in a JSON file of the
update's report folder. Nothing of the state passes through the driver, and the data
makes one pass. Part names carry the attempt and a per-task token, so a retried or
speculative evaluation never overwrites a reported part.

- :mod:`.settings` -- :class:`StateSettings`, the typed object shipped to the tasks;
- :mod:`.executor` -- what runs on the executors (de-duplicate, merge, read, parts);
- :mod:`.reports` -- the report protocol between the tasks and the driver;
- :mod:`.keyed` -- the driver side: :class:`KeySet`, :class:`KeyValueState`, the
  repartitioning and the reconciliation of the reports into chains.
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
    "DEFAULT_CHUNK_ROWS", "KEY_GROUP_COLUMN", "Aggregate", "KeySet", "KeyValueState", "KeyedState", "PartPolicy",
    "PartReport", "ReportFolder", "StateError", "StateKind", "StateSettings", "StoreLocation", "dedup_keep",
    "merge_partition", "read_partition",
]
