"""Predicted against measured on log-log axes: the charts of the validation page.

One point per validated case (its measured value on x, the tool's prediction on y), the line
y = x where a perfect prediction lies, and shaded bands y = x (1 ± b) for each relative error
bound b (5% and 10% by default): on log axes each band is the diagonal shifted by
log10(1 ± b), so a band's width does not depend on the magnitude.  A point's colour says which
band it falls in.

Pure functions, data in and SVG text out, with the conventions of
:mod:`dml2comm.render.charts`: every string through
:func:`~dml2comm.render.charts.xml_text` (a case id is model or file text), each point a
hoverable ``<g class="d2c-item">`` whose ``<title>`` is its tooltip, width/height in pt and a
viewBox in px.  Each point is ``<circle class="d2c-pt" data-case=".." data-error="..">`` (so
tests can count and match them); the diagonal is ``<line class="d2c-diagonal">`` and each band
``<polygon class="d2c-band" data-bound="..">``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from dml2comm.render.charts import AXIS_COLOUR, GRID_COLOUR, OVER_COLOUR, TEXT_COLOUR, Svg, nice_step, svg_number, xml_text

__all__ = ["ParityPoint", "parity_chart", "log_ticks", "band_colour", "BAND_COLOURS", "DEFAULT_BANDS"]

#: Relative error bounds drawn as bands around the diagonal (the issue's 5% and 10% targets).
DEFAULT_BANDS: tuple[float, ...] = (0.05, 0.10)
#: Point fills: within the tightest band, within the widest band, beyond it.
BAND_COLOURS: tuple[str, str, str] = ("#188038", "#e8a000", OVER_COLOUR)
_BAND_FILLS = ("#ceead6", "#fdf1cf")  # tightest band first (drawn last, on top)


@dataclass(frozen=True)
class ParityPoint:
    """One case: ``measured`` and ``predicted`` in the chart's unit (both > 0), its ``case_id``
    (written into ``data-case``) and its tooltip ``tip`` (defaults to the id and the error)."""

    measured: float
    predicted: float
    case_id: str
    tip: str = ""

    @property
    def error(self) -> float:
        """``predicted / measured - 1``."""
        return self.predicted / self.measured - 1.0


def band_colour(error: float, bands: Sequence[float] = DEFAULT_BANDS) -> str:
    """The fill of a point with relative error ``error``: within the tightest band, within the
    widest, or beyond (:data:`BAND_COLOURS`).  A bound holds up to 1e-12 (11 / 10 - 1 is
    0.10000000000000009 in floating point, and is within 10%)."""
    e = abs(error) - 1e-12
    if e <= min(bands):
        return BAND_COLOURS[0]
    return BAND_COLOURS[1] if e <= max(bands) else BAND_COLOURS[2]


def log_ticks(lo: float, hi: float, target: int = 7) -> list[float]:
    """Tick values inside [lo, hi] for a log axis (0 < lo < hi): powers of ten when the range
    spans three decades or more, 1-2-5 x 10^k over one to three, 1-9 x 10^k below one decade;
    when that still gives fewer than three ticks (a narrow range), evenly stepped values
    (:func:`~dml2comm.render.charts.nice_step`)."""
    if not (0 < lo < hi) or not math.isfinite(hi):
        raise ValueError(f"log_ticks needs 0 < lo < hi, got {lo!r}, {hi!r}")
    decades = math.log10(hi / lo)
    mantissas = (1,) if decades >= 3 else (1, 2, 5) if decades >= 1 else tuple(range(1, 10))
    ticks = []
    for k in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1):
        for m in mantissas:
            v = m * 10.0**k
            if lo <= v * (1 + 1e-12) and v <= hi * (1 + 1e-12):
                ticks.append(v)
    if decades >= 3 and len(ticks) > target:  # thin whole decades: every 2nd, 3rd, ...
        stride = math.ceil(len(ticks) / target)
        ticks = ticks[::stride]
    if len(ticks) < 3:
        step = nice_step(hi - lo, 4)
        start = math.ceil(lo / step - 1e-9) * step
        ticks = [start + i * step for i in range(int((hi - start) / step + 1e-9) + 1)]
    return ticks


def _tick_text(v: float) -> str:
    if v >= 1e5 or v < 1e-3:
        return f"{v:.0e}".replace("e+0", "e").replace("e-0", "e-")
    return f"{v:.6g}"


def parity_chart(points: Sequence[ParityPoint], unit: str, title: str, bands: Sequence[float] = DEFAULT_BANDS,
                 size_px: float = 420.0) -> str:
    """Predicted (y) against measured (x), both on one log scale in ``unit``, with the diagonal
    and a band per bound in ``bands``; the most wrong points are drawn last (on top).

    Raises
    ------
    ValueError
        ``points`` is empty, or a value is not a positive finite number (a log axis cannot
        show it).
    """
    if not points:
        raise ValueError("parity_chart needs at least one point")
    values = [v for p in points for v in (p.measured, p.predicted)]
    if not all(math.isfinite(v) and v > 0 for v in values):
        raise ValueError("parity_chart needs positive finite measured and predicted values")
    widest = max(bands) if bands else 0.0
    pad = 1.0 + max(widest, 0.05) + 0.04
    lo, hi = min(values) / pad, max(values) * pad
    lx_lo, lx_hi = math.log10(lo), math.log10(hi)
    left, top, plot = 76.0, 58.0, size_px
    base = top + plot

    def px(v: float) -> float:
        return left + (math.log10(v) - lx_lo) / (lx_hi - lx_lo) * plot

    def py(v: float) -> float:
        return base - (math.log10(v) - lx_lo) / (lx_hi - lx_lo) * plot

    g = Svg()
    # legend: point colours and bands
    tight = min(bands) if bands else 0.0
    legend = [(f"within {tight:.0%}", BAND_COLOURS[0]), (f"within {widest:.0%}", BAND_COLOURS[1]),
              (f"beyond {widest:.0%}", BAND_COLOURS[2])] if len(bands) > 1 else \
             [(f"within {tight:.0%}", BAND_COLOURS[0]), (f"beyond {tight:.0%}", BAND_COLOURS[2])]
    x = left
    for name, fill in legend:
        g.add(f'<circle cx="{svg_number(x + 5)}" cy="{svg_number(15)}" r="4.5" fill="{fill}"/>')
        g.text(x + 14, 19, name, size=10)
        x += 14 + 5.6 * len(name) + 16
    x = left
    for b, fill in zip(sorted(bands, reverse=True), reversed(_BAND_FILLS[:len(bands)])):
        g.add(g.rect(x, 30, 14, 11, fill, ' class="d2c-legend-swatch"'))
        g.text(x + 19, 40, f"±{b:.0%} band", size=10)
        x += 19 + 5.6 * 9 + 16
    g.add(f'<line x1="{svg_number(x)}" y1="{svg_number(35.5)}" x2="{svg_number(x + 16)}" y2="{svg_number(35.5)}" stroke="{TEXT_COLOUR}" '
          f'stroke-width="1.2" stroke-dasharray="5 3"/>')
    g.text(x + 21, 40, "predicted = measured", size=10)
    # grid and ticks
    for t in log_ticks(lo, hi):
        xx, yy = px(t), py(t)
        g.add(f'<line x1="{svg_number(xx)}" y1="{svg_number(top)}" x2="{svg_number(xx)}" y2="{svg_number(base)}" stroke="{GRID_COLOUR}" stroke-width="1"/>')
        g.add(f'<line x1="{svg_number(left)}" y1="{svg_number(yy)}" x2="{svg_number(left + plot)}" y2="{svg_number(yy)}" stroke="{GRID_COLOUR}" stroke-width="1"/>')
        g.text(xx, base + 16, _tick_text(t), size=10, anchor="middle", fill=AXIS_COLOUR)
        g.text(left - 7, yy + 4, _tick_text(t), size=10, anchor="end", fill=AXIS_COLOUR)
    # bands, widest first: between y = x(1 - b) and y = x(1 + b), clipped to the square
    # (vertices where each line crosses the plot's edges; the padding keeps lo(1 + b) < hi)
    for b, fill in zip(sorted(bands, reverse=True), reversed(_BAND_FILLS[:len(bands)])):
        up, down = 1.0 + b, 1.0 - b
        corners = [(lo, lo * up), (hi / up, hi), (hi, hi), (hi, hi * down), (lo / down, lo), (lo, lo)]
        path = " ".join(f"{svg_number(px(a))},{svg_number(py(c))}" for a, c in corners)
        g.item(f"±{b:.0%}: predicted within {b:.0%} of measured",
               f'<polygon class="d2c-band" data-bound="{b:g}" points="{path}" fill="{fill}" stroke="none"/>')
    g.add(f'<line class="d2c-diagonal" x1="{svg_number(px(lo))}" y1="{svg_number(py(lo))}" x2="{svg_number(px(hi))}" y2="{svg_number(py(hi))}" '
          f'stroke="{TEXT_COLOUR}" stroke-width="1.2" stroke-dasharray="5 3"/>')
    g.add(f'<rect x="{svg_number(left)}" y="{svg_number(top)}" width="{svg_number(plot)}" height="{svg_number(plot)}" fill="none" stroke="{AXIS_COLOUR}"/>')
    g.text(left + plot / 2, base + 36, f"measured ({unit}, log scale)", size=11, anchor="middle", fill=AXIS_COLOUR)
    g.text(18, top + plot / 2, f"predicted ({unit}, log scale)", size=11, anchor="middle", fill=AXIS_COLOUR,
           extra=f' transform="rotate(-90 18 {svg_number(top + plot / 2)})"')
    # points, the most wrong on top
    for p in sorted(points, key=lambda p: abs(p.error)):
        tip = p.tip or f"{p.case_id}: error {p.error:+.1%}"
        g.item(tip, f'<circle class="d2c-pt" cx="{svg_number(px(p.measured))}" cy="{svg_number(py(p.predicted))}" r="3.6" '
                    f'fill="{band_colour(p.error, bands or (0.0,))}" fill-opacity="0.8" stroke="#ffffff" stroke-width="0.6" '
                    f'data-case="{xml_text(p.case_id)}" data-error="{p.error:.6g}"/>')
    return g.document(left + plot + 24, base + 50, title, {"chart": "parity", "points": len(points)})
