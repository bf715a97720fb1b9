"""The settled watermark: write-once versions ``_txlog/_settled/v<N>`` summarising the final epochs
at or below it, and which committed (docs/ARCHITECTURE.md, decision 21). A summary, never the
truth; two writers may disagree on how far it goes, never on what lies below it."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass as plain_dataclass
from dataclasses import field
from typing import Annotated, Any, Literal

from annotated_types import Ge
from pydantic import Field, model_validator
from pydantic.dataclasses import dataclass

from airflow_seatunnel_ckpt.core import codec, layout
from airflow_seatunnel_ckpt.core.errors import AlreadyExistsError, CorruptCheckpointError
from airflow_seatunnel_ckpt.core.models import RECORD, EpochState, Record, decode, tag
from airflow_seatunnel_ckpt.core.storage import Storage

#: How many versions stay after a writer advanced: enough to fall back past a damaged one.
KEEP_VERSIONS = 4
#: Lost races a writer retries before it leaves the advance to the next run.
MAX_ATTEMPTS = 20
#: Newly final epochs a run needs before it writes a version: one write per advance, not per
#: recovery run, while readers read at most this many unrecorded final epochs one by one.
MIN_ADVANCE = 8

Ranges = list[tuple[int, int]]


def to_ranges(epochs: Iterable[int]) -> Ranges:
    """Ascending epochs as closed ranges ``[(first, last), ...]`` (compact for long runs)."""
    out: Ranges = []
    for e in sorted(epochs):
        if out and e == out[-1][1] + 1:
            out[-1] = (out[-1][0], e)
        else:
            out.append((e, e))
    return out


def _expand(ranges: Ranges) -> list[int]:
    return [e for first, last in ranges for e in range(first, last + 1)]


def final_run(watermark: int, states: Mapping[int, EpochState]) -> list[int]:
    """The unbroken run of final epochs right above ``watermark`` (absent from ``states``: not final)."""
    run: list[int] = []
    while (state := states.get(watermark + len(run) + 1)) is not None and state.final:
        run.append(watermark + len(run) + 1)
    return run


def _settled_bad(where: str, what: str) -> CorruptCheckpointError:
    return CorruptCheckpointError(
        f"{where}: settled record {what}. Nothing is lost: it only summarises the per-epoch records; readers "
        "fall back to an older version or a full listing, the next `seatunnel-ckpt recover --apply` writes a "
        "newer version, and this file can be deleted", where)


@dataclass(config=RECORD)
class SettledRecord(Record):
    """One version of the settled watermark: every epoch <= ``watermark`` is final."""

    version: int
    watermark: Annotated[int, Ge(0)]
    committed: Ranges = Field(default_factory=list)
    aborted: Ranges = Field(default_factory=list)
    created_at: float = 0.0
    type: Literal["settled"] = tag("settled")

    @model_validator(mode="after")
    def _ranges_fit(self) -> SettledRecord:
        for key in ("committed", "aborted"):
            last = 0
            for first, end in getattr(self, key):
                if not 1 <= first <= end <= self.watermark or (last and first <= last + 1):
                    raise ValueError(f"{key} range {[first, end]!r}: expected ascending, disjoint [first, last] "
                                     f"within 1..{self.watermark}")
                last = end
        if set(_expand(self.committed)) & set(_expand(self.aborted)):
            raise ValueError("names an epoch both committed and aborted")
        return self

    def committed_epochs(self) -> list[int]:
        """The committed epochs at or below the watermark, ascending."""
        return _expand(self.committed)

    def last_committed(self) -> int | None:
        """The newest committed epoch at or below the watermark, or None."""
        return self.committed[-1][1] if self.committed else None

    def states(self) -> dict[int, EpochState]:
        """Every settled epoch with its (final) state, ascending."""
        out = dict.fromkeys(self.committed_epochs(), EpochState.COMMITTED)
        out.update(dict.fromkeys(_expand(self.aborted), EpochState.ABORTED))
        return dict(sorted(out.items()))

    @classmethod
    def from_dict(cls, d: Any, path: str = "<record>", version: int | None = None) -> SettledRecord:
        """Parse and check a stored record (of ``version``, as its file is named)."""
        try:
            record = decode(cls, d, path)
        except CorruptCheckpointError as exc:
            raise _settled_bad(path, f"does not fit: {str(exc).removeprefix(f'{path}: ')}") from None
        if version is not None and record.version != version:
            raise _settled_bad(path, f"says version {record.version!r} but its file name says {version}")
        return record


#: The record a log without any settled version starts from: nothing is known final.
EMPTY = SettledRecord(0, 0)


@plain_dataclass(frozen=True)
class SettledRead:
    """What a reader found: the newest intact record, the newest version listed, the damage."""

    record: SettledRecord
    newest_version: int
    damaged: list[CorruptCheckpointError] = field(default_factory=list)


class SettledLog:
    """The versions of one pipeline's settled watermark (``_txlog/_settled``)."""

    def __init__(self, storage: Storage, pipeline: str, max_chunk: int = codec.DEFAULT_MAX_CHUNK) -> None:
        self.storage = storage
        self.pipeline = pipeline
        self._max_chunk = max_chunk

    def versions(self) -> list[int]:
        """Every version present, ascending (one listing)."""
        found = (layout.parse_version_name(n, layout.SETTLED_WIDTH) for n in self.storage.list_dir(layout.SETTLED))
        return sorted(v for v in found if v is not None)

    def read(self) -> SettledRead:
        """The newest intact version (one listing, usually one read); :data:`EMPTY` if none."""
        versions = self.versions()
        damaged: list[CorruptCheckpointError] = []
        for version in reversed(versions):
            record = self._read_version(version, damaged)
            if record is not None:
                return SettledRead(record, versions[-1], damaged)
        return SettledRead(EMPTY, versions[-1] if versions else 0, damaged)

    def damaged(self) -> list[CorruptCheckpointError]:
        """Every version present that cannot be read back (for ``verify``; reads them all)."""
        problems: list[CorruptCheckpointError] = []
        for version in self.versions():
            self._read_version(version, problems)
        return problems

    def _read_version(self, version: int, problems: list[CorruptCheckpointError]) -> SettledRecord | None:
        path = layout.settled_path(version)
        where = self.storage.describe_path(path)
        try:
            data = self.storage.read(path)
        except FileNotFoundError:  # pruned by a writer since the listing
            return None
        try:
            return SettledRecord.from_dict(codec.decode_json(data, where, max_chunk=self._max_chunk), where, version)
        except CorruptCheckpointError as exc:
            if "settled record" not in str(exc):  # a frame or checksum error: say what it is
                exc = CorruptCheckpointError(
                    f"{exc}. It is a settled record (a summary of final epochs): nothing is lost; readers fall "
                    "back to an older version or a full listing, and the file can be deleted", where)
            problems.append(exc)
            return None

    def advance(self, seen: SettledRead, states: Mapping[int, EpochState]) -> SettledRecord | None:
        """Move the watermark over the final epochs of ``states`` (read after ``seen``) just above it
        (:func:`final_run`), if by at least :data:`MIN_ADVANCE`; returns the record written, or None."""
        base = seen.record
        watermark = base.watermark
        committed, aborted = base.committed_epochs(), _expand(base.aborted)
        for watermark in final_run(base.watermark, states):
            (committed if states[watermark] is EpochState.COMMITTED else aborted).append(watermark)
        if watermark - base.watermark < max(1, MIN_ADVANCE):
            return None
        newest = seen.newest_version
        for _ in range(MAX_ATTEMPTS):
            record = SettledRecord(newest + 1, watermark, to_ranges(committed), to_ranges(aborted), time.time())
            try:
                self.storage.create_exclusive(layout.settled_path(record.version), codec.encode_json(record.to_dict()))
            except AlreadyExistsError:
                # Another writer advanced first. Its record and ours summarise the same
                # immutable states; ours is worth writing only if it reaches further.
                again = self.read()
                if again.record.watermark >= watermark:
                    return None
                newest = again.newest_version
                continue
            self._prune(record.version)
            return record
        return None

    def _prune(self, newest: int) -> None:
        """Delete versions older than the newest :data:`KEEP_VERSIONS`: the listing stays O(1)."""
        for version in self.versions():
            if version <= newest - KEEP_VERSIONS:
                with contextlib.suppress(FileNotFoundError):
                    self.storage.delete(layout.settled_path(version))
