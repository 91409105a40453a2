"""Static SVG drawings of measured traces (pure: data in, SVG text out).

- :func:`pipeline_gantt`: one row per rank of a pipeline group on the global clock (the ranks'
  ``baseTimeNanoseconds`` + ``ts``), a compute row and a thin communication row each; white
  gaps in the compute rows are idle time, so pipeline bubbles show as a staircase.
- :func:`stacked_bars`: one horizontal bar per item (a rank, a micro-batch segment) split into
  named parts -- compute, exposed communication, overlapped communication, idle.

Every string from a trace passes through :func:`dml2comm.render.charts.xml_text`; the helpers
(``_Svg``, ``nice_step``) are the site's own chart helpers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from dml2comm.render.charts import AXIS_COLOUR, GRID_COLOUR, TEXT_COLOUR, _Svg, nice_step, xml_text
from dml2comm.render.fmt import fmt_s
from dml2comm.traces.classify import Activity, Category

__all__ = ["CATEGORY_STYLE", "GanttInput", "pipeline_gantt", "stacked_bars", "PART_COLOURS"]

#: Category -> (legend label, fill)
CATEGORY_STYLE: dict[int, tuple[str, str]] = {
    Category.FORWARD: ("forward", "#fdae61"),
    Category.BACKWARD: ("backward", "#d95f02"),
    Category.RECOMPUTE: ("recomputation", "#fee08b"),
    Category.OPTIMIZER: ("optimizer", "#8e7cc3"),
    Category.COMM_TP: ("tp comm", "#1b9e77"),
    Category.COMM_DP: ("dp comm", "#08519c"),
    Category.COMM_PP: ("pp comm", "#6baed6"),
    Category.COMM_EP: ("ep comm", "#e7298a"),
    Category.COMM_OTHER: ("other comm", "#9aa0a6"),
    Category.MEMCPY: ("memcpy", "#bab0ac"),
    Category.MEMSET: ("memset", "#d9d9d9"),
}
_COMM = {Category.COMM_TP, Category.COMM_DP, Category.COMM_PP, Category.COMM_EP, Category.COMM_OTHER}

PART_COLOURS = {"compute": "#d95f02", "exposed communication": "#08519c", "overlapped communication": "#6baed6",
                "idle": "#ffffff", "memcpy": "#bab0ac"}


@dataclass(frozen=True)
class GanttInput:
    label: str
    activity: Activity
    step: int  # index into activity.steps


def _merged(start: np.ndarray, end: np.ndarray, tol: float) -> tuple[np.ndarray, np.ndarray]:
    """Intervals closer than ``tol`` joined (one rectangle per visible run)."""
    if start.size == 0:
        return start, end
    order = np.argsort(start, kind="stable")
    s, e = start[order], end[order]
    run = np.maximum.accumulate(e)
    new = np.ones(s.size, dtype=bool)
    new[1:] = s[1:] > run[:-1] + tol
    g = np.cumsum(new) - 1
    ends = np.full(int(g[-1]) + 1, -np.inf)
    np.maximum.at(ends, g, e)
    return s[new], ends


def pipeline_gantt(rows: Sequence[GanttInput], title: str, plot_w: float = 960.0) -> str:
    """Rows of one step on the global clock, starting at the group's first event (see module doc)."""
    spans = []
    for r in rows:
        sel = r.activity.step == r.step
        if sel.any():
            spans.append((float(r.activity.start[sel].min()), float(r.activity.end[sel].max())))
    t0 = min((s for s, _ in spans), default=0.0)
    t1 = max((e for _, e in spans), default=1.0)
    span = max(t1 - t0, 1e-9)
    left, top, main_h, thin_h, gap = 110.0, 44.0, 20.0, 8.0, 8.0
    px = plot_w / span
    tol = span / plot_w * 0.75  # closer than ~1 px: one rectangle
    g = _Svg()
    present: set[int] = set()
    y = top
    bodies: list[str] = []
    for r in rows:
        act = r.activity
        sel = act.step == r.step
        g.text(left - 8, y + 13, r.label, size=11, anchor="end", fill=TEXT_COLOUR, weight="bold")
        g.add(g.rect(left, y, plot_w, main_h, "#f8f9fa"))
        g.add(g.rect(left, y + main_h + 2, plot_w, thin_h, "#fbfbfc"))
        for cat in np.unique(act.category[sel]):
            m = sel & (act.category == cat)
            s, e = _merged(act.start[m], act.end[m], tol)
            name, fill = CATEGORY_STYLE[int(cat)]
            present.add(int(cat))
            ry, rh = (y + main_h + 3, thin_h - 2) if int(cat) in _COMM else (y + 1, main_h - 2)
            for a, b in zip(s, e):
                x = left + (a - t0) * px
                w = max((b - a) * px, 0.6)
                bodies.append(f'<rect x="{x:.2f}" y="{ry:.2f}" width="{w:.2f}" height="{rh:.2f}" fill="{fill}" class="d2c-box" '
                              f'data-kind="{xml_text(name)}"><title>{xml_text(f"{r.label}: {name}, {fmt_s((b - a) * 1e-6)} at {fmt_s((a - t0) * 1e-6)}")}</title></rect>')
        y += main_h + thin_h + 4 + gap
    bottom = y
    step_ms = nice_step(span / 1e3, 10)
    decimals = next((d for d in range(7) if abs(round(step_ms, d) - step_ms) < step_ms * 1e-6), 6)
    for k in range(int(math.floor(span / 1e3 / step_ms + 1e-9)) + 1):
        x = left + k * step_ms * 1e3 * px
        g.add(f'<line x1="{x:.2f}" y1="{top - 4}" x2="{x:.2f}" y2="{bottom:.2f}" stroke="{GRID_COLOUR}" stroke-width="1"/>')
        g.text(x, bottom + 14, f"{k * step_ms:.{decimals}f}", size=10, anchor="middle", fill=AXIS_COLOUR)
    g.text(left - 8, bottom + 14, "ms", size=10, anchor="end", fill=AXIS_COLOUR)
    g.parts.extend(bodies)
    lx = left
    for cat in sorted(present):
        name, fill = CATEGORY_STYLE[cat]
        g.add(g.rect(lx, 10, 14, 11, fill, ' stroke="#5f6368" stroke-width="0.3"'))
        g.text(lx + 19, 20, name, size=10)
        lx += 19 + 5.6 * len(name) + 16
    g.text(left, 36, "thin rows: communication · white: idle", size=9.5, fill=AXIS_COLOUR)
    return g.document(left + plot_w + 20, bottom + 28, title, {"chart": "trace-gantt", "rows": len(rows)})


def stacked_bars(items: Sequence[tuple[str, dict[str, float]]], title: str, plot_w: float = 720.0) -> str:
    """One horizontal bar per ``(label, {part: seconds})``; parts in :data:`PART_COLOURS` order."""
    left, top, bar_h, gap = 130.0, 40.0, 16.0, 6.0
    biggest = max((sum(p.values()) for _, p in items), default=0.0) or 1.0
    step = nice_step(biggest * 1e3, 8)
    px = plot_w / (biggest * 1e3)
    g = _Svg()
    lx = left
    for part, fill in PART_COLOURS.items():
        g.add(g.rect(lx, 10, 14, 11, fill, ' stroke="#5f6368" stroke-width="0.5"'))
        g.text(lx + 19, 20, part, size=10)
        lx += 19 + 5.6 * len(part) + 16
    y = top
    for label, parts in items:
        g.text(left - 8, y + 12, label, size=10.5, anchor="end", fill=TEXT_COLOUR)
        x = left
        for part, fill in PART_COLOURS.items():
            v = parts.get(part, 0.0)
            if v <= 0:
                continue
            w = v * 1e3 * px
            g.item(f"{label}: {part} {fmt_s(v)}", g.rect(x, y, w, bar_h, fill, ' stroke="#5f6368" stroke-width="0.4"'))
            x += w
        y += bar_h + gap
    bottom = y
    for k in range(int(math.floor(biggest * 1e3 / step + 1e-9)) + 1):
        x = left + k * step * px
        g.add(f'<line x1="{x:.2f}" y1="{top - 4}" x2="{x:.2f}" y2="{bottom:.2f}" stroke="{GRID_COLOUR}" stroke-width="0.8"/>')
        g.text(x, bottom + 14, f"{k * step:g}", size=10, anchor="middle", fill=AXIS_COLOUR)
    g.text(left - 8, bottom + 14, "ms", size=10, anchor="end", fill=AXIS_COLOUR)
    return g.document(left + plot_w + 30, bottom + 26, title, {"chart": "trace-bars", "bars": len(items)})
