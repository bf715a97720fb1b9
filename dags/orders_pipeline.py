"""Example pipeline: hourly, incremental, de-duplicating ingestion of order files.

Every hour a source system drops a JSON-lines file of orders into an input directory
(here the ``generate_orders`` task plays that system; its files are deterministic per
logical date, and they re-send some orders of the previous hour). Each DAG run is one
epoch of the checkpointed pipeline ``orders``:

1. ``orders.ingest`` -- a PySpark stage reads only the files no committed epoch has
   consumed, drops orders already seen (keyed state, restored from the last committed
   checkpoint), and stages the fresh ones as parquet partitioned by ``order_date``;
2. ``orders.prepared`` -- waits (deferrable) until the stage is prepared and verifies;
3. ``orders.decide`` -- records commit or abort (abort, plus ``quarantine_alert``, when a
   sanity check on the row count fails: the hour's input is held back, and the run ends
   failed with the reason in its note so that its alerts fire);
4. ``orders.commit`` commits the epoch's files into the Apache Iceberg table
   ``shop.orders`` (one snapshot per epoch, on a SQLite catalog beside the example's data:
   no server) and emits an asset event; ``orders.abort`` cleans up when anything before
   it failed. DuckDB, Spark, Trino or pyiceberg read the table; none of them ever sees a
   half-committed epoch.

The generator and the stage function live beside this file, in ``orders_example.py``:
Airflow puts the DAGs folder on ``sys.path`` when it parses a DAG and runs a task, so
the stage is named by module, ``"orders_example:dedup_orders"``. Copy both files.

Every task is safe to retry or clear. Configuration (environment, read at parse time):

``SEATUNNEL_CKPT_EXAMPLE_DIR``
    root of the example's input and table; default ``$AIRFLOW_HOME/seatunnel-ckpt-example``.

``SEATUNNEL_CKPT_EXAMPLE_RETRY_DELAY_S``
    seconds before a failed task is retried; default 30 (the deployment test uses less).

The checkpoint store is deliberately not set here: the DAG uses the provider's default
store, exactly as the recovery DAG ``seatunnel_ckpt_recovery`` does, so the two can never
watch different stores (the connection ``seatunnel_ckpt_default`` when defined, else
``$SEATUNNEL_CKPT_STORE``, else ``$AIRFLOW_HOME/seatunnel-ckpt``). Its settings
(``store_config``) are recorded in the pipeline's descriptor, where recovery reads them.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from typing import Any

from airflow.sdk import DAG, task
from orders_example import (
    PIPELINE,
    SINK,
    SOURCE,
    TABLE,
    example_dir,
    generate_orders,
    iceberg_catalog,
)

from airflow_seatunnel_ckpt.task_group import checkpointed_epoch

BASE = example_dir()
INPUT_DIR = os.path.join(BASE, "input", "orders")

with DAG(
    dag_id="orders_pipeline",
    description="Hourly exactly-once de-duplicating ingestion of order files (example)",
    schedule="@hourly",
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    # Epochs are decided in order; a second concurrent run would only wait for the first.
    max_active_runs=1,
    default_args={"retries": 1, "retry_delay": timedelta(
        seconds=float(os.environ.get("SEATUNNEL_CKPT_EXAMPLE_RETRY_DELAY_S", "30")))},
    tags=["seatunnel-ckpt", "example"],
    doc_md=__doc__,
) as dag:

    @task
    def generate(logical_date: Any = None) -> dict[str, Any]:
        """Drop this hour's order file into the input directory (idempotent)."""
        return generate_orders(INPUT_DIR, logical_date)

    @task
    def quarantine_alert(ti: Any = None) -> str:
        """Tell a human why the epoch was held back (its input stays unconsumed)."""
        decision = ti.xcom_pull(task_ids="orders.decide", key="decision") or {}
        message = f"orders epoch {decision.get('epoch')} aborted: {decision.get('reason')}"
        print(message)
        return message

    alert = quarantine_alert()
    epoch = checkpointed_epoch(
        "orders",
        pipeline=PIPELINE,
        stages={
            "ingest": {
                "stage": "orders_example:dedup_orders",
                "sources": {SOURCE: {"type": "file", "path": "file://" + INPUT_DIR,
                                     "format": "json"}},
                "sinks": {SINK: {"type": "iceberg", "table": TABLE, "catalog": iceberg_catalog(BASE),
                                 "partition_by": ["order_date"]}},
                "key_groups": 4,
                "spark_conf": {"spark.sql.shuffle.partitions": "4",
                               "spark.ui.showConsoleProgress": "false"},
            },
        },
        sensor={"deferrable": True, "poke_interval": 10, "timeout": 3600},
        # A sanity bound: an hour with more orders than this is held back for a human.
        branch={"max_rows": 1_000_000},
        commit={"retries": 5, "retry_delay": timedelta(seconds=5)},
        fallback=alert,
    )
    generate() >> epoch
