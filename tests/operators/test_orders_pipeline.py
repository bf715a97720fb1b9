"""The example pipeline end to end: real Airflow on SQLite, real (local) Spark.

Every run generates a new hourly order file (which also re-sends some orders of the
previous hour); the table must end up holding every distinct input order exactly once,
whatever failed, retried or was cleared on the way.
"""

from __future__ import annotations

import importlib.util
import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from orders_example import START

from airflow_seatunnel_ckpt.core import CheckpointStore, EpochState, Pipeline
from airflow_seatunnel_ckpt.core.errors import StorageError
from airflow_seatunnel_ckpt.operators import metrics
from tests.epoch_test_dags import REPO, load_recovery_dag, run_note, task_states

pytestmark = [pytest.mark.airflow, pytest.mark.spark, pytest.mark.slow]

STAGE_FAILS = "SEATUNNEL_CKPT_TEST_STAGE_FAILS"
HOLD = "SEATUNNEL_CKPT_TEST_HOLD"


def fail_or_dedup(ctx: Any, spark: Any) -> None:
    """The example's stage, failing while ``$SEATUNNEL_CKPT_TEST_STAGE_FAILS`` is set."""
    import os

    from orders_example import dedup_orders

    new = ctx.source("orders").read()
    if os.environ.get(STAGE_FAILS):
        new.count()  # the input was read: failing now must still lose nothing
        raise RuntimeError("stage failed on purpose")
    dedup_orders(ctx, spark)


class Example:
    """The example DAG parsed for a private data directory, and views of its results."""

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch, stage: str | None = None,
                 commit_retries: int | None = None) -> None:
        self.root = root
        monkeypatch.setenv("SEATUNNEL_CKPT_EXAMPLE_DIR", str(root))
        monkeypatch.setenv("SEATUNNEL_CKPT_STORE", f"file://{root}/checkpoints")
        spec = importlib.util.spec_from_file_location(
            f"orders_pipeline_{root.name}", REPO / "dags" / "orders_pipeline.py")
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        spec.loader.exec_module(module)  # type: ignore[union-attr]
        self.dag = module.dag
        ingest = self.dag.get_task("orders.ingest")
        ingest.spark_conf = {"spark.sql.shuffle.partitions": "2"}
        ingest.retry_delay = timedelta(seconds=0)
        if stage:
            ingest.stage = stage
        self.dag.get_task("orders.prepared").poke_interval = 0.2
        commit = self.dag.get_task("orders.commit")
        commit.retry_delay = timedelta(seconds=0.1)
        if commit_retries is not None:
            commit.retries = commit_retries
        self.pipeline = CheckpointStore.from_url(f"file://{root}/checkpoints").pipeline("orders")

    def table_ids(self) -> list[str]:
        """The order ids in the Iceberg table, read by DuckDB (an independent reader)."""
        from orders_example import TABLE, iceberg_catalog

        from tests.tables import duckdb_iceberg_rows

        return [row["order_id"] for row in duckdb_iceberg_rows(iceberg_catalog(str(self.root)), TABLE)]

    def snapshots(self) -> list[Any]:
        """The Iceberg table's snapshots ([] before the first commit)."""
        from orders_example import TABLE, iceberg_catalog
        from pyiceberg.catalog import load_catalog
        from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

        try:
            return list(load_catalog("default", **iceberg_catalog(str(self.root))).load_table(TABLE).snapshots())
        except (NoSuchTableError, NoSuchNamespaceError):
            return []

    def input_ids(self) -> set[str]:
        ids: set[str] = set()
        for path in (self.root / "input" / "orders").glob("orders-*.json"):
            ids |= {json.loads(line)["order_id"] for line in path.read_text().splitlines()}
        return ids

    def assert_exactly_once_up_to(self, hour: int) -> None:
        published = self.table_ids()
        assert len(published) == len(set(published)), "an order was published twice"
        expected: set[str] = set()
        for h in range(hour + 1):
            path = self.root / "input" / "orders" / f"orders-{at(h):%Y%m%dT%H%M}.json"
            expected |= {json.loads(line)["order_id"] for line in path.read_text().splitlines()}
        assert set(published) == expected

    def assert_exactly_once(self) -> None:
        published = self.table_ids()
        assert len(published) == len(set(published)), "an order was published twice"
        assert set(published) == self.input_ids(), "an input order is missing"


def at(hour: int) -> Any:
    return START.replace(hour=hour)


def test_several_hourly_runs_ingest_every_order_exactly_once(
        spark: Any, run_at: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        stats: Any) -> None:
    from tests.operators.test_commit_outputs import _events_of

    uri = "iceberg://default/shop.orders"
    # The worker's Airflow database is shared: other tests of the example DAG leave events too.
    earlier = len(_events_of(uri))
    example = Example(tmp_path / "data", monkeypatch)
    runs = [run_at(example.dag, at(hour)) for hour in range(3)]

    for run in runs:
        assert run.state == "success", task_states(run)
        assert task_states(run)["orders.abort"] == "skipped"
    statuses = example.pipeline.list_epochs()
    assert [s.state for s in statuses] == [EpochState.COMMITTED] * 3
    assert all(sum(p.rows for p in s.published) > 0 for s in statuses)
    example.assert_exactly_once()
    checkpoint_bytes = [c[2] for c in stats.of(metrics.CHECKPOINT_BYTES)]
    assert len(checkpoint_bytes) == 3 and all(size > 0 for size in checkpoint_bytes)
    assert [c[2] for c in stats.of(metrics.ROWS_PUBLISHED)] == [
        sum(p.rows for p in s.published) for s in statuses]

    # One asset event per committed epoch, on the Iceberg table's asset.
    assert [a.uri for a in example.dag.get_task("orders.commit").outlets] == [uri]
    assert [e["epoch"] for e, _ in _events_of(uri)[earlier:]] == [1, 2, 3]

    # Clearing the whole last run (same run id) changes nothing.
    rows_before = sorted(example.table_ids())
    again = run_at(example.dag, at(2))
    assert again.state == "success" and len(example.pipeline.epochs()) == 3
    assert sorted(example.table_ids()) == rows_before
    assert len(_events_of(uri)) == earlier + 3  # and no second event


def test_a_failing_stage_aborts_and_the_next_run_picks_its_input_up(
        spark: Any, run_at: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    example = Example(tmp_path / "data", monkeypatch, stage=f"{__name__}:fail_or_dedup")
    assert run_at(example.dag, at(0)).state == "success"

    monkeypatch.setenv(STAGE_FAILS, "1")
    failed = run_at(example.dag, at(1))
    monkeypatch.delenv(STAGE_FAILS)

    assert task_states(failed)["orders.ingest"] == "failed"
    assert task_states(failed)["orders.abort"] == "success"
    assert example.pipeline.state(2) is EpochState.ABORTED
    assert [s.summary["seatunnel-ckpt.epoch"] for s in example.snapshots()] == ["1"]  # epoch 2 left no snapshot
    hour1 = {json.loads(line)["order_id"] for line in
             (example.root / "input" / "orders" / "orders-20260101T0100.json").read_text()
             .splitlines()}
    assert not hour1 <= set(example.table_ids())

    # The next hour's run reads both hour 1's and hour 2's files.
    following = run_at(example.dag, at(2))
    assert following.state == "success", task_states(following)
    consumed = example.pipeline.status(3).prepared["ingest"].sources["orders"].offsets
    assert consumed["files"] == ["orders-20260101T0100.json", "orders-20260101T0200.json"]
    example.assert_exactly_once()


def held_while_asked(status: Any) -> str | None:
    """A check of the commit branch that refuses the epoch while ``$SEATUNNEL_CKPT_TEST_HOLD`` is set."""
    import os

    return "the orders of this hour are held for review" if os.environ.get(HOLD) else None


def test_a_refused_epoch_fails_its_run_and_the_next_run_reads_the_held_back_input(
        spark: Any, run_at: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    example = Example(tmp_path / "data", monkeypatch)
    example.dag.get_task("orders.decide").check = held_while_asked
    assert run_at(example.dag, at(0)).state == "success"

    monkeypatch.setenv(HOLD, "1")
    held = run_at(example.dag, at(1))
    monkeypatch.delenv(HOLD)

    assert held.state == "failed"
    states = task_states(held)
    assert (states["orders.commit"], states["orders.abort"], states["quarantine_alert"]) == (
        "skipped", "failed", "success")
    assert run_note(held) == ("Input held back: pipeline 'orders' epoch 2 refused and aborted: check failed: "
                              "held_while_asked: the orders of this hour are held for review")
    assert example.pipeline.state(2) is EpochState.ABORTED
    assert example.pipeline.held_back().since == 2

    # The next hour's run reads hour 1's held-back file too: nothing is lost.
    following = run_at(example.dag, at(2))
    assert following.state == "success", task_states(following)
    consumed = example.pipeline.status(3).prepared["ingest"].sources["orders"].offsets
    assert consumed["files"] == ["orders-20260101T0100.json", "orders-20260101T0200.json"]
    assert example.pipeline.held_back() is None
    example.assert_exactly_once()


def test_a_run_killed_between_decision_and_publish_is_finished_before_the_next_epoch_begins(
        spark: Any, run_at: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    example = Example(tmp_path / "data", monkeypatch, commit_retries=0)
    assert run_at(example.dag, at(0)).state == "success"

    def killed(self: Any, *args: Any, **kwargs: Any) -> str:
        raise StorageError("worker killed before publishing")

    with monkeypatch.context() as crash:
        crash.setattr(Pipeline, "_commit_sink", killed)
        crashed = run_at(example.dag, at(1))
    assert task_states(crashed)["orders.commit"] == "failed"
    assert example.pipeline.state(2) is EpochState.COMMITTING

    # The next hourly run comes before the recovery DAG: it must not begin an epoch that
    # would read epoch 2's input again. Its stage finishes publishing epoch 2 (roll
    # forward, exactly what the recovery DAG would do) and only then begins epoch 3.
    after = run_at(example.dag, at(2))
    assert task_states(after)["orders.ingest"] == "success"
    assert example.pipeline.state(2) is EpochState.COMMITTED
    assert example.pipeline.status(3).run_id == after.run_id
    example.assert_exactly_once()

    # The recovery DAG finds nothing left; clearing the run changes nothing either.
    recovery = load_recovery_dag(f"file://{example.root}/checkpoints", monkeypatch)
    assert run_at(recovery, at(2)).state == "success"
    assert run_at(example.dag, at(2)).state == "success"
    example.assert_exactly_once()
