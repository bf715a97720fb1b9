"""Promise: every state of a table sink's target that a reader can pin holds whole epochs.

A reader of the current table is not the only one: ``scan(snapshot_id=...)``, Spark's
``VERSION AS OF``, DuckDB's ``iceberg_scan(..., snapshot_from_id => ...)``, deltalake's
``DeltaTable(uri, version=v)`` and incremental readers that walk the snapshots all pin
older states. For every table sink and every mode it supports, each such state -- every
Iceberg snapshot, every Delta version, every committed PostgreSQL transaction -- must
equal the table after some whole committed epoch (or the empty table): never half an
epoch (an upsert's delete without its rows), never an epoch twice. Checked over plain
epochs, a commit killed just before or just after its table commit and resumed by another
process, a replay (plain and killed) and a full refresh (a replay from epoch 1, plain and
killed after its table commit).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from airflow_seatunnel_ckpt.core.ops.replay import ReplayError, plan_replay
from tests.contract.sinks import (
    APPEND,
    CONTEXTS,
    REGIONS,
    SNAPSHOT,
    UPSERT,
    DeltaContext,
    Epochs,
    PostgresContext,
    context_of,
)

CONNECTORS = CONTEXTS
#: The connectors with an upsert mode.
UPSERTING = sorted(name for name, context in CONNECTORS.items() if UPSERT in context.modes)


def scenario_epochs(epochs: Epochs) -> None:
    """Three epochs whose ids overlap: ids 1..4, 3..6, 5..8."""
    epochs.run([1, 2, 3, 4])
    epochs.run([3, 4, 5, 6])
    epochs.run([5, 6, 7, 8])


def scenario_crash(when: str) -> Callable[[Epochs], None]:
    def run(epochs: Epochs) -> None:
        epochs.run([1, 2, 3, 4])
        epochs.run([3, 4, 5, 6], crash=when)
        epochs.run([5, 6, 7, 8])
    run.__doc__ = f"Epoch 2's commit is killed just {when} its table commit; another process commits it."
    return run


def scenario_replay(crash: str | None, from_epoch: int = 2, without: tuple[int, ...] = ()) -> Callable[[Epochs], None]:
    def run(epochs: Epochs) -> None:
        scenario_epochs(epochs)
        epochs.replay(from_epoch, crash=crash, without=without)
        epochs.run([9, 10])
    run.__doc__ = (f"Epochs {from_epoch}..3 replayed with new amounts (from 1: a full refresh)"
                   + (f", ids {without} no longer written" if without else "")
                   + (f", killed just {crash} the table commit" if crash else ""))
    return run


SCENARIOS: dict[str, tuple[Callable[[Epochs], None], frozenset[str]]] = {
    "epochs": (scenario_epochs, frozenset({APPEND, UPSERT, SNAPSHOT})),
    "crash-before-table-commit": (scenario_crash("before"), frozenset({APPEND, UPSERT, SNAPSHOT})),
    "crash-after-table-commit": (scenario_crash("after"), frozenset({APPEND, UPSERT, SNAPSHOT})),
    "replay": (scenario_replay(None), frozenset({APPEND, UPSERT, SNAPSHOT})),
    "replay-crash-before-table-commit": (scenario_replay("before"), frozenset({APPEND, UPSERT, SNAPSHOT})),
    "replay-crash-after-table-commit": (scenario_replay("after"), frozenset({UPSERT})),
    # Id 4 (epochs 1 and 2) gets epoch 1's value back, id 7 (epoch 3 alone) disappears.
    "replay-without-keys": (scenario_replay(None, 2, (4, 7)), frozenset({APPEND, UPSERT, SNAPSHOT})),
    "refresh": (scenario_replay(None, 1), frozenset({APPEND, UPSERT, SNAPSHOT})),
    "refresh-crash-after-table-commit": (scenario_replay("after", 1), frozenset({APPEND, UPSERT, SNAPSHOT})),
}


#: Promises a connector does not keep yet (strict: the case fails once it does, so the mark goes).
KNOWN_DEFECTS: dict[tuple[str, str], str] = {}


def cases() -> list[Any]:
    out = []
    for connector, context in CONNECTORS.items():
        for mode in (APPEND, UPSERT, SNAPSHOT):
            for scenario, (_, scenario_modes) in SCENARIOS.items():
                if mode in context.modes and mode in scenario_modes:
                    defect = KNOWN_DEFECTS.get((connector, scenario.split("-")[0]))
                    marks = [pytest.mark.xfail(reason=defect, strict=True)] if defect else []
                    out.append(pytest.param(connector, mode, scenario, id=f"{connector}-{mode}-{scenario}",
                                            marks=marks))
    return out


@pytest.mark.parametrize(("connector", "mode", "scenario"), cases())
def test_every_pinnable_state_of_the_target_is_the_table_after_a_whole_committed_epoch(
        tmp_path: Path, request: pytest.FixtureRequest, connector: str, mode: str, scenario: str) -> None:
    context = context_of(connector, tmp_path, request)
    epochs = Epochs(context, mode)
    SCENARIOS[scenario][0](epochs)

    history = context.history()
    assert history, f"{connector}: no state of the table can be pinned"
    for label, rows in history:
        assert rows in epochs.states, (
            f"{connector} {mode} ({scenario}): {label} holds {rows}, which is not the table after any whole "
            f"committed epoch; a reader pinned to it sees part of an epoch. The tables after each epoch: "
            f"{epochs.states}")
    assert context.rows() == epochs.states[-1], f"{connector} {mode} ({scenario}): the current table differs"
    assert history[-1][1] == epochs.states[-1], f"{connector} {mode} ({scenario}): the newest state differs"


@pytest.mark.parametrize("connector", UPSERTING)
def test_a_full_refresh_of_an_upsert_sink_is_one_table_commit_of_each_keys_last_replayed_value(
        tmp_path: Path, request: pytest.FixtureRequest, connector: str) -> None:
    context = context_of(connector, tmp_path, request)
    epochs = Epochs(context, UPSERT)
    scenario_epochs(epochs)  # ids 1..4, 3..6, 5..8
    with pytest.raises(ReplayError, match=r"it upserts by key.*omit --to-epoch"):
        plan_replay(epochs.pipeline, 1, 2)
    assert epochs.pipeline.epochs() == [1, 2, 3]  # refused before anything was written
    commits_before = len(context.history())

    replay = epochs.replay(1)

    # Ids 3..6 were written by two replayed epochs: the later one's row is the value.
    last = {i: e for e, ids in ((1, range(1, 5)), (2, range(3, 7)), (3, range(5, 9))) for i in ids}
    assert context.rows() == [(i, REGIONS[i % 2], i + (replay * 10 + last[i]) / 10) for i in range(1, 9)]
    if isinstance(context, PostgresContext):  # every row of the table written by one transaction
        assert len({x for (x,) in context._query("public.orders", "xmin::text")}) == 1
    else:
        assert len(context.history()) == commits_before + 1
    epochs.run([9, 10])
    assert context.rows() == epochs.states[-1]


@pytest.mark.parametrize("connector", UPSERTING)
def test_an_upsert_replay_from_a_later_epoch_restores_the_keys_it_no_longer_writes_in_one_table_commit(
        tmp_path: Path, request: pytest.FixtureRequest, connector: str) -> None:
    context = context_of(connector, tmp_path, request)
    epochs = Epochs(context, UPSERT)
    scenario_epochs(epochs)  # ids 1..4 (epoch 1), 3..6 (epoch 2), 5..8 (epoch 3)
    commits_before = len(context.history())

    replay = epochs.replay(2, without=(4, 7))  # epochs 2..3 again; id 4 and id 7 no longer written

    def row(i: int, version: float) -> tuple[Any, ...]:
        return (i, REGIONS[i % 2], i + version / 10)

    assert context.rows() == [
        row(1, 1), row(2, 1),  # untouched: epoch 1's
        row(3, replay * 10 + 2),  # the new output's last value (replayed epoch 2)
        row(4, 1),  # only in the replaced epochs' old output: epoch 1's value back
        row(5, replay * 10 + 3), row(6, replay * 10 + 3), row(8, replay * 10 + 3),  # replayed epoch 3's
    ]  # id 7 (epoch 3's alone) is gone
    assert len(context.history()) == commits_before + 1
    epochs.run([7, 9])
    assert context.rows() == epochs.states[-1]


@pytest.mark.parametrize("connector", UPSERTING)
def test_an_upsert_replay_whose_table_history_before_it_is_gone_is_refused_before_its_decision(
        tmp_path: Path, request: pytest.FixtureRequest, connector: str) -> None:
    context = context_of(connector, tmp_path, request)
    epochs = Epochs(context, UPSERT)
    scenario_epochs(epochs)
    if connector.split("-")[0] == "iceberg":  # epoch 1's snapshot, the table before epoch 2, expired
        with context._table() as table:  # type: ignore[attr-defined]
            first = min(table.snapshots(), key=lambda s: s.sequence_number or 0)
            table.maintenance.expire_snapshots().by_id(first.snapshot_id).commit()
    elif isinstance(context, PostgresContext):  # epoch 2's before-images (the rows before it) deleted
        import psycopg

        with psycopg.connect(context.dsn) as conn:  # type: ignore[attr-defined]
            conn.execute("DELETE FROM public.seatunnel_ckpt_before_images WHERE epoch = 2")
    else:  # the files of version 0 (epoch 1) that later merges rewrote, vacuumed
        from deltalake import DeltaTable

        DeltaTable(f"{tmp_path}/tables/orders").vacuum(retention_hours=0, enforce_retention_duration=False,
                                                       dry_run=False)
    table_before = context.rows()

    with pytest.raises(ReplayError, match=r"was refused and aborted, nothing changed: .*before epoch 2 of this "
                                          r"sink.*Replay from epoch 1 \(a full refresh"):
        epochs.replay(2)
    assert context.rows() == table_before
    epochs.replay(1)  # the way out
    assert context.rows() == epochs.states[-1]


def test_a_full_refresh_of_a_delta_upsert_sink_whose_table_was_removed_creates_it_with_one_row_per_key(
        tmp_path: Path) -> None:
    import shutil

    epochs = Epochs(DeltaContext(tmp_path), UPSERT)
    scenario_epochs(epochs)  # ids 3..6 written by two epochs each
    shutil.rmtree(tmp_path / "tables" / "orders")

    epochs.replay(1)

    assert epochs.context.rows() == epochs.states[-1]  # each id once, with its newest replayed epoch's row
