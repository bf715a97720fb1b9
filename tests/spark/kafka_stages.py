"""Stages of the Kafka source tests (named by import path)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from airflow_seatunnel_ckpt.spark import StageContext


class InjectedFailure(RuntimeError):
    """A stage failing on purpose, after it staged its output."""


def copy_events(ctx: StageContext, spark: Any) -> None:
    """Every record of the epoch's ranges into the ``out`` sink, as Spark's Kafka source gives it."""
    ctx.sink("out").write(ctx.source("events").read())


def copy_events_then_fail(ctx: StageContext, spark: Any) -> None:
    """Stage every record, then fail before the runner can prepare."""
    copy_events(ctx, spark)
    raise InjectedFailure(f"injected failure after staging epoch {ctx.epoch} attempt {ctx.attempt}")


def fail_before_reading(ctx: StageContext, spark: Any) -> None:
    """Fail after the plan is pinned, before the source is read."""
    raise InjectedFailure(f"injected failure before reading epoch {ctx.epoch} attempt {ctx.attempt}")


#: What :func:`copy_events_changing_the_topic` runs between the source's read (the driver's
#: check of the pinned ranges) and the sink's write (the executors' fetch).
BETWEEN_READ_AND_FETCH: list[Callable[[], None]] = []


def copy_events_changing_the_topic(ctx: StageContext, spark: Any) -> None:
    """:func:`copy_events`, with the topic changed after the driver checked it and before the executors read it."""
    records = ctx.source("events").read()
    for change in BETWEEN_READ_AND_FETCH:
        change()
    ctx.sink("out").write(records)
