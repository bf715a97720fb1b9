"""Fixtures of the Airflow-layer tests: run, clear and re-run DAGs on SQLite, capture metrics."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.airflow

#: The repository's DAGs folder. Airflow puts its DAGs folder on ``sys.path`` of every
#: parse and task process, so the example DAG imports its sibling ``orders_example``; the
#: tests parse the DAG files from here, so they do the same.
REPO_DAGS = Path(__file__).resolve().parents[2] / "dags"
if str(REPO_DAGS) not in sys.path:
    sys.path.append(str(REPO_DAGS))


@pytest.fixture
def run_at(run_dag: Callable[..., Any]) -> Callable[..., Any]:
    """``run_at(dag, logical_date) -> DagRun`` with a deterministic run id.

    ``run_after`` equals the logical date, so the run id is
    ``manual__<logical date>`` and running the same date again re-creates the same run
    (same run id, every task cleared) -- the "clear the whole DAG run" of the UI.
    """

    def run(dag: Any, when: Any) -> Any:
        return run_dag(dag, logical_date=when, run_after=when)

    return run


@pytest.fixture
def clear_and_rerun(airflow_home: Path) -> Callable[..., Any]:
    """``clear_and_rerun(dag, run_id, task_ids) -> DagRun``: the UI's *Clear* on some tasks.

    Clears the named task instances of a finished run (Airflow bumps their try number)
    and drives the run again until it is finished, exactly like ``dag.test()`` drives a
    new run: only the cleared tasks run again.
    """
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance, clear_task_instances
    from airflow.sdk.definitions.dag import _run_task
    from airflow.serialization.serialized_objects import DagSerialization
    from airflow.utils.session import create_session
    from airflow.utils.state import DagRunState, TaskInstanceState
    from sqlalchemy import select

    def rerun(dag: Any, run_id: str, task_ids: Sequence[str]) -> Any:
        with create_session() as session:
            tis = session.scalars(select(TaskInstance).where(
                TaskInstance.dag_id == dag.dag_id, TaskInstance.run_id == run_id,
                TaskInstance.task_id.in_(list(task_ids)))).all()
            assert {ti.task_id for ti in tis} == set(task_ids), "unknown task ids"
            clear_task_instances(list(tis), session, dag_run_state=DagRunState.RUNNING)
        scheduler_dag = DagSerialization.deserialize_dag(DagSerialization.serialize_dag(dag))
        with create_session() as session:
            dag_run = session.scalar(select(DagRun).where(DagRun.dag_id == dag.dag_id,
                                                          DagRun.run_id == run_id))
            assert dag_run is not None, f"no run {run_id!r} of {dag.dag_id}"
            dag_run.dag = scheduler_dag
            deadline = time.monotonic() + 120
            while dag_run.state == DagRunState.RUNNING:
                assert time.monotonic() < deadline, "re-run did not finish"
                session.expire_all()
                schedulable, _ = dag_run.update_state(session=session)
                for ti in schedulable:
                    if ti.state != TaskInstanceState.UP_FOR_RESCHEDULE:
                        ti.try_number += 1
                    ti.state = TaskInstanceState.SCHEDULED
                session.commit()
                scheduled = [ti for ti in dag_run.get_task_instances(session=session)
                             if ti.state == TaskInstanceState.SCHEDULED]
                if not scheduled:
                    time.sleep(0.2)
                for ti in scheduled:
                    _run_task(ti=ti, task=dag.task_dict[ti.task_id], run_triggerer=True)
        return dag_run

    return rerun


class RecordingStats:
    """A Stats backend that keeps every metric call, to assert on what was emitted."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any, dict[str, Any]]] = []

    def _keep(self, kind: str, stat: str, value: Any, tags: Any) -> None:
        self.calls.append((kind, stat, value, dict(tags or {})))

    def incr(self, stat: str, count: int = 1, rate: float = 1, *, tags: Any = None) -> None:
        self._keep("incr", stat, count, tags)

    def decr(self, stat: str, count: int = 1, rate: float = 1, *, tags: Any = None) -> None:
        self._keep("decr", stat, count, tags)

    def gauge(self, stat: str, value: Any, rate: float = 1, delta: bool = False, *,
              tags: Any = None) -> None:
        self._keep("gauge", stat, value, tags)

    def timing(self, stat: str, dt: Any, *, tags: Any = None) -> None:
        self._keep("timing", stat, dt, tags)

    def timer(self, *args: Any, **kwargs: Any) -> Any:
        from airflow.sdk._shared.observability.metrics.base_stats_logger import NoStatsLogger

        return NoStatsLogger().timer(*args, **kwargs)

    def of(self, stat: str) -> list[tuple[str, str, Any, dict[str, Any]]]:
        """Calls for one metric name."""
        return [c for c in self.calls if c[1] == stat]


@pytest.fixture
def stats(airflow_home: Path) -> Iterator[RecordingStats]:
    """Route Airflow's ``Stats`` to a recorder for the duration of a test."""
    from airflow.sdk._shared.observability.metrics import stats as stats_module
    from airflow.sdk._shared.observability.metrics.base_stats_logger import NoStatsLogger

    recorder = RecordingStats()
    stats_module.initialize(factory=lambda: recorder,  # type: ignore[arg-type,return-value]
                            export_legacy_names=False)
    try:
        yield recorder
    finally:
        stats_module.initialize(factory=NoStatsLogger, export_legacy_names=False)
