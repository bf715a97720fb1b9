"""The consumed-file index of a file source: bounded reads per epoch, compaction, the
time watermark, and the upgrade from the entries shape of earlier releases."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_seatunnel_ckpt.core import Pipeline, layout
from airflow_seatunnel_ckpt.core.errors import CorruptCheckpointError
from airflow_seatunnel_ckpt.core.models import PartRef
from airflow_seatunnel_ckpt.core.sources import files as fi
from airflow_seatunnel_ckpt.core.sources.source_log import INDEX_KEY, is_index_chain, open_index, write_source_part
from airflow_seatunnel_ckpt.core.state.checkpoint import read_json_part, write_json_part
from tests.core.conftest import StoreSpec
from tests.core.epochs import Participant, flip_byte, run_epoch

DAY = 86_400.0


def offsets(names: list[str], mtime: float = 1_000.0, age: float | None = None) -> dict[str, Any]:
    """A file source's offsets for ``names`` (all modified at ``mtime``)."""
    return {"files": names, "identity": {n: {"size": 10, "mtime": mtime} for n in names},
            INDEX_KEY: {"max_file_age": age}}


def epoch_with(p: Pipeline, run: int, names: list[str], mtime: float = 1_000.0, age: float | None = None) -> None:
    run_epoch(p, f"run-{run}", Participant(sinks={}, sources={"in": offsets(names, mtime, age)}))


def chain_of(p: Pipeline) -> list[PartRef]:
    point = p.restore_point()
    return point.source_chains["in"]


def names(p: Pipeline) -> list[str]:
    assert p.storage is not None
    return open_index(p.storage, chain_of(p)).table().column("path").to_pylist()


@pytest.fixture
def small_segments(monkeypatch: pytest.MonkeyPatch) -> None:
    """Segments of 4 rows, so a few epochs make several of them."""
    monkeypatch.setattr(fi, "SEGMENT_ROWS", 4)


def test_deltas_are_compacted_into_a_base_every_interval(local_spec: StoreSpec) -> None:
    p = local_spec.pipeline(full_checkpoint_interval=3)
    for e in range(1, 8):
        epoch_with(p, e, [f"f{e:03d}"])
        chain = chain_of(p)
        assert is_index_chain(chain)
        deltas = [ref for ref in chain if ref.kind == "delta"]
        # Never more than interval - 1 deltas: each epoch reads a bounded number of parts.
        assert len(deltas) <= 2
    assert names(p) == [f"f{e:03d}" for e in range(1, 8)]


def test_a_lookup_reads_only_the_segments_covering_the_listed_names(
        local_spec: StoreSpec, small_segments: None) -> None:
    p = local_spec.pipeline(full_checkpoint_interval=1)  # compact every epoch: segments only
    for e in range(1, 5):
        epoch_with(p, e, [f"dt={e}/part-{i}" for i in range(4)])
    index = open_index(p.storage, chain_of(p))
    assert len(index.segments) == 4

    assert index.lookup(["dt=5/part-0", "dt=5/part-1"]) == {}  # new names after every range
    assert index.segments_read == 0
    found = index.lookup(["dt=2/part-3", "dt=2/part-9"])
    assert index.segments_read == 1
    assert found == {"dt=2/part-3": {"size": 10, "mtime": 1_000.0}}


def test_compaction_carries_untouched_segments_by_reference(local_spec: StoreSpec, small_segments: None) -> None:
    p = local_spec.pipeline(full_checkpoint_interval=1)
    for e in range(1, 4):
        epoch_with(p, e, [f"dt={e}/part-{i}" for i in range(4)])
    chain = chain_of(p)
    # The segments of dt=1 and dt=2 were written by earlier epochs and never rewritten.
    assert sorted(ref.epoch for ref in chain[1:]) == [1, 2, 3]


def test_files_older_than_the_watermark_leave_the_index_at_compaction(local_spec: StoreSpec,
                                                                      small_segments: None) -> None:
    p = local_spec.pipeline(full_checkpoint_interval=2)
    for day in range(1, 8):
        epoch_with(p, day, [f"dt={day}/part-{i}" for i in range(4)], mtime=day * DAY, age=2 * DAY)
    index = open_index(p.storage, chain_of(p))
    assert index.newest_mtime == 7 * DAY and index.watermark(2 * DAY) == 5 * DAY
    # Epoch 7 compacted (interval 2): days 5..7 are inside the window, days 1..4 are gone.
    assert sorted({n.split("/")[0] for n in index.table().column("path").to_pylist()}) == [
        "dt=5", "dt=6", "dt=7"]


def test_a_compaction_records_the_window_it_forgot_and_a_wider_one_never_lists_below_it(
        local_spec: StoreSpec, small_segments: None) -> None:
    p = local_spec.pipeline(full_checkpoint_interval=2)
    for day in range(1, 8):
        epoch_with(p, day, [f"dt={day}/part-{i}" for i in range(4)], mtime=day * DAY, age=2 * DAY)
    index = open_index(p.storage, chain_of(p))
    assert (index.aged_below, index.max_file_age) == (5 * DAY, 2 * DAY)
    # Files of days 1..4 may have been consumed and forgotten: no window lists them again.
    assert index.listing_watermark(30 * DAY) == index.listing_watermark(None) == 5 * DAY
    assert index.listing_watermark(1 * DAY) == 6 * DAY  # a narrower window applies as it is
    # Without max_file_age compactions forget nothing more, and the window stays recorded.
    epoch_with(p, 8, ["dt=8/part-0"], mtime=8 * DAY)
    epoch_with(p, 9, ["dt=9/part-0"], mtime=9 * DAY)
    later = open_index(p.storage, chain_of(p))
    assert (later.aged_below, later.max_file_age) == (5 * DAY, 2 * DAY)
    assert "dt=5/part-0" in later.table().column("path").to_pylist()


def test_a_directory_without_a_recorded_window_forgot_nothing(local_spec: StoreSpec) -> None:
    p = local_spec.pipeline(full_checkpoint_interval=1)
    epoch_with(p, 1, ["a"])
    head, *rest = chain_of(p)
    doc = {k: v for k, v in read_json_part(p.storage, head).items() if k not in ("aged_below", "max_file_age")}
    written = write_json_part(p.storage, head.path, doc, epoch=1)
    index = open_index(p.storage, [written, *rest])
    assert index.aged_below is None and index.listing_watermark(None) is None


def test_the_greatest_name_below_a_prefix_reads_only_the_segments_that_may_hold_it(
        local_spec: StoreSpec, small_segments: None) -> None:
    p = local_spec.pipeline(full_checkpoint_interval=1)
    for e in range(1, 4):
        epoch_with(p, e, [f"{region}/dt={e}/part-{i}" for region in ("eu", "us") for i in range(2)])
    index = open_index(p.storage, chain_of(p))

    def in_partition(name: str) -> bool:
        return name.count("/") >= 2

    assert index.greatest_path() == "us/dt=3/part-1"  # from the directory alone
    assert index.greatest_path("eu/dt=", in_partition) == "eu/dt=3/part-1"
    assert index.segments_read == 1
    assert index.greatest_path("ap/dt=", in_partition) is None and index.segments_read == 1
    assert index.greatest_path("eu/dt=", lambda name: name.startswith("eu/dt=1/")) == "eu/dt=1/part-1"


def test_a_segment_wholly_older_than_the_watermark_is_dropped_unread(local_spec: StoreSpec,
                                                                     small_segments: None) -> None:
    p = local_spec.pipeline(full_checkpoint_interval=1)
    old = write_source_part(p.storage, p.config, 1, 1, "in", offsets([f"old/part-{i}" for i in range(4)], DAY, DAY),
                            [], False, lambda: [])
    (old_segment,) = old.chain[1:]
    p.storage.delete(old_segment.path)  # were it read, this compaction would fail
    new = write_source_part(p.storage, p.config, 2, 1, "in", offsets(["new/part-0"], 10 * DAY, DAY),
                            old.chain, False, lambda: [])
    assert open_index(p.storage, new.chain).table().column("path").to_pylist() == ["new/part-0"]


def test_an_entries_history_of_an_earlier_release_is_converted_by_the_next_epoch(local_spec: StoreSpec) -> None:
    p = local_spec.pipeline(full_checkpoint_interval=10)
    for e in (1, 2):  # offsets in the shape before the index: an entries chain
        run_epoch(p, f"run-{e}", Participant(sinks={}, sources={"in": {"files": [f"f{e}"]}}))
    assert not is_index_chain(chain_of(p))
    old = open_index(p.storage, chain_of(p))  # planning reads the old shape as it is
    assert old.lookup(["f1", "f3"]) == {"f1": None}

    epoch_with(p, 3, ["f3"])

    chain = chain_of(p)
    assert is_index_chain(chain) and all(ref.epoch == 3 for ref in chain)
    assert names(p) == ["f1", "f2", "f3"]
    assert [e["offsets"]["files"] for e in p.restore_point().source_entries("in")] == [["f1"], ["f2"], ["f3"]]


def test_an_epoch_that_did_not_read_the_source_keeps_the_index_shape(local_spec: StoreSpec) -> None:
    p = local_spec.pipeline(full_checkpoint_interval=3)
    epoch_with(p, 1, ["a"])
    run_epoch(p, "run-2", Participant(sinks={}, sources={"in": {}}))
    epoch_with(p, 3, ["b"])
    epoch_with(p, 4, ["c"])
    assert is_index_chain(chain_of(p))
    assert names(p) == ["a", "b", "c"]


def test_a_damaged_index_part_falls_back_to_the_log_and_the_next_epoch_rewrites_the_index(
        local_spec: StoreSpec) -> None:
    p = local_spec.pipeline(full_checkpoint_interval=10)
    epoch_with(p, 1, ["a"])
    epoch_with(p, 2, ["b"])
    flip_byte(p.storage, chain_of(p)[-1].path)
    point = p.restore_point()
    assert point.how == "rebuilt-from-log"
    assert [e["offsets"]["files"] for e in point.source_entries("in")] == [["a"], ["b"]]

    epoch_with(p, 3, ["c"])

    assert p.restore_point().how == "primary"
    assert names(p) == ["a", "b", "c"]


def test_a_re_read_file_keeps_the_identity_of_its_latest_epoch(local_spec: StoreSpec) -> None:
    p = local_spec.pipeline(full_checkpoint_interval=2)
    epoch_with(p, 1, ["a"], mtime=1.0)
    epoch_with(p, 2, ["a"], mtime=2.0)  # on_change="reread" planned it again
    index = open_index(p.storage, chain_of(p))
    assert index.lookup(["a"]) == {"a": {"size": 10, "mtime": 2.0}}
    assert index.table().num_rows == 1


def test_a_directory_of_a_future_version_is_refused_naming_the_part(local_spec: StoreSpec) -> None:
    p = local_spec.pipeline(full_checkpoint_interval=1)
    epoch_with(p, 1, ["a"])
    head, *rest = chain_of(p)
    doc = read_json_part(p.storage, head)
    forged = write_json_part(p.storage, head.path, {**doc, "version": 99}, epoch=1)
    with pytest.raises(CorruptCheckpointError, match="version 99") as failure:
        open_index(p.storage, [forged, *rest])
    assert layout.checkpoint_dir(1) in str(failure.value)


@pytest.mark.parametrize(("consumed", "listed", "same"), [
    ({"size": 1, "etag": "x"}, {"size": 1, "etag": "x", "mtime": 5.0}, True),  # recorded before mtime was kept
    ({"size": 1, "etag": "x", "mtime": 1.0}, {"size": 1, "etag": "x", "mtime": 5.0}, True),  # ETag decides
    ({"size": 1, "etag": "x"}, {"size": 1, "etag": "y"}, False),
    ({"size": 1, "mtime": 1.0}, {"size": 1, "mtime": 2.0}, False),
    ({"size": 1, "mtime": "2026-01-01T00:00:00Z"}, {"size": 1, "mtime": 1767225600.0}, True),
    ({"size": 1, "mtime": 1.0}, {"size": 2, "mtime": 1.0}, False),
    (None, {"size": 2, "mtime": 1.0}, True),  # unknown identity never counts as changed
])
def test_a_file_is_the_same_by_size_then_etag_then_mtime(consumed: dict[str, Any] | None,
                                                          listed: dict[str, Any], same: bool) -> None:
    assert fi.same_file(consumed, listed) is same


def test_retention_keeps_the_segments_a_newer_checkpoint_carries_by_reference(
        local_spec: StoreSpec, small_segments: None) -> None:
    p = local_spec.pipeline(full_checkpoint_interval=2)
    for e in range(1, 10):
        epoch_with(p, e, [f"dt={e}/part-{i}" for i in range(4)])
        p.retain(max_retain=1)
    chain = chain_of(p)
    assert min(ref.epoch for ref in chain) < 8  # segments written by checkpoints retention removed
    point = p.restore_point()
    assert point.how == "primary" and not p.checkpoints.verify(9, deep=True)
    assert len(names(p)) == 36
