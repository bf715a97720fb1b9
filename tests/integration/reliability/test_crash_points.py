"""SIGKILL at every store mutation of every protocol step, then the normal path continues.

For each scenario the step runs in a child process killed before its 1st, 2nd, ...
mutation, and once more after its last one (the task dies before reporting success),
until a run completes. After each kill the crashed state is cloned and one continuation
(retry, same attempt, abort task, recovery DAG, next run) carries on; then fault-free runs
drain the input, recovery and retention run, and every invariant is checked: each record
published exactly once, each epoch all-or-nothing across both sinks, one decision, the
restore point equal to the published output, no staging or temp file left.

The CI slice gives every crash point one continuation (rotating through them); with
``RELIABILITY_FULL=1`` every crash point gets every continuation. On S3 the CI slice runs
the commit scenario (where S3 differs most: copy-then-mark, conditional PUTs) and skips
the continuation of a crash point that only repeats the clean-up of the point before it
(the six ``delete staging`` points after the committed record leave the same state but
for one more staging object gone, and each S3 continuation costs hundreds of requests);
every publish copy, ``_SUCCESS``, record and the first clean-up point still run.
"""

from __future__ import annotations

import pytest

from tests.integration.reliability import crashdriver, invariants, report
from tests.integration.reliability.conftest import FULL, WorldFactory
from tests.integration.reliability.scenarios import SCENARIOS, Scenario, drain

pytestmark = pytest.mark.crash


def in_s3_slice(test: str, params: dict[str, object]) -> bool:
    """CI on S3: the publish, where S3 differs most (copy-then-mark, conditional PUTs)."""
    scenario = params.get("scenario")
    return isinstance(scenario, Scenario) and scenario.name == "commit"


def repeats_a_clean_up(backend: str, point: str, previous: str) -> bool:
    """Whether the CI slice skips this crash point's continuation (see the module docstring)."""
    return not FULL and backend == "s3" and point == previous and point.startswith("delete ")


def crash_every_mutation(make_world: WorldFactory, scenario: Scenario) -> list[dict[str, object]]:
    """Run the scenario's step killed at each mutation in turn; returns one row per continuation."""
    rows: list[dict[str, object]] = []
    world = make_world()
    scenario.setup(world)
    before = make_world.save(world)
    n = 0
    previous = ""  # the point of the previous kill
    while True:
        n += 1
        if n > 1:
            make_world.restore(world, before)
        outcome = crashdriver.run_step(world, scenario.step, scenario.args, crash_at=n)
        if not outcome.killed:
            assert outcome.ok, f"{scenario.name}: the step failed without a fault: {outcome.error}"
            assert n > 1, f"{scenario.name}: the step made no store mutation"
            # The completed run is a check too: the rest of the normal path, then drain.
            scenario.continue_after_crash(world, scenario.continuations[0])
            drain(world)
            problems = invariants.check_world(world, drained=True)
            assert not problems, f"{scenario.name} without a crash: {problems}"
            return rows
        point, repeated = outcome.point, repeats_a_clean_up(make_world.backend, outcome.point, previous)
        previous = point
        if repeated:
            continue
        conts = scenario.continuations if FULL else (scenario.continuations[n % len(scenario.continuations)],)
        crashed = make_world.save(world) if len(conts) > 1 else ""
        for i, how in enumerate(conts):
            if i:
                make_world.restore(world, crashed)
            try:
                scenario.continue_after_crash(world, how)
                drain(world)
                problems = invariants.check_world(world, drained=True)
            except Exception as exc:  # reported with the crash point that led to it
                problems = [f"{type(exc).__name__}: {exc}"]
            row = {
                "backend": make_world.backend,
                "scenario": scenario.name,
                "n": n,
                "point": point,
                "continuation": how,
                "problems": problems,
            }
            report.record("crash-point", **row)
            rows.append(row)
            assert not problems, f"{scenario.name}: SIGKILL at mutation {n} ({point}), then {how}: {problems}"


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_sigkill_at_every_mutation_then_normal_path_keeps_exactly_once(
    make_world: WorldFactory, scenario: Scenario
) -> None:
    rows = crash_every_mutation(make_world, scenario)
    assert rows, f"{scenario.name}: no crash point was reached"
