"""Stage functions whose keyed states change shape between runs (pipeline evolution tests)."""

from __future__ import annotations

from typing import Any

from airflow_seatunnel_ckpt.spark import StageContext

SUM = {"total": ("sum", "amount")}


def _totals(ctx: StageContext, state: str, key: str, aggregates: dict[str, tuple[str, str]],
            amount_type: str = "double") -> None:
    from pyspark.sql import functions as F

    new = ctx.source("orders").read().withColumn("amount", F.col("amount").cast(amount_type))
    ctx.sink("customer_totals").write(ctx.key_value(state).aggregate(new, key=key, aggregates=aggregates))


def totals(ctx: StageContext, spark: Any) -> None:
    """Running sum of the amount per customer in state ``customer_totals``."""
    _totals(ctx, "customer_totals", "customer", SUM)


def totals_renamed(ctx: StageContext, spark: Any) -> None:
    """The same state under another name (a rename in the code only)."""
    _totals(ctx, "totals_by_customer", "customer", SUM)


def totals_as_max(ctx: StageContext, spark: Any) -> None:
    """The same column, now a max (would apply max to stored sums)."""
    _totals(ctx, "customer_totals", "customer", {"total": ("max", "amount")})


def totals_by_order(ctx: StageContext, spark: Any) -> None:
    """The same state keyed by another column."""
    _totals(ctx, "customer_totals", "order_id", SUM)


def totals_of_whole_amounts(ctx: StageContext, spark: Any) -> None:
    """The same aggregate over an integer amount: the stored column's type would change."""
    _totals(ctx, "customer_totals", "customer", SUM, amount_type="bigint")


def totals_and_counts(ctx: StageContext, spark: Any) -> None:
    """A new aggregate column next to the stored one (a compatible change)."""
    _totals(ctx, "customer_totals", "customer", {**SUM, "orders": ("count", "*")})


def dedup_by_customer(ctx: StageContext, spark: Any) -> None:
    """tests.spark.stages:dedup_orders's state ``seen_orders`` keyed by the customer instead."""
    ctx.sink("orders_table").write(ctx.key_set("seen_orders").dedup(ctx.source("orders").read(), key="customer"))


def every_source_to_every_sink(ctx: StageContext, spark: Any) -> None:
    """The new rows of every declared source, unchanged, into every declared sink (no state)."""
    frames = [source.read() for _, source in sorted(ctx.sources.items())]
    rows = frames[0]
    for frame in frames[1:]:
        rows = rows.unionByName(frame)
    for _, sink in sorted(ctx.sinks.items()):
        sink.write(rows)


def totals_renamed_as_max(ctx: StageContext, spark: Any) -> None:
    """The renamed state, now a max."""
    _totals(ctx, "totals_by_customer", "customer", {"total": ("max", "amount")})
