"""Backends by URL protocol, and the conditional-create probe run when a store is opened.

A protocol without a backend is refused: fsspec's generic ``pipe_file(mode="create")``
checks and then writes on most filesystems, which is not a put-if-absent.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import uuid
from collections.abc import Mapping
from typing import Any

from airflow_seatunnel_ckpt.core.errors import StorageError
from airflow_seatunnel_ckpt.core.registry import Registry
from airflow_seatunnel_ckpt.core.storage.base import TEMP_PREFIX, Storage, refuse_password

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "airflow_seatunnel_ckpt.storage"

#: Why protocols people ask for are not built in (see docs/STORAGE.md).
_NOT_BUILT_IN = {
    "hdfs": "pyarrow's HadoopFileSystem creates a file by checking and then writing, which is not "
            "exclusive (two writers can both win), and it cannot be tested without a Hadoop cluster",
    "gs": "gcsfs's conditional create (ifGenerationMatch=0) is not tested by this project",
    "gcs": "gcsfs's conditional create (ifGenerationMatch=0) is not tested by this project",
    "abfs": "adlfs's conditional create (If-None-Match) is not tested by this project",
    "az": "adlfs's conditional create (If-None-Match) is not tested by this project",
}


def _unsupported(protocol: str, known: list[str]) -> str:
    why = _NOT_BUILT_IN.get(protocol, "no backend is registered for it")
    return (f"store protocol {protocol!r} is not supported ({why}); supported protocols: {', '.join(known)}. "
            f"A backend for it can be registered in the {ENTRY_POINT_GROUP!r} entry-point group of an installed "
            f"package, e.g. '{protocol} = \"airflow_seatunnel_ckpt.core.storage.object_store:ObjectStorage\"' for an "
            "object store whose fsspec filesystem implements pipe_file(mode=\"create\") as a conditional write; it "
            "is probed for conditional create when a store is opened and refused if it does not honour it")


_MODULE = "airflow_seatunnel_ckpt.core.storage"
BACKENDS: Registry[type[Storage]] = Registry(
    "store protocol",
    {"file": f"{_MODULE}.local:LocalStorage", "local": f"{_MODULE}.local:LocalStorage",
     "memory": f"{_MODULE}.memory:MemoryStorage", "s3": f"{_MODULE}.object_store:ObjectStorage",
     "s3a": f"{_MODULE}.object_store:ObjectStorage"},
    extras={"s3": "s3", "s3a": "s3"}, group=ENTRY_POINT_GROUP, unknown=_unsupported, error=StorageError,
    accepts=(lambda value: isinstance(value, type) and issubclass(value, Storage), "a Storage subclass"))


def backend_for(protocol: str) -> type[Storage]:
    """The storage class registered for ``protocol``; StorageError naming the way out if none is."""
    return BACKENDS.get(protocol)


def open_storage(url: str, storage_options: Mapping[str, Any] | None = None, *, probe: bool = True) -> Storage:
    """Open the storage rooted at ``url`` with its protocol's backend, probed for conditional create.

    ``probe=False`` skips the probe, for a caller that never creates conditionally there.
    """
    if not isinstance(url, str) or not url:
        raise StorageError(f"a store URL must be a non-empty string, got {url!r}")
    if "://" not in url:
        url = "file://" + os.path.abspath(url)
    refuse_password(url)  # before anything can put the URL into a message
    protocol = url.split("://", 1)[0].lower()
    storage = backend_for(protocol)(url, storage_options)
    if probe:
        probe_conditional_create(storage)
    return storage


_probed: set[tuple[Any, ...]] = set()
_probed_lock = threading.Lock()
PROBE_RACERS = 4


def _probe_key(storage: Storage) -> tuple[Any, ...]:
    # Options pick the server (endpoint) as much as the URL does; hashed, as they hold secrets.
    options = hashlib.sha256(repr(sorted(storage.storage_options.items(), key=str)).encode()).hexdigest()
    return type(storage), storage.protocol, storage._probe_dir(), options


def forget_probes() -> None:
    """Forget which stores were probed (the next open probes again)."""
    with _probed_lock:
        _probed.clear()


def probe_conditional_create(storage: Storage) -> None:
    """Refuse ``storage`` unless its create is a put-if-absent (docs/STORAGE.md); cached per process.

    Its keys are temp-named, so a probe killed half-way leaves only what listings hide and GC removes.
    """
    key = _probe_key(storage)
    if key in _probed:
        return
    directory = storage._probe_dir()
    first = f"{directory}/{TEMP_PREFIX}probe-{uuid.uuid4().hex}"
    raced = f"{directory}/{TEMP_PREFIX}probe-{uuid.uuid4().hex}"
    try:
        storage._put_if_absent(first, b"probe 1")
    except PermissionError as exc:
        # A read-only user (an operator inspecting the store) cannot write anything, so the
        # guarantee cannot matter to them; a writer is probed when it opens the store.
        log.warning("cannot probe %s for conditional create (no write permission: %s)", storage.describe(), exc)
        return
    except Exception as exc:
        raise StorageError(f"cannot probe {storage.describe()} for conditional create: writing "
                           f"{TEMP_PREFIX}probe-* failed: {exc}") from exc
    try:
        problem = _second_create_problem(storage, first) or _race_problem(storage, raced)
    finally:
        storage._remove_quietly(first)
        storage._remove_quietly(raced)
    if problem:
        raise StorageError(
            f"store {storage.describe()} does not honour conditional create (put-if-absent): {problem}. "
            "The transaction log needs it so that exactly one commit-or-abort decision can win; the store "
            f"is refused. Use a store that supports conditional writes (for S3-compatible servers: "
            f"'If-None-Match: *' on PUT), or a {type(storage).__name__} backend whose create is atomic there "
            f"(registered for {storage.protocol!r} in the {ENTRY_POINT_GROUP!r} entry-point group)")
    with _probed_lock:
        _probed.add(key)


def _second_create_problem(storage: Storage, path: str) -> str:
    try:
        storage._put_if_absent(path, b"probe 2")
    except FileExistsError:
        return ""
    return "a second create of the same key succeeded (the condition is ignored)"


def _race_problem(storage: Storage, path: str) -> str:
    barrier = threading.Barrier(PROBE_RACERS)
    won: list[int] = []
    failed: list[BaseException] = []

    def race(me: int) -> None:
        barrier.wait()
        try:
            storage._put_if_absent(path, f"racer {me}".encode())
            won.append(me)
        except FileExistsError:
            pass
        except Exception as exc:  # e.g. a 409 conflict: lost, but not wrong
            failed.append(exc)

    threads = [threading.Thread(target=race, args=(i,), name=f"probe-{i}") for i in range(PROBE_RACERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if len(won) > 1:
        return f"{len(won)} of {PROBE_RACERS} concurrent creates of one key all succeeded"
    if won and storage.fs.cat_file(path) != f"racer {won[0]}".encode():
        return "the winner of concurrent creates is not what the key holds"
    return ""
