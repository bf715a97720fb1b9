"""End to end on local Spark: a stage writes Iceberg sinks, each epoch commits once.

Spark stages the Parquet (no Iceberg jars), the commit adds it to the table with
pyiceberg; DuckDB's iceberg extension reads the result back as any user would.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pyiceberg.catalog import load_catalog

from airflow_seatunnel_ckpt.core.errors import ConfigError
from airflow_seatunnel_ckpt.spark import StageContext, StageSpec, run_stage
from airflow_seatunnel_ckpt.spark.sinks.tables import IcebergSink
from tests.core.sinks.test_iceberg_sink import duckdb_rows
from tests.spark.conftest import OrdersPipeline, order_row


def orders_and_totals(ctx: StageContext, spark: Any) -> None:
    """The stage run here (by import path): new orders appended, totals upserted and replaced."""
    fresh = ctx.key_set("seen_orders").dedup(ctx.source("orders").read(), key="order_id").cache()
    ctx.sink("orders_table").write(fresh)
    state = ctx.key_value("customer_totals")
    changed = state.aggregate(fresh, key="customer", aggregates={"total": ("sum", "amount")})
    ctx.sink("totals_upsert").write(changed)  # the changed keys only
    ctx.sink("customer_totals").write(state.snapshot())  # every key
    fresh.unpersist()


def iceberg_spec(orders: OrdersPipeline, run_id: str, catalog: dict[str, str]) -> StageSpec:
    """Orders appended (partitioned by customer), totals as a snapshot table and upserted by key."""
    common = {"type": "iceberg", "catalog": catalog, "catalog_name": "lake"}
    sinks = {"orders_table": {**common, "table": "lake.orders", "partition_by": ["customer"]},
             "customer_totals": {**common, "table": "lake.customer_totals", "mode": "snapshot"},
             "totals_upsert": {**common, "table": "lake.totals_by_key", "merge_keys": ["customer"]}}
    return orders.spec(run_id, stage="tests.spark.test_iceberg_stage:orders_and_totals", sinks=sinks)


@pytest.mark.spark
def test_stage_into_iceberg_tables_commits_every_order_once_with_partitions(
        spark: Any, orders: OrdersPipeline) -> None:
    catalog = {"type": "sql", "uri": f"sqlite:///{orders.root}/catalog.db",
               "warehouse": f"file://{orders.root}/warehouse"}
    orders.add_file("f1", [1, 2, 3, 4, 4])
    first = run_stage(iceberg_spec(orders, "run-1", catalog), spark)
    orders.commit(first)
    orders.commit(first)  # a repeated commit task: nothing twice
    orders.add_file("f2", [4, 5, 6, 2])
    orders.commit(run_stage(iceberg_spec(orders, "run-2", catalog), spark))

    lake = load_catalog("lake", **catalog)
    table = lake.load_table("lake.orders")
    rows = duckdb_rows(table, "order_id, customer, amount")
    assert rows == sorted((i, order_row(i)["customer"], float(i)) for i in range(1, 7))
    assert len(table.snapshots()) == 2
    partitions = {f["partition"]["customer"] for f in table.inspect.files().to_pylist()}
    assert partitions == {"c0", "c1", "c2"}  # the partition column is in the files, never NULL

    totals = lake.load_table("lake.customer_totals")
    want: dict[str, float] = {}
    for i in range(1, 7):
        want[order_row(i)["customer"]] = want.get(order_row(i)["customer"], 0.0) + float(i)
    got = duckdb_rows(totals, "customer, total")
    assert got == sorted(want.items())  # the current totals only: the older snapshot was replaced
    assert len(totals.snapshots()) == 2
    # the upserted table: epoch 2 changed c0 and c2 only, yet every key is current, once
    assert duckdb_rows(lake.load_table("lake.totals_by_key"), "customer, total") == sorted(want.items())


def test_sink_without_catalog_resolves_the_embedded_catalog_when_built(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    sink = IcebergSink("orders", "lake.orders", partition_by=["customer"])
    root = f"{tmp_path}/seatunnel-ckpt-warehouse"
    assert sink.table.catalog == {"type": "sql", "uri": f"sqlite:///{root}/catalog.db", "warehouse": f"file://{root}"}
    assert sink.table.partition_by == ["customer"]
    # with a connection, the connection is the catalog: no embedded default mixed in
    assert IcebergSink("orders", "lake.orders", catalog_conn_id="lake").table.catalog == {}


def test_sink_refuses_secrets_in_catalog_options_and_names_the_way_out() -> None:
    with pytest.raises(ConfigError, match=r"\['s3.secret-access-key'\] look like secrets.*catalog_conn_id"):
        IcebergSink("orders", "lake.orders", catalog={"type": "rest", "s3.secret-access-key": "x"})


def test_sink_refuses_a_table_name_without_namespace() -> None:
    with pytest.raises(ConfigError, match="table must be '<namespace>.<name>', got 'orders'"):
        IcebergSink("orders", "orders")


def test_sink_upsert_key_needs_upsert_mode() -> None:
    assert IcebergSink("t", "lake.t", merge_keys=["customer"]).table.merge_keys == ["customer"]
    assert IcebergSink("t", "lake.t", merge_keys=["customer"]).mode.value == "upsert"
    with pytest.raises(ConfigError, match=r"merge_keys \['customer'\] with mode 'snapshot'"):
        IcebergSink("t", "lake.t", merge_keys=["customer"], mode="snapshot")


def test_declaring_an_iceberg_sink_at_parse_time_imports_neither_pyiceberg_nor_pyspark() -> None:
    import subprocess
    import sys

    code = ("import sys\n"
            "from airflow_seatunnel_ckpt.spark.declaration import EntryDeclaration\n"
            "EntryDeclaration.check('sink', 'orders', {'type': 'iceberg', 'table': 'lake.orders'}, where='dag')\n"
            "print(sorted(m for m in ('pyiceberg', 'pyspark') if m in sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip().splitlines()[-1] == "[]"
