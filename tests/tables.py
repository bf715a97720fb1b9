"""Independent readers of the tables the sinks write: DuckDB with its iceberg and delta
extensions, loaded from the installed extension wheels (no download at test time)."""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: Per process: one in-memory DuckDB database and the extensions loaded into it.
_DATABASE: dict[int, tuple[Any, list[str]]] = {}
_DATABASE_LOCK = threading.Lock()


def duckdb_connection(*extensions: str) -> Any:
    """A new DuckDB connection with ``extensions`` (default: avro, iceberg, delta) loaded.

    The connections of one process are to one in-memory database, into which each extension
    is loaded once: a ``LOAD`` reads and checks the whole extension file in every new
    database (0.3 to 1 s each, the delta one is 77 MB), which was a sixth of a replay test's
    time when each reader made its own database. What a caller creates is therefore seen by
    the other connections unless it is ``TEMP`` (a temporary view is the connection's own).
    A forked child makes a database of its own (DuckDB's threads do not survive a fork).
    """
    import duckdb

    with _DATABASE_LOCK:
        database, loaded = _DATABASE.get(os.getpid()) or (None, [])
        if database is None:
            database = duckdb.connect()
            _DATABASE.clear()
            _DATABASE[os.getpid()] = (database, loaded)
        missing = [name for name in extensions or ("avro", "iceberg", "delta") if name not in loaded]
        if missing:
            wheels = sorted((Path(duckdb.__file__).parent.parent / "duckdb_ext" / "extensions").glob("*/*"))
            assert wheels, "the duckdb-ext-* wheels are not installed (see pyproject.toml, extra 'test')"
            for name in missing:
                database.execute(f"LOAD '{wheels[0] / (name + '.duckdb_extension')}'")
                loaded.append(name)
    return database.cursor()


def duckdb_iceberg_rows(catalog: Mapping[str, str], identifier: str,
                        catalog_name: str = "default") -> list[dict[str, Any]]:
    """Every row of an Iceberg table as DuckDB reads its current metadata file ([] if no table).

    ``catalog_name`` must be the sink's: a SQL catalog keys its rows by it."""
    from pyiceberg.catalog import load_catalog
    from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

    try:
        table = load_catalog(catalog_name, **catalog).load_table(identifier)
    except (NoSuchTableError, NoSuchNamespaceError):
        return []
    con = duckdb_connection("avro", "iceberg")
    metadata = table.metadata_location.removeprefix("file://")
    cursor = con.execute(f"SELECT * FROM iceberg_scan('{metadata}')")
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def duckdb_delta_rows(uri: str, order_by: str = "1") -> list[tuple[Any, ...]]:
    """Every row of a Delta table as DuckDB's delta_scan reads it."""
    return duckdb_connection("delta").execute(
        f"SELECT * FROM delta_scan('{uri}') ORDER BY {order_by}").fetchall()
