"""What the provider's triggers share: one pipeline of a store, polled through failing reads."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from airflow.triggers.base import BaseTrigger

from airflow_seatunnel_ckpt.core import CheckpointStore
from airflow_seatunnel_ckpt.core.errors import (
    ConfigError,
    CorruptCheckpointError,
    InvalidEpochError,
    InvalidNameError,
)
from airflow_seatunnel_ckpt.hooks.checkpoint_store import CheckpointStoreHook

if TYPE_CHECKING:
    from airflow_seatunnel_ckpt.core import Pipeline

STORE_ERROR_TOLERANCE_S = 300.0

#: Errors that waiting cannot heal: a damaged record, a bad configuration or name.
LASTING_ERRORS: tuple[type[BaseException], ...] = (CorruptCheckpointError, ConfigError, InvalidNameError,
                                                   InvalidEpochError)


class StoreErrorBudget:
    """Tolerate failing polls for ``tolerance_s`` (never :data:`LASTING_ERRORS`): one store hiccup must
    not end a wait, or the task's next try would cancel the healthy attempt the trigger watched."""

    def __init__(self, tolerance_s: float = STORE_ERROR_TOLERANCE_S) -> None:
        self.tolerance_s = float(tolerance_s)
        self.failures = 0
        self._since: float | None = None

    def tolerate(self, exc: BaseException) -> bool:
        """Count a failed poll; True if the trigger should poll again."""
        if isinstance(exc, LASTING_ERRORS):
            return False
        now = time.monotonic()
        if self._since is None:
            self._since = now
        self.failures += 1
        return now - self._since < self.tolerance_s

    def succeeded(self) -> None:
        """A poll succeeded: the next failure starts a new run."""
        self._since = None
        self.failures = 0

    def describe(self) -> str:
        """``3 failed polls in 12s (tolerated for 300s)`` for log lines and the final error."""
        lasted = 0.0 if self._since is None else time.monotonic() - self._since
        return f"{self.failures} failed poll(s) in {lasted:.0f}s (tolerated for {self.tolerance_s:g}s)"


class StoreTrigger(BaseTrigger):
    """A trigger polling one pipeline of a checkpoint store (the store arguments as the task's).

    Its serialised kwargs never hold storage options (they are shown in the metadata
    database and logs): the trigger resolves the connection itself. The store is read in a
    worker thread, so that blocking storage calls do not stall the triggerer's event loop.
    """

    def __init__(self, *, pipeline: str, store_conn_id: str | None = None, storage_url: str | None = None,
                 store_config: Mapping[str, Any] | None = None, poll_interval: float = 5.0,
                 store_error_timeout: float = STORE_ERROR_TOLERANCE_S) -> None:
        super().__init__()
        self.pipeline = pipeline
        self.store_conn_id = store_conn_id
        self.storage_url = storage_url
        self.store_config = {k: v for k, v in (store_config or {}).items() if k != "storage_options"}
        self.poll_interval = float(poll_interval)
        self.store_error_timeout = float(store_error_timeout)

    def arguments(self) -> dict[str, Any]:
        """The subclass's own kwargs, serialised beside the store's."""
        raise NotImplementedError

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """Class path and kwargs to re-create the trigger in the triggerer."""
        return (f"{type(self).__module__}.{type(self).__qualname__}",
                {"pipeline": self.pipeline, "store_conn_id": self.store_conn_id, "storage_url": self.storage_url,
                 "store_config": self.store_config, "poll_interval": self.poll_interval,
                 "store_error_timeout": self.store_error_timeout, **self.arguments()})

    async def open_pipeline(self) -> Pipeline:
        """The watched pipeline (its connection read without blocking the event loop)."""
        config = await CheckpointStoreHook(self.store_conn_id, self.storage_url, self.store_config).aget_config()
        return (await asyncio.to_thread(CheckpointStore, config)).pipeline(self.pipeline)
