"""The stage's process: run in-process (local Spark or Spark Connect), or ``spark-submit`` detached,
reconnect, cancel (fence) and wait.

:class:`StageSubmitHook` holds every process decision of a stage, as ``SparkSubmitHook``
does for the Spark provider's operator; the stage operator and the submission trigger call
it. The records and their judgement: :mod:`airflow_seatunnel_ckpt.core.protocol.lease`.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseHook

from airflow_seatunnel_ckpt.core.protocol.lease import (
    DeferralRecord,
    EpochDir,
    SubmissionCheck,
    SubmissionOutcome,
    SubmissionRecord,
    earlier_attempt,
    judge_submission,
    read_deferral,
    read_lease,
    read_submission,
    record_deferral,
    request_cancel,
    submitted_attempts,
)
from airflow_seatunnel_ckpt.hooks.stage_runtime import ConnectAttempt
from airflow_seatunnel_ckpt.spark.spec import UNSCHEDULED_ATTEMPT

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from airflow_seatunnel_ckpt.core import Pipeline
    from airflow_seatunnel_ckpt.spark.spec import StageResult, StageSpec


def attempt_for_try(try_number: int) -> int:
    """The stage's attempt id for Airflow's ``try_number`` (see :data:`UNSCHEDULED_ATTEMPT`)."""
    if try_number == 0:
        return UNSCHEDULED_ATTEMPT
    return try_number


class StageSubmitHook(BaseHook):
    """Run one participant's stage in this process, or launch it through ``spark-submit``, find it again,
    stop it, wait for it.

    ``conn_id``, ``spark_submit_kwargs``, ``python`` and ``archives`` are those of
    :func:`~.spark_submit.submit_stage`; ``poll_interval``: seconds between looks at a running
    attempt (at most 2 in-process); ``by``: who acts, written in a cancel's fence record.
    """

    def __init__(self, pipeline: Pipeline, participant: str, *, conn_id: str | None = None,
                 spark_submit_kwargs: Mapping[str, Any] | None = None, python: str | None = None,
                 archives: Sequence[str] = (), poll_interval: float = 10.0, by: str = "") -> None:
        super().__init__()
        self.pipeline = pipeline
        self.participant = participant
        self.conn_id = conn_id
        self.spark_submit_kwargs = dict(spark_submit_kwargs or {})
        self.python = python
        self.archives = tuple(archives)
        self.poll_interval = poll_interval
        self.by = by or f"{participant} on {socket.gethostname()}"
        # The attempt this hook submitted or reconnected to, while it waits for it in-process.
        self.submission: SubmissionRecord | None = None
        # Set by on_kill: the in-process stage's error is then the termination's.
        self.terminated = False
        # While run_in_process runs a stage: the local Spark session (or Connect one) is the stage's own.
        self.running_in_process = False
        self.connect: tuple[ConnectAttempt, SparkSession] | None = None

    # -- in-process --------------------------------------------------------------------
    def run_in_process(self, spec: StageSpec, epoch: int,
                       stage_fn: Callable[..., Any] | None = None) -> StageResult:
        """Run ``spec``'s attempt of ``epoch`` in this process, on local Spark or on the attempt's own
        Connect session (``stage_fn``: the function itself).

        Says first what an earlier attempt left (a killed try logs nothing itself). After
        :meth:`on_kill`, the interrupted Spark call's error (a Java stack, py4j's network
        errors) is replaced by one :class:`StageTerminatedError`, without chained tracebacks.
        """
        from airflow_seatunnel_ckpt.spark import run_stage
        from airflow_seatunnel_ckpt.spark.termination import StageTerminatedError

        if not spec.dry_run and (note := earlier_attempt(self.pipeline, epoch, self.participant, spec.attempt)):
            self.log.warning("%s", note)
        self.running_in_process = True
        try:
            if spec.remote is None:
                return run_stage(spec, stage_fn=stage_fn)
            attempt = self.connect_attempt(spec, epoch, spec.attempt)
            if not spec.dry_run:  # (a dry run stops nobody's attempt)
                self.stop_earlier_connect_attempt(spec, epoch)
            with attempt.session(spec) as session:
                self.connect = (attempt, session)
                try:
                    return run_stage(spec.replace(remote=attempt.url), session, stage_fn=stage_fn)
                finally:
                    self.connect = None
        except Exception as exc:
            if not self.terminated:
                raise
            self.log.debug("the interrupted stage raised %s: %s", type(exc).__name__, exc)
            raise StageTerminatedError(
                f"stage {self.participant} of pipeline {self.pipeline.name!r} was terminated (SIGTERM) while Spark "
                f"ran: epoch {epoch}, attempt {spec.attempt} stays unprepared and a retry stages anew "
                "(nothing was published)") from None
        finally:
            self.running_in_process = False

    @staticmethod
    def connect_attempt(spec: StageSpec, epoch: int, attempt: int) -> ConnectAttempt:
        """The Connect session and tag of ``attempt`` of ``spec``'s participant in ``epoch``."""
        return ConnectAttempt.of(spec.remote or "", str(spec.store.get("storage_url") or ""), spec.pipeline, epoch,
                                 spec.participant, attempt)

    def stop_earlier_connect_attempt(self, spec: StageSpec, epoch: int) -> None:
        """Fence the earlier attempt whose lease this participant holds, and interrupt its Connect operations.

        A try killed outright left its operations running on the server with no client to
        stop them; the fence keeps it from ever preparing. Best effort beyond the fence: a
        server that no longer knows the session has nothing of it running.
        """
        lease = read_lease(self.pipeline.storage, epoch, self.participant)
        if lease is None or lease.attempt == spec.attempt:
            return
        if not self.cancel(epoch, lease.attempt, reason=f"attempt {spec.attempt} runs the stage again"):
            return  # it began to prepare first: its prepare stands, and this attempt will find it
        try:
            interrupted = self.connect_attempt(spec, epoch, lease.attempt).interrupt(release=True)
        except Exception as exc:  # the session is gone (released, timed out) or the server restarted
            self.log.warning("epoch %s: attempt %s's Connect operations (tag %s) could not be interrupted, or its "
                             "session released: %s; a session the server no longer knows runs nothing", epoch,
                             lease.attempt, self.connect_attempt(spec, epoch, lease.attempt).tag, exc)
            return
        self.log.warning("epoch %s: fenced %s attempt %s and interrupted its %d Connect operation(s) still running "
                         "on the server", epoch, self.participant, lease.attempt, len(interrupted))

    # -- submit or reconnect -----------------------------------------------------------
    def submit(self, spec: StageSpec, epoch: int, try_number: int) -> SubmissionRecord:
        """Find the attempt of an earlier try still running, or launch ``spec``'s attempt detached.

        An earlier try's attempt that the try deferred on is stopped first; one whose worker
        died while it waited in-process is reconnected to. An attempt is submitted once.
        """
        from airflow_seatunnel_ckpt.hooks.spark_submit import SubmitError, SubmitOptions, start_submission

        record = self.running(epoch)
        if record is not None and self.stop_if_handed_to_triggerer(record, try_number, spec.attempt):
            record = None
        if record is not None:
            self.log.warning("epoch %s: %s attempt %s, submitted by an earlier try from %s (pid %s), is still "
                             "running: reconnecting to it instead of submitting again", epoch, self.participant,
                             record.attempt, record.host, record.launcher_pid)
        else:
            if spec.attempt in submitted_attempts(self.pipeline, epoch, self.participant):
                ended = judge_submission(self.pipeline, epoch, self.participant, spec.attempt)
                raise SubmitError(f"{ended.message}; an attempt is submitted once: clear the task (a new try "
                                  "is a new attempt)")
            if spec.remote is not None:
                # Through Connect the detached driver runs on the attempt's own server session
                # (its URL carries the session id), and a dead earlier attempt's session is released.
                self.stop_earlier_connect_attempt(spec, epoch)
                spec = spec.replace(remote=self.connect_attempt(spec, epoch, spec.attempt).url)
            options = SubmitOptions(conn_id=self.conn_id, hook_kwargs=self.spark_submit_kwargs,
                                    python=self.python, archives=self.archives)
            record = start_submission(spec, epoch, options)
            self.log.info("epoch %s: submitted %s attempt %s (%s, %s); launcher pid %s on %s, log %s", epoch,
                          self.participant, record.attempt, record.runtime, record.target, record.launcher_pid,
                          record.host, record.log)
        self.submission = record
        return record

    def running(self, epoch: int) -> SubmissionRecord | None:
        """The newest submitted attempt of this participant in ``epoch`` that still runs, if any."""
        seen = EpochDir.read(self.pipeline, epoch)  # one listing for every attempt's judgement
        for attempt in reversed(submitted_attempts(self.pipeline, epoch, self.participant, seen.names)):
            if self.check(epoch, attempt, seen).outcome is SubmissionOutcome.RUNNING:
                return read_submission(self.pipeline, epoch, self.participant, attempt)
        return None

    def stop_if_handed_to_triggerer(self, record: SubmissionRecord, try_number: int, attempt: int) -> bool:
        """Stop a running attempt that an earlier try deferred on; True if it was cancelled.

        A try that deferred holds no process, so Airflow ended that deferral (cleared,
        marked, trigger timed out). False also when the attempt began to prepare before the
        cancel: it is then watched to its end like a reconnected one.
        """
        deferral = read_deferral(self.pipeline, record.epoch, self.participant, record.attempt)
        if deferral is None or deferral.try_number == try_number:
            return False
        cancelled = self.cancel(record.epoch, record.attempt, by=f"try {try_number} on {socket.gethostname()}",
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

    # -- wait --------------------------------------------------------------------------
    def check(self, epoch: int, attempt: int, seen: EpochDir | None = None) -> SubmissionCheck:
        """One look at the submitted ``attempt``; ``seen``: the epoch's log directory if already listed."""
        return judge_submission(self.pipeline, epoch, self.participant, attempt, seen=seen)

    def wait(self, record: SubmissionRecord, on_line: Callable[[str], None] | None = None) -> SubmissionCheck:
        """Poll in this process until ``record``'s attempt is done; ``on_line`` gets its launch log's new lines."""
        from airflow_seatunnel_ckpt.hooks.spark_submit import wait_for_submission

        return wait_for_submission(self.pipeline, record, poll_s=min(self.poll_interval, 2.0), on_line=on_line)

    def hand_to_triggerer(self, record: SubmissionRecord, try_number: int) -> None:
        """Record that try ``try_number`` defers on ``record``'s attempt: a later try that finds it running stops it."""
        record_deferral(self.pipeline, DeferralRecord(record.epoch, self.participant, record.attempt, try_number,
                                                      socket.gethostname(), time.time()))
        self.submission = None  # the triggerer watches it now; this process holds nothing

    def finish(self, check: SubmissionCheck) -> None:
        """Take the outcome of a finished attempt: remove its launch log (its last lines are in the exit record)."""
        self.submission = None
        record = read_submission(self.pipeline, check.epoch, self.participant, check.attempt)
        if record is None or record.host != socket.gethostname() or not check.outcome.done:
            return
        with contextlib.suppress(OSError):
            os.remove(record.log)

    def result(self, check: SubmissionCheck, attempt: int, stage: str) -> StageResult | None:
        """The stage result of a finished attempt, or SubmitError naming why it has none; None when it
        was an earlier try's and failed or was lost (try ``attempt`` then submits its own)."""
        from airflow_seatunnel_ckpt.hooks.spark_submit import result_of

        self.finish(check)
        if check.outcome in (SubmissionOutcome.FAILED, SubmissionOutcome.LOST) and check.attempt != attempt:
            self.log.warning("%s; submitting this try's own attempt %s", check.message, attempt)
            return None
        return result_of(self.pipeline, self.participant, check, stage)

    # -- stop --------------------------------------------------------------------------
    def cancel(self, epoch: int, attempt: int, *, by: str = "", reason: str) -> bool:
        """Fence ``attempt`` so it never prepares and its launcher stops; False when it began to prepare first."""
        return request_cancel(self.pipeline, epoch, self.participant, attempt, by=by or self.by, reason=reason)

    def on_kill(self) -> bool:
        """Stop what this process runs for the stage when Airflow terminates the task (SIGTERM); False if nothing.

        A ``spark-submit`` attempt is fenced and its launcher terminated; an in-process stage
        has its Spark jobs cancelled (through Connect: its operations interrupted by tag) and
        fails now with one error, its attempt unprepared. A deferred try holds no process:
        its trigger's ``on_kill`` stops the submission.
        """
        from airflow_seatunnel_ckpt.spark.termination import quiet_py4j, stop_local_spark

        submission = self.submission
        if self.connect is not None:
            return self._interrupt_connect(*self.connect)
        if submission is None or submission.host != socket.gethostname():
            quiet_py4j()
            self.terminated = True
            # Only a stage this hook runs in-process owns the local session; any other (a test's,
            # another task's in the same worker) is not this task's to stop.
            return self.running_in_process and stop_local_spark(lambda: self.log.warning(
                "terminated: cancelling the Spark jobs of stage %s and stopping its session; this attempt stays "
                "unprepared", self.participant))
        from airflow_seatunnel_ckpt.spark.launch import terminate

        self.log.warning("terminated: stopping spark-submit of %s attempt %s (launcher pid %s)",
                         self.participant, submission.attempt, submission.launcher_pid)
        with contextlib.suppress(Exception):  # the launcher is stopped below in any case
            self.cancel(submission.epoch, submission.attempt, reason="the stage task was terminated")
        terminate(submission.launcher_pid)
        return True

    def _interrupt_connect(self, attempt: ConnectAttempt, session: SparkSession) -> bool:
        """Interrupt the attempt's operations on the Connect server, then release its session.

        In a thread: the SIGTERM handler interrupts the main thread inside a gRPC call, whose
        channel it must not wait on.
        """
        import threading

        self.terminated = True
        self.log.warning("terminated: interrupting the Spark Connect operations of stage %s (tag %s) and "
                         "releasing its session; this attempt stays unprepared", self.participant, attempt.tag)

        def stop() -> None:
            try:
                interrupted = attempt.interrupt(session)
                self.log.info("interrupted %d Connect operation(s) of %s", len(interrupted), attempt.tag)
            except Exception as exc:  # the server may be gone: nothing left running there
                self.log.warning("interrupting %s on the Connect server failed: %s", attempt.tag, exc)
            with contextlib.suppress(Exception):  # (released once more, harmlessly, when the stage unwinds)
                session.stop()

        stopper = threading.Thread(target=stop, name="stage-on-kill", daemon=True)
        stopper.start()
        stopper.join(timeout=20)
        return True
