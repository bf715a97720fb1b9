"""Ordinary input mistakes get a clear error (or a declared way around them), never
silently lost, duplicated or NULL rows: missing directories, files changed after an epoch
consumed them, malformed csv/json records, null keys."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from airflow_seatunnel_ckpt.spark import StageSpec, run_stage
from airflow_seatunnel_ckpt.spark.sources.files import FileSource, SourceError
from airflow_seatunnel_ckpt.spark.state import StateError
from tests.spark.conftest import OrdersPipeline, RunStage

pytestmark = [pytest.mark.spark]

SCHEMA = "order_id long, customer string, amount double"
TOTALS = "tests.spark.stages:dedup_and_totals"


def write_text(orders: OrdersPipeline, name: str, text: str) -> Path:
    """Deliver a csv/json input file (atomically, like a well-behaved uploader)."""
    orders.input_dir.mkdir(parents=True, exist_ok=True)
    tmp = orders.input_dir / f".{name}.tmp"
    tmp.write_text(text)
    final = orders.input_dir / name
    tmp.rename(final)
    return final


def text_spec(orders: OrdersPipeline, run_id: str, fmt: str, stage: str = TOTALS,
              **source: Any) -> StageSpec:
    """A stage over csv/json input with a declared schema (and ``source`` options)."""
    options = {"header": "true"} if fmt == "csv" else {}
    src = {"type": "file", "path": f"file://{orders.input_dir}", "format": fmt,
           "schema": SCHEMA, "options": options, **source}
    return orders.spec(run_id, stage=stage, sources={"orders": src})


def published_json(root: Path) -> list[dict[str, Any]]:
    rows = []
    for f in sorted(root.glob("epoch=*/*.json")):
        rows += [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    return rows


# -- a source directory that does not exist --------------------------------------------------

def test_missing_source_directory_fails_the_epoch_naming_the_path(
    spark: Any, orders: OrdersPipeline
) -> None:
    spec = orders.spec("run-1")  # orders.input_dir was never created: a mistyped path
    with pytest.raises(SourceError, match="does not exist") as failure:
        run_stage(spec, spark)
    assert str(orders.input_dir) in str(failure.value)
    assert "allow_missing=True" in str(failure.value) and "epoch 1" in str(failure.value)
    assert orders.published() == []


def test_allow_missing_plans_empty_epochs_until_the_directory_appears(
    spark: Any, orders: OrdersPipeline, published_ids: Callable[[], list[int]]
) -> None:
    def spec(run_id: str) -> StageSpec:
        return orders.spec(run_id, sources={"orders": {
            "type": "file", "path": f"file://{orders.input_dir}", "schema": SCHEMA,
            "allow_missing": True}})

    quiet = run_stage(spec("run-1"), spark)
    assert (quiet.rows, quiet.sources["orders"]["files"]) == (0, [])
    orders.commit(quiet)
    orders.add_file("a", [1, 2])
    orders.commit(run_stage(spec("run-2"), spark))
    assert published_ids() == [1, 2]


# -- a consumed file re-uploaded under the same name -------------------------------------

def test_consumed_file_rewritten_with_new_content_is_an_error_naming_it(
    spark: Any, orders: OrdersPipeline, published_ids: Callable[[], list[int]]
) -> None:
    orders.add_file("a", [1, 2])
    first = run_stage(orders.spec("run-1"), spark)
    assert first.sources["orders"]["identity"]["a.parquet"]["size"] > 0
    orders.commit(first)
    path = orders.add_file("a", [1, 2, 3, 4])  # same name, new rows
    os.utime(path, (1_900_000_000, 1_900_000_000))
    with pytest.raises(SourceError, match="changed after an epoch consumed them") as failure:
        run_stage(orders.spec("run-2"), spark)
    assert f"{orders.input_dir}/a.parquet" in str(failure.value)
    assert "on_change='reread'" in str(failure.value) and "epoch 2" in str(failure.value)
    assert published_ids() == [1, 2]


def test_a_retry_that_finds_a_pinned_file_rewritten_fails_naming_it_instead_of_reading_the_new_rows(
    spark: Any, orders: OrdersPipeline, published_ids: Callable[[], list[int]]
) -> None:
    orders.add_file("a", [1, 2])
    with pytest.raises(RuntimeError):  # attempt 1 pins a.parquet as it is now, then dies
        run_stage(orders.spec("run-1", stage="tests.spark.stages:fail_after_staging"), spark)
    path = orders.add_file("a", [1, 2, 3, 4])  # same name, new rows, before the retry reads it
    os.utime(path, (1_900_000_000, 1_900_000_000))
    with pytest.raises(SourceError, match="changed since the epoch pinned it") as failure:
        run_stage(orders.spec("run-1", attempt=2), spark)
    assert f"{orders.input_dir}/a.parquet" in str(failure.value) and "epoch 1" in str(failure.value)
    assert "abort" in str(failure.value)  # the way out: the next epoch plans the file as it is now
    assert published_ids() == []


def test_on_change_reread_reads_a_changed_file_again(
    spark: Any, orders: OrdersPipeline, published_ids: Callable[[], list[int]]
) -> None:
    def spec(run_id: str) -> StageSpec:
        return orders.spec(run_id, sources={"orders": {
            "type": "file", "path": f"file://{orders.input_dir}", "on_change": "reread"}})

    orders.add_file("a", [1, 2])
    orders.commit(run_stage(spec("run-1"), spark))
    path = orders.add_file("a", [1, 2, 3, 4])
    os.utime(path, (1_900_000_000, 1_900_000_000))
    again = run_stage(spec("run-2"), spark)
    assert again.sources["orders"]["files"] == ["a.parquet"]
    orders.commit(again)
    third = run_stage(spec("run-3"), spark)  # unchanged since epoch 2: nothing to read
    assert third.sources["orders"]["files"] == []
    assert published_ids() == [1, 2, 3, 4]  # the key set drops the rows seen before


def test_name_only_offsets_of_older_epochs_mean_consumed_and_unchanged(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_text("x\n1\n")
    (tmp_path / "b.csv").write_text("x\n2\n")
    source = FileSource("orders", f"file://{tmp_path}", format="csv")
    plan = source.plan([{"epoch": 1, "offsets": {"files": ["a.csv"]}}])
    assert plan["files"] == ["b.csv"]
    assert set(plan["identity"]) == {"b.csv"}


# -- malformed records -----------------------------------------------------------------------

def test_unparseable_csv_value_fails_the_epoch_naming_file_and_line(
    spark: Any, orders: OrdersPipeline
) -> None:
    write_text(orders, "a.csv", "order_id,customer,amount\n1,c1,1.5\n2,c2,abc\n")
    with pytest.raises(SourceError) as failure:
        run_stage(text_spec(orders, "run-1", "csv"), spark)
    message = str(failure.value)
    assert f"{orders.input_dir}/a.csv line 3" in message and "'2,c2,abc'" in message
    assert "epoch 1" in message and "bad_records" in message
    assert orders.published() == [] and orders.published("totals") == []


def test_extra_csv_column_fails_instead_of_being_dropped(
    spark: Any, orders: OrdersPipeline
) -> None:
    write_text(orders, "a.csv", "order_id,customer,amount\n1,c1,1.5,surprise\n2,c2,2.0\n")
    with pytest.raises(SourceError, match=r"a\.csv line 2: '1,c1,1\.5,surprise'"):
        run_stage(text_spec(orders, "run-1", "csv"), spark)


def test_a_schema_that_is_not_a_list_of_columns_is_an_error_naming_it(
    spark: Any, orders: OrdersPipeline
) -> None:
    write_text(orders, "a.json", '{"order_id": 1, "customer": "c1", "amount": 1.0}\n')
    with pytest.raises(SourceError, match=r"schema 'bigint' is not a list of columns"):
        run_stage(text_spec(orders, "run-1", "json", schema="bigint"), spark)


def test_broken_json_line_fails_naming_file_and_line_not_a_null_key(
    spark: Any, orders: OrdersPipeline
) -> None:
    write_text(orders, "b.json", '{"order_id": 1, "customer": "c1", "amount": 1.0}\n'
                                 '{"order_id": 2, "customer": "c2", \n')
    with pytest.raises(SourceError, match=r"b\.json line 2"):
        run_stage(text_spec(orders, "run-1", "json"), spark)


def test_bad_records_go_to_a_quarantine_sink_published_with_the_epoch(
    run: RunStage, orders: OrdersPipeline, published_ids: Callable[[], list[int]]
) -> None:
    quarantine = orders.root / "out" / "quarantine"
    write_text(orders, "a.csv", "order_id,customer,amount\n1,c1,1.5\n2,c2,abc\n3,c0,3.0,x\n")
    csv = run(text_spec(orders, "run-1", "csv", bad_records=f"file://{quarantine}"))
    assert {m.sink: m.rows for m in csv.manifests}["orders.bad_records"] == 2
    orders.commit(csv)
    assert published_ids() == [1]
    rows = published_json(quarantine)
    assert sorted(r["record"] for r in rows) == ["2,c2,abc", "3,c0,3.0,x"]
    assert all(r["source"] == "orders" and r["file"].endswith("/a.csv") for r in rows)
    assert (quarantine / "epoch=1" / "_SUCCESS").exists()


def test_bad_records_needs_a_text_format() -> None:
    from airflow_seatunnel_ckpt.core.errors import ConfigError

    with pytest.raises(ConfigError, match="bad_records applies to"):
        FileSource("orders", "file:///in", format="parquet", bad_records="file:///q")


def test_a_quarantined_record_reaches_no_sink_and_no_keyed_state_when_the_stage_skips_its_bad_column(
    spark: Any, orders: OrdersPipeline
) -> None:
    # The stage never uses 'amount': Spark then parsed 'customer' only, and the record
    # whose amount does not parse was quarantined and counted in the state as well.
    quarantine = orders.root / "out" / "quarantine"

    def epoch(n: int) -> None:
        spec = text_spec(orders, f"run-{n}", "json", stage="tests.spark.stages:count_per_customer",
                         bad_records=f"file://{quarantine}")
        result = run_stage(spec, spark)
        assert result.epoch == n
        orders.commit(result)

    write_text(orders, "a.json", '{"order_id": 1, "customer": "c1", "amount": 1.0}\n'
                                 '{"order_id": 2, "customer": "c1", "amount": "yesterday"}\n')
    epoch(1)
    write_text(orders, "b.json", '{"order_id": 3, "customer": "c1", "amount": 3.0}\n'
                                 '{"order_id": 4, "customer": "c1", "amount": "today"}\n')
    epoch(2)
    assert sorted(r["order_id"] for r in orders.published()) == [1, 3]
    assert [r["orders"] for r in orders.published("totals")] == [1, 2]  # c1 after epoch 1, then 2
    assert sorted(json.loads(r["record"])["order_id"] for r in published_json(quarantine)) == [2, 4]


# -- null keys in keyed state ------------------------------------------------------------

@pytest.mark.connect_slice("an error raised in the server's tasks reaches the client with the input file named")
def test_null_key_error_names_the_input_file_that_has_it(
    run: RunStage, orders: OrdersPipeline
) -> None:
    write_text(orders, "good.json", '{"order_id": 1, "customer": "c1", "amount": 1.0}\n')
    write_text(orders, "nocustomer.json", '{"order_id": 2, "amount": 2.0}\n')
    with pytest.raises(StateError) as failure:
        run(text_spec(orders, "run-1", "json"))
    message = str(failure.value)
    assert "key column 'customer' holds nulls" in message
    assert f"{orders.input_dir}/nocustomer.json" in message and "good.json" not in message
    assert "epoch 1" in message


def test_a_key_set_refuses_null_keys_naming_the_input_file_instead_of_folding_them(
    spark: Any, orders: OrdersPipeline
) -> None:
    # Two orders without an id: a key set used to fold them into one key, so one was
    # silently dropped from the output.
    write_text(orders, "good.json", '{"order_id": 1, "customer": "c1", "amount": 1.0}\n')
    write_text(orders, "noid.json", '{"customer": "c2", "amount": 2.0}\n{"customer": "c3", "amount": 3.0}\n')
    with pytest.raises(StateError) as failure:
        run_stage(text_spec(orders, "run-1", "json", stage="tests.spark.stages:dedup_orders"), spark)
    message = str(failure.value)
    assert "keyed state 'seen_orders': key column 'order_id' holds nulls" in message
    assert f"{orders.input_dir}/noid.json" in message and "good.json" not in message
    assert orders.pipeline.state(1).value == "OPEN"  # nothing prepared


def test_a_bad_file_blocks_nothing_once_its_epoch_is_aborted_and_the_fix_delivered(
    spark: Any, orders: OrdersPipeline, published_ids: Callable[[], list[int]]
) -> None:
    bad = write_text(orders, "a.csv", "order_id,customer,amount\n1,c1,1.5\n2,c2,abc\n")
    with pytest.raises(SourceError, match=r"a\.csv line 3"):
        run_stage(text_spec(orders, "run-1", "csv"), spark)
    orders.pipeline.abort(1, "malformed input")  # what the DAG's abort task does
    bad.unlink()
    write_text(orders, "a-fixed.csv", "order_id,customer,amount\n1,c1,1.5\n2,c2,2.0\n")
    fixed = run_stage(text_spec(orders, "run-2", "csv"), spark)
    assert fixed.sources["orders"]["files"] == ["a-fixed.csv"]
    orders.commit(fixed)
    assert published_ids() == [1, 2]


def test_broken_json_lines_are_quarantined_with_their_file(
    spark: Any, orders: OrdersPipeline, published_ids: Callable[[], list[int]]
) -> None:
    quarantine = orders.root / "out" / "quarantine"
    write_text(orders, "b.json", '{"order_id": 1, "customer": "c1", "amount": 1.0}\n'
                                 '{"order_id": 2, "customer": \n'
                                 '{"order_id": 3, "customer": "c0", "amount": "three"}\n')
    result = run_stage(text_spec(orders, "run-1", "json", bad_records=f"file://{quarantine}"),
                       spark)
    orders.commit(result)
    assert published_ids() == [1]
    rows = published_json(quarantine)
    assert sorted(r["record"] for r in rows) == [
        '{"order_id": 2, "customer": ', '{"order_id": 3, "customer": "c0", "amount": "three"}']
    assert all(r["file"].endswith("/b.json") for r in rows)


# -- bounded planning: prefixes, the time watermark, the consumed-file index --------------

def deliver(root: Path, name: str, mtime: float) -> None:
    """A small csv input file at ``root/name`` modified at ``mtime``."""
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("x\n1\n")
    os.utime(path, (mtime, mtime))


def test_prefixes_list_only_their_subdirectories_and_name_files_from_path(tmp_path: Path) -> None:
    for name in ("dt=2026-11-22/a.csv", "dt=2026-11-23/b.csv", "other/c.csv"):
        deliver(tmp_path, name, 1_000.0)
    day = FileSource("orders", f"file://{tmp_path}", format="csv", prefixes=["dt=2026-11-23/"])
    assert day.plan([])["files"] == ["dt=2026-11-23/b.csv"]
    # Names stay relative to 'path': what an earlier run consumed is known whatever it listed.
    assert day.plan([{"epoch": 1, "offsets": {"files": ["dt=2026-11-23/b.csv"]}}])["files"] == []
    glob = FileSource("orders", f"file://{tmp_path}", format="csv", prefixes=["dt=*/"])
    assert glob.plan([])["files"] == ["dt=2026-11-22/a.csv", "dt=2026-11-23/b.csv"]
    # A partition that does not exist yet is an empty epoch, not an error.
    assert FileSource("orders", f"file://{tmp_path}", format="csv",
                      prefixes=["dt=2026-11-24/"]).plan([])["files"] == []


def test_max_files_per_epoch_takes_the_oldest_names_inside_the_prefixes(tmp_path: Path) -> None:
    for hour in (3, 1, 2):
        deliver(tmp_path, f"dt=1/hour={hour}/part.csv", 1_000.0)
    deliver(tmp_path, "dt=0/hour=0/part.csv", 1_000.0)
    source = FileSource("orders", f"file://{tmp_path}", format="csv", prefixes=["dt=1/hour=*/"],
                        max_files_per_epoch=2)
    assert source.plan([])["files"] == ["dt=1/hour=1/part.csv", "dt=1/hour=2/part.csv"]


def test_max_file_age_ignores_files_older_than_the_newest_consumed_file_minus_the_age(tmp_path: Path) -> None:
    day = 86_400.0
    deliver(tmp_path, "consumed.csv", 10 * day)
    deliver(tmp_path, "late-but-old.csv", 8 * day)  # never consumed, two days older
    deliver(tmp_path, "late-recent.csv", 9.5 * day)
    history = [{"epoch": 1, "offsets": {"files": ["consumed.csv"],
                                        "identity": {"consumed.csv": {"size": 4, "mtime": 10 * day}}}}]
    windowed = FileSource("orders", f"file://{tmp_path}", format="csv", max_file_age="1d")
    plan = windowed.plan(history)
    assert plan["files"] == ["late-recent.csv"]
    assert plan["consumed_index"] == {"max_file_age": day}
    unbounded = FileSource("orders", f"file://{tmp_path}", format="csv")
    assert unbounded.plan(history)["files"] == ["late-but-old.csv", "late-recent.csv"]


@pytest.mark.parametrize(("option", "value", "says"), [
    ("prefixes", "dt=1/", "should be a valid list"),
    ("prefixes", [], "at least 1 item"),
    ("prefixes", ["/abs/dt=1"], "relative to 'path'"),
    ("prefixes", ["../elsewhere"], "no '.' or '..'"),
    ("prefixes", ["s3://bucket/dt=1"], "no scheme"),
    ("max_file_age", 0, "positive number"),
    ("max_file_age", "7 fortnights", '"7d"'),
    ("max_file_age", True, "positive number"),
])
def test_bad_prefixes_or_max_file_age_are_config_errors_naming_the_option(
        tmp_path: Path, option: str, value: Any, says: str) -> None:
    from airflow_seatunnel_ckpt.core.errors import ConfigError

    with pytest.raises(ConfigError, match=option) as failure:
        FileSource("orders", f"file://{tmp_path}", **{option: value})
    assert says in str(failure.value) and "'orders'" in str(failure.value)


def test_a_pipeline_upgraded_in_place_restores_source_parts_of_the_earlier_format(
    spark: Any, orders: OrdersPipeline, published_ids: Callable[[], list[int]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from airflow_seatunnel_ckpt.core.sources.source_log import INDEX_KEY, is_index_chain

    planned = FileSource.plan_indexed

    def earlier_release(self: FileSource, index: Any, **options: Any) -> dict[str, Any]:
        offsets = planned(self, index, **options)
        offsets.pop(INDEX_KEY)  # the offsets an earlier release recorded: files + identity
        return offsets

    monkeypatch.setattr(FileSource, "plan_indexed", earlier_release)
    orders.add_file("a", [1, 2])
    orders.commit(run_stage(orders.spec("run-1"), spark))
    assert not is_index_chain(orders.pipeline.restore_point().source_chains["orders"])
    monkeypatch.undo()  # the upgrade

    orders.add_file("b", [3])
    second = run_stage(orders.spec("run-2"), spark)
    assert second.sources["orders"]["files"] == ["b.parquet"]
    orders.commit(second)
    assert is_index_chain(orders.pipeline.restore_point().source_chains["orders"])
    third = run_stage(orders.spec("run-3"), spark)
    assert third.sources["orders"]["files"] == []
    orders.commit(third)
    assert published_ids() == [1, 2, 3]


def test_planning_reads_the_index_segments_of_the_listed_names_only(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_seatunnel_ckpt.core import CheckpointConfig, CheckpointStore
    from airflow_seatunnel_ckpt.core.sources import files as file_index
    from airflow_seatunnel_ckpt.core.sources.source_log import write_source_part

    monkeypatch.setattr(file_index, "SEGMENT_ROWS", 2)
    p = CheckpointStore(CheckpointConfig.from_mapping({"storage_url": f"file://{tmp_path / 'store'}"})).pipeline("o")
    inputs = tmp_path / "in"
    history = [{"epoch": d, "offsets": {"files": [f"dt={d}/a.csv", f"dt={d}/b.csv"]}} for d in range(1, 6)]
    state = write_source_part(p.storage, p.config, 5, 1, "orders",
                              {**history[-1]["offsets"], "consumed_index": {"max_file_age": None}},
                              [], True, lambda: history[:-1])
    assert len(state.chain) == 6  # the directory and one segment per day
    for segment in state.chain[1:5]:  # days 1..4: no run lists them any more
        p.storage.delete(segment.path)
    for name in ("dt=5/a.csv", "dt=5/b.csv", "dt=5/c.csv"):
        deliver(inputs, name, 1_000.0)
    point = p.restore_point()
    point.storage, point.source_chains = p.storage, {"orders": state.chain}
    source = FileSource("orders", f"file://{inputs}", format="csv", prefixes=["dt=5/"])

    assert source.plan_from(point)["files"] == ["dt=5/c.csv"]


@pytest.mark.s3
def test_prefixes_and_identities_on_an_object_store(moto_server: Any, s3_bucket: str) -> None:
    fs = moto_server.filesystem()
    for name in ("in/dt=1/a.csv", "in/dt=2/b.csv", "in/dt=2/_tmp/c.csv", "in/other/d.csv"):
        fs.pipe(f"{s3_bucket}/{name}".removeprefix("s3://"), b"x\n1\n")
    source = FileSource("orders", f"{s3_bucket}/in", format="csv", prefixes=["dt=*/"],
                        storage_options=moto_server.storage_options)
    plan = source.plan([{"epoch": 1, "offsets": {"files": ["dt=1/a.csv"]}}])
    assert plan["files"] == ["dt=2/b.csv"]
    ident = plan["identity"]["dt=2/b.csv"]
    # The ETag decides whether a file changed; the mtime is kept for the watermark.
    assert ident["size"] == 4 and ident["etag"] and isinstance(ident["mtime"], float)
    ordered = FileSource("orders", f"{s3_bucket}/in", format="csv", prefixes=["dt=*/"], ordered_prefixes=True,
                         storage_options=moto_server.storage_options)
    fs.pipe(f"{s3_bucket}/in/dt=1/late.csv".removeprefix("s3://"), b"x\n1\n")
    assert ordered.plan([{"epoch": 1, "offsets": {"files": ["dt=1/a.csv", "dt=2/b.csv"]}}])["files"] == []
    assert ordered.plan([{"epoch": 1, "offsets": {"files": ["dt=1/a.csv"]}}])["files"] == [
        "dt=1/late.csv", "dt=2/b.csv"]


def test_ordered_prefixes_list_only_partitions_from_the_greatest_consumed_one(tmp_path: Path) -> None:
    for name in ("dt=1/hour=1/a.csv", "dt=1/hour=2/b.csv", "dt=1/hour=2/c.csv", "dt=2/hour=1/d.csv"):
        deliver(tmp_path, name, 1_000.0)
    history = [{"epoch": 1, "offsets": {"files": ["dt=1/hour=1/a.csv", "dt=1/hour=2/b.csv"]}}]
    deliver(tmp_path, "dt=1/hour=1/late.csv", 1_000.0)  # into a partition before the greatest consumed
    ordered = FileSource("orders", f"file://{tmp_path}", format="csv", prefixes=["dt=*/hour=*/"],
                         ordered_prefixes=True)
    # dt=1/hour=1 is not listed; dt=1/hour=2 (the greatest consumed name's) and later are.
    assert ordered.plan(history)["files"] == ["dt=1/hour=2/c.csv", "dt=2/hour=1/d.csv"]
    assert ordered.plan([])["files"] == [
        "dt=1/hour=1/a.csv", "dt=1/hour=1/late.csv", "dt=1/hour=2/b.csv", "dt=1/hour=2/c.csv", "dt=2/hour=1/d.csv"]
    unordered = FileSource("orders", f"file://{tmp_path}", format="csv", prefixes=["dt=*/hour=*/"])
    assert unordered.plan(history)["files"] == ["dt=1/hour=1/late.csv", "dt=1/hour=2/c.csv", "dt=2/hour=1/d.csv"]


def test_backfill_every_reads_a_file_delivered_late_into_an_older_partition(
    spark: Any, orders: OrdersPipeline
) -> None:
    """``ordered_prefixes`` skips partitions before the newest consumed one; every 4th epoch lists them all."""
    def deliver_csv(name: str, order_id: int) -> None:
        path = orders.input_dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"order_id,customer,amount\n{order_id},c{order_id},1.5\n")

    def epoch(n: int) -> list[str]:
        result = run_stage(text_spec(orders, f"run-{n}", "csv", prefixes=["dt=*/"], ordered_prefixes=True,
                                     backfill_every=4), spark)
        assert result.epoch == n
        orders.commit(result)
        return list(result.sources["orders"]["files"])

    deliver_csv("dt=1/a.csv", 1)
    assert epoch(1) == ["dt=1/a.csv"]
    deliver_csv("dt=2/b.csv", 2)
    assert epoch(2) == ["dt=2/b.csv"]
    deliver_csv("dt=1/late.csv", 3)  # into a partition before the newest consumed one
    assert epoch(3) == []  # not listed (the price of ordered_prefixes)
    assert epoch(4) == ["dt=1/late.csv"]  # the backfill epoch lists every partition
    assert epoch(5) == []
    assert sorted(r["order_id"] for r in orders.published()) == [1, 2, 3]


def test_backfill_is_due_in_the_epochs_that_pass_a_multiple_since_the_restored_one(tmp_path: Path) -> None:
    source = FileSource("orders", f"file://{tmp_path}", prefixes=["dt=*/"], ordered_prefixes=True,
                        backfill_every=4)
    assert [e for e in range(1, 13) if source.backfill_due(e - 1, e)] == [4, 8, 12]
    # Epoch 4 was aborted: epoch 5, planned from epoch 3, is the backfill instead.
    assert source.backfill_due(3, 5) and not source.backfill_due(5, 6)
    assert not FileSource("orders", f"file://{tmp_path}", prefixes=["dt=*/"],
                          ordered_prefixes=True).backfill_due(3, 4)


def test_ordered_prefixes_without_a_glob_prefix_is_a_config_error(tmp_path: Path) -> None:
    from airflow_seatunnel_ckpt.core.errors import ConfigError

    with pytest.raises(ConfigError, match="ordered_prefixes applies to glob prefixes"):
        FileSource("orders", f"file://{tmp_path}", prefixes=["dt=1/"], ordered_prefixes=True)
    with pytest.raises(ConfigError, match="option 'ordered_prefixes': input should be a valid boolean"):
        FileSource("orders", f"file://{tmp_path}", prefixes=["dt=*/"], ordered_prefixes="yes")
    with pytest.raises(ConfigError, match="backfill_every applies with ordered_prefixes"):
        FileSource("orders", f"file://{tmp_path}", prefixes=["dt=*/"], backfill_every=24)
    for bad in (0, -1, 1.5, True, "24"):
        with pytest.raises(ConfigError, match="option 'backfill_every': input should be"):
            FileSource("orders", f"file://{tmp_path}", prefixes=["dt=*/"], ordered_prefixes=True,
                       backfill_every=bad)


# -- the options together, over whole epochs ---------------------------------------------

def deliver_order(orders: OrdersPipeline, name: str, order_id: int, mtime: float | None = None) -> None:
    """A one-order csv input file at ``name`` below the input directory (modified at ``mtime``)."""
    path = orders.input_dir / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"order_id,customer,amount\n{order_id},c{order_id},1.5\n")
    if mtime is not None:
        os.utime(path, (mtime, mtime))


def run_epochs(orders: OrdersPipeline, spark: Any, first: int, count: int,
               stage: str = "tests.spark.stages:count_per_customer", **source: Any) -> list[list[str]]:
    """Run and commit ``count`` epochs from epoch ``first``: the files each one read."""
    read = []
    for n in range(first, first + count):
        result = run_stage(text_spec(orders, f"run-{n}", "csv", stage=stage, **source), spark)
        assert result.epoch == n
        orders.commit(result)
        read.append(list(result.sources["orders"]["files"]))
    return read


def published_order_ids(orders: OrdersPipeline) -> list[int]:
    return sorted(r["order_id"] for r in orders.published())


def test_ordered_prefixes_keep_a_floor_per_prefix_so_new_partitions_of_each_are_read(
    spark: Any, orders: OrdersPipeline
) -> None:
    # One floor for all prefixes was the greatest consumed name: us/... hid every new eu/
    # partition, and manual/... every new dt= partition.
    regions = {"prefixes": ["eu/dt=*/", "us/dt=*/"], "ordered_prefixes": True}
    deliver_order(orders, "eu/dt=1/a.csv", 1)
    deliver_order(orders, "us/dt=1/b.csv", 2)
    assert run_epochs(orders, spark, 1, 1, **regions) == [["eu/dt=1/a.csv", "us/dt=1/b.csv"]]
    deliver_order(orders, "eu/dt=2/c.csv", 3)
    deliver_order(orders, "us/dt=2/d.csv", 4)
    assert run_epochs(orders, spark, 2, 2, **regions) == [["eu/dt=2/c.csv", "us/dt=2/d.csv"], []]
    assert published_order_ids(orders) == [1, 2, 3, 4]


def test_ordered_partitions_continue_after_a_plain_prefix_whose_names_sort_later(
    spark: Any, orders: OrdersPipeline
) -> None:
    mixed = {"prefixes": ["dt=*/", "manual/"], "ordered_prefixes": True}
    deliver_order(orders, "dt=1/a.csv", 1)
    deliver_order(orders, "manual/m.csv", 2)
    assert run_epochs(orders, spark, 1, 1, **mixed) == [["dt=1/a.csv", "manual/m.csv"]]
    deliver_order(orders, "dt=2/b.csv", 3)
    deliver_order(orders, "manual/n.csv", 4)
    assert run_epochs(orders, spark, 2, 2, **mixed) == [["dt=2/b.csv", "manual/n.csv"], []]
    assert published_order_ids(orders) == [1, 2, 3, 4]


def test_a_capped_backlog_under_max_file_age_is_read_once_whatever_its_names_say(
    spark: Any, orders: OrdersPipeline
) -> None:
    # Oldest names first took a.csv (the newest file) first: the watermark moved a day
    # before it, past b.csv, which was listed and waiting for the cap, and never read.
    day = 86_400.0
    deliver_order(orders, "a.csv", 1, mtime=10 * day)
    deliver_order(orders, "b.csv", 2, mtime=8.5 * day)
    deliver_order(orders, "c.csv", 3, mtime=9.8 * day)
    read = run_epochs(orders, spark, 1, 4, max_files_per_epoch=1, max_file_age="1d")
    assert read == [["b.csv"], ["c.csv"], ["a.csv"], []]
    assert published_order_ids(orders) == [1, 2, 3]


def test_widening_or_removing_max_file_age_after_compaction_reads_no_file_twice(
    spark: Any, orders: OrdersPipeline
) -> None:
    from airflow_seatunnel_ckpt.core.sources.source_log import open_index

    day = 86_400.0
    for n, mtime in enumerate((1 * day, 5 * day, 10 * day), start=1):
        deliver_order(orders, f"f{n}.csv", n, mtime=mtime)
        assert run_epochs(orders, spark, n, 1, max_file_age="1d") == [[f"f{n}.csv"]]
    assert run_epochs(orders, spark, 4, 1, max_file_age="1d") == [[]]
    point = orders.pipeline.restore_point()
    index = open_index(orders.pipeline.storage, point.source_chains["orders"])
    # Epoch 4 compacted (interval 3) and forgot f1 and f2: they are outside the window.
    assert index.table().column("path").to_pylist() == ["f3.csv"]

    assert run_epochs(orders, spark, 5, 1, max_file_age="30d") == [[]]  # wider
    deliver_order(orders, "f4.csv", 4, mtime=11 * day)
    assert run_epochs(orders, spark, 6, 2) == [["f4.csv"], []]  # removed
    deliver_order(orders, "f5.csv", 5, mtime=3 * day)  # older than what the index forgot
    deliver_order(orders, "f6.csv", 6, mtime=12 * day)
    assert run_epochs(orders, spark, 8, 1, max_file_age="30d") == [["f6.csv"]]
    assert published_order_ids(orders) == [1, 2, 3, 4, 6]


def test_ordered_prefixes_with_max_files_per_epoch_and_max_file_age_is_a_config_error(tmp_path: Path) -> None:
    from airflow_seatunnel_ckpt.core.errors import ConfigError

    with pytest.raises(ConfigError, match="ordered_prefixes, max_files_per_epoch and max_file_age together"):
        FileSource("orders", f"file://{tmp_path}", prefixes=["dt=*/"], ordered_prefixes=True,
                   max_files_per_epoch=10, max_file_age="7d")
