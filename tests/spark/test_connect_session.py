"""The Spark Connect session a stage opens from ``StageSpec.remote``: what it ships, what it
leaves behind, and the spec's field."""

from __future__ import annotations

import os

import pytest

from airflow_seatunnel_ckpt.core.errors import ConfigError
from airflow_seatunnel_ckpt.spark import StageSpec
from airflow_seatunnel_ckpt.spark.session import CONNECT_MODE, remote_session
from tests.spark.conftest import OrdersPipeline


@pytest.mark.spark
def test_a_connect_session_ships_the_package_to_the_servers_python_workers_and_is_released(
    connect_server: str, orders: OrdersPipeline
) -> None:
    """The server's workers import the package from the session's artifact (the client's
    code), not from whatever the server has installed; PySpark's Connect switch is off again
    after the session, so classic sessions can follow in the same process."""
    from pyspark.sql.functions import udf

    def package_file(_: int) -> str:  # runs in a Python worker of the server
        import airflow_seatunnel_ckpt

        return str(airflow_seatunnel_ckpt.__file__)

    with remote_session(orders.spec("run-1").replace(remote=connect_server)) as session:
        assert os.environ.get(CONNECT_MODE) == "1"
        package_file = udf(package_file, "string")  # a Connect UDF: built while the switch is on
        [row] = session.range(1).select(package_file("id").alias("file")).collect()
        assert not session.is_stopped
    assert session.is_stopped
    assert CONNECT_MODE not in os.environ
    assert "airflow_seatunnel_ckpt.zip" in row.file, row.file


def test_a_stage_spec_names_a_connect_url_in_remote_and_keeps_it_through_json() -> None:
    spec = StageSpec(pipeline="p", participant="s", run_id="r", attempt=1, stage="m:f", remote="sc://spark:15002")
    assert StageSpec.from_json(spec.to_json()).remote == "sc://spark:15002"
    assert StageSpec.from_dict({k: v for k, v in spec.to_dict().items() if k != "remote"}).remote is None
    with pytest.raises(ConfigError, match="remote must be a Spark Connect URL 'sc://host:port', got 'spark://m:7077'"):
        spec.replace(remote="spark://m:7077")
