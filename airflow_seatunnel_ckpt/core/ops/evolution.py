"""Evolving a pipeline's keyed state on purpose: rename, drop, reset, rescale, each as one audited
evolution epoch, a normal committed epoch of the log (docs/OPERATIONS.md, "Evolving a pipeline")."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_seatunnel_ckpt.core import layout
from airflow_seatunnel_ckpt.core.errors import CheckpointError
from airflow_seatunnel_ckpt.core.layout import validate_name
from airflow_seatunnel_ckpt.core.models import Decision, EpochState, OperatorState, PartRef
from airflow_seatunnel_ckpt.core.protocol.descriptor import (
    PipelineDescriptor,
    StateDescriptor,
    read_descriptor,
    write_descriptor_change,
)
from airflow_seatunnel_ckpt.core.protocol.lease import LeaseKeeper, default_holder
from airflow_seatunnel_ckpt.core.protocol.restore import RestoreSource
from airflow_seatunnel_ckpt.core.state.checkpoint import read_chain, write_arrow_part
from airflow_seatunnel_ckpt.core.state.key_groups import key_groups_of

if TYPE_CHECKING:
    from airflow_seatunnel_ckpt.core.protocol.pipeline import Pipeline
    from airflow_seatunnel_ckpt.core.protocol.restore import RestorePoint

log = logging.getLogger(__name__)

#: Evolution epochs' run ids start with this (``evolution__rename__1732370000000``).
RUN_ID_PREFIX = "evolution__"
_ATTEMPT = 1


class EvolutionError(CheckpointError):
    """An evolution command cannot run as asked (epoch in flight, unknown state, ...)."""


@dataclass(frozen=True)
class EvolutionResult:
    """What an evolution command did: its epoch and the states it changed."""

    pipeline: str
    action: str
    epoch: int
    run_id: str
    states: dict[str, str]  #: state -> what happened to it
    descriptor_version: int | None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


#: Given (participant, its operators, the evolution epoch), the operators it prepares.
Change = Callable[[str, dict[str, OperatorState], int], dict[str, OperatorState]]


def _require_settled(pipeline: Pipeline, action: str) -> None:
    for status in reversed(pipeline.list_epochs()):
        if not status.state.final:
            where = pipeline.storage.describe_path(layout.txlog_dir(status.epoch))
            raise EvolutionError(
                f"pipeline {pipeline.name!r}: cannot {action} while epoch {status.epoch} is "
                f"{status.state.value} ({where}); let it finish (commit or abort), or resolve it with "
                f"`seatunnel-ckpt recover {pipeline.name} --apply`, then run the command again")


def _owners(pipeline: Pipeline, base: RestorePoint) -> dict[str, dict[str, OperatorState]]:
    """Each participant of the base checkpoint with the operators it prepared there."""
    assert base.epoch is not None
    meta = pipeline.checkpoints.read_metadata(base.epoch)
    declared = pipeline.declared_participants()
    participants = sorted(set(meta.participants) | set(declared or []))
    owned: dict[str, dict[str, OperatorState]] = {}
    for participant in participants:
        record = pipeline.txlog.read_prepared(base.epoch, participant) if participant in meta.participants else None
        names = set(record.operators) if record is not None else set()
        owned[participant] = {n: op for n, op in base.operators.items() if n in names}
    orphans = set(base.operators) - {n for ops in owned.values() for n in ops}
    if orphans and participants:  # carried by a participant no longer recorded: keep them
        owned[participants[0]].update({n: base.operators[n] for n in orphans})
    return owned


def _evolve(pipeline: Pipeline, action: str, reason: str, by: str, change: Change,
            describe: Callable[[PipelineDescriptor], PipelineDescriptor] | None) -> tuple[int, str, int | None]:
    """Write one evolution epoch whose participants prepare ``change``'s operators; commit it."""
    _require_settled(pipeline, action)
    base = pipeline.restore_point(deep=True)
    if base.epoch is None:
        raise EvolutionError(f"pipeline {pipeline.name!r} in {pipeline.storage.describe()} has no committed "
                             f"epoch, so no state to {action}; a new pipeline's states take any shape")
    if base.how is not RestoreSource.PRIMARY:
        raise EvolutionError(
            f"pipeline {pipeline.name!r}: the newest committed checkpoint {base.epoch} does not verify (the "
            f"state would come from {base.how.value}); run `seatunnel-ckpt verify {pipeline.name}` and repair "
            f"it (or let a stage run restore it) before you {action} state")
    owned = _owners(pipeline, base)
    run_id = f"{RUN_ID_PREFIX}{action}__{int(time.time() * 1000)}"
    epoch = pipeline.begin(run_id).epoch
    try:
        # Rewriting a large state may take longer than the lease timeout: hold each
        # participant's lease, as a stage does, so recovery sees a live epoch (and a
        # dead one if this process dies).
        with contextlib.ExitStack() as leases:
            for participant in sorted(owned):
                leases.enter_context(LeaseKeeper.for_pipeline(
                    pipeline, epoch, participant, _ATTEMPT, holder=default_holder(run_id=run_id, by=by)))
            for participant, operators in sorted(owned.items()):
                pipeline.prepare(epoch, participant, _ATTEMPT, run_id=run_id, sinks=[],
                                 operators=change(participant, dict(operators), epoch), sources={}, base=base)
        decision = pipeline.decide(epoch, Decision.COMMIT, reason=f"{action}: {reason}", by=by)
        if decision.decision is not Decision.COMMIT:
            raise EvolutionError(f"pipeline {pipeline.name!r} evolution epoch {epoch} was aborted "
                                 f"({decision.reason}); nothing changed, run the command again")
    except BaseException:
        if pipeline.state(epoch) not in (EpochState.COMMITTING, EpochState.COMMITTED):
            pipeline.abort(epoch, f"{action} failed before its decision", by=by)
        raise
    pipeline.commit(epoch)
    version = None
    if describe is not None and read_descriptor(pipeline.storage) is not None:
        version = write_descriptor_change(pipeline, describe).version
    log.warning("pipeline %s: %s in evolution epoch %d by %s (%s)", pipeline.name, action, epoch, by, reason)
    return epoch, run_id, version


def _state_owner(pipeline: Pipeline, state: str, action: str) -> None:
    base = pipeline.restore_point(deep=False)
    if base.epoch is None:
        raise EvolutionError(f"pipeline {pipeline.name!r} in {pipeline.storage.describe()} has no committed "
                             f"epoch, so no keyed state {state!r} to {action}; check the pipeline and store names "
                             f"(`seatunnel-ckpt pipelines`)")
    if state not in base.operators:
        raise EvolutionError(
            f"pipeline {pipeline.name!r}: the committed checkpoint {base.epoch} has no keyed state {state!r} "
            f"to {action} (it has: {sorted(base.operators) or 'none'}); check the name with "
            f"`seatunnel-ckpt describe {pipeline.name}`")


def _rewrite(pipeline: Pipeline, op: OperatorState, name: str, epoch: int, key_groups: int) -> OperatorState:
    """Every row of ``op`` written as full parts of state ``name`` with ``key_groups`` key groups."""
    import pyarrow as pa
    import pyarrow.compute as pc

    storage = pipeline.storage
    tables = [read_chain(storage, chain, list(op.key_columns)) for _, chain in sorted(op.chains.items()) if chain]
    chains: dict[int, list[PartRef]] = {}
    if tables:
        rows = pa.concat_tables(tables, promote_options="default")
        groups = pa.array(key_groups_of(rows, op.key_columns, key_groups), pa.int32())
        level = pipeline.config.compression_level
        for group in sorted(set(groups.to_pylist())):
            part = rows.filter(pc.equal(groups, group))
            part = part.sort_by([(k, "ascending") for k in op.key_columns])  # as the executors write parts
            path = layout.part_path(epoch, "operators", name, group, _ATTEMPT)
            chains[group] = [write_arrow_part(storage, path, part, epoch=epoch, key_group=group, level=level)]
    return dataclasses.replace(op, key_groups=key_groups, chains=chains)  # kind, keys and shape carried


def _with_states(participant_states: Callable[[dict[str, StateDescriptor]], dict[str, StateDescriptor]]
                 ) -> Callable[[PipelineDescriptor], PipelineDescriptor]:
    def describe(current: PipelineDescriptor) -> PipelineDescriptor:
        participants = {name: dataclasses.replace(shape, states=participant_states(dict(shape.states)))
                        for name, shape in current.participants.items()}
        return dataclasses.replace(current, participants=participants)
    return describe


def rename_state(pipeline: Pipeline, old: str, new: str, *, reason: str = "", by: str = "cli") -> EvolutionResult:
    """Rename keyed state ``old`` to ``new`` keeping every value (new full parts under ``new``)."""
    validate_name(new, "state name")
    _state_owner(pipeline, old, "rename")
    base = pipeline.restore_point(deep=False)
    if new in base.operators:
        raise EvolutionError(f"pipeline {pipeline.name!r}: keyed state {new!r} already exists in checkpoint "
                             f"{base.epoch}; drop it first (`seatunnel-ckpt state drop {pipeline.name} {new}`) "
                             "or choose another name")

    def change(_: str, operators: dict[str, OperatorState], epoch: int) -> dict[str, OperatorState]:
        if old in operators:
            op = operators.pop(old)
            operators[new] = _rewrite(pipeline, op, new, epoch, op.key_groups)
        return operators

    def states(current: dict[str, StateDescriptor]) -> dict[str, StateDescriptor]:
        if old in current:
            current[new] = current.pop(old)
        return current

    epoch, run_id, version = _evolve(pipeline, "rename", reason or f"state {old!r} renamed to {new!r}", by,
                                     change, _with_states(states))
    return EvolutionResult(pipeline.name, "rename", epoch, run_id, {old: f"renamed to {new}"}, version)


def _remove(pipeline: Pipeline, state: str, action: str, reason: str, by: str) -> EvolutionResult:
    _state_owner(pipeline, state, action)

    def change(_: str, operators: dict[str, OperatorState], epoch: int) -> dict[str, OperatorState]:
        operators.pop(state, None)
        return operators

    def states(current: dict[str, StateDescriptor]) -> dict[str, StateDescriptor]:
        current.pop(state, None)
        return current

    what = "dropped" if action == "drop" else "reset to empty"
    epoch, run_id, version = _evolve(pipeline, action, reason or f"state {state!r} {what}", by, change,
                                     _with_states(states))
    return EvolutionResult(pipeline.name, action, epoch, run_id, {state: what}, version)


def drop_state(pipeline: Pipeline, state: str, *, reason: str = "", by: str = "cli") -> EvolutionResult:
    """Remove keyed state ``state`` and its recorded shape (the stage no longer uses it)."""
    return _remove(pipeline, state, "drop", reason, by)


def reset_state(pipeline: Pipeline, state: str, *, reason: str = "", by: str = "cli") -> EvolutionResult:
    """Make keyed state ``state`` start empty; its next run records a new shape (the checkpoint is
    the same as after :func:`drop_state`, the audit record says which was meant)."""
    return _remove(pipeline, state, "reset", reason, by)


def rescale(pipeline: Pipeline, key_groups: int, *, reason: str = "", by: str = "cli") -> EvolutionResult:
    """Re-partition every keyed state of the pipeline into ``key_groups`` key groups (rows placed by
    Spark's hash); afterwards the stage must run with ``key_groups=<key_groups>``."""
    if isinstance(key_groups, bool) or not isinstance(key_groups, int) or not 1 <= key_groups < 1 << 20:
        raise EvolutionError(f"rescale: key groups must be a whole number from 1 to {1 << 20}, got {key_groups!r}")
    base = pipeline.restore_point(deep=False)
    before = {name: op.key_groups for name, op in base.operators.items()}
    if before and all(g == key_groups for g in before.values()):
        raise EvolutionError(f"pipeline {pipeline.name!r}: every keyed state already has {key_groups} key groups; "
                             "nothing to rescale")

    def change(_: str, operators: dict[str, OperatorState], epoch: int) -> dict[str, OperatorState]:
        return {name: _rewrite(pipeline, op, name, epoch, key_groups) for name, op in operators.items()}

    def states(current: dict[str, StateDescriptor]) -> dict[str, StateDescriptor]:
        return {name: dataclasses.replace(s, key_groups=key_groups) for name, s in current.items()}

    epoch, run_id, version = _evolve(pipeline, "rescale", reason or f"key groups -> {key_groups}", by, change,
                                     _with_states(states))
    return EvolutionResult(pipeline.name, "rescale", epoch, run_id,
                           {name: f"{g} -> {key_groups} key groups" for name, g in sorted(before.items())}, version)
