"""A replay killed at each of its steps leaves the table before or after, and a second replay finishes it;
the CLI runs a replay and shows it; Airflow-style clear and backfill runs never publish twice.

The kill campaign runs a fixed slice in CI, one crash point of each kind: before the decision
(the prepared replay is aborted by recovery and run again), decided but before the table commit
(readers see the old table; the second replay resumes) and after the table commit (readers see
the new table; the second replay resumes and records ``committed``). ``RELIABILITY_FULL=1``
runs every crash point of :data:`CRASH_POINTS`, among them the one before anything began.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from airflow_seatunnel_ckpt import cli
from airflow_seatunnel_ckpt.core.models import EpochState
from airflow_seatunnel_ckpt.spark import run_stage
from tests.conftest import FULL_CAMPAIGNS
from tests.core import faults
from tests.spark.test_replay import Lake, crash_then_finish_replay, order_ids, restored_worlds, state_rows

pytestmark = pytest.mark.spark

#: Crash right before the first storage write whose path contains this text (``replayed-``: the
#: first staged file placed into the table).
CRASH_POINTS = ("/begin", "/prepared-ingest", "/decision", "replayed-", "/committed")
#: The CI slice: one crash point of each kind (undecided; decided, before the table commit; after it).
CI_CRASH_POINTS = ("/decision", "replayed-", "/committed")


def _amounts(epochs: int, factor: float) -> float:
    ids = {i for e in range(1, epochs + 1) for i in order_ids(e)}
    return float(sum(ids)) * factor


def _totals(orders: list[int]) -> dict[str, float]:
    out: dict[str, float] = {}
    for order in orders:
        out[f"c{order % 3}"] = out.get(f"c{order % 3}", 0.0) + float(order)
    return out


def test_a_replay_killed_at_each_step_leaves_the_table_before_or_after_and_a_second_replay_finishes(
        spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plan = faults.install(monkeypatch)
    old, new = _amounts(2, 10.0), _amounts(2, 1.0)

    def buggy(lake: Lake) -> None:
        lake.run(spark, range(1, 3), "buggy")
        assert lake.total_amount() == old

    worlds = restored_worlds(tmp_path / "world", lambda root: Lake(root, "iceberg"), buggy)
    measured = next(worlds)
    plan.arm(10**9)  # count, never crash: where each step's first write falls
    measured.replay(spark, 1)
    trace = list(plan.trace)
    plan.disarm()
    assert measured.total_amount() == new
    want_state = state_rows(measured.pipeline)

    for point in CRASH_POINTS if FULL_CAMPAIGNS else CI_CRASH_POINTS:
        n = next(i for i, what in enumerate(trace, start=1) if point in what)
        lake = next(worlds)
        crash_then_finish_replay(spark, lake, plan, n, (old, new), point)
        assert lake.total_amount() == new, point
        assert state_rows(lake.pipeline) == want_state, point


def test_the_cli_replays_with_a_stage_spec_and_epochs_and_show_list_the_replay(
        spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lake = Lake(tmp_path / "lake", "iceberg")
    lake.run(spark, range(1, 3), "buggy")
    spec = tmp_path / "stage.json"
    spec.write_text(lake.spec("replay", "fixed").to_json())
    store = lake.orders.store["storage_url"]

    code = cli.main(["--store", store, "replay", "orders", "--from-epoch", "2", "--reason", "amount x10",
                     "--by", "ops", "--spec", str(spec), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and (out["epoch"], out["replayed"], out["replaced"]) == (3, [2], [2])
    assert lake.scan("orders", "SELECT max(amount) FROM t WHERE order_id >= 20") == [(float(max(order_ids(2))),)]

    assert cli.main(["--store", store, "epochs", "orders"]) == 0
    assert "replay__2-2__" in capsys.readouterr().out
    assert cli.main(["--store", store, "show", "orders", "3"]) == 0
    shown = capsys.readouterr().out
    assert "action replay by ops: amount x10" in shown and "epochs=2" in shown and "succeeded" in shown

    assert cli.main(["--store", store, "replay", "orders", "--from-epoch", "2", "--reason", "again"]) == 2
    assert "--stage package.module:function" in capsys.readouterr().err


def test_clearing_a_committed_run_and_backfilling_its_logical_date_publish_nothing_twice(
        spark: Any, tmp_path: Path) -> None:
    lake = Lake(tmp_path / "lake", "iceberg")
    lake.orders.add_file("f01", order_ids(1))
    first = run_stage(lake.spec("scheduled__2026-01-01", "fixed"), spark)
    lake.orders.commit(first)
    before = lake.orders_summary()

    cleared = run_stage(lake.spec("scheduled__2026-01-01", "fixed"), spark)  # a clear runs the run again
    assert (cleared.epoch, cleared.reused) == (first.epoch, True)
    assert lake.orders.commit(cleared).already_committed
    # A backfill run of the date under a new run id (Airflow 3 adds one only for a date without a
    # run; over a date with a run it clears that run, as above: tests/integration/deployment).
    backfill = run_stage(lake.spec("backfill__2026-01-01", "fixed"), spark)  # a new run id: a new epoch
    staged = {m.sink: m.rows for m in backfill.manifests}
    assert backfill.epoch == first.epoch + 1 and staged["orders_table"] == 0  # no input left to read
    # (the totals snapshot is written again, with the same rows: a snapshot replaces the table)
    lake.orders.commit(backfill)

    assert lake.orders_summary() == before
    assert lake.totals() == sorted(_totals(order_ids(1)).items())
    assert [lake.pipeline.state(e) for e in lake.pipeline.epochs()] == [EpochState.COMMITTED] * 2
