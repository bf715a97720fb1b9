"""Sensor for the prepared state of a DAG run's epoch (the end of phase one)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseSensorOperator, PokeReturnValue
from airflow.sdk.exceptions import AirflowFailException, AirflowSensorTimeout

from airflow_seatunnel_ckpt.hooks.checkpoint_store import PreparedCheck
from airflow_seatunnel_ckpt.operators.base import PIPELINE_TEMPLATE_FIELDS, BasePipelineOperator
from airflow_seatunnel_ckpt.triggers.prepared import EpochPreparedTrigger

if TYPE_CHECKING:
    from airflow.sdk import Context


class EpochPreparedSensor(BasePipelineOperator, BaseSensorOperator):
    """Wait until every expected participant of the run's epoch is prepared and verifies.

    Succeeds (returning the check as XCom) when the participants' prepared records exist
    and their checkpoint parts and staged files match the recorded sizes and checksums,
    or when the epoch is already decided for commit (a cleared sensor re-ran).
    Fails without retrying, with the reason in the log, when the epoch was aborted or
    its prepared output is corrupt; a timeout fails the sensor as usual. Either way the
    abort task (trigger rule ``all_done``) takes over.

    Works in ``poke`` and ``reschedule`` mode, and with ``deferrable=True`` hands the
    waiting to :class:`EpochPreparedTrigger` in the triggerer.

    :param participants: stages that must prepare; ``None`` accepts any one participant.
    :param deferrable: wait in the triggerer instead of holding a worker slot.
    """

    template_fields: Sequence[str] = (*PIPELINE_TEMPLATE_FIELDS, "participants")
    ui_color = "#d6eaf8"

    def __init__(
        self,
        *,
        participants: Sequence[str] | None = None,
        deferrable: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.participants = list(participants) if participants else None
        self.deferrable = deferrable

    def execute(self, context: Context) -> Any:
        """Check once; then poke, reschedule or defer until the outcome is known."""
        if not self.deferrable:
            return super().execute(context)
        check = self.hook.check_prepared(self.pipeline, context["run_id"], self.participants)
        if check.done:
            return self._finish(check)
        self.log.info("%s; deferring to the triggerer (poll every %ss, timeout %ss)",
                      check.message, self.poke_interval, self.timeout)
        self.defer(
            trigger=EpochPreparedTrigger(
                pipeline=self.pipeline,
                run_id=context["run_id"],
                participants=self.participants,
                store_conn_id=self.store_conn_id,
                storage_url=self.storage_url,
                store_config=self.store_config,
                poll_interval=self.poke_interval,
                deadline=time.time() + self.timeout,
            ),
            method_name="execute_complete",
            timeout=self.timeout,
        )

    def poke(self, context: Context) -> bool | PokeReturnValue:
        """One look at the store (poke and reschedule mode)."""
        check = self.hook.check_prepared(self.pipeline, context["run_id"], self.participants)
        if not check.done:
            self.log.info("pipeline %s: %s", self.pipeline, check.message)
            return False
        return PokeReturnValue(is_done=True, xcom_value=self._finish(check))

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None) -> Any:
        """Resume after the trigger fired."""
        if not event:
            raise AirflowFailException("the prepared-state trigger fired without an event")
        return self._finish(PreparedCheck.from_dict(event))

    def _finish(self, check: PreparedCheck) -> dict[str, Any]:
        if check.outcome in ("prepared", "decided"):
            self.log.info("pipeline %s: %s", self.pipeline, check.message)
            return check.to_dict()
        if check.outcome == "timeout":
            raise AirflowSensorTimeout(f"pipeline {self.pipeline}: {check.message}")
        # aborted, corrupt, error: waiting longer cannot help, and retrying the sensor
        # would only delay the abort task.
        raise AirflowFailException(f"pipeline {self.pipeline}: {check.message}")
