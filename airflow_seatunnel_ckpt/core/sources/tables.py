"""Which data files an epoch reads from a table source: planned from table metadata alone.

A table source's offsets are the table's own position (an Iceberg snapshot, a Delta
version, another pipeline's published epochs) plus the exact data files appended since the
last committed epoch's, read by Spark as plain Parquet. Commits that removed data break
the append-only contract and are refused unless skipped (docs/tables/sources.md). This
module holds what the planners share and the planner of published epochs; no Spark here.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import Field
from pydantic.dataclasses import dataclass

from airflow_seatunnel_ckpt.core.errors import CheckpointError, CorruptCheckpointError
from airflow_seatunnel_ckpt.core.models import RECORD, Record, omitted_if
from airflow_seatunnel_ckpt.core.sinks.files import EPOCH_DIR, LATEST, SUCCESS, EpochsPointer


class TableSourceError(CheckpointError):
    """A table source cannot plan an epoch: the table broke the append-only contract, a
    position an earlier epoch consumed is gone, or a data file cannot be read as Parquet."""


@dataclass(config=RECORD)
class DataFile(Record):
    """One data file an epoch reads: its full URI, size, rows and (Delta) partition values, as the Delta log
    writes them (the reader adds them as columns when the file omits them)."""

    path: str
    size: int
    records: int | None = omitted_if(None)
    partition: dict[str, str | None] = Field(default_factory=dict, exclude_if=lambda value: not value)


def planned_files(offsets: Mapping[str, Any], where: str) -> list[DataFile]:
    """The data files a table source's offsets name (``[]`` for an epoch that read none)."""
    files = offsets.get("files") or []
    if not isinstance(files, list):
        raise TableSourceError(f"{where}: offsets have no file list: {dict(offsets)!r}")
    try:
        return [DataFile.from_dict(f, f"{where}: a planned data file entry") for f in files]
    except CorruptCheckpointError as exc:
        raise TableSourceError(str(exc)) from exc


def consumed_position(history: Sequence[Mapping[str, Any]], key: str, where: str) -> tuple[bool, int | None]:
    """``(found, position)``: the ``key`` (snapshot id, version) the newest committed epoch that read the source
    consumed up to (a found position may be None: the table had no snapshot yet)."""
    for entry in reversed(history):
        offsets = entry.get("offsets") or {}
        if key not in offsets:
            continue
        value = offsets[key]
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise TableSourceError(
                f"{where}: committed offsets of epoch {entry.get('epoch')} hold {key}={value!r}, not an integer")
        return True, value
    return False, None


def refuse_other_table(history: Sequence[Mapping[str, Any]], key: str, table_id: str, where: str) -> None:
    """Refuse a table that is not the one the last committed epoch read (same name, new
    table id: dropped and re-created). Its positions start again, so continuing from the
    consumed one would skip or repeat rows."""
    for entry in reversed(history):
        offsets = entry.get("offsets") or {}
        if key not in offsets:
            continue
        recorded = offsets.get("table_id")
        if recorded is not None and str(recorded) != table_id:
            raise TableSourceError(
                f"{where}: the table was re-created: committed epoch {entry.get('epoch')} read table id "
                f"{recorded}, the table there now has id {table_id}, and its positions start again. Use a new "
                "source name to read the new table from its start (or start='latest'), or restore the old table")
        return


# -- another pipeline's published epochs ----------------------------------------------------------

def plan_published_epochs(listing: Mapping[str, Any], history: Sequence[Mapping[str, Any]],
                          where: str, pointer: EpochsPointer | None = None,
                          skip_replays: bool = False) -> dict[str, Any]:
    """This epoch's offsets for a source reading another pipeline's file sink target (docs/tables/sources.md).

    ``listing`` maps every path below the target to its fsspec info; the complete epoch
    directories no committed epoch consumed (a set, not a watermark) and ``pointer`` does not
    hide are planned. An upstream replay of epochs this source read is refused (or, with
    ``skip_replays``, marked read without reading it).
    """
    pointer = pointer or EpochsPointer()
    if LATEST in listing:
        raise TableSourceError(
            f"{where}: the target is a snapshot-mode sink (it has {LATEST}): each of its epochs is the whole "
            "table and older ones are removed, so there are no new rows per epoch to read. Read it with a "
            "plain file source of the directory its _LATEST names, or make the upstream sink mode='changes'")
    consumed: set[int] = set()
    for entry in history:
        epochs = (entry.get("offsets") or {}).get("epochs", [])
        if not isinstance(epochs, list) or not all(isinstance(e, int) for e in epochs):
            raise TableSourceError(f"{where}: committed offsets of epoch {entry.get('epoch')} have no epoch "
                                   f"list: {entry!r}")
        consumed.update(epochs)
    complete: dict[int, str] = {}
    for rel in listing:
        head, _, rest = rel.partition("/")
        match = EPOCH_DIR.match(head)
        if match and rest == SUCCESS and head not in pointer.hidden:
            complete[int(match.group(1))] = head
    epochs = sorted(e for e in complete if e not in consumed)
    skipped = set()
    for e in epochs:
        read = sorted(d for d in pointer.replaced_by.get(complete[e], ())
                      if (m := EPOCH_DIR.match(d)) and int(m.group(1)) in consumed)
        if read and not skip_replays:
            raise TableSourceError(
                f"{where}: upstream epoch {e} is a replay that replaced {read}, which this source already read; "
                "reading it would deliver their rows a second time. Replay this pipeline from the epoch that "
                "read them (it reads the replayed rows instead), or set skip_replays=True to pass over the "
                "replay (its rows are then not read here)")
        if read:
            skipped.add(complete[e])
    files = sorted(rel for rel in listing if _data_file_of(rel, {complete[e] for e in epochs} - skipped))
    return {"epochs": epochs, "files": files, "identity": {f: listing[f] for f in files}}


def _data_file_of(rel: str, dirs: set[str]) -> bool:
    """Whether ``rel`` is a data file inside one of the epoch directories ``dirs``."""
    head, _, rest = rel.partition("/")
    if head not in dirs or not rest:
        return False
    return not any(seg.startswith(("_", ".")) for seg in rest.split("/")) and posixpath.basename(rest) != ""
