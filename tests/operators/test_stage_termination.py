"""A stage task terminated (SIGTERM) while its in-process Spark job runs stops quietly.

(While the job runs, the test also checks that the task's Spark driver and UI listen on
127.0.0.1 only, with no address in the stage's ``spark_conf``, as in the example DAG.)

What Airflow's supervisor sends a task process when the task is marked failed in the UI or
loses its heartbeat: the task runner calls ``on_kill``, which cancels the Spark jobs and
stops the session. The log must say so once, and not bury it under py4j tracebacks from
every py4j call still in flight (broken pipe, connection refused, empty answer).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from airflow_seatunnel_ckpt.core import CheckpointStore, EpochState
from tests.spark.stages import STAGED_MARKER_ENV

pytestmark = [pytest.mark.airflow, pytest.mark.spark, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
#: What py4j and PySpark print when the JVM went away under a call.
PY4J_NOISE = re.compile(r"Broken pipe|py4j\.protocol\.Py4JNetworkError|Connection refused|Py4JJavaError|"
                        r"Answer from Java side is empty|py4j\.clientserver|py4j\.java_gateway|"
                        r"Py4JError|Error while sending or receiving|Exception while sending command")


def _listening(pid: int) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket the process's children (its JVM) listen on."""
    found = set()
    for child in psutil.Process(pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            found |= {(c.laddr.ip, c.laddr.port) for c in child.net_connections(kind="tcp")
                      if c.status == psutil.CONN_LISTEN}
    return found


def _loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip)
    mapped = getattr(address, "ipv4_mapped", None)  # ::ffff:127.0.0.1 is IPv4 loopback
    return (mapped or address).is_loopback


def _terminate_while_spark_runs(tmp_path: Path, whole_group: bool) -> tuple[int, str, set[tuple[str, int]]]:
    """Run the DAG in a process of its own, SIGTERM it mid-job; its exit code, whole output, and
    where its JVM listened while the job ran.

    ``whole_group``: the signal goes to the task's process group (its JVM and Python workers
    too, as a shell's Ctrl-C or a container stop does), else to the task process only (as
    Airflow's supervisor does).
    """
    inputs = tmp_path / "in"
    inputs.mkdir()
    (inputs / "a.json").write_text('{"order_id": 1}\n')
    marker, log = tmp_path / "running", tmp_path / "task.log"
    env = {**os.environ, STAGED_MARKER_ENV: str(marker),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    with log.open("wb") as out:
        task = subprocess.Popen([sys.executable, "-m", "tests.operators.terminated_stage_dag",
                                 f"file://{tmp_path}/store", str(inputs)],
                                cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not marker.exists():
            assert task.poll() is None, f"the task ended early ({task.returncode}):\n{log.read_text()[-4000:]}"
            assert time.monotonic() < deadline, f"the Spark job did not start:\n{log.read_text()[-4000:]}"
            time.sleep(0.2)
        time.sleep(1)
        listening = _listening(task.pid)
        if whole_group:
            os.killpg(task.pid, signal.SIGTERM)
        else:
            task.send_signal(signal.SIGTERM)
        code = task.wait(timeout=90)
    finally:
        if task.poll() is None:
            os.killpg(task.pid, signal.SIGKILL)
            task.wait(timeout=30)
        else:
            with contextlib.suppress(ProcessLookupError):  # nor may its JVM and Python workers
                os.killpg(task.pid, signal.SIGKILL)
    return code, log.read_text(errors="replace"), listening


@pytest.mark.parametrize("whole_group", [False, True], ids=["task-process", "process-group"])
def test_a_terminated_stage_names_the_termination_once_without_a_py4j_traceback_flood(
    airflow_home: Path, tmp_path: Path, whole_group: bool,
) -> None:
    code, output, listening = _terminate_while_spark_runs(tmp_path, whole_group)
    (tmp_path / "task.log").write_text(output)
    lines = output.splitlines()
    java_stack = [line for line in lines if re.match(r"\s+at [\w.$]+\(", line)]
    noise = [line for line in lines if PY4J_NOISE.search(line)]
    tracebacks = [line for line in lines if line.startswith("Traceback") or "Traceback (most recent" in line]
    report = (f"exit {code}; {len(noise)} py4j lines, {len(tracebacks)} tracebacks, {len(java_stack)} Java "
              f"stack lines:\n{output[-6000:]}")
    assert len([line for line in lines if "terminated: cancelling the Spark jobs" in line]) == 1, report
    assert len(noise) <= 2, report
    assert len(tracebacks) <= 1, report
    assert java_stack == [], report
    # One clear error: what happened, to which epoch and attempt, and what comes next.
    errors = [line for line in lines if "StageTerminatedError:" in line]
    assert len(errors) == 1, report
    assert "stage ingest of pipeline 'terminated' was terminated (SIGTERM)" in errors[0], report
    assert "epoch 1, attempt 1 stays unprepared" in errors[0], report
    # The example's kind of stage (in-process, no address in spark_conf, the UI on): its
    # driver, block manager and UI listened on loopback only.
    assert listening and all(_loopback(ip) for ip, _ in listening), listening
    assert any(4040 <= port < 4100 for _, port in listening), f"no Spark UI among {listening}"
    # The attempt stays unprepared: the epoch was never prepared (a retry stages anew).
    pipeline = CheckpointStore.from_url(f"file://{tmp_path}/store").pipeline("terminated")
    assert [pipeline.state(e) for e in pipeline.epochs()] in ([EpochState.OPEN], [EpochState.ABORTED]), report


def test_the_next_try_of_a_killed_stage_logs_the_lease_the_killed_try_left(tmp_path: Path) -> None:
    from airflow_seatunnel_ckpt.core.protocol.lease import LeaseKeeper, earlier_attempt

    store_url = f"file://{tmp_path}/store"
    p = CheckpointStore.from_url(store_url).pipeline("orders")
    epoch = p.begin("run-1").epoch
    # Try 1 took its lease and renewed it, then was SIGKILLed: the lease stays as last renewed.
    assert LeaseKeeper.for_pipeline(p, epoch, "ingest", 1, holder={"host": "worker-9", "pid": 77}).renew()

    # What the stage hook logs before it runs attempt 2 in-process.
    logged = earlier_attempt(p, epoch, "ingest", 2)

    assert re.search(r"epoch 1: an earlier attempt of ingest ran and did not prepare: its lease says attempt 1 on "
                     r"worker-9:77, last renewed \d+s ago", logged), logged
    assert "killed (e.g. SIGKILL when out of memory)" in logged and "this attempt 2 runs the stage again" in logged
    assert earlier_attempt(p, epoch, "ingest", 1) == ""  # its own lease: nothing earlier to say
