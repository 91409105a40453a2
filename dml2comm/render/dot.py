"""Pure DOT builders: an :class:`~dml2comm.render.facts.Facts` in, :class:`Drawing` out.

Nothing here runs Graphviz or writes files (that is :mod:`dml2comm.render.svg`), so the DOT
text can be tested without the binary.

A :class:`Drawing` has two parts:

- ``dot``: everything that decides the layout -- node ids, HTML-like labels (op type and output
  shape, stage and layer summaries), colours, shapes, edges.  Graphviz output is cached by a hash
  of this text, and it is written so that alike drawings are byte-identical: node ids are local
  and synthetic (``n0``, ``n1``, ...; ``e0`` for edges), ONNX names never appear in ids, and
  labels of ops show the op type and shape, not the name.  Twelve transformer blocks therefore
  share one layout.
- ``annotations``: per element id, the tooltip (names, FLOPs, bytes, times, sharding rule) and
  the page it links to.  They do not change the layout and are applied to the SVG after layout,
  escaped for XML by the SVG writer; they never pass through DOT.

Escaping: every string that reaches DOT goes through :func:`html_text` (for HTML-like labels)
or :func:`dot_quote` (for quoted attribute values).  Graphviz expands ``\\N``, ``\\G`` and
friends even inside HTML-like labels, so backslashes are doubled as well as ``& < > " '``
turned into entities; control characters become U+FFFD (XML forbids them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

from dml2comm.analysis import CommNode
from dml2comm.network.kinds import ParallelDim, Phase
from dml2comm.parallel.config import CpScheme
from dml2comm.render.facts import Boundary, Facts, kind_label
from dml2comm.fmt import (
    printable,
    fmt_bytes,
    fmt_count,
    fmt_flops,
    fmt_s,
    fmt_shape,
    fmt_share,
    HOTTEST_OUTLINE,
    HOTTEST_TIE,
    heat_bin,
    link_colour,
    link_short,
    rank_ranges,
    rank_set,
)

__all__ = [
    "Annotation",
    "Drawing",
    "html_text",
    "dot_quote",
    "svg_name",
    "OVERVIEW_REPLICA_COLUMNS",
    "RING_MEMBERS_SHOWN",
    "overview_drawing",
    "replica_drawing",
    "stage_drawing",
    "layer_drawing",
    "pp_comm_drawing",
    "tp_comm_drawing",
    "dp_comm_drawing",
]

#: The overview draws every replica up to this many; beyond, replica 0, replica 1 and one
#: column standing for the rest (replicas are identical up to GPU ids).
OVERVIEW_REPLICA_COLUMNS = 4
#: A ring drawing shows at most this many GPUs; beyond, the first ones, an ellipsis, the last.
RING_MEMBERS_SHOWN = 8

FONT = "Helvetica"
COMM_SHAPE = "hexagon"
_TRUNCATE = 48



def html_text(text: object, newline: str = "<BR/>") -> str:
    """Escape ``text`` for a Graphviz HTML-like label.

    ``\\`` -> ``\\\\`` (Graphviz expands ``\\N`` even in HTML labels), ``& < > " '`` -> XML
    entities, control characters -> U+FFFD, newlines -> ``newline``.
    """
    s = printable(text).replace("\r\n", "\n").replace("\r", "\n")
    s = s.replace("\\", "\\\\")
    s = s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;").replace("'", "&#39;")
    return s.replace("\n", newline)


def dot_quote(text: object) -> str:
    """A DOT double-quoted string: backslashes, quotes and newlines escaped."""
    s = printable(text).replace("\r\n", "\n").replace("\r", "\n")
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _brief(ranks: Sequence[int], parts: int = 4, noun: str = "GPUs") -> str:
    """``GPUs 0–1, 4–5, …, 16–17 (10 GPUs, blocks of 2, stride 4)``: the real set, compactly (fmt.rank_set)."""
    return rank_set(ranks, noun, parts)


def _short(text: str, limit: int = _TRUNCATE) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else "…" + text[-(limit - 1):]


@dataclass(frozen=True)
class Annotation:
    """Tooltip (plain text, may hold newlines) and link target (a page key) of one element."""

    tooltip: str
    href: str | None = None


@dataclass(frozen=True)
class Drawing:
    """One SVG to produce: ``name`` is the file stem in ``svg_file/``, ``page`` the site page."""

    name: str
    page: str
    title: str
    dot: str
    annotations: Mapping[str, Annotation] = field(default_factory=dict)
    #: Share of the iteration of the hottest heat-coloured box: the top of this drawing's
    #: colour scale (0 for drawings without heat colours), for the page's legend.
    hottest: float = 0.0


def svg_name(page: str) -> str:
    """The SVG file stem of a page key (DESIGN.md section 6 names)."""
    if page == "index":
        return "overview"
    if page.startswith(("data_", "stage_", "layer_")):
        return f"{page}_detail"
    return page


# ---------------------------------------------------------------------------------------------
# A tiny DOT writer
# ---------------------------------------------------------------------------------------------


class _Dot:
    def __init__(self, rankdir: str = "TB", nodesep: float = 0.25, ranksep: float = 0.35) -> None:
        self.lines: list[str] = [
            "digraph G {",
            f'  graph [rankdir={rankdir}, fontname="{FONT}", fontsize=11, nodesep={nodesep}, ranksep={ranksep}, '
            'bgcolor="transparent", pad="0.15", newrank=true];',
            f'  node [fontname="{FONT}", fontsize=11, shape=box, style="rounded,filled", fillcolor="#ffffff", '
            'color="#5f6368", penwidth=1, margin="0.12,0.05"];',
            f'  edge [fontname="{FONT}", fontsize=9, color="#5f6368", arrowsize=0.7, penwidth=1.1];',
        ]
        self.annotations: dict[str, Annotation] = {}
        # nodes coloured by heat: (line index, node id, share, comm, other attributes); their
        # colours are set in text(), relative to the hottest of them (see fmt.heat_bin)
        self._hot: list[tuple[int, str, str, float, bool, dict[str, object]]] = []
        self._n = 0
        self._e = 0
        self._c = 0

    def node(self, label: str, tooltip: str | None = None, href: str | None = None, **attrs: object) -> str:
        nid = f"n{self._n}"
        self._n += 1
        heat = attrs.pop("heat", None)
        if heat is not None:  # (share, comm): coloured in text()
            self._hot.append((len(self.lines), nid, label, float(heat[0]), bool(heat[1]), dict(attrs)))  # type: ignore[index]
        self.lines.append(f"  {nid} [id={nid}, label=<{label}>{_attrs(attrs)}];")
        if tooltip is not None or href is not None:
            self.annotations[nid] = Annotation(tooltip or "", href)
        return nid

    def edge(self, a: str, b: str, tooltip: str | None = None, label: str | None = None, xlabel: str | None = None,
             **attrs: object) -> str:
        """An edge; ``label``/``xlabel`` are HTML labels (escaped by the caller), ``xlabel`` placed
        after layout."""
        eid = f"e{self._e}"
        self._e += 1
        lab = (f", label=<{label}>" if label else "") + (f", xlabel=<{xlabel}>" if xlabel else "")
        self.lines.append(f"  {a} -> {b} [id={eid}{lab}{_attrs(attrs)}];")
        if tooltip:
            self.annotations[eid] = Annotation(tooltip)
        return eid

    def same_rank(self, ids: Iterable[str]) -> None:
        ids = list(ids)
        if len(ids) > 1:
            self.lines.append("  { rank=same; " + "; ".join(ids) + "; }")

    def open_cluster(self, label: str, **attrs: object) -> None:
        cid = f"cluster_{self._c}"
        self._c += 1
        self.lines.append(f"  subgraph {cid} {{")
        self.lines.append(f"    id={cid}; label=<{label}>; labeljust=l; fontsize=10; fontcolor=\"#3c4043\";")
        for k, v in attrs.items():
            self.lines.append(f"    {k}={dot_quote(v)};")

    def close_cluster(self) -> None:
        self.lines.append("  }")

    @property
    def hottest_share(self) -> float:
        """The largest share of the iteration among the heat-coloured boxes (0 when none)."""
        return max((h[3] for h in self._hot), default=0.0)

    def text(self) -> str:
        top = self.hottest_share
        lines = list(self.lines)
        for at, nid, label, share, comm, attrs in self._hot:
            ratio = share / top if top > 0 else 0.0
            b = heat_bin(ratio, comm)
            attrs = dict(attrs, fillcolor=b.fill, fontcolor=b.font)
            if top > 0 and ratio >= HOTTEST_TIE and attrs.get("color") != OVER_COLOUR:
                attrs.update(color=HOTTEST_OUTLINE, penwidth=3)  # the bottleneck of this drawing
            lines[at] = f"  {nid} [id={nid}, label=<{label}>{_attrs(attrs)}];"
        return "\n".join(lines + ["}"]) + "\n"


def _attrs(attrs: Mapping[str, object]) -> str:
    return "".join(f", {k}={dot_quote(v)}" for k, v in attrs.items() if v is not None)


def _label(title: str, *lines: str, small: int = 9) -> str:
    """HTML label: a bold first line, then smaller lines; every piece escaped here."""
    out = f"<B>{html_text(title)}</B>"
    for line in lines:
        if line:
            out += f'<BR/><FONT POINT-SIZE="{small}">{html_text(line)}</FONT>'
    return out


def _heat(share: float, comm: bool = False) -> dict[str, object]:
    """Colour by ``share`` of the iteration relative to the hottest box of the drawing (set
    when the DOT text is written, :meth:`_Dot.text`)."""
    return {"heat": (share, comm)}


#: Outline of a stage that does not fit in one GPU's memory (double, red), applied like the
#: heat colours: as node attributes in the DOT, so alike stages stay alike.
OVER_COLOUR = "#d50000"


def _over(facts: Facts, p: int) -> dict[str, object]:
    """Node attributes that mark stage ``p`` as over the GPU's memory (none when it fits)."""
    if not facts.over_capacity(p):
        return {}
    return {"color": OVER_COLOUR, "penwidth": 2, "peripheries": 2}


def _over_tip(facts: Facts, p: int) -> str:
    """A tooltip's last line for stage ``p``: ``\nover memory: X of Y`` ("" when it fits)."""
    text = facts.over_memory_text(p)
    return f"\n{text} (see the Memory page)" if text else ""


def _comm_attrs(share: float, backward: bool = False) -> dict[str, object]:
    attrs: dict[str, object] = {"shape": COMM_SHAPE, "style": "filled,dashed" if backward else "filled", "color": "#08306b",
                                "margin": "0.02,0.02"}
    attrs.update(_heat(share, comm=True))
    return attrs


def _comm_tooltip(facts: Facts, c: CommNode, extra: str = "") -> str:
    per_iter = c.time_s * c.count_per_iteration
    lines = [
        f"{kind_label(c.kind)} ({c.dim.value.upper()}, {c.phase.value})",
        c.reason,
        f"tensor: {c.tensor}",
        f"message: {fmt_bytes(c.message_bytes)}; sent per GPU: {fmt_bytes(c.bytes_sent_per_gpu)}",
        f"algorithm: {c.algorithm} over {c.group_size} GPUs ({rank_ranges(c.group)} in replica 0)",
        f"link: {c.link}",
        f"time: {fmt_s(c.time_s)} per call x {c.count_per_iteration} per iteration = {fmt_s(per_iter)}",
        f"{fmt_share(facts.comm_share(c))} of the iteration",
    ]
    if extra:
        lines.append(extra)
    return "\n".join(lines)


def _tied_tip(facts: Facts, stages: tuple[int, ...], comms: Sequence[CommNode]) -> str:
    """Tooltip of a tied-weight gradient all-reduce between ``stages`` (Megatron's embedding group)."""
    c = comms[0]
    return (f"tied-weight gradient all-reduce between stages {', '.join(map(str, stages))} "
            f"(Megatron-LM's embedding group for a tied word embedding), once per iteration after the backward pass, "
            f"before the optimizer step\n"
            f"weights: {_short(c.tensor)}\n"
            f"message: {fmt_bytes(c.message_bytes)} per GPU pair, {c.algorithm} over {c.link}: {fmt_s(c.time_s)}\n"
            f"{fmt_share(facts.comm_share(c))} of the iteration")


def _tied_label(comms: Sequence[CommNode], where: str = "") -> str:
    """The tied-weight edge's label in two lines, held off its edge by an empty cell: Graphviz puts
    an edge label just right of the edge, which on the overview's curved return edge cut its
    first letters."""
    text = (html_text(f"tied-weight grad all-reduce{where}") + '<BR ALIGN="LEFT"/>'
            + html_text(f"{fmt_bytes(comms[0].message_bytes)} · {fmt_s(comms[0].time_s)}") + '<BR ALIGN="LEFT"/>')
    return f'<TABLE BORDER="0" CELLBORDER="0" CELLSPACING="0" CELLPADDING="0"><TR><TD WIDTH="14"></TD><TD>{text}</TD></TR></TABLE>'


# ---------------------------------------------------------------------------------------------
# Overview: replicas x stages
# ---------------------------------------------------------------------------------------------


def replica_columns(dp: int) -> list[tuple[int, ...]]:
    """Replicas drawn as columns: all up to :data:`OVERVIEW_REPLICA_COLUMNS`, else 0, 1, rest."""
    if dp <= OVERVIEW_REPLICA_COLUMNS:
        return [(d,) for d in range(dp)]
    return [(0,), (1,), tuple(range(2, dp))]


def replica_page(dp: int, d: int, replica_pages_max: int) -> str:
    """Page key that shows replica ``d``."""
    if d == 0 or dp <= replica_pages_max + 1:
        return f"data_{d}"
    return "replicas"


def overview_drawing(facts: Facts, replica_pages_max: int) -> Drawing:
    """A column per replica (alike replicas folded into one), each the chain of its stages, with the
    data-parallel collectives between the columns and the tied-embedding group on the last column."""
    g = _Dot(rankdir="TB", nodesep=0.35, ranksep=0.45)
    columns = replica_columns(facts.dp)
    headers: list[str] = []
    boxes: list[list[str]] = []  # [column][stage]
    for col in columns:
        header, column_boxes = _overview_column(g, facts, col, replica_pages_max)
        headers.append(header)
        boxes.append(column_boxes)
        if col is columns[-1]:
            _overview_tied(g, facts, column_boxes, each=len(columns) > 1 or len(col) > 1)
    g.same_rank(headers)
    if len(columns) > 1:
        for p in range(len(facts.analysis.stages)):
            _overview_dp_row(g, facts, [column[p] for column in boxes], p)
    return Drawing("overview", "index", "Overview: replicas and stages", g.text(), g.annotations, g.hottest_share)


def _overview_column(g: _Dot, facts: Facts, col: tuple[int, ...], replica_pages_max: int) -> tuple[str, list[str]]:
    """One column: a header naming its replicas, then a box per stage joined by the pipeline Send/Recv."""
    a = facts.analysis
    first = col[0]
    ranks = [r for d in col for r in facts.replica_ranks(d)]
    title = f"replica {first}" if len(col) == 1 else f"replicas {col[0]}–{col[-1]}"
    page = replica_page(facts.dp, first, replica_pages_max)
    subs = [f"{len(col)} alike replicas", _brief(ranks)] if len(col) > 1 else [_brief(ranks)]
    tip = f"{title}: {len(ranks)} GPUs ({rank_ranges(ranks)}), nodes {rank_ranges(facts.nodes_of(ranks))}"
    if len(col) > 1:
        tip += "\nreplicas are identical up to GPU ids; replica 0 is drawn in detail"
    header = g.node(_label(title, *subs), tip, page, shape="box", style="filled", fillcolor="#e8eaed", color="#e8eaed")
    column_boxes = []
    for p, st in enumerate(a.stages):
        ranks_p = [r for d in col for r in facts.ranks(d, p)]
        layers = facts.layer_span(p)
        share = facts.stage_share[p]
        tip = (
            f"stage {p} of {title}: {layers} ({len(st.layers)} layers)\n"
            f"GPUs {rank_ranges(ranks_p)} on node(s) {rank_ranges(facts.nodes_of(ranks_p))}\n"
            f"per micro-batch: forward {fmt_s(st.time_fwd_s)}, backward {fmt_s(st.time_bwd_s)}\n"
            f"parameters {fmt_count(st.params)} ({fmt_count(st.params_per_gpu)} per GPU)\n"
            f"{fmt_share(share)} of the iteration busy per GPU"
            + _over_tip(facts, p)
        )
        target = f"stage_{p}_data_0" if first == 0 else page
        column_boxes.append(
            g.node(_label(f"stage {p}", layers, _brief(ranks_p), f"{fmt_share(share)} busy",
                          "over memory" if facts.over_capacity(p) else ""),
                   tip, target, **_heat(share), **_over(facts, p))
        )
    g.edge(header, column_boxes[0], style="invis")
    for p in range(len(a.stages) - 1):
        b = facts.boundaries[p]
        g.edge(column_boxes[p], column_boxes[p + 1],
               f"pipeline Send/Recv stage {p} -> {p + 1}: {fmt_bytes(b.bytes_fwd)} forward, "
               f"{fmt_bytes(b.bytes_bwd)} backward per micro-batch over {b.link}",
               color="#08519c")
    return header, column_boxes


def _overview_tied(g: _Dot, facts: Facts, column_boxes: list[str], each: bool) -> None:
    """Every replica has the same embedding group: drawn once, on the last column, where the edge
    runs down the drawing's free right side (Graphviz routes it across the other columns from any
    inner one), its label outside the columns."""
    where = " (each replica)" if each else ""
    for stages, comms in sorted(facts.tied_groups.items()):
        if len(stages) > 1 and all(0 <= s < len(column_boxes) for s in stages):
            g.edge(column_boxes[stages[-1]], column_boxes[stages[0]], _tied_tip(facts, stages, comms),
                   label=_tied_label(comms, where), dir="both", style="dashed", color="#6a3d9a",
                   fontcolor="#6a3d9a", fontsize=8, constraint="false", tailport="e", headport="e")


def _overview_dp_row(g: _Dot, facts: Facts, row_boxes: list[str], p: int) -> None:
    """Stage ``p``'s boxes of every column in one rank, joined by dashed lines; between the first two
    a node for the stage's data-parallel collectives."""
    dps = facts.dp_by_stage.get(p, ())
    row = [row_boxes[0]]
    if dps:
        total = sum(c.message_bytes * c.count_per_iteration for c in dps)
        t = sum(c.time_s * c.count_per_iteration for c in dps)
        kinds = "/".join(dict.fromkeys(kind_label(c.kind) for c in dps))
        share = facts.comms_share(dps)
        tip = (
            f"data-parallel {kinds} of stage {p}'s gradients across the {facts.dp} replicas\n"
            + "\n".join(f"{c.count_per_iteration} x {fmt_bytes(c.message_bytes)} {kind_label(c.kind)} ({c.phase.value}): "
                        f"{fmt_s(c.time_s)} each, {c.algorithm} over {c.link}" for c in dps)
            + f"\nper iteration: {fmt_bytes(total)}, {fmt_s(t)} ({fmt_share(share)} of the iteration)"
        )
        dp_node = g.node(_label(f"DP {kinds}", f"{fmt_bytes(total)} / iteration", fmt_s(t)), tip, f"gpu_comm_dp_{p}",
                         **_comm_attrs(share))
        # flat edges inside a rank order it left to right: replica 0, DP node, replica 1
        g.edge(row_boxes[0], dp_node, dir="none", style="dashed", color="#08519c")
        g.edge(dp_node, row_boxes[1], dir="none", style="dashed", color="#08519c")
        row.append(dp_node)
    for ci in range(1, len(row_boxes)):
        row.append(row_boxes[ci])
        if ci >= 2 or not dps:
            g.edge(row_boxes[ci - 1], row_boxes[ci], dir="none", style="dashed", color="#08519c")
    g.same_rank(row)


# ---------------------------------------------------------------------------------------------
# Replica: its stages and the Send/Recv between them
# ---------------------------------------------------------------------------------------------


#: what a Send/Recv's host part is, for its tooltips
_HOST_NOTE = "host: the training framework's CPU time per pipeline message (the host model among the assumptions)"


def _host_line(b: Boundary) -> str:
    """The tooltip line naming a boundary's host time, or nothing when the host model has none."""
    return f"\n{_HOST_NOTE}" if b.host_fwd_s or b.host_bwd_s else ""


def _host_label(b: Boundary) -> str:
    """A box line splitting the forward time into transfer and host time ('' without host time)."""
    return f"{fmt_s(b.time_fwd_s - b.host_fwd_s)} transfer + {fmt_s(b.host_fwd_s)} host" if b.host_fwd_s else ""


def _boundary_node(g: _Dot, facts: Facts, b: Boundary, d: int) -> str:
    src, dst = facts.ranks(d, b.stage), facts.ranks(d, b.stage + 1)
    share = facts.comms_share(b.comms)
    n = len(b.forward)
    tensors = f"{n} tensors" if n != 1 else "1 tensor"
    tip = (
        f"pipeline boundary stage {b.stage} -> {b.stage + 1} (replica {d}), per micro-batch:\n"
        f"activation forward: {fmt_bytes(b.bytes_fwd)} in {b.time_text()} ({tensors})\n"
        f"gradient backward: {fmt_bytes(b.bytes_bwd)} in {b.time_text(backward=True)}\n"
        + _host_line(b).lstrip("\n") + ("\n" if b.host_fwd_s or b.host_bwd_s else "") +
        f"GPUs {rank_ranges(src)} -> {rank_ranges(dst)}, each tensor rank to its peer, over {b.link}\n"
        + (f"scatter/gather (Megatron-LM): each tensor rank sends 1/{b.gather_fwd[0].group_size} of the tensor; the "
           f"receivers all-gather it ({fmt_s(sum(c.time_s for c in b.gather_fwd))} forward, "
           f"{fmt_s(sum(c.time_s for c in b.gather_bwd))} backward, included above)\n" if b.gather_fwd else "")
        + "".join(f"tensor: {c.tensor}\n" for c in b.forward[:6])
        + (f"... and {n - 6} more\n" if n > 6 else "")
        + f"{fmt_share(share)} of the iteration"
    )
    return g.node(
        _label("Send/Recv" + (" + all-gather" if b.gather_fwd else ""), f"↓ {fmt_bytes(b.bytes_fwd)} · {fmt_s(b.time_fwd_s)}",
               f"↑ {fmt_bytes(b.bytes_bwd)} · {fmt_s(b.time_bwd_s)}", f"per micro-batch · {link_short(b.link)}"),
        tip, f"gpu_comm_pp_{b.stage}", **_comm_attrs(share),
    )


def replica_drawing(facts: Facts, d: int) -> Drawing:
    a = facts.analysis
    g = _Dot(rankdir="TB", ranksep=0.3)
    prev = None
    stage_nodes: list[str] = []
    for p, st in enumerate(a.stages):
        lo, hi = facts.layer_range(p)
        ranks = facts.ranks(d, p)
        nodes = facts.nodes_of(ranks)
        share = facts.stage_share[p]
        first, last = a.layers[lo].name, a.layers[hi].name
        tip = (
            f"stage {p} of replica {d}: layers {lo}–{hi} ({first} … {last})\n"
            f"GPUs {rank_ranges(ranks)} on node(s) {rank_ranges(nodes)}\n"
            f"per micro-batch: forward {fmt_s(st.time_fwd_s)} (compute {fmt_s(st.compute_fwd_s)}), "
            f"backward {fmt_s(st.time_bwd_s)} (compute {fmt_s(st.compute_bwd_s)})\n"
            f"data-parallel {fmt_s(st.dp_time_s)} and optimizer {fmt_s(st.optimizer_time_s)} per iteration\n"
            f"{fmt_share(share)} of the iteration busy per GPU"
            + ("" if d == 0 else "\nthe stage's layers are drawn for replica 0 (identical up to GPU ids)")
            + _over_tip(facts, p)
        )
        layers = facts.layer_span(p)
        node = g.node(
            _label(f"stage {p}", f"{layers} · {fmt_count(st.params_per_gpu)} params/GPU",
                   f"{_brief(ranks, 2)} · {_brief(nodes, 2, 'nodes' if len(nodes) > 1 else 'node')}",
                   f"fwd {fmt_s(st.time_fwd_s)} · bwd {fmt_s(st.time_bwd_s)} / µbatch", f"{fmt_share(share)} busy",
                   facts.over_memory_text(p)),
            tip, f"stage_{p}_data_0", **_heat(share), **_over(facts, p),
        )
        if prev is not None:
            bnode = _boundary_node(g, facts, facts.boundaries[p - 1], d)
            g.edge(prev, bnode, color="#08519c")
            g.edge(bnode, node, color="#08519c")
        prev = node
        stage_nodes.append(node)
    for stages, comms in sorted(facts.tied_groups.items()):
        if len(stages) > 1 and all(0 <= s < len(stage_nodes) for s in stages):
            share = facts.comms_share(comms[:1])
            tied = g.node(_label("AllReduce", "tied embedding gradient", f"{fmt_bytes(comms[0].message_bytes)} · {fmt_s(comms[0].time_s)}",
                                 "once per iteration"), _tied_tip(facts, stages, comms), None, **_comm_attrs(share))
            for s in stages:
                g.edge(stage_nodes[s], tied, dir="both", style="dashed", color="#6a3d9a", constraint="false")
    return Drawing(f"data_{d}_detail", f"data_{d}", f"Replica {d}: pipeline stages", g.text(), g.annotations, g.hottest_share)


# ---------------------------------------------------------------------------------------------
# Stage: its layers, GPUs and groups
# ---------------------------------------------------------------------------------------------


def _group_summary(comms: Sequence[CommNode], per_micro_batch: bool, m: int) -> str:
    counts: dict[str, int] = {}
    for c in comms:
        key = kind_label(c.kind)
        counts[key] = counts.get(key, 0) + (c.count_per_iteration // m if per_micro_batch and c.per_micro_batch else c.count_per_iteration)
    return ", ".join(f"{n}× {k}" for k, n in counts.items())


def _stage_gpus_node(g: _Dot, facts: Facts, p: int) -> str:
    """The box of stage ``p``'s GPUs (replica 0, the first 8 listed), red-outlined when over memory."""
    st = facts.analysis.stages[p]
    ranks = facts.ranks(0, p)
    gpu_lines = [f"GPU {r} · node {facts.node_of(r)} · t={t}" for t, r in enumerate(ranks[:8])]
    if len(ranks) > 8:
        gpu_lines.append(f"… {len(ranks) - 8} more (GPUs {rank_ranges(ranks)})")
    over = facts.over_memory_text(p)
    return g.node(_label(f"GPUs of stage {p}", *gpu_lines, over), f"replica 0, stage {p}: GPUs {rank_ranges(ranks)}; each holds 1/{facts.tp} "
                  f"of the stage's tensor-parallel weights ({fmt_count(st.params_per_gpu)} parameters)\n"
                  f"memory per GPU: {fmt_bytes(facts.memory_per_gpu(p))} of {fmt_bytes(facts.capacity_bytes)}" + _over_tip(facts, p),
                  None, shape="box", style="filled", fillcolor="#e8eaed", **({"color": "#bdc1c6"} | _over(facts, p)))


def _stage_group_nodes(g: _Dot, facts: Facts, p: int) -> list[str]:
    """The stage's communication groups beside its GPUs: context-, expert-, tensor-, data-parallel
    (each when it has collectives), linking to their pages."""
    a = facts.analysis
    ranks = facts.ranks(0, p)
    nodes = []
    tps = tuple(c for c in facts.tp_by_stage.get(p, ()) if c.dim is ParallelDim.TP)
    for key, title, comms, group in (("cp", "CP group", facts.cp_by_stage.get(p, ()), a.rank_map.cp_group(0, p, 0)),
                                     ("ep", "EP group", facts.ep_by_stage.get(p, ()), a.rank_map.ep_group(p, 0, 0))):
        if comms:
            share = facts.comms_share(comms)
            link = comms[0].link
            nodes.append(g.node(_label(title, f"{_group_summary(comms, True, facts.m)} / µbatch", f"GPUs {rank_ranges(group)} · {link_short(link)}"),
                                f"{'context' if key == 'cp' else 'expert'}-parallel collectives of stage {p}: "
                                f"{len(comms)} per micro-batch kinds listed on the page\n"
                                f"group of tensor rank 0: GPUs {rank_ranges(group)} over {link}\n{fmt_share(share)} of the iteration",
                                f"gpu_comm_{key}_{p}", **_comm_attrs(share)))
    if tps:
        share = facts.comms_share(tps)
        link = tps[0].link
        nodes.append(g.node(_label("TP group", f"{_group_summary(tps, True, facts.m)} / µbatch", f"GPUs {rank_ranges(ranks)} · {link_short(link)}"),
                            f"tensor-parallel collectives of stage {p}: {len(tps)} per micro-batch kinds listed on the page\n"
                            f"group: GPUs {rank_ranges(ranks)} over {link}\n{fmt_share(share)} of the iteration",
                            f"gpu_comm_tp_{p}", **_comm_attrs(share)))
    dps = facts.dp_by_stage.get(p, ())
    if dps:
        share = facts.comms_share(dps)
        group = a.rank_map.dp_group(p, 0)
        total = sum(c.message_bytes * c.count_per_iteration for c in dps)
        nodes.append(g.node(_label("DP groups", f"{_group_summary(dps, False, facts.m)} / iteration", f"{fmt_bytes(total)} · {link_short(dps[0].link)}"),
                            f"data-parallel collectives of stage {p}: {facts.tp} groups of {facts.dp} GPUs (e.g. {rank_ranges(group)})\n"
                            f"{fmt_bytes(total)} per iteration over {dps[0].link}\n{fmt_share(share)} of the iteration",
                            f"gpu_comm_dp_{p}", **_comm_attrs(share)))
    return nodes


def _stage_layer_node(g: _Dot, facts: Facts, li: int) -> str:
    """A layer's box in its stage's chain: name, kind, ops, parameters, times and its collectives."""
    layer = facts.analysis.layers[li]
    tps_l = facts.tp_by_layer.get(li, ())
    share = facts.layer_share[li]
    tip = (
        f"layer {li}: {layer.name} ({layer.kind})\n{layer.num_ops} ops, {fmt_count(layer.params)} parameters, "
        f"{fmt_flops(layer.flops_fwd)} forward per micro-batch (unsharded)\n"
        f"compute per micro-batch on one GPU: forward {fmt_s(layer.time_fwd_s)}, backward {fmt_s(layer.time_bwd_s)}\n"
        + (f"tensor-parallel: {_group_summary(tps_l, True, facts.m)} per micro-batch\n" if tps_l else "")
        + f"{fmt_share(share)} of the iteration"
    )
    return g.node(
        _label(_short(layer.name, 36), f"{layer.kind} · {layer.num_ops} ops · {fmt_count(layer.params)} params",
               f"fwd {fmt_s(layer.time_fwd_s)} · bwd {fmt_s(layer.time_bwd_s)}",
               f"{'/'.join(sorted({c.dim.value.upper() for c in tps_l}, key=('TP', 'CP', 'EP').index))}: "
               f"{_group_summary(tps_l, True, facts.m)} / µbatch" if tps_l else ""),
        tip, f"layer_{li}_data_0", **_heat(share),
    )


def _stage_tied_copy(g: _Dot, facts: Facts, p: int, last: str | None) -> None:
    """A tied copy the stage holds (the word embedding on the LM head's stage), beside its last layer:
    its parameters count in the stage's."""
    st = facts.analysis.stages[p]
    tied = [c for stages, comms in facts.tied_groups.items() if p in stages for c in comms if c.stage == p]
    owners = ", ".join(map(str, st.held_from))
    held = g.node(
        _label("tied copy", _short(", ".join(st.held_tensors), 36), f"{fmt_count(st.held_params)} params · owned by stage {owners}",
               f"grad all-reduce {fmt_s(sum(c.time_s for c in tied))} / iteration" if tied else ""),
        f"a copy of {', '.join(st.held_tensors)} ({fmt_count(st.held_params)} parameters), owned by stage {owners}: "
        f"this stage's layers read it, so it holds the weight, its gradient and its optimizer states\n"
        f"the stage's {fmt_count(st.params)} parameters = {fmt_count(st.params - st.held_params)} in its layers + "
        f"{fmt_count(st.held_params)} in this copy\n"
        + ("after the backward pass its gradient is all-reduced with the owner's (Megatron-LM's embedding group)"
           if tied else ""),
        f"stage_{st.held_from[0]}_data_0" if st.held_from else None,
        shape="box", style="rounded,dashed,filled", fillcolor="#f3e8fd", color="#6a3d9a")
    g.edge(held, last, style="dashed", color="#6a3d9a", arrowhead="none", constraint="false")  # type: ignore[arg-type]


def _stage_pp_node(g: _Dot, facts: Facts, b: Boundary, receive: bool) -> str:
    """The Recv box at the top (``receive``) or the Send box at the bottom of a stage's chain."""
    if receive:
        s = b.stage
        return g.node(_label(f"Recv ← stage {s}", f"{fmt_bytes(b.bytes_fwd)} · {fmt_s(b.time_fwd_s)} / µbatch", _host_label(b)),
                      f"activations from stage {s} ({fmt_bytes(b.bytes_fwd)} per micro-batch, {b.time_text()}); "
                      f"gradients go back ({fmt_bytes(b.bytes_bwd)}, {b.time_text(backward=True)}) over {b.link}" + _host_line(b),
                      f"gpu_comm_pp_{s}", **_comm_attrs(facts.comms_share(b.comms)))
    s = b.stage + 1
    return g.node(_label(f"Send → stage {s}", f"{fmt_bytes(b.bytes_fwd)} · {fmt_s(b.time_fwd_s)} / µbatch", _host_label(b)),
                  f"activations to stage {s} ({fmt_bytes(b.bytes_fwd)} per micro-batch, {b.time_text()}); "
                  f"gradients come back ({fmt_bytes(b.bytes_bwd)}, {b.time_text(backward=True)}) over {b.link}" + _host_line(b),
                  f"gpu_comm_pp_{b.stage}", **_comm_attrs(facts.comms_share(b.comms)))


def stage_drawing(facts: Facts, p: int) -> Drawing:
    """A stage of replica 0: its GPUs and groups in a row, under them the chain Recv -> layers -> Send."""
    st = facts.analysis.stages[p]
    g = _Dot(rankdir="TB", ranksep=0.28)
    top = [_stage_gpus_node(g, facts, p)]
    top += _stage_group_nodes(g, facts, p)
    g.same_rank(top)
    prev = _stage_pp_node(g, facts, facts.boundaries[p - 1], receive=True) if p > 0 else None
    anchor = top[len(top) // 2]  # the chain of layers hangs centred under the row of groups
    if prev is not None:
        g.edge(anchor, prev, style="invis")
    for li in st.layers:
        node = _stage_layer_node(g, facts, li)
        g.edge(prev, node) if prev is not None else g.edge(anchor, node, style="invis")
        prev = node
    if st.held_params:
        _stage_tied_copy(g, facts, p, prev)
    if p < facts.pp - 1:
        g.edge(prev, _stage_pp_node(g, facts, facts.boundaries[p], receive=False))  # type: ignore[arg-type]
    return Drawing(f"stage_{p}_data_0_detail", f"stage_{p}_data_0", f"Stage {p} (replica 0): layers", g.text(), g.annotations, g.hottest_share)


# ---------------------------------------------------------------------------------------------
# Layer: operators and the collectives inserted between them
# ---------------------------------------------------------------------------------------------


def _op_tooltip(facts: Facts, index: int) -> str:
    a = facts.analysis
    op = a.graph.ops[index]
    info = a.ops[index]
    c = info.cost
    weights = [a.graph.tensors[n] for n in op.inputs if n and n in a.graph.tensors and a.graph.tensors[n].is_weight]
    out = a.graph.tensors.get(op.outputs[0]) if op.outputs and op.outputs[0] else None
    lines = [
        op.name or f"(unnamed {op.op_type})",
        f"{op.op_type}{' (domain ' + op.domain + ')' if op.domain not in ('', 'ai.onnx') else ''}: output "
        f"{fmt_shape(info.output_shape)} on one GPU" + (f" ({out.dtype.label} in the model)" if out is not None else ""),
        f"FLOPs: forward {fmt_flops(c.flops_fwd)}, backward {fmt_flops(c.flops_bwd)}",
        f"HBM bytes: forward {fmt_bytes(c.bytes_fwd)}, backward {fmt_bytes(c.bytes_bwd)}",
        f"time per micro-batch: forward {fmt_s(info.time_fwd_s)}, backward {fmt_s(info.time_bwd_s)}",
        f"sharded by: {info.shard_rule}" + (f" (work split {info.shard_factor} ways)" if info.shard_factor > 1 else ""),
        f"cost rule: {c.rule}" + (" (unknown op, memory-bound guess)" if c.fallback else ""),
        f"{fmt_share(facts.op_share(index))} of the iteration",
    ]
    for w in weights[:4]:
        lines.append(f"weight {w.name}: {fmt_shape(w.shape)}")
    return "\n".join(lines)


def _op_time(fwd_s: float, bwd_s: float) -> str:
    """An operator box's time line, ``312.0 µs fwd · 624.0 µs bwd`` per micro-batch on one GPU
    ("" for ops that take no time, such as Reshape)."""
    parts = [f"{fmt_s(t)} {what}" for t, what in ((fwd_s, "fwd"), (bwd_s, "bwd")) if t > 0]
    return " · ".join(parts)


def _tensor_tip(facts: Facts, name: str) -> str:
    a = facts.analysis
    t = facts.local_shape.get(name) or a.graph.tensors.get(name)
    if t is None:
        return name
    return f"tensor {name}\n{fmt_shape(t.shape)} {t.dtype.label} on one GPU ({fmt_bytes(t.nbytes)})"


_PLAIN_BOX = dict(shape="box", style="rounded,filled", fillcolor="#f1f3f4", color="#bdc1c6", fontcolor="#3c4043")


class _LayerDrawing:
    """The drawing of one layer: its operators, the collectives on the tensors they act on, and a
    box for every tensor that enters or leaves the layer."""

    def __init__(self, facts: Facts, li: int) -> None:
        a = facts.analysis
        self.facts, self.li, self.graph = facts, li, a.graph
        self.layer = a.layered.layers[li]
        self.stage = a.layers[li].stage
        self.in_layer = set(self.layer.op_indices)
        self.g = _Dot(rankdir="TB", nodesep=0.22, ranksep=0.26)
        self.node_of_op: dict[int, str] = {}
        self.source: dict[str, str] = {}  # tensor -> node that currently provides it
        self.externals: dict[str, str] = {}
        self.comm_nodes: dict[str, str] = {}

    def _shape(self, name: str) -> str:
        t = self.facts.local_shape.get(name) or self.graph.tensors.get(name)
        return fmt_shape(t.shape) if t is not None else ""

    def external(self, name: str) -> str:
        """The box of a tensor from outside the layer (drawn once): a model input, a Recv from the
        previous stage, or a tensor from another layer."""
        if name in self.externals:
            return self.externals[name]
        facts, g, stage = self.facts, self.g, self.stage
        shape = self._shape(name)
        prod = self.graph.producer(name)
        if prod is None:
            nid = g.node(_label("model input", shape), _tensor_tip(facts, name), None, **_PLAIN_BOX)
        else:
            src_layer = facts.analysis.layered.layer_of_op[prod]
            if facts.analysis.layers[src_layer].stage != stage:
                b = facts.boundaries[stage - 1]
                nid = g.node(_label(f"Recv ← stage {stage - 1}", shape),
                             f"{_tensor_tip(facts, name)}\nreceived from stage {stage - 1} every micro-batch; "
                             f"its gradient goes back\nboundary: {fmt_bytes(b.bytes_fwd)} in {b.time_text()} over {b.link}" + _host_line(b),
                             f"gpu_comm_pp_{stage - 1}", **_comm_attrs(facts.comms_share(b.comms)))
            else:
                # relative wording keeps alike blocks byte-identical (one layout for all of them)
                where = "previous layer" if src_layer == self.li - 1 else f"layer {src_layer}"
                nid = g.node(_label(f"from {where}", shape), f"{_tensor_tip(facts, name)}\nfrom layer {src_layer}", f"layer_{src_layer}_data_0",
                             **_PLAIN_BOX)
        self.externals[name] = nid
        return nid

    def operators(self) -> None:
        """A box per operator, heat-coloured by its share of the iteration."""
        a = self.facts.analysis
        for i in self.layer.op_indices:
            info = a.ops[i]
            self.node_of_op[i] = self.g.node(_label(self.graph.ops[i].op_type, fmt_shape(info.output_shape),
                                                    _op_time(info.time_fwd_s, info.time_bwd_s)),
                                             _op_tooltip(self.facts, i), None, **_heat(self.facts.op_share(i)))
        for i in self.layer.op_indices:
            for name in self.graph.ops[i].outputs:
                if name:
                    self.source[name] = self.node_of_op[i]

    def collectives(self) -> None:
        """Collectives sit on the tensor they act on: producer -> collective -> consumers."""
        facts, g = self.facts, self.g
        comm_after: dict[str, list[CommNode]] = {}
        for c in facts.tp_by_layer.get(self.li, ()):
            comm_after.setdefault(c.tensor, []).append(c)
        for name, comms in comm_after.items():
            for c in comms:
                src = self.source.get(name) or self.external(name)
                backward = c.phase is Phase.BACKWARD
                phase = "bwd" if backward else "fwd"
                nid = g.node(_label(kind_label(c.kind), f"{phase} · {fmt_bytes(c.message_bytes)} · {fmt_s(c.time_s)}"),
                             _comm_tooltip(facts, c, "forward: identity; backward: AllReduce of the input gradient" if backward else ""),
                             f"gpu_comm_tp_{self.stage}", **_comm_attrs(facts.comm_share(c), backward))
                g.edge(src, nid, _tensor_tip(facts, name), color="#08519c")
                self.source[name] = nid
                self.comm_nodes[name] = nid

    def inputs(self) -> None:
        """An edge per activation an operator reads (weights and constants left out), once per pair of boxes."""
        graph = self.graph
        edges_done: set[tuple[str, str]] = set()
        for i in self.layer.op_indices:
            for name in graph.ops[i].inputs:
                if not name:
                    continue
                t = graph.tensors.get(name)
                if t is not None and t.is_weight:
                    continue
                prod = graph.producer(name)
                if prod is None and name not in graph.inputs:
                    continue  # constants and initializers that are not weights
                src = self.source.get(name) if prod in self.in_layer or name in self.comm_nodes else None
                if src is None:
                    src = self.external(name)
                key = (src, self.node_of_op[i])
                if key in edges_done:
                    continue
                edges_done.add(key)
                self.g.edge(src, self.node_of_op[i], _tensor_tip(self.facts, name), color="#08519c" if name in self.comm_nodes else None)

    def outputs(self) -> None:
        """A box per tensor leaving the layer: a Send to the next stage, the layer(s) reading it, or a model output."""
        graph = self.graph
        layer_of_op = self.facts.analysis.layered.layer_of_op
        pp_fwd = {c.tensor: c for b in self.facts.boundaries for c in b.forward}
        for i in self.layer.op_indices:
            for name in graph.ops[i].outputs:
                if not name:
                    continue
                outside = sorted({layer_of_op[k] for k in graph.consumers(name) if k not in self.in_layer})
                if not outside and name not in graph.outputs:
                    continue
                sends = name in pp_fwd and pp_fwd[name].stage == self.stage
                self.g.edge(self.source[name], self._exit(name, outside, sends), _tensor_tip(self.facts, name))

    def _exit(self, name: str, outside: list[int], sends: bool) -> str:
        facts, g, stage, shape = self.facts, self.g, self.stage, self._shape(name)
        if sends:
            b = facts.boundaries[stage]
            return g.node(_label(f"Send → stage {stage + 1}", shape),
                          f"{_tensor_tip(facts, name)}\nsent to stage {stage + 1} every micro-batch; its gradient comes back\n"
                          f"boundary: {fmt_bytes(b.bytes_fwd)} in {b.time_text()} over {b.link}" + _host_line(b),
                          f"gpu_comm_pp_{stage}", **_comm_attrs(facts.comms_share(b.comms)))
        if outside:
            first = outside[0]
            more = f" (+{len(outside) - 1})" if len(outside) > 1 else ""
            where = "next layer" if first == self.li + 1 else f"layer {first}"
            return g.node(_label(f"to {where}{more}", shape), f"{_tensor_tip(facts, name)}\nread by layer(s) {', '.join(map(str, outside))}",
                          f"layer_{first}_data_0", **_PLAIN_BOX)
        return g.node(_label("model output", shape), _tensor_tip(facts, name), None, **_PLAIN_BOX)


def layer_drawing(facts: Facts, li: int) -> Drawing:
    """Layer ``li`` of replica 0: its operators, their tensor-parallel collectives and the tensors crossing its edge."""
    d = _LayerDrawing(facts, li)
    d.operators()
    d.collectives()
    d.inputs()
    d.outputs()
    return Drawing(f"layer_{li}_data_0_detail", f"layer_{li}_data_0", f"Layer {li} (replica 0): operators", d.g.text(), d.g.annotations,
                   d.g.hottest_share)


# ---------------------------------------------------------------------------------------------
# GPU communication: who talks to whom, over which link
# ---------------------------------------------------------------------------------------------


def _gpu_node(g: _Dot, facts: Facts, rank: int, note: str = "") -> str:
    d, p, t = facts.analysis.rank_map.coords(rank)
    node = facts.node_of(rank)
    attrs: dict[str, object] = {"color": "#3c4043", "penwidth": 1.4}
    attrs.update(_over(facts, p))
    c = facts.analysis.rank_map.cp_rank(rank) if facts.analysis.config.cp_size > 1 else None
    return g.node(_label(f"GPU {rank}", f"node {node} · d={d} p={p} t={t}" + (f" c={c}" if c is not None else ""), note),
                  f"GPU {rank}: replica {d}, stage {p}, tensor rank {t}" + (f", context rank {c}" if c is not None else "") + f"; node {node}\n{facts.analysis.cluster.gpu.name}" + _over_tip(facts, p),
                  None, shape="box", style="rounded,filled", fillcolor="#ffffff", **attrs)


def pp_comm_drawing(facts: Facts, s: int) -> Drawing:
    b = facts.boundaries[s]
    g = _Dot(rankdir="TB", nodesep=0.4, ranksep=0.9)
    src, dst = facts.ranks(0, s), facts.ranks(0, s + 1)
    shown = min(len(src), RING_MEMBERS_SHOWN)
    top: list[str] = []
    bottom: list[str] = []
    for stage, label, ranks, out, loc in ((s, f"stage {s} (replica 0)", src, top, "t"), (s + 1, f"stage {s + 1} (replica 0)", dst, bottom, "b")):
        text = html_text(f"{label} · node {rank_ranges(facts.nodes_of(ranks))}")
        if facts.over_capacity(stage):  # the stage label in red, its frame red
            text = f'<FONT COLOR="{OVER_COLOUR}"><B>{text} · {html_text(facts.over_memory_text(stage))}</B></FONT>'
            g.open_cluster(text, style="rounded", color=OVER_COLOUR, penwidth="2", labelloc=loc)
        else:
            g.open_cluster(text, style="rounded", color="#bdc1c6", labelloc=loc)
        for r in ranks[:shown]:
            out.append(_gpu_node(g, facts, r))
        g.close_cluster()
    for t in range(shown):
        link = facts.link_between(src[t], dst[t])
        g.edge(top[t], bottom[t],
               f"GPU {src[t]} -> GPU {dst[t]}: activation {fmt_bytes(b.bytes_fwd)} in {b.time_text()} per micro-batch\n"
               f"GPU {dst[t]} -> GPU {src[t]}: gradient {fmt_bytes(b.bytes_bwd)} in {b.time_text(backward=True)} per micro-batch\n"
               f"link: {link}" + ("\n" + _HOST_NOTE if b.host_fwd_s or b.host_bwd_s else ""),
               label=html_text(f"↓ {fmt_bytes(b.bytes_fwd)} {fmt_s(b.time_fwd_s)}") + "<BR/>" + html_text(f"↑ {fmt_bytes(b.bytes_bwd)} {fmt_s(b.time_bwd_s)}"),
               dir="both", color=link_colour(link), fontcolor=link_colour(link), penwidth=2)
    if len(src) > shown:
        g.node(_label(f"… {len(src) - shown} more pairs", "listed in the table below"), None, None, shape="plaintext", style="")
    return Drawing(f"gpu_comm_pp_{s}", f"gpu_comm_pp_{s}", f"Send/Recv stage {s} -> {s + 1}: GPU pairs", g.text(), g.annotations)


#: GPUs per row of a ring drawing; longer rings snake back on a second row.
RING_ROW = 4


def _ring(g: _Dot, facts: Facts, ranks: Sequence[int], step_tip: str) -> None:
    """GPUs of one group as a ring, clustered by node: the first row left to right, the second
    right to left under it, the closing edge back up (so eight GPUs stay legible)."""
    n = len(ranks)
    shown: list[int | None] = list(ranks) if n <= RING_MEMBERS_SHOWN else list(ranks[: RING_MEMBERS_SHOWN - 2]) + [None, ranks[-1]]
    hidden = n - (len(shown) - 1)
    by_node: dict[int, list[int | None]] = {}
    for r in shown:
        by_node.setdefault(facts.node_of(r) if r is not None else -1, []).append(r)
    placed: dict[int | None, str] = {}
    for key, members in by_node.items():
        if key >= 0:
            g.open_cluster(html_text(f"node {key}"), style="rounded", color="#bdc1c6")
        for r in members:
            if r is None:
                placed[None] = g.node(_label(f"… {hidden} more GPUs", "listed below"), None, None, shape="box", style="dashed", color="#9aa0a6")
            else:
                placed[r] = _gpu_node(g, facts, r)
        if key >= 0:
            g.close_cluster()
    ids = [placed[r] for r in shown]
    rows = [list(range(k, min(k + RING_ROW, len(shown)))) for k in range(0, len(shown), RING_ROW)]
    for row in rows:
        g.same_rank(ids[k] for k in row)

    def describe(a: int | None, b: int | None) -> tuple[str, str]:
        link = facts.link_between(a, b) if a is not None and b is not None else ""
        name = lambda r: f"GPU {r}" if r is not None else "…"  # noqa: E731
        return link, f"ring step {name(a)} -> {name(b)}" + (f" over {link}" if link else "") + f"\n{step_tip}"

    if len(shown) == 2:  # a ring of two is one link used both ways
        link, tip = describe(shown[0], shown[1])
        g.edge(ids[0], ids[1], tip, label=html_text(link_short(link)), dir="both", color=link_colour(link), fontcolor=link_colour(link), penwidth=2)
        return
    for k in range(len(shown)):
        j = (k + 1) % len(shown)
        link, tip = describe(shown[k], shown[j])
        colour = link_colour(link) if link else "#9aa0a6"
        style = "dashed" if shown[k] is None or shown[j] is None else None
        label = html_text(link_short(link)) if link else None
        row_k, row_j = k // RING_ROW, j // RING_ROW
        common = dict(label=label, color=colour, fontcolor=colour, penwidth=2, style=style)
        if row_k == row_j and row_k % 2 == 1:
            # odd rows run right to left: a reversed edge keeps dot's left-to-right order
            g.edge(ids[j], ids[k], tip, dir="back", **common)
        elif j == 0:  # the closing edge goes back to the first GPU
            g.edge(ids[0], ids[k], tip, dir="back", constraint="true" if len(rows) > 1 else "false", **common)
        else:
            g.edge(ids[k], ids[j], tip, **common)


def cp_comm_drawing(facts: Facts, s: int) -> Drawing:
    """The context-parallel group of replica 0, tensor rank 0 in stage ``s``."""
    cps = facts.cp_by_stage.get(s, ())
    c = facts.analysis.config.cp_size
    g = _Dot(rankdir="TB", nodesep=0.5, ranksep=0.7)
    scheme = facts.analysis.config.cp_scheme
    tip = (f"context-parallel group of stage {s} ({scheme}): the sequence is split {c}-way; "
           + ("each AllToAll sends (c-1)/c of Q, K, V or the output to the others" if scheme is CpScheme.ULYSSES
              else f"each GPU passes its K/V block to the next, {c - 1} steps per layer")
           + f"; {len(cps)} collectives per micro-batch")
    _ring(g, facts, facts.analysis.rank_map.cp_group(0, s, 0), tip)
    return Drawing(f"gpu_comm_cp_{s}", f"gpu_comm_cp_{s}", f"Context-parallel group of stage {s}", g.text(), g.annotations)


def ep_comm_drawing(facts: Facts, s: int) -> Drawing:
    """The first expert-parallel group (tensor rank 0) of stage ``s``."""
    eps = facts.ep_by_stage.get(s, ())
    e = facts.analysis.config.ep_size
    g = _Dot(rankdir="TB", nodesep=0.5, ranksep=0.7)
    tip = (f"expert-parallel group of stage {s}: each GPU holds 1/{e} of every MoE layer's experts; dispatch and combine "
           f"AllToAlls send (e-1)/e of the routed tokens to the others; {len(eps)} collectives per micro-batch")
    _ring(g, facts, facts.analysis.rank_map.ep_group(s, 0, 0), tip)
    return Drawing(f"gpu_comm_ep_{s}", f"gpu_comm_ep_{s}", f"Expert-parallel group of stage {s}", g.text(), g.annotations)


def tp_comm_drawing(facts: Facts, s: int) -> Drawing:
    tps = tuple(c for c in facts.tp_by_stage.get(s, ()) if c.dim is ParallelDim.TP)
    n = facts.tp
    g = _Dot(rankdir="TB", nodesep=0.5, ranksep=0.7)
    tip = (f"tensor-parallel ring of stage {s}: each of {len(tps)} collectives per micro-batch sends "
           f"(n-1)/n of its message per phase in {n - 1} steps of 1/{n} (ring AllReduce: two phases)")
    _ring(g, facts, facts.ranks(0, s), tip)
    return Drawing(f"gpu_comm_tp_{s}", f"gpu_comm_tp_{s}", f"Tensor-parallel group of stage {s}", g.text(), g.annotations)


def dp_comm_drawing(facts: Facts, s: int) -> Drawing:
    dps = facts.dp_by_stage.get(s, ())
    g = _Dot(rankdir="TB", nodesep=0.5, ranksep=0.7)
    total = sum(c.message_bytes * c.count_per_iteration for c in dps)
    tip = (f"data-parallel ring of stage {s}, tensor rank 0: {fmt_bytes(total)} of gradients reduced per iteration; "
           f"each ring step moves 1/{facts.dp} of a bucket")
    _ring(g, facts, facts.analysis.rank_map.dp_group(s, 0), tip)
    return Drawing(f"gpu_comm_dp_{s}", f"gpu_comm_dp_{s}", f"Data-parallel groups of stage {s}", g.text(), g.annotations)


def all_drawings(facts: Facts, replica_pages_max: int) -> list[Drawing]:
    """Every drawing of the site for ``facts``: replica 0 in detail, replicas > 0 as one page each
    while ``d - 1 <= replica_pages_max``, GPU-communication drawings per stage and boundary."""
    out = [overview_drawing(facts, replica_pages_max)]
    for d in range(facts.dp):
        if d == 0 or facts.dp - 1 <= replica_pages_max:
            out.append(replica_drawing(facts, d))
    for p in range(facts.pp):
        out.append(stage_drawing(facts, p))
    for li in range(len(facts.analysis.layers)):
        out.append(layer_drawing(facts, li))
    for s in range(facts.pp - 1):
        if facts.boundaries[s].forward:
            out.append(pp_comm_drawing(facts, s))
    for p in range(facts.pp):
        if facts.tp > 1 and any(c.dim is ParallelDim.TP for c in facts.tp_by_stage.get(p, ())):
            out.append(tp_comm_drawing(facts, p))
        if facts.cp_by_stage.get(p):
            out.append(cp_comm_drawing(facts, p))
        if facts.ep_by_stage.get(p):
            out.append(ep_comm_drawing(facts, p))
        if facts.dp > 1 and facts.dp_by_stage.get(p):
            out.append(dp_comm_drawing(facts, p))
    return out
