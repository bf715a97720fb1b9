"""Sorted runs: bounded lookups (counted ranged reads), compaction plan, damage detection."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from airflow_seatunnel_ckpt.core.errors import CorruptCheckpointError
from airflow_seatunnel_ckpt.core.models import PartKind, PartRef
from airflow_seatunnel_ckpt.core.state import runs
from airflow_seatunnel_ckpt.core.state.checkpoint import read_chain
from airflow_seatunnel_ckpt.core.state.run_chain import (
    compaction_cap,
    lookup,
    merge_sorted,
    merged_schema,
    plan_compaction,
)
from airflow_seatunnel_ckpt.core.state.runs import RunReader, sort_keys, write_run
from airflow_seatunnel_ckpt.core.storage.local import LocalStorage


class CountingStorage(LocalStorage):
    """A real local store that records each ranged read (what a lookup fetched)."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.ranges: list[tuple[int, int]] = []

    def read_range(self, path: str, start: int, end: int) -> bytes:
        self.ranges.append((start, end))
        return super().read_range(path, start, end)


def random_keys(n: int, seed: int = 1) -> pa.Array:
    rng = np.random.default_rng(seed)
    return pa.array([f"user-{v:016x}" for v in rng.integers(0, 2**62, size=n)])


def written_run(storage: LocalStorage, keys: pa.Array, block_rows: int = 1000, **options: Any) -> PartRef:
    table = pa.table({"k": keys, "v": pa.array(np.arange(len(keys)))})
    table = table.take(pc.sort_indices(sort_keys(table, ["k"])))
    return write_run(storage, "checkpoint_1/operators/s/part-0", [table], ["k"], table.schema, epoch=1,
                     block_rows=block_rows, **options)


def block_reads(storage: CountingStorage, reader: RunReader) -> int:
    """Ranged reads that fetched a data block (not the header, index or bloom filters)."""
    starts = set(reader.index.column("offset").to_pylist())
    return sum(1 for start, _ in storage.ranges if start in starts)


def test_a_lookup_of_keys_in_a_few_blocks_reads_only_those_blocks(tmp_path: Path) -> None:
    storage = CountingStorage(f"file://{tmp_path}")
    keys = random_keys(100_000)
    ref = written_run(storage, keys)
    wanted = keys.take(pc.sort_indices(keys)).slice(50_000, 20)  # 20 neighbouring keys: one or two blocks
    positions, rows, read = lookup(storage, [ref], ["k"], wanted)
    assert sorted(rows.column("k").to_pylist()) == wanted.to_pylist() and len(positions) == 20
    reader = RunReader(storage, ref, ["k"])
    assert 1 <= block_reads(storage, reader) <= 2
    assert read < ref.size / 20  # 2 ranged reads of header and index, 1-2 filters and blocks


def test_a_lookup_of_new_keys_reads_no_blocks_beyond_bloom_false_positives(tmp_path: Path) -> None:
    storage = CountingStorage(f"file://{tmp_path}")
    ref = written_run(storage, random_keys(100_000))
    fresh = random_keys(5_000, seed=99)  # none of them in the run
    positions, rows, read = lookup(storage, [ref], ["k"], fresh)
    assert len(positions) == 0 and rows is None
    reader = RunReader(storage, ref, ["k"])
    assert block_reads(storage, reader) <= 5_000 * 0.03  # ~1% false positives, never a block per key
    assert read < ref.size * 0.4  # filters (10 bits a key) + index, not the blocks


def test_runs_find_their_keys_with_under_two_percent_false_positives(tmp_path: Path) -> None:
    storage = CountingStorage(f"file://{tmp_path}")
    keys = random_keys(50_000)
    ref = written_run(storage, keys)
    present = keys.slice(0, 3_000)
    positions, rows, _ = lookup(storage, [ref], ["k"], present)
    assert len(positions) == 3_000
    reader = RunReader(storage, ref, ["k"])
    absent = random_keys(20_000, seed=98)
    blocks = reader.locate(absent)
    assert (blocks >= 0).mean() < 0.015  # ~0.9% false positives


def test_a_run_of_another_bloom_layout_is_refused_naming_the_file(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    storage = CountingStorage(f"file://{tmp_path}")
    keys = random_keys(2_000)
    monkeypatch.setattr(runs, "BLOOM_LAYOUT", 3)
    ref = written_run(storage, keys)
    monkeypatch.undo()
    with pytest.raises(CorruptCheckpointError, match="part-0: unknown bloom filter layout 3"):
        lookup(storage, [ref], ["k"], keys.slice(0, 10))


def test_a_bloom_filter_of_a_wrong_size_is_refused_naming_the_file(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    storage = CountingStorage(f"file://{tmp_path}")
    keys = random_keys(2_000)
    real_add = runs.Bloom.add

    def add_then_cut(self: runs.Bloom, hashes: np.ndarray) -> None:  # a filter of 7 bytes too few
        real_add(self, hashes)
        self.bits = self.bits[:-7]

    monkeypatch.setattr(runs.Bloom, "add", add_then_cut)
    ref = written_run(storage, keys)
    monkeypatch.undo()
    with pytest.raises(CorruptCheckpointError, match="part-0: bloom filter of block .* is damaged"):
        lookup(storage, [ref], ["k"], keys.slice(0, 10))


def test_a_key_found_in_a_newer_run_is_not_looked_up_in_older_ones(tmp_path: Path) -> None:
    storage = CountingStorage(f"file://{tmp_path}")
    old = written_run(storage, random_keys(10_000))
    new_keys = random_keys(10_000, seed=5)
    table = pa.table({"k": new_keys, "v": pa.array(np.full(10_000, -1))})
    table = table.take(pc.sort_indices(sort_keys(table, ["k"])))
    new = write_run(storage, "checkpoint_2/operators/s/part-0", [table], ["k"], table.schema, epoch=2,
                    delta=True, base_epoch=1, block_rows=1000)
    storage.ranges.clear()
    _, rows, _ = lookup(storage, [old, new], ["k"], new_keys.slice(0, 5))
    assert rows.column("v").to_pylist() == [-1] * 5
    old_reader = RunReader(CountingStorage(f"file://{tmp_path}"), old, ["k"])
    old_size_reads = [r for r in storage.ranges if r[1] == old.size]
    assert not old_size_reads, "the older run's index was read although every key was found"
    assert read_chain(storage, [old, new], ["k"]).num_rows == 20_000 and old_reader.rows == 10_000


@pytest.mark.parametrize("groups", [1, 8, 64])
def test_compaction_plan_keeps_every_epoch_within_budget_and_runs_bounded(groups: int) -> None:
    """300 epochs, each adding 5% of the state to every key group: merges stay within the
    epoch's budget in every epoch and chains stay short, for any number of key groups."""
    chains: dict[int, list[int]] = {g: [1000] for g in range(groups)}
    most = 0
    for epoch in range(2, 302):
        state = sum(sum(c) for c in chains.values())
        refs = {g: [PartRef(f"p{i}", s, 0, 1, g) for i, s in enumerate(c)] for g, c in chains.items()}
        merged = 0
        for g, sizes in chains.items():
            window = plan_compaction(sizes, compaction_cap(refs, groups, g, epoch, floor=0))
            if window is not None:
                start, end = window
                merged += sum(sizes[start:end])
                sizes[start:end] = [sum(sizes[start:end])]
            sizes.append(max(1, state // 20 // groups))
            most = max(most, len(sizes))
        assert merged <= 0.08 * state + groups, epoch
    # With fewer key groups than turns a key group's runs are at most ~8% of the state
    # each (what one epoch may merge): about 1 / 0.08 of them, plus the newest tiers.
    assert most <= (16 if groups >= 4 else 24)


def test_compaction_plan_picks_a_window_within_the_cap() -> None:
    assert plan_compaction([1000, 10, 10, 10, 10], cap=100) == (1, 5)  # the tier of similar runs
    assert plan_compaction([1000, 10, 10, 10, 10], cap=None) is None  # not this key group's turn
    assert plan_compaction([1000, 10, 10, 10, 10], cap=30) is None  # no tier fits, chain short
    # A tier anywhere in the chain, not only the newest runs; the big run in between stays.
    assert plan_compaction([10, 10, 10, 10, 500, 20], cap=100) == (0, 4)
    # A long chain merges its cheapest neighbours when no tier fits the cap.
    assert plan_compaction([500, 40, 400, 30, 300, 20, 200, 10, 100], cap=250) == (5, 8)
    assert plan_compaction([1] * 70, cap=None) == (0, 70)  # the safety bound


def test_key_groups_take_turns_and_share_the_budget() -> None:
    chains = {g: [PartRef("p", 1000, 0, 1, g)] for g in range(8)}
    caps = [compaction_cap(chains, 8, g, epoch=5, floor=0) for g in range(8)]
    assert [c is not None for c in caps] == [(5 + g) % 4 == 0 for g in range(8)]
    assert sum(c for c in caps if c is not None) == pytest.approx(0.08 * 8000, abs=2)
    assert compaction_cap(chains, 8, 3, epoch=5) == 64 * 1024  # the floor for tiny states


def flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x40
    path.write_bytes(bytes(data))


def test_a_damaged_block_is_refused_naming_the_file(tmp_path: Path) -> None:
    storage = LocalStorage(f"file://{tmp_path}")
    keys = random_keys(5_000)
    ref = written_run(storage, keys)
    reader = RunReader(storage, ref, ["k"])
    second = int(reader.index.column("offset")[1].as_py())
    flip_byte(tmp_path / ref.path, second + 40)
    wanted = sort_keys(reader.block(0), ["k"]).slice(0, 3)  # block 0 is intact
    assert len(lookup(storage, [ref], ["k"], wanted)[0]) == 3
    with pytest.raises(CorruptCheckpointError, match=r"part-0.*checksum mismatch in a block"):
        reader.block(1)
    with pytest.raises(CorruptCheckpointError, match="part-0"):
        read_chain(storage, [ref], ["k"])


def test_a_damaged_index_is_refused_naming_the_file(tmp_path: Path) -> None:
    storage = LocalStorage(f"file://{tmp_path}")
    ref = written_run(storage, random_keys(5_000))
    flip_byte(tmp_path / ref.path, ref.index + 20)
    with pytest.raises(CorruptCheckpointError, match=r"part-0.*checksum mismatch"):
        lookup(storage, [ref], ["k"], random_keys(3))


def test_an_index_offset_outside_the_file_is_refused(tmp_path: Path) -> None:
    storage = LocalStorage(f"file://{tmp_path}")
    ref = written_run(storage, random_keys(100))
    bad = PartRef(ref.path, ref.size, ref.crc32c, ref.epoch, 0, PartKind.FULL, index=ref.size + 5)
    with pytest.raises(CorruptCheckpointError, match="index offset .* outside the file"):
        RunReader(storage, bad, ["k"])


def test_a_truncated_run_is_refused(tmp_path: Path) -> None:
    storage = LocalStorage(f"file://{tmp_path}")
    ref = written_run(storage, random_keys(3_000))
    path = tmp_path / ref.path
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(CorruptCheckpointError, match="truncated"):
        RunReader(storage, ref, ["k"])


def test_part_ref_round_trips_its_index_and_a_part_without_one_stores_none() -> None:
    ref = PartRef("p", 10, 1, 2, 3, PartKind.DELTA, index=7)
    assert PartRef.from_dict(ref.to_dict()) == ref
    whole = PartRef("p", 10, 1, 2, 3, PartKind.DELTA)
    assert "index" not in whole.to_dict() and PartRef.from_dict(whole.to_dict()).index is None


def test_runs_are_looked_up_by_ranged_reads_on_every_backend(store_spec: Any) -> None:
    storage = store_spec.storage()
    keys = random_keys(20_000)
    ref = written_run(storage, keys)
    wanted = pa.concat_arrays([keys.slice(0, 3), random_keys(3, seed=42)])
    positions, rows, read = lookup(storage, [ref], ["k"], wanted)
    assert sorted(positions.tolist()) == [0, 1, 2] and rows.num_rows == 3
    assert read < ref.size / 2
    assert read_chain(storage, [ref], ["k"]).num_rows == 20_000


def test_a_repeated_lookup_in_the_same_process_is_served_from_the_block_cache(tmp_path: Path) -> None:
    storage = CountingStorage(f"file://{tmp_path}")
    keys = random_keys(20_000)
    ref = written_run(storage, keys)
    wanted = pa.concat_arrays([keys.slice(0, 50), random_keys(500, seed=8)])
    first = lookup(storage, [ref], ["k"], wanted)
    storage.ranges.clear()
    again = lookup(storage, [ref], ["k"], wanted)
    assert storage.ranges == [] and again[2] == 0  # index, filters and blocks: all decoded before
    assert sorted(again[0].tolist()) == sorted(first[0].tolist()) == list(range(50))


def test_a_merge_drops_expired_rows_always_and_tombstones_only_from_the_first_run() -> None:
    older = pa.table({"k": pa.array([1, 2, 3], pa.int64()), "__epoch": pa.array([1, 5, 5], pa.int64()),
                      "__deleted": pa.array([False, False, False])})
    newer = pa.table({"k": pa.array([2, 4], pa.int64()), "__epoch": pa.array([6, 6], pa.int64()),
                      "__deleted": pa.array([True, False])})
    schema = merged_schema([older.schema, newer.schema], drop_tombstones=False)

    def merged(drop_dead: bool) -> dict[str, list[Any]]:
        out = merge_sorted([iter([older]), iter([newer])], ["k"], schema, epochs=[5, 6], drop_dead=drop_dead,
                           min_epoch=3)
        return pa.concat_tables(list(out)).to_pydict()

    # Key 1 expired (epoch 1 < 3): dropped by any merge. Key 2's tombstone stays unless
    # nothing older can hold key 2.
    assert merged(False) == {"k": [2, 3, 4], "__epoch": [6, 5, 6], "__deleted": [True, False, False]}
    assert merged(True)["k"] == [3, 4]


# -- the format's hashing and filter bits, pinned -------------------------------------------
# Persisted in every run's filters: a change to any of them would make existing runs answer
# "absent" for keys they hold. The values were computed by this numpy code and, before it
# was removed, by the compiled loops too (they agreed bit for bit).

def test_key_hashes_are_the_formats_definition() -> None:
    from airflow_seatunnel_ckpt.core.state.parts import key_array

    ints = runs.key_hashes(pa.array([0, 1, -1, 2**63 - 1, None, 42], pa.int64()))
    strings = runs.key_hashes(pa.array(["", "a", None, "héllo wörld", "x" * 300], pa.string()))
    composite = runs.key_hashes(key_array(pa.table({"a": pa.array([1, None, 3], pa.int64()),
                                                     "b": pa.array(["x", "y", None])}), ["a", "b"]))
    assert [hex(h) for h in ints.tolist()] == [
        "0xe220a8397b1dcdaf", "0x910a2dec89025cc1", "0xe4d971771b652c20", "0x2a67d7552e039ea7",
        "0xe220a8397b1dcdaf", "0xbdd732262feb6e95"]  # a null key hashes as 0
    assert [hex(h) for h in strings.tolist()] == [
        "0xc3817c016ba4ff30", "0xc0fc99fea7ab959c", "0xc3817c016ba4ff30", "0xe42a62774d95af40",
        "0x1a8f77bdc2f11d08"]  # a null key hashes as ""
    assert [hex(h) for h in composite.tolist()] == ["0x3d56eac971c3fa14", "0x3a3e94fe2b6a4e70", "0xe07afb6bffdd18b0"]


@pytest.mark.parametrize("keys, expected", [
    (pa.array([dt.date(1970, 1, 1), dt.date(1969, 12, 31), None, dt.date(2026, 11, 25)], pa.date32()),
     ["0xe220a8397b1dcdaf", "0xe4d971771b652c20", "0xe220a8397b1dcdaf", "0xb85a2112c7fd670c"]),
    (pa.array([dt.datetime(2026, 1, 1, 12, 30), None], pa.timestamp("us")),
     ["0x73fc1136c74edb1c", "0xe220a8397b1dcdaf"]),
    (pa.array([True, False, None]), ["0x910a2dec89025cc1", "0xe220a8397b1dcdaf", "0xe220a8397b1dcdaf"]),
    (pa.array([7, -(2**31)], pa.int32()), ["0x63cbe1e459320dd7", "0xee1591ea220fb185"]),
    (pa.array([b"", b"\x00", None, bytes(range(256))], pa.binary()),
     ["0xc3817c016ba4ff30", "0x701933c8c2bc583e", "0xc3817c016ba4ff30", "0x3d891d7eb8105c07"]),
    (pa.array(["", "a", None, "héllo"], pa.large_string()),
     ["0xc3817c016ba4ff30", "0xc0fc99fea7ab959c", "0xc3817c016ba4ff30", "0xa37b85adde3f0b61"]),
    (pa.array(["zero", "one", "two", "three", None, "five"]).slice(2, 3),
     ["0xa21217285a51af93", "0x771a9b877354e457", "0xc3817c016ba4ff30"]),
    (pa.chunked_array([["a", None], ["bc", ""]]),
     ["0xc0fc99fea7ab959c", "0xc3817c016ba4ff30", "0xaf3f413f2b7d6e57", "0xc3817c016ba4ff30"]),
], ids=["date", "timestamp", "bool", "int32", "binary", "large_string", "sliced strings", "chunked strings"])
def test_every_key_type_hashes_as_the_format_defines(keys: Any, expected: list[str]) -> None:
    assert [hex(h) for h in runs.key_hashes(keys).tolist()] == expected


def test_a_bloom_filter_has_the_formats_bits() -> None:
    import hashlib

    keys = runs._mix(np.arange(10_000, dtype=np.uint64))
    bloom = runs.Bloom.sized(len(keys))
    bloom.add(keys)
    assert len(bloom.bits) == 16_256
    assert hashlib.sha256(bloom.bits.tobytes()).hexdigest() == (
        "c48aa31205e3d9391b079247f037fd11a8bda3dd89a98103ae387f8a9b9db3e9")
    assert bloom.might_contain(keys).all()


def test_unsigned_64_bit_keys_hash_their_bits_and_small_ones_as_signed_keys_do() -> None:
    """Keys of 2**63 and up used to fail the int64 cast ("not in range")."""
    unsigned = runs.key_hashes(pa.array([0, 5, 2**63 - 1, 2**63, 2**64 - 1], pa.uint64()))
    signed = runs.key_hashes(pa.array([0, 5, 2**63 - 1, -(2**63), -1], pa.int64()))
    assert unsigned.tobytes() == signed.tobytes()
    assert len(set(unsigned.tolist())) == 5


_CHANGED_OFFSETS = """
import threading
import time
import numpy as np
import pyarrow as pa
from airflow_seatunnel_ckpt.core.state import runs

n = 5_000
base = pa.array([f"key-{i:08d}" for i in range(n)])
offsets = bytearray(base.buffers()[1].to_pybytes())
view = np.frombuffer(offsets, dtype=np.int32)  # the keys' own offsets, writable
keys = pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), base.buffers()[2]])
stop = threading.Event()

def change() -> None:
    good = int(view[n // 2])
    while not stop.is_set():
        view[n // 2] = 1 << 30
        view[n // 2] = good

thread = threading.Thread(target=change)
thread.start()
refused = 0
try:
    deadline = time.monotonic() + 3  # a bounded race: the process must survive it
    while time.monotonic() < deadline:
        try:
            runs.key_hashes(keys)
        except (IndexError, ValueError, pa.ArrowException):
            refused += 1
finally:
    stop.set()
    thread.join()
print("survived", refused)
"""


def test_hashing_string_keys_never_reads_outside_their_buffer_while_another_thread_changes_the_offsets() -> None:
    """An offset changed between a check and the read that trusts it must cost an error, not memory
    outside the buffer (the compiled loops released the GIL between the two and crashed the process)."""
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[3]
    env = {**os.environ, "PYTHONPATH": str(repo)}
    done = subprocess.run([sys.executable, "-c", _CHANGED_OFFSETS], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, f"the process died (return code {done.returncode}): {done.stderr[-2000:]}"
    assert done.stdout.startswith("survived")
