"""OpenLineage dataset names for the locations and tables the pipelines read and write.

Pure functions over URLs and stage options (no Airflow, client or I/O), so that a DAG file,
a task, the listener and the asset converter name alike, following ``openlineage.client.naming``
(the table of names: docs/LINEAGE.md). Credentials in a URL never reach a name.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

# Schemes whose namespace is the bucket and whose name is the object key (no leading ``/``).
_BUCKET_SCHEMES = {"s3": "s3", "s3a": "s3", "s3n": "s3", "gs": "gs", "gcs": "gs"}
ICEBERG_SCHEME = "iceberg"


@dataclass(frozen=True)
class DatasetName:
    """An OpenLineage dataset identity: ``namespace`` and ``name``."""

    namespace: str
    name: str


def dataset_name(url: str) -> DatasetName:
    """The OpenLineage identity of the location or table ``url`` (see the module docs)."""
    if "://" not in url:
        return DatasetName("file", _clean_path(os.path.abspath(url)))
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    host = parts.netloc.rpartition("@")[2]  # never user:password
    path = _clean_path(parts.path)
    if scheme == ICEBERG_SCHEME:
        return DatasetName(f"{ICEBERG_SCHEME}://{host}", path.lstrip("/"))
    if scheme in _BUCKET_SCHEMES:
        return DatasetName(f"{_BUCKET_SCHEMES[scheme]}://{host}", path.lstrip("/") or "/")
    if scheme in ("file", "local"):
        return DatasetName(f"file://{host}" if host else "file", path)
    return DatasetName(f"{scheme}://{host}", path)


def iceberg_table_url(catalog_name: str, table: str) -> str:
    """The URL the Iceberg sink publishes ``table`` of catalog ``catalog_name`` to."""
    return f"{ICEBERG_SCHEME}://{catalog_name}/{table}"


def source_url(options: Mapping[str, Any]) -> str | None:
    """The location or table URL a stage's source reads (its ``path`` or ``url``; an Iceberg
    source's ``table`` of ``catalog_name``), from its options; None if unknown."""
    kind = str(options.get("type", "file"))
    if kind == "iceberg":
        table = options.get("table")
        if isinstance(table, str) and table:
            return iceberg_table_url(str(options.get("catalog_name") or "default"), table)
        return None
    for key in ("path", "url"):
        value = options.get(key)
        if isinstance(value, str) and value:
            return value
    return None


def _clean_path(path: str) -> str:
    """``path`` normalised (no ``//``, ``.``, trailing ``/``); ``/`` for the root."""
    if not path:
        return "/"
    cleaned = posixpath.normpath(path)
    if cleaned.startswith("//"):  # normpath keeps a POSIX double slash
        cleaned = "/" + cleaned.lstrip("/")
    return cleaned
