"""Recovery DAG: every few minutes, resolve what crashes left half done in every pipeline.

For each pipeline of the checkpoint store (one mapped task per pipeline):

* an epoch decided COMMIT whose publish never finished is published (roll forward);
* an epoch still undecided past ``prepared_timeout_s`` is aborted (its input stays
  unconsumed, so the next run processes it);
* staging and checkpoint directories no live epoch references are removed;
* retention then keeps the newest ``max_retain`` checkpoints and every base they need.

Every action goes through the same write-once decision record the pipeline DAGs use, so
this DAG is safe to run at any time, next to running pipelines, and to clear or retry.

Configuration (environment, read when the file is parsed):

``SEATUNNEL_CKPT_STORE_CONN_ID``
    connection of type ``seatunnel_ckpt`` naming the store (credentials in extras);
``SEATUNNEL_CKPT_STORE``
    store URL when there is no connection; default: ``$AIRFLOW_HOME/seatunnel-ckpt/checkpoints``,
    the store of the example pipeline DAG.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from typing import Any

from airflow.sdk import DAG

from airflow_seatunnel_ckpt.operators.recovery import (
    ListPipelinesOperator,
    RecoverPipelineOperator,
    RetainCheckpointsOperator,
)

STORE_CONN_ID = os.environ.get("SEATUNNEL_CKPT_STORE_CONN_ID") or None
STORAGE_URL = os.environ.get("SEATUNNEL_CKPT_STORE") or "file://" + os.path.join(
    os.environ.get("AIRFLOW_HOME") or os.path.expanduser("~/airflow"), "seatunnel-ckpt",
    "checkpoints")
STORE: dict[str, Any] = {"store_conn_id": STORE_CONN_ID,
         "storage_url": None if STORE_CONN_ID else STORAGE_URL}

with DAG(
    dag_id="seatunnel_ckpt_recovery",
    description="Finish or abort half-done epochs of every checkpointed pipeline",
    schedule=timedelta(minutes=5),
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=1,
    default_args={"retries": 2, "retry_delay": timedelta(seconds=30)},
    tags=["seatunnel-ckpt", "recovery"],
    doc_md=__doc__,
) as dag:
    pipelines = ListPipelinesOperator(task_id="list_pipelines", **STORE)
    recovered = RecoverPipelineOperator.partial(task_id="recover", **STORE).expand(
        pipeline=pipelines.output)
    retained = RetainCheckpointsOperator.partial(task_id="retain", **STORE).expand(
        pipeline=pipelines.output)
    recovered >> retained
