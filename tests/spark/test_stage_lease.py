"""A real Spark stage that runs longer than every (shortened) timeout, with recovery beside it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from airflow_seatunnel_ckpt.core import CheckpointConfig, CheckpointStore, EpochState
from airflow_seatunnel_ckpt.core.protocol.recovery import RecoveryAction, recover
from airflow_seatunnel_ckpt.spark import StageContext, run_stage
from tests.spark.conftest import OrdersPipeline
from tests.spark.stages import dedup_orders

pytestmark = [pytest.mark.spark]

SHORT = {"lease_timeout_s": 1.0, "lease_renew_s": 0.2, "prepared_timeout_s": 2.0}
SLOW_S = 4.0


def slow_dedup(ctx: StageContext, spark: Any) -> None:
    """A Spark job on the executors that takes longer than every timeout, then the dedup stage."""
    spark.sparkContext.parallelize([SLOW_S], 1).foreach(lambda s: time.sleep(s))
    dedup_orders(ctx, spark)


def test_a_spark_stage_longer_than_the_timeouts_commits_with_recovery_running_beside_it(
    spark: Any, orders: OrdersPipeline, published_ids: Callable[[], list[int]],
) -> None:
    store = {**orders.store, **SHORT}
    config = CheckpointConfig.from_mapping(store)
    orders.add_file("a", [1, 2, 3, 3])
    actions: list[RecoveryAction] = []
    stop = threading.Event()

    def recovery_loop() -> None:
        while not stop.is_set():
            actions.extend(recover(CheckpointStore(config).pipeline(orders.name), dry_run=False).actions)
            stop.wait(0.1)

    beside = threading.Thread(target=recovery_loop, daemon=True)
    beside.start()
    started = time.monotonic()
    try:
        result = run_stage(orders.spec("run-1", store=store), spark, stage_fn=slow_dedup)
        took = time.monotonic() - started
        orders.commit(result)
    finally:
        stop.set()
        beside.join(30)

    assert took > SLOW_S > SHORT["lease_timeout_s"] + SHORT["prepared_timeout_s"]
    assert [a for a in actions if a.action.startswith("abort")] == []
    assert any(a.action == "wait" and "lease of 'ingest'" in a.reason for a in actions)
    assert orders.pipeline.state(result.epoch) is EpochState.COMMITTED
    assert published_ids() == [1, 2, 3]
