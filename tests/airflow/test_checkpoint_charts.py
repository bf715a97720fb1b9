"""The Checkpoints page's charts: one SVG per measure, one mark per epoch, aborted epochs
marked, names escaped, values from what the store recorded (no browser; the browser test
checks them on the served page)."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

from airflow_seatunnel_ckpt.core import CheckpointStore, Decision
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


def build_charted_pipeline(store: CheckpointStore) -> StoredPipeline:
    """``payments``: 14 epochs, one sink and its quarantine sink, a growing keyed state;
    epoch 9 aborted, the others committed."""
    p = store.pipeline(PAYMENTS)
    for epoch in range(1, CHARTED_EPOCHS + 1):
        run_id = f"pay-{epoch}"
        begun = p.begin(run_id, DAG_ID, logical_date=f"2026-11-24T{epoch:02d}:00:00+00:00").epoch
        sinks = {PAYMENTS: [b"p" * 10] * _rows(epoch)}
        if epoch % 4 == 3:
            sinks[f"{PAYMENTS}.bad_records"] = [b"bad"] * (epoch // 4 + 1)
        changes = {k: k * epoch for k in range(epoch * 40)}
        prepare_participant(p, run_id, Participant(sinks=sinks, changes=changes), epoch=begun)
        if epoch == ABORTED_EPOCH:
            p.abort(begun, "bad input", by="test")
        else:
            p.decide(begun, Decision.COMMIT, "all prepared", by="test")
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
        "checkpoint bytes", "quarantined rows (bad_records)"]
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
