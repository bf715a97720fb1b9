"""Decoding the records that list part references: the pydantic models against a baseline.

The records of an epoch that list every part of every chain -- ``prepared-<participant>``
and ``checkpoint_<e>/_metadata`` -- are decoded from their JSON text by
:func:`models.decode` (strict pydantic dataclasses). The baseline is the hand-written
``from_dict`` of another checkout (``--baseline DIR``, e.g. ``git archive <rev> | tar -x -C
DIR``: its ``core/models.py`` is loaded beside this one) on ``json.loads`` of the same text.

1. **micro**: a ``_metadata`` of one keyed state with ``--groups`` key groups, each a chain
   of ``--chain`` runs (plus a source chain), decoded whole; microseconds per part reference.
2. **whole epoch**: a core epoch (``tests/core/epochs.py``: stage, prepare, decide, commit)
   is run with :func:`models.decode` counted; the records it decodes, at the sizes of (1),
   give the decode time an epoch spends with either decoder, against the epoch's wall time.

Every timing is the best of ``--repeat`` runs. Usage::

    python bench/bench_records.py --baseline /tmp/old [--groups 128 --chain 10] [--repeat 7]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from airflow_seatunnel_ckpt.core import CheckpointConfig, CheckpointStore, models
from airflow_seatunnel_ckpt.core.models import (
    CheckpointMetadata,
    OperatorState,
    PartKind,
    PartRef,
    SourceState,
    decode,
)


def best(repeat: int, fn: Callable[[], Any]) -> float:
    """The shortest of ``repeat`` timings of ``fn``."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def metadata_text(groups: int, chain: int) -> tuple[bytes, int]:
    """The JSON text of a ``_metadata`` with ``groups`` chains of ``chain`` runs; and its part count."""
    def ref(group: int, i: int) -> PartRef:
        return PartRef(f"checkpoint_{i + 1}/operators/seen/part-{group}-{i + 1}", 1_000_000 + i, 123456789 + i,
                       i + 1, group, PartKind.FULL if i == 0 else PartKind.DELTA, 999_000 + i)
    chains = {g: [ref(g, i) for i in range(chain)] for g in range(groups)}
    source = [PartRef(f"checkpoint_{i + 1}/sources/orders/part-{i + 1}", 4096, 42 + i, i + 1)
              for i in range(chain)]
    meta = CheckpointMetadata(chain, 1.0, "run", {"ingest": 1}, chain - 1,
                              {"seen": OperatorState(groups, ["k"], chains, "key_set")},
                              {"orders": SourceState({"files": []}, source)},
                              {"out": PartRef("checkpoint_1/sinks/out/_prepared", 100, 1, 1)})
    return json.dumps(meta.to_dict(), sort_keys=True).encode(), len(meta.parts())


def load_baseline(root: Path) -> Any:
    """The baseline checkout's ``core/models.py`` as a module of its own."""
    path = root / "airflow_seatunnel_ckpt" / "core" / "models.py"
    spec = importlib.util.spec_from_file_location("baseline_models", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["baseline_models"] = module
    spec.loader.exec_module(module)
    return module


def epoch_decodes(work: Path) -> tuple[Counter[str], float]:
    """The records one core epoch decodes (by type) and the epoch's wall time (best of 3)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.core.epochs import Participant, run_epoch

    counts: Counter[str] = Counter()
    original = models.decode

    def counted(cls: type, data: Any, where: str = "<record>") -> Any:
        counts[cls.__name__] += 1
        return original(cls, data, where)

    times = []
    pipeline = CheckpointStore(CheckpointConfig(storage_url=f"file://{work}/store")).pipeline("orders")
    run_epoch(pipeline, "warm-up", Participant(sources={"in": {"files": ["a"]}}))
    for i in range(3):
        counts.clear()
        for module in (models, sys.modules["airflow_seatunnel_ckpt.core.protocol.txlog"],
                       sys.modules["airflow_seatunnel_ckpt.core.state.checkpoint"]):
            module.decode = counted  # type: ignore[attr-defined]
        start = time.perf_counter()
        run_epoch(pipeline, f"run-{i}", Participant(sources={"in": {"files": [f"b{i}"]}}))
        times.append(time.perf_counter() - start)
        for module in (models, sys.modules["airflow_seatunnel_ckpt.core.protocol.txlog"],
                       sys.modules["airflow_seatunnel_ckpt.core.state.checkpoint"]):
            module.decode = original  # type: ignore[attr-defined]
    return counts, min(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, required=True, help="a checkout with the hand-written from_dict")
    parser.add_argument("--groups", type=int, default=128)
    parser.add_argument("--chain", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args(argv)
    old = load_baseline(args.baseline)
    text, parts = metadata_text(args.groups, args.chain)
    new_s = best(args.repeat, lambda: decode(CheckpointMetadata, text, "bench"))
    old_s = best(args.repeat, lambda: old.CheckpointMetadata.from_dict(json.loads(text), "bench"))
    assert [p.to_dict() for p in decode(CheckpointMetadata, text).parts()] == [
        p.to_dict() for p in old.CheckpointMetadata.from_dict(json.loads(text)).parts()]
    print(f"micro: _metadata of {parts} part references ({len(text):,} bytes of JSON)")
    print(f"  pydantic decode  {new_s * 1e3:8.2f} ms  {new_s / parts * 1e6:6.2f} us/part")
    print(f"  baseline         {old_s * 1e3:8.2f} ms  {old_s / parts * 1e6:6.2f} us/part  "
          f"(new / baseline {new_s / old_s:.2f})")
    with tempfile.TemporaryDirectory() as work:
        counts, epoch_s = epoch_decodes(Path(work))
    listing = counts["PreparedRecord"] + counts["CheckpointMetadata"]
    print(f"whole core epoch: {epoch_s * 1e3:.1f} ms; records decoded: {dict(sorted(counts.items()))}")
    print(f"  {listing} of them list every part: at {parts} parts each, pydantic {listing * new_s * 1e3:.2f} ms, "
          f"baseline {listing * old_s * 1e3:.2f} ms: difference {listing * (new_s - old_s) * 1e3:+.2f} ms an epoch")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
