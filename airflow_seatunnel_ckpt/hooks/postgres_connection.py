"""The PostgreSQL sink's and sources' connection string from an Airflow Postgres connection, when used.

:func:`postgres_secrets` turns a ``postgres_conn_id`` into a libpq connection string as
``PostgresHook.get_conn`` reads the connection (importing this module registers it as a
secret resolver); :func:`driver_connections` hands a driver outside the task's process each
one without its password, the password in a private libpq password file (docs/CDC.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException

from airflow_seatunnel_ckpt.core.errors import ConfigError
from airflow_seatunnel_ckpt.core.options import Options
from airflow_seatunnel_ckpt.core.sinks import register_secret_resolver

if TYPE_CHECKING:
    from airflow.sdk import Connection


def postgres_conninfo(conn: Connection) -> str:
    """A libpq connection string from an Airflow Postgres connection (see the module docs)."""
    import psycopg
    from psycopg.conninfo import make_conninfo

    libpq = {o.keyword.decode() for o in psycopg.pq.Conninfo.get_defaults()}
    extra = conn.extra_dejson
    if not isinstance(extra, Mapping):
        raise ConfigError(f"connection {conn.conn_id!r}: extras must be a JSON object, got {type(extra).__name__}")
    params: dict[str, Any] = {k: v for k, v in extra.items() if k in libpq}
    params.update({k: v for k, v in (("host", conn.host), ("port", conn.port), ("user", conn.login),
                                     ("password", conn.password), ("dbname", conn.schema)) if v})
    return make_conninfo("", **params)


POSTGRES_TYPES = {"postgres": "sink", "postgres_cdc": "source", "postgres_query": "source"}


def postgres_secrets(options: Mapping[str, Any], name: str = "") -> dict[str, Any]:
    """The resolver: ``{"conninfo": ...}`` of a PostgreSQL sink's or source's ``postgres_conn_id`` (none
    without one); ``name``, the source's, for the message of a connection that is not defined."""
    conn_id = options.get("postgres_conn_id")
    kind = POSTGRES_TYPES.get(str(options.get("type")))
    if kind is None or not conn_id:
        return {}
    try:
        conn = BaseHook.get_connection(str(conn_id))
    except AirflowNotFoundException:
        where, tasks = (f"PostgreSQL sink of table {options.get('table')!r}", "the branch and commit tasks run") \
            if kind == "sink" else (f"{options.get('type')} source" + (f" {name!r}" if name else ""),
                                    "the stage task runs")
        raise ConfigError(
            f"{where}: its postgres_conn_id {conn_id!r} is not an Airflow connection here; define it (UI, CLI or "
            f"AIRFLOW_CONN_<ID>) where {tasks}, then retry") from None
    return {"conninfo": postgres_conninfo(conn)}


PASSFILE_NAME = "seatunnel-ckpt-pg-{n}.pgpass"


def driver_connections(sources: Mapping[str, Mapping[str, Any] | Options], directory: Path
                       ) -> dict[str, dict[str, str]]:
    """The connections of the PostgreSQL ``sources`` for a driver outside this process (``StageSpec.connections``).

    Each ``postgres_conn_id`` becomes ``{"conninfo": ..., "passfile": ...}``: the conninfo
    without the password, which goes into a libpq password file (mode 0600) in ``directory``,
    so that it is in no spec, command line, environment or store.
    """
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    from airflow_seatunnel_ckpt.spark.launch import write_private

    resolved: dict[str, dict[str, str]] = {}
    for name, options in sources.items():
        opts = options.to_dict() if isinstance(options, Options) else options
        conn_id = str(opts.get("postgres_conn_id") or "")
        if POSTGRES_TYPES.get(str(opts.get("type"))) != "source" or not conn_id or conn_id in resolved:
            continue
        params = conninfo_to_dict(postgres_secrets(opts, name)["conninfo"])
        if params.get("sslpassword"):
            raise ConfigError(f"{opts.get('type')} source {name!r}: connection {conn_id!r} has an sslpassword, which a "
                              "driver outside the task's process could only get in its spec; use a client key without "
                              "a passphrase (sslkey, readable only by the driver's user) for this stage")
        password = str(params.pop("password", "") or "")
        entry = {"conninfo": make_conninfo("", **params)}
        if password:
            if "\n" in password or "\r" in password:
                raise ConfigError(f"{opts.get('type')} source {name!r}: the password of connection {conn_id!r} has a "
                                  "line break, which a libpq password file cannot hold; change the password")
            path = directory / PASSFILE_NAME.format(n=len(resolved))
            # Any host, port, database and user: the file serves this one connection.
            escaped = password.replace("\\", "\\\\").replace(":", "\\:")
            write_private(path, f"*:*:*:*:{escaped}\n")
            entry["passfile"] = str(path)
        resolved[conn_id] = entry
    return resolved


register_secret_resolver(postgres_secrets)
