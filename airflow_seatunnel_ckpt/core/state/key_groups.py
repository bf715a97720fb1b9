"""The key group of a row, computed without Spark: ``pmod(hash(keys), G)`` as Spark places it.

Spark's ``hash`` is Murmur3 x86 32-bit with seed 42, chained over the key columns (each
column's hash is the next one's seed, a null leaves it unchanged). :func:`key_groups_of` lets
``rescale`` re-partition state rows exactly where the executors will look for them. Only
types whose Spark hash is a plain function of the value are supported.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

from airflow_seatunnel_ckpt.core.errors import CheckpointError

SEED = 42
_MASK = 0xFFFFFFFF
_C1 = 0xCC9E2D51
_C2 = 0x1B873593


class UnsupportedKeyTypeError(CheckpointError):
    """A key column's type has no Spark-compatible hash here (decimal, nested types)."""


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _MASK


def _mix_k1(k1: int) -> int:
    k1 = (k1 * _C1) & _MASK
    k1 = _rotl(k1, 15)
    return (k1 * _C2) & _MASK


def _mix_h1(h1: int, k1: int) -> int:
    h1 ^= k1
    h1 = _rotl(h1, 13)
    return (h1 * 5 + 0xE6546B64) & _MASK


def _fmix(h1: int, length: int) -> int:
    h1 ^= length
    h1 ^= h1 >> 16
    h1 = (h1 * 0x85EBCA6B) & _MASK
    h1 ^= h1 >> 13
    h1 = (h1 * 0xC2B2AE35) & _MASK
    h1 ^= h1 >> 16
    return h1


def hash_int(value: int, seed: int) -> int:
    """Spark's ``Murmur3_x86_32.hashInt`` (unsigned 32-bit result)."""
    return _fmix(_mix_h1(seed & _MASK, _mix_k1(value & _MASK)), 4)


def hash_long(value: int, seed: int) -> int:
    """Spark's ``Murmur3_x86_32.hashLong``."""
    h1 = _mix_h1(seed & _MASK, _mix_k1(value & _MASK))
    h1 = _mix_h1(h1, _mix_k1((value >> 32) & _MASK))
    return _fmix(h1, 8)


def hash_bytes(data: bytes, seed: int) -> int:
    """Spark's ``Murmur3_x86_32.hashUnsafeBytes`` (tail bytes one by one, sign-extended)."""
    h1 = seed & _MASK
    aligned = len(data) - len(data) % 4
    for i in range(0, aligned, 4):
        h1 = _mix_h1(h1, _mix_k1(int.from_bytes(data[i:i + 4], "little")))
    for byte in data[aligned:]:
        h1 = _mix_h1(h1, _mix_k1((byte - 256 if byte > 127 else byte) & _MASK))
    return _fmix(h1, len(data))


def _hasher(arrow_type: Any, column: str) -> Any:
    """The hash function of one Arrow type, as Spark hashes the matching Spark type."""
    import pyarrow.types as t

    if t.is_boolean(arrow_type):
        return lambda v, s: hash_int(1 if v else 0, s)
    if t.is_int8(arrow_type) or t.is_int16(arrow_type) or t.is_int32(arrow_type) or t.is_date32(arrow_type):
        return hash_int
    if t.is_int64(arrow_type):
        return hash_long
    if t.is_timestamp(arrow_type):  # Spark keeps timestamps as microseconds since the epoch
        scale = {"s": 1_000_000, "ms": 1_000, "us": 1, "ns": None}[arrow_type.unit]
        if scale is None:
            return lambda v, s: hash_long(v // 1_000, s)
        return lambda v, s: hash_long(v * scale, s)
    if t.is_float32(arrow_type):
        return lambda v, s: hash_int(_float_bits(v, "f", "I"), s)
    if t.is_float64(arrow_type):
        return lambda v, s: hash_long(_float_bits(v, "d", "Q"), s)
    if t.is_string(arrow_type) or t.is_large_string(arrow_type):
        return lambda v, s: hash_bytes(v.encode("utf-8"), s)
    if t.is_binary(arrow_type) or t.is_large_binary(arrow_type):
        return hash_bytes
    raise UnsupportedKeyTypeError(
        f"key column {column!r} has type {arrow_type}, whose Spark hash this release cannot compute; "
        "rescale supports integer, boolean, floating point, string, binary, date and timestamp keys")


def _float_bits(value: float, fmt: str, as_int: str) -> int:
    if value != value:  # Java's floatToIntBits/doubleToLongBits canonicalise NaN
        value = float("nan")
    elif value == 0.0:  # Spark normalises -0.0 to 0.0 before hashing
        value = 0.0
    return int(struct.unpack("<" + as_int, struct.pack("<" + fmt, value))[0])


def key_groups_of(table: Any, key_columns: Sequence[str], key_groups: int) -> list[int]:
    """The key group of each row of the Arrow ``table``: ``pmod(hash(keys), key_groups)``."""
    import pyarrow as pa

    if key_groups < 1:
        raise ValueError(f"key_groups must be at least 1, got {key_groups}")
    columns = []
    for name in key_columns:
        column = table.column(name)
        arrow_type = column.type
        if pa.types.is_timestamp(arrow_type) or pa.types.is_date32(arrow_type):
            values = column.cast(pa.int64() if pa.types.is_timestamp(arrow_type) else pa.int32()).to_pylist()
        else:
            values = column.to_pylist()
        columns.append((_hasher(arrow_type, name), values))
    groups = []
    for i in range(table.num_rows):
        h = SEED
        for fn, values in columns:
            value = values[i]
            if value is not None:
                h = fn(value, h)
        signed = h - (1 << 32) if h & 0x80000000 else h
        groups.append(signed % key_groups)  # Python's % is pmod for a positive divisor
    return groups
