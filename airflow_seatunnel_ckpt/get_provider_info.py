"""Provider metadata that Airflow discovers through the ``apache_airflow_provider`` entry point."""

from __future__ import annotations

from typing import Any

_INTEGRATION = "SeaTunnel Checkpoint"


def get_provider_info() -> dict[str, Any]:
    """Return the provider description Airflow's ProvidersManager reads at start-up."""
    return {
        "package-name": "airflow-seatunnel-ckpt",
        "name": "SeaTunnel Checkpoint",
        "description": (
            "Checkpointed, exactly-once PySpark batch pipelines with a two-phase commit "
            "carried out by Airflow tasks."
        ),
        "versions": ["0.1.0"],
        "integrations": [
            {
                "integration-name": _INTEGRATION,
                "external-doc-url": "https://seatunnel.apache.org/",
                "tags": ["software"],
            }
        ],
        "connection-types": [
            {
                "hook-class-name": (
                    "airflow_seatunnel_ckpt.hooks.checkpoint_store.CheckpointStoreHook"
                ),
                "connection-type": "seatunnel_ckpt",
            }
        ],
        "hooks": [
            {
                "integration-name": _INTEGRATION,
                "python-modules": ["airflow_seatunnel_ckpt.hooks.checkpoint_store"],
            }
        ],
        "operators": [
            {
                "integration-name": _INTEGRATION,
                "python-modules": [
                    "airflow_seatunnel_ckpt.operators.stage",
                    "airflow_seatunnel_ckpt.operators.commit",
                    "airflow_seatunnel_ckpt.operators.abort",
                    "airflow_seatunnel_ckpt.operators.branch",
                    "airflow_seatunnel_ckpt.operators.recovery",
                ],
            }
        ],
        "sensors": [
            {
                "integration-name": _INTEGRATION,
                "python-modules": ["airflow_seatunnel_ckpt.sensors.prepared"],
            }
        ],
        "triggers": [
            {
                "integration-name": _INTEGRATION,
                "python-modules": ["airflow_seatunnel_ckpt.triggers.prepared"],
            }
        ],
    }
