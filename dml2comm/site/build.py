"""Build the drill-down site: page models -> Jinja2 -> Markdown -> ``mkdocs build`` -> publish.

:func:`build` writes ``svg_file/`` and ``site/`` into a fresh folder; :func:`build_and_publish`
does it in a temporary folder beside the output and moves ``data.json``, ``svg_file/`` and
``site/`` into place only when everything succeeded, so a failed build leaves the previous
outputs intact.

- Templates live in ``templates/`` at the repository top (one Jinja2 environment: autoescape on,
  StrictUndefined, the ``md`` filter for model text inside Markdown paragraphs).
- Each page is Markdown with its drawing inlined as SVG.  Links inside SVGs are written as
  relative ``PAGE.html`` (``use_directory_urls: false``), so the site works both served and
  opened from ``file://``; the SVGs in ``svg_file/`` link to each other as ``NAME.svg``.
- MkDocs runs through its Python API from this interpreter (never a global ``mkdocs``), with a
  per-run copy of the repository's ``mkdocs.yml``; its warnings fail the build.
- The generated charts (memory, timeline; :mod:`dml2comm.render.charts`) are written to
  ``svg_file/`` like the drawings and reach their pages after MkDocs has run: the Markdown
  holds a placeholder that :func:`_fill_slots` replaces in the built HTML (a timeline of
  thousands of boxes would otherwise cost seconds of Markdown and search indexing).
- ``trace.json`` (the Chrome trace of the simulated iteration) is copied into the site, so the
  timeline page's link works served and from ``file://``.
- Progress: :func:`build` reports the Graphviz layouts and one line before the MkDocs build to
  the ``progress`` it is given (:class:`SiteProgress`), and writes nothing itself; the command
  line draws them on stderr when it is a terminal (:mod:`dml2comm.cli.progress`).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Protocol, Sequence

import yaml
from jinja2 import Environment, FileSystemLoader, StrictUndefined, TemplateError
from markupsafe import Markup, escape

from dml2comm.analysis import Analysis
from dml2comm.errors import Dml2CommError
from dml2comm.render.dot import Drawing, all_drawings
from dml2comm.render.facts import Facts
from dml2comm.fmt import printable
from dml2comm.render.svg import LayoutCache, render, resolve_links
from dml2comm.site.pages import REPLICA_PAGES_MAX, Page, nav_of, page_models, site_charts
from dml2comm.site.references import preset_tables, reference_sections

__all__ = ["SiteError", "BuildStats", "environment", "md_text", "build", "build_and_publish", "publish", "mkdocs_build", "chart_slot",
           "build_pages_site", "SiteProgress", "TEMPLATES", "MKDOCS_YML"]

REPO = Path(__file__).resolve().parents[2]
TEMPLATES = REPO / "templates"
MKDOCS_YML = REPO / "mkdocs.yml"


class SiteError(Dml2CommError, OSError):
    """The site could not be built or published."""


@dataclass(frozen=True)
class BuildStats:
    pages: int
    drawings: int
    layouts_run: int
    svg_seconds: float
    mkdocs_seconds: float
    total_seconds: float


# ---------------------------------------------------------------------------------------------
# Jinja2
# ---------------------------------------------------------------------------------------------

_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+\-.!])")


def md_text(value: object) -> Markup:
    """Model text for a Markdown paragraph: whitespace collapsed, Markdown punctuation
    backslash-escaped (so ``*`` or ``_`` in a name stays literal), then HTML-escaped."""
    text = " ".join(printable(value).split())
    return Markup(escape(_MD_SPECIAL.sub(r"\\\1", text)))


def _printable(value: object) -> object:
    """Jinja ``finalize``: every string a template prints (a model's op or dim name) with its
    control characters replaced (:func:`dml2comm.fmt.printable`), before autoescape."""
    if isinstance(value, Markup):
        return Markup(printable(value))
    return printable(value) if isinstance(value, str) else value


def environment(templates: Path = TEMPLATES) -> Environment:
    """The one Jinja2 environment of the site."""
    env = Environment(
        loader=FileSystemLoader(str(templates)),
        autoescape=True,
        undefined=StrictUndefined,
        keep_trailing_newline=True,
        finalize=_printable,
    )
    env.filters["md"] = md_text
    return env


# ---------------------------------------------------------------------------------------------
# SVG for pages
# ---------------------------------------------------------------------------------------------

_SVG_OPEN = re.compile(r'<svg width="([0-9.]+)pt" height="([0-9.]+)pt"')


def inline_svg(svg: str, pages: set[str]) -> Markup:
    """An annotated SVG made ready to sit inside a page: links to ``PAGE.html``, no fixed size
    (it scales down to the column, never up beyond its natural size), no blank lines."""
    text = resolve_links(svg, lambda key: f"{key}.html" if key in pages else None)

    def size(m: re.Match[str]) -> str:
        width_px = float(m.group(1)) * 4 / 3
        return f'<svg class="d2c-svg" style="max-width:{width_px:.0f}px" data-width="{width_px:.0f}"'

    text = _SVG_OPEN.sub(size, text, count=1)
    return Markup("\n".join(line for line in text.splitlines() if line.strip()))


# ---------------------------------------------------------------------------------------------
# Build
# ---------------------------------------------------------------------------------------------


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def mkdocs_build(config_path: Path) -> None:
    """Run MkDocs on ``config_path`` (an ``mkdocs.yml``), treating any warning it logs as an error.

    Raises
    ------
    SiteError
        MkDocs failed, or logged a warning (the first one is quoted).
    """
    from mkdocs.commands.build import build as run_mkdocs
    from mkdocs.config import load_config
    from mkdocs.exceptions import MkDocsException

    logger = logging.getLogger("mkdocs")
    handler = _Collect()
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
    try:
        cfg = load_config(config_file=str(config_path))
        run_mkdocs(cfg)
    except (MkDocsException, OSError, ValueError) as exc:
        raise SiteError(f"mkdocs could not build the site: {exc}") from exc
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    if handler.messages:
        raise SiteError(f"mkdocs warned while building the site: {handler.messages[0]}")
    _relative_404(Path(cfg["site_dir"]) / "404.html")


#: what MkDocs writes root-absolute into ``404.html`` when no ``site_url`` is set: its links and
#: assets, and Material's ``base`` and search-worker path
_ROOT_ABSOLUTE = re.compile(r'((?:href|src)="|"(?:base|search)": ")/(?!/)')


def _relative_404(page: Path) -> None:
    """Make ``404.html``'s root-absolute paths relative (``/assets/x`` -> ``./assets/x``): the page
    sits at the site's root like every other page, so they point to the same files, and they work
    under ``file://`` and a server's sub-path too."""
    if page.is_file():
        html = page.read_text(encoding="utf-8")
        page.write_text(_ROOT_ABSOLUTE.sub(r"\1./", html).replace('"base": "./"', '"base": "."'), encoding="utf-8")


def _site_name(analysis: Analysis) -> str:
    # MkDocs puts site_name into HTML without escaping: keep only plain characters of the model name
    name = re.sub(r"[^A-Za-z0-9 ._-]+", "", str(analysis.model_info.get("name") or ""))[:60].strip()
    return f"dml2comm: {name}" if name else "dml2comm"


def build_pages_site(dest: Path, pages: Sequence[tuple[str, str, str, Mapping[str, Any]]], site_name: str, *,
                     charts: Mapping[str, str] = {}, files: Mapping[str, str | bytes] = {}, templates: Path = TEMPLATES,
                     mkdocs_yml: Path = MKDOCS_YML) -> None:
    """Write ``dest/site``: the small MkDocs Material sites of the commands other than the analysis
    (sweep/compare, trace, validate, calibrate) built one way.

    ``pages``: (file stem, nav title, template, context) each, rendered with the site's Jinja2
    environment (:func:`environment`: autoescape, StrictUndefined); ``charts``: SVGs by name, each
    placed where its page wrote :func:`chart_slot` after MkDocs has built the page (the context
    gets ``charts``: name -> slot) and also written to ``charts/NAME.svg``; ``files``: copied
    into the site as they are (downloads).  The work folder ``dest/.docs`` and the MkDocs
    configuration are removed at the end.

    Raises
    ------
    SiteError
        A template or the MkDocs configuration fails, or a built page lost a chart's slot.
    """
    docs = dest / ".docs"
    docs.mkdir(parents=True, exist_ok=True)
    shutil.copytree(templates / "assets", docs / "assets")
    if charts:
        (docs / "charts").mkdir()
        for name, svg in charts.items():
            (docs / "charts" / f"{name}.svg").write_text('<?xml version="1.0" encoding="UTF-8" standalone="no"?>\n' + svg,
                                                       encoding="utf-8")
    for name, content in files.items():
        if isinstance(content, bytes):
            (docs / name).write_bytes(content)
        else:
            (docs / name).write_text(content, encoding="utf-8")
    env = environment(templates)
    slots = {name: Markup(chart_slot(name)) for name in charts}
    for stem, title, template, context in pages:
        try:
            text = env.get_template(template).render(**dict(context, charts=slots) if charts else context)
        except Exception as exc:  # jinja2.TemplateError and StrictUndefined's UndefinedError
            raise SiteError(f"template {template} failed: {exc}") from exc
        (docs / f"{stem}.md").write_text(text, encoding="utf-8")
    try:
        base = yaml.safe_load(mkdocs_yml.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise SiteError(f"cannot read the site configuration {mkdocs_yml}: {exc}") from exc
    base.update({"docs_dir": str(docs.resolve()), "site_dir": str((dest / "site").resolve()), "site_name": site_name,
                 "nav": [{title: f"{stem}.md"} for stem, title, _, _ in pages]})
    config_path = (dest / ".mkdocs.yml").resolve()
    config_path.write_text(yaml.safe_dump(base, sort_keys=False, allow_unicode=True), encoding="utf-8")
    mkdocs_build(config_path)
    for name, svg in charts.items():
        for stem, *_ in pages:
            page = dest / "site" / f"{stem}.html"
            html = page.read_text(encoding="utf-8")
            count = html.count(chart_slot(name))
            if count:
                if count != 1:
                    raise SiteError(f"the built page {stem} holds the place of its chart {name} {count} times")
                page.write_text(html.replace(chart_slot(name), str(inline_svg(svg, set()))), encoding="utf-8")
                break
        else:
            raise SiteError(f"the built site lost the place of its chart {name}")
    shutil.rmtree(docs, ignore_errors=True)
    config_path.unlink(missing_ok=True)


def chart_slot(name: str) -> str:
    """Placeholder of the generated chart ``name`` in a page's Markdown (page keys are
    synthetic); replaced by the chart's SVG after MkDocs has built the page."""
    return f'<div class="d2c-slot" data-slot="{name}"></div>'


def _fill_slots(site_dir: Path, slots: Mapping[str, tuple[str, Markup]]) -> None:
    """Put each generated chart into its built page in place of its :func:`chart_slot`.

    The charts skip MkDocs: thousands of tooltip-carrying boxes (the timeline) would cost
    seconds of Markdown and search indexing for no search result anyone wants."""
    for key, (name, svg) in slots.items():
        path = site_dir / f"{key}.html"
        html = path.read_text(encoding="utf-8")
        if html.count(chart_slot(name)) != 1:
            raise SiteError(f"the built page {key}.html lost the place of its chart {name}")
        path.write_text(html.replace(chart_slot(name), str(svg)), encoding="utf-8")


def _render_pages(env: Environment, pages: Sequence[Page], svgs: Mapping[str, str], analysis: Analysis, docs: Path,
                  generated: frozenset[str] = frozenset()) -> dict[str, tuple[str, Markup]]:
    """Write every page's Markdown; returns the generated charts left as slots, by page key."""
    keys = {p.key for p in pages}
    extra: dict[str, Any] = {}
    slots: dict[str, tuple[str, Markup]] = {}
    for page in pages:
        ctx = dict(page.context)
        if page.key == "references":
            if not extra:
                extra = {"sections": reference_sections(), "presets": preset_tables(analysis)}
            ctx.update(extra)
        ctx["page"] = page
        ctx["svg"] = inline_svg(svgs[page.drawing], keys) if page.drawing else Markup("")
        if page.drawing in generated:
            slots[page.key] = (page.drawing, ctx["svg"])
            ctx["svg"] = Markup(chart_slot(page.drawing))
        try:
            text = env.get_template(page.template).render(**ctx)
        except TemplateError as exc:
            raise SiteError(f"template {page.template} failed for page {page.key}: {exc}") from exc
        (docs / f"{page.key}.md").write_text(text, encoding="utf-8")
    return slots


class SiteProgress(Protocol):
    """What a build reports its progress to (:class:`dml2comm.cli.progress.SiteProgress` draws it on
    a terminal): ``layout(done, total)`` as the Graphviz layouts finish, ``stop()`` after them,
    ``say(text)`` for a line (the layouts' time, the MkDocs build)."""

    def layout(self, done: int, total: int) -> None: ...

    def stop(self) -> None: ...

    def say(self, text: str) -> None: ...


class _Silent:
    """No progress (the default: the library writes nothing; the front end passes a reporter)."""

    def layout(self, done: int, total: int) -> None:
        pass

    def stop(self) -> None:
        pass

    def say(self, text: str) -> None:
        pass


def build(
    analysis: Analysis,
    dest: Path,
    *,
    jobs: int | None = None,
    replica_pages_max: int = REPLICA_PAGES_MAX,
    cache: LayoutCache | None = None,
    templates: Path = TEMPLATES,
    mkdocs_yml: Path = MKDOCS_YML,
    trace: str | None = None,
    progress: SiteProgress | None = None,
) -> BuildStats:
    """Write ``dest/svg_file/`` and ``dest/site/`` (plus the work folder ``dest/.docs``, removed
    at the end).  ``dest`` should be new or empty.  ``trace`` is the text of ``trace.json``
    (copied into the site for the timeline page; made from the analysis when not given).
    ``progress``: where the layouts' progress and the build's lines go (:class:`SiteProgress`;
    None, the default: nowhere)."""
    start = time.perf_counter()
    facts = Facts.of(analysis)
    drawings: list[Drawing] = all_drawings(facts, replica_pages_max)
    report = progress or _Silent()
    try:
        svgs, stats = render(drawings, jobs=jobs, cache=cache, on_layout=report.layout)
    finally:
        report.stop()
    svg_done = time.perf_counter()
    if stats.layouts_run:
        report.say(f"Graphviz: {len(drawings)} drawings, {stats.layouts_run} distinct layouts in {svg_done - start:.1f} s")
    svg_dir = dest / "svg_file"
    svg_dir.mkdir(parents=True, exist_ok=True)
    page_svg = {d.page: d.name for d in drawings}
    for d in drawings:
        text = resolve_links(svgs[d.name], lambda key: f"{page_svg[key]}.svg" if key in page_svg else None)
        (svg_dir / f"{d.name}.svg").write_text('<?xml version="1.0" encoding="UTF-8" standalone="no"?>\n' + text, encoding="utf-8")

    # the memory chart and the timeline are generated SVG (no Graphviz layout)
    charts = site_charts(facts)
    for chart in charts.values():
        svgs[chart.name] = chart.svg
        (svg_dir / f"{chart.name}.svg").write_text('<?xml version="1.0" encoding="UTF-8" standalone="no"?>\n' + chart.svg,
                                                   encoding="utf-8")

    pages = page_models(facts, drawings, replica_pages_max, charts)
    docs = dest / ".docs"
    docs.mkdir(parents=True, exist_ok=True)
    shutil.copytree(templates / "assets", docs / "assets")
    # the timeline page links to the Chrome trace: it travels inside the site (works from file://)
    if trace is None and analysis.timeline is not None:
        from dml2comm.export.chrome_trace import trace_json

        trace = trace_json(analysis, analysis.timeline)
    if trace is not None:
        (docs / "trace.json").write_text(trace, encoding="utf-8")
    slots = _render_pages(environment(templates), pages, svgs, analysis, docs, frozenset(c.name for c in charts.values()))
    try:
        base = yaml.safe_load(mkdocs_yml.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise SiteError(f"cannot read the site configuration {mkdocs_yml}: {exc}") from exc
    # absolute paths: MkDocs resolves relative ones against the config file's folder (--out out)
    base.update({"docs_dir": str(docs.resolve()), "site_dir": str((dest / "site").resolve()), "site_name": _site_name(analysis),
                 "nav": nav_of(pages)})
    config_path = (dest / ".mkdocs.yml").resolve()
    config_path.write_text(yaml.safe_dump(base, sort_keys=False, allow_unicode=True), encoding="utf-8")
    mk_start = time.perf_counter()
    report.say(f"building the site with MkDocs: {len(pages)} pages")
    mkdocs_build(config_path)
    _fill_slots(dest / "site", slots)
    end = time.perf_counter()
    shutil.rmtree(docs, ignore_errors=True)
    config_path.unlink(missing_ok=True)
    return BuildStats(
        pages=len(pages),
        drawings=len(drawings) + len(charts),
        layouts_run=stats.layouts_run,
        svg_seconds=svg_done - start,
        mkdocs_seconds=end - mk_start,
        total_seconds=end - start,
    )


# ---------------------------------------------------------------------------------------------
# Atomic publish
# ---------------------------------------------------------------------------------------------


def publish(staging: Path, out: Path, names: Sequence[str]) -> None:
    """Move ``staging/NAME`` to ``out/NAME`` for every name, replacing what is there.

    What is already in ``out`` is first moved aside inside ``staging`` (a rename on the same
    file system), then the new file or folder is renamed into place.  If a step fails, the new
    ones are removed and the old ones put back, so ``out`` holds either the old or the new
    outputs, never a mix.
    """
    aside: list[tuple[Path, Path]] = []
    placed: list[Path] = []
    try:
        for name in names:
            src, dst = staging / name, out / name
            if dst.exists() or dst.is_symlink():
                old = staging / f".old-{name}"
                os.replace(dst, old)
                aside.append((old, dst))
            os.replace(src, dst)
            placed.append(dst)
    except OSError as exc:
        for dst in placed:
            if dst.is_dir() and not dst.is_symlink():
                shutil.rmtree(dst, ignore_errors=True)
            else:
                dst.unlink(missing_ok=True)
        for old, dst in aside:
            if not dst.exists():
                os.replace(old, dst)
        raise SiteError(f"could not publish into {out}: {exc}") from exc


def build_and_publish(analysis: Analysis, out: Path, files: Mapping[str, str], **kwargs: Any) -> BuildStats:
    """Build the site beside ``out``, then publish ``files`` (e.g. data.json), ``svg_file/`` and
    ``site/`` into ``out`` together.  Nothing in ``out`` changes when anything fails."""
    out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".dml2comm-", dir=out))
    try:
        kwargs.setdefault("trace", files.get("trace.json"))
        stats = build(analysis, staging, **kwargs)
        for name, text in files.items():
            (staging / name).write_text(text, encoding="utf-8")
        publish(staging, out, [*files, "svg_file", "site"])
        return stats
    finally:
        shutil.rmtree(staging, ignore_errors=True)
