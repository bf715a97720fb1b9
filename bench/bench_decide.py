"""The commit decision and the publish: cost per epoch as the state's history grows, requests per file on S3.

1. **Decide growth** -- a 50-epoch keyed-state pipeline on a local store (the plain-Python
   stage of ``tests/core/epochs.py``: ``--keys`` new keys per epoch into 4 key groups,
   delta parts between full ones every ``full_checkpoint_interval`` epochs, one sink
   of 4 staged files per epoch). For each epoch the ``Pipeline.decide`` call alone is
   timed (wall clock, and CPU seconds of this process: what a shared machine disturbs
   least) and the bytes it read are counted (``rchar`` of ``/proc/self/io``: every byte
   this process read through a system call). Figure: median of epochs 45-50 / median of
   epochs 3-8, for time and bytes. Target <= 1.1.
2. **S3 requests per staged file** -- one commit (publish included) of a sink with 2
   and with 22 staged files on a moto S3 server on 127.0.0.1; every request the S3
   client sends is counted by a botocore event hook. Figure: (requests(22) -
   requests(2)) / 20, the requests a commit adds per staged file.

``--baseline /path/to/other/checkout`` runs the same measurements on that checkout's code
in a subprocess (e.g. ``/work/main`` for the figures before this change) and prints
both. Usage::

    python bench/bench_decide.py [--epochs 50] [--keys 20000] [--baseline /work/main] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# The code measured: this checkout, or the one --code names (how --baseline runs).
_CODE = os.environ.get("BENCH_DECIDE_CODE") or str(Path(__file__).resolve().parents[1])
sys.path.insert(0, _CODE)

from airflow_seatunnel_ckpt.core import CheckpointConfig, CheckpointStore, Decision  # noqa: E402
from tests.core.epochs import Participant, prepare_participant  # noqa: E402


def rchar() -> int:
    """Bytes this process has read through system calls so far (page cache included)."""
    with open("/proc/self/io") as fh:
        for line in fh:
            if line.startswith("rchar:"):
                return int(line.split()[1])
    raise RuntimeError("/proc/self/io has no rchar line")


def decide_growth(epochs: int, keys: int) -> dict[str, Any]:
    """Time and bytes read of each epoch's decide in a keyed-state pipeline of ``epochs`` epochs."""
    real_fsync = os.fsync
    os.fsync = lambda fd: None  # the same for both sides; a shared VM's disk flushes are noise
    try:
        with tempfile.TemporaryDirectory(prefix="bench-decide-") as tmp:
            config = CheckpointConfig.from_mapping({"storage_url": f"file://{tmp}/store"})
            p = CheckpointStore(config).pipeline("growth")
            times, cpus, reads = [], [], []
            for e in range(1, epochs + 1):
                run_id = f"run-{e}"
                changes = {(e - 1) * keys + i: e for i in range(keys)}
                blobs = [os.urandom(16 * 1024) for _ in range(4)]
                record = prepare_participant(p, run_id, Participant(sinks={"orders": blobs}, changes=changes))
                before_bytes, start, cpu = rchar(), time.perf_counter(), time.process_time()
                decision = p.decide(record.epoch, Decision.COMMIT, "bench", by="bench")
                times.append(time.perf_counter() - start)
                cpus.append(time.process_time() - cpu)
                reads.append(rchar() - before_bytes)
                assert decision.decision is Decision.COMMIT
                p.commit(record.epoch)
    finally:
        os.fsync = real_fsync
    early, late = slice(2, 8), slice(epochs - 6, epochs)
    return {"epochs": epochs,
            "time_early_s": statistics.median(times[early]), "time_late_s": statistics.median(times[late]),
            "cpu_early_s": statistics.median(cpus[early]), "cpu_late_s": statistics.median(cpus[late]),
            "read_early": statistics.median(reads[early]), "read_late": statistics.median(reads[late]),
            "times": times, "cpus": cpus, "reads": reads}


def s3_requests_per_file() -> dict[str, Any]:
    """Requests one commit sends to S3 for 2 and for 22 staged files, and the difference per file."""
    import asyncio  # noqa: F401  (the hook below is a coroutine)

    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    options = {"key": "testing", "secret": "testing",
               "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"}}
    try:
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket="bench")
        counts = {}
        for files in (2, 22):
            config = CheckpointConfig.from_mapping({"storage_url": "s3://bench/store", "storage_options": options})
            p = CheckpointStore(config).pipeline(f"requests-{files}")
            blobs = [bytes([i % 256]) * (1000 + i) for i in range(files)]
            record = prepare_participant(p, "run-1", Participant(sinks={"orders": blobs}))
            p.decide(record.epoch, Decision.COMMIT, "bench", by="bench")
            ops: list[str] = []

            def count(model: Any, _ops: list[str] = ops, **_: Any) -> None:
                _ops.append(model.name)

            events = p.storage.fs.s3.meta.events
            events.register("before-call.s3", count)
            try:
                p.commit(record.epoch)
            finally:
                events.unregister("before-call.s3", count)
            counts[str(files)] = {op: ops.count(op) for op in sorted(set(ops))} | {"total": len(ops)}
    finally:
        server.stop()
    return {"per_file": (counts["22"]["total"] - counts["2"]["total"]) / 20, "counts": counts}


def measure(epochs: int, keys: int) -> dict[str, Any]:
    """Every figure of this benchmark on the code this process imported."""
    return {"code": _CODE, "decide": decide_growth(epochs, keys), "s3": s3_requests_per_file()}


def report(name: str, r: dict[str, Any]) -> list[str]:
    d, s3 = r["decide"], r["s3"]
    t = d["time_late_s"] / d["time_early_s"]
    late = f"epochs {d['epochs'] - 5}-{d['epochs']} / 3-8"
    b = d["read_late"] / max(d["read_early"], 1)
    c = d["cpu_late_s"] / d["cpu_early_s"]
    return [
        f"[{name}] {r['code']}",
        f"  decide time  {late:22} {t:7.3f}  target <= 1.1  {'ok' if t <= 1.1 else 'MISSED'}   "
        f"{d['time_early_s'] * 1e3:.1f} ms -> {d['time_late_s'] * 1e3:.1f} ms (median)",
        f"  decide CPU   {late:22} {c:7.3f}  target <= 1.1  {'ok' if c <= 1.1 else 'MISSED'}   "
        f"{d['cpu_early_s'] * 1e3:.1f} ms -> {d['cpu_late_s'] * 1e3:.1f} ms CPU (median)",
        f"  decide bytes {late:22} {b:7.3f}  target <= 1.1  {'ok' if b <= 1.1 else 'MISSED'}   "
        f"{d['read_early'] / 1e6:.2f} MB -> {d['read_late'] / 1e6:.2f} MB read (median)",
        f"  S3 requests per staged file       {s3['per_file']:7.2f}                  "
        f"commit of 22 files: {s3['counts']['22']}",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=50)
    parser.add_argument("--keys", type=int, default=20000, help="new keys per epoch")
    parser.add_argument("--baseline", default=None, help="another checkout to measure the same way")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--raw", action="store_true", help=argparse.SUPPRESS)  # one measurement as JSON
    args = parser.parse_args(argv)
    if args.raw:
        print(json.dumps(measure(args.epochs, args.keys)))
        return 0
    results = {}
    if args.baseline:
        env = {**os.environ, "BENCH_DECIDE_CODE": str(Path(args.baseline).resolve())}
        out = subprocess.run([sys.executable, __file__, "--raw", "--epochs", str(args.epochs),
                              "--keys", str(args.keys)], env=env, check=True, capture_output=True, text=True)
        results["baseline"] = json.loads(out.stdout.strip().splitlines()[-1])
    results["this"] = measure(args.epochs, args.keys)
    for name, r in results.items():
        print("\n".join(report(name, r)))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
