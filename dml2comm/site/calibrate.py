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

from dml2comm.calibrate.rows import class_rows, fitted_rows, guard_text
from dml2comm.render.calibration_charts import class_chart, collective_chart

__all__ = ["calibration_context", "calibration_svgs", "publish_calibration_site", "SAMPLES_FILE"]

#: The fitted samples' file in the site.
SAMPLES_FILE = "samples.json"


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
