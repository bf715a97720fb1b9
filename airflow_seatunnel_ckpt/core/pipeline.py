"""One pipeline's two-phase commit: begin, prepare, decide, commit, abort.

This module is the protocol. Each transition is one method of :class:`Pipeline`, and
each is safe to repeat any number of times and to interleave with a crash at any line:

* :meth:`Pipeline.begin` -- the epoch of a DAG run (idempotent per run id)
* :meth:`Pipeline.prepare` -- a participant's staged output, state parts and consumed
  input become its ``prepared`` record (first attempt wins; stale attempts are fenced)
* :meth:`Pipeline.decide` -- the single ``decision`` record; for commit, the checkpoint's
  ``_metadata`` is completed first
* :meth:`Pipeline.commit` -- publish every sink of the epoch, then ``committed``
  (roll forward only: it never deletes published output)
* :meth:`Pipeline.abort` -- ``decision: abort`` unless already committed, remove staging
  and the uncommitted checkpoint, then ``aborted``
"""

from __future__ import annotations

import json
import logging
import posixpath
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_seatunnel_ckpt.core import codec, layout
from airflow_seatunnel_ckpt.core.checkpoint import (
    CheckpointManager,
    Problem,
    needs_full,
    read_json_part,
    write_json_part,
)
from airflow_seatunnel_ckpt.core.config import CheckpointConfig, redact_url
from airflow_seatunnel_ckpt.core.errors import (
    CheckpointError,
    ConfigError,
    DecisionConflictError,
    EpochNotFoundError,
    FencedAttemptError,
    InvalidNameError,
    NotPreparedError,
    PublishError,
    StorageError,
)
from airflow_seatunnel_ckpt.core.models import (
    BeginRecord,
    CheckpointMetadata,
    Decision,
    DecisionRecord,
    EpochState,
    EpochStatus,
    OperatorState,
    PartRef,
    PreparedRecord,
    PublishedSink,
    SinkManifest,
    SourceState,
)
from airflow_seatunnel_ckpt.core.names import validate_attempt, validate_epoch, validate_name
from airflow_seatunnel_ckpt.core.storage import (
    TEMP_PREFIX,
    FileInfo,
    Storage,
    clean_relpath,
    open_storage,
    refuse_password,
)
from airflow_seatunnel_ckpt.core.txlog import TransactionLog

if TYPE_CHECKING:
    from airflow_seatunnel_ckpt.core.recovery import RecoveryReport, RestorePoint, RetentionReport

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CommitResult:
    """What :meth:`Pipeline.commit` published (or found already published)."""

    epoch: int
    sinks: list[PublishedSink]
    already_committed: bool = False

    @property
    def rows(self) -> int:
        """Rows published over every sink."""
        return sum(s.rows for s in self.sinks)

    def to_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "already_committed": self.already_committed,
                "sinks": [s.to_dict() for s in self.sinks]}


def _inside_pipeline(path: str, what: str) -> str:
    """``path`` normalised, if it stays inside the pipeline's directory; else InvalidNameError."""
    try:
        return clean_relpath(path)
    except StorageError as exc:
        raise InvalidNameError(f"{what}: {exc}") from None


class Pipeline:
    """The checkpoints, transaction log and staging of one pipeline in a store."""

    def __init__(self, root: Storage, name: str, config: CheckpointConfig,
                 target_options: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        self.name = validate_name(name, "pipeline name")
        self.config = config
        self.storage = root.child(self.name)
        self.txlog = TransactionLog(self.storage, self.name, config.max_chunk_bytes)
        self.checkpoints = CheckpointManager(self.storage, config.max_chunk_bytes)
        self._target_options = {k: dict(v) for k, v in (target_options or {}).items()}
        self._codec_options = {"level": config.compression_level,
                               "compression": codec.Codec.ZSTD if config.compression == "zstd" else codec.Codec.LZ4}

    def __repr__(self) -> str:
        return f"Pipeline({self.name!r} in {self.storage.describe()})"

    # -- reading the log ---------------------------------------------------------------
    def begin(self, run_id: str) -> BeginRecord:
        """The epoch of DAG run ``run_id`` (allocated on first call, the same ever after)."""
        record = self.txlog.begin(run_id)
        log.info("pipeline %s: run %s has epoch %d", self.name, run_id, record.epoch)
        return record

    def epoch_for_run(self, run_id: str) -> int | None:
        """The epoch already given to ``run_id``, or None (never allocates)."""
        return self.txlog.epoch_for_run(run_id)

    def status(self, epoch: int) -> EpochStatus:
        """Everything the log says about ``epoch``."""
        return self.txlog.status(epoch)

    def state(self, epoch: int) -> EpochState:
        """The epoch's state (cheap: one listing, at most one read)."""
        return self.txlog.state(validate_epoch(epoch))

    def epochs(self) -> list[int]:
        """Every epoch in the log, ascending."""
        return self.txlog.epochs()

    def list_epochs(self) -> list[EpochStatus]:
        """Status of every epoch, ascending."""
        return [self.txlog.status(e) for e in self.txlog.epochs()]

    def committed_epochs(self) -> list[int]:
        """Committed epochs, ascending."""
        return [e for e in self.txlog.epochs() if self.txlog.state(e) is EpochState.COMMITTED]

    def last_committed_epoch(self) -> int | None:
        """The newest committed epoch, or None."""
        for epoch in reversed(self.txlog.epochs()):
            if self.txlog.state(epoch) is EpochState.COMMITTED:
                return epoch
        return None

    # -- staging -----------------------------------------------------------------------
    def staging_path(self, epoch: int, attempt: int, sink: str) -> str:
        """Where ``attempt`` stages ``sink`` (relative to the pipeline root)."""
        return layout.staging_dir(epoch, attempt, sink)

    def staging_url(self, epoch: int, attempt: int, sink: str) -> str:
        """Full URL of the staging directory, for the Spark writer."""
        return self.storage.url_of(self.staging_path(epoch, attempt, sink))

    def manifest_for_staged(self, epoch: int, attempt: int, sink: str, target_url: str, rows: int,
                            fmt: str = "parquet") -> SinkManifest:
        """List what an attempt staged for ``sink`` as a manifest (data files only).

        Files whose name starts with ``_`` or ``.`` (``_SUCCESS``, Hadoop ``.crc``) are
        bookkeeping of the writer and are not published. Each file's CRC32C is recorded,
        so the commit decision can prove that exactly these bytes get published.
        """
        staging = self.staging_path(epoch, attempt, sink)
        files = [FileInfo(f.path, f.size, self.storage.checksum(f"{staging}/{f.path}"))
                 for f in self.storage.walk(staging)
                 if not any(seg.startswith(("_", ".")) for seg in f.path.split("/"))]
        return SinkManifest(validate_name(sink, "sink name"), target_url, staging, files, rows, fmt)

    # -- restore -----------------------------------------------------------------------
    def restore_point(self, deep: bool = True) -> RestorePoint:
        """Where a new epoch's state restores from: see :func:`recovery.restore_point`."""
        from airflow_seatunnel_ckpt.core.recovery import restore_point

        return restore_point(self, deep=deep)

    def recover(self, dry_run: bool = True, now: float | None = None) -> RecoveryReport:
        """Resolve unfinished epochs and remove garbage: see :func:`recovery.recover`."""
        from airflow_seatunnel_ckpt.core.recovery import recover

        return recover(self, dry_run=dry_run, now=now)

    def retain(self, max_retain: int | None = None, dry_run: bool = False) -> RetentionReport:
        """Delete old checkpoints: see :func:`recovery.retain`."""
        from airflow_seatunnel_ckpt.core.recovery import retain

        return retain(self, max_retain=max_retain, dry_run=dry_run)

    def source_history(self, chain: list[PartRef], storage: Storage | None = None) -> list[dict[str, Any]]:
        """Every committed offsets entry of a source chain, oldest first."""
        storage = storage or self.storage
        entries: list[dict[str, Any]] = []
        for ref in chain:
            doc = read_json_part(storage, ref)
            items = doc.get("entries") if isinstance(doc, dict) else None
            if not isinstance(items, list):
                raise StorageError(f"{storage.describe_path(ref.path)}: source part has no 'entries' list")
            entries.extend(items)
        return entries

    # -- prepare -----------------------------------------------------------------------
    def fix_inputs(self, epoch: int, participant: str, attempt: int,
                   make_plan: Callable[[], dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
        """The input ``participant`` reads in ``epoch``: fixed by its first attempt.

        ``make_plan`` (e.g. "list the files not consumed yet") runs only when no attempt
        has fixed a plan; a retry gets the stored plan back, so it re-reads exactly the
        same input whatever has arrived since. The plan is a write-ahead record: it is
        durable before any output is staged.
        """
        validate_epoch(epoch)
        self.txlog._require_undecided(epoch, f"attempt {attempt} of {participant!r} cannot plan its input")
        stored = self.txlog.read_plan(epoch, participant)
        if stored is not None:
            return stored
        return self.txlog.fix_plan(epoch, participant, attempt, make_plan())

    def prepare(
        self,
        epoch: int,
        participant: str,
        attempt: int,
        *,
        run_id: str,
        sinks: list[SinkManifest],
        operators: Mapping[str, OperatorState] | None = None,
        sources: Mapping[str, Mapping[str, Any]] | None = None,
        base: RestorePoint | None = None,
    ) -> PreparedRecord:
        """Phase one for one participant: record its staged output, state and input.

        ``sources`` maps source name to the offsets consumed this epoch (the WAL entry);
        ``operators`` maps operator name to its key-group chains (parts already written by
        the executors); ``base`` is the restore point the stage started from.
        Idempotent for the same attempt; another attempt gets :class:`FencedAttemptError`.
        """
        validate_epoch(epoch)
        validate_attempt(attempt)
        validate_name(participant, "participant name")
        existing = self.txlog.read_prepared(epoch, participant)
        if existing is not None:
            if existing.attempt == attempt:
                self._write_markers(existing)
                return existing
            raise FencedAttemptError(
                f"pipeline {self.name!r} epoch {epoch}: participant {participant!r} was already prepared by "
                f"attempt {existing.attempt}; attempt {attempt} is stale")
        self.txlog._require_undecided(epoch, f"attempt {attempt} of {participant!r} cannot prepare")
        begin = self.txlog.read_begin(epoch)
        if begin is None:
            raise EpochNotFoundError(f"pipeline {self.name!r} has no epoch {epoch}; call begin(run_id) first")
        if begin.run_id != run_id:
            raise FencedAttemptError(
                f"pipeline {self.name!r} epoch {epoch} belongs to run {begin.run_id!r}, not {run_id!r}")
        # Everything the record will name is checked before anything is written: bad input
        # gets its error with the store unchanged.
        for sink in sinks:
            validate_name(sink.sink, "sink name")
            try:
                refuse_password(sink.target_url, f"sink {sink.sink!r} target URL")
            except StorageError as exc:
                raise ConfigError(str(exc)) from None
            own = layout.staging_dir(epoch, attempt, sink.sink)
            staging = _inside_pipeline(sink.staging, f"sink {sink.sink!r} staging directory")
            if staging != own and not staging.startswith(own + "/"):
                raise FencedAttemptError(
                    f"sink {sink.sink!r} staged at {sink.staging!r}, outside attempt {attempt}'s staging {own!r}")
            for f in sink.files:
                if not _inside_pipeline(f.path, f"sink {sink.sink!r} staged file"):
                    raise InvalidNameError(f"sink {sink.sink!r}: a staged file has an empty path")
        for name, state in (operators or {}).items():
            validate_name(name, "operator name")
            for ref in state.parts():
                _inside_pipeline(ref.path, f"operator {name!r} part")
        for name in sources or {}:
            validate_name(name, "source name")
        source_states = {
            validate_name(name, "source name"): self._write_source_part(
                epoch, attempt, name, dict(offsets), base)
            for name, offsets in (sources or {}).items()
        }
        record = PreparedRecord(epoch, participant, attempt, run_id, time.time(), list(sinks),
                                dict(operators or {}), source_states, base.epoch if base else None)
        problems = self._verify_record(record, deep=False)
        if problems:
            raise NotPreparedError(
                f"pipeline {self.name!r} epoch {epoch}: cannot prepare {participant!r}: "
                + "; ".join(map(str, problems[:5])))
        stored = self.txlog.write_prepared(record)
        self._write_markers(stored)
        log.info("pipeline %s epoch %d: %s attempt %d prepared (%d rows in %d sinks)",
                 self.name, epoch, participant, attempt, stored.rows, len(stored.sinks))
        return stored

    def _write_source_part(self, epoch: int, attempt: int, source: str, offsets: dict[str, Any],
                           base: RestorePoint | None) -> SourceState:
        chain = list(base.source_chains.get(source, [])) if base else []
        rebuilt = base is not None and source in base.rebuilt_sources
        entry = {"epoch": epoch, "offsets": offsets}
        path = layout.part_path(epoch, "sources", source, 0, attempt)
        if rebuilt or needs_full(chain, self.config.incremental, self.config.full_checkpoint_interval):
            entries = base.source_entries(self, source) if base else []
            ref = write_json_part(self.storage, path, {"entries": entries + [entry]}, epoch=epoch,
                                  **self._codec_options)
            return SourceState(offsets, [ref])
        ref = write_json_part(self.storage, path, {"entries": [entry]}, epoch=epoch, delta=True,
                              base_epoch=chain[-1].epoch, **self._codec_options)
        return SourceState(offsets, chain + [ref])

    def _write_markers(self, record: PreparedRecord) -> tuple[dict[str, PartRef], dict[str, PartRef]]:
        """Write the checkpoint's ``sinks/<sink>/_prepared`` and ``sources/<s>/_meta`` files.

        They are derived from the prepared record (deterministic bytes), so rewriting them
        after a crash is harmless; the record itself is the fence. Returns their references
        (sinks, sources) for ``_metadata``, so ``verify`` checks them like any part.
        """
        def write(path: str, doc: dict[str, Any]) -> PartRef:
            data = codec.encode_json(doc)
            self.storage.write_atomic(path, data)
            return PartRef(path, len(data), codec.crc32c(data), record.epoch)

        sinks = {
            sink.sink: write(layout.sink_marker_path(record.epoch, sink.sink),
                             {"type": "sink_prepared", "epoch": record.epoch, "participant": record.participant,
                              "attempt": record.attempt, "manifest": sink.to_dict()})
            for sink in record.sinks}
        sources = {
            source: write(layout.source_meta_path(record.epoch, source),
                          {"type": "source_meta", "epoch": record.epoch, "source": source,
                           "attempt": record.attempt, "chain": [p.to_dict() for p in state.chain]})
            for source, state in record.sources.items()}
        return sinks, sources

    def _verify_record(self, record: PreparedRecord, deep: bool) -> list[Problem]:
        parts = [p for op in record.operators.values() for p in op.parts()]
        parts += [p for s in record.sources.values() for p in s.chain]
        problems = self.checkpoints.verify_parts(parts, deep=deep)
        for sink in record.sinks:
            for f in sink.files:
                path = f"{sink.staging}/{f.path}"
                # FileNotFoundError at either step: missing, or removed meanwhile by an
                # abort that won the decision while this verification ran.
                try:
                    size = self.storage.size(path)
                    wrong_crc = (size == f.size and deep and f.crc32c is not None
                                 and self.storage.checksum(path) != f.crc32c)
                except FileNotFoundError:
                    problems.append(Problem(self.storage.describe_path(path), "staged file is missing"))
                    continue
                if size != f.size:
                    problems.append(Problem(self.storage.describe_path(path),
                                            f"staged file is {size} bytes, manifest says {f.size}"))
                elif wrong_crc:
                    problems.append(Problem(self.storage.describe_path(path),
                                            "staged file's checksum does not match the manifest"))
        return problems

    def verify_prepared(self, epoch: int, participants: list[str] | None = None,
                        deep: bool = True) -> list[Problem]:
        """Problems with the prepared participants of ``epoch`` ([] = ready to commit).

        With ``participants``, a participant that has not prepared is a problem too.
        """
        prepared = self.txlog.prepared(validate_epoch(epoch))
        problems = []
        for name in participants or []:
            if name not in prepared:
                where = self.storage.describe_path(layout.txlog_dir(epoch))
                problems.append(Problem(where, f"{name!r} is not prepared"))
        for name, record in sorted(prepared.items()):
            if participants is None or name in participants:
                problems += self._verify_record(record, deep)
        return problems

    # -- decide ------------------------------------------------------------------------
    def decide(self, epoch: int, decision: Decision, reason: str, by: str = "",
               participants: list[str] | None = None) -> DecisionRecord:
        """Create the epoch's one decision; returns the winner (possibly not ``decision``).

        For commit, every participant in ``participants`` (default: all prepared) must be
        prepared and verify, and the checkpoint's ``_metadata`` is completed first.
        """
        validate_epoch(epoch)
        existing = self.txlog.read_decision(epoch)
        if existing is not None:
            return existing
        winners: dict[str, int] = {}
        if decision is Decision.COMMIT:
            try:
                meta = self._complete_checkpoint(epoch, participants)
            except CheckpointError:
                # A concurrent abort may have won meanwhile and removed the staging being
                # verified or the checkpoint directory being completed: its decision is
                # the answer, not a "does not verify" or storage error.
                existing = self.txlog.read_decision(epoch)
                if existing is not None:
                    return existing
                raise
            winners = dict(meta.participants)
        record = self.txlog.decide(DecisionRecord(epoch, decision, reason, by, time.time(), winners))
        log.info("pipeline %s epoch %d: decision %s by %s (%s)", self.name, epoch, record.decision.value,
                 record.by, record.reason)
        return record

    def _complete_checkpoint(self, epoch: int, participants: list[str] | None) -> CheckpointMetadata:
        prepared = self.txlog.prepared(epoch)
        chosen = sorted(prepared) if participants is None else sorted(set(participants))
        missing = [p for p in chosen if p not in prepared]
        if not chosen or missing:
            raise NotPreparedError(
                f"pipeline {self.name!r} epoch {epoch}: cannot commit, not prepared: "
                f"{missing or 'no participant'}; wait for the stage(s) or abort the epoch")
        problems = self.verify_prepared(epoch, chosen, deep=True)
        if problems:
            raise NotPreparedError(
                f"pipeline {self.name!r} epoch {epoch}: cannot commit, prepared output does not verify: "
                + "; ".join(map(str, problems[:5])) + "; abort the epoch so its input is processed again")
        records = [prepared[p] for p in chosen]
        operators: dict[str, OperatorState] = {}
        sources: dict[str, SourceState] = {}
        sinks: dict[str, PartRef] = {}
        source_metas: dict[str, PartRef] = {}
        for record in records:
            for kind, target, items in (("operator", operators, record.operators),
                                        ("source", sources, record.sources)):
                for name, value in items.items():
                    if name in target:
                        raise NotPreparedError(f"epoch {epoch}: {kind} {name!r} is prepared by two participants")
                    target[name] = value  # type: ignore[assignment]
            sink_markers, source_markers = self._write_markers(record)
            source_metas.update(source_markers)  # sources are unique across participants (above)
            for name, ref in sink_markers.items():
                if name in sinks:
                    raise NotPreparedError(f"epoch {epoch}: sink {name!r} is prepared by two participants")
                sinks[name] = ref
        bases = {r.base_epoch for r in records if r.base_epoch is not None}
        meta = CheckpointMetadata(
            epoch=epoch, created_at=time.time(), run_id=records[0].run_id,
            participants={r.participant: r.attempt for r in records},
            base_epoch=max(bases) if bases else None, operators=operators, sources=sources, sinks=sinks,
            source_metas=source_metas)
        return self.checkpoints.complete(meta)

    # -- commit ------------------------------------------------------------------------
    def commit(self, epoch: int) -> CommitResult:
        """Phase two: publish every sink of a commit-decided epoch, then ``committed``.

        Idempotent; already-published files are recognised by size. A failure leaves the
        epoch COMMITTING for the next retry or the recovery DAG -- nothing is deleted.
        """
        validate_epoch(epoch)
        decision = self.txlog.read_decision(epoch)
        if decision is None:
            raise NotPreparedError(f"pipeline {self.name!r} epoch {epoch} is undecided; decide commit first")
        if decision.decision is not Decision.COMMIT:
            raise DecisionConflictError(
                f"pipeline {self.name!r} epoch {epoch} was decided abort ({decision.reason}); it cannot commit")
        already = self.txlog.read_published(epoch)
        if already is not None:
            self._drop_staging(epoch)
            return CommitResult(epoch, already, already_committed=True)
        published = []
        for name, attempt in sorted(decision.participants.items()):
            record = self.txlog.read_prepared(epoch, name)
            if record is None or record.attempt != attempt:
                raise PublishError(
                    f"pipeline {self.name!r} epoch {epoch}: the prepared record of {name!r} attempt {attempt} "
                    "that the decision names is missing; restore it from a backup of the store")
            for sink in record.sinks:
                published.append(self._publish_sink(epoch, sink))
        self._replicate(epoch)
        self.txlog.acknowledge_committed(epoch, published)
        self._drop_staging(epoch)
        log.info("pipeline %s epoch %d: committed %s", self.name, epoch,
                 ", ".join(f"{p.sink}={p.rows} rows/{p.files} files" for p in published))
        return CommitResult(epoch, published)

    def target_storage(self, target_url: str) -> Storage:
        """Storage for a sink's target; reuses the store's options for the same protocol."""
        options = self._target_options.get(target_url)
        if options is None:
            same = target_url.split("://", 1)[0] == self.storage.url.split("://", 1)[0]
            options = self.storage.storage_options if same else {}
        return open_storage(target_url, options)

    def _publish_sink(self, epoch: int, sink: SinkManifest) -> PublishedSink:
        target = self.target_storage(sink.target_url)
        dst = layout.published_dir(epoch)
        how = ""
        delay = 0.05
        summary = {"pipeline": self.name, "epoch": epoch, "sink": sink.sink, "rows": sink.rows,
                   "bytes": sink.bytes, "files": [{"path": f.path, "size": f.size} for f in sink.files]}
        for attempt in range(self.config.max_retries + 1):
            try:
                # verify=False: decide() checked size and CRC32C of exactly these files,
                # and nothing writes into a prepared attempt's staging any more (stale
                # attempts have their own directories), so a local publish stays one
                # rename whatever the number of files.
                how = self.storage.publish_dir(sink.staging, target, dst, sink.files, verify=False)
                # A publisher killed while writing into the epoch directory (the _SUCCESS
                # mark, a copied file) left a temp file in the user-visible output. The
                # directory belongs to this epoch alone, so any temp in it is such debris;
                # a concurrent publisher whose temp this removes retries through this loop.
                for f in target.walk(dst, include_temp=True):
                    if posixpath.basename(f.path).startswith(TEMP_PREFIX):
                        target.delete(f"{dst}/{f.path}")
                target.write_atomic(f"{dst}/{layout.SUCCESS}", json.dumps(summary, indent=1).encode())
                break
            except PublishError:
                raise
            except StorageError:
                if attempt == self.config.max_retries:
                    raise
                time.sleep(delay)
                delay *= 2
        return PublishedSink(sink.sink, redact_url(sink.target_url), dst, len(sink.files), sink.rows, sink.bytes, how)

    def _replicate(self, epoch: int) -> None:
        if not self.config.secondary_url:
            return
        from airflow_seatunnel_ckpt.core.storage import copy_file

        secondary = open_storage(self.config.secondary_url, self.config.storage_options).child(self.name)
        root = layout.checkpoint_dir(epoch)
        # ``_metadata`` last, as on the primary: a crash mid-copy must not leave a replica
        # checkpoint that claims to be complete while parts are missing.
        for f in sorted(self.storage.walk(root), key=lambda f: f.path == layout.METADATA):
            path = f"{root}/{f.path}"
            try:
                if secondary.size(path) == f.size:
                    continue
            except FileNotFoundError:
                pass
            copy_file(self.storage, path, secondary, path)

    def _drop_staging(self, epoch: int) -> None:
        self.storage.delete(layout.staging_epoch_dir(epoch), recursive=True)

    # -- abort -------------------------------------------------------------------------
    def abort(self, epoch: int, reason: str, by: str = "") -> DecisionRecord:
        """Abort ``epoch`` unless it is already decided commit (DecisionConflictError).

        Removes every attempt's staging and the uncommitted checkpoint directory, then
        writes ``aborted``. Safe to repeat.
        """
        validate_epoch(epoch)
        record = self.txlog.decide(DecisionRecord(epoch, Decision.ABORT, reason, by, time.time()))
        if record.decision is Decision.COMMIT:
            raise DecisionConflictError(
                f"pipeline {self.name!r} epoch {epoch} is already decided commit ({record.reason}); it will not "
                "be aborted -- commit rolls it forward")
        self._drop_staging(epoch)
        self.storage.delete(layout.checkpoint_dir(epoch), recursive=True)
        self.txlog.acknowledge_aborted(epoch)
        log.info("pipeline %s epoch %d: aborted (%s)", self.name, epoch, record.reason)
        return record
