"""Two PostgreSQL tables' changes through ``postgres_cdc`` into a file sink over whole epochs, with kills and
replays: every change once, and the changes applied in order equal the tables.

A writer thread makes random inserts, updates and deletes on two tables (``a`` with ``REPLICA
IDENTITY FULL``, ``b`` with its primary key) in small transactions while epochs run, each
through :func:`run_stage` on the shared local Spark session into a file sink. A seeded random
schedule (:mod:`tests.core.faults`: a ``SimulatedCrash`` before the n-th storage mutation)
kills epochs:

* ``stage``: the stage dies between its plan and its prepare; the retry reads the pinned range;
* ``abandon``: the stage dies and the epoch is aborted; the next epoch reads its changes;
* ``commit``: the commit dies between the decision and ``committed``; recovery finishes it,
  and the slot is advanced by the next plan (a kill before the advance loses nothing);
* ``export``: on the first epoch, the process holding the exported snapshot is gone before the
  read; the retry, which holds no snapshot, creates the slot again with a new one and reads that;
* ``replay``: the newest committed epochs are replayed (their pinned ranges read again).

Checked at the end (the writer stopped, one more epoch read up to its last change): the change
rows published over all committed epochs (through the file sink's ``_EPOCHS`` pointer), applied
in ``(_lsn, _seq)`` order, equal each table (both differences empty), and no change
(``_table``, ``_lsn``, ``_seq``; a snapshot row: its key) appears twice; one more epoch still runs.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import pyarrow.parquet as pq
import pytest

from airflow_seatunnel_ckpt.core import CheckpointConfig, CheckpointStore, Decision, EpochState, Pipeline
from airflow_seatunnel_ckpt.core.protocol.recovery import recover
from airflow_seatunnel_ckpt.core.sinks.files import current_epoch_dirs
from airflow_seatunnel_ckpt.core.sources.postgres_cdc import PostgresCdc
from airflow_seatunnel_ckpt.core.storage import open_storage
from airflow_seatunnel_ckpt.spark import StageSpec, run_stage
from airflow_seatunnel_ckpt.spark.replay import replay_stage
from airflow_seatunnel_ckpt.spark.sources.base import SourceError
from tests.conftest import FULL_CAMPAIGNS
from tests.core import faults
from tests.core.faults import SimulatedCrash

pytestmark = [pytest.mark.properties, pytest.mark.spark]

RUNS = 14 if FULL_CAMPAIGNS else 7
SEED = 32
KEYS = 30


def copy_changes(ctx: Any, spark: Any) -> None:
    """Every change row of the epoch into the ``out`` sink."""
    ctx.sink("out").write(ctx.source("changes").read())


class Writer(threading.Thread):
    """Random inserts, updates and deletes on both tables, a few per transaction, until stopped."""

    def __init__(self, conninfo: str, seed: int) -> None:
        super().__init__(daemon=True)
        self.conninfo, self.rng, self.stop, self.failure = conninfo, random.Random(seed), threading.Event(), []
        self.transactions = 0

    def run(self) -> None:
        try:
            with psycopg.connect(self.conninfo, autocommit=True) as conn:
                while not self.stop.is_set():
                    with conn.transaction():
                        for _ in range(self.rng.randint(1, 3)):
                            self.change(conn)
                    self.transactions += 1
                    time.sleep(self.rng.random() * 0.02)
        except BaseException as exc:  # reported by the test thread
            self.failure.append(exc)

    def change(self, conn: psycopg.Connection) -> None:
        table, key = self.rng.choice("ab"), self.rng.randrange(KEYS)
        op = self.rng.choice(["upsert", "upsert", "delete"])
        if op == "delete":
            conn.execute(f"DELETE FROM {table} WHERE id = %s", (key,))
        elif table == "a":
            conn.execute("INSERT INTO a VALUES (%s, %s, %s) ON CONFLICT (id) DO UPDATE SET v = excluded.v, "
                         "note = excluded.note", (key, self.rng.randrange(1000), self.rng.choice(["x", None, "y"])))
        else:
            conn.execute("INSERT INTO b VALUES (%s, %s) ON CONFLICT (id) DO UPDATE SET v = excluded.v",
                         (key, f"w{self.rng.randrange(1000)}"))


class Campaign:
    def __init__(self, root: Path, conninfo: str, plan: faults.CrashPlan) -> None:
        self.root, self.conninfo, self.plan = root, conninfo, plan
        self.store = {"storage_url": f"file://{root}/store", "full_checkpoint_interval": 3}
        self.runs = 0
        self.faults: Counter[str] = Counter()
        #: The ``export`` fault: the read finds no exported snapshot, as a retry in another process would.
        self.lose_export = False

    @property
    def pipeline(self) -> Pipeline:
        return CheckpointStore(CheckpointConfig.from_mapping(self.store)).pipeline("cdc")

    def spec(self, run_id: str, attempt: int = 1) -> StageSpec:
        source = {"type": "postgres_cdc", "conninfo": self.conninfo, "slot": "model_slot",
                  "publication": "model_pub", "tables": ["public.a", "public.b"], "keep_epochs": 2}
        return StageSpec(pipeline="cdc", participant="ingest", run_id=run_id, attempt=attempt,
                         stage=f"{__name__}:copy_changes", sources={"changes": source},
                         sinks={"out": {"type": "file", "path": f"file://{self.root}/out"}},
                         store=self.store, key_groups=2)

    def crashing(self, rng: random.Random, fn: Any, *args: Any) -> bool:
        self.plan.arm(rng.randint(1, 10))
        try:
            fn(*args)
            return False
        except SimulatedCrash:
            return True
        finally:
            self.plan.disarm()

    def epoch(self, spark: Any, rng: random.Random, fault: str) -> None:
        self.runs += 1
        run_id = f"run-{self.runs}"
        attempt = 1
        if fault == "export":
            # The process holding the exported snapshot is gone before the read; the retry (as in another
            # process: no snapshot held) plans the first epoch again with a new slot and snapshot.
            self.lose_export = True
            try:
                with pytest.raises(SourceError, match="is gone with it"):
                    run_stage(self.spec(run_id), spark)
            finally:
                self.lose_export = False
            self.faults[fault] += 1
            attempt += 1
        elif fault in ("stage", "abandon") and self.crashing(rng, run_stage, self.spec(run_id), spark):
            self.faults[fault] += 1
            epoch = self.pipeline.epoch_for_run(run_id)
            if fault == "abandon" and epoch is not None and self.pipeline.state(epoch) in (
                    EpochState.OPEN, EpochState.PREPARED):
                self.pipeline.abort(epoch, "the stage died and its sensor timed out", by="campaign")
                return
            attempt += 1
        result = run_stage(self.spec(run_id, attempt), spark)
        pipeline = self.pipeline
        if pipeline.state(result.epoch) is EpochState.ABORTED:
            return

        def commit() -> None:
            pipeline.decide(result.epoch, Decision.COMMIT, "all prepared", by="campaign")
            pipeline.commit(result.epoch)

        if fault == "commit" and self.crashing(rng, commit):
            self.faults[fault] += 1
            recover(self.pipeline, dry_run=False)
            if self.pipeline.state(result.epoch) is not EpochState.COMMITTED:
                commit()
        else:
            commit()
        assert self.pipeline.state(result.epoch) is EpochState.COMMITTED

    def replay(self, spark: Any) -> None:
        """Replay the newest committed epoch (the slot keeps it: keep_epochs)."""
        newest = max(e for e in self.pipeline.txlog.epochs() if self.pipeline.state(e) is EpochState.COMMITTED)
        replay_stage(self.spec(f"replay-{self.runs}"), newest, reason="model", by="campaign", spark=spark)
        self.faults["replay"] += 1

    def published(self) -> list[dict[str, Any]]:
        target = open_storage(f"file://{self.root}/out")
        _, dirs = current_epoch_dirs(target)
        rows: list[dict[str, Any]] = []
        for d in dirs:
            for f in target.walk(d):
                if f.path.endswith(".parquet"):
                    rows += pq.read_table(target.full_path(f"{d}/{f.path}")).to_pylist()
        return rows


def applied(rows: list[dict[str, Any]]) -> dict[str, set[tuple[Any, ...]]]:
    """The tables the change rows describe, applied in (_lsn, _seq) order."""
    tables: dict[str, dict[int, tuple[Any, ...]]] = {"public.a": {}, "public.b": {}}
    for row in sorted(rows, key=lambda r: (r["_lsn"], r["_seq"])):
        keyed = tables[row["_table"]]
        if row["_op"] == "delete":
            keyed.pop(int(row["id"]), None)
            continue
        assert not row["_unchanged_toast"]
        value = (int(row["id"]), row["v"], row["note"]) if row["_table"] == "public.a" else (int(row["id"]), row["v"])
        keyed[int(row["id"])] = value
    return {t: set(v.values()) for t, v in tables.items()}


def test_changes_made_while_killed_and_replayed_epochs_run_are_published_once_and_apply_to_the_tables(
        spark: Any, tmp_path: Path, postgres_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with psycopg.connect(postgres_db, autocommit=True) as db:
        db.execute("CREATE TABLE a (id int PRIMARY KEY, v int, note text)")
        db.execute("ALTER TABLE a REPLICA IDENTITY FULL")
        db.execute("CREATE TABLE b (id int PRIMARY KEY, v text)")
        db.execute("INSERT INTO a SELECT g, g, 'seed' FROM generate_series(0, 9) g")
    campaign = Campaign(tmp_path, postgres_db, faults.install(monkeypatch))
    snapshot_rows = PostgresCdc.snapshot_rows

    def losing(self: PostgresCdc, offsets: Any, columns: Any) -> Any:
        if campaign.lose_export:
            self.release_export()
        return snapshot_rows(self, offsets, columns)

    monkeypatch.setattr(PostgresCdc, "snapshot_rows", losing)
    rng = random.Random(SEED)
    writer = Writer(postgres_db, SEED + 1)
    writer.start()
    try:
        schedule = ["export", "stage", "none", "commit", "abandon", "replay", "none"]
        schedule += [rng.choice(["none", "stage", "abandon", "commit", "replay"]) for _ in range(RUNS - len(schedule))]
        for fault in schedule:
            if fault == "replay":
                campaign.replay(spark)
            else:
                campaign.epoch(spark, rng, fault)
            time.sleep(0.2)
    finally:
        writer.stop.set()
        writer.join(30)
    assert not writer.failure, writer.failure
    with psycopg.connect(postgres_db, autocommit=True) as db:
        target = db.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]
        while not db.execute("SELECT pg_current_wal_flush_lsn() >= %s::pg_lsn", (target,)).fetchone()[0]:
            time.sleep(0.05)
        campaign.epoch(spark, rng, "none")  # reads up to the writer's last change
        tables = {"public.a": set(db.execute("SELECT id, v::text, note FROM a").fetchall()),
                  "public.b": set(db.execute("SELECT id, v FROM b").fetchall())}
    rows = campaign.published()
    # A change is its transaction's commit LSN and its place in it; a snapshot row (_seq 0) is its key.
    changes = Counter((r["_table"], r["_lsn"], r["_seq"], r["id"] if r["_seq"] == 0 else None) for r in rows)
    assert all(n == 1 for n in changes.values()), [c for c, n in changes.items() if n > 1][:5]
    got = applied(rows)
    for table in tables:
        assert got[table] - tables[table] == set() and tables[table] - got[table] == set(), table
    assert {r["_op"] for r in rows} == {"insert", "update", "delete"}
    print(f"{writer.transactions} transactions, {len(rows)} change rows, {campaign.runs} runs, "
          f"faults {dict(campaign.faults)}")
    assert set(campaign.faults) >= {"export", "stage", "commit", "replay"}, campaign.faults
    campaign.epoch(spark, rng, "none")  # the next epoch still runs


# -- apply_changes into PostgreSQL (PGAPPLY): the source table's changes applied as SCD1 and SCD2 ------------
APPLY_RUNS = 14 if FULL_CAMPAIGNS else 9
APPLY_SEED = 33
#: The change columns the sinks leave out (``_unchanged_toast`` is read by the commit, never stored).
APPLY = {"keys": ["id"], "sequence_by": ["_lsn", "_seq"], "except_columns": ["_table", "_commit_ts", "_xid"]}


def apply_changes_stage(ctx: Any, spark: Any) -> None:
    """The epoch's change rows into both applying sinks (each collapses them to the last per key)."""
    changes = ctx.source("changes").read()
    ctx.sink("scd1").write(changes)
    ctx.sink("scd2").write(changes)


class ApplyCampaign(Campaign):
    """:class:`Campaign`'s epochs and faults over one source table, applied into two PostgreSQL sinks in the
    schema ``sink``: ``sink.scd1`` (one row per key) and ``sink.scd2`` (every version)."""

    def spec(self, run_id: str, attempt: int = 1) -> StageSpec:
        source = {"type": "postgres_cdc", "conninfo": self.conninfo, "slot": "apply_slot",
                  "publication": "apply_pub", "tables": ["public.src"], "keep_epochs": 2}
        sinks = {h: {"type": "postgres", "table": f"sink.{h}", "conninfo": self.conninfo, "create_table": True,
                     "apply_changes": {**APPLY, "history": h}} for h in ("scd1", "scd2")}
        return StageSpec(pipeline="cdc", participant="ingest", run_id=run_id, attempt=attempt,
                         stage=f"{__name__}:apply_changes_stage", sources={"changes": source}, sinks=sinks,
                         store=self.store, key_groups=2)

    def pinned_end(self, epoch: int) -> int:
        """The end LSN the epoch's plan pinned (its changes committed below it)."""
        plan = self.pipeline.txlog.read_plan(epoch, "ingest")
        assert plan is not None
        return int(plan["changes"]["end"])


def change_source(db: psycopg.Connection, rng: random.Random) -> None:
    """A few transactions of random inserts, updates, deletes and updates of the key on ``src`` (a key may
    change twice in one)."""
    for _ in range(rng.randint(2, 6)):
        with db.transaction():
            for _ in range(rng.randint(1, 4)):
                key = rng.randrange(KEYS)
                draw = rng.random()
                if draw < 0.1:  # the key itself: the old key's row goes, the new key's comes
                    new = rng.randrange(KEYS)
                    db.execute("UPDATE src SET id = %s WHERE id = %s AND NOT EXISTS (SELECT FROM src WHERE id = %s)",
                               (new, key, new))
                elif draw < 0.35:
                    db.execute("DELETE FROM src WHERE id = %s", (key,))
                else:
                    db.execute("INSERT INTO src VALUES (%s, %s, %s) ON CONFLICT (id) DO UPDATE SET v = excluded.v, "
                               "note = excluded.note", (key, rng.randrange(1000), rng.choice(["x", None, "y"])))


def flushed(db: psycopg.Connection) -> None:
    """Wait until the WAL written so far is flushed: decoding (and so the next plan) sees only flushed WAL."""
    target = db.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]
    while not db.execute("SELECT pg_current_wal_flush_lsn() >= %s::pg_lsn", (target,)).fetchone()[0]:
        time.sleep(0.05)


def source_rows(db: psycopg.Connection) -> set[tuple[Any, ...]]:
    return set(db.execute("SELECT id, v, note FROM src").fetchall())


def except_both_ways(db: psycopg.Connection, relation: str) -> list[tuple[Any, ...]]:
    """The rows of ``src`` not in ``relation`` and of ``relation`` not in ``src`` (empty: the same rows)."""
    return db.execute(f"(SELECT id, v, note FROM src EXCEPT ALL SELECT id, v, note FROM {relation}) UNION ALL "
                      f"(SELECT id, v, note FROM {relation} EXCEPT ALL SELECT id, v, note FROM src)").fetchall()


def versions_as_of(db: psycopg.Connection, below: int) -> set[tuple[Any, ...]]:
    """The scd2 versions current at LSN ``below`` (opened below it, not closed below it)."""
    return set(db.execute("SELECT id, v, note FROM sink.scd2 WHERE __start_at < %s AND (__end_at IS NULL OR "
                          "__end_at >= %s)", (below, below)).fetchall())


def test_changes_applied_into_postgres_scd1_and_scd2_sinks_equal_the_source_table_after_each_epoch(
        spark: Any, tmp_path: Path, postgres_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_seatunnel_ckpt.core.sinks import postgres as postgres_tables

    with psycopg.connect(postgres_db, autocommit=True) as db:
        db.execute("CREATE TABLE src (id int PRIMARY KEY, v int, note text)")
        db.execute("INSERT INTO src SELECT g, g, 'seed' FROM generate_series(0, 9) g")
        db.execute("CREATE SCHEMA sink")
    plan = faults.install(monkeypatch)
    commit_once = postgres_tables._commit_once

    def ticking(*args: Any, **kwargs: Any) -> Any:  # the sink's transaction is a crash point of its own
        plan.tick("the PostgreSQL sink's commit")
        return commit_once(*args, **kwargs)

    monkeypatch.setattr(postgres_tables, "_commit_once", ticking)
    campaign = ApplyCampaign(tmp_path, postgres_db, plan)
    rng = random.Random(APPLY_SEED)
    schedule = ["none", "stage", "none", "commit", "abandon", "none", "replay", "commit", "replay"]
    schedule += [rng.choice(["none", "stage", "abandon", "commit", "replay"])
                 for _ in range(APPLY_RUNS - len(schedule))]
    #: the source's rows after each committed epoch, by the epoch's pinned end LSN
    committed: dict[int, set[tuple[Any, ...]]] = {}
    first_start: int | None = None
    with psycopg.connect(postgres_db, autocommit=True) as db:
        for fault in schedule:
            if fault == "replay":
                campaign.replay(spark)
            else:
                if committed:  # the first epoch snapshots the seed rows
                    change_source(db, rng)
                flushed(db)
                source = source_rows(db)
                campaign.epoch(spark, rng, fault)
                epoch = campaign.pipeline.epoch_for_run(f"run-{campaign.runs}")
                assert epoch is not None
                if campaign.pipeline.state(epoch) is EpochState.COMMITTED:
                    committed[campaign.pinned_end(epoch)] = source
                    if first_start is None:
                        first_start = int(campaign.pipeline.txlog.read_plan(epoch, "ingest")["changes"]["start"])
            # After every step the sinks hold the source as of the newest committed epoch's pinned LSN.
            newest = committed[max(committed)]
            assert set(db.execute("SELECT id, v, note FROM sink.scd1").fetchall()) == newest, fault
            assert set(db.execute("SELECT id, v, note FROM sink.scd2 WHERE __end_at IS NULL").fetchall()) == newest
            if source_rows(db) == newest:  # nothing changed since: EXCEPT both ways, in the database
                assert except_both_ways(db, "sink.scd1") == []
                assert except_both_ways(db, "(SELECT * FROM sink.scd2 WHERE __end_at IS NULL) AS cur") == []
        # The scd2 history: as of each committed epoch's pinned LSN, the versions current then are the source's.
        assert first_start is not None
        for end, rows in committed.items():
            assert versions_as_of(db, max(end, first_start + 1)) == rows, f"as of LSN {end}"
        chains = db.execute("SELECT id, array_agg(__start_at ORDER BY __start_at), array_agg(__end_at ORDER BY "
                            "__start_at) FROM sink.scd2 GROUP BY id").fetchall()
        for key, starts, ends in chains:  # versions never overlap: each closed at or before the next opens
            assert all(e is not None and e <= s for e, s in zip(ends[:-1], starts[1:], strict=True)), (key, starts,
                                                                                                         ends)
        assert db.execute("SELECT count(*) FROM sink.scd2 WHERE __end_at IS NOT NULL").fetchone()[0] > 0
    print(f"{len(committed)} committed epochs, runs {campaign.runs}, faults {dict(campaign.faults)}")
    assert set(campaign.faults) >= {"stage", "commit", "replay"}, campaign.faults
    campaign.epoch(spark, rng, "none")  # the next epoch still runs


# -- LAKE: the changes applied into Iceberg (scd1) and Delta (scd2) -------------------------

LAKE_CHANGE_COLUMNS = ["_table", "_commit_ts", "_xid", "_unchanged_toast"]


def copy_changes_to_lake(ctx: Any, spark: Any) -> None:
    """Every change row of the epoch into both apply_changes sinks."""
    changes = ctx.source("changes").read()
    ctx.sink("current").write(changes)
    ctx.sink("history").write(changes)


class LakeCampaign(Campaign):
    """:class:`Campaign`'s epochs, kills and replays, into an Iceberg SCD1 and a Delta SCD2 sink of table ``l``."""

    def __init__(self, root: Path, conninfo: str, plan: faults.CrashPlan) -> None:
        super().__init__(root, conninfo, plan)
        self.catalog = {"type": "sql", "uri": f"sqlite:///{root}/catalog.db", "warehouse": f"file://{root}/warehouse"}

    def spec(self, run_id: str, attempt: int = 1) -> StageSpec:
        source = {"type": "postgres_cdc", "conninfo": self.conninfo, "slot": "lake_slot",
                  "publication": "lake_pub", "tables": ["public.l"], "keep_epochs": 2}
        apply = {"keys": ["id"], "except_columns": LAKE_CHANGE_COLUMNS}
        sinks = {"current": {"type": "iceberg", "table": "cdc.l", "catalog_name": "lake", "catalog": self.catalog,
                             "apply_changes": {**apply, "history": "scd1"}},
                 "history": {"type": "delta", "path": f"file://{self.root}/delta/l",
                             "apply_changes": {**apply, "history": "scd2"}}}
        return StageSpec(pipeline="cdc", participant="ingest", run_id=run_id, attempt=attempt,
                         stage=f"{__name__}:copy_changes_to_lake", sources={"changes": source}, sinks=sinks,
                         store=self.store, key_groups=2)

    def current(self) -> set[tuple[Any, ...]]:
        """The Iceberg SCD1 table's ``(id, v, note)`` rows."""
        from pyiceberg.catalog import load_catalog

        catalog = load_catalog("lake", **self.catalog)
        try:
            rows = catalog.load_table("cdc.l").scan().to_arrow().to_pylist()
        finally:
            catalog.engine.dispose()  # type: ignore[attr-defined]
        return {(r["id"], r["v"], r["note"]) for r in rows}

    def history(self) -> dict[int, list[tuple[Any, ...]]]:
        """The Delta SCD2 table's versions per id: ``(v, note, __start_at, __end_at)`` by ``__start_at``."""
        from deltalake import DeltaTable

        versions: dict[int, list[tuple[Any, ...]]] = {}
        for r in DeltaTable(f"{self.root}/delta/l").to_pyarrow_table().to_pylist():
            versions.setdefault(r["id"], []).append((r["v"], r["note"], r["__start_at"], r["__end_at"]))
        return {k: sorted(v, key=lambda x: x[2]) for k, v in versions.items()}


def test_changes_applied_over_killed_and_replayed_epochs_keep_the_scd1_table_equal_to_the_source_and_scd2_its_versions(
        spark: Any, tmp_path: Path, postgres_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(SEED + 7)
    with psycopg.connect(postgres_db, autocommit=True) as db:
        db.execute("CREATE TABLE l (id int PRIMARY KEY, v int, note text)")
        db.execute("INSERT INTO l SELECT g, g, 'seed' FROM generate_series(0, 9) g")
        campaign = LakeCampaign(tmp_path, postgres_db, faults.install(monkeypatch))
        source: dict[int, tuple[Any, ...]] = {i: (i, "seed") for i in range(10)}
        #: The committed versions per id, as the source table held them after each committed epoch.
        versions: dict[int, list[tuple[Any, ...]]] = {}
        touched: set[int] = set(source)  # the first epoch's snapshot
        schedule = ["none", "stage", "commit", "abandon", "replay", "none", "commit", "replay"]
        schedule += [rng.choice(["none", "stage", "abandon", "commit", "replay"]) for _ in range(RUNS)]
        committed = dict(source)  # the source table as of the newest committed epoch's pinned LSN
        for fault in schedule:
            if fault == "replay":
                campaign.replay(spark)
            else:
                before = set(campaign.pipeline.txlog.epochs())
                campaign.epoch(spark, rng, fault)
                new = [e for e in campaign.pipeline.txlog.epochs() if e not in before]
                if new and campaign.pipeline.state(new[-1]) is EpochState.COMMITTED:
                    for key in sorted(touched):  # the epoch's last change per key: a version, or the end of one
                        open_ = versions.setdefault(key, [])
                        if key in source:
                            open_.append(source[key])
                        elif open_ and open_[-1] is not None:
                            open_.append(None)
                    touched, committed = set(), dict(source)
            # After each epoch: the SCD1 table is the source table as of the newest committed epoch's pinned
            # LSN (no change is made while an epoch runs), both differences empty; the SCD2 table holds the
            # committed versions, each closed where the next one (or the key's delete) begins.
            table = {(k, *v) for k, v in committed.items()}
            found = campaign.current()
            assert found - table == set() and table - found == set(), fault
            history = campaign.history()
            assert set(history) == {k for k, v in versions.items() if any(x is not None for x in v)}, fault
            for key, expected in versions.items():
                got = history.get(key, [])
                assert [(v, n) for v, n, _, _ in got] == [v for v in expected if v is not None], (fault, key)
                assert all(got[i][3] is not None and got[i][3] <= got[i + 1][2] for i in range(len(got) - 1))
                assert not got or (got[-1][3] is None) == (key in committed), (fault, key)
            for _ in range(rng.randint(1, 6)):  # changes between epochs, in small transactions
                key = rng.randrange(14)
                draw = rng.random()
                if draw < 0.1:  # an update of the key: the old key's row goes, the new key's comes
                    new = rng.randrange(14)
                    if key in source and new not in source:
                        db.execute("UPDATE l SET id = %s WHERE id = %s", (new, key))
                        source[new] = source.pop(key)
                        touched |= {key, new}
                elif draw < 0.35:
                    if key in source:
                        db.execute("DELETE FROM l WHERE id = %s", (key,))
                        source.pop(key)
                        touched.add(key)
                else:
                    value = (rng.randrange(1000), rng.choice(["x", None, "y"]))
                    db.execute("INSERT INTO l VALUES (%s, %s, %s) ON CONFLICT (id) DO UPDATE SET v = excluded.v, "
                               "note = excluded.note", (key, *value))
                    source[key] = value
                    touched.add(key)
            # The next plan pins the flushed WAL position: the changes are in it once flushed.
            written = db.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]
            while not db.execute("SELECT pg_current_wal_flush_lsn() >= %s::pg_lsn", (written,)).fetchone()[0]:
                time.sleep(0.05)
    print(f"{campaign.runs} runs, faults {dict(campaign.faults)}")
    assert set(campaign.faults) >= {"stage", "commit", "replay"}, campaign.faults
