"""The Delta sink: ``{"type": "delta", "path": "<table URL>", ...}`` in a stage spec."""

from __future__ import annotations

from collections.abc import Sequence

from airflow_seatunnel_ckpt.core.models import SinkMode
from airflow_seatunnel_ckpt.spark.locations import fsspec_url
from airflow_seatunnel_ckpt.spark.table_sinks import TableSink


class DeltaSink(TableSink):
    """Epochs committed into a Delta Lake table with delta-rs (one table version per epoch).

    Options: ``path`` (the table's URL), ``partition_by``, ``mode``.
    """

    table_type = "delta"

    def __init__(self, name: str, path: str, partition_by: Sequence[str] | None = None,
                 mode: str = SinkMode.CHANGES.value) -> None:
        url = fsspec_url(path).rstrip("/")
        super().__init__(name, url, {"uri": url}, partition_by=partition_by, mode=mode)
