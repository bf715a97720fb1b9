"""The stage task records its DAG run's logical date in ``begin``; ``seatunnel-ckpt epochs`` shows it.

Real Airflow (``dag.test()`` on SQLite) runs the stage's production ``begin_epoch``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from airflow_seatunnel_ckpt.cli import main
from tests.epoch_test_dags import PIPELINE, logical_date, task_states
from tests.operators.test_pending_epoch import build_dag, pipeline_of

pytestmark = pytest.mark.airflow


@pytest.fixture
def paths(tmp_path: Path) -> dict[str, Any]:
    store = tmp_path / "store"
    target = tmp_path / "table"
    return {"store": store, "target": target, "storage_url": f"file://{store}", "target_url": f"file://{target}"}


def test_the_stage_records_the_logical_date_that_epochs_shows(
    run_dag: Any, paths: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    dag = build_dag("logical_date_recorded", paths)
    when = logical_date(5)

    run = run_dag(dag, logical_date=when, run_after=when)

    assert run.state == "success", task_states(run)
    p = pipeline_of(paths)
    (epoch,) = p.epochs()
    begin = p.txlog.read_begin(epoch)
    assert begin is not None and begin.logical_date == when.isoformat()
    capsys.readouterr()
    assert main(["--store", paths["storage_url"], "--json", "epochs", PIPELINE]) == 0
    entries = json.loads(capsys.readouterr().out)
    assert [(e["epoch"], e["logical_date"]) for e in entries] == [(epoch, when.isoformat())]
