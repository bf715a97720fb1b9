"""The ``spark-submit`` command a stage is launched with (built from the Spark connection as the provider does)."""

from __future__ import annotations

import base64
import json
import stat
import sys
from pathlib import Path

import pytest

from airflow_seatunnel_ckpt.hooks.spark_submit import (
    DRIVER_SCRIPT,
    KEYTAB_NAME,
    SPEC_NAME,
    SubmitError,
    SubmitOptions,
    build_command,
)
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


def option(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_every_field_of_a_spark_connection_reaches_the_command(
        airflow_home: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_YARN", json.dumps({"conn_type": "spark", "host": "yarn", "extra": {
        "deploy-mode": "cluster", "queue": "etl", "spark-binary": "spark3-submit", "principal": "etl@EXAMPLE.COM",
        "keytab": base64.b64encode(b"keytab bytes").decode()}}))
    spec_file = tmp_path / SPEC_NAME
    command, env, connection = build_command(spec(), spec_file, SubmitOptions(
        conn_id="spark_yarn", hook_kwargs={"executor_memory": "2g", "num_executors": 3, "proxy_user": "etl",
                                           "conf": {"spark.sql.shuffle.partitions": "8"},
                                           "env_vars": {"REGION": "eu"}}))
    assert command[0] == "spark3-submit" and command[-3:] == [DRIVER_SCRIPT, "--spec-file", SPEC_NAME]
    assert [option(command, o) for o in ("--master", "--deploy-mode", "--queue", "--principal", "--name")] == [
        "yarn", "cluster", "etl", "etl@EXAMPLE.COM", "orders-ingest"]
    assert [option(command, o) for o in ("--executor-memory", "--num-executors", "--proxy-user")] == ["2g", "3", "etl"]
    # The connection's keytab (base64 in its extra) is written beside the spec, for this user only.
    keytab = Path(option(command, "--keytab"))
    assert keytab == tmp_path / KEYTAB_NAME and keytab.read_bytes() == b"keytab bytes"
    assert stat.S_IMODE(keytab.stat().st_mode) == 0o600
    conf = confs(command)
    assert conf["spark.sql.shuffle.partitions"] == "8" and conf["spark.yarn.appMasterEnv.REGION"] == "eu"
    assert env["REGION"] == "eu" and connection.target == "yarn (cluster mode)"
    # The hook's arguments override the connection's, as they do for the provider's hook.
    command, _, _ = build_command(spec(), tmp_path / "other" / SPEC_NAME, SubmitOptions(
        conn_id="spark_yarn", hook_kwargs={"deploy_mode": "client", "yarn_queue": "adhoc", "keytab": "/etc/etl.kt",
                                           "principal": "me@EXAMPLE.COM"}))
    assert [option(command, o) for o in ("--deploy-mode", "--queue", "--keytab", "--principal")] == [
        "client", "adhoc", "/etc/etl.kt", "me@EXAMPLE.COM"]
    # A Kubernetes connection's namespace becomes spark.kubernetes.namespace; the spec's own wins.
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_K8S", json.dumps({
        "conn_type": "spark", "host": "k8s://https://10.0.0.1", "port": 6443,
        "extra": {"deploy-mode": "cluster", "namespace": "stages"}}))
    command, _, _ = build_command(spec(), tmp_path / SPEC_NAME, SubmitOptions(conn_id="spark_k8s"))
    assert option(command, "--master") == "k8s://https://10.0.0.1:6443"
    assert confs(command)["spark.kubernetes.namespace"] == "stages"
    mine = spec(**{"spark.kubernetes.namespace": "mine"})
    command, _, _ = build_command(mine, tmp_path / SPEC_NAME, SubmitOptions(conn_id="spark_k8s"))
    assert confs(command)["spark.kubernetes.namespace"] == "mine"


def test_a_connection_from_a_uri_and_an_undefined_one_name_their_master(
        airflow_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_URI", "spark://10.0.0.7:7077")
    command, _, _ = build_command(spec(), Path("/p") / SPEC_NAME, SubmitOptions(conn_id="spark_uri"))
    assert option(command, "--master") == "spark://10.0.0.7:7077" and "--deploy-mode" not in command
    command, _, connection = build_command(spec(), Path("/p") / SPEC_NAME, SubmitOptions(conn_id="not_defined"))
    assert option(command, "--master") == "yarn" and connection.target == "yarn (client mode)"


def test_arguments_a_detached_stage_cannot_honour_are_refused_by_name(
        airflow_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(SubmitError, match="'java_class'.*do not apply"):
        build_command(spec(), Path("/p") / SPEC_NAME, SubmitOptions(master="local[1]",
                                                                    hook_kwargs={"java_class": "a.Main"}))
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_BAD", json.dumps({"conn_type": "spark", "host": "yarn",
                                                             "extra": {"spark-binary": "/bin/sh"}}))
    with pytest.raises(SubmitError, match="'/bin/sh' is not one of spark-submit"):
        build_command(spec(), Path("/p") / SPEC_NAME, SubmitOptions(conn_id="spark_bad"))
