"""What a stage sees of the Airflow run (``ctx.logical_date``, ``ctx.params`` ...), in-process and in the spec."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from airflow_seatunnel_ckpt.core.errors import ConfigError
from airflow_seatunnel_ckpt.spark import StageSpec, run_stage
from airflow_seatunnel_ckpt.spark.context import AirflowContext
from tests.spark.conftest import OrdersPipeline
from tests.spark.stages import CONTEXT_FILE_ENV, record_airflow_context

RUN = {
    "dag_id": "orders_pipeline", "task_id": "orders.ingest", "run_id": "scheduled__2026-01-02T03:00:00+00:00",
    "logical_date": "2026-01-02T03:00:00+00:00", "data_interval_start": "2026-01-02T02:00:00+00:00",
    "data_interval_end": "2026-01-02T03:00:00+00:00", "params": {"region": "eu", "limit": 5},
}


def test_the_airflow_context_travels_in_the_spec_as_json() -> None:
    spec = StageSpec(pipeline="orders", participant="ingest", run_id="r", attempt=1, stage="m:f",
                     airflow_context=RUN)
    again = StageSpec.from_json(spec.to_json())
    assert again.airflow_context == RUN
    view = AirflowContext.from_dict(again.airflow_context)
    assert view.logical_date == datetime(2026, 1, 2, 3, tzinfo=UTC)
    assert view.to_dict() == RUN
    assert "epoch" not in view.to_dict() and "attempt" not in view.to_dict()


def test_an_unknown_airflow_context_field_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"unknown airflow_context field\(s\) \['try_number'\]"):
        AirflowContext.from_dict({**RUN, "try_number": 1})


@pytest.mark.spark
def test_the_stage_sees_logical_date_interval_and_params_read_only(
    spark: Any, orders: OrdersPipeline, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "ctx.json"
    monkeypatch.setenv(CONTEXT_FILE_ENV, str(out))
    orders.add_file("a", [1, 2])
    spec = orders.spec(RUN["run_id"], airflow_context=RUN)
    result = run_stage(spec, spark, stage_fn=record_airflow_context)  # a function, not an import path
    assert result.rows == 2
    seen = json.loads(out.read_text())
    assert {k: seen[k] for k in RUN} == RUN
    assert seen["logical_date_attr"] == RUN["logical_date"]
    assert seen["params_attr"] == RUN["params"]
    assert seen["params_writable"] is False
