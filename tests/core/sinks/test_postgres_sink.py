"""The PostgreSQL sink's commit: each epoch's rows once in a real PostgreSQL table, with its marker.

Epochs run through the core protocol (begin, stage Parquet, prepare, decide, commit) into
a database of the session's server (:mod:`tests.postgres_server`); outcomes are read back
with psycopg: the table's rows and the marker table's rows.
"""

from __future__ import annotations

import dataclasses
import io
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_seatunnel_ckpt.core import CheckpointConfig, CheckpointStore, Decision, EpochState, Pipeline
from airflow_seatunnel_ckpt.core import sinks as core_tables
from airflow_seatunnel_ckpt.core.errors import ConfigError, StorageError
from airflow_seatunnel_ckpt.core.models import SinkManifest, SinkMode
from airflow_seatunnel_ckpt.core.ops.replay import ReplayError, begin_replay, finish_replay, plan_replay
from airflow_seatunnel_ckpt.core.options import checked
from airflow_seatunnel_ckpt.core.protocol.recovery import recover
from airflow_seatunnel_ckpt.core.protocol.txlog import TransactionLog
from airflow_seatunnel_ckpt.core.sinks import base as sink_base
from airflow_seatunnel_ckpt.core.sinks import postgres as postgres_tables
from airflow_seatunnel_ckpt.core.sinks.options import PostgresSinkOptions
from tests.core.epochs import at_once
from tests.core.faults import SimulatedCrash

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("amount", pa.float64())])


def rows(ids: list[int | None], suffix: str = "") -> pa.Table:
    return pa.table({"id": ids, "name": [f"n{i}{suffix}" for i in ids], "amount": [(i or 0) * 1.5 for i in ids]},
                    schema=SCHEMA)


class Epochs:
    """A pipeline of one store whose sink ``orders`` is a PostgreSQL table."""

    def __init__(self, store: Path, dsn: str, **options: Any) -> None:
        self.store_url = f"file://{store}"
        self.options = {"type": "postgres", "table": "public.orders", "conninfo": dsn, **options}
        self.dsn = dsn
        self.mode = SinkMode.APPEND
        self.pipeline = self.open()
        self.runs = 0

    def open(self) -> Pipeline:
        """A fresh Pipeline object, as another process (a retry, the recovery DAG) builds it."""
        config = CheckpointConfig.from_mapping({"storage_url": self.store_url, "max_retries": 2})
        return CheckpointStore(config).pipeline("orders")

    def decided(self, *files: pa.Table) -> tuple[int, Decision, str]:
        """Begin, stage one Parquet file per table, prepare and decide commit."""
        self.runs += 1
        p = self.pipeline
        epoch = p.begin(f"run-{self.runs}").epoch
        staging = p.staging_path(epoch, 1, "orders")
        for n, table in enumerate(files):
            buf = io.BytesIO()
            pq.write_table(table, buf)
            p.storage.write_atomic(f"{staging}/part-{n:05d}.parquet", buf.getvalue())
        manifest = p.manifest_for_staged(epoch, 1, "orders", "postgres://test/public.orders",
                                         sum(t.num_rows for t in files))
        manifest = dataclasses.replace(manifest, mode=self.mode, table=self.options)
        p.prepare(epoch, "ingest", 1, run_id=f"run-{self.runs}", sinks=[manifest])
        record = p.decide(epoch, Decision.COMMIT, "all prepared", by="test")
        return epoch, record.decision, record.reason

    def run(self, *files: pa.Table) -> int:
        """A whole epoch that must commit."""
        epoch, decision, reason = self.decided(*files)
        assert decision is Decision.COMMIT, reason
        self.pipeline.commit(epoch)
        return epoch

    def refused(self, *files: pa.Table) -> str:
        """An epoch that must be refused at its decision; the reason (the epoch is aborted)."""
        epoch, decision, reason = self.decided(*files)
        assert decision is Decision.ABORT, f"epoch {epoch} was decided {decision.value}"
        assert self.pipeline.state(epoch) is EpochState.ABORTED
        return reason

    def query(self, statement: str) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.dsn) as conn:
            return conn.execute(statement).fetchall()

    def execute(self, statement: str) -> None:
        with psycopg.connect(self.dsn) as conn:
            conn.execute(statement)

    def table(self) -> list[tuple[Any, ...]]:
        return self.query("SELECT id, name, amount FROM public.orders ORDER BY id")

    def markers(self) -> list[tuple[Any, ...]]:
        return self.query("SELECT pipeline, sink, epoch, target_table, rows FROM public.seatunnel_ckpt_epochs "
                          "ORDER BY epoch")


@pytest.fixture
def epochs(tmp_path: Path, postgres_db: str) -> Epochs:
    return Epochs(tmp_path / "store", postgres_db, create_table=True)


def expected(ids: list[int], suffix: str = "") -> list[tuple[Any, ...]]:
    return [(i, f"n{i}{suffix}", i * 1.5) for i in sorted(ids)]


def test_append_epochs_land_every_row_once_with_one_marker_per_epoch(epochs: Epochs) -> None:
    first = epochs.run(rows([1, 2, 3]), rows([4]))
    second = epochs.run(rows([5, 6]))
    epochs.open().commit(second)  # a retried commit task: the marker says it landed
    epochs.pipeline.commit(first)

    assert epochs.table() == expected([1, 2, 3, 4, 5, 6])
    assert epochs.markers() == [("orders", "orders", first, "public.orders", 4),
                                ("orders", "orders", second, "public.orders", 2)]
    assert epochs.pipeline.state(second) is EpochState.COMMITTED


@pytest.mark.parametrize("statement", ["merge", "on_conflict"])
def test_upsert_replaces_rows_by_key_and_adds_new_keys(tmp_path: Path, postgres_db: str, statement: str,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    if statement == "on_conflict":  # as on PostgreSQL before 15, which has no MERGE
        monkeypatch.setattr(postgres_tables, "MERGE_SINCE", 10**9)
    epochs = Epochs(tmp_path / "store", postgres_db, mode="upsert", merge_keys=["id"], create_table=True)
    epochs.run(rows([1, 2, 3]))
    epochs.run(rows([2, 3, 4], suffix="-v2"))

    assert epochs.table() == [(1, "n1", 1.5), (2, "n2-v2", 3.0), (3, "n3-v2", 4.5), (4, "n4-v2", 6.0)]
    assert epochs.query("SELECT count(*) FROM public.seatunnel_ckpt_epochs") == [(2,)]


@pytest.mark.parametrize("statement", ["merge", "on_conflict"])
def test_upsert_into_an_existing_table_keeps_the_columns_the_epoch_does_not_write(
        tmp_path: Path, postgres_db: str, statement: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if statement == "on_conflict":
        monkeypatch.setattr(postgres_tables, "MERGE_SINCE", 10**9)
    epochs = Epochs(tmp_path / "store", postgres_db, mode="upsert", merge_keys=["id"])
    epochs.execute("CREATE TABLE public.orders (id bigint PRIMARY KEY, name varchar(20), amount numeric, "
                 "note text DEFAULT 'kept') ")
    epochs.run(rows([1, 2]))
    epochs.run(rows([2], suffix="-v2"))

    assert epochs.query("SELECT id, name, amount::float8, note FROM public.orders ORDER BY id") == [
        (1, "n1", 1.5, "kept"), (2, "n2-v2", 3.0, "kept")]


def refusing(tmp_path: Path, dsn: str, **options: Any) -> Epochs:
    return Epochs(tmp_path / "store", dsn, **options)


def test_a_missing_table_is_refused_before_the_decision_naming_the_table(tmp_path: Path, postgres_db: str) -> None:
    epochs = refusing(tmp_path, postgres_db)
    reason = epochs.refused(rows([1]))
    assert "public.orders does not exist" in reason and "create_table" in reason
    assert epochs.query("SELECT to_regclass('public.orders')") == [(None,)]


def test_a_snapshot_mode_is_refused_when_the_sink_is_declared_and_in_a_record(epochs: Epochs) -> None:
    with pytest.raises(ConfigError, match=r"option 'mode': input should be 'append' or 'upsert' \(found 'snapshot'\)"):
        checked(PostgresSinkOptions, {**epochs.options, "mode": "snapshot"}, "sink 'orders'")
    with pytest.raises(ValueError, match="input should be 'append' or 'upsert'"):  # nor made, nor decoded
        SinkManifest("orders", "postgres://x", "s", [], 0, mode=SinkMode.SNAPSHOT, table=epochs.options)


def test_an_incompatible_column_type_is_refused_before_the_decision(tmp_path: Path, postgres_db: str) -> None:
    epochs = refusing(tmp_path, postgres_db)
    epochs.execute("CREATE TABLE public.orders (id integer, name text, amount double precision)")
    reason = epochs.refused(rows([1]))  # id is int64 in the files, integer (int4) in the table
    assert "id: the table has integer" in reason and "int64" in reason
    assert epochs.table() == []


def test_a_column_missing_from_the_table_or_a_required_one_missing_from_the_epoch_is_refused(
        tmp_path: Path, postgres_db: str) -> None:
    epochs = refusing(tmp_path, postgres_db)
    epochs.execute("CREATE TABLE public.orders (id bigint, name text, region text NOT NULL)")
    reason = epochs.refused(rows([1]))
    assert "Columns not in the table: ['amount']" in reason
    assert "Columns without a default the epoch does not write: ['region']" in reason


def test_merge_keys_without_a_unique_constraint_are_refused(tmp_path: Path, postgres_db: str) -> None:
    epochs = refusing(tmp_path, postgres_db, mode="upsert", merge_keys=["id"])
    epochs.execute("CREATE TABLE public.orders (id bigint, name text, amount float8)")
    reason = epochs.refused(rows([1]))
    assert "merge_keys ['id'] are not the table's primary key nor a unique constraint" in reason
    assert "ADD UNIQUE (id)" in reason


@pytest.mark.parametrize("bad", [[1, 1], [1, None]], ids=["duplicate", "null"])
def test_duplicate_or_null_staged_merge_keys_are_refused(tmp_path: Path, postgres_db: str,
                                                         bad: list[int | None]) -> None:
    epochs = refusing(tmp_path, postgres_db, mode="upsert", merge_keys=["id"], create_table=True)
    reason = epochs.refused(rows([2]), rows(bad))
    assert "'id'" in reason or "id" in reason.split("merge key")[1][:20]
    assert epochs.query("SELECT to_regclass('public.orders')") == [(None,)]


def test_a_second_store_into_the_same_table_is_refused_before_the_decision(tmp_path: Path,
                                                                            postgres_db: str) -> None:
    first = Epochs(tmp_path / "store-a", postgres_db, create_table=True)
    first.run(rows([1]))
    second = Epochs(tmp_path / "store-b", postgres_db, create_table=True)
    reason = second.refused(rows([2]))
    assert "the table belongs to pipeline 'orders' of store" in reason
    assert "DELETE FROM public.seatunnel_ckpt_owners WHERE target_table = 'public.orders'" in reason
    assert first.table() == expected([1])


def test_a_password_in_conninfo_is_refused_when_the_sink_is_declared() -> None:
    with pytest.raises(ConfigError, match="conninfo holds a password"):
        checked(PostgresSinkOptions, {"table": "t", "conninfo": "host=db user=u password=secret"}, "sink 'orders'")
    with pytest.raises(ConfigError, match="conninfo holds a password"):
        checked(PostgresSinkOptions, {"table": "t", "conninfo": "postgresql://u:secret@db/x"}, "sink 'orders'")


def test_two_racing_committers_of_one_epoch_land_it_once(epochs: Epochs) -> None:
    for round_ in range(4):
        ids = list(range(round_ * 100, round_ * 100 + 50))
        epoch, decision, _ = epochs.decided(rows(ids[:25]), rows(ids[25:]))
        assert decision is Decision.COMMIT
        outcomes = at_once([lambda e=epoch: epochs.open().commit(e), lambda e=epoch: epochs.open().commit(e)])
        assert not [o for o in outcomes if isinstance(o, BaseException)], outcomes
        assert epochs.pipeline.state(epoch) is EpochState.COMMITTED
    ids = [i for r in range(4) for i in range(r * 100, r * 100 + 50)]
    assert epochs.table() == expected(ids)
    assert epochs.query("SELECT epoch, count(*) FROM public.seatunnel_ckpt_epochs GROUP BY epoch ORDER BY 1") == [
        (e, 1) for e in range(1, 5)]


def test_a_crash_between_the_database_commit_and_the_logs_committed_is_resolved_by_the_marker(
        epochs: Epochs, monkeypatch: pytest.MonkeyPatch) -> None:
    epochs.run(rows([1]))
    epoch, decision, _ = epochs.decided(rows([2, 3]))
    assert decision is Decision.COMMIT

    def die(self: TransactionLog, *args: Any, **kwargs: Any) -> None:
        raise SimulatedCrash("killed after the PostgreSQL transaction committed, before the log's committed")

    with monkeypatch.context() as mp:
        mp.setattr(TransactionLog, "acknowledge_committed", die)
        with pytest.raises(SimulatedCrash):
            epochs.pipeline.commit(epoch)
    assert epochs.pipeline.state(epoch) is EpochState.COMMITTING
    assert epochs.table() == expected([1, 2, 3])  # the rows landed with the marker

    recover(epochs.open(), dry_run=False)  # the recovery DAG commits the epoch again
    assert epochs.pipeline.state(epoch) is EpochState.COMMITTED
    assert epochs.table() == expected([1, 2, 3])
    assert [m[2] for m in epochs.markers()] == [1, epoch]
    epochs.run(rows([4]))  # and the next epoch runs
    assert epochs.table() == expected([1, 2, 3, 4])


@pytest.fixture
def resolved_conninfo(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The only secret resolver (Airflow's, if imported, is set aside): it gives the sinks named
    ``postgres_conn_id = "db"`` the conninfo set in the dict."""
    found: dict[str, str] = {}

    def resolve(options: Any) -> dict[str, str]:
        return {"conninfo": found["conninfo"]} if options.get("postgres_conn_id") == "db" else {}

    monkeypatch.setattr(sink_base, "SECRET_RESOLVERS", [resolve])
    return found


def test_a_database_down_at_the_commit_leaves_the_epoch_committing_and_a_retry_lands_it(
        tmp_path: Path, postgres_db: str, resolved_conninfo: dict[str, str]) -> None:
    epochs = Epochs(tmp_path / "store", postgres_db, create_table=True)
    epochs.options = {"type": "postgres", "table": "public.orders", "postgres_conn_id": "db", "create_table": True}
    resolved_conninfo["conninfo"] = postgres_db
    epoch, decision, reason = epochs.decided(rows([1, 2]))
    assert decision is Decision.COMMIT, reason
    from tests.postgres_server import free_port

    resolved_conninfo["conninfo"] = f"host=127.0.0.1 port={free_port()} user=postgres connect_timeout=2"
    with pytest.raises(StorageError, match="cannot connect to PostgreSQL") as raised:
        epochs.pipeline.commit(epoch)
    assert raised.value.retryable
    assert epochs.pipeline.state(epoch) is EpochState.COMMITTING
    assert "port" not in str(epochs.pipeline.txlog.read_decision(epoch))  # no connection string in the store

    resolved_conninfo["conninfo"] = postgres_db  # the database is back
    epochs.open().commit(epoch)
    assert epochs.pipeline.state(epoch) is EpochState.COMMITTED
    assert epochs.table() == expected([1, 2])


def test_a_role_with_only_insert_and_select_commits_once_the_bookkeeping_tables_exist(
        tmp_path: Path, postgres_db: str) -> None:
    epochs = Epochs(tmp_path / "store", postgres_db, create_table=True)
    epochs.run(rows([1]))  # the first commit (an owner of the schema) creates the tables
    epochs.execute("CREATE ROLE writer LOGIN; GRANT SELECT, INSERT ON ALL TABLES IN SCHEMA public TO writer")
    epochs.options = {**epochs.options, "conninfo": f"{postgres_db} user=writer"}
    epochs.run(rows([2, 3]))

    assert epochs.table() == expected([1, 2, 3])
    assert len(epochs.markers()) == 2


def test_a_role_without_insert_on_the_table_is_refused_before_the_decision(tmp_path: Path, postgres_db: str) -> None:
    epochs = Epochs(tmp_path / "store", postgres_db, create_table=True)
    epochs.run(rows([1]))
    epochs.execute("CREATE ROLE reader LOGIN; GRANT SELECT ON ALL TABLES IN SCHEMA public TO reader")
    epochs.options = {**epochs.options, "conninfo": f"{postgres_db} user=reader"}
    reason = epochs.refused(rows([2]))

    assert "the role 'reader' lacks INSERT on \"public\".\"orders\"" in reason
    assert epochs.table() == expected([1])


# -- refusals only the table knows: found by a trial load before the decision ----------------------
def rows_of(**columns: list[Any]) -> pa.Table:
    return pa.table(columns)


#: kind -> (the table, an epoch it refuses, a good epoch after it, the sink's options, words the reason holds)
TABLE_REFUSALS: dict[str, tuple[str, pa.Table, pa.Table, dict[str, Any], list[str]]] = {
    "primary_key_re_delivered_by_an_append": (
        "(id bigint PRIMARY KEY, name text)", rows_of(id=[1, 3], name=["a", "c"]), rows_of(id=[3], name=["c"]), {},
        ["orders_pkey", "Key (id)=(1) already exists", "mode 'upsert'"]),
    "not_null_given_a_null": (
        "(id bigint, name text NOT NULL)", rows_of(id=[2, 3], name=["b", None]), rows_of(id=[3], name=["c"]), {},
        ["column 'name'", "not-null", "NULLs"]),
    "varchar_too_short": (
        "(id bigint, name varchar(3))", rows_of(id=[2], name=["toolong"]), rows_of(id=[3], name=["abc"]), {},
        ["character varying(3)", "column 'name'", "widen the column"]),
    "check_constraint": (
        "(id bigint, name text, CONSTRAINT id_positive CHECK (id > 0))", rows_of(id=[-2], name=["b"]),
        rows_of(id=[3], name=["c"]), {}, ["id_positive", "Failing row contains (-2, b)", "constraint"]),
    "numeric_overflow": (
        "(id numeric(3, 1), name text)", rows_of(id=[12345], name=["b"]), rows_of(id=[3], name=["c"]), {},
        ["numeric field overflow", "column 'id'", "numeric(p,s)"]),
    "nul_character_in_text": (
        "(id bigint, name text)", rows_of(id=[2], name=["b\x00b"]), rows_of(id=[3], name=["c"]), {},
        ["0x00", "column 'name'", "NUL"]),
    "deferred_unique_constraint": (
        "(id bigint, name text, CONSTRAINT id_unique UNIQUE (id) DEFERRABLE INITIALLY DEFERRED)",
        rows_of(id=[1], name=["again"]), rows_of(id=[3], name=["c"]), {}, ["id_unique", "Key (id)=(1)"]),
    "char_keys_equal_after_padding": (
        "(name char(4) PRIMARY KEY, id bigint)", rows_of(id=[2, 3], name=["b", "b  "]),
        rows_of(id=[3], name=["c"]), {"mode": "upsert", "merge_keys": ["name"]}, ["orders_pkey", "char(n)"]),
}


@pytest.mark.parametrize("kind", list(TABLE_REFUSALS))
def test_a_refusal_only_the_table_knows_aborts_the_epoch_before_the_decision_and_the_next_epoch_commits(
        tmp_path: Path, postgres_db: str, kind: str) -> None:
    ddl, bad, good, options, words = TABLE_REFUSALS[kind]
    epochs = Epochs(tmp_path / "store", postgres_db, **options)
    epochs.execute(f"CREATE TABLE public.orders {ddl}")
    epochs.run(rows_of(id=[1], name=["a"]))
    before = epochs.query("SELECT id::text, name FROM public.orders ORDER BY 1")

    reason = epochs.refused(bad)

    for word in words:
        assert word in reason, f"{word!r} not in the refusal: {reason}"
    assert "public.orders" in reason and "epoch 2" in reason
    assert epochs.query("SELECT id::text, name FROM public.orders ORDER BY 1") == before
    assert [m[2] for m in epochs.markers()] == [1]
    epochs.run(good)  # the next epoch, with good rows, commits
    assert len(epochs.query("SELECT 1 FROM public.orders")) == len(before) + good.num_rows


def test_a_row_the_table_refuses_after_the_decision_fails_at_once_naming_the_way_out(
        tmp_path: Path, postgres_db: str) -> None:
    epochs = Epochs(tmp_path / "store", postgres_db)
    epochs.execute("CREATE TABLE public.orders (id bigint PRIMARY KEY, name text, amount float8)")
    epoch, decision, reason = epochs.decided(rows([1, 2]))
    assert decision is Decision.COMMIT, reason
    epochs.execute("INSERT INTO public.orders VALUES (2, 'another writer', 0)")  # after the decision

    with pytest.raises(core_tables.SinkRefusedError, match="orders_pkey") as raised:
        epochs.pipeline.commit(epoch)

    assert not raised.value.retryable  # a UniqueViolation of the rows is not retried as transient
    assert "--skip-sink orders" in str(raised.value)
    assert epochs.pipeline.state(epoch) is EpochState.COMMITTING
    assert epochs.table() == [(2, "another writer", 0.0)]


def test_a_committer_holding_the_marker_rows_lock_times_out_the_retries_which_stay_committing(
        tmp_path: Path, postgres_db: str) -> None:
    epochs = Epochs(tmp_path / "store", postgres_db, create_table=True, lock_timeout_s=0.2)
    epochs.run(rows([1]))
    epoch, decision, reason = epochs.decided(rows([2, 3]))
    assert decision is Decision.COMMIT, reason
    store_id = epochs.pipeline.store_id()
    holder = psycopg.connect(postgres_db)  # a committer paused inside its transaction, holding the marker row
    holder.execute("INSERT INTO public.seatunnel_ckpt_epochs (store_id, pipeline, sink, epoch, target_table, store, "
                   "rows) VALUES (%s, 'orders', 'orders', %s, 'public.orders', 'paused', 2)", (store_id, epoch))
    release = threading.Timer(20, holder.rollback)  # without a lock timeout the commit waits for this
    release.start()
    try:
        started = time.monotonic()
        with pytest.raises(StorageError, match="lock timeout") as raised:
            epochs.open().commit(epoch)
        assert time.monotonic() - started < 15
        assert raised.value.retryable
        assert epochs.pipeline.state(epoch) is EpochState.COMMITTING
    finally:
        release.cancel()
        holder.rollback()
        holder.close()

    epochs.open().commit(epoch)  # the paused committer gone, the next retry lands the epoch
    assert epochs.pipeline.state(epoch) is EpochState.COMMITTED
    assert epochs.table() == expected([1, 2, 3])


def test_a_committer_paused_inside_its_transaction_is_ended_by_the_server_and_the_next_commit_lands(
        tmp_path: Path, postgres_db: str) -> None:
    epochs = Epochs(tmp_path / "store", postgres_db, create_table=True, idle_in_transaction_timeout_s=0.5)
    epochs.run(rows([1]))
    epoch, decision, reason = epochs.decided(rows([2, 3]))
    assert decision is Decision.COMMIT, reason
    options = checked(PostgresSinkOptions, epochs.options, "sink 'orders'")
    # The server ends the paused session; its client learns it only when it speaks again (here: at the end).
    with pytest.raises(psycopg.errors.IdleInTransactionSessionTimeout), \
            postgres_tables.connect(postgres_db, options, "the paused committer") as paused:
        paused.execute("BEGIN")  # a committer's session as the sink opens it, then quiet inside its transaction
        paused.execute("INSERT INTO public.seatunnel_ckpt_epochs (store_id, pipeline, sink, epoch, target_table, "
                       "store, rows) VALUES (%s, 'orders', 'orders', %s, 'public.orders', 'paused', 2)",
                       (epochs.pipeline.store_id(), epoch))
        started = time.monotonic()
        epochs.open().commit(epoch)  # waits on the marker row until the server ends the paused session
        assert time.monotonic() - started < 10
    assert epochs.pipeline.state(epoch) is EpochState.COMMITTED
    assert epochs.table() == expected([1, 2, 3])


def test_the_sessions_timeouts_are_bounded_options_checked_when_the_sink_is_declared() -> None:
    options = checked(PostgresSinkOptions, {"table": "t", "conninfo": "host=db", "lock_timeout_s": 5}, "sink 'o'")
    assert options.session_settings() == {"lock_timeout": "5000", "statement_timeout": "3600000",
                                          "idle_in_transaction_session_timeout": "60000"}
    assert options.to_dict()["lock_timeout_s"] == 5.0 and options.to_dict()["statement_timeout_s"] == 3600.0
    for bad in (0, -1, "30", True, 8 * 24 * 3600):
        with pytest.raises(ConfigError, match="option 'lock_timeout_s'"):
            checked(PostgresSinkOptions, {"table": "t", "conninfo": "host=db", "lock_timeout_s": bad}, "sink 'o'")


#: The Arrow memory pools the tests measured with (never freed: see their use).
_POOLS: list[pa.MemoryPool] = []


def test_a_large_epoch_is_loaded_batch_by_batch_within_bounded_arrow_memory(epochs: Epochs) -> None:
    count = 800_000
    ids = list(range(count))
    big = pa.table({"id": ids, "name": [f"customer-{i:012d}" for i in ids], "amount": [i * 1.5 for i in ids]},
                   schema=SCHEMA)
    epoch, decision, reason = epochs.decided(rows([count]))  # small: the table exists before the large epoch
    assert decision is Decision.COMMIT, reason
    epochs.pipeline.commit(epoch)
    staging = epochs.pipeline.staging_path(epochs.pipeline.begin("run-large").epoch, 1, "orders")
    buf = io.BytesIO()
    pq.write_table(big, buf, row_group_size=50_000)  # sixteen row groups
    epochs.pipeline.storage.write_atomic(f"{staging}/part-00000.parquet", buf.getvalue())
    large = epochs.pipeline.epochs()[-1]
    manifest = epochs.pipeline.manifest_for_staged(large, 1, "orders", "postgres://test/public.orders", count)
    manifest = dataclasses.replace(manifest, mode=SinkMode.APPEND, table=epochs.options)
    epochs.pipeline.prepare(large, "ingest", 1, run_id="run-large", sinks=[manifest])
    assert epochs.pipeline.decide(large, Decision.COMMIT, "all prepared", by="test").decision is Decision.COMMIT

    pool = pa.proxy_memory_pool(pa.default_memory_pool())  # counts what the commit allocates in Arrow
    _POOLS.append(pool)  # kept alive: a buffer it allocated must never outlive it
    previous = pa.default_memory_pool()
    pa.set_memory_pool(pool)
    try:
        epochs.pipeline.commit(large)
    finally:
        pa.set_memory_pool(previous)

    assert epochs.query(f"SELECT count(*), sum(id), count(DISTINCT name) FROM public.orders WHERE id < {count}"
                        ) == [(count, sum(ids), count)]
    decoded = big.nbytes  # the epoch's rows in Arrow memory (about 33 MB; read whole, with their CSV: 75 MB)
    assert pool.max_memory() < decoded / 3, (
        f"the commit's Arrow memory peaked at {pool.max_memory():,} bytes for {decoded:,} bytes of rows")


def test_two_stores_first_epochs_into_a_table_nobody_owns_yet_refuse_the_second_before_its_decision(
        tmp_path: Path, postgres_db: str) -> None:
    first = Epochs(tmp_path / "store-a", postgres_db, create_table=True)
    second = Epochs(tmp_path / "store-b", postgres_db, create_table=True)
    epoch, decision, reason = first.decided(rows([1]))  # decided, not yet committed: the table has no owner row
    assert decision is Decision.COMMIT, reason

    refusal = second.refused(rows([2]))

    assert "the table belongs to pipeline 'orders' of store" in refusal
    assert "DELETE FROM public.seatunnel_ckpt_owners WHERE target_table = 'public.orders'" in refusal
    first.pipeline.commit(epoch)
    first.run(rows([3]))
    assert first.table() == expected([1, 3])


# -- a replay of an append sink ------------------------------------------------------------------
def replay_from(epochs: Epochs, start: int, suffix: str, read: dict[int, list[int]]) -> int:
    """Replay epochs ``start``.. as the stage runtime does, each replayed epoch's rows (the ids it ``read``
    again, names with ``suffix``) staged below ``replayed-<epoch>/``; the replay's epoch."""
    p = epochs.pipeline
    plan = plan_replay(p, start)
    epoch, run_id = begin_replay(p, plan, reason="fix", by="test")
    staging = p.staging_path(epoch, 1, "orders")
    count = 0
    for e in plan.epochs:
        ids = read[e]
        buf = io.BytesIO()
        pq.write_table(rows(ids, suffix), buf)
        p.storage.write_atomic(f"{staging}/replayed-{e}/part-00000.parquet", buf.getvalue())
        count += len(ids)
    manifest = p.manifest_for_staged(epoch, 1, "orders", "postgres://test/public.orders", count)
    manifest = dataclasses.replace(manifest, mode=SinkMode.APPEND, table=epochs.options)
    finish_replay(p, epoch, run_id, plan, 1, sinks=[manifest], operators={}, reason="fix", by="test")
    return epoch


def test_a_replay_of_an_append_sink_leaves_every_row_once_with_the_replayed_epochs_rows_replaced(
        tmp_path: Path, postgres_db: str) -> None:
    epochs = Epochs(tmp_path / "store", postgres_db, create_table=True, epoch_column="_seatunnel_epoch")
    read = {epochs.run(rows(ids)): ids for ids in ([1, 2], [3], [4, 5])}

    replay = replay_from(epochs, 2, "-v2", read)

    assert epochs.table() == [(1, "n1", 1.5), (2, "n2", 3.0), (3, "n3-v2", 4.5), (4, "n4-v2", 6.0),
                              (5, "n5-v2", 7.5)]
    assert epochs.query("SELECT _seatunnel_epoch, count(*) FROM public.orders GROUP BY 1 ORDER BY 1") == [
        (1, 2), (replay, 3)]
    again = replay_from(epochs, 2, "-v3", read)  # a replay of a range holding the earlier replay replaces it too
    assert epochs.table() == [(1, "n1", 1.5), (2, "n2", 3.0), (3, "n3-v3", 4.5), (4, "n4-v3", 6.0),
                              (5, "n5-v3", 7.5)]
    assert epochs.query("SELECT DISTINCT _seatunnel_epoch FROM public.orders ORDER BY 1") == [(1,), (again,)]
    epochs.run(rows([6]))  # and the next epoch runs
    assert [r[0] for r in epochs.table()] == [1, 2, 3, 4, 5, 6]


def test_a_replay_of_an_append_sink_without_an_epoch_column_is_refused_when_it_is_planned(
        tmp_path: Path, postgres_db: str) -> None:
    epochs = Epochs(tmp_path / "store", postgres_db, create_table=True)
    epochs.run(rows([1]))
    epochs.run(rows([2]))
    before = epochs.pipeline.epochs()

    with pytest.raises(ReplayError, match="without an epoch_column in epoch\\(s\\) \\[2\\]") as raised:
        plan_replay(epochs.pipeline, 2)

    assert "ALTER TABLE public.orders ADD COLUMN _seatunnel_epoch bigint" in str(raised.value)
    assert epochs.pipeline.epochs() == before  # nothing begun
    assert epochs.table() == expected([1, 2])


def test_a_replay_without_rows_whose_sink_lost_its_epoch_column_is_refused_before_its_decision(
        tmp_path: Path, postgres_db: str) -> None:
    epochs = Epochs(tmp_path / "store", postgres_db, create_table=True, epoch_column="_seatunnel_epoch")
    epochs.run(rows([1]))
    epochs.run(rows([2]))
    p = epochs.pipeline
    plan = plan_replay(p, 2)  # the replayed epoch was committed with the column
    epoch, run_id = begin_replay(p, plan, reason="fix", by="test")
    lost = {k: v for k, v in epochs.options.items() if k != "epoch_column"}  # the stage's sink now lacks it
    manifest = dataclasses.replace(p.manifest_for_staged(epoch, 1, "orders", "postgres://test/public.orders", 0),
                                   mode=SinkMode.APPEND, table=lost)

    with pytest.raises(ReplayError, match="lack now"):
        finish_replay(p, epoch, run_id, plan, 1, sinks=[manifest], operators={}, reason="fix", by="test")

    assert p.state(epoch) is EpochState.ABORTED
    assert epochs.table() == expected([1, 2])
    epochs.run(rows([3]))
    assert epochs.table() == expected([1, 2, 3])


def test_two_stores_deciding_their_first_epochs_at_once_into_a_new_table_one_is_refused_before_its_decision(
        tmp_path: Path, postgres_db: str) -> None:
    for round_ in range(3):
        stores = [Epochs(tmp_path / f"store-{round_}-{n}", postgres_db, create_table=True) for n in range(2)]
        for e in stores:
            e.options = {**e.options, "table": f"public.orders_{round_}"}
        outcomes = at_once([lambda e=e: e.decided(rows([1])) for e in stores])  # the bookkeeping tables race too

        assert not [o for o in outcomes if isinstance(o, BaseException)], outcomes
        decisions = sorted(o[1].value for o in outcomes)
        assert decisions == ["abort", "commit"], outcomes
        refused = next(o for o in outcomes if o[1] is Decision.ABORT)
        assert "the table belongs to pipeline 'orders' of store" in refused[2]
