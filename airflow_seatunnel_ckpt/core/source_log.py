"""Source chains: what every committed epoch consumed, as checkpoint parts.

A source's chain holds the offsets of every committed epoch up to the checkpoint's: a
full part with all of them, then one delta part per later epoch, bounded by
``full_checkpoint_interval`` like keyed state. Restore reads the chain back as the
source's history, and a source plans its next input from that history.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from airflow_seatunnel_ckpt.core import codec, layout
from airflow_seatunnel_ckpt.core.checkpoint import needs_full, read_json_part, write_json_part
from airflow_seatunnel_ckpt.core.config import CheckpointConfig
from airflow_seatunnel_ckpt.core.errors import StorageError
from airflow_seatunnel_ckpt.core.models import PartRef, SourceState
from airflow_seatunnel_ckpt.core.storage import Storage

#: One committed epoch's entry in a source's history: ``{"epoch": e, "offsets": {...}}``.
Entry = dict[str, Any]


def read_history(storage: Storage, chain: list[PartRef]) -> list[Entry]:
    """Every committed offsets entry of a source chain, oldest first."""
    entries: list[Entry] = []
    for ref in chain:
        doc = read_json_part(storage, ref)
        items = doc.get("entries") if isinstance(doc, dict) else None
        if not isinstance(items, list):
            raise StorageError(f"{storage.describe_path(ref.path)}: source part has no 'entries' list")
        entries.extend(items)
    return entries


def codec_options(config: CheckpointConfig) -> dict[str, Any]:
    """How parts are compressed under ``config``."""
    return {"level": config.compression_level,
            "compression": codec.Codec.ZSTD if config.compression == "zstd" else codec.Codec.LZ4}


def write_source_part(storage: Storage, config: CheckpointConfig, epoch: int, attempt: int, source: str,
                      offsets: dict[str, Any], base_chain: list[PartRef], rebuilt: bool,
                      history: Callable[[], list[Entry]]) -> SourceState:
    """Append this epoch's offsets to the source's chain: a delta part, or a full one.

    ``base_chain`` is the source's chain at the restore point; ``rebuilt`` says that the
    restore point rebuilt the source's history from the log, so there is no chain to
    extend. ``history`` (the restore point's entries) is read only when a full part is
    written: no chain yet, a rebuilt history, or a chain at ``full_checkpoint_interval``.
    """
    entry = {"epoch": epoch, "offsets": offsets}
    path = layout.part_path(epoch, "sources", source, 0, attempt)
    options = codec_options(config)
    if rebuilt or needs_full(base_chain, config.incremental, config.full_checkpoint_interval):
        ref = write_json_part(storage, path, {"entries": [*history(), entry]}, epoch=epoch, **options)
        return SourceState(offsets, [ref])
    ref = write_json_part(storage, path, {"entries": [entry]}, epoch=epoch, delta=True,
                          base_epoch=base_chain[-1].epoch, **options)
    return SourceState(offsets, [*base_chain, ref])
