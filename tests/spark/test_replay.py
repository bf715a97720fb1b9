"""Replay on local Spark: the newest epochs run again with a fixed stage, swapped into the tables in one commit.

Epochs of an orders pipeline (dedup by a key set, per-customer totals in a key-value
state) write an Iceberg or Delta table of orders and a snapshot table of totals with a
bug (amounts x10 from epoch 1). The stage is fixed and the last two epochs are replayed
(3 epochs replayed from 2; with ``RELIABILITY_FULL=1`` also 7 Iceberg epochs replayed from
6): the result must equal a fresh pipeline that ran the buggy stage for the earlier epochs
and the fixed one for the replayed ones -- the same rows (DuckDB count and checksum), the
same keyed state -- while the earlier epochs keep their very data files and a reader only
ever sees the old or the new total.
"""

from __future__ import annotations

import re
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa
import pytest

from airflow_seatunnel_ckpt.core import Pipeline
from airflow_seatunnel_ckpt.core.models import EpochState
from airflow_seatunnel_ckpt.core.ops.replay import ReplayError
from airflow_seatunnel_ckpt.core.protocol.recovery import recover
from airflow_seatunnel_ckpt.core.state.checkpoint import read_chain
from airflow_seatunnel_ckpt.spark import StageContext, run_stage
from airflow_seatunnel_ckpt.spark.replay import replay_stage
from tests.conftest import FULL_CAMPAIGNS
from tests.core import faults
from tests.spark.conftest import OrdersPipeline
from tests.tables import duckdb_connection

T = TypeVar("T")

pytestmark = pytest.mark.spark


def _orders(ctx: StageContext, factor: float, with_max: bool = False) -> None:
    from pyspark.sql import functions as F

    fresh = ctx.key_set("seen_orders").dedup(ctx.source("orders").read(), key="order_id")
    fresh = fresh.withColumn("amount", F.col("amount") * F.lit(factor)).cache()
    ctx.sink("orders_table").write(fresh)
    aggregates = {"total": ("sum", "amount")}
    if with_max:
        aggregates["max_amount"] = ("max", "amount")
    totals = ctx.key_value("customer_totals").aggregate(fresh, key="customer", aggregates=aggregates,
                                                        mode="snapshot")
    ctx.sink("customer_totals").write(totals)
    fresh.unpersist()


def buggy(ctx: StageContext, spark: Any) -> None:
    """The stage with the bug: every amount x10."""
    _orders(ctx, 10.0)


def fixed(ctx: StageContext, spark: Any) -> None:
    """The fixed stage."""
    _orders(ctx, 1.0)


def with_max(ctx: StageContext, spark: Any) -> None:
    """The fixed stage with a new aggregate column, ``max_amount``."""
    _orders(ctx, 1.0, with_max=True)


def order_ids(epoch: int) -> list[int]:
    """Epoch ``epoch``'s input: 12 orders, 2 of them repeats of the epoch before (dropped by dedup)."""
    return list(range(epoch * 10 - 2, epoch * 10 + 10))


class Lake:
    """One orders pipeline writing table sinks of one format, with readers of them; its stage
    runs on the session given, or through the Spark Connect server ``remote`` names."""

    def __init__(self, root: Path, fmt: str, remote: str | None = None) -> None:
        self.orders = OrdersPipeline(root)
        self.fmt = fmt
        self.remote = remote
        self.catalog = {"type": "sql", "uri": f"sqlite:///{root}/catalog.db", "warehouse": f"file://{root}/wh"}

    @property
    def pipeline(self) -> Pipeline:
        return self.orders.pipeline

    def sinks(self) -> dict[str, dict[str, Any]]:
        root = self.orders.root
        if self.fmt == "iceberg":
            common = {"type": "iceberg", "catalog": self.catalog, "catalog_name": "lake"}
            return {"orders_table": {**common, "table": "lake.orders", "partition_by": ["customer"]},
                    "customer_totals": {**common, "table": "lake.totals", "mode": "snapshot"}}
        return {"orders_table": {"type": "delta", "path": str(root / "delta" / "orders"), "partition_by": ["customer"]},
                "customer_totals": {"type": "delta", "path": str(root / "delta" / "totals"), "mode": "snapshot"}}

    def spec(self, run_id: str, stage: str) -> Any:
        return self.orders.spec(run_id, stage=f"tests.spark.test_replay:{stage}", sinks=self.sinks(),
                                remote=self.remote)

    def run(self, spark: Any, epochs: range, stage: str) -> None:
        for epoch in epochs:
            self.orders.add_file(f"f{epoch:02d}", order_ids(epoch))
            self.orders.commit(run_stage(self.spec(f"run-{epoch}", stage), None if self.remote else spark))

    def replay(self, spark: Any, from_epoch: int, stage: str = "fixed", **kwargs: Any) -> Any:
        return replay_stage(self.spec("replay", stage), from_epoch, reason="amounts were x10", by="test",
                            spark=None if self.remote else spark, **kwargs)

    def scan(self, table: str, query: str) -> list[tuple[Any, ...]]:
        con = duckdb_connection("avro", "iceberg", "delta")
        if self.fmt == "iceberg":
            from pyiceberg.catalog import load_catalog

            location = load_catalog("lake", **self.catalog).load_table(f"lake.{table}").metadata_location
            con.execute(f"CREATE TEMP VIEW t AS SELECT * FROM iceberg_scan('{location.removeprefix('file://')}')")
        else:
            con.execute(f"CREATE TEMP VIEW t AS SELECT * FROM delta_scan('{self.orders.root / 'delta' / table}')")
        return con.execute(query).fetchall()

    def orders_summary(self) -> tuple[Any, ...]:
        """Count, distinct ids and a checksum of every row of the orders table."""
        return self.scan("orders", "SELECT count(*), count(DISTINCT order_id), sum(amount), "
                                   "sum(hash(order_id, customer, amount)) FROM t")[0]

    def totals(self, columns: str = "customer, total") -> list[tuple[Any, ...]]:
        return sorted(self.scan("totals", f"SELECT {columns} FROM t"))

    def data_files(self) -> dict[str, int]:
        """The orders table's current data files -> the epoch whose placement they carry."""
        if self.fmt == "iceberg":
            from pyiceberg.catalog import load_catalog

            table = load_catalog("lake", **self.catalog).load_table("lake.orders")
            paths = [f["file_path"] for f in table.inspect.files().to_pylist()]
        else:
            from deltalake import DeltaTable

            paths = list(DeltaTable(str(self.orders.root / "delta" / "orders")).file_uris())
        return {p: int(m.group(1)) for p in paths if (m := re.search(r"-e(\d+)[/-]", p))}

    def total_amount(self) -> float:
        """What a reader polling the table sees: the sum of every amount (pyarrow, another reader)."""
        if self.fmt == "iceberg":
            from pyiceberg.catalog import load_catalog

            rows = load_catalog("lake", **self.catalog).load_table("lake.orders").scan().to_arrow()
        else:
            from deltalake import DeltaTable

            rows = DeltaTable(str(self.orders.root / "delta" / "orders")).to_pyarrow_table()
        return float(pa.compute.sum(rows.column("amount")).as_py() or 0.0)


def state_rows(pipeline: Pipeline) -> dict[str, list[tuple[Any, ...]]]:
    """Every keyed state's rows (user columns only), sorted: what a restore reads."""
    point = pipeline.restore_point()
    out = {}
    for name, op in point.operators.items():
        tables = [read_chain(pipeline.storage, chain, list(op.key_columns)) for chain in op.chains.values() if chain]
        rows = pa.concat_tables(tables, promote_options="default") if tables else pa.table({})
        rows = rows.select([c for c in rows.column_names if not c.startswith("__")])
        out[name] = sorted(tuple(r.values()) for r in rows.to_pylist())
    return out


#: Seconds a polling reader waits between two reads of a replayed table (:func:`replay_while_polling`).
POLL_PAUSE_S = 0.05


def replay_while_polling(spark: Any, lake: Any, start: int) -> tuple[Any, set[float]]:
    """Replay ``lake`` from ``start`` while a thread reads its total again and again; the
    replay's result and every total the reader saw.

    The reader pauses ``POLL_PAUSE_S`` between reads, as a polling reader does. Read back to
    back, its scans (pyiceberg's in this process, delta-rs' threads) took a core from the
    replay they watch on a two-core machine: measured at load 18-31 (2026-11-28), the
    replays of the 3-epochs-from-2 test took 10.5 s (Iceberg) and 14.7 s (Delta) with 243 and
    115 reads, at most 0.27 s and 0.89 s apart; with the pause 5.1 s and 4.8 s, 62 and 41
    reads, at most 0.14 s and 0.23 s apart. On an idle machine (load 2-8) the wall time of
    both and of the file sink's replay test stays the same (71 s), their CPU time goes from
    29.7 s to 23.9 s.
    """
    seen: set[float] = set()
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            seen.add(lake.total_amount())
            stop.wait(POLL_PAUSE_S)

    reader = threading.Thread(target=poll)
    reader.start()
    try:
        result = lake.replay(spark, start)
    finally:
        stop.set()
        reader.join()
    return result, seen


def restored_worlds(root: Path, make: Callable[[Path], T], build: Callable[[T], None]) -> Iterator[T]:
    """Lakes of one world: built once at ``root`` (``make``, then ``build``), then restored there
    from a copy for each next one. A world's tables and checkpoints name their absolute paths,
    so it is restored in place, and a new lake object reads it (nothing of the package caches
    a store's contents)."""
    saved = root.with_name(f"{root.name}-saved")
    lake = make(root)
    build(lake)
    shutil.copytree(root, saved, symlinks=True)
    yield lake
    while True:
        shutil.rmtree(root)
        shutil.copytree(saved, root, symlinks=True)
        yield make(root)


def crash_then_finish_replay(spark: Any, lake: Any, plan: Any, n: int, amounts: tuple[float, float],
                             point: str) -> None:
    """Kill ``lake``'s replay from epoch 1 (into epoch 3) at write ``n`` of ``plan``'s trace, then finish it.

    Readers see the old or the new total of ``amounts``, never a mix. A second replay resumes
    one that was decided (COMMITTING) and runs anew one that began nothing; one left undecided
    is refused until recovery aborts it (once its lease expired: the old total stays), and
    then a replay runs. Every epoch ends final.
    """
    plan.arm(n)
    with pytest.raises(faults.SimulatedCrash):
        lake.replay(spark, 1)
    plan.disarm()
    assert lake.total_amount() in amounts, point  # never a mix
    left = lake.pipeline.state(3) if 3 in lake.pipeline.epochs() else None
    try:
        second = lake.replay(spark, 1)
        assert second.resumed == (left is EpochState.COMMITTING), point
        assert left in (None, EpochState.COMMITTING), point
    except ReplayError as exc:
        assert "recover" in str(exc) and "replay of epochs 1..2" in str(exc), point
        recover(lake.pipeline, dry_run=False, now=time.time() + 3600)
        assert lake.pipeline.state(3) is EpochState.ABORTED, point
        assert lake.total_amount() == amounts[0], point  # an aborted replay published nothing
        lake.replay(spark, 1)
    assert all(lake.pipeline.state(e).final for e in lake.pipeline.epochs()), point


# Both formats: 3 epochs replayed from 2 (epoch 1 keeps its files, 2..3 are replaced: each
# assertion needs one earlier epoch and two replayed ones). RELIABILITY_FULL=1 adds 7 Iceberg epochs
# replayed from 6: longer state chains (full_checkpoint_interval 3) before the replay, as a long-running
# pipeline has, in 18 stage runs instead of 27.
@pytest.mark.parametrize(("fmt", "epochs", "start"),
                         [("iceberg", 3, 2), ("delta", 3, 2), *([("iceberg", 7, 6)] if FULL_CAMPAIGNS else [])])
def test_replay_of_the_newest_epochs_equals_a_fresh_run_keeps_the_earlier_epochs_files_and_readers_see_old_or_new(
        spark: Any, tmp_path: Path, fmt: str, epochs: int, start: int) -> None:
    lake = Lake(tmp_path / "lake", fmt)
    lake.run(spark, range(1, epochs + 1), "buggy")
    fresh = Lake(tmp_path / "fresh", fmt)
    fresh.run(spark, range(1, start), "buggy")
    fresh.run(spark, range(start, epochs + 1), "fixed")
    files_before = lake.data_files()
    old_total, new_total = lake.total_amount(), fresh.total_amount()
    assert old_total != new_total

    result, seen = replay_while_polling(spark, lake, start)

    replayed = list(range(start, epochs + 1))
    assert (result.replayed, result.replaced) == (replayed, replayed)
    assert result.epoch == epochs + 1
    assert seen <= {old_total, new_total}  # never a mix of old and new epochs
    files_after = lake.data_files()
    early = {p for p, e in files_before.items() if e < start}
    assert early and early <= set(files_after)  # the earlier epochs: the very same data files
    assert not {p for p, e in files_before.items() if e >= start} & set(files_after)
    assert lake.orders_summary() == fresh.orders_summary()
    assert lake.totals() == fresh.totals()
    assert state_rows(lake.pipeline) == state_rows(fresh.pipeline)
    status = lake.pipeline.status(result.epoch)
    assert status.state is EpochState.COMMITTED
    assert status.decision is not None and f"replay of epochs {start}..{epochs}" in status.decision.reason
    action = lake.pipeline.txlog.actions(result.epoch)[0]
    assert (action.record.action, action.record.by, action.record.reason) == ("replay", "test", "amounts were x10")
    assert action.record.details["epochs"] == ",".join(map(str, replayed))
    assert action.outcome is not None and action.outcome.outcome.value == "succeeded"

    # the next scheduled epoch runs normally, from the replayed state
    lake.run(spark, range(epochs + 1, epochs + 2), "fixed")  # (its epoch is epochs + 2: the replay took one)
    fresh.run(spark, range(epochs + 1, epochs + 2), "fixed")
    assert lake.pipeline.last_committed_epoch() == epochs + 2
    assert lake.orders_summary() == fresh.orders_summary()
    assert lake.totals() == fresh.totals()
    assert state_rows(lake.pipeline) == state_rows(fresh.pipeline)


# On the classic session the same full refresh is proven by tests/spark/state/test_state_new_column.py.
# Connect only on demand (`-m connect_all`): the replay's code is the same on both runtimes once the
# session is made, and its Connect run is the suite's longest stage test (docs/RELIABILITY.md, "The Connect slice").
@pytest.mark.parametrize("runtime", ["connect"], indirect=True)
def test_full_refresh_fills_a_new_aggregate_column_for_stored_keys(spark: Any, tmp_path: Path, runtime: str,
                                                                   request: pytest.FixtureRequest) -> None:
    """Through Spark Connect: the replayed lake against a fresh one run on the classic session."""
    remote = request.getfixturevalue("connect_server")
    lake = Lake(tmp_path / "lake", "iceberg", remote)
    lake.run(spark, range(1, 3), "fixed")  # keys stored without max_amount
    fresh = Lake(tmp_path / "fresh", "iceberg")
    fresh.run(spark, range(1, 3), "with_max")

    result = lake.replay(spark, 1, stage="with_max")  # full refresh

    assert result.replayed == [1, 2]
    want = fresh.totals("customer, total, max_amount")
    assert all(m is not None for _, _, m in want)
    assert lake.totals("customer, total, max_amount") == want
    assert lake.orders_summary() == fresh.orders_summary()
    assert state_rows(lake.pipeline) == state_rows(fresh.pipeline)
    lake.run(spark, range(3, 4), "with_max")  # the next epoch continues from the refreshed state
    fresh.run(spark, range(3, 4), "with_max")
    assert lake.totals("customer, total, max_amount") == fresh.totals("customer, total, max_amount")


def test_replay_refuses_a_table_another_writer_committed_to_unless_forced(spark: Any, tmp_path: Path) -> None:
    from pyiceberg.catalog import load_catalog

    lake = Lake(tmp_path / "lake", "iceberg")
    lake.run(spark, range(1, 3), "buggy")
    table = load_catalog("lake", **lake.catalog).load_table("lake.orders")
    table.append(pa.Table.from_pylist([{"order_id": 999, "customer": "c0", "amount": 1.0}],
                                      schema=table.schema().as_arrow()))
    foreign = table.refresh().current_snapshot()
    assert foreign is not None

    with pytest.raises(ReplayError, match=rf"snapshot {foreign.snapshot_id} \(append\) was committed to the table "
                                          r"by another writer.*force"):
        lake.replay(spark, 2)
    assert lake.pipeline.state(3) is EpochState.ABORTED  # the refused replay epoch: nothing published
    assert lake.scan("orders", "SELECT count(*) FROM t WHERE order_id = 999") == [(1,)]

    result = lake.replay(spark, 2, force=True)
    assert result.replaced == [2]
    assert lake.scan("orders", "SELECT count(*) FROM t WHERE order_id = 999") == [(1,)]  # its rows stay
    # epoch 2 (orders 20..29) replayed with the fixed stage; epoch 1's keep x10
    assert lake.scan("orders", "SELECT max(amount) FROM t WHERE order_id >= 20 AND order_id < 999") == [(29.0,)]
    assert lake.scan("orders", "SELECT max(amount) FROM t WHERE order_id < 20") == [(190.0,)]


def test_replay_refuses_a_from_epoch_inside_an_earlier_replay(spark: Any, tmp_path: Path) -> None:
    lake = Lake(tmp_path / "lake", "iceberg")
    lake.run(spark, range(1, 3), "buggy")
    lake.replay(spark, 1)
    with pytest.raises(ReplayError, match="epoch 2 was replayed by epoch 3 together with epochs 1..2.*replay from "
                                          "epoch 1"):
        lake.replay(spark, 2)
    assert lake.pipeline.epochs() == [1, 2, 3]  # refused before anything was written


def test_a_full_refresh_of_an_upsert_sink_replaces_the_tables_values_in_one_snapshot(spark: Any,
                                                                                     tmp_path: Path) -> None:
    from pyiceberg.catalog import load_catalog

    upsert = Lake(tmp_path / "upsert", "iceberg")
    sinks = upsert.sinks()
    sinks["customer_totals"] = {**sinks["customer_totals"], "mode": "upsert", "merge_keys": ["customer"]}
    upsert.sinks = lambda: sinks  # type: ignore[method-assign]
    upsert.run(spark, range(1, 3), "buggy")
    buggy_totals = upsert.totals()

    def snapshots() -> int:
        return len(load_catalog("lake", **upsert.catalog).load_table("lake.totals").snapshots())

    before = snapshots()
    upsert.replay(spark, 1)
    # Each replayed epoch wrote every customer's running total: the table holds the last one, fixed.
    assert upsert.totals() == [(c, pytest.approx(t / 10)) for c, t in buggy_totals]
    assert snapshots() == before + 1
