"""Which checkpoint stores there are: the Checkpoints page shows them, the recovery DAG watches them.

Three sources, in this order: every Airflow connection of type ``seatunnel_ckpt`` (one
connection per store), from the metadata database and from ``AIRFLOW_CONN_<ID>``
environment variables (which win over a database connection of the same id, as they do
when a task looks the connection up), the URLs of the ``[seatunnel_ckpt] stores`` option (comma
separated, for stores without a connection), and the provider's default store
(``$SEATUNNEL_CKPT_STORE``, else ``$AIRFLOW_HOME/seatunnel-ckpt``) when it exists.
Each store gets a key that is safe in a URL path: the connection id, ``config-<n>`` or
``default``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from airflow_seatunnel_ckpt.core import CheckpointConfig, CheckpointStore
from airflow_seatunnel_ckpt.core.config import default_storage_url
from airflow_seatunnel_ckpt.core.errors import CheckpointError
from airflow_seatunnel_ckpt.hooks.checkpoint_store import CONN_TYPE, config_from_connection

#: The Airflow configuration section and option listing extra store URLs.
CONFIG_SECTION, CONFIG_OPTION = "seatunnel_ckpt", "stores"


class UnknownStoreError(CheckpointError, LookupError):
    """The page was asked for a store key that no connection or setting defines."""


@dataclass(frozen=True)
class ConfiguredStore:
    """One store the page shows: its key, where it comes from, and its configuration."""

    key: str
    source: str  #: "connection <id>", "[seatunnel_ckpt] stores" or "default store"
    config: CheckpointConfig | None
    #: why the store cannot be opened (a bad connection), shown instead of its pipelines
    problem: str = ""

    def open(self) -> CheckpointStore:
        """The store; CheckpointError when it is misconfigured or its root does not exist."""
        if self.config is None:
            raise CheckpointError(f"store {self.key!r} ({self.source}): {self.problem}")
        store = CheckpointStore(self.config)
        if not store.storage.exists(""):
            raise CheckpointError(f"store {self.key!r} ({self.source}): {store.storage.describe()} does not exist; "
                                  "check the connection's storage URL")
        return store


def _connections() -> list[ConfiguredStore]:
    from airflow.models.connection import Connection
    from airflow.utils.session import create_session

    found: dict[str, tuple[Any, str]] = {}
    with create_session() as session:
        for conn in session.query(Connection).filter(Connection.conn_type == CONN_TYPE).all():
            found[conn.conn_id] = (conn, f"connection {conn.conn_id}")
    found.update(_environment_connections())
    out = []
    for conn_id, (conn, source) in sorted(found.items()):
        try:
            out.append(ConfiguredStore(conn_id, source, config_from_connection(conn)))
        except CheckpointError as exc:
            out.append(ConfiguredStore(conn_id, source, None, str(exc)))
    return out


def _environment_connections() -> dict[str, tuple[Any, str]]:
    """Connections of our type defined as ``AIRFLOW_CONN_<ID>`` variables (ids in lower case, as Airflow
    looks them up); a variable Airflow cannot parse is not ours to judge and is skipped."""
    from airflow.secrets.environment_variables import CONN_ENV_PREFIX, EnvironmentVariablesBackend

    backend = EnvironmentVariablesBackend()
    found = {}
    for name in sorted(os.environ):
        conn_id = name[len(CONN_ENV_PREFIX):].lower() if name.startswith(CONN_ENV_PREFIX) else ""
        if not conn_id or conn_id.startswith("_"):  # a team-scoped variable (AIRFLOW_CONN__<TEAM>___<ID>)
            continue
        try:
            conn = backend.get_connection(conn_id)
        except Exception:  # malformed for Airflow too, which reports it itself
            continue
        if conn is not None and conn.conn_type == CONN_TYPE:
            found[conn_id] = (conn, f"connection {conn_id} (environment variable {name})")
    return found


def _configured_urls() -> list[str]:
    from airflow.configuration import conf

    raw = conf.get(CONFIG_SECTION, CONFIG_OPTION, fallback="") or ""
    return [url.strip() for url in raw.split(",") if url.strip()]


def configured_stores() -> list[ConfiguredStore]:
    """Every store the page shows (see the module docstring); duplicates of a URL are dropped."""
    stores = _connections()
    for n, url in enumerate(_configured_urls(), start=1):
        try:
            config = CheckpointConfig.from_mapping({"storage_url": url})
            stores.append(ConfiguredStore(f"config-{n}", f"[{CONFIG_SECTION}] {CONFIG_OPTION}", config))
        except CheckpointError as exc:
            stores.append(ConfiguredStore(f"config-{n}", f"[{CONFIG_SECTION}] {CONFIG_OPTION}", None, str(exc)))
    default = CheckpointConfig.from_mapping({"storage_url": default_storage_url()})
    if CheckpointStore(default).storage.exists(""):
        stores.append(ConfiguredStore("default", "default store", default))
    seen: set[str] = set()
    unique = []
    for store in stores:
        url = store.config.storage_url if store.config else f"?{store.key}"
        if url not in seen:
            seen.add(url)
            unique.append(store)
    return unique


def find_store(key: str) -> ConfiguredStore:
    """The configured store called ``key``; UnknownStoreError names the ones there are."""
    stores = configured_stores()
    for store in stores:
        if store.key == key:
            return store
    raise UnknownStoreError(f"no checkpoint store {key!r}; configured stores: "
                            f"{', '.join(s.key for s in stores) or 'none'} (connections of type {CONN_TYPE!r}, "
                            f"[{CONFIG_SECTION}] {CONFIG_OPTION}, or $SEATUNNEL_CKPT_STORE)")
