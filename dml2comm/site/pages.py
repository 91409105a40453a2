"""Page models: what each page of the site shows, collected before any template runs.

A :class:`Page` carries a synthetic key (its file name without ``.md``), a synthetic title
(never model text: MkDocs puts titles into the navigation without escaping), its breadcrumbs,
the template that renders it and a context of plain values.  Model strings stay raw here; the
templates escape them (Jinja2 autoescape, plus the ``md`` filter in Markdown text).

Which pages exist (replicas are identical up to GPU ids, DESIGN.md section 3):

- ``index`` (overview), ``memory`` (a stacked bar per stage against the GPU's capacity, the
  per-stage table, and when it does not fit the re-analysed suggestions), ``timeline`` (the
  simulated iteration as a Gantt chart, its breakdown, the recommendations, ``trace.json``),
  ``references``; the memory and timeline drawings are :mod:`dml2comm.render.charts` SVGs;
- ``data_0`` and every stage and layer page of replica 0 (``stage_{p}_data_0``,
  ``layer_{l}_data_0``);
- ``data_{d}`` for each replica d > 0 while d - 1 <= ``replica_pages_max``; beyond that one
  ``replicas`` page lists every replica's GPUs instead (for d = 16 no per-replica pages);
- ``gpu_comm_pp_{s}`` (boundary s -> s+1), ``gpu_comm_tp_{p}``, ``gpu_comm_dp_{p}`` per stage,
  drawn for replica 0 / tensor rank 0, with a table of every group of every replica.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from dml2comm.analysis import CommNode, comm_by_dim
from dml2comm.network.kinds import ParallelDim
from dml2comm.parallel.config import CpScheme, Schedule
from dml2comm.render.charts import MEMORY_PARTS, Chart, memory_chart_of, timeline_chart_of
from dml2comm.render.dot import Drawing, replica_page
from dml2comm.render.facts import Facts, kind_label
from dml2comm.fmt import (
    COMM_BINS,
    HEAT_BINS,
    LINK_COLOURS,
    fmt_bytes,
    fmt_count,
    fmt_flops,
    fmt_num,
    fmt_plural,
    fmt_rate,
    fmt_s,
    fmt_shape,
    fmt_share,
    rank_ranges,
)

__all__ = ["Page", "Crumb", "REPLICA_PAGES_MAX", "page_models", "site_charts", "nav_of"]

#: Replicas d > 0 get a page each while there are at most this many of them; beyond, one
#: ``replicas`` page lists them all.
REPLICA_PAGES_MAX = 8

#: Rows of the "slowest operators" table of a layer page.
TOP_OPS = 12


@dataclass(frozen=True)
class Crumb:
    title: str
    key: str | None  # None: the current page

    @property
    def href(self) -> str | None:
        return f"{self.key}.html" if self.key else None


@dataclass
class Page:
    key: str
    title: str
    section: str
    template: str
    crumbs: list[Crumb]
    context: dict[str, Any] = field(default_factory=dict)
    drawing: str | None = None  # svg name
    hide_toc: bool = True



def _band_origin(source: str) -> str:
    """Where a band comes from, in short: ``nearest validated runs: vtrain`` or ``no validated
    pytorch run on H100-SXM5-80GB``."""
    head = source.split(":")[0]
    return head if head.startswith(("no validated", "only ", "from the profile")) else f"nearest validated runs: {head}"

def _row(**kw: Any) -> dict[str, Any]:
    return kw


def _word(text: str) -> str:
    """Synthetic words only in titles (MkDocs does not escape the navigation)."""
    return re.sub(r"[^a-z0-9 _-]", "", str(text).lower())


def _legend(facts: Facts) -> dict[str, Any]:
    over = facts.over_stages
    return {
        "heat": [{"fill": b.fill, "font": b.font, "label": b.label} for b in HEAT_BINS],
        "comm": [{"fill": b.fill, "font": b.font, "label": b.label} for b in COMM_BINS],
        "links": [{"colour": c, "label": k} for k, c in LINK_COLOURS.items() if k != "local"],
        # stages that do not fit in one GPU's memory: drawn with a double red outline
        "over": (f"stage{'s' if len(over) > 1 else ''} {', '.join(map(str, over))} need{'' if len(over) > 1 else 's'} more "
                 f"memory per GPU than the {fmt_bytes(facts.capacity_bytes)} a GPU has") if over else "",
    }


def _comm_rows(facts: Facts, comms: Sequence[CommNode], per_micro_batch: bool = False) -> list[dict[str, Any]]:
    """Collectives alike but for their tensor (the same AllReduce in every block) share a row."""
    rows: dict[tuple, dict[str, Any]] = {}
    for c in comms:
        count = c.count_per_iteration // facts.m if per_micro_batch and c.per_micro_batch else c.count_per_iteration
        key = (c.kind, c.dim, c.phase, c.reason, c.message_bytes, c.algorithm, c.link, c.time_s, c.group)
        row = rows.get(key)
        if row is None:
            row = rows[key] = _row(
                kind=kind_label(c.kind), dim=c.dim.value.upper(), phase=c.phase.value, tensor=c.tensor, more=0, reason=c.reason,
                message=fmt_bytes(c.message_bytes), sent=fmt_bytes(c.bytes_sent_per_gpu), algorithm=c.algorithm, link=c.link,
                group=rank_ranges(c.group), time=fmt_s(c.time_s), count=0, seconds=0.0,
            )
        elif c.tensor != row["tensor"]:
            row["more"] += 1
        row["count"] += count
        row["seconds"] += c.time_s * c.count_per_iteration
    out = list(rows.values())
    for row in out:
        row["share"] = fmt_share(facts.share(row.pop("seconds")))
    return out


def _stage_key(stage: Any) -> str | None:
    return f"stage_{stage}_data_0" if isinstance(stage, int) else None


def _compute_note(facts: Facts) -> str:
    """The compute card's note: the busiest stage's share, and its busy time (the drawings' "% busy")
    -- the numbers the timeline's table and the stage page give for that stage."""
    crit = facts.analysis.summary.get("critical_stage")
    if not isinstance(crit, int) or crit >= len(facts.stage_compute_s) or not facts.iteration_s:
        return ""
    return (f"{fmt_share(facts.share(facts.stage_compute_s[crit]))} of the iteration: stage {crit}'s own operators "
            f"(busy {fmt_share(facts.stage_share[crit])} with its tensor-parallel collectives)")


def _stage_iteration_text(facts: Facts, p: int) -> str:
    """A stage's compute and busy time per iteration, as the overview and the timeline give them."""
    compute, busy = facts.stage_compute_s[p], facts.stage_busy_s[p]
    busiest = facts.analysis.summary.get("critical_stage") == p
    return (f"compute {fmt_s(compute)} ({fmt_share(facts.share(compute))} of the iteration"
            + ("; the busiest stage: the overview's compute" if busiest else "") + "); "
            f"busy {fmt_s(busy)} ({fmt_share(facts.stage_share[p])}) with the tensor-parallel collectives in its compute stream")


def _breakdown(facts: Facts) -> list[dict[str, Any]]:
    """The iteration split into compute, exposed communication, pipeline bubble, optimizer step
    (and what is left), as the summary gives them: label, seconds, percent, CSS class."""
    s = facts.analysis.summary
    iteration = facts.iteration_s
    compute = float(s.get("compute_time_s") or 0.0)
    exposed = float(s.get("exposed_comm_time_s") or 0.0)
    bubble = s.get("bubble_time_s")
    optimizer = s.get("optimizer_time_s")
    parts = [("compute", compute, "compute"), ("exposed communication", exposed, "comm")]
    if isinstance(bubble, (int, float)) and isinstance(optimizer, (int, float)):
        parts += [("pipeline bubble", float(bubble), "bubble"), ("optimizer step", float(optimizer), "optim")]
        rest = iteration - compute - exposed - bubble - optimizer
        if rest > 1e-3 * iteration:
            parts.append(("other", rest, "other"))
    else:
        parts.append(("other: pipeline bubble, optimizer step", max(iteration - compute - exposed, 0.0), "other"))
    return [{"label": label, "seconds": fmt_s(sec), "pct": 100 * max(sec, 0.0) / iteration if iteration else 0, "cls": cls}
            for label, sec, cls in parts]


def site_charts(facts: Facts) -> dict[str, Chart]:
    """The generated (non-Graphviz) SVGs of the site, by page key: ``memory`` and, when the
    analysis has a simulated iteration, ``timeline``."""
    out = {"memory": memory_chart_of(facts)}
    timeline = timeline_chart_of(facts)
    if timeline is not None:
        out["timeline"] = timeline
    return out


_HOME = Crumb("Overview", "index")
_REPLICA_0 = Crumb("Replica 0", "data_0")


@dataclass(frozen=True)
class _Site:
    """What every page model reads: the facts, the drawings by page, the shared legend."""
    facts: Facts
    drawn: dict[str, str]          # page key -> svg name
    hottest: dict[str, float]      # page key -> share of its hottest box
    legend: dict[str, Any]
    replica_pages_max: int

    def legend_of(self, page: str) -> dict[str, Any]:
        """The legend of a page whose drawing is coloured relative to its hottest box."""
        return dict(self.legend, top=fmt_share(self.hottest[page]) if self.hottest.get(page) else "")

    @property
    def collapsed(self) -> bool:
        """True when the replicas d > 0 get one ``replicas`` page instead of a page each."""
        return self.facts.dp - 1 > self.replica_pages_max


def _stage_crumb(p: int) -> Crumb:
    return Crumb(f"Stage {p}", f"stage_{p}_data_0")


def page_models(facts: Facts, drawings: Sequence[Drawing], replica_pages_max: int = REPLICA_PAGES_MAX,
                charts: Mapping[str, Chart] | None = None) -> list[Page]:
    """Every page of the site, in navigation order.  ``charts`` are :func:`site_charts` (built here
    when not given)."""
    site = _Site(facts, {d.page: d.name for d in drawings}, {d.page: d.hottest for d in drawings}, _legend(facts),
                 replica_pages_max)
    charts = charts if charts is not None else site_charts(facts)
    pages = [_overview_page(site), _memory_page(facts, _HOME, charts.get("memory")),
             _timeline_page(facts, _HOME, charts.get("timeline"))]
    pages += _replica_pages(site)
    pages += [_stage_page(site, p) for p in range(len(facts.analysis.stages))]
    pages += [_layer_page(site, layer) for layer in facts.analysis.layers]
    pages += [_boundary_page(site, b) for b in facts.boundaries if b.forward]
    for p in range(facts.pp):
        pages += _group_pages(site, p)
    pages.append(Page(key="references", title="References", section="", template="references.md.j2",
                      crumbs=[_HOME, Crumb("References", None)], context={}, hide_toc=False))
    return pages


# ---------------------------------------------------------------------------------------- overview

def _memory_card(facts: Facts) -> dict[str, Any]:
    """The overview's memory figures: per-GPU memory by stage, whether it fits, the card's note, the
    paragraph under the stage table and the re-analysed suggestions when it does not fit."""
    report = getattr(facts.analysis, "memory", None) or {}
    mem = [facts.memory_per_gpu(p) for p in range(facts.pp)]
    capacity = facts.capacity_bytes
    worst = max(range(facts.pp), key=lambda p: mem[p])
    fits = max(mem) <= capacity
    if facts.activations_modelled:
        note = (f"peak on stage {worst} of {fmt_bytes(capacity)}: {'fits' if fits else 'does NOT fit'}"
                + (f"; largest part: {report['largest_contributor']}" if report.get("largest_contributor") else ""))
        text = ("Memory per GPU is the peak of weights, gradients, optimizer states, the activations of the micro-batches "
                "in flight, communication buffers and transient workspace (see each stage's totals).")
    else:
        note = f"weights + gradients + optimizer, stage {worst}, of {fmt_bytes(capacity)}; activations not modelled"
        text = "Memory per GPU counts weights, gradients and optimizer states; activation memory is not modelled."
    suggestions = [
        _row(change=str(s_.get("change", "")), peak=fmt_bytes(s_.get("peak_bytes")), fits="fits" if s_.get("fits") else "does not fit")
        for s_ in report.get("suggestions", ()) if isinstance(s_, dict)
    ]
    return dict(mem=mem, fits=fits, note=note, text=text, suggestions=suggestions)


def _headline(facts: Facts, memory: Mapping[str, Any]) -> list[tuple[str, str, str, str | None, bool]]:
    """The overview's cards: (title, value, note, page the card links to or None, alarm: drawn in red)."""
    s, cfg = facts.analysis.summary, facts.analysis.config
    iteration = facts.iteration_s
    compute = float(s.get("compute_time_s") or 0.0)
    exposed = float(s.get("exposed_comm_time_s") or 0.0)
    return [
        ("Iteration time", fmt_s(iteration), f"one training step of {cfg.global_batch_size} samples"
         + (f"; expected error ±{s['expected_error']:.1%} ({_band_origin(str(s.get('expected_error_source') or ''))}; "
            "data.json has why)" if s.get("expected_error") is not None else ""),
         "timeline", False),
        ("Compute (busiest stage)", fmt_s(compute), _compute_note(facts), _stage_key(s.get("critical_stage")), False),
        ("Communication (all stages)", fmt_s(s.get("comm_time_s")),
         f"exposed: {fmt_s(exposed)} ({fmt_share(exposed / iteration) if iteration else ''} of the iteration); "
         f"busiest stage {fmt_s(s.get('comm_time_busiest_stage_s'))}", None, False),
        ("Pipeline bubble", fmt_share(s.get("bubble_fraction")), f"{cfg.schedule}, p = {cfg.pp_size}, m = {fmt_plural(cfg.num_micro_batches, 'micro-batch', 'micro-batches')}",
         "timeline", False),
        ("MFU", fmt_share(s.get("mfu")), "model FLOPs / (iteration x GPUs x peak)", None, False),
        ("Throughput", f"{s['tokens_per_s']:,.0f} tokens/s" if s.get("tokens_per_s") else "n/a",
         f"{s['samples_per_s']:,.1f} samples/s" if s.get("samples_per_s") else "", None, False),
        ("Memory per GPU", fmt_bytes(max(memory["mem"])), memory["note"], "memory", not memory["fits"]),
        ("Bottleneck", s.get("bottleneck") or "n/a", "", "timeline", False),
    ]


def _overview_tables(site: _Site, mem: Sequence[float]) -> dict[str, Any]:
    """The overview's tables: stages, communication by dimension, replicas, the cluster's links."""
    facts = site.facts
    a = facts.analysis
    stages = []
    for p, st in enumerate(a.stages):
        lo, hi = facts.layer_range(p)
        stages.append(
            _row(index=p, key=f"stage_{p}_data_0", layers=f"{lo}–{hi}" if lo != hi else str(lo), gpus=rank_ranges(facts.ranks(0, p)),
                 params=fmt_count(st.params_per_gpu), fwd=fmt_s(st.time_fwd_s), bwd=fmt_s(st.time_bwd_s), dp=fmt_s(st.dp_time_s),
                 optimizer=fmt_s(st.optimizer_time_s), memory=fmt_bytes(mem[p]), share=fmt_share(facts.stage_share[p]),
                 over=facts.over_memory_text(p))
        )
    dims = [
        _row(dim=k, count=v["count"], message=fmt_bytes(v["message_bytes"]), sent=fmt_bytes(v["bytes_sent_per_gpu"]), time=fmt_s(v["time_s"]))
        for k, v in comm_by_dim(a).items() if v["count"]
    ]
    replicas = []
    for d in range(facts.dp):
        ranks = facts.replica_ranks(d)
        replicas.append(_row(index=d, key=replica_page(facts.dp, d, site.replica_pages_max), gpus=rank_ranges(ranks),
                             nodes=rank_ranges(facts.nodes_of(ranks))))
    links = [
        _row(role="inside a node", name=a.cluster.intra_node.name, bw=fmt_rate(a.cluster.intra_node.bandwidth_bytes_per_s),
             eff=f"{a.cluster.intra_node.efficiency:.0%}", lat=fmt_s(a.cluster.intra_node.latency_s)),
        _row(role="between nodes (per GPU)", name=a.cluster.inter_node.name, bw=fmt_rate(a.cluster.inter_node.bandwidth_bytes_per_s),
             eff=f"{a.cluster.inter_node.efficiency:.0%}", lat=fmt_s(a.cluster.inter_node.latency_s)),
    ]
    return dict(stages=stages, dims=dims, replicas=replicas, links=links)


def _overview_page(site: _Site) -> Page:
    """``index``: the model, the configuration, the cluster, the headline cards and the tables."""
    facts = site.facts
    a, cfg, mi = facts.analysis, facts.analysis.config, facts.analysis.model_info
    memory = _memory_card(facts)
    return Page(
        key="index", title="Overview", section="", template="index.md.j2", crumbs=[Crumb("Overview", None)], drawing=site.drawn.get("index"),
        context=dict(
            model=_row(name=mi.get("name"), path=mi.get("path"), ops=mi.get("num_ops"), layers=mi.get("num_layers"),
                       blocks=mi.get("num_blocks"), params=fmt_count(mi.get("params")), flops=fmt_flops(mi.get("flops_fwd_per_sample")),
                       source=mi.get("layer_source")),
            config=[("d (data)", cfg.dp_size), ("t (tensor)", cfg.tp_size), ("p (pipeline)", cfg.pp_size),
                    ("micro-batch b", cfg.micro_batch_size), ("global batch B", cfg.global_batch_size),
                    ("micro-batches m", cfg.num_micro_batches), ("sequence length", cfg.seq_len or "n/a"),
                    ("dtype", cfg.dtype), ("stack", cfg.stack), ("precision", cfg.precision), ("attention", cfg.attention),
                    ("schedule", cfg.schedule + (f" (v={cfg.virtual_stages})" if cfg.schedule is Schedule.INTERLEAVED else "")),
                    ("ZeRO stage", cfg.zero_stage), ("sequence parallel", "yes" if cfg.sequence_parallel else "no"),
                    ("recomputation", cfg.recompute), ("optimizer", cfg.optimizer), ("rank order", cfg.rank_order)],
            cluster=_row(name=a.cluster.name, gpu=a.cluster.gpu.name, gpus=a.cluster.num_gpus, per_node=a.cluster.gpus_per_node,
                         nodes=a.cluster.num_nodes, topology=a.cluster.topology,
                         peak=fmt_flops(a.cluster.gpu.peak_flops(cfg.dtype)) + "/s", hbm=f"{a.cluster.gpu.hbm_bytes / 1e9:g} GB",
                         hbm_bw=fmt_rate(a.cluster.gpu.hbm_bytes_per_s)),
            headline=_headline(facts, memory), bar=_breakdown(facts), **_overview_tables(site, memory["mem"]),
            dtype=cfg.dtype, zero=cfg.zero_stage, memory_text=memory["text"], suggestions=memory["suggestions"], fits=memory["fits"],
            collapsed=site.collapsed, warnings=list(a.warnings), assumptions=list(a.assumptions), legend=site.legend_of("index"),
        ),
    )


# ---------------------------------------------------------------------------------------- replicas

def _replica_pages(site: _Site) -> list[Page]:
    """``data_{d}`` for replica 0 and, unless collapsed, every other replica; when collapsed, one
    ``replicas`` page listing every replica's GPUs."""
    facts = site.facts
    boundaries = [_row(stage=b.stage, key=f"gpu_comm_pp_{b.stage}", fwd=fmt_bytes(b.bytes_fwd), fwd_t=fmt_s(b.time_fwd_s),
                       bwd=fmt_bytes(b.bytes_bwd), bwd_t=fmt_s(b.time_bwd_s), link=b.link, tensors=list(b.tensors))
                  for b in facts.boundaries]
    pages = []
    for d in range(1 if site.collapsed else facts.dp):
        rows = []
        for p, st in enumerate(facts.analysis.stages):
            lo, hi = facts.layer_range(p)
            rows.append(_row(index=p, key=f"stage_{p}_data_0", layers=f"{lo}–{hi}" if lo != hi else str(lo),
                             gpus=rank_ranges(facts.ranks(d, p)), nodes=rank_ranges(facts.nodes_of(facts.ranks(d, p))),
                             fwd=fmt_s(st.time_fwd_s), bwd=fmt_s(st.time_bwd_s), share=fmt_share(facts.stage_share[p]),
                             over=facts.over_memory_text(p)))
        pages.append(
            Page(key=f"data_{d}", title=f"Replica {d}", section="Replicas", template="replica.md.j2",
                 crumbs=[_HOME, Crumb(f"Replica {d}", None)], drawing=site.drawn.get(f"data_{d}"),
                 context=dict(d=d, stages=rows, boundaries=boundaries, gpus=rank_ranges(facts.replica_ranks(d)),
                              legend=site.legend_of(f"data_{d}"), m=facts.m))
        )
    if site.collapsed:
        rows = [_row(index=d, key="data_0" if d == 0 else None, per_stage=[rank_ranges(facts.ranks(d, p)) for p in range(facts.pp)],
                     nodes=rank_ranges(facts.nodes_of(facts.replica_ranks(d)))) for d in range(facts.dp)]
        pages.append(Page(key="replicas", title="All replicas", section="Replicas", template="replicas.md.j2",
                          crumbs=[_HOME, Crumb("All replicas", None)], context=dict(rows=rows, pp=facts.pp, dp=facts.dp), hide_toc=True))
    return pages


# ---------------------------------------------------------------------------------------- stages

def _stage_totals(facts: Facts, p: int) -> list[tuple[str, str]]:
    """The stage page's totals table: layers, parameters, FLOPs, times per micro-batch and iteration, memory."""
    st = facts.analysis.stages[p]
    return [
        ("layers", f"{len(st.layers)} ({facts.layer_range(p)[0]}–{facts.layer_range(p)[1]})"),
        ("parameters", f"{fmt_count(st.params)} ({fmt_count(st.params_per_gpu)} per GPU after tensor parallelism)"
         + (f": {fmt_count(st.params - st.held_params)} in its layers + {fmt_count(st.held_params)} in the tied copy it holds"
            if st.held_params else "")),
        ("forward FLOPs per micro-batch", fmt_flops(st.flops_fwd) + " (all tensor ranks)"),
        ("forward per micro-batch", f"{fmt_s(st.time_fwd_s)} (compute {fmt_s(st.compute_fwd_s)}, communication and input "
                                    f"{fmt_s(st.time_fwd_s - st.compute_fwd_s)})"),
        ("backward per micro-batch", f"{fmt_s(st.time_bwd_s)} (compute {fmt_s(st.compute_bwd_s)}, exposed communication "
                                     f"{fmt_s(st.time_bwd_s - st.compute_bwd_s)})"),
        ("gradient accumulation per micro-batch", f"{fmt_s(st.grad_accumulation_s)} (in the backward compute: "
         + ("the parameters no weight-gradient GEMM accumulates" if facts.analysis.config.grad_accumulation_fusion
            else "every parameter, --no-gradient-accumulation-fusion") + ")"),
        *([("loss per micro-batch", f"{fmt_s(st.loss_fwd_s)} forward, {fmt_s(st.loss_bwd_s)} backward (in the compute: "
             "Megatron-LM's fp32 cross-entropy over the logits the model leaves for the training loop)")]
          if st.loss_fwd_s or st.loss_bwd_s else []),
        ("per iteration (m = %d)" % facts.m, _stage_iteration_text(facts, p)),
        ("data-parallel collectives per iteration", fmt_s(st.dp_time_s)),
        ("optimizer step", fmt_s(st.optimizer_time_s)),
        ("memory per GPU", f"{fmt_bytes(facts.memory_per_gpu(p))} of {fmt_bytes(facts.capacity_bytes)}"
                           + (" (does NOT fit)" if facts.over_capacity(p) else "") + ": " + _memory_parts_text(st.memory)),
    ]


def _stage_groups(facts: Facts, p: int) -> list[dict[str, Any]]:
    """The communication groups stage ``p``'s GPUs (replica 0) belong to, each linking to its page."""
    ranks = facts.ranks(0, p)
    tps, dps = facts.tp_by_stage.get(p, ()), facts.dp_by_stage.get(p, ())
    groups = []
    if tps:
        groups.append(_row(kind="tensor-parallel", key=f"gpu_comm_tp_{p}", ranks=rank_ranges(ranks), link=tps[0].link))
    if dps:
        groups.append(_row(kind=f"data-parallel ({facts.tp} groups)", key=f"gpu_comm_dp_{p}",
                           ranks=rank_ranges(facts.analysis.rank_map.dp_group(p, 0)) + (" …" if facts.tp > 1 else ""), link=dps[0].link))
    for b in facts.boundaries:
        if b.stage == p - 1:
            groups.append(_row(kind=f"pipeline: receives from stage {p - 1}", key=f"gpu_comm_pp_{p - 1}",
                               ranks=f"{rank_ranges(facts.ranks(0, p - 1))} → {rank_ranges(ranks)}", link=b.link))
        if b.stage == p:
            groups.append(_row(kind=f"pipeline: sends to stage {p + 1}", key=f"gpu_comm_pp_{p}",
                               ranks=f"{rank_ranges(ranks)} → {rank_ranges(facts.ranks(0, p + 1))}", link=b.link))
    return groups


def _stage_page(site: _Site, p: int) -> Page:
    """``stage_{p}_data_0``: a stage of replica 0 with its totals, GPUs, layers, groups and collectives."""
    facts = site.facts
    a = facts.analysis
    st = a.stages[p]
    tps, dps = facts.tp_by_stage.get(p, ()), facts.dp_by_stage.get(p, ())
    pps = [c for b in facts.boundaries if b.stage in (p - 1, p) for c in (b.forward if b.stage == p else b.backward)]
    gpus = [_row(rank=r, node=facts.node_of(r), t=t, coords=f"d=0 p={p} t={t}") for t, r in enumerate(facts.ranks(0, p))]
    layers = []
    for li in st.layers:
        l = a.layers[li]
        layers.append(_row(index=li, key=f"layer_{li}_data_0", name=l.name, kind=l.kind, ops=l.num_ops, params=fmt_count(l.params),
                           fwd=fmt_s(l.time_fwd_s), bwd=fmt_s(l.time_bwd_s), tp=len(facts.tp_by_layer.get(li, ())),
                           share=fmt_share(facts.layer_share[li])))
    held = (_row(names=", ".join(st.held_tensors), params=fmt_count(st.held_params), total=fmt_count(st.params),
                 owners=[_row(stage=o, key=f"stage_{o}_data_0") for o in st.held_from])
            if st.held_params else None)
    return Page(key=f"stage_{p}_data_0", title=f"Stage {p}", section="Stages (replica 0)", template="stage.md.j2",
                crumbs=[_HOME, _REPLICA_0, Crumb(f"Stage {p}", None)], drawing=site.drawn.get(f"stage_{p}_data_0"),
                context=dict(p=p, totals=_stage_totals(facts, p), gpus=gpus, layers=layers, held=held, groups=_stage_groups(facts, p),
                             legend=site.legend_of(f"stage_{p}_data_0"), over=facts.over_memory_text(p),
                             comms=_comm_rows(facts, list(tps) + list(dps) + pps, per_micro_batch=False),
                             prev_key=f"stage_{p - 1}_data_0" if p > 0 else None,
                             next_key=f"stage_{p + 1}_data_0" if p < facts.pp - 1 else None,
                             dp=facts.dp))


# ---------------------------------------------------------------------------------------- layers

def _layer_page(site: _Site, l: Any) -> Page:
    """``layer_{l}_data_0``: a layer's summary, its slowest operators and its tensor-parallel collectives."""
    facts = site.facts
    a = facts.analysis
    li, p = l.index, l.stage
    ops = [a.ops[i] for i in a.layered.layers[li].op_indices]
    slow = sorted(ops, key=lambda o: -(o.time_fwd_s + o.time_bwd_s))[:TOP_OPS]
    top = [_row(name=o.name or f"(unnamed {o.op_type})", op_type=o.op_type, shape=fmt_shape(o.output_shape),
                flops=fmt_flops(o.cost.flops_fwd), bytes=fmt_bytes(o.cost.bytes_fwd), fwd=fmt_s(o.time_fwd_s),
                bwd=fmt_s(o.time_bwd_s), rule=o.shard_rule, share=fmt_share(facts.op_share(o.index))) for o in slow]
    tps = facts.tp_by_layer.get(li, ())
    summary = [
        ("name", l.name), ("kind", l.kind), ("stage", f"{p} (GPUs {rank_ranges(facts.ranks(0, p))} in replica 0)"),
        ("operators", str(l.num_ops)), ("parameters", fmt_count(l.params)),
        ("forward FLOPs per micro-batch", fmt_flops(l.flops_fwd) + " (all tensor ranks)"),
        ("compute per micro-batch (one GPU)", f"forward {fmt_s(l.time_fwd_s)}, backward {fmt_s(l.time_bwd_s)}"),
        ("tensor-parallel collectives per micro-batch", f"{len(tps)}, {fmt_s(sum(c.time_s for c in tps))}"),
        ("share of the iteration", fmt_share(facts.layer_share[li])),
    ]
    last = len(a.layers) - 1
    return Page(key=f"layer_{li}_data_0", title=facts.layer_title(li), section="Layers (replica 0)", template="layer.md.j2",
                crumbs=[_HOME, _REPLICA_0, _stage_crumb(p), Crumb(facts.layer_title(li), None)], drawing=site.drawn.get(f"layer_{li}_data_0"),
                context=dict(li=li, p=p, summary=summary, top=top, comms=_comm_rows(facts, tps, per_micro_batch=True),
                             legend=site.legend_of(f"layer_{li}_data_0"),
                             prev_key=f"layer_{li - 1}_data_0" if li > 0 else None, title=facts.layer_title(li),
                             prev_title=facts.layer_title(li - 1) if li > 0 else "",
                             next_title=facts.layer_title(li + 1) if li < last else "",
                             next_key=f"layer_{li + 1}_data_0" if li < last else None,
                             total_ops=l.num_ops, shown_ops=len(top)))


# ---------------------------------------------------------------------------------------- GPU communication

def _gpu_comm_page(site: _Site, key: str, title: str, crumb: str, p: int, **context: Any) -> Page:
    """A ``gpu_comm_*`` page of stage ``p`` (the sender for a pipeline boundary): the shared frame
    of the four kinds, with ``context`` giving the kind, heading, intro, collectives and groups."""
    return Page(key=key, title=title, section="GPU communication", template="gpu_comm.md.j2",
                crumbs=[_HOME, _REPLICA_0, _stage_crumb(p), Crumb(crumb, None)], drawing=site.drawn.get(key),
                context=dict(context, legend=site.legend, back=Crumb(f"Stage {p}", f"stage_{p}_data_0")))


def _boundary_page(site: _Site, b: Any) -> Page:
    """``gpu_comm_pp_{s}``: the Send/Recv pairs between stage s and s+1 of every replica."""
    facts, s_ = site.facts, b.stage
    pairs = []
    for d in range(facts.dp):
        for t, (src, dst) in enumerate(zip(facts.ranks(d, s_), facts.ranks(d, s_ + 1))):
            pairs.append(_row(d=d, t=t, src=src, dst=dst, src_node=facts.node_of(src), dst_node=facts.node_of(dst),
                              link=facts.link_between(src, dst)))
    return _gpu_comm_page(
        site, f"gpu_comm_pp_{s_}", f"Send/Recv {s_}→{s_ + 1}", f"Send/Recv {s_}→{s_ + 1}", s_,
        kind="pp", heading=f"Pipeline Send/Recv: stage {s_} → stage {s_ + 1}",
        intro=(f"Every micro-batch, each GPU of stage {s_} sends its activations to the GPU with the same tensor rank "
               f"in stage {s_ + 1}, which sends the gradients back in the backward pass. "
               f"{fmt_bytes(b.bytes_fwd)} forward and {fmt_bytes(b.bytes_bwd)} backward per micro-batch and pair, "
               f"{fmt_plural(facts.m, 'micro-batch', 'micro-batches')} per iteration."),
        comms=_comm_rows(facts, b.comms, per_micro_batch=True), per_micro_batch=True,
        groups_title="Every sender/receiver pair", pairs=pairs, groups=[])


def _group_rows(facts: Facts, groups: Sequence[tuple[str, Sequence[int]]]) -> list[dict[str, Any]]:
    """A table row per (label, ranks) group: its GPUs, their nodes and the link the group uses."""
    return [_row(label=label, ranks=rank_ranges(r), nodes=rank_ranges(facts.nodes_of(r)),
                 link=facts.analysis.cluster.link_for_group(r).name) for label, r in groups]


def _cp_page(site: _Site, p: int, comms: Sequence[CommNode]) -> Page:
    """``gpu_comm_cp_{p}``: the context-parallel groups of stage ``p`` (Ulysses or ring attention)."""
    facts, cfg = site.facts, site.facts.analysis.config
    all_groups = [(f"replica {d}, tensor rank {t}", facts.analysis.rank_map.cp_group(d, p, t))
                  for d in range(facts.dp) for t in range(facts.tp)]
    intro = (f"The sequence of each sample is split into {cfg.cp_size} chunks over these GPUs. "
             + ("Ulysses: before attention an AllToAll turns Q, K and V from sequence-sharded into head-sharded, "
                "after it one more turns the output back; the backward pass mirrors the four. "
                if cfg.cp_scheme is CpScheme.ULYSSES else
                f"Ring attention: each GPU passes its K/V block to the next GPU of the ring, {cfg.cp_size - 1} steps per layer, "
                "overlapped with the attention of the block in hand; backward passes K/V with dK/dV. ")
             + "Their gradients are reduced with the data-parallel group (d × c GPUs). Counts are per micro-batch; times per call.")
    return _listed_groups_page(site, "cp", p, f"CP group, stage {p}", f"Context-parallel groups of stage {p} ({cfg.cp_scheme})",
                               intro, comms, all_groups)


def _ep_page(site: _Site, p: int, comms: Sequence[CommNode]) -> Page:
    """``gpu_comm_ep_{p}``: the expert-parallel groups of stage ``p``."""
    facts, cfg = site.facts, site.facts.analysis.config
    all_groups = [(f"tensor rank {t}, group {k}", facts.analysis.rank_map.ep_group(p, t, k))
                  for t in range(facts.tp) for k in range(cfg.dp_size * cfg.cp_size // cfg.ep_size)]
    intro = (f"Each GPU of a group holds 1/{cfg.ep_size} of every MoE layer's experts. Per MoE layer and micro-batch a dispatch "
             "AllToAll sends the routed tokens to their experts' GPUs and a combine AllToAll brings the outputs back; the "
             f"backward pass mirrors both. Expert gradients are reduced over the {cfg.expert_dp_size} GPUs holding the same "
             "experts (expert-data-parallel group). Counts are per micro-batch; times per call.")
    return _listed_groups_page(site, "ep", p, f"EP group, stage {p}", f"Expert-parallel groups of stage {p}", intro, comms, all_groups)


def _listed_groups_page(site: _Site, key: str, p: int, title: str, heading: str, intro: str, comms: Sequence[CommNode],
                        all_groups: Sequence[tuple[str, Sequence[int]]]) -> Page:
    """A context- or expert-parallel page: its collectives and the first 64 of its groups."""
    name = title.split(",")[0]
    return _gpu_comm_page(
        site, f"gpu_comm_{key}_{p}", title, name, p, kind=key, heading=heading, intro=intro,
        comms=_comm_rows(site.facts, comms, per_micro_batch=True), per_micro_batch=True,
        groups_title=f"{name}s of this stage" + (f" (first 64 of {len(all_groups)})" if len(all_groups) > 64 else ""),
        pairs=[], groups=_group_rows(site.facts, all_groups[:64]))


def _tp_page(site: _Site, p: int, tps: Sequence[CommNode]) -> Page:
    """``gpu_comm_tp_{p}``: the tensor-parallel group of stage ``p``, one per replica."""
    facts = site.facts
    return _gpu_comm_page(
        site, f"gpu_comm_tp_{p}", f"TP group, stage {p}", "TP group", p, kind="tp", heading=f"Tensor-parallel group of stage {p}",
        intro=(f"The {facts.tp} GPUs of stage {p} in each replica reduce with each other: every collective below "
               f"runs as a ring over these GPUs, per micro-batch (counts are per micro-batch; times per call)."),
        comms=_comm_rows(facts, tps, per_micro_batch=True), per_micro_batch=True,
        groups_title="Tensor-parallel groups of this stage (one per replica)", pairs=[],
        groups=_group_rows(facts, [(f"replica {d}", facts.ranks(d, p)) for d in range(facts.dp)]))


def _dp_page(site: _Site, p: int, dps: Sequence[CommNode]) -> Page:
    """``gpu_comm_dp_{p}``: the data-parallel groups of stage ``p``, one per tensor rank."""
    facts = site.facts
    return _gpu_comm_page(
        site, f"gpu_comm_dp_{p}", f"DP groups, stage {p}", "DP groups", p, kind="dp", heading=f"Data-parallel groups of stage {p}",
        intro=(f"Once per iteration the GPUs holding the same shard of stage {p} in the {facts.dp} replicas reduce "
               f"their gradients: {facts.tp} groups of {facts.dp} GPUs, one per tensor rank. The drawing shows the "
               f"group of tensor rank 0; the table lists all of them."),
        comms=_comm_rows(facts, dps), per_micro_batch=False,
        groups_title="Data-parallel groups of this stage (one per tensor rank)", pairs=[],
        groups=_group_rows(facts, [(f"tensor rank {t}", facts.analysis.rank_map.dp_group(p, t)) for t in range(facts.tp)]))


def _group_pages(site: _Site, p: int) -> list[Page]:
    """Stage ``p``'s group pages, in this order: context-, expert-, tensor- and data-parallel (each when it has collectives)."""
    facts = site.facts
    pages = []
    if cp := facts.cp_by_stage.get(p, ()):
        pages.append(_cp_page(site, p, cp))
    if ep := facts.ep_by_stage.get(p, ()):
        pages.append(_ep_page(site, p, ep))
    tps = tuple(c for c in facts.tp_by_stage.get(p, ()) if c.dim is ParallelDim.TP)
    if facts.tp > 1 and tps:
        pages.append(_tp_page(site, p, tps))
    dps = facts.dp_by_stage.get(p, ())
    if facts.dp > 1 and dps:
        pages.append(_dp_page(site, p, dps))
    return pages


def _memory_parts_text(mem: Mapping[str, Any]) -> str:
    """``weights 1.2 GiB, gradients ..., activations 561 MiB (140 MiB per micro-batch × 4 in flight), ...``"""
    out = []
    for key, label, _ in MEMORY_PARTS:
        v = mem.get(key)
        name = label.split(" (")[0].split(" ×")[0]
        text = f"{name} {fmt_bytes(v) if isinstance(v, (int, float)) else 'not modelled'}"
        per, n = mem.get("activations_per_micro_batch_bytes"), mem.get("in_flight_micro_batches")
        if key == "activations_bytes" and isinstance(per, (int, float)) and isinstance(n, (int, float)):
            text += f" ({fmt_bytes(per)} per micro-batch × {fmt_num(n)} in flight)"
        out.append(text)
    return ", ".join(out)


_IN_FLIGHT = {
    "gpipe": "GPipe keeps the activations of all m micro-batches until the backward pass starts",
    "1f1b": "1F1B keeps min(p − s, m) micro-batches in flight on stage s (p − s warm-up forwards before its first backward)",
    "interleaved": ("interleaved 1F1B keeps min(2(p − s − 1) + (v − 1)p + 1, m v) chunk forwards in flight on stage s, "
                    "each 1/v of a micro-batch: p(1 + (p − 1)/(p v)) micro-batches on stage 0 (Megatron-LM's interleaving penalty)"),
}


def _memory_page(facts: Facts, home: Crumb, chart: Chart | None) -> Page:
    a = facts.analysis
    cfg = a.config
    report = a.memory or {}
    cap = facts.capacity_bytes
    gpu = a.cluster.gpu

    def b(mem: Mapping[str, Any], key: str) -> str:
        v = mem.get(key)
        return fmt_bytes(v) if isinstance(v, (int, float)) else "not modelled"

    rows = []
    for p, st in enumerate(a.stages):
        mem = st.memory
        total = facts.memory_per_gpu(p)
        per, n = mem.get("activations_per_micro_batch_bytes"), mem.get("in_flight_micro_batches")
        rows.append(_row(
            index=p, key=f"stage_{p}_data_0", gpus=rank_ranges(facts.ranks(0, p)),
            weights=b(mem, "weights_bytes"), grads=b(mem, "grads_bytes"), optimizer=b(mem, "optimizer_bytes"),
            activations=b(mem, "activations_bytes"),
            act_detail=f"{fmt_bytes(per)} × {fmt_num(n)}" if isinstance(per, (int, float)) and isinstance(n, (int, float)) else "",
            buffers=b(mem, "buffers_bytes"), transient=b(mem, "transient_bytes"), framework=b(mem, "framework_bytes"),
            total=fmt_bytes(total), used=fmt_share(total / cap) if cap else "n/a",
            headroom=fmt_bytes(cap - total) if total <= cap else f"−{fmt_bytes(total - cap)}",
            over=facts.over_memory_text(p),
        ))
    mem_all = [facts.memory_per_gpu(p) for p in range(facts.pp)]
    peak_stage = int(report.get("peak_stage", max(range(facts.pp), key=lambda p: mem_all[p])))
    peak = float(report.get("peak_bytes", max(mem_all)))
    over = facts.over_stages
    fits = not over
    largest = report.get("largest_contributor")
    summary = [
        ("capacity of one GPU", f"{fmt_bytes(cap)} for the allocator ({gpu.name}, {gpu.hbm_bytes / 1e9:g} GB, less "
                                f"{fmt_bytes(gpu.hbm_bytes - cap)} for the CUDA context and workspaces)"),
        ("peak", f"{fmt_bytes(peak)} on stage {peak_stage} ({fmt_share(peak / cap) if cap else 'n/a'} of the GPU)"),
        ("headroom" if fits else "over by", fmt_bytes(abs(cap - peak))),
        ("fits", "yes, on every stage" if fits else
         f"no: stage{'s' if len(over) > 1 else ''} {', '.join(map(str, over))} over capacity"),
    ]
    if largest:
        summary.append(("largest contributor (peak stage)", str(largest)))
    attention = facts.analysis.model_info.get("attention_cores", 1) > 0
    summary.append(("what shapes it", f"{cfg.dtype} training ({cfg.stack_text(attention)}), {cfg.optimizer}, ZeRO stage {cfg.zero_stage}, recomputation "
                                      f"{cfg.recompute}, sequence parallel {'on' if cfg.sequence_parallel else 'off'}, t = {cfg.tp_size}, "
                                      f"{cfg.schedule} with m = {cfg.num_micro_batches} micro-batches of {cfg.micro_batch_size}"))
    suggestions = []
    for s_ in report.get("suggestions", ()) or ():
        if not isinstance(s_, Mapping):
            continue
        it = s_.get("iteration_time_s")
        suggestions.append(_row(change=str(s_.get("change", "")), peak=fmt_bytes(s_.get("peak_bytes")) if s_.get("peak_bytes") is not None else "n/a",
                                fits="fits" if s_.get("fits") else "does not fit", ok=bool(s_.get("fits")),
                                time=fmt_s(it) if isinstance(it, (int, float)) else "", note=str(s_.get("note", ""))))
    return Page(
        key="memory", title="Memory", section="", template="memory.md.j2", crumbs=[home, Crumb("Memory", None)],
        drawing=chart.name if chart is not None else None,
        context=dict(rows=rows, summary=summary, fits=fits, over=over, suggestions=suggestions, peak_text=summary[1][1],
                     in_flight=_IN_FLIGHT.get(cfg.schedule, ""), modelled=facts.activations_modelled, capacity=fmt_bytes(cap),
                     stages_over=[_row(index=p, key=f"stage_{p}_data_0", text=facts.over_memory_text(p)) for p in over]),
    )


def _timeline_page(facts: Facts, home: Crumb, chart: Chart | None) -> Page:
    a = facts.analysis
    cfg = a.config
    s = a.summary
    sim = a.timeline
    iteration = facts.iteration_s
    crit = s.get("critical_stage")
    per_stage = []
    if sim is not None:
        for p in range(facts.pp):
            compute, busy = facts.stage_compute_s[p], facts.stage_busy_s[p]  # the overview's and the stage pages' numbers
            per_stage.append(_row(
                index=p, key=f"stage_{p}_data_0", compute=fmt_s(compute), compute_share=fmt_share(facts.share(compute)),
                busy=fmt_s(busy), busy_share=fmt_share(facts.stage_share[p]),
                compute_end=fmt_s(sim.compute_end_s[p]) if p < len(sim.compute_end_s) else "n/a",
                dp_exposed=fmt_s(sim.dp_exposed_s[p]) if p < len(sim.dp_exposed_s) else "n/a",
                optimizer=fmt_s(a.stages[p].optimizer_time_s),
                end=fmt_s(sim.device_end_s[p]) if p < len(sim.device_end_s) else "n/a",
                critical=crit == p, over=facts.over_memory_text(p),
            ))
    recs = []
    for r in a.recommendations or ():
        t = r.get("iteration_time_s")
        speedup = r.get("speedup")
        recs.append(_row(change=str(r.get("change", "")), note=str(r.get("note", "")), time=fmt_s(t) if isinstance(t, (int, float)) else "n/a",
                         speedup=f"{speedup:.2f}×" if isinstance(speedup, (int, float)) else "n/a",
                         fits="fits" if r.get("fits_in_memory") else "does not fit", ok=bool(r.get("fits_in_memory")),
                         peak=fmt_bytes(r.get("peak_memory_bytes")) if r.get("peak_memory_bytes") is not None else "n/a"))
    v = cfg.chunks
    return Page(
        key="timeline", title="Timeline", section="", template="timeline.md.j2", crumbs=[home, Crumb("Timeline", None)],
        drawing=chart.name if chart is not None else None,
        context=dict(
            has_chart=chart is not None, note=chart.note if chart is not None else "",
            events=len(sim.events) if sim is not None else 0, iteration=fmt_s(iteration), bar=_breakdown(facts),
            bottleneck=s.get("bottleneck") or "n/a", critical=crit, critical_key=f"stage_{crit}_data_0" if isinstance(crit, int) else None,
            recs=recs, per_stage=per_stage, schedule=cfg.schedule + (f" with v = {v} model chunks per GPU" if v > 1 else ""),
            m=facts.m, pp=facts.pp, recompute=cfg.recompute,
            bubble_fraction=fmt_share(s.get("bubble_fraction")), bubble_ratio=fmt_share(s.get("bubble_ratio")),
            mfu=fmt_share(s.get("mfu")),
        ),
    )


def nav_of(pages: Sequence[Page]) -> list[Any]:
    """The MkDocs ``nav``: overview, then one section per level, then references."""
    sections: dict[str, list[Mapping[str, str]]] = {}
    top: list[Any] = []
    for page in pages:
        entry = {page.title: f"{page.key}.md"}
        if not page.section:
            if page.key != "references":
                top.append(entry)
            continue
        if page.section not in sections:
            sections[page.section] = []
            top.append({page.section: sections[page.section]})
        sections[page.section].append(entry)
    top.extend({p.title: f"{p.key}.md"} for p in pages if p.key == "references")
    return top
