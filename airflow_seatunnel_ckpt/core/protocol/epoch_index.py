"""The epoch index: what the views show of settled epochs, in write-once segments
(``_txlog/epoch-<last>/epoch-index``) written as settling covers them (docs/ARCHITECTURE.md,
decision 37). A summary the state machine never reads; a missing or damaged segment means
reading those epochs' records."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Iterable
from typing import Literal

from pydantic import Field
from pydantic.dataclasses import dataclass

from airflow_seatunnel_ckpt.core import codec, layout
from airflow_seatunnel_ckpt.core.errors import AlreadyExistsError, CheckpointError, CorruptCheckpointError
from airflow_seatunnel_ckpt.core.models import (
    FORMAT_VERSION,
    RECORD,
    EpochState,
    EpochStatus,
    FormatVersion,
    PublishedSink,
    Record,
    tag,
)
from airflow_seatunnel_ckpt.core.protocol.lease import ExitRecord, SubmissionRecord, submissions_of
from airflow_seatunnel_ckpt.core.protocol.pipeline import Pipeline
from airflow_seatunnel_ckpt.core.protocol.txlog import INDEX_RECORD

log = logging.getLogger(__name__)

#: Epochs per segment at most: a view of the newest 30 reads one or two segments.
SEGMENT_EPOCHS = 64
#: Epochs one advance summarises at most (its newest): the first settling of a long log reads
#: this many epochs' records, not the whole history's.
MAX_SUMMARISED = 256


@dataclass(config=RECORD)
class EpochSummary(Record, EpochStatus):  # type: ignore[misc]  # frozen by RECORD's config, unseen by mypy
    """One final epoch as the views show it: its status when it settled, and what its records imply."""

    committed_at: float | None = None
    checkpoint_bytes: int | None = None
    submissions: list[tuple[SubmissionRecord, ExitRecord | None]] = Field(default_factory=list)

    def status(self) -> EpochStatus:
        """The epoch's status alone, as :meth:`TransactionLog.status` reads it."""
        return EpochStatus(*(getattr(self, f.name) for f in dataclasses.fields(EpochStatus)))


@dataclass(config=RECORD)
class IndexSegment(Record):
    """``epoch-index``: the summaries of the settled epochs ``first`` .. ``last``, ascending."""

    format_version: FormatVersion
    first: int
    last: int
    epochs: list[EpochSummary]
    type: Literal["epoch-index"] = tag("epoch-index")


def checkpoint_bytes(pipeline: Pipeline, epoch: int) -> int | None:
    """The bytes of the parts ``epoch``'s checkpoint lists; None without ``_metadata`` or if it is damaged."""
    if not pipeline.checkpoints.has_metadata(epoch):
        return None
    try:
        return sum(part.size for part in pipeline.checkpoints.read_metadata(epoch).parts())
    except CorruptCheckpointError:
        return None


def summarise(pipeline: Pipeline, epoch: int) -> EpochSummary:
    """``epoch`` read from its records: one listing, then each record it holds once."""
    txlog = pipeline.txlog
    names = pipeline.storage.list_dir(layout.txlog_dir(epoch))
    state = txlog.state(epoch, names)
    published: list[PublishedSink] = []
    committed_at = None
    if state is EpochState.COMMITTED:
        published, committed_at = txlog.read_committed(epoch) or ([], None)
    return EpochSummary(epoch, state, txlog.read_begin(epoch), txlog.prepared(epoch, names),
                        txlog.read_decision(epoch) if state.decided else None, published, committed_at,
                        checkpoint_bytes(pipeline, epoch), submissions_of(pipeline, epoch, names))


def write(pipeline: Pipeline, epochs: list[int]) -> None:
    """Summarise the final ``epochs`` (an ascending run an advance covers) into segments, oldest first.

    An epoch whose records cannot be read leaves its segment unwritten; a failed write is
    logged and left: the index is never needed.
    """
    epochs = epochs[-MAX_SUMMARISED:]
    # Segments end at the run's last epoch (the new watermark); the oldest may be shorter.
    ends = range(len(epochs) % SEGMENT_EPOCHS or SEGMENT_EPOCHS, len(epochs) + 1, SEGMENT_EPOCHS)
    previous = 0
    for end in ends:
        chunk, previous = epochs[previous:end], end
        try:
            segment = IndexSegment(FORMAT_VERSION, chunk[0], chunk[-1], [summarise(pipeline, e) for e in chunk])
            with contextlib.suppress(AlreadyExistsError):  # another settler's summary of the same records
                pipeline.storage.create_exclusive(layout.record_path(chunk[-1], INDEX_RECORD),
                                                  codec.encode_json(segment.to_dict()))
        except CheckpointError as exc:
            log.warning("pipeline %s: epochs %s-%s not indexed (the views read their records instead): %s",
                        pipeline.name, chunk[0], chunk[-1], exc)


def held(pipeline: Pipeline, watermark: int, epochs: Iterable[int]) -> dict[int, EpochSummary]:
    """The summaries the index holds of ``epochs`` at or below ``watermark``: segments read back from
    the one ending at the watermark, one read each, until one is missing or damaged."""
    wanted = {e for e in epochs if e <= watermark}
    out: dict[int, EpochSummary] = {}
    last = watermark
    while wanted and last >= min(wanted):
        try:
            segment = pipeline.txlog.read_record(layout.record_path(last, INDEX_RECORD), IndexSegment)
        except CorruptCheckpointError as exc:
            log.warning("pipeline %s: %s (the views read those epochs' records instead)", pipeline.name, exc)
            break
        if segment is None or segment.last != last or not segment.first <= last:
            break
        out.update((s.epoch, s) for s in segment.epochs if s.epoch in wanted)
        wanted -= set(out)
        last = segment.first - 1
    return out


def newest(pipeline: Pipeline, last: int) -> tuple[list[int], dict[int, EpochSummary]]:
    """The newest ``last`` epochs, ascending, and the summaries the index holds of them."""
    seen = pipeline.txlog.settled.read()
    epochs = pipeline.txlog.newest_epochs(last, seen)
    return epochs, held(pipeline, seen.record.watermark, epochs)
