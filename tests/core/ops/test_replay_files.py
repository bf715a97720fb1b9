"""A replay of a file sink, without Spark: the replay's directory swapped in through ``_EPOCHS``.

Three epochs publish ``old1``..``old3``; a replay of epochs 2..3 stages ``new2`` and
``new3`` and commits. Killed before each storage write of the replay, on a renaming and a
copying backend, a reader following the documented read path sees the old epochs or the
new ones, and recovery plus a second replay (or its roll-forward) ends with the new ones
and no replaced directory left. A downstream ``pipeline_output`` plan honours the pointer.
"""

from __future__ import annotations

import time

import pytest

from airflow_seatunnel_ckpt.core import Pipeline, layout
from airflow_seatunnel_ckpt.core.models import EpochState
from airflow_seatunnel_ckpt.core.ops.replay import ReplayError, begin_replay, finish_replay, plan_replay, resume_replay
from airflow_seatunnel_ckpt.core.protocol.recovery import recover
from airflow_seatunnel_ckpt.core.sinks.files import EPOCHS, EpochsPointer, current_epoch_dirs
from airflow_seatunnel_ckpt.core.sources.tables import TableSourceError, plan_published_epochs
from airflow_seatunnel_ckpt.core.storage import open_storage
from tests.core import faults
from tests.core.conftest import StoreSpec, forget
from tests.core.epochs import Participant, run_epoch, target_url

OLD = {"epoch=1": b"old1", "epoch=2": b"old2", "epoch=3": b"old3"}


def current(pipeline: Pipeline) -> dict[str, bytes]:
    """What a reader following the documented read path reads: directory -> its data, read again on a change."""
    target = open_storage(target_url(pipeline, "orders"), pipeline.storage.storage_options)
    while True:
        version, dirs = current_epoch_dirs(target)
        try:
            data = {d: b"".join(target.read(f"{d}/{f.path}") for f in target.walk(d) if not f.path.startswith("_"))
                    for d in dirs}
        except FileNotFoundError:
            continue
        if current_epoch_dirs(target)[0] == version:
            return data


def new_of(pipeline: Pipeline) -> dict[str, bytes]:
    """The new epochs: epoch 1 as it was, and the replay's directory with the replayed epochs' rows."""
    replay = max(e for e in pipeline.epochs() if pipeline.state(e) is not EpochState.ABORTED)
    return {"epoch=1": b"old1", f"epoch={replay}": b"new2new3"}


def world(spec: StoreSpec) -> Pipeline:
    pipeline = spec.pipeline()
    for e in (1, 2, 3):
        run_epoch(pipeline, f"run-{e}", Participant(sinks={"orders": [f"old{e}".encode()]}))
    assert current(pipeline) == OLD
    return pipeline


def replay(pipeline: Pipeline) -> None:
    """Replay epochs 2..3 as the stage runtime does: each epoch's files below ``replayed-<e>/``."""
    if resume_replay(pipeline) is not None:
        return
    plan = plan_replay(pipeline, 2)
    epoch, run_id = begin_replay(pipeline, plan, reason="fix", by="test")
    staging = layout.staging_dir(epoch, 1, "orders")
    for e in plan.epochs:
        pipeline.storage.write_atomic(f"{staging}/replayed-{e}/part-e{e}.bin", f"new{e}".encode())
    manifest = pipeline.manifest_for_staged(epoch, 1, "orders", target_url(pipeline, "orders"), 2)
    finish_replay(pipeline, epoch, run_id, plan, 1, sinks=[manifest], operators={}, reason="fix", by="test")


def test_a_file_sink_replay_killed_before_each_write_leaves_old_or_new_for_readers_and_finishes(
        fast_spec: StoreSpec, monkeypatch: pytest.MonkeyPatch) -> None:
    plan = faults.install(monkeypatch)
    seen: list[str] = []

    def setup(n: int) -> Pipeline:
        if n > 1:
            forget(StoreSpec(fast_spec.backend, f"{fast_spec.url}-{n - 1}", fast_spec.options))
        return world(StoreSpec(fast_spec.backend, f"{fast_spec.url}-{n}", fast_spec.options))

    def resume(pipeline: Pipeline) -> None:
        read = current(pipeline)
        assert read in (OLD, new_of(pipeline)), read  # never a mix
        seen.append("old" if read == OLD else "new")
        try:
            replay(pipeline)
        except ReplayError as exc:  # killed before its decision: recovery aborts it once its lease expired
            assert "recover" in str(exc)
            recover(pipeline, dry_run=False, now=time.time() + 3600)
            assert current(pipeline) == OLD
            replay(pipeline)

    def check(pipeline: Pipeline, crashed: bool) -> None:
        assert current(pipeline) == new_of(pipeline)
        target = open_storage(target_url(pipeline, "orders"), pipeline.storage.storage_options)
        assert sorted(n for n in target.list_dir("") if n.startswith("epoch=")) == sorted(new_of(pipeline))
        assert all(pipeline.state(e).final for e in pipeline.epochs())
        assert pipeline.state(pipeline.last_committed_epoch() or 0) is EpochState.COMMITTED

    run = faults.crash_at_every_mutation(plan, setup, replay, resume, check)
    assert run.crash_points > 10 and {"old", "new"} <= set(seen)  # crashes fell before and after the swap


def test_pipeline_output_planning_skips_hidden_directories_and_refuses_a_replay_of_epochs_it_read() -> None:
    listing = {f"epoch={e}/{name}": {} for e in (1, 2, 3, 4) for name in ("_SUCCESS", f"p{e}.parquet")}
    listing[EPOCHS] = {}
    pointer = EpochsPointer(2, frozenset({"epoch=2", "epoch=3"}), {"epoch=4": ("epoch=2", "epoch=3")})

    fresh = plan_published_epochs(listing, [], "src", pointer)
    assert (fresh["epochs"], fresh["files"]) == ([1, 4], ["epoch=1/p1.parquet", "epoch=4/p4.parquet"])
    history = [{"epoch": 1, "offsets": {"epochs": [1, 2]}}]
    with pytest.raises(TableSourceError, match=r"upstream epoch 4 is a replay that replaced \['epoch=2'\], which "
                                               r"this source already read.*skip_replays=True"):
        plan_published_epochs(listing, history, "src", pointer)
    skipped = plan_published_epochs(listing, history, "src", pointer, skip_replays=True)
    assert (skipped["epochs"], skipped["files"]) == ([4], [])  # marked read, nothing read twice
    pending = EpochsPointer(1, frozenset({"epoch=4"}))  # the replay's directory while it is published
    assert plan_published_epochs(listing, [], "src", pending)["epochs"] == [1, 2, 3]
