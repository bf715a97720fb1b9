"""A stuck epoch does not block the pipeline: the next run's stage waits while it is alive
and aborts it once it is dead (its DAG run finished, or its lease expired), with no hand edits.

Real Airflow (``dag.test()`` on SQLite) runs the production ``BasePipelineOperator.begin_epoch``
on a core-only stage (:class:`CorePrepareOperator`), so no Spark is needed.
"""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from airflow_seatunnel_ckpt.core import CheckpointStore, EpochState
from airflow_seatunnel_ckpt.core.protocol.lease import LeaseKeeper
from airflow_seatunnel_ckpt.task_group import checkpointed_epoch
from tests.epoch_test_dags import (
    PIPELINE,
    START,
    CorePrepareOperator,
    logical_date,
    published_rows,
    rows_for,
    task_states,
)

pytestmark = pytest.mark.airflow

#: Short lease settings so that a dead lease is recognised in seconds.
STORE_CONFIG = {"lease_timeout_s": 30.0, "lease_renew_s": 0.5}
POKE_S = 2.0


class WaitingCorePrepareOperator(CorePrepareOperator):
    """The core-only stage, beginning its epoch the way :class:`SparkStageOperator` does."""

    def __init__(self, *, pending_poke_interval: float = POKE_S, pending_wait_timeout: float | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pending_poke_interval = pending_poke_interval
        self.pending_wait_timeout = pending_wait_timeout

    def execute(self, context: Any) -> dict[str, Any]:
        self.begin_epoch(context, poke_interval=self.pending_poke_interval, wait_timeout=self.pending_wait_timeout)
        return super().execute(context)


def build_dag(dag_id: str, paths: dict[str, Any], **stage: Any) -> Any:
    from datetime import timedelta

    from airflow.sdk import DAG

    with DAG(dag_id, schedule=None, start_date=START, catchup=False,
             default_args={"retry_delay": timedelta(seconds=0)}) as dag:
        checkpointed_epoch(
            "orders", pipeline=PIPELINE, storage_url=paths["storage_url"], store_config=STORE_CONFIG,
            stages={"ingest": {"sinks": {"orders_table": paths["target_url"]}, **stage}},
            sensor={"poke_interval": 0.2, "timeout": 30}, stage_class=WaitingCorePrepareOperator,
            emit_assets=False)
    return dag


@pytest.fixture
def paths(tmp_path: Path) -> dict[str, Any]:
    store = tmp_path / "store"
    target = tmp_path / "table"
    return {"store": store, "target": target, "storage_url": f"file://{store}", "target_url": f"file://{target}"}


def pipeline_of(paths: dict[str, Any]) -> Any:
    return CheckpointStore.from_url(paths["storage_url"], **STORE_CONFIG).pipeline(PIPELINE)


def owner_run_left_its_epoch_open(run_dag: Any, dag: Any, paths: dict[str, Any]) -> tuple[Any, int]:
    """A run whose stage began an epoch and whose tasks were then marked success in the UI."""
    run = run_dag(dag, logical_date=logical_date(0), run_after=logical_date(0), mark_success_pattern=".*")
    assert run.state == "success"
    epoch = pipeline_of(paths).begin(run.run_id).epoch  # what its stage did before it was cut short
    return run, epoch


def set_run_state(dag_id: str, run_id: str, state: str) -> None:
    """What "Mark run as failed/success" in the UI does to the run row."""
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        run = session.scalar(select(DagRun).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id))
        assert run is not None
        run.state = state


def reschedules(dag_id: str, run_id: str, task_id: str) -> int:
    """How often the task instance was rescheduled (rows in Airflow's ``task_reschedule``)."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.taskreschedule import TaskReschedule
    from airflow.utils.session import create_session
    from sqlalchemy import func, select

    with create_session() as session:
        return int(session.scalar(
            select(func.count()).select_from(TaskReschedule)
            .join(TaskInstance, TaskInstance.id == TaskReschedule.ti_id)
            .where(TaskInstance.dag_id == dag_id, TaskInstance.run_id == run_id,
                   TaskInstance.task_id == task_id)) or 0)


def test_the_next_run_aborts_an_epoch_left_open_by_a_finished_run_and_processes(
    run_dag: Any, paths: dict[str, Any],
) -> None:
    dag = build_dag("pending_owner_finished", paths)
    owner, stuck = owner_run_left_its_epoch_open(run_dag, dag, paths)
    assert pipeline_of(paths).state(stuck) is EpochState.OPEN

    nxt = run_dag(dag, logical_date=logical_date(1), run_after=logical_date(1))

    assert nxt.state == "success", task_states(nxt)
    assert task_states(nxt)["orders.ingest"] == "success"
    p = pipeline_of(paths)
    status = p.status(stuck)
    assert status.state is EpochState.ABORTED
    assert status.decision is not None and status.decision.by == f"stage {dag.dag_id}/{nxt.run_id}/orders.ingest"
    assert f"run {owner.run_id!r} is finished" in status.decision.reason
    assert p.state(stuck + 1) is EpochState.COMMITTED and p.status(stuck + 1).run_id == nxt.run_id
    assert published_rows(paths["target"]) == rows_for(nxt.run_id, "ingest", 3)


def test_the_next_run_waits_while_the_owner_is_alive_and_goes_on_within_seconds_once_it_dies(
    run_dag: Any, paths: dict[str, Any],
) -> None:
    dag = build_dag("pending_owner_alive", paths, pending_wait_timeout=120.0)
    owner, stuck = owner_run_left_its_epoch_open(run_dag, dag, paths)
    set_run_state(dag.dag_id, owner.run_id, "running")  # the owner's stage is still running...
    lease = LeaseKeeper.for_pipeline(pipeline_of(paths), stuck, "ingest", 1).__enter__()  # ...and renewing
    died: dict[str, float] = {}

    def owner_dies_after_the_next_stage_waited() -> None:
        deadline = time.monotonic() + 60
        try:
            while time.monotonic() < deadline and not any(
                    reschedules(dag.dag_id, r, "orders.ingest") >= 2 for r in runs_of(dag.dag_id, owner.run_id)):
                time.sleep(0.2)
            died["still_open"] = pipeline_of(paths).state(stuck) is EpochState.OPEN  # waited, no abort
        finally:
            lease.stop()  # "Mark run as failed": the worker running its stage is killed...
            set_run_state(dag.dag_id, owner.run_id, "failed")  # ...and the run is failed
            died["at"] = time.time()

    killer = threading.Thread(target=owner_dies_after_the_next_stage_waited, daemon=True)
    killer.start()
    try:
        nxt = run_dag(dag, logical_date=logical_date(1), run_after=logical_date(1))
    finally:
        lease.stop()
        killer.join(5)

    assert died.get("still_open") is True, "the next run's stage did not wait for the live epoch"
    assert nxt.state == "success", task_states(nxt)
    stage_ti = next(ti for ti in nxt.get_task_instances() if ti.task_id == "orders.ingest")
    assert stage_ti.try_number == 1  # rescheduled while waiting: no retry spent
    assert reschedules(dag.dag_id, nxt.run_id, "orders.ingest") >= 2
    p = pipeline_of(paths)
    assert p.state(stuck) is EpochState.ABORTED
    began = p.txlog.read_begin(stuck + 1)
    assert began is not None and began.run_id == nxt.run_id
    took = began.created_at - died["at"]
    print(f"\nowning run dead -> next run processing: {took:.1f}s (pending_poke_interval={POKE_S:g}s)")
    assert 0 < took < 60
    assert p.state(stuck + 1) is EpochState.COMMITTED
    assert published_rows(paths["target"]) == rows_for(nxt.run_id, "ingest", 3)


def runs_of(dag_id: str, other_than: str) -> list[str]:
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        return [r for r in session.scalars(select(DagRun.run_id).where(DagRun.dag_id == dag_id)) if r != other_than]


def test_a_wait_that_outlasts_pending_wait_timeout_fails_naming_the_abort_command(
    run_dag: Any, paths: dict[str, Any], capfd: pytest.CaptureFixture[str],
) -> None:
    dag = build_dag("pending_wait_bounded", paths, pending_wait_timeout=3.0, retries=0)
    owner, stuck = owner_run_left_its_epoch_open(run_dag, dag, paths)
    set_run_state(dag.dag_id, owner.run_id, "running")
    with LeaseKeeper.for_pipeline(pipeline_of(paths), stuck, "ingest", 1):
        nxt = run_dag(dag, logical_date=logical_date(1), run_after=logical_date(1))

    assert task_states(nxt)["orders.ingest"] == "failed"
    assert pipeline_of(paths).state(stuck) is EpochState.OPEN  # alive: never aborted by the waiter
    logged = "".join(capfd.readouterr())
    assert "pending_wait_timeout=3s" in logged and "is ALIVE: lease of 'ingest'" in logged
    # What the wait is for: the stage to prepare, or its lease to run out if it was killed.
    assert re.search(r"waiting for its stage \(attempt 1 on [^)]*\) to prepare, or -- if that stage was killed "
                     r"and renews its lease no more -- for the lease to expire in \d+s at the latest", logged)
    assert f"abort {PIPELINE} {stuck} --reason" in logged


def test_the_recovery_task_aborts_an_epoch_whose_run_airflow_reports_finished(
    run_dag: Any, paths: dict[str, Any],
) -> None:
    from datetime import timedelta

    from airflow.sdk import DAG

    from airflow_seatunnel_ckpt.operators.recovery import RecoverPipelineOperator

    dag = build_dag("pending_recovered", paths)
    owner, stuck = owner_run_left_its_epoch_open(run_dag, dag, paths)
    with DAG("pending_recovery", schedule=None, start_date=START, catchup=False,
             default_args={"retry_delay": timedelta(seconds=0)}) as recovery:
        RecoverPipelineOperator(task_id="recover", pipeline=PIPELINE, storage_url=paths["storage_url"],
                                store_config=STORE_CONFIG, pipeline_dag_id=dag.dag_id)

    with LeaseKeeper.for_pipeline(pipeline_of(paths), stuck, "ingest", 1):  # its lease is even alive
        set_run_state(dag.dag_id, owner.run_id, "running")
        waited = run_dag(recovery, logical_date=logical_date(1), run_after=logical_date(1))
        assert waited.state == "success" and pipeline_of(paths).state(stuck) is EpochState.OPEN
        set_run_state(dag.dag_id, owner.run_id, "failed")
        run = run_dag(recovery, logical_date=logical_date(2), run_after=logical_date(2))

    assert run.state == "success"
    status = pipeline_of(paths).status(stuck)
    assert status.state is EpochState.ABORTED and status.decision is not None
    assert status.decision.by == "recovery" and f"run {owner.run_id!r} is finished" in status.decision.reason


def test_a_wait_under_dag_test_for_a_killed_stages_lease_logs_one_line_saying_what_and_until_when(
    run_dag: Any, tmp_path: Path, capfd: pytest.CaptureFixture[str],
) -> None:
    # A short lease: the killed stage's lease runs out in seconds (the default one in three minutes).
    store = {"lease_timeout_s": 10.0, "lease_renew_s": 0.5}
    paths = {"storage_url": f"file://{tmp_path / 'store'}", "target_url": f"file://{tmp_path / 'table'}",
             "target": tmp_path / "table"}
    dag = build_dag("pending_killed_lease", paths)
    for task in dag.tasks:
        task.store_config = store
    owner, stuck = owner_run_left_its_epoch_open(run_dag, dag, paths)
    set_run_state(dag.dag_id, owner.run_id, "running")  # `airflow dags test` killed: its run stays running
    pipeline = CheckpointStore.from_url(paths["storage_url"], **store).pipeline(PIPELINE)
    lease = LeaseKeeper.for_pipeline(pipeline, stuck, "ingest", 1).__enter__()

    def stage_killed_once_the_next_run_looked() -> None:
        deadline = time.monotonic() + 60
        try:
            while time.monotonic() < deadline and not any(
                    reschedules(dag.dag_id, r, "orders.ingest") >= 1 for r in runs_of(dag.dag_id, owner.run_id)):
                time.sleep(0.2)
        finally:
            lease.stop()  # killed: its lease is renewed no more, and runs out lease_timeout_s later

    killer = threading.Thread(target=stage_killed_once_the_next_run_looked, daemon=True)
    killer.start()
    capfd.readouterr()
    try:
        nxt = run_dag(dag, logical_date=logical_date(1), run_after=logical_date(1))
    finally:
        lease.stop()
        killer.join(5)

    assert nxt.state == "success", task_states(nxt)
    assert pipeline.state(stuck) is EpochState.ABORTED and pipeline.state(stuck + 1) is EpochState.COMMITTED
    logged = "".join(capfd.readouterr())
    waits = [line for line in logged.splitlines() if "this run waits" in line]
    looks = reschedules(dag.dag_id, nxt.run_id, "orders.ingest")
    print(f"\n{looks} looks at the killed stage's epoch; lines about the wait: {len(waits)}")
    assert looks >= 4, "the run did not wait for the lease"
    assert len(waits) == 1, waits  # one line (then one a minute), not one every look
    # What it waits for and until when: the lease's expiry as a time of day, and when it gives up.
    assert re.search(r"for the lease to expire in \d+s at the latest \(at \d\d:\d\d:\d\d UTC\).*"
                     r"this run waits, looking again every 2s, until \d\d:\d\d:\d\d UTC at the latest", waits[0])
