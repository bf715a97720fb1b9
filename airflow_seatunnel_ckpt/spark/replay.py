"""Run a replay's epochs again on Spark: each with the input it pinned, in order, from the restored state.

:func:`replay_stage` is the stage runtime's half of :mod:`core.ops.replay` (which checks, records and commits the
replay): it runs :func:`runner.execute_stage` per replayed epoch (output staged below ``replayed-<epoch>/``) under the
replay epoch's lease, then prepares, decides and commits the replay epoch (docs/REPLAY.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import posixpath
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_seatunnel_ckpt.core import layout
from airflow_seatunnel_ckpt.core.config import CheckpointConfig
from airflow_seatunnel_ckpt.core.models import CommitResult, OperatorState, SinkManifest, SinkMode
from airflow_seatunnel_ckpt.core.ops.replay import (
    ReplayError,
    ReplayPlan,
    abandon_replay,
    begin_replay,
    finish_replay,
    plan_replay,
    replayed_range,
    resume_replay,
)
from airflow_seatunnel_ckpt.core.protocol.lease import LeaseKeeper, default_holder, liveness, read_lease
from airflow_seatunnel_ckpt.core.storage import FileInfo
from airflow_seatunnel_ckpt.core.store import CheckpointStore
from airflow_seatunnel_ckpt.spark.registry import SOURCES
from airflow_seatunnel_ckpt.spark.runner import (
    StageFunction,
    _record_state_shapes,
    execute_stage,
    load_stage_function,
)
from airflow_seatunnel_ckpt.spark.session import ConnectAttempt, stage_session
from airflow_seatunnel_ckpt.spark.sources.base import Source, SourceError
from airflow_seatunnel_ckpt.spark.spec import UNSCHEDULED_ATTEMPT, StageSpec

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from airflow_seatunnel_ckpt.core.protocol.pipeline import Pipeline
    from airflow_seatunnel_ckpt.spark.state import KeyedState

log = logging.getLogger(__name__)

#: The replay epoch's one attempt: its prepared record and its staging.
ATTEMPT = 1
REPLAYED_DIR = layout.REPLAYED_DIR


@dataclass(frozen=True)
class ReplayResult:
    """What a replay did: its epoch, the epochs run again and replaced, and the commit."""

    pipeline: str
    epoch: int
    run_id: str
    from_epoch: int
    to_epoch: int
    replayed: list[int]
    replaced: list[int]
    commit: CommitResult | None
    #: True when a replay a crash left decided was rolled forward instead (nothing run).
    resumed: bool = False

    def to_dict(self) -> dict[str, Any]:
        """Plain data for ``--json`` output and XCom."""
        return {"pipeline": self.pipeline, "epoch": self.epoch, "run_id": self.run_id,
                "from_epoch": self.from_epoch, "to_epoch": self.to_epoch, "replayed": self.replayed,
                "replaced": self.replaced, "resumed": self.resumed,
                "published": [p.to_dict() for p in self.commit.sinks] if self.commit else []}


def replay_stage(spec: StageSpec, from_epoch: int, to_epoch: int | None = None, *, reason: str, by: str,
                 force: bool = False, spark: SparkSession | None = None,
                 stage_fn: StageFunction | None = None, details: Mapping[str, Any] | None = None,
                 on_connect: Callable[[tuple[ConnectAttempt, SparkSession] | None], None] | None = None
                 ) -> ReplayResult:
    """Replay epochs ``from_epoch..to_epoch`` of ``spec``'s pipeline with ``spec``'s stage as it runs now.

    ``spec.attempt`` is the try that makes the replay; ``to_epoch`` defaults to the newest committed epoch
    (``from_epoch=1``: a full refresh); ``force`` replaces a table's epochs even after another writer committed to it;
    ``details`` join the replay's action record. Through Spark Connect (``spec.remote``, no ``spark``) it runs on the
    server session of :func:`replay_attempt`, told to ``on_connect`` while it runs (for a task's ``on_kill``), after
    :func:`release_killed_replays`.

    :raises ReplayError: the replay cannot run (nothing was changed), or its decision refused it (aborted).
    """
    config = CheckpointConfig.from_mapping(spec.store)
    pipeline = CheckpointStore(config).pipeline(spec.pipeline)
    connect = spark is None and spec.remote is not None  # through Spark Connect: a session of the replay's own
    if connect:
        release_killed_replays(pipeline, spec, by)
    resumed = resume_replay(pipeline)
    if resumed is not None:
        log.warning("pipeline %s: a replay decided before a crash was committed (epoch %d); run the replay again "
                    "only if it is still needed", pipeline.name, resumed.epoch)
        status = pipeline.status(resumed.epoch)
        span = replayed_range(status.run_id) or (from_epoch, to_epoch or from_epoch)
        return ReplayResult(pipeline.name, resumed.epoch, status.run_id or "", span[0], span[1], [], [], resumed,
                            resumed=True)
    plan = plan_replay(pipeline, from_epoch, to_epoch)
    if plan.participant != spec.participant:
        raise ReplayError(f"pipeline {pipeline.name!r}: epochs {plan.from_epoch}..{plan.to_epoch} were written by "
                          f"participant {plan.participant!r}, not {spec.participant!r}; replay with that stage")
    missing = sorted(set(plan.sinks) - set(spec.sinks) - {s for s in plan.sinks if "." in s})
    if missing:
        raise ReplayError(f"pipeline {pipeline.name!r}: the replayed epochs wrote sink(s) {missing}, which the stage "
                          f"no longer declares; their rows could not be replaced. Declare them again to replay")
    _verify_inputs(pipeline, spec, plan)
    fn = stage_fn or load_stage_function(spec.stage)
    session = spark if spark is not None or connect else stage_session(spec)
    recorded = {"stage": spec.stage, "dag_id": (spec.airflow_context or {}).get("dag_id"), "force": force,
                **dict(details or {})}
    epoch, run_id = begin_replay(pipeline, plan, reason=reason, by=by, details=recorded)
    try:
        # (a Connect session is released before a failed replay's staging is removed)
        with contextlib.ExitStack() as opened:
            with LeaseKeeper.for_pipeline(pipeline, epoch, spec.participant, ATTEMPT,
                                          holder=default_holder(run_id=run_id, by=by, **_try_of(spec))):
                if session is None:  # opened once the lease says which try makes the epoch (a later try reads it)
                    attempt = replay_attempt(spec, epoch, spec.attempt)
                    session = opened.enter_context(attempt.session(spec))
                    if on_connect is not None:
                        on_connect((attempt, session))
                        opened.callback(on_connect, None)
                sinks, operators, states = _run_replayed(pipeline, config, spec, session, fn, plan, epoch, run_id)
                commit = finish_replay(pipeline, epoch, run_id, plan, ATTEMPT, sinks=sinks, operators=operators,
                                       reason=reason, by=by, force=force)
            _record_state_shapes(pipeline, spec.participant, states)
    except Exception as exc:  # a failed stage or store: abort now (a killed process leaves it to recovery)
        abandon_replay(pipeline, epoch, exc, by)
        raise
    return ReplayResult(pipeline.name, epoch, run_id, plan.from_epoch, plan.to_epoch, plan.epochs, plan.replaced,
                        commit)


#: The lease holder's fields that say which try of which task makes a replay epoch.
_TASK, _TRY = "task", "try"


def _try_of(spec: StageSpec) -> dict[str, Any]:
    """What the replay's lease holder records of who makes the replay: the task (dag, task, run; none outside Airflow)
    and its try (``spec.attempt``), from which its Connect session derives."""
    task = spec.airflow_context or {}
    named = task.get("dag_id") and task.get("task_id") and task.get("run_id")
    return {_TRY: spec.attempt, _TASK: f"{task['dag_id']}.{task['task_id']} run {task['run_id']}" if named else None}


def replay_attempt(spec: StageSpec, epoch: int, attempt: int) -> ConnectAttempt:
    """The Connect session and tag of replay epoch ``epoch`` made by try ``attempt`` (a replay epoch has no stage
    attempts of its own: its session is named like one of the try that makes it)."""
    return ConnectAttempt.of(spec.remote or "", str(spec.store.get("storage_url") or ""), spec.pipeline, epoch,
                             spec.participant, attempt)


def release_killed_replays(pipeline: Pipeline, spec: StageSpec, by: str) -> None:
    """Release the Connect session of every unsettled replay epoch whose maker is gone, and abort it (a decided one is
    rolled forward by :func:`resume_replay`).

    Gone: an earlier try of the task (Airflow runs one try at a time; not so :data:`~.spec.UNSCHEDULED_ATTEMPT`), or an
    expired lease. The release ends its jobs on the server before its staging is removed; a replay still running
    elsewhere is left alone (:func:`resume_replay` refuses this one).
    """
    mine = _try_of(spec)
    for status in pipeline.list_epochs():
        if status.state.final or replayed_range(status.run_id) is None:
            continue
        lease = read_lease(pipeline.storage, status.epoch, spec.participant)
        holder = lease.holder if lease is not None else {}
        earlier_try = (mine[_TASK] is not None and holder.get(_TASK) == mine[_TASK]
                       and spec.attempt != UNSCHEDULED_ATTEMPT
                       and isinstance(holder.get(_TRY), int) and holder[_TRY] < spec.attempt)
        if earlier_try:
            why = f"try {holder[_TRY]} of {mine[_TASK]} made it and try {spec.attempt} runs now"
        else:  # judged only when the try does not tell already
            judged = liveness(pipeline, status.epoch)
            if not judged.dead:
                continue
            why = judged.describe()
        if not isinstance(holder.get(_TRY), int):  # killed before its lease: it opened no session
            abandon_replay(pipeline, status.epoch, ReplayError(f"its maker is gone: {why}"), by)
            continue
        killed = replay_attempt(spec, status.epoch, holder[_TRY])
        try:
            interrupted = killed.interrupt(release=True)
            log.warning("pipeline %s: replay epoch %d's maker is gone (%s): interrupted its %d Connect operation(s) "
                        "(tag %s) and released its server session", pipeline.name, status.epoch, why,
                        len(interrupted), killed.tag)
        except Exception as exc:  # the session is gone (released, timed out) or the server restarted
            log.warning("pipeline %s: replay epoch %d's maker is gone (%s); its Connect operations (tag %s) could not "
                        "be interrupted, or its session released: %s; a session the server no longer knows runs "
                        "nothing", pipeline.name, status.epoch, why, killed.tag, exc)
        if not status.state.decided:
            abandon_replay(pipeline, status.epoch, ReplayError(f"its maker is gone: {why}"), by)


def _verify_inputs(pipeline: Pipeline, spec: StageSpec, plan: ReplayPlan) -> None:
    """Refuse the replay, before anything is written, unless every replayed epoch's pinned input is still all there: a
    replay with less input would replace committed rows with fewer rows, whatever a source's options allow a normal
    epoch to skip."""
    sources = {name: SOURCES.build(name, opts) for name, opts in spec.sources.items()}
    for replayed in plan.epochs:
        for name, offsets in plan.inputs[replayed].items():
            if name not in sources or not offsets:
                continue
            try:
                sources[name].verify_pinned(offsets)
            except SourceError as exc:
                raise ReplayError(
                    f"pipeline {pipeline.name!r}: cannot replay epochs {plan.from_epoch}..{plan.to_epoch}: epoch "
                    f"{replayed}'s input is not all there any more ({exc}). A replay reads exactly the input each "
                    "epoch read, whatever the source's options, and nothing was written. Replay from a later "
                    "epoch whose input is still there, or restore the input and replay again") from exc


def _run_replayed(pipeline: Pipeline, config: CheckpointConfig, spec: StageSpec, session: SparkSession,
                  fn: StageFunction, plan: ReplayPlan, epoch: int, run_id: str
                  ) -> tuple[list[SinkManifest], dict[str, OperatorState], dict[str, KeyedState]]:
    """Run every replayed epoch in order; the merged sink manifests, the final state, the states opened."""
    base = plan.base
    operators: dict[str, OperatorState] = dict(base.operators)
    staged: dict[str, list[tuple[int, SinkManifest]]] = {}
    states: dict[str, KeyedState] = {}
    for step, replayed in enumerate(plan.epochs, start=1):
        # Each replayed epoch writes its state parts as its own attempt of the replay epoch,
        # so no part of one overwrites another's; its output goes below replayed-<epoch>/.
        step_spec = spec.replace(run_id=run_id, attempt=step)
        inputs = plan.inputs[replayed]

        def pinned(sources: Mapping[str, Source], inputs: dict[str, dict[str, Any]] = inputs,
                   replayed: int = replayed) -> dict[str, dict[str, Any]]:
            new = sorted(set(sources) - set(inputs))
            if new:
                raise ReplayError(f"pipeline {pipeline.name!r}: the stage reads source(s) {new}, which epoch "
                                  f"{replayed} did not read; a replay reads exactly the input each epoch read. "
                                  "Replay from the first epoch that read them")
            for source in sources.values():
                source.read_exactly()
            return {name: dict(inputs[name]) for name in sources}

        def staged_at(sink: str, replayed: int = replayed) -> str:
            return posixpath.join(layout.staging_dir(epoch, ATTEMPT, sink), f"{REPLAYED_DIR}{replayed}")

        log.info("pipeline %s replay epoch %d: running epoch %d again (%d of %d)", pipeline.name, epoch, replayed,
                 step, len(plan.epochs))
        ran = execute_stage(step_spec, session, fn, pipeline, config, epoch, base, pinned, staged_at)
        operators = {**operators, **ran.operators}
        states.update(ran.ctx.states)
        base = dataclasses.replace(base, operators=dict(operators))
        for manifest in ran.manifests:
            staged.setdefault(manifest.sink, []).append((replayed, manifest))
    # A sink the replayed epochs wrote but the replay did not: its rows of those epochs go.
    empty = [dataclasses.replace(sink, staging=layout.staging_dir(epoch, ATTEMPT, name), files=[], rows=0,
                                 expectations=())
             for name, sink in plan.sinks.items() if name not in staged]
    return [_merged(epoch, parts) for parts in staged.values()] + empty, operators, states


def _merged(epoch: int, parts: list[tuple[int, SinkManifest]]) -> SinkManifest:
    """One manifest of a sink over every replayed epoch's staged files (a snapshot sink: the last one's)."""
    first = parts[-1][1]
    if first.mode is SinkMode.SNAPSHOT:
        parts = parts[-1:]
    root = layout.staging_dir(epoch, ATTEMPT, first.sink)
    files = [FileInfo(posixpath.join(f"{REPLAYED_DIR}{replayed}", f.path), f.size, f.crc32c)
             for replayed, manifest in parts for f in manifest.files]
    expectations = tuple(e for _, manifest in parts for e in manifest.expectations)
    return dataclasses.replace(first, staging=root, files=files, rows=sum(m.rows for _, m in parts),
                               expectations=expectations)


__all__ = ["ReplayResult", "release_killed_replays", "replay_attempt", "replay_stage"]
