"""What an epoch leaves in a sink's target: nothing for no rows, one table for a snapshot sink,
and a record of the sinks a stage declared but did not write.

Every test runs on ``file://`` (rename) and ``memory://`` (copy) through ``Pipeline``.
"""

from __future__ import annotations

import dataclasses
import json
import logging

import pytest

from airflow_seatunnel_ckpt.core import Decision, EpochState, Pipeline, SinkMode, layout
from airflow_seatunnel_ckpt.core.errors import CorruptCheckpointError
from airflow_seatunnel_ckpt.core.models import PreparedRecord, SinkManifest
from airflow_seatunnel_ckpt.core.sinks.files import LATEST, OWNER_MARKER
from airflow_seatunnel_ckpt.core.storage import open_storage
from tests.core.conftest import StoreSpec
from tests.core.epochs import Participant, prepare_participant, published, run_epoch, stage, target_url


def target_entries(p: Pipeline, sink: str) -> list[str]:
    target = open_storage(target_url(p, sink), p.storage.storage_options)
    return [n for n in target.list_dir("") if n != OWNER_MARKER]


def prepare_sink(p: Pipeline, run_id: str, sink: str, blobs: list[bytes], mode: SinkMode,
                 not_written: tuple[str, ...] = ()) -> int:
    """Stage ``blobs`` (one row each) for ``sink`` in ``mode`` and prepare the run's epoch."""
    epoch = p.begin(run_id).epoch
    stage(p, epoch, 1, sink, blobs)
    manifest = p.manifest_for_staged(epoch, 1, sink, target_url(p, sink), rows=len(blobs))
    p.prepare(epoch, "ingest", 1, run_id=run_id, sinks=[dataclasses.replace(manifest, mode=mode)],
              base=p.restore_point(), not_written=not_written)
    return epoch


def commit(p: Pipeline, epoch: int) -> None:
    assert p.decide(epoch, Decision.COMMIT, "test", "test").decision is Decision.COMMIT
    p.commit(epoch)


# -- empty epochs ------------------------------------------------------------------------

def test_epoch_without_rows_publishes_nothing_but_is_committed_and_recorded(fast_spec: StoreSpec) -> None:
    p = fast_spec.pipeline()
    run_epoch(p, "run-1", Participant(sinks={"orders": [b"a", b"bb"]}))
    epoch = run_epoch(p, "run-2", Participant(sinks={"orders": []}))

    assert p.state(epoch) is EpochState.COMMITTED
    assert target_entries(p, "orders") == ["epoch=1"]  # no epoch=2/, no _SUCCESS
    [sink] = p.status(epoch).published
    assert (sink.sink, sink.rows, sink.files, sink.how, sink.published) == ("orders", 0, 0, "empty", False)
    again = p.commit(epoch)  # a retried commit task finds the same
    assert again.already_committed and again.empty == ["orders"]
    assert p.restore_point().epoch == epoch
    assert p.verify_prepared(epoch) == []
    run_epoch(p, "run-3", Participant(sinks={"orders": [b"c"]}))
    assert sorted(published(p, "orders")) == [1, 3]


def test_recovery_finishes_a_committing_epoch_without_rows(fast_spec: StoreSpec) -> None:
    p = fast_spec.pipeline()
    prepare_participant(p, "run-1", Participant(sinks={"orders": []}))
    p.decide(1, Decision.COMMIT, "test", "test")
    assert p.state(1) is EpochState.COMMITTING

    fast_spec.pipeline().recover(dry_run=False)

    assert p.state(1) is EpochState.COMMITTED
    assert target_entries(p, "orders") == []


def test_snapshot_sink_with_no_rows_still_replaces_the_table(fast_spec: StoreSpec) -> None:
    p = fast_spec.pipeline()
    commit(p, prepare_sink(p, "run-1", "totals", [b"x"], SinkMode.SNAPSHOT))
    commit(p, prepare_sink(p, "run-2", "totals", [], SinkMode.SNAPSHOT))
    assert target_entries(p, "totals") == [LATEST, "epoch=2"]


# -- snapshot sinks ----------------------------------------------------------------------

def test_snapshot_sink_keeps_only_the_newest_epoch_and_points_latest_at_it(fast_spec: StoreSpec) -> None:
    p = fast_spec.pipeline()
    for n in (1, 2, 3):
        commit(p, prepare_sink(p, f"run-{n}", "totals", [f"state-{n}".encode()], SinkMode.SNAPSHOT))
        target = open_storage(target_url(p, "totals"), p.storage.storage_options)
        assert target_entries(p, "totals") == [LATEST, f"epoch={n}"]
        assert target.read(LATEST).decode().strip() == f"epoch={n}"
        assert target.read(f"epoch={n}/part-00000.bin") == f"state-{n}".encode()
        summary = json.loads(target.read(f"epoch={n}/{layout.SUCCESS}"))
        assert summary["mode"] == "snapshot"


def test_changes_sink_keeps_every_epoch(fast_spec: StoreSpec) -> None:
    p = fast_spec.pipeline()
    for n in (1, 2):
        commit(p, prepare_sink(p, f"run-{n}", "orders", [b"r"], SinkMode.APPEND))
    assert target_entries(p, "orders") == ["epoch=1", "epoch=2"]


def test_sink_mode_is_stored_only_when_not_the_default_and_refused_when_unknown() -> None:
    manifest = SinkManifest("totals", "file:///t", "_staging/epoch=1/attempt=1/totals", [], 0)
    assert "mode" not in manifest.to_dict()
    snapshot = dataclasses.replace(manifest, mode=SinkMode.SNAPSHOT)
    assert SinkManifest.from_dict(snapshot.to_dict()) == snapshot
    with pytest.raises(CorruptCheckpointError, match="prepared-ingest: .*mode: input should be 'append', 'upsert'"):
        SinkManifest.from_dict({**snapshot.to_dict(), "mode": "full"}, "prepared-ingest")


# -- sinks declared but not written ------------------------------------------------------

def test_sink_not_written_is_in_the_prepared_record_the_commit_result_and_the_log(
        fast_spec: StoreSpec, caplog: pytest.LogCaptureFixture) -> None:
    p = fast_spec.pipeline()
    epoch = prepare_sink(p, "run-1", "orders", [b"a"], SinkMode.APPEND, not_written=("audit",))
    assert p.txlog.read_prepared(epoch, "ingest").not_written == ["audit"]

    with caplog.at_level(logging.WARNING, logger="airflow_seatunnel_ckpt.core.protocol.pipeline"):
        assert p.decide(epoch, Decision.COMMIT, "test", "test").decision is Decision.COMMIT
        result = p.commit(epoch)

    assert result.not_written == ["audit"]
    assert result.to_dict()["not_written"] == ["audit"]
    assert [s.sink for s in result.sinks if s.published] == ["orders"]
    assert any("['audit'] were declared but not written" in r.getMessage() for r in caplog.records)
    assert [(s.sink, s.how) for s in p.status(epoch).published] == [("orders", "renamed" if fast_spec.backend
                                                                     == "file" else "copied"),
                                                                    ("audit", "not_written")]
    assert p.commit(epoch).not_written == ["audit"]  # a retry reads it from the committed record


def test_prepared_record_without_not_written_still_reads() -> None:
    record = PreparedRecord(1, "ingest", 1, "run-1", 0.0, [], {}, {})
    data = record.to_dict()
    assert "not_written" not in data
    assert PreparedRecord.from_dict(data).not_written == []
    with pytest.raises(CorruptCheckpointError, match="not_written"):
        PreparedRecord.from_dict({**data, "not_written": [3]}, "prepared-ingest")
