"""What every task of the provider shares: a checkpoint store, and one pipeline in it.

The store arguments are taken by :class:`BaseStoreOperator` and resolved by
:class:`~airflow_seatunnel_ckpt.hooks.checkpoint_store.StoreSettings`. Each pipeline task
finds its epoch from its DAG and run id, never from XCom or a clock, so a retried or
cleared task lands on the same epoch as the rest of its run.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime, timedelta
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException

from airflow_seatunnel_ckpt.core.errors import retryable
from airflow_seatunnel_ckpt.core.protocol.descriptor import ParticipantDescriptor, ensure_descriptor
from airflow_seatunnel_ckpt.core.protocol.recovery import PendingWait, begin_unblocked, clock_time
from airflow_seatunnel_ckpt.hooks.checkpoint_store import CheckpointStoreHook, StoreSettings

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_seatunnel_ckpt.core import BeginRecord, Pipeline

STORE_TEMPLATE_FIELDS: tuple[str, ...] = ("store_conn_id", "storage_url")
PIPELINE_TEMPLATE_FIELDS: tuple[str, ...] = ("pipeline", *STORE_TEMPLATE_FIELDS)
#: DAG run states after which a run never touches its epoch again.
TERMINAL_RUN_STATES = ("success", "failed")

_log = logging.getLogger(__name__)


def ask_airflow_run_finished(context: Context, default_dag_id: str | None = None) -> Callable[[str, str], bool | None]:
    """``run_finished(run_id, dag_id)`` for :func:`~airflow_seatunnel_ckpt.core.protocol.lease.liveness`.

    Asks the Airflow API whether the DAG run that began an epoch is finished; ``None`` when
    Airflow cannot say (e.g. an epoch begun from the command line): then the lease decides.
    """
    ti = context["ti"]

    def finished(run_id: str, dag_id: str) -> bool | None:
        dag = dag_id or default_dag_id
        if not dag:
            return None
        try:
            state = ti.get_dagrun_state(dag_id=dag, run_id=run_id)
        except Exception as exc:  # not found, API unreachable: unknown, never fatal
            _log.info("cannot ask Airflow for the state of run %r of DAG %r: %s", run_id, dag, exc)
            return None
        return str(getattr(state, "value", state)) in TERMINAL_RUN_STATES

    return finished


@contextlib.contextmanager
def refusals_fail_at_once() -> Iterator[None]:
    """Turn a refusal that a retry cannot change (:func:`core.errors.retryable` is False) into
    ``AirflowFailException`` (no retries); a storage or network failure is retried by Airflow."""
    try:
        yield
    except AirflowFailException:
        raise
    except Exception as exc:
        if retryable(exc):
            raise
        raise AirflowFailException(f"{type(exc).__name__}: {exc} (not retried: a retry cannot change it)") from exc


class BaseStoreOperator(BaseOperator):
    """The store arguments of a task, and the hook built from them (put it first among the bases).

    :param store_conn_id: connection of type ``seatunnel_ckpt`` (without one: see :class:`StoreSettings`).
    :param storage_url: store URL, overriding the connection's.
    :param store_config: further ``CheckpointConfig`` fields; they win over the connection and the descriptor.
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
    declared_participant: tuple[str, ParticipantDescriptor] | None = None  # this stage's own
    declared_pipeline: dict[str, ParticipantDescriptor] | None = None  # all, when a task group built it
    is_dry_run: bool = False

    def __init__(self, *, pipeline: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pipeline = pipeline

    def declare_participant(self, name: str, sources: Mapping[str, Any] | None,
                            sinks: Mapping[str, Any] | None) -> None:
        """Mark this task as a stage: it prepares ``name`` reading ``sources``, writing ``sinks``.

        Called with the options as written in the DAG, before templates render, so a
        templated path does not change the descriptor on every run.
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
                pipeline, dag_id=getattr(self, "dag_id", None) or "", participants=participants,
                config=self.hook.config, store_conn_id=self.hook.resolved_conn_id, complete=complete,
                write=not self.is_dry_run)
            if pipeline.config != descriptor.apply_config(pipeline.config, self.store_config):
                pipeline = self.hook.get_pipeline(self.pipeline)
        return pipeline

    def epoch_of_run(self, context: Context) -> int | None:
        """The epoch the DAG run of ``context`` holds, or ``None`` if it has not begun one."""
        return self.store_pipeline.epoch_for_run(context["run_id"], dag_id=context["dag"].dag_id)

    def begin_epoch(self, context: Context, *, poke_interval: float, wait_timeout: float | None) -> BeginRecord:
        """The run's epoch, once no earlier undecided epoch blocks it (:func:`~.recovery.begin_unblocked`).

        While the blocking epoch is alive the task is *rescheduled* (the worker slot freed,
        the try number kept) and looks again after ``poke_interval`` seconds.
        """
        from airflow.sdk.exceptions import AirflowRescheduleException

        dag_id, run_id = context["dag"].dag_id, context["run_id"]
        logical = context.get("logical_date")  # recorded in ``begin``: which interval the epoch processed
        begun = begin_unblocked(
            self.store_pipeline, run_id, logical_date=logical.isoformat() if logical is not None else "",
            run_finished=ask_airflow_run_finished(context, dag_id), by=f"stage {dag_id}/{run_id}/{self.task_id}",
            waited_s=lambda: _waited_s(context), wait_timeout_s=wait_timeout)
        if not isinstance(begun, PendingWait):
            return begun
        # Every look is a new try of the task: what it waits for is said on the first look and
        # then once a minute, not on every look (every few seconds while a dead lease runs out).
        if _first_look_of_a_minute(begun.waited_s, poke_interval):
            self.log.info("%s; this run waits, looking again every %gs, until %s at the latest "
                          "(pending_wait_timeout=%gs; waited %.0fs; this line once a minute). To abort it now: `%s`",
                          begun.reason, poke_interval, clock_time(time.time() + begun.limit_s - begun.waited_s),
                          begun.limit_s, begun.waited_s, begun.command)
        raise AirflowRescheduleException(datetime.now(tz=UTC) + timedelta(seconds=poke_interval))

    def metric_tags(self) -> dict[str, str]:
        """Tags attached to every metric this task emits."""
        return {"pipeline": self.pipeline}


WAIT_LOG_EVERY_S = 60.0


def _first_look_of_a_minute(waited_s: float, poke_interval: float) -> bool:
    """Whether a look ``waited_s`` into a wait (looks ``poke_interval`` apart) logs the wait: the
    first look, then the first look of each :data:`WAIT_LOG_EVERY_S`."""
    return waited_s <= 0 or waited_s // WAIT_LOG_EVERY_S > max(waited_s - poke_interval, 0) // WAIT_LOG_EVERY_S


def _waited_s(context: Context) -> float:
    """Seconds since this try was first rescheduled (0 on the first look)."""
    try:
        first = context["ti"].get_first_reschedule_date(context)
    except Exception:  # an Airflow that cannot say: count from now
        first = None
    return 0.0 if first is None else max(0.0, (datetime.now(tz=UTC) - first).total_seconds())
