"""The SparkSession a stage runs in: in-process ``local[*]`` by default, the one
``spark-submit`` started for the driver module, or a Spark Connect session to the spec's
``remote`` server; and what the package's tasks do first in each Python worker of that
session."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from airflow_seatunnel_ckpt.spark.spec import StageSpec

log = logging.getLogger(__name__)

#: Master of the embedded default session.
DEFAULT_MASTER = "local[*]"
#: Where an embedded (local-mode) session listens unless the user's spark_conf says otherwise.
LOOPBACK = "127.0.0.1"
#: The log4j2 profile of an embedded session's JVM (beside this module): standard output, WARN.
LOG4J_PROFILE = "log4j2-stage.properties"


def stage_session(spec: StageSpec, submitted: bool = False) -> SparkSession:
    """The session for ``spec``: the running one of this process if any, else a new one.

    The spec's ``spark_conf`` is passed to the builder untouched. Two things are only
    defaulted when the user did not set them: the master (``local[*]``, and never under
    ``spark-submit``, whose ``--master`` wins) and the Python of the executors (this
    interpreter, which has pyarrow and this package installed); a local-mode session
    also listens on 127.0.0.1 only and its JVM logs warnings to standard output (see
    ``log4j2-stage.properties``), unless spark_conf sets a log4j2 configuration itself.
    """
    from pyspark.sql import SparkSession

    from airflow_seatunnel_ckpt.spark.classic import context_running

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    if context_running():
        # A session of this process, active in another thread: reuse it as it is. A builder
        # with options would change the running session's configuration under its owner.
        log.info("reusing the running SparkSession; spark_conf applies to new sessions only")
        return SparkSession.builder.getOrCreate()
    conf = {str(k): str(v) for k, v in spec.spark_conf.items()}
    builder = SparkSession.builder.appName(spec.app_name or f"{spec.pipeline}-{spec.participant}")
    if not submitted and "spark.master" not in conf:
        builder = builder.master(spec.master or DEFAULT_MASTER)
    master = conf.get("spark.master", spec.master or DEFAULT_MASTER)
    if not submitted and master.startswith("local"):
        # An embedded session serves only this process: its driver, block manager and UI
        # listen on loopback, not on every interface of the Airflow worker. The UI binds
        # where SPARK_LOCAL_IP says (0.0.0.0 without it); the JVM reads it at launch.
        os.environ.setdefault("SPARK_LOCAL_IP", LOOPBACK)
        for key in ("spark.driver.bindAddress", "spark.driver.host"):
            if key not in conf:
                builder = builder.config(key, LOOPBACK)
        # The JVM shares the task's standard error, which Airflow logs at ERROR level.
        java_options = conf.get("spark.driver.extraJavaOptions", "")
        if "log4j2.configurationFile" not in java_options:
            profile = Path(__file__).with_name(LOG4J_PROFILE).as_uri()
            conf["spark.driver.extraJavaOptions"] = f"{java_options} -Dlog4j2.configurationFile={profile}".strip()
    if "spark.pyspark.python" not in conf and "PYSPARK_PYTHON" not in os.environ:
        builder = builder.config("spark.pyspark.python", sys.executable)
    for key, value in conf.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    if not submitted:
        # PySpark names the Python of every worker this process's session starts -- the
        # executors' and the driver-side planner of a Python data source -- by PYSPARK_PYTHON
        # or else `python3` on PATH, ignoring spark.pyspark.python (spark-submit exports it
        # as PYSPARK_PYTHON; an in-process session has no spark-submit). Name it here.
        python = (conf.get("spark.pyspark.python") or os.environ.get("PYSPARK_PYTHON")
                  or conf.get("spark.pyspark.driver.python") or sys.executable)
        from airflow_seatunnel_ckpt.spark.classic import set_python_exec

        set_python_exec(session, python)
    return session


def is_classic(session: object) -> bool:
    """Whether ``session`` is a classic SparkSession (with a driver JVM in this process), not
    a Spark Connect one: only then may the package use :mod:`.classic`."""
    return not type(session).__module__.startswith("pyspark.sql.connect")


#: PySpark's process-wide switch: while set, ``pyspark.sql.functions`` build Spark Connect
#: columns (and no classic session can be created).
CONNECT_MODE = "SPARK_CONNECT_MODE_ENABLED"


@contextlib.contextmanager
def remote_session(spec: StageSpec) -> Iterator[SparkSession]:
    """A Spark Connect session to ``spec.remote`` for one run of the stage, released after it.

    The spec's ``spark_conf`` is set on the session where the server lets a client set it
    (SQL settings; static ones such as the master are the server's). The package's code
    goes to the server as an artifact of the session, so the Python workers and the Python
    data sources run the same code as this client. PySpark's Connect switch
    (:data:`CONNECT_MODE`) is on while the session is, and as it was afterwards: a process
    may run classic stages before or after.
    """
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    assert spec.remote is not None
    before = os.environ.get(CONNECT_MODE)
    os.environ[CONNECT_MODE] = "1"
    try:
        builder = ConnectSession.builder.remote(spec.remote)
        for key, value in spec.spark_conf.items():
            builder = builder.config(str(key), str(value))
        session = builder.create()
        try:
            session.addArtifacts(str(package_archive()), pyfile=True)
            yield session  # type: ignore[misc]
        finally:
            with contextlib.suppress(Exception):  # a dead server: nothing to release
                session.stop()
    finally:
        if before is None:
            os.environ.pop(CONNECT_MODE, None)
        else:
            os.environ[CONNECT_MODE] = before


@functools.cache
def package_archive() -> Path:
    """This package's modules in a zip (built once per process), for ``addArtifacts(pyfile=True)``."""
    root = Path(__file__).resolve().parent.parent
    target = Path(tempfile.mkdtemp(prefix="seatunnel-ckpt-artifact-")) / f"{root.name}.zip"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in sorted(root.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                archive.write(path, path.relative_to(root.parent).as_posix())
    return target


#: How many modules this process had loaded when it last froze its heap.
_frozen_with_modules = 0


def freeze_loaded_heap() -> None:
    """Leave what this process has loaded out of Python's cyclic garbage collector
    (:func:`gc.freeze`), again only when a module was imported since the last call.

    A full collection walks every object the loaded modules hold. Frozen objects are still
    freed when their last reference goes; only reference cycles among them are never
    collected. What is frozen is what the modules hold, plus whatever was alive at the
    few calls that followed an import.
    """
    import gc

    global _frozen_with_modules
    if len(sys.modules) != _frozen_with_modules:
        gc.freeze()
        _frozen_with_modules = len(sys.modules)


def freeze_worker_heap() -> None:
    """:func:`freeze_loaded_heap` inside a Spark task only; each task of this package calls it first.

    PySpark reuses a Python worker for task after task and runs a full ``gc.collect()``
    after each one. In a worker that has imported pyarrow, pandas and this package, that
    collection walks some 100,000 long-lived objects: 20-50 ms of CPU after every task,
    more than a task of a small epoch does itself (bench/README.md, "Python workers").
    The objects of the tasks that follow are collected as before.
    """
    from pyspark import TaskContext

    if TaskContext.get() is not None:
        freeze_loaded_heap()
