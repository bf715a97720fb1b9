"""A pipeline whose epochs an expectation refuses: each run holds its input back and fails.

The stage is core-only (no Spark: the deployment's time goes to what only a deployment
shows): it stages three orders, one without an id, and records the counts of the sink's rule
``id_present`` (``on_fail: fail``) as the staged writer of a Spark stage does, so the commit
branch refuses the epoch. The DAG's failure callback appends the failed run's id to
``$SEATUNNEL_CKPT_EXAMPLE_DIR/held_back/alerts``.
"""

from __future__ import annotations

import dataclasses
import json
import os
from datetime import UTC, datetime
from typing import Any

from airflow.sdk import DAG

from airflow_seatunnel_ckpt.core.models import ExpectationResult
from airflow_seatunnel_ckpt.pipeline_task import BasePipelineOperator
from airflow_seatunnel_ckpt.task_group import checkpointed_epoch

DATA = os.path.join(os.environ.get("SEATUNNEL_CKPT_EXAMPLE_DIR", "/tmp"), "held_back")
ORDERS = [{"order_id": "h-1", "amount": 5}, {"order_id": None, "amount": 7}, {"order_id": "h-3", "amount": 2}]


class ExpectationCountingStage(BasePipelineOperator):
    """Stage :data:`ORDERS` into each sink with the counts of the rule ``id_present`` (one failing row)."""

    def __init__(self, *, participant: str, sinks: dict[str, str], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.participant = participant
        self.sinks = sinks

    def execute(self, context: Any) -> dict[str, Any]:
        pipeline = self.store_pipeline
        run_id, attempt = context["run_id"], context["ti"].try_number
        epoch = pipeline.begin(run_id, dag_id=context["dag"].dag_id).epoch
        rule = ExpectationResult(name="id_present", expr="order_id IS NOT NULL", on_fail="fail",
                                 checked=len(ORDERS), failed=sum(o["order_id"] is None for o in ORDERS))
        manifests = []
        for sink, target in self.sinks.items():
            data = "".join(json.dumps(o) + "\n" for o in ORDERS).encode()
            pipeline.storage.write_atomic(f"{pipeline.staging_path(epoch, attempt, sink)}/part-0.jsonl", data)
            manifest = pipeline.manifest_for_staged(epoch, attempt, sink, target, len(ORDERS), fmt="json")
            manifests.append(dataclasses.replace(manifest, expectations=(rule,)))
        pipeline.prepare(epoch, self.participant, attempt, run_id=run_id, sinks=manifests)
        return {"epoch": epoch}


def alert(context: Any) -> None:
    """The DAG's failure callback: one line per failed run."""
    run_id = context.get("run_id") or getattr(context.get("dag_run"), "run_id", "?")
    with open(os.path.join(DATA, "alerts"), "a") as out:
        out.write(f"{run_id}\n")


with DAG("held_back_orders", schedule=None, start_date=datetime(2026, 1, 1, tzinfo=UTC), catchup=False,
         max_active_runs=1, on_failure_callback=alert) as dag:
    checkpointed_epoch(
        "orders", pipeline="held_back_orders", storage_url=f"file://{DATA}/checkpoints", emit_assets=False,
        stages={"ingest": {"sinks": {"orders_out": f"file://{DATA}/out"}}},
        sensor={"poke_interval": 1, "timeout": 120}, stage_class=ExpectationCountingStage)
