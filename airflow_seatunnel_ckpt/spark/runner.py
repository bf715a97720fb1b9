"""Run one stage for one epoch: the prepare phase of the epoch's two-phase commit.

:func:`run_stage`: begin, reuse an earlier attempt's prepared record, restore, pin the input, run the stage function,
collect the keyed state's parts, prepare (a stale attempt is fenced).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import logging
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, cast

from airflow_seatunnel_ckpt.core.config import CheckpointConfig
from airflow_seatunnel_ckpt.core.errors import CheckpointError, ConfigError, FencedAttemptError
from airflow_seatunnel_ckpt.core.models import OperatorState, SinkManifest
from airflow_seatunnel_ckpt.core.protocol import staging
from airflow_seatunnel_ckpt.core.protocol.descriptor import StateDescriptor
from airflow_seatunnel_ckpt.core.protocol.expectations import QUARANTINE_SUFFIX as QUARANTINE_SUFFIX_EXPECTATIONS
from airflow_seatunnel_ckpt.core.protocol.lease import LeaseKeeper, default_holder
from airflow_seatunnel_ckpt.core.store import CheckpointStore
from airflow_seatunnel_ckpt.spark.context import AirflowContext, BoundSource, StageContext
from airflow_seatunnel_ckpt.spark.declaration import STAGE_PATH
from airflow_seatunnel_ckpt.spark.progress import DEFAULT_INTERVAL_S, StageProgress, log_row_counts
from airflow_seatunnel_ckpt.spark.registry import SINKS, SOURCES
from airflow_seatunnel_ckpt.spark.session import remote_session, stage_session
from airflow_seatunnel_ckpt.spark.sinks.files import Sink
from airflow_seatunnel_ckpt.spark.sources.base import Source, SourceError
from airflow_seatunnel_ckpt.spark.sources.files import FileSource
from airflow_seatunnel_ckpt.spark.spec import StageResult, StageSpec, entry_type
from airflow_seatunnel_ckpt.spark.state import (
    KeyedState,
    PartPolicy,
    StateError,
    StateSettings,
    StoreLocation,
)
from airflow_seatunnel_ckpt.spark.state.executor import null_key_error

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from airflow_seatunnel_ckpt.core.protocol.pipeline import Pipeline
    from airflow_seatunnel_ckpt.core.protocol.restore import RestorePoint

log = logging.getLogger(__name__)

#: What a user writes: ``def stage(ctx, spark) -> None``.
StageFunction = Callable[[StageContext, "SparkSession"], Any]


def load_stage_function(path: str) -> StageFunction:
    """Import ``"package.module:function"``."""
    if not isinstance(path, str) or not STAGE_PATH.match(path):
        raise ConfigError(f"stage {path!r} is not an import path of the form 'package.module:function' "
                          "(e.g. 'my_pipelines.orders:dedup_orders')")
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"stage {path!r}: cannot import module {module_name!r}: {exc}") from exc
    # Attribute by attribute, after the import: an AttributeError the module raises while it
    # is imported is the user's bug and keeps its traceback, not a "no attribute" message.
    fn: Any = module
    for part in attr.split("."):
        fn = getattr(fn, part, None)
        if fn is None:
            raise ConfigError(f"stage {path!r}: module {module_name!r} has no attribute {attr!r}")
    if not callable(fn):
        raise ConfigError(f"stage {path!r} is not callable")
    return cast(StageFunction, fn)


def run_stage(spec: StageSpec, spark: SparkSession | None = None, *, stage_fn: StageFunction | None = None,
              submitted: bool = False, progress_interval: float = DEFAULT_INTERVAL_S) -> StageResult:
    """Run ``spec``'s stage for its run's epoch and log it prepared.

    :param spark: session to use; default: a Connect session to ``spec.remote``, else the active session, else a new one
        (``spec.master`` or ``local[*]``, with ``spec.spark_conf``).
    :param stage_fn: the stage function itself, instead of importing ``spec.stage``.
    :param submitted: running under ``spark-submit`` (its ``--master`` is kept).
    :param progress_interval: seconds between two looks at Spark's progress (:class:`~.progress.StageProgress`).
    :raises FencedAttemptError: the epoch was decided before this attempt prepared.
    """
    if spark is None and spec.remote is not None:
        # Through Spark Connect: a session of its own for this run, released when it ends.
        with remote_session(spec) as session:
            return run_stage(spec, session, stage_fn=stage_fn, submitted=submitted,
                             progress_interval=progress_interval)
    started = time.monotonic()
    config = CheckpointConfig.from_mapping(spec.store)
    pipeline = CheckpointStore(config).pipeline(spec.pipeline)
    epoch = pipeline.begin(spec.run_id).epoch
    earlier = pipeline.prepared_for_run(spec.run_id, spec.participant)
    if earlier is not None:
        log.info("pipeline %s epoch %d: %s already prepared by attempt %d; not running it again", spec.pipeline,
                 epoch, spec.participant, earlier.attempt)
        return StageResult.from_prepared(pipeline.name, earlier, reused=True)
    # From here until the prepared record exists (or the stage fails) this process holds
    # the participant's lease: recovery and the next run see a running stage, however long
    # it takes, and a dead one once renewals stop (under spark-submit: this driver).
    with LeaseKeeper.for_pipeline(pipeline, epoch, spec.participant, spec.attempt,
                                  holder=default_holder(run_id=spec.run_id, ti=AirflowContext.from_dict(
                                      spec.airflow_context).task_instance(spec.attempt))):
        return _run_leased(spec, spark, stage_fn, submitted, config, pipeline, epoch, started, progress_interval)


def _run_leased(spec: StageSpec, spark: SparkSession | None, stage_fn: StageFunction | None, submitted: bool,
                config: CheckpointConfig, pipeline: Pipeline, epoch: int, started: float,
                progress_interval: float = DEFAULT_INTERVAL_S) -> StageResult:
    """Steps 3-7 of :func:`run_stage`, while the lease is held."""
    fn = stage_fn or load_stage_function(spec.stage)
    session = spark or stage_session(spec, submitted=submitted)

    # The first attempt trusts sizes (one listing, no reads) and CRC32C is still checked as
    # each part is decoded; a retry re-reads every part's checksum first, so a checkpoint
    # damaged in place (same size, flipped bytes) that failed attempt 1 mid-restore is
    # skipped in favour of a fallback (replica, log, older epoch) instead of failing again.
    base = pipeline.restore_point(deep=spec.attempt > 1)
    log.info("pipeline %s epoch %d attempt %d: %s restores from %s (%s)", spec.pipeline, epoch, spec.attempt,
             spec.participant, base.epoch if base.epoch else "nothing", base.how)

    def plan(sources: Mapping[str, Source]) -> dict[str, dict[str, Any]]:
        return _fixed_offsets(pipeline, epoch, spec, sources, base)

    ran = execute_stage(spec, session, fn, pipeline, config, epoch, base, plan,
                        lambda name: pipeline.staging_path(epoch, spec.attempt, name), progress_interval)
    try:
        record = pipeline.prepare(epoch, spec.participant, spec.attempt, run_id=spec.run_id, sinks=ran.manifests,
                                  operators=ran.operators, sources={n: b.consumed for n, b in ran.bound.items()},
                                  base=base, not_written=ran.not_written)
    except FencedAttemptError:
        winner = pipeline.txlog.read_prepared(epoch, spec.participant)
        if winner is None:
            raise
        log.warning("pipeline %s epoch %d: attempt %d of %s was fenced; attempt %d's prepared output stands",
                    spec.pipeline, epoch, spec.attempt, spec.participant, winner.attempt)
        return StageResult.from_prepared(pipeline.name, winner, reused=True)
    result = StageResult.from_prepared(pipeline.name, record, reused=False)
    if spec.dry_run:
        log.info("pipeline %s: dry run: the shapes of its keyed states are not recorded in the descriptor",
                 pipeline.name)
    else:
        _record_state_shapes(pipeline, spec.participant, ran.ctx.states)
    log.info("pipeline %s epoch %d: %s attempt %d prepared in %.1fs: %d rows in %d sink(s), %d checkpoint bytes "
             "(%d in keyed state)", spec.pipeline, epoch, spec.participant, spec.attempt, time.monotonic() - started,
             result.rows, len(ran.manifests), result.checkpoint_bytes, ran.written)
    return result


@dataclasses.dataclass
class StageRun:
    """What one run of the stage function left: its context, staged manifests and keyed state."""

    ctx: StageContext
    bound: dict[str, BoundSource]
    manifests: list[SinkManifest]
    not_written: list[str]
    operators: dict[str, OperatorState]
    written: int  #: bytes of keyed state written


def execute_stage(spec: StageSpec, session: SparkSession, fn: StageFunction, pipeline: Pipeline,
                  config: CheckpointConfig, epoch: int, base: RestorePoint,
                  plan: Callable[[Mapping[str, Source]], dict[str, dict[str, Any]]],
                  staged_at: Callable[[str], str],
                  progress_interval: float = DEFAULT_INTERVAL_S) -> StageRun:
    """Read ``plan``'s input, run ``fn`` from ``base``'s state, stage each sink at ``staged_at(sink)`` and collect the
    manifests and keyed state's parts (the caller prepares); also what a replay runs per epoch."""
    sources = {name: SOURCES.build(name, opts) for name, opts in spec.sources.items()}
    try:
        offsets = plan(sources)
    except SourceError as exc:  # a missing directory, a changed consumed file
        raise SourceError(f"pipeline {spec.pipeline!r} epoch {epoch}: {exc}") from exc
    sinks = {name: _bound_sink(pipeline, name, opts, staged_at) for name, opts in spec.sinks.items()}
    quarantines = _quarantine_sinks(pipeline, spec, sources, sinks, staged_at)
    rejected = _expectation_quarantines(pipeline, spec, sinks, quarantines, staged_at)
    bound = {name: BoundSource(session, src, offsets[name], quarantines.get(name), epoch)
             for name, src in sources.items()}
    ctx = StageContext(session, pipeline=spec.pipeline, participant=spec.participant, run_id=spec.run_id,
                       epoch=epoch, attempt=spec.attempt, restored_epoch=base.epoch, key_groups=spec.key_groups,
                       sources=bound, sinks=sinks,
                       state_factory=_state_factory(session, pipeline, config, epoch, spec, base),
                       airflow=AirflowContext.from_dict(spec.airflow_context or {"run_id": spec.run_id}))

    operators: dict[str, OperatorState] = {}
    written = 0
    label = f"pipeline {spec.pipeline} epoch {epoch}: {spec.participant} attempt {spec.attempt}"
    try:
        # Spark's progress goes to the task log while the stage and its state writes run.
        with StageProgress(session, label, progress_interval):
            fn(ctx, session)
            _refuse_renamed_states(pipeline, base, spec.participant, ctx.states)
            for name, state in ctx.states.items():
                operator, size = state.finish()
                written += size
                if operator is not None:
                    operators[name] = operator
    except Exception as exc:
        null_key = null_key_error(exc)
        if null_key is None:
            raise
        raise _null_key_origin(session, epoch, bound, *null_key) from exc
    operators = {**_owned_operators(pipeline, base, spec.participant), **operators}
    manifests: list[SinkManifest] = []
    not_written: list[str] = []
    for name, sink in [*sinks.items(),
                       *((q.name, q) for q in [*quarantines.values(), *rejected] if q.written)]:
        if sink.written:
            assert sink.rows is not None
            manifest = staging.manifest_of(pipeline.storage, staged_at(name), name, sink.target_url,
                                           sink.rows, sink.format)
            manifests.append(dataclasses.replace(manifest, mode=sink.mode, table=sink.table,
                                                 expectations=sink.expectation_results))
        else:
            not_written.append(name)
            log.warning("pipeline %s epoch %d: stage %s declared sink %r but did not write it; the epoch "
                        "publishes nothing for it (recorded as not_written in the prepared record and the "
                        "commit). Write it (an empty DataFrame is fine) or remove it from the stage's sinks",
                        spec.pipeline, epoch, spec.stage, name,)
    log_row_counts(label, bound, sinks)
    return StageRun(ctx, bound, manifests, not_written, operators, written)


def _fixed_offsets(pipeline: Pipeline, epoch: int, spec: StageSpec, sources: Mapping[str, Source],
                   base: RestorePoint) -> dict[str, dict[str, Any]]:
    """This epoch's offsets per source: the first attempt's plan (``Pipeline.pin_inputs``), so every retry reads the
    same input; a source added since is planned on the spot."""

    def make_plan() -> dict[str, dict[str, Any]]:
        return {name: src.plan_from(base, epoch) for name, src in sources.items()}

    for name, src in sources.items():
        src.earlier_plans = functools.partial(_first_pinned_plan, pipeline, spec.participant, name, epoch)

    fixed = pipeline.pin_inputs(epoch, spec.participant, spec.attempt, make_plan)
    offsets = {
        name: dict(fixed[name]) if name in fixed else src.plan_from(base, epoch)
        for name, src in sources.items()
    }
    # A pinned input only its planning process could read is planned again (Source.repin), but
    # only while nothing is prepared: a prepared attempt's record names what the epoch read.
    if pipeline.txlog.read_prepared(epoch, spec.participant) is None:
        for name, src in sources.items():
            repinned = src.repin(offsets[name])
            if repinned is not None:
                offsets[name] = repinned
    return offsets


def _first_pinned_plan(pipeline: Pipeline, participant: str, source: str, before: int) -> dict[str, Any] | None:
    """The offsets the newest epoch below ``before`` that planned ``source`` pinned for it, or None (newest first: it
    carries the first plan's start, so the cost does not grow with the log)."""
    for earlier in reversed(pipeline.txlog.epochs()):
        if earlier >= before:
            continue
        plan = pipeline.txlog.read_plan(earlier, participant)
        if plan is not None:  # None: that epoch's participant never planned
            return dict(plan[source]) if plan.get(source) else None
    return None


def _bound_sink(pipeline: Pipeline, name: str, options: Any, staged_at: Callable[[str], str]) -> Sink:
    """The sink ``name`` of ``options``, staging into the attempt's staging of it."""
    sink = SINKS.build(name, options)
    sink.bind(pipeline.storage.url_of(staged_at(name)), pipeline.storage.storage_options)
    return sink


def _null_key_origin(spark: SparkSession, epoch: int, sources: Mapping[str, BoundSource],
                     state: str, column: str) -> StateError:
    """The null-key error of ``state``, naming the input files with a null ``column`` (one filtered read per source,
    only now that the stage failed)."""
    from pyspark.sql import functions as F

    found: list[str] = []
    try:
        for name, bound in sources.items():
            if not bound.was_read or not isinstance(bound.source, FileSource):
                continue
            data, _ = bound.source.read_checked(spark, bound.offsets)
            if column not in data.columns:
                continue
            rows = (data.where(F.col(column).isNull())
                    .select(F.col("_metadata.file_path").alias("file")).distinct().limit(10).collect())
            files = [str(f) for f in bound.offsets.get("files", [])]
            found += [f"source {name!r} file {bound.source.planned_url(str(r.file), files) or r.file}"
                      for r in rows]
    except Exception as exc:  # the lookup is a courtesy: never hide the original error
        log.warning("epoch %d: could not find the input files with null %r: %s", epoch, column, exc)
        found = ["(the input files could not be determined; see the log)"]
    origin = ("; ".join(found) if found else
              "no input file has a null " + repr(column) + " itself: the stage's own transformations "
              "produced it")
    return StateError(f"epoch {epoch}: keyed state {state!r}: key column {column!r} holds nulls, from "
                      f"{origin}. Drop or fill null keys before updating the state (e.g. df.where(col({column!r})."
                      "isNotNull())), or fix the input file and deliver it under a new name")


#: The name of a source's quarantine sink: ``<source>.bad_records``.
QUARANTINE_SUFFIX = ".bad_records"


def _quarantine_sinks(pipeline: Pipeline, spec: StageSpec, sources: Mapping[str, Source],
                      sinks: Mapping[str, Sink], staged_at: Callable[[str], str]) -> dict[str, Sink]:
    """Per source with a ``bad_records`` directory: the JSON file sink ``<source>.bad_records`` its rejected records are
    staged into and published with the epoch."""
    out: dict[str, Sink] = {}
    for name, src in sources.items():
        target = getattr(src, "bad_records", None)
        if not target:
            continue
        sink_name = f"{name}{QUARANTINE_SUFFIX}"
        if sink_name in sinks:
            raise ConfigError(f"stage spec: sink {sink_name!r} is the quarantine sink of source {name!r} "
                              "(its bad_records option); rename the sink")
        out[name] = _bound_sink(pipeline, sink_name, {"type": "file", "path": target, "format": "json"}, staged_at)
    return out


def _expectation_quarantines(pipeline: Pipeline, spec: StageSpec, sinks: Mapping[str, Sink],
                             taken: Mapping[str, Sink], staged_at: Callable[[str], str]) -> list[Sink]:
    """Per sink with a ``quarantine`` expectation: the sink ``<sink>.quarantine`` beside it
    (:meth:`Sink.quarantine_options`), published in the same commit."""
    out: list[Sink] = []
    names = {*sinks, *(q.name for q in taken.values())}
    for name, sink in sinks.items():
        if not any(rule.on_fail == "quarantine" for rule in sink.expectations):
            continue
        sink_name = f"{name}{QUARANTINE_SUFFIX_EXPECTATIONS}"
        options = sink.quarantine_options()
        if options is None:
            raise ConfigError(f"stage spec: sink {name!r} (type {entry_type(spec.sinks[name])!r}) has no "
                              "quarantine; use on_fail 'drop' instead of 'quarantine'")
        if sink_name in names:
            raise ConfigError(f"stage spec: sink {sink_name!r} is the quarantine of sink {name!r} (its "
                              "expectations); rename the sink")
        sink.quarantine = quarantine = _bound_sink(pipeline, sink_name, options, staged_at)
        out.append(quarantine)
    return out


def _state_factory(spark: SparkSession, pipeline: Pipeline, config: CheckpointConfig, epoch: int, spec: StageSpec,
                   base: RestorePoint) -> Callable[[str, type[KeyedState]], KeyedState]:
    store = StoreLocation.of(pipeline.storage)
    restore_from = StoreLocation.of(base.storage or pipeline.storage)
    # Parts restored from a replica live in another store: write every key group in full
    # so the new checkpoint references nothing outside the primary.
    force_full = base.storage is not None and base.storage.url != pipeline.storage.url
    policy = PartPolicy.from_config(config, force_full=force_full)
    descriptor = pipeline.descriptor()
    shape = descriptor.participants.get(spec.participant) if descriptor is not None else None
    recorded = dict(shape.states) if shape is not None else {}
    opened: dict[str, KeyedState] = {}

    def make(name: str, kind: type[KeyedState]) -> KeyedState:
        settings = StateSettings(name=name, kind=kind.kind, key_groups=spec.key_groups, epoch=epoch,
                                 attempt=spec.attempt, store=store, restore_from=restore_from, policy=policy,
                                 restored=base.operators.get(name), pipeline=pipeline.name)
        state = kind(spark, settings)
        # Only a state with committed values is held to its shape, and the shape is the
        # restored checkpoint's (the descriptor's only when the checkpoint recorded none): a state
        # whose epochs were all aborted, or that was reset, is free, and a run without Airflow
        # (no descriptor) is held all the same.
        restored = base.operators.get(name)
        if restored is not None:
            state.recorded = StateDescriptor.of_operator(restored, recorded.get(name))
            where = f"checkpoint {base.epoch} in {pipeline.storage.describe()}"
            if restored.shape is None and name in recorded and descriptor is not None:
                where = f"pipeline descriptor v{descriptor.version} in {pipeline.storage.describe()}"
            state.recorded_where = where
            state.pipeline_name = pipeline.name
        # A rename in the code is refused when the renamed state's update is planned,
        # before any Spark job of the stage wrote staging or state parts.
        state.before_update = lambda _: _refuse_renamed_states(pipeline, base, spec.participant, opened)
        opened[name] = state
        return state

    return make


def _record_state_shapes(pipeline: Pipeline, participant: str, states: Mapping[str, KeyedState]) -> None:
    """Record in the descriptor the shapes of the keyed states the stage updated (a new version only on a change; none
    without a descriptor); a failure is logged, never fatal: the epoch is prepared."""
    from airflow_seatunnel_ckpt.core.protocol.descriptor import record_states

    shapes = {name: shape for name, state in states.items() if (shape := state.shape()) is not None}
    try:
        record_states(pipeline, participant, shapes)
    except CheckpointError as exc:
        log.warning("pipeline %s: could not record the keyed states of %s in the descriptor: %s",
                    pipeline.name, participant, exc)


def _refuse_renamed_states(pipeline: Pipeline, base: RestorePoint, participant: str,
                           states: Mapping[str, KeyedState]) -> None:
    """Refuse, before prepare, a stage that looks like it renamed a keyed state.

    A state updated without committed values, while a committed state of this participant of the same kind and key
    columns was not opened, would start from zero (and renaming it back would lose its epochs). A real second state is
    told apart by opening the first one before updating the new one.
    """
    owned = _owned_operators(pipeline, base, participant)
    missing = {name: op for name, op in owned.items() if name not in states}
    if not missing:
        return
    for name, state in states.items():
        if name in base.operators or not state.updated:
            continue
        keys = list(state.settings.key_columns)
        alike = sorted(old for old, op in missing.items()
                       if op.state_kind == state.kind.value and list(op.key_columns) == keys)
        if alike:
            raise StateError(
                f"pipeline {pipeline.name!r} epoch {state.settings.epoch}"
                + (f" (restoring checkpoint {base.epoch})" if base.epoch is not None else "")
                + f": participant {participant!r} updates a new keyed "
                f"state {name!r} (a {state.kind.value} keyed by {list(state.settings.key_columns)}) but no longer "
                f"opens the committed state(s) {alike} of the same kind and keys: this looks like a rename, "
                f"which would start {name!r} from zero. Way out: `seatunnel-ckpt state rename {pipeline.name} "
                f"{alike[0]} {name}` keeps its values; or, if {name!r} is really a new state, also open "
                f"{alike[0]!r} in the stage, before updating {name!r} (ctx.{state.kind.value}({alike[0]!r})), "
                f"or `seatunnel-ckpt state drop {pipeline.name} {alike[0]}` if it is no longer needed")


def _owned_operators(pipeline: Pipeline, base: RestorePoint, participant: str) -> dict[str, OperatorState]:
    """States this participant prepared in the restored epoch, carried over when the stage does not open them (a quiet
    epoch never drops state)."""
    if base.epoch is None:
        return {}
    record = pipeline.txlog.read_prepared(base.epoch, participant)
    if record is None:
        return {}
    return {name: op for name, op in base.operators.items() if name in record.operators}
