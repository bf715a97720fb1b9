"""The checkpoint store: one URL holding many pipelines."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_seatunnel_ckpt.core import layout
from airflow_seatunnel_ckpt.core.config import CheckpointConfig
from airflow_seatunnel_ckpt.core.pipeline import Pipeline
from airflow_seatunnel_ckpt.core.storage import Storage, open_storage


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

    def pipeline(self, name: str) -> Pipeline:
        """The pipeline called ``name`` (validated; created lazily on first write)."""
        return Pipeline(self.storage, name, self.config, self._target_options)

    def list_pipelines(self) -> list[str]:
        """Names of the pipelines that have a transaction log in this store."""
        out = []
        for name in self.storage.list_dir(""):
            if name.startswith(("_", ".")):
                continue
            if self.storage.exists(f"{name}/{layout.TXLOG}"):
                out.append(name)
        return out
