"""Reproductions of published numbers (../shared/REFERENCES.md) through the public API."""

from __future__ import annotations

from pathlib import Path

import pytest

from dml2comm import zoo
from dml2comm.analysis import analyze_graph
from dml2comm.hardware.cluster import make_cluster
from dml2comm.ir.onnx_import import ImportOptions
from dml2comm.load import load_model_proto
from dml2comm.parallel.config import ParallelConfig

# (layers, hidden, heads, vocab, seq): GPT-2 small, Narayanan Table 1's 1.7B and 18.4B, GPT-3 175B
SHAPES = [(12, 768, 12, 50257, 1024), (24, 2304, 24, 51200, 2048), (40, 6144, 48, 51200, 2048), (96, 12288, 96, 51200, 2048)]


@pytest.mark.parametrize("L,h,a,V,s", SHAPES)
def test_zoo_gpt_params_and_forward_flops_match_narayanan(L, h, a, V, s):
    imported = load_model_proto(zoo.build_gpt(layers=L, hidden=h, heads=a, vocab=V, seq_len=s), ImportOptions(batch_size=1))
    config = ParallelConfig(micro_batch_size=1, global_batch_size=1, seq_len=s)
    analysis = analyze_graph(imported, config, make_cluster("a100", 1, 1))
    # Narayanan et al. 2021 eq. (2): P = 12 L h^2 (1 + 13/(12 h) + (V + s)/(12 L h)) = 12Lh^2 + 13Lh + (V+s)h,
    # plus the final LayerNorm's 2h, which eq. (2) omits.
    eq2 = 12 * L * h * h + 13 * L * h + (V + s) * h
    assert analysis.model_info["params"] == eq2 + 2 * h
    # eq. (3)'s forward components per sample: 24 s h^2 + 4 s^2 h per layer, 2 s h V for the logits
    eq3_forward = L * (24 * s * h * h + 4 * s * s * h) + 2 * s * h * V
    assert analysis.model_info["flops_fwd_per_sample"] == pytest.approx(eq3_forward, rel=0.01)


NARAYANAN = Path(__file__).resolve().parents[1] / "dml2comm" / "validate" / "data" / "narayanan2021_table1.json"


TABLE1_IDS = ["narayanan21_t1_1.7B", "narayanan21_t1_3.6B", "narayanan21_t1_7.5B", "narayanan21_t1_18.4B",
              "narayanan21_t1_39.1B", "narayanan21_t1_76.1B", "narayanan21_t1_145.6B", "narayanan21_t1_310.1B",
              "narayanan21_t1_529.6B", "narayanan21_t1_1008.0B"]


def _bench(name: str):
    import importlib
    import sys

    path = str(Path(__file__).resolve().parents[1] / "benchmarks")
    if path not in sys.path:
        sys.path.insert(0, path)
    return importlib.import_module(name)


@pytest.mark.parametrize("model_id", TABLE1_IDS)
def test_narayanan_table1_tflops_per_gpu(model_id):
    """Narayanan et al. 2021 Table 1 (A100): predicted TFLOP/s per GPU, eq. (3) FLOPs, within 5%
    on every row (the issue's calibration requirement).  Setup and micro-batch sizes as
    benchmarks/bench_narayanan.py (its recorded sweep, MICRO_BATCH); errors there: +4.5, +0.8,
    -1.4, -0.9, -0.2, +3.4, -4.1, -2.4, -2.8, -3.7%."""
    assert NARAYANAN.exists(), f"{NARAYANAN} is missing: it is a bundled test fixture (restore it from git)"
    bench = _bench("bench_narayanan")
    assert [r[0] for r in bench.rows()] == TABLE1_IDS
    row = next(r for r in bench.rows() if r[0] == model_id)
    _, model, parallelism, measured = row
    predicted, _ = bench.predict(model, parallelism, bench.MICRO_BATCH[model_id])
    assert predicted == pytest.approx(measured, rel=0.05)


@pytest.mark.parametrize("run_id", ["narayanan21_t2_ptdp_174.6B_384gpus", "narayanan21_t2_ptdp_174.6B_768gpus",
                                    "narayanan21_t2_ptdp_174.6B_1536gpus", "narayanan21_t2_ptdp_529.6B_2240gpus"])
def test_heldout_published_tflops_per_gpu(run_id):
    """Held-out runs (benchmarks/data/heldout_runs.json; never used to fit): Narayanan et al.
    2021 Table 2's PTD-P rows, micro-batch 1 as published.  benchmarks/bench_heldout.py prints
    all six: GPT-3 175B on 384/768/1536 GPUs 153/149/141 published vs 146.3/143.5/138.2
    predicted (-4.4, -3.7, -2.0%); 529.6B on 560/1120/2240 GPUs 171/167/159 vs 164.8/162.7/158.5
    (-3.6, -2.6, -0.3%).  The test checks the four quicker runs at 7.5%: the 5% the calibration
    holds plus 2.5%, the paper's own spread between two near-identical runs of the 529.6B model
    (Table 2, 2240 GPUs, batch 2240: 159; Table 1, 2520 GPUs, batch 2520: 163), and the t/p split
    and schedule that Table 2 does not publish."""
    bench = _bench("bench_heldout")
    run = next(r for r in bench.runs() if r[0] == run_id)
    _, model, parallelism, published = run
    predicted, _ = bench.predict(model, parallelism, parallelism["micro_batch"])
    assert predicted == pytest.approx(published, rel=0.075)
