"""The stage through ``spark-submit``, detached: it defers, a retry reconnects, the outcome is in the store.

The Spark applications are real (``spark-submit`` with ``local[1]``, and the standalone
cluster on 127.0.0.1); so are the launcher process, the store and the trigger. What
stands in for Airflow in the reconnect tests is the task context a retry would get (its
try number): a retry in the middle of a running submission is what is tested, and only
the scheduler makes one.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import tarfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import pytest

from airflow_seatunnel_ckpt.core import CheckpointStore
from airflow_seatunnel_ckpt.core.protocol.lease import (
    SubmissionOutcome,
    judge_submission,
    read_deferral,
    read_exit,
    read_submission,
    submitted_attempts,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from airflow_seatunnel_ckpt.spark.context import StageContext

pytestmark = [pytest.mark.airflow, pytest.mark.spark, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
#: Short leases, so that a lost submission is recognised within seconds.
LEASE = {"lease_timeout_s": 8, "lease_renew_s": 1}


def small_driver(**more: str) -> dict[str, str]:
    """Settings of the short-lived drivers (and executors) these tests submit: loopback, no UI,
    and the JVM flags that halve a short JVM's start-up."""
    # Imported here: the drivers import this module for its stages, and need no test session.
    from tests.conftest import FAST_JVM_OPTIONS
    from tests.spark.test_stage_processes import SMALL_DRIVER

    return {**SMALL_DRIVER, "spark.executor.extraJavaOptions": FAST_JVM_OPTIONS, **more}


#: Folder of the markers the stages below leave and wait for (set per test).
MARKERS_ENV = "SEATUNNEL_TEST_MARKERS"


def waiting_stage(ctx: StageContext, spark: SparkSession) -> None:
    """Record that an application started, wait for ``release``, then stage the orders."""
    markers = Path(os.environ[MARKERS_ENV])
    with open(markers / "started", "a", encoding="utf-8") as out:
        out.write(f"{os.getpid()}\n")
    deadline = time.monotonic() + 300
    while not (markers / "release").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    if (markers / "fail").exists():
        raise ValueError("the stage failed on purpose: bad input in orders-0.json")
    ctx.sink("orders_out").write(ctx.source("orders").read())


def packed_env_stage(ctx: StageContext, spark: SparkSession) -> None:
    """Stage each order with the value of ``SEATUNNEL_PACKED_ENV`` seen by the executor's Python."""
    import pyarrow as pa
    from pyspark.sql.types import StringType, StructField, StructType

    def tag(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import os as executor_os

        for batch in batches:
            seen = executor_os.environ.get("SEATUNNEL_PACKED_ENV", "")
            yield batch.append_column("python_env", pa.array([seen] * batch.num_rows, pa.string()))

    orders = ctx.source("orders").read()
    schema = StructType([*orders.schema.fields, StructField("python_env", StringType())])
    ctx.sink("orders_out").write(orders.mapInArrow(tag, schema))


@pytest.fixture
def markers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "markers"
    folder.mkdir()
    monkeypatch.setenv(MARKERS_ENV, str(folder))
    # The driver imports this module from the repository root (CI runs pytest without PYTHONPATH).
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_LOCAL", json.dumps({"conn_type": "spark", "host": "local[1]"}))
    return folder


def make_stage(tmp_path: Path, stage: str, **kwargs: Any) -> Any:
    from airflow_seatunnel_ckpt.operators.stage import SparkStageOperator

    inputs = tmp_path / "input"
    inputs.mkdir(exist_ok=True)
    for n in range(2):  # written once: a retry's stage reads the very files its epoch pinned
        if not (inputs / f"orders-{n}.json").exists():
            (inputs / f"orders-{n}.json").write_text(
                "".join(json.dumps({"order_id": f"o{n}-{i}", "amount": i}) + "\n" for i in range(3)))
    options: dict[str, Any] = {
        "conn_id": "spark_local", "deferrable": True, "poll_interval": 0.5,
        "spark_conf": small_driver(),
        **kwargs,
    }
    return SparkStageOperator(
        task_id="ingest", pipeline="orders", storage_url=f"file://{tmp_path}/store",
        store_config=LEASE,
        stage=f"{__name__}:{stage}",
        sources={"orders": {"type": "file", "path": f"file://{inputs}", "format": "json"}},
        sinks={"orders_out": {"type": "file", "path": f"file://{tmp_path}/out", "format": "json"}},
        **options)


def context_of(try_number: int) -> dict[str, Any]:
    """The part of a task context the stage reads, for try ``try_number`` of one DAG run."""
    from orders_example import START

    ti = SimpleNamespace(try_number=try_number, get_dagrun_state=lambda **_: "running",
                         get_first_reschedule_date=lambda _context: None)
    return {"run_id": "manual__detached", "ti": ti, "dag": SimpleNamespace(dag_id="detached"),
            "logical_date": START, "params": {}, "data_interval_start": None, "data_interval_end": None}


def deferred(operator: Any, try_number: int) -> Any:
    """Run try ``try_number`` up to its deferral; the trigger it deferred to."""
    from airflow.sdk.exceptions import TaskDeferred

    with pytest.raises(TaskDeferred) as deferral:
        operator.execute(context_of(try_number))
    assert deferral.value.method_name == "execute_complete"
    return deferral.value.trigger


def fire(trigger: Any, timeout: float = 240) -> dict[str, Any]:
    """Run the trigger as the triggerer would, until its one event."""
    async def first() -> dict[str, Any]:
        async for event in trigger.run():
            return dict(event.payload)
        raise AssertionError("the trigger ended without an event")

    return asyncio.run(asyncio.wait_for(first(), timeout))


def wait_until(predicate: Callable[[], bool], timeout: float = 180, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def started(markers: Path) -> list[str]:
    path = markers / "started"
    return path.read_text().split() if path.exists() else []


def ended(pid: str) -> bool:
    """Whether the process ``pid`` is gone (or a zombie nobody reaped yet)."""
    import psutil

    try:
        return psutil.Process(int(pid)).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


class ZombieTry:
    """Try 1 waiting in-process (``deferrable=False``) in a thread, as a try whose worker Airflow lost.

    Its process still waits, but the scheduler has moved on to try 2: the case a retry
    reconnects for. What it ends with (a result or an error) is kept.
    """

    def __init__(self, tmp_path: Path) -> None:
        self.outcome: dict[str, Any] = {}
        stage = make_stage(tmp_path, "waiting_stage", deferrable=False)

        def run() -> None:
            try:
                self.outcome["result"] = stage.execute(context_of(1))
            except BaseException as exc:  # kept for the test to look at
                self.outcome["error"] = exc

        self.thread = threading.Thread(target=run, name="zombie-try-1", daemon=True)
        self.thread.start()

    def join(self) -> dict[str, Any]:
        self.thread.join(240)
        assert not self.thread.is_alive(), "try 1 did not end"
        return self.outcome


def test_a_retry_reconnects_to_the_running_submission_instead_of_submitting_again(
        airflow_home: Path, tmp_path: Path, markers: Path) -> None:
    pipeline = CheckpointStore.from_url(f"file://{tmp_path}/store").pipeline("orders")
    first = ZombieTry(tmp_path)
    wait_until(lambda: len(started(markers)) == 1, what="the application to start")
    record = read_submission(pipeline, 1, "ingest", 1)
    assert record is not None and record.launcher_pid > 0

    # Try 1's worker is lost to Airflow while spark-submit runs on: the retry finds attempt 1
    # running and watches it rather than launching a second application.
    second = deferred(make_stage(tmp_path, "waiting_stage"), 2)
    assert (second.participant, second.attempt, second.epoch) == ("ingest", 1, 1)
    assert submitted_attempts(pipeline, 1, "ingest") == [1]

    (markers / "release").touch()
    event = fire(second)
    assert event["outcome"] == "prepared", event
    result = make_stage(tmp_path, "waiting_stage").execute_complete(context_of(2), event)
    assert (result["epoch"], result["attempt"], result["rows"]) == (1, 1, 6)
    assert len(started(markers)) == 1  # one application ran
    assert pipeline.txlog.read_prepared(1, "ingest").attempt == 1
    assert first.join()["result"]["attempt"] == 1
    wait_until(lambda: read_exit(pipeline, 1, "ingest", 1) is not None, 60, "the launcher's exit record")
    assert read_exit(pipeline, 1, "ingest", 1).returncode == 0
    assert not Path(record.log).exists()  # the launch log is removed once the outcome is taken


def test_a_try_cleared_while_deferred_has_its_attempt_stopped_and_the_next_try_submits_anew(
        airflow_home: Path, tmp_path: Path, markers: Path) -> None:
    """A clear of a deferred stage runs the stage again, whether or not the triggerer ran the trigger.

    Try 1 defers on attempt 1; the task is cleared before any triggerer ran the trigger (so
    no ``on_kill``). Try 2 finds attempt 1 running and try 1's deferral record: it asks
    attempt 1 to stop and submits attempt 2, which prepares. (Before, try 2 watched attempt
    1, which a clear meant to replace -- with a fixed stage, say.)
    """
    pipeline = CheckpointStore.from_url(f"file://{tmp_path}/store", **LEASE).pipeline("orders")
    first = deferred(make_stage(tmp_path, "waiting_stage"), 1)
    assert first.attempt == 1
    assert read_deferral(pipeline, 1, "ingest", 1).try_number == 1
    wait_until(lambda: len(started(markers)) == 1, what="the application to start")

    second = deferred(make_stage(tmp_path, "waiting_stage"), 2)
    assert (second.attempt, second.epoch) == (2, 1)
    assert submitted_attempts(pipeline, 1, "ingest") == [1, 2]
    wait_until(lambda: read_exit(pipeline, 1, "ingest", 1) is not None, 90, "attempt 1's launcher to stop it")
    stopped = read_exit(pipeline, 1, "ingest", 1)
    assert stopped.stopped.startswith("cancelled by try 2") and "try 1 deferred on it" in stopped.stopped, stopped
    assert stopped.returncode != 0

    (markers / "release").touch()
    event = fire(second)
    assert event["outcome"] == "prepared", event
    result = make_stage(tmp_path, "waiting_stage").execute_complete(context_of(2), event)
    assert (result["epoch"], result["attempt"], result["rows"]) == (1, 2, 6)
    assert pipeline.txlog.read_prepared(1, "ingest").attempt == 2
    # The triggerer's on_kill for try 1, arriving late, changes nothing.
    asyncio.run(first.on_kill())
    assert read_exit(pipeline, 1, "ingest", 1) == stopped


def test_a_reconnected_attempt_that_is_stopped_is_replaced_by_the_trys_own_attempt(
        airflow_home: Path, tmp_path: Path, markers: Path) -> None:
    """Try 2 watches try 1's attempt; when that attempt is stopped, try 2 submits attempt 2 and defers on it."""
    from airflow.sdk.exceptions import TaskDeferred

    from airflow_seatunnel_ckpt.core.protocol.lease import request_cancel

    pipeline = CheckpointStore.from_url(f"file://{tmp_path}/store", **LEASE).pipeline("orders")
    first = ZombieTry(tmp_path)
    wait_until(lambda: len(started(markers)) == 1, what="the application to start")
    second = deferred(make_stage(tmp_path, "waiting_stage"), 2)
    assert second.attempt == 1

    request_cancel(pipeline, 1, "ingest", 1, by="an operator", reason="stopped on purpose")
    event = fire(second)
    assert event["outcome"] == "failed" and "was stopped" in event["message"], event
    with pytest.raises(TaskDeferred) as again:
        make_stage(tmp_path, "waiting_stage").execute_complete(context_of(2), event)
    third = again.value.trigger
    assert (third.attempt, third.epoch) == (2, 1) and again.value.method_name == "execute_complete"
    assert submitted_attempts(pipeline, 1, "ingest") == [1, 2]

    (markers / "release").touch()
    event = fire(third)
    assert event["outcome"] == "prepared", event
    result = make_stage(tmp_path, "waiting_stage").execute_complete(context_of(2), event)
    assert (result["epoch"], result["attempt"], result["rows"]) == (1, 2, 6)
    assert "was stopped" in str(first.join()["error"])  # try 1, still waiting in-process, saw its attempt stop


def test_a_failed_stage_fails_the_task_with_the_drivers_error_from_the_store(
        airflow_home: Path, tmp_path: Path, markers: Path) -> None:
    from airflow_seatunnel_ckpt.hooks.spark_submit import SubmitError

    (markers / "fail").touch()
    (markers / "release").touch()
    stage = make_stage(tmp_path, "waiting_stage")
    event = fire(deferred(stage, 1))
    assert event["outcome"] == "failed" and event["returncode"] != 0, event
    with pytest.raises(SubmitError, match="exit code") as failure:
        stage.execute_complete(context_of(1), event)
    assert "bad input in orders-0.json" in str(failure.value)  # the driver's error, from the exit record


def test_a_lost_submission_is_judged_lost_and_the_retry_submits_its_own_attempt(
        airflow_home: Path, tmp_path: Path, markers: Path) -> None:
    stage = make_stage(tmp_path, "waiting_stage")
    pipeline = CheckpointStore.from_url(f"file://{tmp_path}/store", **LEASE).pipeline("orders")
    deferred(stage, 1)
    wait_until(lambda: len(started(markers)) == 1, what="the application to start")
    record = read_submission(pipeline, 1, "ingest", 1)
    # The machine is lost: launcher, spark-submit and driver die at once, nobody writes an exit record.
    os.killpg(record.launcher_pid, signal.SIGKILL)
    assert judge_submission(pipeline, 1, "ingest", 1).outcome is SubmissionOutcome.RUNNING  # lease still fresh
    wait_until(lambda: judge_submission(pipeline, 1, "ingest", 1).outcome is SubmissionOutcome.LOST, 30,
               "the lease to expire")
    assert read_exit(pipeline, 1, "ingest", 1) is None

    (markers / "release").touch()
    retry = deferred(make_stage(tmp_path, "waiting_stage"), 2)
    assert retry.attempt == 2 and submitted_attempts(pipeline, 1, "ingest") == [1, 2]
    event = fire(retry)
    assert event["outcome"] == "prepared", event
    result = make_stage(tmp_path, "waiting_stage").execute_complete(context_of(2), event)
    assert (result["epoch"], result["attempt"], result["rows"]) == (1, 2, 6)


def test_the_epoch_dag_with_a_deferred_stage_commits_exactly_once(
        airflow_home: Path, run_at: Any, tmp_path: Path, markers: Path) -> None:
    import pyarrow.json as pj
    from airflow.sdk import DAG

    from airflow_seatunnel_ckpt.task_group import checkpointed_epoch
    from tests.epoch_test_dags import START, task_states

    (markers / "release").touch()
    inputs = tmp_path / "input"
    inputs.mkdir()
    (inputs / "orders-0.json").write_text("".join(json.dumps({"order_id": f"o-{i}", "amount": i}) + "\n"
                                                  for i in range(4)))
    store_url = f"file://{tmp_path}/store"
    with DAG("deferred_stage", schedule=None, start_date=START, catchup=False) as dag:
        checkpointed_epoch(
            "orders", pipeline="orders", storage_url=store_url, emit_assets=False,
            stages={"ingest": {
                "stage": f"{__name__}:waiting_stage", "conn_id": "spark_local", "deferrable": True,
                "poll_interval": 0.5,
                "sources": {"orders": {"type": "file", "path": f"file://{inputs}", "format": "json"}},
                "sinks": {"orders_out": {"type": "file", "path": f"file://{tmp_path}/out", "format": "json"}},
                "spark_conf": small_driver(),
            }},
            sensor={"poke_interval": 0.5, "timeout": 300},
        )
    run = run_at(dag, START)
    assert run.state == "success", task_states(run)
    pipeline = CheckpointStore.from_url(store_url).pipeline("orders")
    assert pipeline.status(1).state.value == "COMMITTED"
    assert submitted_attempts(pipeline, 1, "ingest") == [1]
    rows = [r for f in sorted((tmp_path / "out").glob("epoch=1/**/part-*")) for r in pj.read_json(f).to_pylist()]
    assert sorted(r["order_id"] for r in rows) == [f"o-{i}" for i in range(4)]


@pytest.mark.cluster
def test_on_a_cluster_the_driver_gets_the_spec_by_files_and_executors_run_the_shipped_environment(
        airflow_home: Path, spark_standalone: Any, tmp_path: Path, markers: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Standalone has no cluster mode for Python: the separation is simulated.

    The driver runs in an empty working directory with a temporary directory of its own,
    gets the spec only as a file ``spark-submit`` shipped, reports only through the store,
    and the executors run the Python of a packed environment shipped with ``archives``.
    """
    # A "packed environment": bin/python runs this interpreter with a marker variable set.
    env_root = tmp_path / "packed"
    (env_root / "bin").mkdir(parents=True)
    python = env_root / "bin" / "python"
    python.write_text(f'#!/bin/sh\nSEATUNNEL_PACKED_ENV=packed exec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    archive = tmp_path / "stage-env.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(env_root, arcname=".")
    driver_tmp = tmp_path / "driver-tmp"
    driver_tmp.mkdir()
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_CLUSTER", spark_standalone.airflow_conn_uri)
    stage = make_stage(
        tmp_path, "packed_env_stage", conn_id="spark_cluster", deferrable=False,
        python="./environment/bin/python", archives=[f"{archive}#environment"],
        spark_submit_kwargs={"env_vars": {"TMPDIR": str(driver_tmp),
                                          "SPARK_HOME": str(spark_standalone.spark_home)}},
        spark_conf=small_driver(**{"spark.cores.max": "1", "spark.executor.memory": "512m",
                                   "spark.local.dir": str(driver_tmp)}))
    result = stage.execute(context_of(1))
    assert (result["epoch"], result["attempt"], result["rows"]) == (1, 1, 6)
    import pyarrow.json as pj

    staged = tmp_path / "store" / "orders" / "_staging" / "epoch=1" / "attempt=1" / "orders_out"
    rows = [r for f in sorted(staged.glob("**/part-*")) for r in pj.read_json(f).to_pylist()]
    # Every row went through the shipped environment's Python.
    assert len(rows) == 6 and {r["python_env"] for r in rows} == {"packed"}
    pipeline = CheckpointStore.from_url(f"file://{tmp_path}/store").pipeline("orders")
    record = read_submission(pipeline, 1, "ingest", 1)
    assert (record.runtime, record.target) == ("spark-submit", f"{spark_standalone.master_url} (client mode)")
    wait_until(lambda: read_exit(pipeline, 1, "ingest", 1) is not None, 60, "the launcher's exit record")
    assert read_exit(pipeline, 1, "ingest", 1).returncode == 0


@pytest.mark.cluster
def test_standalone_cluster_mode_fails_with_sparks_own_refusal_not_as_finished_without_preparing(
        airflow_home: Path, spark_standalone: Any, tmp_path: Path, markers: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """What a standalone cluster-mode submission comes to with Spark 4.2: refused by ``spark-submit``.

    In that mode ``spark-submit`` would return as soon as the master accepted the driver
    (the launch asks it to wait, and a clean early exit is judged by the driver's lease:
    ``tests/core/protocol/test_submissions.py``); for a Python application Spark refuses the mode
    outright, and the task fails with that message from the exit record.
    """
    from airflow_seatunnel_ckpt.hooks.spark_submit import SubmitError

    monkeypatch.setenv("AIRFLOW_CONN_SPARK_CLUSTER", spark_standalone.airflow_conn_uri)
    # spark-submit on PATH: the provider's hook takes no environment in this mode.
    monkeypatch.setenv("PATH", os.pathsep.join([str(spark_standalone.spark_home / "bin"), os.environ["PATH"]]))
    stage = make_stage(tmp_path, "waiting_stage", conn_id="spark_cluster", deferrable=False,
                       spark_submit_kwargs={"deploy_mode": "cluster"})
    with pytest.raises(SubmitError, match="exit code") as failure:
        stage.execute(context_of(1))
    assert "not supported for python applications on standalone clusters" in str(failure.value)
    pipeline = CheckpointStore.from_url(f"file://{tmp_path}/store").pipeline("orders")
    record = read_submission(pipeline, 1, "ingest", 1)
    assert (record.target, record.exits_before_stage) == (f"{spark_standalone.master_url} (cluster mode)", True)
    assert read_exit(pipeline, 1, "ingest", 1).returncode != 0
    assert started(markers) == []  # no driver ever ran


def test_an_aborted_epoch_or_a_killed_deferred_task_stops_the_running_application(
        airflow_home: Path, tmp_path: Path, markers: Path) -> None:
    """The launcher stops spark-submit when the epoch is aborted, or when Airflow kills the deferred task."""
    stage = make_stage(tmp_path, "waiting_stage")
    pipeline = CheckpointStore.from_url(f"file://{tmp_path}/store", **LEASE).pipeline("orders")
    deferred(stage, 1)
    wait_until(lambda: len(started(markers)) == 1, what="the application to start")
    pipeline.abort(1, "aborted by an operator while the stage ran", by="test")
    wait_until(lambda: read_exit(pipeline, 1, "ingest", 1) is not None, 90, "the launcher to stop")
    record = read_exit(pipeline, 1, "ingest", 1)
    assert "decided (ABORTED)" in record.stopped and record.returncode != 0, record
    assert judge_submission(pipeline, 1, "ingest", 1).outcome is SubmissionOutcome.DECIDED
    # The exit record means the attempt is over: the driver's Python process (spark-submit's
    # child in local mode, which a stopped JVM leaves behind) ended before it was written.
    assert ended(started(markers)[0]), "the stopped application's driver process still runs"

    # Next run, next epoch: the deferred task is marked failed in the UI; the triggerer calls on_kill.
    context = {**context_of(1), "run_id": "manual__second"}
    from airflow.sdk.exceptions import TaskDeferred

    with pytest.raises(TaskDeferred) as deferral:
        make_stage(tmp_path, "waiting_stage").execute(context)
    trigger = deferral.value.trigger
    assert trigger.epoch == 2
    wait_until(lambda: len(started(markers)) == 2, what="the second application to start")
    asyncio.run(trigger.on_kill())
    wait_until(lambda: read_exit(pipeline, 2, "ingest", 1) is not None, 90, "the launcher to stop")
    record = read_exit(pipeline, 2, "ingest", 1)
    assert record.stopped.startswith("cancelled by triggerer") and record.returncode != 0, record
    assert ended(started(markers)[1]), "the cancelled application's driver process still runs"
    assert pipeline.txlog.read_prepared(2, "ingest") is None
    check = judge_submission(pipeline, 2, "ingest", 1)
    assert check.outcome is SubmissionOutcome.FAILED and "was stopped" in check.message
