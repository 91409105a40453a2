"""The trace pages of the site: page data -> the site's Jinja2 environment -> MkDocs.

Reuses the drill-down site's machinery (:mod:`dml2comm.site.build`: one Jinja2 environment with
autoescape and StrictUndefined, the MkDocs build through its Python API, the atomic publish) and
its assets; the pages are ``templates/trace.md.j2`` (overview, predicted vs measured) and
``templates/trace_timeline.md.j2`` (Gantt charts per pipeline group and per model replica,
micro-batch bars).  The drawings are
inlined SVG; every string from a trace is escaped (autoescape in the templates,
:func:`~dml2comm.render.charts.xml_text` in the SVG).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any, Mapping

from markupsafe import Markup

__all__ = ["build_trace_site", "publish_trace_outputs"]

PAGES = (("index", "Trace analysis", "trace.md.j2"), ("timeline", "Pipeline timeline", "trace_timeline.md.j2"))


def build_trace_site(dest: Path, context: Mapping[str, Any], svgs: Mapping[str, str]) -> None:
    """Write ``dest/site`` (:func:`dml2comm.site.build.build_pages_site`; the drawings are inlined
    through the context's ``svg``)."""
    from dml2comm.site.build import build_pages_site, inline_svg

    ctx = dict(context)
    ctx["svg"] = {name: inline_svg(text, set()) for name, text in svgs.items()}
    ctx["empty"] = Markup("")
    build_pages_site(dest, [(key, title, template, dict(ctx, page_title=title)) for key, title, template in PAGES], "dml2comm: traces")


def publish_trace_outputs(out: Path, files: Mapping[str, str | bytes], context: Mapping[str, Any] | None,
                          svgs: Mapping[str, str]) -> None:
    """Write ``files``, ``svg_file/`` and (``context`` not None) ``site/`` beside ``out``, then move
    them into place together; nothing in ``out`` changes when a step fails."""
    from dml2comm.site.build import publish

    out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".dml2comm-", dir=out))
    try:
        names = list(files)
        for name, data in files.items():
            path = staging / name
            if isinstance(data, bytes):
                path.write_bytes(data)
            else:
                path.write_text(data, encoding="utf-8")
        if context is not None:  # --no-site: the JSON and Parquet files only, as its help says
            svg_dir = staging / "svg_file"
            svg_dir.mkdir()
            for name, text in svgs.items():
                (svg_dir / f"{name}.svg").write_text('<?xml version="1.0" encoding="UTF-8" standalone="no"?>\n' + text, encoding="utf-8")
            names.append("svg_file")
            build_trace_site(staging, context, svgs)
            names.append("site")
        publish(staging, out, names)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
