"""Host-side overhead model (dml2comm.cost.host) and its per-op landing in dml2comm.cost.ops."""

from __future__ import annotations

import dataclasses

import pytest

from dml2comm import zoo
from dml2comm.cost import host
from dml2comm.cost.ops import op_kernel_counts, shard_op_costs
from dml2comm.errors import ConfigError
from dml2comm.hardware.cluster import get_cluster
from dml2comm.ir.onnx_import import ImportOptions
from dml2comm.load import load_model_proto


def test_window_spreads_host_excess_over_kernels():
    # one window: a GEMM of 100 us, three point-wise kernels of 2 us; GPU 106 us
    times = [(100e-6, 0.0), (2e-6, 0.0), (2e-6, 0.0), (2e-6, 0.0)]
    kernels = [(1, 0), (1, 0), (1, 0), (1, 0)]
    gemm = [True, False, False, False]
    # kernel_s 10 us: host 40 us < 106 us -> unchanged
    assert host.host_bound_times(times, kernels, gemm, host.HostModel("t", kernel_s=10e-6))[0] == times
    # kernel_s 50 us: host 200 us, excess 94 us, a quarter per kernel: 123.5, 25.5, 25.5, 25.5
    out = host.host_bound_times(times, kernels, gemm, host.HostModel("t", kernel_s=50e-6))[0]
    assert [f for f, _ in out] == pytest.approx([123.5e-6, 25.5e-6, 25.5e-6, 25.5e-6], rel=1e-12)
    assert sum(f for f, _ in out) == pytest.approx(200e-6, rel=1e-12)


def test_backward_windows_run_in_reverse_order():
    # ops: 0 point-wise, 1 GEMM, 2 point-wise.  Backward runs 2, 1, 0: windows [2] and [1, 0].
    times = [(0.0, 1e-6), (0.0, 30e-6), (0.0, 1e-6)]
    kernels = [(0, 1), (0, 2), (0, 1)]
    out = host.host_bound_times(times, kernels, [False, True, False], host.HostModel("t", kernel_s=20e-6))[0]
    # window [2]: host 20 > 1 -> 20 us; window [1, 0]: host 3 x 20 = 60 > 31, excess 29 split 2:1
    assert [b for _, b in out] == pytest.approx([1e-6 + 29e-6 / 3, 30e-6 + 2 * 29e-6 / 3, 20e-6], rel=1e-12)


def test_kernel_counts_views_gemms_and_regions():
    # op 0 view (no work), 1 GEMM, 2-3 a fused region, 4 a lone op without backward
    work = [(False, False), (True, True), (True, True), (True, False), (True, False)]
    gemm = [False, True, False, False, False]
    counts = host.kernel_counts(work, gemm, {2: 7, 3: 7, 4: 9})
    assert counts == [(0, 0), (1, 2), (1, 1), (0, 0), (1, 0)]


def test_presets_and_bad_values():
    assert host.host_model("Eager") is host.EAGER
    assert host.host_model("none").kernel_s == 0.0 and not host.NONE.active
    with pytest.raises(ConfigError, match="unknown host model 'cuda'; use one of eager, pytorch, none"):
        host.host_model("cuda")
    with pytest.raises(ConfigError, match="kernel_s must be a number >= 0"):
        host.HostModel("bad", kernel_s=-1.0)


def test_stage_level_terms():
    m = host.HostModel("t", kernel_s=0.0, collective_call_s=30e-6, micro_batch_s=1e-3, iteration_s=5e-3)
    assert host.collective_call_s(10e-6, m) == 30e-6 and host.collective_call_s(50e-6, m) == 50e-6
    assert host.micro_batch_overhead_s(m, 8, 4) == pytest.approx(11e-3)  # (8 + 4 - 1) slots x 1 ms
    assert host.iteration_overhead_s(m) == 5e-3
    with pytest.raises(ConfigError):
        host.micro_batch_overhead_s(m, 0, 1)


def _gpt(hidden: int, batch: int, heads: int = 4, seq_len: int = 128):
    model = zoo.build_gpt(layers=2, hidden=hidden, heads=heads, vocab=512, seq_len=seq_len)
    return load_model_proto(model, ImportOptions(batch_size=batch)).graph


def test_small_model_is_host_bound_and_none_is_kernel_time():
    graph = _gpt(64, 1)
    gpu = get_cluster("dgx-a100", 8).gpu
    plain = shard_op_costs(graph, 1, False, "fp16", gpu, False, host.NONE)
    eager = shard_op_costs(graph, 1, False, "fp16", gpu, False, host.EAGER)
    assert all(e[0] >= p[0] and e[1] >= p[1] for e, p in zip(eager.times, plain.times))
    # 4 heads x micro-batch 1 = 4 attention batches at sk = 128: Megatron's fused softmax needs a
    # multiple of 8 there (cost.ops.softmax_kernel_available), so scale, mask and softmax run apart
    from dml2comm.cost.cache import tensor_parallel_of
    from dml2comm.cost.ops import unfused_softmax_ops
    from dml2comm.ir.graph import DType

    unfused = unfused_softmax_ops(graph, tensor_parallel_of(graph, 1, False, 2), DType.FLOAT16)
    assert unfused
    gemm = [op.op_type == "MatMul" for op in graph.ops]
    kernels = op_kernel_counts(graph, plain.costs, gemm, unfused, fp32_casts=True)
    # with 16-bit training the unfused softmax runs in fp32 (Megatron's softmax_in_fp32): two
    # cast kernels per pass more on each Softmax, nothing more elsewhere
    base = op_kernel_counts(graph, plain.costs, gemm, unfused)
    extra = [(k[0] - b[0], k[1] - b[1]) for k, b in zip(kernels, base)]
    softmax = {i for i in unfused if graph.ops[i].op_type == "Softmax"}
    assert softmax and all(extra[i] == ((2, 2) if i in softmax else (0, 0)) for i in range(len(extra)))
    # every kernel is tiny on an A100 here: the passes take kernel_s per kernel
    fwd = sum(f for f, _ in eager.times)
    assert fwd == pytest.approx(host.EAGER.kernel_s * sum(k for k, _ in kernels), rel=1e-9)
    assert sum(f for f, _ in plain.times) < 0.2 * fwd


def test_large_gemms_hide_host_time():
    # GPT-3-like layer shapes (h 4096, s 1024, b 4): each layer GEMM ~0.5 ms on an A100, the CPU
    # stays ahead; the few host-bound windows (embedding ops before the first GEMM) add 0.19%
    graph = _gpt(4096, 4, heads=32, seq_len=1024)
    gpu = get_cluster("dgx-a100", 8).gpu
    plain = shard_op_costs(graph, 1, False, "fp16", gpu, False, host.NONE)
    eager = shard_op_costs(graph, 1, False, "fp16", gpu, False)  # default: eager
    total = lambda t: sum(f + b for f, b in t)  # noqa: E731
    assert total(eager.times) == pytest.approx(total(plain.times), rel=3e-3)
    assert total(eager.times) > total(plain.times)
    assert dataclasses.replace(host.EAGER) == host.DEFAULT


def test_the_cluster_names_its_host_model_and_both_paths_read_it(tmp_path):
    """``--host-model none`` (Cluster.host_model) reaches the analysis and the sweep's evaluator
    alike, is recorded in data.json's cluster block, and a small model is faster without the
    per-kernel floor; an unknown name is one line."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from dml2comm.analysis import analyze_graph
    from dml2comm.hardware.cluster import make_cluster
    from dml2comm.parallel.config import ParallelConfig
    from dml2comm.model import FastEvaluator

    imported = load_model_proto(zoo.build_gpt(layers=2, hidden=64, heads=4, vocab=512, seq_len=128), ImportOptions(batch_size=1))
    config = ParallelConfig(pp_size=2, micro_batch_size=1, global_batch_size=4, seq_len=128)
    times = {}
    for name in ("eager", "none"):
        cluster = dataclasses.replace(make_cluster("a100", 2, 2), host_model=name)
        a = analyze_graph(imported, config, cluster, advise=False, timeline=False)
        row = FastEvaluator(imported, cluster).evaluate([config])[0]
        assert row["iteration_time_s"] == pytest.approx(a.summary["iteration_time_s"], rel=1e-9)
        assert any(w.startswith(f"host: {name}") for w in a.assumptions)
        times[name] = a.summary["iteration_time_s"]
    assert times["none"] < times["eager"]
    with pytest.raises(ConfigError, match="unknown host model 'lazy'"):
        analyze_graph(imported, config, dataclasses.replace(make_cluster("a100", 2, 2), host_model="lazy"), advise=False)
    root = Path(__file__).resolve().parent.parent
    out = tmp_path / "o"
    run = subprocess.run([sys.executable, "main.py", str(root / "examples" / "gpt2-small.onnx"), "--host-model", "none", "--no-site",
                          "--out", str(out)], cwd=root, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert json.loads((out / "data.json").read_text())["cluster"]["network"]["host_model"] == "none"


def test_unfused_softmax_casts_cost_their_bytes(monkeypatch):
    """The fp32 casts around an unfused attention softmax move 12 bytes per score element in each
    pass (cost.ops.SOFTMAX_CAST_BYTES), on the Softmax op, at the memory-bound efficiency."""
    from dml2comm.cost import ops
    from dml2comm.cost.cache import tensor_parallel_of
    from dml2comm.cost.compute import HBM_EFFICIENCY
    from dml2comm.ir.graph import DType

    graph = _gpt(64, 1)
    gpu = get_cluster("dgx-a100", 8).gpu
    unfused = ops.unfused_softmax_ops(graph, tensor_parallel_of(graph, 1, False, 2), DType.FLOAT16)
    with_casts = shard_op_costs(graph, 1, False, "fp16", gpu, False, host.NONE).times
    monkeypatch.setattr(ops, "SOFTMAX_CAST_BYTES", 0)
    without = shard_op_costs(_gpt(64, 1), 1, False, "fp16", gpu, False, host.NONE).times  # a fresh graph: no cached costs
    for i, op in enumerate(graph.ops):
        diff = (with_casts[i][0] - without[i][0], with_casts[i][1] - without[i][1])
        if i in unfused and op.op_type == "Softmax":
            want = graph.tensors[op.outputs[0]].numel * 12 / (gpu.hbm_bytes_per_s * HBM_EFFICIENCY)
            assert diff == pytest.approx((want, want), rel=1e-9)
        else:
            assert diff == (0.0, 0.0)


def test_run_ahead_queue_carries_the_cpus_lead_and_adds_the_gpu_gap():
    # kernel_s 10 us, four one-kernel ops of 2, 2, 100 and 2 us: issued at 10, 20, 30, 40 us,
    # ending at 12, 22, 130 and 132 us (module docstring's example)
    times = [(2e-6, 0.0), (2e-6, 0.0), (100e-6, 0.0), (2e-6, 0.0)]
    kernels = [(1, 0)] * 4
    out = host.queue_times(times, kernels, 10e-6)
    assert [f for f, _ in out] == pytest.approx([12e-6, 10e-6, 108e-6, 2e-6], rel=1e-12)
    # a long backward after a short forward: the first backward kernel waits for its launch
    # (issued at 30 us, GPU free at 22 us), the second was issued long before the GPU is free
    times = [(2e-6, 500e-6), (2e-6, 500e-6)]
    out = host.queue_times(times, [(1, 1), (1, 1)], 10e-6)
    assert out[1][1] == pytest.approx(508e-6) and out[0][1] == pytest.approx(500e-6)
    # the preset adds its GPU gap to every kernel, before the queue
    m = host.HostModel("q", kernel_s=0.0, gap_s=3e-6, run_ahead=True)
    assert host.host_bound_times([(5e-6, 7e-6)], [(1, 2)], [True], m)[0] == [pytest.approx((8e-6, 13e-6))]


def test_each_stack_runs_its_own_host_model(tmp_path):
    """``--stack pytorch`` picks the measured eager-PyTorch host model, ``--stack megatron`` vTrain's;
    ``--host-model`` still wins; data.json records the one used."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    seen = {}
    for flags in (["--stack", "pytorch"], ["--stack", "megatron"], ["--stack", "pytorch", "--host-model", "none"]):
        out = tmp_path / "_".join(flags).replace("-", "")
        run = subprocess.run([sys.executable, "main.py", str(root / "examples" / "gpt2-small.onnx"), *flags, "--no-site",
                              "--no-advice", "--out", str(out)], cwd=root, capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
        data = json.loads((out / "data.json").read_text())
        seen[" ".join(flags)] = (data["cluster"]["network"]["host_model"], data["config"]["stack"])
    assert seen == {"--stack pytorch": ("pytorch", "pytorch"), "--stack megatron": ("eager", "megatron"),
                    "--stack pytorch --host-model none": ("none", "pytorch")}


def test_a_cluster_without_a_host_model_runs_its_stacks():
    """A preset cluster names no host model ("auto"): the analysis and the sweep's evaluator run
    the stack's (eager PyTorch's for --stack pytorch, vTrain's for Megatron), as the command line
    does."""
    from dml2comm.analysis import analyze_graph
    from dml2comm.hardware.cluster import make_cluster
    from dml2comm.parallel.config import ParallelConfig
    from dml2comm.model import FastEvaluator

    imported = load_model_proto(zoo.build_gpt(layers=2, hidden=64, heads=4, vocab=512, seq_len=128), ImportOptions(batch_size=1))
    auto = make_cluster("h100", 1, 1)
    assert auto.host_model == "auto"
    for stack, name in (("pytorch", "pytorch"), ("megatron", "eager")):
        config = ParallelConfig(micro_batch_size=1, global_batch_size=1, seq_len=128, stack=stack)
        a = analyze_graph(imported, config, auto, advise=False, timeline=False)
        named = analyze_graph(imported, config, dataclasses.replace(auto, host_model=name), advise=False, timeline=False)
        assert a.summary["iteration_time_s"] == named.summary["iteration_time_s"]
        assert any(w.startswith(f"host: {name}") for w in a.assumptions)
        assert FastEvaluator(imported, auto).evaluate([config])[0]["iteration_time_s"] == pytest.approx(a.summary["iteration_time_s"], rel=1e-9)


def test_work_queued_between_the_passes_hides_behind_a_cpu_that_sets_the_pace():
    # ten one-kernel ops of 2 us each way, 10 us of CPU per kernel: the CPU sets the pace.  A
    # 50 us loss kernel between the passes: issued at 110 us, it runs 110-160 while the CPU
    # issues the backward at 120, 130, ...; the GPU catches up and the step ends 2 us after
    # the last issue (210 us), 10 us (the loss's launch) after the step without it, not 50
    times = [(2e-6, 2e-6)] * 10
    kernels = [(1, 1)] * 10
    plain = host.queue_times(times, kernels, 10e-6)
    assert sum(f + b for f, b in plain) == pytest.approx(202e-6)
    out, extra = host.queue_between_times(times, kernels, 10e-6, [(50e-6, 0.0, 1, 0)])
    assert extra == [pytest.approx((58e-6, 0.0))]  # its GPU time from the forward's end (102 us) to 160 us
    assert sum(f + b for f, b in out) + sum(f + b for f, b in extra) == pytest.approx(212e-6)
    # GPU-bound (0.1 us per kernel): the loss adds its whole GPU time
    fast, extra = host.queue_between_times(times, kernels, 0.1e-6, [(50e-6, 0.0, 1, 0)])
    assert sum(f + b for f, b in fast) + extra[0][0] == pytest.approx(40e-6 + 50e-6, rel=0.01)
    # the window rule (a host model that does not run ahead) leaves the loss to its caller
    assert host.host_bound_times(times, kernels, [False] * 10, host.EAGER, [(50e-6, 0.0, 1, 0)])[1] is None


def test_the_loss_runs_in_the_queue_of_an_eager_pytorch_step():
    """GPT-2 small at b = 2 on an H100 (host-bound): the loss the export leaves out is queued
    between the passes, and its time in the step is less than its kernels' GPU time (the GPU,
    waiting for the CPU's launches anyway, runs it while the CPU issues the backward)."""
    from dml2comm.cost.loss import HF_BWD_KERNELS, HF_FWD_KERNELS
    from dml2comm.load import load_model
    from tests.helpers import fixture_path

    imported = load_model(str(fixture_path("step_gpt2_small_dynamo.onnx")), ImportOptions(batch_size=2, seq_len=1024))
    gpu = get_cluster("dgx-h100", 1).gpu
    costs = shard_op_costs(imported.graph, 1, False, "bf16", gpu, False, host.PYTORCH, "pytorch", "flash", "bf16")
    assert len(costs.loss) == 1
    producer, f, b, kernel_f, kernel_b = costs.loss[0]
    assert imported.graph.ops[producer].op_type in ("MatMul", "Gemm")
    assert kernel_f > 0 and kernel_b > 0 and f + b < kernel_f + kernel_b + (HF_FWD_KERNELS + HF_BWD_KERNELS) * host.PYTORCH.gap_s
    # the window rule's host models time the loss in the stage tables instead
    assert shard_op_costs(imported.graph, 1, False, "bf16", gpu, False, host.EAGER, "pytorch", "flash", "bf16").loss == ()


@pytest.mark.parametrize("b, launches", [(2, 2), (8, 31)])
def test_an_embeddings_backward_launches_its_direct_or_sorted_path(b, launches):
    """PyTorch's embedding backward sorts the indices above 3,072 of them (Embedding.cu): the
    bundled H100 traces of GPT-2 small launch 2 kernels in ``aten::embedding_dense_backward`` at
    b = 2 (2,048 token ids) and 21 kernels and 10 memsets at b = 8 (8,192); its position table
    (1,024 ids) takes the direct path at both.  The tool counts the same."""
    import numpy as np

    from dml2comm.cost.ops import EMBEDDING_BACKWARD_LAUNCHES, eager_embedding_kernels
    from dml2comm.load import load_model
    from dml2comm.traces.classify import launch_rows
    from dml2comm.traces.load import Kind, load_trace
    from tests.helpers import fixture_path

    path = f"benchmarks/data/gpu_steps/h100_trace_gpt2-small_bf16_b{b}_s1024.json.gz"
    trace = load_trace(str(__import__("pathlib").Path(__file__).resolve().parent.parent / path))
    gpu = np.nonzero(np.isin(trace.kind, Kind.GPU))[0]
    launch = launch_rows(trace, gpu)
    issued = np.where(launch >= 0, trace.ts[np.maximum(launch, 0)], np.nan)
    counts = []
    for i in np.nonzero(trace.kind == Kind.CPU_OP)[0]:
        if trace.names[trace.name[i]] == "aten::embedding_dense_backward":
            counts.append(int(np.count_nonzero((issued >= trace.ts[i]) & (issued <= trace.ts[i] + trace.dur[i]))))
    assert sorted(counts) == sorted([EMBEDDING_BACKWARD_LAUNCHES[0], launches])
    imported = load_model(str(fixture_path("step_gpt2_small_dynamo.onnx")), ImportOptions(batch_size=b, seq_len=1024))
    costs = shard_op_costs(imported.graph, 1, False, "bf16", get_cluster("dgx-h100", 1).gpu, False, host.NONE, "pytorch", "flash", "bf16").costs
    extra = eager_embedding_kernels(imported.graph, costs)
    # one backward kernel the op rule counts, plus these
    assert sorted(1 + bw for _, bw in extra.values()) == sorted(counts)


def test_the_backward_pass_can_run_its_own_cpu_time_per_kernel():
    # two one-kernel ops of 2 us each way; 10 us of CPU per forward kernel, 30 per backward one:
    # the forward's kernels are issued at 10 and 20 us (ending 12, 22), the backward's at 50 and
    # 80 (ending 52, 82): the backward's launches set its pace
    times, kernels = [(2e-6, 2e-6)] * 2, [(1, 1)] * 2
    out = host.queue_times(times, kernels, 10e-6)
    assert sum(f + b for f, b in out) == pytest.approx(42e-6)
    split, _ = host.queue_between_times(times, kernels, 10e-6, (), 30e-6)
    assert [f for f, _ in split] == pytest.approx([12e-6, 10e-6]) and sum(b for _, b in split) == pytest.approx(60e-6)
    # the same through a host model, with the window rule too (each window at its pass's rate)
    queued = host.HostModel("q", kernel_s=10e-6, run_ahead=True, backward_kernel_s=30e-6)
    assert host.host_bound_times(times, kernels, [True, True], queued)[0] == split
    windows = host.HostModel("w", kernel_s=10e-6, backward_kernel_s=30e-6)
    assert host.host_bound_times(times, kernels, [True, True], windows)[0] == [pytest.approx((10e-6, 30e-6))] * 2
    # the CPU factor scales both passes; None keeps one time for both
    assert queued.with_cpu_factor(0.5).backward_s == pytest.approx(15e-6) and queued.with_cpu_factor(0.5).kernel_s == pytest.approx(5e-6)
    assert host.PYTORCH.backward_s == host.PYTORCH.kernel_s and host.PYTORCH.with_cpu_factor(2.0).backward_kernel_s is None
    with pytest.raises(ConfigError):
        host.HostModel("bad", kernel_s=1e-6, backward_kernel_s=-1e-6)


def test_a_filled_queue_shares_the_launch_time_by_the_traces_launches():
    from dml2comm.traces.host import HostFigures, fitted_host_model

    def figures(full: int, passes: tuple[int, int] | None) -> HostFigures:
        return HostFigures(kernels=900, gpu_items=1000, gpu_busy_s=0.1, gpu_span_s=0.1, cpu_span_s=0.05, issue_s=0.03,
                           kernel_s=0.03 / 900, queued_gaps=10, gap_s=1e-6, starved_idle_s=0.0, full_queue_launches=full,
                           pass_launches=passes)

    # 300 of the trace's 900 pass launches forward, 400 of the model's 1,000 kernels: the forward
    # gets a third of the 30 ms over its 400 kernels, the backward the rest over its 600
    fitted = fitted_host_model([figures(200, (300, 600))], host.PYTORCH, 1.0, [1000], [400])
    assert fitted.kernel_s == pytest.approx(0.01 / 400) and fitted.backward_s == pytest.approx(0.02 / 600)
    assert fitted.kernel_s * 400 + fitted.backward_s * 600 == pytest.approx(0.03)
    # a queue that never filled, a trace whose passes share a thread, no model counts: one time
    for fig, forward in ((figures(0, (300, 600)), [400]), (figures(200, None), [400]), (figures(200, (300, 600)), None)):
        one = fitted_host_model([fig], host.PYTORCH, 1.0, [1000], forward)
        assert one.backward_kernel_s is None and one.kernel_s == pytest.approx(0.03 / 1000)
