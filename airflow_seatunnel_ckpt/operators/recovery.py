"""Tasks of the scheduled recovery DAG: list pipelines, recover each, apply retention."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException

from airflow_seatunnel_ckpt.core.config import redact_url
from airflow_seatunnel_ckpt.core.errors import CheckpointError, RecoveryError
from airflow_seatunnel_ckpt.core.ops.retention import retain
from airflow_seatunnel_ckpt.core.protocol.recovery import recover
from airflow_seatunnel_ckpt.hooks.checkpoint_store import CheckpointStoreHook
from airflow_seatunnel_ckpt.hooks.stores import CONFIG_OPTION, CONFIG_SECTION, configured_stores
from airflow_seatunnel_ckpt.operators import metrics
from airflow_seatunnel_ckpt.pipeline_task import (
    PIPELINE_TEMPLATE_FIELDS,
    BasePipelineOperator,
    ask_airflow_run_finished,
)

if TYPE_CHECKING:
    from airflow.sdk import Context


class ListAllPipelinesOperator(BaseOperator):
    """Return every pipeline of every store recovery can see, one ``expand_kwargs`` mapping each.

    A store that cannot be opened is logged and skipped.

    :param expect_pipelines: fail when no store holds a pipeline (a recovery DAG that
        protects nothing must not look green).
    """

    ui_color = "#ebdef0"

    def __init__(self, *, expect_pipelines: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.expect_pipelines = expect_pipelines

    def execute(self, context: Context) -> list[dict[str, Any]]:
        """List the pipelines of every store recovery can see."""
        found: list[dict[str, Any]] = []
        read: list[str] = []
        for configured in configured_stores(database=False):
            where = f"store {configured.key!r} ({configured.source})"
            try:
                store = configured.open()
                names = sorted(store.list_pipelines())
            except CheckpointError as exc:
                self.log.warning("%s is not watched: %s", where, exc)
                continue
            read.append(f"{where}: {redact_url(store.config.storage_url)}")
            self.log.info("%s at %s holds %d pipeline(s): %s", where, redact_url(store.config.storage_url),
                          len(names), ", ".join(names) or "none")
            found += [{"pipeline": name, **configured.store_kwargs()} for name in names]
        self.log.info("connections that live only in the metadata database cannot be listed by a task and are not "
                      "watched unless [%s] %s names them (ids or URLs, comma separated); the Checkpoints page marks "
                      "the stores this DAG does not watch", CONFIG_SECTION, CONFIG_OPTION)
        if not found:
            default = CheckpointStoreHook()
            message = (
                f"every store this DAG watches holds no pipeline (read: {'; '.join(read) or 'none'}; the default store "
                f"{default.describe()}). If pipeline DAGs use this provider, they write to a store this DAG "
                f"does not see: name it in [{CONFIG_SECTION}] {CONFIG_OPTION} (a connection id or a URL), "
                "or define its connection as an AIRFLOW_CONN_<ID> variable of the workers. Before any "
                "pipeline's first stage has run this is expected; pass expect_pipelines=False for stores "
                "that are empty on purpose.")
            self.log.warning("%s", message)
            if self.expect_pipelines:
                raise AirflowFailException(message)
        return found


class RecoverPipelineOperator(BasePipelineOperator):
    """Resolve whatever a crash left half done in one pipeline (:func:`core.protocol.recovery.recover`).

    Safe at any time, concurrently with the pipeline's runs. Map it over
    :class:`ListAllPipelinesOperator`.

    :param apply: carry the actions out; ``False`` only reports what would be done.
    :param pipeline_dag_id: the DAG asked for an undecided epoch's run state when its
        ``begin`` record does not name one (``None``: the lease decides).
    """

    template_fields: Sequence[str] = PIPELINE_TEMPLATE_FIELDS
    ui_color = "#ebdef0"

    def __init__(self, *, apply: bool = True, pipeline_dag_id: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.apply = apply
        self.pipeline_dag_id = pipeline_dag_id

    def execute(self, context: Context) -> dict[str, Any]:
        """Recover the pipeline and log every action with its reason."""
        report = recover(self.store_pipeline, dry_run=not self.apply,
                         run_finished=ask_airflow_run_finished(context, self.pipeline_dag_id))
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
            raise RecoveryError(f"pipeline {self.pipeline}: {len(report.errors)} recovery action(s) failed: "
                                + "; ".join(f"epoch {a.epoch} {a.action}: {a.error}" for a in report.errors))
        return {"pipeline": self.pipeline, **report.to_dict()}


class RetainCheckpointsOperator(BasePipelineOperator):
    """Delete checkpoints retention no longer needs (:func:`core.ops.retention.retain`).

    :param max_retain: checkpoints to keep; ``None`` uses the pipeline's configuration.
    :param apply: delete; ``False`` only reports what would be deleted.
    """

    template_fields: Sequence[str] = PIPELINE_TEMPLATE_FIELDS
    ui_color = "#ebdef0"

    def __init__(self, *, max_retain: int | None = None, apply: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.max_retain = max_retain
        self.apply = apply

    def execute(self, context: Context) -> dict[str, Any]:
        """Apply retention and log what was (or would be) removed."""
        report = retain(self.store_pipeline, max_retain=self.max_retain, dry_run=not self.apply)
        data = report.to_dict()
        self.log.info("pipeline %s retention%s: %s", self.pipeline,
                      "" if self.apply else " (dry run)", data)
        return data
