"""A replay through Spark Connect finds the server session of an earlier, killed replay: it releases it.

The test session's Connect server on 127.0.0.1 (tests/connect_server.py). The killed
replay is what its process left in the store and on the server: a replay epoch begun, its
lease (which try made it) no longer renewed, and its server session open.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from airflow_seatunnel_ckpt.core import EpochState
from tests.spark.conftest import OrdersPipeline

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_a_later_replay_releases_the_server_session_of_a_killed_replay_and_aborts_its_epoch(
        connect_server: str, orders: OrdersPipeline, tmp_path: Path) -> None:
    from pyspark.sql.connect.client import SparkConnectClient

    from airflow_seatunnel_ckpt.core.ops.replay import begin_replay, plan_replay
    from airflow_seatunnel_ckpt.core.protocol.lease import LeaseKeeper, default_holder
    from airflow_seatunnel_ckpt.hooks.stage_runtime import ConnectAttempt
    from airflow_seatunnel_ckpt.spark import run_stage
    from airflow_seatunnel_ckpt.spark.replay import replay_stage
    from tests.operators.test_stage_connect import session_closed_on_the_server
    from tests.spark.test_replay_files import read_sink

    orders.add_file("a", [1, 2, 3, 3, 4])
    orders.commit(run_stage(orders.spec("run-1", remote=connect_server)))
    # A replay killed while it ran: its epoch begun, its lease taken once by try 3 (a short timeout),
    # its server session -- the replay epoch's and try's -- opened and never released.
    pipeline = orders.pipeline
    epoch, run_id = begin_replay(pipeline, plan_replay(pipeline, 1), reason="killed", by="the killed replay")
    assert LeaseKeeper(pipeline.storage, epoch, "ingest", 1, renew_s=0.5, timeout_s=1.5,
                       holder=default_holder(run_id=run_id, by="the killed replay", **{"try": 3})).renew()
    killed = ConnectAttempt.of(connect_server, orders.store["storage_url"], "orders", epoch, "ingest", 3)
    client = SparkConnectClient(killed.url)
    try:
        assert client.interrupt_tag(killed.tag) == []  # the server knows the session now
    finally:
        client.close()  # (closes the channel only: the session stays on the server)
    store = {**orders.store, "lease_timeout_s": 1.5, "lease_renew_s": 0.5}
    time.sleep(2)  # its lease expired: its maker is gone

    result = replay_stage(orders.spec("replay", remote=connect_server, store=store), 1, reason="again",
                          by="a later replay")

    assert session_closed_on_the_server(killed)
    assert [s.state for s in pipeline.list_epochs()] == [EpochState.COMMITTED, EpochState.ABORTED,
                                                         EpochState.COMMITTED]
    assert (result.epoch, result.replayed) == (3, [1])
    assert sorted(read_sink(f"file://{tmp_path / 'out' / 'orders'}").column("order_id").to_pylist()) == [1, 2, 3, 4]


def test_a_replay_run_by_airflow_tasks_test_leaves_the_live_replay_of_a_scheduled_try_alone(
        connect_server: str, orders: OrdersPipeline) -> None:
    """``airflow tasks test`` of the replay task (try 0, attempt 1,000,000) while try 1 of the same task
    replays: try 0 is not a later try of a killed one, so it refuses (a replay runs) and releases nothing."""
    from pyspark.sql.connect.client import SparkConnectClient

    from airflow_seatunnel_ckpt.core.ops.replay import ReplayError, begin_replay, plan_replay
    from airflow_seatunnel_ckpt.core.protocol.lease import LeaseKeeper, default_holder
    from airflow_seatunnel_ckpt.hooks.stage_runtime import ConnectAttempt
    from airflow_seatunnel_ckpt.hooks.stage_submit import attempt_for_try
    from airflow_seatunnel_ckpt.spark import run_stage
    from airflow_seatunnel_ckpt.spark.replay import replay_stage
    from tests.operators.test_stage_connect import session_closed_on_the_server

    orders.add_file("a", [1, 2, 3, 3, 4])
    orders.commit(run_stage(orders.spec("run-1", remote=connect_server)))
    task = {"dag_id": "orders_replay", "task_id": "orders.replay", "run_id": "manual__1"}
    # Try 1 of the task replays now: its epoch begun, its lease live, its server session open.
    pipeline = orders.pipeline
    epoch, run_id = begin_replay(pipeline, plan_replay(pipeline, 1), reason="running", by="try 1")
    keeper = LeaseKeeper(pipeline.storage, epoch, "ingest", 1, renew_s=60, timeout_s=600, holder=default_holder(
        run_id=run_id, by="try 1", **{"try": 1, "task": "orders_replay.orders.replay run manual__1"}))
    assert keeper.renew()
    running = ConnectAttempt.of(connect_server, orders.store["storage_url"], "orders", epoch, "ingest", 1)
    client = SparkConnectClient(running.url)
    try:
        assert client.interrupt_tag(running.tag) == []  # the server knows the session now
    finally:
        client.close()

    tasks_test = orders.spec("replay", attempt=attempt_for_try(0), remote=connect_server, airflow_context=task)
    with pytest.raises(ReplayError, match="replay"):
        replay_stage(tasks_test, 1, reason="tried by hand", by="airflow tasks test")

    assert not session_closed_on_the_server(running)
    assert pipeline.state(epoch) is EpochState.OPEN
