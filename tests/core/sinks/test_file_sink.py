"""The file sink behind the sink contract: one owner per target, refused before the decision; idempotent publish.

Every test runs on each backend (``file://`` renames a directory, ``memory://`` and S3 on
the moto server copy file by file), and drives the protocol through ``Pipeline``.
"""

from __future__ import annotations

import json

import pytest

from airflow_seatunnel_ckpt.core import Decision, EpochState, layout
from airflow_seatunnel_ckpt.core.codec import crc32c
from airflow_seatunnel_ckpt.core.ops.replay import ReplayError, begin_replay, finish_replay, plan_replay
from airflow_seatunnel_ckpt.core.sinks.files import EPOCHS, OWNER_MARKER, publish_sink_dir
from airflow_seatunnel_ckpt.core.storage import FileInfo, PublishMethod, open_storage
from tests.core.conftest import StoreSpec
from tests.core.epochs import Participant, run_epoch, target_url
from tests.core.storage.test_publish import DATA, staged_epoch, target_files


def test_a_commit_retried_after_publishing_recognises_the_files_by_checksum(store_spec: StoreSpec) -> None:
    p = store_spec.pipeline()
    epoch = run_epoch(p, "run-1")
    target = open_storage(target_url(p, "orders"), p.storage.storage_options)
    summary = target.read(f"{layout.published_dir(epoch)}/_SUCCESS")
    files = [FileInfo(f"part-{i:05d}.bin", len(b), crc32c(b)) for i, b in enumerate([b"o1", b"o22"])]
    owner = {"store": store_spec.sub_url("store"), "pipeline": p.name}
    how = publish_sink_dir(p.storage, "gone", target, layout.published_dir(epoch), files, json.loads(summary),
                           owner=owner, retries=0)
    assert how is PublishMethod.ALREADY


# -- 4d: one owner per target ---------------------------------------------------------------


def test_a_target_another_pipeline_owns_is_refused_before_the_decision_and_its_owner_goes_on(
        store_spec: StoreSpec) -> None:
    shared = store_spec.sub_url("shared-target")
    first = store_spec.pipeline("orders")
    e1, _ = staged_epoch(first, DATA, target=shared)
    first.decide(e1, Decision.COMMIT, "ok", by="test")
    first.commit(e1)
    before = target_files(first, e1, shared)

    second = store_spec.pipeline("payments")
    e2, _ = staged_epoch(second, {"part-00000.parquet": b"payments"}, target=shared)
    assert e2 == e1, "both pipelines are at epoch 1: their files would mix in epoch=1/"
    decision = second.decide(e2, Decision.COMMIT, "ok", by="test")

    # Refused while the epoch could still be aborted: aborted, not left COMMITTING.
    assert decision.decision is Decision.ABORT
    reason = decision.reason
    assert "'orders'" in reason and "'payments'" in reason and OWNER_MARKER in reason and "epoch 1" in reason
    assert "own target" in reason, "the reason names the way out"
    assert second.state(e2) is EpochState.ABORTED
    assert target_files(first, e1, shared) == before
    # The rightful owner's next epoch publishes as before.
    e3, _ = staged_epoch(first, {"part-00000.parquet": b"next"}, run_id="run-2", target=shared)
    assert first.decide(e3, Decision.COMMIT, "ok", by="test").decision is Decision.COMMIT
    first.commit(e3)
    assert target_files(first, e3, shared)["part-00000.parquet"] == b"next"


def test_a_target_of_the_same_pipeline_name_in_another_store_is_refused_before_the_decision(
        store_spec: StoreSpec) -> None:
    shared = store_spec.sub_url("shared-target")
    here = store_spec.pipeline("orders")
    e1, _ = staged_epoch(here, DATA, target=shared)
    here.decide(e1, Decision.COMMIT, "ok", by="test")
    here.commit(e1)

    elsewhere = StoreSpec(store_spec.backend, store_spec.sub_url("other"), store_spec.options).pipeline("orders")
    e2, _ = staged_epoch(elsewhere, {"part-00000.parquet": b"other"}, target=shared)
    decision = elsewhere.decide(e2, Decision.COMMIT, "ok", by="test")
    assert decision.decision is Decision.ABORT and "store" in decision.reason
    assert elsewhere.state(e2) is EpochState.ABORTED


def test_an_owner_marker_that_is_not_json_or_a_damaged_epochs_pointer_is_refused_before_the_decision(
        store_spec: StoreSpec) -> None:
    p = store_spec.pipeline()
    target = open_storage(target_url(p, "orders"), p.storage.storage_options)
    target.write_atomic(OWNER_MARKER, b"not json")
    epoch, _ = staged_epoch(p, DATA)
    decision = p.decide(epoch, Decision.COMMIT, "ok", by="test")
    assert decision.decision is Decision.ABORT and "not valid JSON" in decision.reason
    assert p.state(epoch) is EpochState.ABORTED

    target.delete(OWNER_MARKER)
    run_epoch(p, "run-2", Participant(sinks={"orders": [b"o2"]}))
    target.write_atomic(EPOCHS, b"{")  # damaged: a replay of the target could not swap its epochs
    plan = plan_replay(p, 2)
    replay, run_id = begin_replay(p, plan, reason="fix", by="test")
    staging = layout.staging_dir(replay, 1, "orders")
    p.storage.write_atomic(f"{staging}/replayed-2/part-00000.bin", b"new")
    manifest = p.manifest_for_staged(replay, 1, "orders", target_url(p, "orders"), 1)
    with pytest.raises(ReplayError, match="not a valid epoch pointer"):
        finish_replay(p, replay, run_id, plan, 1, sinks=[manifest], operators={}, reason="fix", by="test")
    assert p.state(replay) is EpochState.ABORTED


def test_the_owner_marker_is_written_once_and_names_store_and_pipeline(store_spec: StoreSpec) -> None:
    p = store_spec.pipeline()
    run_epoch(p, "run-1")
    run_epoch(p, "run-2")
    target = open_storage(target_url(p, "orders"), p.storage.storage_options)
    assert json.loads(target.read(OWNER_MARKER)) == {"pipeline": "orders", "store": store_spec.sub_url("store")}
    assert target.list_dir("") == [OWNER_MARKER, "epoch=1", "epoch=2"]
