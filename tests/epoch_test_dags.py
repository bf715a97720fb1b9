"""DAGs for the Airflow-layer tests whose stage prepares with core calls only (no Spark).

:class:`CorePrepareOperator` is a real participant: it begins the run's epoch, stages
JSON-lines output for each sink in its attempt's staging directory and logs it prepared
through ``Pipeline.prepare`` -- exactly what the Spark runtime does, minus Spark. It
lets the orchestration scenarios (retries, timeouts, clears, recovery) run in a second.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

from airflow.sdk import DAG

from airflow_seatunnel_ckpt.pipeline_task import BasePipelineOperator
from airflow_seatunnel_ckpt.task_group import checkpointed_epoch

START = datetime(2026, 1, 1, tzinfo=UTC)
PIPELINE = "orders"
REPO = Path(__file__).resolve().parents[1]


def logical_date(hour: int) -> datetime:
    """The logical date of the ``hour``-th hourly run."""
    return START + timedelta(hours=hour)


def rows_for(run_id: str, participant: str, count: int) -> list[dict[str, Any]]:
    """The rows a participant stages for a run (deterministic, unique per run)."""
    return [{"order_id": f"{run_id}/{participant}/{i}", "amount": i} for i in range(count)]


class CorePrepareOperator(BasePipelineOperator):
    """Prepare the run's epoch as ``participant`` with core calls only.

    :param sinks: sink name -> target URL.
    :param rows: rows staged per sink.
    :param fail: raise after staging (a stage that dies mid-way).
    :param fail_tries: like ``fail``, but only on the first ``fail_tries`` tries.
    :param skip_prepare: begin and stage but never log prepared (a stage that hangs).
    """

    template_fields = ("pipeline", "storage_url")

    def __init__(self, *, participant: str, sinks: Mapping[str, str],
                 rows: int = 3, fail: bool = False, fail_tries: int = 0,
                 skip_prepare: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.participant = participant
        self.sinks = dict(sinks)
        self.rows = rows
        self.fail = fail
        self.fail_tries = fail_tries
        self.skip_prepare = skip_prepare

    def execute(self, context: Any) -> dict[str, Any]:
        pipeline = self.store_pipeline
        run_id = context["run_id"]
        attempt = context["ti"].try_number
        epoch = pipeline.begin(run_id).epoch
        existing = pipeline.status(epoch).prepared.get(self.participant)
        if existing is not None:
            return {"epoch": epoch, "attempt": existing.attempt, "reused": True}
        manifests = []
        rows = rows_for(run_id, self.participant, self.rows)
        for sink, target in self.sinks.items():
            staging = pipeline.staging_path(epoch, attempt, sink)
            data = "".join(json.dumps(r) + "\n" for r in rows).encode()
            pipeline.storage.write_atomic(f"{staging}/part-{self.participant}.jsonl", data)
            manifests.append(pipeline.manifest_for_staged(epoch, attempt, sink, target, len(rows),
                                                          fmt="json"))
        if self.fail or attempt <= self.fail_tries:
            raise RuntimeError(f"stage {self.participant} failed after staging (epoch {epoch})")
        if self.skip_prepare:
            return {"epoch": epoch, "attempt": attempt, "prepared": False}
        record = pipeline.prepare(epoch, self.participant, attempt, run_id=run_id, sinks=manifests)
        return {"epoch": epoch, "attempt": record.attempt, "reused": False}


def build_epoch_dag(
    dag_id: str,
    storage_url: str,
    target_url: str,
    *,
    participants: Mapping[str, Mapping[str, Any]] | None = None,
    sensor: Mapping[str, Any] | None = None,
    branch: Mapping[str, Any] | None = None,
    commit: Mapping[str, Any] | None = None,
    fallback: bool = False,
    store_config: Mapping[str, Any] | None = None,
    on_refusal: Literal["fail", "succeed"] = "fail",
    on_failure_callback: Any = None,
) -> DAG:
    """One checkpointed epoch per run: core-only stage(s) -> sensor -> branch -> commit/abort.

    ``on_failure_callback``: the DAG's, called when a run fails.
    """
    participants = participants or {"ingest": {}}
    stages = {name: {"sinks": {"orders_table": target_url}, **dict(options)}
              for name, options in participants.items()}
    with DAG(dag_id, schedule=None, start_date=START, catchup=False, max_active_runs=1,
             default_args={"retry_delay": timedelta(seconds=0)}, on_failure_callback=on_failure_callback) as dag:
        fallback_task = None
        if fallback:
            from airflow.providers.standard.operators.empty import EmptyOperator

            fallback_task = EmptyOperator(task_id="quarantine")
        checkpointed_epoch(
            "orders", pipeline=PIPELINE, stages=stages, storage_url=storage_url,
            store_config=store_config,
            sensor={"poke_interval": 0.2, "timeout": 30, **dict(sensor or {})},
            branch=branch,
            commit={"retries": 3, "retry_delay": timedelta(seconds=0.1),
                    "retry_exponential_backoff": 2.0, **dict(commit or {})},
            fallback=fallback_task, stage_class=CorePrepareOperator, emit_assets=False, on_refusal=on_refusal,
        )
    return dag


def published_rows(target: Path) -> list[dict[str, Any]]:
    """Every row below ``target`` (all epochs), in file order."""
    rows = []
    for path in sorted(target.glob("epoch=*/**/*.jsonl")):
        rows += [json.loads(line) for line in path.read_text().splitlines()]
    return rows


def tree(root: Path) -> dict[str, tuple[int, int]]:
    """Relative path -> (size, mtime_ns) of every file below ``root``."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*")) if p.is_file()}


def task_states(dag_run: Any) -> dict[str, str]:
    """task id -> state of every task instance of a DAG run (mapped: ``id[i]``)."""
    out = {}
    for ti in dag_run.get_task_instances():
        key = ti.task_id if ti.map_index < 0 else f"{ti.task_id}[{ti.map_index}]"
        out[key] = str(ti.state.value if hasattr(ti.state, "value") else ti.state)
    return out


def run_note(dag_run: Any) -> str | None:
    """The note of a DAG run, read from the metadata database (None without one)."""
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        found = session.scalar(select(DagRun).where(DagRun.dag_id == dag_run.dag_id,
                                                    DagRun.run_id == dag_run.run_id))
        return None if found is None else found.note


def try_numbers(dag_run: Any) -> dict[str, int]:
    """task id -> try number of every task instance of a DAG run."""
    return {ti.task_id: ti.try_number for ti in dag_run.get_task_instances()}


def load_recovery_dag(storage_url: str, monkeypatch: Any) -> Any:
    """The recovery DAG of ``dags/``, parsed for the store at ``storage_url``."""
    monkeypatch.setenv("SEATUNNEL_CKPT_STORE", storage_url)
    monkeypatch.delenv("SEATUNNEL_CKPT_STORE_CONN_ID", raising=False)
    spec = importlib.util.spec_from_file_location(
        "seatunnel_ckpt_recovery_under_test", REPO / "dags" / "seatunnel_ckpt_recovery.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.dag
