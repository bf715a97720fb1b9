"""What every task of the provider shares: one pipeline of one checkpoint store.

Each task finds its epoch from the DAG run id (``Pipeline.epoch_for_run``), never from
XCom or a clock, so a retried or cleared task always lands on the same epoch as the
rest of its run.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow_seatunnel_ckpt.hooks.checkpoint_store import CheckpointStoreHook

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_seatunnel_ckpt.core import Pipeline

#: Template fields every pipeline task declares.
PIPELINE_TEMPLATE_FIELDS: tuple[str, ...] = ("pipeline", "store_conn_id", "storage_url")


class PipelineTaskMixin:
    """Arguments and lookups shared by the stage, sensor, branch, commit and abort tasks.

    :param pipeline: pipeline name (a directory below the store root).
    :param store_conn_id: connection of type ``seatunnel_ckpt``; ``None`` uses
        ``storage_url`` or the local default store.
    :param storage_url: store URL, overriding the connection's.
    :param store_config: further ``CheckpointConfig`` fields (``prepared_timeout_s`` ...).
    """

    pipeline: str
    store_conn_id: str | None
    storage_url: str | None
    store_config: dict[str, Any]

    def _init_pipeline_args(
        self,
        pipeline: str,
        store_conn_id: str | None,
        storage_url: str | None,
        store_config: Mapping[str, Any] | None,
    ) -> None:
        self.pipeline = pipeline
        self.store_conn_id = store_conn_id
        self.storage_url = storage_url
        self.store_config = dict(store_config or {})

    @cached_property
    def hook(self) -> CheckpointStoreHook:
        """The checkpoint-store hook (created after templates are rendered)."""
        return CheckpointStoreHook(self.store_conn_id, self.storage_url, self.store_config)

    @cached_property
    def store_pipeline(self) -> Pipeline:
        """The core :class:`Pipeline` this task works on."""
        return self.hook.get_pipeline(self.pipeline)

    def epoch_of_run(self, context: Context) -> int | None:
        """The epoch the DAG run of ``context`` holds, or ``None`` if it has not begun one."""
        return self.store_pipeline.epoch_for_run(context["run_id"])

    def metric_tags(self) -> dict[str, str]:
        """Tags attached to every metric this task emits."""
        return {"pipeline": self.pipeline}
