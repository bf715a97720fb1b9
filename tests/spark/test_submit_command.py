"""The ``spark-submit`` command a stage is launched with (built by the Spark provider's hook)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from airflow_seatunnel_ckpt.hooks.spark_submit import SPEC_NAME, SubmitOptions, build_command
from airflow_seatunnel_ckpt.spark.spec import StageSpec

pytestmark = pytest.mark.airflow


def spec(**spark_conf: str) -> StageSpec:
    return StageSpec(pipeline="orders", participant="ingest", run_id="r1", attempt=1, stage="pkg.stages:dedup",
                     spark_conf=spark_conf)


def confs(command: list[str]) -> dict[str, str]:
    pairs = [command[i + 1] for i, arg in enumerate(command) if arg == "--conf"]
    return dict(pair.split("=", 1) for pair in pairs)


def test_a_local_master_listens_on_loopback_unless_the_user_says_otherwise(airflow_home: Path) -> None:
    command, env, _ = build_command(spec(), Path("/private") / SPEC_NAME, SubmitOptions(master="local[2]"))
    assert env["SPARK_LOCAL_IP"] == "127.0.0.1"
    assert {k: confs(command)[k] for k in ("spark.driver.bindAddress", "spark.driver.host")} == {
        "spark.driver.bindAddress": "127.0.0.1", "spark.driver.host": "127.0.0.1"}
    mine = spec(**{"spark.driver.host": "10.0.0.5"})
    command, _, _ = build_command(mine, Path("/private") / SPEC_NAME, SubmitOptions(master="local[2]"))
    assert confs(command)["spark.driver.host"] == "10.0.0.5"
    command, env, _ = build_command(spec(), Path("/p") / SPEC_NAME, SubmitOptions(master="spark://127.0.0.1:7077"))
    assert "spark.driver.host" not in confs(command) and "SPARK_LOCAL_IP" not in env


def test_the_spec_goes_with_files_and_the_driver_is_given_its_name_only(airflow_home: Path) -> None:
    command, _, _ = build_command(spec(), Path("/private/dir") / SPEC_NAME,
                                  SubmitOptions(master="local[1]", hook_kwargs={"files": "a.txt"}))
    assert command[command.index("--files") + 1] == f"a.txt,/private/dir/{SPEC_NAME}"
    assert command[-2:] == ["--spec-file", SPEC_NAME]


def test_python_and_archives_and_cluster_mode_assume_nothing_of_the_worker(
        airflow_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    options = SubmitOptions(master="local[1]", python="./environment/bin/python",
                            archives=("s3://envs/stage.tar.gz#environment",))
    command, env, _ = build_command(spec(**{"spark.archives": "extra.zip#x"}), Path("/p") / SPEC_NAME, options)
    conf = confs(command)
    assert conf["spark.pyspark.python"] == "./environment/bin/python"
    assert conf["spark.archives"] == "extra.zip#x,s3://envs/stage.tar.gz#environment"
    assert conf["spark.pyspark.driver.python"] == sys.executable  # a client-mode driver runs here
    assert "PYSPARK_PYTHON" not in env
    # Without python: this interpreter (local and client mode) ...
    command, env, _ = build_command(spec(), Path("/p") / SPEC_NAME, SubmitOptions(master="local[1]"))
    assert confs(command)["spark.pyspark.python"] == sys.executable
    # ... but in cluster mode nothing of the worker is assumed.
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_YARN", json.dumps(
        {"conn_type": "spark", "host": "yarn", "extra": {"deploy-mode": "cluster"}}))
    command, env, _ = build_command(spec(), Path("/p") / SPEC_NAME, SubmitOptions(conn_id="spark_yarn"))
    conf = confs(command)
    assert "spark.pyspark.python" not in conf and "spark.pyspark.driver.python" not in conf
    assert not [k for k in conf if k.endswith("PYSPARK_PYTHON")] and "PYSPARK_PYTHON" not in env
    assert command[command.index("--deploy-mode") + 1] == "cluster"


def test_standalone_cluster_mode_waits_for_the_application_unless_the_user_says_otherwise(
        airflow_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Without it spark-submit returns once the master accepted the driver, and its exit
    # record would read as "finished without preparing" while the driver still runs.
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_STANDALONE", json.dumps(
        {"conn_type": "spark", "host": "spark://127.0.0.1", "port": 7077, "extra": {"deploy-mode": "cluster"}}))
    command, _, _ = build_command(spec(), Path("/p") / SPEC_NAME, SubmitOptions(conn_id="spark_standalone"))
    assert confs(command)["spark.standalone.submit.waitAppCompletion"] == "true"
    mine = spec(**{"spark.standalone.submit.waitAppCompletion": "false"})
    command, _, _ = build_command(mine, Path("/p") / SPEC_NAME, SubmitOptions(conn_id="spark_standalone"))
    assert confs(command)["spark.standalone.submit.waitAppCompletion"] == "false"
    # Client mode, YARN and Kubernetes wait anyway: nothing is added there.
    command, _, _ = build_command(spec(), Path("/p") / SPEC_NAME, SubmitOptions(master="spark://127.0.0.1:7077"))
    assert "spark.standalone.submit.waitAppCompletion" not in confs(command)
