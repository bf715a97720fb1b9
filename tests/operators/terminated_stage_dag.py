"""A one-task DAG whose in-process stage is terminated mid-job (run as a script).

``python -m tests.operators.terminated_stage_dag STORE_URL INPUT_DIR`` syncs the DAG to the
metadata database of the test session (it imports ``tests.conftest``, which reads the
session's root from the environment) and runs it with ``dag.test()``: the task runs in
this process, with the task runner's SIGTERM handler (``on_kill``), as a LocalExecutor
task process does. The test sends SIGTERM while the stage's Spark job runs.
"""

from __future__ import annotations

import os
import sys
from datetime import UTC, datetime

import tests.conftest as session  # sets the Airflow environment before Airflow is imported

# The test session's loopback setting is left out: the stage task's own defaults are tested.
os.environ.pop("SPARK_LOCAL_IP", None)


def main(store_url: str, input_dir: str) -> None:
    from airflow.sdk import DAG

    from airflow_seatunnel_ckpt.operators.stage import SparkStageOperator

    with DAG("terminated_stage", schedule=None, start_date=datetime(2026, 1, 1, tzinfo=UTC)) as dag:
        SparkStageOperator(
            task_id="ingest", pipeline="terminated", storage_url=store_url,
            stage="tests.spark.stages:sleep_inside_a_spark_job",
            sources={"orders": {"type": "file", "path": input_dir, "format": "json"}},
            sinks={"out": {"type": "file", "path": f"{input_dir}-out", "format": "json"}},
            # As the example's stage: no address, the Spark UI on (the defaults are tested).
            spark_conf={"spark.master": "local[1]", "spark.ui.showConsoleProgress": "false",
                        "spark.driver.extraJavaOptions": session.FAST_JVM_OPTIONS})
    session.sync_dag_to_db(dag)
    dag.test(logical_date=datetime(2026, 1, 1, tzinfo=UTC))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
