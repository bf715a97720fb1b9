"""Where a new epoch's state restores from (:func:`restore_point`: the newest committed checkpoint
that verifies, else its replica, a rebuild from the log, or an older checkpoint that cannot
duplicate output), and the secondary replica of committed checkpoints."""

from __future__ import annotations

import contextlib
import enum
import logging
from dataclasses import dataclass, field
from typing import Any

from airflow_seatunnel_ckpt.core import layout
from airflow_seatunnel_ckpt.core.config import CheckpointConfig
from airflow_seatunnel_ckpt.core.errors import CheckpointError, CorruptCheckpointError, RecoveryError
from airflow_seatunnel_ckpt.core.models import CheckpointMetadata, OperatorState, PartRef
from airflow_seatunnel_ckpt.core.protocol.txlog import TransactionLog
from airflow_seatunnel_ckpt.core.sources.source_log import Entry, read_history
from airflow_seatunnel_ckpt.core.state.checkpoint import CheckpointManager, Problem
from airflow_seatunnel_ckpt.core.storage import Storage, copy_file, open_storage

log = logging.getLogger(__name__)


def secondary_storage(config: CheckpointConfig, pipeline: str) -> Storage | None:
    """The pipeline's directory in the secondary store, or None when none is configured."""
    if not config.secondary_url:
        return None
    return open_storage(config.secondary_url, config.storage_options).child(pipeline)


def replicate(primary: Storage, secondary: Storage, epoch: int) -> None:
    """Copy checkpoint ``epoch`` to ``secondary``; files already there with their size are kept."""
    root = layout.checkpoint_dir(epoch)
    # ``_metadata`` last, as on the primary: a crash mid-copy must not leave a replica
    # checkpoint that claims to be complete while parts are missing.
    for f in sorted(primary.walk(root), key=lambda f: f.path == layout.METADATA):
        path = f"{root}/{f.path}"
        with contextlib.suppress(FileNotFoundError):
            if secondary.size(path) == f.size:
                continue
        copy_file(primary, path, secondary, path)


class RestoreSource(enum.StrEnum):
    """Where a restore point came from (``RestorePoint.how``)."""

    EMPTY = "empty"  #: nothing committed yet
    PRIMARY = "primary"  #: the newest committed checkpoint
    SECONDARY = "secondary"  #: its replica in the secondary store
    REBUILT = "rebuilt-from-log"  #: metadata or source state rebuilt from prepared records
    OLDER = "older"  #: an older checkpoint; the epochs in between published nothing


@dataclass
class RestorePoint:
    """The state a new epoch starts from: keyed state chains and source histories."""

    epoch: int | None
    how: RestoreSource
    storage: Storage | None = None
    operators: dict[str, OperatorState] = field(default_factory=dict)
    source_chains: dict[str, list[PartRef]] = field(default_factory=dict)
    rebuilt_sources: dict[str, list[Entry]] = field(default_factory=dict)
    skipped: list[Problem] = field(default_factory=list)

    def source_entries(self, source: str) -> list[Entry]:
        """Every committed ``{"epoch", "offsets"}`` entry of ``source``, oldest first."""
        if source in self.rebuilt_sources:
            return list(self.rebuilt_sources[source])
        chain = self.source_chains.get(source)
        if not chain or self.storage is None:
            return []
        return read_history(self.storage, chain)

    def to_dict(self) -> dict[str, Any]:
        """A summary for logs and ``--json`` output."""
        return {"epoch": self.epoch, "how": self.how.value,
                "storage": self.storage.describe() if self.storage else None,
                "operators": sorted(self.operators),
                "sources": sorted(set(self.source_chains) | set(self.rebuilt_sources)),
                "skipped": [str(p) for p in self.skipped]}


def restore_point(txlog: TransactionLog, checkpoints: CheckpointManager, config: CheckpointConfig,
                  deep: bool = True) -> RestorePoint:
    """Choose the restore point of the pipeline whose log is ``txlog``; ``deep``: check each part's
    CRC32C and frame, not only its size."""
    # The common case costs one listing of the log plus the newest epochs' records, however
    # many epochs there are; the whole committed history is read only for a fallback.
    newest = txlog.last_committed_epoch()
    if newest is None:
        return RestorePoint(None, RestoreSource.EMPTY)
    problems = checkpoints.verify(newest, deep=deep, decode=False)
    if not problems:
        return _from_metadata(checkpoints.read_metadata(newest), RestoreSource.PRIMARY, checkpoints.storage, [])
    log.warning("pipeline %s: checkpoint %d does not verify: %s", txlog.pipeline, newest,
                "; ".join(map(str, problems)))
    if not config.fallback_enabled:
        raise RecoveryError(_way_out(checkpoints.storage, txlog.pipeline, newest, problems,
                                     "fallback is disabled (fallback_enabled=false)"))
    committed = [e for e in txlog.committed_epochs() if e <= newest]
    return (_from_secondary(txlog.pipeline, checkpoints, config, newest, deep, problems)
            or _rebuild_from_log(txlog, checkpoints, newest, committed, deep, problems)
            or _from_older(txlog, checkpoints, newest, committed, deep, problems))


def restore_point_at(checkpoints: CheckpointManager, epoch: int) -> RestorePoint:
    """What a replay starts from: committed epoch ``epoch``'s primary checkpoint, verified
    (CheckpointError naming its problems if not)."""
    problems = checkpoints.verify(epoch, deep=True, decode=False)
    if problems:
        raise CheckpointError(
            f"{checkpoints.storage.describe_path(f'checkpoint_{epoch}')}: checkpoint {epoch} cannot be restored "
            f"({'; '.join(map(str, problems[:3]))}); it may have been removed by retention (max_retain)")
    return _from_metadata(checkpoints.read_metadata(epoch), RestoreSource.PRIMARY, checkpoints.storage, [])


def _from_metadata(meta: CheckpointMetadata, how: RestoreSource, storage: Storage,
                   skipped: list[Problem]) -> RestorePoint:
    return RestorePoint(meta.epoch, how, storage, dict(meta.operators),
                        {k: list(v.chain) for k, v in meta.sources.items()}, {}, skipped)


def _from_secondary(pipeline: str, checkpoints: CheckpointManager, config: CheckpointConfig, newest: int,
                    deep: bool, problems: list[Problem]) -> RestorePoint | None:
    secondary = secondary_storage(config, pipeline)
    if secondary is None or checkpoints.verify(newest, deep=deep, storage=secondary, decode=False):
        return None
    meta = checkpoints.read_metadata(newest, storage=secondary)
    return _from_metadata(meta, RestoreSource.SECONDARY, secondary, problems)


def _rebuild_from_log(txlog: TransactionLog, checkpoints: CheckpointManager, newest: int, committed: list[int],
                      deep: bool, problems: list[Problem]) -> RestorePoint | None:
    """Rebuild the restore point of ``newest`` from prepared records, if its keyed state is intact."""
    try:
        records = txlog.winning_records(newest) if txlog.read_decision(newest) is not None else None
    except CorruptCheckpointError:
        return None
    if not records:
        return None
    operators: dict[str, OperatorState] = {}
    for record in records:
        operators.update(record.operators)
    if checkpoints.verify_parts([p for op in operators.values() for p in op.parts()], deep=deep, decode=False):
        return None
    # Source state: the union of what every committed epoch consumed, from the log.
    sources: dict[str, list[Entry]] = {}
    try:
        for epoch in committed:
            winners = txlog.winning_records(epoch)
            if winners is None:
                return None
            for rec in winners:
                for source, state in rec.sources.items():
                    sources.setdefault(source, []).append({"epoch": epoch, "offsets": state.offsets})
    except CorruptCheckpointError:
        return None
    return RestorePoint(newest, RestoreSource.REBUILT, checkpoints.storage, operators, {}, sources, problems)


def _from_older(txlog: TransactionLog, checkpoints: CheckpointManager, newest: int, committed: list[int],
                deep: bool, problems: list[Problem]) -> RestorePoint:
    # Walking back, the rows published after ``older`` only grow by the epoch just left
    # behind: one running sum reads each ``committed`` record once (not once per candidate).
    published_after = 0
    later = newest
    for older in reversed(committed[:-1]):
        published_after += _published_rows(txlog, later)
        later = older
        if published_after > 0 or txlog.is_retired(older):
            break
        if not checkpoints.verify(older, deep=deep, decode=False):
            return _from_metadata(checkpoints.read_metadata(older), RestoreSource.OLDER, checkpoints.storage,
                                  problems)
    raise RecoveryError(_way_out(checkpoints.storage, txlog.pipeline, newest, problems,
                                 "no fallback can restore it without risking duplicates"))


def _published_rows(txlog: TransactionLog, epoch: int) -> int:
    return sum(p.rows for p in (txlog.read_published(epoch) or []))


def _way_out(storage: Storage, pipeline: str, epoch: int, problems: list[Problem], why: str) -> str:
    where = storage.describe_path(layout.checkpoint_dir(epoch))
    first = problems[0] if problems else Problem(where, "damaged")
    return (f"pipeline {pipeline!r}: the newest committed checkpoint (epoch {epoch}) cannot be restored: "
            f"{first}; {why}. Way out: restore that file from a backup or a replica (configure secondary_url), "
            f"then run `seatunnel-ckpt verify {pipeline}`; nothing was changed in the store.")
