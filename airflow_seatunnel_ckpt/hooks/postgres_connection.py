"""The PostgreSQL sink's and sources' connection string from an Airflow Postgres connection, when used.

A PostgreSQL sink or source names a connection in ``postgres_conn_id`` (only the name is
stored); when a task plans or reads the source, or checks or commits the epoch,
:func:`postgres_secrets` turns it into a libpq connection string as
``PostgresHook.get_conn`` reads it: ``host``, ``port``, ``login`` -> ``user``,
``password``, ``schema`` -> ``dbname``, and the extras that are libpq parameters
(``sslmode``, ``options`` ...; the provider's own extras are left out). Importing this
module registers the resolver (:func:`core.sinks.register_secret_resolver`); the
checkpoint-store hook imports it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException

from airflow_seatunnel_ckpt.core.errors import ConfigError
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


#: The options' types that name a PostgreSQL connection: the sink and both PostgreSQL sources.
POSTGRES_TYPES = {"postgres": "sink", "postgres_cdc": "source", "postgres_query": "source"}


def postgres_secrets(options: Mapping[str, Any]) -> dict[str, Any]:
    """The resolver: ``{"conninfo": ...}`` of a PostgreSQL sink's or source's ``postgres_conn_id`` (none
    without one)."""
    conn_id = options.get("postgres_conn_id")
    kind = POSTGRES_TYPES.get(str(options.get("type")))
    if kind is None or not conn_id:
        return {}
    try:
        conn = BaseHook.get_connection(str(conn_id))
    except AirflowNotFoundException:
        where, tasks = (f"PostgreSQL sink of table {options.get('table')!r}", "the branch and commit tasks") \
            if kind == "sink" else (f"{options.get('type')} source", "the stage task")
        raise ConfigError(
            f"{where}: its postgres_conn_id {conn_id!r} is not an Airflow connection here; define it (UI, CLI or "
            f"AIRFLOW_CONN_<ID>) where {tasks} run, then retry") from None
    return {"conninfo": postgres_conninfo(conn)}


register_secret_resolver(postgres_secrets)
