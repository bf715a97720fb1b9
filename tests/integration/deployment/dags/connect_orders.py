"""The example's hourly order pipeline with its stage through Spark Connect, from a worker without Java.

The example's generator and stage (``orders_example``) under a pipeline, store and
Iceberg table of their own below ``$SEATUNNEL_CKPT_EXAMPLE_DIR/connect``; the stage names
the ``spark_connect`` connection ``spark_connect_local``, which the test creates through
the REST API (the test session's Connect server on 127.0.0.1). Every process that parses
this file -- each task process of this DAG -- first drops ``JAVA_HOME`` and every ``java``
from its environment: the stage must run with no JVM in the worker, and
``connect_orders_stage.dedup_without_java`` checks so where it runs.
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path
from typing import Any

os.environ.pop("JAVA_HOME", None)
os.environ["PATH"] = os.pathsep.join(d for d in os.environ.get("PATH", "").split(os.pathsep)
                                     if d and not (Path(d) / "java").exists())

from airflow.sdk import DAG, task
from orders_example import SINK, SOURCE, START, generate_orders, iceberg_catalog

from airflow_seatunnel_ckpt.task_group import checkpointed_epoch

DATA = os.path.join(os.environ.get("SEATUNNEL_CKPT_EXAMPLE_DIR", "/tmp"), "connect")
INPUT_DIR = os.path.join(DATA, "input")
TABLE = "shop.connect_orders"

with DAG("connect_orders", schedule="@hourly", start_date=START, catchup=False, max_active_runs=1,
         default_args={"retries": 1, "retry_delay": timedelta(seconds=2)}):

    @task
    def generate(logical_date: Any = None) -> dict[str, Any]:
        """Drop this hour's order file into the input directory (skipped when it exists)."""
        return generate_orders(INPUT_DIR, logical_date)

    generate() >> checkpointed_epoch(
        "orders", pipeline="connect_orders", storage_url=f"file://{DATA}/checkpoints",
        stages={"ingest": {
            "stage": "connect_orders_stage:dedup_without_java", "conn_id": "spark_connect_local",
            "sources": {SOURCE: {"type": "file", "path": f"file://{INPUT_DIR}", "format": "json"}},
            "sinks": {SINK: {"type": "iceberg", "table": TABLE, "catalog": iceberg_catalog(DATA)}},
            "key_groups": 2,
            "spark_conf": {"spark.sql.shuffle.partitions": "2"},
        }},
        sensor={"poke_interval": 2, "timeout": 600},
        commit={"retries": 2, "retry_delay": timedelta(seconds=2)},
    )
