"""A Kafka epoch vs a plain Spark batch read of the same offsets.

One topic of ``--partitions`` partitions holds ``--records`` small records (a 16-byte key,
a 64-byte value) on a Tansu broker started here on loopback (the test harness's,
``tests/kafka_broker.py``). Same session for both variants:

* ``plain`` -- the same per-partition reader (``kafka_reader.read_ranges``: a Python data
  source, one input partition per partition, confluent-kafka on the executors) over the
  topic's whole offset range, written as Parquet with ``df.write.parquet``: no plan, no
  log, no checkpoint. Spark's own Kafka source would be the natural baseline, but it needs
  the ``spark-sql-kafka`` jar, which is not available here (and which the Kafka source
  does not require);
* ``ours`` -- :func:`airflow_seatunnel_ckpt.spark.run_stage` of a fresh pipeline whose
  ``kafka`` source plans the same offsets (asking the broker), pins them in the log, checks
  them against the broker, reads them and stages them into a file sink; then the commit
  decision and the publish: the whole epoch.

Each round runs both (order alternating); the best time of each over the rounds is
reported with the ratio, and the median beside it.

The broker reports wrong end offsets after multi-record batches (tests/kafka_broker.py);
the records are produced in large batches for speed and then one single-record batch per
partition, after which the end offsets are exact again (checked before the runs).

Usage::

    python bench/bench_kafka.py [--records 1000000] [--partitions 4] [--rounds 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

STAGE = "bench_kafka:copy_records"


def copy_records(ctx: Any, spark: Any) -> None:
    """The stage a user would write: the epoch's records as they are into the sink."""
    ctx.sink("out").write(ctx.source("events").read())


def produce(broker: Any, topic: str, records: int, partitions: int) -> int:
    """``records`` records in large batches, then one single-record batch per partition; the total."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 50,
                         "batch.num.messages": 10_000, "queue.buffering.max.messages": 500_000,
                         "compression.type": "none"})
    value = b"v" * 64
    for n in range(records):
        while True:
            try:
                producer.produce(topic, key=b"%016d" % n, value=value, partition=n % partitions)
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(120) == 0
    exact = broker.producer()
    for p in range(partitions):
        exact.produce(topic, key=b"last", value=value, partition=p)
    assert exact.flush(60) == 0
    total = records + partitions
    ends = sum(broker.watermarks(topic, p)[1] for p in range(partitions))
    assert ends == total, f"end offsets sum to {ends}, {total} records were produced"
    return total


def session(work: Path) -> Any:
    from pyspark.sql import SparkSession

    # Every Python worker (the data source's planner too) runs this interpreter.
    os.environ["PYSPARK_PYTHON"] = os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable

    return (SparkSession.builder.master("local[2]").appName("bench-kafka")
            .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.driver.memory", "2g").config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false").config("spark.sql.shuffle.partitions", "4")
            .config("spark.sql.session.timeZone", "UTC").config("spark.local.dir", str(work / "spark"))
            .config("spark.pyspark.python", sys.executable).getOrCreate())


def run_plain(spark: Any, broker: Any, topic: str, partitions: int, ends: dict[int, int], out: Path) -> float:
    from airflow_seatunnel_ckpt.core.sources.kafka import Range
    from airflow_seatunnel_ckpt.spark.sources.kafka_reader import read_ranges

    started = time.perf_counter()
    ranges = [Range(topic, p, 0, ends[p]) for p in range(partitions)]
    config = {"bootstrap.servers": broker.bootstrap_servers, "group.id": "bench-plain"}
    read_ranges(spark, ranges, config).write.parquet(str(out))
    return time.perf_counter() - started


def run_ours(spark: Any, broker: Any, topic: str, work: Path) -> tuple[float, int]:
    from airflow_seatunnel_ckpt.core import CheckpointConfig, CheckpointStore, Decision
    from airflow_seatunnel_ckpt.spark import StageSpec, run_stage

    store = {"storage_url": f"file://{work / 'store'}"}
    spec = StageSpec(pipeline="events", participant="ingest", run_id="bench", attempt=1, stage=STAGE,
                     sources={"events": {"type": "kafka", "bootstrap_servers": broker.bootstrap_servers,
                                         "topics": [topic]}},
                     sinks={"out": {"type": "file", "path": f"file://{work / 'out'}"}}, store=store, key_groups=4)
    started = time.perf_counter()
    result = run_stage(spec, spark)
    pipeline = CheckpointStore(CheckpointConfig.from_mapping(store)).pipeline("events")
    pipeline.decide(result.epoch, Decision.COMMIT, "bench", by="bench")
    pipeline.commit(result.epoch)
    return time.perf_counter() - started, result.rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))

    from tests.kafka_broker import start_broker

    work = Path(tempfile.mkdtemp(prefix="bench-kafka-"))
    broker = start_broker(work)
    try:
        topic = "bench"
        broker.create_topic(topic, args.partitions)
        t0 = time.perf_counter()
        total = produce(broker, topic, args.records, args.partitions)
        print(f"produced {total} records in {time.perf_counter() - t0:.1f}s", flush=True)
        ends = {p: broker.watermarks(topic, p)[1] for p in range(args.partitions)}
        spark = session(work)
        times: dict[str, list[float]] = {"plain": [], "ours": []}
        for number in range(args.rounds):
            order = ["plain", "ours"] if number % 2 == 0 else ["ours", "plain"]
            for variant in order:
                run_dir = work / f"{variant}-{number}"
                if variant == "plain":
                    seconds = run_plain(spark, broker, topic, args.partitions, ends, run_dir / "out")
                    rows = spark.read.parquet(str(run_dir / "out")).count()
                else:
                    seconds, rows = run_ours(spark, broker, topic, run_dir)
                assert rows == total, f"{variant} read {rows} rows of {total}"
                times[variant].append(seconds)
                print(f"round {number + 1} {variant}: {seconds:.2f}s ({rows} rows)", flush=True)
                shutil.rmtree(run_dir, ignore_errors=True)
        best = {v: min(t) for v, t in times.items()}
        median = {v: statistics.median(t) for v, t in times.items()}
        report = {"records": total, "partitions": args.partitions, "rounds": args.rounds, "best": best,
                  "median": median, "ratio_best": best["ours"] / best["plain"],
                  "ratio_median": median["ours"] / median["plain"], "times": times}
        print(json.dumps(report, indent=2))
        if args.json:
            args.json.write_text(json.dumps(report, indent=2))
        spark.stop()
    finally:
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
