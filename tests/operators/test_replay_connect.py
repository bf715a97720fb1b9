"""A replay through Spark Connect whose task process is killed while its job runs on the server.

Real Airflow on SQLite (``dag.test``) and a Connect server of the test's own on 127.0.0.1
(tests/connect_server.py, its status API on loopback): the replay task's driver logic runs
in the task's process, its Spark work on the server, in a session derived from the replay
epoch and the task's try.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest

from airflow_seatunnel_ckpt.core import EpochState
from tests.epoch_test_dags import task_states
from tests.operators.test_stage_connect import (
    RunningClient,
    assert_ended_by_the_next_try,
    busy_server,
    killed_try_failed,
    running_jobs,
    session_closed_on_the_server,
)

pytestmark = [pytest.mark.airflow, pytest.mark.spark, pytest.mark.slow]


@pytest.mark.timeout(900)
def test_the_next_try_of_a_killed_connect_replay_ends_its_job_on_the_server_and_commits_the_replay(
        airflow_home: Path, clear_and_rerun: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGKILL of the replay task's process (the Connect client) while the replay's job runs on the server.

    Nothing of the killed client is left to stop that job (it would run for hours, holding the
    server's slots). The next try of the replay task derives the killed try's server session
    from the replay epoch and the try the epoch's lease records: it releases that session,
    which ends the job on the server, aborts the killed replay epoch, and replays anew: the
    sink holds every input row once.
    """
    from airflow_seatunnel_ckpt.hooks.stage_runtime import ConnectAttempt
    from tests.operators.connect_stage_dag import REPLAY_DATE, make_dag
    from tests.spark.test_replay_files import read_sink

    with busy_server(tmp_path, monkeypatch) as (server, ui_url):
        # Epoch 1 commits; the replay of it (epoch 2, try 1) stages, then runs its long job on the server.
        client = RunningClient(tmp_path, server.url, "replay", told="2 1")
        client.kill()
        orders = client.orders
        # Its session and tag: those of the replay epoch (2) and the try (1) that made it.
        killed = ConnectAttempt.of(server.url, orders.store["storage_url"], "orders", 2, "ingest", 1)
        busy = running_jobs(ui_url, killed.tag, "the killed replay's job")
        assert orders.pipeline.state(2) is EpochState.OPEN

        run_id = f"manual__{REPLAY_DATE.isoformat()}"
        killed_try_failed("connect_stage", run_id, "orders.replay")
        again = clear_and_rerun(make_dag(*client.args), run_id, ["orders.replay"])

        assert again.state == "success", task_states(again)
        assert_ended_by_the_next_try(ui_url, killed.tag, busy, "the killed replay's job")
        assert session_closed_on_the_server(killed)
        assert [s.state for s in orders.pipeline.list_epochs()] == [EpochState.COMMITTED, EpochState.ABORTED,
                                                                    EpochState.COMMITTED]
        assert orders.pipeline.status(3).run_id.startswith("replay__1-1__")
        # The next try's own session was released when its replay ended.
        assert session_closed_on_the_server(
            ConnectAttempt.of(server.url, orders.store["storage_url"], "orders", 3, "ingest", 2))
        sink = read_sink(f"file://{tmp_path / 'out' / 'orders'}")
        assert sorted(sink.column("order_id").to_pylist()) == [1, 2, 3, 4, 5, 6]


def test_a_terminated_connect_replay_interrupts_its_operations_by_tag_releases_its_session_and_aborts(
        connect_server: str, airflow_home: Path, tmp_path: Path) -> None:
    """SIGTERM to the replay task's process (marked failed, its heartbeat lost): its ``on_kill`` stops
    the replay's operations on the server as a stage task's does, and the replay epoch is aborted."""
    from airflow_seatunnel_ckpt.hooks.stage_runtime import ConnectAttempt

    client = RunningClient(tmp_path, connect_server, "replay", told="2 1")
    client.kill(signal.SIGTERM)

    output = client.output()
    assert output.count("terminated: interrupting the Spark Connect operations of stage ingest") == 1, output[-6000:]
    orders = client.orders
    assert [s.state for s in orders.pipeline.list_epochs()] == [EpochState.COMMITTED, EpochState.ABORTED]
    replay = ConnectAttempt.of(connect_server, orders.store["storage_url"], "orders", 2, "ingest", 1)
    assert session_closed_on_the_server(replay)
