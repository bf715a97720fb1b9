"""Settling the log without leaving debris: :func:`settle` sweeps the temp files killed writers left
in the places an epoch owns before the watermark covers it (below it, no run looks again);
:func:`unsettled_places` lists those of the epochs above it."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import NamedTuple

from airflow_seatunnel_ckpt.core import layout
from airflow_seatunnel_ckpt.core.errors import CheckpointError, CorruptCheckpointError, StorageError
from airflow_seatunnel_ckpt.core.models import EpochState
from airflow_seatunnel_ckpt.core.protocol import epoch_index, settled
from airflow_seatunnel_ckpt.core.protocol.pipeline import Pipeline
from airflow_seatunnel_ckpt.core.protocol.settled import SettledRead
from airflow_seatunnel_ckpt.core.storage import Storage, TempFiles, backend_for

log = logging.getLogger(__name__)


class Place(NamedTuple):
    """Where temp files may lie: a storage, a path below it, how far down to look."""

    storage: Storage
    path: str
    recursive: bool = True
    #: ``prune(directory)`` True: not below that directory (a path relative to the storage's root)
    prune: Callable[[str], bool] | None = None

    def look(self, now: float, timeout: float) -> TempFiles:
        """The temp files there, stale ones (older than ``timeout``) named."""
        return self.storage.temp_files(self.path, now=now, older_than=timeout, recursive=self.recursive,
                                       prune=self.prune)


def _sweep(places: Iterable[Place], now: float, timeout: float, removed: list[str]) -> bool:
    """Remove the temp files of ``places`` older than ``timeout``; True if none younger is left."""
    clean = True
    for place in places:
        found = place.look(now, timeout)
        for stale in found.stale:
            try:
                place.storage.delete(stale)
            except FileNotFoundError:
                continue
            removed.append(place.storage.describe_path(stale))
        clean = clean and not found.young
    return clean


def sink_roots(pipeline: Pipeline, epoch: int) -> list[Storage]:
    """The targets committed ``epoch`` published to whose writes leave temp files (their roots hold the owner marker).

    A table named by its catalog or database (``iceberg://``, ``postgres://``) has no root in
    any store; a file target that cannot be opened is logged and left out (it must not hold
    the watermark forever).
    """
    out = []
    tables: set[str] | None = None
    for sink in pipeline.txlog.read_published(epoch) or []:
        if not sink.published:
            continue
        try:
            backend = backend_for(sink.target_url.split("://", 1)[0].lower())
        except StorageError as exc:
            if tables is None:
                tables = {m.sink for r in pipeline.txlog.winning_records(epoch) or [] for m in r.sinks
                          if m.table is not None}
            if sink.sink not in tables:
                log.warning("pipeline %s: epoch %s: cannot sweep sink %s at %s: %s", pipeline.name, epoch,
                            sink.sink, sink.target_url, exc)
            continue
        if not backend.capabilities.temp_files:
            continue  # (opening an object store's target would cost a probe, for nothing)
        try:
            out.append(pipeline.target_storage(sink.target_url))
        except CheckpointError as exc:
            log.warning("pipeline %s: epoch %s: cannot sweep sink %s at %s: %s", pipeline.name, epoch, sink.sink,
                        sink.target_url, exc)
    return out


def epoch_places(pipeline: Pipeline, epoch: int, state: EpochState | None, *, own_dirs: bool = True) -> list[Place]:
    """Where ``epoch``'s killed writers may have left temp files: its log and checkpoint directories
    (unless ``own_dirs`` is False), its run's index directory and, once committed, its sinks' roots."""
    storage = pipeline.storage
    places = [Place(storage, layout.txlog_dir(epoch)), Place(storage, layout.checkpoint_dir(epoch))] if own_dirs else []
    begin = pipeline.txlog.read_begin(epoch)
    if begin is not None:
        places.append(Place(storage, layout.run_index_dir(begin.run_id, begin.dag_id), recursive=False))
    if state is EpochState.COMMITTED:
        places += [Place(target, "", recursive=False) for target in sink_roots(pipeline, epoch)]
    return places


def unsettled_places(pipeline: Pipeline, watermark: int, above: Iterable[int],
                     states: Mapping[int, EpochState]) -> list[Place]:
    """Every place of the store where a killed writer's temp file may lie, but what settling swept:
    one look at the store (pruned below the watermark) and the run directories and sink roots of
    the epochs ``above`` it."""
    storage = pipeline.storage
    if not storage.capabilities.temp_files:
        return []

    def settled_or_index(directory: str) -> bool:
        parent, _, name = directory.rpartition("/")
        if not parent:
            epoch = layout.parse_checkpoint_dir(name)
        elif parent == layout.TXLOG:
            epoch = layout.parse_txlog_dir(name)
        else:
            return False
        return directory == layout.RUNS or (epoch is not None and epoch <= watermark)

    places = {(storage.url, ""): Place(storage, "", prune=settled_or_index)}
    for epoch in above:
        try:
            places.update(((p.storage.url, p.path), p)
                          for p in epoch_places(pipeline, epoch, states.get(epoch), own_dirs=False))
        except CorruptCheckpointError:
            continue
    return list(places.values())


def settle(pipeline: Pipeline, seen: SettledRead, states: Mapping[int, EpochState], *, now: float,
           timeout: float) -> list[str]:
    """Advance the settled watermark over the final epochs of ``states``, sweeping each first and
    summarising them for the views (:mod:`epoch_index`); returns the temp files removed.

    An epoch still holding a temp file younger than ``timeout`` (a writer may be finishing
    it), or whose records cannot be read, stops the advance before it.
    """
    watermark = seen.record.watermark
    covered = dict(states)
    removed: list[str] = []
    run = settled.final_run(watermark, states)
    # Nothing is swept for an advance too short to be written (the next run sweeps then),
    # nor on an object store (its writes leave no temp files, and reads cost requests).
    if len(run) >= max(1, settled.MIN_ADVANCE) and pipeline.storage.capabilities.temp_files:
        for epoch in run:
            try:
                swept = _sweep(epoch_places(pipeline, epoch, states[epoch]), now, timeout, removed)
            except CheckpointError as exc:
                log.warning("pipeline %s: epoch %s is not settled yet: %s", pipeline.name, epoch, exc)
                swept = False
            if not swept:
                covered = {e: s for e, s in states.items() if e < epoch}
                break
    # The views' summary of what the advance covers, written before the advance, so that
    # the segment ending at a watermark exists once the watermark does.
    run = settled.final_run(watermark, covered)
    if len(run) >= max(1, settled.MIN_ADVANCE):
        epoch_index.write(pipeline, run)
    pipeline.txlog.settled.advance(seen, covered)
    return removed
