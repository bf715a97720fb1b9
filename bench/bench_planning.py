"""Planning a file source with a long history: the consumed-file index vs the entries shape.

A pipeline that consumed 100 files an hour for 10,000 hours has 1,000,000 consumed files
in its source history. This bench builds that history twice on a local store, through
the core's own writers:

* **index** -- the consumed-file index (``core/sources/files.py``): a compacted base of
  sorted segments plus 9 per-epoch deltas (the worst point of a 10-epoch compaction
  cycle), written by ``source_log.write_source_part``;
* **entries (main)** -- the shape before the index: one JSON part with every epoch's
  ``{"files", "identity"}`` entry, as the full part that was rewritten every 10 epochs.

The input directory holds the current day only (``dt=<day>/hour=<h>/part-<n>.csv``): the
hours of the day consumed so far and 100 new files in the current hour. Each side then
plans the next epoch, as the runner does, in a fresh process:

* index: ``FileSource(prefixes=["dt=<day>/"]).plan_from(restore point)``: directory,
  deltas, the segments covering the listed names, the listing of one day;
* entries: main's ``plan``: read the whole history, build the consumed set, list the
  directory, compare (reimplemented here as main had it, so the baseline runs on the
  same code base). The directory holds one day only, so main's listing here costs what
  the prefix-bounded one does: the baseline is *understated* (on main the listing
  covers every day ever delivered).

Printed per side: planning wall time (best of ``--repeat``), the peak of Python
allocations during planning (tracemalloc, a separate run) and the growth of the process's
peak RSS over its RSS before planning; then the ratios index / entries. Also, for
information, what the writer costs: a delta epoch and a compaction epoch.

    python bench/bench_planning.py [--files 1000000] [--per-epoch 100] [--repeat 3]

Targets (issue 12): planning with 1,000,000 consumed and 100 new files < 1 s and < 200 MB.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

from airflow_seatunnel_ckpt.core import CheckpointConfig, layout
from airflow_seatunnel_ckpt.core.models import PartRef
from airflow_seatunnel_ckpt.core.sources.source_log import INDEX_KEY, codec_options, write_source_part
from airflow_seatunnel_ckpt.core.state.checkpoint import write_json_part
from airflow_seatunnel_ckpt.core.storage import open_storage

HOUR = 3600.0
SOURCE = "in"


def file_name(epoch: int, n: int) -> str:
    """The n-th file of the epoch (one epoch per hour, named by day and hour)."""
    return f"dt={epoch // 24:05d}/hour={epoch % 24:02d}/part-{n:05d}.csv"


def entry(epoch: int, per_epoch: int) -> dict[str, Any]:
    """The epoch's offsets entry: its files with (size, mtime) identities."""
    files = [file_name(epoch, n) for n in range(per_epoch)]
    return {"epoch": epoch, "offsets": {"files": files,
                                        "identity": {f: {"size": 4, "mtime": epoch * HOUR} for f in files}}}


def build(root: Path, files: int, per_epoch: int) -> dict[str, Any]:
    """Both histories in one store, and the input directory of the current day."""
    storage = open_storage(f"file://{root / 'store'}")
    config = CheckpointConfig.from_mapping({"storage_url": f"file://{root / 'store'}"})
    epochs = files // per_epoch
    entries = [entry(e, per_epoch) for e in range(1, epochs + 1)]
    # Main's shape: the full part with every entry.
    legacy = write_json_part(storage, layout.part_path(epochs, "sources", "legacy", 0, 1),
                             {"entries": entries}, epoch=epochs, **codec_options(config))
    # The index: a base converted at epoch epochs-9, then 9 delta epochs.
    base_epoch = epochs - 9
    marker = {INDEX_KEY: {"max_file_age": None}}
    state = write_source_part(storage, config, base_epoch, 1, SOURCE, {**entries[base_epoch - 1]["offsets"], **marker},
                              [], True, lambda: entries[:base_epoch - 1])
    chain = state.chain
    for e in range(base_epoch + 1, epochs + 1):
        chain = write_source_part(storage, config, e, 1, SOURCE, {**entries[e - 1]["offsets"], **marker},
                                  chain, False, lambda: []).chain
    # The input directory: the current day's consumed hours, and 100 new files.
    now = epochs + 1
    day_start = now - now % 24
    inputs = root / "in"
    for e in range(day_start, now + 1):
        for n in range(per_epoch):
            path = inputs / file_name(e, n)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("x\n1\n")
            os.utime(path, (e * HOUR, e * HOUR))
    on_disk = (now - day_start + 1) * per_epoch
    return {"store": f"file://{root / 'store'}", "inputs": f"file://{inputs}", "day": f"dt={now // 24:05d}/",
            "legacy": legacy.to_dict(), "chain": [r.to_dict() for r in chain], "epochs": epochs,
            "on_disk": on_disk, "config": config, "storage": storage, "now": now}


def main_plan(source: Any, history: list[dict[str, Any]]) -> dict[str, Any]:
    """main's ``FileSource.plan``: the consumed set from every entry, then the listing."""
    consumed: dict[str, Any] = {}
    for item in history:
        offsets = item.get("offsets") or {}
        identity = offsets.get("identity") or {}
        for f in offsets.get("files", []):
            consumed[f] = identity.get(f)
    listing = source.list_identities()
    changed = sorted(f for f, ident in listing.items() if consumed.get(f) is not None and consumed[f] != ident)
    new = [f for f in sorted(listing) if f not in consumed or f in changed]
    return {"files": new, "identity": {f: listing[f] for f in new}}


def measure(side: str, setup: dict[str, Any], repeat: int) -> dict[str, Any]:
    """Plan once per repeat (best time), then once under tracemalloc; in this process."""
    from airflow_seatunnel_ckpt.core.protocol.restore import RestorePoint, RestoreSource
    from airflow_seatunnel_ckpt.core.sources.source_log import read_history
    from airflow_seatunnel_ckpt.spark.sources.files import FileSource

    storage = open_storage(setup["store"])
    if side == "index":
        point = RestorePoint(setup["epochs"], RestoreSource.PRIMARY, storage, {},
                             {SOURCE: [PartRef.from_dict(r) for r in setup["chain"]]})
        source = FileSource(SOURCE, setup["inputs"], format="csv", prefixes=[setup["day"]])

        def plan() -> dict[str, Any]:
            return source.plan_from(point)
    else:
        legacy = [PartRef.from_dict(setup["legacy"])]
        source = FileSource(SOURCE, setup["inputs"], format="csv")

        def plan() -> dict[str, Any]:
            return main_plan(source, read_history(storage, legacy))

    # What planning imports is loaded first: the RSS growth is planning's data, not modules.
    import fsspec.implementations.local  # noqa: F401
    import pyarrow.compute  # noqa: F401

    rss_before = _rss_bytes()
    times = []
    result: dict[str, Any] = {}
    for _ in range(repeat):
        started = time.perf_counter()
        result = plan()
        times.append(time.perf_counter() - started)
    peak_rss = _peak_rss_bytes()
    tracemalloc.start()
    plan()
    _, traced = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {"seconds": min(times), "traced": traced, "rss_growth": max(0, peak_rss - rss_before),
            "planned": len(result["files"])}


def _peak_rss_bytes() -> int:
    """This process's peak RSS (VmHWM: unlike ``ru_maxrss``, not inherited from the parent
    that forked it, which built the million-file history)."""
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def _rss_bytes() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def writer_costs(setup: dict[str, Any], per_epoch: int) -> tuple[float, float]:
    """Seconds to write one delta epoch and one compaction epoch onto the index chain."""
    storage, config = setup["storage"], setup["config"]
    chain = [PartRef.from_dict(r) for r in setup["chain"]]
    now = setup["now"]
    marker = {INDEX_KEY: {"max_file_age": None}}
    compact_config = CheckpointConfig.from_mapping({"storage_url": setup["store"], "full_checkpoint_interval": 2})
    started = time.perf_counter()
    write_source_part(storage, compact_config, now, 1, SOURCE, {**entry(now, per_epoch)["offsets"], **marker},
                      chain[:-8], False, lambda: [])
    compaction = time.perf_counter() - started
    started = time.perf_counter()
    write_source_part(storage, config, now, 2, SOURCE, {**entry(now, per_epoch)["offsets"], **marker},
                      chain[:-1], False, lambda: [])
    return time.perf_counter() - started, compaction


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=1_000_000, help="consumed files in the history")
    parser.add_argument("--per-epoch", type=int, default=100, help="files per epoch (and new files)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--measure", choices=["index", "entries"], help=argparse.SUPPRESS)
    parser.add_argument("--setup", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:  # the child process: one side, fresh interpreter
        print(json.dumps(measure(args.measure, json.loads(Path(args.setup).read_text()), args.repeat)))
        return
    root = Path(tempfile.mkdtemp(prefix="seatunnel-ckpt-bench-planning-"))
    try:
        started = time.perf_counter()
        setup = build(root, args.files, args.per_epoch)
        print(f"setup: {setup['epochs']:,} epochs x {args.per_epoch} files = {args.files:,} consumed, "
              f"{setup['on_disk']:,} files of the current day on disk ({time.perf_counter() - started:.1f} s)")
        delta_s, compaction_s = writer_costs(setup, args.per_epoch)
        saved = root / "setup.json"
        saved.write_text(json.dumps({k: v for k, v in setup.items() if k not in ("config", "storage")}))
        figures = {}
        for side in ("index", "entries"):
            out = subprocess.run([sys.executable, __file__, "--measure", side, "--setup", str(saved),
                                  "--repeat", str(args.repeat)], check=True, capture_output=True, text=True)
            figures[side] = json.loads(out.stdout.strip().splitlines()[-1])
        mb = 1024 * 1024
        print(f"{'side':<16}{'plan s':>10}{'traced MB':>12}{'RSS+ MB':>10}{'planned':>9}")
        for side, f in figures.items():
            print(f"{side:<16}{f['seconds']:>10.3f}{f['traced'] / mb:>12.1f}{f['rss_growth'] / mb:>10.1f}"
                  f"{f['planned']:>9}")
        index, entries = figures["index"], figures["entries"]
        ok_time = "ok" if index["seconds"] < 1 else "MISSED"
        ok_mem = "ok" if max(index["traced"], index["rss_growth"]) < 200 * mb else "MISSED"
        print(f"ratio index/entries: time {index['seconds'] / entries['seconds']:.4f}, "
              f"traced memory {index['traced'] / max(entries['traced'], 1):.4f}")
        print(f"target planning < 1 s: {ok_time} ({index['seconds']:.3f} s); "
              f"< 200 MB: {ok_mem} ({max(index['traced'], index['rss_growth']) / mb:.1f} MB)")
        print(f"writer (info): delta epoch {delta_s * 1000:.1f} ms, compaction epoch {compaction_s * 1000:.1f} ms")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
