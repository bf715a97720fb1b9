"""The Checkpoints page's charts: one SVG per measure, one mark per epoch, aborted epochs
marked, names escaped, values from what the store recorded (no browser; the browser test
checks them on the served page)."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

from airflow_seatunnel_ckpt.core import CheckpointStore, Decision
from airflow_seatunnel_ckpt.core.models import ExpectationResult
from airflow_seatunnel_ckpt.core.store import StoredPipeline
from tests.core.epochs import Participant, prepare_participant

#: The DAG owning the charted pipeline (the page authorises by it).
DAG_ID = "orders_dag"
PAYMENTS = "payments"
#: Epochs of :func:`build_charted_pipeline`, the one it aborts, and the rows it writes.
CHARTED_EPOCHS = 14
ABORTED_EPOCH = 9
SVG = "{http://www.w3.org/2000/svg}"


def _rows(epoch: int) -> int:
    return 4 + epoch % 5 + (12 if epoch == 12 else 0)  # epoch 12 is the big one


#: The sink's expectations: ``id_present`` in every epoch (over its 5% in the aborted one),
#: ``amount_positive`` from :data:`DROP_RULE_FROM` on.
RULES = ("id_present", "amount_positive")
DROP_RULE_FROM = 5


def _id_failures(epoch: int) -> int:
    return 9 if epoch == ABORTED_EPOCH else epoch % 3  # of 100 rows


def _expectations(epoch: int) -> tuple[ExpectationResult, ...]:
    rules = [ExpectationResult("id_present", "order_id IS NOT NULL", "quarantine", 100, _id_failures(epoch), 0.05)]
    if epoch >= DROP_RULE_FROM:
        rules.append(ExpectationResult("amount_positive", "amount > 0", "drop", 100, 1))
    return tuple(rules)


def build_charted_pipeline(store: CheckpointStore) -> StoredPipeline:
    """``payments``: 14 epochs, one sink with expectations and a source's quarantine sink, a
    growing keyed state; epoch 9 aborted by its expectation, the others committed."""
    p = store.pipeline(PAYMENTS)
    for epoch in range(1, CHARTED_EPOCHS + 1):
        run_id = f"pay-{epoch}"
        begun = p.begin(run_id, DAG_ID, logical_date=f"2026-11-24T{epoch:02d}:00:00+00:00").epoch
        sinks = {PAYMENTS: [b"p" * 10] * _rows(epoch)}
        if epoch % 4 == 3:
            sinks[f"{PAYMENTS}.bad_records"] = [b"bad"] * (epoch // 4 + 1)
        changes = {k: k * epoch for k in range(epoch * 40)}
        prepare_participant(p, run_id, Participant(sinks=sinks, changes=changes,
                                                   expectations={PAYMENTS: _expectations(epoch)}), epoch=begun)
        decision = p.decide(begun, Decision.COMMIT, "all prepared", by="test")
        if epoch == ABORTED_EPOCH:
            assert decision.decision is Decision.ABORT, "the expectation refuses the epoch"
            p.abort(begun, decision.reason, by="test")
        else:
            p.commit(begun)
    return p


def _marks(svg: str) -> list[ET.Element]:
    root = ET.fromstring(svg)
    return [g for g in root.iter(f"{SVG}g") if "mark" in g.get("class", "").split()]


def test_each_chart_has_one_mark_per_epoch_and_marks_the_aborted_one(tmp_path: Path) -> None:
    from airflow_seatunnel_ckpt.plugins.charts import epoch_points, pipeline_charts

    p = build_charted_pipeline(CheckpointStore.from_url(f"file://{tmp_path}/ckpt"))
    points = epoch_points(p)
    assert [pt.epoch for pt in points] == list(range(1, CHARTED_EPOCHS + 1))
    assert [pt.rows[PAYMENTS] for pt in points] == [_rows(e) for e in range(1, CHARTED_EPOCHS + 1)]
    assert {pt.epoch: pt.quarantined for pt in points if pt.quarantined} == {3: 1, 7: 2, 11: 3}
    committed = [pt for pt in points if pt.epoch != ABORTED_EPOCH]
    assert all(pt.stage_s is not None and pt.commit_s is not None for pt in committed)
    assert points[ABORTED_EPOCH - 1].commit_s is None  # never committed
    sizes = [pt.checkpoint_bytes for pt in committed]
    assert all(s is not None for s in sizes) and sizes[-1] > sizes[0]  # the state grows

    charts = pipeline_charts(points)
    assert [c.title for c in charts] == [
        f"rows: {PAYMENTS}", "stage duration (begin to prepared)", "commit duration (decision to committed)",
        "checkpoint bytes", "quarantined rows (bad_records)", "expectations: failing fraction per rule"]
    for chart in charts:
        marks = _marks(chart.svg)
        assert [int(m.get("data-epoch", "0")) for m in marks] == list(range(1, CHARTED_EPOCHS + 1)), chart.title
        aborted = [m for m in marks if "aborted" in m.get("class", "")]
        assert [int(m.get("data-epoch", "0")) for m in aborted] == [ABORTED_EPOCH], chart.title
        assert aborted[0].find(f"{SVG}path") is not None, "an aborted epoch carries a cross"
    # The biggest epoch has the tallest bar of the rows chart.
    heights = {int(m.get("data-epoch", "0")): float(m.find(f"{SVG}rect").get("height", "0"))  # type: ignore[union-attr]
               for m in _marks(charts[0].svg)}
    assert max(heights, key=lambda e: heights[e]) == 12


def test_expectations_chart_has_a_line_per_rule_and_a_band_on_the_epoch_a_rule_aborted(tmp_path: Path) -> None:
    from airflow_seatunnel_ckpt.plugins.charts import epoch_points, pipeline_charts

    points = epoch_points(build_charted_pipeline(CheckpointStore.from_url(f"file://{tmp_path}/ckpt")))
    assert [pt.expectations.get(f"{PAYMENTS}.id_present") for pt in points] == [
        _id_failures(e) / 100 for e in range(1, CHARTED_EPOCHS + 1)]
    [chart] = [c for c in pipeline_charts(points) if c.title.startswith("expectations")]
    root = ET.fromstring(str(chart.svg))
    series = {g.get("data-rule"): g for g in root.iter(f"{SVG}g") if g.get("class") == "series"}
    assert sorted(series) == sorted(f"{PAYMENTS}.{r}" for r in RULES)
    dots = {rule: {int(c.get("data-epoch", "0")): float(c.get("cy", "0")) for c in g.iter(f"{SVG}circle")}
            for rule, g in series.items()}
    assert sorted(dots[f"{PAYMENTS}.id_present"]) == list(range(1, CHARTED_EPOCHS + 1))
    assert sorted(dots[f"{PAYMENTS}.amount_positive"]) == list(range(DROP_RULE_FROM, CHARTED_EPOCHS + 1))
    id_present = dots[f"{PAYMENTS}.id_present"]
    assert min(id_present, key=lambda e: id_present[e]) == ABORTED_EPOCH  # the highest point (SVG y grows down)
    assert all(g.find(f"{SVG}polyline") is not None and g.findtext(f"{SVG}text") for g in series.values())
    bands = [m for m in _marks(str(chart.svg)) if m.find(f"{SVG}rect[@class='band']") is not None]
    assert [int(m.get("data-epoch", "0")) for m in bands] == [ABORTED_EPOCH]
    assert "epoch 9 (ABORTED): payments.amount_positive 1.0%, payments.id_present 9.0%" in (
        bands[0].findtext(f"{SVG}title") or "")


def test_an_epoch_without_a_value_gets_a_cross_instead_of_a_bar() -> None:
    from airflow_seatunnel_ckpt.plugins.charts import EpochPoint, bar_chart

    points = [EpochPoint(1, "COMMITTED", stage_s=3.0), EpochPoint(2, "OPEN"), EpochPoint(3, "COMMITTED", stage_s=90)]
    marks = _marks(bar_chart("stage duration", points, lambda pt: pt.stage_s, "s"))
    assert [m.find(f"{SVG}rect") is not None for m in marks] == [True, False, True]
    assert marks[1].find(f"{SVG}path") is not None
    assert "epoch 3 (COMMITTED): 90.0 s" in (marks[2].findtext(f"{SVG}title") or "")


def test_names_in_a_chart_are_escaped() -> None:
    from airflow_seatunnel_ckpt.plugins.charts import EpochPoint, pipeline_charts

    sink = 'x"><script>alert(1)</script>'
    charts = pipeline_charts([EpochPoint(1, "COMMITTED", rows={sink: 5})])
    svg = str(charts[0].svg)
    assert "<script>" not in svg and "&lt;script&gt;" in svg
    ET.fromstring(svg)  # still well-formed XML
    assert re.search(r'aria-label="rows written to x&quot;&gt;&lt;script&gt;', svg)
