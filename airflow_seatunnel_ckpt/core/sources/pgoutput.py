"""PostgreSQL's ``pgoutput`` logical replication messages (protocol version 1), decoded into change rows.

The ``postgres_cdc`` source reads a range of a slot with
``pg_logical_slot_peek_binary_changes(..., 'proto_version', '1', 'publication_names', ...)``;
each result row's ``data`` is one message (PostgreSQL's "Logical Replication Message
Formats"): ``B`` (begin: the commit's LSN, timestamp, xid), ``R`` (a table's columns, sent
before its first change and again after its columns change), ``I`` / ``U`` / ``D``
(insert, update, delete with tuple data), ``C`` (commit), and ``T`` (truncate), ``Y``
(type), ``O`` (origin), ``M`` (logical message). Version 1 has no streaming of in-progress
transactions: the server decodes a large transaction when it commits (spilling to disk
past ``logical_decoding_work_mem``) and sends it whole, so every change arrives inside its
``B`` .. ``C`` pair, transactions in commit order.

Values arrive as text (PostgreSQL's output functions); :func:`typed_value` turns the common
types into Python values. An update's unchanged TOASTed column arrives as "unchanged" (no
value): it is taken from the old tuple when the table sends one (``REPLICA IDENTITY
FULL``), else left NULL and named in :attr:`Change.unchanged` so that whoever applies the
change keeps the value it has (never writes the NULL).

Pure data: no database client here.
"""

from __future__ import annotations

import datetime as dt
import struct
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from airflow_seatunnel_ckpt.core.errors import CheckpointError

#: PostgreSQL's epoch for timestamps in the protocol (microseconds since 2000-01-01 UTC).
PG_EPOCH = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)

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


@dataclass
class Change:
    """One decoded change: its transaction's commit position and the row's columns (text values)."""

    op: str
    table: str
    #: The commit record's LSN of the change's transaction: the order of transactions.
    lsn: int
    #: The change's place in its transaction (1, 2, ...): with ``lsn``, the order of changes.
    seq: int
    commit_ts: dt.datetime
    xid: int
    #: Column -> text value (None: NULL). A delete carries the key (or every column, with FULL identity).
    values: dict[str, str | None]
    #: Columns of an update whose TOASTed value did not change and is not in the message.
    unchanged: list[str] = field(default_factory=list)


class _Reader:
    """Big-endian reads over one message."""

    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def take(self, n: int) -> bytes:
        if self.at + n > len(self.data):
            raise DecodeError(f"pgoutput message {self.data[:1]!r} ends early: wanted {n} bytes at {self.at}, "
                              f"it has {len(self.data)}")
        out = self.data[self.at:self.at + n]
        self.at += n
        return out

    def int8(self) -> int:
        return self.take(1)[0]

    def int16(self) -> int:
        return int(struct.unpack(">h", self.take(2))[0])

    def int32(self) -> int:
        return int(struct.unpack(">i", self.take(4))[0])

    def uint32(self) -> int:
        return int(struct.unpack(">I", self.take(4))[0])

    def int64(self) -> int:
        return int(struct.unpack(">q", self.take(8))[0])

    def string(self) -> str:
        end = self.data.index(b"\0", self.at)
        out = self.data[self.at:end].decode()
        self.at = end + 1
        return out


#: A tuple column's value: text, NULL (None) or unchanged TOAST (this marker).
UNCHANGED = object()


def _tuple(reader: _Reader) -> list[Any]:
    values: list[Any] = []
    for _ in range(reader.int16()):
        kind = reader.take(1)
        if kind == b"n":
            values.append(None)
        elif kind == b"u":
            values.append(UNCHANGED)
        elif kind in (b"t", b"b"):
            values.append(reader.take(reader.int32()).decode() if kind == b"t" else reader.take(reader.int32()))
        else:
            raise DecodeError(f"pgoutput tuple column of unknown kind {kind!r}")
    return values


def timestamp(micros: int) -> dt.datetime:
    """A protocol timestamp (microseconds since 2000-01-01 UTC) as an aware datetime."""
    return PG_EPOCH + dt.timedelta(microseconds=micros)


class Decoder:
    """Turns a slot's messages, in order, into :class:`Change` rows (keeps the relations seen)."""

    def __init__(self, primary_keys: Mapping[str, Sequence[str]] | None = None) -> None:
        """``primary_keys``: ``schema.table`` -> its key columns, for tables of ``REPLICA IDENTITY FULL``
        (whose relation message flags every column), so that an update of their key is seen as one."""
        self.relations: dict[int, Relation] = {}
        self.primary_keys = {t: list(k) for t, k in (primary_keys or {}).items()}
        self._begin: tuple[int, dt.datetime, int] | None = None
        self._seq = 0

    def changes(self, messages: Iterable[bytes]) -> Iterator[Change]:
        """The changes of ``messages`` (every one inside a ``B`` .. ``C`` pair)."""
        for message in messages:
            yield from self.message(bytes(message))

    def message(self, data: bytes) -> list[Change]:
        """Decode one message; the changes it carries: none, one, or two for an update of the key (a
        delete of the old key, then the update, so that whoever applies them by key removes the old row)."""
        reader = _Reader(data)
        kind = reader.take(1)
        if kind == b"B":
            final_lsn, ts, xid = reader.int64(), reader.int64(), reader.uint32()
            self._begin, self._seq = (final_lsn, timestamp(ts), xid), 0
            return []
        if kind == b"C":
            self._begin = None
            return []
        if kind == b"R":
            oid, schema, name = reader.uint32(), reader.string(), reader.string()
            identity = chr(reader.int8())
            columns = []
            for _ in range(reader.int16()):
                flags = reader.int8()
                columns.append(Column(reader.string(), reader.uint32(), reader.int32(), bool(flags & 1)))
            self.relations[oid] = Relation(oid, schema or "pg_catalog", name, identity, tuple(columns))
            return []
        if kind in (b"Y", b"O", b"M"):  # types, origins, logical messages: nothing to apply
            return []
        if kind == b"T":
            count = reader.uint32()
            reader.int8()
            names = [self._relation(reader.uint32()).table for _ in range(count)]
            raise DecodeError(f"a TRUNCATE of published table(s) {names} in the transaction committed at "
                              f"LSN {lsn_text(self._begin[0]) if self._begin else '?'}: the rows it removed "
                              "cannot be turned into deletes")
        if kind in (b"I", b"U", b"D"):
            return self._row(kind, reader)
        raise DecodeError(f"unknown pgoutput message {kind!r}")

    def _relation(self, oid: int) -> Relation:
        relation = self.relations.get(oid)
        if relation is None:
            raise DecodeError(f"a change of relation {oid} before its relation message")
        return relation

    def _row(self, kind: bytes, reader: _Reader) -> list[Change]:
        if self._begin is None:
            raise DecodeError(f"a {kind!r} change outside a transaction")
        relation = self._relation(reader.uint32())
        names = [c.name for c in relation.columns]
        old: list[Any] | None = None
        part = old_part = reader.take(1)
        if part in (b"K", b"O"):
            old = _tuple(reader)
            if kind == b"U":
                part = reader.take(1)
        if kind == b"D":
            assert old is not None
            # A key-only tuple (K) has NULL in the non-key columns: only the key is named.
            values = {n: v for n, v, c in zip(names, old, relation.columns, strict=True) if part == b"O" or c.key}
            unchanged: list[str] = []
        else:
            if part != b"N":
                raise DecodeError(f"pgoutput {kind!r} message of {relation.table} without its new tuple")
            new = _tuple(reader)
            values, unchanged = {}, []
            for index, (name, value) in enumerate(zip(names, new, strict=True)):
                if value is UNCHANGED:
                    # The old tuple of REPLICA IDENTITY FULL holds the value, detoasted.
                    if old is not None and part == b"N" and old[index] is not UNCHANGED and len(old) == len(new):
                        value = old[index]
                    else:
                        unchanged.append(name)
                        value = None
                values[name] = value
        out = []
        if kind == b"U" and old is not None:
            moved = self._moved_from(relation, old, old_part, values, unchanged)
            if moved is not None:
                out.append(self._change("delete", relation, moved, []))
        op = {b"I": "insert", b"U": "update", b"D": "delete"}[kind]
        return [*out, self._change(op, relation, values, unchanged)]

    def _change(self, op: str, relation: Relation, values: dict[str, Any], unchanged: list[str]) -> Change:
        assert self._begin is not None
        self._seq += 1
        lsn, ts, xid = self._begin
        return Change(op, relation.table, lsn, self._seq, ts, xid, values, unchanged)

    def _moved_from(self, relation: Relation, old: list[Any], part: bytes, new: dict[str, Any],
                    unchanged: list[str]) -> dict[str, Any] | None:
        """An update's old row as a delete carries it (``K``: its key, ``O``: every column) when the update
        changed the key, else None. A FULL identity flags every column: its key is the catalog's primary key."""
        names = [c.name for c in relation.columns]
        if relation.replica_identity == "f":
            keys = [k for k in self.primary_keys.get(relation.table, []) if k in names]
        else:
            keys = [c.name for c in relation.columns if c.key]
        before = dict(zip(names, old, strict=True))
        if not keys or all(before[k] is UNCHANGED or k in unchanged or before[k] == new.get(k) for k in keys):
            return None
        return {n: v for n, v in before.items() if v is not UNCHANGED and (part == b"O" or n in keys)}


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
