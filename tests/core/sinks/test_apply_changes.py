"""apply_changes into Iceberg and Delta tables: SCD1 and SCD2, every change once, through the real protocol.

Each epoch's change rows (``_op``, ``_lsn``, ``_seq``) are staged as the Spark table sink
stages them, prepared, decided and committed by the pipeline; the tables are read back
with the format's own readers (pyiceberg and DuckDB's ``iceberg_scan``, deltalake and
DuckDB's ``delta_scan``), never with this package.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from airflow_seatunnel_ckpt.core import Decision, EpochState
from airflow_seatunnel_ckpt.core.ops.replay import begin_replay, finish_replay, plan_replay
from tests.contract.sinks import DeltaContext, Epochs, IcebergContext, SinkContext, apply_changes
from tests.tables import duckdb_connection, duckdb_delta_rows

CHANGES = pa.schema([("id", pa.int64()), ("region", pa.string()), ("amount", pa.float64()), ("_op", pa.string()),
                     ("_lsn", pa.int64()), ("_seq", pa.int32())])
#: A change: (op, id, amount, lsn, seq).
Change = tuple[str, Any, Any, Any, int]


def changes(*rows: Change, schema: pa.Schema = CHANGES) -> pa.Table:
    """Change rows; each id's region is fixed by the id (the staging partitions by region)."""
    return pa.table({"id": [r[1] for r in rows], "region": ["EU" if (r[1] or 0) % 2 == 0 else "US" for r in rows],
                     "amount": [r[2] for r in rows], "_op": [r[0] for r in rows], "_lsn": [r[3] for r in rows],
                     "_seq": [r[4] for r in rows]}, schema=schema)


#: Inserts, updates (two of one key in one epoch), a delete, a re-insert, an out-of-order and a replayed change.
EPOCHS = [
    changes(("insert", 1, 1.0, 10, 1), ("insert", 2, 2.0, 10, 2), ("insert", 3, 3.0, 10, 3)),
    changes(("update", 1, 1.5, 20, 1), ("update", 1, 1.7, 21, 1), ("delete", 2, None, 20, 2),
            ("insert", 4, 4.0, 22, 1)),
    changes(("update", 3, 3.5, 5, 1),  # below the table's (10, 3): out of order, no effect
            ("update", 1, 1.7, 21, 1),  # the sequence the table holds: replayed, no effect
            ("update", 4, 4.5, 30, 1), ("insert", 2, 2.2, 31, 1)),
]
#: The SCD1 table after each epoch: (id, region, amount, _lsn, _seq).
SCD1 = [
    [(1, "US", 1.0, 10, 1), (2, "EU", 2.0, 10, 2), (3, "US", 3.0, 10, 3)],
    [(1, "US", 1.7, 21, 1), (3, "US", 3.0, 10, 3), (4, "EU", 4.0, 22, 1)],
    [(1, "US", 1.7, 21, 1), (2, "EU", 2.2, 31, 1), (3, "US", 3.0, 10, 3), (4, "EU", 4.5, 30, 1)],
]
#: The SCD2 table after the three epochs: (id, amount, __start_at, __end_at); one epoch's two changes of id 1
#: are one version (the last), as the Spark side collapses them.
SCD2 = [(1, 1.0, 10, 21), (1, 1.7, 21, None), (2, 2.0, 10, 20), (2, 2.2, 31, None), (3, 3.0, 10, None),
        (4, 4.0, 22, 30), (4, 4.5, 30, None)]


class Changes(SinkContext):
    """A table context whose staged rows are the change rows given (not the suite's rows made changes)."""

    history_kind = "scd1"

    def options(self, mode: str) -> dict[str, Any]:
        options = {k: v for k, v in super().options(mode).items() if k != "merge_keys"}  # type: ignore[misc]
        return {**options, "apply_changes": apply_changes(self.history_kind)}

    def table_rows(self) -> list[dict[str, Any]]:
        """The table's rows as dicts, read by the format's library and checked against DuckDB's reading."""
        raise NotImplementedError


class IcebergChanges(Changes, IcebergContext):
    def table_rows(self) -> list[dict[str, Any]]:
        with self._table() as table:
            if table is None:
                return []
            found = table.scan().to_arrow()
            metadata = table.metadata_location.removeprefix("file://")
            by_duckdb = duckdb_connection("avro", "iceberg").execute(
                f"SELECT * FROM iceberg_scan('{metadata}')").fetch_arrow_table()
        assert sorted(map(repr, by_duckdb.to_pylist())) == sorted(map(repr, found.to_pylist()))
        return found.to_pylist()


class DeltaChanges(Changes, DeltaContext):
    def table_commits(self) -> list[tuple[Any, str]]:
        import airflow_seatunnel_ckpt.core.sinks.delta as delta_tables

        return [(delta_tables, "_apply_changes")]  # a new table's create too

    def table_rows(self) -> list[dict[str, Any]]:
        from deltalake import DeltaTable

        if not self._versions():
            return []
        found = pa.table(DeltaTable(f"{self.root}/tables/orders").to_pyarrow_table())
        by_duckdb = duckdb_delta_rows(f"{self.root}/tables/orders")
        assert sorted(map(repr, by_duckdb)) == sorted(repr(tuple(r.values())) for r in found.to_pylist())
        return found.to_pylist()


FORMATS = {"iceberg": IcebergChanges, "delta": DeltaChanges}


def context(root: Path, fmt: str, history: str) -> Changes:
    made = FORMATS[fmt](root)
    made.history_kind = history
    return made


def commit(epochs: Epochs, rows: pa.Table, crash: str | None = None) -> int:
    """One whole epoch of ``rows`` (its commit killed just ``crash`` the table commit, then resumed)."""
    epoch, _ = epochs.prepare(lambda e: rows)
    assert epochs.decide(epoch).decision is Decision.COMMIT
    epochs.commit(lambda: epochs.pipeline.commit(epoch), lambda: epochs.open().commit(epoch), crash)
    assert epochs.pipeline.state(epoch) is EpochState.COMMITTED
    return epoch


def scd1(found: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return sorted((r["id"], r["region"], r["amount"], r["_lsn"], r["_seq"]) for r in found)


def scd2(found: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return sorted(((r["id"], r["amount"], r["__start_at"], r["__end_at"]) for r in found),
                  key=lambda r: (r[0], r[2]))


def replay(epochs: Epochs, from_epoch: int, rows: Sequence[pa.Table]) -> int:
    """Replay epochs ``from_epoch``.. with ``rows`` (one table per replayed epoch) as the stage runtime does."""
    plan = plan_replay(epochs.pipeline, from_epoch)
    epoch, run_id = begin_replay(epochs.pipeline, plan, reason="test", by="test")
    manifest = epochs.stage(epoch, list(rows), [f"replayed-{e}" for e in plan.epochs])
    finish_replay(epochs.pipeline, epoch, run_id, plan, 1, sinks=[manifest], operators={}, reason="test", by="test")
    assert epochs.pipeline.state(epoch) is EpochState.COMMITTED
    return epoch


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_scd1_holds_each_keys_newest_row_deletes_remove_it_and_lower_sequences_have_no_effect(
        tmp_path: Path, fmt: str) -> None:
    target = context(tmp_path, fmt, "scd1")
    epochs = Epochs(target, "upsert")
    for rows, expected in zip(EPOCHS, SCD1, strict=True):
        commit(epochs, rows)
        found = target.table_rows()
        assert scd1(found) == expected
    assert set(found[0]) == {"id", "region", "amount", "_lsn", "_seq"}  # no operation column


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_scd2_keeps_every_version_bounded_by_start_and_end_and_a_delete_closes_the_current_one(
        tmp_path: Path, fmt: str) -> None:
    target = context(tmp_path, fmt, "scd2")
    epochs = Epochs(target, "upsert")
    for rows in EPOCHS:
        commit(epochs, rows)
    found = target.table_rows()
    assert scd2(found) == SCD2
    assert set(found[0]) == {"id", "region", "amount", "_lsn", "_seq", "__start_at", "__end_at"}


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_an_update_keeps_the_tables_value_of_a_column_its_unchanged_toast_names(tmp_path: Path, fmt: str) -> None:
    target = context(tmp_path, fmt, "scd1")
    epochs = Epochs(target, "upsert")
    schema = CHANGES.append(pa.field("_unchanged_toast", pa.list_(pa.string())))

    def with_toast(rows: pa.Table, toast: list[Any]) -> pa.Table:
        return rows.append_column(schema.field("_unchanged_toast"), pa.array(toast, pa.list_(pa.string())))

    commit(epochs, with_toast(changes(("insert", 1, 1.0, 10, 1), ("insert", 3, 3.0, 10, 2)), [None, None]))
    commit(epochs, with_toast(changes(("update", 1, None, 20, 1), ("update", 3, None, 20, 2)), [["amount"], None]))

    assert scd1(target.table_rows()) == [(1, "US", 1.0, 20, 1), (3, "US", None, 20, 2)]


def _plain_upsert_table(epochs: Epochs) -> None:
    """The table written first by a plain upsert of the change rows (it keeps the ``_op`` column)."""
    assert isinstance(epochs.context, Changes)
    options = epochs.context.options
    epochs.context.options = lambda mode: {  # type: ignore[method-assign]
        **{k: v for k, v in options(mode).items() if k != "apply_changes"}, "merge_keys": ["id"]}
    commit(epochs, EPOCHS[0])
    epochs.context.options = options  # type: ignore[method-assign]


def _scd1_table(epochs: Epochs) -> None:
    """The table written first as SCD1 (no __start_at / __end_at); the sink then applies SCD2."""
    assert isinstance(epochs.context, Changes)
    epochs.context.history_kind = "scd1"
    commit(epochs, EPOCHS[0])
    epochs.context.history_kind = "scd2"


def _scd1_table_without_seq(epochs: Epochs) -> None:
    """The table written first by an SCD1 sink ordering by ``_lsn`` alone; the sink then orders by ``_seq`` too."""
    assert isinstance(epochs.context, Changes)
    options = epochs.context.options
    epochs.context.options = lambda mode: {  # type: ignore[method-assign]
        **options(mode), "apply_changes": {**apply_changes("scd1"), "sequence_by": ["_lsn"],
                                           "except_columns": ["_seq"]}}
    commit(epochs, EPOCHS[0])
    epochs.context.options = options  # type: ignore[method-assign]


#: kind: (history, what is there before, the refused epoch's rows, what the refusal names)
REFUSALS: dict[str, tuple[str, Any, pa.Table, str]] = {
    "unknown-operation": ("scd1", None, changes(("upsert", 4, 4.0, 30, 1)), r"'_op'.*'upsert'.*insert"),
    "null-operation": ("scd2", None, changes((None, 4, 4.0, 30, 1)), r"'_op'.*None"),  # type: ignore[arg-type]
    "null-key": ("scd1", None, changes(("insert", None, 4.0, 30, 1)), r"key column 'id' is NULL"),
    "null-sequence": ("scd2", None, changes(("insert", 4, 4.0, None, 1)), r"sequence column '_lsn' is NULL"),
    "plain-upsert-table": ("scd1", _plain_upsert_table, changes(("insert", 4, 4.0, 30, 1)),
                           r"operation column '_op'"),
    "scd1-table-for-scd2": ("scd2", _scd1_table, changes(("insert", 4, 4.0, 30, 1)), r"lacks.*__start_at"),
    "table-lacks-a-sequence-column": ("scd1", _scd1_table_without_seq, changes(("insert", 4, 4.0, 30, 1)),
                                      r"lacks the key/sequence column\(s\) \['_seq'\]"),
    "type-mismatch": ("scd1", lambda epochs: commit(epochs, EPOCHS[0]), changes(
        ("insert", 4, "lots", 30, 1), schema=CHANGES.set(2, pa.field("amount", pa.string()))), r"amount"),
}


@pytest.mark.parametrize("fmt", sorted(FORMATS))
@pytest.mark.parametrize("kind", sorted(REFUSALS))
def test_each_kind_of_change_the_sink_cannot_apply_is_refused_before_the_decision_and_the_next_epoch_commits(
        tmp_path: Path, fmt: str, kind: str) -> None:
    history, before, bad, names = REFUSALS[kind]
    target = context(tmp_path, fmt, history)
    epochs = Epochs(target, "upsert")
    if before is not None:
        before(epochs)
    table = target.table_rows()
    epoch, _ = epochs.prepare(lambda e: bad)

    record = epochs.decide(epoch)

    assert record.decision is Decision.ABORT, record.reason
    assert "sink 'orders'" in record.reason and re.search(names, record.reason), record.reason
    assert target.table_rows() == table
    if kind in ("plain-upsert-table", "scd1-table-for-scd2", "table-lacks-a-sequence-column"):
        return  # the table itself is the refusal: the way out is a new table
    commit(epochs, changes(("insert", 5, 5.0, 40, 1)))
    assert 5 in {r["id"] for r in target.table_rows()}


@pytest.mark.parametrize(("fmt", "history"), [("iceberg", "scd2"), ("delta", "scd1")])
@pytest.mark.parametrize("crash", ["before", "after"])
def test_a_commit_killed_at_its_table_commit_is_committed_once_by_another_process(
        tmp_path: Path, fmt: str, history: str, crash: str) -> None:
    target = context(tmp_path, fmt, history)
    epochs = Epochs(target, "upsert")
    for n, rows in enumerate(EPOCHS):
        commit(epochs, rows, crash=crash if n == 1 else None)
    found = target.table_rows()
    assert (scd2(found) == SCD2) if history == "scd2" else (scd1(found) == SCD1[-1])


# Both replays (from epoch 1: a full refresh; from epoch 2) in one case per format and history:
# each against the same fresh run, made once (it does not depend on where a replay starts).
@pytest.mark.parametrize("fmt", sorted(FORMATS))
@pytest.mark.parametrize("history", ["scd1", "scd2"])
def test_a_replay_and_a_full_refresh_give_the_table_of_a_fresh_run_and_the_next_epoch_runs(
        tmp_path: Path, fmt: str, history: str) -> None:
    read = scd2 if history == "scd2" else scd1
    fresh = context(tmp_path / "fresh", fmt, history)
    once = Epochs(fresh, "upsert")
    for rows in EPOCHS:
        commit(once, rows)
    more = changes(("delete", 1, None, 50, 1), ("insert", 6, 6.0, 50, 2))
    want = read(fresh.table_rows())
    commit(once, more)
    want_after_more = read(fresh.table_rows())

    for from_epoch in (1, 2):
        target = context(tmp_path / f"replayed-from-{from_epoch}", fmt, history)
        epochs = Epochs(target, "upsert")
        for rows in EPOCHS:
            commit(epochs, rows)

        replay(epochs, from_epoch, EPOCHS[from_epoch - 1:])  # the source's same changes, read again

        assert read(target.table_rows()) == want, f"replay from epoch {from_epoch}"
        commit(epochs, more)
        assert read(target.table_rows()) == want_after_more, f"the epoch after the replay from epoch {from_epoch}"


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_a_replay_with_other_changes_restores_the_keys_as_before_it_and_applies_the_new_ones(
        tmp_path: Path, fmt: str) -> None:
    target = context(tmp_path, fmt, "scd2")
    epochs = Epochs(target, "upsert")
    for rows in EPOCHS:
        commit(epochs, rows)

    # Epochs 2..3 again, now without id 4 and with id 3 updated: as if they had read this.
    replay(epochs, 2, [changes(("update", 1, 1.7, 21, 1), ("delete", 2, None, 20, 2)),
                       changes(("update", 3, 3.9, 32, 1), ("insert", 2, 2.2, 31, 1))])

    assert scd2(target.table_rows()) == [(1, 1.0, 10, 21), (1, 1.7, 21, None), (2, 2.0, 10, 20), (2, 2.2, 31, None),
                                         (3, 3.0, 10, 32), (3, 3.9, 32, None)]


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_with_deletes_false_a_delete_change_leaves_the_row_and_later_changes_still_apply(
        tmp_path: Path, fmt: str) -> None:
    target = context(tmp_path, fmt, "scd1")
    epochs = Epochs(target, "upsert")
    options = target.options
    target.options = lambda mode: {  # type: ignore[method-assign]
        **options(mode), "apply_changes": {**apply_changes("scd1"), "deletes": False}}
    commit(epochs, changes(("insert", 1, 1.0, 10, 1), ("insert", 2, 2.0, 10, 2)))
    commit(epochs, changes(("delete", 1, None, 20, 1), ("update", 2, 2.5, 20, 2)))

    assert scd1(target.table_rows()) == [(1, "US", 1.0, 10, 1), (2, "EU", 2.5, 20, 2)]


# -- REVIEW: keys of text (delta-rs writes them as string_view) --------------------------------------------

@pytest.mark.parametrize("key", [["region"], ["region", "id"]])
def test_a_delta_table_keyed_by_a_text_column_takes_epoch_after_epoch_of_changes(tmp_path: Path,
                                                                                  key: list[str]) -> None:
    # The second epoch's MERGE writes the table's files anew (text as string_view); the third reads them by key.
    from deltalake import DeltaTable

    target = context(tmp_path, "delta", "scd1")
    epochs = Epochs(target, "upsert")
    options = target.options
    target.options = lambda mode: {  # type: ignore[method-assign]
        **options(mode), "partition_by": [], "apply_changes": {**apply_changes("scd1"), "keys": key}}
    commit(epochs, changes(("insert", 1, 1.0, 10, 1), ("insert", 2, 2.0, 10, 2)))
    commit(epochs, changes(("update", 1, 1.5, 20, 1)))
    commit(epochs, changes(("update", 1, 3.5, 30, 1), ("delete", 2, None, 30, 2)))

    rows = DeltaTable(f"{tmp_path}/tables/orders").to_pyarrow_table().to_pylist()
    assert sorted((r["region"], r["id"], r["amount"]) for r in rows) == [("US", 1, 3.5)]


def test_an_iceberg_epoch_of_20k_changes_with_a_composite_key_commits_in_seconds(tmp_path: Path) -> None:
    # pyiceberg's match filter of a composite key (one And per key, all Or-ed) took minutes to build and
    # evaluate at 20k keys; the commit plans with each key column's values and picks the rows exactly.
    import time

    target = context(tmp_path, "iceberg", "scd1")
    epochs = Epochs(target, "upsert")
    options = target.options
    target.options = lambda mode: {  # type: ignore[method-assign]
        **options(mode), "apply_changes": {**apply_changes("scd1"), "keys": ["region", "id"]}}
    n = 20_000
    commit(epochs, changes(*[("insert", i, float(i), 10, 1) for i in range(n)]))
    started = time.monotonic()
    commit(epochs, changes(*[("update", i, i + 0.5, 20, 1) for i in range(0, n, 2)],
                           *[("delete", i, None, 20, 1) for i in range(1, 2000, 2)]))
    took = time.monotonic() - started

    rows = scd1(target.table_rows())
    assert len(rows) == n - 1000 and rows[:2] == [(0, "EU", 0.5, 20, 1), (2, "EU", 2.5, 20, 1)]
    assert took < 60, f"the commit of 11k changes took {took:.0f}s"
