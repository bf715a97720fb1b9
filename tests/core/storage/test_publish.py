"""Publishing at the edge: exactly what the commit decided, and only that (the target's owner: tests/core/sinks).

Every test runs on each backend (``file://`` renames a directory, ``memory://`` and S3 on
the moto server copy file by file), and drives the protocol through ``Pipeline``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from airflow_seatunnel_ckpt.core import Decision, EpochState, Pipeline, layout
from airflow_seatunnel_ckpt.core.errors import ConfigError, PublishError, StorageError
from airflow_seatunnel_ckpt.core.models import SinkManifest
from airflow_seatunnel_ckpt.core.storage import ObjectStorage, PublishMethod, Storage, open_storage
from tests.core.conftest import StoreSpec
from tests.core.epochs import Participant, flip_byte, prepare_participant, published, run_epoch, target_url


def staged_epoch(p: Pipeline, files: dict[str, bytes], *, run_id: str = "run-1",
                 target: str | None = None) -> tuple[int, SinkManifest]:
    """Begin an epoch, stage ``files`` for sink ``orders`` as a writer would, prepare it."""
    epoch = p.begin(run_id).epoch
    staging = p.staging_path(epoch, 1, "orders")
    for name, data in files.items():
        p.storage.write_atomic(f"{staging}/{name}", data)
    manifest = p.manifest_for_staged(epoch, 1, "orders", target or target_url(p, "orders"), rows=len(files))
    p.prepare(epoch, "ingest", 1, run_id=run_id, sinks=[manifest], base=p.restore_point())
    return epoch, manifest


def target_files(p: Pipeline, epoch: int, url: str | None = None) -> dict[str, bytes]:
    """Every file of the epoch's published directory (``_SUCCESS`` included)."""
    target = open_storage(url or target_url(p, "orders"), p.storage.storage_options)
    d = layout.published_dir(epoch)
    return {f.path: target.read(f"{d}/{f.path}") for f in target.walk(d, include_temp=True)}


DATA = {"part-00000.parquet": b"a" * 100, "part-00001.parquet": b"b" * 50}


def truncate(storage: Storage, path: str) -> None:
    storage.write_atomic(path, storage.read(path)[:-1])


# -- 4a: the bytes that were decided --------------------------------------------------------


@pytest.mark.parametrize("damage", [flip_byte, truncate], ids=["bit-flip", "truncation"])
def test_a_staged_file_damaged_after_the_commit_decision_is_not_published(
    store_spec: StoreSpec, damage: Callable[[Storage, str], None]
) -> None:
    p = store_spec.pipeline()
    epoch, manifest = staged_epoch(p, DATA)
    assert p.decide(epoch, Decision.COMMIT, "ok", by="test").decision is Decision.COMMIT
    damaged = f"{manifest.staging}/part-00001.parquet"
    damage(p.storage, damaged)

    with pytest.raises(PublishError, match="part-00001.parquet") as info:
        p.commit(epoch)

    assert "COMMITTING" in str(info.value)
    assert p.state(epoch) is EpochState.COMMITTING, "roll forward only: the epoch waits for a repair"
    assert target_files(p, epoch) == {}, "nothing of the epoch is visible"
    assert p.storage.exists(damaged) and p.storage.exists(f"{manifest.staging}/part-00000.parquet")

    # The way out the message names: put the decided bytes back, commit again.
    p.storage.write_atomic(damaged, DATA["part-00001.parquet"])
    p.commit(epoch)
    assert p.state(epoch) is EpochState.COMMITTED
    assert published(p, "orders") == {epoch: DATA}


# -- 4b: only the manifest, the same layout everywhere --------------------------------------


def test_only_the_manifest_and_the_summary_are_published_on_every_backend(store_spec: StoreSpec) -> None:
    p = store_spec.pipeline()
    writer_bookkeeping = {
        "_SUCCESS": b"",  # Spark's empty marker: readers must see ours, not this one
        ".part-00000.parquet.crc": b"crc0",
        "part-00001.parquet.crc": b"crc1",
        "_committed_123": b"{}",
        "_started_123": b"",
    }
    epoch, manifest = staged_epoch(p, {**DATA, **writer_bookkeeping})
    assert sorted(f.path for f in manifest.files) == sorted(DATA)
    p.decide(epoch, Decision.COMMIT, "ok", by="test")

    result = p.commit(epoch)

    out = target_files(p, epoch)
    assert sorted(out) == ["_SUCCESS", *sorted(DATA)]
    assert {k: v for k, v in out.items() if k != "_SUCCESS"} == DATA
    assert json.loads(out["_SUCCESS"])["files"] == [{"path": k, "size": len(v)} for k, v in sorted(DATA.items())]
    expected_how = "renamed" if store_spec.backend == "file" else "copied"
    assert [s.how for s in result.sinks] == [expected_how]
    assert [s.how for s in p.status(epoch).published] == [expected_how]


def test_publish_methods_keep_the_values_stored_in_committed_records() -> None:
    assert [m.value for m in PublishMethod] == ["renamed", "copied", "already"]
    assert PublishMethod("copied") is PublishMethod.COPY


# -- 4c: partition directories are data -----------------------------------------------------


def test_partition_directories_whose_column_starts_with_an_underscore_are_published(store_spec: StoreSpec) -> None:
    p = store_spec.pipeline()
    rows = {"_tenant=a/part-00000.parquet": b"rows of a", "_tenant=b/part-00000.parquet": b"rows of b",
            "_tenant=b/.part-00000.parquet.crc": b"crc", "_temporary/0/part-9.parquet": b"in flight"}
    epoch, manifest = staged_epoch(p, rows)
    assert sorted(f.path for f in manifest.files) == ["_tenant=a/part-00000.parquet", "_tenant=b/part-00000.parquet"]
    p.decide(epoch, Decision.COMMIT, "ok", by="test")
    p.commit(epoch)
    assert published(p, "orders") == {epoch: {k: v for k, v in rows.items() if k.endswith("00000.parquet")
                                              and "/." not in k}}


# -- retries ---------------------------------------------------------------------------------


def test_a_transient_store_error_while_publishing_is_retried(
    fast_spec: StoreSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = fast_spec.pipeline(max_retries=2)
    record = prepare_participant(p, "run-1", Participant())
    p.decide(record.epoch, Decision.COMMIT, "ok", by="test")
    failures: list[str] = []
    cls = type(p.storage)
    real = cls.write_atomic

    def flaky(self: Storage, path: str, data: object) -> int:
        if path.endswith("_SUCCESS") and len(failures) < 2:
            failures.append(path)
            raise StorageError("injected: the store timed out")
        return real(self, path, data)  # type: ignore[arg-type]

    monkeypatch.setattr(cls, "write_atomic", flaky)
    p.commit(record.epoch)
    assert len(failures) == 2
    assert p.state(record.epoch) is EpochState.COMMITTED


# -- what verification costs on S3 ------------------------------------------------------------


def test_on_s3_verifying_staged_and_published_files_reads_no_data(
    s3_spec: StoreSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every object this package writes or copies carries a CRC32C that HEAD returns.
    def no_reads(self: Storage, path: str) -> int:
        raise AssertionError(f"{path} was read to checksum it")

    monkeypatch.setattr(ObjectStorage, "computed_checksum", no_reads)
    p = s3_spec.pipeline()
    epoch = run_epoch(p, "run-1")
    p.commit(epoch)  # again: recognises the published copies by their kept checksum
    assert published(p, "orders") == {epoch: {"part-00000.bin": b"o1", "part-00001.bin": b"o22"}}


def test_on_s3_a_staged_object_without_a_kept_checksum_is_read_and_still_refused_when_damaged(
    s3_spec: StoreSpec,
) -> None:
    # Written by another tool (a Spark s3a writer): no CRC32C kept, so publish reads it.
    p = s3_spec.pipeline()
    epoch, manifest = staged_epoch(p, DATA)
    p.decide(epoch, Decision.COMMIT, "ok", by="test")
    path = f"{manifest.staging}/part-00000.parquet"
    p.storage.fs.pipe_file(p.storage.full_path(path), b"A" * 100)  # plain PUT, same size
    assert p.storage.stored_checksum(path) is None

    with pytest.raises(PublishError, match="part-00000.parquet.*CRC32C"):
        p.commit(epoch)
    assert p.state(epoch) is EpochState.COMMITTING


def test_a_sink_target_on_an_unsupported_store_is_refused_at_prepare_before_any_decision(
    fast_spec: StoreSpec,
) -> None:
    # Refused only at publish, the epoch would be decided commit and stuck COMMITTING.
    p = fast_spec.pipeline()
    with pytest.raises(ConfigError, match="'hdfs' is not supported"):
        staged_epoch(p, DATA, target="hdfs://namenode:8020/warehouse/orders")
    assert p.state(1) is EpochState.OPEN


# -- what publishing costs on S3 --------------------------------------------------------------


class S3Requests:
    """Every request the store's S3 client sends, by operation, and how many copies were in flight at once.

    A botocore event hook on the client s3fs uses; ``latency_s`` delays each request as
    a remote store's round trip would, so that overlapping requests can be observed.
    """

    def __init__(self, storage: Storage, latency_s: float = 0.0) -> None:
        import asyncio

        self.ops: list[str] = []
        self.copying = 0
        self.max_copying = 0
        storage.exists("")  # the client exists once the first request was made
        events = storage.fs.s3.meta.events

        async def before(model: Any, **_: Any) -> None:
            self.ops.append(model.name)
            if model.name == "CopyObject":
                self.copying += 1
                self.max_copying = max(self.max_copying, self.copying)
            if latency_s:
                await asyncio.sleep(latency_s)

        def after(model: Any, **_: Any) -> None:
            if model.name == "CopyObject":
                self.copying -= 1

        # A request ends in after-call, or in after-call-error when the store answers an error.
        ends = ("after-call.s3", "after-call-error.s3")
        events.register("before-call.s3", before)
        for end in ends:
            events.register(end, after)
        self._unregister = lambda: [events.unregister("before-call.s3", before),
                                    *(events.unregister(end, after) for end in ends)]

    def close(self) -> None:
        self._unregister()


def _commit_requests(spec: StoreSpec, files: int, run_id: str, latency_s: float = 0.0) -> S3Requests:
    p = spec.pipeline(f"requests-{files}", publish_concurrency=4)
    epoch, _ = staged_epoch(p, {f"part-{i:05d}.parquet": bytes([i]) * (10 + i) for i in range(files)},
                            run_id=run_id)
    p.decide(epoch, Decision.COMMIT, "ok", by="test")
    requests = S3Requests(p.storage, latency_s)
    try:
        p.commit(epoch)
    finally:
        requests.close()
    assert p.state(epoch) is EpochState.COMMITTED
    assert len(target_files(p, epoch, target_url(p, "orders"))) == files + 1  # + _SUCCESS
    return requests


@pytest.mark.s3
def test_on_s3_publishing_a_file_costs_one_check_and_one_copy(s3_spec: StoreSpec) -> None:
    # The requests a commit adds per staged file: its size and kept CRC32C in one HEAD,
    # one server-side copy. The destination is listed once, not probed file by file, and
    # no HEAD precedes a copy whose own outcome says as much.
    few, many = _commit_requests(s3_spec, 2, "run-1"), _commit_requests(s3_spec, 22, "run-1")
    per_file = (len(many.ops) - len(few.ops)) / 20
    copies = many.ops.count("CopyObject") - few.ops.count("CopyObject")
    assert copies == 20
    assert per_file <= 2.0, (per_file, sorted(set(many.ops)), {op: many.ops.count(op) for op in set(many.ops)})


@pytest.mark.s3
def test_on_s3_files_are_published_in_parallel_up_to_the_configured_concurrency(s3_spec: StoreSpec) -> None:
    requests = _commit_requests(s3_spec, 12, "run-1", latency_s=0.05)
    assert 2 <= requests.max_copying <= 4  # publish_concurrency=4


@pytest.mark.parametrize("value", [0, 257, "8", True])
def test_a_publish_concurrency_outside_1_to_256_is_refused_naming_the_setting(value: object) -> None:
    from airflow_seatunnel_ckpt.core import CheckpointConfig

    with pytest.raises(ConfigError, match="publish_concurrency must be an integer in 1..256"):
        CheckpointConfig.from_mapping({"storage_url": "memory://x", "publish_concurrency": value})
