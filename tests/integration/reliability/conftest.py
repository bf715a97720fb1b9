"""Fixtures of the reliability suite: fresh pipeline worlds on a local disk or on S3 (moto).

``backend`` is parametrised over ``file`` and ``s3``; the S3 variant runs against the
session's moto server on 127.0.0.1 (``moto_server`` in ``tests/conftest.py``), where a
publish is copy-then-mark and every record is a conditional PUT.

Environment knobs (the CI slice is the default):

* ``RELIABILITY_FULL=1`` -- every crash point with every continuation, on both backends,
  and every S3 variant a module's ``in_s3_slice`` (or the crash-point test's repeated
  clean-up rule) leaves out of CI
* ``RELIABILITY_SCHEDULES=<n>`` -- run ``n`` randomised schedules per backend instead of
  the fixed-seed CI slice (``RELIABILITY_SEED`` picks the first seed)
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import FULL_CAMPAIGNS as FULL
from tests.integration.reliability.synthetic import World

#: Settings of every world: short delta chains so that full/delta rollover is exercised.
SETTINGS = {"full_checkpoint_interval": 3, "max_retries": 1}

_counter = itertools.count()


class WorldFactory:
    """Makes fresh, isolated worlds of one backend, and clones a world's whole state."""

    def __init__(
        self,
        backend: str,
        root: Path,
        bucket: str | None = None,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        self.backend = backend
        self.root = root
        self.bucket = bucket or ""
        self.storage_options = storage_options or {}
        self._fs: Any = None

    def __call__(self, **overrides: Any) -> World:
        name = f"w{next(_counter)}-{uuid.uuid4().hex[:6]}"
        local = self.root / name
        local.mkdir(parents=True)
        base = f"file://{local}" if self.backend == "file" else f"{self.bucket}/{name}"
        fields: dict[str, Any] = {
            "store_url": f"{base}/store",
            "target_url": f"{base}/target",
            "input_dir": str(local / "input"),
            "storage_options": self.storage_options,
            "settings": dict(SETTINGS),
        }
        fields.update(overrides)
        return World(**fields)

    # Records name their sink targets by absolute URL, so a world's state cannot be copied
    # to another place; it is saved aside and restored to the same place instead.
    def save(self, world: World) -> str:
        """Copy the world's store, targets and input aside (mtimes kept); returns a token."""
        token = f"saved-{next(_counter)}-{uuid.uuid4().hex[:6]}"
        local = Path(world.input_dir).parent
        shutil.copytree(local, self.root / token, symlinks=True)
        if self.backend == "s3":
            src = self._prefix(world)
            self._sync(src, f"{self.bucket.removeprefix('s3://')}/{token}")
        return token

    def restore(self, world: World, token: str) -> None:
        """Put the world back exactly as it was when ``token`` was saved."""
        local = Path(world.input_dir).parent
        shutil.rmtree(local)
        shutil.copytree(self.root / token, local, symlinks=True)
        if self.backend == "s3":
            self._sync(f"{self.bucket.removeprefix('s3://')}/{token}", self._prefix(world))

    def _sync(self, src: str, dst: str) -> None:
        """Make prefix ``dst`` hold exactly the objects of ``src`` (server-side copies)."""
        fs = self._s3()
        have = {k[len(dst) + 1 :]: v.get("ETag") for k, v in fs.find(dst, detail=True).items()}
        want = {k[len(src) + 1 :]: v.get("ETag") for k, v in fs.find(src, detail=True).items()}
        extra = [f"{dst}/{k}" for k in have if k not in want]
        if extra:
            fs.rm(extra)
        todo = [k for k, etag in want.items() if have.get(k) != etag]
        if todo:
            fs.copy([f"{src}/{k}" for k in todo], [f"{dst}/{k}" for k in todo])

    def _prefix(self, world: World) -> str:
        return world.store_url.removeprefix("s3://").rsplit("/", 1)[0]

    def _s3(self) -> Any:
        """One s3fs filesystem for every save and restore (a new client costs more than a copy)."""
        if self._fs is None:
            import s3fs

            self._fs = s3fs.S3FileSystem(skip_instance_cache=True, use_listings_cache=False, **self.storage_options)
        return self._fs


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Outside ``RELIABILITY_FULL=1``, run the S3 variants a module picks for CI.

    A test module may define ``in_s3_slice(test_name, params) -> bool``; S3 variants for
    which it returns False are deselected (the local-disk variants always run).
    """
    if FULL:
        return
    keep, drop = [], []
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        predicate = getattr(getattr(item, "module", None), "in_s3_slice", None)
        if (
            params.get("backend") == "s3"
            and predicate is not None
            and not predicate(getattr(item, "originalname", item.name), params)
        ):
            drop.append(item)
        else:
            keep.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.fixture(params=["file", pytest.param("s3", marks=pytest.mark.s3)])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@contextlib.contextmanager
def _scratch_root(fallback: Path) -> Iterator[Path]:
    """A scratch directory on tmpfs when there is one, else ``fallback``; removed afterwards.

    A SIGKILLed process loses nothing the page cache holds, so these tests do not need
    ``fsync`` to reach a disk; on tmpfs it returns at once and the suite runs several
    times faster. (Power loss is out of scope here.)
    """
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        yield fallback
        return
    root = Path(tempfile.mkdtemp(prefix="reliability-", dir=shm))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def scratch(tmp_path: Path) -> Iterator[Path]:
    """A scratch directory for one test (see :func:`_scratch_root`)."""
    with _scratch_root(tmp_path) as root:
        yield root


@pytest.fixture
def make_world(backend: str, scratch: Path, request: pytest.FixtureRequest) -> WorldFactory:
    """``make_world()`` -> a fresh :class:`World` on the test's backend."""
    if backend == "file":
        return WorldFactory("file", scratch)
    moto = request.getfixturevalue("moto_server")
    bucket = request.getfixturevalue("s3_bucket")
    return WorldFactory("s3", scratch, bucket, moto.storage_options)


@pytest.fixture
def world(make_world: Callable[..., World]) -> World:
    """One fresh world on the test's backend."""
    return make_world()


class BuiltWorlds:
    """Worlds built once per module and backend, and put back in place before each later test.

    Many cases start from the same few committed epochs; building them runs the protocol
    (about 1 s a world on the local disk and 5 s on S3 on a loaded two-core machine), while
    restoring a saved copy is a file copy (server-side copies on S3). Each test still gets
    the world exactly as built, at the same place (records name their targets by URL).
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self._built: dict[tuple[str, str], tuple[WorldFactory, World, str]] = {}

    def get(self, like: WorldFactory, name: str, build: Callable[[World], None]) -> World:
        """The world ``build`` makes from a fresh one on the backend (and bucket) of ``like``,
        as it was right after ``build``: built by the module's first test that asks, restored after."""
        key = (like.backend, name)
        if key in self._built:
            factory, world, token = self._built[key]
            factory.restore(world, token)
            return world
        factory = WorldFactory(like.backend, self.root / like.backend / name, like.bucket, like.storage_options)
        world = factory()
        build(world)
        self._built[key] = (factory, world, factory.save(world))
        return world


@pytest.fixture(scope="module")
def built_worlds(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BuiltWorlds]:
    """The module's :class:`BuiltWorlds` (their files removed after its last test)."""
    with _scratch_root(tmp_path_factory.mktemp("built-worlds")) as root:
        yield BuiltWorlds(root)
