"""StageSubmitHook: the stage's process decisions (reconnect, take over from a deferred try, cancel).

The store is a real local one and the records are the ones a launch writes; no
``spark-submit`` runs (tests/operators/test_stage_detached_submit.py launches real ones).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_seatunnel_ckpt.core import CheckpointConfig, CheckpointStore, Pipeline, layout
from airflow_seatunnel_ckpt.core.protocol.lease import (
    ExitRecord,
    LeaseKeeper,
    SubmissionOutcome,
    SubmissionRecord,
    record_exit,
    record_submission,
    stop_reason,
)
from airflow_seatunnel_ckpt.core.storage import LocalStorage
from airflow_seatunnel_ckpt.hooks.stage_submit import StageSubmitHook

pytestmark = pytest.mark.airflow


@pytest.fixture
def pipeline(tmp_path: Path) -> Pipeline:
    url = f"file://{tmp_path}/store"
    return CheckpointStore(CheckpointConfig.from_mapping({"storage_url": url})).pipeline("orders")


def submitted(p: Pipeline, epoch: int, attempt: int, *, exit_code: int | None = None) -> SubmissionRecord:
    record = SubmissionRecord(epoch, "ingest", attempt, "worker-1", 4000 + attempt, "", "spark-submit", "local[1]",
                              False, 0.0)
    record_submission(p, record)
    if exit_code is None:
        assert LeaseKeeper.for_pipeline(p, epoch, "ingest", attempt).renew()
    else:
        record_exit(p, ExitRecord(epoch, "ingest", attempt, exit_code, ["boom"], 0.0))
    return record


def test_a_retry_finds_the_running_attempt_among_ended_ones_with_one_listing_of_the_epoch(
        pipeline: Pipeline, monkeypatch: pytest.MonkeyPatch) -> None:
    epoch = pipeline.begin("run-1").epoch
    submitted(pipeline, epoch, 1, exit_code=1)
    submitted(pipeline, epoch, 2, exit_code=137)
    running = submitted(pipeline, epoch, 3)
    listed: list[str] = []
    list_dir = LocalStorage.list_dir

    def recording(self: LocalStorage, path: str = "") -> list[str]:
        listed.append(path)
        return list_dir(self, path)

    monkeypatch.setattr(LocalStorage, "list_dir", recording)
    hook = StageSubmitHook(pipeline, "ingest")

    assert hook.running(epoch) == running
    assert listed.count(layout.txlog_dir(epoch)) == 1, listed
    assert hook.check(epoch, 2).outcome is SubmissionOutcome.FAILED
    assert "exit code 137" in hook.check(epoch, 2).message


def test_a_later_try_stops_the_attempt_an_ended_deferred_try_handed_to_the_triggerer(pipeline: Pipeline) -> None:
    epoch = pipeline.begin("run-1").epoch
    record = submitted(pipeline, epoch, 1)
    hook = StageSubmitHook(pipeline, "ingest")
    hook.hand_to_triggerer(record, try_number=1)

    assert not hook.stop_if_handed_to_triggerer(record, try_number=1, attempt=1)  # the same try: no takeover
    assert stop_reason(pipeline, epoch, "ingest", 1) == ""
    assert hook.stop_if_handed_to_triggerer(record, try_number=2, attempt=2)
    assert stop_reason(pipeline, epoch, "ingest", 1).startswith("cancelled by try 2")
    assert "try 1 deferred on it" in stop_reason(pipeline, epoch, "ingest", 1)


def test_a_cancel_after_the_attempt_began_to_prepare_is_void(pipeline: Pipeline) -> None:
    from airflow_seatunnel_ckpt.core.protocol.txlog import FenceRecord

    epoch = pipeline.begin("run-1").epoch
    submitted(pipeline, epoch, 1)
    pipeline.txlog.settle_fence(FenceRecord(epoch, "ingest", 1, False, "attempt 1", "preparing", 0.0))
    hook = StageSubmitHook(pipeline, "ingest", by="stage orders/run-1/ingest")

    assert not hook.cancel(epoch, 1, reason="the stage task was terminated")
    assert stop_reason(pipeline, epoch, "ingest", 1) == ""
    assert hook.on_kill() is False  # this hook submitted nothing: nothing of this process to stop
