"""Epoch checkpoints in the SeaTunnel layout: write parts, complete, verify, restore.

A checkpoint is complete once ``checkpoint_<e>/_metadata`` exists (written last, exclusively,
by the commit decision); it lists every part it needs, older checkpoints' included.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from airflow_seatunnel_ckpt.core import codec, layout
from airflow_seatunnel_ckpt.core.errors import AlreadyExistsError, CorruptCheckpointError
from airflow_seatunnel_ckpt.core.models import CheckpointMetadata, PartKind, PartRef, decode
from airflow_seatunnel_ckpt.core.state.parts import (  # part I/O, re-exported for the modules that read checkpoints
    TOMBSTONE,
    apply_delta,
    check_part,
    key_array,
    read_arrow_part,
    read_json_part,
    read_part,
    write_arrow_part,
    write_json_part,
    write_part,
)
from airflow_seatunnel_ckpt.core.storage import Storage

__all__ = [
    "TOMBSTONE", "CheckpointManager", "Problem", "apply_delta", "check_part", "key_array", "needs_full",
    "read_arrow_part", "read_chain", "read_json_part", "read_part", "same_part", "write_arrow_part",
    "write_json_part", "write_part",
]


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a checkpoint: which file and what."""

    path: str
    what: str

    def __str__(self) -> str:
        return f"{self.path}: {self.what}"


def read_chain(storage: Storage, chain: list[PartRef], key_columns: list[str]) -> Any:
    """Restore one key group: read its parts oldest first, each upserting the ones before.

    Sorted runs and parts read whole may mix; a FULL part only comes first, and a chain of
    runs may start with a DELTA (its older runs expired under a TTL).
    """
    from airflow_seatunnel_ckpt.core.state.runs import EPOCH_COLUMN, read_run_table

    if not chain:
        raise ValueError("a key group chain needs at least one part")
    whole_start = chain[0].index is None and chain[0].kind is not PartKind.FULL
    if whole_start or any(p.kind is not PartKind.DELTA for p in chain[1:]):
        where = storage.describe_path(chain[0].path)
        raise CorruptCheckpointError(f"{where}: chain must be one full part followed by deltas", where)

    def read(ref: PartRef) -> Any:
        return read_arrow_part(storage, ref) if ref.index is None else read_run_table(storage, ref)

    table = read(chain[0])
    if TOMBSTONE in table.column_names:
        import pyarrow.compute as pc

        table = table.filter(pc.invert(pc.fill_null(table.column(TOMBSTONE), False))).drop_columns([TOMBSTONE])
    for ref in chain[1:]:
        table = apply_delta(table, read(ref), key_columns)
    return table.drop_columns([EPOCH_COLUMN]) if EPOCH_COLUMN in table.column_names else table


def same_part(trusted: PartRef | None, ref: PartRef) -> bool:
    """Whether ``ref`` names exactly the bytes of the ``trusted`` reference (same path, size and CRC32C)."""
    return (trusted is not None and trusted.path == ref.path and trusted.size == ref.size
            and trusted.crc32c == ref.crc32c)


def needs_full(chain: list[PartRef], incremental: bool, full_checkpoint_interval: int) -> bool:
    """Whether the next change to a key group must be written in full.

    Runs are bounded by compaction; ``full_checkpoint_interval`` bounds a chain holding parts
    read whole (a source chain, a rescaled state).
    """
    if not incremental or not chain:
        return True
    read_whole = any(p.index is None for p in chain)
    return read_whole and len(chain) >= full_checkpoint_interval


class CheckpointManager:
    """The ``checkpoint_<epoch>`` directories of one pipeline."""

    def __init__(self, storage: Storage, max_chunk: int = codec.DEFAULT_MAX_CHUNK) -> None:
        self.storage = storage
        self._max_chunk = max_chunk

    def epochs(self) -> list[int]:
        """Epochs that have a checkpoint directory (complete or not), ascending."""
        out = [layout.parse_checkpoint_dir(n) for n in self.storage.list_dir("")]
        return sorted(e for e in out if e is not None)

    def complete(self, meta: CheckpointMetadata) -> CheckpointMetadata:
        """Write ``_metadata`` exclusively; returns the stored one if another writer won."""
        try:
            self.storage.create_exclusive(layout.metadata_path(meta.epoch), codec.encode_json(meta.to_dict()))
            return meta
        except AlreadyExistsError:
            return self.read_metadata(meta.epoch)

    def read_metadata(self, epoch: int, storage: Storage | None = None) -> CheckpointMetadata:
        """Read and verify ``_metadata`` (CorruptCheckpointError if absent or damaged)."""
        storage = storage or self.storage
        path = layout.metadata_path(epoch)
        where = storage.describe_path(path)
        try:
            data = storage.read(path)
        except FileNotFoundError:
            raise CorruptCheckpointError(f"{where}: _metadata is missing (checkpoint incomplete)", where) from None
        meta = decode(CheckpointMetadata, codec.decode_json_payload(data, where, max_chunk=self._max_chunk), where)
        if meta.epoch != epoch:
            raise CorruptCheckpointError(f"{where}: _metadata is for epoch {meta.epoch}, expected {epoch}", where)
        return meta

    def has_metadata(self, epoch: int) -> bool:
        """Whether ``_metadata`` exists (the checkpoint was completed)."""
        return self.storage.exists(layout.metadata_path(epoch))

    def verify_parts(self, parts: Iterable[PartRef], deep: bool = False, storage: Storage | None = None,
                     trusted: Mapping[str, PartRef] | None = None, decode: bool = True) -> list[Problem]:
        """Check that each part exists with its recorded size (and, if ``deep``, CRC32C + frame).

        ``deep`` reads each part whole, ``storage.read_concurrency`` at a time, and decodes its
        frame with ``decode``, else only checks it (:func:`codec.check_frame`, what the commit
        decision uses). A part ``trusted`` (:meth:`covered_parts`) with the same size and CRC32C
        is not read again.
        """
        storage = storage or self.storage
        todo = [ref for ref in parts if trusted is None or not same_part(trusted.get(ref.path), ref)]

        def check(ref: PartRef) -> Problem | None:
            where = storage.describe_path(ref.path)
            if deep:
                try:
                    if decode:
                        read_part(storage, ref, self._max_chunk)
                    else:
                        check_part(storage, ref, self._max_chunk)
                except CorruptCheckpointError as exc:
                    return Problem(exc.path or where, str(exc).split(": ", 1)[-1])
                return None
            try:
                size = storage.size(ref.path)
            except FileNotFoundError:
                return Problem(where, "missing")
            return None if size == ref.size else Problem(where, f"size is {size} bytes, expected {ref.size}")

        if deep and len(todo) > 1 and storage.read_concurrency > 1:
            with ThreadPoolExecutor(min(storage.read_concurrency, len(todo)), "verify-part") as pool:
                found = list(pool.map(check, todo))
        else:
            found = [check(ref) for ref in todo]
        return [p for p in found if p is not None]

    def covered_parts(self, epochs: Iterable[int]) -> dict[str, PartRef]:
        """Every part the ``_metadata`` of committed checkpoints ``epochs`` lists, by path.

        The commit decision checked each of them once (a committed checkpoint's new parts,
        and by induction the older ones it lists); an unreadable ``_metadata`` covers nothing.
        """
        covered: dict[str, PartRef] = {}
        for epoch in sorted(set(epochs)):
            try:
                meta = self.read_metadata(epoch)
            except CorruptCheckpointError:
                continue
            covered.update((p.path, p) for p in meta.parts())
        return covered

    def verify(self, epoch: int, deep: bool = True, storage: Storage | None = None,
               decode: bool = True) -> list[Problem]:
        """Every problem with checkpoint ``epoch`` ([] means it restores correctly; ``deep`` and
        ``decode`` as :meth:`verify_parts`)."""
        try:
            meta = self.read_metadata(epoch, storage)
        except CorruptCheckpointError as exc:
            return [Problem(exc.path, str(exc).split(": ", 1)[-1])]
        return self.verify_parts(meta.parts(), deep=deep, storage=storage, decode=decode)

    def deletable(self, epoch: int, keep: Iterable[str] = ()) -> list[str]:
        """The files :meth:`delete` would remove from checkpoint ``epoch`` (changes nothing)."""
        keep_set = set(keep)
        root = layout.checkpoint_dir(epoch)
        return [path for path in (f"{root}/{f.path}" for f in self.storage.walk(root, include_temp=True))
                if path not in keep_set]

    def delete(self, epoch: int, keep: Iterable[str] = ()) -> list[str]:
        """Remove checkpoint ``epoch``'s files except those in ``keep`` (the directory too if it keeps
        none); returns what was removed."""
        keep_set = set(keep)
        root = layout.checkpoint_dir(epoch)
        files = [f"{root}/{f.path}" for f in self.storage.walk(root, include_temp=True)]
        if not keep_set.intersection(files):
            self.storage.delete(root, recursive=True)
            return files
        removed = [path for path in files if path not in keep_set]
        for path in removed:
            self.storage.delete(path)
        return removed
