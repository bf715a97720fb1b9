"""Recovery, restore-point selection with fallback, and retention.

* :func:`recover` resolves every epoch a crash left unfinished: COMMITTING rolls forward
  (finish publishing), ABORTING finishes its cleanup, OPEN/PREPARED past the prepared
  timeout is aborted, and staging or temp files no record needs are removed.
* :func:`restore_point` chooses the state to restore: the newest *committed* checkpoint
  that verifies; if it does not, its secondary replica, then a rebuild from the
  transaction log (the prepared records are a write-ahead log), and an older checkpoint
  only when replaying the epochs in between cannot duplicate published output.
  Otherwise it stops with :class:`RecoveryError` naming the damaged file and the way out.
* :func:`retain` keeps the newest ``max_retain`` committed checkpoints, always the newest
  one, and every older part a retained incremental checkpoint still references; in the
  checkpoints it keeps it removes the parts of attempts that lost.
"""

from __future__ import annotations

import logging
import posixpath
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_seatunnel_ckpt.core import layout
from airflow_seatunnel_ckpt.core.checkpoint import Problem
from airflow_seatunnel_ckpt.core.errors import (
    CheckpointError,
    ConfigError,
    CorruptCheckpointError,
    RecoveryError,
)
from airflow_seatunnel_ckpt.core.models import (
    CheckpointMetadata,
    EpochState,
    OperatorState,
    PartRef,
)
from airflow_seatunnel_ckpt.core.storage import TEMP_PREFIX, Storage, open_storage

if TYPE_CHECKING:
    from airflow_seatunnel_ckpt.core.pipeline import Pipeline

log = logging.getLogger(__name__)


@dataclass
class RestorePoint:
    """The state a new epoch starts from.

    ``how`` says where it came from: ``empty`` (nothing committed yet), ``primary``,
    ``secondary`` (replica store), ``rebuilt-from-log`` (metadata or source state rebuilt
    from prepared records) or ``older`` (an older checkpoint, safe because the epochs in
    between published nothing).
    """

    epoch: int | None
    how: str
    storage: Storage | None = None
    operators: dict[str, OperatorState] = field(default_factory=dict)
    source_chains: dict[str, list[PartRef]] = field(default_factory=dict)
    rebuilt_sources: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    skipped: list[Problem] = field(default_factory=list)

    def source_entries(self, pipeline: Pipeline, source: str) -> list[dict[str, Any]]:
        """Every committed ``{"epoch", "offsets"}`` entry of ``source``, oldest first."""
        if source in self.rebuilt_sources:
            return list(self.rebuilt_sources[source])
        chain = self.source_chains.get(source)
        if not chain:
            return []
        return pipeline.source_history(chain, self.storage)

    def to_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "how": self.how, "storage": self.storage.describe() if self.storage else None,
                "operators": sorted(self.operators),
                "sources": sorted(set(self.source_chains) | set(self.rebuilt_sources)),
                "skipped": [str(p) for p in self.skipped]}


def _from_metadata(meta: CheckpointMetadata, how: str, storage: Storage, skipped: list[Problem]) -> RestorePoint:
    return RestorePoint(meta.epoch, how, storage, dict(meta.operators),
                        {k: list(v.chain) for k, v in meta.sources.items()}, {}, skipped)


def restore_point(pipeline: Pipeline, deep: bool = True) -> RestorePoint:
    """Choose the restore point (see module docstring). Never restores uncommitted state."""
    # The common case costs one listing of the log plus the newest epochs' records, however
    # many epochs there are; the whole committed history is read only for a fallback.
    newest = pipeline.last_committed_epoch()
    if newest is None:
        return RestorePoint(None, "empty")
    problems = pipeline.checkpoints.verify(newest, deep=deep)
    if not problems:
        return _from_metadata(pipeline.checkpoints.read_metadata(newest), "primary", pipeline.storage, [])
    committed = [e for e in pipeline.committed_epochs() if e <= newest]
    log.warning("pipeline %s: checkpoint %d does not verify: %s", pipeline.name, newest, "; ".join(map(str, problems)))
    if not pipeline.config.fallback_enabled:
        raise RecoveryError(_way_out(pipeline, newest, problems, "fallback is disabled (fallback_enabled=false)"))

    if pipeline.config.secondary_url:
        secondary = open_storage(pipeline.config.secondary_url, pipeline.config.storage_options).child(pipeline.name)
        if not pipeline.checkpoints.verify(newest, deep=deep, storage=secondary):
            meta = pipeline.checkpoints.read_metadata(newest, storage=secondary)
            return _from_metadata(meta, "secondary", secondary, problems)

    rebuilt = _rebuild_from_log(pipeline, newest, committed, deep)
    if rebuilt is not None:
        rebuilt.skipped = problems
        return rebuilt

    for older in reversed(committed[:-1]):
        if _published_rows_after(pipeline, older, newest) > 0 or pipeline.txlog.is_retired(older):
            break
        if not pipeline.checkpoints.verify(older, deep=deep):
            return _from_metadata(pipeline.checkpoints.read_metadata(older), "older", pipeline.storage, problems)
    raise RecoveryError(_way_out(pipeline, newest, problems, "no fallback can restore it without risking duplicates"))


def _rebuild_from_log(pipeline: Pipeline, newest: int, committed: list[int], deep: bool) -> RestorePoint | None:
    """Rebuild the restore point of ``newest`` from prepared records, if its keyed state is intact."""
    decision = pipeline.txlog.read_decision(newest)
    if decision is None:
        return None
    try:
        records = [pipeline.txlog.read_prepared(newest, name) for name in decision.participants]
    except CorruptCheckpointError:
        return None
    if any(r is None for r in records):
        return None
    operators: dict[str, OperatorState] = {}
    for record in records:
        assert record is not None
        operators.update(record.operators)
    op_parts = [p for op in operators.values() for p in op.parts()]
    if pipeline.checkpoints.verify_parts(op_parts, deep=deep):
        return None
    # Source state: the union of what every committed epoch consumed, from the log.
    sources: dict[str, list[dict[str, Any]]] = {}
    try:
        for epoch in committed:
            winner = pipeline.txlog.read_decision(epoch)
            for name, attempt in (winner.participants if winner else {}).items():
                rec = pipeline.txlog.read_prepared(epoch, name)
                if rec is None or rec.attempt != attempt:
                    return None
                for source, state in rec.sources.items():
                    sources.setdefault(source, []).append({"epoch": epoch, "offsets": state.offsets})
    except CorruptCheckpointError:
        return None
    return RestorePoint(newest, "rebuilt-from-log", pipeline.storage, operators, {}, sources)


def _published_rows_after(pipeline: Pipeline, older: int, newest: int) -> int:
    total = 0
    for epoch in pipeline.committed_epochs():
        if older < epoch <= newest:
            total += sum(p.rows for p in (pipeline.txlog.read_published(epoch) or []))
    return total


def _way_out(pipeline: Pipeline, epoch: int, problems: list[Problem], why: str) -> str:
    where = pipeline.storage.describe_path(layout.checkpoint_dir(epoch))
    first = problems[0] if problems else Problem(where, "damaged")
    return (
        f"pipeline {pipeline.name!r}: the newest committed checkpoint (epoch {epoch}) cannot be restored: "
        f"{first}; {why}. Way out: restore that file from a backup or a replica (configure secondary_url), "
        f"then run `seatunnel-ckpt verify {pipeline.name}`; nothing was changed in the store."
    )


# -- recovery -----------------------------------------------------------------------------

@dataclass(frozen=True)
class RecoveryAction:
    """One thing recovery did (or, in a dry run, would do)."""

    epoch: int | None
    action: str
    reason: str
    done: bool = False
    error: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "action": self.action, "reason": self.reason, "done": self.done,
                "error": self.error}


@dataclass
class RecoveryReport:
    """Everything one recovery run found and did for one pipeline."""

    pipeline: str
    dry_run: bool
    actions: list[RecoveryAction] = field(default_factory=list)

    @property
    def errors(self) -> list[RecoveryAction]:
        """Actions that failed (the next run retries them)."""
        return [a for a in self.actions if a.error]

    def to_dict(self) -> dict[str, Any]:
        return {"pipeline": self.pipeline, "dry_run": self.dry_run, "actions": [a.to_dict() for a in self.actions]}


def recover(pipeline: Pipeline, dry_run: bool = True, now: float | None = None) -> RecoveryReport:
    """Resolve every unfinished epoch and remove garbage. Safe to run concurrently."""
    now = time.time() if now is None else now
    timeout = pipeline.config.prepared_timeout_s
    report = RecoveryReport(pipeline.name, dry_run)

    def act(epoch: int | None, action: str, reason: str, fn: Any) -> None:
        if dry_run:
            report.actions.append(RecoveryAction(epoch, action, reason))
            return
        try:
            fn()
            report.actions.append(RecoveryAction(epoch, action, reason, done=True))
        except CheckpointError as exc:
            report.actions.append(RecoveryAction(epoch, action, reason, error=str(exc)))
            log.error("pipeline %s: recovery action %s on epoch %s failed: %s", pipeline.name, action, epoch, exc)

    states: dict[int, EpochState] = {}
    # Epochs whose records cannot be read: nothing of theirs is touched (their staging may
    # be the only copy of output a commit decision still has to publish).
    damaged: set[int] = set()
    for epoch in pipeline.epochs():
        try:
            state = pipeline.state(epoch)
            begin = pipeline.txlog.read_begin(epoch) if not state.decided else None
        except CorruptCheckpointError as exc:
            damaged.add(epoch)
            report.actions.append(RecoveryAction(
                epoch, "inspect", "a log record is damaged; the epoch's staging and checkpoint are kept. Way out: "
                f"restore the file from a backup, or, if the epoch is undecided, abort it (`seatunnel-ckpt abort "
                f"{pipeline.name} {epoch}`) so that the next run processes its input again",
                error=str(exc)))
            continue
        states[epoch] = state
        if state is EpochState.COMMITTING:
            act(epoch, "finish-commit", "decided commit, publish not acknowledged",
                lambda e=epoch: pipeline.commit(e))
        elif state is EpochState.ABORTING:
            act(epoch, "finish-abort", "decided abort, cleanup not acknowledged",
                lambda e=epoch: pipeline.abort(e, "recovery finished the abort", by="recovery"))
        elif state in (EpochState.OPEN, EpochState.PREPARED):
            age = now - begin.created_at if begin else timeout + 1
            if age > timeout:
                act(epoch, "abort-timeout", f"{state.value} for {age:.0f}s, over prepared_timeout_s={timeout:g}",
                    lambda e=epoch, s=state: pipeline.abort(
                        e, f"{s.value} past prepared timeout ({timeout:g}s)", by="recovery"))
            else:
                report.actions.append(RecoveryAction(epoch, "wait", f"{state.value} for {age:.0f}s, within timeout"))
    def unknown(epoch: int) -> bool:
        # Not in the listing above, and no ``begin`` now either. An epoch that began after
        # the listing (the pipeline's next run, concurrently) has one, and stages only after.
        if epoch in states or epoch in damaged:
            return False
        try:
            return pipeline.txlog.read_begin(epoch) is None
        except CorruptCheckpointError:
            return False

    for name in pipeline.storage.list_dir(layout.STAGING):
        staged = layout.parse_staging_epoch(name)
        staged_state = states.get(staged) if staged is not None else None
        if staged in damaged:
            continue
        if (staged is None or (staged_state is not None and staged_state.final)
                or (staged_state is None and unknown(staged))):
            act(staged, "drop-staging", f"{layout.STAGING}/{name} is not needed by any open epoch",
                lambda n=name: pipeline.storage.delete(f"{layout.STAGING}/{n}", recursive=True))

    for epoch in pipeline.checkpoints.epochs():
        if states.get(epoch) is EpochState.ABORTED or unknown(epoch):
            act(epoch, "drop-checkpoint", f"{layout.checkpoint_dir(epoch)} belongs to an aborted or unknown epoch",
                lambda e=epoch: pipeline.checkpoints.delete(e))
    if pipeline.storage.protocol in ("file", "local"):
        for f in pipeline.storage.walk("", include_temp=True):
            if f.path.rsplit("/", 1)[-1].startswith(TEMP_PREFIX):
                full = pipeline.storage.full_path(f.path)
                try:
                    import os

                    if now - os.path.getmtime(full) > timeout:
                        act(None, "drop-temp", f"{f.path} is a temp file left by a killed writer",
                            lambda p=f.path: pipeline.storage.delete(p))
                except FileNotFoundError:
                    pass
    return report


# -- retention ----------------------------------------------------------------------------

@dataclass
class RetentionReport:
    """What retention kept and removed for one pipeline."""

    pipeline: str
    dry_run: bool
    kept: list[int] = field(default_factory=list)
    removed_checkpoints: list[int] = field(default_factory=list)
    removed_files: int = 0
    kept_for_reference: int = 0
    #: files in kept checkpoints that nothing references (parts of attempts that lost)
    removed_unreferenced: list[str] = field(default_factory=list)
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"pipeline": self.pipeline, "dry_run": self.dry_run, "kept": self.kept,
                "removed_checkpoints": self.removed_checkpoints, "removed_files": self.removed_files,
                "kept_for_reference": self.kept_for_reference,
                "removed_unreferenced": self.removed_unreferenced, "note": self.note}


def retain(pipeline: Pipeline, max_retain: int | None = None, dry_run: bool = False) -> RetentionReport:
    """Delete old checkpoints, keeping the newest ``max_retain`` committed ones and their bases."""
    if max_retain is not None and (isinstance(max_retain, bool) or not isinstance(max_retain, int)
                                   or max_retain < 1):
        raise ConfigError(f"max_retain must be an integer >= 1 (the newest committed checkpoint is "
                          f"always kept), got {max_retain!r}")
    keep_n = max_retain or pipeline.config.max_retain
    report = RetentionReport(pipeline.name, dry_run)
    committed = pipeline.committed_epochs()
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
    unfinished = {e for e in pipeline.epochs() if not pipeline.state(e).final}
    # An epoch still in flight may have restored from an older checkpoint (a fallback):
    # the parts its prepared records chain onto must outlive this retention run too.
    for epoch in unfinished:
        for record in pipeline.txlog.prepared(epoch).values():
            referenced.update(p.path for op in record.operators.values() for p in op.parts())
            referenced.update(p.path for source in record.sources.values() for p in source.chain)
    for epoch in pipeline.checkpoints.epochs():
        if epoch in kept or epoch in unfinished:
            continue
        root = layout.checkpoint_dir(epoch) + "/"
        keep_here = {p for p in referenced if p.startswith(root)}
        report.kept_for_reference += len(keep_here)
        if epoch in committed and pipeline.txlog.is_retired(epoch) and _holds_only(pipeline, root, keep_here):
            continue  # an earlier run removed it but for parts newer checkpoints reference
        if dry_run:
            report.removed_checkpoints.append(epoch)
            continue
        if epoch in committed:
            pipeline.txlog.retire(epoch)
        removed = pipeline.checkpoints.delete(epoch, keep=keep_here)
        report.removed_files += len(removed)
        report.removed_checkpoints.append(epoch)
    _sweep_losing_parts(pipeline, kept, referenced, report)
    return report


def _holds_only(pipeline: Pipeline, root: str, needed: set[str]) -> bool:
    return all(root + f.path in needed for f in pipeline.storage.walk(root.rstrip("/"), include_temp=True))


def _sweep_losing_parts(pipeline: Pipeline, kept: list[int], referenced: set[str], report: RetentionReport) -> None:
    """Remove files of kept committed checkpoints that no ``_metadata`` or prepared record needs.

    They are parts a losing attempt (killed and retried, or a fenced zombie) wrote before
    the decision: a committed ``_metadata`` names the winner's parts only, and every later
    epoch restores from committed metadata, so nothing can come to reference them.
    """
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
            if not report.dry_run:
                pipeline.storage.delete(path)
                report.removed_files += 1
