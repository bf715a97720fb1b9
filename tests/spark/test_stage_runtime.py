"""The stage runtime on a real local Spark: epochs, keyed state, retries, incremental parts."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from airflow_seatunnel_ckpt.core import EpochState
from airflow_seatunnel_ckpt.core.errors import ConfigError
from airflow_seatunnel_ckpt.spark import StageResult, StageSpec, StateError, run_stage
from tests.spark.conftest import KEY_GROUPS, OrdersPipeline, RunStage, order_row
from tests.spark.stages import InjectedFailure

pytestmark = [pytest.mark.spark]


def ids_by_key_group(spark: Any, end: int) -> dict[int, list[int]]:
    """Order ids 1..end-1 by key group, computed by the JVM exactly as the runtime does."""
    from pyspark.sql import functions as F

    return {
        r.g: r.ids
        for r in spark.range(1, end)
        .groupBy(F.pmod(F.hash("id"), F.lit(KEY_GROUPS)).alias("g"))
        .agg(F.sort_array(F.collect_list("id")).alias("ids"))
        .collect()
    }


def test_two_epochs_of_incremental_dedup_publish_every_unique_row_once(
    run: RunStage, orders: OrdersPipeline, published_ids: Callable[[], list[int]]
) -> None:
    orders.add_file("a", [1, 2, 3, 3, 4])
    orders.add_file("b", [4, 5, 6, 1])
    first = run(orders.spec("run-1"))
    assert (first.epoch, first.rows, first.reused) == (1, 6, False)
    assert first.sources["orders"]["files"] == ["a.parquet", "b.parquet"]
    orders.commit(first)

    orders.add_file("c", [6, 7, 8, 8, 2, 9])  # 6 and 2 were seen in epoch 1
    second = run(orders.spec("run-2"))
    assert (second.epoch, second.rows) == (2, 3)
    assert second.sources["orders"]["files"] == ["c.parquet"]
    orders.commit(second)

    assert published_ids() == list(range(1, 10))
    assert sorted(orders.published(), key=lambda r: r["order_id"]) == [
        order_row(i) for i in range(1, 10)
    ]
    status = orders.pipeline.status(2)
    assert status.state is EpochState.COMMITTED
    state = status.prepared["ingest"].operators["seen_orders"]
    assert (state.key_groups, state.key_columns, state.state_kind) == (
        KEY_GROUPS,
        ["order_id"],
        "key_set",
    )


def test_epoch_without_new_input_stages_nothing_and_keeps_the_state(
    spark: Any, orders: OrdersPipeline, published_ids: Callable[[], list[int]]
) -> None:
    orders.add_file("a", [1, 2, 3])
    orders.commit(run_stage(orders.spec("run-1"), spark))
    quiet = run_stage(orders.spec("run-2"), spark)
    assert (quiet.epoch, quiet.rows) == (2, 0)
    orders.commit(quiet)
    orders.add_file("b", [3, 4])
    orders.commit(run_stage(orders.spec("run-3"), spark))
    assert published_ids() == [1, 2, 3, 4]


def test_unchanged_key_groups_reference_older_parts_and_chains_stay_bounded(
    spark: Any, orders: OrdersPipeline
) -> None:
    groups = ids_by_key_group(spark, 200)
    orders.add_file("all", [i for g in range(KEY_GROUPS) for i in groups[g][:5]])
    orders.commit(run_stage(orders.spec("run-1"), spark))
    # Later epochs only touch key group 0: the other key groups keep epoch 1's part.
    for epoch in (2, 3, 4):
        orders.add_file(f"g0-{epoch}", groups[0][5 * epoch : 5 * epoch + 5])
        result = run_stage(orders.spec(f"run-{epoch}"), spark)
        orders.commit(result)
        chains = orders.pipeline.status(epoch).prepared["ingest"].operators["seen_orders"].chains
        assert all(ref.epoch == 1 for g in range(1, KEY_GROUPS) for ref in chains[g])
        assert chains[0][-1].epoch == epoch
    # Epoch 4: its changes and the three similar runs before them merge into one FULL run.
    assert [(ref.epoch, ref.kind) for ref in chains[0]] == [(4, "full")]
    assert len(orders.published()) == 5 * KEY_GROUPS + 15


def test_a_compaction_of_older_runs_commits_beside_the_new_run_and_restores(
    spark: Any, orders: OrdersPipeline, published_ids: Callable[[], list[int]]
) -> None:
    groups = ids_by_key_group(spark, 12000)
    ours = groups[0]
    orders.add_file("all", [i for g in range(KEY_GROUPS) for i in groups[g][:5]])
    orders.commit(run_stage(orders.spec("run-1"), spark))
    for epoch in range(2, 8):  # small runs; key group 0 merges in its turns (epochs 4 and 8)
        orders.add_file(f"g0-{epoch}", ours[5 * epoch: 5 * epoch + 5])
        orders.commit(run_stage(orders.spec(f"run-{epoch}"), spark))
    # Epoch 8's changes are much larger than the runs before them: key group 0 merges its
    # four similar restored runs into one, and its new run follows that merge's output.
    orders.add_file("g0-8", ours[40:2040])
    eighth = run_stage(orders.spec("run-8"), spark)
    orders.commit(eighth)
    chain = orders.pipeline.status(8).prepared["ingest"].operators["seen_orders"].chains[0]
    assert [(ref.epoch, ref.kind) for ref in chain] == [(8, "full"), (8, "delta")]
    # Epoch 9 looks its keys up in that chain (a part the driver had removed would fail
    # it): ids of every earlier epoch are duplicates.
    orders.add_file("g0-9", [*ours[:2040:97], *ours[2040:2045]])
    ninth = run_stage(orders.spec("run-9"), spark)
    assert ninth.rows == 5
    orders.commit(ninth)
    first = {i for g in range(KEY_GROUPS) for i in groups[g][:5]}
    assert published_ids() == sorted(first | set(ours[10:2045]))


def test_key_value_state_keeps_running_totals_across_epochs(
    run: RunStage, orders: OrdersPipeline
) -> None:
    orders.add_file("a", [1, 2, 3, 4, 4])
    first = run(orders.spec("run-1", stage="tests.spark.stages:dedup_and_totals"))
    orders.commit(first)
    orders.add_file("b", [4, 5, 7])
    second = run(orders.spec("run-2", stage="tests.spark.stages:dedup_and_totals"))
    orders.commit(second)

    assert second.rows == 2 + 2  # orders 5 and 7; customers c2 (5) and c1 (7)
    latest = {}
    for row in orders.published("totals"):
        latest[row["customer"]] = row  # epoch directories are read in order
    assert {c: (r["total"], r["orders"], r["largest"]) for c, r in latest.items()} == {
        "c0": (3.0, 1, 3.0),
        "c1": (1.0 + 4.0 + 7.0, 3, 7.0),
        "c2": (2.0 + 5.0, 2, 5.0),
    }


def test_retry_after_partial_staging_reads_the_same_input_and_never_publishes_the_stale_attempt(
    run: RunStage, orders: OrdersPipeline, published_ids: Callable[[], list[int]]
) -> None:
    orders.add_file("a", [1, 2, 2, 3])
    with pytest.raises(InjectedFailure):
        run(orders.spec("run-1", attempt=1, stage="tests.spark.stages:fail_after_staging"))
    stale = sorted(
        p.name
        for p in (
            orders.root / "store" / "orders" / "_staging" / "epoch=1" / "attempt=1" / "orders_table"
        ).glob("*.parquet")
    )
    assert stale, "the failed attempt staged files"
    orders.add_file("late", [3, 4])  # arrives between the attempts

    retry = run(orders.spec("run-1", attempt=2))
    assert (retry.epoch, retry.attempt) == (1, 2)
    assert retry.sources["orders"]["files"] == ["a.parquet"], (
        "the retry reads exactly the same input"
    )
    orders.commit(retry)
    assert published_ids() == [1, 2, 3]
    assert not set(orders.published_files()) & set(stale)
    assert not (orders.root / "store" / "orders" / "_staging" / "epoch=1").exists()

    late = run(orders.spec("run-2"))  # the late file lands in the next epoch
    assert late.sources["orders"]["files"] == ["late.parquet"]
    orders.commit(late)
    assert published_ids() == [1, 2, 3, 4]


def test_retry_of_a_prepared_participant_returns_the_prepared_result_without_running(
    spark: Any, orders: OrdersPipeline
) -> None:
    orders.add_file("a", [1, 2])
    first = run_stage(orders.spec("run-1", attempt=1), spark)
    again = run_stage(
        orders.spec("run-1", attempt=2, stage="tests.spark.stages:must_not_run"), spark
    )
    assert again.reused and (again.epoch, again.attempt, again.rows) == (1, 1, first.rows)
    assert again.manifests == first.manifests


def test_state_checkpointed_with_other_key_groups_is_refused(
    spark: Any, orders: OrdersPipeline
) -> None:
    orders.add_file("a", [1])
    orders.commit(run_stage(orders.spec("run-1"), spark))
    orders.add_file("b", [2])
    with pytest.raises(StateError, match="key groups"):
        run_stage(orders.spec("run-2", key_groups=KEY_GROUPS * 2), spark)


def test_stage_spec_round_trips_through_json_and_rejects_unknown_fields() -> None:
    spec = StageSpec(
        pipeline="p",
        participant="s",
        run_id="manual__1",
        attempt=3,
        stage="m:f",
        sources={"in": {"path": "file:///x"}},
        spark_conf={"spark.sql.shuffle.partitions": 8},
    )
    assert StageSpec.from_json(spec.to_json()) == spec
    with pytest.raises(ConfigError, match="unknown field"):
        StageSpec.from_dict({**spec.to_dict(), "surprise": 1})
    with pytest.raises(ConfigError, match="import path"):
        StageSpec(pipeline="p", participant="s", run_id="r", attempt=1, stage="no_colon")


def test_stage_result_counts_only_parts_the_epoch_wrote(spark: Any, orders: OrdersPipeline) -> None:
    orders.add_file("a", list(range(40)))
    first = run_stage(orders.spec("run-1"), spark)
    orders.commit(first)
    assert first.checkpoint_bytes > 0
    record = orders.pipeline.status(1).prepared["ingest"]
    assert (
        StageResult.from_prepared("orders", record, reused=False).checkpoint_bytes
        == first.checkpoint_bytes
    )


def test_state_is_complete_even_when_the_stage_consumes_part_of_the_result(
    run: RunStage, orders: OrdersPipeline, published_ids: Callable[[], list[int]]
) -> None:
    orders.add_file("a", [5, 1, 2, 3])
    first = run(orders.spec("run-1", stage="tests.spark.stages:dedup_but_stage_one_row"))
    orders.commit(first)
    assert published_ids() == [1]
    orders.add_file("b", [2, 3, 5, 6])  # all but 6 were seen by epoch 1's state
    orders.commit(
        run(orders.spec("run-2", stage="tests.spark.stages:dedup_but_stage_one_row"))
    )
    assert published_ids() == [1, 6]


def test_a_filter_after_dedup_does_not_keep_keys_from_the_state(
    spark: Any, orders: OrdersPipeline, published_ids: Callable[[], list[int]]
) -> None:
    """Spark must not move the stage's own filter below the de-duplication."""
    orders.add_file("a", [1, 2, 3, 4])
    orders.commit(run_stage(orders.spec("run-1", stage="tests.spark.stages:dedup_then_keep_even"), spark))
    assert published_ids() == [2, 4]
    orders.add_file("b", [1, 3, 5, 6])  # 1 and 3 were seen (and filtered out) in epoch 1
    orders.commit(run_stage(orders.spec("run-2"), spark))
    assert published_ids() == [2, 4, 5, 6]


@pytest.mark.connect_slice("the file source's text formats and the CSV sink")
def test_json_source_csv_sink_and_a_composite_key(run: RunStage, orders: OrdersPipeline) -> None:
    import json

    orders.input_dir.mkdir(parents=True)
    rows = [
        {"order_id": 1, "customer": "a"},
        {"order_id": 1, "customer": "b"},
        {"order_id": 1, "customer": "a"},
    ]
    (orders.input_dir / "part-1.json").write_text("\n".join(json.dumps(r) for r in rows))
    spec = orders.spec(
        "run-1",
        stage="tests.spark.stages:dedup_by_composite_key",
        sources={
            "orders": {
                "type": "file",
                "path": str(orders.input_dir),
                "format": "json",
                "schema": "order_id BIGINT, customer STRING",
            }
        },
        sinks={
            "orders_table": {
                "type": "file",
                "path": f"file://{orders.root / 'csv'}",
                "format": "csv",
                "options": {"header": "true"},
            }
        },
    )
    result = run(spec)
    assert result.rows == 2 and result.manifests[0].format == "csv"
    orders.commit(result)
    lines = sorted(
        line
        for f in (orders.root / "csv" / "epoch=1").glob("*.csv")
        for line in f.read_text().splitlines()
        if line and not line.startswith("order_id")
    )
    assert lines == ["1,a", "1,b"]


def test_a_registered_source_plans_offsets_from_the_committed_history(
    spark: Any, orders: OrdersPipeline, published_ids: Callable[[], list[int]]
) -> None:
    def spec(run_id: str, attempt: int = 1) -> StageSpec:
        return orders.spec(
            run_id,
            attempt,
            stage="tests.spark.stages:copy_counter",
            sources={"numbers": {"type": "counter", "per_epoch": 3}},
        )

    first = run_stage(spec("run-1"), spark)
    assert first.sources == {"numbers": {"start": 0, "end": 3}}
    orders.commit(first)
    second = run_stage(spec("run-2"), spark)
    assert second.sources == {"numbers": {"start": 3, "end": 6}}
    orders.commit(second)
    assert published_ids() == list(range(6))


def test_snapshot_reads_the_restored_key_set_on_executors(
    run: RunStage, orders: OrdersPipeline, published_ids: Callable[[], list[int]]
) -> None:
    orders.add_file("a", [1, 2, 2, 3])
    orders.commit(run(orders.spec("run-1")))
    orders.add_file("b", [3, 4])
    orders.commit(run(orders.spec("run-2")))
    export = run(orders.spec("run-3", stage="tests.spark.stages:export_seen_keys"))
    assert export.rows == 4
    orders.commit(export)
    assert sorted(r["order_id"] for r in orders.published() if r.get("customer") is None) == [
        1,
        2,
        3,
        4,
    ]


def test_coalescing_the_result_keeps_the_state_exact(
    run: RunStage, orders: OrdersPipeline, published_ids: Callable[[], list[int]]
) -> None:
    # Two ids only: most key groups are empty, and coalesce(1) runs every key group's
    # task under partition index 0.
    orders.add_file("a", [10, 11, 11])
    stage = "tests.spark.stages:dedup_into_one_file"
    first = run(orders.spec("run-1", stage=stage))
    orders.commit(first)
    assert len(orders.published_files()) == 1
    orders.add_file("b", [11, 12])
    orders.commit(run(orders.spec("run-2", stage=stage)))
    assert published_ids() == [10, 11, 12]


class ReplicatedOrders(OrdersPipeline):
    """The orders pipeline with a secondary checkpoint replica."""

    @property
    def store(self) -> dict[str, Any]:
        return {**super().store, "secondary_url": f"file://{self.root / 'replica'}"}


def test_a_retry_skips_a_checkpoint_damaged_in_place_that_failed_the_first_attempt(
    spark: Any, tmp_path: Any
) -> None:
    orders = ReplicatedOrders(tmp_path)
    orders.add_file("a", [1, 2, 3])
    orders.commit(run_stage(orders.spec("run-1"), spark))
    parts = sorted((tmp_path / "store" / "orders" / "checkpoint_1" / "operators").rglob("part-*"))
    assert parts, "epoch 1 wrote keyed-state parts"
    for part in parts:  # bit rot: same size, so a size check cannot see it
        data = bytearray(part.read_bytes())
        data[len(data) // 2] ^= 0xFF
        part.write_bytes(bytes(data))

    orders.add_file("b", [3, 4])
    with pytest.raises(Exception, match="(?i)checksum|crc|corrupt"):
        run_stage(orders.spec("run-2", attempt=1), spark)
    retry = run_stage(orders.spec("run-2", attempt=2), spark)
    orders.commit(retry)
    assert sorted(r["order_id"] for r in orders.published()) == [1, 2, 3, 4]


def test_a_key_set_on_a_pyspark_without_arrow_udfs_says_to_upgrade(
    spark: Any, orders: OrdersPipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PySpark 4.0 (which cannot run beside 4.2 here) has no ``arrow_udf``: the stage fails with what to do."""
    from pyspark.sql import functions as F

    monkeypatch.delattr(F, "arrow_udf")
    orders.add_file("a", [1, 2])
    with pytest.raises(StateError, match="PySpark 4.1 or later"):
        run_stage(orders.spec("run-1"), spark)


def test_classic_and_connect_runs_of_the_same_epochs_write_the_same_checkpoints_and_rows(
    spark: Any, connect_server: str, tmp_path: Any
) -> None:
    """The same input, stage and epochs, once on a classic session and once through Spark
    Connect: the same published rows, and keyed states whose chains hold the same keys and
    values (part for part: kind, epoch, key group)."""

    from airflow_seatunnel_ckpt.core.state.checkpoint import read_chain

    def epochs(orders: OrdersPipeline, runner: Callable[[StageSpec], StageResult]) -> None:
        orders.add_file("a", [1, 2, 3, 4, 4])
        orders.commit(runner(orders.spec("run-1", stage="tests.spark.stages:dedup_and_totals")))
        orders.add_file("b", [4, 5, 7, 1])
        orders.commit(runner(orders.spec("run-2", stage="tests.spark.stages:dedup_and_totals")))

    classic, connect = OrdersPipeline(tmp_path / "classic"), OrdersPipeline(tmp_path / "connect")
    epochs(classic, lambda spec: run_stage(spec, spark))
    epochs(connect, lambda spec: run_stage(spec.replace(remote=connect_server)))

    def by_id(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return sorted(rows, key=lambda r: (r.get("order_id", 0), r.get("customer", ""), r.get("total", 0)))

    assert by_id(connect.published()) == by_id(classic.published())
    assert by_id(connect.published("totals")) == by_id(classic.published("totals"))
    for name in ("seen_orders", "customer_totals"):
        states = [o.pipeline.status(2).prepared["ingest"].operators[name] for o in (classic, connect)]
        assert states[0].chains.keys() == states[1].chains.keys()
        for group, chain in states[0].chains.items():
            other = states[1].chains[group]
            assert [(p.kind, p.epoch, p.key_group) for p in chain] == [(p.kind, p.epoch, p.key_group) for p in other]
            keys = list(states[0].key_columns)
            contents = [read_chain(o.pipeline.storage, c, keys).sort_by([(k, "ascending") for k in keys]).to_pylist()
                        for o, c in ((classic, chain), (connect, other))]
            assert contents[0] == contents[1], (name, group)
