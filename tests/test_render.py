"""DOT builders (golden text, escaping, alike drawings) and the Graphviz runner (cache, errors).

Tests that run the ``dot`` binary carry ``@pytest.mark.dot``.
"""

from __future__ import annotations

import dataclasses

import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from dml2comm import zoo
from dml2comm.analysis import analyze_graph
from dml2comm.hardware.cluster import make_cluster
from dml2comm.ir.onnx_import import ImportOptions
from dml2comm.load import load_model_proto
from dml2comm.parallel.config import ParallelConfig
from dml2comm.render import svg as svg_mod
from dml2comm.render.dot import Annotation, Drawing, all_drawings, dot_quote, html_text, layer_drawing, svg_name
from dml2comm.render.facts import Facts
from dml2comm.fmt import heat_bin, rank_ranges, rank_set
from dml2comm.render.svg import DOT_MISSING, GraphvizError, LayoutCache, annotate, render, resolve_links
from tests.helpers import mlp

needs_dot = pytest.mark.dot
SVG_NS = {"svg": "http://www.w3.org/2000/svg"}

#: Names full of what breaks DOT, XML, HTML and Markdown: a script, quotes, &, an entity,
#: a colon (DOT port syntax), a newline, Graphviz's \N escape and Markdown punctuation.
EVIL = "<script>alert(\"x\")</script> 'q' & &lt; a:b\nline2 \\N *_[x]"


def hostile_model() -> onnx.ModelProto:
    """x -> MatMul -> custom-domain op -> MatMul -> + x, every name and the custom op type hostile."""
    h = 16
    x = helper.make_tensor_value_info("x" + EVIL, TensorProto.FLOAT, [2, 8, h])
    y = helper.make_tensor_value_info("y" + EVIL, TensorProto.FLOAT, [2, 8, h])
    w1 = helper.make_tensor("w1" + EVIL, TensorProto.FLOAT, [h, 4 * h], np.zeros(4 * h * h, np.float32).tobytes(), raw=True)
    w2 = helper.make_tensor("w2" + EVIL, TensorProto.FLOAT, [4 * h, h], np.zeros(4 * h * h, np.float32).tobytes(), raw=True)
    nodes = [
        helper.make_node("MatMul", ["x" + EVIL, "w1" + EVIL], ["a" + EVIL], name="/blk/fc1/MatMul" + EVIL),
        helper.make_node('Evil<b>Op&"', ["a" + EVIL], ["b" + EVIL], name="custom" + EVIL, domain="com.evil<x>"),
        helper.make_node("MatMul", ["b" + EVIL, "w2" + EVIL], ["c" + EVIL], name="/blk/fc2/MatMul" + EVIL),
        helper.make_node("Add", ["c" + EVIL, "x" + EVIL], ["y" + EVIL], name="/blk/Add" + EVIL),
    ]
    graph = helper.make_graph(nodes, "graph" + EVIL, [x], [y], [w1, w2],
                              value_info=[helper.make_tensor_value_info("b" + EVIL, TensorProto.FLOAT, [2, 8, 4 * h])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.evil<x>", 1)])
    onnx.checker.check_model(model)
    return model


def _analysis(model: onnx.ModelProto, lenient: bool = False, host_model: str = "eager", **cfg):
    base = dict(micro_batch_size=2)
    base.update(cfg)
    b, d, p = base["micro_batch_size"], base.get("dp_size", 1), base.get("pp_size", 1)
    config = ParallelConfig(**{"global_batch_size": b * d * p, **base})
    imported = load_model_proto(model, ImportOptions(batch_size=config.micro_batch_size, lenient=lenient))
    cluster = make_cluster("a100", config.num_gpus, min(8, config.num_gpus))
    return analyze_graph(imported, config, dataclasses.replace(cluster, host_model=host_model), lenient=lenient)


# ---------------------------------------------------------------------------------------------
# escaping


def test_html_text_escapes_markup_entities_backslashes_and_controls():
    assert html_text('<b>&"\'') == "&lt;b&gt;&amp;&quot;&#39;"
    assert html_text("&lt;") == "&amp;lt;"  # an entity in a name stays literal text
    assert html_text("a\\Nb") == "a\\\\Nb"  # Graphviz would expand \N to the node id
    assert html_text("a\nb") == "a<BR/>b"
    assert html_text("a\x00b\x1bc") == "a\ufffdb\ufffdc"


def test_dot_quote():
    assert dot_quote('say "hi"\\\n') == '"say \\"hi\\"\\\\\\n"'


def test_svg_names_follow_design():
    assert svg_name("index") == "overview"
    assert svg_name("data_1") == "data_1_detail"
    assert svg_name("stage_2_data_0") == "stage_2_data_0_detail"
    assert svg_name("layer_5_data_0") == "layer_5_data_0_detail"
    assert svg_name("gpu_comm_tp_3") == "gpu_comm_tp_3"


def test_rank_ranges_and_heat_bins():
    assert rank_ranges([8, 0, 1, 2, 3, 10, 11]) == "0–3, 8, 10, 11"
    assert rank_ranges([]) == "none"
    assert rank_set([0, 1, 4, 5, 8, 9, 12, 13]) == "GPUs 0–1, 4–5, 8–9, 12–13"  # not "0, 1, … (8 GPUs)"
    assert rank_set([0, 1, 4, 5, 8, 9, 12, 13], parts=3) == "GPUs 0–1, 4–5, …, 12–13 (8 GPUs, blocks of 2, stride 4)"
    assert rank_set(range(0, 64, 8), parts=3) == "GPUs 0, 8, …, 56 (8 GPUs, stride 8)"
    assert rank_set([0, 1, 2, 5, 9], parts=2) == "GPUs 0–2, 5, …, 9 (5 GPUs)"  # no pattern: none claimed
    # heat is relative to the hottest box of a drawing: the hottest (ratio 1) alone in the top
    # bin's upper part, 0.5 of it in the 50-75% bin
    assert heat_bin(0.0).low == 0 and heat_bin(1.0).high == float("inf") and heat_bin(0.96).low == 0.95
    assert heat_bin(0.5).low == 0.5 and heat_bin(0.94).high == 0.95
    assert heat_bin(0.03, comm=True).fill != heat_bin(0.03).fill


# ---------------------------------------------------------------------------------------------
# golden DOT (no Graphviz needed)

# The MLP of tests/helpers.py at t=2 is grouped structurally; its layer 3 is Relu -> MatMul
# (row-parallel, 2x8x32 -> 2x8x16 on each GPU) followed by Megatron's forward AllReduce of
# 2*8*16 bf16 values = 512 B.  Colours are relative to the hottest box of the drawing (issue 19):
# the AllReduce is the hottest (top Blues bin, thick dark outline); the MatMul's share is about
# 0.35 of it (bin 25-50%, #feb24c); the Relu's under 2% (#ffffcc).  Each op box carries its
# forward and backward time on a third line.  Regenerate with: print(layer_drawing(Facts.of(a), 3).dot)
GOLDEN_LAYER = """\
digraph G {
  graph [rankdir=TB, fontname="Helvetica", fontsize=11, nodesep=0.22, ranksep=0.26, bgcolor="transparent", pad="0.15", newrank=true];
  node [fontname="Helvetica", fontsize=11, shape=box, style="rounded,filled", fillcolor="#ffffff", color="#5f6368", penwidth=1, margin="0.12,0.05"];
  edge [fontname="Helvetica", fontsize=9, color="#5f6368", arrowsize=0.7, penwidth=1.1];
  n0 [id=n0, label=<<B>Relu</B><BR/><FONT POINT-SIZE="9">2×8×32</FONT><BR/><FONT POINT-SIZE="9">1 ns fwd · 1 ns bwd</FONT>>, fillcolor="#ffffcc", fontcolor="#1a1a1a"];
  n1 [id=n1, label=<<B>MatMul</B><BR/><FONT POINT-SIZE="9">2×8×16</FONT><BR/><FONT POINT-SIZE="9">6.9 µs fwd · 13.8 µs bwd</FONT>>, fillcolor="#feb24c", fontcolor="#1a1a1a"];
  n2 [id=n2, label=<<B>AllReduce</B><BR/><FONT POINT-SIZE="9">fwd · 512 B · 59.3 µs</FONT>>, shape="hexagon", style="filled", color="#202124", margin="0.02,0.02", fillcolor="#08519c", fontcolor="#ffffff", penwidth="3"];
  n1 -> n2 [id=e0, color="#08519c"];
  n3 [id=n3, label=<<B>from previous layer</B><BR/><FONT POINT-SIZE="9">2×8×32</FONT>>, shape="box", style="rounded,filled", fillcolor="#f1f3f4", color="#bdc1c6", fontcolor="#3c4043"];
  n3 -> n0 [id=e1];
  n0 -> n1 [id=e2];
  n4 [id=n4, label=<<B>to next layer</B><BR/><FONT POINT-SIZE="9">2×8×16</FONT>>, shape="box", style="rounded,filled", fillcolor="#f1f3f4", color="#bdc1c6", fontcolor="#3c4043"];
  n2 -> n4 [id=e3];
}
"""


@pytest.fixture(scope="module")
def mlp_facts() -> Facts:
    return Facts.of(_analysis(mlp(), tp_size=2, host_model="none"))  # the golden's heat colours: kernel times, no host floor


def _mask_times(dot: str) -> str:
    # times come from the network and compute models, which other work refines: the golden
    # pins structure, labels, shapes, colours and escaping, not those numbers
    # number and unit are joined by a no-break space (dml2comm/fmt.py); the golden pins the words
    return re.sub(r"[0-9.]+ (ns|µs|ms|s)\b", "<time>", dot.replace("\u00a0", " "))


def test_layer_dot_golden(mlp_facts):
    drawing = layer_drawing(mlp_facts, 3)
    assert _mask_times(drawing.dot) == _mask_times(GOLDEN_LAYER)
    assert drawing.name == "layer_3_data_0_detail" and drawing.page == "layer_3_data_0"


def test_layer_annotations_carry_names_costs_and_links(mlp_facts):
    notes = layer_drawing(mlp_facts, 3).annotations
    matmul = notes["n1"].tooltip
    assert matmul.startswith("/mlp/fc2/MatMul\n")
    for word in ("FLOPs: forward", "HBM bytes: forward", "time per micro-batch: forward", "sharded by: row-parallel"):
        assert word in matmul
    assert notes["n2"].href == "gpu_comm_tp_0"  # the collective opens its GPU group
    assert notes["n3"].href == "layer_2_data_0" and notes["n4"].href == "layer_4_data_0"
    assert all(re.fullmatch(r"[ne][0-9]+", k) for k in notes)


def test_model_names_never_reach_dot_ids():
    a = _analysis(hostile_model(), lenient=True, tp_size=2)
    statements = 0
    for drawing in all_drawings(Facts.of(a), 8):
        assert "<script" not in drawing.dot
        for line in drawing.dot.splitlines():
            m = re.match(r"\s+(\S+)(?: -> (\S+))? \[id=(\S+?),", line)
            if m:  # every node and edge statement: synthetic ids only
                assert all(re.fullmatch(r"[ne][0-9]+", x) for x in m.groups() if x), line
                statements += 1
    assert statements > 20


def test_alike_blocks_have_identical_dot():
    model = zoo.build_gpt(layers=4, hidden=64, heads=4, vocab=256, seq_len=32)
    a = _analysis(model, tp_size=2, micro_batch_size=1)
    facts = Facts.of(a)
    blocks = [l.index for l in a.layers if l.kind == "block"]
    assert len(blocks) == 4
    dots = {layer_drawing(facts, li).dot for li in blocks[1:-1]}
    assert len(dots) == 1
    tips = [layer_drawing(facts, li).annotations["n0"].tooltip for li in blocks[1:-1]]
    assert tips[0] != tips[1]  # ...while their tooltips name each block's own ops


# ---------------------------------------------------------------------------------------------
# Graphviz runner


def _fake_svg() -> str:
    return "\n".join([
        '<?xml version="1.0" encoding="UTF-8" standalone="no"?>',
        '<svg width="100pt" height="50pt" viewBox="0.00 0.00 100.00 50.00" xmlns="http://www.w3.org/2000/svg" '
        'xmlns:xlink="http://www.w3.org/1999/xlink">',
        '<g id="graph0" class="graph">', "<title>G</title>",
        "<!-- n0 -->", '<g id="n0" class="node">', "<title>n0</title>", '<polygon points="0,0"/>', "<text>MatMul</text>", "</g>",
        "<!-- n1 -->", '<g id="n1" class="node">', "<title>n1</title>", "<text>Add</text>", "</g>",
        "</g>", "</svg>",
    ])


def test_annotate_puts_escaped_tooltips_and_links():
    drawing = Drawing("x", "x", "T <&>", "digraph{}", {"n0": Annotation(EVIL, "layer_1_data_0")})
    out = annotate(_fake_svg(), drawing)
    root = ET.fromstring(out)  # still well-formed XML
    node = root.find(".//svg:g[@id='n0']", SVG_NS)
    assert node.find("svg:title", SVG_NS).text == EVIL
    link = node.find("svg:a", SVG_NS)
    assert link.get("{http://www.w3.org/1999/xlink}href") == "page:layer_1_data_0"
    assert root.find(".//svg:g[@id='n1']/svg:title", SVG_NS) is None  # synthetic ids are not tooltips
    assert root.find("svg:g/svg:title", SVG_NS).text == "T <&>"
    assert "<!--" not in out
    site = resolve_links(out, lambda key: f"{key}.html")
    assert 'xlink:href="layer_1_data_0.html"' in site
    gone = resolve_links(out, lambda key: None)
    assert "<a " not in gone and "MatMul" in gone


def test_missing_dot_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(GraphvizError) as err:
        render([Drawing("x", "x", "x", "digraph G { a }\n")])
    assert str(err.value) == DOT_MISSING
    assert "apt-get install graphviz" in DOT_MISSING and "PATH" in DOT_MISSING


@needs_dot
def test_render_lays_out_alike_drawings_once():
    dot = "digraph G { n0 [id=n0, label=<a>]; n1 [id=n1, label=<b>]; n0 -> n1 [id=e0]; }\n"
    drawings = [Drawing(f"d{i}", f"d{i}", f"d{i}", dot, {"n0": Annotation(f"tip {i}")}) for i in range(3)]
    cache = LayoutCache()
    svgs, stats = render(drawings, jobs=2, cache=cache)
    assert (stats.drawings, stats.layouts_run, stats.cache_hits) == (3, 1, 2)
    assert "tip 2" in svgs["d2"] and "tip 0" in svgs["d0"]
    _, again = render(drawings[:1], cache=cache)
    assert again.layouts_run == 0


@needs_dot
def test_graphviz_failure_is_a_clear_error():
    with pytest.raises(GraphvizError, match="Graphviz failed on broken.svg"):
        render([Drawing("broken", "broken", "b", "digraph G { a -> }\n")])


@needs_dot
def test_hostile_names_parse_and_stay_literal():
    a = _analysis(hostile_model(), lenient=True, tp_size=2, dp_size=2)
    drawings = all_drawings(Facts.of(a), 8)
    svgs, stats = render(drawings)
    assert stats.drawings == len(drawings)
    texts, tips = [], []
    for d in drawings:
        proc = subprocess.run(["dot", "-Tcanon"], input=d.dot.encode(), capture_output=True, check=False)
        assert proc.returncode == 0, proc.stderr  # the DOT parses
        root = ET.fromstring(svgs[d.name])  # the SVG is well-formed
        texts += ["".join(t.itertext()) for t in root.iter("{http://www.w3.org/2000/svg}text")]
        tips += [t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}title")]
    assert 'Evil<b>Op&"' in texts  # the custom op type, shown literally
    assert any(EVIL in tip for tip in tips)  # names in tooltips, exactly as in the model
    assert not any(el.tag.endswith("script") for d in drawings for el in ET.fromstring(svgs[d.name]).iter())


FIXTURES = Path(__file__).parent / "fixtures"


@pytest.mark.parametrize("name", ["gpt2_dynamo.onnx", "mixtral_tiny_legacy.onnx", "resnet18_legacy.onnx"])
@pytest.mark.parametrize("d, t, p", [(1, 1, 1), (3, 1, 3)])
def test_every_drawing_and_page_of_real_exports(name, d, t, p):
    from dml2comm.analysis import analyze
    from dml2comm.site.pages import page_models

    seq_len = None if "resnet" in name else 64  # an image model has no sequence axis to bind
    config = ParallelConfig(dp_size=d, tp_size=t, pp_size=p, micro_batch_size=1, global_batch_size=d * p, seq_len=seq_len)
    a = analyze(FIXTURES / name, config, make_cluster("a100", config.num_gpus, min(8, config.num_gpus)))
    facts = Facts.of(a)
    drawings = all_drawings(facts, 8)
    pages = page_models(facts, drawings, 8)
    keys = {pg.key for pg in pages}
    assert {dr.page for dr in drawings} <= keys
    for dr in drawings:  # every link of a drawing names a page that exists
        assert all(n.href in keys for n in dr.annotations.values() if n.href), dr.name
    assert len([dr for dr in drawings if dr.name.startswith("layer_")]) == len(a.layers)
    assert ("gpu_comm_pp_0" in keys) == (p > 1) and ("gpu_comm_dp_0" in keys) == (d > 1)


def _fill_of(dot: str) -> dict[str, tuple[str, bool]]:
    """Node id -> (fill colour, outlined as the hottest) of a DOT text's heat-coloured nodes."""
    out = {}
    for line in dot.splitlines():
        m = re.match(r'\s+(n[0-9]+) \[id=\1, .*fillcolor="(#[0-9a-f]{6})", fontcolor=', line)
        if m:
            out[m.group(1)] = (m.group(2), 'color="#202124"' in line)
    return out


def test_bottleneck_is_the_hottest_box_of_each_drawing(monkeypatch):
    """Issue 19: with absolute bins every stage of a pipeline came out the same dark red (bins
    saturated at 40%).  Colour is now relative to the hottest box of the drawing: exactly the
    busiest stage(s) get the top bin and the outline; a stage well below them is lighter."""
    from dml2comm.analysis import analyze
    from dml2comm.render.dot import replica_drawing

    config = ParallelConfig(dp_size=1, tp_size=1, pp_size=3, micro_batch_size=1, global_batch_size=3, seq_len=64)
    # the shares below are kernel times (host model "none": no host floor)
    a = analyze(FIXTURES / "gpt2_dynamo.onnx", config, dataclasses.replace(make_cluster("a100", 3, 3), host_model="none"))
    facts = Facts.of(a)
    drawing = replica_drawing(facts, 0)
    top = max(facts.stage_share)
    assert drawing.hottest == pytest.approx(max([top] + [facts.comms_share(b.forward + b.backward) for b in facts.boundaries]))
    fills = _fill_of(drawing.dot)
    stage_ids = [nid for nid, note in drawing.annotations.items() if (note.href or "").startswith("stage_")]
    assert len(stage_ids) == 3
    for nid, share in zip(stage_ids, facts.stage_share):
        ratio = share / drawing.hottest
        assert fills[nid][0] == heat_bin(ratio).fill
        assert fills[nid][1] == (ratio >= 0.999)  # outline only on the bottleneck (or ties)
    # stage shares 41.7%, 39.7%, 37.6% of the iteration: stage 0 alone is the bottleneck (the
    # embedding's backward zero-fills the 50k-row table's gradient every micro-batch,
    # besides its gradient-accumulation pass); stage 1 is 0.95 of it, the top bin without the
    # outline; stage 2 is 0.90 of it, bin 75-95%
    assert [fills[n][1] for n in stage_ids] == [True, False, False]
    assert fills[stage_ids[1]][0] == fills[stage_ids[0]][0] == "#bd0026" and fills[stage_ids[2]][0] == "#f03b20"
    # the page titles and the stage drawing name layers by their module, not their position
    titles = [facts.layer_title(li) for li in range(len(a.layers))]
    assert titles[0] != "layer 0" and all(re.fullmatch(r"[A-Za-z0-9._ -]+", t) for t in titles)
    layer_ids = {l.name for l in a.layers}
    assert any(t in layer_ids for t in titles)
