"""The stage task: run a PySpark stage as the prepare phase (phase one) of the run's epoch."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from airflow_seatunnel_ckpt.core.models import EpochState, PreparedRecord
from airflow_seatunnel_ckpt.operators import metrics
from airflow_seatunnel_ckpt.operators.base import PIPELINE_TEMPLATE_FIELDS, PipelineTaskMixin

if TYPE_CHECKING:
    from airflow.sdk import Context


class SparkStageOperator(PipelineTaskMixin, BaseOperator):
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

    Returns (XCom) the epoch, the attempt and the sink manifests.

    :param stage: import path ``"module:function"`` of the stage function.
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
    """

    template_fields: Sequence[str] = (*PIPELINE_TEMPLATE_FIELDS, "stage", "sources", "sinks",
                                      "participant", "spark_conf", "conn_id")
    template_fields_renderers = {"sources": "json", "sinks": "json", "spark_conf": "json"}
    ui_color = "#fcf3cf"

    def __init__(
        self,
        *,
        pipeline: str,
        stage: str,
        sources: Mapping[str, Mapping[str, Any]],
        sinks: Mapping[str, Mapping[str, Any]],
        participant: str | None = None,
        key_groups: int | None = None,
        spark_conf: Mapping[str, Any] | None = None,
        conn_id: str | None = None,
        spark_submit_kwargs: Mapping[str, Any] | None = None,
        store_conn_id: str | None = None,
        storage_url: str | None = None,
        store_config: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self._init_pipeline_args(pipeline, store_conn_id, storage_url, store_config)
        self.stage = stage
        self.sources = {name: dict(opts) for name, opts in sources.items()}
        self.sinks = {name: dict(opts) for name, opts in sinks.items()}
        self.participant = participant or self.task_id.rsplit(".", 1)[-1]
        self.key_groups = key_groups
        self.spark_conf = dict(spark_conf or {})
        self.conn_id = conn_id
        self.spark_submit_kwargs = dict(spark_submit_kwargs or {})

    def execute(self, context: Context) -> dict[str, Any]:
        """Prepare the run's epoch (or return the attempt that already did)."""
        from airflow_seatunnel_ckpt.spark import StageResult, StageSpec, run_stage
        from airflow_seatunnel_ckpt.spark.submit import submit_stage

        run_id = context["run_id"]
        attempt = context["ti"].try_number
        existing = self._already_prepared(run_id)
        if existing is not None:
            # Checked here too so that spark-submit is not even launched.
            return StageResult.from_prepared(self.pipeline, existing, reused=True).to_dict()
        optional: dict[str, Any] = {}
        if self.key_groups is not None:
            optional["key_groups"] = self.key_groups
        spec = StageSpec(
            pipeline=self.pipeline, participant=self.participant, run_id=run_id, attempt=attempt,
            stage=self.stage, sources=self.sources, sinks=self.sinks,
            store=self.hook.config.to_mapping(include_secrets=True),
            spark_conf=self.spark_conf, **optional)
        self.log.info("pipeline %s: running stage %s as participant %s, attempt %s, %s",
                      self.pipeline, self.stage, self.participant, attempt,
                      f"through spark-submit (connection {self.conn_id})" if self.conn_id
                      else "in-process on local Spark")
        if self.conn_id:
            result = submit_stage(spec, conn_id=self.conn_id, hook_kwargs=self.spark_submit_kwargs)
        else:
            result = run_stage(spec)
        if result.reused:
            self.log.warning("attempt %s did not prepare: attempt %s's prepared output for epoch "
                             "%s stands", attempt, result.attempt, result.epoch)
        else:
            metrics.checkpoint_written(self.metric_tags(), result.checkpoint_bytes)
        self.log.info("epoch %s: %s attempt %s prepared: %s rows staged in %s; %s checkpoint "
                      "bytes written", result.epoch, self.participant, result.attempt,
                      result.rows, ", ".join(m.sink for m in result.manifests) or "no sink",
                      result.checkpoint_bytes)
        return result.to_dict()

    def _already_prepared(self, run_id: str) -> PreparedRecord | None:
        """The participant's prepared record for this run's live epoch, if any."""
        pipeline = self.store_pipeline
        epoch = pipeline.epoch_for_run(run_id)
        if epoch is None:
            return None
        status = pipeline.status(epoch)
        if status.state in (EpochState.ABORTING, EpochState.ABORTED):
            self.log.info("run %s's epoch %s was aborted (%s); this attempt begins a new epoch",
                          run_id, epoch, status.decision.reason if status.decision else "")
            return None
        record = status.prepared.get(self.participant)
        if record is not None:
            self.log.info("epoch %s (%s): %s was already prepared by attempt %s; not running "
                          "Spark again", epoch, status.state.value, self.participant,
                          record.attempt)
        return record
