"""Stage tasks through Spark Connect: the example pipeline switched to a ``spark_connect``
connection, and a task killed while its Connect operations run.

Real Airflow on SQLite (``dag.test``), the test session's Connect server on 127.0.0.1
(tests/connect_server.py): the stage's driver logic runs in the task's process, its Spark
work on the server.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

from airflow_seatunnel_ckpt.core import EpochState
from tests.epoch_test_dags import task_states
from tests.operators.test_orders_pipeline import Example, at

pytestmark = [pytest.mark.airflow, pytest.mark.spark, pytest.mark.slow]

#: The Airflow connection the tests point the example's stage at.
CONNECT_CONN_ID = "spark_connect_local"


def connect_connection(monkeypatch: pytest.MonkeyPatch, server_url: str) -> None:
    """A ``spark_connect`` connection to the test server, from the environment (as a deployment would define it)."""
    address = urlparse(server_url)
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONNECT_CONN_ID.upper()}", json.dumps(
        {"conn_type": "spark_connect", "host": address.hostname, "port": address.port}))


def test_the_example_pipeline_runs_through_spark_connect_by_switching_its_connection(
        connect_server: str, run_at: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    connect_connection(monkeypatch, connect_server)
    example = Example(tmp_path / "data", monkeypatch)
    example.dag.get_task("orders.ingest").conn_id = CONNECT_CONN_ID  # the only change to the example

    runs = [run_at(example.dag, at(hour)) for hour in range(2)]

    for run in runs:
        assert run.state == "success", task_states(run)
    assert [s.state for s in example.pipeline.list_epochs()] == [EpochState.COMMITTED] * 2
    example.assert_exactly_once()
    # Each epoch's attempt ran on its own server session, released when the stage ended.
    for epoch in (1, 2):
        assert session_closed_on_the_server(attempt_of(example, connect_server, epoch))


def attempt_of(example: Example, server_url: str, epoch: int, attempt: int = 1) -> Any:
    """The Connect attempt the stage task of ``epoch`` ran (its server session and tag)."""
    from airflow_seatunnel_ckpt.hooks.stage_runtime import ConnectAttempt

    store = example.dag.get_task("orders.ingest").hook.config.to_mapping()["storage_url"]
    return ConnectAttempt.of(f"{server_url}/", store, "orders", epoch, "ingest", attempt)


def session_closed_on_the_server(attempt: Any) -> bool:
    """Whether the server knows ``attempt``'s session and has released it (a client of it is refused)."""
    from pyspark.sql.connect.client import SparkConnectClient

    client = SparkConnectClient(attempt.url)
    try:
        client.interrupt_tag(attempt.tag)
    except Exception as exc:
        return "SESSION_CLOSED" in str(exc)
    finally:
        client.close()
    return False
