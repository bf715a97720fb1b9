"""A stage task marked success without running (or stopped before it prepared) does not hold the
run for the sensor's whole timeout: the sensor sees at once, from the stage task's state, that
nothing can prepare the run's epoch any more, says so, and the abort task and the next run go on.

Real Airflow (``dag.test()`` on SQLite) with the core-only stage of ``epoch_test_dags``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from airflow_seatunnel_ckpt.core import CheckpointStore, EpochState
from tests.epoch_test_dags import (
    PIPELINE,
    build_epoch_dag,
    logical_date,
    published_rows,
    rows_for,
    task_states,
)

pytestmark = pytest.mark.airflow

#: The sensor's timeout: the run would block this long if the sensor waited it out.
SENSOR_TIMEOUT_S = 120


@pytest.mark.parametrize("deferrable", [False, True], ids=["poke", "deferrable"])
def test_a_stage_marked_success_without_running_fails_the_sensor_in_seconds_and_the_next_run_commits(
    run_dag: Any, tmp_path: Path, capfd: pytest.CaptureFixture[str], deferrable: bool,
) -> None:
    storage_url, target = f"file://{tmp_path}/store", tmp_path / "table"
    dag = build_epoch_dag(f"marked_{'deferrable' if deferrable else 'poke'}", storage_url, f"file://{target}",
                          sensor={"timeout": SENSOR_TIMEOUT_S, "poke_interval": 1, "deferrable": deferrable})

    started = time.monotonic()
    marked = run_dag(dag, logical_date=logical_date(0), run_after=logical_date(0),
                     mark_success_pattern=r"orders\.ingest")
    took = time.monotonic() - started
    print(f"\nstage marked success without running -> run finished: {took:.1f}s "
          f"(sensor timeout {SENSOR_TIMEOUT_S}s)")

    states = task_states(marked)
    assert states["orders.ingest"] == "success"
    assert states["orders.prepared"] == "failed", states
    assert states["orders.abort"] == "success", states
    assert took < 45, f"the run waited {took:.0f}s for a stage that never ran"
    logged = "".join(capfd.readouterr())
    assert "the stage was marked success without running" in logged, logged[-3000:]
    assert "orders.ingest (success)" in logged
    pipeline = CheckpointStore.from_url(storage_url).pipeline(PIPELINE)
    assert pipeline.epoch_for_run(marked.run_id) is None

    nxt = run_dag(dag, logical_date=logical_date(1), run_after=logical_date(1))

    assert nxt.state == "success", task_states(nxt)
    assert pipeline.state(1) is EpochState.COMMITTED and pipeline.status(1).run_id == nxt.run_id
    assert published_rows(target) == rows_for(nxt.run_id, "ingest", 3)


def test_a_stage_that_finished_without_preparing_its_begun_epoch_is_aborted_at_once_with_the_reason(
    run_dag: Any, tmp_path: Path,
) -> None:
    # The stage began the epoch and staged output, then its task ended as success without
    # preparing -- what a stage marked success while it runs leaves behind.
    storage_url, target = f"file://{tmp_path}/store", tmp_path / "table"
    dag = build_epoch_dag("stopped_before_prepare", storage_url, f"file://{target}",
                          participants={"ingest": {"skip_prepare": True}},
                          sensor={"timeout": SENSOR_TIMEOUT_S, "poke_interval": 1})

    started = time.monotonic()
    stopped = run_dag(dag, logical_date=logical_date(0), run_after=logical_date(0))
    took = time.monotonic() - started

    states = task_states(stopped)
    assert states["orders.prepared"] == "failed" and states["orders.abort"] == "success", states
    assert took < 45, f"the run waited {took:.0f}s for a stage that had finished"
    pipeline = CheckpointStore.from_url(storage_url).pipeline(PIPELINE)
    status = pipeline.status(1)
    assert status.state is EpochState.ABORTED and status.decision is not None
    assert "never prepared by participant(s) ingest" in status.decision.reason
    assert "marked success before it prepared" in status.decision.reason
    assert not list((tmp_path / "store" / PIPELINE / "_staging").glob("epoch=1/*"))


def test_the_decision_says_the_stage_was_marked_without_running_when_the_sensor_was_marked_too(
    run_dag: Any, tmp_path: Path, capfd: pytest.CaptureFixture[str],
) -> None:
    storage_url, target = f"file://{tmp_path}/store", tmp_path / "table"
    dag = build_epoch_dag("marked_stage_and_sensor", storage_url, f"file://{target}",
                          sensor={"timeout": SENSOR_TIMEOUT_S, "poke_interval": 1})

    marked = run_dag(dag, logical_date=logical_date(0), run_after=logical_date(0),
                     mark_success_pattern=r"orders\.(ingest|prepared)")

    states = task_states(marked)
    assert states["orders.decide"] == "failed" and states["orders.abort"] == "success", states
    logged = "".join(capfd.readouterr())
    assert "has no epoch, so there is nothing to decide: stage task(s) orders.ingest (success) finished" in logged
    assert "the stage was marked success without running" in logged
    nxt = run_dag(dag, logical_date=logical_date(1), run_after=logical_date(1))
    assert nxt.state == "success", task_states(nxt)
    assert published_rows(target) == rows_for(nxt.run_id, "ingest", 3)
