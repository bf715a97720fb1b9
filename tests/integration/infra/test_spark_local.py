"""The shared local SparkSession: Arrow on, Python workers see this project."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from collections.abc import Iterator

    import pyarrow as pa
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark


def test_session_is_local_loopback_with_arrow(spark: SparkSession) -> None:
    conf = spark.sparkContext.getConf()
    assert spark.sparkContext.master == "local[2]"
    assert conf.get("spark.driver.host") == "127.0.0.1"
    assert spark.conf.get("spark.sql.execution.arrow.pyspark.enabled") == "true"
    assert spark.conf.get("spark.sql.shuffle.partitions") == "4"


def test_map_in_arrow_runs_on_python_workers_that_import_the_package(
    spark: SparkSession,
) -> None:
    import airflow_seatunnel_ckpt

    def tag(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        import airflow_seatunnel_ckpt as pkg

        for batch in batches:
            yield pa.RecordBatch.from_arrays(
                [batch.column(0), pa.array([pkg.__version__] * batch.num_rows)],
                names=["id", "version"],
            )

    rows = spark.range(100).mapInArrow(tag, "id long, version string").collect()

    assert sorted(row.id for row in rows) == list(range(100))
    assert {row.version for row in rows} == {airflow_seatunnel_ckpt.__version__}
