"""The pipeline descriptor (``_descriptor/v<N>.json``, write-once versions): one pipeline's owner DAG,
settings without secrets and declared participants, kept in its store (docs/ARCHITECTURE.md,
decision 12); and the comparison of a keyed state's shape with the recorded one."""

from __future__ import annotations

import dataclasses
import logging
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

import pydantic

from airflow_seatunnel_ckpt.core import codec, layout
from airflow_seatunnel_ckpt.core.config import CheckpointConfig, redact_url
from airflow_seatunnel_ckpt.core.errors import (
    AlreadyExistsError,
    CorruptCheckpointError,
    PipelineOwnershipError,
)
from airflow_seatunnel_ckpt.core.layout import validate_name
from airflow_seatunnel_ckpt.core.models import (
    FORMAT_VERSION,
    RECORD,
    Aggregate,
    Column,
    FormatVersion,
    OperatorState,
    Record,
    StateShape,
    tag,
)
from airflow_seatunnel_ckpt.core.protocol.txlog import read_record

if TYPE_CHECKING:
    from airflow_seatunnel_ckpt.core.storage import Storage

log = logging.getLogger(__name__)


class Pipeline(Protocol):
    """What this module needs of a :class:`~airflow_seatunnel_ckpt.core.protocol.pipeline.Pipeline`
    (importing it would close a cycle: the pipeline reads its descriptor through this module)."""

    name: str
    storage: Storage
    config: CheckpointConfig


#: Config fields never stored: where the store is and how to reach it (credentials).
_NOT_STORED = ("storage_url", "storage_options")
#: Option names whose values are credentials (dropped from stored source/sink options) ...
_SECRET_KEY = re.compile(r"key|secret|token|passw|pwd|credential|auth|storage_options|signature", re.IGNORECASE)
#: ... but for these, which hold column names.
_COLUMN_OPTIONS = ("merge_keys",)


def public_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` without credentials: secret-named keys dropped, URLs redacted (recursively)."""
    out: dict[str, Any] = {}
    for name, value in options.items():
        if _SECRET_KEY.search(str(name)) and str(name) not in _COLUMN_OPTIONS:
            continue
        if isinstance(value, Mapping):
            out[str(name)] = public_options(value)
        elif isinstance(value, str):
            out[str(name)] = redact_url(value)
        elif isinstance(value, (list, tuple)):
            out[str(name)] = [redact_url(v) if isinstance(v, str) else v for v in value
                              if isinstance(v, (str, int, float, bool)) or v is None]
        elif isinstance(value, (int, float, bool)) or value is None:
            out[str(name)] = value
        else:
            out[str(name)] = repr(value)
    return out


def stored_config(config: CheckpointConfig) -> dict[str, Any]:
    """The part of ``config`` a descriptor keeps: every setting but the store's URL and options
    (and a ``secondary_url`` holding credentials: it would be unusable redacted)."""
    data = config.to_mapping(include_secrets=True)
    for name in _NOT_STORED:
        data.pop(name, None)
    if data.get("secondary_url") and redact_url(data["secondary_url"]) != data["secondary_url"]:
        del data["secondary_url"]
    return data


@pydantic.dataclasses.dataclass(config=RECORD)
class EndpointDescriptor(Record):
    """A source or sink of a participant: its type and its options (no secrets)."""

    type: str
    options: dict[str, Any] = pydantic.Field(default_factory=dict)

    @classmethod
    def from_options(cls, options: Mapping[str, Any] | str) -> EndpointDescriptor:
        """From a stage spec's options (a bare string is a path/URL)."""
        if isinstance(options, str):
            return cls("file", {"path": redact_url(options)})
        rest = public_options({k: v for k, v in options.items() if k != "type"})
        return cls(str(options.get("type", "file")), rest)


@pydantic.dataclasses.dataclass(config=RECORD)
class StateDescriptor(Record):
    """A keyed state of a participant, as far as the runtime knows it (``schema``: Spark's type names)."""

    kind: str
    key_columns: list[str]
    key_groups: int | None = None
    aggregate: Aggregate | None = None
    schema: list[Column] | None = None

    @property
    def state_shape(self) -> StateShape:
        """The aggregate and columns, as a checkpoint records them with the state's chains."""
        return StateShape(self.aggregate, self.schema)

    @classmethod
    def of_operator(cls, op: OperatorState, recorded: StateDescriptor | None = None) -> StateDescriptor:
        """The committed shape of a restored state, from its checkpoint (aggregate and columns from
        ``recorded`` when the checkpoint has none)."""
        shape = op.shape or (recorded.state_shape if recorded is not None else StateShape())
        return cls(op.state_kind, list(op.key_columns), op.key_groups, shape.aggregate, shape.schema)


@pydantic.dataclasses.dataclass(config=RECORD)
class ParticipantDescriptor(Record):
    """One declared participant (stage) of the pipeline: its sources, sinks and keyed states."""

    sources: dict[str, EndpointDescriptor] = pydantic.Field(default_factory=dict)
    sinks: dict[str, EndpointDescriptor] = pydantic.Field(default_factory=dict)
    states: dict[str, StateDescriptor] = pydantic.Field(default_factory=dict)

    @classmethod
    def from_spec(cls, sources: Mapping[str, Any] | None, sinks: Mapping[str, Any] | None) -> ParticipantDescriptor:
        """From a stage's source and sink options (secrets dropped); states come from the runtime."""
        return cls({validate_name(n, "source name"): EndpointDescriptor.from_options(o)
                    for n, o in (sources or {}).items()},
                   {validate_name(n, "sink name"): EndpointDescriptor.from_options(o)
                    for n, o in (sinks or {}).items()})


@pydantic.dataclasses.dataclass(config=RECORD)
class PipelineDescriptor(Record):
    """One version of a pipeline's descriptor."""

    pipeline: str
    version: int
    owner_dag_id: str
    config: dict[str, Any]
    participants: dict[str, ParticipantDescriptor]
    store_conn_id: str | None = None
    created_at: float = 0.0
    format_version: FormatVersion = FORMAT_VERSION
    type: Literal["pipeline_descriptor"] = tag("pipeline_descriptor")

    def content(self) -> dict[str, Any]:
        """What decides whether a new version is needed (everything but version and time)."""
        data = self.to_dict()
        for volatile in ("version", "created_at"):
            data.pop(volatile)
        return data

    @property
    def declared_participants(self) -> list[str]:
        """The participants a commit needs, sorted."""
        return sorted(self.participants)

    def apply_config(self, config: CheckpointConfig, overrides: Mapping[str, Any] | None = None) -> CheckpointConfig:
        """``config`` (where the store is, how to reach it) with this pipeline's settings, then ``overrides``
        (settings a newer release wrote are skipped with a warning rather than failing every reader)."""
        known = {f.name for f in dataclasses.fields(CheckpointConfig)} - set(_NOT_STORED)
        unknown = sorted(set(self.config) - known)
        if unknown:
            log.warning("pipeline %s: descriptor v%d has settings %s this release does not know; ignored",
                        self.pipeline, self.version, unknown)
        changes = {k: v for k, v in self.config.items() if k in known}
        changes.update(overrides or {})
        return CheckpointConfig.from_mapping({**config.to_mapping(include_secrets=True), **changes})


# -- reading and writing ------------------------------------------------------------------

def descriptor_versions(storage: Storage) -> list[int]:
    """Every descriptor version of the pipeline at ``storage``, ascending."""
    names = storage.list_dir(layout.DESCRIPTOR)
    found = (layout.parse_version_name(n, layout.DESCRIPTOR_WIDTH, ".json") for n in names)
    return sorted(v for v in found if v is not None)


def read_descriptor(storage: Storage, version: int | None = None,
                    max_chunk: int = codec.DEFAULT_MAX_CHUNK) -> PipelineDescriptor | None:
    """The newest descriptor (or ``version``) of the pipeline at ``storage``; None if it has none."""
    if version is None:
        versions = descriptor_versions(storage)
        if not versions:
            return None
        version = versions[-1]
    path = layout.descriptor_path(version)
    descriptor = read_record(storage, path, PipelineDescriptor, max_chunk)
    if descriptor is not None and descriptor.version != version:
        where = storage.describe_path(path)
        raise CorruptCheckpointError(f"{where}: holds version {descriptor.version}, not {version}", where)
    return descriptor


def _write_next(pipeline: Pipeline, latest: PipelineDescriptor | None, make: Callable[[Any], PipelineDescriptor],
                write: bool = True) -> PipelineDescriptor:
    """Write ``make(latest)`` as the next version unless its content equals ``latest``'s (``write=False``:
    return it unwritten). The loser of a race for a version number tries again on the winner's."""
    for _ in range(20):
        candidate: PipelineDescriptor = make(latest)
        if latest is not None and candidate.content() == latest.content():
            pipeline.__dict__["_descriptor"] = latest  # what Pipeline.descriptor() caches
            return latest
        version = latest.version + 1 if latest else 1
        if not write:
            log.info("pipeline %s: dry run: descriptor version %d not written (it would record what this "
                     "run declared or learned)", pipeline.name, version)
            return candidate
        candidate = dataclasses.replace(candidate, version=version, created_at=time.time())
        try:
            pipeline.storage.create_exclusive(layout.descriptor_path(version), codec.encode_json(candidate.to_dict()))
        except AlreadyExistsError:
            latest = read_descriptor(pipeline.storage, max_chunk=pipeline.config.max_chunk_bytes)
            continue
        pipeline.__dict__["_descriptor"] = candidate
        log.info("pipeline %s: descriptor version %d written (owner %s, participants %s)", pipeline.name,
                 version, candidate.owner_dag_id or "-", ", ".join(candidate.declared_participants) or "-")
        return candidate
    raise AlreadyExistsError(f"pipeline {pipeline.name!r}: could not write a new descriptor version "
                             "(20 concurrent writers won); try again")


def _check_owner(pipeline: Pipeline, latest: PipelineDescriptor | None, dag_id: str) -> None:
    if latest is None or not latest.owner_dag_id or latest.owner_dag_id == dag_id:
        return
    where = pipeline.storage.describe_path(layout.descriptor_path(latest.version))
    raise PipelineOwnershipError(
        f"pipeline {pipeline.name!r} in {pipeline.storage.describe()} belongs to DAG {latest.owner_dag_id!r} "
        f"(descriptor {where}); DAG {dag_id!r} may not run it: two DAGs sharing a pipeline would share its "
        f"state and consumed-input history. Way out: give this DAG's pipeline another name -- a new "
        f"pipeline starts with no state and no consumed-input history, so it reads its sources from the "
        f"start and publishes again what {pipeline.name!r} already published, if both read the same "
        f"input -- or, if {dag_id!r} replaces {latest.owner_dag_id!r}, transfer the pipeline with "
        f"`seatunnel-ckpt describe {pipeline.name} --transfer-to {dag_id}`.")


def ensure_descriptor(pipeline: Pipeline, *, dag_id: str, participants: Mapping[str, ParticipantDescriptor],
                      config: CheckpointConfig | None = None, store_conn_id: str | None = None, complete: bool = True,
                      write: bool = True) -> PipelineDescriptor:
    """Make sure the pipeline's descriptor says what DAG ``dag_id`` declares; return the newest version.

    Another owner is :class:`PipelineOwnershipError`. The states recorded so far are kept.
    ``complete=False`` adds or updates only these ``participants``, keeping the others;
    ``write=False`` (a dry run) checks ownership and writes nothing.
    """
    if not isinstance(dag_id, str) or not dag_id:
        raise PipelineOwnershipError(f"pipeline {pipeline.name!r}: a descriptor needs the owner DAG's id")
    settings = stored_config(config or pipeline.config)
    max_chunk = pipeline.config.max_chunk_bytes

    def make(latest: PipelineDescriptor | None) -> PipelineDescriptor:
        _check_owner(pipeline, latest, dag_id)
        before = dict(latest.participants) if latest else {}
        declared = dict(participants) if complete else {**before, **participants}
        merged = {name: dataclasses.replace(shape, states={**(before[name].states if name in before else {}),
                                                           **shape.states})
                  for name, shape in declared.items()}
        return PipelineDescriptor(pipeline.name, latest.version if latest else 0, dag_id, settings, merged,
                                  store_conn_id)

    latest = read_descriptor(pipeline.storage, max_chunk=max_chunk)
    return _write_next(pipeline, latest, make, write)


def record_states(pipeline: Pipeline, participant: str,
                  states: Mapping[str, StateDescriptor]) -> PipelineDescriptor | None:
    """Merge the keyed states a participant's run used into the descriptor (a new version only if they
    changed; nothing without a descriptor)."""
    latest = read_descriptor(pipeline.storage, max_chunk=pipeline.config.max_chunk_bytes)
    if latest is None or not states:
        return latest

    def merge(current: PipelineDescriptor) -> PipelineDescriptor:
        shape = current.participants.get(participant, ParticipantDescriptor())
        merged = dataclasses.replace(shape, states={**shape.states, **states})
        return dataclasses.replace(current, participants={**current.participants, participant: merged})

    return _write_next(pipeline, latest, merge)


def transfer_ownership(pipeline: Pipeline, new_owner: str) -> PipelineDescriptor:
    """Give the pipeline to DAG ``new_owner`` (a new descriptor version; explicit and logged)."""
    if not isinstance(new_owner, str) or not new_owner:
        raise PipelineOwnershipError("the new owner must be a non-empty DAG id")

    def give(current: PipelineDescriptor) -> PipelineDescriptor:
        log.warning("pipeline %s: ownership transferred from DAG %s to DAG %s", pipeline.name,
                    current.owner_dag_id, new_owner)
        return dataclasses.replace(current, owner_dag_id=new_owner)

    return write_descriptor_change(pipeline, give)


def write_descriptor_change(pipeline: Pipeline,
                            change: Callable[[PipelineDescriptor], PipelineDescriptor]) -> PipelineDescriptor:
    """Write ``change(newest descriptor)`` as the next version (refused without a descriptor)."""
    latest = read_descriptor(pipeline.storage, max_chunk=pipeline.config.max_chunk_bytes)
    if latest is None:
        raise PipelineOwnershipError(
            f"pipeline {pipeline.name!r} in {pipeline.storage.describe()} has no descriptor, so no owner or shape to "
            "change; the first DAG whose stage runs it becomes its owner")
    return _write_next(pipeline, latest, change)


# -- comparing a state's shape with the recorded one ----------------------------------------

@dataclass(frozen=True)
class StateChanges:
    """How a keyed state a stage opens differs from its recorded (committed) shape."""

    refused: list[str] = field(default_factory=list)  #: changes that would misread stored values
    compatible: list[str] = field(default_factory=list)  #: accepted and recorded (new aggregate column)


_INTEGRAL = ("tinyint", "smallint", "int", "bigint")
_DECIMAL = re.compile(r"decimal\((\d+),(\d+)\)")


def widens(old: str, new: str) -> bool:
    """Whether Spark type ``new`` holds every value of ``old`` exactly (a widening Spark and Delta allow)."""
    if old in _INTEGRAL and new in _INTEGRAL:
        return _INTEGRAL.index(new) > _INTEGRAL.index(old)
    if new == "double":
        return old in ("float", *_INTEGRAL[:3])
    before, after = _DECIMAL.fullmatch(old), _DECIMAL.fullmatch(new)
    if before and after:
        (p1, s1), (p2, s2) = (map(int, m.groups()) for m in (before, after))
        return (p2, s2) != (p1, s1) and s2 >= s1 and p2 - s2 >= p1 - s1
    return False


def state_changes(recorded: StateDescriptor, now: StateDescriptor) -> StateChanges:
    """Compare a state's recorded shape with the one a stage gives it now (docs/OPERATIONS.md,
    "Evolving a pipeline": which changes are refused and which are compatible)."""
    refused: list[str] = []
    compatible: list[str] = []
    if recorded.kind != now.kind:
        refused.append(f"kind {recorded.kind} -> {now.kind}")
    if list(recorded.key_columns) != list(now.key_columns):
        refused.append(f"key columns {list(recorded.key_columns)} -> {list(now.key_columns)}")
    if recorded.key_groups is not None and now.key_groups is not None and recorded.key_groups != now.key_groups:
        refused.append(f"key groups {recorded.key_groups} -> {now.key_groups}")
    if recorded.aggregate is not None and now.aggregate is not None:
        for column, spec in sorted(recorded.aggregate.items()):
            if column not in now.aggregate:
                refused.append(f"aggregate column {column!r} ({spec[0]} of {spec[1]}) removed")
            elif list(now.aggregate[column]) != list(spec):
                new = now.aggregate[column]
                refused.append(f"aggregate column {column!r}: {spec[0]}({spec[1]}) -> {new[0]}({new[1]})")
        for column, spec in sorted(now.aggregate.items()):
            if column not in recorded.aggregate:
                compatible.append(f"new aggregate column {column!r} ({spec[0]} of {spec[1]}), empty for stored keys")
    if recorded.schema is not None and now.schema is not None:
        before = {c["name"]: c["type"] for c in recorded.schema}
        for col in now.schema:
            old_type = before.get(col["name"])
            if old_type is None or old_type == col["type"]:
                continue
            if col["name"] not in now.key_columns and widens(old_type, col["type"]):
                compatible.append(f"column {col['name']!r} widened {old_type} -> {col['type']}")
            else:
                refused.append(f"column {col['name']!r} type {old_type} -> {col['type']}")
    return StateChanges(refused, compatible)

