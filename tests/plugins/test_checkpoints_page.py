"""The Checkpoints page's data and its registration, without a browser.

The store is real (file://, built with the core test helpers); what the page lists is
compared with what the console functions and the store say. The browser test
(``test_checkpoints_browser.py``) drives the same page through a real API server.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from airflow_seatunnel_ckpt.core import CheckpointStore, Decision, EpochState, codec, layout
from airflow_seatunnel_ckpt.core.errors import AlreadyExistsError, CorruptCheckpointError
from airflow_seatunnel_ckpt.core.models import ActionOutcome
from airflow_seatunnel_ckpt.core.protocol.lease import LeaseKeeper
from airflow_seatunnel_ckpt.core.store import StoredPipeline
from tests.core.epochs import Participant, flip_byte, prepare_participant
from tests.plugins.test_checkpoint_charts import build_charted_pipeline

DAG_ID = "orders_dag"
#: The lease holder the OPEN epoch's stage reports.
HOLDER = {"host": "worker-7", "pid": 4242}


def _run(p: StoredPipeline, run_id: str, hour: int) -> int:
    epoch = p.begin(run_id, DAG_ID, logical_date=f"2026-11-23T{hour:02d}:00:00+00:00").epoch
    prepare_participant(p, run_id, Participant(sinks={"orders": [b"a", b"bb"]}), epoch=epoch)
    return epoch


def build_store(url: str) -> dict[str, Any]:
    """``orders``: 1 COMMITTED, 2 ABORTED, 3 COMMITTED with a damaged decision record,
    4 OPEN with a renewed lease; ``clicks``: 1 COMMITTING (decided commit, not published);
    ``payments``: the 14 epochs of :func:`build_charted_pipeline` (the charts' data).
    Returns what a test asserts against."""
    store = CheckpointStore.from_url(url)
    p = store.pipeline("orders")
    e1 = _run(p, "run-1", 1)
    p.decide(e1, Decision.COMMIT, "all prepared", by="test")
    p.commit(e1)
    e2 = _run(p, "run-2", 2)
    p.abort(e2, "bad input", by="test")
    e3 = _run(p, "run-3", 3)
    p.decide(e3, Decision.COMMIT, "all prepared", by="test")
    p.commit(e3)
    damaged = layout.record_path(e3, "decision")
    flip_byte(p.storage, damaged)
    e4 = p.begin("run-4", DAG_ID, logical_date="2026-11-23T04:00:00+00:00").epoch
    keeper = LeaseKeeper.for_pipeline(p, e4, "ingest", 1, holder=HOLDER)
    assert keeper.renew()
    clicks = store.pipeline("clicks")
    c1 = _run(clicks, "c-1", 1)
    clicks.decide(c1, Decision.COMMIT, "all prepared", by="test")
    events = store.pipeline("events")
    v1 = _run(events, "v-1", 1)
    events.decide(v1, Decision.COMMIT, "all prepared", by="test")
    build_charted_pipeline(store)
    return {"states": {1: "COMMITTED", 2: "ABORTED", 3: "COMMITTED", 4: "OPEN"},
            "damaged": f"orders/{damaged}", "open": e4, "committing": c1,
            "events_committing": v1}


@pytest.fixture
def store(tmp_path: Path) -> tuple[CheckpointStore, dict[str, Any]]:
    url = f"file://{tmp_path}/ckpt"
    expected = build_store(url)
    return CheckpointStore.from_url(url), expected


def test_pipeline_view_lists_every_epoch_with_the_states_the_console_derives(store: Any) -> None:
    from airflow_seatunnel_ckpt.plugins.overview import pipeline_view

    ckpt, expected = store
    view = pipeline_view(ckpt, "orders")
    assert {row.epoch: row.state for row in view.epochs} == expected["states"]
    assert [row.epoch for row in view.epochs] == [4, 3, 2, 1]  # newest first
    assert view.owner_dag_id == DAG_ID
    first = next(r for r in view.epochs if r.epoch == 1)
    assert (first.run_id, first.rows, first.files) == ("run-1", {"orders": 2}, {"orders": 2})
    assert first.logical_date.startswith("2026-11-23T01:00")
    assert first.checkpoint_bytes is not None and first.checkpoint_bytes >= 0


def test_pipeline_view_says_since_when_input_is_held_back_by_refusals(tmp_path: Path) -> None:
    from airflow_seatunnel_ckpt.plugins.overview import pipeline_view

    ckpt = CheckpointStore.from_url(f"file://{tmp_path}/ckpt")
    p = ckpt.pipeline("orders")
    p.decide(_run(p, "run-1", 1), Decision.COMMIT, "all prepared", by="test")
    p.commit(1)
    assert pipeline_view(ckpt, "orders").held_back == ""
    p.abort(_run(p, "run-2", 2), "commit refused by a sink: sink 'orders': keys appear more than once", by="test")

    assert pipeline_view(ckpt, "orders").held_back == (
        "input held back since epoch 2 (1 run); epoch 2: commit refused by a sink: sink 'orders': keys appear "
        "more than once")


def test_damaged_record_is_named_in_the_row_and_in_verify(store: Any) -> None:
    from airflow_seatunnel_ckpt.plugins.overview import pipeline_view

    ckpt, expected = store
    view = pipeline_view(ckpt, "orders")
    row = next(r for r in view.epochs if r.epoch == 3)
    assert "epoch-000000000003/decision" in row.damaged, row.damaged
    verdicts = {r["epoch"]: r for r in view.verify if "epoch" in r}
    assert verdicts[3]["verdict"] == "DAMAGED"
    assert any("epoch-000000000003/decision" in x for x in verdicts[3]["problems"]), verdicts[3]
    assert verdicts[1]["ok"] and verdicts[4]["ok"]


def test_submitted_attempts_show_where_they_were_launched_from_and_how_they_ended(tmp_path: Path) -> None:
    from airflow_seatunnel_ckpt.core.protocol.lease import (
        ExitRecord,
        SubmissionRecord,
        record_exit,
        record_submission,
    )
    from airflow_seatunnel_ckpt.plugins.overview import pipeline_view

    store = CheckpointStore.from_url(f"file://{tmp_path}/store")
    p = store.pipeline("orders")
    epoch = p.begin("run-1", DAG_ID).epoch
    for attempt in (1, 2):
        record_submission(p, SubmissionRecord(epoch, "ingest", attempt, "worker-3", 100 + attempt, "/tmp/x.log",
                                              "spark-submit", "yarn", False, 0.0))
    record_exit(p, ExitRecord(epoch, "ingest", 1, 143, ["..."], 0.0, "cancelled by triggerer on t-1: cleared"))
    row = next(r for r in pipeline_view(store, "orders").epochs if r.epoch == epoch)
    assert row.submissions == [
        "ingest attempt 1: spark-submit from worker-3 (launcher pid 101, yarn); exit code 143, stopped: "
        "cancelled by triggerer on t-1: cleared",
        "ingest attempt 2: spark-submit from worker-3 (launcher pid 102, yarn); no exit record (running, or lost: "
        "see the lease)"]


def test_open_epoch_shows_its_lease_holder_and_last_renewal(store: Any) -> None:
    from airflow_seatunnel_ckpt.plugins.overview import pipeline_view

    ckpt, expected = store
    row = next(r for r in pipeline_view(ckpt, "orders").epochs if r.epoch == expected["open"])
    assert "worker-7" in row.lease and "last renewal" in row.lease and "alive" in row.lease
    assert row.abortable and not row.retryable


def test_recovery_dry_run_is_shown_and_changes_nothing(store: Any) -> None:
    from airflow_seatunnel_ckpt.plugins.overview import pipeline_view

    ckpt, expected = store
    view = pipeline_view(ckpt, "clicks")
    assert [(a["epoch"], a["action"], a["done"]) for a in view.recovery["actions"]] == \
        [(expected["committing"], "finish-commit", False)]
    assert ckpt.pipeline("clicks").state(expected["committing"]) is EpochState.COMMITTING
    assert view.epochs[0].retryable


def test_run_tab_finds_the_epoch_of_a_dag_run(store: Any) -> None:
    from airflow_seatunnel_ckpt.plugins.overview import epochs_of_run

    ckpt, _ = store
    found = epochs_of_run(ckpt, DAG_ID, "run-2")
    assert [(name, row.epoch, row.state) for name, row in found] == [("orders", 2, "ABORTED")]
    assert epochs_of_run(ckpt, DAG_ID, "no-such-run") == []


def test_action_records_name_who_and_why_and_do_not_change_the_state(store: Any) -> None:
    ckpt, expected = store
    p = ckpt.pipeline("orders")
    name = p.txlog.record_action(expected["open"], "abort", "alice (Airflow UI)", "INC-1: worker lost")
    assert p.state(expected["open"]) is EpochState.OPEN
    assert p.txlog.damaged_records(expected["open"]) == []
    [entry] = p.txlog.actions(expected["open"])
    assert (entry.name, entry.record.action, entry.record.by, entry.record.reason) == \
        (name, "abort", "alice (Airflow UI)", "INC-1: worker lost")
    assert entry.outcome is None  # not ended yet (or interrupted)
    p.txlog.record_outcome(expected["open"], name, ActionOutcome.REFUSED, "changed my mind")
    [entry] = p.txlog.actions(expected["open"])
    assert entry.outcome is not None
    assert (entry.outcome.action, entry.outcome.outcome, entry.outcome.detail) == \
        ("abort", ActionOutcome.REFUSED, "changed my mind")
    assert p.state(expected["open"]) is EpochState.OPEN
    assert p.txlog.damaged_records(expected["open"]) == []
    # Both records are versioned JSON in the checksummed frame, read back field by field.
    raw = codec.decode_json(p.storage.read(layout.record_path(expected["open"], name)), name)
    assert (raw["type"], raw["format_version"]) == ("action", 1)
    with pytest.raises(AlreadyExistsError):  # write-once: the first outcome stands
        p.txlog.record_outcome(expected["open"], name, ActionOutcome.SUCCEEDED)


@pytest.mark.parametrize(("payload", "problem"), [
    ({"type": "action", "format_version": 1, "epoch": 4, "action": "abort", "reason": "r", "at": 1.0},
     "by: field required"),
    ({"type": "action", "format_version": 2, "epoch": 4, "action": "abort", "by": "x", "reason": "r", "at": 1.0},
     "format version 2 is not supported"),
    ({"type": "decision", "format_version": 1, "epoch": 4, "action": "abort", "by": "x", "reason": "r", "at": 1.0},
     "type: input should be 'action'"),
    ({"type": "action", "epoch": 4, "action": "abort", "by": "x", "reason": "r", "at": 1.0, "extra": {"a": 1}},
     "extra: unexpected keyword argument"),
])
def test_a_malformed_action_record_is_a_clear_error_naming_the_file(
    store: Any, payload: dict[str, Any], problem: str,
) -> None:
    from airflow_seatunnel_ckpt.plugins.overview import action_history

    ckpt, expected = store
    p = ckpt.pipeline("orders")
    name = f"action-{1:020d}-abort"
    p.storage.create_exclusive(layout.record_path(expected["open"], name), codec.encode_json(payload))
    with pytest.raises(CorruptCheckpointError, match=problem) as caught:
        p.txlog.actions(expected["open"])
    assert name in str(caught.value)
    [damaged] = p.txlog.damaged_records(expected["open"])
    assert problem in str(damaged) and name in str(damaged)
    # The page names it in the action history instead of failing.
    [row] = action_history(p, [expected["open"]])
    assert problem in row.damaged and name in row.damaged


def test_a_malformed_outcome_record_is_a_clear_error_naming_the_file(store: Any) -> None:
    ckpt, expected = store
    p = ckpt.pipeline("orders")
    name = p.txlog.record_action(expected["open"], "abort", "alice", "why")
    outcome = "outcome-" + name[len("action-"):]
    p.storage.create_exclusive(layout.record_path(expected["open"], outcome), codec.encode_json(
        {"type": "action-outcome", "format_version": 1, "epoch": 4, "action": "abort", "outcome": "maybe",
         "detail": "", "at": 1.0}))
    with pytest.raises(CorruptCheckpointError, match="outcome: input should be .*'failed' .*'maybe'") as caught:
        p.txlog.actions(expected["open"])
    assert outcome in str(caught.value)


class _User:
    def __init__(self, name: str) -> None:
        self.name = name

    def get_name(self) -> str:
        return self.name


@pytest.fixture
def page(airflow_home: Path, store: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The page's app in this process, signed in as ``alice`` with every permission.

    Authentication and authorisation are the API server's (tested through a real one in
    ``test_checkpoints_browser.py``); here only what the routes do with the store counts.
    """
    from fastapi.testclient import TestClient

    from airflow_seatunnel_ckpt.plugins import app as page_app

    ckpt, _ = store
    monkeypatch.setenv("AIRFLOW__SEATUNNEL_CKPT__STORES", ckpt.storage.url)
    monkeypatch.setenv("SEATUNNEL_CKPT_STORE", f"{ckpt.storage.url}-absent-default")
    monkeypatch.setattr(page_app, "_authorize", lambda user, method, dag_id: None)
    monkeypatch.setattr(page_app, "run_finished_in_db", lambda run_id, dag_id: None)
    app = page_app.create_app()
    app.dependency_overrides[page_app.current_user] = lambda: _User("alice")
    return TestClient(app)


def _history(html: str) -> list[tuple[str, str, str]]:
    """(epoch, action, outcome) of each action history row, in page order."""
    import re

    return re.findall(r'<tr data-epoch="(\d+)" data-action="([\w-]+)" data-outcome="(\w+)">', html)


def test_page_actions_record_their_outcome_and_the_history_shows_it(page: Any, store: Any) -> None:
    ckpt, expected = store
    orders = "/stores/config-1/pipelines/orders"
    # Refused: epoch 1 is COMMITTED (nothing changes, the refusal is recorded with who and why).
    response = page.post(f"{orders}/epochs/1/abort", json={"reason": "INC-7: wrong epoch"})
    assert response.status_code == 409 and "COMMITTED" in response.json()["detail"]
    [refused] = ckpt.pipeline("orders").txlog.actions(1)
    assert refused.outcome is not None and refused.outcome.outcome is ActionOutcome.REFUSED
    assert "only an undecided" in refused.outcome.detail and refused.record.by == "alice (Airflow UI)"
    # Succeeded: the OPEN epoch is aborted.
    response = page.post(f"{orders}/epochs/{expected['open']}/abort", json={"reason": "INC-8: host lost"})
    assert response.status_code == 200, response.text
    assert response.json()["outcome"]["outcome"] == "succeeded"
    [aborted] = ckpt.pipeline("orders").txlog.actions(expected["open"])
    assert aborted.outcome is not None and aborted.outcome.outcome is ActionOutcome.SUCCEEDED
    assert "decided abort" in aborted.outcome.detail and "ABORTED" in aborted.outcome.detail
    # Succeeded: the COMMITTING epoch is published.
    response = page.post(f"/stores/config-1/pipelines/clicks/epochs/{expected['committing']}/retry-publish",
                         json={"reason": "INC-12: target back"})
    assert response.status_code == 200, response.text
    [published] = ckpt.pipeline("clicks").txlog.actions(expected["committing"])
    assert published.outcome is not None and published.outcome.outcome is ActionOutcome.SUCCEEDED
    assert published.outcome.detail == "published (orders: 2 rows in 2 files); epoch COMMITTED"
    # Recovery: the outcome says what it did to the epoch.
    response = page.post("/stores/config-1/pipelines/events/recover", json={"reason": "INC-9: finish it"})
    assert response.status_code == 200, response.text
    [recovered] = ckpt.pipeline("events").txlog.actions(expected["events_committing"])
    assert recovered.outcome is not None and recovered.outcome.outcome is ActionOutcome.SUCCEEDED
    assert recovered.outcome.detail.startswith("finish-commit: ")
    # The pipeline page's action history: newest first, with the outcomes.
    html = page.get(orders).text
    assert _history(html) == [(str(expected["open"]), "abort", "succeeded"), ("1", "abort", "refused")]
    assert "INC-8: host lost" in html and "INC-7: wrong epoch" in html and "only an undecided" in html
    assert ("1", "recover", "succeeded") in [(e, a, o) for e, a, o in _history(page.get(
        "/stores/config-1/pipelines/events").text)]


def test_a_failed_retry_publish_is_recorded_with_its_error(page: Any, store: Any) -> None:
    ckpt, expected = store
    clicks = ckpt.pipeline("clicks")
    epoch = expected["committing"]
    # The prepared record the decision names is gone: publishing cannot work.
    [prepared] = [n for n in clicks.storage.list_dir(layout.txlog_dir(epoch)) if n.startswith("prepared-")]
    clicks.storage.delete(layout.record_path(epoch, prepared))
    response = page.post(f"/stores/config-1/pipelines/clicks/epochs/{epoch}/retry-publish",
                         json={"reason": "INC-10: try again"})
    assert response.status_code == 502 and "publish failed again" in response.json()["detail"]
    [failed] = clicks.txlog.actions(epoch)
    assert failed.outcome is not None and failed.outcome.outcome is ActionOutcome.FAILED
    assert "is missing from" in failed.outcome.detail and "restore it from a backup" in failed.outcome.detail
    assert clicks.state(epoch) is EpochState.COMMITTING
    assert (str(epoch), "retry-publish", "failed") in _history(page.get("/stores/config-1/pipelines/clicks").text)


def test_an_interrupted_action_shows_its_outcome_as_unknown(page: Any, store: Any) -> None:
    ckpt, expected = store
    ckpt.pipeline("orders").txlog.record_action(expected["open"], "abort", "bob (Airflow UI)", "INC-11")
    html = page.get("/stores/config-1/pipelines/orders").text
    assert _history(html) == [(str(expected["open"]), "abort", "unknown")]
    assert "the action was interrupted" in html


def test_pipeline_page_shows_a_chart_per_measure_with_a_mark_per_epoch(page: Any) -> None:
    import re

    html = page.get("/stores/config-1/pipelines/payments").text
    svgs = re.findall(r'<svg class="chart".*?</svg>', html, re.S)
    # rows of the sink, stage and commit durations, checkpoint bytes, quarantined rows, expectations
    assert len(svgs) == 6
    for svg in svgs:
        assert len(re.findall(r'<g class="mark ', svg)) == 14
        assert re.findall(r'<g class="mark aborted" data-epoch="(\d+)"', svg) == ["9"]
    # The expectations chart: a line per rule, the epoch a rule aborted on a band.
    assert re.findall(r'<g class="series" data-rule="([\w.]+)"', svgs[-1]) == [
        "payments.amount_positive", "payments.id_present"]
    assert re.findall(r'<g class="mark aborted" data-epoch="9"><title>[^<]*</title><rect class="band"', svgs[-1])


def test_provider_registers_the_plugin_with_a_nav_view_and_a_dag_run_tab() -> None:
    from airflow.api_fastapi.app import RESERVED_URL_PREFIXES
    from airflow.api_fastapi.core_api.datamodels.plugins import ExternalViewResponse

    from airflow_seatunnel_ckpt.get_provider_info import get_provider_info
    from airflow_seatunnel_ckpt.plugins.app import CheckpointsPlugin

    [entry] = get_provider_info()["plugins"]
    assert entry["plugin-class"] == f"{CheckpointsPlugin.__module__}.{CheckpointsPlugin.__name__}"
    [app] = CheckpointsPlugin.fastapi_apps
    assert not any(app["url_prefix"].startswith(p) for p in RESERVED_URL_PREFIXES)
    views = [ExternalViewResponse.model_validate(v) for v in CheckpointsPlugin.external_views]
    assert {v.destination for v in views} == {"nav", "dag_run"}
    tab = next(v for v in views if v.destination == "dag_run")
    assert "{DAG_ID}" in tab.href and "{RUN_ID}" in tab.href


def test_package_declares_the_plugin_entry_point_for_lazy_provider_discovery() -> None:
    # Airflow's default (lazy_discover_providers) ignores the provider info's plugins.
    import tomllib

    from airflow_seatunnel_ckpt.plugins.app import CheckpointsPlugin

    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    entry = pyproject["project"]["entry-points"]["airflow.plugins"]["seatunnel_ckpt_checkpoints"]
    assert entry == f"{CheckpointsPlugin.__module__}:{CheckpointsPlugin.__name__}"


def test_stores_come_from_connections_the_config_option_and_the_default(
    airflow_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from airflow.models.connection import Connection
    from airflow.utils.session import create_session

    from airflow_seatunnel_ckpt.hooks.stores import UnknownStoreError, configured_stores, find_store

    for name in ("by-conn", "by-config", "default", "by-env", "env-wins"):
        (tmp_path / name).mkdir()
    monkeypatch.setenv("AIRFLOW__SEATUNNEL_CKPT__STORES", f"file://{tmp_path}/by-config, file://{tmp_path}/by-conn")
    monkeypatch.setenv("SEATUNNEL_CKPT_STORE", f"file://{tmp_path}/default")
    # Connections in environment variables (JSON and URI forms); one shadows a database connection,
    # as it does for a task; another type, and one Airflow cannot parse, are not stores.
    monkeypatch.setenv("AIRFLOW_CONN_UI_ENV", json.dumps({"conn_type": "seatunnel_ckpt",
                                                          "host": f"file://{tmp_path}/by-env"}))
    monkeypatch.setenv("AIRFLOW_CONN_UI_SHADOWED", json.dumps({"conn_type": "seatunnel_ckpt",
                                                               "extra": {"storage_url": f"file://{tmp_path}/env-wins"}}))
    monkeypatch.setenv("AIRFLOW_CONN_UI_OTHER", "postgres://user:pw@127.0.0.1:5432/db")
    monkeypatch.setenv("AIRFLOW_CONN_UI_GARBLED", "{not json")
    conn = Connection(conn_id="ui_store", conn_type="seatunnel_ckpt", host=f"file://{tmp_path}/by-conn")
    bad = Connection(conn_id="ui_bad", conn_type="seatunnel_ckpt", extra='{"max_retain": 0}')
    shadowed = Connection(conn_id="ui_shadowed", conn_type="seatunnel_ckpt", host=f"file://{tmp_path}/by-config")
    with create_session() as session:
        session.add_all([conn, bad, shadowed])
    try:
        stores = {s.key: s for s in configured_stores()}
        # The connection's URL is listed once (the option repeats it).
        assert [k for k in stores if k.startswith(("ui_", "config-", "default"))] == \
            ["ui_bad", "ui_env", "ui_shadowed", "ui_store", "config-1", "default"]
        assert stores["ui_store"].open().storage.exists("")
        assert stores["ui_env"].config.storage_url == f"file://{tmp_path}/by-env"
        assert stores["ui_env"].source == "connection ui_env (environment variable AIRFLOW_CONN_UI_ENV)"
        assert stores["ui_shadowed"].config.storage_url == f"file://{tmp_path}/env-wins"
        assert stores["ui_bad"].config is None and "max_retain" in stores["ui_bad"].problem
        with pytest.raises(UnknownStoreError, match="configured stores: .*ui_store"):
            find_store("nope")
    finally:
        with create_session() as session:
            session.query(Connection).filter(Connection.conn_id.in_(["ui_store", "ui_bad", "ui_shadowed"])).delete()


def test_recovery_on_the_page_aborts_an_epoch_whose_dag_run_is_over(
    airflow_home: Path, store: Any,
) -> None:
    # The page's recovery asks the metadata database, as the recovery DAG asks Airflow.
    from airflow_seatunnel_ckpt.plugins.app import run_finished_in_db
    from airflow_seatunnel_ckpt.plugins.overview import pipeline_view

    ckpt, expected = store
    assert run_finished_in_db("run-4", DAG_ID) is None  # no such run: only the lease decides
    view = pipeline_view(ckpt, "orders", run_finished=lambda run_id, dag_id: run_id == "run-4")
    assert [(a["epoch"], a["action"]) for a in view.recovery["actions"] if a["epoch"] == expected["open"]] == \
        [(expected["open"], "abort-dead-owner")]


def test_run_tab_of_a_run_whose_stage_finished_without_an_epoch_says_so(
        page: Any, run_dag: Any, tmp_path: Path) -> None:
    from datetime import UTC, datetime

    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from sqlalchemy import select

    from tests.operators.test_stage_declaration import _epoch_dag

    # The stage is refused before it begins an epoch, then marked success (as the UI's "Mark success" does).
    dag = _epoch_dag(tmp_path, "stage_marked_success", sinks={
        "orders_table": {"path": f"file://{tmp_path}/out", "format": "{{ params.fmt }}"}})
    run = run_dag(dag, logical_date=datetime(2026, 1, 1, 5, tzinfo=UTC), run_conf={"fmt": "xlsx"})
    with create_session() as session:
        ti = session.scalar(select(TaskInstance).where(TaskInstance.dag_id == dag.dag_id,
                                                       TaskInstance.run_id == run.run_id,
                                                       TaskInstance.task_id == "orders.ingest"))
        assert ti is not None and ti.state == "failed"
        ti.state = "success"

    html = page.get("/run", params={"dag_id": dag.dag_id, "run_id": run.run_id}).text

    text = " ".join(html.split())
    assert "No pipeline of the configured stores has an epoch for this run" in text
    assert ("Its stage orders.ingest (success) finished without beginning an epoch (marked success before it ran): "
            "this run read and published nothing") in text


def test_page_shows_each_prepared_participant_with_its_attempt_and_an_aborted_submissions_end(
        tmp_path: Path) -> None:
    from airflow_seatunnel_ckpt.core.protocol.lease import SubmissionRecord, record_submission
    from airflow_seatunnel_ckpt.plugins.overview import pipeline_view

    store = CheckpointStore.from_url(f"file://{tmp_path}/store")
    p = store.pipeline("orders")
    epoch = p.begin("run-1", DAG_ID).epoch
    prepare_participant(p, "run-1", Participant(sinks={"orders": [b"a"]}), epoch=epoch, attempt=2)
    p.decide(epoch, Decision.COMMIT, "all prepared", by="test")
    p.commit(epoch)
    aborted = p.begin("run-2", DAG_ID).epoch
    record_submission(p, SubmissionRecord(aborted, "ingest", 1, "worker-3", 101, "/tmp/x.log", "spark-submit", "yarn",
                                          False, 0.0))
    p.abort(aborted, "its run is dead", by="test")

    rows = {r.epoch: r for r in pipeline_view(store, "orders").epochs}
    assert rows[epoch].participants == "ingest@2"
    assert rows[aborted].submissions == [
        "ingest attempt 1: spark-submit from worker-3 (launcher pid 101, yarn); no exit record: the epoch was "
        "aborted, so this attempt was stopped or lost before it recorded an exit (it can no longer prepare)"]


@pytest.mark.spark
def test_page_gives_a_cdc_epochs_lsn_range_its_changes_by_operation_and_the_slots_lag(
        airflow_home: Path, spark: Any, tmp_path: Path, postgres_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import re

    from fastapi.testclient import TestClient

    from airflow_seatunnel_ckpt.plugins import app as page_app
    from airflow_seatunnel_ckpt.plugins.overview import pipeline_view
    from tests.spark.test_postgres_sources import cdc_epochs

    lake = cdc_epochs(spark, tmp_path, postgres_db)
    offsets = lake.store_pipeline().txlog.read_prepared(2, "ingest").sources["db"].offsets
    expected = (f"LSN {offsets['lsns']}, 2 inserts, 1 update, 1 delete, slot lag {offsets['lag_bytes']} bytes")
    rows = {row.epoch: row for row in pipeline_view(CheckpointStore.from_url(lake.store["storage_url"]), "db").epochs}
    assert rows[2].input == {"db": expected}
    assert rows[1].input["db"].startswith("LSN ") and "with the snapshot, 2 inserts" in rows[1].input["db"]

    monkeypatch.setenv("AIRFLOW__SEATUNNEL_CKPT__STORES", lake.store["storage_url"])
    monkeypatch.setattr(page_app, "_authorize", lambda user, method, dag_id: None)
    monkeypatch.setattr(page_app, "run_finished_in_db", lambda run_id, dag_id: None)
    app = page_app.create_app()
    app.dependency_overrides[page_app.current_user] = lambda: _User("alice")
    html = TestClient(app).get("/stores/config-1/pipelines/db").text
    cells = re.findall(r'<tr data-epoch="2".*?<td class="input">(.*?)</td>', html, re.S)
    assert cells == [f"db: {expected}<br>"]
