"""Submitted stages: the write-once ``submission-``, ``exit-`` and ``deferred-<participant>-a<attempt>``
records of an attempt launched detached, its cancel (the ``fence-`` record), and
:func:`judge_submission`, the one verdict on whether it still runs (docs/ARCHITECTURE.md, decision 27)."""

from __future__ import annotations

import contextlib
import enum
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Literal

import pydantic

from airflow_seatunnel_ckpt.core import codec, layout
from airflow_seatunnel_ckpt.core.errors import AlreadyExistsError
from airflow_seatunnel_ckpt.core.layout import validate_epoch, validate_name
from airflow_seatunnel_ckpt.core.models import RECORD, Record, tag
from airflow_seatunnel_ckpt.core.protocol.lease import (
    EpochDir,
    describe_timeout,
    held_lease,
    store_now,
)
from airflow_seatunnel_ckpt.core.protocol.txlog import PREPARED_PREFIX, FenceRecord, fence_name

if TYPE_CHECKING:
    from airflow_seatunnel_ckpt.core import Pipeline

SUBMISSION_PREFIX = "submission-"
EXIT_PREFIX = "exit-"
DEFERRED_PREFIX = "deferred-"
#: Lines of the launched process's output kept in an exit record.
TAIL_LINES = 40


def _path(prefix: str, epoch: int, participant: str, attempt: int) -> str:
    """Where the record ``<prefix><participant>-a<attempt>`` of ``epoch`` is."""
    return layout.record_path(validate_epoch(epoch), layout.attempt_record_name(prefix, participant, attempt))


def _write(pipeline: Pipeline, prefix: str, record: Any, *, keep_first: bool = True) -> None:
    """Create the attempt's record named by ``prefix``; with ``keep_first`` a second one is dropped."""
    with contextlib.suppress(*((AlreadyExistsError,) if keep_first else ())):
        pipeline.storage.create_exclusive(_path(prefix, record.epoch, record.participant, record.attempt),
                                          codec.encode_json(record.to_dict()))


@pydantic.dataclasses.dataclass(config=RECORD)
class SubmissionRecord(Record):
    """An attempt of a participant launched detached (by a launcher process the task started)."""

    epoch: int
    participant: str
    attempt: int
    host: str
    launcher_pid: int
    log: str
    #: For people, never interpreted: the runtime (``spark-submit``, ``connect``) and where it runs.
    runtime: str = ""
    target: str = ""
    #: The launcher may exit cleanly while the stage still runs elsewhere (the runtime
    #: hands it over, e.g. a cluster that only accepted it): its clean exit record then
    #: ends nothing, and the stage is judged by its lease.
    exits_before_stage: bool = False
    submitted_at: float = 0.0
    type: Literal["submission"] = tag("submission")


@pydantic.dataclasses.dataclass(config=RECORD)
class ExitRecord(Record):
    """How the launched process of an attempt ended."""

    epoch: int
    participant: str
    attempt: int
    returncode: int
    tail: list[str] = pydantic.Field(default_factory=list)
    at: float = 0.0
    #: Why the launcher stopped what it ran itself ("" when it ended on its own).
    stopped: str = ""
    type: Literal["submission-exit"] = tag("submission-exit")


def record_submission(pipeline: Pipeline, record: SubmissionRecord) -> None:
    """Write the attempt's submission record (write-once: an attempt is launched once)."""
    _write(pipeline, SUBMISSION_PREFIX, record, keep_first=False)


def record_exit(pipeline: Pipeline, record: ExitRecord) -> None:
    """Write the attempt's exit record; a second one (a launcher run twice) keeps the first."""
    _write(pipeline, EXIT_PREFIX, record)



def request_cancel(pipeline: Pipeline, epoch: int, participant: str, attempt: int, *, by: str,
                   reason: str) -> bool:
    """Cancel ``attempt``: it never prepares, and its launcher stops it (it looks at every lease renewal).

    False when the attempt began to prepare first: its prepare stands, and the caller takes its outcome.
    """
    fence = pipeline.txlog.settle_fence(FenceRecord(epoch, participant, attempt, True, by, reason, time.time()))
    return fence.cancelled


@pydantic.dataclasses.dataclass(config=RECORD)
class DeferralRecord(Record):
    """A try of the stage task handed the watch of an attempt to the triggerer."""

    epoch: int
    participant: str
    attempt: int
    try_number: int
    host: str
    at: float = 0.0
    type: Literal["submission-deferral"] = tag("submission-deferral")


def record_deferral(pipeline: Pipeline, record: DeferralRecord) -> None:
    """Write that a try deferred on the attempt; the first deferral is kept (a later try that finds
    the attempt running stops it, so none defers on it again)."""
    _write(pipeline, DEFERRED_PREFIX, record)


def read_deferral(pipeline: Pipeline, epoch: int, participant: str, attempt: int) -> DeferralRecord | None:
    """The try that handed ``attempt`` to the triggerer, if one did."""
    return pipeline.txlog.read_record(_path(DEFERRED_PREFIX, epoch, participant, attempt), DeferralRecord)


def stop_reason(pipeline: Pipeline, epoch: int, participant: str, attempt: int) -> str:
    """Why the launcher of ``attempt`` should stop its application now: cancelled, or the epoch
    decided before the participant prepared ("" = let it run)."""
    seen = EpochDir.read(pipeline, epoch)
    names = seen.names
    if PREPARED_PREFIX + participant in names:
        return ""
    if fence_name(participant, attempt) in names:
        fence = pipeline.txlog.read_fence(epoch, participant, attempt)
        if fence is not None and fence.cancelled:
            return f"cancelled by {fence.by}: {fence.reason}"
        if fence is not None:
            return ""  # it is preparing: let it finish
    if seen.state.decided:
        return f"epoch {epoch} was decided ({seen.state.value}) before {participant} prepared"
    return ""


def read_submission(pipeline: Pipeline, epoch: int, participant: str, attempt: int) -> SubmissionRecord | None:
    """The attempt's submission record, or None."""
    return pipeline.txlog.read_record(_path(SUBMISSION_PREFIX, epoch, participant, attempt), SubmissionRecord)


def read_exit(pipeline: Pipeline, epoch: int, participant: str, attempt: int) -> ExitRecord | None:
    """The attempt's exit record, or None (running, or lost)."""
    return pipeline.txlog.read_record(_path(EXIT_PREFIX, epoch, participant, attempt), ExitRecord)


def submissions_of(pipeline: Pipeline, epoch: int,
                   names: list[str] | None = None) -> list[tuple[SubmissionRecord, ExitRecord | None]]:
    """Every submitted attempt of ``epoch`` with its exit record (None while running or lost)."""
    if names is None:
        names = pipeline.storage.list_dir(layout.txlog_dir(validate_epoch(epoch)))
    found = []
    for participant, attempt in _submitted(names):
        record = read_submission(pipeline, epoch, participant, attempt)
        if record is not None:
            exited = layout.attempt_record_name(EXIT_PREFIX, participant, attempt) in names
            found.append((record, read_exit(pipeline, epoch, participant, attempt) if exited else None))
    return found


def submitted_attempts(pipeline: Pipeline, epoch: int, participant: str,
                       names: Iterable[str] | None = None) -> list[int]:
    """Attempts of ``participant`` in ``epoch`` that have a submission record, oldest first."""
    validate_name(participant, "participant name")
    if names is None:
        names = pipeline.storage.list_dir(layout.txlog_dir(validate_epoch(epoch)))
    return sorted(attempt for p, attempt in _submitted(names) if p == participant)


def _submitted(names: Iterable[str]) -> list[tuple[str, int]]:
    """The (participant, attempt) of each submission record among an epoch's ``names``, sorted."""
    found = []
    for name in names:
        participant, _, attempt = name.removeprefix(SUBMISSION_PREFIX).rpartition("-a")
        if name.startswith(SUBMISSION_PREFIX) and participant and attempt.isdigit():  # else: not ours
            found.append((participant, int(attempt)))
    return sorted(found)


class SubmissionOutcome(enum.StrEnum):
    """What waiting for a submitted attempt has come to."""

    #: The participant is prepared (by this attempt or an earlier one): the stage is done.
    PREPARED = "prepared"
    #: Still running: launched recently, or its lease is being renewed.
    RUNNING = "running"
    #: The launched process exited without the participant being prepared.
    FAILED = "failed"
    #: No exit record, and nobody renewed the lease within ``lease_timeout_s``: the
    #: launcher and the driver are gone (a lost machine, a killed process group).
    LOST = "lost"
    #: The epoch was decided (aborted) before the participant prepared.
    DECIDED = "decided"

    @property
    def done(self) -> bool:
        return self is not SubmissionOutcome.RUNNING


@pydantic.dataclasses.dataclass(config=RECORD)
class SubmissionCheck(Record):
    """One look at a submitted attempt (plain data: it travels in a trigger event)."""

    outcome: SubmissionOutcome
    message: str
    epoch: int
    participant: str
    attempt: int
    prepared_attempt: int | None = None
    returncode: int | None = None
    tail: list[str] = pydantic.Field(default_factory=list)


def judge_submission(pipeline: Pipeline, epoch: int, participant: str, attempt: int,
                     *, now: float | None = None, seen: EpochDir | None = None) -> SubmissionCheck:
    """Where the submitted ``attempt`` of ``participant`` in ``epoch`` stands (the one judgement).

    In order: prepared (by any attempt) wins; a decided epoch ends the wait; an exit record
    ends the launcher (a clean one with ``exits_before_stage`` is judged by the lease); a
    lease of this attempt within its timeout, or a submission younger than
    ``lease_timeout_s``, runs; anything else is lost. ``seen``: the caller's listing.
    """
    seen = seen if seen is not None else EpochDir.read(pipeline, epoch)
    names = seen.names
    txlog = pipeline.txlog

    def check(outcome: SubmissionOutcome, message: str, **extra: Any) -> SubmissionCheck:
        return SubmissionCheck(outcome, message, epoch, participant, attempt, **extra)

    prepared = txlog.read_prepared(epoch, participant) if PREPARED_PREFIX + participant in names else None
    if prepared is not None:
        by = "this attempt" if prepared.attempt == attempt else f"attempt {prepared.attempt}"
        return check(SubmissionOutcome.PREPARED, f"epoch {epoch}: {participant} was prepared by {by}",
                     prepared_attempt=prepared.attempt)
    state = seen.state
    if state.decided:
        return check(SubmissionOutcome.DECIDED, f"epoch {epoch} was decided ({state.value}) before "
                     f"{participant} prepared")
    exited = layout.attempt_record_name(EXIT_PREFIX, participant, attempt) in names
    ended = read_exit(pipeline, epoch, participant, attempt) if exited else None
    detached = None
    launched = "the launch"
    if ended is not None:
        submitted_as = read_submission(pipeline, epoch, participant, attempt)
        launched = submitted_as.runtime if submitted_as is not None and submitted_as.runtime else launched
        if ended.returncode == 0 and not ended.stopped and submitted_as is not None \
                and submitted_as.exits_before_stage:
            detached = ended  # the stage may run on: judged by its lease below
    if ended is not None and detached is None:
        how = ("finished without preparing the participant" if ended.returncode == 0
               else f"failed with exit code {ended.returncode}")
        if ended.stopped:
            how = f"was stopped ({ended.stopped}), exit code {ended.returncode}"
        return check(SubmissionOutcome.FAILED, f"epoch {epoch}: {launched} of {participant} attempt {attempt} "
                     f"{how}", returncode=ended.returncode, tail=ended.tail)
    now = store_now(pipeline.storage) if now is None else now
    held = held_lease(pipeline, epoch, participant, now) if participant in seen.leased() else None
    if held is not None and held.record is not None and held.record.attempt == attempt:
        lease, age = held.record, held.age_s
        if held.renewed:
            returned = (f" ({launched} returned once the stage was handed over; the stage holds the lease)"
                        if detached is not None else "")
            return check(SubmissionOutcome.RUNNING, f"epoch {epoch}: {participant} attempt {attempt} runs "
                         f"({lease.describe_holder()}, lease renewed {max(age, 0):.0f}s ago){returned}")
        if detached is not None:
            return check(SubmissionOutcome.FAILED, f"epoch {epoch}: {launched} of {participant} attempt "
                         f"{attempt} returned once the stage was handed over and the stage's lease was "
                         f"last renewed {age:.0f}s ago, over {describe_timeout(pipeline.config, lease)}, without "
                         "preparing the participant", returncode=detached.returncode, tail=detached.tail)
        return check(SubmissionOutcome.LOST, f"epoch {epoch}: {participant} attempt {attempt} is lost: its "
                     f"lease ({lease.describe_holder()}) was last renewed {age:.0f}s ago, over "
                     f"{describe_timeout(pipeline.config, lease)}, and its launcher left no exit record")
    timeout = pipeline.config.lease_timeout_s
    submitted = layout.attempt_record_name(SUBMISSION_PREFIX, participant, attempt)
    if submitted in names:
        age = now - pipeline.storage.modified(layout.record_path(epoch, submitted))
        if age <= timeout:
            return check(SubmissionOutcome.RUNNING, f"epoch {epoch}: {participant} attempt {attempt} was "
                         f"submitted {max(age, 0):.0f}s ago and has not taken the lease yet")
        if detached is not None:
            return check(SubmissionOutcome.FAILED, f"epoch {epoch}: {launched} of {participant} attempt {attempt} "
                         f"returned once the stage was handed over, {age:.0f}s ago, and the stage never took "
                         f"the lease (lease_timeout_s={timeout:g})", returncode=detached.returncode,
                         tail=detached.tail)
        return check(SubmissionOutcome.LOST, f"epoch {epoch}: {participant} attempt {attempt} was submitted "
                     f"{age:.0f}s ago and never took the lease (lease_timeout_s={timeout:g})")
    return check(SubmissionOutcome.LOST, f"epoch {epoch}: {participant} attempt {attempt} has no submission record")
