"""The writer's list of staged files (``_seatunnel_files.json``) as ``manifest_of`` reads it.

The list, written by the executors' job commit, is the staged output: its sizes are
checked against one listing of the staging and its CRC32C values are taken without
reading the files. A damaged list or a listed file that is gone or resized is refused
naming the file, before anything is prepared.
"""

from __future__ import annotations

import json

import crc32c
import pytest

from airflow_seatunnel_ckpt.core.errors import CorruptCheckpointError
from airflow_seatunnel_ckpt.core.protocol.staging import FILES_LIST, manifest_of
from airflow_seatunnel_ckpt.core.storage import Storage
from tests.core.conftest import StoreSpec

STAGING = "_staging/epoch=1/attempt=1/orders"


def _staged(storage: Storage, files: dict[str, bytes], listed: object) -> None:
    for name, data in files.items():
        storage.write_atomic(f"{STAGING}/{name}", data)
    storage.write_atomic(f"{STAGING}/{FILES_LIST}", json.dumps(listed).encode())


def _entry(name: str, data: bytes) -> dict[str, object]:
    return {"path": name, "size": len(data), "crc32c": crc32c.crc32c(data)}


def test_the_writers_list_is_the_manifest_and_a_file_it_does_not_list_is_not_output(fast_spec: StoreSpec) -> None:
    storage = fast_spec.storage()
    good = b"rows of a committed task"
    _staged(storage, {"p=1/part-0.parquet": good, "part-9-failed-attempt.parquet": b"partial"},
            {"files": [_entry("p=1/part-0.parquet", good)]})
    manifest = manifest_of(storage, STAGING, "orders", "file:///target", rows=1)
    assert [(f.path, f.size, f.crc32c) for f in manifest.files] == [
        ("p=1/part-0.parquet", len(good), crc32c.crc32c(good))]


@pytest.mark.parametrize(("listed", "problem"), [
    ("not json", "not a valid list of written files"),
    ({"files": {"a": 1}}, "not a valid list of written files"),
    ({"files": [{"path": "part-0.parquet", "size": -1, "crc32c": 0}]}, "bad size or crc32c"),
    ({"files": [{"path": "../escape.parquet", "size": 1, "crc32c": 0}]}, "not a valid list of written files"),
])
def test_a_damaged_list_of_written_files_is_refused_naming_it(fast_spec: StoreSpec, listed: object,
                                                             problem: str) -> None:
    storage = fast_spec.storage()
    _staged(storage, {"part-0.parquet": b"x"}, listed)
    with pytest.raises(CorruptCheckpointError, match=f"{FILES_LIST}: .*{problem}.*run the stage again"):
        manifest_of(storage, STAGING, "orders", "file:///target", rows=1)


def test_a_listed_file_that_is_gone_or_resized_is_refused_naming_it(fast_spec: StoreSpec) -> None:
    storage = fast_spec.storage()
    data = b"committed bytes"
    _staged(storage, {"part-0.parquet": data + b"!"}, {"files": [_entry("part-0.parquet", data),
                                                                 _entry("part-1.parquet", data)]})
    with pytest.raises(CorruptCheckpointError, match=r"part-0.parquet: .*15 bytes.*it is 16 bytes"):
        manifest_of(storage, STAGING, "orders", "file:///target", rows=1)
    storage.write_atomic(f"{STAGING}/part-0.parquet", data)
    with pytest.raises(CorruptCheckpointError, match=r"part-1.parquet: .*it is missing"):
        manifest_of(storage, STAGING, "orders", "file:///target", rows=1)
