"""The ``postgres_query`` source's core against the real server: the high-water mark pinned per
epoch, rows sharing the boundary value read once, and transactions open at the plan waited for."""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
import pytest

from airflow_seatunnel_ckpt.core.options import checked
from airflow_seatunnel_ckpt.core.sources.options import PostgresQuerySourceOptions
from airflow_seatunnel_ckpt.core.sources.postgres_query import PostgresQuery, QueryError


def query(conninfo: str, **options: Any) -> PostgresQuery:
    opts = checked(PostgresQuerySourceOptions, {"type": "postgres_query", "conninfo": conninfo,
                                                "table": "public.events", "incremental_column": "at", **options},
                   "test")
    return PostgresQuery(opts, "postgres_query source 'events'")


def ids(source: PostgresQuery, offsets: dict[str, Any]) -> list[int]:
    with source.connect() as conn:
        columns = source.columns(conn)
    return sorted(int(row[0]) for row in source.rows(offsets, columns))


def test_rows_sharing_the_boundary_value_are_each_read_once_also_when_they_arrive_after_the_plan(
        postgres_db: str) -> None:
    db = psycopg.connect(postgres_db, autocommit=True)
    db.execute("CREATE TABLE events (id int PRIMARY KEY, at int NOT NULL)")
    db.execute("INSERT INTO events VALUES (1, 1), (2, 2), (3, 2)")
    source = query(postgres_db)
    history: list[dict[str, Any]] = []
    first = source.plan(history)
    assert (first["high"], first["high_keys"]) == ("2", ["[2]", "[3]"])
    db.execute("INSERT INTO events VALUES (4, 2)")  # after the plan, at the boundary value
    assert ids(source, first) == [1, 2, 3]  # exactly the pinned rows, not the late one
    history.append({"epoch": 1, "offsets": first})
    second = source.plan(history)
    db.execute("INSERT INTO events VALUES (5, 2), (6, 3)")  # after the second plan
    assert ids(source, second) == [4]
    history.append({"epoch": 2, "offsets": second})
    third = source.plan(history)
    assert ids(source, third) == [5, 6]
    history.append({"epoch": 3, "offsets": third})
    quiet = source.plan(history)  # nothing new: an empty epoch, the position stays
    assert ids(source, quiet) == [] and quiet["high"] == "3"


def test_the_plan_waits_for_transactions_open_at_its_snapshot_so_their_lower_values_are_read(
        postgres_db: str) -> None:
    db = psycopg.connect(postgres_db, autocommit=True)
    db.execute("CREATE TABLE events (id int PRIMARY KEY, at bigserial)")
    writer = psycopg.connect(postgres_db)
    writer.execute("INSERT INTO events (id) VALUES (1)")  # at = 1, not committed yet
    db.execute("INSERT INTO events (id) VALUES (2)")  # at = 2, committed: the high-water mark
    threading.Timer(0.5, writer.commit).start()
    started = time.monotonic()
    first = query(postgres_db).plan([])
    assert time.monotonic() - started >= 0.4 and first["high"] == "2"
    assert ids(query(postgres_db), first) == [1, 2]  # the row at 1 committed after the snapshot: not lost


def test_a_transaction_open_past_the_timeout_fails_the_plan_naming_it(postgres_db: str) -> None:
    db = psycopg.connect(postgres_db, autocommit=True)
    db.execute("CREATE TABLE events (id int PRIMARY KEY, at int)")
    idle = psycopg.connect(postgres_db)
    idle.execute("SELECT 1")  # a transaction left open
    try:
        with pytest.raises(QueryError, match=r"did not end within in_flight_timeout_s=0.3: \[\(\d+, .*idle in "
                                             r"transaction.*planned again on retry"):
            query(postgres_db, in_flight_timeout_s=0.3).plan([])
    finally:
        idle.close()


def test_a_table_without_a_key_or_the_column_is_refused_with_what_to_give(postgres_db: str) -> None:
    db = psycopg.connect(postgres_db, autocommit=True)
    db.execute("CREATE TABLE events (id int, at int)")
    with pytest.raises(QueryError, match="has no primary key; give key_columns"):
        query(postgres_db).plan([])
    with pytest.raises(QueryError, match=r"has no column 'updated' \(incremental_column\)"):
        query(postgres_db, incremental_column="updated").plan([])
    assert query(postgres_db, key_columns=["id"]).plan([])["high"] is None


def test_rows_written_by_concurrent_slow_transactions_with_tied_values_are_each_read_once_over_epochs(
        postgres_db: str) -> None:
    """A model over whole epochs: writers insert rows whose value is a 50ms clock bucket (many ties),
    holding each transaction open a while; epochs plan, read (twice: a retry reads the same), and
    commit or abort at random. Every row is read exactly once by the committed epochs."""
    import random

    db = psycopg.connect(postgres_db, autocommit=True)
    db.execute("CREATE TABLE events (id bigserial PRIMARY KEY, at bigint NOT NULL)")
    stop, failures = threading.Event(), []

    def writer(seed: int) -> None:
        rng = random.Random(seed)
        try:
            with psycopg.connect(postgres_db, autocommit=True) as conn:
                while not stop.is_set():
                    with conn.transaction():
                        conn.execute("INSERT INTO events (at) SELECT (extract(epoch FROM clock_timestamp()) * 20)"
                                     "::bigint FROM generate_series(1, %s)", (rng.randint(1, 3),))
                        time.sleep(rng.random() * 0.3)
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=writer, args=(n,), daemon=True) for n in range(3)]
    for t in threads:
        t.start()
    rng = random.Random(7)
    source = query(postgres_db, in_flight_timeout_s=5)
    history: list[dict[str, Any]] = []
    read: list[int] = []
    try:
        for _ in range(15):
            offsets = source.plan(history)
            rows = ids(source, offsets)
            assert ids(source, offsets) == rows
            if rng.random() < 0.75:
                history.append({"epoch": len(history) + 1, "offsets": offsets})
                read += rows
            time.sleep(rng.random() * 0.05)
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    assert not failures, failures
    last = source.plan(history)
    read += ids(source, last)
    everything = [int(i) for (i,) in db.execute("SELECT id FROM events").fetchall()]
    assert len(everything) > 50
    assert sorted(read) == sorted(everything)  # each row once: none lost, none twice


def test_rows_are_read_as_their_types_output_them_so_booleans_char_and_inet_keep_their_values(
        postgres_db: str) -> None:
    from airflow_seatunnel_ckpt.core.sources.pgoutput import spark_type, typed_value

    db = psycopg.connect(postgres_db, autocommit=True)
    db.execute("CREATE TABLE events (id int PRIMARY KEY, at int NOT NULL, flag boolean, code char(4), host inet)")
    db.execute("INSERT INTO events VALUES (1, 1, true, 'ab', '10.0.0.1'), (2, 1, false, NULL, NULL)")
    source = query(postgres_db)
    with source.connect() as conn:
        columns = source.columns(conn)
    rows = sorted(tuple(typed_value(spark_type(c.type_oid, c.type_modifier), v) for c, v in
                         zip(columns, row, strict=True)) for row in source.rows(source.plan([]), columns))
    assert rows == [(1, 1, True, "ab  ", "10.0.0.1"), (2, 1, False, None, None)]
