"""The stage runtime across real processes: a killed driver, and spark-submit to a cluster."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from airflow_seatunnel_ckpt.core import EpochState
from tests.conftest import FAST_JVM_OPTIONS, SparkStandaloneCluster
from tests.spark.conftest import OrdersPipeline
from tests.spark.stages import STAGED_MARKER_ENV

pytestmark = [pytest.mark.spark, pytest.mark.slow]

REPO_ROOT = Path(__file__).resolve().parents[2]

#: Settings for a driver of its own on this small machine.
SMALL_DRIVER = {
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.driver.extraJavaOptions": FAST_JVM_OPTIONS,
}


def _python_path() -> str:
    return os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))


@pytest.mark.crash
def test_restart_after_a_killed_driver_resumes_the_same_epoch_exactly_once(
    spark: Any, orders: OrdersPipeline, tmp_path: Path, published_ids: Callable[[], list[int]]
) -> None:
    from airflow_seatunnel_ckpt.spark import run_stage

    orders.add_file("a", [1, 2, 3])
    orders.commit(run_stage(orders.spec("run-1"), spark))
    orders.add_file("b", [3, 4, 4, 5])

    # Attempt 1 of epoch 2 runs in a driver process of its own, stages its output and
    # state parts, and is SIGKILLed (driver, JVM and Python workers) before it prepares.
    spec = orders.spec(
        "run-2",
        attempt=1,
        stage="tests.spark.stages:hang_after_staging",
        master="local[1]",
        spark_conf=SMALL_DRIVER,
    )
    spec_file, marker, log = tmp_path / "spec.json", tmp_path / "staged", tmp_path / "driver.log"
    spec_file.write_text(spec.to_json())
    env = {**os.environ, STAGED_MARKER_ENV: str(marker), "PYTHONPATH": _python_path()}
    with log.open("wb") as out:
        driver = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "airflow_seatunnel_ckpt.spark.driver",
                "--spec-file",
                str(spec_file),
            ],
            cwd=REPO_ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 240
        while not marker.exists():
            assert driver.poll() is None, (
                f"driver exited early ({driver.returncode}):\n{log.read_text()[-3000:]}"
            )
            assert time.monotonic() < deadline, (
                f"driver did not stage in time:\n{log.read_text()[-3000:]}"
            )
            time.sleep(0.2)
    finally:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait(timeout=60)
    assert marker.read_text() == "2 1"
    assert orders.pipeline.status(2).state is EpochState.OPEN
    staged = (
        orders.root / "store" / "orders" / "_staging" / "epoch=2" / "attempt=1" / "orders_table"
    )
    assert list(staged.glob("*.parquet")), "the killed attempt had staged output"

    # The next attempt of the same run resumes epoch 2 with the same input.
    retry = run_stage(orders.spec("run-2", attempt=2), spark)
    assert (retry.epoch, retry.attempt, retry.sources["orders"]["files"]) == (
        2,
        2,
        ["b.parquet"],
    )
    orders.commit(retry)
    assert published_ids() == [1, 2, 3, 4, 5]


@pytest.mark.cluster
def test_stage_submitted_through_spark_submit_hook_to_a_standalone_cluster_is_exactly_once(
    spark_standalone: SparkStandaloneCluster,
    orders: OrdersPipeline,
    published_ids: Callable[[], list[int]],
) -> None:
    from airflow_seatunnel_ckpt.spark import submit_stage

    conf = {
        **SMALL_DRIVER,
        "spark.executor.memory": "512m",
        "spark.cores.max": "1",
        "spark.executor.extraJavaOptions": FAST_JVM_OPTIONS,
    }
    env = {"PYTHONPATH": _python_path(), "SPARK_HOME": str(spark_standalone.spark_home)}
    orders.add_file("a", [1, 2, 2, 3])
    first = submit_stage(
        orders.spec("run-1", spark_conf=conf), master=spark_standalone.master_url, env_vars=env
    )
    assert (first.epoch, first.rows, first.reused) == (1, 3, False)
    orders.commit(first)

    orders.add_file("b", [3, 4])
    second = submit_stage(
        orders.spec("run-2", spark_conf=conf), master=spark_standalone.master_url, env_vars=env
    )
    assert (second.epoch, second.rows) == (2, 1)
    orders.commit(second)
    assert published_ids() == [1, 2, 3, 4]
