"""Mistakes in a stage's arguments are caught when the DAG is parsed, not when it runs.

And the two ways of running a stage that used to fail: a function as the stage, and
``airflow tasks test`` (try number 0).
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from airflow_seatunnel_ckpt.core import CheckpointConfig, CheckpointStore, EpochState
from airflow_seatunnel_ckpt.core.errors import ConfigError
from tests.conftest import FAST_JVM_OPTIONS
from tests.spark.stages import CONTEXT_FILE_ENV, record_airflow_context

pytestmark = pytest.mark.airflow

REPO = Path(__file__).resolve().parents[2]


def _stage_kwargs(tmp_path: Path, **changes: Any) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "task_id": "ingest", "pipeline": "orders", "stage": "tests.spark.stages:dedup_orders",
        "sources": {"orders": {"type": "file", "path": f"file://{tmp_path}/in", "format": "parquet"}},
        "sinks": {"orders_table": {"type": "file", "path": f"file://{tmp_path}/out", "format": "parquet"}},
        "storage_url": f"file://{tmp_path}/store",
    }
    kwargs.update(changes)
    return kwargs


def _build(**kwargs: Any) -> Any:
    from airflow.sdk import DAG

    from airflow_seatunnel_ckpt.operators.stage import SparkStageOperator

    with DAG("parse_checks", schedule=None, start_date=datetime(2026, 1, 1, tzinfo=UTC)):
        return SparkStageOperator(**kwargs)


def _nested_stage() -> Any:
    def stage(ctx: Any, spark: Any) -> None:
        return None

    return stage


#: mistake -> the change to the stage's arguments, and what the message must say (in the wording of
#: a type's options model, or of the signature check of a type without one).
MISTAKES = {
    "unknown source option": (
        {"sources": {"orders": {"type": "file", "path": "file:///in", "fromat": "json"}}},
        [r"DAG 'parse_checks', task 'ingest'", r"source 'orders'", r"unknown option(\(s\) \[| )'fromat'",
         r"did you mean 'format'"]),
    "unknown sink option": (
        {"sinks": {"orders_table": {"path": "file:///out", "partitionBy": ["d"]}}},
        [r"sink 'orders_table'", r"unknown option(\(s\) \[| )'partitionBy'", r"'partition_by'"]),
    "missing sink path": (
        {"sinks": {"orders_table": {"format": "parquet"}}},
        [r"sink 'orders_table'", r"missing required option(\(s\) \[| )'path'"]),
    "unknown source type": (
        {"sources": {"orders": {"type": "rabbitmq", "queue": "orders"}}},
        [r"source 'orders': unknown type 'rabbitmq'", r"known types: \[.*'file'", r"register_source\('rabbitmq'"]),
    "unknown sink format": (
        {"sinks": {"orders_table": {"path": "file:///out", "format": "xlsx"}}},
        [r"sink 'orders_table'", r"format.*(must be one of|input should be)", r"'xlsx'"]),
    "sink on a protocol no backend publishes to": (
        {"sinks": {"orders_table": {"path": "hdfs://nn/out"}}},
        [r"task 'ingest'", r"store protocol 'hdfs' is not supported", r"entry-point group"]),
    "store URL with an unknown scheme": (
        {"storage_url": "ftp://host/ckpt"},
        [r"task 'ingest'", r"store protocol 'ftp' is not supported", r"supported protocols: file"]),
    "unknown store_config key": (
        {"store_config": {"lease_timeout": 30}},
        [r"task 'ingest'", r"unknown checkpoint config keys \['lease_timeout'\]", r"lease_timeout_s"]),
    "bad store_config value": (
        {"store_config": {"max_retain": "ten"}},
        [r"task 'ingest'", r"max_retain must be an integer >= 1, got 'ten'"]),
    "stage without module:function shape": (
        {"stage": "tests.spark.stages.dedup_orders"},
        [r"stage 'tests.spark.stages.dedup_orders' is not an import path of the form 'package.module:function'",
         r"or the function itself"]),
    "lambda through spark-submit": (
        {"stage": lambda ctx, spark: None, "conn_id": "spark_default"},
        [r"stage function '<lambda>' is a lambda", r"spark-submit", r"top level of a module"]),
    "nested function through spark-submit": (
        {"stage": _nested_stage(), "conn_id": "spark_default"},
        [r"is defined inside another function", r"top level of a module"]),
    "stage function the module does not define": (
        {"stage": "tests.spark.stages:dedup_ordres"},
        [r"task 'ingest'", r"stage 'tests.spark.stages:dedup_ordres': module 'tests.spark.stages' \(.*stages.py\) "
         r"defines no 'dedup_ordres'; did you mean 'dedup_orders'\?", r"Its functions: \[.*'dedup_orders'"]),
    "source schema that does not parse": (
        {"sources": {"orders": {"path": "file:///in", "format": "json", "schema": "order_id long, amount dubble"}}},
        [r"task 'ingest'", r"source 'orders': schema 'order_id long, amount dubble' does not parse",
         r"unknown type 'dubble' \(did you mean 'double'\?\)"]),
    "source schema with an unclosed type": (
        {"sources": {"orders": {"path": "file:///in", "format": "json", "schema": "tags array<string, n int"}}},
        [r"source 'orders': schema .* does not parse", r"expected '>', found ','"]),
    "source that is not a mapping": (
        {"sources": {"orders": "file:///in"}},
        [r"source 'orders' must be a mapping of options"]),
}


@pytest.mark.parametrize("mistake", sorted(MISTAKES))
def test_a_mistake_in_the_stage_arguments_fails_the_dag_at_parse_time(mistake: str, tmp_path: Path) -> None:
    changes, expected = MISTAKES[mistake]
    with pytest.raises(ConfigError) as raised:
        _build(**_stage_kwargs(tmp_path, **changes))


    for pattern in expected:
        assert re.search(pattern, str(raised.value)), f"{pattern!r} not in {raised.value}"
    assert not (tmp_path / "store").exists()  # nothing was opened, let alone written


def test_templated_values_are_left_for_run_time_and_functions_are_accepted(tmp_path: Path) -> None:
    task = _build(**_stage_kwargs(
        tmp_path, stage=record_airflow_context,
        sources={"orders": {"path": f"file://{tmp_path}/in/{{{{ ds }}}}", "format": "{{ params.fmt }}"}},
        storage_url="{{ var.value.store }}"))
    assert task.stage == "tests.spark.stages:record_airflow_context"
    assert task.stage_callable is record_airflow_context
    # A top-level function is fine for spark-submit too: the driver imports it by path.
    remote = _build(**_stage_kwargs(tmp_path, stage=record_airflow_context, conn_id="spark_default"))
    assert remote.stage == "tests.spark.stages:record_airflow_context"


BAD_DAG = """
from datetime import datetime, timezone
from airflow.sdk import DAG
from airflow_seatunnel_ckpt.task_group import checkpointed_epoch

with DAG("bad_spec", schedule=None, start_date=datetime(2026, 1, 1, tzinfo=timezone.utc)) as dag:
    checkpointed_epoch("orders", pipeline="orders", storage_url="file://{root}/store", stages={{
        "ingest": {{
            "stage": "tests.spark.stages:dedup_orders",
            "sources": {{"orders": {{"path": "file://{root}/in", "format": "json"}}}},
            "sinks": {{"orders_table": {{"path": "file://{root}/out", "formt": "parquet"}}}},
        }},
    }})
"""

PARSE = """
import json, sys
from airflow.dag_processing.dagbag import DagBag
bag = DagBag(dag_folder=sys.argv[1])
print(json.dumps({"errors": {k: str(v) for k, v in bag.import_errors.items()}, "dags": sorted(bag.dag_ids),
                  "pyspark": "pyspark" in sys.modules}))
"""


def test_a_bad_spec_is_an_import_error_of_the_dag_file_and_parsing_does_not_import_pyspark(
    airflow_home: Path, tmp_path: Path
) -> None:
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "bad_spec.py").write_text(BAD_DAG.format(root=tmp_path))
    (dags / "good_spec.py").write_text(BAD_DAG.format(root=tmp_path).replace('"formt"', '"format"')
                                       .replace('"bad_spec"', '"good_spec"'))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", PARSE, str(dags)], env=env, capture_output=True, text=True,
                          timeout=240, check=True)
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["dags"] == ["good_spec"]
    assert list(found["errors"]) == [str(dags / "bad_spec.py")]
    error = found["errors"][str(dags / "bad_spec.py")]
    assert "task 'orders.ingest'" in error and "sink 'orders_table'" in error
    assert "unknown option 'formt' (did you mean 'format'?)" in error
    assert found["pyspark"] is False
    assert not (tmp_path / "store").exists()


def _epoch_dag(tmp_path: Path, dag_id: str, **stage: Any) -> Any:
    from airflow.sdk import DAG

    from airflow_seatunnel_ckpt.task_group import checkpointed_epoch

    with DAG(dag_id, schedule="@hourly", start_date=datetime(2026, 1, 1, tzinfo=UTC), catchup=False,
             params={"region": "eu", "fmt": "parquet"}) as dag:
        checkpointed_epoch("orders", pipeline="orders", storage_url=f"file://{tmp_path}/store", stages={
            "ingest": {
                "stage": "tests.spark.stages:dedup_orders",
                "sources": {"orders": {"path": f"file://{tmp_path}/in", "format": "parquet"}},
                "sinks": {"orders_table": {"path": f"file://{tmp_path}/out", "format": "parquet"}},
                "spark_conf": {"spark.sql.shuffle.partitions": "2"},
                **stage,
            },
        })
    return dag


def _pipeline(tmp_path: Path) -> Any:
    return CheckpointStore(CheckpointConfig(storage_url=f"file://{tmp_path}/store")).pipeline("orders")


def test_a_bad_rendered_value_fails_the_stage_before_anything_begins(
    run_dag: Any, tmp_path: Path
) -> None:
    dag = _epoch_dag(tmp_path, "rendered_checks", sinks={
        "orders_table": {"path": f"file://{tmp_path}/out", "format": "{{ params.fmt }}"}})
    run = run_dag(dag, logical_date=datetime(2026, 1, 1, 5, tzinfo=UTC), run_conf={"fmt": "xlsx"})
    states = {ti.task_id: ti.state for ti in run.get_task_instances()}
    assert states["orders.ingest"] == "failed"
    assert _pipeline(tmp_path).epoch_for_run(run.run_id) is None  # refused before begin


@pytest.mark.spark
@pytest.mark.slow
def test_a_function_as_the_stage_runs_in_process_and_sees_the_airflow_run(
    run_dag: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.spark.conftest import OrdersPipeline

    OrdersPipeline(tmp_path).add_file("a", [1, 2, 2, 3])
    monkeypatch.setenv(CONTEXT_FILE_ENV, str(tmp_path / "ctx.json"))
    dag = _epoch_dag(tmp_path, "callable_stage", stage=record_airflow_context)
    when = datetime(2026, 1, 1, 5, tzinfo=UTC)
    run = run_dag(dag, logical_date=when, run_after=when, run_conf={"region": "us"})
    assert {ti.task_id: ti.state for ti in run.get_task_instances()}["orders.commit"] == "success"
    seen = json.loads((tmp_path / "ctx.json").read_text())
    assert seen["dag_id"] == "callable_stage" and seen["task_id"] == "orders.ingest"
    assert seen["run_id"] == run.run_id
    assert datetime.fromisoformat(seen["logical_date"]) == when
    assert datetime.fromisoformat(seen["data_interval_end"]) == when
    assert seen["params"] == {"region": "us", "fmt": "parquet"}
    assert seen["params_writable"] is False
    assert not {"epoch", "attempt", "try_number"} & set(seen["airflow_fields"])
    assert _pipeline(tmp_path).state(1) is EpochState.COMMITTED


TASKS_TEST_DAG = """
from datetime import datetime, timezone
from airflow.sdk import DAG
from airflow_seatunnel_ckpt.task_group import checkpointed_epoch

with DAG("tasks_test_stage", schedule="@hourly", start_date=datetime(2026, 1, 1, tzinfo=timezone.utc),
         catchup=False, params={{"region": "eu"}}) as dag:
    checkpointed_epoch("orders", pipeline="orders", storage_url="file://{root}/store", stages={{
        "ingest": {{
            "stage": "tests.spark.stages:record_airflow_context",
            "sources": {{"orders": {{"path": "file://{root}/in", "format": "parquet"}}}},
            "sinks": {{"orders_table": {{"path": "file://{root}/out", "format": "parquet"}}}},
            "spark_conf": {{"spark.sql.shuffle.partitions": "2", "spark.ui.enabled": "false",
                           "spark.driver.extraJavaOptions": "{jvm_options}"}},
        }},
    }})
"""


@pytest.mark.spark
@pytest.mark.slow
def test_airflow_tasks_test_runs_the_stage_and_leaves_nothing_published_or_pending(
    airflow_home: Path, tmp_path: Path
) -> None:
    from tests.spark.conftest import OrdersPipeline

    OrdersPipeline(tmp_path).add_file("a", [1, 2, 3])
    home, dags = tmp_path / "home", tmp_path / "dags"
    dags.mkdir(parents=True)
    home.mkdir()
    # A copy of the session's migrated database (through SQLite's backup API: it is in WAL
    # mode), so the command needs no `airflow db migrate` and writes nothing shared.
    with sqlite3.connect(airflow_home / "airflow.db") as source, sqlite3.connect(home / "airflow.db") as copy:
        source.backup(copy)
    (dags / "tasks_test_stage.py").write_text(TASKS_TEST_DAG.format(root=tmp_path, jvm_options=FAST_JVM_OPTIONS))
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(home / "logs"),
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        CONTEXT_FILE_ENV: str(tmp_path / "ctx.json"),
    }
    # The command parses the DAGs folder and writes what it parsed to the database itself.
    done = subprocess.run([sys.executable, "-m", "airflow", "tasks", "test", "tasks_test_stage", "orders.ingest",
                           "2026-01-01T05:00:00+00:00"], env=env, capture_output=True, text=True, timeout=600)
    output = done.stdout + done.stderr
    assert "attempt must be an integer" not in output
    assert done.returncode == 0, output[-4000:]

    seen = json.loads((tmp_path / "ctx.json").read_text())
    assert datetime.fromisoformat(seen["logical_date"]) == datetime(2026, 1, 1, 5, tzinfo=UTC)
    assert seen["params"] == {"region": "eu"} and seen["task_id"] == "orders.ingest"
    pipeline = _pipeline(tmp_path)
    # The stage prepared epoch 1 and, being a dry run, aborted it: nothing is published ...
    assert pipeline.state(1) is EpochState.ABORTED
    # ... nothing is recorded as what the pipeline is (a typo tried out stays out of its descriptor) ...
    assert not pipeline.storage.exists("_descriptor") or pipeline.storage.list_dir("_descriptor") == []
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
    # ... and nothing is left for a real run to wait for: it begins at once and reads the same input.
    assert pipeline.begin("scheduled__2026-01-01T05:00:00+00:00").epoch == 2


def test_a_stage_module_that_fails_while_imported_keeps_its_own_error_and_a_missing_function_is_named(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_seatunnel_ckpt.spark.runner import load_stage_function

    # The module's own bug (an AttributeError while it is imported) must reach the user as it
    # is, with its traceback, not as "module has no attribute 'ingest'".
    (tmp_path / "buggy_stages.py").write_text("import os\n\nROOT = os.no_such_function()\n\n\n"
                                              "def ingest(ctx, spark):\n    pass\n")
    (tmp_path / "good_stages.py").write_text("def ingest(ctx, spark):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    with pytest.raises(AttributeError, match="no_such_function"):
        load_stage_function("buggy_stages:ingest")
    assert load_stage_function("good_stages:ingest").__name__ == "ingest"
    with pytest.raises(ConfigError, match=r"module 'good_stages' has no attribute 'ingets'"):
        load_stage_function("good_stages:ingets")


def test_a_stage_path_is_checked_against_its_modules_source_without_importing_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_seatunnel_ckpt.spark.declaration import stage_import_path

    # Importing this module would fail (and, in real life, start PySpark): it is only read.
    (tmp_path / "parse_time_stages.py").write_text(
        "import module_that_is_not_installed\n\n\ndef ingest(ctx, spark):\n    pass\n\n\n"
        "class Stages:\n    def ingest(self, ctx, spark):\n        pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    assert stage_import_path("parse_time_stages:ingest", where="t", importable=True) == "parse_time_stages:ingest"
    assert stage_import_path("parse_time_stages:Stages.ingest", where="t", importable=True)
    with pytest.raises(ConfigError, match=r"defines no 'ingets'; did you mean 'ingest'\? Its functions: \['ingest'\]"):
        stage_import_path("parse_time_stages:ingets", where="t", importable=True)
    assert "parse_time_stages" not in sys.modules
    # A module this process cannot see (shipped to the Spark driver only) is left to run time.
    assert stage_import_path("shipped_with_py_files:ingest", where="t", importable=True)
