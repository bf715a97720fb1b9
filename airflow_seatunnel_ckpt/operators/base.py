"""What every task of the provider shares: a checkpoint store, and one pipeline in it.

The store arguments (``store_conn_id``, ``storage_url``, ``store_config``) are taken in one
constructor, :class:`BaseStoreOperator`, and resolved in one place,
:class:`~airflow_seatunnel_ckpt.hooks.checkpoint_store.StoreSettings`; the provider's
operators take them as keyword arguments they pass on (as ``BaseSQLOperator`` does for
``conn_id`` in Airflow's common-sql provider), so no operator repeats them.

Each pipeline task finds its epoch from its DAG and run id (``Pipeline.epoch_for_run``),
never from XCom or a clock, so a retried or cleared task always lands on the same epoch
as the rest of its run. A stage task also makes sure the pipeline's descriptor names its
DAG as owner and declares the participants (see :mod:`airflow_seatunnel_ckpt.core.protocol.descriptor`):
another DAG with a pipeline of the same name is refused before anything is written.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException

from airflow_seatunnel_ckpt.core.errors import retryable
from airflow_seatunnel_ckpt.core.protocol.descriptor import ParticipantDescriptor, ensure_descriptor
from airflow_seatunnel_ckpt.hooks.checkpoint_store import CheckpointStoreHook, StoreSettings

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_seatunnel_ckpt.core import Pipeline

#: Template fields of every task that opens a store.
STORE_TEMPLATE_FIELDS: tuple[str, ...] = ("store_conn_id", "storage_url")
#: Template fields every pipeline task declares.
PIPELINE_TEMPLATE_FIELDS: tuple[str, ...] = ("pipeline", *STORE_TEMPLATE_FIELDS)


@contextlib.contextmanager
def refusals_fail_at_once() -> Iterator[None]:
    """Turn a refusal that a retry cannot change into ``AirflowFailException`` (no retries).

    A configuration error, a sink refusing an epoch, a decision conflict
    (:func:`core.errors.retryable` is False) would fail every retry the same way, for as
    long as the task's retries last; a storage or network failure is raised as it is and
    retried by Airflow.
    """
    try:
        yield
    except AirflowFailException:
        raise
    except Exception as exc:
        if retryable(exc):
            raise
        raise AirflowFailException(f"{type(exc).__name__}: {exc} (not retried: a retry cannot change it)") from exc


class BaseStoreOperator(BaseOperator):
    """The store arguments of a task, and the hook built from them.

    A base for operators, sensors and branch operators alike: put it first among the
    bases (``class MySensor(BaseStoreOperator, BaseSensorOperator)``).

    :param store_conn_id: connection of type ``seatunnel_ckpt``; ``None`` uses
        ``storage_url``, else the provider's default (connection ``seatunnel_ckpt_default``
        if defined, else ``$SEATUNNEL_CKPT_STORE`` or ``$AIRFLOW_HOME/seatunnel-ckpt``).
    :param storage_url: store URL, overriding the connection's.
    :param store_config: further ``CheckpointConfig`` fields (``prepared_timeout_s`` ...);
        they win over the connection and over the pipeline's descriptor.
    """

    store_conn_id: str | None
    storage_url: str | None
    store_config: dict[str, Any]

    def __init__(self, *, store_conn_id: str | None = None, storage_url: str | None = None,
                 store_config: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        settings = StoreSettings.of(store_conn_id, storage_url, store_config)
        settings.check(self.where)  # when the DAG is parsed: an import error, not a failed task
        self.store_conn_id = settings.conn_id
        self.storage_url = settings.storage_url
        self.store_config = dict(settings.store_config)

    @property
    def where(self) -> str:
        """This task, for error messages: ``"DAG 'orders', task 'epoch.ingest'"``."""
        dag_id = getattr(self, "dag_id", None)
        return f"DAG {dag_id!r}, task {self.task_id!r}" if dag_id else f"task {self.task_id!r}"

    @property
    def store_settings(self) -> StoreSettings:
        """The (rendered) store arguments as one typed value."""
        return StoreSettings.of(self.store_conn_id, self.storage_url, self.store_config)

    @cached_property
    def hook(self) -> CheckpointStoreHook:
        """The checkpoint-store hook (created after templates are rendered)."""
        return CheckpointStoreHook.from_settings(self.store_settings)


class BasePipelineOperator(BaseStoreOperator):
    """Arguments and lookups shared by the stage, sensor, branch, commit and abort tasks.

    :param pipeline: pipeline name (a directory below the store root).
    """

    pipeline: str
    #: This task's own participant, when it is a stage (see :meth:`declare_participant`).
    declared_participant: tuple[str, ParticipantDescriptor] | None = None
    #: Every participant of the pipeline, when the task group that built the task knows them.
    declared_pipeline: dict[str, ParticipantDescriptor] | None = None
    #: Set by a stage run with try number 0 (``airflow tasks test``): the descriptor is not written.
    is_dry_run: bool = False

    def __init__(self, *, pipeline: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pipeline = pipeline

    def declare_participant(self, name: str, sources: Mapping[str, Any] | None,
                            sinks: Mapping[str, Any] | None) -> None:
        """Mark this task as a stage: it prepares ``name`` reading ``sources``, writing ``sinks``.

        Called from a stage operator's constructor (with the options as written in the DAG,
        before templates render, so a templated path does not change the descriptor on
        every run). Before it opens the pipeline, a stage task records the declaration in
        the pipeline's descriptor and is refused if another DAG owns the pipeline.
        """
        self.declared_participant = (name, ParticipantDescriptor.from_spec(sources, sinks))

    @cached_property
    def store_pipeline(self) -> Pipeline:
        """The core :class:`Pipeline` this task works on (its descriptor ensured for a stage)."""
        pipeline = self.hook.get_pipeline(self.pipeline)
        if self.declared_participant is not None:
            if self.declared_pipeline is not None:
                participants, complete = dict(self.declared_pipeline), True
            else:
                participants, complete = dict([self.declared_participant]), False
            descriptor = ensure_descriptor(
                pipeline, dag_id=self._dag_id(), participants=participants, config=self.hook.config,
                store_conn_id=self.hook.resolved_conn_id, complete=complete, write=not self.is_dry_run)
            if pipeline.config != descriptor.apply_config(pipeline.config, self.store_config):
                pipeline = self.hook.get_pipeline(self.pipeline)
        return pipeline

    def _dag_id(self) -> str:
        dag_id: str = getattr(self, "dag_id", "") or ""
        return dag_id

    def epoch_of_run(self, context: Context) -> int | None:
        """The epoch the DAG run of ``context`` holds, or ``None`` if it has not begun one."""
        return self.store_pipeline.epoch_for_run(context["run_id"], dag_id=context["dag"].dag_id)

    def metric_tags(self) -> dict[str, str]:
        """Tags attached to every metric this task emits."""
        return {"pipeline": self.pipeline}
