"""Iceberg catalog properties that need no pyiceberg: the embedded default, secret keys.

Kept apart from :mod:`core.tables.iceberg` (which imports pyiceberg and pyarrow, about two
seconds) because the Spark sink resolves the embedded catalog when a DAG is parsed.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

#: Directory of the embedded catalog and warehouse, below ``$AIRFLOW_HOME`` (or ~/airflow).
EMBEDDED_DIR = "seatunnel-ckpt-warehouse"
#: Catalog property names (or parts of names) that hold secrets: never in a manifest.
SECRET_HINTS = ("credential", "token", "secret", "password", "session-token")


def embedded_catalog(home: str | None = None) -> dict[str, str]:
    """Absolute properties of the embedded catalog: a SQL catalog on SQLite, a local warehouse.

    ``home`` defaults to ``$AIRFLOW_HOME``, else ``~/airflow``. The sink resolves this when
    it is built, so the commit task, the recovery DAG and the console, wherever they run,
    commit into the same catalog.
    """
    base = home or os.environ.get("AIRFLOW_HOME") or os.path.expanduser("~/airflow")
    root = os.path.join(os.path.abspath(base), EMBEDDED_DIR)
    return {"type": "sql", "uri": f"sqlite:///{root}/catalog.db", "warehouse": f"file://{root}"}


def secret_keys(properties: Mapping[str, Any]) -> list[str]:
    """The property names in ``properties`` that look like secrets."""
    return sorted(k for k in properties if any(h in str(k).lower() for h in SECRET_HINTS))
