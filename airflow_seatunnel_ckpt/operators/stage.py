"""The stage task: run a PySpark stage as the prepare phase (phase one) of the run's epoch."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import conf

from airflow_seatunnel_ckpt.core import layout
from airflow_seatunnel_ckpt.core.errors import CheckpointError, DecisionConflictError, PendingEpochError
from airflow_seatunnel_ckpt.core.models import BeginRecord, PreparedRecord
from airflow_seatunnel_ckpt.core.protocol.lease import (
    EpochLiveness,
    Liveness,
    abort_command,
    lease_timeout,
    read_lease,
    store_now,
)
from airflow_seatunnel_ckpt.core.protocol.recovery import RecoveryStep, resolve_epoch
from airflow_seatunnel_ckpt.core.protocol.submissions import SubmissionCheck, SubmissionOutcome
from airflow_seatunnel_ckpt.hooks.stage_submit import StageSubmitHook
from airflow_seatunnel_ckpt.operators import metrics
from airflow_seatunnel_ckpt.operators.base import PIPELINE_TEMPLATE_FIELDS, BasePipelineOperator
from airflow_seatunnel_ckpt.operators.termination import StageTerminatedError, quiet_py4j, stop_local_spark
from airflow_seatunnel_ckpt.spark.declaration import StageDeclaration  # imports no PySpark

if TYPE_CHECKING:
    from airflow.providers.openlineage.extractors import OperatorLineage
    from airflow.sdk import Context

    from airflow_seatunnel_ckpt.core import Pipeline
    from airflow_seatunnel_ckpt.spark.spec import StageResult, StageSpec

#: The attempt id of a run with try number 0, which Airflow gives a task it runs without the
#: scheduler (``airflow tasks test``). It is kept apart from the ids of real tries (1, 2, ...)
#: so that such a run never shares a staging directory or lease with a scheduled try of the
#: same DAG run; which of them prepares first still wins, as for any two attempts.
UNSCHEDULED_ATTEMPT = 1_000_000


def attempt_for_try(try_number: int) -> int:
    """The stage's attempt id for Airflow's ``try_number`` (see :data:`UNSCHEDULED_ATTEMPT`)."""
    if try_number == 0:
        return UNSCHEDULED_ATTEMPT
    return try_number


#: DAG run states after which a run never touches its epoch again.
TERMINAL_RUN_STATES = ("success", "failed")

_log = logging.getLogger(__name__)


def ask_airflow_run_finished(context: Context, default_dag_id: str | None = None) -> Callable[[str, str], bool | None]:
    """``run_finished(run_id, dag_id)`` for :func:`~airflow_seatunnel_ckpt.core.protocol.lease.liveness`.

    Asks the Airflow API (through the task's supervisor) for the state of the DAG run that
    began an epoch: ``True`` when it is in a terminal state, ``False`` while it runs,
    ``None`` when Airflow cannot say (no such run in that DAG, e.g. an epoch begun from the
    command line, or the DAG is unknown) -- then only the lease decides.
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


def _is_deferral(exc: BaseException) -> bool:
    """Whether ``exc`` is Airflow's deferral of the task (not a failure)."""
    from airflow.sdk.exceptions import TaskDeferred

    return isinstance(exc, TaskDeferred)


def airflow_context_of(context: Context, task_id: str) -> dict[str, Any]:
    """The part of the Airflow context a stage sees on ``ctx`` (JSON data; no try number)."""
    from airflow_seatunnel_ckpt.spark.context import AirflowContext

    dag = context.get("dag")
    params = context.get("params") or {}
    return AirflowContext(
        dag_id=getattr(dag, "dag_id", None), task_id=task_id, run_id=context.get("run_id"),
        logical_date=context.get("logical_date"),
        data_interval_start=context.get("data_interval_start"),
        data_interval_end=context.get("data_interval_end"),
        params=dict(params),
    ).to_dict()


def _what_the_wait_is_for(judged: EpochLiveness, pipeline: Pipeline) -> str:
    """Why a live-looking earlier epoch is waited for, and until when at the latest.

    A stage killed outright (SIGKILL, a lost host) leaves its lease as it last renewed it:
    it looks alive until the lease is as old as its timeout (the holder's own when longer than
    ``lease_timeout_s``), however dead its process is.
    """
    if judged.liveness is not Liveness.ALIVE or judged.age_s is None:
        return ""
    left = max(lease_timeout(pipeline.config, judged.lease) - judged.age_s, 0)
    holder = "its stage" if judged.lease is None else f"its stage ({judged.lease.describe_holder()})"
    return (f"; waiting for {holder} to prepare, or -- if that stage was killed and renews its lease no more -- "
            f"for the lease to expire in {left:.0f}s at the latest, when this run aborts the epoch")


class PendingEpochWaitMixin(BasePipelineOperator):
    """Begin the run's epoch; an earlier undecided epoch is waited for, or resolved.

    A new epoch cannot begin while an earlier one is undecided. Instead of failing (and
    burning a retry), the task has it resolved
    (:func:`~airflow_seatunnel_ckpt.core.protocol.recovery.resolve_epoch`, asking Airflow whether
    its owning run is finished):

    * dead (lease expired, prepared too long ago, or its DAG run is finished -- e.g. marked
      failed or success in the UI): it is aborted here, and this run begins;
    * decided commit but not yet published: it is published (roll forward), and this run begins;
    * alive: the task is *rescheduled* (``AirflowRescheduleException``: the worker slot is
      freed, the try number is kept, no triggerer is needed) and looks again after
      ``pending_poke_interval`` seconds, for at most ``pending_wait_timeout`` seconds in all.
    """

    pending_poke_interval: float
    pending_wait_timeout: float | None

    def begin_epoch(self, context: Context) -> BeginRecord:
        """The run's epoch, once no earlier epoch blocks it (or reschedule the task)."""
        pipeline = self.store_pipeline
        run_id = context["run_id"]
        # Recorded in ``begin`` so that `seatunnel-ckpt epochs` can show which interval an
        # epoch processed (Airflow 3 runs may have none: manual and asset-triggered runs).
        logical = context.get("logical_date")
        logical_date = logical.isoformat() if logical is not None else ""
        for _ in range(10):
            try:
                return pipeline.begin(run_id, logical_date=logical_date)
            except PendingEpochError as exc:
                if exc.epoch <= 0 or not self._resolve_pending(context, pipeline, exc):
                    raise
        return pipeline.begin(run_id, logical_date=logical_date)

    def _resolve_pending(self, context: Context, pipeline: Pipeline, exc: PendingEpochError) -> bool:
        """True if the blocking epoch is out of the way now; else reschedule or raise."""
        from airflow.sdk.exceptions import AirflowRescheduleException

        epoch = exc.epoch
        me = f"stage {context['dag'].dag_id}/{context['run_id']}/{self.task_id}"
        run_finished = ask_airflow_run_finished(context, context["dag"].dag_id)
        resolution = resolve_epoch(pipeline, epoch, run_finished=run_finished, by=me)
        lease_s = pipeline.config.lease_timeout_s
        if resolution.step is RecoveryStep.INSPECT:
            raise CheckpointError(f"pipeline {pipeline.name!r}: epoch {epoch} blocks this run and {resolution.reason}: "
                                  f"{resolution.error}") from exc
        if resolution.step is RecoveryStep.FINISH_COMMIT and resolution.error:
            self.log.warning("epoch %s is decided commit; publishing it failed (%s); waiting", epoch, resolution.error)
            judged_text = f"epoch {epoch} is COMMITTING and its publish failed: {resolution.error}"
        elif resolution.waits and resolution.judged is not None:
            judged_text = resolution.judged.describe() + _what_the_wait_is_for(resolution.judged, pipeline)
            lease_s = lease_timeout(pipeline.config, resolution.judged.lease)  # its holder's, when longer
        else:
            # Out of the way: rolled forward, aborted (by this run or, meanwhile, by another),
            # or decided meanwhile; begin again.
            if resolution.step is RecoveryStep.FINISH_COMMIT:
                self.log.info("epoch %s was decided commit but not published: published it (roll forward)", epoch)
            elif resolution.judged is not None and resolution.done:
                self.log.warning("%s; aborted it so that this run can begin", resolution.judged.describe())
            elif resolution.error:
                self.log.info("epoch %s could not be aborted (%s); looking again", epoch, resolution.error)
            return True
        waited = self._waited_s(context)
        limit = self.pending_wait_timeout
        if limit is None:
            config = pipeline.config
            limit = max(lease_s, config.prepared_timeout_s) + 60
        command = abort_command(pipeline, epoch)
        if waited >= limit:
            raise PendingEpochError(
                f"pipeline {pipeline.name!r}: waited {waited:.0f}s (pending_wait_timeout={limit:g}s) for an "
                f"earlier epoch, which is still not dead: {judged_text}. If its run is dead, abort it now with "
                f"`{command}`; otherwise let it finish and clear this task.", epoch) from exc
        self.log.info("%s; this run waits (rescheduled in %gs, waited %.0fs of %gs). To abort it now: `%s`",
                      judged_text, self.pending_poke_interval, waited, limit, command)
        raise AirflowRescheduleException(datetime.now(tz=UTC) + timedelta(seconds=self.pending_poke_interval))

    def _waited_s(self, context: Context) -> float:
        """Seconds since this try was first rescheduled (0 on the first look)."""
        try:
            first = context["ti"].get_first_reschedule_date(context)
        except Exception:  # an Airflow that cannot say: count from now
            first = None
        if first is None:
            return 0.0
        return max(0.0, (datetime.now(tz=UTC) - first).total_seconds())



class SparkStageOperator(PendingEpochWaitMixin):
    """Run a PySpark stage for the run's epoch and log it *prepared*.

    The stage function (``"package.module:function"``, see
    :mod:`airflow_seatunnel_ckpt.spark`) reads only new input, updates keyed state and
    writes its sinks into attempt-isolated staging; the runtime then writes the
    checkpoint parts and the prepared record. Nothing is published here: that is the
    commit task's job once the branch decided.

    Without ``conn_id`` the stage runs in this process on a ``local[*]`` SparkSession
    (the embedded default). With ``conn_id`` (a Spark connection) it is launched through
    the Apache Spark provider's ``SparkSubmitHook`` running the same driver module, on
    whichever master the connection names.

    Safe to retry and clear: the Airflow try number is the attempt id, so a retry stages
    into its own directory; if the participant is already prepared for this run's epoch
    the task returns that record instead of running Spark again (the first prepared
    attempt wins and later ones would be fenced). A run whose epoch was aborted gets a
    fresh epoch from ``Pipeline.begin``.

    A run whose epoch cannot begin because an earlier epoch is undecided waits for it
    (rescheduled, no retry spent), and aborts it itself once it is dead: its stage's lease
    expired, or its DAG run is finished (e.g. marked failed in the UI). See
    :class:`PendingEpochWaitMixin`.

    With ``conn_id`` the process work (submit detached, reconnect on a retry, cancel, wait)
    is :class:`~airflow_seatunnel_ckpt.hooks.stage_submit.StageSubmitHook`'s; a deferred
    try hands the wait to
    :class:`~airflow_seatunnel_ckpt.triggers.submission.StageSubmissionTrigger`.

    Returns (XCom) the epoch, the attempt and the sink manifests.

    :param stage: the stage function, or its import path ``"module:function"``. A function
        is called directly in-process; with ``conn_id`` (``spark-submit``) the driver imports
        it by its module path, so it must be defined at the top level of an importable module.
        The stage gets the Airflow run's logical date, data interval and params on ``ctx``.
    :param sources: source name -> source options (``type``, ``path``, ``format`` ...).
    :param sinks: sink name -> sink options (``type``, ``path``, ``format`` ...).
    :param participant: name of this stage in the epoch; defaults to the task id
        without its TaskGroup prefix.
    :param key_groups: number of key groups of the keyed state (fixed for the life of the
        pipeline's state); ``None`` uses the runtime's default.
    :param spark_conf: Spark configuration for the session / ``spark-submit --conf``.
    :param conn_id: Spark connection for ``spark-submit``; ``None`` runs in-process.
    :param spark_submit_kwargs: further ``SparkSubmitHook`` arguments (``py_files``,
        ``executor_memory``, ``deploy_mode`` ...).
    :param pending_poke_interval: seconds between looks at an earlier undecided epoch.
    :param pending_wait_timeout: seconds to wait for it in all before failing; default
        ``max(lease_timeout_s, prepared_timeout_s) + 60`` (with the blocking stage's own
        lease timeout when it is longer), by when a dead epoch is always recognised as dead.
    """

    template_fields: Sequence[str] = (*PIPELINE_TEMPLATE_FIELDS, "stage", "sources", "sinks",
                                      "participant", "spark_conf", "conn_id")
    template_fields_renderers = {"sources": "json", "sinks": "json", "spark_conf": "json"}
    ui_color = "#fcf3cf"

    def __init__(
        self,
        *,
        stage: str | Callable[..., Any],
        sources: Mapping[str, Mapping[str, Any]],
        sinks: Mapping[str, Mapping[str, Any]],
        participant: str | None = None,
        key_groups: int | None = None,
        spark_conf: Mapping[str, Any] | None = None,
        conn_id: str | None = None,
        spark_submit_kwargs: Mapping[str, Any] | None = None,
        pending_poke_interval: float = 15.0,
        pending_wait_timeout: float | None = None,
        python: str | None = None,
        archives: Sequence[str] | None = None,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        poll_interval: float = 10.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.participant = participant or self.task_id.rsplit(".", 1)[-1]
        # When the DAG is parsed: a mistake is an import error of the DAG file (templated
        # values are checked again once rendered, in execute).
        declared = StageDeclaration.check(participant=self.participant, stage=stage, sources=sources,
                                          sinks=sinks, importable=bool(conn_id), where=self.where)
        #: The stage's import path (derived from the function when one was given).
        self.stage = declared.stage
        #: The stage function itself, when the DAG passed it (called directly in-process).
        self.stage_callable = None if isinstance(stage, str) else stage
        self.sources = {name: dict(opts) for name, opts in sources.items()}
        self.sinks = {name: dict(opts) for name, opts in sinks.items()}
        self.declare_participant(self.participant, self.sources, self.sinks)
        self.key_groups = key_groups
        self.spark_conf = dict(spark_conf or {})
        self.conn_id = conn_id
        self.spark_submit_kwargs = dict(spark_submit_kwargs or {})
        self.pending_poke_interval = pending_poke_interval
        self.pending_wait_timeout = pending_wait_timeout
        self.python = python
        self.archives = list(archives or [])
        self.deferrable = deferrable
        self.poll_interval = poll_interval
        self._submit_hook: StageSubmitHook | None = None

    def execute(self, context: Context) -> dict[str, Any]:
        """Prepare the run's epoch (or return the attempt that already did)."""
        from airflow_seatunnel_ckpt.hooks.kafka import with_kafka_connections
        from airflow_seatunnel_ckpt.lineage.spark import with_openlineage_spark_properties
        from airflow_seatunnel_ckpt.spark import StageResult, StageSpec, run_stage

        # The rendered values (a templated path, format or URL) are checked now.
        StageDeclaration.check(participant=self.participant, stage=self.stage_callable or self.stage,
                               sources=self.sources, sinks=self.sinks, importable=bool(self.conn_id),
                               where=self.where)
        run_id = context["run_id"]
        try_number = context["ti"].try_number
        attempt = attempt_for_try(try_number)
        # Before the store is opened: a dry run writes no descriptor version.
        self.is_dry_run = try_number == 0
        existing = self._already_prepared(run_id)
        if existing is not None:
            # Checked here too so that spark-submit is not even launched.
            return StageResult.from_prepared(self.pipeline, existing, reused=True).to_dict()
        dry_run = try_number == 0
        began_here = dry_run and self.store_pipeline.epoch_for_run(run_id) is None
        # Begin here, before Spark starts: an earlier undecided epoch is waited for (or
        # aborted when dead) without launching anything or spending a retry.
        epoch = self.begin_epoch(context).epoch
        if not self.conn_id and not dry_run:  # (a submitted attempt outlives its try: a retry reconnects)
            self._log_earlier_attempt(epoch, attempt)
        optional: dict[str, Any] = {}
        if self.key_groups is not None:
            optional["key_groups"] = self.key_groups
        spec = StageSpec(
            pipeline=self.pipeline, participant=self.participant, run_id=run_id, attempt=attempt,
            stage=self.stage, sources=with_kafka_connections(self.sources), sinks=self.sinks,
            store=self.hook.config.to_mapping(include_secrets=True),
            spark_conf=with_openlineage_spark_properties(self.spark_conf, context) if self.conn_id else self.spark_conf,
            airflow_context=airflow_context_of(context, self.task_id), dry_run=dry_run,
            **optional)
        self.log.info("pipeline %s: running stage %s as participant %s, attempt %s, %s",
                      self.pipeline, self.stage, self.participant, attempt,
                      f"through spark-submit (connection {self.conn_id})" if self.conn_id
                      else "in-process on local Spark")
        try:
            if self.conn_id:
                # Detached: a killed try leaves it running, and the next try reconnects to it;
                # a try ended while deferred has it stopped. ``airflow tasks test`` waits in-process.
                return self._submit(context, spec, epoch, wait=dry_run or not self.deferrable,
                                    began_here=began_here)
            result = run_stage(spec, stage_fn=self.stage_callable)
        except BaseException as exc:
            if began_here and not _is_deferral(exc):
                self._end_dry_run(epoch, "failed")
            self._raise_if_terminated(exc, epoch, attempt)
            raise
        return self._prepared(result, attempt, began_here)

    def _submit(self, context: Context, spec: StageSpec, epoch: int, *, wait: bool,
                began_here: bool = False) -> dict[str, Any]:
        """Launch the stage (or find the attempt of an earlier try still running), then wait or defer."""
        from airflow_seatunnel_ckpt.triggers.submission import StageSubmissionTrigger

        hook = self.submit_hook
        try_number = context["ti"].try_number
        record = hook.submit(spec, epoch, try_number)
        if wait:
            return self._finish_submission(context, hook.wait(record, on_line=self._spark_line), began_here)
        # From here the attempt is the triggerer's to watch: a later try that finds it running stops it.
        hook.hand_to_triggerer(record, try_number)
        self.defer(trigger=StageSubmissionTrigger(
            pipeline=self.pipeline, epoch=record.epoch, participant=self.participant, attempt=record.attempt,
            store_conn_id=self.store_conn_id, storage_url=self.storage_url, store_config=self.store_config,
            poll_interval=self.poll_interval, log=record.log, log_host=record.host), method_name="execute_complete")
        raise AssertionError("defer() returned")  # pragma: no cover - defer always raises

    @property
    def submit_hook(self) -> StageSubmitHook:
        """The hook that submits, reconnects to, cancels and waits for this stage's ``spark-submit``."""
        if self._submit_hook is None:
            self._submit_hook = StageSubmitHook(
                self.store_pipeline, self.participant, conn_id=self.conn_id,
                spark_submit_kwargs=self.spark_submit_kwargs, python=self.python, archives=self.archives,
                poll_interval=self.poll_interval, by=f"stage {self.where}")
        return self._submit_hook

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None) -> dict[str, Any]:
        """Resume once the submission trigger fired."""
        from airflow.sdk.exceptions import AirflowFailException

        from airflow_seatunnel_ckpt.spark.submit import SubmitError

        if not event:
            raise AirflowFailException("the submission trigger fired without an event")
        if event.get("error"):
            raise SubmitError(f"pipeline {self.pipeline}: {event.get('message')}")
        return self._finish_submission(context, SubmissionCheck.from_dict(event))

    def _finish_submission(self, context: Context, check: SubmissionCheck,
                           began_here: bool = False) -> dict[str, Any]:
        """The result of a finished submission; a reconnected attempt that failed is submitted anew."""
        self.submit_hook.finish(check)
        mine = attempt_for_try(context["ti"].try_number)
        if check.outcome in (SubmissionOutcome.FAILED, SubmissionOutcome.LOST) and check.attempt != mine:
            self.log.warning("%s; submitting this try's own attempt %s", check.message, mine)
            return self.execute(context)
        return self._prepared(self.submit_hook.result(check, self.stage), mine, began_here)

    def _spark_line(self, line: str) -> None:
        """A line of spark-submit's output, into the task log (at INFO: Spark's stderr is not an error)."""
        self.log.info("%s", line)

    def _log_earlier_attempt(self, epoch: int, attempt: int) -> None:
        """Say what an earlier attempt of this stage left in the epoch: its lease.

        A try that was killed outright (SIGKILL: out of memory, a lost worker) logs nothing
        itself; Airflow reports only the signal. Its lease tells who ran it and when it last
        renewed, i.e. about when it died. Only read, never fatal.
        """
        pipeline = self.store_pipeline
        try:
            lease = read_lease(pipeline.storage, epoch, self.participant)
            if lease is None or lease.attempt == attempt:
                return
            age = store_now(pipeline.storage) - pipeline.storage.modified(layout.lease_path(epoch, self.participant))
        except (CheckpointError, OSError) as exc:
            self.log.info("epoch %s: could not read the lease an earlier attempt of %s left: %s",
                          epoch, self.participant, exc)
            return
        self.log.warning(
            "epoch %s: an earlier attempt of %s ran and did not prepare: its lease says %s, last renewed %.0fs ago "
            "(renewal every %gs; generation %s). It ended there -- killed (e.g. SIGKILL when out of memory), its "
            "worker lost, or failed -- and this attempt %s runs the stage again; the earlier attempt's staging "
            "is never published", epoch, self.participant, lease.describe_holder(), max(age, 0),
            pipeline.config.lease_renew_s, lease.generation, attempt)

    def _prepared(self, result: StageResult, attempt: int, began_here: bool = False) -> dict[str, Any]:
        """Log and return (XCom) a stage result."""
        if result.reused:
            self.log.warning("attempt %s did not prepare: attempt %s's prepared output for epoch "
                             "%s stands", attempt, result.attempt, result.epoch)
        else:
            metrics.checkpoint_written(self.metric_tags(), result.checkpoint_bytes)
        self.log.info("epoch %s: %s attempt %s prepared: rows staged per sink: %s; %s checkpoint "
                      "bytes written", result.epoch, self.participant, result.attempt,
                      ", ".join(f"{m.sink}={m.rows}" for m in result.manifests) or "no sink",
                      result.checkpoint_bytes)
        if began_here and not result.reused:
            self._end_dry_run(result.epoch, f"prepared as attempt {result.attempt}")
        return result.to_dict()

    def get_openlineage_facets_on_start(self) -> OperatorLineage:
        """OpenLineage at the start: the declared sources and sinks, the pipeline and participant."""
        from airflow_seatunnel_ckpt.lineage.epoch import stage_lineage

        return stage_lineage(pipeline_name=self.pipeline, participant=self.participant,
                             sources=self.sources, sinks=self.sinks)

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> OperatorLineage:
        """OpenLineage once done: what the epoch's prepared record says was read and staged."""
        from airflow_seatunnel_ckpt.lineage.epoch import stage_lineage

        return stage_lineage(pipeline_name=self.pipeline, participant=self.participant, sources=self.sources,
                             sinks=self.sinks, pipeline=self.hook.get_pipeline(self.pipeline),
                             run_id=task_instance.run_id, attempt=attempt_for_try(task_instance.try_number))

    def get_openlineage_facets_on_failure(self, task_instance: Any) -> OperatorLineage:
        """OpenLineage of a failed try: as on completion (a try that did not prepare reports the declared datasets)."""
        return self.get_openlineage_facets_on_complete(task_instance)

    def on_kill(self) -> None:
        """Stop the stage's work when Airflow terminates this task (SIGTERM).

        Airflow 3's task runner only calls ``on_kill`` on SIGTERM (marked failed in the UI,
        a lost heartbeat); without this the stage runs on until the supervisor escalates to
        SIGKILL. A ``spark-submit`` stage this try waits for in-process is stopped by its
        hook (:meth:`StageSubmitHook.on_kill`); a deferred try holds no process: its
        trigger's ``on_kill`` stops the submission, and so does the next try if the trigger
        never ran. An in-process stage has its Spark jobs cancelled
        (:func:`~airflow_seatunnel_ckpt.operators.termination.stop_local_spark`): it fails
        now with one error, :class:`StageTerminatedError` (see :meth:`_raise_if_terminated`),
        its attempt unprepared; a retry stages anew.
        """
        if self._submit_hook is not None and self._submit_hook.on_kill():
            return
        quiet_py4j()
        self._terminated = True
        if not self.conn_id:
            stop_local_spark(lambda: self.log.warning(
                "terminated: cancelling the Spark jobs of stage %s and stopping its session; this attempt stays "
                "unprepared", self.participant))

    def _raise_if_terminated(self, exc: BaseException, epoch: int, attempt: int) -> None:
        """After ``on_kill``, replace the interrupted Spark call's error by one clear error.

        The cancelled job's Java stack trace, py4j's network errors and PySpark's clean-up
        on a stopped context are all consequences of the termination; the task fails with
        :class:`StageTerminatedError` alone (``from None``: no chained tracebacks). An
        error of the task runner itself (timeout, deferral), and a ``spark-submit`` stage's
        error, pass through unchanged.
        """
        if self.conn_id or not getattr(self, "_terminated", False) or not isinstance(exc, Exception):
            return  # (a spark-submit stage's error is the hook's to tell)
        _log.debug("the interrupted stage raised %s: %s", type(exc).__name__, exc)
        raise StageTerminatedError(
            f"stage {self.participant} of pipeline {self.pipeline!r} was terminated "
            f"(SIGTERM) while Spark ran: epoch {epoch}, attempt {attempt} stays "
            "unprepared and a retry stages anew (nothing was published)") from None

    def _end_dry_run(self, epoch: int, outcome: str) -> None:
        """Abort the epoch a run with try number 0 (``airflow tasks test``) began.

        Nothing runs after such a task, and its DAG run may be deleted when it ends; an
        epoch left open or PREPARED would hold up every later run until it timed out. The
        stage ran and staged its output, which is what the test shows; nothing is published.
        """
        try:
            self.store_pipeline.abort(epoch, f"dry run of {self.where} (Airflow try number 0, e.g. "
                                      f"`airflow tasks test`): {outcome}, not published", by=f"stage {self.where}")
        except DecisionConflictError:  # decided meanwhile by another tool: leave it to that decision
            return
        self.log.warning("try number 0 (`airflow tasks test`): epoch %s %s, then aborted, so that nothing "
                         "is published and no later run waits for it", epoch, outcome)

    def _already_prepared(self, run_id: str) -> PreparedRecord | None:
        """The participant's prepared record for this run's live epoch, if any."""
        record = self.store_pipeline.prepared_for_run(run_id, self.participant)
        if record is not None:
            self.log.info("epoch %s: %s was already prepared by attempt %s; not running "
                          "Spark again", record.epoch, self.participant, record.attempt)
        return record
