"""What a replay refuses before it writes anything, and the records it relies on (no Spark).

The replay itself, end to end on Spark with Iceberg and Delta tables, is in
``tests/spark/test_replay.py``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from airflow_seatunnel_ckpt.core import layout
from airflow_seatunnel_ckpt.core.models import Decision, EpochState, SinkManifest, SinkMode
from airflow_seatunnel_ckpt.core.ops.replay import (
    ReplayError,
    ReplayPlan,
    begin_replay,
    finish_replay,
    plan_replay,
    resume_replay,
)
from airflow_seatunnel_ckpt.core.sinks import SinkCommit, markers
from airflow_seatunnel_ckpt.core.storage import FileInfo
from tests.core.conftest import StoreSpec
from tests.core.epochs import Participant, published, run_epoch, stage, target_url


def test_a_file_sink_is_replayable_and_its_snapshot_mode_only_through_the_newest_epoch(fast_spec: StoreSpec) -> None:
    pipeline = fast_spec.pipeline()
    run_epoch(pipeline, "run-1")
    run_epoch(pipeline, "run-2")
    assert sorted(plan_replay(pipeline, 1).sinks) == ["orders"]

    snapshot = fast_spec.pipeline("totals")
    for run_id in ("run-1", "run-2"):
        epoch = snapshot.begin(run_id).epoch
        stage(snapshot, epoch, 1, "orders", [b"t"])
        manifest = snapshot.manifest_for_staged(epoch, 1, "orders", target_url(snapshot, "orders"), 1)
        manifest = dataclasses.replace(manifest, mode=SinkMode.SNAPSHOT)
        snapshot.prepare(epoch, "ingest", 1, run_id=run_id, sinks=[manifest], base=snapshot.restore_point())
        snapshot.decide(epoch, Decision.COMMIT, "all prepared", by="test")
        snapshot.commit(epoch)
    with pytest.raises(ReplayError, match="sink 'orders' cannot be replayed atomically: it is a snapshot sink.*"
                                          "omit --to-epoch"):
        plan_replay(snapshot, 1, 1)
    assert snapshot.epochs() == [1, 2]
    assert plan_replay(snapshot, 1).to_epoch == 2


def test_a_replay_outside_the_committed_epochs_or_while_one_is_in_flight_is_refused(fast_spec: StoreSpec) -> None:
    pipeline = fast_spec.pipeline()
    run_epoch(pipeline, "run-1", Participant(sinks={}))
    with pytest.raises(ReplayError, match=r"cannot replay epochs 2..1: the range must lie within 1..1"):
        plan_replay(pipeline, 2)
    pipeline.begin("run-2")
    with pytest.raises(ReplayError, match=r"while epoch 2 \(run 'run-2'\) is OPEN.*recover orders --apply"):
        resume_replay(pipeline)


def test_a_replays_manifest_keeps_the_epochs_it_replaces_and_files_name_the_epoch_that_placed_them(
        fast_spec: StoreSpec) -> None:
    manifest = SinkManifest("orders", "iceberg://lake/orders", "_staging/epoch=9/attempt=1/orders",
                            [FileInfo("replayed-6/a.parquet", 3, 1)], 3,
                            table={"type": "iceberg", "table": "lake.orders"}, replaces=(6, 7, 8), force_replace=True)
    assert SinkManifest.from_dict(manifest.to_dict()) == manifest
    plain = dataclasses.replace(manifest, replaces=(), force_replace=False)
    assert "replaces" not in plain.to_dict() and SinkManifest.from_dict(plain.to_dict()) == plain
    assert dataclasses.replace(manifest, rows=0, files=[]).publishes  # an empty replay still removes rows

    pipeline = fast_spec.pipeline()
    request = SinkCommit("orders", "store", 9, manifest, pipeline.storage, 0, store_id="0123456789abcdef")
    short = markers.placement(request).rsplit("/", 1)[1].split("-e")[0]
    assert markers.placed_epoch(f"s3://w/data/c=1/orders/orders/{short}-e12/part-0.parquet", request) == 12
    assert markers.placed_epoch(f"c=1/orders/orders/{short}-e7-00003.parquet", request) == 7  # Delta's names
    assert markers.placed_epoch(f"data/orders/other_sink/{short}-e7/p.parquet", request) is None
    assert markers.placed_epoch("data/orders/orders/ffffffff-e7/p.parquet", request) is None  # another store


def replay_then_next_epoch(pipeline: Any, plan: ReplayPlan, between: Callable[[], object]) -> None:
    """A replay of ``plan`` as the stage runtime runs it, ``between`` its plan and its begin."""
    between()
    epoch, run_id = begin_replay(pipeline, plan, reason="fix", by="test")
    staging = layout.staging_dir(epoch, 1, "orders")
    for e in plan.epochs:
        pipeline.storage.write_atomic(f"{staging}/replayed-{e}/part-e{e}.bin", f"new{e}".encode())
    manifest = pipeline.manifest_for_staged(epoch, 1, "orders", target_url(pipeline, "orders"), len(plan.epochs))
    finish_replay(pipeline, epoch, run_id, plan, 1, sinks=[manifest], operators={}, reason="fix", by="test")


def test_a_normal_epoch_committed_between_a_replays_plan_and_its_begin_refuses_the_replay_and_nothing_is_read_twice(
        fast_spec: StoreSpec) -> None:
    pipeline = fast_spec.pipeline()
    for i, name in enumerate(("a", "b"), start=1):
        run_epoch(pipeline, f"run-{i}", Participant(sinks={"orders": [name.encode()]},
                                                    sources={"files": {"files": [name]}}))
    plan = plan_replay(pipeline, 1)

    def normal_epoch() -> None:  # a scheduled run reads file c while the replay is still planning
        run_epoch(pipeline, "run-3", Participant(sinks={"orders": [b"c"]}, sources={"files": {"files": ["c"]}}))

    with pytest.raises(ReplayError, match=r"epoch 3 \(run 'run-3'\) committed after the replay of epochs 1..2 was "
                                          r"planned against epoch 2.*replay again"):
        replay_then_next_epoch(pipeline, plan, normal_epoch)
    replay_epoch = max(pipeline.epochs())
    assert pipeline.state(replay_epoch) is EpochState.ABORTED  # refused before any decision: nothing published
    assert published(pipeline, "orders") == {1: {"part-00000.bin": b"a"}, 2: {"part-00000.bin": b"b"},
                                              3: {"part-00000.bin": b"c"}}

    # The next epoch starts from everything read so far, each file once; a new replay runs.
    consumed = [f for e in pipeline.restore_point().source_entries("files") for f in e["offsets"]["files"]]
    assert consumed == ["a", "b", "c"]
    replay_then_next_epoch(pipeline, plan_replay(pipeline, 1), lambda: None)
    consumed = [f for e in pipeline.restore_point().source_entries("files") for f in e["offsets"]["files"]]
    assert consumed == ["a", "b", "c"]
    nxt = run_epoch(pipeline, "run-4", Participant(sinks={"orders": [b"d"]}, sources={"files": {"files": ["d"]}}))
    assert pipeline.state(nxt) is EpochState.COMMITTED
