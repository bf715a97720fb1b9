"""Incremental queries of a PostgreSQL table: a high-water mark of one column as an epoch's position.

For databases without logical replication. An epoch's offsets (JSON, pinned before the read)::

    {"table": "<schema>.<name>", "column": "<incremental column>", "keys": ["<key column>", ...],
     "low": "<value>" | None, "low_keys": ["<key>", ...],   # the previous epoch's high and its keys
     "high": "<value>" | None, "high_keys": ["<key>", ...]}  # the rows at ``high`` the epoch reads

Values are the column's text form, keys each row's key as ``jsonb_build_array(key columns)``
text. The epoch reads the rows with ``low < column < high``, those at ``high`` whose keys the
plan saw (``high_keys``), and those at ``low`` the previous epoch did not read (not in
``low_keys``): rows that share the boundary value are each read once, including rows that
arrive with that value after the plan (the next epoch reads them). ``high`` is the position.

A row committed after the plan with a value below ``high`` would be missed. The plan takes
``high`` in a snapshot and then waits (``in_flight_timeout_s``) until every transaction of
the database that was open when the snapshot was taken has ended, so their rows are read.
Hence the guarantee: every row is read once if its value is not below the values of rows
committed before it started (a sequence, an identity column, ``now()`` or
``clock_timestamp()`` at write time). A value written smaller than one already planned
(a back-dated timestamp) is missed; deletes are never seen; an update is read again only if
it moves the column past the position (to the epoch that then reads it).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from airflow_seatunnel_ckpt.core.errors import CheckpointError
from airflow_seatunnel_ckpt.core.sources.options import PostgresQuerySourceOptions
from airflow_seatunnel_ckpt.core.sources.pgoutput import Column
from airflow_seatunnel_ckpt.core.sources.postgres_cdc import connect


class QueryError(CheckpointError):
    """A ``postgres_query`` source cannot plan or read (no such table or column, no key, a long transaction)."""


def last_position(history: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The offsets of the newest committed epoch that read rows up to a value (its ``high``)."""
    for entry in reversed(history):
        offsets = entry.get("offsets") or {}
        if offsets.get("high") is not None:
            return dict(offsets)
    return None


class PostgresQuery:
    """The plan and the read of one ``postgres_query`` source (psycopg 3)."""

    def __init__(self, options: PostgresQuerySourceOptions, where: str) -> None:
        self.options, self.where = options, where

    def connect(self) -> contextlib.AbstractContextManager[Any]:
        """An autocommit connection with the source's bounded waits."""
        return connect(self.options, self.where, QueryError)

    def columns(self, conn: Any) -> list[Column]:
        """The table's columns now (name, type, primary key)."""
        try:
            rows = conn.execute(
                "SELECT a.attname, a.atttypid::bigint, a.atttypmod, coalesce(a.attnum = ANY(i.indkey), false) "
                "FROM pg_attribute a LEFT JOIN pg_index i ON i.indrelid = a.attrelid AND i.indisprimary "
                "WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
                (self.options.table,)).fetchall()
        except Exception as exc:
            raise QueryError(f"{self.where}: cannot read the columns of {self.options.table}: "
                             f"{str(exc).strip()}") from exc
        return [Column(str(n), int(t), int(m), bool(k)) for n, t, m, k in rows]

    def keys(self, columns: Sequence[Column]) -> list[str]:
        """The key columns (given, or the primary key), checked."""
        names = [c.name for c in columns]
        if self.options.incremental_column not in names:
            raise QueryError(f"{self.where}: {self.options.table} has no column {self.options.incremental_column!r} "
                             f"(incremental_column); it has {names}")
        keys = list(self.options.key_columns) or [c.name for c in columns if c.key]
        if not keys:
            raise QueryError(f"{self.where}: {self.options.table} has no primary key; give key_columns (columns "
                             "that tell its rows apart) so that rows sharing the boundary value are read once")
        missing = sorted(set(keys) - set(names))
        if missing:
            raise QueryError(f"{self.where}: key_columns {missing} are not columns of {self.options.table} ({names})")
        return keys

    def _sql(self, keys: Sequence[str], type_name: str) -> dict[str, Any]:
        from psycopg import sql

        return {"table": sql.Identifier(*self.options.table.split(".")),
                "col": sql.Identifier(self.options.incremental_column),
                "key": sql.SQL("jsonb_build_array({})::text").format(
                    sql.SQL(", ").join(sql.Identifier(k) for k in keys)),
                "type": sql.SQL(type_name)}

    def plan(self, history: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """This epoch's offsets (module docs): ``high`` from a snapshot, after the transactions open then ended."""
        from psycopg import sql

        last = last_position(history)
        with self.connect() as conn:
            columns = self.columns(conn)
            keys = self.keys(columns)
            type_name = self._type(conn)
            q = self._sql(keys, type_name)
            conn.autocommit = False
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            taken_at = conn.execute("SELECT clock_timestamp()").fetchone()[0]
            (high,) = conn.execute(sql.SQL("SELECT max({col})::text FROM {table}").format(**q)).fetchone()
            high_keys: list[str] = []
            if high is not None:
                high_keys = sorted(k for (k,) in conn.execute(
                    sql.SQL("SELECT {key} FROM {table} WHERE {col} = CAST(%s AS {type})").format(**q), (high,)))
            conn.rollback()
            conn.autocommit = True
            self._wait_for_open_transactions(conn, taken_at)
        if last is not None and high is not None and last["high"] is not None:
            # A value below the position (rows deleted, or the column moved back): keep the position.
            with self.connect() as conn:
                below = conn.execute(sql.SQL("SELECT CAST(%s AS {type}) < CAST(%s AS {type})").format(type=q["type"]),
                                     (high, last["high"])).fetchone()[0]
            if below:
                high, high_keys = last["high"], list(last["high_keys"])
        if last is not None and high is None:
            high, high_keys = last["high"], list(last["high_keys"])
        return {"table": self.options.table, "column": self.options.incremental_column, "keys": keys,
                "low": last["high"] if last else None, "low_keys": list(last["high_keys"]) if last else [],
                "high": high, "high_keys": high_keys}

    def _type(self, conn: Any) -> str:
        (type_name,) = conn.execute(
            "SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = %s::regclass AND attname = %s",
            (self.options.table, self.options.incremental_column)).fetchone()
        return str(type_name)

    def _wait_for_open_transactions(self, conn: Any, taken_at: Any) -> None:
        """Wait until every transaction of the database open at ``taken_at`` (other than ours) ended."""
        deadline = time.monotonic() + self.options.in_flight_timeout_s
        while True:
            open_ = conn.execute(
                "SELECT pid, xact_start, state, left(query, 80) FROM pg_stat_activity WHERE datname = "
                "current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend' AND "
                "xact_start IS NOT NULL AND xact_start <= %s", (taken_at,)).fetchall()
            if not open_:
                return
            if time.monotonic() > deadline:
                raise QueryError(
                    f"{self.where}: transactions open since before the plan's snapshot of {self.options.table} "
                    f"did not end within in_flight_timeout_s={self.options.in_flight_timeout_s}: "
                    f"{[(pid, str(start), state, query) for pid, start, state, query in open_]}. Their rows may carry "
                    f"{self.options.incremental_column} values below the epoch's position, so the epoch fails before "
                    "its decision and is planned again on retry; end those transactions or raise the timeout")
            time.sleep(0.1)

    def rows(self, offsets: Mapping[str, Any], columns: Sequence[Column]) -> Iterator[tuple[str | None, ...]]:
        """The rows the pinned offsets describe, as text values in ``columns``' order."""
        from psycopg import sql

        if offsets.get("high") is None:
            return
        q = self._sql(list(offsets["keys"]), "")
        with self.connect() as conn:
            q["type"] = sql.SQL(self._type(conn))
            low, high = offsets.get("low"), offsets["high"]
            between = sql.SQL("({col} < CAST(%(high)s AS {type}) OR ({col} = CAST(%(high)s AS {type}) AND {key} = "
                              "ANY(%(high_keys)s)))").format(**q)
            if low is not None:
                between = sql.SQL("{between} AND ({col} > CAST(%(low)s AS {type}) OR ({col} = CAST(%(low)s AS {type}) "
                                  "AND NOT {key} = ANY(%(low_keys)s)))").format(between=between, **q)
            query = sql.SQL("SELECT {cols} FROM {table} WHERE {between}").format(
                cols=sql.SQL(", ").join(sql.SQL("{}::text").format(sql.Identifier(c.name)) for c in columns),
                between=between, **q)
            conn.autocommit = False
            with conn.cursor(name="rows") as cur:
                cur.execute(query, {"low": low, "high": high, "low_keys": list(offsets.get("low_keys") or []),
                                    "high_keys": list(offsets.get("high_keys") or [])})
                yield from cur
            conn.rollback()
