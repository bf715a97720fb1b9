"""The checkpoint store: one URL holding many pipelines, handed out with recovery and retention."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_seatunnel_ckpt.core import layout
from airflow_seatunnel_ckpt.core.config import CheckpointConfig
from airflow_seatunnel_ckpt.core.ops.retention import RetentionReport, retain
from airflow_seatunnel_ckpt.core.protocol.pipeline import Pipeline
from airflow_seatunnel_ckpt.core.protocol.recovery import RecoveryReport, recover
from airflow_seatunnel_ckpt.core.sinks.base import store_id
from airflow_seatunnel_ckpt.core.storage import Storage, open_storage


class StoredPipeline(Pipeline):
    """A pipeline of a store: the protocol, plus recovery and retention over it."""

    def recover(self, dry_run: bool = True, now: float | None = None) -> RecoveryReport:
        """Resolve unfinished epochs and remove garbage: see :func:`recovery.recover`."""
        return recover(self, dry_run=dry_run, now=now)

    def retain(self, max_retain: int | None = None, dry_run: bool = False) -> RetentionReport:
        """Delete checkpoints nothing needs any more: see :func:`retention.retain`."""
        return retain(self, max_retain=max_retain, dry_run=dry_run)


class CheckpointStore:
    """Entry point of the core: ``CheckpointStore(config).pipeline("orders")``."""

    def __init__(self, config: CheckpointConfig | None = None,
                 target_options: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        self.config = config or CheckpointConfig()
        self.storage: Storage = open_storage(self.config.storage_url, self.config.storage_options)
        self._target_options = target_options

    @classmethod
    def from_url(cls, url: str, storage_options: Mapping[str, Any] | None = None, **settings: Any) -> CheckpointStore:
        """A store at ``url`` with default settings (overridable by keyword)."""
        return cls(CheckpointConfig.from_mapping({"storage_url": url, "storage_options": dict(storage_options or {}),
                                                  **settings}))

    def __repr__(self) -> str:
        return f"CheckpointStore({self.storage.describe()!r})"

    def store_id(self) -> str:
        """The store's id (a UUID written once, on first use: :mod:`core.sinks.markers`)."""
        return store_id(self.storage)

    def pipeline(self, name: str, overrides: Mapping[str, Any] | None = None) -> StoredPipeline:
        """The pipeline called ``name`` (created lazily on first write).

        Its configuration: the store's, then its descriptor's settings, then ``overrides``.
        """
        pipeline = StoredPipeline(self.storage, name, self.config, self._target_options)
        descriptor = pipeline.descriptor()
        if descriptor is None and not overrides:
            return pipeline
        config = (descriptor.apply_config(self.config, overrides) if descriptor is not None
                  else self.config.replace(**dict(overrides or {})))
        if config == self.config:
            return pipeline
        configured = StoredPipeline(self.storage, name, config, self._target_options)
        configured.__dict__["_descriptor"] = descriptor
        return configured

    def list_pipelines(self) -> list[str]:
        """Names of the pipelines in this store: those with a descriptor or a transaction log."""
        out = []
        for name in self.storage.list_dir(""):
            if name.startswith(("_", ".")):
                continue
            if self.storage.exists(f"{name}/{layout.DESCRIPTOR}") or self.storage.exists(f"{name}/{layout.TXLOG}"):
                out.append(name)
        return out
