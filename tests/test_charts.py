"""The generated SVG charts: the memory bar chart and the timeline of the simulated iteration.

No Graphviz needed: the charts are text built in Python, checked here as XML -- one bar per
stage, segments to scale, the capacity line where the capacity is, red outlines exactly on the
stages over capacity, one box per simulated step (or the documented merge), a time axis that
spans the iteration, and hostile text escaped.
"""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET

import pytest

from dml2comm import zoo
from dml2comm.analysis import analyze_graph
from dml2comm.hardware.cluster import make_cluster
from dml2comm.ir.onnx_import import ImportOptions
from dml2comm.load import load_model_proto
from dml2comm.parallel.config import ParallelConfig
from dml2comm.render.charts import (
    MAX_BOXES,
    PLOT_WIDTH,
    GanttBox,
    GanttRow,
    MemoryBar,
    gantt_chart,
    memory_chart,
    memory_chart_of,
    merge_boxes,
    nice_step,
    timeline_chart_of,
    xml_text,
)
from dml2comm.render.facts import Facts
from tests.test_render import EVIL, _analysis
from tests.helpers import mlp

SVG = "{http://www.w3.org/2000/svg}"
GIB = 2**30


def over_capacity_analysis(dp: int = 1, tp: int = 1, pp: int = 4, micro_batch: int = 32, recompute: str = "none"):
    """Zoo GPT (8 blocks, h = 1024, s = 1024) in fp16 on 32 GB V100s: with b = 32 per tensor rank,
    stage 0 keeps 4 micro-batches of activations (1F1B) and is over capacity, stages 1-3 fit."""
    model = zoo.build_gpt(layers=8, hidden=1024, heads=16, vocab=1024, seq_len=1024)
    config = ParallelConfig(dp_size=dp, tp_size=tp, pp_size=pp, micro_batch_size=micro_batch,
                            global_batch_size=micro_batch * dp * pp, dtype="fp16", recompute=recompute)
    imported = load_model_proto(model, ImportOptions(batch_size=micro_batch))
    return analyze_graph(imported, config, make_cluster("v100", config.num_gpus, min(8, config.num_gpus)))


@pytest.fixture(scope="module")
def over() -> Facts:
    return Facts.of(over_capacity_analysis())


def _attrs(root: ET.Element, cls: str) -> list[ET.Element]:
    return [el for el in root.iter() if cls in (el.get("class") or "").split()]


# ---------------------------------------------------------------------------------------------
# helpers


def test_xml_text_escapes_markup_quotes_and_controls():
    assert xml_text('<b>&"\'\x00') == "&lt;b&gt;&amp;&quot;&#39;\ufffd"
    assert xml_text("&lt;") == "&amp;lt;"


@pytest.mark.parametrize("span, target, step", [(10.26, 10, 2), (9.9, 10, 1), (1146.3, 10, 200), (0.9, 10, 0.1), (74.5, 6, 20),
                                                (2.2, 6, 0.5), (14.0, 6, 2.5)])
def test_nice_step(span, target, step):
    assert nice_step(span, target) == pytest.approx(step)


# ---------------------------------------------------------------------------------------------
# memory chart


def _bars() -> list[MemoryBar]:
    # stage 0: 10 GiB weights + 30 GiB activations = 40 GiB (over 32); stage 1: 4 + 8 = 12 GiB
    return [
        MemoryBar("stage 0", {"weights_bytes": 10 * GIB, "activations_bytes": 30 * GIB}, 40 * GIB, in_flight=3,
                  per_micro_batch_bytes=10 * GIB),
        MemoryBar("stage 1", {"weights_bytes": 4 * GIB, "activations_bytes": 8 * GIB, "buffers_bytes": None}, 12 * GIB),
    ]


def test_memory_chart_bars_are_to_scale_with_the_capacity_line():
    root = ET.fromstring(memory_chart(_bars(), 32 * GIB, "V100"))
    segs = _attrs(root, "d2c-seg")
    assert {s.get("data-stage") for s in segs} == {"0", "1"}  # one bar per stage
    by = {(s.get("data-stage"), s.get("data-part")): s for s in segs}
    assert len(by) == 4  # a part of None or 0 bytes draws nothing
    h = {k: float(s.get("height")) for k, s in by.items()}
    # heights proportional to bytes: 30 GiB / 10 GiB = 3, 8 GiB / 4 GiB = 2, 30 GiB / 8 GiB = 3.75
    assert h[("0", "activations")] / h[("0", "weights")] == pytest.approx(3.0, rel=1e-3)
    assert h[("1", "activations")] / h[("1", "weights")] == pytest.approx(2.0, rel=1e-3)
    assert h[("0", "activations")] / h[("1", "activations")] == pytest.approx(3.75, rel=1e-3)
    # segments stack from the base line
    base = float(_attrs(root, "d2c-base")[0].get("y1"))
    w = by[("0", "weights")]
    assert float(w.get("y")) + float(w.get("height")) == pytest.approx(base, abs=0.01)
    # the capacity line sits at 32 GiB on the same scale: (base - y) / 32 GiB = height / 10 GiB
    cap = _attrs(root, "d2c-capacity")[0]
    px_per_byte = h[("0", "weights")] / (10 * GIB)
    assert base - float(cap.get("y1")) == pytest.approx(32 * GIB * px_per_byte, abs=0.02)
    assert cap.get("data-broken") == "false"
    # the bar over capacity, and only it, has a red outline and a red label
    assert [o.get("data-stage") for o in _attrs(root, "d2c-over")] == ["0"]
    labels = _attrs(root, "d2c-stage-label")
    assert [("d2c-over-label" in (el.get("class") or ""), el.text) for el in labels] == [(True, "stage 0"), (False, "stage 1")]
    assert "×3" in "".join(root.itertext())  # micro-batches in flight inside the activation segment


def test_memory_chart_breaks_the_axis_when_the_gpu_dwarfs_the_bars():
    root = ET.fromstring(memory_chart(_bars(), 800 * GIB))
    cap = _attrs(root, "d2c-capacity")[0]
    assert cap.get("data-broken") == "true"
    tops = [float(s.get("y")) for s in _attrs(root, "d2c-seg")]
    assert float(cap.get("y1")) < min(tops)  # above every bar
    assert not _attrs(root, "d2c-over")
    assert "axis broken" in "".join(root.itertext())


def test_memory_chart_escapes_labels():
    bars = [MemoryBar(EVIL, {"weights_bytes": GIB}, GIB, tip=EVIL)]
    svg = memory_chart(bars, 2 * GIB, EVIL)
    assert "<script" not in svg
    root = ET.fromstring(svg)
    assert EVIL.split("\n")[0] in "".join(root.itertext())


def test_memory_chart_of_an_analysis_marks_exactly_the_stages_over_capacity(over):
    a = over.analysis
    assert a.memory["over_capacity_stages"] == [0] and not a.memory["fits"]  # the premise: 1F1B piles activations on stage 0
    chart = memory_chart_of(over)
    root = ET.fromstring(chart.svg)
    assert {s.get("data-stage") for s in _attrs(root, "d2c-seg")} == {str(p) for p in range(4)}
    assert [int(o.get("data-stage")) for o in _attrs(root, "d2c-over")] == a.memory["over_capacity_stages"] == list(over.over_stages)
    # every segment's height is its bytes on one scale (coordinates are written to 0.01 px),
    # and each bar adds up to its stage's total
    segs = _attrs(root, "d2c-seg")
    largest = max(segs, key=lambda s: float(s.get("data-bytes")))
    scale = float(largest.get("height")) / float(largest.get("data-bytes"))
    for s in segs:
        assert float(s.get("height")) == pytest.approx(float(s.get("data-bytes")) * scale, abs=0.006)
    for p, st in enumerate(a.stages):
        heights = sum(float(s.get("height")) for s in segs if s.get("data-stage") == str(p))
        assert heights / scale == pytest.approx(st.memory["total_bytes"], rel=1e-3)
    cap = _attrs(root, "d2c-capacity")[0]
    base = float(_attrs(root, "d2c-base")[0].get("y1"))
    assert (base - float(cap.get("y1"))) / scale == pytest.approx(a.memory["capacity_bytes"], rel=1e-3)


# ---------------------------------------------------------------------------------------------
# timeline


def _axis(root: ET.Element) -> tuple[float, float, float]:
    axis = _attrs(root, "d2c-time-axis")[0]
    return float(axis.get("x1")), float(axis.get("x2")), float(axis.get("data-span-s"))


def test_timeline_has_one_box_per_step_and_an_axis_spanning_the_iteration(over):
    a = over.analysis
    sim = a.timeline
    chart = timeline_chart_of(over)
    assert chart is not None and chart.note == ""
    root = ET.fromstring(chart.svg)
    boxes = _attrs(root, "d2c-box")
    compute = [b for b in boxes if b.get("data-kind") in ("forward", "backward")]
    events = [e for e in sim.events if e.stream == "compute"]
    assert len(compute) == len(events) == 4 * 2 * a.config.num_micro_batches  # p x (F + B) x m
    assert len([b for b in boxes if b.get("data-kind") == "pp"]) == len([e for e in sim.events if e.stream == "pp"])
    assert len(boxes) == len(sim.events) == chart.boxes
    x0, x1, span = _axis(root)
    assert span == pytest.approx(sim.iteration_time_s)
    assert x1 - x0 == pytest.approx(PLOT_WIDTH)
    # every box lies on the axis, and the last one ends where the iteration ends
    ends = [float(b.get("x")) + float(b.get("width")) for b in boxes]
    assert min(float(b.get("x")) for b in boxes) >= x0 - 0.01 and max(ends) == pytest.approx(x1, abs=0.6)
    ticks = [float(t.text) for t in _attrs(root, "d2c-tick")]
    assert ticks[0] == 0 and ticks[-1] <= span * 1e3 + 1e-9 and ticks[-1] > span * 1e3 / 2
    # the stage over capacity has a red row label, the others not
    labels = _attrs(root, "d2c-row-label")
    assert [("d2c-over-label" in (el.get("class") or "")) for el in labels] == [p in over.over_stages for p in range(4)]
    # a box's width is its duration on the axis
    first = min(events, key=lambda e: (e.device, e.start_s))
    rect = next(b for b in compute if b.get("data-row") == "0")
    assert float(rect.get("width")) == pytest.approx(first.dur_s * (x1 - x0) / span, abs=0.01)


def test_timeline_splits_recomputation_out_of_backward():
    facts = Facts.of(over_capacity_analysis(micro_batch=8, recompute="full"))
    root = ET.fromstring(timeline_chart_of(facts).svg)
    kinds = [b.get("data-kind") for b in _attrs(root, "d2c-box")]
    m = facts.m
    assert kinds.count("recompute") == kinds.count("backward") == kinds.count("forward") == 4 * m
    # over the box budget, recomputation is first folded into its backward box: one box per step
    events = len(facts.analysis.timeline.events)
    chart = timeline_chart_of(facts, max_boxes=events)
    kinds = [b.get("data-kind") for b in _attrs(ET.fromstring(chart.svg), "d2c-box")]
    assert "recompute" not in kinds and len(kinds) == chart.boxes == events and "recomputation" in chart.note


def test_timeline_text_is_escaped_and_well_formed():
    a = _analysis(mlp(), tp_size=2, pp_size=1)
    chart = timeline_chart_of(Facts.of(a))
    ET.fromstring(chart.svg)
    rows = [GanttRow(EVIL, EVIL, tip=EVIL)]
    svg = gantt_chart(rows, [GanttBox(0, 0.0, 1.0, "forward", EVIL, EVIL)], 1.0, note=EVIL)
    assert "<script" not in svg
    assert EVIL.split("\n")[0] in "".join(ET.fromstring(svg).itertext())


def _row_boxes(n: int, row: int = 0, gap_at: int | None = None) -> list[GanttBox]:
    """n alternating forward/backward boxes of 1 s, touching, with a 1,000 s gap before ``gap_at``."""
    out, t = [], 0.0
    for i in range(n):
        if i == gap_at:
            t += 1000.0
        out.append(GanttBox(row, t, 1.0, "forward" if i % 2 == 0 else "backward", str(i // 2)))
        t += 1.0
    return out


def test_merge_keeps_few_boxes_as_they_are():
    boxes = _row_boxes(10)
    assert merge_boxes(boxes, 10, 10.0) == (boxes, "")


def test_merge_joins_touching_boxes_of_a_kind_first():
    boxes = [GanttBox(0, float(i), 1.0, "forward", str(i)) for i in range(6)] + [GanttBox(0, 10.0, 1.0, "backward", "0")]
    out, note = merge_boxes(boxes, 3, 11.0)
    assert [(b.kind, b.count, b.start_s, b.dur_s, b.text) for b in out] == [("forward", 6, 0.0, 6.0, "0–5"), ("backward", 1, 10.0, 1.0, "0")]
    assert "same kind" in note


def test_merge_mixes_kinds_by_time_slot_within_the_budget_and_keeps_long_gaps():
    boxes = _row_boxes(3000, gap_at=1500) + _row_boxes(3000, row=1)
    span = 4000.0
    out, note = merge_boxes(boxes, 200, span)
    assert len(out) <= 200 and note and "trace.json" in note
    assert sum(b.count for b in out) == len(boxes)  # every step is in exactly one box
    assert {b.kind for b in out} == {"mixed"}
    # the 1,000 s idle gap of row 0 is still a gap
    row0 = sorted((b for b in out if b.row == 0), key=lambda b: b.start_s)
    assert any(nxt.start_s - cur.end_s >= 999.0 for cur, nxt in zip(row0, row0[1:]))
    # boxes never overlap within a row
    for row in (0, 1):
        r = sorted((b for b in out if b.row == row), key=lambda b: b.start_s)
        assert all(cur.end_s <= nxt.start_s + 1e-9 for cur, nxt in zip(r, r[1:]))


def test_timeline_of_a_long_pipeline_stays_under_the_box_budget():
    facts = Facts.of(over_capacity_analysis(pp=4, micro_batch=1))
    boxes = len(facts.analysis.timeline.events)
    chart = timeline_chart_of(facts, max_boxes=boxes // 3)
    root = ET.fromstring(chart.svg)
    drawn = _attrs(root, "d2c-box")
    assert len(drawn) == chart.boxes <= boxes // 3 and chart.note
    assert sum(int(b.get("data-count")) for b in drawn) >= boxes  # recomputation none: one box per event
    assert MAX_BOXES >= 2000
