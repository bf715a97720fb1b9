"""A key set with a TTL on a real local Spark: a de-duplication window across epochs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from airflow_seatunnel_ckpt.core.errors import ConfigError
from airflow_seatunnel_ckpt.spark import run_stage
from airflow_seatunnel_ckpt.spark.context import StageContext
from tests.spark.conftest import OrdersPipeline

pytestmark = [pytest.mark.spark]


def dedup_within_two_epochs(ctx: StageContext, spark: Any) -> None:
    """De-duplicate against the keys of this and the previous epoch only."""
    fresh = ctx.key_set("seen_orders").dedup(ctx.source("orders").read(), key="order_id", ttl_epochs=2)
    ctx.sink("orders_table").write(fresh)


def test_a_key_older_than_the_ttl_is_accepted_again_after_a_restore(
    spark: Any, orders: OrdersPipeline, published_ids: Callable[[], list[int]]
) -> None:
    stage = "tests.spark.state.test_state_ttl_stage:dedup_within_two_epochs"
    for epoch, ids in enumerate(([1, 2], [1, 3], [1, 2, 3]), start=1):
        orders.add_file(f"f{epoch}", ids)
        # Each run restores the state from the last committed checkpoint, as after a restart.
        orders.commit(run_stage(orders.spec(f"run-{epoch}", stage=stage), spark))
    # Epoch 2: 1 was written at epoch 1 (inside the window). Epoch 3: 1 and 2 expired,
    # 3 (written at epoch 2) is still inside it.
    assert published_ids() == [1, 1, 2, 2, 3]
    chains = orders.pipeline.status(3).prepared["ingest"].operators["seen_orders"].chains
    # Epoch 1's runs expired as a whole and left the chains without being read.
    assert chains and all(ref.epoch >= 2 for chain in chains.values() for ref in chain)


def dedup_with_a_zero_ttl(ctx: StageContext, spark: Any) -> None:
    """A window of no epochs: a mistake, refused before any Spark job."""
    ctx.sink("orders_table").write(ctx.key_set("seen_orders").dedup(ctx.source("orders").read(), key="order_id",
                                                                    ttl_epochs=0))


def test_a_ttl_that_is_not_a_positive_number_of_epochs_is_refused_naming_the_state(
    spark: Any, orders: OrdersPipeline
) -> None:
    orders.add_file("f1", [1, 2])
    with pytest.raises(ConfigError, match=r"key set 'seen_orders': ttl_epochs must be a positive integer.*got 0"):
        run_stage(orders.spec("run-1", stage="tests.spark.state.test_state_ttl_stage:dedup_with_a_zero_ttl"), spark)
