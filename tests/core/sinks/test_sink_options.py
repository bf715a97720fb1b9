"""Typed sink options: one model per type, one mode vocabulary, and the previous release's records still commit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from airflow_seatunnel_ckpt.core.errors import ConfigError
from airflow_seatunnel_ckpt.core.models import SinkManifest, SinkMode
from airflow_seatunnel_ckpt.core.options import option_table, parse
from airflow_seatunnel_ckpt.core.sinks import SinkCommit, commit_sink
from airflow_seatunnel_ckpt.core.sinks.base import store_id
from airflow_seatunnel_ckpt.core.sinks.files import SUCCESS
from airflow_seatunnel_ckpt.core.sinks.options import SINK_OPTIONS, DeltaSinkOptions, IcebergSinkOptions
from airflow_seatunnel_ckpt.core.storage import FileInfo, Storage, open_storage
from tests.core.sinks.test_delta_sink import request, stage
from tests.core.sinks.test_delta_upsert import table_rows, totals


def previous_release(manifest: SinkManifest, table: dict[str, object] | None) -> SinkManifest:
    """``manifest`` as the previous release stored it: ``mode: "changes"`` and a plain ``table`` dict."""
    data = manifest.to_dict()
    data.update(mode="changes", **({"table": table} if table is not None else {}))
    return SinkManifest.from_dict(json.loads(json.dumps(data)), "prepared-ingest")


def test_a_previous_release_upsert_record_with_changes_and_a_dict_table_decodes_typed_and_commits(
        store: Storage, tmp_path: Path) -> None:
    uri = str(tmp_path / "tables" / "totals")
    old_table = {"type": "delta", "uri": uri, "merge_keys": ["customer"], "partition_by": []}
    for epoch, rows in ((1, totals(c0=10.0, c1=20.0)), (2, totals(c1=25.0))):
        manifest = previous_release(stage(store, epoch, rows, uri=uri, sink="totals", partition_by=()), old_table)
        assert manifest.mode is SinkMode.UPSERT, "merge_keys on a 'changes' sink was the previous release's upsert"
        assert isinstance(manifest.table, DeltaSinkOptions) and manifest.table.path == uri
        assert manifest.table.mode == "upsert" and manifest.table.merge_keys == ["customer"]
        commit_sink(request(store, epoch, manifest))
    assert table_rows(uri) == [("c0", 10.0), ("c1", 25.0)]


def test_a_previous_release_file_sink_record_with_changes_publishes_its_epoch_directory(
        store: Storage, tmp_path: Path) -> None:
    staging = "staging/epoch=1/attempt=1/orders"
    store.write_atomic(f"{staging}/part-00000.parquet", b"rows")
    target_url = f"file://{tmp_path / 'out'}"
    staged = SinkManifest("orders", target_url, staging, [FileInfo("part-00000.parquet", 4, store.checksum(
        f"{staging}/part-00000.parquet"))], 1)
    manifest = previous_release(staged, None)
    assert manifest.mode is SinkMode.APPEND and manifest.table is None
    assert "mode" not in manifest.to_dict(), "a file sink's record is written as before (append is the default)"

    published = commit_sink(SinkCommit("orders", "file:///store", 1, manifest, store, 0, store_id=store_id(store)))

    target = open_storage(target_url)
    assert published.how in ("renamed", "copied")
    assert target.read("epoch=1/part-00000.parquet") == b"rows"
    assert json.loads(target.read(f"epoch=1/{SUCCESS}"))["rows"] == 1


def test_an_iceberg_record_of_the_previous_release_names_its_table_identifier_and_reads_as_table() -> None:
    old = {"type": "iceberg", "identifier": "lake.orders", "catalog_name": "default", "catalog": {},
           "partition_by": ["region"]}
    manifest = SinkManifest.from_dict({"sink": "o", "target_url": "iceberg://default/lake.orders", "staging": "s",
                                       "files": [], "rows": 0, "mode": "snapshot", "table": old})
    assert isinstance(manifest.table, IcebergSinkOptions)
    assert (manifest.table.table, manifest.table.mode, manifest.mode) == ("lake.orders", "snapshot",
                                                                         SinkMode.SNAPSHOT)


@pytest.mark.parametrize(("options", "problem"), [
    ({"type": "file", "path": "/out", "mode": "upsert"}, "option 'mode': input should be 'append' or 'snapshot'"),
    ({"type": "postgres", "table": "t", "conninfo": "host=db", "mode": "snapshot"},
     "option 'mode': input should be 'append' or 'upsert'"),
    ({"type": "delta", "path": "/t", "mode": "upsert"}, "mode 'upsert' needs merge_keys"),
    ({"type": "iceberg", "table": "lake.t", "mode": "append", "merge_keys": ["k"]},
     "merge_keys ['k'] with mode 'append'"),
    ({"type": "delta", "path": "/t", "merge_key": ["k"]}, "unknown option 'merge_key' (did you mean 'merge_keys'?)"),
    ({"type": "iceberg", "table": "orders"}, "'<namespace>.<name>'"),
], ids=["file-upsert", "postgres-snapshot", "upsert-without-keys", "keys-on-append", "near-name", "iceberg-name"])
def test_sink_options_are_refused_when_declared_naming_the_sink_and_the_problem(options: dict[str, object],
                                                                                 problem: str) -> None:
    with pytest.raises(ConfigError, match="sink 'out'") as refused:
        parse("sink", "out", options, SINK_OPTIONS)
    assert problem in str(refused.value)


def test_one_mode_vocabulary_with_the_previous_words_still_read() -> None:
    assert parse("sink", "o", {"path": "/out", "mode": "changes"}, SINK_OPTIONS).mode == "append"  # type: ignore[attr-defined]
    upsert = parse("sink", "o", {"type": "iceberg", "table": "lake.t", "merge_keys": "k"}, SINK_OPTIONS)
    assert (upsert.mode, upsert.merge_keys) == ("upsert", ["k"])  # type: ignore[attr-defined]
    assert [m.value for m in SinkMode] == ["append", "upsert", "snapshot"]
    assert SinkMode("changes") is SinkMode.APPEND


def test_every_sink_option_has_a_description_for_the_reference() -> None:
    for model in SINK_OPTIONS.values():
        table = option_table(model)
        undocumented = [line for line in table.splitlines()[2:] if line.endswith("|  |")]
        assert undocumented == [], f"{model.__name__}: {undocumented}"


def test_a_stage_spec_upsert_on_a_delta_sink_records_typed_options_without_expectations() -> None:
    options = parse("sink", "o", {"type": "delta", "path": "/t", "mode": "upsert", "merge_keys": ["k"],
                                  "expectations": {"positive": "k > 0"}}, SINK_OPTIONS)
    manifest = SinkManifest("o", "file:///t", "s", [], 0, mode=SinkMode.UPSERT,
                            table=options.recorded())  # type: ignore[attr-defined]
    stored = manifest.to_dict()
    assert stored["mode"] == "upsert" and stored["table"]["expectations"] is None
    assert SinkManifest.from_dict(stored) == manifest
