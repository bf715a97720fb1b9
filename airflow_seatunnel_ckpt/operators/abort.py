"""The abort task: phase two for an epoch that must not commit."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

from airflow.sdk import TriggerRule
from airflow.sdk.exceptions import AirflowFailException

from airflow_seatunnel_ckpt.core.errors import DecisionConflictError
from airflow_seatunnel_ckpt.core.models import Decision, EpochState
from airflow_seatunnel_ckpt.core.protocol.pipeline import is_refusal
from airflow_seatunnel_ckpt.operators import metrics
from airflow_seatunnel_ckpt.pipeline_task import (
    PIPELINE_TEMPLATE_FIELDS,
    BasePipelineOperator,
    refusals_fail_at_once,
)
from airflow_seatunnel_ckpt.sensors.stages import unprepared_reason

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_seatunnel_ckpt.core.models import EpochStatus

_UNHAPPY = ("failed", "upstream_failed", "removed")
ON_REFUSAL = ("fail", "succeed")
#: Where a failed abort task leaves why its input is held back (the listener copies it to the run's note).
HELD_BACK_KEY = "held_back"


class AbortEpochOperator(BasePipelineOperator):
    """Abort the run's epoch: record ABORT (if undecided) and remove its staged output.

    Runs (``all_done``) when a stage, the sensor or the branch failed, and when the branch
    chose it. An epoch decided COMMIT is never aborted. Idempotent: safe to retry and clear.

    :param roll_forward: publish an epoch found decided COMMIT instead of only logging.
    :param reason: reason recorded when this task makes the abort decision; by default
        the failed upstream tasks are named.
    :param on_refusal: ``"fail"`` (default) or ``"succeed"``: whether a refused epoch, whose
        input is held back, fails this task without retries (so the run's alerts fire) once
        it is aborted, or ends green like any abort.
    """

    template_fields: Sequence[str] = (*PIPELINE_TEMPLATE_FIELDS, "reason")
    ui_color = "#fadbd8"

    def __init__(self, *, roll_forward: bool = True, reason: str | None = None,
                 on_refusal: Literal["fail", "succeed"] = "fail", trigger_rule: str = TriggerRule.ALL_DONE,
                 **kwargs: Any) -> None:
        super().__init__(trigger_rule=trigger_rule, **kwargs)
        if on_refusal not in ON_REFUSAL:
            raise ValueError(f"{self.where}: on_refusal must be one of {ON_REFUSAL}, got {on_refusal!r}")
        self.roll_forward = roll_forward
        self.reason = reason
        self.on_refusal = on_refusal

    def execute(self, context: Context) -> dict[str, Any]:
        """Abort, or explain why there is nothing to abort (a refusal fails at once, without retries)."""
        with refusals_fail_at_once():
            result = self._abort(context)
        if result["action"] in ("aborted", "already_aborted") and self.on_refusal == "fail":
            self._fail_if_held_back(context, result["epoch"])
        return result

    def _fail_if_held_back(self, context: Context, epoch: int) -> None:
        """Fail (no retries) when ``epoch`` was refused: its input is held back until someone acts."""
        decision = self.store_pipeline.status(epoch).decision
        if not is_refusal(decision):
            return
        assert decision is not None
        message = f"pipeline {self.pipeline!r} epoch {epoch} refused and aborted: {decision.reason}"
        context["ti"].xcom_push(key=HELD_BACK_KEY, value=message)
        raise AirflowFailException(
            f"{message}. Its input is held back: the next run reads it again, and is refused again until the input "
            f"or the rule that refused it is fixed; `seatunnel-ckpt epochs {self.pipeline}` shows since when. The "
            "run fails so that its alerts fire (checkpointed_epoch(on_refusal='succeed') keeps such runs green)")

    def _abort(self, context: Context) -> dict[str, Any]:
        pipeline = self.store_pipeline
        epoch = self.epoch_of_run(context)
        if epoch is None:
            why = (unprepared_reason(self, context, None)
                   or f"run {context['run_id']!r} never began an epoch (its stage failed before that)")
            self.log.info("%s; nothing to abort", why)
            return {"pipeline": self.pipeline, "epoch": None, "action": "none"}
        status = pipeline.status(epoch)
        decision = status.decision
        if decision is not None and decision.decision is Decision.COMMIT:
            return self._committed(epoch, status.state, decision.by, decision.reason)
        if status.state is EpochState.ABORTED:
            self.log.info("epoch %s is already ABORTED (%s); nothing to do", epoch,
                          decision.reason if decision else "")
            return {"pipeline": self.pipeline, "epoch": epoch, "action": "already_aborted"}
        reason = decision.reason if decision is not None else self._reason(context, epoch, status)
        self.log.info("aborting epoch %s (%s): %s", epoch, status.state.value, reason)
        try:
            pipeline.abort(epoch, reason)
        except DecisionConflictError:
            # A commit decision won the race after we read the status.
            status = pipeline.status(epoch)
            winner = status.decision
            return self._committed(epoch, status.state, winner.by if winner else "?",
                                   winner.reason if winner else "?")
        metrics.epoch_aborted(self.metric_tags())
        self.log.info("epoch %s ABORTED; its staged output is removed and its input stays "
                      "unconsumed for the next run", epoch)
        return {"pipeline": self.pipeline, "epoch": epoch, "action": "aborted", "reason": reason}

    def _committed(self, epoch: int, state: EpochState, by: str, why: str) -> dict[str, Any]:
        self.log.info("epoch %s was decided COMMIT by %s (%s): nothing to abort; a committed "
                      "epoch only rolls forward", epoch, by, why)
        if not self.roll_forward or state is EpochState.COMMITTED:
            return {"pipeline": self.pipeline, "epoch": epoch, "action": "none",
                    "state": state.value}
        result = self.store_pipeline.commit(epoch)
        files = sum(s.files for s in result.sinks)
        self.log.info("epoch %s rolled forward: %s files published", epoch, files)
        return {"pipeline": self.pipeline, "epoch": epoch, "action": "rolled_forward",
                "files": files}

    def _reason(self, context: Context, epoch: int, status: EpochStatus) -> str:
        if self.reason:
            return self.reason
        if status.state is EpochState.OPEN:
            expected = self.store_pipeline.declared_participants() or []
            why = unprepared_reason(self, context, epoch, [p for p in expected if p not in status.prepared])
            if why:
                return why
        upstream = sorted(self.upstream_task_ids)
        try:
            states = context["ti"].get_task_states(
                dag_id=context["dag"].dag_id, run_ids=[context["run_id"]], task_ids=upstream)
            of_run = states.get(context["run_id"], {})
        except Exception:  # a missing reason must never stop the abort
            of_run = {}
        unhappy = [f"{task} ({state})" for task, state in sorted(of_run.items())
                   if state in _UNHAPPY]
        if unhappy:
            return "upstream did not succeed: " + ", ".join(unhappy)
        return f"abort requested by {context['dag'].dag_id}.{self.task_id}"
