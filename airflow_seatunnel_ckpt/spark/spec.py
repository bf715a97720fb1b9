"""What a stage run is given (:class:`StageSpec`) and what it hands back (:class:`StageResult`): pydantic models with a
JSON form, since a spec travels from an Airflow task to an in-process run or a ``spark-submit`` driver."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError
from pydantic.dataclasses import dataclass

from airflow_seatunnel_ckpt.core.errors import CheckpointError, ConfigError
from airflow_seatunnel_ckpt.core.layout import validate_attempt, validate_name
from airflow_seatunnel_ckpt.core.models import RECORD, PreparedRecord, Record, SinkManifest
from airflow_seatunnel_ckpt.core.options import Options

#: Key groups of a pipeline's keyed state when the spec does not say. Fixed for the life
#: of the state: changing it would move keys to other key groups.
DEFAULT_KEY_GROUPS = 16


def entry_type(options: Options | Mapping[str, Any]) -> str:
    """The type of a source or sink entry, typed or as written (``file`` when it names none)."""
    return str(options.type if isinstance(options, Options) else options.get("type", "file"))


def _checked(ok: Callable[[Any], bool], expected: str) -> AfterValidator:
    """A field check: ConfigError saying what the field must be and what it got unless ``ok(value)``."""
    def check(value: Any) -> Any:
        if not ok(value):
            raise ConfigError(f"stage spec: {expected}, got {value!r}")
        return value
    return AfterValidator(check)


def _entries(kind: str) -> AfterValidator:
    """Entries of ``kind``: safe names -> options (typed, or a mapping: a JSON spec's, checked by the connector through
    the same model)."""
    def check(entries: Any) -> dict[str, Options | Mapping[str, Any]]:
        if not isinstance(entries, Mapping):
            raise ConfigError(f"stage spec: {kind}s must be a mapping of {kind} name -> options, got {entries!r}")
        for name, options in entries.items():
            validate_name(name, f"{kind} name")
            if not isinstance(options, Mapping | Options):
                raise ConfigError(f"stage spec: {kind} {name!r} must be a mapping of options, got {options!r}")
        return dict(entries)
    return AfterValidator(check)


def _unwrapped(exc: ValidationError, what: str) -> CheckpointError:
    """The error a check of ours raised inside ``exc``, else ``exc`` in words (ConfigError)."""
    errors = exc.errors(include_url=False)
    for error in errors:
        if isinstance(found := (error.get("ctx") or {}).get("error"), CheckpointError):
            return found
    unknown = sorted(str(e["loc"][0]) for e in errors if e["type"] == "extra_forbidden")
    missing = sorted(str(e["loc"][0]) for e in errors if e["type"] == "missing")
    if unknown:
        return ConfigError(f"{what}: unknown field(s) {unknown}; known: {sorted(StageSpec.model_fields)}")
    if missing:
        return ConfigError(f"{what}: missing field(s) {missing}")
    return ConfigError(f"{what}: " + "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in errors))


#: The attempt id of a run with try number 0 (``airflow tasks test``), apart from real tries' ids so that it never
#: shares a staging directory or lease with a scheduled try, nor is taken for a later try of a killed one.
UNSCHEDULED_ATTEMPT = 1_000_000


class StageSpec(BaseModel):
    """Everything one run of a stage needs, as JSON-serialisable data (a ConfigError names a wrong field).

    :param run_id: the DAG run id; it fixes the epoch (the same for every retry).
    :param attempt: the attempt number (Airflow's try number); names staging and parts.
    :param stage: the user function as an import path, ``"package.module:function"``.
    :param sources: source name -> options (a mapping, or the typed options a DAG's declaration checked); so ``sinks``.
    :param store: :class:`~airflow_seatunnel_ckpt.core.CheckpointConfig` fields.
    :param key_groups: number of key groups of the keyed state (fixed for the pipeline).
    :param master: Spark master of a new in-process session (default ``local[*]``).
    :param remote: a Spark Connect URL (``sc://host:port/;...``): run through a Connect session to that server.
    :param airflow_context: the Airflow run, as JSON data
        (:class:`~airflow_seatunnel_ckpt.spark.context.AirflowContext`).
    :param dry_run: a run whose epoch is aborted afterwards (``airflow tasks test``): nothing goes into the descriptor.
    :param connections: the PostgreSQL sources' Airflow connections resolved for a driver outside the task: id ->
        ``{"conninfo": <without the password>, "passfile": <beside the spec>}``
        (:func:`~airflow_seatunnel_ckpt.hooks.postgres_connection.driver_connections`).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    pipeline: Annotated[Any, AfterValidator(lambda v: validate_name(v, "pipeline name"))]
    participant: Annotated[Any, AfterValidator(lambda v: validate_name(v, "participant name"))]
    run_id: Annotated[Any, _checked(lambda v: isinstance(v, str) and bool(v), "run_id must be a non-empty string")]
    attempt: Annotated[Any, AfterValidator(validate_attempt)]
    stage: Annotated[Any, _checked(lambda v: isinstance(v, str) and ":" in v,
                                   "stage must be an import path 'package.module:function'")]
    sources: Annotated[Any, _entries("source")] = Field(default_factory=dict)
    sinks: Annotated[Any, _entries("sink")] = Field(default_factory=dict)
    store: Mapping[str, Any] = Field(default_factory=dict)
    key_groups: Annotated[Any, _checked(lambda v: isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 1 << 20,
                                        "key_groups must be an integer in 1..2**20")] = DEFAULT_KEY_GROUPS
    spark_conf: Mapping[str, Any] = Field(default_factory=dict)
    master: str | None = None
    remote: Annotated[Any, _checked(lambda v: v is None or (isinstance(v, str) and v.startswith("sc://")),
                                    "remote must be a Spark Connect URL 'sc://host:port'")] = None
    app_name: str | None = None
    airflow_context: Mapping[str, Any] = Field(default_factory=dict)
    dry_run: bool = False
    connections: Mapping[str, Mapping[str, str]] = Field(default_factory=dict)

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise _unwrapped(exc, "stage spec") from None

    def replace(self, **changes: Any) -> StageSpec:
        """This spec with ``changes``, checked again."""
        return StageSpec(**{**{name: getattr(self, name) for name in type(self).model_fields}, **changes})

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (contains the store's storage options: treat as a secret)."""
        data = self.model_dump(mode="json")
        for kind in ("sources", "sinks"):  # typed options as the plain options they stand for
            data[kind] = {name: options.to_dict() if isinstance(options, Options) else dict(options)
                          for name, options in getattr(self, kind).items()}
        return data

    def to_json(self) -> str:
        """JSON form, for the driver's ``--spec-file``."""
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StageSpec:
        """Build a spec from plain data, rejecting unknown fields."""
        if not isinstance(data, Mapping):
            raise ConfigError(f"stage spec must be a mapping, got {type(data).__name__}")
        return cls(**dict(data))

    @classmethod
    def from_json(cls, text: str) -> StageSpec:
        """Parse :meth:`to_json` output."""
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ConfigError(f"stage spec is not valid JSON: {exc}") from exc
        return cls.from_dict(data)


@dataclass(config=RECORD)
class StageResult(Record):
    """What a stage run prepared (or found already prepared: ``reused``); ``checkpoint_bytes`` counts the parts the
    winning attempt wrote (not the unchanged ones referenced)."""

    pipeline: str
    participant: str
    epoch: int
    attempt: int
    run_id: str
    manifests: list[SinkManifest]
    sources: dict[str, dict[str, Any]]
    checkpoint_bytes: int
    reused: bool = False

    @property
    def rows(self) -> int:
        """Rows staged over every sink."""
        return sum(m.rows for m in self.manifests)

    @classmethod
    def from_prepared(cls, pipeline: str, record: PreparedRecord, reused: bool) -> StageResult:
        """Summarise a prepared record of the transaction log."""
        new_parts = [
            p for op in record.operators.values() for p in op.parts() if p.epoch == record.epoch
        ]
        new_parts += [
            p for s in record.sources.values() for p in s.chain if p.epoch == record.epoch
        ]
        return cls(pipeline=pipeline,
                   participant=record.participant,
                   epoch=record.epoch,
                   attempt=record.attempt,
                   run_id=record.run_id,
                   manifests=list(record.sinks),
                   sources={name: dict(state.offsets) for name, state in record.sources.items()},
                   checkpoint_bytes=sum(p.size for p in new_parts),
                   reused=reused,)

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (for XCom, the driver's ``--result-file`` and logs), with the rows staged."""
        return {**super().to_dict(), "rows": self.rows}
