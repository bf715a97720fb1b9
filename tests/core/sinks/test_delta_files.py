"""What the Delta log says about each data file: partition values and statistics.

The values come from each file's Parquet footer (``core/sinks/delta_files.py``) and are
checked in the log as plain JSON and through both readers, deltalake and DuckDB.
"""

from __future__ import annotations

import json
import re

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from airflow_seatunnel_ckpt.core.errors import PublishError
from airflow_seatunnel_ckpt.core.sinks import commit_sink
from airflow_seatunnel_ckpt.core.storage import Storage
from tests.core.sinks.test_delta_sink import (
    deltalake_rows,
    duckdb_rows,
    logged_adds,
    request,
    rows,
    stage,
)
from tests.tables import duckdb_connection


def test_timestamp_and_date_statistics_bound_every_row(store: Storage, table_uri: str) -> None:
    import datetime as dt

    utc = pa.timestamp("us", tz="UTC")
    ts = [dt.datetime(2026, 1, 1, 0, 0, 0, 123456, tzinfo=dt.UTC),
          dt.datetime(2026, 1, 1, 0, 0, 1, 1500, tzinfo=dt.UTC)]
    data = pa.table({"id": [1, 2], "seen_at": pa.array(ts, utc),
                     "day": pa.array([dt.date(2026, 1, 1)] * 2)})
    manifest = stage(store, 1, {"__partition_day=2026-01-01/p.parquet": data}, uri=table_uri,
                     partition_by=("day",))
    commit_sink(request(store, 1, manifest))

    (add,) = logged_adds(table_uri)
    stats = json.loads(add["stats"])
    assert add["partitionValues"] == {"day": "2026-01-01"}
    assert stats["minValues"]["seen_at"] == "2026-01-01T00:00:00.123Z"
    assert stats["maxValues"]["seen_at"] == "2026-01-01T00:00:01.002Z"  # rounded up: bounds the row
    late = DeltaTable(table_uri).to_pyarrow_table(filters=[("seen_at", ">", pa.scalar(ts[1], utc))])
    assert late.num_rows == 0
    hit = DeltaTable(table_uri).to_pyarrow_table(filters=[("seen_at", ">=", pa.scalar(ts[1], utc))])
    assert hit.column("id").to_pylist() == [2]
    found = duckdb_connection("delta").execute(
        f"SELECT id FROM delta_scan('{table_uri}') WHERE seen_at >= ?", [ts[1]]).fetchall()
    assert found == [(2,)]  # DuckDB skips files on these bounds too


def test_a_file_holding_two_partition_values_is_refused_before_the_log_commit(
        store: Storage, table_uri: str) -> None:
    mixed = pa.concat_tables([rows([1], "DE"), rows([2], "FR")])
    manifest = stage(store, 1, {"__partition_country=DE/p.parquet": mixed}, uri=table_uri)

    with pytest.raises(PublishError, match=r"country=DE/orders/orders/[0-9a-f]+-e1-00000\.parquet does not hold "
                                           r"exactly one value of partition column 'country'"):
        commit_sink(request(store, 1, manifest))
    assert not DeltaTable.is_deltatable(table_uri)


def test_null_and_integer_partition_values_are_logged_in_delta_string_form(store: Storage, table_uri: str) -> None:
    data = {"__partition_year=2026/a.parquet": pa.table({"id": [1], "year": pa.array([2026], pa.int32())}),
            "__partition_year=__HIVE_DEFAULT_PARTITION__/b.parquet":
                pa.table({"id": [2], "year": pa.array([None], pa.int32())})}
    commit_sink(request(store, 1, stage(store, 1, data, uri=table_uri, partition_by=("year",))))

    logged = sorted((a["path"], a["partitionValues"]["year"]) for a in logged_adds(table_uri))
    assert [value for _, value in logged] == ["2026", None]
    assert re.fullmatch(r"year=2026/orders/orders/[0-9a-f]+-e1-00000\.parquet", logged[0][0])
    assert re.fullmatch(r"year=__HIVE_DEFAULT_PARTITION__/orders/orders/[0-9a-f]+-e1-00001\.parquet", logged[1][0])
    assert duckdb_rows(table_uri) == [(1, 2026), (2, None)]


def test_timestamp_date_boolean_and_float_partitions_read_back_exactly(store: Storage, table_uri: str) -> None:
    import datetime as dt

    at = dt.datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=dt.UTC)
    data = pa.table({"id": [1], "at": pa.array([at], pa.timestamp("us", tz="UTC")),
                     "day": pa.array([dt.date(2026, 1, 2)]), "flag": [True], "ratio": [1.5]})
    staged = "__partition_at=x/__partition_day=y/__partition_flag=true/__partition_ratio=1.5/p.parquet"
    manifest = stage(store, 1, {staged: data}, uri=table_uri, partition_by=("at", "day", "flag", "ratio"))
    commit_sink(request(store, 1, manifest))

    (add,) = logged_adds(table_uri)
    assert add["partitionValues"] == {"at": "2026-01-02T03:04:05.678901Z", "day": "2026-01-02", "flag": "true",
                                      "ratio": "1.5"}
    want = [(1, at, dt.date(2026, 1, 2), True, 1.5)]
    assert [(r[0], r[1].astimezone(dt.UTC), *r[2:]) for r in duckdb_rows(table_uri)] == want
    assert deltalake_rows(table_uri) == want
