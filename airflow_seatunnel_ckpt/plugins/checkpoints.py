"""The Airflow plugin: the Checkpoints app, a nav entry and a DAG run tab.

Registered through the provider info's ``plugins`` entry, so installing the provider is
enough. Only the API server mounts ``fastapi_apps``; other processes that load plugins
build the app object too (cheap: no database or store is touched until a request).
"""

from __future__ import annotations

from typing import Any

from airflow.plugins_manager import AirflowPlugin

from airflow_seatunnel_ckpt.plugins.app import URL_PREFIX


def _app() -> Any:
    from airflow_seatunnel_ckpt.plugins.app import create_app

    return create_app()



class CheckpointsPlugin(AirflowPlugin):
    """The "Checkpoints" page: pipelines and epochs of the configured stores, and on-call actions."""

    name = "seatunnel_ckpt_checkpoints"
    fastapi_apps = [{"app": _app(), "url_prefix": URL_PREFIX, "name": "SeaTunnel checkpoints"}]
    external_views = [
        {"name": "Checkpoints", "href": f"{URL_PREFIX}/", "destination": "nav",
         "url_route": "seatunnel-checkpoints"},
        # The UI replaces {DAG_ID} and {RUN_ID} in a non-nav view's href.
        {"name": "Checkpoint epoch", "href": f"{URL_PREFIX}/run?dag_id={{DAG_ID}}&run_id={{RUN_ID}}",
         "destination": "dag_run", "url_route": "seatunnel-checkpoint-epoch"},
    ]
