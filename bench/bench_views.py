"""What the views cost as the history grows: ``epochs --last 30`` and the Checkpoints page on S3.

For E settled epochs (every 7th aborted, the others committed and retired, written record by
record through the store as the protocol leaves them, in parallel; settled as recovery
settles, ``sweep.settle``: the epoch index written, then the watermark), eight real committed
epochs with checkpoints settled by a recovery run above them, and two more real committed
epochs and one OPEN above the watermark, it runs each view
once to warm the process, then ``--rounds`` times, and prints the median time, the store calls
(``Storage`` methods) and the S3 requests (a botocore ``before-send`` hook on s3fs's client) of
one run. The views: ``seatunnel-ckpt epochs --last 30``, the page's data
(``overview.pipeline_view``: rows, verify, recovery's dry run, action history), its charts
(``charts.epoch_points``, 30 epochs) and the store's summary (``overview.pipelines_summary``).
"before" runs the same code with the reads it replaced: the ``_txlog`` listing to find the
epochs above the watermark, s3fs's listing (which lists the parent of a directory with no
children), and every shown epoch's records (no epoch index). Figures are printed, never
asserted; the machine's load is printed with them.

    PYTHONPATH=. .venv/bin/python bench/bench_views.py [--sizes 100,1000,10000] [--rounds 5] [--modes before,after]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import statistics
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from airflow_seatunnel_ckpt.cli import main as cli_main
from airflow_seatunnel_ckpt.core import CheckpointConfig, CheckpointStore, Decision, codec, layout
from airflow_seatunnel_ckpt.core.models import BeginRecord, DecisionRecord, EpochState
from airflow_seatunnel_ckpt.core.protocol import epoch_index, settled, sweep
from airflow_seatunnel_ckpt.core.protocol.txlog import TransactionLog
from airflow_seatunnel_ckpt.core.storage import ObjectStorage, Storage
from airflow_seatunnel_ckpt.plugins import charts, overview
from bench.bench_log_scale import counting, real_epoch

PIPELINE = "orders"


def history(store: CheckpointStore, epochs: int) -> None:
    """``epochs`` final epochs written record by record, settled; real epochs settled and above."""
    p = store.pipeline(PIPELINE)

    def write(e: int) -> EpochState:
        def put(name: str, payload: dict[str, Any]) -> None:
            p.storage.create_exclusive(layout.record_path(e, name), codec.encode_json(payload))

        put("begin", BeginRecord(e, f"run-{e}", 1.0, "orders_dag", "2026-01-01T00:00:00+00:00").to_dict())
        commit = e % 7 != 0
        put("decision", DecisionRecord(e, Decision.COMMIT if commit else Decision.ABORT, "history", "bench",
                                       1.0).to_dict())
        if not commit:
            put("aborted", {"type": "aborted", "epoch": e, "at": 1.0})
            return EpochState.ABORTED
        put("committed", {"type": "committed", "epoch": e, "at": 1.0, "published": []})
        put("retired", {"type": "retired", "epoch": e, "at": 1.0})
        return EpochState.COMMITTED

    with ThreadPoolExecutor(16) as pool:
        states = dict(zip(range(1, epochs + 1), pool.map(write, range(1, epochs + 1)), strict=True))
    # As recovery settles: the newest epochs indexed, then the watermark moved (states known here).
    sweep.settle(p, p.txlog.settled.read(), states, now=time.time(), timeout=p.config.prepared_timeout_s)
    for i in range(settled.MIN_ADVANCE):
        real_epoch(p, f"settled-{i}")
    p.recover(dry_run=False)
    assert p.txlog.settled.read().record.watermark == epochs + settled.MIN_ADVANCE
    for i in range(2):
        real_epoch(p, f"above-{i}")
    p.begin("open")


@contextlib.contextmanager
def before() -> Iterator[None]:
    """The reads this change replaced: ``_txlog`` listed to find the epochs above the watermark,
    s3fs's own listing, and every shown epoch's records (no epoch index)."""
    above, list_dir, held = TransactionLog._above, ObjectStorage.list_dir, epoch_index.held

    def listed(self: TransactionLog, seen: settled.SettledRead | None = None) -> Any:
        seen = seen if seen is not None else self.settled.read()
        return seen, {e: None for e in self.epochs() if e > seen.record.watermark}

    TransactionLog._above = listed  # type: ignore[method-assign]
    ObjectStorage.list_dir = Storage.list_dir  # type: ignore[method-assign]
    epoch_index.held = lambda pipeline, watermark, epochs: {}
    try:
        yield
    finally:
        TransactionLog._above, ObjectStorage.list_dir = above, list_dir  # type: ignore[method-assign]
        epoch_index.held = held


def views(url: str, options: dict[str, Any]) -> dict[str, Callable[[], object]]:
    """Each view, as a fresh process (the console) or a page request would run it."""
    def store() -> CheckpointStore:
        return CheckpointStore(CheckpointConfig.from_mapping({"storage_url": url, "storage_options": options}))

    def epochs_last_30() -> None:
        with contextlib.redirect_stdout(io.StringIO()):
            cli_main(["--store", url, "--storage-options", json.dumps(options), "epochs", PIPELINE,
                      "--last", "30"])

    return {
        "epochs --last 30": epochs_last_30,
        "page (pipeline_view)": lambda: overview.pipeline_view(store(), PIPELINE),
        "charts (30 epochs)": lambda: charts.epoch_points(store().pipeline(PIPELINE), 30),
        "store summary": lambda: overview.pipelines_summary(store()),
    }


def main() -> None:
    """Build each history on moto, then print one line per size, mode and view."""
    import boto3
    from moto.server import ThreadedMotoServer

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="100,1000,10000", help="settled epochs")
    ap.add_argument("--rounds", type=int, default=5, help="timed runs of each view (the median is printed)")
    ap.add_argument("--modes", default="before,after")
    args = ap.parse_args()
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    options = {"key": "testing", "secret": "testing",
               "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"}}
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    print(f"load average at start: {os.getloadavg()}")
    print(f"{'epochs':>7} {'mode':6} {'view':22} {'seconds':>8} {'calls':>6} {'S3 requests':>12}  by request")
    first: dict[tuple[str, str], tuple[float, int]] = {}
    try:
        for n in [int(x) for x in args.sizes.split(",") if x]:
            bucket = f"bench-{uuid.uuid4().hex[:16]}"
            boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
            url = f"s3://{bucket}/store"
            started = time.perf_counter()
            history(CheckpointStore.from_url(url, options), n)
            print(f"{n:>7} history built in {time.perf_counter() - started:.0f} s", flush=True)
            requests: Counter[str] = Counter()
            for mode in args.modes.split(","):
                guard = before() if mode == "before" else contextlib.nullcontext()
                with guard:
                    for name, view in views(url, options).items():
                        view()  # warm: imports, the store's probe
                        times = []
                        for _ in range(args.rounds):
                            start = time.perf_counter()
                            view()
                            times.append(time.perf_counter() - start)
                        requests.clear()
                        with counting() as calls, s3_requests(requests):
                            view()
                        took = statistics.median(times)
                        sent = sum(requests.values())
                        first.setdefault((mode, name), (took, sent))
                        base_t, base_r = first[(mode, name)]
                        print(f"{n:>7} {mode:6} {name:22} {took:>8.3f} {sum(calls.values()):>6} {sent:>12}  "
                              f"{dict(requests.most_common())}  (x{took / base_t:.2f} time, "
                              f"x{sent / max(base_r, 1):.2f} requests of the smallest)", flush=True)
    finally:
        server.stop()
    print(f"load average at end: {os.getloadavg()}")


@contextlib.contextmanager
def s3_requests(counts: Counter[str]) -> Iterator[None]:
    """Count the S3 requests meanwhile, by operation: a botocore ``before-send`` hook on the client
    of every s3fs filesystem made so far (fsspec keeps one per set of options; the views ran once)."""
    import s3fs

    def hook(event_name: str, **_: Any) -> None:
        counts.update([event_name.rsplit(".", 1)[-1]])

    clients = [fs.s3 for fs in list(s3fs.S3FileSystem._cache.values()) if getattr(fs, "s3", None) is not None]
    for client in clients:
        client.meta.events.register("before-send.s3", hook)
    try:
        yield
    finally:
        for client in clients:
            client.meta.events.unregister("before-send.s3", hook)


if __name__ == "__main__":
    main()
