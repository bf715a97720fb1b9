"""Typed models of everything the protocol writes, with explicit (de)serialisation.

Records are plain JSON inside a checksummed frame (see :mod:`codec`). ``from_dict``
checks every field's type, so a record that decodes but has the wrong shape is reported
as corrupt with the file named, never half-used.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from airflow_seatunnel_ckpt.core.errors import CorruptCheckpointError, IncompatibleFormatError
from airflow_seatunnel_ckpt.core.storage import FileInfo

T = TypeVar("T")


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
    """How a sink's epochs make up its target (``SinkManifest.mode``).

    ``changes`` (the default): each epoch publishes what it wrote into its own
    ``epoch=<e>/`` directory and readers of the target see every epoch's rows (an
    append-only table); an epoch that wrote no rows publishes nothing. ``snapshot``: each
    epoch's output *is* the whole table (e.g. a keyed state's current values); once the
    newest ``epoch=<e>/`` is published the older snapshot directories are removed and the
    target's ``_LATEST`` names the current one, so readers see the current state only.
    """

    CHANGES = "changes"
    SNAPSHOT = "snapshot"


def _get(data: Mapping[str, Any], key: str, kind: type[T] | tuple[type, ...], path: str, optional: bool = False) -> T:
    if not isinstance(data, Mapping):
        raise CorruptCheckpointError(f"{path}: expected a JSON object, found {type(data).__name__}", path)
    if key not in data or data[key] is None:
        if optional:
            return None  # type: ignore[return-value]
        raise CorruptCheckpointError(f"{path}: field {key!r} is missing", path)
    value = data[key]
    if isinstance(value, bool) and kind in (int, float, (int, float)):
        raise CorruptCheckpointError(f"{path}: field {key!r} should be a number, found {value!r}", path)
    if not isinstance(value, kind):
        raise CorruptCheckpointError(
            f"{path}: field {key!r} should be {getattr(kind, '__name__', kind)}, found {type(value).__name__}", path
        )
    return value  # type: ignore[return-value]


@dataclass(frozen=True)
class PartRef:
    """One checkpoint part file: where it is, how big, its checksum, and what it holds."""

    path: str  #: relative to the pipeline root
    size: int
    crc32c: int  #: checksum of the whole stored file
    epoch: int  #: the epoch that wrote it (may be older than the checkpoint using it)
    key_group: int = 0
    kind: PartKind = PartKind.FULL
    #: Byte offset of a sorted run's index in the file (``core/runs.py``); None for a
    #: part read whole (every part written before sorted runs).
    index: int | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path, "size": self.size, "crc32c": self.crc32c, "epoch": self.epoch,
                               "key_group": self.key_group, "kind": str(self.kind)}
        if self.index is not None:
            out["index"] = self.index
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], path: str = "<record>") -> PartRef:
        # Records list every part of every chain: the well-formed case is checked in one
        # pass (exact types: a bool is not a number), anything else by the field checker.
        if type(d) is dict:
            index = d.get("index")
            values = (d.get("path"), d.get("size"), d.get("crc32c"), d.get("epoch"), d.get("key_group"))
            raw_kind = d.get("kind")
            kind = _PART_KINDS.get(raw_kind) if type(raw_kind) is str else None
            if (kind is not None and type(values[0]) is str and all(type(v) is int for v in values[1:])
                    and (index is None or type(index) is int)):
                return cls(*values, kind, index)  # type: ignore[arg-type]
        raw = _get(d, "kind", str, path)
        try:
            kind = PartKind(raw)
        except ValueError:
            raise CorruptCheckpointError(f"{path}: part kind must be full or delta, found {raw!r}", path) from None
        return cls(_get(d, "path", str, path), _get(d, "size", int, path), _get(d, "crc32c", int, path),
                   _get(d, "epoch", int, path), _get(d, "key_group", int, path), kind,
                   _get(d, "index", int, path, optional=True))


_PART_KINDS = {str(k): k for k in PartKind}

#: A key group's restore recipe: one full part followed by the deltas to apply in order.
Chain = list[PartRef]


@dataclass(frozen=True)
class StateShape:
    """What a keyed state's stored values mean beyond its kind, keys and key groups.

    Recorded with the state's chains (``OperatorState.shape``) by the epoch that updated
    it, so every run restoring the checkpoint can refuse an update that would misread
    the stored values, whoever runs it. ``aggregate`` maps a key -> value state's output
    column to ``[function, input column]`` (None for a key set); ``schema`` is the
    state's columns as ``[{"name": ..., "type": ...}]`` (Spark's type names).
    """

    aggregate: dict[str, list[str]] | None = None
    schema: list[dict[str, str]] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"aggregate": {k: list(v) for k, v in sorted(self.aggregate.items())} if self.aggregate else None,
                "schema": [dict(c) for c in self.schema] if self.schema is not None else None}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], path: str = "<record>") -> StateShape:
        aggregate = _get(d, "aggregate", dict, path, optional=True)
        if aggregate is not None and not all(
                isinstance(v, list) and len(v) == 2 and all(isinstance(x, str) for x in v) for v in aggregate.values()):
            raise CorruptCheckpointError(f"{path}: state aggregate must map a column to [function, column]", path)
        schema = _get(d, "schema", list, path, optional=True)
        if schema is not None and not all(
                isinstance(c, dict) and isinstance(c.get("name"), str) and isinstance(c.get("type"), str)
                for c in schema):
            raise CorruptCheckpointError(f"{path}: state schema must be a list of {{name, type}}", path)
        return cls({k: list(v) for k, v in aggregate.items()} if aggregate is not None else None,
                   [{"name": c["name"], "type": c["type"]} for c in schema] if schema is not None else None)


@dataclass(frozen=True)
class OperatorState:
    """The keyed state of one operator in one checkpoint: a chain per key group, and its shape."""

    key_groups: int
    key_columns: list[str]
    chains: dict[int, Chain]
    state_kind: str = "key_set"  #: "key_set" or "key_value"
    #: Aggregate and columns, as the epoch that last updated the state wrote them (None in
    #: records written before states recorded their shape).
    shape: StateShape | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {"key_groups": self.key_groups, "key_columns": list(self.key_columns), "state_kind": self.state_kind,
               "chains": {str(k): [p.to_dict() for p in chain] for k, chain in sorted(self.chains.items())}}
        if self.shape is not None:
            out["shape"] = self.shape.to_dict()
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], path: str = "<record>") -> OperatorState:
        chains_raw = _get(d, "chains", dict, path)
        chains: dict[int, Chain] = {}
        for k, chain in chains_raw.items():
            if not str(k).isdigit() or not isinstance(chain, list):
                raise CorruptCheckpointError(f"{path}: bad key group entry {k!r}", path)
            chains[int(k)] = [PartRef.from_dict(p, path) for p in chain]
        cols = _get(d, "key_columns", list, path)
        if not all(isinstance(c, str) for c in cols):
            raise CorruptCheckpointError(f"{path}: key_columns must be strings", path)
        shape = _get(d, "shape", dict, path, optional=True)
        return cls(_get(d, "key_groups", int, path), cols, chains, _get(d, "state_kind", str, path),
                   StateShape.from_dict(shape, path) if shape is not None else None)

    def parts(self) -> list[PartRef]:
        """Every part any chain needs."""
        return [p for chain in self.chains.values() for p in chain]


@dataclass(frozen=True)
class SourceState:
    """What a source consumed: this epoch's offsets (the WAL entry) and its checkpoint chain.

    The chain's parts hold every committed epoch's offsets up to this one: a full part
    with all of them, then one delta part per later epoch (see ``full_checkpoint_interval``).
    """

    offsets: dict[str, Any]  #: e.g. {"files": [...]} for the file source
    chain: list[PartRef] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"offsets": self.offsets, "chain": [p.to_dict() for p in self.chain]}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], path: str = "<record>") -> SourceState:
        return cls(_get(d, "offsets", dict, path), [PartRef.from_dict(p, path) for p in _get(d, "chain", list, path)])


@dataclass(frozen=True)
class ExpectationResult:
    """One data-quality rule of a sink, measured on the rows an attempt staged.

    ``checked`` rows were evaluated, ``failed`` of them did not satisfy ``expr`` (false or
    NULL). The thresholds are the rule's as declared (None: none), so the decision needs
    nothing but the prepared record.
    """

    name: str
    expr: str
    on_fail: str  #: ``warn`` | ``drop`` | ``quarantine`` | ``fail``
    checked: int
    failed: int
    max_fraction: float | None = None
    max_rows: int | None = None

    @property
    def fraction(self) -> float:
        """Failed rows over checked rows (0.0 when nothing was checked)."""
        return self.failed / self.checked if self.checked else 0.0

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "expr": self.expr, "on_fail": self.on_fail,
                               "checked": self.checked, "failed": self.failed}
        if self.max_fraction is not None:
            out["max_fraction"] = self.max_fraction
        if self.max_rows is not None:
            out["max_rows"] = self.max_rows
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], path: str = "<record>") -> ExpectationResult:
        return cls(_get(d, "name", str, path), _get(d, "expr", str, path), _get(d, "on_fail", str, path),
                   _get(d, "checked", int, path), _get(d, "failed", int, path),
                   _get(d, "max_fraction", (int, float), path, optional=True),
                   _get(d, "max_rows", int, path, optional=True))


@dataclass(frozen=True)
class SinkManifest:
    """What one sink staged in one attempt: the files to publish, with sizes and rows."""

    sink: str
    target_url: str  #: where the sink publishes: ``<target_url>/epoch=<e>/``
    staging: str  #: staging directory, relative to the pipeline root
    files: list[FileInfo]  #: relative to ``staging``
    rows: int
    format: str = "parquet"
    mode: SinkMode = SinkMode.CHANGES  #: stored only when not the default (older records lack it)
    #: A table sink's options (``{"type": "iceberg" | "delta", ...}``, never secrets): the
    #: commit adds the staged files to that table in one transaction instead of publishing
    #: ``<target_url>/epoch=<e>/`` (see :mod:`core.tables`). None for a file sink.
    table: Mapping[str, Any] | None = None
    #: The sink's expectations as measured when the rows were staged (see
    #: :mod:`core.expectations`); empty when the sink declares none (stored only when not).
    expectations: tuple[ExpectationResult, ...] = ()

    @property
    def bytes(self) -> int:
        """Total size of the staged files."""
        return sum(f.size for f in self.files)

    @property
    def publishes(self) -> bool:
        """Whether committing the epoch publishes anything for this sink.

        A ``changes`` sink with no rows publishes nothing: no empty ``epoch=<e>/``
        directory, no ``_SUCCESS``, no asset event. A ``snapshot`` sink always publishes,
        since its output replaces the table (an empty snapshot is an empty table).
        """
        return self.rows > 0 or self.mode is SinkMode.SNAPSHOT

    def to_dict(self) -> dict[str, Any]:
        out = {"sink": self.sink, "target_url": self.target_url, "staging": self.staging, "format": self.format,
               "rows": self.rows, "files": [{"path": f.path, "size": f.size, "crc32c": f.crc32c}
                                            for f in self.files]}
        if self.mode is not SinkMode.CHANGES:
            out["mode"] = self.mode.value
        if self.table is not None:
            out["table"] = dict(self.table)
        if self.expectations:
            out["expectations"] = [e.to_dict() for e in self.expectations]
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], path: str = "<record>") -> SinkManifest:
        files = []
        for f in _get(d, "files", list, path):
            files.append(FileInfo(_get(f, "path", str, path), _get(f, "size", int, path),
                                  _get(f, "crc32c", int, path, optional=True)))
        raw_mode = _get(d, "mode", str, path, optional=True) or SinkMode.CHANGES.value
        try:
            mode = SinkMode(raw_mode)
        except ValueError:
            raise CorruptCheckpointError(
                f"{path}: sink mode must be one of {[m.value for m in SinkMode]}, found {raw_mode!r}", path) from None
        table = _get(d, "table", dict, path, optional=True)
        if table is not None and not isinstance(table.get("type"), str):
            raise CorruptCheckpointError(f"{path}: a table sink's options must name its type, found {table!r}", path)
        expectations = tuple(ExpectationResult.from_dict(e, path)
                             for e in _get(d, "expectations", list, path, optional=True) or [])
        return cls(_get(d, "sink", str, path), _get(d, "target_url", str, path), _get(d, "staging", str, path),
                   files, _get(d, "rows", int, path), _get(d, "format", str, path), mode, table, expectations)


@dataclass(frozen=True)
class BeginRecord:
    """``begin``: the epoch was given to a run."""

    epoch: int
    run_id: str
    created_at: float
    dag_id: str = ""
    #: the Airflow logical date of the run (ISO 8601); "" when begun outside Airflow or by an
    #: earlier release (written only when set, so older readers see the record they know)
    logical_date: str = ""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "begin", "epoch": self.epoch, "run_id": self.run_id,
                               "created_at": self.created_at}
        if self.dag_id:
            out["dag_id"] = self.dag_id
        if self.logical_date:
            out["logical_date"] = self.logical_date
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], path: str = "<record>") -> BeginRecord:
        return cls(_get(d, "epoch", int, path), _get(d, "run_id", str, path), _get(d, "created_at", (int, float), path),
                   _get(d, "dag_id", str, path, optional=True) or "",
                   _get(d, "logical_date", str, path, optional=True) or "")


@dataclass(frozen=True)
class PreparedRecord:
    """``prepared-<participant>``: the winning attempt's output, state and consumed input.

    It doubles as the write-ahead log: ``sources`` names exactly what the epoch read, so
    a retry re-reads the same input and a damaged source part can be rebuilt from the log.
    """

    epoch: int
    participant: str
    attempt: int
    run_id: str
    prepared_at: float
    sinks: list[SinkManifest]
    operators: dict[str, OperatorState]
    sources: dict[str, SourceState]
    #: The committed checkpoint the participant restored from (None: empty state).
    base_epoch: int | None = None
    #: Sinks the stage declared but did not write this epoch (stored only when any).
    not_written: list[str] = field(default_factory=list)

    @property
    def rows(self) -> int:
        """Rows staged over every sink of the participant."""
        return sum(s.rows for s in self.sinks)

    def to_dict(self) -> dict[str, Any]:
        out = {"type": "prepared", "epoch": self.epoch, "participant": self.participant, "attempt": self.attempt,
               "run_id": self.run_id, "prepared_at": self.prepared_at,
               "sinks": [s.to_dict() for s in self.sinks],
               "operators": {k: v.to_dict() for k, v in sorted(self.operators.items())},
               "sources": {k: v.to_dict() for k, v in sorted(self.sources.items())},
               "base_epoch": self.base_epoch}
        if self.not_written:
            out["not_written"] = sorted(self.not_written)
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], path: str = "<record>") -> PreparedRecord:
        return cls(
            _get(d, "epoch", int, path), _get(d, "participant", str, path), _get(d, "attempt", int, path),
            _get(d, "run_id", str, path), _get(d, "prepared_at", (int, float), path),
            [SinkManifest.from_dict(s, path) for s in _get(d, "sinks", list, path)],
            {k: OperatorState.from_dict(v, path) for k, v in _get(d, "operators", dict, path).items()},
            {k: SourceState.from_dict(v, path) for k, v in _get(d, "sources", dict, path).items()},
            _get(d, "base_epoch", int, path, optional=True),
            _names(_get(d, "not_written", list, path, optional=True) or [], "not_written", path),
        )


def _names(values: list[Any], key: str, path: str) -> list[str]:
    if not all(isinstance(v, str) for v in values):
        raise CorruptCheckpointError(f"{path}: field {key!r} must list strings", path)
    return list(values)


def unprepared(prepared: Mapping[str, PreparedRecord], participants: Sequence[str]) -> list[str]:
    """The names in ``participants`` that have no prepared record, in their order.

    The one "who still has to prepare" rule of the sensor, the trigger and the commit
    decision.
    """
    return [name for name in dict.fromkeys(participants) if name not in prepared]


@dataclass(frozen=True)
class DecisionRecord:
    """``decision``: commit or abort -- one file per epoch, created exclusively."""

    epoch: int
    decision: Decision
    reason: str
    by: str
    decided_at: float
    participants: dict[str, int] = field(default_factory=dict)  #: participant -> winning attempt

    def to_dict(self) -> dict[str, Any]:
        return {"type": "decision", "epoch": self.epoch, "decision": self.decision.value, "reason": self.reason,
                "by": self.by, "decided_at": self.decided_at, "participants": dict(sorted(self.participants.items()))}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], path: str = "<record>") -> DecisionRecord:
        raw = _get(d, "decision", str, path)
        try:
            decision = Decision(raw)
        except ValueError as exc:
            raise CorruptCheckpointError(f"{path}: unknown decision {raw!r}", path) from exc
        parts = _get(d, "participants", dict, path)
        if not all(isinstance(v, int) for v in parts.values()):
            raise CorruptCheckpointError(f"{path}: participant attempts must be integers", path)
        return cls(_get(d, "epoch", int, path), decision, _get(d, "reason", str, path), _get(d, "by", str, path),
                   _get(d, "decided_at", (int, float), path), parts)


#: ``PublishedSink.how`` of a sink that staged no rows: nothing was published.
EMPTY = "empty"
#: ``PublishedSink.how`` of a sink the stage declared but did not write in the epoch.
NOT_WRITTEN = "not_written"
#: ``PublishedSink.how`` of a sink an operator skipped (``seatunnel-ckpt resolve --skip-sink``):
#: its table refused the commit-decided epoch, and the epoch committed without it.
SKIPPED = "skipped"


@dataclass(frozen=True)
class PublishedSink:
    """One sink's published output for an epoch."""

    sink: str
    target_url: str
    epoch_dir: str
    files: int
    rows: int
    bytes: int
    #: "renamed", "copied" or "already"; "empty" when the sink staged no rows and nothing
    #: was published (no directory, no ``_SUCCESS``), "not_written" when the stage did not
    #: write the sink at all, "skipped" when an operator published the epoch without it
    #: (see :attr:`published`)
    how: str = ""

    @property
    def published(self) -> bool:
        """Whether the epoch has a published directory in the sink's target."""
        return self.how not in (EMPTY, NOT_WRITTEN, SKIPPED)

    def to_dict(self) -> dict[str, Any]:
        return {"sink": self.sink, "target_url": self.target_url, "epoch_dir": self.epoch_dir, "files": self.files,
                "rows": self.rows, "bytes": self.bytes, "how": self.how}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], path: str = "<record>") -> PublishedSink:
        return cls(_get(d, "sink", str, path), _get(d, "target_url", str, path), _get(d, "epoch_dir", str, path),
                   _get(d, "files", int, path), _get(d, "rows", int, path), _get(d, "bytes", int, path),
                   _get(d, "how", str, path, optional=True) or "")


@dataclass(frozen=True)
class CommitResult:
    """What :meth:`Pipeline.commit` published (or found already published)."""

    epoch: int
    sinks: list[PublishedSink]
    already_committed: bool = False

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
                "empty": self.empty}


@dataclass(frozen=True)
class CheckpointMetadata:
    """``checkpoint_<e>/_metadata``: the complete, committed description of a checkpoint."""

    epoch: int
    created_at: float
    run_id: str
    participants: dict[str, int]
    base_epoch: int | None  #: the previous committed checkpoint this one builds on
    operators: dict[str, OperatorState]
    sources: dict[str, SourceState]
    sinks: dict[str, PartRef]  #: the ``_prepared`` marker of every sink
    format_version: int = 1
    #: the ``sources/<source>/_meta`` marker of every source (absent in early checkpoints)
    source_metas: dict[str, PartRef] = field(default_factory=dict)

    def parts(self) -> list[PartRef]:
        """Every file the checkpoint needs, wherever it lives (incremental parts included)."""
        out = [p for op in self.operators.values() for p in op.parts()]
        out += [p for s in self.sources.values() for p in s.chain]
        out += list(self.sinks.values())
        out += list(self.source_metas.values())
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"type": "checkpoint", "format_version": self.format_version, "epoch": self.epoch,
                "created_at": self.created_at, "run_id": self.run_id,
                "participants": dict(sorted(self.participants.items())), "base_epoch": self.base_epoch,
                "operators": {k: v.to_dict() for k, v in sorted(self.operators.items())},
                "sources": {k: v.to_dict() for k, v in sorted(self.sources.items())},
                "sinks": {k: v.to_dict() for k, v in sorted(self.sinks.items())},
                "source_metas": {k: v.to_dict() for k, v in sorted(self.source_metas.items())}}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], path: str = "<record>") -> CheckpointMetadata:
        from airflow_seatunnel_ckpt.core.errors import IncompatibleFormatError

        version = _get(d, "format_version", int, path)
        if version != 1:
            raise IncompatibleFormatError(
                f"{path}: _metadata format version {version} is not supported (this release reads 1)", path)
        return cls(
            _get(d, "epoch", int, path), _get(d, "created_at", (int, float), path), _get(d, "run_id", str, path),
            _get(d, "participants", dict, path), _get(d, "base_epoch", int, path, optional=True),
            {k: OperatorState.from_dict(v, path) for k, v in _get(d, "operators", dict, path).items()},
            {k: SourceState.from_dict(v, path) for k, v in _get(d, "sources", dict, path).items()},
            {k: PartRef.from_dict(v, path) for k, v in _get(d, "sinks", dict, path).items()},
            version,
            {k: PartRef.from_dict(v, path)
             for k, v in (_get(d, "source_metas", dict, path, optional=True) or {}).items()},
        )


@dataclass(frozen=True)
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


#: Format version of the ``action-*`` and ``outcome-*`` records this release writes and reads.
ACTION_FORMAT_VERSION = 1


class ActionOutcome(enum.StrEnum):
    """How an operator's action on an epoch ended (``OutcomeRecord.outcome``)."""

    SUCCEEDED = "succeeded"  #: done as asked
    REFUSED = "refused"  #: not done: the epoch's state does not allow it (nothing changed)
    FAILED = "failed"  #: tried and failed (``detail`` holds the error); the next try may succeed


def _format_version(d: Mapping[str, Any], path: str, what: str) -> int:
    """The record's ``format_version`` (1 when absent: the first action records had none)."""
    version = _get(d, "format_version", int, path, optional=True)
    if version is None:
        return ACTION_FORMAT_VERSION
    if version != ACTION_FORMAT_VERSION:
        raise IncompatibleFormatError(
            f"{path}: {what} record format version {version} is not supported (this release reads "
            f"{ACTION_FORMAT_VERSION}); read it with the release that wrote it", path)
    return version


def _expect_type(d: Mapping[str, Any], expected: str, path: str) -> None:
    found = _get(d, "type", str, path)
    if found != expected:
        raise CorruptCheckpointError(f"{path}: expected a record of type {expected!r}, found {found!r}", path)


@dataclass(frozen=True)
class ActionRecord:
    """``action-<ns>-<action>``: who did what to an epoch, and why, written before doing it.

    An audit record only: an epoch's state never depends on it. ``details`` are further
    plain values the caller gave (strings and numbers).
    """

    epoch: int
    action: str
    by: str
    reason: str
    at: float
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"type": "action", "format_version": ACTION_FORMAT_VERSION, "epoch": self.epoch,
                "action": self.action, "by": self.by, "reason": self.reason, "at": self.at, **self.details}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], path: str = "<record>") -> ActionRecord:
        _expect_type(d, "action", path)
        _format_version(d, path, "action")
        known = {"type", "format_version", "epoch", "action", "by", "reason", "at"}
        details = {k: v for k, v in d.items() if k not in known}
        if not all(isinstance(v, (str, int, float, bool)) or v is None for v in details.values()):
            raise CorruptCheckpointError(f"{path}: an action record's further fields must be plain values", path)
        return cls(_get(d, "epoch", int, path), _get(d, "action", str, path), _get(d, "by", str, path),
                   _get(d, "reason", str, path), _get(d, "at", (int, float), path), details)


@dataclass(frozen=True)
class OutcomeRecord:
    """``outcome-<ns>-<action>``: how the action of the same name suffix ended.

    Written once the action is over; an action record without one was interrupted (its
    outcome is unknown, the epoch's state tells what happened).
    """

    epoch: int
    action: str
    outcome: ActionOutcome
    detail: str
    at: float

    def to_dict(self) -> dict[str, Any]:
        return {"type": "action-outcome", "format_version": ACTION_FORMAT_VERSION, "epoch": self.epoch,
                "action": self.action, "outcome": self.outcome.value, "detail": self.detail, "at": self.at}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], path: str = "<record>") -> OutcomeRecord:
        _expect_type(d, "action-outcome", path)
        _format_version(d, path, "action outcome")
        raw = _get(d, "outcome", str, path)
        try:
            outcome = ActionOutcome(raw)
        except ValueError:
            raise CorruptCheckpointError(
                f"{path}: outcome must be one of {[o.value for o in ActionOutcome]}, found {raw!r}", path) from None
        return cls(_get(d, "epoch", int, path), _get(d, "action", str, path), outcome,
                   _get(d, "detail", str, path), _get(d, "at", (int, float), path))


@dataclass(frozen=True)
class ActionEntry:
    """One action on an epoch with its outcome (None: none recorded, the action was interrupted)."""

    name: str  #: the action record's file name in the epoch's log directory
    record: ActionRecord
    outcome: OutcomeRecord | None
