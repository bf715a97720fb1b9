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
