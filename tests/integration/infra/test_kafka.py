"""The test broker's answers the Kafka source depends on (see tests/kafka_broker.py).

End offsets after produces (wrong for multi-record batches on this Tansu build: the
harness sends one record per batch, and this test proves that both the defect and the
workaround are as described), a fetch of one partition from an offset, topic deletion and
re-creation (a new topic id), and DeleteRecords, which Tansu does not implement.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from tests.kafka_broker import KafkaBroker


def _topic(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _fetch(broker: KafkaBroker, topic: str, partition: int, start: int, count: int) -> list[Any]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": "infra",
                         "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, partition, start)])
        got: list[Any] = []
        for _ in range(50):
            got += [m for m in consumer.consume(count - len(got), 1.0) if m.error() is None]
            if len(got) >= count:
                break
        return got
    finally:
        consumer.close()


def _topic_id(broker: KafkaBroker, topic: str) -> str:
    from confluent_kafka import TopicCollection

    admin = broker.admin()
    return str(admin.describe_topics(TopicCollection([topic]))[topic].result(10).topic_id)


def test_one_record_batches_give_exact_end_offsets(kafka_broker: KafkaBroker) -> None:
    topic = _topic("wm")
    kafka_broker.create_topic(topic, 4)
    kafka_broker.produce(topic, ((i % 4, str(i).encode(), b"v") for i in range(1000)))
    assert [kafka_broker.watermarks(topic, p) for p in range(4)] == [(0, 250)] * 4
    kafka_broker.produce(topic, ((0, None, b"w") for _ in range(7)))
    assert kafka_broker.watermarks(topic, 0) == (0, 257)


def test_multi_record_batches_report_the_last_batch_base_offset_plus_one(kafka_broker: KafkaBroker) -> None:
    """The Tansu defect the harness works around: if this starts failing, the broker was fixed."""
    from confluent_kafka import Producer

    topic = _topic("batched")
    kafka_broker.create_topic(topic, 1)
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap_servers, "linger.ms": 200})
    for i in range(100):
        producer.produce(topic, value=b"%d" % i, partition=0)
    assert producer.flush(30) == 0
    low, high = kafka_broker.watermarks(topic, 0)
    assert high < 100  # Kafka would say 100
    assert len(_fetch(kafka_broker, topic, 0, 0, 100)) == 100  # the records are all there


def test_fetch_of_one_partition_from_an_offset(kafka_broker: KafkaBroker) -> None:
    topic = _topic("fetch")
    kafka_broker.create_topic(topic, 2)
    kafka_broker.produce(topic, ((i % 2, b"k%d" % i, b"v%d" % i) for i in range(40)))
    got = _fetch(kafka_broker, topic, 1, 5, 15)
    assert [m.offset() for m in got] == list(range(5, 20))
    assert [m.value() for m in got] == [b"v%d" % (2 * o + 1) for o in range(5, 20)]
    assert all(m.partition() == 1 and m.timestamp()[1] > 0 for m in got)


def test_deleted_topic_disappears_and_a_recreated_one_has_a_new_id(kafka_broker: KafkaBroker) -> None:
    topic = _topic("del")
    kafka_broker.create_topic(topic, 1)
    kafka_broker.produce(topic, ((0, None, b"v") for _ in range(10)))
    first = _topic_id(kafka_broker, topic)
    kafka_broker.delete_topic(topic)
    kafka_broker.create_topic(topic, 1)
    kafka_broker.produce(topic, ((0, None, b"v") for _ in range(3)))
    assert _topic_id(kafka_broker, topic) != first
    assert kafka_broker.watermarks(topic, 0) == (0, 3)


def test_delete_records_is_not_implemented_by_tansu() -> None:
    """DeleteRecords makes this Tansu build's broker thread panic, so it runs on a broker of its
    own; if this starts failing, truncation became testable on Tansu."""
    from confluent_kafka import KafkaException, TopicPartition

    from tests.kafka_broker import BrokerUnavailable, start_broker

    try:
        broker = start_broker()
    except BrokerUnavailable as exc:
        pytest.skip(f"the Kafka-compatible test broker cannot start here: {exc}")
    try:
        topic = _topic("trunc")
        broker.create_topic(topic, 1)
        broker.produce(topic, ((0, None, b"v") for _ in range(10)))
        admin = broker.admin()
        futures = admin.delete_records([TopicPartition(topic, 0, 5)], request_timeout=10)
        with pytest.raises(KafkaException):
            for future in futures.values():
                future.result(30)
        assert "not yet implemented" in broker.log_path.read_text()
    finally:
        broker.stop()
