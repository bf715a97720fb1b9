"""Fixtures of the core tests: one store per backend, and pipelines built on it.

``store_spec`` is parametrised over every backend the storage contract covers --
``file://`` (a fresh directory), ``memory://`` (a fresh unique root) and S3 on the moto
server of ``tests/conftest.py`` (a fresh bucket) -- so a test that asks for it runs once
per backend. ``local_spec`` / ``memory_spec`` give a single backend for the protocol tests
that do not depend on the store.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from airflow_seatunnel_ckpt.core import CheckpointConfig, CheckpointStore, Pipeline
from airflow_seatunnel_ckpt.core.storage import Storage, open_storage


@dataclass(frozen=True)
class StoreSpec:
    """Where a test's store lives: a root URL and the options to reach it."""

    backend: str
    url: str
    options: dict[str, Any] = field(default_factory=dict)

    def storage(self, path: str = "") -> Storage:
        """A storage rooted at ``path`` below the test's root."""
        root = open_storage(self.url, self.options)
        return root.child(path) if path else root

    def sub_url(self, path: str) -> str:
        """The URL of ``path`` below the test's root."""
        return f"{self.url}/{path}"

    def pipeline(self, name: str = "orders", **settings: Any) -> Pipeline:
        """A fresh ``Pipeline`` object (as a new process would build it) on the store."""
        config = CheckpointConfig.from_mapping(
            {"storage_url": self.sub_url("store"), "storage_options": self.options, **settings}
        )
        return CheckpointStore(config).pipeline(name)


def _local(tmp_path: Path) -> StoreSpec:
    return StoreSpec("file", f"file://{tmp_path}/root")


def _memory() -> StoreSpec:
    return StoreSpec("memory", f"memory://test-{uuid.uuid4().hex}")


def forget(spec: StoreSpec) -> None:
    """Remove a memory store's files now (for tests that build many stores in a loop;
    ``forget_memory_files`` in tests/conftest.py removes the rest after each test)."""
    if spec.backend == "memory":
        spec.storage().delete("", recursive=True)


@pytest.fixture(params=["file", "memory", pytest.param("s3", marks=pytest.mark.s3)])
def store_spec(request: pytest.FixtureRequest, tmp_path: Path) -> StoreSpec:
    """A fresh, empty store on each backend of the storage contract."""
    if request.param == "file":
        return _local(tmp_path)
    if request.param == "memory":
        return _memory()
    moto = request.getfixturevalue("moto_server")
    bucket = request.getfixturevalue("s3_bucket")
    return StoreSpec("s3", f"{bucket}/root", dict(moto.storage_options))


@pytest.fixture
def s3_spec(request: pytest.FixtureRequest) -> StoreSpec:
    """A fresh store in a fresh bucket on the moto server."""
    moto = request.getfixturevalue("moto_server")
    bucket = request.getfixturevalue("s3_bucket")
    return StoreSpec("s3", f"{bucket}/root", dict(moto.storage_options))


@pytest.fixture(params=["file", "memory"])
def fast_spec(request: pytest.FixtureRequest, tmp_path: Path) -> StoreSpec:
    """A fresh store on the two in-process backends (rename publish and copy publish)."""
    return _local(tmp_path) if request.param == "file" else _memory()


@pytest.fixture
def local_spec(tmp_path: Path) -> StoreSpec:
    """A fresh local-directory store."""
    return _local(tmp_path)


@pytest.fixture
def make_local_spec(tmp_path: Path) -> Callable[[], StoreSpec]:
    """Fresh local stores on demand (for hypothesis examples, each needing its own)."""
    counter = iter(range(10**9))

    def make() -> StoreSpec:
        return StoreSpec("file", f"file://{tmp_path}/ex-{next(counter)}")

    return make


@pytest.fixture
def store(local_spec: StoreSpec) -> Storage:
    """The checkpoint store of a table-sink test (local disk)."""
    return local_spec.storage("store")


@pytest.fixture
def table_uri(tmp_path: Path) -> str:
    """Where a table-sink test's Delta table lives."""
    return str(tmp_path / "tables" / "orders")


@pytest.fixture
def decompressed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The path of every chunk the codec decompresses from now on (the codec still runs)."""
    from airflow_seatunnel_ckpt.core import codec

    paths: list[str] = []
    real = codec._decompress

    def spy(codec_: codec.Codec, stored: bytes, raw_len: int, path: str, dctx: Any = None) -> bytes:
        paths.append(path)
        return real(codec_, stored, raw_len, path, dctx)

    monkeypatch.setattr(codec, "_decompress", spy)
    return paths
