"""Wall-clock overhead of the Airflow tasks around one epoch (sensor + branch + commit).

Spark is excluded: the stage is a core-only participant that stages a small file and
logs it prepared. For each of ``--epochs`` DAG runs (``dag.test()`` on SQLite, tasks in
this process) it measures

* ``tasks``: the summed durations of the ``prepared``, ``decide`` and ``commit`` task
  instances (Airflow's start/end: context, templating, XCom, state updates, our code);
* ``run``: the DAG run's wall clock minus the stage task's duration (adds the in-process
  scheduling loop between tasks);

and, as the baseline measured in the same process, the same protocol steps called on the
core directly (``check_prepared``, ``decide``, ``commit``) for an identically prepared
epoch. It prints medians and the ratios against the baseline. The first epoch of each
kind is a warm-up and not counted.

    python bench/bench_airflow_overhead.py --epochs 20
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

WORK = Path(tempfile.mkdtemp(prefix="seatunnel-ckpt-bench-"))
os.environ.update({
    "AIRFLOW_HOME": str(WORK / "airflow"),
    "AIRFLOW__CORE__DAGS_FOLDER": str(WORK / "airflow" / "dags"),
    "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    "AIRFLOW__CORE__ALLOWED_DESERIALIZATION_CLASSES": "airflow.* airflow_seatunnel_ckpt.*",
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{WORK / 'airflow' / 'airflow.db'}",
    "AIRFLOW__DATABASE__LOAD_DEFAULT_CONNECTIONS": "False",
    "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING",
})
(WORK / "airflow" / "dags").mkdir(parents=True)

START = datetime(2026, 1, 1, tzinfo=UTC)
STAGE, SENSOR, BRANCH, COMMIT = "epoch.ingest", "epoch.prepared", "epoch.decide", "epoch.commit"


def prepare_epoch(pipeline: Any, run_id: str, attempt: int, target_url: str) -> int:
    """Begin ``run_id``'s epoch and prepare one participant with a 100-row staged file."""
    epoch = pipeline.begin(run_id).epoch
    staging = pipeline.staging_path(epoch, attempt, "table")
    rows = "".join(f'{{"id": "{run_id}-{i}", "amount": {i}}}\n' for i in range(100))
    pipeline.storage.write_atomic(f"{staging}/part-0.jsonl", rows.encode())
    manifest = pipeline.manifest_for_staged(epoch, attempt, "table", target_url, 100, fmt="json")
    pipeline.prepare(epoch, "ingest", attempt, run_id=run_id, sinks=[manifest])
    return epoch


def build_dag(storage_url: str, target_url: str) -> Any:
    from airflow.sdk import DAG

    from airflow_seatunnel_ckpt.pipeline_task import BasePipelineOperator
    from airflow_seatunnel_ckpt.task_group import checkpointed_epoch

    class CoreStage(BasePipelineOperator):
        """The stage without Spark: core calls only."""

        def __init__(self, *, participant: str, **kwargs: Any) -> None:
            super().__init__(**kwargs)

        def execute(self, context: Any) -> int:
            return prepare_epoch(self.store_pipeline, context["run_id"],
                                 context["ti"].try_number, target_url)

    with DAG("bench_overhead", schedule=None, start_date=START, catchup=False) as dag:
        checkpointed_epoch("epoch", pipeline="bench", storage_url=storage_url,
                           stages={"ingest": {}}, stage_class=CoreStage, emit_assets=False,
                           sensor={"poke_interval": 0.1})
    return dag


def register(dag: Any) -> None:
    """Write the in-memory DAG to the metadata DB (``dag.test()`` needs it serialized)."""
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.collection import update_dag_parsing_results_in_db
    from airflow.serialization.serialized_objects import LazyDeserializedDAG
    from airflow.utils.session import create_session

    with create_session() as session:
        DagBundlesManager().sync_bundles_to_db(session=session)
        session.flush()
        update_dag_parsing_results_in_db(
            bundle_name="dags-folder", bundle_version=None,
            dags=[LazyDeserializedDAG.from_dag(dag)], import_errors={}, parse_duration=None,
            warnings=set(), session=session)


def airflow_epochs(n: int) -> tuple[list[float], list[float], dict[str, list[float]]]:
    from airflow_seatunnel_ckpt.core import CheckpointStore, EpochState

    storage_url, target_url = f"file://{WORK}/store-airflow", f"file://{WORK}/table-airflow"
    dag = build_dag(storage_url, target_url)
    register(dag)
    pipeline = CheckpointStore.from_url(storage_url).pipeline("bench")
    tasks, runs = [], []
    per_task: dict[str, list[float]] = {SENSOR: [], BRANCH: [], COMMIT: []}
    for i in range(n + 1):
        when = START + timedelta(hours=i)
        began = time.perf_counter()
        dag_run = dag.test(logical_date=when, run_after=when)
        wall = time.perf_counter() - began
        tis = {ti.task_id: ti for ti in dag_run.get_task_instances()}
        if dag_run.state != "success" or pipeline.state(i + 1) is not EpochState.COMMITTED:
            raise SystemExit(f"run {dag_run.run_id} did not commit: {dag_run.state}")
        if i == 0:
            continue  # warm-up: first dag.test syncs bundles, imports, caches
        durations = {t: tis[t].duration for t in (STAGE, SENSOR, BRANCH, COMMIT)}
        for t in per_task:
            per_task[t].append(durations[t])
        tasks.append(durations[SENSOR] + durations[BRANCH] + durations[COMMIT])
        runs.append(wall - durations[STAGE])
    return tasks, runs, per_task


def core_epochs(n: int) -> list[float]:
    from airflow_seatunnel_ckpt.core import CheckpointStore, Decision
    from airflow_seatunnel_ckpt.hooks.checkpoint_store import check_prepared

    storage_url, target_url = f"file://{WORK}/store-core", f"file://{WORK}/table-core"
    pipeline = CheckpointStore.from_url(storage_url).pipeline("bench")
    out = []
    for i in range(n + 1):
        run_id = f"manual__{i}"
        epoch = prepare_epoch(pipeline, run_id, 1, target_url)
        began = time.perf_counter()
        assert check_prepared(pipeline, run_id, ["ingest"]).outcome == "prepared"
        pipeline.status(epoch)  # the branch reads the status before deciding
        pipeline.decide(epoch, Decision.COMMIT, "bench", by="bench", participants=["ingest"])
        pipeline.commit(epoch)
        if i:
            out.append(time.perf_counter() - began)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=20)
    args = parser.parse_args(argv)

    from airflow.utils import db

    try:
        db.upgradedb()
        baseline = core_epochs(args.epochs)
        tasks, runs, per_task = airflow_epochs(args.epochs)
    finally:
        shutil.rmtree(WORK, ignore_errors=True)

    med = statistics.median
    base = med(baseline)
    print(f"epochs measured: {args.epochs} (plus one warm-up each), Spark excluded")
    print(f"baseline, core calls only (check + decide + commit): median {base * 1000:8.1f} ms")
    for name, values in per_task.items():
        print(f"  {name:<16} task median {med(values) * 1000:8.1f} ms")
    print(f"Airflow tasks (sensor + branch + commit):           median {med(tasks) * 1000:8.1f} ms"
          f"  = {med(tasks) / base:5.1f}x baseline, overhead {(med(tasks) - base) * 1000:.1f} ms")
    print(f"DAG run minus stage (incl. scheduling loop):       median {med(runs) * 1000:8.1f} ms"
          f"  = {med(runs) / base:5.1f}x baseline, overhead {(med(runs) - base) * 1000:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
