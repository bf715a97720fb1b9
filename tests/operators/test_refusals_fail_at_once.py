"""A refusal that a retry cannot change fails its task at once: no retries, one traceback.

Real Airflow on SQLite (``dag.test()``); each refusal here comes before Spark would start, so
no SparkSession is needed. The tasks are given retries; the try number shows none was used.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk import DAG

from airflow_seatunnel_ckpt.core import CheckpointStore
from airflow_seatunnel_ckpt.operators.replay import ReplayOperator
from airflow_seatunnel_ckpt.task_group import checkpointed_epoch
from tests.epoch_test_dags import PIPELINE, START, build_epoch_dag, logical_date, task_states, try_numbers

pytestmark = pytest.mark.airflow

RETRIES = {"retries": 2, "retry_delay": timedelta(seconds=0)}


def test_a_replay_refused_for_a_reason_that_cannot_change_fails_at_once(run_dag: Any, tmp_path: Path) -> None:
    store = f"file://{tmp_path}/store"
    pipeline = CheckpointStore.from_url(store).pipeline(PIPELINE)
    pipeline.abort(pipeline.begin("run-1").epoch, "bad input")  # an epoch, none committed: nothing to replay
    with DAG("replay_refused", schedule=None, start_date=START, catchup=False) as dag:
        ReplayOperator(task_id="replay", pipeline=PIPELINE, storage_url=store, participant="ingest",
                       stage="tests.spark.test_replay:fixed", sources={}, sinks={}, **RETRIES)

    run = run_dag(dag, logical_date=datetime(2026, 1, 2, tzinfo=UTC),
                  run_conf={"replay": {"from_epoch": 1, "reason": "amount was x10"}})

    assert task_states(run) == {"replay": "failed"}
    assert try_numbers(run)["replay"] == 1  # retries=2, none used
    assert pipeline.epochs() == [1]  # nothing begun


def test_a_stage_refused_by_the_pipelines_owner_fails_at_once(run_at: Any, tmp_path: Path) -> None:
    store, target = f"file://{tmp_path}/store", f"file://{tmp_path}/table"
    assert run_at(build_epoch_dag("owner", store, target), logical_date(0)).state == "success"
    with DAG("intruder", schedule=None, start_date=START, catchup=False) as dag:
        checkpointed_epoch("orders", pipeline=PIPELINE, storage_url=store, emit_assets=False,
                           stages={"ingest": {"stage": "tests.spark.test_replay:fixed", "sources": {},
                                              "sinks": {"orders_table": {"type": "file", "path": target}},
                                              **RETRIES}})

    run = run_at(dag, logical_date(1))

    assert task_states(run)["orders.ingest"] == "failed"
    assert try_numbers(run)["orders.ingest"] == 1  # retries=2, none used: another DAG owns the pipeline
    assert CheckpointStore.from_url(store).pipeline(PIPELINE).epochs() == [1]
