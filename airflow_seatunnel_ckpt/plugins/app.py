"""The Checkpoints page's FastAPI app, mounted by the API server under :data:`URL_PREFIX`, and the
Airflow plugin that mounts it (:class:`CheckpointsPlugin`), registered through the provider info.

Plugin apps get no authentication from the API server, so every route depends on its
``get_user`` and the auth manager's ``is_authorized_dag``; each action is written to the
transaction log with the user and the reason before it is carried out, and with its outcome
after (docs/UI.md).
"""

# No ``from __future__ import annotations``: FastAPI reads the routes' annotations at runtime.
from collections.abc import Container
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal

from airflow.plugins_manager import AirflowPlugin
from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.security import HTTPAuthorizationCredentials
from jinja2 import Environment, FileSystemLoader, select_autoescape
from pydantic import BaseModel, Field

from airflow_seatunnel_ckpt.core import EpochState
from airflow_seatunnel_ckpt.core.errors import CheckpointError, CorruptCheckpointError, DecisionConflictError
from airflow_seatunnel_ckpt.core.models import ActionOutcome
from airflow_seatunnel_ckpt.core.protocol import recovery
from airflow_seatunnel_ckpt.hooks.stores import ConfiguredStore, UnknownStoreError, configured_stores, find_store
from airflow_seatunnel_ckpt.plugins import charts, overview, run_notes

URL_PREFIX = "/seatunnel-ckpt"

_templates = Environment(loader=FileSystemLoader(Path(__file__).parent / "templates"),
                         autoescape=select_autoescape(["html"]))


def _utc(at: Any) -> str:
    """A record's epoch seconds as ``2026-11-25 19:30:00`` (UTC), "-" when unknown."""
    if not isinstance(at, (int, float)):
        return "-"
    return datetime.fromtimestamp(at, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")


_templates.filters["utc"] = _utc


async def current_user(request: Request) -> Any:
    """The signed-in user, as the API server's own ``get_user`` resolves it; its HTTP 401/403 when
    there is none or it is invalid."""
    # Imported per request: every process that loads plugins imports this module, and the
    # API server's security module costs a second.
    from airflow.api_fastapi.core_api.security import get_user

    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    bearer = HTTPAuthorizationCredentials(scheme=scheme, credentials=token) if scheme and token else None
    return await get_user(request=request, _oauth_token=None, bearer_credentials=bearer)


User = Annotated[Any, Depends(current_user)]


def _authorize(user: Any, method: Literal["GET", "PUT"], dag_id: str) -> None:
    """HTTP 403 unless the auth manager lets ``user`` do ``method`` on the DAG ``dag_id``."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import DagDetails

    if not get_auth_manager().is_authorized_dag(method=method, details=DagDetails(id=dag_id or None), user=user):
        what = f"DAG {dag_id!r}" if dag_id else "DAGs"
        raise HTTPException(status_code=403, detail=f"user {user.get_name()!r} may not {method} {what}: "
                            "ask an admin for edit permission on the DAG that owns this pipeline")


def run_finished_in_db(run_id: str, dag_id: str) -> bool | None:
    """Whether the DAG run that began an epoch is over, from the metadata database (``None``: unknown),
    so that the page's recovery judges an undecided epoch as the recovery DAG does."""
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from sqlalchemy import select

    from airflow_seatunnel_ckpt.pipeline_task import TERMINAL_RUN_STATES

    if not dag_id:
        return None
    with create_session() as session:
        state = session.scalar(select(DagRun.state).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id))
    return None if state is None else str(getattr(state, "value", state)) in TERMINAL_RUN_STATES


def stage_tasks_in_db(dag_id: str, run_id: str) -> dict[str, str]:
    """The stage tasks of a DAG run and their states (``"none"``: not run yet), from the database, for
    the run tab of a run that has no epoch."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        rows = session.execute(select(TaskInstance.task_id, TaskInstance.state, TaskInstance.operator).where(
            TaskInstance.dag_id == dag_id, TaskInstance.run_id == run_id)).all()
    return {task_id: str(getattr(state, "value", state) or "none") for task_id, state, operator in rows
            if str(operator or "").endswith("StageOperator")}


class ActionBody(BaseModel):
    """An action's request: why the on-call engineer does it (written to the log)."""

    reason: str = Field(min_length=1, max_length=500)


def _render(name: str, **context: Any) -> HTMLResponse:
    return HTMLResponse(_templates.get_template(name).render(prefix=URL_PREFIX, **context))


def _open(key: str) -> tuple[ConfiguredStore, Any]:
    try:
        configured = find_store(key)
        return configured, configured.open()
    except UnknownStoreError as exc:
        raise HTTPException(status_code=404, detail=str(exc)) from exc
    except CheckpointError as exc:
        raise HTTPException(status_code=502, detail=str(exc)) from exc


def _pipeline(store: Any, name: str) -> Any:
    if name not in store.list_pipelines():
        raise HTTPException(status_code=404, detail=f"no pipeline {name!r} in {store.storage.describe()}; "
                            f"pipelines: {', '.join(store.list_pipelines()) or 'none'}")
    return store.pipeline(name)


def _actor(user: Any) -> str:
    return f"{user.get_name()} (Airflow UI)"


def create_app() -> FastAPI:
    """The app the plugin registers (``fastapi_apps``)."""
    app = FastAPI(title="SeaTunnel checkpoints", docs_url=None, redoc_url=None, openapi_url=None)

    @app.get("/", response_class=HTMLResponse)
    def stores_page(user: User) -> HTMLResponse:
        """Every configured store with its pipelines."""
        _authorize(user, "GET", "")
        listed = []
        for configured in configured_stores():
            try:
                listed.append((configured, overview.pipelines_summary(configured.open()), ""))
            except CheckpointError as exc:
                listed.append((configured, [], str(exc)))
        return _render("stores.html", stores=listed, user=user.get_name())

    @app.get("/stores/{store_key}/pipelines/{name}", response_class=HTMLResponse)
    def pipeline_page(store_key: str, name: str, user: User,
                      last: Annotated[int, Query(ge=1, le=500)] = 20) -> HTMLResponse:
        """A pipeline's newest ``last`` epochs (the page's cost: verify reads every part), their verify
        results and recovery's dry run."""
        configured, store = _open(store_key)
        p = _pipeline(store, name)
        _authorize(user, "GET", overview.owner_dag_id(p))
        view = overview.pipeline_view(store, name, last=last, run_finished=run_finished_in_db)
        points = charts.epoch_points(p, max(last, charts.DEFAULT_LAST))
        return _render("pipeline.html", store=configured, view=view, user=user.get_name(),
                       charts=charts.pipeline_charts(points), charts_epochs=len(points))

    @app.get("/run", response_class=HTMLResponse)
    def run_tab(dag_id: str, run_id: str, user: User) -> HTMLResponse:
        """The DAG run tab: the epoch(s) this run began, in every configured store."""
        _authorize(user, "GET", dag_id)
        found = []
        for configured in configured_stores():
            try:
                found += [(configured, name, row) for name, row in
                          overview.epochs_of_run(configured.open(), dag_id, run_id)]
            except CheckpointError:
                continue  # the nav page names a store that cannot be opened
        stages = {} if found else stage_tasks_in_db(dag_id, run_id)
        return _render("run.html", dag_id=dag_id, run_id=run_id, found=found, stages=stages,
                       user=user.get_name())

    def _guarded(store_key: str, name: str, user: Any) -> Any:
        _, store = _open(store_key)
        p = _pipeline(store, name)
        _authorize(user, "PUT", overview.owner_dag_id(p))
        return p

    def _action(store_key: str, name: str, epoch: int, kind: str, body: ActionBody, user: Any,
                allowed: Container[EpochState], only: str) -> tuple[Any, str]:
        """Record the user's action ``kind`` on ``epoch``; refused (409) unless the epoch's state is ``allowed``."""
        p = _guarded(store_key, name, user)
        state = _state(p, epoch)
        action = p.txlog.record_action(epoch, kind, _actor(user), body.reason)
        if state not in allowed:
            raise _refused(p, epoch, action, f"epoch {epoch} is {state.value}: only {only}")
        return p, action

    @app.post("/stores/{store_key}/pipelines/{name}/epochs/{epoch}/abort")
    def abort(store_key: str, name: str, epoch: int, body: ActionBody, user: User) -> JSONResponse:
        """Abort an undecided (OPEN or PREPARED) epoch."""
        p, action = _action(store_key, name, epoch, "abort", body, user, overview.ABORTABLE,
                            "an undecided (OPEN or PREPARED) epoch can be aborted")
        try:
            record = p.abort(epoch, body.reason, by=_actor(user))
        except DecisionConflictError as exc:
            raise _refused(p, epoch, action, f"epoch {epoch} was decided meanwhile: {exc}") from exc
        except Exception as exc:  # a store error, or anything else: the outcome names it
            raise _failed(p, epoch, action, 502, f"abort failed: {exc}") from exc
        done = f"decided abort; staging and checkpoint removed (state {p.state(epoch).value})"
        outcome = p.txlog.record_outcome(epoch, action, ActionOutcome.SUCCEEDED, done)
        return JSONResponse({"epoch": epoch, "decision": record.to_dict(), "outcome": outcome.to_dict()})

    @app.post("/stores/{store_key}/pipelines/{name}/epochs/{epoch}/retry-publish")
    def retry_publish(store_key: str, name: str, epoch: int, body: ActionBody, user: User) -> JSONResponse:
        """Publish a COMMITTING epoch again (idempotent; the decision stays)."""
        p, action = _action(store_key, name, epoch, "retry-publish", body, user, (EpochState.COMMITTING,),
                            "a COMMITTING epoch's publish can be retried")
        try:
            resolution = recovery.resolve_epoch(p, epoch, by=_actor(user))
        except Exception as exc:  # anything but a store or target error (those come back in the resolution)
            raise _failed(p, epoch, action, 502, f"publish failed again: {exc}") from exc
        if resolution.error:
            raise _failed(p, epoch, action, 502, f"publish failed again: {resolution.error}")
        if resolution.step is not recovery.RecoveryStep.FINISH_COMMIT:
            raise _refused(p, epoch, action, f"epoch {epoch} changed meanwhile: {resolution.reason}")
        result = resolution.result
        published = ", ".join(f"{s.sink}: {s.rows} rows in {s.files} files" for s in result.sinks)
        outcome = p.txlog.record_outcome(epoch, action, ActionOutcome.SUCCEEDED,
                                         f"published ({published or 'no sink'}); epoch COMMITTED")
        return JSONResponse({"epoch": epoch, "commit": result.to_dict(), "outcome": outcome.to_dict()})

    @app.post("/stores/{store_key}/pipelines/{name}/recover")
    def run_recovery(store_key: str, name: str, body: ActionBody, user: User) -> JSONResponse:
        """Carry out what recovery's dry run shows; each epoch it acts on records the user and the outcome."""
        p = _guarded(store_key, name, user)
        planned = recovery.recover(p, dry_run=True, run_finished=run_finished_in_db)
        known = set(p.txlog.open_epochs()[1])  # (what recovery resolves lies above the watermark)

        def resolved(report: recovery.RecoveryReport) -> list[int]:
            epochs = {a.epoch for a in report.actions if a.action in recovery.RESOLVING}
            return sorted(e for e in epochs if e is not None and e in known)

        recorded = {epoch: p.txlog.record_action(epoch, "recover", _actor(user), body.reason)
                    for epoch in resolved(planned)}
        try:
            report = recovery.recover(p, dry_run=False, run_finished=run_finished_in_db)
        except Exception as exc:
            for epoch, action in recorded.items():
                p.txlog.record_outcome(epoch, action, ActionOutcome.FAILED, f"recovery failed: {exc}")
            raise
        # An epoch the real run resolved that the dry run did not show (it died meanwhile)
        # is recorded too, after the fact.
        for epoch in resolved(report):
            if epoch not in recorded:
                recorded[epoch] = p.txlog.record_action(epoch, "recover", _actor(user), body.reason)
        for epoch, action in recorded.items():
            p.txlog.record_outcome(epoch, action, *_recovery_outcome(report, epoch))
        # 200 even when an action failed or an epoch needs inspecting: the report names
        # them, and the page (reloaded) shows them in recovery's dry run again.
        return JSONResponse(report.to_dict())

    return app


def _refused(p: Any, epoch: int, action: str, detail: str) -> HTTPException:
    """Record the action as refused (nothing changed); the HTTP 409 to raise."""
    p.txlog.record_outcome(epoch, action, ActionOutcome.REFUSED, detail)
    return HTTPException(status_code=409, detail=detail)


def _failed(p: Any, epoch: int, action: str, status: int, detail: str) -> HTTPException:
    """Record the action as failed with its error; the HTTP error to raise."""
    p.txlog.record_outcome(epoch, action, ActionOutcome.FAILED, detail)
    return HTTPException(status_code=status, detail=detail)


def _recovery_outcome(report: recovery.RecoveryReport, epoch: int) -> tuple[ActionOutcome, str]:
    """What recovery did to ``epoch``: its steps (and errors) from the real run's report."""
    steps = [a for a in report.actions if a.epoch == epoch]
    if not steps:
        return ActionOutcome.REFUSED, "nothing to do any more: the epoch changed since the dry run"
    said = "; ".join(f"{a.action}: {a.reason}" + (f" -- failed: {a.error}" if a.error else "")
                     + ("" if a.done or a.error else " (not done)") for a in steps)
    if any(a.error for a in steps):
        return ActionOutcome.FAILED, said
    if not any(a.done for a in steps):
        return ActionOutcome.REFUSED, said
    return ActionOutcome.SUCCEEDED, said


def _state(p: Any, epoch: int) -> EpochState:
    try:
        return p.state(epoch)
    except CorruptCheckpointError as exc:
        raise HTTPException(status_code=409, detail=f"a record of epoch {epoch} is damaged: {exc}") from exc
    except CheckpointError as exc:
        raise HTTPException(status_code=404, detail=str(exc)) from exc


class CheckpointsPlugin(AirflowPlugin):
    """The "Checkpoints" page: pipelines and epochs of the configured stores, and on-call actions;
    and the listener that notes on a failed run why its input is held back (:mod:`.run_notes`)."""

    name = "seatunnel_ckpt_checkpoints"
    listeners = [run_notes]
    fastapi_apps = [{"app": create_app(), "url_prefix": URL_PREFIX, "name": "SeaTunnel checkpoints"}]
    external_views = [
        {"name": "Checkpoints", "href": f"{URL_PREFIX}/", "destination": "nav",
         "url_route": "seatunnel-checkpoints"},
        # The UI replaces {DAG_ID} and {RUN_ID} in a non-nav view's href.
        {"name": "Checkpoint epoch", "href": f"{URL_PREFIX}/run?dag_id={{DAG_ID}}&run_id={{RUN_ID}}",
         "destination": "dag_run", "url_route": "seatunnel-checkpoint-epoch"},
    ]
