"""The detached launcher of a submitted stage: runs ``spark-submit`` beyond the task's life.

    python -m airflow_seatunnel_ckpt.spark.launch --plan <workdir>/plan.json

Started in a session of its own (:func:`launch_detached`), it holds the participant's lease while the command runs,
stops its process group when a cancel is requested or the epoch is decided without it, writes the attempt's exit record
when it ends (then nothing of the attempt runs any more) and removes its working directory (the spec holds credentials).
A deferred Spark Connect stage runs the driver module the same way; its session is released when it failed or was
stopped.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Private directory (0700) of one launch: the spec and the plan. Removed by the launcher.
WORKDIR_PREFIX = "seatunnel-ckpt-submit-"
#: Seconds spark-submit gets to stop after SIGTERM before it is killed.
STOP_GRACE_S = 30.0
#: Seconds what spark-submit left running gets after SIGTERM before it is killed.
LEFTOVER_GRACE_S = 5.0
#: Folder of launch logs, beside the working directories (the log outlives them).
LOG_FOLDER = "seatunnel-ckpt-submit-logs"


@dataclass(frozen=True)
class Launch:
    """A launcher started by :func:`launch_detached`."""

    pid: int
    log: str
    workdir: str


def private_workdir() -> Path:
    """A new private (0700) temporary directory for a launch's spec and plan."""
    return Path(tempfile.mkdtemp(prefix=WORKDIR_PREFIX))


def write_private(path: Path, text: str) -> None:
    """Create ``path`` readable by this user only (it may hold store credentials)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(text)


def log_path(name: str) -> Path:
    """Where the launch log of ``name`` goes (a folder of this user's temporary directory)."""
    folder = Path(tempfile.gettempdir()) / LOG_FOLDER
    folder.mkdir(mode=0o700, exist_ok=True)
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:150]
    return folder / f"{safe}-{os.getpid()}-{time.time_ns()}.log"


def launch_detached(*, workdir: Path, spec_file: Path, epoch: int, command: Sequence[str],
                    env: Mapping[str, str], log: Path, cwd: str | None = None) -> Launch:
    """Start the launcher for ``command`` in a new session and return at once (``workdir`` holds ``spec_file`` and is
    removed by the launcher; ``env`` is added for the command; ``cwd`` defaults to ``workdir``)."""
    plan = {"command": list(command), "env": dict(env), "log": str(log), "spec_file": str(spec_file),
            "epoch": int(epoch), "workdir": str(workdir), "cwd": cwd or str(workdir)}
    plan_file = workdir / "plan.json"
    write_private(plan_file, json.dumps(plan))
    with open(log, "ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "airflow_seatunnel_ckpt.spark.launch", "--plan", str(plan_file)],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            close_fds=True, cwd=str(workdir))
    return Launch(process.pid, str(log), str(workdir))


def terminate(pid: int, grace_s: float = 20.0) -> bool:
    """SIGTERM the launcher's process group (launcher, ``spark-submit``, local driver); True if it was there."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    return True


class LogFollower:
    """New lines of a launch log since the last look (the log is local to the launching host)."""

    def __init__(self, path: str, offset: int = 0) -> None:
        self.path = path
        self.offset = offset

    def new_lines(self, limit: int = 2000) -> list[str]:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read(4 << 20)
        except OSError:
            return []
        end = data.rfind(b"\n")
        if end < 0:
            return []
        self.offset += end + 1
        lines = data[: end + 1].decode("utf-8", errors="replace").splitlines()
        return lines[-limit:]


def _load_plan(path: str) -> dict[str, Any]:
    with open(path, encoding="utf-8") as fh:
        plan = json.load(fh)
    if not isinstance(plan, dict) or not isinstance(plan.get("command"), list) or not plan["command"]:
        raise SystemExit(f"launch plan {path} has no command: it was not written by the stage task")
    return plan


def end_process_group(grace_s: float) -> None:
    """SIGTERM every other process of this launcher's process group (``spark-submit`` and what it started), SIGKILL what
    runs after ``grace_s``; only as the leader of its own session (else nothing is signalled)."""
    import psutil

    me = os.getpid()
    if os.getsid(0) != me:
        return

    def running(process: psutil.Process) -> bool:
        try:
            return os.getpgid(process.pid) == me and process.status() != psutil.STATUS_ZOMBIE
        except (OSError, psutil.Error):
            return False

    left = [p for p in psutil.process_iter() if p.pid != me and running(p)]
    for process in left:
        with contextlib.suppress(psutil.Error):
            process.terminate()
    deadline = time.monotonic() + grace_s
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = [p for p in left if running(p)]
    for process in left:
        with contextlib.suppress(psutil.Error):
            process.kill()


def _stop_reason(pipeline: Any, epoch: int, participant: str, attempt: int) -> str:
    """:func:`~airflow_seatunnel_ckpt.core.protocol.lease.stop_reason`; a store hiccup lets it run."""
    from airflow_seatunnel_ckpt.core.protocol.lease import stop_reason

    try:
        return stop_reason(pipeline, epoch, participant, attempt)
    except Exception as exc:  # the next look tries again
        print(f"seatunnel-ckpt launcher: could not look for a stop request: {exc}", flush=True)
        return ""


def _release_connect_session(remote: str) -> None:
    """Release the Connect session of a driver that was stopped or failed: that ends whatever operation it left running
    on the server, before the exit record says nothing runs."""
    from pyspark.sql.connect.client import SparkConnectClient

    try:
        client = SparkConnectClient(remote)
        try:
            client.release_session()
        finally:
            client.close()
    except Exception as exc:  # released already (the driver's own ending), or the server is gone
        if "SESSION_CLOSED" not in str(exc):
            print(f"seatunnel-ckpt launcher: the stage's Connect session: {exc}", flush=True)


def run(plan: Mapping[str, Any]) -> int:
    """Run ``spark-submit`` as the plan says, holding the lease; write the exit record."""
    from airflow_seatunnel_ckpt.core import CheckpointConfig, CheckpointStore
    from airflow_seatunnel_ckpt.core.protocol.lease import (
        TAIL_LINES,
        ExitRecord,
        LeaseKeeper,
        default_holder,
        record_exit,
    )
    from airflow_seatunnel_ckpt.spark.context import AirflowContext
    from airflow_seatunnel_ckpt.spark.spec import StageSpec

    spec = StageSpec.from_json(Path(plan["spec_file"]).read_text(encoding="utf-8"))
    pipeline = CheckpointStore(CheckpointConfig.from_mapping(spec.store)).pipeline(spec.pipeline)
    epoch = int(plan["epoch"])
    env = {**os.environ, **{str(k): str(v) for k, v in dict(plan.get("env") or {}).items()}}
    child: subprocess.Popen[bytes] | None = None

    def forward(signum: int, _frame: Any) -> None:
        if child is not None and child.poll() is None:
            child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    holder = default_holder(run_id=spec.run_id, role=f"{plan.get('runtime') or 'spark-submit'} launcher",
                            ti=AirflowContext.from_dict(spec.airflow_context).task_instance(spec.attempt))
    returncode = 1
    stopped = ""
    try:
        keeper = LeaseKeeper.for_pipeline(pipeline, epoch, spec.participant, spec.attempt, holder=holder)
        with keeper:
            child = subprocess.Popen(plan["command"], stdin=subprocess.DEVNULL, stdout=sys.stdout,
                                     stderr=subprocess.STDOUT, env=env, cwd=plan.get("cwd") or None)
            while True:
                try:
                    returncode = child.wait(timeout=keeper.renew_s)
                    break
                except subprocess.TimeoutExpired:
                    pass
                if not stopped:
                    stopped = _stop_reason(pipeline, epoch, spec.participant, spec.attempt)
                    if stopped:
                        print(f"seatunnel-ckpt launcher: stopping spark-submit: {stopped}", flush=True)
                        end_process_group(STOP_GRACE_S)
                        returncode = child.wait()
                        break
    finally:
        end_process_group(LEFTOVER_GRACE_S)
        if spec.remote is not None and (returncode != 0 or stopped):
            _release_connect_session(spec.remote)
        tail: deque[str] = deque(maxlen=TAIL_LINES)
        try:
            with open(plan["log"], encoding="utf-8", errors="replace") as fh:
                tail.extend(line.rstrip("\n") for line in fh)
        except OSError:
            pass
        try:
            record_exit(pipeline, ExitRecord(epoch, spec.participant, spec.attempt, returncode, list(tail),
                                             time.time(), stopped))
        finally:
            shutil.rmtree(plan["workdir"], ignore_errors=True)
    return returncode


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="airflow_seatunnel_ckpt.spark.launch",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--plan", required=True, help="the launch plan the stage task wrote")
    args = parser.parse_args(argv)
    return run(_load_plan(args.plan))


if __name__ == "__main__":
    sys.exit(main())
