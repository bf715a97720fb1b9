"""Table sinks: a commit-decided epoch's staged Parquet files become one table transaction.

A file sink publishes ``<target>/epoch=<e>/`` and a ``_SUCCESS`` summary no standard
reader honours. A *table* sink (``SinkManifest.table`` set, ``{"type": "iceberg" | "delta",
...}``) instead hands the epoch's verified staged files to its table format, whose own
commit is the moment the rows become visible to every reader of the table:

* the files are first placed at their final, deterministic location inside the table
  (:func:`storage.publish_files`: idempotent, verified against the manifest's sizes and
  CRC32C, never deleting anything);
* then one transaction per sink per epoch adds them, recording the store id, pipeline,
  sink and epoch in the table itself (Iceberg: table properties and the snapshot summary;
  Delta: an application transaction ``txnAppId = seatunnel-ckpt/<store id>/<pipeline>/<sink>``,
  ``txnVersion = epoch``), so a retry, a racing recovery run or the console reads the
  table first and commits nothing twice;
* the table's owner (store id and pipeline) is recorded in it too, and a second owner is
  refused (:mod:`.markers`, which :func:`check_table_identity` exposes to the checks made
  before the commit decision).

The formats live in their own modules and are imported on first use, so a pipeline
without table sinks never imports pyiceberg or deltalake. Each module defines
``commit(request: TableCommit) -> PublishedSink``. Secrets (catalog credentials) are never
in the manifest: :func:`register_secret_resolver` lets the Airflow layer add them from a
connection when the commit runs.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from airflow_seatunnel_ckpt.core.errors import ConfigError
from airflow_seatunnel_ckpt.core.models import PublishedSink, SinkManifest
from airflow_seatunnel_ckpt.core.storage.base import Storage

#: Table type -> module defining ``commit(request) -> PublishedSink`` (imported on first use).
_BUILTIN = {
    "iceberg": ("airflow_seatunnel_ckpt.core.tables.iceberg", "pyiceberg"),
    "delta": ("airflow_seatunnel_ckpt.core.tables.delta", "deltalake"),
}
_FORMATS: dict[str, Callable[[TableCommit], PublishedSink]] = {}
#: Called with a table sink's options before its commit; returns extra properties holding
#: secrets (e.g. a catalog's credentials from an Airflow connection named in the options).
_SECRET_RESOLVERS: list[Callable[[Mapping[str, Any]], Mapping[str, Any]]] = []


@dataclass(frozen=True)
class TableCommit:
    """Everything one table sink's commit needs: which epoch, which files, from where."""

    pipeline: str
    #: The checkpoint store's URL without credentials (recorded in the table beside the epoch).
    store: str
    epoch: int
    sink: SinkManifest
    #: The checkpoint store: the staged files are ``<sink.staging>/<file.path>`` in it.
    staged: Storage
    #: Transient failures are retried this many times (with backoff) before raising.
    retries: int
    #: The store's id (:mod:`core.store_id`), recorded in the table with the epoch. Empty:
    #: read from the store, the parent of ``staged`` (see :func:`markers.store_id_of`).
    store_id: str = ""

    @property
    def table(self) -> Mapping[str, Any]:
        assert self.sink.table is not None
        return self.sink.table

    def secrets(self) -> dict[str, Any]:
        """Extra properties the registered resolvers add for this sink (credentials)."""
        out: dict[str, Any] = {}
        for resolve in _SECRET_RESOLVERS:
            out.update(resolve(self.table))
        return out


def register_table_format(type_name: str, commit: Callable[[TableCommit], PublishedSink]) -> None:
    """Make sinks with ``table={"type": type_name, ...}`` commit through ``commit``."""
    _FORMATS[type_name] = commit


def register_secret_resolver(resolve: Callable[[Mapping[str, Any]], Mapping[str, Any]]) -> None:
    """Add a resolver of a table sink's secrets (called at commit time; see :class:`TableCommit`)."""
    if resolve not in _SECRET_RESOLVERS:
        _SECRET_RESOLVERS.append(resolve)


def check_table_identity(request: TableCommit) -> None:
    """Refuse ``request`` if its table belongs to another pipeline or store, or holds epochs this store lacks.

    Reads the table and writes nothing (a table that does not exist yet passes): the check
    to make before the commit decision, so that a refusal aborts the epoch (the commit
    makes it again before writing). Raises :class:`errors.TableOwnershipError` naming both
    owners and the way out; see :mod:`.markers`. Formats registered by others judge their
    own tables.
    """
    type_name = str(request.table.get("type"))
    if type_name not in _BUILTIN:
        return
    try:
        module = importlib.import_module(_BUILTIN[type_name][0])
    except ImportError:  # the commit names the library to install
        return
    module.check_identity(request)


def commit_table(request: TableCommit) -> PublishedSink:
    """Commit one table sink of a commit-decided epoch (idempotent: see the module docs)."""
    type_name = str(request.table.get("type"))
    commit = _FORMATS.get(type_name)
    if commit is None and type_name in _BUILTIN:
        module, library = _BUILTIN[type_name]
        try:
            commit = importlib.import_module(module).commit
        except ImportError as exc:
            raise ConfigError(
                f"pipeline {request.pipeline!r} epoch {request.epoch}: sink {request.sink.sink!r} is a {type_name} "
                f"table, but {library} cannot be imported here ({exc}). Install it where the commit runs "
                f"(pip install 'airflow-seatunnel-ckpt[{type_name}]'), then retry the commit") from exc
        _FORMATS[type_name] = commit
    if commit is None:
        raise ConfigError(
            f"pipeline {request.pipeline!r} epoch {request.epoch}: sink {request.sink.sink!r} names the unknown "
            f"table type {type_name!r}; known: {sorted({*_BUILTIN, *_FORMATS})}. Register it with "
            "register_table_format() in the process that commits, then retry the commit")
    return commit(request)
