"""Run Graphviz on :class:`~dml2comm.render.dot.Drawing` objects: parallel, cached, annotated.

- **Cached**: layouts are keyed by the SHA-256 of the DOT text; alike drawings (transformer
  blocks, identical stages) are laid out once.  A :class:`LayoutCache` can be shared by several
  calls in one process.
- **Parallel**: distinct layouts run as ``dot -Tsvg`` processes from a thread pool
  (``jobs`` workers, default the CPU count); threads only wait on the processes.
- **Annotated**: after layout each node/edge group ``<g id="n17">`` gets its tooltip as its
  ``<title>`` (XML-escaped here) and, when it links somewhere, its shapes are wrapped in
  ``<a xlink:href="page:KEY">``.  :func:`resolve_links` turns those page keys into file names,
  ``KEY.html`` for the site or the target's ``.svg`` in ``svg_file/``.

Raises :class:`~dml2comm.errors.Dml2CommError` when ``dot`` is missing or fails.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Sequence
from xml.sax.saxutils import escape, quoteattr

from dml2comm.errors import Dml2CommError
from dml2comm.render.dot import Annotation, Drawing
from dml2comm.fmt import printable

__all__ = ["GraphvizError", "LayoutCache", "RenderStats", "find_dot", "render", "resolve_links", "DOT_MISSING"]

DOT_MISSING = (
    "Graphviz `dot` not found: install it with apt-get install graphviz "
    "(or make sure the Graphviz executables are on your PATH)"
)


class GraphvizError(Dml2CommError, OSError):
    """Graphviz is missing or could not lay out a drawing."""


def find_dot() -> str:
    """Path of the ``dot`` executable; :class:`GraphvizError` when it is not on PATH."""
    path = shutil.which("dot")
    if path is None:
        raise GraphvizError(DOT_MISSING)
    return path


@dataclass
class LayoutCache:
    """SVG text of laid-out DOT, keyed by the SHA-256 of the DOT text (thread-safe)."""

    svgs: dict[str, str] = field(default_factory=dict)
    layouts_run: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def get(self, key: str) -> str | None:
        with self._lock:
            return self.svgs.get(key)

    def put(self, key: str, svg: str) -> None:
        with self._lock:
            self.svgs[key] = svg
            self.layouts_run += 1


@dataclass(frozen=True)
class RenderStats:
    drawings: int
    layouts_run: int
    cache_hits: int


def _key(dot: str) -> str:
    return hashlib.sha256(dot.encode("utf-8")).hexdigest()


def _layout(dot_exe: str, dot: str, name: str) -> str:
    try:
        proc = subprocess.run([dot_exe, "-Tsvg"], input=dot.encode("utf-8"), capture_output=True, timeout=300, check=False)
    except FileNotFoundError as exc:
        raise GraphvizError(DOT_MISSING) from exc
    except subprocess.TimeoutExpired as exc:
        raise GraphvizError(f"Graphviz took more than 300 s to lay out {name}.svg; the drawing is too large") from exc
    if proc.returncode != 0:
        first = (proc.stderr.decode("utf-8", "replace").strip().splitlines() or ["no message"])[0]
        raise GraphvizError(f"Graphviz failed on {name}.svg: {first}")
    return proc.stdout.decode("utf-8")


def render(drawings: Sequence[Drawing], jobs: int | None = None, cache: LayoutCache | None = None,
           on_layout: Callable[[int, int], None] | None = None) -> tuple[dict[str, str], RenderStats]:
    """Lay out and annotate ``drawings``; returns ``{drawing.name: svg text}`` and statistics.

    Hrefs in the result are ``page:KEY``; pass the text through :func:`resolve_links`.
    ``on_layout(done, total)`` is called once with ``done = 0`` before the first layout and after
    each layout that ran (from the worker threads; ``total`` counts distinct layouts, not cache hits).
    """
    cache = cache if cache is not None else LayoutCache()
    before = cache.layouts_run
    keys = [_key(d.dot) for d in drawings]
    todo: dict[str, Drawing] = {}
    for k, d in zip(keys, drawings):
        if cache.get(k) is None and k not in todo:
            todo[k] = d
    if todo:
        dot_exe = find_dot()
        workers = max(1, min(jobs or os.cpu_count() or 1, len(todo)))
        done = [0]
        done_lock = threading.Lock()
        if on_layout is not None:
            on_layout(0, len(todo))

        def work(item: tuple[str, Drawing]) -> None:
            k, d = item
            cache.put(k, _layout(dot_exe, d.dot, d.name))
            if on_layout is not None:
                with done_lock:
                    done[0] += 1
                    on_layout(done[0], len(todo))

        if workers == 1:
            for item in todo.items():
                work(item)
        else:
            with ThreadPoolExecutor(max_workers=workers) as pool:
                list(pool.map(work, todo.items()))
    out = {d.name: annotate(cache.get(k) or "", d) for k, d in zip(keys, drawings)}
    run = cache.layouts_run - before
    return out, RenderStats(drawings=len(drawings), layouts_run=run, cache_hits=len(drawings) - run)


_G_OPEN = re.compile(r'^<g id="([A-Za-z0-9_]+)" class="(node|edge|cluster)">$')
_TITLE = re.compile(r"^<title>.*</title>$")


def annotate(svg: str, drawing: Drawing) -> str:
    """Put tooltips and links of ``drawing.annotations`` into Graphviz's SVG output.

    Graphviz writes one element per line: ``<g id=.. class="node">``, ``<title>``, shapes and
    text, ``</g>`` (no nested groups, since the DOT carries no URL or tooltip attributes).
    Comments (which repeat node ids) and the XML prologue are dropped.
    """
    notes: Mapping[str, Annotation] = drawing.annotations
    out: list[str] = []
    lines = svg.splitlines()
    i = 0
    in_comment = False
    while i < len(lines):
        line = lines[i]
        i += 1
        if in_comment:
            if line.endswith("-->"):
                in_comment = False
            continue
        if line.startswith("<!--"):
            in_comment = not line.endswith("-->")
            continue
        if line.startswith(("<?xml", "<!DOCTYPE", ' "http://www.w3.org')):
            continue
        if line == "<title>G</title>":
            out.append(f"<title>{escape(printable(drawing.title))}</title>")
            continue
        m = _G_OPEN.match(line)
        if not m:
            out.append(line)
            continue
        gid, cls = m.group(1), m.group(2)
        out.append(f'<g id="{gid}" class="{cls}">')
        note = notes.get(gid)
        if i < len(lines) and _TITLE.match(lines[i]):
            i += 1
            if note is not None and note.tooltip:
                out.append(f"<title>{escape(printable(note.tooltip))}</title>")
        body: list[str] = []
        while i < len(lines) and lines[i] != "</g>":
            body.append(lines[i])
            i += 1
        i += 1  # the closing </g>
        if note is not None and note.href:
            out.append(f'<a xlink:href={quoteattr("page:" + note.href)} class="d2c-link">')
            out.extend(body)
            out.append("</a>")
        else:
            out.extend(body)
        out.append("</g>")
    return "\n".join(out) + "\n"


_HREF = re.compile(r'xlink:href="page:([A-Za-z0-9_]+)"')


def resolve_links(svg: str, target: Callable[[str], str | None]) -> str:
    """Replace ``page:KEY`` hrefs by ``target(KEY)``; a ``None`` target removes the link.

    Page keys are synthetic (``[A-Za-z0-9_]``), so the substitution cannot meet model text.
    """

    def sub(m: re.Match[str]) -> str:
        href = target(m.group(1))
        return f'xlink:href="{href}"' if href else 'xlink:href="#"'

    text = _HREF.sub(sub, svg)
    # a link with no target is unwrapped so that nothing clickable leads nowhere
    return re.sub(r'<a xlink:href="#" class="d2c-link">\n(.*?)\n</a>\n', r"\1\n", text, flags=re.S)


def drawing_names(drawings: Iterable[Drawing]) -> dict[str, str]:
    """``{page key: svg name}`` for ``drawings``."""
    return {d.page: d.name for d in drawings}
