"""The checkpoint's marker files: ``sinks/<sink>/_prepared`` and ``sources/<source>/_meta``.

They restate a prepared record inside the checkpoint directory (the staged files of
each sink, the chain of each source), so a checkpoint can be read without the log.
Their bytes are derived from the prepared record alone, so rewriting them after a crash
is harmless; the record itself is the fence. ``_metadata`` references them like any part,
so ``verify`` checks them.
"""

from __future__ import annotations

from typing import Any

from airflow_seatunnel_ckpt.core import codec, layout
from airflow_seatunnel_ckpt.core.models import PartRef, PreparedRecord
from airflow_seatunnel_ckpt.core.storage import Storage


def _write(storage: Storage, path: str, doc: dict[str, Any], epoch: int) -> PartRef:
    data = codec.encode_json(doc)
    storage.write_atomic(path, data)
    return PartRef(path, len(data), codec.crc32c(data), epoch)


def write_markers(storage: Storage, record: PreparedRecord) -> tuple[dict[str, PartRef], dict[str, PartRef]]:
    """Write the markers of ``record``; returns their references (by sink, by source)."""
    sinks = {
        sink.sink: _write(storage, layout.sink_marker_path(record.epoch, sink.sink),
                          {"type": "sink_prepared", "epoch": record.epoch, "participant": record.participant,
                           "attempt": record.attempt, "manifest": sink.to_dict()}, record.epoch)
        for sink in record.sinks}
    sources = {
        source: _write(storage, layout.source_meta_path(record.epoch, source),
                       {"type": "source_meta", "epoch": record.epoch, "source": source,
                        "attempt": record.attempt, "chain": [p.to_dict() for p in state.chain]}, record.epoch)
        for source, state in record.sources.items()}
    return sinks, sources
