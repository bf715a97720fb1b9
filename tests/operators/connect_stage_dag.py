"""An epoch DAG whose stage runs through Spark Connect (run as a script, or built by a test).

``python -m tests.operators.connect_stage_dag STORE_URL INPUT_DIR OUTPUT_DIR REMOTE`` syncs the
DAG to the metadata database of the test session (it imports ``tests.conftest``, which reads
the session's root from the environment) and runs it with ``dag.test()`` at
:data:`LOGICAL_DATE`, with the run id ``run_at`` gives that date: the test kills this
process while the stage's Connect operation runs, then runs the same DAG run again itself.
With a fifth argument ``replay`` the process commits that epoch, then replays it in a run of
its own (:data:`REPLAY_DATE`), which the test kills the same way.
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta
from typing import Any

import tests.conftest as session  # sets the Airflow environment before Airflow is imported

LOGICAL_DATE = datetime(2026, 1, 1, tzinfo=UTC)


def make_dag(store_url: str, input_dir: str, output_dir: str, remote: str) -> Any:
    """One epoch: the stage through Connect at ``remote``, then prepared, decide, commit (file sink)."""
    from airflow.sdk import DAG

    from airflow_seatunnel_ckpt.task_group import checkpointed_epoch

    with DAG("connect_stage", schedule=None, start_date=LOGICAL_DATE) as dag:
        checkpointed_epoch(
            "orders", pipeline="orders", storage_url=store_url,
            stages={"ingest": {"stage": "tests.spark.stages:dedup_then_wait_on_the_server", "spark_remote": remote,
                               "sources": {"orders": {"type": "file", "path": input_dir, "format": "parquet"}},
                               "sinks": {"orders_table": {"type": "file", "path": output_dir,
                                                          "format": "parquet"}},
                               "key_groups": 2, "retry_delay": timedelta(seconds=0)}},
            sensor={"poke_interval": 0.2})
    return dag


#: The logical date of the replay run (``... REMOTE replay``), the day after :data:`LOGICAL_DATE`'s epoch.
REPLAY_DATE = LOGICAL_DATE + timedelta(days=1)
#: What the replay run's ``conf`` asks: a full refresh.
REPLAY_CONF = {"replay": {"from_epoch": 1, "reason": "full refresh through Connect"}}


def main(store_url: str, input_dir: str, output_dir: str, remote: str, replay: str = "") -> None:
    """Run the DAG at :data:`LOGICAL_DATE`; with ``replay``, commit that epoch first (its stage told
    nothing to wait for: ``$SEATUNNEL_TEST_STAGED_MARKER`` unset for it), then replay it in the run at
    :data:`REPLAY_DATE`."""
    import os

    from tests.spark.stages import STAGED_MARKER_ENV

    dag = make_dag(store_url, input_dir, output_dir, remote)
    session.sync_dag_to_db(dag)
    marker = os.environ.pop(STAGED_MARKER_ENV, None) if replay else None
    dag.test(logical_date=LOGICAL_DATE, run_after=LOGICAL_DATE)
    if replay:
        if marker:
            os.environ[STAGED_MARKER_ENV] = marker
        dag.test(logical_date=REPLAY_DATE, run_after=REPLAY_DATE, run_conf=REPLAY_CONF)


if __name__ == "__main__":
    main(*sys.argv[1:6])
