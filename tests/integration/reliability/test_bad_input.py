"""Bad input gets a clear error and changes nothing in the store.

Names that could leave their directory (``..``, ``/``, ``\\``, NUL, absolute, empty, very
long), absurd epochs and attempts, manifests pointing outside their attempt's staging,
files from a newer format version, malformed JSON, frames claiming a huge decompressed
size (a decompression bomb), and a store URL carrying credentials, which must never
appear in an error or a log line. Every case compares a snapshot of the whole store and
the sink targets (path, size and CRC32C of every file) before and after.
"""

from __future__ import annotations

import json
import logging
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pydantic
import pytest
import zstandard

from airflow_seatunnel_ckpt.core import (
    CheckpointStore,
    Decision,
    OperatorState,
    PartRef,
    codec,
    layout,
)
from airflow_seatunnel_ckpt.core.errors import (
    CheckpointError,
    ConfigError,
    CorruptCheckpointError,
    EpochNotFoundError,
    FencedAttemptError,
    IncompatibleFormatError,
    InvalidEpochError,
    InvalidNameError,
)
from airflow_seatunnel_ckpt.core.models import SinkManifest
from airflow_seatunnel_ckpt.core.storage import FileInfo
from tests.integration.reliability import invariants, synthetic
from tests.integration.reliability.conftest import BuiltWorlds, WorldFactory
from tests.integration.reliability.scenarios import _history, drain
from tests.integration.reliability.synthetic import World

BAD_NAMES: list[Any] = [
    "..",
    "a/../b",
    "a/b",
    "a\\b",
    "a\x00b",
    "/etc/passwd",
    "",
    "x" * 10_000,
    ".hidden",
    "_txlog",
    7,
    None,
]
BAD_EPOCHS: list[Any] = [-1, 0, 10**13, 2**63, True, 1.5, "1", None]


def short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 24 else f"{text[:12]}...({len(text)} chars)"


def in_s3_slice(test: str, params: dict[str, object]) -> bool:
    """CI on S3: validation does not depend on the store, so a few names and epochs do."""
    if "name" in params:
        return params["name"] in ("..", "/etc/passwd")
    if "epoch" in params:
        return params["epoch"] == -1
    if "payload" in params:
        return params["payload"] == b"{not json"
    return True


def store_snapshot(world: World) -> dict[str, tuple[Any, ...]]:
    """Path -> (size, content) of every file of the store and of both sink targets.

    The content is the CRC32C of the bytes on a local disk; on S3 it is the ETag (the MD5
    of a single-PUT object's bytes) and LastModified that one listing returns for every
    object, so a snapshot costs a LIST instead of a GET per file.
    """
    p = world.pipeline()
    out: dict[str, tuple[Any, ...]] = {}
    for label, storage in [("store", p.storage)] + [(s, world.target_storage(s)) for s in synthetic.SINKS]:
        if storage.protocol not in ("s3", "s3a"):
            for f in storage.walk("", include_temp=True):
                out[f"{label}:{f.path}"] = (f.size, codec.crc32c(storage.read(f.path)))
            continue
        prefix = storage.full_path("") + "/"
        for name, info in storage.fs.find(storage.full_path(""), detail=True).items():
            if info.get("type") != "directory":
                out[f"{label}:{name.removeprefix(prefix)}"] = (info["size"], info["ETag"], info["LastModified"])
    return out


def _open_epoch(world: World) -> None:
    _history(world)
    world.pipeline().begin("run-3")


@pytest.fixture
def open_epoch(make_world: WorldFactory, built_worlds: BuiltWorlds) -> World:
    """Two committed epochs, and epoch 3 begun by run-3 (undecided, nothing staged yet):
    built once per backend, restored for each case."""
    return built_worlds.get(make_world, "open-epoch", _open_epoch)


def refused(
    world: World,
    call: Callable[[], Any],
    error: type[Exception] | tuple[type[Exception], ...],
    *words: str,
) -> str:
    before = store_snapshot(world)
    with pytest.raises(error) as info:
        call()
    message = str(info.value)
    for word in words:
        assert word in message, message
    assert store_snapshot(world) == before, "the store changed"
    return message


@pytest.mark.parametrize("name", BAD_NAMES, ids=short)
def test_unsafe_names_are_refused_with_the_store_unchanged(open_epoch: World, name: Any) -> None:
    world = open_epoch
    p = world.pipeline()
    base = p.restore_point()
    good_sink = SinkManifest("a", world.target("a"), layout.staging_dir(3, 1, "a"), [], 0)
    calls: dict[str, Callable[[], Any]] = {
        "pipeline": lambda: world.store().pipeline(name),
        "participant": lambda: p.prepare(3, name, 1, run_id="run-3", sinks=[]),
        "sink": lambda: p.staging_path(3, 1, name),
        "manifest sink": lambda: p.prepare(
            3,
            "ingest",
            1,
            run_id="run-3",
            base=base,
            sinks=[SinkManifest(name, world.target("a"), layout.staging_dir(3, 1, "a"), [], 0)],
        ),
        "source": lambda: p.prepare(
            3,
            "ingest",
            1,
            run_id="run-3",
            sinks=[good_sink],
            base=base,
            sources={name: {"files": []}},
        ),
        "operator": lambda: p.prepare(
            3,
            "ingest",
            1,
            run_id="run-3",
            sinks=[good_sink],
            base=base,
            operators={name: OperatorState(1, ["k"], {})},
        ),
        "part path": lambda: layout.part_path(3, "operators", name, 0, 1),
    }
    for what, call in calls.items():
        # ".hidden" and "_txlog" are fine as paths but reserved as names; a record (the
        # manifest) built with a name that is no string refuses it itself.
        wrong_type = (InvalidNameError, TypeError, pydantic.ValidationError)
        message = refused(world, call, wrong_type if name in (7, None) else InvalidNameError)
        assert message and len(message) < 400, (what, message)


@pytest.mark.parametrize("epoch", BAD_EPOCHS, ids=short)
def test_absurd_epochs_and_attempts_are_refused_with_the_store_unchanged(open_epoch: World, epoch: Any) -> None:
    world = open_epoch
    p = world.pipeline()
    for call in (
        lambda: p.state(epoch),
        lambda: p.status(epoch),
        lambda: p.commit(epoch),
        lambda: p.abort(epoch, "bad input"),
        lambda: p.decide(epoch, Decision.ABORT, "bad input"),
        lambda: p.staging_path(epoch, 1, "a"),
        lambda: p.prepare(3, "ingest", epoch, run_id="run-3", sinks=[]),
    ):
        refused(world, call, InvalidEpochError)


def test_an_epoch_that_never_began_cannot_be_decided_or_created(open_epoch: World) -> None:
    world = open_epoch
    p = world.pipeline()
    for call in (
        lambda: p.abort(999, "no such epoch"),
        lambda: p.decide(999, Decision.COMMIT, "no such epoch"),
        lambda: p.commit(999),
        lambda: p.state(999),
    ):
        refused(world, call, CheckpointError, "999")
    assert p.epochs() == [1, 2, 3]


def test_manifests_pointing_outside_their_attempts_staging_are_refused(open_epoch: World) -> None:
    world = open_epoch
    p = world.pipeline()
    staging = layout.staging_dir(3, 1, "a")
    p.storage.write_atomic(f"{staging}/part-0.txt", b"3:0,1\n")
    cases = {
        "staging climbs out": (f"{staging}/../../../../checkpoint_2", [], InvalidNameError),
        "another sink's staging": (layout.staging_dir(3, 1, "ab"), [], FencedAttemptError),
        "another attempt's staging": (layout.staging_dir(3, 2, "a"), [], FencedAttemptError),
        "absolute staging": ("/etc", [], InvalidNameError),
        "file climbs out": (
            staging,
            [FileInfo("../../../../../_txlog/epoch-000000000002/decision", 10)],
            InvalidNameError,
        ),
        "absolute file": (staging, [FileInfo("/etc/passwd", 10)], InvalidNameError),
        "empty file name": (staging, [FileInfo("", 0)], InvalidNameError),
    }
    for label, (where, files, error) in cases.items():
        manifest = SinkManifest("a", world.target("a"), where, files, 1)

        def prepare(m: SinkManifest = manifest) -> Any:
            return p.prepare(3, "ingest", 1, run_id="run-3", sinks=[m], sources={"in": {"files": []}})

        message = refused(world, prepare, error)
        assert message, label


def test_state_part_paths_outside_the_pipeline_are_refused(open_epoch: World) -> None:
    world = open_epoch
    p = world.pipeline()
    bad = PartRef("../other-pipeline/checkpoint_1/operators/x/part-0-1", 10, 0, 1)
    op = OperatorState(1, ["k"], {0: [bad]})
    refused(
        world,
        lambda: p.prepare(3, "ingest", 1, run_id="run-3", sinks=[], operators={"x": op}),
        InvalidNameError,
        "operator 'x' part",
    )


# -- files from a newer format version, malformed JSON, bombs ---------------------------


def frame(
    payload: bytes,
    *,
    version: int = codec.FORMAT_VERSION,
    raw_len: int | None = None,
    stored: bytes | None = None,
    kind: codec.PayloadKind = codec.PayloadKind.JSON,
) -> bytes:
    """A state-file frame with every checksum right, but any version or claimed size."""
    header = codec._HEADER.pack(codec.MAGIC, version, 0, int(kind), 0, 3, 0)
    header += codec._HEADER_CRC.pack(codec.crc32c(header))
    stored = zstandard.ZstdCompressor().compress(payload) if stored is None else stored
    lengths = codec._CHUNK.pack(len(payload) if raw_len is None else raw_len, len(stored), 0)[:8]
    head = lengths + codec._U32.pack(codec.crc32c(stored, codec.crc32c(lengths)))
    end = codec._CHUNK.pack(0, 0, 0) + codec._TRAILER_TAIL.pack(len(payload) if raw_len is None else raw_len, 1)
    body = header + head + stored + end
    return body + codec._U32.pack(codec.crc32c(body))


@pytest.fixture
def committed(make_world: WorldFactory, built_worlds: BuiltWorlds) -> World:
    """Two committed epochs: built once per backend, restored for each case."""
    return built_worlds.get(make_world, "committed", _history)


def test_a_metadata_file_from_a_newer_format_version_is_refused_by_name(committed: World) -> None:
    world = committed
    p = world.pipeline()
    path = layout.metadata_path(2)
    where = p.storage.describe_path(path)
    meta = codec.decode_json(p.storage.read(path))
    for data, words in (
        # The frame itself is version 2 ...
        (frame(json.dumps(meta).encode(), version=2), ("format version 2", "upgrade")),
        # ... or a version-1 frame holds a version-2 _metadata document.
        (codec.encode_json({**meta, "format_version": 2}), ("format version 2", "reads 1")),
    ):
        p.storage.write_atomic(path, data)
        with pytest.raises(IncompatibleFormatError) as info:
            p.checkpoints.read_metadata(2)
        assert where in str(info.value) and all(w in str(info.value) for w in words), info.value
        problems = p.checkpoints.verify(2)
        assert problems and problems[0].path == where


@pytest.mark.parametrize(
    "payload",
    [b"{not json", b"\xff\xfe", b"[1, 2, 3]", b'{"type": "decision"}', b"null"],
    ids=["syntax", "not-utf8", "a-list", "missing-fields", "null"],
)
def test_malformed_json_in_a_record_is_reported_with_the_file_name(open_epoch: World, payload: bytes) -> None:
    world = open_epoch
    p = world.pipeline()
    synthetic.stage(world, "run-3", 1)
    path = layout.record_path(3, "decision")
    p.storage.write_atomic(path, frame(payload))
    where = p.storage.describe_path(path)
    before = store_snapshot(world)
    for call in (lambda: p.txlog.read_decision(3), lambda: p.status(3), lambda: p.commit(3)):
        with pytest.raises(CorruptCheckpointError) as info:
            call()
        assert where in str(info.value), info.value
    # Recovery reports the damaged record by name and touches nothing of the epoch.
    report = p.recover(dry_run=False, now=time.time() + 10**6)
    assert [a.epoch for a in report.errors] == [3] and where in report.errors[0].error
    assert store_snapshot(world) == before


@pytest.mark.parametrize("bomb", ["claims-4GiB", "expands-past-its-claim"])
def test_a_frame_claiming_a_huge_decompressed_size_is_refused_without_inflating_it(
    open_epoch: World, bomb: str
) -> None:
    world = open_epoch
    p = world.pipeline()
    synthetic.stage(world, "run-3", 1)
    if bomb == "claims-4GiB":
        data = frame(b"{}", raw_len=2**32 - 1)
    else:  # 256 MiB of zeros compress to a few KiB; the frame claims 100 bytes
        data = frame(b"x" * 100, stored=zstandard.ZstdCompressor().compress(b"\0" * (256 << 20)))
    path = layout.record_path(3, "decision")
    p.storage.write_atomic(path, data)
    where = p.storage.describe_path(path)
    tracemalloc.start()
    started = time.monotonic()
    try:
        with pytest.raises(CorruptCheckpointError) as info:
            p.txlog.read_decision(3)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert where in str(info.value), info.value
    assert peak < 16 << 20, f"decoding allocated {peak} bytes"
    assert time.monotonic() - started < 5
    with pytest.raises(CorruptCheckpointError):
        codec.decode(data, "bomb")


def test_a_truncated_or_garbage_file_is_never_mistaken_for_a_frame() -> None:
    good = codec.encode_json({"a": 1})
    for data in (
        b"",
        b"STCK",
        good[:10],
        good[:-1],
        good + b"x",
        b"PK\x03\x04" + good[4:],
        b"\0" * 64,
    ):
        with pytest.raises(CorruptCheckpointError) as info:
            codec.decode_json(data, "some/file")
        assert "some/file" in str(info.value)


# -- credentials --------------------------------------------------------------------

SECRET = "s3cr3t-Do-Not-Print-42"


def test_a_store_url_with_a_password_is_refused_without_printing_it(
    make_world: WorldFactory, caplog: pytest.LogCaptureFixture
) -> None:
    world = make_world()
    scheme, rest = world.store_url.split("://", 1)
    caplog.set_level(logging.DEBUG)
    for url in (
        f"{scheme}://admin:{SECRET}@{rest.lstrip('/')}",
        f"{scheme}://:{SECRET}@{rest.lstrip('/')}",
    ):
        with pytest.raises(CheckpointError) as info:
            CheckpointStore.from_url(url, world.storage_options).pipeline("orders").begin("run-1")
        message = str(info.value)
        assert SECRET not in message and "***@" in message and "storage options" in message, message
    assert not [r for r in caplog.records if SECRET in r.getMessage()]
    # Nothing was created, locally (fsspec would read file://user:pw@host/x as a relative
    # path below the working directory) or in the bucket.
    assert not list(Path.cwd().glob(f"*{SECRET}*")) and not list(Path.cwd().glob("admin*"))
    assert world.pipeline().epochs() == []


@pytest.mark.parametrize("url", ["file://localhost/srv/ckpt", "file://srv/ckpt", "local://host/x"])
def test_a_local_store_url_with_a_host_is_refused_not_created_below_the_working_directory(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CheckpointError, match=":///absolute/path"):
        CheckpointStore.from_url(url).pipeline("orders").begin("run-1")
    assert list(tmp_path.iterdir()) == []


def test_a_sink_target_url_with_a_password_is_refused_before_anything_is_written(
    open_epoch: World, caplog: pytest.LogCaptureFixture
) -> None:
    world = open_epoch
    p = world.pipeline()
    caplog.set_level(logging.DEBUG)
    target = f"s3://admin:{SECRET}@bucket/out"
    manifest = SinkManifest("a", target, layout.staging_dir(3, 1, "a"), [], 0)
    message = refused(
        world,
        lambda: p.prepare(
            3,
            "ingest",
            1,
            run_id="run-3",
            sinks=[manifest],
            base=p.restore_point(),
            sources={"in": {"files": []}},
        ),
        ConfigError,
        "sink 'a' target URL",
        "storage options",
    )
    assert SECRET not in message
    assert not [r for r in caplog.records if SECRET in r.getMessage()]


def test_secrets_in_storage_options_are_never_shown(make_world: WorldFactory) -> None:
    world = make_world()
    options = {**world.storage_options, "token": SECRET}
    store = CheckpointStore.from_url(world.store_url, world.storage_options)
    shown = [
        repr(store),
        repr(store.config.replace(storage_options=options)),
        str(store.config.replace(storage_options=options).to_mapping(include_secrets=False)),
    ]
    assert not [text for text in shown if SECRET in text], shown


def test_the_pipeline_goes_on_after_every_refusal(open_epoch: World) -> None:
    """After bad input the same pipeline still publishes every record exactly once."""
    world = open_epoch
    p = world.pipeline()
    for name in BAD_NAMES:
        with pytest.raises((InvalidNameError, TypeError)):
            p.prepare(3, name, 1, run_id="run-3", sinks=[])
    with pytest.raises(EpochNotFoundError):
        p.abort(12345, "no such epoch")
    synthetic.run_dag_run(world, "run-3")
    drain(world)
    problems = invariants.check_world(world, drained=True)
    assert not problems, problems
