"""What one recovery + retention run costs as the transaction log grows: settled watermark vs full scan.

For E settled epochs (every 7th aborted, the others committed and retired, written record
by record as the protocol leaves them) plus two real committed epochs with checkpoints on
top, it times ``recover(dry_run=False)`` followed by ``retain()`` -- the second such run,
after a first one settled the history -- and counts the store calls they make
(``list_dir``, ``read``, ``exists``, ``walk``). "before" is the same code with the settled
record switched off (every reader sees watermark 0: a state read per epoch, as before
this change). Figures are printed, never asserted.

With ``--s3-sizes`` it also runs S3 on moto (127.0.0.1) and counts the HTTP requests of
the same run per operation (a botocore ``before-send`` hook on s3fs's client), and the
requests per epoch of one whole epoch (begin .. commit) plus that recovery run.

    PYTHONPATH=. .venv/bin/python bench/bench_log_scale.py [--sizes 10,400,10000] [--memory-sizes 10,400] \
        [--s3-sizes 10,2000]
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shutil
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

from airflow_seatunnel_ckpt.core import CheckpointConfig, CheckpointStore, Decision, Pipeline, codec, layout
from airflow_seatunnel_ckpt.core.models import BeginRecord, DecisionRecord
from airflow_seatunnel_ckpt.core.protocol import settled
from airflow_seatunnel_ckpt.core.protocol.restore import RestorePoint, RestoreSource
from airflow_seatunnel_ckpt.core.storage import Storage
from tests.core.epochs import Participant, prepare_participant

COUNTED = ("list_dir", "read", "exists", "walk")


def _backends(cls: type[Storage]) -> list[type[Storage]]:
    return [cls] + [sub for child in cls.__subclasses__() for sub in _backends(child)]


@contextlib.contextmanager
def counting() -> Iterator[Counter[str]]:
    """Count the store calls of every backend (their own overrides included)."""
    counts: Counter[str] = Counter()
    saved = []
    for cls in _backends(Storage):
        for name in COUNTED:
            if name in vars(cls):
                original = vars(cls)[name]
                saved.append((cls, name, original))

                def counted(self: Storage, *a: Any, _n: str = name, _o: Any = original, **kw: Any) -> Any:
                    counts[_n] += 1
                    return _o(self, *a, **kw)

                setattr(cls, name, counted)
    try:
        yield counts
    finally:
        for cls, name, original in saved:
            setattr(cls, name, original)


@contextlib.contextmanager
def without_settled_record() -> Iterator[None]:
    """The code before the settled watermark: every reader sees none, nobody writes one."""
    read, advance = settled.SettledLog.read, settled.SettledLog.advance
    settled.SettledLog.read = lambda self: settled.SettledRead(settled.EMPTY, 0, [])  # type: ignore[method-assign]
    settled.SettledLog.advance = lambda self, *args: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        settled.SettledLog.read, settled.SettledLog.advance = read, advance  # type: ignore[method-assign]


def build(url: str, epochs: int) -> Pipeline:
    """``epochs`` settled epochs written record by record, then two real committed epochs."""
    return build_on(url, {}, epochs)


def real_epoch(p: Pipeline, run_id: str) -> int:
    """One real epoch: begin, a participant with a staged sink and a checkpoint, decide, commit."""
    epoch = p.begin(run_id).epoch
    prepare_participant(p, run_id, Participant(), base=RestorePoint(None, RestoreSource.EMPTY), epoch=epoch)
    p.decide(epoch, Decision.COMMIT, "ok", by="bench")
    p.commit(epoch)
    return epoch


def build_on(url: str, options: dict[str, Any], epochs: int) -> Pipeline:
    """:func:`build` on a store that takes ``options``."""
    config = CheckpointConfig.from_mapping({"storage_url": url, "storage_options": options, "max_retain": 1})
    p = CheckpointStore(config).pipeline("orders")

    def put(epoch: int, name: str, payload: dict[str, Any]) -> None:
        p.storage.create_exclusive(layout.record_path(epoch, name), codec.encode_json(payload))

    for e in range(1, epochs + 1):
        put(e, "begin", BeginRecord(e, f"run-{e}", 1.0).to_dict())
        commit = e % 7 != 0
        decision = Decision.COMMIT if commit else Decision.ABORT
        put(e, "decision", DecisionRecord(e, decision, "history", "bench", 1.0).to_dict())
        if commit:
            put(e, "committed", {"type": "committed", "epoch": e, "at": 1.0, "published": []})
            put(e, "retired", {"type": "retired", "epoch": e, "at": 1.0})
        else:
            put(e, "aborted", {"type": "aborted", "epoch": e, "at": 1.0})
    for i in range(2):
        real_epoch(p, f"real-{i}")
    return p


def measure(url: str, epochs: int, before: bool) -> tuple[float, Counter[str]]:
    """Seconds and store calls of the second recover+retain run on a fresh store."""
    p = build(url, epochs)
    guard = without_settled_record() if before else contextlib.nullcontext()
    with guard:
        p.recover(dry_run=False)
        p.retain()  # the first run: settles the history (after only)
        with counting() as counts:
            start = time.perf_counter()
            p.recover(dry_run=False)
            p.retain()
            took = time.perf_counter() - start
    return took, counts


def s3_requests(sizes: list[int]) -> None:
    """Requests of one recover+retain run (and of one more epoch) on moto, settled watermark on and off."""
    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    options = {"key": "testing", "secret": "testing",
               "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"}}
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    print(f"\n{'s3 (moto)':10} {'epochs':>7} {'mode':6} {'recover+retain requests':>24}  {'one epoch + recovery':>21}"
          "  by operation (recover+retain)")
    try:
        for n in sizes:
            for before in (True, False):
                bucket = f"bench-{uuid.uuid4().hex[:16]}"
                boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
                url = f"s3://{bucket}/root/store"
                p = build_on(url, options, n)
                counts: Counter[str] = Counter()
                client = p.storage.fs.s3
                client.meta.events.register(
                    "before-send.s3",
                    lambda event_name, _c=counts, **kw: _c.update([event_name.rsplit(".", 1)[-1]]))
                guard = without_settled_record() if before else contextlib.nullcontext()
                with guard:
                    p.recover(dry_run=False)
                    p.retain()
                    counts.clear()
                    p.recover(dry_run=False)
                    p.retain()
                    run = sum(counts.values())
                    by_op = dict(counts.most_common())
                    counts.clear()
                    real_epoch(p, "one-more")
                    p.recover(dry_run=False)
                    per_epoch = sum(counts.values())
                mode = "before" if before else "after"
                print(f"{'':10} {n:>7} {mode:6} {run:>24}  {per_epoch:>21}  {by_op}", flush=True)
    finally:
        server.stop()


def main() -> None:
    """Print one line per backend, size and mode, then the after/before ratios."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10,400,10000", help="settled epochs on file://")
    ap.add_argument("--memory-sizes", default="10,400", help="settled epochs on memory:// (its listings scan "
                    "the whole process-wide store, so 'before' grows quadratically there)")
    ap.add_argument("--s3-sizes", default="", help="settled epochs on S3 (moto on 127.0.0.1), e.g. 10,2000")
    args = ap.parse_args()
    real_fsync = os.fsync
    os.fsync = lambda fd: None  # building thousands of records is not what is measured
    print(f"{'backend':8} {'epochs':>7} {'mode':6} {'seconds':>9} {'list_dir':>9} {'read':>6} {'exists':>7} "
          f"{'walk':>5}")
    work = tempfile.mkdtemp(prefix="bench-log-scale-")
    try:
        for backend, sizes in (("file", args.sizes), ("memory", args.memory_sizes)):
            for n in [int(x) for x in sizes.split(",") if x]:
                result = {}
                for before in (True, False):
                    # One root per try: the published targets live next to the store.
                    root_url = (f"file://{work}/{uuid.uuid4().hex}" if backend == "file"
                                else f"memory://bench-{uuid.uuid4().hex}")
                    url = f"{root_url}/store"
                    took, c = measure(url, n, before)
                    result[before] = took
                    mode = "before" if before else "after"
                    print(f"{backend:8} {n:>7} {mode:6} {took:>9.4f} {c['list_dir']:>9} {c['read']:>6} "
                          f"{c['exists']:>7} {c['walk']:>5}", flush=True)
                    if backend == "memory":
                        root = CheckpointStore(CheckpointConfig.from_mapping({"storage_url": root_url})).storage
                        root.delete("", recursive=True)  # memory listings scan every file left
                print(f"{'':8} {n:>7} ratio after/before {result[False] / result[True]:.3f}", flush=True)
        if args.s3_sizes:
            s3_requests([int(x) for x in args.s3_sizes.split(",") if x])
    finally:
        os.fsync = real_fsync
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
