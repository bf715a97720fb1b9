"""Submitted attempts: a cancel fences the attempt's prepare, and the one judgement of how a submission stands.

The records are the ones the stage task, the launcher and the driver write
(:mod:`airflow_seatunnel_ckpt.core.protocol.lease`), written here through the same functions
on a real local store; the interleavings are made deterministic by running the other
side's step at a chosen point of a store write.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from airflow_seatunnel_ckpt.core import Decision, EpochState, Pipeline, layout
from airflow_seatunnel_ckpt.core.errors import FencedAttemptError
from airflow_seatunnel_ckpt.core.protocol.lease import (
    ExitRecord,
    LeaseKeeper,
    SubmissionOutcome,
    SubmissionRecord,
    judge_submission,
    record_exit,
    record_submission,
    request_cancel,
    stop_reason,
    store_now,
)
from airflow_seatunnel_ckpt.core.storage import Storage
from tests.core.conftest import StoreSpec
from tests.core.epochs import Participant, expected_files, prepare_participant, published

OLD = Participant(sinks={"orders": [b"before-the-clear"]})
NEW = Participant(sinks={"orders": [b"after-the-clear"]})


@pytest.fixture(autouse=True)
def no_fsync(monkeypatch: pytest.MonkeyPatch) -> None:
    """Durability syncs are irrelevant to what these tests prove and cost most of their time."""
    monkeypatch.setattr("os.fsync", lambda fd: None)


def commit(p: Pipeline, epoch: int) -> None:
    assert p.decide(epoch, Decision.COMMIT, "all prepared", by="test").decision is Decision.COMMIT
    p.commit(epoch)


def before_creating(monkeypatch: pytest.MonkeyPatch, p: Pipeline, name: str, step: Callable[[], Any]) -> list[Any]:
    """Run ``step`` once, right before the store creates the record ``name`` (the other side's move)."""
    real = type(p.storage).create_exclusive
    results: list[Any] = []

    def create(self: Storage, path: str, data: Any) -> Any:
        if path.endswith(f"/{name}") and not results:
            results.append(step())
        return real(self, path, data)

    monkeypatch.setattr(type(p.storage), "create_exclusive", create)
    return results


# -- case 7: cancel is a fence ------------------------------------------------------------

def test_a_cancelled_attempt_that_prepares_after_the_cancel_is_refused_and_the_replacement_commits(
    fast_spec: StoreSpec,
) -> None:
    p = fast_spec.pipeline()
    epoch = p.begin("run-1").epoch
    # Try 2 found attempt 1 (which try 1 deferred on) still running: it cancels it and submits attempt 2.
    assert request_cancel(p, epoch, "ingest", 1, by="try 2", reason="try 1 was cleared") is True
    # Attempt 1's driver reaches its prepare before the launcher stops it.
    with pytest.raises(FencedAttemptError, match="attempt 1 of 'ingest' was cancelled by try 2"):
        prepare_participant(p, "run-1", OLD, attempt=1, epoch=epoch)
    assert p.state(epoch) is EpochState.OPEN

    prepare_participant(p, "run-1", NEW, attempt=2, epoch=epoch)
    commit(p, epoch)
    assert published(p, "orders") == {epoch: expected_files([b"after-the-clear"])}
    assert stop_reason(p, epoch, "ingest", 1) == ""  # prepared (by attempt 2): nothing left to stop


def test_a_cancel_that_lands_while_the_attempt_prepares_loses_and_the_canceller_takes_its_outcome(
    fast_spec: StoreSpec, monkeypatch: pytest.MonkeyPatch,
) -> None:
    p = fast_spec.pipeline()
    epoch = p.begin("run-1").epoch
    # The race: attempt 1 has passed every check of its prepare; the cancel is written
    # after that and before its prepared record.
    cancels = before_creating(monkeypatch, p, "prepared-ingest", lambda: (
        request_cancel(p, epoch, "ingest", 1, by="try 2", reason="try 1 was cleared"),
        stop_reason(p, epoch, "ingest", 1)))
    prepare_participant(p, "run-1", OLD, attempt=1, epoch=epoch)

    # The canceller is told the cancel lost, so it does not submit a replacement; the
    # launcher is not told to stop an attempt that is preparing.
    assert cancels == [(False, "")]
    fence = p.txlog.read_fence(epoch, "ingest", 1)
    assert fence is not None and not fence.cancelled
    with pytest.raises(FencedAttemptError):
        prepare_participant(p, "run-1", NEW, attempt=2, epoch=epoch)
    commit(p, epoch)
    assert published(p, "orders") == {epoch: expected_files([b"before-the-clear"])}


def test_a_cancel_and_a_prepare_of_the_same_attempt_settle_one_fence(fast_spec: StoreSpec) -> None:
    p = fast_spec.pipeline()
    epoch = p.begin("run-1").epoch
    prepare_participant(p, "run-1", OLD, attempt=1, epoch=epoch)
    assert request_cancel(p, epoch, "ingest", 1, by="triggerer", reason="marked failed") is False
    prepare_participant(p, "run-1", OLD, attempt=1, epoch=epoch)  # a repeated prepare stays idempotent
    assert request_cancel(p, epoch, "ingest", 3, by="triggerer", reason="marked failed") is True
    assert request_cancel(p, epoch, "ingest", 3, by="someone else", reason="again") is True
    fence = p.txlog.read_fence(epoch, "ingest", 3)
    assert fence is not None and (fence.cancelled, fence.by) == (True, "triggerer")
    assert stop_reason(p, epoch, "ingest", 3) == ""  # the participant is prepared: nothing to stop


def test_the_launcher_is_told_to_stop_a_cancelled_attempt(fast_spec: StoreSpec) -> None:
    p = fast_spec.pipeline()
    epoch = p.begin("run-1").epoch
    assert stop_reason(p, epoch, "ingest", 1) == ""
    request_cancel(p, epoch, "ingest", 1, by="try 2", reason="try 1 was cleared")
    assert stop_reason(p, epoch, "ingest", 1) == "cancelled by try 2: try 1 was cleared"


# -- case 8: the lease's own timeout ------------------------------------------------------

def submitted(p: Pipeline, epoch: int, *, exits_before_stage: bool = False) -> None:
    record_submission(p, SubmissionRecord(epoch, "ingest", 1, "worker-1", 4242, "/tmp/launch.log", "spark-submit",
                                          "local[1] (client mode)", exits_before_stage, time.time()))


def test_a_submission_whose_lease_renews_for_a_longer_timeout_runs_past_the_observers_timeout(
    fast_spec: StoreSpec,
) -> None:
    p = fast_spec.pipeline()  # lease_timeout_s=180, the default of the CLI and the recovery DAG
    epoch = p.begin("run-1").epoch
    submitted(p, epoch)
    assert LeaseKeeper(p.storage, epoch, "ingest", 1, renew_s=120, timeout_s=600).renew()
    renewed = p.storage.modified(layout.lease_path(epoch, "ingest"))

    check = judge_submission(p, epoch, "ingest", 1, now=renewed + 200)
    assert check.outcome is SubmissionOutcome.RUNNING, check.message
    late = judge_submission(p, epoch, "ingest", 1, now=renewed + 601)
    assert late.outcome is SubmissionOutcome.LOST and "timeout_s=600" in late.message


# -- a launcher that exits once the stage is handed over (spark-submit, standalone cluster mode) --

def test_a_clean_exit_of_a_launcher_that_hands_the_stage_over_is_judged_by_the_stages_lease(
    fast_spec: StoreSpec,
) -> None:
    p = fast_spec.pipeline()
    epoch = p.begin("run-1").epoch
    # What that case writes: the submission (standalone master, cluster mode), the
    # launcher's exit record with code 0 right after the master accepted the driver, and
    # the lease the driver renews while the stage runs.
    submitted(p, epoch, exits_before_stage=True)
    record_exit(p, ExitRecord(epoch, "ingest", 1, 0, ["INFO ClientEndpoint: Driver successfully submitted"],
                              time.time()))
    assert LeaseKeeper.for_pipeline(p, epoch, "ingest", 1).renew()
    now = store_now(p.storage)

    running = judge_submission(p, epoch, "ingest", 1, now=now)
    assert running.outcome is SubmissionOutcome.RUNNING, running.message
    assert "spark-submit returned once the stage was handed over" in running.message
    # The driver prepares: the stage is done.
    prepare_participant(p, "run-1", NEW, attempt=1, epoch=epoch)
    assert judge_submission(p, epoch, "ingest", 1, now=now).outcome is SubmissionOutcome.PREPARED


def test_a_driver_that_returned_at_submission_and_stopped_renewing_failed(fast_spec: StoreSpec) -> None:
    p = fast_spec.pipeline()
    epoch = p.begin("run-1").epoch
    submitted(p, epoch, exits_before_stage=True)
    record_exit(p, ExitRecord(epoch, "ingest", 1, 0, ["Driver successfully submitted"], time.time()))
    assert LeaseKeeper.for_pipeline(p, epoch, "ingest", 1).renew()
    later = store_now(p.storage) + p.config.lease_timeout_s + 1

    failed = judge_submission(p, epoch, "ingest", 1, now=later)
    assert failed.outcome is SubmissionOutcome.FAILED and failed.returncode == 0
    assert "returned once the stage was handed over" in failed.message
    assert failed.tail == ["Driver successfully submitted"]


def test_a_clean_exit_in_client_mode_still_means_finished_without_preparing(fast_spec: StoreSpec) -> None:
    p = fast_spec.pipeline()
    epoch = p.begin("run-1").epoch
    submitted(p, epoch)
    record_exit(p, ExitRecord(epoch, "ingest", 1, 0, [], time.time()))
    assert LeaseKeeper.for_pipeline(p, epoch, "ingest", 1).renew()

    check = judge_submission(p, epoch, "ingest", 1)
    assert check.outcome is SubmissionOutcome.FAILED and "finished without preparing" in check.message
