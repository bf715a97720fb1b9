"""Typed models of everything the protocol writes, with explicit (de)serialisation.

Records are plain JSON inside a checksummed frame (see :mod:`codec`). ``from_dict``
checks every field's type, so a record that decodes but has the wrong shape is reported
as corrupt with the file named, never half-used.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from airflow_seatunnel_ckpt.core.errors import CorruptCheckpointError
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
    kind: str = "full"  #: "full" or "delta" (changes against the previous part of its chain)

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.size, "crc32c": self.crc32c, "epoch": self.epoch,
                "key_group": self.key_group, "kind": self.kind}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], path: str = "<record>") -> PartRef:
        kind = _get(d, "kind", str, path)
        if kind not in ("full", "delta"):
            raise CorruptCheckpointError(f"{path}: part kind must be full or delta, found {kind!r}", path)
        return cls(_get(d, "path", str, path), _get(d, "size", int, path), _get(d, "crc32c", int, path),
                   _get(d, "epoch", int, path), _get(d, "key_group", int, path), kind)


#: A key group's restore recipe: one full part followed by the deltas to apply in order.
Chain = list[PartRef]


@dataclass(frozen=True)
class OperatorState:
    """The keyed state of one operator in one checkpoint: a chain per key group."""

    key_groups: int
    key_columns: list[str]
    chains: dict[int, Chain]
    state_kind: str = "key_set"  #: "key_set" or "key_value"

    def to_dict(self) -> dict[str, Any]:
        return {"key_groups": self.key_groups, "key_columns": list(self.key_columns), "state_kind": self.state_kind,
                "chains": {str(k): [p.to_dict() for p in chain] for k, chain in sorted(self.chains.items())}}

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
        return cls(_get(d, "key_groups", int, path), cols, chains, _get(d, "state_kind", str, path))

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
class SinkManifest:
    """What one sink staged in one attempt: the files to publish, with sizes and rows."""

    sink: str
    target_url: str  #: where the sink publishes: ``<target_url>/epoch=<e>/``
    staging: str  #: staging directory, relative to the pipeline root
    files: list[FileInfo]  #: relative to ``staging``
    rows: int
    format: str = "parquet"
    target_options: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def bytes(self) -> int:
        """Total size of the staged files."""
        return sum(f.size for f in self.files)

    def to_dict(self) -> dict[str, Any]:
        return {"sink": self.sink, "target_url": self.target_url, "staging": self.staging, "format": self.format,
                "rows": self.rows, "files": [{"path": f.path, "size": f.size, "crc32c": f.crc32c}
                                             for f in self.files]}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], path: str = "<record>") -> SinkManifest:
        files = []
        for f in _get(d, "files", list, path):
            files.append(FileInfo(_get(f, "path", str, path), _get(f, "size", int, path),
                                  _get(f, "crc32c", int, path, optional=True)))
        return cls(_get(d, "sink", str, path), _get(d, "target_url", str, path), _get(d, "staging", str, path),
                   files, _get(d, "rows", int, path), _get(d, "format", str, path))


@dataclass(frozen=True)
class BeginRecord:
    """``begin``: the epoch was given to a run."""

    epoch: int
    run_id: str
    created_at: float

    def to_dict(self) -> dict[str, Any]:
        return {"type": "begin", "epoch": self.epoch, "run_id": self.run_id, "created_at": self.created_at}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], path: str = "<record>") -> BeginRecord:
        return cls(_get(d, "epoch", int, path), _get(d, "run_id", str, path), _get(d, "created_at", (int, float), path))


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

    @property
    def rows(self) -> int:
        """Rows staged over every sink of the participant."""
        return sum(s.rows for s in self.sinks)

    def to_dict(self) -> dict[str, Any]:
        return {"type": "prepared", "epoch": self.epoch, "participant": self.participant, "attempt": self.attempt,
                "run_id": self.run_id, "prepared_at": self.prepared_at,
                "sinks": [s.to_dict() for s in self.sinks],
                "operators": {k: v.to_dict() for k, v in sorted(self.operators.items())},
                "sources": {k: v.to_dict() for k, v in sorted(self.sources.items())},
                "base_epoch": self.base_epoch}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], path: str = "<record>") -> PreparedRecord:
        return cls(
            _get(d, "epoch", int, path), _get(d, "participant", str, path), _get(d, "attempt", int, path),
            _get(d, "run_id", str, path), _get(d, "prepared_at", (int, float), path),
            [SinkManifest.from_dict(s, path) for s in _get(d, "sinks", list, path)],
            {k: OperatorState.from_dict(v, path) for k, v in _get(d, "operators", dict, path).items()},
            {k: SourceState.from_dict(v, path) for k, v in _get(d, "sources", dict, path).items()},
            _get(d, "base_epoch", int, path, optional=True),
        )


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


@dataclass(frozen=True)
class PublishedSink:
    """One sink's published output for an epoch."""

    sink: str
    target_url: str
    epoch_dir: str
    files: int
    rows: int
    bytes: int
    how: str = ""  #: "renamed", "copied" or "already"

    def to_dict(self) -> dict[str, Any]:
        return {"sink": self.sink, "target_url": self.target_url, "epoch_dir": self.epoch_dir, "files": self.files,
                "rows": self.rows, "bytes": self.bytes, "how": self.how}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], path: str = "<record>") -> PublishedSink:
        return cls(_get(d, "sink", str, path), _get(d, "target_url", str, path), _get(d, "epoch_dir", str, path),
                   _get(d, "files", int, path), _get(d, "rows", int, path), _get(d, "bytes", int, path),
                   _get(d, "how", str, path, optional=True) or "")


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
