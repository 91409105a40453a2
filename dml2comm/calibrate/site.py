"""The calibration page: what ``calibrate`` fitted, how well, on what, with scatter charts.

Page data (:func:`calibration_context`) -> the site's Jinja2 environment
(``templates/calibration.md.j2``, autoescape on) -> MkDocs, built the way the trace and
comparison pages are (:mod:`dml2comm.site.build`: ``environment``, ``inline_svg``,
``mkdocs_build``, ``publish``).  The site holds the cluster file and ``samples.json`` (the fitted
samples, one point per shape or size: :mod:`dml2comm.calibrate.points`) for download, so the
charts can be redrawn or checked.  Strings from the traces (file names, operator names, versions)
are escaped by the templates and by :class:`~dml2comm.render.charts.Svg`.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any, Mapping

from markupsafe import Markup

from dml2comm.calibrate.charts import class_chart, collective_chart
from dml2comm.fmt import fmt_bytes, fmt_s

__all__ = ["calibration_context", "calibration_svgs", "publish_calibration_site", "fitted_rows", "class_rows", "guard_text",
           "SAMPLES_FILE"]

#: The fitted samples' file in the site.
SAMPLES_FILE = "samples.json"


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _res(term: Mapping[str, Any]) -> dict[str, str]:
    r, h = term.get("residual") or {}, term.get("holdout") or {}
    return {"samples": str(r.get("samples", "")), "shapes": str(r.get("shapes", "")), "median": _pct(r.get("median_rel_error")),
            "worst": _pct(r.get("worst_rel_error")),
            "held": f"{h['shapes']} shapes: {_pct(h['median_rel_error'])} / {_pct(h['worst_rel_error'])}" if h else "not held out"}


def class_rows(record: Mapping[str, Any]) -> list[dict[str, str]]:
    """One row per kernel class of a calibration record (``classes``,
    :class:`dml2comm.calibrate.classes.ClassFit`): ``constant``, ``value``, ``base``, ``samples``,
    ``shapes``, ``median``, ``worst``, ``held`` (held-out median, and the base's on the same
    shapes), ``used`` (yes/no) and ``why``."""
    rows = []
    for c in record.get("classes") or []:
        h, b = c.get("holdout"), c.get("base_holdout")
        shapes = "" if not h else f"{h['shapes']} shape{'' if h['shapes'] == 1 else 's'}"
        held = "not held out" if not h else (f"{shapes}: {_pct(h['median_rel_error'])} (base {_pct(b['median_rel_error'])})"
                                              if b else f"{shapes}: {_pct(h['median_rel_error'])}")
        res = _res(c)
        rows.append({"constant": f"gpu.calibrated_classes.{c['class']}", "key": str(c["class"]), "label": str(c.get("label", "")),
                     "quantity": str(c.get("quantity", "")), "value": "not fitted" if c.get("value") is None else f"{c['value']:.4g}",
                     "base": f"{c['base_value']:.4g}", "samples": str(c.get("samples", 0)), "shapes": str(c.get("shapes", 0)),
                     "median": res["median"] if c.get("residual") else "n/a", "worst": res["worst"] if c.get("residual") else "n/a",
                     "held": held, "used": "used" if c.get("used") else "base kept", "why": str(c.get("why", ""))})
    return rows


def guard_text(guard: Mapping[str, Any] | None) -> str:
    """The step guard of a calibration record (:class:`dml2comm.calibrate.classes.StepGuard`) in
    one sentence, or "" (none: ``--holdout 0``, or a record written before the guard)."""
    if not guard:
        return ""
    m = guard["measured_s"]
    text = (f"Summed kernel time of every class: measured {m * 1e3:.2f} ms, the base {guard['base_s'] / m - 1:+.1%}, "
            f"with the values used {guard['used_s'] / m - 1:+.1%}.")
    if guard.get("dropped"):
        text += (" Left at the base although better on their own held-out shapes (each moves the sum away from the "
                 "measured one): " + ", ".join(f"{k} ({guard['effects_s'][k] * 1e3:+.2f} ms)" for k in guard["dropped"]) + ".")
    return text


def fitted_rows(record: Mapping[str, Any]) -> list[dict[str, str]]:
    """One row per fitted value of a calibration record: ``constant``, ``value``, ``base``,
    ``samples``, ``shapes``, ``median``, ``worst`` (relative errors on the fitted samples) and
    ``held`` (held-out shapes: median / worst).  Kernel classes (:func:`class_rows`) give their
    value, or the base's with the reason where the base was kept; the single GPU values of files
    written before the classes give theirs.  Collectives give their latency and bus bandwidth,
    and their time at the reference sizes against the base's
    (:data:`dml2comm.calibrate.base.REFERENCE_SIZES`)."""
    fitted = record.get("fitted") or {}
    rows = [{k: r[k] for k in ("constant", "value", "base", "samples", "shapes", "median", "worst")}
            | {"held": f"{r['held']}; {r['used']}: {r['why']}"} for r in class_rows(record)]
    g = fitted.get("gemm_sustained_factor")
    if g:
        rows.append({"constant": "gpu.gemm_sustained_factor", "value": f"{g['gemm_sustained_factor']:.4g}",
                     "base": f"{g['base_value']:.4g}" if g.get("base_value") is not None else "n/a", **_res(g)})
    h = fitted.get("hbm_efficiency")
    if h:
        rows.append({"constant": "gpu.hbm_efficiency", "value": f"{h['hbm_efficiency']:.4g}",
                     "base": f"{h['base_value']:.4g}" if h.get("base_value") is not None else "n/a", **_res(h)})
    for c in fitted.get("collectives") or []:
        label = f"{c['kind']} n={c['group_size']} {str(c['level']).replace('_', '-')}"
        ref = c.get("reference_times_s") or []
        value = f"alpha {fmt_s(c['alpha_s'])}, busbw {c['busbw_bytes_per_s'] / 1e9:.3g} GB/s"
        at = "; ".join(f"{fmt_bytes(r['size_bytes'], 3)}: {fmt_s(r['fitted_s'])}" for r in ref)
        base = "; ".join(f"{fmt_bytes(r['size_bytes'], 3)}: {fmt_s(r['base_s'])}" for r in ref) or "link model"
        rows.append({"constant": f"collective {label}", "value": value + (f" ({at})" if at else ""), "base": base, **_res(c)})
    return rows


def calibration_svgs(points: Mapping[str, Any], record: Mapping[str, Any]) -> dict[str, tuple[str, str]]:
    """The page's charts by name (``class_NAME`` per fitted kernel class, ``collective_N``): (title, SVG)."""
    svgs: dict[str, tuple[str, str]] = {}
    for c in record.get("classes") or []:
        pts = (points.get("classes") or {}).get(c["class"])
        if pts and c.get("value") is not None:
            verdict = "used" if c.get("used") else "base kept"
            svgs[f"class_{c['class']}"] = (f"{c.get('label', c['class'])}: {c.get('quantity', '')} ({verdict})",
                                           class_chart(c, pts))
    for i, entry in enumerate(points.get("collectives") or []):
        label = f"{entry['kind']} over {entry['group_size']} ranks, {str(entry['level']).replace('_', '-')}"
        svgs[f"collective_{i}"] = (f"Collective time by size: {label}", collective_chart(entry))
    return svgs


def calibration_context(document: Mapping[str, Any], file_name: str, sha256: str, svgs: Mapping[str, tuple[str, str]]) -> dict[str, Any]:
    """Page data of a cluster-file document written by ``calibrate``."""
    record = document.get("calibration") or {}
    gpu = record.get("gpu") or {}
    traces = [{"file": t["file"], "sha256": t["sha256"], "rank": t.get("rank"), "world": t.get("world_size") or "n/a",
               "versions": ", ".join(f"{k} {v}" for k, v in sorted((t.get("versions") or {}).items())) or "none recorded"}
              for t in record.get("traces") or []]
    charts = [{"name": n, "title": title} for n, (title, _) in svgs.items()]
    return {
        "file": file_name, "sha256": sha256, "date": record.get("date", ""), "base": record.get("base") or "none",
        "gpu": (document.get("gpu") or {}).get("name", ""), "identified_by": gpu.get("identified_by", ""),
        "holdout": f"{100 * record['holdout']:.0f}% of the shapes (sizes) held out of each fit" if record.get("holdout")
        else "none (--holdout 0)",
        "traces": traces, "rows": [r for r in fitted_rows(record) if not r["constant"].startswith("gpu.calibrated_classes.")],
        "classes": class_rows(record), "guard": guard_text(record.get("step_guard")), "from_base": list(record.get("from_base") or []),
        "warnings": list(record.get("warnings") or []), "charts": charts, "samples_file": SAMPLES_FILE,
    }


def _build(dest: Path, context: Mapping[str, Any], svgs: Mapping[str, str], downloads: Mapping[str, str]) -> None:
    """Write ``dest/site`` (:func:`dml2comm.site.build.build_pages_site`; the charts are inlined
    through the context's ``svg``)."""
    from dml2comm.site.build import build_pages_site, inline_svg

    ctx = dict(context)
    ctx["svg"] = {name: inline_svg(text, set()) for name, text in svgs.items()}
    ctx["empty"] = Markup("")
    build_pages_site(dest, [("index", "Calibration", "calibration.md.j2", dict(ctx, page_title="Calibration"))],
                     "dml2comm: calibration", files=downloads)


def publish_calibration_site(site_dir: Path, document: Mapping[str, Any], points: Mapping[str, Any], yaml_name: str,
                             yaml_text: str, sha256: str) -> None:
    """Build the page into a staging folder beside ``site_dir`` and move it into place (what was
    at ``site_dir`` is replaced only when the build succeeded)."""
    from dml2comm.site.build import publish

    record = document.get("calibration") or {}
    svgs = calibration_svgs(points, record)
    context = calibration_context(document, yaml_name, sha256, svgs)
    downloads = {yaml_name: yaml_text, SAMPLES_FILE: json.dumps(points, sort_keys=True, indent=1) + "\n"}
    parent = site_dir.parent
    parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".dml2comm-", dir=parent))
    try:
        _build(staging, {**context, "yaml_name": yaml_name}, {n: svg for n, (_, svg) in svgs.items()}, downloads)
        if site_dir.name != "site":
            (staging / "site").rename(staging / site_dir.name)
        publish(staging, parent, [site_dir.name])
    finally:
        shutil.rmtree(staging, ignore_errors=True)
