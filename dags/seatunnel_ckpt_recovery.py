"""Recovery DAG: every minute, resolve what crashes left half done in every pipeline.

For each pipeline of every checkpoint store (one mapped task per pipeline):

* an epoch decided COMMIT whose publish never finished is published (roll forward); a sink
  whose target already holds it (a commit killed after the table commit) is not committed
  again;
* an undecided epoch is aborted once it is dead -- its stage's lease expired
  (``lease_timeout_s``, or the lease's own longer timeout), it is undecided
  ``prepared_timeout_s`` after it was prepared, or Airflow reports its DAG run finished
  (its input stays unconsumed, so the next run processes it); a running stage is never
  aborted;
* staging and checkpoint directories no live epoch references are removed;
* retention then keeps the newest ``max_retain`` checkpoints and every base they need.

Every action goes through the same write-once decision record the pipeline DAGs use, so
this DAG is safe to run at any time, next to running pipelines, and to clear or retry.

The stores: every store the Checkpoints page lists, found the same way when a task runs --
connections of type ``seatunnel_ckpt`` defined as ``AIRFLOW_CONN_<ID>`` variables, the URLs
and connection ids listed in ``[seatunnel_ckpt] stores``, and the provider's default store
(the connection ``seatunnel_ckpt_default`` when defined, else ``$SEATUNNEL_CKPT_STORE``, else
``$AIRFLOW_HOME/seatunnel-ckpt``), the one every pipeline DAG that sets no store uses. A
connection kept only in the metadata database cannot be listed by a task: name its id in
``[seatunnel_ckpt] stores`` (the log of ``list_pipelines`` and the page say which stores are
not watched). Each pipeline is recovered with its own settings (``prepared_timeout_s``,
``lease_timeout_s``, ``max_retain`` ...), which its DAG recorded in the pipeline's
descriptor in the store.

Every minute: with a pipeline's ``lease_timeout_s`` of 30 s, an epoch whose worker was lost
is aborted within about a minute (see docs/DEPLOYMENT.md for the settings that go with it).

A run that finds no pipeline in any store logs a WARNING naming the stores and fails: a
recovery DAG that watches other stores than the pipelines write must not look green.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from airflow.sdk import DAG

from airflow_seatunnel_ckpt.operators.recovery import (
    ListAllPipelinesOperator,
    RecoverPipelineOperator,
    RetainCheckpointsOperator,
)

with DAG(
    dag_id="seatunnel_ckpt_recovery",
    description="Finish or abort half-done epochs of every checkpointed pipeline",
    schedule=timedelta(minutes=1),
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=1,
    default_args={"retries": 2, "retry_delay": timedelta(seconds=10)},
    tags=["seatunnel-ckpt", "recovery"],
    doc_md=__doc__,
) as dag:
    pipelines = ListAllPipelinesOperator(task_id="list_pipelines")
    recovered = RecoverPipelineOperator.partial(task_id="recover").expand_kwargs(pipelines.output)
    retained = RetainCheckpointsOperator.partial(task_id="retain").expand_kwargs(pipelines.output)
    recovered >> retained
