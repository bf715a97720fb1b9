"""The storage contract: every backend (file://, memory://, S3) behaves the same.

One suite, parametrised over the backends by the ``store_spec`` fixture, in the manner of
fsspec's shared implementation tests. Backend-specific promises (one-rename publish on a
local disk) are at the end.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Iterator
from importlib.metadata import EntryPoint

import fsspec
import pytest

from airflow_seatunnel_ckpt.core import registry as registry_module
from airflow_seatunnel_ckpt.core.codec import crc32c
from airflow_seatunnel_ckpt.core.errors import AlreadyExistsError, PublishError, StorageError
from airflow_seatunnel_ckpt.core.storage import (
    ENTRY_POINT_GROUP,
    TEMP_PREFIX,
    Capabilities,
    FileInfo,
    LocalStorage,
    MemoryStorage,
    ObjectStorage,
    Storage,
    TempFiles,
    backend_for,
    open_storage,
    publish_files,
)
from airflow_seatunnel_ckpt.core.storage.registry import BACKENDS, PROBE_RACERS, forget_probes
from tests.core.conftest import StoreSpec
from tests.core.epochs import at_once, flip_byte


class Boom(Exception):
    """The data source of a write failed part-way."""


def failing_after(first: bytes) -> Iterator[bytes]:
    yield first
    raise Boom("the producer died")


def every_name(store: Storage) -> list[str]:
    """Every file below the root, temp files included."""
    return [f.path for f in store.walk("", include_temp=True)]


# -- read / write -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [b"hello", b"", bytearray(b"\x00\xff" * 1000), memoryview(b"view"), [b"ab", b"", b"cd"]],
    ids=["bytes", "empty", "bytearray", "memoryview", "pieces"],
)
def test_write_atomic_then_read_returns_the_same_bytes(store_spec: StoreSpec, data: object) -> None:
    store = store_spec.storage()
    expected = b"".join(data) if isinstance(data, list) else bytes(data)  # type: ignore[call-overload]

    written = store.write_atomic("dir/sub/file.bin", data)  # type: ignore[arg-type]

    assert written == len(expected)
    assert store.read("dir/sub/file.bin") == expected
    assert store.size("dir/sub/file.bin") == len(expected)
    with store.open_read("dir/sub/file.bin") as fh:
        assert fh.read() == expected


def test_write_atomic_replaces_an_existing_file_whole(store_spec: StoreSpec) -> None:
    store = store_spec.storage()
    store.write_atomic("f", b"old content that is long")
    store.write_atomic("f", b"new")
    assert store.read("f") == b"new"


def test_failed_write_leaves_no_file_and_no_temp_file(store_spec: StoreSpec) -> None:
    store = store_spec.storage()
    with pytest.raises((Boom, StorageError)):
        store.write_atomic("dir/f", failing_after(b"partial bytes"))
    assert not store.exists("dir/f")
    assert every_name(store) == []


def test_failed_overwrite_keeps_the_old_content(store_spec: StoreSpec) -> None:
    store = store_spec.storage()
    store.write_atomic("dir/f", b"committed")
    with pytest.raises((Boom, StorageError)):
        store.write_atomic("dir/f", failing_after(b"partial"))
    assert store.read("dir/f") == b"committed"
    assert every_name(store) == ["dir/f"]


def test_readers_never_see_a_partial_file_while_writers_replace_it(store_spec: StoreSpec) -> None:
    store = store_spec.storage()
    versions = [bytes([v]) * (64 * 1024) for v in range(1, 7)]
    store.write_atomic("f", versions[0])
    seen: list[bytes] = []
    done = threading.Event()

    def read_loop() -> None:
        while not done.is_set():
            seen.append(store.read("f"))

    reader = threading.Thread(target=read_loop)
    reader.start()
    try:
        for version in versions[1:]:
            store.write_atomic("f", [version[: len(version) // 2], version[len(version) // 2 :]])
    finally:
        done.set()
        reader.join()
    assert seen
    assert all(data in versions for data in seen)


def test_missing_file_raises_file_not_found(store_spec: StoreSpec) -> None:
    store = store_spec.storage()
    with pytest.raises(FileNotFoundError):
        store.read("nope")
    with pytest.raises(FileNotFoundError):
        store.size("nope")
    with pytest.raises(FileNotFoundError):
        store.open_read("nope").read()
    assert not store.exists("nope")


# -- create-exclusive ---------------------------------------------------------------------


def test_create_exclusive_creates_once_and_refuses_every_later_create(
    store_spec: StoreSpec,
) -> None:
    store = store_spec.storage()
    store.create_exclusive("_txlog/epoch-1/decision", b"commit")
    with pytest.raises(AlreadyExistsError, match="already exists"):
        store.create_exclusive("_txlog/epoch-1/decision", b"abort")
    assert store.read("_txlog/epoch-1/decision") == b"commit"
    assert every_name(store) == ["_txlog/epoch-1/decision"]


def test_create_exclusive_refuses_a_file_written_by_write_atomic(store_spec: StoreSpec) -> None:
    store = store_spec.storage()
    store.write_atomic("f", b"first")
    with pytest.raises(AlreadyExistsError):
        store.create_exclusive("f", b"second")
    assert store.read("f") == b"first"


def test_create_exclusive_has_exactly_one_winner_among_racing_threads(
    store_spec: StoreSpec,
) -> None:
    store = store_spec.storage()
    threads_per_race = 8
    races = 10 if store_spec.backend == "s3" else 30
    for race in range(races):
        path = f"race/{race}"
        winners: list[int] = []
        losers: list[int] = []
        errors: list[BaseException] = []
        barrier = threading.Barrier(threads_per_race)

        def contend(
            me: int,
            path: str = path,
            winners: list[int] = winners,
            losers: list[int] = losers,
            errors: list[BaseException] = errors,
            barrier: threading.Barrier = barrier,
        ) -> None:
            barrier.wait()
            try:
                store.create_exclusive(path, f"writer-{me}".encode())
                winners.append(me)
            except AlreadyExistsError:
                losers.append(me)
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=contend, args=(i,)) for i in range(threads_per_race)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert len(winners) == 1, f"race {race}: winners {winners}"
        assert len(losers) == threads_per_race - 1
        assert store.read(path) == f"writer-{winners[0]}".encode()


# -- listing and deleting -----------------------------------------------------------------


def test_list_dir_names_direct_children_sorted(store_spec: StoreSpec) -> None:
    store = store_spec.storage()
    for path in ("d/b.bin", "d/a.bin", "d/sub/c.bin", "d/sub/deeper/e.bin", "other/x"):
        store.write_atomic(path, b"x")
    assert store.list_dir("d") == ["a.bin", "b.bin", "sub"]
    assert store.list_dir("") == ["d", "other"]
    assert store.list_dir("d/sub") == ["c.bin", "deeper"]


def test_list_dir_of_a_missing_directory_is_empty(store_spec: StoreSpec) -> None:
    store = store_spec.storage()
    assert store.list_dir("nothing/here") == []
    assert store.walk("nothing/here") == []


def test_listings_hide_temp_files(store_spec: StoreSpec) -> None:
    store = store_spec.storage()
    store.write_atomic("d/real", b"1")
    store.write_atomic(f"d/{TEMP_PREFIX}inflight", b"2")
    assert store.list_dir("d") == ["real"]
    assert [f.path for f in store.walk("d")] == ["real"]
    assert [f.path for f in store.walk("d", include_temp=True)] == [
        f"{TEMP_PREFIX}inflight",
        "real",
    ]


def test_temp_files_names_what_a_killed_writer_left_where_the_backends_writes_leave_any(
        store_spec: StoreSpec) -> None:
    """A backend whose writes go through temp files finds the stale ones; the others have none to find."""
    store = store_spec.storage()
    store.write_atomic("t/a/real", b"1")
    store.create_exclusive("t/b/record", b"2")
    now = time.time()
    assert store.temp_files("t", now=now, older_than=60) == TempFiles()  # whole writes leave nothing
    if not store.capabilities.temp_files:
        return
    killed = [f"t/a/{TEMP_PREFIX}killed", f"t/b/{TEMP_PREFIX}killed", f"t/{TEMP_PREFIX}killed"]
    for path in [*killed, f"t/b/{TEMP_PREFIX}inflight"]:
        with open(store.full_path(path), "wb") as fh:
            fh.write(b"half")
    for path in killed:
        os.utime(store.full_path(path), (now - 3600, now - 3600))

    assert store.temp_files("t", now=now, older_than=60) == TempFiles(sorted(killed), young=True)
    assert store.temp_files("t", now=now, older_than=60, recursive=False) == TempFiles([f"t/{TEMP_PREFIX}killed"])
    assert store.temp_files("t", now=now, older_than=60, prune=lambda d: d == "t/b") == TempFiles(
        sorted([f"t/a/{TEMP_PREFIX}killed", f"t/{TEMP_PREFIX}killed"]))
    assert store.temp_files("absent", now=now, older_than=60) == TempFiles()


def test_walk_lists_every_file_below_with_relative_paths_and_sizes(store_spec: StoreSpec) -> None:
    store = store_spec.storage()
    store.write_atomic("w/a", b"1")
    store.write_atomic("w/s/b", b"22")
    store.write_atomic("w/s/t/c", b"333")
    store.write_atomic("outside", b"4444")
    assert store.walk("w") == [FileInfo("a", 1), FileInfo("s/b", 2), FileInfo("s/t/c", 3)]


def test_delete_removes_files_and_directories_and_ignores_absent_paths(
    store_spec: StoreSpec,
) -> None:
    store = store_spec.storage()
    for path in ("d/a", "d/s/b", "d/s/c", "keep/x"):
        store.write_atomic(path, b"x")
    store.delete("d/a")
    assert not store.exists("d/a")
    store.delete("d", recursive=True)
    assert store.walk("d") == []
    assert not store.exists("d/s/b")
    store.delete("d", recursive=True)
    store.delete("never/existed")
    assert every_name(store) == ["keep/x"]


def test_local_recursive_delete_survives_a_writer_adding_a_file_during_the_walk(
    tmp_path: os.PathLike[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A losing committer completes _metadata in the checkpoint an abort is removing: the
    # new file lands after rmtree listed the directory, so its rmdir finds it not empty.
    store = open_storage(str(tmp_path))
    store.write_atomic("checkpoint_3/operators/p", b"x")
    target = os.path.join(str(tmp_path), "checkpoint_3")
    real_rmdir = os.rmdir
    raced = []

    def rmdir(path: str, *args: object, **kwargs: object) -> None:
        if not raced and os.path.basename(str(path)) == "checkpoint_3":
            raced.append(path)
            with open(os.path.join(target, "_metadata"), "wb") as f:
                f.write(b"late")
        real_rmdir(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "rmdir", rmdir)
    store.delete("checkpoint_3", recursive=True)
    assert raced
    assert not os.path.exists(target)


# -- publish ------------------------------------------------------------------------------


def stage(store: Storage, root: str, files: dict[str, bytes]) -> list[FileInfo]:
    for name, data in files.items():
        store.write_atomic(f"{root}/{name}", data)
    return [FileInfo(name, len(data)) for name, data in sorted(files.items())]


STAGED = {
    "part-0.parquet": b"a" * 10,
    "part-1.parquet": b"b" * 20,
    "nested/part-2.parquet": b"c" * 5,
}


def published(target: Storage, dst: str) -> dict[str, bytes]:
    return {f.path: target.read(f"{dst}/{f.path}") for f in target.walk(dst)}


def test_publish_files_makes_every_staged_file_present_at_the_destination(
    store_spec: StoreSpec,
) -> None:
    store = store_spec.storage("store")
    target = store_spec.storage("target")
    files = stage(store, "_staging/epoch=1/attempt=1/out", STAGED)

    how = publish_files(store, "_staging/epoch=1/attempt=1/out", target, "epoch=1", files)

    assert how in ("renamed", "copied")
    assert published(target, "epoch=1") == STAGED


def test_publish_files_again_after_a_full_publish_reports_already(store_spec: StoreSpec) -> None:
    store = store_spec.storage("store")
    target = store_spec.storage("target")
    files = stage(store, "stg", STAGED)
    publish_files(store, "stg", target, "epoch=1", files)

    assert publish_files(store, "stg", target, "epoch=1", files) == "already"
    assert publish_files(store, "stg", target, "epoch=1", files) == "already"
    assert published(target, "epoch=1") == STAGED


def test_publish_files_resumes_after_a_partial_copy(store_spec: StoreSpec) -> None:
    store = store_spec.storage("store")
    target = store_spec.storage("target")
    files = stage(store, "stg", STAGED)
    # A previous publish copied one file and then died; the staging is still complete.
    target.write_atomic("epoch=1/part-0.parquet", STAGED["part-0.parquet"])

    how = publish_files(store, "stg", target, "epoch=1", files)

    assert how == "copied"
    assert published(target, "epoch=1") == STAGED


def test_publish_files_resumes_when_published_files_already_left_staging(
    store_spec: StoreSpec,
) -> None:
    store = store_spec.storage("store")
    target = store_spec.storage("target")
    files = stage(store, "stg", STAGED)
    # A copy-then-delete publisher moved one file and died before the others.
    target.write_atomic("epoch=1/part-1.parquet", STAGED["part-1.parquet"])
    store.delete("stg/part-1.parquet")

    publish_files(store, "stg", target, "epoch=1", files)

    assert published(target, "epoch=1") == STAGED


def test_publish_files_replaces_a_wrong_sized_leftover_at_the_destination(
    store_spec: StoreSpec,
) -> None:
    store = store_spec.storage("store")
    target = store_spec.storage("target")
    files = stage(store, "stg", STAGED)
    target.write_atomic("epoch=1/part-0.parquet", b"torn")

    publish_files(store, "stg", target, "epoch=1", files)

    assert published(target, "epoch=1") == STAGED


def test_publish_files_refuses_when_a_staged_file_is_lost(store_spec: StoreSpec) -> None:
    store = store_spec.storage("store")
    target = store_spec.storage("target")
    files = stage(store, "stg", STAGED)
    store.delete("stg/part-1.parquet")

    with pytest.raises(PublishError, match="part-1.parquet"):
        publish_files(store, "stg", target, "epoch=1", files)


def test_publish_files_refuses_when_a_staged_file_has_the_wrong_size(store_spec: StoreSpec) -> None:
    store = store_spec.storage("store")
    target = store_spec.storage("target")
    files = stage(store, "stg", STAGED)
    store.write_atomic("stg/part-0.parquet", b"truncated")

    with pytest.raises(PublishError, match="part-0.parquet"):
        publish_files(store, "stg", target, "epoch=1", files)
    assert published(target, "epoch=1") == {}


def test_concurrent_publishers_of_the_same_staging_both_succeed(store_spec: StoreSpec) -> None:
    store = store_spec.storage("store")
    target = store_spec.storage("target")
    files = stage(store, "stg", STAGED)
    outcomes = at_once([lambda: publish_files(store, "stg", target, "epoch=1", files)] * 4)
    assert [o for o in outcomes if isinstance(o, BaseException)] == []
    assert published(target, "epoch=1") == STAGED


def stage_with_checksums(store: Storage, root: str, files: dict[str, bytes]) -> list[FileInfo]:
    """Stage ``files`` and return their manifest entries as a commit decision records them."""
    return [FileInfo(f.path, f.size, crc32c(files[f.path])) for f in stage(store, root, files)]


def test_publish_files_refuses_a_staged_file_damaged_after_the_decision(store_spec: StoreSpec) -> None:
    # Same size, one bit different: only the checksum can tell.
    store = store_spec.storage("store")
    target = store_spec.storage("target")
    files = stage_with_checksums(store, "stg", STAGED)
    flip_byte(store, "stg/nested/part-2.parquet")

    with pytest.raises(PublishError, match="nested/part-2.parquet.*CRC32C"):
        publish_files(store, "stg", target, "epoch=1", files)
    assert published(target, "epoch=1") == {}
    assert store.exists("stg/nested/part-2.parquet"), "nothing is deleted"


def test_publish_files_does_not_keep_a_same_sized_wrong_file_at_the_destination(store_spec: StoreSpec) -> None:
    store = store_spec.storage("store")
    target = store_spec.storage("target")
    files = stage_with_checksums(store, "stg", STAGED)
    target.write_atomic("epoch=1/part-0.parquet", b"X" * 10)  # a torn earlier copy, right size

    publish_files(store, "stg", target, "epoch=1", files)

    assert published(target, "epoch=1") == STAGED


def test_publish_files_publishes_only_the_listed_files(store_spec: StoreSpec) -> None:
    # The writer's bookkeeping stays behind on every backend, rename or copy.
    store = store_spec.storage("store")
    target = store_spec.storage("target")
    files = stage_with_checksums(store, "stg", STAGED)
    store.write_atomic("stg/_SUCCESS", b"")
    store.write_atomic("stg/.part-0.parquet.crc", b"crc")
    store.write_atomic("stg/nested/part-2.parquet.crc", b"crc")

    publish_files(store, "stg", target, "epoch=1", files)

    assert published(target, "epoch=1") == STAGED


# -- paths --------------------------------------------------------------------------------


ESCAPES = ["../outside", "a/../../outside", "/etc/passwd", "a\x00b", "a\\..\\b", "..", "x/.."]


@pytest.mark.parametrize("path", ESCAPES)
def test_paths_that_could_escape_the_root_are_refused_by_every_operation(store_spec: StoreSpec, path: str) -> None:
    store = store_spec.storage("inner")
    operations = [
        lambda: store.read(path),
        lambda: store.write_atomic(path, b"x"),
        lambda: store.create_exclusive(path, b"x"),
        lambda: store.delete(path, recursive=True),
        lambda: store.list_dir(path),
        lambda: store.walk(path),
        lambda: store.exists(path),
        lambda: store.size(path),
        lambda: store.child(path),
        lambda: store.url_of(path),
    ]
    for operation in operations:
        with pytest.raises(StorageError):
            operation()
    assert every_name(store_spec.storage()) == []


def test_child_storage_is_rooted_below_its_parent(store_spec: StoreSpec) -> None:
    parent = store_spec.storage()
    child = parent.child("pipelines/orders")
    child.write_atomic("a/b", b"x")
    assert parent.read("pipelines/orders/a/b") == b"x"
    assert type(child) is type(parent)
    assert child.url_of("a/b") == parent.url_of("pipelines/orders/a/b")
    assert child.url_of("./a//b/") == child.url_of("a/b")


# -- backends and their registration ------------------------------------------------------


def test_the_backend_is_chosen_by_url_protocol(store_spec: StoreSpec) -> None:
    expected = {"file": LocalStorage, "memory": MemoryStorage, "s3": ObjectStorage}[store_spec.backend]
    assert type(store_spec.storage()) is expected


def test_builtin_backends_are_registered_as_entry_points() -> None:
    from importlib.metadata import entry_points

    registered = {ep.name: ep.load() for ep in entry_points(group=ENTRY_POINT_GROUP)}
    assert registered["file"] is LocalStorage
    assert registered["memory"] is MemoryStorage
    assert registered["s3"] is ObjectStorage
    assert backend_for("file") is LocalStorage
    assert backend_for("memory") is MemoryStorage
    assert backend_for("s3") is ObjectStorage
    assert backend_for("s3a") is ObjectStorage


@pytest.mark.parametrize("protocol", ["hdfs", "gs", "abfs", "some-unregistered-protocol"])
def test_a_protocol_without_a_backend_is_refused_naming_the_supported_ones_and_the_way_out(
    protocol: str,
) -> None:
    # fsspec's generic create is check-then-write: such a store would silently break the
    # one-decision guarantee of the transaction log.
    with pytest.raises(StorageError) as info:
        open_storage(f"{protocol}://somewhere/store")
    message = str(info.value)
    assert f"{protocol!r} is not supported" in message
    assert "file, local, memory, s3, s3a" in message
    assert ENTRY_POINT_GROUP in message


def test_every_backend_declares_its_guarantees(store_spec: StoreSpec) -> None:
    caps = store_spec.storage().capabilities
    assert isinstance(caps, Capabilities)
    assert caps.conditional_create
    assert caps == {
        "file": Capabilities(conditional_create=True, atomic_rename_dir=True, checksum=None, temp_files=True),
        "memory": Capabilities(conditional_create=True, atomic_rename_dir=False, checksum=None),
        "s3": Capabilities(conditional_create=True, atomic_rename_dir=False, checksum="crc32c"),
    }[store_spec.backend]


def test_storage_is_an_interface_not_a_backend() -> None:
    with pytest.raises(TypeError):
        Storage("memory://x")  # type: ignore[abstract]


class ThirdPartyStorage(MemoryStorage):
    """A backend a third-party package would register for its own protocol."""


@pytest.fixture
def fake_entry_points(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[EntryPoint]]:
    """Entry points of the storage group as an installed plug-in would add them."""
    extra: list[EntryPoint] = []
    real = registry_module.entry_points

    def with_extra(group: str) -> list[EntryPoint]:
        return [*extra, *real(group=group)] if group == ENTRY_POINT_GROUP else list(real(group=group))

    monkeypatch.setattr(registry_module, "entry_points", with_extra)
    BACKENDS.forget()
    yield extra
    BACKENDS.forget()


def test_an_entry_point_backend_is_used_and_wins_over_the_builtin(
    fake_entry_points: list[EntryPoint],
) -> None:
    fake_entry_points.append(EntryPoint("memory", f"{__name__}:ThirdPartyStorage", ENTRY_POINT_GROUP))
    store = open_storage("memory://plugin-test")
    assert type(store) is ThirdPartyStorage


def test_a_broken_entry_point_is_a_storage_error_naming_it(
    fake_entry_points: list[EntryPoint],
) -> None:
    fake_entry_points.append(EntryPoint("brokenproto", f"{__name__}:NoSuchClass", ENTRY_POINT_GROUP))
    fake_entry_points.append(EntryPoint("notastorage", f"{__name__}:Boom", ENTRY_POINT_GROUP))
    with pytest.raises(StorageError, match="NoSuchClass"):
        backend_for("brokenproto")
    with pytest.raises(StorageError, match="not a Storage subclass"):
        backend_for("notastorage")


class CheckThenWriteStorage(MemoryStorage):
    """A backend whose create checks and then writes: two racing creators can both win."""

    def _put_if_absent(self, full: str, data: bytes) -> None:
        if self.fs.exists(full):
            raise FileExistsError(full)
        time.sleep(0.05)  # the window every check-then-write has, made wide
        self.fs.pipe_file(full, data)


class IgnoresConditionStorage(MemoryStorage):
    """A server that ignores ``If-None-Match``: every create overwrites."""

    def _put_if_absent(self, full: str, data: bytes) -> None:
        self.fs.pipe_file(full, data)


@pytest.mark.parametrize(
    ("backend", "why"),
    [("CheckThenWriteStorage", "concurrent creates of one key all succeeded"),
     ("IgnoresConditionStorage", "a second create of the same key succeeded")],
)
def test_a_store_whose_create_is_not_a_put_if_absent_is_refused_when_opened(
    fake_entry_points: list[EntryPoint], backend: str, why: str
) -> None:
    fake_entry_points.append(EntryPoint("memory", f"{__name__}:{backend}", ENTRY_POINT_GROUP))
    url = f"memory://probe-{uuid.uuid4().hex}"
    with pytest.raises(StorageError, match="does not honour conditional create") as info:
        open_storage(url)
    assert why in str(info.value)
    assert "entry-point group" in str(info.value), "the message names the way out"
    assert open_storage(url.replace("memory://", "file:///tmp/")).capabilities.conditional_create


def test_the_probe_runs_once_per_store_and_process_and_leaves_nothing_behind(
    store_spec: StoreSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    cls = type(store_spec.storage())
    real = cls._put_if_absent

    def counting(self: Storage, full: str, data: bytes) -> None:
        calls.append(full)
        real(self, full, data)

    monkeypatch.setattr(cls, "_put_if_absent", counting)
    forget_probes()
    store = store_spec.storage("fresh")
    assert len(calls) == 2 + PROBE_RACERS, "a double create and a race"
    store_spec.storage("fresh")
    assert len(calls) == 2 + PROBE_RACERS, "probed once per process"
    assert every_name(store_spec.storage()) == []
    if store_spec.backend == "file":
        assert not os.path.exists(store.full_path("")), "opening a store creates no directory"


def test_open_storage_treats_a_plain_path_as_a_local_directory(tmp_path: os.PathLike[str]) -> None:
    store = open_storage(str(tmp_path))
    assert isinstance(store, LocalStorage)
    assert store.url == f"file://{tmp_path}"
    with pytest.raises(StorageError):
        open_storage("")


# -- local disk specifics -----------------------------------------------------------------


def test_local_publish_is_one_directory_rename(local_spec: StoreSpec) -> None:
    store = local_spec.storage("store")
    target = local_spec.storage("target")
    files = stage(store, "stg", STAGED)
    inode = os.stat(store.full_path("stg/part-0.parquet")).st_ino

    assert publish_files(store, "stg", target, "epoch=1", files) == "renamed"

    assert os.stat(target.full_path("epoch=1/part-0.parquet")).st_ino == inode
    assert not store.exists("stg")


def test_local_create_exclusive_leaves_no_temp_file_behind(local_spec: StoreSpec) -> None:
    store = local_spec.storage()
    store.create_exclusive("r", b"1")
    with pytest.raises(AlreadyExistsError):
        store.create_exclusive("r", b"2")
    assert os.listdir(store.full_path("")) == ["r"]


def test_local_write_atomic_replaces_the_file_by_renaming_a_synced_temp_file(
    local_spec: StoreSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = local_spec.storage()
    synced = record_fsyncs(monkeypatch)
    store.write_atomic("f", b"1")
    first = os.stat(store.full_path("f")).st_ino
    store.write_atomic("f", b"2")
    assert os.stat(store.full_path("f")).st_ino != first, "a new inode renamed into place"
    files = [p for p in synced if not os.path.isdir(p)]
    assert len(files) == 2, "each temp file is synced before it becomes visible"
    assert os.listdir(store.full_path("")) == ["f"]


def record_fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Make ``os.fsync`` record the path of every file or directory it syncs."""
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        real_fsync(fd)
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))

    monkeypatch.setattr(os, "fsync", fsync)
    return synced


def test_local_renames_and_links_are_made_durable_by_syncing_the_directory(
    local_spec: StoreSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A rename or link is an entry in its directory: only an fsync of the directory makes
    # a record that was reported written survive a power loss.
    store = local_spec.storage("store")
    target = local_spec.storage("target")
    store.write_atomic("staging/a/part-0", b"0")
    synced = record_fsyncs(monkeypatch)

    store.write_atomic("records/x", b"1")
    assert store.full_path("records") in synced

    synced.clear()
    store.create_exclusive("records/y", b"2")
    assert store.full_path("records") in synced

    synced.clear()
    assert publish_files(store, "staging/a", target, "out/epoch=1", [FileInfo("part-0", 1)]) == "renamed"
    assert target.full_path("out") in synced, "the directory the epoch was renamed into"
    assert store.full_path("staging") in synced, "the directory it was renamed out of"


# -- the store's clock, checksums, listings -----------------------------------------------


def test_modified_is_the_store_clock_of_the_last_write(store_spec: StoreSpec) -> None:
    store = store_spec.storage()
    before = time.time()
    store.write_atomic("f", b"1")
    first = store.modified("f")
    # Same machine here, so the store's clock is this clock (S3 keeps whole seconds).
    assert before - 2 <= first <= time.time() + 2
    time.sleep(1.1)
    store.write_atomic("f", b"2")
    assert store.modified("f") > first
    with pytest.raises(FileNotFoundError):
        store.modified("missing")


def test_checksum_is_the_crc32c_of_the_content_and_kept_by_stores_that_keep_one(store_spec: StoreSpec) -> None:
    store = store_spec.storage()
    store.write_atomic("w", [b"hello ", b"world"])
    store.create_exclusive("c", b"created once")
    for path, data in (("w", b"hello world"), ("c", b"created once")):
        assert store.checksum(path) == crc32c(data)
        assert store.computed_checksum(path) == crc32c(data)
        kept = store.stored_checksum(path)
        if store.capabilities.checksum == "crc32c":
            assert kept == crc32c(data), "the store returns the checksum without a read of the data"
        else:
            assert kept is None


def test_a_file_changed_behind_the_store_gets_a_new_checksum(store_spec: StoreSpec) -> None:
    store = store_spec.storage()
    store.write_atomic("f", b"abcdef")
    flip_byte(store, "f")
    assert store.checksum("f") != crc32c(b"abcdef")
    assert store.checksum("f") == crc32c(store.read("f"))


def test_listings_see_files_written_by_another_client_at_once(store_spec: StoreSpec) -> None:
    # Another process writing to the store: a listing cache would hide its files.
    store = store_spec.storage()
    store.write_atomic("d/a", b"1")
    assert store.list_dir("d") == ["a"]
    assert [f.path for f in store.walk("d")] == ["a"]
    assert store.exists("d/a") and not store.exists("d/b")
    other = fsspec.filesystem(store.protocol, skip_instance_cache=True, **store_spec.options)
    other.pipe_file(store.full_path("d/b"), b"22")
    assert store.list_dir("d") == ["a", "b"]
    assert [f.path for f in store.walk("d")] == ["a", "b"]
    assert store.exists("d/b") and store.size("d/b") == 2
    other.rm_file(store.full_path("d/a"))
    assert store.list_dir("d") == ["b"]
    assert not store.exists("d/a")


def s3_requests(store: Storage) -> list[str]:
    """The names of the S3 requests ``store`` sends from now on (``ListObjectsV2``, ...)."""
    sent: list[str] = []
    store.exists("")  # (the client is made on first use)
    store.fs.s3.meta.events.register("before-send.s3", lambda event_name, **_: sent.append(event_name.split(".")[-1]))
    return sent


@pytest.mark.s3
def test_listing_an_absent_directory_on_s3_is_one_request_whatever_its_parent_holds(s3_spec: StoreSpec) -> None:
    """An epoch not begun yet, or a new run's index: s3fs listed the parent too (the whole log)."""
    store = s3_spec.storage()
    for name in ("epoch-1/begin", "epoch-2/begin", "runs/r/1", "a-file"):
        store.write_atomic(f"log/{name}", b"x")
    sent = s3_requests(store)

    assert store.list_dir("log/epoch-3") == []
    assert store.list_dir("log/a-file") == []  # (a file has no children either)

    assert sent == ["ListObjectsV2", "ListObjectsV2"]


@pytest.mark.s3
def test_a_listing_on_s3_reads_every_page(s3_spec: StoreSpec) -> None:
    store = s3_spec.storage()
    names = [f"n{i:04d}" for i in range(1003)]
    for name in names:
        store.fs.pipe_file(store.full_path(f"d/{name}"), b"")
    store.write_atomic("d/sub/x", b"x")
    sent = s3_requests(store)

    assert store.list_dir("d") == sorted([*names, "sub"])
    assert sent == ["ListObjectsV2", "ListObjectsV2"], "a page per thousand names"
