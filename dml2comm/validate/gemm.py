"""OpenXLA's measured H100 bf16 matmuls against the shared GEMM law, on shapes it was not fitted to.

This source checks the shared analytical law of :mod:`dml2comm.cost.gemm`
(:data:`~dml2comm.cost.gemm.SHAPE_LAW`: what the A100, the B200 outside its table and every GPU
without a fit use) on a held-out half (what ``benchmarks/fit_gemm.py`` prints as its held-out
check): its shape law and sustained factors are refitted (:func:`dml2comm.cost.gemm.fit_shape_law`,
0.5 s) on the B200 bf16 table and the H100 shapes whose ``log2(b M N K)`` is even, and each H100
shape whose ``log2(b M N K)`` is odd is one case: the measured ``2 b m n k / throughput`` against
the analytical time.

It is not what an H100 gets: :func:`dml2comm.cost.gemm.gemm_time_s` no longer answers H100
bf16/fp16 from this table but from :data:`~dml2comm.cost.gemm.H100_SHAPE_LAW`, fitted on what
PyTorch/cuBLAS measures (the ``h100-gemm`` source), and that law does not reproduce this table:
median |error| 17.4% over its shapes of at least 1 GFLOP, the table's small shapes slower and its
large ones faster than PyTorch measures them (``benchmarks/fit_h100_gemm.py`` prints where the
two meet; :mod:`dml2comm.cost.gemm` says why).

Tags: ``>=1GFLOP`` for shapes of at least 1e9 FLOP (2 b m n k), the issue's target set.
"""

from __future__ import annotations

import functools
import math

import onnx
from onnx import TensorProto, helper

from dml2comm.cost import gemm as cost_gemm
from dml2comm.hardware.gpus import get_gpu
from dml2comm.validate.cases import Case, sample_indices
from dml2comm.validate.data import read_csv

__all__ = ["FILE", "cases", "held_out_fit", "matmul_model", "shapes"]

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


@functools.lru_cache(maxsize=1)
def held_out_fit() -> tuple[cost_gemm.FitResult, tuple[tuple[int, int, int, int], ...]]:
    """(the shape law fitted on B200 and the even H100 shapes, the odd H100 shapes held out)."""
    h100 = get_gpu("h100")
    keys = sorted(cost_gemm.measured_table(h100.name, "bf16").nodes)
    even = [x for x in keys if round(math.log2(math.prod(x))) % 2 == 0]
    odd = tuple(x for x in keys if round(math.log2(math.prod(x))) % 2 == 1)
    fit = cost_gemm.fit_shape_law([cost_gemm.table_samples(h100, "bf16", even), cost_gemm.table_samples(cost_gemm.B200, "bf16")])
    return fit, odd


def cases(sample: int | None = None, compute_scale: float = 1.0) -> list[Case]:
    """One case per held-out measured shape: the analytical model's time (``compute_scale``
    multiplies the H100's dense peak, as :func:`~dml2comm.validate.cases.scaled_cluster`)."""
    fit, odd = held_out_fit()
    held = set(odd)
    table = [row for row in shapes() if (row[0], row[2], row[1], row[3]) in held]  # table's (b, m, n, k): our (b, N, M, K)
    picked = sample_indices(len(table), sample)
    h100 = cost_gemm.gemm_device(get_gpu("h100"))
    out = []
    for i in picked:
        b, m, n, k, flops_per_s = table[i]
        flops = 2.0 * b * m * n * k
        predicted = float(cost_gemm.analytical_times_s(
            [b], [n], [m], [k], peak_flops_per_s=h100.peak("bf16") * compute_scale, sm_count=h100.sm_count,
            hbm_bytes_per_s=h100.hbm_bytes_per_s, in_bytes=2, out_bytes=2, sustained=fit.sustained[h100.name],
            law=fit.law)[0])
        tags = (">=1GFLOP",) if flops >= GFLOP else ()
        out.append(Case("gemm", f"b{b}_m{m}_n{n}_k{k}", "matmul_time_s", flops / flops_per_s, predicted,
                        f"H100 bf16 [{b},{n},{k}]@[{b},{k},{m}], analytical model fitted without it", tags))
    return out
