"""Typed models of everything the protocol writes: pydantic dataclasses, one decode.

Records are plain JSON inside a checksummed frame (see :mod:`codec`). Each record is a
frozen pydantic dataclass validated strictly (a bool is not a number, a string not an
integer) with unknown fields refused; :func:`decode` turns any JSON that does not fit
into a :class:`CorruptCheckpointError` naming the file, so a record is never half-used.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass as plain_dataclass
from dataclasses import field
from typing import Annotated, Any, Literal, TypeVar

from annotated_types import Ge, Len
from pydantic import (
    AfterValidator,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
)
from pydantic.dataclasses import dataclass
from typing_extensions import TypedDict

from airflow_seatunnel_ckpt.core.errors import CorruptCheckpointError, IncompatibleFormatError
from airflow_seatunnel_ckpt.core.storage import FileInfo

__all__ = [
    "BeginRecord", "CheckpointMetadata", "CommitResult", "Decision", "DecisionRecord", "EpochState", "EpochStatus",
    "OperatorState", "PartKind", "PartRef", "PreparedRecord", "PublishedSink", "SinkManifest", "SinkMode",
    "SourceState",
]

R = TypeVar("R")

#: Version of the JSON records carrying one (``_metadata``, the descriptor, action records); another
#: version is refused with :class:`IncompatibleFormatError` (a later release adds a migration).
FORMAT_VERSION = 1

RECORD = ConfigDict(strict=True, extra="forbid", frozen=True)


class EpochState(enum.StrEnum):
    """Where an epoch is in its two-phase commit (derived from its write-once records)."""

    OPEN = "OPEN"  #: begun, no participant prepared yet
    PREPARED = "PREPARED"  #: at least one participant prepared, undecided
    COMMITTING = "COMMITTING"  #: decided commit, publish not acknowledged yet (roll forward only)
    COMMITTED = "COMMITTED"
    ABORTING = "ABORTING"  #: decided abort, cleanup not acknowledged yet
    ABORTED = "ABORTED"

    @property
    def decided(self) -> bool:
        """Whether the epoch's single decision record exists."""
        return self in (EpochState.COMMITTING, EpochState.COMMITTED, EpochState.ABORTING, EpochState.ABORTED)

    @property
    def final(self) -> bool:
        """Whether nothing more will ever happen to the epoch."""
        return self in (EpochState.COMMITTED, EpochState.ABORTED)


class Decision(enum.StrEnum):
    """The outcome of an epoch; written once, in one file."""

    COMMIT = "commit"
    ABORT = "abort"


class PartKind(enum.StrEnum):
    """What a state part holds (``PartRef.kind``)."""

    FULL = "full"  #: the whole key group (or source history)
    DELTA = "delta"  #: only the changes against the previous part of its chain


class SinkMode(enum.StrEnum):
    """How a sink's epochs make up its target (``SinkManifest.mode``), one vocabulary for every sink."""

    APPEND = "append"  #: each epoch adds its rows beside the earlier epochs' (the default)
    UPSERT = "upsert"  #: each epoch's rows replace the table's rows with the same ``merge_keys``
    #: each epoch's output is the whole content: a file sink's ``_LATEST`` names the newest
    #: ``epoch=<e>/`` (older ones are removed); a table's rows are replaced
    SNAPSHOT = "snapshot"


def _known_version(value: int, info: ValidationInfo) -> int:
    if value != FORMAT_VERSION:
        where = (info.context or {}).get("where", "<record>")
        raise IncompatibleFormatError(
            f"{where}: format version {value} is not supported (this release reads {FORMAT_VERSION}); read it "
            "with the release that wrote it", where)
    return value


#: A record's ``format_version``: anything but :data:`FORMAT_VERSION` is refused.
FormatVersion = Annotated[int, AfterValidator(_known_version)]


def omitted_if(default: Any) -> Any:
    """A field default that is left out of the stored JSON while it holds ``default``."""
    return Field(default=default, exclude_if=lambda value: value == default)


def tag(name: str) -> Any:
    """The ``type`` field naming a record's kind in its JSON (checked on decode)."""
    return Field(default=name, repr=False)


_ADAPTERS: dict[type[Any], TypeAdapter[Any]] = {}


def _adapter(cls: type[R]) -> TypeAdapter[R]:
    """The (cached) adapter of a record type; two threads racing may each build one, both equal."""
    adapter = _ADAPTERS.get(cls)
    if adapter is None:
        adapter = _ADAPTERS[cls] = TypeAdapter(cls)
    return adapter


def decode(cls: type[R], data: bytes | bytearray | memoryview | Mapping[str, Any], where: str = "<record>") -> R:
    """The record of type ``cls`` in ``data`` (JSON text, or its parsed form).

    :class:`CorruptCheckpointError` naming ``where`` and the offending fields when it does
    not fit (:class:`IncompatibleFormatError` for another format version).
    """
    try:
        if isinstance(data, memoryview):
            data = bytes(data)
        text = data if isinstance(data, (bytes, bytearray)) else json.dumps(data)
        return _adapter(cls).validate_json(text, context={"where": where})
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'the record'}: {e['msg'].lower()}"
            + (f" (found {repr(e['input'])[:80]})" if e["type"] != "missing" else "")
            for e in exc.errors(include_url=False)[:3])
        raise CorruptCheckpointError(f"{where}: not a valid {cls.__name__} record: {problems}", where) from None
    except (TypeError, ValueError) as exc:  # not JSON data at all
        raise CorruptCheckpointError(f"{where}: not a valid {cls.__name__} record: {exc}", where) from None


def encode(record: Any) -> dict[str, Any]:
    """A record as the plain JSON data it is stored as (defaults marked omitted left out)."""
    data: dict[str, Any] = _adapter(type(record)).dump_python(record, mode="json")
    return data


class Record:
    """``to_dict`` / ``from_dict`` of a record type: :func:`encode` and :func:`decode`."""

    def to_dict(self) -> dict[str, Any]:
        """The record as stored (plain JSON data)."""
        return encode(self)

    @classmethod
    def from_dict(cls: type[R], d: Any, path: str = "<record>") -> R:
        """The record in ``d`` (parsed JSON); CorruptCheckpointError naming ``path`` if it does not fit."""
        return decode(cls, d, path)


@dataclass(config=RECORD)
class PartRef(Record):
    """One checkpoint part file: where it is, how big, its checksum, and what it holds."""

    path: str  #: relative to the pipeline root
    size: int
    crc32c: int  #: checksum of the whole stored file
    epoch: int  #: the epoch that wrote it (may be older than the checkpoint using it)
    key_group: int = 0
    kind: PartKind = PartKind.FULL
    #: Byte offset of a sorted run's index in the file; None for a part read whole.
    index: int | None = omitted_if(None)


#: A key group's restore recipe: one full part followed by the deltas to apply in order.
Chain = list[PartRef]


class Column(TypedDict):
    """One column of a keyed state: its name and Spark's type name."""

    name: str
    type: str


#: A key -> value state's aggregate: output column -> ``[function, input column]`` (a tuple is taken as a list).
Aggregate = dict[str, Annotated[list[str], Strict(False), Len(2, 2)]]


@dataclass(config=RECORD)
class StateShape(Record):
    """What a keyed state's stored values mean beyond its kind, keys and key groups.

    Recorded by the epoch that updated the state, so that every run restoring it can refuse
    an update that would misread the stored values. ``aggregate`` is None for a key set.
    """

    aggregate: Aggregate | None = None
    schema: list[Column] | None = None


@dataclass(config=RECORD)
class OperatorState(Record):
    """The keyed state of one operator in one checkpoint: a chain per key group, and its shape."""

    key_groups: int
    key_columns: list[str]
    chains: dict[Annotated[int, Ge(0)], Chain]
    state_kind: str = "key_set"  #: "key_set" or "key_value"
    shape: StateShape | None = omitted_if(None)

    def parts(self) -> list[PartRef]:
        """Every part any chain needs."""
        return [p for chain in self.chains.values() for p in chain]


@dataclass(config=RECORD)
class SourceState(Record):
    """What a source consumed: this epoch's offsets (the WAL entry) and its checkpoint chain
    (every committed epoch's offsets: a full part, then one delta part per later epoch)."""

    offsets: dict[str, Any]  #: e.g. {"files": [...]} for the file source
    chain: list[PartRef] = Field(default_factory=list)


@dataclass(config=RECORD)
class ExpectationResult(Record):
    """One data-quality rule of a sink, measured on the rows an attempt staged.

    ``failed`` of the ``checked`` rows did not satisfy ``expr`` (false or NULL); the thresholds
    are the rule's, so the decision needs nothing but the prepared record.
    """

    name: str
    expr: str
    on_fail: str  #: ``warn`` | ``drop`` | ``quarantine`` | ``fail``
    checked: int
    failed: int
    max_fraction: float | None = omitted_if(None)
    max_rows: int | None = omitted_if(None)

    @property
    def fraction(self) -> float:
        """Failed rows over checked rows (0.0 when nothing was checked)."""
        return self.failed / self.checked if self.checked else 0.0


def _typed_options(options: Any) -> Any:
    from airflow_seatunnel_ckpt.core.sinks.options import recorded_options  # the sinks' models, on first use

    return recorded_options(options)


@dataclass(config=RECORD)
class SinkManifest(Record):
    """What one sink staged in one attempt: the files to publish, with sizes and rows."""

    sink: str
    target_url: str  #: where the sink publishes: ``<target_url>/epoch=<e>/``
    staging: str  #: staging directory, relative to the pipeline root
    files: list[FileInfo]  #: relative to ``staging``
    rows: int
    format: str = "parquet"
    mode: SinkMode = omitted_if(SinkMode.APPEND)
    #: A table sink's typed options (:data:`core.sinks.options.SinkOptions`, never secrets): the
    #: commit adds the staged files to that table in one transaction. None for a file sink.
    table: Annotated[Any, BeforeValidator(_typed_options)] = omitted_if(None)
    #: The sink's expectations as measured when the rows were staged.
    expectations: tuple[ExpectationResult, ...] = omitted_if(())
    #: A replay's table sink: the epochs whose data files the commit removes in the same transaction.
    replaces: tuple[Annotated[int, Field(gt=0)], ...] = omitted_if(())
    #: The replay was forced past commits to the table by another writer (``--force``).
    force_replace: bool = omitted_if(False)
    #: The replay runs from the sink's first epoch: an upsert sink's commit replaces the whole table.
    full_refresh: bool = omitted_if(False)

    def __post_init__(self) -> None:
        # One mode for the manifest and its table's options: where one of them names a mode
        # and the other is left at the default (append), the one named is the sink's.
        if self.table is not None and not isinstance(self.table, dict) and self.table.mode != self.mode:
            modes = {self.mode.value, self.table.mode} - {SinkMode.APPEND.value}
            if len(modes) != 1:
                raise ValueError(f"sink {self.sink!r}: mode {self.mode.value!r} and its options' mode "
                                 f"{self.table.mode!r} disagree")
            (mode,) = modes
            object.__setattr__(self, "mode", SinkMode(mode))
            object.__setattr__(self, "table", _typed_options({**self.table.to_dict(), "mode": mode}))

    @property
    def bytes(self) -> int:
        """Total size of the staged files."""
        return sum(f.size for f in self.files)

    @property
    def publishes(self) -> bool:
        """Whether committing the epoch publishes anything for this sink.

        Not an ``append`` or ``upsert`` sink without rows; always a ``snapshot`` sink (an
        empty snapshot is an empty table) and a replay's (it removes the replaced epochs' rows).
        """
        return self.rows > 0 or self.mode is SinkMode.SNAPSHOT or bool(self.replaces)


@dataclass(config=RECORD)
class BeginRecord(Record):
    """``begin``: the epoch was given to a run."""

    epoch: int
    run_id: str
    created_at: float
    dag_id: str = omitted_if("")
    logical_date: str = omitted_if("")
    type: Literal["begin"] = tag("begin")


@dataclass(config=RECORD)
class PreparedRecord(Record):
    """``prepared-<participant>``: the winning attempt's output, state and consumed input.

    It doubles as the write-ahead log: ``sources`` names exactly what the epoch read.
    """

    epoch: int
    participant: str
    attempt: int
    run_id: str
    prepared_at: float
    sinks: list[SinkManifest]
    operators: dict[str, OperatorState]
    sources: dict[str, SourceState]
    base_epoch: int | None = None  #: the committed checkpoint restored from (None: empty state)
    #: Sinks the stage declared but did not write this epoch.
    not_written: list[str] = Field(default_factory=list, exclude_if=lambda value: not value)
    type: Literal["prepared"] = tag("prepared")

    @property
    def rows(self) -> int:
        """Rows staged over every sink of the participant."""
        return sum(s.rows for s in self.sinks)


def unprepared(prepared: Mapping[str, PreparedRecord], participants: Sequence[str]) -> list[str]:
    """The names in ``participants`` that have no prepared record, in their order."""
    return [name for name in dict.fromkeys(participants) if name not in prepared]


@dataclass(config=RECORD)
class DecisionRecord(Record):
    """``decision``: commit or abort -- one file per epoch, created exclusively."""

    epoch: int
    decision: Decision
    reason: str
    by: str
    decided_at: float
    participants: dict[str, int] = Field(default_factory=dict)  #: participant -> winning attempt
    type: Literal["decision"] = tag("decision")


#: ``PublishedSink.how`` when nothing was published: the sink staged no rows, the stage did not
#: write it, an operator skipped it (``seatunnel-ckpt resolve --skip-sink``: its table refused).
EMPTY = "empty"
NOT_WRITTEN = "not_written"
SKIPPED = "skipped"


@dataclass(config=RECORD)
class PublishedSink(Record):
    """One sink's published output for an epoch."""

    sink: str
    target_url: str
    epoch_dir: str
    files: int
    rows: int
    bytes: int
    how: str = ""  #: a :class:`PublishMethod` value, or :data:`EMPTY`, :data:`NOT_WRITTEN`, :data:`SKIPPED`

    @property
    def published(self) -> bool:
        """Whether the epoch has a published directory in the sink's target."""
        return self.how not in (EMPTY, NOT_WRITTEN, SKIPPED)


@plain_dataclass(frozen=True)
class CommitResult:
    """What :meth:`Pipeline.commit` published (or found already published)."""

    epoch: int
    sinks: list[PublishedSink]
    already_committed: bool = False
    #: Sinks whose target already held the epoch when a roll-forward asked it: not committed again.
    held: tuple[str, ...] = ()

    @property
    def rows(self) -> int:
        """Rows published over every sink."""
        return sum(s.rows for s in self.sinks)

    @property
    def not_written(self) -> list[str]:
        """Sinks the stages declared but did not write in the epoch."""
        return sorted(s.sink for s in self.sinks if s.how == NOT_WRITTEN)

    @property
    def empty(self) -> list[str]:
        """Sinks that staged no rows, so the epoch published nothing for them."""
        return sorted(s.sink for s in self.sinks if s.how == EMPTY)

    def to_dict(self) -> dict[str, Any]:
        """Plain data for XCom and ``--json`` output."""
        return {"epoch": self.epoch, "already_committed": self.already_committed,
                "sinks": [s.to_dict() for s in self.sinks], "not_written": self.not_written,
                "empty": self.empty, "held": list(self.held)}


@dataclass(config=RECORD)
class CheckpointMetadata(Record):
    """``checkpoint_<e>/_metadata``: the complete, committed description of a checkpoint."""

    epoch: int
    created_at: float
    run_id: str
    participants: dict[str, int]
    base_epoch: int | None  #: the previous committed checkpoint this one builds on
    operators: dict[str, OperatorState]
    sources: dict[str, SourceState]
    sinks: dict[str, PartRef]  #: the ``_prepared`` marker of every sink
    format_version: FormatVersion = FORMAT_VERSION
    source_metas: dict[str, PartRef] = Field(default_factory=dict)
    type: Literal["checkpoint"] = tag("checkpoint")

    def parts(self) -> list[PartRef]:
        """Every file the checkpoint needs, wherever it lives (incremental parts included)."""
        out = [p for op in self.operators.values() for p in op.parts()]
        out += [p for s in self.sources.values() for p in s.chain]
        out += list(self.sinks.values())
        out += list(self.source_metas.values())
        return out


@plain_dataclass(frozen=True)
class EpochStatus:
    """Everything the transaction log says about one epoch."""

    epoch: int
    state: EpochState
    begin: BeginRecord | None
    prepared: dict[str, PreparedRecord]
    decision: DecisionRecord | None
    published: list[PublishedSink] = field(default_factory=list)

    @property
    def run_id(self) -> str | None:
        """The run the epoch was given to."""
        return self.begin.run_id if self.begin else None

    def rows_per_sink(self) -> dict[str, int]:
        """Rows per sink: the published ones once committed, else what the participants staged."""
        return self._per_sink(lambda published: published.rows, lambda staged: staged.rows)

    def files_per_sink(self) -> dict[str, int]:
        """Files per sink: the published ones once committed, else what the participants staged."""
        return self._per_sink(lambda published: published.files, lambda staged: len(staged.files))

    def _per_sink(self, of_published: Callable[[PublishedSink], int],
                  of_staged: Callable[[SinkManifest], int]) -> dict[str, int]:
        if self.published:
            return dict(sorted((pub.sink, of_published(pub)) for pub in self.published))
        out: dict[str, int] = {}
        for record in self.prepared.values():
            for manifest in record.sinks:
                out[manifest.sink] = out.get(manifest.sink, 0) + of_staged(manifest)
        return dict(sorted(out.items()))

    def to_dict(self) -> dict[str, Any]:
        """A summary for logs, XCom and ``--json`` output (no secrets)."""
        return {
            "epoch": self.epoch, "state": self.state.value, "run_id": self.run_id,
            "created_at": self.begin.created_at if self.begin else None,
            "participants": {k: {"attempt": v.attempt, "rows": v.rows, "sinks": [s.sink for s in v.sinks]}
                             for k, v in sorted(self.prepared.items())},
            "decision": self.decision.to_dict() if self.decision else None,
            "published": [p.to_dict() for p in self.published],
        }


class ActionOutcome(enum.StrEnum):
    """How an operator's action on an epoch ended (``OutcomeRecord.outcome``)."""

    SUCCEEDED = "succeeded"  #: done as asked
    REFUSED = "refused"  #: not done: the epoch's state does not allow it (nothing changed)
    FAILED = "failed"  #: tried and failed (``detail`` holds the error); the next try may succeed


@dataclass(config=RECORD)
class ActionRecord(Record):
    """``action-<ns>-<action>``: who did what to an epoch, and why, written before doing it (audit only)."""

    epoch: int
    action: str
    by: str
    reason: str
    at: float
    details: dict[str, str | int | float | bool | None] = Field(default_factory=dict)
    format_version: FormatVersion = FORMAT_VERSION
    type: Literal["action"] = tag("action")


@dataclass(config=RECORD)
class OutcomeRecord(Record):
    """``outcome-<ns>-<action>``: how the action of the same name suffix ended (none: interrupted)."""

    epoch: int
    action: str
    outcome: ActionOutcome
    detail: str
    at: float
    format_version: FormatVersion = FORMAT_VERSION
    type: Literal["action-outcome"] = tag("action-outcome")


@plain_dataclass(frozen=True)
class ActionEntry:
    """One action on an epoch with its outcome (None: none recorded, the action was interrupted)."""

    name: str  #: the action record's file name in the epoch's log directory
    record: ActionRecord
    outcome: OutcomeRecord | None
