"""The PostgreSQL sink: ``{"type": "postgres", "table": "<schema>.<name>", ...}`` in a stage spec.

Spark stages the epoch's rows as Parquet in the checkpoint store (:class:`TableSink`, as for
Iceberg and Delta); the commit task loads them with psycopg in one database transaction that
also writes the epoch's marker row (:mod:`core.tables.postgres`), so no JDBC driver is needed
on the cluster and a retried or racing commit lands the epoch once (docs/POSTGRES.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from airflow_seatunnel_ckpt.core.models import SinkMode
from airflow_seatunnel_ckpt.core.tables.postgres_options import parse
from airflow_seatunnel_ckpt.spark.table_sinks import TableSink


class PostgresSink(TableSink):
    """Epochs committed into a PostgreSQL table (one transaction per epoch, with its marker row).

    :param table: ``schema.name`` (``name`` alone: schema ``public``).
    :param postgres_conn_id: the Airflow Postgres connection the commit connects with; only
        its name is recorded in the checkpoint store.
    :param conninfo: a libpq connection string without a password, instead of a connection.
    :param mode: ``append`` (each epoch's rows added) or ``upsert`` (merged on ``merge_keys``).
    :param merge_keys: the columns of the table's primary key or a unique constraint (upsert).
    :param create_table: create a missing table from the first epoch's columns (merge keys as
        its primary key); without it a missing table refuses the epoch.
    :param expectations: data-quality rules on the rows written (docs/EXPECTATIONS.md).
    """

    table_type = "postgres"

    def __init__(self, name: str, table: str, postgres_conn_id: str | None = None, conninfo: str | None = None,
                 mode: str = "append", merge_keys: Sequence[str] | None = None, create_table: bool = False,
                 expectations: Mapping[str, Any] | None = None) -> None:
        options = parse({"table": table, "postgres_conn_id": postgres_conn_id, "conninfo": conninfo, "mode": mode,
                         "merge_keys": merge_keys, "create_table": create_table}, f"postgres sink {name!r}")
        recorded = options.to_options()
        recorded.pop("type")
        super().__init__(name, options.target_url(), recorded, mode=SinkMode.CHANGES.value,
                         expectations=expectations)

    def quarantine_options(self) -> dict[str, Any] | None:
        """None: quarantined rows hold a list column, which the sink's CSV load cannot take (use ``drop``)."""
        return None
