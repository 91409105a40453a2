"""--profile: measured / modelled ratios of a profiled step, applied to the plan's modelled times."""

from __future__ import annotations

import dataclasses
import math

import pytest

from dml2comm.analysis import analyze_graph
from dml2comm.cli import main
from dml2comm.errors import ConfigError
from dml2comm.hardware.cluster import get_cluster
from dml2comm.ir.onnx_import import ImportOptions
from dml2comm.load import load_model
from dml2comm.parallel.config import ParallelConfig
from dml2comm.cost.host import PYTORCH
from dml2comm.traces.host import (PROFILER_CPU_SLOWDOWN, PROFILER_SLOWDOWN_SPREAD, STEP_TIME_SPREAD, fitted_host_model, host_figures,
                                  step_time_factor)
from dml2comm.traces.load import load_trace
from dml2comm.traces.predict import measured_and_modelled, profile_from_args, profile_scale

from tests.h100_steps import GPT2, LLAMA, run_profiled as _run, step_config as _config


@pytest.fixture(scope="module")
def gpt2_parts():
    model, trace, b, s, _ = GPT2
    return measured_and_modelled(trace, model, _config(b, s))


def test_ratios_are_measured_over_modelled_per_kind(gpt2_parts):
    p = gpt2_parts
    assert (p["micro_batch"], p["seq_len"], p["gpu"]) == (8, 1024, "H100-SXM5-80GB")
    assert set(p["measured"]) == {"embedding", "block", "head", "loss", "optimizer", "input"}
    # the step copied no batch to the GPU (its token ids were made there): the model's read of
    # them over PCIe gets factor 0
    assert p["measured"]["input"] == (0.0, 0.0) and p["modelled"]["input"][0] > 0
    # every kernel of the step lands in a kind: blocks are a mean, so times the 12 blocks
    total = sum(f + b for k, (f, b) in p["measured"].items() if k != "block") + 12 * sum(p["measured"]["block"])
    assert p["unattributed_s"] == pytest.approx(0.0, abs=1e-9)
    # the tied embedding's gradient sum (run in the embedding's backward) is modelled apart, so it
    # comes off the embedding's measured time: 3 x 50,257 x 768 bf16 bytes at H100's 0.85 x 3.35 TB/s
    assert p["shared_sum_s"] == pytest.approx(3 * 50257 * 768 * 2 / (0.85 * 3.35e12), rel=1e-3)
    assert total + p["shared_sum_s"] == pytest.approx(p["gpu_s"], rel=1e-9)
    scale = profile_scale([p])
    for kind, f, b in scale.ratios:
        assert f == pytest.approx(p["measured"][kind][0] / p["modelled"][kind][0], rel=1e-12)
        if kind not in ("optimizer", "input"):
            assert b == pytest.approx(p["measured"][kind][1] / p["modelled"][kind][1], rel=1e-12)
    # two copies of one trace give the same ratios as one
    for r, q in zip(profile_scale([p, p]).ratios, scale.ratios):
        assert r[0] == q[0] and r[1:] == pytest.approx(q[1:], rel=1e-12)




@pytest.mark.parametrize("case", [LLAMA, GPT2], ids=["llama-1b", "gpt2-small"])
def test_profile_reproduces_the_profiled_step(tmp_path, case):
    model, trace, b, s, measured = case
    data = _run(tmp_path, model, trace, b, s, "--step-time", str(measured))
    predicted = data["summary"]["iteration_time_s"]
    # kernel time and host figures: the trace's own, the CPU side scaled by the factor that best
    # explains the timed step (traces.host.step_time_factor): GPT-2 small's host-bound step is
    # reproduced (-0.02%, x 0.827), Llama-1B's GPU-bound one hardly moves with its CPU, so the
    # factor stays at the bundled median slowdown's (x 0.823 against 0.820; -1.0%)
    assert abs(predicted / measured - 1) < (0.005 if b == 8 else 0.03)
    host = data["profile"]["host"]
    assert host["step_time_s"] == measured
    assert host["cpu_slowdown_factor"] == pytest.approx(1 / PROFILER_CPU_SLOWDOWN, rel=0.01 if b == 4 else 0.05)
    # the trace's issue time over the kernels the model charges (OpCosts.launches), not the trace's own
    fig = host["traces"][0]
    charged = host["kernel_s"] * fig["forward_launches"] + host["backward_kernel_s"] * (fig["launches"] - fig["forward_launches"])
    assert charged == pytest.approx(fig["issue_s"] * host["cpu_slowdown_factor"], rel=1e-12)
    assert fig["launches"] != fig["kernels"]
    # Llama-1B's step filled the launch queue: the passes share the issue time as the trace's
    # launches did (a third forward), not as the model's kernels do (two fifths); GPT-2 small's
    # never filled: one time per kernel
    forward, backward = fig["pass_launches"]
    if fig["full_queue_launches"]:
        assert host["kernel_s"] * fig["forward_launches"] / charged == pytest.approx(forward / (forward + backward), rel=1e-12)
        assert 0.3 < forward / (forward + backward) < 0.35 < fig["forward_launches"] / fig["launches"]
    else:
        assert host["backward_kernel_s"] == host["kernel_s"]
    # without --step-time the CPU side is the trace's over the bundled median slowdown: Llama-1B
    # the same within 0.1% (GPU-bound), GPT-2 small -0.2% (x 1/1.219 instead of x 0.827: a faster
    # CPU, so a shorter step than with --step-time)
    plain = _run(tmp_path, model, trace, b, s)["summary"]["iteration_time_s"]
    assert abs(plain / measured - 1) < 0.03
    assert plain == pytest.approx(predicted, rel=1e-3) if b == 4 else plain < predicted
    prof = data["profile"]
    assert prof["files"][0]["file"] == trace.rsplit("/", 1)[1] and len(prof["files"][0]["sha256"]) == 64
    assert set(prof["ratios"]) == {"embedding", "block", "head", "loss", "optimizer", "input"}
    assert prof["attributed_share"] == pytest.approx(1.0, abs=0.01)


def test_host_figures_of_the_bundled_traces(gpt2_parts):
    # benchmarks/host_pytorch.py prints the same figures (the profiled issue time per kernel)
    g = gpt2_parts["host"]
    assert (g.kernels, g.gpu_items, g.queued_gaps) == (704, 823, 675)
    assert g.kernel_s == pytest.approx(52.33e-6, abs=0.01e-6)  # issue time per kernel
    assert g.gap_s == pytest.approx(1.570e-6, abs=0.001e-6)  # GPU idle per queued kernel
    assert g.gpu_busy_s == pytest.approx(47.09e-3, abs=0.01e-3) and g.gpu_span_s == pytest.approx(59.59e-3, abs=0.01e-3)
    assert g.starved_idle_s == pytest.approx(11.44e-3, abs=0.01e-3) and g.host_bound  # 19% of the span
    llama = host_figures(load_trace(LLAMA[1]))
    assert (llama.kernels, llama.queued_gaps) == (2025, 2348)
    # 40.64 us with the intervals after its 273 launches into a full queue counted (tests/test_host_queue.py)
    assert llama.kernel_s == pytest.approx(39.14e-6, abs=0.01e-6) and llama.gap_s == pytest.approx(1.626e-6, abs=0.001e-6)
    assert llama.starved_idle_s == pytest.approx(1.97e-3, abs=0.01e-3) and not llama.host_bound  # 1.1% of 180.0 ms
    # the fitted model: the stack's preset with the trace's figures, the issue time times the
    # factor that removes the profiler's slowdown (the bundled median's without one)
    model = fitted_host_model([g], PYTORCH, 0.8)
    assert model.kernel_s == pytest.approx(g.kernel_s * 0.8, rel=1e-12)
    assert (model.name, model.gap_s, model.run_ahead) == ("trace", g.gap_s, True)
    assert fitted_host_model([g], PYTORCH).kernel_s == pytest.approx(g.kernel_s / PROFILER_CPU_SLOWDOWN, rel=1e-12)
    both = fitted_host_model([g, llama], PYTORCH)
    assert both.kernel_s == pytest.approx((g.issue_s + llama.issue_s) / (704 + 2025) / PROFILER_CPU_SLOWDOWN, rel=1e-12)


def test_step_time_factor_weighs_the_timed_step_against_the_measured_slowdowns():
    prior = 1 / PROFILER_CPU_SLOWDOWN
    # a step set by its CPU (time proportional to the factor) timed 30% faster than its traced
    # CPU: the factor is the precision-weighted mean in log of the timed step's and the prior's
    # (the grid's resolution is PROFILER_SLOWDOWN_SPREAD x 8 / 256 in log)
    w_s, w_p = 1 / STEP_TIME_SPREAD ** 2, 1 / PROFILER_SLOWDOWN_SPREAD ** 2
    want = math.exp((math.log(0.7) * w_s + math.log(prior) * w_p) / (w_s + w_p))
    got = step_time_factor(lambda f: 0.06 * f, 0.042)
    assert abs(math.log(got / want)) < PROFILER_SLOWDOWN_SPREAD * 8 / 256
    assert abs(got / 0.7 - 1) < 0.02  # the timed step decides
    # a GPU-bound step (its time does not move with the CPU) keeps the median slowdown
    assert step_time_factor(lambda f: 0.05, 0.051) == pytest.approx(prior, rel=1e-12)
    # one the model cannot time, likewise
    assert step_time_factor(lambda f: float("nan"), 0.051) == pytest.approx(prior, rel=1e-12)
    # a partly host-bound step: only the CPU's part moves, so a timed step 4% slower than the
    # prior's asks a larger change of the factor than it would of a wholly host-bound step's
    partly = step_time_factor(lambda f: 0.04 + 0.01 * f / prior, 0.05 * 1.04)
    whole = step_time_factor(lambda f: 0.05 * f / prior, 0.05 * 1.04)
    assert prior < whole < partly
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ConfigError, match="--step-time must be a positive number"):
            step_time_factor(lambda f: 0.05, bad)


def test_step_time_is_one_traces(gpt2_parts):
    with pytest.raises(ConfigError, match="one --profile trace"):
        profile_scale([gpt2_parts, gpt2_parts], "pytorch", 0.05)


def test_step_time_needs_a_profile(tmp_path, capsys):
    model, trace, b, s, measured = GPT2
    base = [model, "--cluster", "dgx-h100", "--gpus", "1", "--stack", "pytorch", "--precision", "bf16", "--micro-batch-size", "8",
            "--seq-len", "1024", "--no-site", "--out", str(tmp_path / "out"), "--step-time", "0.0516"]
    for extra, start in (((), "error: --step-time scales a profiled step's host figures; add --profile"),
                         (("--profile", trace, "--host-model", "none"), "error: --step-time scales the host figures"),
                         (("--profile", trace, "--step-time", "0"), "error: --step-time must be a positive number of seconds")):
        rc = main([*base, *extra])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and err[0].startswith(start), err
    assert not (tmp_path / "out").exists()


def test_profile_without_host_gives_the_traced_kernel_time(tmp_path, gpt2_parts):
    model, trace, b, s, _ = GPT2
    data = _run(tmp_path, model, trace, b, s, "--host-model", "none")
    assert data["summary"]["iteration_time_s"] == pytest.approx(gpt2_parts["gpu_s"], rel=1e-3)


def test_a_trace_of_another_model_is_refused(tmp_path, capsys):
    out = tmp_path / "out"
    rc = main([GPT2[0], "--cluster", "dgx-h100", "--gpus", "1", "--stack", "pytorch", "--precision", "bf16",
               "--micro-batch-size", "8", "--seq-len", "1024", "--profile", LLAMA[1], "--no-site", "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("error: --profile trace_llama-1b_bf16_b4.json.gz: not a step of this model")
    assert not out.exists()
    with pytest.raises(ConfigError, match="no such file"):
        profile_from_args([str(tmp_path / "missing.json.gz")], GPT2[0], _config(8, 1024))


def test_fast_path_equals_the_analysis_with_a_profile(gpt2_parts):
    # a small zoo GPT with the GPT-2 step's ratios (per layer kind): the sweep's collapsed tables
    # and the analysis's whole graph read the same scaled op, loss and optimizer times
    from dml2comm import zoo
    from dml2comm.load import load_model_proto
    from dml2comm.model import FastEvaluator

    scale = profile_scale([gpt2_parts], "pytorch")  # with the trace's host model
    assert scale.host is not None and scale.host.kernel_s == pytest.approx(
        gpt2_parts["host"].issue_s / gpt2_parts["launches"] / PROFILER_CPU_SLOWDOWN, rel=1e-12)
    imported = load_model_proto(zoo.build_gpt(layers=8, hidden=256, heads=8, vocab=512, seq_len=128), ImportOptions(batch_size=1))
    cluster = dataclasses.replace(get_cluster("dgx-h100", 8), host_model="pytorch", profile_scale=scale)
    plain = dataclasses.replace(cluster, profile_scale=None)
    configs = [ParallelConfig(dp_size=d, tp_size=t, pp_size=p, global_batch_size=8, stack="pytorch", precision="bf16",
                              optimizer="adamw", recompute=r)
               for d, t, p in ((8, 1, 1), (2, 2, 2)) for r in ("none", "full")]
    rows = FastEvaluator(imported, cluster).evaluate(configs)
    for config, row in zip(configs, rows):
        full = analyze_graph(imported, config, cluster, advise=False, timeline=False).summary
        assert row["iteration_time_s"] == pytest.approx(full["iteration_time_s"], rel=1e-9), config
        without = analyze_graph(imported, config, plain, advise=False, timeline=False).summary
        assert full["iteration_time_s"] != without["iteration_time_s"]  # the ratios are read, and cached apart


def test_a_trace_of_several_steps_spreads_its_launch_time_over_each_steps_kernels(gpt2_parts):
    # a trace of two identical profiled steps (ProfilerStep#1, #2): twice the launch time over
    # twice the modelled kernels, the same issue time per kernel as one step
    g = gpt2_parts["host"]
    two = dataclasses.replace(g, steps=2, issue_s=2 * g.issue_s, kernels=2 * g.kernels, gpu_items=2 * g.gpu_items)
    one = fitted_host_model([g], PYTORCH, None, [gpt2_parts["launches"]])
    both = fitted_host_model([two], PYTORCH, None, [gpt2_parts["launches"]])
    assert both.kernel_s == pytest.approx(one.kernel_s, rel=1e-12)
    assert g.steps == 1  # the bundled traces hold one step, no ProfilerStep annotation
    # a trace without the model's count (None) spreads over its own kernels, every step's
    assert fitted_host_model([two], PYTORCH, None, [None]).kernel_s == pytest.approx(g.issue_s / g.kernels / PROFILER_CPU_SLOWDOWN, rel=1e-12)
