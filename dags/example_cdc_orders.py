"""Example pipeline: a PostgreSQL ``orders`` table's changes applied exactly once to the lake.

Each DAG run is one epoch of the checkpointed pipeline ``cdc_orders``:

1. ``cdc_orders.ingest`` -- the ``postgres_cdc`` source (logical replication: a publication
   and a slot it creates) pins the WAL position of the epoch and reads the changes between
   the committed position and it (the first epoch: a snapshot consistent with the slot);
   the stage writes every change row to two sinks that apply them (``apply_changes``):
   ``shop.orders`` in Iceberg holds each order's current row (SCD1: deletes remove it),
   the Delta table ``orders_history`` every version of each order (SCD2: ``__start_at`` /
   ``__end_at``, a delete closes the current version);
2. ``cdc_orders.prepared``, ``decide``, ``commit`` -- both tables commit the epoch once
   (one snapshot, one version), and only then does the slot move on. A crash, a retry or a
   replay never applies a change twice: an older change than the table's has no effect, and
   a replay restores the keys it touches before applying their changes again.

docs/CDC.md explains the source and "Applying changes". Configuration (environment, read
at parse time):

``SEATUNNEL_CKPT_CDC_CONNINFO``
    libpq connection string of the database holding ``public.orders`` (its primary key is
    the key of both tables); the server needs ``wal_level=logical``.

``SEATUNNEL_CKPT_EXAMPLE_DIR``
    root of the example's tables; default ``$AIRFLOW_HOME/seatunnel-ckpt-example``.

The stage function is in this file (``example_cdc_orders:apply_orders``): Airflow puts the
DAGs folder on ``sys.path`` of every task.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from typing import Any

from airflow.sdk import DAG

from airflow_seatunnel_ckpt.task_group import checkpointed_epoch

PIPELINE = "cdc_orders"
#: The Iceberg table of each order's current row.
TABLE = "shop.orders"
#: The change columns the tables leave out (the source table's columns and ``_op``/``_lsn``/``_seq`` stay).
LEFT_OUT = ["_table", "_commit_ts", "_xid", "_unchanged_toast"]
BASE = os.environ.get("SEATUNNEL_CKPT_EXAMPLE_DIR") or os.path.join(
    os.environ.get("AIRFLOW_HOME") or os.path.expanduser("~/airflow"), "seatunnel-ckpt-example")
CONNINFO = os.environ.get("SEATUNNEL_CKPT_CDC_CONNINFO", "host=localhost dbname=shop user=airflow")
#: The Iceberg catalog: SQL on SQLite with a local warehouse, beside the example's data.
CATALOG = {"type": "sql", "uri": f"sqlite:///{BASE}/warehouse/catalog.db", "warehouse": f"file://{BASE}/warehouse"}
HISTORY = f"file://{BASE}/delta/orders_history"


def apply_orders(ctx: Any, spark: Any) -> None:
    """The stage: the epoch's change rows of ``public.orders`` into both tables, which apply them."""
    changes = ctx.source("orders").read()
    ctx.sink("current").write(changes)
    ctx.sink("history").write(changes)


with DAG(
    dag_id="example_cdc_orders",
    description="PostgreSQL orders -> postgres_cdc -> Iceberg (SCD1) + Delta (SCD2), exactly once (example)",
    schedule="@hourly",
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=1,
    default_args={"retries": 1, "retry_delay": timedelta(seconds=30)},
    tags=["seatunnel-ckpt", "example"],
    doc_md=__doc__,
) as dag:
    apply = {"keys": ["id"], "sequence_by": ["_lsn", "_seq"], "except_columns": LEFT_OUT}
    checkpointed_epoch(
        "cdc_orders",
        pipeline=PIPELINE,
        stages={
            "ingest": {
                "stage": "example_cdc_orders:apply_orders",
                "sources": {"orders": {"type": "postgres_cdc", "conninfo": CONNINFO, "slot": "cdc_orders",
                                       "publication": "cdc_orders", "tables": ["public.orders"]}},
                "sinks": {"current": {"type": "iceberg", "table": TABLE, "catalog": CATALOG,
                                      "apply_changes": {**apply, "history": "scd1"}},
                          "history": {"type": "delta", "path": HISTORY,
                                      "apply_changes": {**apply, "history": "scd2"}}},
                "key_groups": 2,
                "spark_conf": {"spark.sql.shuffle.partitions": "2", "spark.ui.showConsoleProgress": "false"},
            },
        },
        sensor={"deferrable": True, "poke_interval": 10, "timeout": 3600},
        commit={"retries": 5, "retry_delay": timedelta(seconds=5)},
    )
