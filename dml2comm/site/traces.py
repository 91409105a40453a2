"""The trace pages of the site: the drawings (:func:`trace_drawings`) and page data
(:func:`page_context`) -> the site's Jinja2 environment -> MkDocs.

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
from typing import Any, Mapping, Sequence

from markupsafe import Markup

from dml2comm.fmt import fmt_s
from dml2comm.traces.analyze import TraceSet
from dml2comm.traces.classify import DIMS
from dml2comm.traces.report import file_column, file_note, hta_overlap, join_columns, join_rows, join_summary, rank_summary

__all__ = ["build_trace_site", "page_context", "publish_trace_outputs", "trace_drawings"]

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


#: Gantt charts drawn at most (pipeline groups; model replicas), rows per chart at most, ranks in
#: the replica bar chart at most.
MAX_GANTTS = 8
MAX_ROWS = 32
MAX_BAR_RANKS = 256


def trace_drawings(ts: TraceSet) -> tuple[dict[str, str], dict[str, Any]]:
    """The SVGs of the site: a Gantt chart per pipeline group, then one per model replica not
    already drawn (both on the global clock, step ``segment_step`` of each rank), the ranks'
    mean steps grouped by replica, and the micro-batch bars."""
    from dml2comm.render.trace_charts import GanttInput, pipeline_gantt, stacked_bars

    svgs: dict[str, str] = {}
    by_rank = {r.rank: r for r in ts.ranks}
    places = ts.layout.places if ts.layout is not None else {}

    def label(rank: int) -> str:
        return places[rank].label() if rank in places else f"rank {rank}"

    def gantt(ranks: Sequence[int]) -> list[GanttInput]:
        rows = []
        for rank in [x for x in ranks if x in by_rank][:MAX_ROWS]:
            r = by_rank[rank]
            k = next((i for i, s in enumerate(r.activity.steps) if s[0] == r.segment_step), None)
            if k is not None:
                rows.append(GanttInput(label(rank), r.activity, k))
        return rows

    candidates: list[tuple[str, tuple[int, ...]]] = []
    groups = [g for g in ts.pipeline_groups if any(x in by_rank for x in g)]
    for gi, group in enumerate(groups):
        candidates.append((f"Pipeline group {gi}: ranks {', '.join(map(str, group))}", group))
    if not groups:
        candidates.append(("All ranks", tuple(sorted(by_rank))))
    drawn = [frozenset(x for x in g if x in by_rank) for _, g in candidates]
    if ts.layout is not None and ts.layout.method != "assumed":
        for rid, members in zip(ts.layout.replica_ids, ts.layout.replicas):
            if len(members) > 1 and frozenset(members) not in drawn:
                candidates.append((f"Model replica {rid}: ranks {', '.join(map(str, members))}", members))
                drawn.append(frozenset(members))
    gantts = []
    n_pipe = n_rep = 0
    for title, ranks in candidates:
        replica = title.startswith("Model replica")
        if (n_rep if replica else n_pipe) >= MAX_GANTTS:
            continue
        rows = gantt(ranks)
        if not rows:
            continue
        step = by_rank[[x for x in ranks if x in by_rank][0]].segment_step
        name = f"trace_replica_{n_rep}" if replica else f"trace_gantt_{n_pipe}"
        if replica:
            n_rep += 1
        else:
            n_pipe += 1
        svgs[name] = pipeline_gantt(rows, f"{title}, step {step}")
        gantts.append({"name": name, "title": f"{title}, step {step}"})
    has_bars = bool(ts.ranks)
    if has_bars:
        svgs["rank_bars"] = _rank_bars(ts, by_rank, label)
    micro = []
    for r in ts.ranks[:MAX_GANTTS]:
        if r.segments:
            name = f"trace_microbatches_rank_{r.rank}"
            how = "explicit markers" if r.segment_method == "markers" else "kernel-run heuristic (no markers)"
            svgs[name] = stacked_bars([(s["segment"], _parts(s, idle=False)) for s in r.segments],
                                      f"Micro-batches of rank {r.rank}, step {r.segment_step} ({how})")
            micro.append({"name": name, "title": f"Rank {r.rank}, step {r.segment_step}: segments from {how}"})
    return svgs, {"gantts": gantts, "microbatches": micro, "has_bars": has_bars}


def _rank_bars(ts: TraceSet, by_rank: Mapping[int, Any], label: Any) -> str:
    """The ranks' mean steps as bars, grouped by model replica (at most :data:`MAX_BAR_RANKS`
    ranks), each replica headed by its step (its slowest rank's)."""
    from dml2comm.render.trace_charts import ReplicaRow, replica_bars

    if ts.layout is not None:
        ids, members = ts.layout.replica_ids, ts.layout.replicas
    else:
        ids, members = tuple(range(len(ts.ranks))), tuple((r.rank,) for r in ts.ranks)
    blocks, shown = [], 0
    for rid, ranks in zip(ids, members):
        if shown >= MAX_BAR_RANKS:
            break
        rows = []
        for rank in ranks[:MAX_BAR_RANKS - shown]:
            summ = rank_summary(by_rank[rank])
            rows.append(ReplicaRow(label(rank), _parts(summ), dict(summ["comm_s"])))
        shown += len(rows)
        walls = [(rank_summary(by_rank[x])["wall_s"], x) for x in ranks]
        wall, slowest = max(walls, key=lambda w: (w[0], -w[1]))
        head = f"Replica {rid}: step {fmt_s(wall)}" + (f", slowest rank {slowest}" if len(ranks) > 1 else "")
        blocks.append((head, rows))
    method = ts.layout.method if ts.layout is not None else "assumed"
    note = f"replicas from {method}" + (f"; the first {shown} of {len(ts.ranks)} ranks shown" if shown < len(ts.ranks) else "")
    return replica_bars(blocks, "Mean step per rank, by model replica", note)


def _parts(s: dict[str, Any], idle: bool = True) -> dict[str, float]:
    """The bar parts of a step or segment (:data:`~dml2comm.render.trace_charts.PART_COLOURS`), which add
    up to its window: compute alone = compute - overlap; compute + communication = overlap;
    exposed communication; copies only = window - idle - |compute ∪ communication| (with
    |compute ∪ communication| = compute + exposed); idle."""
    out = {"compute": max(s["compute_s"] - s["overlap_s"], 0.0), "compute + communication": s["overlap_s"],
           "exposed communication": s["exposed_comm_s"]}
    if idle:
        out["copies only"] = max(s["wall_s"] - s["idle_s"] - s["compute_s"] - s["exposed_comm_s"], 0.0)
        out["idle"] = s["idle_s"]
    return out


def _pct_error(e: float | None) -> str:
    return f"{e:+.1%}" if e is not None else "n/a"


def page_context(ts: TraceSet, data: dict[str, Any], files: int, extra: dict[str, Any]) -> dict[str, Any]:
    ranks = []
    for r in data["ranks"]:
        s = r["summary"]
        ranks.append({"rank": r["rank"], "steps": s["steps"], "wall": fmt_s(s["wall_s"]), "compute": fmt_s(s["compute_s"]),
                      **{d: fmt_s(s["comm_s"][d]) for d in DIMS}, "comm": {d: fmt_s(s["comm_s"][d]) for d in DIMS},
                      "overlap": fmt_s(s["overlap_s"]), "exposed": fmt_s(s["exposed_comm_s"]), "idle": fmt_s(s["idle_s"]),
                      "hta_overlap": hta_overlap(r["hta"]), "file": Path(r["file"]).name})
    bd = data["hta"]["kernel_type_breakdown_us"]
    pct = data["hta"]["kernel_type_percentage"]
    kernel_types = [{"label": k, "time": fmt_s(v * 1e-6), "share": f"{pct.get(k, 0):.1f}%"} for k, v in bd.items()]
    problems = list(data["problems"]) + [f"rank {r['rank']}: {p}" for r in data["ranks"] for p in r["problems"]]
    comparison = None
    if data["comparison"]:
        cmp = data["comparison"]
        with_base = bool(cmp["rows"]) and "predicted_base_s" in cmp["rows"][0]
        comparison = {"what": cmp["what"], "caveat": cmp.get("caveat"), "with_base": with_base, "column": file_column(cmp),
                      "constants": file_note(cmp["cluster_file"]) if cmp.get("cluster_file") else "",
                      "base": (cmp.get("cluster_file") or {}).get("base") or "", "rows": [
            {"label": c["label"], "predicted": fmt_s(c["predicted_s"]), "measured": fmt_s(c["measured_s"]),
             "error": _pct_error(c["error"]),
             "base": fmt_s(c["predicted_base_s"]) if with_base else "", "base_error": _pct_error(c.get("error_base"))}
            for c in cmp["rows"]]}
    layout = data["layout"]
    join = data.get("join")
    join_page = {"rows": join_rows(join), "columns": join_columns(join), "summary": join_summary(join),
                 "notes": join["notes"], "method": join["method"], "rank": join["rank"],
                 "ops": [{"name": o["name"], "phase": o["phase"], "calls": o["calls"], "time": fmt_s(o["gpu_s"]),
                          "share": f"{o['gpu_s'] / join['gpu_s']:.1%}" if join["gpu_s"] > 0 else "n/a"} for o in join["ops"]]} \
        if join else None
    return {"ranks": ranks, "join": join_page, "files": files, "failures": len(ts.failures), "problems": problems, "kernel_types": kernel_types,
            "comparison": comparison, "dims": list(DIMS),
            "layout": {"method": layout["method"], "detail": layout["detail"], "replicas": len(layout["replicas"])} if layout else None,
            **extra}
