"""Validation of the names and numbers that become parts of storage paths.

A name ends up as one path segment in the store, so it must never be able to climb out
of its directory (``..``), split into several segments (``/``, ``\\``), hide (leading
``.``), collide with reserved directories (leading ``_``) or carry control bytes.
"""

from __future__ import annotations

import re

from airflow_seatunnel_ckpt.core.errors import InvalidEpochError, InvalidNameError

MAX_NAME_LENGTH = 128
#: Epochs are counters of DAG runs; anything near this bound is a bug or an attack. It is
#: the largest 12-digit number: the transaction log zero-pads epochs to 12 digits so that
#: a listing is in epoch order, and a 13-digit epoch would sort (and parse) wrongly.
MAX_EPOCH = 10**12 - 1

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def validate_name(name: object, what: str = "name") -> str:
    """Return ``name`` unchanged if it is a safe single path segment, else raise.

    ``what`` says which kind of name it is (pipeline, sink, ...) for the error message.
    """
    if not isinstance(name, str):
        raise InvalidNameError(f"{what} must be a string, got {type(name).__name__}")
    if not name:
        raise InvalidNameError(f"{what} must not be empty")
    if len(name) > MAX_NAME_LENGTH:
        raise InvalidNameError(
            f"{what} is {len(name)} characters long; at most {MAX_NAME_LENGTH} are allowed"
        )
    if not _NAME.fullmatch(name) or ".." in name:
        raise InvalidNameError(
            f"{what} {name!r} is not allowed: use letters, digits, '_', '-' and '.', "
            "start with a letter or digit, and no '..', '/', '\\' or control characters"
        )
    return name


def validate_epoch(epoch: object) -> int:
    """Return ``epoch`` if it is an integer in ``[1, MAX_EPOCH]``, else raise."""
    if isinstance(epoch, bool) or not isinstance(epoch, int):
        raise InvalidEpochError(f"epoch must be an integer, got {epoch!r}")
    if epoch < 1 or epoch > MAX_EPOCH:
        raise InvalidEpochError(f"epoch {epoch} is out of range: expected 1..{MAX_EPOCH}")
    return epoch


def validate_attempt(attempt: object) -> int:
    """Return ``attempt`` if it is a positive integer (Airflow's try number), else raise."""
    if isinstance(attempt, bool) or not isinstance(attempt, int) or not 1 <= attempt <= 1_000_000:
        raise InvalidEpochError(f"attempt must be an integer in 1..1000000, got {attempt!r}")
    return attempt
