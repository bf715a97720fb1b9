"""Provider surface: registration, the checkpoint-store connection, secrets, DAG files."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

from airflow_seatunnel_ckpt.core.errors import ConfigError

pytestmark = pytest.mark.airflow

REPO = Path(__file__).resolve().parents[1]
SECRET = "s3cr3t-never-logged"


@pytest.fixture
def store_conn(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    """A ``seatunnel_ckpt`` connection given the Airflow way: AIRFLOW_CONN_<ID> as JSON."""
    monkeypatch.setenv("AIRFLOW_CONN_ORDERS_STORE", json.dumps({
        "conn_type": "seatunnel_ckpt",
        "host": f"file://{tmp_path}/store",
        "login": "access-key",
        "password": SECRET,
        "extra": {"prepared_timeout_s": 42, "storage_options": {"auto_mkdir": True}},
    }))
    return "orders_store"


def test_provider_is_registered_with_its_connection_type(airflow_home: Path) -> None:
    from airflow.sdk.providers_manager_runtime import ProvidersManagerTaskRuntime

    from airflow_seatunnel_ckpt.get_provider_info import get_provider_info

    hook_info = ProvidersManagerTaskRuntime().hooks["seatunnel_ckpt"]
    assert hook_info is not None
    assert hook_info.hook_class_name.endswith("CheckpointStoreHook")
    info = get_provider_info()
    modules = [m for key in ("hooks", "operators", "sensors", "triggers")
               for group in info[key] for m in group["python-modules"]]
    for module in modules:
        importlib.import_module(module)
    for conn_type in info["connection-types"]:
        module, _, cls = conn_type["hook-class-name"].rpartition(".")
        assert getattr(importlib.import_module(module), cls).conn_type == conn_type[
            "connection-type"]


def test_connection_supplies_url_options_and_settings(airflow_home: Path,
                                                      store_conn: str, tmp_path: Path) -> None:
    from airflow_seatunnel_ckpt.hooks.checkpoint_store import CheckpointStoreHook

    hook = CheckpointStoreHook(store_conn)
    config = hook.get_config()

    assert config.storage_url == f"file://{tmp_path}/store"
    assert config.prepared_timeout_s == 42
    assert dict(config.storage_options) == {"auto_mkdir": True, "key": "access-key",
                                            "secret": SECRET}
    assert hook.test_connection()[0] is True
    # An explicit URL or setting on the task wins over the connection.
    override = CheckpointStoreHook(store_conn, storage_url=f"file://{tmp_path}/other",
                                   store_config={"max_retain": 3}).get_config()
    assert override.storage_url.endswith("/other") and override.max_retain == 3


def test_no_connection_means_the_local_default_store(airflow_home: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_seatunnel_ckpt.hooks.checkpoint_store import CheckpointStoreHook

    monkeypatch.setenv("SEATUNNEL_CKPT_STORE", f"file://{tmp_path}/default")
    assert CheckpointStoreHook().get_config().storage_url == f"file://{tmp_path}/default"


def test_bad_connection_values_fail_with_the_field_named(airflow_home: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_seatunnel_ckpt.hooks.checkpoint_store import CheckpointStoreHook

    monkeypatch.setenv("AIRFLOW_CONN_BAD_STORE", json.dumps(
        {"conn_type": "seatunnel_ckpt", "host": "file:///tmp/x",
         "extra": {"max_retain": 0}}))
    with pytest.raises(ConfigError, match="max_retain"):
        CheckpointStoreHook("bad_store").get_config()
    monkeypatch.setenv("AIRFLOW_CONN_WRONG_TYPE", json.dumps(
        {"conn_type": "spark", "host": "spark://x"}))
    with pytest.raises(ConfigError, match="seatunnel_ckpt"):
        CheckpointStoreHook("wrong_type").get_config()


#: The extras Airflow's connection form saves for a seatunnel_ckpt connection whose optional
#: fields were left empty and whose numbers were typed in.
FORM_EXTRAS = {"storage_options": None, "prepared_timeout_s": "300", "lease_timeout_s": "45",
               "max_retain": "10", "secondary_url": None}


def test_a_connection_as_the_ui_form_saves_it_opens_the_store_with_its_numbers(
        airflow_home: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from airflow_seatunnel_ckpt.hooks.checkpoint_store import CheckpointStoreHook

    monkeypatch.setenv("AIRFLOW_CONN_FORM_STORE", json.dumps(
        {"conn_type": "seatunnel_ckpt", "host": f"file://{tmp_path}/store", "extra": FORM_EXTRAS}))
    config = CheckpointStoreHook("form_store").get_config()

    assert (config.prepared_timeout_s, config.lease_timeout_s, config.max_retain) == (300.0, 45.0, 10)
    assert dict(config.storage_options) == {} and config.secondary_url is None
    assert CheckpointStoreHook("form_store").test_connection()[0] is True
    # A value the form let through that is no number: the connection and the field are named.
    monkeypatch.setenv("AIRFLOW_CONN_FORM_STORE", json.dumps(
        {"conn_type": "seatunnel_ckpt", "host": f"file://{tmp_path}/store",
         "extra": {**FORM_EXTRAS, "max_retain": "ten"}}))
    with pytest.raises(ConfigError, match=r"connection 'form_store': max_retain must be an integer >= 1, got 'ten'"):
        CheckpointStoreHook("form_store").get_config()
    monkeypatch.setenv("AIRFLOW_CONN_FORM_STORE", json.dumps(
        {"conn_type": "seatunnel_ckpt", "host": f"file://{tmp_path}/store",
         "extra": {**FORM_EXTRAS, "max_retain": "0"}}))
    with pytest.raises(ConfigError, match=r"connection 'form_store': max_retain must be an integer >= 1, got 0"):
        CheckpointStoreHook("form_store").get_config()


def test_secrets_stay_out_of_descriptions_and_trigger_payloads(
        airflow_home: Path, store_conn: str) -> None:
    from airflow_seatunnel_ckpt.hooks.checkpoint_store import CheckpointStoreHook
    from airflow_seatunnel_ckpt.triggers.prepared import EpochPreparedTrigger

    hook = CheckpointStoreHook(store_conn)
    trigger = EpochPreparedTrigger(pipeline="orders", run_id="r1", store_conn_id=store_conn,
                                   store_config={"storage_options": {"secret": SECRET},
                                                 "prepared_timeout_s": 5})
    visible = [hook.describe(), repr(hook.get_config()), repr(trigger),
               json.dumps(trigger.serialize()[1])]
    assert all(SECRET not in text for text in visible)


def test_every_dag_file_imports_without_errors(airflow_home: Path) -> None:
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(REPO / "dags"))

    assert bag.import_errors == {}
    assert {"seatunnel_ckpt_recovery", "orders_pipeline"} <= set(bag.dag_ids)
    for dag_id in bag.dag_ids:
        assert bag.get_dag(dag_id).tags, f"{dag_id} has no tags"


def test_the_epoch_task_group_has_the_standard_shape(airflow_home: Path) -> None:
    from airflow.providers.standard.operators.empty import EmptyOperator
    from airflow.sdk import DAG

    from airflow_seatunnel_ckpt.sensors.prepared import EpochPreparedSensor
    from airflow_seatunnel_ckpt.task_group import checkpointed_epoch

    with DAG("shape", schedule=None) as dag:
        notify = EmptyOperator(task_id="notify")
        checkpointed_epoch(
            "orders", pipeline="orders", storage_url="file:///tmp/store",
            stages={"ingest": {"stage": "m:f", "sources": {}, "sinks": {
                "table": {"path": "file:///tmp/table", "format": "parquet"}}},
                    "enrich": {"stage": "m:g", "sources": {}, "sinks": {}}},
            fallback=notify)

    def downstream(task_id: str) -> set[str]:
        return set(dag.get_task(task_id).downstream_task_ids)

    assert downstream("orders.ingest") == downstream("orders.enrich") == {
        "orders.prepared", "orders.abort"}
    assert downstream("orders.prepared") == {"orders.decide", "orders.abort"}
    assert downstream("orders.decide") == {"orders.commit", "orders.abort", "notify"}
    assert dag.get_task("orders.abort").trigger_rule == "all_done"
    sensor = dag.get_task("orders.prepared")
    assert isinstance(sensor, EpochPreparedSensor)
    assert sensor.participants == ["ingest", "enrich"]
    outlets = dag.get_task("orders.commit").outlets
    assert [(a.uri, a.extra) for a in outlets] == [
        ("file:///tmp/table", {"pipeline": "orders", "sink": "table"})]
    with pytest.raises(ValueError, match="reserved"), DAG("clash", schedule=None):
        checkpointed_epoch("g", pipeline="p", stages={"commit": {}})


def test_templated_fields_render_from_the_run(airflow_home: Path) -> None:
    from airflow_seatunnel_ckpt.operators.commit import CommitEpochOperator
    from airflow_seatunnel_ckpt.operators.stage import SparkStageOperator

    assert {"pipeline", "store_conn_id", "storage_url"} <= set(CommitEpochOperator.template_fields)
    assert {"sources", "sinks", "stage", "spark_conf"} <= set(SparkStageOperator.template_fields)


def test_dag_parsing_does_not_import_pyspark(airflow_home: Path) -> None:
    import subprocess
    import sys

    code = ("import sys, airflow_seatunnel_ckpt.task_group, airflow_seatunnel_ckpt.operators.stage;"
            "print('pyspark' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip().splitlines()[-1] == "False"


def test_provider_info_is_valid_against_airflows_schema() -> None:
    import jsonschema
    from airflow import providers_manager

    from airflow_seatunnel_ckpt.get_provider_info import get_provider_info

    schema = json.loads((Path(providers_manager.__file__).parent / "provider_info.schema.json").read_text())
    jsonschema.validate(get_provider_info(), schema)


def test_connection_form_comes_from_the_provider_info_and_matches_the_config(airflow_home: Path) -> None:
    import dataclasses

    from airflow.providers_manager import ProvidersManager

    from airflow_seatunnel_ckpt.core.config import CheckpointConfig
    from airflow_seatunnel_ckpt.get_provider_info import CONN_FIELDS

    manager = ProvidersManager()
    widgets = manager.connection_form_widgets
    behaviour = manager.field_behaviours["seatunnel_ckpt"]
    assert behaviour["relabeling"]["host"] == "Storage URL" and "port" in behaviour["hidden_fields"]
    config = {f.name: f for f in dataclasses.fields(CheckpointConfig)}
    for name, spec in CONN_FIELDS.items():
        widget = widgets[f"extra__seatunnel_ckpt__{name}"]
        assert widget.field_name == name and widget.field["schema"]["title"] == spec["label"]
        # Each form field is the config field of the same name, with the same default.
        assert name in config, name
        default = config[name].default
        if default is not dataclasses.MISSING:
            assert spec["schema"].get("default") == default, name


def test_test_connection_probes_conditional_create_and_names_what_fails(
        airflow_home: Path, store_conn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_seatunnel_ckpt.hooks.checkpoint_store import CheckpointStoreHook

    ok, message = CheckpointStoreHook(store_conn).test_connection()
    assert ok, message
    assert "honours conditional create" in message and SECRET not in message

    monkeypatch.setenv("AIRFLOW_CONN_BROKEN_STORE", json.dumps({"conn_type": "seatunnel_ckpt",
                                                                 "host": "hdfs://namenode/ckpt"}))
    ok, message = CheckpointStoreHook("broken_store").test_connection()
    assert not ok and "hdfs" in message


def test_store_credentials_given_in_store_config_are_masked_in_task_logs(airflow_home: Path, tmp_path: Path) -> None:
    """A credential passed as a task argument (not a connection, which Airflow masks itself)
    is registered with the secrets masker once the task resolves its store."""
    from airflow.sdk._shared.secrets_masker import redact

    from airflow_seatunnel_ckpt.hooks.checkpoint_store import CheckpointStoreHook

    token = "tok-" + SECRET
    hook = CheckpointStoreHook(storage_url=f"file://{tmp_path}/store",
                               store_config={"storage_options": {"secret": SECRET, "auto_mkdir": True,
                                                                 "client_kwargs": {"session_token": token,
                                                                                   "region_name": "eu-west-1"}}})
    hook.get_config()
    line = f"listing failed for secret={SECRET} token={token} in eu-west-1"
    assert redact(line) == "listing failed for secret=*** token=*** in eu-west-1"
