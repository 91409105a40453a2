"""A profiled trace of several steps (``schedule(active=N)``: one ``ProfilerStep#N`` annotation
each) is joined step by step and read as its mean step; and the ``trace`` command's prediction
takes the GPU, stack and precision the profiled step ran where no flag gives them."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from dml2comm.cli import main
from dml2comm.cost.cache import layers_of
from dml2comm.ir.onnx_import import ImportOptions
from dml2comm.load import load_model
from dml2comm.traces.host import host_figures
from dml2comm.traces.join import join_trace
from dml2comm.traces.load import load_trace
from dml2comm.traces.predict import measured_and_modelled, profile_scale
from tests.h100_steps import GPT2, LLAMA, step_config

#: Ids that must stay unique across the copies of a step.
_IDS = ("External id", "correlation", "Sequence number", "Record function id", "Ev Idx")
#: Idle time between two profiled steps (the training loop's own work and ``prof.step()``), us.
_BETWEEN_US = 2000.0


def _stepped(src: str, dst: Path, slower: tuple[float, ...]) -> None:
    """``src``'s one step repeated ``len(slower)`` times, as a profiler schedule records them: each
    copy later by the step's span and the time between steps, with new ids, inside a
    ``ProfilerStep#N`` annotation on the main thread; the GPU items of copy ``j`` last
    ``slower[j]`` times as long (placed at their original starts)."""
    with gzip.open(src, "rt") as f:
        doc = json.load(f)
    events = doc["traceEvents"]
    timed = [e for e in events if e.get("ph") == "X" and "ts" in e]
    start = min(e["ts"] for e in timed)
    period = max(e["ts"] + e.get("dur", 0.0) for e in timed) - start + _BETWEEN_US
    cpu = next(e for e in timed if e.get("cat") == "cpu_op")
    out = [e for e in events if not (e.get("ph") == "X" and "ts" in e) and e.get("ph") not in ("s", "f")]
    for j, factor in enumerate(slower):
        for e in timed:
            c = json.loads(json.dumps(e))
            c["ts"] += j * period
            if c.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy"):
                c["dur"] *= factor
            for key in _IDS:
                if isinstance(c.get("args", {}).get(key), int) and c["args"][key] > 0:
                    c["args"][key] += j * 10**7
            out.append(c)
        out.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{j + 2}", "pid": cpu["pid"], "tid": cpu["tid"],
                    "ts": start + j * period - 1.0, "dur": period - _BETWEEN_US + 2.0, "args": {"External id": 9 * 10**7 + j}})
    doc["traceEvents"] = out
    dst.write_text(json.dumps(doc))


@pytest.fixture(scope="module")
def layered():
    model, _, b, s, _ = GPT2
    return layers_of(load_model(model, ImportOptions(batch_size=b, seq_len=s)).graph)


def test_several_steps_are_joined_as_their_mean_step(tmp_path, layered):
    trace = GPT2[1]
    three = tmp_path / "three.json"
    _stepped(trace, three, (1.0, 1.2, 1.1))
    one, mean = (join_trace(load_trace(str(p), shapes=True), layered) for p in (trace, three))
    assert (one.steps, mean.steps) == (1, 3) and mean.passes == 1
    assert mean.gpu_s == pytest.approx(1.1 * one.gpu_s, rel=1e-9) and mean.unattributed_s == pytest.approx(0.0, abs=1e-12)
    assert mean.kernels == one.kernels
    for x, y in zip(one.layers, mean.layers, strict=True):
        assert (y.name, y.kind, y.kernels) == (x.name, x.kind, x.kernels)
        assert (y.forward_s, y.backward_s, y.other_s) == pytest.approx((1.1 * x.forward_s, 1.1 * x.backward_s, 1.1 * x.other_s),
                                                                        rel=1e-9)
    assert [i for i, _ in mean.gemms] == [i for i, _ in one.gemms]
    assert mean.block_spread == pytest.approx(one.block_spread, rel=1e-9)
    assert any("3 profiled steps" in n for n in mean.notes)


def test_the_time_between_steps_is_no_host_wait(tmp_path):
    # the loop's own work between two profiled steps leaves the GPU idle; it is not the step
    # waiting for the CPU: per step, the figures of three identical steps are one step's
    trace = GPT2[1]
    three = tmp_path / "three.json"
    _stepped(trace, three, (1.0, 1.0, 1.0))
    one, many = (host_figures(load_trace(str(p))) for p in (trace, three))
    assert many.steps == 3 and many.kernels == 3 * one.kernels
    for field in ("gpu_span_s", "gpu_busy_s", "starved_idle_s", "issue_s"):
        assert getattr(many, field) == pytest.approx(3 * getattr(one, field), rel=1e-6), field
    assert (many.kernel_s, many.gap_s, many.host_bound) == (pytest.approx(one.kernel_s, rel=1e-6), pytest.approx(one.gap_s, rel=1e-6),
                                                            one.host_bound)


def test_each_steps_passes_are_told_apart(tmp_path):
    # the forward's and the backward's launches are counted per profiled step (the optimizer's,
    # after each step's backward, in neither): three copies of Llama-1B's step count three times
    # one step's, and the share that splits the CPU's launch time between the passes is one step's
    three = tmp_path / "three.json"
    _stepped(LLAMA[1], three, (1.0, 1.0, 1.0))
    one, many = (host_figures(load_trace(str(p))) for p in (LLAMA[1], three))
    forward, backward = one.pass_launches
    assert 0.3 < forward / (forward + backward) < 0.35 and one.full_queue_launches > 0
    assert many.pass_launches == (3 * forward, 3 * backward)


def test_a_trace_of_several_steps_predicts_as_one(tmp_path):
    model, trace, b, s, step_s = GPT2
    three = tmp_path / "three.json"
    _stepped(trace, three, (1.0, 1.0, 1.0))
    one, many = (measured_and_modelled(str(p), model, step_config(b, s)) for p in (trace, three))
    for r1, r3 in zip(profile_scale([one]).ratios, profile_scale([many]).ratios, strict=True):
        assert r1[0] == r3[0] and r3[1:] == pytest.approx(r1[1:], rel=1e-9)
    for step in (None, step_s):
        a, c = (profile_scale([p], "pytorch", step) for p in (one, many))
        assert c.host.kernel_s == pytest.approx(a.host.kernel_s, rel=1e-6)
        assert dict(c.detail)["error"]["host_wait_share"] == pytest.approx(dict(a.detail)["error"]["host_wait_share"], rel=1e-6)


def test_the_trace_command_predicts_what_the_step_ran(tmp_path):
    # the bundled GPT-2 step ran eager PyTorch (its fused AdamW), bf16 parameters, on an H100:
    # without --gpu, --stack and --precision the prediction had been Megatron's amp... on an A100,
    # 168% over the step; now it is the step's own, within a few percent
    model, trace, b, s, step_s = GPT2
    out = tmp_path / "out"
    assert main(["trace", trace, "--model", model, "--no-site", "--out", str(out)]) == 0
    comparison = json.loads((out / "trace_analysis.json").read_text())["comparison"]
    assert "pytorch bf16, H100" in comparison["what"] and "the traces' GPU (h100)" in comparison["what"]
    step = next(r for r in comparison["rows"] if r["category"] == "iteration")
    assert abs(step["predicted_s"] / step_s - 1) < 0.05
    # flags win: the Megatron stack and an A100 when asked for
    out2 = tmp_path / "out2"
    assert main(["trace", trace, "--model", model, "--stack", "megatron", "--gpu", "a100", "--no-site", "--out", str(out2)]) == 0
    what = json.loads((out2 / "trace_analysis.json").read_text())["comparison"]["what"]
    assert "megatron" in what and "A100" in what and "the traces' GPU" not in what


def test_the_trace_command_says_when_its_flags_predict_another_shape(tmp_path):
    # --micro-batch-size alone had left the sequence unbound (an error asking for --seq-len, which
    # the trace records), and a given shape other than the traced one compared two workloads silently
    model, trace, b, s, _ = GPT2
    out = tmp_path / "out"
    assert main(["trace", trace, "--model", model, "--micro-batch-size", str(b // 2), "--no-site", "--out", str(out)]) == 0
    what = json.loads((out / "trace_analysis.json").read_text())["comparison"]["what"]
    assert f"b={b // 2} B={b // 2}" in what and f"NOT the traced step's shape, which ran b={b} s={s}" in what
    same = tmp_path / "same"
    assert main(["trace", trace, "--model", model, "--micro-batch-size", str(b), "--no-site", "--out", str(same)]) == 0
    assert "NOT the traced" not in json.loads((same / "trace_analysis.json").read_text())["comparison"]["what"]
