"""The Checkpoints page in a real browser against a real Airflow API server on 127.0.0.1.

One ``airflow api-server`` (SQLite, temporary ``AIRFLOW_HOME``) with the provider's plugin,
the SimpleAuthManager with two users -- ``admin`` (may edit DAGs) and ``viewer`` (may only
read) -- and a store holding the epochs of :func:`build_store` (committed, aborted, one
damaged, one OPEN with a lease), named by ``[seatunnel_ckpt] stores``. Headless Debian
Chromium signs in with the user's JWT as the UI's session cookie, loads the page, and
clicks. The server is stopped by PID (process group) with the deployment test's helpers.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from airflow_seatunnel_ckpt.core import CheckpointStore, EpochState
from tests.conftest import free_port
from tests.integration.deployment.conftest import AirflowDeployment, DeploymentError
from tests.plugins.test_checkpoints_page import build_store

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"]
REPO = Path(__file__).resolve().parents[2]
#: Where the screenshots go: docs/images with SEATUNNEL_CKPT_SCREENSHOTS=1 (to refresh the
#: README's pictures), else the test's temporary directory (a test run leaves the tree clean).
SCREENSHOT_ENV = "SEATUNNEL_CKPT_SCREENSHOTS"
PASSWORDS = {"admin": secrets.token_hex(8), "viewer": secrets.token_hex(8)}
#: The DAG of the store's ``orders`` pipeline (``build_store`` begins its epochs as runs of it).
ORDERS_DAG = """
from datetime import datetime, timezone

from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import DAG

with DAG("orders_dag", schedule=None, start_date=datetime(2026, 1, 1, tzinfo=timezone.utc)):
    EmptyOperator(task_id="ingest")
"""

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"no Chromium at {CHROMIUM} (apt-get install chromium)"),
]


@dataclass
class PageServer:
    """The running API server, the store it shows and the users' tokens."""

    deployment: AirflowDeployment
    store_url: str
    expected: dict[str, Any]
    tokens: dict[str, str]
    screenshots: Path

    def url(self, path: str) -> str:
        return f"{self.deployment.base_url}/seatunnel-ckpt{path}"


def _login(base_url: str, user: str) -> str | None:
    """The user's JWT from ``POST /auth/token`` (SimpleAuthManager), None while the server is not up."""
    request = urllib.request.Request(f"{base_url}/auth/token", method="POST",
                                     data=json.dumps({"username": user, "password": PASSWORDS[user]}).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            token: str = json.load(response)["access_token"]
            return token
    except (urllib.error.URLError, ConnectionError, TimeoutError, json.JSONDecodeError, KeyError):
        return None


@pytest.fixture(scope="module")
def page_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PageServer]:
    """Build the store, migrate a SQLite DB, start the API server; stop it by PID afterwards."""
    root = tmp_path_factory.mktemp("checkpoints-page")
    home, log_dir = root / "airflow", root / "logs"
    home.mkdir()
    log_dir.mkdir()
    store_url = f"file://{root}/ckpt"
    expected = build_store(store_url)
    (home / "passwords.json").write_text(json.dumps(PASSWORDS))
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW__") and k != "AIRFLOW_HOME"}
    env.update({
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(root / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin,viewer:viewer",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / "passwords.json"),
        "AIRFLOW__API__BASE_URL": base_url,
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__WORKERS": "1",
        "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(32),
        "AIRFLOW__API__SECRET_KEY": secrets.token_hex(16),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        "AIRFLOW__DATABASE__LOAD_DEFAULT_CONNECTIONS": "False",
        "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(home / "logs"),
        "AIRFLOW__SEATUNNEL_CKPT__STORES": store_url,
        # Load plugins from the provider info (the shared venv's installed metadata predates
        # the ``airflow.plugins`` entry point; a fresh install has both).
        "AIRFLOW__CORE__LAZY_DISCOVER_PROVIDERS": "False",
        # The default store is elsewhere (and absent), so the page lists this store once.
        "SEATUNNEL_CKPT_STORE": f"file://{root}/no-default-store",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    })
    (root / "dags").mkdir()
    # The DAG whose runs began the store's ``orders`` epochs, so that the UI has its run pages.
    (root / "dags" / "orders_dag.py").write_text(ORDERS_DAG)
    deployment = AirflowDeployment(home=home, data=root, base_url=base_url, env=env, log_dir=log_dir)
    for command in (["db", "migrate"], ["dags", "reserialize"]):
        done = subprocess.run([sys.executable, "-m", "airflow", *command], env=env, cwd=home,
                              capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise DeploymentError(f"airflow {' '.join(command)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    try:
        deployment.start("api-server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1")
        tokens = {user: deployment.wait_for(f"a token for {user}", lambda u=user: _login(base_url, u), timeout=180)
                  for user in PASSWORDS}
        deployment.token = tokens["admin"]  # for AirflowDeployment.api()
        shots = REPO / "docs" / "images" if os.environ.get(SCREENSHOT_ENV) == "1" else root / "screenshots"
        shots.mkdir(parents=True, exist_ok=True)
        yield PageServer(deployment, store_url, expected, tokens, shots)
    finally:
        leftovers = deployment.stop()
        if leftovers:
            print("killed processes left behind by the API server:\n" + "\n".join(leftovers))


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless Debian Chromium (never a downloaded one)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        instance = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS, headless=True)
        try:
            yield instance
        finally:
            instance.close()


def _page_as(browser: Any, server: PageServer, user: str) -> Any:
    """A page whose context carries ``user``'s session cookie, as the UI's login sets it."""
    context = browser.new_context(viewport={"width": 1500, "height": 900})
    context.add_cookies([{"name": "_token", "value": server.tokens[user], "url": server.deployment.base_url}])
    return context.new_page()


def _shown(page: Any) -> dict[int, str]:
    rows = page.locator("table.epochs tr[data-epoch]")
    return {int(rows.nth(i).get_attribute("data-epoch")): rows.nth(i).get_attribute("data-state")
            for i in range(rows.count())}


def _pipeline_path() -> str:
    return "/stores/config-1/pipelines/orders"


def test_page_refuses_a_request_without_a_session(page_server: PageServer) -> None:
    for method, path in (("GET", "/"), ("POST", f"{_pipeline_path()}/epochs/4/abort")):
        request = urllib.request.Request(page_server.url(path), method=method, data=b'{"reason": "x"}'
                                         if method == "POST" else None, headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(request, timeout=10)
        assert caught.value.code in (401, 403), (method, path, caught.value.code)


def test_viewer_sees_the_epochs_but_is_refused_the_abort(page_server: PageServer, browser: Any) -> None:
    page = _page_as(browser, page_server, "viewer")
    page.goto(page_server.url(_pipeline_path()))
    assert _shown(page) == page_server.expected["states"]
    page.fill("#reason", "viewer tries")
    page.locator(f"tr[data-epoch='{page_server.expected['open']}'] button.abort").click()
    page.wait_for_function("document.getElementById('message').textContent.includes('Refused')")
    assert "HTTP 403" in page.inner_text("#message")
    p = CheckpointStore.from_url(page_server.store_url).pipeline("orders")
    assert p.state(page_server.expected["open"]) is EpochState.OPEN
    assert p.txlog.actions(page_server.expected["open"]) == []
    page.context.close()


def test_admin_sees_the_store_and_aborts_the_open_epoch_with_the_actor_logged(
    page_server: PageServer, browser: Any,
) -> None:
    page = _page_as(browser, page_server, "admin")
    page.goto(page_server.url("/"))
    assert page.locator("table.pipelines a", has_text="orders").count() == 1
    page.goto(page_server.url(_pipeline_path()))
    shown = _shown(page)
    assert shown == page_server.expected["states"]
    # The damaged record is named, in the epoch's row and in verify.
    damaged = page_server.expected["damaged"].split("/", 1)[1]
    assert damaged in page.inner_text("tr[data-epoch='3']")
    assert damaged in page.inner_text("table.verify")
    assert "worker-7" in page.inner_text(f"tr[data-epoch='{page_server.expected['open']}']")
    page.screenshot(path=str(page_server.screenshots / "checkpoints-page.png"), full_page=True)

    open_epoch = page_server.expected["open"]
    page.fill("#reason", "INC-42: stage host lost")
    with page.expect_navigation():
        page.locator(f"tr[data-epoch='{open_epoch}'] button.abort").click()
    assert _shown(page)[open_epoch] == "ABORTED"
    p = CheckpointStore.from_url(page_server.store_url).pipeline("orders")
    assert p.state(open_epoch) is EpochState.ABORTED
    decision = p.txlog.read_decision(open_epoch)
    assert decision is not None and decision.by == "admin (Airflow UI)"
    assert decision.reason == "INC-42: stage host lost"
    [action] = p.txlog.actions(open_epoch)
    assert (action.record.action, action.record.by, action.record.reason) == ("abort", "admin (Airflow UI)",
                                                                              "INC-42: stage host lost")
    assert action.outcome is not None and action.outcome.outcome.value == "succeeded"
    # The reloaded page's action history shows who, why and the outcome.
    history = page.locator(f"table.history tr[data-epoch='{open_epoch}'][data-action='abort']")
    assert history.count() == 1 and history.get_attribute("data-outcome") == "succeeded"
    assert "admin (Airflow UI)" in history.inner_text() and "INC-42: stage host lost" in history.inner_text()
    page.context.close()
    shutil.rmtree(page_server.deployment.home / "logs", ignore_errors=True)


def test_pipeline_page_shows_charts_of_the_last_epochs_with_aborted_ones_marked(
    page_server: PageServer, browser: Any,
) -> None:
    page = _page_as(browser, page_server, "viewer")
    page.goto(page_server.url("/stores/config-1/pipelines/payments"))
    charts = page.locator(".charts figure")
    assert [charts.nth(i).get_attribute("data-chart") for i in range(charts.count())] == [
        "rows: payments", "stage duration (begin to prepared)", "commit duration (decision to committed)",
        "checkpoint bytes", "quarantined rows (bad_records)", "expectations: failing fraction per rule"]
    for i in range(charts.count()):
        svg = charts.nth(i).locator("svg.chart")
        assert svg.count() == 1 and svg.is_visible()
        assert svg.locator("g.mark").count() == 14
        assert [m.get_attribute("data-epoch") for m in svg.locator("g.mark.aborted").all()] == ["9"]
    rules = charts.last.locator("g.series")
    assert [g.get_attribute("data-rule") for g in rules.all()] == ["payments.amount_positive", "payments.id_present"]
    assert rules.nth(1).locator("circle").count() == 14 and rules.nth(0).locator("circle").count() == 10
    assert charts.last.locator("g.mark.aborted rect.band").is_visible()
    # Charts are drawn by the server: nothing is fetched, no script draws them.
    assert page.locator("script[src]").count() == 0
    page.locator(".charts-block").screenshot(path=str(page_server.screenshots / "checkpoints-charts.png"))
    page.context.close()


def test_airflow_ui_shows_the_page_under_its_nav_entry(page_server: PageServer, browser: Any) -> None:
    plugins = page_server.deployment.api("GET", "/plugins")
    views = [v for p in plugins["plugins"] for v in p["external_views"]]
    assert {(v["url_route"], v["destination"]) for v in views} >= {
        ("seatunnel-checkpoints", "nav"), ("seatunnel-checkpoint-epoch", "dag_run")}
    page = _page_as(browser, page_server, "admin")
    page.goto(f"{page_server.deployment.base_url}/plugin/seatunnel-checkpoints")
    frame = page.frame_locator("iframe")
    frame.locator("table.pipelines").wait_for(timeout=60_000)
    assert frame.locator("table.pipelines a", has_text="orders").count() == 1
    page.screenshot(path=str(page_server.screenshots / "checkpoints-in-airflow.png"))
    # The DAG run tab's page (the UI fills in {DAG_ID} and {RUN_ID}): that run's epoch.
    page.goto(page_server.url("/run?dag_id=orders_dag&run_id=run-2"))
    assert _shown(page) == {2: "ABORTED"}
    page.goto(page_server.url(_pipeline_path() + "?last=2"))
    assert set(_shown(page)) == {3, 4}
    page.context.close()


def test_dag_run_tab_in_the_airflow_ui_shows_that_runs_epoch_as_the_store_has_it(
    page_server: PageServer, browser: Any,
) -> None:
    # A run of orders_dag with the run id that began epoch 2 (aborted) of ``orders``.
    deployment = page_server.deployment
    deployment.api("POST", "/dags/orders_dag/dagRuns", {"dag_run_id": "run-2", "logical_date": None})
    p = CheckpointStore.from_url(page_server.store_url).pipeline("orders")
    epoch = p.epoch_for_run("run-2", "orders_dag")
    status = p.status(epoch)
    rows = {m.sink: m.rows for record in status.prepared.values() for m in record.sinks}
    page = _page_as(browser, page_server, "admin")
    page.goto(f"{deployment.base_url}/dags/orders_dag/runs/run-2")
    tab = page.get_by_role("link", name="Checkpoint epoch")
    tab.wait_for(timeout=60_000)
    tab.click()
    page.wait_for_url("**/dags/orders_dag/runs/run-2/plugin/seatunnel-checkpoint-epoch", timeout=60_000)
    frame = page.frame_locator("iframe[title='Checkpoint epoch']")
    row = frame.locator(f"table.epochs tr[data-epoch='{epoch}']")
    row.wait_for(timeout=60_000)
    assert frame.locator("table.epochs tr[data-epoch]").count() == 1
    assert row.get_attribute("data-state") == status.state.value == "ABORTED"
    cells = [row.locator("td").nth(i).inner_text().strip() for i in range(4)]
    assert cells[0] == str(epoch) and "run-2" in cells[2], cells
    # Rows per sink as the store has them (what the run's attempt staged: 2 rows in ``orders``).
    assert rows == {"orders": 2}
    assert cells[3].split() == [f"{sink}={count}" for sink, count in sorted(rows.items())], cells
    page.screenshot(path=str(page_server.screenshots / "checkpoints-run-tab.png"))
    page.context.close()


def _post(server: PageServer, user: str, path: str, reason: str) -> tuple[int, Any]:
    """POST an action as ``user`` (bearer token, as a script would); returns status and JSON body."""
    request = urllib.request.Request(server.url(path), method="POST", data=json.dumps({"reason": reason}).encode(),
                                     headers={"Content-Type": "application/json",
                                              "Authorization": f"Bearer {server.tokens[user]}"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def test_retry_publish_of_a_committing_epoch_needs_edit_permission_and_records_the_actor(
    page_server: PageServer,
) -> None:
    epoch = page_server.expected["committing"]
    path = f"/stores/config-1/pipelines/clicks/epochs/{epoch}/retry-publish"
    status, body = _post(page_server, "viewer", path, "viewer tries")
    assert status == 403 and "viewer" in body["detail"], body
    clicks = CheckpointStore.from_url(page_server.store_url).pipeline("clicks")
    assert clicks.state(epoch) is EpochState.COMMITTING
    status, body = _post(page_server, "admin", path, "INC-43: target was read-only, fixed")
    assert status == 200, body
    assert clicks.state(epoch) is EpochState.COMMITTED
    [action] = clicks.txlog.actions(epoch)
    assert (action.record.action, action.record.by) == ("retry-publish", "admin (Airflow UI)")
    assert action.outcome is not None and action.outcome.outcome.value == "succeeded"
    assert body["outcome"]["outcome"] == "succeeded" and "published" in body["outcome"]["detail"]
    # Only a COMMITTING epoch's publish is retried.
    status, body = _post(page_server, "admin", path, "again")
    assert status == 409 and "COMMITTED" in body["detail"], body


def test_run_recovery_from_the_page_carries_out_the_dry_run_and_records_the_actor(page_server: PageServer) -> None:
    path = "/stores/config-1/pipelines/events/recover"
    epoch = page_server.expected["events_committing"]
    events = CheckpointStore.from_url(page_server.store_url).pipeline("events")
    status, body = _post(page_server, "viewer", path, "viewer tries")
    assert status == 403, body
    assert events.state(epoch) is EpochState.COMMITTING
    status, body = _post(page_server, "admin", path, "INC-44: finish the publish")
    assert status == 200, body
    assert body["dry_run"] is False
    assert [(a["epoch"], a["action"], a["done"]) for a in body["actions"]] == [(epoch, "finish-commit", True)]
    assert events.state(epoch) is EpochState.COMMITTED
    [action] = events.txlog.actions(epoch)
    assert (action.record.action, action.record.by, action.record.reason) == ("recover", "admin (Airflow UI)",
                                                                              "INC-44: finish the publish")
    assert action.outcome is not None and action.outcome.outcome.value == "succeeded"
    assert action.outcome.detail.startswith("finish-commit: ")


def test_bad_requests_are_refused_with_what_was_wrong(page_server: PageServer) -> None:
    status, body = _post(page_server, "admin", "/stores/nope/pipelines/orders/epochs/1/abort", "x")
    assert status == 404 and "no checkpoint store 'nope'" in body["detail"] and "config-1" in body["detail"]
    status, body = _post(page_server, "admin", "/stores/config-1/pipelines/nope/epochs/1/abort", "x")
    assert status == 404 and "no pipeline 'nope'" in body["detail"] and "orders" in body["detail"]
    status, body = _post(page_server, "admin", "/stores/config-1/pipelines/orders/epochs/1/abort", "x")
    assert status == 409 and "COMMITTED" in body["detail"] and "undecided" in body["detail"], body
    status, body = _post(page_server, "admin", "/stores/config-1/pipelines/orders/epochs/99/abort", "x")
    assert status == 404 and "99" in body["detail"], body
    status, body = _post(page_server, "admin", "/stores/config-1/pipelines/orders/epochs/1/abort", "")
    assert status == 422, body  # a reason is required: it goes into the transaction log


def test_an_action_sent_as_a_form_would_send_it_is_refused(page_server: PageServer) -> None:
    # A cross-site HTML form can POST text/plain with the session cookie; actions read JSON only.
    epoch = page_server.expected["open"]
    request = urllib.request.Request(
        page_server.url(f"{_pipeline_path()}/epochs/{epoch}/abort"), method="POST",
        data=b'{"reason": "forged"}',
        headers={"Content-Type": "text/plain", "Cookie": f"_token={page_server.tokens['admin']}"})
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=30)
    assert caught.value.code == 422
    p = CheckpointStore.from_url(page_server.store_url).pipeline("orders")
    assert all(a.record.reason != "forged" for a in p.txlog.actions(epoch))


def test_a_connection_saved_from_the_ui_form_opens_the_store_with_the_numbers_typed_in(
    page_server: PageServer, browser: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    from airflow_seatunnel_ckpt.hooks.checkpoint_store import CheckpointStoreHook

    page = _page_as(browser, page_server, "admin")
    page.goto(f"{page_server.deployment.base_url}/connections")
    try:
        page.get_by_role("button", name="Add Connection").click(timeout=60_000)
        page.get_by_label("Connection ID").fill("form_store")
        kind = page.get_by_role("dialog").get_by_role("combobox")  # the type's search box
        kind.fill("SeaTunnel Checkpoint Store")
        page.get_by_role("option", name="SeaTunnel Checkpoint Store").click()
        _expand(page, "Standard Fields")
        page.get_by_label("Storage URL").fill(page_server.store_url)
        _expand(page, "Extra Fields")
        # The numbers typed in; Storage options and Secondary store URL are left empty.
        page.get_by_label("Prepared timeout (s)").fill("300")
        page.get_by_label("Stage lease timeout (s)").fill("45")
        page.get_by_label("Checkpoints kept").fill("10")
        page.screenshot(path=str(page_server.screenshots / "connection-form.png"), full_page=True)
        page.get_by_role("button", name="Save").click()
        saved = page_server.deployment.wait_for(
            "the saved connection", lambda: _connection(page_server, "form_store"), timeout=60)
    except Exception:
        (tmp_path / "form.html").write_text(page.content())
        page.screenshot(path=str(tmp_path / "form.png"), full_page=True)
        print(f"page at failure: {tmp_path / 'form.html'}, {tmp_path / 'form.png'}")
        raise
    finally:
        page.context.close()

    extra = json.loads(saved["extra"] or "{}")
    # What the form writes: empty fields as null, the numbers as typed (whatever their JSON type).
    assert saved["conn_type"] == "seatunnel_ckpt" and saved["host"] == page_server.store_url
    print(f"extras saved by the connection form: {extra}")
    typed = {k: str(v) for k, v in extra.items() if v is not None}
    assert typed.items() >= {"prepared_timeout_s": "300", "lease_timeout_s": "45", "max_retain": "10"}.items(), extra
    # The hook reads the connection exactly as the form saved it.
    monkeypatch.setenv("AIRFLOW_CONN_FORM_STORE", json.dumps(
        {"conn_type": saved["conn_type"], "host": saved["host"], "extra": extra}))
    hook = CheckpointStoreHook("form_store")
    config = hook.get_config()
    assert (config.prepared_timeout_s, config.lease_timeout_s, config.max_retain) == (300, 45, 10)
    assert config.storage_url == page_server.store_url and dict(config.storage_options) == {}
    assert hook.get_pipeline("orders").state(1) is EpochState.COMMITTED


def _expand(page: Any, section: str) -> None:
    """Open a section of the connection form (whichever way it starts)."""
    header = page.get_by_role("button", name=section, exact=True)
    if header.get_attribute("aria-expanded") != "true":
        header.click()


def _connection(server: PageServer, conn_id: str) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = server.deployment.api("GET", f"/connections/{conn_id}")
        return found
    except DeploymentError:
        return None
