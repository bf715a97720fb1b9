"""Recovery: :func:`resolve_epoch` judges one unfinished epoch and moves it on; :func:`recover`
resolves every epoch above the settled watermark and removes what no record needs. Both act
through the protocol's own transitions, so running them beside a pipeline, or twice at once, is safe.
"""

from __future__ import annotations

import enum
import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from airflow_seatunnel_ckpt.core import layout
from airflow_seatunnel_ckpt.core.errors import (
    CheckpointError,
    CorruptCheckpointError,
    DecisionConflictError,
    PendingEpochError,
)
from airflow_seatunnel_ckpt.core.models import BeginRecord, EpochState
from airflow_seatunnel_ckpt.core.protocol import sweep
from airflow_seatunnel_ckpt.core.protocol.lease import (
    EpochDir,
    EpochLiveness,
    Liveness,
    abort_command,
    lease_timeout,
    liveness,
    store_now,
    wait_for,
)
from airflow_seatunnel_ckpt.core.protocol.pipeline import Pipeline

log = logging.getLogger(__name__)


class RecoveryStep(enum.StrEnum):
    """What a recovery action does (``RecoveryAction.action``)."""

    FINISH_COMMIT = "finish-commit"  #: publish a commit-decided epoch and acknowledge it
    FINISH_ABORT = "finish-abort"  #: remove an abort-decided epoch's staging and checkpoint
    ABORT_TIMEOUT = "abort-timeout"  #: abort an undecided epoch past its deadline (lease or prepared timeout)
    ABORT_DEAD_OWNER = "abort-dead-owner"  #: abort an undecided epoch whose DAG run is finished
    WAIT = "wait"  #: an undecided epoch within its deadline: nothing to do yet
    FINAL = "final"  #: a committed or aborted epoch: nothing to do ever
    INSPECT = "inspect"  #: a damaged record; the operator has to look
    DROP_STAGING = "drop-staging"  #: staging no open epoch needs
    DROP_CHECKPOINT = "drop-checkpoint"  #: the checkpoint directory of an aborted or unknown epoch
    DROP_TEMP = "drop-temp"  #: a temp file left by a killed writer


#: The steps that leave an epoch final once done (the Checkpoints page records them with the user).
RESOLVING = frozenset({RecoveryStep.FINISH_COMMIT, RecoveryStep.FINISH_ABORT, RecoveryStep.ABORT_TIMEOUT,
                       RecoveryStep.ABORT_DEAD_OWNER})


@dataclass(frozen=True)
class RecoveryAction:
    """One thing recovery did (or, in a dry run, would do)."""

    epoch: int | None
    action: RecoveryStep
    reason: str
    done: bool = False
    error: str = ""

    def to_dict(self) -> dict[str, Any]:
        """Plain data for logs, XCom and ``--json`` output."""
        return {"epoch": self.epoch, "action": str(self.action), "reason": self.reason, "done": self.done,
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
        """Plain data for logs, XCom and ``--json`` output."""
        return {"pipeline": self.pipeline, "dry_run": self.dry_run, "actions": [a.to_dict() for a in self.actions]}


#: ``run_finished(run_id, dag_id)``: whether the DAG run that began an epoch is over (None: unknown).
RunFinished = Callable[[str, str], "bool | None"]


def _ask_run_finished(pipeline: Pipeline, run_finished: RunFinished | None,
                      begin: BeginRecord | None) -> bool | None:
    if run_finished is None or begin is None:
        return None
    try:
        return run_finished(begin.run_id, begin.dag_id)
    except Exception as exc:  # an orchestrator that cannot answer is "unknown", never fatal
        log.warning("pipeline %s: cannot tell whether run %r is finished: %s", pipeline.name, begin.run_id, exc)
        return None


@dataclass(frozen=True)
class Resolution:
    """What :func:`resolve_epoch` did to one epoch, or why it waits."""

    epoch: int
    step: RecoveryStep  #: what it did (or, in a dry run, would do)
    reason: str
    state: EpochState | None = None  #: None: a record of the epoch is damaged
    done: bool = False
    error: str = ""  #: why the step failed, or why the epoch cannot be judged (``INSPECT``)
    judged: EpochLiveness | None = None
    result: Any = None  #: the commit's result or the abort's decision record

    @property
    def waits(self) -> bool:
        """Whether the epoch is undecided and alive: its owner may still finish it."""
        return self.step is RecoveryStep.WAIT

    def action(self) -> RecoveryAction:
        """The step as one line of a recovery report."""
        return RecoveryAction(self.epoch, self.step, self.reason, self.done, self.error)


def resolve_epoch(pipeline: Pipeline, epoch: int, *, run_finished: RunFinished | None = None,
                  dry_run: bool = False, clock: Callable[[], float] | None = None,
                  by: str = "recovery") -> Resolution:
    """Judge one epoch and move it on: the one place that decides what an unfinished epoch needs.

    COMMITTING rolls forward (a sink whose target holds the epoch already is acknowledged
    as it is); ABORTING has its abort finished; OPEN or PREPARED is aborted once
    :func:`lease.liveness` judges it dead, else it waits. A failing step is returned with
    its error (the next look retries it), never raised.

    :param clock: the store's time to judge at (default: :func:`lease.store_now`).
    :param by: who acts, written in the decision of an abort.
    """
    try:
        seen = EpochDir.read(pipeline, epoch)  # the one listing both the state and the judgement read
        state = seen.state
        begin = pipeline.txlog.read_begin(epoch) if not state.decided else None
    except CorruptCheckpointError as exc:
        return Resolution(epoch, RecoveryStep.INSPECT,
                          "a log record is damaged; the epoch's staging and checkpoint are kept. Way out: restore "
                          "the file from a backup, or, if the epoch is undecided, abort it (`seatunnel-ckpt abort "
                          f"{pipeline.name} {epoch}`) so that the next run processes its input again",
                          error=str(exc))

    def act(step: RecoveryStep, reason: str, fn: Callable[[], Any], judged: EpochLiveness | None = None,
            ) -> Resolution:
        if dry_run:
            return Resolution(epoch, step, reason, state, judged=judged)
        try:
            result = fn()
        except CheckpointError as exc:
            log.error("pipeline %s: %s on epoch %s failed: %s", pipeline.name, step, epoch, exc)
            return Resolution(epoch, step, reason, state, error=str(exc), judged=judged)
        return Resolution(epoch, step, reason, state, done=True, judged=judged, result=result)

    if state is EpochState.COMMITTING:
        # Each sink's target is asked first (the sink contract's held_epoch): a commit killed
        # after its sink's commit left the epoch in the target, which is acknowledged as it is.
        rolled = act(RecoveryStep.FINISH_COMMIT, "decided commit, publish not acknowledged",
                     lambda: pipeline.commit(epoch, held_first=True))
        held = rolled.result.held if rolled.done else ()
        if not held:
            return rolled
        return replace(rolled, reason=f"{rolled.reason}; sink(s) {list(held)} already held epoch {epoch}: "
                       "acknowledged without committing them again")
    if state is EpochState.ABORTING:
        return act(RecoveryStep.FINISH_ABORT, "decided abort, cleanup not acknowledged",
                   lambda: pipeline.abort(epoch, f"{by} finished the abort", by=by))
    if state.final:
        return Resolution(epoch, RecoveryStep.FINAL, f"epoch {epoch} is {state.value}: nothing to do", state)
    # The one judgement of liveness (core/protocol/lease.py), by the store's clock: a stage that
    # renews its lease is never aborted, however long it runs.
    finished = _ask_run_finished(pipeline, run_finished, begin)
    try:
        judged = liveness(pipeline, epoch, finished, now=(clock or (lambda: store_now(pipeline.storage)))(),
                          seen=seen)
    except CheckpointError as exc:
        return Resolution(epoch, RecoveryStep.INSPECT, f"cannot tell whether {state.value} epoch {epoch} is alive; "
                          "it is left alone until the store answers", state, error=str(exc))
    if not judged.dead:
        return Resolution(epoch, RecoveryStep.WAIT, wait_for(pipeline, epoch, judged), state, judged=judged)
    step = RecoveryStep.ABORT_DEAD_OWNER if judged.liveness is Liveness.OWNER_FINISHED else RecoveryStep.ABORT_TIMEOUT
    return act(step, judged.describe(), lambda: pipeline.abort(epoch, f"{by}: {judged.describe()}", by=by), judged)


@dataclass(frozen=True)
class PendingWait:
    """An earlier undecided epoch blocks a run's ``begin`` and may still finish: look again later."""

    epoch: int
    reason: str  #: the blocking epoch's state, and what the wait is for
    waited_s: float
    limit_s: float
    command: str  #: the command that aborts the blocking epoch now


def begin_unblocked(pipeline: Pipeline, run_id: str, *, logical_date: str = "",
                    run_finished: RunFinished | None = None, by: str = "",
                    waited_s: Callable[[], float] = lambda: 0.0,
                    wait_timeout_s: float | None = None) -> BeginRecord | PendingWait:
    """Begin run ``run_id``'s epoch; an earlier undecided epoch that blocks it is resolved first.

    Dead, the blocker is aborted (decided commit: rolled forward) and the run begins; alive,
    a :class:`PendingWait` is returned until ``waited_s()`` reaches ``wait_timeout_s``
    (default ``max(lease timeout, prepared_timeout_s) + 60``, by when a dead epoch is always
    judged dead), then :class:`PendingEpochError` says how to abort it by hand.
    """
    for _ in range(10):
        try:
            return pipeline.begin(run_id, logical_date=logical_date)
        except PendingEpochError as exc:
            if exc.epoch <= 0:
                raise
            wait = _pending_wait(pipeline, exc, run_finished, by)
            if wait is None:
                continue
            limit = wait.limit_s if wait_timeout_s is None else wait_timeout_s
            waited = waited_s()
            if waited >= limit:
                raise PendingEpochError(
                    f"pipeline {pipeline.name!r}: waited {waited:.0f}s (pending_wait_timeout={limit:g}s) for an "
                    f"earlier epoch, which is still not dead: {wait.reason}. If its run is dead, abort it now with "
                    f"`{wait.command}`; otherwise let it finish and clear this task.", wait.epoch) from exc
            return PendingWait(wait.epoch, wait.reason, waited, limit, wait.command)
    return pipeline.begin(run_id, logical_date=logical_date)


def _pending_wait(pipeline: Pipeline, exc: PendingEpochError, run_finished: RunFinished | None,
                  by: str) -> PendingWait | None:
    """Resolve the epoch that blocks a ``begin``: None once it is out of the way, else what to wait for."""
    epoch = exc.epoch
    resolution = resolve_epoch(pipeline, epoch, run_finished=run_finished, by=by or "recovery")
    judged = resolution.judged
    lease_s = pipeline.config.lease_timeout_s
    if resolution.step is RecoveryStep.INSPECT:
        raise CheckpointError(f"pipeline {pipeline.name!r}: epoch {epoch} blocks this run and {resolution.reason}: "
                              f"{resolution.error}") from exc
    if resolution.step is RecoveryStep.FINISH_COMMIT and resolution.error:
        log.warning("epoch %s is decided commit; publishing it failed (%s); waiting", epoch, resolution.error)
        reason = f"epoch {epoch} is COMMITTING and its publish failed: {resolution.error}"
    elif resolution.waits and judged is not None:
        reason = judged.describe() + _what_the_wait_is_for(judged, pipeline)
        lease_s = lease_timeout(pipeline.config, judged.lease)  # its holder's, when longer
    else:
        # Out of the way: rolled forward, aborted (by this run or, meanwhile, by another),
        # or decided meanwhile; begin again.
        if resolution.step is RecoveryStep.FINISH_COMMIT:
            log.info("epoch %s was decided commit but not published: published it (roll forward)", epoch)
        elif judged is not None and resolution.done:
            log.warning("%s; aborted it so that this run can begin", judged.describe())
        elif resolution.error:
            log.info("epoch %s could not be aborted (%s); looking again", epoch, resolution.error)
        return None
    limit = max(lease_s, pipeline.config.prepared_timeout_s) + 60
    return PendingWait(epoch, reason, 0.0, limit, abort_command(pipeline, epoch))


def _what_the_wait_is_for(judged: EpochLiveness, pipeline: Pipeline) -> str:
    """Why a live-looking earlier epoch is waited for, and until when at the latest (a stage killed
    outright looks alive until its lease is as old as its timeout)."""
    if judged.liveness is not Liveness.ALIVE or judged.age_s is None:
        return ""
    left = max(lease_timeout(pipeline.config, judged.lease) - judged.age_s, 0)
    holder = "its stage" if judged.lease is None else f"its stage ({judged.lease.describe_holder()})"
    return (f"; waiting for {holder} to prepare, or -- if that stage was killed and renews its lease no more -- "
            f"for the lease to expire in {left:.0f}s at the latest (at {clock_time(time.time() + left)}), when this "
            "run aborts the epoch")


def clock_time(at: float) -> str:
    """``at`` (seconds since the epoch) as a UTC time of day for log lines: ``09:42:09 UTC``."""
    return time.strftime("%H:%M:%S UTC", time.gmtime(at))


def abort_unfollowed(pipeline: Pipeline, epoch: int, *, reason: str, by: str) -> bool:
    """Abort an epoch that nothing will finish (e.g. one a dry run began); False if it was decided meanwhile."""
    try:
        pipeline.abort(epoch, reason, by=by)
    except DecisionConflictError:
        return False
    return True


def recover(pipeline: Pipeline, dry_run: bool = True, now: float | None = None,
            run_finished: RunFinished | None = None) -> RecoveryReport:
    """Resolve every unfinished epoch (:func:`resolve_epoch`) and remove garbage; ``now`` looks ahead (tests)."""
    ahead = now
    clock: Callable[[], float] = (functools.cache(lambda: store_now(pipeline.storage)) if ahead is None
                                  else (lambda: ahead))
    now = time.time() if now is None else now
    timeout = pipeline.config.prepared_timeout_s
    report = RecoveryReport(pipeline.name, dry_run)

    def act(epoch: int | None, action: RecoveryStep, reason: str, fn: Any) -> None:
        if dry_run:
            report.actions.append(RecoveryAction(epoch, action, reason))
            return
        try:
            fn()
            report.actions.append(RecoveryAction(epoch, action, reason, done=True))
        except CheckpointError as exc:
            report.actions.append(RecoveryAction(epoch, action, reason, error=str(exc)))
            log.error("pipeline %s: recovery action %s on epoch %s failed: %s", pipeline.name, action, epoch, exc)

    # Epochs at or below the settled watermark are final: the record says which committed
    # and which aborted, so only the epochs above it are listed and read, one by one.
    seen, above = pipeline.txlog.open_epochs()
    states: dict[int, EpochState] = seen.record.states()
    # Epochs whose records cannot be read: nothing of theirs is touched (their staging may
    # be the only copy of output a commit decision still has to publish).
    damaged: set[int] = set()
    for epoch in above:
        resolution = resolve_epoch(pipeline, epoch, run_finished=run_finished, dry_run=dry_run, clock=clock)
        if resolution.state is None:
            damaged.add(epoch)
        else:
            states[epoch] = resolution.state
        if resolution.step is not RecoveryStep.FINAL:
            report.actions.append(resolution.action())
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
            act(staged, RecoveryStep.DROP_STAGING, f"{layout.STAGING}/{name} is not needed by any open epoch",
                lambda n=name: pipeline.storage.delete(f"{layout.STAGING}/{n}", recursive=True))

    for epoch in pipeline.checkpoints.epochs():
        if states.get(epoch) is EpochState.ABORTED or unknown(epoch):
            act(epoch, RecoveryStep.DROP_CHECKPOINT,
                f"{layout.checkpoint_dir(epoch)} belongs to an aborted or unknown epoch",
                lambda e=epoch: pipeline.checkpoints.delete(e))
    # Temp files killed writers left: settling swept the epochs below the watermark.
    for place in sweep.unsettled_places(pipeline, seen.record.watermark, above, states):
        for stale in place.look(now, timeout).stale:
            act(None, RecoveryStep.DROP_TEMP, f"{place.storage.describe_path(stale)} is a temp file left by a killed "
                "writer", lambda s=place.storage, p=stale: s.delete(p))
    if not dry_run:
        # States read above are still true if final (they never change); the epochs this
        # run finished or aborted are read again, so one run both resolves and settles them.
        for action in report.actions:
            if action.done and action.epoch is not None and action.action in RESOLVING:
                try:
                    states[action.epoch] = pipeline.state(action.epoch)
                except CheckpointError:
                    states.pop(action.epoch, None)
        for path in sweep.settle(pipeline, seen, states, now=now, timeout=timeout):
            report.actions.append(RecoveryAction(None, RecoveryStep.DROP_TEMP,
                                                 f"{path} is a temp file left by a killed writer", done=True))
    return report

