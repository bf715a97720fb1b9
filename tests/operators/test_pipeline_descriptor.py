"""The pipeline descriptor from the Airflow side: written by the stage, owned by one DAG.

Also: the example DAGs cannot watch different stores, and the store arguments resolve the
same way for every task.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

import pytest

from airflow_seatunnel_ckpt.core import CheckpointStore, EpochState
from airflow_seatunnel_ckpt.core.protocol.descriptor import read_descriptor
from airflow_seatunnel_ckpt.hooks.checkpoint_store import CheckpointStoreHook, StoreSettings
from airflow_seatunnel_ckpt.pipeline_task import BaseStoreOperator
from tests.epoch_test_dags import (
    REPO,
    build_epoch_dag,
    logical_date,
    published_rows,
    rows_for,
    task_states,
)

pytestmark = pytest.mark.airflow


def test_the_stage_records_owner_settings_and_participants(run_at: Any, tmp_path: Path) -> None:
    storage_url = f"file://{tmp_path}/store"
    dag = build_epoch_dag("orders_hourly", storage_url, f"file://{tmp_path}/table",
                          participants={"ingest": {}, "enrich": {"sinks": {"enriched": f"file://{tmp_path}/e"}}},
                          store_config={"prepared_timeout_s": 120})

    assert run_at(dag, logical_date(0)).state == "success"

    pipeline = CheckpointStore.from_url(storage_url).pipeline("orders")
    descriptor = read_descriptor(pipeline.storage)
    assert descriptor is not None
    assert (descriptor.version, descriptor.owner_dag_id) == (1, "orders_hourly")
    assert descriptor.declared_participants == ["enrich", "ingest"]
    assert sorted(descriptor.participants["enrich"].sinks) == ["enriched"]
    assert descriptor.config["prepared_timeout_s"] == 120
    assert pipeline.config.prepared_timeout_s == 120  # opened with the store's defaults
    assert pipeline.status(1).begin.dag_id == "orders_hourly"  # type: ignore[union-attr]
    # The next run declares the same: no new version.
    assert run_at(dag, logical_date(1)).state == "success"
    assert pipeline.storage.list_dir("_descriptor") == ["v000001.json"]


def test_a_second_dag_with_the_same_pipeline_name_is_refused(run_at: Any, tmp_path: Path) -> None:
    storage_url = f"file://{tmp_path}/store"
    first = build_epoch_dag("orders_hourly", storage_url, f"file://{tmp_path}/table")
    second = build_epoch_dag("orders_backfill", storage_url, f"file://{tmp_path}/backfill")
    assert run_at(first, logical_date(0)).state == "success"
    # The same logical date, hence the same run id, in the other DAG.
    run = run_at(second, logical_date(0))

    assert run.state == "failed"
    states = task_states(run)
    assert states["orders.ingest"] == "failed"
    assert states["orders.commit"] in ("skipped", "upstream_failed")
    pipeline = CheckpointStore.from_url(storage_url).pipeline("orders")
    # Nothing of the second DAG reached the pipeline: no epoch, no staging, no output.
    assert pipeline.epochs() == [1] and pipeline.state(1) is EpochState.COMMITTED
    assert pipeline.storage.list_dir("_staging") == []
    assert published_rows(tmp_path / "backfill") == []
    assert published_rows(tmp_path / "table") == rows_for(run.run_id, "ingest", 3)
    descriptor = read_descriptor(pipeline.storage)
    assert descriptor is not None and descriptor.owner_dag_id == "orders_hourly"


def test_the_example_dags_always_watch_the_same_store(airflow_home: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # The example's data lives away from $AIRFLOW_HOME; neither DAG file sets a store.
    monkeypatch.setenv("SEATUNNEL_CKPT_EXAMPLE_DIR", str(tmp_path / "example-data"))
    monkeypatch.delenv("SEATUNNEL_CKPT_STORE", raising=False)
    monkeypatch.delenv("SEATUNNEL_CKPT_STORE_CONN_ID", raising=False)
    dags = [_load("orders_pipeline"), _load("seatunnel_ckpt_recovery")]

    settings = []
    for dag in dags:
        for task in dag.tasks:
            if isinstance(task, BaseStoreOperator):
                settings.append((dag.dag_id, task.task_id, task.store_settings))
            elif hasattr(task, "partial_kwargs"):  # mapped recovery tasks
                settings.append((dag.dag_id, task.task_id, StoreSettings.of(
                    task.partial_kwargs.get("store_conn_id"), task.partial_kwargs.get("storage_url"))))
    # Every store task of both DAGs leaves the store to the provider's one default...
    assert {dag_id for dag_id, _, _ in settings} == {"orders_pipeline", "seatunnel_ckpt_recovery"}
    assert [s for s in settings if s[2] != StoreSettings()] == []
    hook = CheckpointStoreHook.from_settings(StoreSettings())
    assert hook.get_config().storage_url == f"file://{os.environ['AIRFLOW_HOME']}/seatunnel-ckpt"
    # ... so pointing the default elsewhere moves both DAGs together.
    monkeypatch.setenv("SEATUNNEL_CKPT_STORE", f"file://{tmp_path}/shared")
    assert CheckpointStoreHook.from_settings(StoreSettings()).get_config().storage_url == f"file://{tmp_path}/shared"


def _load(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"{name}_under_test", REPO / "dags" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.dag
