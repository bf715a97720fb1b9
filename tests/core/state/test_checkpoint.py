"""Epoch checkpoints: layout, exclusive completion, verification, incremental restore."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_seatunnel_ckpt.core import CheckpointManager, CheckpointMetadata, OperatorState, layout
from airflow_seatunnel_ckpt.core.errors import (
    CorruptCheckpointError,
    InvalidEpochError,
    InvalidNameError,
)
from airflow_seatunnel_ckpt.core.models import PartRef
from airflow_seatunnel_ckpt.core.state.checkpoint import (
    TOMBSTONE,
    apply_delta,
    needs_full,
    read_arrow_part,
    read_chain,
    read_json_part,
    write_arrow_part,
    write_json_part,
)
from airflow_seatunnel_ckpt.core.storage import Storage, open_storage
from tests.core.conftest import StoreSpec
from tests.core.epochs import (
    KEY_GROUPS,
    Participant,
    flip_byte,
    read_group,
    restored_state,
    run_epoch,
    state_table,
    write_keyed_state,
)

# -- layout -------------------------------------------------------------------------------


def test_paths_follow_the_seatunnel_layout() -> None:
    assert layout.checkpoint_dir(7) == "checkpoint_7"
    assert layout.metadata_path(7) == "checkpoint_7/_metadata"
    assert layout.part_path(7, "operators", "seen", 3, 2) == "checkpoint_7/operators/seen/part-3-2"
    assert layout.part_path(7, "sources", "orders", 0, 1) == "checkpoint_7/sources/orders/part-0-1"
    assert layout.source_meta_path(7, "orders") == "checkpoint_7/sources/orders/_meta"
    assert layout.sink_marker_path(7, "out") == "checkpoint_7/sinks/out/_prepared"
    assert layout.txlog_dir(7) == "_txlog/epoch-000000000007"
    assert layout.record_path(7, "decision") == "_txlog/epoch-000000000007/decision"
    assert layout.staging_dir(7, 2, "out") == "_staging/epoch=7/attempt=2/out"
    assert layout.published_dir(7) == "epoch=7"


def test_txlog_directories_list_in_epoch_order() -> None:
    names = [layout.txlog_dir(e).split("/")[1] for e in (1, 9, 10, 100, 99999)]
    assert sorted(names) == names
    assert [layout.parse_txlog_dir(n) for n in names] == [1, 9, 10, 100, 99999]


def test_directory_names_parse_back_to_epochs_and_foreign_names_do_not() -> None:
    assert layout.parse_checkpoint_dir("checkpoint_12") == 12
    assert layout.parse_staging_epoch("epoch=12") == 12
    for foreign in (
        "checkpoint_",
        "checkpoint_x",
        "checkpoint_1.tmp",
        "_txlog",
        "checkpoint_0",
        "checkpoint_007",
    ):
        assert layout.parse_checkpoint_dir(foreign) is None, foreign
    for foreign in ("epoch=", "epoch=a", "epoch=0", "attempt=1"):
        assert layout.parse_staging_epoch(foreign) is None, foreign


def test_part_paths_refuse_unsafe_names_and_numbers() -> None:
    with pytest.raises(InvalidNameError):
        layout.part_path(1, "operators", "../x", 0, 1)
    with pytest.raises(ValueError):
        layout.part_path(1, "sinks", "x", 0, 1)
    with pytest.raises(ValueError):
        layout.part_path(1, "operators", "x", -1, 1)
    with pytest.raises(InvalidEpochError):
        layout.part_path(0, "operators", "x", 0, 1)
    with pytest.raises(InvalidEpochError):
        layout.part_path(1, "operators", "x", 0, 0)


# -- parts --------------------------------------------------------------------------------


def test_parts_record_their_size_and_checksum_and_read_back(fast_spec: StoreSpec) -> None:
    store = fast_spec.storage()
    table = state_table({1: 10, 2: 20})
    ref = write_arrow_part(store, "checkpoint_1/operators/seen/part-0-1", table, epoch=1, key_group=0)
    assert ref.size == store.size(ref.path)
    assert (ref.epoch, ref.key_group, ref.kind) == (1, 0, "full")
    assert read_arrow_part(store, ref).equals(table)

    jref = write_json_part(store, "checkpoint_1/sources/in/part-0-1", {"entries": [1, 2]}, epoch=1)
    assert read_json_part(store, jref) == {"entries": [1, 2]}
    with pytest.raises(CorruptCheckpointError, match="expected an Arrow part"):
        read_arrow_part(store, jref)


# -- checkpoints --------------------------------------------------------------------------


def make_checkpoint(store: Storage, epoch: int, state: dict[int, int], groups: int = 2) -> CheckpointMetadata:
    chains = {}
    for g in range(groups):
        part = {k: v for k, v in state.items() if k % groups == g}
        chains[g] = [
            write_arrow_part(
                store,
                layout.part_path(epoch, "operators", "seen", g, 1),
                state_table(part),
                epoch=epoch,
                key_group=g,
            )
        ]
    return CheckpointMetadata(
        epoch=epoch,
        created_at=1.0,
        run_id=f"run-{epoch}",
        participants={"ingest": 1},
        base_epoch=None,
        operators={"seen": OperatorState(groups, ["k"], chains)},
        sources={},
        sinks={},
    )


def test_complete_writes_metadata_once_and_a_second_writer_gets_the_first(
    fast_spec: StoreSpec,
) -> None:
    store = fast_spec.storage()
    manager = CheckpointManager(store)
    first = make_checkpoint(store, 1, {1: 1})
    assert not manager.has_metadata(1)

    assert manager.complete(first) == first
    other = CheckpointMetadata(1, 2.0, "someone-else", {"ingest": 2}, None, {}, {}, {})
    assert manager.complete(other) == first
    assert manager.read_metadata(1) == first


def test_concurrent_completions_agree_on_one_metadata(fast_spec: StoreSpec) -> None:
    store = fast_spec.storage()
    manager = CheckpointManager(store)
    candidates = [CheckpointMetadata(1, float(i), f"run-{i}", {"ingest": i + 1}, None, {}, {}, {}) for i in range(6)]
    results: list[CheckpointMetadata] = []
    barrier = threading.Barrier(len(candidates))

    def complete(meta: CheckpointMetadata) -> None:
        barrier.wait()
        results.append(manager.complete(meta))

    threads = [threading.Thread(target=complete, args=(m,)) for m in candidates]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == len(candidates)
    assert len({r.run_id for r in results}) == 1
    assert manager.read_metadata(1) == results[0]


def test_metadata_lists_every_part_with_size_and_checksum(fast_spec: StoreSpec) -> None:
    store = fast_spec.storage()
    manager = CheckpointManager(store)
    meta = manager.complete(make_checkpoint(store, 3, {1: 1, 2: 2, 3: 3}))
    stored = {f"checkpoint_3/{f.path}": f.size for f in store.walk("checkpoint_3")}
    assert {p.path: p.size for p in meta.parts()} == {k: v for k, v in stored.items() if not k.endswith("_metadata")}
    assert all(p.crc32c for p in meta.parts())
    assert manager.verify(3) == []
    assert manager.epochs() == [3]


@pytest.mark.parametrize(
    ("damage", "expect", "found_shallow"),
    [
        (lambda s, p: s.delete(p), "missing", True),
        (lambda s, p: s.write_atomic(p, s.read(p)[:-3]), "size is", True),
        (lambda s, p: flip_byte(s, p, -5), "checksum", False),
    ],
    ids=["missing", "short", "flipped"],
)
def test_verify_names_a_missing_short_or_flipped_part(
    fast_spec: StoreSpec, damage: Callable[[Storage, str], None], expect: str, found_shallow: bool
) -> None:
    store = fast_spec.storage()
    manager = CheckpointManager(store)
    meta = manager.complete(make_checkpoint(store, 1, {1: 1, 2: 2}))
    victim = meta.operators["seen"].chains[1][0].path

    damage(store, victim)

    problems = manager.verify(1, deep=True)
    assert len(problems) == 1
    assert problems[0].path == store.url_of(victim)
    assert expect in problems[0].what
    assert bool(manager.verify(1, deep=False)) is found_shallow


def test_verify_reports_missing_or_damaged_metadata(fast_spec: StoreSpec) -> None:
    store = fast_spec.storage()
    manager = CheckpointManager(store)
    store.write_atomic("checkpoint_1/operators/seen/part-0-1", b"orphan part")
    assert "_metadata is missing" in manager.verify(1)[0].what
    manager.complete(make_checkpoint(store, 2, {1: 1}))
    flip_byte(store, layout.metadata_path(2), 40)
    problems = manager.verify(2)
    assert problems[0].path == store.url_of(layout.metadata_path(2))


def test_metadata_references_every_marker_so_verify_names_a_damaged_source_meta(fast_spec: StoreSpec) -> None:
    p = fast_spec.pipeline()
    epoch = run_epoch(p, "run-1", Participant(sources={"orders": {"files": ["a"]}}))
    meta = p.checkpoints.read_metadata(epoch)
    marker = layout.source_meta_path(epoch, "orders")
    assert meta.source_metas["orders"].path == marker
    assert {r.path for r in meta.parts()} >= {marker, layout.sink_marker_path(epoch, "orders")}
    assert p.checkpoints.verify(epoch) == []
    flip_byte(p.storage, marker, 20)
    assert [pr.path for pr in p.checkpoints.verify(epoch)] == [p.storage.url_of(marker)]
    p.storage.delete(marker)
    assert [pr.path for pr in p.checkpoints.verify(epoch, deep=False)] == [p.storage.url_of(marker)]


def test_metadata_of_another_epoch_is_refused(fast_spec: StoreSpec) -> None:
    store = fast_spec.storage()
    manager = CheckpointManager(store)
    manager.complete(make_checkpoint(store, 1, {1: 1}))
    store.write_atomic(layout.metadata_path(2), store.read(layout.metadata_path(1)))
    with pytest.raises(CorruptCheckpointError, match="for epoch 1, expected 2"):
        manager.read_metadata(2)


def test_verify_checks_sizes_shallow_and_checksums_deep(
    fast_spec: StoreSpec,
) -> None:
    store = fast_spec.storage()
    manager = CheckpointManager(store)
    metas = {e: manager.complete(make_checkpoint(store, e, {e: e})) for e in (1, 2, 3, 4)}
    assert [e for e in (1, 2, 3, 4) if not manager.verify(e, deep=True)] == [1, 2, 3, 4]

    store.delete(metas[4].parts()[0].path)
    flip_byte(store, metas[3].parts()[0].path, -5)
    assert manager.verify(4, deep=False) and manager.verify(4, deep=True), "a missing part always shows"
    assert manager.verify(3, deep=False) == [], "shallow check: sizes only"
    assert "checksum" in str(manager.verify(3, deep=True))
    store.delete(layout.metadata_path(2))
    assert "_metadata is missing" in str(manager.verify(2, deep=False))
    assert manager.verify(1, deep=True) == []


def test_delete_keeps_the_parts_a_newer_checkpoint_references(fast_spec: StoreSpec) -> None:
    store = fast_spec.storage()
    manager = CheckpointManager(store)
    meta = manager.complete(make_checkpoint(store, 1, {1: 1, 2: 2}))
    keep = meta.operators["seen"].chains[0][0].path
    removed = manager.delete(1, keep=[keep])
    assert keep not in removed
    assert [f"checkpoint_1/{f.path}" for f in store.walk("checkpoint_1")] == [keep]
    manager.delete(1)
    assert store.walk("checkpoint_1") == []


# -- incremental state --------------------------------------------------------------------


def test_apply_delta_upserts_and_removes_tombstoned_keys() -> None:
    base = state_table({1: 10, 2: 20, 3: 30})
    delta = pa.table(
        {
            "k": pa.array([2, 3, 4], pa.int64()),
            "v": pa.array([21, None, 40], pa.int64()),
            TOMBSTONE: [False, True, False],
        }
    )
    out = apply_delta(base, delta, ["k"])
    assert dict(zip(*out.to_pydict().values(), strict=True)) == {1: 10, 2: 21, 4: 40}
    assert out.column_names == ["k", "v"]


def test_apply_delta_with_composite_keys_keeps_keys_that_only_look_alike() -> None:
    base = pa.table({"a": ["x", "x\x1fy", None, "n"], "b": ["y\x1fz", "z", "1", None], "v": [1, 2, 3, 4]})
    delta = pa.table({"a": ["x", None], "b": ["y\x1fz", "1"], "v": [10, 30]})
    out = apply_delta(base, delta, ["a", "b"])
    rows = sorted(zip(*out.select(["a", "b", "v"]).to_pydict().values(), strict=True), key=repr)
    assert rows == sorted([("x", "y\x1fz", 10), ("x\x1fy", "z", 2), (None, "1", 30), ("n", None, 4)], key=repr)


def test_a_chain_must_start_with_a_full_part(fast_spec: StoreSpec) -> None:
    store = fast_spec.storage()
    ref = write_arrow_part(store, "checkpoint_2/operators/seen/part-0-1", state_table({1: 1}), epoch=2, delta=True)
    with pytest.raises(CorruptCheckpointError, match="one full part followed by deltas"):
        read_chain(store, [ref], ["k"])


def test_needs_full_bounds_the_chain_length() -> None:
    ref = PartRef("p", 1, 1, 1)
    assert needs_full([], True, 5)
    assert not needs_full([ref] * 4, True, 5)
    assert needs_full([ref] * 5, True, 5)
    assert needs_full([ref], False, 5)
    assert needs_full([ref], True, 1)


operations = st.lists(
    st.dictionaries(
        st.integers(min_value=0, max_value=40),
        st.one_of(st.none(), st.integers(min_value=-1000, max_value=1000)),
        max_size=12,
    ),
    min_size=1,
    max_size=12,
)


def fresh_memory_store() -> Storage:
    return open_storage(f"memory://incremental-{uuid.uuid4().hex}")


@settings(max_examples=60, deadline=None)
@given(epochs=operations, interval=st.integers(min_value=1, max_value=5))
def test_incremental_restore_equals_full_restore_after_any_upserts_and_deletes(
    epochs: list[dict[int, int | None]], interval: int
) -> None:
    store = fresh_memory_store()
    expected: dict[int, int] = {}
    incremental: OperatorState | None = None
    full: OperatorState | None = None
    for epoch, changes in enumerate(epochs, start=1):
        for key, value in changes.items():
            if value is None:
                expected.pop(key, None)
            else:
                expected[key] = value
        incremental = write_keyed_state(store, epoch, 1, incremental, store, changes, interval=interval)
        full = write_keyed_state(store, epoch, 2, full, store, changes, incremental=False)

        assert incremental is not None and full is not None
        for group, chain in incremental.chains.items():
            assert 1 <= len(chain) <= interval, f"chain of key group {group} is {len(chain)} long"
            assert chain[0].kind == "full" and all(p.kind == "delta" for p in chain[1:])
        restored_incremental: dict[int, int] = {}
        restored_full: dict[int, int] = {}
        for chain in incremental.chains.values():
            restored_incremental.update(read_group(store, chain))
        for chain in full.chains.values():
            assert len(chain) == 1
            restored_full.update(read_group(store, chain))
        assert restored_incremental == restored_full == expected


def test_chains_restart_with_a_full_part_every_interval() -> None:
    store = fresh_memory_store()
    state: OperatorState | None = None
    kinds = []
    for epoch in range(1, 11):
        state = write_keyed_state(store, epoch, 1, state, store, {0: epoch}, interval=3)
        kinds.append(state.chains[0][-1].kind)
    assert kinds == ["full", "delta", "delta"] * 3 + ["full"]


def test_an_incremental_pipeline_restores_the_same_state_as_a_full_one(
    local_spec: StoreSpec,
) -> None:
    incremental = local_spec.pipeline("inc", full_checkpoint_interval=4)
    full = local_spec.pipeline("full", incremental=False)
    history = [{1: 1, 2: 2, 3: 3}, {2: 20}, {3: None, 5: 5}, {}, {1: 100, 6: 6}, {5: None}, {7: 7}]
    expected: dict[int, int] = {}
    for i, changes in enumerate(history):
        for pipeline in (incremental, full):
            run_epoch(pipeline, f"run-{i}", Participant(sinks={}, changes=changes))
        expected = {
            **{k: v for k, v in expected.items() if changes.get(k, 0) is not None},
            **{k: v for k, v in changes.items() if v is not None},
        }
        point_inc, point_full = incremental.restore_point(), full.restore_point()
        assert point_inc.how == point_full.how == "primary"
        assert restored_state(point_inc) == restored_state(point_full) == expected
    chains = incremental.restore_point().operators["seen"].chains
    assert any(len(chain) > 1 for chain in chains.values()), "the incremental pipeline wrote deltas"
    assert all(len(chain) <= 4 for chain in chains.values())
    assert set(chains) <= set(range(KEY_GROUPS))
