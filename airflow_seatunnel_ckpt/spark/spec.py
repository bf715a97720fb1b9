"""What a stage run is given (:class:`StageSpec`) and what it hands back (:class:`StageResult`).

Both are plain data with an explicit JSON form, because the same spec travels from an
Airflow task to an in-process run or, through ``spark-submit``, to the driver module of
this package on any cluster.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow_seatunnel_ckpt.core.errors import ConfigError
from airflow_seatunnel_ckpt.core.layout import validate_attempt, validate_name
from airflow_seatunnel_ckpt.core.models import PreparedRecord, SinkManifest

#: Key groups of a pipeline's keyed state when the spec does not say. Fixed for the life
#: of the state: changing it would move keys to other key groups.
DEFAULT_KEY_GROUPS = 16

_SPEC_FIELDS = {
    "pipeline",
    "participant",
    "run_id",
    "attempt",
    "stage",
    "sources",
    "sinks",
    "store",
    "key_groups",
    "spark_conf",
    "master",
    "remote",
    "app_name",
    "airflow_context",
    "dry_run",
}


@dataclass(frozen=True)
class StageSpec:
    """Everything one run of a stage needs, as JSON-serialisable data.

    :param pipeline: pipeline name in the checkpoint store.
    :param participant: this stage's name in the epoch's two-phase commit.
    :param run_id: the DAG run id; it fixes the epoch (the same for every retry).
    :param attempt: the attempt number (Airflow's try number); names staging and parts.
    :param stage: the user function as an import path, ``"package.module:function"``.
    :param sources: source name -> options, e.g. ``{"type": "file", "path": ..., "format": ...}``.
    :param sinks: sink name -> options, e.g. ``{"type": "file", "path": ..., "format": "parquet"}``.
    :param store: :class:`~airflow_seatunnel_ckpt.core.CheckpointConfig` fields.
    :param key_groups: number of key groups of the keyed state (fixed for the pipeline).
    :param spark_conf: Spark configuration, passed to the session untouched.
    :param master: Spark master for an in-process session (default ``local[*]``); ignored
        when the session already exists (e.g. under ``spark-submit``).
    :param remote: a Spark Connect URL (``sc://host:port/;...``): the stage runs through a
        Connect session to that server instead of a session of this process (no JVM here).
    :param app_name: Spark application name (default: ``<pipeline>-<participant>``).
    :param airflow_context: the Airflow run the stage belongs to, as JSON data (see
        :class:`~airflow_seatunnel_ckpt.spark.context.AirflowContext`); empty outside Airflow.
    :param dry_run: a run whose epoch is aborted afterwards (``airflow tasks test``): it
        records nothing in the pipeline's descriptor (the shapes of its keyed states).
    """

    pipeline: str
    participant: str
    run_id: str
    attempt: int
    stage: str
    sources: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    sinks: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    store: Mapping[str, Any] = field(default_factory=dict)
    key_groups: int = DEFAULT_KEY_GROUPS
    spark_conf: Mapping[str, Any] = field(default_factory=dict)
    master: str | None = None
    remote: str | None = None
    app_name: str | None = None
    airflow_context: Mapping[str, Any] = field(default_factory=dict)
    dry_run: bool = False

    def __post_init__(self) -> None:
        validate_name(self.pipeline, "pipeline name")
        validate_name(self.participant, "participant name")
        validate_attempt(self.attempt)
        if not isinstance(self.run_id, str) or not self.run_id:
            raise ConfigError(f"stage spec: run_id must be a non-empty string, got {self.run_id!r}")
        if not isinstance(self.stage, str) or ":" not in self.stage:
            raise ConfigError(
                "stage spec: stage must be an import path 'package.module:function', "
                f"got {self.stage!r}"
            )
        if self.remote is not None and (not isinstance(self.remote, str) or not self.remote.startswith("sc://")):
            raise ConfigError(f"stage spec: remote must be a Spark Connect URL 'sc://host:port', got {self.remote!r}")
        if (
            isinstance(self.key_groups, bool)
            or not isinstance(self.key_groups, int)
            or not 1 <= self.key_groups <= 1 << 20
        ):
            raise ConfigError(
                f"stage spec: key_groups must be an integer in 1..2**20, got {self.key_groups!r}"
            )
        for kind, entries in (("source", self.sources), ("sink", self.sinks)):
            for name, options in entries.items():
                validate_name(name, f"{kind} name")
                if not isinstance(options, Mapping):
                    raise ConfigError(
                        f"stage spec: {kind} {name!r} must be a mapping of options, got {options!r}"
                    )

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (contains the store's storage options: treat as a secret)."""
        return {
            "pipeline": self.pipeline,
            "participant": self.participant,
            "run_id": self.run_id,
            "attempt": self.attempt,
            "stage": self.stage,
            "sources": {k: dict(v) for k, v in self.sources.items()},
            "sinks": {k: dict(v) for k, v in self.sinks.items()},
            "store": dict(self.store),
            "key_groups": self.key_groups,
            "spark_conf": dict(self.spark_conf),
            "master": self.master,
            "remote": self.remote,
            "app_name": self.app_name,
            "airflow_context": dict(self.airflow_context),
            "dry_run": self.dry_run,
        }

    def to_json(self) -> str:
        """JSON form, for the driver's ``--spec-file``."""
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StageSpec:
        """Build a spec from plain data, rejecting unknown fields."""
        if not isinstance(data, Mapping):
            raise ConfigError(f"stage spec must be a mapping, got {type(data).__name__}")
        unknown = set(data) - _SPEC_FIELDS
        if unknown:
            raise ConfigError(
                f"stage spec: unknown field(s) {sorted(unknown)}; known: {sorted(_SPEC_FIELDS)}"
            )
        missing = {"pipeline", "participant", "run_id", "attempt", "stage"} - set(data)
        if missing:
            raise ConfigError(f"stage spec: missing field(s) {sorted(missing)}")
        return cls(**dict(data))

    @classmethod
    def from_json(cls, text: str) -> StageSpec:
        """Parse :meth:`to_json` output."""
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ConfigError(f"stage spec is not valid JSON: {exc}") from exc
        return cls.from_dict(data)


@dataclass(frozen=True)
class StageResult:
    """What a stage run prepared (or found already prepared by an earlier attempt).

    :param reused: True when an earlier attempt had already prepared this participant
        for the epoch and nothing was run again.
    :param checkpoint_bytes: bytes of checkpoint parts written by the winning attempt
        (new parts only; unchanged key groups referenced from older checkpoints count 0).
    """

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
        return cls(
            pipeline=pipeline,
            participant=record.participant,
            epoch=record.epoch,
            attempt=record.attempt,
            run_id=record.run_id,
            manifests=list(record.sinks),
            sources={name: dict(state.offsets) for name, state in record.sources.items()},
            checkpoint_bytes=sum(p.size for p in new_parts),
            reused=reused,
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (for XCom, the driver's ``--result-file`` and logs)."""
        return {
            "pipeline": self.pipeline,
            "participant": self.participant,
            "epoch": self.epoch,
            "attempt": self.attempt,
            "run_id": self.run_id,
            "rows": self.rows,
            "manifests": [m.to_dict() for m in self.manifests],
            "sources": self.sources,
            "checkpoint_bytes": self.checkpoint_bytes,
            "reused": self.reused,
        }
