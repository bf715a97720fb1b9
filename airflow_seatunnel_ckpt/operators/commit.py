"""The commit task: phase two for an epoch decided COMMIT (publish, roll forward only)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from datetime import UTC, timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import Asset
from airflow.sdk.exceptions import AirflowFailException

from airflow_seatunnel_ckpt.core.models import Decision, EpochState
from airflow_seatunnel_ckpt.operators import metrics
from airflow_seatunnel_ckpt.pipeline_task import (
    PIPELINE_TEMPLATE_FIELDS,
    BasePipelineOperator,
    refusals_fail_at_once,
)

if TYPE_CHECKING:
    from airflow.providers.openlineage.extractors import OperatorLineage
    from airflow.sdk import Context


def sink_asset(pipeline: str, sink: str, target_url: str) -> Asset:
    """The Airflow asset standing for one sink's published table, identified by its URL.

    Each committed epoch gets one event per sink that published something (extra: its
    statistics; partition key ``epoch=<e>`` on Airflow 3.3+).
    """
    return Asset(uri=target_url, group="seatunnel_ckpt",
                 extra={"pipeline": pipeline, "sink": sink})


class CommitEpochOperator(BasePipelineOperator):
    """Publish every sink of the run's epoch, which the branch decided to commit.

    Thin over ``Pipeline.commit``, which is idempotent; a transient failure is retried with
    exponential backoff. An epoch decided ABORT or undecided, and a refusal a retry cannot
    change, fail the task at once.

    :param sink_assets: asset per sink name (see :func:`sink_asset`), added to ``outlets``;
        a sink that published nothing gets no event.
    """

    template_fields: Sequence[str] = PIPELINE_TEMPLATE_FIELDS
    ui_color = "#d5f5e3"

    def __init__(self, *, sink_assets: Mapping[str, Asset] | None = None, retries: int = 5,
                 retry_delay: timedelta | float = timedelta(seconds=10), retry_exponential_backoff: float = 2.0,
                 max_retry_delay: timedelta | float = timedelta(minutes=10), **kwargs: Any) -> None:
        self.sink_assets = dict(sink_assets or {})
        outlets = [*(kwargs.pop("outlets", None) or []), *self.sink_assets.values()]
        super().__init__(retries=retries, retry_delay=retry_delay,
                         retry_exponential_backoff=retry_exponential_backoff,
                         max_retry_delay=max_retry_delay, outlets=outlets, **kwargs)

    def execute(self, context: Context) -> dict[str, Any]:
        """Publish (or confirm already published) and emit one asset event per sink."""
        pipeline = self.store_pipeline
        epoch = self.epoch_of_run(context)
        if epoch is None:
            raise AirflowFailException(f"pipeline {self.pipeline}: run {context['run_id']!r} has no epoch to commit")
        status = pipeline.status(epoch)
        decision = status.decision
        if decision is None:
            raise AirflowFailException(
                f"pipeline {self.pipeline}: epoch {epoch} is {status.state.value} and undecided; "
                "the branch task records the decision: clear it rather than the commit task")
        if decision.decision is Decision.ABORT:
            raise AirflowFailException(f"pipeline {self.pipeline}: epoch {epoch} was decided ABORT by {decision.by} "
                                       f"({decision.reason}); there is nothing to publish")
        already = status.state is EpochState.COMMITTED
        if already:
            self.log.info("epoch %s is already COMMITTED; confirming its published output", epoch)
        else:
            self.log.info("epoch %s is %s (decided COMMIT by %s: %s); publishing", epoch,
                          status.state.value, decision.by, decision.reason)
        # Raises on a failed or ambiguous publish; the epoch stays COMMITTING for the retry.
        # A refusal a retry cannot change (a table altered after the decision) fails at once.
        with refusals_fail_at_once():
            result = pipeline.commit(epoch)
        published = [sink.to_dict() for sink in result.sinks if sink.published]
        quiet = {sink.sink for sink in result.sinks if not sink.published}
        for sink in published:
            self.log.info("epoch %s: sink %s -> %s: %s files, %s rows, %s bytes (%s)", epoch,
                          sink["sink"], sink["epoch_dir"], sink["files"], sink["rows"],
                          sink["bytes"], sink["how"] or "published")
            asset = self.sink_assets.get(sink["sink"])
            if asset is None:
                continue
            if already and self._announced(asset, epoch, decision.decided_at):
                self.log.info("epoch %s: Airflow already holds sink %s's asset event; no second event",
                              epoch, sink["sink"])
                quiet.add(sink["sink"])
                continue
            event = context["outlet_events"][asset]
            event.extra = {
                "pipeline": self.pipeline, "epoch": epoch, "sink": sink["sink"],
                "files": sink["files"], "rows": sink["rows"], "bytes": sink["bytes"],
                "epoch_dir": sink["epoch_dir"], "replayed": already,
            }
            if hasattr(event, "add_partitions"):  # Airflow 3.3+: partition-aware consumers
                event.add_partitions(f"epoch={epoch}")
        if result.empty:
            self.log.info("epoch %s: sink(s) %s staged no rows: nothing published, no asset event",
                          epoch, result.empty)
        if result.not_written:
            self.log.warning("epoch %s: sink(s) %s were declared but not written by the stage: nothing "
                             "published, no asset event", epoch, result.not_written)
        self._drop_outlets([self.sink_assets[name] for name in sorted(quiet) if name in self.sink_assets])
        files = sum(s["files"] for s in published)
        rows = sum(s["rows"] for s in published)
        if not already:
            began = status.begin.created_at if status.begin else None
            metrics.epoch_committed(self.metric_tags(), time.time() - began if began else None,
                                    files, rows)
        self.log.info("epoch %s COMMITTED: %s files, %s rows over %s sink(s)", epoch, files,
                      rows, len(published))
        return {"pipeline": self.pipeline, "epoch": epoch, "state": EpochState.COMMITTED.value,
                "files": files, "rows": rows, "sinks": published, "already_committed": already,
                "empty": result.empty, "not_written": result.not_written}

    def get_openlineage_facets_on_start(self) -> OperatorLineage:
        """OpenLineage at the start: the sink assets' tables as outputs, the pipeline."""
        from airflow_seatunnel_ckpt.lineage.epoch import commit_lineage

        return commit_lineage(pipeline_name=self.pipeline,
                              sink_targets={name: asset.uri for name, asset in self.sink_assets.items()})

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> OperatorLineage:
        """OpenLineage once done: the epoch's inputs and what each sink published (rows, files, bytes)."""
        from airflow_seatunnel_ckpt.lineage.epoch import commit_lineage

        return commit_lineage(pipeline_name=self.pipeline,
                              sink_targets={name: asset.uri for name, asset in self.sink_assets.items()},
                              pipeline=self.hook.get_pipeline(self.pipeline), run_id=task_instance.run_id,
                              dag_id=task_instance.dag_id)

    def get_openlineage_facets_on_failure(self, task_instance: Any) -> OperatorLineage:
        """OpenLineage of a failed try: the epoch's state and decision, the sinks still to publish."""
        return self.get_openlineage_facets_on_complete(task_instance)

    def _announced(self, asset: Asset, epoch: int, decided_at: float) -> bool:
        """Whether Airflow already holds ``asset``'s event for ``epoch`` (an earlier try's).

        A try that committed and died before Airflow recorded its success left no event, and
        its retry must emit it; a cleared commit must not emit it twice. If Airflow cannot
        be asked, the event is emitted (a duplicate beats a lost event).
        """
        from datetime import datetime

        try:
            from airflow.sdk.execution_time.context import InletEventsAccessor

            since = datetime.fromtimestamp(decided_at - 300, tz=UTC).isoformat()
            events = InletEventsAccessor(asset_name=asset.name, asset_uri=asset.uri).after(since).limit(1000)
            return any((e.extra or {}).get("pipeline") == self.pipeline and (e.extra or {}).get("epoch") == epoch
                       for e in events)
        except Exception as exc:  # never fail a commit over a lookup; emit instead
            self.log.warning("could not ask Airflow for the asset events of %s (%s); emitting the event",
                             asset.uri, exc)
            return False

    def _drop_outlets(self, assets: list[Asset]) -> None:
        """Emit no asset event for ``assets`` in this try (sinks that published nothing).

        Airflow 3 registers an event for every asset in ``outlets`` once ``execute``
        returned, so this task instance's outlets lose those assets for this try.
        """
        if assets:
            self.outlets = [o for o in self.outlets if o not in assets]
