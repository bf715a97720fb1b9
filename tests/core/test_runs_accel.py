"""The compiled hashing and bloom filter loops agree bit for bit with numpy's (the format's definition).

Each property computes the same thing twice, with ``runs.ACCELERATOR`` in place and with it
set to None (the documented switch forcing the numpy path), and compares the bytes.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_seatunnel_ckpt.core import runs
from airflow_seatunnel_ckpt.core.parts import key_array
from airflow_seatunnel_ckpt.core.run_chain import lookup
from airflow_seatunnel_ckpt.core.runs import Bloom, RunReader, key_hashes, sort_keys, write_run
from airflow_seatunnel_ckpt.core.storage.local import LocalStorage

REPO = Path(__file__).resolve().parents[2]
ACCEL = runs.ACCELERATOR
SWITCHED_OFF = os.environ.get(runs.NO_ACCELERATOR_ENV, "") not in ("", "0")
needs_accel = pytest.mark.skipif(ACCEL is None, reason="the compiled loops are not built in this install, or "
                                                       f"{runs.NO_ACCELERATOR_ENV} switched them off")


@pytest.fixture(autouse=True)
def restore_accelerator() -> Iterator[None]:
    yield
    runs.ACCELERATOR = ACCEL


def both_ways(fn: Callable[[], Any]) -> tuple[Any, Any]:
    """``fn()`` with the compiled loops, then with numpy's."""
    runs.ACCELERATOR = ACCEL
    fast = fn()
    runs.ACCELERATOR = None
    try:
        slow = fn()
    finally:
        runs.ACCELERATOR = ACCEL
    return fast, slow


def assert_same_hashes(keys: Any) -> np.ndarray:
    fast, slow = both_ways(lambda: key_hashes(keys))
    assert fast.dtype == slow.dtype == np.uint64
    assert fast.tobytes() == slow.tobytes(), f"hashes of {keys.type} keys differ"
    return fast  # type: ignore[no-any-return]


def test_the_compiled_loops_are_built_where_a_c_compiler_is() -> None:
    """An editable install (scripts/bootstrap.sh) builds them; a silent fallback would cost
    every run write its filter time."""
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler on this machine: the install falls back to numpy")
    if SWITCHED_OFF:
        pytest.skip(f"{runs.NO_ACCELERATOR_ENV} switched them off")
    assert ACCEL is not None, (
        f"airflow_seatunnel_ckpt/core/_runs_accel.c is not built next to {runs.__file__}: run scripts/bootstrap.sh "
        "(pip install -e .), or `python scripts/build_ext.py` in a checkout used through PYTHONPATH, and read the "
        "compiler's output")


def test_the_environment_switch_forces_the_numpy_path() -> None:
    code = "from airflow_seatunnel_ckpt.core import runs; print(runs.ACCELERATOR is None)"
    env = {**os.environ, "PYTHONPATH": str(REPO), runs.NO_ACCELERATOR_ENV: "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"


KEY_CASES: dict[str, pa.Array | pa.ChunkedArray] = {
    "int64": pa.array([0, 1, -1, 2**63 - 1, -(2**63), None, 42], pa.int64()),
    "int32": pa.array([7, None, -(2**31), 2**31 - 1], pa.int32()),
    "uint64": pa.array([2**63 - 1, 0, None, 2**63, 2**64 - 1], pa.uint64()),
    "date": pa.array([dt.date(1970, 1, 1), dt.date(1969, 12, 31), None, dt.date(2026, 11, 25)], pa.date32()),
    "timestamp": pa.array([dt.datetime(2026, 1, 1, 12, 30), None, dt.datetime(1900, 1, 1)], pa.timestamp("us")),
    "bool": pa.array([True, False, None]),
    "string": pa.array(["", "a", None, "héllo wörld", "x" * 300, "\x00\x01"]),
    "large_string": pa.array(["", "a", None, "héllo"], pa.large_string()),
    "binary": pa.array([b"", b"\x00", None, bytes(range(256))], pa.binary()),
    "large_binary": pa.array([b"ab", None, b""], pa.large_binary()),
    "all null strings": pa.array([None, None], pa.string()),
    "empty strings": pa.array([], pa.string()),
    "empty ints": pa.array([], pa.int64()),
    "sliced strings": pa.array(["zero", "one", "two", "three", None, "five"]).slice(2, 3),
    "chunked strings": pa.chunked_array([["a", None], ["bc", ""]]),
    "chunked ints": pa.chunked_array([[1, 2], [None, 4]], pa.int64()),
}


@pytest.mark.parametrize("case", list(KEY_CASES))
@needs_accel
def test_hashes_are_identical_on_both_paths(case: str) -> None:
    hashes = assert_same_hashes(KEY_CASES[case])
    assert len(hashes) == len(KEY_CASES[case])


def test_unsigned_64_bit_keys_hash_their_bits_and_small_ones_as_signed_keys_do() -> None:
    """Keys of 2**63 and up used to fail the int64 cast ("not in range") on both paths."""
    unsigned = key_hashes(pa.array([0, 5, 2**63 - 1, 2**63, 2**64 - 1], pa.uint64()))
    signed = key_hashes(pa.array([0, 5, 2**63 - 1, -(2**63), -1], pa.int64()))
    assert unsigned.tobytes() == signed.tobytes()
    assert len(set(unsigned.tolist())) == 5


@needs_accel
def test_multi_column_keys_hash_identically_on_both_paths() -> None:
    table = pa.table({"a": pa.array([1, None, 3, 3], pa.int64()), "b": pa.array(["x", "y", None, "x:y"]),
                      "c": pa.array([dt.date(2026, 1, 1), None, None, dt.date(1999, 5, 5)], pa.date32())})
    assert_same_hashes(key_array(table, ["a", "b", "c"]))


@needs_accel
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ints=st.lists(st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)), max_size=200),
       texts=st.lists(st.one_of(st.none(), st.text(max_size=40)), max_size=200),
       blobs=st.lists(st.one_of(st.none(), st.binary(max_size=40)), max_size=200),
       start=st.integers(0, 10))
def test_any_keys_hash_identically_on_both_paths(ints: list[int | None], texts: list[str | None],
                                                 blobs: list[bytes | None], start: int) -> None:
    for array in (pa.array(ints, pa.int64()), pa.array(texts, pa.string()), pa.array(blobs, pa.binary())):
        assert_same_hashes(array)
        assert_same_hashes(array.slice(min(start, len(array))))
    n = min(len(ints), len(texts))
    assert_same_hashes(key_array(pa.table({"i": pa.array(ints[:n], pa.int64()), "t": pa.array(texts[:n])}),
                                 ["i", "t"]))


@needs_accel
@settings(max_examples=100, deadline=None)
@given(hashes=st.lists(st.integers(0, 2**64 - 1), max_size=3000), extra=st.integers(0, 5000),
       probes=st.lists(st.integers(0, 2**64 - 1), max_size=500))
def test_layout_2_filters_and_probes_are_identical_on_both_paths(hashes: list[int], extra: int,
                                                                   probes: list[int]) -> None:
    added = np.array(hashes, dtype=np.uint64)
    asked = np.concatenate([added, np.array(probes, dtype=np.uint64)])

    def build() -> tuple[bytes, bytes]:
        bloom = Bloom.sized(len(hashes) + extra)
        bloom.add(added)
        return bloom.bits.tobytes(), bloom.might_contain(asked).tobytes()

    (fast_bits, fast_probe), (slow_bits, slow_probe) = both_ways(build)
    assert fast_bits == slow_bits
    assert fast_probe == slow_probe
    assert np.frombuffer(fast_probe, dtype=bool)[: len(hashes)].all()  # no false negatives


@needs_accel
def test_a_filter_read_from_a_file_is_probed_identically() -> None:
    """A reader's filter is a read-only view of the file's bytes: the compiled probe takes it as is."""
    keys = np.random.default_rng(3).integers(0, 2**63, 65_536).astype(np.uint64)
    bloom = Bloom.sized(len(keys))
    bloom.add(keys)
    stored = Bloom(np.frombuffer(bloom.bits.tobytes(), dtype=np.uint8), bloom.nbits, bloom.hashes, layout=2)
    asked = np.concatenate([keys[:1000], keys[:1000] ^ np.uint64(0x5555)])
    fast, slow = both_ways(lambda: stored.might_contain(asked))
    assert (fast == slow).all() and fast[:1000].all()


def sorted_table(keys: pa.Array) -> pa.Table:
    table = pa.table({"k": keys, "v": pa.array(np.arange(len(keys)))})
    return table.take(pc.sort_indices(sort_keys(table, ["k"])))


@needs_accel
@pytest.mark.parametrize("kind", ["int64", "string"])
def test_runs_are_byte_identical_and_read_back_on_either_path(tmp_path: Path, kind: str) -> None:
    rng = np.random.default_rng(5)
    values = rng.integers(0, 2**62, 20_000)
    keys = pa.array(values) if kind == "int64" else pa.array([f"user-{v:016x}" for v in values])
    table = sorted_table(keys)
    absent = pa.array(rng.integers(2**62, 2**63 - 1, 5_000))
    if kind == "string":
        absent = pc.cast(pc.binary_join_element_wise("other-", pc.cast(absent, pa.string()), ""), pa.string())
    storage = LocalStorage(f"file://{tmp_path}")
    refs = {}
    for name, accel in (("fast", ACCEL), ("slow", None)):
        runs.ACCELERATOR = accel
        refs[name] = write_run(storage, f"{name}/part-0", [table], ["k"], table.schema, epoch=1, block_rows=2_000)
    assert (tmp_path / "fast/part-0").read_bytes() == (tmp_path / "slow/part-0").read_bytes()
    wanted = keys.take(pa.array(rng.choice(len(keys), 500, replace=False)))
    for writer in ("fast", "slow"):
        for accel in (ACCEL, None):  # each run read on both paths (cached filters are bytes, probed anew)
            runs.ACCELERATOR = accel
            positions, rows, _ = lookup(storage, [refs[writer]], ["k"], wanted)
            assert sorted(rows.column("k").to_pylist()) == sorted(wanted.to_pylist()) and len(positions) == 500
            maybe = RunReader(storage, refs[writer], ["k"]).locate(absent)
            assert (maybe >= 0).mean() < 0.03


@needs_accel
def test_damaged_offsets_are_refused_before_any_byte_is_read() -> None:
    out = np.empty(2, dtype=np.uint64)
    with pytest.raises(ValueError, match="outside the 3 data bytes"):
        ACCEL.fnv1a(np.array([0, 2, 9], np.int32), 4, b"abc", out)
    with pytest.raises(ValueError, match="do not describe 2 keys"):
        ACCEL.fnv1a(np.array([0, 2], np.int64), 8, b"abc", out)
    with pytest.raises(ValueError, match="not whole 64-bit words"):
        ACCEL.bloom_add(np.zeros(12, np.uint8), out, runs._word_masks(6))
    with pytest.raises(TypeError, match="writable"):
        ACCEL.bloom_add(b"\x00" * 8, out, runs._word_masks(6))
