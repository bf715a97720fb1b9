"""Where a stage runs: the runtimes as one choice (:func:`choose_runtime`), and the Spark Connect
session of an attempt.

``local`` runs in the task's process on ``local[*]``; ``spark-submit`` runs detached on the
master of a ``spark`` connection (:mod:`airflow_seatunnel_ckpt.hooks.spark_submit`);
``connect`` runs in the task's process on a Spark Connect session (no JVM on the worker),
one server session and tag per attempt, so that ``on_kill`` or a later try interrupts
exactly that attempt's operations.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from urllib.parse import urlparse

from airflow_seatunnel_ckpt.core.errors import ConfigError
from airflow_seatunnel_ckpt.spark.session import ConnectAttempt as ConnectAttempt

#: The connection type of the Apache Spark provider's ``SparkConnectHook``.
CONNECT_CONN_TYPE = "spark_connect"
CONNECT_SCHEME = "sc"


class Runtime(enum.StrEnum):
    """Where a stage's Spark work runs (see the module docstring)."""

    LOCAL = "local"
    SPARK_SUBMIT = "spark-submit"
    CONNECT = "connect"


@dataclass(frozen=True)
class RuntimeChoice:
    """The runtime a stage task runs its stage on, the connection it came from, and the ``sc://``
    URL of a Connect runtime (may hold a token: never logged, see :meth:`describe`)."""

    runtime: Runtime
    conn_id: str | None = None
    remote: str | None = None

    @property
    def in_process(self) -> bool:
        """Whether the stage runs in the task's process (its driver logic does, for Connect)."""
        return self.runtime is not Runtime.SPARK_SUBMIT

    def describe(self) -> str:
        """For the task log: the runtime and where it runs (a Connect URL without its parameters)."""
        if self.runtime is Runtime.CONNECT:
            via = f" (connection {self.conn_id})" if self.conn_id else ""
            return f"through Spark Connect at {public_url(self.remote or '')}{via}"
        if self.runtime is Runtime.SPARK_SUBMIT:
            return f"through spark-submit (connection {self.conn_id})"
        return "in-process on local Spark"


def public_url(remote: str) -> str:
    """``sc://host:port`` of a Connect URL, without its ``;token=...`` parameters."""
    parsed = urlparse(remote)
    return f"{parsed.scheme}://{parsed.netloc.split(';')[0]}"


def check_remote(remote: str, where: str) -> str:
    """``remote`` if it is a Spark Connect URL (``sc://host[:port][/;params]``), else ConfigError."""
    parsed = urlparse(remote) if isinstance(remote, str) else None
    if parsed is None or parsed.scheme != CONNECT_SCHEME or not parsed.netloc:
        raise ConfigError(f"{where}: spark_remote must be a Spark Connect URL 'sc://host:port', got "
                          f"{public_url(remote) if isinstance(remote, str) else remote!r}; or give conn_id of a "
                          f"{CONNECT_CONN_TYPE!r} connection")
    return remote


def choose_runtime(conn_id: str | None, spark_remote: str | None, where: str) -> RuntimeChoice:
    """The runtime of a stage task from its ``conn_id`` and ``spark_remote`` (the one place that decides).

    ``spark_remote`` or a ``spark_connect`` connection: Connect; any other connection:
    ``spark-submit``; neither: local Spark. Both given is refused (two places to run).
    """
    if spark_remote and conn_id:
        raise ConfigError(f"{where}: give conn_id or spark_remote, not both (conn_id={conn_id!r}, spark_remote="
                          f"{public_url(spark_remote)!r}): a spark_connect connection already names the server")
    if spark_remote:
        return RuntimeChoice(Runtime.CONNECT, remote=check_remote(spark_remote, where))
    if not conn_id:
        return RuntimeChoice(Runtime.LOCAL)
    from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook
    from airflow.providers.common.compat.sdk import AirflowNotFoundException

    try:
        connection = SparkConnectHook.get_connection(conn_id)
    except AirflowNotFoundException:
        # As SparkSubmitHook does: a Spark connection that is not defined means its defaults.
        return RuntimeChoice(Runtime.SPARK_SUBMIT, conn_id=conn_id)
    if connection.conn_type != CONNECT_CONN_TYPE:
        return RuntimeChoice(Runtime.SPARK_SUBMIT, conn_id=conn_id)
    try:
        remote = SparkConnectHook(conn_id=conn_id).get_connection_url()
    except ValueError as exc:
        raise ConfigError(f"{where}: Spark Connect connection {conn_id!r}: {exc}") from exc
    return RuntimeChoice(Runtime.CONNECT, conn_id=conn_id, remote=check_remote(remote, where))
