"""Tables as sources, end to end through ``run_stage``: an Iceberg table (pyiceberg SQL
catalog on SQLite), a Delta table (delta-rs) and another pipeline's file sink, appended to
between epochs. Every row is read by exactly one committed epoch, a retry of an epoch
reads the same files whatever arrived since, and a source that broke the append-only
contract fails the epoch by name."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_seatunnel_ckpt.spark import StageContext, StageSpec, run_stage
from airflow_seatunnel_ckpt.spark.sources.files import SourceError
from tests.spark.conftest import OrdersPipeline

pytestmark = [pytest.mark.spark]

COPY = "tests.spark.test_table_sources:copy_events"
COPY_THEN_FAIL = "tests.spark.test_table_sources:copy_events_then_fail"
SCHEMA = pa.schema([pa.field("id", pa.int64()), pa.field("day", pa.date32())])
MONDAY = datetime.date(2026, 11, 23)


class InjectedFailure(RuntimeError):
    """The stage dies after staging its output (attempt 1 of an epoch)."""


def copy_events(ctx: StageContext, spark: Any) -> None:
    """Stage the epoch's input as it is."""
    ctx.sink("out").write(ctx.source("events").read())


def copy_events_then_fail(ctx: StageContext, spark: Any) -> None:
    """Stage the epoch's input, then crash before the epoch is prepared."""
    copy_events(ctx, spark)
    raise InjectedFailure("killed after staging")


def rows(ids: range, day: datetime.date = MONDAY) -> pa.Table:
    return pa.Table.from_pylist([{"id": i, "day": day} for i in ids], schema=SCHEMA)


def spec(orders: OrdersPipeline, run_id: str, source: dict[str, Any], attempt: int = 1,
         stage: str = COPY) -> StageSpec:
    out = {"type": "file", "path": f"file://{orders.root / 'out'}"}
    return orders.spec(run_id, attempt=attempt, stage=stage, sources={"events": source}, sinks={"out": out})


def published(orders: OrdersPipeline) -> list[dict[str, Any]]:
    """Every row the downstream pipeline committed, read back with pyarrow."""
    found: list[dict[str, Any]] = []
    for f in sorted((orders.root / "out").glob("epoch=*/*.parquet")):
        found += pq.read_table(f).to_pylist()
    return found


def run_and_commit(orders: OrdersPipeline, run_id: str, source: dict[str, Any], spark: Any) -> Any:
    result = run_stage(spec(orders, run_id, source), spark)
    orders.commit(result)
    return result


def test_iceberg_source_reads_each_appended_row_once_and_a_retry_reads_the_same_files(
        spark: Any, orders: OrdersPipeline, tmp_path: Path) -> None:
    from pyiceberg.catalog.sql import SqlCatalog

    catalog_props = {"type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db", "warehouse": f"file://{tmp_path}/wh"}
    catalog = SqlCatalog("bronze", **{k: v for k, v in catalog_props.items() if k != "type"})
    catalog.create_namespace("bronze")
    table = catalog.create_table("bronze.events", schema=SCHEMA)
    source = {"type": "iceberg", "table": "bronze.events", "catalog": catalog_props, "catalog_name": "bronze"}
    table.append(rows(range(0, 3)))
    table.append(rows(range(3, 5)))
    first = run_and_commit(orders, "run-1", source, spark)
    assert (first.rows, len(first.sources["events"]["files"])) == (5, 2)

    table.append(rows(range(5, 8)))
    with pytest.raises(InjectedFailure):
        run_stage(spec(orders, "run-2", source, stage=COPY_THEN_FAIL), spark)
    table.append(rows(range(8, 10)))  # arrives between the attempts: waits for epoch 3
    retried = run_stage(spec(orders, "run-2", source, attempt=2), spark)
    orders.commit(retried)
    assert retried.rows == 3 and retried.sources["events"]["after_snapshot_id"] == first.sources["events"][
        "snapshot_id"]

    orders.commit(run_stage(spec(orders, "run-3", source), spark))
    quiet = run_and_commit(orders, "run-4", source, spark)  # nothing new: an empty, typed read
    assert quiet.rows == 0
    assert sorted(r["id"] for r in published(orders)) == list(range(10))

    table.delete("id = 1")  # rewrites a consumed file: rows already delivered change
    with pytest.raises(SourceError, match=r"epoch 5: .*\('overwrite'\) removed or rewrote rows"):
        run_stage(spec(orders, "run-5", source), spark)
    assert sorted(r["id"] for r in published(orders)) == list(range(10))


def test_delta_source_adds_partition_values_and_refuses_a_delete(
        spark: Any, orders: OrdersPipeline, tmp_path: Path) -> None:
    from deltalake import DeltaTable, write_deltalake

    uri = str(tmp_path / "bronze" / "events")
    source = {"type": "delta", "path": uri}

    def append(ids: range, day: datetime.date) -> None:
        write_deltalake(uri, rows(ids, day), mode="append", partition_by=["day"])

    append(range(0, 2), MONDAY)
    append(range(2, 4), MONDAY + datetime.timedelta(days=1))
    run_and_commit(orders, "run-1", source, spark)
    append(range(4, 6), MONDAY + datetime.timedelta(days=2))
    second = run_and_commit(orders, "run-2", source, spark)
    assert [f["partition"] for f in second.sources["events"]["files"]] == [{"day": "2026-11-25"}]
    run_and_commit(orders, "run-3", source, spark)  # nothing new

    got = sorted((r["id"], r["day"]) for r in published(orders))
    assert got == [(i, MONDAY + datetime.timedelta(days=i // 2)) for i in range(6)]

    DeltaTable(uri).delete("id = 0")
    with pytest.raises(SourceError, match=r"epoch 4: .*version 3 \(DELETE\)"):
        run_stage(spec(orders, "run-4", source), spark)


def test_pipeline_output_reads_only_committed_epochs_of_the_upstream_sink(
        spark: Any, tmp_path: Path) -> None:
    upstream = OrdersPipeline(tmp_path / "bronze", name="bronze")
    downstream = OrdersPipeline(tmp_path / "silver", name="silver")
    target = upstream.root / "out" / "orders"
    source = {"type": "pipeline_output", "path": f"file://{target}"}

    # The upstream sink is partitioned: its column lives in directory names below epoch=<e>/.
    sinks = {"orders_table": {"type": "file", "path": f"file://{target}", "partition_by": ["customer"]}}
    upstream.add_file("a", [1, 2])
    upstream.commit(run_stage(upstream.spec("run-1", sinks=sinks), spark))
    upstream.add_file("b", [3])
    upstream.commit(run_stage(upstream.spec("run-2", sinks=sinks), spark))
    # Epoch 2 as a reader sees it while its publisher is still at work: the data files
    # are there, the _SUCCESS it writes last is not yet.
    success = target / "epoch=2" / "_SUCCESS"
    success.rename(tmp_path / "held_back_SUCCESS")

    first = run_and_commit(downstream, "run-1", source, spark)
    assert first.sources["events"]["epochs"] == [1]
    assert sorted(r["order_id"] for r in published(downstream)) == [1, 2]
    # The partition column is back, the upstream's epoch directory is not a column.
    assert sorted((r["order_id"], r["customer"]) for r in published(downstream)) == [(1, "c1"), (2, "c2")]
    assert set(published(downstream)[0]) == {"order_id", "customer", "amount"}

    (tmp_path / "held_back_SUCCESS").rename(success)  # the publisher finished
    second = run_and_commit(downstream, "run-2", source, spark)
    assert second.sources["events"]["epochs"] == [2]
    quiet = run_and_commit(downstream, "run-3", source, spark)
    assert (quiet.rows, quiet.sources["events"]["epochs"]) == (0, [])
    assert sorted(r["order_id"] for r in published(downstream)) == [1, 2, 3]


def test_a_table_sources_pinned_data_file_gone_is_refused_before_a_replay_reads_it(tmp_path: Path) -> None:
    from deltalake import write_deltalake
    from pyiceberg.catalog.sql import SqlCatalog

    from airflow_seatunnel_ckpt.spark.sources.tables import DeltaSource, IcebergSource

    uri = str(tmp_path / "bronze" / "events")
    write_deltalake(uri, rows(range(0, 2)), mode="append")
    props = {"type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db", "warehouse": f"file://{tmp_path}/wh"}
    catalog = SqlCatalog("bronze", **{k: v for k, v in props.items() if k != "type"})
    catalog.create_namespace("bronze")
    catalog.create_table("bronze.events", schema=SCHEMA).append(rows(range(0, 2)))
    sources = [DeltaSource("events", path=uri),
               IcebergSource("events", table="bronze.events", catalog=props, catalog_name="bronze")]
    for source in sources:
        pinned = source.plan([])
        source.verify_pinned(pinned)  # all there
        (gone,) = [f["path"] for f in pinned["files"]]
        Path(gone.removeprefix("file://")).unlink()  # a vacuum / snapshot expiry removed it
        with pytest.raises(SourceError, match=r"not all there.*" + gone.rsplit("/", 1)[-1] + ".*gone"):
            source.verify_pinned(pinned)
