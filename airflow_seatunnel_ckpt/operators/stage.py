"""The stage task: run a PySpark stage as the prepare phase (phase one) of the run's epoch."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import cached_property, partial
from typing import TYPE_CHECKING, Any

from airflow.sdk import conf
from airflow.sdk.exceptions import AirflowFailException

from airflow_seatunnel_ckpt.core.protocol.lease import SubmissionCheck
from airflow_seatunnel_ckpt.core.protocol.recovery import abort_unfollowed
from airflow_seatunnel_ckpt.hooks.stage_runtime import Runtime, RuntimeChoice, choose_runtime
from airflow_seatunnel_ckpt.hooks.stage_submit import StageSubmitHook, attempt_for_try
from airflow_seatunnel_ckpt.operators import metrics
from airflow_seatunnel_ckpt.pipeline_task import PIPELINE_TEMPLATE_FIELDS, BasePipelineOperator, refusals_fail_at_once
from airflow_seatunnel_ckpt.spark.declaration import StageDeclaration  # imports no PySpark

if TYPE_CHECKING:
    from airflow.providers.openlineage.extractors import OperatorLineage
    from airflow.sdk import Context

    from airflow_seatunnel_ckpt.core.protocol.lease import SubmissionRecord
    from airflow_seatunnel_ckpt.spark.spec import StageResult


class SparkStageOperator(BasePipelineOperator):
    """Run a PySpark stage for the run's epoch and log it *prepared* (nothing is published here).

    Where it runs is chosen by :func:`~airflow_seatunnel_ckpt.hooks.stage_runtime.choose_runtime`;
    the process work is :class:`~airflow_seatunnel_ckpt.hooks.stage_submit.StageSubmitHook`'s.
    Safe to retry and clear: the try number is the attempt id, and a participant already
    prepared for the run's epoch returns that record without running Spark. Returns (XCom)
    the epoch, the attempt and the sink manifests.

    :param stage: the stage function, or its import path ``"module:function"`` (which the
        driver imports with ``conn_id`` or a deferrable Connect stage).
    :param sources: source name -> source options; ``sinks``: sink name -> sink options.
    :param participant: name of this stage in the epoch; default the task id without its group.
    :param key_groups: key groups of the keyed state (fixed for its life); default the runtime's.
    :param spark_conf: Spark configuration for the session / ``spark-submit --conf``.
    :param conn_id: Spark connection for ``spark-submit``, or ``spark_connect`` connection;
        ``None`` runs in-process on local Spark (or on ``spark_remote``, a ``sc://`` URL).
    :param spark_submit_kwargs: further ``SparkSubmitHook`` arguments (``py_files`` ...).
    :param python: Python of the executors; ``archives``: for ``spark.archives`` (a packed venv).
    :param pending_poke_interval: seconds between looks at an earlier undecided epoch.
    :param pending_wait_timeout: seconds to wait for it before failing; default
        ``max(lease_timeout_s, prepared_timeout_s) + 60``.
    """

    template_fields: Sequence[str] = (*PIPELINE_TEMPLATE_FIELDS, "stage", "sources", "sinks",
                                      "participant", "spark_conf", "conn_id", "spark_remote")
    template_fields_renderers = {"sources": "json", "sinks": "json", "spark_conf": "json"}
    ui_color = "#fcf3cf"

    def __init__(self, *, stage: str | Callable[..., Any], sources: Mapping[str, Mapping[str, Any]],
                 sinks: Mapping[str, Mapping[str, Any]], participant: str | None = None,
                 key_groups: int | None = None, spark_conf: Mapping[str, Any] | None = None,
                 conn_id: str | None = None, spark_remote: str | None = None,
                 spark_submit_kwargs: Mapping[str, Any] | None = None, pending_poke_interval: float = 15.0,
                 pending_wait_timeout: float | None = None, python: str | None = None,
                 archives: Sequence[str] | None = None,
                 deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
                 poll_interval: float = 10.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.participant = participant or self.task_id.rsplit(".", 1)[-1]
        # When the DAG is parsed: a mistake is an import error of the DAG file (templated
        # values are checked again once rendered, in execute).
        declared = StageDeclaration.check(participant=self.participant, stage=stage, sources=sources,
                                          sinks=sinks, importable=bool(conn_id) or (deferrable and bool(spark_remote)),
                                          where=self.where)
        self.stage = declared.stage  # the import path, also of a function given
        self.stage_callable = None if isinstance(stage, str) else stage
        self.sources = {name: dict(opts) for name, opts in sources.items()}
        self.sinks = {name: dict(opts) for name, opts in sinks.items()}
        self.declare_participant(self.participant, self.sources, self.sinks)
        self.key_groups = key_groups
        self.spark_conf = dict(spark_conf or {})
        self.conn_id = conn_id
        self.spark_remote = spark_remote
        # Chosen when the task runs: the connection's type is known only then.
        self.runtime: RuntimeChoice | None = None
        self.spark_submit_kwargs = dict(spark_submit_kwargs or {})
        self.pending_poke_interval = pending_poke_interval
        self.pending_wait_timeout = pending_wait_timeout
        self.python = python
        self.archives = list(archives or [])
        self.deferrable = deferrable
        self.poll_interval = poll_interval

    def execute(self, context: Context) -> dict[str, Any]:
        """Prepare the run's epoch (or return the attempt that already did); a refusal fails at once."""
        with refusals_fail_at_once():
            return self._execute(context)

    def _execute(self, context: Context) -> dict[str, Any]:
        from airflow_seatunnel_ckpt.hooks.kafka import with_kafka_connections
        from airflow_seatunnel_ckpt.lineage.epoch import with_openlineage_spark_properties
        from airflow_seatunnel_ckpt.spark import DEFAULT_KEY_GROUPS, StageResult, StageSpec
        from airflow_seatunnel_ckpt.spark.context import AirflowContext

        # The rendered values (a templated path, format or URL) are checked now; the spec
        # carries the entries typed.
        importable = bool(self.conn_id) or (self.deferrable and bool(self.spark_remote))
        declared = StageDeclaration.check(participant=self.participant, stage=self.stage_callable or self.stage,
                                          sources=self.sources, sinks=self.sinks, importable=importable,
                                          where=self.where)
        self.runtime = choose_runtime(self.conn_id, self.spark_remote, self.where)
        run_id, try_number = context["run_id"], context["ti"].try_number
        attempt, dry_run = attempt_for_try(try_number), try_number == 0
        # A deferrable Connect stage runs detached too: its driver module in a process of its own.
        submitted = not self.runtime.in_process or (self.deferrable and not dry_run
                                                    and self.runtime.runtime is Runtime.CONNECT)
        self.is_dry_run = dry_run  # before the store is opened: a dry run writes no descriptor version
        existing = self.store_pipeline.prepared_for_run(run_id, self.participant)
        if existing is not None:  # checked here too so that spark-submit is not even launched
            self.log.info("epoch %s: %s was already prepared by attempt %s; not running Spark again",
                          existing.epoch, self.participant, existing.attempt)
            return StageResult.from_prepared(self.pipeline, existing, reused=True).to_dict()
        began_here = dry_run and self.store_pipeline.epoch_for_run(run_id) is None
        # Begin here, before Spark starts: an earlier undecided epoch is waited for (or
        # aborted when dead) without launching anything or spending a retry.
        epoch = self.begin_epoch(context, poke_interval=self.pending_poke_interval,
                                 wait_timeout=self.pending_wait_timeout).epoch
        spec = StageSpec(
            pipeline=self.pipeline, participant=self.participant, run_id=run_id, attempt=attempt,
            stage=self.stage, sources=with_kafka_connections({e.name: e.spec_options for e in declared.sources}),
            sinks={e.name: e.spec_options for e in declared.sinks},
            store=self.hook.config.to_mapping(include_secrets=True),
            spark_conf=with_openlineage_spark_properties(self.spark_conf, context)
            if self.runtime.runtime is Runtime.SPARK_SUBMIT else self.spark_conf,
            airflow_context=AirflowContext.of_task(context, self.task_id).to_dict(), dry_run=dry_run,
            remote=self.runtime.remote,
            key_groups=DEFAULT_KEY_GROUPS if self.key_groups is None else self.key_groups)
        self.log.info("pipeline %s: running stage %s as participant %s, attempt %s, %s", self.pipeline, self.stage,
                      self.participant, attempt, self.runtime.describe())
        hook = self.submit_hook
        try:
            if not submitted:
                result = hook.run_in_process(spec, epoch, self.stage_callable)
            else:
                # Detached: a killed try leaves it running, and the next try reconnects to it;
                # a try ended while deferred has it stopped. ``airflow tasks test`` waits in-process.
                record = hook.submit(spec, epoch, try_number)
                if not dry_run and self.deferrable:
                    self._defer(record, try_number)
                # spark-submit's output goes to the task log at INFO: Spark's stderr is not an error.
                return self._finish(context, hook.wait(record, on_line=partial(self.log.info, "%s")), began_here)
        except BaseException:
            if began_here:
                self._end_dry_run(epoch, "failed")
            raise
        return self._prepared(result, attempt, began_here)

    def _defer(self, record: SubmissionRecord, try_number: int) -> None:
        """Hand the wait for the submitted attempt to the triggerer (a later try that finds it running stops it)."""
        from airflow_seatunnel_ckpt.triggers.submission import StageSubmissionTrigger

        self.submit_hook.hand_to_triggerer(record, try_number)
        self.defer(trigger=StageSubmissionTrigger(
            pipeline=self.pipeline, epoch=record.epoch, participant=self.participant, attempt=record.attempt,
            store_conn_id=self.store_conn_id, storage_url=self.storage_url, store_config=self.store_config,
            poll_interval=self.poll_interval, log=record.log, log_host=record.host), method_name="execute_complete")

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None) -> dict[str, Any]:
        """Resume once the submission trigger fired."""
        from airflow_seatunnel_ckpt.hooks.spark_submit import SubmitError

        if not event:
            raise AirflowFailException("the submission trigger fired without an event")
        if event.get("error"):
            raise SubmitError(f"pipeline {self.pipeline}: {event.get('message')}")
        return self._finish(context, SubmissionCheck.from_dict(event))

    def _finish(self, context: Context, check: SubmissionCheck, began_here: bool = False) -> dict[str, Any]:
        """The result of a finished submission; a reconnected attempt that failed is submitted anew."""
        attempt = attempt_for_try(context["ti"].try_number)
        result = self.submit_hook.result(check, attempt, self.stage)
        return self.execute(context) if result is None else self._prepared(result, attempt, began_here)

    @cached_property
    def submit_hook(self) -> StageSubmitHook:
        """The hook that runs the stage in-process, or submits, reconnects to, cancels and waits for it."""
        return StageSubmitHook(self.store_pipeline, self.participant, conn_id=self.conn_id,
                               spark_submit_kwargs=self.spark_submit_kwargs, python=self.python,
                               archives=self.archives, poll_interval=self.poll_interval, by=f"stage {self.where}")

    def _prepared(self, result: StageResult, attempt: int, began_here: bool = False) -> dict[str, Any]:
        """Log and return (XCom) a stage result."""
        if result.reused:
            self.log.warning("attempt %s did not prepare: attempt %s's prepared output for epoch %s stands",
                             attempt, result.attempt, result.epoch)
        else:
            metrics.checkpoint_written(self.metric_tags(), result.checkpoint_bytes)
        self.log.info("epoch %s: %s attempt %s prepared: rows staged per sink: %s; %s checkpoint bytes written",
                      result.epoch, self.participant, result.attempt,
                      ", ".join(f"{m.sink}={m.rows}" for m in result.manifests) or "no sink", result.checkpoint_bytes)
        if began_here and not result.reused:
            self._end_dry_run(result.epoch, f"prepared as attempt {result.attempt}")
        return result.to_dict()

    def _end_dry_run(self, epoch: int, outcome: str) -> None:
        """Abort the epoch a try number 0 (``airflow tasks test``) began: nothing follows it (its output was staged)."""
        if abort_unfollowed(self.store_pipeline, epoch, by=f"stage {self.where}", reason=f"dry run of {self.where} "
                            f"(Airflow try number 0, e.g. `airflow tasks test`): {outcome}, not published"):
            self.log.warning("try number 0 (`airflow tasks test`): epoch %s %s, then aborted, so that nothing "
                             "is published and no later run waits for it", epoch, outcome)

    def on_kill(self) -> None:
        """Stop the stage's work when Airflow terminates this task (SIGTERM): :meth:`StageSubmitHook.on_kill`."""
        if "submit_hook" in self.__dict__:  # (a hook not made yet has nothing to stop)
            self.submit_hook.on_kill()

    def get_openlineage_facets_on_start(self) -> OperatorLineage:
        """OpenLineage at the start: the declared sources and sinks, the pipeline and participant."""
        from airflow_seatunnel_ckpt.lineage.epoch import stage_lineage

        return stage_lineage(pipeline_name=self.pipeline, participant=self.participant,
                             sources=self.sources, sinks=self.sinks)

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> OperatorLineage:
        """OpenLineage once done, or failed: what the prepared record says was read and staged (else declared)."""
        from airflow_seatunnel_ckpt.lineage.epoch import stage_lineage

        return stage_lineage(pipeline_name=self.pipeline, participant=self.participant, sources=self.sources,
                             sinks=self.sinks, pipeline=self.hook.get_pipeline(self.pipeline),
                             run_id=task_instance.run_id, attempt=attempt_for_try(task_instance.try_number))

    get_openlineage_facets_on_failure = get_openlineage_facets_on_complete
