"""The Delta sink: ``{"type": "delta", "path": "<table URL>", ...}`` in a stage spec."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from airflow_seatunnel_ckpt.core.errors import ConfigError
from airflow_seatunnel_ckpt.core.models import SinkMode
from airflow_seatunnel_ckpt.spark.locations import fsspec_url
from airflow_seatunnel_ckpt.spark.table_sinks import TableSink

#: Where the commit (delta-rs on the committing task) can reach a table.
TABLE_PROTOCOLS = ("file", "s3")


class DeltaSink(TableSink):
    """Epochs committed into a Delta Lake table with delta-rs (one table version per epoch).

    Options: ``path`` (the table's URL: a local path, ``file://`` or ``s3://``/``s3a://``;
    the table is created by the first epoch that has rows), ``partition_by`` (partition
    columns of a new table; an existing table's must match), ``mode`` (``changes``
    appends each epoch, ``snapshot`` replaces the table's rows in the same version),
    ``expectations`` (data-quality rules on the rows written, docs/EXPECTATIONS.md).
    Credentials are never options: the commit reuses the checkpoint store's when the
    table is on the same protocol, or takes them from a registered secret resolver.
    See docs/tables/delta.md.
    """

    table_type = "delta"

    def __init__(self, name: str, path: str, partition_by: Sequence[str] | None = None,
                 mode: str = SinkMode.CHANGES.value, merge_keys: Sequence[str] | None = None,
                 expectations: Mapping[str, Any] | None = None) -> None:
        url = fsspec_url(path).rstrip("/")
        protocol = url.split("://", 1)[0]
        if protocol not in TABLE_PROTOCOLS:
            raise ConfigError(f"delta sink {name!r}: path {path!r} is on {protocol}://, where delta-rs cannot "
                              f"commit here; use one of {[p + '://' for p in TABLE_PROTOCOLS]} (or s3a://)")
        keys = [merge_keys] if isinstance(merge_keys, str) else list(merge_keys or [])
        if keys and mode == SinkMode.SNAPSHOT.value:
            raise ConfigError(f"delta sink {name!r}: merge_keys {keys} with mode 'snapshot': a snapshot replaces the "
                              "whole table, an upsert replaces rows by key. Choose one")
        super().__init__(name, url, {"uri": url, **({"merge_keys": keys} if keys else {})},
                         partition_by=partition_by, mode=mode, expectations=expectations)

    def quarantine_options(self) -> dict[str, Any] | None:
        """A table ``<path>_quarantine`` beside this one."""
        return {"type": "delta", "path": f"{self.target_url}_quarantine"}
