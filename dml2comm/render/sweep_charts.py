"""Static SVG charts of many configurations: the comparison page of ``sweep`` and ``compare``.

Pure functions, data in and SVG text out (the conventions of :mod:`dml2comm.render.charts`:
every string through :func:`~dml2comm.render.charts.xml_text`, hoverable ``<g class="d2c-item">``
elements with a ``<title>`` tooltip, width/height in pt and a viewBox in px).

- :func:`breakdown_chart`: one horizontal stacked bar per configuration, its iteration time
  split into compute, pipeline bubble, exposed communication and optimizer step
  (``<rect class="d2c-seg" data-row=".." data-part=".." data-seconds="..">``);
- :func:`memory_bars_chart`: peak memory per GPU per configuration against the GPU's capacity
  (``<line class="d2c-capacity">``), bars above it outlined in red; the axis ends at
  :data:`MEMORY_AXIS_CLIP` times the capacity, longer bars broken there (``data-clipped``) and
  labelled with their peak, so that one configuration far over does not squash the others;
- :func:`pareto_chart`: every evaluated configuration as a point (peak memory, iteration
  time), the Pareto front joined by a line, the best one ringed;
- :func:`efficiency_chart`: parallel efficiency against the GPU count (log scale) of a scaling
  study, the threshold dashed, the breakdown point in red.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

from dml2comm.render.charts import AXIS_COLOUR, CAPACITY_COLOUR, GRID_COLOUR, OVER_COLOUR, TEXT_COLOUR, Svg, nice_step, svg_number, xml_text
from dml2comm.search.scaling import ScalingMode
from dml2comm.fmt import fmt_bytes, fmt_s

__all__ = ["BREAKDOWN_COLOURS", "BreakdownBar", "breakdown_chart", "MemoryItem", "memory_bars_chart", "ParetoPoint", "pareto_chart",
           "EfficiencyPoint", "efficiency_chart", "MAX_POINTS", "MEMORY_AXIS_CLIP"]

#: part key -> (legend label, fill); the order is the stacking order.
BREAKDOWN_COLOURS: Mapping[str, tuple[str, str]] = {
    "compute_time_s": ("compute", "#f28e2b"),
    "bubble_time_s": ("pipeline bubble", "#bab0ac"),
    "exposed_comm_time_s": ("exposed communication", "#4e79a7"),
    "optimizer_time_s": ("optimizer step", "#8e7cc3"),
    "other": ("other", "#9aa0a6"),
}
BEST_COLOUR = "#188038"
#: At most this many points in the Pareto chart (the front and the best always drawn).
MAX_POINTS = 4000
#: The memory bars' axis ends at this multiple of the GPU's capacity: a bar past it is broken
#: (it does not fit by far; its label gives the peak), and the bars near the capacity, the ones a
#: choice hangs on, keep two thirds of the width.
MEMORY_AXIS_CLIP = 1.5
_BOLD = ' font-weight="bold"'


def _time_unit(top_s: float) -> tuple[float, str]:
    if top_s >= 1:
        return 1.0, "s"
    if top_s >= 1e-3:
        return 1e3, "ms"
    return 1e6, "µs"


def _ticks(top: float, target: int = 6) -> tuple[float, list[float]]:
    step = nice_step(top, target)
    n = int(math.ceil(top / step - 1e-9)) if top > 0 else 1
    return step, [k * step for k in range(max(n, 1) + 1)]


def _fmt_tick(v: float, step: float) -> str:
    decimals = next((d for d in range(7) if abs(round(step, d) - step) < step * 1e-6), 6)
    return f"{v:.{decimals}f}"


def _legend_row(g: Svg, x: float, y: float, items: Sequence[tuple[str, str]]) -> float:
    for name, fill in items:
        g.add(g.rect(x, y - 9, 14, 11, fill, ' class="d2c-legend-swatch"'))
        g.text(x + 19, y, name, size=10)
        x += 19 + 5.6 * len(name) + 18
    return x


# ---------------------------------------------------------------------------------------------
# Iteration time breakdown
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BreakdownBar:
    label: str  # left of the bar (a configuration, "8 GPUs", ...)
    parts: Mapping[str, float]  # seconds per key of BREAKDOWN_COLOURS
    total_s: float
    best: bool = False
    over: bool = False  # does not fit in memory
    tip: str = ""


def breakdown_chart(bars: Sequence[BreakdownBar], title: str = "Iteration time by part, per configuration",
                    label_w: float = 345.0) -> str:
    """Horizontal stacked bars of seconds (a shared time axis), the total at each bar's end."""
    top_s = max([b.total_s for b in bars] + [1e-9])
    scale_u, unit = _time_unit(top_s)
    step, ticks = _ticks(top_s * scale_u * 1.02)
    left, top, plot_w, row_h, bar_h = label_w, 40.0, 560.0, 26.0, 17.0
    end_u = ticks[-1]
    px = plot_w / end_u  # px per unit
    height = top + row_h * max(len(bars), 1) + 48
    width = left + plot_w + 110
    g = Svg()
    used = [k for k in BREAKDOWN_COLOURS if any(b.parts.get(k, 0) > 0 for b in bars)]
    _legend_row(g, left, 18, [BREAKDOWN_COLOURS[k] for k in used])
    base = top + row_h * len(bars)
    for t in ticks:
        x = left + t * px
        g.add(f'<line x1="{svg_number(x)}" y1="{svg_number(top - 6)}" x2="{svg_number(x)}" y2="{svg_number(base + 2)}" stroke="{GRID_COLOUR}" stroke-width="1"/>')
        g.text(x, base + 16, _fmt_tick(t, step), size=10, anchor="middle", fill=AXIS_COLOUR)
    g.text(left + plot_w / 2, base + 34, f"iteration time ({unit})", size=11, anchor="middle", fill=AXIS_COLOUR)
    for i, b in enumerate(bars):
        y = top + i * row_h + (row_h - bar_h) / 2
        colour = OVER_COLOUR if b.over else (BEST_COLOUR if b.best else TEXT_COLOUR)
        label = b.label if len(b.label) <= 58 else b.label[:57] + "…"
        g.item(b.tip or b.label, f'<text class="d2c-row-label" x="{svg_number(left - 8)}" y="{svg_number(y + bar_h - 4)}" font-size="10.5" '
                                 f'text-anchor="end" fill="{colour}"{_BOLD if b.best else ""}>{xml_text(label)}</text>')
        x = left
        for k in BREAKDOWN_COLOURS:
            v = b.parts.get(k, 0.0) or 0.0
            if v <= 0:
                continue
            w = v * scale_u * px
            name, fill = BREAKDOWN_COLOURS[k]
            share = f" ({v / b.total_s:.0%} of {fmt_s(b.total_s)})" if b.total_s else ""
            g.item(f"{b.label}\n{name}: {fmt_s(v)}{share}",
                   g.rect(x, y, max(w, 0.5), bar_h, fill, f' class="d2c-seg" data-row="{i}" data-part="{k.removesuffix("_time_s")}" '
                                                         f'data-seconds="{v:.17g}"'))
            x += w
        if b.over:
            g.add(g.rect(left - 1, y - 1.5, x - left + 2, bar_h + 3, "none", f' class="d2c-over" stroke="{OVER_COLOUR}" stroke-width="2"'))
        g.text(x + 6, y + bar_h - 4, fmt_s(b.total_s) + ("  best" if b.best else "") + ("  over memory" if b.over else ""),
               size=10, fill=colour, weight="bold" if b.best or b.over else None)
    g.add(f'<line class="d2c-time-axis" x1="{svg_number(left)}" y1="{svg_number(base + 2)}" x2="{svg_number(left + plot_w)}" y2="{svg_number(base + 2)}" '
          f'stroke="{AXIS_COLOUR}" stroke-width="1" data-span="{end_u / scale_u:.17g}"/>')
    return g.document(width, height, title, {"chart": "breakdown", "bars": len(bars)})


# ---------------------------------------------------------------------------------------------
# Memory per configuration
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryItem:
    label: str
    peak_bytes: float
    best: bool = False
    tip: str = ""


def memory_bars_chart(items: Sequence[MemoryItem], capacity_bytes: float, capacity_label: str = "",
                      title: str = "Peak memory per GPU, per configuration", label_w: float = 345.0) -> str:
    """Horizontal bars of the peak bytes per GPU on a GiB axis and the capacity as a dashed line."""
    tallest = max([it.peak_bytes for it in items] + [1.0])
    # a GPU far larger than every configuration would flatten the bars: the capacity is then
    # drawn at the right end of the axis, marked off scale (as the single-configuration chart does)
    broken = capacity_bytes > 2 * tallest
    # one configuration far over the capacity would squash the rest: the axis then ends at
    # MEMORY_AXIS_CLIP x the capacity and longer bars are broken there (said under the axis)
    clip = MEMORY_AXIS_CLIP * capacity_bytes if not broken and tallest > MEMORY_AXIS_CLIP * capacity_bytes else None
    left, top, plot_w, row_h, bar_h = label_w, 48.0, 560.0, 26.0, 17.0
    if clip:  # the axis ends at the clip itself, not at the next tick
        step, ticks = _ticks(clip / 2**30)
        ticks = [t for t in ticks if t * 2**30 <= clip * (1 + 1e-9)]
        px = plot_w / clip  # px per byte
    else:
        step, ticks = _ticks((tallest if broken else max(tallest, capacity_bytes)) / 2**30 * 1.04)
        px = plot_w / (ticks[-1] * 2**30)
    base = top + row_h * len(items)
    width = left + plot_w + 110
    height = base + (66 if clip else 48)
    clipped = 0
    g = Svg()
    _legend_row(g, left, 18, [("fits", "#59a14f"), ("does not fit", OVER_COLOUR)])
    for t in ticks:
        x = left + t * 2**30 * px
        g.add(f'<line x1="{svg_number(x)}" y1="{svg_number(top - 6)}" x2="{svg_number(x)}" y2="{svg_number(base + 2)}" stroke="{GRID_COLOUR}" stroke-width="1"/>')
        g.text(x, base + 16, _fmt_tick(t, step), size=10, anchor="middle", fill=AXIS_COLOUR)
    g.text(left + plot_w / 2, base + 34, "GiB per GPU (the busiest stage)", size=11, anchor="middle", fill=AXIS_COLOUR)
    for i, it in enumerate(items):
        y = top + i * row_h + (row_h - bar_h) / 2
        over = it.peak_bytes > capacity_bytes
        colour = OVER_COLOUR if over else (BEST_COLOUR if it.best else TEXT_COLOUR)
        label = it.label if len(it.label) <= 58 else it.label[:57] + "…"
        status = (f"over by {fmt_bytes(it.peak_bytes - capacity_bytes)}" if over
                  else f"{fmt_bytes(capacity_bytes - it.peak_bytes)} free")
        tip = f"{it.label}\npeak {fmt_bytes(it.peak_bytes)} of {fmt_bytes(capacity_bytes)}: {status}" + (f"\n{it.tip}" if it.tip else "")
        g.item(tip, f'<text class="d2c-row-label" x="{svg_number(left - 8)}" y="{svg_number(y + bar_h - 4)}" font-size="10.5" text-anchor="end" '
                    f'fill="{colour}"{_BOLD if it.best else ""}>{xml_text(label)}</text>')
        cut = clip is not None and it.peak_bytes > clip
        clipped += cut
        w = (clip if cut else it.peak_bytes) * px
        g.item(tip, g.rect(left, y, max(w, 0.5), bar_h, OVER_COLOUR if over else "#59a14f",
                           f' class="d2c-mem" data-row="{i}" data-bytes="{it.peak_bytes:.17g}"'
                           + (' data-clipped="true"' if cut else "") + (' fill-opacity="0.85"' if over else "")))
        if cut:  # a white double slash across the bar's end: the bar goes on
            for dx in (-12, -6):
                g.add(f'<line x1="{svg_number(left + w + dx - 3)}" y1="{svg_number(y + bar_h + 2)}" x2="{svg_number(left + w + dx + 3)}" '
                      f'y2="{svg_number(y - 2)}" stroke="#ffffff" stroke-width="2.5"/>')
        g.text(left + w + 6, y + bar_h - 4, fmt_bytes(it.peak_bytes) + (" over" if over else ""), size=10, fill=colour,
               weight="bold" if over else None)
    xc = left + plot_w + 14 if broken else left + capacity_bytes * px
    cap = f"GPU capacity {fmt_bytes(capacity_bytes)}" + (f" ({capacity_label})" if capacity_label else "")
    shown = cap + (f", off scale: {capacity_bytes / tallest:.0f}× the largest peak" if broken else "")
    g.item(shown, f'<line class="d2c-capacity" x1="{svg_number(xc)}" y1="{svg_number(top - 8)}" x2="{svg_number(xc)}" y2="{svg_number(base + 2)}" stroke="{CAPACITY_COLOUR}" '
                  f'stroke-width="2" stroke-dasharray="7 4" data-bytes="{capacity_bytes:.17g}" data-broken="{str(broken).lower()}"/>'
                  f'<text x="{svg_number(xc + 4 if broken else xc - 4)}" y="{svg_number(top - 12)}" font-size="10" text-anchor="end" '
                  f'fill="{CAPACITY_COLOUR}" font-weight="bold">{xml_text(shown)}</text>')
    if broken:  # two short slashes on the axis mark the break
        for dx in (0, 6):
            g.add(f'<line x1="{svg_number(left + plot_w + 2 + dx)}" y1="{svg_number(base + 8)}" x2="{svg_number(left + plot_w + 6 + dx)}" y2="{svg_number(base - 4)}" '
                  f'stroke="{AXIS_COLOUR}" stroke-width="1.2"/>')
    g.add(f'<line class="d2c-base" x1="{svg_number(left)}" y1="{svg_number(base + 2)}" x2="{svg_number(left + plot_w)}" y2="{svg_number(base + 2)}" '
          f'stroke="{AXIS_COLOUR}" stroke-width="1"/>')
    if clipped:
        g.text(left + plot_w / 2, base + 54, f"axis cut at {MEMORY_AXIS_CLIP:g}× the GPU capacity ({fmt_bytes(clip)}): "
               f"{clipped} longer bar{'s' if clipped > 1 else ''} broken (//), labelled with the peak", size=10.5, anchor="middle",
               fill=CAPACITY_COLOUR, weight="bold", cls="d2c-clip-note")
    return g.document(width, height, title, {"chart": "memory-per-config", "bars": len(items)})


# ---------------------------------------------------------------------------------------------
# Pareto scatter: iteration time vs peak memory
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ParetoPoint:
    memory_bytes: float
    time_s: float
    fits: bool
    front: bool = False
    best: bool = False
    tip: str = ""


def pareto_chart(points: Sequence[ParetoPoint], capacity_bytes: float | None = None,
                 title: str = "Iteration time against peak memory per GPU", max_points: int = MAX_POINTS) -> str:
    """Every configuration as a dot (``<circle class="d2c-pt" data-front=".." data-fits="..">``);
    the front joined in order of memory; beyond ``max_points`` the dots off the front are thinned
    evenly (said on the chart)."""
    keep = [p for p in points if p.front or p.best]
    rest = [p for p in points if not (p.front or p.best)]
    note = ""
    if len(keep) + len(rest) > max_points:
        room = max(max_points - len(keep), 0)
        stride = len(rest) / room if room else float("inf")
        thinned = [rest[int(k * stride)] for k in range(room)] if room else []
        note = f"{len(thinned)} of the {len(rest)} configurations off the front are drawn (every {stride:.1f}th)"
        rest = thinned
    shown = rest + keep  # the front on top
    tallest = max([p.memory_bytes for p in points] + [1.0])
    broken = bool(capacity_bytes) and capacity_bytes > 2 * tallest  # capacity far off: not on the axis (said on the chart)
    xs = [p.memory_bytes for p in points] + ([capacity_bytes] if capacity_bytes and not broken else [])
    ys = [p.time_s for p in points]
    x_top = max(xs + [1.0]) / 2**30 * 1.05
    y_top_s = max(ys + [1e-9])
    scale_u, unit = _time_unit(y_top_s)
    xstep, xticks = _ticks(x_top, 7)
    ystep, yticks = _ticks(y_top_s * scale_u * 1.05, 6)
    left, top, plot_w, plot_h = 70.0, 40.0, 620.0, 340.0
    base = top + plot_h
    xpx = plot_w / xticks[-1]
    ypx = plot_h / yticks[-1]

    def pos(p: ParetoPoint) -> tuple[float, float]:
        return left + p.memory_bytes / 2**30 * xpx, base - p.time_s * scale_u * ypx

    g = Svg()
    x = _legend_row(g, left, 18, [("fits", "#76b7b2"), ("does not fit", "#f4a6a6"), ("Pareto front", "#1a73e8")])
    g.add(f'<circle cx="{svg_number(x + 6)}" cy="{svg_number(14)}" r="6" fill="none" stroke="{BEST_COLOUR}" stroke-width="2.5"/>')
    g.text(x + 17, 18, "best (fastest that fits)", size=10)
    for t in xticks:
        xx = left + t * xpx
        g.add(f'<line x1="{svg_number(xx)}" y1="{svg_number(top)}" x2="{svg_number(xx)}" y2="{svg_number(base)}" stroke="{GRID_COLOUR}" stroke-width="1"/>')
        g.text(xx, base + 16, _fmt_tick(t, xstep), size=10, anchor="middle", fill=AXIS_COLOUR)
    for t in yticks:
        yy = base - t * ypx
        g.add(f'<line x1="{svg_number(left)}" y1="{svg_number(yy)}" x2="{svg_number(left + plot_w)}" y2="{svg_number(yy)}" stroke="{GRID_COLOUR}" stroke-width="1"/>')
        g.text(left - 8, yy + 4, _fmt_tick(t, ystep), size=10, anchor="end", fill=AXIS_COLOUR)
    g.add(f'<line class="d2c-base" x1="{svg_number(left)}" y1="{svg_number(base)}" x2="{svg_number(left + plot_w)}" y2="{svg_number(base)}" stroke="{AXIS_COLOUR}"/>')
    g.add(f'<line x1="{svg_number(left)}" y1="{svg_number(base)}" x2="{svg_number(left)}" y2="{svg_number(top)}" stroke="{AXIS_COLOUR}"/>')
    g.text(left + plot_w / 2, base + 34, "peak memory per GPU (GiB)", size=11, anchor="middle", fill=AXIS_COLOUR)
    g.text(18, top + plot_h / 2, f"iteration time ({unit})", size=11, anchor="middle", fill=AXIS_COLOUR,
           extra=f' transform="rotate(-90 18 {svg_number(top + plot_h / 2)})"')
    if broken:
        g.text(left + plot_w - 4, top + 14, f"GPU capacity {fmt_bytes(capacity_bytes)} is off scale to the right: "
               f"{capacity_bytes / tallest:.0f}× the largest peak", size=10, anchor="end", fill=CAPACITY_COLOUR, weight="bold",
               cls="d2c-capacity-note")
    elif capacity_bytes:
        xc = left + capacity_bytes / 2**30 * xpx
        g.item(f"GPU capacity {fmt_bytes(capacity_bytes)}: configurations to the right do not fit",
               f'<line class="d2c-capacity" x1="{svg_number(xc)}" y1="{svg_number(top)}" x2="{svg_number(xc)}" y2="{svg_number(base)}" stroke="{CAPACITY_COLOUR}" '
               f'stroke-width="2" stroke-dasharray="7 4" data-bytes="{capacity_bytes:.17g}"/>'
               f'<text x="{svg_number(xc - 4)}" y="{svg_number(top + 12)}" font-size="10" text-anchor="end" fill="{CAPACITY_COLOUR}" '
               f'font-weight="bold">{xml_text(f"GPU capacity {fmt_bytes(capacity_bytes)}")}</text>')
    front = sorted((p for p in points if p.front), key=lambda p: p.memory_bytes)
    if len(front) > 1:
        path = " ".join(f"{svg_number(a)},{svg_number(b)}" for a, b in map(pos, front))
        g.add(f'<polyline class="d2c-front" points="{path}" fill="none" stroke="#1a73e8" stroke-width="1.5"/>')
    for p in shown:
        cx, cy = pos(p)
        fill = "#1a73e8" if p.front else ("#76b7b2" if p.fits else "#f4a6a6")
        r = 4.5 if p.front else 3.2
        tip = p.tip or f"{fmt_s(p.time_s)}, {fmt_bytes(p.memory_bytes)}"
        body = (f'<circle class="d2c-pt" cx="{svg_number(cx)}" cy="{svg_number(cy)}" r="{r}" fill="{fill}" fill-opacity="{1 if p.front else 0.75}" '
                f'data-front="{str(p.front).lower()}" data-fits="{str(p.fits).lower()}"/>')
        if p.best:
            body += f'<circle class="d2c-best" cx="{svg_number(cx)}" cy="{svg_number(cy)}" r="8" fill="none" stroke="{BEST_COLOUR}" stroke-width="2.5"/>'
        g.item(tip, body)
    height = base + (62 if note else 46)
    if note:
        g.text(left, base + 54, f"Simplified drawing: {note}.", size=10, fill=AXIS_COLOUR, cls="d2c-chart-note")
    return g.document(left + plot_w + 30, height, title, {"chart": "pareto", "points": len(shown)})


# ---------------------------------------------------------------------------------------------
# Scaling: efficiency against GPU count
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EfficiencyPoint:
    gpus: int
    efficiency: float | None  # None: no configuration (drawn as a cross on the axis)
    speedup: float | None = None
    broken: bool = False  # the breakdown point
    tip: str = ""


def efficiency_chart(points: Sequence[EfficiencyPoint], threshold: float, title: str = "Parallel efficiency against GPU count",
                     mode: ScalingMode | str = ScalingMode.STRONG) -> str:
    """Efficiency (0 to max(1.05, highest)) on a log2 GPU axis; the threshold as a dashed line;
    points below it red; the breakdown point labelled; counts without a result as a red ×."""
    counts = [p.gpus for p in points]
    lo, hi = math.log2(min(counts)), math.log2(max(counts))
    span = hi - lo or 1.0
    left, top, plot_w, plot_h = 70.0, 40.0, 560.0, 280.0
    base = top + plot_h
    y_top = max([1.05] + [(p.efficiency or 0) * 1.05 for p in points])
    ystep, yticks = _ticks(y_top, 6)

    def px(n: int) -> float:
        return left + 20 + (math.log2(n) - lo) / span * (plot_w - 40)

    def py(e: float) -> float:
        return base - e / yticks[-1] * plot_h

    g = Svg()
    x = _legend_row(g, left, 18, [("parallel efficiency", "#1a73e8"), ("below the threshold", OVER_COLOUR)])
    g.add(f'<line x1="{svg_number(x)}" y1="{svg_number(14)}" x2="{svg_number(x + 18)}" y2="{svg_number(14)}" stroke="{CAPACITY_COLOUR}" stroke-width="2" '
          f'stroke-dasharray="5 3"/>')
    g.text(x + 24, 18, f"threshold {threshold:.0%}", size=10)
    for t in yticks:
        y = py(t)
        g.add(f'<line x1="{svg_number(left)}" y1="{svg_number(y)}" x2="{svg_number(left + plot_w)}" y2="{svg_number(y)}" stroke="{GRID_COLOUR}" stroke-width="1"/>')
        g.text(left - 8, y + 4, f"{t:.0%}", size=10, anchor="end", fill=AXIS_COLOUR)
    for n in counts:
        g.add(f'<line x1="{svg_number(px(n))}" y1="{svg_number(top)}" x2="{svg_number(px(n))}" y2="{svg_number(base)}" stroke="{GRID_COLOUR}" stroke-width="1"/>')
        g.text(px(n), base + 16, str(n), size=10, anchor="middle", fill=AXIS_COLOUR)
    g.add(f'<line class="d2c-base" x1="{svg_number(left)}" y1="{svg_number(base)}" x2="{svg_number(left + plot_w)}" y2="{svg_number(base)}" stroke="{AXIS_COLOUR}"/>')
    g.add(f'<line x1="{svg_number(left)}" y1="{svg_number(base)}" x2="{svg_number(left)}" y2="{svg_number(top)}" stroke="{AXIS_COLOUR}"/>')
    g.text(left + plot_w / 2, base + 34, "GPUs (log scale)", size=11, anchor="middle", fill=AXIS_COLOUR)
    what = "T1·N1 / (TN·N)" if ScalingMode.of(mode) is ScalingMode.STRONG else "T1 / TN"
    g.text(18, top + plot_h / 2, f"efficiency {what}", size=11, anchor="middle", fill=AXIS_COLOUR,
           extra=f' transform="rotate(-90 18 {svg_number(top + plot_h / 2)})"')
    yt = py(threshold)
    g.add(f'<line class="d2c-threshold" x1="{svg_number(left)}" y1="{svg_number(yt)}" x2="{svg_number(left + plot_w)}" y2="{svg_number(yt)}" stroke="{CAPACITY_COLOUR}" '
          f'stroke-width="1.5" stroke-dasharray="7 4" data-threshold="{threshold:.17g}"/>')
    ok = [p for p in points if p.efficiency is not None]
    if len(ok) > 1:
        g.add(f'<polyline points="{" ".join(f"{svg_number(px(p.gpus))},{svg_number(py(p.efficiency))}" for p in ok)}" fill="none" '
              f'stroke="#1a73e8" stroke-width="2"/>')
    for p in points:
        tip = p.tip or f"{p.gpus} GPUs"
        if p.efficiency is None:
            cx, cy = px(p.gpus), base - 8
            g.item(tip, f'<path class="d2c-eff-missing" d="M{svg_number(cx - 5)},{svg_number(cy - 5)} L{svg_number(cx + 5)},{svg_number(cy + 5)} M{svg_number(cx - 5)},'
                        f'{svg_number(cy + 5)} L{svg_number(cx + 5)},{svg_number(cy - 5)}" stroke="{OVER_COLOUR}" stroke-width="2.5" data-gpus="{p.gpus}"/>')
        else:
            below = p.efficiency < threshold
            cx, cy = px(p.gpus), py(p.efficiency)
            fill = OVER_COLOUR if below else "#1a73e8"
            g.item(tip, f'<circle class="d2c-eff" cx="{svg_number(cx)}" cy="{svg_number(cy)}" r="5" fill="{fill}" data-gpus="{p.gpus}" '
                        f'data-efficiency="{p.efficiency:.17g}"/>')
            g.text(cx, cy - 10, f"{p.efficiency:.0%}", size=10, anchor="middle", fill=fill, weight="bold" if below else None)
        if p.broken:
            g.text(px(p.gpus), top + 12, "breaks down here", size=10.5, anchor="middle", fill=OVER_COLOUR, weight="bold",
                   cls="d2c-breakdown-label")
            g.add(f'<line x1="{svg_number(px(p.gpus))}" y1="{svg_number(top + 16)}" x2="{svg_number(px(p.gpus))}" y2="{svg_number(base)}" stroke="{OVER_COLOUR}" '
                  f'stroke-width="1" stroke-dasharray="2 3"/>')
    return g.document(left + plot_w + 30, base + 46, title, {"chart": "efficiency", "points": len(points)})
