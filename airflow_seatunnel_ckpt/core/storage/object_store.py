"""The object store backend (``s3://``, ``s3a://`` through s3fs): conditional PUTs, server-side copies, CRC32C.

Objects without a full-object CRC32C (other tools' writes, multipart uploads) are read and
checksummed instead; docs/STORAGE.md has the guarantees.
"""

from __future__ import annotations

import base64
import errno
import itertools
from typing import Any

import crc32c
import tenacity

from airflow_seatunnel_ckpt.core.errors import AlreadyExistsError, StorageError
from airflow_seatunnel_ckpt.core.storage.base import TEMP_PREFIX, Capabilities, Data, FileInfo, Storage, chunks

#: Payloads up to this size are sent in one PUT with their CRC32C; larger ones stream as a
#: multipart upload without a full-object checksum (then verifying them reads them).
SINGLE_PUT_MAX = 64 * 1024 * 1024


def _crc32c_kwargs(payload: bytes) -> dict[str, str]:
    value = base64.b64encode(int(crc32c.crc32c(payload)).to_bytes(4, "big")).decode()
    # Giving the value makes botocore send it as is (no CRT extension needed to compute it).
    return {"ChecksumAlgorithm": "CRC32C", "ChecksumCRC32C": value}


def _says(exc: BaseException, *words: str) -> bool:
    """Whether the error's type or message holds one of ``words`` (s3fs keeps S3's codes only there)."""
    text = f"{type(exc).__name__} {exc}"
    return any(word in text for word in words)


def _busy(exc: BaseException) -> bool:
    """A 409 ConditionalRequestConflict: a competing conditional PUT was in flight."""
    if not isinstance(exc, OSError) or isinstance(exc, FileExistsError):
        return False
    return exc.errno == errno.EBUSY or _says(exc, "ConditionalRequestConflict", "409")


class ObjectStorage(Storage):
    """Object stores (S3 and S3-compatible servers)."""

    capabilities = Capabilities(conditional_create=True, atomic_rename_dir=False, checksum="crc32c")
    # Another process's new objects must never look absent: no listing cache at all
    # (instead of invalidating it before every call).
    fs_options = {"use_listings_cache": False}
    read_concurrency = 8

    # -- reads -------------------------------------------------------------------------
    def _head(self, full: str, **kwargs: Any) -> dict[str, Any]:
        bucket, key, _ = self.fs.split_path(full)
        return self.fs.call_s3("head_object", Bucket=bucket, Key=key, **kwargs)  # type: ignore[no-any-return]

    def stored_checksum(self, path: str) -> int | None:
        return self.file_info(path).crc32c

    def file_info(self, path: str) -> FileInfo:
        # One HEAD answers both: ContentLength, and the CRC32C with ChecksumMode=ENABLED.
        with self._failing("reading the size and checksum of", path):
            head = self._head(self.full_path(path), ChecksumMode="ENABLED")
        value = head.get("ChecksumCRC32C")
        # A composite checksum ("...-<parts>") covers the parts, not the object.
        if not value or "-" in value or head.get("ChecksumType") == "COMPOSITE":
            crc = None
        else:
            crc = int.from_bytes(base64.b64decode(value), "big")
        return FileInfo(path, int(head["ContentLength"]), crc)

    def modified(self, path: str) -> float:
        with self._failing("reading the modification time of", path):
            return float(self._head(self.full_path(path))["LastModified"].timestamp())

    def list_dir(self, path: str = "") -> list[str]:
        # One LIST request per thousand names and nothing else. s3fs's ``ls`` lists the
        # parent as well when a directory has no children (to tell an empty directory
        # from a file): for an epoch not begun yet, or a new run's index, that parent is
        # the whole transaction log or run index, which grows with every epoch ever run.
        bucket, key, _ = self.fs.split_path(self.full_path(path))
        prefix = f"{key.rstrip('/')}/" if key else ""
        names: set[str] = set()
        page: dict[str, Any] = {"IsTruncated": True}
        try:
            while page.get("IsTruncated"):
                token = {"ContinuationToken": page["NextContinuationToken"]} if "NextContinuationToken" in page else {}
                page = self.fs.call_s3("list_objects_v2", Bucket=bucket, Prefix=prefix, Delimiter="/", **token)
                names.update(p["Prefix"][len(prefix):].rstrip("/") for p in page.get("CommonPrefixes", []))
                names.update(o["Key"][len(prefix):] for o in page.get("Contents", []))
        except FileNotFoundError:  # no such bucket: nothing below it either
            return []
        except Exception as exc:
            raise StorageError(f"listing {self.describe_path(path)} failed: {exc}") from exc
        return sorted(n for n in names if n and not n.startswith(TEMP_PREFIX))

    # -- writes ------------------------------------------------------------------------
    def _write_whole(self, full: str, data: Data) -> int:
        stream = chunks(data)
        buffered: list[bytes] = []
        size = 0
        for chunk in stream:
            buffered.append(chunk)
            size += len(chunk)
            if size > SINGLE_PUT_MAX:
                return super()._write_whole(full, itertools.chain(buffered, stream))
        payload = b"".join(buffered)
        self.fs.pipe_file(full, payload, **_crc32c_kwargs(payload))
        return size

    def _put_if_absent(self, full: str, data: bytes) -> None:
        try:
            self.fs.pipe_file(full, data, mode="create", **_crc32c_kwargs(data))
        except FileExistsError:
            raise
        except OSError as exc:
            if _says(exc, "PreconditionFailed", "412"):
                raise FileExistsError(full) from exc
            raise

    def create_exclusive(self, path: str, data: bytes) -> None:
        # Two cases need care: a 409 ConditionalRequestConflict means a competing PUT was in
        # flight -- retry, one of us will get 412; and a 412 on a retry whose first PUT
        # landed but whose answer was lost -- identical bytes there are our own write.
        full = self.full_path(path)
        payload = bytes(data)
        attempts = 0

        @tenacity.retry(retry=tenacity.retry_if_exception(_busy),
                        stop=tenacity.stop_after_attempt(6) | tenacity.stop_after_delay(30),
                        wait=tenacity.wait_exponential(multiplier=0.05, max=2), reraise=True)
        def put() -> None:
            nonlocal attempts
            attempts += 1
            try:
                self._put_if_absent(full, payload)
            except FileExistsError as exc:
                if attempts > 1 and self._holds(full, payload):
                    return
                raise AlreadyExistsError(f"{self.describe_path(path)} already exists") from exc

        with self._failing("creating", path, passed=(StorageError,)):
            put()

    def _holds(self, full: str, payload: bytes) -> bool:
        try:
            return bool(self.fs.cat_file(full) == payload)
        except FileNotFoundError:
            return False

    def _copy_in_store(self, source_full: str, full: str) -> bool:
        # Server-side copy: the object appears whole, and S3 computes its CRC32C. One
        # CopyObject request: s3fs's cp_file would HEAD the source first only to choose
        # between a plain and a multipart copy, which objects up to 5 GiB never need.
        src_bucket, src_key, _ = self.fs.split_path(source_full)
        bucket, key, _ = self.fs.split_path(full)
        try:
            self.fs.call_s3("copy_object", Bucket=bucket, Key=key, ChecksumAlgorithm="CRC32C",
                            CopySource={"Bucket": src_bucket, "Key": src_key})
        except FileNotFoundError:
            raise
        except Exception as exc:
            if not _says(exc, "EntityTooLarge", "InvalidRequest", "copy source is larger"):
                raise  # only a source above 5 GiB is copied in parts
            self.fs.cp_file(source_full, full, ChecksumAlgorithm="CRC32C")  # a multipart copy
        return True
