"""Recovery DAG: every few minutes, resolve what crashes left half done in every pipeline.

For each pipeline of the checkpoint store (one mapped task per pipeline):

* an epoch decided COMMIT whose publish never finished is published (roll forward);
* an undecided epoch is aborted once it is dead -- its stage's lease expired
  (``lease_timeout_s``, or the lease's own longer timeout), it is undecided ``prepared_timeout_s`` after it was prepared,
  or Airflow reports its DAG run finished -- (its input stays unconsumed, so the next run
  processes it); a running stage is never aborted;
* staging and checkpoint directories no live epoch references are removed;
* retention then keeps the newest ``max_retain`` checkpoints and every base they need.

Every action goes through the same write-once decision record the pipeline DAGs use, so
this DAG is safe to run at any time, next to running pipelines, and to clear or retry.

The store: this DAG sets none, so it uses the provider's default store -- the same one
every pipeline DAG that sets none uses (``dags/orders_pipeline.py`` does not), so the two
can never diverge. The default is the connection ``seatunnel_ckpt_default`` when it is
defined (``$SEATUNNEL_CKPT_STORE_CONN_ID`` names another), else ``$SEATUNNEL_CKPT_STORE``,
else ``$AIRFLOW_HOME/seatunnel-ckpt``; all are read when a task runs. Each pipeline is
recovered with its own settings (``prepared_timeout_s``, ``max_retain`` ...), which its
DAG recorded in the pipeline's descriptor in the store.

A run that finds no pipeline in the store logs a WARNING naming the store and fails: a
recovery DAG that watches another store than the pipelines write must not look green.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from airflow.sdk import DAG

from airflow_seatunnel_ckpt.operators.recovery import (
    ListPipelinesOperator,
    RecoverPipelineOperator,
    RetainCheckpointsOperator,
)

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
    pipelines = ListPipelinesOperator(task_id="list_pipelines")
    recovered = RecoverPipelineOperator.partial(task_id="recover").expand(
        pipeline=pipelines.output)
    retained = RetainCheckpointsOperator.partial(task_id="retain").expand(
        pipeline=pipelines.output)
    recovered >> retained
