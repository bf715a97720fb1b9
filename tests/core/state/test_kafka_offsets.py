"""Kafka offset planning from the committed history and the broker's answers (no broker needed).

The broker's answers are :class:`TopicState` values, the same the Kafka source builds from
a real broker; here they also describe what the test broker cannot produce (a partition
truncated by retention or DeleteRecords, a topic that grew partitions).
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_seatunnel_ckpt.core.sources.kafka import (
    KafkaOffsetsError,
    Range,
    TopicState,
    check_pinned,
    plan_offsets,
    ranges_of,
    spread_cap,
)


def history(*ends: dict[str, dict[str, int]], ids: dict[str, str] | None = None) -> list[dict[str, Any]]:
    return [{"epoch": n, "offsets": {"start": {}, "end": end, "topic_ids": ids or {"t": "id1"}, "lost": []}}
            for n, end in enumerate(ends, 1)]


def state(ids: str = "id1", **partitions: tuple[int, int]) -> dict[str, TopicState]:
    return {"t": TopicState(ids, {int(p[1:]): b for p, b in partitions.items()})}


def only_t(topic: str) -> bool:
    return topic == "t"


def test_first_epoch_starts_at_earliest_or_latest() -> None:
    topics = state(p0=(3, 10), p1=(0, 4))
    earliest = plan_offsets([], topics, only_t)
    assert (earliest["start"], earliest["end"]) == ({"t": {"0": 3, "1": 0}}, {"t": {"0": 10, "1": 4}})
    latest = plan_offsets([], topics, only_t, starting_offsets="latest")
    assert latest["start"] == latest["end"] == {"t": {"0": 10, "1": 4}}
    assert ranges_of(earliest) == [Range("t", 0, 3, 10), Range("t", 1, 0, 4)]


def test_next_epoch_resumes_at_the_position_and_skips_epochs_that_did_not_read() -> None:
    past = history({"t": {"0": 6, "1": 4}})
    past.append({"epoch": 2, "offsets": {}})
    planned = plan_offsets(past, state(p0=(0, 9), p1=(0, 4)), only_t, starting_offsets="latest")
    assert ranges_of(planned) == [Range("t", 0, 6, 9)]


def test_new_partitions_of_a_known_topic_start_at_their_earliest_offset_even_with_latest() -> None:
    planned = plan_offsets(history({"t": {"0": 6}}), state(p0=(0, 6), p1=(2, 5), p2=(0, 0)), only_t,
                           starting_offsets="latest")
    assert ranges_of(planned) == [Range("t", 1, 2, 5)]
    assert planned["end"] == {"t": {"0": 6, "1": 5, "2": 0}}


def test_cap_is_spread_evenly_and_a_small_partition_passes_its_unused_share_on() -> None:
    assert spread_cap({("t", 0): 100, ("t", 1): 10, ("t", 2): 0, ("t", 3): 50}, 60)[0] == {
        ("t", 0): 25, ("t", 1): 10, ("t", 2): 0, ("t", 3): 25}
    # What does not divide evenly goes round: from the first partition, then from the turn.
    assert spread_cap({("t", 0): 5, ("t", 1): 5, ("t", 2): 5}, 4) == (
        {("t", 0): 2, ("t", 1): 1, ("t", 2): 1}, ("t", 1))
    assert spread_cap({("t", 0): 5, ("t", 1): 5, ("t", 2): 5}, 4, ("t", 1))[0] == {
        ("t", 0): 1, ("t", 1): 2, ("t", 2): 1}
    assert spread_cap({("t", 0): 5, ("t", 1): 5}, 100)[0] == {("t", 0): 5, ("t", 1): 5}


def test_a_capped_plan_never_starves_a_partition() -> None:
    position: dict[str, dict[str, int]] = {"t": {"0": 0, "1": 0}}
    high = {0: 0, 1: 1}
    for _ in range(5):  # partition 0 grows by 1,000 per epoch, partition 1 holds one record
        high[0] += 1000
        planned = plan_offsets(history(position), state(p0=(0, high[0]), p1=(0, high[1])), only_t,
                               max_offsets_per_epoch=100)
        position = planned["end"]
    assert position["t"]["1"] == 1


def test_a_truncated_partition_fails_naming_the_partition_offsets_and_option() -> None:
    with pytest.raises(KafkaOffsetsError) as refused:
        plan_offsets(history({"t": {"0": 5, "1": 8}}), state(p0=(0, 9), p1=(20, 30)), only_t,
                     where="kafka source 'events'")
    assert str(refused.value).startswith(
        "kafka source 'events': data loss: records no committed epoch read are gone from t-1 (offsets 8 to 20: "
        "truncated, the earliest offset is now 20).")
    assert "set fail_on_data_loss=false on the source" in str(refused.value)


def test_with_fail_on_data_loss_false_a_truncated_range_is_skipped_and_recorded() -> None:
    planned = plan_offsets(history({"t": {"0": 5, "1": 8}}), state(p0=(0, 9), p1=(20, 30)), only_t,
                           fail_on_data_loss=False)
    assert ranges_of(planned) == [Range("t", 0, 5, 9), Range("t", 1, 20, 30)]
    assert planned["lost"] == [{"topic": "t", "partition": 1, "from": 8, "to": 20,
                                "reason": "truncated, the earliest offset is now 20"}]


def test_a_recreated_topic_is_data_loss_and_skipping_restarts_the_new_topic_at_earliest() -> None:
    past = history({"t": {"0": 5}})
    with pytest.raises(KafkaOffsetsError, match=r"t-0 \(from offset 5: topic deleted and created again "
                                                r"\(id id1 -> id2\)\)"):
        plan_offsets(past, state("id2", p0=(0, 3)), only_t)
    planned = plan_offsets(past, state("id2", p0=(0, 3)), only_t, fail_on_data_loss=False)
    assert ranges_of(planned) == [Range("t", 0, 0, 3)] and planned["topic_ids"] == {"t": "id2"}
    # A topic the subscription no longer names is not lost: its position is kept.
    kept = plan_offsets(past, {}, lambda topic: False)
    assert kept["end"] == {"t": {"0": 5}} and ranges_of(kept) == [] and kept["lost"] == []


def test_a_topic_missing_from_one_answer_keeps_its_position_and_resumes_with_the_same_id() -> None:
    past = history({"t": {"0": 5}})
    with pytest.raises(KafkaOffsetsError, match=r"not in the broker's metadata: t-0 \(from offset 5: deleted, or "
                                                r"not visible to this client now\).*retry asks again"):
        plan_offsets(past, {}, only_t)
    missed = plan_offsets(past, {}, only_t, fail_on_data_loss=False)
    assert missed["end"] == {"t": {"0": 5}} and missed["topic_ids"] == {"t": "id1"} and missed["lost"] == []
    past.append({"epoch": 2, "offsets": missed})
    back = plan_offsets(past, state("id1", p0=(0, 8)), only_t, fail_on_data_loss=False)
    assert ranges_of(back) == [Range("t", 0, 5, 8)] and back["lost"] == []


def test_latest_starts_where_the_first_pinned_plan_started() -> None:
    first = plan_offsets([], state(p0=(0, 5)), only_t, starting_offsets="latest")
    assert first["start"] == {"t": {"0": 5}}
    # The epoch of that plan was aborted; three records arrived since.
    again = plan_offsets([], state(p0=(0, 8)), only_t, starting_offsets="latest", first_plan=lambda: first)
    assert ranges_of(again) == [Range("t", 0, 5, 8)]
    # Aborted too: the plan after it, given the newest earlier plan, still starts at the first one's start.
    third = plan_offsets([], state(p0=(0, 9)), only_t, starting_offsets="latest", first_plan=lambda: again)
    assert ranges_of(third) == [Range("t", 0, 5, 9)]
    # A committed epoch that did not read the source changes nothing either.
    skipped = plan_offsets([{"epoch": 1, "offsets": {}}], state(p0=(0, 8)), only_t, starting_offsets="latest",
                           first_plan=lambda: first)
    assert ranges_of(skipped) == [Range("t", 0, 5, 8)]


def test_an_end_offset_below_the_position_is_data_loss() -> None:
    with pytest.raises(KafkaOffsetsError, match=r"t-0 \(offsets 9 to 4: the end offset 4 is below the position 9\)"):
        plan_offsets(history({"t": {"0": 9}}), state(p0=(0, 4)), only_t)


def test_pinned_ranges_truncated_after_the_plan_fail_or_are_cut() -> None:
    pinned = [Range("t", 0, 5, 10), Range("t", 1, 0, 4)]
    with pytest.raises(KafkaOffsetsError, match=r"t-0 \(offsets 5 to 7: truncated since the epoch was planned"):
        check_pinned(pinned, {"t": "id1"}, state(p0=(7, 12), p1=(0, 4)), fail_on_data_loss=True, where="s")
    readable, lost = check_pinned(pinned, {"t": "id1"}, state(p0=(7, 12), p1=(0, 4)), fail_on_data_loss=False,
                                  where="s")
    assert readable == [Range("t", 0, 7, 10), Range("t", 1, 0, 4)] and [x["to"] for x in lost] == [7]


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(partitions=st.integers(2, 6), cap=st.integers(1, 7),
       arrivals=st.lists(st.lists(st.integers(0, 3), min_size=6, max_size=6), min_size=1, max_size=12))
def test_capped_epochs_read_each_offset_once_and_no_partition_waits_more_epochs_than_there_are_partitions(
        partitions: int, cap: int, arrivals: list[list[int]]) -> None:
    high = dict.fromkeys(range(partitions), 0)
    position = dict.fromkeys(range(partitions), 0)
    waited = dict.fromkeys(range(partitions), 0)
    last: list[dict[str, Any]] = []
    epoch = 0
    while epoch < len(arrivals) or position != high:  # records arrive, then the epochs drain them
        produced = arrivals[epoch] if epoch < len(arrivals) else [0] * 6
        epoch += 1
        assert epoch <= len(arrivals) + sum(high.values()) + 1
        for p in range(partitions):
            high[p] += produced[p]
        planned = plan_offsets(last, state(**{f"p{p}": (0, high[p]) for p in range(partitions)}), only_t,
                               max_offsets_per_epoch=cap)
        taken = 0
        for p in range(partitions):
            start, end = planned["start"]["t"][str(p)], planned["end"]["t"][str(p)]
            assert start == position[p] and start <= end <= high[p]  # each offset once, none skipped
            taken += end - start
            waited[p] = 0 if end > start or high[p] == start else waited[p] + 1
            assert waited[p] < partitions, f"partition {p} waited {waited[p]} epochs with records (epoch {epoch})"
            position[p] = end
        assert taken == min(cap, sum(high.values()) - sum(int(s) for s in planned["start"]["t"].values()))
        last = [{"epoch": epoch, "offsets": planned}]  # the committed history's last entry is what counts
