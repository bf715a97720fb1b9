"""What the stage and commit tasks of an epoch report to OpenLineage, gathered from the store.

The operators' ``get_openlineage_facets_on_*`` methods are thin calls into here. START events
come from the task's declared options alone; COMPLETE and FAIL read the run's epoch. A store
that cannot be read costs the statistics, never the event (docs/LINEAGE.md).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from airflow_seatunnel_ckpt.core.errors import CheckpointError
from airflow_seatunnel_ckpt.lineage.facets import (
    EpochFacts,
    declared_output_datasets,
    input_datasets,
    operator_lineage,
    published_output_datasets,
    staged_output_datasets,
    unique_datasets,
)

if TYPE_CHECKING:
    from airflow.providers.openlineage.extractors import OperatorLineage
    from airflow.sdk import Context

    from airflow_seatunnel_ckpt.core import Pipeline
    from airflow_seatunnel_ckpt.core.models import EpochStatus

_log = logging.getLogger(__name__)


def declared_sinks(sinks: Mapping[str, Mapping[str, Any]]) -> dict[str, tuple[str, Mapping[str, Any] | None]]:
    """Sink name -> (target URL, table options) of a stage's sink options (unbuildable ones left out)."""
    from airflow_seatunnel_ckpt.spark.registry import SINKS

    out: dict[str, tuple[str, Mapping[str, Any] | None]] = {}
    for name, options in sinks.items():
        try:
            sink = SINKS.build(name, options)
        except CheckpointError as exc:  # checked in execute; lineage never fails a task
            _log.info("sink %r left out of the lineage: %s", name, exc)
            continue
        out[name] = (sink.target_url, getattr(sink, "table", None))
    return out


def stage_lineage(*, pipeline_name: str, participant: str, sources: Mapping[str, Mapping[str, Any]],
                  sinks: Mapping[str, Mapping[str, Any]], pipeline: Pipeline | None = None,
                  run_id: str | None = None, attempt: int | None = None) -> OperatorLineage:
    """A stage task's lineage; with ``pipeline`` and ``run_id``, what its epoch's prepared record says
    was read and staged (not prepared: the declared sources and sinks)."""
    facts = EpochFacts(pipeline=pipeline_name, participant=participant, attempt=attempt)
    declared = declared_sinks(sinks)
    status = _run_status(pipeline, run_id, None)
    record = status.prepared.get(participant) if status is not None else None
    if status is not None:
        facts.epoch, facts.state = status.epoch, status.state.value
        facts.decision = status.decision.decision.value if status.decision else None
    if record is None:
        return operator_lineage(input_datasets(sources), declared_output_datasets(declared), facts)
    facts.attempt = record.attempt
    unwritten = {name: declared[name] for name in record.not_written if name in declared}
    outputs = staged_output_datasets(record.sinks) + declared_output_datasets(unwritten)
    return operator_lineage(input_datasets(sources, record.sources), outputs, facts)


def commit_lineage(*, pipeline_name: str, sink_targets: Mapping[str, str], pipeline: Pipeline | None = None,
                   run_id: str | None = None, dag_id: str | None = None) -> OperatorLineage:
    """The commit task's lineage; with ``pipeline`` and ``run_id``, what its epoch recorded (else the
    ``sink_targets``, sink name -> target URL, as outputs)."""
    facts = EpochFacts(pipeline=pipeline_name)
    status = _run_status(pipeline, run_id, dag_id)
    if status is None or pipeline is None:
        return operator_lineage([], declared_output_datasets({n: (u, None) for n, u in sink_targets.items()}), facts)
    facts.epoch, facts.state = status.epoch, status.state.value
    facts.decision = status.decision.decision.value if status.decision else None
    facts.attempts = {name: record.attempt for name, record in sorted(status.prepared.items())}
    manifests = [m for record in status.prepared.values() for m in record.sinks]
    if any(sink.published for sink in status.published):
        outputs = published_output_datasets(status.published, {m.sink: m.table for m in manifests},
                                            {m.sink: m.expectations for m in manifests})
    else:
        outputs = declared_output_datasets({m.sink: (m.target_url, m.table) for m in manifests})
    return operator_lineage(_consumed_inputs(pipeline, status), outputs, facts)


def _run_status(pipeline: Pipeline | None, run_id: str | None, dag_id: str | None) -> EpochStatus | None:
    """The status of the run's epoch, or None (no store given, no epoch, or an unreadable store)."""
    if pipeline is None or not run_id:
        return None
    try:
        epoch = pipeline.epoch_for_run(run_id, dag_id=dag_id)
        return pipeline.status(epoch) if epoch is not None else None
    except CheckpointError as exc:
        _log.warning("pipeline %s: cannot read run %r's epoch for lineage (%s); reporting the declared "
                     "datasets only", pipeline.name, run_id, exc)
        return None


def _consumed_inputs(pipeline: Pipeline, status: EpochStatus) -> list[Any]:
    """Every participant's declared sources (pipeline descriptor) with its recorded offsets."""
    try:
        descriptor = pipeline.descriptor()
    except CheckpointError as exc:
        _log.warning("pipeline %s: cannot read its descriptor for lineage (%s); no inputs reported",
                     pipeline.name, exc)
        return []
    if descriptor is None:
        return []
    inputs: list[Any] = []
    for name, record in sorted(status.prepared.items()):
        declared = descriptor.participants.get(name)
        if declared is not None:
            sources = {src: {"type": e.type, **e.options} for src, e in declared.sources.items()}
            inputs += input_datasets(sources, record.sources)
    return unique_datasets(inputs)


def with_openlineage_spark_properties(spark_conf: Mapping[str, Any], context: Context) -> dict[str, Any]:
    """A copy of ``spark_conf`` plus the OpenLineage parent-job and transport properties that
    ``[openlineage] spark_inject_parent_job_info`` / ``spark_inject_transport_info`` enable, as the
    Apache Spark provider's ``SparkSubmitOperator`` adds them (keys the user set are kept)."""
    from airflow.providers.common.compat.sdk import conf

    properties = dict(spark_conf)
    if conf.getboolean("openlineage", "spark_inject_parent_job_info", fallback=False):
        from airflow.providers.common.compat.openlineage.utils.spark import (
            inject_parent_job_information_into_spark_properties,
        )

        properties = inject_parent_job_information_into_spark_properties(properties, context)
    if conf.getboolean("openlineage", "spark_inject_transport_info", fallback=False):
        from airflow.providers.common.compat.openlineage.utils.spark import (
            inject_transport_information_into_spark_properties,
        )

        properties = inject_transport_information_into_spark_properties(properties, context)
    return properties
