"""The ``postgres_cdc`` source's core against the real server (``wal_level=logical``): decoding,
planning from the committed history, the slot's position and the identity checks.

Each test has a database of its own (``postgres_db``); "committed history" is what the
runner hands ``plan``: ``[{"epoch": e, "offsets": <the epoch's pinned offsets>}, ...]``.
"""

from __future__ import annotations

import random
import string
import time
from types import SimpleNamespace
from typing import Any

import psycopg
import pytest

from airflow_seatunnel_ckpt.core.errors import ConfigError
from airflow_seatunnel_ckpt.core.options import checked, keyed, parse
from airflow_seatunnel_ckpt.core.sources.options import PostgresCdcSourceOptions, PostgresQuerySourceOptions
from airflow_seatunnel_ckpt.core.sources.pgoutput import (
    ChangeColumns,
    Decoder,
    lsn_text,
    lsn_value,
    spark_type,
    typed_value,
)
from airflow_seatunnel_ckpt.core.sources.postgres_cdc import (
    CdcError,
    PostgresCdc,
    ServerState,
    SlotState,
    check_identity,
    released_to,
)


def cdc(conninfo: str, **options: Any) -> PostgresCdc:
    opts = checked(PostgresCdcSourceOptions, {"type": "postgres_cdc", "conninfo": conninfo, "slot": "orders_slot",
                                              "publication": "orders_pub", "tables": ["public.orders"], **options},
                   "test")
    return PostgresCdc(opts, "postgres_cdc source 'orders'")


def setup(conninfo: str, identity: str = "DEFAULT") -> psycopg.Connection:
    conn = psycopg.connect(conninfo, autocommit=True)
    conn.execute("CREATE TABLE orders (id int PRIMARY KEY, amount numeric(10,2), note text)")
    conn.execute(f"ALTER TABLE orders REPLICA IDENTITY {identity}")
    return conn


def read(source: PostgresCdc, offsets: dict[str, Any], decoder: Decoder | None = None) -> list[SimpleNamespace]:
    """The pinned range's changes as the source reads them (column by column), a namespace per row:
    ``op``, ``lsn``, ``seq``, ``xid``, ``values`` (column -> text or None), ``unchanged``."""
    rows = ChangeColumns()
    source.read_changes(offsets, decoder or Decoder(), rows)
    meta = rows.meta
    return [SimpleNamespace(op=meta["_op"][i], lsn=meta["_lsn"][i], seq=meta["_seq"][i], xid=meta["_xid"][i],
                            values={n: v[i] for n, v in rows.values.items()},
                            unchanged=meta["_unchanged_toast"][i] or [])
            for i in range(rows.count)]


def changes(source: PostgresCdc, offsets: dict[str, Any]) -> list[tuple[Any, ...]]:
    return [(c.op, c.values.get("id"), c.values.get("amount"), c.values.get("note"), c.unchanged)
            for c in read(source, offsets)]


def flushed(conn: psycopg.Connection) -> None:
    """Wait until the WAL written so far is flushed (the test server runs with synchronous_commit=off,
    and decoding sees only flushed WAL; the WAL writer flushes within wal_writer_delay)."""
    target = conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]
    for _ in range(100):
        if conn.execute("SELECT pg_current_wal_flush_lsn() >= %s::pg_lsn", (target,)).fetchone()[0]:
            return
        time.sleep(0.05)
    raise AssertionError(f"the WAL up to {target} was not flushed in 5s")


def test_epochs_read_each_change_once_between_committed_positions_without_consuming_them(postgres_db: str) -> None:
    db = setup(postgres_db)
    db.execute("INSERT INTO orders VALUES (1, 10, 'a'), (2, 20, 'b')")
    source = cdc(postgres_db)
    first = source.plan([])
    assert first["snapshot"] and first["start"] <= first["end"]
    snapshot = sorted(v["id"] for _, v in source.snapshot_rows(first, source.columns(db, ["public.orders"])))
    assert snapshot == ["1", "2"]
    db.execute("INSERT INTO orders VALUES (3, 30, 'c')")
    db.execute("UPDATE orders SET amount = 11 WHERE id = 1")
    db.execute("DELETE FROM orders WHERE id = 2")
    flushed(db)
    history = [{"epoch": 1, "offsets": first}]
    second = source.plan(history)
    assert second["start"] == first["end"] and second["snapshot"] is None
    assert second["lsns"] == f"{lsn_text(second['start'])}..{lsn_text(second['end'])}"
    expected = [("insert", "3", "30.00", "c", []), ("update", "1", "11.00", "a", []), ("delete", "2", None, None, [])]
    assert changes(source, second) == expected
    assert changes(source, second) == expected  # a retry reads the same: the peek consumed nothing
    db.execute("INSERT INTO orders VALUES (4, 40, 'd')")
    flushed(db)
    history.append({"epoch": 2, "offsets": second})
    third = source.plan(history)
    assert third["start"] == second["end"]
    assert changes(source, third) == [("insert", "4", "40.00", "d", [])]
    # Every change belongs to one epoch: none of the second epoch's is in the third.
    lsns = [c.lsn for c in read(source, third)]
    assert all(third["start"] <= lsn < third["end"] for lsn in lsns)


def test_the_slot_moves_only_to_committed_epochs_and_keeps_the_newest_for_a_replay(postgres_db: str) -> None:
    db = setup(postgres_db)
    source = cdc(postgres_db, keep_epochs=1)
    first = source.plan([])
    db.execute("INSERT INTO orders VALUES (1, 10, 'a')")
    flushed(db)
    second = source.plan([{"epoch": 1, "offsets": first}])
    db.execute("INSERT INTO orders VALUES (2, 20, 'b')")
    flushed(db)

    def confirmed() -> int:
        return lsn_value(db.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots "
                                    "WHERE slot_name = 'orders_slot'").fetchone()[0])

    # Epoch 2 planned but not committed: the slot stays at epoch 1's start, and an aborted epoch 2's
    # plan made again reads the same changes.
    assert confirmed() == first["start"]
    again = source.plan([{"epoch": 1, "offsets": first}])
    assert changes(source, again)[:1] == [("insert", "1", "10.00", "a", [])]
    history = [{"epoch": 1, "offsets": first}, {"epoch": 2, "offsets": second}]
    third = source.plan(history)
    assert confirmed() == second["start"]  # keep_epochs=1: epoch 2 stays readable
    assert third["lag_bytes"] == third["end"] - first["start"]  # the WAL the slot kept when epoch 3 was planned
    source.check(second)  # a replay of epoch 2 can read it
    assert changes(source, second) == [("insert", "1", "10.00", "a", [])]
    assert released_to(history + [{"epoch": 3, "offsets": third}], 0) == third["end"]


def test_an_unchanged_toasted_column_is_never_turned_into_null(postgres_db: str) -> None:
    big = "".join(random.Random(1).choices(string.ascii_letters, k=20000))  # incompressible: stored out of line
    for identity, expected in (("FULL", (big, [])), ("DEFAULT", (None, ["note"]))):
        conn = psycopg.connect(postgres_db, autocommit=True)
        conn.execute("DROP TABLE IF EXISTS orders")
        conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots")
        conn.execute("DROP PUBLICATION IF EXISTS orders_pub")
        setup(postgres_db, identity)
        conn.execute("INSERT INTO orders VALUES (1, 10, %s)", (big,))
        source = cdc(postgres_db, snapshot=False)
        first = source.plan([])
        conn.execute("UPDATE orders SET amount = 11 WHERE id = 1")
        flushed(conn)
        second = source.plan([{"epoch": 1, "offsets": first}])
        ((op, key, amount, note, unchanged),) = changes(source, second)
        assert (op, key, amount) == ("update", "1", "11.00")
        assert (note, unchanged) == expected, identity


def test_an_added_column_is_in_the_rows_after_it(postgres_db: str) -> None:
    db = setup(postgres_db)
    source = cdc(postgres_db, snapshot=False)
    first = source.plan([])
    db.execute("INSERT INTO orders VALUES (1, 10, 'a')")
    db.execute("ALTER TABLE orders ADD COLUMN channel text DEFAULT 'web'")
    db.execute("INSERT INTO orders VALUES (2, 20, 'b', 'shop')")
    flushed(db)
    second = source.plan([{"epoch": 1, "offsets": first}])
    decoder = Decoder()
    rows = [(c.values.get("id"), c.values.get("channel")) for c in read(source, second, decoder)]
    assert rows == [("1", None), ("2", "shop")]
    assert [c.name for c in next(iter(decoder.relations.values())).columns][-1] == "channel"


def test_a_dropped_slot_or_a_changed_publication_fails_the_plan_and_the_read_before_anything_is_read(
        postgres_db: str) -> None:
    db = setup(postgres_db)
    db.execute("CREATE TABLE customers (id int PRIMARY KEY)")
    source = cdc(postgres_db, snapshot=False)
    first = source.plan([])
    db.execute("INSERT INTO orders VALUES (1, 10, 'a')")
    flushed(db)
    history = [{"epoch": 1, "offsets": first}]
    second = source.plan(history)
    db.execute("ALTER PUBLICATION orders_pub ADD TABLE customers")
    with pytest.raises(CdcError, match=r"publication 'orders_pub' now publishes \['public.customers', "
                                       r"'public.orders'\], the committed epochs read \['public.orders'\]"):
        source.plan(history)
    with pytest.raises(CdcError, match="now publishes"):
        changes(source, second)
    db.execute("ALTER PUBLICATION orders_pub DROP TABLE customers")
    assert len(changes(source, second)) == 1
    db.execute("SELECT pg_drop_replication_slot('orders_slot')")
    with pytest.raises(CdcError, match=r"the replication slot 'orders_slot' is gone .*pg_drop_replication_slot"):
        source.plan(history)
    # A slot created again under the name starts past the committed position: refused, not read.
    db.execute("SELECT pg_create_logical_replication_slot('orders_slot', 'pgoutput')")
    db.execute("INSERT INTO orders VALUES (2, 20, 'b')")
    flushed(db)
    with pytest.raises(CdcError, match=r"confirms LSN .*past the epoch's start .*released unread"):
        changes(source, second)


def test_a_slot_invalidated_by_max_slot_wal_keep_size_fails_the_plan_and_the_read_with_the_way_out(
        postgres_db: str) -> None:
    db = setup(postgres_db)
    source = cdc(postgres_db, snapshot=False)
    first = source.plan([])
    db.execute("INSERT INTO orders VALUES (1, 10, 'a')")
    flushed(db)
    history = [{"epoch": 1, "offsets": first}]
    second = source.plan(history)
    db.execute("ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'")
    db.execute("SELECT pg_reload_conf()")
    try:
        time.sleep(0.2)
        for _ in range(4):  # WAL segments past the slot's 1MB, removed by the checkpoint
            db.execute("INSERT INTO orders VALUES (2, 20, 'b') ON CONFLICT (id) DO UPDATE SET amount = 21")
            db.execute("SELECT pg_switch_wal()")
        db.execute("CHECKPOINT")
    finally:
        db.execute("ALTER SYSTEM RESET max_slot_wal_keep_size")
        db.execute("SELECT pg_reload_conf()")
    with pytest.raises(CdcError, match=r"the slot 'orders_slot' is invalidated \(wal_status 'lost'.*way out is a "
                                       r"new snapshot"):
        source.plan(history)
    with pytest.raises(CdcError, match="is invalidated"):
        changes(source, second)


def test_an_invalidated_slot_or_another_server_is_refused_with_the_way_out() -> None:
    offsets = {"slot": "s", "publication": "p", "tables": ["public.t"], "system_id": "7", "database": "db",
               "start": 100, "end": 200}
    slot = SlotState("pgoutput", "db", 100, 90, "reserved")
    check_identity(offsets, ServerState("7", "db", 300, ["public.t"], slot), "src", start=100)
    lost = SlotState("pgoutput", "db", 100, 90, "lost")
    with pytest.raises(CdcError, match=r"invalidated \(wal_status 'lost'.*max_slot_wal_keep_size.*a new snapshot"):
        check_identity(offsets, ServerState("7", "db", 300, ["public.t"], lost), "src", start=100)
    with pytest.raises(CdcError, match=r"taken on server 7 database 'db', this is server 8"):
        check_identity(offsets, ServerState("8", "db", 300, ["public.t"], slot), "src", start=100)


def test_values_keep_their_types_and_lsns_print_as_postgresql_does() -> None:
    assert lsn_text(lsn_value("16/B374D848")) == "16/B374D848"
    assert spark_type(1700, ((10 << 16) | 2) + 4) == "decimal(10,2)" and spark_type(25, -1) == "string"
    assert typed_value("timestamp", "2026-11-28 12:01:05.929378+00").isoformat() == "2026-11-28T12:01:05.929378+00:00"
    assert typed_value("binary", "\\x00ff") == b"\x00\xff" and typed_value("boolean", "f") is False


def test_options_are_checked_when_parsed_naming_the_nearest_option_and_refusing_a_password() -> None:
    models = keyed(PostgresCdcSourceOptions, PostgresQuerySourceOptions)
    entry = {"type": "postgres_cdc", "conninfo": "host=db dbname=shop", "slot": "orders", "publication": "orders"}
    assert parse("source", "orders", entry, models).keep_epochs == 1
    with pytest.raises(ConfigError, match=r"source 'orders' \(type 'postgres_cdc'\): unknown option 'tabels' "
                                          r"\(did you mean 'tables'\?\)"):
        parse("source", "orders", {**entry, "tabels": ["public.orders"]}, models)
    with pytest.raises(ConfigError, match="conninfo holds a password.*PGPASSFILE"):
        parse("source", "orders", {**entry, "conninfo": "host=db password=secret"}, models)
    with pytest.raises(ConfigError, match="option 'slot': value error, must be a lower-case PostgreSQL name"):
        parse("source", "orders", {**entry, "slot": "Orders-Slot"}, models)
    with pytest.raises(ConfigError, match="missing required option 'incremental_column'"):
        parse("source", "events", {"type": "postgres_query", "conninfo": "host=db", "table": "public.e"}, models)


def test_a_transaction_larger_than_the_decoding_memory_is_read_whole_in_order(postgres_db: str) -> None:
    db = setup(postgres_db)
    dbname = db.execute("SELECT current_database()").fetchone()[0]
    db.execute(f'ALTER DATABASE "{dbname}" SET logical_decoding_work_mem = \'64kB\'')  # the source's sessions spill
    source = cdc(postgres_db, snapshot=False)
    first = source.plan([])
    with db.transaction():
        db.execute("INSERT INTO orders SELECT g, g, repeat('n', 100) FROM generate_series(1, 5000) g")
        db.execute("DELETE FROM orders WHERE id <= 10")
    flushed(db)
    second = source.plan([{"epoch": 1, "offsets": first}])
    got = read(source, second)
    assert len(got) == 5010 and len({(c.lsn, c.xid) for c in got}) == 1
    assert [c.seq for c in got] == list(range(1, 5011))
    assert [c.op for c in got[-10:]] == ["delete"] * 10 and got[-1].values == {"id": "10", "amount": None, "note": None}
    spilled = db.execute("SELECT spill_txns FROM pg_stat_replication_slots WHERE slot_name = 'orders_slot'").fetchone()
    assert spilled and spilled[0] > 0  # the server decoded it through disk


@pytest.mark.parametrize("identity", ["DEFAULT", "FULL"])
def test_an_update_of_the_key_is_a_delete_of_the_old_key_then_the_update_and_other_updates_stay_one(
        postgres_db: str, identity: str) -> None:
    db = setup(postgres_db, identity)
    db.execute("INSERT INTO orders VALUES (1, 1, 'a'), (2, 2, 'b')")
    source = cdc(postgres_db, snapshot=False)
    first = source.plan([])
    db.execute("UPDATE orders SET id = 5, amount = 5 WHERE id = 1")
    db.execute("UPDATE orders SET amount = 3 WHERE id = 2")
    flushed(db)
    second = source.plan([{"epoch": 1, "offsets": first}])
    got = read(source, second, Decoder({"public.orders": ["id"]}))
    old_row = ("1.00", "a") if identity == "FULL" else (None, None)  # a FULL identity's old row is whole
    assert [(c.op, c.values.get("id"), c.values.get("amount"), c.values.get("note"), c.seq) for c in got] == [
        ("delete", "1", *old_row, 1), ("update", "5", "5.00", "a", 2), ("update", "2", "3.00", "b", 1)]
