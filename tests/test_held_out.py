"""The held-out H200 steps (``benchmarks/data/gpu_steps/held_out/``, measured after every constant
was fitted; ``benchmarks/bench_held_out.py`` prints them all): the models whose modelling they
changed stay where they were measured."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from dml2comm.validate import steps

ROOT = Path(__file__).resolve().parent.parent
HELD_OUT = ROOT / "benchmarks" / "data" / "gpu_steps" / "held_out"


def _measured(name: str, mode: str, b: int, s: int) -> tuple[float, float, int]:
    rows = [r for f in sorted(HELD_OUT.glob("h200_set6_*.json")) for r in json.loads(f.read_text())["runs"]
            if (r["name"], r["mode"], r["micro_batch"], r["seq"]) == (name, mode, b, s)]
    assert len(rows) == 3  # three processes
    return statistics.mean(r["step_s_median"] for r in rows), statistics.mean(r["peak_alloc_bytes"] for r in rows), rows[0]["params"]


@pytest.mark.parametrize("name, fixture, b, s, time_tol", [
    # a Mixtral-style MoE exported with batched_mm: 6.7 s and 1.6 TiB before the importer read its
    # per-token expert products as the grouped GEMM the step runs (58 ms, 9.7 GiB measured)
    ("mixtral-8x0.1b", "step_mixtral_8x0_1b", 4, 2048, 0.10),
    # a GPU-bound Llama: 8.5% short while the fp32 work of Hugging Face's RMSNorm was left out
    ("llama-3b-8l", "step_llama_3b_8l", 4, 2048, 0.06),
])
def test_held_out_steps(name, fixture, b, s, time_tol):
    time_s, peak, params = _measured(name, "bf16", b, s)
    analysis, _ = steps.analyse_step_at(ROOT / "tests" / "fixtures" / f"{fixture}_dynamo.onnx", params, "hgx-h200",
                                        steps.step_config(b, s, "bf16"))
    ratio = analysis.summary["iteration_time_s"] / time_s
    assert abs(ratio - 1) <= time_tol
    assert analysis.summary["peak_memory_bytes"] / peak == pytest.approx(1.0, abs=0.03)


def test_a_moe_step_under_amp_runs_its_experts_in_fp32():
    """Measured: the Mixtral-style step under AMP took 2.9x its bf16 time (PyTorch's grouped GEMM
    takes bf16 only; transformers falls back to fp32 products): costed so (60% short when the
    products were costed in bf16), and the analysis says so."""
    time_s, _, params = _measured("mixtral-8x0.1b", "amp", 4, 2048)
    path = ROOT / "tests" / "fixtures" / "step_mixtral_8x0_1b_dynamo.onnx"
    amp, _ = steps.analyse_step_at(path, params, "hgx-h200", steps.step_config(4, 2048, "amp"))
    bf16, _ = steps.analyse_step_at(path, params, "hgx-h200", steps.step_config(4, 2048, "bf16"))
    assert [w for w in amp.warnings if w.startswith("experts under --precision amp")]
    assert not [w for w in bf16.warnings if "--precision amp" in w]
    assert amp.summary["iteration_time_s"] / time_s == pytest.approx(1.0, abs=0.15)
    assert amp.summary["iteration_time_s"] > 2.4 * bf16.summary["iteration_time_s"]


def test_grouped_expert_products_under_autocast_are_fp32_products_without_casts():
    from dml2comm.cost.cache import autocast_dtypes_of
    from dml2comm.cost.host import NONE
    from dml2comm.cost.ops import shard_op_costs
    from dml2comm.hardware.gpus import get_gpu
    from dml2comm.ir.graph import GROUPED_MM, DType
    from dml2comm.ir.onnx_import import ImportOptions
    from dml2comm.load import load_model

    graph = load_model(ROOT / "tests" / "fixtures" / "mixtral_tiny_dynamo.onnx", ImportOptions(batch_size=2, seq_len=16)).graph
    grouped = [op for op in graph.ops if op.aten == GROUPED_MM]
    assert len(grouped) == 4
    h100 = get_gpu("h100")
    amp = shard_op_costs(graph, 1, False, "bf16", h100, False, NONE, "pytorch", "flash", "amp")
    bf16 = shard_op_costs(graph, 1, False, "bf16", h100, False, NONE, "pytorch", "flash", "bf16")
    ratio = h100.peak_flops("bf16") / h100.peak_flops("fp32")
    dtypes = autocast_dtypes_of(graph, DType.BFLOAT16, True)
    for op in grouped:
        assert dtypes[op.outputs[0]] is DType.FLOAT and "autocast casts" not in amp.costs[op.index].rule
        assert amp.times[op.index][0] > bf16.times[op.index][0]
    # the scaling itself: the grouped products' times by the peaks' ratio, nothing else
    from dml2comm.cost.ops import fp32_grouped_products
    base = [(1e-6, 2e-6)] * len(graph.ops)
    scaled = fp32_grouped_products(graph, base, ratio)
    assert all(scaled[i] == ((1e-6 * ratio, 2e-6 * ratio) if op.aten == GROUPED_MM else base[i]) for i, op in enumerate(graph.ops))
    # a plain linear layer under autocast stays a 16-bit product
    linear = next(op for op in graph.ops if op.op_type == "MatMul" and op.aten != GROUPED_MM and "experts" not in op.scope)
    assert dtypes[linear.outputs[0]] is DType.BFLOAT16


def test_each_moe_layer_pays_its_routing_once():
    """HF's grouped experts mask the routed rows around each product and sort, gather and scatter
    them once a layer (cost.ops.eager_expert_routing): the first product of each layer carries
    the routing and its launches, every product its output's masked fill."""
    from dml2comm.cost.host import PYTORCH
    from dml2comm.cost.ops import EXPERT_ROUTING_KERNELS, shard_op_costs
    from dml2comm.hardware.gpus import get_gpu
    from dml2comm.ir.graph import GROUPED_MM
    from dml2comm.ir.onnx_import import ImportOptions
    from dml2comm.load import load_model

    graph = load_model(ROOT / "tests" / "fixtures" / "mixtral_tiny_dynamo.onnx", ImportOptions(batch_size=2, seq_len=16)).graph
    costs = shard_op_costs(graph, 1, False, "bf16", get_gpu("h100"), False, PYTORCH, "pytorch", "flash", "bf16")
    grouped = [op for op in graph.ops if op.aten == GROUPED_MM]
    routed = [op for op in grouped if "expert routing" in costs.costs[op.index].rule]
    assert len(grouped) == 4 and len(routed) == 2  # two MoE layers
    assert all("expert rows masked" in costs.costs[op.index].rule for op in grouped)
    megatron = shard_op_costs(graph, 1, False, "bf16", get_gpu("h100"), False, PYTORCH, "megatron", "flash", "bf16")
    assert not any("expert routing" in c.rule for c in megatron.costs)  # Megatron-Core's own dispatcher
    assert EXPERT_ROUTING_KERNELS == (10, 10)


def test_the_constants_taken_from_the_held_out_traces_are_recomputed_from_the_bundled_ones():
    """benchmarks/fit_held_out_traces.py on the four bundled traces gives the shipped numbers."""
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import fit_held_out_traces as fit
    from dml2comm.cost import ops

    routing = fit.expert_routing()
    assert routing["fill_share"] == pytest.approx(ops.EXPERT_FILL_SHARE, abs=0.005)
    assert routing["layer_s"] == pytest.approx(ops.EXPERT_ROUTING_LAYER_S, abs=2e-6)
    assert routing["bytes_per_element"] == pytest.approx(ops.EXPERT_ROUTING_BYTES, abs=0.5)
    assert 55 < routing["launches_per_layer"] < 65  # what ops.EXPERT_ROUTING_KERNELS charges in part
    assert fit.pointwise_conversions() == {"1x1 s1": (33, 6), "1x1 s2": (3, 3), "3x3": (16, 16), "7x7": (1, 1)}
    calls, mean_s = fit.rms_norm_casts()
    assert calls == 68 and mean_s == pytest.approx(58e-6, rel=0.02)
