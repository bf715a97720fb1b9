"""The sources' options, typed: one model per source type, keyed on ``type``.

A model checks each option's type and values; what depends on several options together is
checked by the source built from it. Every option name a DAG could use is a field here.
"""

from __future__ import annotations

import inspect
import re
import warnings
from typing import Annotated, Any, Literal

from annotated_types import Ge, MinLen
from pydantic import BeforeValidator, Field, StrictBool, StrictInt, field_validator, model_validator
from pydantic_core import PydanticCustomError

from airflow_seatunnel_ckpt.core.options import PASSWORD_IN_CONNINFO, Options, keyed

PositiveInt = Annotated[StrictInt, Ge(1)]
#: Where a table or Kafka source starts when no committed epoch read it yet.
Start = Literal["earliest", "latest"]
#: Formats Spark reads without extra packages.
FileFormat = Literal["parquet", "json", "csv", "orc"]


def _no_flag(value: Any) -> Any:
    """Refuse true/false where a number is meant (pydantic would read True as 1.0)."""
    if isinstance(value, bool):
        raise PydanticCustomError("age", 'must be a positive number of seconds or a duration such as "7d", "12h"')
    return value


# "schema" is the option's name in every DAG; on a model it shadows pydantic's deprecated
# ``BaseModel.schema()``, which nothing here calls.
warnings.filterwarnings("ignore", message='Field name "schema" in ".*SourceOptions" shadows', category=UserWarning)


class FileSourceOptions(Options):
    """Files below a directory, each read by exactly one committed epoch (docs/FILE_SOURCES.md)."""

    type: Literal["file"] = "file"
    path: Annotated[str, MinLen(1)]
    """The input directory, any fsspec URL (``file:///data/in``, ``s3://bucket/in``); files and folders
    whose names start with ``_`` or ``.`` are skipped."""
    format: FileFormat = "parquet"
    """How Spark reads the files."""
    options: dict[str, Any] = Field(default_factory=dict)
    """Spark reader options (``{"header": "true"}``); a csv header is checked against the schema
    (``enforceSchema=false``). Spark's own ``mode`` (``DROPMALFORMED``, ``FAILFAST``) turns the source's
    record check off."""
    schema: str | None = None  # type: ignore[assignment]  # shadows the deprecated BaseModel.schema()
    """DDL schema string (``"order_id long, amount double"``); none: inferred. Recommended for csv and
    json; also the schema of an epoch without new files."""
    max_files_per_epoch: PositiveInt | None = None
    """Read at most this many new files per epoch (none: all): oldest names first; with ``max_file_age``,
    oldest modification times first, so no waiting file falls behind the watermark."""
    storage_options: dict[str, Any] = Field(default_factory=dict)
    """fsspec options used to list the directory."""
    allow_missing: StrictBool = False
    """A directory that does not exist is an error (a mistyped path); true: empty epochs are planned until
    it appears (on object stores an empty prefix counts as missing)."""
    on_change: Literal["error", "reread"] = "error"
    """A consumed file that changed under its name (other size, mtime or ETag): ``error`` fails the epoch;
    ``reread`` reads it again in full and hands every row to the stage as new input (what was published
    stays). A stage that de-duplicates by key then drops the rows whose keys it already saw, corrected ones
    included: a correction never reaches the sinks."""
    bad_records: Annotated[str, MinLen(1)] | None = None
    """csv and json only: a directory URL taking the records that do not parse against the schema (a wrong
    type, extra or missing csv fields, a broken JSON line) as JSON lines (``source``, ``file``, ``record``,
    ``parsed``), in a sink ``<source>.bad_records`` published with the epoch; they reach no other sink or
    state, and the rest goes on. None: such a record fails the epoch, naming its file and line."""
    prefixes: Annotated[list[str], MinLen(1)] | None = None
    """Subfolders of ``path`` to list (none: all of ``path``), relative, globs and Airflow templates allowed
    (``["dt={{ ds }}/"]``, ``["dt=*/hour=*/"]``): a year of input is not listed every hour; file names stay
    relative to ``path``."""
    max_file_age: Annotated[float | str | None, BeforeValidator(_no_flag)] = None
    """Seconds, or ``"7d"``, ``"12h"``: files older than the newest committed file minus this are ignored
    and leave the consumed-file index (Spark's ``maxFileAge``); widening or removing it later never lists
    below what the index already forgot."""
    ordered_prefixes: StrictBool = False
    """The glob ``prefixes`` match partitions whose names sort in time order: per prefix, the partitions
    that sort before the one holding its newest consumed file are not listed (files delivered late into
    them are not seen, unless ``backfill_every`` is set). Not with both ``max_files_per_epoch`` and
    ``max_file_age``."""
    backfill_every: PositiveInt | None = None
    """With ``ordered_prefixes``: every this many epochs (epochs 24, 48, ... for 24) every partition is
    listed, so files delivered late into older partitions are read then (Auto Loader's
    ``backfillInterval``, in epochs)."""


class PipelineOutputSourceOptions(Options):
    """Another pipeline's file sink target, read one committed upstream epoch at a time."""

    type: Literal["pipeline_output"] = "pipeline_output"
    path: Annotated[str, MinLen(1)]
    """The upstream file sink's ``path``."""
    format: FileFormat = "parquet"
    """The upstream sink's format."""
    options: dict[str, Any] = Field(default_factory=dict)
    """Reader options passed to Spark."""
    schema: str | None = None  # type: ignore[assignment]  # shadows the deprecated BaseModel.schema()
    """DDL schema string (used for an epoch with nothing new)."""
    storage_options: dict[str, Any] = Field(default_factory=dict)
    """fsspec options used to list the target."""
    allow_missing: StrictBool = False
    """Plan empty epochs until the upstream pipeline commits its first epoch."""
    bad_records: Annotated[str, MinLen(1)] | None = None
    """Directory URL that takes csv/json records that do not parse, published with the epoch."""
    skip_replays: StrictBool = False
    """Pass over an upstream replay of epochs this source already read (else the epoch is refused)."""


class IcebergSourceOptions(Options):
    """An Apache Iceberg table: each epoch reads the rows appended since the last one."""

    type: Literal["iceberg"] = "iceberg"
    table: str
    """The table, ``namespace.name``."""
    catalog: dict[str, Any] | None = None
    """pyiceberg catalog properties (``{"type": "rest", "uri": ...}``); none: the embedded SQL catalog on
    SQLite under ``$AIRFLOW_HOME/seatunnel-ckpt-warehouse``, the one the Iceberg sink uses by default."""
    catalog_name: str = "default"
    """The catalog's name for pyiceberg."""
    start: Start = "earliest"
    """The first epoch reads every file of the current snapshot (``earliest``) or none (``latest``: only
    rows appended after it)."""
    skip_overwrites: StrictBool = False
    """Pass over ``overwrite`` snapshots instead of failing (Spark's ``streaming-skip-overwrite-snapshots``)."""
    skip_deletes: StrictBool = False
    """Pass over ``delete`` snapshots instead of failing (Spark's ``streaming-skip-delete-snapshots``)."""


class DeltaSourceOptions(Options):
    """A Delta Lake table: each epoch reads the rows the versions since the last one appended."""

    type: Literal["delta"] = "delta"
    path: Annotated[str, MinLen(1)]
    """The table's URL."""
    storage_options: dict[str, Any] = Field(default_factory=dict)
    """delta-rs object-store options (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ...); Spark reaches the
    files through its own configuration."""
    start: Start = "earliest"
    """The first epoch reads the whole current version (``earliest``) or only rows appended after it."""
    skip_change_commits: StrictBool = False
    """Pass over commits that removed rows instead of failing (Delta's ``skipChangeCommits``)."""


class KafkaSourceOptions(Options):
    """Records of Kafka topics: each epoch reads the offsets produced since the last committed one (docs/KAFKA.md)."""

    type: Literal["kafka"] = "kafka"
    bootstrap_servers: str | None = None
    """The brokers, ``host:port[,host:port]`` (or from ``kafka_conn_id``)."""
    topics: list[str] | None = None
    """The topic names read; exactly one of ``topics`` and ``pattern``."""
    pattern: str | None = None
    """A regular expression (Python ``re``) the whole topic name matches; topics created later that match
    are read too; names starting with ``__`` are never matched."""
    max_offsets_per_epoch: PositiveInt | None = None
    """At most this many offsets per epoch (none: everything), spread evenly over the partitions that have
    records: a partition with fewer than its share passes the rest on, and what does not divide evenly goes
    one offset each to the partitions in turn (continued by the next epoch), so none waits forever, even
    under a cap below the number of partitions."""
    starting_offsets: Start = "earliest"
    """Where the pipeline's first epoch starts: ``earliest`` reads what is in the topic, ``latest`` only what
    is produced after its first plan. That first plan is the pipeline's start: an epoch planned after it
    was aborted starts where it started. Partitions found later always start at their earliest offset."""
    fail_on_data_loss: StrictBool = True
    """Records gone before an epoch read them fail the epoch before its decision; false: they are skipped
    and recorded in the epoch's offsets as ``lost``."""
    config: dict[str, Any] | None = None
    """librdkafka settings given directly (they win over the connection's). Recorded in clear in the
    pipeline's descriptor in the store: keep secrets in the connection."""
    kafka_conn_id: str | None = None
    """An Airflow connection whose extras are librdkafka settings (resolved when the task runs; only its
    name is recorded)."""
    group_id: str | None = None
    """The consumer group the clients name to the broker (none: ``seatunnel-ckpt-<source>``); nothing is
    committed to it."""


#: A replication slot's or publication's name as PostgreSQL accepts it unquoted.
_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
#: ``schema.name`` of a published table.
_TABLE = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]*\.[A-Za-z_][A-Za-z0-9_$]*$")


class PostgresSourceOptions(Options):
    """What both PostgreSQL sources share: the connection and the session's bounded waits."""

    postgres_conn_id: str = ""
    """The Airflow Postgres connection the source connects with, on every runtime: read by the stage
    task (a ``spark-submit`` driver gets it from the task, its password in a private password file);
    only its name is recorded."""
    conninfo: str = ""
    """A libpq connection string without a password (``host=... port=... dbname=... user=...``; a
    password comes from a password file, ``PGPASSFILE``), instead of a connection (no Airflow)."""
    lock_timeout_s: float = Field(30.0, gt=0)
    """How long a statement of the source waits for a lock before the epoch fails (and is retried)."""
    statement_timeout_s: float = Field(3600.0, gt=0)
    """How long one statement of the source (reading an epoch's changes or rows) may run."""

    @field_validator("conninfo")
    @classmethod
    def _no_password(cls, value: str) -> str:
        if PASSWORD_IN_CONNINFO.search(value):
            raise ValueError("conninfo holds a password, and a source's options are stored in the checkpoint "
                             "store; put the credentials in an Airflow Postgres connection and name it in "
                             "postgres_conn_id (or use a password file, PGPASSFILE)")
        return value

    @model_validator(mode="after")
    def _one_connection(self) -> PostgresSourceOptions:
        if bool(self.postgres_conn_id) == bool(self.conninfo):
            raise ValueError("name the database with postgres_conn_id (an Airflow Postgres connection) or conninfo "
                             "(a libpq connection string without a password), one of them")
        return self

    @property
    def database(self) -> str:
        """How messages and the in-process caches name the database: the connection's id or the conninfo."""
        return f"connection {self.postgres_conn_id}" if self.postgres_conn_id else self.conninfo

    def session_settings(self) -> dict[str, str]:
        """The settings each connection of the source sets (milliseconds; text values in UTC)."""
        return {"lock_timeout": str(max(1, round(self.lock_timeout_s * 1000))),
                "statement_timeout": str(max(1, round(self.statement_timeout_s * 1000))), "TimeZone": "UTC"}


class PostgresCdcSourceOptions(PostgresSourceOptions):
    """``{"type": "postgres_cdc", ...}``: the changes of a publication's tables through a logical slot."""

    type: Literal["postgres_cdc"] = "postgres_cdc"
    slot: str
    """The logical replication slot (pgoutput) the source reads; the source creates it on its first
    epoch (dropping one of that name that no committed epoch read) and owns it."""
    publication: str
    """The publication whose tables' changes the source reads."""
    tables: list[str] = Field(default_factory=list)
    """Tables (``schema.name``) of the publication the source creates when it does not exist; empty:
    the publication must exist."""
    snapshot: bool = True
    """The first epoch reads the tables whole, as of the slot's start (rows with ``_op`` ``insert``);
    false: it starts with the changes after the slot's creation."""
    keep_epochs: int = Field(1, ge=0)
    """How many of the newest committed epochs' changes the slot keeps (its confirmed position stays
    at their start), so that a replay can read them again; 0: none (the least WAL kept)."""

    @field_validator("slot", "publication")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError("must be a lower-case PostgreSQL name (letters, digits, '_', at most 63)")
        return value

    @field_validator("tables")
    @classmethod
    def _tables(cls, value: list[str]) -> list[str]:
        bad = [t for t in value if not _TABLE.match(t)]
        if bad:
            raise ValueError(f"tables must be schema.name, got {bad}")
        return sorted(set(value))


class PostgresQuerySourceOptions(PostgresSourceOptions):
    """``{"type": "postgres_query", ...}``: the rows of a table whose incremental column moved past the position."""

    type: Literal["postgres_query"] = "postgres_query"
    table: str
    """The table, ``schema.name``."""
    incremental_column: str
    """The column whose growing values say what is new (a sequence, an identity, an ``updated_at`` set
    with ``now()``); rows where it is NULL are never read."""
    key_columns: list[str] = Field(default_factory=list)
    """Columns that tell rows apart at the boundary value; empty: the table's primary key."""
    in_flight_timeout_s: float = Field(60.0, gt=0)
    """How long the plan waits for the transactions open when it took its snapshot to end (their rows
    may carry values below the position) before the epoch fails, to be planned again."""

    @field_validator("table")
    @classmethod
    def _table(cls, value: str) -> str:
        if not _TABLE.match(value):
            raise ValueError("must be schema.name")
        return value


#: Every source type's options model, by ``type``.
SOURCE_OPTIONS = keyed(FileSourceOptions, PipelineOutputSourceOptions, IcebergSourceOptions, DeltaSourceOptions,
                       KafkaSourceOptions, PostgresCdcSourceOptions, PostgresQuerySourceOptions)


def constructor_signature(model: type[Options]) -> inspect.Signature:
    """``(self, name, <required options>, *, <other options>)``: a source's ``__init__`` signature read from its
    options model, so that introspection (the parse-time key check, help()) sees the model's options."""
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD),
              inspect.Parameter("name", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=str)]
    fields = [(n, f) for n, f in model.model_fields.items() if n != "type"]
    params += [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n, f in fields if f.is_required()]
    params += [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=f.get_default(call_default_factory=True))
               for n, f in fields if not f.is_required()]
    return inspect.Signature(params)
