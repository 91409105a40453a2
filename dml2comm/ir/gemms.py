"""The graph's weight GEMMs as (M, N, K) shapes, and how far apart two shapes are.

Read by the trace join (:mod:`dml2comm.traces.join`, which matches a profiled step's GEMMs to
these in order), by the profile's held-out shape error (:func:`dml2comm.traces.predict.held_out_shapes`)
and by the profile band's distance of a plan from the profiled shapes
(:func:`dml2comm.cost.bands.plan_doublings`): one definition of a GEMM's shape for all three.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

__all__ = ["gemm_key", "graph_gemm_ops", "graph_gemms", "shape_doublings"]


def gemm_key(m: int, n: int, k: int) -> tuple[int, ...]:
    """Order-free (M, N, K): a weight stored transposed (Conv1D, ``Gemm`` with ``transB``) or a
    GEMM the trace writes as ``addmm(bias, x, w)`` gives the same key."""
    return tuple(sorted((int(m), int(n), int(k))))


def shape_doublings(a: Sequence[int], b: Sequence[int]) -> float:
    """Distance of two GEMM shapes in doublings: the sum over their sorted (M, N, K) of
    ``|log2(a_i / b_i)|`` (a GEMM twice as tall is one doubling away)."""
    return float(sum(abs(math.log2(x / y)) for x, y in zip(sorted(a), sorted(b))))


def graph_gemms(layered: Any) -> list[tuple[tuple[int, ...], int]]:
    """The graph's weight GEMMs in topological order: ((M, N, K) key, layer index) (see
    :func:`graph_gemm_ops`)."""
    return [(key, layer) for key, layer, _ in graph_gemm_ops(layered)]


def graph_gemm_ops(layered: Any) -> list[tuple[tuple[int, ...], int, int]]:
    """The graph's weight GEMMs in topological order: ((M, N, K) key, layer index, op index).

    A weight GEMM is a ``MatMul``/``Gemm`` one of whose inputs is a weight (a parameter or a tied
    copy): the attention's activation x activation MatMuls are left out (the trace runs them
    inside ``scaled_dot_product_attention``)."""
    g = layered.graph
    out = []
    for op in g.ops:
        if op.op_type not in ("MatMul", "Gemm"):
            continue
        ins = g.op_inputs(op)
        if len(ins) < 2 or ins[0] is None or ins[1] is None or not ins[1].is_weight or ins[0].is_weight:
            continue
        x, w = ins[0].shape, ins[1].shape
        if len(w) != 2 or not x:
            continue
        k = x[-1]
        m = math.prod(x[:-1])
        n = w[1] if w[0] == k else w[0]  # (K, N), or (N, K) stored transposed
        out.append((gemm_key(m, n, k), layered.layer_of_op[op.index], op.index))
    return out
