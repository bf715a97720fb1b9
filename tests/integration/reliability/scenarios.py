"""Crash scenarios: a state to reach, a step to kill, and the normal paths that follow.

A :class:`Scenario` brings a fresh world to the moment before one protocol step (in this
process, no faults), runs the step in a child process killed at its N-th store mutation,
then lets one *continuation* -- what Airflow or the operator would do next -- carry on:

* ``retry``: Airflow retries the same task (the stage with the next try number)
* ``same-attempt``: the task runs again with the same try number (a cleared task whose
  try was not counted, or an executor that restarted the same process)
* ``abort-task``: the run gives up; the abort task (trigger rule ALL_DONE) runs
* ``recovery``: the run is abandoned; the recovery DAG runs past the prepared timeout
* ``next-run``: nothing re-runs the step; the next DAG run just starts

After the continuation, :func:`drain` runs fault-free DAG runs until all input is
consumed, then recovery and retention (the GC), and the invariants are checked.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from airflow_seatunnel_ckpt.core.errors import PendingEpochError
from tests.integration.reliability import crashdriver, synthetic
from tests.integration.reliability.synthetic import World

RUN = "run-3"


def _history(world: World) -> None:
    """Two committed epochs (so epoch 3 has a base and delta chains), then new input."""
    world.add_input(3)
    synthetic.run_dag_run(world, "run-1")
    world.add_input(3)
    synthetic.run_dag_run(world, "run-2")
    world.add_input(3)


def _prepared(world: World) -> None:
    _history(world)
    synthetic.stage(world, RUN, 1)


def _decided(world: World) -> None:
    _prepared(world)
    synthetic.decide(world, RUN)


def _committing_mess(world: World) -> None:
    """Epoch 3 COMMITTING with one sink published, plus a killed attempt's staging and temps."""
    _history(world)
    killed = crashdriver.run_step(world, "stage", {"run_id": RUN, "attempt": 1}, crash_at=6)
    assert killed.killed, killed
    synthetic.stage(world, RUN, 2)
    synthetic.decide(world, RUN)
    killed = crashdriver.run_step(world, "commit", {"run_id": RUN}, crash_at=3)
    assert killed.killed, killed


def _prepared_mess(world: World) -> None:
    """Epoch 3 PREPARED by attempt 2, after attempt 1 was killed half-way through its staging."""
    _history(world)
    killed = crashdriver.run_step(world, "stage", {"run_id": RUN, "attempt": 1}, crash_at=6)
    assert killed.killed, killed
    synthetic.stage(world, RUN, 2)


def _retention(world: World) -> None:
    _history(world)
    synthetic.run_dag_run(world, RUN)
    world.add_input(2)
    synthetic.run_dag_run(world, "run-4")
    world.add_input(2)


def _follow_decision(world: World, run_id: str) -> None:
    decided = synthetic.decide(world, run_id)
    if decided["decision"] == "commit":
        synthetic.commit(world, run_id)
    elif decided["decision"] == "abort":
        synthetic.abort(world, run_id)


def _continue(step: str, how: str, world: World, args: dict[str, Any]) -> None:
    run_id = args.get("run_id", RUN)
    if how == "recovery":
        synthetic.recover(world, past_timeout=True)
        return
    if how == "abort-task":
        synthetic.abort(world, run_id)
        return
    if how == "next-run":
        # Nothing re-runs the killed task; the next DAG run starts. While an earlier epoch
        # is unfinished its stage fails, and the recovery DAG resolves that epoch.
        try:
            synthetic.run_dag_run(world, "run-next")
        except PendingEpochError:
            synthetic.recover(world, past_timeout=True)
        return
    if step == "stage":
        attempt = args["attempt"] + (1 if how == "retry" else 0)
        synthetic.stage(world, run_id, attempt)
        _follow_decision(world, run_id)
    elif step == "decide":
        _follow_decision(world, run_id)
    elif step == "commit":
        synthetic.commit(world, run_id)
    elif step == "abort":
        synthetic.abort(world, run_id)
    elif step == "recover":
        synthetic.recover(world, **args)
    elif step == "retain":
        synthetic.retain(world, **args)
    else:  # pragma: no cover - a scenario names an unknown step
        raise ValueError(step)


@dataclass(frozen=True)
class Scenario:
    """One step to kill at every mutation, from a given state, with its continuations."""

    name: str
    category: str  #: which part of the protocol (the rows of docs/RELIABILITY.md)
    setup: Callable[[World], None]
    step: str
    args: dict[str, Any]
    continuations: tuple[str, ...]
    tags: tuple[str, ...] = field(default=())

    def continue_after_crash(self, world: World, how: str) -> None:
        _continue(self.step, how, world, self.args)


SCENARIOS = [
    Scenario(
        "stage",
        "prepare (stage, parts, prepared record, markers)",
        _history,
        "stage",
        {"run_id": RUN, "attempt": 1},
        ("retry", "same-attempt", "abort-task", "recovery"),
    ),
    Scenario(
        "decide",
        "decision (_metadata, decision record)",
        _prepared,
        "decide",
        {"run_id": RUN},
        ("retry", "abort-task", "recovery", "next-run"),
    ),
    Scenario(
        "commit",
        "publish (multi-sink / multi-file publish, _SUCCESS, committed record)",
        _decided,
        "commit",
        {"run_id": RUN},
        ("retry", "abort-task", "recovery", "next-run"),
    ),
    Scenario(
        "abort",
        "abort (decision, staging and checkpoint removal, aborted record)",
        _prepared,
        "abort",
        {"run_id": RUN},
        ("retry", "recovery", "next-run"),
    ),
    Scenario(
        "recover-committing",
        "recovery (finish a commit, drop staging and temp files)",
        _committing_mess,
        "recover",
        {"past_timeout": True},
        ("retry",),
    ),
    Scenario(
        "recover-prepared",
        "recovery (abort past the timeout, drop staging and checkpoint)",
        _prepared_mess,
        "recover",
        {"past_timeout": True},
        ("retry",),
    ),
    Scenario(
        "retain",
        "retention / GC (retired record, checkpoint removal)",
        _retention,
        "retain",
        {"max_retain": 1},
        ("retry", "next-run"),
    ),
]


def consumed_files(world: World) -> set[str]:
    p = world.pipeline()
    point = p.restore_point()
    return {f for entry in point.source_entries(synthetic.SOURCE) for f in entry["offsets"]["files"]}


def drain(world: World, prefix: str = "drain") -> None:
    """Fault-free DAG runs until every input file is consumed, then recovery and GC."""
    for i in range(30):
        if set(world.input_files()) <= consumed_files(world):
            break
        try:
            synthetic.run_dag_run(world, f"{prefix}-{i}")
        except PendingEpochError as exc:
            raise AssertionError(f"the continuation left an epoch unresolved: {exc}") from exc
    else:  # pragma: no cover - the pipeline stopped making progress
        raise AssertionError("input still unconsumed after 30 fault-free DAG runs")
    synthetic.recover(world, past_timeout=True)
    synthetic.retain(world, max_retain=2)
    synthetic.recover(world, past_timeout=True)
