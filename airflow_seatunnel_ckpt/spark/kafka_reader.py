"""Reading pinned Kafka offset ranges on the executors: a Spark Python data source over confluent-kafka.

``spark.read.format("seatunnel_kafka_ranges")`` with one input partition per
topic-partition range; each is read by a consumer assigned to that partition from the
range's start until its end, yielding Arrow batches with Spark's Kafka source columns. The
Kafka source (:mod:`.kafka_source`) checks the ranges and calls :func:`read_ranges`; the
module imports PySpark, so it is imported only when a stage reads.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from airflow_seatunnel_ckpt.core.state import kafka_offsets
from airflow_seatunnel_ckpt.core.state.kafka_offsets import KafkaOffsetsError, Range
from airflow_seatunnel_ckpt.spark.session import freeze_worker_heap

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: The Python data source's format name.
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
#: The reader never commits offsets: the checkpoint is the position.
OWN_OPTIONS = {"enable.auto.commit": False, "enable.partition.eof": False}


def read_ranges(spark: SparkSession, ranges: list[Range], config: Mapping[str, Any], where: str = "kafka source",
                fail_on_data_loss: bool = True) -> DataFrame:
    """The records of ``ranges`` as a DataFrame (Spark's Kafka columns), read on the executors.

    No checkpoint protocol: the plain per-partition reader (the benchmark's baseline uses it
    as it is). Client settings travel as ``kafka.<setting>`` options, which Spark does not
    print in the scan's plan.
    """
    spark.dataSource.register(KafkaRangesDataSource)
    reader = spark.read.format(FORMAT).option("ranges", json.dumps([
        [r.topic, r.partition, r.start, r.end] for r in ranges])).option("where", where)
    reader = reader.option("fail_on_data_loss", str(fail_on_data_loss).lower())
    for key, value in config.items():
        reader = reader.option(f"kafka.{key}", str(value).lower() if isinstance(value, bool) else str(value))
    return reader.load()


class RangePartition(InputPartition):
    """One topic-partition range of the epoch: offsets ``[start, end)``."""

    def __init__(self, topic: str, partition: int, start: int, end: int) -> None:
        super().__init__((topic, partition, start, end))
        self.topic, self.partition, self.start, self.end = topic, partition, start, end


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
        self.ranges = [RangePartition(str(t), int(p), int(s), int(e)) for t, p, s, e in json.loads(options["ranges"])]
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
    """The records of one range, ``[r.start, r.end)``, as Arrow record batches."""
    import pyarrow as pa
    from confluent_kafka import Consumer, TopicPartition

    schema = pa.schema([("key", pa.binary()), ("value", pa.binary()), ("topic", pa.string()),
                        ("partition", pa.int32()), ("offset", pa.int64()),
                        ("timestamp", pa.timestamp("us", tz="UTC")), ("timestampType", pa.int32())])
    label = f"{r.topic}-{r.partition}"
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
                    raise KafkaOffsetsError(f"{where}: reading {label} offsets {r.start} to {r.end}: {m.error()}")
                offset = m.offset()
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
                    f"{where}: reading {label} offsets {r.start} to {r.end}: no record after offset {last} for "
                    f"{STALL_S:.0f}s (the broker may be unavailable); the epoch's retry reads the same range")
    finally:
        consumer.close()
