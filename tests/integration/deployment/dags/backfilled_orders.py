"""The example's hourly order pipeline under a name of its own, which the test backfills.

The same generator and stage as ``orders_pipeline`` (``orders_example``: an order file per
logical hour, de-duplicated by keyed state into an Iceberg table), with its own input,
store and table below ``$SEATUNNEL_CKPT_EXAMPLE_DIR/backfilled``, so that the runs
``airflow backfill create`` adds or clears leave the example's own epochs alone.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

from airflow.sdk import DAG, task
from orders_example import SINK, SOURCE, START, generate_orders, iceberg_catalog

from airflow_seatunnel_ckpt.task_group import checkpointed_epoch

DATA = os.path.join(os.environ.get("SEATUNNEL_CKPT_EXAMPLE_DIR", "/tmp"), "backfilled")
INPUT_DIR = os.path.join(DATA, "input")
#: Not the example's ``shop.orders``: the asset of an Iceberg sink is named by catalog and table.
TABLE = "shop.backfilled_orders"

with DAG("backfilled_orders", schedule="@hourly", start_date=START, catchup=False, max_active_runs=1,
         default_args={"retries": 1, "retry_delay": timedelta(seconds=2)}):

    @task
    def generate(logical_date: Any = None) -> dict[str, Any]:
        """Drop this hour's order file into the input directory (skipped when it exists)."""
        return generate_orders(INPUT_DIR, logical_date)

    generate() >> checkpointed_epoch(
        "orders", pipeline="backfilled_orders", storage_url=f"file://{DATA}/checkpoints",
        stages={"ingest": {
            "stage": "orders_example:dedup_orders",
            "sources": {SOURCE: {"type": "file", "path": f"file://{INPUT_DIR}", "format": "json"}},
            "sinks": {SINK: {"type": "iceberg", "table": TABLE, "catalog": iceberg_catalog(DATA)}},
            "key_groups": 2,
            "spark_conf": {"spark.sql.shuffle.partitions": "2", "spark.ui.enabled": "false",
                           "spark.ui.showConsoleProgress": "false"},
        }},
        sensor={"poke_interval": 2, "timeout": 600},
        commit={"retries": 2, "retry_delay": timedelta(seconds=2)},
    )
