"""The Spark standalone cluster fixture runs real ``spark-submit`` applications.

CI runs the plain ``spark-submit`` of the fixture's command. The submission through the
Apache Spark provider's ``SparkSubmitHook`` and the fixture's ``spark`` connection runs with
``RELIABILITY_FULL=1`` only: in CI the stage tests that submit to this cluster through the
same connection and hook (``tests/operators/test_stage_spark_submit.py``,
``tests/operators/test_stage_detached_submit.py``) prove it, and a third application on the
one-core worker would add a driver and an executor JVM to the run for nothing new.
"""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import pytest

from tests.conftest import FAST_JVM_OPTIONS, FULL_CAMPAIGNS, SparkStandaloneCluster

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

_APP = textwrap.dedent(
    """
    import sys

    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    out = sys.argv[1]
    spark = SparkSession.builder.appName("infra-cluster-smoke").getOrCreate()

    def package_version(_):
        # Runs on the executor: proves PYSPARK_PYTHON has this project installed.
        import airflow_seatunnel_ckpt

        return airflow_seatunnel_ckpt.__version__

    versions = spark.sparkContext.parallelize([0], 1).map(package_version).collect()
    (
        spark.range(1000)
        .groupBy((F.col("id") % 10).alias("bucket"))
        .count()
        .withColumn("executor_package_version", F.lit(versions[0]))
        .write.parquet(out)
    )
    print("master=" + spark.sparkContext.master)
    spark.stop()
    """
)


def test_spark_submit_runs_a_pyspark_app_on_the_standalone_cluster(
    spark_standalone: SparkStandaloneCluster, tmp_path: Path
) -> None:
    import pyarrow.parquet as pq

    import airflow_seatunnel_ckpt

    app = tmp_path / "app.py"
    app.write_text(_APP)
    out = tmp_path / "counts.parquet"

    result = subprocess.run(
        spark_standalone.submit_command(app, str(out)),
        env=spark_standalone.env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )

    assert result.returncode == 0, result.stderr[-4000:]
    assert f"master={spark_standalone.master_url}" in result.stdout
    table = pq.read_table(out).to_pylist()
    assert sorted(row["bucket"] for row in table) == list(range(10))
    assert all(row["count"] == 100 for row in table)
    assert {row["executor_package_version"] for row in table} == {
        airflow_seatunnel_ckpt.__version__
    }


@pytest.mark.airflow
@pytest.mark.skipif(not FULL_CAMPAIGNS, reason="RELIABILITY_FULL=1 only: the stage tests submit through the hook in CI")
def test_spark_submit_hook_submits_to_the_standalone_cluster(
    spark_standalone: SparkStandaloneCluster,
    airflow_home: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The Apache Spark provider's hook reaches the cluster through a ``spark`` connection."""
    import pyarrow.parquet as pq
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    monkeypatch.setenv("AIRFLOW_CONN_SPARK_STANDALONE", spark_standalone.airflow_conn_uri)
    app = tmp_path / "app.py"
    app.write_text(_APP)
    out = tmp_path / "counts.parquet"
    hook = SparkSubmitHook(
        conn_id="spark_standalone",
        conf={
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "2",
            "spark.driver.extraJavaOptions": FAST_JVM_OPTIONS,
            "spark.executor.extraJavaOptions": FAST_JVM_OPTIONS,
        },
        executor_memory="512m",
        total_executor_cores=1,
        application_args=[str(out)],
    )

    hook.submit(str(app))

    assert pq.read_table(out).num_rows == 10
