"""One registry for what is found by name: imported on first use, registered at run time, plug-ins.

Storage backends, the core's table formats and the Spark sources and sinks all go through
:class:`~airflow_seatunnel_ckpt.core.registry.Registry`; these tests hold its promises with
each of them.
"""

from __future__ import annotations

import subprocess
import sys
import types
from pathlib import Path
from typing import Any, Literal

import pytest

from airflow_seatunnel_ckpt.core.errors import ConfigError, SinkRefusedError
from airflow_seatunnel_ckpt.core.options import Options
from airflow_seatunnel_ckpt.core.registry import Registry

REPO = Path(__file__).resolve().parents[2]


def test_a_builtin_is_imported_on_first_use_and_a_run_time_registration_wins() -> None:
    registry: Registry[Any] = Registry("codec", {"json": "json:dumps", "whole": "json"})
    assert registry.names == ["json", "whole"]
    assert registry.get("json")({"a": 1}) == '{"a": 1}'
    assert registry.get("whole").loads("[1]") == [1]
    registry.register("json", repr)
    assert registry.get("json") is repr and not registry.is_builtin("json")


def test_an_unknown_name_is_refused_naming_the_known_ones() -> None:
    registry: Registry[Any] = Registry("codec", {"json": "json:dumps"})
    registry.register("yaml", repr)
    with pytest.raises(ConfigError, match=r"unknown codec 'jsno'; known: \['json', 'yaml'\]"):
        registry.get("jsno")


def test_a_builtin_whose_library_is_missing_names_the_pip_extra_that_installs_it() -> None:
    registry: Registry[Any] = Registry("sink", {"lake": "no_such_lake_library:Sink"}, extras={"lake": "lake"})
    with pytest.raises(ConfigError) as raised:
        registry.get("lake")
    assert "sink 'lake' cannot be used here: No module named 'no_such_lake_library'" in str(raised.value)
    assert "pip install 'airflow-seatunnel-ckpt[lake]'" in str(raised.value)


def test_a_type_knows_its_options_model_registered_with_it_or_the_packages() -> None:
    class Lake(Options):
        type: Literal["lake"] = "lake"

    models = types.ModuleType("lake_models_for_test")
    models.MODELS = {"lake": Lake}  # type: ignore[attr-defined]
    sys.modules["lake_models_for_test"] = models
    try:
        registry: Registry[Any] = Registry("sink", {"lake": "json", "pond": "json"},
                                           options="lake_models_for_test:MODELS")
        assert registry.options_model("lake") is Lake
        assert registry.options_model("pond") is None  # no model: the type checks its own options
        registry.register("pond", repr, options=Lake)
        assert registry.options_model("pond") is Lake
    finally:
        del sys.modules["lake_models_for_test"]
    without: Registry[Any] = Registry("sink", {"lake": "json"}, options="no_such_models_module:MODELS")
    assert without.options_model("lake") is None


def test_the_three_registries_import_no_connector_or_table_library_until_asked() -> None:
    script = (
        "import sys\n"
        "from airflow_seatunnel_ckpt.spark.registry import SINKS, SOURCES\n"
        "from airflow_seatunnel_ckpt.core.sinks import CONNECTORS\n"
        "from airflow_seatunnel_ckpt.core.storage.registry import BACKENDS\n"
        "assert {'kafka', 'file'} <= set(SOURCES.names) and 'postgres' in SINKS.names\n"
        "assert 'iceberg' in CONNECTORS.names and 's3' in BACKENDS.names\n"
        "loaded = [m for m in ('pyspark', 'pyiceberg', 'deltalake', 'psycopg', 'confluent_kafka',\n"
        "          'airflow_seatunnel_ckpt.spark.sinks.tables', 'airflow_seatunnel_ckpt.spark.sources.kafka',\n"
        "          'airflow_seatunnel_ckpt.core.sinks.postgres') if m in sys.modules]\n"
        "assert loaded == [], loaded\n"
        "assert SINKS.factory('o', 'postgres').__name__ == 'PostgresSink'\n"
        "assert CONNECTORS.get('postgres').commit.__module__ == 'airflow_seatunnel_ckpt.core.sinks.postgres'\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr[-2000:]


def test_an_unknown_table_type_names_the_epoch_the_known_types_and_the_way_out() -> None:
    from airflow_seatunnel_ckpt.core.models import SinkManifest
    from airflow_seatunnel_ckpt.core.sinks import SinkCommit, precheck_sink
    from airflow_seatunnel_ckpt.core.storage import open_storage

    sink = SinkManifest.from_dict({"sink": "out", "target_url": "memory://t", "staging": "s", "files": [],
                                   "rows": 0, "table": {"type": "hudi", "table": "a.b"}})
    request = SinkCommit("orders", "memory://store", 3, sink, open_storage("memory://store"), retries=0)
    with pytest.raises(SinkRefusedError) as raised:  # refused before the decision
        precheck_sink(request)
    message = str(raised.value)
    assert "pipeline 'orders' epoch 3 sink 'out'" in message
    assert "unknown type 'hudi'; known: ['delta', 'file', 'iceberg', 'postgres']" in message
    assert "register_table_format()" in message
