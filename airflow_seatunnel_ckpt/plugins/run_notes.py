"""The provider's DAG-run listener: a run that failed because its epoch's input is held back gets
the reason as its note; the note goes again when the run, cleared after a fix, succeeds.

A task cannot set its run's note through the Task Execution API, so the abort task leaves
the reason in its XCom ``held_back`` and the scheduler, marking the run failed, calls
:func:`on_dag_run_failed` in its database session (docs/OPERATIONS.md).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from airflow.listeners import hookimpl

from airflow_seatunnel_ckpt.operators.abort import HELD_BACK_KEY

if TYPE_CHECKING:
    from airflow.models.dagrun import DagRun

log = logging.getLogger(__name__)

NOTE_PREFIX = "Input held back: "  # marks this listener's notes: a person's is never replaced
NOTE_LIMIT = 1000  # Airflow keeps at most this many characters of a note


def held_back_note(reasons: list[str]) -> str:
    """The note of a run whose epochs' input is held back for ``reasons`` (one per pipeline)."""
    text = NOTE_PREFIX + "\n".join(reasons)
    return text if len(text) <= NOTE_LIMIT else text[:NOTE_LIMIT - 3] + "..."


@hookimpl
def on_dag_run_failed(dag_run: DagRun, msg: str) -> None:
    """Write why the run's input is held back into its note, when an abort task of the run said so."""
    _in_session(dag_run, _note_held_back)


@hookimpl
def on_dag_run_success(dag_run: DagRun, msg: str) -> None:
    """Remove a held-back note of this listener from a run that succeeded after all (cleared after a fix)."""
    _in_session(dag_run, _remove_held_back_note)


def _in_session(dag_run: DagRun, change: Callable[[Any, DagRun], None]) -> None:
    """Call ``change(session, run)``: in the scheduler's session, which commits it with the run's
    state; a run passed detached (``dag.test()``) in a session of its own."""
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from sqlalchemy.orm import object_session

    session: Any = object_session(dag_run)
    if session is not None:
        change(session, dag_run)
        return
    with create_session() as own:
        attached = own.get(DagRun, dag_run.id)
        if attached is not None:
            change(own, attached)


def _ours(note: Any) -> bool:
    """Whether a run's note is one this listener wrote (never a person's)."""
    return note is not None and note.user_id is None and (note.content or "").startswith(NOTE_PREFIX)


def _note_held_back(session: Any, dag_run: DagRun) -> None:
    from airflow.models.xcom import XComModel

    rows = session.scalars(XComModel.get_many(run_id=dag_run.run_id, dag_ids=dag_run.dag_id,
                                              key=HELD_BACK_KEY)).all()
    reasons = sorted({str(XComModel.deserialize_value(row)) for row in rows})
    if not reasons:
        return
    note = held_back_note(reasons)
    current = dag_run.dag_run_note
    if current is None:
        dag_run.note = (note, None)
    elif current.content is None or _ours(current):
        current.content = note
    else:
        log.info("DAG run %s: keeping the note a person wrote; its input is held back: %s", dag_run.run_id, note)
        return
    log.info("DAG run %s failed with its input held back; note: %s", dag_run.run_id, note)


def _remove_held_back_note(session: Any, dag_run: DagRun) -> None:
    if _ours(dag_run.dag_run_note):
        dag_run.dag_run_note = None
        log.info("DAG run %s succeeded: its held-back note is removed", dag_run.run_id)
