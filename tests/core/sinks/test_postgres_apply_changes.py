"""apply_changes into the PostgreSQL sink: change rows applied as SCD1 or SCD2, in the epoch's one transaction.

Epochs run through the core protocol (begin, stage Parquet change rows as the Spark side stages
them -- one per key, the operation column kept --, prepare, decide, commit) into a database of
the session's server; outcomes are read back with psycopg: the table's rows, each key's versions.
"""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_seatunnel_ckpt.core import Decision, EpochState
from airflow_seatunnel_ckpt.core.ops.replay import begin_replay, finish_replay, plan_replay
from airflow_seatunnel_ckpt.core.sinks import postgres as postgres_tables
from tests.core.faults import SimulatedCrash
from tests.core.sinks.test_postgres_sink import Epochs

CHANGES = pa.schema([("id", pa.int64()), ("name", pa.string()), ("_op", pa.string()), ("_lsn", pa.int64()),
                     ("_seq", pa.int32())])
#: A change: (id, name, operation, lsn, seq).
Change = tuple[int | None, str | None, str | None, int | None, int | None]


def changes(*rows: Change, toast: list[list[str] | None] | None = None) -> pa.Table:
    table = pa.table({name: [r[n] for r in rows] for n, name in enumerate(CHANGES.names)}, schema=CHANGES)
    if toast is not None:
        table = table.append_column("_unchanged_toast", pa.array(toast, pa.list_(pa.string())))
    return table


def applying(tmp_path: Path, dsn: str, history: str = "scd1", **apply: Any) -> Epochs:
    return Epochs(tmp_path / "store", dsn, create_table=True,
                  apply_changes={"keys": ["id"], "sequence_by": ["_lsn", "_seq"], "history": history, **apply})


def scd1(epochs: Epochs) -> list[tuple[Any, ...]]:
    return epochs.query("SELECT id, name, _lsn, _seq FROM public.orders ORDER BY id")


def scd2(epochs: Epochs) -> list[tuple[Any, ...]]:
    return epochs.query("SELECT id, name, __start_at, __end_at FROM public.orders ORDER BY id, __start_at")


def columns(epochs: Epochs) -> list[str]:
    return [c for (c,) in epochs.query("SELECT column_name FROM information_schema.columns WHERE table_schema = "
                                       "'public' AND table_name = 'orders' ORDER BY ordinal_position")]


# -- SCD1 ------------------------------------------------------------------------------------------
def test_scd1_applies_inserts_updates_and_deletes_over_epochs_one_row_per_key_without_the_operation(
        tmp_path: Path, postgres_db: str) -> None:
    epochs = applying(tmp_path, postgres_db)
    epochs.run(changes((1, "a", "insert", 10, 0), (2, "b", "insert", 10, 1), (3, "c", "insert", 11, 0)))
    # Several changes per key collapse on the Spark side: the epoch stages the last one per key.
    epochs.run(changes((1, "a2", "update", 20, 0), (2, None, "delete", 20, 1), (4, "d", "insert", 21, 0)))
    epochs.run(changes((2, "b3", "insert", 30, 0), (4, None, "delete", 30, 1)))

    assert columns(epochs) == ["id", "name", "_lsn", "_seq"]
    assert scd1(epochs) == [(1, "a2", 20, 0), (2, "b3", 30, 0), (3, "c", 11, 0)]


def test_scd1_a_change_not_above_the_tables_sequence_has_no_effect(tmp_path: Path, postgres_db: str) -> None:
    epochs = applying(tmp_path, postgres_db)
    epochs.run(changes((1, "a", "insert", 10, 0), (2, "b", "insert", 10, 1), (3, "c", "insert", 12, 0)))
    epochs.run(changes((1, "old", "update", 9, 5),  # out of order: below the row's (10, 0)
                       (2, "same", "update", 10, 1),  # replayed: equal
                       (3, None, "delete", 11, 9),  # an older delete
                       (4, "d", "insert", 5, 0)))  # a new key: nothing to compare with
    assert scd1(epochs) == [(1, "a", 10, 0), (2, "b", 10, 1), (3, "c", 12, 0), (4, "d", 5, 0)]


@pytest.mark.parametrize("history", ["scd1", "scd2"])
def test_several_changes_of_a_key_staged_in_one_epoch_apply_its_last_as_the_lake_sinks_do(
        tmp_path: Path, postgres_db: str, history: str) -> None:
    epochs = applying(tmp_path, postgres_db, history=history)
    epochs.run(changes((1, "a", "insert", 10, 0), (2, "b", "insert", 10, 1)))
    epochs.run(changes((1, "a2", "update", 20, 1), (1, "a1", "update", 20, 0), (2, "b2", "update", 20, 2),
                       (2, None, "delete", 21, 0)))
    if history == "scd1":
        assert scd1(epochs) == [(1, "a2", 20, 1)]
    else:
        assert scd2(epochs) == [(1, "a", 10, 20), (1, "a2", 20, None), (2, "b", 10, 21)]


def test_scd1_without_deletes_ignores_delete_changes(tmp_path: Path, postgres_db: str) -> None:
    epochs = applying(tmp_path, postgres_db, deletes=False)
    epochs.run(changes((1, "a", "insert", 10, 0), (2, "b", "insert", 10, 1)))
    epochs.run(changes((1, None, "delete", 20, 0), (2, "b2", "update", 20, 1)))
    assert scd1(epochs) == [(1, "a", 10, 0), (2, "b2", 20, 1)]


def test_scd1_an_unchanged_toasted_column_keeps_the_tables_value(tmp_path: Path, postgres_db: str) -> None:
    epochs = applying(tmp_path, postgres_db)
    epochs.run(changes((1, "long text", "insert", 10, 0), (2, "b", "insert", 10, 1), toast=[None, None]))
    epochs.run(changes((1, None, "update", 20, 0), (2, None, "update", 20, 1), toast=[["name"], []]))
    assert scd1(epochs) == [(1, "long text", 20, 0), (2, None, 20, 1)]
    assert "_unchanged_toast" not in columns(epochs)


# -- SCD2 ------------------------------------------------------------------------------------------
def test_scd2_keeps_every_version_closing_the_current_one_at_the_next_change(tmp_path: Path,
                                                                             postgres_db: str) -> None:
    epochs = applying(tmp_path, postgres_db, history="scd2")
    epochs.run(changes((1, "a", "insert", 10, 0), (2, "b", "insert", 10, 1)))
    epochs.run(changes((1, "a2", "update", 20, 0), (2, None, "delete", 21, 0), (3, "c", "insert", 21, 1)))
    epochs.run(changes((1, None, "delete", 30, 0), (2, "b3", "insert", 31, 0)))
    epochs.run(changes((1, "a4", "insert", 40, 0), (3, "old", "update", 15, 0)))  # id 3's change: out of order

    assert columns(epochs) == ["id", "name", "_lsn", "_seq", "__start_at", "__end_at"]
    assert scd2(epochs) == [(1, "a", 10, 20), (1, "a2", 20, 30), (1, "a4", 40, None),
                            (2, "b", 10, 21), (2, "b3", 31, None),
                            (3, "c", 21, None)]
    current = epochs.query("SELECT id, name FROM public.orders WHERE __end_at IS NULL ORDER BY id")
    assert current == [(1, "a4"), (2, "b3"), (3, "c")]


def test_scd2_a_change_below_a_closed_versions_end_or_replayed_has_no_effect(tmp_path: Path,
                                                                             postgres_db: str) -> None:
    epochs = applying(tmp_path, postgres_db, history="scd2")
    epochs.run(changes((1, "a", "insert", 10, 0), (2, "b", "insert", 10, 1)))
    epochs.run(changes((1, None, "delete", 30, 0), (2, "b2", "update", 20, 0)))
    epochs.run(changes((1, "late", "update", 20, 0),  # below the delete that closed id 1
                       (2, "b2", "update", 20, 0)))  # the same change again
    assert scd2(epochs) == [(1, "a", 10, 30), (2, "b", 10, 20), (2, "b2", 20, None)]


def test_scd2_an_unchanged_toasted_column_keeps_the_current_versions_value(tmp_path: Path,
                                                                           postgres_db: str) -> None:
    epochs = applying(tmp_path, postgres_db, history="scd2")
    epochs.run(changes((1, "long text", "insert", 10, 0), toast=[None]))
    epochs.run(changes((1, None, "update", 20, 0), toast=[["name"]]))
    assert scd2(epochs) == [(1, "long text", 10, 20), (1, "long text", 20, None)]


# -- refusals before the decision ------------------------------------------------------------------
#: kind -> (the table made first or None, the sink's apply_changes, the refused changes, words of the reason)
APPLY_REFUSALS: dict[str, tuple[str | None, dict[str, Any], pa.Table, list[str]]] = {
    "unknown-operation": (None, {}, changes((5, "e", "upsert", 40, 0)),
                          ["'_op'", "'upsert'", "insert", "public.orders"]),
    "null-operation": (None, {}, changes((5, "e", None, 40, 0)), ["'_op'", "holds None"]),
    "null-key": (None, {}, changes((None, "e", "insert", 40, 0)), ["'id'", "NULL"]),
    "null-sequence": (None, {}, changes((5, "e", "insert", None, 0)), ["'_lsn'", "NULL", "public.orders"]),
    "missing-operation-column": (None, {}, changes((5, "e", "insert", 40, 0)).drop_columns(["_op"]),
                                 ["['_op']", "not in the epoch's change rows"]),
    "scd1-table-of-a-plain-upsert": ("(id bigint PRIMARY KEY, name text)", {}, changes((5, "e", "insert", 40, 0)),
                                     ["lacks ['_lsn', '_seq']", "plain upsert"]),
    "scd2-table-without-bounds": ("(id bigint PRIMARY KEY, name text, _lsn bigint, _seq integer)",
                                  {"history": "scd2"}, changes((5, "e", "insert", 40, 0)),
                                  ["lacks ['__start_at', '__end_at']"]),
    "scd2-table-one-row-per-key": ("(id bigint PRIMARY KEY, name text, _lsn bigint, _seq integer, __start_at bigint, "
                                   "__end_at bigint)", {"history": "scd2"}, changes((5, "e", "insert", 40, 0)),
                                   ["keys ['id'] alone"]),
    "scd2-table-without-its-current-index": (
        "(id bigint, name text, _lsn bigint, _seq integer, __start_at bigint, __end_at bigint, "
        "PRIMARY KEY (id, __start_at))", {"history": "scd2"}, changes((5, "e", "insert", 40, 0)),
        ["WHERE __end_at IS NULL"]),
    "type-mismatch": ("(id bigint PRIMARY KEY, name integer, _lsn bigint, _seq integer)", {},
                      changes((5, "e", "insert", 40, 0)), ["name: the table has integer"]),
    "check-constraint-of-the-applied-rows": (
        "(id bigint PRIMARY KEY, name text CONSTRAINT named CHECK (name <> 'bad'), _lsn bigint, _seq integer)", {},
        changes((1, "bad", "update", 40, 0)), ["named", "constraint"]),
    "scd2-a-version-starting-where-one-starts": (
        None, {"history": "scd2"}, changes((1, "again", "update", 10, 7)),
        ["orders_pkey", "(id, __start_at)", "first sequence_by value"]),
}


#: The kinds whose table can take no epoch: the first epoch is refused (the way out is the table's to take).
UNFIT_TABLES = {"scd1-table-of-a-plain-upsert", "scd2-table-without-bounds", "scd2-table-one-row-per-key",
                "scd2-table-without-its-current-index", "type-mismatch"}


@pytest.mark.parametrize("kind", list(APPLY_REFUSALS))
def test_a_change_the_sink_cannot_apply_is_refused_before_the_decision_and_the_next_epoch_commits(
        tmp_path: Path, postgres_db: str, kind: str) -> None:
    ddl, apply, bad, words = APPLY_REFUSALS[kind]
    epochs = applying(tmp_path, postgres_db, **apply)
    if ddl is not None:
        epochs.execute(f"CREATE TABLE public.orders {ddl}")
    if kind not in UNFIT_TABLES:
        epochs.run(changes((1, "a", "insert", 10, 0), (2, "b", "insert", 10, 1)))
    before = epochs.query("SELECT * FROM public.orders ORDER BY 1")

    reason = epochs.refused(bad)

    for word in words:
        assert word in reason, f"{word!r} not in the refusal: {reason}"
    assert "sink 'orders'" in reason and "public.orders" in reason
    assert epochs.query("SELECT * FROM public.orders ORDER BY 1") == before
    if kind in UNFIT_TABLES:  # the way out the message names: a table made for it (here: by create_table)
        epochs.execute("DROP TABLE public.orders")
    epochs.run(changes((3, "c", "insert", 50, 0)))  # the next epoch commits
    assert len(epochs.query("SELECT * FROM public.orders")) == len(before) + 1


# -- a crash, replay and full refresh ---------------------------------------------------------------
EPOCHS = [
    changes((1, "a", "insert", 10, 0), (2, "b", "insert", 10, 1), (3, "c", "insert", 10, 2)),
    changes((1, "a2", "update", 20, 0), (2, None, "delete", 20, 1), (4, "d", "insert", 21, 0)),
    changes((1, None, "delete", 30, 0), (2, "b3", "insert", 30, 1), (3, "c3", "update", 31, 0)),
]


def table_of(epochs: Epochs, history: str) -> list[tuple[Any, ...]]:
    return scd2(epochs) if history == "scd2" else scd1(epochs)


@pytest.mark.parametrize("history", ["scd1", "scd2"])
def test_a_commit_killed_before_its_transaction_commits_is_committed_once_by_the_retry(
        tmp_path: Path, postgres_db: str, history: str, monkeypatch: pytest.MonkeyPatch) -> None:
    fresh = applying(tmp_path / "fresh", postgres_db, history=history)
    fresh.options = {**fresh.options, "table": "public.fresh"}
    for staged in EPOCHS:
        fresh.run(staged)
    epochs = applying(tmp_path, postgres_db, history=history)
    epochs.run(EPOCHS[0])
    epoch, decision, reason = epochs.decided(EPOCHS[1])
    assert decision is Decision.COMMIT, reason
    real = postgres_tables._apply_step

    def dies(*args: Any, **kwargs: Any) -> None:
        real(*args, **kwargs)  # the rows changed inside the transaction, which never commits
        raise SimulatedCrash("killed inside the commit's transaction")

    with monkeypatch.context() as mp:
        mp.setattr(postgres_tables, "_apply_step", dies)
        with pytest.raises(SimulatedCrash):
            epochs.pipeline.commit(epoch)
    assert epochs.pipeline.state(epoch) is EpochState.COMMITTING
    epochs.open().commit(epoch)
    epochs.open().commit(epoch)  # and once more: the marker says it landed
    epochs.run(EPOCHS[2])

    bounds = "__start_at, __end_at" if history == "scd2" else "_lsn, _seq"
    assert table_of(epochs, history) == fresh.query(f"SELECT id, name, {bounds} FROM public.fresh ORDER BY 1, 3")


def replay_changes(epochs: Epochs, start: int, read: dict[int, pa.Table]) -> int:
    """Replay epochs ``start``.. as the stage runtime does: each replayed epoch's changes (``read``, its
    pinned input read again) staged below ``replayed-<epoch>/``; the replay's epoch."""
    p = epochs.pipeline
    plan = plan_replay(p, start)
    epoch, run_id = begin_replay(p, plan, reason="fix", by="test")
    staging = p.staging_path(epoch, 1, "orders")
    for e in plan.epochs:
        buf = io.BytesIO()
        pq.write_table(read[e], buf)
        p.storage.write_atomic(f"{staging}/replayed-{e}/part-00000.parquet", buf.getvalue())
    manifest = p.manifest_for_staged(epoch, 1, "orders", "postgres://test/public.orders",
                                     sum(read[e].num_rows for e in plan.epochs))
    manifest = dataclasses.replace(manifest, table=epochs.options)
    finish_replay(p, epoch, run_id, plan, 1, sinks=[manifest], operators={}, reason="fix", by="test")
    assert p.state(epoch) is EpochState.COMMITTED
    return epoch


@pytest.mark.parametrize("history", ["scd1", "scd2"])
@pytest.mark.parametrize("start", [1, 2, 3], ids=["full-refresh", "from-2", "from-3"])
def test_a_replay_or_full_refresh_gives_the_table_a_fresh_run_gives(tmp_path: Path, postgres_db: str,
                                                                     history: str, start: int) -> None:
    epochs = applying(tmp_path, postgres_db, history=history)
    read = {epochs.run(staged): staged for staged in EPOCHS}
    fresh = table_of(epochs, history)

    replay_changes(epochs, start, read)
    assert table_of(epochs, history) == fresh
    replay_changes(epochs, start, read)  # a replay of a range holding the earlier replay
    assert table_of(epochs, history) == fresh

    epochs.run(changes((3, None, "delete", 40, 0), (5, "e", "insert", 40, 1)))  # and the next epoch runs
    after = {r[0] for r in epochs.query("SELECT id FROM public.orders" + (
        " WHERE __end_at IS NULL" if history == "scd2" else ""))}
    assert after == {2, 4, 5}


@pytest.mark.parametrize("history", ["scd1", "scd2"])
def test_a_replay_whose_new_output_differs_restores_the_keys_as_of_the_epoch_before(
        tmp_path: Path, postgres_db: str, history: str) -> None:
    epochs = applying(tmp_path, postgres_db, history=history)
    read = {epochs.run(staged): staged for staged in EPOCHS}
    # The stage now filters id 3 out, and writes id 4 from epoch 3 instead of epoch 2.
    again = {1: read[1], 2: changes((1, "a2", "update", 20, 0), (2, None, "delete", 20, 1)),
             3: changes((1, None, "delete", 30, 0), (2, "b3", "insert", 30, 1), (4, "d", "insert", 31, 0))}
    fresh = applying(tmp_path / "fresh", postgres_db, history=history)
    fresh.options = {**fresh.options, "table": "public.fresh"}
    for e in (1, 2, 3):
        fresh.run(again[e])

    replay_changes(epochs, 2, again)

    columns_ = "__start_at, __end_at" if history == "scd2" else "_lsn, _seq"
    assert table_of(epochs, history) == fresh.query(f"SELECT id, name, {columns_} FROM public.fresh ORDER BY 1, 3")


def test_scd2_with_a_key_of_two_columns_replays_to_the_table_a_fresh_run_gives(tmp_path: Path,
                                                                               postgres_db: str) -> None:
    def keyed(*rows: tuple[int, str, str, str, int]) -> pa.Table:
        return pa.table({"id": [r[0] for r in rows], "region": [r[1] for r in rows], "name": [r[2] for r in rows],
                         "_op": [r[3] for r in rows], "_lsn": [r[4] for r in rows]})

    epochs = Epochs(tmp_path / "store", postgres_db, create_table=True, apply_changes={
        "keys": ["id", "region"], "sequence_by": "_lsn", "history": "scd2"})
    read = {1: keyed((1, "EU", "a", "insert", 10), (1, "US", "b", "insert", 10)),
            2: keyed((1, "EU", "a2", "update", 20), (1, "US", "", "delete", 20)),
            3: keyed((1, "US", "b3", "insert", 30))}
    epochs.run(read[1])
    epochs.run(read[2])
    epochs.run(read[3])

    def versions() -> list[tuple[Any, ...]]:
        return epochs.query("SELECT id, region, name, __start_at, __end_at FROM public.orders ORDER BY 1, 2, 4")

    fresh = versions()
    assert fresh == [(1, "EU", "a", 10, 20), (1, "EU", "a2", 20, None), (1, "US", "b", 10, 20),
                     (1, "US", "b3", 30, None)]
    replay_changes(epochs, 2, read)
    assert versions() == fresh
