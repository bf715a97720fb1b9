"""Kafka offsets as an epoch's position: planning from the committed history and the broker's answers.

Pure functions, no Kafka client: the Spark layer asks the broker and hands the answers
here as :class:`TopicState` values, so the planning rules (:func:`plan_offsets`) are the
same wherever they come from. The offsets' JSON shape is in docs/KAFKA.md; ``end`` is the
position.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from airflow_seatunnel_ckpt.core.errors import CheckpointError, ConfigError
from airflow_seatunnel_ckpt.core.sources.base import last_read


class KafkaOffsetsError(CheckpointError):
    """A Kafka source cannot plan or read its pinned ranges: records it has not read are gone."""


@dataclass(frozen=True)
class TopicState:
    """What the broker says of one subscribed topic now."""

    #: The topic's id (changes when the topic is deleted and created again); None if unknown.
    topic_id: str | None
    #: Partition -> (earliest offset, end offset).
    partitions: Mapping[int, tuple[int, int]] = field(default_factory=dict)


@dataclass(frozen=True)
class Range:
    """One partition's records an epoch reads: offsets ``[start, end)``."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def label(self) -> str:
        """``topic-partition``, as Kafka tools print it."""
        return f"{self.topic}-{self.partition}"


def check_subscription(where: str, topics: Sequence[str] | None,
                       pattern: str | None) -> tuple[list[str] | None, re.Pattern[str] | None]:
    """A Kafka source's subscription (its options model checked each option's type): exactly one
    of a non-empty topic list and a pattern; the topic list or the compiled pattern."""
    if (topics is None) == (pattern is None):
        raise ConfigError(f"{where}: give exactly one of 'topics' (a list of topic names) or 'pattern' "
                          f"(a regular expression the whole topic name matches)")
    if topics is not None:
        if not topics or not all(topics):
            raise ConfigError(f"{where}: topics must be a non-empty list of topic names, got {topics!r}")
        return list(topics), None
    if not pattern:
        raise ConfigError(f"{where}: pattern must be a regular expression, got {pattern!r}")
    try:
        return None, re.compile(pattern)
    except re.error as exc:
        raise ConfigError(f"{where}: pattern {pattern!r} is not a regular expression: {exc}") from exc


@dataclass(frozen=True)
class Position:
    """Where an epoch resumes: each partition's next offset, the topics' ids, the cap's turn."""

    offsets: dict[str, dict[int, int]]
    topic_ids: dict[str, str]
    #: The partition a capped epoch's round-robin starts at (None: the first one).
    turn: tuple[str, int] | None = None

    @classmethod
    def at(cls, offsets: Mapping[str, Any], which: str = "end") -> Position:
        """The position ``offsets[which]`` describes (``end``: after the epoch; ``start``: before it)."""
        turn = offsets.get("turn")
        return cls({str(t): {int(p): int(o) for p, o in parts.items()} for t, parts in offsets[which].items()},
                   {str(t): str(i) for t, i in (offsets.get("topic_ids") or {}).items()},
                   (str(turn[0]), int(turn[1])) if isinstance(turn, Sequence) and len(turn) == 2 else None)


def last_position(history: Sequence[Mapping[str, Any]]) -> Position | None:
    """The position after the last committed epoch that read the source; None if none did."""
    offsets = last_read(history, "end")
    return None if offsets is None else Position.at(offsets)


def ranges_of(offsets: Mapping[str, Any]) -> list[Range]:
    """The non-empty ranges an epoch's offsets pin, ordered by topic and partition."""
    start, end = offsets.get("start") or {}, offsets.get("end") or {}
    ranges = [Range(str(t), int(p), int(start.get(t, {}).get(p, o)), int(o))
              for t, parts in end.items() for p, o in parts.items()]
    return sorted((r for r in ranges if r.end > r.start), key=lambda r: (r.topic, r.partition))


def spread_cap(available: Mapping[tuple[str, int], int], cap: int, turn: tuple[str, int] | None = None
               ) -> tuple[dict[tuple[str, int], int], tuple[str, int] | None]:
    """How many offsets each partition may take under ``cap`` (max-min fair shares, the remainder one offset
    each in round-robin order from ``turn``), and the next epoch's ``turn``, so none waits forever."""
    granted = dict.fromkeys(available, 0)
    left = {k: n for k, n in available.items() if n > 0}
    budget = cap
    while left and budget > 0:
        share, extra = divmod(budget, len(left))
        keys = sorted(left)
        if turn is not None:
            keys = [k for k in keys if k >= turn] + [k for k in keys if k < turn]
        for number, key in enumerate(keys):
            take = min(left[key], share + (1 if number < extra else 0))
            granted[key] += take
            left[key] -= take
            budget -= take
        if extra:
            turn = keys[extra]
        left = {k: n for k, n in left.items() if n > 0}
        if share == 0:
            break
    return granted, turn


def _lost(topic: str, partition: int | None, start: int | None, end: int | None, reason: str) -> dict[str, Any]:
    return {"topic": topic, "partition": partition, "from": start, "to": end, "reason": reason}


def describe_lost(lost: Sequence[Mapping[str, Any]]) -> str:
    """``topic-partition (offsets a to b: reason)`` for each lost range, as error messages show them."""
    parts = []
    for item in lost:
        name = f"{item['topic']}-{item['partition']}" if item.get("partition") is not None else str(item["topic"])
        span = (f"offsets {item['from']} to {item['to']}" if item.get("to") is not None
                else f"from offset {item['from']}")
        parts.append(f"{name} ({span}: {item['reason']})")
    return ", ".join(parts)


def data_loss_error(where: str, lost: Sequence[Mapping[str, Any]]) -> KafkaOffsetsError:
    """The error of an epoch that would skip records no committed epoch read."""
    return KafkaOffsetsError(
        f"{where}: data loss: records no committed epoch read are gone from {describe_lost(lost)}. The epoch "
        "fails before its commit decision. To skip the lost records and go on, set fail_on_data_loss=false on "
        "the source (each skipped range is recorded as 'lost' in the epoch's offsets); or restore the topic")


def plan_offsets(history: Sequence[Mapping[str, Any]], topics: Mapping[str, TopicState],
                 subscribed: Callable[[str], bool], *, starting_offsets: str = "earliest",
                 max_offsets_per_epoch: int | None = None, fail_on_data_loss: bool = True,
                 where: str = "kafka source",
                 first_plan: Callable[[], Mapping[str, Any] | None] | None = None) -> dict[str, Any]:
    """This epoch's offsets (docs/KAFKA.md) from the committed ``history`` and the broker's ``topics``.

    ``subscribed`` says whether a topic name is subscribed. A topic an earlier epoch read that
    the answer leaves out keeps its position (one answer without it is no deletion); listed
    with another id, it was created again. ``first_plan`` is an earlier epoch's pinned plan:
    with ``starting_offsets="latest"`` and no committed position the epoch starts where it did.

    :raises KafkaOffsetsError: records an earlier epoch had not read are gone, or a subscribed
        topic is missing from the broker's answer, unless ``fail_on_data_loss`` is False.
    """
    previous = last_position(history)
    if previous is None and starting_offsets == "latest" and first_plan is not None:
        pinned = first_plan()
        if pinned and isinstance(pinned.get("start"), Mapping):
            previous = Position.at(pinned, "start")
    first_epoch = previous is None
    position = previous or Position({}, {})
    start: dict[str, dict[int, int]] = {}
    end: dict[str, dict[int, int]] = {}
    lost: list[dict[str, Any]] = []
    missing: list[dict[str, Any]] = []
    for topic, parts in position.offsets.items():
        state = topics.get(topic)
        if state is None:  # no longer subscribed, or not in this answer: the position is kept
            start[topic], end[topic] = dict(parts), dict(parts)
            if subscribed(topic):
                missing += [_lost(topic, p, o, None, "deleted, or not visible to this client now")
                            for p, o in sorted(parts.items())]
            continue
        known = position.topic_ids.get(topic)
        if known is not None and state.topic_id is not None and known != state.topic_id:
            lost += [_lost(topic, p, o, None, f"topic deleted and created again (id {known} -> {state.topic_id})")
                     for p, o in sorted(parts.items())]
            continue  # read as a new topic below, from its earliest offsets
        start[topic] = {}
        for partition, offset in sorted(parts.items()):
            if partition not in state.partitions:
                lost.append(_lost(topic, partition, offset, None, "partition gone"))
                continue
            low, high = state.partitions[partition]
            if offset < low:
                lost.append(_lost(topic, partition, offset, low, f"truncated, the earliest offset is now {low}"))
                offset = low
            elif offset > high:
                lost.append(_lost(topic, partition, offset, high,
                                  f"the end offset {high} is below the position {offset}"))
                offset = high
            start[topic][partition] = offset
    if lost and fail_on_data_loss:
        raise data_loss_error(where, lost)
    if missing and fail_on_data_loss:
        raise KafkaOffsetsError(
            f"{where}: subscribed topic(s) an earlier epoch read are not in the broker's metadata: "
            f"{describe_lost(missing)}. The epoch fails before its commit decision and its retry asks again. If "
            "the topic was deleted on purpose, remove it from 'topics' or set fail_on_data_loss=false on the "
            "source: either way its position is kept, and it resumes there if it comes back with the same id")
    for topic, state in topics.items():
        taken = start.setdefault(topic, {})
        for partition, (low, high) in sorted(state.partitions.items()):
            if partition not in taken:  # a new topic or partition
                taken[partition] = high if first_epoch and starting_offsets == "latest" else low
    available = {(t, p): max(0, topics[t].partitions[p][1] - o)
                 for t, parts in start.items() if t in topics for p, o in parts.items()}
    turn = position.turn
    if max_offsets_per_epoch is None:
        granted = available
    else:
        granted, turn = spread_cap(available, max_offsets_per_epoch, turn)
    for topic, parts in start.items():
        end[topic] = {p: o + granted.get((topic, p), 0) for p, o in parts.items()}
    ids = {t: s.topic_id for t, s in topics.items() if s.topic_id is not None}
    ids.update({t: i for t, i in position.topic_ids.items() if t not in topics and t in end})
    offsets = {"start": _json(start), "end": _json(end), "topic_ids": dict(sorted(ids.items())), "lost": lost}
    if turn is not None:
        offsets["turn"] = list(turn)
    return offsets


def _json(offsets: Mapping[str, Mapping[int, int]]) -> dict[str, dict[str, int]]:
    return {t: {str(p): o for p, o in sorted(parts.items())} for t, parts in sorted(offsets.items())}


def check_pinned(ranges: Sequence[Range], topic_ids: Mapping[str, str], topics: Mapping[str, TopicState],
                 *, fail_on_data_loss: bool, where: str) -> tuple[list[Range], list[dict[str, Any]]]:
    """The pinned ``ranges`` still readable now (``topics``: the broker's answers), and what is lost; run when
    the stage reads, so that with ``fail_on_data_loss`` a loss fails the epoch before its decision."""
    readable: list[Range] = []
    lost: list[dict[str, Any]] = []
    for r in ranges:
        state = topics.get(r.topic)
        pinned_id = topic_ids.get(r.topic)
        if state is None or r.partition not in state.partitions:
            # Not lost: a topic missing from one answer may be listed again with the same id
            # (the retry reads the same range); skipping it would lose the records for good.
            raise KafkaOffsetsError(
                f"{where}: {r.label} (offsets {r.start} to {r.end}, topic id {pinned_id}) is not in the broker's "
                "metadata now: the topic was deleted, or this client cannot see it at the moment. The epoch fails "
                "before its commit decision and its retry reads the same range; if the topic was deleted, abort "
                "the epoch (the next one keeps the topic's position and reads on if it comes back)")
        if pinned_id is not None and state.topic_id is not None and pinned_id != state.topic_id:
            lost.append(_lost(r.topic, r.partition, r.start, r.end,
                              f"topic deleted and created again since the epoch was planned "
                              f"(id {pinned_id} -> {state.topic_id})"))
            continue
        low, _ = state.partitions[r.partition]
        if low > r.start:
            lost.append(_lost(r.topic, r.partition, r.start, min(low, r.end),
                              f"truncated since the epoch was planned, the earliest offset is now {low}"))
            if low >= r.end:
                continue
            r = Range(r.topic, r.partition, low, r.end)
        readable.append(r)
    if lost and fail_on_data_loss:
        raise data_loss_error(where, lost)
    return readable, lost
