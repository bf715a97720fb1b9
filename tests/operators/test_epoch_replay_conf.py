"""A pipeline DAG built with checkpointed_epoch replays from its own run conf: real Airflow on SQLite, local Spark."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from airflow_seatunnel_ckpt.core.models import EpochState
from tests.epoch_test_dags import task_states
from tests.spark.test_replay import Lake, order_ids, state_rows

pytestmark = [pytest.mark.airflow, pytest.mark.spark]

DAG_ID = "orders_with_replay_conf"
EPOCH_TASKS = ("orders.ingest", "orders.prepared", "orders.decide", "orders.commit", "orders.abort")


def _dag(lake: Lake, stage: str) -> Any:
    """The pipeline DAG: one checkpointed epoch per run with ``tests.spark.test_replay:<stage>``."""
    from airflow.sdk import DAG

    from airflow_seatunnel_ckpt.task_group import checkpointed_epoch

    spec = lake.spec("unused", stage)
    with DAG(DAG_ID, schedule=None, start_date=datetime(2026, 1, 1, tzinfo=UTC), catchup=False,
             default_args={"retry_delay": timedelta(seconds=0)}) as dag:
        checkpointed_epoch("orders", pipeline="orders", storage_url=lake.orders.store["storage_url"],
                           store_config={"full_checkpoint_interval": 3},
                           stages={"ingest": {"stage": spec.stage, "sources": spec.sources, "sinks": spec.sinks,
                                              "key_groups": spec.key_groups}},
                           sensor={"poke_interval": 0.2}, emit_assets=False)
    return dag


def _day(n: int) -> datetime:
    return datetime(2026, 1, n, tzinfo=UTC)


def test_a_run_triggered_with_replay_conf_replays_instead_of_an_epoch_and_the_next_run_is_a_normal_epoch(
        spark: Any, run_dag: Any, tmp_path: Path) -> None:
    lake = Lake(tmp_path / "lake", "iceberg")
    buggy = _dag(lake, "buggy")
    lake.orders.add_file("f01", order_ids(1))
    assert run_dag(buggy, logical_date=_day(1)).state == "success"
    assert lake.pipeline.committed_epochs() == [1]
    fixed = _dag(lake, "fixed")  # the stage's code fixed, the DAG deployed again

    replay = run_dag(fixed, logical_date=_day(2),
                     run_conf={"replay": {"from_epoch": 1, "reason": "amounts were x10", "force": False}})

    assert replay.state == "success"
    states = task_states(replay)
    assert {t: states[t] for t in EPOCH_TASKS} == dict.fromkeys(EPOCH_TASKS, "skipped")
    assert (states["orders.epoch_or_replay"], states["orders.replay"]) == ("success", "success")
    assert lake.pipeline.committed_epochs() == [1, 2]
    action = lake.pipeline.txlog.actions(2)[0]
    assert (action.record.action, action.record.reason) == ("replay", "amounts were x10")
    assert action.record.by == f"airflow: DAG {DAG_ID!r} run {replay.run_id!r}"
    fresh = Lake(tmp_path / "fresh", "iceberg")
    fresh.run(spark, range(1, 2), "fixed")
    assert lake.orders_summary() == fresh.orders_summary()
    assert lake.totals() == fresh.totals()
    assert state_rows(lake.pipeline) == state_rows(fresh.pipeline)

    lake.orders.add_file("f02", order_ids(2))
    following = run_dag(fixed, logical_date=_day(3))

    assert following.state == "success", task_states(following)
    states = task_states(following)
    assert states["orders.commit"] == "success" and states["orders.replay"] == "skipped"
    assert lake.pipeline.state(3) is EpochState.COMMITTED and lake.pipeline.status(3).run_id == following.run_id
    fresh.run(spark, range(2, 3), "fixed")
    assert lake.orders_summary() == fresh.orders_summary()
    assert lake.totals() == fresh.totals()


@pytest.mark.parametrize(("conf", "named"), [
    ({"reason": "x"}, "misses ['from_epoch']"),
    ({"from_epoch": "1", "reason": "x"}, "key 'from_epoch' must be an epoch number"),
    ({"from_epoch": 1, "to_epoch": 2.5, "reason": "x"}, "key 'to_epoch' must be an epoch number"),
    ({"from_epoch": 1, "reason": "x", "from": 2}, "unknown key(s) ['from']"),
    ({"from_epoch": 1}, "misses ['reason']"),
    ({"from_epoch": 1, "reason": "x", "force": "yes"}, "key 'force' must be true or false"),
    ([1], "must be an object"),
])
def test_a_bad_replay_conf_is_refused_naming_the_key(conf: Any, named: str) -> None:
    from airflow.sdk.exceptions import AirflowFailException

    from airflow_seatunnel_ckpt.operators.replay import replay_conf

    with pytest.raises(AirflowFailException) as refused:
        replay_conf({"replay": conf}, "DAG 'd', task 'orders.epoch_or_replay'")
    assert named in str(refused.value)
    assert "DAG 'd', task 'orders.epoch_or_replay'" in str(refused.value)
    assert replay_conf({}, "t") is None and replay_conf({"other": 1}, "t") is None


def test_a_run_with_a_bad_replay_conf_fails_at_once_and_begins_nothing(run_dag: Any, tmp_path: Path) -> None:
    lake = Lake(tmp_path / "lake", "iceberg")
    lake.orders.add_file("f01", order_ids(1))  # input an epoch would read

    refused = run_dag(_dag(lake, "fixed"), logical_date=_day(1),
                      run_conf={"replay": {"from_epoch": "one", "reason": "x"}})

    assert refused.state == "failed"
    states = task_states(refused)
    assert states["orders.epoch_or_replay"] == "failed"
    assert states["orders.ingest"] == states["orders.replay"] == "upstream_failed"
    assert lake.pipeline.epochs() == []
