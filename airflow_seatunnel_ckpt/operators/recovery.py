"""Tasks of the scheduled recovery DAG: list pipelines, recover each, apply retention."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from airflow_seatunnel_ckpt.core.errors import RecoveryError
from airflow_seatunnel_ckpt.core.recovery import recover, retain
from airflow_seatunnel_ckpt.hooks.checkpoint_store import CheckpointStoreHook
from airflow_seatunnel_ckpt.operators import metrics
from airflow_seatunnel_ckpt.operators.base import PIPELINE_TEMPLATE_FIELDS, PipelineTaskMixin

if TYPE_CHECKING:
    from airflow.sdk import Context


class ListPipelinesOperator(BaseOperator):
    """Return the names of every pipeline in a checkpoint store (to map recovery over)."""

    template_fields: Sequence[str] = ("store_conn_id", "storage_url")

    def __init__(
        self,
        *,
        store_conn_id: str | None = None,
        storage_url: str | None = None,
        store_config: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.store_conn_id = store_conn_id
        self.storage_url = storage_url
        self.store_config = dict(store_config or {})

    def execute(self, context: Context) -> list[str]:
        """List the store's pipelines."""
        hook = CheckpointStoreHook(self.store_conn_id, self.storage_url, self.store_config)
        names = sorted(hook.store.list_pipelines())
        self.log.info("store %s holds %d pipeline(s): %s", hook.describe(), len(names),
                      ", ".join(names) or "none")
        return names


class RecoverPipelineOperator(PipelineTaskMixin, BaseOperator):
    """Resolve whatever a crash left half done in one pipeline (``Pipeline.recover``).

    COMMITTING epochs finish publishing, undecided epochs past ``prepared_timeout_s``
    are aborted, and staging no record references is removed. Safe to run at any time
    and concurrently with the pipeline's own DAG runs: each action goes through the same
    write-once decision as the pipeline tasks. Map it over :class:`ListPipelinesOperator`
    to cover a whole store.

    :param apply: carry the actions out; ``False`` only reports what would be done.
    """

    template_fields: Sequence[str] = PIPELINE_TEMPLATE_FIELDS
    ui_color = "#ebdef0"

    def __init__(
        self,
        *,
        pipeline: str,
        apply: bool = True,
        store_conn_id: str | None = None,
        storage_url: str | None = None,
        store_config: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self._init_pipeline_args(pipeline, store_conn_id, storage_url, store_config)
        self.apply = apply

    def execute(self, context: Context) -> dict[str, Any]:
        """Recover the pipeline and log every action with its reason."""
        report = recover(self.store_pipeline, dry_run=not self.apply)
        verb = "did" if self.apply else "would"
        for action in report.actions:
            if action.error:
                self.log.error("pipeline %s epoch %s: %s failed (%s): %s", self.pipeline,
                               action.epoch, action.action, action.reason, action.error)
            else:
                self.log.info("pipeline %s epoch %s: %s %s (%s)", self.pipeline, action.epoch,
                              verb, action.action, action.reason)
            if action.done:
                metrics.recovery_action(self.metric_tags(), action.action)
        if not report.actions:
            self.log.info("pipeline %s: nothing to recover", self.pipeline)
        if report.errors:
            # Fail so the recovery DAG shows red; every action is retried by the next run.
            raise RecoveryError(
                f"pipeline {self.pipeline}: {len(report.errors)} recovery action(s) failed: "
                + "; ".join(f"epoch {a.epoch} {a.action}: {a.error}" for a in report.errors))
        return {"pipeline": self.pipeline, **report.to_dict()}


class RetainCheckpointsOperator(PipelineTaskMixin, BaseOperator):
    """Delete checkpoints retention no longer needs (``Pipeline.retain``).

    Keeps the newest ``max_retain`` checkpoints (default: the store's configuration),
    always the newest fully committed one, and every base a kept incremental checkpoint
    still needs.

    :param max_retain: checkpoints to keep; ``None`` uses the store's configuration.
    :param apply: delete; ``False`` only reports what would be deleted.
    """

    template_fields: Sequence[str] = PIPELINE_TEMPLATE_FIELDS
    ui_color = "#ebdef0"

    def __init__(
        self,
        *,
        pipeline: str,
        max_retain: int | None = None,
        apply: bool = True,
        store_conn_id: str | None = None,
        storage_url: str | None = None,
        store_config: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self._init_pipeline_args(pipeline, store_conn_id, storage_url, store_config)
        self.max_retain = max_retain
        self.apply = apply

    def execute(self, context: Context) -> dict[str, Any]:
        """Apply retention and log what was (or would be) removed."""
        report = retain(self.store_pipeline, max_retain=self.max_retain, dry_run=not self.apply)
        data = report.to_dict()
        self.log.info("pipeline %s retention%s: %s", self.pipeline,
                      "" if self.apply else " (dry run)", data)
        return data
