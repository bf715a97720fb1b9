"""Which data files an epoch reads from a table source: planned from table metadata alone.

A table source's offsets are the table's own positions -- an Iceberg snapshot id, a Delta
version, the epochs another pipeline published -- plus the exact data files between the
position the last committed epoch consumed and the one this epoch reads up to. The
runner stores them before the stage runs (``Pipeline.pin_inputs``), so a retry reads the
same files even after the table moved on, and Spark reads them as plain Parquet: no
Iceberg or Delta jars on the cluster.

The contract is *append-only*: an epoch reads each appended row exactly once. A commit
that removed or rewrote data in between (an Iceberg ``overwrite``/``delete`` snapshot, a
Delta commit with ``remove`` actions that change data) breaks it -- the rows removed were
already delivered downstream -- so it is an error naming the snapshot or version, unless
the source is told to skip such commits (as Spark's streaming readers of both formats
are). Compactions (Iceberg ``replace``, Delta ``dataChange=false``) change no data and are
passed over silently.

Everything here is plain Python over pyiceberg/deltalake metadata; it never imports Spark.
The module is over 400 lines because it holds the three planners side by side (Iceberg,
Delta, published epochs) with the shared history and file models they plan into.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from airflow_seatunnel_ckpt.core.errors import CheckpointError, ConfigError

if TYPE_CHECKING:
    from pyiceberg.table import Table as IcebergTable

#: Where a table source starts when no committed epoch read it yet.
START = ("earliest", "latest")
#: The summary file a published epoch directory receives last (core.storage.publish.SUCCESS).
SUCCESS = "_SUCCESS"
#: The pointer file of a snapshot-mode sink target (core.storage.publish.LATEST).
LATEST = "_LATEST"
#: An epoch directory of a file sink target.
EPOCH_DIR = re.compile(r"^epoch=(\d+)$")


class TableSourceError(CheckpointError):
    """A table source cannot plan an epoch: the table broke the append-only contract, a
    position an earlier epoch consumed is gone, or a data file cannot be read as Parquet."""


@dataclass(frozen=True)
class DataFile:
    """One data file an epoch reads: its full URI, size, rows and (Delta) partition values.

    ``partition`` holds the values as the Delta log writes them (strings, ``None`` for
    null); the reader adds them as columns when the file itself omits them.
    """

    path: str
    size: int
    records: int | None = None
    partition: Mapping[str, str | None] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """Plain JSON data for the epoch's offsets."""
        out: dict[str, Any] = {"path": self.path, "size": self.size}
        if self.records is not None:
            out["records"] = self.records
        if self.partition:
            out["partition"] = dict(self.partition)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any], where: str) -> DataFile:
        """Parse :meth:`to_json` output read back from a stored plan."""
        try:
            partition = data.get("partition") or {}
            if not isinstance(partition, dict):
                raise TypeError("partition is not an object")
            return cls(str(data["path"]), int(data["size"]),
                       None if data.get("records") is None else int(data["records"]),
                       {str(k): None if v is None else str(v) for k, v in partition.items()})
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise TableSourceError(f"{where}: a planned data file entry is malformed ({exc}): {data!r}") from exc


def planned_files(offsets: Mapping[str, Any], where: str) -> list[DataFile]:
    """The data files a table source's offsets name (``[]`` for an epoch that read none)."""
    files = offsets.get("files") or []
    if not isinstance(files, list):
        raise TableSourceError(f"{where}: offsets have no file list: {dict(offsets)!r}")
    return [DataFile.from_json(f, where) for f in files]


def consumed_position(history: Sequence[Mapping[str, Any]], key: str, where: str) -> tuple[bool, int | None]:
    """``(found, position)``: the ``key`` (snapshot id, version) the newest committed epoch
    that read the source consumed up to. ``found`` is False when no committed epoch read it
    (an epoch that did not read the source records ``{}`` and is passed over); a found
    position may be ``None`` (the table had no snapshot yet)."""
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


def check_start(name: str, kind: str, start: str) -> str:
    """Validate a table source's ``start`` option."""
    if start not in START:
        raise ConfigError(f"{kind} source {name!r}: start must be one of {START}, got {start!r}; 'earliest' reads "
                          "every row in the table in the first epoch, 'latest' only rows appended after it")
    return start


# -- Iceberg ------------------------------------------------------------------------------------

#: Snapshot operations that add rows only / rewrite without changing data / change data.
ICEBERG_APPEND, ICEBERG_REPLACE = "append", "replace"


def default_catalog_properties() -> dict[str, str]:
    """The embedded catalog a table sink uses when it names none: a SQL catalog on SQLite
    under ``$AIRFLOW_HOME`` (``~/airflow``), with the warehouse beside it."""
    home = os.environ.get("AIRFLOW_HOME") or os.path.expanduser("~/airflow")
    root = os.path.join(os.path.abspath(home), "seatunnel-ckpt-warehouse")
    return {"type": "sql", "uri": f"sqlite:///{root}/catalog.db", "warehouse": f"file://{root}"}


def load_iceberg_table(identifier: str, catalog_name: str, catalog: Mapping[str, Any], where: str) -> IcebergTable:
    """Load an Iceberg table through pyiceberg (default: the embedded catalog)."""
    from pyiceberg.catalog import load_catalog
    from pyiceberg.exceptions import NoSuchTableError

    props = {k: str(v) for k, v in (dict(catalog) or default_catalog_properties()).items()}
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
    """The snapshots after ``consumed`` up to ``current`` (inclusive), oldest first.

    ``steps`` are the snapshots the table metadata still holds, by id. ``consumed`` must
    be ``current`` or one of its ancestors -- or the expired parent of one (expiring old
    snapshots is routine). Otherwise the table was rolled back, replaced or its history
    expired past the consumed snapshot, and re-reading from the root would deliver rows
    twice: an error.
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
    """The append snapshots among ``steps``; a data-changing one is an error unless skipped.

    ``skip`` maps an operation (``overwrite``, ``delete``) to whether the source passes
    over such snapshots. ``replace`` (compaction) changes no rows and is passed over.
    """
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
    """This epoch's offsets for an Iceberg table source.

    ``{"snapshot_id": s, "after_snapshot_id": c, "table_id": u, "files": [...]}``: the data files the
    ``append`` snapshots after ``c`` (the consumed snapshot) up to ``s`` (the current
    one) added; ``c`` missing means the first epoch: every file of ``s`` (``start=
    "earliest"``) or none (``"latest"``).
    """
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
    plan["files"] = [f.to_json() for f in _iceberg_files(tasks, where)]
    return plan


def refuse_renames(metadata: Any, schema_ids: Iterable[int | None], where: str) -> None:
    """Refuse data files written under a schema in which a column had another name.

    Spark reads the Parquet files by column name, so a column renamed since a file was
    written would come back as a second column (old name in old files, NULL elsewhere)
    instead of one column.
    """
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


# -- Delta --------------------------------------------------------------------------------------

def delta_log_entry(version: int) -> str:
    """The commit file of ``version``, relative to the table root."""
    return f"_delta_log/{version:020d}.json"


@dataclass(frozen=True)
class DeltaCommit:
    """What one Delta commit did to the table's rows."""

    version: int
    operation: str
    adds: list[DataFile]
    #: Paths of files removed with ``dataChange=true`` (rows deleted or rewritten).
    removed: list[str]


def parse_delta_commit(version: int, text: str, table_uri: str, where: str) -> DeltaCommit:
    """Parse one ``_delta_log/<version>.json`` commit (JSON lines, never evaluated).

    ``add`` actions with ``dataChange=true`` are new rows; ``dataChange=false`` adds and
    removes are a compaction and change no rows.
    """
    adds: list[DataFile] = []
    removed: list[str] = []
    operation = "unknown"
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            action = json.loads(line)
        except ValueError as exc:
            raise TableSourceError(f"{where}: {delta_log_entry(version)} line {number} is not JSON ({exc})") from exc
        if not isinstance(action, dict):
            raise TableSourceError(f"{where}: {delta_log_entry(version)} line {number} is not a JSON object")
        if "commitInfo" in action:
            operation = str((action["commitInfo"] or {}).get("operation", operation))
        add, remove = action.get("add"), action.get("remove")
        if isinstance(add, dict) and add.get("dataChange", True):
            adds.append(_delta_file(add, table_uri, f"{where}: version {version}"))
        if isinstance(remove, dict) and remove.get("dataChange", True):
            removed.append(str(remove.get("path")))
    return DeltaCommit(version, operation, adds, removed)


def _delta_file(add: Mapping[str, Any], table_uri: str, where: str) -> DataFile:
    """A Delta ``add`` action as a :class:`DataFile` (full URI, partition values as logged)."""
    path = str(add.get("path", ""))
    if add.get("deletionVector"):
        raise TableSourceError(
            f"{where}: data file {path} carries a deletion vector, which a plain Parquet read would not "
            "apply; disable deletion vectors on the table (delta.enableDeletionVectors=false) and purge them "
            "(REORG TABLE ... APPLY (PURGE)), or keep the table append-only")
    records = None
    stats = add.get("stats")
    if isinstance(stats, str) and stats:
        try:
            records = json.loads(stats).get("numRecords")
        except (ValueError, AttributeError):
            records = None
    return DataFile(delta_file_uri(table_uri, path), int(add.get("size") or 0),
                    None if records is None else int(records),
                    {str(k): None if v is None else str(v) for k, v in (add.get("partitionValues") or {}).items()})


def delta_file_uri(table_uri: str, path: str) -> str:
    """A Delta log path as a full URI: relative paths are percent-encoded below the root."""
    if "://" in path:
        return path
    return f"{table_uri.rstrip('/')}/{unquote(path)}"


def delta_partition_string(value: Any) -> str | None:
    """A typed partition value (from ``get_add_actions``) in the Delta log's string form."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime):
        if value.tzinfo is not None:
            value = value.astimezone(UTC).replace(tzinfo=None)
        return str(value.strftime("%Y-%m-%d %H:%M:%S.%f"))
    if isinstance(value, date):
        return value.isoformat()
    return str(value)


def refuse_delta_changes(commits: Iterable[DeltaCommit], skip_change_commits: bool, where: str) -> list[DataFile]:
    """The files the commits appended; a commit that removed rows is an error unless skipped
    (whole, like Delta's ``skipChangeCommits``)."""
    files: list[DataFile] = []
    for commit in commits:
        if commit.removed:
            if skip_change_commits:
                continue
            raise TableSourceError(
                f"{where}: version {commit.version} ({commit.operation}) removed {len(commit.removed)} data "
                f"file(s) (e.g. {commit.removed[0]}), i.e. it deleted or rewrote rows, but a table source reads "
                "appended rows only: the rows it changed were already delivered, and its new files would "
                "deliver unchanged rows again. Keep the source table append-only, or set "
                "skip_change_commits=true on the source to pass over such commits (their changes are then "
                "not seen downstream)")
        files += commit.adds
    return files


def plan_delta(uri: str, storage_options: Mapping[str, str], history: Sequence[Mapping[str, Any]], *,
               start: str, skip_change_commits: bool, where: str) -> dict[str, Any]:
    """This epoch's offsets for a Delta table source.

    ``{"version": v, "after_version": c, "table_id": u, "files": [...]}``: the files the commits
    (c, v] added with ``dataChange=true``; the first epoch reads every file of version
    ``v`` (``start="earliest"``) or none (``"latest"``).
    """
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    options = {k: str(v) for k, v in storage_options.items()}
    try:
        table = DeltaTable(uri, storage_options=options or None)
    except TableNotFoundError as exc:
        raise TableSourceError(
            f"{where}: {uri} is not a Delta table (no _delta_log); check the source's 'path', or let the "
            "pipeline that writes it commit its first epoch before this one runs") from exc
    mapping = table.metadata().configuration.get("delta.columnMapping.mode", "none")
    if mapping not in ("none", None):
        raise TableSourceError(
            f"{where}: {uri} uses column mapping ({mapping}): its Parquet files hold physical column names a "
            "plain Parquet read cannot map back; a table source reads tables without column mapping")
    current = table.version()
    table_id = str(table.metadata().id)
    refuse_other_table(history, "version", table_id, where)
    found, consumed = consumed_position(history, "version", where)
    plan: dict[str, Any] = {"version": current, "after_version": consumed if found else None, "files": [],
                            "table_id": table_id}
    if found and consumed is not None and consumed > current:
        raise TableSourceError(
            f"{where}: the last committed epoch read up to version {consumed}, but the table is at version {current}: "
            "it was re-created. Use a new source name to read the new table from its start, or restore the old table")
    if found and consumed == current:
        return plan
    if not found and start == "latest":
        return plan
    if not found or consumed is None:
        plan["files"] = [f.to_json() for f in _delta_snapshot_files(table, where)]
        return plan
    commits = [parse_delta_commit(v, _read_log_entry(uri, options, v, consumed, where), table.table_uri, where)
               for v in range(consumed + 1, current + 1)]
    plan["files"] = [f.to_json() for f in refuse_delta_changes(commits, skip_change_commits, where)]
    return plan


def _read_log_entry(uri: str, options: Mapping[str, str], version: int, consumed: int, where: str) -> str:
    """The text of one commit file, read with fsspec (delta-rs's Python file handler cannot
    be relied on against every S3-compatible server; its table loading can)."""
    import fsspec

    path = f"{uri.rstrip('/')}/{delta_log_entry(version)}"
    try:
        with fsspec.open(path, "rb", **fsspec_options(uri, options)) as handle:
            return bytes(handle.read()).decode("utf-8")
    except FileNotFoundError as exc:
        raise TableSourceError(
            f"{where}: the commit of version {version} ({path}) is gone (log retention, "
            f"delta.logRetentionDuration) before this pipeline read past version {consumed}; the rows appended "
            "since cannot be told apart. Raise the table's log retention above the pipeline's schedule; to "
            "resume from now, use a new source name with start='latest'") from exc


#: delta-rs S3 option (lower case) -> s3fs argument; the endpoint and region go to the client.
_S3FS_ARGS = {"aws_access_key_id": "key", "aws_secret_access_key": "secret", "aws_session_token": "token"}
_S3FS_CLIENT = {"aws_endpoint_url": "endpoint_url", "aws_endpoint": "endpoint_url", "aws_region": "region_name"}


def fsspec_options(uri: str, options: Mapping[str, str]) -> dict[str, Any]:
    """The fsspec options reaching the same store as delta-rs ``options`` (one set of
    options for the user: delta-rs's). Only S3 keys need translating; elsewhere fsspec
    finds the credentials where delta-rs does (environment, instance metadata)."""
    if not uri.startswith(("s3://", "s3a://")):
        return {}
    out: dict[str, Any] = {}
    client: dict[str, str] = {}
    for key, value in options.items():
        lower = key.lower()
        if lower in _S3FS_ARGS:
            out[_S3FS_ARGS[lower]] = value
        elif lower in _S3FS_CLIENT:
            client[_S3FS_CLIENT[lower]] = value
    if client:
        out["client_kwargs"] = client
    return out


def _delta_snapshot_files(table: Any, where: str) -> list[DataFile]:
    """Every data file of the loaded version (the first epoch of ``start="earliest"``)."""
    import pyarrow as pa

    actions = pa.table(table.get_add_actions(flatten=False)).to_pylist()
    if any(a.get("deletion_vector") for a in actions):
        raise TableSourceError(f"{where}: {table.table_uri} has deletion vectors, which a plain Parquet read "
                               "would not apply; purge them (REORG TABLE ... APPLY (PURGE)) first")
    files = [DataFile(delta_file_uri(table.table_uri, str(a["path"])), int(a["size_bytes"]),
                      None if a.get("num_records") is None else int(a["num_records"]),
                      {str(k): delta_partition_string(v) for k, v in (a.get("partition") or {}).items()})
             for a in actions]
    return sorted(files, key=lambda f: f.path)


# -- another pipeline's published epochs ----------------------------------------------------------

def plan_published_epochs(listing: Mapping[str, Any], history: Sequence[Mapping[str, Any]],
                          where: str) -> dict[str, Any]:
    """This epoch's offsets for a source reading another pipeline's file sink target.

    ``listing`` maps every path below the target (relative to it) to its fsspec info.
    Only epoch directories whose ``_SUCCESS`` exists are planned -- the publisher writes
    it last, so a half-published epoch is never read -- and only those no committed epoch
    consumed (a set, not a watermark: an epoch that publishes late is still read once).
    ``{"epochs": [e, ...], "files": [path, ...], "identity": {...}}``: ``files`` are
    relative to the target, as :class:`FileSource` reads them.
    """
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
        if match and rest == SUCCESS:
            complete[int(match.group(1))] = head
    epochs = sorted(e for e in complete if e not in consumed)
    files = sorted(rel for rel in listing if _data_file_of(rel, {complete[e] for e in epochs}))
    return {"epochs": epochs, "files": files, "identity": {f: listing[f] for f in files}}


def _data_file_of(rel: str, dirs: set[str]) -> bool:
    """Whether ``rel`` is a data file inside one of the epoch directories ``dirs``."""
    head, _, rest = rel.partition("/")
    if head not in dirs or not rest:
        return False
    return not any(seg.startswith(("_", ".")) for seg in rest.split("/")) and posixpath.basename(rest) != ""
