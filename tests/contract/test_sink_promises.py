"""Promises every sink keeps, each parametrised over every sink's context (and mode where it matters).

- **Refused before the decision**: each kind of epoch a sink refuses (a changed schema, a
  merge key repeated or NULL, a target another store or another pipeline of the same store
  owns, a PostgreSQL constraint) aborts the epoch at its decision, the target unchanged,
  and the next epoch commits.
- **A crash before every commit mutation**: the commit of an epoch, and a replay's prepare,
  decision and commit, are killed before each of their mutations in turn (every store write,
  the sink's table commit); another process commits it, once (an undecided replay: recovery
  aborts it and the replay runs again), and the next epoch runs. (Killed replays: one mode per
  connector in CI, every mode with ``RELIABILITY_FULL=1``.)
- **Replay replaces, never appends**, and a full refresh holds exactly the replayed rows.
- **Bounded waits**: a commit blocked by a lock (a PostgreSQL marker row held by a paused
  committer, an Iceberg catalog locked by another writer) fails as transient within its
  timeout, the epoch stays COMMITTING, and the retry commits.
"""

from __future__ import annotations

import collections
import re
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from airflow_seatunnel_ckpt.core import Decision, EpochState
from airflow_seatunnel_ckpt.core.errors import CheckpointError
from airflow_seatunnel_ckpt.core.ops.replay import ReplayError, resume_replay
from airflow_seatunnel_ckpt.core.protocol.recovery import recover
from tests.conftest import FULL_CAMPAIGNS
from tests.contract.sinks import (
    APPEND,
    CONTEXTS,
    REGIONS,
    SCHEMA,
    SNAPSHOT,
    UPSERT,
    Epochs,
    PostgresContext,
    SinkContext,
    StagedReplay,
    context_of,
    epoch_rows,
    rows_of,
)
from tests.core.faults import CrashPlan, crash_at_every_mutation, install

ALL_MODES = (APPEND, UPSERT, SNAPSHOT)


def rows(ids: list[Any], regions: list[Any] | None = None, amounts: list[Any] | None = None,
         schema: pa.Schema = SCHEMA) -> Callable[[int], pa.Table]:
    """An epoch's rows, as given (``regions`` and ``amounts`` default to the suite's)."""
    def make(epoch: int) -> pa.Table:
        return pa.table({"id": ids, "region": regions or [REGIONS[(i or 0) % 2] for i in ids],
                         "amount": amounts or [(i or 0) + epoch / 10 for i in ids]}, schema=schema)
    return make


# -- refused before the decision ----------------------------------------------------------

@dataclass
class Setup:
    """What a refusal case made: the refused epoch's rows, and the pipeline whose next epoch must commit."""

    rows: Callable[[int], pa.Table]
    follow: Epochs
    #: Runs between the refused epoch's prepare and its decision (another writer landing first).
    between: Callable[[], object] = field(default=lambda: None)


def _own(bad: Callable[[int], pa.Table]) -> Callable[[Epochs], Setup]:
    """A refusal of rows: one good epoch first, then ``bad``; the pipeline itself goes on."""
    def make(epochs: Epochs) -> Setup:
        epochs.run([1, 2, 3])
        return Setup(bad, epochs)
    return make


def _owned_by(store: str, name: str, race: bool = False) -> Callable[[Epochs], Setup]:
    """The target belongs to pipeline ``name`` of store ``store``, whose next epoch goes on.

    With ``race`` neither has committed when the refused epoch prepares: the owner's first
    commit lands between that prepare and the decision.
    """
    def make(epochs: Epochs) -> Setup:
        owner = Epochs(epochs.context, epochs.mode, store=store, name=name)
        if race:
            return Setup(rows([4, 5]), owner, between=lambda: owner.run([1, 2, 3]))
        owner.run([1, 2, 3])
        return Setup(rows([4, 5]), owner)
    return make


def _constrained(bad: Callable[[int], pa.Table]) -> Callable[[Epochs], Setup]:
    """A PostgreSQL table whose owner declared constraints; one good epoch, then ``bad``."""
    def make(epochs: Epochs) -> Setup:
        import psycopg

        assert isinstance(epochs.context, PostgresContext)
        with psycopg.connect(epochs.context.dsn) as conn:
            conn.execute("CREATE TABLE public.orders (id bigint PRIMARY KEY, region varchar(2) NOT NULL "
                         "CONSTRAINT region_known CHECK (region <> 'XX'), amount numeric(6, 2), _epoch bigint)")
        epochs.run([1, 2, 3])
        return Setup(bad, epochs)
    return make


#: The contexts whose sink applies change rows (``apply_changes``).
APPLYING = frozenset(name for name, context in CONTEXTS.items() if context.applies)


def changes(ids: list[int], ops: list[str] | None = None, lsns: list[Any] | None = None) -> Callable[[int], pa.Table]:
    """Change rows of ``ids`` with the operations and sequence given (the context adds the rest)."""
    def make(epoch: int) -> pa.Table:
        return rows(ids)(epoch).append_column("_op", pa.array(ops or ["update"] * len(ids), pa.string())) \
            .append_column("_lsn", pa.array(lsns or [epoch] * len(ids), pa.int64()))
    return make


TABLES = frozenset(name for name, context in CONTEXTS.items() if context.table)
#: kind: (connectors, modes, the case, what the refusal names)
REFUSALS: dict[str, tuple[frozenset[str], frozenset[str], Callable[[Epochs], Setup], str]] = {
    "changed-column-type": (TABLES, frozenset({APPEND, UPSERT}), _own(rows(
        [4], amounts=["lots"], schema=pa.schema([f if f.name != "amount" else pa.field("amount", pa.string())
                                                 for f in SCHEMA]))), "amount"),
    "dropped-column": (frozenset({"iceberg", "delta"}), frozenset({APPEND, UPSERT}), _own(
        lambda e: pa.table({"id": [4], "region": ["EU"]})), "amount"),
    # (a sink applying changes takes several changes of one key: the last applies)
    "repeated-merge-key": (TABLES - APPLYING, frozenset({UPSERT}), _own(rows([4, 4])), r"more than once|'id'"),
    "null-merge-key": (TABLES, frozenset({UPSERT}), _own(rows([None, 5])), r"NULL"),
    "another-store": (frozenset(CONTEXTS), frozenset(ALL_MODES), _owned_by("other-store", "orders"),
                      r"store|owner"),
    "another-pipeline-of-the-store": (frozenset(CONTEXTS), frozenset(ALL_MODES), _owned_by("store", "other"),
                                      r"pipeline 'other'"),
    "another-store-first-commit-race": (frozenset(CONTEXTS), frozenset(ALL_MODES),
                                        _owned_by("other-store", "orders", race=True), r"store|owner"),
    "pg-primary-key-repeated-by-append": (frozenset({"postgres"}), frozenset({APPEND}), _constrained(rows([3, 4])),
                                          r"orders_pkey"),
    "pg-not-null": (frozenset({"postgres"}), frozenset({APPEND}), _constrained(rows([4], regions=[None])),
                    r"region"),
    "pg-varchar-too-short": (frozenset({"postgres"}), frozenset({APPEND}),
                             _constrained(rows([4], regions=["EUROPE"])), r"region"),
    "pg-check": (frozenset({"postgres"}), frozenset({APPEND}), _constrained(rows([4], regions=["XX"])),
                 r"region_known"),
    "pg-numeric-overflow": (frozenset({"postgres"}), frozenset({APPEND}),
                            _constrained(rows([4], amounts=[12345678.0])), r"amount"),
    "pg-nul-character": (frozenset({"postgres"}), frozenset({APPEND}), _constrained(rows([4], regions=["E\x00"])),
                         r"region"),
    # apply_changes (PGAPPLY): change rows the sink cannot apply.
    "apply-unknown-operation": (APPLYING, frozenset({UPSERT}), _own(changes([4], ops=["merge"])),
                                r"'_op' holds 'merge'"),
    "apply-null-sequence": (APPLYING, frozenset({UPSERT}), _own(changes([4], lsns=[None])), r"'_lsn' is NULL"),
}


def refusal_cases() -> list[Any]:
    return [pytest.param(connector, mode, kind, id=f"{connector}-{mode}-{kind}")
            for kind, (connectors, modes, _, _) in REFUSALS.items()
            for connector, context in CONTEXTS.items() for mode in ALL_MODES
            if connector in connectors and mode in modes and mode in context.modes]


@pytest.mark.parametrize(("connector", "mode", "kind"), refusal_cases())
def test_each_refusal_kind_aborts_the_epoch_at_its_decision_the_target_unchanged_and_the_next_epoch_commits(
        tmp_path: Path, request: pytest.FixtureRequest, connector: str, mode: str, kind: str) -> None:
    _, _, make, names = REFUSALS[kind]
    context = context_of(connector, tmp_path, request)
    epochs = Epochs(context, mode)
    setup = make(epochs)
    epoch, _ = epochs.prepare(setup.rows)
    setup.between()
    target = context.rows()

    record = epochs.decide(epoch)

    assert record.decision is Decision.ABORT, f"{connector} {mode} {kind}: decided {record.decision.value}"
    assert epochs.pipeline.state(epoch) is EpochState.ABORTED
    assert "sink 'orders'" in record.reason and re.search(names, record.reason), record.reason
    assert context.rows() == target, "the refused epoch changed the target"
    setup.follow.run([20, 21])
    assert context.rows() == setup.follow.states[-1]


# -- a crash before every commit mutation -------------------------------------------------

def fresh_contexts(connector: str, request: pytest.FixtureRequest, databases: list[str]
                   ) -> Callable[[Path], SinkContext]:
    """A new context of ``connector`` per root; PostgreSQL's each on a database of its own (added to ``databases``)."""
    def context_at(root: Path) -> SinkContext:
        if not issubclass(CONTEXTS[connector], PostgresContext):
            return context_of(connector, root, request)
        server = request.getfixturevalue("postgres_server")
        databases.append(server.create_database())
        return context_of(connector, root, request, dsn=server.conninfo(databases[-1]))
    return context_at


def drop(request: pytest.FixtureRequest, databases: list[str]) -> None:
    """Drop the databases :func:`fresh_contexts` created."""
    if databases:
        server = request.getfixturevalue("postgres_server")
        for name in databases:
            server.drop_database(name)


def ticking_commits(context: SinkContext, plan: CrashPlan, monkeypatch: pytest.MonkeyPatch) -> None:
    """Count the sink's commit as a mutation of ``plan``: a table commit goes through the table's library,
    not the store, so it is a crash point of its own."""
    for owner, name in context.table_commits():
        real = getattr(owner, name)

        def at_commit(*args: Any, _real: Callable[..., Any] = real, _name: str = name, **kwargs: Any) -> Any:
            plan.tick(f"the sink's commit ({_name})")
            return _real(*args, **kwargs)

        monkeypatch.setattr(owner, name, at_commit)


@dataclass
class World:
    """One pipeline with one committed epoch and a second one decided commit (its commit is the step)."""

    epochs: Epochs
    epoch: int
    rows: pa.Table


COMMIT_IDS = [3, 4, 5, 6]


@pytest.mark.crash
@pytest.mark.slow
@pytest.mark.parametrize(("connector", "mode"), [
    pytest.param(c, m, id=f"{c}-{m}") for c, context in CONTEXTS.items() for m in (APPEND, UPSERT)
    if m in context.modes])
def test_a_commit_killed_before_each_of_its_mutations_is_committed_once_by_another_process_and_the_next_epoch_runs(
        tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, connector: str,
        mode: str) -> None:
    plan = install(monkeypatch)
    databases: list[str] = []
    contexts = fresh_contexts(connector, request, databases)
    ticking_commits(contexts(tmp_path / "probe"), plan, monkeypatch)

    def setup(n: int) -> World:
        epochs = Epochs(contexts(tmp_path / f"crash-{n}"), mode)
        epochs.run([1, 2, 3, 4])
        epoch, staged = epochs.prepare(lambda e: epoch_rows(COMMIT_IDS, e))
        assert epochs.decide(epoch).decision is Decision.COMMIT
        return World(epochs, epoch, staged)

    def resume(world: World) -> None:
        world.epochs.context.observe()
        world.epochs.open().commit(world.epoch)

    def check(world: World, crashed: bool) -> None:
        epochs = world.epochs
        epochs.context.observe()
        epochs.settled(world.epoch, COMMIT_IDS, world.rows)
        assert epochs.context.rows() == epochs.states[-1]
        for label, found in epochs.context.history():
            assert found in epochs.states, f"{label} holds {found}, not the target after a whole epoch"
        epochs.run([7, 8])
        assert epochs.context.rows() == epochs.states[-1]

    try:
        run = crash_at_every_mutation(plan, setup, lambda w: w.epochs.pipeline.commit(w.epoch), resume, check)
    finally:
        drop(request, databases)
    assert run.crash_points >= 2, run.crashed_at
    assert any("the sink's commit" in c for c in run.crashed_at), run.crashed_at


# -- replay replaces, never appends -------------------------------------------------------

@pytest.mark.parametrize(("connector", "mode", "from_epoch"), [
    pytest.param(c, m, f, id=f"{c}-{m}-{'refresh' if f == 1 else 'from-2'}")
    for c, context in CONTEXTS.items() for m in ALL_MODES if m in context.modes for f in (1, 2)])
def test_a_replay_replaces_the_replayed_epochs_output_and_never_appends(
        tmp_path: Path, request: pytest.FixtureRequest, connector: str, mode: str, from_epoch: int) -> None:
    context = context_of(connector, tmp_path, request)
    epochs = Epochs(context, mode)
    epochs.run([1, 2])
    epochs.run([3, 4])
    epochs.run([5, 6])

    replay = epochs.replay(from_epoch)

    found = context.rows()
    counts = collections.Counter(row[0] for row in found)
    assert all(n == 1 for n in counts.values()), f"{connector} {mode}: ids written twice after the replay: {found}"
    if mode == SNAPSHOT:  # the newest replayed epoch's rows alone
        assert found == rows_of(epoch_rows([5, 6], replay * 10 + 3))
    else:
        kept = [1, 2] if from_epoch == 2 else []
        assert sorted(counts) == [1, 2, 3, 4, 5, 6]
        assert found == sorted(rows_of(epoch_rows(kept, 1)) + [
            r for e in range(from_epoch, 4) for r in rows_of(epoch_rows([2 * e - 1, 2 * e], replay * 10 + e))])
    epochs.run([7])
    assert context.rows() == epochs.states[-1]


# -- bounded waits ------------------------------------------------------------------------

def _hold_marker_row(epochs: Epochs, epoch: int) -> Callable[[], None]:
    """A committer of ``epoch`` paused inside its transaction, holding the PostgreSQL marker row."""
    import psycopg

    assert isinstance(epochs.context, PostgresContext)
    holder = psycopg.connect(epochs.context.dsn)
    holder.execute("INSERT INTO public.seatunnel_ckpt_epochs (store_id, pipeline, sink, epoch, target_table, "
                   "store, rows) VALUES (%s, 'orders', 'orders', %s, 'public.orders', 'paused', 2)",
                   (epochs.pipeline.store_id(), epoch))

    def release() -> None:
        holder.rollback()
        holder.close()
    return release


def _lock_catalog(epochs: Epochs, epoch: int) -> Callable[[], None]:
    """Another writer of the Iceberg SQL catalog (SQLite) inside a transaction that holds its lock."""
    holder = sqlite3.connect(str(epochs.context.root / "catalog.db"), isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")

    def release() -> None:
        holder.rollback()
        holder.close()
    return release


#: connector: (its options' bound on a wait, how a lock is taken and released)
LOCKS: dict[str, tuple[dict[str, Any], Callable[[Epochs, int], Callable[[], None]]]] = {
    "postgres": ({"lock_timeout_s": 0.5}, _hold_marker_row),
    "iceberg": ({}, _lock_catalog),
}


@pytest.mark.parametrize("connector", sorted(LOCKS))
def test_a_commit_blocked_by_a_lock_fails_as_transient_within_its_timeout_and_the_retry_commits(
        tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, connector: str) -> None:
    bound, lock = LOCKS[connector]
    context = context_of(connector, tmp_path, request)
    options = context.options
    monkeypatch.setattr(context, "options", lambda mode: {**options(mode), **bound})
    epochs = Epochs(context, APPEND)
    epochs.run([1, 2])
    epoch, staged = epochs.prepare(lambda e: epoch_rows([3, 4], e))
    assert epochs.decide(epoch).decision is Decision.COMMIT
    release = lock(epochs, epoch)
    fallback = threading.Timer(60, release)  # without a bounded wait the commit would wait for this
    fallback.start()
    try:
        started = time.monotonic()
        with pytest.raises(CheckpointError) as raised:
            epochs.open().commit(epoch)
        waited = time.monotonic() - started
    finally:
        fallback.cancel()
        release()
    assert raised.value.retryable, raised.value
    assert waited < 30, f"the blocked commit waited {waited:.0f} s"
    assert epochs.pipeline.state(epoch) is EpochState.COMMITTING
    assert context.rows() == epochs.states[-1]  # nothing of the epoch is visible yet

    epochs.open().commit(epoch)  # the lock gone, the retry lands the epoch
    epochs.settled(epoch, [3, 4], staged)
    assert context.rows() == epochs.states[-1]


# -- a crash before every mutation of a replay --------------------------------------------

@dataclass
class Replaying:
    """One pipeline with two committed epochs and a replay of the newest one begun and staged."""

    epochs: Epochs
    replay: StagedReplay


#: The replays killed in CI: one mode per connector, both modes among them (every pair with RELIABILITY_FULL=1).
CI_REPLAY_KILLS = {("files", APPEND), ("iceberg", APPEND), ("delta", UPSERT), ("postgres", UPSERT)}


@pytest.mark.crash
@pytest.mark.slow
@pytest.mark.parametrize(("connector", "mode"), [
    pytest.param(c, m, id=f"{c}-{m}") for c, context in CONTEXTS.items() for m in (APPEND, UPSERT)
    if m in context.modes and (FULL_CAMPAIGNS or (c, m) in CI_REPLAY_KILLS)])
def test_a_replay_killed_before_each_of_its_mutations_is_finished_once_and_the_next_epoch_runs(
        tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, connector: str,
        mode: str) -> None:
    plan = install(monkeypatch)
    databases: list[str] = []
    contexts = fresh_contexts(connector, request, databases)
    ticking_commits(contexts(tmp_path / "probe"), plan, monkeypatch)

    def setup(n: int) -> Replaying:
        epochs = Epochs(contexts(tmp_path / f"crash-{n}"), mode)
        epochs.run([1, 2])
        epochs.run([2, 3])
        return Replaying(epochs, epochs.staged_replay(2))

    def resume(world: Replaying) -> None:
        """As an operator: the replay run again resumes a decided one; an undecided one is refused until
        recovery aborts it (nothing of it published), and then the replay runs anew."""
        world.epochs.context.observe()
        try:
            resume_replay(world.epochs.open())
        except ReplayError as exc:
            assert "recover" in str(exc), exc
            recover(world.epochs.open(), dry_run=False, now=time.time() + 3600)
            assert world.epochs.pipeline.state(world.replay.epoch) is EpochState.ABORTED
            world.epochs.context.observe()
            assert world.epochs.context.rows() == world.epochs.states[-1]  # the aborted replay published nothing
            world.replay = world.epochs.staged_replay(2)
            world.replay.finish()

    def check(world: Replaying, crashed: bool) -> None:
        epochs = world.epochs
        epochs.context.observe()
        epochs.replayed(world.replay)
        assert epochs.context.rows() == epochs.states[-1]
        for label, found in epochs.context.history():
            assert found in epochs.states, f"{label} holds {found}, not the target after a whole epoch"
        epochs.run([5])
        assert epochs.context.rows() == epochs.states[-1]

    try:
        run = crash_at_every_mutation(plan, setup, lambda w: w.replay.finish(), resume, check)
    finally:
        drop(request, databases)
    assert any("the sink's commit" in c for c in run.crashed_at), run.crashed_at


# -- apply_changes: several changes of one key in one epoch ---------------------------------------
@pytest.mark.parametrize("connector", sorted(APPLYING))
def test_several_changes_of_one_key_in_an_epoch_apply_the_one_with_the_highest_sequence_and_the_next_epoch_commits(
        tmp_path: Path, request: pytest.FixtureRequest, connector: str) -> None:
    """A stage may write several changes of one key in an epoch (the Spark side keeps the last, but a
    sink is handed whatever was staged): every applying sink applies the one with the highest
    sequence, whatever the rows' order, and writes one row (one version) of the key."""
    context = context_of(connector, tmp_path, request)
    epochs = Epochs(context, sorted(context.modes)[0])
    epochs.run([1, 2])

    def two_changes_of_key_4(epoch: int) -> pa.Table:
        typed = context.staged(epoch_rows([4], epoch), epoch).schema  # the change columns as the context types them
        return pa.table({"id": [4, 4], "region": [REGIONS[0]] * 2, "amount": [2.0, 1.0],
                         "_op": ["update", "insert"], "_lsn": [epoch, epoch], "_seq": [2, 1]}, schema=typed)

    for rows in (two_changes_of_key_4, lambda e: epoch_rows([5], e)):
        epoch, _ = epochs.prepare(rows)
        decided = epochs.decide(epoch)
        assert decided.decision is Decision.COMMIT, decided.reason
        epochs.pipeline.commit(epoch)
        assert epochs.pipeline.state(epoch) is EpochState.COMMITTED
    found = context.rows()
    assert [r for r in found if r[0] == 4] == [(4, REGIONS[0], 2.0)], found
    assert [r for r in found if r[0] == 5] == rows_of(epoch_rows([5], epoch)), found
