"""The Validation page of ``python main.py validate``: one MkDocs Material page.

    DIR/site/index.html                 the page: per-source errors and targets, the
                                        leave-one-source-out refits, one chart and one table
                                        of cases per source
    DIR/site/charts/parity_SOURCE.svg   each source's chart as a file
    DIR/site/validation.csv, .json      the downloads (copies of what DIR holds)

Built the way the comparison page is (:mod:`dml2comm.site.compare`): :func:`validation_page`
turns the cases and the summary (the dict written as ``validation.json``) into a plain
context and the charts; ``templates/validate.md.j2`` renders it (autoescape on: case ids and
setups are escaped); :func:`build_validation_site` runs MkDocs (the repository's
``mkdocs.yml``, offline) into ``dest/site``; :func:`publish_validation` builds it beside ``out``
and moves the files and ``site/`` into place together (nothing in ``out`` changes on failure).
The charts skip MkDocs: a slot in the Markdown (:func:`~dml2comm.site.build.chart_slot`) is
replaced in the built HTML.

Every number on the page is read from the summary or the cases; each table cell carries the
exact value in ``data-value`` (so a test can check the page against ``validation.json``).
The charts are :func:`~dml2comm.render.parity.parity_chart`: predicted against measured on
log-log axes, the diagonal and the ±5% / ±10% bands, one point per case with its id in the
tooltip.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any, Mapping, Sequence

from dml2comm.fmt import fmt_bytes, fmt_s
from dml2comm.render.parity import DEFAULT_BANDS, ParityPoint, parity_chart
from dml2comm.site.build import MKDOCS_YML, TEMPLATES, build_pages_site, publish
from dml2comm.validate.cases import Case

__all__ = ["validation_page", "build_validation_site", "publish_validation", "chart_name", "quantity_unit", "LOSO_RATIO_MAX"]

#: Issue 18's target: no source's leave-one-source-out mean error above 1.5x its in-sample one.
LOSO_RATIO_MAX = 1.5
#: Sources with at most this many cases show their case table open.
OPEN_ROWS_MAX = 40

_TIME_UNITS = (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6), ("ns", 1e-9))


def chart_name(source: str) -> str:
    """The chart's file stem (``DIR/site/charts/NAME.svg``) and slot name of ``source``."""
    return f"parity_{source}"


def quantity_unit(cases: Sequence[Case]) -> tuple[str, float]:
    """(unit label, value per unit) for the charts of ``cases``: a time in the unit of its
    median measured value (s, ms, µs or ns), TFLOP/s as published, anything else as is."""
    quantities = {c.quantity for c in cases}
    if quantities and all(q.endswith("_time_s") for q in quantities):
        median = sorted(c.measured for c in cases)[len(cases) // 2]
        return next(((u, s) for u, s in _TIME_UNITS if median >= s), _TIME_UNITS[-1])
    if quantities == {"tflops_per_gpu"}:
        return "TFLOP/s per GPU", 1.0
    return ", ".join(sorted(quantities)), 1.0


def _value(quantity: str, x: float) -> str:
    if quantity.endswith("_time_s"):
        return fmt_s(x)
    if quantity == "tflops_per_gpu":
        return f"{x:.1f} TFLOP/s"
    if quantity.endswith("_bytes"):
        return fmt_bytes(x)
    return f"{x:.6g}"


def _pct(x: float | None, signed: bool = False) -> str:
    if x is None:
        return "-"
    return f"{x:+.1%}" if signed else f"{x:.1%}"


def _cell(x: float | None, signed: bool = False) -> dict[str, Any]:
    """A percentage cell: its text and the exact value (``data-value``)."""
    return {"text": _pct(x, signed), "value": "" if x is None else repr(float(x))}


def _line(text: str) -> str:
    """``text`` on one line (whitespace collapsed): a blank line would end the page's raw HTML
    block and let Markdown rewrite the rest of the table."""
    return " ".join(str(text).split())


def _band_class(error: float) -> str:
    """The error cell's class: green within the tightest band, red beyond the widest (the
    chart's colours, :func:`~dml2comm.render.parity.band_colour`)."""
    e = abs(error) - 1e-12
    return "d2c-ok-cell" if e <= min(DEFAULT_BANDS) else "d2c-over-cell" if e > max(DEFAULT_BANDS) else ""


def _tip(c: Case) -> str:
    return (f"{c.case_id}\nmeasured {_value(c.quantity, c.measured)}, predicted {_value(c.quantity, c.predicted)}, "
            f"error {c.error:+.1%}" + (f"\n{c.setup}" if c.setup else ""))


def _stats_row(label: str, s: Mapping[str, Any]) -> dict[str, Any]:
    return {"label": label, "count": s["count"], "mean": _cell(s["mean_abs_error"]), "median": _cell(s["median_abs_error"]),
            "signed": _cell(s["signed_mean_error"], True), "worst": _cell(s["worst_error"], True), "worst_case": _line(s["worst_case"] or "-")}


def _loso_rows(loso: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for r in loso:
        inside, left_out = r["in_sample_mean_abs_error"], r["loso_mean_abs_error"]
        ratio = left_out / inside if inside and left_out is not None else None
        rows.append({
            "source": r["source"], "shipped": _cell(r["shipped_mean_abs_error"]),
            "in_sample": _cell(inside), "in_scale": "-" if r["in_sample_scale"] is None else f"{r['in_sample_scale']:.3f}",
            "loso": _cell(left_out), "loso_scale": "-" if r["loso_scale"] is None else f"{r['loso_scale']:.3f}",
            "fitted_on": ", ".join(r["loso_fitted_on"]) or "-",
            "ratio": "-" if ratio is None else f"{ratio:.2f}×", "ratio_value": "" if ratio is None else repr(ratio),
            "met": None if ratio is None else ratio <= LOSO_RATIO_MAX,
        })
    return rows


def validation_page(cases: Sequence[Case], summary: Mapping[str, Any], downloads: Sequence[str] = ()) -> tuple[dict[str, Any], dict[str, str]]:
    """(template context, charts {name: svg}) of the page, from every case and the summary
    dict of :func:`dml2comm.validate.run.validate` (``validation.json``)."""
    by_source: dict[str, list[Case]] = {name: [] for name in summary["sources"]}
    for c in cases:
        by_source.setdefault(c.source, []).append(c)
    charts: dict[str, str] = {}
    sources, table = [], []
    for name, s in summary["sources"].items():
        picked = by_source.get(name, [])
        met = s.get("target_met")
        table.append({"name": name, "title": s["title"], **_stats_row(name, s), "target": s["target"],
                      "met": met, "check": s.get("target_check") or "",
                      "subsets": [_stats_row(sub["label"], sub) for sub in s["subsets"].values()]})
        chart = None
        if picked:
            unit, per = quantity_unit(picked)
            points = [ParityPoint(c.measured / per, c.predicted / per, c.case_id, _tip(c)) for c in picked]
            chart = chart_name(name)
            charts[chart] = parity_chart(points, unit, f"{name}: predicted against measured ({len(points)} cases)")
        sources.append({
            "name": name, "title": s["title"], "quantity": s["quantity"] or "-", "count": s["count"], "target": s["target"],
            "met": met, "check": s.get("target_check") or "", "chart": chart,
            "open": len(picked) <= OPEN_ROWS_MAX,
            "cases": [{"id": _line(c.case_id), "setup": _line(c.setup), "measured": _value(c.quantity, c.measured), "measured_value": repr(c.measured),
                       "predicted": _value(c.quantity, c.predicted), "predicted_value": repr(c.predicted),
                       "error": _cell(c.error, True), "band": _band_class(c.error)}
                      for c in picked],
        })
    judged = [t["met"] for t in table if t["met"] is not None]
    const = summary.get("fitted_constant") or {}
    ctx = {
        "sample": summary.get("sample"), "error_definition": summary.get("error_definition", "predicted / measured - 1"),
        "table": table, "sources": sources, "loso": _loso_rows(summary.get("loso") or []), "loso_ratio_max": f"{LOSO_RATIO_MAX:g}×",
        "constant": const, "downloads": list(downloads), "num_cases": len(cases),
        "targets_met": sum(judged), "targets_judged": len(judged),
    }
    return ctx, charts


def build_validation_site(dest: Path, ctx: Mapping[str, Any], charts: Mapping[str, str], downloads: Mapping[str, str] = {},
                          templates: Path = TEMPLATES, mkdocs_yml: Path = MKDOCS_YML) -> None:
    """Write ``dest/site`` (:func:`dml2comm.site.build.build_pages_site`)."""
    build_pages_site(dest, [("index", "Validation", "validate.md.j2", ctx)], "dml2comm validation", charts=charts, files=downloads,
                     templates=templates, mkdocs_yml=mkdocs_yml)


def publish_validation(out: Path, files: Mapping[str, str], cases: Sequence[Case] | None = None,
                       summary: Mapping[str, Any] | None = None) -> None:
    """Write ``files`` (validation.csv and .json) and, given ``cases`` and ``summary``, the site
    built from them (carrying copies of the files as downloads) into ``out`` atomically: staged
    in a temporary folder inside ``out``, then moved into place; nothing in ``out`` changes when
    the build fails."""
    out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".dml2comm-", dir=out))
    try:
        names = list(files)
        if cases is not None and summary is not None:
            ctx, charts = validation_page(cases, summary, downloads=list(files))
            build_validation_site(staging, ctx, charts, files)
            names.append("site")
        for name, text in files.items():
            (staging / name).write_text(text, encoding="utf-8")
        publish(staging, out, names)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
