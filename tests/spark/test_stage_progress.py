"""What a running stage shows in its task log: Spark's progress while it runs, and rows
read, kept and quarantined per source and written per sink once it ran."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from airflow_seatunnel_ckpt.spark import run_stage
from tests.spark.conftest import OrdersPipeline
from tests.spark.test_source_inputs import text_spec, write_text

pytestmark = [pytest.mark.spark]


def test_a_running_stage_logs_spark_progress_and_rows_per_source_and_sink(
    spark: Any, orders: OrdersPipeline, caplog: pytest.LogCaptureFixture
) -> None:
    for i in range(6):  # each file overlaps the previous one by 2 rows
        orders.add_file(f"f{i}", range(i * 8 + 1, i * 8 + 11))
    spec = orders.spec("run-1", stage="tests.spark.stages:dedup_orders_slowly",
                       sinks={"orders_table": {"type": "file", "path": f"file://{orders.root / 'out' / 'orders'}"}})
    with caplog.at_level(logging.INFO, logger="airflow_seatunnel_ckpt"):
        result = run_stage(spec, spark, progress_interval=0.1)
    assert result.rows == 50
    lines = [r.getMessage() for r in caplog.records]
    running = [line for line in lines if "ingest attempt 1 running: Spark stage" in line]
    assert running, lines
    assert any("tasks done" in line and line.startswith("pipeline orders epoch 1:") for line in running)
    assert any("rows read" in line for line in running), running
    assert len(running) == len(set(running)), "a line is logged only when the progress changed"
    summary = [line for line in lines if line.startswith("pipeline orders epoch 1: ingest attempt 1 rows:")]
    assert summary == ["pipeline orders epoch 1: ingest attempt 1 rows: source orders: 60 read, 60 kept; "
                       "sink orders_table: 50 written"]


def test_a_stage_through_spark_connect_logs_the_progress_its_server_streams(
    connect_server: str, orders: OrdersPipeline, caplog: pytest.LogCaptureFixture
) -> None:
    """No status tracker on a Connect client: the lines come from the progress the server
    sends with each running operation (the bytes, not the rows, its tasks read)."""

    for i in range(6):
        orders.add_file(f"f{i}", range(i * 8 + 1, i * 8 + 11))
    spec = orders.spec("run-1", stage="tests.spark.stages:dedup_orders_slowly",
                       sinks={"orders_table": {"type": "file", "path": f"file://{orders.root / 'out' / 'orders'}"}})
    with caplog.at_level(logging.INFO, logger="airflow_seatunnel_ckpt"):
        result = run_stage(spec.replace(remote=connect_server), progress_interval=0.1)
    assert result.rows == 50
    lines = [r.getMessage() for r in caplog.records]
    running = [line for line in lines if "ingest attempt 1 running: Spark stage" in line]
    assert running, lines
    assert all(re.search(r"Spark stage \d+: \d+/\d+ tasks done", line) for line in running), running
    assert all(a != b for a, b in zip(running, running[1:], strict=False)), "logged only when it changed"
    assert any(line.startswith("pipeline orders epoch 1: ingest attempt 1 rows: source orders: 60 read, 60 kept")
               for line in lines), lines


def test_quarantined_records_get_a_warning_with_their_count(
    spark: Any, orders: OrdersPipeline, caplog: pytest.LogCaptureFixture
) -> None:
    quarantine = orders.root / "out" / "quarantine"
    write_text(orders, "a.csv", "order_id,customer,amount\n1,c1,1.5\n2,c2,abc\n3,c0,3.0,x\n4,c1,4.0\n")
    with caplog.at_level(logging.INFO, logger="airflow_seatunnel_ckpt"):
        run_stage(text_spec(orders, "run-1", "csv", bad_records=f"file://{quarantine}"), spark,
                  progress_interval=0.2)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("source 'orders': 2 record(s) did not parse and were quarantined into sink "
               "'orders.bad_records'" in w and str(quarantine) in w for w in warnings), warnings
    summary = [r.getMessage() for r in caplog.records if " rows: source orders" in r.getMessage()]
    assert len(summary) == 1
    assert "source orders: 4 read, 2 kept, 2 quarantined; sink orders_table: 2 written" in summary[0]


def test_progress_shows_only_the_stages_jobs_not_other_jobs_of_a_shared_session(
    spark: Any, orders: OrdersPipeline, caplog: pytest.LogCaptureFixture
) -> None:
    orders.add_file("a", range(1, 41))
    spec = orders.spec("run-1", stage="tests.spark.stages:dedup_orders_slowly",
                       sinks={"orders_table": {"type": "file", "path": f"file://{orders.root / 'out' / 'orders'}"}})
    sc = spark.sparkContext

    def other_job() -> None:  # another user of the same session, in its own thread
        sc.setJobGroup("someone-else", "not the stage's")
        sc.parallelize(range(6), 6).map(lambda x: time.sleep(0.4) or x).collect()

    other = threading.Thread(target=other_job)
    with caplog.at_level(logging.INFO, logger="airflow_seatunnel_ckpt"):
        other.start()
        run_stage(spec, spark, progress_interval=0.1)
        other.join()
    tracker = sc.statusTracker()
    others = {s for j in tracker.getJobIdsForGroup("someone-else") for s in tracker.getJobInfo(j).stageIds}
    assert others
    running = [r.getMessage() for r in caplog.records if " running: Spark stage" in r.getMessage()]
    assert running
    shown = {int(m) for line in running for m in re.findall(r"Spark stage (\d+):", line)}
    assert shown and not shown & others, (shown, others)


@pytest.mark.slow
def test_a_driver_process_prints_the_progress_and_the_rows_to_its_output(
    orders: OrdersPipeline, tmp_path: Path
) -> None:
    """What spark-submit runs (the driver module): its output is the task log."""
    from tests.spark.test_stage_processes import SMALL_DRIVER, _python_path

    for i in range(6):
        orders.add_file(f"f{i}", range(i * 8 + 1, i * 8 + 11))
    spec = orders.spec("run-1", stage="tests.spark.stages:dedup_orders_slowly", master="local[2]",
                       spark_conf=SMALL_DRIVER,
                       sinks={"orders_table": {"type": "file", "path": f"file://{orders.root / 'out' / 'orders'}"}})
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(spec.to_json())
    done = subprocess.run(
        [sys.executable, "-m", "airflow_seatunnel_ckpt.spark.driver", "--spec-file", str(spec_file),
         "--progress-interval", "0.1"],
        env={**os.environ, "PYTHONPATH": _python_path()}, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "INFO airflow_seatunnel_ckpt.spark.progress: pipeline orders epoch 1: ingest attempt 1 running: " \
           "Spark stage" in done.stderr, done.stderr[-3000:]
    assert ("pipeline orders epoch 1: ingest attempt 1 rows: source orders: 60 read, 60 kept; "
            "sink orders_table: 50 written") in done.stderr
