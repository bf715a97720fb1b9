"""The sinks' options, typed: one model per sink type, keyed on ``type`` (:data:`SINK_OPTIONS`).

Checked when the DAG is parsed (:func:`core.options.parse`) and carried typed in
``SinkManifest.table`` to the commit. ``mode`` is ``append|upsert|snapshot`` for every sink
(``merge_keys`` without a mode mean ``upsert``). No PySpark, psycopg or table library here.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from typing import Annotated, Any, Literal
from urllib.parse import parse_qs, urlsplit

from pydantic import Field, Strict, field_validator, model_validator

from airflow_seatunnel_ckpt.core.errors import ConfigError
from airflow_seatunnel_ckpt.core.options import Options, checked, keyed

#: The file formats a file sink writes.
FILE_FORMATS = ("parquet", "json", "csv", "orc")
#: The PostgreSQL session's timeouts (seconds) and their defaults.
TIMEOUTS = {"lock_timeout_s": 30.0, "statement_timeout_s": 3600.0, "idle_in_transaction_timeout_s": 60.0}
#: A password in a libpq connection string, keyword form or URL form.
_PASSWORD = re.compile(r"(^|\s)password\s*=|://[^/@\s]*:[^/@\s]*@", re.IGNORECASE)
#: A timeout option: seconds above 0, at most a week.
Seconds = Annotated[float, Strict(), Field(gt=0, le=7 * 24 * 3600)]


OPERATIONS = ("insert", "update", "delete")
#: The change column naming an update's columns whose TOASTed value did not change (NULL in the change).
UNCHANGED_TOAST = "_unchanged_toast"
#: The sequence value that opened an SCD2 row version and the one that closed it (NULL: current).
SCD2_COLUMNS = ("__start_at", "__end_at")


class ApplyChanges(Options):
    """Apply change rows (inserts, updates, deletes; e.g. a ``postgres_cdc`` source's) to a keyed table.

    The shape of Spark Declarative Pipelines' AUTO CDC (docs/CDC.md, "Applying changes").
    """

    type: str = "apply_changes"
    keys: list[str]
    """The columns that identify a row of the table (the source table's primary key)."""
    sequence_by: list[str] = ["_lsn", "_seq"]
    """The columns that order the changes (compared in turn); a change not above the table's has no effect."""
    operation: str = "_op"
    """The column holding each change's operation: ``insert``, ``update`` or ``delete``."""
    deletes: bool = True
    """Apply deletes (remove the row, or close its version); false: delete changes are ignored."""
    history: Literal["scd1", "scd2"] = "scd1"
    """``scd1``: one row per key, the latest; ``scd2``: every version, ``__start_at``/``__end_at`` bounding it."""
    except_columns: list[str] = []
    """Change columns left out of the table (e.g. ``_table``, ``_xid``, ``_unchanged_toast``)."""

    @field_validator("keys", "sequence_by", mode="before")
    @classmethod
    def _listed(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @model_validator(mode="after")
    def _columns_agree(self) -> ApplyChanges:
        if not self.keys or not self.sequence_by:
            raise ValueError("apply_changes needs keys (the row's identity) and sequence_by (the changes' order)")
        named = [*self.keys, *self.sequence_by, self.operation]
        if len(set(named)) != len(named):
            raise ValueError(f"apply_changes: keys {self.keys}, sequence_by {self.sequence_by} and operation "
                             f"{self.operation!r} must be distinct columns")
        dropped = set(self.except_columns) & set(named)
        if dropped:
            raise ValueError(f"apply_changes: except_columns {sorted(dropped)} are keys, sequence or operation "
                             "columns, which applying the changes needs; leave them out of except_columns")
        clash = set(SCD2_COLUMNS) & set(named)
        if clash:
            raise ValueError(f"apply_changes: {sorted(clash)} are the columns an scd2 table adds; rename them")
        return self

    def table_columns(self, change_columns: list[str]) -> list[str]:
        """The target table's columns for change rows with ``change_columns`` (in their order)."""
        left_out = {self.operation, UNCHANGED_TOAST, *self.except_columns}
        columns = [c for c in change_columns if c not in left_out]
        return [*columns, *SCD2_COLUMNS] if self.history == "scd2" else columns


class SinkOptionsBase(Options):
    """What every sink's options share: one mode, the rules on rows."""

    expectations: dict[str, Any] | None = None
    """Data-quality rules on the rows written (docs/EXPECTATIONS.md); never recorded in the manifest."""

    @model_validator(mode="before")
    @classmethod
    def _keys_mean_upsert(cls, data: Any) -> Any:
        # An option left out as None (a Spark sink's keyword not given) takes its default, and
        # merge_keys without a mode are an upsert on them.
        if not isinstance(data, Mapping):
            return data
        out = {k: v for k, v in data.items() if v is not None}
        if isinstance(out.get("merge_keys"), str):
            out["merge_keys"] = [out["merge_keys"]]
        if "mode" not in out and out.get("merge_keys"):
            out["mode"] = "upsert"
        return out

    @model_validator(mode="before")
    @classmethod
    def _changes_are_an_upsert(cls, data: Any) -> Any:
        # Applying changes is an upsert on the changes' keys (one row, or one current version, per key).
        if not isinstance(data, Mapping) or not data.get("apply_changes"):
            return data
        apply = data["apply_changes"]
        keys = apply.keys if isinstance(apply, ApplyChanges) else (apply or {}).get("keys") if isinstance(
            apply, Mapping) else None
        keys = [keys] if isinstance(keys, str) else keys
        out = dict(data)
        if (out.get("mode") or "upsert") != "upsert":
            raise ValueError(f"apply_changes with mode {out['mode']!r}: applying changes is an upsert on its keys; "
                             "leave mode out (or set it to 'upsert')")
        if out.get("merge_keys") and keys is not None and list(out["merge_keys"]) != list(keys):
            raise ValueError(f"apply_changes keys {keys} and merge_keys {list(out['merge_keys'])} differ; "
                             "leave merge_keys out (apply_changes.keys are the table's keys)")
        out["mode"] = "upsert"
        if keys is not None:
            out["merge_keys"] = list(keys)
        return out

    @model_validator(mode="after")
    def _mode_and_keys_agree(self) -> SinkOptionsBase:
        keys = getattr(self, "merge_keys", None)
        mode = getattr(self, "mode", "append")
        if mode == "upsert" and not keys:
            raise ValueError("mode 'upsert' needs merge_keys (the columns whose rows an epoch replaces)")
        if keys and mode != "upsert":
            raise ValueError(f"merge_keys {list(keys)} with mode {mode!r}: merge_keys are the keys of an upsert; "
                             "set mode 'upsert', or drop merge_keys")
        return self

    def recorded(self) -> SinkOptionsBase:
        """The options as the prepared record keeps them: without the expectations (measured there already)."""
        return self.model_copy(update={"expectations": None})


class FileSinkOptions(SinkOptionsBase):
    """A directory of files, one ``epoch=<e>/`` per epoch (docs/REFERENCE.md)."""

    type: Literal["file"] = "file"
    path: str
    """The target directory: a local path or any fsspec URL Spark can write."""
    format: Literal["parquet", "json", "csv", "orc"] = "parquet"
    """The files' format."""
    options: dict[str, Any] = {}
    """Writer options, passed to Spark untouched."""
    partition_by: list[str] = []
    """Partition columns (directories ``<column>=<value>`` inside each epoch's)."""
    mode: Literal["append", "snapshot"] = "append"
    """``append``: each epoch's rows in its own ``epoch=<e>/``; ``snapshot``: each epoch's rows are the whole
    content (``_LATEST`` names it, older snapshots are removed)."""


class IcebergSinkOptions(SinkOptionsBase):
    """An Apache Iceberg table, one snapshot per epoch, committed with pyiceberg."""

    type: Literal["iceberg"] = "iceberg"
    table: str
    """``<namespace>.<name>`` (created on the first commit, namespace too)."""
    catalog: dict[str, Any] = {}
    """pyiceberg catalog properties (``type``, ``uri``, ``warehouse``, ``s3.endpoint``, ...), never secrets
    (keys that look like secrets are refused). Empty, with no ``catalog_conn_id``: the embedded catalog."""
    catalog_name: str = "default"
    """The catalog's name (pyiceberg's; also ``~/.pyiceberg.yaml``'s)."""
    catalog_conn_id: str | None = None
    """An Airflow connection whose properties (credentials included) are added when the commit runs; only
    its name is recorded."""
    partition_by: list[str] = []
    """Identity partition columns of the table (each staged file holds one value of each, and the column)."""
    mode: Literal["append", "upsert", "snapshot"] = "append"
    """``append``, ``upsert`` (on ``merge_keys``) or ``snapshot`` (each epoch replaces the table's rows)."""
    merge_keys: list[str] = []
    """The key columns of an upsert: each epoch's rows replace the table's rows with the same key."""
    apply_changes: ApplyChanges | None = None
    """Apply change rows (``_op`` insert/update/delete, ordered by ``sequence_by``) instead of upserting
    the rows: SCD1 or SCD2, deletes included (:class:`ApplyChanges`, docs/CDC.md)."""

    @field_validator("table")
    @classmethod
    def _qualified(cls, table: str) -> str:
        if len([p for p in table.split(".") if p]) < 2:
            raise ValueError(f"the Iceberg table must be '<namespace>.<name>', got {table!r}")
        return table


class DeltaSinkOptions(SinkOptionsBase):
    """A Delta Lake table, one table version per epoch, committed with delta-rs."""

    type: Literal["delta"] = "delta"
    path: str
    """The table's URL: a local path, ``file://``, ``s3://`` or ``s3a://`` (other protocols are refused when
    the sink is built); the table is created by the first epoch with rows."""
    partition_by: list[str] = []
    """Partition columns of a new table; an existing table's must be the same list (else the epoch is
    refused before its decision, nothing committed)."""
    mode: Literal["append", "upsert", "snapshot"] = "append"
    """``append``, ``upsert`` (a MERGE on ``merge_keys``) or ``snapshot`` (each epoch replaces the rows)."""
    merge_keys: list[str] = []
    """The key columns of an upsert: each epoch's rows replace the table's rows with the same key."""
    apply_changes: ApplyChanges | None = None
    """Apply change rows (``_op`` insert/update/delete, ordered by ``sequence_by``) instead of upserting
    the rows: SCD1 or SCD2, deletes included (:class:`ApplyChanges`, docs/CDC.md)."""


class PostgresSinkOptions(SinkOptionsBase):
    """A PostgreSQL table, one transaction per epoch with its marker row."""

    type: Literal["postgres"] = "postgres"
    table: str
    """``<schema>.<name>`` (``<name>`` alone: schema ``public``)."""
    postgres_conn_id: str = ""
    """The Airflow Postgres connection the decision and the commit connect with (host, port, login,
    password, ``schema`` = the database, libpq extras such as ``sslmode``); only its name is recorded."""
    conninfo: str = ""
    """A libpq connection string without a password, instead of a connection (scripts, the core alone);
    one with a password is refused (use a connection, or ``PGPASSFILE``)."""
    mode: Literal["append", "upsert"] = "append"
    """``append`` (each epoch's rows added) or ``upsert`` (merged on ``merge_keys``)."""
    merge_keys: list[str] = []
    """The columns of the table's primary key or a unique constraint (upsert)."""
    apply_changes: ApplyChanges | None = None
    """Apply change rows (``_op`` insert/update/delete, ordered by ``sequence_by``) instead of upserting
    the rows: SCD1 or SCD2, deletes included (:class:`ApplyChanges`, docs/CDC.md)."""
    create_table: bool = False
    """Create a missing table from the first epoch's columns (merge keys as its primary key); without it a
    missing table refuses the epoch before its decision."""
    epoch_column: str = ""
    """A ``bigint`` column each commit fills with its epoch (``create_table`` creates it), so that a replay
    removes exactly the replayed epochs' rows (an append sink without one cannot be replayed)."""
    lock_timeout_s: Seconds = TIMEOUTS["lock_timeout_s"]
    """How long a statement waits for a lock (PostgreSQL ``lock_timeout``): a committer paused inside its
    transaction holds the epoch's marker row, and the next attempt fails after this, transiently (the
    commit is retried; the epoch stays COMMITTING meanwhile), instead of waiting until TCP notices."""
    statement_timeout_s: Seconds = TIMEOUTS["statement_timeout_s"]
    """How long one statement may run (``statement_timeout``): a large epoch's ``COPY`` or ``MERGE``; raise
    it for larger epochs."""
    idle_in_transaction_timeout_s: Seconds = TIMEOUTS["idle_in_transaction_timeout_s"]
    """How long the server keeps a transaction whose client went quiet
    (``idle_in_transaction_session_timeout``): a paused or hung committer's session is ended, its locks
    released, and the next attempt goes on."""

    @field_validator("table")
    @classmethod
    def _schema_and_name(cls, table: str) -> str:
        if not table or table.count(".") > 1 or not all(table.split(".")):
            raise ValueError(f"'table' must be '<schema>.<name>' (or '<name>' in schema public), got {table!r}")
        return table if "." in table else f"public.{table}"

    @model_validator(mode="after")
    def _connection(self) -> PostgresSinkOptions:
        if not self.postgres_conn_id and not self.conninfo:
            raise ValueError("name the database with postgres_conn_id (an Airflow Postgres connection) or conninfo "
                             "(a libpq connection string without a password)")
        if _PASSWORD.search(self.conninfo):
            raise ValueError("conninfo holds a password, and the sink's options are stored in the checkpoint store; "
                             "put the credentials in an Airflow Postgres connection and name it in postgres_conn_id "
                             "(or use a password file, PGPASSFILE)")
        if self.epoch_column in self.merge_keys:
            raise ValueError(f"epoch_column must be a column name (not a merge key), got {self.epoch_column!r}")
        return self

    @property
    def schema_name(self) -> str:
        """The table's schema."""
        return self.table.partition(".")[0]

    @property
    def name(self) -> str:
        """The table's name in its schema."""
        return self.table.partition(".")[2]

    def target_url(self) -> str:
        """The table as an Airflow asset URI of the Postgres provider, ``postgres://host:port/database/schema/table``
        (from ``conninfo``; for ``postgres_conn_id`` its id stands for the host: it is read only when a task runs)."""
        host, port, database = self.postgres_conn_id, "5432", "default"
        if self.conninfo and not self.postgres_conn_id:
            found = _conninfo_fields(self.conninfo)
            host = found.get("host", "localhost").split(",")[0] or "localhost"
            port = found.get("port", "5432").split(",")[0] or "5432"
            database = found.get("dbname") or "default"
        if host.startswith("/"):  # a Unix socket directory
            host = "localhost"
        return f"postgres://{host}:{port}/{database}/{self.schema_name}/{self.name}"

    def session_settings(self) -> dict[str, str]:
        """The PostgreSQL settings each connection of the sink sets (milliseconds)."""
        return {"lock_timeout": _ms(self.lock_timeout_s), "statement_timeout": _ms(self.statement_timeout_s),
                "idle_in_transaction_session_timeout": _ms(self.idle_in_transaction_timeout_s)}


#: A sink's options, whichever its type (``SinkManifest.table``), told apart by ``type``.
SinkOptions = Annotated[FileSinkOptions | IcebergSinkOptions | DeltaSinkOptions | PostgresSinkOptions,
                        Field(discriminator="type")]
#: The sink option models by type (:func:`core.options.parse` takes it).
SINK_OPTIONS = keyed(FileSinkOptions, IcebergSinkOptions, DeltaSinkOptions, PostgresSinkOptions)


def recorded_options(options: Any) -> SinkOptionsBase | dict[str, Any] | None:
    """``options`` (a model, or a stored or declared mapping naming its ``type``) as its model, what
    ``SinkManifest.table`` holds; None for None. ValueError names what does not fit."""
    if options is None or isinstance(options, SinkOptionsBase):
        return options
    if not isinstance(options, Mapping) or not isinstance(options.get("type"), str):
        raise ValueError(f"a sink's options must name its type, found {options!r}")
    model = SINK_OPTIONS.get(options["type"])
    if model is None:
        from airflow_seatunnel_ckpt.core.sinks import CONNECTORS  # (the package imports the records)

        model = CONNECTORS.options_model(options["type"])
    if model is None:  # a type registered without a model checks its own options, an unknown one is
        return dict(options)  # refused with the known ones before the decision (core.sinks.connector)
    try:
        parsed: SinkOptionsBase = checked(model, options, f"{options['type']} sink options")
        return parsed
    except ConfigError as exc:
        raise ValueError(str(exc)) from None


def replay_refusal(epochs: Mapping[int, PostgresSinkOptions]) -> str | None:
    """Why a replay cannot replace the rows of a PostgreSQL append sink's ``epochs`` (epoch -> its options): one
    without an ``epoch_column`` (None: it can)."""
    lacking = sorted(e for e, options in epochs.items() if not options.epoch_column)
    if not lacking or any(o.merge_keys for o in epochs.values()):
        return None
    table = next(iter(epochs.values())).table
    return (f"it appends to the PostgreSQL table {table} without an epoch_column in epoch(s) {lacking}, so the rows "
            "those epochs appended cannot be told from the others, and the replay would add them again beside "
            f"them. Give the sink an epoch_column (ALTER TABLE {table} ADD COLUMN _seatunnel_epoch bigint, then "
            "epoch_column: '_seatunnel_epoch' in its options): epochs committed from then on can be replayed")


def _ms(seconds: float) -> str:
    return str(max(1, round(seconds * 1000)))


def _conninfo_fields(conninfo: str) -> dict[str, str]:
    """``host``, ``port`` and ``dbname`` of a libpq connection string (keyword or URL form), as far as given."""
    if conninfo.startswith(("postgres://", "postgresql://")):
        url = urlsplit(conninfo)
        found = {"host": url.hostname or "", "port": str(url.port or ""), "dbname": url.path.lstrip("/")}
        found.update({k: v[-1] for k, v in parse_qs(url.query).items()})
        return {k: v for k, v in found.items() if v}
    try:
        words = shlex.split(conninfo)
    except ValueError:
        return {}
    return {k.strip(): v for k, _, v in (w.partition("=") for w in words) if v}
