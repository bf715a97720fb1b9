"""A Spark stage writing a Delta sink, committed by the epoch's commit, read by DuckDB.

The stage runs on local Spark with no Delta jars; the commit adds the staged Parquet to
the table with delta-rs. DuckDB's ``delta_scan`` (an independent reader) must see every
order exactly once, with the partition column once and its values right.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from airflow_seatunnel_ckpt.core.errors import ConfigError
from airflow_seatunnel_ckpt.spark import run_stage
from airflow_seatunnel_ckpt.spark.sinks.tables import DeltaSink
from tests.spark.conftest import OrdersPipeline, RunStage, order_row
from tests.tables import duckdb_connection

pytestmark = [pytest.mark.spark]


def delta_scan(table: Path, query: str = "SELECT * FROM t ORDER BY order_id") -> tuple[list[str], list[Any]]:
    con = duckdb_connection("delta")
    con.execute(f"CREATE TEMP VIEW t AS SELECT * FROM delta_scan('{table}')")
    result = con.execute(query)
    return [d[0] for d in result.description], result.fetchall()


@pytest.mark.connect_slice("the Delta sink")
def test_a_stage_writing_a_delta_sink_commits_each_epoch_once_into_the_table(
        run: RunStage, orders: OrdersPipeline) -> None:
    from deltalake import DeltaTable

    table = orders.root / "tables" / "orders"
    sinks = {"orders_table": {"type": "delta", "path": str(table), "partition_by": ["customer"]}}
    orders.add_file("a", [1, 2, 3, 3])
    first = run(orders.spec("run-1", sinks=sinks))
    orders.commit(first)
    orders.add_file("b", [3, 4])
    second = run(orders.spec("run-2", sinks=sinks))
    orders.commit(second)
    again = orders.pipeline.commit(second.epoch)  # the commit task retried: nothing twice

    assert again.already_committed
    columns, rows = delta_scan(table)
    assert columns == ["order_id", "customer", "amount"]
    assert rows == [tuple(order_row(i).values()) for i in [1, 2, 3, 4]]
    _, by_customer = delta_scan(table, "SELECT customer, count(*) FROM t GROUP BY customer ORDER BY customer")
    assert by_customer == [("c0", 1), ("c1", 2), ("c2", 1)]
    delta = DeltaTable(str(table))
    app_id = f"seatunnel-ckpt/{orders.pipeline.store_id()}/orders/orders_table"
    assert (delta.version(), delta.transaction_version(app_id)) == (1, second.epoch)
    assert sorted(delta.to_pyarrow_table().column("order_id").to_pylist()) == [1, 2, 3, 4]


def test_a_delta_sink_on_a_store_delta_rs_cannot_reach_is_refused_when_built() -> None:
    with pytest.raises(ConfigError, match=r"delta sink 'o': path 'memory://t' is on memory://"):
        DeltaSink("o", "memory://t")


def test_a_delta_sink_with_merge_keys_and_snapshot_mode_is_refused_when_built() -> None:
    with pytest.raises(ConfigError, match=r"merge_keys \['customer'\] with mode 'snapshot'"):
        DeltaSink("totals", "/tmp/t", mode="snapshot", merge_keys=["customer"])
    assert DeltaSink("totals", "/tmp/t", merge_keys="customer").table.merge_keys == ["customer"]


def test_a_key_value_state_upserted_into_delta_is_the_current_total_per_key(
        spark: Any, orders: OrdersPipeline) -> None:
    """The keys an epoch changed are MERGEd: the table is the state's current snapshot, one row per key."""
    tables = orders.root / "tables"
    sinks = {"orders_table": {"type": "delta", "path": str(tables / "orders")},
             "customer_totals": {"type": "delta", "path": str(tables / "totals"), "merge_keys": ["customer"]}}
    seen: set[int] = set()
    for n, ids in enumerate([[1, 2, 3, 4], [4, 5, 7]], start=1):
        orders.add_file(f"f{n}", ids)
        seen |= set(ids)
        orders.commit(run_stage(orders.spec(f"run-{n}", stage="tests.spark.stages:dedup_and_totals", sinks=sinks),
                                spark))

    want: dict[str, float] = {}
    for i in sorted(seen):
        row = order_row(i)
        want[row["customer"]] = want.get(row["customer"], 0.0) + row["amount"]
    _, totals = delta_scan(tables / "totals", "SELECT customer, total FROM t ORDER BY customer")
    assert totals == sorted(want.items())  # one row per key, the newest total: no row_number() needed
    _, ids = delta_scan(tables / "orders", "SELECT order_id FROM t ORDER BY order_id")
    assert [i for (i,) in ids] == sorted(seen)
