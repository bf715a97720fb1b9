"""Liveness, by the store's clock (:func:`store_now`): stage leases (:class:`LeaseKeeper`),
:func:`liveness`, the one judgement of whether an undecided epoch is alive or dead, and
:func:`judge_submission`, the one verdict on whether an attempt launched detached still runs,
from its write-once ``submission-``, ``exit-``, ``deferred-`` and ``fence-`` records
(docs/ARCHITECTURE.md, decisions 10 and 27)."""

from __future__ import annotations

import contextlib
import enum
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal

import pydantic

from airflow_seatunnel_ckpt.core import codec, layout
from airflow_seatunnel_ckpt.core.config import CheckpointConfig, redact_url
from airflow_seatunnel_ckpt.core.errors import AlreadyExistsError, CheckpointError, CorruptCheckpointError
from airflow_seatunnel_ckpt.core.layout import validate_attempt, validate_epoch, validate_name
from airflow_seatunnel_ckpt.core.models import RECORD, EpochState, Record, tag
from airflow_seatunnel_ckpt.core.protocol.txlog import (
    BEGIN,
    PREPARED_PREFIX,
    FenceRecord,
    fence_name,
    read_record,
)
from airflow_seatunnel_ckpt.core.storage import Storage

if TYPE_CHECKING:
    from airflow_seatunnel_ckpt.core.protocol.pipeline import Pipeline

log = logging.getLogger(__name__)


def store_now(storage: Storage) -> float:
    """The store's current time: write a clock probe, read its modification time, remove it."""
    # A probe of its own per observer: concurrent observers never read (or remove) each
    # other's, and a dry run leaves the store as it found it.
    probe = f"{layout.CLOCK_PROBE}-{uuid.uuid4().hex}"
    storage.write_atomic(probe, b"")
    try:
        return storage.modified(probe)
    finally:
        try:
            storage.delete(probe)
        except CheckpointError as exc:  # a stray probe is harmless; the answer stands
            log.warning("clock probe %s could not be removed: %s", storage.describe_path(probe), exc)


def abort_command(pipeline: Pipeline, epoch: int, reason: str = "its run is dead") -> str:
    """The command line that aborts ``epoch`` now (for messages)."""
    store = redact_url(pipeline.config.storage_url)
    return (f"seatunnel-ckpt --store {store} abort {pipeline.name} {epoch} "
            f"--reason {json.dumps(reason)}")


# -- the lease record ---------------------------------------------------------------------

@pydantic.dataclasses.dataclass(config=RECORD)
class LeaseRecord(Record):
    """``lease-<participant>``: who runs the participant's stage in ``epoch``, rewritten at each renewal.

    Liveness reads its modification time; the fields are for people.
    """

    epoch: int
    participant: str
    attempt: int
    generation: int
    renew_s: float
    timeout_s: float
    holder: dict[str, Any] = pydantic.Field(default_factory=dict)
    type: Literal["lease"] = tag("lease")

    def describe_holder(self) -> str:
        """``attempt 2 on host:pid (ti ...)`` for messages."""
        h = self.holder
        where = f"{h.get('host', '?')}:{h.get('pid', '?')}"
        task = f", task {h['ti']}" if h.get("ti") else ""
        return f"attempt {self.attempt} on {where}{task}"


def default_holder(**extra: Any) -> dict[str, Any]:
    """Host and pid of this process, plus what the caller adds (e.g. ``ti``; ``None`` values left out)."""
    holder: dict[str, Any] = {"host": socket.gethostname(), "pid": os.getpid()}
    holder.update({k: v for k, v in extra.items() if v is not None})
    return holder


class Periodic:
    """Call ``tick`` every ``interval_s`` seconds from a daemon thread named ``name``, from
    :meth:`start` until :meth:`stop`; ``tick`` handles its own errors (one raised ends the thread)."""

    def __init__(self, tick: Callable[[], object], interval_s: float, name: str) -> None:
        self.tick = tick
        self.interval_s = interval_s
        self.name = name
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Periodic:
        """Start the thread; returns ``self``."""
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float) -> None:
        """Call ``tick`` no more, and wait up to ``timeout_s`` seconds for a call in progress to end."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.tick()


class LeaseKeeper:
    """``with LeaseKeeper(...):`` holds the lease of ``participant`` in ``epoch``, renewed every ``renew_s``.

    A failed renewal is logged and tried at the next tick: a store hiccup must never kill
    the stage it protects, and one missed renewal is within the timeout (``renew_s < timeout_s / 2``).
    """

    def __init__(self, storage: Storage, epoch: int, participant: str, attempt: int, *,
                 renew_s: float, timeout_s: float, holder: Mapping[str, Any] | None = None) -> None:
        self.storage = storage
        self.epoch = validate_epoch(epoch)
        self.participant = validate_name(participant, "participant name")
        self.attempt = validate_attempt(attempt)
        self.renew_s = float(renew_s)
        self.timeout_s = float(timeout_s)
        self.holder = dict(holder) if holder is not None else default_holder()
        self.path = layout.lease_path(self.epoch, self.participant)
        self.generation = 0
        self.failures = 0
        self._renewer = Periodic(self.renew, self.renew_s, f"lease-{self.participant}-epoch-{self.epoch}")

    @classmethod
    def for_pipeline(cls, pipeline: Pipeline, epoch: int, participant: str, attempt: int,
                     holder: Mapping[str, Any] | None = None) -> LeaseKeeper:
        """A keeper with the pipeline's ``lease_renew_s`` / ``lease_timeout_s``."""
        return cls(pipeline.storage, epoch, participant, attempt, renew_s=pipeline.config.lease_renew_s,
                   timeout_s=pipeline.config.lease_timeout_s, holder=holder)

    def renew(self) -> bool:
        """Write the lease once more (generation + 1); False (logged) if the write failed."""
        record = LeaseRecord(self.epoch, self.participant, self.attempt, self.generation + 1,
                             self.renew_s, self.timeout_s, self.holder)
        try:
            self.storage.write_atomic(self.path, codec.encode_json(record.to_dict()))
        except Exception as exc:  # any failure: the stage goes on, the next tick retries
            self.failures += 1
            log.warning("lease %s (generation %d) could not be renewed, retrying in %gs: %s",
                        self.storage.describe_path(self.path), record.generation, self.renew_s, exc)
            return False
        self.generation = record.generation
        return True

    def __enter__(self) -> LeaseKeeper:
        # A retried attempt continues the generations of the lease it takes over.
        try:
            previous = read_lease(self.storage, self.epoch, self.participant)
        except CheckpointError:
            previous = None
        self.generation = previous.generation if previous is not None else 0
        self.renew()
        self._renewer.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop renewing now; the lease then expires ``timeout_s`` after its last renewal."""
        self._renewer.stop(timeout_s=self.renew_s + 30)


def read_lease(storage: Storage, epoch: int, participant: str) -> LeaseRecord | None:
    """The lease record of ``participant`` in ``epoch``, or None if it has none."""
    return read_record(storage, layout.lease_path(epoch, participant), LeaseRecord)


# -- liveness -----------------------------------------------------------------------------

@dataclass(frozen=True)
class EpochDir:
    """One listing of an epoch's log directory and the state its names give, shared by
    :func:`liveness` and :func:`judge_submission` so that a caller lists it once."""

    epoch: int
    names: frozenset[str]
    state: EpochState

    @classmethod
    def read(cls, pipeline: Pipeline, epoch: int) -> EpochDir:
        """List ``epoch``'s log directory once (:class:`EpochNotFoundError` if it has no records)."""
        names = pipeline.storage.list_dir(layout.txlog_dir(validate_epoch(epoch)))
        return cls(epoch, frozenset(names), pipeline.txlog.state(epoch, names))

    def prepared(self) -> set[str]:
        """The participants with a prepared record."""
        return {n[len(PREPARED_PREFIX):] for n in self.names if n.startswith(PREPARED_PREFIX)}

    def leased(self) -> set[str]:
        """The participants with a lease (prepared or not)."""
        return {n[len(layout.LEASE_PREFIX):] for n in self.names if n.startswith(layout.LEASE_PREFIX)}


@dataclass(frozen=True)
class HeldLease:
    """A participant's lease as an observer sees it: how old, judged by which timeout."""

    participant: str
    age_s: float
    timeout_s: float  #: :func:`lease_timeout`
    record: LeaseRecord | None  #: None: unreadable (its modification time still counts)

    @property
    def renewed(self) -> bool:
        """Whether it was renewed within its timeout."""
        return self.age_s <= self.timeout_s


def held_lease(pipeline: Pipeline, epoch: int, participant: str, now: float) -> HeldLease | None:
    """The lease of ``participant`` in ``epoch`` seen at store time ``now``; None if it has none."""
    try:
        age = now - pipeline.storage.modified(layout.lease_path(epoch, participant))
    except FileNotFoundError:
        return None
    try:
        record = read_lease(pipeline.storage, epoch, participant)
    except CheckpointError:
        record = None  # unreadable content: its modification time still counts
    return HeldLease(participant, age, lease_timeout(pipeline.config, record), record)


def earlier_attempt(pipeline: Pipeline, epoch: int, participant: str, attempt: int) -> str:
    """What an earlier attempt of ``participant`` left in ``epoch`` (its lease), for the log; "" if none.

    A try killed outright (SIGKILL) logs nothing itself; its lease tells who ran it and about when it died.
    """
    try:
        lease = read_lease(pipeline.storage, epoch, participant)
        if lease is None or lease.attempt == attempt:
            return ""
        age = store_now(pipeline.storage) - pipeline.storage.modified(layout.lease_path(epoch, participant))
    except (CheckpointError, OSError) as exc:
        log.info("epoch %s: could not read the lease an earlier attempt of %s left: %s", epoch, participant, exc)
        return ""
    return (f"epoch {epoch}: an earlier attempt of {participant} ran and did not prepare: its lease says "
            f"{lease.describe_holder()}, last renewed {max(age, 0):.0f}s ago (renewal every "
            f"{pipeline.config.lease_renew_s:g}s; generation {lease.generation}). It ended there -- killed (e.g. "
            f"SIGKILL when out of memory), its worker lost, or failed -- and this attempt {attempt} runs the stage "
            "again; the earlier attempt's staging is never published")


def lease_timeout(config: CheckpointConfig, lease: LeaseRecord | None) -> float:
    """Seconds after its last renewal that ``lease`` is dead: its holder's timeout or the observer's, the larger.

    An observer with a shorter ``lease_timeout_s`` (the CLI's default) must not judge the
    stage dead between two of its renewals.
    """
    own = lease.timeout_s if lease is not None and lease.timeout_s > 0 else 0.0
    return max(own, float(config.lease_timeout_s))


def describe_timeout(config: CheckpointConfig, lease: LeaseRecord | None) -> str:
    """``lease_timeout_s=180`` or ``the lease's timeout_s=600 (lease_timeout_s=180)`` for messages."""
    timeout = lease_timeout(config, lease)
    if timeout > config.lease_timeout_s:
        return f"the lease's timeout_s={timeout:g} (lease_timeout_s={config.lease_timeout_s:g})"
    return f"lease_timeout_s={config.lease_timeout_s:g}"


class Liveness(enum.StrEnum):
    """Whether an epoch's owner may still finish it."""

    ALIVE = "alive"  #: its stage renews its lease, or may still start (begun recently, its run running)
    AWAITING_DECISION = "awaiting-decision"  #: PREPARED within ``prepared_timeout_s``: the decision is due
    EXPIRED = "expired"  #: OPEN, its lease not renewed (or never taken) for ``lease_timeout_s``
    PREPARED_TIMEOUT = "prepared-timeout"  #: PREPARED and undecided ``prepared_timeout_s`` after its prepare
    OWNER_FINISHED = "owner-finished"  #: its DAG run is finished and left it undecided
    DECIDED = "decided"  #: commit rolls forward, abort finishes; never judged dead

    @property
    def dead(self) -> bool:
        """Whether anyone may abort the epoch now."""
        return self in (Liveness.EXPIRED, Liveness.PREPARED_TIMEOUT, Liveness.OWNER_FINISHED)


@dataclass(frozen=True)
class EpochLiveness:
    """The judgement on one epoch, with what it rests on (for messages and logs)."""

    epoch: int
    state: EpochState
    liveness: Liveness
    reason: str
    run_id: str = ""
    dag_id: str = ""
    #: seconds since the lease renewal / prepare / begin that the judgement used
    age_s: float | None = None
    lease: LeaseRecord | None = None

    @property
    def dead(self) -> bool:
        """Whether anyone may abort the epoch now."""
        return self.liveness.dead

    def describe(self) -> str:
        """``epoch 3 (OPEN, run 'x') is ALIVE: ...`` for messages."""
        verdict = "DEAD" if self.dead else self.liveness.value.upper()
        run = f", run {self.run_id!r}" if self.run_id else ""
        return f"epoch {self.epoch} ({self.state.value}{run}) is {verdict}: {self.reason}"


def liveness(pipeline: Pipeline, epoch: int, owner_run_finished: bool | None = None, *,
             now: float | None = None, seen: EpochDir | None = None) -> EpochLiveness:
    """Judge whether ``epoch`` is alive or dead (the one place that decides it).

    :param owner_run_finished: whether the DAG run that began the epoch is over (``None``:
        unknown; the core never asks an orchestrator, its caller does).
    :param now: the store's time to judge at (default: :func:`store_now`).
    :param seen: the epoch's log directory as the caller listed it (default: list it now).
    """
    config = pipeline.config
    storage = pipeline.storage
    seen = seen if seen is not None else EpochDir.read(pipeline, epoch)
    names, state = seen.names, seen.state
    try:
        begin = pipeline.txlog.read_begin(epoch) if BEGIN in names else None
    except CorruptCheckpointError:
        begin = None
    run_id, dag_id = (begin.run_id, begin.dag_id) if begin is not None else ("", "")

    def verdict(kind: Liveness, reason: str, age: float | None = None,
                lease: LeaseRecord | None = None) -> EpochLiveness:
        return EpochLiveness(epoch, state, kind, reason, run_id, dag_id, age, lease)

    if state.decided:
        return verdict(Liveness.DECIDED, f"decided ({state.value}); it is never aborted for liveness")
    if owner_run_finished:
        return verdict(Liveness.OWNER_FINISHED, f"its DAG run {run_id or '?'!r} is finished but left the epoch "
                       f"{state.value}")
    now = store_now(storage) if now is None else now

    def age_of(name: str) -> float | None:
        try:
            return now - storage.modified(f"{layout.txlog_dir(epoch)}/{name}")
        except FileNotFoundError:
            return None

    prepared = seen.prepared()
    # The leases of the participants still running (a prepared one is finished), each
    # judged with the larger of its holder's timeout and this observer's: a stage set up
    # to renew rarely is not dead by the shorter timeout of whoever looks at it.
    leases = [held for held in (held_lease(pipeline, epoch, p, now) for p in sorted(seen.leased() - prepared))
              if held is not None]

    if leases:
        # The lease furthest from expiring speaks for the epoch.
        held = min(leases, key=lambda h: h.age_s - h.timeout_s)
        age, record = held.age_s, held.record
        who = f"lease of {held.participant!r}" + (f" ({record.describe_holder()}, generation {record.generation})"
                                                  if record else "")
        if held.renewed:
            return verdict(Liveness.ALIVE, f"{who} renewed {max(age, 0):.0f}s ago, within timeout "
                           f"({describe_timeout(config, record)})", age, record)
        if state is EpochState.OPEN:
            return verdict(Liveness.EXPIRED, f"{who} last renewed {age:.0f}s ago, over "
                           f"{describe_timeout(config, record)}", age, record)
    if state is EpochState.PREPARED:
        declared = pipeline.declared_participants() or []
        waiting = sorted(set(declared) - prepared - seen.leased())
        if waiting and owner_run_finished is False:
            # A declared stage of a run still running has not begun (queued behind a pool,
            # or waiting for upstream tasks): it takes its lease when it starts.
            return verdict(Liveness.ALIVE, f"prepared by {sorted(prepared)}; {waiting} not begun yet and its DAG "
                           f"run {run_id or '?'!r} is still running, so they may still start")
        ages = [a for a in (age_of(PREPARED_PREFIX + p) for p in sorted(prepared)) if a is not None]
        age = min(ages) if ages else config.prepared_timeout_s + 1
        if age > config.prepared_timeout_s:
            return verdict(Liveness.PREPARED_TIMEOUT, f"prepared {age:.0f}s ago and still undecided, over "
                           f"prepared_timeout_s={config.prepared_timeout_s:g}", age)
        return verdict(Liveness.AWAITING_DECISION, f"prepared {max(age, 0):.0f}s ago, within timeout "
                       f"(prepared_timeout_s={config.prepared_timeout_s:g}), waiting for its decision", age)
    # OPEN without any lease: the stage has not taken one yet (or died before it could).
    began = age_of(BEGIN)
    if began is None:
        began = min((a for a in map(age_of, names) if a is not None), default=config.lease_timeout_s + 1)
    if began > config.lease_timeout_s:
        return verdict(Liveness.EXPIRED, f"begun {began:.0f}s ago and no stage ever took its lease, over "
                       f"lease_timeout_s={config.lease_timeout_s:g}", began)
    return verdict(Liveness.ALIVE, f"begun {max(began, 0):.0f}s ago, no lease yet, within timeout "
                   f"(lease_timeout_s={config.lease_timeout_s:g}) for a stage to take one", began)


def wait_for(pipeline: Pipeline, epoch: int, judged: EpochLiveness) -> str:
    """What a blocked caller is told: whether the epoch is alive, and the command that works now."""
    if judged.dead:
        what = "it may be aborted now"
    else:
        what = "it will be aborted automatically once it is dead (lease expired or run finished)"
    return (f"{judged.describe()}; {what}. To abort it now: "
            f"`{abort_command(pipeline, epoch)}`")


# -- submitted stages -----------------------------------------------------------------------

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

    PREPARED = "prepared"  #: the participant is prepared (by this attempt or an earlier one)
    RUNNING = "running"  #: launched recently, or its lease is being renewed
    FAILED = "failed"  #: the launched process exited without the participant being prepared
    LOST = "lost"  #: no exit record and no lease renewal within ``lease_timeout_s``: launcher and driver gone
    DECIDED = "decided"  #: the epoch was decided (aborted) before the participant prepared

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
