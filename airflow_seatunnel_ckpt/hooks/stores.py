"""Which checkpoint stores there are: the Checkpoints page shows them, the recovery DAG watches them.

In this order: connections of type ``seatunnel_ckpt`` (the metadata database's, and
``AIRFLOW_CONN_<ID>`` variables, which win), the entries of ``[seatunnel_ckpt] stores`` and
the default store when it exists; each keyed by its connection id, ``config-<n>`` or
``default``. Recovery's tasks pass ``database=False`` (an Airflow 3 task cannot list the
database's connections); the page marks the stores recovery cannot see.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from airflow_seatunnel_ckpt.core import CheckpointConfig, CheckpointStore
from airflow_seatunnel_ckpt.core.config import default_storage_url
from airflow_seatunnel_ckpt.core.errors import CheckpointError
from airflow_seatunnel_ckpt.hooks.checkpoint_store import CONN_TYPE, config_from_connection

CONFIG_SECTION, CONFIG_OPTION = "seatunnel_ckpt", "stores"


class UnknownStoreError(CheckpointError, LookupError):
    """The page was asked for a store key that no connection or setting defines."""


@dataclass(frozen=True)
class ConfiguredStore:
    """One store the page shows: its key, where it comes from, and its configuration."""

    key: str
    source: str  # "connection <id>", "[seatunnel_ckpt] stores" or "default store"
    config: CheckpointConfig | None
    problem: str = ""  # why the store cannot be opened, shown instead of its pipelines
    conn_id: str | None = None  # None: a URL of the option, or the default URL
    watched_by_recovery: bool = True

    @property
    def recovery_note(self) -> str:
        """Empty when the recovery DAG watches this store; else why not and how to add it."""
        if self.watched_by_recovery:
            return ""
        return (f"The recovery DAG does not watch this store: a task cannot list the connections of "
                f"the metadata database. Add {self.key!r} to [{CONFIG_SECTION}] {CONFIG_OPTION} (e.g. "
                f"AIRFLOW__SEATUNNEL_CKPT__STORES={self.key}) on the workers and the API server, or "
                f"define the connection as AIRFLOW_CONN_{self.key.upper()} there.")

    def store_kwargs(self) -> dict[str, Any]:
        """The store arguments of a task on this store (``store_conn_id`` or ``storage_url``)."""
        if self.conn_id is not None:
            return {"store_conn_id": self.conn_id, "storage_url": None}
        return {"store_conn_id": None, "storage_url": self.config.storage_url if self.config else None}

    def open(self) -> CheckpointStore:
        """The store; CheckpointError when it is misconfigured or its root does not exist."""
        if self.config is None:
            raise CheckpointError(f"store {self.key!r} ({self.source}): {self.problem}")
        store = CheckpointStore(self.config)
        if not store.storage.exists(""):
            raise CheckpointError(f"store {self.key!r} ({self.source}): {store.storage.describe()} does not exist; "
                                  "check the connection's storage URL")
        return store


def _store(key: str, source: str, config: Callable[[], CheckpointConfig], **kwargs: Any) -> ConfiguredStore:
    """The store ``key`` with ``config()``, or with the problem that keeps it from being read."""
    try:
        return ConfiguredStore(key, source, config(), **kwargs)
    except CheckpointError as exc:
        return ConfiguredStore(key, source, None, str(exc), **kwargs)


def _connections(database: bool, named: set[str]) -> list[ConfiguredStore]:
    """Connections of our type; ``named``: ids a task can look up (so recovery watches them)."""
    found: dict[str, tuple[Any, str, bool]] = {}
    if database:
        from airflow.models.connection import Connection
        from airflow.utils.session import create_session

        with create_session() as session:
            for conn in session.query(Connection).filter(Connection.conn_type == CONN_TYPE).all():
                found[conn.conn_id] = (conn, f"connection {conn.conn_id}", conn.conn_id in named)
    found.update({conn_id: (conn, source, True) for conn_id, (conn, source) in _environment_connections().items()})
    return [_store(conn_id, source, partial(config_from_connection, conn), conn_id=conn_id,
                   watched_by_recovery=watched) for conn_id, (conn, source, watched) in sorted(found.items())]


def _looked_up(conn_id: str, source: str) -> ConfiguredStore | None:
    """A connection read by id (what a task can do); None when it is not defined."""
    from airflow.sdk.exceptions import AirflowNotFoundException

    from airflow_seatunnel_ckpt.hooks.checkpoint_store import CheckpointStoreHook

    try:
        return _store(conn_id, source, CheckpointStoreHook(store_conn_id=conn_id).get_config, conn_id=conn_id)
    except AirflowNotFoundException:
        return None


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


def configured_stores(*, database: bool = True) -> list[ConfiguredStore]:
    """Every store the page shows (see the module docstring); duplicates of a URL are dropped."""
    from airflow_seatunnel_ckpt.hooks.checkpoint_store import StoreSettings

    option = f"[{CONFIG_SECTION}] {CONFIG_OPTION}"
    entries = _configured_urls()
    named = {entry for entry in entries if "://" not in entry}
    default_conn_id, _ = StoreSettings().connection_ids()
    stores = _connections(database, named | {default_conn_id or ""})
    known = {store.key for store in stores}
    n = 0
    for entry in entries:
        if "://" not in entry:  # a connection id
            if entry not in known:
                looked_up = _looked_up(entry, f"connection {entry} ({option})")
                stores.append(looked_up or ConfiguredStore(
                    entry, option, None, f"{option} names connection {entry!r}, which is not defined",
                    conn_id=entry))
                known.add(entry)
            continue
        n += 1
        stores.append(_store(f"config-{n}", option, partial(CheckpointConfig.from_mapping, {"storage_url": entry})))
    if default_conn_id and default_conn_id not in known:
        found = _looked_up(default_conn_id, f"connection {default_conn_id} (the default store)")
        if found is not None:
            stores.append(found)
            known.add(default_conn_id)
    if default_conn_id not in known:
        default = CheckpointConfig.from_mapping({"storage_url": default_storage_url()})
        if CheckpointStore(default).storage.exists(""):
            stores.append(ConfiguredStore("default", "default store", default))
    kept: dict[str, int] = {}
    unique: list[ConfiguredStore] = []
    for store in stores:
        url = store.config.storage_url if store.config else f"?{store.key}"
        if url not in kept:
            kept[url] = len(unique)
            unique.append(store)
        elif store.watched_by_recovery:  # recovery finds the URL through this entry
            unique[kept[url]] = replace(unique[kept[url]], watched_by_recovery=True)
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

