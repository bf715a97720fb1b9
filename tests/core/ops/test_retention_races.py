"""Retention running while epochs commit never deletes what restore needs.

Retention decides what to delete from one read of the log: an epoch that moves from
COMMITTING to COMMITTED while retention runs, or that begins after retention listed the
log, keeps its checkpoint, so the newest committed checkpoint always restores.
"""

from __future__ import annotations

import threading

import pytest

from airflow_seatunnel_ckpt.core import Decision, EpochState
from tests.core.conftest import StoreSpec
from tests.core.epochs import Participant, at_once, prepare_participant, restored_state, run_epoch


@pytest.fixture(autouse=True)
def no_fsync(monkeypatch: pytest.MonkeyPatch) -> None:
    """Durability syncs are irrelevant to what these tests prove and cost most of their time."""
    monkeypatch.setattr("os.fsync", lambda fd: None)


def epoch_of(i: int) -> Participant:
    return Participant(sinks={"orders": [bytes([i])]}, changes={i: i}, sources={"in": {"i": i}})


def test_retention_keeps_an_epoch_that_commits_while_it_reads_the_log(fast_spec: StoreSpec) -> None:
    p = fast_spec.pipeline()
    for i in range(1, 3):
        run_epoch(p, f"run-{i}", epoch_of(i))
    epoch = prepare_participant(p, "run-3", epoch_of(3)).epoch
    p.decide(epoch, Decision.COMMIT, "all prepared", by="test")
    assert p.state(epoch) is EpochState.COMMITTING

    # The exact bad order: retention reads the epoch's state as COMMITTING, then the commit
    # task finishes publishing before retention looks at the epoch again.
    committer = fast_spec.pipeline()
    original_state = p.txlog.state
    seen = {"committing": 0}

    def state_then_commit(e: int, names: list[str] | None = None) -> EpochState:
        state = original_state(e, names)
        if e == epoch and state is EpochState.COMMITTING and not seen["committing"]:
            seen["committing"] += 1
            committer.commit(epoch)
        return state

    p.txlog.state = state_then_commit  # type: ignore[method-assign]
    p.retain(max_retain=1)
    p.txlog.state = original_state  # type: ignore[method-assign]

    assert seen["committing"] == 1, "retention never saw the epoch COMMITTING"
    assert p.state(epoch) is EpochState.COMMITTED
    assert p.checkpoints.verify(epoch) == [], "the new head's checkpoint was deleted"
    point = fast_spec.pipeline().restore_point()
    assert (point.epoch, point.how) == (epoch, "primary")
    assert restored_state(point) == {1: 1, 2: 2, 3: 3}


def test_retention_concurrent_with_commits_never_deletes_what_restore_needs(fast_spec: StoreSpec) -> None:
    run_epoch(fast_spec.pipeline(), "run-1", epoch_of(1))
    epochs = 12
    done = threading.Event()
    failures: list[str] = []

    def commit_epochs() -> None:
        try:
            for i in range(2, epochs + 1):
                p = fast_spec.pipeline()
                run_epoch(p, f"run-{i}", epoch_of(i))
                point = fast_spec.pipeline().restore_point()
                if point.epoch != p.last_committed_epoch() or point.how != "primary":
                    failures.append(f"after epoch {i}: restored {point.epoch} ({point.how})")
        finally:
            done.set()

    def retain_in_a_loop() -> int:
        runs = 0
        while not done.is_set():
            p = fast_spec.pipeline()
            p.retain(max_retain=1)
            runs += 1
            newest = p.last_committed_epoch()
            if newest is not None and p.checkpoints.verify(newest, deep=False):
                failures.append(f"retention run {runs} left checkpoint {newest} damaged")
        return runs

    outcomes = at_once([commit_epochs, retain_in_a_loop])

    assert not [o for o in outcomes if isinstance(o, BaseException)], outcomes
    assert failures == []
    assert isinstance(outcomes[1], int) and outcomes[1] > 1
    p = fast_spec.pipeline()
    point = p.restore_point()
    assert (point.epoch, point.how) == (epochs, "primary")
    assert restored_state(point) == {i: i for i in range(1, epochs + 1)}
    assert len(point.source_entries("in")) == epochs
