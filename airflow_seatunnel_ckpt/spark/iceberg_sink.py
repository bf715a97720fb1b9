"""The Iceberg sink: ``{"type": "iceberg", "table": "<namespace>.<name>", ...}`` in a stage spec."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from airflow_seatunnel_ckpt.core.models import SinkMode
from airflow_seatunnel_ckpt.spark.table_sinks import TableSink


class IcebergSink(TableSink):
    """Epochs committed into an Apache Iceberg table with pyiceberg (one snapshot per epoch).

    Options: ``table`` (``namespace.name``), ``catalog`` (pyiceberg catalog properties,
    never secrets; default: the embedded SQL catalog on SQLite), ``catalog_name``,
    ``partition_by``, ``mode``.
    """

    table_type = "iceberg"

    def __init__(self, name: str, table: str, catalog: Mapping[str, Any] | None = None,
                 catalog_name: str = "default", partition_by: Sequence[str] | None = None,
                 mode: str = SinkMode.CHANGES.value) -> None:
        super().__init__(name, f"iceberg://{catalog_name}/{table}",
                         {"identifier": table, "catalog_name": catalog_name, "catalog": dict(catalog or {})},
                         partition_by=partition_by, mode=mode)
