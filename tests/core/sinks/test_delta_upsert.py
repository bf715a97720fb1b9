"""Upserts into a Delta table: one row per key, the newest epoch's values, each epoch once.

Read back with DuckDB's ``delta_scan`` and with deltalake; the Delta log itself is read as
plain JSON to prove that the merged rows and the epoch's application transaction are one
table version.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from airflow_seatunnel_ckpt.core.errors import SinkRefusedError
from airflow_seatunnel_ckpt.core.models import SinkManifest, SinkMode
from airflow_seatunnel_ckpt.core.sinks import commit_sink
from airflow_seatunnel_ckpt.core.sinks.base import store_id
from airflow_seatunnel_ckpt.core.storage import Storage
from tests.core.epochs import at_once
from tests.core.sinks.test_delta_sink import app_id, request, stage
from tests.tables import duckdb_delta_rows

TOTALS = pa.schema([("customer", pa.string()), ("total", pa.float64())])


def totals(**by_customer: float) -> dict[str, pa.Table]:
    return {"part-00000.parquet": pa.table({"customer": list(by_customer), "total": list(by_customer.values())},
                                           schema=TOTALS)}


def upsert(store: Storage, epoch: int, uri: str, files: dict[str, pa.Table]) -> SinkManifest:
    manifest = stage(store, epoch, files, uri=uri, sink="totals", partition_by=())
    return SinkManifest(manifest.sink, manifest.target_url, manifest.staging, manifest.files, manifest.rows,
                        table={**manifest.table.to_dict(), "mode": "upsert", "merge_keys": ["customer"]})


def table_rows(uri: str) -> list[tuple[Any, ...]]:
    rows = sorted(duckdb_rows_by(uri, "customer"))
    assert rows == sorted(tuple(r.values()) for r in DeltaTable(uri).to_pyarrow_table().to_pylist())
    return rows


def duckdb_rows_by(uri: str, column: str) -> list[tuple[Any, ...]]:
    return duckdb_delta_rows(uri, order_by=column)


@pytest.fixture
def uri(tmp_path: Path) -> str:
    return str(tmp_path / "tables" / "totals")


def test_upserted_epochs_leave_one_row_per_key_with_the_newest_values(store: Storage, uri: str) -> None:
    commit_sink(request(store, 1, upsert(store, 1, uri, totals(c0=10.0, c1=20.0))))
    merged = commit_sink(request(store, 2, upsert(store, 2, uri, totals(c1=25.0, c2=30.0))))

    assert merged.how == "merged"
    assert table_rows(uri) == [("c0", 10.0), ("c1", 25.0), ("c2", 30.0)]
    table = DeltaTable(uri)
    assert (table.version(), table.transaction_version(app_id(store_id(store), "totals"))) == (1, 2)
    # The merge's rows and the epoch's transaction are one version of the log.
    actions = [json.loads(line) for line in Path(uri, "_delta_log", "00000000000000000001.json").read_text()
               .splitlines()]
    kinds = {next(iter(a)) for a in actions}
    assert {"txn", "add", "remove"} <= kinds
    assert [a["txn"] for a in actions if "txn" in a][0]["version"] == 2


def test_a_retried_upsert_finds_the_epoch_and_merges_nothing(store: Storage, uri: str) -> None:
    commit_sink(request(store, 1, upsert(store, 1, uri, totals(c0=10.0))))
    manifest = upsert(store, 2, uri, totals(c0=11.0))
    commit_sink(request(store, 2, manifest))

    assert commit_sink(request(store, 2, manifest)).how == "already"
    assert DeltaTable(uri).version() == 1
    assert table_rows(uri) == [("c0", 11.0)]


def test_two_committers_racing_one_upsert_epoch_merge_it_once(store: Storage, uri: str) -> None:
    commit_sink(request(store, 1, upsert(store, 1, uri, totals(c0=10.0))))
    manifest = upsert(store, 2, uri, totals(c0=11.0, c1=1.0))
    outcomes = at_once([lambda: commit_sink(request(store, 2, manifest))] * 2)

    assert sorted(o.how for o in outcomes) == ["already", "merged"], outcomes  # type: ignore[union-attr]
    assert DeltaTable(uri).version() == 1
    assert table_rows(uri) == [("c0", 11.0), ("c1", 1.0)]


@pytest.mark.parametrize("epoch", [1, 2], ids=["creating", "merging"])
def test_an_epoch_repeating_a_key_is_refused_before_anything_is_committed(
        store: Storage, uri: str, epoch: int) -> None:
    if epoch == 2:
        commit_sink(request(store, 1, upsert(store, 1, uri, totals(c0=1.0))))
    twice = {"a.parquet": totals(c9=1.0)["part-00000.parquet"], "b.parquet": totals(c9=2.0)["part-00000.parquet"]}

    with pytest.raises(SinkRefusedError, match=r"1 key\(s\) appear more than once .*\{'customer': 'c9'\}"):
        commit_sink(request(store, epoch, upsert(store, epoch, uri, twice)))
    assert DeltaTable.is_deltatable(uri) is (epoch == 2)
    if epoch == 2:
        assert DeltaTable(uri).version() == 0


def test_a_null_merge_key_is_refused(store: Storage, uri: str) -> None:
    commit_sink(request(store, 1, upsert(store, 1, uri, totals(c0=1.0))))
    nulls = {"a.parquet": pa.table({"customer": [None], "total": [1.0]}, schema=TOTALS)}

    with pytest.raises(SinkRefusedError, match=r"merge key column 'customer' is NULL in 1 row\(s\)"):
        commit_sink(request(store, 2, upsert(store, 2, uri, nulls)))
    assert DeltaTable(uri).version() == 0


def test_merge_keys_on_a_snapshot_sink_are_refused(store: Storage, uri: str) -> None:
    manifest = upsert(store, 1, uri, totals(c0=1.0))
    with pytest.raises(ValueError, match=r"mode 'snapshot' and its options' mode 'upsert' disagree"):
        SinkManifest(manifest.sink, manifest.target_url, manifest.staging, manifest.files, manifest.rows,
                     mode=SinkMode.SNAPSHOT, table=manifest.table)
    with pytest.raises(ValueError, match=r"merge_keys \['customer'\] with mode 'snapshot'"):
        SinkManifest(manifest.sink, manifest.target_url, manifest.staging, manifest.files, manifest.rows,
                     mode=SinkMode.SNAPSHOT, table={**manifest.table.to_dict(), "mode": "snapshot"})
    assert not DeltaTable.is_deltatable(uri)
