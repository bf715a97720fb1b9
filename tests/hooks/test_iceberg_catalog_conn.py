"""An Iceberg sink's catalog credentials come from an Airflow connection, never the store."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from pyiceberg.catalog import load_catalog

from airflow_seatunnel_ckpt.core.errors import ConfigError
from airflow_seatunnel_ckpt.core.sinks import commit_sink
from airflow_seatunnel_ckpt.hooks import iceberg_catalog
from tests.core.sinks.test_iceberg_sink import IDENT, Lake, eu_us, scan_ids


def test_catalog_conn_id_supplies_the_catalog_at_commit_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lake = Lake(tmp_path)
    monkeypatch.setenv("AIRFLOW_CONN_LAKE_CATALOG", json.dumps({
        "conn_type": "iceberg", "login": "client-id", "password": "client-secret",
        "extra": {"type": "sql", **{k: v for k, v in lake.catalog_props.items() if k != "type"}}}))
    manifest = lake.stage(1, eu_us([1], [2]))
    # what the sink records: the connection's name, no catalog properties at all
    manifest = dataclasses.replace(manifest,
        table={**manifest.table.to_dict(), "catalog": {}, "catalog_conn_id": "lake_catalog"})
    assert "client-secret" not in json.dumps(manifest.to_dict())
    assert commit_sink(lake.request(1, manifest)).how == "appended"
    assert scan_ids(load_catalog("lake", **lake.catalog_props).load_table(IDENT)) == [1, 2]


def test_connection_host_and_login_become_uri_and_credential(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_REST_CATALOG", json.dumps({
        "conn_type": "iceberg", "host": "https://catalog.example/api", "login": "id", "password": "the-secret",
        "extra": {"type": "rest", "warehouse": "prod"}}))
    props = iceberg_catalog.catalog_secrets({"type": "iceberg", "catalog_conn_id": "rest_catalog"})
    assert props == {"uri": "https://catalog.example/api", "credential": "id:the-secret", "type": "rest",
                     "warehouse": "prod"}
    assert iceberg_catalog.catalog_secrets({"type": "delta", "catalog_conn_id": "rest_catalog"}) == {}


def test_missing_catalog_connection_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match="catalog_conn_id 'no_such_catalog' is not an Airflow connection"):
        iceberg_catalog.catalog_secrets({"type": "iceberg", "table": "lake.orders",
                                         "catalog_conn_id": "no_such_catalog"})
