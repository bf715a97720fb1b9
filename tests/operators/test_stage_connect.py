"""Stage tasks through Spark Connect: the example pipeline switched to a ``spark_connect``
connection, and a task killed while its Connect operations run.

Real Airflow on SQLite (``dag.test``), the test session's Connect server on 127.0.0.1
(tests/connect_server.py): the stage's driver logic runs in the task's process, its Spark
work on the server.
"""

from __future__ import annotations

import contextlib
import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

from airflow_seatunnel_ckpt.core import EpochState
from tests.epoch_test_dags import task_states
from tests.operators.test_orders_pipeline import Example, at

pytestmark = [pytest.mark.airflow, pytest.mark.spark, pytest.mark.slow]

#: The Airflow connection the tests point the example's stage at.
CONNECT_CONN_ID = "spark_connect_local"


def connect_connection(monkeypatch: pytest.MonkeyPatch, server_url: str) -> None:
    """A ``spark_connect`` connection to the test server, from the environment (as a deployment would define it)."""
    address = urlparse(server_url)
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONNECT_CONN_ID.upper()}", json.dumps(
        {"conn_type": "spark_connect", "host": address.hostname, "port": address.port}))


def test_the_example_pipeline_runs_through_spark_connect_by_switching_its_connection(
        connect_server: str, run_at: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    connect_connection(monkeypatch, connect_server)
    example = Example(tmp_path / "data", monkeypatch)
    example.dag.get_task("orders.ingest").conn_id = CONNECT_CONN_ID  # the only change to the example

    runs = [run_at(example.dag, at(hour)) for hour in range(2)]

    for run in runs:
        assert run.state == "success", task_states(run)
    assert [s.state for s in example.pipeline.list_epochs()] == [EpochState.COMMITTED] * 2
    example.assert_exactly_once()
    # Each epoch's attempt ran on its own server session, released when the stage ended.
    for epoch in (1, 2):
        assert session_closed_on_the_server(attempt_of(example, connect_server, epoch))


def attempt_of(example: Example, server_url: str, epoch: int, attempt: int = 1) -> Any:
    """The Connect attempt the stage task of ``epoch`` ran (its server session and tag)."""
    from airflow_seatunnel_ckpt.hooks.stage_runtime import ConnectAttempt

    store = example.dag.get_task("orders.ingest").hook.config.to_mapping()["storage_url"]
    return ConnectAttempt.of(f"{server_url}/", store, "orders", epoch, "ingest", attempt)


def session_closed_on_the_server(attempt: Any) -> bool:
    """Whether the server knows ``attempt``'s session and has released it (a client of it is refused)."""
    from pyspark.sql.connect.client import SparkConnectClient

    client = SparkConnectClient(attempt.url)
    try:
        client.interrupt_tag(attempt.tag)
    except Exception as exc:
        return "SESSION_CLOSED" in str(exc)
    finally:
        client.close()
    return False


class RunningClient:
    """The DAG of ``tests/operators/connect_stage_dag.py`` run in a process of its own, its stage's
    Connect operation running on the server (the stage has staged its output before it).

    ``extra``: the script's further arguments (``"replay"``: the stage waits in the replay
    run); ``told``: what the stage writes in its marker (``"<epoch> <attempt>"``).
    """

    def __init__(self, tmp_path: Path, server_url: str, *extra: str, told: str = "1 1") -> None:
        import os
        import subprocess
        import sys
        import time

        from tests.spark.conftest import OrdersPipeline
        from tests.spark.stages import STAGED_MARKER_ENV

        self.orders = OrdersPipeline(tmp_path)
        self.orders.add_file("a", [1, 2, 3, 3, 4])
        self.orders.add_file("b", [4, 5, 6, 1])
        self.args = [self.orders.store["storage_url"], f"file://{self.orders.input_dir}",
                     f"file://{tmp_path / 'out' / 'orders'}", server_url]
        marker, self.log = tmp_path / "running", tmp_path / "task.log"
        repo = Path(__file__).resolve().parents[2]
        env = {**os.environ, STAGED_MARKER_ENV: str(marker),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")]))}
        with self.log.open("wb") as out:
            self.process = subprocess.Popen([sys.executable, "-m", "tests.operators.connect_stage_dag", *self.args,
                                             *extra],
                                            cwd=repo, env=env, stdout=out, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        deadline = time.monotonic() + 300
        while not marker.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise AssertionError(f"the stage did not start ({self.process.returncode}):\n{self.output()[-4000:]}")
            time.sleep(0.2)
        time.sleep(1)  # its long operation is on the server now
        assert marker.read_text() == told

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """``sig`` to the task's process group; SIGKILL to whatever is left once it ended or after 90 s."""
        import contextlib
        import os
        import subprocess

        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=90)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)


def test_a_client_killed_mid_stage_leaves_nothing_published_twice_and_the_next_try_commits(
        connect_server: str, airflow_home: Path, clear_and_rerun: Any, tmp_path: Path) -> None:
    """SIGKILL of the task process (the Connect client) while its attempt's operation runs on the server.

    The next try of the same DAG run fences the killed attempt, interrupts its operation on
    the server by the attempt's tag and releases its session, then runs the stage anew and
    commits: every input row once in the sink.
    """
    from airflow_seatunnel_ckpt.hooks.stage_runtime import ConnectAttempt
    from tests.operators.connect_stage_dag import LOGICAL_DATE, make_dag

    client = RunningClient(tmp_path, connect_server)
    client.kill()  # the client dies: nothing of it runs to stop its operations
    orders = client.orders

    # What the scheduler does once the killed task's heartbeat stopped: the try failed; then its
    # next try runs (here: in this process), as a retry or a clear of the task would run it.
    run_id = f"manual__{LOGICAL_DATE.isoformat()}"
    killed_try_failed("connect_stage", run_id, "orders.ingest")
    again = clear_and_rerun(make_dag(*client.args), run_id, ["orders.ingest"])

    assert again.state == "success", task_states(again)
    status = orders.pipeline.status(1)
    assert status.state is EpochState.COMMITTED and status.prepared["ingest"].attempt == 2
    assert sorted(row["order_id"] for row in orders.published()) == [1, 2, 3, 4, 5, 6]
    # The killed attempt can never prepare, and its operation and session are gone from the server.
    fence = orders.pipeline.txlog.read_fence(1, "ingest", 1)
    assert fence is not None and fence.cancelled, fence
    killed = ConnectAttempt.of(connect_server, orders.store["storage_url"], "orders", 1, "ingest", 1)
    assert session_closed_on_the_server(killed)


def test_a_terminated_connect_stage_interrupts_its_operations_by_tag_and_releases_its_session(
        connect_server: str, airflow_home: Path, tmp_path: Path) -> None:
    """SIGTERM to the task process (the task marked failed, its heartbeat lost): ``on_kill`` stops its attempt."""
    from airflow_seatunnel_ckpt.hooks.stage_runtime import ConnectAttempt

    client = RunningClient(tmp_path, connect_server)
    client.kill(signal.SIGTERM)

    output = client.output()
    assert output.count("terminated: interrupting the Spark Connect operations of stage ingest") == 1, output[-6000:]
    errors = [line for line in output.splitlines() if "StageTerminatedError:" in line]
    assert errors and "epoch 1, attempt 1 stays unprepared" in errors[0], output[-6000:]
    assert client.orders.pipeline.prepared_for_run(f"manual__{LOGICAL_DATE_ISO}", "ingest") is None
    attempt = ConnectAttempt.of(connect_server, client.orders.store["storage_url"], "orders", 1, "ingest", 1)
    assert session_closed_on_the_server(attempt)


#: The logical date of ``tests/operators/connect_stage_dag.py``'s run, as its run id has it.
LOGICAL_DATE_ISO = "2026-01-01T00:00:00+00:00"


def killed_try_failed(dag_id: str, run_id: str, task_id: str) -> None:
    """Mark the task instance of a killed process failed, as the scheduler does when its heartbeat stops."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from airflow.utils.state import TaskInstanceState
    from sqlalchemy import select

    with create_session() as session:
        ti = session.scalar(select(TaskInstance).where(TaskInstance.dag_id == dag_id, TaskInstance.run_id == run_id,
                                                       TaskInstance.task_id == task_id))
        assert ti is not None and ti.state == TaskInstanceState.RUNNING, ti
        ti.state = TaskInstanceState.FAILED


@pytest.mark.connect_all(reason="tests/spark/test_connect_crashes.py's killed-server test, in the default run, kills "
                                "the server mid-stage the same way; this one goes through the hook's run_in_process")
def test_a_connect_server_that_dies_mid_epoch_fails_the_attempt_and_the_next_attempt_begins_cleanly(
        connect_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The server (a dedicated one) is killed while the attempt's operation runs; another server
    (the session's, already running: a second cold server would only add its start) takes attempt 2.

    Connect's client retries an unreachable server for at least ten minutes by default
    (``DefaultPolicy``: 15 retries, backoff up to 60 s); the test shortens that to three quick
    retries, so the attempt fails in seconds instead.
    """
    import threading
    import time

    from pyspark.sql.connect.client.retries import DefaultPolicy

    from airflow_seatunnel_ckpt.hooks.stage_submit import StageSubmitHook
    from tests.conftest import FAST_JVM_OPTIONS
    from tests.connect_server import start_server
    from tests.spark.conftest import OrdersPipeline
    from tests.spark.stages import STAGED_MARKER_ENV

    repo = str(Path(__file__).resolve().parents[2])
    orders = OrdersPipeline(tmp_path)
    orders.add_file("a", [1, 2, 3, 3, 4])
    stage = "tests.spark.stages:dedup_then_wait_on_the_server"
    marker = tmp_path / "running"
    monkeypatch.setenv(STAGED_MARKER_ENV, str(marker))
    defaults = DefaultPolicy.__init__.__defaults__
    assert defaults is not None
    monkeypatch.setattr(DefaultPolicy.__init__, "__defaults__", (3, *defaults[1:]))
    hook = StageSubmitHook(orders.pipeline, "ingest")
    epoch = orders.pipeline.begin("run-1").epoch
    server = start_server(tmp_path, python_path=repo, jvm_options=FAST_JVM_OPTIONS)
    try:
        def kill_once_running() -> None:
            deadline = time.monotonic() + 300
            while not marker.exists() and time.monotonic() < deadline:
                time.sleep(0.2)
            time.sleep(1)
            server.stop(signal.SIGKILL)

        killer = threading.Thread(target=kill_once_running, daemon=True)
        killer.start()
        with pytest.raises(Exception) as failed:
            hook.run_in_process(orders.spec("run-1", 1, stage=stage, remote=server.url), epoch)
        killer.join(timeout=60)
    finally:
        server.stop(signal.SIGKILL)
    assert marker.read_text() == "1 1", failed.value  # it died mid-operation, not before
    assert orders.pipeline.state(epoch) is EpochState.OPEN and orders.pipeline.prepared_for_run("run-1", "ingest") \
        is None

    monkeypatch.delenv(STAGED_MARKER_ENV)
    result = hook.run_in_process(orders.spec("run-1", 2, stage=stage, remote=connect_server), epoch)
    assert (result.epoch, result.attempt, result.rows) == (1, 2, 4)
    orders.commit(result)
    assert sorted(row["order_id"] for row in orders.published()) == [1, 2, 3, 4]


# -- CONNECT: the server's side of a killed client ------------------------------------------
def server_jobs(ui_url: str, tag: str) -> list[dict[str, Any]]:
    """The jobs of the Connect server's application (its REST status API) that carry ``tag``."""
    from urllib.request import urlopen

    with urlopen(f"{ui_url}/api/v1/applications", timeout=60) as answer:
        (application,) = json.load(answer)
    with urlopen(f"{ui_url}/api/v1/applications/{application['id']}/jobs", timeout=60) as answer:
        jobs: list[dict[str, Any]] = json.load(answer)
    return [job for job in jobs if any(tag in job_tag for job_tag in job.get("jobTags", []))]


def wait_for_jobs(ui_url: str, tag: str, done: Any, what: str, timeout: float = 90) -> list[dict[str, Any]]:
    """Poll the server's jobs of ``tag`` until ``done(jobs)``; fail naming ``what`` after ``timeout`` seconds."""
    import contextlib
    import time

    deadline, jobs = time.monotonic() + timeout, None
    while True:
        with contextlib.suppress(OSError):  # a busy server's UI may answer late: ask again
            jobs = server_jobs(ui_url, tag)
        if jobs is not None and done(jobs):
            return jobs
        assert time.monotonic() < deadline, f"{what} within {timeout:g}s; the server's jobs of {tag}: {jobs}"
        time.sleep(0.5)


@contextlib.contextmanager
def busy_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, str]]:
    """A Connect server of the test's own and its status API's URL on loopback; the busy stage's job
    runs for hours unless interrupted, so it is bounded by this server's life (stopped however the
    test ends). Its JVM starts as the session's does (``FAST_JVM_OPTIONS``): the busy job sleeps,
    so the JIT's throughput is of no use to it."""
    from tests.conftest import FAST_JVM_OPTIONS
    from tests.connect_server import free_port, start_server
    from tests.spark.stages import BUSY_IDS_ENV

    ui_port = free_port()
    server = start_server(tmp_path, python_path=str(Path(__file__).resolve().parents[2]), jvm_options=FAST_JVM_OPTIONS,
                          conf={"spark.ui.enabled": "true", "spark.ui.port": str(ui_port)})
    monkeypatch.setenv(BUSY_IDS_ENV, str(10**15))
    try:
        yield server, f"http://127.0.0.1:{ui_port}"
    finally:
        server.stop(signal.SIGKILL)


def running_jobs(ui_url: str, tag: str, what: str) -> set[int]:
    """The ids of ``tag``'s jobs once one of them runs on the server (``what``: whose, for the failure)."""
    seen = wait_for_jobs(ui_url, tag, lambda jobs: any(j["status"] == "RUNNING" for j in jobs),
                         f"{what} was not seen running on the server", timeout=180)
    return {j["jobId"] for j in seen if j["status"] == "RUNNING"}


def assert_ended_by_the_next_try(ui_url: str, tag: str, busy: set[int], what: str) -> None:
    """No job of ``tag`` runs any more, and the ``busy`` ones failed: interrupted or ended by the release of
    their session, not run to their end (only the server's end would end them otherwise)."""
    jobs = wait_for_jobs(ui_url, tag, lambda jobs: all(j["status"] != "RUNNING" for j in jobs),
                         f"{what} still ran on the server after the next try", timeout=120)
    assert {j["jobId"]: j["status"] for j in jobs if j["jobId"] in busy} == dict.fromkeys(busy, "FAILED"), jobs


def lose_the_interrupt_of(tag: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the Connect client's interrupt of ``tag`` fail once, as when a busy server's answer is lost."""
    from pyspark.errors.exceptions.connect import SparkConnectGrpcException
    from pyspark.sql.connect.client import SparkConnectClient

    interrupt_tag, lost = SparkConnectClient.interrupt_tag, []

    def failing(client: Any, asked: str) -> Any:
        if asked == tag and not lost:
            lost.append(asked)
            raise SparkConnectGrpcException("the interrupt's answer was lost (injected by the test)")
        return interrupt_tag(client, asked)

    monkeypatch.setattr(SparkConnectClient, "interrupt_tag", failing)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("interrupt", [
    # The next try's interrupt answered: the killed-client test above, in the default run, has it on the
    # session's server; here the server's own account of the job is what it adds to the "lost" case.
    pytest.param("answered", marks=pytest.mark.connect_all(reason="the killed-client test and the lost case")),
    "lost"])
def test_the_next_try_stops_the_job_a_killed_client_left_running_on_the_server(
        interrupt: str, airflow_home: Path, clear_and_rerun: Any, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The server's own account, not the client's: once the next try started, no job of the killed
    attempt runs on the Connect server any more (its job would otherwise run for hours) -- also
    when the next try's interrupt by tag fails ("lost": the one failure injected, as a busy
    server's lost answer cannot be had on demand): releasing the session ends its operations.

    A server of the test's own, with its status API on loopback; the killed attempt's job is
    bounded by that server's life (stopped when the test ends, however it ends).
    """
    from airflow_seatunnel_ckpt.hooks.stage_runtime import ConnectAttempt
    from tests.operators.connect_stage_dag import LOGICAL_DATE, make_dag

    with busy_server(tmp_path, monkeypatch) as (server, ui_url):
        client = RunningClient(tmp_path, server.url)
        client.kill()
        killed = ConnectAttempt.of(server.url, client.orders.store["storage_url"], "orders", 1, "ingest", 1)
        busy = running_jobs(ui_url, killed.tag, "the killed client's job")

        if interrupt == "lost":
            lose_the_interrupt_of(killed.tag, monkeypatch)
        run_id = f"manual__{LOGICAL_DATE.isoformat()}"
        killed_try_failed("connect_stage", run_id, "orders.ingest")
        again = clear_and_rerun(make_dag(*client.args), run_id, ["orders.ingest"])

        assert again.state == "success", task_states(again)
        assert_ended_by_the_next_try(ui_url, killed.tag, busy, "the killed client's job")
        assert sorted(row["order_id"] for row in client.orders.published()) == [1, 2, 3, 4, 5, 6]


def connect_stage_task(orders: Any, server_url: str, **kwargs: Any) -> Any:
    """The orders stage as a deferrable task through Spark Connect at ``server_url``."""
    from airflow_seatunnel_ckpt.operators.stage import SparkStageOperator

    return SparkStageOperator(
        task_id="ingest", pipeline="orders", storage_url=orders.store["storage_url"],
        store_config={"lease_timeout_s": 8, "lease_renew_s": 1}, spark_remote=server_url, deferrable=True,
        poll_interval=0.5, key_groups=2,
        sources={"orders": {"type": "file", "path": f"file://{orders.input_dir}", "format": "parquet"}},
        sinks={"orders_table": {"type": "file", "path": f"file://{orders.root / 'out' / 'orders'}"}}, **kwargs)


def detached_driver_imports_the_tests(monkeypatch: pytest.MonkeyPatch) -> None:
    """The detached driver imports the stage module from the repository root (CI runs pytest without
    PYTHONPATH), as the detached spark-submit tests' drivers do."""
    import os

    repo = str(Path(__file__).resolve().parents[2])
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")])))


@pytest.mark.timeout(600)
def test_a_deferrable_connect_stage_runs_detached_and_the_triggerer_resumes_it_to_one_commit(
        connect_server: str, airflow_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``deferrable=True`` through Connect: the task launches the stage's driver module detached on
    this worker (no JVM: a Connect client) and defers; the trigger -- here one rebuilt from its
    serialized form, as a restarted triggerer has it -- watches the attempt in the store, and the
    resumed task takes its prepared record; the epoch commits once."""
    import os

    from airflow_seatunnel_ckpt.core import Decision
    from airflow_seatunnel_ckpt.core.protocol.lease import read_submission
    from tests.operators.test_stage_detached_submit import context_of, deferred, fire
    from tests.spark.conftest import OrdersPipeline

    detached_driver_imports_the_tests(monkeypatch)
    orders = OrdersPipeline(tmp_path)
    orders.add_file("a", [1, 2, 3, 3, 4])
    stage = connect_stage_task(orders, connect_server, stage="tests.spark.stages:dedup_orders")

    trigger = deferred(stage, 1)
    record = read_submission(orders.pipeline, 1, "ingest", 1)
    assert record is not None and (record.runtime, record.target) == ("connect", connect_server)
    assert record.launcher_pid != os.getpid()  # the stage runs in a process of its own, not the task's
    classpath, kwargs = trigger.serialize()
    event = fire(type(trigger)(**kwargs))
    result = stage.execute_complete(context_of(1), event)

    assert (result["epoch"], result["attempt"], result["rows"]) == (1, 1, 4)
    assert orders.pipeline.decide(1, Decision.COMMIT, "test", "test").decision is Decision.COMMIT
    orders.pipeline.commit(1)
    assert sorted(row["order_id"] for row in orders.published()) == [1, 2, 3, 4]


@pytest.mark.timeout(600)
def test_a_cleared_deferred_connect_stage_has_its_attempt_stopped_and_its_session_released(
        connect_server: str, connect_server_process: Any, airflow_home: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Try 1 deferred while its job runs on the server; the task is cleared. Try 2 fences attempt 1,
    whose launcher stops its driver and releases its Connect session (ending the job there), then
    runs its own attempt: every row once."""
    import time

    from airflow_seatunnel_ckpt.core import Decision
    from airflow_seatunnel_ckpt.core.protocol.lease import read_exit
    from airflow_seatunnel_ckpt.hooks.stage_runtime import ConnectAttempt
    from tests.operators.test_stage_detached_submit import context_of, deferred, fire
    from tests.spark.conftest import OrdersPipeline
    from tests.spark.stages import STAGED_MARKER_ENV

    detached_driver_imports_the_tests(monkeypatch)

    orders = OrdersPipeline(tmp_path)
    orders.add_file("a", [1, 2, 3, 3, 4])
    marker = tmp_path / "running"
    monkeypatch.setenv(STAGED_MARKER_ENV, str(marker))  # the detached driver inherits it: attempt 1 waits
    stage = connect_stage_task(orders, connect_server, stage="tests.spark.stages:dedup_then_wait_on_the_server")
    deferred(stage, 1)
    deadline = time.monotonic() + 240
    while not marker.exists():
        assert time.monotonic() < deadline, "attempt 1 did not reach its job on the server"
        time.sleep(0.2)
    monkeypatch.delenv(STAGED_MARKER_ENV)

    trigger = deferred(connect_stage_task(orders, connect_server,
                                          stage="tests.spark.stages:dedup_then_wait_on_the_server"), 2)
    fence = orders.pipeline.txlog.read_fence(1, "ingest", 1)
    assert fence is not None and fence.cancelled, fence
    while (ended := read_exit(orders.pipeline, 1, "ingest", 1)) is None:
        assert time.monotonic() < deadline + 120, "attempt 1's launcher did not stop it"
        time.sleep(0.2)
    # Stopped by its launcher at the fence, or failed first as its session was released under it.
    assert ended.returncode != 0, ended
    killed = ConnectAttempt.of(connect_server, orders.store["storage_url"], "orders", 1, "ingest", 1)
    assert session_closed_on_the_server(killed)

    try:
        event = fire(trigger)
    except TimeoutError:
        raise AssertionError(f"attempt 2 did not end; its exit: {read_exit(orders.pipeline, 1, 'ingest', 2)}; the "
                             f"server's log:\n{connect_server_process.log_tail(80)}") from None
    result = stage.execute_complete(context_of(2), event)
    assert (result["epoch"], result["attempt"]) == (1, 2)
    assert orders.pipeline.decide(1, Decision.COMMIT, "test", "test").decision is Decision.COMMIT
    orders.pipeline.commit(1)
    assert sorted(row["order_id"] for row in orders.published()) == [1, 2, 3, 4]
