"""The training stack, precision mode and attention kernel: choices, defaults, the flags that set
them on every command, and where they are shown."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dml2comm.errors import ConfigError
from dml2comm.parallel.config import AttentionKernel, ParallelConfig, Precision, Stack
from dml2comm.search.report import parse_config_spec
from dml2comm.search.reproduce import Hardware, analysis_argv

ROOT = Path(__file__).resolve().parent.parent
MODEL = str(ROOT / "examples" / "gpt2-small.onnx")


def test_defaults_follow_the_stack_and_explicit_choices_win():
    c = ParallelConfig()
    assert (c.stack, c.precision, c.attention) == (Stack.MEGATRON, Precision.MIXED, AttentionKernel.UNFUSED)
    c = ParallelConfig(stack="pytorch")
    assert (c.stack, c.precision, c.attention) == (Stack.PYTORCH, Precision.AMP, AttentionKernel.FLASH)
    c = ParallelConfig(stack="megatron", attention="flash", precision="bf16")
    assert (c.precision, c.attention) == (Precision.BF16, AttentionKernel.FLASH)
    assert c.to_dict()["stack"] == "megatron" and c.to_dict()["attention"] == "flash"
    assert c.stack_text() == "megatron stack, bf16 precision, flash attention"


@pytest.mark.parametrize("kwargs, message", [
    ({"stack": "deepspeed"}, "unknown --stack 'deepspeed'; choose one of megatron, pytorch"),
    ({"precision": "fp8"}, "unknown --precision 'fp8'; choose one of mixed, amp, bf16"),
    ({"attention": "sparse"}, "unknown --attention 'sparse'; choose one of flash, unfused"),
    ({"precision": "bf16", "dtype": "fp16"}, "--precision bf16 holds the whole model in bf16 but --dtype is fp16"),
])
def test_bad_choices_are_refused(kwargs, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ParallelConfig(**kwargs)


def test_compare_specs_and_reproduced_commands_carry_the_stack():
    config = parse_config_spec("d=2,t=2", 8, 1024, stack={"stack": "pytorch", "precision": "bf16"})
    assert (config.stack, config.precision, config.attention) == (Stack.PYTORCH, Precision.BF16, AttentionKernel.FLASH)
    argv = analysis_argv(MODEL, config.to_dict(), Hardware(None, "dgx-h100", 8, None, "pytorch"), "out/x")
    # the stack, and only what differs from its defaults (flash attention and the pytorch host model are its own)
    assert argv[argv.index("--stack") + 1] == "pytorch" and argv[argv.index("--precision") + 1] == "bf16"
    assert "--attention" not in argv and "--host-model" not in argv
    argv = analysis_argv(MODEL, ParallelConfig().to_dict(), Hardware(None, "dgx-h100", 8, None, "eager"), "out/x")
    assert not {"--stack", "--precision", "--attention", "--host-model"} & set(argv)


def test_every_command_takes_the_flags_and_shows_the_stack(tmp_path):
    run = subprocess.run([sys.executable, "main.py", MODEL, "--stack", "pytorch", "--precision", "bf16", "--no-site",
                          "--no-advice", "--out", str(tmp_path / "a")], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "pytorch stack, bf16 precision, flash attention" in " ".join(run.stdout.split())
    config = json.loads((tmp_path / "a" / "data.json").read_text())["config"]
    assert (config["stack"], config["precision"], config["attention"]) == ("pytorch", "bf16", "flash")
    run = subprocess.run([sys.executable, "main.py", "compare", MODEL, "--global-batch-size", "8", "--configs", "d=2",
                          "--stack", "pytorch", "--no-site", "--out", str(tmp_path / "c")], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "training stack: pytorch, amp precision, flash attention" in " ".join(run.stdout.split())
    run = subprocess.run([sys.executable, "main.py", MODEL, "--precision", "bf16", "--dtype", "fp16", "--no-site",
                          "--out", str(tmp_path / "bad")], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 2 and run.stderr.startswith("error: --precision bf16") and not (tmp_path / "bad").exists()


def test_eager_accumulate_grad_by_precision():
    from dml2comm.cost.compute import eager_accumulate_grad_s

    hbm = 1e12
    # one micro-batch: the fresh gradient is stolen, no pass
    assert eager_accumulate_grad_s(100.0, "amp", 1, hbm) == 0.0
    assert eager_accumulate_grad_s(100.0, "bf16", 1, hbm) == 0.0
    # amp, four micro-batches: AccumulateGrad adds fp32 gradients from the second one on (3 x 4 B, 3/4 of the time)
    assert eager_accumulate_grad_s(100.0, "amp", 4, hbm) == pytest.approx(0.75 * 100 * 12 / hbm)
    assert eager_accumulate_grad_s(100.0, "bf16", 2, hbm) == pytest.approx(0.5 * 100 * 6 / hbm)
    # mixed: 16-bit gradients into fp32 main gradients (read 2 + 4, write 4)
    assert eager_accumulate_grad_s(100.0, "mixed", 2, hbm) == pytest.approx(0.5 * 100 * 10 / hbm)


def test_the_stack_keys_the_stage_table_and_changes_the_step():
    """Two stacks of one model on one evaluator do not share a cached stage table."""
    from dml2comm import zoo
    from dml2comm.hardware.cluster import get_cluster
    from dml2comm.ir.onnx_import import ImportOptions
    from dml2comm.load import load_model_proto
    from dml2comm.model import FastEvaluator

    imported = load_model_proto(zoo.build_gpt(layers=2, hidden=256, heads=4, vocab=1024, seq_len=128), ImportOptions(batch_size=4))
    evaluator = FastEvaluator(imported, get_cluster("dgx-h100", 1))
    rows = evaluator.evaluate([ParallelConfig(micro_batch_size=4, global_batch_size=4, seq_len=128, **kw)
                               for kw in ({}, {"stack": "pytorch", "precision": "amp"}, {"stack": "pytorch", "precision": "bf16"})])
    times = [r["iteration_time_s"] for r in rows]
    assert len(set(times)) == 3, times


def test_amp_gradients_are_fp32_and_round_trip_through_data_json():
    from dml2comm.search.sweep import config_from_dict

    amp = ParallelConfig(dp_size=2, global_batch_size=2, stack="pytorch", precision="amp")
    assert amp.grad_bytes == 4 and amp.to_dict()["grad_reduce_dtype"] == "fp32"
    assert config_from_dict(amp.to_dict()) == amp
    bf16 = ParallelConfig(dp_size=2, global_batch_size=2, stack="pytorch", precision="bf16")
    assert bf16.grad_bytes == 2 and config_from_dict(bf16.to_dict()) == bf16
    assert ParallelConfig(precision="amp", grad_reduce_dtype="bf16").grad_bytes == 2  # the flag still wins


def test_autocast_casts_each_products_fp32_inputs_and_promoted_gradients():
    """Under --precision amp a matrix product reading an fp32 activation (a LayerNorm's output)
    pays a cast forward (4 + 2 bytes per element) of it, its weight and its bias, and each
    gradient's cast back (2 + 4, at the widening rate); an fp32 op reading a 16-bit activation
    casts its gradient back; pure bf16 has none."""
    from dml2comm.cost.compute import hbm_efficiency_of
    from dml2comm.cost.host import NONE
    from dml2comm.cost.ops import WIDENING_CAST_SHARE, shard_op_costs
    from dml2comm.hardware.cluster import get_cluster
    from dml2comm.ir.onnx_import import ImportOptions
    from dml2comm.load import load_model

    imported = load_model(str(ROOT / "tests" / "fixtures" / "gpt2_dynamo.onnx"), ImportOptions(batch_size=2, seq_len=32))
    graph, gpu = imported.graph, get_cluster("dgx-h100", 1).gpu
    costs = {p: shard_op_costs(graph, 1, False, "bf16", gpu, False, NONE, "pytorch", "flash", p) for p in ("bf16", "amp")}
    hbm = gpu.hbm_bytes_per_s * hbm_efficiency_of(gpu)
    amp, bf16 = costs["amp"], costs["bf16"]

    def extra(op):
        (f16, b16), (fa, ba) = bf16.times[op.index], amp.times[op.index]
        return fa - f16, ba - b16

    # the first block's QKV projection reads ln_1's output (through a view): fp32 under autocast;
    # it casts that copy, its weight and its bias (addmm), each forward and back in backward
    proj = next(op for op in graph.ops if op.op_type == "Gemm")
    cast = sum(graph.tensors[n].numel for n in proj.inputs[:3]) * 6 / hbm
    # the forward casts narrow (vectorized), the backward ones widen (PyTorch's unrolled copy)
    assert extra(proj) == pytest.approx((cast, cast / WIDENING_CAST_SHARE), rel=1e-9)
    assert amp.costs[proj.index].rule.endswith("autocast casts")
    # the residual add after the attention projection: the projection's 16-bit output plus the fp32
    # stream runs in fp32 (no forward cast), and autograd casts the fp32 gradient back to 16 bits
    residual = next(op for op in graph.ops if op.op_type == "Add" and op.index > proj.index
                    and not any(graph.tensors[n].is_weight for n in op.inputs if n in graph.tensors)
                    and any(graph.ops[graph.producer(n)].op_type == "Reshape" for n in op.inputs if graph.producer(n) is not None))
    numel = graph.tensors[residual.outputs[0]].numel
    assert extra(residual)[1] == pytest.approx(numel * 6 / hbm, rel=1e-9)
    assert not any(c.rule.endswith("autocast casts") for c in bf16.costs)


def test_autocast_cast_kernels_match_the_gpt2_amp_trace():
    """GPT-2 small's AMP step on an H100 runs 340 cast kernels more than its bf16 step
    (``bfloat16_copy`` 194, ``direct_copy`` 146: benchmarks/data/gpu_steps/, 2026-11-28 traces):
    per block 12 forward (8 weights and biases, 3 inputs of products, GELU's ``pow``) and 16
    backward (those 12 back and 4 gradients of 16-bit operands of fp32 ops); the LM head's weight
    and input add 2 and 2.  The block count is exact on the fixture's blocks."""
    from dml2comm.cost.cache import autocast_dtypes_of, tensor_parallel_of
    from dml2comm.cost.host import NONE
    from dml2comm.cost.ops import autocast_cast_costs, shard_op_costs
    from dml2comm.hardware.cluster import get_cluster
    from dml2comm.ir.graph import DType
    from dml2comm.ir.onnx_import import ImportOptions
    from dml2comm.load import load_model

    graph = load_model(str(ROOT / "tests" / "fixtures" / "gpt2_dynamo.onnx"), ImportOptions(batch_size=2, seq_len=32)).graph
    amp = autocast_dtypes_of(graph, DType.BFLOAT16, True)
    tp = tensor_parallel_of(graph, 1, False, 2)
    is_gemm = [op.op_type in ("Gemm", "MatMul") for op in graph.ops]
    zero = [(0.0, 0.0)] * len(graph.ops)
    costs = shard_op_costs(graph, 1, False, "bf16", get_cluster("dgx-h100", 1).gpu, False, NONE, "pytorch", "flash", "bf16").costs
    _, _, kernels = autocast_cast_costs(graph, tp, amp, is_gemm, costs, zero, 1e12)
    blocks = sum(1 for op in graph.ops if op.op_type == "LayerNormalization") // 2
    assert sum(k[0] for k in kernels) == 12 * blocks + 2
    assert sum(k[1] for k in kernels) == 16 * blocks + 2


def test_the_compute_line_names_where_each_gpus_factor_comes_from():
    from dml2comm.cost.gemm import sustained_source
    from dml2comm.hardware.cluster import get_cluster

    assert "measured under PyTorch/cuBLAS on an H100" in sustained_source(get_cluster("dgx-h100", 1).gpu)
    assert "Narayanan" in sustained_source(get_cluster("dgx-a100", 1).gpu)
    assert sustained_source(get_cluster("dgx-v100", 1).gpu).startswith("no fit for this GPU")


def test_the_sweeps_fast_path_equals_the_analysis_under_eager_pytorch():
    """Eager PyTorch's host queue carries the CPU's lead across blocks, so the fast path's
    collapsed model does not hold there: it takes the whole graph and gives the analysis's number
    (it gave 31.65 ms against 38.01 ms on GPT-2 small at d=8, b=2)."""
    from dml2comm.analysis import analyze_graph
    from dml2comm.hardware.cluster import get_cluster
    from dml2comm.ir.onnx_import import ImportOptions
    from dml2comm.load import load_model
    from dml2comm.model import FastEvaluator

    imported = load_model(str(ROOT / "dml2comm" / "validate" / "data" / "models" / "step_gpt2_small_dynamo.onnx"),
                          ImportOptions(batch_size=2, seq_len=512))
    cluster = get_cluster("dgx-h100", 8)
    config = ParallelConfig(dp_size=8, micro_batch_size=2, global_batch_size=16, seq_len=512, stack="pytorch")
    a = analyze_graph(imported, config, cluster, advise=False, timeline=False).summary
    row = FastEvaluator(imported, cluster).evaluate([config])[0]
    assert row["iteration_time_s"] == pytest.approx(a["iteration_time_s"], rel=1e-9)
    # the band, ranked by the GPU's wait for the CPU, is the analysis's too
    assert (row["expected_error"], row["expected_error_source"]) == (a["expected_error"], a["expected_error_source"])
    assert "GPU waiting for the CPU" in a["expected_error_source"]


def test_the_band_of_an_eager_step_follows_its_gpus_wait_for_the_cpu():
    """GPT-2 small on one H100 under --stack pytorch: at b = 2 the GPU waits for the CPU most of
    the step (host-bound), at b = 16 little of it; the band of each comes from the measured steps
    bound alike, so the host-bound one's is wider.  Megatron's host model states no wait."""
    from dml2comm.analysis import analyze_graph
    from dml2comm.cost.bands import host_wait_share
    from dml2comm.cost.stages import StageCoster
    from dml2comm.hardware.cluster import get_cluster
    from dml2comm.ir.onnx_import import ImportOptions
    from dml2comm.load import load_model

    path = str(ROOT / "dml2comm" / "validate" / "data" / "models" / "step_gpt2_small_dynamo.onnx")
    cluster = get_cluster("dgx-h100", 1)
    shares, bands = {}, {}
    for b in (2, 16):
        imported = load_model(path, ImportOptions(batch_size=b, seq_len=1024))
        config = ParallelConfig(micro_batch_size=b, global_batch_size=b, seq_len=1024, stack="pytorch", precision="bf16")
        s = analyze_graph(imported, config, cluster, advise=False, timeline=False).summary
        shares[b] = host_wait_share(StageCoster(imported, cluster, collapse=False), config, s["iteration_time_s"])
        bands[b] = s["expected_error"]
    assert shares[2] > 0.4 > 0.1 > shares[16] > 0
    assert bands[2] > bands[16]
    megatron = ParallelConfig(micro_batch_size=2, global_batch_size=2, seq_len=1024)
    imported = load_model(path, ImportOptions(batch_size=2, seq_len=1024))
    assert host_wait_share(StageCoster(imported, cluster, collapse=False), megatron, 1.0) is None


def test_a_tied_embeddings_gradient_sum_is_charged_on_the_stage_holding_both_readers():
    """Autograd sums the LM head's and the embedding's gradients of a tied table in one stage
    (InputBuffer::add: read 2, write 1), under eager PyTorch and under Megatron without
    gradient-accumulation fusion; across stages the embedding all-reduce does it instead."""
    from dml2comm import zoo
    from dml2comm.cost.compute import hbm_efficiency_of
    from dml2comm.cost.stages import StageCoster
    from dml2comm.hardware.cluster import get_cluster
    from dml2comm.ir.onnx_import import ImportOptions
    from dml2comm.load import load_model_proto

    vocab, hidden = 4096, 256
    imported = load_model_proto(zoo.build_gpt(layers=2, hidden=hidden, heads=4, vocab=vocab, seq_len=128, tied_embeddings=True),
                                ImportOptions(batch_size=1))
    cluster = get_cluster("dgx-h100", 2)
    hbm = cluster.gpu.hbm_bytes_per_s * hbm_efficiency_of(cluster.gpu)
    coster = StageCoster(imported, cluster, collapse=False)

    def accumulate(p: int, **kw):
        config = ParallelConfig(pp_size=p, micro_batch_size=1, global_batch_size=1, seq_len=128, **kw)
        table = coster.stage_table(config)
        return table.copies.summed_local, table.accumulate

    summed, acc = accumulate(1, stack="pytorch", precision="bf16")
    assert summed == (vocab * hidden,) and acc[0] == pytest.approx(3 * vocab * hidden * 2 / hbm)  # one micro-batch: nothing else
    summed, acc = accumulate(1, stack="pytorch", precision="amp")
    assert acc[0] == pytest.approx(3 * vocab * hidden * 4 / hbm)  # fp32 gradients summed (the casts' backward is the ops')
    assert accumulate(2, stack="pytorch", precision="bf16")[0] == (0.0, 0.0)  # the embedding group all-reduces
    fused = accumulate(1, stack="megatron")[1][0]
    unfused = accumulate(1, stack="megatron", grad_accumulation_fusion=False)[1][0]
    assert fused < unfused  # with fusion the head's GEMM adds into main_grad: no sum
