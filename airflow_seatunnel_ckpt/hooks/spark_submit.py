"""Run a stage on any Spark master with ``spark-submit``, detached from the task that launched it.

The command is built from the Spark connection as the Apache Spark provider's
``SparkSubmitHook`` builds it, and run by the detached launcher
(:mod:`airflow_seatunnel_ckpt.spark.launch`); a deferrable Spark Connect stage is launched
the same way with :func:`connect_command`. How the spec, the stage module, the Python and
the sources' passwords reach the driver: docs/OPERATIONS.md.
"""

from __future__ import annotations

import base64
import binascii
import importlib.util
import logging
import os
import shutil
import socket
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_seatunnel_ckpt.core.errors import CheckpointError
from airflow_seatunnel_ckpt.core.protocol.lease import (
    SubmissionCheck,
    SubmissionOutcome,
    SubmissionRecord,
    judge_submission,
    record_submission,
)
from airflow_seatunnel_ckpt.spark.session import LOOPBACK
from airflow_seatunnel_ckpt.spark.spec import StageResult, StageSpec

if TYPE_CHECKING:
    from airflow_seatunnel_ckpt.core import Pipeline

_log = logging.getLogger(__name__)

DRIVER_SCRIPT = str(Path(__file__).parent.parent / "spark" / "driver.py")


class SubmitError(CheckpointError):
    """``spark-submit`` failed or the driver reported no result."""


def spark_submit_binary_dir() -> str | None:
    """Directory of a ``spark-submit`` launcher: on PATH, else the one pyspark bundles."""
    found = shutil.which("spark-submit")
    if found:
        return os.path.dirname(found)
    try:
        from pyspark.find_spark_home import _find_spark_home

        candidate = Path(_find_spark_home()) / "bin"
    except Exception:
        return None
    return str(candidate) if (candidate / "spark-submit").exists() else None


def stage_module_files(stage: str) -> list[str]:
    """Files of the stage's module that ``spark-submit`` must ship for the driver to import it.

    Airflow puts the DAGs folder on ``sys.path`` of its tasks, not of the driver, so a
    single-file top-level module is shipped with ``--py-files``; a package is left to the
    environment.
    """
    module_name = stage.partition(":")[0]
    if not module_name or "." in module_name:
        return []
    try:
        spec = importlib.util.find_spec(module_name)
    except (ImportError, ValueError):
        return []  # not importable here either: the driver reports the stage it cannot load
    if spec is None or spec.submodule_search_locations is not None or not spec.origin:
        return []
    origin = spec.origin
    return [origin] if origin.endswith(".py") and os.path.isfile(origin) else []


def _comma_list(given: Any, *more: str) -> str:
    """``given`` (a comma-separated list, as ``spark-submit`` takes files) with ``more`` added once."""
    listed = [f for f in str(given or "").split(",") if f]
    return ",".join([*listed, *(f for f in more if f not in listed)])


#: ``SparkSubmitHook``'s arguments that a stage's submission takes (``hook_kwargs``), by
#: the provider's names: the ``spark-submit`` option each becomes. The hook's others
#: (``java_class``, ``application_args``, status polling, post-submit commands...) concern
#: the attached run of its own ``submit()``, which a detached stage does not use.
_VALUE_OPTIONS = {
    "files": "--files", "py_files": "--py-files", "archives": "--archives",
    "driver_class_path": "--driver-class-path", "jars": "--jars", "packages": "--packages",
    "exclude_packages": "--exclude-packages", "repositories": "--repositories",
    "num_executors": "--num-executors", "total_executor_cores": "--total-executor-cores",
    "executor_cores": "--executor-cores", "executor_memory": "--executor-memory",
    "driver_memory": "--driver-memory", "proxy_user": "--proxy-user", "properties_file": "--properties-file",
}
_OTHER_ARGUMENTS = frozenset({"conf", "keytab", "principal", "yarn_queue", "deploy_mode", "spark_binary",
                              "use_krb5ccache", "verbose", "name"})
ALLOWED_SPARK_BINARIES = ("spark-submit", "spark2-submit", "spark3-submit")
KEYTAB_NAME = "seatunnel-ckpt.keytab"


@dataclass(frozen=True)
class SparkConnection:
    """Where and how ``spark-submit`` submits, read from an Airflow ``spark`` connection as the
    Apache Spark provider reads one; the hook's arguments override the connection's, as there."""

    master: str
    deploy_mode: str | None = None
    queue: str | None = None
    spark_binary: str = "spark-submit"
    namespace: str | None = None
    principal: str | None = None
    keytab_base64: str | None = None  # the connection's extra (written to a file per submission)
    keytab_path: str | None = None  # the hook's ``keytab`` argument

    @classmethod
    def resolve(cls, conn_id: str, kwargs: Mapping[str, Any], *, master: str | None = None) -> SparkConnection:
        """The connection ``conn_id`` (undefined: the provider's default, master ``yarn``) with
        ``kwargs``' overrides; ``master`` overrides its master."""
        from airflow.providers.common.compat.sdk import AirflowNotFoundException
        from airflow.sdk import BaseHook

        found: dict[str, Any] = {"master": "yarn"}
        try:
            conn = BaseHook.get_connection(conn_id)
        except AirflowNotFoundException:
            _log.info("Spark connection %r is not defined: master %s", conn_id, master or found["master"])
            extra: dict[str, Any] = {}
        else:
            extra = dict(conn.extra_dejson)
            if conn.conn_type == "spark" and conn.host and ("://" in conn.host or not conn.port):
                found["master"] = conn.host  # the form's host holds the whole master URL
            else:  # a connection from a URI: its scheme is the conn_type
                found["master"] = f"{conn.conn_type}://{conn.host or ''}"
            if conn.port:
                found["master"] = f"{found['master']}:{conn.port}"
            if extra.get("spark-home"):
                raise SubmitError(f"Spark connection {conn_id!r}: the spark-home extra is not supported (as in the "
                                  f"Apache Spark provider); put one of {', '.join(ALLOWED_SPARK_BINARIES)} on "
                                  "PATH and name it in spark-binary")
        binary = str(kwargs.get("spark_binary") or extra.get("spark-binary") or "spark-submit")
        if binary not in ALLOWED_SPARK_BINARIES:
            raise SubmitError(f"Spark connection {conn_id!r}: spark binary {binary!r} is not one of "
                              f"{', '.join(ALLOWED_SPARK_BINARIES)}; set spark-binary in the connection's extra "
                              "(or spark_binary) to one of them")
        return cls(master=master or found["master"],
                   deploy_mode=kwargs.get("deploy_mode") or extra.get("deploy-mode"),
                   queue=kwargs.get("yarn_queue") or extra.get("queue"),
                   spark_binary=binary,
                   namespace=(kwargs.get("conf") or {}).get("spark.kubernetes.namespace") or extra.get("namespace"),
                   principal=kwargs.get("principal") or extra.get("principal"),
                   keytab_base64=None if kwargs.get("keytab") else extra.get("keytab"),
                   keytab_path=kwargs.get("keytab"))

    @property
    def target(self) -> str:
        """The master and deploy mode, for the submission record and messages."""
        return f"{self.master} ({self.deploy_mode or 'client'} mode)"


def keytab_file(connection: SparkConnection, directory: Path) -> str | None:
    """The keytab path for ``--keytab``: the hook's, or the connection's written into ``directory``."""
    if connection.keytab_path or not connection.keytab_base64:
        return connection.keytab_path
    try:
        content = base64.b64decode(connection.keytab_base64, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise SubmitError(f"the keytab of the Spark connection (principal {connection.principal!r}) is not base64 "
                          f"({exc}); store the output of `base64 <keytab file>` in its keytab field") from exc
    path = directory / KEYTAB_NAME
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # readable by this user only
    with os.fdopen(fd, "wb") as out:
        out.write(content)
    return str(path)


def submit_arguments(connection: SparkConnection, kwargs: Mapping[str, Any], conf: Mapping[str, str],
                     env: Mapping[str, str], keytab: str | None) -> list[str]:
    """The ``spark-submit`` options before the application: what the provider's hook would pass.

    ``env`` reaches a YARN or Kubernetes driver as configuration, as with the hook; in
    standalone cluster mode nothing carries it, so it is refused rather than dropped.
    """
    unknown = sorted(set(kwargs) - set(_VALUE_OPTIONS) - _OTHER_ARGUMENTS)
    if unknown:
        raise SubmitError(f"spark_submit_kwargs {', '.join(map(repr, unknown))} do not apply to a stage's detached "
                          f"spark-submit; it takes {', '.join(sorted([*_VALUE_OPTIONS, *_OTHER_ARGUMENTS]))}")
    args = ["--master", connection.master]
    conf = dict(conf)
    yarn, kubernetes = "yarn" in connection.master, "k8s" in connection.master
    if env and (yarn or kubernetes):
        template = "spark.yarn.appMasterEnv.{}" if yarn else "spark.kubernetes.driverEnv.{}"
        conf.update({template.format(key): str(value) for key, value in env.items()})
    elif env and connection.deploy_mode == "cluster":
        raise SubmitError(f"env_vars ({', '.join(sorted(env))}) cannot reach a driver in standalone cluster mode "
                          f"({connection.target}); set them with spark_conf (spark.driverEnv.*) instead")
    if kubernetes and connection.namespace:
        conf.setdefault("spark.kubernetes.namespace", connection.namespace)
    if kwargs.get("use_krb5ccache"):
        if not os.environ.get("KRB5CCNAME"):
            raise SubmitError("use_krb5ccache is set but KRB5CCNAME is not: name the Kerberos ticket cache in the "
                              "worker's environment")
        conf["spark.kerberos.renewal.credentials"] = "ccache"
    for key, value in conf.items():
        args += ["--conf", f"{key}={value}"]
    for argument, option in _VALUE_OPTIONS.items():
        if kwargs.get(argument):
            args += [option, str(kwargs[argument])]
    principal = connection.principal
    if kwargs.get("use_krb5ccache"):
        from airflow.security import kerberos

        principal = kerberos.get_kerberos_principal(principal)
    if keytab:
        args += ["--keytab", keytab]
    if principal:
        args += ["--principal", principal]
    if kwargs.get("name"):
        args += ["--name", str(kwargs["name"])]
    if kwargs.get("verbose"):
        args.append("--verbose")
    if connection.queue:
        args += ["--queue", connection.queue]
    if connection.deploy_mode:
        args += ["--deploy-mode", connection.deploy_mode]
    return args


def masked(command: Sequence[str]) -> str:
    """``command`` for a log line, with the values of keys that name a secret or password hidden."""
    shown = []
    for arg in command:
        key, sep, _ = arg.partition("=")
        shown.append(f"{key}=******" if sep and any(word in key.lower() for word in ("secret", "password")) else arg)
    return " ".join(shown)


SPEC_NAME = "seatunnel-ckpt-spec.json"


@dataclass(frozen=True)
class SubmitOptions:
    """How to submit: the Spark connection or master, and what the application needs."""

    conn_id: str | None = None
    master: str | None = None
    spark_binary: str = "spark-submit"
    hook_kwargs: Mapping[str, Any] = field(default_factory=dict)
    env_vars: Mapping[str, str] = field(default_factory=dict)
    python: str | None = None  # of the executors (and of a cluster-mode driver): ``spark.pyspark.python``
    archives: Sequence[str] = ()  # ``spark.archives``, e.g. ``"hdfs:///envs/stage.tar.gz#environment"``


def spark_conf_for(spec: StageSpec, options: SubmitOptions, deploy_mode: str | None) -> dict[str, str]:
    """The ``--conf`` of the application: the spec's, plus the Python and archives it names.

    The user's own ``spark.pyspark.*`` / ``spark.archives`` keys are never overridden; in
    cluster mode nothing of this host (its interpreter) is assumed to exist.
    """
    conf = {str(k): str(v) for k, v in spec.spark_conf.items()}
    if options.archives:
        conf["spark.archives"] = _comma_list(conf.get("spark.archives"), *options.archives)
    cluster = deploy_mode == "cluster"
    if options.python:
        conf.setdefault("spark.pyspark.python", options.python)
    elif not cluster:
        conf.setdefault("spark.pyspark.python", sys.executable)
    if not cluster:
        conf.setdefault("spark.pyspark.driver.python", sys.executable)
    return conf


def build_command(spec: StageSpec, spec_file: Path, options: SubmitOptions
                  ) -> tuple[list[str], dict[str, str], SparkConnection]:
    """The ``spark-submit`` command line, its environment, and the connection it submits with.

    Built as the provider's ``SparkSubmitHook`` builds it, through public APIs only: the
    hook runs the command itself and attached, while a stage's runs detached.
    """
    hook_kwargs = dict(options.hook_kwargs)
    if module_files := stage_module_files(spec.stage):
        hook_kwargs["py_files"] = _comma_list(hook_kwargs.get("py_files"), *module_files)
    given_env = {str(k): str(v) for k, v in (hook_kwargs.pop("env_vars", None) or {}).items()}
    # The sources' password files travel as the spec does, to a driver on any host.
    passfiles = [given["passfile"] for given in spec.connections.values() if given.get("passfile")]
    hook_kwargs["files"] = _comma_list(hook_kwargs.get("files"), str(spec_file), *passfiles)
    hook_kwargs.setdefault("name", f"{spec.pipeline}-{spec.participant}"[:200])
    if options.spark_binary != "spark-submit":  # (the default leaves the connection's spark-binary to count)
        hook_kwargs.setdefault("spark_binary", options.spark_binary)
    connection = SparkConnection.resolve(options.conn_id or "spark_default", hook_kwargs,
                                         master=options.master if options.master or options.conn_id else "local[*]")
    user_env = {**given_env, **dict(options.env_vars)}
    env = dict(user_env)
    if shutil.which(connection.spark_binary) is None:
        launcher_dir = spark_submit_binary_dir()
        if launcher_dir:
            env["PATH"] = os.pathsep.join([launcher_dir, env.get("PATH", os.environ.get("PATH", ""))])
    cluster = connection.deploy_mode == "cluster"
    if not cluster:
        env.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        if not options.python:
            env.setdefault("PYSPARK_PYTHON", sys.executable)
    conf = {**{str(k): str(v) for k, v in (hook_kwargs.get("conf") or {}).items()},
            **spark_conf_for(spec, options, connection.deploy_mode)}
    if cluster and connection.master.startswith("spark://"):
        # Standalone cluster mode returns once the master accepted the driver; the exit
        # record must mean "the application ended" (a user's explicit "false" is judged by
        # the driver's lease instead: see returns_at_submission).
        conf.setdefault("spark.standalone.submit.waitAppCompletion", "true")
    if connection.master.startswith("local"):
        # A local-mode application serves only the worker it runs on: its driver, block
        # manager and UI listen on loopback unless the user's spark_conf says otherwise.
        env.setdefault("SPARK_LOCAL_IP", LOOPBACK)
        for key in ("spark.driver.bindAddress", "spark.driver.host"):
            conf.setdefault(key, LOOPBACK)
    keytab = keytab_file(connection, spec_file.parent)
    command = [connection.spark_binary, *submit_arguments(connection, hook_kwargs, conf, user_env, keytab),
               DRIVER_SCRIPT, "--spec-file", spec_file.name]
    _log.info("spark-submit command: %s", masked(command))
    return command, env, connection


def returns_at_submission(master: str, deploy_mode: str) -> bool:
    """Whether ``spark-submit`` may exit 0 while its driver still runs: standalone cluster mode,
    unless ``spark.standalone.submit.waitAppCompletion`` (a user may turn it off)."""
    return deploy_mode == "cluster" and master.startswith("spark://")


def connect_command(spec: StageSpec, spec_file: Path) -> tuple[list[str], dict[str, str]]:
    """The command of a detached Spark Connect stage and its environment: the driver module in
    this host's Python, on a Connect session (no ``spark-submit``, no JVM)."""
    env: dict[str, str] = {}
    folders = [os.path.dirname(f) for f in stage_module_files(spec.stage)]
    if folders:  # a stage module beside the DAG: the DAGs folder is on the task's sys.path only
        env["PYTHONPATH"] = os.pathsep.join([*folders, *filter(None, [os.environ.get("PYTHONPATH")])])
    return [sys.executable, "-m", "airflow_seatunnel_ckpt.spark.driver", "--spec-file", str(spec_file)], env


def start_submission(spec: StageSpec, epoch: int, options: SubmitOptions) -> SubmissionRecord:
    """Launch ``spec``'s stage for ``epoch`` detached and record the submission in the store
    (with ``spec.remote``, :func:`connect_command` instead of ``spark-submit``)."""
    from airflow_seatunnel_ckpt.hooks.postgres_connection import driver_connections
    from airflow_seatunnel_ckpt.hooks.stage_runtime import public_url
    from airflow_seatunnel_ckpt.spark.launch import launch_detached, log_path, private_workdir, write_private

    workdir = private_workdir()
    runtime = "connect" if spec.remote is not None else "spark-submit"
    try:
        # The driver has no Airflow: the sources' connections are resolved here (a connection
        # that is not defined fails the task now, before anything is launched).
        spec = spec.replace(connections=driver_connections(spec.sources, workdir))
    except BaseException:
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    try:
        spec_file = workdir / SPEC_NAME
        write_private(spec_file, spec.to_json())
        if spec.remote is not None:
            command, env = connect_command(spec, spec_file)
            target, exits_before_stage = public_url(spec.remote), False
        else:
            command, env, connection = build_command(spec, spec_file, options)
            target = connection.target
            exits_before_stage = returns_at_submission(connection.master, connection.deploy_mode or "")
        # The driver's working directory is empty: the spec reaches it only the way it
        # reaches a driver on another host (``--files``).
        driver_dir = workdir / "driver"
        driver_dir.mkdir(mode=0o700)
        log = log_path(f"{spec.pipeline}-e{epoch}-{spec.participant}-a{spec.attempt}")
        launch = launch_detached(workdir=workdir, spec_file=spec_file, epoch=epoch, command=command, env=env,
                                 log=log, cwd=str(driver_dir))
    except Exception as exc:
        shutil.rmtree(workdir, ignore_errors=True)
        raise SubmitError(f"{runtime} launch of stage {spec.stage!r} (pipeline {spec.pipeline!r}, run "
                          f"{spec.run_id!r}, attempt {spec.attempt}) failed: {exc}") from exc
    record = SubmissionRecord(epoch, spec.participant, spec.attempt, socket.gethostname(), launch.pid, launch.log,
                              runtime=runtime, target=target, exits_before_stage=exits_before_stage,
                              submitted_at=time.time())
    record_submission(pipeline_of(spec), record)
    return record


def pipeline_of(spec: StageSpec) -> Pipeline:
    """The spec's pipeline in its store."""
    from airflow_seatunnel_ckpt.core import CheckpointConfig, CheckpointStore

    return CheckpointStore(CheckpointConfig.from_mapping(spec.store)).pipeline(spec.pipeline)


def wait_for_submission(pipeline: Pipeline, record: SubmissionRecord, *, poll_s: float = 2.0,
                        timeout_s: float | None = None, on_line: Callable[[str], None] | None = None
                        ) -> SubmissionCheck:
    """Poll until the submitted attempt is done (blocking; the trigger does the same asynchronously)."""
    from airflow_seatunnel_ckpt.spark.launch import LogFollower

    follower = LogFollower(record.log) if on_line is not None else None
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        check = judge_submission(pipeline, record.epoch, record.participant, record.attempt)
        if follower is not None and on_line is not None:
            for line in follower.new_lines():
                on_line(line)
        if check.outcome.done:
            return check
        if deadline is not None and time.monotonic() >= deadline:
            raise SubmitError(f"{check.message}; gave up waiting after {timeout_s:g}s")
        time.sleep(poll_s)


def submit_stage(
    spec: StageSpec,
    conn_id: str | None = None,
    master: str | None = None,
    spark_binary: str = "spark-submit",
    *,
    hook_kwargs: Mapping[str, Any] | None = None,
    env_vars: Mapping[str, str] | None = None,
    python: str | None = None,
    archives: Sequence[str] = (),
    poll_s: float = 1.0,
) -> StageResult:
    """Run ``spec``'s stage through ``spark-submit``, wait for it, and return its result.

    :param conn_id: Airflow Spark connection; without it the master is ``master``, else ``local[*]``.
    :param spark_binary: looked up on PATH; when absent there, the launcher bundled with pyspark.
    :param hook_kwargs: further ``SparkSubmitHook`` arguments (``py_files``, ``jars``...).
    The other arguments are :class:`SubmitOptions`' fields.
    """
    options = SubmitOptions(conn_id, master, spark_binary, dict(hook_kwargs or {}), dict(env_vars or {}),
                            python, tuple(archives))
    pipeline = pipeline_of(spec)
    epoch = pipeline.begin(spec.run_id).epoch
    earlier = pipeline.prepared_for_run(spec.run_id, spec.participant)
    if earlier is not None:
        return StageResult.from_prepared(pipeline.name, earlier, reused=True)
    record = start_submission(spec, epoch, options)
    check = wait_for_submission(pipeline, record, poll_s=poll_s, on_line=_log.info)
    return result_of(pipeline, spec.participant, check, spec.stage)


def result_of(pipeline: Pipeline, participant: str, check: SubmissionCheck, stage: str) -> StageResult:
    """The stage result of a finished submission: its prepared record, or the reason it has none (with
    the end of its output)."""
    if check.outcome is not SubmissionOutcome.PREPARED:
        tail = "\n".join(check.tail[-20:])
        raise SubmitError(f"stage {stage!r}: {check.message}" + (f"; last lines of spark-submit:\n{tail}"
                                                                 if tail else "; see the launch log"))
    record = pipeline.txlog.read_prepared(check.epoch, participant)
    if record is None:  # pragma: no cover - a prepared record never disappears
        raise SubmitError(f"{check.message}, but its prepared record is gone")
    return StageResult.from_prepared(pipeline.name, record, reused=record.attempt != check.attempt)
