"""The graph's weight GEMMs as (M, N, K) shapes, and how far apart two shapes are; its weight
convolutions by their input and weight shapes.

Read by the trace join (:mod:`dml2comm.traces.join`, which matches a profiled step's GEMMs and
convolutions to these in order), by the profile's held-out shape error (:func:`dml2comm.traces.predict.held_out_shapes`)
and by the profile band's distance of a plan from the profiled shapes
(:func:`dml2comm.cost.bands.plan_doublings`): one definition of a GEMM's shape for all three.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

__all__ = ["conv_key", "gemm_key", "graph_gemm_ops", "graph_gemms", "graph_weight_ops", "shape_doublings"]


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


def conv_key(x: Sequence[int], w: Sequence[int]) -> tuple[Any, ...]:
    """A convolution's key for the join: its input's and weight's shapes (N, C, spatial... and
    Cout, Cin / groups, kernel...), which the graph's ``Conv`` and the trace's ``aten::conv2d``
    both carry (the trace records no stride)."""
    return ("conv", *(int(v) for v in x), *(int(v) for v in w))


def graph_weight_ops(layered: Any) -> list[tuple[tuple[Any, ...], int, int]]:
    """The graph's weight GEMMs (:func:`graph_gemm_ops`) and weight convolutions (``Conv`` with a
    weight of the input's rank, keyed by :func:`conv_key`) in topological order: (key, layer
    index, op index), what a profiled step's forward is matched against."""
    g = layered.graph
    gemms = {i: (key, layer) for key, layer, i in graph_gemm_ops(layered)}
    out = []
    for op in g.ops:
        if op.index in gemms:
            out.append((*gemms[op.index], op.index))
        elif op.op_type == "Conv":
            ins = g.op_inputs(op)
            if len(ins) >= 2 and ins[0] is not None and ins[1] is not None and ins[1].is_weight and ins[0].shape \
                    and len(ins[1].shape) == len(ins[0].shape):
                out.append((conv_key(ins[0].shape, ins[1].shape), layered.layer_of_op[op.index], op.index))
    return out


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
