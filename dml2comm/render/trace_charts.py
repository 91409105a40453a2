"""Static SVG drawings of measured traces (pure: data in, SVG text out).

- :func:`pipeline_gantt`: one row per rank of a pipeline group on the global clock (the ranks'
  ``baseTimeNanoseconds`` + ``ts``), a compute row and a thin communication row each; white
  gaps in the compute rows are idle time, so pipeline bubbles show as a staircase.
  Micro-batch segments (``F1``, ``B1``, ...) are labelled on the compute rows where they are
  wide enough.  The same drawing shows one model replica (its tp x cp x pp ranks).
- :func:`stacked_bars`: one horizontal bar per item (a micro-batch segment) split into the named
  parts of :data:`PART_COLOURS`, which partition its time.
- :func:`replica_bars`: the ranks grouped by model replica, each with its mean step split into
  those parts (thick bar) and its communication by parallel dimension (thin bar under it).

Every string from a trace passes through :func:`dml2comm.render.charts.xml_text`; the helpers
(``Svg``, ``nice_step``) are the site's own chart helpers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from dml2comm.render.charts import AXIS_COLOUR, GRID_COLOUR, TEXT_COLOUR, Svg, nice_step, xml_text
from dml2comm.fmt import fmt_s
from dml2comm.traces.classify import DIMS, Activity, Category

__all__ = ["CATEGORY_STYLE", "GanttInput", "pipeline_gantt", "stacked_bars", "replica_bars", "ReplicaRow", "PART_COLOURS",
           "DIM_COLOURS"]

#: Category -> (legend label, fill)
CATEGORY_STYLE: dict[int, tuple[str, str]] = {
    Category.FORWARD: ("forward", "#fdae61"),
    Category.BACKWARD: ("backward", "#d95f02"),
    Category.RECOMPUTE: ("recomputation", "#fee08b"),
    Category.OPTIMIZER: ("optimizer", "#8e7cc3"),
    Category.COMM_TP: ("tp comm", "#1b9e77"),
    Category.COMM_DP: ("dp comm", "#08519c"),
    Category.COMM_PP: ("pp comm", "#6baed6"),
    Category.COMM_CP: ("cp comm", "#66a61e"),
    Category.COMM_EP: ("ep comm", "#e7298a"),
    Category.COMM_OTHER: ("other comm", "#9aa0a6"),
    Category.MEMCPY: ("memcpy", "#bab0ac"),
    Category.MEMSET: ("memset", "#d9d9d9"),
}
_COMM = {Category.COMM_TP, Category.COMM_DP, Category.COMM_PP, Category.COMM_CP, Category.COMM_EP, Category.COMM_OTHER}
_COMPUTE = {Category.FORWARD, Category.BACKWARD, Category.RECOMPUTE}

#: The parts of a bar, which partition its time: compute with no communication beside it, compute
#: and communication together (overlapped communication), communication alone (exposed), copies
#: alone, nothing (idle).
PART_COLOURS = {"compute": "#d95f02", "compute + communication": "#6baed6", "exposed communication": "#08519c",
                "copies only": "#bab0ac", "idle": "#ffffff"}
#: Communication dimension (``comm_s`` key) -> fill, as in the Gantt charts.
DIM_COLOURS = {dim: CATEGORY_STYLE[cat][1] for dim, cat in DIMS.items()}


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


def _label_width(labels: Sequence[str], size: float) -> float:
    """Room for right-aligned labels of ``size`` px (an average glyph is ~0.6 em)."""
    return max((len(t) for t in labels), default=0) * size * 0.6 + 16


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
    left, top, main_h, thin_h, gap = max(110.0, _label_width([r.label for r in rows], 11)), 44.0, 20.0, 8.0, 8.0
    px = plot_w / span
    tol = span / plot_w * 0.75  # closer than ~1 px: one rectangle
    g = Svg()
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
        # micro-batch segments: the label over the extent of the segment's compute kernels
        labels = act.segments[r.step] if r.step < len(act.segments) else []
        compute = sel & np.isin(act.category, list(_COMPUTE))
        for j, label in enumerate(labels):
            m = compute & (act.segment == j)
            if not m.any():
                continue
            a, b = float(act.start[m].min()), float(act.end[m].max())
            if (b - a) * px >= 7 * len(label) + 4:
                bodies.append(f'<text x="{left + ((a + b) / 2 - t0) * px:.2f}" y="{y + 14:.2f}" font-size="9.5" text-anchor="middle" '
                              f'fill="#202124" pointer-events="none">{xml_text(label)}</text>')
        y += main_h + thin_h + 4 + gap
    bottom = y
    step_ms = nice_step(span / 1e3, 10)
    decimals = next((d for d in range(7) if abs(round(step_ms, d) - step_ms) < step_ms * 1e-6), 6)
    for k in range(int(math.floor(span / 1e3 / step_ms + 1e-9)) + 1):
        x = left + k * step_ms * 1e3 * px
        g.add(f'<line x1="{x:.2f}" y1="{top - 4}" x2="{x:.2f}" y2="{bottom:.2f}" stroke="{GRID_COLOUR}" stroke-width="1"/>')
        g.text(x, bottom + 14, f"{k * step_ms:.{decimals}f}", size=10, anchor="middle", fill=AXIS_COLOUR)
    g.text(left - 16, bottom + 14, "ms", size=10, anchor="end", fill=AXIS_COLOUR)
    g.parts.extend(bodies)
    lx = left
    for cat in sorted(present):
        name, fill = CATEGORY_STYLE[cat]
        g.add(g.rect(lx, 10, 14, 11, fill, ' stroke="#5f6368" stroke-width="0.3"'))
        g.text(lx + 19, 20, name, size=10)
        lx += 19 + 5.6 * len(name) + 16
    g.text(left, 36, "thin rows: communication · white: idle · F1, B1: micro-batch segments", size=9.5, fill=AXIS_COLOUR)
    return g.document(left + plot_w + 20, bottom + 28, title, {"chart": "trace-gantt", "rows": len(rows)})


_OUTLINE = ' stroke="#5f6368" stroke-width="0.4"'


@dataclass(frozen=True)
class ReplicaRow:
    """One rank in :func:`replica_bars`: its mean step split into :data:`PART_COLOURS` parts, and
    its communication per dimension (:data:`DIM_COLOURS`), seconds."""

    label: str
    parts: dict[str, float]
    comm: dict[str, float]


def replica_bars(replicas: Sequence[tuple[str, Sequence[ReplicaRow]]], title: str, note: str = "", plot_w: float = 720.0) -> str:
    """The ranks grouped by model replica: a header per replica, then per rank a thick bar (time
    breakdown of its mean step) and a thin bar under it (its communication by dimension, each
    dimension's own busy time, so the thin bar can be longer than the communication in the thick
    one when dimensions overlap each other)."""
    labels = [row.label for _, rows in replicas for row in rows]
    left, top, bar_h, thin_h, gap, head_h = max(130.0, _label_width(labels, 10.5)), 58.0, 14.0, 6.0, 5.0, 18.0
    biggest = max((max(sum(r.parts.values()), sum(r.comm.values())) for _, rows in replicas for r in rows), default=0.0) or 1.0
    step = nice_step(biggest * 1e3, 8)
    px = plot_w / (biggest * 1e3)
    g = Svg()
    _legend(g, left, 10, 11, {part: fill for part, fill in PART_COLOURS.items()})
    _legend(g, left, 29, 7, {f"{dim} comm": fill for dim, fill in DIM_COLOURS.items()})
    if note:
        g.text(left, 50, note, size=9.5, fill=AXIS_COLOUR)
    y = top
    bodies: list[str] = []
    for header, rows in replicas:
        g.text(8, y + 12, header, size=11, fill=TEXT_COLOUR, weight="bold")
        y += head_h
        for row in rows:
            g.text(left - 8, y + 11, row.label, size=10.5, anchor="end", fill=TEXT_COLOUR)
            for (parts, colours, yy, h) in ((row.parts, PART_COLOURS, y, bar_h), (row.comm, DIM_COLOURS, y + bar_h + 1, thin_h)):
                x = left
                for key, fill in colours.items():
                    v = parts.get(key, 0.0)
                    if v <= 0:
                        continue
                    w = v * 1e3 * px
                    tip = f"{row.label}: {key if colours is PART_COLOURS else key + ' comm'} {fmt_s(v)}"
                    bodies.append(f'<g class="d2c-item"><title>{xml_text(tip)}</title>'
                                  f'{g.rect(x, yy, w, h, fill, _OUTLINE)}</g>')
                    x += w
            y += bar_h + thin_h + 1 + gap
        y += 4
    bottom = y
    _ms_axis(g, left, top, bottom, biggest, step, px)
    g.parts.extend(bodies)
    return g.document(left + plot_w + 30, bottom + 26, title, {"chart": "trace-replicas", "replicas": len(replicas), "bars": len(labels)})


def _legend(g: "Svg", left: float, y: float, h: float, entries: dict[str, str]) -> None:
    """One legend row: a swatch of height ``h`` and the label for each ``{label: colour}``."""
    lx = left
    for label, fill in entries.items():
        g.add(g.rect(lx, y, 14, h, fill, ' stroke="#5f6368" stroke-width="0.5"'))
        g.text(lx + 19, y + 10 if h > 8 else y + 7, label, size=10)
        lx += 19 + 5.6 * len(label) + 16


def _ms_axis(g: "Svg", left: float, top: float, bottom: float, biggest: float, step: float, px: float) -> None:
    """Vertical grid lines every ``step`` ms and their labels under the bars."""
    for k in range(int(math.floor(biggest * 1e3 / step + 1e-9)) + 1):
        x = left + k * step * px
        g.add(f'<line x1="{x:.2f}" y1="{top - 4}" x2="{x:.2f}" y2="{bottom:.2f}" stroke="{GRID_COLOUR}" stroke-width="0.8"/>')
        g.text(x, bottom + 14, f"{k * step:g}", size=10, anchor="middle", fill=AXIS_COLOUR)
    g.text(left - 16, bottom + 14, "ms", size=10, anchor="end", fill=AXIS_COLOUR)


def stacked_bars(items: Sequence[tuple[str, dict[str, float]]], title: str, plot_w: float = 720.0) -> str:
    """One horizontal bar per ``(label, {part: seconds})``; parts in :data:`PART_COLOURS` order."""
    left, top, bar_h, gap = 130.0, 40.0, 16.0, 6.0
    biggest = max((sum(p.values()) for _, p in items), default=0.0) or 1.0
    step = nice_step(biggest * 1e3, 8)
    px = plot_w / (biggest * 1e3)
    g = Svg()
    _legend(g, left, 10, 11, dict(PART_COLOURS))
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
    _ms_axis(g, left, top, bottom, biggest, step, px)
    return g.document(left + plot_w + 30, bottom + 26, title, {"chart": "trace-bars", "bars": len(items)})
