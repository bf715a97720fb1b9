"""Table sinks, Spark side: Parquet staged so that a table format can add the files as they are.

The table commit itself runs in Python on the committing task (:mod:`core.tables`), with
no Iceberg or Delta jars on the Spark cluster. So the staged Parquet must already be what
the table format expects of its data files:

* **partition columns stay inside the files.** Spark's ``partitionBy`` drops them (the
  value lives only in the directory name), and pyiceberg's ``add_files`` then accepts
  the files silently with NULL partitions. The staging is partitioned by hidden copies
  (``__partition_<column>``), so each file holds exactly one value of each partition
  column, and the column itself;
* **timestamps as ``TIMESTAMP_MICROS``** (Spark's INT96 default is rejected by Iceberg);
* the sink's options (never secrets) travel in the manifest (``SinkManifest.table``), so
  the commit task, the recovery DAG and the console commit the same table.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from airflow_seatunnel_ckpt.core.errors import ConfigError
from airflow_seatunnel_ckpt.core.models import SinkMode
from airflow_seatunnel_ckpt.spark.file_sink import FileSink

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

#: Prefix of the hidden directory columns the staging is partitioned by.
PARTITION_PREFIX = "__partition_"


class TableSink(FileSink):
    """A sink whose epochs are committed into a table format (see the module docs)."""

    #: ``SinkManifest.table["type"]``: the :mod:`core.tables` format that commits it.
    table_type: ClassVar[str] = ""

    def __init__(self, name: str, target_url: str, table: Mapping[str, Any], *,
                 partition_by: Sequence[str] | None = None, mode: str = SinkMode.CHANGES.value,
                 expectations: Mapping[str, Any] | None = None) -> None:
        super().__init__(name, target_url, format="parquet", partition_by=partition_by, mode=mode,
                         expectations=expectations)
        bad = [c for c in self.partition_by if not isinstance(c, str) or not c]
        if bad:
            raise ConfigError(f"{self.table_type} sink {name!r}: partition_by must be column names, got {bad}")
        #: What the commit needs to find the table (recorded in the prepared record).
        self.table: dict[str, Any] = {"type": self.table_type, **table,
                                      "partition_by": list(self.partition_by)}

    def _stage(self, df: DataFrame, *, count: bool = True) -> int:
        """Stage ``df`` as Parquet data files of the table (one partition value per file)."""
        from pyspark.sql import functions as F

        missing = [c for c in self.partition_by if c not in df.columns]
        if missing:
            raise ConfigError(
                f"{self.table_type} sink {self.name!r}: partition column(s) {missing} not in the DataFrame "
                f"(columns: {df.columns})")
        hidden = [f"{PARTITION_PREFIX}{c}" for c in self.partition_by]
        staged = df
        for column, copy in zip(self.partition_by, hidden, strict=True):
            staged = staged.withColumn(copy, F.col(column))
        conf = df.sparkSession.conf
        previous = conf.get("spark.sql.parquet.outputTimestampType", None)
        conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
        saved, self.partition_by = self.partition_by, hidden
        try:
            return super()._stage(staged, count=count)
        finally:
            self.partition_by = saved
            if previous is None:
                conf.unset("spark.sql.parquet.outputTimestampType")
            else:
                conf.set("spark.sql.parquet.outputTimestampType", previous)
