"""What readers of a sink's target see: changes vs snapshot sinks, empty and unwritten sinks.

The published targets are read with pyarrow and pandas, independent readers that know
nothing of this project: a naive ``sum`` over a snapshot sink's directory must be the true
total, an epoch without rows must leave no directory behind.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from airflow_seatunnel_ckpt.core import EpochState
from airflow_seatunnel_ckpt.core.sinks.files import LATEST
from airflow_seatunnel_ckpt.spark import StageSpec, run_stage
from tests.spark.conftest import OrdersPipeline, order_row

pytestmark = [pytest.mark.spark]


def snapshot_spec(orders: OrdersPipeline, run_id: str, stage: str) -> StageSpec:
    """The orders spec with ``customer_totals`` as a snapshot sink."""
    spec = orders.spec(run_id, stage=stage)
    sinks = dict(spec.sinks)
    sinks["customer_totals"] = {**sinks["customer_totals"], "mode": "snapshot"}
    return orders.spec(run_id, stage=stage, sinks=sinks)


def true_totals(order_ids: set[int]) -> dict[str, float]:
    """Each customer's total over the distinct orders."""
    totals: dict[str, float] = {}
    for i in order_ids:
        row = order_row(i)
        totals[row["customer"]] = totals.get(row["customer"], 0.0) + row["amount"]
    return totals


def read_target(target: Path) -> Any:
    """The target directory as pandas reads it (pyarrow engine: hive directories, ``_`` files skipped)."""
    import pandas as pd

    return pd.read_parquet(target)


@pytest.mark.parametrize("stage", ["tests.spark.stages:totals_snapshot",
                                   "tests.spark.stages:totals_changes_and_state_snapshot"])
def test_snapshot_sink_holds_exactly_the_current_state_so_a_naive_sum_is_the_true_total(
    spark: Any, orders: OrdersPipeline, stage: str
) -> None:
    import pyarrow.dataset as ds

    target = orders.root / "out" / "totals"
    batches = [[1, 2, 3, 4, 4], [4, 5, 7, 2], [], [8, 9, 1]]  # repeats, and a quiet epoch
    seen: set[int] = set()
    for n, ids in enumerate(batches, start=1):
        if ids:
            orders.add_file(f"f{n}", ids)
        seen |= set(ids)
        result = run_stage(snapshot_spec(orders, f"run-{n}", stage), spark)
        orders.commit(result)

        want = true_totals(seen)
        frame = read_target(target)
        assert frame["total"].sum() == pytest.approx(sum(want.values()))
        assert dict(zip(frame["customer"], frame["total"], strict=True)) == pytest.approx(want)
        table = ds.dataset(target, format="parquet", partitioning="hive").to_table()
        assert table.num_rows == len(want)  # one row per key: no older snapshot left
        assert sorted(p.name for p in target.glob("epoch=*")) == [f"epoch={n}"]
        assert (target / LATEST).read_text().strip() == f"epoch={n}"


def test_changes_sink_is_a_changelog_whose_naive_sum_overcounts(
    spark: Any, orders: OrdersPipeline
) -> None:
    """The default (changes) is kept and documented: each epoch holds the keys it changed."""
    orders.add_file("a", [1, 2, 3])
    orders.commit(run_stage(orders.spec("run-1", stage="tests.spark.stages:dedup_and_totals"), spark))
    orders.add_file("b", [4])  # customer c1 changes again
    orders.commit(run_stage(orders.spec("run-2", stage="tests.spark.stages:dedup_and_totals"), spark))

    frame = read_target(orders.root / "out" / "totals")
    frame["epoch"] = frame["epoch"].astype(int)  # a hive partition column (categorical in pandas)
    assert sorted(zip(frame["epoch"], frame["customer"], frame["total"], strict=True)) == [
        (1, "c0", 3.0), (1, "c1", 1.0), (1, "c2", 2.0), (2, "c1", 5.0)]
    latest = frame.sort_values("epoch").groupby("customer")["total"].last()
    assert latest.sum() == sum(true_totals({1, 2, 3, 4}).values())


def test_state_snapshot_on_the_first_epoch_needs_no_schema(
    spark: Any, orders: OrdersPipeline
) -> None:
    orders.add_file("a", [1, 2, 4])
    result = run_stage(
        orders.spec("run-1", stage="tests.spark.stages:totals_changes_and_state_snapshot"), spark
    )
    orders.commit(result)
    rows = sorted((r["customer"], r["total"], r["orders"]) for r in orders.published("totals"))
    assert rows == [("c1", 5.0, 2), ("c2", 2.0, 1)]


def test_key_set_snapshot_after_dedup_holds_this_epochs_keys_too(
    spark: Any, orders: OrdersPipeline
) -> None:
    orders.add_file("a", [1, 2])
    orders.commit(run_stage(orders.spec("run-1", stage="tests.spark.stages:seen_keys_after_dedup"), spark))
    orders.add_file("b", [2, 3])
    second = run_stage(orders.spec("run-2", stage="tests.spark.stages:seen_keys_after_dedup"), spark)
    orders.commit(second)
    import pyarrow.parquet as pq

    files = sorted((orders.root / "out" / "orders" / "epoch=2").glob("*.parquet"))
    assert sorted(i for f in files for i in pq.read_table(f).column("order_id").to_pylist()) == [1, 2, 3]


def test_epoch_without_rows_publishes_no_directory_but_is_committed(
    spark: Any, orders: OrdersPipeline
) -> None:
    orders.add_file("a", [1, 2])
    orders.commit(run_stage(orders.spec("run-1"), spark))
    quiet = run_stage(orders.spec("run-2"), spark)
    committed = orders.commit(quiet)

    assert orders.pipeline.state(2) is EpochState.COMMITTED
    assert committed.empty == ["orders_table"]
    assert sorted(p.name for p in (orders.root / "out" / "orders").iterdir()
                  if p.name.startswith("epoch=")) == ["epoch=1"]
    assert orders.pipeline.restore_point().epoch == 2  # the epoch is recorded and restores
    orders.add_file("b", [2, 3])
    orders.commit(run_stage(orders.spec("run-3"), spark))
    assert sorted(p.name for p in (orders.root / "out" / "orders").glob("epoch=*")) == [
        "epoch=1", "epoch=3"]


def test_declared_sink_the_stage_did_not_write_is_logged_and_recorded(
    spark: Any, orders: OrdersPipeline, caplog: pytest.LogCaptureFixture
) -> None:
    orders.add_file("a", [1])
    with caplog.at_level(logging.WARNING):
        result = run_stage(orders.spec("run-1"), spark)  # dedup_orders writes orders_table only
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("'customer_totals'" in m and "did not write it" in m for m in warnings), warnings
    assert orders.pipeline.status(1).prepared["ingest"].not_written == ["customer_totals"]

    with caplog.at_level(logging.WARNING):
        committed = orders.commit(result)
    assert committed.not_written == ["customer_totals"]
    assert committed.to_dict()["not_written"] == ["customer_totals"]
    assert any("['customer_totals'] were declared but not written" in r.getMessage()
               for r in caplog.records if r.levelno == logging.WARNING)
    assert not (orders.root / "out" / "totals").exists()


def test_unknown_modes_are_refused_naming_the_choices(spark: Any, tmp_path: Path) -> None:
    from airflow_seatunnel_ckpt.core.errors import ConfigError
    from airflow_seatunnel_ckpt.spark import StateError
    from airflow_seatunnel_ckpt.spark.registry import SINKS
    from airflow_seatunnel_ckpt.spark.state import KeyValueState
    from tests.spark.state.test_state_settings import settings_for

    state = KeyValueState(spark, settings_for(tmp_path, 1))
    df = spark.createDataFrame([(1, 2.0)], "k long, amount double")
    with pytest.raises(ConfigError, match=r"mode must be 'changes' .* or 'snapshot' .*got 'full'"):
        state.aggregate(df, "k", {"total": ("sum", "amount")}, mode="full")
    with pytest.raises(StateError, match=r"call snapshot\(\) after the update .*or pass snapshot\(schema=...\)"):
        state.snapshot()
    refused = r"file sink 'totals'.*option 'mode': input should be 'append' or 'snapshot' \(found 'upsert'\)"
    with pytest.raises(ConfigError, match=refused):
        SINKS.build("totals", {"type": "file", "path": str(tmp_path / "t"), "mode": "upsert"})
