"""The ReplayOperator replays epochs from a DAG run's conf, in real Airflow on SQLite and local Spark."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from airflow_seatunnel_ckpt.operators.replay import ReplayOperator
from tests.epoch_test_dags import task_states
from tests.spark.test_replay import Lake, order_ids

pytestmark = [pytest.mark.airflow, pytest.mark.spark]


def test_a_dag_run_with_replay_conf_replays_the_epochs_and_one_without_fails_saying_how(
        spark: Any, run_dag: Any, tmp_path: Path) -> None:
    from airflow.sdk import DAG

    lake = Lake(tmp_path / "lake", "iceberg")
    lake.run(spark, range(1, 3), "buggy")
    spec = lake.spec("unused", "fixed")
    with DAG("replay_orders", schedule=None, start_date=datetime(2026, 1, 1, tzinfo=UTC), catchup=False) as dag:
        ReplayOperator(task_id="replay", pipeline="orders", storage_url=lake.orders.store["storage_url"],
                       participant="ingest", stage=spec.stage, sources=spec.sources, sinks=spec.sinks,
                       key_groups=spec.key_groups)

    run = run_dag(dag, logical_date=datetime(2026, 1, 2, tzinfo=UTC),
                  run_conf={"replay": {"from_epoch": 2, "reason": "amount was x10"}})

    assert task_states(run) == {"replay": "success"}
    assert lake.scan("orders", "SELECT max(amount) FROM t WHERE order_id >= 20") == [(float(max(order_ids(2))),)]
    action = lake.pipeline.txlog.actions(3)[0]
    assert action.record.reason == "amount was x10"
    assert action.record.by == f"airflow: DAG 'replay_orders' run {run.run_id!r}"
    assert action.record.details["stage"] == "tests.spark.test_replay:fixed"

    bare = run_dag(dag, logical_date=datetime(2026, 1, 3, tzinfo=UTC))
    assert task_states(bare) == {"replay": "failed"}
    assert lake.pipeline.epochs() == [1, 2, 3]  # nothing begun
