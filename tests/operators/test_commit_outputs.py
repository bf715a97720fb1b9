"""The commit task and readers downstream: no asset event for an epoch that published nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from airflow_seatunnel_ckpt.core import CheckpointStore, EpochState
from tests.epoch_test_dags import PIPELINE, build_epoch_dag, logical_date

pytestmark = pytest.mark.airflow


def _events_of(uri: str) -> list[tuple[Any, Any]]:
    """Every asset event of ``uri``: (extra, partition key), oldest first."""
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        return [(row.extra, row.partition_key) for row in session.scalars(
            select(AssetEvent).join(AssetEvent.asset).where(AssetModel.uri == uri).order_by(AssetEvent.id))]


def _dag_with_asset(dag_id: str, tmp_path: Path, **kwargs: Any) -> tuple[Any, str]:
    """An epoch DAG whose commit has the sink's asset; the DAG and the asset's URI."""
    from airflow_seatunnel_ckpt.operators.commit import sink_asset

    uri = f"file://{tmp_path / 'table'}"
    dag = build_epoch_dag(dag_id, f"file://{tmp_path / 'store'}", uri,
                          commit={"sink_assets": {"orders_table": sink_asset(PIPELINE, "orders_table", uri)}},
                          **kwargs)
    return dag, uri


def test_epoch_without_rows_emits_no_asset_event_and_publishes_no_directory(
        run_at: Any, tmp_path: Path) -> None:
    quiet, uri = _dag_with_asset("quiet", tmp_path, participants={"ingest": {"rows": 0}})
    run = run_at(quiet, logical_date(0))

    assert run.state == "success"
    pipeline = CheckpointStore.from_url(f"file://{tmp_path / 'store'}").pipeline(PIPELINE)
    assert pipeline.state(1) is EpochState.COMMITTED
    assert not list((tmp_path / "table").glob("epoch=*"))
    assert _events_of(uri) == []
    commit_ti = next(ti for ti in run.get_task_instances() if ti.task_id == "orders.commit")
    assert commit_ti.xcom_pull(task_ids="orders.commit")["empty"] == ["orders_table"]

    # The same DAG with rows: one event, as before.
    busy, _ = _dag_with_asset("quiet", tmp_path)
    second = run_at(busy, logical_date(1))
    assert second.state == "success"
    [(extra, _)] = _events_of(uri)
    assert extra["epoch"] == 2 and extra["rows"] == 3


def test_a_cleared_commit_emits_no_second_event_and_the_epoch_is_the_partition_key(
        run_at: Any, clear_and_rerun: Any, tmp_path: Path) -> None:
    dag, uri = _dag_with_asset("replay", tmp_path)
    run = run_at(dag, logical_date(0))
    assert run.state == "success"
    [(extra, partition)] = _events_of(uri)
    assert extra["epoch"] == 1 and extra["replayed"] is False and partition == "epoch=1"

    rerun = clear_and_rerun(dag, run.run_id, ["orders.commit"])

    assert rerun.state == "success"
    assert len(_events_of(uri)) == 1  # downstream DAGs are not woken for nothing


def test_a_retried_commit_whose_earlier_try_left_no_event_emits_it(
        run_at: Any, clear_and_rerun: Any, tmp_path: Path) -> None:
    from airflow.models.asset import AssetEvent
    from airflow.utils.session import create_session
    from sqlalchemy import delete

    dag, uri = _dag_with_asset("lost_event", tmp_path)
    run = run_at(dag, logical_date(0))
    # As if the try that committed died before Airflow recorded its success (and event).
    with create_session() as session:
        session.execute(delete(AssetEvent))

    rerun = clear_and_rerun(dag, run.run_id, ["orders.commit"])

    assert rerun.state == "success"
    [(extra, partition)] = _events_of(uri)
    assert extra["epoch"] == 1 and extra["replayed"] is True and partition == "epoch=1"
