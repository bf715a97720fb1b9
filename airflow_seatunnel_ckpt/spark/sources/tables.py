"""Table sources: Iceberg snapshots, Delta versions and another pipeline's published epochs, whose offsets are the
table's positions plus the exact data files between them (:mod:`airflow_seatunnel_ckpt.core.sources.tables`), read by
Spark as plain Parquet (docs/tables/sources.md)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import reduce
from typing import TYPE_CHECKING, Any

from airflow_seatunnel_ckpt.core.catalogs import checked_table_options, embedded_catalog
from airflow_seatunnel_ckpt.core.errors import CheckpointError
from airflow_seatunnel_ckpt.core.sinks.files import EPOCHS, EpochsPointer
from airflow_seatunnel_ckpt.core.sources import delta as delta_planning
from airflow_seatunnel_ckpt.core.sources import iceberg as iceberg_planning
from airflow_seatunnel_ckpt.core.sources import tables as planning
from airflow_seatunnel_ckpt.core.sources.base import as_source_error, files_gone
from airflow_seatunnel_ckpt.core.sources.options import (
    DeltaSourceOptions,
    FileSourceOptions,
    IcebergSourceOptions,
    PipelineOutputSourceOptions,
    constructor_signature,
)
from airflow_seatunnel_ckpt.core.sources.tables import TableSourceError
from airflow_seatunnel_ckpt.spark.locations import fsspec_url, hadoop_path
from airflow_seatunnel_ckpt.spark.sources.base import Source, SourceError
from airflow_seatunnel_ckpt.spark.sources.files import FileSource, file_identity

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructType


def _empty(spark: SparkSession, arrow_schema: Any) -> DataFrame:
    """An empty DataFrame with the table's columns (an epoch with nothing new)."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import from_arrow_schema

    schema: StructType = from_arrow_schema(pa.schema(arrow_schema))
    return spark.createDataFrame([], schema)


def _read_parquet(spark: SparkSession, paths: list[str]) -> DataFrame:
    # Files written under older schemas lack columns added since: merge, as the table would.
    return spark.read.option("mergeSchema", "true").parquet(*paths)


class IcebergSource(Source):
    """An Apache Iceberg table: each epoch reads the rows appended since the last one (``{"snapshot_id",
    "after_snapshot_id", "files": [{"path", "size", "records"}]}``)."""

    kind = "iceberg"

    def __init__(self, name: str, table: str, **options: Any) -> None:
        super().__init__(name)
        self.settings = settings = self.checked_options(IcebergSourceOptions, {"table": table, **options})
        catalog = checked_table_options(
            f"iceberg source {name!r}", settings.table, settings.catalog,
            "Give the catalog's credentials to the Spark driver's environment (PYICEBERG_CATALOG__* variables)")
        self.table = settings.table
        # Resolved here, as the Iceberg sink does: every process reads the same catalog.
        self.catalog = catalog or embedded_catalog()
        self.catalog_name = settings.catalog_name
        self.start = settings.start
        self.skip = {"overwrite": settings.skip_overwrites, "delete": settings.skip_deletes}

    @property
    def where(self) -> str:
        """How errors name this source."""
        return f"iceberg source {self.name!r} (table {self.table})"

    def _load(self) -> Any:
        return iceberg_planning.load_iceberg_table(self.table, self.catalog_name, self.catalog, self.where)

    def plan(self, history: list[dict[str, Any]]) -> dict[str, Any]:
        """The data files appended since the consumed snapshot (see the class docs)."""
        with as_source_error(TableSourceError):
            return iceberg_planning.plan_iceberg(self._load(), history, start=self.start, skip=self.skip,
                                         where=self.where)

    def pinned_gone(self, offsets: Mapping[str, Any]) -> list[str]:
        """The pinned data files gone (snapshot expiry, orphan-file removal) or of another size, asked through the
        table's own file IO (its credentials, as the catalog configures them)."""
        with as_source_error(TableSourceError):
            files = planning.planned_files(offsets, self.where)
            if not files:
                return []
            io = self._load().io
        gone = []
        for f in files:
            found = io.new_input(f.path)
            if not found.exists():
                gone.append(f"data file {f.path} is gone")
            elif len(found) != f.size:
                gone.append(f"data file {f.path} changed since the epoch pinned it ({len(found)} bytes, pinned "
                            f"{f.size})")
        return gone

    def read(self, spark: SparkSession, offsets: Mapping[str, Any]) -> DataFrame:
        """Exactly the planned data files, as Parquet (the table's columns if there are none)."""
        with as_source_error(TableSourceError):
            files = planning.planned_files(offsets, self.where)
            if not files:
                return _empty(spark, self._load().schema().as_arrow())
        return _read_parquet(spark, [hadoop_path(f.path) for f in files])


class DeltaSource(Source):
    """A Delta Lake table: each epoch reads the rows the versions since the last one appended (``{"version",
    "after_version", "files": [...]}``); partition columns come back from the log, typed as the table."""

    kind = "delta"

    def __init__(self, name: str, path: str, **options: Any) -> None:
        super().__init__(name)
        self.settings = settings = self.checked_options(DeltaSourceOptions, {"path": path, **options})
        self.url = fsspec_url(settings.path).rstrip("/")
        self.storage_options = {k: str(v) for k, v in settings.storage_options.items()}
        self.start = settings.start
        self.skip_change_commits = settings.skip_change_commits

    @property
    def where(self) -> str:
        """How errors name this source."""
        return f"delta source {self.name!r} ({self.url})"

    def plan(self, history: list[dict[str, Any]]) -> dict[str, Any]:
        """The data files the versions since the consumed one appended (see the class docs)."""
        with as_source_error(TableSourceError):
            return delta_planning.plan_delta(self.url, self.storage_options, history, start=self.start,
                                       skip_change_commits=self.skip_change_commits, where=self.where)

    def pinned_gone(self, offsets: Mapping[str, Any]) -> list[str]:
        """The pinned data files gone (``VACUUM``) or of another size, listed once per directory."""
        try:
            files = planning.planned_files(offsets, self.where)
            return files_gone({f.path: {"size": f.size} for f in files},
                              delta_planning.fsspec_options(self.url, self.storage_options),
                              lambda ident, info: int(info.get("size") or 0) == ident["size"])
        except TableSourceError as exc:
            raise SourceError(str(exc)) from exc
        except Exception as exc:
            raise SourceError(f"{self.where}: cannot list the pinned data files: {exc}") from exc

    def _table(self) -> Any:
        from deltalake import DeltaTable

        return DeltaTable(self.url, storage_options=self.storage_options or None)

    def read(self, spark: SparkSession, offsets: Mapping[str, Any]) -> DataFrame:
        """The planned files, with the partition values of each added where the file lacks them."""
        with as_source_error(TableSourceError):
            files = planning.planned_files(offsets, self.where)
        table = self._table()
        if not files:
            return _empty(spark, table.schema().to_arrow())
        fields = json.loads(table.schema().to_json())["fields"]
        types = {f["name"]: f["type"] for f in fields}
        # One read per distinct partition: each file's values become literal columns.
        groups: dict[tuple[tuple[str, str | None], ...], list[str]] = {}
        for f in files:
            groups.setdefault(tuple(sorted(f.partition.items())), []).append(hadoop_path(f.path))
        frames = []
        for values, paths in groups.items():
            frame = _read_parquet(spark, paths)
            for column, value in values:
                if column not in frame.columns:
                    frame = frame.withColumn(column, partition_literal(value, types.get(column, "string")))
            frames.append(frame)
        data = reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), frames)
        ordered = [f["name"] for f in fields if f["name"] in data.columns]
        return data.select(*ordered, *[c for c in data.columns if c not in ordered])


def partition_literal(value: str | None, delta_type: Any) -> Column:
    """A Delta partition value (the log's string form) as a typed literal column."""
    from pyspark.sql import functions as F

    type_name = delta_type if isinstance(delta_type, str) else "string"
    if value is not None and type_name == "timestamp" and "T" not in value and not value.endswith("Z"):
        value = value + "Z"  # the log writes timestamps in UTC without a zone
    return F.lit(value).cast(type_name)


class PipelineOutputSource(FileSource):
    """Another pipeline's file sink target, read one committed epoch at a time.

    Only epoch directories holding ``_SUCCESS`` are read, each once (a set: a late epoch is still read); options as the
    file source's. Offsets: ``{"epochs": [...], "files": [...], "identity": {...}}``. An upstream replay's hidden
    directories are never read; one replacing epochs already read is refused, or passed over with ``skip_replays``
    (:func:`core.sources.tables.plan_published_epochs`).
    """

    kind = "pipeline_output"

    def __init__(self, name: str, path: str, **options: Any) -> None:
        Source.__init__(self, name)
        settings = self.checked_options(PipelineOutputSourceOptions, {"path": path, **options})
        # The options it shares with the file source configure it as one (they are a subset).
        self._configure(FileSourceOptions.model_validate(settings.model_dump(exclude={"type", "skip_replays"})))
        self.settings = settings  # type: ignore[assignment]
        self.skip_replays = settings.skip_replays

    def epochs_pointer(self) -> EpochsPointer:
        """The target's ``_EPOCHS`` pointer (empty when there is none)."""
        from fsspec.core import url_to_fs

        where = f"{self.url}/{EPOCHS}"
        try:
            fs, root = url_to_fs(self.url, **self.storage_options)
            data = fs.cat_file(f"{root.rstrip('/')}/{EPOCHS}")
        except FileNotFoundError:
            return EpochsPointer()
        except Exception as exc:
            raise SourceError(f"pipeline_output source {self.name!r}: cannot read {where}: {exc}") from exc
        try:
            return EpochsPointer.parse(data, where)
        except CheckpointError as exc:
            raise SourceError(f"pipeline_output source {self.name!r}: {exc}") from exc

    def list_everything(self) -> dict[str, dict[str, Any]]:
        """Every file below the target (``_SUCCESS`` and ``_LATEST`` included) with its identity."""
        from fsspec.core import url_to_fs

        try:
            fs, root = url_to_fs(self.url, **self.storage_options)
            found = fs.find(root, detail=True) if fs.exists(root) else None
        except FileNotFoundError:
            found = None
        except Exception as exc:
            raise SourceError(f"pipeline_output source {self.name!r}: cannot list {self.url}: {exc}") from exc
        if found is None:
            if self.allow_missing:
                return {}
            raise SourceError(
                f"pipeline_output source {self.name!r}: {self.url} does not exist; check the 'path' (the "
                "upstream sink's path), or set allow_missing=True until the upstream pipeline commits its "
                "first epoch")
        prefix = root.rstrip("/") + "/"
        return {str(full)[len(prefix):]: file_identity(info)
                for full, info in found.items() if str(full).startswith(prefix)}

    def plan(self, history: list[dict[str, Any]]) -> dict[str, Any]:
        """Every complete upstream epoch no committed epoch here read (see the class docs)."""
        for _ in range(10):  # a listing between two reads of the pointer that agree: one consistent set
            pointer = self.epochs_pointer()
            listing = self.list_everything()
            if self.epochs_pointer() == pointer:
                break
        else:
            raise SourceError(f"pipeline_output source {self.name!r}: {self.url}/{EPOCHS} changed during each "
                              "listing (an upstream replay is swapping epochs); the epoch runs again later")
        with as_source_error(TableSourceError):
            return planning.plan_published_epochs(listing, history, f"pipeline_output source {self.name!r} "
                                                  f"({self.url})", pointer, self.skip_replays)

    def read_checked(self, spark: SparkSession, offsets: Mapping[str, Any]) -> tuple[DataFrame, DataFrame | None]:
        """As the file source; a partitioned upstream sink's columns are discovered below the epoch directories (the
        ``epoch`` directory itself is not a column)."""
        files = [str(f) for f in offsets.get("files", [])]
        if not any(f.count("/") > 1 for f in files):
            return super().read_checked(spark, offsets)
        saved = self.options
        self.options = {**saved, "basePath": hadoop_path(self.url)}
        try:
            data, rejected = super().read_checked(spark, offsets)
        finally:
            self.options = saved
        return data.drop("epoch"), rejected


IcebergSource.__init__.__signature__ = constructor_signature(IcebergSourceOptions)  # type: ignore[attr-defined]
DeltaSource.__init__.__signature__ = constructor_signature(DeltaSourceOptions)  # type: ignore[attr-defined]
PipelineOutputSource.__init__.__signature__ = constructor_signature(PipelineOutputSourceOptions)  # type: ignore[attr-defined]
