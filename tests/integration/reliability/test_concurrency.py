"""Real processes racing on one epoch: zombie vs retry, commit vs abort, recovery vs recovery.

Racing children are lined up with SIGSTOP at the same protocol step (just before the
exclusive create that decides the race) and released together, so every round is a
genuine race of two processes on the store -- local disk (``link(2)``) or S3 on moto
(conditional PUT, ``If-None-Match: *``). Free-running rounds (no lining up) follow.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.integration.reliability import crashdriver, invariants, synthetic
from tests.integration.reliability.conftest import FULL, SETTINGS, BuiltWorlds, WorldFactory
from tests.integration.reliability.scenarios import _committing_mess, _history, _prepared_mess, drain

pytestmark = pytest.mark.crash


def in_s3_slice(test: str, params: dict[str, object]) -> bool:
    """CI on S3: the lined-up races (the conditional PUT decides), one recovery race."""
    return params.get("lined_up", True) is True and params.get("mess", _committing_mess) is _committing_mess


#: Just before the prepared record is created (local: the link; S3: the conditional PUT).
AT_PREPARED = r"^create \S+/prepared-ingest (link|create)"
AT_DECISION = r"^create \S+/decision (link|create)"
#: A mutation with no temp file of its own in flight (a rename, a delete, an S3 request):
#: a process frozen there leaves nothing that ages into the other's temp-file GC.
AT_NO_TEMP_IN_FLIGHT = r" (rename|unlink|rmdir|remove|delete|delete-object|copy|create|write)( |$)"


def rounds(make_world: WorldFactory, local: int) -> int:
    """Race rounds: fewer on S3 in CI (each costs ~20 requests per process on moto)."""
    return local if make_world.backend == "file" or FULL else 2


def assert_clean_after_recovery(world: synthetic.World) -> None:
    synthetic.recover(world, past_timeout=True)
    drain(world)
    problems = invariants.check_world(world, drained=True)
    assert not problems, problems


@pytest.mark.parametrize("lined_up", [True, False], ids=["lined-up", "free-running"])
def test_zombie_and_retry_preparing_at_once_one_wins_the_other_is_fenced(
    make_world: WorldFactory, built_worlds: BuiltWorlds, lined_up: bool
) -> None:
    world = built_worlds.get(make_world, "history", _history)
    for round_ in range(rounds(make_world, 3)):
        run_id = f"race-{round_}"
        world.add_input(1)
        outcomes = crashdriver.race(
            world,
            [
                ("stage", {"run_id": run_id, "attempt": 1}),
                ("stage", {"run_id": run_id, "attempt": 2}),
            ],
            AT_PREPARED if lined_up else None,
        )
        for o in outcomes:
            assert o.ok, o.error
        record = world.pipeline().txlog.read_prepared(outcomes[0].result["epoch"], synthetic.PARTICIPANT)
        assert record is not None
        won = [o for o in outcomes if not o.result["reused"]]
        lost = [o for o in outcomes if o.result["reused"]]
        assert len(won) == 1 and len(lost) == 1, [o.result for o in outcomes]
        assert won[0].result["attempt"] == record.attempt
        # The loser reports the winner's attempt, never its own output.
        assert lost[0].result["attempt"] == record.attempt
        synthetic.decide_and_follow(world, run_id)
        problems = invariants.check_world(world, clean=False)
        assert not problems, problems
    assert_clean_after_recovery(world)


def test_zombie_frozen_mid_staging_wakes_after_its_retry_committed_and_publishes_nothing(
    make_world: WorldFactory, built_worlds: BuiltWorlds,
) -> None:
    world = built_worlds.get(make_world, "history", _history)
    zombie = crashdriver.start_step(
        world,
        "stage",
        {"run_id": "run-3", "attempt": 1},
        pause_on=r"^write \S+/_staging/epoch=\d+/attempt=1/a/part-1.txt",
    )
    crashdriver.wait_stopped(zombie[0])
    # Airflow declared the task a zombie and retried it: the retry runs the whole DAG run.
    assert synthetic.stage(world, "run-3", 2)["attempt"] == 2
    assert synthetic.decide_and_follow(world, "run-3")["decision"] == "commit"
    before = invariants.published(world)
    crashdriver.resume(zombie[0])
    outcome = crashdriver.finish("stage", *zombie)
    # The zombie either finds the winner (reused) or fails: its staging was removed under it.
    assert (
        outcome.ok
        and outcome.result == {"epoch": 3, "attempt": 2, "reused": True, "fenced": 1}
        or outcome.error_type in ("FencedAttemptError", "StorageError")
    ), (outcome.result, outcome.error)
    assert invariants.published(world) == before
    assert_clean_after_recovery(world)


@pytest.mark.parametrize("lined_up", [True, False], ids=["lined-up", "free-running"])
def test_commit_and_abort_racing_on_one_epoch_exactly_one_decision_takes_effect(
    make_world: WorldFactory, built_worlds: BuiltWorlds, lined_up: bool
) -> None:
    world = built_worlds.get(make_world, "history", _history)
    decisions = []
    for round_ in range(rounds(make_world, 4)):
        run_id = f"race-{round_}"
        world.add_input(1)
        synthetic.stage(world, run_id, 1)
        outcomes = crashdriver.race(
            world,
            [("decide_and_follow", {"run_id": run_id}), ("abort", {"run_id": run_id})],
            AT_DECISION if lined_up else None,
        )
        epoch = world.pipeline().epoch_for_run(run_id)
        assert epoch is not None
        decision = world.pipeline().txlog.read_decision(epoch)
        assert decision is not None
        decisions.append(decision.decision.value)
        for o in outcomes:
            assert o.ok or o.error_type == "DecisionConflictError", o.error
        state = world.pipeline().state(epoch).value
        # Whichever decision won was carried out to the end by one of the two tasks.
        assert state == ("COMMITTED" if decision.decision.value == "commit" else "ABORTED"), state
        problems = invariants.check_world(world, clean=False)
        assert not problems, problems
    assert_clean_after_recovery(world)


@pytest.mark.parametrize("mess", [_committing_mess, _prepared_mess], ids=["committing", "prepared-past-timeout"])
def test_two_recovery_runs_at_once_reach_the_same_end_state_as_one(make_world: WorldFactory, mess: object) -> None:
    # Real clock, short timeout: each recovery must see the other's in-flight temp files as
    # young (as in production), not as debris, so time is not shifted here.
    world = make_world(settings={**SETTINGS, "prepared_timeout_s": 1.0})
    mess(world)  # type: ignore[operator]
    time.sleep(1.1)
    saved = make_world.save(world)
    synthetic.recover(world, past_timeout=False)
    alone = invariants.end_state(world)
    for lined_up in (True, False):
        make_world.restore(world, saved)
        outcomes = crashdriver.race(
            world,
            [("recover", {"past_timeout": False}), ("recover", {"past_timeout": False})],
            AT_NO_TEMP_IN_FLIGHT if lined_up else None,
        )
        for o in outcomes:
            assert o.ok, o.error
            failed = [a for a in o.result["actions"] if a["error"]]
            assert not failed, failed
        assert invariants.end_state(world) == alone
    problems = invariants.check_world(world)
    assert not problems, problems


def test_recovery_keeps_the_staging_of_an_epoch_that_began_after_it_listed_the_log(
    make_world: WorldFactory, built_worlds: BuiltWorlds,
) -> None:
    """The recovery DAG runs while the pipeline's next DAG run stages its epoch.

    The interleaving is made deterministic: the new run begins and stages its epoch right
    after recovery has listed the epochs of the log (as another process could at any time).
    """
    world = built_worlds.get(make_world, "history", _history)
    p = world.pipeline()
    listed = p.txlog.open_epochs

    def epochs_then_a_new_run_stages_and_decides(*args: Any, **kwargs: Any) -> Any:
        out = listed(*args, **kwargs)
        synthetic.stage(world, "run-3", 1)
        assert synthetic.decide(world, "run-3")["decision"] == "commit"
        return out

    p.txlog.open_epochs = epochs_then_a_new_run_stages_and_decides  # type: ignore[method-assign]
    report = p.recover(dry_run=False, now=time.time() + 10 * p.config.prepared_timeout_s)
    assert not [a for a in report.actions if a.action == "drop-staging"], report.to_dict()
    # The decision is commit: had its staging gone, the commit could never publish it.
    assert synthetic.commit(world, "run-3")["rows"] > 0
    assert_clean_after_recovery(world)
