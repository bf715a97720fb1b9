"""A table sink's refusal in Airflow: the branch takes the abort path, and a refusal after the
decision fails the commit task at once instead of retrying it for minutes.

The stage prepares Parquet for a Delta upsert sink with core calls (no Spark); the DAG is
the provider's own task group (sensor, branch, commit, abort) run with ``dag.test()`` on
SQLite, and the table is read back with DuckDB.
"""

from __future__ import annotations

import dataclasses
import io
import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from airflow.sdk import DAG
from deltalake import DeltaTable

from airflow_seatunnel_ckpt.core import CheckpointStore, EpochState
from airflow_seatunnel_ckpt.core.models import SinkMode
from airflow_seatunnel_ckpt.pipeline_task import BasePipelineOperator
from airflow_seatunnel_ckpt.task_group import checkpointed_epoch
from tests.epoch_test_dags import PIPELINE, START, logical_date, run_note, task_states, try_numbers
from tests.tables import duckdb_delta_rows

pytestmark = pytest.mark.airflow


class ParquetPrepareOperator(BasePipelineOperator):
    """Prepare the run's epoch with the rows of ``rows_file`` staged as Parquet for a Delta sink.

    :param rows_file: JSON list of ``{"customer", "total"}`` rows, read when the task runs.
    :param table: the sink's table options (``{"type": "delta", "path": ...}``).
    """

    def __init__(self, *, participant: str, sinks: dict[str, str], rows_file: str, table: dict[str, Any],
                 mode: str = "append", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.participant = participant
        self.sinks = sinks
        self.rows_file = rows_file
        self.table = table
        self.mode = mode

    def execute(self, context: Any) -> dict[str, Any]:
        pipeline = self.store_pipeline
        run_id, attempt = context["run_id"], context["ti"].try_number
        epoch = pipeline.begin(run_id, dag_id=context["dag"].dag_id).epoch
        rows = json.loads(Path(self.rows_file).read_text())
        [(sink, target)] = self.sinks.items()
        buf = io.BytesIO()
        pq.write_table(pa.Table.from_pylist(rows, pa.schema([("customer", pa.string()), ("total", pa.float64())])),
                       buf)
        pipeline.storage.write_atomic(f"{pipeline.staging_path(epoch, attempt, sink)}/part-00000.parquet",
                                      buf.getvalue())
        manifest = pipeline.manifest_for_staged(epoch, attempt, sink, target, len(rows))
        manifest = dataclasses.replace(manifest, table=self.table, mode=SinkMode(self.mode))
        pipeline.prepare(epoch, self.participant, attempt, run_id=run_id, sinks=[manifest])
        return {"epoch": epoch}


@pytest.fixture
def lake(tmp_path: Path) -> dict[str, Any]:
    return {"storage_url": f"file://{tmp_path / 'store'}", "uri": str(tmp_path / "totals"),
            "rows": tmp_path / "rows.json"}


def build_dag(dag_id: str, lake: dict[str, Any], *, table: dict[str, Any], mode: str = "append",
              commit: dict[str, Any] | None = None) -> DAG:
    with DAG(dag_id, schedule=None, start_date=START, catchup=False, max_active_runs=1,
             default_args={"retry_delay": timedelta(seconds=0)}) as dag:
        checkpointed_epoch(
            "orders", pipeline=PIPELINE, storage_url=lake["storage_url"], emit_assets=False,
            stages={"ingest": {"sinks": {"totals": lake["uri"]}, "rows_file": str(lake["rows"]), "table": table,
                               "mode": mode}},
            sensor={"poke_interval": 0.2, "timeout": 30},
            commit={"retries": 3, "retry_delay": timedelta(seconds=0.1), **(commit or {})},
            stage_class=ParquetPrepareOperator)
    return dag


def write_rows(lake: dict[str, Any], *rows: tuple[str | None, float]) -> None:
    lake["rows"].write_text(json.dumps([{"customer": c, "total": t} for c, t in rows]))


def test_a_sink_refusing_the_epoch_takes_the_abort_path_and_the_next_run_commits(
        run_at: Any, lake: dict[str, Any]) -> None:
    dag = build_dag("refused_upsert", lake, table={"type": "delta", "path": lake["uri"], "merge_keys": ["customer"]},
                    mode="upsert")
    write_rows(lake, ("c0", 1.0))
    assert run_at(dag, logical_date(0)).state == "success"

    write_rows(lake, ("c1", 2.0), ("c1", 3.0))  # one key twice: the upsert cannot take it
    refused = run_at(dag, logical_date(1))

    assert refused.state == "failed"  # its input is held back: the abort task fails, so alerts fire
    assert task_states(refused) == {"orders.ingest": "success", "orders.prepared": "success",
                                    "orders.decide": "success", "orders.commit": "skipped",
                                    "orders.abort": "failed",
                                    "orders.epoch_or_replay": "success", "orders.replay": "skipped"}
    pipeline = CheckpointStore.from_url(lake["storage_url"]).pipeline(PIPELINE)
    decision = pipeline.status(2).decision
    assert pipeline.state(2) is EpochState.ABORTED and decision is not None
    assert "sink 'totals'" in decision.reason and "appear more than once" in decision.reason
    assert run_note(refused) == f"Input held back: pipeline 'orders' epoch 2 refused and aborted: {decision.reason}"
    assert duckdb_delta_rows(lake["uri"]) == [("c0", 1.0)]

    write_rows(lake, ("c1", 2.0))
    assert run_at(dag, logical_date(2)).state == "success"
    assert pipeline.state(3) is EpochState.COMMITTED
    assert duckdb_delta_rows(lake["uri"]) == [("c0", 1.0), ("c1", 2.0)]


def test_a_refusal_after_the_decision_fails_the_commit_task_without_retries(
        run_at: Any, lake: dict[str, Any]) -> None:
    def table_made_append_only(context: Any) -> None:
        # The table's owner alters it between the decision and the commit.
        if DeltaTable.is_deltatable(lake["uri"]):
            DeltaTable(lake["uri"]).alter.set_table_properties({"delta.appendOnly": "true"})

    table = {"type": "delta", "path": lake["uri"]}
    write_rows(lake, ("c0", 1.0))
    first = build_dag("altered_table", lake, table=table, mode="snapshot")
    assert run_at(first, logical_date(0)).state == "success"
    dag = build_dag("altered_table", lake, table=table, mode="snapshot",
                    commit={"on_execute_callback": table_made_append_only})

    write_rows(lake, ("c1", 2.0))
    run = run_at(dag, logical_date(1))

    assert run.state == "failed"
    assert task_states(run)["orders.commit"] == "failed"
    assert try_numbers(run)["orders.commit"] == 1  # retries=3, none used: a retry cannot change a refusal
    pipeline = CheckpointStore.from_url(lake["storage_url"]).pipeline(PIPELINE)
    assert pipeline.state(2) is EpochState.COMMITTING
    assert duckdb_delta_rows(lake["uri"]) == [("c0", 1.0)]
