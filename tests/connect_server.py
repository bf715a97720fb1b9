"""A real Spark Connect server for the tests, from the installed pyspark.

:func:`start_server` runs ``spark-submit --class
org.apache.spark.sql.connect.service.SparkConnectServer`` (the class
``sbin/start-connect-server.sh`` starts; pyspark's ``jars/`` ships ``spark-connect``) with a
``local[1]`` master (:data:`MASTER`), its gRPC endpoint bound to 127.0.0.1 at a free port, and the
checkout on ``PYTHONPATH`` so that the server's Python (Python data sources, UDFs, the
data source's driver-side ``commit``) imports the package under test. :class:`ConnectServer`
says where it listens (``sc://127.0.0.1:<port>``) and :meth:`ConnectServer.stop` ends it by
its process group's id (the JVM is a child of the ``spark-submit`` shell). The session
fixtures ``connect_server`` and ``connect_spark`` (tests/conftest.py) wrap them: one server
per test session, started the first time a test asks for it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

#: The Connect server's main class, as ``sbin/start-connect-server.sh`` starts it.
SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"

#: The server's master: one task slot. Each Connect session gets Python workers of its own
#: (the session's artifacts are on their path), started and importing pyarrow, pandas and the
#: package anew; a stage's task runs two of them (its Arrow UDF and its state report), so a
#: second slot doubles those imports for the few rows a test stage has. Six stage runs of
#: two epochs took 126 s instead of 185 s (same hour, loaded two-core machine).
MASTER = "local[1]"


class ConnectServerUnavailable(RuntimeError):
    """The server could not start here (no Java, no ``spark-connect`` jar); the message says why."""


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class ConnectServer:
    """A running Spark Connect server on 127.0.0.1: where it listens, its process and log."""

    process: subprocess.Popen[bytes]
    port: int
    log_path: Path
    scratch: Path

    @property
    def url(self) -> str:
        """The ``sc://`` URL clients pass to ``SparkSession.builder.remote``."""
        return f"sc://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        """The process id of the ``spark-submit`` shell, leader of the server's process group."""
        return self.process.pid

    def alive(self) -> bool:
        """Whether the server's process still runs."""
        return self.process.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        """The end of the server's log, for error messages."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return f"<no log at {self.log_path}>"

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """End the server's process group by its id (``sig``, then KILL). Idempotent."""
        if self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, sig)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=20)


def _spark_home() -> Path:
    from pyspark.find_spark_home import _find_spark_home

    return Path(_find_spark_home())


def _answers(port: int) -> bool:
    """Whether something accepts TCP connections on 127.0.0.1:``port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def start_server(
    root: Path | None = None,
    *,
    python_path: str | None = None,
    jvm_options: str = "",
    timeout: float = 120.0,
    conf: dict[str, str] | None = None,
) -> ConnectServer:
    """Start a Connect server on 127.0.0.1 at a free port and wait until its endpoint answers.

    ``python_path`` goes first on the server's ``PYTHONPATH`` (its Python workers and its
    Python data sources import the package from there; default: the current directory);
    ``""`` gives the server no ``PYTHONPATH`` at all (the package reaches it only as a
    session's artifact). The server runs in a scratch directory of its own.

    :raises ConnectServerUnavailable: no ``spark-connect`` jar in the installed pyspark, or
        the server exited or did not answer within ``timeout`` seconds (with its log's end).
    """
    home = _spark_home()
    if not list((home / "jars").glob("spark-connect_*.jar")):
        raise ConnectServerUnavailable(f"pyspark at {home} ships no jars/spark-connect_*.jar")
    scratch = Path(tempfile.mkdtemp(prefix="spark-connect-", dir=root))
    port = free_port()
    log_path = scratch / f"connect-{port}.log"
    settings = {
        "spark.master": MASTER,
        "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.connect.grpc.binding.port": str(port),
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.driver.memory": "1g",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "4",
        "spark.default.parallelism": "2",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.catalogImplementation": "in-memory",
        "spark.sql.warehouse.dir": str(scratch / "warehouse"),
        "spark.local.dir": str(scratch / "local"),
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
        **({"spark.driver.extraJavaOptions": jvm_options} if jvm_options else {}),
        **(conf or {}),
    }
    command = ["bash", str(home / "bin" / "spark-submit"), "--class", SERVER_CLASS,
               "--name", "airflow-seatunnel-ckpt-tests-connect"]
    for key, value in settings.items():
        command += ["--conf", f"{key}={value}"]
    command.append("spark-internal")
    env = dict(os.environ)
    env.update({
        "SPARK_HOME": str(home),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "PYTHONPATH": "" if python_path == "" else os.pathsep.join(
            p for p in (python_path or os.getcwd(), env.get("PYTHONPATH", "")) if p),
    })
    env.pop("SPARK_CONF_DIR", None)
    with log_path.open("wb") as out:
        try:
            process = subprocess.Popen(command, env=env, cwd=scratch, stdout=out, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, start_new_session=True)
        except OSError as exc:
            raise ConnectServerUnavailable(f"cannot run spark-submit: {exc}") from exc
    server = ConnectServer(process, port, log_path, scratch)
    deadline = time.monotonic() + timeout
    while not _answers(port):
        if process.poll() is not None:
            raise ConnectServerUnavailable(
                f"the Connect server exited with {process.returncode}:\n{server.log_tail()}")
        if time.monotonic() > deadline:
            server.stop()
            raise ConnectServerUnavailable(
                f"the Connect server did not answer on port {port} within {timeout}s:\n{server.log_tail()}")
        time.sleep(0.2)
    return server
