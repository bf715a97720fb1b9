"""Storage: the handful of primitives the commit protocol needs, over any fsspec URL.

A :class:`Storage` is rooted at one URL; every method takes a path *relative* to that root
(``/``-separated, validated so it can never leave the root). The primitives are the ones
Spark's ``CheckpointFileManager`` and Flink's file sinks rely on:

* :meth:`Storage.read` / :meth:`Storage.open_read`
* :meth:`Storage.write_atomic` -- readers see the old file or the whole new one, never a part
* :meth:`Storage.create_exclusive` -- put-if-absent; exactly one concurrent caller wins
* :meth:`Storage.list_dir`, :meth:`Storage.walk`, :meth:`Storage.delete`
* :meth:`Storage.publish_dir` -- move staged output to its final place, in one rename where
  the store has atomic directory renames, by copy-then-mark elsewhere

Backends are registered by protocol name in the ``airflow_seatunnel_ckpt.storage``
entry-point group (the analogue of SeaTunnel's ``StateBackend`` service registration);
:func:`open_storage` picks one.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import posixpath
import re
import tempfile
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import IO, Any
from urllib.parse import urlsplit

import fsspec
from fsspec.core import url_to_fs

from airflow_seatunnel_ckpt.core.config import redact_url
from airflow_seatunnel_ckpt.core.errors import AlreadyExistsError, PublishError, StorageError

ENTRY_POINT_GROUP = "airflow_seatunnel_ckpt.storage"
#: Prefix of in-flight temporary files; listings hide them and GC removes stale ones.
TEMP_PREFIX = ".tmp-"

Data = bytes | bytearray | memoryview | Iterable[bytes]


@dataclass(frozen=True)
class FileInfo:
    """One file below a storage root: relative path, size in bytes, CRC32C when known."""

    path: str
    size: int
    #: Checksum of the whole file; set in sink manifests, None in plain listings.
    crc32c: int | None = field(default=None, compare=False)


_PASSWORD_ANYWHERE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^@/?#]*:(?!\d+(?:[/?#]|$))[^@]*@")


def refuse_password(url: str, what: str = "store URL") -> None:
    """Raise StorageError if ``url`` carries a password (``scheme://user:password@...``).

    Libraries below us (s3fs, botocore) would take it for part of a bucket or host name and
    put it into their own log lines and error messages, where no redaction can reach it.
    A user name alone (``abfs://container@account``) is fine.
    """
    try:
        password = urlsplit(url).password
    except ValueError:
        raise StorageError(f"{what} {redact_url(url)} is not a valid URL") from None
    # urlsplit ends the authority at the first "/", so it misses a secret holding one (AWS
    # secret keys do: "s3://KEY:abc/def@bucket"), and it misses chained URLs
    # ("simplecache::s3://KEY:SECRET@bucket"). A port ("host:8020/a@b") is not a password.
    if password is None and _PASSWORD_ANYWHERE.search(url):
        password = "?"
    if password is not None:
        raise StorageError(
            f"{what} {redact_url(url)} carries a password: pass credentials as storage options (or in "
            "the Airflow connection), never in a URL, where logs and error messages would show them")


def clean_relpath(path: str) -> str:
    """Normalise a relative store path and refuse anything that could escape the root."""
    if not isinstance(path, str):
        raise StorageError(f"store path must be a string, got {type(path).__name__}")
    if "\x00" in path or "\\" in path:
        raise StorageError(f"store path {path!r} contains a NUL byte or a backslash")
    if path.startswith("/"):
        raise StorageError(f"store path {path!r} must be relative to the store root")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise StorageError(f"store path {path!r} must not contain '..'")
    return "/".join(parts)


def _chunks(data: Data) -> Iterator[bytes]:
    if isinstance(data, (bytes, bytearray, memoryview)):
        yield bytes(data)
    else:
        for chunk in data:
            yield bytes(chunk)


# How often a recursive delete walks a tree again when a racing writer added to it.
_RACING_DELETE_RETRIES = 5


class Storage:
    """Generic fsspec-backed storage (memory://, hdfs://, ... ).

    ``write_atomic`` relies on the filesystem writing a whole file at close (true for
    object stores and the in-memory filesystem); :class:`LocalStorage` and
    :class:`ObjectStorage` refine the primitives for their stores.
    """

    #: Whether :meth:`publish_dir` can move a directory in one atomic rename.
    atomic_rename = False

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None) -> None:
        refuse_password(url)
        self.url = url.rstrip("/") if url not in ("/",) else url
        self.storage_options = dict(storage_options or {})
        try:
            fs, root = url_to_fs(self.url, **self.storage_options)
        except Exception as exc:  # fsspec raises many types for bad URLs/options
            raise StorageError(f"cannot open store {redact_url(url)}: {exc}") from exc
        self.fs: fsspec.AbstractFileSystem = fs
        self.root = root.rstrip("/") if root != "/" else root
        self.protocol = fs.protocol[0] if isinstance(fs.protocol, tuple) else fs.protocol

    # -- paths -------------------------------------------------------------------------
    def __repr__(self) -> str:
        return f"{type(self).__name__}({redact_url(self.url)!r})"

    def full_path(self, path: str) -> str:
        """The filesystem path (no protocol) of ``path`` below the root."""
        rel = clean_relpath(path)
        return f"{self.root}/{rel}" if rel else self.root

    def url_of(self, path: str) -> str:
        """The full URL of ``path`` (what Spark or another process should be given)."""
        rel = clean_relpath(path)
        return f"{self.url}/{rel}" if rel else self.url

    def describe_path(self, path: str) -> str:
        """The URL of ``path`` with credentials redacted: for messages and logs."""
        return redact_url(self.url_of(path))

    def child(self, path: str) -> Storage:
        """A storage of the same kind rooted at ``path`` below this one."""
        return type(self)(self.url_of(path), self.storage_options)

    def describe(self) -> str:
        """The root URL with credentials redacted."""
        return redact_url(self.url)

    def _err(self, what: str, path: str, exc: BaseException) -> StorageError:
        return StorageError(f"{what} {redact_url(self.url_of(path))} failed: {exc}")

    # -- reads -------------------------------------------------------------------------
    def read(self, path: str) -> bytes:
        """Whole content of the file at ``path``; FileNotFoundError if absent."""
        try:
            return bytes(self.fs.cat_file(self.full_path(path)))
        except FileNotFoundError:
            raise
        except Exception as exc:
            raise self._err("reading", path, exc) from exc

    def open_read(self, path: str) -> IO[bytes]:
        """A binary file object for streaming reads; FileNotFoundError if absent."""
        try:
            return self.fs.open(self.full_path(path), "rb")  # type: ignore[no-any-return]
        except FileNotFoundError:
            raise
        except Exception as exc:
            raise self._err("opening", path, exc) from exc

    def checksum(self, path: str) -> int:
        """CRC32C of the whole file at ``path``, streamed in blocks."""
        from airflow_seatunnel_ckpt.core.codec import crc32c

        crc = 0
        with self.open_read(path) as fh:
            while block := fh.read(8 * 1024 * 1024):
                crc = crc32c(block, crc)
        return crc

    def exists(self, path: str) -> bool:
        """Whether a file or directory exists at ``path``."""
        try:
            return bool(self.fs.exists(self.full_path(path)))
        except Exception as exc:
            raise self._err("checking", path, exc) from exc

    def size(self, path: str) -> int:
        """Size in bytes of the file at ``path``; FileNotFoundError if absent."""
        try:
            return int(self.fs.size(self.full_path(path)))
        except FileNotFoundError:
            raise
        except Exception as exc:
            raise self._err("sizing", path, exc) from exc

    def list_dir(self, path: str = "") -> list[str]:
        """Names of the direct children of directory ``path`` (sorted; [] if absent)."""
        full = self.full_path(path)
        try:
            entries = self.fs.ls(full, detail=False)
        except FileNotFoundError:
            return []
        except NotADirectoryError:
            return []
        except Exception as exc:
            raise self._err("listing", path, exc) from exc
        names = []
        for entry in entries:
            name = posixpath.basename(str(entry).rstrip("/"))
            if name and not name.startswith(TEMP_PREFIX) and str(entry).rstrip("/") != full.rstrip("/"):
                names.append(name)
        return sorted(set(names))

    def walk(self, path: str = "", include_temp: bool = False) -> list[FileInfo]:
        """Every file below ``path``, with paths relative to ``path`` (sorted)."""
        full = self.full_path(path)
        try:
            found = self.fs.find(full, detail=True)
        except FileNotFoundError:
            return []
        except Exception as exc:
            raise self._err("walking", path, exc) from exc
        out = []
        prefix = full.rstrip("/") + "/"
        for name, info in found.items():
            name = str(name)
            if info.get("type") == "directory" or not name.startswith(prefix):
                continue
            rel = name[len(prefix):]
            if not include_temp and posixpath.basename(rel).startswith(TEMP_PREFIX):
                continue
            out.append(FileInfo(rel, int(info.get("size") or 0)))
        return sorted(out, key=lambda f: f.path)

    # -- writes ------------------------------------------------------------------------
    def write_atomic(self, path: str, data: Data) -> int:
        """Write ``data`` so that readers never see a partial file. Returns bytes written."""
        full = self.full_path(path)
        written = 0
        try:
            self.fs.makedirs(posixpath.dirname(full), exist_ok=True)
            fh = self.fs.open(full, "wb")
            try:
                for chunk in _chunks(data):
                    fh.write(chunk)
                    written += len(chunk)
            except BaseException:
                # ``with fs.open(...)`` would close -- i.e. commit -- the partial file.
                _discard(fh)
                raise
            fh.close()
        except Exception as exc:
            raise self._err("writing", path, exc) from exc
        return written

    def create_exclusive(self, path: str, data: bytes) -> None:
        """Create ``path`` with ``data`` only if it does not exist (AlreadyExistsError if it does)."""
        full = self.full_path(path)
        try:
            self.fs.makedirs(posixpath.dirname(full), exist_ok=True)
            self.fs.pipe_file(full, bytes(data), mode="create")
        except FileExistsError as exc:
            raise AlreadyExistsError(f"{redact_url(self.url_of(path))} already exists") from exc
        except Exception as exc:
            raise self._err("creating", path, exc) from exc

    def delete(self, path: str, recursive: bool = False) -> None:
        """Remove the file or (with ``recursive``) directory at ``path``; absent is fine.

        A writer racing a recursive delete (a losing committer completing ``_metadata`` in a
        checkpoint an abort is removing) makes a local ``rmdir`` fail with "directory not
        empty"; the delete walks the tree again a few times, as an object store's delete of
        whatever it listed would simply succeed.
        """
        full = self.full_path(path)
        for attempt in range(_RACING_DELETE_RETRIES + 1):
            try:
                if self.fs.exists(full):
                    self.fs.rm(full, recursive=recursive)
                return
            except FileNotFoundError:
                return
            except OSError as exc:
                if recursive and exc.errno == errno.ENOTEMPTY and attempt < _RACING_DELETE_RETRIES:
                    time.sleep(0.01 * (attempt + 1))
                    continue
                raise self._err("deleting", path, exc) from exc
            except Exception as exc:
                raise self._err("deleting", path, exc) from exc

    # -- publish -----------------------------------------------------------------------
    def publish_dir(
        self, src: str, dest: Storage, dst: str, files: Iterable[FileInfo], *, verify: bool = True
    ) -> str:
        """Make every file of ``files`` (relative to ``src``) present below ``dest:dst``.

        Idempotent: files already at the destination with the expected size are kept.
        Returns how it was done: ``"renamed"``, ``"copied"`` or ``"already"``. Never deletes
        anything at the destination; raises :class:`PublishError` if a file is neither in
        staging nor at the destination (the staging was lost: the operator must look).

        ``verify=False`` lets a store with atomic directory renames move ``src`` without
        first checking each staged file's size (one rename, whatever the file count) --
        only for callers that verified the staging themselves since it was last written.
        Copying publishes always check every file.
        """
        expected = list(files)
        missing = [f for f in expected if not _has_file(dest, f"{dst}/{f.path}", f.size)]
        if not missing:
            return "already"
        for f in missing:
            # Re-check the destination: a concurrent publisher (a retry, the recovery DAG)
            # may have moved the staged file there since ``missing`` was computed.
            at_dest = _has_file(dest, f"{dst}/{f.path}", f.size)
            if not at_dest and not _has_file(self, f"{src}/{f.path}", f.size):
                raise PublishError(
                    f"cannot publish {redact_url(dest.url_of(dst))}: staged file "
                    f"{redact_url(self.url_of(src + '/' + f.path))} is missing or has the wrong size "
                    f"(expected {f.size} bytes) and is not at the destination either"
                )
        for f in missing:
            if _has_file(dest, f"{dst}/{f.path}", f.size):
                continue
            try:
                copy_file(self, f"{src}/{f.path}", dest, f"{dst}/{f.path}")
            except (FileNotFoundError, StorageError):
                if not _has_file(dest, f"{dst}/{f.path}", f.size):
                    raise
        return "copied"


def _discard(fh: Any) -> None:
    """Abandon a file opened for writing without committing what was written so far."""
    try:
        fh.discard()  # e.g. s3fs aborts the multipart upload
    finally:
        with contextlib.suppress(AttributeError):
            fh.closed = True  # so neither close() nor __del__ uploads the buffer


def _has_file(storage: Storage, path: str, size: int) -> bool:
    try:
        return storage.size(path) == size
    except FileNotFoundError:
        return False


def copy_file(src: Storage, src_path: str, dest: Storage, dst_path: str) -> None:
    """Copy one file between (possibly different) stores; the target appears whole."""
    # A store-side copy is whole on object stores and in memory; a local copy writes the
    # target in place, so local targets go through write_atomic's temp file + rename.
    same_store = src.fs is dest.fs or (
        src.protocol == dest.protocol and src.storage_options == dest.storage_options)
    if same_store and not isinstance(dest, LocalStorage):
        try:
            dest.fs.makedirs(posixpath.dirname(dest.full_path(dst_path)), exist_ok=True)
            src.fs.copy(src.full_path(src_path), dest.full_path(dst_path))
            return
        except Exception as exc:
            raise PublishError(
                f"copying {redact_url(src.url_of(src_path))} to {redact_url(dest.url_of(dst_path))} failed: {exc}"
            ) from exc

    def stream() -> Iterator[bytes]:
        with src.open_read(src_path) as fh:
            while True:
                block = fh.read(8 * 1024 * 1024)
                if not block:
                    return
                yield block

    dest.write_atomic(dst_path, stream())


class LocalStorage(Storage):
    """The local filesystem: atomic rename, ``link``-based create-exclusive, fsync."""

    atomic_rename = True

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None) -> None:
        # fsspec reads ``file://host/x`` (and ``file://user:pw@host/x``) as the *relative*
        # path ``host/x``: a store would silently appear below the working directory, and a
        # password in the URL would become part of every path in every message.
        refuse_password(url)
        scheme, _, rest = url.partition("://")
        if rest and not rest.startswith("/"):
            raise StorageError(
                f"store URL {redact_url(url)} has a host or credentials part; a local store is "
                f"{scheme}:///absolute/path")
        super().__init__(url, storage_options)

    def _tmp_path(self, full: str) -> str:
        return os.path.join(os.path.dirname(full), f"{TEMP_PREFIX}{uuid.uuid4().hex}")

    def _write_tmp(self, full: str, data: Data) -> tuple[str, int]:
        os.makedirs(os.path.dirname(full), exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=TEMP_PREFIX, dir=os.path.dirname(full))
        written = 0
        try:
            with os.fdopen(fd, "wb") as fh:
                for chunk in _chunks(data):
                    fh.write(chunk)
                    written += len(chunk)
                fh.flush()
                os.fsync(fh.fileno())
        except BaseException:
            _unlink_quietly(tmp)
            raise
        return tmp, written

    def write_atomic(self, path: str, data: Data) -> int:
        full = self.full_path(path)
        try:
            tmp, written = self._write_tmp(full, data)
            os.replace(tmp, full)
        except OSError as exc:
            raise self._err("writing", path, exc) from exc
        return written

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
            raise self._err("listing", path, exc) from exc

    def walk(self, path: str = "", include_temp: bool = False) -> list[FileInfo]:
        # os.scandir for the same reason as list_dir: fsspec's find stats and normalises
        # every file through several layers, a few hundred ms for a 10,000-file output.
        out: list[FileInfo] = []

        def visit(directory: str, prefix: str) -> None:
            try:
                entries = os.scandir(directory)
            except (FileNotFoundError, NotADirectoryError):
                return
            with entries:
                for entry in entries:
                    rel = prefix + entry.name
                    if entry.is_dir(follow_symlinks=False):
                        visit(entry.path, rel + "/")
                    elif include_temp or not entry.name.startswith(TEMP_PREFIX):
                        with contextlib.suppress(FileNotFoundError):  # removed while we listed
                            out.append(FileInfo(rel, entry.stat(follow_symlinks=False).st_size))

        try:
            visit(self.full_path(path), "")
        except OSError as exc:
            raise self._err("walking", path, exc) from exc
        return sorted(out, key=lambda f: f.path)

    def create_exclusive(self, path: str, data: bytes) -> None:
        # Write the whole content to a temp file, then hard-link it into place: link(2)
        # fails if the target exists, so exactly one creator wins and no reader can ever
        # see a partially written record.
        full = self.full_path(path)
        try:
            tmp, _ = self._write_tmp(full, data)
        except OSError as exc:
            raise self._err("creating", path, exc) from exc
        try:
            os.link(tmp, full)
        except FileExistsError as exc:
            raise AlreadyExistsError(f"{redact_url(self.url_of(path))} already exists") from exc
        except OSError as exc:
            raise self._err("creating", path, exc) from exc
        finally:
            _unlink_quietly(tmp)

    def publish_dir(
        self, src: str, dest: Storage, dst: str, files: Iterable[FileInfo], *, verify: bool = True
    ) -> str:
        expected = files if isinstance(files, list) else list(files)
        if isinstance(dest, LocalStorage):
            src_full, dst_full = self.full_path(src), dest.full_path(dst)
            # A rename moves whatever staging holds: check it holds the manifest first, or a
            # lost staged file would be published as a silently incomplete epoch.
            if (os.path.isdir(src_full) and not os.path.exists(dst_full)
                    and (not verify or _staged_whole(src_full, expected))):
                os.makedirs(os.path.dirname(dst_full), exist_ok=True)
                try:
                    # One rename publishes every file at once, whatever their number.
                    os.rename(src_full, dst_full)
                    return "renamed"
                except OSError as exc:
                    # ENOENT: a concurrent publisher renamed it first; the generic path
                    # below then finds every file at the destination.
                    if exc.errno not in (errno.EXDEV, errno.ENOTEMPTY, errno.EEXIST, errno.ENOENT):
                        raise PublishError(f"renaming {src_full} to {dst_full} failed: {exc}") from exc
        return super().publish_dir(src, dest, dst, expected, verify=verify)


def _staged_whole(root: str, files: list[FileInfo]) -> bool:
    """Whether every file of ``files`` is below local directory ``root`` with its size."""
    for f in files:
        try:
            if os.stat(os.path.join(root, f.path)).st_size != f.size:
                return False
        except OSError:
            return False
    return True


class MemoryStorage(Storage):
    """fsspec's in-process ``memory://`` filesystem (tests, dry runs, single-process use).

    Its files are committed when opened, so writes are assembled first and stored in one
    step, and one process-wide lock makes create-exclusive a true put-if-absent between
    threads.
    """

    _lock = threading.Lock()

    def write_atomic(self, path: str, data: Data) -> int:
        full = self.full_path(path)
        payload = b"".join(_chunks(data))
        try:
            with self._lock:
                self.fs.pipe_file(full, payload)
        except Exception as exc:
            raise self._err("writing", path, exc) from exc
        return len(payload)

    def create_exclusive(self, path: str, data: bytes) -> None:
        full = self.full_path(path)
        with self._lock:
            if self.fs.exists(full):
                raise AlreadyExistsError(f"{redact_url(self.url_of(path))} already exists")
            try:
                self.fs.pipe_file(full, bytes(data))
            except Exception as exc:
                raise self._err("creating", path, exc) from exc


class ObjectStorage(Storage):
    """Object stores (S3 and friends): PUT is atomic, no rename, conditional create."""

    def create_exclusive(self, path: str, data: bytes) -> None:
        # Conditional PUT (``If-None-Match: *``). Two cases need care: a 409
        # ConditionalRequestConflict (s3fs: OSError EBUSY) means a competing PUT was in
        # flight -- retry, one of us will get 412; and a 412 on a retry whose first PUT
        # landed but whose answer was lost -- identical bytes there are our own write.
        full = self.full_path(path)
        payload = bytes(data)
        delay = 0.05
        for attempt in range(6):
            try:
                self.fs.pipe_file(full, payload, mode="create")
                return
            except FileExistsError as exc:
                self.fs.invalidate_cache(full)
                if attempt and self._holds(full, payload):
                    return
                raise AlreadyExistsError(f"{self.describe_path(path)} already exists") from exc
            except OSError as exc:
                text = f"{type(exc).__name__} {exc}"
                if "PreconditionFailed" in text or "412" in text:
                    raise AlreadyExistsError(f"{self.describe_path(path)} already exists") from exc
                busy = exc.errno == errno.EBUSY or "ConditionalRequestConflict" in text or "409" in text
                if not busy or attempt == 5:
                    raise self._err("creating", path, exc) from exc
                time.sleep(delay)
                delay *= 2
            except Exception as exc:
                raise self._err("creating", path, exc) from exc
            finally:
                self.fs.invalidate_cache(full)

    def _holds(self, full: str, payload: bytes) -> bool:
        try:
            return bool(self.fs.cat_file(full) == payload)
        except FileNotFoundError:
            return False

    def exists(self, path: str) -> bool:
        self.fs.invalidate_cache(self.full_path(path))
        return super().exists(path)

    def delete(self, path: str, recursive: bool = False) -> None:
        # A cached listing would make another process's new files look absent and skip them.
        self.fs.invalidate_cache(self.full_path(path))
        super().delete(path, recursive)

    def size(self, path: str) -> int:
        self.fs.invalidate_cache(self.full_path(path))
        return super().size(path)

    def list_dir(self, path: str = "") -> list[str]:
        self.fs.invalidate_cache(self.full_path(path))
        return super().list_dir(path)

    def walk(self, path: str = "", include_temp: bool = False) -> list[FileInfo]:
        self.fs.invalidate_cache(self.full_path(path))
        return super().walk(path, include_temp)


def _unlink_quietly(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


_BUILTIN: dict[str, type[Storage]] = {
    "file": LocalStorage,
    "local": LocalStorage,
    "memory": MemoryStorage,
    "s3": ObjectStorage,
    "s3a": ObjectStorage,
    "gs": ObjectStorage,
    "gcs": ObjectStorage,
    "abfs": ObjectStorage,
    "az": ObjectStorage,
}


@functools.cache
def backend_for(protocol: str) -> type[Storage]:
    """The storage class registered for ``protocol`` (entry points win over built-ins)."""
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == protocol:
            try:
                cls = ep.load()
            except Exception as exc:
                raise StorageError(
                    f"entry point {ep.value!r} for protocol {protocol!r} in group "
                    f"{ENTRY_POINT_GROUP} cannot be loaded: {exc}"
                ) from exc
            if not (isinstance(cls, type) and issubclass(cls, Storage)):
                raise StorageError(
                    f"entry point {ep.value!r} for protocol {protocol!r} in group "
                    f"{ENTRY_POINT_GROUP} is not a Storage subclass"
                )
            return cls
    return _BUILTIN.get(protocol, Storage)


def open_storage(url: str, storage_options: Mapping[str, Any] | None = None) -> Storage:
    """Open the storage rooted at ``url``, choosing the backend by its protocol."""
    if not isinstance(url, str) or not url:
        raise StorageError(f"a store URL must be a non-empty string, got {url!r}")
    if "://" not in url:
        url = "file://" + os.path.abspath(url)
    protocol = url.split("://", 1)[0].lower()
    return backend_for(protocol)(url, storage_options)
