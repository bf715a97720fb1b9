"""The Delta Lake commit of a table sink: one table version per sink per epoch, with delta-rs.

:func:`precheck` refuses before the decision what the commit would refuse; :func:`commit`
(also the replay's ``replace``) reads the table's owner and application transaction
(:mod:`.markers`), places the staged files at deterministic paths in the table, and adds
them (or MERGEs an upsert's rows, or applies changes) in one version carrying the epoch.
The steps and decisions are in docs/tables/delta.md.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import DeltaError, TableNotFoundError
from deltalake.schema import Field, Schema
from deltalake.transaction import (
    AddAction,
    CommitProperties,
    RemoveAction,
    Transaction,
    create_table_with_add_actions,
)

from airflow_seatunnel_ckpt.core.config import redact_url
from airflow_seatunnel_ckpt.core.errors import ConfigError, PublishError, SinkRefusedError, StorageError
from airflow_seatunnel_ckpt.core.models import PublishedSink, SinkMode
from airflow_seatunnel_ckpt.core.sinks import (
    CommitConflict,
    SinkCommit,
    changes,
    check_partition_columns,
    check_staged_merge_keys,
    check_staged_rows,
    markers,
    restored_before,
    retry_conflicts,
    rows_of_keys,
    staged_parts,
    staged_schema,
    upserted_rows,
)
from airflow_seatunnel_ckpt.core.sinks.delta_files import footer_stats, partition_dir
from airflow_seatunnel_ckpt.core.sinks.options import ApplyChanges, DeltaSinkOptions
from airflow_seatunnel_ckpt.core.storage import Storage, open_storage
from airflow_seatunnel_ckpt.core.storage.base import FileInfo
from airflow_seatunnel_ckpt.core.storage.publish import PublishMethod, copy_file, holds, staged_problem

log = logging.getLogger(__name__)
#: ``PublishedSink.how`` of an epoch merged into its table.
MERGED = "merged"
#: The column of a replay's MERGE source that marks a touched key without a row (never written).
_DELETE = "__seatunnel_ckpt_delete"

@dataclass(frozen=True)
class PlacedFile:
    """One staged file and where it lives in the table (relative to the table root)."""

    staged: FileInfo
    path: str


def _options(request: SinkCommit) -> DeltaSinkOptions:
    """The sink's typed options."""
    found = request.table
    assert isinstance(found, DeltaSinkOptions), found
    return found


def identify(request: SinkCommit) -> tuple[str, str]:
    """The sink's table URL and how messages name the epoch's commit."""
    uri = _table_uri(request)
    return uri, (f"pipeline {request.pipeline!r} epoch {request.epoch} sink {request.sink.sink!r} "
                 f"(Delta table {redact_url(uri)})")


def table_epoch(request: SinkCommit, target: Storage, table: DeltaTable | None, where: str, *,
                decided: bool) -> tuple[markers.Owner | None, int | None]:
    """The table's owner and this store's pipeline's sink's epoch in it, judged by :func:`markers.check_marker`:
    the one place they are read."""
    owner = markers.read_owner_file(target, where)
    marker = markers.delta_marker(table, request) if table is not None else None
    return owner, markers.check_marker(request, owner, marker, where, decided=decided)


def commit(request: SinkCommit) -> PublishedSink:
    """Commit ``request``'s staged files as one Delta table version (see the module docs)."""
    uri, where = identify(request)
    fs_options, delta_options = storage_options(request, uri)
    target = open_storage(uri, fs_options)
    app_id = markers.delta_app_id(request)
    keys = list(_options(request).merge_keys)
    placed: list[PlacedFile] | None = None  # placed once; every attempt commits the same actions
    actions: list[AddAction] = []
    schema: pa.Schema | None = None
    how = PublishMethod.ALREADY
    location = redact_url(uri)

    def landed() -> tuple[DeltaTable | None, markers.Owner | None, PublishedSink | None]:
        # The table is read first, also after the last failed attempt: a conflict may have
        # been a racing committer landing this very epoch.
        table = load(uri, delta_options, where)
        owner, version = table_epoch(request, target, table, where, decided=True)
        if version is not None and version >= request.epoch:
            log.info("%s: the table already holds the epoch (transaction version %d)", where, version)
            return table, owner, request.published(location, PublishMethod.ALREADY)
        return table, owner, None

    def attempt() -> PublishedSink:
        nonlocal placed, actions, schema, how
        table, owner, already = landed()
        if already is not None:
            return already
        if owner is None:
            markers.claim_owner_file(target, request, where)
        apply = _options(request).apply_changes
        if apply is not None:
            try:
                _apply_changes(request, table, uri, delta_options, apply, app_id, where)
            except (DeltaError, OSError) as exc:  # CommitFailedError too: read the table again
                raise CommitConflict(exc) from exc
            log.info("%s: applied the epoch's changes on %s (%s) as one table version", where, apply.keys,
                     apply.history)
            return request.published(location, MERGED)
        if keys and table is not None:
            try:
                _upsert(request, table, delta_options, keys, app_id, where)
            except (DeltaError, OSError) as exc:  # CommitFailedError too: read the table again
                raise CommitConflict(exc) from exc
            log.info("%s: merged the epoch's rows on %s as one table version", where, keys)
            return request.published(location, MERGED)
        if keys and request.sink.replaces:  # a replay into no table: created from its rows, per key the newest
            rows = upserted_rows(request, keys, where)
            if rows.num_rows:
                try:
                    write_deltalake(_delta_uri(uri), rows, mode="error",
                                    partition_by=list(_options(request).partition_by) or None,
                                    storage_options=delta_options or None,
                                    commit_properties=_properties(request, app_id))
                except (DeltaError, OSError) as exc:  # a racing committer created it: read the table again
                    raise CommitConflict(exc) from exc
            return request.published(location, MERGED)
        if keys:  # a new table: created from the placed files, so the keys must be unique already
            staged = staged_schema(request, where)
            if staged is not None:
                check_staged_merge_keys(request, staged, keys, where)
        if placed is None:
            placed, how = place_files(request, target, where)
            actions, schema = add_actions(request, target, placed, where)
        if table is None and schema is None:
            log.info("%s: an empty snapshot and no table yet: nothing to commit", where)
            return request.published(location, PublishMethod.ALREADY)
        try:
            if table is None:
                assert schema is not None
                _create(request, uri, delta_options, actions, schema, app_id)
            else:
                _append(request, table, actions, schema, app_id, where)
        except (DeltaError, OSError) as exc:  # another writer took the version, a racing create, the store
            raise CommitConflict(exc) from exc
        log.info("%s: committed %d file(s) as one table version", where, len(actions))
        return request.published(location, how if how is not PublishMethod.ALREADY else PublishMethod.COPY)

    try:
        return retry_conflicts(attempt, request.retries, where)
    except CommitConflict as exc:
        problem = exc.__cause__
    already = landed()[2]
    if already is not None:
        return already
    raise StorageError(
        f"{where}: the Delta commit failed {request.retries + 1} time(s), last with: {problem}. The epoch stays "
        "COMMITTING and nothing was removed; the placed files are kept and a retry of the commit (or the "
        "recovery DAG) adds them once")


def precheck(request: SinkCommit) -> None:
    """Refuse, before the commit decision, an epoch the commit would refuse (nothing is written).

    From the table's log, its owner marker and the staged files' Parquet footers (and key columns).
    """
    uri, where = identify(request)
    fs_options, delta_options = storage_options(request, uri)
    keys = list(_options(request).merge_keys)
    partition_by = list(_options(request).partition_by)
    if request.sink.replaces:
        replaced_in = load(uri, delta_options, where)
        if replaced_in is not None and not request.sink.force_replace:
            _refuse_foreign_commits(replaced_in, request, where)
        if replaced_in is not None and keys and not request.sink.full_refresh:
            replay_base(replaced_in, delta_options, request, where)  # the history before the replay is kept
    schema = staged_schema(request, where)
    if schema is None:
        return
    schema = check_staged_rows(request, schema, keys, where)
    apply = _options(request).apply_changes
    table = load(uri, delta_options, where)
    _, version = table_epoch(request, open_storage(uri, fs_options), table, where, decided=False)
    markers.refuse_past(request, version, f"the table's application transaction {markers.delta_app_id(request)!r}",
                        where)
    if table is None:
        check_partition_columns(partition_by, schema, where)
        return
    check_table(table, request, keys, where)
    if apply is not None:
        changes.check_table(table.schema().to_arrow().names, apply, where)
    check_schema(table, schema, partition_by, where)


#: Operations of another writer that change no data file: a replay may pass them.
_METADATA_ONLY = {"ADD COLUMN", "SET TBLPROPERTIES", "UPDATE TABLE METADATA", "CHANGE COLUMN", "VACUUM START",
                  "VACUUM END"}


#: A replay's commit (the contract's replace) is the commit: it swaps when ``request.replaces`` is set.
replace = commit


def held_epoch(request: SinkCommit) -> int | None:
    """This store's pipeline's sink's newest epoch in the table (its application transaction; None: none)."""
    uri, where = identify(request)
    fs_options, delta_options = storage_options(request, uri)
    table = load(uri, delta_options, where)
    return table_epoch(request, open_storage(uri, fs_options), table, where, decided=False)[1]


def _refuse_foreign_commits(table: DeltaTable, request: SinkCommit, where: str) -> None:
    """Refuse a replay when a version after the first replaced epoch's was written by another writer (whose
    change to the replaced epochs' rows the replay would silently drop)."""
    replaced = {str(e) for e in request.sink.replaces}
    ours = {"pipeline": request.pipeline, "sink": request.sink.sink, "store_id": request.resolved_store_id}
    started = False
    for commit in sorted(table.history(), key=lambda c: int(c.get("version", 0))):
        own = all(str(commit.get(k)) == v for k, v in ours.items())
        if own and str(commit.get("epoch")) in replaced:
            started = True
        elif started and not own and str(commit.get("operation")) not in _METADATA_ONLY:
            raise SinkRefusedError(
                f"{where}: table version {commit.get('version')} ({commit.get('operation')}) was committed by "
                f"another writer after epoch {min(request.sink.replaces)} of this sink; replacing epochs "
                f"{sorted(request.sink.replaces)} would undo whatever it changed in their rows. Nothing was "
                "changed. Replay with force=True (--force) to replace those epochs' files anyway (that version's "
                "changes to them are lost, its other rows stay)")


def _replaced_files(table: DeltaTable, request: SinkCommit) -> list[RemoveAction]:
    """Remove actions for the table's current data files that the epochs a replay replaces added."""
    replaced = set(request.sink.replaces)
    now = int(time.time() * 1000)
    removes = []
    for row in pa.table(table.get_add_actions(flatten=True)).to_pylist():
        if markers.placed_epoch(str(row["path"]), request) in replaced:
            partitions = {k[len("partition."):]: None if v is None else str(v)
                          for k, v in row.items() if k.startswith("partition.")}
            removes.append(RemoveAction(str(row["path"]), True, now, int(row["size_bytes"]), partitions or None))
    return removes


def check_table(table: DeltaTable, request: SinkCommit, keys: Sequence[str], where: str) -> None:
    """ConfigError if the table's properties forbid what the sink does (column mapping, append-only)."""
    configuration = table.metadata().configuration
    mapping = configuration.get("delta.columnMapping.mode") or "none"
    if mapping != "none" and not keys:
        # Data files of such a table name columns by their physical names; ours use the
        # logical ones. delta-rs commits them anyway and the table can no longer be read
        # ("Partition column ... not found in schema").
        raise ConfigError(
            f"{where}: the table uses column mapping (delta.columnMapping.mode={mapping}); files written by Spark "
            "without Delta name their columns logically and cannot be added to it. Write to a table without "
            "column mapping, or use merge_keys (delta-rs writes the files of a MERGE itself)")
    if configuration.get("delta.appendOnly") == "true" and (keys or request.sink.mode is SinkMode.SNAPSHOT):
        what = "an upsert sink (merge_keys) updates" if keys else "a snapshot sink replaces"
        raise ConfigError(
            f"{where}: the table is append-only (delta.appendOnly=true) and {what} its rows. "
            "Use mode 'append', or unset delta.appendOnly on the table")


def _table_uri(request: SinkCommit) -> str:
    uri = _options(request).path or request.sink.target_url
    if "://" not in uri:
        uri = f"file://{uri}"
    return uri.rstrip("/")


def storage_options(request: SinkCommit, uri: str) -> tuple[dict[str, Any], dict[str, str]]:
    """The table's fsspec options (to place files) and the same as delta-rs options.

    The store's options when the table is on its protocol, plus the resolvers' secrets: an
    ``fs_options`` mapping in fsspec's form, upper-case keys passed to delta-rs as they are.
    """
    protocol = uri.split("://", 1)[0].lower()
    same = protocol == request.staged.url.split("://", 1)[0].lower()
    fs_options: dict[str, Any] = dict(request.staged.storage_options) if same else {}
    secrets = request.secrets()
    fs_options.update(secrets.get("fs_options") or {})
    delta: dict[str, str] = {}
    if protocol in ("s3", "s3a"):
        client = dict(fs_options.get("client_kwargs") or {})
        endpoint = fs_options.get("endpoint_url") or client.get("endpoint_url")
        region = client.get("region_name") or fs_options.get("region_name")
        for key, value in (("AWS_ACCESS_KEY_ID", fs_options.get("key")),
                           ("AWS_SECRET_ACCESS_KEY", fs_options.get("secret")),
                           ("AWS_SESSION_TOKEN", fs_options.get("token")),
                           ("AWS_ENDPOINT_URL", endpoint), ("AWS_REGION", region)):
            if value:
                delta[key] = str(value)
        if isinstance(endpoint, str) and endpoint.startswith("http://"):
            delta["AWS_ALLOW_HTTP"] = "true"
    delta.update({k: str(v) for k, v in secrets.items() if k.isupper()})
    return fs_options, delta


def _delta_uri(uri: str) -> str:
    # delta-rs takes local tables as plain paths and S3 as s3:// (fsspec's s3a alias too).
    if uri.startswith("file://"):
        return uri[len("file://"):]
    return "s3://" + uri[len("s3a://"):] if uri.startswith("s3a://") else uri


def load(uri: str, options: dict[str, str], where: str) -> DeltaTable | None:
    """The table, or None if there is none at ``uri``."""
    try:
        return DeltaTable(_delta_uri(uri), storage_options=options or None)
    except TableNotFoundError:
        return None
    except (DeltaError, OSError) as exc:
        raise StorageError(f"{where}: cannot read the table's log: {exc}. Check the URL and the credentials "
                           "(storage options or the connection's secret resolver), then retry the commit") from exc


def place_files(request: SinkCommit, target: Storage, where: str) -> tuple[list[PlacedFile], PublishMethod]:
    """Copy the staged files to their deterministic paths in the table (idempotent, verified)."""
    placed, copied = [], False
    staged = request.staged
    for n, f in enumerate(request.sink.files):
        if not f.path.endswith(".parquet"):
            continue  # Spark's bookkeeping never reaches the manifest; anything else is no data file
        source = f"{request.sink.staging}/{f.path}"
        dest = f"{partition_dir(f.path)}{markers.placement(request)}-{n:05d}.parquet"
        if not holds(target, dest, f):
            problem = staged_problem(staged, source, f)
            if problem and not holds(target, dest, f):
                raise PublishError(
                    f"{where}: staged file {staged.describe_path(source)} {problem}, and the table does not hold "
                    f"it at {target.describe_path(dest)} either. Nothing was committed to the table: put the file "
                    "back as the prepared record's manifest describes it, then run the commit or recovery again")
            copy_file(staged, source, target, dest)
            copied = True
        placed.append(PlacedFile(f, dest))
    return placed, PublishMethod.COPY if copied else PublishMethod.ALREADY


def add_actions(request: SinkCommit, target: Storage, placed: Sequence[PlacedFile],
                where: str) -> tuple[list[AddAction], pa.Schema | None]:
    """The add actions of the placed files with rows, and their common Arrow schema (None: no file).

    Paths and sizes are checked here: delta-rs accepts an absolute or missing path without
    complaint and the table becomes unreadable.
    """
    partition_by = list(_options(request).partition_by)
    actions: list[AddAction] = []
    schema: pa.Schema | None = None
    now = int(time.time() * 1000)
    for p in placed:
        if p.path.startswith("/") or "://" in p.path or ".." in p.path.split("/"):
            raise PublishError(f"{where}: data file path {p.path!r} is not relative to the table root")
        size = target.size(p.path) if target.exists(p.path) else None
        if size != p.staged.size:
            found = "missing" if size is None else f"{size} bytes"
            raise PublishError(
                f"{where}: data file {target.describe_path(p.path)} is {found}, "
                f"the manifest says {p.staged.size} bytes; nothing was committed. Run the commit again (it places "
                "the file anew from staging)")
        with target.open_read(p.path) as fh:
            meta = pq.ParquetFile(fh).metadata
        file_schema = meta.schema.to_arrow_schema().remove_metadata()
        if schema is None:
            schema = file_schema
        elif not file_schema.equals(schema):
            raise ConfigError(f"{where}: data file {p.path} has schema {file_schema}, the epoch's first file has "
                              f"{schema}; the stage must write one schema per sink")
        if meta.num_rows == 0:
            continue
        stats, values = footer_stats(meta, file_schema, partition_by, f"{where}: data file {p.path}")
        actions.append(AddAction(p.path, p.staged.size, values, now, True, json.dumps(stats)))
    return actions, schema


def check_schema(table: DeltaTable, schema: pa.Schema, partition_by: Sequence[str], where: str) -> list[Field]:
    """The columns to add to ``table`` for ``schema``; ConfigError for any other change."""
    current = {f.name: f for f in table.schema().fields}
    incoming = {f.name: f for f in Schema.from_arrow(schema).fields}
    table_partitions = list(table.metadata().partition_columns)
    if table_partitions != list(partition_by):
        raise ConfigError(
            f"{where}: the table is partitioned by {table_partitions}, the sink by {list(partition_by)}. Set the "
            "sink's partition_by to the table's, or write to a new table")
    missing = [f"{n} ({f.type})" for n, f in current.items() if n not in incoming]
    changed = [f"{n}: table has {current[n].type}, the epoch's files have {f.type}"
               for n, f in incoming.items() if n in current and str(f.type) != str(current[n].type)]
    if missing or changed:
        raise ConfigError(
            f"{where}: the epoch's schema does not fit the table; nothing was committed. "
            + (f"Columns missing from the files: {', '.join(missing)}. " if missing else "")
            + (f"Changed types: {'; '.join(changed)}. " if changed else "")
            + "Cast or add the columns in the stage to match the table, or write to a new table (and migrate "
            "the old one); only added columns evolve the table by themselves")
    return [Field(f.name, f.type, nullable=True) for n, f in incoming.items() if n not in current]


def _properties(request: SinkCommit, app_id: str) -> CommitProperties:
    # max_commit_retries=0: every conflict goes back to commit(), which reloads the table
    # and reads the transaction version before trying again -- one path for a racing
    # committer of this epoch and for any other writer, instead of delta-rs's own rebase.
    return CommitProperties(
        custom_metadata={"pipeline": request.pipeline, "sink": request.sink.sink, "epoch": request.epoch,
                         "store": request.store, "store_id": request.resolved_store_id},
        max_commit_retries=0, app_transactions=[Transaction(app_id, request.epoch)])


def _create(request: SinkCommit, uri: str, options: dict[str, str], actions: list[AddAction],
            schema: pa.Schema, app_id: str) -> None:
    nullable = Schema([Field(f.name, f.type, nullable=True) for f in Schema.from_arrow(schema).fields])
    create_table_with_add_actions(
        _delta_uri(uri), nullable, actions, mode="error",
        partition_by=list(_options(request).partition_by),
        storage_options=options or None, commit_properties=_properties(request, app_id))


def _append(request: SinkCommit, table: DeltaTable, actions: list[AddAction], schema: pa.Schema | None,
            app_id: str, where: str) -> None:
    partition_by = list(_options(request).partition_by)
    check_table(table, request, (), where)
    added = check_schema(table, schema, partition_by, where) if schema is not None else []
    _add_columns(table, added, where)
    mode = "overwrite" if request.sink.mode is SinkMode.SNAPSHOT else "append"
    files: list[AddAction | RemoveAction] = list(actions)
    if request.sink.replaces and mode == "append":  # a replay: its epochs' files out, the new ones in
        files += _replaced_files(table, request)
    table.create_write_transaction(files, mode, table.schema(), partition_by=partition_by,
                                   commit_properties=_properties(request, app_id))


def _add_columns(table: DeltaTable, added: list[Field], where: str) -> None:
    """Add ``added`` columns in a metadata-only commit before the data's (delta-rs would hide them)."""
    if added:
        log.info("%s: adding column(s) %s to the table", where, [f.name for f in added])
        table.alter.add_columns(added)
        table.update_incremental()


def _upsert(request: SinkCommit, table: DeltaTable, options: dict[str, str], keys: list[str], app_id: str,
            where: str) -> None:
    rows = upserted_rows(request, keys, where)
    check_table(table, request, keys, where)
    partition_by = list(_options(request).partition_by)
    added = check_schema(table, rows.schema, partition_by, where) if rows.num_rows else []
    _add_columns(table, added, where)
    if request.sink.full_refresh:  # the replayed rows are the table's whole content, in one version
        data = rows if rows.num_rows else pa.schema(table.schema().to_arrow()).empty_table()
        write_deltalake(table, data, mode="overwrite", partition_by=partition_by or None,
                        commit_properties=_properties(request, app_id))
        return
    if request.sink.replaces:  # the touched keys as before the replayed epochs, then the new rows
        before, now = _before_replay(table, options, request, where)
        touched, restored = restored_before(before, now, rows.select(keys), keys)
        _replace_keys(table, pa.concat_tables([restored, rows], promote_options="permissive"), touched,
                                  keys, _properties(request, app_id))
        return
    _merge(table, rows, keys, _properties(request, app_id))


def _apply_changes(request: SinkCommit, table: DeltaTable | None, uri: str, options: dict[str, str],
                   apply: ApplyChanges, app_id: str, where: str) -> None:
    """The epoch's changes applied (:mod:`.changes`) to the rows of their keys, swapped in by one MERGE on the
    rows' identity in one version with the application transaction (a full refresh, a new table: from no rows)."""
    parts = [rows for _, rows in staged_parts(request)]
    for rows in parts:
        changes.check_changes(rows, apply, where)  # checked at the decision; the staged files are the same
    staged = staged_schema(request, where)
    partition_by = list(_options(request).partition_by)
    properties = _properties(request, app_id)
    if table is None:
        if staged is not None:
            schema = changes.table_schema(apply, staged)
            rows = changes.applied(schema.empty_table(), parts, apply, schema)
            if rows.num_rows:
                write_deltalake(_delta_uri(uri), rows, mode="error", partition_by=partition_by or None,
                                storage_options=options or None, commit_properties=properties)
        return
    check_table(table, request, apply.keys, where)
    changes.check_table(table.schema().to_arrow().names, apply, where)
    added = check_schema(table, changes.table_schema(apply, staged), partition_by, where) if staged else []
    _add_columns(table, added, where)
    schema = pa.schema(table.schema().to_arrow())
    if request.sink.full_refresh:  # the replayed changes applied to no rows are the whole content, in one version
        rows = changes.applied(schema.empty_table(), parts, apply, schema)
        write_deltalake(table, rows, mode="overwrite", partition_by=partition_by or None,
                        commit_properties=properties)
        return
    if request.sink.replaces:  # the touched keys as before the replayed epochs, the changes applied to them
        before, now = _before_replay(table, options, request, where)
        touched, held = changes.restored_before(before, now, changes.keys_of(parts, apply, now.schema), apply)
        current = now.filter(rows_of_keys(now, touched, apply.keys)) if now.num_rows else now
    else:
        touched = changes.keys_of(parts, apply, schema)
        held = current = _rows_of_keys(table, touched, apply.keys)
    new = changes.applied(held, parts, apply, schema)
    ident = changes.identity(apply)
    rows_now = pa.concat_tables([current.select(ident).cast(new.select(ident).schema), new.select(ident)])
    _replace_keys(table, new, rows_now.group_by(ident).aggregate([]), ident, properties)


def _replace_keys(table: DeltaTable, rows: pa.Table, touched: pa.Table, keys: Sequence[str],
                  properties: CommitProperties) -> dict[str, Any]:
    """One MERGE in one version: every ``touched`` key's row becomes its row in ``rows``, or goes if none
    (``keys``: the columns naming one row; an SCD2 table's include ``__start_at``)."""
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


def _merge(table: DeltaTable, rows: pa.Table, keys: Sequence[str], properties: CommitProperties) -> dict[str, Any]:
    """MERGE ``rows`` into ``table`` on ``keys`` in one version carrying ``properties``; the metrics."""
    predicate = " AND ".join(f"t.`{k}` = s.`{k}`" for k in keys)
    return (table.merge(rows, predicate, source_alias="s", target_alias="t", commit_properties=properties)
            .when_matched_update_all().when_not_matched_insert_all().execute())


def _rows_of_keys(table: DeltaTable, keys: pa.Table, key: Sequence[str]) -> pa.Table:
    """The table's rows whose key is one of ``keys``, picked batch by batch (the table is never held whole).

    Only number, date and time keys are pushed down as filters: delta-rs writes text as
    ``string_view``, whose statistics pyarrow cannot compare with a ``string`` filter.
    """
    import pyarrow.dataset as ds

    dataset = table.to_pyarrow_dataset()
    if not keys.num_rows:
        return dataset.schema.empty_table()
    pushed = None
    for k in key:
        kind = dataset.schema.field(k).type
        if pa.types.is_integer(kind) or pa.types.is_temporal(kind) or pa.types.is_decimal(kind):
            values = ds.field(k).isin(pc.unique(keys.column(k).combine_chunks()).cast(kind))
            pushed = values if pushed is None else pushed & values
    batches = [batch.filter(rows_of_keys(pa.Table.from_batches([batch]), keys, key).combine_chunks())
               for batch in dataset.to_batches(filter=pushed) if batch.num_rows]
    return pa.Table.from_batches(batches, schema=dataset.schema) if batches else dataset.schema.empty_table()


def replay_base(table: DeltaTable, options: dict[str, str], request: SinkCommit, where: str) -> int | None:
    """The table version as of the epoch before a replay's first replaced epoch (None: no table yet), found by
    the epochs in the commit infos; SinkRefusedError when that version's log or files are gone."""
    first = min(request.sink.replaces)
    ours = {"pipeline": request.pipeline, "sink": request.sink.sink, "store_id": request.resolved_store_id}
    history = sorted(table.history(), key=lambda c: int(c.get("version", 0)))
    for commit in history:
        epoch = int(commit.get("epoch") or 0)
        if all(str(commit.get(k)) == v for k, v in ours.items()) and first <= epoch != request.epoch:
            version = int(commit["version"]) - 1
            if version < 0:
                return None
            try:
                _at_version(table, options, version).to_pyarrow_dataset().count_rows()
            except Exception as exc:  # the version's log or files are gone: its rows cannot be read
                cause = (str(exc).splitlines() or [""])[0]
                raise SinkRefusedError(
                    f"{where}: the table's version {version}, before epoch {epoch} of this sink, cannot be read any "
                    f"more ({type(exc).__name__}: {cause}), and a replay from epoch {first} restores the values the "
                    "keys had in it. Nothing was changed. Replay from epoch 1 (a full refresh, which needs no "
                    "history)") from exc
            return version
    committed = table.transaction_version(markers.delta_app_id(request))
    if committed is not None and first <= committed != request.epoch:  # its commit info is gone (log cleanup)
        raise SinkRefusedError(
            f"{where}: the table's log no longer holds the commit of epoch {first} or a later one of this sink (its "
            f"application transaction is at epoch {committed}), and a replay from epoch {first} restores the values "
            "the keys had before it. Nothing was changed. Replay from epoch 1 (a full refresh, which needs no "
            "history)")
    return table.version()


def _before_replay(table: DeltaTable, options: dict[str, str], request: SinkCommit,
                   where: str) -> tuple[pa.Table, pa.Table]:
    """The table's rows as of the version before a replay's first replaced epoch (:func:`replay_base`), and now."""
    base = replay_base(table, options, request, where)
    now = pa.table(table.to_pyarrow_table())
    return (pa.table(_at_version(table, options, base).to_pyarrow_table()) if base is not None
            else now.schema.empty_table()), now


def _at_version(table: DeltaTable, options: dict[str, str], version: int) -> DeltaTable:
    return DeltaTable(table.table_uri, version=version, storage_options=options or None)
