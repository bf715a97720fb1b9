"""PostgreSQL's ``pgoutput`` logical replication messages (protocol version 1), decoded into change rows.

:meth:`Decoder.decode` fills a :class:`ChangeColumns` (a list per column, the read's hot
path) from the messages ``pg_logical_slot_peek_binary_changes`` returns; :func:`typed_value`
and :func:`arrow_values` turn PostgreSQL's text values into Python and Arrow values. Pure
data, no database client; docs/CDC.md has the stream's rules (TOAST, large transactions).
"""

from __future__ import annotations

import datetime as dt
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from airflow_seatunnel_ckpt.core.errors import CheckpointError

#: PostgreSQL's epoch for timestamps in the protocol (2000-01-01 UTC), as microseconds since 1970-01-01 UTC.
PG_EPOCH_MICROS = 946_684_800_000_000

#: The operations a change row carries in ``_op``.
OPS = ("insert", "update", "delete")


class DecodeError(CheckpointError):
    """A replication message this decoder cannot take (a truncate, an unknown message, a short buffer)."""


@dataclass(frozen=True)
class Column:
    """One column of a table as a relation message describes it."""

    name: str
    type_oid: int
    type_modifier: int
    #: Part of the replica identity (the key a delete or an update's old tuple carries).
    key: bool


@dataclass(frozen=True)
class Relation:
    """A published table: its name and columns as of the relation message last received."""

    oid: int
    schema: str
    name: str
    #: ``d`` default (primary key), ``n`` nothing, ``f`` full, ``i`` index.
    replica_identity: str
    columns: tuple[Column, ...]

    @property
    def table(self) -> str:
        """``schema.name``."""
        return f"{self.schema}.{self.name}"


_INT16 = struct.Struct(">h").unpack_from
_INT32 = struct.Struct(">i").unpack_from
_UINT32 = struct.Struct(">I").unpack_from
#: ``B``: the commit's LSN, its timestamp (microseconds since 2000-01-01 UTC), the xid.
_BEGIN = struct.Struct(">qqI").unpack_from

#: A tuple column's value: text, NULL (None) or unchanged TOAST (this marker).
UNCHANGED = object()

#: A decoded row change: (operation, relation, values in the relation's column order, names of unchanged
#: TOASTed columns). Values are text or None (also for a column it does not carry: a delete's non-key
#: columns, an unchanged TOASTed value without an old one). A plain tuple, not an object per change: this
#: is the decoder's hot path.
RowChange = tuple[str, Relation, list[Any], list[str]]


def _tuple(data: bytes, at: int) -> tuple[list[Any], int]:
    """A TupleData at ``at``: its values (text, None, :data:`UNCHANGED`, or bytes for binary) and where it ends."""
    (count,) = _INT16(data, at)
    at += 2
    values: list[Any] = []
    append = values.append
    for _ in range(count):
        kind = data[at]
        at += 1
        if kind == 116 or kind == 98:  # t(ext), b(inary): int32 length, then the value
            (size,) = _INT32(data, at)
            at += 4
            end = at + size
            if end > len(data):
                raise DecodeError(f"pgoutput message {data[:1]!r} ends early: wanted {size} bytes at {at}, "
                                  f"it has {len(data)}")
            append(data[at:end].decode() if kind == 116 else data[at:end])
            at = end
        elif kind == 110:  # n(ull)
            append(None)
        elif kind == 117:  # u(nchanged TOAST)
            append(UNCHANGED)
        else:
            raise DecodeError(f"pgoutput tuple column of unknown kind {bytes([kind])!r}")
    return values, at


def _string(data: bytes, at: int) -> tuple[str, int]:
    end = data.index(b"\0", at)
    return data[at:end].decode(), end + 1


#: Row messages -> the operation of their changes.
_OPS = {73: "insert", 85: "update", 68: "delete"}  # I, U, D


class Decoder:
    """Turns a slot's messages, in order, into change rows of a :class:`ChangeColumns` (keeps the
    relations seen): an update of the key gives a delete of the old key, then the update, so that
    whoever applies them by key removes the old row."""

    def __init__(self, primary_keys: Mapping[str, Sequence[str]] | None = None) -> None:
        """``primary_keys``: ``schema.table`` -> its key columns, for tables of ``REPLICA IDENTITY FULL``
        (whose relation message flags every column), so that an update of their key is seen as one."""
        self.relations: dict[int, Relation] = {}
        self.primary_keys = {t: list(k) for t, k in (primary_keys or {}).items()}
        #: The open transaction's commit LSN, commit timestamp (protocol microseconds) and xid.
        self._begin: tuple[int, int, int] | None = None
        self._seq = 0
        #: Relation oid -> (the relation, its column names, the indexes of its key columns).
        self._plans: dict[int, tuple[Relation, list[str], list[int]]] = {}

    def decode(self, messages: Iterable[bytes], into: ChangeColumns, start: int, end: int) -> None:
        """Add the changes of ``messages`` whose transaction committed in ``[start, end)`` to ``into``; the
        row messages of other transactions are skipped undecoded (their relation messages still count)."""
        add, row = into.add, self._row
        for data in messages:
            kind = data[0] if data else 0
            if kind not in _OPS:
                self._message(data)
            elif self._begin is not None and start <= self._begin[0] < end:
                rows = self._message(data, row, kind)
                lsn, micros, xid = self._begin
                first = self._seq - len(rows) + 1
                for number, (op, relation, values, unchanged) in enumerate(rows):
                    add(op, relation, values, unchanged, lsn, first + number, micros, xid)
            elif self._begin is None:
                raise DecodeError(f"a {bytes([kind])!r} change outside a transaction")

    def _message(self, data: bytes, decode: Callable[..., list[RowChange]] | None = None,
                 kind: int = 0) -> list[RowChange]:
        """``decode(kind, data)`` (a row message's), else :meth:`_decode` of ``data``; a message shorter than
        it says, or malformed, as a :class:`DecodeError`."""
        try:
            return decode(kind, data) if decode is not None else self._decode(data)
        except (struct.error, IndexError, ValueError) as exc:
            if isinstance(exc, DecodeError):
                raise
            raise DecodeError(f"pgoutput message {data[:1]!r} ends early or is malformed ({len(data)} bytes: "
                              f"{exc})") from exc

    def _decode(self, data: bytes) -> list[RowChange]:
        kind = data[0]
        if kind in _OPS:
            return self._row(kind, data)
        if kind == 66:  # B
            self._begin, self._seq = _BEGIN(data, 1), 0
            return []
        if kind == 67:  # C
            self._begin = None
            return []
        if kind == 82:  # R
            (oid,) = _UINT32(data, 1)
            schema, at = _string(data, 5)
            name, at = _string(data, at)
            identity = chr(data[at])
            (count,) = _INT16(data, at + 1)
            at += 3
            columns = []
            for _ in range(count):
                flags = data[at]
                column, at = _string(data, at + 1)
                type_oid, type_modifier = _UINT32(data, at)[0], _INT32(data, at + 4)[0]
                at += 8
                columns.append(Column(column, type_oid, type_modifier, bool(flags & 1)))
            self.relations[oid] = Relation(oid, schema or "pg_catalog", name, identity, tuple(columns))
            return []
        if kind in (89, 79, 77):  # Y types, O origins, M logical messages: nothing to apply
            return []
        if kind == 84:  # T
            (count,) = _UINT32(data, 1)
            names = [self._relation(_UINT32(data, 6 + 4 * n)[0])[0].table for n in range(count)]
            raise DecodeError(f"a TRUNCATE of published table(s) {names} in the transaction committed at "
                              f"LSN {lsn_text(self._begin[0]) if self._begin else '?'}: the rows it removed "
                              "cannot be turned into deletes")
        raise DecodeError(f"unknown pgoutput message {bytes([kind])!r}")

    def _relation(self, oid: int) -> tuple[Relation, list[str], list[int]]:
        """The relation of ``oid`` with its column names and key indexes (made once per relation message)."""
        relation = self.relations.get(oid)
        if relation is None:
            raise DecodeError(f"a change of relation {oid} before its relation message")
        plan = self._plans.get(oid)
        if plan is None or plan[0] is not relation:
            names = [c.name for c in relation.columns]
            if relation.replica_identity == "f":  # FULL flags every column: the key is the catalog's
                keys = [names.index(k) for k in self.primary_keys.get(relation.table, []) if k in names]
            else:
                keys = [i for i, c in enumerate(relation.columns) if c.key]
            plan = self._plans[oid] = (relation, names, keys)
        return plan

    def _row(self, kind: int, data: bytes) -> list[RowChange]:
        if self._begin is None:
            raise DecodeError(f"a {bytes([kind])!r} change outside a transaction")
        relation, names, keys = self._relation(_UINT32(data, 1)[0])
        old: list[Any] | None = None
        part = old_part = data[5]
        at = 6
        if part == 75 or part == 79:  # K(ey) or O(ld) tuple
            old, at = _tuple(data, at)
            if kind == 85:
                part = data[at]
                at += 1
        if kind == 68:  # D
            if old is None:
                raise DecodeError(f"pgoutput {bytes([kind])!r} message of {relation.table} without its old tuple")
            self._seq += 1
            # A key-only tuple (K) has NULL in the non-key columns.
            return [("delete", relation, [None if v is UNCHANGED else v for v in old], [])]
        if part != 78:  # N(ew) tuple
            raise DecodeError(f"pgoutput {bytes([kind])!r} message of {relation.table} without its new tuple")
        values, at = _tuple(data, at)
        if len(values) != len(names):
            raise DecodeError(f"pgoutput {bytes([kind])!r} message of {relation.table} has {len(values)} "
                              f"columns, its relation {len(names)}")
        unchanged: list[str] = []
        if UNCHANGED in values:
            full = old is not None and len(old) == len(values)
            for index, value in enumerate(values):
                if value is UNCHANGED:
                    # The old tuple of REPLICA IDENTITY FULL holds the value, detoasted.
                    if full and old[index] is not UNCHANGED:  # type: ignore[index]
                        values[index] = old[index]  # type: ignore[index]
                    else:
                        unchanged.append(names[index])
                        values[index] = None
        if kind == 73:
            self._seq += 1
            return [("insert", relation, values, unchanged)]
        out: list[RowChange] = []
        if old is not None and keys and any(
                old[k] is not UNCHANGED and names[k] not in unchanged and old[k] != values[k] for k in keys):
            # The update changed the key: first a delete of the old row as a delete carries it (K: its key,
            # O: every column).
            moved = [None if v is UNCHANGED or (old_part == 75 and i not in keys) else v for i, v in enumerate(old)]
            out.append(("delete", relation, moved, []))
        out.append(("update", relation, values, unchanged))
        self._seq += len(out)
        return out


class ChangeColumns:
    """Change rows kept column by column, as the Spark source hands them to Spark (no object per change): each
    table column's text values (None: NULL or not in the row's table) and the change columns."""

    def __init__(self) -> None:
        self.count = 0
        #: Column name -> its values, one per row.
        self.values: dict[str, list[Any]] = {}
        self.meta: dict[str, list[Any]] = {n: [] for n in (
            "_table", "_op", "_lsn", "_seq", "_commit_ts", "_xid", "_unchanged_toast")}
        self._meta = tuple(self.meta.values())
        #: (table, column names) -> the value lists of those columns, and those of the other columns.
        self._plans: dict[tuple[str, tuple[str, ...]], tuple[list[list[Any]], list[list[Any]]]] = {}
        #: Relation oid -> (the relation, its plan, its table): a relation message makes a new relation object.
        self._relations: dict[int, tuple[Relation, tuple[list[list[Any]], list[list[Any]]], str]] = {}

    def _plan(self, table: str, names: Sequence[str]) -> tuple[list[list[Any]], list[list[Any]]]:
        plan = self._plans.get((table, tuple(names)))
        if plan is None:
            for name in names:
                if name not in self.values:  # a column seen first now: NULL in the rows before
                    self.values[name] = [None] * self.count
                    self._plans.clear()  # every other table's rows get NULL in it from now on
                    self._relations.clear()
            targets = [self.values[n] for n in names]
            plan = self._plans[(table, tuple(names))] = (targets, [v for n, v in self.values.items()
                                                                    if n not in names])
        return plan

    def add(self, op: str, relation: Relation, values: Sequence[Any], unchanged: list[str], lsn: int, seq: int,
            micros: int | None, xid: int | None) -> None:
        """One change of ``relation`` (``values`` in its column order)."""
        known = self._relations.get(relation.oid)
        if known is None or known[0] is not relation:
            known = self._relations[relation.oid] = (
                relation, self._plan(relation.table, [c.name for c in relation.columns]), relation.table)
        self._append(known[1], values, known[2], op, lsn, seq, micros, xid, unchanged or None)

    def add_rows(self, table: str, names: Sequence[str], rows: Iterable[Sequence[Any]], lsn: int) -> None:
        """Rows of ``table`` (``names``' values) as inserts at ``lsn`` with ``_seq`` 0: a snapshot's rows."""
        plan = self._plan(table, names)
        for row in rows:
            self._append(plan, row, table, "insert", lsn, 0, None, None, None)

    def _append(self, plan: tuple[list[list[Any]], list[list[Any]]], values: Sequence[Any], *meta: Any) -> None:
        targets, others = plan
        for target, value in zip(targets, values, strict=True):
            target.append(value)
        for other in others:
            other.append(None)
        for target, value in zip(self._meta, meta, strict=True):
            target.append(value)
        self.count += 1


def lsn_text(lsn: int) -> str:
    """An LSN as PostgreSQL prints it (``16/B374D848``)."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def lsn_value(text: str) -> int:
    """An LSN printed by PostgreSQL (``16/B374D848``) as an integer."""
    high, _, low = str(text).partition("/")
    return (int(high, 16) << 32) | int(low, 16)


# -- values --------------------------------------------------------------------------------
#: Type OIDs -> the Spark SQL type of their values (others stay text).
SPARK_TYPES = {16: "boolean", 20: "bigint", 21: "int", 23: "int", 26: "bigint", 700: "float", 701: "double",
               1082: "date", 1114: "timestamp_ntz", 1184: "timestamp", 17: "binary"}
NUMERIC = 1700


def spark_type(type_oid: int, type_modifier: int) -> str:
    """The Spark SQL type a column of this PostgreSQL type becomes (``string`` for types not listed)."""
    if type_oid == NUMERIC and type_modifier >= 4:
        precision, scale = ((type_modifier - 4) >> 16) & 0xFFFF, (type_modifier - 4) & 0xFFFF
        if precision <= 38:
            return f"decimal({precision},{scale})"
    return SPARK_TYPES.get(type_oid, "string")


def output_columns(names: Sequence[str]) -> Any:
    """A select list of the columns ``names``, each value as its type's output function writes it (what
    pgoutput sends, what :func:`typed_value` reads). Not ``::text``: it cuts char(n)'s trailing blanks (a
    key the changes then do not match), writes booleans as ``true`` and inet with its mask. ``concat``
    calls the output function (and writes NULL as '', hence the CASE)."""
    from psycopg import sql

    return sql.SQL(", ").join(sql.SQL("CASE WHEN {c} IS NULL THEN NULL ELSE concat({c}) END").format(
        c=sql.Identifier(name)) for name in names)


def typed_value(spark_type_name: str, text: str | None) -> Any:
    """``text`` (PostgreSQL's output of a value) as the Python value of ``spark_type_name``."""
    if text is None:
        return None
    if spark_type_name == "boolean":
        return text == "t"
    if spark_type_name in ("bigint", "int"):
        return int(text)
    if spark_type_name in ("float", "double"):
        return float(text)
    if spark_type_name.startswith("decimal"):
        return Decimal(text)
    if spark_type_name == "date":
        return dt.date.fromisoformat(text)
    if spark_type_name == "timestamp_ntz":
        return dt.datetime.fromisoformat(text)
    if spark_type_name == "timestamp":
        return dt.datetime.fromisoformat(text).astimezone(dt.UTC)
    if spark_type_name == "binary":
        return bytes.fromhex(text[2:]) if text.startswith("\\x") else text.encode()
    return text


def arrow_type(spark_type_name: str) -> Any:
    """The Arrow type of a Spark SQL type name of :func:`spark_type` (and ``array<string>``)."""
    import pyarrow as pa

    if spark_type_name.startswith("decimal("):
        precision, scale = spark_type_name[len("decimal("):-1].split(",")
        return pa.decimal128(int(precision), int(scale))
    if spark_type_name == "array<string>":
        return pa.list_(pa.string())
    if spark_type_name in ("timestamp", "timestamp_ntz"):  # an instant (UTC), or a wall-clock time
        return pa.timestamp("us", tz="UTC" if spark_type_name == "timestamp" else None)
    return {"boolean": pa.bool_, "bigint": pa.int64, "int": pa.int32, "float": pa.float32, "double": pa.float64,
            "date": pa.date32, "binary": pa.binary, "string": pa.string}[spark_type_name]()


def arrow_values(spark_type_name: str, texts: list[str | None]) -> Any:
    """A column of PostgreSQL's text output as a ``pyarrow.Array`` of ``spark_type_name``: the values of
    :func:`typed_value`, converted a column at a time (integers and decimals parsed by Arrow, whose
    parsers give the same values for PostgreSQL's output: digits, a sign, a point)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    target = arrow_type(spark_type_name)
    if spark_type_name in ("bigint", "int", "string") or spark_type_name.startswith("decimal"):
        return pa.array(texts, pa.string()).cast(target)
    if spark_type_name == "boolean":
        return pc.equal(pa.array(texts, pa.string()), "t")
    if spark_type_name == "timestamp_ntz":
        return pa.array([None if t is None else dt.datetime.fromisoformat(t) for t in texts], target)
    return pa.array([typed_value(spark_type_name, t) for t in texts], target)
