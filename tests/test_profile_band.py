"""--profile's expected error: a band derived from the traces (host wait, block spread, the
join's unattributed time, held-out shapes) and the model's own band for what they did not measure,
and whether it covers the bundled H100 steps."""

from __future__ import annotations

import dataclasses
import math

import pytest

from dml2comm.analysis import analyze_graph
from dml2comm.cost.bands import PROFILE_TIMING_NOISE, expected_error_for, plan_doublings, profile_band
from dml2comm.cost.cache import layers_of
from dml2comm.hardware.cluster import get_cluster
from dml2comm.ir.gemms import shape_doublings
from dml2comm.ir.onnx_import import ImportOptions
from dml2comm.load import load_model
from dml2comm.traces.predict import expected_error_of, held_out_shapes, measured_and_modelled, profile_scale, split_halves

from tests.h100_steps import GPT2, LLAMA, run_profiled, step_config as _config


def _run(tmp_path, case, *extra: str) -> dict:
    return run_profiled(tmp_path, *case[:4], *extra)


@pytest.fixture(scope="module")
def parts():
    return {name: measured_and_modelled(case[1], case[0], _config(case[2], case[3])) for name, case in (("gpt2", GPT2), ("llama", LLAMA))}


# (case, options, the band stated): the measured errors are GPT-2 small -0.2% with the trace's host
# model (its CPU side over the profiler's median slowdown), -0.0% with --step-time, +0.4% with the
# preset pytorch host model, -8.7% with none; Llama-1B -1.0%, -1.0%, +0.5% and -3.2%
# (benchmarks/bench_profile.py)
CASES = [(GPT2, (), 0.216), (GPT2, ("--step-time", "0.0516"), 0.091), (GPT2, ("--host-model", "pytorch"), 0.234),
         (GPT2, ("--host-model", "none"), 0.234), (LLAMA, (), 0.028), (LLAMA, ("--step-time", "0.17999"), 0.028),
         (LLAMA, ("--host-model", "pytorch"), 0.049), (LLAMA, ("--host-model", "none"), 0.049)]


@pytest.mark.parametrize("case,extra,band", CASES, ids=[f"{c[1].rsplit('_', 3)[1]}{''.join(e)}" for c, e, _ in CASES])
def test_the_band_covers_the_bundled_steps(tmp_path, case, extra, band):
    measured = case[4]
    data = _run(tmp_path, case, *extra)
    s, err = data["summary"], data["profile"]["expected_error"]
    error = abs(s["iteration_time_s"] / measured - 1)
    assert error <= s["expected_error"], (error, s["expected_error"])  # the band holds
    assert s["expected_error"] == pytest.approx(band, abs=0.001)
    assert err["components"]["timing"] == PROFILE_TIMING_NOISE  # the measured median's own uncertainty
    # one band: the summary's is data.json's, the sum of its components, named in the source
    assert s["expected_error"] == err["total"] == pytest.approx(sum(err["components"].values()), rel=1e-12)
    assert s["expected_error_source"] == err["source"] and err["source"].startswith(f"from the profile ({case[1].rsplit('/', 1)[1]}): ")
    assert max(err["components"], key=err["components"].get) == "host"
    assert err["doublings"] == 0.0 and err["components"]["shapes"] == 0.0  # the profiled shape itself
    assert err["components"]["communication"] == err["components"]["other_gpu"] == 0.0
    # only the tied embedding's gradient sum is compute no ratio scales (modelled apart: traces.predict)
    assert 0.0 < err["components"]["unscaled"] < 0.0005
    # the trace's host model: the GPU's wait for the CPU; a named one: all of the GPU's idle
    fig = data["profile"]["error"]
    assert err["components"]["host"] == (fig["idle_share"] if "--host-model" in extra else fig["host_wait_share"])
    # without --step-time a host-bound step's CPU side is the trace's over the profiler's median
    # slowdown, and the source says so
    assert ("--step-time measures it" in err["source"]) == (case is GPT2 and not extra)
    # the band is the trace's, not the validated runs' nearest this one
    own, _ = expected_error_for(_config(case[2], case[3]), get_cluster("dgx-h100", 1), data["model"]["params"])
    assert err["model_band"] == own and s["expected_error"] != own


def test_host_component_is_the_gpu_waiting_for_the_cpu(parts):
    g = parts["gpt2"]["host"]
    fig = dict(profile_scale([parts["gpt2"]]).detail)["error"]
    assert fig["host_wait_share"] == pytest.approx(g.starved_idle_s / g.gpu_span_s, rel=1e-12)  # 19.2%: profiled
    timed = dict(profile_scale([parts["gpt2"]], "pytorch", 0.05160).detail)["error"]
    # with --step-time: the timed step less the GPU's busy time and its queued idle (device latency)
    assert timed["host_wait_share"] == pytest.approx((0.05160 - g.gpu_busy_s - g.gap_s * g.queued_gaps) / 0.05160, rel=1e-12)
    assert timed["host_wait_share"] < fig["host_wait_share"]
    assert fig["unattributed_share"] == 0.0 and fig["block_spread"] == pytest.approx(0.0308, abs=1e-4)


def test_held_out_shapes():
    # one ratio for every shape: no held-out error
    same = [((8, 16, 32 * k), 2.0 * k, 1.0 * k) for k in (1, 2, 4, 8)]
    assert held_out_shapes(same)["error"] == pytest.approx(0.0, abs=1e-12)
    # two shapes, ratios 1 and 2: each half predicts the other off by 1 and by 1/2; one doubling apart
    two = [((8, 8, 8), 1.0, 1.0), ((8, 8, 16), 4.0, 2.0)]
    h = held_out_shapes(two)
    assert h["error"] == pytest.approx((1.0 + 0.5) / 2) and h["doublings"] == pytest.approx(1.0)
    assert h["per_doubling"] == pytest.approx(0.75)
    assert held_out_shapes(two[:1])["per_doubling"] == 0.0  # one shape: nothing held out
    assert shape_doublings((768, 768, 8192), (2048, 512, 8192)) == pytest.approx(math.log2(768 / 512) + math.log2(2048 / 768))


def test_the_split_is_calibrations_shape_split():
    # the calibration's held-out rule (split_by_shape at 0.5), without importing it on --profile's path
    from dml2comm.calibrate.fit import split_by_shape

    gemms = [((8, 2 ** k, 2 ** (k % 3)), 1.0, 1.0) for k in range(9)] * 2
    assert split_halves(gemms) == split_by_shape(gemms, lambda g: g[0], 0.5)
    assert split_halves(gemms[:1]) == (gemms[:1], [])


def test_the_bundled_traces_held_out_errors(parts):
    # GPT-2 small: the head's GEMM (N = 50257) runs at another measured / modelled ratio than the
    # blocks', so a ratio carries 7% per doubling of shape (12% before the blocks' GEMMs were
    # timed at their in-step share and their bias gradients by the column-sum law); Llama-1B's
    # shapes agree within 1%
    gpt2 = dict(profile_scale([parts["gpt2"]]).detail)["error"]["held_out"]
    llama = dict(profile_scale([parts["llama"]]).detail)["error"]["held_out"]
    assert gpt2["shapes"] == llama["shapes"] == 4
    assert gpt2["per_doubling"] == pytest.approx(0.070, abs=0.001)
    assert llama["per_doubling"] == pytest.approx(0.0088, abs=0.0005)


def test_the_shape_component_grows_with_the_distance(parts):
    model, _, b, s, _ = GPT2
    fig = dict(profile_scale([parts["gpt2"]]).detail)["error"]
    for mb, want in ((8, 0.0), (16, 1.0), (4, 1.0), (32, 2.0)):
        layered = layers_of(load_model(model, ImportOptions(batch_size=mb, seq_len=s)).graph)
        assert plan_doublings(layered, fig["shapes"]) == pytest.approx(want, abs=1e-9), mb
        assert plan_doublings(layered, fig["shapes"], tp_size=2, cp_size=2) == pytest.approx(want + 2, abs=1e-9)
        # the same sequence: the attention cores are as far as the GEMMs
        assert plan_doublings(layered, fig["shapes"], batch_seqs=fig["batch_seqs"]) == pytest.approx(want, abs=1e-9)
    # the profiled tokens in shorter sequences: the same GEMMs, but not the same attention
    assert fig["batch_seqs"] == [(8, 1024)]
    short = layers_of(load_model(model, ImportOptions(batch_size=32, seq_len=256)).graph)
    assert plan_doublings(short, fig["shapes"]) == pytest.approx(0.0, abs=1e-9)
    assert 0.0 < plan_doublings(short, fig["shapes"], batch_seqs=fig["batch_seqs"]) < 2.0  # log2(1024 / 256) on the cores' FLOPs


def _analysis(case, b: int, scale, gpu: str = "dgx-h100", **kw):
    imported = load_model(case[0], ImportOptions(batch_size=b, seq_len=case[3]))
    cluster = dataclasses.replace(get_cluster(gpu, kw.get("dp_size", 1)), host_model="pytorch", profile_scale=scale)
    config = dataclasses.replace(_config(b, case[3]), **kw, global_batch_size=b * kw.get("dp_size", 1))
    return analyze_graph(imported, config, cluster, advise=False, timeline=False)


def test_gpt2_from_llamas_ratios_is_covered(parts):
    # the command line refuses a trace of another model; through the functions the band takes the
    # distance from Llama's GEMM shapes to GPT-2's.  Against the mean of the four measurements of
    # the GPT-2 step (two machines, validate.steps) the prediction is 1.6% off, inside the band
    # (6.3%, read from Llama's GPU-bound trace: it holds nothing of the pytorch preset host model's
    # own error on GPT-2's host-affected step).  Llama's block ratios are 0.98 / 0.98 (1.09 / 1.05
    # and GPT-2 4.3% off while the model left out Hugging Face's fp32 RMSNorm, which its export
    # does not show and GPT-2's blocks do not run: cost.norm.castless_rms_norms)
    from dml2comm.validate.steps import runs

    measured = next(r["time_s"] for r in runs() if r["name"] == "gpt2-small")
    a = _analysis(GPT2, 8, profile_scale([parts["llama"]]))
    band = expected_error_of(a)
    assert band["doublings"] == pytest.approx(1.56, abs=0.01) and band["components"]["shapes"] > 0
    error = abs(a.summary["iteration_time_s"] / measured - 1)
    assert error == pytest.approx(0.016, abs=0.002) and band["total"] == a.summary["expected_error"] == pytest.approx(0.063, abs=0.002)
    assert error <= band["total"]


def test_what_the_trace_did_not_measure_keeps_the_models_band(parts):
    scale = profile_scale([parts["gpt2"]], "pytorch")
    a = _analysis(GPT2, 8, scale, dp_size=2)  # data parallel: communication the trace did not see
    band = expected_error_of(a)
    s = a.summary
    comm = s["exposed_comm_time_s"] / s["iteration_time_s"]
    assert comm > 0 and band["components"]["communication"] == pytest.approx(band["model_band"] * comm, rel=1e-12)
    # half the compute unscaled: half of the rest takes the model's band
    layered = a.layered
    half = profile_band(a.config, a.cluster, a.graph.num_params, layered, 0.5, s["iteration_time_s"], s["exposed_comm_time_s"])
    assert half["components"]["unscaled"] == pytest.approx(band["model_band"] * 0.5 * (1 - comm), rel=1e-12)
    # on another GPU the ratios carry another GPU's kernels: the scaled compute takes the model's band
    other = expected_error_of(_analysis(GPT2, 8, scale, gpu="dgx-a100"))
    assert other["components"]["other_gpu"] == pytest.approx(other["model_band"] * other["scaled_share_of_iteration"], rel=1e-12)
    assert other["components"]["other_gpu"] > 0


def test_one_profiled_shape_cannot_tell_how_its_ratios_carry(parts):
    # with a single GEMM shape nothing is held out: off the profiled shape the band takes the
    # model's own for the scaled compute, at the profiled shape nothing
    scale = profile_scale([parts["gpt2"]], "pytorch")
    detail = dict(scale.detail)
    fig = dict(detail["error"], held_out={"shapes": 1, "error": 0.0, "doublings": 0.0, "per_doubling": 0.0})
    one = dataclasses.replace(scale, detail=tuple((k, fig if k == "error" else v) for k, v in detail.items()))
    for b, doublings in ((16, 1.0), (8, 0.0)):
        a = _analysis(GPT2, b, one)
        band = expected_error_of(a)
        assert band["doublings"] == doublings
        want = band["model_band"] * band["scaled_share_of_iteration"] if doublings else 0.0
        assert band["components"]["shapes"] == pytest.approx(want, rel=1e-12)
    # two copies of one trace say what one says
    two = dict(profile_scale([parts["gpt2"], parts["gpt2"]]).detail)["error"]
    for k in ("host_wait_share", "idle_share", "block_spread"):
        assert two[k] == pytest.approx(detail["error"][k], rel=1e-12)
    assert two["held_out"] == pytest.approx(detail["error"]["held_out"], rel=1e-12)


def test_the_overview_card_shows_the_traces_band(parts):
    # the site's iteration card names where its band comes from: the profile, not validated runs
    from dml2comm.render.dot import all_drawings
    from dml2comm.render.facts import Facts
    from dml2comm.site.pages import page_models

    a = _analysis(GPT2, 8, profile_scale([parts["gpt2"]], "pytorch", 0.05160))
    facts = Facts.of(a)
    text = repr([pg.context for pg in page_models(facts, all_drawings(facts, 8), 8)])
    band = f"expected error ±{a.summary['expected_error']:.1%} (from the profile (trace_gpt2-small_bf16_b8.json.gz); "
    assert band in text and "nearest validated runs: from the profile" not in text


def test_a_plan_that_waits_longer_for_the_cpu_states_its_own_wait(parts):
    # Llama-1B's H100 trace at b = 4 is GPU-bound (the GPU waited 1.1% of it); the plan at b = 2
    # waits about 4% of its step for the CPU, and its band says so (the measured b = 2 step,
    # 97.97 ms, the mean of two machines' medians, is inside it)
    from dml2comm.cost.bands import PROFILE_HOST_SPREAD

    scale = profile_scale([parts["llama"]], "pytorch")
    trace_wait = dict(scale.detail)["error"]["host_wait_share"]
    same = expected_error_of(_analysis(LLAMA, 4, scale))
    assert same["components"]["host"] == trace_wait  # at the profiled shape: the trace's own
    a = _analysis(LLAMA, 2, scale)
    band = expected_error_of(a)
    wait = a.summary["host_wait_share"]
    assert wait > 3 * trace_wait and band["components"]["host"] == wait
    assert abs(a.summary["iteration_time_s"] / 0.09797 - 1) <= band["total"] == a.summary["expected_error"]
    # a plan the CPU sets almost entirely is as uncertain as the CPU's speed, no more
    gpt2 = profile_scale([parts["gpt2"]], "pytorch")
    small = _analysis(GPT2, 1, gpt2)
    assert small.summary["host_wait_share"] > PROFILE_HOST_SPREAD
    assert expected_error_of(small)["components"]["host"] == PROFILE_HOST_SPREAD


def test_a_plan_that_waits_less_than_the_profiled_step_states_its_own_wait(parts):
    # GPT-2 small's H100 trace at b = 8 is host-bound (its GPU waited about a fifth of the step);
    # at b = 16 the plan's GPU work doubles and it waits a few percent: the CPU's speed, which the
    # profile leaves uncertain, moves that plan only by its own wait (the band was ±30%, mostly the
    # trace's wait, for a step the GPU sets)
    scale = profile_scale([parts["gpt2"]], "pytorch")
    trace_wait = dict(scale.detail)["error"]["host_wait_share"]
    a = _analysis(GPT2, 16, scale)
    band = expected_error_of(a)
    wait = a.summary["host_wait_share"]
    assert trace_wait > 0.15 and wait < trace_wait / 4
    assert band["doublings"] > 0 and band["components"]["host"] == wait
    assert band["total"] < 0.15


def test_the_host_spread_is_the_measured_slowdowns_90_percent_quantile():
    import csv
    import statistics
    from pathlib import Path

    from dml2comm.cost.bands import PROFILE_HOST_SPREAD

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "data" / "gpu_steps" / "profiler_slowdown.csv"
    with path.open() as f:
        s = [float(r["slowdown"]) for r in csv.DictReader(f) if r["full_queue_launches"] == "0"]
    m = statistics.median(s)
    d = sorted(abs(x / m - 1) for x in s)
    assert len(d) == 93 and PROFILE_HOST_SPREAD == round(d[int(0.9 * len(d)) - 1], 2)


def test_a_shorter_sequence_widens_the_band(parts):
    # Llama-1B b = 8 s = 1,024 from the b = 4 s = 2,048 trace: the profiled GEMMs (8,192 tokens),
    # half the attention; measured 178.14 ms (the mean of two machines' medians), predicted 2.0%
    # short, outside a band that counted the GEMMs alone (1.8%)
    scale = profile_scale([parts["llama"]], "pytorch")
    a = _analysis((LLAMA[0], LLAMA[1], 8, 1024, None), 8, scale)
    band = expected_error_of(a)
    assert band["doublings"] > 0 and band["components"]["shapes"] > 0
    assert abs(a.summary["iteration_time_s"] / 0.17814 - 1) <= band["total"] == a.summary["expected_error"]
