"""What Airflow says about a run's stage tasks, when the store says their epoch is not prepared.

A stage task that finished (marked success or skipped without running, or killed) can no
longer prepare the run's epoch; the store alone cannot tell that from a stage that has not
started yet. The sensor, the branch and the abort task ask here, so such a run moves on in
seconds, and all three say the same thing about it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow.sdk import Context

FINISHED_STATES = frozenset({"success", "skipped", "failed", "upstream_failed", "removed"})


def stage_task_states(context: Context, task_ids: Sequence[str]) -> dict[str, str | None] | None:
    """The states of ``task_ids`` in the run of ``context`` (task id -> state), or ``None``
    when Airflow cannot say (the task SDK is not reachable). A mapped stage is reported by
    its least advanced map index: it has finished only when every index has."""
    if not task_ids:
        return {}
    run_id = context["run_id"]
    try:
        states = context["ti"].get_task_states(dag_id=context["dag"].dag_id, run_ids=[run_id],
                                               task_ids=list(task_ids))
    except Exception:  # an answer that cannot be had must not stop the task asking
        return None
    of_run: Mapping[str, Any] = states.get(run_id, {}) if isinstance(states, Mapping) else {}
    out: dict[str, str | None] = {}
    for task_id in task_ids:
        # get_task_states keys a mapped task instance as "<task_id>_<map_index>".
        found = [_state(state) for key, state in of_run.items()
                 if key == task_id or (key.startswith(f"{task_id}_") and key[len(task_id) + 1:].isdigit())]
        unfinished = [state for state in found if state not in FINISHED_STATES]
        out[task_id] = unfinished[0] if unfinished else (found[0] if found else None)
    return out


def _state(state: Any) -> str | None:
    if state is None:
        return None
    return str(getattr(state, "value", state))


def stages_finished(states: Mapping[str, str | None] | None, task_ids: Sequence[str]) -> bool:
    """Whether every stage task is in a finished state (none can prepare this run any more)."""
    return bool(task_ids) and states is not None and all(states.get(t) in FINISHED_STATES for t in task_ids)


def stage_tasks_of(task: Any) -> dict[str, str]:
    """The stage tasks upstream of ``task`` (task id -> participant): those that declare a
    participant, as every stage of :func:`~airflow_seatunnel_ckpt.task_group.checkpointed_epoch`
    does."""
    try:
        relatives = task.get_flat_relatives(upstream=True)
    except Exception:  # a task outside a DAG has no relatives to ask about
        return {}
    return {t.task_id: t.declared_participant[0] for t in relatives
            if getattr(t, "declared_participant", None) is not None}


def explain_unprepared(states: Mapping[str, str | None], run_id: str, epoch: int | None,
                       missing: Sequence[str] = ()) -> str:
    """Why a run whose stage tasks all finished has no prepared epoch (``None``: it never began one),
    and what to do."""
    named = ", ".join(f"{task} ({state})" for task, state in sorted(states.items()))
    marked = any(state in ("success", "skipped") for state in states.values())
    then = ("; its input stays unconsumed for the next run (clear the stage task to process it "
            "in this run instead)")
    if epoch is None:
        if not marked:
            return f"run {run_id!r} never began an epoch: its stage task(s) {named} failed before that{then}"
        return (f"stage task(s) {named} finished, but run {run_id!r} never began an epoch: the stage "
                f"was marked {_marked_as(states)} without running, so nothing will prepare this run's "
                f"epoch{then}")
    waiting = f"participant(s) {', '.join(missing)}" if missing else "its participants"
    how = f"marked {_marked_as(states)} before it prepared" if marked else "stopped before it prepared"
    return (f"stage task(s) {named} finished, but epoch {epoch} of run {run_id!r} was never prepared by "
            f"{waiting}: the stage was {how}, so nothing will prepare it; the epoch is aborted{then}")


def _marked_as(states: Mapping[str, str | None]) -> str:
    return "/".join(sorted({str(s) for s in states.values() if s in ("success", "skipped")}))


def unprepared_reason(task: Any, context: Context, epoch: int | None,
                      missing: Sequence[str] = ()) -> str | None:
    """:func:`explain_unprepared` for the run of ``context`` when every stage task upstream of
    ``task`` has finished; ``None`` while one may still run (or Airflow cannot say)."""
    stage_ids = sorted(stage_tasks_of(task))
    states = stage_task_states(context, stage_ids)
    if states is None or not stages_finished(states, stage_ids):
        return None
    return explain_unprepared(states, context["run_id"], epoch, missing)
