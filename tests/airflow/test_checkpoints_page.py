"""The Checkpoints page's data and its registration, without a browser.

The store is real (file://, built with the core test helpers); what the page lists is
compared with what the console functions and the store say. The browser test
(``test_checkpoints_browser.py``) drives the same page through a real API server.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from airflow_seatunnel_ckpt.core import CheckpointStore, Decision, EpochState, layout
from airflow_seatunnel_ckpt.core.lease import LeaseKeeper
from airflow_seatunnel_ckpt.core.store import StoredPipeline
from tests.core.epochs import Participant, flip_byte, prepare_participant

DAG_ID = "orders_dag"
#: The lease holder the OPEN epoch's stage reports.
HOLDER = {"host": "worker-7", "pid": 4242}


def _run(p: StoredPipeline, run_id: str, hour: int) -> int:
    epoch = p.begin(run_id, DAG_ID, logical_date=f"2026-11-23T{hour:02d}:00:00+00:00").epoch
    prepare_participant(p, run_id, Participant(sinks={"orders": [b"a", b"bb"]}), epoch=epoch)
    return epoch


def build_store(url: str) -> dict[str, Any]:
    """``orders``: 1 COMMITTED, 2 ABORTED, 3 COMMITTED with a damaged decision record,
    4 OPEN with a renewed lease; ``clicks``: 1 COMMITTING (decided commit, not published).
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
    p.txlog.record_action(expected["open"], "abort", "alice (Airflow UI)", "INC-1: worker lost")
    assert p.state(expected["open"]) is EpochState.OPEN
    assert p.txlog.damaged_records(expected["open"]) == []
    [action] = p.txlog.actions(expected["open"])
    assert (action["action"], action["by"], action["reason"]) == ("abort", "alice (Airflow UI)", "INC-1: worker lost")


def test_provider_registers_the_plugin_with_a_nav_view_and_a_dag_run_tab() -> None:
    from airflow.api_fastapi.app import RESERVED_URL_PREFIXES
    from airflow.api_fastapi.core_api.datamodels.plugins import ExternalViewResponse

    from airflow_seatunnel_ckpt.get_provider_info import get_provider_info
    from airflow_seatunnel_ckpt.plugins.checkpoints import CheckpointsPlugin

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

    from airflow_seatunnel_ckpt.plugins.checkpoints import CheckpointsPlugin

    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    entry = pyproject["project"]["entry-points"]["airflow.plugins"]["seatunnel_ckpt_checkpoints"]
    assert entry == f"{CheckpointsPlugin.__module__}:{CheckpointsPlugin.__name__}"


def test_stores_come_from_connections_the_config_option_and_the_default(
    airflow_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from airflow.models.connection import Connection
    from airflow.utils.session import create_session

    from airflow_seatunnel_ckpt.plugins.stores import UnknownStoreError, configured_stores, find_store

    for name in ("by-conn", "by-config", "default"):
        (tmp_path / name).mkdir()
    monkeypatch.setenv("AIRFLOW__SEATUNNEL_CKPT__STORES", f"file://{tmp_path}/by-config, file://{tmp_path}/by-conn")
    monkeypatch.setenv("SEATUNNEL_CKPT_STORE", f"file://{tmp_path}/default")
    conn = Connection(conn_id="ui_store", conn_type="seatunnel_ckpt", host=f"file://{tmp_path}/by-conn")
    bad = Connection(conn_id="ui_bad", conn_type="seatunnel_ckpt", extra='{"max_retain": 0}')
    with create_session() as session:
        session.add_all([conn, bad])
    try:
        stores = {s.key: s for s in configured_stores()}
        # The connection's URL is listed once (the option repeats it).
        assert [k for k in stores if k.startswith(("ui_", "config-", "default"))] == \
            ["ui_bad", "ui_store", "config-1", "default"]
        assert stores["ui_store"].open().storage.exists("")
        assert stores["ui_bad"].config is None and "max_retain" in stores["ui_bad"].problem
        with pytest.raises(UnknownStoreError, match="configured stores: .*ui_store"):
            find_store("nope")
    finally:
        with create_session() as session:
            session.query(Connection).filter(Connection.conn_id.in_(["ui_store", "ui_bad"])).delete()


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
