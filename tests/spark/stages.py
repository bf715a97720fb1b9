"""Stage functions the Spark runtime tests run, by import path (``tests.spark.stages:...``).

They live in a module, not in the tests, because a stage is named by import path and the
driver subprocesses (``python -m ...driver``, ``spark-submit``) import it themselves.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from airflow_seatunnel_ckpt.spark import Source, StageContext, register_source

#: Environment variable naming a file the "hang" stage creates once it has staged output.
STAGED_MARKER_ENV = "SEATUNNEL_TEST_STAGED_MARKER"
#: Environment variable: how many rows the job of :func:`dedup_then_wait_on_the_server` sleeps a
#: tenth of a second on (default :data:`BUSY_ROWS`, a minute or two). More only on a server of
#: the test's own, which the test stops: a job nothing interrupts then ends with that server.
BUSY_IDS_ENV = "SEATUNNEL_TEST_BUSY_IDS"
#: The rows of that job by default: two tasks of 600 tenths of a second, one after the other
#: on the test server's one task slot.
BUSY_ROWS = 1200


class InjectedFailure(RuntimeError):
    """Raised by a stage to simulate a crash after partial staging."""


def dedup_orders(ctx: StageContext, spark: Any) -> None:
    """Only new input, de-duplicated against every committed epoch, into one sink."""
    new = ctx.source("orders").read()
    fresh = ctx.key_set("seen_orders").dedup(new, key="order_id")
    ctx.sink("orders_table").write(fresh)


def dedup_and_totals(ctx: StageContext, spark: Any) -> None:
    """De-duplicate, then keep running totals per customer: two sinks, two states."""
    new = ctx.source("orders").read()
    fresh = ctx.key_set("seen_orders").dedup(new, key="order_id").cache()
    ctx.sink("orders_table").write(fresh)
    totals = ctx.key_value("customer_totals").aggregate(
        fresh,
        key="customer",
        aggregates={
            "total": ("sum", "amount"),
            "orders": ("count", "*"),
            "largest": ("max", "amount"),
        },
    )
    ctx.sink("customer_totals").write(totals)
    fresh.unpersist()


def count_per_customer(ctx: StageContext, spark: Any) -> None:
    """Ids and customers into one sink, a running order count per customer into another:
    no query of the stage uses the ``amount`` column."""
    new = ctx.source("orders").read()
    ctx.sink("orders_table").write(new.select("order_id", "customer"))
    counts = ctx.key_value("customer_totals").aggregate(new, key="customer", aggregates={"orders": ("count", "*")})
    ctx.sink("customer_totals").write(counts)


def fail_after_staging(ctx: StageContext, spark: Any) -> None:
    """Stage output and state parts, then fail before the runner can prepare."""
    dedup_orders(ctx, spark)
    raise InjectedFailure(f"injected failure after staging epoch {ctx.epoch} attempt {ctx.attempt}")


def hang_after_staging(ctx: StageContext, spark: Any) -> None:
    """Stage output, tell the test (marker file), then wait to be killed."""
    dedup_orders(ctx, spark)
    Path(os.environ[STAGED_MARKER_ENV]).write_text(f"{ctx.epoch} {ctx.attempt}")
    time.sleep(600)


def must_not_run(ctx: StageContext, spark: Any) -> None:
    """A stage that fails if it is ever run (proves a retry reused the prepared result)."""
    raise AssertionError("the stage ran although the participant was already prepared")


def dedup_but_stage_one_row(ctx: StageContext, spark: Any) -> None:
    """Consume only part of the de-duplicated DataFrame: the state must still be complete."""
    new = ctx.source("orders").read()
    fresh = ctx.key_set("seen_orders").dedup(new, key="order_id")
    ctx.sink("orders_table").write(fresh.orderBy("order_id").limit(1))


def dedup_then_keep_even(ctx: StageContext, spark: Any) -> None:
    """Filter the de-duplicated rows: every input key must still reach the state."""
    new = ctx.source("orders").read()
    fresh = ctx.key_set("seen_orders").dedup(new, key="order_id")
    ctx.sink("orders_table").write(fresh.filter(fresh.order_id % 2 == 0))


def dedup_by_composite_key(ctx: StageContext, spark: Any) -> None:
    """A key set over two columns, source and sink in the formats the spec names."""
    new = ctx.source("orders").read()
    fresh = ctx.key_set("seen_pairs").dedup(new, key=["customer", "order_id"])
    ctx.sink("orders_table").write(fresh)


class CounterSource(Source):
    """A source over an ever-growing sequence 0, 1, 2, ...: offsets are ``[start, end)``."""

    def __init__(self, name: str, per_epoch: int) -> None:
        super().__init__(name)
        self.per_epoch = per_epoch

    def plan(self, history: list[dict[str, Any]]) -> dict[str, Any]:
        ends = [entry["offsets"]["end"] for entry in history if entry["offsets"]]
        start = ends[-1] if ends else 0
        return {"start": start, "end": start + self.per_epoch}

    def read(self, spark: Any, offsets: Any) -> Any:
        return spark.range(offsets["start"], offsets["end"]).withColumnRenamed("id", "order_id")


register_source("counter", CounterSource)


def copy_counter(ctx: StageContext, spark: Any) -> None:
    """Stage what the counter source planned for this epoch."""
    ctx.sink("orders_table").write(ctx.source("numbers").read())


def export_seen_keys(ctx: StageContext, spark: Any) -> None:
    """Stage the key set as restored from the last committed checkpoint."""
    ctx.sink("orders_table").write(ctx.key_set("seen_orders").snapshot())


def dedup_into_one_file(ctx: StageContext, spark: Any) -> None:
    """Coalesce the de-duplicated rows into one file: tasks run under other indexes."""
    new = ctx.source("orders").read()
    fresh = ctx.key_set("seen_orders").dedup(new, key="order_id")
    ctx.sink("orders_table").write(fresh.coalesce(1))


TOTALS = {"total": ("sum", "amount"), "orders": ("count", "*"), "largest": ("max", "amount")}


def totals_snapshot(ctx: StageContext, spark: Any) -> None:
    """Running totals per customer, published as the whole current table each epoch."""
    fresh = ctx.key_set("seen_orders").dedup(ctx.source("orders").read(), key="order_id")
    totals = ctx.key_value("customer_totals").aggregate(
        fresh, key="customer", aggregates=TOTALS, mode="snapshot"
    )
    ctx.sink("customer_totals").write(totals)


def totals_changes_and_state_snapshot(ctx: StageContext, spark: Any) -> None:
    """The changed keys to one sink, ``snapshot()`` of the state after the update to another."""
    fresh = ctx.key_set("seen_orders").dedup(ctx.source("orders").read(), key="order_id")
    state = ctx.key_value("customer_totals")
    changes = state.aggregate(fresh, key="customer", aggregates=TOTALS)
    ctx.sink("orders_table").write(changes)
    ctx.sink("customer_totals").write(state.snapshot())


def seen_keys_after_dedup(ctx: StageContext, spark: Any) -> None:
    """The key set's snapshot after this epoch's dedup: every key seen, this epoch's too."""
    seen = ctx.key_set("seen_orders")
    seen.dedup(ctx.source("orders").read(), key="order_id")
    ctx.sink("orders_table").write(seen.snapshot())


#: Environment variable naming the JSON file ``record_airflow_context`` writes.
CONTEXT_FILE_ENV = "SEATUNNEL_TEST_CONTEXT_FILE"


def record_airflow_context(ctx: StageContext, spark: Any) -> None:
    """De-duplicate as :func:`dedup_orders`, and write what the stage saw of Airflow to a file."""
    import json

    dedup_orders(ctx, spark)
    seen = ctx.airflow.to_dict()
    seen["logical_date_attr"] = ctx.logical_date.isoformat() if ctx.logical_date else None
    seen["params_attr"] = dict(ctx.params)
    try:
        ctx.params["changed"] = True  # type: ignore[index]
        seen["params_writable"] = True
    except TypeError:
        seen["params_writable"] = False
    seen["airflow_fields"] = sorted(seen)
    Path(os.environ[CONTEXT_FILE_ENV]).write_text(json.dumps(seen))


def sleep_inside_a_spark_job(ctx: StageContext, spark: Any) -> None:
    """Run a Spark job whose task tells the test it runs (marker file), then sleeps.

    The job is in flight when the test terminates the task: the driver's main thread waits
    in a py4j call, the JVM's executor waits on a Python worker.
    """
    marker, told = os.environ[STAGED_MARKER_ENV], f"{ctx.epoch} {ctx.attempt}"

    def slow(value: int) -> int:  # runs in a Python worker: refers to no driver object
        Path(marker).write_text(told)
        time.sleep(600)
        return value

    spark.sparkContext.parallelize([1], 1).map(slow).collect()


def dedup_orders_slowly(ctx: StageContext, spark: Any) -> None:
    """:func:`dedup_orders` over six partitions whose tasks each take half a second (three
    waves on two cores), so the stage runs long enough for its progress to be seen."""

    def slow(batches: Any) -> Any:  # runs in a Python worker
        time.sleep(0.5)
        yield from batches

    new = ctx.source("orders").read()
    fresh = ctx.key_set("seen_orders").dedup(new.repartition(6).mapInArrow(slow, new.schema), key="order_id")
    ctx.sink("orders_table").write(fresh)


def stage_then_wait_in_a_spark_job(ctx: StageContext, spark: Any) -> None:
    """Stage output and state parts, then run a Spark job whose task tells the test it runs
    (marker file) and sleeps: the job is in flight on the server when the test kills it.

    Through Spark Connect the client gives up on a server that stopped answering after a
    few seconds here (instead of its default ten minutes of retries).
    """
    from airflow_seatunnel_ckpt.spark.session import is_classic

    dedup_orders(ctx, spark)
    marker, told = os.environ[STAGED_MARKER_ENV], f"{ctx.epoch} {ctx.attempt}"
    if not is_classic(spark):
        from pyspark.sql.connect.client.retries import DefaultPolicy

        spark.client.set_retry_policies([DefaultPolicy(max_retries=3, initial_backoff=200, max_backoff=1000)])

    def slow(batches: Any) -> Any:  # runs in a Python worker: refers to no driver object
        Path(marker).write_text(told)
        time.sleep(600)
        yield from batches

    spark.range(1).mapInArrow(slow, "id long").collect()


def dedup_then_wait_on_the_server(ctx: StageContext, spark: Any) -> None:
    """:func:`dedup_orders`, then -- while ``$SEATUNNEL_TEST_STAGED_MARKER`` is set -- run a Spark
    job of a minute or two on the server through Spark Connect (JVM work only: no Python worker,
    no data of the stage) and tell the test (marker file, written here, in the client) once the
    server reports a task of it running: a test that acts on the marker acts on a running job,
    not on a request still on its way.

    The job's task sleeps in the JVM (``Thread.sleep`` through ``reflect``, a tenth of a second
    per row) rather than scanning ids: it holds the server's task slot as long, without taking
    a core of the two-core test machine from every other test until it is interrupted. An
    interrupt or the release of its session ends it within the row it sleeps on.
    """
    dedup_orders(ctx, spark)
    marker = os.environ.get(STAGED_MARKER_ENV)
    if marker:
        def told(stages: Any, inflight_tasks: int, operation_id: Any, done: bool) -> None:
            if inflight_tasks > 0 and not done:
                Path(marker).write_text(f"{ctx.epoch} {ctx.attempt}")

        spark.registerProgressHandler(told)
        rows = int(os.environ.get(BUSY_IDS_ENV) or BUSY_ROWS)
        slept = spark.range(0, rows, 1, 2).selectExpr("reflect('java.lang.Thread', 'sleep', 100L) AS slept")
        slept.selectExpr("count(slept)").collect()  # a minute or two unless interrupted
