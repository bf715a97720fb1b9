"""Iceberg catalog credentials from an Airflow connection, added when a table commit runs.

:func:`catalog_secrets` (registered as a secret resolver on import) turns a sink's
``catalog_conn_id`` into pyiceberg catalog properties as the Airflow Iceberg provider reads
the connection: ``host`` -> ``uri``, ``login:password`` -> ``credential``, the extras win.
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


def catalog_properties(conn: Connection) -> dict[str, Any]:
    """pyiceberg catalog properties from an Airflow connection (see the module docs)."""
    props: dict[str, Any] = {}
    if conn.host:
        props["uri"] = conn.host
    if conn.login or conn.password:
        props["credential"] = f"{conn.login or ''}:{conn.password or ''}"
    extra = conn.extra_dejson
    if not isinstance(extra, Mapping):
        raise ConfigError(f"connection {conn.conn_id!r}: extras must be a JSON object of pyiceberg catalog "
                          f"properties, got {type(extra).__name__}")
    props.update({str(k): v for k, v in extra.items()})
    return props


def catalog_secrets(options: Mapping[str, Any]) -> dict[str, Any]:
    """The resolver: properties of the sink's ``catalog_conn_id`` connection (none without one)."""
    conn_id = options.get("catalog_conn_id")
    if options.get("type") != "iceberg" or not conn_id:
        return {}
    try:
        conn = BaseHook.get_connection(str(conn_id))
    except AirflowNotFoundException:
        raise ConfigError(
            f"Iceberg sink of table {options.get('table')!r}: its catalog_conn_id {conn_id!r} is not an Airflow "
            "connection here; define it (UI, CLI or AIRFLOW_CONN_<ID>) where the commit runs, then retry the "
            "commit") from None
    return catalog_properties(conn)


register_secret_resolver(catalog_secrets)
