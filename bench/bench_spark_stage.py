"""Checkpointed incremental de-duplication vs plain Spark vs Structured Streaming.

Same input, same transformation, same session and settings for all three variants, run
over two epochs (the first half of the files, then the rest):

* ``plain`` -- ``spark.read.parquet(files).dropDuplicates([key]).write.parquet(...)``:
  the cost of the transformation with no state, no exactly-once, no checkpoint;
* ``streaming`` -- Structured Streaming: ``readStream`` over the input directory,
  ``dropDuplicates`` with state, a parquet ``writeStream`` sink,
  ``trigger(availableNow=True)`` and a ``checkpointLocation``;
* ``ours`` -- :func:`airflow_seatunnel_ckpt.spark.run_stage` with a key set
  (state on executors, one checkpoint part per key group, attempt staging, prepared
  record), then the commit decision and publish: the whole epoch.

All variants share one session: ``local[2]``, ``spark.sql.shuffle.partitions`` = the key
groups of ``ours``, Spark's default Arrow batch size, and adaptive partition coalescing
off -- on two cores it folds ``plain``'s shuffle partitions into a single task and makes
the baseline slower, so off is the baseline's best setting (``--coalesce`` turns it on).

With ``--connect`` (a Spark Connect server started from the installed pyspark on 127.0.0.1,
``local[2]``, the same settings) or ``--remote sc://host:port`` the session is a Spark
Connect one: ``plain`` is the same job sent through Connect, ``ours`` the same epoch
through Connect (the stage's driver logic in this process, its Spark work on the server),
so ``ours / plain`` is the epoch's overhead on a Connect runtime.

Each round runs every variant (order alternating between rounds); the best time of each
epoch over the rounds is reported (other processes on a small machine only ever add
time), with the median of the two-epoch totals beside it. Ratios are against the
baselines measured in the same run.

Usage::

    python bench/bench_spark_stage.py [--rows 2000000] [--files 20] [--rounds 3]
        [--key-groups 8] [--data-dir DIR] [--work-dir DIR] [--json out.json]
        [--connect | --remote sc://host:port] [--variants plain,ours]
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

KEY = "order_id"
STAGE = "bench_spark_stage:dedup_orders"


# -- the stage a user would write ------------------------------------------------------------


def dedup_orders(ctx: Any, spark: Any) -> None:
    """Read new order files, drop orders seen in any committed epoch, stage the rest."""
    new = ctx.source("orders").read()
    fresh = ctx.key_set("seen_orders").dedup(new, key=KEY)
    ctx.sink("orders_table").write(fresh)


# -- data -------------------------------------------------------------------------------------


def generate(
    out_dir: Path, rows: int, files: int, dup_frac: float = 0.07, seed: int = 7
) -> list[Path]:
    """Order-like parquet files; ``dup_frac`` of each file repeats order ids, half from the
    same file, half from any earlier file (so the second epoch has cross-epoch repeats)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    marker = out_dir / f"_generated-{rows}-{files}-{dup_frac}-{seed}"
    paths = [out_dir / f"orders-{i:03d}.parquet" for i in range(files)]
    if marker.exists() and all(p.exists() for p in paths):
        return paths
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    per = rows // files
    issued: list[Any] = []
    next_id = 0
    for path in paths:
        n_dup = int(per * dup_frac)
        n_new = per - n_dup
        ids_new = np.arange(next_id, next_id + n_new, dtype=np.int64) * 7919 % 10**12 + 10**9
        next_id += n_new
        pool = np.concatenate([*issued, ids_new])
        ids = np.concatenate(
            [ids_new, rng.choice(ids_new, n_dup // 2), rng.choice(pool, n_dup - n_dup // 2)]
        )
        rng.shuffle(ids)
        issued.append(ids_new)
        table = pa.table(
            {
                KEY: ids,
                "customer": pa.array(
                    np.char.add("c", (ids % 50_000).astype(str)).tolist(), pa.string()
                ),
                "amount": np.round(rng.random(per) * 1000, 2),
                "ts": pa.array((1_700_000_000_000_000 + ids % 10**9).astype("datetime64[us]")),
            }
        )
        pq.write_table(table, path)
    marker.write_text("ok")
    return paths


def dir_bytes(path: Path) -> int:
    """Total size of the files below ``path``."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


# -- variants ---------------------------------------------------------------------------------


class Variant:
    """One way of running the two epochs; ``epoch`` returns checkpoint bytes added."""

    name = ""

    def __init__(self, spark: Any, work: Path, args: argparse.Namespace) -> None:
        self.spark = spark
        self.work = work / self.name
        self.args = args
        shutil.rmtree(self.work, ignore_errors=True)
        (self.work / "in").mkdir(parents=True)

    def add_input(self, files: list[Path]) -> None:
        """Make the epoch's files appear in the input directory (hard links: no copy cost)."""
        for f in files:
            os.link(f, self.work / "in" / f.name)

    def epoch(self, n: int, files: list[Path]) -> int:
        raise NotImplementedError

    def output_rows(self) -> int:
        raise NotImplementedError


class Plain(Variant):
    name = "plain"

    def epoch(self, n: int, files: list[Path]) -> int:
        paths = [f"file://{self.work / 'in' / f.name}" for f in files]
        (
            self.spark.read.parquet(*paths)
            .dropDuplicates([KEY])
            .write.mode("overwrite")
            .parquet(f"file://{self.work / 'out' / f'epoch={n}'}")
        )
        return 0

    def output_rows(self) -> int:
        return int(self.spark.read.parquet(f"file://{self.work / 'out'}").count())


class Streaming(Variant):
    name = "streaming"

    def epoch(self, n: int, files: list[Path]) -> int:
        before = dir_bytes(self.work / "chk")
        schema = self.spark.read.parquet(f"file://{self.work / 'in' / files[0].name}").schema
        query = (
            self.spark.readStream.schema(schema)
            .parquet(f"file://{self.work / 'in'}")
            .dropDuplicates([KEY])
            .writeStream.format("parquet")
            .option("path", f"file://{self.work / 'out'}")
            .option("checkpointLocation", f"file://{self.work / 'chk'}")
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        return dir_bytes(self.work / "chk") - before

    def output_rows(self) -> int:
        return int(self.spark.read.parquet(f"file://{self.work / 'out'}").count())


class Ours(Variant):
    name = "ours"

    def epoch(self, n: int, files: list[Path]) -> int:
        from airflow_seatunnel_ckpt.core import CheckpointConfig, CheckpointStore, Decision
        from airflow_seatunnel_ckpt.spark import StageSpec, run_stage

        store = {"storage_url": f"file://{self.work / 'store'}"}
        spec = StageSpec(
            pipeline="orders",
            participant="dedup",
            run_id=f"bench-{n}",
            attempt=1,
            stage=STAGE,
            sources={
                "orders": {
                    "type": "file",
                    "path": f"file://{self.work / 'in'}",
                    "format": "parquet",
                }
            },
            sinks={"orders_table": {"type": "file", "path": f"file://{self.work / 'out'}"}},
            store=store,
            key_groups=self.args.key_groups,
        )
        result = run_stage(spec, self.spark)
        pipeline = CheckpointStore(CheckpointConfig.from_mapping(store)).pipeline("orders")
        pipeline.decide(result.epoch, Decision.COMMIT, "bench", "bench")
        pipeline.commit(result.epoch)
        # Everything the epoch added to the store besides output: checkpoint dir + txlog.
        return dir_bytes(self.work / "store" / "orders" / f"checkpoint_{result.epoch}") + dir_bytes(
            self.work / "store" / "orders" / "_txlog" / f"epoch-{result.epoch:012d}"
        )

    def output_rows(self) -> int:
        return int(self.spark.read.parquet(f"file://{self.work / 'out'}").count())


VARIANTS: dict[str, Callable[..., Variant]] = {"plain": Plain, "streaming": Streaming, "ours": Ours}


# -- main ---------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--files", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--key-groups",
        type=int,
        default=8,
        help="key groups of ours = spark.sql.shuffle.partitions of all variants",
    )
    parser.add_argument(
        "--arrow-batch",
        type=int,
        default=10_000,
        help="spark.sql.execution.arrow.maxRecordsPerBatch (Spark's default)",
    )
    parser.add_argument(
        "--coalesce",
        action="store_true",
        help="leave spark.sql.adaptive.coalescePartitions on (Spark's default)",
    )
    parser.add_argument("--variants", default="plain,streaming,ours")
    parser.add_argument(
        "--data-dir", type=Path, default=Path(tempfile.gettempdir()) / "bench-spark-stage-data"
    )
    parser.add_argument("--work-dir", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None, help="also write the figures as JSON")
    parser.add_argument("--remote", default=None, help="run through the Spark Connect server at this sc:// URL")
    parser.add_argument("--connect", action="store_true",
                        help="start a Spark Connect server (local[2], 127.0.0.1) and run through it")
    args = parser.parse_args(argv)
    if args.connect or args.remote:
        return through_connect(args)

    sys.path.insert(
        0, str(Path(__file__).resolve().parent)
    )  # the stage's module, for executors too
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(Path(__file__).resolve().parent), os.environ.get("PYTHONPATH")])
    )
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    t0 = time.perf_counter()
    files = generate(args.data_dir, args.rows, args.files)
    print(
        f"data: {args.rows} rows in {len(files)} files at {args.data_dir} "
        f"({time.perf_counter() - t0:.1f}s)"
    )
    half = len(files) // 2
    epochs = [files[:half], files[half:]]

    builder = SparkSession.builder.master("local[2]").appName("bench-spark-stage")
    for key, value in session_settings(args).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return measure(spark, files, epochs, args)


def session_settings(args: argparse.Namespace) -> dict[str, str]:
    """The settings every variant's session shares (a Connect server's at its start)."""
    return {
        "spark.ui.enabled": "false",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.memory": "4g",
        "spark.sql.shuffle.partitions": str(args.key_groups),
        "spark.sql.execution.arrow.maxRecordsPerBatch": str(args.arrow_batch),
        "spark.sql.adaptive.coalescePartitions.enabled": str(args.coalesce).lower(),
    }


def through_connect(args: argparse.Namespace) -> int:
    """The same measurement on a Spark Connect session (``--connect`` starts the server)."""
    from airflow_seatunnel_ckpt.spark import StageSpec
    from airflow_seatunnel_ckpt.spark.session import remote_session

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    files = generate(args.data_dir, args.rows, args.files)
    half = len(files) // 2
    server = None
    if args.connect:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
        from tests.connect_server import start_server

        conf = {k: v for k, v in session_settings(args).items() if k != "spark.driver.memory"}
        server = start_server(python_path=str(Path(__file__).resolve().parent.parent), conf=conf)
        print(f"Spark Connect server at {server.url} (local[2])")
    remote = args.remote or server.url  # type: ignore[union-attr]
    spec = StageSpec(pipeline="bench", participant="bench", run_id="bench", attempt=1, stage=STAGE, remote=remote,
                     spark_conf={k: v for k, v in session_settings(args).items() if k.startswith("spark.sql.")})
    try:
        with remote_session(spec) as spark:
            return measure(spark, files, [files[:half], files[half:]], args)
    finally:
        if server is not None:
            server.stop()


def measure(spark: Any, files: list[Path], epochs: list[list[Path]], args: argparse.Namespace) -> int:
    """Warm up, then run every variant's two epochs ``--rounds`` times; print and return the figures."""
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="bench-spark-stage-"))
    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    # Warm-up: JIT, Python workers, parquet readers; not measured.
    warm = Ours(spark, work / "warmup", args)
    warm.add_input(files[:1])
    warm.epoch(1, files[:1])
    spark.read.parquet(f"file://{files[0]}").dropDuplicates([KEY]).write.format("noop").mode(
        "overwrite"
    ).save()

    times: dict[str, list[list[float]]] = {n: [[], []] for n in names}
    ckpt: dict[str, list[int]] = {}
    rows: dict[str, int] = {}
    for r in range(args.rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            variant = VARIANTS[name](spark, work, args)
            sizes = []
            for i, epoch_files in enumerate(epochs):
                variant.add_input(epoch_files)
                t = time.perf_counter()
                sizes.append(variant.epoch(i + 1, epoch_files))
                times[name][i].append(time.perf_counter() - t)
            ckpt[name] = sizes
            rows[name] = variant.output_rows()
            print(
                f"round {r + 1} {name:9s} epoch1 {times[name][0][-1]:6.2f}s "
                f"epoch2 {times[name][1][-1]:6.2f}s "
                f"rows {rows[name]}",
                flush=True,
            )
            shutil.rmtree(variant.work, ignore_errors=True)
    if not (args.connect or args.remote):
        spark.stop()

    best = {n: [min(t) for t in times[n]] for n in names}
    print()
    print(
        f"{'variant':10s} {'epoch1':>8s} {'epoch2':>8s} {'total':>8s} {'median':>8s} "
        f"{'ckpt e1':>10s} {'ckpt e2':>10s} {'rows':>9s}"
    )
    for n in names:
        med = statistics.median(a + b for a, b in zip(times[n][0], times[n][1], strict=True))
        print(
            f"{n:10s} {best[n][0]:8.2f} {best[n][1]:8.2f} {sum(best[n]):8.2f} {med:8.2f} "
            f"{ckpt[n][0]:10d} {ckpt[n][1]:10d} {rows[n]:9d}"
        )
    figures: dict[str, Any] = {
        "rows": args.rows,
        "files": args.files,
        "rounds": args.rounds,
        "connect": bool(args.connect or args.remote),
        "key_groups": args.key_groups,
        "coalesce": args.coalesce,
        "best_seconds": best,
        "checkpoint_bytes": ckpt,
        "output_rows": rows,
        "all_seconds": times,
    }
    if "ours" in names:
        print()
        for base in ("plain", "streaming"):
            if base in names:
                per_epoch = [best["ours"][i] / best[base][i] for i in range(2)]
                total = sum(best["ours"]) / sum(best[base])
                figures[f"ours_vs_{base}"] = total
                print(
                    f"ours / {base:9s}: {total:.3f} "
                    f"(epoch1 {per_epoch[0]:.3f}, epoch2 {per_epoch[1]:.3f})"
                )
        if "streaming" in names and rows.get("streaming") != rows["ours"]:
            print(f"WARNING: ours published {rows['ours']} rows, streaming {rows['streaming']}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))
    if args.work_dir is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
