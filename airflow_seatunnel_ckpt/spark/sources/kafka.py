"""The Kafka source: ``{"type": "kafka", ...}``, pinned ``[start, end)`` offsets per partition as the epoch's position
(:mod:`airflow_seatunnel_ckpt.core.sources.kafka`), read by :mod:`.kafka_reader` with Spark's Kafka source columns; the
client configuration is never written to the store (docs/KAFKA.md)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from airflow_seatunnel_ckpt.core.errors import ConfigError
from airflow_seatunnel_ckpt.core.sources import kafka as kafka_offsets
from airflow_seatunnel_ckpt.core.sources.base import as_source_error
from airflow_seatunnel_ckpt.core.sources.kafka import KafkaOffsetsError, Range, TopicState
from airflow_seatunnel_ckpt.core.sources.options import KafkaSourceOptions, constructor_signature
from airflow_seatunnel_ckpt.spark.sources.base import Source, SourceError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

#: Client options the plan and the reader set themselves.
OWN_OPTIONS = {"enable.auto.commit": False, "enable.partition.eof": False}
#: Seconds an admin request (metadata, offsets) may take.
ADMIN_TIMEOUT_S = 30.0


class KafkaSource(Source):
    """Records of Kafka topics: each epoch reads the offsets produced since the last committed one.

    Options: :class:`~airflow_seatunnel_ckpt.core.sources.options.KafkaSourceOptions`; ``kafka_conn_id`` is resolved
    into ``config`` by the stage operator, and nothing is committed to ``group_id``: the checkpoint is the position.
    """

    kind = "kafka"

    def __init__(self, name: str, **options: Any) -> None:
        super().__init__(name)
        self.settings = settings = self.checked_options(KafkaSourceOptions, options)
        self.topics, self.pattern = kafka_offsets.check_subscription(self.where, settings.topics, settings.pattern)
        self.config: dict[str, Any] = {str(k): v for k, v in (settings.config or {}).items()}
        if settings.bootstrap_servers is not None:
            self.config["bootstrap.servers"] = settings.bootstrap_servers
        self.kafka_conn_id = settings.kafka_conn_id
        if not self.config.get("bootstrap.servers") and not self.kafka_conn_id:
            raise ConfigError(f"{self.where}: no broker: give bootstrap_servers, or kafka_conn_id (an Airflow "
                              "connection whose extras hold 'bootstrap.servers' and the client's settings)")
        self.max_offsets_per_epoch = settings.max_offsets_per_epoch
        self.starting_offsets = settings.starting_offsets
        self.fail_on_data_loss = settings.fail_on_data_loss
        self.group_id = settings.group_id or f"seatunnel-ckpt-{name}"

    def client_config(self) -> dict[str, Any]:
        """The librdkafka settings every client of this source uses."""
        if not self.config.get("bootstrap.servers"):
            raise ConfigError(
                f"{self.where}: kafka_conn_id {self.kafka_conn_id!r} was not resolved into the client settings; "
                "run the stage through SparkStageOperator (it reads the connection when the task runs), or "
                "give bootstrap_servers and config")
        return {**self.config, "group.id": self.group_id, **OWN_OPTIONS}

    def subscribed(self, topic: str) -> bool:
        """Whether ``topic`` is one this source reads."""
        if self.topics is not None:
            return topic in self.topics
        assert self.pattern is not None
        return not topic.startswith("__") and self.pattern.fullmatch(topic) is not None

    # -- planning ---------------------------------------------------------------------------
    def broker_state(self, names: list[str] | None = None) -> dict[str, TopicState]:
        """Every subscribed topic that exists (or those of ``names``), as the broker describes it now."""
        from confluent_kafka import IsolationLevel, KafkaException, TopicCollection, TopicPartition
        from confluent_kafka.admin import AdminClient, OffsetSpec

        config = {k: v for k, v in self.client_config().items() if k not in ("group.id", *OWN_OPTIONS)}
        admin = AdminClient(config)
        try:
            listed = admin.list_topics(timeout=ADMIN_TIMEOUT_S).topics
            wanted = sorted(t for t in listed if (t in names if names is not None else self.subscribed(t)))
            if not wanted:
                return {}
            described = admin.describe_topics(TopicCollection(wanted), request_timeout=ADMIN_TIMEOUT_S)
            topics = {t: f.result(ADMIN_TIMEOUT_S) for t, f in described.items()}
            tps = [TopicPartition(t, p.id) for t, d in topics.items() for p in d.partitions]
            bounds: dict[tuple[str, int], list[int]] = {}
            for spec in (OffsetSpec.earliest(), OffsetSpec.latest()):
                answers = admin.list_offsets(dict.fromkeys(tps, spec), request_timeout=ADMIN_TIMEOUT_S,
                                             isolation_level=IsolationLevel.READ_COMMITTED)
                for tp, future in answers.items():
                    bounds.setdefault((tp.topic, tp.partition), []).append(int(future.result(ADMIN_TIMEOUT_S).offset))
        except KafkaException as exc:
            raise SourceError(f"{self.where}: cannot ask the broker ({self.config.get('bootstrap.servers')}) for "
                              f"the topics' offsets: {exc}; check that it is reachable, then retry") from exc
        return {t: TopicState(str(d.topic_id) if d.topic_id is not None else None,
                              {p.id: (bounds[(t, p.id)][0], bounds[(t, p.id)][1]) for p in d.partitions})
                for t, d in topics.items()}

    def plan(self, history: list[dict[str, Any]]) -> dict[str, Any]:
        """The ranges since the committed position, capped (see the class docs)."""
        state = self.broker_state()
        with as_source_error(KafkaOffsetsError):
            offsets = kafka_offsets.plan_offsets(
                history, state, self.subscribed, starting_offsets=self.starting_offsets,
                max_offsets_per_epoch=self.max_offsets_per_epoch, fail_on_data_loss=self.fail_on_data_loss,
                where=self.where, first_plan=self.first_pinned)
        if offsets["lost"]:
            log.warning("%s: skipping lost records (fail_on_data_loss=false): %s", self.where,
                        kafka_offsets.describe_lost(offsets["lost"]))
        kept = sorted(t for t in offsets["end"] if t not in state and self.subscribed(t))
        if kept:
            log.warning("%s: topic(s) %s are not in the broker's metadata (deleted, or not visible to this client "
                        "now); their positions are kept and the epoch reads the others", self.where, kept)
        if self.topics is not None:
            missing = sorted(set(self.topics) - set(state) - set(offsets["end"]))
            if missing:
                log.warning("%s: topic(s) %s do not exist (yet); the epoch reads the others", self.where, missing)
        return offsets

    # -- reading ----------------------------------------------------------------------------
    def checked_ranges(self, offsets: Mapping[str, Any]) -> tuple[list[Range], list[dict[str, Any]]]:
        """The pinned ranges checked against the broker now: the readable part of each, and the records lost (truncated,
        or the topic deleted and created again: another topic id)."""
        ranges = kafka_offsets.ranges_of(offsets)
        if not ranges:
            return [], []
        state = self.broker_state(sorted({r.topic for r in ranges}))
        with as_source_error(KafkaOffsetsError):
            return kafka_offsets.check_pinned(ranges, offsets.get("topic_ids") or {}, state,
                                              fail_on_data_loss=False, where=self.where)

    def readable_ranges(self, offsets: Mapping[str, Any]) -> list[Range]:
        """The pinned ranges to read: lost records fail here, before prepare, unless skipped."""
        readable, lost = self.checked_ranges(offsets)
        if lost and not self.skips_gone:
            raise SourceError(str(kafka_offsets.data_loss_error(self.where, lost)))
        if lost:
            log.warning("%s: skipping records lost since the epoch was planned (fail_on_data_loss=false): %s",
                        self.where, kafka_offsets.describe_lost(lost))
        return readable

    def pinned_gone(self, offsets: Mapping[str, Any]) -> list[str]:
        """The pinned records no longer in their topic (see :meth:`checked_ranges`)."""
        return [kafka_offsets.describe_lost([entry]) for entry in self.checked_ranges(offsets)[1]]

    @property
    def skips_gone(self) -> bool:
        """``fail_on_data_loss=false``, until :meth:`read_exactly` (a replay)."""
        return not self.fail_on_data_loss and not self.exact

    def read(self, spark: SparkSession, offsets: Mapping[str, Any]) -> DataFrame:
        """Exactly the pinned ranges, one Spark input partition per topic-partition range (each executor checks the
        pinned topic id and range again)."""
        from airflow_seatunnel_ckpt.spark.sources.kafka_reader import SCHEMA, read_ranges

        ranges = self.readable_ranges(offsets)
        if not ranges:
            return spark.createDataFrame([], SCHEMA)
        return read_ranges(spark, ranges, self.client_config(), self.where, not self.skips_gone,
                           topic_ids=offsets.get("topic_ids") or {})


KafkaSource.__init__.__signature__ = constructor_signature(KafkaSourceOptions)  # type: ignore[attr-defined]
