"""Keyed state on executors: a key set for de-duplication and a key -> value map.

- :mod:`.settings` -- :class:`StateSettings`, the typed object shipped to the tasks;
- :mod:`.executor` -- what runs on the executors (de-duplicate, merge, read, parts);
- :mod:`.reports` -- the report protocol between the tasks and the driver;
- :mod:`.keyed` -- the driver side: :class:`KeySet`, :class:`KeyValueState` and the reconciliation of the reports into
  chains.
"""

from airflow_seatunnel_ckpt.spark.state.executor import merge_partition
from airflow_seatunnel_ckpt.spark.state.keyed import KeyedState, KeySet, KeyValueState
from airflow_seatunnel_ckpt.spark.state.reports import ReportFolder
from airflow_seatunnel_ckpt.spark.state.settings import (
    KEY_GROUP_COLUMN,
    Aggregate,
    PartPolicy,
    StateError,
    StateKind,
    StateSettings,
    StoreLocation,
)

__all__ = [
    "KEY_GROUP_COLUMN", "Aggregate", "KeySet", "KeyValueState", "KeyedState", "PartPolicy", "ReportFolder",
    "StateError", "StateKind", "StateSettings", "StoreLocation", "merge_partition",
]
