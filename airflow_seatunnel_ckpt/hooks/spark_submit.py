"""Run a stage on any Spark master with ``spark-submit``, detached from the task that launched it.

The command is built by the Apache Spark provider's ``SparkSubmitHook`` (connection,
deploy mode, Kerberos, ``--conf``...); it is run by the detached launcher
(:mod:`airflow_seatunnel_ckpt.spark.launch`), so that the application outlives a
deferred, cleared or killed task and a retry can find it again (see
:mod:`airflow_seatunnel_ckpt.core.protocol.submissions`).

Nothing travels through the task's file system. The spec goes with ``--files`` (Spark
ships it to the driver wherever the driver runs: its working directory in YARN and
Kubernetes cluster mode, ``SparkFiles`` otherwise); the driver's working directory is
an empty one of its own. The result is the participant's prepared record in the store,
and how ``spark-submit`` ended is the attempt's exit record there. The Spark
configuration of the spec goes to ``--conf`` untouched. A stage in a single-file
top-level module (typically beside the DAG in Airflow's DAGs folder) travels with
``--py-files``. The Python of the executors (and of a cluster-mode driver) is the one
the user names (``python``, e.g. ``./environment/bin/python`` of a packed environment
shipped with ``archives``); without one, this interpreter, which suits local and client
mode on hosts that share it.
"""

from __future__ import annotations

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
from airflow_seatunnel_ckpt.core.protocol.submissions import (
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

#: The script spark-submit runs.
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

    Airflow puts the DAGs folder on ``sys.path`` of its tasks, not of the driver process
    ``spark-submit`` starts, so a stage module beside the DAG (``"my_stages:dedup"``)
    would not import there. A single-file top-level module, wherever it is found in this
    process, is therefore shipped with ``--py-files``. A module inside a package is left to
    the environment: install the package where the driver runs, or ship it with the
    ``py_files`` argument of the hook.
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


def _with_py_files(hook_kwargs: Mapping[str, Any], files: list[str]) -> dict[str, Any]:
    """``hook_kwargs`` with ``files`` added to its comma-separated ``py_files``."""
    kwargs = dict(hook_kwargs)
    listed = [f for f in str(kwargs.get("py_files") or "").split(",") if f]
    listed += [f for f in files if f not in listed]
    if listed:
        kwargs["py_files"] = ",".join(listed)
    return kwargs


def _hook_class() -> Any:
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    class StageSubmitHook(SparkSubmitHook):
        """``SparkSubmitHook`` whose master may be given directly instead of by connection."""

        def __init__(self, *, master: str | None = None, **kwargs: Any) -> None:
            self._master_override = master
            super().__init__(**kwargs)

        def _resolve_connection(self) -> dict[str, Any]:
            data: dict[str, Any] = super()._resolve_connection()
            if self._master_override:
                data["master"] = self._master_override
            return data

    return StageSubmitHook


#: Name of the spec among the files shipped with ``--files``.
SPEC_NAME = "seatunnel-ckpt-spec.json"


@dataclass(frozen=True)
class SubmitOptions:
    """How to submit: the Spark connection or master, and what the application needs."""

    conn_id: str | None = None
    master: str | None = None
    spark_binary: str = "spark-submit"
    hook_kwargs: Mapping[str, Any] = field(default_factory=dict)
    env_vars: Mapping[str, str] = field(default_factory=dict)
    #: Python of the executors (and of a cluster-mode driver): ``spark.pyspark.python``.
    python: str | None = None
    #: Archives unpacked in the executors' working directories (``spark.archives``),
    #: e.g. ``"hdfs:///envs/stage.tar.gz#environment"`` (a packed virtual environment).
    archives: Sequence[str] = ()


def spark_conf_for(spec: StageSpec, options: SubmitOptions, deploy_mode: str | None) -> dict[str, str]:
    """The ``--conf`` of the application: the spec's, plus the Python and archives it names.

    The user's own ``spark.pyspark.*`` / ``spark.archives`` keys are never overridden. A
    local or client-mode driver runs this interpreter (it has PySpark and this package);
    executors run ``options.python`` when given, else this interpreter -- except in cluster
    mode, where nothing of this host is assumed to exist.
    """
    conf = {str(k): str(v) for k, v in spec.spark_conf.items()}
    if options.archives:
        listed = [a for a in conf.get("spark.archives", "").split(",") if a]
        conf["spark.archives"] = ",".join([*listed, *(a for a in options.archives if a not in listed)])
    cluster = deploy_mode == "cluster"
    if options.python:
        conf.setdefault("spark.pyspark.python", options.python)
    elif not cluster:
        conf.setdefault("spark.pyspark.python", sys.executable)
    if not cluster:
        conf.setdefault("spark.pyspark.driver.python", sys.executable)
    return conf


def build_command(spec: StageSpec, spec_file: Path, options: SubmitOptions) -> tuple[list[str], dict[str, str], Any]:
    """The ``spark-submit`` command line, its environment, and the hook that built it."""
    hook_kwargs = _with_py_files(options.hook_kwargs, stage_module_files(spec.stage))
    given_env = hook_kwargs.pop("env_vars", None) or {}
    listed = [f for f in str(hook_kwargs.get("files") or "").split(",") if f]
    hook_kwargs["files"] = ",".join([*listed, str(spec_file)])
    master = options.master if options.master or options.conn_id else "local[*]"
    env = {**dict(given_env), **dict(options.env_vars)}
    if shutil.which(options.spark_binary) is None:
        launcher_dir = spark_submit_binary_dir()
        if launcher_dir:
            env["PATH"] = os.pathsep.join([launcher_dir, env.get("PATH", os.environ.get("PATH", ""))])
    hook = _hook_class()(master=master, conn_id=options.conn_id or "spark_default",
                         application_args=["--spec-file", spec_file.name],
                         name=f"{spec.pipeline}-{spec.participant}"[:200], env_vars=env,
                         spark_binary=options.spark_binary, **hook_kwargs)
    deploy_mode = hook._connection.get("deploy_mode")
    if deploy_mode != "cluster":  # (the hook holds ``env`` itself: it reads it when building)
        env.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        if not options.python:
            env.setdefault("PYSPARK_PYTHON", sys.executable)
    hook._conf = spark_conf_for(spec, options, deploy_mode)
    if deploy_mode == "cluster" and str(hook._connection.get("master") or "").startswith("spark://"):
        # Standalone cluster mode returns once the master accepted the driver; the exit
        # record must mean "the application ended" (a user's explicit "false" is judged by
        # the driver's lease instead: see returns_at_submission).
        hook._conf.setdefault("spark.standalone.submit.waitAppCompletion", "true")
    if str(hook._connection.get("master") or "").startswith("local"):
        # A local-mode application serves only the worker it runs on: its driver, block
        # manager and UI listen on loopback unless the user's spark_conf says otherwise.
        env.setdefault("SPARK_LOCAL_IP", LOOPBACK)
        for key in ("spark.driver.bindAddress", "spark.driver.host"):
            hook._conf.setdefault(key, LOOPBACK)
    # The provider builds (and masks) the command; only running it is done here.
    command = hook._build_spark_submit_command(DRIVER_SCRIPT)
    return command, env, hook


def returns_at_submission(master: str, deploy_mode: str) -> bool:
    """Whether ``spark-submit`` may exit 0 while its driver still runs.

    Spark standalone in cluster mode returns once the master accepted the driver, unless
    ``spark.standalone.submit.waitAppCompletion`` is true (the launch sets it, but a user's
    ``spark_conf`` may turn it off). YARN and Kubernetes wait for the application by default.
    """
    return deploy_mode == "cluster" and master.startswith("spark://")


def start_submission(spec: StageSpec, epoch: int, options: SubmitOptions) -> SubmissionRecord:
    """Launch ``spec``'s stage for ``epoch`` detached and record the submission in the store."""
    from airflow_seatunnel_ckpt.spark.launch import launch_detached, log_path, private_workdir, write_private

    workdir = private_workdir()
    try:
        spec_file = workdir / SPEC_NAME
        write_private(spec_file, spec.to_json())
        command, env, hook = build_command(spec, spec_file, options)
        # The driver's working directory is empty: the spec reaches it only the way it
        # reaches a driver on another host (``--files``).
        driver_dir = workdir / "driver"
        driver_dir.mkdir(mode=0o700)
        log = log_path(f"{spec.pipeline}-e{epoch}-{spec.participant}-a{spec.attempt}")
        launch = launch_detached(workdir=workdir, spec_file=spec_file, epoch=epoch, command=command, env=env,
                                 log=log, cwd=str(driver_dir))
    except Exception as exc:
        shutil.rmtree(workdir, ignore_errors=True)
        raise SubmitError(f"spark-submit of stage {spec.stage!r} (pipeline {spec.pipeline!r}, run {spec.run_id!r}, "
                          f"attempt {spec.attempt}) could not be launched: {exc}") from exc
    master = str(hook._connection.get("master") or "")
    deploy_mode = str(hook._connection.get("deploy_mode") or "")
    record = SubmissionRecord(epoch, spec.participant, spec.attempt, socket.gethostname(), launch.pid, launch.log,
                              runtime="spark-submit", target=f"{master} ({deploy_mode or 'client'} mode)",
                              exits_before_stage=returns_at_submission(master, deploy_mode),
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


def submission_error(spec_stage: str, check: SubmissionCheck) -> SubmitError:
    """The error of a submitted attempt that did not prepare, with the end of its output."""
    tail = "\n".join(check.tail[-20:])
    return SubmitError(f"stage {spec_stage!r}: {check.message}" + (f"; last lines of spark-submit:\n{tail}"
                                                                   if tail else "; see the launch log"))


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

    :param conn_id: Airflow Spark connection (master, deploy mode, binary). Without it
        the master is ``master`` or, failing that, ``local[*]``.
    :param master: master URL overriding the connection's (e.g. ``spark://host:7077``).
    :param spark_binary: ``spark-submit`` (default), ``spark2-submit`` or
        ``spark3-submit``, looked up on PATH; when absent there, the launcher bundled
        with pyspark is used.
    :param hook_kwargs: further ``SparkSubmitHook`` arguments (``py_files``, ``jars``,
        ``executor_memory``...). The stage's own module is added to ``py_files`` when it
        is a single-file top-level module (see :func:`stage_module_files`).
    :param env_vars: environment of the spark-submit process.
    :param python: Python of the executors (``spark.pyspark.python``).
    :param archives: archives for ``spark.archives`` (e.g. a packed environment).
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
    """The stage result of a finished submission: its prepared record, or the reason it has none."""
    if check.outcome is not SubmissionOutcome.PREPARED:
        raise submission_error(stage, check)
    record = pipeline.txlog.read_prepared(check.epoch, participant)
    if record is None:  # pragma: no cover - a prepared record never disappears
        raise SubmitError(f"{check.message}, but its prepared record is gone")
    return StageResult.from_prepared(pipeline.name, record, reused=record.attempt != check.attempt)
