"""Sinks: a commit-decided epoch's staged files made visible in each sink's target, once.

One module per type (:data:`CONNECTORS`, imported on first use, so a pipeline without
table sinks never imports pyiceberg, deltalake or psycopg) implements the contract of
:mod:`.base`. The pipeline calls :func:`precheck_sink` in ``Pipeline.decide`` (a refusal is
a :class:`SinkRefusedError` that aborts the epoch) and :func:`commit_sink` after the
decision; :func:`register_secret_resolver` lets the Airflow layer add secrets at commit time.
"""

from __future__ import annotations

import logging
import types
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import tenacity

from airflow_seatunnel_ckpt.core import layout
from airflow_seatunnel_ckpt.core.errors import CheckpointError, ConfigError, PublishError, SinkRefusedError
from airflow_seatunnel_ckpt.core.registry import Registry
from airflow_seatunnel_ckpt.core.sinks import base
from airflow_seatunnel_ckpt.core.sinks.base import SinkCommit as SinkCommit  # the request every sink takes
from airflow_seatunnel_ckpt.core.sinks.base import SinkConnector

if TYPE_CHECKING:  # pyarrow is imported where it is used: parsing a DAG never needs it
    import pyarrow as pa

    from airflow_seatunnel_ckpt.core.models import PublishedSink  # (the records import the sinks' options)

log = logging.getLogger(__name__)
T = TypeVar("T")
#: The row-number column added to a file's key columns to match them (never written).
_ROW = "__seatunnel_ckpt_row"


class CommitConflict(Exception):
    """One attempt given to :func:`retry_conflicts` lost to another writer (or its store failed); ``__cause__`` is
    why. The next attempt reads the table again first (the winner may have committed this very epoch)."""


def retry_conflicts(attempt: Callable[[], T], retries: int, where: str) -> T:
    """``attempt()``, tried again after a :class:`CommitConflict` at most ``retries`` times (backoff up to 5 s)."""
    def warn(state: tenacity.RetryCallState) -> None:
        failed = state.outcome.exception() if state.outcome is not None else None
        log.warning("%s: commit conflict on attempt %d of %d (%s); reading the table again", where,
                    state.attempt_number, retries + 1, failed.__cause__ if failed is not None else "?")

    retrying = tenacity.Retrying(retry=tenacity.retry_if_exception_type(CommitConflict),
                                 stop=tenacity.stop_after_attempt(retries + 1),
                                 wait=tenacity.wait_exponential(multiplier=0.05, max=5),
                                 before_sleep=warn, reraise=True)
    return retrying(attempt)


def _unknown_type(type_name: str, known: list[str]) -> str:
    return (f"the sink names the unknown type {type_name!r}; known: {known}. Register it with register_sink_type() "
            "(or register_table_format()) in the processes that decide and commit")


#: Sink type -> the module implementing :class:`SinkConnector`, imported on first use, so a
#: pipeline without table sinks never imports pyiceberg, deltalake or psycopg.
CONNECTORS: Registry[SinkConnector] = Registry(
    "sink type",
    {"file": f"{__name__}.files", **{name: f"{__name__}.{name}" for name in ("iceberg", "delta", "postgres")}},
    extras={"delta": "delta", "postgres": "postgres"}, unknown=_unknown_type,
    options="airflow_seatunnel_ckpt.core.sinks.options:SINK_OPTIONS")


def register_sink_type(type_name: str, connector: SinkConnector) -> None:
    """Make sinks of ``type_name`` commit through ``connector`` (without ``replace``, replays are refused)."""
    CONNECTORS.register(type_name, connector)


def register_table_format(type_name: str, commit: Callable[[SinkCommit], PublishedSink],
                          precheck: Callable[[SinkCommit], None] | None = None,
                          replace: Callable[[SinkCommit], PublishedSink] | None = None) -> None:
    """:func:`register_sink_type` from functions (no ``precheck``: nothing is checked before the decision; no
    ``replace``: replays are refused); recovery's view of such a sink is that it holds no epoch."""
    functions = {"replace": replace} if replace is not None else {}
    register_sink_type(type_name, types.SimpleNamespace(commit=commit, precheck=precheck or (lambda request: None),
                                                        held_epoch=lambda request: None, **functions))


def register_secret_resolver(resolve: Callable[[Mapping[str, Any]], Mapping[str, Any]]) -> None:
    """Add a resolver of a table sink's secrets (called at commit time; see :class:`SinkCommit`)."""
    if resolve not in base.SECRET_RESOLVERS:
        base.SECRET_RESOLVERS.append(resolve)


def connector(request: SinkCommit) -> SinkConnector:
    """The sink's type's implementation of the contract (a built-in one imported on first use)."""
    try:
        return CONNECTORS.get(request.type)
    except ConfigError as exc:
        raise ConfigError(f"{request.where}: {exc}") from exc


def _refusal(exc: CheckpointError) -> type[SinkRefusedError]:
    """The class a refusal is raised as: its own if it is one already (TableOwnershipError)."""
    return type(exc) if isinstance(exc, SinkRefusedError) else SinkRefusedError


def _library(request: SinkCommit) -> str:
    """Whose exception a sink's unexpected error is, for messages."""
    return "storage library (fsspec)" if request.type == "file" else "table library"


def precheck_sink(request: SinkCommit) -> None:
    """Refuse (:class:`SinkRefusedError`), before the commit decision, an epoch that ``request``'s sink would
    refuse; a transient failure raises as it is (the decision can be tried again)."""
    try:
        found = connector(request)
        if request.replaces and not hasattr(found, "replace"):
            raise SinkRefusedError(
                f"{request.where}: the sink type {request.type!r} has no replace (its connector was registered "
                f"without one), so a replay cannot swap the rows of epochs {list(request.replaces)} for the new "
                "ones: its commit could only add them. Register the type with a replace, or run a new pipeline "
                "into a new target")
        found.precheck(request)
    except CheckpointError as exc:
        if exc.retryable:
            raise
        raise _refusal(exc)(
            f"{exc} [sink {request.sink.sink!r} refuses epoch {request.epoch}: the epoch is aborted before any "
            "change to the table, and its input is read again by the next run; fix the stage (or the table, "
            "or the sink's options) before it]") from exc
    except Exception as exc:  # the library's own error: not known to be final, so not a refusal
        raise PublishError(
            f"{request.where}: checking the epoch against its {request.type} sink failed in the "
            f"{_library(request)}: {type(exc).__name__}: {exc}. The epoch is not decided; decide again (clear the "
            "branch task) once the table can be read") from exc


def commit_sink(request: SinkCommit) -> PublishedSink:
    """Commit one sink of a commit-decided epoch once: the connector's ``replace`` for a replay's epoch, its
    ``commit`` for any other. A refusal now means the target changed after the decision (SinkRefusedError)."""
    try:
        found = connector(request)
        return found.replace(request) if request.replaces else found.commit(request)
    except CheckpointError as exc:
        if exc.retryable:
            raise
        raise _refusal(exc)(
            f"{exc} [sink {request.sink.sink!r} refuses epoch {request.epoch}, which is decided commit (the checks "
            "passed at the decision, so the table or the committing process changed since); a retry cannot change "
            "it. Undo that change (then run the commit again), or publish the epoch without this sink: "
            f"seatunnel-ckpt resolve {request.pipeline} {request.epoch} --skip-sink {request.sink.sink} --reason "
            "'...' (recorded in the transaction log; the sink misses this epoch's rows)]") from exc
    except Exception as exc:  # the library's own error (pyiceberg, deltalake, pyarrow, fsspec): ours, named
        raise PublishError(
            f"{request.where}: the {request.type} commit failed in the {_library(request)}: "
            f"{type(exc).__name__}: {exc}. The epoch stays COMMITTING and nothing is duplicated; run the commit "
            "or the recovery DAG again") from exc


def held_epoch(request: SinkCommit) -> int | None:
    """The newest epoch of ``request``'s pipeline's sink that its target holds (None: none); reads only."""
    return connector(request).held_epoch(request)


def staged_rows(request: SinkCommit, columns: list[str] | None = None) -> pa.Table:
    """The epoch's staged rows (``columns`` only, if given), read from the checkpoint store."""
    import pyarrow as pa

    parts = [rows for _, rows in staged_parts(request, columns)]
    return pa.concat_tables(parts) if parts else pa.table({})


def staged_parts(request: SinkCommit, columns: list[str] | None = None) -> list[tuple[int, pa.Table]]:
    """The staged rows by the epoch that wrote them (a replay's: per replayed epoch), oldest first, without empty
    parts (``columns`` only, if given)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    parts: dict[int, list[pa.Table]] = {}
    for f in request.sink.files:
        if f.path.endswith(".parquet"):
            with request.staged.open_read(f"{request.sink.staging}/{f.path}") as fh:
                table = pq.read_table(fh, columns=columns)
            if table.num_rows:
                epoch = layout.replayed_epoch(f.path) if request.sink.replaces else None
                parts.setdefault(request.epoch if epoch is None else epoch, []).append(
                    table.replace_schema_metadata(None))
    return [(epoch, pa.concat_tables(tables, promote_options="default")) for epoch, tables in sorted(parts.items())]


def upserted_rows(request: SinkCommit, keys: list[str], where: str) -> pa.Table:
    """The rows an upsert epoch writes: per key the newest replayed epoch's row (ConfigError: see
    :func:`check_merge_keys`)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    parts = [rows for _, rows in staged_parts(request)]
    for rows in parts:  # oldest first: a refusal names the first replayed epoch that repeats a key
        check_merge_keys(rows, keys, where)
    if not parts:
        return pa.table({})
    kept: list[pa.Table] = []
    later: list[pa.Table] = []
    for rows in reversed(parts):
        if later:
            rows = rows.filter(pc.invert(rows_of_keys(rows, pa.concat_tables(later, promote_options="default"),
                                                      keys)))
        kept.append(rows)
        later.append(rows.select(keys))
    return pa.concat_tables(list(reversed(kept)), promote_options="default")


def restored_before(before: pa.Table, now: pa.Table, new_keys: pa.Table, keys: list[str]) -> tuple[pa.Table, pa.Table]:
    """A replay from epoch N of an upsert table: ``(touched keys, restored rows)``.

    ``before`` is the table as of epoch N-1, ``now`` the table now. The touched keys are every
    key whose row differs between the two (a superset: a row with a NULL compares as changed,
    and restoring it changes nothing) and the replay's ``new_keys``; the restored rows are the
    touched keys' rows of ``before`` that the new output does not write again.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    # Nested columns (lists, structs) cannot be join keys: left out, the other columns still tell a
    # changed row (an applied change's sequence columns always differ).
    common = [c for c in before.column_names
              if c in now.column_names and not pa.types.is_nested(now.schema.field(c).type)]
    # One type per column (a reader may give one snapshot's strings as large_string).
    then = pa.table([before.column(c).cast(now.schema.field(c).type) for c in common], names=common)
    changed = [a.select(common).join(b.select(common), keys=common, join_type="left anti").select(keys)
               for a, b in ((now, then), (then, now))]
    wanted = pa.schema([now.schema.field(k) for k in keys])
    touched = pa.concat_tables([t.cast(wanted) for t in (*changed, new_keys.select(keys))]).group_by(keys).aggregate([])
    restored = before.filter(rows_of_keys(before, touched, keys)) if before.num_rows else before
    if restored.num_rows and new_keys.num_rows:
        restored = restored.filter(pc.invert(rows_of_keys(restored, new_keys, keys)))
    return touched.select(keys), restored


def rows_of_keys(rows: pa.Table, keys: pa.Table, key: Sequence[str]) -> pa.ChunkedArray:
    """For each row of ``rows``, whether its key is one of ``keys`` (a NULL key is none)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    probe = rows.select(list(key)).append_column(_ROW, pa.array(range(rows.num_rows), pa.int64()))
    wanted = pa.table({k: keys.column(k).cast(rows.schema.field(k).type) for k in key})
    found = probe.join(wanted, keys=list(key), join_type="left semi").column(_ROW)
    return pc.is_in(probe.column(_ROW), value_set=found.combine_chunks())


def staged_schema(request: SinkCommit, where: str) -> pa.Schema | None:
    """The one Parquet schema of the epoch's staged files, from their footers (None: no file; ConfigError: two)."""
    import pyarrow.parquet as pq

    schema: pa.Schema | None = None
    for f in request.sink.files:
        if not f.path.endswith(".parquet"):
            continue
        with request.staged.open_read(f"{request.sink.staging}/{f.path}") as fh:
            found = pq.read_schema(fh).remove_metadata()
        if schema is None:
            schema = found
        elif not found.equals(schema):
            raise ConfigError(f"{where}: staged file {f.path} has schema {found}, the epoch's first file has "
                              f"{schema}; the stage must write one schema per sink")
    return schema


def check_staged_rows(request: SinkCommit, schema: pa.Schema, keys: list[str], where: str) -> pa.Schema:
    """The refusals of the epoch's staged rows (``schema``: their files'), before the decision: change rows or an
    upsert's ``keys``; the table schema they make."""
    from airflow_seatunnel_ckpt.core.sinks import changes

    apply = getattr(request.table, "apply_changes", None)
    if apply is not None:
        changes.check_staged_changes(request, schema, apply, where)
        return changes.table_schema(apply, schema)
    if keys:
        check_staged_merge_keys(request, schema, keys, where)
    return schema


def check_partition_columns(partition_by: Sequence[str], schema: pa.Schema, where: str) -> None:
    """ConfigError unless every ``partition_by`` column is in the staged files' ``schema``."""
    missing = [c for c in partition_by if c not in schema.names]
    if missing:
        raise ConfigError(f"{where}: partition column(s) {missing} are not in the staged files "
                          f"(columns: {schema.names}); fix the sink's partition_by")


def check_staged_merge_keys(request: SinkCommit, schema: pa.Schema, keys: list[str], where: str) -> None:
    """:func:`check_merge_keys` over the epoch's staged key columns, a replay's per replayed epoch."""
    for _, rows in staged_parts(request, [k for k in keys if k in schema.names]):
        check_merge_keys(rows, keys, where)


def check_merge_keys(rows: pa.Table, keys: list[str], where: str) -> None:
    """ConfigError unless every key column exists, holds no NULL and no key repeats."""
    import pyarrow.compute as pc

    if not rows.num_rows:
        return
    missing = [k for k in keys if k not in rows.column_names]
    if missing:
        raise ConfigError(f"{where}: merge key column(s) {missing} are not in the epoch's rows "
                          f"(columns: {rows.column_names}); set merge_keys to columns the stage writes")
    for key in keys:
        nulls = rows.column(key).null_count
        if nulls:
            raise ConfigError(f"{where}: merge key column {key!r} is NULL in {nulls} row(s); a NULL key matches "
                              "no row and would be inserted again every epoch. Filter or fill them in the stage")
    counts = rows.group_by(list(keys)).aggregate([([], "count_all")])
    repeated = counts.filter(pc.greater(counts.column("count_all"), 1))
    if repeated.num_rows:
        example = {k: repeated.column(k)[0].as_py() for k in keys}
        raise ConfigError(f"{where}: {repeated.num_rows} key(s) appear more than once in the epoch's rows, e.g. "
                          f"{example}; an upsert needs one row per key. Aggregate or de-duplicate in the stage "
                          "(a key_value state's output has one row per key)")
