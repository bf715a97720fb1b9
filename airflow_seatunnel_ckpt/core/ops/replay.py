"""Replay: epochs N..M processed again with the stage's current code, their output replaced, as one
replay epoch (docs/REPLAY.md): :func:`plan_replay` checks, :func:`begin_replay` begins it, the
stage runtime (``spark.replay``) runs the epochs again, :func:`finish_replay` commits it."""

from __future__ import annotations

import dataclasses
import logging
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_seatunnel_ckpt.core.errors import CheckpointError
from airflow_seatunnel_ckpt.core.models import (
    ActionEntry,
    ActionOutcome,
    CommitResult,
    Decision,
    EpochState,
    OperatorState,
    SinkManifest,
    SinkMode,
)
from airflow_seatunnel_ckpt.core.ops.evolution import RUN_ID_PREFIX as EVOLUTION_PREFIX
from airflow_seatunnel_ckpt.core.protocol.restore import RestorePoint, RestoreSource, restore_point_at
from airflow_seatunnel_ckpt.core.sinks.options import PostgresSinkOptions, replay_refusal

if TYPE_CHECKING:
    from airflow_seatunnel_ckpt.core.protocol.pipeline import Pipeline

log = logging.getLogger(__name__)

#: Replay epochs' run ids: ``replay__<from>-<to>__<ms>``.
RUN_ID_PREFIX = "replay__"
#: The kind of the action record a replay writes in its epoch's log.
REPLAY = "replay"
_RUN_ID = re.compile(r"^replay__(\d+)-(\d+)__\d+$")


class ReplayError(CheckpointError):
    """A replay cannot run as asked (epoch in flight, range, sink kind, ...); nothing was changed.
    ``retryable``: it waits for something to finish (an epoch in flight)."""

    def __init__(self, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable


@dataclass(frozen=True)
class ReplayPlan:
    """What a replay runs: the epochs, the input each read, the state it starts from."""

    pipeline: str
    participant: str
    from_epoch: int
    to_epoch: int
    epochs: list[int]  #: the epochs run again, oldest first (committed epochs that read input)
    inputs: dict[int, dict[str, dict[str, Any]]]  #: epoch -> its pinned input plan
    #: The epochs whose output the replay removes (the re-run ones and earlier replays inside the range).
    replaced: list[int]
    base: RestorePoint  #: the keyed state as of the epoch before ``from_epoch``
    latest: RestorePoint  #: the newest committed checkpoint: its source histories are carried
    sinks: dict[str, SinkManifest] = field(default_factory=dict)  #: name -> a manifest of one of them

    def to_dict(self) -> dict[str, Any]:
        """The plan for logs, the action record and ``--json`` output."""
        return {"pipeline": self.pipeline, "participant": self.participant, "from_epoch": self.from_epoch,
                "to_epoch": self.to_epoch, "epochs": list(self.epochs), "replaced": list(self.replaced),
                "base_epoch": self.base.epoch, "latest_epoch": self.latest.epoch, "sinks": sorted(self.sinks)}


def replayed_range(run_id: str | None) -> tuple[int, int] | None:
    """The epochs an earlier replay epoch replaced, from its run id (None: not a replay)."""
    match = _RUN_ID.match(run_id or "")
    return (int(match.group(1)), int(match.group(2))) if match else None


def resume_replay(pipeline: Pipeline) -> CommitResult | None:
    """Roll forward a replay epoch a killed process left COMMITTING (None: there is none); any other
    unsettled epoch refuses the replay with :class:`ReplayError`."""
    resumed = None
    for status in pipeline.list_epochs():
        if status.state.final:
            continue
        replay = replayed_range(status.run_id)
        if replay is not None and status.state is EpochState.COMMITTING:
            log.warning("pipeline %s: resuming replay epoch %d (epochs %d..%d), decided commit before a crash",
                        pipeline.name, status.epoch, *replay)
            resumed = pipeline.commit(status.epoch)
            continue
        what = f"replay of epochs {replay[0]}..{replay[1]}" if replay else f"run {status.run_id!r}"
        raise ReplayError(
            f"pipeline {pipeline.name!r}: cannot replay while epoch {status.epoch} ({what}) is "
            f"{status.state.value}; let it finish (commit or abort), or resolve it with "
            f"`seatunnel-ckpt recover {pipeline.name} --apply` (an abandoned replay is aborted once its lease "
            "expired: nothing of it was published), then replay again", retryable=True)
    return resumed


def plan_replay(pipeline: Pipeline, from_epoch: int, to_epoch: int | None = None) -> ReplayPlan:
    """Check that epochs ``from_epoch..to_epoch`` (default: the newest committed) can be replayed and say
    how; :class:`ReplayError` names what refuses it. Nothing is written."""
    name = pipeline.name
    committed = pipeline.committed_epochs()
    if not committed:
        raise ReplayError(f"pipeline {name!r} has no committed epoch to replay")
    last = committed[-1]
    to_epoch = last if to_epoch is None else to_epoch
    if isinstance(from_epoch, bool) or not isinstance(from_epoch, int) or not 1 <= from_epoch <= to_epoch <= last:
        raise ReplayError(f"pipeline {name!r}: cannot replay epochs {from_epoch}..{to_epoch}: the range must lie "
                          f"within 1..{last} (the newest committed epoch), from <= to")
    statuses = {s.epoch: s for s in pipeline.list_epochs() if from_epoch <= s.epoch <= last}
    epochs: list[int] = []
    replaced: list[int] = []
    for epoch in sorted(statuses):
        status = statuses[epoch]
        if status.state is not EpochState.COMMITTED:
            continue
        earlier = replayed_range(status.run_id)
        if earlier is not None:
            if earlier[0] < from_epoch <= earlier[1]:
                raise ReplayError(
                    f"pipeline {name!r}: epoch {from_epoch} was replayed by epoch {epoch} together with epochs "
                    f"{earlier[0]}..{earlier[1]}, whose output is one set of files; replay from epoch "
                    f"{earlier[0]} (or earlier)")
            if earlier[0] >= from_epoch and epoch <= to_epoch:
                replaced.append(epoch)
            elif earlier[0] <= to_epoch < earlier[1] or (earlier[0] >= from_epoch and epoch > to_epoch):
                raise ReplayError(
                    f"pipeline {name!r}: epochs {earlier[0]}..{earlier[1]} were replayed together by epoch "
                    f"{epoch}; replay through epoch {epoch} (omit --to-epoch)")
            continue
        if epoch > to_epoch or (status.run_id or "").startswith(EVOLUTION_PREFIX):
            continue
        epochs.append(epoch)
        replaced.append(epoch)
    participants = {p for e in epochs for p in statuses[e].prepared}
    if len(participants) > 1:
        raise ReplayError(f"pipeline {name!r}: epochs {from_epoch}..{to_epoch} have several participants "
                          f"{sorted(participants)}; a replay runs one stage (a pipeline of one participant)")
    if not epochs:
        raise ReplayError(f"pipeline {name!r}: no committed epoch in {from_epoch}..{to_epoch} read input; "
                          "nothing to replay")
    participant = participants.pop()
    sinks = _replayable_sinks(pipeline, {e: statuses[e].prepared[participant].sinks for e in epochs},
                              to_epoch == last)
    latest = pipeline.restore_point(deep=True)
    if latest.how is not RestoreSource.PRIMARY or latest.epoch != last:
        raise ReplayError(f"pipeline {name!r}: the newest committed checkpoint {last} does not verify (the state "
                          f"would come from {latest.how.value}); run `seatunnel-ckpt verify {name}` first")
    if to_epoch != last and latest.operators:
        raise ReplayError(
            f"pipeline {name!r} has keyed state {sorted(latest.operators)}, which epochs {to_epoch + 1}..{last} "
            f"built on the epochs being replaced; replay through the newest epoch {last} (omit --to-epoch) so "
            "the state is what a fresh run gives")
    before = [e for e in committed if e < from_epoch]
    try:
        base = restore_point_at(pipeline.checkpoints, before[-1]) if before else RestorePoint(None,
                                                                                            RestoreSource.EMPTY)
    except CheckpointError as exc:
        raise ReplayError(f"pipeline {name!r}: the state before epoch {from_epoch} cannot be restored: {exc}. "
                          f"Replay from an epoch whose previous checkpoint is kept, or from epoch 1 (a full "
                          "refresh, from empty state)") from exc
    inputs = {}
    for epoch in epochs:
        plan = pipeline.txlog.read_plan(epoch, participant)
        if plan is None:  # an epoch written before plans were pinned: what it consumed
            plan = {s: dict(state.offsets) for s, state in statuses[epoch].prepared[participant].sources.items()}
        inputs[epoch] = plan
    return ReplayPlan(name, participant, from_epoch, to_epoch, epochs, inputs, sorted(replaced), base, latest,
                      sinks)


def _replayable_sinks(pipeline: Pipeline, manifests: Mapping[int, Sequence[SinkManifest]],
                      through_newest: bool) -> dict[str, SinkManifest]:
    """Every sink of the replayed epochs (epoch -> its sinks), if each can be replaced in one commit; else
    ReplayError."""
    sinks: dict[str, SinkManifest] = {}
    recorded: dict[str, dict[int, PostgresSinkOptions]] = {}  # sink -> replayed epoch -> its options
    for epoch, epoch_sinks in sorted(manifests.items()):
        for sink in epoch_sinks:
            sinks[sink.sink] = sink
            if isinstance(sink.table, PostgresSinkOptions):
                recorded.setdefault(sink.sink, {})[epoch] = sink.table
    for sink in sinks.values():
        why = None
        if sink.mode is SinkMode.UPSERT:
            # Through the newest epoch, the replaced keys are restored from the table's history or
            # kept before-images (the sink's precheck refuses one whose history is gone).
            why = None if through_newest else (
                "it upserts by key (merge_keys), so it holds per key the newest epoch's value: a replay that ends "
                "before the newest epoch would undo the later epochs' values. Replay through the newest epoch "
                "(omit --to-epoch)")
        elif sink.sink in recorded:
            why = replay_refusal(recorded[sink.sink])
        elif sink.mode is SinkMode.SNAPSHOT and not through_newest:
            why = ("it is a snapshot sink, which holds only the newest epoch's output: replaying earlier epochs "
                   "alone cannot change it, and running the newest again would replace the later epochs' output "
                   "of the other sinks too. Replay through the newest epoch (omit --to-epoch)")
        if why:
            raise ReplayError(f"pipeline {pipeline.name!r}: sink {sink.sink!r} cannot be replayed atomically: "
                              f"{why}. Nothing was changed")
    return sinks



def begin_replay(pipeline: Pipeline, plan: ReplayPlan, *, reason: str, by: str,
                 details: Mapping[str, Any] | None = None) -> tuple[int, str]:
    """Begin the replay epoch and write its ``replay`` action record; its epoch and run id.

    An epoch committed since the plan would be lost from the replay's state and histories
    (``plan.latest``): the replay epoch is then aborted (:class:`ReplayError`). Once it has
    begun no other epoch can begin, so the check cannot be overtaken.
    """
    if not reason.strip() or not by.strip():
        raise ReplayError(f"pipeline {pipeline.name!r}: a replay needs a reason and who runs it (both are kept in "
                          "the transaction log)")
    run_id = f"{RUN_ID_PREFIX}{plan.from_epoch}-{plan.to_epoch}__{int(time.time() * 1000)}"
    epoch = pipeline.begin(run_id).epoch
    newest = max((e for e in pipeline.committed_epochs() if e < epoch), default=None)
    if newest != plan.latest.epoch:
        which = ("no epoch is committed" if newest is None
                 else f"epoch {newest} (run {pipeline.status(newest).run_id!r})")
        why = (f"{which} committed after the replay of epochs "
               f"{plan.from_epoch}..{plan.to_epoch} was planned against epoch {plan.latest.epoch}")
        pipeline.abort(epoch, f"replay refused: {why}", by=by)
        raise ReplayError(f"pipeline {pipeline.name!r}: {why}; the replay would carry that epoch's state and consumed "
                          f"input no further. Replay epoch {epoch} was aborted, nothing changed: replay again")
    # An action record holds plain values: lists of epochs as "6,7,8".
    fields = {k: ",".join(map(str, v)) if isinstance(v, list) else v
              for k, v in {**plan.to_dict(), **dict(details or {})}.items()}
    pipeline.txlog.record_action(epoch, REPLAY, by, reason, **fields)
    log.warning("pipeline %s: replay of epochs %d..%d begins as epoch %d, by %s (%s)", pipeline.name,
                plan.from_epoch, plan.to_epoch, epoch, by, reason)
    return epoch, run_id


def replacing(manifest: SinkManifest, plan: ReplayPlan, force: bool) -> SinkManifest:
    """``manifest`` (a replay's staged output of one sink) as the replacement of ``plan``'s epochs; a
    file sink's epochs' files with the same path (published into one directory) are :class:`ReplayError`."""
    if manifest.mode is SinkMode.SNAPSHOT and manifest.table is not None:  # the newest snapshot replaces it anyway
        return manifest
    if manifest.table is None:
        seen: dict[str, str] = {}
        for f in manifest.files:
            sub, _, rel = f.path.partition("/")
            if seen.setdefault(rel, sub) != sub:
                raise ReplayError(f"pipeline {plan.pipeline!r}: sink {manifest.sink!r}: the replayed epochs' staged "
                                  f"directories {seen[rel]} and {sub} both hold a file {rel!r}, and a file sink "
                                  "publishes them into one directory. Give the sink's writer unique file names "
                                  "(Spark's and the staged writer's are)")
    return dataclasses.replace(manifest, replaces=tuple(plan.replaced), force_replace=force,
                               full_refresh=plan.base.epoch is None)


def _action(pipeline: Pipeline, epoch: int) -> ActionEntry | None:
    return next((a for a in pipeline.txlog.actions(epoch) if a.record.action == REPLAY), None)


def abandon_replay(pipeline: Pipeline, epoch: int, error: Exception, by: str) -> None:
    """Abort replay epoch ``epoch`` after ``error`` (nothing was published), unless it was decided commit."""
    if pipeline.state(epoch) in (EpochState.COMMITTING, EpochState.COMMITTED):
        return
    pipeline.abort(epoch, f"replay failed before its decision: {type(error).__name__}", by=by)
    entry = _action(pipeline, epoch)
    if entry is not None and entry.outcome is None:
        pipeline.txlog.record_outcome(epoch, entry.name, ActionOutcome.FAILED, f"{type(error).__name__}: {error}")


def finish_replay(pipeline: Pipeline, epoch: int, run_id: str, plan: ReplayPlan, attempt: int, *,
                  sinks: list[SinkManifest], operators: Mapping[str, OperatorState], reason: str, by: str,
                  force: bool = False) -> CommitResult:
    """Prepare, decide and commit the replay epoch ``epoch``; a refusal at the decision aborts it
    (:class:`ReplayError`), any other failure is raised as it is (for :func:`abandon_replay`)."""
    entry = _action(pipeline, epoch)
    action = entry.name if entry is not None else None
    pipeline.prepare(epoch, plan.participant, attempt, run_id=run_id,
                     sinks=[replacing(s, plan, force) for s in sinks], operators=dict(operators),
                     sources={}, base=plan.latest)
    decision = pipeline.decide(epoch, Decision.COMMIT, f"replay of epochs {plan.from_epoch}..{plan.to_epoch}: "
                               f"{reason}", by)
    if decision.decision is not Decision.COMMIT:
        if action is not None:
            pipeline.txlog.record_outcome(epoch, action, ActionOutcome.FAILED, decision.reason)
        raise ReplayError(f"pipeline {pipeline.name!r}: the replay of epochs {plan.from_epoch}..{plan.to_epoch} "
                          f"(epoch {epoch}) was refused and aborted, nothing changed: {decision.reason}")
    result = pipeline.commit(epoch)
    if action is not None:
        pipeline.txlog.record_outcome(epoch, action, ActionOutcome.SUCCEEDED,
                                      f"epochs {plan.epochs} replayed; output of epochs {plan.replaced} replaced")
    log.warning("pipeline %s: epochs %d..%d replayed as epoch %d by %s (%s)", pipeline.name, plan.from_epoch,
                plan.to_epoch, epoch, by, reason)
    return result
