"""Types of the compiled loops of the sorted-run format (``_runs_accel.c``; see ``runs.py``)."""

from typing_extensions import Buffer

def mix(values: Buffer, out: Buffer, /) -> None:
    """``out[i]`` = splitmix64 finaliser of the 64-bit word ``values[i]``."""

def fnv1a(offsets: Buffer, width: int, data: Buffer, out: Buffer, /) -> None:
    """``out[i]`` = mix(FNV-1a 64 of key i's bytes ^ its length), from Arrow offsets ``width`` bytes wide."""

def bloom_add(words: Buffer, hashes: Buffer, masks: Buffer, /) -> None:
    """Layout 2: set each key's mask bits in its word (``words`` updated in place)."""

def bloom_probe(words: Buffer, hashes: Buffer, masks: Buffer, out: Buffer, /) -> None:
    """Layout 2: ``out[i]`` = 1 where every bit of key i's mask is set in its word."""
