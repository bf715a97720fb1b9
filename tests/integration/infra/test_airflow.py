"""The Airflow test environment: a migrated SQLite database and in-process ``dag.test()``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.airflow


def test_airflow_uses_the_session_home_and_sqlite(airflow_home: Path) -> None:
    from airflow.configuration import conf

    assert os.environ["AIRFLOW_HOME"] == str(airflow_home)
    assert conf.get("database", "sql_alchemy_conn").startswith(f"sqlite:///{airflow_home}")
    assert not conf.getboolean("core", "load_examples")
    assert (airflow_home / "airflow.db").is_file()


def test_dag_test_runs_a_task_in_process(run_dag: Any, tmp_path: Path) -> None:
    from airflow.sdk import dag, task

    marker = tmp_path / "ran.txt"

    @dag(dag_id="infra_smoke", schedule=None, catchup=False)
    def infra_smoke() -> None:
        @task
        def write_marker() -> int:
            marker.write_text("ok")
            return 42

        write_marker()

    dag_run = run_dag(infra_smoke())

    assert dag_run.state == "success"
    assert marker.read_text() == "ok"
    (ti,) = dag_run.get_task_instances()
    assert ti.task_id == "write_marker"
    assert ti.state == "success"
