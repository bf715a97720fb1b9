"""A pipeline whose stage goes through ``spark-submit`` (``local[1]``), deferred to the triggerer."""

from __future__ import annotations

import os
from datetime import UTC, datetime

from airflow.sdk import DAG

from airflow_seatunnel_ckpt.task_group import checkpointed_epoch

DATA = os.path.join(os.environ.get("SEATUNNEL_CKPT_EXAMPLE_DIR", "/tmp"), "submitted")

with DAG("submitted_orders", schedule=None, start_date=datetime(2026, 1, 1, tzinfo=UTC), catchup=False,
         max_active_runs=1):
    checkpointed_epoch(
        "orders", pipeline="submitted_orders", storage_url=f"file://{DATA}/checkpoints", emit_assets=False,
        # Short leases: a cancelled attempt is noticed by its launcher within 2 s.
        store_config={"lease_renew_s": 2, "lease_timeout_s": 20},
        stages={"ingest": {
            "stage": "submitted_stage:wait_then_stage", "conn_id": "spark_local", "deferrable": True,
            "poll_interval": 1,
            "sources": {"orders": {"type": "file", "path": f"file://{DATA}/input", "format": "json"}},
            "sinks": {"orders_out": {"type": "file", "path": f"file://{DATA}/out", "format": "json"}},
            "spark_conf": {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
                           "spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"},
        }},
        sensor={"poke_interval": 1, "timeout": 600},
    )
