"""Run one stage for one epoch: the prepare phase of the epoch's two-phase commit.

:func:`run_stage` is the whole sequence, in order:

1. **begin** -- the epoch of the run id (the same for every retry and cleared task);
2. **already prepared?** -- if an earlier attempt prepared this participant, return that
   result without running anything (retries are idempotent);
3. **restore** -- the newest committed checkpoint that verifies (never uncommitted state);
4. **fix the input** -- each source plans its offsets from the committed history; the
   first attempt's plan is stored write-once, so every retry reads the same input;
5. **run** the user's stage function;
6. **checkpoint** -- collect the key groups' parts the executors wrote;
7. **prepare** -- sink manifests, state chains and consumed offsets become the
   participant's prepared record (the write-ahead log). A stale attempt is fenced.
"""

from __future__ import annotations

import importlib
import logging
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from airflow_seatunnel_ckpt.core.config import CheckpointConfig
from airflow_seatunnel_ckpt.core.errors import ConfigError, FencedAttemptError
from airflow_seatunnel_ckpt.core.models import OperatorState, SinkManifest
from airflow_seatunnel_ckpt.core.store import CheckpointStore
from airflow_seatunnel_ckpt.spark.context import BoundSource, StageContext
from airflow_seatunnel_ckpt.spark.session import stage_session
from airflow_seatunnel_ckpt.spark.sinks import Sink, sink_from_options
from airflow_seatunnel_ckpt.spark.sources import Source, source_from_options
from airflow_seatunnel_ckpt.spark.spec import StageResult, StageSpec
from airflow_seatunnel_ckpt.spark.state import KeyedState

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from airflow_seatunnel_ckpt.core.pipeline import Pipeline
    from airflow_seatunnel_ckpt.core.recovery import RestorePoint

log = logging.getLogger(__name__)

#: What a user writes: ``def stage(ctx, spark) -> None``.
StageFunction = Callable[[StageContext, "SparkSession"], Any]

#: Name of the write-once input plan record in the epoch's transaction log directory.


def load_stage_function(path: str) -> StageFunction:
    """Import ``"package.module:function"``."""
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"stage {path!r}: cannot import module {module_name!r}: {exc}") from exc
    fn: Any = module
    for part in attr.split("."):
        fn = getattr(fn, part, None)
        if fn is None:
            raise ConfigError(f"stage {path!r}: module {module_name!r} has no attribute {attr!r}")
    if not callable(fn):
        raise ConfigError(f"stage {path!r} is not callable")
    stage: StageFunction = fn
    return stage


def run_stage(
    spec: StageSpec,
    spark: SparkSession | None = None,
    *,
    stage_fn: StageFunction | None = None,
    submitted: bool = False,
) -> StageResult:
    """Run ``spec``'s stage for its run's epoch and log it prepared.

    :param spark: session to use; default: the active session, else a new one
        (``spec.master`` or ``local[*]``, with ``spec.spark_conf``).
    :param stage_fn: the stage function itself, instead of importing ``spec.stage``.
    :param submitted: running under ``spark-submit`` (its ``--master`` is kept).
    :raises FencedAttemptError: the epoch was decided before this attempt prepared.
    """
    started = time.monotonic()
    config = CheckpointConfig.from_mapping(spec.store)
    pipeline = CheckpointStore(config).pipeline(spec.pipeline)
    epoch = pipeline.begin(spec.run_id).epoch
    earlier = pipeline.txlog.read_prepared(epoch, spec.participant)
    if earlier is not None:
        log.info(
            "pipeline %s epoch %d: %s already prepared by attempt %d; not running it again",
            spec.pipeline,
            epoch,
            spec.participant,
            earlier.attempt,
        )
        return StageResult.from_prepared(pipeline.name, earlier, reused=True)
    fn = stage_fn or load_stage_function(spec.stage)
    session = spark or stage_session(spec, submitted=submitted)

    # The first attempt trusts sizes (one listing, no reads) and CRC32C is still checked as
    # each part is decoded; a retry re-reads every part's checksum first, so a checkpoint
    # damaged in place (same size, flipped bytes) that failed attempt 1 mid-restore is
    # skipped in favour of a fallback (replica, log, older epoch) instead of failing again.
    base = pipeline.restore_point(deep=spec.attempt > 1)
    log.info(
        "pipeline %s epoch %d attempt %d: %s restores from %s (%s)",
        spec.pipeline,
        epoch,
        spec.attempt,
        spec.participant,
        base.epoch if base.epoch else "nothing",
        base.how,
    )
    sources = {name: source_from_options(name, opts) for name, opts in spec.sources.items()}
    offsets = _fixed_offsets(pipeline, epoch, spec, sources, base)
    bound = {name: BoundSource(session, src, offsets[name]) for name, src in sources.items()}
    sinks = _bound_sinks(pipeline, epoch, spec)
    ctx = StageContext(
        session,
        pipeline=spec.pipeline,
        participant=spec.participant,
        run_id=spec.run_id,
        epoch=epoch,
        attempt=spec.attempt,
        restored_epoch=base.epoch,
        key_groups=spec.key_groups,
        sources=bound,
        sinks=sinks,
        state_factory=_state_factory(session, pipeline, config, epoch, spec, base),
    )

    fn(ctx, session)

    operators: dict[str, OperatorState] = {}
    written = 0
    for name, state in ctx.states.items():
        operator, size = state.finish()
        written += size
        if operator is not None:
            operators[name] = operator
    operators = {**_owned_operators(pipeline, base, spec.participant), **operators}
    manifests: list[SinkManifest] = []
    for name, sink in sinks.items():
        if sink.written:
            assert sink.rows is not None
            manifests.append(
                pipeline.manifest_for_staged(
                    epoch, spec.attempt, name, sink.target_url, sink.rows, sink.format
                )
            )
        else:
            log.warning("stage %s did not write sink %r in epoch %d", spec.stage, name, epoch)
    try:
        record = pipeline.prepare(
            epoch,
            spec.participant,
            spec.attempt,
            run_id=spec.run_id,
            sinks=manifests,
            operators=operators,
            sources={n: b.consumed for n, b in bound.items()},
            base=base,
        )
    except FencedAttemptError:
        winner = pipeline.txlog.read_prepared(epoch, spec.participant)
        if winner is None:
            raise
        log.warning(
            "pipeline %s epoch %d: attempt %d of %s was fenced; "
            "attempt %d's prepared output stands",
            spec.pipeline,
            epoch,
            spec.attempt,
            spec.participant,
            winner.attempt,
        )
        return StageResult.from_prepared(pipeline.name, winner, reused=True)
    result = StageResult.from_prepared(pipeline.name, record, reused=False)
    log.info(
        "pipeline %s epoch %d: %s attempt %d prepared in %.1fs: %d rows in %d sink(s), "
        "%d checkpoint bytes "
        "(%d in keyed state)",
        spec.pipeline,
        epoch,
        spec.participant,
        spec.attempt,
        time.monotonic() - started,
        result.rows,
        len(manifests),
        result.checkpoint_bytes,
        written,
    )
    return result


def _fixed_offsets(
    pipeline: Pipeline,
    epoch: int,
    spec: StageSpec,
    sources: Mapping[str, Source],
    base: RestorePoint,
) -> dict[str, dict[str, Any]]:
    """This epoch's offsets per source: the first attempt's plan (see ``Pipeline.fix_inputs``).

    Without the stored plan a retry would list the input again and could pick up files
    that arrived after the failed attempt; with it, epoch N reads the same input on every
    attempt and late files wait for epoch N+1. A source added to the stage after the plan
    was fixed is planned on the spot.
    """

    def make_plan() -> dict[str, dict[str, Any]]:
        return {name: src.plan(base.source_entries(pipeline, name)) for name, src in sources.items()}

    fixed = pipeline.fix_inputs(epoch, spec.participant, spec.attempt, make_plan)
    return {
        name: dict(fixed[name]) if name in fixed else src.plan(base.source_entries(pipeline, name))
        for name, src in sources.items()
    }


def _bound_sinks(pipeline: Pipeline, epoch: int, spec: StageSpec) -> dict[str, Sink]:
    sinks = {}
    for name, opts in spec.sinks.items():
        sink = sink_from_options(name, opts)
        sink.bind(pipeline.staging_url(epoch, spec.attempt, name))
        sinks[name] = sink
    return sinks


def _state_factory(
    spark: SparkSession,
    pipeline: Pipeline,
    config: CheckpointConfig,
    epoch: int,
    spec: StageSpec,
    base: RestorePoint,
) -> Callable[[str, type[KeyedState]], KeyedState]:
    restore_storage = base.storage or pipeline.storage
    # Parts restored from a replica live in another store: write every key group in full
    # so the new checkpoint references nothing outside the primary.
    force_full = base.storage is not None and base.storage.url != pipeline.storage.url

    def make(name: str, kind: type[KeyedState]) -> KeyedState:
        return kind(
            spark,
            name,
            key_groups=spec.key_groups,
            epoch=epoch,
            attempt=spec.attempt,
            store_url=pipeline.storage.url,
            store_options=pipeline.storage.storage_options,
            restored=base.operators.get(name),
            restore_url=restore_storage.url,
            restore_options=restore_storage.storage_options,
            incremental=config.incremental,
            full_checkpoint_interval=config.full_checkpoint_interval,
            compression=config.compression,
            compression_level=config.compression_level,
            force_full=force_full,
        )

    return make


def _owned_operators(
    pipeline: Pipeline, base: RestorePoint, participant: str
) -> dict[str, OperatorState]:
    """States this participant prepared in the restored epoch: carried over unchanged
    when the stage does not open them, so a quiet epoch never drops state."""
    if base.epoch is None:
        return {}
    record = pipeline.txlog.read_prepared(base.epoch, participant)
    if record is None:
        return {}
    return {name: op for name, op in base.operators.items() if name in record.operators}
