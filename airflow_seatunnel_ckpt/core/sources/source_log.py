"""Source chains: what every committed epoch consumed, as checkpoint parts.

A full part with every committed epoch's offsets, then one delta part per later epoch,
bounded by ``full_checkpoint_interval`` like keyed state; a file source's chain is a
consumed-file index (:mod:`.files`) instead. A chain in the entries shape is read as it is
and converted by the next epoch that writes one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from airflow_seatunnel_ckpt.core import codec, layout
from airflow_seatunnel_ckpt.core.config import CheckpointConfig
from airflow_seatunnel_ckpt.core.errors import CorruptCheckpointError, StorageError
from airflow_seatunnel_ckpt.core.models import PartRef, SourceState
from airflow_seatunnel_ckpt.core.sources import files as file_index
from airflow_seatunnel_ckpt.core.sources.files import FileIndex
from airflow_seatunnel_ckpt.core.state.checkpoint import (
    needs_full,
    read_arrow_part,
    read_json_part,
    write_arrow_part,
    write_json_part,
)
from airflow_seatunnel_ckpt.core.storage import Storage

#: One committed epoch's entry in a source's history: ``{"epoch": e, "offsets": {...}}``.
Entry = dict[str, Any]
#: The offsets key by which a source asks for a consumed-file index (see module docstring).
INDEX_KEY = "consumed_index"


def is_index_chain(chain: list[PartRef]) -> bool:
    """Whether a source chain is in the consumed-file index shape (known from its first
    part's name, without reading it)."""
    return bool(chain) and chain[0].path.endswith("-" + file_index.DIRECTORY_TOKEN)


def open_index(storage: Storage, chain: list[PartRef]) -> FileIndex:
    """The consumed-file index a source chain holds, in either shape (an index chain's segments are read only
    when a lookup needs them)."""
    if not is_index_chain(chain):
        where = storage.describe_path(chain[0].path) if chain else "<empty chain>"
        return FileIndex.from_table(file_index.rows_from_entries(_read_entries(storage, chain), where))
    where = storage.describe_path(chain[0].path)
    directory = file_index.parse_directory(read_json_part(storage, chain[0]), where)
    segments = directory.segments
    refs = {ref.path: ref for ref in chain[1:1 + len(segments)]}
    missing = [s.path for s in segments if s.path not in refs]
    if missing:
        raise CorruptCheckpointError(f"{where}: segment {missing[0]} is not in the source's chain", where)

    def loader(ref: PartRef) -> Any:
        return lambda: read_arrow_part(storage, ref)

    deltas = [read_arrow_part(storage, ref) for ref in chain[1 + len(segments):]]
    return FileIndex([(s, loader(refs[s.path])) for s in segments], deltas, directory.newest_mtime,
                     directory.aged_below, directory.max_file_age)


def read_history(storage: Storage, chain: list[PartRef]) -> list[Entry]:
    """Every committed offsets entry of a source chain, oldest first (for an index chain:
    the files inside the window, grouped by the epoch that consumed them)."""
    if is_index_chain(chain):
        return open_index(storage, chain).entries()
    return _read_entries(storage, chain)


def _read_entries(storage: Storage, chain: list[PartRef]) -> list[Entry]:
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
    """Append this epoch's offsets to the source's chain (``base_chain``, at the restore point): a delta part, or
    a full one of ``history`` (no chain yet, a history ``rebuilt`` from the log, or at the interval)."""
    if isinstance(offsets.get(INDEX_KEY), dict) or (is_index_chain(base_chain) and not rebuilt):
        return _write_index_part(storage, config, epoch, attempt, source, offsets, base_chain, rebuilt, history)
    entry = {"epoch": epoch, "offsets": offsets}
    path = layout.part_path(epoch, "sources", source, 0, attempt)
    options = codec_options(config)
    if rebuilt or needs_full(base_chain, config.incremental, config.full_checkpoint_interval):
        ref = write_json_part(storage, path, {"entries": [*history(), entry]}, epoch=epoch, **options)
        return SourceState(offsets, [ref])
    ref = write_json_part(storage, path, {"entries": [entry]}, epoch=epoch, delta=True,
                          base_epoch=base_chain[-1].epoch, **options)
    return SourceState(offsets, [*base_chain, ref])


def _write_index_part(storage: Storage, config: CheckpointConfig, epoch: int, attempt: int, source: str,
                      offsets: dict[str, Any], base_chain: list[PartRef], rebuilt: bool,
                      history: Callable[[], list[Entry]]) -> SourceState:
    """Append this epoch's files to a consumed-file index: a delta part, or a compacted base."""
    where = f"source {source!r} epoch {epoch}"
    # An epoch that did not read the source records {}: an empty delta, no ageing.
    max_file_age = (offsets.get(INDEX_KEY) or {}).get("max_file_age")
    if max_file_age is not None and (isinstance(max_file_age, bool) or not isinstance(max_file_age, (int, float))
                                     or max_file_age <= 0):
        raise CorruptCheckpointError(f"{where}: max_file_age must be a positive number of seconds, "
                                     f"got {max_file_age!r}", where)
    files = offsets.get("files", [])
    identity = offsets.get("identity") or {}
    if not isinstance(files, list) or not isinstance(identity, dict):
        raise CorruptCheckpointError(f"{where}: offsets have no file list: {offsets!r}", where)
    delta = file_index.rows_table((str(f), identity.get(f), epoch) for f in files)
    options = codec_options(config)
    deltas_so_far = len(base_chain) - 1 - _segment_count(storage, base_chain) if is_index_chain(base_chain) else 0
    convert = rebuilt or not is_index_chain(base_chain)
    if not convert and config.incremental and deltas_so_far + 1 < config.full_checkpoint_interval:
        path = layout.part_path(epoch, "sources", source, 0, attempt)
        ref = write_arrow_part(storage, path, delta, epoch=epoch, delta=True, base_epoch=base_chain[-1].epoch,
                               **options)
        return SourceState(offsets, [*base_chain, ref])
    # Compaction: the base, the deltas since, and this epoch's files, merged and aged. A
    # history in the entries shape (rebuilt from the log) is converted here.
    carried_refs = {ref.path: ref for ref in base_chain}
    if convert:
        index = FileIndex([], [file_index.rows_from_entries(history(), where), delta], None)
    else:
        prior = open_index(storage, base_chain)
        index = FileIndex(prior.segments, [*prior.deltas, delta], prior.newest_mtime, prior.aged_below,
                          prior.max_file_age)
    items, newest, aged_below = index.compact(max_file_age)
    # The age the window was last narrowed by (kept while no compaction ages any more).
    window_age = max_file_age if aged_below != index.aged_below else index.max_file_age
    segments: list[file_index.Segment] = []
    refs: list[PartRef] = []
    for number, item in enumerate(items):
        if isinstance(item, file_index.Segment):
            segments.append(item)
            refs.append(carried_refs[item.path])
            continue
        path = layout.part_path(epoch, "sources", source, 0, attempt, token=f"seg{number}")
        refs.append(write_arrow_part(storage, path, item, epoch=epoch, **options))
        segments.append(file_index.describe(item, path))
    directory = layout.part_path(epoch, "sources", source, 0, attempt, token=file_index.DIRECTORY_TOKEN)
    head = write_json_part(storage, directory, file_index.directory_doc(segments, newest, aged_below, window_age),
                           epoch=epoch, **options)
    return SourceState(offsets, [head, *refs])


def _segment_count(storage: Storage, chain: list[PartRef]) -> int:
    where = storage.describe_path(chain[0].path)
    return len(file_index.parse_directory(read_json_part(storage, chain[0]), where).segments)
