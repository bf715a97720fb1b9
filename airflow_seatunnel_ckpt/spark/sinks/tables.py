"""Table sinks, Spark side (Iceberg, Delta, PostgreSQL): Parquet staged so that the commit (in Python,
:mod:`core.sinks`) can add the files as they are.

The partition columns stay inside the files (the staging is partitioned by hidden copies, ``__partition_<column>``:
pyiceberg's ``add_files`` would take NULL partitions silently), timestamps are ``TIMESTAMP_MICROS`` (Iceberg refuses
INT96), and the typed options (never secrets) travel in the manifest (``SinkManifest.table``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from airflow_seatunnel_ckpt.core.catalogs import checked_table_options, embedded_catalog
from airflow_seatunnel_ckpt.core.errors import ConfigError
from airflow_seatunnel_ckpt.core.options import checked
from airflow_seatunnel_ckpt.core.sinks import changes
from airflow_seatunnel_ckpt.core.sinks.options import (
    TIMEOUTS,
    ApplyChanges,
    DeltaSinkOptions,
    IcebergSinkOptions,
    PostgresSinkOptions,
    SinkOptionsBase,
)
from airflow_seatunnel_ckpt.spark.locations import fsspec_url
from airflow_seatunnel_ckpt.spark.session import session_conf
from airflow_seatunnel_ckpt.spark.sinks.files import FileSink

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

#: Prefix of the hidden directory columns the staging is partitioned by.
PARTITION_PREFIX = "__partition_"


class TableSink(FileSink):
    """A sink whose epochs are committed into a table format (see the module docs)."""

    #: ``SinkManifest.table.type``: the :mod:`core.sinks` module that commits it.
    table_type: ClassVar[str] = ""

    def __init__(self, name: str, target_url: str, options: SinkOptionsBase,
                 expectations: Mapping[str, Any] | None = None) -> None:
        """``options``: the sink's checked options (what the commit needs; never secrets)."""
        partition_by = list(getattr(options, "partition_by", []))
        self._init(name, target_url, str(getattr(options, "mode", "append")), expectations, "parquet", {},
                   partition_by)
        bad = [c for c in self.partition_by if not c]
        if bad:
            raise ConfigError(f"{self.table_type} sink {name!r}: partition_by must be column names, got {bad}")
        #: What the commit needs to find the table (recorded in the prepared record).
        self.table = options.recorded()

    def _stage(self, df: DataFrame, *, count: bool = True) -> int:
        """Stage ``df`` as Parquet data files of the table (one partition value per file); change rows of an
        ``apply_changes`` sink collapsed to the last per key first (:func:`last_change_per_key`)."""
        from pyspark.sql import functions as F

        apply = getattr(self.table, "apply_changes", None)
        if apply is not None:
            df = last_change_per_key(df, apply, f"{self.table_type} sink {self.name!r}")

        missing = [c for c in self.partition_by if c not in df.columns]
        if missing:
            raise ConfigError(
                f"{self.table_type} sink {self.name!r}: partition column(s) {missing} not in the DataFrame "
                f"(columns: {df.columns})")
        hidden = [f"{PARTITION_PREFIX}{c}" for c in self.partition_by]
        staged = df
        for column, copy in zip(self.partition_by, hidden, strict=True):
            staged = staged.withColumn(copy, F.col(column))
        saved, self.partition_by = self.partition_by, hidden
        try:
            with session_conf(df.sparkSession, "spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS"):
                return super()._stage(staged, count=count)
        finally:
            self.partition_by = saved


def last_change_per_key(df: DataFrame, apply: ApplyChanges, where: str) -> DataFrame:
    """``df``'s change rows collapsed to the last per key (the highest ``sequence_by``), without the ``except_columns``,
    the operation column kept; ConfigError for a missing key, sequence or operation column."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    changes.check_columns(df.columns, apply, where, "the DataFrame")
    if not apply.deletes:  # ignored deletes are no change: the change before one is the key's last
        df = df.where(~F.col(apply.operation).eqNullSafe("delete"))
    last = Window.partitionBy(*apply.keys).orderBy(*[F.col(c).desc_nulls_last() for c in apply.sequence_by])
    rank = "__apply_changes_rank"
    kept = [c for c in df.columns if c not in set(apply.except_columns)]
    return df.withColumn(rank, F.row_number().over(last)).where(F.col(rank) == 1).select(*kept)


# -- The Iceberg sink: ``{"type": "iceberg", "table": "<namespace>.<name>", ...}`` in a stage spec. ---

class IcebergSink(TableSink):
    """Epochs committed into an Apache Iceberg table with pyiceberg (one snapshot per epoch).

    Options: :class:`IcebergSinkOptions`; no ``catalog`` and no ``catalog_conn_id`` is the embedded SQLite catalog,
    resolved here so that every committer uses the same one (docs/tables/iceberg.md).
    """

    table_type = "iceberg"

    def __init__(self, name: str, table: str, catalog: Mapping[str, Any] | None = None,
                 catalog_name: str = "default", catalog_conn_id: str | None = None,
                 partition_by: Sequence[str] | None = None, mode: str | None = None,
                 merge_keys: Sequence[str] | None = None, expectations: Mapping[str, Any] | None = None,
                 apply_changes: Mapping[str, Any] | None = None) -> None:
        where = f"iceberg sink {name!r}"
        options = checked(IcebergSinkOptions, {"table": table, "catalog": dict(catalog or {}),
                                               "catalog_name": catalog_name, "catalog_conn_id": catalog_conn_id,
                                               "partition_by": list(partition_by or []), "mode": mode,
                                               "merge_keys": merge_keys, "apply_changes": apply_changes}, where)
        props = checked_table_options(
            where, options.table, options.catalog,
            "Put them in an Airflow connection and name it in catalog_conn_id (its extras are pyiceberg "
            "properties, login/password the credential)")
        if not props and not options.catalog_conn_id:
            props = embedded_catalog()
        super().__init__(name, f"iceberg://{options.catalog_name}/{options.table}",
                         options.model_copy(update={"catalog": props}), expectations=expectations)

    def quarantine_options(self) -> dict[str, Any] | None:
        """A table ``<namespace>.<name>_quarantine`` beside this one, in the same catalog."""
        assert isinstance(self.table, IcebergSinkOptions)
        options: dict[str, Any] = {"type": "iceberg", "table": f"{self.table.table}_quarantine",
                                   "catalog": self.table.catalog, "catalog_name": self.table.catalog_name}
        if self.table.catalog_conn_id:
            options["catalog_conn_id"] = self.table.catalog_conn_id
        return options


# -- The Delta sink: ``{"type": "delta", "path": "<table URL>", ...}`` in a stage spec. ------------

#: Where the commit (delta-rs on the committing task) can reach a table.
TABLE_PROTOCOLS = ("file", "s3")


class DeltaSink(TableSink):
    """Epochs committed into a Delta Lake table with delta-rs (one table version per epoch).

    Options: :class:`DeltaSinkOptions`; credentials are never options: the commit reuses the store's or a secret
    resolver's (docs/tables/delta.md).
    """

    table_type = "delta"

    def __init__(self, name: str, path: str, partition_by: Sequence[str] | None = None,
                 mode: str | None = None, merge_keys: Sequence[str] | None = None,
                 expectations: Mapping[str, Any] | None = None, apply_changes: Mapping[str, Any] | None = None) -> None:
        options = checked(DeltaSinkOptions, {"path": path, "partition_by": list(partition_by or []), "mode": mode,
                                             "merge_keys": merge_keys, "apply_changes": apply_changes},
                          f"delta sink {name!r}")
        url = fsspec_url(options.path).rstrip("/")
        protocol = url.split("://", 1)[0]
        if protocol not in TABLE_PROTOCOLS:
            raise ConfigError(f"delta sink {name!r}: path {path!r} is on {protocol}://, where delta-rs cannot "
                              f"commit here; use one of {[p + '://' for p in TABLE_PROTOCOLS]} (or s3a://)")
        super().__init__(name, url, options.model_copy(update={"path": url}), expectations=expectations)

    def quarantine_options(self) -> dict[str, Any] | None:
        """A table ``<path>_quarantine`` beside this one."""
        return {"type": "delta", "path": f"{self.target_url}_quarantine"}


# -- The PostgreSQL sink: ``{"type": "postgres", "table": "<schema>.<name>", ...}`` in a stage spec. ---

class PostgresSink(TableSink):
    """Epochs committed into a PostgreSQL table (one transaction per epoch, with its marker row).

    Options: :class:`PostgresSinkOptions`; only the connection's name is recorded, its password is read at commit
    (docs/POSTGRES.md).
    """

    table_type = "postgres"

    def __init__(self, name: str, table: str, postgres_conn_id: str | None = None, conninfo: str | None = None,
                 mode: str | None = None, merge_keys: Sequence[str] | None = None, create_table: bool = False,
                 epoch_column: str = "", lock_timeout_s: float = TIMEOUTS["lock_timeout_s"],
                 statement_timeout_s: float = TIMEOUTS["statement_timeout_s"],
                 idle_in_transaction_timeout_s: float = TIMEOUTS["idle_in_transaction_timeout_s"],
                 expectations: Mapping[str, Any] | None = None, apply_changes: Mapping[str, Any] | None = None) -> None:
        options = checked(PostgresSinkOptions, {
            "table": table, "postgres_conn_id": postgres_conn_id, "conninfo": conninfo, "mode": mode,
            "merge_keys": merge_keys, "create_table": create_table, "epoch_column": epoch_column,
            "lock_timeout_s": lock_timeout_s, "statement_timeout_s": statement_timeout_s,
            "idle_in_transaction_timeout_s": idle_in_transaction_timeout_s, "apply_changes": apply_changes},
            f"postgres sink {name!r}")
        super().__init__(name, options.target_url(), options, expectations=expectations)

    def quarantine_options(self) -> dict[str, Any] | None:
        """None: quarantined rows hold a list column, which the sink's CSV load cannot take (use ``drop``)."""
        return None
