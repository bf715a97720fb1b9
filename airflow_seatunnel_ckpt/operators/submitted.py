"""The stage task's ``spark-submit`` path: submit detached, wait or defer, reconnect on retry.

A retry reconnects to the attempt of a try whose worker died while it waited in-process; it
stops the attempt of a try that had deferred on it (that try was ended in Airflow: cleared,
marked, or its trigger timed out) and submits its own.

See :mod:`airflow_seatunnel_ckpt.core.submissions` for the records and the judgement,
and :mod:`airflow_seatunnel_ckpt.spark.launch` for the launcher.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow_seatunnel_ckpt.core.submissions import (
    DeferralRecord,
    SubmissionCheck,
    SubmissionOutcome,
    SubmissionRecord,
    judge_submission,
    read_deferral,
    read_submission,
    record_deferral,
    request_cancel,
    submitted_attempts,
)
from airflow_seatunnel_ckpt.operators.base import BasePipelineOperator

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_seatunnel_ckpt.spark.spec import StageResult, StageSpec


def attempt_for_try(try_number: int) -> int:
    """The stage's attempt id for Airflow's ``try_number`` (see :data:`UNSCHEDULED_ATTEMPT`)."""
    if try_number == 0:
        return UNSCHEDULED_ATTEMPT
    return try_number


#: The attempt id of a run with try number 0, which Airflow gives a task it runs without the
#: scheduler (``airflow tasks test``). It is kept apart from the ids of real tries (1, 2, ...)
#: so that such a run never shares a staging directory or lease with a scheduled try of the
#: same DAG run; which of them prepares first still wins, as for any two attempts.
UNSCHEDULED_ATTEMPT = 1_000_000


class SubmittedStageMixin(BasePipelineOperator):
    """The ``spark-submit`` path of :class:`~airflow_seatunnel_ckpt.operators.stage.SparkStageOperator`.

    The stage is launched detached (:func:`~airflow_seatunnel_ckpt.spark.submit.start_submission`);
    the task then waits in-process or defers to
    :class:`~airflow_seatunnel_ckpt.triggers.submission.StageSubmissionTrigger`. A try that
    finds an earlier try's attempt still running watches that one instead of submitting.
    """

    participant: str
    stage: str
    conn_id: str | None
    spark_submit_kwargs: Mapping[str, Any]
    python: str | None
    archives: Sequence[str]
    poll_interval: float
    _submission: SubmissionRecord | None

    if TYPE_CHECKING:  # the operator's
        def execute(self, context: Context) -> Any: ...

        def _prepared(self, result: StageResult, attempt: int, began_here: bool = False) -> dict[str, Any]: ...

    def _submit(self, context: Context, spec: StageSpec, epoch: int, *, wait: bool,
                began_here: bool = False) -> dict[str, Any]:
        """Launch the stage (or find the attempt of an earlier try still running), then wait or defer."""
        from airflow_seatunnel_ckpt.spark.submit import SubmitError, SubmitOptions, start_submission

        pipeline = self.store_pipeline
        record = self._running_submission(epoch)
        if record is not None and self._stop_if_handed_to_triggerer(record, context["ti"].try_number, spec.attempt):
            record = None
        if record is not None:
            self.log.warning("epoch %s: %s attempt %s, submitted by an earlier try from %s (pid %s), is still "
                             "running: reconnecting to it instead of submitting again", epoch, self.participant,
                             record.attempt, record.host, record.launcher_pid)
        else:
            if spec.attempt in submitted_attempts(pipeline, epoch, self.participant):
                ended = judge_submission(pipeline, epoch, self.participant, spec.attempt)
                raise SubmitError(f"{ended.message}; an attempt is submitted once: clear the task (a new try "
                                  "is a new attempt)")
            options = SubmitOptions(conn_id=self.conn_id, hook_kwargs=self.spark_submit_kwargs,
                                    python=self.python, archives=tuple(self.archives))
            record = start_submission(spec, epoch, options)
            self.log.info("epoch %s: submitted %s attempt %s (%s, deploy mode %s); launcher pid %s on %s, "
                          "log %s", epoch, self.participant, record.attempt, record.master,
                          record.deploy_mode or "client", record.launcher_pid, record.host, record.log)
        self._submission = record
        if wait:
            from airflow_seatunnel_ckpt.spark.submit import wait_for_submission

            check = wait_for_submission(pipeline, record, poll_s=min(self.poll_interval, 2.0),
                                        on_line=self._spark_line)
            return self._finish_submission(context, check, began_here)
        # From here the attempt is the triggerer's to watch: a later try that finds it running
        # stops it (see _stop_if_handed_to_triggerer).
        record_deferral(pipeline, DeferralRecord(epoch, self.participant, record.attempt,
                                                 context["ti"].try_number, socket.gethostname(), time.time()))
        self.defer(trigger=self._trigger_for(record), method_name="execute_complete")
        raise AssertionError("defer() returned")  # pragma: no cover - defer always raises

    def _trigger_for(self, record: SubmissionRecord) -> Any:
        from airflow_seatunnel_ckpt.triggers.submission import StageSubmissionTrigger

        return StageSubmissionTrigger(
            pipeline=self.pipeline, epoch=record.epoch, participant=self.participant, attempt=record.attempt,
            store_conn_id=self.store_conn_id, storage_url=self.storage_url, store_config=self.store_config,
            poll_interval=self.poll_interval, log=record.log, log_host=record.host)

    def _stop_if_handed_to_triggerer(self, record: SubmissionRecord, try_number: int, attempt: int) -> bool:
        """Stop a running attempt that an earlier try deferred on; True if it was cancelled.

        False also when the cancel came after the attempt began to prepare (its fence record
        says so): the attempt is then watched to its end like a reconnected one.

        A try that deferred holds no process, so this try cannot have followed its worker's
        death: Airflow ended that deferral -- the task was cleared (run it again, maybe with
        a fixed stage), marked, or its trigger timed out or failed. The trigger's ``on_kill``
        stops the attempt too, but only when the triggerer had started that trigger and gets
        to it before this try looks; the store's record makes the outcome the same either way.
        A try whose worker died while it waited in-process left no such record: its attempt
        is reconnected to.
        """
        deferral = read_deferral(self.store_pipeline, record.epoch, self.participant, record.attempt)
        if deferral is None or deferral.try_number == try_number:
            return False
        cancelled = request_cancel(self.store_pipeline, record.epoch, self.participant, record.attempt,
                                   by=f"try {try_number} on {socket.gethostname()}",
                                   reason=f"try {deferral.try_number} deferred on it and was ended in Airflow "
                                          "(cleared, marked, or its trigger timed out or failed); this try runs "
                                          "the stage anew")
        if not cancelled:
            # It began to prepare before the cancel: its prepare stands (a clear after the
            # prepare would have found it prepared), so this try takes its outcome.
            self.log.warning("epoch %s: %s attempt %s, which try %s deferred on, was already preparing when this "
                             "try asked it to stop: waiting for it instead of submitting attempt %s", record.epoch,
                             self.participant, record.attempt, deferral.try_number, attempt)
            return False
        self.log.warning("epoch %s: %s attempt %s is still running, but try %s, which deferred on it, was ended "
                         "in Airflow (cleared, marked, or its trigger timed out or failed): asked it to stop; "
                         "submitting attempt %s", record.epoch, self.participant, record.attempt,
                         deferral.try_number, attempt)
        return True

    def _running_submission(self, epoch: int) -> SubmissionRecord | None:
        """The newest submitted attempt of this participant in ``epoch`` that still runs, if any."""
        pipeline = self.store_pipeline
        for attempt in reversed(submitted_attempts(pipeline, epoch, self.participant)):
            check = judge_submission(pipeline, epoch, self.participant, attempt)
            if check.outcome is SubmissionOutcome.RUNNING:
                return read_submission(pipeline, epoch, self.participant, attempt)
        return None

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None) -> dict[str, Any]:
        """Resume once the submission trigger fired."""
        from airflow.sdk.exceptions import AirflowFailException

        from airflow_seatunnel_ckpt.spark.submit import SubmitError

        if not event:
            raise AirflowFailException("the submission trigger fired without an event")
        if event.get("error"):
            raise SubmitError(f"pipeline {self.pipeline}: {event.get('message')}")
        return self._finish_submission(context, SubmissionCheck.from_dict(event))

    def _finish_submission(self, context: Context, check: SubmissionCheck,
                           began_here: bool = False) -> dict[str, Any]:
        """The result of a finished submission; a reconnected attempt that failed is submitted anew."""
        from airflow_seatunnel_ckpt.spark.submit import result_of

        self._submission = None
        self._remove_local_log(check)
        mine = attempt_for_try(context["ti"].try_number)
        if check.outcome in (SubmissionOutcome.FAILED, SubmissionOutcome.LOST) and check.attempt != mine:
            self.log.warning("%s; submitting this try's own attempt %s", check.message, mine)
            return self.execute(context)
        return self._prepared(result_of(self.store_pipeline, self.participant, check, self.stage), mine,
                              began_here)

    def _remove_local_log(self, check: SubmissionCheck) -> None:
        """Remove the attempt's launch log once its outcome is taken (its last lines are in the exit record)."""
        record = read_submission(self.store_pipeline, check.epoch, self.participant, check.attempt)
        if record is None or record.host != socket.gethostname() or not check.outcome.done:
            return
        with contextlib.suppress(OSError):
            os.remove(record.log)

    def _spark_line(self, line: str) -> None:
        """A line of spark-submit's output, into the task log (at INFO: Spark's stderr is not an error)."""
        self.log.info("%s", line)
