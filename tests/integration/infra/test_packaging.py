"""The installed distribution exposes its entry points to Airflow and to the storage registry."""

from __future__ import annotations

from importlib.metadata import entry_points
from pathlib import Path

import pytest

import airflow_seatunnel_ckpt
from airflow_seatunnel_ckpt.get_provider_info import get_provider_info


def test_storage_backends_are_registered_for_file_memory_and_s3() -> None:
    registered = {ep.name: ep for ep in entry_points(group="airflow_seatunnel_ckpt.storage")}

    assert {"file", "memory", "s3"} <= set(registered)
    for ep in registered.values():
        assert isinstance(ep.load(), type), ep.value


def test_provider_info_entry_point_returns_the_provider_description() -> None:
    (ep,) = [
        ep
        for ep in entry_points(group="apache_airflow_provider")
        if ep.value.startswith("airflow_seatunnel_ckpt.")
    ]
    info = ep.load()()

    assert info == get_provider_info()
    assert info["package-name"] == "airflow-seatunnel-ckpt"
    assert airflow_seatunnel_ckpt.__version__ in info["versions"]
    assert info["connection-types"][0]["connection-type"] == "seatunnel_ckpt"


@pytest.mark.airflow
def test_airflow_discovers_the_provider(airflow_home: Path) -> None:
    from airflow.providers_manager import ProvidersManager

    provider = ProvidersManager().providers["airflow-seatunnel-ckpt"]

    assert provider.version == airflow_seatunnel_ckpt.__version__


def test_console_script_is_registered() -> None:
    (ep,) = [ep for ep in entry_points(group="console_scripts") if ep.name == "seatunnel-ckpt"]

    assert ep.value == "airflow_seatunnel_ckpt.cli:main"
