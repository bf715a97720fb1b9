"""PostgreSQL change data capture: a logical replication slot's LSNs as an epoch's position.

An epoch reads the transactions whose commit LSN is in its pinned ``[start, end)`` with
``pg_logical_slot_peek_binary_changes`` (which consumes nothing); the slot's confirmed
position moves only in a later plan, behind committed epochs. The first epoch reads the
tables as of the slot's exported snapshot. docs/CDC.md has the offsets, identity checks
and snapshot rules.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from airflow_seatunnel_ckpt.core.errors import CheckpointError
from airflow_seatunnel_ckpt.core.sinks.base import SECRET_RESOLVERS
from airflow_seatunnel_ckpt.core.sources.base import last_read
from airflow_seatunnel_ckpt.core.sources.options import PostgresCdcSourceOptions, PostgresSourceOptions
from airflow_seatunnel_ckpt.core.sources.pgoutput import (
    OPS,
    ChangeColumns,
    Column,
    DecodeError,
    Decoder,
    lsn_text,
    lsn_value,
    output_columns,
)

log = logging.getLogger(__name__)

#: Messages fetched from the slot per round trip.
FETCH_MESSAGES = 10_000

#: The way out of a position the slot can no longer serve.
RESNAPSHOT = ("The way out is a new snapshot: drop the slot (SELECT pg_drop_replication_slot('{slot}')) and run "
              "the pipeline under a new name into emptied sinks: its first epoch creates the slot again and reads "
              "the tables whole (a replay cannot: the first epoch's snapshot is not kept)")


def conninfo(options: PostgresSourceOptions, where: str, error: type[CheckpointError]) -> str:
    """The libpq connection string of a PostgreSQL source: its ``conninfo``, or what the sinks' secret resolvers
    make of its ``postgres_conn_id`` (so the password is read where the source connects, never stored)."""
    if options.conninfo:
        return options.conninfo
    for resolve in SECRET_RESOLVERS:
        found = resolve(options.to_dict()).get("conninfo")
        if found:
            return str(found)
    raise error(f"{where}: the source names the Airflow connection {options.postgres_conn_id!r}, but nothing here "
                "reads Airflow connections, and the stage's spec brings no resolved connection of that name; run "
                "the stage from a SparkStageOperator (in its process, through Spark Connect or spark-submit), or "
                "give the source a conninfo without a password")


def connections_resolver(conninfos: Mapping[str, str]) -> Callable[[Mapping[str, Any]], dict[str, Any]]:
    """A secret resolver answering a PostgreSQL source's ``postgres_conn_id`` from ``conninfos`` (connection
    id -> conninfo): a driver outside the task's process connects with the connections the task resolved
    (their passwords in password files, never in the conninfo)."""
    def resolve(options: Mapping[str, Any]) -> dict[str, Any]:
        if options.get("type") not in ("postgres_cdc", "postgres_query"):
            return {}
        found = conninfos.get(str(options.get("postgres_conn_id") or ""))
        return {"conninfo": found} if found else {}
    return resolve


@contextmanager
def connect(options: PostgresSourceOptions, where: str, error: type[CheckpointError]) -> Iterator[Any]:
    """An autocommit connection of a PostgreSQL source with its bounded waits (psycopg 3); a
    failure to connect or a statement's failure raises ``error`` naming ``where`` (transient:
    the epoch fails before its decision and its retry reads the same pinned range)."""
    import psycopg

    try:
        conn = psycopg.connect(conninfo(options, where, error), autocommit=True, connect_timeout=30,
                               application_name="seatunnel-ckpt-source")
    except psycopg.OperationalError as exc:
        raise error(f"{where}: cannot connect to PostgreSQL: {str(exc).strip()}; check the connection and "
                    "retry") from exc
    with conn:
        try:
            for name, value in options.session_settings().items():
                conn.execute("SELECT set_config(%s, %s, false)", (name, value))
            yield conn
        except psycopg.Error as exc:  # a timeout, the slot in use by another reader, a lost connection
            raise error(f"{where}: PostgreSQL failed: {type(exc).__name__}: {str(exc).strip()}. The epoch fails "
                        "before its decision; its retry reads the same pinned range") from exc


def table_columns(conn: Any, table: str) -> list[Column]:
    """A table's columns now (name, type, primary key), in order."""
    rows = conn.execute(
        "SELECT a.attname, a.atttypid::bigint, a.atttypmod, coalesce(a.attnum = ANY(i.indkey), false) "
        "FROM pg_attribute a LEFT JOIN pg_index i ON i.indrelid = a.attrelid AND i.indisprimary "
        "WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
        (table,)).fetchall()
    return [Column(str(n), int(t), int(m), bool(k)) for n, t, m, k in rows]


class CdcError(CheckpointError):
    """A ``postgres_cdc`` source cannot plan or read its pinned range (slot, publication or server changed)."""


@dataclass(frozen=True)
class SlotState:
    """What ``pg_replication_slots`` says of the slot now (None fields: not reported)."""

    plugin: str
    database: str
    confirmed_flush: int | None
    restart_lsn: int | None
    #: ``reserved``, ``extended``, ``unreserved`` or ``lost`` (the WAL it needs was removed).
    wal_status: str | None
    active_pid: int | None = None
    #: Why the server invalidated the slot (PostgreSQL 17+: ``wal_removed``, ``rows_removed``, ...), or None.
    invalidation_reason: str | None = None


@dataclass(frozen=True)
class ServerState:
    """The server and database the source talks to, its flush LSN, the publication and the slot."""

    system_id: str
    database: str
    flush_lsn: int
    #: The publication's tables (None: no such publication).
    tables: list[str] | None
    slot: SlotState | None


def released_to(history: Sequence[Mapping[str, Any]], keep_epochs: int) -> int | None:
    """Where the slot's confirmed position may move: the newest committed epoch's end, or with
    ``keep_epochs`` the start of the ``keep_epochs``-th newest, so those epochs stay readable."""
    read = [dict(e["offsets"]) for e in history if (e.get("offsets") or {}).get("end") is not None]
    if not read:
        return None
    if keep_epochs == 0:
        return int(read[-1]["end"])
    return int(read[-min(keep_epochs, len(read))]["start"])


def check_identity(offsets: Mapping[str, Any], server: ServerState, where: str, *, start: int | None) -> None:
    """Refuse unless the server, the slot and the publication are those ``offsets`` were planned against
    and the slot can still give every change from ``start`` on."""
    slot = str(offsets["slot"])
    out = RESNAPSHOT.format(slot=slot)
    if (str(offsets["system_id"]), str(offsets["database"])) != (server.system_id, server.database):
        raise CdcError(f"{where}: the position was taken on server {offsets['system_id']} database "
                       f"{offsets['database']!r}, this is server {server.system_id} database {server.database!r} "
                       "(a restored backup, or a failover without the slot): its LSNs mean other changes. " + out)
    if server.slot is None:
        raise CdcError(f"{where}: the replication slot {slot!r} is gone (dropped), so the changes after LSN "
                       f"{lsn_text(start or 0)} that no committed epoch read are lost. " + out)
    if server.slot.plugin != "pgoutput" or server.slot.database != server.database:
        raise CdcError(f"{where}: the slot {slot!r} decodes with {server.slot.plugin!r} for database "
                       f"{server.slot.database!r}; the source needs a pgoutput slot of {server.database!r}. " + out)
    if server.slot.wal_status == "lost" or server.slot.invalidation_reason:
        raise CdcError(f"{where}: the slot {slot!r} is invalidated (wal_status {server.slot.wal_status!r}, reason "
                       f"{server.slot.invalidation_reason!r}: e.g. the server removed WAL it still needed, past "
                       "max_slot_wal_keep_size), so changes no committed epoch read are lost. " + out)
    confirmed = server.slot.confirmed_flush
    if start is not None and confirmed is not None and confirmed > start:
        raise CdcError(f"{where}: the slot {slot!r} confirms LSN {lsn_text(confirmed)}, past the epoch's start "
                       f"{lsn_text(start)}: it was advanced by another reader, or dropped and created again, and "
                       "the changes between were released unread. " + out)
    pinned = sorted(offsets.get("tables") or [])
    if server.tables is None:
        raise CdcError(f"{where}: the publication {offsets['publication']!r} is gone. " + out)
    if sorted(server.tables) != pinned:
        raise CdcError(f"{where}: the publication {offsets['publication']!r} now publishes {server.tables}, the "
                       f"committed epochs read {pinned}: a table added has no snapshot, a table removed stops "
                       "silently. Restore the publication's tables, or take a new snapshot. " + out)


def plan_range(history: Sequence[Mapping[str, Any]], server: ServerState, options: PostgresCdcSourceOptions,
               where: str) -> dict[str, Any]:
    """This epoch's offsets after the committed position (module docs); the first epoch is the caller's."""
    last = last_read(history, "end")
    assert last is not None, "the first epoch creates its slot: PostgresCdc.plan"
    start = int(last["end"])
    check_identity(last, server, where, start=start)
    end = max(start, server.flush_lsn)
    confirmed = server.slot.confirmed_flush if server.slot is not None else None
    return pinned(options, server, start, end, None, max(0, end - confirmed) if confirmed is not None else None)


def pinned(options: PostgresCdcSourceOptions, server: ServerState, start: int, end: int, snapshot: str | None,
           lag_bytes: int | None) -> dict[str, Any]:
    """An epoch's offsets (module docs), with ``lsns``, the range as PostgreSQL prints LSNs (for people)."""
    return {"slot": options.slot, "publication": options.publication, "tables": sorted(server.tables or []),
            "system_id": server.system_id, "database": server.database, "start": start, "end": end,
            "lsns": f"{lsn_text(start)}..{lsn_text(end)}", "snapshot": snapshot, "lag_bytes": lag_bytes}


def describe(offsets: Mapping[str, Any]) -> str | None:
    """An epoch's CDC input for people (``show``, the Checkpoints page): its LSN range as PostgreSQL
    prints LSNs, its change counts by operation (as its read counted them) and the slot's lag when
    it was planned; None for offsets of another source (or of an epoch that did not read it)."""
    if offsets.get("lsns") is None:
        return None
    text = f"LSN {offsets['lsns']}" + (" with the snapshot" if offsets.get("snapshot") else "")
    counts = offsets.get("changes")
    if isinstance(counts, Mapping):
        text += ", " + ", ".join(f"{counts.get(op, 0)} {op}{'' if counts.get(op, 0) == 1 else 's'}" for op in OPS)
    lag = offsets.get("lag_bytes")
    return text + (f", slot lag {lag} bytes" if lag is not None else "")


# -- the database ------------------------------------------------------------------------------
class PostgresCdc:
    """The slot, the publication and the reads of one ``postgres_cdc`` source (psycopg 3 and, for
    creating the slot with an exported snapshot, psycopg2's replication connection)."""

    #: (conninfo, slot) -> the exported snapshot's name and the replication connection holding it
    #: (alive until the source's next plan; shared by the source objects of one process).
    exported: dict[tuple[str, str], tuple[str, Any]] = {}

    def __init__(self, options: PostgresCdcSourceOptions, where: str) -> None:
        self.options, self.where = options, where

    def connect(self) -> contextlib.AbstractContextManager[Any]:
        """An autocommit connection with the source's bounded waits; a failure to connect is transient."""
        return connect(self.options, self.where, CdcError)

    def server(self, conn: Any) -> ServerState:
        """The server's identity, its flush LSN, the publication's tables and the slot, now."""
        system_id, database, flush = conn.execute(
            "SELECT (SELECT system_identifier FROM pg_control_system())::text, current_database(), "
            "pg_current_wal_flush_lsn()::text").fetchone()
        pub = conn.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (self.options.publication,)).fetchone()
        tables = None if pub is None else sorted(f"{s}.{t}" for s, t in conn.execute(
            "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s", (self.options.publication,)))
        # to_jsonb: invalidation_reason exists from PostgreSQL 17 on.
        row = conn.execute("SELECT plugin, database, confirmed_flush_lsn::text, restart_lsn::text, wal_status, "
                           "active_pid, to_jsonb(s) ->> 'invalidation_reason' FROM pg_replication_slots s "
                           "WHERE slot_name = %s AND slot_type = 'logical'", (self.options.slot,)).fetchone()
        slot = None if row is None else SlotState(
            str(row[0]), str(row[1]), lsn_value(row[2]) if row[2] else None, lsn_value(row[3]) if row[3] else None,
            row[4], row[5], row[6])
        return ServerState(str(system_id), str(database), lsn_value(flush), tables, slot)

    def ensure_publication(self, conn: Any) -> None:
        """Create the publication of ``tables`` when it does not exist (inserts, updates, deletes, truncates:
        a truncate fails the epoch that reads it rather than being missed)."""
        from psycopg import sql

        if conn.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (self.options.publication,)).fetchone():
            return
        if not self.options.tables:
            raise CdcError(f"{self.where}: the publication {self.options.publication!r} does not exist; create it "
                           "(CREATE PUBLICATION ... FOR TABLE ...) or give the source its 'tables'")
        tables = sql.SQL(", ").join(sql.Identifier(*t.split(".")) for t in self.options.tables)
        conn.execute(sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(
            sql.Identifier(self.options.publication), tables))

    def advance(self, conn: Any, slot: SlotState | None, to: int | None) -> None:
        """Move the slot's confirmed position to ``to`` (a committed epoch's end), if it is behind it."""
        if to is None or slot is None or (slot.confirmed_flush is not None and slot.confirmed_flush >= to):
            return
        try:
            conn.execute("SELECT pg_replication_slot_advance(%s, %s::pg_lsn)", (self.options.slot, lsn_text(to)))
        except Exception as exc:  # in use by another reader: the next plan advances it
            log.warning("%s: the slot %r stays at %s for now (%s); the next plan advances it", self.where,
                        self.options.slot, lsn_text(slot.confirmed_flush or 0), str(exc).strip())

    def create_slot(self, conn: Any, server: ServerState) -> tuple[int, str | None]:
        """A new slot (one of that name that no committed epoch read is dropped first): its consistent
        point and, with ``snapshot``, the name of the snapshot exported as of it."""
        import psycopg2  # type: ignore[import-untyped]
        import psycopg2.extras  # type: ignore[import-untyped]

        self.release_export()
        if server.slot is not None and server.slot.database != server.database:
            raise CdcError(f"{self.where}: a slot named {self.options.slot!r} belongs to database "
                           f"{server.slot.database!r}; give this source another slot name")
        if server.slot is not None:
            log.warning("%s: dropping the slot %r that no committed epoch read, to create it with a snapshot",
                        self.where, self.options.slot)
            conn.execute("SELECT pg_drop_replication_slot(%s)", (self.options.slot,))
        export = "export" if self.options.snapshot else "nothing"
        try:
            repl = psycopg2.connect(conninfo(self.options, self.where, CdcError), connect_timeout=30,
                                    application_name="seatunnel-ckpt-source",
                                    connection_factory=psycopg2.extras.LogicalReplicationConnection)
            cur = repl.cursor()
            cur.execute(f"CREATE_REPLICATION_SLOT \"{self.options.slot}\" LOGICAL pgoutput (SNAPSHOT '{export}')")
            _, point, snapshot, _ = cur.fetchone()
        except psycopg2.Error as exc:
            raise CdcError(f"{self.where}: cannot create the slot through a replication connection: "
                           f"{str(exc).strip()}. The role needs the REPLICATION attribute, and the server "
                           "wal_level=logical and a free max_replication_slots / max_wal_senders") from exc
        if snapshot is None:
            repl.close()
        else:
            self.exported[self._export_key] = (snapshot, repl)
        return lsn_value(point), snapshot

    @property
    def _export_key(self) -> tuple[str, str]:
        return (self.options.database, self.options.slot)

    def release_export(self) -> None:
        """Close the connection holding the source's exported snapshot, if any (its epoch read it)."""
        held = self.exported.pop(self._export_key, None)
        if held is not None:
            with contextlib.suppress(Exception):  # already closed by the server
                held[1].close()

    def plan(self, history: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """This epoch's offsets: a new slot (and snapshot) on the first epoch, else the range after the
        committed position, with the slot advanced to what committed epochs no longer need."""
        with self.connect() as conn:
            self.ensure_publication(conn)
            server = self.server(conn)
            if last_read(history, "end") is None:
                return self._first(conn, server)
            offsets = plan_range(history, server, self.options, self.where)
            self.release_export()
            self.advance(conn, server.slot, released_to(history, self.options.keep_epochs))
            return offsets

    def _first(self, conn: Any, server: ServerState) -> dict[str, Any]:
        """The first epoch's offsets: a new slot and snapshot (or, with ``snapshot: false``, a slot given)."""
        if self.options.tables and server.tables != self.options.tables:
            raise CdcError(f"{self.where}: the publication {self.options.publication!r} publishes "
                           f"{server.tables}, the source's tables are {self.options.tables}; make them the "
                           "same (ALTER PUBLICATION ... SET TABLE ..., or the source's 'tables')")
        if server.slot is not None and not self.options.snapshot:
            start, snapshot = server.slot.confirmed_flush or server.flush_lsn, None  # a slot given
        else:
            start, snapshot = self.create_slot(conn, server)
            server = self.server(conn)
        return pinned(self.options, server, start, max(start, server.flush_lsn), snapshot, 0)

    def repin(self, offsets: Mapping[str, Any]) -> dict[str, Any] | None:
        """The first epoch planned again (the slot created again) when its pinned snapshot was exported by another
        process, gone with it; None when the pinned offsets can be read here."""
        name = offsets.get("snapshot")
        if not name or self.exported.get(self._export_key, ("", None))[0] == name:
            return None
        with self.connect() as conn:
            server = self.server(conn)
            if (str(offsets["system_id"]), str(offsets["database"])) != (server.system_id, server.database):
                check_identity(offsets, server, self.where, start=None)  # names the server it found
            log.warning("%s: the snapshot %s the first epoch pinned (the tables as of LSN %s) was exported by "
                        "the process that planned the epoch and is gone with it; no committed epoch read the slot, "
                        "so this attempt creates it again with a new snapshot and reads that", self.where, name,
                        lsn_text(int(offsets["start"])))
            return self._first(conn, server)

    def check(self, offsets: Mapping[str, Any]) -> None:
        """The identity check of :func:`check_identity` against the server now (before a read or a replay)."""
        with self.connect() as conn:
            check_identity(offsets, self.server(conn), self.where, start=int(offsets["start"]))

    def columns(self, conn: Any, tables: Sequence[str]) -> dict[str, list[Column]]:
        """Each table's columns now (name, type, key), in order."""
        return {table: table_columns(conn, table) for table in tables}

    def snapshot_rows(self, offsets: Mapping[str, Any], columns: Mapping[str, list[Column]]
                      ) -> Iterator[tuple[str, dict[str, str | None]]]:
        """Every row of the pinned tables as of the exported snapshot (text values)."""
        from psycopg import sql

        name = str(offsets["snapshot"])
        if self.exported.get(self._export_key, ("", None))[0] != name:
            raise CdcError(
                f"{self.where}: the snapshot {name} the first epoch pinned (the tables as of LSN "
                f"{lsn_text(int(offsets['start']))}) was exported by the process that planned the epoch and is "
                "gone with it, so this attempt cannot read it. Retry the stage: a retry that finds no snapshot "
                "of its own before it reads creates the slot again with a new one (nothing was prepared)")
        with self.connect() as conn:
            conn.autocommit = False
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(name)))
            for number, table in enumerate(offsets["tables"]):
                cols = columns[table]
                query = sql.SQL("SELECT {} FROM {}").format(output_columns([c.name for c in cols]),
                                                            sql.Identifier(*table.split(".")))
                with conn.cursor(name=f"snapshot_{number}") as cur:
                    cur.execute(query)
                    for row in cur:
                        yield table, dict(zip([c.name for c in cols], row, strict=True))
            conn.rollback()

    def messages(self, offsets: Mapping[str, Any]) -> Iterator[bytes]:
        """The slot's messages up to the pinned ``end``, in order, without consuming them; the identity is
        checked first (nothing is read from another slot, server or publication). Fetched in batches of
        :data:`FETCH_MESSAGES`, in binary (the messages as they are, not hex text to parse)."""
        with self.connect() as conn:
            check_identity(offsets, self.server(conn), self.where, start=int(offsets["start"]))
            conn.autocommit = False
            with conn.cursor(name="changes", binary=True) as cur:
                cur.itersize = FETCH_MESSAGES
                cur.execute("SELECT data FROM pg_logical_slot_peek_binary_changes(%s, %s::pg_lsn, NULL, "
                            "'proto_version', '1', 'publication_names', %s)",
                            (self.options.slot, lsn_text(int(offsets["end"])), self.options.publication))
                for (data,) in cur:
                    yield data
            conn.rollback()

    @contextmanager
    def _decoding(self, start: int, end: int) -> Iterator[None]:
        """A message the decoder cannot take fails the read, naming the range and the way out."""
        try:
            yield
        except DecodeError as exc:
            raise CdcError(f"{self.where}: the changes between LSN {lsn_text(start)} and {lsn_text(end)}: "
                           f"{exc}. The epoch fails before its decision. " + RESNAPSHOT.format(
                               slot=self.options.slot)) from exc

    def read_changes(self, offsets: Mapping[str, Any], decoder: Decoder, into: ChangeColumns) -> None:
        """The changes of the transactions committed in the pinned ``[start, end)`` added to ``into`` column by
        column (the Spark source's read), without consuming them (:meth:`messages`)."""
        start, end = int(offsets["start"]), int(offsets["end"])
        if end <= start:
            return
        started, before = time.monotonic(), into.count
        with self._decoding(start, end):
            decoder.decode(self.messages(offsets), into, start, end)
        counts = Counter(into.meta["_op"][before:])
        log.info("%s: read the changes of LSN %s..%s in %.1fs: %s", self.where, lsn_text(start), lsn_text(end),
                 time.monotonic() - started, ", ".join(f"{counts[op]} {op}s" for op in OPS))
