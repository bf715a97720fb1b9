"""Incremental queries of a PostgreSQL table: a high-water mark of one column as an epoch's position.

For databases without logical replication: an epoch reads the rows between the previous
epoch's ``high`` and its own (the boundary rows by their keys), after waiting for the
transactions open when ``high`` was taken. docs/CDC.md ("Incremental queries") has the
offsets, the guarantee and its limits.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from airflow_seatunnel_ckpt.core.errors import CheckpointError
from airflow_seatunnel_ckpt.core.sources.base import last_read
from airflow_seatunnel_ckpt.core.sources.options import PostgresQuerySourceOptions
from airflow_seatunnel_ckpt.core.sources.pgoutput import Column, output_columns
from airflow_seatunnel_ckpt.core.sources.postgres_cdc import connect, table_columns


class QueryError(CheckpointError):
    """A ``postgres_query`` source cannot plan or read (no such table or column, no key, a long transaction)."""


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
            return table_columns(conn, self.options.table)
        except Exception as exc:
            raise QueryError(f"{self.where}: cannot read the columns of {self.options.table}: "
                             f"{str(exc).strip()}") from exc

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

        last = last_read(history, "high")
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
        offsets = {"table": self.options.table, "column": self.options.incremental_column, "keys": keys,
                   "low": last["high"] if last else None, "low_keys": list(last["high_keys"]) if last else [],
                   "high": high, "high_keys": high_keys}
        # After the wait: the rows of transactions open at the snapshot are committed and counted.
        with self.connect() as conn:
            offsets["table_oid"], offsets["rows"] = self._identity(conn, offsets)
        return offsets

    def _identity(self, conn: Any, offsets: Mapping[str, Any]) -> tuple[int, int]:
        """The table's oid (a table dropped and created again under its name has another) and how many
        rows the range ``offsets`` describe holds now."""
        from psycopg import sql

        (oid,) = conn.execute("SELECT %s::regclass::oid::bigint", (self.options.table,)).fetchone()
        if offsets.get("high") is None:
            return int(oid), 0
        where, params = self._between(conn, offsets)
        (count,) = conn.execute(sql.SQL("SELECT count(*) FROM {table} WHERE {where}").format(
            table=sql.Identifier(*self.options.table.split(".")), where=where), params).fetchone()
        return int(oid), int(count)

    def pinned_gone(self, offsets: Mapping[str, Any], *, rows: bool) -> list[str]:
        """What of the pinned range is not there as planned: another table under the name (a read's
        check), and with ``rows`` (a replay's) rows of the range deleted, moved out or added since."""
        if offsets.get("table_oid") is None:  # planned before ranges carried their identity
            return []
        with self.connect() as conn:
            try:
                oid, count = self._identity(conn, offsets)
            except Exception as exc:  # the table is gone: no such relation
                return [f"{self.options.table} cannot be read: {str(exc).strip()}"]
        if oid != int(offsets["table_oid"]):
            return [f"{self.options.table} is another table now (oid {oid}, the epoch planned oid "
                    f"{offsets['table_oid']}): it was dropped and created again"]
        if rows and offsets.get("rows") is not None and count != int(offsets["rows"]):
            return [f"{self.options.table} holds {count} rows in the epoch's range of "
                    f"{offsets['column']} ({offsets.get('low')!r}..{offsets.get('high')!r}), the epoch planned "
                    f"{offsets['rows']}: rows were deleted, updated out of the range or written into it since"]
        return []

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
        with self.connect() as conn:
            where, params = self._between(conn, offsets)
            query = sql.SQL("SELECT {cols} FROM {table} WHERE {where}").format(
                cols=output_columns([c.name for c in columns]),
                table=sql.Identifier(*self.options.table.split(".")), where=where)
            conn.autocommit = False
            with conn.cursor(name="rows") as cur:
                cur.execute(query, params)
                yield from cur
            conn.rollback()

    def _between(self, conn: Any, offsets: Mapping[str, Any]) -> tuple[Any, dict[str, Any]]:
        """The condition selecting the rows of the range ``offsets`` describe (module docs), with its parameters."""
        from psycopg import sql

        q = self._sql(list(offsets["keys"]), self._type(conn))
        between = sql.SQL("({col} < CAST(%(high)s AS {type}) OR ({col} = CAST(%(high)s AS {type}) AND {key} = "
                          "ANY(%(high_keys)s)))").format(**q)
        if offsets.get("low") is not None:
            between = sql.SQL("{between} AND ({col} > CAST(%(low)s AS {type}) OR ({col} = CAST(%(low)s AS {type}) "
                              "AND NOT {key} = ANY(%(low_keys)s)))").format(between=between, **q)
        return between, {"low": offsets.get("low"), "high": offsets["high"],
                         "low_keys": list(offsets.get("low_keys") or []),
                         "high_keys": list(offsets.get("high_keys") or [])}
