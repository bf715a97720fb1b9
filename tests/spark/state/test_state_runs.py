"""Keyed state on sorted runs: the executor functions against naive in-memory models.

The executor functions are pure functions over Arrow batches (what the tasks run),
so these tests call them in-process on a real local store, epoch after epoch, each epoch
with settings rebuilt from the chain the previous one committed -- as a restarted
pipeline restores them. Spark itself runs in ``test_stage_runtime.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from airflow_seatunnel_ckpt.core import layout
from airflow_seatunnel_ckpt.core.codec import Codec
from airflow_seatunnel_ckpt.core.models import OperatorState, PartKind, PartRef
from airflow_seatunnel_ckpt.core.state.checkpoint import read_chain, write_arrow_part
from airflow_seatunnel_ckpt.core.storage import open_storage
from airflow_seatunnel_ckpt.spark.state.executor import dedup_keep, merge_partition
from airflow_seatunnel_ckpt.spark.state.reports import PartReport, next_chain
from airflow_seatunnel_ckpt.spark.state.settings import (
    KEY_GROUP_COLUMN,
    Aggregate,
    PartPolicy,
    StateError,
    StateKind,
    StateSettings,
    StoreLocation,
)


class Reports:
    """The report folder's ``add``, collected in-process (what Spark merges on the driver)."""

    def __init__(self) -> None:
        self.reports: list[PartReport] = []

    def add(self, reports: list[PartReport]) -> None:
        self.reports.extend(reports)


def settings_for(root: Path, kind: StateKind, epoch: int, chain: list[PartRef], keys: list[str], *,
                 ttl: int | None = None, block_rows: int = 64, incremental: bool = True) -> StateSettings:
    location = StoreLocation(f"file://{root}", {})
    policy = PartPolicy(incremental, 10, Codec.ZSTD, 3, block_rows=block_rows, fanout=4)
    restored = OperatorState(1, keys, {0: chain} if chain else {}, kind.value)
    return StateSettings("seen", kind, 1, epoch, 1, location, location, policy, restored, tuple(keys),
                         ttl_epochs=ttl)


def batches_of(table: pa.Table) -> list[pa.RecordBatch]:
    with_group = table.append_column(KEY_GROUP_COLUMN, pa.array(np.zeros(table.num_rows, np.int32)))
    return with_group.to_batches(max_chunksize=97)


def dedup_rows(settings: StateSettings, batches: list[pa.RecordBatch], sink: Reports) -> pa.Table:
    """The rows ``dedup_keep`` keeps, as Spark's filter would (the key-group column dropped)."""
    columns = [*settings.key_columns, KEY_GROUP_COLUMN]
    masks = list(dedup_keep(iter(tuple(b.column(c) for c in columns) for b in batches),
                            settings=settings, reports=sink))  # type: ignore[arg-type]
    assert sum(len(m) for m in masks) == sum(b.num_rows for b in batches)
    table = pa.Table.from_batches(batches).drop_columns([KEY_GROUP_COLUMN])
    return table.filter(pa.chunked_array(masks, pa.bool_())) if masks else table


def run_dedup(settings: StateSettings, table: pa.Table) -> tuple[pa.Table, PartReport]:
    sink = Reports()
    out = dedup_rows(settings, batches_of(table), sink)
    assert len(sink.reports) == 1
    return out, sink.reports[0]


def run_merge(settings: StateSettings, partial: pa.Table) -> tuple[pa.Table, PartReport]:
    sink = Reports()
    how = {"total": Aggregate.SUM, "top": Aggregate.MAX}
    out = list(merge_partition(iter(batches_of(partial)), settings=settings, aggregates=how,
                               reports=sink))  # type: ignore[arg-type]
    return pa.Table.from_batches(out), sink.reports[0]


def key_tuples(table: pa.Table, keys: list[str]) -> list[tuple[Any, ...]]:
    return list(zip(*[table.column(k).to_pylist() for k in keys], strict=True))


def epoch_input(rng: np.random.Generator, composite: bool, rows: int = 150, span: int = 2500) -> pa.Table:
    ids = rng.integers(0, span, size=rows)
    columns: dict[str, Any] = {"id": pa.array(ids, pa.int64())}
    if composite:
        columns["region"] = pa.array([f"r{i % 3}" for i in ids])
        columns["id"] = pa.array(ids // 3, pa.int64())
    columns["payload"] = pa.array(rng.random(rows))
    return pa.table(columns)


@pytest.mark.parametrize(("composite", "ttl"), [(False, None), (True, None), (False, 3), (False, 6)])
def test_key_set_dedup_matches_a_naive_set_over_many_epochs_with_compaction(
    tmp_path: Path, composite: bool, ttl: int | None
) -> None:
    rng = np.random.default_rng(12)
    keys = ["region", "id"] if composite else ["id"]
    chain: list[PartRef] = []
    written: dict[tuple[Any, ...], int] = {}  # the model: key -> epoch that last wrote it
    compactions = 0
    for epoch in range(1, 41):
        table = epoch_input(rng, composite)
        settings = settings_for(tmp_path, StateKind.KEY_SET, epoch, chain, keys, ttl=ttl)
        out, report = run_dedup(settings, table)
        expected = []
        for key in key_tuples(table, keys):
            live = key in written and (ttl is None or epoch - written[key] < ttl)
            if not live:
                written[key] = epoch
                expected.append(key)
        assert key_tuples(out, keys) == expected, f"epoch {epoch}"
        compactions += report.merged is not None or report.replaces > 0
        chain = next_chain(chain, report, settings.min_epoch)
        assert len(chain) <= 8, [r.size for r in chain]  # compaction bounds the chain
    assert compactions >= 3 or ttl == 3  # a 3-epoch TTL keeps chains below the fanout
    stored = read_chain(open_storage(f"file://{tmp_path}"), chain, keys)
    live_keys = {k for k, e in written.items() if ttl is None or 40 - e < ttl}
    assert live_keys <= set(key_tuples(stored, keys))
    if ttl is None:
        assert set(key_tuples(stored, keys)) == set(written)
    else:  # runs older than the TTL dropped out of the chain unread
        assert all(ref.epoch >= 40 - ttl + 1 for ref in chain)


def test_key_value_aggregate_matches_a_naive_dict_over_many_epochs(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    keys = ["region", "id"]
    chain: list[PartRef] = []
    model: dict[tuple[Any, ...], list[float]] = {}
    for epoch in range(1, 31):
        raw = epoch_input(rng, composite=True, rows=120, span=900)
        partial = raw.group_by(keys).aggregate([("payload", "sum"), ("payload", "max")])
        partial = partial.rename_columns(["region", "id", "total", "top"]).select(["region", "id", "total", "top"])
        settings = settings_for(tmp_path, StateKind.KEY_VALUE, epoch, chain, keys)
        out, report = run_merge(settings, partial)
        for key, total, top in zip(key_tuples(partial, keys), partial["total"].to_pylist(),
                                   partial["top"].to_pylist(), strict=True):
            old = model.get(key)
            model[key] = [total, top] if old is None else [old[0] + total, max(old[1], top)]
        got = dict(zip(key_tuples(out, keys), zip(out["total"].to_pylist(), out["top"].to_pylist(), strict=True),
                       strict=True))
        assert got.keys() == set(key_tuples(partial, keys))
        for key, (total, top) in got.items():
            assert total == pytest.approx(model[key][0]) and top == model[key][1]
        chain = next_chain(chain, report)
        assert len(chain) <= 8
    stored = read_chain(open_storage(f"file://{tmp_path}"), chain, keys)
    assert stored.num_rows == len(model)
    for key, total in zip(key_tuples(stored, keys), stored["total"].to_pylist(), strict=True):
        assert total == pytest.approx(model[key][0])


def test_an_epoch_of_few_changed_keys_writes_a_run_of_those_keys_only(tmp_path: Path) -> None:
    big = pa.table({"id": pa.array(np.arange(0, 40000, dtype=np.int64))})
    first, report = run_dedup(settings_for(tmp_path, StateKind.KEY_SET, 1, [], ["id"], block_rows=4096), big)
    chain = next_chain([], report)
    small = pa.table({"id": pa.array(np.arange(39900, 40100, dtype=np.int64))})
    out, report = run_dedup(settings_for(tmp_path, StateKind.KEY_SET, 2, chain, ["id"], block_rows=4096), small)
    assert out["id"].to_pylist() == list(range(40000, 40100))
    assert report.part is not None and report.replaces == 0 and report.part.kind == "delta"
    assert report.part.size < 0.05 * chain[0].size  # O(changed keys), not O(state)
    # ... and the lookup read the index, the bloom and the one block holding 39900..39999.
    assert report.read < 0.5 * chain[0].size


def test_ttl_forgets_a_key_after_its_window_and_restores_after_a_restart(tmp_path: Path) -> None:
    keys = ["id"]
    chain: list[PartRef] = []
    accepted = []
    for epoch in range(1, 6):
        settings = settings_for(tmp_path, StateKind.KEY_SET, epoch, chain, keys, ttl=3)
        out, report = run_dedup(settings, pa.table({"id": pa.array([7], pa.int64())}))
        accepted.append(out.num_rows)
        chain = next_chain(chain, report, settings.min_epoch)
    # Written at 1; duplicate at 2 and 3; forgotten at 4 (3 epochs later); duplicate at 5.
    assert accepted == [1, 0, 0, 1, 0]
    assert [ref.epoch for ref in chain] == [4]  # epoch 1's run expired and left the chain


def test_a_chain_in_mains_format_restores_and_is_updated(tmp_path: Path) -> None:
    storage = open_storage(f"file://{tmp_path}")
    full = write_arrow_part(storage, "checkpoint_1/operators/seen/part-0", pa.table({"id": pa.array(range(100))}),
                            epoch=1)
    delta = write_arrow_part(storage, "checkpoint_2/operators/seen/part-0", pa.table({"id": pa.array(range(100, 150))}),
                             epoch=2, delta=True, base_epoch=1)
    chain = [full, delta]
    assert full.index is None and full.to_dict().keys() == {"path", "size", "crc32c", "epoch", "key_group", "kind"}
    settings = settings_for(tmp_path, StateKind.KEY_SET, 3, chain, ["id"])
    out, report = run_dedup(settings, pa.table({"id": pa.array([50, 120, 200, 201], pa.int64())}))
    assert out["id"].to_pylist() == [200, 201]
    chain = next_chain(chain, report)
    assert len(chain) == 1 and chain[0].kind == "full" and chain[0].index is not None  # migrated to a run
    assert sorted(read_chain(storage, chain, ["id"])["id"].to_pylist()) == [*range(150), 200, 201]


def test_key_value_chain_in_mains_format_keeps_its_totals(tmp_path: Path) -> None:
    storage = open_storage(f"file://{tmp_path}")
    old = pa.table({"k": ["a", "b"], "total": [1.0, 2.0], "top": [1.0, 2.0]})
    chain = [write_arrow_part(storage, "checkpoint_1/operators/seen/part-0", old, epoch=1)]
    partial = pa.table({"k": ["b", "c"], "total": [10.0, 5.0], "top": [0.5, 5.0]})
    out, report = run_merge(settings_for(tmp_path, StateKind.KEY_VALUE, 2, chain, ["k"]), partial)
    assert out.to_pydict() == {"k": ["b", "c"], "total": [12.0, 5.0], "top": [2.0, 5.0]}
    stored = read_chain(storage, next_chain(chain, report), ["k"]).sort_by("k")
    assert stored.to_pydict() == {"k": ["a", "b", "c"], "total": [1.0, 12.0, 5.0], "top": [1.0, 2.0, 5.0]}


def test_not_incremental_writes_every_key_group_in_full(tmp_path: Path) -> None:
    chain: list[PartRef] = []
    for epoch, ids in enumerate(([1, 2], [3], [4]), start=1):
        settings = settings_for(tmp_path, StateKind.KEY_SET, epoch, chain, ["id"], incremental=False)
        _, report = run_dedup(settings, pa.table({"id": pa.array(ids, pa.int64())}))
        chain = next_chain(chain, report)
        assert len(chain) == 1 and chain[0].kind == "full"
    assert sorted(pc.unique(read_chain(open_storage(f"file://{tmp_path}"), chain, ["id"])["id"]).to_pylist()) == [
        1, 2, 3, 4]


def run_key_groups(root: Path, epoch: int, chains: dict[int, list[PartRef]], ids: np.ndarray,
                   groups: int) -> tuple[dict[int, list[PartRef]], int, int]:
    """One epoch of de-duplication over every key group, as the tasks of one update run it;
    also the bytes its tasks wrote (every file of the epoch, reported or not) and how many
    key groups merged restored runs only (not with the epoch's changes)."""
    location = StoreLocation(f"file://{root}", {})
    # No merge floor: this state (~1 MB) is small enough for the 64 KiB a key group may
    # always merge to matter, and the budget is what is under test.
    policy = PartPolicy(True, 10, Codec.ZSTD, 3, block_rows=4096, fanout=4, compaction_floor=0)
    restored = OperatorState(groups, ["id"], chains, StateKind.KEY_SET.value)
    settings = StateSettings("seen", StateKind.KEY_SET, groups, epoch, 1, location, location, policy, restored,
                             ("id",))
    new_chains, windows = {}, 0
    for g in range(groups):
        mine = ids[ids % groups == g]
        table = pa.table({"id": pa.array(mine, pa.int64()),
                          KEY_GROUP_COLUMN: pa.array(np.full(len(mine), g, np.int32))})
        sink = Reports()
        out = dedup_rows(settings, table.to_batches(), sink)
        assert out.num_rows == len(mine)  # every key is new
        windows += sink.reports[0].merged is not None
        new_chains[g] = next_chain(list(chains.get(g, [])), sink.reports[0])
    written = sum(f.stat().st_size for f in (root / layout.checkpoint_dir(epoch)).rglob("*") if f.is_file())
    return new_chains, written, windows


def test_every_epoch_writes_o_changed_keys_and_runs_stay_bounded(tmp_path: Path) -> None:
    """5% new keys per epoch over 36 epochs: no epoch -- compaction epochs included --
    writes more than 0.15 of the state's bytes, and lookups touch a bounded number of runs."""
    groups, keys = 8, 160_000
    rng = np.random.default_rng(4)
    chains, _, _ = run_key_groups(tmp_path, 1, {}, rng.permutation(np.arange(keys, dtype=np.int64)), groups)
    ratios, most_runs, windows = [], 0, 0
    for epoch in range(2, 38):
        state = sum(ref.size for chain in chains.values() for ref in chain)
        new = np.arange(keys, keys + keys // 20, dtype=np.int64)
        keys += len(new)
        chains, written, merged = run_key_groups(tmp_path, epoch, chains, rng.permutation(new), groups)
        windows += merged
        ratios.append(written / state)
        most_runs = max(most_runs, *(len(c) for c in chains.values()))
    assert max(ratios) <= 0.15, [round(r, 3) for r in ratios]
    assert most_runs <= 2 * 4 + 4  # soft bound (2 x fanout) + the runs added between turns
    assert windows >= 1  # some merges were of restored runs only, their output placed within the chain
    storage = open_storage(f"file://{tmp_path}")
    for g in range(groups):
        stored = read_chain(storage, chains[g], ["id"])
        assert np.array_equal(np.sort(stored["id"].to_numpy()), np.arange(g, keys, groups))


def test_a_compaction_report_outside_the_restored_chain_is_refused() -> None:
    ref = PartRef("checkpoint_3/operators/seen/part-0-1-ab", 10, 0, 3, 0, PartKind.DELTA, index=1)
    report = PartReport(0, 1, 1, part=None, merged=ref, merge_start=1, merge_end=4)
    with pytest.raises(StateError, match="key group 0 reported a compaction of runs 1..4, but its restored chain "
                                         "holds 2 runs"):
        next_chain([ref, ref], report)
