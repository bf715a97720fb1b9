"""The stage task through a Spark connection: ``spark-submit`` to a standalone cluster."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path
from typing import Any

import orders_example
import pytest
from orders_example import START, dedup_orders, generate_orders

from airflow_seatunnel_ckpt.core import CheckpointStore, EpochState
from airflow_seatunnel_ckpt.hooks.spark_submit import stage_module_files
from tests.conftest import FAST_JVM_OPTIONS
from tests.epoch_test_dags import task_states
from tests.spark.test_stage_processes import SMALL_DRIVER

pytestmark = [pytest.mark.airflow, pytest.mark.cluster, pytest.mark.slow]


def test_stage_runs_through_spark_submit_and_the_epoch_commits(
        spark_standalone: Any, run_at: Any, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.sdk import DAG

    from airflow_seatunnel_ckpt.task_group import checkpointed_epoch

    # The stage lives beside the DAG, in a folder on this process's sys.path (as Airflow
    # puts its DAGs folder there) but not on the PYTHONPATH spark-submit's driver inherits:
    # it imports there only because the stage task ships the module with --py-files.
    dags_folder = str(Path(orders_example.__file__).parent)
    assert dags_folder not in os.environ.get("PYTHONPATH", "").split(os.pathsep)
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_CLUSTER", spark_standalone.airflow_conn_uri)
    inputs, table = tmp_path / "input", tmp_path / "table"
    generate_orders(str(inputs), START)
    store_url = f"file://{tmp_path}/store"
    with DAG("submitted_stage", schedule=None, start_date=START, catchup=False) as dag:
        checkpointed_epoch(
            "orders", pipeline="orders", storage_url=store_url, emit_assets=False,
            stages={"ingest": {
                "stage": f"{dedup_orders.__module__}:{dedup_orders.__name__}",
                "sources": {"orders": {"type": "file", "path": f"file://{inputs}",
                                       "format": "json"}},
                "sinks": {"orders_table": {"type": "file", "path": f"file://{table}",
                                           "format": "json"}},
                "key_groups": 2,
                "conn_id": "spark_cluster",
                "spark_conf": {**SMALL_DRIVER, "spark.cores.max": "1",
                               "spark.executor.memory": "512m",
                               "spark.executor.extraJavaOptions": FAST_JVM_OPTIONS},
            }},
            sensor={"poke_interval": 0.5, "timeout": 300},
            commit={"retry_delay": timedelta(seconds=0.1)},
        )
    run = run_at(dag, START)

    assert run.state == "success", task_states(run)
    pipeline = CheckpointStore.from_url(store_url).pipeline("orders")
    assert pipeline.state(1) is EpochState.COMMITTED
    ids = [row["order_id"] for row in published_rows_json(table)]
    assert len(ids) == len(set(ids)) == pipeline.status(1).prepared["ingest"].rows > 0


def test_a_single_file_stage_module_is_shipped_and_a_package_module_is_not() -> None:
    # Beside the DAG, top-level: shipped. In a package (installed, or on PYTHONPATH): not.
    assert stage_module_files("orders_example:dedup_orders") == [orders_example.__file__]
    assert stage_module_files(f"{__name__}:published_rows_json") == []
    assert stage_module_files("airflow_seatunnel_ckpt.spark.runner:run_stage") == []
    # Not importable here: nothing to ship; the driver names the stage it cannot load.
    assert stage_module_files("no_such_stage_module:run") == []


def published_rows_json(table: Path) -> list[dict[str, Any]]:
    """Rows of every JSON part file Spark published below ``table``."""
    import json

    rows = []
    for path in sorted(table.glob("epoch=*/**/part-*")):
        rows += [json.loads(line) for line in path.read_text().splitlines() if line]
    return rows
