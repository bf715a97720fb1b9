"""The protocol: one pipeline's two-phase commit, one method of :class:`Pipeline` per transition
(begin, pin_inputs, prepare, decide, commit, abort), each safe to repeat and to interleave with a
crash at any line. Every sink is asked alike through the sink contract (:mod:`core.sinks.base`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_seatunnel_ckpt.core import layout
from airflow_seatunnel_ckpt.core.config import CheckpointConfig, redact_url
from airflow_seatunnel_ckpt.core.errors import (
    CheckpointError,
    ConfigError,
    CorruptCheckpointError,
    DecisionConflictError,
    EpochNotFoundError,
    FencedAttemptError,
    NotPreparedError,
    PublishError,
    SinkRefusedError,
)
from airflow_seatunnel_ckpt.core.layout import validate_attempt, validate_epoch, validate_name
from airflow_seatunnel_ckpt.core.models import (
    EMPTY,
    NOT_WRITTEN,
    SKIPPED,
    ActionOutcome,
    BeginRecord,
    CheckpointMetadata,
    CommitResult,
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
    unprepared,
)
from airflow_seatunnel_ckpt.core.protocol import expectations, restore, staging
from airflow_seatunnel_ckpt.core.protocol.restore import RestorePoint, restore_point
from airflow_seatunnel_ckpt.core.protocol.txlog import ACTION_PREFIX, TransactionLog
from airflow_seatunnel_ckpt.core.sinks import SinkCommit, commit_sink, held_epoch, precheck_sink
from airflow_seatunnel_ckpt.core.sinks.base import store_id
from airflow_seatunnel_ckpt.core.sources import source_log
from airflow_seatunnel_ckpt.core.state.checkpoint import CheckpointManager, Problem, write_json_part
from airflow_seatunnel_ckpt.core.storage import Storage, open_storage
from airflow_seatunnel_ckpt.core.storage.publish import PublishMethod

if TYPE_CHECKING:
    from airflow_seatunnel_ckpt.core.protocol.descriptor import PipelineDescriptor

log = logging.getLogger(__name__)

# How the reasons of abort decisions that refused the epoch start: a sink refused it, or a
# check of the commit branch failed (``min_rows``/``max_rows``, ``check``, expectations).
SINK_REFUSED = "commit refused by a sink: "
CHECK_FAILED = "check failed: "
REFUSALS = (CHECK_FAILED, expectations.REFUSED, SINK_REFUSED)
#: The action that lets a COMMITTING epoch commit without one sink (:meth:`Pipeline.skip_sink`).
SKIP_SINK = "skip-sink"


def is_refusal(decision: DecisionRecord | None) -> bool:
    """Whether ``decision`` aborted its epoch because a check, an expectation or a sink refused its
    rows: its input is then *held back* (every later epoch reads it again, and is refused again)."""
    return (decision is not None and decision.decision is Decision.ABORT
            and decision.reason.startswith(REFUSALS))


@dataclass(frozen=True)
class HeldBack:
    """The epochs refused since the newest commit (see :meth:`Pipeline.held_back`)."""

    since: int  #: the oldest refused epoch after the newest committed one
    runs: int
    newest: int
    reason: str  #: why the newest one was refused

    def describe(self) -> str:
        """``input held back since epoch 4 (3 runs); epoch 6: <why epoch 6 was refused>``."""
        return (f"input held back since epoch {self.since} ({self.runs} run{'s' if self.runs != 1 else ''}); "
                f"epoch {self.newest}: {self.reason}")


class Pipeline:
    """The checkpoints, transaction log and staging of one pipeline in a store."""

    def __init__(self, root: Storage, name: str, config: CheckpointConfig,
                 target_options: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        self.name = validate_name(name, "pipeline name")
        self.config = config
        #: The store's root (where the pipelines and the store id live).
        self.root = root
        self.storage = root.child(self.name)
        self.txlog = TransactionLog(self.storage, self.name, config.max_chunk_bytes)
        self.checkpoints = CheckpointManager(self.storage, config.max_chunk_bytes)
        self._target_options = {k: dict(v) for k, v in (target_options or {}).items()}

    def __repr__(self) -> str:
        return f"Pipeline({self.name!r} in {self.storage.describe()})"

    # -- the descriptor ----------------------------------------------------------------
    def descriptor(self, refresh: bool = False) -> PipelineDescriptor | None:
        """The pipeline's descriptor (read once per object; see :mod:`core.protocol.descriptor`), or None."""
        from airflow_seatunnel_ckpt.core.protocol.descriptor import read_descriptor

        if refresh or "_descriptor" not in self.__dict__:
            self.__dict__["_descriptor"] = read_descriptor(self.storage, max_chunk=self.config.max_chunk_bytes)
        cached: PipelineDescriptor | None = self.__dict__["_descriptor"]
        return cached

    def declared_participants(self) -> list[str] | None:
        """The participants the descriptor declares, or None when the pipeline has no descriptor."""
        descriptor = self.descriptor()
        return descriptor.declared_participants if descriptor is not None else None

    def _run_key_args(self, dag_id: str | None) -> dict[str, Any]:
        """``dag_id`` (default: the descriptor's owner, "" without a descriptor)."""
        if dag_id is None:
            descriptor = self.descriptor()
            dag_id = descriptor.owner_dag_id if descriptor is not None else ""
        return {"dag_id": dag_id}

    # -- reading the log ---------------------------------------------------------------
    def epoch_for_run(self, run_id: str, dag_id: str | None = None) -> int | None:
        """The epoch already given to run ``run_id`` of ``dag_id`` (default: the descriptor's owner), or None."""
        return self.txlog.epoch_for_run(run_id, **self._run_key_args(dag_id))

    def status(self, epoch: int) -> EpochStatus:
        """Everything the log says about ``epoch``."""
        return self.txlog.status(epoch)

    def state(self, epoch: int) -> EpochState:
        """The epoch's state (cheap: one listing, at most one read)."""
        return self.txlog.state(validate_epoch(epoch))

    def epochs(self) -> list[int]:
        """Every epoch in the log, ascending."""
        return self.txlog.epochs()

    def newest_epochs(self, last: int) -> list[int]:
        """The newest ``last`` epochs, ascending (reads the settled record and the epochs above it only)."""
        return self.txlog.newest_epochs(last)

    def list_epochs(self) -> list[EpochStatus]:
        """Status of every epoch, ascending."""
        return [self.txlog.status(e) for e in self.txlog.epochs()]

    def committed_epochs(self) -> list[int]:
        """Committed epochs, ascending."""
        return self.txlog.committed_epochs()

    def last_committed_epoch(self) -> int | None:
        """The newest committed epoch, or None."""
        return self.txlog.last_committed_epoch()

    def held_back(self, newest: int | None = None, known: Mapping[int, str] | None = None) -> HeldBack | None:
        """The refusals (:func:`is_refusal`) since the newest commit, or None when there is none.

        Reads decisions newest first, down to a commit (the settled record's, unread) or a
        damaged record: the cost is the refusals' streak, never the log's length. ``newest``
        and ``known`` (states by epoch): what the caller has read already.
        """
        found: list[DecisionRecord] = []
        known = known or {}
        settled: dict[int, EpochState] | None = None  # read only once the walk leaves the known epochs
        if newest is None:
            seen, above = self.txlog.open_epochs()
            newest, settled = max(above, default=seen.record.watermark), seen.record.states()
        for epoch in range(newest, 0, -1):
            if known.get(epoch) == EpochState.COMMITTED:
                break
            if known.get(epoch) in (EpochState.OPEN, EpochState.PREPARED):
                continue
            if epoch not in known:
                settled = self.txlog.settled.read().record.states() if settled is None else settled
                if settled.get(epoch) is EpochState.COMMITTED:
                    break
            try:
                decision = self.txlog.read_decision(epoch)
            except CorruptCheckpointError:
                break
            if decision is not None and decision.decision is Decision.COMMIT:
                break
            if is_refusal(decision):
                assert decision is not None
                found.append(decision)
        if not found:
            return None
        return HeldBack(since=found[-1].epoch, runs=len(found), newest=found[0].epoch, reason=found[0].reason)

    def prepared_for_run(self, run_id: str, participant: str) -> PreparedRecord | None:
        """``participant``'s prepared record in the live (not aborted) epoch of ``run_id``, or None:
        the one "already prepared?" check of a retried or cleared stage."""
        epoch = self.epoch_for_run(run_id)
        if epoch is None or self.state(epoch) in (EpochState.ABORTING, EpochState.ABORTED):
            return None
        return self.txlog.read_prepared(epoch, participant)

    # -- staging -----------------------------------------------------------------------
    def staging_path(self, epoch: int, attempt: int, sink: str) -> str:
        """Where ``attempt`` stages ``sink`` (relative to the pipeline root)."""
        return layout.staging_dir(epoch, attempt, sink)

    def staging_url(self, epoch: int, attempt: int, sink: str) -> str:
        """Full URL of the staging directory, for the Spark writer."""
        return self.storage.url_of(self.staging_path(epoch, attempt, sink))

    def manifest_for_staged(self, epoch: int, attempt: int, sink: str, target_url: str, rows: int,
                            fmt: str = "parquet") -> SinkManifest:
        """What ``attempt`` staged for ``sink``, as a manifest: see :func:`staging.manifest_of`."""
        return staging.manifest_of(self.storage, self.staging_path(epoch, attempt, sink), sink, target_url,
                                   rows, fmt)

    # -- restore -----------------------------------------------------------------------
    def restore_point(self, deep: bool = True) -> RestorePoint:
        """Where a new epoch's state restores from: see :func:`restore.restore_point`."""
        return restore_point(self.txlog, self.checkpoints, self.config, deep=deep)

    # -- begin -------------------------------------------------------------------------
    def begin(self, run_id: str, dag_id: str | None = None, *, logical_date: str = "") -> BeginRecord:
        """The epoch of run ``run_id`` of DAG ``dag_id`` (default: the descriptor's owner), allocated on
        first call (which records ``logical_date``), the same ever after."""
        record = self.txlog.begin(run_id, logical_date=logical_date, **self._run_key_args(dag_id))
        log.info("pipeline %s: run %s has epoch %d", self.name, run_id, record.epoch)
        return record

    def pin_inputs(self, epoch: int, participant: str, attempt: int,
                   make_plan: Callable[[], dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
        """The input ``participant`` reads in ``epoch``: ``make_plan()`` pinned by its first attempt,
        the stored plan for a retry (a write-ahead record, durable before any output is staged)."""
        validate_epoch(epoch)
        self.txlog.require_undecided(epoch, f"attempt {attempt} of {participant!r} cannot plan its input")
        stored = self.txlog.read_plan(epoch, participant)
        if stored is not None:
            return stored
        return self.txlog.fix_plan(epoch, participant, attempt, make_plan())

    # -- prepare -----------------------------------------------------------------------
    def prepare(self, epoch: int, participant: str, attempt: int, *, run_id: str, sinks: list[SinkManifest],
                operators: Mapping[str, OperatorState] | None = None,
                sources: Mapping[str, Mapping[str, Any]] | None = None, base: RestorePoint | None = None,
                not_written: Sequence[str] = ()) -> PreparedRecord:
        """Phase one for one participant: record its staged output, state and input.

        ``sources``: the offsets consumed per source (the WAL entry); ``operators``: the
        key-group chains per operator; ``base``: the restore point the stage started from;
        ``not_written``: sinks declared but not written. Idempotent for the same attempt;
        another attempt, or a cancelled one, gets :class:`FencedAttemptError`.
        """
        validate_epoch(epoch)
        validate_attempt(attempt)
        validate_name(participant, "participant name")
        existing = self.txlog.read_prepared(epoch, participant)
        if existing is not None:
            if existing.attempt == attempt:
                staging.write_markers(self.storage, existing)
                return existing
            raise FencedAttemptError(
                f"pipeline {self.name!r} epoch {epoch}: participant {participant!r} was already prepared by "
                f"attempt {existing.attempt}; attempt {attempt} is stale")
        self.txlog.require_undecided(epoch, f"attempt {attempt} of {participant!r} cannot prepare")
        self._require_run(epoch, run_id)
        # Everything the record will name is checked before anything is written: bad input
        # gets its error with the store unchanged.
        for sink in sinks:
            staging.check_manifest(sink, epoch, attempt)
        for name, state in (operators or {}).items():
            validate_name(name, "operator name")
            for ref in state.parts():
                staging.inside_pipeline(ref.path, f"operator {name!r} part")
        for name in sources or {}:
            validate_name(name, "source name")
        for name in not_written:
            validate_name(name, "sink name")
        source_states = {name: self._append_source(epoch, attempt, name, dict(offsets), base)
                         for name, offsets in (sources or {}).items()}
        record = PreparedRecord(epoch, participant, attempt, run_id, time.time(), list(sinks),
                                dict(operators or {}), source_states, base.epoch if base else None,
                                sorted(set(not_written) - {m.sink for m in sinks}))
        problems = self._verify_record(record, deep=False)
        if problems:
            raise NotPreparedError(f"pipeline {self.name!r} epoch {epoch}: cannot prepare {participant!r}: "
                                   + "; ".join(map(str, problems[:5])))
        stored = self.txlog.write_prepared(record)
        staging.write_markers(self.storage, stored)
        log.info("pipeline %s epoch %d: %s attempt %d prepared (%d rows in %d sinks)",
                 self.name, epoch, participant, attempt, stored.rows, len(stored.sinks))
        return stored

    def _require_run(self, epoch: int, run_id: str) -> None:
        begin = self.txlog.read_begin(epoch)
        if begin is None:
            raise EpochNotFoundError(f"pipeline {self.name!r} has no epoch {epoch}; call begin(run_id) first")
        if begin.run_id != run_id:
            raise FencedAttemptError(
                f"pipeline {self.name!r} epoch {epoch} belongs to run {begin.run_id!r}, not {run_id!r}")

    def _append_source(self, epoch: int, attempt: int, source: str, offsets: dict[str, Any],
                       base: RestorePoint | None) -> SourceState:
        chain = list(base.source_chains.get(source, [])) if base else []
        rebuilt = base is not None and source in base.rebuilt_sources
        return source_log.write_source_part(
            self.storage, self.config, epoch, attempt, source, offsets, chain, rebuilt,
            lambda: base.source_entries(source) if base else [])

    def _verify_record(self, record: PreparedRecord, deep: bool,
                       trusted: Mapping[str, PartRef] | None = None, decode: bool = True) -> list[Problem]:
        parts = [p for op in record.operators.values() for p in op.parts()]
        parts += [p for s in record.sources.values() for p in s.chain]
        problems = self.checkpoints.verify_parts(parts, deep=deep, trusted=trusted, decode=decode)
        for sink in record.sinks:
            problems += staging.verify_staged(self.storage, sink, deep)
        return problems

    def verify_prepared(self, epoch: int, participants: list[str] | None = None,
                        deep: bool = True, trusted: Mapping[str, PartRef] | None = None,
                        decode: bool = True) -> list[Problem]:
        """Problems with the prepared participants of ``epoch`` ([] = ready to commit); one of
        ``participants`` not prepared is one too (``trusted``, ``decode``: :meth:`CheckpointManager.verify_parts`)."""
        return self._verify_prepared(self.txlog.prepared(validate_epoch(epoch)), epoch, participants, deep,
                                     trusted, decode)

    def _verify_prepared(self, prepared: Mapping[str, PreparedRecord], epoch: int, participants: list[str] | None,
                         deep: bool, trusted: Mapping[str, PartRef] | None, decode: bool) -> list[Problem]:
        where = self.storage.describe_path(layout.txlog_dir(epoch))
        problems = [Problem(where, f"{name!r} is not prepared") for name in unprepared(prepared, participants or [])]
        for name, record in sorted(prepared.items()):
            if participants is None or name in participants:
                problems += self._verify_record(record, deep, trusted, decode)
        return problems

    # -- decide ------------------------------------------------------------------------
    def decide(self, epoch: int, decision: Decision, reason: str, by: str = "",
               participants: list[str] | None = None, *, verify_all: bool = False) -> DecisionRecord:
        """Create the epoch's one decision; returns the winner (possibly not ``decision``).

        For commit, every declared participant (and those ``participants`` adds; without a
        descriptor: every one that prepared) must be prepared and verify, the sinks'
        prechecks pass -- a refusal aborts the epoch here, with it as the reason -- and the
        checkpoint's ``_metadata`` is completed first. Only what is new in the epoch is
        read (``verify_all=True``: every part, as ``seatunnel-ckpt verify``).
        """
        validate_epoch(epoch)
        existing = self.txlog.read_decision(epoch)
        if existing is not None:
            return existing
        winners: dict[str, int] = {}
        if decision is Decision.COMMIT:
            refused = expectations.refusals(self.txlog.prepared(epoch).values())
            if refused:  # the data-quality rules the stages measured veto the commit
                decision, reason = Decision.ABORT, expectations.REFUSED + "; ".join(refused)
        if decision is Decision.COMMIT:
            try:
                meta = self._complete_checkpoint(epoch, participants, verify_all)
            except SinkRefusedError as exc:
                log.warning("pipeline %s epoch %d: %s; aborting the epoch", self.name, epoch, exc)
                try:
                    return self.abort(epoch, f"{SINK_REFUSED}{exc}", by)
                except DecisionConflictError:  # a concurrent commit decision won: it stands
                    existing = self.txlog.read_decision(epoch)
                    assert existing is not None
                    return existing
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

    def _complete_checkpoint(self, epoch: int, participants: list[str] | None,
                             verify_all: bool = False) -> CheckpointMetadata:
        prepared = self.txlog.prepared(epoch)
        declared = self.declared_participants()
        if declared is None:
            chosen = sorted(prepared) if participants is None else sorted(set(participants))
        else:
            chosen = sorted(set(declared) | set(participants or []))
        missing = unprepared(prepared, chosen)
        if not chosen or missing:
            why = (f"the pipeline's descriptor declares {declared}" if declared is not None
                   else "no descriptor declares the participants")
            raise NotPreparedError(
                f"pipeline {self.name!r} epoch {epoch}: cannot commit, not prepared: "
                f"{missing or 'no participant'} ({why}); wait for the stage(s) or abort the epoch. A "
                "participant removed from the pipeline is dropped from the declared set by the next run "
                "of its DAG's task group")
        # The decision reads every new part whole and checks its CRC32C and frame, but does
        # not decompress it (``verify_all`` does): a CRC32C pass instead of zstd per byte.
        trusted = None if verify_all else self._verified_before(prepared[p] for p in chosen)
        problems = self._verify_prepared(prepared, epoch, chosen, deep=True, trusted=trusted, decode=verify_all)
        if problems:
            raise NotPreparedError(
                f"pipeline {self.name!r} epoch {epoch}: cannot commit, prepared output does not verify: "
                + "; ".join(map(str, problems[:5])) + "; abort the epoch so its input is processed again")
        records = [prepared[p] for p in chosen]
        self._precheck_sinks(epoch, records)
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
            sink_markers, source_markers = staging.write_markers(self.storage, record)
            source_metas.update(source_markers)  # sources are unique across participants (above)
            for name, ref in sink_markers.items():
                if name in sinks:
                    raise NotPreparedError(f"epoch {epoch}: sink {name!r} is prepared by two participants")
                sinks[name] = ref
        bases = {r.base_epoch for r in records if r.base_epoch is not None}
        if bases:
            sources.update(self._carried_sources(epoch, max(bases), set(sources),
                                                 max(r.attempt for r in records)))
        meta = CheckpointMetadata(
            epoch=epoch, created_at=time.time(), run_id=records[0].run_id,
            participants={r.participant: r.attempt for r in records},
            base_epoch=max(bases) if bases else None, operators=operators, sources=sources, sinks=sinks,
            source_metas=source_metas)
        return self.checkpoints.complete(meta)

    def _precheck_sinks(self, epoch: int, records: Iterable[PreparedRecord]) -> None:
        """:class:`SinkRefusedError` when a sink would refuse the epoch's staged output (after the
        decision, a refusal would wedge the epoch COMMITTING)."""
        for record in records:
            for sink in record.sinks:
                if sink.publishes:
                    precheck_sink(self.sink_commit(epoch, sink))

    def _verified_before(self, records: Iterable[PreparedRecord]) -> dict[str, PartRef]:
        """The parts the committed checkpoints these records built on cover (verified by their decisions;
        an aborted epoch's ``_metadata``, completed just before an abort won, never counts)."""
        committed = []
        for base in {r.base_epoch for r in records if r.base_epoch is not None}:
            try:
                decision = self.txlog.read_decision(base)
            except CheckpointError:  # a damaged record proves nothing: read the parts instead
                continue
            if decision is not None and decision.decision is Decision.COMMIT:
                committed.append(base)
        return self.checkpoints.covered_parts(committed)

    def _carried_sources(self, epoch: int, base_epoch: int, present: set[str],
                         attempt: int) -> dict[str, SourceState]:
        """Sources of the base checkpoint that no participant prepared in ``epoch``, with their history.

        A source left out of one epoch must not re-read, when it comes back, what earlier epochs
        published. The chain is carried unchanged, or written in full when the base is damaged.
        """
        try:
            meta = self.checkpoints.read_metadata(base_epoch)
            return {name: SourceState({}, list(state.chain)) for name, state in meta.sources.items()
                    if name not in present and state.chain}
        except CheckpointError as exc:
            point = self.restore_point(deep=False)
            if point.epoch != base_epoch:
                raise NotPreparedError(
                    f"pipeline {self.name!r} epoch {epoch}: the participants restored from checkpoint "
                    f"{base_epoch}, which cannot be read ({exc}), and the restore point is now "
                    f"{point.epoch}; abort the epoch so that it runs again") from exc
        here = point.storage is not None and point.storage.url == self.storage.url
        carried: dict[str, SourceState] = {}
        for name in sorted((set(point.source_chains) | set(point.rebuilt_sources)) - present):
            if here and name not in point.rebuilt_sources:
                carried[name] = SourceState({}, list(point.source_chains[name]))
                continue
            path = layout.part_path(epoch, "sources", name, 0, attempt, token="carried")
            ref = write_json_part(self.storage, path, {"entries": point.source_entries(name)},
                                  epoch=epoch, **source_log.codec_options(self.config))
            carried[name] = SourceState({}, [ref])
        return carried

    # -- commit ------------------------------------------------------------------------
    def commit(self, epoch: int, *, held_first: bool = False) -> CommitResult:
        """Phase two: publish every sink of a commit-decided epoch, then ``committed``.

        Idempotent; a failure leaves the epoch COMMITTING, nothing deleted. A skipped sink
        publishes nothing. With ``held_first`` (recovery), a sink whose target holds the
        epoch already is acknowledged without a commit (``CommitResult.held``).
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
            staging.drop_staging(self.storage, epoch)
            return CommitResult(epoch, already, already_committed=True)
        records = self.txlog.winning_records(epoch)
        if records is None:
            raise PublishError(
                f"pipeline {self.name!r} epoch {epoch}: a prepared record of the attempts the decision names "
                f"({decision.participants}) is missing from {self.storage.describe_path(layout.txlog_dir(epoch))}; "
                "restore it from a backup of the store, then commit again")
        skipped = self.skipped_sinks(epoch)
        held = tuple(sink.sink for record in records for sink in record.sinks
                     if held_first and sink.sink not in skipped and self._holds(epoch, sink))
        published = [self._commit_sink(epoch, sink, skipped=sink.sink in skipped, held=sink.sink in held)
                     for record in records for sink in record.sinks]
        # A declared sink the stage did not write is recorded as such, so that "nothing
        # arrived" is visible in the committed record and the commit summary.
        published += [PublishedSink(name, "", "", 0, 0, 0, NOT_WRITTEN)
                      for record in records for name in record.not_written]
        secondary = restore.secondary_storage(self.config, self.name)
        if secondary is not None:
            restore.replicate(self.storage, secondary, epoch)
        self.txlog.acknowledge_committed(epoch, published)
        staging.drop_staging(self.storage, epoch)
        result = CommitResult(epoch, published, held=held)
        log.info("pipeline %s epoch %d: committed %s", self.name, epoch,
                 ", ".join(f"{p.sink}={p.rows} rows/{p.files} files" for p in published if p.published)
                 or "no output")
        if result.empty:
            log.info("pipeline %s epoch %d: sink(s) %s staged no rows; nothing was published for them "
                     "(no epoch directory, no asset event)", self.name, epoch, result.empty)
        if result.not_written:
            log.warning("pipeline %s epoch %d: sink(s) %s were declared but not written by the stage; "
                        "nothing was published for them. Write them (an empty DataFrame is fine) or "
                        "remove them from the stage's sinks", self.name, epoch, result.not_written)
        return result

    def skip_sink(self, epoch: int, sink: str, reason: str, by: str) -> CommitResult:
        """Commit a COMMITTING epoch without ``sink``: the way on when its table refuses the epoch
        for a reason a retry cannot change. A ``skip-sink`` action (who, why) is written first;
        the sink then misses this epoch's rows, the state and the other sinks commit."""
        validate_epoch(epoch)
        if not reason.strip() or not by.strip():
            raise ConfigError(f"pipeline {self.name!r} epoch {epoch}: skipping sink {sink!r} needs a reason and "
                              "who decides it (they are kept in the transaction log)")
        state = self.state(epoch)
        if state is not EpochState.COMMITTING:
            raise DecisionConflictError(
                f"pipeline {self.name!r} epoch {epoch} is {state.value}: only an epoch decided commit and not "
                f"yet published (COMMITTING) can be published without sink {sink!r}. An undecided epoch whose "
                "sink refuses it is aborted by the decision")
        records = self.txlog.winning_records(epoch) or []
        sinks = sorted({s.sink for record in records for s in record.sinks})
        if sink not in sinks:
            raise ConfigError(f"pipeline {self.name!r} epoch {epoch} has no sink {sink!r} to skip; its sinks: "
                              f"{sinks}")
        action = self.txlog.record_action(epoch, SKIP_SINK, by, reason, sink=sink)
        try:
            result = self.commit(epoch)
        except Exception as exc:
            self.txlog.record_outcome(epoch, action, ActionOutcome.FAILED, f"commit failed: {exc}")
            raise
        self.txlog.record_outcome(epoch, action, ActionOutcome.SUCCEEDED,
                                  f"committed without sink {sink!r} (its rows of this epoch are not published)")
        log.warning("pipeline %s epoch %d: committed without sink %s, by %s: %s", self.name, epoch, sink, by,
                    reason)
        return result

    def skipped_sinks(self, epoch: int) -> set[str]:
        """The sinks ``skip-sink`` actions of ``epoch`` name (see :meth:`skip_sink`)."""
        names = self.storage.list_dir(layout.txlog_dir(epoch))
        if not any(n.startswith(ACTION_PREFIX) and n.endswith(f"-{SKIP_SINK}") for n in names):
            return set()
        return {str(a.record.details.get("sink")) for a in self.txlog.actions(epoch) if a.record.action == SKIP_SINK}

    def sink_commit(self, epoch: int, sink: SinkManifest) -> SinkCommit:
        """What a sink's commit of ``epoch`` needs (also what the checks before the decision read)."""
        return SinkCommit(self.name, redact_url(self.storage.url.rsplit("/", 1)[0]), epoch, sink, self.storage,
                          self.config.max_retries, log_holds=self.holds_commit,
                          target_options=self.target_options(sink.target_url),
                          concurrency=self.config.publish_concurrency)

    def holds_commit(self, epoch: int) -> bool:
        """Whether this pipeline's log holds ``epoch`` decided commit (committed, or settled as committed)."""
        try:
            state = self.txlog.state(epoch)
        except EpochNotFoundError:  # settled and no longer listed, or never there
            return self.txlog.settled.read().record.states().get(epoch) is EpochState.COMMITTED
        if state is EpochState.COMMITTED:
            return True
        decision = self.txlog.read_decision(epoch) if state is EpochState.COMMITTING else None
        return decision is not None and decision.decision is Decision.COMMIT

    def store_id(self) -> str:
        """The id of this pipeline's store (:mod:`core.sinks.markers`; created on first use)."""
        return store_id(self.root)

    def target_options(self, target_url: str) -> dict[str, Any]:
        """fsspec options for a sink's target: the configured ones, or the store's for the same protocol."""
        options = self._target_options.get(target_url)
        if options is None:
            same = target_url.split("://", 1)[0] == self.storage.url.split("://", 1)[0]
            options = self.storage.storage_options if same else {}
        return dict(options)

    def target_storage(self, target_url: str) -> Storage:
        """Storage for a file sink's target (see :meth:`target_options`)."""
        return open_storage(target_url, self.target_options(target_url))

    def _holds(self, epoch: int, sink: SinkManifest) -> bool:
        """Whether ``sink``'s target holds ``epoch`` already; a target that cannot say does not
        (its commit then runs and words the failure)."""
        if not sink.publishes:
            return False
        try:
            held = held_epoch(self.sink_commit(epoch, sink))
        except Exception as exc:  # any library's error: the commit that follows reports it, named
            log.info("pipeline %s epoch %d: sink %s cannot tell which epoch its target holds (%s); committing it",
                     self.name, epoch, sink.sink, exc)
            return False
        return held is not None and held >= epoch

    def _commit_sink(self, epoch: int, sink: SinkManifest, *, skipped: bool, held: bool) -> PublishedSink:
        """One sink's part of the commit: skipped, found held already (recorded as it is), or committed."""
        target = redact_url(sink.target_url)
        if skipped:
            return PublishedSink(sink.sink, target, "", 0, 0, 0, SKIPPED)
        if not sink.publishes:  # no rows: nothing to publish (the epoch is still recorded)
            return PublishedSink(sink.sink, target, "", 0, 0, 0, EMPTY)
        if held:
            return PublishedSink(sink.sink, target, "", len(sink.files), sink.rows, sink.bytes,
                                 PublishMethod.ALREADY.value)
        return commit_sink(self.sink_commit(epoch, sink))

    # -- abort -------------------------------------------------------------------------
    def abort(self, epoch: int, reason: str, by: str = "") -> DecisionRecord:
        """Abort ``epoch`` unless decided commit (DecisionConflictError): remove its staging and
        uncommitted checkpoint, then write ``aborted``. Safe to repeat."""
        validate_epoch(epoch)
        record = self.txlog.decide(DecisionRecord(epoch, Decision.ABORT, reason, by, time.time()))
        if record.decision is Decision.COMMIT:
            raise DecisionConflictError(
                f"pipeline {self.name!r} epoch {epoch} is already decided commit ({record.reason}); it will not "
                "be aborted -- commit rolls it forward")
        staging.drop_staging(self.storage, epoch)
        self.storage.delete(layout.checkpoint_dir(epoch), recursive=True)
        self.txlog.acknowledge_aborted(epoch)
        log.info("pipeline %s epoch %d: aborted (%s)", self.name, epoch, record.reason)
        return record
