"""Reading pinned Kafka offset ranges on the executors: a Spark Python data source (``seatunnel_kafka_ranges``) over
confluent-kafka, one input partition per range; the topic id is checked before and after the fetch and every offset
against the range."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from airflow_seatunnel_ckpt.core.sources import kafka as kafka_offsets
from airflow_seatunnel_ckpt.core.sources.kafka import KafkaOffsetsError, Range
from airflow_seatunnel_ckpt.spark.session import freeze_worker_heap

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

FORMAT = "seatunnel_kafka_ranges"
#: Spark's Kafka source schema (headers left out).
SCHEMA = ("key binary, value binary, topic string, partition int, offset long, timestamp timestamp, "
          "timestampType int")
#: Records fetched per consume call (and at most per Arrow batch).
BATCH = 10_000
#: Seconds without progress after which a read of a pinned range fails (a transient failure:
#: the epoch's retry reads the same range).
STALL_S = 60.0
#: Seconds the watermark request of a range may take.
ADMIN_TIMEOUT_S = 30.0
#: The reader never commits offsets (the checkpoint is the position), and a fetch outside the
#: partition's offsets is an error, never a silent jump to the earliest or latest record.
OWN_OPTIONS = {"enable.auto.commit": False, "enable.partition.eof": False, "auto.offset.reset": "error"}
#: Consumer settings an admin client does not take.
CONSUMER_ONLY = ("group.id", "enable.auto.commit", "enable.partition.eof", "auto.offset.reset",
                 "isolation.level")


def read_ranges(spark: SparkSession, ranges: list[Range], config: Mapping[str, Any], where: str = "kafka source",
                fail_on_data_loss: bool = True, topic_ids: Mapping[str, str] | None = None) -> DataFrame:
    """The records of ``ranges`` as a DataFrame (Spark's Kafka columns), read on the executors; a topic whose id is not
    its ``topic_ids`` entry is refused. Client settings travel as ``kafka.<setting>`` options (not printed in the plan).
    """
    ids = topic_ids or {}
    spark.dataSource.register(KafkaRangesDataSource)
    reader = spark.read.format(FORMAT).option("ranges", json.dumps([
        [r.topic, r.partition, r.start, r.end, ids.get(r.topic)] for r in ranges])).option("where", where)
    reader = reader.option("fail_on_data_loss", str(fail_on_data_loss).lower())
    for key, value in config.items():
        reader = reader.option(f"kafka.{key}", str(value).lower() if isinstance(value, bool) else str(value))
    return reader.load()


class RangePartition(InputPartition):
    """One topic-partition range of the epoch: offsets ``[start, end)`` of the topic with ``topic_id``."""

    def __init__(self, topic: str, partition: int, start: int, end: int, topic_id: str | None = None) -> None:
        super().__init__((topic, partition, start, end, topic_id))
        self.topic, self.partition, self.start, self.end = topic, partition, start, end
        self.topic_id = topic_id

    @property
    def label(self) -> str:
        """``topic-partition``, as Kafka tools print it."""
        return f"{self.topic}-{self.partition}"


class KafkaRangesDataSource(DataSource):
    """``spark.read.format("seatunnel_kafka_ranges")``: pinned offset ranges, read with confluent-kafka."""

    @classmethod
    def name(cls) -> str:
        """The format name to read with."""
        return FORMAT

    def schema(self) -> str:
        """Spark's Kafka source columns."""
        return SCHEMA

    def reader(self, schema: Any) -> KafkaRangesReader:
        """The reader of one scan."""
        return KafkaRangesReader(dict(self.options))


class KafkaRangesReader(DataSourceReader):
    """Reads each range on an executor: assign the partition at ``start``, consume until ``end``."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.ranges = [RangePartition(str(t), int(p), int(s), int(e), str(i) if i is not None else None)
                       for t, p, s, e, i in json.loads(options["ranges"])]
        self.where = options.get("where") or "kafka source"
        self.fail_on_data_loss = (options.get("fail_on_data_loss") or "true") == "true"
        self.config = {k[len("kafka."):]: v for k, v in options.items() if k.startswith("kafka.")}

    def partitions(self) -> list[InputPartition]:
        """One input partition per range."""
        return list(self.ranges)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        """The range's records as Arrow batches (runs on an executor)."""
        assert isinstance(partition, RangePartition)
        freeze_worker_heap()
        yield from read_range(self.config, partition, self.where, self.fail_on_data_loss)


def read_range(config: Mapping[str, Any], r: RangePartition, where: str, fail_on_data_loss: bool) -> Iterator[Any]:
    """The records of one range, ``[r.start, r.end)``, as Arrow record batches.

    :raises KafkaOffsetsError: the topic is not the pinned one, an offset is outside the range or out of order, or the
        pinned start is gone (with ``fail_on_data_loss``; otherwise the range is cut or skipped, and logged).
    """
    import pyarrow as pa
    from confluent_kafka import Consumer, TopicPartition

    schema = pa.schema([("key", pa.binary()), ("value", pa.binary()), ("topic", pa.string()),
                        ("partition", pa.int32()), ("offset", pa.int64()),
                        ("timestamp", pa.timestamp("us", tz="UTC")), ("timestampType", pa.int32())])
    label = f"{r.label} (pinned offsets {r.start} to {r.end}, topic id {r.topic_id})"
    changed = _changed_topic(config, r, where, "before the fetch")
    if changed:
        if fail_on_data_loss:
            raise KafkaOffsetsError(str(kafka_offsets.data_loss_error(where, changed)))
        log.warning("%s: skipping records lost before the epoch read them: %s", where,
                    kafka_offsets.describe_lost(changed))
        return
    consumer = Consumer({**config, **OWN_OPTIONS})
    try:
        low, _ = consumer.get_watermark_offsets(TopicPartition(r.topic, r.partition), timeout=ADMIN_TIMEOUT_S,
                                                cached=False)
        start = r.start
        if low > start:  # truncated since the driver checked
            lost = [{"topic": r.topic, "partition": r.partition, "from": start, "to": min(low, r.end),
                     "reason": f"truncated while the epoch read it, the earliest offset is now {low}"}]
            if fail_on_data_loss:
                raise KafkaOffsetsError(str(kafka_offsets.data_loss_error(where, lost)))
            log.warning("%s: skipping records lost while the epoch read them: %s", where,
                        kafka_offsets.describe_lost(lost))
            start = low
            if start >= r.end:
                return
        consumer.assign([TopicPartition(r.topic, r.partition, start)])
        last = start - 1
        stalled = time.monotonic()
        while last < r.end - 1:
            messages = consumer.consume(min(BATCH, r.end - 1 - last), 1.0)
            keys, values, offsets, stamps, types = [], [], [], [], []
            for m in messages:
                if m.error() is not None:
                    raise KafkaOffsetsError(f"{where}: reading {label}: the broker answered {m.error()} after "
                                            f"offset {last}; the epoch fails before its commit decision and its "
                                            "retry reads the same range")
                offset = m.offset()
                if offset is None or offset <= last:
                    raise KafkaOffsetsError(
                        f"{where}: reading {label}: the broker returned offset {offset} after offset {last}, expected "
                        f"offsets from {last + 1} up to {r.end} in order; the partition is not the one the epoch "
                        "pinned. The epoch fails before its commit decision")
                if offset >= r.end:
                    last = offset
                    break
                keys.append(m.key())
                values.append(m.value())
                offsets.append(offset)
                kind, stamp = m.timestamp()
                stamps.append(stamp * 1000 if stamp >= 0 else None)
                types.append(kind - 1 if kind > 0 else -1)
                last = offset
            if offsets:
                stalled = time.monotonic()
                n = len(offsets)
                yield pa.RecordBatch.from_arrays(
                    [pa.array(keys, pa.binary()), pa.array(values, pa.binary()),
                     pa.array([r.topic] * n, pa.string()), pa.array([r.partition] * n, pa.int32()),
                     pa.array(offsets, pa.int64()), pa.array(stamps, pa.timestamp("us", tz="UTC")),
                     pa.array(types, pa.int32())], schema=schema)
                continue
            # Nothing returned: past control records (transactions) the position moves without records.
            position = consumer.position([TopicPartition(r.topic, r.partition)])[0].offset
            if position >= r.end:
                break
            if time.monotonic() - stalled > STALL_S:
                raise KafkaOffsetsError(
                    f"{where}: reading {label}: no record after offset {last} for {STALL_S:.0f}s (the broker may "
                    "be unavailable); the epoch's retry reads the same range")
    finally:
        consumer.close()
    # Topic ids are never reused: the pinned id before and after the fetch means every record
    # in between came from the pinned topic. Records already handed to Spark go with the
    # failed task; the epoch fails before its commit decision.
    changed = _changed_topic(config, r, where, "after the fetch")
    if changed:
        raise KafkaOffsetsError(str(kafka_offsets.data_loss_error(where, changed)))


def _changed_topic(config: Mapping[str, Any], r: RangePartition, where: str, when: str) -> list[dict[str, Any]]:
    """``r`` as lost (one entry) if its topic now has another id than the pinned one, else nothing.

    :raises KafkaOffsetsError: the broker does not describe the topic (not skippable: the retry may see it again).
    """
    if r.topic_id is None:
        return []
    from confluent_kafka import KafkaException, TopicCollection
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({k: v for k, v in config.items() if k not in CONSUMER_ONLY})
    try:
        found = admin.describe_topics(TopicCollection([r.topic]), request_timeout=ADMIN_TIMEOUT_S)[r.topic]
        topic_id = found.result(ADMIN_TIMEOUT_S).topic_id
    except KafkaException as exc:
        raise KafkaOffsetsError(
            f"{where}: {r.label} (pinned offsets {r.start} to {r.end}, topic id {r.topic_id}): the broker does not "
            f"describe the topic {when} ({exc}): it was deleted, or this client cannot see it at the moment. The "
            "epoch fails before its commit decision and its retry reads the same range") from exc
    found_id = str(topic_id) if topic_id is not None else None
    if found_id is None or found_id == r.topic_id:
        return []
    return [{"topic": r.topic, "partition": r.partition, "from": r.start, "to": r.end,
             "reason": f"topic deleted and created again while the epoch read it (id {r.topic_id} -> {found_id}, "
                       f"seen {when})"}]
