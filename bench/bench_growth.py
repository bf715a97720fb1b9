"""Growth: does an epoch cost the same at epoch 50 as at epoch 5? Ours vs Structured Streaming.

Constant new input per epoch (``--rows``, default 400,000; ``--repeat-fraction`` of them,
default 10%, repeat keys drawn uniformly from all earlier epochs) goes into a key-set
de-duplication, ``local[2]``, one session shared by every variant:

* ``ours`` -- the whole epoch through this project: :func:`~airflow_seatunnel_ckpt.spark.run_stage`
  (begin, plan the file source, restore, de-duplicate against the key set, stage, prepare),
  then ``Pipeline.decide`` (the commit decision, timed on its own) and ``Pipeline.commit``;
* ``default`` -- Structured Streaming, ``readStream`` over the same input directory,
  ``dropDuplicates`` with the default ``HDFSBackedStateStoreProvider``, a parquet sink,
  ``trigger(availableNow=True)``: one micro-batch per epoch, a new query start per epoch
  (as a scheduled batch job restarts it);
* ``rocksdb`` -- the same with ``RocksDBStateStoreProvider`` and changelog checkpointing.

Within each epoch the variants run one after the other, the order rotating from epoch to
epoch, so load on the shared machine falls on all of them alike. A streaming variant that
does not finish an epoch within ``--timeout`` seconds (the default provider stalling in
full GC once its state outgrows the heap) is stopped, reported and left out of the
remaining epochs. Ratios compare the median epoch time of an early window (epochs 3-8)
and the last window (epochs 45-50 with 50 epochs; with fewer epochs both windows shrink
so that they do not overlap). Printed, never asserted.

``--keys N`` is the state-beyond-memory mode: it builds a key set of N keys (in epochs of
``--build-rows``), then times one epoch of ``--new-rows`` rows (``--repeat-fraction`` of
them repeats) with the driver's heap capped at ``--memory`` (in ``local`` mode executors
live in the driver JVM). Each variant (``ours``, ``rocksdb``) runs in a fresh process of
its own so that the peak resident memory of its JVM and of its Python workers, sampled
from ``/proc`` during the measured epoch, is its own.

One file on purpose, a little over the usual 450 lines: a bench runs as a script, and its
two modes share the data, the variants and the session.

Usage (repository root)::

    PYTHONPATH=. .venv/bin/python bench/bench_growth.py [--epochs 50] [--rows 400000]
        [--repeat-fraction 0.1] [--providers ours,default,rocksdb] [--timeout 600]
    PYTHONPATH=. .venv/bin/python bench/bench_growth.py --keys 100000000 [--new-rows 1000000]
        [--memory 2g] [--providers ours,rocksdb]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

KEY = "event_id"
STAGE = "bench_growth:dedup_events"
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
HDFS = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
PROVIDERS = {"default": HDFS, "rocksdb": ROCKSDB}


def dedup_events(ctx: Any, spark: Any) -> None:
    """The stage under test: drop events whose id any committed epoch has seen, stage the rest."""
    fresh = ctx.key_set("seen_events").dedup(ctx.source("events").read(), key=KEY)
    ctx.sink("events_out").write(fresh)


# -- data ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class InputFile:
    """One epoch's input file: ``new`` ids from ``first_new`` on, the rest repeats of earlier ids."""

    name: str
    rows: int
    new: int
    first_new: int


def plan_inputs(sizes: list[int], repeat_fraction: float, prefix: str) -> list[InputFile]:
    """Files of ``sizes`` rows; every file after the first repeats ``repeat_fraction`` of its rows."""
    files, issued = [], 0
    for i, rows in enumerate(sizes):
        new = rows if i == 0 else rows - round(rows * repeat_fraction)
        # The name carries what the file holds, so files of other runs are never taken for it.
        files.append(InputFile(f"{prefix}-{i + 1:05d}-{rows}-{new}-{issued}.parquet", rows, new, issued))
        issued += new
    return files


def write_input(directory: Path, spec: InputFile, seed: int = 11) -> Path:
    """Write ``spec`` (deterministic; kept and reused when already there, as its name says what it holds)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = directory / spec.name
    if path.exists():
        return path
    rng = np.random.default_rng([seed, spec.first_new])
    ordinals = np.arange(spec.first_new, spec.first_new + spec.new, dtype=np.int64)
    if spec.rows > spec.new:
        ordinals = np.concatenate([ordinals, rng.integers(0, spec.first_new, spec.rows - spec.new)])
    rng.shuffle(ordinals)
    # 7919 is prime to 10**12, so distinct ordinals stay distinct ids, spread over the range.
    ids = ordinals * 7919 % 10**12 + 10**9
    table = pa.table(
        {
            KEY: ids,
            "user": pa.array(np.char.add("u", (ids % 100_000).astype(str)).tolist(), pa.string()),
            "amount": np.round(rng.random(spec.rows) * 1000, 2),
            "ts": pa.array((1_700_000_000_000_000 + ids % 10**9).astype("datetime64[us]")),
        }
    )
    # Written aside and renamed: an interrupted run leaves no half file under the real name.
    pq.write_table(table, directory / f".{spec.name}.tmp")
    os.replace(directory / f".{spec.name}.tmp", path)
    return path


# -- variants ------------------------------------------------------------------------------------


class Variant:
    """One way of running the epochs over its own input directory; ``epoch`` returns figures."""

    def __init__(self, name: str, spark: Any, work: Path, key_groups: int) -> None:
        self.name, self.spark, self.key_groups = name, spark, key_groups
        self.work = work / name
        shutil.rmtree(self.work, ignore_errors=True)
        (self.work / "in").mkdir(parents=True)
        self.stalled = ""

    def add_input(self, path: Path) -> None:
        """Make an epoch's file appear in the input directory (a hard link: no copy cost)."""
        os.link(path, self.work / "in" / path.name)

    def epoch(self, n: int, timeout: float) -> dict[str, Any]:
        """Run epoch ``n`` over the input added so far; ``seconds`` and what the variant reports."""
        raise NotImplementedError


class Ours(Variant):
    """The project's stage runner plus the commit decision and publish: a whole epoch."""

    def epoch(self, n: int, timeout: float) -> dict[str, Any]:
        from airflow_seatunnel_ckpt.core import CheckpointConfig, CheckpointStore, Decision
        from airflow_seatunnel_ckpt.spark import StageSpec, run_stage

        store = {"storage_url": f"file://{self.work / 'store'}"}
        spec = StageSpec(
            pipeline="events",
            participant="dedup",
            run_id=f"growth-{n}",
            attempt=1,
            stage=STAGE,
            sources={"events": {"type": "file", "path": f"file://{self.work / 'in'}", "format": "parquet"}},
            sinks={"events_out": {"type": "file", "path": f"file://{self.work / 'out'}"}},
            store=store,
            key_groups=self.key_groups,
        )
        t0 = time.perf_counter()
        result = run_stage(spec, self.spark)
        t1 = time.perf_counter()
        pipeline = CheckpointStore(CheckpointConfig.from_mapping(store)).pipeline("events")
        pipeline.decide(result.epoch, Decision.COMMIT, "bench", "bench")
        t2 = time.perf_counter()
        pipeline.commit(result.epoch)
        t3 = time.perf_counter()
        return {"seconds": t3 - t0, "stage": t1 - t0, "decide": t2 - t1, "commit": t3 - t2,
                "rows": result.rows, "state_bytes": result.checkpoint_bytes}


class Streaming(Variant):
    """Structured Streaming, ``availableNow``, ``dropDuplicates``, one state store provider."""

    def epoch(self, n: int, timeout: float) -> dict[str, Any]:
        self.spark.conf.set("spark.sql.streaming.stateStore.providerClass", PROVIDERS[self.name])
        # A streaming file source needs its schema up front; reading it is left untimed.
        schema = self.spark.read.parquet(f"file://{next((self.work / 'in').iterdir())}").schema
        t0 = time.perf_counter()
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
        if not query.awaitTermination(timeout):
            query.stop()
            self.stalled = f"epoch {n} did not finish within {timeout:.0f} s (stopped)"
            return {"seconds": float("nan"), "stalled": True}
        seconds = time.perf_counter() - t0
        batches = [p for p in query.recentProgress if p.get("numInputRows", 0) > 0]
        ops = [p["stateOperators"][0] for p in batches if p.get("stateOperators")]
        return {"seconds": seconds, "batches": len(batches),
                "rows": sum(op.get("numRowsUpdated", 0) for op in ops),
                "state_rows": ops[-1].get("numRowsTotal") if ops else None,
                # Where the batch's time went, by Spark's own account (addBatch, walCommit, ...).
                "duration_ms": batches[-1].get("durationMs") if batches else None,
                "state_metrics": ops[-1] if ops else None}


def make_variant(name: str, spark: Any, work: Path, key_groups: int) -> Variant:
    """``ours`` or a streaming provider by name."""
    if name == "ours":
        return Ours(name, spark, work, key_groups)
    if name in PROVIDERS:
        return Streaming(name, spark, work, key_groups)
    raise SystemExit(f"unknown provider {name!r}; use ours, {', '.join(PROVIDERS)}")


# -- session and machine ----------------------------------------------------------------------


def start_spark(memory: str, key_groups: int, extra: list[str] | None = None) -> Any:
    """The one ``local[2]`` session, set up as ``bench_spark_stage.py`` sets it up.

    ``extra``: ``key=value`` Spark settings on top (``--conf``), e.g. the state store's
    ``spark.sql.streaming.stateStore.maintenanceInterval``.
    """
    here = str(Path(__file__).resolve().parent)
    sys.path.insert(0, here)  # the stage's module, for the driver and (below) the Python workers
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master("local[2]")
        .appName("bench-growth")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", memory)
        .config("spark.executor.memory", memory)
        .config("spark.sql.shuffle.partitions", str(key_groups))
        .config("spark.sql.adaptive.coalescePartitions.enabled", "false")
        .config("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
    )
    for setting in extra or []:
        key, sep, value = setting.partition("=")
        if not sep:
            raise SystemExit(f"--conf {setting!r}: expected key=value")
        builder = builder.config(key.strip(), value.strip())
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _proc_tree() -> dict[int, tuple[int, str, int]]:
    """pid -> (parent pid, command name, resident bytes) of every readable process."""
    page = os.sysconf("SC_PAGE_SIZE")
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            rss = int(Path(f"/proc/{entry}/statm").read_text().split()[1]) * page
        except OSError:
            continue  # exited between the listing and the read
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        out[int(entry)] = (int(stat[stat.rindex(")") + 2 :].split()[1]), comm, rss)
    return out


class RssSampler:
    """Peak resident memory of the JVM and the sum over its Python workers, sampled every 0.2 s."""

    def __init__(self, root_pid: int) -> None:
        self.root, self.jvm_peak, self.python_peak = root_pid, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> tuple[int, int]:
        """Current (JVM bytes, Python worker bytes) below the gateway process."""
        tree = _proc_tree()
        below, frontier = {self.root}, [self.root]
        while frontier:
            parent = frontier.pop()
            kids = [p for p, (pp, _, _) in tree.items() if pp == parent and p not in below]
            below.update(kids)
            frontier.extend(kids)
        jvm = sum(tree[p][2] for p in below if p in tree and tree[p][1] == "java")
        python = sum(tree[p][2] for p in below if p in tree and tree[p][1].startswith("python"))
        return jvm, python

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            jvm, python = self.sample()
            self.jvm_peak, self.python_peak = max(self.jvm_peak, jvm), max(self.python_peak, python)

    def __enter__(self) -> RssSampler:
        self.at_start = self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def load() -> str:
    """The machine's load averages, for the reader to judge the figures by."""
    one, five, fifteen = os.getloadavg()
    return f"load {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} cpus"


# -- growth mode --------------------------------------------------------------------------------


def windows(epochs: int) -> tuple[range, range]:
    """Early (from epoch 3, after warm-up) and late (the last) windows of up to 6 epochs each."""
    width = max(1, min(6, (epochs - 2) // 2))
    return range(3, 3 + width), range(epochs - width + 1, epochs + 1)


def window_ratio(series: dict[int, float], early: range, late: range) -> tuple[float, float, float]:
    """(late median / early median, early median, late median); NaN where a window has no figure."""
    e = [series[i] for i in early if i in series and series[i] == series[i]]  # NaN: stalled
    la = [series[i] for i in late if i in series and series[i] == series[i]]
    if not e or not la:
        return float("nan"), float("nan"), float("nan")
    me, ml = statistics.median(e), statistics.median(la)
    return ml / me, me, ml


def run_growth(args: argparse.Namespace, names: list[str], work: Path) -> dict[str, Any]:
    """Every epoch through every variant; prints a line per epoch and the ratios."""
    inputs = plan_inputs([args.rows] * args.epochs, args.repeat_fraction, "events")
    args.data_dir.mkdir(parents=True, exist_ok=True)
    spark = start_spark(args.memory, args.key_groups, args.conf)
    variants = [make_variant(n, spark, work, args.key_groups) for n in names]
    print(f"{args.epochs} epochs x {args.rows:,} rows ({args.repeat_fraction:.0%} repeats), "
          f"key groups {args.key_groups}, driver memory {args.memory}; {load()}", flush=True)
    print(f"{'epoch':>5s} {'keys':>11s} " + " ".join(f"{n:>9s}" for n in names)
          + "  ours stage/decide/commit   load1", flush=True)
    figures: dict[str, dict[int, dict[str, Any]]] = {n: {} for n in names}
    keys = 0
    for n, spec in enumerate(inputs, start=1):
        path = write_input(args.data_dir, spec)
        keys += spec.new
        order = variants[(n - 1) % len(variants):] + variants[: (n - 1) % len(variants)]
        for v in order:
            if v.stalled:
                continue
            v.add_input(path)
            fig = v.epoch(n, args.timeout)
            figures[v.name][n] = fig
            if fig.get("rows") is not None and fig["rows"] != spec.new:
                print(f"WARNING: {v.name} epoch {n} published {fig['rows']} rows, expected {spec.new}")
            if v.stalled:
                print(f"{v.name}: {v.stalled}; left out from here on", flush=True)
        cells = [figures[v][n]["seconds"] if n in figures[v] else float("nan") for v in names]
        ours = figures.get("ours", {}).get(n)
        split = f"{ours['stage']:6.2f}/{ours['decide']:5.2f}/{ours['commit']:5.2f}" if ours else ""
        print(f"{n:5d} {keys:11,d} " + " ".join(f"{c:9.2f}" for c in cells)
              + f"  {split:24s} {os.getloadavg()[0]:6.2f}", flush=True)
    spark.stop()
    for name in (n for n in names if n in PROVIDERS and figures[n]):
        print(f"{name}: {state_note(figures[name][max(figures[name])])}")
    return summarise(args, names, figures)


def state_note(fig: dict[str, Any]) -> str:
    """What a streaming epoch's state store reported: size, and for RocksDB the restore cost.

    Each epoch starts the query afresh, so the provider loads its state again; with
    changelog checkpointing that is the newest uploaded snapshot plus every changelog
    after it (snapshots are uploaded by a background maintenance task that a short query
    may not live long enough to run).
    """
    ops = fig.get("state_metrics") or {}
    custom = ops.get("customMetrics", {})
    note = f"{ops.get('numRowsTotal', 0):,} state rows, {ops.get('memoryUsedBytes', 0) / 2**20:,.0f} MiB"
    if "rocksdbNumReplayChangelogFiles" in custom:
        note += (f"; restore replayed {custom['rocksdbNumReplayChangelogFiles']} changelog files, "
                 f"load {custom.get('rocksdbLoadLatencyMs', 0) / 1000:.1f} s summed over tasks")
    return note


def summarise(args: argparse.Namespace, names: list[str], figures: dict[str, Any]) -> dict[str, Any]:
    """The issue's ratios from the per-epoch figures."""
    early, late = windows(args.epochs)
    tag = f"{late.start}-{late.stop - 1} / {early.start}-{early.stop - 1}"
    series = {n: {e: f["seconds"] for e, f in figures[n].items()} for n in names}
    out: dict[str, Any] = {"epochs": args.epochs, "rows": args.rows, "windows": [list(early), list(late)],
                           "per_epoch": figures, "ratios": {}}
    print(f"\nmedians over epochs {early.start}-{early.stop - 1} and {late.start}-{late.stop - 1}; {load()}")
    print(f"{'figure':44s} {'ratio':>7s} {'target':>10s}  detail")

    def line(label: str, ratio: float, target: float | None, detail: str) -> None:
        verdict = "" if ratio != ratio or target is None else ("ok" if ratio <= target else "MISSED")
        out["ratios"][label] = ratio
        shown = f"<= {target}" if target is not None else "(info)"
        print(f"{label:44s} {ratio:7.3f} {shown:>10s}  {verdict:6s} {detail}")

    for n in names:
        r, me, ml = window_ratio(series[n], early, late)
        target = 1.15 if n == "ours" else None
        line(f"{n} growth {tag}", r, target, f"{me:.2f} s -> {ml:.2f} s per epoch")
    if "ours" in names:
        decide = {e: f["decide"] for e, f in figures["ours"].items()}
        r, me, ml = window_ratio(decide, early, late)
        line(f"ours decide growth {tag}", r, 1.1, f"{me * 1000:.0f} ms -> {ml * 1000:.0f} ms")
        # Incremental checkpoints: bytes written per epoch should follow the new keys, not the state.
        written = {e: float(f["state_bytes"]) for e, f in figures["ours"].items()}
        r, me, ml = window_ratio(written, early, late)
        line(f"ours checkpoint bytes growth {tag}", r, None, f"{me:,.0f} -> {ml:,.0f} bytes per epoch")
        ours_late = [series["ours"][e] for e in late if e in series["ours"]]
        for base in (b for b in names if b in PROVIDERS):
            base_late = [series[base][e] for e in late if e in series[base] and series[base][e] == series[base][e]]
            if not ours_late or not base_late:
                print(f"ours / SS({base}): no figure in the last window (it stalled or was stopped)")
                continue
            r = statistics.median(ours_late) / statistics.median(base_late)
            line(f"ours / SS({base}) at {late.start}-{late.stop - 1}", r, 0.35,
                 f"{statistics.median(ours_late):.2f} s vs {statistics.median(base_late):.2f} s")
    return out


# -- keys mode ------------------------------------------------------------------------------


def run_keys_variant(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """One variant in this process: build the key set, then the measured epoch under the sampler."""
    sizes = [args.build_rows] * (args.keys // args.build_rows)
    if args.keys % args.build_rows:
        sizes.append(args.keys % args.build_rows)
    inputs = plan_inputs(sizes, 0.0, "keys") + [
        InputFile(f"keys-new-{args.new_rows}-{args.repeat_fraction}-{args.keys}.parquet", args.new_rows,
                  args.new_rows - round(args.new_rows * args.repeat_fraction), args.keys)]
    spark = start_spark(args.memory, args.key_groups, args.conf)
    variant = make_variant(args.keys_variant, spark, work, args.key_groups)
    t0 = time.perf_counter()
    for n, spec in enumerate(inputs[:-1], start=1):
        variant.add_input(write_input(args.data_dir, spec))
        variant.epoch(n, args.timeout)
        if variant.stalled:
            return {"variant": variant.name, "stalled": f"building: {variant.stalled}"}
    build = time.perf_counter() - t0
    variant.add_input(write_input(args.data_dir, inputs[-1]))
    with RssSampler(spark.sparkContext._gateway.proc.pid) as rss:
        fig = variant.epoch(len(inputs), args.timeout)
    spark.stop()
    return {"variant": variant.name, "build_seconds": build, "epoch": fig, "expected_rows": inputs[-1].new,
            "jvm_rss_at_start": rss.at_start[0], "jvm_rss_peak": rss.jvm_peak,
            "python_rss_peak": rss.python_peak, "stalled": variant.stalled}


def run_keys(args: argparse.Namespace, names: list[str], work: Path) -> dict[str, Any]:
    """Each variant in a fresh process (its own capped JVM); prints time and peak memory."""
    print(f"key set of {args.keys:,} keys (epochs of {args.build_rows:,}), then one epoch of "
          f"{args.new_rows:,} rows; driver memory {args.memory}; {load()}", flush=True)
    results = []
    for name in names:
        out = work / f"keys-{name}.json"
        cmd = [sys.executable, __file__, *sys.argv[1:], "--keys-variant", name, "--json", str(out),
               "--work-dir", str(work)]
        code = subprocess.call(cmd)
        if code or not out.exists():
            print(f"{name}: the child process failed (exit {code})")
            continue
        r = json.loads(out.read_text())
        results.append(r)
        if r.get("stalled"):
            print(f"{name:8s} stalled: {r['stalled']}")
            continue
        mib = 1 << 20
        print(f"{name:8s} epoch {r['epoch']['seconds']:7.2f} s (build {r['build_seconds']:.0f} s)  "
              f"JVM RSS {r['jvm_rss_at_start'] / mib:,.0f} MiB at start, peak {r['jvm_rss_peak'] / mib:,.0f} MiB; "
              f"Python workers peak {r['python_rss_peak'] / mib:,.0f} MiB; rows {r['epoch'].get('rows')} "
              f"(expected {r['expected_rows']}); {load()}", flush=True)
        if r["epoch"].get("duration_ms"):
            print(f"{'':8s} streaming batch, ms: {r['epoch']['duration_ms']}; {state_note(r['epoch'])}")
    done = {r["variant"]: r for r in results if not r.get("stalled")}
    if "ours" in done and "rocksdb" in done:
        print(f"ours / SS(rocksdb) epoch time: "
              f"{done['ours']['epoch']['seconds'] / done['rocksdb']['epoch']['seconds']:.3f}")
    return {"keys": args.keys, "new_rows": args.new_rows, "memory": args.memory, "results": results}


def main(argv: list[str] | None = None) -> int:
    """Parse the options and run the growth or the keys mode."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=50)
    p.add_argument("--rows", type=int, default=400_000, help="rows per epoch")
    p.add_argument("--repeat-fraction", type=float, default=0.1, help="rows repeating an earlier epoch's key")
    p.add_argument("--providers", default=None,
                   help="variants: ours, default, rocksdb (default: all three; keys mode: ours,rocksdb)")
    p.add_argument("--key-groups", type=int, default=8, help="ours' key groups = shuffle partitions of all")
    p.add_argument("--timeout", type=float, default=600, help="seconds a streaming epoch may take")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                   help="extra Spark setting for the shared session (repeatable)")
    p.add_argument("--memory", default=None, help="spark.driver.memory (default 4g; keys mode 2g)")
    p.add_argument("--keys", type=int, default=0, help="keys mode: build a key set of this many keys")
    p.add_argument("--build-rows", type=int, default=10_000_000, help="keys mode: rows per building epoch")
    p.add_argument("--new-rows", type=int, default=1_000_000, help="keys mode: rows of the measured epoch")
    p.add_argument("--keys-variant", default=None, help=argparse.SUPPRESS)
    p.add_argument("--data-dir", type=Path, default=Path(tempfile.gettempdir()) / "bench-growth-data")
    p.add_argument("--work-dir", type=Path, default=None)
    p.add_argument("--json", type=Path, default=None, help="also write the figures as JSON")
    args = p.parse_args(argv)
    if not args.keys and args.epochs < 4:
        p.error(f"--epochs must be at least 4 (an early window from epoch 3 and a later one), got {args.epochs}")
    if not 0 <= args.repeat_fraction < 1:
        p.error(f"--repeat-fraction must be in [0, 1), got {args.repeat_fraction}")
    if min(args.rows, args.new_rows, args.build_rows) < 1 or args.keys < 0:
        p.error("--rows, --new-rows and --build-rows must be positive, --keys not negative")
    args.memory = args.memory or ("2g" if args.keys else "4g")
    default = "ours,rocksdb" if args.keys else "ours,default,rocksdb"
    names = [n.strip() for n in (args.providers or default).split(",") if n.strip()]
    args.data_dir.mkdir(parents=True, exist_ok=True)
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="bench-growth-"))
    if args.keys_variant:  # a child of the keys mode: one variant, figures to --json
        work = work / f"child-{args.keys_variant}"
        figures = run_keys_variant(args, work)
    elif args.keys:
        figures = run_keys(args, names, work)
    else:
        figures = run_growth(args, names, work)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1, default=str))
    if args.work_dir is None or args.keys_variant:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
