"""The Delta table sink's commit: every epoch's rows exactly once in a Delta table.

Staged Parquet (as the Spark ``DeltaSink`` stages it: partition columns kept in the files,
below hidden ``__partition_<col>=<v>/`` directories) is committed with delta-rs and read
back by two readers that know nothing of this project: deltalake's ``to_pyarrow_table``
and DuckDB's ``delta_scan`` (the delta extension wheel, delta-kernel-rs underneath).
"""

from __future__ import annotations

import json
import re
import shutil
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from airflow_seatunnel_ckpt.core import Decision, EpochState, Pipeline
from airflow_seatunnel_ckpt.core.errors import PublishError, SinkRefusedError, TableOwnershipError
from airflow_seatunnel_ckpt.core.models import SinkManifest, SinkMode
from airflow_seatunnel_ckpt.core.sinks import SinkCommit, commit_sink
from airflow_seatunnel_ckpt.core.sinks import delta as delta_commit
from airflow_seatunnel_ckpt.core.sinks.base import store_id
from airflow_seatunnel_ckpt.core.sinks.files import OWNER_MARKER
from airflow_seatunnel_ckpt.core.sinks.markers import short
from airflow_seatunnel_ckpt.core.storage import Storage
from airflow_seatunnel_ckpt.core.storage.base import FileInfo
from tests.core import faults
from tests.core.conftest import StoreSpec
from tests.core.epochs import at_once
from tests.core.faults import SimulatedCrash
from tests.tables import duckdb_delta_rows

SCHEMA = pa.schema([("id", pa.int64()), ("country", pa.string()), ("amount", pa.float64())])


def rows(ids: list[int], country: str) -> pa.Table:
    return pa.table({"id": ids, "country": [country] * len(ids), "amount": [i * 1.5 for i in ids]}, schema=SCHEMA)


def stage(store: Storage, epoch: int, files: dict[str, pa.Table], *, uri: str, sink: str = "orders",
          mode: SinkMode = SinkMode.APPEND, partition_by: tuple[str, ...] = ("country",),
          staging: str = "") -> SinkManifest:
    """Write ``files`` (path below the staging dir -> rows) as Parquet and describe them as a manifest."""
    staging = staging or f"staging/epoch={epoch}/attempt=1/{sink}"
    infos = []
    for path, table in files.items():
        sink_buf = pa.BufferOutputStream()
        pq.write_table(table, sink_buf)
        store.write_atomic(f"{staging}/{path}", sink_buf.getvalue().to_pybytes())
        infos.append(FileInfo(path, store.size(f"{staging}/{path}"), store.checksum(f"{staging}/{path}")))
    return SinkManifest(sink, uri, staging, infos, sum(t.num_rows for t in files.values()), mode=mode,
                        table={"type": "delta", "path": uri, "partition_by": list(partition_by)})


def request(store: Storage, epoch: int, manifest: SinkManifest, retries: int = 3) -> SinkCommit:
    return SinkCommit("orders", "file:///store", epoch, manifest, store, retries, store_id=store_id(store))


def app_id(store: str, sink: str = "orders") -> str:
    """The application transaction id of pipeline ``orders``'s ``sink`` from the store with id ``store``."""
    return f"seatunnel-ckpt/{store}/orders/{sink}"


def placed(store: str, epoch: int, n: int, sink: str = "orders") -> str:
    """Where the ``n``-th staged file of an epoch lands below its partition directory."""
    return f"orders/{sink}/{short(store)}-e{epoch}-{n:05d}.parquet"


def by_country(epoch: int, **countries: list[int]) -> dict[str, pa.Table]:
    return {f"__partition_country={c}/part-00000-e{epoch}.parquet": rows(ids, c) for c, ids in countries.items()}


def duckdb_rows(uri: str) -> list[tuple[Any, ...]]:
    return duckdb_delta_rows(uri, order_by="id")


def deltalake_rows(uri: str, **options: str) -> list[tuple[Any, ...]]:
    table = DeltaTable(uri, storage_options=options or None).to_pyarrow_table()
    return sorted(tuple(r.values()) for r in table.to_pylist())


def adds(uri: str) -> list[dict[str, Any]]:
    """The table's current files as delta-rs lists them (flattened statistics)."""
    return pa.table(DeltaTable(uri).get_add_actions(flatten=True)).to_pylist()


def logged_adds(uri: str) -> list[dict[str, Any]]:
    """Every add action written to a local table's log, read as plain JSON."""
    return [json.loads(line)["add"] for log in sorted(Path(uri, "_delta_log").glob("*.json"))
            for line in log.read_text().splitlines() if line.startswith('{"add"')]


def expected(**countries: list[int]) -> list[tuple[Any, ...]]:
    return sorted((i, c, i * 1.5) for c, ids in countries.items() for i in ids)



def test_one_epoch_is_read_once_with_its_partition_values_by_deltalake_and_duckdb(
        store: Storage, table_uri: str) -> None:
    manifest = stage(store, 1, by_country(1, DE=[1, 2], FR=[3]), uri=table_uri)
    published = commit_sink(request(store, 1, manifest))

    assert (published.files, published.rows, published.how) == (2, 3, "copied")
    want = expected(DE=[1, 2], FR=[3])
    assert deltalake_rows(table_uri) == want
    assert duckdb_rows(table_uri) == want
    table = DeltaTable(table_uri)
    assert table.schema().to_arrow().names == ["id", "country", "amount"]  # no duplicated partition column
    assert table.metadata().partition_columns == ["country"]
    current = adds(table_uri)
    assert sorted(a["path"] for a in current) == [f"country={c}/{placed(store_id(store), 1, n)}"
                                               for n, c in enumerate(["DE", "FR"])]
    assert {a["partition.country"] for a in current} == {"DE", "FR"}
    assert sorted(a["num_records"] for a in current) == [1, 2]
    assert {a["min.id"] for a in current} == {1, 3} and {a["max.id"] for a in current} == {2, 3}
    assert table.transaction_version(app_id(store_id(store))) == 1
    info = table.history(1)[0]
    assert (info["pipeline"], info["sink"], info["epoch"], info["store"]) == ("orders", "orders", 1, "file:///store")
    # A filter on the partition column prunes on the log's values and keeps the right rows.
    assert DeltaTable(table_uri).to_pyarrow_table(filters=[("country", "=", "FR")]).num_rows == 1


def test_a_retried_commit_finds_the_epoch_in_the_table_and_adds_nothing(store: Storage, table_uri: str) -> None:
    manifest = stage(store, 1, by_country(1, DE=[1, 2]), uri=table_uri)
    commit_sink(request(store, 1, manifest))
    again = commit_sink(request(store, 1, manifest))

    assert again.how == "already"
    assert DeltaTable(table_uri).version() == 0
    assert duckdb_rows(table_uri) == expected(DE=[1, 2])


def test_changes_epochs_append_one_table_version_each(store: Storage, table_uri: str) -> None:
    commit_sink(request(store, 1, stage(store, 1, by_country(1, DE=[1]), uri=table_uri)))
    commit_sink(request(store, 2, stage(store, 2, by_country(2, DE=[2], FR=[3]), uri=table_uri)))

    table = DeltaTable(table_uri)
    assert (table.version(), table.transaction_version(app_id(store_id(store)))) == (1, 2)
    assert duckdb_rows(table_uri) == expected(DE=[1, 2], FR=[3])


@pytest.mark.parametrize("retries", [0, 3])
@pytest.mark.parametrize("existing", [False, True], ids=["creating", "appending"])
def test_two_committers_racing_one_epoch_land_it_in_one_version(
        store: Storage, table_uri: str, existing: bool, retries: int) -> None:
    if existing:
        commit_sink(request(store, 1, stage(store, 1, by_country(1, FR=[9]), uri=table_uri)))
    manifest = stage(store, 2, by_country(2, DE=[1, 2], FR=[3]), uri=table_uri)
    outcomes = at_once([lambda: commit_sink(request(store, 2, manifest, retries))] * 2)

    # The loser's conflict is no error: it reads the table again and finds the epoch.
    assert not [o for o in outcomes if isinstance(o, BaseException)], outcomes
    assert sorted(o.how for o in outcomes) == ["already", "copied"]  # type: ignore[union-attr]
    table = DeltaTable(table_uri)
    assert table.version() == (1 if existing else 0)
    assert duckdb_rows(table_uri) == expected(DE=[1, 2], FR=[3, 9] if existing else [3])
    assert len(adds(table_uri)) == (3 if existing else 2)
    assert len(logged_adds(table_uri)) == (3 if existing else 2)  # no file added twice, in any version


def test_a_commit_killed_after_placing_the_files_commits_them_once_when_rerun(
        store: Storage, table_uri: str, monkeypatch: pytest.MonkeyPatch) -> None:
    manifest = stage(store, 1, by_country(1, DE=[1, 2], FR=[3]), uri=table_uri)
    real = delta_commit.create_table_with_add_actions

    def killed(*args: Any, **kwargs: Any) -> None:
        raise SimulatedCrash("killed before the log commit")

    monkeypatch.setattr(delta_commit, "create_table_with_add_actions", killed)
    with pytest.raises(SimulatedCrash):
        commit_sink(request(store, 1, manifest))
    assert sorted(str(p.relative_to(table_uri)) for p in Path(table_uri).rglob("*.parquet")) == [
        f"country=DE/{placed(store_id(store), 1, 0)}", f"country=FR/{placed(store_id(store), 1, 1)}"]

    monkeypatch.setattr(delta_commit, "create_table_with_add_actions", real)
    assert commit_sink(request(store, 1, manifest)).how == "copied"  # by the killed attempt: kept as they were
    assert DeltaTable(table_uri).version() == 0
    assert duckdb_rows(table_uri) == expected(DE=[1, 2], FR=[3])
    assert len(list(Path(table_uri).rglob("*.parquet"))) == 2


def test_a_commit_killed_after_the_log_commit_is_recorded_as_already_by_the_rerun(
        local_spec: StoreSpec, table_uri: str, monkeypatch: pytest.MonkeyPatch) -> None:
    pipeline = local_spec.pipeline()
    epoch = pipeline.begin("run-1").epoch
    manifest = stage(pipeline.storage, epoch, by_country(epoch, DE=[1, 2]), uri=table_uri,
                     staging=pipeline.staging_path(epoch, 1, "orders"))
    pipeline.prepare(epoch, "ingest", 1, run_id="run-1", sinks=[manifest], operators={}, sources={},
                     base=pipeline.restore_point())
    pipeline.decide(epoch, Decision.COMMIT, "all prepared", by="test")

    def killed(*args: Any, **kwargs: Any) -> None:
        raise SimulatedCrash("killed before the committed record")

    monkeypatch.setattr(pipeline.txlog, "acknowledge_committed", killed)
    with pytest.raises(SimulatedCrash):
        pipeline.commit(epoch)
    assert DeltaTable(table_uri).transaction_version(app_id(pipeline.store_id())) == epoch

    result = local_spec.pipeline().commit(epoch)  # a new process: the commit task's retry
    assert [s.how for s in result.sinks] == ["already"]
    assert DeltaTable(table_uri).version() == 0
    assert duckdb_rows(table_uri) == expected(DE=[1, 2])


def test_a_staged_file_whose_size_differs_from_the_manifest_is_refused_by_name(
        store: Storage, table_uri: str) -> None:
    manifest = stage(store, 1, by_country(1, DE=[1, 2], FR=[3]), uri=table_uri)
    damaged = f"{manifest.staging}/{manifest.files[1].path}"
    store.write_atomic(damaged, store.read(damaged) + b"junk")

    with pytest.raises(PublishError, match=r"__partition_country=FR/part-00000-e1\.parquet.* bytes, the manifest says"):
        commit_sink(request(store, 1, manifest))
    assert not DeltaTable.is_deltatable(table_uri)


def test_a_placed_file_whose_size_differs_is_refused_before_the_log_commit(
        store: Storage, table_uri: str, monkeypatch: pytest.MonkeyPatch) -> None:
    manifest = stage(store, 1, by_country(1, DE=[1]), uri=table_uri)
    place = delta_commit.place_files

    def place_then_damage(req: SinkCommit, target: Storage, where: str) -> Any:
        placed, how = place(req, target, where)
        target.write_atomic(placed[0].path, b"not the file")
        return placed, how

    monkeypatch.setattr(delta_commit, "place_files", place_then_damage)
    with pytest.raises(PublishError, match=rf"country=DE/{placed(store_id(store), 1, 0)} is 12 bytes, the manifest"):
        commit_sink(request(store, 1, manifest))
    assert not DeltaTable.is_deltatable(table_uri)


def test_a_changed_column_type_is_refused_before_anything_is_committed(store: Storage, table_uri: str) -> None:
    commit_sink(request(store, 1, stage(store, 1, by_country(1, DE=[1]), uri=table_uri)))
    changed = pa.table({"id": ["x"], "country": ["DE"], "amount": [1.0]})
    manifest = stage(store, 2, {"__partition_country=DE/p.parquet": changed}, uri=table_uri)

    with pytest.raises(SinkRefusedError, match=r"id: table has PrimitiveType\(\"long\"\), the epoch's files have "
                                          r"PrimitiveType\(\"string\"\).*Cast or add the columns"):
        commit_sink(request(store, 2, manifest))
    assert DeltaTable(table_uri).version() == 0
    missing = pa.table({"id": [2], "country": ["DE"]})
    with pytest.raises(SinkRefusedError,
                       match=r"Columns missing from the files: amount \(PrimitiveType\(\"double\"\)\)"):
        commit_sink(request(store, 3, stage(store, 3, {"__partition_country=DE/p.parquet": missing}, uri=table_uri)))
    assert DeltaTable(table_uri).version() == 0


def test_an_added_column_evolves_the_table_and_older_rows_read_null(store: Storage, table_uri: str) -> None:
    commit_sink(request(store, 1, stage(store, 1, by_country(1, DE=[1]), uri=table_uri)))
    wider = rows([2], "DE").append_column("note", pa.array(["new"]))
    commit_sink(request(store, 2, stage(store, 2, {"__partition_country=DE/p.parquet": wider}, uri=table_uri)))

    want = [(1, "DE", 1.5, None), (2, "DE", 3.0, "new")]
    assert deltalake_rows(table_uri) == want
    assert duckdb_rows(table_uri) == want
    assert DeltaTable(table_uri).transaction_version(app_id(store_id(store))) == 2


def test_snapshot_epochs_replace_the_table_in_one_version_each(store: Storage, table_uri: str) -> None:
    snap = SinkMode.SNAPSHOT
    commit_sink(request(store, 1, stage(store, 1, by_country(1, DE=[1, 2], FR=[3]), uri=table_uri, mode=snap)))
    commit_sink(request(store, 2, stage(store, 2, by_country(2, FR=[4]), uri=table_uri, mode=snap)))

    assert duckdb_rows(table_uri) == expected(FR=[4])
    assert deltalake_rows(table_uri) == expected(FR=[4])
    table = DeltaTable(table_uri)
    assert table.version() == 1  # removes and adds in one version: never both tables, never none
    assert len(adds(table_uri)) == 1
    old = DeltaTable(table_uri, version=0).to_pyarrow_table()
    assert old.num_rows == 3
    empty = stage(store, 3, {"__partition_country=FR/p.parquet": rows([], "FR")}, uri=table_uri, mode=snap)
    commit_sink(request(store, 3, empty))
    assert duckdb_rows(table_uri) == [] and DeltaTable(table_uri).version() == 2


def test_s3_options_of_the_store_become_delta_rs_storage_options(store: Storage) -> None:
    manifest = SinkManifest("o", "s3://b/t", "staging", [FileInfo("x.parquet", 1, 0)], 1,
                            table={"type": "delta", "path": "s3://b/t"})

    class S3Store:
        url = "s3://store-bucket/root"
        storage_options = {"key": "AK", "secret": "SK",
                           "client_kwargs": {"endpoint_url": "http://127.0.0.1:9", "region_name": "eu-west-1"}}

    s3_request = SinkCommit("orders", "s3://store-bucket", 1, manifest, S3Store(), 3)  # type: ignore[arg-type]
    fs, opts = delta_commit.storage_options(s3_request, "s3://b/t")
    assert fs == S3Store.storage_options
    assert opts == {"AWS_ACCESS_KEY_ID": "AK", "AWS_SECRET_ACCESS_KEY": "SK", "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
                    "AWS_REGION": "eu-west-1", "AWS_ALLOW_HTTP": "true"}
    fs, opts = delta_commit.storage_options(request(store, 1, manifest), "s3://b/t")  # a file store: nothing shared
    assert (fs, opts) == ({}, {})


@pytest.mark.s3
def test_an_epoch_commits_once_into_a_delta_table_on_s3(s3_spec: StoreSpec, moto_server: Any) -> None:
    store = s3_spec.storage("store")
    uri = s3_spec.sub_url("tables/orders")
    manifest = stage(store, 1, by_country(1, DE=[1, 2], FR=[3]), uri=uri)
    outcomes = at_once([lambda: commit_sink(request(store, 1, manifest))] * 2)

    assert sorted(o.how for o in outcomes) == ["already", "copied"], outcomes  # type: ignore[union-attr]
    options = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
               "AWS_ENDPOINT_URL": moto_server.endpoint_url, "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true"}
    assert deltalake_rows(uri, **options) == expected(DE=[1, 2], FR=[3])
    assert DeltaTable(uri, storage_options=options).version() == 0
    # Independent of delta-rs: the log's add paths are relative and the files hold the rows.
    fs = moto_server.filesystem()
    root = uri[len("s3://"):]
    logged = [json.loads(line)["add"]["path"] for line in fs.cat(f"{root}/_delta_log/00000000000000000000.json")
              .decode().splitlines() if '"add"' in line]
    assert sorted(logged) == [f"country={c}/{placed(store_id(store), 1, n)}" for n, c in enumerate(["DE", "FR"])]
    total = sum(pq.read_table(fs.open(f"{root}/{p}")).num_rows for p in logged)
    assert total == 3


def test_a_commit_killed_at_any_step_lands_the_epoch_exactly_once_when_resumed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Crash before every store write of the commit and before the Delta log commit itself."""
    plan = faults.install(monkeypatch)
    for name in ("_create", "_append"):  # the delta-rs log commit is a crash point too
        real = getattr(delta_commit, name)

        def before_log_commit(*args: Any, _real: Any = real, _name: str = name, **kwargs: Any) -> Any:
            plan.tick(f"delta {_name}")
            return _real(*args, **kwargs)

        monkeypatch.setattr(delta_commit, name, before_log_commit)

    def setup(n: int) -> tuple[StoreSpec, str, int]:
        spec = StoreSpec("file", f"file://{tmp_path}/w{n}")
        uri = f"{tmp_path}/w{n}/tables/orders"
        pipeline = spec.pipeline()
        for run, countries in (("run-1", {"FR": [9]}), ("run-2", {"DE": [1, 2], "FR": [3]})):
            epoch = pipeline.begin(run).epoch
            manifest = stage(pipeline.storage, epoch, by_country(epoch, **countries), uri=uri,
                             staging=pipeline.staging_path(epoch, 1, "orders"))
            pipeline.prepare(epoch, "ingest", 1, run_id=run, sinks=[manifest], operators={}, sources={},
                             base=pipeline.restore_point())
            pipeline.decide(epoch, Decision.COMMIT, "all prepared", by="test")
            if run == "run-1":
                pipeline.commit(epoch)
        return spec, uri, epoch

    def check(world: tuple[StoreSpec, str, int], crashed: bool) -> None:
        spec, uri, epoch = world
        assert spec.pipeline().commit(epoch).already_committed
        table = DeltaTable(uri)
        assert (table.version(), table.transaction_version(app_id(spec.pipeline().store_id()))) == (1, epoch)
        assert duckdb_rows(uri) == expected(DE=[1, 2], FR=[3, 9])
        assert len(logged_adds(uri)) == 3

    run = faults.crash_at_every_mutation(
        plan, setup, step=lambda w: w[0].pipeline().commit(w[2]), resume=lambda w: w[0].pipeline().commit(w[2]),
        check=check)
    assert any("delta _append" in c for c in run.crashed_at), run.crashed_at
    assert run.crash_points >= 3


def test_a_sink_partitioned_unlike_its_existing_table_is_refused(store: Storage, table_uri: str) -> None:
    commit_sink(request(store, 1, stage(store, 1, by_country(1, DE=[1]), uri=table_uri)))
    flat = stage(store, 2, {"p.parquet": rows([2], "DE")}, uri=table_uri, partition_by=())

    with pytest.raises(SinkRefusedError, match=r"the table is partitioned by \['country'\], the sink by \[\]"):
        commit_sink(request(store, 2, flat))
    assert DeltaTable(table_uri).version() == 0


def test_files_staged_in_another_store_are_copied_into_the_table(table_uri: str) -> None:
    store = StoreSpec("memory", f"memory://delta-{uuid.uuid4().hex}").storage("store")
    commit_sink(request(store, 1, stage(store, 1, by_country(1, DE=[1, 2]), uri=table_uri)))

    assert duckdb_rows(table_uri) == expected(DE=[1, 2])


@pytest.mark.s3
def test_credentials_of_a_table_on_another_protocol_come_from_the_secret_resolver(
        local_spec: StoreSpec, s3_bucket: str, moto_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_seatunnel_ckpt.core import sinks as tables
    from airflow_seatunnel_ckpt.core.sinks import base

    monkeypatch.setattr(base, "SECRET_RESOLVERS", [])
    store = local_spec.storage("store")  # a local store: none of its options may reach S3
    uri = f"{s3_bucket}/tables/orders"
    manifest = stage(store, 1, by_country(1, DE=[1]), uri=uri)
    assert "testing" not in json.dumps(manifest.to_dict())  # never in the prepared record

    tables.register_secret_resolver(lambda options: {"fs_options": moto_server.storage_options}
                                    if options.get("path") == uri else {})
    assert commit_sink(request(store, 1, manifest)).how == "copied"
    options = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
               "AWS_ENDPOINT_URL": moto_server.endpoint_url, "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true"}
    assert deltalake_rows(uri, **options) == expected(DE=[1])


def test_an_epoch_behind_the_tables_transaction_is_refused_not_skipped(store: Storage, table_uri: str) -> None:
    """A reset store (or another store's pipeline of the same name) must not lose its epochs as "already"."""
    commit_sink(request(store, 5, stage(store, 5, by_country(5, DE=[5]), uri=table_uri)))
    fresh = stage(store, 1, by_country(1, DE=[1]), uri=table_uri)

    with pytest.raises(TableOwnershipError, match=r"the table records epoch 5 of this pipeline's sink as committed "
                                                  r"by this store.*log of pipeline 'orders' has no commit decision "
                                                  r"for epoch 5.*Give this sink its own table"):
        commit_sink(request(store, 1, fresh))
    assert DeltaTable(table_uri).version() == 0


def test_a_table_with_column_mapping_is_refused_for_added_files(store: Storage, table_uri: str) -> None:
    DeltaTable.create(table_uri, SCHEMA, partition_by=["country"],
                      configuration={"delta.columnMapping.mode": "name"})

    with pytest.raises(SinkRefusedError, match=r"column mapping \(delta.columnMapping.mode=name\)"):
        commit_sink(request(store, 1, stage(store, 1, by_country(1, DE=[1]), uri=table_uri)))
    assert DeltaTable(table_uri).version() == 0


def test_a_retry_finds_its_epoch_after_a_checkpoint_and_log_cleanup(store: Storage, table_uri: str) -> None:
    """The application transaction is carried into Delta checkpoints, not only the JSON commits."""
    for epoch in (1, 2, 3):
        commit_sink(request(store, epoch, stage(store, epoch, by_country(epoch, DE=[epoch]), uri=table_uri)))
    DeltaTable(table_uri).create_checkpoint()
    for old in sorted(Path(table_uri, "_delta_log").glob("*.json"))[:-1]:
        old.unlink()  # what log cleanup does after the retention period

    again = commit_sink(request(store, 3, stage(store, 3, by_country(3, DE=[3]), uri=table_uri)))
    assert again.how == "already"
    assert duckdb_rows(table_uri) == expected(DE=[1, 2, 3])


def test_a_snapshot_sink_into_an_append_only_table_is_refused_at_once(store: Storage, table_uri: str) -> None:
    DeltaTable.create(table_uri, SCHEMA, partition_by=["country"], configuration={"delta.appendOnly": "true"})
    commit_sink(request(store, 1, stage(store, 1, by_country(1, DE=[1]), uri=table_uri)))
    manifest = stage(store, 2, by_country(2, DE=[2]), uri=table_uri, mode=SinkMode.SNAPSHOT)

    with pytest.raises(SinkRefusedError, match=r"append-only \(delta.appendOnly=true\)"):
        commit_sink(request(store, 2, manifest))
    assert DeltaTable(table_uri).version() == 1


# -- whose table it is: store ids, owners, placement names -------------------------------

def prepared_epoch(pipeline: Pipeline, run_id: str, uri: str, **countries: list[int]) -> tuple[int, SinkManifest]:
    """begin, stage and prepare one epoch of ``pipeline``'s sink ``orders`` into the table at ``uri``."""
    epoch = pipeline.begin(run_id).epoch
    manifest = stage(pipeline.storage, epoch, by_country(epoch, **countries), uri=uri,
                     staging=pipeline.staging_path(epoch, 1, "orders"))
    pipeline.prepare(epoch, "ingest", 1, run_id=run_id, sinks=[manifest], operators={}, sources={},
                     base=pipeline.restore_point())
    return epoch, manifest


def committed_epoch(pipeline: Pipeline, run_id: str, uri: str, **countries: list[int]) -> int:
    """A whole epoch: prepared, decided commit, committed."""
    epoch, _ = prepared_epoch(pipeline, run_id, uri, **countries)
    assert pipeline.decide(epoch, Decision.COMMIT, "all prepared", by="test").decision is Decision.COMMIT
    pipeline.commit(epoch)
    return epoch


def refused_at_the_decision(pipeline: Pipeline, run_id: str, uri: str, **countries: list[int]) -> str:
    """Prepare an epoch, ask for commit: it must be decided ABORT before anything reaches the table; the reason."""
    version = DeltaTable(uri).version()
    epoch, _ = prepared_epoch(pipeline, run_id, uri, **countries)
    record = pipeline.decide(epoch, Decision.COMMIT, "all prepared", by="test")
    assert record.decision is Decision.ABORT, "an ownership refusal must come before the commit decision"
    assert pipeline.state(epoch) is EpochState.ABORTED
    assert DeltaTable(uri).version() == version  # no table version, and no file of the epoch placed
    assert not list(Path(uri).rglob(f"{pipeline.name}/orders/{short(pipeline.store_id())}-e{epoch}-*"))
    return record.reason


def test_a_wiped_and_recreated_store_is_aborted_before_the_decision_naming_both_stores(
        tmp_path: Path, table_uri: str) -> None:
    spec = StoreSpec("file", f"file://{tmp_path}/home")
    for run in ("r1", "r2", "r3"):
        committed_epoch(spec.pipeline(), run, table_uri, DE=[int(run[1])])
    old = store_id(spec.storage("store"))
    shutil.rmtree(tmp_path / "home" / "store")  # an ephemeral AIRFLOW_HOME: same URL, epochs restart at 1

    pipeline = spec.pipeline()
    reason = refused_at_the_decision(pipeline, "r1", table_uri, DE=[101])  # it used to commit as "already"
    new = pipeline.store_id()
    assert new != old
    assert f"store {old} (file://{tmp_path}/home/store)" in reason
    assert f"store {new} (file://{tmp_path}/home/store)" in reason
    assert "was wiped and recreated" in reason and "delete its owner marker" in reason
    assert duckdb_rows(table_uri) == expected(DE=[1, 2, 3])

    Path(table_uri, OWNER_MARKER).unlink()  # the documented way out: the table is handed over
    committed_epoch(pipeline, "r2", table_uri, DE=[102])
    assert duckdb_rows(table_uri) == expected(DE=[1, 2, 3, 102])


def test_a_second_store_with_a_pipeline_of_the_same_name_is_aborted_before_the_decision_not_skipped(
        tmp_path: Path, table_uri: str) -> None:
    store_a, store_b = StoreSpec("file", f"file://{tmp_path}/a"), StoreSpec("file", f"file://{tmp_path}/b")
    committed_epoch(store_a.pipeline(), "r1", table_uri, DE=[1])
    b = store_b.pipeline()

    reason = refused_at_the_decision(b, "r1", table_uri, DE=[101])  # it used to be "already": B's epoch 1 lost
    assert store_a.pipeline().store_id() in reason and b.store_id() in reason
    assert f"file://{tmp_path}/a/store" in reason and f"file://{tmp_path}/b/store" in reason
    assert duckdb_rows(table_uri) == expected(DE=[1])
    committed_epoch(store_a.pipeline(), "r2", table_uri, DE=[2])  # the owner carries on
    assert duckdb_rows(table_uri) == expected(DE=[1, 2])
    own = str(Path(table_uri).with_name("orders_b"))  # the way out: a table of its own
    committed_epoch(b, "r2", own, DE=[102])
    assert duckdb_rows(own) == expected(DE=[102])


def test_a_second_pipeline_into_the_table_is_aborted_before_the_decision_until_the_owner_marker_is_removed(
        local_spec: StoreSpec, table_uri: str) -> None:
    committed_epoch(local_spec.pipeline("clicks"), "r1", table_uri, DE=[1, 2])
    backfill = local_spec.pipeline("clicks_backfill")

    reason = refused_at_the_decision(backfill, "b1", table_uri, DE=[1])
    assert re.search(r"belongs to pipeline 'clicks' of store .*not to pipeline 'clicks_backfill'.*"
                     r"delete its owner marker", reason), reason
    assert duckdb_rows(table_uri) == expected(DE=[1, 2])

    Path(table_uri, OWNER_MARKER).unlink()  # the documented way out: the table is handed over
    committed_epoch(backfill, "b2", table_uri, DE=[1])
    assert duckdb_rows(table_uri) == expected(DE=[1, 1, 2])
    assert "belongs to pipeline 'clicks_backfill'" in refused_at_the_decision(
        local_spec.pipeline("clicks"), "r2", table_uri, DE=[3])


def test_placement_names_of_pipelines_and_sinks_with_dashes_never_collide(store: Storage, table_uri: str) -> None:
    """Pipeline 'a' sink 'e1-x' and pipeline 'a-e1' sink 'x' used to share 'a-e1-e1-x-00000.parquet'."""
    first = stage(store, 1, by_country(1, DE=[1]), uri=table_uri, sink="e1-x")
    commit_sink(SinkCommit("a", "file:///store", 1, first, store, 3, store_id=store_id(store)))
    Path(table_uri, OWNER_MARKER).unlink(missing_ok=True)  # handed over to the other pipeline
    second = stage(store, 1, by_country(1, DE=[2, 3]), uri=table_uri, sink="x", staging="staging/other")
    commit_sink(SinkCommit("a-e1", "file:///store", 1, second, store, 3, store_id=store_id(store)))

    assert duckdb_rows(table_uri) == expected(DE=[1, 2, 3])
    assert len({a["path"] for a in adds(table_uri)}) == 2
