"""The Iceberg table sink: an epoch's staged Parquet becomes one Iceberg snapshot, once.

Files are staged by hand with pyarrow into a real store, the commit goes into a real
pyiceberg SQL catalog on SQLite (or a warehouse on the moto S3 server), and what the table
holds is read back by pyiceberg *and* by DuckDB's iceberg extension (an independent reader
of the metadata files). One module holds the sink's whole contract (commit, retries,
races, crash points, schema, modes, upsert, S3), hence a little over the usual length.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import io
import re
import shutil
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog import load_catalog
from pyiceberg.table import Table

import airflow_seatunnel_ckpt.core.sinks.iceberg as iceberg
from airflow_seatunnel_ckpt.core import CheckpointConfig, CheckpointStore, Decision, EpochState, Pipeline
from airflow_seatunnel_ckpt.core.catalogs import embedded_catalog
from airflow_seatunnel_ckpt.core.errors import SinkRefusedError
from airflow_seatunnel_ckpt.core.models import SinkManifest, SinkMode
from airflow_seatunnel_ckpt.core.sinks import SinkCommit, commit_sink, register_secret_resolver
from airflow_seatunnel_ckpt.core.sinks.base import store_id
from airflow_seatunnel_ckpt.core.sinks.markers import short
from airflow_seatunnel_ckpt.core.storage import open_storage
from tests.core.epochs import at_once
from tests.core.faults import SimulatedCrash
from tests.tables import duckdb_connection

IDENT = "lake.orders"
SCHEMA = pa.schema([("order_id", pa.int64()), ("region", pa.string()), ("amount", pa.float64()),
                    ("ts", pa.timestamp("us"))])


def orders(ids: list[int], region: str, schema: pa.Schema = SCHEMA) -> pa.Table:
    """Rows of one partition (one region), as the Spark TableSink stages them."""
    cols: dict[str, Any] = {
        "order_id": ids, "region": [region] * len(ids), "amount": [float(i) for i in ids],
        "ts": [dt.datetime(2026, 1, 1) + dt.timedelta(hours=i) for i in ids]}
    for name in schema.names:
        cols.setdefault(name, [None] * len(ids))
    return pa.table({n: cols[n] for n in schema.names}, schema=schema)


class Lake:
    """A checkpoint store, a SQLite catalog and a warehouse under one tmp dir."""

    def __init__(self, root: Path, store_url: str | None = None, store_options: dict[str, Any] | None = None,
                 catalog: dict[str, str] | None = None, pipeline: str = "orders") -> None:
        self.root = root
        self.catalog_props = catalog or {"type": "sql", "uri": f"sqlite:///{root}/catalog.db",
                                         "warehouse": f"file://{root}/warehouse"}
        config = {"storage_url": store_url or f"file://{root}/store", "storage_options": store_options or {}}
        self.pipeline: Pipeline = CheckpointStore(CheckpointConfig.from_mapping(config)).pipeline(pipeline)

    def options(self, partition_by: list[str] | None = None, **extra: Any) -> dict[str, Any]:
        return {"type": "iceberg", "table": IDENT, "catalog_name": "lake", "catalog": self.catalog_props,
                "partition_by": ["region"] if partition_by is None else partition_by, **extra}

    def stage(self, epoch: int, parts: dict[str, pa.Table], *, attempt: int = 1, sink: str = "orders",
              mode: SinkMode = SinkMode.APPEND, partition_by: list[str] | None = None) -> SinkManifest:
        """Write one Parquet file per partition into the attempt's staging; its manifest."""
        staging = self.pipeline.staging_path(epoch, attempt, sink)
        for folder, table in parts.items():
            buf = io.BytesIO()
            pq.write_table(table, buf)
            name = f"{folder}/part-00000.parquet" if folder else "part-00000.parquet"
            self.pipeline.storage.write_atomic(f"{staging}/{name}", buf.getvalue())
        rows = sum(t.num_rows for t in parts.values())
        manifest = self.pipeline.manifest_for_staged(epoch, attempt, sink, f"iceberg://lake/{IDENT}", rows)
        return dataclasses.replace(manifest, mode=mode, table=self.options(partition_by))

    def request(self, epoch: int, manifest: SinkManifest, retries: int = 3) -> SinkCommit:
        store = self.pipeline.storage.url.rsplit("/", 1)[0]  # as Pipeline.commit names the store
        return SinkCommit(self.pipeline.name, store, epoch, manifest, self.pipeline.storage, retries,
                          log_holds=self.pipeline.holds_commit)

    def run_epoch(self, run_id: str, parts: dict[str, pa.Table], **kwargs: Any) -> int:
        """begin, stage, prepare, decide commit, commit: the whole protocol."""
        epoch = self.pipeline.begin(run_id).epoch
        manifest = self.stage(epoch, parts, **kwargs)
        self.pipeline.prepare(epoch, "ingest", 1, run_id=run_id, sinks=[manifest])
        self.pipeline.decide(epoch, Decision.COMMIT, "all prepared", by="test")
        self.pipeline.commit(epoch)
        return epoch

    def table(self) -> Table:
        return load_catalog("lake", **self.catalog_props).load_table(IDENT)


def eu_us(ids_eu: list[int], ids_us: list[int], schema: pa.Schema = SCHEMA) -> dict[str, pa.Table]:
    """Two partitions, staged in the hidden directories the Spark TableSink writes."""
    return {"__partition_region=EU": orders(ids_eu, "EU", schema),
            "__partition_region=US": orders(ids_us, "US", schema)}


def duckdb_rows(table: Table, columns: str = "order_id, region, amount, ts") -> list[tuple[Any, ...]]:
    """The table's rows as DuckDB's iceberg extension reads them from the metadata file."""
    con = duckdb_connection("avro", "iceberg")
    metadata = table.metadata_location.removeprefix("file://")
    return sorted(con.execute(f"SELECT {columns} FROM iceberg_scan('{metadata}')").fetchall())


def scan_ids(table: Table) -> list[int]:
    return sorted(table.scan().to_arrow().column("order_id").to_pylist())


def data_file_paths(table: Table) -> list[str]:
    return sorted(t["file_path"] for t in table.inspect.files().to_pylist())


def test_epoch_commit_is_one_snapshot_readable_by_pyiceberg_and_duckdb(tmp_path: Path) -> None:
    lake = Lake(tmp_path)
    epoch = lake.run_epoch("r1", eu_us([1, 2], [3]))
    table = lake.table()
    assert scan_ids(table) == [1, 2, 3]
    rows = duckdb_rows(table)
    assert [(r[0], r[1], r[2]) for r in rows] == [(1, "EU", 1.0), (2, "EU", 2.0), (3, "US", 3.0)]
    assert rows[0][3] == dt.datetime(2026, 1, 1, 1)  # TIMESTAMP_MICROS kept as is
    partitions = sorted(str(f["partition"]["region"]) for f in table.inspect.files().to_pylist())
    assert partitions == ["EU", "US"]  # never NULL partitions
    [snap] = table.snapshots()
    assert snap.summary is not None
    assert snap.summary["seatunnel-ckpt.epoch"] == str(epoch)
    assert snap.summary["seatunnel-ckpt.pipeline"] == "orders"
    assert table.properties["seatunnel-ckpt.orders.orders.epoch"] == str(epoch)
    # deterministic, Iceberg-style paths inside the table location
    short = lake.pipeline.store_id().replace("-", "")[:12]
    assert all(f"/data/region={r}/orders/orders/{short}-e{epoch}/part-00000.parquet" in p
               for p, r in zip(data_file_paths(table), ["EU", "US"], strict=True))
    assert "commit.retry.num-retries" not in table.properties  # the override is never written


def test_commit_retry_after_success_is_already_and_adds_no_snapshot(tmp_path: Path) -> None:
    lake = Lake(tmp_path)
    manifest = lake.stage(1, eu_us([1], [2]))
    first = commit_sink(lake.request(1, manifest))
    second = commit_sink(lake.request(1, manifest))
    assert (first.how, second.how) == ("appended", "already")
    table = lake.table()
    assert len(table.snapshots()) == 1
    assert scan_ids(table) == [1, 2]
    assert len(data_file_paths(table)) == len(set(data_file_paths(table))) == 2


def both_commit_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hold each committer's first transaction until the other has read the marker too."""
    barrier, real = threading.Barrier(2, timeout=30), iceberg._commit_once
    waited: set[int] = set()

    def commit_once(*args: Any) -> str:
        if threading.get_ident() not in waited:
            waited.add(threading.get_ident())
            barrier.wait()
        return real(*args)

    monkeypatch.setattr(iceberg, "_commit_once", commit_once)


def test_racing_committers_of_one_epoch_land_it_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    lake = Lake(tmp_path)
    manifest = lake.stage(1, eu_us([1, 2], [3]))
    commit_sink(lake.request(1, manifest))
    # epoch 2 is raced: both committers start from the same table version
    manifest = lake.stage(2, eu_us([4, 5], [6]))
    both_commit_at_once(monkeypatch)
    outcomes = at_once([lambda: commit_sink(lake.request(2, manifest)) for _ in range(2)])
    assert "commit conflict" in caplog.text  # the loser's commit failed, then it read the marker
    errors = [o for o in outcomes if isinstance(o, BaseException)]
    assert not errors, errors
    assert sorted(o.how for o in outcomes if not isinstance(o, BaseException)) == ["already", "appended"]
    table = lake.table()
    assert [s.summary["seatunnel-ckpt.epoch"] for s in table.snapshots() if s.summary] == ["1", "2"]
    assert scan_ids(table) == [1, 2, 3, 4, 5, 6]
    assert [r[0] for r in duckdb_rows(table)] == [1, 2, 3, 4, 5, 6]


def test_with_pyiceberg_retry_left_on_a_raced_epoch_lands_twice(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Why the commit turns the library's retry off (if this fails, pyiceberg fixed the trap)."""
    monkeypatch.setattr(iceberg, "_without_library_retry", lambda table: table)
    lake = Lake(tmp_path)
    commit_sink(lake.request(1, lake.stage(1, eu_us([1, 2], [3]))))
    manifest = lake.stage(2, eu_us([4, 5], [6]))
    both_commit_at_once(monkeypatch)
    outcomes = at_once([lambda: commit_sink(lake.request(2, manifest)) for _ in range(2)])
    assert [getattr(o, "how", o) for o in outcomes] == ["appended", "appended"]
    assert scan_ids(lake.table()) == [1, 2, 3, 4, 4, 5, 5, 6, 6]


def test_crash_after_placing_files_commits_rows_once(tmp_path: Path) -> None:
    lake = Lake(tmp_path)
    commit_sink(lake.request(1, lake.stage(1, eu_us([1], [2]))))
    manifest = lake.stage(2, eu_us([3], [4]))
    request = lake.request(2, manifest)
    iceberg.place_files(request, iceberg.table_storage(lake.table(), request))  # then the process dies
    assert scan_ids(lake.table()) == [1, 2]  # placed files are invisible until the transaction
    assert commit_sink(request).how == "appended"
    table = lake.table()
    assert scan_ids(table) == [1, 2, 3, 4]
    assert len(table.snapshots()) == 2


def test_crash_after_the_transaction_is_recovered_as_already(tmp_path: Path) -> None:
    lake = Lake(tmp_path)
    run_id = "r1"
    epoch = lake.pipeline.begin(run_id).epoch
    manifest = lake.stage(epoch, eu_us([1], [2]))
    lake.pipeline.prepare(epoch, "ingest", 1, run_id=run_id, sinks=[manifest])
    lake.pipeline.decide(epoch, Decision.COMMIT, "all prepared", by="test")
    # the commit task's table transaction lands, then it dies before recording `committed`
    commit_sink(lake.request(epoch, manifest))
    result = lake.pipeline.commit(epoch)  # the retry (or the recovery DAG)
    assert [s.how for s in result.sinks] == ["already"]
    table = lake.table()
    assert len(table.snapshots()) == 1
    assert scan_ids(table) == [1, 2]


def test_added_nullable_column_evolves_the_schema_in_the_epoch_transaction(tmp_path: Path) -> None:
    lake = Lake(tmp_path)
    lake.run_epoch("r1", eu_us([1], [2]))
    wider = SCHEMA.append(pa.field("note", pa.string()))
    parts = eu_us([3], [4], wider)
    parts["__partition_region=EU"] = parts["__partition_region=EU"].set_column(
        4, "note", pa.array(["hello"], pa.string()))
    lake.run_epoch("r2", parts)
    table = lake.table()
    assert "note" in table.schema().column_names
    got = sorted(table.scan().to_arrow().select(["order_id", "note"]).to_pylist(), key=lambda r: r["order_id"])
    assert [r["note"] for r in got] == [None, None, "hello", None]
    assert [r[1] for r in duckdb_rows(table, "order_id, note")] == [None, None, "hello", None]
    assert len(table.snapshots()) == 2  # schema change and data in one snapshot


def test_type_change_is_refused_before_anything_is_committed(tmp_path: Path) -> None:
    lake = Lake(tmp_path)
    commit_sink(lake.request(1, lake.stage(1, eu_us([1], [2]))))
    changed = pa.schema([f if f.name != "amount" else pa.field("amount", pa.string()) for f in SCHEMA])
    parts = {"__partition_region=EU": pa.table({"order_id": [3], "region": ["EU"], "amount": ["3.0"],
                                                "ts": [dt.datetime(2026, 1, 2)]}, schema=changed)}
    with pytest.raises(SinkRefusedError, match=r"column 'amount' is double in the table but string") as err:
        commit_sink(lake.request(2, lake.stage(2, parts)))
    assert "nothing was committed" in str(err.value)
    table = lake.table()
    assert len(table.snapshots()) == 1 and scan_ids(table) == [1, 2]
    assert table.properties["seatunnel-ckpt.orders.orders.epoch"] == "1"
    assert not (tmp_path / "warehouse" / "lake.db" / "orders" / "data" / "region=EU" / "orders-e2-orders").exists()


def test_dropped_column_is_refused_naming_the_column(tmp_path: Path) -> None:
    lake = Lake(tmp_path)
    commit_sink(lake.request(1, lake.stage(1, eu_us([1], [2]))))
    narrower = pa.schema([f for f in SCHEMA if f.name != "amount"])
    with pytest.raises(SinkRefusedError, match=r"column 'amount' \(double\) is in the table but not in the epoch's"):
        commit_sink(lake.request(2, lake.stage(2, eu_us([3], [4], narrower))))
    assert len(lake.table().snapshots()) == 1


def test_snapshot_mode_replaces_the_table_each_epoch_in_one_snapshot(tmp_path: Path) -> None:
    lake = Lake(tmp_path)
    lake.run_epoch("r1", eu_us([1, 2], [3]), mode=SinkMode.SNAPSHOT)
    lake.run_epoch("r2", eu_us([10], [11]), mode=SinkMode.SNAPSHOT)
    table = lake.table()
    assert scan_ids(table) == [10, 11]
    assert [r[0] for r in duckdb_rows(table)] == [10, 11]
    snaps = table.snapshots()
    assert [s.summary["seatunnel-ckpt.epoch"] for s in snaps if s.summary] == ["1", "2"]
    assert snaps[-1].summary is not None and snaps[-1].summary.operation.value == "overwrite"
    # each snapshot of the history is exactly one epoch's rows
    first = sorted(table.scan(snapshot_id=snaps[0].snapshot_id).to_arrow().column("order_id").to_pylist())
    assert first == [1, 2, 3]


def test_changes_mode_appends_every_epoch(tmp_path: Path) -> None:
    lake = Lake(tmp_path)
    lake.run_epoch("r1", eu_us([1], [2]))
    lake.run_epoch("r2", eu_us([3], [4]))
    assert scan_ids(lake.table()) == [1, 2, 3, 4]


def eu(ids: list[int]) -> dict[str, pa.Table]:
    """One partition (EU) of an epoch's rows."""
    return {"__partition_region=EU": orders(ids, "EU")}


def prepared(lake: Lake, run_id: str, parts: dict[str, pa.Table]) -> tuple[int, SinkManifest]:
    """begin, stage and prepare one epoch of the lake's pipeline."""
    epoch = lake.pipeline.begin(run_id).epoch
    manifest = lake.stage(epoch, parts)
    lake.pipeline.prepare(epoch, "ingest", 1, run_id=run_id, sinks=[manifest])
    return epoch, manifest


def release(table: Table) -> None:
    """Remove the table's owner property (the way out of a refused second owner)."""
    if "seatunnel-ckpt.owner" in table.properties:
        with table.transaction() as tx:
            tx.remove_properties("seatunnel-ckpt.owner")


def refused_at_the_decision(lake: Lake, run_id: str, parts: dict[str, pa.Table]) -> str:
    """Prepare an epoch, ask for commit: it must be decided ABORT before anything reaches the table; the reason."""
    before = lake.table().metadata_location
    epoch, _ = prepared(lake, run_id, parts)
    record = lake.pipeline.decide(epoch, Decision.COMMIT, "all prepared", by="test")
    assert record.decision is Decision.ABORT, "an ownership refusal must come before the commit decision"
    assert lake.pipeline.state(epoch) is EpochState.ABORTED
    assert lake.table().metadata_location == before  # no snapshot, no property, and no file placed
    placement = f"{lake.pipeline.name}/orders/{short(lake.pipeline.store_id())}-e{epoch}"
    assert not list((lake.root / "warehouse").rglob(placement))
    return record.reason


def test_a_wiped_and_recreated_store_is_aborted_before_the_decision_naming_both_stores_not_taken_as_already(
        tmp_path: Path) -> None:
    lake = Lake(tmp_path)
    for run, ids in (("r1", [1]), ("r2", [2]), ("r3", [3])):
        lake.run_epoch(run, eu_us(ids, []))
    old = store_id(open_storage(f"file://{tmp_path}/store"))
    shutil.rmtree(tmp_path / "store")  # an ephemeral AIRFLOW_HOME with an external catalog

    fresh = Lake(tmp_path)  # same URL, same catalog; epochs restart at 1
    reason = refused_at_the_decision(fresh, "r1", eu([101]))  # it used to be recorded COMMITTED, how=already
    new = fresh.pipeline.store_id()
    assert new != old
    for each in (old, new):
        assert f"store {each} (file://{tmp_path}/store)" in reason
    assert "was wiped and recreated" in reason and "remove its table property seatunnel-ckpt.owner" in reason
    assert scan_ids(lake.table()) == [1, 2, 3]

    release(lake.table())  # the documented way out: the table is handed over to the new store
    fresh.run_epoch("r2", eu([102]))
    assert scan_ids(lake.table()) == [1, 2, 3, 102]


def test_a_second_store_with_a_pipeline_of_the_same_name_is_aborted_before_the_decision_naming_both(
        tmp_path: Path) -> None:
    lake_a = Lake(tmp_path)
    lake_b = Lake(tmp_path, store_url=f"file://{tmp_path}/store-b")  # the same catalog and table
    lake_a.run_epoch("r1", eu([1]))

    reason = refused_at_the_decision(lake_b, "r1", eu([101]))
    assert f"store {lake_a.pipeline.store_id()} (file://{tmp_path}/store)" in reason
    assert f"store {lake_b.pipeline.store_id()} (file://{tmp_path}/store-b)" in reason
    assert scan_ids(lake_a.table()) == [1]
    lake_a.run_epoch("r2", eu([2]))  # the owner carries on
    assert scan_ids(lake_a.table()) == [1, 2]
    epoch = lake_b.pipeline.begin("r2").epoch  # the way out: a table of its own
    staged = lake_b.stage(epoch, eu([102]))
    assert staged.table is not None
    lake_b.pipeline.prepare(epoch, "ingest", 1, run_id="r2", sinks=[
        dataclasses.replace(staged, table={**staged.table.to_dict(), "table": "lake.orders_b"})])
    assert lake_b.pipeline.decide(epoch, Decision.COMMIT, "all prepared", by="test").decision is Decision.COMMIT
    lake_b.pipeline.commit(epoch)
    assert scan_ids(load_catalog("lake", **lake_b.catalog_props).load_table("lake.orders_b")) == [102]


def test_a_second_pipeline_into_the_table_is_aborted_before_the_decision_until_the_owner_property_is_removed(
        tmp_path: Path) -> None:
    clicks = Lake(tmp_path, pipeline="clicks")
    clicks.run_epoch("r1", eu([1, 2]))
    backfill = Lake(tmp_path, pipeline="clicks_backfill")  # same store, same table

    reason = refused_at_the_decision(backfill, "b1", eu([1]))
    assert re.search(r"belongs to pipeline 'clicks' of store .*not to pipeline 'clicks_backfill'.*"
                     r"remove its table property seatunnel-ckpt.owner", reason), reason
    assert scan_ids(clicks.table()) == [1, 2]

    release(clicks.table())  # the documented way out: the table is handed over
    backfill.run_epoch("b2", eu([1]))
    assert scan_ids(clicks.table()) == [1, 1, 2]
    assert "belongs to pipeline 'clicks_backfill'" in refused_at_the_decision(clicks, "r2", eu([3]))


def test_placement_names_of_pipelines_and_sinks_with_dashes_never_collide(tmp_path: Path) -> None:
    """Pipeline 'a' sink 'e1-x' and pipeline 'a-e1' sink 'x' used to share 'data/region=EU/a-e1-e1-x/'."""
    first, second = Lake(tmp_path, pipeline="a"), Lake(tmp_path, pipeline="a-e1")
    commit_sink(first.request(1, first.stage(1, eu([1]), sink="e1-x")))
    release(first.table())  # handed over to the other pipeline
    commit_sink(second.request(1, second.stage(1, eu([2, 3]), sink="x")))

    assert scan_ids(first.table()) == [1, 2, 3]
    assert len(set(data_file_paths(first.table()))) == 2


def test_partitioning_that_differs_from_the_table_is_refused(tmp_path: Path) -> None:
    lake = Lake(tmp_path)
    commit_sink(lake.request(1, lake.stage(1, eu_us([1], [2]))))
    with pytest.raises(SinkRefusedError, match="partitioned by identity of nothing"):
        commit_sink(lake.request(2, lake.stage(2, {"": orders([3], "EU")}, partition_by=[])))


def test_empty_catalog_options_use_the_embedded_catalog_under_airflow_home(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "home"))
    props = embedded_catalog()
    assert props["uri"] == f"sqlite:///{tmp_path}/home/seatunnel-ckpt-warehouse/catalog.db"
    lake = Lake(tmp_path)
    manifest = lake.stage(1, eu_us([1], [2]))
    manifest = dataclasses.replace(manifest,
        table={**manifest.table.to_dict(), "catalog": {}, "catalog_name": "default"})
    commit_sink(lake.request(1, manifest))
    table = load_catalog("default", **props).load_table(IDENT)
    assert scan_ids(table) == [1, 2]


def test_secret_resolver_adds_catalog_properties_at_commit_time(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_seatunnel_ckpt.core.sinks import base

    monkeypatch.setattr(base, "SECRET_RESOLVERS", [])  # only this test's resolver
    lake = Lake(tmp_path)
    real_uri = lake.catalog_props["uri"]
    lake.catalog_props = {**lake.catalog_props, "uri": "sqlite:////nonexistent/never.db"}

    def resolve(options: Any) -> dict[str, str]:
        return {"uri": real_uri} if options.get("catalog_conn_id") == "lake_conn" else {}

    register_secret_resolver(resolve)
    manifest = lake.stage(1, eu_us([1], [2]))
    manifest = dataclasses.replace(manifest, table={**manifest.table.to_dict(), "catalog_conn_id": "lake_conn"})
    assert real_uri not in str(manifest.to_dict())
    commit_sink(lake.request(1, manifest))
    assert scan_ids(load_catalog("lake", **{**lake.catalog_props, "uri": real_uri}).load_table(IDENT)) == [1, 2]


@pytest.mark.s3
def test_warehouse_on_s3_commits_once(tmp_path: Path, moto_server: Any, s3_bucket: str) -> None:
    catalog = {"type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db", "warehouse": f"{s3_bucket}/warehouse",
               "s3.endpoint": moto_server.endpoint_url, "s3.access-key-id": "testing",
               "s3.secret-access-key": "testing", "s3.region": "us-east-1"}
    lake = Lake(tmp_path, store_url=f"{s3_bucket}/store", store_options=moto_server.storage_options,
                catalog=catalog)
    epoch = lake.run_epoch("r1", eu_us([1, 2], [3]))
    manifest = lake.stage(epoch, eu_us([1, 2], [3]), attempt=2)
    assert commit_sink(lake.request(epoch, manifest)).how == "already"
    table = lake.table()
    assert scan_ids(table) == [1, 2, 3]
    assert len(table.snapshots()) == 1
    assert all(p.startswith(f"{s3_bucket}/warehouse/") for p in data_file_paths(table))


def test_empty_snapshot_epoch_empties_the_table(tmp_path: Path) -> None:
    lake = Lake(tmp_path)
    lake.run_epoch("r1", eu_us([1, 2], [3]), mode=SinkMode.SNAPSHOT)
    lake.run_epoch("r2", {}, mode=SinkMode.SNAPSHOT)  # the keyed state became empty
    table = lake.table()
    assert scan_ids(table) == []
    assert duckdb_rows(table) == []
    assert len(table.snapshots()) == 2


def test_zero_row_file_of_an_unpartitioned_snapshot_is_an_empty_table(tmp_path: Path) -> None:
    lake = Lake(tmp_path)
    lake.run_epoch("r1", {"": orders([1, 2], "EU")}, mode=SinkMode.SNAPSHOT, partition_by=[])
    lake.run_epoch("r2", {"": orders([], "EU")}, mode=SinkMode.SNAPSHOT, partition_by=[])
    assert scan_ids(lake.table()) == []
    assert lake.table().schema().column_names == SCHEMA.names


def test_a_crash_at_every_step_of_a_table_commit_leaves_each_row_once(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from pyiceberg.catalog.sql import SqlCatalog

    from airflow_seatunnel_ckpt.core import EpochState
    from tests.core import faults

    plan = faults.install(monkeypatch)  # every store mutation: placement, records, staging removal
    real_commit = SqlCatalog.commit_table

    def commit_table_with_crash_points(self: SqlCatalog, *args: Any, **kwargs: Any) -> Any:
        plan.tick("catalog.commit_table (before)")
        response = real_commit(self, *args, **kwargs)
        plan.tick("catalog.commit_table (landed, not yet returned)")
        return response

    monkeypatch.setattr(SqlCatalog, "commit_table", commit_table_with_crash_points)

    def setup(n: int) -> tuple[Lake, int]:
        lake = Lake(tmp_path / f"crash-{n}")
        lake.run_epoch("r1", eu_us([1], [2]))
        epoch = lake.pipeline.begin("r2").epoch
        manifest = lake.stage(epoch, eu_us([3, 4], [5]))
        lake.pipeline.prepare(epoch, "ingest", 1, run_id="r2", sinks=[manifest])
        lake.pipeline.decide(epoch, Decision.COMMIT, "all prepared", by="test")
        return lake, epoch

    def resume(world: tuple[Lake, int]) -> None:
        lake, epoch = world
        fresh = Lake(lake.root)  # the retry or the recovery DAG: a new process
        fresh.pipeline.commit(epoch)

    def check(world: tuple[Lake, int], crashed: bool) -> None:
        lake, epoch = world
        table = lake.table()
        assert scan_ids(table) == [1, 2, 3, 4, 5]
        assert [r[0] for r in duckdb_rows(table)] == [1, 2, 3, 4, 5]
        assert [s.summary["seatunnel-ckpt.epoch"] for s in table.snapshots() if s.summary] == ["1", "2"]
        assert len(set(data_file_paths(table))) == len(data_file_paths(table)) == 4
        assert lake.pipeline.status(epoch).state is EpochState.COMMITTED

    run = faults.crash_at_every_mutation(plan, setup, lambda w: w[0].pipeline.commit(w[1]), resume, check)
    assert any("catalog.commit_table (landed" in c for c in run.crashed_at)
    assert run.crash_points >= 4


TOTALS = pa.schema([("customer", pa.string()), ("total", pa.float64())])


def totals(rows: dict[str, float]) -> pa.Table:
    return pa.table({"customer": list(rows), "total": list(rows.values())}, schema=TOTALS)


def upsert_manifest(lake: Lake, epoch: int, rows: dict[str, float]) -> SinkManifest:
    manifest = lake.stage(epoch, {"": totals(rows)}, sink="totals", partition_by=[])
    return dataclasses.replace(manifest, table={**manifest.table.to_dict(), "table": "lake.totals",
                                                "mode": "upsert", "merge_keys": ["customer"]})


def test_upsert_key_replaces_the_rows_of_the_epochs_keys_in_one_commit(tmp_path: Path) -> None:
    lake = Lake(tmp_path)
    for epoch, rows in enumerate([{"c0": 1.0, "c1": 2.0, "c2": 3.0}, {"c0": 10.0, "c3": 4.0}], start=1):
        result = commit_sink(lake.request(epoch, upsert_manifest(lake, epoch, rows)))
        assert result.how == "merged"
    assert commit_sink(lake.request(2, upsert_manifest(lake, 2, {"c0": 10.0, "c3": 4.0}))).how == "already"
    table = load_catalog("lake", **lake.catalog_props).load_table("lake.totals")
    want = [("c0", 10.0), ("c1", 2.0), ("c2", 3.0), ("c3", 4.0)]
    assert sorted(tuple(r.values()) for r in table.scan().to_arrow().to_pylist()) == want
    assert duckdb_rows(table, "customer, total") == want  # one row per key: no row_number() in readers
    assert table.properties["seatunnel-ckpt.orders.totals.epoch"] == "2"


def test_upsert_refuses_a_key_twice_in_one_epoch_and_commits_nothing(tmp_path: Path) -> None:
    lake = Lake(tmp_path)
    commit_sink(lake.request(1, upsert_manifest(lake, 1, {"c0": 1.0})))
    manifest = lake.stage(2, {"": pa.concat_tables([totals({"c0": 2.0}), totals({"c0": 3.0})])}, sink="totals",
                          partition_by=[])
    manifest = dataclasses.replace(manifest, table={**manifest.table.to_dict(), "table": "lake.totals",
                                                    "mode": "upsert", "merge_keys": ["customer"]})
    with pytest.raises(SinkRefusedError, match=r"1 key\(s\) appear more than once.*'c0'"):
        commit_sink(lake.request(2, manifest))
    table = load_catalog("lake", **lake.catalog_props).load_table("lake.totals")
    assert table.scan().to_arrow().to_pylist() == [{"customer": "c0", "total": 1.0}]


def upsert_orders(lake: Lake, epoch: int, parts: dict[str, pa.Table]) -> SinkManifest:
    """An upsert epoch of ``lake.orders`` on ``order_id``, partitioned by region."""
    manifest = lake.stage(epoch, parts)
    return dataclasses.replace(manifest,
        table={**manifest.table.to_dict(), "mode": "upsert", "merge_keys": ["order_id"]})


def amounts_times_ten(parts: dict[str, pa.Table]) -> dict[str, pa.Table]:
    return {k: t.set_column(2, "amount", pc.multiply(t.column("amount"), 10.0)) for k, t in parts.items()}


def order_rows(table: Table) -> list[tuple[int, str, float]]:
    return sorted((r["order_id"], r["region"], r["amount"]) for r in table.scan().to_arrow().to_pylist())


def test_upsert_epoch_is_one_overwrite_snapshot_that_rewrites_only_the_files_holding_its_keys(
        tmp_path: Path) -> None:
    lake = Lake(tmp_path)
    commit_sink(lake.request(1, upsert_orders(lake, 1, eu_us([1, 2], [3, 4]))))
    us_file = next(p for p in data_file_paths(lake.table()) if "/region=US/" in p)
    result = commit_sink(lake.request(2, upsert_orders(lake, 2, amounts_times_ten(
        {"__partition_region=EU": orders([2, 5], "EU")}))))
    assert result.how == "merged"

    table = lake.table()
    assert order_rows(table) == [(1, "EU", 1.0), (2, "EU", 20.0), (3, "US", 3.0), (4, "US", 4.0), (5, "EU", 50.0)]
    assert duckdb_rows(table, "order_id, amount")[1] == (2, 20.0)
    [_, upsert] = table.snapshots()  # one snapshot per epoch: no delete-only snapshot to time-travel to
    assert upsert.summary is not None and upsert.summary.operation.value == "overwrite"
    assert upsert.summary["seatunnel-ckpt.epoch"] == "2"
    assert upsert.summary["deleted-data-files"] == "1" and upsert.summary["added-data-files"] == "2"
    assert us_file in data_file_paths(table)  # holds none of the epoch's keys: not read, not rewritten
    rewritten = [p for p in data_file_paths(table) if "/rewritten-" in p]
    epoch_dir = f"/data/region=EU/orders/orders/{short(lake.pipeline.store_id())}-e2/"
    assert len(rewritten) == 1 and epoch_dir in rewritten[0]  # in the epoch's own directory


def test_upsert_commit_retried_after_a_crash_before_the_catalog_commit_adds_its_rewrite_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pyiceberg.catalog.sql import SqlCatalog

    lake = Lake(tmp_path)
    commit_sink(lake.request(1, upsert_orders(lake, 1, eu_us([1, 2], [3]))))
    request = lake.request(2, upsert_orders(lake, 2, amounts_times_ten(eu_us([2, 4], []))))
    with monkeypatch.context() as mp:
        def die(*args: Any, **kwargs: Any) -> None:
            raise SimulatedCrash("killed with the rewritten file written, before the catalog commit")

        mp.setattr(SqlCatalog, "commit_table", die)
        with pytest.raises(SimulatedCrash):
            commit_sink(request)
    placed = iceberg.table_storage(lake.table(), request)
    written = [f.path for f in placed.walk("data") if "/rewritten-" in f.path]
    assert len(written) == 1 and len(lake.table().snapshots()) == 1  # written, not committed

    assert commit_sink(request).how == "merged"
    table = lake.table()
    assert order_rows(table) == [(1, "EU", 1.0), (2, "EU", 20.0), (3, "US", 3.0), (4, "EU", 40.0)]
    assert [f.path for f in placed.walk("data") if "/rewritten-" in f.path] == written  # the same file, once
    assert len(table.snapshots()) == 2
    assert commit_sink(request).how == "already"


def test_racing_upsert_committers_of_one_epoch_land_it_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lake = Lake(tmp_path)
    commit_sink(lake.request(1, upsert_orders(lake, 1, eu_us([1, 2], [3]))))
    manifest = upsert_orders(lake, 2, amounts_times_ten(eu_us([2, 4], [3])))
    both_commit_at_once(monkeypatch)
    outcomes = at_once([lambda: commit_sink(lake.request(2, manifest)) for _ in range(2)])
    assert sorted(getattr(o, "how", repr(o)) for o in outcomes) == ["already", "merged"]
    table = lake.table()
    assert order_rows(table) == [(1, "EU", 1.0), (2, "EU", 20.0), (3, "US", 30.0), (4, "EU", 40.0)]
    assert sorted(r[0] for r in duckdb_rows(table, "order_id")) == [1, 2, 3, 4]
    assert len(table.snapshots()) == 2


def test_upsert_on_two_key_columns_replaces_only_the_rows_matching_both(tmp_path: Path) -> None:
    lake = Lake(tmp_path)

    def by_region_and_id(epoch: int, parts: dict[str, pa.Table]) -> SinkManifest:
        manifest = lake.stage(epoch, parts)
        return dataclasses.replace(manifest,
            table={**manifest.table.to_dict(), "mode": "upsert", "merge_keys": ["region", "order_id"]})

    commit_sink(lake.request(1, by_region_and_id(1, eu_us([1, 2], [1, 3]))))
    result = commit_sink(lake.request(2, by_region_and_id(2, amounts_times_ten(eu_us([1], [])))))
    assert result.how == "merged"
    table = lake.table()
    assert order_rows(table) == [(1, "EU", 10.0), (1, "US", 1.0), (2, "EU", 2.0), (3, "US", 3.0)]
    assert len(table.snapshots()) == 2
