"""What each sink gives the contract suite (its context), and the epochs the suite runs.

A :class:`SinkContext` knows one connector: the modes it supports, its options for a mode,
how the Spark sink stages an epoch's files for it, the functions that make its commit (so
that a crash can land just before or just after it), and two readers written with the
format's own libraries, never with this package: :meth:`SinkContext.rows` (the target now)
and :meth:`SinkContext.history` (every state of the target a reader can pin: each Iceberg
snapshot, each Delta version, each committed PostgreSQL transaction, the file target after
each publish, read as docs/REPLAY.md tells readers to).

:class:`Epochs` drives a pipeline of one store and one sink through the real protocol --
begin, stage, prepare, decide commit, commit; a commit killed before or after its table
commit and then run again by another process; a replay of epochs -- and keeps the table a
reader must find after each whole committed epoch (:attr:`Epochs.states`).
"""

from __future__ import annotations

import dataclasses
import io
import json
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from airflow_seatunnel_ckpt.core import CheckpointConfig, CheckpointStore, Decision, EpochState, Pipeline, layout
from airflow_seatunnel_ckpt.core.models import DecisionRecord, SinkManifest, SinkMode
from airflow_seatunnel_ckpt.core.ops.replay import begin_replay, finish_replay, plan_replay, resume_replay
from tests.core.faults import SimulatedCrash
from tests.tables import duckdb_connection

SCHEMA = pa.schema([("id", pa.int64()), ("region", pa.string()), ("amount", pa.float64())])
REGIONS = ("EU", "US")
APPEND, UPSERT, SNAPSHOT = "append", "upsert", "snapshot"
#: A table's rows as a reader compares them: sorted ``(id, region, amount)`` tuples.
Rows = list[tuple[Any, ...]]


def rows_of(table: pa.Table) -> Rows:
    """``table``'s rows, sorted, in the suite's column order."""
    data = table.select(SCHEMA.names).to_pylist()
    return sorted(tuple(row[name] for name in SCHEMA.names) for row in data)


def epoch_rows(ids: Sequence[int], version: int) -> pa.Table:
    """Rows of ``ids`` whose amount tells which epoch (or replay) wrote them."""
    return pa.table({"id": list(ids), "region": [REGIONS[i % 2] for i in ids],
                     "amount": [i + version / 10 for i in ids]}, schema=SCHEMA)


class SinkContext:
    """One connector's part of the contract suite (subclassed per connector)."""

    #: The connector's name in test ids.
    name: ClassVar[str] = ""
    #: The modes the sink supports (``append``, ``upsert``, ``snapshot``).
    modes: ClassVar[frozenset[str]] = frozenset()
    #: Whether the Spark sink stages one directory per ``region`` (``__partition_region=EU``).
    partitioned: ClassVar[bool] = True
    #: Whether the sink commits into a table (its options travel in the manifest) or publishes files.
    table: ClassVar[bool] = True
    #: The sink applies change rows (``apply_changes``): several changes of one key in an epoch are legal.
    applies: ClassVar[bool] = False

    def __init__(self, root: Path) -> None:
        self.root = root

    def options(self, mode: str) -> dict[str, Any]:
        """The sink's table options for ``mode``."""
        raise NotImplementedError

    def target_url(self) -> str:
        """The sink's target URL, as its Spark sink names it."""
        raise NotImplementedError

    def table_commits(self) -> list[tuple[Any, str]]:
        """``(owner, attribute)`` of each function whose call is the table commit itself."""
        raise NotImplementedError

    def rows(self) -> Rows:
        """The target's rows now ([] before it exists)."""
        raise NotImplementedError

    def history(self) -> list[tuple[str, Rows]]:
        """Every state of the target a reader can pin, oldest first, each with how to pin it."""
        raise NotImplementedError

    def observe(self) -> None:
        """Called after every commit call (one that crashed too): a target that keeps no
        history of its own records the state a reader sees now."""

    def staged(self, rows: pa.Table, epoch: int) -> pa.Table:
        """``rows`` as the Spark sink stages them, ``epoch`` the one whose input they are (a replayed
        epoch's own): as they are, but for a sink that applies change rows."""
        return rows


class IcebergContext(SinkContext):
    """An Iceberg table in a pyiceberg SQL catalog on SQLite, partitioned by region."""

    name = "iceberg"
    modes = frozenset({APPEND, UPSERT, SNAPSHOT})
    IDENT = "lake.orders"

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.catalog = {"type": "sql", "uri": f"sqlite:///{root}/catalog.db", "warehouse": f"file://{root}/warehouse"}

    def options(self, mode: str) -> dict[str, Any]:
        keys = {"merge_keys": ["id"]} if mode == UPSERT else {}
        return {"type": "iceberg", "table": self.IDENT, "catalog_name": "lake", "catalog": self.catalog,
                "partition_by": ["region"], **keys}

    def target_url(self) -> str:
        return f"iceberg://lake/{self.IDENT}"

    def table_commits(self) -> list[tuple[Any, str]]:
        from pyiceberg.catalog.sql import SqlCatalog

        return [(SqlCatalog, "commit_table")]

    @contextmanager
    def _table(self) -> Iterator[Any]:
        """The table (None before it exists), its catalog's connections closed afterwards."""
        from pyiceberg.catalog import load_catalog
        from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

        catalog = load_catalog("lake", **self.catalog)
        try:
            try:
                table = catalog.load_table(self.IDENT)
            except (NoSuchTableError, NoSuchNamespaceError):
                table = None
            yield table
        finally:
            catalog.engine.dispose()  # type: ignore[attr-defined]

    def rows(self) -> Rows:
        with self._table() as table:
            return [] if table is None else rows_of(table.scan().to_arrow())

    def history(self) -> list[tuple[str, Rows]]:
        """Each snapshot through pyiceberg's ``scan(snapshot_id=...)``, checked against DuckDB's
        ``iceberg_scan(..., snapshot_from_id => ...)`` of the same snapshot."""
        with self._table() as table:
            if table is None:
                return []
            metadata = table.metadata_location.removeprefix("file://")
            con = duckdb_connection("avro", "iceberg")
            states = []
            for snapshot in sorted(table.snapshots(), key=lambda s: s.sequence_number or 0):
                found = rows_of(table.scan(snapshot_id=snapshot.snapshot_id).to_arrow())
                by_duckdb = sorted(con.execute(
                    f"SELECT id, region, amount FROM iceberg_scan('{metadata}', "
                    f"snapshot_from_id => {snapshot.snapshot_id})").fetchall())
                assert by_duckdb == found, (f"snapshot {snapshot.snapshot_id}: DuckDB reads {by_duckdb}, "
                                            f"pyiceberg {found}")
                summary = snapshot.summary
                what = f"{summary.operation.value} epoch {summary.get('seatunnel-ckpt.epoch')}" if summary else "?"
                states.append((f"snapshot {snapshot.snapshot_id} ({what})", found))
            return states


class DeltaContext(SinkContext):
    """A Delta table on the local disk, partitioned by region."""

    name = "delta"
    modes = frozenset({APPEND, UPSERT, SNAPSHOT})

    def options(self, mode: str) -> dict[str, Any]:
        keys = {"merge_keys": ["id"]} if mode == UPSERT else {}
        return {"type": "delta", "path": self.target_url(), "partition_by": ["region"], **keys}

    def target_url(self) -> str:
        return f"file://{self.root}/tables/orders"

    def table_commits(self) -> list[tuple[Any, str]]:
        import airflow_seatunnel_ckpt.core.sinks.delta as delta_tables

        return [(delta_tables, "_create"), (delta_tables, "_append"), (delta_tables, "_upsert")]

    def _versions(self) -> list[int]:
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        try:
            return list(range(DeltaTable(f"{self.root}/tables/orders").version() + 1))
        except TableNotFoundError:
            return []

    def rows(self) -> Rows:
        from deltalake import DeltaTable

        return rows_of(DeltaTable(f"{self.root}/tables/orders").to_pyarrow_table()) if self._versions() else []

    def history(self) -> list[tuple[str, Rows]]:
        """Each version through ``DeltaTable(uri, version=v)`` (time travel)."""
        from deltalake import DeltaTable

        return [(f"version {v}", rows_of(DeltaTable(f"{self.root}/tables/orders", version=v).to_pyarrow_table()))
                for v in self._versions()]


class PostgresContext(SinkContext):
    """A PostgreSQL table the first commit creates; its history is what readers saw after each commit.

    PostgreSQL keeps no readable history: what a reader can see is the table after each
    committed transaction. :meth:`observe` reads it after every commit call (retries and
    crashed calls included), with the epochs the marker table says committed.
    """

    name = "postgres"
    modes = frozenset({APPEND, UPSERT})
    partitioned = False

    def __init__(self, root: Path, dsn: str) -> None:
        super().__init__(root)
        self.dsn = dsn
        self.seen: list[tuple[str, Rows]] = []

    def options(self, mode: str) -> dict[str, Any]:
        # An append sink marks each row with its epoch, which is how a replay replaces exactly its epochs' rows.
        keys = {"mode": "upsert", "merge_keys": ["id"]} if mode == UPSERT else {"epoch_column": "_epoch"}
        return {"type": "postgres", "table": "public.orders", "conninfo": self.dsn, "create_table": True, **keys}

    def target_url(self) -> str:
        return "postgres://test/public.orders"

    def table_commits(self) -> list[tuple[Any, str]]:
        import airflow_seatunnel_ckpt.core.sinks.postgres as postgres_tables

        return [(postgres_tables, "_commit_once")]

    def _query(self, table: str, columns: str) -> list[tuple[Any, ...]]:
        """``SELECT columns FROM table`` ([] before the first commit creates the table)."""
        import psycopg
        from psycopg import sql

        with psycopg.connect(self.dsn) as conn:
            found = conn.execute("SELECT to_regclass(%s) IS NOT NULL", [table]).fetchone()
            if not (found and found[0]):
                return []
            statement = sql.SQL("SELECT {} FROM {}").format(sql.SQL(columns), sql.Identifier(*table.split(".")))
            return sorted(conn.execute(statement).fetchall())

    def rows(self) -> Rows:
        # float8: a table the user created may hold the amount as numeric(p,s).
        return self._query("public.orders", "id, region, amount::float8")

    def observe(self) -> None:
        epochs = [e for (e,) in self._query("public.seatunnel_ckpt_epochs", "epoch")]
        self.seen.append((f"after commit call {len(self.seen) + 1} (marker epochs {epochs})", self.rows()))

    def history(self) -> list[tuple[str, Rows]]:
        return list(self.seen)


class FileContext(SinkContext):
    """A file sink's target on the local disk, read as docs/REPLAY.md tells a reader to.

    ``epoch=<e>/`` directories count once they hold ``_SUCCESS``; a snapshot target is the
    directory its ``_LATEST`` names; a replay's ``_EPOCHS`` pointer hides directories, and a
    listing between two reads of it that agree is one consistent set. A file target keeps no
    history: :meth:`observe` reads it after every publish call, as a reader would then.
    """

    name = "files"
    modes = frozenset({APPEND, SNAPSHOT})
    partitioned = False
    table = False

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.path = root / "out"
        self.seen: list[tuple[str, Rows]] = []

    def options(self, mode: str) -> dict[str, Any]:
        return {"type": "file", "path": self.target_url(), "mode": "snapshot" if mode == SNAPSHOT else "append"}

    def target_url(self) -> str:
        return f"file://{self.path}"

    def table_commits(self) -> list[tuple[Any, str]]:
        import airflow_seatunnel_ckpt.core.sinks.files as protocol

        # The publish of an epoch directory (with its _SUCCESS), and a replay's swap of directories.
        return [(protocol, "publish_sink_dir"), (protocol, "replace_epoch_dirs")]

    def _pointer(self) -> dict[str, Any]:
        """The target's ``_EPOCHS`` pointer (none: nothing hidden)."""
        try:
            return dict(json.loads((self.path / "_EPOCHS").read_bytes()))
        except FileNotFoundError:
            return {"version": 0, "hidden": []}

    def _read_dir(self, name: str) -> list[pa.Table]:
        """The data files below ``<path>/<name>`` (names starting with ``_`` or ``.`` are not data)."""
        top = self.path / name
        return [pq.read_table(f) for f in sorted(top.rglob("*")) if f.is_file()
                and not any(part.startswith(("_", ".")) for part in f.relative_to(top).parts)]

    def current(self) -> list[pa.Table]:
        """The data files a reader reads now, as tables."""
        if not self.path.exists():
            return []
        latest = self.path / "_LATEST"
        if latest.exists():
            return self._read_dir(latest.read_text().strip())
        for _ in range(10):
            pointer = self._pointer()
            names = [d.name for d in self.path.iterdir() if re.fullmatch(r"epoch=\d+", d.name)
                     and d.name not in pointer["hidden"] and (d / "_SUCCESS").exists()]
            found = [table for name in names for table in self._read_dir(name)]
            if self._pointer() == pointer:
                return found
        raise AssertionError(f"{self.path}: its _EPOCHS pointer changed during every listing")

    def rows(self) -> Rows:
        return sorted(row for table in self.current() for row in rows_of(table))

    def observe(self) -> None:
        self.seen.append((f"after publish call {len(self.seen) + 1}", self.rows()))

    def history(self) -> list[tuple[str, Rows]]:
        return list(self.seen)


@dataclasses.dataclass(frozen=True)
class StagedReplay:
    """A replay begun and staged: its epoch, the epochs it replaces, its rows, and its finish (decide, commit)."""

    epoch: int
    replaced: tuple[int, ...]
    rows: Rows
    finish: Callable[[], object]


#: Every sink's context, by connector name (the names in test ids).
CONTEXTS: dict[str, type[SinkContext]] = {"files": FileContext, "iceberg": IcebergContext, "delta": DeltaContext,
                                          "postgres": PostgresContext}


# -- apply_changes contexts (LAKE) ---------------------------------------------------------
# The suite's rows staged as change rows (an update of each id, ordered by the epoch), applied
# with ``apply_changes``: SCD1 keeps one row per id (the upsert model of :class:`Epochs`), SCD2
# a version per id and epoch (its rows, without __start_at/__end_at, are the append model's).

def change_rows(rows: pa.Table, sequence: int) -> pa.Table:
    """``rows`` as updates at ``_lsn`` ``sequence`` (columns the rows hold already are kept: a refusal's)."""
    for name, value, kind in (("_op", "update", pa.string()), ("_lsn", sequence, pa.int64()),
                              ("_seq", 1, pa.int32())):
        if name not in rows.column_names:
            rows = rows.append_column(pa.field(name, kind), pa.array([value] * rows.num_rows, kind))
    return rows


def apply_changes(history: str) -> dict[str, Any]:
    """The change contexts' ``apply_changes`` option."""
    return {"keys": ["id"], "sequence_by": ["_lsn", "_seq"], "operation": "_op", "history": history}


class IcebergScd1Context(IcebergContext):
    """The Iceberg table with change rows applied as SCD1 (one row per id: the upsert model)."""

    applies = True

    name = "iceberg-scd1"
    modes = frozenset({UPSERT})

    def options(self, mode: str) -> dict[str, Any]:
        options = {k: v for k, v in super().options(mode).items() if k != "merge_keys"}
        return {**options, "apply_changes": apply_changes("scd1")}

    def staged(self, rows: pa.Table, epoch: int) -> pa.Table:
        return change_rows(rows, epoch)


class DeltaScd2Context(DeltaContext):
    """The Delta table with change rows applied as SCD2 (a version per id and epoch: the append model)."""

    applies = True

    name = "delta-scd2"
    modes = frozenset({APPEND})

    def options(self, mode: str) -> dict[str, Any]:
        options = {k: v for k, v in super().options(mode).items() if k != "merge_keys"}
        return {**options, "apply_changes": apply_changes("scd2")}

    def staged(self, rows: pa.Table, epoch: int) -> pa.Table:
        return change_rows(rows, epoch)

    def table_commits(self) -> list[tuple[Any, str]]:
        import airflow_seatunnel_ckpt.core.sinks.delta as delta_tables

        return [(delta_tables, "_apply_changes")]


CONTEXTS.update({"iceberg-scd1": IcebergScd1Context, "delta-scd2": DeltaScd2Context})


def context_of(connector: str, root: Path, request: pytest.FixtureRequest, dsn: str | None = None) -> SinkContext:
    """The connector's context below ``root``; PostgreSQL's on ``dsn`` (default: the test's fresh database)."""
    context = CONTEXTS[connector]
    if issubclass(context, PostgresContext):
        return context(root, dsn or request.getfixturevalue("postgres_db"))
    return context(root)


class Epochs:
    """A pipeline of one store whose one sink ``orders`` is ``context``'s table in ``mode``.

    :attr:`states` is every table a reader may find: empty, then the table after each
    whole committed epoch (an append adds the epoch's rows, an upsert replaces the rows of
    its keys, a snapshot is its rows; a replay swaps the replaced epochs' rows for the new ones:
    for an upsert, each key holds its value after the epochs before the replay, then the
    replayed epochs' new rows in order).
    """

    def __init__(self, context: SinkContext, mode: str, store: str = "store", name: str = "orders") -> None:
        self.context = context
        self.mode = mode
        self.store_url = f"file://{context.root}/{store}"
        self.name = name
        self.pipeline = self.open()
        self.runs = 0
        #: Committed epoch -> its ids (what a replay writes again).
        self.ids: dict[int, list[int]] = {}
        #: Committed epoch -> its rows the table holds now (a snapshot: the newest; a replay swaps them).
        self.written: dict[int, Rows] = {}
        self.states: list[Rows] = [[]]

    def open(self) -> Pipeline:
        """A fresh Pipeline object, as another process (a retry, the recovery DAG) builds it."""
        config = CheckpointConfig.from_mapping({"storage_url": self.store_url, "max_retries": 2})
        return CheckpointStore(config).pipeline(self.name)

    def stage(self, epoch: int, rows: Sequence[pa.Table], below: Sequence[str] = ("",)) -> SinkManifest:
        """Stage ``rows[i]`` below ``below[i]`` of the attempt's staging as the Spark table sink
        stages them (one file per region directory, or one file), and the sink's manifest."""
        staging = self.pipeline.staging_path(epoch, 1, "orders")
        for table, folder in zip(rows, below, strict=True):
            table = self.context.staged(table, layout.replayed_epoch(folder) or epoch)
            parts = ({f"__partition_region={r}": table.filter(pc.equal(table.column("region"), r)) for r in REGIONS}
                     if self.context.partitioned else {"": table})
            for sub, part in parts.items():
                if part.num_rows:
                    buf = io.BytesIO()
                    pq.write_table(part, buf)
                    # Unique names, as Spark's: a file sink publishes a replay's epochs into one directory.
                    name = f"part-00000-{folder}.parquet" if folder else "part-00000.parquet"
                    path = "/".join(p for p in (staging, folder, sub, name) if p)
                    self.pipeline.storage.write_atomic(path, buf.getvalue())
        manifest = self.pipeline.manifest_for_staged(epoch, 1, "orders", self.context.target_url(),
                                                     sum(t.num_rows for t in rows))
        return dataclasses.replace(manifest, mode=SinkMode.SNAPSHOT if self.mode == SNAPSHOT else SinkMode.APPEND,
                                   table=self.context.options(self.mode) if self.context.table else None)

    def prepare(self, rows: Callable[[int], pa.Table]) -> tuple[int, pa.Table]:
        """Begin an epoch, stage ``rows(epoch)`` and prepare it: the epoch waits for its decision."""
        self.runs += 1
        run_id = f"run-{self.runs}"
        epoch = self.pipeline.begin(run_id).epoch
        table = rows(epoch)
        self.pipeline.prepare(epoch, "ingest", 1, run_id=run_id, sinks=[self.stage(epoch, [table])])
        return epoch, table

    def decide(self, epoch: int) -> DecisionRecord:
        """Decide commit for ``epoch``: the decision that stands (an abort if a sink refused the epoch)."""
        return self.pipeline.decide(epoch, Decision.COMMIT, "all prepared", by="contract")

    def run(self, ids: Sequence[int], crash: str | None = None) -> int:
        """One whole epoch writing ``ids``; with ``crash`` (``before`` / ``after``) its first
        commit dies just before or just after the table commit and another process commits it."""
        epoch, rows = self.prepare(lambda e: epoch_rows(ids, e))
        decision = self.decide(epoch)
        assert decision.decision is Decision.COMMIT, decision.reason
        self.commit(lambda: self.pipeline.commit(epoch), lambda: self.open().commit(epoch), crash)
        self.settled(epoch, ids, rows)
        return epoch

    def settled(self, epoch: int, ids: Sequence[int], rows: pa.Table) -> None:
        """``epoch`` (``ids``, staged as ``rows``) is committed: record the table a reader must find now."""
        assert self.pipeline.state(epoch) is EpochState.COMMITTED
        self.ids[epoch] = list(ids)
        self.committed(epoch, rows_of(rows))

    def replay(self, from_epoch: int, crash: str | None = None, without: Sequence[int] = ()) -> int:
        """Replay epochs ``from_epoch``.. as the stage runtime does (each replayed epoch's
        output below ``replayed-<e>/``), with new amounts and without the ids ``without``;
        returns the replay epoch."""
        replay = self.staged_replay(from_epoch, without)
        self.commit(replay.finish, lambda: resume_replay(self.open()), crash)
        self.replayed(replay)
        return replay.epoch

    def staged_replay(self, from_epoch: int, without: Sequence[int] = ()) -> StagedReplay:
        """A replay of epochs ``from_epoch``.. begun and staged (see :meth:`replay`); its finish is the caller's."""
        plan = plan_replay(self.pipeline, from_epoch)
        epoch, run_id = begin_replay(self.pipeline, plan, reason="contract", by="contract")
        # Amounts tell the replay and the replayed epoch apart (an upsert keeps the newest replayed epoch's).
        new = {e: epoch_rows([i for i in self.ids[e] if i not in without], epoch * 10 + e) for e in plan.epochs}
        replayed = plan.epochs[-1:] if self.mode == SNAPSHOT else plan.epochs  # a snapshot: the newest only
        manifest = self.stage(epoch, [new[e] for e in replayed], [f"replayed-{e}" for e in replayed])

        def finish() -> object:
            return finish_replay(self.pipeline, epoch, run_id, plan, 1, sinks=[manifest], operators={},
                                 reason="contract", by="contract")

        # In replayed-epoch order: an upsert's key takes the newest replayed epoch's row.
        return StagedReplay(epoch, tuple(plan.replaced), [r for e in replayed for r in rows_of(new[e])], finish)

    def replayed(self, replay: StagedReplay) -> None:
        """``replay`` is committed: record the table a reader must find now."""
        assert self.pipeline.state(replay.epoch) is EpochState.COMMITTED
        for e in replay.replaced:
            self.written.pop(e, None)
        self.committed(replay.epoch, replay.rows)

    def commit(self, first: Callable[[], object], again: Callable[[], object], crash: str | None) -> None:
        """``first()``; with ``crash`` it dies at the table commit, and ``again()`` (another process) resumes."""
        if crash is None:
            first()
            self.context.observe()
            return
        with self.crashing(crash), pytest.raises(SimulatedCrash):
            first()
        self.context.observe()
        again()
        self.context.observe()

    @contextmanager
    def crashing(self, when: str) -> Iterator[None]:
        """The process dies just ``before`` or just ``after`` the sink's table commit (once)."""
        armed = [True]
        with pytest.MonkeyPatch.context() as mp:
            for owner, name in self.context.table_commits():
                real = getattr(owner, name)

                def at_commit(*args: Any, _real: Callable[..., Any] = real, **kwargs: Any) -> Any:
                    if not armed[0]:
                        return _real(*args, **kwargs)
                    armed[0] = False
                    if when == "before":
                        raise SimulatedCrash("killed just before the table commit")
                    _real(*args, **kwargs)
                    raise SimulatedCrash("killed just after the table commit")

                mp.setattr(owner, name, at_commit)
            yield
        assert not armed[0], "the table commit was never reached"

    def committed(self, epoch: int, rows: Rows) -> None:
        """Record the table a reader must find now that ``epoch`` (with ``rows``) committed."""
        if self.mode == SNAPSHOT:
            self.written = {}
        self.written[epoch] = rows
        if self.mode == UPSERT:  # each epoch the table holds, in order, upserts its rows by id
            table = {r[0]: r for e in sorted(self.written) for r in self.written[e]}
            self.states.append(sorted(table.values()))
            return
        self.states.append(sorted(r for e in sorted(self.written) for r in self.written[e]))


# -- apply_changes contexts (PGAPPLY): change rows applied into PostgreSQL, SCD1 and SCD2 ---------

class PostgresApplyContext(PostgresContext):
    """The PostgreSQL table applying the suite's rows as change rows (an ``update`` each, sequenced by
    the epoch whose input they are, then the id), SCD1: the table a reader sees is an upsert's."""

    applies = True

    name = "postgres-scd1"
    modes = frozenset({UPSERT})
    history_kind = "scd1"

    def options(self, mode: str) -> dict[str, Any]:
        return {"type": "postgres", "table": "public.orders", "conninfo": self.dsn, "create_table": True,
                "apply_changes": {"keys": ["id"], "sequence_by": ["_lsn", "_seq"], "history": self.history_kind}}

    def staged(self, rows: pa.Table, epoch: int) -> pa.Table:
        """The change columns added where the rows lack them (a refusal case brings its own)."""
        added = {"_op": pa.array(["update"] * rows.num_rows, pa.string()),
                 "_lsn": pa.array([epoch] * rows.num_rows, pa.int64()),
                 "_seq": pc.fill_null(rows.column("id"), 0).cast(pa.int64())}
        for name, column in added.items():
            if name not in rows.column_names:
                rows = rows.append_column(name, column)
        return rows


class PostgresScd2Context(PostgresApplyContext):
    """The same changes kept as SCD2 versions; a reader of the current table reads the current versions."""

    name = "postgres-scd2"
    history_kind = "scd2"

    def rows(self) -> Rows:
        return [r[:3] for r in self._query("public.orders", "id, region, amount::float8, __end_at") if r[3] is None]


CONTEXTS.update({"postgres-scd1": PostgresApplyContext, "postgres-scd2": PostgresScd2Context})


__all__ = ["APPEND", "CONTEXTS", "SNAPSHOT", "UPSERT", "DeltaContext", "Epochs", "FileContext", "IcebergContext",
           "PostgresApplyContext", "PostgresContext", "PostgresScd2Context", "SinkContext", "StagedReplay",
           "context_of"]
