"""Commit time of one Iceberg sink epoch: 10 vs 1,000 staged files, vs a plain pyiceberg append.

For each file count ``n`` (the same rows in all, split into ``n`` Parquet files of one
partition value each, staged in a local checkpoint store) it times, on a table that
already holds one epoch:

* ``ours``: ``commit_sink`` of the epoch (marker read, schema check, placement = one
  rename per partition directory, footers read for the data file statistics, one
  ``add_files`` transaction with the duplicate-file check, marker property);
* ``append``: a plain ``table.append`` of the same rows as one Arrow table into a second
  table of the same catalog (pyiceberg writes the Parquet itself: data bytes included);

and checks that the commit rewrote no data: every data file of the table is a staged file,
byte for byte the size the manifest names. Prints medians over ``--rounds`` and ratios.

    python bench/bench_iceberg_commit.py [--rows 200000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import logging
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.catalog import load_catalog

from airflow_seatunnel_ckpt.core import CheckpointConfig, CheckpointStore
from airflow_seatunnel_ckpt.core.sinks import SinkCommit, commit_sink

PARTITIONS = 10


def rows(n: int, offset: int) -> pa.Table:
    ids = pa.array(range(offset, offset + n), pa.int64())
    return pa.table({"order_id": ids, "region": pa.array([f"r{i % PARTITIONS}" for i in range(n)]),
                     "amount": pa.array([float(i) for i in range(n)])})


def one_round(root: Path, files: int, total_rows: int) -> tuple[float, float, int]:
    catalog = {"type": "sql", "uri": f"sqlite:///{root}/catalog.db", "warehouse": f"file://{root}/warehouse"}
    store = CheckpointStore(CheckpointConfig.from_mapping({"storage_url": f"file://{root}/store"}))
    pipeline = store.pipeline("bench")
    options = {"type": "iceberg", "table": "bench.orders", "catalog_name": "bench", "catalog": catalog,
               "partition_by": ["region"]}
    timings = []
    for epoch in (1, 2):  # epoch 1 creates the table; epoch 2 is timed
        data = rows(total_rows, epoch * total_rows)
        staging = pipeline.staging_path(epoch, 1, "orders")
        per_file = max(1, total_rows // files)
        for i in range(files):
            region = f"r{i % PARTITIONS}"
            part = data.filter(pa.compute.equal(data["region"], region)).slice((i // PARTITIONS) * per_file, per_file)
            buf = io.BytesIO()
            pq.write_table(part, buf)
            pipeline.storage.write_atomic(f"{staging}/__partition_region={region}/part-{i:05d}.parquet",
                                          buf.getvalue())
        manifest = pipeline.manifest_for_staged(epoch, 1, "orders", "iceberg://bench/bench.orders", total_rows)
        manifest = dataclasses.replace(manifest, table=options)
        started = time.perf_counter()
        commit_sink(SinkCommit("bench", f"file://{root}", epoch, manifest, pipeline.storage, 3))
        timings.append(time.perf_counter() - started)
    lake = load_catalog("bench", **catalog)
    table = lake.load_table("bench.orders")
    found = table.inspect.files().to_pylist()
    sizes = {f["file_path"].rsplit("/", 1)[-1]: f["file_size_in_bytes"] for f in found
             if "/bench-e2-orders/" in f["file_path"]}
    staged = {f.path.rsplit("/", 1)[-1]: f.size for f in manifest.files}
    assert sizes == staged, "the epoch's data files are not exactly the staged files"
    plain = lake.create_table("bench.plain", schema=rows(1, 0).schema)
    plain.append(rows(total_rows, 0))  # warm-up epoch, like ours
    data = rows(total_rows, total_rows)
    started = time.perf_counter()
    plain.append(data)
    append = time.perf_counter() - started
    return timings[1], append, len(found)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    results: dict[int, tuple[float, float, int]] = {}
    for files in (10, 1000):
        ours, plain, count = [], [], 0
        for _ in range(args.rounds):
            root = Path(tempfile.mkdtemp(prefix="seatunnel-ckpt-iceberg-bench-"))
            try:
                o, p, count = one_round(root, files, args.rows)
            finally:
                shutil.rmtree(root, ignore_errors=True)
            ours.append(o)
            plain.append(p)
        results[files] = (statistics.median(ours), statistics.median(plain), count)
    print(f"{'figure':40} {'ratio':>8}  detail")
    for files, (ours, plain, count) in results.items():
        print(f"{f'commit {files} files vs plain append':40} {ours / plain:8.3f}  ours {ours * 1000:.0f} ms, "
              f"append of the same {args.rows:,} rows {plain * 1000:.0f} ms ({count} data files in the table)")
    (o10, _, _), (o1000, _, _) = results[10], results[1000]
    print(f"{'commit 1000/10 files':40} {o1000 / o10:8.3f}  10 files {o10 * 1000:.0f} ms, 1000 files "
          f"{o1000 * 1000:.0f} ms (metadata only: O(files), no data rewritten)")


if __name__ == "__main__":
    main()
