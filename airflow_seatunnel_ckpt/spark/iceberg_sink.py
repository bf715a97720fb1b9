"""The Iceberg sink: ``{"type": "iceberg", "table": "<namespace>.<name>", ...}`` in a stage spec.

Spark stages the epoch's Parquet (:class:`TableSink`); the commit task adds the files to
the table in one Iceberg transaction with pyiceberg (:mod:`core.tables.iceberg`), so no
Iceberg jars are needed on the cluster. Readers see an epoch's rows all at once, never
twice (docs/tables/iceberg.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from airflow_seatunnel_ckpt.core.errors import ConfigError
from airflow_seatunnel_ckpt.core.models import SinkMode
from airflow_seatunnel_ckpt.core.tables.catalogs import checked_table_options, embedded_catalog
from airflow_seatunnel_ckpt.spark.table_sinks import TableSink


class IcebergSink(TableSink):
    """Epochs committed into an Apache Iceberg table with pyiceberg (one snapshot per epoch).

    :param table: ``namespace.name`` (created on the first commit, namespace too).
    :param catalog: pyiceberg catalog properties, never secrets (``type``, ``uri``,
        ``warehouse``, ``s3.endpoint``...). Empty, with no ``catalog_conn_id``: the embedded
        SQL catalog on SQLite under ``$AIRFLOW_HOME/seatunnel-ckpt-warehouse``, resolved to
        absolute paths here so that every committer uses the same one.
    :param catalog_name: the catalog's name (pyiceberg's; also ``~/.pyiceberg.yaml``'s).
    :param catalog_conn_id: an Airflow connection whose properties (credentials included)
        are added when the commit runs; only its name is recorded in the checkpoint store.
    :param partition_by: identity partition columns of the table.
    :param mode: ``changes`` (each epoch appends) or ``snapshot`` (each epoch replaces the
        table's rows, in one snapshot).
    :param expectations: data-quality rules on the rows written (docs/EXPECTATIONS.md).
    :param merge_keys: upsert key columns (as the Delta sink's) (``changes`` mode only): each epoch's rows replace the
        table's rows with the same key, in the epoch's one transaction, so a "totals per
        customer" table read directly is always current. One row per key per epoch.
    """

    table_type = "iceberg"

    def __init__(self, name: str, table: str, catalog: Mapping[str, Any] | None = None,
                 catalog_name: str = "default", catalog_conn_id: str | None = None,
                 partition_by: Sequence[str] | None = None, mode: str = SinkMode.CHANGES.value,
                 merge_keys: Sequence[str] | None = None, expectations: Mapping[str, Any] | None = None) -> None:
        props = checked_table_options(
            f"iceberg sink {name!r}", table, catalog,
            "Put them in an Airflow connection and name it in catalog_conn_id (its extras are pyiceberg "
            "properties, login/password the credential)")
        keys = [merge_keys] if isinstance(merge_keys, str) else list(merge_keys or [])
        if any(not isinstance(k, str) or not k for k in keys):
            raise ConfigError(f"iceberg sink {name!r}: merge_keys must be column names, got {merge_keys!r}")
        if keys and mode != SinkMode.CHANGES.value:
            raise ConfigError(f"iceberg sink {name!r}: merge_keys (upsert) needs mode 'changes'; a {mode!r} sink "
                              "replaces the whole table each epoch")
        if not props and not catalog_conn_id:
            props = embedded_catalog()
        options: dict[str, Any] = {"identifier": table, "catalog_name": catalog_name, "catalog": props}
        if catalog_conn_id:
            options["catalog_conn_id"] = catalog_conn_id
        if keys:
            options["merge_keys"] = keys
        super().__init__(name, f"iceberg://{catalog_name}/{table}", options, partition_by=partition_by, mode=mode,
                         expectations=expectations)

    def quarantine_options(self) -> dict[str, Any] | None:
        """A table ``<namespace>.<name>_quarantine`` beside this one, in the same catalog."""
        assert self.table is not None
        options = {"type": "iceberg", "table": f"{self.table['identifier']}_quarantine",
                   "catalog": self.table["catalog"], "catalog_name": self.table["catalog_name"]}
        if self.table.get("catalog_conn_id"):
            options["catalog_conn_id"] = self.table["catalog_conn_id"]
        return options
