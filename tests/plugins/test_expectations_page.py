"""The Checkpoints page shows each rule's failing fraction, and the epoch a rule refused as ABORTED.

The store is real (file://, built with the core test helpers); the rows are rendered with
the page's own template.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from airflow_seatunnel_ckpt.core import CheckpointStore, Decision
from airflow_seatunnel_ckpt.core.models import ExpectationResult
from airflow_seatunnel_ckpt.core.store import StoredPipeline
from tests.core.epochs import stage, target_url


def _prepare_with_rule(p: StoredPipeline, run_id: str, failed: int) -> int:
    epoch = p.begin(run_id).epoch
    stage(p, epoch, 1, "orders", [b"a"])
    manifest = p.manifest_for_staged(epoch, 1, "orders", target_url(p, "orders"), 100)
    rule = ExpectationResult("id_present", "order_id IS NOT NULL", "quarantine", 100, failed, 0.05)
    p.prepare(epoch, "ingest", 1, run_id=run_id, sinks=[dataclasses.replace(manifest, expectations=(rule,))],
              operators={}, sources={}, base=p.restore_point())
    return epoch


def test_page_rows_show_each_rules_failing_fraction_and_the_refused_epoch_aborted(tmp_path: Path) -> None:
    from airflow_seatunnel_ckpt.plugins.app import _templates
    from airflow_seatunnel_ckpt.plugins.overview import pipeline_view

    store = CheckpointStore.from_url(f"file://{tmp_path}/ckpt")
    p = store.pipeline("orders")
    ok = _prepare_with_rule(p, "run-1", failed=3)
    assert p.decide(ok, Decision.COMMIT, "test", "test").decision is Decision.COMMIT
    p.commit(ok)
    bad = _prepare_with_rule(p, "run-2", failed=9)
    record = p.decide(bad, Decision.COMMIT, "test", "test")
    assert record.decision is Decision.ABORT
    assert "expectation 'id_present' of sink 'orders': 9 of 100 rows failed (9.0%), over max_fraction 5.0%" \
        in record.reason
    p.abort(bad, record.reason)

    rows = {row.epoch: row for row in pipeline_view(store, "orders").epochs}
    assert rows[ok].state == "COMMITTED" and rows[bad].state == "ABORTED"
    assert [(x["rule"], x["failed"], x["refused"] is None) for x in rows[ok].expectations] == [
        ("id_present", 3, True)]
    html = _templates.get_template("_epochs.html").render(rows=[rows[bad], rows[ok]], actions=False, base="")
    assert "orders.id_present 3.0% (3/100)" in html
    assert '<span class="bad" title="quarantine: order_id IS NOT NULL -- expectation' in html
    assert "orders.id_present 9.0% (9/100)" in html


def test_commit_branch_aborts_an_epoch_its_expectations_refuse_as_a_failed_check(tmp_path: Path) -> None:
    from airflow_seatunnel_ckpt.operators.branch import CHECK_FAILED, CommitBranchOperator

    url = f"file://{tmp_path}/ckpt"
    p = CheckpointStore.from_url(url).pipeline("orders")
    epoch = _prepare_with_rule(p, "run-1", failed=9)
    branch = CommitBranchOperator(task_id="decide", pipeline="orders", storage_url=url, participants=["ingest"],
                                  commit_task_id="commit", abort_task_id="abort", fallback_task_id="quarantine")
    verdict = branch.evaluate(p.status(epoch))
    assert verdict.decision is Decision.ABORT
    assert verdict.reason.startswith(f"{CHECK_FAILED}expectations failed: expectation 'id_present' of sink "
                                     "'orders': 9 of 100 rows failed (9.0%), over max_fraction 5.0%")
    ok = _prepare_with_rule(CheckpointStore.from_url(f"file://{tmp_path}/other").pipeline("orders"), "run-1", 3)
    assert branch.evaluate(CheckpointStore.from_url(f"file://{tmp_path}/other").pipeline("orders").status(ok)
                           ).decision is Decision.COMMIT
