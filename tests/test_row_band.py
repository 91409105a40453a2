"""Every sweep and compare row states the expected error the analysis of its configuration states
(:func:`dml2comm.cost.bands.summary_band`, one function for both): the validated runs' band, and
with ``--profile`` the trace-derived one, on the sweep's collapsed graphs as on the whole graph."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from rich.console import Console

from dml2comm.analysis import analyze_graph
from dml2comm.cli.search import _table, run_compare_command
from dml2comm.cost.bands import expected_error_for, load_bands, plan_doublings
from dml2comm.cost.cache import layers_of
from dml2comm.hardware.cluster import get_cluster
from dml2comm.parallel.config import ParallelConfig
from dml2comm.search.explain import why_best
from dml2comm.search.sweep import CSV_COLUMNS, Evaluator, csv_text
from dml2comm.site.build import environment
from dml2comm.site.compare import comparison_page
from dml2comm.traces.predict import measured_and_modelled, profile_scale

from tests.h100_steps import GPT2, step_config


@pytest.fixture(scope="module")
def parts():
    return [measured_and_modelled(GPT2[1], GPT2[0], step_config(GPT2[2], GPT2[3]))]


def _steps(stack: str) -> list[ParallelConfig]:
    # micro-batch 8 is the import the collapse is found on (the coster collapses it itself); 4 and 16
    # import the collapsed model only (Evaluator.prepare_fast); 8 is also the profiled shape (0 doublings)
    def step(b: int, d: int = 1, t: int = 1, p: int = 1, m: int = 1) -> ParallelConfig:
        return dataclasses.replace(step_config(b, GPT2[3]), dp_size=d, tp_size=t, pp_size=p, global_batch_size=b * d * m, stack=stack)

    # one GPU count, as a sweep's (a fast evaluator prices one cluster)
    return [step(8, d=8), step(8, d=2, t=2, p=2, m=4), step(4, d=2, t=4), step(16, d=4, p=2, m=2), step(4, d=4, t=2, m=2)]


def _sweep_and_analyses(model: str, build, configs, first: int):
    ev = Evaluator(model, build, seq_len=configs[0].seq_len)
    ev.prepare_fast(first)
    rows = ev.evaluate_many(configs)  # the fast path, before any other import
    fast = {b: ev._fast[b] for b in {c.micro_batch_size for c in configs}}
    analyses = [analyze_graph(ev.imported(c.micro_batch_size), c, ev.cluster(c.num_gpus), advise=False, timeline=False)
                for c in configs]
    return rows, fast, analyses


# megatron: the sweep's collapsed graphs (its host model does not run ahead); pytorch: the host
# model fitted on the trace runs ahead of the GPU, which the collapse cannot carry (the whole graph)
@pytest.mark.parametrize("stack,profiled", [("megatron", False), ("megatron", True), ("pytorch", True)])
def test_a_sweep_row_states_its_analysis_band(parts, stack, profiled):
    scale = profile_scale(parts, "pytorch" if stack == "pytorch" else None) if profiled else None

    def build(n: int):
        return dataclasses.replace(get_cluster("dgx-h100", n), profile_scale=scale)

    configs = _steps(stack)
    rows, fast, analyses = _sweep_and_analyses(GPT2[0], build, configs, GPT2[2])
    if stack == "megatron":  # the sweep's rows come from collapsed graphs, found on this import or imported collapsed
        assert all(fe.collapsed is not None for fe in fast.values())
        assert fast[8].pre_collapsed is False and fast[4].pre_collapsed is True
    for config, row, a in zip(configs, rows, analyses):
        assert row["error"] is None
        s = a.summary
        assert row["expected_error"] == pytest.approx(s["expected_error"], rel=1e-12, abs=1e-15), config
        assert s["expected_error_source"].startswith("from the profile") is profiled
    if profiled:  # the bands differ across configurations: shapes, communication, other parts
        assert len({round(r["expected_error"], 9) for r in rows}) >= 3


def test_the_megatron_sweep_on_the_example_states_the_analysis_band():
    configs = [ParallelConfig(dp_size=d, tp_size=t, pp_size=p, micro_batch_size=b, global_batch_size=64, stack="megatron")
               for d, t, p, b in ((2, 2, 4, 1), (4, 2, 2, 1), (16, 1, 1, 2), (1, 4, 4, 4), (8, 2, 1, 8))]
    rows, fast, analyses = _sweep_and_analyses("examples/gpt2-small.onnx", lambda n: get_cluster("dgx-a100", n), configs, 1)
    assert all(fe.collapsed is not None for fe in fast.values())
    for row, a in zip(rows, analyses):
        # no profile: the validated runs nearest it, the same number exactly (one cached function)
        assert row["expected_error"] == a.summary["expected_error"]
    assert len({r["expected_error"] for r in rows}) >= 2
    text = csv_text([dict(r, index=i) for i, r in enumerate(rows)])
    header, first = text.splitlines()[:2]
    assert header.split(",") == list(CSV_COLUMNS) and "expected_error" in CSV_COLUMNS
    assert float(first.split(",")[CSV_COLUMNS.index("expected_error")]) == rows[0]["expected_error"]


def test_collapsed_layers_count_as_the_layers_they_stand_for(parts):
    # the FLOPs weights of plan_doublings: a collapsed graph with each layer counted as many
    # times as it stands for gives the full graph's distance exactly; counted once, less
    ev = Evaluator(GPT2[0], lambda n: get_cluster("dgx-h100", n), seq_len=GPT2[3])
    ev.prepare_fast(8)
    fe = ev.fast_evaluator(16, 1)
    assert fe.pre_collapsed and fe.model_params == ev.imported(16).graph.num_params > fe.graph.num_params
    # one profiled shape of the four (768 x 768 x 8192): the plan's GEMMs lie at several distances from it
    shapes = dict(profile_scale(parts).detail)["error"]["shapes"][:1]
    copies = np.bincount(fe.layer_map, minlength=len(fe.layered.layers))
    full = plan_doublings(layers_of(ev.imported(16).graph), shapes)
    assert full > 0 and plan_doublings(fe.layered, shapes, copies=copies) == full
    assert plan_doublings(fe.layered, shapes) != full


def test_the_tables_show_the_time_with_its_band(tmp_path):
    # compare: the terminal table, the page's side-by-side row and its table read "x ± y%"
    out = tmp_path / "cmp"
    assert run_compare_command(["examples/gpt2-small.onnx", "--global-batch-size", "64", "--configs", "d=2,t=2,p=4", "d=4,t=2,p=2",
                                "--out", str(out), "--no-site", "--json"]) == 0
    entries = json.loads((out / "data.json").read_text())["compare"]
    assert all(0 < e["expected_error"] < 1 for e in entries)
    rows = [dict(e, error=None) for e in entries]
    want = [f"± {e['expected_error']:.1%}" for e in entries]
    table = _table("t", rows, 200)
    console = Console(width=200, record=True)
    console.print(table)
    printed = console.export_text()
    assert "iteration ± error" in printed and all(w in printed for w in want)
    ctx, charts = comparison_page("compare", rows, capacity_bytes=8e10)
    side = dict(ctx["side"]["rows"])["iteration time ± expected error"]
    assert [s.split(" ± ")[1] for s in side] == [w[2:] for w in want]
    text = environment().get_template("compare.md.j2").render(**ctx, title="Compare", charts={k: "" for k in charts})
    assert all(f"</b> {w}</td>" in text for w in want)
    # a row without a band (an older data.json) shows the time alone
    bare = [dict(r, expected_error=None) for r in rows]
    assert "±" not in dict(comparison_page("compare", bare, capacity_bytes=8e10)[0]["side"]["rows"])["iteration time ± expected error"][0]


def test_the_cached_band_is_the_bands_own():
    # expected_error_for on the bundled file is cached per (GPU, stack, one node, t, p, parameters):
    # the same answer as computed from the rows passed in
    for gpus, t, p, params in ((8, 2, 4, 1.2e8), (64, 8, 8, 7e10), (2240, 8, 35, 5.3e11), (1, 1, 1, 1e9)):
        config = ParallelConfig(dp_size=gpus // (t * p) or 1, tp_size=t, pp_size=p, micro_batch_size=1, global_batch_size=4096)
        for cluster in (get_cluster("dgx-a100", gpus), get_cluster("dgx-h100", gpus)):
            assert expected_error_for(config, cluster, params) == expected_error_for(config, cluster, params, list(load_bands()))


def test_why_best_says_when_the_runner_up_is_inside_the_bands():
    def row(index: int, time_s: float, error: float | None) -> dict:
        config = {"d": 1, "t": 1, "p": 1 + index, "micro_batch_size": 1, "num_micro_batches": 1, "schedule": "1f1b",
                  "virtual_stages": 1, "zero_stage": 0, "recompute": "none", "sequence_parallel": False}
        return {"index": index, "config": config, "iteration_time_s": time_s, "compute_time_s": time_s, "bubble_time_s": 0.0,
                "exposed_comm_time_s": 0.0, "optimizer_time_s": 0.0, "fits": True, "error": None, "expected_error": error,
                "peak_memory_bytes": 1e9}

    close = why_best([row(0, 1.00, 0.05), row(1, 1.08, 0.05)])  # 1.05 > 1.08 * 0.95: the bands overlap
    assert "inside their expected errors (±5.0%, ±5.0%)" in close[1]
    far = why_best([row(0, 1.00, 0.05), row(1, 1.20, 0.05)])  # 1.05 < 1.14: apart
    assert "expected errors" not in far[1]
    assert "expected errors" not in why_best([row(0, 1.00, None), row(1, 1.01, None)])[1]
