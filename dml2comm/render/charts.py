"""Static SVG charts written in Python: the memory bar chart and the timeline of one iteration.

The site's other drawings are graphs laid out by Graphviz; these two are plots, so they are
plain SVG text generated here -- no JavaScript charting library, nothing from the network.
Pure functions: data in, SVG text out, no I/O.

- :func:`memory_chart` draws one stacked bar per pipeline stage (weights, gradients, optimizer
  states, activations of the micro-batches in flight, communication buffers, transient
  workspace, framework), a dashed line at the GPU's capacity, and a red outline and a red label
  on every bar above it.
- :func:`gantt_chart` draws rows of boxes on a time axis in milliseconds (one compute row per
  stage and thin rows for its pipeline sends and data-parallel collectives).
  :func:`merge_boxes` keeps the number of rectangles under a budget.
- :func:`memory_chart_of` and :func:`timeline_chart_of` read an analysis (through
  :class:`~dml2comm.render.facts.Facts`) into those two.

Escaping: every piece of text (labels, tooltips) passes through :func:`xml_text` before it
reaches the SVG; numbers are formatted here.  Each hoverable element is a
``<g class="d2c-item">`` whose ``<title>`` is its tooltip (the site's ``panzoom.js`` shows it
in a styled box; without JavaScript the browser shows the title).

Sizes: the root element carries ``width``/``height`` in points and a ``viewBox`` in pixels
(1 pt = 4/3 px), as Graphviz writes them, so the site inlines both kinds of SVG the same way.
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from dml2comm.network.kinds import Phase
from dml2comm.parallel.config import Recompute
from dml2comm.render.facts import Facts
from dml2comm.sim.engine import Stream
from dml2comm.fmt import fmt_bytes, fmt_num, fmt_s, printable, rank_ranges

__all__ = [
    "Chart",
    "MemoryBar",
    "MEMORY_PARTS",
    "OVER_COLOUR",
    "memory_chart",
    "memory_chart_of",
    "GanttRow",
    "GanttBox",
    "GANTT_KINDS",
    "MAX_BOXES",
    "merge_boxes",
    "gantt_chart",
    "timeline_chart_of",
    "nice_step",
    "xml_text",
    "svg_number",
    "Svg",
]

FONT = "Helvetica, Arial, 'Liberation Sans', sans-serif"
#: Over-capacity accent, the same red as the outlines in the Graphviz drawings.
OVER_COLOUR = "#d50000"
CAPACITY_COLOUR = "#c5221f"
GRID_COLOUR = "#e8eaed"
AXIS_COLOUR = "#5f6368"
TEXT_COLOUR = "#3c4043"

def xml_text(text: object) -> str:
    """Escape ``text`` for SVG character data and attribute values: ``& < > " '`` become
    entities and control characters (forbidden in XML) become U+FFFD."""
    s = printable(text)
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;").replace("'", "&#39;")


def svg_number(x: float) -> str:
    """A coordinate or length as SVG text: two decimals, trailing zeros dropped (stable text,
    small files); ``-0`` is written ``0``."""
    s = f"{x:.2f}".rstrip("0").rstrip(".")
    return "0" if s in ("-0", "") else s


def nice_step(span: float, target: int) -> float:
    """The smallest tick step of 1, 2, 2.5 or 5 x 10^k that gives at most ``target`` ticks over ``span``."""
    if span <= 0 or not math.isfinite(span):
        return 1.0
    raw = span / max(target, 1)
    mag = 10 ** math.floor(math.log10(raw))
    for k in (1, 2, 2.5, 5, 10):
        if raw <= k * mag * (1 + 1e-9):
            return k * mag
    return 10 * mag


@dataclass(frozen=True)
class Chart:
    """One generated SVG: ``name`` is its file stem in ``svg_file/`` and its page key."""

    name: str
    title: str
    svg: str
    note: str = ""  # what was simplified, in words ("" when nothing)
    boxes: int = 0  # rectangles drawn (timeline)


class Svg:
    """An SVG document written piece by piece (text, rectangles, items with a tooltip; the site's charts and the
    sweep and trace charts); every string argument is escaped here (:func:`xml_text`)."""

    def __init__(self) -> None:
        self.parts: list[str] = []

    def add(self, text: str) -> None:
        self.parts.append(text)

    def text(self, x: float, y: float, content: object, size: float = 11, anchor: str = "start", fill: str = TEXT_COLOUR,
             weight: str | None = None, cls: str | None = None, extra: str = "") -> None:
        w = f' font-weight="{weight}"' if weight else ""
        c = f' class="{cls}"' if cls else ""
        self.parts.append(f'<text x="{svg_number(x)}" y="{svg_number(y)}" font-size="{svg_number(size)}" text-anchor="{anchor}" fill="{fill}"{w}{c}{extra}>'
                          f"{xml_text(content)}</text>")

    def rect(self, x: float, y: float, w: float, h: float, fill: str, extra: str = "") -> str:
        return f'<rect x="{svg_number(x)}" y="{svg_number(y)}" width="{svg_number(w)}" height="{svg_number(h)}" fill="{fill}"{extra}/>'

    def item(self, tip: str, body: str, extra: str = "") -> None:
        """A hoverable group: its ``<title>`` is the tooltip."""
        title = f"<title>{xml_text(tip)}</title>" if tip else ""
        self.parts.append(f'<g class="d2c-item"{extra}>{title}{body}</g>')

    def document(self, width: float, height: float, title: str, data: Mapping[str, object] = {}) -> str:
        attrs = "".join(f' data-{k}="{xml_text(v)}"' for k, v in data.items())
        head = (f'<svg width="{svg_number(width * 0.75)}pt" height="{svg_number(height * 0.75)}pt" viewBox="0 0 {svg_number(width)} {svg_number(height)}" '
                f'xmlns="http://www.w3.org/2000/svg" xmlns:xlink="http://www.w3.org/1999/xlink" font-family="{xml_text(FONT)}"{attrs}>')
        return "\n".join([head, f"<title>{xml_text(title)}</title>", *self.parts, "</svg>"]) + "\n"


# ---------------------------------------------------------------------------------------------
# Memory per GPU: one stacked bar per stage
# ---------------------------------------------------------------------------------------------

#: (key in ``StageInfo.memory``, legend label, fill).  Red is kept for "over capacity".
MEMORY_PARTS: tuple[tuple[str, str, str], ...] = (
    ("weights_bytes", "weights", "#4e79a7"),
    ("grads_bytes", "gradients", "#a0cbe8"),
    ("optimizer_bytes", "optimizer states", "#59a14f"),
    ("activations_bytes", "activations × micro-batches in flight", "#f28e2b"),
    ("buffers_bytes", "communication buffers", "#b07aa1"),
    ("transient_bytes", "transient (largest op's workspace)", "#edc948"),
)


@dataclass(frozen=True)
class MemoryBar:
    """One bar: a stage's bytes per part (keys of :data:`MEMORY_PARTS`; a missing or ``None``
    part is not modelled), its total, and the activations' split per micro-batch."""

    label: str
    parts: Mapping[str, float | None]
    total_bytes: float
    in_flight: float | None = None
    per_micro_batch_bytes: float | None = None
    tip: str = ""  # extra tooltip lines (e.g. its GPUs)


def _gib_ticks(top: float) -> tuple[float, list[float]]:
    step = nice_step(top / 2**30, 6) * 2**30
    ticks = [k * step for k in range(int(math.floor(top / step + 1e-9)) + 1)]
    return step, ticks


@dataclass(frozen=True)
class _MemoryFrame:
    """Where :func:`memory_chart` draws: the plot's box, the bars' width and gap, the byte scale."""
    left: float
    top: float
    plot_w: float
    plot_h: float
    lin_h: float         # the part of the axis drawn to scale
    scale: float         # px per byte
    bar_w: float
    gap: float
    ticks: list[float]
    broken: bool         # the axis is broken below the capacity line
    tallest: float
    label_words: bool    # bars wide enough for "stage 3" (else "3" and an axis title)

    @property
    def base(self) -> float:
        return self.top + self.plot_h

    @property
    def legend_x(self) -> float:
        return self.left + self.plot_w + 40


def _memory_frame(bars: Sequence[MemoryBar], capacity_bytes: float) -> _MemoryFrame:
    """The frame of the memory chart: GiB ticks above the tallest bar (or the capacity)."""
    n = max(len(bars), 1)
    tallest = max([b.total_bytes for b in bars] + [1.0])
    # A GPU far larger than the model would flatten the bars: above 2x the tallest bar the
    # axis is broken and the capacity line drawn just above the break (said on the chart).
    broken = capacity_bytes > 2 * tallest
    peak = tallest if broken else max(tallest, capacity_bytes)
    step, ticks = _gib_ticks(peak * 1.06)
    top_bytes = ticks[-1] if ticks[-1] >= peak * 1.02 else ticks[-1] + step
    ticks = [k * step for k in range(int(round(top_bytes / step)) + 1)]
    bar_w = max(12.0, min(56.0, 540.0 / n))
    gap = bar_w * 0.55
    plot_h = 320.0
    lin_h = plot_h - 46 if broken else plot_h
    return _MemoryFrame(left=70.0, top=30.0, plot_w=max(n * (bar_w + gap) + gap, 300.0), plot_h=plot_h, lin_h=lin_h,
                        scale=lin_h / top_bytes, bar_w=bar_w, gap=gap, ticks=ticks, broken=broken, tallest=tallest,
                        label_words=bar_w >= 40)


def memory_chart(bars: Sequence[MemoryBar], capacity_bytes: float, capacity_label: str = "",
                 title: str = "Memory per GPU by pipeline stage") -> str:
    """Stacked bars (bytes to scale on a GiB axis), the capacity line and the legend.

    Every segment is a ``<rect class="d2c-seg" data-stage=".." data-part=".." data-bytes="..">``;
    a bar above ``capacity_bytes`` gets a ``<rect class="d2c-over">`` outline and a red label;
    the capacity line is ``<line class="d2c-capacity">``; the plot's base line is
    ``<line class="d2c-base">`` (so tests can check the scale).
    """
    f = _memory_frame(bars, capacity_bytes)
    g = Svg()
    _memory_axis(g, f)
    for i, b in enumerate(bars):
        _memory_bar(g, f, i, b, capacity_bytes)
    if not f.label_words:
        g.text(f.left + f.plot_w / 2, f.base + 48, "pipeline stage", size=11, anchor="middle", fill=AXIS_COLOUR)
    _memory_capacity(g, f, capacity_bytes, capacity_label)
    ly = _memory_legend(g, f, bars, capacity_bytes, capacity_label)
    height = max(f.base + (54 if f.label_words else 62), ly + 8)
    return g.document(f.legend_x + 250, height, title, {"chart": "memory", "stages": len(bars)})


def _memory_axis(g: Svg, f: _MemoryFrame) -> None:
    """The grid, the GiB axis (with two slashes where it is broken) and the base line."""
    left, base = f.left, f.base
    for t in f.ticks:
        y = base - t * f.scale
        g.add(f'<line x1="{svg_number(left)}" y1="{svg_number(y)}" x2="{svg_number(left + f.plot_w)}" y2="{svg_number(y)}" stroke="{GRID_COLOUR}" stroke-width="1"/>')
        g.text(left - 8, y + 4, f"{t / 2**30:g}", size=11, anchor="end", fill=AXIS_COLOUR)
    g.add(f'<line x1="{svg_number(left)}" y1="{svg_number(base)}" x2="{svg_number(left)}" y2="{svg_number(base - f.lin_h)}" stroke="{AXIS_COLOUR}" stroke-width="1"/>')
    if f.broken:  # two short slashes on the axis mark the break
        yb = base - f.lin_h - 14
        for dy in (0, 6):
            g.add(f'<line x1="{svg_number(left - 6)}" y1="{svg_number(yb + dy + 4)}" x2="{svg_number(left + 6)}" y2="{svg_number(yb + dy - 2)}" stroke="{AXIS_COLOUR}" '
                  f'stroke-width="1.2"/>')
    g.text(18, f.top + f.plot_h / 2, "GiB per GPU", size=11, anchor="middle", fill=AXIS_COLOUR,
           extra=f' transform="rotate(-90 18 {svg_number(f.top + f.plot_h / 2)})"')
    g.add(f'<line class="d2c-base" x1="{svg_number(left)}" y1="{svg_number(base)}" x2="{svg_number(left + f.plot_w)}" y2="{svg_number(base)}" stroke="{AXIS_COLOUR}" '
          f'stroke-width="1"/>')


def _memory_segments(g: Svg, f: _MemoryFrame, i: int, b: MemoryBar, x: float) -> None:
    """Bar ``i``'s stacked parts, bottom up, each with its tooltip (activations: per micro-batch × in flight)."""
    y = f.base
    for key, name, fill in MEMORY_PARTS:
        v = b.parts.get(key)
        if not v or v <= 0:
            continue
        h = v * f.scale
        y -= h
        tip = f"{b.label}: {name.split(' (')[0].split(' ×')[0]} {fmt_bytes(v)}"
        if key == "activations_bytes" and b.in_flight is not None and b.per_micro_batch_bytes is not None:
            tip += f" = {fmt_bytes(b.per_micro_batch_bytes)} per micro-batch × {fmt_num(b.in_flight)} micro-batches in flight"
        tip += f" ({v / b.total_bytes:.0%} of the stage's {fmt_bytes(b.total_bytes)})" if b.total_bytes > 0 else ""
        body = g.rect(x, y, f.bar_w, h, fill, f' class="d2c-seg" data-stage="{i}" data-part="{key.removesuffix("_bytes")}" '
                                               f'data-bytes="{v:.17g}"')
        flight = f"×{fmt_num(b.in_flight)}" if key == "activations_bytes" and b.in_flight is not None else ""
        if flight and h >= 14 and f.bar_w >= 6 * len(flight) + 2:
            body += (f'<text x="{svg_number(x + f.bar_w / 2)}" y="{svg_number(y + h / 2 + 4)}" font-size="11" text-anchor="middle" '
                     f'fill="#1a1a1a" pointer-events="none">{xml_text(flight)}</text>')
        g.item(tip, body)


def _memory_bar(g: Svg, f: _MemoryFrame, i: int, b: MemoryBar, capacity_bytes: float) -> None:
    """Bar ``i``: its segments, a red outline when over capacity, its total above and its label below."""
    bar_w, base = f.bar_w, f.base
    x = f.left + f.gap + i * (bar_w + f.gap)
    over = b.total_bytes > capacity_bytes
    _memory_segments(g, f, i, b, x)
    bar_top = base - b.total_bytes * f.scale
    status = (f"over memory: {fmt_bytes(b.total_bytes)} of {fmt_bytes(capacity_bytes)}" if over
              else f"fits: {fmt_bytes(b.total_bytes)} of {fmt_bytes(capacity_bytes)}, {fmt_bytes(capacity_bytes - b.total_bytes)} free")
    tip = f"{b.label}: {status}" + (f"\n{b.tip}" if b.tip else "")
    if over:
        g.item(tip, g.rect(x - 1.5, bar_top - 1.5, bar_w + 3, b.total_bytes * f.scale + 3, "none",
                           f' class="d2c-over" data-stage="{i}" stroke="{OVER_COLOUR}" stroke-width="3"'))
    colour = OVER_COLOUR if over else TEXT_COLOUR
    if bar_w + f.gap >= 50:
        g.text(x + bar_w / 2, bar_top - 5, fmt_bytes(b.total_bytes), size=11, anchor="middle", fill=colour,
               weight="bold" if over else None)
    label = b.label if f.label_words else b.label.split()[-1]
    bold = ' font-weight="bold"' if over else ""
    body = (f'<text class="d2c-stage-label{" d2c-over-label" if over else ""}" x="{svg_number(x + bar_w / 2)}" y="{svg_number(base + 16)}" '
            f'font-size="11" text-anchor="middle" fill="{colour}"{bold}>{xml_text(label)}</text>')
    if over and f.label_words:
        body += (f'<text x="{svg_number(x + bar_w / 2)}" y="{svg_number(base + 30)}" font-size="11" text-anchor="middle" fill="{OVER_COLOUR}">'
                 f"over</text>")
    g.item(tip, body)


def _memory_capacity(g: Svg, f: _MemoryFrame, capacity_bytes: float, capacity_label: str) -> None:
    """The dashed capacity line and its label (just above the break when the axis is broken)."""
    left, plot_w = f.left, f.plot_w
    y_cap = f.top + 8 if f.broken else f.base - capacity_bytes * f.scale
    cap_text = f"capacity {fmt_bytes(capacity_bytes)}"
    if f.broken:
        cap_text += f" — axis broken: {capacity_bytes / f.tallest:.0f}× the tallest bar"
    g.item(f"GPU capacity: {fmt_bytes(capacity_bytes)}" + (f" ({capacity_label})" if capacity_label else "")
           + ("\nthe axis is broken below this line: the bars are drawn to the scale on the left" if f.broken else ""),
           f'<line class="d2c-capacity" x1="{svg_number(left)}" y1="{svg_number(y_cap)}" x2="{svg_number(left + plot_w)}" y2="{svg_number(y_cap)}" '
           f'stroke="{CAPACITY_COLOUR}" stroke-width="2" stroke-dasharray="7 4" data-bytes="{capacity_bytes:.17g}"'
           f' data-broken="{"true" if f.broken else "false"}"/>'
           f'<text x="{svg_number(left + plot_w)}" y="{svg_number(y_cap - 6)}" font-size="12" text-anchor="end" fill="{CAPACITY_COLOUR}" '
           f'font-weight="bold">{xml_text(cap_text)}</text>')


#: Characters of 11 px text that fit the 230 px right of a legend's swatches (about 6 px each).
LEGEND_CHARS = 36


def _memory_legend(g: Svg, f: _MemoryFrame, bars: Sequence[MemoryBar], capacity_bytes: float, capacity_label: str) -> float:
    """The legend right of the plot: the parts drawn (top first), the capacity line, the over outline.
    Returns the y below its last line."""
    legend_x = f.legend_x
    used = [key for key, _, _ in MEMORY_PARTS if any((b.parts.get(key) or 0) > 0 for b in bars)]
    ly = f.top + 4
    g.text(legend_x, ly, "per GPU of each stage", size=11, weight="bold")
    ly += 18
    for key, name, fill in reversed(MEMORY_PARTS):  # as the segments stack: top first
        if key not in used:
            continue
        g.add(g.rect(legend_x, ly - 9, 14, 11, fill, ' class="d2c-legend-swatch"'))
        g.text(legend_x + 20, ly, name, size=11)
        ly += 17
    ly += 4
    g.add(f'<line x1="{svg_number(legend_x)}" y1="{svg_number(ly - 4)}" x2="{svg_number(legend_x + 14)}" y2="{svg_number(ly - 4)}" stroke="{CAPACITY_COLOUR}" '
          f'stroke-width="2" stroke-dasharray="4 2"/>')
    text = "GPU capacity" + (f": {capacity_label}" if capacity_label else "")
    for line in textwrap.wrap(text, LEGEND_CHARS):  # the legend's column is 230 px: a long GPU label wraps
        g.text(legend_x + 20, ly, line, size=11)
        ly += 14
    ly += 3
    if any(b.total_bytes > capacity_bytes for b in bars):
        g.add(g.rect(legend_x + 1, ly - 9, 12, 10, "none", f' stroke="{OVER_COLOUR}" stroke-width="2.5"'))
        g.text(legend_x + 20, ly, "over capacity: does not fit", size=11, fill=OVER_COLOUR, weight="bold")
        ly += 17
    return ly


def memory_chart_of(facts: Facts) -> Chart:
    """The memory chart of an analysis: one bar per stage (one GPU of it)."""
    a = facts.analysis
    bars = []
    for p, st in enumerate(a.stages):
        mem = st.memory
        bars.append(MemoryBar(
            label=f"stage {p}",
            parts={key: mem.get(key) for key, _, _ in MEMORY_PARTS},
            total_bytes=facts.memory_per_gpu(p),
            in_flight=mem.get("in_flight_micro_batches"),
            per_micro_batch_bytes=mem.get("activations_per_micro_batch_bytes"),
            tip=f"GPUs {', '.join(map(str, facts.ranks(0, p)[:8]))}{' …' if facts.tp > 8 else ''} in replica 0",
        ))
    gpu = a.cluster.gpu
    label = f"{gpu.name}, {gpu.hbm_bytes / 1e9:g} GB less the CUDA context"
    return Chart("memory", "Memory per GPU by pipeline stage", memory_chart(bars, facts.capacity_bytes, label))


# ---------------------------------------------------------------------------------------------
# Timeline (Gantt) of the simulated iteration
# ---------------------------------------------------------------------------------------------

#: kind -> (legend label, fill, text colour).  Idle time (the pipeline bubble) is left white.
GANTT_KINDS: Mapping[str, tuple[str, str, str]] = {
    "forward": ("forward", "#fdae61", "#1a1a1a"),
    "backward": ("backward", "#d95f02", "#ffffff"),
    "recompute": ("recomputation (in backward)", "#fee08b", "#1a1a1a"),
    "optimizer": ("optimizer step", "#8e7cc3", "#ffffff"),
    "pp": ("pipeline send", "#6baed6", "#1a1a1a"),
    "dp": ("data-parallel collective", "#08519c", "#ffffff"),
    "other": ("other", "#9aa0a6", "#1a1a1a"),
    "mixed": ("several steps (merged)", "#c9a27e", "#1a1a1a"),
}

#: At most this many rectangles in the timeline; beyond, :func:`merge_boxes` merges.
MAX_BOXES = 4000
#: Width of the timeline's time axis in px: the chart fits the page's column at its natural
#: size (labels legible); long iterations are read by zooming in (numbers shrink with boxes).
PLOT_WIDTH = 960.0


@dataclass(frozen=True)
class GanttRow:
    label: str
    sub: str = ""  # a smaller second line
    thin: bool = False
    over: bool = False  # label in red: the stage does not fit in memory
    tip: str = ""


@dataclass(frozen=True)
class GanttBox:
    row: int
    start_s: float
    dur_s: float
    kind: str  # a key of GANTT_KINDS
    text: str = ""  # shown inside when the box is wide enough (the micro-batch)
    tip: str = ""
    count: int = 1  # steps this box stands for (after merging)
    kinds: tuple[str, ...] = field(default=())  # merged: the kinds it holds

    @property
    def end_s(self) -> float:
        return self.start_s + self.dur_s


def _join(group: list[GanttBox]) -> GanttBox:
    """One box standing for ``group`` (consecutive boxes of one row)."""
    if len(group) == 1:
        return group[0]
    first = group[0]
    kinds = tuple(dict.fromkeys(k for b in group for k in (b.kinds or (b.kind,))))
    kind = kinds[0] if len(kinds) == 1 else "mixed"
    count = sum(b.count for b in group)
    end = max(b.end_s for b in group)
    texts = [b.text for b in group if b.text]
    lo, hi = (texts[0].split("–")[0], texts[-1].split("–")[-1]) if texts else ("", "")
    text = lo if lo == hi else f"{lo}–{hi}"
    tip = (f"{count} steps merged ({', '.join(GANTT_KINDS[k][0] for k in kinds)})"
           + (f", micro-batches {text}" if text else "")
           + f"\n{fmt_s(first.start_s)} – {fmt_s(end)}")
    return GanttBox(first.row, first.start_s, end - first.start_s, kind, text, tip, count, kinds)


def _fold_recompute(boxes: list[GanttBox], tol: float) -> list[GanttBox]:
    """Each recomputation box joined to the backward step it starts (one box, kind backward)."""
    out: list[GanttBox] = []
    i = 0
    while i < len(boxes):
        b = boxes[i]
        nxt = boxes[i + 1] if i + 1 < len(boxes) else None
        if b.kind == "recompute" and nxt is not None and nxt.row == b.row and nxt.kind == "backward" and abs(nxt.start_s - b.end_s) <= tol:
            out.append(GanttBox(b.row, b.start_s, nxt.end_s - b.start_s, "backward", nxt.text,
                                f"{nxt.tip}\nof which recomputation first: {fmt_s(b.dur_s)}", nxt.count))
            i += 2
            continue
        out.append(b)
        i += 1
    return out


def _by_row(boxes: Sequence[GanttBox]) -> list[list[GanttBox]]:
    rows: dict[int, list[GanttBox]] = {}
    for b in boxes:
        rows.setdefault(b.row, []).append(b)
    return list(rows.values())


def _merge_touching(boxes: Sequence[GanttBox], tol: float) -> list[GanttBox]:
    out: list[GanttBox] = []
    for items in _by_row(boxes):
        group = [items[0]]
        for b in items[1:]:
            if b.kind == group[-1].kind and b.start_s - group[-1].end_s <= tol:
                group.append(b)
            else:
                out.append(_join(group))
                group = [b]
        out.append(_join(group))
    return out


def _merge_slots(boxes: Sequence[GanttBox], slot: float) -> list[GanttBox]:
    out: list[GanttBox] = []
    for items in _by_row(boxes):
        group = [items[0]]
        end = items[0].end_s
        uniform = True
        for b in items[1:]:
            g0 = group[0]
            if b.start_s - end < slot and (b.start_s - g0.start_s < slot or (uniform and b.kind == g0.kind)):
                group.append(b)
                uniform = uniform and b.kind == g0.kind
            else:
                out.append(_join(group))
                group, uniform = [b], True
            end = max(end, b.end_s)
        out.append(_join(group))
    return out


def merge_boxes(boxes: Sequence[GanttBox], max_boxes: int, span_s: float) -> tuple[list[GanttBox], str]:
    """At most ``max_boxes`` boxes, and a sentence saying what was merged ("" when nothing).

    Each step is taken only when the previous one leaves too many boxes:

    1. all boxes as they are;
    2. recomputation drawn inside the backward step it starts (no separate box);
    3. consecutive boxes of the same kind in a row that touch (gap below 1/10,000 of the span)
       become one box -- warm-up forwards, cool-down backwards, back-to-back sends or buckets;
    4. per row, boxes that start within one time slot of their group's first box become one box
       ("several steps" when kinds mix); a gap of a slot or more always starts a new box, so
       idle time longer than a slot stays visible.  The slot is the smallest (to 1%) that meets
       the budget.

    Every box's ``count`` adds up the steps (events) it stands for; recomputation counts none.
    """
    if len(boxes) <= max_boxes:
        return list(boxes), ""
    tol = span_s * 1e-4
    ordered = sorted(boxes, key=lambda b: (b.row, b.start_s))
    folded = _fold_recompute(ordered, tol)
    steps = sum(b.count for b in boxes)
    also = "; recomputation is drawn inside its backward step" if len(folded) < len(ordered) else ""
    if len(folded) <= max_boxes:
        return folded, f"{len(boxes):,} boxes: recomputation is drawn inside the backward step it starts"
    touching = _merge_touching(folded, tol)
    if len(touching) <= max_boxes:
        return touching, (f"{steps:,} steps: consecutive steps of the same kind that touch are drawn as one box "
                          f"({len(touching):,} boxes){also}; hover a box for what it holds")
    lo, hi = 0.0, span_s
    best = _merge_slots(touching, hi)
    for _ in range(30):  # bisection on the slot: the fewer merges, the better
        mid = (lo + hi) / 2
        out = _merge_slots(touching, mid)
        if len(out) <= max_boxes:
            hi, best = mid, out
        else:
            lo = mid
        if hi - lo <= 0.01 * hi:
            break
    return best, (f"{steps:,} steps are more than {max_boxes:,} boxes: steps closer than {fmt_s(hi)} in a row are drawn "
                  f"as one box ({len(best):,} boxes; \u201cseveral steps\u201d where kinds mix){also}; trace.json has every step")


@dataclass(frozen=True)
class _GanttFrame:
    """Where :func:`gantt_chart` draws: the rows' tops, the plot's box and the time scale."""
    left: float
    top: float
    ys: list[float]      # each row's top
    bottom: float
    plot_w: float
    span: float          # seconds the axis spans (span_s, or 1 when it is 0)
    px: float            # px per second
    main_h: float = 24.0
    thin_h: float = 9.0

    def x_of(self, t: float) -> float:
        return self.left + t * self.px

    def row_h(self, row: GanttRow) -> float:
        return self.thin_h if row.thin else self.main_h


def _gantt_frame(rows: Sequence[GanttRow], span_s: float, plot_w: float) -> _GanttFrame:
    """The rows stacked under the legend, a small gap before each main (not thin) row."""
    left, legend_h = 130.0, 30.0
    top = legend_h + 14
    main_h, thin_h, group_gap = 24.0, 9.0, 7.0
    ys: list[float] = []
    y = top
    for i, r in enumerate(rows):
        if i > 0 and not r.thin:
            y += group_gap
        ys.append(y)
        y += (thin_h if r.thin else main_h) + 2
    span = span_s if span_s > 0 else 1.0
    return _GanttFrame(left, top, ys, y + 2, plot_w, span, plot_w / span, main_h, thin_h)


def gantt_chart(rows: Sequence[GanttRow], boxes: Sequence[GanttBox], span_s: float, plot_w: float = PLOT_WIDTH,
                title: str = "Timeline of one training iteration", note: str = "") -> str:
    """Rows of boxes on a time axis in ms from 0 to ``span_s``.

    Every box is a ``<rect class="d2c-box" data-kind=".." data-row=".." data-count="..">``; the
    axis is ``<line class="d2c-time-axis" data-span-s="..">`` from ``x(0)`` to ``x(span_s)``.
    """
    f = _gantt_frame(rows, span_s, plot_w)
    g = Svg()
    _gantt_legend(g, f, boxes)
    _gantt_grid(g, f)
    for i, r in enumerate(rows):
        _gantt_row(g, f, i, r)
    for b in boxes:
        _gantt_box(g, f, rows[b.row], b)
    _gantt_axis(g, f, span_s, note)
    height = f.bottom + 46 + (18 if note else 0)
    return g.document(f.left + plot_w + 24, height, title, {"chart": "timeline", "rows": len(rows), "boxes": len(boxes)})


def _gantt_legend(g: Svg, f: _GanttFrame, boxes: Sequence[GanttBox]) -> None:
    """A swatch per kind of box drawn, in :data:`GANTT_KINDS` order, then idle."""
    present = list(dict.fromkeys(b.kind for b in boxes))
    lx = f.left
    for kind in [k for k in GANTT_KINDS if k in present]:
        name, fill, _ = GANTT_KINDS[kind]
        g.add(g.rect(lx, 10, 14, 11, fill, ' stroke="#ffffff" stroke-width="0.5" class="d2c-legend-swatch"'))
        g.text(lx + 19, 20, name, size=11)
        lx += 19 + 5.4 * len(name) + 20
    g.add(g.rect(lx, 10, 14, 11, "#ffffff", f' stroke="{AXIS_COLOUR}" stroke-width="0.7"'))
    g.text(lx + 19, 20, "idle (pipeline bubble, waiting)", size=11)


def _gantt_grid(g: Svg, f: _GanttFrame) -> None:
    """Vertical lines at round milliseconds, labelled under the rows."""
    step_ms = nice_step(f.span * 1e3, 10)
    ticks = [k * step_ms for k in range(int(math.floor(f.span * 1e3 / step_ms + 1e-9)) + 1)]
    # as many decimals as the step needs: 0.25 ms -> 2, 2.5 ms -> 1, 20 ms -> 0
    decimals = next((d for d in range(7) if abs(round(step_ms, d) - step_ms) < step_ms * 1e-6), 6)
    for t in ticks:
        x = f.x_of(t / 1e3)
        g.add(f'<line x1="{svg_number(x)}" y1="{svg_number(f.top - 4)}" x2="{svg_number(x)}" y2="{svg_number(f.bottom + 4)}" stroke="{GRID_COLOUR}" stroke-width="1"/>')
        g.text(x, f.bottom + 18, f"{t:.{decimals}f}", size=11, anchor="middle", fill=AXIS_COLOUR, cls="d2c-tick")


def _gantt_row(g: Svg, f: _GanttFrame, i: int, r: GanttRow) -> None:
    """Row ``i``'s background and its label (bold with a second line, or small for a thin row; red when over memory)."""
    left, y, h = f.left, f.ys[i], f.row_h(r)
    g.add(g.rect(left, y, f.plot_w, h, "#f8f9fa" if not r.thin else "#fbfbfc"))
    colour = OVER_COLOUR if r.over else (AXIS_COLOUR if r.thin else TEXT_COLOUR)
    if r.thin:
        body = (f'<text x="{svg_number(left - 8)}" y="{svg_number(y + h - 1)}" font-size="11" text-anchor="end" fill="{colour}">'
                f"{xml_text(r.label)}</text>")
    else:
        body = (f'<text class="d2c-row-label{" d2c-over-label" if r.over else ""}" x="{svg_number(left - 8)}" y="{svg_number(y + 11)}" '
                f'font-size="11" text-anchor="end" fill="{colour}" font-weight="bold">{xml_text(r.label)}</text>')
        if r.sub:
            body += (f'<text x="{svg_number(left - 8)}" y="{svg_number(y + 22)}" font-size="11" text-anchor="end" fill="{colour}">'
                     f"{xml_text(r.sub)}</text>")
    g.item(r.tip, body)


def _gantt_box(g: Svg, f: _GanttFrame, r: GanttRow, b: GanttBox) -> None:
    """One box on its row, at least 0.6 px wide, with its text when it fits."""
    h = f.row_h(r)
    x = f.x_of(b.start_s)
    w = max(b.dur_s * f.px, 0.6)
    name, fill, font = GANTT_KINDS[b.kind]
    edge = ' stroke="#ffffff" stroke-width="0.4"' if w >= 4 else ""  # a white edge would wash out a sliver
    body = g.rect(x, f.ys[b.row] + 1, w, h - 2, fill,
                  f' class="d2c-box" data-kind="{b.kind}" data-row="{b.row}" data-count="{b.count}"{edge}')
    # the micro-batch number, in a smaller font where the box is narrow: readable once zoomed in
    size = min(9.5, (w - 1.5) / (0.6 * len(b.text))) if b.text else 0.0
    if size >= 2.5 and not r.thin:
        body += (f'<text x="{svg_number(x + w / 2)}" y="{svg_number(f.ys[b.row] + h / 2 + size * 0.36)}" font-size="{svg_number(size)}" '
                 f'text-anchor="middle" fill="{font}" pointer-events="none">{xml_text(b.text)}</text>')
    g.item(b.tip, body)


def _gantt_axis(g: Svg, f: _GanttFrame, span_s: float, note: str) -> None:
    """The time axis, the dashed end of the iteration with its time, and the note on simplification."""
    left, bottom = f.left, f.bottom
    g.add(f'<line class="d2c-time-axis" x1="{svg_number(f.x_of(0))}" y1="{svg_number(bottom + 4)}" x2="{svg_number(f.x_of(f.span))}" y2="{svg_number(bottom + 4)}" '
          f'stroke="{AXIS_COLOUR}" stroke-width="1" data-span-s="{span_s:.17g}"/>')
    end = f.x_of(f.span)
    g.add(f'<line class="d2c-iteration-end" x1="{svg_number(end)}" y1="{svg_number(f.top - 8)}" x2="{svg_number(end)}" y2="{svg_number(bottom + 4)}" '
          f'stroke="#202124" stroke-width="1.2" stroke-dasharray="4 3"/>')
    g.text(left - 8, bottom + 18, "ms", size=11, anchor="end", fill=AXIS_COLOUR)
    g.text(end, bottom + 34, f"iteration: {fmt_s(span_s)}", size=12, anchor="end", fill="#202124", weight="bold")
    if note:
        g.text(left, bottom + 52, f"Simplified drawing: {note}.", size=11, fill=AXIS_COLOUR, cls="d2c-chart-note")


def _recompute_per_step(facts: Facts, p: int, v: int) -> float:
    """Seconds of recomputation inside each backward step of stage ``p``.

    The analysis folds recomputation into the stage's backward compute; it is that compute
    minus the ops' own backward time and the gradient-accumulation pass, plus (full
    recomputation) the repeated forward tensor-parallel collectives, split over the ``v`` model
    chunks."""
    a = facts.analysis
    if a.config.recompute is Recompute.NONE:
        return 0.0
    st = a.stages[p]
    own = sum(a.ops[i].time_bwd_s for li in st.layers for i in a.layered.layers[li].op_indices)
    extra = max(st.compute_bwd_s - st.grad_accumulation_s - st.loss_bwd_s - own, 0.0)
    if a.config.recompute is Recompute.FULL:
        extra += sum(c.time_s * c.count_per_iteration for c in facts.tp_by_stage.get(p, ())
                     if c.per_micro_batch and c.phase is Phase.FORWARD) / max(facts.m, 1)
    return extra / v


def timeline_chart_of(facts: Facts, max_boxes: int = MAX_BOXES) -> Chart | None:
    """The simulated iteration of ``facts.analysis.timeline`` as a Gantt chart (``None`` when
    the analysis has no simulated timeline)."""
    a = facts.analysis
    sim = a.timeline
    if sim is None or not sim.events:
        return None
    v = a.config.chunks
    streams = {(ev.device, ev.stream) for ev in sim.events}
    has_pp = any(s is Stream.PP for _, s in streams)
    has_dp = any(s is Stream.DP for _, s in streams)
    crit = a.summary.get("critical_stage")
    rows: list[GanttRow] = []
    row_of: dict[tuple[int, str], int] = {}
    for p in range(facts.pp):
        ranks = facts.ranks(0, p)
        over = facts.over_capacity(p)
        tip = (f"stage {p}: GPUs {', '.join(map(str, ranks[:8]))}{' …' if len(ranks) > 8 else ''} (replica 0; the other "
               f"replicas and tensor ranks run the same timeline)")
        if crit == p:
            tip += "\nthe busiest stage (the one the summary's compute time is taken from)"
        if over:
            tip += "\n" + facts.over_memory_text(p)
        gpus = rank_ranges(ranks)
        gpus = ("GPUs " if len(ranks) > 1 else "GPU ") + (gpus if len(gpus) <= 14 else f"{ranks[0]}…{ranks[-1]}")
        sub = "over memory" if over else ("busiest stage" if crit == p else gpus)
        row_of[(p, Stream.COMPUTE)] = row_of[(p, Stream.OPTIMIZER)] = len(rows)
        rows.append(GanttRow(f"stage {p}", sub, over=over, tip=tip))
        if has_pp:
            row_of[(p, Stream.PP)] = len(rows)
            rows.append(GanttRow("pp send", thin=True, tip=f"stage {p}: pipeline sends (activations forward, gradients backward)"))
        if has_dp:
            row_of[(p, Stream.DP)] = len(rows)
            rows.append(GanttRow("dp", thin=True, tip=f"stage {p}: data-parallel collectives (gradient buckets overlapping the "
                                                      f"last backward, ZeRO gathers and reduce-scatters)"))
    recompute = [_recompute_per_step(facts, p, v) for p in range(facts.pp)]
    boxes: list[GanttBox] = []
    for ev in sim.events:
        row = row_of.get((ev.device, ev.stream), row_of[(ev.device, Stream.COMPUTE)])
        mb = str(ev.micro_batch) if ev.micro_batch >= 0 else ""
        chunk = f", model chunk {ev.chunk}" if v > 1 else ""
        when = f"{fmt_s(ev.start_s)} – {fmt_s(ev.start_s + ev.dur_s)} ({fmt_s(ev.dur_s)})"
        where = f"stage {ev.device}"
        if ev.stream is Stream.COMPUTE:
            fwd = ev.name.startswith("F")
            what = "forward" if fwd else "backward"
            r = 0.0 if fwd else min(recompute[ev.device], ev.dur_s)
            if r > 0:
                boxes.append(GanttBox(row, ev.start_s, r, "recompute", "",
                                      f"{where}: recomputation of micro-batch {mb}'s forward{chunk} (part of its backward)\n"
                                      f"{fmt_s(ev.start_s)} – {fmt_s(ev.start_s + r)} ({fmt_s(r)})", count=0))
            boxes.append(GanttBox(row, ev.start_s + r, ev.dur_s - r, what, mb,
                                  f"{where}: {what} of micro-batch {mb}{chunk} ({ev.name})\n{when}"
                                  + (", including its tensor-parallel collectives" if facts.tp > 1 else "")))
        elif ev.stream is Stream.PP and not ev.name.startswith("send"):  # the tied-weight gradient all-reduce
            boxes.append(GanttBox(row, ev.start_s, ev.dur_s, "pp", "",
                                  f"{where}: {ev.name} with the other stages holding the tied weight "
                                  f"(Megatron-LM embedding group), before the optimizer step\n{when}"))
        elif ev.stream is Stream.PP:
            dest = f" to stage {ev.flow_to[0]}" if ev.flow_to else ""
            what = "activation" if ev.name.startswith("send F") else "gradient"
            boxes.append(GanttBox(row, ev.start_s, ev.dur_s, "pp", mb,
                                  f"{where}: send the {what} of micro-batch {mb}{chunk}{dest}\n{when}"))
        elif ev.stream is Stream.DP:
            boxes.append(GanttBox(row, ev.start_s, ev.dur_s, "dp", "",
                                  f"{where}: {ev.name}" + (f" (micro-batch {mb}{chunk})" if mb else "") + f"\n{when}"))
        elif ev.stream is Stream.OPTIMIZER:
            boxes.append(GanttBox(row, ev.start_s, ev.dur_s, "optimizer", "opt", f"{where}: {ev.name}\n{when}"))
        else:  # a stream this chart does not know yet: drawn on the compute row, grey
            boxes.append(GanttBox(row, ev.start_s, ev.dur_s, "other", "", f"{where}, {ev.stream}: {ev.name}\n{when}"))
    span = sim.iteration_time_s
    drawn, note = merge_boxes(boxes, max_boxes, span)
    svg = gantt_chart(rows, drawn, span, note=note)
    return Chart("timeline", "Timeline of one training iteration", svg, note, len(drawn))

