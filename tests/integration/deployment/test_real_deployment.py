"""The example pipeline in a real Airflow 3 deployment, driven only through the REST API.

Runs of ``orders_pipeline`` (consecutive hours of the example's deterministic order
generator) go through a real scheduler, LocalExecutor task processes, dag-processor,
triggerer and api-server (see ``conftest.py``). With ``RELIABILITY_FULL=1``
(``tests.conftest.FULL_CAMPAIGNS``) six runs, hours 0-5:

* three runs are triggered and succeed; the third one's stage task process gets SIGTERM
  mid-stage (what Airflow's supervisor sends when a running task is marked failed or
  loses its heartbeat) -- the stage's ``on_kill`` must stop Spark at once without a py4j
  traceback flood, and the retry finishes the epoch;
* every task of the first, committed run is cleared (``clearTaskInstances``) and runs
  again -- its epoch must not publish twice;
* the fourth run's worker is lost while its Spark session runs (its supervisor and the
  task's process group SIGKILLed); Airflow notices when the heartbeats stop, retries the
  stage and the run succeeds -- the retry must start within 60 s of the kill (the seconds
  to the committed epoch are printed too);
* the fifth run's stage is marked success before it runs: its sensor fails at once saying
  so, and the sixth run (queued behind it) commits both hours' input; its stage must start
  within 60 s of the mark.

CI (the plain ``bash scripts/test.sh``) runs a fixed slice of two runs, hours 0-1 (a Spark
session costs tens of seconds on a loaded two-core machine): hour 0's stage is marked
success before it runs, hour 1 (queued behind it) loses its worker mid-stage and its retry
commits both hours' input, then every task of that committed run is cleared. It keeps
every fault only a deployment can show -- Airflow noticing a lost worker by its
heartbeats, the sensor seeing a marked stage, a clear of a committed run -- with the same
assertions, and leaves out the three runs that only succeed or only follow another fault
and the SIGTERMed stage (four Spark sessions in all), whose ``on_kill`` CI proves in
seconds in ``tests/operators/test_stage_termination.py`` (SIGTERM to a task process mid
Spark job).

Before those, the recovery DAG recovers a pipeline on a store whose connection only the
metadata database holds (named in ``[seatunnel_ckpt] stores``), and ``airflow backfill
create`` (reprocess ``failed``, then ``completed``) runs the hours the example's stage
committed through Spark Connect again without publishing anything twice, and a run whose epoch an
expectation refuses ends failed, with the reason in its note and its failure callback run.

Then the store and the table are read independently: every epoch ended COMMITTED or
ABORTED, the table holds every generated order exactly once, the killed try's JVM did
not outlive it, and no process of the deployment is left running once it is stopped.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import psutil
import psycopg
import pyarrow.dataset as ds
import pytest

from airflow_seatunnel_ckpt.core import CheckpointStore
from airflow_seatunnel_ckpt.core.models import EpochState
from tests.conftest import FULL_CAMPAIGNS
from tests.integration.deployment.conftest import SIDE_STORE_CONN_ID, AirflowDeployment, DeploymentError, tail

# With RELIABILITY_FULL=1 the whole deployment (start, six runs, a retry each for SIGTERM
# and SIGKILL, stop) takes 9-12 minutes on a loaded two-core machine, more than the suite's
# default 600 s allows (CI's slice: about 4).
pytestmark = [pytest.mark.deployment, pytest.mark.slow, pytest.mark.airflow, pytest.mark.spark,
              pytest.mark.timeout(1500)]

DAG_ID = "orders_pipeline"
STAGE_TASK = "orders.ingest"
PARTICIPANT = "ingest"
#: Generous for a loaded two-core machine; a healthy run of the example takes ~30-60 s.
RUN_TIMEOUT_S = 420
#: How long a SIGTERMed stage may take to stop; Airflow's supervisor would SIGKILL it later.
TERM_GRACE_S = 60


def _example() -> Any:
    """The example's module (``dags/orders_example.py``), for its deterministic generator."""
    import importlib.util

    path = Path(__file__).resolve().parents[3] / "dags" / "orders_example.py"
    spec = importlib.util.spec_from_file_location("orders_example_for_deployment_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


EXAMPLE = _example()


def _trigger(deployment: AirflowDeployment, hour: int) -> str:
    """Trigger the run of ``hour`` (logical date and run-after both at that hour)."""
    when = (EXAMPLE.START + timedelta(hours=hour)).isoformat()
    run_id = f"deploy_h{hour}"
    deployment.api("POST", f"/dags/{DAG_ID}/dagRuns",
                   {"dag_run_id": run_id, "logical_date": when, "run_after": when})
    return run_id


def _started(ti: dict[str, Any]) -> float:
    """``time.time()`` at which a task instance (its latest try) started, from the REST API."""
    from datetime import datetime

    return datetime.fromisoformat(str(ti["start_date"]).replace("Z", "+00:00")).timestamp()


def _mark_success(deployment: AirflowDeployment, run_id: str, task_id: str) -> bool:
    """The UI's "Mark success" on a task instance (False while the run's task instances do not exist yet)."""
    try:
        deployment.api("PATCH", f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/{task_id}", {"new_state": "success"})
    except DeploymentError as exc:
        if "HTTP 404" in str(exc):
            return False
        raise
    return True


def _run_state(deployment: AirflowDeployment, run_id: str, dag_id: str = DAG_ID) -> str:
    return str(deployment.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}")["state"])


def _task(deployment: AirflowDeployment, run_id: str, task_id: str) -> dict[str, Any]:
    result: dict[str, Any] = deployment.api("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/{task_id}")
    return result


def _task_log(deployment: AirflowDeployment, run_id: str, task_id: str, try_number: int,
              dag_id: str = DAG_ID) -> Path:
    return (deployment.home / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}" / f"task_id={task_id}"
            / f"attempt={try_number}.log")


def _wait_success(deployment: AirflowDeployment, run_id: str, *, and_then: Any = None, dag_id: str = DAG_ID) -> None:
    """Wait until ``run_id`` succeeded (and ``and_then()`` holds); fail at once if it failed."""

    def done() -> bool:
        state = _run_state(deployment, run_id, dag_id)
        if state == "failed":
            tis = deployment.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances")["task_instances"]
            failed = [ti for ti in tis if ti["state"] in ("failed", "upstream_failed")]
            logs = "\n".join(f"---- {ti['task_id']} try {ti['try_number']}:\n"
                             f"{tail(_task_log(deployment, run_id, ti['task_id'], ti['try_number'], dag_id))}"
                             for ti in failed)
            raise DeploymentError(f"run {run_id} failed: {[(t['task_id'], t['state']) for t in tis]}\n{logs}")
        return state == "success" and (and_then is None or and_then())

    deployment.wait_for(f"run {run_id} to succeed", done, timeout=RUN_TIMEOUT_S)


def _stage_is_mid_work(deployment: AirflowDeployment, run_id: str) -> bool:
    """True while the run's stage is between pinning its input and preparing.

    The runner pins the input plan after its SparkSession is up and before it stages any
    output, so a kill now lands in the middle of the stage's Spark work.
    """
    pipeline = CheckpointStore.from_url(deployment.store_url).pipeline(EXAMPLE.PIPELINE)
    epoch = pipeline.epoch_for_run(run_id, DAG_ID)
    if epoch is None or pipeline.txlog.read_plan(epoch, PARTICIPANT) is None:
        return False
    return pipeline.prepared_for_run(run_id, PARTICIPANT) is None


def _signal_stage_while_spark_runs(deployment: AirflowDeployment, run_id: str, signum: signal.Signals,
                                   *, lose_worker: bool = False) -> tuple[int, int, list[int]]:
    """Send ``signum`` to the stage's task process mid-stage; return (pid, try number, pids of its JVMs).

    ``lose_worker``: a lost worker instead -- SIGKILL its supervisor (the LocalExecutor worker
    process, the task process's parent) and then the task's whole process group (the task and
    its JVM); nobody is left to tell Airflow, which notices only when the heartbeats stop.
    """

    def running_stage() -> tuple[int, int] | None:
        ti = _task(deployment, run_id, STAGE_TASK)
        if ti["state"] == "success":
            raise DeploymentError(f"{STAGE_TASK} of {run_id} finished before it was seen mid-stage")
        pid = ti.get("pid")
        if ti["state"] == "running" and pid and _stage_is_mid_work(deployment, run_id):
            return int(pid), int(ti["try_number"])
        return None

    pid, try_number = deployment.wait_for(f"{STAGE_TASK} of {run_id} to be mid-stage", running_stage,
                                          timeout=RUN_TIMEOUT_S, interval=0.25)
    jvms = [child.pid for child in psutil.Process(pid).children(recursive=True) if "java" in child.name()]
    if lose_worker:
        supervisor = psutil.Process(pid).parent()
        assert supervisor is not None and supervisor.pid not in {p.pid for p in deployment.processes.values()}, \
            f"the parent of task process {pid} is not a worker: {supervisor}"
        os.kill(supervisor.pid, signal.SIGKILL)
        os.killpg(os.getpgid(pid), signal.SIGKILL)
    else:
        os.kill(pid, signum)
    return pid, try_number, jvms


def _seconds_to_commit(deployment: AirflowDeployment, run_id: str, since: float) -> float:
    """Seconds from ``since`` (``time.time()`` of a fault) until the epoch of ``run_id`` is COMMITTED."""
    pipeline = CheckpointStore.from_url(deployment.store_url).pipeline(EXAMPLE.PIPELINE)

    def committed() -> float | None:
        epoch = pipeline.epoch_for_run(run_id, DAG_ID)
        if epoch is not None and pipeline.state(epoch) is EpochState.COMMITTED:
            return time.time() - since
        if _run_state(deployment, run_id) == "failed":
            raise DeploymentError(f"run {run_id} failed: "
                                  f"{deployment.api('GET', f'/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances')}")
        return None

    took: float = deployment.wait_for(f"the epoch of {run_id} to commit", committed, timeout=RUN_TIMEOUT_S,
                                      interval=0.5)
    return took


def _try_ended(deployment: AirflowDeployment, run_id: str, try_number: int) -> str | None:
    """How try ``try_number`` of the stage ended (``"retried"`` once a later try exists), None while it runs."""
    ti = _task(deployment, run_id, STAGE_TASK)
    if ti["try_number"] > try_number:
        return "retried"
    if ti["state"] in (None, "running"):
        return None
    return str(ti["state"])


def _published_order_ids(data: Path) -> list[str]:
    """Every ``order_id`` the example published, read independently of the commit code.

    The example publishes into an Iceberg table (read here with pyiceberg's scan into
    Arrow) when its module names one (``TABLE``, ``iceberg_catalog``); otherwise into a
    parquet directory per epoch (read with pyarrow, hive partitions).
    """
    if hasattr(EXAMPLE, "iceberg_catalog") and hasattr(EXAMPLE, "TABLE"):
        from pyiceberg.catalog import load_catalog

        table = load_catalog("default", **EXAMPLE.iceberg_catalog(str(data))).load_table(EXAMPLE.TABLE)
        column = table.scan(selected_fields=("order_id",)).to_arrow().column("order_id")
    else:
        dataset = ds.dataset(str(data / "warehouse" / "orders"), format="parquet", partitioning="hive")
        column = dataset.to_table(columns=["order_id"]).column("order_id")
    return [str(v) for v in column.to_pylist()]


def _py4j_traceback_lines(log: Path) -> list[str]:
    """Lines of a task log that belong to py4j errors or tracebacks."""
    text = log.read_text(errors="replace")
    return [line for line in text.splitlines()
            if "py4j" in line.lower() and ("Traceback" in line or "Error" in line or "File " in line)]


def _phase(capsys: pytest.CaptureFixture[str], since: float, what: str) -> None:
    """Print the seconds since ``since`` (``time.monotonic()``) at which a phase of a test ended."""
    with capsys.disabled():  # shown in the test run's output, passed or not
        print(f"\n[{time.monotonic() - since:6.1f}s] {what}")


SUBMITTED_DAG = "submitted_orders"


def _submitted_task(deployment: AirflowDeployment, run_id: str) -> dict[str, Any]:
    result: dict[str, Any] = deployment.api(
        "GET", f"/dags/{SUBMITTED_DAG}/dagRuns/{run_id}/taskInstances/{STAGE_TASK}")
    return result


def test_a_submitted_stage_defers_and_a_clear_while_deferred_stops_it_and_resubmits(
    airflow_deployment: AirflowDeployment, capsys: pytest.CaptureFixture[str],
) -> None:
    """``tests/integration/deployment/dags/submitted_orders.py``: the stage goes through spark-submit and defers.

    The stage is seen *deferred* (its task process gone, the trigger watching the store in
    the triggerer), then cleared from the REST API while deferred: attempt 1 is stopped, the
    new try submits attempt 2, and the epoch commits each order once. Who asks attempt 1's
    launcher to stop is a race: the triggerer's ``on_kill``, if it had started the trigger
    and gets there first, else try 2, which finds try 1's deferral record (a clear within a
    second of the deferral ends the trigger before the triggerer ever runs it).
    """
    import json as json_lib

    from airflow_seatunnel_ckpt.core.protocol.lease import read_exit, submitted_attempts

    deployment = airflow_deployment
    began = time.monotonic()
    root = deployment.data / "submitted"
    (root / "input").mkdir(parents=True)
    (root / "input" / "orders-0.json").write_text(
        "".join(json_lib.dumps({"order_id": f"s-{i}", "amount": i}) + "\n" for i in range(5)))
    deployment.wait_for("the dag-processor to parse submitted_orders", lambda: deployment.api(
        "GET", f"/dags?dag_id_pattern={SUBMITTED_DAG}").get("total_entries"), timeout=240)
    deployment.api("PATCH", f"/dags/{SUBMITTED_DAG}", {"is_paused": False})
    run_id = "submitted_1"
    deployment.api("POST", f"/dags/{SUBMITTED_DAG}/dagRuns", {"dag_run_id": run_id, "logical_date": None})

    deployment.wait_for("the submitted stage to defer", lambda: _submitted_task(deployment, run_id)["state"]
                        == "deferred", timeout=RUN_TIMEOUT_S, interval=0.5)
    _phase(capsys, began, "the submitted stage deferred")
    pipeline = CheckpointStore.from_url(f"file://{root}/checkpoints").pipeline("submitted_orders")
    assert submitted_attempts(pipeline, 1, PARTICIPANT) == [1]

    deployment.api("POST", f"/dags/{SUBMITTED_DAG}/clearTaskInstances", {
        "dry_run": False, "dag_run_id": run_id, "task_ids": [STAGE_TASK], "only_failed": False,
        "reset_dag_runs": True})
    stopped = deployment.wait_for("attempt 1's launcher to stop it", lambda: read_exit(pipeline, 1, PARTICIPANT, 1),
                                  timeout=120, interval=0.5)
    _phase(capsys, began, f"attempt 1 stopped: {stopped.stopped}")
    assert stopped.stopped.startswith(("cancelled by triggerer", "cancelled by try 2")), stopped
    (root / "release").touch()

    def succeeded() -> bool:
        state = deployment.api("GET", f"/dags/{SUBMITTED_DAG}/dagRuns/{run_id}")["state"]
        if state == "failed":
            raise DeploymentError(f"run {run_id} of {SUBMITTED_DAG} failed: "
                                  f"{deployment.api('GET', f'/dags/{SUBMITTED_DAG}/dagRuns/{run_id}/taskInstances')}")
        return state == "success"

    deployment.wait_for(f"{SUBMITTED_DAG} run {run_id} to succeed", succeeded, timeout=RUN_TIMEOUT_S)
    _phase(capsys, began, f"{SUBMITTED_DAG} run {run_id} succeeded")
    assert _submitted_task(deployment, run_id)["try_number"] == 2
    assert submitted_attempts(pipeline, 1, PARTICIPANT) == [1, 2]
    assert pipeline.state(1) is EpochState.COMMITTED and pipeline.txlog.read_prepared(1, PARTICIPANT).attempt == 2
    published = [json_lib.loads(line)["order_id"] for f in sorted((root / "out").glob("epoch=1/**/part-*"))
                 for line in f.read_text().splitlines() if line]
    assert sorted(published) == [f"s-{i}" for i in range(5)]
    deployment.wait_for("attempt 2's launcher to exit", lambda: read_exit(pipeline, 1, PARTICIPANT, 2),
                        timeout=60, interval=0.5)


RECOVERY_DAG = "seatunnel_ckpt_recovery"


def _stale_epoch(store_url: str, pipeline: str) -> int:
    """An epoch of ``pipeline`` that began an hour ago (by the store's clock) and never took a
    lease: what a worker lost before its stage's first lease renewal leaves behind."""
    p = CheckpointStore.from_url(store_url).pipeline(pipeline)
    epoch = p.txlog.begin("scheduled__lost_worker", now=time.time() - 3600).epoch
    begin = Path(store_url.removeprefix("file://")) / pipeline / "_txlog" / f"epoch-{epoch:012d}" / "begin"
    hour_ago = time.time() - 3600
    os.utime(begin, (hour_ago, hour_ago))
    return epoch


def test_the_recovery_dag_recovers_a_pipeline_on_a_connections_store(
    airflow_deployment: AirflowDeployment, capsys: pytest.CaptureFixture[str],
) -> None:
    """A store from a connection created through the REST API (so only the metadata database
    holds it), named in ``[seatunnel_ckpt] stores``: the recovery DAG's tasks, which cannot
    list the database's connections, find it by id and abort its dead epoch."""
    deployment = airflow_deployment
    side_url = f"file://{deployment.data / 'side-store'}"
    deployment.api("POST", "/connections", {"connection_id": SIDE_STORE_CONN_ID, "conn_type": "seatunnel_ckpt",
                                            "host": side_url})
    epoch = _stale_epoch(side_url, "payments")
    deployment.wait_for(f"the dag-processor to parse {RECOVERY_DAG}", lambda: deployment.api(
        "GET", f"/dags?dag_id_pattern={RECOVERY_DAG}").get("total_entries"), timeout=240)
    deployment.api("PATCH", f"/dags/{RECOVERY_DAG}", {"is_paused": False})
    started = time.monotonic()
    deployment.api("POST", f"/dags/{RECOVERY_DAG}/dagRuns", {"dag_run_id": "recovery_1", "logical_date": None})
    pipeline = CheckpointStore.from_url(side_url).pipeline("payments")
    deployment.wait_for("the recovery DAG to abort the connection store's dead epoch",
                        lambda: pipeline.state(epoch) is EpochState.ABORTED, timeout=RUN_TIMEOUT_S, interval=0.5)
    took = time.monotonic() - started
    with capsys.disabled():  # the seconds show in the test run's output, passed or not
        print(f"\nrecovery run triggered -> dead epoch of a connection's store aborted: {took:.1f}s")
    status = pipeline.status(epoch)
    assert status.decision is not None and status.decision.by == "recovery", status.decision
    deployment.wait_for("the recovery run to finish", lambda: deployment.api(
        "GET", f"/dags/{RECOVERY_DAG}/dagRuns/recovery_1")["state"] in ("success", "failed"), timeout=120)
    assert deployment.api("GET", f"/dags/{RECOVERY_DAG}/dagRuns/recovery_1")["state"] == "success"
    # Nothing else triggers it: the example's runs below must not race a recovery run.
    deployment.api("PATCH", f"/dags/{RECOVERY_DAG}", {"is_paused": True})


CONNECT_DAG = "connect_orders"
CONNECT_CONN_ID = "spark_connect_local"


@pytest.fixture(scope="module")
def connect_orders_runs(airflow_deployment: AirflowDeployment, connect_server: str) -> list[str]:
    """Hours 0 and 1 of ``connect_orders`` committed through Spark Connect; their run ids.

    Made once for the module: the Connect test checks how they ran, and the backfill test
    runs these committed hours again (a backfilled run reuses its committed epoch's prepared
    output without starting Spark, so the runtime its stage ran on does not matter there),
    two runs of a Spark stage fewer than a DAG of its own to backfill.
    """
    from urllib.parse import urlparse

    deployment = airflow_deployment
    began = time.monotonic()
    address = urlparse(connect_server)
    deployment.api("POST", "/connections", {"connection_id": CONNECT_CONN_ID, "conn_type": "spark_connect",
                                            "host": address.hostname, "port": address.port})
    deployment.wait_for(f"the dag-processor to parse {CONNECT_DAG}", lambda: deployment.api(
        "GET", f"/dags?dag_id_pattern={CONNECT_DAG}").get("total_entries"), timeout=240)
    deployment.api("PATCH", f"/dags/{CONNECT_DAG}", {"is_paused": False})
    runs = []
    for hour in (0, 1):  # queued at once; max_active_runs=1 runs them in order
        when = (EXAMPLE.START + timedelta(hours=hour)).isoformat()
        runs.append(deployment.api("POST", f"/dags/{CONNECT_DAG}/dagRuns", {
            "dag_run_id": f"connect_h{hour}", "logical_date": when, "run_after": when})["dag_run_id"])
    for run_id in runs:
        _wait_success(deployment, run_id, dag_id=CONNECT_DAG)
    print(f"\n[{time.monotonic() - began:6.1f}s] {CONNECT_DAG}: hours 0 and 1 committed through Spark Connect")
    deployment.api("PATCH", f"/dags/{CONNECT_DAG}", {"is_paused": True})
    return runs


def test_a_stage_through_spark_connect_runs_from_a_worker_without_java(
    airflow_deployment: AirflowDeployment, connect_server: str, connect_orders_runs: list[str],
) -> None:
    """``tests/integration/deployment/dags/connect_orders.py``: the example's stage through Spark Connect.

    The stage names a ``spark_connect`` connection (created through the REST API, to the
    test session's Connect server); its task processes have no ``JAVA_HOME`` and no
    ``java`` on PATH (the stage refuses to run otherwise). Two hours commit, every order
    once in the Iceberg table, hour 1's re-sent orders dropped by the keyed state.
    """
    from urllib.parse import urlparse

    from pyiceberg.catalog import load_catalog

    deployment = airflow_deployment
    address = urlparse(connect_server)
    data = deployment.data / "connect"
    pipeline = CheckpointStore.from_url(f"file://{data / 'checkpoints'}").pipeline(CONNECT_DAG)
    assert [pipeline.state(e) for e in pipeline.epochs()] == [EpochState.COMMITTED] * 2
    log = _task_log(deployment, connect_orders_runs[0], STAGE_TASK, 1, CONNECT_DAG).read_text(errors="replace")
    assert f"through Spark Connect at sc://{address.hostname}:{address.port} (connection {CONNECT_CONN_ID})" in log
    table = load_catalog("default", **EXAMPLE.iceberg_catalog(str(data))).load_table("shop.connect_orders")
    published = [str(v) for v in table.scan(selected_fields=("order_id",)).to_arrow().column("order_id").to_pylist()]
    expected = {order["order_id"] for hour in (0, 1) for order in EXAMPLE.orders_of_hour(hour)}
    assert sorted(published) == sorted(expected), (len(published), len(expected))


#: The backfill runs the Connect test's committed hours again (``connect_orders_runs``).
BACKFILL_DAG = CONNECT_DAG


def _xcom(deployment: AirflowDeployment, dag_id: str, run_id: str, task_id: str) -> Any:
    """The return value (XCom) of a task's latest try, as the REST API gives it."""
    value = deployment.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/xcomEntries/"
                                  "return_value")["value"]
    return json.loads(value) if isinstance(value, str) else value


def _backfill(deployment: AirflowDeployment, reprocess: str, first_hour: int, last_hour: int) -> dict[int, str]:
    """``airflow backfill create`` of ``BACKFILL_DAG`` over hours ``first_hour``..``last_hour``.

    Runs the CLI an operator would (on the deployment's metadata database) and returns
    what the backfill does for each hour: the run id it queued, or ``"none: <Airflow's
    reason>"`` (its ``backfill_dag_run`` rows, written before the CLI exits). Airflow allows one
    backfill per DAG at a time: one still open is cancelled first, as an operator would once its
    runs ended (the caller waited for them), instead of waiting up to 30 s for the scheduler's
    pass that marks it complete (it fails only runs still queued: there are none).
    """
    def hour(h: int) -> str:
        return (EXAMPLE.START + timedelta(hours=h)).isoformat()

    command = [sys.executable, "-m", "airflow", "backfill", "create", "--dag-id", BACKFILL_DAG,
               "--from-date", hour(first_hour), "--to-date", hour(last_hour), "--reprocess-behavior", reprocess]
    for previous in deployment.api("GET", f"/backfills?dag_id={BACKFILL_DAG}")["backfills"]:
        if not previous["completed_at"]:
            try:
                deployment.api("PUT", f"/backfills/{previous['id']}/cancel")
            except DeploymentError as exc:  # the scheduler marked it complete meanwhile
                if "HTTP 409" not in str(exc):
                    raise
    created = subprocess.run(command, env=deployment.env, cwd=deployment.home, capture_output=True, text=True,
                             timeout=180)
    if created.returncode != 0:
        raise DeploymentError(f"{' '.join(command[2:])} exited with {created.returncode}:\n"
                              f"{created.stdout[-2000:]}\n{created.stderr[-2000:]}")
    backfill = max(deployment.api("GET", f"/backfills?dag_id={BACKFILL_DAG}")["backfills"], key=lambda b: b["id"])
    with psycopg.connect(deployment.metadata_db) as conn:
        rows = conn.execute("SELECT b.logical_date, r.run_id, b.exception_reason FROM backfill_dag_run b "
                            "LEFT JOIN dag_run r ON r.id = b.dag_run_id WHERE b.backfill_id = %s",
                            (backfill["id"],)).fetchall()
    return {EXAMPLE.hour_of(when): run_id or f"none: {reason}" for when, run_id, reason in rows}


def test_a_backfill_of_committed_hours_runs_their_runs_again_and_publishes_nothing_twice(
    airflow_deployment: AirflowDeployment, connect_orders_runs: list[str], capsys: pytest.CaptureFixture[str],
) -> None:
    """``airflow backfill create`` (reprocess ``failed``, then ``completed``) over two committed hours.

    Airflow 3 does not add a run for a logical date that has one: with a reprocess
    behaviour it *clears* that run, keeps its run id and makes it a backfill run. So each
    backfilled run finds the epoch its run id already committed (docs/ARCHITECTURE.md,
    decisions 8 and 12): the stage reuses the prepared output without running Spark, the
    commit confirms the COMMITTED epoch and emits no second asset event, and no epoch
    begins. The hours are ``connect_orders``' two committed runs (the example's generator
    and stage). Hour 1's run is marked failed after it committed (a user's "mark failed"), so
    the ``failed`` backfill runs it again and skips hour 0; the ``completed`` backfill then
    runs hour 0 again (one hour: each behaviour runs one committed run again, and a run
    less keeps the deployment's share of the suite down).
    """
    from pyiceberg.catalog import load_catalog

    deployment = airflow_deployment
    began = time.monotonic()
    runs = dict(enumerate(connect_orders_runs))
    pipeline = CheckpointStore.from_url(f"file://{deployment.data / 'connect' / 'checkpoints'}").pipeline(
        BACKFILL_DAG)
    epochs = {hour: pipeline.epoch_for_run(run_id, BACKFILL_DAG) for hour, run_id in runs.items()}
    assert sorted(epochs.values()) == pipeline.epochs() == [1, 2], (epochs, pipeline.epochs())
    deployment.api("PATCH", f"/dags/{BACKFILL_DAG}", {"is_paused": False})

    deployment.api("PATCH", f"/dags/{BACKFILL_DAG}/dagRuns/{runs[1]}", {"state": "failed"})
    assert _backfill(deployment, "failed", 0, 1) == {0: "none: already exists", 1: runs[1]}
    _wait_success(deployment, runs[1], dag_id=BACKFILL_DAG)  # (the backfill queued it again)
    _phase(capsys, began, f"{BACKFILL_DAG}: the 'failed' backfill ran hour 1 again")
    assert _backfill(deployment, "completed", 0, 0) == {0: runs[0]}
    _wait_success(deployment, runs[0], dag_id=BACKFILL_DAG)
    _phase(capsys, began, f"{BACKFILL_DAG}: the 'completed' backfill ran hour 0 again")
    deployment.api("PATCH", f"/dags/{BACKFILL_DAG}", {"is_paused": True})

    # What the backfill runs did: their own runs again, each on the epoch it committed before.
    for hour, run_id in runs.items():
        run = deployment.api("GET", f"/dags/{BACKFILL_DAG}/dagRuns/{run_id}")
        assert (run["state"], run["run_type"]) == ("success", "backfill"), run
        stage = _xcom(deployment, BACKFILL_DAG, run_id, STAGE_TASK)
        assert (stage["epoch"], stage["reused"]) == (epochs[hour], True), stage
        commit = _xcom(deployment, BACKFILL_DAG, run_id, "orders.commit")
        assert (commit["epoch"], commit["already_committed"]) == (epochs[hour], True), commit
        tries = deployment.api("GET", f"/dags/{BACKFILL_DAG}/dagRuns/{run_id}/taskInstances/{STAGE_TASK}")
        assert tries["try_number"] == 2, tries  # run once, then by one of the backfills
    assert pipeline.epochs() == [1, 2] and all(pipeline.state(e) is EpochState.COMMITTED for e in (1, 2))

    # What was published: every order of hours 0-1 once, in one table snapshot and one asset event per epoch.
    table = load_catalog("default", **EXAMPLE.iceberg_catalog(str(deployment.data / "connect"))).load_table(
        "shop.connect_orders")
    published = [str(v) for v in table.scan(selected_fields=("order_id",)).to_arrow().column("order_id").to_pylist()]
    expected = {order["order_id"] for hour in runs for order in EXAMPLE.orders_of_hour(hour)}
    assert sorted(published) == sorted(expected), (len(published), len(expected))
    assert len(table.snapshots()) == 2, [s.summary for s in table.snapshots()]
    events = deployment.api("GET", f"/assets/events?source_dag_id={BACKFILL_DAG}")["asset_events"]
    assert sorted((e["source_run_id"], e["extra"]["epoch"]) for e in events) == sorted(
        (runs[hour], epoch) for hour, epoch in epochs.items()), events
    _phase(capsys, began, f"{BACKFILL_DAG}: the store, the table and the asset events checked")


HELD_DAG = "held_back_orders"


def test_an_expectation_held_run_fails_with_its_reason_in_the_note_and_its_failure_callback_fires(
    airflow_deployment: AirflowDeployment, capsys: pytest.CaptureFixture[str],
) -> None:
    """``tests/integration/deployment/dags/held_back_orders.py``: an expectation refuses the epoch.

    The run ends failed (the abort task fails once the epoch is aborted), the scheduler's
    listener writes the reason into the run's note, and the DAG's failure callback -- which
    the dag-processor runs -- appends the run id to a file.
    """
    deployment = airflow_deployment
    deployment.wait_for(f"the dag-processor to parse {HELD_DAG}", lambda: deployment.api(
        "GET", f"/dags?dag_id_pattern={HELD_DAG}").get("total_entries"), timeout=240)
    deployment.api("PATCH", f"/dags/{HELD_DAG}", {"is_paused": False})
    started = time.monotonic()
    deployment.api("POST", f"/dags/{HELD_DAG}/dagRuns", {"dag_run_id": "held_1", "logical_date": None})

    def finished() -> str | None:
        state = str(deployment.api("GET", f"/dags/{HELD_DAG}/dagRuns/held_1")["state"])
        return state if state in ("success", "failed") else None

    state = deployment.wait_for(f"{HELD_DAG} run held_1 to finish", finished, timeout=RUN_TIMEOUT_S)
    alerts = deployment.data / "held_back" / "alerts"
    deployment.wait_for("the failure callback to run", lambda: alerts.is_file() and alerts.read_text(), timeout=120)
    with capsys.disabled():  # the seconds show in the test run's output, passed or not
        print(f"\nexpectation-held run triggered -> failed, its failure callback run: "
              f"{time.monotonic() - started:.1f}s")
    assert state == "failed"
    assert alerts.read_text().splitlines() == ["held_1"]
    tis = {ti["task_id"]: ti for ti in deployment.api(
        "GET", f"/dags/{HELD_DAG}/dagRuns/held_1/taskInstances")["task_instances"]}
    assert (tis["orders.commit"]["state"], tis["orders.abort"]["state"]) == ("skipped", "failed")
    assert tis["orders.abort"]["try_number"] == 1
    note = deployment.api("GET", f"/dags/{HELD_DAG}/dagRuns/held_1")["note"]
    assert note == ("Input held back: pipeline 'held_back_orders' epoch 1 refused and aborted: check failed: "
                    "expectations failed: expectation 'id_present' of sink 'orders_out': 1 of 3 rows failed (33.3%), "
                    "and its action is 'fail'"), note
    pipeline = CheckpointStore.from_url(f"file://{deployment.data / 'held_back' / 'checkpoints'}").pipeline(HELD_DAG)
    assert pipeline.state(1) is EpochState.ABORTED
    deployment.api("PATCH", f"/dags/{HELD_DAG}", {"is_paused": True})


def _terminate_stage_mid_work(deployment: AirflowDeployment, run_id: str) -> None:
    """SIGTERM the run's stage task process mid-stage (what Airflow sends when a running task is
    marked failed or loses its heartbeat): on_kill must stop Spark at once, quietly, and the
    retry must finish the epoch."""
    termed_pid, termed_try, _ = _signal_stage_while_spark_runs(deployment, run_id, signal.SIGTERM)
    ended = deployment.wait_for(f"the SIGTERMed stage try of {run_id} to end",
                                lambda: _try_ended(deployment, run_id, termed_try),
                                timeout=TERM_GRACE_S, interval=0.5)
    assert ended != "success", "the SIGTERMed stage ran on to success instead of stopping"
    termed_log = _task_log(deployment, run_id, STAGE_TASK, termed_try)
    assert "terminated: cancelling the Spark jobs" in termed_log.read_text(errors="replace"), tail(termed_log)
    noise = _py4j_traceback_lines(termed_log)
    assert len(noise) <= 2, f"py4j traceback lines in {termed_log} (pid {termed_pid}):\n" + "\n".join(noise[:20])
    _wait_success(deployment, run_id)


def _clear_committed_run(deployment: AirflowDeployment, run_id: str) -> None:
    """Clear every task of a committed run: it runs again and must not publish twice."""
    cleared = deployment.api("POST", f"/dags/{DAG_ID}/clearTaskInstances", {
        "dry_run": False, "dag_run_id": run_id, "only_failed": False, "reset_dag_runs": True})
    assert {ti["task_id"] for ti in cleared["task_instances"]} >= {STAGE_TASK, "orders.commit"}
    _wait_success(deployment, run_id,
                  and_then=lambda: _task(deployment, run_id, "orders.commit")["try_number"] >= 2)


def _lose_worker_mid_stage(deployment: AirflowDeployment, run_id: str,
                           capsys: pytest.CaptureFixture[str]) -> tuple[int, int, float]:
    """Lose the worker of the run's stage while its Spark session runs; return (try, pid, seconds).

    SIGKILL its supervisor and the task's process group. Airflow notices when the heartbeats
    stop (``[scheduler] task_instance_heartbeat_timeout``) and retries the stage, and the run
    succeeds. Returns the killed try's number and pid, and the seconds from the kill to the
    retry's start.
    """
    killed_pid, killed_try, killed_jvms = _signal_stage_while_spark_runs(deployment, run_id, signal.SIGKILL,
                                                                        lose_worker=True)
    lost_at = time.time()
    assert killed_jvms, f"the stage task process {killed_pid} ran no Spark JVM when it was killed"
    lost_s = _seconds_to_commit(deployment, run_id, lost_at)
    _wait_success(deployment, run_id)
    retried = _task(deployment, run_id, STAGE_TASK)
    assert retried["try_number"] > killed_try, f"the stage was not retried after the kill: {retried}"
    lost_resumed_s = _started(retried) - lost_at
    with capsys.disabled():  # the seconds show in the test run's output, passed or not
        print(f"\nworker lost mid-stage -> the stage's retry started: {lost_resumed_s:.1f}s, "
              f"-> the run's epoch committed: {lost_s:.1f}s")
    # The killed task's JVM does not outlive it (PySpark's gateway exits when its parent's pipe closes).
    orphans = [pid for pid in killed_jvms if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
    assert not orphans, f"the killed stage's JVM(s) {orphans} still run after the retry succeeded"
    return killed_try, killed_pid, lost_resumed_s


def _mark_stage_success_before_it_runs(deployment: AirflowDeployment, run_id: str) -> float:
    """The UI's "Mark success" on the run's stage as soon as its task instance exists; return when (``time.time()``)."""
    deployment.wait_for(f"{STAGE_TASK} of {run_id} to be marked success", lambda: _mark_success(
        deployment, run_id, STAGE_TASK), timeout=60, interval=0.5)
    return time.time()


def test_example_pipeline_stays_exactly_once_through_clear_and_kill_in_a_real_deployment(
    airflow_deployment: AirflowDeployment, capsys: pytest.CaptureFixture[str],
) -> None:
    deployment = airflow_deployment
    began = time.monotonic()
    deployment.api("PATCH", f"/dags/{DAG_ID}", {"is_paused": False})

    if FULL_CAMPAIGNS:
        # Three runs, queued at once; max_active_runs=1 runs them in logical-date order.
        runs = [_trigger(deployment, hour) for hour in range(3)]
        for run_id in runs[:2]:
            _wait_success(deployment, run_id)
            _phase(capsys, began, f"{run_id} succeeded")
        _terminate_stage_mid_work(deployment, runs[2])
        _phase(capsys, began, f"{runs[2]} succeeded after its SIGTERMed try")
        _clear_committed_run(deployment, runs[0])
        _phase(capsys, began, f"the cleared {runs[0]} succeeded again")
        killed_run = _trigger(deployment, 3)
        killed_try, killed_pid, lost_resumed_s = _lose_worker_mid_stage(deployment, killed_run, capsys)
        _phase(capsys, began, f"{killed_run} succeeded after its lost worker")
        # The fifth run's stage is marked success before it runs; the sixth run waits behind it.
        marked_run = _trigger(deployment, 4)
        marked_at = _mark_stage_success_before_it_runs(deployment, marked_run)
        next_run = _trigger(deployment, 5)
        marked_s = _seconds_to_commit(deployment, next_run, marked_at)
        _wait_success(deployment, next_run)
        with capsys.disabled():  # the seconds show in the test run's output, passed or not
            print(f"\nstage marked success without running -> the next run's epoch committed: {marked_s:.1f}s")
        committed, hours = [*runs, killed_run, next_run], 6
    else:
        # The fixed slice: the first run's stage is marked success before it runs; the
        # second run, queued behind it, loses its worker mid-stage, its retry commits both
        # hours' input, and then every task of that committed run is cleared.
        marked_run = _trigger(deployment, 0)
        marked_at = _mark_stage_success_before_it_runs(deployment, marked_run)
        killed_run = next_run = _trigger(deployment, 1)
        killed_try, killed_pid, lost_resumed_s = _lose_worker_mid_stage(deployment, killed_run, capsys)
        _phase(capsys, began, f"{killed_run} succeeded after its lost worker")
        _clear_committed_run(deployment, killed_run)
        _phase(capsys, began, f"the cleared {killed_run} succeeded again")
        committed, hours = [killed_run], 2
    # The sensor sees at once that nothing will prepare the marked run's epoch; the next
    # run's stage (its first try) starts as soon as the marked run has failed.
    marked_resumed_s = _started(deployment.api(
        "GET", f"/dags/{DAG_ID}/dagRuns/{next_run}/taskInstances/{STAGE_TASK}/tries/1")) - marked_at
    with capsys.disabled():  # the seconds show in the test run's output, passed or not
        print(f"\nstage marked success without running -> the next run's stage started: {marked_resumed_s:.1f}s")
    assert _run_state(deployment, marked_run) == "failed"
    assert _task(deployment, marked_run, STAGE_TASK)["try_number"] == 0, "the marked stage ran after all"
    sensor = _task(deployment, marked_run, "orders.prepared")
    assert sensor["state"] == "failed", sensor
    sensor_log = _task_log(deployment, marked_run, "orders.prepared", sensor["try_number"]).read_text(errors="replace")
    assert "the stage was marked success without running" in sensor_log, sensor_log[-2000:]
    assert _task(deployment, marked_run, "orders.abort")["state"] == "success"
    # What the settings decide is how long the pipeline waits before the work starts again;
    # the stage's own run after that is Spark's time (minutes on a loaded two-core machine).
    assert lost_resumed_s < 60 and marked_resumed_s < 60, (lost_resumed_s, marked_resumed_s)

    # The store: every epoch decided and finished.
    pipeline = CheckpointStore.from_url(deployment.store_url).pipeline(EXAMPLE.PIPELINE)
    statuses = pipeline.list_epochs()
    assert statuses, "no epoch in the store"
    assert {s.state for s in statuses} <= {EpochState.COMMITTED, EpochState.ABORTED}, \
        [(s.epoch, s.state, s.run_id) for s in statuses]
    committed_runs = [s.run_id for s in statuses if s.state is EpochState.COMMITTED]
    assert sorted(committed_runs) == sorted(committed), committed_runs
    assert pipeline.epoch_for_run(marked_run, DAG_ID) is None

    # The table: every generated order exactly once (the generator is deterministic).
    expected = {order["order_id"] for hour in range(hours) for order in EXAMPLE.orders_of_hour(hour)}
    published = _published_order_ids(deployment.data)
    duplicates = sorted({i for i in published if published.count(i) > 1})
    assert not duplicates, f"{len(duplicates)} orders published twice, e.g. {duplicates[:5]}"
    assert set(published) == expected, (sorted(expected - set(published))[:5], sorted(set(published) - expected)[:5])

    # Airflow itself ran on PostgreSQL: the runs are rows of its metadata database there.
    with psycopg.connect(deployment.metadata_db) as conn:
        recorded = {r[0]: r[1] for r in conn.execute(
            "SELECT run_id, state FROM dag_run WHERE dag_id = %s", (DAG_ID,)).fetchall()}
    assert {recorded.get(r) for r in committed} == {"success"}, recorded

    # The killed try's log: what the supervisor recorded, without a py4j traceback flood.
    killed_log = _task_log(deployment, killed_run, STAGE_TASK, killed_try)
    assert killed_log.is_file(), f"no log of the killed try at {killed_log}"
    noise = _py4j_traceback_lines(killed_log)
    assert len(noise) <= 2, f"py4j traceback lines in {killed_log} (pid {killed_pid}):\n" + "\n".join(noise[:20])

    _phase(capsys, began, "the store, the table, the metadata database and the logs checked")

    # Nothing of the deployment is left running once it is stopped by PID.
    leftovers = deployment.stop()
    _phase(capsys, began, "the deployment stopped")
    assert not leftovers, f"processes left running after the deployment stopped: {leftovers}"
