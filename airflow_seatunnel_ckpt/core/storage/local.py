"""The local filesystem backend (``file://``): temp file + rename, ``link(2)``, fsync."""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from airflow_seatunnel_ckpt.core.config import redact_url
from airflow_seatunnel_ckpt.core.errors import StorageError
from airflow_seatunnel_ckpt.core.storage.base import (
    TEMP_PREFIX,
    Capabilities,
    Data,
    FileInfo,
    Storage,
    TempFiles,
    chunks,
    clean_relpath,
    refuse_password,
)


class LocalStorage(Storage):
    """The local filesystem: a record appears by a rename or a link of a fsynced temp file,
    and its directory is fsynced after, so a record reported written survives a power loss."""

    capabilities = Capabilities(conditional_create=True, atomic_rename_dir=True, checksum=None, temp_files=True)

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None) -> None:
        # fsspec reads ``file://host/x`` (and ``file://user:pw@host/x``) as the *relative*
        # path ``host/x``: a store would silently appear below the working directory, and a
        # password in the URL would become part of every path in every message.
        refuse_password(url)
        scheme, _, rest = url.partition("://")
        if rest and not rest.startswith("/"):
            raise StorageError(f"store URL {redact_url(url)} has a host or credentials part; a local store is "
                               f"{scheme}:///absolute/path")
        super().__init__(url, storage_options)

    # -- reads -------------------------------------------------------------------------
    def modified(self, path: str) -> float:
        with self._failing("reading the modification time of", path):
            return os.stat(self.full_path(path)).st_mtime

    def list_dir(self, path: str = "") -> list[str]:
        # os.scandir directly: fsspec's ls normalises every entry's path, which costs a
        # hundred milliseconds on a transaction log with ten thousand epochs.
        full = self.full_path(path)
        try:
            with os.scandir(full) as entries:
                return sorted(e.name for e in entries if not e.name.startswith(TEMP_PREFIX))
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as exc:
            raise StorageError(f"listing {self.describe_path(path)} failed: {exc}") from exc

    def walk(self, path: str = "", include_temp: bool = False) -> list[FileInfo]:
        # os.scandir for the same reason as list_dir: fsspec's find stats and normalises
        # every file through several layers, a few hundred ms for a 10,000-file output.
        out: list[FileInfo] = []
        with self._failing("walking", path, passed=(StorageError,)):
            for rel, entry in _files_below(self.full_path(path), ""):
                if include_temp or not entry.name.startswith(TEMP_PREFIX):
                    with contextlib.suppress(FileNotFoundError):  # removed while we listed
                        out.append(FileInfo(rel, entry.stat(follow_symlinks=False).st_size))
        return sorted(out, key=lambda f: f.path)

    def temp_files(self, path: str = "", *, now: float, older_than: float, recursive: bool = True,
                   prune: Callable[[str], bool] | None = None) -> TempFiles:
        # Every record and marker is written to a temp file first, then linked or renamed
        # into place (see _write_tmp): a writer killed in between leaves the temp file.
        stale: list[str] = []
        young = False
        rel = clean_relpath(path)
        with self._failing("looking for temp files below", rel, passed=(StorageError,)):
            for name, entry in _files_below(self.full_path(rel), f"{rel}/" if rel else "",
                                            lambda d: recursive and not (prune and prune(d))):
                if not entry.name.startswith(TEMP_PREFIX):
                    continue
                try:
                    age = now - entry.stat(follow_symlinks=False).st_mtime
                except FileNotFoundError:  # its writer finished, or another sweeper removed it
                    continue
                if age > older_than:
                    stale.append(name)
                else:
                    young = True
        return TempFiles(sorted(stale), young)

    # -- writes ------------------------------------------------------------------------
    def _write_tmp(self, full: str, data: Data) -> tuple[str, int]:
        os.makedirs(os.path.dirname(full), exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=TEMP_PREFIX, dir=os.path.dirname(full))
        written = 0
        try:
            with os.fdopen(fd, "wb") as fh:
                for chunk in chunks(data):
                    fh.write(chunk)
                    written += len(chunk)
                fh.flush()
                os.fsync(fh.fileno())
        except BaseException:
            _unlink_quietly(tmp)
            raise
        return tmp, written

    def _write_whole(self, full: str, data: Data) -> int:
        tmp, written = self._write_tmp(full, data)
        os.replace(tmp, full)
        fsync_dir(os.path.dirname(full))
        return written

    def _put_if_absent(self, full: str, data: bytes) -> None:
        # Write the whole content to a temp file, then hard-link it into place: link(2)
        # fails if the target exists, so exactly one creator wins and no reader can ever
        # see a partially written record.
        tmp, _ = self._write_tmp(full, data)
        try:
            os.link(tmp, full)
        finally:
            _unlink_quietly(tmp)
        fsync_dir(os.path.dirname(full))

    def _remove_quietly(self, full: str) -> None:
        _unlink_quietly(full)

    def _probe_dir(self) -> str:
        # The nearest directory that exists: the probe must not create the store's
        # directories (opening a sink's target must leave no trace until it publishes).
        directory = str(self.root)
        while not os.path.isdir(directory) and os.path.dirname(directory) != directory:
            directory = os.path.dirname(directory)
        return directory

    # -- moving files (publish) --------------------------------------------------------
    def rename_dir(self, src: str, dest: Storage, dst: str) -> bool:
        if not (dest.capabilities.atomic_rename_dir and type(dest.fs) is type(self.fs)):
            return False
        src_full, dst_full = self.full_path(src), dest.full_path(dst)
        if not os.path.isdir(src_full) or os.path.exists(dst_full):
            return False
        os.makedirs(os.path.dirname(dst_full), exist_ok=True)
        try:
            # One rename publishes every file at once, whatever their number.
            os.rename(src_full, dst_full)
        except OSError as exc:
            # ENOENT: a concurrent publisher renamed it first; EXDEV: another filesystem.
            if exc.errno in (errno.EXDEV, errno.ENOTEMPTY, errno.EEXIST, errno.ENOENT):
                return False
            raise StorageError(f"renaming {src_full} to {dst_full} failed: {exc}") from exc
        fsync_dir(os.path.dirname(dst_full))
        fsync_dir(os.path.dirname(src_full))
        return True


def _files_below(directory: str, prefix: str, descend: Callable[[str], bool] = lambda _: True,
                 ) -> Iterator[tuple[str, os.DirEntry[str]]]:
    """Every file below ``directory`` as (``prefix`` + its relative path, its entry), entering a
    subdirectory only if ``descend(prefix + its relative path)``."""
    try:
        entries = os.scandir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return
    with entries:
        for entry in entries:
            rel = prefix + entry.name
            if not entry.is_dir(follow_symlinks=False):
                yield rel, entry
            elif descend(rel):
                yield from _files_below(entry.path, rel + "/", descend)


def fsync_dir(directory: str) -> None:
    """Make the entries of ``directory`` (a rename or link into it) durable."""
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except FileNotFoundError:
        return  # removed meanwhile (a racing delete): nothing left to make durable
    try:
        os.fsync(fd)
    except OSError as exc:
        # Some filesystems cannot fsync a directory; their renames are as durable as they get.
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


def _unlink_quietly(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
