"""Kafka client settings from an Airflow connection, for the Kafka source's ``kafka_conn_id``.

As for the Airflow Kafka provider, the connection's extras are librdkafka settings. The stage
task hands them to the stage in the source's ``config`` (in its spec, never in the store).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException

from airflow_seatunnel_ckpt.core.errors import ConfigError
from airflow_seatunnel_ckpt.core.options import Options


def kafka_client_config(conn_id: str, where: str = "kafka source") -> dict[str, Any]:
    """The librdkafka settings of the connection ``conn_id`` (its extras)."""
    try:
        conn = BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        raise ConfigError(f"{where}: kafka_conn_id {conn_id!r} is not an Airflow connection here; define it (UI, "
                          "CLI or AIRFLOW_CONN_<ID>) with the librdkafka settings in its extras") from None
    extra = conn.extra_dejson
    if not isinstance(extra, Mapping) or not extra.get("bootstrap.servers"):
        raise ConfigError(f"{where}: connection {conn_id!r} has no 'bootstrap.servers' in its extras; as for the "
                          "Kafka provider, the extras are a JSON object of librdkafka settings, e.g. "
                          '{"bootstrap.servers": "broker:9092", "security.protocol": "SASL_SSL", ...}')
    return {str(k): v for k, v in extra.items()}


def with_kafka_connections(sources: Mapping[str, Mapping[str, Any] | Options]
                           ) -> dict[str, Mapping[str, Any] | Options]:
    """``sources`` with each Kafka source's ``kafka_conn_id`` read into its ``config`` (the source's own
    ``config`` and ``bootstrap_servers`` win over the connection's settings)."""
    resolved: dict[str, Mapping[str, Any] | Options] = {}
    for name, options in sources.items():
        if isinstance(options, Options):
            if options.type != "kafka" or not getattr(options, "kafka_conn_id", None):
                resolved[name] = options
                continue
            options = options.to_dict()
        opts = dict(options)
        conn_id = opts.pop("kafka_conn_id", None) if opts.get("type") == "kafka" else None
        if conn_id:
            opts["config"] = {**kafka_client_config(str(conn_id), f"kafka source {name!r}"),
                              **dict(opts.get("config") or {})}
        resolved[name] = opts
    return resolved
