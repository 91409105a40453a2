"""The calibration page's charts: log-log scatter plots of the fitted samples (pure: data in, SVG
text out, no I/O).

- :func:`class_chart`: one point per shape of a kernel class (:mod:`dml2comm.calibrate.classes`),
  measured time (x) against the class's model at its fitted value (y), with the base preset's
  model as grey points and the y = x line (a point on it is predicted exactly; above it,
  over-predicted).
- :func:`collective_chart`: one (kind, group size, level): measured time against message size,
  the fitted ``alpha + beta S`` line and the base's network model (dashed).

Held-out points (``--holdout``) are drawn hollow.  Every tooltip (shape, size, operator names from
the trace) passes through :func:`~dml2comm.render.charts.xml_text` (via
:class:`~dml2comm.render.charts.Svg`); the helpers are the site's own chart helpers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from dml2comm.render.charts import AXIS_COLOUR, GRID_COLOUR, TEXT_COLOUR, Svg, svg_number
from dml2comm.fmt import fmt_bytes, fmt_s

__all__ = ["ScatterPoint", "Curve", "loglog_chart", "class_chart", "collective_chart", "FIT_COLOUR",
           "BASE_COLOUR"]

#: Calibrated model and measured points (blue), the base preset's model (grey), held-out points (orange).
FIT_COLOUR = "#1a73e8"
BASE_COLOUR = "#9aa0a6"
HELD_COLOUR = "#e8710a"


@dataclass(frozen=True)
class ScatterPoint:
    x: float
    y: float
    tip: str
    colour: str = FIT_COLOUR
    hollow: bool = False
    radius: float = 4.0


@dataclass(frozen=True)
class Curve:
    label: str
    points: tuple[tuple[float, float], ...]
    colour: str
    dashed: bool = False


def _decades(values: Sequence[float], base: int = 10) -> tuple[int, int]:
    """(lowest, highest) powers of ``base`` around the positive values."""
    pos = [v for v in values if v > 0 and math.isfinite(v)]
    if not pos:
        return 0, 1
    lo, hi = math.floor(math.log(min(pos), base) + 1e-9), math.ceil(math.log(max(pos), base) - 1e-9)
    return lo, max(hi, lo + 1)


def _err(model: float, measured: float) -> str:
    return f"{(model - measured) / measured:+.1%}" if measured > 0 else "n/a"


def loglog_chart(title: str, x_label: str, y_label: str, points: Sequence[ScatterPoint], curves: Sequence[Curve] = (),
                 *, diagonal: bool = False, x_fmt: Callable[[float], str] = fmt_s, y_fmt: Callable[[float], str] = fmt_s,
                 legend: Sequence[tuple[str, str, bool]] = (), width: float = 640.0, height: float = 420.0, x_base: int = 10) -> str:
    """A log-log scatter plot: decade grid lines labelled with ``x_fmt``/``y_fmt``, the points
    (a ``<g class="d2c-item">`` each, its tooltip ``tip``), the curves, the y = x line when
    ``diagonal`` (both axes then share their range), and a legend of ``(label, colour, hollow)``.
    ``x_base=2`` puts the x grid on powers of two (byte sizes: 1 MiB, 4 MiB, ...)."""
    left, right, top, bottom = 78.0, 36.0, 72.0, 52.0
    xs = [p.x for p in points] + [x for c in curves for x, _ in c.points]
    ys = [p.y for p in points] + [y for c in curves for _, y in c.points]
    (x0, x1), (y0, y1) = _decades(xs, x_base), _decades(ys)
    if diagonal:
        x0 = y0 = min(x0, y0)
        x1 = y1 = max(x1, y1)
    pw, ph = width - left - right, height - top - bottom

    def px(x: float) -> float:
        return left + (math.log(x, x_base) - x0) / (x1 - x0) * pw

    def py(y: float) -> float:
        return top + ph - (math.log10(y) - y0) / (y1 - y0) * ph

    g = Svg()
    g.add(g.rect(0, 0, width, height, "#ffffff"))
    g.text(left, 20, title, size=13, weight="bold")
    x, ly = left, 36.0
    entries = [(label, colour, hollow, None) for label, colour, hollow in legend] + [(c.label, c.colour, False, c) for c in curves]
    for label, colour, hollow, curve in entries:
        room = (28.0 if curve is not None else 14.0) + len(label) * 6.2 + 18
        if x + room > width - right and x > left:
            x, ly = left, ly + 16
        if curve is None:
            fill = "#ffffff" if hollow else colour
            g.add(f'<circle cx="{svg_number(x + 5)}" cy="{svg_number(ly)}" r="4" fill="{fill}" stroke="{colour}" stroke-width="1.5"/>')
            g.text(x + 14, ly + 4, label, size=11)
        else:
            dash = ' stroke-dasharray="5 4"' if curve.dashed else ""
            g.add(f'<line x1="{svg_number(x)}" y1="{svg_number(ly)}" x2="{svg_number(x + 22)}" y2="{svg_number(ly)}" '
                  f'stroke="{colour}" stroke-width="2"{dash}/>')
            g.text(x + 28, ly + 4, label, size=11)
        x += room
    g.add(g.rect(left, top, pw, ph, "#fbfbfc", f' stroke="{GRID_COLOUR}"'))
    step_x = max(1, math.ceil((x1 - x0) / 8))
    if x_base == 2 and step_x > 1:  # whole binary prefixes: 1, 4, 16, 64 ... or 1 KiB, 1 MiB ...
        step_x = 2 if step_x == 2 else 10 if step_x > 5 else 5 if step_x > 4 else 4 if step_x > 2 else step_x
    step_y = max(1, math.ceil((y1 - y0) / 8))
    for d in range(x0 + (-x0) % step_x, x1 + 1, step_x):
        gx = px(float(x_base) ** d)
        g.add(f'<line x1="{svg_number(gx)}" y1="{svg_number(top)}" x2="{svg_number(gx)}" y2="{svg_number(top + ph)}" stroke="{GRID_COLOUR}"/>')
        g.text(gx, top + ph + 16, x_fmt(float(x_base) ** d), size=10, anchor="middle", fill=AXIS_COLOUR)
    for d in range(y0 + (-y0) % step_y, y1 + 1, step_y):
        gy = py(10.0**d)
        g.add(f'<line x1="{svg_number(left)}" y1="{svg_number(gy)}" x2="{svg_number(left + pw)}" y2="{svg_number(gy)}" stroke="{GRID_COLOUR}"/>')
        g.text(left - 6, gy + 4, y_fmt(10.0**d), size=10, anchor="end", fill=AXIS_COLOUR)
    g.text(left + pw / 2, height - 12, x_label, size=11, anchor="middle", fill=TEXT_COLOUR)
    g.text(16, top + ph / 2, y_label, size=11, anchor="middle", fill=TEXT_COLOUR,
           extra=f' transform="rotate(-90 16 {svg_number(top + ph / 2)})"')
    if diagonal:
        a, b = 10.0**x0, 10.0**x1
        g.add(f'<line x1="{svg_number(px(a))}" y1="{svg_number(py(a))}" x2="{svg_number(px(b))}" y2="{svg_number(py(b))}" '
              f'stroke="{AXIS_COLOUR}" stroke-width="1" stroke-dasharray="3 3"/>')
        g.text(px(b) - 4, py(b) + 14, "y = x", size=10, anchor="end", fill=AXIS_COLOUR)
    for c in curves:
        pts = [(x, y) for x, y in c.points if x > 0 and y > 0]
        if len(pts) < 2:
            continue
        path = " ".join(f"{svg_number(px(x))},{svg_number(py(y))}" for x, y in pts)
        dash = ' stroke-dasharray="5 4"' if c.dashed else ""
        g.add(f'<polyline points="{path}" fill="none" stroke="{c.colour}" stroke-width="2"{dash}/>')
    for p in sorted(points, key=lambda p: p.colour == FIT_COLOUR or p.colour == HELD_COLOUR):  # measured points on top
        if not (p.x > 0 and p.y > 0):
            continue
        fill = "#ffffff" if p.hollow else p.colour
        g.item(p.tip, f'<circle cx="{svg_number(px(p.x))}" cy="{svg_number(py(p.y))}" r="{svg_number(p.radius)}" fill="{fill}" '
                      f'fill-opacity="0.85" stroke="{p.colour}" stroke-width="1.5"/>')
    return g.document(width, height, title)


def _held(p: Mapping[str, Any]) -> str:
    return "; held out of the fit" if p["held_out"] else ""


def _model_chart(title: str, points: Sequence[Mapping[str, Any]], describe, symbol: str, value: float, base_value: float) -> str:
    """Measured time (x) against the model's (y) per shape, calibrated and base: the GEMM and
    memory-bound charts (``describe(point)``: the tooltip's shape text)."""
    pts: list[ScatterPoint] = []
    for p in points:
        tip = (f"{describe(p)}: measured {fmt_s(p['measured_s'])} (median of {p['repeats']}), "
               f"calibrated {fmt_s(p['model_s'])} ({_err(p['model_s'], p['measured_s'])}), "
               f"base {fmt_s(p['base_s'])} ({_err(p['base_s'], p['measured_s'])}){_held(p)}")
        pts.append(ScatterPoint(p["measured_s"], p["base_s"], tip, BASE_COLOUR, radius=3.0))
        pts.append(ScatterPoint(p["measured_s"], p["model_s"], tip, HELD_COLOUR if p["held_out"] else FIT_COLOUR, p["held_out"]))
    legend = [(f"calibrated ({symbol} = {value:.3g})", FIT_COLOUR, False), (f"base preset ({symbol} = {base_value:.3g})", BASE_COLOUR, False)]
    if any(p["held_out"] for p in points):
        legend.append(("held out", HELD_COLOUR, True))
    return loglog_chart(f"{title}: {len(points)} shapes", "measured time (median per shape)", "model time", pts,
                        diagonal=True, legend=legend)


def class_chart(record: Mapping[str, Any], points: Sequence[Mapping[str, Any]]) -> str:
    """Measured time (x) against the class's model (y) per shape of one kernel class
    (:func:`dml2comm.calibrate.points.class_points`), at the fitted value and at the base's."""
    symbols = {"sustained factor": "f", "HBM efficiency": "e", "time scale": "c"}
    return _model_chart(str(record.get("label", record["class"])), points, lambda p: f"{p['shape']} ({', '.join(p['ops'])})",
                        symbols.get(str(record.get("quantity")), "v"), record["value"], record["base_value"])


def collective_chart(entry: Mapping[str, Any]) -> str:
    """Measured time against message size for one fitted (kind, group size, level)
    (``calibrate``'s ``points["collectives"]`` entry), with the fitted line and the base's curve."""
    label = f"{entry['kind']} n={entry['group_size']} {entry['level'].replace('_', '-')}"
    pts = []
    for p in entry["points"]:
        fitted = entry["alpha_s"] + entry["beta_s_per_byte"] * p["size_bytes"]
        tip = (f"{label}, S = {fmt_bytes(p['size_bytes'])}: measured {fmt_s(p['measured_s'])} (median of {p['repeats']}), "
               f"fitted {fmt_s(fitted)} ({_err(fitted, p['measured_s'])}){_held(p)}")
        pts.append(ScatterPoint(p["size_bytes"], p["measured_s"], tip, HELD_COLOUR if p["held_out"] else FIT_COLOUR, p["held_out"]))
    curves = [Curve(f"fitted: alpha {fmt_s(entry['alpha_s'])}, busbw {entry['busbw_bytes_per_s'] / 1e9:.3g} GB/s",
                    tuple(map(tuple, entry["line"])), FIT_COLOUR)]  # type: ignore[arg-type]
    if entry.get("base_line"):
        curves.append(Curve("base preset's network model", tuple(map(tuple, entry["base_line"])), BASE_COLOUR, dashed=True))  # type: ignore[arg-type]
    legend = [("measured (median per size)", FIT_COLOUR, False)]
    if any(p["held_out"] for p in entry["points"]):
        legend.append(("held out", HELD_COLOUR, True))
    return loglog_chart(f"{label}: time by message size", "message size S (nccl-tests convention)", "kernel time", pts, curves,
                        x_fmt=lambda b: fmt_bytes(b, 3), legend=legend, x_base=2)
