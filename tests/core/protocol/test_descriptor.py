"""The pipeline descriptor: owner, settings and declared shape kept in the store.

Also the protocol rules that rest on it: a commit needs every declared participant, the
epoch index is keyed on (DAG, run id), a source left out of an epoch keeps its history,
and the default store does not depend on the working directory.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from airflow_seatunnel_ckpt.cli import main
from airflow_seatunnel_ckpt.core import CheckpointConfig, CheckpointStore, Decision, EpochState, layout
from airflow_seatunnel_ckpt.core.errors import (
    CheckpointError,
    CorruptCheckpointError,
    NotPreparedError,
    PipelineOwnershipError,
)
from airflow_seatunnel_ckpt.core.protocol.descriptor import (
    ParticipantDescriptor,
    PipelineDescriptor,
    StateDescriptor,
    ensure_descriptor,
    read_descriptor,
    record_states,
    transfer_ownership,
)
from tests.core.conftest import StoreSpec
from tests.core.epochs import Participant, flip_byte, prepare_participant, published, run_epoch

SECRET = "hunter2-Sup3rSecret"


def shape(*names: str) -> dict[str, ParticipantDescriptor]:
    return {n: ParticipantDescriptor.from_spec({"orders": {"type": "file", "path": "file:///in", "format": "json"}},
                                               {"orders": {"type": "file", "path": "file:///out"}})
            for n in names}


# -- the record ---------------------------------------------------------------------------

def test_a_new_version_is_written_only_when_the_content_changes(fast_spec: StoreSpec) -> None:
    p = fast_spec.pipeline("orders", prepared_timeout_s=42)

    first = ensure_descriptor(p, dag_id="orders_dag", participants=shape("ingest"))
    again = ensure_descriptor(fast_spec.pipeline("orders", prepared_timeout_s=42), dag_id="orders_dag",
                              participants=shape("ingest"))
    changed = ensure_descriptor(p, dag_id="orders_dag", participants=shape("ingest", "enrich"))

    assert (first.version, again.version, changed.version) == (1, 1, 2)
    assert sorted(p.storage.list_dir(layout.DESCRIPTOR)) == ["v000001.json", "v000002.json"]
    latest = read_descriptor(p.storage)
    assert latest == changed
    assert latest is not None and latest.declared_participants == ["enrich", "ingest"]
    assert latest.config["prepared_timeout_s"] == 42
    assert read_descriptor(p.storage, version=1) == first
    # Versions are write-once: the stored bytes of version 1 never change.
    assert PipelineDescriptor.from_dict(first.to_dict()) == first


def test_states_learned_by_the_runtime_survive_a_redeclaration(local_spec: StoreSpec) -> None:
    p = local_spec.pipeline("orders")
    ensure_descriptor(p, dag_id="d", participants=shape("ingest"))
    state = StateDescriptor("key_value", ["customer"], 4, {"total": ["sum", "amount"]},
                            [{"name": "customer", "type": "string"}, {"name": "total", "type": "double"}])

    v2 = record_states(p, "ingest", {"totals": state})
    unchanged = record_states(p, "ingest", {"totals": state})
    v3 = ensure_descriptor(p, dag_id="d", participants=shape("ingest"), config=p.config.replace(max_retain=3))

    assert v2 is not None and unchanged is not None and (v2.version, unchanged.version, v3.version) == (2, 2, 3)
    assert v3.participants["ingest"].states == {"totals": state}
    assert v3.config["max_retain"] == 3


def test_the_descriptor_keeps_no_secrets(local_spec: StoreSpec) -> None:
    config = CheckpointConfig.from_mapping({
        "storage_url": local_spec.sub_url("store"), "storage_options": {"key": "AKIA", "secret": SECRET}})
    p = CheckpointStore(config).pipeline("orders")
    participants = {"ingest": ParticipantDescriptor.from_spec(
        {"orders": {"type": "file", "path": f"s3://user:{SECRET}@bucket/in",
                    "storage_options": {"secret": SECRET}, "aws_secret_access_key": SECRET}},
        {"table": {"type": "file", "path": f"s3://bucket/out?sig={SECRET}"}})}

    ensure_descriptor(p, dag_id="d", participants=participants, store_conn_id="lake")

    stored = p.storage.read(layout.descriptor_path(1))
    assert SECRET.encode() not in stored and b"AKIA" not in stored
    descriptor = read_descriptor(p.storage)
    assert descriptor is not None and descriptor.store_conn_id == "lake"
    assert "storage_options" not in descriptor.config and "storage_url" not in descriptor.config


def test_a_damaged_descriptor_is_reported_with_its_path(local_spec: StoreSpec) -> None:
    p = local_spec.pipeline("orders")
    ensure_descriptor(p, dag_id="d", participants=shape("ingest"))
    p.storage.write_atomic(layout.descriptor_path(1), b"not a frame")

    with pytest.raises(CorruptCheckpointError, match="v000001.json"):
        read_descriptor(p.storage)


# -- ownership ----------------------------------------------------------------------------

def test_a_second_dag_using_the_same_pipeline_is_refused_with_the_way_out(local_spec: StoreSpec) -> None:
    p = local_spec.pipeline("orders")
    ensure_descriptor(p, dag_id="orders_hourly", participants=shape("ingest"))
    run_epoch(p, "manual__2026-01-01T00:00:00+00:00", Participant(sources={"in": {"files": ["a.json"]}}))

    with pytest.raises(PipelineOwnershipError) as refused:
        ensure_descriptor(local_spec.pipeline("orders"), dag_id="orders_backfill", participants=shape("ingest"))

    message = str(refused.value)
    assert "'orders_hourly'" in message and "'orders_backfill'" in message
    assert "another name" in message and "--transfer-to orders_backfill" in message
    # The way out that gives up the consumed-input history says what that costs.
    assert "publishes again what 'orders' already published, if both read the same input" in message
    assert read_descriptor(p.storage).version == 1  # type: ignore[union-attr]

    transfer_ownership(p, "orders_backfill")
    taken = ensure_descriptor(local_spec.pipeline("orders"), dag_id="orders_backfill", participants=shape("ingest"))
    assert taken.owner_dag_id == "orders_backfill"


def test_the_same_run_id_in_two_dags_gets_two_epochs(fast_spec: StoreSpec) -> None:
    p = fast_spec.pipeline("orders")
    run_id = "manual__2026-01-01T00:00:00+00:00"

    first = p.txlog.begin(run_id, dag_id="dag_a")
    p.abort(first.epoch, "make room for the next epoch")
    second = p.txlog.begin(run_id, dag_id="dag_b")

    assert (first.epoch, second.epoch) == (1, 2)
    assert (first.dag_id, second.dag_id) == ("dag_a", "dag_b")
    assert p.txlog.epoch_for_run(run_id, dag_id="dag_a") == 1
    assert p.txlog.epoch_for_run(run_id, dag_id="dag_b") == 2
    assert p.txlog.begin(run_id, dag_id="dag_b").epoch == 2
    assert layout.run_key(run_id, "dag_a") != layout.run_key(run_id, "dag_b") != layout.run_key(run_id)


def test_a_committed_run_of_another_dag_does_not_hide_a_new_run_with_the_same_id(local_spec: StoreSpec) -> None:
    p = local_spec.pipeline("orders")
    run_id = "manual__2026-01-01T00:00:00+00:00"
    ensure_descriptor(p, dag_id="old_dag", participants=shape("ingest"))
    assert run_epoch(p, run_id) == 1
    transfer_ownership(p, "new_dag")

    # The new owner's run with the same run id is a new run: a new epoch, published.
    fresh = local_spec.pipeline("orders")
    epoch = fresh.begin(run_id).epoch
    assert epoch == 2 and fresh.status(epoch).begin.dag_id == "new_dag"  # type: ignore[union-attr]
    assert fresh.epoch_for_run(run_id, dag_id="old_dag") == 1


# -- the descriptor's settings -----------------------------------------------------------

def test_a_pipeline_opened_with_the_store_settings_uses_its_own(local_spec: StoreSpec) -> None:
    declared = local_spec.pipeline("orders", prepared_timeout_s=5, max_retain=2)
    ensure_descriptor(declared, dag_id="d", participants=shape("ingest"))

    plain = CheckpointStore.from_url(local_spec.sub_url("store")).pipeline("orders")
    overridden = CheckpointStore.from_url(local_spec.sub_url("store")).pipeline(
        "orders", overrides={"prepared_timeout_s": 7})

    assert (plain.config.prepared_timeout_s, plain.config.max_retain) == (5, 2)
    assert (overridden.config.prepared_timeout_s, overridden.config.max_retain) == (7, 2)
    assert CheckpointStore.from_url(local_spec.sub_url("store")).list_pipelines() == ["orders"]


# -- commit needs the declared participants ----------------------------------------------

def test_commit_is_refused_while_a_declared_participant_has_not_prepared(fast_spec: StoreSpec) -> None:
    p = fast_spec.pipeline("orders")
    ensure_descriptor(p, dag_id="d", participants=shape("ingest", "enrich"))
    epoch = prepare_participant(p, "run-1", Participant("ingest")).epoch

    with pytest.raises(NotPreparedError, match="'enrich'"):
        p.decide(epoch, Decision.COMMIT, "all prepared?")
    with pytest.raises(NotPreparedError, match="'enrich'"):
        p.decide(epoch, Decision.COMMIT, "a subset", participants=["ingest"])

    assert p.state(epoch) is EpochState.PREPARED
    prepare_participant(p, "run-1", Participant("enrich", sinks={"enriched": [b"e"]}), epoch=epoch)
    assert p.decide(epoch, Decision.COMMIT, "both prepared").participants == {"enrich": 1, "ingest": 1}


def test_cli_commit_is_refused_while_a_declared_participant_has_not_prepared(
        local_spec: StoreSpec, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SEATUNNEL_CKPT_STORE", raising=False)
    p = local_spec.pipeline("orders")
    ensure_descriptor(p, dag_id="d", participants=shape("ingest", "enrich"))
    epoch = prepare_participant(p, "run-1", Participant("ingest")).epoch

    code = main(["--store", local_spec.sub_url("store"), "commit", "orders", str(epoch)])

    out, err = capsys.readouterr()
    assert code == 2 and "'enrich'" in err and "not prepared" in err
    assert p.state(epoch) is EpochState.PREPARED
    assert published(p, "orders") == {}


def test_cli_describe_shows_and_transfers_the_owner(local_spec: StoreSpec,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    p = local_spec.pipeline("orders", max_retain=4)
    ensure_descriptor(p, dag_id="orders_dag", participants=shape("ingest"))
    url = local_spec.sub_url("store")

    assert main(["--store", url, "describe", "orders"]) == 0
    out = capsys.readouterr().out
    assert "owner DAG orders_dag" in out and "max_retain = 4" in out and "participant ingest" in out

    assert main(["--store", url, "--json", "describe", "orders", "--transfer-to", "orders_v2"]) == 0
    assert json.loads(capsys.readouterr().out)["owner_dag_id"] == "orders_v2"


# -- a source left out of an epoch -------------------------------------------------------

def test_a_source_left_out_of_an_epoch_keeps_its_consumed_history(fast_spec: StoreSpec) -> None:
    p = fast_spec.pipeline("orders", full_checkpoint_interval=2)
    run_epoch(p, "run-1", Participant(sources={"s": {"files": ["A"]}, "t": {"files": ["X"]}}))
    run_epoch(p, "run-2", Participant(sources={"t": {"files": ["Y"]}}))  # the spec leaves s out
    run_epoch(p, "run-3", Participant(sources={"t": {"files": ["Z"]}}))

    point = p.restore_point()
    assert point.source_entries("s") == [{"epoch": 1, "offsets": {"files": ["A"]}}]
    assert [e["offsets"]["files"] for e in point.source_entries("t")] == [["X"], ["Y"], ["Z"]]
    # s comes back: its history continues where it stopped, so A is not read again.
    run_epoch(p, "run-4", Participant(sources={"s": {"files": ["B"]}}))
    entries = p.restore_point().source_entries("s")
    assert [e["offsets"]["files"] for e in entries] == [["A"], ["B"]]
    assert p.checkpoints.verify(4) == []


def test_a_left_out_source_keeps_its_history_when_the_base_restores_from_the_log(local_spec: StoreSpec) -> None:
    p = local_spec.pipeline("orders")
    run_epoch(p, "run-1", Participant(sources={"s": {"files": ["A"]}, "t": {"files": ["X"]}}))
    flip_byte(p.storage, layout.metadata_path(1))  # epoch 2 restores by rebuilding from the log

    run_epoch(local_spec.pipeline("orders"), "run-2", Participant(sources={"t": {"files": ["Y"]}}))

    entries = local_spec.pipeline("orders").restore_point().source_entries("s")
    assert entries == [{"epoch": 1, "offsets": {"files": ["A"]}}]
    assert p.checkpoints.verify(2) == []


# -- the default store --------------------------------------------------------------------

def test_the_default_store_is_the_same_from_any_working_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SEATUNNEL_CKPT_STORE", raising=False)
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "airflow"))
    urls = []
    for worker in ("worker-a", "worker-b"):
        (tmp_path / worker).mkdir()
        monkeypatch.chdir(tmp_path / worker)
        urls.append(CheckpointConfig().storage_url)

    assert urls == [f"file://{tmp_path}/airflow/seatunnel-ckpt"] * 2


def test_a_relative_store_path_is_resolved_once_where_the_config_is_built(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.chdir(tmp_path)
    config = CheckpointConfig.from_mapping({"storage_url": "ckpt"})

    assert config.storage_url == f"file://{tmp_path}/ckpt"
    assert "relative path" in caplog.text
    # Handed to another process (a spark-submit driver, another worker) it stays put.
    monkeypatch.chdir(os.path.dirname(tmp_path))
    assert CheckpointConfig.from_mapping(config.to_mapping()).storage_url == f"file://{tmp_path}/ckpt"
    # A relative file:// URL is a URL with a host: refused, naming the form to use.
    with pytest.raises(CheckpointError, match=":///absolute/path"):
        CheckpointStore.from_url("file://./ckpt")
