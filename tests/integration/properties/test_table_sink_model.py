"""Table sinks over whole epochs, as a model: every committed row in the table once, and progress.

A hypothesis state machine runs epochs of a pipeline whose one sink is an Iceberg table
(a real pyiceberg SQL catalog on SQLite) or a Delta table (delta-rs), through the core
protocol as the Airflow tasks drive it: begin, stage Parquet files (partitioned by
``region``, as the Spark table sinks stage them), prepare, decide commit, commit; an epoch
refused before its decision is aborted and the pipeline moves on. Between good epochs the
rules bring the faults a table sink meets:

* an upsert epoch (``merge_keys``) of keys earlier epochs wrote (their rows replaced);
* an upsert epoch whose rows hold a key twice, or a NULL key;
* an epoch whose files changed a column's type or dropped a column;
* the checkpoint store wiped (the pipeline starts again at epoch 1, same table);
* a second store whose pipeline has the same name, and a second pipeline, into the table;
* two committers of one epoch racing (a task retry and the recovery DAG);
* a crash at every point of the commit, also after the files are placed in the table and
  before its transaction (:mod:`tests.core.faults` plus the table transaction as a crash
  point), then recovery;
* a replay of the newest epochs (append or upsert; a variant with races and crashes, a replay
  killed at a point of its prepare, decision or commit among them, resumed or aborted as an
  operator would), which only an earlier replay's range may refuse.

Checked after every step, once recovery (:func:`recovery.recover`) has run:

* no epoch is left undecided or COMMITTING: whatever refuses an epoch does so before
  the commit decision, after which only transient failures remain;
* each table holds every row of every committed epoch exactly once, and nothing else
  (read by pyiceberg's scan or deltalake, not by this package);
* every state of a table a reader can pin (each Iceberg snapshot, each Delta version) is the
  table after some whole committed epoch: an upsert epoch, also one that replaces rows of
  earlier epochs, never shows its deletes without its rows;
* a good epoch commits (after a refusal that names a store conflict, once the sink is
  given its own table, the documented way out); a bad one is refused before the decision.
"""

from __future__ import annotations

import dataclasses
import io
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import airflow_seatunnel_ckpt.core.sinks.delta as delta_tables
import airflow_seatunnel_ckpt.core.sinks.iceberg as iceberg_tables
import airflow_seatunnel_ckpt.core.sinks.postgres as postgres_tables
from airflow_seatunnel_ckpt.core import CheckpointConfig, CheckpointStore, Decision, EpochState, Pipeline
from airflow_seatunnel_ckpt.core.errors import CheckpointError
from airflow_seatunnel_ckpt.core.ops.replay import ReplayError, begin_replay, finish_replay, plan_replay, resume_replay
from airflow_seatunnel_ckpt.core.protocol.recovery import recover
from tests.core import faults
from tests.core.epochs import at_once
from tests.core.faults import CrashPlan, SimulatedCrash
from tests.integration.properties.settings import model_settings

pytestmark = pytest.mark.properties

REGIONS = ("EU", "US")
SCHEMA = pa.schema([("id", pa.int64()), ("region", pa.string()), ("amount", pa.float64())])
COMMITTED, REFUSED, FAILED = "committed", "refused", "commit failed"


@contextmanager
def table_commit_is_a_crash_point(plan: CrashPlan) -> Iterator[None]:
    """Count each table transaction (Iceberg's, Delta's create/append/merge, PostgreSQL's) as a mutation of
    ``plan``, so a crash can land after the files are placed and before the table commits."""
    with pytest.MonkeyPatch.context() as mp:
        faults.install(mp, plan)  # the storage primitives
        for module, name in ((iceberg_tables, "_commit_once"), (delta_tables, "_create"),
                             (delta_tables, "_append"), (delta_tables, "_upsert"),
                             (postgres_tables, "_commit_once")):
            real = getattr(module, name)

            def at_point(*args: Any, _real: Callable[..., Any] = real, _name: str = name, **kwargs: Any) -> Any:
                plan.tick(f"table transaction {_name}")
                return _real(*args, **kwargs)

            mp.setattr(module, name, at_point)
        yield


@dataclass
class Writer:
    """One pipeline of one store writing one sink into one table."""

    label: str
    store_url: str
    name: str
    table: int = 0
    runs: int = 0
    #: A refusal naming another store's or pipeline's epochs is expected (and fixed by a new table).
    conflict: bool = False
    pipeline: Pipeline = field(init=False)

    def __post_init__(self) -> None:
        self.pipeline = self.open()

    def open(self) -> Pipeline:
        """A fresh ``Pipeline`` object, as another process (a retry, the recovery DAG) builds it."""
        config = CheckpointConfig.from_mapping({"storage_url": self.store_url, "max_retries": 2})
        return CheckpointStore(config).pipeline(self.name)


class TableSinkModel(RuleBasedStateMachine):
    """Good and bad epochs, store resets, other writers, races and crashes into one table."""

    #: The table format of the sink.
    FORMAT = "iceberg"
    #: The fault rules this model runs between good epochs (a subclass picks some).
    FAULTS: frozenset[str] = frozenset({"bad_keys", "schema", "reset", "second_store", "second_pipeline",
                                        "race", "crash"})

    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="table-sink-model-"))
        self.catalog = {"type": "sql", "uri": f"sqlite:///{self.root}/catalog.db",
                        "warehouse": f"file://{self.root}/warehouse"}
        self.main = Writer("main", f"file://{self.root}/store-a", "orders")
        self.writers = [self.main]
        self.upsert = False
        self.next_id = 0
        self.tables = 1
        self.expected: dict[int, Counter[int]] = {0: Counter()}
        #: table -> its ids after each committed epoch (the empty table first): what a pinned reader may see.
        self.states: dict[int, list[Counter[int]]] = {0: [Counter()]}
        #: table -> the writer whose epoch committed into it first.
        self.owners: dict[int, str] = {}
        #: (writer label, epoch) -> (table, ids) of epochs decided commit and not yet acknowledged.
        self.pending: dict[tuple[str, int], tuple[int, list[int | None]]] = {}
        #: (writer label, epoch) -> the ids the epoch's stage wrote (what a replay of it writes again).
        self.read_by: dict[tuple[str, int], list[int | None]] = {}

    def teardown(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    @initialize(upsert=st.booleans())
    def configure(self, upsert: bool) -> None:
        self.upsert = upsert

    # -- the sink ------------------------------------------------------------------------
    def options(self, table: int) -> dict[str, Any]:
        keys = {"merge_keys": ["id"]} if self.upsert else {}
        if self.FORMAT == "iceberg":
            return {"type": "iceberg", "table": f"lake.orders_{table}", "catalog_name": "lake",
                    "catalog": self.catalog, "partition_by": ["region"], **keys}
        return {"type": "delta", "path": f"file://{self.root}/tables/orders_{table}", "partition_by": ["region"],
                **keys}

    def target_of(self, options: dict[str, Any]) -> str:
        """The sink's target URL, as its Spark sink names it."""
        return str(options.get("path") or f"iceberg://lake/{options['table']}")

    def table_ids(self, table: int) -> list[int | None]:
        """The ``id`` column of the table as its format's own library reads it ([] before it exists)."""
        if self.FORMAT == "iceberg":
            from pyiceberg.catalog import load_catalog
            from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

            catalog = load_catalog("lake", **self.catalog)
            try:
                data = catalog.load_table(f"lake.orders_{table}").scan().to_arrow()
            except (NoSuchTableError, NoSuchNamespaceError):
                return []
            finally:
                catalog.engine.dispose()  # type: ignore[attr-defined]
            return data.column("id").to_pylist()
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        try:
            return DeltaTable(f"{self.root}/tables/orders_{table}").to_pyarrow_table().column("id").to_pylist()
        except TableNotFoundError:
            return []

    def table_history(self, table: int) -> list[tuple[str, list[int | None]]]:
        """The ``id`` column of every state of the table a reader can pin: each Iceberg snapshot
        (``scan(snapshot_id=...)``), each Delta version (``DeltaTable(..., version=v)``)."""
        if self.FORMAT == "iceberg":
            from pyiceberg.catalog import load_catalog
            from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

            catalog = load_catalog("lake", **self.catalog)
            try:
                loaded = catalog.load_table(f"lake.orders_{table}")
                return [(f"snapshot {s.snapshot_id} ({s.summary.operation.value if s.summary else '?'})",
                         loaded.scan(snapshot_id=s.snapshot_id).to_arrow().column("id").to_pylist())
                        for s in loaded.snapshots()]
            except (NoSuchTableError, NoSuchNamespaceError):
                return []
            finally:
                catalog.engine.dispose()  # type: ignore[attr-defined]
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        uri = f"{self.root}/tables/orders_{table}"
        try:
            newest = DeltaTable(uri).version()
        except TableNotFoundError:
            return []
        return [(f"version {v}", DeltaTable(uri, version=v).to_pyarrow_table().column("id").to_pylist())
                for v in range(newest + 1)]

    def rows(self, count: int, schema: pa.Schema = SCHEMA, again: list[int] | None = None) -> pa.Table:
        """``count`` rows of new ids (and, for an upsert, of the ids ``again``, with new amounts)."""
        ids = [*(again or []), *range(self.next_id, self.next_id + count)]
        self.next_id += count
        # The amount changes with every epoch, so an upserted row differs from the row it replaces.
        cols = {"id": ids, "region": [REGIONS[i % 2] for i in ids], "amount": [i * 1.5 + self.next_id for i in ids]}
        if "amount" in schema.names and schema.field("amount").type == pa.string():
            cols["amount"] = [str(v) for v in cols["amount"]]
        return pa.table({n: cols[n] for n in schema.names}, schema=schema)

    def stage(self, w: Writer, epoch: int, rows: pa.Table, below: str = "") -> Any:
        """One Parquet file per region below the attempt's staging (and ``below`` it), and the sink's manifest
        (of every file staged so far)."""
        staging = w.pipeline.staging_path(epoch, 1, "orders")
        for region in REGIONS:
            part = rows.filter(pc.starts_with(rows.column("region"), region))  # "EU\x00" too
            if part.num_rows:
                buf = io.BytesIO()
                pq.write_table(part, buf)
                folder = "/".join(p for p in (staging, below, f"__partition_region={region}") if p)
                w.pipeline.storage.write_atomic(f"{folder}/part-00000.parquet", buf.getvalue())
        options = self.options(w.table)
        target = self.target_of(options)
        manifest = w.pipeline.manifest_for_staged(epoch, 1, "orders", target, rows.num_rows)
        return dataclasses.replace(manifest, table=options)

    # -- epochs --------------------------------------------------------------------------
    def decided(self, w: Writer, rows: pa.Table) -> tuple[int, str | None]:
        """Begin, stage, prepare and decide commit; an epoch refused before its decision (by
        prepare, or by decide deciding abort) is aborted. The refusal, if any."""
        w.runs += 1
        run_id = f"{w.label}-{w.runs}"
        epoch = w.pipeline.begin(run_id).epoch
        try:
            w.pipeline.prepare(epoch, "ingest", 1, run_id=run_id, sinks=[self.stage(w, epoch, rows)])
            decision = w.pipeline.decide(epoch, Decision.COMMIT, "all prepared", by="model")
        except CheckpointError as exc:
            w.pipeline.abort(epoch, f"refused before the decision: {exc}", by="model")
            return epoch, f"{type(exc).__name__}: {exc}"
        if decision.decision is Decision.ABORT:
            w.pipeline.abort(epoch, decision.reason, by="model")  # finishes the abort the decision made
            return epoch, f"decided abort: {decision.reason}"
        self.pending[(w.label, epoch)] = (w.table, rows.column("id").to_pylist())
        self.read_by[(w.label, epoch)] = rows.column("id").to_pylist()
        return epoch, None

    def run_epoch(self, w: Writer, rows: pa.Table) -> tuple[str, str | None]:
        epoch, refusal = self.decided(w, rows)
        if refusal is not None:
            return REFUSED, refusal
        try:
            w.pipeline.commit(epoch)
        except CheckpointError as exc:
            return FAILED, f"{type(exc).__name__}: {exc}"
        self.settle()
        return COMMITTED, None

    def good_epoch_of(self, w: Writer, count: int) -> None:
        """A good epoch commits; after a store conflict it may be refused once, before its
        decision, and commits once the sink has a table of its own. Into a table another
        pipeline commits into, it must be refused."""
        owner = self.owners.get(w.table)
        outcome, error = self.run_epoch(w, self.rows(count))
        if owner is not None and self.writer_named(owner).name != w.name:
            assert outcome == REFUSED, (
                f"an epoch of pipeline {w.name!r} into table {w.table}, which pipeline "
                f"{self.writer_named(owner).name!r} commits into, was not refused before its decision "
                f"({outcome}: {error})")
        if outcome == REFUSED and w.conflict:
            self.own_table(w)
            outcome, error = self.run_epoch(w, self.rows(count))
        assert outcome != REFUSED, f"a good epoch of {w.label} was refused: {error}"

    @precondition(lambda self: "replay" in self.FAULTS)
    @rule(back=st.integers(1, 3))
    def replay_of_the_newest_epochs(self, back: int) -> None:
        """A replay of the main pipeline's newest ``back`` epochs, each staging the same ids again: the table
        holds every row once afterwards (the replaced epochs' rows deleted, the new ones added; an upsert's keys
        restored to their rows before the replayed epochs, then upserted again)."""
        self.replay(back)

    @precondition(lambda self: "replay" in self.FAULTS and "crash" in self.FAULTS)
    @rule(back=st.integers(1, 3), point=st.integers(1, 8))
    def crash_in_a_replays_commit(self, back: int, point: int) -> None:
        """A replay whose process dies before the ``point``-th mutation of its prepare, decision and commit
        (the table transaction included), finished as an operator would: a decided replay is resumed
        (``resume_replay``, as the next replay does), an undecided one aborted by recovery (its lease gone)."""
        w = self.main
        epoch = self.replay(back, crash_at=point)
        if epoch is None or w.pipeline.state(epoch).final:
            return
        try:
            resume_replay(w.open())  # a decided replay is committed
        except ReplayError as exc:  # an undecided one: recovery aborts it (nothing of it was published)
            assert "recover" in str(exc), exc
            recover(w.open(), dry_run=False, now=time.time() + 3600)
        assert w.pipeline.state(epoch).final, f"replay epoch {epoch} left {w.pipeline.state(epoch).value}"

    def replay(self, back: int, crash_at: int | None = None) -> int | None:
        """Replay the main pipeline's newest ``back`` epochs (see :meth:`replay_of_the_newest_epochs`); with
        ``crash_at`` the process dies before that mutation of the replay's finish. The replay epoch, if one began."""
        w = self.main
        committed = [e for e in w.pipeline.committed_epochs() if (w.label, e) in self.read_by]
        if not committed:
            return None
        try:
            plan = plan_replay(w.pipeline, committed[max(0, len(committed) - back)])
        except ReplayError as exc:  # only from inside an earlier replay's range (refused before anything was written)
            assert "together with epochs" in str(exc), f"the replay was refused: {exc}"
            return None
        epoch, run_id = begin_replay(w.pipeline, plan, reason="model", by="model")
        manifest, count = None, 0
        for e in plan.epochs:
            ids = self.read_by[(w.label, e)]
            again = pa.table({"id": ids, "region": [REGIONS[(i or 0) % 2] for i in ids],
                              "amount": [(i or 0) * 1.5 for i in ids]}, schema=SCHEMA)
            manifest = self.stage(w, epoch, again, f"replayed-{e}")
            count += again.num_rows
        assert manifest is not None
        sinks = [dataclasses.replace(manifest, rows=count)]
        if crash_at is None:
            finish_replay(w.pipeline, epoch, run_id, plan, 1, sinks=sinks, operators={}, reason="model", by="model")
            return epoch
        crash = CrashPlan()
        with table_commit_is_a_crash_point(crash):
            crash.arm(crash_at)
            try:
                finish_replay(w.pipeline, epoch, run_id, plan, 1, sinks=sinks, operators={}, reason="model",
                              by="model")
            except SimulatedCrash:
                pass
            finally:
                crash.disarm()
        return epoch

    def decided_good(self, w: Writer, count: int) -> int:
        """A good epoch decided commit (moved to a table of its own after a conflict refusal); an
        upsert epoch writes two keys of earlier epochs again, if there are any."""
        epoch, refusal = self.decided(w, self.rows(count, again=self.committed_keys(w)))
        if refusal is not None and w.conflict:
            self.own_table(w)
            epoch, refusal = self.decided(w, self.rows(count))
        assert refusal is None, f"a good epoch of {w.label} was refused: {refusal}"
        return epoch

    def own_table(self, w: Writer) -> None:
        """The documented way out of a conflict: give the sink a table of its own."""
        w.table = self.tables
        self.expected[self.tables] = Counter()
        self.states[self.tables] = [Counter()]
        self.tables += 1
        w.conflict = False

    def settle(self) -> None:
        """Move the rows of epochs that reached COMMITTED into the expected tables."""
        for (label, epoch), (table, ids) in sorted(self.pending.items(), key=lambda item: item[0][1]):
            state = self.writer_named(label).pipeline.state(epoch)
            if state is EpochState.COMMITTED:
                if self.upsert:  # one row per key: the epoch's rows replace those of its keys
                    for i in ids:
                        self.expected[table][i] = 1
                else:
                    self.expected[table].update(ids)
                self.states[table].append(Counter(self.expected[table]))
                self.owners.setdefault(table, label)
            if state in (EpochState.COMMITTED, EpochState.ABORTED):
                del self.pending[(label, epoch)]

    # -- rules ---------------------------------------------------------------------------
    @rule(count=st.integers(1, 4))
    def good_epoch(self, count: int) -> None:
        self.good_epoch_of(self.main, count)

    def committed_keys(self, w: Writer, most: int = 2) -> list[int]:
        """Up to ``most`` keys committed into ``w``'s table, for an upsert sink ([] otherwise)."""
        return sorted(i for i in self.expected[w.table] if i is not None)[:most] if self.upsert else []

    @precondition(lambda self: self.upsert and self.expected[self.main.table])
    @rule(data=st.data(), count=st.integers(0, 3))
    def upsert_of_committed_keys(self, data: st.DataObject, count: int) -> None:
        """An upsert epoch of some keys earlier epochs committed (their rows replaced) and new ones."""
        committed = self.committed_keys(self.main, most=len(self.expected[self.main.table]))
        again = data.draw(st.lists(st.sampled_from(committed), min_size=1, max_size=4, unique=True))
        outcome, error = self.run_epoch(self.main, self.rows(count, again=again))
        assert outcome != REFUSED or self.main.conflict, f"an upsert of committed keys was refused: {error}"

    @precondition(lambda self: self.upsert and "bad_keys" in self.FAULTS)
    @rule(null=st.booleans())
    def epoch_with_a_bad_merge_key(self, null: bool) -> None:
        """Upsert rows holding one key twice, or a NULL key: refused before the decision."""
        rows = self.rows(2)
        bad = pa.table({"id": pa.array([None if null else rows.column("id")[0].as_py()], pa.int64()),
                        "region": ["EU"], "amount": [0.5]}, schema=SCHEMA)
        outcome, error = self.run_epoch(self.main, pa.concat_tables([rows, bad]))
        what = "a NULL key" if null else "a duplicate key"
        assert outcome != COMMITTED, f"an upsert epoch with {what} committed into the table"
        if outcome == FAILED or self.main.conflict:
            return  # wedged after the decision (the invariants report it), or refused for the conflict
        assert "id" in str(error), f"the refusal of {what} does not name the key: {error}"

    @precondition(lambda self: "schema" in self.FAULTS and self.expected[self.main.table])
    @rule(change=st.sampled_from(["type", "dropped"]))
    def epoch_with_a_schema_change(self, change: str) -> None:
        """``amount`` as text, or no ``amount`` column: refused before the decision."""
        schema = (pa.schema([("id", pa.int64()), ("region", pa.string()), ("amount", pa.string())])
                  if change == "type" else pa.schema([("id", pa.int64()), ("region", pa.string())]))
        outcome, error = self.run_epoch(self.main, self.rows(2, schema))
        assert outcome != COMMITTED, f"an epoch whose files {change} a column committed into the table"
        if outcome == REFUSED and not self.main.conflict:
            assert "amount" in str(error), f"the refusal does not name the column: {error}"

    @precondition(lambda self: "reset" in self.FAULTS and self.expected[self.main.table])
    @rule(count=st.integers(1, 4))
    def reset_store(self, count: int) -> None:
        """The store is wiped and the pipeline runs again from epoch 1, into the same table."""
        shutil.rmtree(self.main.store_url.removeprefix("file://"), ignore_errors=True)
        wiped = [w for w in self.writers if w.store_url == self.main.store_url]  # every pipeline of the store
        self.pending = {k: v for k, v in self.pending.items() if k[0] not in {w.label for w in wiped}}
        for w in wiped:
            w.pipeline = w.open()
            w.conflict = True
        self.good_epoch_of(self.main, count)

    @precondition(lambda self: "second_store" in self.FAULTS)
    @rule(count=st.integers(1, 3))
    def epoch_of_a_second_store(self, count: int) -> None:
        """Another store's pipeline of the same name writes into the same table."""
        w = self.writer("second-store", f"file://{self.root}/store-b", self.main.name)
        self.good_epoch_of(w, count)

    @precondition(lambda self: "second_pipeline" in self.FAULTS)
    @rule(count=st.integers(1, 3))
    def epoch_of_a_second_pipeline(self, count: int) -> None:
        """Another pipeline of the store writes into the main pipeline's table: whichever of the
        two commits into it second is refused before its decision (see :meth:`good_epoch_of`)
        and commits once it has a table of its own."""
        if self.main.table not in self.owners:
            self.good_epoch_of(self.main, 1)  # the table is the main pipeline's
        self.good_epoch_of(self.writer("second-pipeline", self.main.store_url, "returns"), count)

    def writer_named(self, label: str) -> Writer:
        return next(w for w in self.writers if w.label == label)

    def writer(self, label: str, store_url: str, name: str) -> Writer:
        for w in self.writers:
            if w.label == label:
                return w
        w = Writer(label, store_url, name, table=self.main.table, conflict=True)
        for other in self.writers:  # whichever commits first, the other's epochs may be refused
            other.conflict = other.conflict or other.table == w.table
        self.writers.append(w)
        return w

    @precondition(lambda self: "race" in self.FAULTS)
    @rule(count=st.integers(1, 4))
    def racing_committers(self, count: int) -> None:
        """Two processes commit the same decided epoch at once."""
        epoch = self.decided_good(self.main, count)
        at_once([lambda: self.main.open().commit(epoch), lambda: self.main.open().commit(epoch)])

    @precondition(lambda self: "crash" in self.FAULTS)
    @rule(count=st.integers(1, 4), point=st.integers(1, 6))
    def crash_in_the_commit(self, count: int, point: int) -> None:
        """The committing process dies before its ``point``-th mutation (the table
        transaction included), e.g. with every file placed in the table and none committed."""
        epoch = self.decided_good(self.main, count)
        plan = CrashPlan()
        with table_commit_is_a_crash_point(plan):
            plan.arm(point)
            try:
                self.main.pipeline.commit(epoch)
            except SimulatedCrash:
                pass
            finally:
                plan.disarm()

    # -- invariants ----------------------------------------------------------------------
    @invariant()
    def after_recovery_every_epoch_finished_and_each_committed_row_in_the_table_once(self) -> None:
        """Recovery first (it finishes what a crash or a race left COMMITTING), then the checks."""
        self.no_epoch_unfinished_after_recovery()
        self.each_committed_row_in_the_table_once()
        self.every_pinnable_state_holds_whole_epochs()

    def no_epoch_unfinished_after_recovery(self) -> None:
        for w in self.writers:
            recover(w.open(), dry_run=False)
        self.settle()
        for w in self.writers:
            unfinished = [(s.epoch, s.state.value) for s in w.pipeline.list_epochs()
                          if s.state not in (EpochState.COMMITTED, EpochState.ABORTED)]
            assert not unfinished, (
                f"{w.label} ({w.name!r}): epochs left unfinished after recovery: {unfinished}; "
                f"{self.why(w, unfinished)}")

    def why(self, w: Writer, unfinished: list[tuple[int, str]]) -> str:
        """The commit error of the first unfinished epoch (for the failure message)."""
        try:
            w.open().commit(unfinished[0][0])
        except Exception as exc:  # reported, not handled
            return f"its commit says: {type(exc).__name__}: {exc}"
        return "its commit now succeeds"

    def each_committed_row_in_the_table_once(self) -> None:
        for table, expected in self.expected.items():
            found = Counter(self.table_ids(table))
            missing = sorted(i for i in expected if found[i] < expected[i])
            extra = sorted((i for i in found if found[i] > expected[i]), key=lambda i: (i is None, i or 0))
            assert not missing and not extra, (
                f"{self.FORMAT} table {table}: rows of committed epochs missing {missing[:10]}, rows more often "
                f"than committed {extra[:10]} (writers: {[(w.label, w.table) for w in self.writers]})")

    def every_pinnable_state_holds_whole_epochs(self) -> None:
        for table, states in self.states.items():
            for label, ids in self.table_history(table):
                assert Counter(ids) in states, (
                    f"{self.FORMAT} table {table}: {label} holds ids {sorted(ids, key=lambda i: (i is None, i or 0))}, "
                    f"which is no table after a whole committed epoch: a reader pinned to it sees part of an epoch "
                    f"(the tables after each epoch: {[sorted(s) for s in states]})")


class DeltaSinkModel(TableSinkModel):
    FORMAT = "delta"


def variant(base: type[TableSinkModel], name: str, faults_: set[str]) -> type[TableSinkModel]:
    """``base`` restricted to some fault rules (each bug then has a property of its own)."""
    return type(name, (base,), {"FAULTS": frozenset(faults_), "__doc__": f"{base.__doc__} Faults: {faults_}."})


FAST = {"examples": 4, "steps": 6}


def killed_replays(upsert: bool, points: range = range(1, 11)) -> Callable[[TableSinkModel], Iterator[None]]:
    """A fixed run of a model (:func:`settings.run_model`): for each crash point two good epochs, then a replay
    of them killed there and finished, then the model's checks (``points`` 1..10: every mutation of a replay's
    prepare, decision, table transaction, ``committed`` and outcome records; the derandomized fast slice
    seldom reaches a killed replay with epochs to replay)."""
    def scenario(model: TableSinkModel) -> Iterator[None]:
        model.configure(upsert)
        for point in points:
            model.good_epoch(3)
            model.good_epoch(2)
            model.crash_in_a_replays_commit(2, point)
            yield
    return scenario


def model_tests(base: type[TableSinkModel], fmt: str) -> dict[str, Any]:
    """The test cases of ``base``'s model, one per concern (its fault rules), named ``test_<fmt>_sink_<concern>``."""
    tests: dict[str, Any] = {}
    for concern, chosen in (("refuses_bad_epochs_before_the_decision", {"bad_keys", "schema"}),
                            ("survives_a_store_reset", {"reset"}),
                            ("refuses_a_second_store_before_the_decision", {"second_store"}),
                            ("refuses_a_second_pipeline_before_the_decision", {"second_pipeline"}),
                            ("commits_once_through_races_and_crashes", {"race", "crash"}),
                            ("holds_every_committed_row_once_under_all_faults", set(base.FAULTS))):
        model = variant(base, f"{fmt.title()}{concern.title().replace('_', '')}", chosen)
        model.TestCase.settings = model_settings(fast_examples=FAST["examples"], fast_steps=FAST["steps"])
        tests[f"test_{fmt}_sink_{concern}"] = model.TestCase
    return tests


globals().update({**model_tests(TableSinkModel, "iceberg"), **model_tests(DeltaSinkModel, "delta")})
_ICEBERG_REPLAYS = variant(TableSinkModel, "IcebergReplaysEpochs", {"replay", "race", "crash"})
_ICEBERG_REPLAYS.TestCase.settings = model_settings(fast_examples=FAST["examples"], fast_steps=FAST["steps"])
test_iceberg_sink_replays_append_and_upsert_epochs_leaving_every_row_once = _ICEBERG_REPLAYS.TestCase
_DELTA_REPLAYS = variant(DeltaSinkModel, "DeltaReplaysEpochs", {"replay", "race", "crash"})
_DELTA_REPLAYS.TestCase.settings = model_settings(fast_examples=FAST["examples"], fast_steps=FAST["steps"])
test_delta_sink_replays_append_and_upsert_epochs_leaving_every_row_once = _DELTA_REPLAYS.TestCase
