"""A stage's sources and sinks are checked once, through their type's options model, when the DAG is parsed.

The typed options are what the stage spec carries on to the run (and through its JSON to a
``spark-submit`` driver); a templated value is left to the check once rendered.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any, Literal

import pytest

from airflow_seatunnel_ckpt.core.errors import ConfigError
from airflow_seatunnel_ckpt.core.options import Options
from airflow_seatunnel_ckpt.spark.declaration import EntryDeclaration
from airflow_seatunnel_ckpt.spark.registry import SINKS, register_sink
from airflow_seatunnel_ckpt.spark.spec import StageSpec


class QueueSinkOptions(Options):
    type: Literal["queue"] = "queue"
    queue: str
    """The queue the rows go to."""
    batch_rows: int = 500
    """Rows per message."""


class QueueSink:
    """A user's sink, built as ``factory(name, **options)`` like the package's own."""

    def __init__(self, name: str, **options: Any) -> None:
        self.name, self.options = name, options


@pytest.fixture
def queue_type() -> Iterator[None]:
    register_sink("queue", QueueSink, options=QueueSinkOptions)
    yield
    SINKS._registered.pop("queue", None)
    SINKS._models.pop("queue", None)


def test_an_entry_is_checked_through_its_options_model_and_carried_typed(queue_type: None) -> None:
    with pytest.raises(ConfigError) as raised:
        EntryDeclaration.check("sink", "out", {"type": "queue", "queu": "orders"}, where="DAG 'd'")
    assert re.search(r"DAG 'd': sink 'out' \(type 'queue'\): missing required option 'queue'; "
                     r"unknown option 'queu' \(did you mean 'queue'\?\)", str(raised.value))
    with pytest.raises(ConfigError, match=r"option 'batch_rows': .*integer.* \(found 'many'\)"):
        EntryDeclaration.check("sink", "out", {"type": "queue", "queue": "q", "batch_rows": "many"}, where="DAG 'd'")

    declared = EntryDeclaration.check("sink", "out", {"type": "queue", "queue": "orders"}, where="DAG 'd'")
    assert declared.typed == QueueSinkOptions(queue="orders", batch_rows=500)
    spec = StageSpec(pipeline="p", participant="s", run_id="r", attempt=1, stage="m:f",
                     sinks={"out": declared.spec_options})
    assert spec.sinks["out"] is declared.typed  # carried typed, not read again as a dict
    # Through the spec's JSON (to a spark-submit driver) it arrives as the same options.
    assert spec.to_dict()["sinks"] == {"out": {"type": "queue", "queue": "orders", "batch_rows": 500}}
    assert StageSpec.from_json(spec.to_json()).sinks["out"] == declared.typed.to_dict()
    built = SINKS.build("out", spec.sinks["out"])
    assert isinstance(built, QueueSink) and built.options == {"queue": "orders", "batch_rows": 500}


def test_a_templated_value_is_left_to_run_time_but_the_rest_is_checked(queue_type: None) -> None:
    declared = EntryDeclaration.check("sink", "out", {"type": "queue", "queue": "{{ params.queue }}"}, where="d")
    assert declared.typed is None  # checked again once rendered
    with pytest.raises(ConfigError, match=r"unknown option 'batch' \(did you mean 'batch_rows'\?\)"):
        EntryDeclaration.check("sink", "out", {"type": "queue", "queue": "{{ params.queue }}", "batch": 1}, where="d")


