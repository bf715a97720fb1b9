"""Iceberg table commits: one epoch of one sink becomes one Iceberg snapshot, exactly once.

:func:`precheck` refuses before the decision what the commit would refuse; :func:`commit`
(also the replay's ``replace``) reads the table's owner and marker properties
(:mod:`.markers`), places the staged files at deterministic paths in the table, and commits
them with the marker in one snapshot, retrying a conflict from the marker on.
The steps and decisions are in docs/tables/iceberg.md.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import os
import posixpath
import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.exceptions import (
    CommitFailedException,
    CommitStateUnknownException,
    NamespaceAlreadyExistsError,
    NoSuchTableError,
    ResolveError,
    TableAlreadyExistsError,
)
from pyiceberg.expressions import AlwaysTrue, And, BooleanExpression, In
from pyiceberg.io.pyarrow import ArrowScan, _pyarrow_to_schema_without_ids, parquet_file_to_data_file, schema_to_pyarrow
from pyiceberg.manifest import DataFile
from pyiceberg.schema import promote
from pyiceberg.table import DataScan, Table, TableProperties, Transaction
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.table.upsert_util import create_match_filter
from pyiceberg.transforms import IdentityTransform

from airflow_seatunnel_ckpt.core import layout
from airflow_seatunnel_ckpt.core.catalogs import embedded_catalog
from airflow_seatunnel_ckpt.core.config import redact_url
from airflow_seatunnel_ckpt.core.errors import ConfigError, PublishError, SinkRefusedError
from airflow_seatunnel_ckpt.core.models import EMPTY, PublishedSink, SinkMode
from airflow_seatunnel_ckpt.core.sinks import (
    CommitConflict,
    SinkCommit,
    changes,
    check_merge_keys,
    check_partition_columns,
    check_staged_rows,
    markers,
    restored_before,
    retry_conflicts,
    rows_of_keys,
    staged_parts,
    staged_schema,
)
from airflow_seatunnel_ckpt.core.sinks.options import ApplyChanges, IcebergSinkOptions
from airflow_seatunnel_ckpt.core.storage import FileInfo, Storage, backend_for, publish_files

log = logging.getLogger(__name__)

#: Prefix of the table properties and snapshot summary keys this package writes.
PROPERTY_PREFIX = "seatunnel-ckpt"
#: Hidden directory prefix of the staged partition columns (spark/sinks/tables.py).
PARTITION_PREFIX = "__partition_"
APPENDED = "appended"
REPLACED = "replaced"
MERGED = "merged"
ALREADY = "already"


def open_catalog(options: IcebergSinkOptions, secrets: Mapping[str, Any]) -> Catalog:
    """The sink's catalog: its properties plus resolved secrets (neither: the embedded catalog)."""
    given = options.catalog or ({} if options.catalog_conn_id else embedded_catalog())
    props = {str(k): str(v) for k, v in given.items()}
    props.update({str(k): str(v) for k, v in secrets.items()})
    uri = props.get("uri", "")
    if uri.startswith("sqlite:///"):  # SQLite creates the file but not its directory
        os.makedirs(os.path.dirname(uri[len("sqlite:///"):]) or ".", exist_ok=True)
    warehouse = props.get("warehouse", "")
    if warehouse.startswith("file://"):
        os.makedirs(warehouse[len("file://"):], exist_ok=True)
    name = options.catalog_name or "default"
    try:
        return load_catalog(name, **props)
    except (ValueError, TypeError, KeyError, ImportError, NotImplementedError) as exc:  # the options themselves
        raise ConfigError(
            f"cannot open Iceberg catalog {name!r} (properties {sorted(props)}): {redact_url(str(exc))}. Check the "
            "sink's catalog options and its catalog_conn_id connection") from exc
    except Exception as exc:  # the catalog's database or server (a lock held, a connection lost): transient
        raise PublishError(
            f"cannot reach Iceberg catalog {name!r} (properties {sorted(props)}): {type(exc).__name__}: "
            f"{redact_url(str(exc))}. Nothing was changed; the step is tried again (a retry, the recovery DAG) "
            "once the catalog answers. If it never does, check the sink's catalog options") from exc


def identify(request: SinkCommit) -> tuple[str, str]:
    """The sink's table identifier (checked) and how messages name the epoch's commit."""
    identifier = _options(request).table  # checked by the options model: '<namespace>.<table>'
    return identifier, f"{request.where} (table {identifier})"


def _options(request: SinkCommit) -> IcebergSinkOptions:
    """The sink's typed options."""
    found = request.table
    assert isinstance(found, IcebergSinkOptions), found
    return found


def dispose(catalog: Catalog) -> None:
    """Close a SQL catalog's connection pool (not kept from one commit to the next)."""
    engine = getattr(catalog, "engine", None)
    if engine is not None:
        engine.dispose()


@contextlib.contextmanager
def _catalog(request: SinkCommit) -> Iterator[Catalog]:
    catalog = open_catalog(_options(request), request.secrets())
    try:
        yield catalog
    finally:
        dispose(catalog)


def commit(request: SinkCommit) -> PublishedSink:
    """Commit ``request``'s epoch into its Iceberg table exactly once (see the module docs)."""
    identifier, where = identify(request)
    with _catalog(request) as catalog:
        return _commit(catalog, identifier, request, where)


def precheck(request: SinkCommit) -> None:
    """Refuse, before the commit decision, an epoch the commit would refuse (nothing is written).

    From the table's metadata and the staged files' Parquet footers (and key columns).
    """
    identifier, where = identify(request)
    key = list(_options(request).merge_keys)
    if request.sink.replaces:
        with _catalog(request) as catalog:
            table = load(catalog, identifier)
            if table is not None and not request.sink.force_replace:
                _refuse_foreign_commits(table, request, where)
            if table is not None and key and not request.sink.full_refresh:
                replay_base(table, request, where)  # its history before the replayed epochs is still there
    schema = staged_schema(request, where)
    if schema is None:
        return
    schema = check_staged_rows(request, _without_partition_copies(schema), key, where)
    apply = _options(request).apply_changes
    with _catalog(request) as catalog:
        table = load(catalog, identifier)
        if table is None:
            check_partition_columns(_options(request).partition_by, schema, where)
            _check_key(schema.names, request, where)
            return
        marker = f"the table's marker {markers.marker_keys(request.pipeline, request.sink.sink)['epoch']}"
        markers.refuse_past(request, _committed_epoch(table, request, where, decided=False), marker, where)
        if apply is not None:
            changes.check_table(table.schema().column_names, apply, where)
        _check_schema(table, schema, where)
        _check_partitioning(table, request, where)
        _check_key(table.schema().column_names, request, where)


#: A replay's commit (the contract's replace) is the commit: it swaps when ``request.replaces`` is set.
replace = commit


def held_epoch(request: SinkCommit) -> int | None:
    """This store's pipeline's sink's newest epoch in the table (its marker; None: none). Reads only."""
    identifier, where = identify(request)
    with _catalog(request) as catalog:
        table = load(catalog, identifier)
        epoch = -1 if table is None else _committed_epoch(table, request, where, decided=False)
    return None if epoch < 0 else epoch


def _refuse_foreign_commits(table: Table, request: SinkCommit, where: str) -> None:
    """Refuse a replay when a snapshot after the first replaced epoch's is not this sink's own (whose change
    to the replaced epochs' rows the replay would silently drop)."""
    replaced = set(request.sink.replaces)
    started = False
    for snapshot, summary, own in _snapshots(table, request):
        if own and int(summary.get(f"{PROPERTY_PREFIX}.epoch", "0")) in replaced:
            started = True
        elif started and not own:
            operation = snapshot.summary.operation.value if snapshot.summary is not None else "unknown"
            raise SinkRefusedError(
                f"{where}: snapshot {snapshot.snapshot_id} ({operation}) was committed to the table by another "
                f"writer after epoch {min(replaced)} of this sink; replacing epochs {sorted(replaced)} would undo "
                "whatever it changed in their rows. Nothing was changed. Replay with force=True (--force) to "
                "replace those epochs' files anyway (that snapshot's changes to them are lost, its other rows "
                "stay)")


def _snapshots(table: Table, request: SinkCommit) -> Iterator[tuple[Snapshot, dict[str, str], bool]]:
    """The table's snapshots, oldest first, each with its summary and whether this store's pipeline's sink
    committed it (by the summary)."""
    ours = {f"{PROPERTY_PREFIX}.pipeline": request.pipeline, f"{PROPERTY_PREFIX}.sink": request.sink.sink,
            f"{PROPERTY_PREFIX}.store-id": request.resolved_store_id}
    for snapshot in sorted(table.snapshots(), key=lambda s: (s.sequence_number or 0, s.timestamp_ms)):
        summary = snapshot.summary.additional_properties if snapshot.summary is not None else {}
        yield snapshot, summary, all(summary.get(k) == v for k, v in ours.items())


def _commit(catalog: Catalog, identifier: str, request: SinkCommit, where: str) -> PublishedSink:
    def attempt() -> PublishedSink:
        table = load(catalog, identifier)
        if table is not None and _committed_epoch(table, request, where) >= request.epoch:
            return request.published(_location(table), ALREADY)
        if table is None:
            if not request.sink.files:  # an empty snapshot of a table that never existed
                return request.published("", EMPTY)
            table = _create(catalog, identifier, _table_schema(request, _staged_schema(request, None)), request,
                            where)
            if _committed_epoch(table, request, where) >= request.epoch:
                return request.published(_location(table), ALREADY)
        placed = table_storage(table, request)
        apply = _options(request).apply_changes
        file_schema = _table_schema(request, _staged_schema(request, placed)) if request.sink.files else None
        if apply is not None:
            changes.check_table(table.schema().column_names, apply, where)
        added = _check_schema(table, file_schema, where) if file_schema is not None else []
        _check_partitioning(table, request, where)
        _check_key(table.schema().column_names, request, where)
        # Applied changes are new rows the commit writes; the staged change files are only read.
        paths = place_files(request, placed) if apply is None else []
        try:
            how = _commit_once(table, request, placed, paths, file_schema, added, where)
        except (CommitFailedException, CommitStateUnknownException) as exc:
            # Another committer may have landed this very epoch: reload and read the marker.
            raise CommitConflict(exc) from exc
        return request.published(_location(table), how)

    try:
        return retry_conflicts(attempt, request.retries, where)
    except CommitConflict as exc:
        raise PublishError(
            f"{where}: the Iceberg commit failed {request.retries + 1} time(s), last: {exc.__cause__}. Nothing is "
            "duplicated (the marker is read before every try); the epoch stays COMMITTING: run the "
            "commit or the recovery DAG again") from exc.__cause__


def load(catalog: Catalog, identifier: str) -> Table | None:
    """The table, or None if the catalog has none of that name."""
    try:
        return catalog.load_table(identifier)
    except NoSuchTableError:
        return None


def _committed_epoch(table: Table, request: SinkCommit, where: str, *, decided: bool = True) -> int:
    """This store's last epoch of the sink in the table (-1: none), judged by :func:`markers.check_marker`: the
    one place its marker is read."""
    props = table.metadata.properties
    marker = markers.iceberg_marker(props, request, where)
    committed = markers.check_marker(request, markers.Owner.parse(props), marker, where, decided=decided)
    return -1 if committed is None else committed


def _table_schema(request: SinkCommit, staged: pa.Schema) -> pa.Schema:
    """The table's schema for the epoch's staged files: theirs, or that of their changes applied."""
    apply = _options(request).apply_changes
    return staged if apply is None else changes.table_schema(apply, staged)


def _create(catalog: Catalog, identifier: str, schema: pa.Schema, request: SinkCommit, where: str) -> Table:
    namespace = identifier.rsplit(".", 1)[0]
    with contextlib.suppress(NamespaceAlreadyExistsError):  # a concurrent committer created it
        catalog.create_namespace_if_not_exists(namespace)
    partition_by = list(_options(request).partition_by)
    check_partition_columns(partition_by, schema, where)
    try:
        tx = catalog.create_table_transaction(identifier, schema)
        if partition_by:
            with tx.update_spec() as spec:
                for column in partition_by:
                    spec.add_identity(column)
        tx.commit_transaction()
        log.info("%s: created the table, partitioned by %s", where, partition_by or "nothing")
    except TableAlreadyExistsError:  # a concurrent committer created it
        pass
    return catalog.load_table(identifier)


def table_storage(table: Table, request: SinkCommit) -> Storage:
    """The table's location as a :class:`Storage` (credentials: catalog's S3 properties or the store's)."""
    location = table.metadata.location.rstrip("/")
    options: dict[str, Any] = {}
    props = {**table.io.properties}
    if location.startswith(("s3://", "s3a://")):
        client: dict[str, Any] = {}
        if "s3.endpoint" in props:
            client["endpoint_url"] = props["s3.endpoint"]
        if "s3.region" in props or "client.region" in props:
            client["region_name"] = props.get("s3.region") or props["client.region"]
        if "s3.access-key-id" in props:
            options["key"] = props["s3.access-key-id"]
            options["secret"] = props.get("s3.secret-access-key")
        if client:
            options["client_kwargs"] = client
        location = "s3://" + location.split("://", 1)[1]
    if not options and location.split("://", 1)[0] == request.staged.protocol:
        options = dict(request.staged.storage_options)  # same store kind: reuse the store's access
    # Not open_storage(): its probe for conditional create would refuse an object store
    # without it, and placing data files needs none (the table's own commit decides).
    return backend_for(location.split("://", 1)[0].lower())(location, options)


def final_dir(request: SinkCommit, staged_dir: str) -> str:
    """Where the files of one staged directory go, relative to the table location: ``__partition_region=EU``
    becomes ``data/region=EU/<placement>`` (:func:`markers.placement`)."""
    parts = [p[len(PARTITION_PREFIX):] if p.startswith(PARTITION_PREFIX) else p
             for p in staged_dir.split("/") if p]
    return posixpath.join("data", *parts, markers.placement(request))


def _groups(request: SinkCommit) -> dict[str, list[FileInfo]]:
    groups: dict[str, list[FileInfo]] = {}
    for f in request.sink.files:
        folder, name = posixpath.split(f.path)
        groups.setdefault(folder, []).append(FileInfo(name, f.size, f.crc32c))
    return groups


def place_files(request: SinkCommit, placed: Storage) -> list[str]:
    """Put the staged files at their final paths in the table (idempotent); their URLs."""
    urls: list[str] = []
    for folder, files in sorted(_groups(request).items()):
        src = posixpath.join(request.sink.staging, folder) if folder else request.sink.staging
        dst = final_dir(request, folder)
        publish_files(request.staged, src, placed, dst, files)
        urls += [placed.url_of(f"{dst}/{f.path}") for f in files]
    return urls


def _staged_schema(request: SinkCommit, placed: Storage | None) -> pa.Schema:
    """The Parquet schema of the epoch's first file: from staging, or where it was placed."""
    folder, files = sorted(_groups(request).items())[0]
    candidates = [(request.staged, posixpath.join(request.sink.staging, folder, files[0].path))]
    if placed is not None:
        candidates.append((placed, f"{final_dir(request, folder)}/{files[0].path}"))
    for storage, path in candidates:
        try:
            with storage.open_read(path) as fh:
                schema = pq.read_schema(fh)
        except FileNotFoundError:
            continue
        return _without_partition_copies(schema)
    raise PublishError(f"cannot read the schema of {candidates[0][0].describe_path(candidates[0][1])}: it is "
                       "neither in staging nor in the table; the epoch stays COMMITTING")


def _without_partition_copies(schema: pa.Schema) -> pa.Schema:
    """``schema`` without hidden partition copies (never written by TableSink, but never let into a table)."""
    return pa.schema([f for f in schema if not f.name.startswith(PARTITION_PREFIX)], schema.metadata)


def _check_schema(table: Table, file_schema: pa.Schema, where: str) -> list[str]:
    """Columns to add to the table; ConfigError for every other difference (nothing committed)."""
    current = table.schema()
    incoming = _pyarrow_to_schema_without_ids(file_schema)
    have = {f.name: f for f in current.fields}
    new = {f.name: f for f in incoming.fields}
    problems = []
    for name, field in have.items():
        if name not in new:
            problems.append(f"column {name!r} ({field.field_type}) is in the table but not in the epoch's files: "
                            f"write it again (null where unknown), or drop it from the table first "
                            f"(table.update_schema().delete_column({name!r}))")
            continue
        got = new[name]
        if got.field_type != field.field_type and field.field_type.is_primitive:
            try:
                promote(got.field_type, field.field_type)
            except ResolveError:
                problems.append(f"column {name!r} is {field.field_type} in the table but {got.field_type} in the "
                                f"epoch's files: cast it back to {field.field_type} in the stage, or write a new "
                                "table")
                continue
        if field.required and not got.required:
            problems.append(f"column {name!r} is required in the table but nullable in the epoch's files: make "
                            f"it optional (table.update_schema().make_column_optional({name!r})) or make the "
                            "stage's column non-null")
    if problems:
        raise ConfigError(f"{where}: the epoch's files do not fit the table's schema; nothing was committed. "
                          + "; ".join(problems))
    return [name for name in new if name not in have]


def _check_partitioning(table: Table, request: SinkCommit, where: str) -> None:
    wanted = list(_options(request).partition_by)
    schema = table.schema()
    spec = table.spec()
    found = [schema.find_column_name(f.source_id) for f in spec.fields]
    if found != wanted or not all(isinstance(f.transform, IdentityTransform) for f in spec.fields):
        raise ConfigError(
            f"{where}: the table is partitioned by {[str(f) for f in spec.fields] or 'nothing'}, the sink stages "
            f"files partitioned by identity of {wanted or 'nothing'}; each data file must hold one value of each "
            "partition field. Set partition_by to the table's identity partition columns, or write a new table")


def _check_key(columns: Sequence[str], request: SinkCommit, where: str) -> None:
    # merge_keys with another mode than upsert are refused by the options model already.
    missing = [k for k in _options(request).merge_keys if k not in columns]
    if missing:
        raise ConfigError(f"{where}: upsert key column(s) {missing} are not in the table "
                          f"(columns: {list(columns)}); fix the sink's merge_keys option")


def _commit_once(table: Table, request: SinkCommit, placed: Storage, paths: Sequence[str],
                 file_schema: pa.Schema | None, added: Sequence[str], where: str) -> str:
    """One transaction: (schema additions,) one snapshot of the files, the marker. Raises on conflict."""
    summary = {f"{PROPERTY_PREFIX}.pipeline": request.pipeline, f"{PROPERTY_PREFIX}.sink": request.sink.sink,
               f"{PROPERTY_PREFIX}.epoch": str(request.epoch), f"{PROPERTY_PREFIX}.store": request.store,
               f"{PROPERTY_PREFIX}.store-id": request.resolved_store_id}
    view = _without_library_retry(table)
    snapshot = request.sink.mode is SinkMode.SNAPSHOT
    key = list(_options(request).merge_keys)
    replaced = set(request.sink.replaces)
    try:
        with view.transaction() as tx:
            if added and file_schema is not None:
                with tx.update_schema() as update:
                    update.union_by_name(pa.schema([file_schema.field(name) for name in added]))
            old: list[DataFile] = []
            rewritten: list[DataFile] = []
            whole = snapshot or (bool(key) and request.sink.full_refresh)
            apply = _options(request).apply_changes
            if key and replaced and apply is None:  # a replay's rows: per key the newest replayed epoch's
                paths = _last_per_key(view, request, placed, key, where)
            if apply is not None:  # the changes' keys' rows out, their rows with the changes applied in
                old, rewritten, paths = _apply_changes(tx, view, request, placed, apply, where)
            elif key and replaced and not whole:  # the keys the replay touches as before it, then its rows
                old, rewritten, restored = _restore_before(tx, view, request, placed, paths, key, where)
                paths = [*paths, *restored]
            elif key and not whole:  # upsert: the epoch's rows replace the table's rows of the same keys
                old, rewritten = _without_keys(tx, view, request, placed, _epoch_keys(view, paths, key, where), key)
            elif whole or replaced:  # every current file (snapshot, full refresh) or the replaced epochs' (replay)
                old = _current_files(tx, view, request, whole)
            if not old and not snapshot and not replaced:
                tx.add_files(list(paths), snapshot_properties=summary, check_duplicate_files=True)
            else:  # one OVERWRITE snapshot: the old files out, their rewrites and the epoch's files in
                if tx.table_metadata.name_mapping() is None:  # as add_files does: files carry no field ids
                    tx.set_properties({TableProperties.DEFAULT_NAME_MAPPING:
                                       tx.table_metadata.schema().name_mapping.model_dump_json()})
                with tx.update_snapshot(snapshot_properties=summary).overwrite() as overwrite:
                    for data_file in old:
                        overwrite.delete_data_file(data_file)
                    for data_file in rewritten:
                        overwrite.append_data_file(data_file)
                    for path in paths:
                        overwrite.append_data_file(parquet_file_to_data_file(view.io, tx.table_metadata, path))
            tx.set_properties(markers.marker_for(request))
    except ValueError as exc:  # pyiceberg's schema/partition/duplicate checks, before the commit
        raise ConfigError(f"{where}: the table refused the epoch's files before committing ({exc}); nothing "
                          "was committed. Fix the cause, then retry the commit") from exc
    table.metadata, table.metadata_location = view.metadata, view.metadata_location
    return REPLACED if snapshot or request.sink.replaces else MERGED if key else APPENDED


def _current_files(tx: Transaction, view: Table, request: SinkCommit, whole: bool) -> list[DataFile]:
    """The current data files: every one (``whole``) or the replaced epochs' (a replay)."""
    current = tx.table_metadata.current_snapshot()
    replaced = set(request.sink.replaces)
    return [entry.data_file for manifest in (current.manifests(view.io) if current else [])
            for entry in manifest.fetch_manifest_entry(view.io, discard_deleted=True)
            if whole or markers.placed_epoch(entry.data_file.file_path, request) in replaced]


def _apply_changes(tx: Transaction, view: Table, request: SinkCommit, placed: Storage, apply: ApplyChanges,
                   where: str) -> tuple[list[DataFile], list[DataFile], list[str]]:
    """The epoch's changes applied (:mod:`.changes`): the data files holding the changes' keys out
    (and their rewrites without those keys' rows), the keys' new rows written to files in (pyiceberg has
    no predicated MERGE)."""
    key = list(apply.keys)
    schema = tx.table_metadata.schema()
    file_schema = schema_to_pyarrow(schema, include_field_ids=False)
    parts = [rows for _, rows in staged_parts(request)]
    for rows in parts:
        changes.check_changes(rows, apply, where)  # checked at the decision; the staged files are the same
    rewritten: list[DataFile] = []
    if request.sink.full_refresh:
        old = _current_files(tx, view, request, whole=True)
        held = file_schema.empty_table()
    elif request.sink.replaces:
        before, now = _before_replay(view, request, where)
        touched, held = changes.restored_before(before, now, changes.keys_of(parts, apply, now.schema), apply)
        old, rewritten = _without_keys(tx, view, request, placed, touched, key)
    else:
        touched = changes.keys_of(parts, apply, file_schema)
        found: list[pa.Table] = []  # the keys' rows, from the files read to rewrite them (no second scan)
        old, rewritten = _without_keys(tx, view, request, placed, touched, key, found)
        held = pa.concat_tables(found) if found else file_schema.empty_table()
    new = changes.applied(held, parts, apply, file_schema)
    return old, rewritten, _write_rows(tx, request, placed, new, "applied")


def _files_of_keys(keys: pa.Table, key: Sequence[str]) -> BooleanExpression:
    """A filter that every file holding one of ``keys`` passes: a single key's values; a composite key's, each
    column's values (a superset: the rows are picked exactly by :func:`rows_of_keys`). pyiceberg's match filter
    of a composite key (an Or of one And per key) takes time quadratic in the keys to build and to plan with."""
    if len(key) == 1:
        return create_match_filter(keys, list(key))
    # In.__new__ takes (term, literals); mypy reads the pydantic model's fields (term, type, values) instead.
    return And(*[In(k, set(pc.unique(keys.column(k)).to_pylist())) for k in key])  # type: ignore[call-arg, arg-type]


def _without_keys(tx: Transaction, view: Table, request: SinkCommit, placed: Storage, keys: pa.Table,
                  key: Sequence[str], found: list[pa.Table] | None = None) -> tuple[list[DataFile], list[DataFile]]:
    """The current data files holding any of the epoch's ``keys``, and their rewrites without those rows.

    Copy-on-write as ``Transaction.delete`` does it, but into the epoch's own snapshot (a
    separate delete snapshot could be pinned by time-travel readers). A rewrite's name is fixed
    by the file it rewrites, so a retried commit adds that same file (two racing committers
    write the same bytes); not ``create_exclusive``: placing needs no conditional writes.
    """
    metadata = tx.table_metadata
    if not keys.num_rows or metadata.current_snapshot() is None:
        return [], []
    schema = metadata.schema()
    file_schema = schema_to_pyarrow(schema, include_field_ids=True)
    old: list[DataFile] = []
    rewritten: list[DataFile] = []
    for task in DataScan(metadata, view.io, row_filter=_files_of_keys(keys, key)).plan_files():
        rows = ArrowScan(metadata, view.io, schema, AlwaysTrue()).to_table([task])
        hit = rows_of_keys(rows, keys, key)
        if not pc.any(hit).as_py():
            continue  # the statistics could not rule the file out, its rows can
        old.append(task.file)
        if found is not None:
            found.append(rows.filter(hit))
        kept = rows.filter(pc.invert(hit))
        if not kept.num_rows:
            continue
        spec = metadata.specs()[task.file.spec_id]
        origin = "\n".join([task.file.file_path, *sorted(d.file_path for d in task.delete_files)])
        name = f"rewritten-{hashlib.sha256(origin.encode()).hexdigest()[:24]}.parquet"
        path = posixpath.join("data", spec.partition_to_path(task.file.partition, schema) if spec.fields else "",
                              markers.placement(request), name)
        if not placed.exists(path):
            buf = io.BytesIO()
            pq.write_table(kept.cast(file_schema), buf)
            placed.write_atomic(path, buf.getvalue())
        rewritten.append(parquet_file_to_data_file(view.io, metadata, placed.url_of(path)))
    return old, rewritten


def replay_base(table: Table, request: SinkCommit, where: str) -> Snapshot | None:
    """The table's snapshot as of the epoch before a replay's first replaced epoch (None: the empty table),
    found by the epochs in the snapshot summaries; SinkRefusedError when it was expired."""
    first = min(request.sink.replaces)
    for snapshot, summary, own in _snapshots(table, request):
        epoch = int(summary.get(f"{PROPERTY_PREFIX}.epoch", "0"))
        if own and first <= epoch != request.epoch:
            # An expired parent's id may be dropped from its child: the summary's record counts
            # still tell whether the table before the snapshot held rows.
            held = sum(int(summary.get(k, "0")) * sign for k, sign in (("total-records", 1), ("added-records", -1),
                                                                       ("deleted-records", 1)))
            if snapshot.parent_snapshot_id is None and not held:
                return None
            base = table.snapshot_by_id(snapshot.parent_snapshot_id) if snapshot.parent_snapshot_id else None
            if base is None:
                raise SinkRefusedError(
                    f"{where}: the table's snapshot before epoch {epoch} of this sink (its {held} row(s)) was expired, "
                    f"and a replay from epoch {first} restores the values the keys had in it. Nothing was changed. "
                    "Replay from epoch 1 (a full refresh, which needs no history)")
            return base
    return table.current_snapshot()


def _before_replay(table: Table, request: SinkCommit, where: str) -> tuple[pa.Table, pa.Table]:
    """The table's rows as of the epoch before a replay's first replaced epoch (:func:`replay_base`), and now."""
    base = replay_base(table, request, where)
    now = table.scan().to_arrow()
    return (table.scan(snapshot_id=base.snapshot_id).to_arrow() if base is not None
            else now.schema.empty_table()), now


def _restore_before(tx: Transaction, view: Table, request: SinkCommit, placed: Storage, paths: Sequence[str],
                    key: Sequence[str], where: str) -> tuple[list[DataFile], list[DataFile], list[str]]:
    """A replay from a later epoch: the touched keys' current files out (and their rewrites), the rows
    they had before the replayed epochs (:func:`core.sinks.restored_before`) written to files in."""
    file_schema = schema_to_pyarrow(tx.table_metadata.schema(), include_field_ids=False)
    before, now = _before_replay(view, request, where)
    touched, restored = restored_before(before, now, _epoch_keys(view, paths, key, where), list(key))
    old, rewritten = _without_keys(tx, view, request, placed, touched, key)
    columns = [restored.column(n).cast(f.type) if n in restored.column_names else pa.nulls(restored.num_rows, f.type)
               for n, f in zip(file_schema.names, file_schema, strict=True)]
    restored = pa.Table.from_arrays(columns, schema=file_schema) if restored.num_rows else file_schema.empty_table()
    return old, rewritten, _write_rows(tx, request, placed, restored, "restored")


def _write_rows(tx: Transaction, request: SinkCommit, placed: Storage, rows: pa.Table, prefix: str) -> list[str]:
    """``rows`` (the table's schema) written whole to ``<prefix>-<n>-<digest>.parquet`` files in the epoch's
    placement, one per partition; their URLs. Named by their bytes: a retried commit finds the same file."""
    schema = tx.table_metadata.schema()
    partition = [schema.find_column_name(f.source_id) or "" for f in tx.table_metadata.spec().fields]
    groups = rows.select(partition).group_by(partition).aggregate([]).to_pylist() if partition else [{}]
    urls = []
    for n, values in enumerate(sorted(groups, key=repr)):
        part = rows
        for column, value in values.items():
            part = part.filter(pc.is_null(part.column(column)) if value is None
                               else pc.equal(part.column(column), value))
        if not part.num_rows:
            continue
        buf = io.BytesIO()
        pq.write_table(part, buf)
        folder = "/".join(f"{c}={urllib.parse.quote(str(v), safe='')}" for c, v in values.items())
        name = f"{prefix}-{n}-{hashlib.sha256(buf.getvalue()).hexdigest()[:16]}.parquet"
        path = posixpath.join("data", folder, markers.placement(request), name)
        if not placed.exists(path):
            placed.write_atomic(path, buf.getvalue())
        urls.append(placed.url_of(path))
    return urls


def _last_per_key(table: Table, request: SinkCommit, placed: Storage, key: Sequence[str], where: str) -> list[str]:
    """A replay's placed files (URLs) without the rows whose key a later replayed epoch writes again (a file
    losing some is written again beside it as ``last-<name>``, one losing all is left out)."""
    by_epoch: dict[int, list[str]] = {}
    for folder, files in _groups(request).items():
        epoch = layout.replayed_epoch(folder) or request.epoch
        by_epoch.setdefault(epoch, []).extend(f"{final_dir(request, folder)}/{f.path}" for f in files)
    kept: list[str] = []
    later: list[pa.Table] = []
    for epoch in sorted(by_epoch, reverse=True):
        keys_of = {}
        for path in sorted(by_epoch[epoch]):
            with table.io.new_input(placed.url_of(path)).open() as fh:
                keys_of[path] = pq.read_table(fh, columns=list(key))
        check_merge_keys(pa.concat_tables(keys_of.values()), list(key), f"{where} (replayed epoch {epoch})")
        for path, keys in keys_of.items():
            hit = rows_of_keys(keys, pa.concat_tables(later), key) if later else None
            if hit is None or not pc.any(hit).as_py():
                kept.append(placed.url_of(path))
                continue
            if pc.all(hit).as_py():
                continue
            folder, name = posixpath.split(path)
            last = f"{folder}/last-{name}"
            if not placed.exists(last):
                with table.io.new_input(placed.url_of(path)).open() as fh:
                    rows = pq.read_table(fh)
                buf = io.BytesIO()
                pq.write_table(rows.filter(pc.invert(hit)), buf)
                placed.write_atomic(last, buf.getvalue())
            kept.append(placed.url_of(last))
        later += keys_of.values()
    return kept


def _epoch_keys(table: Table, paths: Sequence[str], key: Sequence[str], where: str) -> pa.Table:
    """The key columns of the epoch's placed files; ConfigError if a key is NULL or appears twice
    (refused before the decision already, :func:`precheck`)."""
    parts = []
    for path in paths:
        with table.io.new_input(path).open() as fh:
            parts.append(pq.read_table(fh, columns=list(key)))
    keys = pa.concat_tables(parts) if parts else pa.table({k: pa.array([]) for k in key})
    check_merge_keys(keys, list(key), where)
    return keys


def _without_library_retry(table: Table) -> Table:
    """A copy of ``table`` whose commits are never retried by pyiceberg itself (the retry count, a property,
    is overridden in this in-memory copy only: only the transaction's updates reach the catalog)."""
    props = {**table.metadata.properties, TableProperties.COMMIT_NUM_RETRIES: "0"}
    return Table(table.name(), table.metadata.model_copy(update={"properties": props}), table.metadata_location,
                 table.io, table.catalog)


def _location(table: Table) -> str:
    return str(table.metadata.location).rstrip("/")
