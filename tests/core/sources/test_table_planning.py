"""Planning which data files an epoch reads from a table source, without Spark: real
pyiceberg tables (SQL catalog on SQLite) and real delta-rs tables, checked against DuckDB
reading the same tables with its own extensions."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_seatunnel_ckpt.core.sources import delta as delta_planning
from airflow_seatunnel_ckpt.core.sources import iceberg as iceberg_planning
from airflow_seatunnel_ckpt.core.sources import tables as planning
from airflow_seatunnel_ckpt.core.sources.iceberg import SnapshotStep
from airflow_seatunnel_ckpt.core.sources.tables import TableSourceError
from tests.tables import duckdb_connection

SCHEMA = pa.schema([pa.field("id", pa.int64()), pa.field("day", pa.string())])


def rows(ids: range | list[int], day: str = "mon") -> pa.Table:
    return pa.Table.from_pylist([{"id": i, "day": day} for i in ids], schema=SCHEMA)


def epochs(plan_one: Any, count: int, between: Any = None) -> Iterator[dict[str, Any]]:
    """Plan ``count`` epochs, each committed into the history the next one plans from."""
    history: list[dict[str, Any]] = []
    for epoch in range(1, count + 1):
        offsets = plan_one(history)
        history.append({"epoch": epoch, "offsets": offsets})
        yield offsets
        if between is not None and epoch < count:
            between(epoch)


def ids_in(files: list[dict[str, Any]]) -> list[int]:
    """The ids of the planned files, read with pyarrow (the partition column may be absent)."""
    out: list[int] = []
    for f in files:
        out += pq.read_table(f["path"].removeprefix("file://"), columns=["id"]).column("id").to_pylist()
    return out


# -- Iceberg ------------------------------------------------------------------------------------

@pytest.fixture
def iceberg(tmp_path: Path) -> Any:
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("test", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse=f"file://{tmp_path}/wh")
    catalog.create_namespace("bronze")
    return catalog.create_table("bronze.events", schema=SCHEMA)


def plan_iceberg(table: Any, history: list[dict[str, Any]], start: str = "earliest",
                 **skip: bool) -> dict[str, Any]:
    table.refresh()
    return iceberg_planning.plan_iceberg(table, history, start=start, skip=skip, where="iceberg source 'events'")


def test_iceberg_epochs_read_each_appended_row_exactly_once(iceberg: Any) -> None:
    iceberg.append(rows(range(0, 3)))
    iceberg.append(rows(range(3, 5)))
    appended = iter([range(5, 9), range(9, 10), range(10, 10)])

    def append(_: int) -> None:
        batch = next(appended)
        if len(batch):
            iceberg.append(rows(batch))

    planned = list(epochs(lambda h: plan_iceberg(iceberg, h), 4, append))
    assert [sorted(ids_in(p["files"])) for p in planned] == [
        list(range(0, 5)), list(range(5, 9)), [9], []]
    # Each plan starts where the previous one ended, and pins the snapshot it read up to.
    assert [p["after_snapshot_id"] for p in planned[1:]] == [p["snapshot_id"] for p in planned[:-1]]
    assert planned[3]["snapshot_id"] == planned[2]["snapshot_id"]
    con = duckdb_connection()
    everything = [r[0] for r in con.execute(
        f"SELECT id FROM iceberg_scan('{iceberg.metadata_location}') ORDER BY id").fetchall()]
    assert sorted(i for p in planned for i in ids_in(p["files"])) == everything == list(range(10))


def test_iceberg_start_latest_reads_only_rows_appended_after_the_first_epoch(iceberg: Any) -> None:
    iceberg.append(rows(range(0, 3)))
    planned = list(epochs(lambda h: plan_iceberg(iceberg, h, start="latest"), 2,
                          lambda _: iceberg.append(rows(range(3, 5)))))
    assert (planned[0]["files"], sorted(ids_in(planned[1]["files"]))) == ([], [3, 4])


def test_iceberg_table_without_snapshot_is_read_in_full_once_it_has_one(iceberg: Any) -> None:
    planned = list(epochs(lambda h: plan_iceberg(iceberg, h, start="latest"), 2,
                          lambda _: iceberg.append(rows(range(0, 2)))))
    assert planned[0] == {"snapshot_id": None, "after_snapshot_id": None, "files": [],
                          "table_id": str(iceberg.metadata.table_uuid)}
    assert sorted(ids_in(planned[1]["files"])) == [0, 1]


def test_iceberg_overwrite_between_epochs_is_refused_naming_the_snapshot(iceberg: Any) -> None:
    iceberg.append(rows(range(0, 3)))
    history = [{"epoch": 1, "offsets": plan_iceberg(iceberg, [])}]
    iceberg.delete("id = 1")  # rewrites the file holding it: an overwrite snapshot
    overwrite = iceberg.current_snapshot()
    assert overwrite.summary.operation.value == "overwrite"
    iceberg.append(rows(range(3, 4)))
    with pytest.raises(TableSourceError, match="appended rows only") as failure:
        plan_iceberg(iceberg, history)
    assert f"snapshot {overwrite.snapshot_id} ('overwrite')" in str(failure.value)
    assert "skip_overwrites=true" in str(failure.value)


def test_iceberg_skip_overwrites_passes_over_them_and_reads_later_appends(iceberg: Any) -> None:
    iceberg.append(rows(range(0, 3)))
    history = [{"epoch": 1, "offsets": plan_iceberg(iceberg, [])}]
    iceberg.delete("id = 1")
    iceberg.append(rows(range(3, 4)))
    assert sorted(ids_in(plan_iceberg(iceberg, history, overwrite=True)["files"])) == [3]


def test_iceberg_delete_between_epochs_is_refused(iceberg: Any) -> None:
    iceberg.append(rows(range(0, 3)))
    history = [{"epoch": 1, "offsets": plan_iceberg(iceberg, [])}]
    iceberg.delete("id >= 0")  # drops whole files: a delete snapshot
    assert iceberg.current_snapshot().summary.operation.value == "delete"
    with pytest.raises(TableSourceError, match="skip_deletes=true"):
        plan_iceberg(iceberg, history)


def test_iceberg_full_overwrite_is_refused_even_though_it_ends_in_an_append(iceberg: Any) -> None:
    iceberg.append(rows(range(0, 3)))
    history = [{"epoch": 1, "offsets": plan_iceberg(iceberg, [])}]
    iceberg.overwrite(rows(range(100, 102)))  # pyiceberg: a delete snapshot, then an append
    with pytest.raises(TableSourceError, match="appended rows only"):
        plan_iceberg(iceberg, history)


def test_iceberg_consumed_snapshot_that_is_no_ancestor_is_refused_not_reread(iceberg: Any) -> None:
    iceberg.append(rows(range(0, 3)))
    first = plan_iceberg(iceberg, [])
    iceberg.append(rows(range(3, 5)))
    # The table was rolled back to before what the last epoch consumed.
    consumed = {"epoch": 2, "offsets": plan_iceberg(iceberg, [{"epoch": 1, "offsets": first}])}
    iceberg.manage_snapshots().rollback_to_snapshot(first["snapshot_id"]).commit()
    iceberg.append(rows(range(5, 6)))
    with pytest.raises(TableSourceError, match="not an ancestor") as failure:
        plan_iceberg(iceberg, [{"epoch": 1, "offsets": first}, consumed])
    assert str(consumed["offsets"]["snapshot_id"]) in str(failure.value)


def test_iceberg_column_renamed_after_files_were_written_is_refused(iceberg: Any) -> None:
    iceberg.append(rows(range(0, 3)))
    history = [{"epoch": 1, "offsets": plan_iceberg(iceberg, [])}]
    iceberg.append(rows(range(3, 5)))  # written with the column still called 'day'
    with iceberg.update_schema() as update:
        update.rename_column("day", "weekday")
    with pytest.raises(TableSourceError, match="column 'day' was renamed to 'weekday'"):
        plan_iceberg(iceberg, history)
    with pytest.raises(TableSourceError, match="renamed"):
        plan_iceberg(iceberg, [])


def test_table_source_options_are_checked_when_the_dag_is_parsed() -> None:
    from airflow_seatunnel_ckpt.core.errors import ConfigError
    from airflow_seatunnel_ckpt.spark.declaration import EntryDeclaration

    with pytest.raises(ConfigError, match=r"unknown option 'tabel' \(did you mean 'table'\?\)"):
        EntryDeclaration.check("source", "events", {"type": "iceberg", "tabel": "a.b"}, where="dag d")
    with pytest.raises(ConfigError, match=r"option 'start': input should be 'earliest' or 'latest' \(found 'now'\)"):
        EntryDeclaration.check("source", "events", {"type": "delta", "path": "/t", "start": "now"}, where="dag d")
    with pytest.raises(ConfigError, match="option 'skip_change_commits': input should be a valid boolean"):
        EntryDeclaration.check("source", "events", {"type": "delta", "path": "/t", "skip_change_commits": "yes"},
                               where="dag d")


def test_iceberg_table_recreated_under_the_same_name_is_refused(iceberg: Any) -> None:
    iceberg.append(rows(range(0, 3)))
    history = [{"epoch": 1, "offsets": plan_iceberg(iceberg, [])}]
    iceberg.catalog.drop_table("bronze.events")
    again = iceberg.catalog.create_table("bronze.events", schema=SCHEMA)
    again.append(rows(range(10, 12)))
    with pytest.raises(TableSourceError, match="the table was re-created"):
        plan_iceberg(again, history)


def test_snapshot_walk_refuses_a_history_expired_past_the_consumed_snapshot() -> None:
    steps = {3: SnapshotStep(3, 2, "append")}  # 2 expired; 1 was consumed
    with pytest.raises(TableSourceError, match="snapshot 2,.* has expired"):
        iceberg_planning.snapshots_since(steps, 3, 1, "src")
    # The consumed snapshot itself may be expired when its child is still there.
    assert iceberg_planning.snapshots_since(steps, 3, 2, "src") == [steps[3]]


def test_snapshot_walk_passes_over_compactions() -> None:
    steps = [SnapshotStep(2, 1, "append"), SnapshotStep(3, 2, "replace"), SnapshotStep(4, 3, "append")]
    assert [s.snapshot_id for s in iceberg_planning.refuse_changes(steps, {}, "src")] == [2, 4]


# -- Delta --------------------------------------------------------------------------------------

@pytest.fixture
def delta(tmp_path: Path) -> str:
    return str(tmp_path / "events")


def write(uri: str, table: pa.Table, mode: str = "append") -> None:
    from deltalake import write_deltalake

    write_deltalake(uri, table, mode=mode, partition_by=["day"])  # type: ignore[arg-type]


def plan_delta(uri: str, history: list[dict[str, Any]], start: str = "earliest",
               skip_change_commits: bool = False) -> dict[str, Any]:
    return delta_planning.plan_delta(uri, {}, history, start=start, skip_change_commits=skip_change_commits,
                               where="delta source 'events'")


def test_delta_epochs_read_each_appended_row_exactly_once_with_partition_values(delta: str) -> None:
    write(delta, rows(range(0, 3), "mon"))
    write(delta, rows(range(3, 5), "tue"))
    appended = iter([(range(5, 8), "wed"), (range(8, 9), "mon")])
    planned = list(epochs(lambda h: plan_delta(delta, h), 3,
                          lambda _: write(delta, rows(*next(appended)))))
    assert [sorted(ids_in(p["files"])) for p in planned] == [list(range(0, 5)), [5, 6, 7], [8]]
    assert [p["version"] for p in planned] == [1, 2, 3]
    # The files omit the partition column: its value travels in the plan, as the log has it.
    assert {f["partition"]["day"] for f in planned[0]["files"]} == {"mon", "tue"}
    assert "day" not in pq.read_schema(planned[1]["files"][0]["path"].removeprefix("file://")).names
    everything = sorted(r[0] for r in duckdb_connection().execute(
        f"SELECT id FROM delta_scan('{delta}')").fetchall())
    assert sorted(i for p in planned for i in ids_in(p["files"])) == everything == list(range(9))


def test_delta_delete_between_epochs_is_refused_naming_the_version(delta: str) -> None:
    from deltalake import DeltaTable

    write(delta, rows(range(0, 3)))
    history = [{"epoch": 1, "offsets": plan_delta(delta, [])}]
    DeltaTable(delta).delete("id = 1")
    write(delta, rows(range(3, 4)))
    with pytest.raises(TableSourceError, match=r"version 1 \(DELETE\) removed 1 data file") as failure:
        plan_delta(delta, history)
    assert "skip_change_commits=true" in str(failure.value)
    skipped = plan_delta(delta, history, skip_change_commits=True)
    assert (skipped["version"], sorted(ids_in(skipped["files"]))) == (2, [3])


def test_delta_compaction_is_not_read_again(delta: str) -> None:
    from deltalake import DeltaTable

    write(delta, rows(range(0, 2)))
    write(delta, rows(range(2, 4)))
    history = [{"epoch": 1, "offsets": plan_delta(delta, [])}]
    DeltaTable(delta).optimize.compact()
    write(delta, rows(range(4, 5)))
    assert sorted(ids_in(plan_delta(delta, history)["files"])) == [4]


def test_delta_start_latest_reads_only_later_versions(delta: str) -> None:
    write(delta, rows(range(0, 3)))
    planned = list(epochs(lambda h: plan_delta(delta, h, start="latest"), 2,
                          lambda _: write(delta, rows(range(3, 4)))))
    assert (planned[0]["files"], sorted(ids_in(planned[1]["files"]))) == ([], [3])


def test_delta_commit_removed_by_log_retention_is_refused_not_skipped(delta: str) -> None:
    from deltalake import DeltaTable

    write(delta, rows(range(0, 1)))
    history = [{"epoch": 1, "offsets": plan_delta(delta, [])}]
    write(delta, rows(range(1, 2)))
    write(delta, rows(range(2, 3)))
    DeltaTable(delta).create_checkpoint()
    os.remove(os.path.join(delta, delta_planning.delta_log_entry(1)))
    with pytest.raises(TableSourceError, match="commit of version 1 .* is gone"):
        plan_delta(delta, history)


def test_delta_table_recreated_under_the_same_path_is_refused(delta: str) -> None:
    write(delta, rows(range(0, 3)))
    write(delta, rows(range(3, 4)))
    history = [{"epoch": 1, "offsets": plan_delta(delta, [])}]
    shutil.rmtree(delta)
    for batch in (range(10, 11), range(11, 12), range(12, 13)):  # a new table, past the consumed version
        write(delta, rows(batch))
    with pytest.raises(TableSourceError, match="the table was re-created"):
        plan_delta(delta, history)


def test_delta_log_lines_are_parsed_as_json_only() -> None:
    with pytest.raises(TableSourceError, match="line 2 is not JSON"):
        delta_planning.parse_delta_commit(4, '{"commitInfo": {}}\n__import__("os")\n', "file:///t", "src")


def test_missing_delta_table_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(TableSourceError, match="is not a Delta table"):
        plan_delta(str(tmp_path / "nothing"), [])


# -- another pipeline's published epochs ----------------------------------------------------------

def listing(*paths: str) -> dict[str, Any]:
    return {p: {"size": 1} for p in paths}


def test_published_epochs_plan_only_complete_epochs_not_consumed() -> None:
    found = listing("_seatunnel_ckpt_owner",
                    "epoch=1/part-0.parquet", "epoch=1/_SUCCESS",
                    "epoch=2/part-0.parquet", "epoch=2/part-1.parquet", "epoch=2/_SUCCESS",
                    "epoch=3/part-0.parquet")  # epoch 3 is still being published: no _SUCCESS
    first = planning.plan_published_epochs(found, [], "src")
    assert (first["epochs"], first["files"]) == ([1, 2], ["epoch=1/part-0.parquet", "epoch=2/part-0.parquet",
                                                          "epoch=2/part-1.parquet"])
    found.update(listing("epoch=3/_SUCCESS", "epoch=4/day=mon/part-0.parquet", "epoch=4/_SUCCESS"))
    second = planning.plan_published_epochs(found, [{"epoch": 1, "offsets": first}], "src")
    assert (second["epochs"], second["files"]) == ([3, 4], ["epoch=3/part-0.parquet",
                                                            "epoch=4/day=mon/part-0.parquet"])


def test_published_epoch_completed_late_is_still_read_once() -> None:
    found = listing("epoch=1/a.parquet", "epoch=2/a.parquet", "epoch=2/_SUCCESS")
    history = [{"epoch": 1, "offsets": planning.plan_published_epochs(found, [], "src")}]
    found.update(listing("epoch=1/_SUCCESS"))
    assert planning.plan_published_epochs(found, history, "src")["epochs"] == [1]


def test_snapshot_mode_target_is_refused() -> None:
    with pytest.raises(TableSourceError, match="snapshot-mode sink"):
        planning.plan_published_epochs(listing("_LATEST", "epoch=2/a.parquet", "epoch=2/_SUCCESS"), [], "src")


def test_malformed_committed_positions_are_named() -> None:
    with pytest.raises(TableSourceError, match="epoch 7 hold snapshot_id='12'"):
        planning.consumed_position([{"epoch": 7, "offsets": {"snapshot_id": "12"}}], "snapshot_id", "src")


# -- on an S3-compatible server -------------------------------------------------------------------

@pytest.mark.s3
def test_delta_epochs_on_s3_read_the_log_through_delta_rs_storage_options(moto_server: Any, s3_bucket: str) -> None:
    from deltalake import write_deltalake

    uri = f"{s3_bucket}/bronze/events"
    options = {"AWS_ENDPOINT_URL": moto_server.endpoint_url, "AWS_ALLOW_HTTP": "true", "AWS_REGION": "us-east-1",
               "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}

    def plan(history: list[dict[str, Any]]) -> dict[str, Any]:
        return delta_planning.plan_delta(uri, options, history, start="earliest", skip_change_commits=False,
                                         where="src")

    write_deltalake(uri, rows(range(0, 2)), partition_by=["day"], storage_options=options)
    first = plan([])
    write_deltalake(uri, rows(range(2, 5), "tue"), mode="append", partition_by=["day"], storage_options=options)
    second = plan([{"epoch": 1, "offsets": first}])
    assert (second["after_version"], second["version"]) == (0, 1)
    fs = moto_server.filesystem()
    ids = [pq.read_table(fs.open(f["path"]), columns=["id"]).column("id").to_pylist()
           for p in (first, second) for f in p["files"]]
    assert sorted(i for batch in ids for i in batch) == list(range(5))
    assert [f["partition"] for f in second["files"]] == [{"day": "tue"}]


@pytest.mark.s3
def test_pipeline_output_on_s3_plans_only_epochs_with_their_success_mark(moto_server: Any, s3_bucket: str) -> None:
    from airflow_seatunnel_ckpt.spark.sources.tables import PipelineOutputSource

    fs = moto_server.filesystem()
    fs.pipe({f"{s3_bucket}/out/epoch=1/part-0.parquet": b"x", f"{s3_bucket}/out/epoch=1/_SUCCESS": b"{}",
             f"{s3_bucket}/out/epoch=2/part-0.parquet": b"y"})
    source = PipelineOutputSource("upstream", f"{s3_bucket}/out", storage_options=moto_server.storage_options)
    planned = source.plan([])
    assert (planned["epochs"], planned["files"]) == ([1], ["epoch=1/part-0.parquet"])
    assert planned["identity"]["epoch=1/part-0.parquet"]["size"] == 1
    fs.pipe_file(f"{s3_bucket}/out/epoch=2/_SUCCESS", b"{}")
    assert source.plan([{"epoch": 1, "offsets": planned}])["epochs"] == [2]
