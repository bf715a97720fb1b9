"""An embedded (local-mode) stage session listens on loopback only and keeps the task's standard
error (logged by Airflow at ERROR level) free of Spark's start-up lines; the package's tasks
leave what a Python worker has loaded out of the collector PySpark runs after every task."""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import FAST_JVM_OPTIONS

pytestmark = [pytest.mark.spark]

REPO = Path(__file__).resolve().parents[2]

_PROBE = textwrap.dedent("""
    import json, sys, psutil
    from airflow_seatunnel_ckpt.spark.session import stage_session
    from airflow_seatunnel_ckpt.spark.spec import StageSpec

    # Only JVM flags in spark_conf (a short JVM's start-up): no address, no log configuration.
    spark = stage_session(StageSpec(pipeline="orders", participant="ingest", run_id="run-1", attempt=1, stage="m:f",
                                    master="local[1]",
                                    spark_conf={"spark.driver.extraJavaOptions": sys.argv[1]}))
    spark.range(3).count()
    jvm = psutil.Process().children(recursive=True)
    listening = sorted({c.laddr.ip for p in jvm for c in p.net_connections(kind="tcp")
                        if c.status == psutil.CONN_LISTEN})
    print(json.dumps({"ui": spark.sparkContext.uiWebUrl, "listening": listening}))
    spark.stop()
""")


def _loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip)
    mapped = getattr(address, "ipv4_mapped", None)  # ::ffff:127.0.0.1 is IPv4 loopback
    return (mapped or address).is_loopback


def test_an_embedded_stage_session_listens_on_loopback_only_and_logs_nothing_to_stderr(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "SPARK_LOCAL_IP"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, "-c", _PROBE, FAST_JVM_OPTIONS], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["listening"], seen  # the driver listens somewhere (RPC, block manager, UI)
    assert all(_loopback(ip) for ip in seen["listening"]), seen
    assert seen["ui"].startswith("http://127.0.0.1:"), seen
    # Spark's default profile wrote INFO/WARN start-up lines to standard error.
    noise = [line for line in done.stderr.splitlines()
             if any(word in line for word in ("log4j", "NativeCodeLoader", " INFO ", " WARN ", "log level"))]
    assert noise == [], noise


def _heap_probe(batches: Any) -> Any:
    """A task: how many objects its worker has frozen after ``freeze_worker_heap``, called
    twice, then once more after a module was added."""
    import gc
    import sys
    import types
    import uuid

    import pyarrow as pa

    from airflow_seatunnel_ckpt.spark.session import freeze_worker_heap

    for _ in batches:
        pass
    freeze_worker_heap()
    first = gc.get_freeze_count()
    freeze_worker_heap()  # no module imported since: nothing more is frozen
    again = gc.get_freeze_count()
    name = f"_heap_probe_{uuid.uuid4().hex}"
    sys.modules[name] = types.ModuleType(name)  # as an import does
    freeze_worker_heap()
    yield pa.RecordBatch.from_pydict({"first": [first], "again": [again], "imported": [gc.get_freeze_count()]})


def test_a_python_worker_freezes_its_loaded_heap_once_per_import_and_a_driver_never(spark: Any) -> None:
    import gc

    from airflow_seatunnel_ckpt.spark.session import freeze_worker_heap

    rows = spark.range(0, 4, numPartitions=4).mapInArrow(_heap_probe, "first long, again long, imported long")
    rows = rows.collect()
    assert len(rows) == 4
    assert all(0 < r.first == r.again < r.imported for r in rows), rows

    driver = gc.get_freeze_count()
    freeze_worker_heap()  # outside a Spark task: this process's heap is left alone
    assert gc.get_freeze_count() == driver
