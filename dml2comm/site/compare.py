"""The comparison site of ``sweep``, ``sweep --scaling`` and ``compare``: one MkDocs page.

    DIR/site/index.html     the comparison page (tables, "why the best wins", SVG charts)
    DIR/site/charts/*.svg   the charts as files
    DIR/site/*.csv, *.json  the downloads (copies of what DIR holds)

:func:`comparison_page` turns result rows (the dicts of :mod:`dml2comm.search.sweep`) into a
plain context; ``templates/compare.md.j2`` renders it (autoescape on: configuration and model
text is escaped); :func:`build_comparison` runs MkDocs (the site's ``mkdocs.yml``, offline, no
network) into ``dest/site``; :func:`build_and_publish_comparison` builds beside ``out`` and
moves the files and ``site/`` into place together (nothing in ``out`` changes on failure).
The charts skip MkDocs (a slot in the Markdown is replaced in the built HTML), as in
:mod:`dml2comm.site.build`.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Mapping, Sequence

from dml2comm.fmt import fmt_bytes, fmt_plural, fmt_s, fmt_s_band
from dml2comm.render.sweep_charts import (BreakdownBar, EfficiencyPoint, MemoryItem, ParetoPoint, breakdown_chart,
                                          efficiency_chart, memory_bars_chart, pareto_chart)
from dml2comm.search.explain import BREAKDOWN, breakdown, config_text, why_best
from dml2comm.search.sweep import pareto_front
from dml2comm.site.build import MKDOCS_YML, TEMPLATES, build_pages_site, publish

__all__ = ["comparison_page", "build_comparison", "build_and_publish_comparison", "BARS_MAX"]

#: Configurations drawn in the breakdown and memory charts of a sweep.
BARS_MAX = 15


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def _num(x: float | None, fmt: str = "{:.1f}") -> str:
    return "-" if x is None else fmt.format(x)


def micro_batches(m: Any) -> str:
    """``1 micro-batch``, ``4 micro-batches``."""
    return fmt_plural(m, "micro-batch", "micro-batches")


def site_href(rank: int | str) -> str:
    """The link from the comparison page (``DIR/site/index.html``) to the analysis site of the
    configuration ranked ``rank`` (``DIR/top/RANK/site/index.html``), or of a scaling study's
    folder (``DIR/top/16-gpus/site/index.html``)."""
    return f"../top/{rank}/site/index.html"


def _table_row(rank: Any, r: Mapping[str, Any], capacity: float | None, commands: Mapping[int, str] = {},
               sites: Mapping[int, int] = {}) -> dict[str, Any]:
    c = r["config"]
    parts = breakdown(r) if r.get("error") is None else {}
    site = sites.get(r.get("index"))  # type: ignore[arg-type]
    return {
        "command": commands.get(r.get("index"), ""), "site": site_href(site) if site else "",  # type: ignore[arg-type]
        "rank": rank, "config": config_text(c), "m": c.get("num_micro_batches"), "schedule": c.get("schedule"),
        "error": r.get("error") or "",
        "time": fmt_s(r.get("iteration_time_s")),
        "band": f"{r['expected_error']:.1%}" if r.get("expected_error") is not None else "",  # expected error: time ± band
        **{k: fmt_s(parts.get(k)) if parts else "-" for k, _ in BREAKDOWN},
        "tflops": _num(r.get("tflops_per_gpu")), "mfu": _pct(r.get("mfu")),
        "memory": fmt_bytes(r.get("peak_memory_bytes")), "fits": bool(r.get("fits")),
        "headroom": fmt_bytes(capacity - r["peak_memory_bytes"]) if capacity and r.get("peak_memory_bytes") is not None else "-",
        "bubble": _pct(r.get("bubble_fraction")), "spec": r.get("spec") or "",
    }


def _bars(labelled: Sequence[tuple[str, Mapping[str, Any], bool]]) -> tuple[list[BreakdownBar], list[MemoryItem]]:
    bars, mems = [], []
    for label, r, best in labelled:
        tip = f"{label}\n{config_text(r['config'])}, {micro_batches(r['config'].get('num_micro_batches'))}"
        bars.append(BreakdownBar(label, breakdown(r), r["iteration_time_s"], best=best, over=not r.get("fits"), tip=tip))
        mems.append(MemoryItem(label, r["peak_memory_bytes"], best=best, tip=tip))
    return bars, mems


def _pareto_points(rows: Sequence[Mapping[str, Any]], best: Mapping[str, Any] | None) -> list[ParetoPoint]:
    evaluated = [r for r in rows if r.get("error") is None and r.get("iteration_time_s")]
    front = {r["index"] for r in pareto_front(evaluated)}
    best_index = best["index"] if best else None
    return [ParetoPoint(r["peak_memory_bytes"], r["iteration_time_s"], bool(r["fits"]), r["index"] in front, r["index"] == best_index,
                        f"{config_text(r['config'])}\n{fmt_s(r['iteration_time_s'])}, {fmt_bytes(r['peak_memory_bytes'])} per GPU"
                        + ("" if r["fits"] else " (does not fit)") + (" · on the Pareto front" if r["index"] in front else ""))
            for r in evaluated]


def comparison_page(kind: str, rows: Sequence[Mapping[str, Any]], *, capacity_bytes: float | None, capacity_label: str = "",
                    model: Mapping[str, Any] | None = None, cluster: Mapping[str, Any] | None = None,
                    space: Mapping[str, Any] | None = None, sweep: Mapping[str, Any] | None = None,
                    scaling: Mapping[str, Any] | None = None, downloads: Sequence[str] = (), top: int = 10,
                    commands: Mapping[int, str] | None = None,
                    sites: Mapping[int, int | str] | None = None) -> tuple[dict[str, Any], dict[str, str]]:
    """(template context, charts {name: svg}) of the page.  ``kind``: ``sweep``, ``compare`` or ``scaling``.

    ``commands``: {row index: the main command line that analyses that row}, shown under its
    configuration; ``sites``: {row index: rank} of the rows whose analysis site was built into
    ``DIR/top/RANK`` (:mod:`dml2comm.search.reproduce`), linked from the tables.  For
    ``scaling`` both are keyed by GPU count (the count's best configuration), ``sites`` giving
    the folder under ``DIR/top`` (``16-gpus``)."""
    commands = commands or {}
    sites = sites or {}
    model = {"name": None, "path": None, "num_layers": None, "params": None, "seq_len": None, **(model or {})}
    cluster = {"name": None, "gpu": None, "num_gpus": None, "gpus_per_node": None, **(cluster or {})}
    ctx: dict[str, Any] = {"kind": kind, "model": model, "cluster": cluster, "downloads": list(downloads),
                           "capacity": fmt_bytes(capacity_bytes) if capacity_bytes else "-", "labels": [l for _, l in BREAKDOWN]}
    evaluated = [r for r in rows if r.get("error") is None and r.get("iteration_time_s")]
    ranked = sorted((r for r in evaluated if r.get("fits")), key=lambda r: (r["iteration_time_s"], r["index"]))
    best = ranked[0] if ranked else None
    ctx["why"] = why_best(rows, capacity_bytes)
    ctx["space"] = [(k, ", ".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v))
                    for k, v in (space or {}).items() if v is not None]
    if kind == "scaling":
        assert scaling is not None
        return ctx, _scaling_context(ctx, scaling, capacity_bytes, capacity_label, commands, sites)
    if kind == "sweep":
        shown = _sweep_context(ctx, ranked, evaluated, best, sweep or {}, top, capacity_bytes, commands, sites)
    else:
        shown = [(f"{r.get('spec') or config_text(r['config'])}", r, best is not None and r["index"] == best["index"]) for r in evaluated]
        ctx["all"] = [_table_row(i + 1, r, capacity_bytes, commands, sites) for i, r in enumerate(rows)]
        ctx["side"] = _side_by_side(rows, best, capacity_bytes)
    ctx["best"] = _table_row(1, best, capacity_bytes) if best else None
    by_index = {r["index"]: r for r in rows}
    ctx["sites"] = [{"rank": rank, "config": by_index[i].get("spec") or config_text(by_index[i]["config"]),
                     "time": fmt_s(by_index[i]["iteration_time_s"]), "href": site_href(rank), "command": commands.get(i, "")}
                    for i, rank in sorted(sites.items(), key=lambda kv: kv[1]) if i in by_index]
    ctx["cards"] = _best_cards(best, ctx["capacity"]) if best else []
    charts: dict[str, str] = {}
    bars, mems = _bars(shown)
    if bars:
        charts["breakdown"] = breakdown_chart(bars)
        charts["memory"] = memory_bars_chart(mems, capacity_bytes or max(m.peak_bytes for m in mems), capacity_label)
    if evaluated:
        charts["pareto"] = pareto_chart(_pareto_points(rows, best), capacity_bytes)
    return ctx, charts


def _best_cards(best: Mapping[str, Any], capacity: str) -> list[tuple[str, str, str]]:
    """The cards at the top: the best configuration that fits, its time, its throughput and its memory."""
    return [("best configuration", config_text(best["config"]), f"{micro_batches(best['config'].get('num_micro_batches'))}, "
             f"{best['config'].get('schedule')}"),
            ("iteration time", fmt_s(best["iteration_time_s"]), "of the best that fits"
             + (f", ± {best['expected_error']:.1%} expected error" if best.get("expected_error") is not None else "")),
            ("TFLOP/s per GPU", _num(best.get("tflops_per_gpu")), f"MFU {_pct(best.get('mfu'))}"),
            ("peak memory per GPU", fmt_bytes(best["peak_memory_bytes"]), f"of {capacity}")]


def _sweep_context(ctx: dict[str, Any], ranked: list[Mapping[str, Any]], evaluated: list[Mapping[str, Any]],
                   best: Mapping[str, Any] | None, s: Mapping[str, Any], top: int, capacity_bytes: float | None,
                   commands: Mapping[int, str], sites: Mapping[int, int | str]) -> list[tuple[str, Mapping[str, Any], bool]]:
    """A sweep's tables (top, Pareto front, counts, failures) into ``ctx``; returns the bars to draw:
    the first :data:`BARS_MAX`, the median and the fastest that does not fit (when faster than the best)."""
    shown: list[tuple[str, Mapping[str, Any], bool]] = [(f"#{i} {config_text(r['config'])}", r, i == 1)
                                                        for i, r in enumerate(ranked[:BARS_MAX], 1)]
    if len(ranked) > BARS_MAX:
        med = ranked[(len(ranked) - 1) // 2]
        shown.append((f"median #{(len(ranked) - 1) // 2 + 1} {config_text(med['config'])}", med, False))
    faster = [r for r in evaluated if not r.get("fits") and best and r["iteration_time_s"] < best["iteration_time_s"]]
    if faster:
        f = min(faster, key=lambda r: r["iteration_time_s"])
        shown.append((f"fastest overall {config_text(f['config'])}", f, False))
    ctx["top"] = [_table_row(i, r, capacity_bytes, commands, sites) for i, r in enumerate(ranked[:top], 1)]
    ctx["pareto"] = [_table_row(i, r, capacity_bytes, commands, sites) for i, r in enumerate(pareto_front(evaluated), 1)]
    ctx["counts"] = [("configurations", s.get("num_configs")), ("evaluated", s.get("num_evaluated")),
                     ("failed", s.get("num_failed")), ("fit in memory", s.get("num_fit")),
                     ("seconds", f"{s['seconds']:.1f}" if s.get("seconds") is not None else "-"),
                     ("interrupted", "yes" if s.get("interrupted") else "no")]
    ctx["failures"] = list((s.get("failure_reasons") or {}).items())
    return shown


def _scaling_point(p: Mapping[str, Any], scaling: Mapping[str, Any], broken: Any, commands: Mapping[int, str],
                   sites: Mapping[int, int | str]) -> dict[str, Any]:
    """One GPU count's row of the scaling table (its best configuration, speed-up and efficiency)."""
    best = p.get("best")
    return {
        "gpus": p["gpus"], "batch": p["global_batch_size"], "status": p["status"],
        "config": config_text(best["config"]) if best else "-",
        "m": best["config"].get("num_micro_batches") if best else "-",
        "time": fmt_s(best["iteration_time_s"]) if best else "-",
        "samples": _num(p.get("samples_per_s"), "{:,.1f}"), "tokens": _num(p.get("tokens_per_s"), "{:,.0f}"),
        "speedup": _num(p.get("speedup"), "{:.2f}×"), "ideal": _num(p.get("ideal_speedup"), "{:.2f}×"),
        "efficiency": _pct(p.get("efficiency")), "below": p.get("efficiency") is not None and p["efficiency"] < scaling["threshold"],
        "memory": fmt_bytes(best["peak_memory_bytes"]) if best else "-",
        "broken": p["gpus"] == broken, "note": p.get("reason") or p.get("limit") or "",
        "command": commands.get(p["gpus"], ""), "site": site_href(sites[p["gpus"]]) if p["gpus"] in sites else "",
    }


def _scaling_context(ctx: dict[str, Any], scaling: Mapping[str, Any], capacity_bytes: float | None, capacity_label: str,
                     commands: Mapping[int, str], sites: Mapping[int, int | str]) -> dict[str, str]:
    """A scaling study's verdict and table into ``ctx``; returns its charts (efficiency, and the
    best configuration's time and memory per GPU count)."""
    points = scaling["points"]
    ctx["verdict"] = scaling["verdict"]
    ctx["mode"] = scaling["mode"]
    ctx["threshold"] = f"{scaling['threshold']:.0%}"
    ctx["baseline"] = scaling["baseline_gpus"]
    broken = (scaling.get("breakdown") or {}).get("gpus")
    ctx["points"] = [_scaling_point(p, scaling, broken, commands, sites) for p in points]
    ctx["runs"] = [q for q in ctx["points"] if q["command"]]
    ctx["built"] = sum(1 for q in ctx["runs"] if q["site"])
    eff = [EfficiencyPoint(p["gpus"], p.get("efficiency"), p.get("speedup"), p["gpus"] == broken,
                           f"{p['gpus']} GPUs, global batch {p['global_batch_size']}\n"
                           + (f"best {config_text(p['best']['config'])}: {fmt_s(p['best']['iteration_time_s'])}\n"
                              f"efficiency {p['efficiency']:.1%}, speed-up {p['speedup']:.2f}× of {p['ideal_speedup']:.2f}×"
                              if p.get("best") and p.get("efficiency") is not None else (p.get("reason") or "")))
           for p in points]
    charts = {"efficiency": efficiency_chart(eff, scaling["threshold"], mode=scaling["mode"])}
    labelled = [(f"{p['gpus']} GPU{'' if p['gpus'] == 1 else 's'}: {config_text(p['best']['config'])}", p["best"], False)
                for p in points if p.get("best")]
    bars, mems = _bars(labelled)
    if bars:
        charts["breakdown"] = breakdown_chart(bars, "Iteration time by part, best configuration per GPU count")
        charts["memory"] = memory_bars_chart(mems, capacity_bytes or max(m.peak_bytes for m in mems), capacity_label,
                                             "Peak memory per GPU, best configuration per GPU count")
    return charts


def _side_by_side(rows: Sequence[Mapping[str, Any]], best: Mapping[str, Any] | None, capacity: float | None) -> dict[str, Any]:
    """The config comparison: one column per configuration, one row per quantity."""
    heads = [r.get("spec") or config_text(r["config"]) for r in rows]
    cells = [_table_row(i + 1, r, capacity) for i, r in enumerate(rows)]
    keys = [("d (data parallel)", lambda r, c: r["config"]["d"]), ("t (tensor parallel)", lambda r, c: r["config"]["t"]),
            ("p (pipeline stages)", lambda r, c: r["config"]["p"]), ("micro-batch b", lambda r, c: r["config"]["micro_batch_size"]),
            ("micro-batches m", lambda r, c: r["config"]["num_micro_batches"]), ("schedule", lambda r, c: r["config"]["schedule"]),
            ("virtual stages v", lambda r, c: r["config"]["virtual_stages"]), ("ZeRO stage", lambda r, c: r["config"]["zero_stage"]),
            ("recomputation", lambda r, c: r["config"]["recompute"]),
            ("sequence parallel", lambda r, c: "on" if r["config"]["sequence_parallel"] else "off"),
            ("iteration time ± expected error", lambda r, c: fmt_s_band(r.get("iteration_time_s"), r.get("expected_error")))]
    keys += [(label, (lambda k: lambda r, c: c[k])(k)) for k, label in BREAKDOWN]
    keys += [("bubble fraction", lambda r, c: c["bubble"]), ("TFLOP/s per GPU", lambda r, c: c["tflops"]),
             ("MFU", lambda r, c: c["mfu"]), ("peak memory per GPU", lambda r, c: c["memory"]),
             ("headroom", lambda r, c: c["headroom"]), ("fits", lambda r, c: "yes" if c["fits"] else "NO")]
    best_col = next((i for i, r in enumerate(rows) if best is not None and r["index"] == best["index"]), None)
    return {"heads": heads, "best": best_col, "fits": [c["fits"] for c in cells],
            "rows": [(label, [str(fn(r, c)) for r, c in zip(rows, cells)]) for label, fn in keys]}


def _site_name(model: Mapping[str, Any], kind: str) -> str:
    name = re.sub(r"[^A-Za-z0-9 ._-]+", "", str(model.get("name") or ""))[:60].strip()
    return f"dml2comm {kind}: {name}" if name else f"dml2comm {kind}"


_TITLES = {"sweep": "Sweep", "compare": "Compare", "scaling": "Scaling study"}


def build_comparison(dest: Path, ctx: Mapping[str, Any], charts: Mapping[str, str], downloads: Mapping[str, str | bytes] = {},
                     templates: Path = TEMPLATES, mkdocs_yml: Path = MKDOCS_YML) -> None:
    """Write ``dest/site`` (:func:`dml2comm.site.build.build_pages_site`)."""
    title = _TITLES[ctx["kind"]]
    build_pages_site(dest, [("index", title, "compare.md.j2", dict(ctx, title=title))], _site_name(ctx.get("model") or {}, ctx["kind"]),
                     charts=charts, files=downloads, templates=templates, mkdocs_yml=mkdocs_yml)


def build_and_publish_comparison(out: Path, files: Mapping[str, str | bytes], ctx: Mapping[str, Any] | None = None,
                                 charts: Mapping[str, str] = {}, top: Path | None = None) -> None:
    """Write ``files`` (and, with ``ctx``, the site built from it, carrying copies of the files
    as downloads) into ``out`` atomically: staged in a temporary folder inside ``out``, then
    moved into place; nothing in ``out`` changes when the build fails.  ``top``: a folder of
    analysis sites (``top/1``, ``top/2``, ...) published as ``out/top`` with the page; without
    it, an ``out/top`` of an earlier run is removed (the new page does not link it)."""
    out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".dml2comm-", dir=out))
    try:
        names = list(files)
        if ctx is not None:
            build_comparison(staging, ctx, charts, files)
            names.append("site")
        if top is not None:
            os.replace(top, staging / "top")
            names.append("top")
        elif ctx is not None and (out / "top").is_dir():
            os.replace(out / "top", staging / ".old-top")  # removed with the staging folder
        for name, content in files.items():
            if isinstance(content, bytes):
                (staging / name).write_bytes(content)
            else:
                (staging / name).write_text(content, encoding="utf-8")
        publish(staging, out, names)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
