"""The PostgreSQL commit of a table sink: one database transaction per sink per epoch, with psycopg 3.

:func:`precheck` (the checks and a :func:`trial_load` always rolled back) refuses before
the decision what the commit would refuse; :func:`commit` (also the replay's ``replace``)
inserts the epoch's marker row, checks the table's owner and loads the rows (``COPY``,
``MERGE`` for an upsert, SCD1/SCD2 for applied changes) in one transaction, so the
marker says exactly whether the epoch landed. The steps and decisions are in docs/POSTGRES.md.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import psycopg
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import tenacity
from psycopg import sql

from airflow_seatunnel_ckpt.core import layout
from airflow_seatunnel_ckpt.core.errors import ConfigError, StorageError
from airflow_seatunnel_ckpt.core.models import PublishedSink, SinkMode
from airflow_seatunnel_ckpt.core.sinks import (
    SinkCommit,
    check_staged_rows,
    markers,
    staged_rows,
    staged_schema,
)
from airflow_seatunnel_ckpt.core.sinks.options import SCD2_COLUMNS, UNCHANGED_TOAST, ApplyChanges, PostgresSinkOptions
from airflow_seatunnel_ckpt.core.storage.publish import PublishMethod

log = logging.getLogger(__name__)

#: The bookkeeping tables, in the sink table's schema: one marker row per committed epoch of a sink, one
#: owner row per table, and upsert epochs' before-images (each key's row before it) a replay restores.
EPOCHS = "seatunnel_ckpt_epochs"
OWNERS = "seatunnel_ckpt_owners"
IMAGES = "seatunnel_ckpt_before_images"
#: The ``key`` of the row that says an epoch kept its before-images (an epoch changing no key has only it).
_KEPT = "{}"
MERGED = "merged"
REPLACED = "replaced"
#: Rows per batch a ``COPY`` streams from the staged Parquet (its memory: one batch and its CSV).
COPY_BATCH_ROWS = 16384
#: The first PostgreSQL version with ``MERGE`` (``server_version`` form).
MERGE_SINCE = 150000
#: Errors a new attempt may not meet: the connection lost, a serialization failure or deadlock.
TRANSIENT = (psycopg.OperationalError, psycopg.InterfaceError)
#: Errors in which the table refuses the epoch's rows (a constraint, a value a column cannot hold,
#: two rows one key, a trigger's ``RAISE``): the same on every attempt, so a refusal, not transient.
REFUSALS = (psycopg.IntegrityError, psycopg.DataError, psycopg.errors.CardinalityViolation,
            psycopg.errors.RaiseException, psycopg.errors.InsufficientPrivilege)
#: The temporary column a replay's upsert loads each row's replayed epoch into (never in the table).
_REPLAYED = "__seatunnel_ckpt_replayed"
#: The separator of the names a staged list column (:data:`UNCHANGED_TOAST`) is loaded as, in one text.
_NAMES_SEP = "\x1f"
_COPY_COLUMN = re.compile(r"^COPY .*?, line \d+, column (.+?): ")
#: SQLSTATE -> what the user can do about the rows the table refused (:func:`refused`).
_WAY_OUT = {
    "23505": "The table holds one of the epoch's keys already, or two of the epoch's rows are one key as the table "
             "compares them (a char(n) key compares padded: 'a' and 'a ' are one key): de-duplicate in the stage (an "
             "append adds every row it is given: rows that may come again need mode 'upsert' with merge_keys)",
    "23502": "Fill or filter the NULLs in the stage, or give the column a default (or drop NOT NULL)",
    "23514": "Filter the rows the constraint rejects in the stage, or alter the constraint",
    "23503": "Load the referenced rows first, or filter the rows without them in the stage",
    "22001": "Shorten the values in the stage, or widen the column (ALTER TABLE ... ALTER COLUMN ... TYPE)",
    "22003": "Round or cap the values in the stage, or widen the column's numeric(p,s)",
    "22021": "PostgreSQL text cannot hold the NUL character (\\x00): remove it in the stage (Spark SQL: "
             "regexp_replace(col, '\\\\x00', ''))",
    "21000": "Two of the epoch's rows are one key as the table compares them (char(n) padding, a collation): "
             "de-duplicate in the stage on the key as the table sees it (e.g. rtrim)",
    "42501": "Grant the role the privilege, or connect as a role that has it",
}

#: What the user can do when applied changes meet a unique key (:func:`refused`).
_APPLIED_UNIQUE = ("Another unique key of the table than the changes' keys (and, for scd2, (keys, __start_at)) "
                   "holds the value, or an scd2 key changed twice at one first sequence_by value in different "
                   "epochs: drop or widen that unique key, or give sequence_by a first column that grows per change")
#: Arrow type -> the PostgreSQL type ``create_table`` gives a column.
_CREATE = {"int8": "smallint", "int16": "smallint", "int32": "integer", "int64": "bigint", "uint8": "smallint",
           "uint16": "integer", "uint32": "bigint", "float": "real", "double": "double precision",
           "bool": "boolean", "string": "text", "large_string": "text", "date32[day]": "date"}
#: PostgreSQL types (``pg_type.typname``) a staged Arrow column can be loaded into.
_INTEGERS = {"int8": {"int2", "int4", "int8", "numeric"}, "int16": {"int2", "int4", "int8", "numeric"},
             "int32": {"int4", "int8", "numeric"}, "int64": {"int8", "numeric"},
             "uint8": {"int2", "int4", "int8", "numeric"}, "uint16": {"int4", "int8", "numeric"},
             "uint32": {"int8", "numeric"}}
_TEXT = {"text", "varchar", "bpchar", "json", "jsonb", "uuid"}


@dataclass(frozen=True)
class Column:
    """One column of the target table as the catalog describes it."""

    name: str
    typname: str
    declared: str
    required: bool  # without a default (nor identity, nor generated): every epoch must write it


def identify(request: SinkCommit) -> tuple[PostgresSinkOptions, str]:
    """The sink's checked options and how messages name the epoch's commit."""
    options = request.table
    assert isinstance(options, PostgresSinkOptions), options
    return options, f"{request.where} (PostgreSQL table {options.table})"


def conninfo(request: SinkCommit, options: PostgresSinkOptions, where: str) -> str:
    """The libpq connection string: from the secret resolvers (``postgres_conn_id``), else ``conninfo``."""
    found = request.secrets().get("conninfo") or options.conninfo
    if not found:
        raise ConfigError(f"{where}: the sink names the Airflow connection {options.postgres_conn_id!r}, but no "
                          "resolver turned it into a connection string here; commit where the Airflow layer is "
                          "imported (the commit task, the recovery DAG), or give the sink a conninfo")
    return str(found)


@contextmanager
def connect(dsn: str, options: PostgresSinkOptions, where: str) -> Iterator[psycopg.Connection]:
    """An autocommit connection (transactions are explicit) with the sink's bounded waits
    (:meth:`PostgresSinkOptions.session_settings`); a failure to connect is transient."""
    try:
        conn = psycopg.connect(dsn, autocommit=True, connect_timeout=30, application_name="seatunnel-ckpt")
    except psycopg.OperationalError as exc:
        raise StorageError(f"{where}: cannot connect to PostgreSQL: {str(exc).strip()}. Check the connection "
                           "(host, port, credentials) and retry") from exc
    with conn:
        settings = options.session_settings()
        conn.execute(sql.SQL("SELECT {}").format(sql.SQL(", ").join(
            sql.SQL("set_config({}, {}, false)").format(sql.Literal(k), sql.Literal(v)) for k, v in settings.items())))
        yield conn


def retrying(request: SinkCommit, where: str, what: str,
             also: tuple[type[Exception], ...] = ()) -> tenacity.Retrying:
    """Transient database errors (and ``also``) retried ``request.retries`` times with backoff (then raised)."""

    def log_retry(state: tenacity.RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        log.warning("%s: %s failed (%s: %s); trying again", where, what, type(exc).__name__, exc)

    return tenacity.Retrying(
        retry=tenacity.retry_if_exception_type((*TRANSIENT, StorageError, *also)),
        stop=tenacity.stop_after_attempt(request.retries + 1),
        wait=tenacity.wait_exponential(multiplier=0.05, max=5), before_sleep=log_retry, reraise=True)


def _transient(exc: Exception, request: SinkCommit, where: str, what: str) -> StorageError:
    waited = ""
    if isinstance(exc, psycopg.errors.LockNotAvailable):
        waited = (" Another session holds a lock it needs past lock_timeout_s (e.g. a committer of this epoch "
                  "paused inside its transaction, which the server ends after idle_in_transaction_timeout_s; "
                  "pg_stat_activity shows it).")
    elif isinstance(exc, psycopg.errors.QueryCanceled):
        waited = " A statement ran past statement_timeout_s; raise it in the sink's options for epochs this large."
    return StorageError(
        f"{where}: {what} failed {request.retries + 1} time(s), last with {type(exc).__name__}: "
        f"{str(exc).strip()}.{waited} The database rolled the transaction back, so nothing of the epoch is in the "
        "table; run it again (the commit task's retry or the recovery DAG)")


# -- the commit ------------------------------------------------------------------------
def commit(request: SinkCommit) -> PublishedSink:
    """Load ``request``'s staged rows and its marker in one transaction (see the module docs).

    Rows the table refuses (:data:`REFUSALS`) are final, but for an upsert's unique violation:
    another writer inserted one of the epoch's keys meanwhile, which the next ``MERGE`` matches.
    """
    options, where = identify(request)
    dsn = conninfo(request, options, where)
    raced = (psycopg.errors.UniqueViolation,) if options.merge_keys else ()
    try:
        how = retrying(request, where, "the commit", raced)(_commit_once, request, options, dsn, where)
    except REFUSALS as exc:
        raise ConfigError(refused(exc, request, options, where)) from exc
    except TRANSIENT as exc:
        raise _transient(exc, request, where, "the commit") from exc
    log.info("%s: %s", where, "the table already holds the epoch (its marker row exists)"
             if how == PublishMethod.ALREADY else f"committed {request.sink.rows} row(s) with the epoch's marker")
    return request.published(f"postgres table {options.table}", how)


def _commit_once(request: SinkCommit, options: PostgresSinkOptions, dsn: str, where: str) -> str:
    with connect(dsn, options, where) as conn:
        _bookkeeping(conn, options, where)
        with conn.transaction():
            if not _claim_marker(conn, request, options):
                return PublishMethod.ALREADY  # a previous or racing commit landed it: this transaction ends empty
            _claim_owner(conn, request, options, where)
            return _load(conn, request, options, staged_schema(request, where), where)


def _load(conn: psycopg.Connection, request: SinkCommit, options: PostgresSinkOptions, schema: pa.Schema | None,
          where: str) -> str:
    """The epoch's rows into the table, inside the caller's transaction (the commit's and the trial load's),
    checked against the table as the catalog has it now; how the rows landed."""
    if request.sink.replaces and options.merge_keys and request.sink.full_refresh:
        conn.execute(sql.SQL("DELETE FROM {}").format(_qualified(options)))
    elif request.sink.replaces and options.merge_keys:
        _restore_before(conn, request, options, where)
    elif request.sink.replaces:
        _delete_replaced(conn, request, options, where)
    if schema is None:  # no staged file: nothing to load
        return REPLACED if request.sink.replaces else PublishMethod.ALREADY
    written = _written(schema, options, where)
    table = _table_columns(conn, options)
    if table is None:
        if not options.create_table:
            raise ConfigError(_no_table(options, where))
        conn.execute(_create_statement(options, written, where))
        table = _table_columns(conn, options)
        assert table is not None
    if options.apply_changes is not None:  # first: a table not made for it, named as such
        check_applied_table(conn, table, options, options.apply_changes, where)
    check_columns(table, written, options, where)
    if options.apply_changes is not None:
        _apply_changes(conn, request, options, options.apply_changes, schema)
        return MERGED
    if options.merge_keys:
        check_unique(conn, options, where)
        _upsert(conn, request, options, written)
        return MERGED
    _copy(conn, request, _qualified(options), written.names, options)
    return REPLACED if request.sink.replaces else PublishMethod.COPY


def _key_of(alias: str, options: PostgresSinkOptions) -> sql.Composable:
    """``jsonb_build_object('k', <alias>.k, ...)``: a row's merge key as the before-images hold it."""
    return sql.SQL("jsonb_build_object({})").format(sql.SQL(", ").join(
        sql.SQL("{}, {}.{}").format(sql.Literal(k), sql.Identifier(alias), sql.Identifier(k))
        for k in options.merge_keys))


def _keyed(table: str, keys: str, options: PostgresSinkOptions) -> sql.Composable:
    """``table``'s row has the key the jsonb column ``<keys>.key`` holds, compared column by column (the
    table's key index serves it: the cost follows the keys, not the table's size)."""
    return sql.SQL(" AND ").join(
        sql.SQL("{}.{} = (jsonb_populate_record(NULL::{}, {}.key)).{}").format(
            sql.Identifier(table), sql.Identifier(k), _qualified(options), sql.Identifier(keys), sql.Identifier(k))
        for k in options.merge_keys)


def _keep_images(conn: psycopg.Connection, request: SinkCommit, options: PostgresSinkOptions,
                 keys: sql.Composable) -> None:
    """Record the table's current row (NULL: none; scd2: all the key's versions) of each key ``keys`` (a table
    with a ``key`` jsonb column) as this epoch's before-image, a key recorded already keeping its first."""
    found = conn.execute("SELECT to_regclass(%s)", (_qualified(options, IMAGES).as_string(conn),)).fetchone()
    if found is None or found[0] is None:  # the trial load before the first commit creates the bookkeeping
        return
    ids = (request.resolved_store_id, request.pipeline, request.sink.sink, request.epoch)
    versions = options.apply_changes is not None and options.apply_changes.history == "scd2"
    image = sql.SQL("to_jsonb(t) FROM {} AS k LEFT JOIN {} AS t ON {}").format(
        keys, _qualified(options), _keyed("t", "k", options))
    if versions:  # every version of the key; none: NULL (a key column is never NULL in a row)
        image = sql.SQL("jsonb_agg(to_jsonb(t)) FILTER (WHERE t.{} IS NOT NULL) FROM {} AS k LEFT JOIN {} AS t "
                        "ON {} GROUP BY k.key").format(sql.Identifier(options.merge_keys[0]), keys,
                                                      _qualified(options), _keyed("t", "k", options))
    conn.execute(sql.SQL(
        "INSERT INTO {} (store_id, pipeline, sink, epoch, key, image) SELECT %s, %s, %s, %s, k.key, {} "
        "UNION ALL SELECT %s, %s, %s, %s, %s::jsonb, NULL ON CONFLICT DO NOTHING").format(
        _qualified(options, IMAGES), image), (*ids, *ids, _KEPT))


def _restore_before(conn: psycopg.Connection, request: SinkCommit, options: PostgresSinkOptions, where: str) -> None:
    """A replay from a later epoch of an upsert sink: each key the replaced epochs changed gets its row
    from before the first of them back (or goes, if it had none), from their before-images, after the
    replay epoch kept its own (a later replay may replace it). ConfigError if a replaced epoch kept none.
    """
    ids = (request.resolved_store_id, request.pipeline, request.sink.sink)
    replaced = sorted(request.sink.replaces)
    lacking = conn.execute(sql.SQL(
        "SELECT array_agg(m.epoch ORDER BY m.epoch) FROM {} AS m WHERE m.store_id = %s AND m.pipeline = %s "
        "AND m.sink = %s AND m.epoch = ANY(%s) AND NOT EXISTS (SELECT 1 FROM {} AS i WHERE i.store_id = m.store_id "
        "AND i.pipeline = m.pipeline AND i.sink = m.sink AND i.epoch = m.epoch AND i.key = %s::jsonb)").format(
        _qualified(options, EPOCHS), _qualified(options, IMAGES)), (*ids, replaced, _KEPT)).fetchone()
    if lacking and lacking[0]:
        raise ConfigError(
            f"{where}: epoch(s) {lacking[0]} of this sink kept no before-images in {options.schema_name}.{IMAGES} "
            f"(committed before they were kept, or deleted), and a replay from epoch {replaced[0]} restores the "
            f"values the keys had before epoch {replaced[0]} of this sink from them. Nothing was changed. Replay "
            "from epoch 1 (a full refresh, which needs no history)")
    restore = sql.Identifier(f"seatunnel_ckpt_restore_{request.epoch}")
    conn.execute(sql.SQL(
        "CREATE TEMPORARY TABLE {} ON COMMIT DROP AS SELECT DISTINCT ON (key) key, image FROM {} WHERE store_id = %s "
        "AND pipeline = %s AND sink = %s AND epoch = ANY(%s) AND key <> %s::jsonb ORDER BY key, epoch").format(
        restore, _qualified(options, IMAGES)), (*ids, replaced, _KEPT))
    _keep_images(conn, request, options, restore)
    conn.execute(sql.SQL("DELETE FROM {} AS t USING {} AS r WHERE {}").format(
        _qualified(options), restore, _keyed("t", "r", options)))
    # An image is a row, or an scd2 key's versions (an array of rows).
    conn.execute(sql.SQL("INSERT INTO {} SELECT v.* FROM {} AS r CROSS JOIN LATERAL jsonb_populate_recordset("
                         "NULL::{}, CASE jsonb_typeof(r.image) WHEN 'array' THEN r.image ELSE jsonb_build_array("
                         "r.image) END) AS v WHERE r.image IS NOT NULL").format(
        _qualified(options), restore, _qualified(options)))


def _written(schema: pa.Schema, options: PostgresSinkOptions, where: str) -> pa.Schema:
    """The table columns a commit writes: the staged ones (an ``apply_changes`` sink's without the operation
    and :data:`UNCHANGED_TOAST` columns, with scd2's ``__start_at``/``__end_at``, typed as the first
    ``sequence_by`` column) and ``epoch_column`` (``bigint``, the epoch)."""
    apply = options.apply_changes
    if apply is not None:
        kept = set(apply.table_columns(schema.names))
        bounds = [pa.field(c, schema.field(apply.sequence_by[0]).type) for c in SCD2_COLUMNS
                  if apply.history == "scd2" and apply.sequence_by[0] in schema.names]
        schema = pa.schema([*(f for f in schema if f.name in kept), *bounds])
    if not options.epoch_column:
        return schema
    if options.epoch_column in schema.names:
        raise ConfigError(f"{where}: the staged files have a column {options.epoch_column!r}, which the sink fills "
                          "with the epoch (epoch_column); drop or rename it in the stage, or name another epoch_column")
    return schema.append(pa.field(options.epoch_column, pa.int64()))


def _delete_replaced(conn: psycopg.Connection, request: SinkCommit, options: PostgresSinkOptions, where: str) -> None:
    """Delete the rows the epochs a replay replaces appended (``epoch_column`` says which); ConfigError without
    one, or when another store or pipeline also committed those epochs into the table (a table handed over)."""
    replaced = sorted(request.sink.replaces)
    if not options.epoch_column:
        raise ConfigError(f"{where}: a replay replaces epochs {replaced} of the table {options.table}, whose rows a "
                          "commit tells apart by epoch only through epoch_column, which the sink's options lack now. "
                          "Nothing was changed. Give the sink its epoch_column back, then replay again")
    others = conn.execute(sql.SQL(
        "SELECT DISTINCT store_id, pipeline FROM {} WHERE target_table = %s AND epoch = ANY(%s) "
        "AND (store_id, pipeline) <> (%s, %s)").format(_qualified(options, EPOCHS)),
        (options.table, replaced, request.resolved_store_id, request.pipeline)).fetchall()
    if others:
        raise ConfigError(f"{where}: the table {options.table} also holds epochs {replaced} of {others} (store id, "
                          f"pipeline; the table was handed over), and {options.epoch_column!r} cannot tell their rows "
                          "from this pipeline's. Nothing was changed. Replay into a table of this pipeline alone, or "
                          "delete the replaced rows yourself")
    conn.execute(sql.SQL("DELETE FROM {} WHERE {} = ANY(%s)").format(
        _qualified(options), sql.Identifier(options.epoch_column)), (replaced,))


def refused(exc: psycopg.Error, request: SinkCommit, options: PostgresSinkOptions, where: str) -> str:
    """The message for rows the table refused: the table, the column and constraint, the row, the way out."""
    diag = exc.diag
    in_copy = _COPY_COLUMN.search(diag.context or "")  # "COPY orders, line 2, column name: "toolong""
    column = diag.column_name or (in_copy.group(1) if in_copy else None) or (
        _column_holding_nul(request) if diag.sqlstate == "22021" else None)
    named = "; ".join(part for part in (
        f"column {column!r}" if column else "", f"constraint {diag.constraint_name!r}" if diag.constraint_name else "",
        (diag.message_detail or "").strip(), (diag.context or "").strip().replace("\n", " / ")) if part)
    return (f"{where}: the table {options.table} refuses the epoch's rows: {(diag.message_primary or str(exc)).strip()}"
            f"{f' ({named})' if named else ''}. Nothing was committed. "
            + (_APPLIED_UNIQUE if options.apply_changes is not None and diag.sqlstate == "23505" else
               _WAY_OUT.get(diag.sqlstate or "", "Fix the rows in the stage, or alter the table")))


def _column_holding_nul(request: SinkCommit) -> str | None:
    """The first staged text column with a NUL character (PostgreSQL's error names none)."""
    import pyarrow.compute as pc

    staged = staged_rows(request)
    for name in staged.column_names:
        column = staged.column(name)
        if pa.types.is_string(column.type) and pc.any(pc.match_substring(column, "\x00")).as_py():
            return str(name)
    return None


def _qualified(options: PostgresSinkOptions, name: str | None = None) -> sql.Identifier:
    return sql.Identifier(options.schema_name, name or options.name)


def _names(columns: Sequence[str], alias: str | None = None) -> sql.Composable:
    """``a, b`` (or ``<alias>.a, <alias>.b``): the columns as SQL."""
    return sql.SQL(", ").join(sql.Identifier(*([alias] if alias else []), c) for c in columns)


def _same(left: str, right: str, columns: Sequence[str]) -> sql.Composable:
    """``<left>.c = <right>.c AND ...``: the two rows agree on ``columns`` (a join on them)."""
    return sql.SQL(" AND ").join(sql.SQL("{} = {}").format(sql.Identifier(left, c), sql.Identifier(right, c))
                                 for c in columns)


def _bookkeeping(conn: psycopg.Connection, options: PostgresSinkOptions, where: str) -> None:
    """Create the bookkeeping tables in the table's schema if missing (own transaction).

    Only when missing: ``CREATE TABLE IF NOT EXISTS`` needs ``CREATE`` on the schema even for
    a table that exists. The loser of two racing first commits gets a (transient) StorageError.
    """
    if not _bookkeeping_missing(conn, options):
        return
    try:
        _create_bookkeeping(conn, options)
    except (psycopg.errors.UniqueViolation, psycopg.errors.DuplicateTable, psycopg.errors.DuplicateObject) as exc:
        raise StorageError(f"{where}: creating {EPOCHS} and {OWNERS} in schema {options.schema_name} raced another "
                           f"first commit ({str(exc).strip()}); trying again finds them") from exc


def _bookkeeping_missing(conn: psycopg.Connection, options: PostgresSinkOptions) -> bool:
    """Whether any bookkeeping table is missing from the table's schema."""
    names = [_qualified(options, name).as_string(conn) for name in (EPOCHS, OWNERS, IMAGES)]
    found = conn.execute("SELECT to_regclass(%s), to_regclass(%s), to_regclass(%s)", names).fetchone()
    return found is None or None in found


def _create_bookkeeping(conn: psycopg.Connection, options: PostgresSinkOptions) -> None:
    with conn.transaction():
        conn.execute(sql.SQL(
            "CREATE TABLE IF NOT EXISTS {} (store_id text NOT NULL, pipeline text NOT NULL, sink text NOT NULL, "
            "epoch bigint NOT NULL, target_table text NOT NULL, store text NOT NULL, rows bigint NOT NULL, "
            "committed_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (store_id, pipeline, sink, epoch))"
        ).format(_qualified(options, EPOCHS)))
        conn.execute(sql.SQL(
            "CREATE TABLE IF NOT EXISTS {} (target_table text PRIMARY KEY, store_id text NOT NULL, "
            "pipeline text NOT NULL, store text NOT NULL, claimed_at timestamptz NOT NULL DEFAULT now())"
        ).format(_qualified(options, OWNERS)))
        conn.execute(sql.SQL(
            "CREATE TABLE IF NOT EXISTS {} (store_id text NOT NULL, pipeline text NOT NULL, sink text NOT NULL, "
            "epoch bigint NOT NULL, key jsonb NOT NULL, image jsonb, "
            "PRIMARY KEY (store_id, pipeline, sink, epoch, key))"
        ).format(_qualified(options, IMAGES)))


def _claim_marker(conn: psycopg.Connection, request: SinkCommit, options: PostgresSinkOptions) -> bool:
    """Insert the epoch's marker row; False if it exists (waits for a racing transaction holding it)."""
    row = conn.execute(sql.SQL(
        "INSERT INTO {} (store_id, pipeline, sink, epoch, target_table, store, rows) "
        "VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING RETURNING epoch"
    ).format(_qualified(options, EPOCHS)), (request.resolved_store_id, request.pipeline, request.sink.sink,
                                            request.epoch, options.table, request.store, request.sink.rows))
    return row.fetchone() is not None


def _claim_owner(conn: psycopg.Connection, request: SinkCommit, options: PostgresSinkOptions, where: str, *,
                 decided: bool = True) -> None:
    """Claim the table for this store's pipeline (if nobody has), then judge owner and markers."""
    owner = markers.owner_for(request)
    conn.execute(sql.SQL("INSERT INTO {} (target_table, store_id, pipeline, store) VALUES (%s, %s, %s, %s) "
                         "ON CONFLICT DO NOTHING").format(_qualified(options, OWNERS)),
                 (options.table, owner.store_id, owner.pipeline, owner.store))
    found, marker = _owner_and_marker(conn, request, options, exclude_own=True)
    markers.check_marker(request, found, marker, where, decided=decided)


def _owner_and_marker(conn: psycopg.Connection, request: SinkCommit, options: PostgresSinkOptions, *,
                      exclude_own: bool = False) -> tuple[markers.Owner | None, markers.Marker | None]:
    """The table's owner and this store's pipeline's sink's newest marker (None when absent)."""
    owners = conn.execute("SELECT to_regclass(%s)", (_qualified(options, OWNERS).as_string(conn),)).fetchone()
    if owners is None or owners[0] is None:
        return None, None
    row = conn.execute(sql.SQL("SELECT store_id, pipeline, store FROM {} WHERE target_table = %s").format(
        _qualified(options, OWNERS)), (options.table,)).fetchone()
    owner = markers.Owner(row[0], row[1], row[2]) if row else None
    store_id = request.resolved_store_id
    newest = conn.execute(sql.SQL(
        "SELECT max(epoch) FROM {} WHERE store_id = %s AND pipeline = %s AND sink = %s AND epoch <> %s"
    ).format(_qualified(options, EPOCHS)), (store_id, request.pipeline, request.sink.sink,
                                           request.epoch if exclude_own else -1)).fetchone()
    epoch = newest[0] if newest else None
    return owner, (None if epoch is None else markers.Marker(store_id, request.pipeline, request.sink.sink, epoch))


def _copy(conn: psycopg.Connection, request: SinkCommit, table: sql.Composable, columns: Sequence[str],
          options: PostgresSinkOptions) -> None:
    """``COPY`` the staged files' rows into ``table``, streamed one Parquet batch at a time as CSV
    (``epoch_column`` and :data:`_REPLAYED` among ``columns`` filled with the epoch, the replayed one)."""
    statement = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT csv)").format(
        table, _names(columns))
    staged = [c for c in columns if c not in (options.epoch_column, _REPLAYED)]
    csv = pa_csv.WriteOptions(include_header=False, batch_size=COPY_BATCH_ROWS)
    with conn.cursor() as cur, cur.copy(statement) as copy:
        for f in request.sink.files:
            if not f.path.endswith(".parquet"):
                continue
            with request.staged.open_read(f"{request.sink.staging}/{f.path}") as fh:
                for batch in pq.ParquetFile(fh).iter_batches(batch_size=COPY_BATCH_ROWS, columns=staged):
                    if not batch.num_rows:
                        continue
                    stamps = {options.epoch_column: request.epoch,
                              _REPLAYED: layout.replayed_epoch(f.path) or request.epoch}
                    for column in columns:
                        if column in stamps and column not in staged:
                            batch = batch.append_column(column, pa.repeat(pa.scalar(stamps[column], pa.int64()),
                                                                          batch.num_rows))
                    batch = batch.select(list(columns))
                    for n, field in enumerate(batch.schema):  # a list of names (UNCHANGED_TOAST) as one text
                        if pa.types.is_list(field.type) or pa.types.is_large_list(field.type):
                            batch = batch.set_column(n, field.name, pc.binary_join(batch.column(n), _NAMES_SEP))
                    out = pa.BufferOutputStream()
                    pa_csv.write_csv(batch, out, csv)
                    copy.write(memoryview(out.getvalue()))


def _upsert(conn: psycopg.Connection, request: SinkCommit, options: PostgresSinkOptions, schema: pa.Schema) -> None:
    """COPY into a temporary table, then ``MERGE`` it into the table (``INSERT ... ON CONFLICT`` before
    PostgreSQL 15, which probes the key index row by row: about half as fast for a large epoch)."""
    staging = sql.Identifier(f"seatunnel_ckpt_stage_{request.epoch}")
    columns = _names(schema.names)
    conn.execute(sql.SQL("CREATE TEMPORARY TABLE {} ON COMMIT DROP AS SELECT {} FROM {} WITH NO DATA").format(
        staging, columns, _qualified(options)))
    if request.sink.replaces:  # a replay's epochs may each write a key: the newest replayed epoch's row wins
        conn.execute(sql.SQL("ALTER TABLE {} ADD COLUMN {} bigint").format(staging, sql.Identifier(_REPLAYED)))
        _copy(conn, request, staging, [*schema.names, _REPLAYED], options)
        conn.execute(sql.SQL("DELETE FROM {} AS s USING {} AS n WHERE {} AND n.{} > s.{}").format(
            staging, staging, _same("s", "n", options.merge_keys), sql.Identifier(_REPLAYED),
            sql.Identifier(_REPLAYED)))
    else:
        _copy(conn, request, staging, schema.names, options)
    if not request.sink.full_refresh:  # a full refresh is never replaced but by another one
        _keep_images(conn, request, options, sql.SQL("(SELECT {} AS key FROM {} AS s)").format(
            _key_of("s", options), staging))
    others = [c for c in schema.names if c not in options.merge_keys]
    if conn.info.server_version >= MERGE_SINCE:
        conn.execute(sql.SQL("ANALYZE {}").format(staging))
        matched = (sql.SQL(" WHEN MATCHED THEN UPDATE SET ") + sql.SQL(", ").join(
            sql.SQL("{} = s.{}").format(sql.Identifier(c), sql.Identifier(c)) for c in others)
                   if others else sql.SQL(""))
        conn.execute(sql.SQL("MERGE INTO {} AS t USING {} AS s ON {}{} WHEN NOT MATCHED THEN INSERT ({}) VALUES ({})")
                     .format(_qualified(options), staging, _same("t", "s", options.merge_keys), matched, columns,
                             _names(schema.names, "s")))
        return
    action = (sql.SQL("DO UPDATE SET ") + sql.SQL(", ").join(
        sql.SQL("{} = EXCLUDED.{}").format(sql.Identifier(c), sql.Identifier(c)) for c in others)
              if others else sql.SQL("DO NOTHING"))
    conn.execute(sql.SQL("INSERT INTO {} ({}) SELECT {} FROM {} ON CONFLICT ({}) {}").format(
        _qualified(options), columns, columns, staging,
        _names(options.merge_keys), action))


def _apply_changes(conn: psycopg.Connection, request: SinkCommit, options: PostgresSinkOptions,
                   apply: ApplyChanges, staged: pa.Schema) -> None:
    """Apply the epoch's change rows to the table: ``COPY`` into a temporary table, the keys' before-images
    kept, then :func:`_apply_step` once, or once per replayed epoch in order (docs/POSTGRES.md)."""
    loaded = sql.Identifier(f"seatunnel_ckpt_changes_{request.epoch}")
    stored = [c for c in _written(staged, options, "").names if c not in SCD2_COLUMNS]
    toast = UNCHANGED_TOAST in staged.names
    conn.execute(sql.SQL("CREATE TEMPORARY TABLE {} ON COMMIT DROP AS SELECT {} FROM {} WITH NO DATA").format(
        loaded, _names(stored), _qualified(options)))
    added = [apply.operation, *([UNCHANGED_TOAST] if toast else []), *([_REPLAYED] if request.sink.replaces else [])]
    conn.execute(sql.SQL("ALTER TABLE {} {}").format(loaded, sql.SQL(", ").join(
        sql.SQL("ADD COLUMN {} {}").format(sql.Identifier(c), sql.SQL("bigint" if c == _REPLAYED else "text"))
        for c in added)))
    _copy(conn, request, loaded, [*stored, *added], options)
    if not apply.deletes:
        conn.execute(sql.SQL("DELETE FROM {} WHERE {} = 'delete'").format(loaded, sql.Identifier(apply.operation)))
    _last_per_key(conn, options, apply, loaded, bool(request.sink.replaces))
    if not request.sink.full_refresh:  # a full refresh is never replaced but by another one
        _keep_images(conn, request, options, sql.SQL("(SELECT {} AS key FROM {} AS s)").format(
            _key_of("s", options), loaded))
    if not request.sink.replaces:
        _apply_step(conn, options, apply, loaded, stored, toast)
        return
    step = sql.Identifier(f"seatunnel_ckpt_step_{request.epoch}")
    conn.execute(sql.SQL("CREATE TEMPORARY TABLE {} (LIKE {}) ON COMMIT DROP").format(step, loaded))
    replayed = conn.execute(sql.SQL("SELECT DISTINCT {} FROM {} ORDER BY 1").format(
        sql.Identifier(_REPLAYED), loaded)).fetchall()
    for (epoch,) in replayed:
        conn.execute(sql.SQL("TRUNCATE {}").format(step))
        conn.execute(sql.SQL("INSERT INTO {} SELECT * FROM {} WHERE {} = %s").format(
            step, loaded, sql.Identifier(_REPLAYED)), (epoch,))
        _apply_step(conn, options, apply, step, stored, toast)


def _last_per_key(conn: psycopg.Connection, options: PostgresSinkOptions, apply: ApplyChanges,
                  loaded: sql.Identifier, replay: bool) -> None:
    """Keep only each key's last change in ``loaded`` (per replayed epoch), as the Spark side stages them
    and as the lake sinks apply them: staged rows with several changes of one key apply the last."""
    same = [*options.merge_keys, *([_REPLAYED] if replay else [])]
    later, this = _names(apply.sequence_by, "l"), _names(apply.sequence_by, "s")
    conn.execute(sql.SQL("DELETE FROM {} AS s USING {} AS l WHERE {} AND (({}) > ({}) OR (({}) = ({}) AND "
                         "l.ctid > s.ctid))").format(loaded, loaded, _same("l", "s", same), later, this, later, this))


def _apply_step(conn: psycopg.Connection, options: PostgresSinkOptions, apply: ApplyChanges,
                changes: sql.Identifier, stored: list[str], toast: bool) -> None:
    """Apply ``changes`` (a temporary table, one change per key) to the table, in SQL on the server: the
    order guard, the unchanged TOAST values, then SCD1 or SCD2 statements (docs/POSTGRES.md)."""
    table = _qualified(options)
    keys = _same("t", "s", options.merge_keys)

    def sequence(alias: str) -> sql.Composable:
        return sql.SQL("({})").format(_names(apply.sequence_by, alias))

    first, op = sql.Identifier(apply.sequence_by[0]), sql.Identifier(apply.operation)
    start, end = map(sql.Identifier, SCD2_COLUMNS)
    scd2 = apply.history == "scd2"
    # A sequence the table holds NULL (a row written otherwise) is below every change.
    stale = sql.SQL("({} > {}) IS FALSE").format(sequence("s"), sequence("t"))
    if scd2:
        stale = sql.SQL("{} OR (s.{} < t.{}) IS TRUE").format(stale, first, end)
    conn.execute(sql.SQL("DELETE FROM {} AS s WHERE EXISTS (SELECT 1 FROM {} AS t WHERE {} AND ({}))").format(
        changes, table, keys, stale))
    values = [c for c in stored if c not in options.merge_keys]
    if toast and values:
        names = sql.SQL("string_to_array(s.{}, {})").format(sql.Identifier(UNCHANGED_TOAST), sql.Literal(_NAMES_SEP))
        conn.execute(sql.SQL("UPDATE {} AS s SET {} FROM {} AS t WHERE {} AND s.{} <> ''{}").format(
            changes, sql.SQL(", ").join(sql.SQL("{} = CASE WHEN {} = ANY({}) THEN t.{} ELSE s.{} END").format(
                sql.Identifier(c), sql.Literal(c), names, sql.Identifier(c), sql.Identifier(c)) for c in values),
            table, keys, sql.Identifier(UNCHANGED_TOAST),
            sql.SQL(" AND t.{} IS NULL").format(end) if scd2 else sql.SQL("")))
    columns, picked = _names(stored), _names(stored, "s")
    if scd2:
        conn.execute(sql.SQL("UPDATE {} AS t SET {} = s.{} FROM {} AS s WHERE {} AND t.{} IS NULL").format(
            table, end, first, changes, keys, end))
        conn.execute(sql.SQL("INSERT INTO {} ({}, {}) SELECT {}, s.{} FROM {} AS s WHERE s.{} <> 'delete'").format(
            table, columns, start, picked, first, changes, op))
        return
    conn.execute(sql.SQL("DELETE FROM {} AS t USING {} AS s WHERE {} AND s.{} = 'delete'").format(
        table, changes, keys, op))
    action = (sql.SQL("DO UPDATE SET {} WHERE ({} < {}) IS NOT FALSE").format(
        sql.SQL(", ").join(sql.SQL("{} = EXCLUDED.{}").format(sql.Identifier(c), sql.Identifier(c)) for c in values),
        sequence("t"), sequence("excluded")) if values else sql.SQL("DO NOTHING"))
    conn.execute(sql.SQL("INSERT INTO {} AS t ({}) SELECT {} FROM {} AS s WHERE s.{} <> 'delete' "
                         "ON CONFLICT ({}) {}").format(table, columns, picked, changes, op,
                                                       _names(options.merge_keys), action))


def check_applied_table(conn: psycopg.Connection, table: dict[str, Column], options: PostgresSinkOptions,
                        apply: ApplyChanges, where: str) -> None:
    """ConfigError unless an existing table can take the applied changes: the sequence columns and the unique
    keys of its history (scd2: on (keys, ``__start_at``) and on the current versions' keys, none on the keys)."""
    way_out = "or drop create_table's table and let the first epoch create it (create_table: true)"
    needed = [*SCD2_COLUMNS] if apply.history == "scd2" else list(apply.sequence_by)
    missing = [c for c in needed if c not in table]
    if missing:
        what = ("keeps every version with the columns" if apply.history == "scd2"
                else "keeps each key's sequence (sequence_by) in the columns")
        raise ConfigError(
            f"{where}: apply_changes ({apply.history}) {what} {list(needed)}, and the table {options.table} lacks "
            f"{missing}: it was not made for applying changes (a plain upsert's table?). Nothing was committed. Add "
            f"them (ALTER TABLE {options.table} ADD COLUMN ...), name another table, {way_out}")
    if apply.history == "scd1":
        check_unique(conn, options, where)
        return
    rows = conn.execute(
        "SELECT array_agg(a.attname::text ORDER BY a.attname), coalesce(pg_get_expr(i.indpred, i.indrelid), '') "
        "FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
        "WHERE i.indrelid = to_regclass(%s) AND i.indisunique AND i.indexprs IS NULL "
        "GROUP BY i.indexrelid, i.indpred, i.indrelid", (_qualified(options).as_string(conn),)).fetchall()
    unique = {(tuple(sorted(r[0])), re.sub(r"[()\s]", "", r[1])) for r in rows}
    keys = tuple(sorted(options.merge_keys))
    if (keys, "") in unique:
        raise ConfigError(
            f"{where}: apply_changes (scd2) keeps every version of a key in {options.table}, whose primary key or a "
            f"unique constraint is the keys {list(options.merge_keys)} alone (one row per key: an scd1 or plain upsert "
            f"table). Nothing was committed. Name another table, {way_out}")
    wanted = {(tuple(sorted([*keys, SCD2_COLUMNS[0]])), ""): f"UNIQUE ({', '.join([*keys, SCD2_COLUMNS[0]])})",
              (keys, f"{SCD2_COLUMNS[1]}ISNULL"): f"CREATE UNIQUE INDEX ON {options.table} ({', '.join(keys)}) "
                                                  f"WHERE {SCD2_COLUMNS[1]} IS NULL"}
    lacking = [ddl for key, ddl in wanted.items() if key not in unique]
    if lacking:
        raise ConfigError(
            f"{where}: apply_changes (scd2) needs the table {options.table} to keep one version per key and start "
            f"and one current version per key; it lacks {lacking}. Nothing was committed. Add them, {way_out}")


# -- the checks before the decision ----------------------------------------------------
def precheck(request: SinkCommit) -> None:
    """Refuse, before the commit decision, an epoch the commit would refuse (nothing is written): from the staged
    files, the database's catalog and a :func:`trial_load`."""
    options, where = identify(request)
    if request.sink.mode is SinkMode.SNAPSHOT:
        raise ConfigError(f"{where}: a PostgreSQL sink appends or upserts each epoch's rows; mode "
                          f"{request.sink.mode.value!r} is not supported")
    schema = staged_schema(request, where)
    if schema is None and not request.sink.replaces:
        return  # nothing to load; a replay without rows still deletes the replaced epochs' rows
    unsupported = [f"{f.name} ({f.type})" for f in schema or [] if _loadable(f.type) is None
                   and not (options.apply_changes is not None and f.name == UNCHANGED_TOAST)]  # read, not stored
    if unsupported:
        raise ConfigError(f"{where}: column(s) {', '.join(unsupported)} have types the sink cannot load; cast "
                          "them in the stage to numbers, text, booleans, dates, timestamps or decimals")
    if schema is not None:
        check_staged_rows(request, schema, list(options.merge_keys), where)
    dsn = conninfo(request, options, where)
    raced = (psycopg.errors.UniqueViolation,) if options.merge_keys else ()  # as in the commit
    try:
        for attempt in retrying(request, where, "the trial load", raced):
            with attempt, connect(dsn, options, where) as conn:
                _precheck_table(conn, request, options, schema, where)
    except REFUSALS as exc:
        raise ConfigError(refused(exc, request, options, where)) from exc
    except TRANSIENT as exc:
        raise _transient(exc, request, where, "the trial load") from exc


#: A replay's commit (the contract's replace) is the commit: it swaps when ``request.replaces`` is set.
replace = commit


def held_epoch(request: SinkCommit) -> int | None:
    """This store's pipeline's sink's newest epoch in the table (its marker row; None: none). Reads only."""
    options, where = identify(request)
    with connect(conninfo(request, options, where), options, where) as conn:
        owner, marker = _owner_and_marker(conn, request, options)
        return markers.check_marker(request, owner, marker, where, decided=False)


def _precheck_table(conn: psycopg.Connection, request: SinkCommit, options: PostgresSinkOptions,
                    schema: pa.Schema | None, where: str) -> None:
    owner, marker = _owner_and_marker(conn, request, options)
    newest = markers.check_marker(request, owner, marker, where, decided=False)
    markers.refuse_past(request, newest, f"this sink's newest row in the marker table {options.schema_name}.{EPOCHS}",
                        where)
    if schema is not None:
        _precheck_columns(conn, options, schema, where)
    trial_load(conn, request, options, schema, where)
    if owner is None:
        claim_owner(conn, request, options, where)


def _precheck_columns(conn: psycopg.Connection, options: PostgresSinkOptions, schema: pa.Schema, where: str) -> None:
    """The table (or ``create_table``), its columns and types, merge keys and privileges against the staged schema."""
    written = _written(schema, options, where)
    table = _table_columns(conn, options)
    if table is None:
        if not options.create_table:
            raise ConfigError(_no_table(options, where))
        if conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (options.schema_name,)).fetchone() is None:
            raise ConfigError(f"{where}: the schema {options.schema_name!r} does not exist in the database; create it "
                              f"(CREATE SCHEMA {options.schema_name}) or name another table")
        missing = [k for k in options.merge_keys if k not in schema.names]
        if missing:
            raise ConfigError(f"{where}: merge key(s) {missing} are not among the staged columns {schema.names}")
        _create_statement(options, written, where)  # refuses columns it cannot create
    else:
        if options.apply_changes is not None:  # first: a table not made for it, named as such
            check_applied_table(conn, table, options, options.apply_changes, where)
        check_columns(table, written, options, where)
        if options.merge_keys and options.apply_changes is None:
            check_unique(conn, options, where)
        check_privileges(conn, options, where)


def claim_owner(conn: psycopg.Connection, request: SinkCommit, options: PostgresSinkOptions, where: str) -> None:
    """Claim a table nobody owns yet for this store's pipeline, before the decision (committed at once), so
    that a second store's or pipeline's first epoch is refused before its decision; the claim stays."""
    _bookkeeping(conn, options, where)
    with conn.transaction():
        _claim_owner(conn, request, options, where, decided=False)


def trial_load(conn: psycopg.Connection, request: SinkCommit, options: PostgresSinkOptions,
               schema: pa.Schema | None, where: str) -> None:
    """Load the epoch's rows as the commit will (:func:`_load`), in a transaction always rolled back, to meet
    the refusals only the table knows (:data:`REFUSALS`) before the decision."""
    with conn.transaction(force_rollback=True):
        conn.execute("SET CONSTRAINTS ALL IMMEDIATE")  # the rollback never reaches the COMMIT that checks them
        _load(conn, request, options, schema, where)


def check_privileges(conn: psycopg.Connection, options: PostgresSinkOptions, where: str) -> None:
    """ConfigError unless the connection's role may load the table and write the marker and owner tables."""
    needed = [(_qualified(options), "INSERT"), *([(_qualified(options), "UPDATE")] if options.merge_keys else []),
              *([(_qualified(options), "DELETE")] if options.apply_changes else [])]
    for name in (EPOCHS, OWNERS, *([IMAGES] if options.merge_keys else [])):
        needed += [(_qualified(options, name), "INSERT"), (_qualified(options, name), "SELECT")]
    missing = []
    for table, privilege in needed:
        qualified = table.as_string(conn)
        found = conn.execute("SELECT to_regclass(%s) IS NULL OR has_table_privilege(%s, %s)",
                             (qualified, qualified, privilege)).fetchone()
        if not (found and found[0]):
            missing.append(f"{privilege} on {qualified}")
    if _bookkeeping_missing(conn, options):
        can = conn.execute("SELECT has_schema_privilege(%s, 'CREATE')", (options.schema_name,)).fetchone()
        if not (can and can[0]):
            missing.append(f"CREATE on schema {options.schema_name} (the first commit creates {EPOCHS}, {OWNERS} and "
                           f"{IMAGES})")
    if missing:
        user = conn.execute("SELECT current_user").fetchone()
        raise ConfigError(f"{where}: the role {user[0] if user else '?'!r} lacks {', '.join(missing)}; grant "
                          "them (or connect as a role that has them) before the next run")


def _no_table(options: PostgresSinkOptions, where: str) -> str:
    return (f"{where}: the table {options.table} does not exist. Create it (its columns as the stage writes them"
            f"{', a primary key on ' + str(list(options.merge_keys)) if options.merge_keys else ''}), or set "
            "create_table: true in the sink's options")


def _table_columns(conn: psycopg.Connection, options: PostgresSinkOptions) -> dict[str, Column] | None:
    """The table's columns by name (None: no such table)."""
    found = conn.execute("SELECT to_regclass(%s)::oid", (_qualified(options).as_string(conn),)).fetchone()
    if found is None or found[0] is None:
        return None
    rows = conn.execute(
        "SELECT a.attname, t.typname, format_type(a.atttypid, a.atttypmod), "
        "NOT a.atthasdef AND a.attidentity = '' AND a.attgenerated = '' "
        "FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid "
        "WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum", (found[0],)).fetchall()
    return {r[0]: Column(r[0], r[1], r[2], bool(r[3])) for r in rows}


def _loadable(arrow_type: pa.DataType) -> set[str] | None:
    """The PostgreSQL types a staged column of ``arrow_type`` loads into (None: the sink cannot load it)."""
    name = str(arrow_type)
    if name in _INTEGERS:
        return _INTEGERS[name]
    if pa.types.is_floating(arrow_type):
        return {"float4", "float8", "numeric"} if name == "float" else {"float8", "numeric"}
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        return _TEXT
    if pa.types.is_boolean(arrow_type):
        return {"bool"}
    if pa.types.is_date32(arrow_type):
        return {"date", "timestamp", "timestamptz"}
    if pa.types.is_timestamp(arrow_type):
        return {"timestamptz"} if arrow_type.tz else {"timestamp", "timestamptz"}
    if pa.types.is_decimal(arrow_type):
        return {"numeric"}
    return None


def check_columns(table: dict[str, Column], schema: pa.Schema, options: PostgresSinkOptions, where: str) -> None:
    """ConfigError unless every staged column fits a table column and every required one is staged."""
    missing = [f.name for f in schema if f.name not in table]
    wrong = [f"{f.name}: the table has {table[f.name].declared}, the epoch's files {f.type}"
             for f in schema if f.name in table and table[f.name].typname not in (_loadable(f.type) or set())]
    required = [c.name for c in table.values() if c.required and c.name not in schema.names]
    if missing or wrong or required:
        raise ConfigError(
            f"{where}: the epoch's columns do not fit the table; nothing was committed. "
            + (f"Columns not in the table: {missing} (add them: ALTER TABLE {options.table} ADD COLUMN ...). "
               if missing else "")
            + (f"Incompatible types: {'; '.join(wrong)}. " if wrong else "")
            + (f"Columns without a default the epoch does not write: {required} (a column the stage stopped "
               "writing would be NULL from now on). " if required else "")
            + "Cast, add or drop the columns in the stage to match the table, or alter the table")


def check_unique(conn: psycopg.Connection, options: PostgresSinkOptions, where: str) -> None:
    """ConfigError unless the merge keys are exactly the columns of the primary key or a unique constraint."""
    rows = conn.execute(
        "SELECT array_agg(a.attname::text ORDER BY a.attname) FROM pg_index i "
        "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
        "WHERE i.indrelid = to_regclass(%s) AND i.indisunique AND i.indpred IS NULL AND i.indexprs IS NULL "
        "GROUP BY i.indexrelid", (_qualified(options).as_string(conn),)).fetchall()
    unique = [sorted(r[0]) for r in rows]
    if sorted(options.merge_keys) not in unique:
        raise ConfigError(
            f"{where}: merge_keys {list(options.merge_keys)} are not the table's primary key nor a unique "
            f"constraint (its unique keys: {unique or 'none'}); INSERT ... ON CONFLICT needs one. Add it: ALTER "
            f"TABLE {options.table} ADD UNIQUE ({', '.join(options.merge_keys)}), or set merge_keys to a unique key")


def _create_statement(options: PostgresSinkOptions, schema: pa.Schema, where: str) -> sql.Composed:
    """``CREATE TABLE IF NOT EXISTS`` for the staged schema (the merge keys its primary key)."""
    columns = []
    for f in schema:
        declared = _CREATE.get(str(f.type))
        if pa.types.is_timestamp(f.type):
            declared = "timestamptz" if f.type.tz else "timestamp"
        elif pa.types.is_decimal(f.type):
            declared = f"numeric({f.type.precision}, {f.type.scale})"
        if declared is None:
            raise ConfigError(f"{where}: create_table cannot give column {f.name!r} ({f.type}) a type; create the "
                              "table yourself, or cast the column in the stage")
        columns.append(sql.SQL("{} " + declared).format(sql.Identifier(f.name)))
    apply = options.apply_changes
    if apply is not None and apply.history == "scd2":  # every version: the key and where it starts
        keys = [*options.merge_keys, SCD2_COLUMNS[0]]
        columns.append(sql.SQL("PRIMARY KEY ({})").format(_names(keys)))
        return sql.SQL("CREATE TABLE IF NOT EXISTS {} ({}); CREATE UNIQUE INDEX IF NOT EXISTS {} ON {} ({}) "
                       "WHERE {} IS NULL").format(
            _qualified(options), sql.SQL(", ").join(columns), sql.Identifier(f"{options.name}_current"),
            _qualified(options), _names(options.merge_keys),
            sql.Identifier(SCD2_COLUMNS[1]))
    if options.merge_keys:
        columns.append(sql.SQL("PRIMARY KEY ({})").format(_names(options.merge_keys)))
    return sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(_qualified(options), sql.SQL(", ").join(columns))
