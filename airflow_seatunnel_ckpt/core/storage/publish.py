"""Placing staged files at a destination: exactly the files the commit decided on, once.

:func:`publish_files` is the copy machinery every sink shares (the steps are in
docs/STORAGE.md, "Publishing"); nothing at the destination is ever deleted.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from enum import StrEnum
from typing import TypeVar

from airflow_seatunnel_ckpt.core.errors import PublishError, StorageError
from airflow_seatunnel_ckpt.core.storage.base import BLOCK, FileInfo, Storage

T = TypeVar("T")

#: ``CheckpointConfig.publish_concurrency``'s default.
DEFAULT_CONCURRENCY = 8


class PublishMethod(StrEnum):
    """How a sink's files got to their place (the values are stored in ``committed`` records)."""

    RENAME = "renamed"
    COPY = "copied"
    ALREADY = "already"


def publish_files(source: Storage, src: str, target: Storage, dst: str, files: Iterable[FileInfo], *,
                  verify: bool = True,
                  concurrency: int = DEFAULT_CONCURRENCY) -> PublishMethod:
    """Make exactly ``files`` (relative to ``source:src``) present below ``target:dst``.

    Idempotent: files already at the destination with the expected size (and CRC32C) are
    kept. Raises :class:`PublishError` naming a file neither at the destination nor intact
    in staging. ``verify=False`` checks sizes only (the caller just checksummed the staging).
    One listing of the destination, then per file one request for its size and checksum
    and one copy (or one directory rename), ``concurrency`` at a time.
    """
    expected = list(files)
    # What the destination already has: a retry's or a concurrent publisher's copies.
    listed = {f.path: f.size for f in target.walk(dst)}
    same_size = [f for f in expected if listed.get(f.path) == f.size]
    kept = {f.path for f, ok in zip(same_size, _each(
        lambda f: holds(target, f"{dst}/{f.path}", f, verify), same_size, concurrency), strict=True) if ok}
    missing = [f for f in expected if f.path not in kept]
    if not missing:
        return PublishMethod.ALREADY
    problems = _each(lambda f: staged_problem(source, f"{src}/{f.path}", f, verify), missing, concurrency)
    for f, problem in zip(missing, problems, strict=True):
        # Re-check the destination: a concurrent publisher (a retry, the recovery DAG)
        # may have moved the staged file there since ``missing`` was computed.
        if problem and not holds(target, f"{dst}/{f.path}", f, verify):
            raise PublishError(
                f"cannot publish {target.describe_path(dst)}: staged file {source.describe_path(f'{src}/{f.path}')} "
                f"{problem}, and the destination does not hold it either. The epoch stays COMMITTING and "
                "nothing was deleted: put the file back as the manifest of the prepared record describes "
                "it (from a backup or the writer's retained output) and run the commit or recovery again")
    if len(missing) == len(expected) and source.capabilities.atomic_rename_dir and not target.exists(dst):
        # Only the manifest is published: the writer's own bookkeeping (Spark's empty
        # _SUCCESS, Hadoop .crc files) would otherwise move along with the directory.
        # (A copy publishes the manifest's files only; the staging goes as a whole later.)
        names = {f.path for f in expected}
        for f in source.walk(src, include_temp=True):
            if f.path not in names:
                source.delete(f"{src}/{f.path}")
        if source.rename_dir(src, target, dst):
            return PublishMethod.RENAME

    def copy(f: FileInfo) -> None:
        # No probe of the destination first: a copy over a concurrent publisher's copy of
        # the same verified staged bytes changes nothing a reader could see.
        try:
            copy_file(source, f"{src}/{f.path}", target, f"{dst}/{f.path}")
        except (FileNotFoundError, StorageError):
            # The staged file may be gone because a concurrent publisher finished first.
            if not holds(target, f"{dst}/{f.path}", f, verify):
                raise

    _each(copy, missing, concurrency)
    return PublishMethod.COPY


def _each(call: Callable[[FileInfo], T], files: Sequence[FileInfo], concurrency: int) -> list[T]:
    """``call`` on every file, up to ``concurrency`` at a time; results in order, the first error raised.

    Every call has finished (or failed) when this returns or raises: nothing keeps writing
    into the destination behind the caller's back.
    """
    if concurrency <= 1 or len(files) <= 1:
        return [call(f) for f in files]
    with ThreadPoolExecutor(max_workers=min(concurrency, len(files)), thread_name_prefix="publish") as pool:
        futures = [pool.submit(call, f) for f in files]
        wait(futures)
    return [future.result() for future in futures]


def holds(storage: Storage, path: str, f: FileInfo, verify: bool = True) -> bool:
    """Whether ``path`` has ``f``'s size and (with ``verify``, when known) its CRC32C."""
    return not staged_problem(storage, path, f, verify)


def staged_problem(storage: Storage, path: str, f: FileInfo, verify: bool = True) -> str:
    """What is wrong with the file at ``path`` against its manifest entry ("" = nothing)."""
    try:
        found = storage.file_info(path)
        if found.size != f.size:
            return f"is {found.size} bytes, the manifest says {f.size}"
        if verify and f.crc32c is not None:
            crc = found.crc32c if found.crc32c is not None else storage.checksum(path)
            if crc != f.crc32c:
                return (f"has CRC32C {crc:#010x}, the manifest says {f.crc32c:#010x} "
                        "(it changed after the commit decision)")
    except FileNotFoundError:
        return "is missing"
    return ""


def copy_file(src: Storage, src_path: str, dest: Storage, dst_path: str) -> None:
    """Copy one file between (possibly different) stores; the target appears whole."""
    same_store = src.fs is dest.fs or (src.protocol == dest.protocol and src.storage_options == dest.storage_options)
    if same_store:
        try:
            if dest._copy_in_store(src.full_path(src_path), dest.full_path(dst_path)):
                return
        except FileNotFoundError:
            raise
        except Exception as exc:
            raise PublishError(
                f"copying {src.describe_path(src_path)} to {dest.describe_path(dst_path)} failed: {exc}") from exc

    def stream() -> Iterator[bytes]:
        with src.open_read(src_path) as fh:
            while block := fh.read(BLOCK):
                yield block

    # Otherwise through write_atomic: a local copy would be written in place.
    dest.write_atomic(dst_path, stream())
