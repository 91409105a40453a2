"""OpenXLA's measured H100 bf16 matmuls against the op costing of the analysis.

Each measured dot ``[b, n, k] @ [b, k, m]`` (b in {1, 2, 4}; m, n, k in {256, ..., 4096}) becomes
one ``MatMul`` of a shape-only ONNX graph (operands ``[batch, b, n, k]`` and
``[batch, b, k, m]``, the symbolic ``batch`` bound to 1); the graph, with every shape as its own
op, is analysed once on one H100 (``dgx-h100``, bf16, d = t = p = 1) and each op's forward time
(:attr:`~dml2comm.analysis.OpInfo.time_fwd_s`: the time the analysis gives that op) is compared
with the measured ``2 b m n k / throughput``.  Nothing here re-implements the costing: whatever
model the analysis applies to a MatMul is what is validated.

Tags: ``>=1GFLOP`` for shapes of at least 1e9 FLOP (2 b m n k), the issue's target set.
"""

from __future__ import annotations

import dataclasses

import onnx
from onnx import TensorProto, helper

from dml2comm.analysis import analyze_graph
from dml2comm.hardware.cluster import get_cluster
from dml2comm.ir.onnx_import import ImportOptions, load_model_proto
from dml2comm.parallel.config import ParallelConfig
from dml2comm.validate.cases import Case, sample_indices, scaled_cluster
from dml2comm.validate.data import read_csv

__all__ = ["FILE", "cases", "matmul_model", "shapes"]

FILE = "xla_matmul_h100_bf16.csv"
GFLOP = 1e9


def shapes() -> list[tuple[int, int, int, int, float]]:
    """(b, m, n, k, measured FLOP/s) per bundled row."""
    return [(int(r["b"]), int(r["m"]), int(r["n"]), int(r["k"]), float(r["flops_per_s"])) for r in read_csv(FILE)]


def matmul_model(dims: list[tuple[int, int, int, int]]) -> onnx.ModelProto:
    """A graph of independent MatMuls ``mm{i}``: ``[batch, b, n, k] @ [batch, b, k, m]`` per (b, m, n, k)."""
    inputs, outputs, nodes = [], [], []
    for i, (b, m, n, k) in enumerate(dims):
        inputs.append(helper.make_tensor_value_info(f"a{i}", TensorProto.FLOAT, ["batch", b, n, k]))
        inputs.append(helper.make_tensor_value_info(f"b{i}", TensorProto.FLOAT, ["batch", b, k, m]))
        outputs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, ["batch", b, n, m]))
        nodes.append(helper.make_node("MatMul", [f"a{i}", f"b{i}"], [f"y{i}"], name=f"mm{i}"))
    graph = helper.make_graph(nodes, "xla_matmuls", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def cases(sample: int | None = None, compute_scale: float = 1.0) -> list[Case]:
    """One case per measured shape: the MatMul's forward time."""
    table = shapes()
    picked = sample_indices(len(table), sample)
    dims = [table[i][:4] for i in picked]
    imported = load_model_proto(matmul_model(dims), ImportOptions(batch_size=1))
    config = ParallelConfig(dtype="bf16")
    cluster = dataclasses.replace(get_cluster("dgx-h100", 1), collective_overhead_s=0.0)
    analysis = analyze_graph(imported, config, scaled_cluster(cluster, compute_scale), advise=False, timeline=False)
    times = {op.name: op.time_fwd_s for op in analysis.ops if op.op_type == "MatMul"}
    out = []
    for j, i in enumerate(picked):
        b, m, n, k, flops_per_s = table[i]
        flops = 2.0 * b * m * n * k
        tags = (">=1GFLOP",) if flops >= GFLOP else ()
        out.append(Case("gemm", f"b{b}_m{m}_n{n}_k{k}", "matmul_time_s", flops / flops_per_s, times[f"mm{j}"],
                        f"H100 bf16 [{b},{n},{k}]@[{b},{k},{m}]", tags))
    return out
