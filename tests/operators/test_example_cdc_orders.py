"""The CDC example DAG end to end: a PostgreSQL ``orders`` table's inserts, updates and deletes between
hourly runs, applied by real Airflow (``dag.test()`` on SQLite) and real local Spark into Iceberg (SCD1)
and Delta (SCD2), each table read back by its own library.
"""

from __future__ import annotations

import importlib.util
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from airflow_seatunnel_ckpt.core import CheckpointStore, EpochState
from tests.epoch_test_dags import REPO, task_states

pytestmark = [pytest.mark.airflow, pytest.mark.spark, pytest.mark.slow]

START = datetime(2026, 1, 1, tzinfo=UTC)


def load_dag(root: Path, conninfo: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The example DAG parsed for a private data directory and database (as the DAG processor parses it)."""
    monkeypatch.setenv("SEATUNNEL_CKPT_EXAMPLE_DIR", str(root))
    monkeypatch.setenv("SEATUNNEL_CKPT_STORE", f"file://{root}/checkpoints")
    monkeypatch.setenv("SEATUNNEL_CKPT_CDC_CONNINFO", conninfo)
    spec = importlib.util.spec_from_file_location(f"example_cdc_orders_{root.name}",
                                                  REPO / "dags" / "example_cdc_orders.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    dag = module.dag
    dag.get_task("cdc_orders.ingest").retry_delay = timedelta(seconds=0)
    dag.get_task("cdc_orders.prepared").poke_interval = 0.2
    dag.get_task("cdc_orders.commit").retry_delay = timedelta(seconds=0.1)
    return dag


def flushed(db: psycopg.Connection) -> None:
    """Wait until the WAL holding the changes made so far is flushed (the next plan pins the flushed position)."""
    written = db.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]  # type: ignore[index]
    while not db.execute("SELECT pg_current_wal_flush_lsn() >= %s::pg_lsn", (written,)).fetchone()[0]:  # type: ignore[index]
        time.sleep(0.05)


def current(root: Path) -> set[tuple[Any, ...]]:
    """The Iceberg SCD1 table's ``(id, customer, amount)`` rows, read by pyiceberg."""
    from pyiceberg.catalog import load_catalog

    catalog = load_catalog("default", type="sql", uri=f"sqlite:///{root}/warehouse/catalog.db",
                           warehouse=f"file://{root}/warehouse")
    rows = catalog.load_table("shop.orders").scan().to_arrow().to_pylist()
    catalog.engine.dispose()  # type: ignore[attr-defined]
    return {(r["id"], r["customer"], r["amount"]) for r in rows}


def history(root: Path) -> dict[int, list[tuple[Any, ...]]]:
    """The Delta SCD2 table's versions per id, ``(customer, amount, current)`` by ``__start_at``, read by deltalake."""
    from deltalake import DeltaTable

    versions: dict[int, list[tuple[Any, ...]]] = {}
    for r in sorted(DeltaTable(f"{root}/delta/orders_history").to_pyarrow_table().to_pylist(),
                    key=lambda r: r["__start_at"]):
        versions.setdefault(r["id"], []).append((r["customer"], r["amount"], r["__end_at"] is None))
    return versions


def test_hourly_runs_apply_the_orders_tables_inserts_updates_and_deletes_once_to_iceberg_and_delta(
        spark: Any, run_at: Any, tmp_path: Path, postgres_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "data"
    dag = load_dag(root, postgres_db, monkeypatch)
    source = "SELECT id, customer, amount FROM orders"
    with psycopg.connect(postgres_db, autocommit=True) as db:
        db.execute("CREATE TABLE orders (id int PRIMARY KEY, customer text, amount float8)")
        db.execute("INSERT INTO orders VALUES (1, 'ann', 10), (2, 'bob', 20), (3, 'cy', 30)")
        between = [
            ["UPDATE orders SET amount = 11 WHERE id = 1", "DELETE FROM orders WHERE id = 2",
             "INSERT INTO orders VALUES (4, 'dee', 40)"],
            ["UPDATE orders SET amount = 12 WHERE id = 1", "UPDATE orders SET amount = 13 WHERE id = 1",
             "INSERT INTO orders VALUES (2, 'bob', 21)", "DELETE FROM orders WHERE id = 3"],
        ]
        for hour in range(3):
            run = run_at(dag, START + timedelta(hours=hour))
            assert run.state == "success", task_states(run)
            assert current(root) == set(db.execute(source).fetchall()), f"hour {hour}"
            if hour < len(between):
                for statement in between[hour]:
                    db.execute(statement)
                flushed(db)

    pipeline = CheckpointStore.from_url(f"file://{root}/checkpoints").pipeline("cdc_orders")
    assert [s.state for s in pipeline.list_epochs()] == [EpochState.COMMITTED] * 3
    # Every committed version of each order; an epoch's two updates of order 1 are one version (its last).
    assert history(root) == {
        1: [("ann", 10.0, False), ("ann", 11.0, False), ("ann", 13.0, True)],
        2: [("bob", 20.0, False), ("bob", 21.0, True)],
        3: [("cy", 30.0, False)],
        4: [("dee", 40.0, True)],
    }
