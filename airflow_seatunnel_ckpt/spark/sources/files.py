"""The file source: files below a directory, each read by exactly one committed epoch (its offsets are the files with
their identities; listing is in :mod:`.listing`)."""

from __future__ import annotations

import logging
import posixpath
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from airflow_seatunnel_ckpt.core.errors import ConfigError
from airflow_seatunnel_ckpt.core.sources import files as file_index
from airflow_seatunnel_ckpt.core.sources import source_log
from airflow_seatunnel_ckpt.core.sources.base import as_source_error, files_gone
from airflow_seatunnel_ckpt.core.sources.files import FileIndex
from airflow_seatunnel_ckpt.core.sources.options import FileSourceOptions, constructor_signature
from airflow_seatunnel_ckpt.spark.locations import fsspec_url, hadoop_path
from airflow_seatunnel_ckpt.spark.sources.base import Source, SourceError
from airflow_seatunnel_ckpt.spark.sources.listing import (
    file_identity as file_identity,  # where sources.py and table_sources.py import it from
)
from airflow_seatunnel_ckpt.spark.sources.listing import (
    find_below,
    is_glob,
    listed_identity,
    parse_age,
    parse_prefixes,
    prefix_matcher,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from airflow_seatunnel_ckpt.core.protocol.restore import RestorePoint

#: Formats Spark reads and writes without extra packages.
FILE_FORMATS = ("parquet", "json", "csv", "orc")
#: Text formats whose records Spark parses against a schema (and can fail to).
PARSED_FORMATS = ("csv", "json")
#: The corrupt-record column added to csv/json reads (Spark's default name).
CORRUPT_COLUMN = "_corrupt_record"
#: Unparseable records an error message shows.
MAX_REPORTED = 5

log = logging.getLogger(__name__)


class FileSource(Source):
    """Files below a directory (any fsspec URL), read by Spark as parquet/json/csv/orc.

    Options: :class:`~airflow_seatunnel_ckpt.core.sources.options.FileSourceOptions` (docs/FILE_SOURCES.md). Names
    starting with ``_`` or ``.`` are ignored, as Spark does. Offsets are ``{"files": [...], "identity": {name: {"size",
    "mtime"[, "etag"]}}, "consumed_index": {...}}``; the checkpoint keeps the consumed files as a sorted index
    (:mod:`~airflow_seatunnel_ckpt.core.sources.files`).

    csv and json are read ``PERMISSIVE`` with a corrupt-record column, so a record that does not parse fails the epoch
    naming file and line (or goes to ``bad_records``) instead of becoming NULLs; a ``mode`` set in ``options`` is left
    alone. Every read checks the pinned files' identities first (:meth:`pinned_gone`).
    """

    kind = "file"

    def __init__(self, name: str, path: str, **options: Any) -> None:
        super().__init__(name)
        self._configure(self.checked_options(FileSourceOptions, {"path": path, **options}))

    def _configure(self, settings: FileSourceOptions) -> None:
        """Take the checked options; refuse the combinations no single option's type can."""
        name = self.name
        #: The checked options (the source's one copy of them).
        self.settings = settings
        if settings.bad_records is not None and settings.format not in PARSED_FORMATS:
            raise ConfigError(
                f"file source {name!r}: bad_records applies to {PARSED_FORMATS} sources only; "
                f"{settings.format} files have a schema of their own (remove the option)"
            )
        self.url = fsspec_url(settings.path).rstrip("/")
        self.format = settings.format
        self.options = {k: str(v) for k, v in settings.options.items()}
        self.schema = settings.schema
        self.max_files_per_epoch = settings.max_files_per_epoch
        self.storage_options = dict(settings.storage_options)
        self.allow_missing = settings.allow_missing
        self.on_change = settings.on_change
        self.bad_records = fsspec_url(settings.bad_records).rstrip("/") if settings.bad_records else None
        self.prefixes = parse_prefixes(name, settings.prefixes)
        self.ordered_prefixes = settings.ordered_prefixes
        if self.ordered_prefixes and not any(is_glob(p) for p in self.prefixes or []):
            raise ConfigError(
                f"file source {name!r}: ordered_prefixes applies to glob prefixes (such as "
                '["dt=*/hour=*/"]); add one to \'prefixes\' or remove ordered_prefixes')
        self.backfill_every = settings.backfill_every
        if self.backfill_every is not None and not self.ordered_prefixes:
            raise ConfigError(
                f"file source {name!r}: backfill_every applies with ordered_prefixes (without it every epoch "
                "lists every partition already); remove it, or set ordered_prefixes")
        self.max_file_age = parse_age(name, settings.max_file_age)
        if self.ordered_prefixes and self.max_files_per_epoch is not None and self.max_file_age is not None:
            # A capped epoch must take the oldest names (or the floor skips the ones left
            # waiting) and the oldest modification times (or the watermark passes them);
            # when the two orders disagree, one of the files left waiting would be lost.
            raise ConfigError(
                f"file source {name!r}: ordered_prefixes, max_files_per_epoch and max_file_age together could "
                "leave a waiting file behind both the partition floor and the age watermark; remove one of them "
                "(max_files_per_epoch, usually: without it every epoch takes all it lists)")

    # -- listing ---------------------------------------------------------------------------
    def list_files(self) -> list[str]:
        """Every data file below the directory, relative to it, sorted."""
        return sorted(self.list_identities())

    def list_identities(self, floors: Mapping[str, str | None] | None = None) -> dict[str, dict[str, Any]]:
        """Every data file below the directory (or its ``prefixes``) with its identity, by relative name; with
        ``ordered_prefixes`` a glob prefix's partitions before its floor (``floors``) are skipped.

        :raises SourceError: the directory does not exist and ``allow_missing`` is off.
        """
        from fsspec.core import url_to_fs

        try:
            fs, root = url_to_fs(self.url, **self.storage_options)
            exists = fs.exists(root)
            found = find_below(fs, root, self.prefixes, self.ordered_prefixes, floors) if exists else {}
        except FileNotFoundError:
            exists, found = False, {}
        except Exception as exc:
            raise SourceError(f"file source {self.name!r}: cannot list {self.url}: {exc}") from exc
        if not exists:
            if self.allow_missing:
                return {}
            raise SourceError(
                f"file source {self.name!r}: input directory {self.url} does not exist; check "
                "the source's 'path' for a typo, or set allow_missing=True on the source if the "
                "directory appears later (epochs then read nothing until it does)"
            )
        root = root.rstrip("/") + "/"
        out = {}
        for full, info in found.items():
            if info.get("type") == "directory":
                continue
            rel = (
                str(full)[len(root) :]
                if str(full).startswith(root)
                else posixpath.basename(str(full))
            )
            if rel and not any(seg.startswith(("_", ".")) for seg in rel.split("/")):
                out[rel] = listed_identity(info)
        return out

    # -- planning --------------------------------------------------------------------------
    def plan(self, history: list[dict[str, Any]]) -> dict[str, Any]:
        """The files below the directory that no committed epoch consumed, given the history as entries (a history
        rebuilt from the log, or a caller without a restore point). See :meth:`plan_indexed`."""
        return self.plan_indexed(self._index_of(history))

    def _index_of(self, history: list[dict[str, Any]]) -> FileIndex:
        """The consumed-file index of history entries."""
        with as_source_error():
            rows = file_index.rows_from_entries(history, f"file source {self.name!r}")
        return FileIndex.from_table(rows)

    def plan_from(self, point: RestorePoint, epoch: int | None = None) -> dict[str, Any]:
        """Plan from the restore point's consumed-file index: the directory, the deltas since the last compaction, and
        the segments the listed names fall in."""
        chain = point.source_chains.get(self.name)
        # A subclass that plans differently (pipeline_output) plans from its history.
        if type(self).plan is not FileSource.plan:
            return super().plan_from(point, epoch)
        backfill = self.backfill_due(point.epoch, epoch)
        if self.name in point.rebuilt_sources or not chain or point.storage is None:
            entries = point.source_entries(self.name)
            return self.plan_indexed(self._index_of(entries), backfill=backfill)
        return self.plan_indexed(source_log.open_index(point.storage, chain), backfill=backfill)

    def backfill_due(self, restored: int | None, epoch: int | None) -> bool:
        """True if the epoch planned after ``restored`` lists every partition (``backfill_every``)."""
        if self.backfill_every is None or epoch is None:
            return False
        return epoch // self.backfill_every > (restored or 0) // self.backfill_every

    def floors(self, index: FileIndex) -> dict[str, str | None]:
        """Each glob prefix's floor for ``ordered_prefixes``: the greatest consumed file name below a partition the
        prefix matches (None: none yet, every partition is listed). Each prefix has its own, so one prefix's newer
        partitions never hide another's."""
        return {p: index.greatest_path(*prefix_matcher(p)) for p in self.prefixes or [] if is_glob(p)}

    def plan_indexed(self, index: FileIndex, *, backfill: bool = False) -> dict[str, Any]:
        """The listed files that the index does not hold (docs/FILE_SOURCES.md: a changed file per ``on_change``, the
        ``max_file_age`` watermark, ``max_files_per_epoch`` oldest first, ``backfill``)."""
        floors = self.floors(index) if self.ordered_prefixes and not backfill else None
        if backfill:
            log.info("file source %r: backfill epoch (backfill_every=%s): listing every partition the prefixes "
                     "match", self.name, self.backfill_every)
        listing = self.list_identities(floors)
        watermark = index.listing_watermark(self.max_file_age)
        wanted = index.watermark(self.max_file_age)
        if index.aged_below is not None and (wanted is None or wanted < index.aged_below):
            log.warning(
                "file source %r: max_file_age=%s is wider than the consumed-file index kept (it forgot the files "
                "modified before %s under max_file_age=%s): files modified before then are still ignored, so none "
                "is read twice; the wider window applies once the newest file is that much newer",
                self.name, self.max_file_age, index.aged_below, index.max_file_age)
        if watermark is not None:
            # A file whose mtime is unknown cannot be aged: it is kept (read, not lost).
            mtimes = {f: file_index.mtime_seconds(ident.get("mtime")) for f, ident in listing.items()}
            listing = {f: ident for f, ident in listing.items()
                       if (mtime := mtimes[f]) is None or mtime >= watermark}
        consumed = index.lookup(listing)
        changed = sorted(f for f in consumed if not file_index.same_file(consumed[f], listing[f]))
        if changed and self.on_change == "error":
            shown = "; ".join(
                f"{self.url}/{f}: consumed as {consumed[f]}, now {listing[f]}" for f in changed[:5]
            )
            raise SourceError(
                f"file source {self.name!r}: {len(changed)} file(s) changed after an epoch "
                f"consumed them (same name, new content): {shown}. Their new rows would be "
                "lost. Deliver new data under a new file name and restore the old content, or "
                "set on_change='reread' on the source to read a changed file again in full "
                "(its new content supersedes the old; rows already published stay published)"
            )
        new = sorted(f for f in listing if f not in consumed or f in changed)
        if self.max_files_per_epoch is not None:
            if self.max_file_age is not None:
                # Spark's order under maxFileAge: the files left waiting are never older than
                # the newest one taken, so the watermark this epoch moves cannot pass them.
                # A file whose mtime is unknown is never aged: it goes first. Ties keep name order.
                mtimes = {f: file_index.mtime_seconds(listing[f].get("mtime")) for f in new}
                new.sort(key=lambda f: (mtimes[f] is not None, mtimes[f] or 0.0))
            new = sorted(new[: self.max_files_per_epoch])
        return {"files": new, "identity": {f: listing[f] for f in new},
                source_log.INDEX_KEY: {"max_file_age": self.max_file_age}}

    # -- checking ------------------------------------------------------------------------
    def pinned_gone(self, offsets: Mapping[str, Any]) -> list[str]:
        """The pinned files gone or rewritten since they were pinned (another size, ETag or modification time under the
        same name); a file pinned without an identity only has to exist. One listing per directory that holds pinned
        files."""
        identity = offsets.get("identity") or {}
        pinned = {f"{self.url}/{f}": identity.get(f) for f in offsets.get("files", [])}
        try:
            return files_gone(pinned, self.storage_options,
                              lambda ident, info: file_index.same_file(ident, listed_identity(info)))
        except Exception as exc:
            raise SourceError(f"{self.where}: cannot list the pinned files below {self.url}: {exc}") from exc

    # -- reading ---------------------------------------------------------------------------
    def read(self, spark: SparkSession, offsets: Mapping[str, Any]) -> DataFrame:
        """Read exactly the planned files (an empty DataFrame if there are none).

        :raises SourceError: a csv/json record does not parse (names file and line).
        """
        data, rejected = self.read_checked(spark, offsets)
        if rejected is not None:
            self.fail_on_rejected(rejected, offsets)
        return data

    def read_checked(
        self, spark: SparkSession, offsets: Mapping[str, Any]
    ) -> tuple[DataFrame, DataFrame | None]:
        """The planned files' records that parse, and those that do not (None when the format has nothing to reject).
        Both lazy; the rejected ones have the columns ``source``, ``file``, ``record`` (the raw text) and ``parsed``
        (what did parse, as JSON)."""
        files = list(offsets.get("files", []))
        if files:
            # A file rewritten under its name since the plan would be read as the pinned one.
            self.verify_pinned(offsets)
        reader = spark.read.format(self.format).options(**self.options)
        if not files:
            if self.schema:
                return spark.createDataFrame([], self.schema), None
            # No new file and no declared schema: borrow the schema of any existing file.
            existing = self.list_files()
            if not existing:
                raise SourceError(
                    f"file source {self.name!r}: {self.url} has no files and no 'schema' "
                    "option, so the empty input of this epoch has no columns; declare the "
                    "schema in the source options"
                )
            return reader.load(hadoop_path(f"{self.url}/{existing[-1]}")).limit(0), None
        paths = [hadoop_path(f"{self.url}/{f}") for f in files]
        if not self._checks_records():
            if self.schema:
                reader = reader.schema(self.schema)
            return reader.load(paths), None
        return self._read_permissive(spark, paths)

    def _checks_records(self) -> bool:
        mode = self.options.get("mode", "PERMISSIVE").upper()
        return self.format in PARSED_FORMATS and mode == "PERMISSIVE"

    def _read_permissive(
        self, spark: SparkSession, paths: list[str]
    ) -> tuple[DataFrame, DataFrame]:
        from pyspark.sql import functions as F
        from pyspark.sql.types import StringType, StructField, StructType

        corrupt = self.options.get("columnNameOfCorruptRecord", CORRUPT_COLUMN)
        reader = spark.read.format(self.format).options(**self.options)
        if self.format == "csv" and str(self.options.get("header", "")).lower() == "true":
            # A header that does not name the schema's columns is an error, not ignored.
            reader = reader.option("enforceSchema", self.options.get("enforceSchema", "false"))
        if self.schema:
            declared = StructType.fromDDL(self.schema)
            if not isinstance(declared, StructType):
                raise SourceError(f"file source {self.name!r}: schema {self.schema!r} is not a list of columns "
                                  "('name TYPE, ...'): give the columns as a Spark DDL string")
        else:
            declared = reader.load(paths).schema  # inferred, as Spark would
        fields = [f for f in declared.fields if f.name != corrupt]
        schema = StructType([*fields, StructField(corrupt, StringType(), True)])
        parsed = (
            reader.schema(schema)
            .option("mode", "PERMISSIVE")
            .option("columnNameOfCorruptRecord", corrupt)
            .load(paths)
        )
        # Spark's csv/json parsers convert only the columns a query uses and flag a record
        # for those only: a stage counting one column would keep a record whose other
        # column does not parse, while the quarantine (which reads them all) has it too.
        # Both filters refer to every column, so whatever a query of either side prunes,
        # the parser converts every column and both sides decide each record alike.
        every_column = F.size(F.array(*[F.col(f.name).isNull() for f in fields])) == len(fields)
        good = parsed.where(F.col(corrupt).isNull() & every_column).drop(corrupt)
        # The rejected rows also carry what did parse (useful when fixing the record).
        rejected = parsed.where(F.col(corrupt).isNotNull() & every_column).select(
            F.lit(self.name).alias("source"),
            F.col("_metadata.file_path").alias("file"),
            F.col(corrupt).alias("record"),
            F.to_json(F.struct(*[F.col(f.name) for f in fields])).alias("parsed"),
        )
        return good, rejected

    def fail_on_rejected(self, rejected: DataFrame, offsets: Mapping[str, Any]) -> None:
        """Raise :class:`SourceError` naming the first unparseable records (file and line), if there are any (one pass
        over the input)."""
        bad = rejected.limit(MAX_REPORTED + 1).collect()
        if not bad:
            return
        files = [str(f) for f in offsets.get("files", [])]
        shown = []
        for row in bad[:MAX_REPORTED]:
            url = self.planned_url(str(row.file), files)
            line = self._line_of(url, str(row.record)) if url else None
            where = f"{url or row.file}" + (f" line {line}" if line else "")
            shown.append(f"{where}: {str(row.record)[:200]!r}")
        more = " and more" if len(bad) > MAX_REPORTED else ""
        raise SourceError(
            f"file source {self.name!r}: malformed {self.format} record(s) that do not match "
            f"the schema{more}: " + "; ".join(shown) + ". Nothing of this epoch was published. "
            "Fix the file (deliver it under a new name), correct the 'schema', or set "
            "bad_records='<directory URL>' on the source to quarantine unparseable records "
            "with the epoch and publish the rest"
        )

    def planned_url(self, spark_path: str, files: list[str]) -> str | None:
        """The fsspec URL of the planned file Spark calls ``spark_path`` (a URI)."""
        from urllib.parse import unquote

        path = unquote(spark_path)
        for f in files:
            if path.endswith("/" + f):
                return f"{self.url}/{f}"
        return None

    def _line_of(self, url: str, record: str) -> int | None:
        """The 1-based line of the file at ``url`` that holds ``record`` (read only when an error is reported)."""
        import fsspec

        first = record.splitlines()[0] if record else record
        try:
            with fsspec.open(url, "rt", encoding="utf-8", errors="replace",
                             **self.storage_options) as handle:
                for number, text in enumerate(handle, start=1):
                    if text.rstrip("\r\n") == first:
                        return number
        except OSError:
            return None
        return None


FileSource.__init__.__signature__ = constructor_signature(FileSourceOptions)  # type: ignore[attr-defined]
