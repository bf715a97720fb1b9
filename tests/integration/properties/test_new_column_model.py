"""A new aggregate column as steps of a model over whole epochs (issue 21).

Steps, after a first epoch without the column: run an epoch with the stage without
``max_amount`` (``fixed``) or with it (``with_max``), or replay from any earlier epoch
with either. Once an epoch ran with the column the stage keeps it (removing it is
refused elsewhere); a replay may drop it only from an epoch whose state did not have it
yet. After every step: every input order is in the table once, the totals are right, and
``max_amount`` is the maximum over the orders of the epochs that ran with it since it
last appeared (NULL where no such order), in the totals table and the keyed state alike.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from tests.integration.properties.settings import run_model
from tests.integration.properties.test_replay_model import checked_replay
from tests.spark.test_replay import Lake, order_ids, state_rows

pytestmark = [pytest.mark.properties, pytest.mark.spark]

#: The shared session of the running test (a state machine cannot take fixtures).
SESSION: dict[str, Any] = {}
STAGES = ("with_max", "fixed")


class NewColumnModel(RuleBasedStateMachine):
    """Epochs and replays of the orders pipeline, against a model of which files were aggregated with a max."""

    def __init__(self) -> None:
        super().__init__()
        self.lake = Lake(Path(tempfile.mkdtemp(prefix="new-column-model-")), "iceberg")
        self.inputs = 0  #: input files delivered (file n holds order_ids(n))
        self.data_epochs: list[tuple[int, int]] = []  #: (epoch, input file) of every epoch that read input
        self.with_max: dict[int, bool] = {}  #: input file -> whether the stage that last processed it had max
        self.replays: list[tuple[int, int]] = []  #: (from, to) epoch ranges of the replays so far

    def _has_max(self) -> bool:
        return bool(self.inputs) and self.with_max[self.inputs]

    @initialize()
    def stored_keys_without_the_column(self) -> None:
        self.run_epoch("fixed")

    @rule(stage=st.sampled_from(STAGES))
    def run_epoch(self, stage: str) -> None:
        stage = "with_max" if self._has_max() else stage  # the column, once there, stays
        self.inputs += 1
        self.lake.run(SESSION["spark"], range(self.inputs, self.inputs + 1), stage)
        self.data_epochs.append((self.lake.pipeline.last_committed_epoch() or 0, self.inputs))
        self.with_max[self.inputs] = stage == "with_max"

    @precondition(lambda self: self.data_epochs)
    @rule(data=st.data(), stage=st.sampled_from(STAGES))
    def replay(self, data: st.DataObject, stage: str) -> None:
        self.replay_from(data.draw(st.sampled_from([e for e, _ in self.data_epochs])), stage)

    def replay_from(self, start: int, stage: str) -> None:
        """Replay from epoch ``start`` with ``stage`` (kept ``with_max`` once the state before has the column)."""
        first = next(source for epoch, source in self.data_epochs if epoch >= start)
        if stage == "fixed" and first > 1 and self.with_max[first - 1]:
            stage = "with_max"  # the state before `start` has the column: the stage keeps it
        if not checked_replay(SESSION["spark"], self.lake, self.replays, start, stage):
            return
        for _, source in self.data_epochs:
            if source >= first:
                self.with_max[source] = stage == "with_max"

    @invariant()
    def every_order_once_and_the_new_column_is_the_max_since_it_appeared(self) -> None:
        if not self.inputs:
            return
        owner: dict[int, int] = {}  # dedup: an order belongs to the first file that held it
        for source in range(1, self.inputs + 1):
            for order in order_ids(source):
                owner.setdefault(order, source)
        count, distinct, total, _ = self.lake.orders_summary()
        assert (count, distinct) == (len(owner), len(owner))
        assert total == pytest.approx(float(sum(owner)))
        since = self.inputs + 1  # the first file of the newest run of files aggregated with max
        while since > 1 and self.with_max[since - 1]:
            since -= 1
        want: dict[str, tuple[float, float | None]] = {}
        for order, source in owner.items():
            customer = f"c{order % 3}"
            summed, top = want.get(customer, (0.0, None))
            if source >= since:
                top = float(order) if top is None else max(top, float(order))
            want[customer] = (summed + order, top)
        if self._has_max():
            rows = [(c, t, m) for c, (t, m) in sorted(want.items())]
            assert self.lake.totals("customer, total, max_amount") == rows
            assert state_rows(self.lake.pipeline)["customer_totals"] == rows
        else:
            assert self.lake.totals() == [(c, t) for c, (t, _) in sorted(want.items())]
        assert state_rows(self.lake.pipeline)["seen_orders"] == [(o,) for o in sorted(owner)]


def scenario(model: Any) -> Iterator[None]:
    """The fast slice: an epoch without the column, two with it, a replay of those two, a
    refused replay from inside it, and a normal epoch after it."""
    yield model.stored_keys_without_the_column()
    yield model.run_epoch("with_max")
    yield model.run_epoch("with_max")
    yield model.replay_from(2, "with_max")
    assert model.replays, "the replay from epoch 2 did not run"
    yield model.replay_from(3, "with_max")  # inside the replay of 2..3: refused, nothing written
    yield model.run_epoch("fixed")  # the column, once there, stays


def test_a_new_aggregate_column_over_epochs_and_replays_is_the_max_since_it_appeared(spark: Any) -> None:
    SESSION["spark"] = spark
    try:
        run_model(NewColumnModel, scenario, fast_examples=2, fast_steps=5)
    finally:
        SESSION.clear()
