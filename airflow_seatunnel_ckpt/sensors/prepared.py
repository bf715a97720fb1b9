"""Sensor for the prepared state of a DAG run's epoch (the end of phase one)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseSensorOperator, PokeReturnValue
from airflow.sdk.exceptions import AirflowFailException, AirflowSensorTimeout

from airflow_seatunnel_ckpt.hooks.checkpoint_store import PreparedCheck
from airflow_seatunnel_ckpt.pipeline_task import PIPELINE_TEMPLATE_FIELDS, BasePipelineOperator
from airflow_seatunnel_ckpt.sensors.stages import (
    explain_unprepared,
    stage_task_states,
    stage_tasks_of,
    stages_finished,
)
from airflow_seatunnel_ckpt.triggers.prepared import EpochPreparedTrigger

if TYPE_CHECKING:
    from airflow.sdk import Context


class EpochPreparedSensor(BasePipelineOperator, BaseSensorOperator):
    """Wait until every expected participant of the run's epoch is prepared and verifies.

    Fails without retrying when the epoch was aborted or its output is corrupt, and at once
    when every stage task of the run has finished with the epoch still not prepared; the
    abort task (``all_done``) then takes over.

    :param participants: stages that must prepare; ``None`` accepts any one participant.
    :param deferrable: wait in the triggerer instead of holding a worker slot.
    :param stage_task_ids: the tasks that prepare the run's epoch; ``None``: the upstream
        tasks that declare a participant (the stages of ``checkpointed_epoch``).
    """

    template_fields: Sequence[str] = (*PIPELINE_TEMPLATE_FIELDS, "participants")
    ui_color = "#d6eaf8"

    def __init__(self, *, participants: Sequence[str] | None = None, deferrable: bool = False,
                 stage_task_ids: Sequence[str] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.participants = list(participants) if participants else None
        self.deferrable = deferrable
        self.stage_task_ids = list(stage_task_ids) if stage_task_ids is not None else None

    def execute(self, context: Context) -> Any:
        """Check once; then poke, reschedule or defer until the outcome is known."""
        if not self.deferrable:
            return super().execute(context)
        check = self._check(context)
        if check.done:
            return self._finish(check)
        self.log.info("%s; deferring to the triggerer (poll every %ss, timeout %ss)",
                      check.message, self.poke_interval, self.timeout)
        trigger = EpochPreparedTrigger(pipeline=self.pipeline, run_id=context["run_id"], participants=self.participants,
                                       store_conn_id=self.store_conn_id, storage_url=self.storage_url,
                                       store_config=self.store_config, poll_interval=self.poke_interval,
                                       deadline=time.time() + self.timeout)
        self.defer(trigger=trigger, method_name="execute_complete", timeout=self.timeout)

    def poke(self, context: Context) -> bool | PokeReturnValue:
        """One look at the store (poke and reschedule mode)."""
        check = self._check(context)
        if not check.done:
            self.log.info("pipeline %s: %s", self.pipeline, check.message)
            return False
        return PokeReturnValue(is_done=True, xcom_value=self._finish(check))

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None) -> Any:
        """Resume after the trigger fired."""
        if not event:
            raise AirflowFailException("the prepared-state trigger fired without an event")
        return self._finish(PreparedCheck.from_dict(event))

    def _check(self, context: Context) -> PreparedCheck:
        """The store's answer; when it says *waiting*, fail at once if no stage can still prepare.

        The store is read again after the stage tasks' states: a stage that prepared and
        then finished is seen as prepared, never as ended.
        """
        run_id = context["run_id"]
        check = self.hook.check_prepared(self.pipeline, run_id, self.participants)
        if check.done:
            return check
        if self.stage_task_ids is not None:
            stage_ids = self.stage_task_ids
        else:
            stages = stage_tasks_of(self)
            if set(check.missing) - set(stages.values()):
                return check  # a participant no stage of this DAG prepares may still come
            stage_ids = sorted(stages)
        states = stage_task_states(context, stage_ids)
        if states is None or not stages_finished(states, stage_ids):
            return check
        check = self.hook.check_prepared(self.pipeline, run_id, self.participants)
        if check.done:
            return check
        raise AirflowFailException(f"pipeline {self.pipeline}: "
                                   + explain_unprepared(states, run_id, check.epoch, check.missing))

    def _finish(self, check: PreparedCheck) -> dict[str, Any]:
        if check.outcome in ("prepared", "decided"):
            self.log.info("pipeline %s: %s", self.pipeline, check.message)
            return check.to_dict()
        if check.outcome == "timeout":
            raise AirflowSensorTimeout(f"pipeline {self.pipeline}: {check.message}")
        # aborted, corrupt, error: waiting longer cannot help, and retrying the sensor
        # would only delay the abort task.
        raise AirflowFailException(f"pipeline {self.pipeline}: {check.message}")
