"""A table sink's refusal comes before the commit decision: the epoch is aborted, the next one runs.

Every refusal a table commit can raise (a merge key twice or NULL, a changed or dropped
column, another partitioning, a table property, the table's epoch marker) is checked when
the epoch is decided, from the staged files alone. Each case drives the whole protocol
(begin, stage, prepare, decide, commit) against a real pyiceberg SQL catalog or a real
Delta table, reads the table back (pyiceberg scan, DuckDB ``delta_scan``) to prove it did
not change, and then commits the next epoch with good rows. Before the check moved, each
of these epochs was decided commit and then refused by every commit: wedged COMMITTING.

After the decision, a table altered in between still refuses; that commit fails at once
(no retry can change it), and ``seatunnel-ckpt resolve --skip-sink`` is the guarded way on.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import re
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from airflow_seatunnel_ckpt.cli import main as cli_main
from airflow_seatunnel_ckpt.core import CheckpointConfig, CheckpointStore, Decision, EpochState, Pipeline
from airflow_seatunnel_ckpt.core.errors import PublishError, SinkRefusedError, TableOwnershipError
from airflow_seatunnel_ckpt.core.models import SinkManifest, SinkMode
from airflow_seatunnel_ckpt.core.sinks import SinkCommit, commit_sink
from airflow_seatunnel_ckpt.core.sinks.files import OWNER_MARKER
from airflow_seatunnel_ckpt.core.sinks.markers import Owner
from tests.core.sinks import test_delta_sink as delta
from tests.core.sinks.test_iceberg_sink import SCHEMA, Lake, eu_us, orders, scan_ids
from tests.tables import duckdb_delta_rows

TOTALS = pa.schema([("customer", pa.string()), ("total", pa.float64())])
#: What every refusal before the decision says about the way out.
WAY_OUT = "the epoch is aborted before any change to the table"


def totals(*rows: tuple[str | None, float]) -> pa.Table:
    return pa.table({"customer": [r[0] for r in rows], "total": [r[1] for r in rows]}, schema=TOTALS)


def prepare(pipeline: Pipeline, run_id: str, manifest_for: Callable[[int], SinkManifest]) -> int:
    """begin, stage (``manifest_for(epoch)``), prepare: the epoch waits for its decision."""
    epoch = pipeline.begin(run_id).epoch
    pipeline.prepare(epoch, "ingest", 1, run_id=run_id, sinks=[manifest_for(epoch)])
    return epoch


def commit_epoch(pipeline: Pipeline, run_id: str, manifest_for: Callable[[int], SinkManifest]) -> int:
    epoch = prepare(pipeline, run_id, manifest_for)
    assert pipeline.decide(epoch, Decision.COMMIT, "all prepared", by="test").decision is Decision.COMMIT
    pipeline.commit(epoch)
    return epoch


# -- Iceberg ---------------------------------------------------------------------------------

class IcebergCase:
    """A pipeline writing Iceberg tables ``lake.orders`` (by region) and ``lake.totals`` (upsert)."""

    def __init__(self, root: Path) -> None:
        self.lake = Lake(root)
        self.root = root

    @property
    def pipeline(self) -> Pipeline:
        return self.lake.pipeline

    def orders(self, parts: dict[str, pa.Table], **kwargs: Any) -> Callable[[int], SinkManifest]:
        return lambda epoch: self.lake.stage(epoch, parts, **kwargs)

    def totals(self, rows: pa.Table) -> Callable[[int], SinkManifest]:
        def manifest(epoch: int) -> SinkManifest:
            staged = self.lake.stage(epoch, {"": rows}, sink="totals", partition_by=[])
            assert staged.table is not None
            return dataclasses.replace(staged, table={**staged.table.to_dict(), "table": "lake.totals",
                                                      "mode": "upsert", "merge_keys": ["customer"]})
        return manifest

    def seen(self, identifier: str) -> tuple[str, list[dict[str, Any]]]:
        """The table's current metadata file and its rows (a change to either is a table change)."""
        from pyiceberg.catalog import load_catalog

        table = load_catalog("lake", **self.lake.catalog_props).load_table(identifier)
        rows = sorted(table.scan().to_arrow().to_pylist(), key=lambda r: json.dumps(r, default=str))
        return table.metadata_location, rows

    def placed(self, epoch: int) -> list[Path]:
        """Files of ``epoch`` placed anywhere in the warehouse."""
        return [p for p in (self.root / "warehouse").rglob(f"*-e{epoch}-*") if p.is_file()]


def _iceberg_changed_type(case: IcebergCase) -> Callable[[int], SinkManifest]:
    changed = pa.schema([f if f.name != "amount" else pa.field("amount", pa.string()) for f in SCHEMA])
    return case.orders({"__partition_region=EU": pa.table(
        {"order_id": [3], "region": ["EU"], "amount": ["3.0"], "ts": [dt.datetime(2026, 1, 2)]}, schema=changed)})


ICEBERG_CASES: dict[str, tuple[str, Callable[[IcebergCase], Callable[[int], SinkManifest]], str]] = {
    # name: (table, the refused epoch's staging, what the refusal names)
    "duplicate-merge-key": ("lake.totals", lambda c: c.totals(totals(("c0", 2.0), ("c0", 3.0))),
                            r"sink 'totals'.*1 key\(s\) appear more than once .*'customer': 'c0'"),
    "null-merge-key": ("lake.totals", lambda c: c.totals(totals((None, 2.0))),
                       r"sink 'totals'.*merge key column 'customer' is NULL in 1 row\(s\)"),
    "changed-column-type": ("lake.orders", _iceberg_changed_type,
                            r"sink 'orders'.*column 'amount' is double in the table but string.*cast it back"),
    "dropped-column": ("lake.orders",
                       lambda c: c.orders(eu_us([3], [4], pa.schema([f for f in SCHEMA if f.name != "amount"]))),
                       r"sink 'orders'.*column 'amount' \(double\) is in the table but not in the epoch's files"),
    "partitioning-mismatch": ("lake.orders", lambda c: c.orders({"": orders([3], "EU")}, partition_by=[]),
                              r"sink 'orders'.*partitioned by identity of nothing.*Set partition_by"),
}


@pytest.mark.parametrize("name", sorted(ICEBERG_CASES))
def test_an_iceberg_refusal_aborts_the_epoch_before_any_table_change_and_the_next_epoch_commits(
        tmp_path: Path, name: str) -> None:
    identifier, refused, reason = ICEBERG_CASES[name]
    case = IcebergCase(tmp_path)
    good_rows = (case.totals(totals(("c0", 1.0))), case.totals(totals(("c1", 5.0)))) if identifier == "lake.totals" \
        else (case.orders(eu_us([1], [2])), case.orders(eu_us([5], [6])))
    commit_epoch(case.pipeline, "r1", good_rows[0])
    before = case.seen(identifier)

    epoch = prepare(case.pipeline, "r2", refused(case))
    record = case.pipeline.decide(epoch, Decision.COMMIT, "all prepared", by="test")

    assert record.decision is Decision.ABORT, "the refusal must come before the commit decision"
    assert case.pipeline.state(epoch) is EpochState.ABORTED
    assert re.search(reason, record.reason), record.reason
    assert WAY_OUT in record.reason and "fix the stage" in record.reason
    assert case.seen(identifier) == before
    assert case.placed(epoch) == []
    # The next epoch, with good rows, commits.
    following = commit_epoch(case.pipeline, "r3", good_rows[1])
    assert case.pipeline.state(following) is EpochState.COMMITTED
    assert case.seen(identifier) != before


def test_an_iceberg_table_marked_by_another_store_aborts_the_epoch_and_a_table_of_its_own_commits(
        tmp_path: Path) -> None:
    case = IcebergCase(tmp_path)
    other_id = str(uuid.uuid4())  # another checkpoint store (its id), at another URL
    other = dataclasses.replace(case.lake.request(1, case.lake.stage(1, eu_us([1], [2]))), store="file:///elsewhere",
                                store_id=other_id)
    commit_sink(other)
    before = case.seen("lake.orders")

    epoch = prepare(case.pipeline, "r1", case.orders(eu_us([3], [4])))
    record = case.pipeline.decide(epoch, Decision.COMMIT, "all prepared", by="test")

    assert record.decision is Decision.ABORT
    assert f"belongs to pipeline 'orders' of store {other_id} (file:///elsewhere)" in record.reason
    assert "another checkpoint store writes it" in record.reason and "Give this sink its own table" in record.reason
    assert case.seen("lake.orders") == before

    def own_table(epoch: int) -> SinkManifest:
        staged = case.lake.stage(epoch, eu_us([3], [4]))
        assert staged.table is not None
        return dataclasses.replace(staged, table={**staged.table.to_dict(), "table": "lake.orders_here"})

    commit_epoch(case.pipeline, "r2", own_table)
    assert scan_ids(case.lake.table()) == [1, 2]
    assert case.seen("lake.orders_here")[1] != []


# -- Delta -----------------------------------------------------------------------------------

class DeltaCase:
    """A pipeline writing Delta tables ``orders`` (by country) and ``totals`` (upsert)."""

    def __init__(self, root: Path) -> None:
        config = CheckpointConfig.from_mapping({"storage_url": f"file://{root}/store"})
        self.pipeline: Pipeline = CheckpointStore(config).pipeline("orders")
        self.tables = root / "tables"

    def uri(self, name: str) -> str:
        return str(self.tables / name)

    def orders(self, files: dict[str, pa.Table], *, table: str = "orders", mode: SinkMode = SinkMode.APPEND,
               partition_by: tuple[str, ...] = ("country",)) -> Callable[[int], SinkManifest]:
        def manifest(epoch: int) -> SinkManifest:
            return delta.stage(self.pipeline.storage, epoch, files, uri=self.uri(table), mode=mode,
                               partition_by=partition_by, staging=self.pipeline.staging_path(epoch, 1, "orders"))
        return manifest

    def totals(self, rows: pa.Table) -> Callable[[int], SinkManifest]:
        def manifest(epoch: int) -> SinkManifest:
            staged = delta.stage(self.pipeline.storage, epoch, {"part-00000.parquet": rows}, uri=self.uri("totals"),
                                 sink="totals", partition_by=(), staging=self.pipeline.staging_path(epoch, 1, "totals"))
            assert staged.table is not None
            return dataclasses.replace(staged,
                table={**staged.table.to_dict(), "mode": "upsert", "merge_keys": ["customer"]})
        return manifest

    def seen(self, table: str) -> tuple[int, list[tuple[Any, ...]]]:
        """The table's version and its rows as DuckDB reads them."""
        return DeltaTable(self.uri(table)).version(), duckdb_delta_rows(self.uri(table))

    def placed(self, epoch: int) -> list[Path]:
        return [p for p in self.tables.rglob(f"*-e{epoch}-*") if p.is_file()]


def _delta_append_only(case: DeltaCase, table: str) -> None:
    """Make ``table`` append-only, as a table owner would (a metadata-only commit)."""
    DeltaTable(case.uri(table)).alter.set_table_properties({"delta.appendOnly": "true"})


def _delta_not_append_only(case: DeltaCase, table: str) -> None:
    """The refusal's way out for an upsert sink: the table owner unsets delta.appendOnly."""
    DeltaTable(case.uri(table)).alter.set_table_properties({"delta.appendOnly": "false"})


DeltaAlter = Callable[[DeltaCase, str], None]
DELTA_CASES: dict[str, tuple[str, Callable[[DeltaCase], Callable[[int], SinkManifest]], str,
                             DeltaAlter | None, DeltaAlter | None]] = {
    # name: (table, the refused epoch's staging, what the refusal names, a change to the table before
    # the epoch, the way out taken before the next epoch)
    "duplicate-merge-key": ("totals", lambda c: c.totals(totals(("c0", 2.0), ("c0", 3.0))),
                            r"sink 'totals'.*1 key\(s\) appear more than once .*'customer': 'c0'", None, None),
    "null-merge-key": ("totals", lambda c: c.totals(totals((None, 2.0))),
                       r"sink 'totals'.*merge key column 'customer' is NULL in 1 row\(s\)", None, None),
    "changed-column-type": (
        "orders", lambda c: c.orders({"__partition_country=DE/p.parquet": pa.table(
            {"id": ["x"], "country": ["DE"], "amount": [1.0]})}),
        r"sink 'orders'.*id: table has PrimitiveType\(\"long\"\), the epoch's files have PrimitiveType\(\"string\"\)"
        r".*Cast or add the columns", None, None),
    "dropped-column": (
        "orders", lambda c: c.orders({"__partition_country=DE/p.parquet": pa.table({"id": [2], "country": ["DE"]})}),
        r"sink 'orders'.*Columns missing from the files: amount", None, None),
    "partitioning-mismatch": (
        "orders", lambda c: c.orders({"p.parquet": delta.rows([2], "DE")}, partition_by=()),
        r"sink 'orders'.*the table is partitioned by \['country'\], the sink by \[\]", None, None),
    "append-only-table-and-snapshot-sink": (
        "orders", lambda c: c.orders(delta.by_country(2, DE=[2]), mode=SinkMode.SNAPSHOT),
        r"sink 'orders'.*append-only \(delta.appendOnly=true\) and a snapshot sink replaces", _delta_append_only,
        None),
    "append-only-table-and-merge-sink": (
        "totals", lambda c: c.totals(totals(("c0", 2.0))),
        r"sink 'totals'.*append-only \(delta.appendOnly=true\) and an upsert sink \(merge_keys\) updates",
        _delta_append_only, _delta_not_append_only),
}


@pytest.mark.parametrize("name", sorted(DELTA_CASES))
def test_a_delta_refusal_aborts_the_epoch_before_any_table_change_and_the_next_epoch_commits(
        tmp_path: Path, name: str) -> None:
    table, refused, reason, alter, way_out = DELTA_CASES[name]
    case = DeltaCase(tmp_path)
    good_rows = (case.totals(totals(("c0", 1.0))), case.totals(totals(("c1", 5.0)))) if table == "totals" \
        else (case.orders(delta.by_country(1, DE=[1])), case.orders(delta.by_country(3, FR=[3])))
    commit_epoch(case.pipeline, "r1", good_rows[0])
    if alter is not None:
        alter(case, table)
    before = case.seen(table)

    epoch = prepare(case.pipeline, "r2", refused(case))
    record = case.pipeline.decide(epoch, Decision.COMMIT, "all prepared", by="test")

    assert record.decision is Decision.ABORT, "the refusal must come before the commit decision"
    assert case.pipeline.state(epoch) is EpochState.ABORTED
    assert re.search(reason, record.reason), record.reason
    assert WAY_OUT in record.reason and "fix the stage" in record.reason
    assert case.seen(table) == before
    assert case.placed(epoch) == []
    if way_out is not None:
        way_out(case, table)
    following = commit_epoch(case.pipeline, "r3", good_rows[1])
    assert case.pipeline.state(following) is EpochState.COMMITTED
    assert len(case.seen(table)[1]) == len(before[1]) + 1


def test_a_delta_table_past_the_epoch_aborts_it_and_a_table_of_its_own_commits(tmp_path: Path) -> None:
    """A pipeline removed and started again in its store must not lose its epochs as "already"."""
    case = DeltaCase(tmp_path)
    commit_sink(SinkCommit("orders", "file:///elsewhere", 5, case.orders(delta.by_country(5, DE=[5]))(5),
                             case.pipeline.storage, 3))
    before = case.seen("orders")

    epoch = prepare(case.pipeline, "r1", case.orders(delta.by_country(1, DE=[1])))
    record = case.pipeline.decide(epoch, Decision.COMMIT, "all prepared", by="test")

    assert record.decision is Decision.ABORT
    assert "the table records epoch 5 of this pipeline's sink as committed by this store" in record.reason
    assert "has no commit decision for epoch 5" in record.reason
    assert "Give this sink its own table" in record.reason and WAY_OUT in record.reason
    assert case.seen("orders") == before
    commit_epoch(case.pipeline, "r2", case.orders(delta.by_country(2, DE=[2]), table="orders_here"))
    assert case.seen("orders_here") == (0, [(2, "DE", 3.0)])


def test_a_delta_table_with_column_mapping_aborts_an_appending_epoch(tmp_path: Path) -> None:
    case = DeltaCase(tmp_path)
    DeltaTable.create(case.uri("orders"), delta.SCHEMA, partition_by=["country"],
                      configuration={"delta.columnMapping.mode": "name"})

    epoch = prepare(case.pipeline, "r1", case.orders(delta.by_country(1, DE=[1])))
    record = case.pipeline.decide(epoch, Decision.COMMIT, "all prepared", by="test")

    assert record.decision is Decision.ABORT
    assert "column mapping (delta.columnMapping.mode=name)" in record.reason and WAY_OUT in record.reason
    assert DeltaTable(case.uri("orders")).version() == 0


# -- after the decision ----------------------------------------------------------------------

def test_a_table_altered_after_the_decision_fails_the_commit_at_once_and_resolve_skips_the_sink(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    case = DeltaCase(tmp_path)
    commit_epoch(case.pipeline, "r1", case.orders(delta.by_country(1, DE=[1])))
    epoch = prepare(case.pipeline, "r2", case.orders(delta.by_country(2, DE=[2]), mode=SinkMode.SNAPSHOT))
    assert case.pipeline.decide(epoch, Decision.COMMIT, "all prepared", by="test").decision is Decision.COMMIT
    _delta_append_only(case, "orders")  # someone alters the table between the decision and the commit
    before = case.seen("orders")

    with pytest.raises(SinkRefusedError, match=r"append-only.*seatunnel-ckpt resolve orders 2 --skip-sink orders") \
            as refused:
        case.pipeline.commit(epoch)
    assert not refused.value.retryable
    assert case.pipeline.state(epoch) is EpochState.COMMITTING
    assert case.seen("orders") == before

    store = f"file://{tmp_path}/store"
    with pytest.raises(SystemExit):  # a reason is required
        cli_main(["--store", store, "resolve", "orders", str(epoch), "--skip-sink", "orders"])
    capsys.readouterr()
    code = cli_main(["--store", store, "--json", "resolve", "orders", str(epoch), "--skip-sink", "orders",
                     "--reason", "table made append-only after the decision", "--by", "ops@example"])
    assert code == 0, capsys.readouterr()
    out = json.loads(capsys.readouterr().out)
    assert [(s["sink"], s["how"]) for s in out["sinks"]] == [("orders", "skipped")]
    assert case.pipeline.state(epoch) is EpochState.COMMITTED
    assert case.seen("orders") == before  # nothing published for the skipped sink
    [entry] = case.pipeline.txlog.actions(epoch)
    assert (entry.record.action, entry.record.by, entry.record.reason, entry.record.details) == (
        "skip-sink", "ops@example", "table made append-only after the decision", {"sink": "orders"})
    assert entry.outcome is not None and entry.outcome.outcome.value == "succeeded"
    # The pipeline moves on: the next epoch (an append, which the table allows) commits.
    following = commit_epoch(case.pipeline, "r3", case.orders(delta.by_country(3, FR=[3])))
    assert case.pipeline.state(following) is EpochState.COMMITTED
    assert duckdb_delta_rows(case.uri("orders"), order_by="id") == [(1, "DE", 1.5), (3, "FR", 4.5)]


def test_a_table_claimed_by_another_pipeline_after_the_decision_fails_the_commit_at_once_naming_skip_sink(
        tmp_path: Path) -> None:
    """The commit keeps the ownership check as a safety net: a refusal there is final, not a retried PublishError."""
    case = DeltaCase(tmp_path)
    commit_epoch(case.pipeline, "r1", case.orders(delta.by_country(1, DE=[1])))
    epoch = prepare(case.pipeline, "r2", case.orders(delta.by_country(2, DE=[2])))
    assert case.pipeline.decide(epoch, Decision.COMMIT, "all prepared", by="test").decision is Decision.COMMIT
    # Between the decision and the commit the table is handed over to another pipeline of the store.
    Path(case.uri("orders"), OWNER_MARKER).write_bytes(
        Owner(case.pipeline.store_id(), "orders_backfill", "file:///store").to_json())
    before = case.seen("orders")

    with pytest.raises(TableOwnershipError, match=r"belongs to pipeline 'orders_backfill'.*"
                                                  r"seatunnel-ckpt resolve orders 2 --skip-sink orders") as refused:
        case.pipeline.commit(epoch)
    assert isinstance(refused.value, SinkRefusedError) and not refused.value.retryable
    assert case.pipeline.state(epoch) is EpochState.COMMITTING
    assert case.seen("orders") == before
    assert case.placed(epoch) == []


def test_resolve_is_refused_for_an_epoch_that_is_not_committing(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    case = DeltaCase(tmp_path)
    epoch = commit_epoch(case.pipeline, "r1", case.orders(delta.by_country(1, DE=[1])))
    store = f"file://{tmp_path}/store"

    code = cli_main(["--store", store, "resolve", "orders", str(epoch), "--skip-sink", "orders", "--reason", "x"])

    assert code == 2
    assert "is COMMITTED: only an epoch decided commit and not yet published (COMMITTING)" in capsys.readouterr().err
    assert case.pipeline.txlog.actions(epoch) == []


def test_a_table_library_error_after_the_decision_is_ours_and_recovery_reports_it(tmp_path: Path) -> None:
    """A broken table (its metadata file overwritten) raises inside pyiceberg: never a bare library error."""
    case = IcebergCase(tmp_path)
    commit_epoch(case.pipeline, "r1", case.orders(eu_us([1], [2])))
    epoch = prepare(case.pipeline, "r2", case.orders(eu_us([3], [4])))
    assert case.pipeline.decide(epoch, Decision.COMMIT, "all prepared", by="test").decision is Decision.COMMIT
    metadata = Path(case.lake.table().metadata_location.removeprefix("file://"))
    metadata.write_text("{not json")

    with pytest.raises(PublishError, match=r"pipeline 'orders' epoch 2 sink 'orders': the iceberg commit failed "
                                           r"in the table library") as failed:
        case.pipeline.commit(epoch)
    assert failed.value.retryable
    report = CheckpointStore(case.pipeline.config).pipeline("orders").recover(dry_run=False)
    [action] = [a for a in report.actions if a.epoch == epoch]
    assert action.error is not None and "in the table library" in action.error
    assert case.pipeline.state(epoch) is EpochState.COMMITTING
