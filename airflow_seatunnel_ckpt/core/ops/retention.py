"""Retention (:func:`retain`): delete old checkpoints, never one that restore or an epoch in flight
needs, and the parts of attempts that lost in those it keeps (docs/ARCHITECTURE.md, decision 9)."""

from __future__ import annotations

import posixpath
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from airflow_seatunnel_ckpt.core import layout
from airflow_seatunnel_ckpt.core.errors import ConfigError, CorruptCheckpointError
from airflow_seatunnel_ckpt.core.models import EpochState
from airflow_seatunnel_ckpt.core.protocol import sweep
from airflow_seatunnel_ckpt.core.protocol.pipeline import Pipeline
from airflow_seatunnel_ckpt.core.storage import TEMP_PREFIX


@dataclass
class RetentionReport:
    """What retention kept and removed for one pipeline."""

    pipeline: str
    dry_run: bool
    kept: list[int] = field(default_factory=list)
    removed_checkpoints: list[int] = field(default_factory=list)
    removed_files: int = 0  #: in a dry run: the files the real run would remove
    kept_for_reference: int = 0
    #: removed checkpoints whose directory stays: it holds parts a kept checkpoint references
    partly_kept: list[int] = field(default_factory=list)
    #: files in kept checkpoints that nothing references (parts of attempts that lost)
    removed_unreferenced: list[str] = field(default_factory=list)
    removed_temp_files: list[str] = field(default_factory=list)
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        """Plain data for logs, XCom and ``--json`` output."""
        return asdict(self)


def retain(pipeline: Pipeline, max_retain: int | None = None, dry_run: bool = False) -> RetentionReport:
    """Delete old checkpoints, keeping the newest ``max_retain`` committed ones and their bases.

    An epoch newer than the newest committed one in the log's one read is never touched;
    a removed committed checkpoint is marked ``retired``, so restore never takes it for damage.
    """
    if max_retain is not None and (isinstance(max_retain, bool) or not isinstance(max_retain, int)
                                   or max_retain < 1):
        raise ConfigError(f"max_retain must be an integer >= 1 (the newest committed checkpoint is "
                          f"always kept), got {max_retain!r}")
    keep_n = max_retain or pipeline.config.max_retain
    report = RetentionReport(pipeline.name, dry_run)
    # One read of the log decides everything below: an epoch changes state while
    # retention runs, and two reads could put it in neither the committed nor the
    # unfinished set. Settled epochs come from the settled record: final, so unchanging.
    seen, states = pipeline.txlog.view()
    committed = [e for e, s in states.items() if s is EpochState.COMMITTED]
    unfinished = {e for e, s in states.items() if not s.final}
    kept = committed[-keep_n:]
    report.kept = kept
    referenced: set[str] = set()
    for epoch in kept:
        try:
            meta = pipeline.checkpoints.read_metadata(epoch)
        except CorruptCheckpointError as exc:
            report.note = (f"checkpoint {epoch} has damaged _metadata ({exc}); nothing older was removed "
                           "because the parts it references cannot be known")
            return report
        referenced.update(p.path for p in meta.parts())
    if not kept:
        return report
    newest = kept[-1]
    # An epoch still in flight may have restored from an older checkpoint (a fallback):
    # the parts its prepared records chain onto must outlive this retention run too.
    for epoch in unfinished:
        for record in pipeline.txlog.prepared(epoch).values():
            referenced.update(p.path for op in record.operators.values() for p in op.parts())
            referenced.update(p.path for source in record.sources.values() for p in source.chain)
    for epoch in pipeline.checkpoints.epochs():
        # Newer than the newest committed epoch in the view: it began, or committed, after
        # the log was read, so the view cannot say whether restore will need it.
        if epoch in kept or epoch in unfinished or epoch > newest:
            continue
        root = layout.checkpoint_dir(epoch) + "/"
        keep_here = {p for p in referenced if p.startswith(root)}
        report.kept_for_reference += len(keep_here)
        if epoch in committed and pipeline.txlog.is_retired(epoch) and _holds_only(pipeline, root, keep_here):
            continue  # an earlier run removed it but for parts newer checkpoints reference
        report.removed_checkpoints.append(epoch)
        if keep_here:
            report.partly_kept.append(epoch)
        if dry_run:
            # What the real run would remove, so that the preview and the run report alike.
            report.removed_files += len(pipeline.checkpoints.deletable(epoch, keep=keep_here))
            continue
        if epoch in committed:
            pipeline.txlog.retire(epoch)
        report.removed_files += len(pipeline.checkpoints.delete(epoch, keep=keep_here))
    _sweep_losing_parts(pipeline, kept, referenced, report)
    if not dry_run:  # the next run reads only the epochs above the new watermark
        report.removed_temp_files = sweep.settle(pipeline, seen, states, now=time.time(),
                                                 timeout=pipeline.config.prepared_timeout_s)
    return report


def _holds_only(pipeline: Pipeline, root: str, needed: set[str]) -> bool:
    return all(root + f.path in needed for f in pipeline.storage.walk(root.rstrip("/"), include_temp=True))


def _sweep_losing_parts(pipeline: Pipeline, kept: list[int], referenced: set[str], report: RetentionReport) -> None:
    """Remove files of kept committed checkpoints that no ``_metadata`` or prepared record needs: parts
    losing attempts wrote, which nothing can come to reference (restore reads committed metadata)."""
    for epoch in kept:  # committed, so never an epoch still in flight
        root = layout.checkpoint_dir(epoch)
        for f in pipeline.storage.walk(root, include_temp=True):
            path = f"{root}/{f.path}"
            name = posixpath.basename(f.path)
            # Parts and temp debris only: markers are rewritten by whoever needs them, and
            # an early release's checkpoint has a ``_meta`` its ``_metadata`` does not name.
            if path in referenced or not (name.startswith("part-") or name.startswith(TEMP_PREFIX)):
                continue
            report.removed_unreferenced.append(path)
            report.removed_files += 1
            if not report.dry_run:
                pipeline.storage.delete(path)
