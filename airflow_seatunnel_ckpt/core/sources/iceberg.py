"""Planning an Iceberg table source's epochs: the files the append snapshots added.

An epoch walks the snapshot ancestry from the current snapshot back to the one the last
committed epoch consumed and reads the data files the ``append`` snapshots on the way
added (pyiceberg's incremental append scan); see :mod:`.planning` for the contract.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_seatunnel_ckpt.core.catalogs import embedded_catalog
from airflow_seatunnel_ckpt.core.sources.tables import (
    DataFile,
    TableSourceError,
    consumed_position,
    refuse_other_table,
)

if TYPE_CHECKING:
    from pyiceberg.table import Table as IcebergTable

#: Snapshot operations that only add rows / only rewrite files without changing rows (compaction).
ICEBERG_APPEND, ICEBERG_REPLACE = "append", "replace"


def load_iceberg_table(identifier: str, catalog_name: str, catalog: Mapping[str, Any], where: str) -> IcebergTable:
    """Load an Iceberg table through pyiceberg (default: the embedded catalog the sinks use)."""
    from pyiceberg.catalog import load_catalog
    from pyiceberg.exceptions import NoSuchTableError

    props = {k: str(v) for k, v in (dict(catalog) or embedded_catalog()).items()}
    try:
        return load_catalog(catalog_name, **props).load_table(identifier)
    except NoSuchTableError as exc:
        raise TableSourceError(
            f"{where}: Iceberg table {identifier!r} does not exist in catalog {catalog_name!r} "
            f"({props.get('uri', props.get('type', '?'))}); check the source's 'table' and 'catalog', or let the "
            "pipeline that writes it commit its first epoch before this one runs") from exc


@dataclass(frozen=True)
class SnapshotStep:
    """One snapshot on the way from the consumed snapshot to the current one."""

    snapshot_id: int
    parent_id: int | None
    operation: str


def snapshots_since(steps: Mapping[int, SnapshotStep], current: int, consumed: int | None,
                    where: str) -> list[SnapshotStep]:
    """The snapshots after ``consumed`` up to ``current`` (inclusive), oldest first (``steps``: the table's, by id).

    ``consumed`` must be ``current``, an ancestor or an ancestor's expired parent; otherwise the
    table was rolled back or replaced, and reading from the root would deliver rows twice.
    """
    out: list[SnapshotStep] = []
    at: int | None = current
    while at is not None and at != consumed:
        step = steps.get(at)
        if step is None:
            if consumed is None:
                break  # older snapshots expired: their files are reached through the current one
            raise TableSourceError(
                f"{where}: snapshot {at}, between the consumed snapshot {consumed} and the current "
                f"snapshot {current}, has expired from the table metadata, so the rows appended after "
                f"{consumed} cannot be found. Expire snapshots only after every reading pipeline passed "
                "them; to resume from now, reset this source (`seatunnel-ckpt` state tools) or use a new "
                "source name with start='latest'")
        out.append(step)
        if step.parent_id == consumed:
            at = consumed
            break
        at = step.parent_id
    if consumed is not None and at != consumed:
        raise TableSourceError(
            f"{where}: the snapshot {consumed} the last committed epoch consumed is not an ancestor of the "
            f"current snapshot {current}: the table was rolled back, replaced or re-created since. Reading "
            "from its first snapshot would deliver rows twice; restore the table's history, or reset this "
            "source (a new source name with start='latest' resumes from now)")
    return out[::-1]


def refuse_changes(steps: Iterable[SnapshotStep], skip: Mapping[str, bool], where: str) -> list[SnapshotStep]:
    """The append snapshots among ``steps``; a data-changing one is an error unless ``skip`` says so for its
    operation (``replace``, a compaction, is passed over)."""
    appends = []
    for step in steps:
        if step.operation == ICEBERG_APPEND:
            appends.append(step)
        elif step.operation == ICEBERG_REPLACE or skip.get(step.operation, False):
            continue
        else:
            raise TableSourceError(
                f"{where}: snapshot {step.snapshot_id} ({step.operation!r}) removed or rewrote rows, but "
                "a table source reads appended rows only: the rows it changed were already delivered, and its "
                "files would deliver unchanged rows again. Keep the source table append-only, or set "
                f"skip_{step.operation}s=true on the source to pass over {step.operation} snapshots (their "
                "changes are then not seen downstream)")
    return appends


def plan_iceberg(table: IcebergTable, history: Sequence[Mapping[str, Any]], *, start: str,
                 skip: Mapping[str, bool], where: str) -> dict[str, Any]:
    """This epoch's offsets for an Iceberg table source: the data files the ``append`` snapshots after the
    consumed one up to the current one added (the first epoch: every file, or none for ``start="latest"``)."""
    metadata = table.metadata
    current = metadata.current_snapshot()
    found, consumed = consumed_position(history, "snapshot_id", where)
    current_id = current.snapshot_id if current is not None else None
    refuse_other_table(history, "snapshot_id", str(metadata.table_uuid), where)
    plan: dict[str, Any] = {"snapshot_id": current_id, "after_snapshot_id": consumed, "files": [],
                            "table_id": str(metadata.table_uuid)}
    if current_id is None or (found and consumed == current_id):
        return plan
    if not found and start == "latest":
        return plan
    if consumed is None:
        # First epoch, or every epoch so far found the table without a snapshot: all its
        # rows are new to this pipeline, whatever operations produced them.
        refuse_renames(metadata, [s.schema_id for s in metadata.snapshots], where)
        tasks = list(table.scan(snapshot_id=current_id).plan_files())
    else:
        steps = {s.snapshot_id: SnapshotStep(s.snapshot_id, s.parent_snapshot_id,
                                             s.summary.operation.value if s.summary is not None else "unknown")
                 for s in metadata.snapshots}
        appends = refuse_changes(snapshots_since(steps, current_id, consumed, where), skip, where)
        if not appends:
            return plan
        by_id = {s.snapshot_id: s for s in metadata.snapshots}
        refuse_renames(metadata, [by_id[a.snapshot_id].schema_id for a in appends], where)
        # pyiceberg's incremental append scan walks the same ancestry and keeps only the
        # files the append snapshots added; the walk above gave the errors it would not.
        scan = table.incremental_append_scan(from_snapshot_id_exclusive=consumed,
                                             to_snapshot_id_inclusive=current_id)
        tasks = list(scan.plan_files())
    plan["files"] = [f.to_dict() for f in _iceberg_files(tasks, where)]
    return plan


def refuse_renames(metadata: Any, schema_ids: Iterable[int | None], where: str) -> None:
    """Refuse data files written under a schema in which a column had another name (Spark reads Parquet by
    column name: a renamed column would come back as two)."""
    current = metadata.schema()
    for schema_id in sorted({i for i in schema_ids if i is not None and i != current.schema_id}):
        old = metadata.schema_by_id(schema_id)
        if old is None:
            continue
        for field_id in sorted(old.field_ids & current.field_ids):
            before, now = old.find_column_name(field_id), current.find_column_name(field_id)
            if before != now:
                raise TableSourceError(
                    f"{where}: column {before!r} was renamed to {now!r} after data files this epoch reads were "
                    f"written (schema {schema_id}); a plain Parquet read matches columns by name and would split "
                    "it in two. Rename it back, or rewrite the table's data files under the current schema and expire "
                    "the snapshots written before the rename")


def _iceberg_files(tasks: Iterable[Any], where: str) -> list[DataFile]:
    """Data files of scan tasks, refusing what a plain Parquet read would get wrong."""
    out: dict[str, DataFile] = {}
    for task in tasks:
        data = task.file
        if getattr(task, "delete_files", None):
            raise TableSourceError(
                f"{where}: data file {data.file_path} has {len(task.delete_files)} delete file(s) "
                "(merge-on-read deletes), which a plain Parquet read would not apply; compact the table "
                "(rewrite its data files) or keep it append-only")
        fmt = str(getattr(data.file_format, "value", data.file_format)).upper()
        if fmt != "PARQUET":
            raise TableSourceError(f"{where}: data file {data.file_path} is {fmt}; a table source reads "
                                   "Parquet data files only (write the table with Parquet)")
        out[data.file_path] = DataFile(data.file_path, int(data.file_size_in_bytes), int(data.record_count))
    return [out[p] for p in sorted(out)]
