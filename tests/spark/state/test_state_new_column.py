"""A stored key -> value state whose stage changes its columns, on local Spark (issue 21).

The stage gains ``max_amount`` next to the stored ``total``. The next normal epoch runs:
stored keys the epoch does not change hold NULL in the new column (it starts empty), the
keys it changes aggregate this epoch's rows; a replay from epoch 1 (a full refresh) then
fills it for every stored key, so the state and the tables equal a fresh run's. A value
column widened (``int`` -> ``bigint``) reads the stored values as the wider type; a
narrowed one stays refused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from airflow_seatunnel_ckpt.spark import StageContext, run_stage
from airflow_seatunnel_ckpt.spark.state import StateError
from tests.spark.conftest import OrdersPipeline, order_row
from tests.spark.test_replay import Lake, order_ids, state_rows

pytestmark = pytest.mark.spark


def _new_rows(epoch: int) -> list[dict[str, Any]]:
    """Epoch ``epoch``'s rows that dedup lets through (its first two repeat the epoch before)."""
    ids = order_ids(epoch)
    return [order_row(i) for i in (ids if epoch == 1 else ids[2:])]


def test_a_new_aggregate_column_in_a_snapshot_state_starts_empty_then_a_full_refresh_fills_it(
        spark: Any, tmp_path: Path) -> None:
    lake = Lake(tmp_path / "lake", "iceberg")
    lake.run(spark, range(1, 3), "fixed")  # keys stored without max_amount
    # customer c0's orders of epoch 3 are held back: it is a stored key the epoch leaves alone
    lake.orders.add_file("f03", [i for i in order_ids(3)[2:] if i % 3])
    lake.orders.commit(run_stage(
        lake.spec("run-3", "with_max"), spark))

    epoch_3 = [r for r in _new_rows(3) if r["order_id"] % 3]
    changed = {c: max(r["amount"] for r in epoch_3 if r["customer"] == c) for c in ("c1", "c2")}
    totals = {c: sum(r["amount"] for e in range(1, 3) for r in _new_rows(e) if r["customer"] == c)
              for c in ("c0", "c1", "c2")}
    totals = {c: t + sum(r["amount"] for r in epoch_3 if r["customer"] == c) for c, t in totals.items()}
    assert lake.totals("customer, total, max_amount") == [
        ("c0", totals["c0"], None), ("c1", totals["c1"], changed["c1"]), ("c2", totals["c2"], changed["c2"])]

    result = lake.replay(spark, 1, stage="with_max")  # full refresh

    fresh = Lake(tmp_path / "fresh", "iceberg")
    fresh.run(spark, range(1, 3), "with_max")
    fresh.orders.add_file("f03", [i for i in order_ids(3)[2:] if i % 3])
    fresh.orders.commit(run_stage(
        fresh.spec("run-3", "with_max"), spark))
    assert result.replayed == [1, 2, 3]
    want = fresh.totals("customer, total, max_amount")
    assert all(m is not None for _, _, m in want)
    assert lake.totals("customer, total, max_amount") == want
    assert lake.orders_summary() == fresh.orders_summary()
    assert state_rows(lake.pipeline) == state_rows(fresh.pipeline)
    lake.run(spark, range(4, 5), "with_max")  # the next epoch continues from the refreshed state
    fresh.run(spark, range(4, 5), "with_max")
    assert lake.totals("customer, total, max_amount") == fresh.totals("customer, total, max_amount")
    assert state_rows(lake.pipeline) == state_rows(fresh.pipeline)


def _top_and_count(ctx: StageContext, amount_type: str) -> None:
    from pyspark.sql import functions as F

    new = ctx.source("orders").read().withColumn("amount", F.col("amount").cast(amount_type))
    totals = ctx.key_value("customer_totals").aggregate(
        new, key="customer", aggregates={"top": ("max", "amount"), "orders": ("count", "*")}, mode="snapshot")
    ctx.sink("customer_totals").write(totals)


def top_of_int_amounts(ctx: StageContext, spark: Any) -> None:
    """Per customer: the largest amount as an ``int``, and the count of orders (the whole state)."""
    _top_and_count(ctx, "int")


def top_of_bigint_amounts(ctx: StageContext, spark: Any) -> None:
    """The same with the amount as a ``bigint``: the stored ``top`` column widened."""
    _top_and_count(ctx, "bigint")


def _last_totals(orders: OrdersPipeline, epoch: int) -> list[tuple[Any, ...]]:
    rows = [r for f in sorted((orders.root / "out" / "totals").glob(f"epoch={epoch}/*.parquet"))
            for r in pq.read_table(f).to_pylist()]
    return sorted((r["customer"], r["top"], r["orders"]) for r in rows)


def test_a_widened_value_column_reads_stored_values_as_the_wider_type_and_a_narrowed_one_is_refused(
        spark: Any, orders: OrdersPipeline) -> None:
    here = "tests.spark.state.test_state_new_column"
    orders.add_file("a", range(1, 7))
    orders.commit(run_stage(orders.spec("run-1", stage=f"{here}:top_of_int_amounts"), spark))
    orders.add_file("b", [10, 11])  # customers c1 and c2 change; c0 is a stored key left alone

    orders.commit(run_stage(orders.spec("run-2", stage=f"{here}:top_of_bigint_amounts"), spark))

    assert _last_totals(orders, 2) == [("c0", 6, 2), ("c1", 10, 3), ("c2", 11, 3)]
    schema = pq.read_schema(next((orders.root / "out" / "totals").glob("epoch=2/*.parquet")))
    assert str(schema.field("top").type) == "int64"
    orders.add_file("c", [12])
    with pytest.raises(StateError, match=r"column 'top' type bigint -> int"):
        run_stage(orders.spec("run-3", stage=f"{here}:top_of_int_amounts"), spark)
