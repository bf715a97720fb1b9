"""The cost of deciding every csv/json record on all its columns, whatever a query uses.

Spark's csv/json parsers convert only the columns a query uses and flag a record as
corrupt for those only, so a stage that never uses a bad column keeps the record while
the quarantine (which reads every column) holds it too. This bench reads ``--lines`` JSON
lines (5 columns, one in 5,000 with an unparseable timestamp) in a query that uses one
column (a count per user), and times, best of ``--repeat``:

* **unguarded** -- the filter on the corrupt-record column alone (the old read: its count
  includes the bad records);
* **guarded** -- ``FileSource.read_checked`` as it is: the filter also refers to every
  column, so the parser converts them all (lazy, nothing materialised);
* **localCheckpoint**, **cache** -- the parsed input materialised, then filtered;
* **to_json** -- the filter refers to every column through ``to_json`` of them all.

Printed: seconds, the ratio to unguarded, and the number of rows the query counted.

    python bench/bench_permissive_read.py [--lines 400000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

DDL = "order_id long, user string, ts timestamp, amount double, note string"


def write_input(root: Path, lines: int) -> None:
    """``lines`` JSON lines in 4 files; every 5,000th has a timestamp that does not parse."""
    per_file = lines // 4
    for k in range(4):
        with open(root / f"part-{k}.json", "w") as out:
            for i in range(per_file):
                ts = "yesterday" if i % 5000 == 0 else "2026-01-01 00:00:00"
                out.write(json.dumps({"order_id": i, "user": f"u{i % 1000}", "ts": ts, "amount": i * 1.5,
                                      "note": "x" * 40}) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=400_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    from airflow_seatunnel_ckpt.spark.sources.files import CORRUPT_COLUMN, FileSource

    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false").config("spark.sql.shuffle.partitions", "4")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    root = Path(tempfile.mkdtemp(prefix="bench-permissive-"))
    write_input(root, args.lines)
    files = sorted(p.name for p in root.glob("*.json"))
    source = FileSource("orders", f"file://{root}", format="json", schema=DDL, bad_records="file:///unused")
    columns = [f.name for f in StructType.fromDDL(DDL).fields]
    schema = StructType([*StructType.fromDDL(DDL).fields, StructField(CORRUPT_COLUMN, StringType(), True)])

    def parsed() -> Any:
        return (spark.read.format("json").schema(schema).option("mode", "PERMISSIVE")
                .option("columnNameOfCorruptRecord", CORRUPT_COLUMN).load(str(root)))

    def counted(good: Any) -> int:
        return sum(row["count"] for row in good.groupBy("user").count().collect())

    def materialised(how: str) -> int:
        data = parsed().localCheckpoint(eager=True) if how == "checkpoint" else parsed().cache()
        if how == "cache":
            data.count()
        try:
            return counted(data.where(F.col(CORRUPT_COLUMN).isNull()))
        finally:
            data.unpersist()

    sides: dict[str, Callable[[], int]] = {
        "unguarded": lambda: counted(parsed().where(F.col(CORRUPT_COLUMN).isNull())),
        "guarded": lambda: counted(source.read_checked(spark, {"files": files})[0]),
        "localCheckpoint": lambda: materialised("checkpoint"),
        "cache": lambda: materialised("cache"),
        "to_json": lambda: counted(parsed().where(F.col(CORRUPT_COLUMN).isNull()
                                                  & F.to_json(F.struct(*columns)).isNotNull())),
    }
    sides["unguarded"]()  # warm the JVM
    results = {}
    for name, run in sides.items():
        best, rows = float("inf"), 0
        for _ in range(args.repeat):
            start = time.perf_counter()
            rows = run()
            best = min(best, time.perf_counter() - start)
        results[name] = (best, rows)
    base = results["unguarded"][0]
    print(f"{args.lines} lines, {args.lines // 5000} with a bad timestamp; best of {args.repeat}")
    print(f"{'side':16s} {'s':>7s} {'ratio':>7s} {'rows counted':>13s}")
    for name, (seconds, rows) in results.items():
        print(f"{name:16s} {seconds:7.2f} {seconds / base:7.2f} {rows:13d}")
    spark.stop()


if __name__ == "__main__":
    main()
