"""The Spark Connect slice of the crash campaign: a client or a server killed mid-stage.

A stage run through Spark Connect has two processes to lose: the client (the Airflow
worker's task, with no JVM) and the server (where the jobs run). Either killed mid-stage:
the attempt does not prepare, the next attempt begins cleanly with the same input, and
every row is published once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from airflow_seatunnel_ckpt.core import EpochState
from airflow_seatunnel_ckpt.spark import StageResult, run_stage
from tests.conftest import FAST_JVM_OPTIONS, SESSION_ROOT
from tests.spark.conftest import OrdersPipeline
from tests.spark.stages import STAGED_MARKER_ENV

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.crash]

REPO_ROOT = Path(__file__).resolve().parents[2]


def _wait_for(marker: Path, alive: Callable[[], bool], what: str, log: Callable[[], str],
              timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not marker.exists():
        assert alive(), f"{what} ended before the stage staged its output:\n{log()[-3000:]}"
        assert time.monotonic() < deadline, f"{what} did not stage in time:\n{log()[-3000:]}"
        time.sleep(0.2)


def _first_epoch(orders: OrdersPipeline, url: str) -> None:
    orders.add_file("a", [1, 2, 3])
    orders.commit(run_stage(orders.spec("run-1").replace(remote=url)))
    orders.add_file("b", [3, 4, 4, 5])


def _staged(orders: OrdersPipeline, epoch: int, attempt: int) -> list[Path]:
    folder = orders.root / "store" / "orders" / "_staging" / f"epoch={epoch}" / f"attempt={attempt}" / "orders_table"
    return list(folder.glob("*.parquet"))


def _retry_commits_once(orders: OrdersPipeline, url: str, published_ids: Callable[[], list[int]]) -> StageResult:
    assert orders.pipeline.status(2).state is EpochState.OPEN
    retry = run_stage(orders.spec("run-2", attempt=2).replace(remote=url))
    assert (retry.epoch, retry.attempt, retry.sources["orders"]["files"]) == (2, 2, ["b.parquet"])
    orders.commit(retry)
    assert published_ids() == [1, 2, 3, 4, 5]
    assert sorted(r["order_id"] for r in orders.published()) == [1, 2, 3, 4, 5]
    return retry


def test_a_killed_client_leaves_its_attempt_unprepared_and_the_next_attempt_commits_once(
    connect_server: str, orders: OrdersPipeline, tmp_path: Path, published_ids: Callable[[], list[int]]
) -> None:
    """The client (the driver module a worker runs, Connect only: no JVM of its own) is
    SIGKILLed once it staged its output and state parts."""
    _first_epoch(orders, connect_server)
    spec = orders.spec("run-2", attempt=1, stage="tests.spark.stages:hang_after_staging").replace(
                               remote=connect_server)
    spec_file, marker, log = tmp_path / "spec.json", tmp_path / "staged", tmp_path / "client.log"
    spec_file.write_text(spec.to_json())
    env = {**os.environ, STAGED_MARKER_ENV: str(marker),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    env.pop("SPARK_CONNECT_MODE_ENABLED", None)
    with log.open("wb") as out:
        client = subprocess.Popen([sys.executable, "-m", "airflow_seatunnel_ckpt.spark.driver", "--spec-file",
                                   str(spec_file)], cwd=REPO_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                  start_new_session=True)
    try:
        _wait_for(marker, lambda: client.poll() is None, "the client", log.read_text)
    finally:
        os.killpg(client.pid, signal.SIGKILL)
        client.wait(timeout=60)
    assert marker.read_text() == "2 1"
    assert _staged(orders, 2, 1), "the killed attempt had staged output"
    _retry_commits_once(orders, connect_server, published_ids)


def test_a_killed_server_fails_its_attempt_and_the_next_attempt_commits_once_on_another_server(
    connect_server: str, orders: OrdersPipeline, monkeypatch: pytest.MonkeyPatch,
    published_ids: Callable[[], list[int]]
) -> None:
    """A server of its own is SIGKILLed (its JVM and Python workers) while a job of the
    stage runs on it, after the stage staged its output: the client's run fails, and the
    next attempt, on the session's server, resumes the epoch with the same input."""
    from tests.connect_server import start_server

    _first_epoch(orders, connect_server)
    server = start_server(SESSION_ROOT, python_path=str(REPO_ROOT), jvm_options=FAST_JVM_OPTIONS)
    marker = orders.root / "in-flight"
    monkeypatch.setenv(STAGED_MARKER_ENV, str(marker))
    stage = "tests.spark.stages:stage_then_wait_in_a_spark_job"
    spec = orders.spec("run-2", attempt=1, stage=stage).replace(remote=server.url)
    failure: list[BaseException] = []

    def attempt() -> None:
        try:
            run_stage(spec)
        except BaseException as exc:  # what the task would see
            failure.append(exc)

    thread = threading.Thread(target=attempt, daemon=True)
    try:
        thread.start()
        _wait_for(marker, thread.is_alive, "the stage", server.log_tail)
        os.killpg(server.pid, signal.SIGKILL)
        thread.join(timeout=180)
    finally:
        server.stop()
    assert not thread.is_alive(), "the attempt did not end after its server was killed"
    assert failure, "the attempt whose server was killed did not fail"
    assert orders.pipeline.txlog.read_prepared(2, "ingest") is None
    assert _staged(orders, 2, 1), "the failed attempt had staged output"
    assert "SPARK_CONNECT_MODE_ENABLED" not in os.environ
    _retry_commits_once(orders, connect_server, published_ids)
