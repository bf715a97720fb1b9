"""Trigger that watches a submitted stage, in the triggerer, until it is prepared or over."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import TriggerEvent

from airflow_seatunnel_ckpt.core.protocol.lease import SubmissionCheck, SubmissionOutcome
from airflow_seatunnel_ckpt.hooks.stage_submit import StageSubmitHook
from airflow_seatunnel_ckpt.triggers.store_errors import StoreErrorBudget, StoreTrigger


class StageSubmissionTrigger(StoreTrigger):
    """Poll the store until the submitted attempt is prepared, failed, lost or fenced.

    Fires one event, a :class:`~airflow_seatunnel_ckpt.core.protocol.lease.SubmissionCheck`
    as a dict. Everything it needs is in the store, so it works from any triggerer; the
    launch log's new lines go to the task's log when the log is on this host.
    """

    def __init__(self, *, epoch: int, participant: str, attempt: int, log: str = "", log_host: str = "",
                 **store: Any) -> None:
        super().__init__(**store)
        self.epoch = int(epoch)
        self.participant = participant
        self.attempt = int(attempt)
        self.log_file = log
        self.log_host = log_host

    def arguments(self) -> dict[str, Any]:
        """The watched attempt and where its launch log is."""
        return {"epoch": self.epoch, "participant": self.participant, "attempt": self.attempt,
                "log": self.log_file, "log_host": self.log_host}

    async def _submit_hook(self) -> StageSubmitHook:
        """The watched participant's :class:`StageSubmitHook`, on the store the connection names."""
        return StageSubmitHook(await self.open_pipeline(), self.participant)

    async def on_kill(self) -> None:
        """The deferred task was marked or cleared: fence the attempt, so its launcher stops it (not called
        when the triggerer restarts or the trigger moves)."""
        submit_hook = await self._submit_hook()
        cancelled = await asyncio.to_thread(
            submit_hook.cancel, self.epoch, self.attempt, by=f"triggerer on {socket.gethostname()}",
            reason="the deferred stage task was acted on in Airflow (marked or cleared)")
        if cancelled:
            self.log.warning("pipeline %s epoch %s: asked %s attempt %s to stop", self.pipeline, self.epoch,
                             self.participant, self.attempt)
        else:
            self.log.warning("pipeline %s epoch %s: %s attempt %s was already preparing; its prepare stands",
                             self.pipeline, self.epoch, self.participant, self.attempt)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Yield one event once the submitted attempt is done (see :class:`StoreErrorBudget`)."""
        from airflow_seatunnel_ckpt.spark.launch import LogFollower

        follower = (LogFollower(self.log_file)
                    if self.log_file and self.log_host == socket.gethostname() else None)
        budget = StoreErrorBudget(self.store_error_timeout)
        submit_hook: StageSubmitHook | None = None
        last = ""
        while True:
            try:
                if submit_hook is None:
                    submit_hook = await self._submit_hook()
                check = await asyncio.to_thread(submit_hook.check, self.epoch, self.attempt)
            except Exception as exc:  # the task, not the triggerer, must report a lasting failure
                if budget.tolerate(exc):
                    self.log.warning("pipeline %s: watching %s attempt %s: reading the store failed (%s: %s); "
                                     "polling again, %s", self.pipeline, self.participant, self.attempt,
                                     type(exc).__name__, exc, budget.describe())
                    await asyncio.sleep(self.poll_interval)
                    continue
                error = SubmissionCheck(SubmissionOutcome.LOST, f"watching the submission failed: "
                                        f"{type(exc).__name__}: {exc} ({budget.describe()})", self.epoch,
                                        self.participant, self.attempt)
                yield TriggerEvent({**error.to_dict(), "error": True})
                return
            budget.succeeded()
            if follower is not None:
                for line in await asyncio.to_thread(follower.new_lines):
                    self.log.info("%s", line)
            if check.outcome.done:
                yield TriggerEvent(check.to_dict())
                return
            if check.message != last:
                self.log.info("pipeline %s: %s", self.pipeline, check.message)
                last = check.message
            await asyncio.sleep(self.poll_interval)
