"""A refused epoch holds its input back, and its DAG run says so: it ends failed (its failure
callback fires), its note names the reason, and the next run with good input commits.

Real Airflow on SQLite (``dag.test()``) around the core-only stage of ``tests.epoch_test_dags``;
the refusal is a user check of the commit branch, a crash is a stage that dies. The DAG's
``on_failure_callback`` appends to a file, so the test sees that it was called.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from airflow_seatunnel_ckpt.core import CheckpointStore, EpochState
from airflow_seatunnel_ckpt.core.protocol.pipeline import HeldBack
from tests.epoch_test_dags import (
    PIPELINE,
    build_epoch_dag,
    logical_date,
    published_rows,
    rows_for,
    run_note,
    task_states,
    try_numbers,
)

pytestmark = pytest.mark.airflow

REASON = "check failed: orders_look_right: order ids look wrong"


@pytest.fixture
def paths(tmp_path: Path) -> dict[str, Any]:
    return {"store": tmp_path / "store", "target": tmp_path / "table", "storage_url": f"file://{tmp_path}/store",
            "target_url": f"file://{tmp_path}/table", "refuse": tmp_path / "refuse", "alerts": tmp_path / "alerts"}


def refused_while(marker: Path) -> Callable[[Any], str | None]:
    """A check of the commit branch that refuses every epoch while ``marker`` exists."""

    def orders_look_right(status: Any) -> str | None:
        return "order ids look wrong" if marker.exists() else None

    return orders_look_right


def alert_to(path: Path) -> Callable[[Any], None]:
    """A DAG failure callback that appends the failed run's id to ``path``."""

    def alert(context: Any) -> None:
        with path.open("a") as out:
            out.write(json.dumps({"run_id": context["run_id"], "reason": context.get("reason")}) + "\n")

    return alert


def alerts(paths: dict[str, Any]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in paths["alerts"].read_text().splitlines()] if paths["alerts"].exists() else []


def test_a_refused_epoch_fails_its_run_with_the_reason_in_the_note_and_the_next_run_commits(
        run_at: Any, paths: dict[str, Any]) -> None:
    paths["refuse"].touch()
    dag = build_epoch_dag("refused_run", paths["storage_url"], paths["target_url"],
                          branch={"check": refused_while(paths["refuse"])},
                          on_failure_callback=alert_to(paths["alerts"]))

    refused = run_at(dag, logical_date(0))

    assert refused.state == "failed"
    states = task_states(refused)
    assert (states["orders.decide"], states["orders.commit"], states["orders.abort"]) == ("success", "skipped",
                                                                                       "failed")
    assert try_numbers(refused)["orders.abort"] == 1
    assert alerts(paths) == [{"run_id": refused.run_id, "reason": "task_failure"}]
    assert run_note(refused) == f"Input held back: pipeline 'orders' epoch 1 refused and aborted: {REASON}"
    pipeline = CheckpointStore.from_url(paths["storage_url"]).pipeline(PIPELINE)
    assert pipeline.state(1) is EpochState.ABORTED
    assert pipeline.held_back() == HeldBack(since=1, runs=1, newest=1, reason=REASON)
    assert not paths["target"].exists()

    paths["refuse"].unlink()  # the input (or the rule) is fixed
    good = run_at(dag, logical_date(1))

    assert good.state == "success", task_states(good)
    assert pipeline.state(2) is EpochState.COMMITTED and pipeline.held_back() is None
    assert published_rows(paths["target"]) == rows_for(good.run_id, "ingest", 3)
    assert run_note(good) is None and len(alerts(paths)) == 1


def test_on_refusal_succeed_keeps_a_refused_run_green(run_at: Any, paths: dict[str, Any]) -> None:
    paths["refuse"].touch()
    dag = build_epoch_dag("refused_green", paths["storage_url"], paths["target_url"], on_refusal="succeed",
                          branch={"check": refused_while(paths["refuse"])},
                          on_failure_callback=alert_to(paths["alerts"]))

    run = run_at(dag, logical_date(0))

    assert run.state == "success"
    assert task_states(run)["orders.abort"] == "success"
    assert alerts(paths) == [] and run_note(run) is None
    pipeline = CheckpointStore.from_url(paths["storage_url"]).pipeline(PIPELINE)
    assert pipeline.state(1) is EpochState.ABORTED
    assert pipeline.held_back() == HeldBack(since=1, runs=1, newest=1, reason=REASON)


def test_an_abort_after_a_crash_is_not_a_refusal(run_at: Any, paths: dict[str, Any]) -> None:
    dag = build_epoch_dag("crashed_run", paths["storage_url"], paths["target_url"],
                          participants={"ingest": {"fail": True}}, on_failure_callback=alert_to(paths["alerts"]))

    crashed = run_at(dag, logical_date(0))

    # The run fails because its stage did, as before; the abort task succeeds and writes no note.
    assert crashed.state == "failed"
    assert task_states(crashed)["orders.ingest"] == "failed"
    assert task_states(crashed)["orders.abort"] == "success"
    assert run_note(crashed) is None
    pipeline = CheckpointStore.from_url(paths["storage_url"]).pipeline(PIPELINE)
    assert pipeline.state(1) is EpochState.ABORTED and pipeline.held_back() is None


def test_a_refused_run_cleared_after_the_fix_commits_and_loses_its_held_back_note(
        run_at: Any, clear_and_rerun: Any, paths: dict[str, Any]) -> None:
    paths["refuse"].touch()
    dag = build_epoch_dag("refused_cleared", paths["storage_url"], paths["target_url"],
                          branch={"check": refused_while(paths["refuse"])})
    refused = run_at(dag, logical_date(0))
    assert refused.state == "failed" and run_note(refused) is not None

    paths["refuse"].unlink()
    cleared = clear_and_rerun(dag, refused.run_id, list(task_states(refused)))

    assert cleared.state == "success"
    assert run_note(cleared) is None
    pipeline = CheckpointStore.from_url(paths["storage_url"]).pipeline(PIPELINE)
    assert [pipeline.state(e) for e in pipeline.epochs()] == [EpochState.ABORTED, EpochState.COMMITTED]
    assert published_rows(paths["target"]) == rows_for(refused.run_id, "ingest", 3)
