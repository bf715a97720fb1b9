"""A run's epoch begins once no earlier undecided epoch blocks it (``begin_unblocked``), with no orchestrator.

The earlier epoch is resolved by the same judgement recovery uses: dead, it is aborted and
the run begins; decided commit, it is published and the run begins; alive, the caller is
told to look again, until its wait runs out with the command that aborts the epoch by hand.
"""

from __future__ import annotations

import pytest

from airflow_seatunnel_ckpt.core import BeginRecord, Decision, EpochState
from airflow_seatunnel_ckpt.core.errors import PendingEpochError
from airflow_seatunnel_ckpt.core.protocol.recovery import PendingWait, begin_unblocked
from tests.core.conftest import StoreSpec
from tests.core.epochs import Participant, expected_files, prepare_participant, published, run_epoch


@pytest.fixture(autouse=True)
def no_fsync(monkeypatch: pytest.MonkeyPatch) -> None:
    """Durability syncs are irrelevant to what these tests prove and cost most of their time."""
    monkeypatch.setattr("os.fsync", lambda fd: None)


def test_a_live_earlier_epoch_makes_the_run_wait_and_then_fail_naming_the_abort_command(
        fast_spec: StoreSpec) -> None:
    p = fast_spec.pipeline(lease_timeout_s=600, prepared_timeout_s=600)
    blocking = p.begin("run-1").epoch

    wait = begin_unblocked(p, "run-2", run_finished=lambda run_id, dag_id: False, by="stage of run-2",
                           waited_s=lambda: 30.0)

    assert isinstance(wait, PendingWait)
    assert (wait.epoch, wait.waited_s, wait.limit_s) == (blocking, 30.0, 660.0)
    assert f"abort {p.name} {blocking}" in wait.command and "is ALIVE" in wait.reason
    assert p.state(blocking) is EpochState.OPEN and p.epoch_for_run("run-2") is None
    with pytest.raises(PendingEpochError, match=rf"waited 61s \(pending_wait_timeout=60s\).*abort {p.name} {blocking}"):
        begin_unblocked(p, "run-2", run_finished=lambda run_id, dag_id: False, waited_s=lambda: 61.0,
                        wait_timeout_s=60.0)
    assert p.state(blocking) is EpochState.OPEN and p.epoch_for_run("run-2") is None


def test_an_earlier_epoch_whose_run_finished_is_aborted_and_the_run_begins_and_commits(fast_spec: StoreSpec) -> None:
    p = fast_spec.pipeline(lease_timeout_s=600, prepared_timeout_s=600)
    blocking = prepare_participant(p, "run-1", Participant(sinks={"orders": [b"lost"]})).epoch

    begun = begin_unblocked(p, "run-2", run_finished=lambda run_id, dag_id: run_id == "run-1", by="stage of run-2")

    assert isinstance(begun, BeginRecord) and begun.epoch == blocking + 1
    status = p.status(blocking)
    assert status.state is EpochState.ABORTED and status.decision is not None
    assert status.decision.by == "stage of run-2"
    # The next epoch runs to the end: only its rows are published.
    assert run_epoch(p, "run-2", Participant(sinks={"orders": [b"o1", b"o22"]})) == begun.epoch
    assert published(p, "orders") == {begun.epoch: expected_files([b"o1", b"o22"])}


def test_an_earlier_epoch_decided_commit_is_published_before_the_run_begins(fast_spec: StoreSpec) -> None:
    p = fast_spec.pipeline()
    blocking = prepare_participant(p, "run-1", Participant()).epoch
    p.decide(blocking, Decision.COMMIT, "ok", by="test")

    begun = begin_unblocked(p, "run-2")

    assert isinstance(begun, BeginRecord) and begun.epoch == blocking + 1
    assert p.state(blocking) is EpochState.COMMITTED
    assert published(p, "orders") == {blocking: expected_files([b"o1", b"o22"])}
