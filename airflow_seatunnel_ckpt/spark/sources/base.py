"""The Spark side of the source contract: :class:`airflow_seatunnel_ckpt.core.sources.base.Source` (plan, pin, check,
position, replay) plus :meth:`Source.read` of the epoch's pinned offsets (through ``BoundSource.read``)."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from airflow_seatunnel_ckpt.core.sources import base
from airflow_seatunnel_ckpt.core.sources.base import SourceError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["Source", "SourceError"]


class Source(base.Source):
    """Input of a stage: offsets in, DataFrame out.

    A new kind of source implements ``plan`` and ``read`` and is registered by type name in the stage function's module
    (``register_source("kafka", KafkaSource)``); one whose input can change under the same position also implements
    ``pinned_gone``, so its reads and a replay refuse instead of reading something else. An epoch whose stage did not
    read the source records ``{}`` for it.
    """

    @abstractmethod
    def read(self, spark: SparkSession, offsets: Mapping[str, Any]) -> DataFrame:
        """The input the pinned ``offsets`` describe, as a DataFrame: exactly that input, or :class:`SourceError`
        (checked where it is read)."""
