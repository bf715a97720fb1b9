"""The Spark side of the source contract: a source that also reads its pinned input.

:class:`Source` is :class:`airflow_seatunnel_ckpt.core.sources.base.Source` (plan, pin,
check, position, replay) plus :meth:`Source.read`. The stage reads every source through
``BoundSource.read`` (:mod:`airflow_seatunnel_ckpt.spark.context`) with the epoch's pinned
offsets; a source checks there, where it reads, that the input is the pinned one.
"""

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

    A new kind of source implements ``plan`` and ``read`` and registers a type name, in the
    module of the stage function (the runner imports it before it builds the sources)::

        class KafkaSource(Source):
            def __init__(self, name, topic, servers):
                super().__init__(name)
                self.topic, self.servers = topic, servers

            def plan(self, history):
                # Resume where the last committed epoch that read the topic stopped.
                ends = [e["offsets"]["end"] for e in history if e["offsets"]]
                start = ends[-1] if ends else "earliest"
                return {"start": start, "end": latest_offsets(self.servers, self.topic)}

            def read(self, spark, offsets):
                return (spark.read.format("kafka")
                        .option("kafka.bootstrap.servers", self.servers)
                        .option("subscribe", self.topic)
                        .option("startingOffsets", json.dumps(offsets["start"]))
                        .option("endingOffsets", json.dumps(offsets["end"])).load())

        register_source("kafka", KafkaSource)  # spec: {"type": "kafka", "topic": ..., ...}

    A source whose input can change or vanish under the same position also implements
    ``pinned_gone`` (what of the pinned input is not there as pinned), so that its reads
    and a replay refuse instead of reading something else. An epoch whose stage did not
    read the source records ``{}`` for it.
    """

    @abstractmethod
    def read(self, spark: SparkSession, offsets: Mapping[str, Any]) -> DataFrame:
        """The input the pinned ``offsets`` describe, as a DataFrame: exactly that input, or
        :class:`SourceError` (checked where it is read)."""
