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
from tests.airflow.epoch_test_dags import (
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
