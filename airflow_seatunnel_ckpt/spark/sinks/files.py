"""The file sink: a stage's output staged as files, published as ``<target>/epoch=<e>/``."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow_seatunnel_ckpt.core.models import SinkMode
from airflow_seatunnel_ckpt.core.options import checked
from airflow_seatunnel_ckpt.core.protocol.expectations import parse_expectations
from airflow_seatunnel_ckpt.core.sinks.options import FileSinkOptions
from airflow_seatunnel_ckpt.spark.locations import fsspec_url, hadoop_path
from airflow_seatunnel_ckpt.spark.sinks.base import Sink, SinkError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


class FileSink(Sink):
    """Files in a directory (any fsspec URL Spark can write): parquet, json, csv or orc.

    Options: :class:`FileSinkOptions`. ``mode`` ``"append"`` (default) publishes each epoch's rows into its own
    ``<path>/epoch=<e>/``; ``"snapshot"`` makes each epoch's rows the whole table (``<path>/_LATEST``, older snapshots
    removed). docs/REPLAY.md and docs/REFERENCE.md say how a replay swaps epochs and what readers see.
    """

    def __init__(self, name: str, path: str, format: str = "parquet", options: Mapping[str, Any] | None = None,
                 partition_by: Sequence[str] | None = None, mode: str = SinkMode.APPEND.value,
                 expectations: Mapping[str, Any] | None = None) -> None:
        checked_options = checked(FileSinkOptions, {"path": path, "format": format, "options": dict(options or {}),
                                                    "partition_by": list(partition_by or []), "mode": mode},
                                  f"file sink {name!r}")
        self._init(name, fsspec_url(checked_options.path).rstrip("/"), checked_options.mode, expectations,
                   checked_options.format, checked_options.options, checked_options.partition_by)

    def _init(self, name: str, target_url: str, mode: str, expectations: Mapping[str, Any] | None, format: str,
              options: Mapping[str, Any], partition_by: Sequence[str]) -> None:
        """The sink's state from checked options (a table sink checks its own model first)."""
        super().__init__(name, target_url, mode)
        self.expectations = parse_expectations(name, expectations)
        self.format = format
        #: The staged writer's expectation options while it applies the sink's rules.
        self._split: dict[str, str] = {}
        self.options = {k: str(v) for k, v in options.items()}
        self.partition_by = list(partition_by)

    def write(self, df: DataFrame) -> int:
        """Write ``df`` into the attempt's staging directory, counting rows (and each expectation's failures,
        :mod:`.expectations`) in the same job; rows a ``drop`` or ``quarantine`` rule removes are not staged, the
        quarantined ones go to :attr:`quarantine`. A sink is written once per stage."""
        if self.staging_url is None:
            raise SinkError(f"sink {self.name!r} is not bound to a staging directory")
        if self.written:
            raise SinkError(
                f"sink {self.name!r} was already written in this stage; union the DataFrames and "
                "write once"
            )
        if not self.expectations:
            self.rows = self._stage(df)
            return self.rows
        from airflow_seatunnel_ckpt.spark import expectations

        quarantines = any(rule.on_fail == "quarantine" for rule in self.expectations)
        if quarantines and self.quarantine is None:
            raise SinkError(f"sink {self.name!r} quarantines rows but has no quarantine sink bound")
        by_writer = self._writes_quarantine_too(df) if quarantines else self._checksummed_on_executors(df)
        flagged = expectations.flag(self.name, self.expectations, df, by_writer=by_writer)
        if by_writer:
            self.rows = self._stage_checked_by_writer(flagged)
            return self.rows
        quarantined = flagged.quarantined
        try:
            rows = self._stage(flagged.kept)
            self.expectation_results, bad = flagged.results()
            if quarantined is not None and self.quarantine is not None and bad:
                self.quarantine.write(quarantined)  # the same flags: each failing row lands here, once
        finally:
            flagged.release()
        self.rows = rows
        return rows

    def _writes_quarantine_too(self, df: DataFrame) -> bool:
        """Whether this sink's job can stage its quarantine's rows too (both Parquet staged by :mod:`.staged_writer`
        into the same store)."""
        q = self.quarantine
        return (isinstance(q, FileSink) and q.staging_url is not None and q.format == "parquet"
                and not q.options and not q.partition_by and q.staging_options == self.staging_options
                and self._checksummed_on_executors(df))

    def _stage_checked_by_writer(self, flagged: Any) -> int:
        """Stage the flagged rows through :mod:`.staged_writer`, which counts each rule's failures, leaves out the
        removed rows and stages the quarantined ones into :attr:`quarantine`, in the same job; the rows kept."""
        from airflow_seatunnel_ckpt.spark.sinks import staged_writer

        assert self.staging_url is not None
        self._split = flagged.writer_options()
        if self.quarantine is not None:
            self._split["quarantine_path"] = str(self.quarantine.staging_url)
        try:
            self._stage(flagged.flagged, count=False)
        finally:
            self._split = {}
        counts = staged_writer.expectation_counts(self.staging_url, self.staging_options)
        self.expectation_results, bad = flagged.results(counts)
        if bad and self.quarantine is not None:
            self.quarantine.rows = bad  # staged by this job (its file list too)
        return counts.get("kept", 0)

    def _stage(self, df: DataFrame, *, count: bool = True) -> int:
        """Stage ``df`` as this sink's output; the number of rows (an observed metric of the write; 0 when not
        ``count``: the staged writer counts what it keeps, see :meth:`_stage_checked_by_writer`)."""
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        assert self.staging_url is not None
        observation = Observation(f"sink_{self.name}_{uuid.uuid4().hex[:8]}")
        observed = df.observe(observation, F.count(F.lit(1)).alias("rows")) if count else df
        if self._checksummed_on_executors(df):
            self._write_checksummed(observed)
        else:
            # Spark's own writer: the manifest's checksums are then taken from the store,
            # or computed on the driver by reading the staged files (core.protocol.staging.manifest_of).
            writer = observed.write.format(self.format).options(**self.options).mode("overwrite")
            if self.partition_by:
                writer = writer.partitionBy(*self.partition_by)
            writer.save(hadoop_path(self.staging_url))
        return int(observation.get.get("rows", 0)) if count else 0

    def quarantine_options(self) -> dict[str, Any] | None:
        """A directory ``<path>_quarantine`` in the sink's format (JSON for CSV: it holds an array column)."""
        return {"type": "file", "path": f"{self.target_url}_quarantine",
                "format": "json" if self.format == "csv" else self.format}

    def _checksummed_on_executors(self, df: DataFrame) -> bool:
        """Whether :mod:`.staged_writer` writes this output exactly as Spark's Parquet writer would lay it out."""
        from airflow_seatunnel_ckpt.spark.sinks import staged_writer

        types = dict(df.dtypes)
        return (self.format == "parquet"
                and set(self.options) <= {"compression"}
                and str(self.options.get("compression", "snappy")).lower() in staged_writer.COMPRESSIONS
                and all(staged_writer.supported_partition_type(types.get(c, "")) for c in self.partition_by))

    def _write_checksummed(self, df: DataFrame) -> None:
        """Stage Parquet whose CRC32C each executor computes as it writes (see :mod:`.staged_writer`)."""
        import json

        from airflow_seatunnel_ckpt.spark.sinks import staged_writer

        assert self.staging_url is not None
        df.sparkSession.dataSource.register(staged_writer.StagedParquetSource)
        if self.partition_by:  # one open file per task at a time, as Spark's writer sorts
            df = df.sortWithinPartitions(*self.partition_by)
        (df.write.format(staged_writer.NAME).mode("append")
         .option("path", self.staging_url)
         .option(staged_writer.OPTIONS_KEY, json.dumps(self.staging_options))
         .option("partition_by", json.dumps(self.partition_by))
         .option("compression", str(self.options.get("compression", "snappy")))
         .options(**self._split)
         .save())
