"""Settling the log without leaving debris behind: what the settled watermark covers is swept first.

Below the settled watermark no run lists an epoch's directory again (that is the point of
the watermark), so a temp file a killed writer left there would stay forever. Such files
exist on local stores only: there every record and marker is written to a ``.tmp-*``
file and then linked or renamed into place, while object stores put whole objects. They
lie in two places an epoch owns: its ``_txlog/epoch-<e>/`` directory (a record write
killed before its link) and, for a committed epoch, the root of each sink it published to
(the owner marker's first claim, a snapshot sink's ``_LATEST``).

:func:`settle` walks each epoch it is about to cover once, removes the temp files older
than the timeout, and stops the watermark before an epoch that still holds a younger one
(a writer may be finishing it; the next run looks again). Recovery and retention settle
through it, so the cost stays one look per epoch, paid once, when it settles.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from airflow_seatunnel_ckpt.core import layout, settled
from airflow_seatunnel_ckpt.core.errors import CheckpointError
from airflow_seatunnel_ckpt.core.models import EpochState
from airflow_seatunnel_ckpt.core.pipeline import Pipeline
from airflow_seatunnel_ckpt.core.settled import SettledRead
from airflow_seatunnel_ckpt.core.storage import TEMP_PREFIX, Storage

log = logging.getLogger(__name__)

#: Protocols whose writers go through temp files (see :mod:`.storage.local`).
LOCAL_PROTOCOLS = ("file", "local")


def temp_files(storage: Storage, path: str, recursive: bool = True) -> list[str]:
    """The temp files below ``path`` of a local store (only its top level if not ``recursive``)."""
    if storage.protocol not in LOCAL_PROTOCOLS:
        return []
    if recursive:
        return [f"{path}/{f.path}".lstrip("/") for f in storage.walk(path, include_temp=True)
                if os.path.basename(f.path).startswith(TEMP_PREFIX)]
    try:
        with os.scandir(storage.full_path(path)) as entries:
            return sorted(f"{path}/{e.name}".lstrip("/") for e in entries
                          if e.name.startswith(TEMP_PREFIX) and e.is_file(follow_symlinks=False))
    except (FileNotFoundError, NotADirectoryError):
        return []


def by_age(storage: Storage, paths: list[str], now: float, timeout: float) -> tuple[list[str], bool]:
    """The ``paths`` older than ``timeout`` (a killed writer's), and whether a younger one is there.

    A path gone meanwhile (its writer finished, another sweeper removed it) is neither.
    """
    old, young = [], False
    for path in paths:
        try:
            if now - os.path.getmtime(storage.full_path(path)) > timeout:
                old.append(path)
            else:
                young = True
        except FileNotFoundError:
            continue
    return old, young


def _sweep(storage: Storage, paths: list[str], now: float, timeout: float, removed: list[str]) -> bool:
    """Remove the ``paths`` older than ``timeout``; True if none younger is left."""
    old, young = by_age(storage, paths, now, timeout)
    for path in old:
        try:
            storage.delete(path)
        except FileNotFoundError:
            continue
        removed.append(storage.describe_path(path))
    return not young


def sink_roots(pipeline: Pipeline, epoch: int) -> list[Storage]:
    """The local targets committed ``epoch`` published to (their roots hold the owner marker).

    A target that cannot be opened is logged and left out: it must not hold the watermark
    forever. :class:`CheckpointError` if the committed record cannot be read.
    """
    out = []
    for sink in pipeline.txlog.read_published(epoch) or []:
        if not sink.published or not sink.target_url.startswith(LOCAL_PROTOCOLS):
            continue
        try:
            out.append(pipeline.target_storage(sink.target_url))
        except CheckpointError as exc:
            log.warning("pipeline %s: epoch %s: cannot sweep sink %s at %s: %s", pipeline.name, epoch, sink.sink,
                        sink.target_url, exc)
    return out


def _epoch_swept(pipeline: Pipeline, epoch: int, state: EpochState, now: float, timeout: float,
                 removed: list[str]) -> bool:
    """Sweep what ``epoch`` owns; True if nothing young is left in it."""
    clean = _sweep(pipeline.storage, temp_files(pipeline.storage, layout.txlog_dir(epoch)), now, timeout, removed)
    for target in sink_roots(pipeline, epoch) if state is EpochState.COMMITTED else []:
        clean = _sweep(target, temp_files(target, "", recursive=False), now, timeout, removed) and clean
    return clean


def settle(pipeline: Pipeline, seen: SettledRead, states: Mapping[int, EpochState], *, now: float,
           timeout: float) -> list[str]:
    """Advance the settled watermark over the final epochs of ``states``, sweeping each first.

    Returns the temp files removed. An epoch that still holds a temp file younger than
    ``timeout``, or whose committed record cannot be read, stops the advance before it.
    A sink on a local target of a pipeline whose store is an object store is not swept.
    """
    watermark = seen.record.watermark
    covered = dict(states)
    removed: list[str] = []
    run: list[int] = []  # the unbroken final epochs right above the watermark: what the advance would cover
    while (state := states.get(watermark + len(run) + 1)) is not None and state.final:
        run.append(watermark + len(run) + 1)
    # Nothing is swept for an advance too short to be written (the next run sweeps then),
    # nor on an object store (its writes leave no temp files, and reads cost requests).
    if len(run) >= max(1, settled.MIN_ADVANCE) and pipeline.storage.protocol in LOCAL_PROTOCOLS:
        for epoch in run:
            try:
                swept = _epoch_swept(pipeline, epoch, states[epoch], now, timeout, removed)
            except CheckpointError as exc:
                log.warning("pipeline %s: epoch %s is not settled yet: %s", pipeline.name, epoch, exc)
                swept = False
            if not swept:
                covered = {e: s for e, s in states.items() if e < epoch}
                break
    pipeline.txlog.settle(seen, covered)
    return removed
