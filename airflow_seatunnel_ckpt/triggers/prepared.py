"""Trigger that waits, in the triggerer, until an epoch is prepared and verifies."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any

from airflow.triggers.base import TriggerEvent

from airflow_seatunnel_ckpt.hooks.checkpoint_store import PreparedCheck, check_prepared
from airflow_seatunnel_ckpt.triggers.store_errors import StoreErrorBudget, StoreTrigger

if TYPE_CHECKING:
    from airflow_seatunnel_ckpt.core import Pipeline


class EpochPreparedTrigger(StoreTrigger):
    """Poll the checkpoint store until the run's epoch is prepared (or can never be).

    Fires exactly one event, a :class:`PreparedCheck` as a dict. The deadline is an absolute
    wall-clock time so it survives the trigger moving to another triggerer, and is enforced
    here too (Airflow's in-process ``dag.test`` does not apply the deferral timeout).
    """

    def __init__(self, *, run_id: str, participants: Sequence[str] | None = None, deadline: float | None = None,
                 **store: Any) -> None:
        super().__init__(**store)
        self.run_id = run_id
        self.participants = list(participants) if participants else None
        self.deadline = deadline

    def arguments(self) -> dict[str, Any]:
        """The run, its participants and the deadline."""
        return {"run_id": self.run_id, "participants": self.participants, "deadline": self.deadline}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Yield one event once waiting can no longer change the outcome (see :class:`StoreErrorBudget`)."""
        budget = StoreErrorBudget(self.store_error_timeout)
        pipeline: Pipeline | None = None
        while True:
            check: PreparedCheck | None = None
            try:
                if pipeline is None:
                    pipeline = await self.open_pipeline()
                check = await asyncio.to_thread(check_prepared, pipeline, self.run_id, self.participants)
            except Exception as exc:  # the task, not the triggerer, must report a lasting failure
                if not budget.tolerate(exc):
                    error = PreparedCheck(PreparedCheck.Outcome.ERROR,
                                          f"{type(exc).__name__}: {exc} ({budget.describe()})")
                    yield TriggerEvent(error.to_dict())
                    return
                self.log.warning("pipeline %s run %s: reading the store failed (%s: %s); polling again, %s",
                                 self.pipeline, self.run_id, type(exc).__name__, exc, budget.describe())
            else:
                budget.succeeded()
                if check.done:
                    yield TriggerEvent(check.to_dict())
                    return
            if self.deadline is not None and time.time() >= self.deadline:
                if check is None:
                    timeout = PreparedCheck(PreparedCheck.Outcome.TIMEOUT,
                                            f"timed out: the store could not be read ({budget.describe()})")
                else:
                    timeout = PreparedCheck(PreparedCheck.Outcome.TIMEOUT, f"timed out: {check.message}",
                                            check.epoch, check.state, check.missing, check.participants)
                yield TriggerEvent(timeout.to_dict())
                return
            if check is not None:
                self.log.info("pipeline %s run %s: %s", self.pipeline, self.run_id, check.message)
            delay = self.poll_interval
            if self.deadline is not None:
                delay = max(0.0, min(delay, self.deadline - time.time()))
            await asyncio.sleep(delay)
