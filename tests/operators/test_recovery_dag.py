"""The scheduled recovery DAG of ``dags/``: one mapped task per pipeline of the store."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from airflow_seatunnel_ckpt.core import CheckpointStore, EpochState
from airflow_seatunnel_ckpt.core.errors import StorageError
from airflow_seatunnel_ckpt.core.storage import publish
from airflow_seatunnel_ckpt.operators import metrics
from tests.epoch_test_dags import (
    build_epoch_dag,
    load_recovery_dag,
    logical_date,
    published_rows,
    rows_for,
    task_states,
)

pytestmark = pytest.mark.airflow


def test_recovery_dag_resolves_every_pipeline_of_the_store(
        run_at: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stats: Any) -> None:
    storage_url, target = f"file://{tmp_path}/store", tmp_path / "table"
    store = CheckpointStore.from_url(storage_url)

    # orders: the commit task died after the decision -> COMMITTING.
    dag = build_epoch_dag("recover_orders", storage_url, f"file://{target}",
                          commit={"retries": 0})

    def killed(self: Any, *args: Any, **kwargs: Any) -> str:
        raise StorageError("worker killed before publishing")

    with monkeypatch.context() as crash:
        crash.setattr(publish, "publish_files", killed)
        crashed = run_at(dag, logical_date(0))
    # payments: a run began an hour ago and never prepared (its worker vanished). Ages
    # are read with the store's clock, so the begin record's file is an hour old.
    store.pipeline("payments").txlog.begin("scheduled__stale", now=time.time() - 3600)
    hour_ago = time.time() - 3600
    os.utime(tmp_path / "store" / "payments" / "_txlog" / "epoch-000000000001" / "begin", (hour_ago, hour_ago))
    # invoices: a run began a moment ago; it is still within its prepared timeout.
    store.pipeline("invoices").begin("scheduled__fresh")

    recovery = load_recovery_dag(storage_url, monkeypatch)
    run = run_at(recovery, logical_date(1))

    assert run.state == "success"
    assert task_states(run) == {
        "list_pipelines": "success",
        "recover[0]": "success", "recover[1]": "success", "recover[2]": "success",
        "retain[0]": "success", "retain[1]": "success", "retain[2]": "success",
    }
    assert store.pipeline("orders").state(1) is EpochState.COMMITTED
    assert published_rows(target) == rows_for(crashed.run_id, "ingest", 3)
    assert store.pipeline("payments").state(1) is EpochState.ABORTED
    assert store.pipeline("invoices").state(1) is EpochState.OPEN
    actions = sorted(c[3]["action"] + "@" + c[3]["pipeline"]
                     for c in stats.of(metrics.RECOVERY_ACTIONS))
    assert actions == ["abort-timeout@payments", "finish-commit@orders"]

    # Running it again (or clearing it) finds nothing more to do and changes nothing.
    again = run_at(recovery, logical_date(2))
    assert again.state == "success"
    assert published_rows(target) == rows_for(crashed.run_id, "ingest", 3)


def test_recovery_dag_with_an_empty_store_warns_and_fails_naming_the_store(
        run_at: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capfd: pytest.CaptureFixture[str]) -> None:
    # The pipelines write elsewhere (or nothing has run yet): a green run would hide it.
    recovery = load_recovery_dag(f"file://{tmp_path}/empty", monkeypatch)
    run = run_at(recovery, logical_date(0))

    assert run.state == "failed"
    assert task_states(run)["list_pipelines"] == "failed"
    out, err = capfd.readouterr()
    warnings = [line for line in (out + err).splitlines() if "warning" in line.lower()
                and "holds no pipeline" in line]
    assert any(f"{tmp_path}/empty" in w for w in warnings), out + err


def test_recovery_uses_the_settings_the_pipeline_dag_recorded(
        run_at: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    storage_url, target = f"file://{tmp_path}/store", tmp_path / "table"
    # Only the pipeline's DAG knows its settings; the recovery DAG is configured with none.
    dag = build_epoch_dag("own_settings", storage_url, f"file://{target}",
                          store_config={"prepared_timeout_s": 30, "lease_timeout_s": 30, "lease_renew_s": 10,
                                        "max_retain": 1})
    first, second = run_at(dag, logical_date(0)), run_at(dag, logical_date(1))
    assert first.state == second.state == "success"
    pipeline = CheckpointStore.from_url(storage_url).pipeline("orders")
    # A run that began a minute ago (by the store's clock) and died before taking a lease:
    # past its DAG's lease timeout of 30 s, well within the default 180 s.
    pipeline.txlog.begin("scheduled__died", now=time.time() - 60)
    minute_ago = time.time() - 60
    os.utime(tmp_path / "store" / "orders" / "_txlog" / "epoch-000000000003" / "begin", (minute_ago, minute_ago))

    run = run_at(load_recovery_dag(storage_url, monkeypatch), logical_date(2))

    assert run.state == "success"
    assert pipeline.state(3) is EpochState.ABORTED
    # max_retain=1: only the newest committed checkpoint is left.
    assert pipeline.checkpoints.epochs() == [2]
    assert published_rows(target) == rows_for(first.run_id, "ingest", 3) + rows_for(second.run_id, "ingest", 3)


def _stale_epoch(root: Path, pipeline: str) -> None:
    """Epoch 1 of ``pipeline`` in the store at ``root`` began an hour ago and never prepared."""
    store = CheckpointStore.from_url(f"file://{root}")
    store.pipeline(pipeline).txlog.begin("scheduled__stale", now=time.time() - 3600)
    hour_ago = time.time() - 3600
    os.utime(root / pipeline / "_txlog" / "epoch-000000000001" / "begin", (hour_ago, hour_ago))


def test_recovery_dag_watches_every_store_the_page_lists_and_the_page_names_the_one_it_cannot(
        run_at: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, airflow_home: Path) -> None:
    import json

    from airflow.models.connection import Connection
    from airflow.utils.session import create_session

    from airflow_seatunnel_ckpt.hooks.stores import configured_stores

    # The default store, a connection in an environment variable, a database connection that
    # [seatunnel_ckpt] stores names, and one it does not name (a task cannot list it).
    for name, pipeline in (("default", "orders"), ("by-env", "payments"), ("by-db", "invoices"),
                           ("hidden", "refunds")):
        _stale_epoch(tmp_path / name, pipeline)
    monkeypatch.setenv("AIRFLOW_CONN_RECOVERY_ENV", json.dumps(
        {"conn_type": "seatunnel_ckpt", "host": f"file://{tmp_path}/by-env"}))
    monkeypatch.setenv("AIRFLOW__SEATUNNEL_CKPT__STORES", "recovery_db")
    named = Connection(conn_id="recovery_db", conn_type="seatunnel_ckpt", host=f"file://{tmp_path}/by-db")
    hidden = Connection(conn_id="recovery_hidden", conn_type="seatunnel_ckpt", host=f"file://{tmp_path}/hidden")
    with create_session() as session:
        session.add_all([named, hidden])
    try:
        run = run_at(load_recovery_dag(f"file://{tmp_path}/default", monkeypatch), logical_date(0))
        page = {s.key: s for s in configured_stores()}
    finally:
        with create_session() as session:
            session.query(Connection).filter(
                Connection.conn_id.in_(["recovery_db", "recovery_hidden"])).delete()

    assert run.state == "success", task_states(run)
    assert sorted(k for k in task_states(run) if k.startswith("recover[")) == \
        ["recover[0]", "recover[1]", "recover[2]"]
    for name, pipeline in (("default", "orders"), ("by-env", "payments"), ("by-db", "invoices")):
        assert CheckpointStore.from_url(f"file://{tmp_path}/{name}").pipeline(pipeline).state(1) \
            is EpochState.ABORTED, name
    # Not visible to a task: left alone, and the page says so and how to add it.
    assert CheckpointStore.from_url(f"file://{tmp_path}/hidden").pipeline("refunds").state(1) is EpochState.OPEN
    assert {k: s.watched_by_recovery for k, s in page.items() if k.startswith(("recovery_", "default"))} == \
        {"recovery_db": True, "recovery_env": True, "recovery_hidden": False, "default": True}
    assert "AIRFLOW__SEATUNNEL_CKPT__STORES=recovery_hidden" in page["recovery_hidden"].recovery_note
