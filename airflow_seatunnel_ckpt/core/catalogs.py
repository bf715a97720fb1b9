"""Iceberg catalog properties that need no pyiceberg: the embedded default, secret keys.

Kept apart from :mod:`core.sinks.iceberg` (which imports pyiceberg and pyarrow, about two
seconds) because the Spark sink resolves the embedded catalog when a DAG is parsed.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from airflow_seatunnel_ckpt.core.errors import ConfigError

#: Directory of the embedded catalog and warehouse, below ``$AIRFLOW_HOME`` (or ~/airflow).
EMBEDDED_DIR = "seatunnel-ckpt-warehouse"
#: Catalog property names (or parts of names) that hold secrets: never in a manifest.
SECRET_HINTS = ("credential", "token", "secret", "password", "session-token")


def embedded_catalog(home: str | None = None) -> dict[str, str]:
    """Absolute properties of the embedded catalog below ``home`` (default ``$AIRFLOW_HOME``):
    a SQL catalog on SQLite, a local warehouse. Resolved when the sink is built, so every
    process commits into the same catalog."""
    base = home or os.environ.get("AIRFLOW_HOME") or os.path.expanduser("~/airflow")
    root = os.path.join(os.path.abspath(base), EMBEDDED_DIR)
    return {"type": "sql", "uri": f"sqlite:///{root}/catalog.db", "warehouse": f"file://{root}"}


def secret_keys(properties: Mapping[str, Any]) -> list[str]:
    """The property names in ``properties`` that look like secrets."""
    return sorted(k for k in properties if any(h in str(k).lower() for h in SECRET_HINTS))


def checked_table_options(where: str, table: Any, catalog: Any, secrets_way_out: str) -> dict[str, str]:
    """Check an Iceberg sink's or source's ``table`` and ``catalog`` options when the DAG is parsed;
    the catalog's properties as strings. ``secrets_way_out`` says where credentials go instead."""
    if not isinstance(table, str) or len([p for p in table.split(".") if p]) < 2:
        raise ConfigError(f"{where}: table must be '<namespace>.<name>', got {table!r}")
    if catalog is not None and not isinstance(catalog, Mapping):
        raise ConfigError(f"{where}: catalog must be a mapping of pyiceberg catalog properties, "
                          f"got {type(catalog).__name__}")
    secrets = secret_keys(catalog or {})
    if secrets:
        raise ConfigError(f"{where}: catalog option(s) {secrets} look like secrets; these options are recorded "
                          f"in the checkpoint store in clear. {secrets_way_out}")
    return {str(k): str(v) for k, v in (catalog or {}).items()}
