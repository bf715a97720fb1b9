"""Upserts into a Delta table: an epoch's rows replace the table's rows of the same keys.

A sink with ``merge_keys`` (``DeltaSink(..., merge_keys=["customer"])``) holds one row per
key -- typically a key-value state's current values -- so that readers query the table
directly ("totals per customer") instead of picking the newest row per key themselves.

The epoch's staged rows are read (they are one epoch of one keyed result: small) and
merged with delta-rs ``MERGE`` (update every matched row, insert the others). delta-rs
takes the commit properties with the MERGE, so the application transaction
``(seatunnel-ckpt/<store id>/<pipeline>/<sink>, epoch)`` is in the *same* table version as
the merged rows: a retry that finds the transaction version adds nothing, exactly as for appends. Unlike an
append, MERGE writes new data files itself (the staged files are read, not added); a new
table is still created from the placed files (see :mod:`.delta`).

Keys a row is merged on must be unique in the epoch and never NULL (a NULL key matches
nothing and would be inserted again every epoch): both are refused before the commit
decision (:func:`.delta.precheck`, with :func:`core.sinks.check_merge_keys`), and again
before the merge. Keys are never deleted by an upsert.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable
from deltalake.transaction import CommitProperties

from airflow_seatunnel_ckpt.core.sinks import SinkCommit, rows_of_keys
from airflow_seatunnel_ckpt.core.sinks.options import DeltaSinkOptions

#: ``PublishedSink.how`` of an epoch merged into its table.
MERGED = "merged"


def options(request: SinkCommit) -> DeltaSinkOptions:
    """The sink's typed options."""
    found = request.table
    assert isinstance(found, DeltaSinkOptions), found
    return found


def merge_keys(request: SinkCommit) -> list[str]:
    """The sink's merge keys ([] for an append or snapshot sink; checked by the options model)."""
    return list(options(request).merge_keys)


#: The column of a replay's MERGE source that marks a touched key without a row (never written).
_DELETE = "__seatunnel_ckpt_delete"


def replace_keys(table: DeltaTable, rows: pa.Table, touched: pa.Table, keys: Sequence[str],
                 properties: CommitProperties) -> dict[str, Any]:
    """One MERGE in one version: every ``touched`` key's row becomes its row in ``rows``, or goes if none.

    A replay from a later epoch (:func:`core.sinks.restored_before`): the source holds
    ``rows`` and, for the touched keys without one, a row marked for deletion. ``keys`` are
    the columns naming one row (applied changes of an SCD2 table: the keys and
    ``__start_at``, each version a row of its own).
    """
    gone = touched.filter(pc.invert(rows_of_keys(touched, rows, keys))) if rows.num_rows else touched
    source = pa.concat_tables([rows.append_column(_DELETE, pa.repeat(pa.scalar(False), rows.num_rows)),
                               gone.append_column(_DELETE, pa.repeat(pa.scalar(True), gone.num_rows))],
                              promote_options="permissive")
    predicate = " AND ".join(f"t.`{k}` = s.`{k}`" for k in keys)
    columns = {c: f"s.`{c}`" for c in rows.column_names}
    return (table.merge(source, predicate, source_alias="s", target_alias="t", commit_properties=properties)
            .when_matched_delete(predicate=f"s.`{_DELETE}`")
            .when_matched_update({c: v for c, v in columns.items() if c not in keys}, predicate=f"NOT s.`{_DELETE}`")
            .when_not_matched_insert(columns, predicate=f"NOT s.`{_DELETE}`").execute())


def merge(table: DeltaTable, rows: pa.Table, keys: Sequence[str], properties: CommitProperties) -> dict[str, Any]:
    """MERGE ``rows`` into ``table`` on ``keys`` in one version carrying ``properties``; the metrics."""
    predicate = " AND ".join(f"t.`{k}` = s.`{k}`" for k in keys)
    return (table.merge(rows, predicate, source_alias="s", target_alias="t", commit_properties=properties)
            .when_matched_update_all().when_not_matched_insert_all().execute())
