"""Small charts of a pipeline's last epochs for the Checkpoints page, as inline SVG drawn here (no
JavaScript, nothing fetched: the page works offline), from what the transaction log and the
checkpoint already record; one mark per epoch, aborted epochs marked (docs/UI.md).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from html import escape

from markupsafe import Markup

from airflow_seatunnel_ckpt.core.errors import CheckpointError
from airflow_seatunnel_ckpt.core.models import EpochState
from airflow_seatunnel_ckpt.core.protocol import epoch_index
from airflow_seatunnel_ckpt.core.protocol.epoch_index import EpochSummary
from airflow_seatunnel_ckpt.core.protocol.expectations import summary as expectation_summary
from airflow_seatunnel_ckpt.core.store import StoredPipeline

QUARANTINE_SUFFIX = ".bad_records"  # a source's quarantine sink (see spark.runner)
DEFAULT_LAST = 30

_WIDTH, _HEIGHT = 320, 110
_LEFT, _RIGHT, _TOP, _BOTTOM = 46, 6, 8, 18


@dataclass
class EpochPoint:
    """What one epoch recorded, as the charts plot it (None: not recorded or not yet)."""

    epoch: int
    state: str
    rows: dict[str, int] = field(default_factory=dict)
    quarantined: int = 0
    stage_s: float | None = None
    commit_s: float | None = None
    checkpoint_bytes: int | None = None
    expectations: dict[str, float] = field(default_factory=dict)


@dataclass
class Chart:
    """One chart of the page: a title and its SVG."""

    title: str
    svg: Markup


def epoch_point(p: StoredPipeline, epoch: int, summary: EpochSummary | None = None) -> EpochPoint:
    """One epoch's point, from the epoch index's ``summary`` of it, else from its log records and
    checkpoint (a damaged record: no values)."""
    try:
        summary = summary or epoch_index.summarise(p, epoch)
    except CheckpointError:
        return EpochPoint(epoch, "DAMAGED")
    point = EpochPoint(epoch, summary.state.value)
    rows = summary.rows_per_sink()
    point.quarantined = sum(n for sink, n in rows.items() if sink.endswith(QUARANTINE_SUFFIX))
    point.rows = {sink: n for sink, n in rows.items() if not sink.endswith(QUARANTINE_SUFFIX)}
    point.expectations = {f"{e['sink']}.{e['rule']}": e["fraction"]
                          for e in expectation_summary(summary.prepared.values())}
    if summary.begin is not None and summary.prepared:
        prepared_at = max(r.prepared_at for r in summary.prepared.values())
        point.stage_s = max(0.0, prepared_at - summary.begin.created_at)
    if summary.state is EpochState.COMMITTED and summary.decision is not None and summary.committed_at is not None:
        point.commit_s = max(0.0, summary.committed_at - summary.decision.decided_at)
    point.checkpoint_bytes = summary.checkpoint_bytes
    return point


def epoch_points(p: StoredPipeline, last: int = DEFAULT_LAST) -> list[EpochPoint]:
    """The newest ``last`` epochs' points, oldest first."""
    epochs, held = epoch_index.newest(p, last)
    return [epoch_point(p, e, held.get(e)) for e in epochs]


def _human(value: float, unit: str) -> str:
    """``1.2 MB``, ``3.4 min``, ``12 k`` rows: short enough for an axis label."""
    if unit == "bytes":
        for suffix, size in (("GB", 1 << 30), ("MB", 1 << 20), ("kB", 1 << 10)):
            if value >= size:
                return f"{value / size:.1f} {suffix}"
        return f"{value:.0f} B"
    if unit == "s":
        if value >= 3600:
            return f"{value / 3600:.1f} h"
        return f"{value / 60:.1f} min" if value >= 120 else f"{value:.1f} s"
    if unit == "fraction":
        return f"{value * 100:.1f}%" if value < 0.1 else f"{value * 100:.0f}%"
    for suffix, size in (("M", 1e6), ("k", 1e3)):
        if value >= size:
            return f"{value / size:.1f} {suffix}"
    return f"{value:.0f}"


def _svg_start(title: str, height: int, top_label: str) -> list[str]:
    """A chart's opening: the ``<svg>``, its title, the base line and the y axis' labels."""
    base_y = _HEIGHT - _BOTTOM
    return [f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{_WIDTH}" height="{height}" '
            f'viewBox="0 0 {_WIDTH} {height}" role="img" aria-label="{escape(title)}">',
            f"<title>{escape(title)}</title>",
            f'<line class="axis" x1="{_LEFT}" y1="{base_y}" x2="{_WIDTH - _RIGHT}" y2="{base_y}"/>',
            f'<text class="label" x="{_LEFT - 4}" y="{_TOP + 8}" text-anchor="end">{escape(top_label)}</text>',
            f'<text class="label" x="{_LEFT - 4}" y="{base_y}" text-anchor="end">0</text>']


def _svg_end(out: list[str], points: Sequence[EpochPoint]) -> Markup:
    """The first and last epochs under the x axis, the closing tag; the chart."""
    if points:
        out.append(f'<text class="label" x="{_LEFT}" y="{_HEIGHT - 4}">{points[0].epoch}</text>')
        out.append(f'<text class="label" x="{_WIDTH - _RIGHT}" y="{_HEIGHT - 4}" text-anchor="end">'
                   f"epoch {points[-1].epoch}</text>")
    out.append("</svg>")
    return Markup("".join(out))


def _kind(pt: EpochPoint) -> str:
    """An epoch's mark class: aborted, committed or other (not decided, committing)."""
    if pt.state in ("ABORTED", "ABORTING"):
        return "aborted"
    return "committed" if pt.state == "COMMITTED" else "other"


def _cross(cx: float, cy: float, r: float) -> str:
    return (f'<path class="cross" d="M{cx - r:.1f},{cy - r:.1f}L{cx + r:.1f},{cy + r:.1f}'
            f'M{cx - r:.1f},{cy + r:.1f}L{cx + r:.1f},{cy - r:.1f}"/>')


def bar_chart(title: str, points: Sequence[EpochPoint], value: Callable[[EpochPoint], float | None],
              unit: str = "rows") -> Markup:
    """An SVG bar chart: one ``<g class="mark">`` per epoch (a bar, or a cross where the epoch
    recorded no value, aborted epochs crossed too) and a dashed line at the median."""
    plot_w, plot_h = _WIDTH - _LEFT - _RIGHT, _HEIGHT - _TOP - _BOTTOM
    values = [value(pt) for pt in points]
    known = [v for v in values if v is not None]
    top = max(known, default=0.0) or 1.0
    step = plot_w / max(len(points), 1)
    bar_w = max(step * 0.75, 1.0)
    base_y = _TOP + plot_h
    out = _svg_start(title, _HEIGHT, _human(top, unit))
    for i, (pt, v) in enumerate(zip(points, values, strict=True)):
        x = _LEFT + i * step + (step - bar_w) / 2
        kind = _kind(pt)
        shown = "no value" if v is None else _human(v, unit) + ("" if unit in ("bytes", "s") else f" {unit}")
        tip = escape(f"epoch {pt.epoch} ({pt.state}): {shown}")
        out.append(f'<g class="mark {kind}" data-epoch="{pt.epoch}"><title>{tip}</title>')
        if v is not None:
            h = max(v / top * plot_h, 1.0)
            out.append(f'<rect x="{x:.1f}" y="{base_y - h:.1f}" width="{bar_w:.1f}" height="{h:.1f}"/>')
        if v is None or kind == "aborted":
            out.append(_cross(x + bar_w / 2, base_y - 4, min(bar_w / 2, 3.5)))
        out.append("</g>")
    if len(known) >= 3:
        y = base_y - statistics.median(known) / top * plot_h
        out.append(f'<line class="median" x1="{_LEFT}" y1="{y:.1f}" x2="{_WIDTH - _RIGHT}" y2="{y:.1f}">'
                   f"<title>median {escape(_human(statistics.median(known), unit))}</title></line>")
    return _svg_end(out, points)


SERIES_COLOURS = ("#2b6cb0", "#d69e2e", "#805ad5", "#38a169", "#dd6b20", "#319795")
_LEGEND_LINE = 12


def fraction_chart(title: str, points: Sequence[EpochPoint]) -> Markup:
    """An SVG line chart of each expectation's failing fraction per epoch: one ``<g class="series">``
    per rule, one ``<g class="mark">`` per epoch as in :func:`bar_chart`, and a legend."""
    rules = sorted({rule for pt in points for rule in pt.expectations})
    height = _HEIGHT + _LEGEND_LINE * len(rules)
    plot_w, plot_h = _WIDTH - _LEFT - _RIGHT, _HEIGHT - _TOP - _BOTTOM
    top = max((f for pt in points for f in pt.expectations.values()), default=0.0) or 1.0
    step = plot_w / max(len(points), 1)
    base_y = _TOP + plot_h

    def x_of(i: int) -> float:
        return _LEFT + i * step + step / 2

    def y_of(fraction: float) -> float:
        return base_y - fraction / top * plot_h

    out = _svg_start(title, height, _human(top, "fraction"))
    for i, pt in enumerate(points):
        kind = _kind(pt)
        measured = ", ".join(f"{rule} {_human(f, 'fraction')}" for rule, f in sorted(pt.expectations.items()))
        tip = escape(f"epoch {pt.epoch} ({pt.state}): {measured or 'no expectation measured'}")
        out.append(f'<g class="mark {kind}" data-epoch="{pt.epoch}"><title>{tip}</title>')
        if kind == "aborted":
            out.append(f'<rect class="band" x="{x_of(i) - step / 2:.1f}" y="{_TOP}" width="{step:.1f}" '
                       f'height="{plot_h}"/>' + _cross(x_of(i), base_y - 4, min(step * 0.75 / 2, 3.5)))
        out.append("</g>")
    for n, rule in enumerate(rules):
        colour = SERIES_COLOURS[n % len(SERIES_COLOURS)]
        measured = [(i, pt) for i, pt in enumerate(points) if rule in pt.expectations]
        line = " ".join(f"{x_of(i):.1f},{y_of(pt.expectations[rule]):.1f}" for i, pt in measured)
        out.append(f'<g class="series" data-rule="{escape(rule)}" stroke="{colour}" fill="{colour}">'
                   f"<title>{escape(rule)}</title>"
                   f'<polyline fill="none" stroke-width="1.5" points="{line}"/>')
        for i, pt in measured:
            tip = escape(f"{rule}, epoch {pt.epoch} ({pt.state}): {_human(pt.expectations[rule], 'fraction')} failed")
            out.append(f'<circle data-epoch="{pt.epoch}" cx="{x_of(i):.1f}" '
                       f'cy="{y_of(pt.expectations[rule]):.1f}" r="2"><title>{tip}</title></circle>')
        legend_y = _HEIGHT + _LEGEND_LINE * n + 4
        out.append(f'<line x1="{_LEFT}" y1="{legend_y - 3}" x2="{_LEFT + 14}" y2="{legend_y - 3}" stroke-width="2"/>'
                   f'<text class="label" stroke="none" x="{_LEFT + 18}" y="{legend_y}">{escape(rule)}</text></g>')
    return _svg_end(out, points)


def pipeline_charts(points: Sequence[EpochPoint]) -> list[Chart]:
    """The page's charts (docs/UI.md): rows of each sink, durations, checkpoint bytes, quarantined rows
    and expectations' failing fractions when there are any."""
    sinks = sorted({sink for pt in points for sink in pt.rows})
    charts = [Chart(f"rows: {sink}", bar_chart(f"rows written to {sink} per epoch", points,
                                               lambda pt, s=sink: pt.rows.get(s)))
              for sink in sinks]
    charts += [
        Chart("stage duration (begin to prepared)",
              bar_chart("stage duration per epoch", points, lambda pt: pt.stage_s, "s")),
        Chart("commit duration (decision to committed)",
              bar_chart("commit duration per epoch", points, lambda pt: pt.commit_s, "s")),
        Chart("checkpoint bytes", bar_chart("checkpoint bytes per epoch", points,
                                            lambda pt: pt.checkpoint_bytes, "bytes")),
    ]
    if any(pt.quarantined for pt in points):
        charts.append(Chart("quarantined rows (bad_records)",
                            bar_chart("rows quarantined per epoch", points, lambda pt: pt.quarantined)))
    if any(pt.expectations for pt in points):
        charts.append(Chart("expectations: failing fraction per rule",
                            fraction_chart("failing fraction of each expectation per epoch", points)))
    return charts
