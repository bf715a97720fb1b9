"""The transaction log: write-once records per epoch (framed JSON, created exclusively), and the
epoch's state, derived from which records exist (docs/ARCHITECTURE.md, decisions 3 and 4)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any, Literal, TypeVar

import pydantic

from airflow_seatunnel_ckpt.core import codec, layout
from airflow_seatunnel_ckpt.core.errors import (
    AlreadyExistsError,
    CorruptCheckpointError,
    EpochNotFoundError,
    FencedAttemptError,
    PendingEpochError,
)
from airflow_seatunnel_ckpt.core.layout import validate_attempt, validate_epoch, validate_name
from airflow_seatunnel_ckpt.core.models import (
    RECORD,
    ActionEntry,
    ActionOutcome,
    ActionRecord,
    BeginRecord,
    Decision,
    DecisionRecord,
    EpochState,
    EpochStatus,
    OutcomeRecord,
    PreparedRecord,
    PublishedSink,
    Record,
    decode,
    tag,
)
from airflow_seatunnel_ckpt.core.protocol.settled import SettledLog, SettledRead
from airflow_seatunnel_ckpt.core.storage import Storage

R = TypeVar("R")
W = TypeVar("W", bound=Record)

BEGIN = "begin"
DECISION = "decision"
COMMITTED = "committed"
ABORTED = "aborted"
RETIRED = "retired"
PREPARED_PREFIX = "prepared-"
PLAN_PREFIX = "plan-"
#: An operator's action on the epoch (who, what, why); never read by the state machine.
ACTION_PREFIX = "action-"
OUTCOME_PREFIX = "outcome-"
FENCE_PREFIX = "fence-"
INDEX_RECORD = "epoch-index"


def fence_name(participant: str, attempt: int) -> str:
    """``fence-<participant>-a<attempt>``."""
    return layout.attempt_record_name(FENCE_PREFIX, participant, attempt)


@pydantic.dataclasses.dataclass(config=RECORD)
class FenceRecord(Record):
    """Whether an attempt may prepare: settled once, by its prepare or by a cancel, whichever came first."""

    epoch: int
    participant: str
    attempt: int
    #: True: a cancel came first and the attempt never prepares; False: the attempt prepares.
    cancelled: bool
    by: str
    reason: str = ""
    at: float = 0.0
    type: Literal["attempt-fence"] = tag("attempt-fence")


def read_record(storage: Storage, path: str, parse: type[R] | Callable[[dict[str, Any], str], R],
                max_chunk: int = codec.DEFAULT_MAX_CHUNK) -> R | None:
    """The framed JSON record at ``path`` as type ``parse`` (or parsed by it); None if absent."""
    try:
        data = storage.read(path)
    except FileNotFoundError:
        return None
    where = storage.describe_path(path)
    if isinstance(parse, type):
        return decode(parse, codec.decode_json_payload(data, where, max_chunk=max_chunk), where)
    return parse(codec.decode_json(data, where, max_chunk=max_chunk), where)


class TransactionLog:
    """The ``_txlog`` of one pipeline. One method per record / transition."""

    def __init__(self, storage: Storage, pipeline: str, max_chunk: int = codec.DEFAULT_MAX_CHUNK) -> None:
        self.storage = storage
        self.pipeline = pipeline
        self._max_chunk = max_chunk
        self.settled = SettledLog(storage, pipeline, max_chunk)

    # -- record I/O --------------------------------------------------------------------
    def _write_once(self, path: str, payload: dict[str, Any]) -> None:
        self.storage.create_exclusive(path, codec.encode_json(payload))

    def _write_or_read(self, path: str, record: W, parse: type[W]) -> W:
        """Create the record at ``path`` as ``record``; if one is there already, the one stored first."""
        try:
            self._write_once(path, record.to_dict())
            return record
        except AlreadyExistsError:
            stored = self.read_record(path, parse)
        if stored is None:  # pragma: no cover - a write-once record never disappears
            where = self.storage.describe_path(path)
            raise CorruptCheckpointError(f"{where} exists but cannot be read back", where)
        return stored

    def read_record(self, path: str, parse: type[R] | Callable[[dict[str, Any], str], R]) -> R | None:
        """One record of type ``parse`` (or parsed by it); None if absent, CorruptCheckpointError if damaged."""
        return read_record(self.storage, path, parse, self._max_chunk)

    # -- epochs ------------------------------------------------------------------------
    def epochs(self) -> list[int]:
        """Every epoch the log knows, ascending (two listings)."""
        found = [layout.parse_txlog_dir(n) for n in self.storage.list_dir(layout.TXLOG)]
        out = sorted(e for e in found if e is not None)
        # A process killed while creating ``begin`` can leave the newest epoch directory
        # with no record in it (a local disk creates the directory first). That is not an
        # epoch: leaving it out lets the next ``begin`` take the number.
        if out and not self.storage.list_dir(layout.txlog_dir(out[-1])):
            out.pop()
        return out

    def begin(self, run_id: str, now: float | None = None, *, dag_id: str = "",
              logical_date: str = "") -> BeginRecord:
        """The epoch of run ``run_id`` of DAG ``dag_id``, allocating the next one if it has none yet.

        Idempotent per (DAG, run id); a run whose epoch was aborted gets a fresh one.
        :class:`PendingEpochError` while an earlier epoch is undecided or COMMITTING: a new
        epoch restores the state (and consumed input) of every earlier commit.
        """
        key = layout.run_key(run_id, dag_id)
        for _ in range(100):
            existing = self._latest_for_run(run_id, dag_id)
            if existing is not None:
                state = self.state(existing.epoch)
                if state not in (EpochState.ABORTING, EpochState.ABORTED):
                    return existing
            epochs = self.epochs()
            latest = epochs[-1] if epochs else 0
            if latest:
                latest_begin = self._read_begin_if_intact(latest)
                if latest_begin is not None and self._same_run(latest_begin, run_id, dag_id) and (
                    existing is None or existing.epoch != latest
                ):
                    # Crashed between ``begin`` and the run index: finish the index.
                    self._index_run(layout.run_key(run_id, latest_begin.dag_id), latest)
                    continue
                state = self.state(latest)
                # COMMITTING blocks too: a new epoch restores from the newest *committed*
                # checkpoint, so it would read the committing epoch's input a second time.
                if not state.decided or state is EpochState.COMMITTING:
                    if state is EpochState.COMMITTING:
                        way_out = ("it is decided commit and only rolls forward: retry its commit task or run "
                                   f"`seatunnel-ckpt recover {self.pipeline} --apply` to finish publishing it")
                    else:
                        way_out = ("the stage task of the next run aborts it by itself once it is dead (its lease "
                                   "expired or its DAG run finished); if its run is dead, abort it now with "
                                   f"`seatunnel-ckpt abort {self.pipeline} {latest} --reason \"its run is dead\"` "
                                   f"(`seatunnel-ckpt recover {self.pipeline}` tells whether it is alive: its "
                                   "lease holder and last renewal)")
                    raise PendingEpochError(
                        f"pipeline {self.pipeline!r}: epoch {latest} (run "
                        f"{latest_begin.run_id if latest_begin else '?'!r}) is still {state.value}; a new epoch "
                        f"can begin only after it is committed (published) or aborted: {way_out}.",
                        latest,
                    )
            record = BeginRecord(latest + 1, run_id, time.time() if now is None else now, dag_id, logical_date)
            try:
                self._write_once(layout.record_path(record.epoch, BEGIN), record.to_dict())
            except AlreadyExistsError:
                continue  # another run took this epoch number; look again
            self._index_run(key, record.epoch)
            return record
        raise PendingEpochError(f"pipeline {self.pipeline!r}: could not allocate an epoch for run {run_id!r}", 0)

    def _index_run(self, key: str, epoch: int) -> None:
        with contextlib.suppress(AlreadyExistsError):
            self.storage.create_exclusive(f"{layout.TXLOG}/runs/{key}/{epoch:0{layout.EPOCH_WIDTH}d}", b"")

    @staticmethod
    def _same_run(record: BeginRecord, run_id: str, dag_id: str) -> bool:
        """Whether ``record`` was begun by run ``run_id`` of ``dag_id``."""
        return record.run_id == run_id and record.dag_id == dag_id

    def _latest_for_run(self, run_id: str, dag_id: str = "") -> BeginRecord | None:
        names = self.storage.list_dir(layout.run_index_dir(run_id, dag_id))
        for epoch in sorted((int(n) for n in names if n.isdigit()), reverse=True):
            record = self.read_begin(epoch)
            if record is not None and self._same_run(record, run_id, dag_id):
                return record
        return None

    def epoch_for_run(self, run_id: str, *, dag_id: str = "") -> int | None:
        """The newest epoch given to run ``run_id`` of ``dag_id``, or None (never allocates)."""
        record = self._latest_for_run(run_id, dag_id)
        if record is not None:
            return record.epoch
        epochs = self.epochs()
        if epochs:
            latest = self._read_begin_if_intact(epochs[-1])
            if latest is not None and self._same_run(latest, run_id, dag_id):
                return latest.epoch
        return None

    def _read_begin_if_intact(self, epoch: int) -> BeginRecord | None:
        """``begin`` of ``epoch``, or None if absent or damaged (the state, from the other records,
        still says whether the epoch is finished; recovery reports the damaged file)."""
        try:
            return self.read_begin(epoch)
        except CorruptCheckpointError:
            return None

    def read_begin(self, epoch: int) -> BeginRecord | None:
        """The ``begin`` record of ``epoch``, or None."""
        return self.read_record(layout.record_path(epoch, BEGIN), BeginRecord)

    # -- input plan --------------------------------------------------------------------
    def fix_plan(self, epoch: int, participant: str, attempt: int,
                 sources: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        """Record which input the participant reads in ``epoch``; returns the first attempt's plan."""
        path = layout.record_path(epoch, PLAN_PREFIX + validate_name(participant, "participant name"))
        try:
            self._write_once(path, {"type": "input_plan", "epoch": epoch, "participant": participant,
                                    "attempt": validate_attempt(attempt), "created_at": time.time(),
                                    "sources": sources})
            return sources
        except AlreadyExistsError:
            stored = self.read_plan(epoch, participant)
            if stored is None:  # pragma: no cover - a record never disappears
                raise
            return stored

    def read_plan(self, epoch: int, participant: str) -> dict[str, dict[str, Any]] | None:
        """The input plan fixed for ``participant`` in ``epoch``, or None."""
        def parse(d: dict[str, Any], path: str) -> dict[str, dict[str, Any]]:
            sources = d.get("sources")
            if not isinstance(sources, dict) or not all(isinstance(v, dict) for v in sources.values()):
                raise CorruptCheckpointError(f"{path}: input plan has no valid 'sources' object", path)
            return sources

        path = layout.record_path(epoch, PLAN_PREFIX + validate_name(participant, "participant name"))
        return self.read_record(path, parse)

    # -- prepare -----------------------------------------------------------------------
    def write_prepared(self, record: PreparedRecord) -> PreparedRecord:
        """Create the participant's ``prepared`` record; the first attempt wins (:class:`FencedAttemptError`
        for another attempt, a decided epoch or a cancelled attempt)."""
        validate_attempt(record.attempt)
        participant = validate_name(record.participant, "participant name")
        self.require_undecided(record.epoch, f"attempt {record.attempt} of {participant!r} cannot prepare")
        # A cancelled attempt never prepares: its fence is settled right before the
        # prepared record, by this prepare or by the cancel that came first.
        fence = self.settle_fence(FenceRecord(record.epoch, participant, record.attempt, False,
                                              f"attempt {record.attempt}", "preparing", time.time()))
        if fence.cancelled:
            raise FencedAttemptError(
                f"pipeline {self.pipeline!r} epoch {record.epoch}: attempt {record.attempt} of {participant!r} "
                f"was cancelled by {fence.by} ({fence.reason}) before it prepared; it cannot prepare and its "
                "staged output will never be published (the attempt that replaced it prepares instead)")
        stored = self._write_or_read(layout.record_path(record.epoch, PREPARED_PREFIX + participant), record,
                                     PreparedRecord)
        if stored.attempt != record.attempt:
            raise FencedAttemptError(
                f"pipeline {self.pipeline!r} epoch {record.epoch}: participant {participant!r} was already "
                f"prepared by attempt {stored.attempt}; attempt {record.attempt} is stale and its staged output "
                "will never be published")
        return stored

    def settle_fence(self, record: FenceRecord) -> FenceRecord:
        """Create the attempt's fence record as ``record``, or return the one that came first: its
        prepare and a cancel settle this one file, so exactly one of them wins."""
        path = layout.record_path(validate_epoch(record.epoch), fence_name(record.participant, record.attempt))
        return self._write_or_read(path, record, FenceRecord)

    def read_fence(self, epoch: int, participant: str, attempt: int) -> FenceRecord | None:
        """The attempt's fence record (None: neither prepared nor cancelled yet)."""
        return self.read_record(layout.record_path(validate_epoch(epoch), fence_name(participant, attempt)),
                                FenceRecord)

    def require_undecided(self, epoch: int, what: str) -> None:
        """Raise :class:`FencedAttemptError` (saying ``what`` cannot happen) once ``epoch`` is decided."""
        decision = self.read_decision(epoch)
        if decision is not None:
            raise FencedAttemptError(
                f"pipeline {self.pipeline!r} epoch {epoch}: {what}: the epoch was already decided "
                f"({decision.decision.value} by {decision.by}: {decision.reason})"
            )

    def read_prepared(self, epoch: int, participant: str) -> PreparedRecord | None:
        """One participant's ``prepared`` record, or None."""
        path = layout.record_path(epoch, PREPARED_PREFIX + validate_name(participant, "participant name"))
        return self.read_record(path, PreparedRecord)

    def prepared(self, epoch: int, names: list[str] | None = None) -> dict[str, PreparedRecord]:
        """Every prepared participant of ``epoch`` (reads only the records it lists)."""
        names = names if names is not None else self.storage.list_dir(layout.txlog_dir(epoch))
        out = {}
        for name in names:
            if name.startswith(PREPARED_PREFIX):
                record = self.read_prepared(epoch, name[len(PREPARED_PREFIX):])
                if record is not None:
                    out[record.participant] = record
        return out

    def winning_records(self, epoch: int) -> list[PreparedRecord] | None:
        """The prepared records of the attempts the epoch's decision names, by participant.

        ``[]`` while the epoch is undecided (or decided with no participant); None when a
        named record is missing or belongs to another attempt (a damaged log).
        """
        decision = self.read_decision(epoch)
        records = []
        for name, attempt in sorted((decision.participants if decision else {}).items()):
            record = self.read_prepared(epoch, name)
            if record is None or record.attempt != attempt:
                return None
            records.append(record)
        return records

    # -- decide ------------------------------------------------------------------------
    def decide(self, record: DecisionRecord) -> DecisionRecord:
        """Create the epoch's single ``decision`` record; returns whichever decision won."""
        validate_epoch(record.epoch)
        # The epoch exists if any of its records does: an epoch whose ``begin`` was lost or
        # damaged must still be abortable, or it would block every later epoch.
        if not self.storage.list_dir(layout.txlog_dir(record.epoch)):
            raise EpochNotFoundError(f"pipeline {self.pipeline!r} has no epoch {record.epoch}")
        return self._write_or_read(layout.record_path(record.epoch, DECISION), record, DecisionRecord)

    def read_decision(self, epoch: int) -> DecisionRecord | None:
        """The ``decision`` record of ``epoch``, or None while undecided."""
        return self.read_record(layout.record_path(epoch, DECISION), DecisionRecord)

    # -- acknowledgements --------------------------------------------------------------
    def acknowledge_committed(self, epoch: int, published: list[PublishedSink]) -> None:
        """Write ``committed`` (idempotent): the publish finished for every sink."""
        self._acknowledge(epoch, COMMITTED, published=[p.to_dict() for p in published])

    def acknowledge_aborted(self, epoch: int) -> None:
        """Write ``aborted`` (idempotent): staging and the uncommitted checkpoint are gone."""
        self._acknowledge(epoch, ABORTED)

    def retire(self, epoch: int) -> None:
        """Write ``retired`` (idempotent): retention removed the committed checkpoint on purpose."""
        self._acknowledge(epoch, RETIRED)

    def is_retired(self, epoch: int) -> bool:
        """Whether retention removed this epoch's checkpoint (it stays COMMITTED in the log)."""
        return self.storage.exists(layout.record_path(epoch, RETIRED))

    def _acknowledge(self, epoch: int, name: str, **details: Any) -> None:
        with contextlib.suppress(AlreadyExistsError):
            self._write_once(layout.record_path(epoch, name),
                             {"type": name, "epoch": epoch, "at": time.time(), **details})

    def record_action(self, epoch: int, action: str, by: str, reason: str, **details: Any) -> str:
        """Write an ``action-*`` record (who does what to the epoch, and why) before the action; returns
        its name for :meth:`record_outcome`. An audit trail: it never changes the epoch's state."""
        validate_epoch(epoch)
        stamp = time.time_ns()
        while True:  # two actions in the same nanosecond: the next free name
            name = f"{ACTION_PREFIX}{stamp:020d}-{action}"
            record = ActionRecord(epoch, action, by, reason, time.time(), dict(details))
            try:
                self._write_once(layout.record_path(epoch, name), record.to_dict())
                return name
            except AlreadyExistsError:
                stamp += 1

    def record_outcome(self, epoch: int, action_name: str, outcome: ActionOutcome, detail: str = "") -> OutcomeRecord:
        """Write how the action ``action_name`` ended (write-once: a second outcome is :class:`AlreadyExistsError`)."""
        validate_epoch(epoch)
        if not action_name.startswith(ACTION_PREFIX):
            raise ValueError(f"{action_name!r} is not an action record's name (it starts with {ACTION_PREFIX!r})")
        suffix = action_name[len(ACTION_PREFIX):]
        record = OutcomeRecord(epoch, suffix.split("-", 1)[-1], ActionOutcome(outcome), detail, time.time())
        self._write_once(layout.record_path(epoch, OUTCOME_PREFIX + suffix), record.to_dict())
        return record

    def actions(self, epoch: int) -> list[ActionEntry]:
        """The epoch's actions with their outcomes, oldest first."""
        names = self.storage.list_dir(layout.txlog_dir(validate_epoch(epoch)))
        outcomes = {n[len(OUTCOME_PREFIX):] for n in names if n.startswith(OUTCOME_PREFIX)}
        out = []
        for name in sorted(n for n in names if n.startswith(ACTION_PREFIX)):
            record = self.read_record(layout.record_path(epoch, name), ActionRecord)
            if record is None:
                continue
            suffix = name[len(ACTION_PREFIX):]
            outcome = (self.read_record(layout.record_path(epoch, OUTCOME_PREFIX + suffix), OutcomeRecord)
                       if suffix in outcomes else None)
            out.append(ActionEntry(name, record, outcome))
        return out


    def read_committed(self, epoch: int) -> tuple[list[PublishedSink], float | None] | None:
        """What the ``committed`` record says was published, and its ``at``; None if not committed."""
        def parse(d: dict[str, Any], path: str) -> tuple[list[PublishedSink], float | None]:
            items, at = d.get("published"), d.get("at")
            if not isinstance(items, list):
                raise CorruptCheckpointError(f"{path}: field 'published' is missing", path)
            published = [PublishedSink.from_dict(p, path) for p in items]
            return published, float(at) if isinstance(at, (int, float)) else None

        return self.read_record(layout.record_path(epoch, COMMITTED), parse)

    def read_published(self, epoch: int) -> list[PublishedSink] | None:
        """What the ``committed`` record says was published, or None if not committed."""
        committed = self.read_committed(epoch)
        return committed[0] if committed is not None else None

    # -- state -------------------------------------------------------------------------
    def state(self, epoch: int, names: list[str] | None = None) -> EpochState:
        """The epoch's state, derived from which records exist (one listing, <=1 read)."""
        names = names if names is not None else self.storage.list_dir(layout.txlog_dir(epoch))
        if not names:
            raise EpochNotFoundError(f"pipeline {self.pipeline!r} has no epoch {epoch}")
        present = set(names)
        if COMMITTED in present:
            return EpochState.COMMITTED
        if ABORTED in present:
            return EpochState.ABORTED
        if DECISION in present:
            decision = self.read_decision(epoch)
            if decision is not None:
                return EpochState.COMMITTING if decision.decision is Decision.COMMIT else EpochState.ABORTING
        if any(n.startswith(PREPARED_PREFIX) for n in present):
            return EpochState.PREPARED
        return EpochState.OPEN

    def committed_epochs(self) -> list[int]:
        """Committed epochs, ascending (the settled record, plus one state per epoch above it)."""
        return [e for e, s in self.states().items() if s is EpochState.COMMITTED]

    def last_committed_epoch(self) -> int | None:
        """The newest committed epoch, or None (reads the epochs above the watermark only)."""
        seen, above = self._above()
        for epoch, names in reversed(above.items()):
            if self.state(epoch, names) is EpochState.COMMITTED:
                return epoch
        return seen.record.last_committed()

    def open_epochs(self) -> tuple[SettledRead, list[int]]:
        """The settled record and the epochs above its watermark (those whose state may change)."""
        seen, above = self._above()
        return seen, list(above)

    def _above(self, seen: SettledRead | None = None) -> tuple[SettledRead, dict[int, list[str] | None]]:
        """The settled record, and each epoch above its watermark with the names in its directory
        (None without a watermark: then one listing of the log)."""
        # Epochs are dense (``begin`` creates the newest + 1 exclusively, no log directory is
        # removed), so above the watermark they are found one directory at a time up to the
        # first empty one: no listing of ``_txlog``, which grows with every epoch ever run.
        seen = seen if seen is not None else self.settled.read()
        if not seen.record.watermark:
            return seen, dict.fromkeys(self.epochs())
        above: dict[int, list[str] | None] = {}
        epoch = seen.record.watermark + 1
        while names := self.storage.list_dir(layout.txlog_dir(epoch)):
            above[epoch] = names
            epoch += 1
        return seen, above

    def newest_epochs(self, last: int, seen: SettledRead | None = None) -> list[int]:
        """The newest ``last`` epochs, ascending (from the settled record and the epochs above it)."""
        seen, above = self._above(seen)
        newest = max(above, default=seen.record.watermark)
        return list(range(max(1, newest - last + 1), newest + 1))

    def states(self) -> dict[int, EpochState]:
        """Every epoch with its state, ascending (settled ones from the settled record)."""
        return self.view()[1]

    def view(self) -> tuple[SettledRead, dict[int, EpochState]]:
        """:meth:`states` together with the settled record it was built on (for :meth:`settle`)."""
        seen, above = self._above()
        out = seen.record.states()
        out.update((epoch, self.state(epoch, names)) for epoch, names in above.items())
        return seen, out


    def status(self, epoch: int) -> EpochStatus:
        """Everything the log holds about ``epoch``."""
        validate_epoch(epoch)
        names = self.storage.list_dir(layout.txlog_dir(epoch))
        state = self.state(epoch, names)
        published = self.read_published(epoch) if state is EpochState.COMMITTED else None
        return EpochStatus(epoch, state, self.read_begin(epoch), self.prepared(epoch, names),
                           self.read_decision(epoch) if state.decided else None, published or [])

    # -- verification ------------------------------------------------------------------
    def damaged_records(self, epoch: int) -> list[CorruptCheckpointError]:
        """Every record of ``epoch`` that cannot be read back as the protocol reads it ([] = intact)."""
        validate_epoch(epoch)
        problems = []
        for name in self.storage.list_dir(layout.txlog_dir(epoch)):
            try:
                self._read_named(epoch, name)
            except CorruptCheckpointError as exc:
                problems.append(exc)
        return problems

    def _read_named(self, epoch: int, name: str) -> object:
        if name == BEGIN:
            return self.read_begin(epoch)
        if name == DECISION:
            return self.read_decision(epoch)
        if name == COMMITTED:
            return self.read_published(epoch)
        if name.startswith(PREPARED_PREFIX):
            return self.read_prepared(epoch, name[len(PREPARED_PREFIX):])
        if name.startswith(PLAN_PREFIX):
            return self.read_plan(epoch, name[len(PLAN_PREFIX):])
        if name.startswith(ACTION_PREFIX):
            return self.read_record(layout.record_path(epoch, name), ActionRecord)
        if name.startswith(OUTCOME_PREFIX):
            return self.read_record(layout.record_path(epoch, name), OutcomeRecord)
        try:
            return self.read_record(layout.record_path(epoch, name), lambda data, _where: data)
        except CorruptCheckpointError as exc:
            if name != INDEX_RECORD:
                raise
            raise CorruptCheckpointError(
                f"{exc}. It is a segment of the epoch index (what the views show of settled epochs): nothing is "
                "lost, the views read those epochs' records instead, and this file can be deleted", exc.path) from None
