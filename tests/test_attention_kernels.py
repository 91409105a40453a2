"""Attention as the kernel that runs (--attention flash) and eager PyTorch's kernels (--stack
pytorch): the flash core's FLOPs, bytes, time law and saved tensors, causality from the mask,
one kernel per op in eager mode, fp32 islands, and the defaults left as they were."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dml2comm import zoo
from dml2comm.analysis import analyze_graph
from dml2comm.cost.attention import BACKWARD_KERNELS, H100_FLASH, FlashShape, flash_cost, flash_times_s
from dml2comm.cost.cache import activation_model_of, flash_cores_of, fp32_islands_of, tensor_parallel_of
from dml2comm.cost.compute import HBM_EFFICIENCY
from dml2comm.cost.host import NONE
from dml2comm.cost.layers import LayerCoster
from dml2comm.cost.ops import (attention_core_flags, infer_seq_len, kernel_regions, op_costs, op_gemms, op_kernel_counts,
                               shard_op_costs)
from dml2comm.hardware.cluster import get_cluster
from dml2comm.hardware.gpus import get_gpu
from dml2comm.ir.graph import DType
from dml2comm.ir.layers import group_layers
from dml2comm.ir.onnx_import import ImportOptions
from dml2comm.load import load_model, load_model_proto
from dml2comm.parallel.config import ParallelConfig

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
KERNELS = ROOT / "benchmarks" / "data" / "h100" / "kernels.json"
BF16 = DType.BFLOAT16
H100 = get_gpu("h100")


def _gpt(batch: int = 2, seq: int = 128, layers: int = 1, hidden: int = 256, heads: int = 8):
    return load_model_proto(zoo.build_gpt(layers=layers, hidden=hidden, heads=heads, vocab=512, seq_len=seq),
                            ImportOptions(batch_size=batch)).graph


def _costs(graph, stack="megatron", attention="unfused", t=1):
    return shard_op_costs(graph, t, False, "bf16", H100, False, NONE, stack, attention)


# ---- the flash kernel: FLOPs, bytes, time, kernels
def test_flash_core_flops_and_bytes_by_hand():
    graph = _gpt()  # b = 2, 8 heads of d = 32, s = 128, causal (Trilu mask)
    (core,) = flash_cores_of(graph)
    assert core.causal
    costs, times, full_flops = _costs(graph, "pytorch", "flash")[:3]
    c = costs[core.context_op]
    # forward 4 b h s^2 d / 2 = 4 * 2 * 8 * 128^2 * 32 / 2; backward 2.5x
    assert c.flops_fwd == 16_777_216 and c.flops_bwd == 2.5 * 16_777_216
    # Q, K, V, O: 2 * 8 * 128 * 32 * 2 bytes = 131,072 each; log-sum-exp 2 * 8 * 128 * 4 = 8,192
    assert c.bytes_fwd == 4 * 131_072 + 8_192
    # backward reads Q, K, V, O, dO, LSE and writes dQ, dK, dV
    assert c.bytes_bwd == 8 * 131_072 + 8_192
    shape = FlashShape(16, 128, 128, 32, 32)
    assert times[core.context_op] == flash_times_s(shape, True, flash_cost(shape, True, BF16), H100.peak_flops("bf16"),
                                                   H100.hbm_bytes_per_s * HBM_EFFICIENCY)
    others = core.ops - {core.context_op}
    assert {graph.ops[i].op_type for i in others} == {"MatMul", "Div", "ConstantOfShape", "Trilu", "Where", "Softmax", "Dropout"}
    assert all(costs[i].flops_fwd == costs[i].bytes_bwd == 0 and times[i] == (0.0, 0.0) for i in others)
    # the model's FLOPs (MFU) stay the graph's, whatever kernel runs
    assert full_flops == _costs(graph)[2]
    # on 2 tensor ranks each runs half the heads
    assert _costs(graph, "pytorch", "flash", t=2)[0][core.context_op].flops_fwd == 16_777_216 / 2


def test_flash_core_is_one_kernel_forward_and_three_backward():
    graph = _gpt()
    (core,) = flash_cores_of(graph)
    costs = _costs(graph, "pytorch", "flash")[0]
    gemm = [op_gemms(op.op_type, [graph.tensor(n) for n in op.inputs], [graph.tensor(n) for n in op.outputs], op.attrs) is not None
            for op in graph.ops]
    counts = op_kernel_counts(graph, costs, gemm, regions=kernel_regions(graph, "pytorch", "flash"), flash=flash_cores_of(graph))
    assert counts[core.context_op] == (1, BACKWARD_KERNELS) == (1, 3)
    assert all(counts[i] == (0, 0) for i in core.ops - {core.context_op})


def _sdpa_rows():
    return json.loads(KERNELS.read_text())["attn"]


def test_flash_law_on_the_measured_h100_sdpa_rows():
    """The bundled H100 SDPA rows (benchmarks/fit_flash_h100.py fits the law on them): median
    |error| within 10% on the forward and on forward+backward.  The measured forward+backward
    also accumulates dQ, dK, dV into the leaves' .grad (the script never zeroes them): three adds,
    each reading two and writing one b h s d bf16 tensor, added to the prediction here."""
    peak, hbm = H100.peak_flops("bf16"), H100.hbm_bytes_per_s * HBM_EFFICIENCY
    fwd_err, both_err = [], []
    for k, r in enumerate(_sdpa_rows()):
        shape = FlashShape(r["b"] * r["heads"], r["seq"], r["seq"], r["head_dim"], r["head_dim"])
        f, b = flash_times_s(shape, r["causal"], flash_cost(shape, r["causal"], BF16), peak, hbm)
        fwd_err.append(abs(f / r["fwd_s"] - 1))
        if k:  # the first row's forward+backward holds a one-time warm-up (PROVENANCE.md)
            accumulate = 9 * shape.bh * shape.s_q * shape.d * 2 / hbm
            both_err.append(abs((f + b + accumulate) / r["fwd_bwd_s"] - 1))
    assert len(fwd_err) == 10 and len(both_err) == 9
    assert np.median(fwd_err) <= 0.10 and np.median(both_err) <= 0.10
    assert max(fwd_err) <= 0.10 and max(both_err) <= 0.10  # every row too, as shipped (largest 5.4%)


def test_flash_law_share_grows_with_head_dim_and_the_causal_kernel_does_half_the_work():
    peak, hbm = H100.peak_flops("bf16"), H100.hbm_bytes_per_s * HBM_EFFICIENCY

    def rate(d: int, causal: bool) -> float:
        shape = FlashShape(64, 4096, 4096, d, d)
        cost = flash_cost(shape, causal, BF16)
        return cost.flops_fwd / (flash_times_s(shape, causal, cost, peak, hbm)[0] - H100_FLASH.fwd_latency_s)

    assert rate(64, True) < rate(128, True) < rate(256, True) < H100_FLASH.fwd_e_max * peak
    shape = FlashShape(64, 4096, 4096, 128, 128)
    assert flash_cost(shape, True, BF16).flops_fwd == flash_cost(shape, False, BF16).flops_fwd / 2
    # the causal kernel computes its diagonal blocks whole: a little more than half the time
    full = flash_times_s(shape, False, flash_cost(shape, False, BF16), peak, hbm)[0] - H100_FLASH.fwd_latency_s
    half = flash_times_s(shape, True, flash_cost(shape, True, BF16), peak, hbm)[0] - H100_FLASH.fwd_latency_s
    assert half == pytest.approx(full / 2 * (1 + 128 / 4096))


# ---- which cores, and causality from the mask
@pytest.mark.parametrize("name, cores, causal", [
    ("gpt2_dynamo", 12, 12), ("gpt2_legacy", 12, 12), ("llama_gqa_dynamo", 4, 4), ("llama_gqa_legacy", 4, 4),
    ("falcon_mqa_legacy", 2, 2), ("bert_legacy", 12, 0), ("bert_dynamo", 12, 0), ("minilm_legacy", 4, 0),
    ("bart_legacy", 6, 2),  # encoder and cross-attention see every position; the decoder's self-attention is causal
    ("t5_legacy", 0, 0), ("bloom_legacy", 0, 0), ("deberta_v2_legacy", 0, 0),  # learned or per-head biases: eager code
])
def test_flash_cores_and_causality_of_real_exports(name, cores, causal):
    graph = load_model(FIXTURES / f"{name}.onnx", ImportOptions(batch_size=2, seq_len=128)).graph
    found = flash_cores_of(graph)
    assert (len(found), sum(c.causal for c in found)) == (cores, causal)


def test_a_folded_mask_shows_no_pattern_and_counts_as_not_causal():
    """At b s^2 <= 4,096 the importer folds the mask into a constant: its pattern is gone."""
    graph = load_model(FIXTURES / "gpt2_dynamo.onnx", ImportOptions(batch_size=2, seq_len=16)).graph
    assert len(flash_cores_of(graph)) == 12 and not any(c.causal for c in flash_cores_of(graph))


def test_the_example_gpt2_small_export_is_causal_through_its_trilu():
    graph = load_model(ROOT / "examples" / "gpt2-small.onnx", ImportOptions(batch_size=1)).graph
    cores = flash_cores_of(graph)
    assert len(cores) == 12 and all(c.causal for c in cores)
    assert all({graph.ops[i].op_type for i in c.ops} >= {"Trilu", "ConstantOfShape", "Dropout"} for c in cores)


# ---- what autograd saves
def _saved_per_layer(graph, stack, attention, recompute="none"):
    acts = activation_model_of(graph, 1, False, "bf16", False, stack, attention)
    layered = group_layers(graph)
    flags = attention_core_flags(graph, infer_seq_len(graph), attention)
    out = []
    for layer in layered.layers:
        if layer.kind == "block":
            core = frozenset(i for i in layer.op_indices if flags[i]) if recompute == "selective" else frozenset()
            out.append(acts.saved_bytes(layer.op_indices, recompute, core))
    return out


@pytest.mark.parametrize("stack", ["megatron", "pytorch"])
def test_flash_saves_no_s2_activations(stack):
    """Per block, saved bytes grow linearly in s with flash (Q, K, V, O, LSE), faster without."""
    short, long = _gpt(seq=128), _gpt(seq=256)
    flash = [_saved_per_layer(g, stack, "flash")[0] for g in (short, long)]
    unfused = [_saved_per_layer(g, stack, "unfused")[0] for g in (short, long)]
    assert flash[1] == 2 * flash[0]
    assert unfused[1] > 2 * unfused[0] and unfused[0] > flash[0]
    # the core's own entry: Q, K, V (their base, the QKV projection's output) and O, and the LSE
    acts = activation_model_of(short, 1, False, "bf16", False, stack, "flash")
    (core,) = flash_cores_of(short)
    kept = dict(acts.saved_by_op[core.context_op])
    assert kept.pop(f"lse:{core.context_op}") == 2 * 8 * 128 * 4
    assert kept.pop(core.out) == 2 * 8 * 128 * 32 * 2
    if stack == "pytorch":  # a causal core's K and V: the KV cache's copies, [b, heads, s, d] each (ActivationModel)
        assert core.causal
        assert kept.pop(f"kv:{core.context_op}:k") == kept.pop(f"kv:{core.context_op}:v") == 2 * 8 * 128 * 32 * 2
    assert kept and all(acts.size[name] == 3 * 2 * 128 * 256 * 2 for name in kept)  # the fused QKV output, [b, s, 3h]
    assert all(acts.saved_by_op[i] == () for i in core.ops - {core.context_op})


def test_selective_recompute_has_nothing_left_to_drop_under_flash():
    graph = _gpt()
    assert _saved_per_layer(graph, "pytorch", "flash", "selective") == _saved_per_layer(graph, "pytorch", "flash")
    assert _saved_per_layer(graph, "pytorch", "unfused", "selective") < _saved_per_layer(graph, "pytorch", "unfused")
    imported = load_model_proto(zoo.build_gpt(layers=1, hidden=256, heads=8, vocab=512, seq_len=128), ImportOptions(batch_size=2))
    coster = LayerCoster(imported, H100, collapse=False)
    flash = coster.layer_table(ParallelConfig(micro_batch_size=2, global_batch_size=2, stack="pytorch"))
    unfused = coster.layer_table(ParallelConfig(micro_batch_size=2, global_batch_size=2, stack="pytorch", attention="unfused"))
    assert flash.selective.sum() == 0 and unfused.selective.sum() > 0


def test_eager_keeps_what_each_unfused_op_saves():
    """The eight-op tanh-GeLU keeps one tensor when fused; eagerly its input, the tanh output,
    0.5 x and 1 + tanh (four [b, s, 4h] tensors)."""
    graph = _gpt()
    gelu = 2 * 128 * 1024 * 2  # b s 4h bf16
    fused, eager = _saved_per_layer(graph, "megatron", "flash")[0], _saved_per_layer(graph, "pytorch", "flash")[0]
    kv = 2 * 128 * 256 * 2  # eager's causal core keeps K and V as cache copies, [b, s, h] each, beside the QKV output
    assert eager - fused == 3 * gelu + 2 * kv


# ---- eager kernels
def test_eager_runs_one_kernel_per_op_where_megatron_fuses():
    graph = load_model(ROOT / "examples" / "gpt2-small.onnx", ImportOptions(batch_size=1)).graph
    act = [op.index for op in graph.ops if "/h.0/mlp/act/" in op.name]
    assert len(act) == 8  # NewGELUActivation: Mul, Pow, Mul, Add, Mul, Tanh, Add, Mul
    fused = kernel_regions(graph, "megatron", "unfused")
    assert len({fused[i] for i in act}) == 1 and not any(i in kernel_regions(graph, "pytorch", "unfused") for i in act)
    megatron, eager = _costs(graph), _costs(graph, "pytorch", "unfused")
    gemm = [op_gemms(op.op_type, [graph.tensor(n) for n in op.inputs], [graph.tensor(n) for n in op.outputs], op.attrs) is not None
            for op in graph.ops]
    k_megatron = op_kernel_counts(graph, megatron.costs, gemm, regions=fused)
    k_eager = op_kernel_counts(graph, eager.costs, gemm, regions={})
    region = [i for i, r in fused.items() if r == fused[act[0]]]  # the act chain and the c_fc bias add before it
    assert sum(k_eager[i][0] for i in act) == 8 and sum(k_megatron[i][0] for i in region) == 1
    assert sum(f for f, _ in k_eager) > sum(f for f, _ in k_megatron)
    # each eager op reads its inputs and writes its output at the roofline: the chain costs more
    hbm = H100.hbm_bytes_per_s * HBM_EFFICIENCY
    assert sum(eager.times[i][0] for i in act) == pytest.approx(sum(eager.costs[i].bytes_fwd for i in act) / hbm)
    assert sum(eager.times[i][0] for i in act) > 3 * sum(megatron.times[i][0] for i in act)


def test_eager_bias_add_is_the_gemm_epilogue_and_add_backward_passes_through():
    graph = load_model(ROOT / "examples" / "gpt2-small.onnx", ImportOptions(batch_size=1)).graph
    index = {op.name: op.index for op in graph.ops}
    bias, residual = index["/transformer/h.0/mlp/c_fc/Add"], index["/transformer/h.0/Add"]
    eager, megatron = _costs(graph, "pytorch", "unfused"), _costs(graph)
    c = eager.costs[bias]
    assert (c.flops_fwd, c.bytes_fwd, eager.times[bias][0]) == (0.0, 0.0, 0.0)
    # backward: the bias gradient, a column sum: read dY [1, 1024, 3072] and write dB [3072], bf16
    assert c.bytes_bwd == (1024 * 3072 + 3072) * 2 and c.flops_bwd == 1024 * 3072
    assert (eager.costs[residual].bytes_bwd, eager.times[residual][1]) == (0.0, 0.0)
    assert eager.costs[residual].bytes_fwd == megatron.costs[residual].bytes_fwd == 3 * 1024 * 768 * 2


def test_eager_gradient_sums_count_every_reader():
    """Eagerly the GeLU's Mul, Pow and Mul reading the fc output are three kernels whose
    gradients autograd sums; Megatron's fused kernel sums them in registers."""
    graph = load_model(ROOT / "examples" / "gpt2-small.onnx", ImportOptions(batch_size=1)).graph
    fc = next(op.outputs[0] for op in graph.ops if op.name == "/transformer/h.0/mlp/c_fc/Add")
    megatron, eager = _costs(graph), _costs(graph, "pytorch", "unfused")
    first = min(graph.consumers(fc))
    assert "gradient sum" not in megatron.costs[first].rule and "gradient sum of its input's 3 readers" in eager.costs[first].rule


# ---- fp32 islands
def test_fp32_islands_are_the_rmsnorm_between_its_casts():
    graph = load_model(FIXTURES / "llama_gqa_legacy.onnx", ImportOptions(batch_size=2, seq_len=128)).graph
    islands = fp32_islands_of(graph)
    norm = [op for op in graph.ops if op.name.startswith("/model/layers.0/input_layernorm/")]
    inside = {op.outputs[0] for op in norm if op.op_type in ("Cast", "Pow", "ReduceMean", "Add", "Sqrt", "Div", "Mul")
              and not op.name.endswith(("Cast_1", "Mul_1"))}
    assert len(inside) == 7 and inside <= islands
    closing = [op.outputs[0] for op in norm if op.name.endswith(("Cast_1", "Mul_1"))]
    residual = next(op.outputs[0] for op in graph.ops if op.name == "/model/layers.0/Add")
    assert not set(closing) & islands and residual not in islands
    # eagerly the norm's point-wise ops move fp32: x^2 reads and writes 2 * 128 * 256 elements of
    # 4 bytes (Megatron: 2), and its exponent, a bf16 scalar
    pow_ = next(op.index for op in norm if op.op_type == "Pow")
    assert _costs(graph, "pytorch", "unfused").costs[pow_].bytes_fwd == 65536 * 4 * 2 + 2
    assert _costs(graph).costs[pow_].bytes_fwd == 65536 * 2 * 2 + 2
    acts_eager = activation_model_of(graph, 1, False, "bf16", False, "pytorch", "flash")
    acts_fused = activation_model_of(graph, 1, False, "bf16", False, "megatron", "flash")
    name = next(iter(inside))
    assert acts_eager.size[name] == 2 * acts_fused.size[name]
    # an fp32 export without the casts (dynamo drops them) shows none
    assert not fp32_islands_of(load_model(FIXTURES / "llama_gqa_dynamo.onnx", ImportOptions(batch_size=2, seq_len=128)).graph)


def test_an_rmsnorm_whose_casts_the_export_dropped_still_runs_in_fp32_eagerly(monkeypatch):
    from dml2comm.cost.cache import castless_rms_norms_of

    dynamo = load_model(FIXTURES / "llama_gqa_dynamo.onnx", ImportOptions(batch_size=2, seq_len=128)).graph
    legacy = load_model(FIXTURES / "llama_gqa_legacy.onnx", ImportOptions(batch_size=2, seq_len=128)).graph
    norms = castless_rms_norms_of(dynamo)
    layers = sum(1 for op in dynamo.ops if op.op_type == "ReduceMean")
    assert len(norms) == layers == 9  # two per block of four, and the final norm
    assert not castless_rms_norms_of(legacy)  # its casts are ops: fp32_islands holds it
    assert not castless_rms_norms_of(_gpt())  # LayerNorm is one op
    norm = norms[0]
    pow_, mul = dynamo.ops[norm.pow_op], dynamo.ops[norm.mul_op]
    assert pow_.op_type == "Pow" and mul.op_type == "Mul" and pow_.inputs[0] in mul.inputs and len(norm.inner) == 5
    eager, fused = _costs(dynamo, "pytorch", "unfused"), _costs(dynamo)
    n = dynamo.tensor(pow_.inputs[0]).numel  # the norm's input: 2 x 128 x 256 elements
    rows = n // 256
    # the squares in fp32 (4 bytes written, Megatron's path 2)
    assert eager.costs[pow_.index].bytes_fwd - fused.costs[pow_.index].bytes_fwd == n * 2
    # the Mul: reads x (2) and rsqrt (one fp32 per row), writes 2, then the upcast's extra bytes:
    # x read twice and the output written in fp32 (3 x 2) and the two casts (6 each)
    c = eager.costs[mul.index]
    assert c.bytes_fwd == n * 2 + rows * 4 + n * 2 + 3 * n * 2 + 2 * n * 6
    assert c.bytes_bwd - 5 * n * 2 - 2 * n * 6 > 0 and "RMSNorm in fp32" in c.rule
    assert "RMSNorm" not in fused.costs[mul.index].rule  # Megatron's fused norms: no casts
    amp = op_costs(dynamo, tensor_parallel_of(dynamo, 1, False, 2), DType.BFLOAT16, H100, H100.peak_flops("bf16"),
                   H100.hbm_bytes_per_s, False, NONE, "pytorch", "unfused", autocast=True)
    assert "RMSNorm in fp32" not in amp.costs[mul.index].rule  # AMP: autocast's own casts (pow is on its fp32 list)
    # the casts' launches are not charged to the host model, fitted on the modelled counts (docstring)
    from dml2comm.cost.host import PYTORCH
    hosted = shard_op_costs(dynamo, 1, False, "bf16", H100, False, PYTORCH, "pytorch", "unfused")
    monkeypatch.setattr("dml2comm.cost.ops.castless_rms_norms_of", lambda graph: ())  # as before: no upcast
    fresh = load_model(FIXTURES / "llama_gqa_dynamo.onnx", ImportOptions(batch_size=2, seq_len=128)).graph
    plain = shard_op_costs(fresh, 1, False, "bf16", H100, False, PYTORCH, "pytorch", "unfused")
    assert hosted.launches == plain.launches and hosted.forward_launches == plain.forward_launches
    assert sum(f for f, _ in hosted.kernel_times) > sum(f for f, _ in plain.kernel_times)


# ---- the defaults, and the caches kept apart
def test_default_costs_are_megatron_unfused_and_caches_never_mix():
    graph = _gpt()
    default = shard_op_costs(graph, 1, False, "bf16", H100, False, NONE)
    assert _costs(graph) is default  # the same cache entry: the defaults are megatron and unfused
    eager = _costs(graph, "pytorch", "flash")
    assert eager.times != default.times
    fresh = op_costs(graph, tensor_parallel_of(graph, 1, False, 2), BF16, H100, H100.peak_flops("bf16"), H100.hbm_bytes_per_s,
                     False, NONE)
    assert fresh.times == default.times and fresh.costs == default.costs


def test_fast_path_equals_the_analysis_for_every_stack_and_kernel():
    from dml2comm.model import FastEvaluator

    imported = load_model_proto(zoo.build_gpt(layers=4, hidden=256, heads=8, vocab=512, seq_len=128), ImportOptions(batch_size=1))
    cluster = get_cluster("dgx-h100", 8)
    configs = [ParallelConfig(dp_size=2, tp_size=2, pp_size=2, global_batch_size=8, stack=stack, attention=attention, recompute=r)
               for stack in ("megatron", "pytorch") for attention in ("flash", "unfused") for r in ("none", "selective")]
    rows = FastEvaluator(imported, cluster).evaluate(configs)
    seen = set()
    for config, row in zip(configs, rows):
        full = analyze_graph(imported, config, cluster, advise=False, timeline=False).summary
        assert row["iteration_time_s"] == pytest.approx(full["iteration_time_s"], rel=1e-9), config
        assert row["peak_memory_bytes"] == full["peak_memory_bytes"], config
        seen.add((round(full["iteration_time_s"], 12), full["peak_memory_bytes"]))
    assert len(seen) >= 6  # the stacks and kernels give different numbers
