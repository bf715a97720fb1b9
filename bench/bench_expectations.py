"""The cost of a sink's expectations: one epoch with and without three rules.

The input of ``bench_spark_stage.py`` (2M order rows in 20 Parquet files, the same
generator) is read and staged by one stage into a file sink, in one epoch (stage,
decision, publish), with:

* ``none`` -- no expectations;
* ``rules`` -- three rules: ``warn`` (``customer LIKE 'c%'``, no row fails), ``drop``
  (``amount >= 1``, ~0.1% of the rows) and ``quarantine`` (``order_id % 1000 <> 7``,
  ~0.1%: the quarantine is staged and published too).

The stage is a plain copy (``--stage copy``, the strictest: no transformation to hide the
rules' cost behind) or ``bench_spark_stage``'s de-duplication with a key set
(``--stage dedup``). Variants alternate each round; the median and best wall time of each
are reported with the ratios against ``none`` measured in the same run, and the median of
each round's own ratio (its two epochs ran back to back, so a load that drifts over the run
moves both alike), and so is the
CPU time the epoch cost (driver, JVM and Python workers together, from ``psutil``): other
processes on a shared machine stretch the wall time but barely the CPU time, so that
ratio stays readable under load. The machine's load (``uptime``) before and after.

Usage::

    python bench/bench_expectations.py [--rows 2000000] [--files 20] [--rounds 3] [--stage copy|dedup]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

RULES = {
    "customer_named": {"expr": "customer LIKE 'c%'", "on_fail": "warn"},
    "amount_positive": {"expr": "amount >= 1", "on_fail": "drop"},
    "id_known": {"expr": "order_id % 1000 <> 7", "on_fail": "quarantine", "max_fraction": 0.05},
}
STAGES = {"copy": "bench_expectations:copy_orders", "dedup": "bench_spark_stage:dedup_orders"}


def copy_orders(ctx: Any, spark: Any) -> None:
    """Stage the epoch's new order files as they are."""
    ctx.sink("orders_table").write(ctx.source("orders").read())


def cpu_seconds() -> float:
    """CPU time used so far by this process and its descendants (the JVM, Python workers)."""
    import psutil

    me = psutil.Process()
    total = 0.0
    for process in [me, *me.children(recursive=True)]:
        try:
            t = process.cpu_times()
        except psutil.Error:
            continue  # ended meanwhile: counted in its parent's children_* once reaped
        total += t.user + t.system + t.children_user + t.children_system
    return total


def epoch(spark: Any, work: Path, files: list[Path], stage: str, rules: dict[str, Any] | None) -> tuple[float, float]:
    """One whole epoch (stage, decision, publish) over ``files``; wall and CPU seconds."""
    from airflow_seatunnel_ckpt.core import CheckpointConfig, CheckpointStore, Decision
    from airflow_seatunnel_ckpt.spark import StageSpec, run_stage

    shutil.rmtree(work, ignore_errors=True)
    (work / "in").mkdir(parents=True)
    for f in files:
        os.link(f, work / "in" / f.name)
    store = {"storage_url": f"file://{work / 'store'}"}
    sink: dict[str, Any] = {"type": "file", "path": f"file://{work / 'out'}"}
    if rules:
        sink["expectations"] = rules
    spec = StageSpec(pipeline="orders", participant="ingest", run_id="bench-1", attempt=1, stage=stage,
                     sources={"orders": {"type": "file", "path": f"file://{work / 'in'}", "format": "parquet"}},
                     sinks={"orders_table": sink}, store=store, key_groups=8)
    t, cpu = time.perf_counter(), cpu_seconds()
    result = run_stage(spec, spark)
    pipeline = CheckpointStore(CheckpointConfig.from_mapping(store)).pipeline("orders")
    decision = pipeline.decide(result.epoch, Decision.COMMIT, "bench", "bench")
    assert decision.decision is Decision.COMMIT, decision.reason
    pipeline.commit(result.epoch)
    elapsed, used = time.perf_counter() - t, cpu_seconds() - cpu
    if rules:
        counts = {e.name: e.failed for m in result.manifests for e in m.expectations}
        print(f"    rows {result.rows} (with quarantine), failed per rule {counts}", flush=True)
    shutil.rmtree(work, ignore_errors=True)
    return elapsed, used


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--files", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--stage", choices=sorted(STAGES), default="copy")
    parser.add_argument("--data-dir", type=Path, default=Path(tempfile.gettempdir()) / "bench-spark-stage-data")
    args = parser.parse_args(argv)

    here = str(Path(__file__).resolve().parent)
    sys.path.insert(0, here)  # the stage modules, for executors too
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from bench_spark_stage import generate
    from pyspark.sql import SparkSession

    files = generate(args.data_dir, args.rows, args.files)
    load_before = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    spark = (SparkSession.builder.master("local[2]").appName("bench-expectations")
             .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1").config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.memory", "4g").config("spark.sql.shuffle.partitions", "8")
             .config("spark.sql.adaptive.coalescePartitions.enabled", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    work = Path(tempfile.mkdtemp(prefix="bench-expectations-"))
    stage = STAGES[args.stage]
    epoch(spark, work / "warmup", files[:2], stage, RULES)  # JIT, Python workers; not measured
    times: dict[str, list[float]] = {"none": [], "rules": []}
    cpu: dict[str, list[float]] = {"none": [], "rules": []}
    for r in range(args.rounds):
        for name in ("none", "rules") if r % 2 == 0 else ("rules", "none"):
            wall, used = epoch(spark, work / name, files, stage, RULES if name == "rules" else None)
            times[name].append(wall)
            cpu[name].append(used)
            print(f"round {r + 1} {name:6s} {wall:6.2f}s wall {used:6.2f}s CPU", flush=True)
    spark.stop()
    load_after = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(f"\nstage {args.stage}, {args.rows} rows, {args.rounds} rounds (target: rules / none <= 1.10)")
    for what, measured in (("wall", times), ("CPU", cpu)):
        med = {n: statistics.median(t) for n, t in measured.items()}
        best = {n: min(t) for n, t in measured.items()}
        print(f"  {what:4s} median: none {med['none']:.2f}s, rules {med['rules']:.2f}s, ratio "
              f"{med['rules'] / med['none']:.3f}; best: none {best['none']:.2f}s, rules {best['rules']:.2f}s, "
              f"ratio {best['rules'] / best['none']:.3f}; median of the rounds' ratios "
              f"{statistics.median(r / n for r, n in zip(measured['rules'], measured['none'], strict=True)):.3f}")
    print(f"load before: {load_before}\nload after:  {load_after}")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
