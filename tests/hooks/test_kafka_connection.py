"""The Kafka source's ``kafka_conn_id`` through real Airflow: a DAG whose stage reads the test
broker named only by an Airflow connection (from the environment), committed by the epoch's
tasks, with the connection's settings kept out of the checkpoint store."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from airflow_seatunnel_ckpt.core import CheckpointStore, EpochState, codec
from airflow_seatunnel_ckpt.core.errors import ConfigError
from airflow_seatunnel_ckpt.hooks.kafka import with_kafka_connections
from airflow_seatunnel_ckpt.task_group import checkpointed_epoch
from tests.epoch_test_dags import START, logical_date, task_states
from tests.kafka_broker import KafkaBroker

pytestmark = [pytest.mark.airflow, pytest.mark.spark]

#: A client setting only the connection holds: it must never reach the store.
MARKER = "client-from-the-connection-0f3a"


def connection(monkeypatch: pytest.MonkeyPatch, conn_id: str, extra: dict[str, Any]) -> None:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"conn_type": "kafka", "extra": extra}))


def test_kafka_conn_id_is_read_into_the_client_settings_and_options_win(monkeypatch: pytest.MonkeyPatch) -> None:
    connection(monkeypatch, "kafka_test", {"bootstrap.servers": "b1:9092", "client.id": "conn", "acks": "all"})
    sources = {"events": {"type": "kafka", "kafka_conn_id": "kafka_test", "topics": ["t"],
                          "config": {"client.id": "mine"}},
               "files": {"type": "file", "path": "file:///in", "kafka_conn_id": "not-mine"}}
    resolved = with_kafka_connections(sources)
    assert resolved["events"] == {"type": "kafka", "topics": ["t"],
                                  "config": {"bootstrap.servers": "b1:9092", "client.id": "mine", "acks": "all"}}
    assert resolved["files"] == sources["files"]  # other types are left alone
    assert "kafka_conn_id" in sources["events"]  # the operator's own options are not changed
    connection(monkeypatch, "kafka_empty", {"client.id": "x"})
    with pytest.raises(ConfigError, match="connection 'kafka_empty' has no 'bootstrap.servers' in its extras"):
        with_kafka_connections({"events": {"type": "kafka", "kafka_conn_id": "kafka_empty", "topics": ["t"]}})
    with pytest.raises(ConfigError, match="kafka_conn_id 'kafka_missing' is not an Airflow connection here"):
        with_kafka_connections({"events": {"type": "kafka", "kafka_conn_id": "kafka_missing", "topics": ["t"]}})


def test_a_dag_reads_kafka_through_a_connection_and_commits_each_record_once(
        spark: Any, run_dag: Any, tmp_path: Path, kafka_broker: KafkaBroker,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.sdk import DAG

    topic = f"dag-{uuid.uuid4().hex[:8]}"
    kafka_broker.create_topic(topic, 2)
    connection(monkeypatch, "kafka_lake", {"bootstrap.servers": kafka_broker.bootstrap_servers, "client.id": MARKER})
    store, out = tmp_path / "store", tmp_path / "out"
    with DAG(f"kafka_{uuid.uuid4().hex[:6]}", schedule=None, start_date=START, catchup=False,
             default_args={"retry_delay": timedelta(seconds=0)}) as dag:
        checkpointed_epoch(
            "events", pipeline="events", storage_url=f"file://{store}",
            stages={"ingest": {"stage": "tests.spark.kafka_stages:copy_events",
                               "sources": {"events": {"type": "kafka", "kafka_conn_id": "kafka_lake",
                                                      "topics": [topic]}},
                               "sinks": {"out": {"type": "file", "path": f"file://{out}"}}}},
            sensor={"poke_interval": 0.2, "timeout": 120}, emit_assets=False)
    kafka_broker.produce(topic, ((n % 2, None, b"r%d" % n) for n in range(40)))
    first = run_dag(dag, logical_date=logical_date(0), run_after=logical_date(0))
    kafka_broker.produce(topic, ((n % 2, None, b"r%d" % n) for n in range(40, 50)))
    second = run_dag(dag, logical_date=logical_date(1), run_after=logical_date(1))

    for run in (first, second):
        assert run.state == "success", task_states(run)
    pipeline = CheckpointStore.from_url(f"file://{store}").pipeline("events")
    assert [pipeline.state(e) for e in pipeline.epochs()] == [EpochState.COMMITTED] * 2
    values = sorted(v for f in out.glob("epoch=*/*.parquet") for v in pq.read_table(f).column("value").to_pylist())
    assert values == sorted(b"r%d" % n for n in range(50))
    stored = {p: readable(p) for p in store.rglob("*") if p.is_file()}
    assert stored and not [p for p, data in stored.items() if MARKER.encode() in data]
    assert not [p for p, data in stored.items() if kafka_broker.bootstrap_servers.encode() in data]
    assert any(b"kafka_lake" in data for data in stored.values())  # the connection's name is recorded


def readable(path: Path) -> bytes:
    """A stored file's bytes, its framed payload decompressed where it is a framed document."""
    data = path.read_bytes()
    try:
        return bytes(codec.decode(data, str(path))[1]) + data
    except Exception:
        return data
