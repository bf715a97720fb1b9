"""The sources' typed options: every option a DAG could name keeps parsing, anything else is refused by name."""

from __future__ import annotations

import inspect

import pytest

from airflow_seatunnel_ckpt.core.errors import ConfigError
from airflow_seatunnel_ckpt.core.options import option_table, parse
from airflow_seatunnel_ckpt.core.sources.options import SOURCE_OPTIONS, KafkaSourceOptions

#: The options each source type took before its model existed (its constructor's keywords then).
EARLIER_OPTIONS = {
    "file": ["path", "format", "options", "schema", "max_files_per_epoch", "storage_options", "allow_missing",
             "on_change", "bad_records", "prefixes", "max_file_age", "ordered_prefixes", "backfill_every"],
    "pipeline_output": ["path", "format", "options", "schema", "storage_options", "allow_missing", "bad_records",
                        "skip_replays"],
    "iceberg": ["table", "catalog", "catalog_name", "start", "skip_overwrites", "skip_deletes"],
    "delta": ["path", "storage_options", "start", "skip_change_commits"],
    "kafka": ["bootstrap_servers", "topics", "pattern", "max_offsets_per_epoch", "starting_offsets",
              "fail_on_data_loss", "config", "kafka_conn_id", "group_id"],
}


def test_every_earlier_option_name_is_a_field_with_a_docstring() -> None:
    assert set(EARLIER_OPTIONS) <= set(SOURCE_OPTIONS)
    assert all(field.description for model in SOURCE_OPTIONS.values()
               for name, field in model.model_fields.items() if name != "type")
    for type_, names in EARLIER_OPTIONS.items():
        fields = SOURCE_OPTIONS[type_].model_fields
        assert sorted(fields) == sorted(["type", *names]), type_
        assert all(fields[n].description for n in names), type_


def test_a_source_entry_parses_into_its_model_and_an_unknown_option_names_the_nearest() -> None:
    got = parse("source", "events", {"type": "kafka", "topics": ["a"], "bootstrap_servers": "b:9092"}, SOURCE_OPTIONS)
    assert isinstance(got, KafkaSourceOptions) and got.fail_on_data_loss is True and got.topics == ["a"]
    with pytest.raises(ConfigError, match=r"source 'orders' \(type 'file'\): unknown option 'fromat' "
                                          r"\(did you mean 'format'\?\)"):
        parse("source", "orders", {"path": "file:///in", "fromat": "csv"}, SOURCE_OPTIONS)
    with pytest.raises(ConfigError, match=r"option 'allow_missing': input should be a valid boolean"):
        parse("source", "orders", {"path": "file:///in", "allow_missing": "yes"}, SOURCE_OPTIONS)


def test_the_spark_sources_take_the_models_options_and_refuse_others_by_name() -> None:
    from airflow_seatunnel_ckpt.spark.registry import SOURCES

    for type_, model in SOURCE_OPTIONS.items():
        params = list(inspect.signature(SOURCES.factory("s", type_)).parameters)
        assert params[0] == "name" and sorted(params[1:]) == sorted(f for f in model.model_fields if f != "type"), type_
    with pytest.raises(ConfigError, match=r"option 'start': input should be 'earliest' or 'latest'"):
        SOURCES.build("events", {"type": "delta", "path": "file:///t", "start": "newest"})


def test_the_reference_tables_come_from_the_models() -> None:
    table = option_table(SOURCE_OPTIONS["file"])
    assert "| `on_change` | `\"error\"` \\| `\"reread\"` | `'error'` |" in table
