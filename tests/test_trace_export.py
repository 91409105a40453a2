"""trace.json opens cleanly in Perfetto: on every track (pid, tid) slices nest or follow each other
exactly, to the nanosecond a reader gets back, and each counter has one sample per timestamp."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dml2comm import zoo
from dml2comm.analysis import analyze_graph
from dml2comm.export.chrome_trace import trace_json
from dml2comm.hardware.cluster import make_cluster
from dml2comm.ir.onnx_import import ImportOptions
from dml2comm.load import load_model, load_model_proto
from dml2comm.parallel.config import ParallelConfig

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"


def _ns(value: float) -> int:
    """What Perfetto stores: ``llround(ts_us * 1000)`` (trace_processor json_utils CoerceToTs)."""
    return int(round(value * 1000))


def _gpt2_example():
    imported = load_model(ROOT / "examples" / "gpt2-small.onnx", ImportOptions())
    cfg = ParallelConfig(dp_size=2, pp_size=4, tp_size=2, micro_batch_size=imported.model_batch or 1,
                         global_batch_size=(imported.model_batch or 1) * 8, seq_len=None)
    return analyze_graph(imported, cfg, make_cluster("a100", 16, 8), advise=False)


def _llama_zoo():
    model = zoo.build_llama(layers=8, hidden=512, heads=8, kv_heads=2, ffn_hidden=1408, vocab=1024, seq_len=256)
    cfg = ParallelConfig(dp_size=2, pp_size=4, tp_size=2, micro_batch_size=2, global_batch_size=32, seq_len=256,
                         schedule="interleaved", virtual_stages=2)
    return analyze_graph(load_model_proto(model, ImportOptions(batch_size=2)), cfg, make_cluster("a100", 16, 8), advise=False)


def _mixtral_ep():
    imported = load_model(FIXTURES / "mixtral_tiny_dynamo.onnx", ImportOptions(batch_size=2, seq_len=16))
    cfg = ParallelConfig(dp_size=2, ep_size=2, pp_size=2, micro_batch_size=2, global_batch_size=8, seq_len=16)
    return analyze_graph(imported, cfg, make_cluster("a100", 4, 4), advise=False)


def _gpt_cp():
    model = zoo.build_gpt(layers=4, hidden=256, heads=8, vocab=512, seq_len=256)
    cfg = ParallelConfig(cp_size=2, pp_size=2, micro_batch_size=2, global_batch_size=8, seq_len=256, cp_scheme="ring")
    return analyze_graph(load_model_proto(model, ImportOptions(batch_size=2)), cfg, make_cluster("a100", 4, 4), advise=False)


@pytest.fixture(scope="module", params=["gpt2_example_d2_p4_t2", "llama_zoo_interleaved", "mixtral_ep", "gpt_cp_ring"])
def trace(request):
    build = {"gpt2_example_d2_p4_t2": _gpt2_example, "llama_zoo_interleaved": _llama_zoo, "mixtral_ep": _mixtral_ep,
             "gpt_cp_ring": _gpt_cp}[request.param]
    analysis = build()
    return json.loads(trace_json(analysis, analysis.timeline))


def test_slices_on_every_track_nest_or_follow_exactly(trace):
    tracks: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for ev in trace["traceEvents"]:
        if ev["ph"] == "X":
            start = _ns(ev["ts"])
            end = start + _ns(ev["dur"])
            assert end >= start
            tracks.setdefault((ev["pid"], ev["tid"]), []).append((start, end))
    assert len(tracks) >= 2
    for key, spans in tracks.items():
        spans.sort(key=lambda s: (s[0], -s[1]))  # a parent before the slices it holds
        open_ends: list[int] = []
        for start, end in spans:
            while open_ends and open_ends[-1] <= start:
                open_ends.pop()
            # inside the innermost open slice, or after all of them: never straddling an end
            assert not open_ends or end <= open_ends[-1], f"track {key}: [{start}, {end}] ns overlaps a slice ending at {open_ends[-1]}"
            open_ends.append(end)


def test_one_counter_sample_per_timestamp_in_time_order(trace):
    series: dict[tuple[int, str], list[int]] = {}
    for ev in trace["traceEvents"]:
        if ev["ph"] == "C":
            series.setdefault((ev["pid"], ev["name"]), []).append(_ns(ev["ts"]))
    assert series
    for key, stamps in series.items():
        assert stamps == sorted(set(stamps)), f"counter {key} repeats or reorders a timestamp"


def test_timestamps_are_whole_nanoseconds(trace):
    for ev in trace["traceEvents"]:
        for field in ("ts", "dur"):
            if field in ev:
                assert abs(ev[field] * 1000 - _ns(ev[field])) < 1e-6


def test_flows_end_inside_a_compute_slice(trace):
    compute: dict[int, list[tuple[int, int]]] = {}
    for ev in trace["traceEvents"]:
        if ev["ph"] == "X" and ev["tid"] == 0:
            compute.setdefault(ev["pid"], []).append((_ns(ev["ts"]), _ns(ev["ts"]) + _ns(ev["dur"])))
    for ev in trace["traceEvents"]:
        if ev["ph"] == "f":  # "bp": "e" binds to the slice enclosing ts on that thread
            assert any(a <= _ns(ev["ts"]) <= b for a, b in compute[ev["pid"]])
