"""The PostgreSQL sources: ``postgres_cdc`` (logical replication) and ``postgres_query`` (an incremental column's
high-water mark).

Both plan in the core (:mod:`~airflow_seatunnel_ckpt.core.sources.postgres_cdc`,
:mod:`~airflow_seatunnel_ckpt.core.sources.postgres_query`); here the pinned range is read on the driver over one
connection and handed to Spark as one Arrow table (:func:`dataframe`). docs/CDC.md describes the rows.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from itertools import groupby
from operator import itemgetter
from typing import TYPE_CHECKING, Any

from airflow_seatunnel_ckpt.core.options import checked
from airflow_seatunnel_ckpt.core.sources.base import as_source_error
from airflow_seatunnel_ckpt.core.sources.options import (
    PostgresCdcSourceOptions,
    PostgresQuerySourceOptions,
    constructor_signature,
)
from airflow_seatunnel_ckpt.core.sources.pgoutput import (
    OPS,
    PG_EPOCH_MICROS,
    ChangeColumns,
    Column,
    Decoder,
    arrow_type,
    arrow_values,
    spark_type,
)
from airflow_seatunnel_ckpt.core.sources.postgres_cdc import PostgresCdc
from airflow_seatunnel_ckpt.core.sources.postgres_query import PostgresQuery
from airflow_seatunnel_ckpt.spark.sources.files import Source, SourceError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: The columns every change row carries besides the table's, with their Spark types.
CHANGE_COLUMNS = (("_table", "string"), ("_op", "string"), ("_lsn", "bigint"), ("_seq", "int"),
                  ("_commit_ts", "timestamp"), ("_xid", "bigint"), ("_unchanged_toast", "array<string>"))


def table_columns(by_table: Mapping[str, Sequence[Column]]) -> dict[str, str]:
    """Column name -> Spark type over all tables (a name with two types across tables becomes string)."""
    out: dict[str, str] = {}
    for columns in by_table.values():
        for column in columns:
            kind = spark_type(column.type_oid, column.type_modifier)
            out[column.name] = kind if out.get(column.name, kind) == kind else "string"
    return out


def dataframe(spark: SparkSession, columns: Sequence[tuple[str, str, list[Any], bool]]) -> DataFrame:
    """A DataFrame of ``columns`` (name, Spark type, values, whether they are PostgreSQL's text output) from one Arrow
    table, each column converted at once (:func:`~airflow_seatunnel_ckpt.core.sources.pgoutput.arrow_values`)."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import from_arrow_schema

    table = pa.Table.from_arrays([arrow_values(kind, values) if text else pa.array(values, arrow_type(kind))
                                  for _, kind, values, text in columns], names=[name for name, *_ in columns])
    # An Arrow timestamp without a time zone is Spark's timestamp_ntz, with one (UTC) its timestamp.
    return spark.createDataFrame(table, from_arrow_schema(table.schema, prefer_timestamp_ntz=True))


def _options(model: type[Any], name: str, options: Mapping[str, Any]) -> Any:
    return checked(model, {"type": model.model_fields["type"].default, **options},
                   f"source {name!r} (type {model.model_fields['type'].default!r})")


class PostgresCdcSource(Source):
    """The changes committed to a publication's tables since the last committed epoch (module docs)."""

    kind = "postgres_cdc"

    def __init__(self, name: str, **options: Any) -> None:
        super().__init__(name)
        self.options: PostgresCdcSourceOptions = _options(PostgresCdcSourceOptions, name, options)
        self.cdc = PostgresCdc(self.options, f"postgres_cdc source {name!r} (slot {self.options.slot!r})")
        #: The last read's rows by ``_op`` (snapshot rows are inserts), for :meth:`read_figures`.
        self.changes: dict[str, int] | None = None

    def plan(self, history: list[dict[str, Any]]) -> dict[str, Any]:
        """The LSN range after the committed position; the first epoch creates the slot (and its snapshot)."""
        with as_source_error():
            return self.cdc.plan(history)

    def repin(self, offsets: Mapping[str, Any]) -> dict[str, Any] | None:
        """The first epoch's slot and snapshot made again when the pinned snapshot was another process's."""
        with as_source_error():
            return self.cdc.repin(offsets)

    def verify_pinned(self, offsets: Mapping[str, Any]) -> None:
        """Refuse unless the slot still holds every change of the pinned range (a snapshot is never read twice)."""
        if offsets.get("snapshot"):
            raise SourceError(f"{self.cdc.where}: the epoch read the tables whole through a snapshot exported when "
                              "its slot was created, which no later process can read again")
        with as_source_error():
            self.cdc.check(offsets)

    def read_figures(self) -> dict[str, Any]:
        """The last read's change counts by operation (``{"changes": {"insert": n, ...}}``)."""
        return {} if self.changes is None else {"changes": dict(self.changes)}

    def read(self, spark: SparkSession, offsets: Mapping[str, Any]) -> DataFrame:
        """Exactly the pinned range's changes (and the first epoch's snapshot rows), ordered by (_lsn, _seq)."""
        with as_source_error():
            self.cdc.check(offsets)  # the server, slot and publication, before anything is read
            with self.cdc.connect() as conn:
                by_table: dict[str, list[Column]] = self.cdc.columns(conn, list(offsets["tables"]))
            decoder = Decoder({t: [c.name for c in cols if c.key] for t, cols in by_table.items()})
            rows = ChangeColumns()
            if offsets.get("snapshot"):
                for table, group in groupby(self.cdc.snapshot_rows(offsets, by_table), key=itemgetter(0)):
                    rows.add_rows(table, [c.name for c in by_table[table]], (list(v.values()) for _, v in group),
                                  int(offsets["start"]))
            self.cdc.read_changes(offsets, decoder, rows)
        counts = Counter(rows.meta["_op"])
        self.changes = {op: counts[op] for op in OPS}
        # Columns a relation message named (added since the catalog was read) count too.
        for relation in decoder.relations.values():
            known = {c.name for c in by_table.get(relation.table, [])}
            by_table.setdefault(relation.table, []).extend(c for c in relation.columns if c.name not in known)
        columns = {**table_columns(by_table), **dict(CHANGE_COLUMNS)}
        # The commit timestamps come as protocol microseconds: an instant in 1970's microseconds, for Arrow.
        rows.meta["_commit_ts"] = [None if v is None else v + PG_EPOCH_MICROS for v in rows.meta["_commit_ts"]]
        return dataframe(spark, [(n, kind, rows.meta[n], False) if n in rows.meta else
                                 (n, kind, rows.values.get(n, [None] * rows.count), True)
                                 for n, kind in columns.items()])


class PostgresQuerySource(Source):
    """The rows of a table whose ``incremental_column`` moved past the committed position (module docs)."""

    kind = "postgres_query"

    def __init__(self, name: str, **options: Any) -> None:
        super().__init__(name)
        self.options: PostgresQuerySourceOptions = _options(PostgresQuerySourceOptions, name, options)
        self.query = PostgresQuery(self.options, f"postgres_query source {name!r} (table {self.options.table})")

    def plan(self, history: list[dict[str, Any]]) -> dict[str, Any]:
        """The value range after the committed position, with the keys at its boundaries."""
        with as_source_error():
            return self.query.plan(history)

    def pinned_gone(self, offsets: Mapping[str, Any]) -> list[str]:
        """A replay's check: the same table, and as many rows in the pinned range as when it was planned."""
        with as_source_error():
            return self.query.pinned_gone(offsets, rows=True)

    def read(self, spark: SparkSession, offsets: Mapping[str, Any]) -> DataFrame:
        """The rows of the pinned range, with the table's columns as they are now (refused when the table is another one
        under the name)."""
        with as_source_error():
            gone = self.query.pinned_gone(offsets, rows=False)
            if gone:
                raise SourceError(f"{self.where}: {gone[0]}. The epoch reads exactly the range it pinned of the "
                                  "table it planned; abort the epoch (the next one plans the table as it is now)")
            with self.query.connect() as conn:
                columns = self.query.columns(conn)
            rows = list(self.query.rows(offsets, columns))
        return dataframe(spark, [(c.name, spark_type(c.type_oid, c.type_modifier), [row[i] for row in rows], True)
                                 for i, c in enumerate(columns)])


PostgresCdcSource.__init__.__signature__ = constructor_signature(PostgresCdcSourceOptions)  # type: ignore[attr-defined]
PostgresQuerySource.__init__.__signature__ = constructor_signature(PostgresQuerySourceOptions)  # type: ignore[attr-defined]
