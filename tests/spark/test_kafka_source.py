"""The Kafka source against a real broker (Tansu on loopback, tests/kafka_broker.py).

Each epoch runs through :func:`run_stage` on the shared local Spark session, reads its
pinned offset ranges on the executors and stages them into a file sink; the tests assert
the published records (topic, partition, offset) and the offsets recorded in the log.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from airflow_seatunnel_ckpt.core import CheckpointConfig, CheckpointStore, Decision, Pipeline
from airflow_seatunnel_ckpt.core.ops.replay import ReplayError
from airflow_seatunnel_ckpt.spark import StageResult, StageSpec, run_stage
from airflow_seatunnel_ckpt.spark.replay import replay_stage
from airflow_seatunnel_ckpt.spark.sources.files import SourceError
from airflow_seatunnel_ckpt.spark.sources.kafka import KafkaSource
from tests.conftest import FAST_JVM_OPTIONS
from tests.kafka_broker import KafkaBroker
from tests.spark import kafka_stages
from tests.spark.conftest import RunStage
from tests.spark.kafka_stages import InjectedFailure

pytestmark = pytest.mark.spark


def new_topic(broker: KafkaBroker, partitions: int = 4, prefix: str = "events") -> str:
    topic = f"{prefix}-{uuid.uuid4().hex[:8]}"
    broker.create_topic(topic, partitions)
    return topic


def produce(broker: KafkaBroker, topic: str, per_partition: dict[int, int], first: int = 0) -> None:
    """``per_partition[p]`` records into partition p, values ``v<n>`` numbered from ``first``."""
    records, n = [], first
    for partition, count in per_partition.items():
        for _ in range(count):
            records.append((partition, b"k%d" % n, b"v%d" % n))
            n += 1
    broker.produce(topic, records)


class KafkaPipeline:
    """A pipeline reading one Kafka source into a file sink, under ``root``."""

    def __init__(self, root: Path, broker: KafkaBroker, **source: Any) -> None:
        self.root, self.broker = root, broker
        self.source = {"type": "kafka", "bootstrap_servers": broker.bootstrap_servers, **source}
        self.runs = 0

    @property
    def store(self) -> dict[str, Any]:
        return {"storage_url": f"file://{self.root / 'store'}", "full_checkpoint_interval": 3}

    @property
    def pipeline(self) -> Pipeline:
        return CheckpointStore(CheckpointConfig.from_mapping(self.store)).pipeline("events")

    def spec(self, run_id: str, attempt: int = 1, stage: str = "tests.spark.kafka_stages:copy_events") -> StageSpec:
        return StageSpec(pipeline="events", participant="ingest", run_id=run_id, attempt=attempt, stage=stage,
                         sources={"events": self.source},
                         sinks={"out": {"type": "file", "path": f"file://{self.root / 'out'}"}},
                         store=self.store, key_groups=4)

    def epoch(self, spark: Any, run_id: str | None = None, attempt: int = 1,
              stage: str = "tests.spark.kafka_stages:copy_events") -> StageResult:
        """Run one epoch's stage and commit it (``spark``: a session, or the ``run`` fixture's runner)."""
        if run_id is None:
            self.runs += 1
            run_id = f"run-{self.runs}"
        spec = self.spec(run_id, attempt, stage)
        result = spark(spec) if callable(spark) else run_stage(spec, spark)
        pipeline = self.pipeline
        assert pipeline.decide(result.epoch, Decision.COMMIT, "test", "test").decision is Decision.COMMIT
        pipeline.commit(result.epoch)
        return result

    def published(self, epoch: int | None = None) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        pattern = f"epoch={epoch}/*.parquet" if epoch is not None else "epoch=*/*.parquet"
        for f in sorted((self.root / "out").glob(pattern)):
            rows += pq.read_table(f).to_pylist()
        return rows

    def positions(self, epoch: int | None = None) -> list[tuple[str, int, int]]:
        return sorted((r["topic"], r["partition"], r["offset"]) for r in self.published(epoch))


@pytest.mark.connect_slice("the Kafka source: its partitions read by the server's Python workers")
def test_epochs_read_each_record_once_and_resume_at_the_committed_position(
        run: RunStage, tmp_path: Path, kafka_broker: KafkaBroker) -> None:
    topic = new_topic(kafka_broker)
    kafka = KafkaPipeline(tmp_path, kafka_broker, topics=[topic])
    produce(kafka_broker, topic, {0: 30, 1: 20, 2: 0, 3: 10})
    first = kafka.epoch(run)
    assert first.sources["events"]["end"] == {topic: {"0": 30, "1": 20, "2": 0, "3": 10}}
    rows = kafka.published(first.epoch)
    assert len(rows) == 60
    row = next(r for r in rows if r["partition"] == 1 and r["offset"] == 0)
    assert row["key"] == b"k30" and row["value"] == b"v30" and row["topic"] == topic
    assert row["timestamp"] is not None and row["timestampType"] == 0
    produce(kafka_broker, topic, {2: 5, 3: 5}, first=60)
    second = kafka.epoch(run)
    assert second.sources["events"]["start"][topic] == {"0": 30, "1": 20, "2": 0, "3": 10}
    assert kafka.positions(second.epoch) == sorted([(topic, 2, o) for o in range(5)] +
                                                   [(topic, 3, o) for o in range(10, 15)])
    empty = kafka.epoch(run)  # nothing new: an empty epoch, and the position stays
    assert kafka.published(empty.epoch) == []
    assert empty.sources["events"]["end"] == second.sources["events"]["end"]
    everything = kafka.positions()
    assert len(everything) == len(set(everything)) == 70


def test_max_offsets_per_epoch_is_spread_over_the_partitions_that_have_records(
        spark: Any, tmp_path: Path, kafka_broker: KafkaBroker) -> None:
    topic = new_topic(kafka_broker)
    kafka = KafkaPipeline(tmp_path, kafka_broker, topics=[topic], max_offsets_per_epoch=60)
    produce(kafka_broker, topic, {0: 100, 1: 10, 3: 50})
    first = kafka.epoch(spark)
    # 60 over three partitions: 1 holds only 10, its unused share goes to 0 and 3.
    assert first.sources["events"]["end"] == {topic: {"0": 25, "1": 10, "2": 0, "3": 25}}
    assert len(kafka.published(first.epoch)) == 60
    while sum(int(o) for o in kafka.epoch(spark).sources["events"]["end"][topic].values()) < 160:
        pass
    everything = kafka.positions()
    assert len(set(everything)) == len(everything) == 160


def test_a_retry_reads_the_pinned_ranges_not_the_records_produced_since(
        spark: Any, tmp_path: Path, kafka_broker: KafkaBroker) -> None:
    topic = new_topic(kafka_broker, partitions=2)
    kafka = KafkaPipeline(tmp_path, kafka_broker, topics=[topic])
    produce(kafka_broker, topic, {0: 10, 1: 10})
    with pytest.raises(InjectedFailure):
        run_stage(kafka.spec("retried", 1, "tests.spark.kafka_stages:copy_events_then_fail"), spark)
    produce(kafka_broker, topic, {0: 7, 1: 7}, first=20)
    retried = kafka.epoch(spark, run_id="retried", attempt=2)
    assert retried.sources["events"]["end"] == {topic: {"0": 10, "1": 10}}
    assert kafka.positions(retried.epoch) == [(topic, p, o) for p in (0, 1) for o in range(10)]
    later = kafka.epoch(spark)
    assert kafka.positions(later.epoch) == [(topic, p, o) for p in (0, 1) for o in range(10, 17)]


def test_a_new_topic_matching_the_pattern_is_read_from_its_earliest_offset(
        spark: Any, tmp_path: Path, kafka_broker: KafkaBroker) -> None:
    prefix = f"orders-{uuid.uuid4().hex[:6]}"
    old = new_topic(kafka_broker, partitions=2, prefix=prefix)
    produce(kafka_broker, old, {0: 5, 1: 5})
    # latest: the first epoch starts after what is already there...
    kafka = KafkaPipeline(tmp_path, kafka_broker, pattern=f"{prefix}-.*", starting_offsets="latest")
    first = kafka.epoch(spark)
    assert kafka.published(first.epoch) == []
    produce(kafka_broker, old, {1: 3}, first=10)
    new = new_topic(kafka_broker, partitions=3, prefix=prefix)
    produce(kafka_broker, new, {0: 2, 2: 4})
    second = kafka.epoch(spark)
    # ...while the partitions found later are read from their earliest offset.
    assert kafka.positions(second.epoch) == sorted([(old, 1, o) for o in range(5, 8)] +
                                                   [(new, 0, 0), (new, 0, 1)] + [(new, 2, o) for o in range(4)])


def test_a_deleted_topic_fails_the_epoch_naming_its_partitions_and_a_recreated_one_is_skipped_on_request(
        spark: Any, tmp_path: Path, kafka_broker: KafkaBroker) -> None:
    topic = new_topic(kafka_broker, partitions=2)
    kafka = KafkaPipeline(tmp_path, kafka_broker, topics=[topic])
    produce(kafka_broker, topic, {0: 4, 1: 6})
    kafka.epoch(spark)
    kafka_broker.delete_topic(topic)
    with pytest.raises(SourceError) as refused:
        run_stage(kafka.spec("run-gone"), spark)
    message = str(refused.value)
    assert f"{topic}-0 (from offset 4: deleted, or not visible to this client now)" in message
    assert f"{topic}-1 (from offset 6: deleted, or not visible to this client now)" in message
    assert "fail_on_data_loss=false" in message and "epoch 2" in message
    epoch = kafka.pipeline.epoch_for_run("run-gone")
    assert epoch == 2 and kafka.pipeline.txlog.read_prepared(epoch, "ingest") is None
    # The way out the message names: skip, record what was lost, go on.
    kafka_broker.create_topic(topic, 2)
    produce(kafka_broker, topic, {0: 3})
    kafka.source["fail_on_data_loss"] = False
    skipped = kafka.epoch(spark, run_id="run-gone", attempt=2)
    lost = skipped.sources["events"]["lost"]
    assert [(x["topic"], x["partition"], x["from"]) for x in lost] == [(topic, 0, 4), (topic, 1, 6)]
    assert all(x["reason"].startswith("topic deleted and created again (id ") for x in lost)
    assert kafka.positions(skipped.epoch) == [(topic, 0, o) for o in range(3)]


def test_a_topic_deleted_after_the_plan_fails_the_read_before_prepare(
        spark: Any, tmp_path: Path, kafka_broker: KafkaBroker) -> None:
    topic = new_topic(kafka_broker, partitions=1)
    kafka = KafkaPipeline(tmp_path, kafka_broker, topics=[topic])
    produce(kafka_broker, topic, {0: 5})
    with pytest.raises(InjectedFailure):  # the plan [0, 5) is pinned, nothing read
        run_stage(kafka.spec("run-1", 1, "tests.spark.kafka_stages:fail_before_reading"), spark)
    kafka_broker.delete_topic(topic)
    kafka_broker.create_topic(topic, 1)
    produce(kafka_broker, topic, {0: 9})
    with pytest.raises(SourceError, match=rf"{topic}-0 \(offsets 0 to 5: topic deleted and created again since "
                                          r"the epoch was planned.*fail_on_data_loss=false"):
        run_stage(kafka.spec("run-1", 2), spark)
    assert kafka.pipeline.txlog.read_prepared(1, "ingest") is None


def test_a_topic_created_again_between_the_drivers_check_and_the_fetch_fails_where_it_is_read(
        spark: Any, tmp_path: Path, kafka_broker: KafkaBroker) -> None:
    topic = new_topic(kafka_broker, partitions=1)
    kafka = KafkaPipeline(tmp_path, kafka_broker, topics=[topic])
    produce(kafka_broker, topic, {0: 5})

    def recreate() -> None:  # after the driver checked [0, 5) against the topic id, before the fetch
        kafka_broker.delete_topic(topic)
        kafka_broker.create_topic(topic, 1)
        produce(kafka_broker, topic, {0: 9}, first=100)

    kafka_stages.BETWEEN_READ_AND_FETCH[:] = [recreate]
    try:
        with pytest.raises(Exception) as refused:
            run_stage(kafka.spec("run-1", 1, "tests.spark.kafka_stages:copy_events_changing_the_topic"), spark)
    finally:
        kafka_stages.BETWEEN_READ_AND_FETCH.clear()
    assert re.search(rf"{topic}-0 \(offsets 0 to 5: topic deleted and created again while the epoch read it "
                     rf"\(id \S+ -> \S+, seen before the fetch\)\)", str(refused.value)), str(refused.value)[:3000]
    assert kafka.pipeline.txlog.read_prepared(1, "ingest") is None and kafka.published() == []


def test_a_topic_missing_from_one_metadata_answer_resumes_at_its_position_not_its_beginning(
        spark: Any, tmp_path: Path, kafka_broker: KafkaBroker, monkeypatch: pytest.MonkeyPatch) -> None:
    topic = new_topic(kafka_broker, partitions=2)
    kafka = KafkaPipeline(tmp_path, kafka_broker, topics=[topic], fail_on_data_loss=False)
    produce(kafka_broker, topic, {0: 3, 1: 2})
    kafka.epoch(spark)
    produce(kafka_broker, topic, {0: 2, 1: 1}, first=5)
    answer = KafkaSource.broker_state

    def hiccup(source: KafkaSource, names: list[str] | None = None) -> dict[str, Any]:
        """The broker's answer without the topic, as during a brief ACL or broker hiccup."""
        return {t: s for t, s in answer(source, names).items() if t != topic}

    monkeypatch.setattr(KafkaSource, "broker_state", hiccup)
    missed = kafka.epoch(spark)
    monkeypatch.setattr(KafkaSource, "broker_state", answer)
    assert missed.sources["events"]["end"] == {topic: {"0": 3, "1": 2}} and missed.sources["events"]["lost"] == []
    back = kafka.epoch(spark)  # listed again, with the same id: it resumes where it stopped
    assert kafka.positions(back.epoch) == [(topic, 0, 3), (topic, 0, 4), (topic, 1, 2)]
    everything = kafka.positions()
    assert len(everything) == len(set(everything)) == 8


def test_a_cap_below_the_partitions_with_records_serves_each_partition_in_turn(
        spark: Any, tmp_path: Path, kafka_broker: KafkaBroker) -> None:
    topic = new_topic(kafka_broker, partitions=3)
    kafka = KafkaPipeline(tmp_path, kafka_broker, topics=[topic], max_offsets_per_epoch=1)
    produce(kafka_broker, topic, {1: 2, 2: 2})
    served = []
    for n in range(3):  # partition 0 trickles one record before each epoch
        produce(kafka_broker, topic, {0: 1}, first=100 + n)
        served += [p for _, p, _ in kafka.positions(kafka.epoch(spark).epoch)]
    assert sorted(served) == [0, 1, 2]


def test_latest_after_an_aborted_first_epoch_reads_what_was_produced_since_that_plan(
        spark: Any, tmp_path: Path, kafka_broker: KafkaBroker) -> None:
    topic = new_topic(kafka_broker, partitions=1)
    produce(kafka_broker, topic, {0: 5})
    kafka = KafkaPipeline(tmp_path, kafka_broker, topics=[topic], starting_offsets="latest")
    with pytest.raises(InjectedFailure):  # the first plan pins the pipeline's start: offset 5
        run_stage(kafka.spec("run-1", 1, "tests.spark.kafka_stages:fail_before_reading"), spark)
    kafka.pipeline.abort(1, "the stage died and its sensor timed out", by="test")
    produce(kafka_broker, topic, {0: 3}, first=5)
    second = kafka.epoch(spark, run_id="run-2")
    assert second.epoch == 2 and kafka.positions(second.epoch) == [(topic, 0, o) for o in range(5, 8)]


def test_a_replay_whose_records_are_gone_refuses_before_writing_whatever_fail_on_data_loss_says(
        spark: Any, tmp_path: Path, kafka_broker: KafkaBroker) -> None:
    topic = new_topic(kafka_broker, partitions=1)
    kafka = KafkaPipeline(tmp_path, kafka_broker, topics=[topic], fail_on_data_loss=False)
    produce(kafka_broker, topic, {0: 4})
    kafka.epoch(spark)
    produce(kafka_broker, topic, {0: 3}, first=4)
    kafka.epoch(spark)
    kafka_broker.delete_topic(topic)  # the records both epochs read are gone
    kafka_broker.create_topic(topic, 1)
    produce(kafka_broker, topic, {0: 2}, first=50)
    with pytest.raises(ReplayError) as refused:
        replay_stage(kafka.spec("replay"), 1, 2, reason="fix a bug", by="test", spark=spark)
    message = str(refused.value)
    assert "epoch 1's input is not all there any more" in message
    assert f"{topic}-0 (offsets 0 to 4: topic deleted and created again" in message
    assert "Replay from a later epoch" in message
    assert kafka.pipeline.txlog.epochs() == [1, 2]  # no replay epoch begun
    assert kafka.positions() == [(topic, 0, o) for o in range(7)]


def test_an_in_process_session_runs_its_python_workers_with_the_packages_interpreter(
        tmp_path: Path, kafka_broker: KafkaBroker) -> None:
    topic = new_topic(kafka_broker, partitions=1)
    produce(kafka_broker, topic, {0: 3})
    kafka = KafkaPipeline(tmp_path, kafka_broker, topics=[topic])
    spec = kafka.spec("run-1")
    spec = spec.replace(master="local[1]", spark_conf={
        "spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "1",
        "spark.driver.extraJavaOptions": FAST_JVM_OPTIONS})
    (tmp_path / "spec.json").write_text(json.dumps(spec.to_dict()))
    elsewhere = tmp_path / "bin"  # `python3` on PATH is not the package's interpreter
    elsewhere.mkdir()
    (elsewhere / "python3").write_text("#!/bin/sh\necho 'python3 on PATH is not the package interpreter' >&2\n"
                                       "exit 1\n")
    (elsewhere / "python3").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")}
    env["PATH"] = os.pathsep.join([str(elsewhere), "/usr/bin", "/bin"])
    env["PYTHONPATH"] = str(Path(__file__).parents[2])
    script = ("import json, sys; from airflow_seatunnel_ckpt.spark import StageSpec, run_stage; "
              "spec = StageSpec.from_dict(json.loads(open(sys.argv[1]).read())); "
              "print(json.dumps(run_stage(spec).sources))")
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "spec.json")], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["events"]["end"] == {topic: {"0": 3}}
    assert kafka.pipeline.txlog.read_prepared(1, "ingest") is not None


def test_options_are_checked_when_the_source_is_built() -> None:
    from airflow_seatunnel_ckpt.core.errors import ConfigError

    with pytest.raises(ConfigError, match="exactly one of 'topics'.*or 'pattern'"):
        KafkaSource("events", bootstrap_servers="b:9092", topics=["a"], pattern="a.*")
    with pytest.raises(ConfigError, match="option 'max_offsets_per_epoch': input should be greater than or equal to 1"):
        KafkaSource("events", bootstrap_servers="b:9092", topics=["a"], max_offsets_per_epoch=0)
    with pytest.raises(ConfigError, match="no broker: give bootstrap_servers, or kafka_conn_id"):
        KafkaSource("events", topics=["a"])
    unresolved = KafkaSource("events", topics=["a"], kafka_conn_id="kafka_default")
    with pytest.raises(ConfigError, match="kafka_conn_id 'kafka_default' was not resolved"):
        unresolved.client_config()
