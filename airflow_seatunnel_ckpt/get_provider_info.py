"""Provider metadata that Airflow discovers through the ``apache_airflow_provider`` entry point."""

from __future__ import annotations

from typing import Any

_INTEGRATION = "SeaTunnel Checkpoint"

#: The connection form (Airflow 3.2+ reads it from here, without importing the hook).
#: Each field is a key of the connection's extras and a ``CheckpointConfig`` field of the
#: same name and default (``tests/test_provider.py`` keeps them in step).
CONN_FIELDS: dict[str, Any] = {
    "storage_options": {
        "label": "Storage options",
        "description": "fsspec storage options as JSON (endpoint, region, ...); login and password fill "
                       "'key' and 'secret'",
        "schema": {"type": ["object", "null"], "format": "json"},
    },
    "prepared_timeout_s": {
        "label": "Prepared timeout (s)",
        "description": "recovery aborts a PREPARED epoch still undecided this long after it prepared",
        "schema": {"type": ["number", "null"], "default": 600.0, "minimum": 0},
    },
    "lease_timeout_s": {
        "label": "Stage lease timeout (s)",
        "description": "an OPEN epoch whose stage lease was not renewed this long is dead and may be aborted",
        "schema": {"type": ["number", "null"], "default": 180.0, "minimum": 0},
    },
    "max_retain": {
        "label": "Checkpoints kept",
        "description": "committed checkpoints retention keeps (plus every base they still need)",
        "schema": {"type": ["integer", "null"], "default": 10, "minimum": 1},
    },
    "secondary_url": {
        "label": "Secondary store URL",
        "description": "optional second store receiving a copy of every completed checkpoint",
        "schema": {"type": ["string", "null"]},
    },
}

UI_FIELD_BEHAVIOUR: dict[str, Any] = {
    "hidden-fields": ["schema", "port"],
    "relabeling": {
        "host": "Storage URL",
        "login": "Access key (storage option 'key')",
        "password": "Secret (storage option 'secret')",
    },
    "placeholders": {
        "host": "s3://bucket/checkpoints or file:///var/lib/ckpt",
        "login": "access key id (optional)",
    },
}


def _modules(*names: str) -> list[dict[str, Any]]:
    """One ``python-modules`` entry of this provider's integration (``names`` below the package)."""
    return [{"integration-name": _INTEGRATION, "python-modules": [f"airflow_seatunnel_ckpt.{n}" for n in names]}]


def get_provider_info() -> dict[str, Any]:
    """Return the provider description Airflow's ProvidersManager reads at start-up."""
    return {
        "package-name": "airflow-seatunnel-ckpt",
        "name": "SeaTunnel Checkpoint",
        "description": "Checkpointed, exactly-once PySpark batch pipelines with a two-phase commit "
                       "carried out by Airflow tasks.",
        "versions": ["0.1.0"],
        "integrations": [{"integration-name": _INTEGRATION, "external-doc-url": "https://seatunnel.apache.org/",
                          "tags": ["software"]}],
        "connection-types": [{
            "hook-class-name": "airflow_seatunnel_ckpt.hooks.checkpoint_store.CheckpointStoreHook",
            "connection-type": "seatunnel_ckpt",
            "hook-name": "SeaTunnel Checkpoint Store",
            "conn-fields": CONN_FIELDS,
            "ui-field-behaviour": UI_FIELD_BEHAVIOUR,
        }],
        "hooks": _modules("hooks.checkpoint_store", "hooks.stage_submit"),
        "operators": _modules("operators.stage", "operators.commit", "operators.abort", "operators.branch",
                              "operators.recovery"),
        "sensors": _modules("sensors.prepared"),
        "triggers": _modules("triggers.prepared"),
        # The "Checkpoints" page of the Airflow UI (a FastAPI app and external views).
        "plugins": [{"name": "seatunnel_ckpt_checkpoints",
                     "plugin-class": "airflow_seatunnel_ckpt.plugins.app.CheckpointsPlugin"}],
        # Iceberg sink tables (iceberg://<catalog>/<namespace>.<table>). The file and Delta
        # sinks' file:// and s3:// URIs belong to the common-io and Amazon providers; claiming
        # them here would replace those providers' handlers for every DAG of the deployment.
        "asset-uris": [{
            "schemes": ["iceberg"],
            "handler": "airflow_seatunnel_ckpt.lineage.assets.sanitize_uri",
            "factory": "airflow_seatunnel_ckpt.lineage.assets.create_asset",
            "to_openlineage_converter": "airflow_seatunnel_ckpt.lineage.assets.convert_asset_to_openlineage",
        }],
    }
