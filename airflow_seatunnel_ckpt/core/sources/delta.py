"""Planning a Delta table source's epochs: the files the commits since the consumed version added.

An epoch reads the commits (consumed, current] from ``_delta_log/<version>.json`` (JSON
lines, parsed as JSON only) and takes their ``add`` actions with ``dataChange=true``; see
:mod:`.planning` for the contract.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any
from urllib.parse import unquote

from airflow_seatunnel_ckpt.core.sources.tables import (
    DataFile,
    TableSourceError,
    consumed_position,
    refuse_other_table,
)


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
    """Parse one ``_delta_log/<version>.json`` commit (JSON lines, never evaluated)."""
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
    """This epoch's offsets for a Delta table source: the files the commits after the consumed version added
    with ``dataChange=true`` (the first epoch: every file, or none for ``start="latest"``)."""
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
        plan["files"] = [f.to_dict() for f in _delta_snapshot_files(table, where)]
        return plan
    commits = [parse_delta_commit(v, _read_log_entry(uri, options, v, consumed, where), table.table_uri, where)
               for v in range(consumed + 1, current + 1)]
    plan["files"] = [f.to_dict() for f in refuse_delta_changes(commits, skip_change_commits, where)]
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
