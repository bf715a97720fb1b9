"""A stage whose keyed states differ from the committed ones is refused; evolution commands change them."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest

from airflow_seatunnel_ckpt.core.ops.evolution import rename_state, rescale, reset_state
from airflow_seatunnel_ckpt.core.protocol.descriptor import ParticipantDescriptor, ensure_descriptor, read_descriptor
from airflow_seatunnel_ckpt.spark import StateError, run_stage
from tests.spark.conftest import OrdersPipeline, order_row

pytestmark = [pytest.mark.spark]

STAGES = "tests.spark.evolution_stages"


def _start(orders: OrdersPipeline, spark: Any) -> None:
    """Two committed epochs of running totals per customer (orders 1..6)."""
    spec = orders.spec("run-1", stage=f"{STAGES}:totals")
    ensure_descriptor(orders.pipeline, dag_id="orders_dag",
                      participants={"ingest": ParticipantDescriptor.from_spec(spec.sources, spec.sinks)})
    orders.add_file("a", [1, 2, 3])
    orders.commit(run_stage(spec, spark))
    orders.add_file("b", [4, 5, 6])
    orders.commit(run_stage(orders.spec("run-2", stage=f"{STAGES}:totals"), spark))


def _expected(order_ids: range) -> dict[str, float]:
    totals: dict[str, float] = defaultdict(float)
    for i in order_ids:
        row = order_row(i)
        totals[row["customer"]] += row["amount"]
    return dict(totals)


def _latest_totals(orders: OrdersPipeline) -> dict[str, float]:
    """Each customer's total in the newest published epoch that names it."""
    out: dict[str, float] = {}
    for row in orders.published("totals"):  # epochs in order
        out[row["customer"]] = row["total"]
    return out


@pytest.mark.parametrize("stage, wrong", [
    ("totals_as_max", r"aggregate column 'total': sum\(amount\) -> max\(amount\)"),
    ("totals_by_order", r"keyed by \['customer'\] in the checkpoint, not \['order_id'\]"),
    ("totals_of_whole_amounts", r"column 'total' type double -> bigint"),
])
def test_a_stage_that_changes_a_committed_state_is_refused_before_it_prepares(
        spark: Any, orders: OrdersPipeline, stage: str, wrong: str) -> None:
    _start(orders, spark)
    orders.add_file("c", [7])

    with pytest.raises(StateError, match=wrong) as failure:
        run_stage(orders.spec("run-3", stage=f"{STAGES}:{stage}"), spark)

    assert "seatunnel-ckpt state reset orders customer_totals" in str(failure.value)
    # Starting over is offered with what it costs: the totals restart from nothing.
    assert "restart from nothing" in str(failure.value)
    if stage != "totals_by_order":  # (key columns are checked against the checkpoint, which has no name)
        assert "checkpoint 2 in " in str(failure.value)  # the shape is the restored checkpoint's
    assert orders.pipeline.txlog.prepared(3) == {}  # nothing prepared: the epoch can only be aborted
    orders.pipeline.abort(3, "refused shape")
    orders.commit(run_stage(orders.spec("run-4", stage=f"{STAGES}:totals"), spark))
    assert _latest_totals(orders) == _expected(range(1, 8))


def test_a_changed_dedup_key_is_refused_naming_the_pipeline_and_the_duplicates_a_fresh_state_lets_through(
        spark: Any, orders: OrdersPipeline) -> None:
    orders.add_file("a", [1, 2, 3])
    orders.commit(run_stage(orders.spec("run-1"), spark))  # seen_orders keyed by order_id
    orders.add_file("b", [4])

    with pytest.raises(StateError, match=r"keyed by \['order_id'\] in the checkpoint, not \['customer'\]") as failure:
        run_stage(orders.spec("run-2", stage=f"{STAGES}:dedup_by_customer"), spark)

    message = str(failure.value)
    assert "seatunnel-ckpt state reset orders seen_orders" in message and "<pipeline>" not in message
    # A way out that gives up the de-duplication says so.
    assert "or under a new state name -- but a state started over is empty" in message
    assert "published again as duplicates" in message
    assert orders.pipeline.txlog.prepared(2) == {}


def test_renaming_a_state_in_the_code_is_refused_and_the_rename_command_keeps_its_values(
        spark: Any, orders: OrdersPipeline) -> None:
    _start(orders, spark)
    orders.add_file("c", [7, 8])

    with pytest.raises(StateError, match=r"looks like a rename.*seatunnel-ckpt state rename orders "
                                         r"customer_totals totals_by_customer") as refused:
        run_stage(orders.spec("run-3", stage=f"{STAGES}:totals_renamed"), spark)
    # The refused epoch is the one the stage ran for (3), not the checkpoint it restored (2).
    assert str(refused.value).startswith("pipeline 'orders' epoch 3 (restoring checkpoint 2): participant 'ingest'")
    # Refused when the update was planned: no Spark job ran, so neither staged output
    # nor a state part of epoch 3 exists.
    store = orders.root / "store"
    written = [p for p in [*store.rglob("_staging/epoch=3/**/*"), *store.rglob("checkpoint_3/**/*")] if p.is_file()]
    assert written == []
    assert not list((orders.root / "out").rglob("epoch=3"))
    orders.pipeline.abort(3, "refused rename")

    rename_state(orders.pipeline, "customer_totals", "totals_by_customer", by="test")
    orders.commit(run_stage(orders.spec("run-5", stage=f"{STAGES}:totals_renamed"), spark))

    assert _latest_totals(orders) == _expected(range(1, 9))  # the totals did not restart from zero
    descriptor = read_descriptor(orders.pipeline.storage)
    assert descriptor is not None and set(descriptor.participants["ingest"].states) == {"totals_by_customer"}


def test_a_new_aggregate_column_is_accepted_and_starts_empty(spark: Any, orders: OrdersPipeline) -> None:
    _start(orders, spark)
    orders.add_file("c", [7])

    orders.commit(run_stage(orders.spec("run-3", stage=f"{STAGES}:totals_and_counts"), spark))

    last = orders.published("totals")[-1]
    assert last == {"customer": "c1", "total": _expected(range(1, 8))["c1"], "orders": 1}
    descriptor = read_descriptor(orders.pipeline.storage)
    assert descriptor is not None
    assert descriptor.participants["ingest"].states["customer_totals"].aggregate == {
        "total": ["sum", "amount"], "orders": ["count", "*"]}


def test_key_groups_change_is_refused_until_rescale_rewrites_the_state(spark: Any, orders: OrdersPipeline) -> None:
    _start(orders, spark)
    orders.add_file("c", list(range(7, 13)))

    with pytest.raises(StateError, match=r"checkpointed with 4 key groups, the stage asks for 3.*"
                                         r"seatunnel-ckpt rescale orders --key-groups 3"):
        run_stage(orders.spec("run-3", stage=f"{STAGES}:totals", key_groups=3), spark)
    orders.pipeline.abort(3, "refused key groups")

    rescale(orders.pipeline, 3, by="test")
    orders.commit(run_stage(orders.spec("run-5", stage=f"{STAGES}:totals", key_groups=3), spark))

    # Every customer's running total continued: each row landed in the key group the
    # executors look in (otherwise a customer would appear twice or restart from zero).
    assert _latest_totals(orders) == _expected(range(1, 13))
    point = orders.pipeline.restore_point()
    assert point.operators["customer_totals"].key_groups == 3


def _add_returns(orders: OrdersPipeline, name: str, order_ids: list[int]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = orders.root / "returns"
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist([order_row(i) for i in order_ids]), folder / f".{name}.tmp")
    (folder / f".{name}.tmp").rename(folder / f"{name}.parquet")


def test_adding_and_removing_sources_and_sinks_between_epochs_keeps_every_history(
        spark: Any, orders: OrdersPipeline) -> None:
    stage = f"{STAGES}:every_source_to_every_sink"
    source_a = orders.spec("x").sources["orders"]
    source_b = {"type": "file", "path": f"file://{orders.root / 'returns'}", "format": "parquet"}
    sink_1 = {"type": "file", "path": f"file://{orders.root / 'out' / 'one'}"}
    sink_2 = {"type": "file", "path": f"file://{orders.root / 'out' / 'two'}"}

    def run(run_id: str, sources: dict[str, Any], sinks: dict[str, Any]) -> None:
        spec = orders.spec(run_id, stage=stage, sources=sources, sinks=sinks)
        ensure_descriptor(orders.pipeline, dag_id="orders_dag",
                          participants={"ingest": ParticipantDescriptor.from_spec(spec.sources, spec.sinks)})
        orders.commit(run_stage(spec, spark))

    orders.add_file("a1", [1, 2])
    run("run-1", {"orders": source_a}, {"one": sink_1})
    orders.add_file("a2", [3])
    _add_returns(orders, "b1", [10])
    run("run-2", {"orders": source_a, "returns": source_b}, {"one": sink_1, "two": sink_2})  # both added
    orders.add_file("a3", [4])
    _add_returns(orders, "b2", [11])
    run("run-3", {"orders": source_a}, {"two": sink_2})  # source "returns" and sink "one" removed
    orders.add_file("a4", [5])
    run("run-4", {"orders": source_a, "returns": source_b}, {"one": sink_1, "two": sink_2})  # both back

    def ids(sink: str) -> list[int]:
        return sorted(r["order_id"] for r in orders.published(sink))

    # Every input row is published exactly once per sink that was declared when it was read:
    # "returns" resumes after b1 (b2 waited for it), nothing is re-read, no sink lost output.
    assert ids("one") == [1, 2, 3, 5, 10, 11]
    assert ids("two") == [3, 4, 5, 10, 11]
    assert sorted(p.name for p in (orders.root / "out" / "one").glob("epoch=*")) == [
        "epoch=1", "epoch=2", "epoch=4"]


def _max_per_customer(order_ids: range) -> dict[str, float]:
    out: dict[str, float] = {}
    for i in order_ids:
        row = order_row(i)
        out[row["customer"]] = max(out.get(row["customer"], row["amount"]), row["amount"])
    return out


@pytest.mark.parametrize("stage, key_groups, wrong, way_out", [
    ("totals_as_max", 4, r"aggregate column 'total': sum\(amount\) -> max\(amount\).*"
                         r"seatunnel-ckpt state reset orders customer_totals", "reset"),
    ("totals_by_order", 4, r"keyed by \['customer'\] in the checkpoint, not \['order_id'\].*"
                           r"seatunnel-ckpt state reset", "reset"),
    ("totals", 3, r"checkpointed with 4 key groups, the stage asks for 3.*"
                  r"seatunnel-ckpt rescale orders --key-groups 3", "rescale"),
])
def test_without_airflow_a_changed_state_is_refused_by_the_checkpoints_shape_until_an_evolution_command(
        spark: Any, orders: OrdersPipeline, stage: str, key_groups: int, wrong: str, way_out: str) -> None:
    # run_stage alone, as a script or spark-submit would: no pipeline descriptor is ever written.
    orders.add_file("a", [1, 2, 3])
    orders.commit(run_stage(orders.spec("run-1", stage=f"{STAGES}:totals"), spark))
    orders.add_file("b", [4, 5])

    with pytest.raises(StateError, match=wrong):
        run_stage(orders.spec("run-2", stage=f"{STAGES}:{stage}", key_groups=key_groups), spark)

    assert read_descriptor(orders.pipeline.storage) is None
    assert orders.pipeline.txlog.prepared(2) == {}  # refused before prepare: the epoch can only be aborted
    orders.pipeline.abort(2, "refused shape")
    if way_out == "reset":
        reset_state(orders.pipeline, "customer_totals", by="test")
    else:
        rescale(orders.pipeline, key_groups, by="test")
    orders.commit(run_stage(orders.spec("run-4", stage=f"{STAGES}:{stage}", key_groups=key_groups), spark))

    state = orders.pipeline.restore_point().operators["customer_totals"]
    assert state.shape is not None and state.key_groups == key_groups
    last = orders.published("totals")[-len(_expected(range(4, 6))):]
    if stage == "totals_as_max":  # started over: the max of epoch 4's orders only
        assert state.shape.aggregate == {"total": ["max", "amount"]}
        assert {r["customer"]: r["total"] for r in last} == _max_per_customer(range(4, 6))
    elif stage == "totals_by_order":
        assert state.key_columns == ["order_id"]
    else:  # rescaled: the running sums continued, and the checkpoint kept the state's shape
        assert state.shape.aggregate == {"total": ["sum", "amount"]}
        assert _latest_totals(orders) == _expected(range(1, 6))


def test_without_airflow_a_renamed_state_keeps_its_shape_in_the_checkpoint(
        spark: Any, orders: OrdersPipeline) -> None:
    orders.add_file("a", [1, 2, 3])
    orders.commit(run_stage(orders.spec("run-1", stage=f"{STAGES}:totals"), spark))
    rename_state(orders.pipeline, "customer_totals", "totals_by_customer", by="test")
    orders.add_file("b", [4])

    with pytest.raises(StateError, match=r"keyed state 'totals_by_customer' differs from its committed shape "
                                         r"\(checkpoint 2 in .*sum\(amount\) -> max\(amount\)"):
        run_stage(orders.spec("run-2", stage=f"{STAGES}:totals_renamed_as_max"), spark)
    orders.pipeline.abort(3, "refused shape")

    orders.commit(run_stage(orders.spec("run-3", stage=f"{STAGES}:totals_renamed"), spark))
    assert _latest_totals(orders) == _expected(range(1, 5))
