"""Replay: epochs N..M processed again with the stage's current code, their output replaced.

A replay (a *full refresh* is a replay from epoch 1) is one **replay epoch** ``R``, a
normal epoch of the log with run id ``replay__<N>-<M>__<ms>``:

1. :func:`plan_replay` checks, before anything is written, what can refuse it: an epoch
   in flight, ``N..M`` outside the committed epochs, more than one participant, an upsert
   or snapshot sink not replayed through the newest epoch, keyed state with ``M`` not the
   newest epoch, ``N`` inside an earlier replay, the checkpoint before ``N`` unrestorable;
2. :func:`begin_replay` begins ``R`` and writes its ``action-*-replay`` record (who, why,
   which epochs and code); an epoch committed since the plan refuses it;
3. the stage runtime (``spark.replay``) runs each replayed epoch again, in order, with the
   input that epoch pinned, staging the output below ``R``'s staging;
4. :func:`finish_replay` prepares, decides and commits ``R``: each table sink's commit is
   one transaction removing the replaced epochs' data files and adding the new ones
   (:attr:`SinkManifest.replaces`), refused at the decision after another writer's commit
   unless ``force``; a file sink swaps directories through its ``_EPOCHS`` pointer.

Killed before its decision, ``R`` is aborted by recovery once its lease expires; killed
after it, recovery or :func:`resume_replay` rolls it forward.
"""

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

    A refusal that running the replay again cannot change (a range, a sink kind, the table's
    other writer) is not retryable; one that waits for something to finish (an epoch in
    flight) is.
    """

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
    #: The epochs run again, oldest first (committed epochs that read input).
    epochs: list[int]
    #: Epoch -> its pinned input plan (source -> offsets), as the log recorded it.
    inputs: dict[int, dict[str, dict[str, Any]]]
    #: The epochs whose output the replay removes (the re-run ones and earlier replays inside the range).
    replaced: list[int]
    #: The keyed state as of the epoch before ``from_epoch`` (empty for a full refresh).
    base: RestorePoint
    #: The newest committed checkpoint: its source histories are carried (nothing read twice).
    latest: RestorePoint
    #: The sinks of the replayed epochs: name -> a manifest of one of them (its options and mode).
    sinks: dict[str, SinkManifest] = field(default_factory=dict)

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
    """Roll forward a replay epoch a killed process left COMMITTING (None: there is none).

    Any other unsettled epoch refuses the replay with :class:`ReplayError` naming it and the
    way out; a replay epoch killed before its decision is aborted by recovery once its
    lease expired.
    """
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
    """Check that epochs ``from_epoch..to_epoch`` can be replayed and say how (see the module docs).

    ``to_epoch`` defaults to the newest committed epoch. Raises :class:`ReplayError`
    naming what refuses the replay and what to do; nothing is written.
    """
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
            why = _upsert_refusal(through_newest)
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


def _upsert_refusal(through_newest: bool) -> str | None:
    """Why an upsert sink (merge_keys) cannot be replayed so (None: it can).

    Its rows hold per key the newest epoch's value, so a replay must run through the newest
    epoch (else the later epochs' values would be lost or overwritten by older ones). A full
    refresh replaces the table's content with the replayed rows; a replay from a later epoch
    restores the keys the replaced epochs wrote to their values before them, from the
    table's history (Iceberg, Delta) or the before-images its epochs kept (PostgreSQL): the
    sink's precheck refuses one whose history is gone.
    """
    if not through_newest:
        return ("it upserts by key (merge_keys), so it holds per key the newest epoch's value: a replay that ends "
                "before the newest epoch would undo the later epochs' values. Replay through the newest epoch "
                "(omit --to-epoch)")
    return None


def begin_replay(pipeline: Pipeline, plan: ReplayPlan, *, reason: str, by: str,
                 details: Mapping[str, Any] | None = None) -> tuple[int, str]:
    """Begin the replay epoch and write its ``replay`` action record; its epoch and run id.

    The replay's state and source histories are those of the newest committed epoch when it
    was planned (``plan.latest``). An epoch that committed between the plan and this begin
    would be lost from them (the next epoch would read its input again), so the replay
    epoch is then aborted and :class:`ReplayError` says to replay again. Once the replay
    epoch has begun no other epoch can begin before it is decided (:meth:`TransactionLog.begin`),
    so the check cannot be overtaken.
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
    """``manifest`` (a replay's staged output of one sink) as the replacement of ``plan``'s epochs.

    A file sink's files (``<replayed-epoch dir>/<path>``, one staged directory per epoch run
    again) are published side by side into one directory: two with the same ``<path>`` are
    refused here, before the decision, with :class:`ReplayError`.
    """
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


def _action(pipeline: Pipeline, epoch: int) -> str | None:
    return next((a.name for a in pipeline.txlog.actions(epoch) if a.record.action == REPLAY), None)


def abandon_replay(pipeline: Pipeline, epoch: int, error: Exception, by: str) -> None:
    """Abort replay epoch ``epoch`` after ``error``, unless it was decided commit (then it rolls forward).

    Called when running the replayed epochs or preparing failed: nothing was published, and
    the next replay can run at once (a killed process leaves this to recovery instead).
    """
    if pipeline.state(epoch) in (EpochState.COMMITTING, EpochState.COMMITTED):
        return
    pipeline.abort(epoch, f"replay failed before its decision: {type(error).__name__}", by=by)
    entry = next((a for a in pipeline.txlog.actions(epoch) if a.record.action == REPLAY), None)
    if entry is not None and entry.outcome is None:
        pipeline.txlog.record_outcome(epoch, entry.name, ActionOutcome.FAILED, f"{type(error).__name__}: {error}")


def finish_replay(pipeline: Pipeline, epoch: int, run_id: str, plan: ReplayPlan, attempt: int, *,
                  sinks: list[SinkManifest], operators: Mapping[str, OperatorState], reason: str, by: str,
                  force: bool = False) -> CommitResult:
    """Prepare, decide and commit the replay epoch ``epoch`` (see the module docs).

    A refusal at the decision (another writer's commit to a table, ``force`` unset) aborts
    the replay epoch and raises :class:`ReplayError` with the refusal: nothing changed. Any
    other failure is raised as it is (the caller abandons the epoch, :func:`abandon_replay`).
    """
    action = _action(pipeline, epoch)
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


__all__ = ["REPLAY", "RUN_ID_PREFIX", "ReplayError", "ReplayPlan", "abandon_replay", "begin_replay", "finish_replay",
           "plan_replay", "replayed_range", "replacing", "resume_replay"]
