"""The ``validate`` command: bundled public measurements, error statistics, regression alarms.

The thresholds below are regression alarms: today's figure (measured with the command on the
same deterministic sample) plus a margin, so that a change that makes any source worse fails
here.  They are not the issue's targets (those are in the README and printed by the command).
"""

from __future__ import annotations

import csv
import json
import math
import re
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from dml2comm import zoo
from dml2comm.analysis import analyze_graph
from dml2comm.cli import main
from dml2comm.hardware.cluster import get_cluster
from dml2comm.ir.onnx_import import ImportOptions
from dml2comm.load import load_model_proto
from dml2comm.parallel.config import ParallelConfig
from dml2comm.validate import SOURCES, Case, scaled_cluster, summarize
from dml2comm.validate import gemm, narayanan, steps, vtrain
from dml2comm.validate.cases import sample_indices
from dml2comm.validate.data import data_text

DATA = Path(__file__).resolve().parents[1] / "dml2comm" / "validate" / "data"


def _run(tmp_path: Path, *argv: str) -> tuple[dict, list[dict]]:
    out = tmp_path / "val"
    assert main(["validate", *argv, "--no-site", "--out", str(out)]) == 0  # the page: tests/test_validate_site.py
    summary = json.loads((out / "validation.json").read_text())
    with (out / "validation.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    return summary, rows


def test_summarize_statistics_by_hand():
    # errors +0.1, -0.2, +0.3: mean |e| 0.2, median |e| 0.2, signed mean 0.2/3, worst +0.3 (case c)
    cases = [Case("s", "a", "t", 1.0, 1.1), Case("s", "b", "t", 1.0, 0.8, tags=("x",)), Case("s", "c", "t", 2.0, 2.6)]
    s = summarize(cases, [("x", "only b")])
    assert s["count"] == 3
    assert s["mean_abs_error"] == pytest.approx(0.2)
    assert s["median_abs_error"] == pytest.approx(0.2)
    assert s["signed_mean_error"] == pytest.approx(0.2 / 3)
    assert (s["worst_error"], s["worst_case"]) == (pytest.approx(0.3), "c")
    assert s["subsets"]["x"]["count"] == 1 and s["subsets"]["x"]["worst_error"] == pytest.approx(-0.2)


def test_sample_is_deterministic_sorted_and_unique():
    first = sample_indices(1440, 40)
    assert first == sample_indices(1440, 40)
    assert first == sorted(set(first)) and len(first) == 40 and first[-1] < 1440
    assert sample_indices(10, 40) == list(range(10)) and sample_indices(10, None) == list(range(10))


def test_bundled_data_found_as_package_data_with_provenance():
    provenance = data_text("PROVENANCE.md")
    files = sorted(p.name for p in DATA.iterdir() if p.is_file() and p.name != "PROVENANCE.md")
    assert files == ["gpu_steps.json", "h100_kernels_measured.json", "h100_steps.json", "korthikanti2022_table4.json",
                     "narayanan2021_table1.json", "nccl_allreduce_measured.csv", "vtrain_ground_truth_single.csv",
                     "xla_collectives_h100.csv", "xla_matmul_h100_bf16.csv"]
    for name in files:
        assert f"`{name}`" in provenance
    models = sorted(p.name for p in (DATA / "models").iterdir())
    assert models == ["resnet18_dynamo.onnx", "step_bert_6l_512_dynamo.onnx", "step_bert_6l_512_legacy.onnx",
                      "step_gpt2_6l_512_dynamo.onnx", "step_gpt2_6l_512_legacy.onnx", "step_gpt2_medium_dynamo.onnx",
                      "step_gpt2_medium_legacy.onnx", "step_gpt2_small_dynamo.onnx",
                      "step_gpt2_small_legacy.onnx", "step_llama_0_3b_dynamo.onnx", "step_llama_1b_dynamo.onnx",
                      "step_qwen2_1_5b_dynamo.onnx", "step_vit_8l_512_dynamo.onnx", "step_vit_8l_512_legacy.onnx"]
    for name in models:
        assert f"`models/{name}`" in provenance
    assert len(vtrain.runs()) == 1440 and len(gemm.shapes()) == 375
    pyproject = (DATA.parents[2] / "pyproject.toml").read_text()
    assert '"dml2comm.validate" = ["data/*.json", "data/*.csv", "data/*.md", "data/models/*.onnx"]' in pyproject


def test_vtrain_vocab_padding_as_megatron():
    # Megatron _vocab_size_with_padding: next multiple of 128 t; 50257 -> 50304, 50432, 50688, 51200
    assert [vtrain.padded_vocab(50257, t) for t in (1, 2, 4, 8)] == [50304, 50432, 50688, 51200]


def test_compute_scale_scales_the_a100_sustained_factor_on_a_compute_bound_matmul():
    """Scaling the A100's sustained GEMM factor by s divides a compute-bound GEMM's time less its
    fixed kernel latency (SHAPE_LAW.latency_s) by s exactly: the main loops and the tiles' fixed
    costs both run at peak x f.  b=4, m=n=k=4096 bf16 is far above the roofline ridge (AI ~ 1,365
    FLOP/B vs 312e12 / 2.04e12 ~ 153) and picks no split-K."""
    from dml2comm.cost.gemm import SHAPE_LAW, SUSTAINED_FACTOR

    big = [(4, 4096, 4096, 4096)]
    imported = load_model_proto(gemm.matmul_model(big), ImportOptions(batch_size=1))
    cluster = replace(get_cluster("dgx-a100", 1), collective_overhead_s=0.0)
    times = []
    for s in (1.0, 1.25):
        analysis = analyze_graph(imported, ParallelConfig(dtype="bf16"), scaled_cluster(cluster, s), advise=False, timeline=False)
        times.append(next(op.time_fwd_s for op in analysis.ops if op.op_type == "MatMul") - SHAPE_LAW.latency_s)
    assert times[1] == pytest.approx(times[0] / 1.25, rel=1e-9)
    assert scaled_cluster(cluster, 1.0) is cluster
    scaled = scaled_cluster(cluster, 1.25).gpu
    assert scaled.gemm_sustained_factor == SUSTAINED_FACTOR["A100-SXM4-80GB"] * 1.25
    assert scaled.peak_flops("bf16") == cluster.gpu.peak_flops("bf16")


def test_narayanan_shares_the_benchmark_setup_and_reproduces_it():
    """benchmarks/bench_narayanan.py imports its setup from dml2comm.validate.narayanan (one
    implementation); the 1.7B row predicted through it equals an analysis set up by hand as the
    benchmark documents (fp16, full recomputation, gradients reduced after backward, b = 8,
    32 A100s, no pipelining so 1F1B, collectives at kernel time)."""
    import importlib
    import sys

    bench_dir = str(DATA.parents[2] / "benchmarks")
    if bench_dir not in sys.path:
        sys.path.insert(0, bench_dir)
    bench = importlib.import_module("bench_narayanan")
    assert bench.predict is narayanan.predict and bench.MICRO_BATCH is narayanan.MICRO_BATCH
    name, m, par, measured = next(narayanan.rows())
    assert (name, measured, narayanan.MICRO_BATCH[name]) == ("narayanan21_t1_1.7B", 137, 8)
    predicted, _ = narayanan.predict(m, par, 8)
    imported = load_model_proto(zoo.build_gpt(layers=24, hidden=2304, heads=24, vocab=51200, seq_len=2048, ffn_hidden=9216),
                                ImportOptions(batch_size=8))
    config = ParallelConfig(dp_size=32, micro_batch_size=8, global_batch_size=512, seq_len=2048, recompute="full",
                            overlap_grad_reduce=False, grad_accumulation_fusion=False, dtype="fp16")
    analysis = analyze_graph(imported, config, replace(get_cluster("dgx-a100", 32), collective_overhead_s=0.0),
                             advise=False, timeline=False)
    # eq. (3): 96 B s L h^2 (1 + s/(6h) + V/(16 L h)) over time and 32 GPUs
    flops = 96 * 512 * 2048 * 24 * 2304**2 * (1 + 2048 / (6 * 2304) + 51200 / (16 * 24 * 2304))
    assert predicted == pytest.approx(flops / analysis.summary["iteration_time_s"] / 32 / 1e12, rel=1e-12)


@pytest.mark.slow
def test_narayanan_source_every_row_and_mean_alarm(tmp_path):
    """Target: every row within 5%.  Alarm: mean |error| 1.7% today (worst +4.7%, 76.1B; the A100
    sustained GEMM factor is held to these rows' 5%) -> 3%."""
    summary, rows = _run(tmp_path, "--source", "narayanan2021", "--no-loso")
    s = summary["sources"]["narayanan2021"]
    assert s["count"] == 10 == len(rows)
    assert all(abs(float(r["error"])) <= 0.05 for r in rows)
    assert s["mean_abs_error"] <= 0.03


def test_vtrain_and_korthikanti_sampled_with_loso(tmp_path):
    """--sample 40 (deterministic) of vTrain and the ten Korthikanti cases, with the
    leave-one-source-out refits.  Alarms (today + margin): vTrain mean |error| 8.8% -> 11% (32.8%
    before the host model, dml2comm.cost.host); Korthikanti 3.6% -> 5% (12.7% before the
    asynchronous TP all-reduce and the memory-bound GEMM tile cost, 4.6% before the GEMM's partial
    last wave, 3.4% before autograd's gradient sums, dml2comm.cost.ops.gradient_forks), and the
    issue's target on it: every layer time, forward and backward, within 5% (its forward with
    sequence parallelism was 5.5% too slow before the gradient sums; 4.7% now)."""
    summary, rows = _run(tmp_path, "--source", "vtrain", "--source", "korthikanti2022", "--sample", "40")
    assert [r["source"] for r in rows] == ["vtrain"] * 40 + ["korthikanti2022"] * 10
    for r in rows:
        assert float(r["error"]) == pytest.approx(float(r["predicted"]) / float(r["measured"]) - 1)
    v, k = summary["sources"]["vtrain"], summary["sources"]["korthikanti2022"]
    assert (v["count"], k["count"], summary["sample"]) == (40, 10, 40)
    assert v["mean_abs_error"] <= 0.11
    assert k["mean_abs_error"] <= 0.05
    assert all(abs(float(r["error"])) <= 0.05 for r in rows if r["source"] == "korthikanti2022")
    loso = {r["source"]: r for r in summary["loso"]}
    assert loso["vtrain"]["loso_fitted_on"] == ["korthikanti2022"]
    assert loso["korthikanti2022"]["loso_fitted_on"] == ["vtrain"]
    assert loso["vtrain"]["in_sample_fitted_on"] == ["vtrain", "korthikanti2022"]
    for r in loso.values():
        assert 0.5 <= r["loso_scale"] <= 1.45 and 0.5 <= r["in_sample_scale"] <= 1.45
        assert r["shipped_mean_abs_error"] == pytest.approx(summary["sources"][r["source"]]["mean_abs_error"])
    # the in-sample fit minimises the mean of the two sources' errors (each re-evaluated for
    # real at the chosen scale): it cannot be worse than the shipped constant by more than the
    # interpolation's slack
    fitted = (loso["vtrain"]["in_sample_mean_abs_error"] + loso["korthikanti2022"]["in_sample_mean_abs_error"]) / 2
    shipped = (v["mean_abs_error"] + k["mean_abs_error"]) / 2
    assert fitted <= shipped + 0.005


def test_collective_and_gemm_sources_sampled(tmp_path):
    """Alarms (today + margin, --sample 40): NCCL mean 1.9% -> 3% (A100 rows within 10%, the
    target); H100 collectives >= 16 MiB mean 5.3% -> 7%, all sizes median 6.4% -> 9%;
    H100 bf16 GEMMs >= 1 GFLOP, the held-out half (the analytical model refitted without it),
    median 3.3% -> 5%."""
    summary, rows = _run(tmp_path, "--source", "nccl,xla_collectives,gemm", "--sample", "40", "--no-loso")
    nccl, xla, mm = (summary["sources"][n] for n in ("nccl", "xla_collectives", "gemm"))
    assert (nccl["count"], xla["count"], mm["count"]) == (14, 40, 40)
    assert summary["loso"] == []
    assert nccl["mean_abs_error"] <= 0.03
    assert all(abs(float(r["error"])) <= 0.10 for r in rows if r["case"].startswith("A100/"))
    assert xla["subsets"][">=16MiB"]["mean_abs_error"] <= 0.07
    assert xla["median_abs_error"] <= 0.09
    assert mm["subsets"][">=1GFLOP"]["median_abs_error"] <= 0.05
    # a GEMM case's measured time is 2 b m n k / the table's throughput (first row: 6.7216 TFLOP/s at 256^3)
    assert gemm.shapes()[0] == (1, 256, 256, 256, 6721641025641.0)
    throughput = {f"b{b}_m{m}_n{n}_k{k}": (2 * b * m * n * k, f) for b, m, n, k, f in gemm.shapes()}
    gemm_rows = [r for r in rows if r["source"] == "gemm"]
    assert len(gemm_rows) == 40
    for r in gemm_rows:
        flops, per_s = throughput[r["case"]]
        assert float(r["measured"]) == pytest.approx(flops / per_s, rel=1e-12)


def test_h100_steps_source_runs_from_the_command_with_four_finite_cases(tmp_path, capsys):
    """The issue-32 source: two measured H100 training steps, each a step time and a peak memory
    against the analysis of the real export.  Not an accuracy test (the errors are reported, the
    target is 5%): the cases exist, carry the measured values of the bundled file, and have finite
    predictions.  Measured (h100_steps.json): GPT-2 small's four repeats on two machines 51.5116,
    51.6905, 49.2857 and 49.4904 ms, 10,346,023,936 (three) and 10,337,111,040 bytes -> means
    50.4946 ms and 10,343,795,712 bytes; Llama-1B's three 179.9878, 180.6017 and 181.4286 ms, each
    34,471,360,512 bytes."""
    out = tmp_path / "val"
    assert main(["validate", "--source", "h100-steps", "--no-site", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "h100-steps" in printed and "time and peak memory each within 5%" in printed
    summary = json.loads((out / "validation.json").read_text())
    with (out / "validation.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [(r["case"], r["quantity"]) for r in rows] == [
        ("gpt2-small/time", "iteration_time_s"), ("gpt2-small/memory", "peak_memory_bytes"),
        ("llama-1b/time", "iteration_time_s"), ("llama-1b/memory", "peak_memory_bytes")]
    measured = [float(r["measured"]) for r in rows]
    assert measured == pytest.approx([0.05049455650000212, 10343795712.0, 0.18067271866666346, 34471360512.0], rel=1e-12)
    for r in rows:
        predicted = float(r["predicted"])
        assert math.isfinite(predicted) and predicted > 0
        assert "dgx-h100 d=t=p=1" in r["setup"] and "pytorch stack, bf16 precision, flash attention, adamw" in r["setup"]
    s = summary["sources"]["h100-steps"]
    assert (s["count"], s["in_fit"], s["depends_on_fitted_constant"]) == (4, False, False)
    assert summary["loso"] == []  # nothing is refitted on it
    assert s["target_check"].startswith("time worst |error|") and "; peak memory worst |error|" in s["target_check"]


def test_h100_steps_are_analysed_as_the_pytorch_stack_on_one_h100():
    """The configuration the cases come from: the export's torch parameter count, one H100 of
    the dgx-h100 preset, pure bf16 under the pytorch stack (its host model), fused AdamW."""
    run = next(r for r in steps.runs() if r["name"] == "gpt2-small")
    assert (run["micro_batch"], run["seq"], run["params"], run["repeats"]) == (8, 1024, 124_439_808, 4)
    analysis = steps.predict(run)
    cfg = analysis.config
    assert (cfg.num_gpus, cfg.micro_batch_size, cfg.global_batch_size, cfg.seq_len) == (1, 8, 8, 1024)
    assert (cfg.stack, cfg.precision, cfg.attention, cfg.dtype, cfg.optimizer) == ("pytorch", "bf16", "flash", "bf16", "adamw")
    assert analysis.cluster.gpu.name.startswith("H100") and analysis.cluster.host_model == "pytorch"
    assert analysis.model_info["params"] == 124_439_808


def test_h100_gemm_source(tmp_path):
    """The measured H100 GEMMs (PyTorch 2.11 / cuBLAS), the three layouts of 140 nn.Linear shapes:
    420 cases, each the GEMM training_gemms gives that layout costed by gemm_time_s, against the
    file's seconds.  Target median <= 8% over >= 1 GFLOP; today 3.5% (alarm at 5%), the 18
    unaligned ones 11.3% (alarm at 15%)."""
    from dml2comm.cost import gemm as cost_gemm
    from dml2comm.hardware.gpus import get_gpu
    from dml2comm.validate.data import read_json

    summary, rows = _run(tmp_path, "--source", "h100-gemm", "--no-loso")
    src = summary["sources"]["h100-gemm"]
    assert src["count"] == 420 and src["target_met"] is True
    assert src["subsets"][">=1GFLOP"]["count"] == 420 and src["subsets"][">=1GFLOP"]["median_abs_error"] <= 0.05
    assert src["subsets"]["unaligned"]["count"] == 18 and src["subsets"]["unaligned"]["median_abs_error"] <= 0.15
    assert [src["subsets"][k]["count"] for k in ("fwd", "dgrad", "wgrad")] == [140, 140, 140]
    first = read_json("h100_kernels_measured.json")["gemm"][0]  # M=2048 N=2304 K=768
    h100 = get_gpu("h100")
    expect = {"fwd": (1, 2048, 2304, 768), "dgrad": (1, 2048, 768, 2304), "wgrad": (1, 768, 2304, 2048)}
    for layout, shape in expect.items():
        row = next(r for r in rows if r["case"] == f"{layout}_M2048_N2304_K768")
        assert float(row["measured"]) == first[f"{layout}_s"]
        assert float(row["predicted"]) == cost_gemm.gemm_time_s(h100, "bf16", *shape)


def test_json_flag_prints_the_summary(tmp_path, capsys):
    assert main(["validate", "--source", "nccl", "--json", "--out", str(tmp_path)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads((tmp_path / "validation.json").read_text())
    assert list(printed["sources"]) == ["nccl"]


@pytest.mark.parametrize("argv, message", [
    (["--source", "bogus"], "unknown --source 'bogus'; valid: " + ", ".join(SOURCES)),
    (["--sample", "0"], "--sample"),
])
def test_bad_arguments_are_one_line_errors_and_write_nothing(tmp_path, capsys, argv, message):
    out = tmp_path / "val"
    assert main(["validate", *argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and message in err
    assert not out.exists()


#: Mean |error| at >= 16 MiB per (op, group) of the whole bundled H100 table with the shipped
#: constants (``python main.py validate --source xla_collectives``; the fit and its held-out
#: groups of 4: benchmarks/fit_h100_collectives.py).  Before the H100 calibration: 9.4-25.6 %.
XLA_PINNED = {
    ("ALL_GATHER", 2): 0.063, ("ALL_GATHER", 4): 0.043, ("ALL_GATHER", 8): 0.036,
    ("ALL_REDUCE", 2): 0.053, ("ALL_REDUCE", 4): 0.092, ("ALL_REDUCE", 8): 0.074,
    ("ALL_TO_ALL", 2): 0.055, ("ALL_TO_ALL", 4): 0.046, ("ALL_TO_ALL", 8): 0.045,
    ("REDUCE_SCATTER", 2): 0.055, ("REDUCE_SCATTER", 4): 0.044, ("REDUCE_SCATTER", 8): 0.031,
}


def test_h100_collectives_per_op_and_group_pinned():
    """Alarm on every (op, group) of the H100 table at >= 16 MiB (today + 0.5 point, and never
    above the 10 % target) and on the median over all 264 sizes (11.2 % -> 11.7 %, target 15 %)."""
    from collections import defaultdict
    from statistics import median

    from dml2comm.validate.collectives import xla_cases, xla_rows

    rows, cases = xla_rows(), xla_cases()
    assert len(rows) == len(cases) == 264
    big = defaultdict(list)
    for r, c in zip(rows, cases):
        if r.size_bytes >= 16 * 2**20:
            big[(r.kind.value, r.ranks)].append(abs(c.predicted / c.measured - 1))
    assert set(big) == set(XLA_PINNED) and all(len(v) == 8 for v in big.values())  # 16 MiB ... 2 GiB
    for key, errors in big.items():
        mean = sum(errors) / len(errors)
        assert mean <= min(XLA_PINNED[key] + 0.005, 0.10), (key, mean)
    assert median(abs(c.predicted / c.measured - 1) for c in cases) <= 0.117
    # XLA timed the executable on the GPU: its fitted 20 us per call replaces the preset's 51.5 us PyTorch-path overhead
    from dml2comm.network.model import collective_cost_for_group
    from dml2comm.validate.collectives import XLA_CALL_OVERHEAD_S, predict

    r = rows[0]
    preset = collective_cost_for_group(get_cluster("dgx-h100", r.ranks), r.kind, list(range(r.ranks)), float(r.size_bytes))
    assert XLA_CALL_OVERHEAD_S == 20e-6
    assert predict(r).time_s - preset.time_s == pytest.approx(20e-6 - 51.5e-6, abs=1e-12)


def test_vtrain_multi_node_heldout_set_is_costed_on_the_nics_a_node_has():
    """vTrain's multi-node runs (benchmarks/data/heldout_vtrain_multi.csv, never fitted) go
    through the calibration set's own modelling at s = 2048: the file is read whole, and a node
    with half the NICs never makes a run faster, while tensor parallelism that spans two nodes
    (t = 16 on 8-GPU nodes) slows far more than runs whose tensor group stays in a node."""
    path = Path(__file__).resolve().parent.parent / "benchmarks" / "data" / "heldout_vtrain_multi.csv"
    with path.open(newline="") as f:
        table = vtrain.read_runs(csv.DictReader(f))
    assert len(table) == 109 and {r["s"] for r in table} == {2048}
    assert all(r["t"] * r["d"] * r["p"] == r["gpus"] for r in table)
    picked = [i for i, r in enumerate(table) if r["h"] == 3072 and r["b"] == 8]
    four, eight = vtrain.predict(table, picked, nics_per_node=4), vtrain.predict(table, picked)
    slowdown = {table[i]["t"]: four[i] / eight[i] for i in picked if table[i]["p"] == 1}
    assert all(four[i] >= eight[i] > 0 for i in picked)
    assert slowdown[16] > 1.2 and max(slowdown[t] for t in (1, 2, 4, 8)) < 1.05, slowdown


def test_validate_reports_each_step_to_its_progress_callback():
    from dml2comm.validate.run import Step, planned_steps, validate
    from dml2comm.validate.fit import GRID

    sources = [SOURCES["nccl"], SOURCES["korthikanti2022"]]
    calls = []
    validate(sources, sample=2, loso=True, on_step=lambda done, total, step: calls.append((done, total, step)))
    # nccl once; korthikanti2022 (depends on the fitted constant) once, at the 7 other grid scales and its 2 refits
    assert planned_steps(sources) == 2 + (len(GRID) - 1 + 2) == 11
    assert calls[0] == (0, 11, Step("nccl", 1.0, None)) and calls[1] == (1, 11, Step("nccl", 1.0, 2))
    assert calls[2][2] == Step("korthikanti2022", 1.0, None) and calls[3][2].cases > 0
    assert calls[-1][0] == calls[-1][1] == 11
    assert [c[0] for c in calls] == sorted(c[0] for c in calls)  # never backwards
    scales = {c[2].compute_scale for c in calls if c[2].source == "korthikanti2022"}
    assert all(any(math.isclose(g, s) for s in scales) for g in GRID)  # the grid, as 1/(1/g)


@pytest.mark.parametrize("json_flag", [False, True])
def test_validate_shows_progress_on_a_terminal_only(tmp_path, capsys, monkeypatch, json_flag):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # a fake terminal, as the sweep decides
    argv = ["validate", "--source", "nccl,h100-gemm", "--no-site", "--out", str(tmp_path)] + (["--json"] if json_flag else [])
    assert main(argv) == 0
    err = capsys.readouterr().err
    if json_flag:
        assert err == ""
    else:
        assert re.search(r"  nccl: \d+ cases in \d+\.\d s", err) and "h100-gemm:" in err


def test_validate_stays_quiet_when_piped(tmp_path, capsys):
    assert main(["validate", "--source", "nccl", "--no-site", "--out", str(tmp_path)]) == 0
    assert capsys.readouterr().err == ""


def test_validate_help_states_its_duration(capsys):
    with pytest.raises(SystemExit):
        main(["validate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "1.5-2 minutes on 2 CPU cores" in text and "--sample N" in text and "--no-loso" in text
