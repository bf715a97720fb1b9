"""Sinks by type: the registry a stage spec's ``sinks`` entries are built from.

``{"type": "file", ...}`` (the default) publishes ``<target>/epoch=<e>/`` directories
(:mod:`file_sink`); ``"iceberg"``, ``"delta"`` and ``"postgres"`` commit each epoch into a
table (:mod:`table_sinks`). Every sink first writes into its attempt's staging; the commit
publishes it once every participant of the epoch prepared.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from airflow_seatunnel_ckpt.spark.file_sink import FileSink, Sink, SinkError
from airflow_seatunnel_ckpt.spark.registry import Registry
from airflow_seatunnel_ckpt.spark.table_sinks import DeltaSink, IcebergSink, PostgresSink

__all__ = ["DeltaSink", "FileSink", "IcebergSink", "PostgresSink", "Sink", "SinkError", "register_sink",
           "sink_from_options"]

#: Sink type name -> factory(name, **options).
_TYPES: Registry[Sink] = Registry("sink", {"file": FileSink, "iceberg": IcebergSink, "delta": DeltaSink,
                                       "postgres": PostgresSink})


def register_sink(type_name: str, factory: Callable[..., Sink]) -> None:
    """Make ``{"type": type_name, ...}`` in a stage spec build a sink as ``factory(name, **options)``."""
    _TYPES.register(type_name, factory)


def sink_from_options(name: str, options: Mapping[str, Any]) -> Sink:
    """Build the sink a stage spec describes."""
    return _TYPES.build(name, options)
