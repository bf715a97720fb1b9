"""The commit/abort branch: records the epoch's single decision and routes the DAG run."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseBranchOperator
from airflow.sdk.exceptions import AirflowFailException

from airflow_seatunnel_ckpt.core.errors import CorruptCheckpointError, NotPreparedError
from airflow_seatunnel_ckpt.core.models import Decision, EpochState, EpochStatus
from airflow_seatunnel_ckpt.core.protocol.expectations import REFUSED, refusals
from airflow_seatunnel_ckpt.core.protocol.pipeline import CHECK_FAILED, SINK_REFUSED
from airflow_seatunnel_ckpt.pipeline_task import (
    PIPELINE_TEMPLATE_FIELDS,
    BasePipelineOperator,
    refusals_fail_at_once,
)
from airflow_seatunnel_ckpt.sensors.stages import unprepared_reason

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_seatunnel_ckpt.core.models import DecisionRecord

#: A user check: ``True``/``None`` passes, ``False`` or a reason string fails.
EpochCheck = Callable[[EpochStatus], "bool | str | None"]


@dataclass(frozen=True)
class Verdict:
    """What the branch asks the transaction log to record, and why."""

    decision: Decision
    reason: str


class CommitBranchOperator(BasePipelineOperator, BaseBranchOperator):
    """Decide commit or abort for the run's epoch, then follow the recorded decision.

    The decision is written once by the core (``Pipeline.decide``); whichever record wins
    is followed. The epoch commits when every expected participant is prepared and
    verifies and every check passes.

    :param commit_task_id: task to run after a commit decision.
    :param abort_task_id: task to run after an abort decision.
    :param fallback_task_id: extra task to run when a user check failed.
    :param participants: stages that must be prepared; ``None``: those the descriptor declares.
    :param min_rows: abort when the epoch staged fewer rows (all sinks together).
    :param max_rows: abort when the epoch staged more rows.
    :param check: callable given the :class:`EpochStatus` (see :data:`EpochCheck`).
    """

    template_fields: Sequence[str] = (*PIPELINE_TEMPLATE_FIELDS, "participants",
                                      "commit_task_id", "abort_task_id", "fallback_task_id")
    ui_color = "#fdebd0"

    def __init__(self, *, commit_task_id: str, abort_task_id: str, fallback_task_id: str | None = None,
                 participants: Sequence[str] | None = None, min_rows: int | None = None, max_rows: int | None = None,
                 check: EpochCheck | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.commit_task_id = commit_task_id
        self.abort_task_id = abort_task_id
        self.fallback_task_id = fallback_task_id
        self.participants = list(participants) if participants else None
        self.min_rows = min_rows
        self.max_rows = max_rows
        self.check = check

    def choose_branch(self, context: Context) -> str | list[str]:
        """Record (or read) the decision and return the task id(s) to follow (a refusal fails at once)."""
        with refusals_fail_at_once():
            return self._choose(context)

    def _choose(self, context: Context) -> str | list[str]:
        pipeline = self.store_pipeline
        epoch = self.epoch_of_run(context)
        if epoch is None:
            why = unprepared_reason(self, context, None) or "its stage never began one"
            raise AirflowFailException(
                f"pipeline {self.pipeline}: run {context['run_id']!r} has no epoch, so there is "
                f"nothing to decide: {why}")
        status = pipeline.status(epoch)
        record = status.decision
        if record is not None:
            self.log.info("epoch %s was already decided %s by %s (%s); following that decision",
                          epoch, record.decision.value.upper(), record.by, record.reason)
        else:
            record = self._decide(context, epoch, status)
        context["ti"].xcom_push(key="decision", value=record.to_dict())
        return self._route(record)

    def evaluate(self, status: EpochStatus) -> Verdict:
        """Commit unless a participant is missing, a sink's expectations refuse the epoch or a user check fails."""
        if status.state is not EpochState.PREPARED:
            return Verdict(Decision.ABORT, f"epoch {status.epoch} is {status.state.value}, "
                                           "not PREPARED")
        missing = self._missing(status)
        if missing:
            return Verdict(Decision.ABORT, f"participants {missing} never prepared")
        rows = sum(record.rows for record in status.prepared.values())
        # Each sink gets its own copy of a row: say how many each got, not their sum alone.
        staged = ", ".join(f"{sink}={n}" for sink, n in status.rows_per_sink().items())
        if self.min_rows is not None and rows < self.min_rows:
            return Verdict(Decision.ABORT, f"{CHECK_FAILED}{rows} rows staged over all sinks ({staged}), fewer "
                                           f"than the minimum {self.min_rows}")
        if self.max_rows is not None and rows > self.max_rows:
            return Verdict(Decision.ABORT, f"{CHECK_FAILED}{rows} rows staged over all sinks ({staged}), more "
                                           f"than the maximum {self.max_rows}")
        refused = refusals(status.prepared.values())
        if refused:
            return Verdict(Decision.ABORT, f"{CHECK_FAILED}{REFUSED}{'; '.join(refused)}")
        if self.check is not None:
            name = getattr(self.check, "__name__", repr(self.check))
            outcome = self.check(status)
            if outcome is False:
                return Verdict(Decision.ABORT, f"{CHECK_FAILED}{name} returned False")
            if isinstance(outcome, str):
                return Verdict(Decision.ABORT, f"{CHECK_FAILED}{name}: {outcome}")
        return Verdict(Decision.COMMIT, f"{', '.join(sorted(status.prepared))} prepared and "
                                        f"verified; rows staged per sink: {staged or 'no sink'}")

    def _missing(self, status: EpochStatus) -> list[str]:
        """The expected participants (given, else declared) that have not prepared."""
        expected = self.participants or self.store_pipeline.declared_participants() or []
        return [p for p in expected if p not in status.prepared]

    def _decide(self, context: Context, epoch: int, status: EpochStatus) -> DecisionRecord:
        pipeline = self.store_pipeline
        by = f"{context['dag'].dag_id}.{self.task_id} (run {context['run_id']}, " \
             f"try {context['ti'].try_number})"
        verdict = self.evaluate(status)
        if verdict.decision is Decision.ABORT and status.state is EpochState.OPEN:
            why = unprepared_reason(self, context, epoch, self._missing(status))
            if why:
                verdict = Verdict(Decision.ABORT, f"{verdict.reason}; {why}")
        self.log.info("epoch %s: asking for %s because %s", epoch,
                      verdict.decision.value.upper(), verdict.reason)
        try:
            record = pipeline.decide(epoch, verdict.decision, verdict.reason, by=by,
                                     participants=self.participants)
        except (NotPreparedError, CorruptCheckpointError) as exc:
            # The core re-verifies everything before it lets a commit decision through.
            reason = f"commit refused by verification: {exc}"
            self.log.warning("epoch %s: %s; deciding ABORT instead", epoch, reason)
            record = pipeline.decide(epoch, Decision.ABORT, reason, by=by,
                                     participants=self.participants)
        if record.by == by and record.reason.startswith(SINK_REFUSED):
            self.log.warning("epoch %s: decided ABORT: %s", epoch, record.reason)
        elif record.decision is not verdict.decision or record.by != by:
            self.log.warning("epoch %s: another actor decided first: %s by %s (%s)", epoch,
                             record.decision.value.upper(), record.by, record.reason)
        else:
            self.log.info("epoch %s: decided %s", epoch, record.decision.value.upper())
        return record

    def _route(self, record: DecisionRecord) -> str | list[str]:
        if record.decision is Decision.COMMIT:
            return self.commit_task_id
        if self.fallback_task_id and record.reason.startswith(CHECK_FAILED):
            return [self.abort_task_id, self.fallback_task_id]
        return self.abort_task_id
