"""Run one protocol step in a child process, optionally SIGKILLed at its N-th store mutation.

Children are forked from a ``forkserver`` that has already imported the core (and s3fs)
and looked up the storage backends, so a step in a fresh process costs a few milliseconds
instead of an interpreter start. The forkserver itself never touches a store, so it holds
no threads or connections a fork could inherit half-way. A child is told which stores
this process already probed for conditional create (the probe tests the server, not the
step), so it does not repeat the probe's writes and racing threads.

:func:`run_step` is the only entry point the tests use::

    outcome = run_step(world, "commit", {"run_id": "run-1"}, crash_at=3)
    outcome.killed      # True: SIGKILL at mutation 3
    outcome.point       # "publish publish file (rename)" -- what it died doing

Hook for the Airflow variant: a step name that maps to an Airflow task (``stage`` ->
``SparkStageOperator``, ``decide`` -> ``CommitBranchOperator``, ...) can be run here by
executing that task in the child instead of the function of :mod:`synthetic`
(``AIRFLOW_STEPS``); the fault plan, the op log and the outcome stay the same.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import signal
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from airflow_seatunnel_ckpt.core.storage import registry
from tests.integration.reliability import faults, synthetic

_PRELOAD = [
    "__main__",
    "airflow_seatunnel_ckpt.core",
    "airflow_seatunnel_ckpt.core.protocol.descriptor",
    "s3fs",
    "tests.integration.reliability.faults",
    "tests.integration.reliability.synthetic",
    "tests.integration.reliability.crashdriver",
]
_CONTEXT: Any = None

# Imported into the forkserver too: each child then finds the backends without reading
# every installed package's entry points again.
for _protocol in ("file", "s3"):
    registry.backend_for(_protocol)

#: Steps run by Airflow tasks instead of the synthetic functions; filled in by the Airflow
#: variant of this suite (same signature: ``(world, **args) -> dict``).
AIRFLOW_STEPS: dict[str, Callable[..., dict[str, Any]]] = {}


def _context() -> Any:
    global _CONTEXT
    if _CONTEXT is None:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(_PRELOAD)
        _CONTEXT = ctx
    return _CONTEXT


@dataclass
class Outcome:
    """How a step in a child process ended."""

    step: str
    exitcode: int | None
    result: Any = None  #: the step's return value, when it returned
    error: str = ""  #: ``"<ExceptionType>: message"`` when it raised
    error_type: str = ""
    ops: list[dict[str, Any]] = field(default_factory=list)  #: every mutation it started

    @property
    def killed(self) -> bool:
        return self.exitcode == -signal.SIGKILL

    @property
    def ok(self) -> bool:
        return self.exitcode == 0 and not self.error

    @property
    def point(self) -> str:
        """The named crash point the process died at (``""`` if it was not killed)."""
        if not self.killed or not self.ops:
            return ""
        return faults.classify(self.ops[-1])

    @property
    def total_ops(self) -> int:
        """Mutations of a completed step (the index of its 'after the last op' point)."""
        return self.ops[-1]["n"] if self.ops and self.ops[-1]["op"] == "end" else 0


def _child(
    world: synthetic.World,
    step: str,
    args: dict[str, Any],
    plan: faults.FaultPlan,
    out: str,
    use_airflow: bool,
    probed: frozenset[tuple[Any, ...]] = frozenset(),
) -> None:
    registry._probed.update(probed)
    faults.install(plan)
    fn = (AIRFLOW_STEPS if use_airflow else synthetic.STEPS)[step]
    payload: dict[str, Any]
    try:
        result = fn(world, **args)
    except Exception as exc:  # reported to the parent, which decides what is expected
        payload = {
            "error": f"{type(exc).__name__}: {exc}",
            "error_type": type(exc).__name__,
            "trace": traceback.format_exc(),
        }
    else:
        faults.step_finished()
        payload = {"result": result}
    with open(out, "w") as fh:
        fh.write(synthetic.to_json(payload))


def start_step(
    world: synthetic.World,
    step: str,
    args: dict[str, Any] | None = None,
    *,
    crash_at: int | None = None,
    pause_at: int | None = None,
    pause_on: str | None = None,
    use_airflow: bool = False,
) -> tuple[Any, str, str]:
    """Start a step in a child; returns (process, result file, op log). See :func:`finish`."""
    scratch = tempfile.mkdtemp(prefix="crashstep-")
    out, op_log = os.path.join(scratch, "result.json"), os.path.join(scratch, "ops.jsonl")
    plan = faults.FaultPlan(crash_at=crash_at, pause_at=pause_at, pause_on=pause_on, op_log=op_log)
    probed = frozenset(registry._probed)
    process = _context().Process(target=_child, args=(world, step, dict(args or {}), plan, out, use_airflow, probed))
    process.start()
    return process, out, op_log


def finish(step: str, process: Any, out: str, op_log: str, timeout: float = 120) -> Outcome:
    """Wait for a child started by :func:`start_step` and collect its outcome."""
    process.join(timeout)
    if process.exitcode is None:
        process.kill()
        process.join()
        raise TimeoutError(f"step {step} did not finish within {timeout}s")
    outcome = Outcome(step, process.exitcode, ops=faults.read_op_log(op_log))
    if os.path.exists(out):
        with open(out) as fh:
            payload = json.load(fh)
        outcome.result = payload.get("result")
        outcome.error = payload.get("error", "")
        outcome.error_type = payload.get("error_type", "")
        if payload.get("trace"):
            outcome.error += "\n" + payload["trace"]
    for path in (out, op_log):
        if os.path.exists(path):
            os.unlink(path)
    os.rmdir(os.path.dirname(out))
    return outcome


def run_step(
    world: synthetic.World,
    step: str,
    args: dict[str, Any] | None = None,
    *,
    crash_at: int | None = None,
    timeout: float = 120,
    use_airflow: bool = False,
) -> Outcome:
    """Run ``step`` in a child process; SIGKILL it before mutation ``crash_at`` if given."""
    process, out, op_log = start_step(world, step, args, crash_at=crash_at, use_airflow=use_airflow)
    return finish(step, process, out, op_log, timeout)


def wait_stopped(process: Any, timeout: float = 60) -> None:
    """Wait until a child paused itself with SIGSTOP (``pause_at``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{process.pid}/stat") as fh:
                state = fh.read().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            raise RuntimeError(f"process {process.pid} exited before pausing") from None
        if state in ("T", "t"):
            return
        if not process.is_alive():
            raise RuntimeError(f"process {process.pid} exited before pausing")
        time.sleep(0.005)
    raise TimeoutError(f"process {process.pid} did not pause within {timeout}s")


def resume(process: Any) -> None:
    """Continue a paused child (the zombie wakes up)."""
    os.kill(process.pid, signal.SIGCONT)


def race(
    world: synthetic.World,
    steps: list[tuple[str, dict[str, Any]]],
    pause_on: str | None,
    timeout: float = 60,
) -> list[Outcome]:
    """Run ``steps`` in concurrent children, lined up at ``pause_on`` and released together.

    Each child freezes (SIGSTOP) at its first mutation matching ``pause_on``; once every
    child is frozen there (or finished without reaching it), all are continued at once.
    """
    started = [start_step(world, step, args, pause_on=pause_on) for step, args in steps]
    if pause_on:
        for process, _, _ in started:
            # A child may finish (or fail) before it reaches the pause point.
            with contextlib.suppress(RuntimeError):
                wait_stopped(process, timeout)
        for process, _, _ in started:
            if process.is_alive():
                resume(process)
    return [finish(step, *handles, timeout=timeout) for (step, _), handles in zip(steps, started, strict=True)]
