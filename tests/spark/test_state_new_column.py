"""A new aggregate column in a stored key -> value state, on local Spark (issue 21).

The stage gains ``max_amount`` next to the stored ``total``. The next normal epoch runs:
stored keys the epoch does not change hold NULL in the new column (it starts empty), the
keys it changes aggregate this epoch's rows; a replay from epoch 1 (a full refresh) then
fills it for every stored key, so the state and the tables equal a fresh run's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from airflow_seatunnel_ckpt.spark import run_stage
from tests.spark.conftest import order_row
from tests.spark.test_replay import Lake, order_ids, state_rows

pytestmark = pytest.mark.spark


def _new_rows(epoch: int) -> list[dict[str, Any]]:
    """Epoch ``epoch``'s rows that dedup lets through (its first two repeat the epoch before)."""
    ids = order_ids(epoch)
    return [order_row(i) for i in (ids if epoch == 1 else ids[2:])]


def test_a_new_aggregate_column_in_a_snapshot_state_starts_empty_then_a_full_refresh_fills_it(
        spark: Any, tmp_path: Path) -> None:
    lake = Lake(tmp_path / "lake", "iceberg")
    lake.run(spark, range(1, 4), "fixed")  # keys stored without max_amount
    # customer c0's orders of epoch 4 are held back: it is a stored key the epoch leaves alone
    lake.orders.add_file("f04", [i for i in order_ids(4)[2:] if i % 3])
    lake.orders.commit(run_stage(
        lake.spec("run-4", "with_max"), spark))

    epoch_4 = [r for r in _new_rows(4) if r["order_id"] % 3]
    changed = {c: max(r["amount"] for r in epoch_4 if r["customer"] == c) for c in ("c1", "c2")}
    totals = {c: sum(r["amount"] for e in range(1, 4) for r in _new_rows(e) if r["customer"] == c)
              for c in ("c0", "c1", "c2")}
    totals = {c: t + sum(r["amount"] for r in epoch_4 if r["customer"] == c) for c, t in totals.items()}
    assert lake.totals("customer, total, max_amount") == [
        ("c0", totals["c0"], None), ("c1", totals["c1"], changed["c1"]), ("c2", totals["c2"], changed["c2"])]

    result = lake.replay(spark, 1, stage="with_max")  # full refresh

    fresh = Lake(tmp_path / "fresh", "iceberg")
    fresh.run(spark, range(1, 4), "with_max")
    fresh.orders.add_file("f04", [i for i in order_ids(4)[2:] if i % 3])
    fresh.orders.commit(run_stage(
        fresh.spec("run-4", "with_max"), spark))
    assert result.replayed == [1, 2, 3, 4]
    want = fresh.totals("customer, total, max_amount")
    assert all(m is not None for _, _, m in want)
    assert lake.totals("customer, total, max_amount") == want
    assert state_rows(lake.pipeline) == state_rows(fresh.pipeline)
    lake.run(spark, range(5, 6), "with_max")  # the next epoch continues from the refreshed state
    fresh.run(spark, range(5, 6), "with_max")
    assert lake.totals("customer, total, max_amount") == fresh.totals("customer, total, max_amount")
    assert state_rows(lake.pipeline) == state_rows(fresh.pipeline)
