"""The storage interface: the primitives the commit protocol needs, over any fsspec URL.

A :class:`Storage` is rooted at one URL; every path is relative to it (validated so it can
never leave the root). A backend subclasses it, declares its :class:`Capabilities` and
implements :meth:`Storage._put_if_absent`; the defaults are written over fsspec calls.
docs/STORAGE.md has what each primitive promises and how to write a backend.
"""

from __future__ import annotations

import abc
import contextlib
import datetime
import errno
import posixpath
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import IO, Any, ClassVar
from urllib.parse import urlsplit

import crc32c
import fsspec
import tenacity
from fsspec.core import url_to_fs

from airflow_seatunnel_ckpt.core.config import redact_url
from airflow_seatunnel_ckpt.core.errors import AlreadyExistsError, StorageError

__all__ = ["TEMP_PREFIX", "Capabilities", "Data", "FileInfo", "Storage", "TempFiles", "clean_relpath",
           "refuse_password"]

#: Prefix of in-flight temporary files; listings hide them and GC removes stale ones.
TEMP_PREFIX = ".tmp-"

Data = bytes | bytearray | memoryview | Iterable[bytes]

BLOCK = 8 * 1024 * 1024


@dataclass(frozen=True)
class FileInfo:
    """One file below a storage root: relative path, size in bytes, CRC32C when known."""

    path: str
    size: int
    #: Checksum of the whole file; set in sink manifests, None in plain listings.
    crc32c: int | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Capabilities:
    """The guarantees a backend gives the commit protocol (the matrix is in docs/STORAGE.md)."""

    #: Put-if-absent: of concurrent creators of one path exactly one wins (probed on open).
    conditional_create: bool
    #: A directory moves within the store in one atomic rename.
    atomic_rename_dir: bool = False
    #: The checksum the store keeps and returns without reading the data (``"crc32c"``), or None.
    checksum: str | None = None
    #: Writes go through temp files (:data:`TEMP_PREFIX`) that a killed writer leaves behind.
    temp_files: bool = False


@dataclass(frozen=True)
class TempFiles:
    """What :meth:`Storage.temp_files` found below a path."""

    stale: list[str] = field(default_factory=list)  #: older than the timeout (a killed writer's)
    young: bool = False  #: a younger one is there too (its writer may be finishing it)


def chunks(data: Data) -> Iterator[bytes]:
    """``data`` as a stream of byte strings."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        yield bytes(data)
    else:
        for chunk in data:
            yield bytes(chunk)


def _not_empty(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno == errno.ENOTEMPTY


class Storage(abc.ABC):
    """A store rooted at one URL: the abstract interface with fsspec-based defaults."""

    capabilities: ClassVar[Capabilities]
    #: fsspec options the backend always sets (they win over the user's).
    fs_options: ClassVar[Mapping[str, Any]] = {}
    #: Whole-file reads worth running at once (deep verification): one on a local disk or
    #: in memory, where a thread pool costs more than it saves; more on object stores,
    #: where each read is a round trip.
    read_concurrency: ClassVar[int] = 1

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None) -> None:
        refuse_password(url)
        self.url = url.rstrip("/") if url not in ("/",) else url
        self.storage_options = dict(storage_options or {})
        try:
            fs, root = url_to_fs(self.url, **{**self.storage_options, **self.fs_options})
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

    @contextlib.contextmanager
    def _failing(self, what: str, path: str,
                 passed: tuple[type[BaseException], ...] = (FileNotFoundError, StorageError)) -> Iterator[None]:
        """Any error but the ``passed`` ones as a StorageError naming what failed on which file."""
        try:
            yield
        except passed:
            raise
        except Exception as exc:
            raise StorageError(f"{what} {self.describe_path(path)} failed: {exc}") from exc

    # -- reads -------------------------------------------------------------------------
    def read(self, path: str) -> bytes:
        """Whole content of the file at ``path``; FileNotFoundError if absent."""
        with self._failing("reading", path):
            return bytes(self.fs.cat_file(self.full_path(path)))

    def read_range(self, path: str, start: int, end: int) -> bytes:
        """Bytes ``start`` to ``end`` (exclusive) of the file at ``path`` in one ranged read."""
        with self._failing("reading", path):
            return bytes(self.fs.cat_file(self.full_path(path), start=start, end=end))

    def open_read(self, path: str) -> IO[bytes]:
        """A binary file object for streaming reads; FileNotFoundError if absent."""
        with self._failing("opening", path):
            return self.fs.open(self.full_path(path), "rb")  # type: ignore[no-any-return]

    def checksum(self, path: str) -> int:
        """CRC32C of the whole file at ``path``: the one the store keeps, else read and computed."""
        kept = self.stored_checksum(path)
        return kept if kept is not None else self.computed_checksum(path)

    def computed_checksum(self, path: str) -> int:
        """CRC32C of the file at ``path``, computed by reading it in blocks."""
        crc = 0
        with self.open_read(path) as fh:
            while block := fh.read(BLOCK):
                crc = int(crc32c.crc32c(block, crc))
        return crc

    def stored_checksum(self, path: str) -> int | None:
        """The CRC32C the store keeps for ``path`` (no data read), or None if it keeps none."""
        return None

    def file_info(self, path: str) -> FileInfo:
        """Size of the file at ``path`` and the CRC32C the store keeps (None if none), in one request where it can."""
        return FileInfo(path, self.size(path), self.stored_checksum(path))

    def exists(self, path: str) -> bool:
        """Whether a file or directory exists at ``path``."""
        with self._failing("checking", path):
            return bool(self.fs.exists(self.full_path(path)))

    def size(self, path: str) -> int:
        """Size in bytes of the file at ``path``; FileNotFoundError if absent."""
        with self._failing("sizing", path):
            return int(self.fs.size(self.full_path(path)))

    def modified(self, path: str) -> float:
        """When the file at ``path`` was last written, by the STORE's clock (Unix seconds)."""
        with self._failing("reading the modification time of", path):
            stamp = self.fs.modified(self.full_path(path))
        if stamp.tzinfo is None:  # fsspec backends report UTC; some leave it naive
            stamp = stamp.replace(tzinfo=datetime.UTC)
        return float(stamp.timestamp())

    def list_dir(self, path: str = "") -> list[str]:
        """Names of the direct children of directory ``path`` (sorted; [] if absent)."""
        full = self.full_path(path)
        try:
            with self._failing("listing", path, passed=(FileNotFoundError, NotADirectoryError)):
                entries = self.fs.ls(full, detail=False)
        except (FileNotFoundError, NotADirectoryError):
            return []
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
            with self._failing("walking", path):
                found = self.fs.find(full, detail=True)
        except FileNotFoundError:
            return []
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

    def temp_files(self, path: str = "", *, now: float, older_than: float, recursive: bool = True,
                   prune: Callable[[str], bool] | None = None) -> TempFiles:
        """The temp files killed writers left below ``path`` (only its top level if not ``recursive``).

        ``prune(directory)`` True leaves that directory out; a temp file is stale when it is
        more than ``older_than`` seconds older than ``now``. Default: none (no temp files).
        """
        return TempFiles()

    # -- writes ------------------------------------------------------------------------
    def write_atomic(self, path: str, data: Data) -> int:
        """Write ``data`` so that readers never see a partial file. Returns bytes written."""
        full = self.full_path(path)
        with self._failing("writing", path, passed=(StorageError,)):
            return self._write_whole(full, data)

    def _write_whole(self, full: str, data: Data) -> int:
        """Write ``data`` to filesystem path ``full`` so that it appears whole or not at all (on close)."""
        written = 0
        self.fs.makedirs(posixpath.dirname(full), exist_ok=True)
        fh = self.fs.open(full, "wb")
        try:
            for chunk in chunks(data):
                fh.write(chunk)
                written += len(chunk)
        except BaseException:
            # ``with fs.open(...)`` would close -- i.e. commit -- the partial file.
            _discard(fh)
            raise
        fh.close()
        return written

    def create_exclusive(self, path: str, data: bytes) -> None:
        """Create ``path`` with ``data`` only if it does not exist (AlreadyExistsError if it does)."""
        full = self.full_path(path)
        with self._failing("creating", path, passed=(StorageError,)):
            try:
                self._put_if_absent(full, bytes(data))
            except FileExistsError as exc:
                raise AlreadyExistsError(f"{self.describe_path(path)} already exists") from exc

    @abc.abstractmethod
    def _put_if_absent(self, full: str, data: bytes) -> None:
        """Store ``data`` at filesystem path ``full`` only if nothing is there, else FileExistsError.

        Atomic on the store: of concurrent callers exactly one succeeds, and a reader sees
        the whole ``data`` or nothing.
        """

    def delete(self, path: str, recursive: bool = False) -> None:
        """Remove the file or (with ``recursive``) directory at ``path``; absent is fine.

        A writer racing a recursive delete (a losing committer completing ``_metadata``) makes
        a local ``rmdir`` fail with "directory not empty": the delete walks the tree again.
        """
        full = self.full_path(path)

        @tenacity.retry(retry=tenacity.retry_if_exception(_not_empty if recursive else (lambda _: False)),
                        stop=tenacity.stop_after_attempt(6) | tenacity.stop_after_delay(5),
                        wait=tenacity.wait_exponential(multiplier=0.01, max=0.2), reraise=True)
        def remove() -> None:
            if self.fs.exists(full):
                self.fs.rm(full, recursive=recursive)

        with contextlib.suppress(FileNotFoundError), self._failing("deleting", path):
            remove()

    def _remove_quietly(self, full: str) -> None:
        """Remove the file at filesystem path ``full`` if it is there (probe clean-up)."""
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(full)

    def _probe_dir(self) -> str:
        """Filesystem directory where the conditional-create probe may create its keys."""
        return str(self.root)

    # -- moving files (publish) --------------------------------------------------------
    def rename_dir(self, src: str, dest: Storage, dst: str) -> bool:
        """Move directory ``src`` to ``dest:dst`` in one atomic rename; False, changing nothing, if it cannot."""
        return False

    def _copy_in_store(self, source_full: str, full: str) -> bool:
        """Copy a file within this store so that the copy appears whole; False if it cannot."""
        return False


def _discard(fh: Any) -> None:
    """Abandon a file opened for writing without committing what was written so far."""
    try:
        fh.discard()  # e.g. s3fs aborts the multipart upload
    finally:
        with contextlib.suppress(AttributeError):
            fh.closed = True  # so neither close() nor __del__ uploads the buffer


_PASSWORD_ANYWHERE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^@/?#]*:(?!\d+(?:[/?#]|$))[^@]*@")


def refuse_password(url: str, what: str = "store URL") -> None:
    """Raise StorageError if ``url`` carries a password (``scheme://user:password@...``).

    Libraries below us (s3fs, botocore) would put it into their own log lines and error
    messages, where no redaction can reach it. A user name alone is fine.
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
        raise StorageError(f"{what} {redact_url(url)} carries a password: pass credentials as storage options (or in "
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
