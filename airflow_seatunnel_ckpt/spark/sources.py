"""Sources by type: the registry a stage spec's ``sources`` entries are built from.

``{"type": "file", ...}`` (the default) reads the files no committed epoch consumed
(:mod:`file_source`, which also holds the :class:`Source` interface); ``"iceberg"`` and
``"delta"`` read the data files appended to a table since the last committed epoch, and
``"pipeline_output"`` another pipeline's committed file-sink epochs (:mod:`table_sources`);
``"kafka"`` the records produced to Kafka topics since the last committed epoch
(:mod:`kafka_source`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from airflow_seatunnel_ckpt.spark.file_source import (
    CORRUPT_COLUMN,
    FILE_FORMATS,
    FileSource,
    Source,
    SourceError,
    file_identity,
)
from airflow_seatunnel_ckpt.spark.kafka_source import KafkaSource
from airflow_seatunnel_ckpt.spark.registry import Registry
from airflow_seatunnel_ckpt.spark.table_sources import DeltaSource, IcebergSource, PipelineOutputSource

__all__ = ["CORRUPT_COLUMN", "FILE_FORMATS", "DeltaSource", "FileSource", "IcebergSource", "KafkaSource",
           "PipelineOutputSource",
           "Source", "SourceError", "file_identity", "register_source", "source_from_options"]

#: Source type name -> factory(name, **options).
_TYPES: Registry[Source] = Registry("source", {"file": FileSource, "iceberg": IcebergSource, "delta": DeltaSource,
                                               "pipeline_output": PipelineOutputSource, "kafka": KafkaSource})


def register_source(type_name: str, factory: Callable[..., Source]) -> None:
    """Make ``{"type": type_name, ...}`` in a stage spec build a source as ``factory(name, **options)``."""
    _TYPES.register(type_name, factory)


def source_from_options(name: str, options: Mapping[str, Any]) -> Source:
    """Build the source a stage spec describes."""
    return _TYPES.build(name, options)
