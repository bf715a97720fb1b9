"""The PostgreSQL sources through the stage runtime (``run_stage`` on the shared local Spark session)
into a file sink: typed rows, positions from committed epochs, refusals before the prepare."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pyarrow.parquet as pq
import pytest

from airflow_seatunnel_ckpt.core import CheckpointConfig, CheckpointStore, Decision, EpochState
from airflow_seatunnel_ckpt.core.ops.replay import ReplayError
from airflow_seatunnel_ckpt.spark import StageResult, StageSpec, run_stage
from airflow_seatunnel_ckpt.spark.replay import replay_stage
from airflow_seatunnel_ckpt.spark.sources.files import SourceError

pytestmark = pytest.mark.spark


def copy(ctx: Any, spark: Any) -> None:
    """The epoch's rows into ``out``."""
    ctx.sink("out").write(ctx.source("db").read())


class DbPipeline:
    def __init__(self, root: Path, source: dict[str, Any]) -> None:
        self.root, self.source, self.runs = root, source, 0
        self.store = {"storage_url": f"file://{root}/store"}

    def spec(self, run_id: str) -> StageSpec:
        return StageSpec(pipeline="db", participant="ingest", run_id=run_id, attempt=1, stage=f"{__name__}:copy",
                         sources={"db": self.source}, sinks={"out": {"type": "file", "path": f"file://{self.root}/out"}},
                         store=self.store, key_groups=2)

    def epoch(self, spark: Any) -> StageResult:
        self.runs += 1
        result = run_stage(self.spec(f"run-{self.runs}"), spark)
        pipeline = CheckpointStore(CheckpointConfig.from_mapping(self.store)).pipeline("db")
        pipeline.decide(result.epoch, Decision.COMMIT, "test", "test")
        pipeline.commit(result.epoch)
        return result

    def store_pipeline(self) -> Any:
        return CheckpointStore(CheckpointConfig.from_mapping(self.store)).pipeline("db")

    def rows(self, epoch: int) -> list[dict[str, Any]]:
        files = sorted((self.root / "out").glob(f"epoch={epoch}/*.parquet"))
        return [r for f in files for r in pq.read_table(f).to_pylist()]


def wait_flushed(conn: psycopg.Connection) -> None:
    from tests.core.sources.test_postgres_cdc import flushed

    flushed(conn)


def test_query_epochs_read_new_rows_once_with_their_types(spark: Any, tmp_path: Path, postgres_db: str) -> None:
    db = psycopg.connect(postgres_db, autocommit=True)
    db.execute("CREATE TABLE orders (id int PRIMARY KEY, amount numeric(10,2), at timestamptz NOT NULL)")
    db.execute("INSERT INTO orders VALUES (1, 1.50, '2026-01-01 00:00+00'), (2, 2.25, '2026-01-02 00:00+00')")
    lake = DbPipeline(tmp_path, {"type": "postgres_query", "conninfo": postgres_db, "table": "public.orders",
                                 "incremental_column": "at"})
    first = lake.epoch(spark)
    rows = sorted(lake.rows(first.epoch), key=lambda r: r["id"])
    assert [(r["id"], r["amount"]) for r in rows] == [(1, Decimal("1.50")), (2, Decimal("2.25"))]
    assert rows[1]["at"].replace(tzinfo=dt.UTC) == dt.datetime(2026, 1, 2, tzinfo=dt.UTC)
    db.execute("INSERT INTO orders VALUES (3, 3, '2026-01-02 00:00+00'), (4, 4, '2026-01-03 00:00+00')")
    second = lake.epoch(spark)
    assert sorted(r["id"] for r in lake.rows(second.epoch)) == [3, 4]  # 3 shares the first epoch's last value


def test_a_dropped_slot_fails_the_epoch_before_its_prepare_and_a_snapshot_epoch_is_not_replayed(
        spark: Any, tmp_path: Path, postgres_db: str) -> None:
    db = psycopg.connect(postgres_db, autocommit=True)
    db.execute("CREATE TABLE orders (id int PRIMARY KEY, amount numeric(10,2))")
    db.execute("INSERT INTO orders VALUES (1, 1.50)")
    lake = DbPipeline(tmp_path, {"type": "postgres_cdc", "conninfo": postgres_db, "slot": "orders_slot",
                                 "publication": "orders_pub", "tables": ["public.orders"]})
    first = lake.epoch(spark)
    assert [(r["_op"], r["id"], r["amount"]) for r in lake.rows(first.epoch)] == [("insert", 1, Decimal("1.50"))]
    db.execute("UPDATE orders SET amount = 2 WHERE id = 1")
    wait_flushed(db)
    second = lake.epoch(spark)
    ((row,),) = [lake.rows(second.epoch)]
    assert (row["_op"], row["id"], row["amount"], row["_table"]) == ("update", 1, Decimal("2.00"), "public.orders")
    assert row["_lsn"] >= first.sources["db"]["end"] and row["_xid"] > 0 and row["_commit_ts"] is not None
    with pytest.raises(ReplayError, match="snapshot exported when its slot was created"):
        replay_stage(lake.spec("replay"), first.epoch, reason="test", by="test", spark=spark)
    db.execute("SELECT pg_drop_replication_slot('orders_slot')")
    db.execute("UPDATE orders SET amount = 3 WHERE id = 1")
    with pytest.raises(SourceError, match=r"the replication slot 'orders_slot' is gone .*a new snapshot"):
        lake.epoch(spark)
    pipeline = CheckpointStore(CheckpointConfig.from_mapping(lake.store)).pipeline("db")
    assert all(pipeline.state(e) is not EpochState.PREPARED for e in pipeline.txlog.epochs())


#: Attempt 1 of run-1 in a process of its own: it begins the epoch, pins its plan (creating the slot and
#: exporting the snapshot) and exits before it reads, taking the exported snapshot with it.
PLAN_AND_DIE = """
import json, sys
from airflow_seatunnel_ckpt.core import CheckpointConfig, CheckpointStore
from airflow_seatunnel_ckpt.spark.sources.postgres import PostgresCdcSource
store, options = json.loads(sys.argv[1]), json.loads(sys.argv[2])
pipeline = CheckpointStore(CheckpointConfig.from_mapping(store)).pipeline("db")
epoch = pipeline.begin("run-1").epoch
source = PostgresCdcSource("db", **{k: v for k, v in options.items() if k != "type"})
base = pipeline.restore_point()
print(json.dumps(pipeline.pin_inputs(epoch, "ingest", 1, lambda: {"db": source.plan_from(base, epoch)})["db"]))
"""


def test_a_first_epoch_planned_in_another_process_is_retried_here_with_a_new_snapshot_every_row_once(
        spark: Any, tmp_path: Path, postgres_db: str) -> None:
    import json
    import os
    import subprocess
    import sys

    db = psycopg.connect(postgres_db, autocommit=True)
    db.execute("CREATE TABLE orders (id int PRIMARY KEY, amount numeric(10,2))")
    db.execute("INSERT INTO orders VALUES (1, 1), (2, 2)")
    lake = DbPipeline(tmp_path, {"type": "postgres_cdc", "conninfo": postgres_db, "slot": "orders_slot",
                                 "publication": "orders_pub", "tables": ["public.orders"]})
    planned = subprocess.run([sys.executable, "-c", PLAN_AND_DIE, json.dumps(lake.store), json.dumps(lake.source)],
                             env={**os.environ, "PYTHONPATH": os.getcwd()}, capture_output=True, text=True,
                             timeout=120, check=True)
    pinned = json.loads(planned.stdout.splitlines()[-1])
    assert pinned["snapshot"]
    # Changes after the first plan, before its retry: the retry's new snapshot holds them, the stream after it not.
    db.execute("INSERT INTO orders VALUES (3, 3)")
    db.execute("UPDATE orders SET amount = 10 WHERE id = 1")
    db.execute("DELETE FROM orders WHERE id = 2")
    wait_flushed(db)

    retried = run_stage(lake.spec("run-1").replace(attempt=2), spark)
    pipeline = lake.store_pipeline()
    assert retried.epoch == 1 and pipeline.decide(1, Decision.COMMIT, "test", "test").decision is Decision.COMMIT
    pipeline.commit(1)
    consumed = pipeline.txlog.read_prepared(1, "ingest").sources["db"].offsets
    assert consumed["start"] >= pinned["end"] and consumed["snapshot"] != pinned["snapshot"]
    assert sorted((r["_op"], r["id"], r["amount"]) for r in lake.rows(1)) == [
        ("insert", 1, Decimal("10.00")), ("insert", 3, Decimal("3.00"))]
    db.execute("INSERT INTO orders VALUES (4, 4)")
    wait_flushed(db)
    lake.runs = 1
    second = lake.epoch(spark)
    assert [(r["_op"], r["id"]) for r in lake.rows(second.epoch)] == [("insert", 4)]  # nothing of epoch 1 again


def cdc_epochs(spark: Any, root: Path, postgres_db: str) -> DbPipeline:
    """Pipeline ``db``: epoch 1 reads the snapshot of ``orders`` (2 rows), epoch 2 its changes (2 inserts,
    1 update, 1 delete), both committed through a real stage into a file sink."""
    db = psycopg.connect(postgres_db, autocommit=True)
    db.execute("CREATE TABLE orders (id int PRIMARY KEY, amount numeric(10,2))")
    db.execute("INSERT INTO orders VALUES (1, 1.50), (2, 2.50)")
    lake = DbPipeline(root, {"type": "postgres_cdc", "conninfo": postgres_db, "slot": "orders_slot",
                             "publication": "orders_pub", "tables": ["public.orders"]})
    lake.epoch(spark)
    db.execute("INSERT INTO orders VALUES (3, 3), (4, 4)")
    db.execute("UPDATE orders SET amount = 5 WHERE id = 1")
    db.execute("DELETE FROM orders WHERE id = 2")
    wait_flushed(db)
    lake.epoch(spark)
    return lake
