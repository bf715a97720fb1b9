"""The triggers poll through a failing store for a bounded time instead of giving up at once.

A trigger that reported its first failed poll failed its task, and the task's next try
then cancelled the healthy attempt the trigger had been watching. The store is a real
local one; the failure is the store's (one listing answered with an error).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from airflow_seatunnel_ckpt.core import CheckpointConfig, CheckpointStore, Pipeline, layout
from airflow_seatunnel_ckpt.core.errors import StorageError
from airflow_seatunnel_ckpt.core.protocol.lease import LeaseKeeper, SubmissionRecord, record_submission
from airflow_seatunnel_ckpt.core.storage import LocalStorage
from tests.core.epochs import Participant, prepare_participant

pytestmark = pytest.mark.airflow


def store_at(tmp_path: Path) -> tuple[str, Pipeline]:
    url = f"file://{tmp_path}/store"
    return url, CheckpointStore(CheckpointConfig.from_mapping({"storage_url": url})).pipeline("orders")


def failing_listings(monkeypatch: pytest.MonkeyPatch, times: int | None) -> list[str]:
    """The store answers the next ``times`` listings of the log (every one: None) with an error."""
    real = LocalStorage.list_dir
    failed: list[str] = []

    def list_dir(self: LocalStorage, path: str) -> list[str]:
        if path.startswith(layout.TXLOG) and (times is None or len(failed) < times):
            failed.append(path)
            raise StorageError(f"listing {path} failed: the store answered 503 Slow Down")
        return real(self, path)

    monkeypatch.setattr(LocalStorage, "list_dir", list_dir)
    return failed


def first_event(trigger: Any, timeout: float = 60) -> dict[str, Any]:
    """Run the trigger as the triggerer would, until its one event."""
    async def first() -> dict[str, Any]:
        async for event in trigger.run():
            return dict(event.payload)
        raise AssertionError("the trigger ended without an event")

    return asyncio.run(asyncio.wait_for(first(), timeout))


def running_submission(p: Pipeline) -> int:
    """A submitted attempt 1 that runs (its lease fresh) and has prepared."""
    epoch = p.begin("run-1").epoch
    record_submission(p, SubmissionRecord(epoch, "ingest", 1, "worker-1", 4242, "", "spark-submit", "local[1]",
                                          False, 0.0))
    assert LeaseKeeper.for_pipeline(p, epoch, "ingest", 1).renew()
    prepare_participant(p, "run-1", Participant(), epoch=epoch)
    return epoch


def test_the_submission_trigger_survives_one_failed_poll_of_the_store(
    airflow_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from airflow_seatunnel_ckpt.triggers.submission import StageSubmissionTrigger

    url, p = store_at(tmp_path)
    epoch = running_submission(p)
    failed = failing_listings(monkeypatch, times=1)
    trigger = StageSubmissionTrigger(pipeline="orders", epoch=epoch, participant="ingest", attempt=1,
                                     storage_url=url, poll_interval=0.05)

    event = first_event(trigger)
    assert len(failed) == 1
    assert (event["outcome"], event.get("error")) == ("prepared", None), event


def test_the_submission_trigger_reports_a_store_that_keeps_failing_after_its_tolerance(
    airflow_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from airflow_seatunnel_ckpt.triggers.submission import StageSubmissionTrigger

    url, p = store_at(tmp_path)
    epoch = running_submission(p)
    failed = failing_listings(monkeypatch, times=None)
    trigger = StageSubmissionTrigger(pipeline="orders", epoch=epoch, participant="ingest", attempt=1,
                                     storage_url=url, poll_interval=0.05, store_error_timeout=0.5)

    event = first_event(trigger)
    assert event["error"] is True and "503 Slow Down" in event["message"], event
    assert "tolerated for 0.5s" in event["message"] and len(failed) > 1


def test_the_prepared_trigger_survives_one_failed_poll_of_the_store(
    airflow_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from airflow_seatunnel_ckpt.triggers.prepared import EpochPreparedTrigger

    url, p = store_at(tmp_path)
    running_submission(p)
    failed = failing_listings(monkeypatch, times=1)
    trigger = EpochPreparedTrigger(pipeline="orders", run_id="run-1", storage_url=url, poll_interval=0.05)

    event = first_event(trigger)
    assert len(failed) == 1
    assert event["outcome"] == "prepared", event
