"""The SparkSession a stage runs in: in-process ``local[*]`` by default, the one ``spark-submit`` started, or a Spark
Connect session to the spec's ``remote`` (:class:`ConnectAttempt`); and what the package's tasks do first in each Python
worker."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import sys
import tempfile
import uuid
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from airflow_seatunnel_ckpt.spark.spec import StageSpec

log = logging.getLogger(__name__)

DEFAULT_MASTER = "local[*]"
#: Where an embedded (local-mode) session listens unless the user's spark_conf says otherwise.
LOOPBACK = "127.0.0.1"
#: The log4j2 profile of an embedded session's JVM (beside this module): standard output, WARN.
LOG4J_PROFILE = "log4j2-stage.properties"


def stage_session(spec: StageSpec, submitted: bool = False) -> SparkSession:
    """The session for ``spec``: the running one of this process if any, else a new one.

    ``spark_conf`` is passed untouched; only when it does not say so are the master (``local[*]``, never under
    ``spark-submit``) and the executors' Python (this interpreter) set, and a local-mode session listens on 127.0.0.1
    and logs WARN to standard output (``log4j2-stage.properties``).
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
    """Whether ``session`` is a classic SparkSession (with a driver JVM in this process), not a Spark Connect one: only
    then may the package use :mod:`.classic`."""
    return not type(session).__module__.startswith("pyspark.sql.connect")


@contextlib.contextmanager
def session_conf(spark: SparkSession, key: str, value: str) -> Iterator[None]:
    """The runtime setting ``key`` of ``spark`` set to ``value`` inside the block, and as it was afterwards."""
    conf = spark.conf
    previous = conf.get(key, None)
    conf.set(key, value)
    try:
        yield
    finally:
        if previous is None:
            conf.unset(key)
        else:
            conf.set(key, previous)


#: PySpark's process-wide switch: while set, ``pyspark.sql.functions`` build Spark Connect
#: columns (and no classic session can be created).
CONNECT_MODE = "SPARK_CONNECT_MODE_ENABLED"


@contextlib.contextmanager
def remote_session(spec: StageSpec) -> Iterator[SparkSession]:
    """A Spark Connect session to ``spec.remote`` for one run of the stage, released after it.

    ``spark_conf`` is set where the server lets a client set it; the package goes to the server as an artifact, so its
    workers run this client's code. PySpark's :data:`CONNECT_MODE` is on while the session is, as it was afterwards.
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
        failed = True
        try:
            session.addArtifacts(str(package_archive()), pyfile=True)
            yield session  # type: ignore[misc]
            failed = False
        finally:
            with contextlib.suppress(Exception):  # a dead server: nothing to release
                if failed:
                    # The server may be what failed: release once, without the client's
                    # minutes of retries, so the attempt ends and the next one can begin.
                    session.client.set_retry_policies([])
                session.stop()
    finally:
        if before is None:
            os.environ.pop(CONNECT_MODE, None)
        else:
            os.environ[CONNECT_MODE] = before


@dataclass(frozen=True)
class ConnectAttempt:
    """One attempt's Spark Connect session on the server: its session id and its operations' tag.

    Both are derived from the attempt (store, pipeline, epoch, participant, attempt), so any process that knows it (its
    task's ``on_kill``, a later try) reaches the same server session and interrupts its operations by tag; a stage's
    attempt is its attempt of the epoch, a replay's the try that makes the replay epoch.
    """

    remote: str
    session_id: str
    tag: str

    @classmethod
    def of(cls, remote: str, store: str, pipeline: str, epoch: int, participant: str, attempt: int) -> ConnectAttempt:
        """The Connect session and tag of ``attempt`` of ``participant`` in ``epoch``."""
        name = f"{store}\n{pipeline}\n{epoch}\n{participant}\n{attempt}"
        # A UUID (the form Connect takes) fixed by the attempt; its version bits set as for uuid4.
        session_id = str(uuid.UUID(bytes=hashlib.sha256(name.encode()).digest()[:16], version=4))
        # Tags are plain text without commas; the participant name is validated as one word.
        return cls(remote, session_id, f"seatunnel-ckpt-{pipeline}-e{epoch}-{participant}-a{attempt}")

    @property
    def url(self) -> str:
        """``remote`` with this attempt's ``session_id`` among its parameters."""
        base, _, params = self.remote.partition(";")
        kept = [p for p in params.split(";") if p and not p.startswith("session_id=")]
        base = base if base.endswith("/") else f"{base}/"
        return ";".join([base, *kept, f"session_id={self.session_id}"])

    @contextlib.contextmanager
    def session(self, spec: StageSpec) -> Iterator[SparkSession]:
        """The attempt's Connect session for ``spec`` (:func:`remote_session`), with the attempt's tag on this thread's
        operations."""
        with remote_session(spec.replace(remote=self.url)) as session:
            session.addTag(self.tag)
            yield session

    def interrupt(self, session: SparkSession | None = None, *, release: bool = False) -> list[str]:
        """Interrupt the attempt's running operations on the server; the ids of those interrupted.

        Through ``session`` if given, else through a new client of the server session, which with ``release`` also
        releases it (that ends every operation of the session, also untagged ones; made even when the interrupt failed,
        whose error is raised after it).
        """
        if session is not None:
            return list(session.interruptTag(self.tag))
        from pyspark.sql.connect.client import SparkConnectClient

        client = SparkConnectClient(self.url)
        try:
            try:
                return list(client.interrupt_tag(self.tag) or [])
            finally:
                if release:
                    client.release_session()
        finally:
            with contextlib.suppress(Exception):
                client.close()


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
    """Leave what this process has loaded out of the cyclic garbage collector (:func:`gc.freeze`), again only when a
    module was imported since the last call (frozen objects are still freed by reference count)."""
    import gc

    global _frozen_with_modules
    if len(sys.modules) != _frozen_with_modules:
        gc.freeze()
        _frozen_with_modules = len(sys.modules)


def freeze_worker_heap() -> None:
    """:func:`freeze_loaded_heap` inside a Spark task only; each task of this package calls it first (a reused worker's
    full collection after each task walked some 100,000 long-lived objects: 20-50 ms, bench/README.md "Python workers").
    """
    from pyspark import TaskContext

    if TaskContext.get() is not None:
        freeze_loaded_heap()
