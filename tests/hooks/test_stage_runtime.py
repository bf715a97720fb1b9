"""The choice of a stage's runtime (local, spark-submit, Spark Connect) and a Connect attempt's identity."""

from __future__ import annotations

import json

import pytest

from airflow_seatunnel_ckpt.core.errors import ConfigError
from airflow_seatunnel_ckpt.hooks.stage_runtime import ConnectAttempt, Runtime, RuntimeChoice, choose_runtime

pytestmark = pytest.mark.airflow

WHERE = "task orders.ingest"


def connection(monkeypatch: pytest.MonkeyPatch, conn_id: str, **fields: object) -> None:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(fields))


def test_no_connection_runs_in_process_on_local_spark() -> None:
    assert choose_runtime(None, None, WHERE) == RuntimeChoice(Runtime.LOCAL)
    assert choose_runtime(None, None, WHERE).in_process


def test_a_spark_connection_runs_through_spark_submit(monkeypatch: pytest.MonkeyPatch) -> None:
    connection(monkeypatch, "spark_yarn", conn_type="spark", host="yarn", extra={"deploy-mode": "cluster"})
    choice = choose_runtime("spark_yarn", None, WHERE)
    assert choice == RuntimeChoice(Runtime.SPARK_SUBMIT, conn_id="spark_yarn")
    assert not choice.in_process
    # An undefined connection is spark-submit's defaults, as the Spark provider's hook takes it.
    assert choose_runtime("spark_undefined", None, WHERE) == RuntimeChoice(Runtime.SPARK_SUBMIT,
                                                                           conn_id="spark_undefined")


def test_a_spark_connect_connection_runs_through_connect_with_its_url_and_token(
        monkeypatch: pytest.MonkeyPatch) -> None:
    connection(monkeypatch, "spark_connect_prod", conn_type="spark_connect", host="spark.example.com", port=15002,
               login="etl", password="s3cret-token", extra={"use_ssl": True})
    choice = choose_runtime("spark_connect_prod", None, WHERE)
    assert (choice.runtime, choice.conn_id) == (Runtime.CONNECT, "spark_connect_prod")
    assert choice.in_process
    assert choice.remote == "sc://spark.example.com:15002/;user_id=etl;token=s3cret-token;use_ssl=True"
    # The task log names the server, never the token.
    assert choice.describe() == ("through Spark Connect at sc://spark.example.com:15002 "
                                 "(connection spark_connect_prod)")


def test_spark_remote_runs_through_connect_and_is_refused_beside_a_connection_or_when_not_a_connect_url() -> None:
    assert choose_runtime(None, "sc://127.0.0.1:15002", WHERE) == RuntimeChoice(Runtime.CONNECT,
                                                                                 remote="sc://127.0.0.1:15002")
    with pytest.raises(ConfigError, match="give conn_id or spark_remote, not both"):
        choose_runtime("spark_default", "sc://127.0.0.1:15002", WHERE)
    with pytest.raises(ConfigError, match=r"task orders.ingest: spark_remote must be a Spark Connect URL"):
        choose_runtime(None, "spark://127.0.0.1:7077", WHERE)


def test_a_connect_attempt_is_one_server_session_and_tag_that_any_process_derives_alike() -> None:
    def attempt(n: int, store: str = "s3://bucket/ckpt") -> ConnectAttempt:
        return ConnectAttempt.of("sc://h:15002/;token=t", store, "orders", 7, "ingest", n)

    first = attempt(1)
    assert attempt(1) == first  # the task's on_kill, a later try on another worker: the same session and tag
    assert first.tag == "seatunnel-ckpt-orders-e7-ingest-a1" and "," not in first.tag
    assert len({first.session_id, attempt(2).session_id, attempt(1, "s3://other/ckpt").session_id}) == 3
    assert first.url == f"sc://h:15002/;token=t;session_id={first.session_id}"


@pytest.mark.timeout(300)
def test_a_connect_attempts_operations_are_interrupted_by_its_tag_from_another_client(connect_server: str) -> None:
    """What a later try (or the task's ``on_kill``) does to an attempt it holds no session of."""
    import threading
    import time

    from airflow_seatunnel_ckpt.spark.spec import StageSpec

    spec = StageSpec(pipeline="orders", participant="ingest", run_id="r1", attempt=1, stage="m:f",
                     remote=connect_server)
    attempt = ConnectAttempt.of(connect_server, "file:///ckpt", "orders", 1, "ingest", 1)
    failed: list[BaseException] = []
    sessions = []

    def run() -> None:  # tags are per thread: the attempt's operations run where its session was opened
        with attempt.session(spec) as session:
            sessions.append(session)
            try:
                session.range(0, 10**11, 1, 2).selectExpr("max(id)").collect()  # minutes unless interrupted
            except Exception as exc:
                failed.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    started = time.monotonic()
    worker.start()
    interrupted: list[str] = []
    while not interrupted and time.monotonic() - started < 120:
        time.sleep(0.5)
        if sessions:
            interrupted = attempt.interrupt()  # a client of its own, as from another process
    worker.join(timeout=60)
    assert interrupted and not worker.is_alive()
    assert len(failed) == 1 and "OPERATION_CANCELED" in str(failed[0]), failed
    assert sessions[0].is_stopped  # released when the attempt's block ended
