"""The stage runtime records its keyed states' shape in the pipeline's descriptor."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_seatunnel_ckpt.core.protocol.descriptor import ParticipantDescriptor, ensure_descriptor, read_descriptor
from airflow_seatunnel_ckpt.spark import run_stage
from tests.spark.conftest import KEY_GROUPS, OrdersPipeline

pytestmark = [pytest.mark.spark]

STAGE = "tests.spark.stages:dedup_and_totals"


def test_the_runtime_records_kind_keys_aggregate_and_schema_of_each_state(
        spark: Any, orders: OrdersPipeline) -> None:
    spec = orders.spec("run-1", stage=STAGE)
    ensure_descriptor(orders.pipeline, dag_id="orders_dag",
                      participants={"ingest": ParticipantDescriptor.from_spec(spec.sources, spec.sinks)})
    orders.add_file("a", [1, 2, 3])

    orders.commit(run_stage(spec, spark))

    descriptor = read_descriptor(orders.pipeline.storage)
    assert descriptor is not None and descriptor.version == 2  # declared, then the states learned
    states = descriptor.participants["ingest"].states
    seen, totals = states["seen_orders"], states["customer_totals"]
    assert (seen.kind, seen.key_columns, seen.key_groups, seen.aggregate) == (
        "key_set", ["order_id"], KEY_GROUPS, None)
    assert seen.schema == [{"name": "order_id", "type": "bigint"}]
    assert (totals.kind, totals.key_columns) == ("key_value", ["customer"])
    assert totals.aggregate == {"total": ["sum", "amount"], "orders": ["count", "*"],
                                "largest": ["max", "amount"]}
    assert [c["name"] for c in totals.schema or []] == ["customer", "total", "orders", "largest"]
    assert sorted(descriptor.participants["ingest"].sources) == ["orders"]

    # The same shape in the next epoch writes no new version.
    orders.add_file("b", [4])
    orders.commit(run_stage(orders.spec("run-2", stage=STAGE), spark))
    assert orders.pipeline.storage.list_dir("_descriptor") == ["v000001.json", "v000002.json"]


def test_a_dry_run_records_no_state_shapes_in_the_descriptor(spark: Any, orders: OrdersPipeline) -> None:
    spec = orders.spec("run-1", stage=STAGE, dry_run=True)
    ensure_descriptor(orders.pipeline, dag_id="orders_dag",
                      participants={"ingest": ParticipantDescriptor.from_spec(spec.sources, spec.sinks)})
    orders.add_file("a", [1, 2, 3])

    result = run_stage(spec, spark)  # as `airflow tasks test` runs it: prepared, then aborted

    assert result.epoch == 1 and not result.reused
    assert orders.pipeline.storage.list_dir("_descriptor") == ["v000001.json"]  # the declaration only
    descriptor = read_descriptor(orders.pipeline.storage)
    assert descriptor is not None and descriptor.participants["ingest"].states == {}
