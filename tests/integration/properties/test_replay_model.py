"""Replays as steps of a model over whole epochs: every input order is in the table once, with
the amount the stage that last processed its epoch gives, and the next epoch still runs.

Steps: run an epoch with the buggy (x10) or the fixed stage, or replay from any earlier
epoch with either, or replay while an epoch commits between the replay's plan and its
begin (refused: the replay epoch is aborted, the epoch stands). A replay from inside an
earlier replay's range must be refused (nothing changed); any other replay rewrites its
epochs' rows in the Iceberg table and the totals snapshot. After every step the table, the
totals and the keyed state are checked against the model. The fast slice runs one fixed
scenario through these rules (:func:`scenario`); ``PROPERTIES_EXAMPLES=<n>`` lets
Hypothesis choose the steps.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from airflow_seatunnel_ckpt.core.ops.replay import ReplayError
from tests.integration.properties.settings import run_model
from tests.spark.test_replay import Lake, order_ids, state_rows

pytestmark = [pytest.mark.properties, pytest.mark.spark]

#: The shared session of the running test (a state machine cannot take fixtures).
SESSION: dict[str, Any] = {}
FACTORS = {"buggy": 10.0, "fixed": 1.0}


def checked_replay(spark: Any, lake: Lake, replays: list[tuple[int, int]], start: int, stage: str) -> bool:
    """Replay ``lake`` from epoch ``start`` with ``stage``; whether it ran.

    It must be refused, having written nothing, exactly when ``start`` lies inside one of the
    earlier ``replays`` (``(from, to)`` epoch ranges); a replay that ran is added to them.
    """
    inside = any(a < start <= b for a, b in replays)
    epochs_before = lake.pipeline.epochs()
    try:
        result = lake.replay(spark, start, stage=stage)
    except ReplayError as exc:
        assert inside, f"replay from {start} refused: {exc}"
        assert lake.pipeline.epochs() == epochs_before  # refused before anything was written
        return False
    assert not inside, f"replay from {start} ran inside an earlier replay {replays}"
    replays.append((start, result.to_epoch))
    return True


class ReplayModel(RuleBasedStateMachine):
    """Epochs and replays of the orders pipeline, against a model of which stage wrote each order."""

    def __init__(self) -> None:
        super().__init__()
        self.lake = Lake(Path(tempfile.mkdtemp(prefix="replay-model-")), "iceberg")
        self.inputs = 0  #: input files delivered (file n holds order_ids(n))
        self.data_epochs: list[tuple[int, int]] = []  #: (epoch, input file) of every epoch that read input
        self.stage_of: dict[int, str] = {}  #: input file -> the stage that last processed it
        self.replays: list[tuple[int, int]] = []  #: (from, to) epoch ranges of the replays so far

    @rule(stage=st.sampled_from(sorted(FACTORS)))
    def run_epoch(self, stage: str) -> None:
        self.inputs += 1
        self.lake.run(SESSION["spark"], range(self.inputs, self.inputs + 1), stage)
        self.data_epochs.append((self.lake.pipeline.last_committed_epoch() or 0, self.inputs))
        self.stage_of[self.inputs] = stage

    @precondition(lambda self: self.data_epochs)
    @rule(data=st.data(), stage=st.sampled_from(sorted(FACTORS)))
    def replay(self, data: st.DataObject, stage: str) -> None:
        self.replay_from(data.draw(st.sampled_from([e for e, _ in self.data_epochs])), stage)

    def replay_from(self, start: int, stage: str) -> None:
        """Replay from epoch ``start`` with ``stage``: refused inside an earlier replay's range."""
        if not checked_replay(SESSION["spark"], self.lake, self.replays, start, stage):
            return
        for epoch, source in self.data_epochs:
            if epoch >= start:
                self.stage_of[source] = stage

    @precondition(lambda self: self.data_epochs)
    @rule(data=st.data(), stage=st.sampled_from(sorted(FACTORS)))
    def replay_overtaken(self, data: st.DataObject, stage: str) -> None:
        self.replay_overtaken_from(data.draw(st.sampled_from([e for e, _ in self.data_epochs])), stage)

    def replay_overtaken_from(self, start: int, stage: str) -> None:
        """A replay from ``start`` that a normal ``stage`` epoch commits under, between its plan and its
        begin: the replay is refused (its epoch aborted); the normal epoch stands."""
        import airflow_seatunnel_ckpt.spark.replay as spark_replay

        planned = spark_replay.plan_replay

        def plan_then_an_epoch_commits(*args: Any, **kwargs: Any) -> Any:
            plan = planned(*args, **kwargs)
            self.run_epoch(stage)
            return plan

        epochs_before = self.lake.pipeline.epochs()
        spark_replay.plan_replay = plan_then_an_epoch_commits
        try:
            self.lake.replay(SESSION["spark"], start, stage="fixed")
        except ReplayError as exc:
            inside = any(a < start <= b for a, b in self.replays)
            if not inside:  # refused for the epoch between: the replay epoch was begun and aborted
                assert "committed after the replay" in str(exc), exc
                assert len(self.lake.pipeline.epochs()) == len(epochs_before) + 2
            return
        finally:
            spark_replay.plan_replay = planned
        raise AssertionError(f"a replay from {start} committed over epoch {self.data_epochs[-1][0]}, which "
                             "committed after the replay was planned")

    @invariant()
    def every_order_once_with_its_stage_amount(self) -> None:
        if not self.inputs:
            return
        want: dict[int, float] = {}
        for source in range(1, self.inputs + 1):  # dedup: an order belongs to the first file that held it
            for order in order_ids(source):
                want.setdefault(order, order * FACTORS[self.stage_of[source]])
        count, distinct, total, _ = self.lake.orders_summary()
        assert (count, distinct) == (len(want), len(want))
        assert total == pytest.approx(sum(want.values()))
        totals: dict[str, float] = {}
        for order, amount in want.items():
            totals[f"c{order % 3}"] = totals.get(f"c{order % 3}", 0.0) + amount
        assert [(c, pytest.approx(t)) for c, t in sorted(totals.items())] == self.lake.totals()
        assert state_rows(self.lake.pipeline)["seen_orders"] == [(o,) for o in sorted(want)]


def scenario(model: Any) -> Iterator[None]:
    """The fast slice: three buggy epochs, a replay of the last two with the fixed stage, a
    refused replay from inside it, a replay refused because an epoch committed under it, and
    a normal epoch after them."""
    for _ in range(3):
        yield model.run_epoch("buggy")
    yield model.replay_from(2, "fixed")
    assert model.replays, "the replay from epoch 2 did not run"
    yield model.replay_from(3, "fixed")  # inside the replay of 2..3: refused, nothing written
    yield model.replay_overtaken_from(2, "buggy")  # an epoch commits between its plan and its begin: refused
    yield model.run_epoch("fixed")


def test_replays_between_epochs_keep_every_order_once_with_the_last_stage_amount(spark: Any) -> None:
    SESSION["spark"] = spark
    try:
        run_model(ReplayModel, scenario, fast_examples=2, fast_steps=5)
    finally:
        SESSION.clear()
