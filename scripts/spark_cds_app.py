"""The Spark work whose classes ``scripts/spark-cds.sh`` archives: what the tests' drivers do
first (a session, Parquet, JSON and CSV, a shuffle, an observed metric, and a Python data source
write through Arrow). Run by spark-submit; writes only below ``argv[1]``."""

from __future__ import annotations

import sys

from pyspark.sql import Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage


class _Rows(DataSource):
    @classmethod
    def name(cls) -> str:
        return "cds_rows"

    def writer(self, schema, overwrite):  # type: ignore[no-untyped-def]
        return _Count()


class _Count(DataSourceArrowWriter):
    def write(self, iterator):  # type: ignore[no-untyped-def]
        for _batch in iterator:  # the rows cross to Python as Arrow batches; nothing is kept
            pass
        return WriterCommitMessage()


def main(out: str) -> None:
    spark = (SparkSession.builder.appName("spark-cds").config("spark.ui.enabled", "false")
             .config("spark.sql.execution.arrow.pyspark.enabled", "true").getOrCreate())
    df = spark.range(2000).select("id", (F.col("id") % 7).alias("k"), F.concat(F.lit("c"), F.col("id")).alias("s"))
    observation = Observation("rows")
    df.observe(observation, F.count(F.lit(1)).alias("n")).write.mode("overwrite").parquet(f"{out}/p")
    back = spark.read.parquet(f"{out}/p")
    back.groupBy("k").agg(F.sum("id"), F.max("s")).join(back.select("k").distinct(), "k").collect()
    masked = back.selectExpr("*", "CAST(CASE WHEN (id > 3) THEN 0 ELSE 1 END AS TINYINT) AS m")
    masked.write.mode("overwrite").json(f"{out}/j")
    spark.read.json(f"{out}/j").write.mode("overwrite").option("header", "true").csv(f"{out}/c")
    spark.dataSource.register(_Rows)
    back.write.format("cds_rows").mode("append").save()
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1])
