"""Attention as the kernel that runs: the fused (flash) attention core.

An ONNX export spells scaled-dot-product attention as its math: ``Q.K^T``, a scale, a mask, a
softmax, maybe a dropout, and ``P.V`` (:func:`dml2comm.parallel.tensor.find_attention`).  Eager
PyTorch 2.x runs ``F.scaled_dot_product_attention`` on sm_80+ as one fused kernel per pass
(FlashAttention-2, Dao 2023, arXiv:2307.08691; cuDNN's ``sdpa_sm90_flash`` kernels on H100, as
the bundled Hugging Face traces show), and so do Megatron-Core with ``--use-flash-attn`` or
Transformer Engine.  With ``--attention flash`` the core is costed as that kernel
(:func:`flash_cost`, :func:`flash_times_s`), never its s x s scores through HBM.

Which cores (:func:`find_flash_cores`).  The ops on the paths from the ``Q.K^T`` output to the
``P.V`` probabilities operand, all point-wise ops, views or the one Softmax, whose other operands
are scalars (the scale, the fill value, the dropout ratio) or masks (no learned parameter in
them, no head axis: ``[b or 1, 1, s_q, s_k]``, ``[s_q, s_k]``); plus the ops that build such a
mask for this core alone (GPT-2's ``ConstantOfShape -> Trilu``).  A core with a learned or
per-head bias (T5's relative position bias, BLOOM's ALiBi, DeBERTa's disentangled terms) is left
as exported: Hugging Face runs those models' attention in eager code, not in SDPA's flash kernel.

Causality (:func:`is_causal_mask`), read off the mask pattern: a ``Trilu`` in the mask's
ancestry (``torch.tril``/``triu`` of an s x s block, GPT-2's legacy ``bias`` buffer), or a
comparison (``<=``, ``<``, ``>=``, ``>``) of a key-position row ``[.., 1, s_k]`` with a
query-position column ``[.., s_q, 1]`` (transformers' ``causal_mask_function``:
``kv_idx <= q_idx``, in both exporters' graphs).  A padding mask compares nothing along the query
axis; a relative-position bias compares one ``[s, s]`` difference with scalars.  The importer
folds a mask into a constant when it has at most 4,096 elements (``FOLD_MAX_ELEMENTS``,
micro-batch x s^2 <= 4,096: s <= 64 for one sample); such a mask's pattern is gone and the core
is costed as not causal (the full s^2 work: a bound from above, at sizes where attention costs
little anyway).

The kernel (Dao 2023, Sec. 3):

- forward FLOPs ``2 b h s_q s_k (d + d_v)`` (``4 b h s^2 d`` for ``d = d_v``), half of them
  when causal (the kernel skips the blocks above the diagonal; Dao 2023 Sec. 3.1.1, "causal
  masking");
- backward FLOPs :data:`BACKWARD_FLOP_RATIO` = 2.5 x forward: five matrix products against two
  (``S = Q K^T`` recomputed, ``dV = P^T dO``, ``dP = dO V^T``, ``dQ = dS K``, ``dK = dS^T Q``;
  Dao 2023 Sec. 3.1.2 and Algorithm 2);
- bytes: Q, K, V and O once forward, with the log-sum-exp (``b h s_q`` fp32); backward reads
  Q, K, V, O, dO and the log-sum-exp and writes dQ, dK, dV;
- saved for backward: Q, K, V, O and the log-sum-exp (Sec. 3.1.2: "we only need to store the
  output O and the logsumexp L"); no score matrix, and no dropout mask (the kernel regenerates it
  from the random generator's state, Dao et al. 2022 Sec. 3.1).  Selective recomputation
  (Korthikanti et al. 2022, Sec. 5) therefore has nothing left to drop in the core.

Time (:func:`flash_times_s`), a throughput law fitted on the bundled H100 measurements of
``F.scaled_dot_product_attention`` (``benchmarks/data/h100/kernels.json``, ``attn``:
ten shapes; ``benchmarks/fit_flash_h100.py`` fits it and prints in-sample and leave-one-out
errors).  Per pass, the work ``W`` (FLOPs, times ``1 + B / s_k`` for a causal core: the diagonal
blocks of ``B`` = :data:`FLASH_BLOCK` columns are computed whole) runs at a share of the dense
peak that grows with the head dimension, ``e(d) = e_max d / (d + d0)``: each ``B x B`` tile does
``4 B^2 d`` FLOPs on the tensor cores against a softmax (exp, max, sum, rescale) of ``B^2``
elements on the far slower multi-function units, a fixed cost that a larger ``d`` amortises
(Shah et al. 2024, FlashAttention-3, arXiv:2407.08608, Sec. 1: H100 SXM5 has 989 TFLOP/s of
matmul but 3.9 TFLOP/s of exponential).

- forward: ``t0 + W / (peak e_f(d))``, ``t0`` the kernel's fixed time (launch and the last
  wave);
- backward: ``2.5 W / (peak e_b(d)) + beta b h s_q d / HBM``: the memory-side passes of the
  backward (``D = rowsum(dO o O)`` before, dQ accumulated in fp32 and converted after: cuDNN's
  ``compute_dot_do_o`` and ``convert_dq_to_16bits`` kernels in the bundled traces; Dao 2023
  Algorithm 2, lines 4 and 19-21), ``beta`` bytes per element of Q at the achieved HBM rate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple, Sequence

from dml2comm.cost.pointwise import POINTWISE_OPS
from dml2comm.ir.graph import DType, OpGraph, Tensor
from dml2comm.ops.registry import OpCost
from dml2comm.parallel.tensor import find_attention, requires_grad

__all__ = ["FlashCore", "FlashShape", "FlashLaw", "H100_FLASH", "FLASH_BLOCK", "BACKWARD_FLOP_RATIO", "LSE_BYTES",
           "BACKWARD_KERNELS", "find_flash_cores", "is_causal_mask", "flash_shape", "flash_cost", "flash_times_s",
           "flash_saved_lse_bytes"]

#: FlashAttention-2's backward FLOPs over its forward FLOPs: 5 matrix products against 2 (Dao
#: 2023, arXiv:2307.08691, Sec. 3.1.2 and Algorithm 2; the paper's benchmarks count the
#: forward+backward as 3.5x the forward, Sec. 4.1).
BACKWARD_FLOP_RATIO = 2.5
#: Columns of one key/value block: the diagonal blocks of a causal core are computed whole
#: (FlashAttention-2's 128 x 128 blocks for head dimensions up to 128, Dao 2023 Sec. 3.3 and
#: its ``flash_fwd_launch_template.h``).
FLASH_BLOCK = 128
#: Bytes per element of the saved log-sum-exp (fp32, one per query row and head; Dao 2023 Sec. 3.1.2).
LSE_BYTES = 4
#: Kernels of the backward: the ``rowsum(dO o O)`` preprocessing, the main kernel and the dQ
#: conversion (cuDNN's ``compute_dot_do_o``, ``sdpa_..._bprop`` and ``convert_dq_to_16bits`` in
#: the bundled H100 traces; FlashAttention-2's ``flash_bwd_dot_do_o``, ``flash_bwd`` and
#: ``convert_dq`` kernels).
BACKWARD_KERNELS = 3
#: Ops a flash core's path may hold besides its one Softmax: point-wise ops (scale, mask, dropout,
#: casts, the NaN guard of dynamo exports) and views.
_PATH_OPS = POINTWISE_OPS | frozenset({"Softmax", "Reshape", "Squeeze", "Unsqueeze", "Identity", "Flatten"})
#: Ops of a mask's ancestry that make it causal when they compare a key row with a query column.
_COMPARISONS = frozenset({"Less", "LessOrEqual", "Greater", "GreaterOrEqual"})
#: How far back a mask's ancestry is searched for its pattern (ops).
_MASK_SEARCH_OPS = 256


class FlashLaw(NamedTuple):
    """The flash kernel's throughput law (module docstring), one set per fitted GPU."""

    fwd_latency_s: float  #: t0: fixed time of one forward kernel
    fwd_e_max: float  #: forward share of the dense peak as d -> infinity
    fwd_d0: float  #: head dimension at which the forward reaches half of ``fwd_e_max``
    bwd_bytes_per_element: float  #: beta: memory-side bytes of the backward per element of Q (b h s_q d)
    bwd_e_max: float  #: backward share of the dense peak as d -> infinity
    bwd_d0: float  #: head dimension at which the backward reaches half of ``bwd_e_max``


#: Fitted by ``benchmarks/fit_flash_h100.py`` on the ten bundled H100 SDPA shapes
#: (``benchmarks/data/h100/kernels.json``, ``attn``, measured by
#: shared/tools/measure_gpu.py: bf16, causal, head dims 64 and 128, s = 1,024-8,192; the first
#: row's forward+backward, a warm-up, left out; each forward+backward net of the gradient
#: accumulation the measurement adds, see the script).  Median |error| in sample / leaving each
#: shape out: forward 1.4 % / 1.8 % (largest 5.4 % / 7.3 %), backward 1.9 % / 3.1 %,
#: forward+backward 1.5 % / 2.3 % (largest 5.3 % / 8.4 %); the bundled GPT-2 trace's kernels
#: (47.0 and 154 us per layer) are predicted at 48.7 and 152 us.  The script prints every row.
#: Used for every GPU as shares of its own peak and HBM bandwidth.
H100_FLASH = FlashLaw(fwd_latency_s=16.16e-6, fwd_e_max=0.880, fwd_d0=61.0,
                      bwd_bytes_per_element=33.2, bwd_e_max=0.875, bwd_d0=57.0)


@dataclass(frozen=True, slots=True)
class FlashCore:
    """One attention core that runs as a flash kernel (module docstring)."""

    scores_op: int  #: ``Q.K^T``
    context_op: int  #: ``P.V``: carries the kernel's cost and saved tensors
    ops: frozenset[int]  #: every op the kernel replaces: the two products, the path, the mask builders
    causal: bool
    q: str  #: the operands and output as the kernel sees them
    k: str  #: K as the product reads it (``K^T`` in the export)
    v: str
    out: str


class FlashShape(NamedTuple):
    """One flash kernel's problem on one GPU: ``bh`` = batch x heads, lengths and head dims."""

    bh: int
    s_q: int
    s_k: int
    d: int
    d_v: int


def find_flash_cores(graph: OpGraph) -> tuple[FlashCore, ...]:
    """The attention cores of ``graph`` that run as flash kernels (module docstring), in graph order."""
    needs = requires_grad(graph)
    out = []
    for core in find_attention(graph):
        found = _core_ops(graph, core.scores_op, core.context_op, needs)
        if found is None:
            continue
        ops, masks = found
        scores = graph.ops[core.scores_op]
        context = graph.ops[core.context_op]
        probs = graph.tensor(context.inputs[0])
        if probs is None or probs.rank < 2:
            continue
        s_q, s_k = probs.shape[-2], probs.shape[-1]
        out.append(FlashCore(core.scores_op, core.context_op, frozenset(ops), is_causal_mask(graph, masks, s_q, s_k),
                             scores.inputs[0], scores.inputs[1], context.inputs[1], context.outputs[0]))
    return tuple(out)


def _core_ops(graph: OpGraph, scores_op: int, context_op: int, needs: frozenset[str]) -> tuple[set[int], list[str]] | None:
    """(the ops a flash kernel replaces, the mask tensors it reads), or None where the core is not
    a flash core (an op off :data:`_PATH_OPS` on the path, not one Softmax, a learned or per-head bias)."""
    start = graph.ops[scores_op].outputs[0]
    target = graph.ops[context_op].inputs[0]
    # forward from the scores and backward from the probabilities, through path ops only
    ahead: set[int] = set()
    stack = [start]
    while stack:
        for c in graph.consumers(stack.pop()):
            if c not in ahead and c < context_op and graph.ops[c].op_type in _PATH_OPS:
                ahead.add(c)
                stack.extend(o for o in graph.ops[c].outputs if o)
    path: set[int] = set()
    stack = [target]
    while stack:
        p = graph.producer(stack.pop())
        if p is not None and p in ahead and p not in path:
            path.add(p)
            stack.extend(n for n in graph.ops[p].inputs if n)
    if target != start and not path:
        return None
    if sum(graph.ops[i].op_type == "Softmax" for i in path) != 1:
        return None
    inside = {o for i in path for o in graph.ops[i].outputs if o} | {start}
    masks: list[str] = []
    for i in path:
        for name in graph.ops[i].inputs:
            t = graph.tensor(name) if name else None
            if t is None or name in inside or t.numel <= 1:
                continue
            if t.is_weight or (t.dtype.is_float and name in needs):
                return None  # a learned bias, or an activation mixed into the scores
            if t.rank >= 3 and t.shape[-3] != 1:
                return None  # a per-head bias (ALiBi, a relative position bias)
            masks.append(name)
    ops = path | {scores_op, context_op} | _mask_builders(graph, masks, path | {scores_op, context_op}, needs)
    return ops, masks


def _mask_builders(graph: OpGraph, masks: Sequence[str], core: set[int], needs: frozenset[str]) -> set[int]:
    """Ops that build the core's masks for it alone (every output read only inside the core, no
    gradient): the kernel takes ``is_causal`` instead (GPT-2's ``ConstantOfShape -> Trilu``)."""
    builders: set[int] = set()
    stack = list(masks)
    while stack:
        p = graph.producer(stack.pop())
        if p is None or p in builders or p in core:
            continue
        op = graph.ops[p]
        outs = [o for o in op.outputs if o]
        if any(o in needs or o in graph.outputs for o in outs):
            continue
        if all(c in core or c in builders for o in outs for c in graph.consumers(o)):
            builders.add(p)
            stack.extend(n for n in op.inputs if n)
    return builders


def is_causal_mask(graph: OpGraph, masks: Sequence[str], s_q: int, s_k: int) -> bool:
    """Whether ``masks`` (the tensors a core's scores are masked with) hide the future: a
    ``Trilu`` in their ancestry, or a comparison of a key row ``[.., 1, s_k]`` with a query column
    ``[.., s_q, 1]`` (module docstring).  False for a folded (constant) mask and for none."""
    if s_q <= 1 or s_k <= 1:
        return False
    seen: set[int] = set()
    stack = list(masks)
    while stack and len(seen) < _MASK_SEARCH_OPS:
        p = graph.producer(stack.pop())
        if p is None or p in seen:
            continue
        seen.add(p)
        op = graph.ops[p]
        if op.op_type == "Trilu":
            x = graph.tensor(op.inputs[0])
            if x is not None and x.rank >= 2 and x.shape[-2] > 1 and x.shape[-1] > 1:
                return True
        if op.op_type in _COMPARISONS and len(op.inputs) == 2:
            a, b = (graph.tensor(n) if n else None for n in op.inputs)
            if a is not None and b is not None and a.rank >= 2 and b.rank >= 2:
                row = lambda t: t.shape[-2] == 1 and t.shape[-1] == s_k  # noqa: E731 - two one-line tests
                col = lambda t: t.shape[-2] == s_q and t.shape[-1] == 1  # noqa: E731
                if (row(a) and col(b)) or (col(a) and row(b)):
                    return True
        stack.extend(n for n in op.inputs if n)
    return False


def flash_shape(q: Tensor, v: Tensor, out: Tensor) -> FlashShape:
    """The kernel's problem from the core's Q operand, V operand and output as one GPU holds them
    (``[.., s_q, d]``, ``[.., s_k, d_v]``, ``[.., s_q, d_v]``; the leading axes are batch x heads)."""
    return FlashShape(math.prod(out.shape[:-2]), out.shape[-2], v.shape[-2], q.shape[-1], out.shape[-1])


def flash_cost(shape: FlashShape, causal: bool, train: DType) -> OpCost:
    """FLOPs and HBM bytes of one flash kernel, forward and backward (module docstring), with
    16-bit (``train``) operands and an fp32 log-sum-exp."""
    bh, s_q, s_k, d, d_v = shape
    flops = 2.0 * bh * s_q * s_k * (d + d_v) * (0.5 if causal else 1.0)
    q = bh * s_q * d * train.itemsize
    kv = bh * s_k * (d + d_v) * train.itemsize
    o = bh * s_q * d_v * train.itemsize
    lse = bh * s_q * LSE_BYTES
    fwd_bytes = q + kv + o + lse
    # backward: read Q, K, V, O, dO and the log-sum-exp, write dQ, dK, dV
    bwd_bytes = 2 * (q + kv) + 2 * o + lse
    kind = "causal" if causal else "full"
    return OpCost(flops, float(fwd_bytes), BACKWARD_FLOP_RATIO * flops, float(bwd_bytes),
                  f"flash attention ({kind}, FlashAttention-2 kernel)")


def flash_times_s(shape: FlashShape, causal: bool, cost: OpCost, peak: float, hbm: float,
                  law: FlashLaw = H100_FLASH, scale: tuple[float, float] = (1.0, 1.0)) -> tuple[float, float]:
    """(forward, backward) seconds of one flash kernel (module docstring).

    Parameters
    ----------
    shape, causal, cost
        The problem (:func:`flash_shape`), its causality and its :func:`flash_cost`.
    peak
        Dense peak of the GPU in the training dtype (FLOP/s).
    hbm
        HBM bytes/s memory-bound kernels reach (bandwidth x HBM efficiency).
    law
        The fitted constants (:data:`H100_FLASH`).
    scale
        (forward, backward) time scales a calibrated GPU carries (``attention_fwd``,
        ``attention_bwd``: :mod:`dml2comm.cost.calibrated`, fitted by ``python main.py
        calibrate`` on the user's own flash kernels); 1 without one.
    """
    d = 0.5 * (shape.d + shape.d_v)
    work = cost.flops_fwd * ((1.0 + FLASH_BLOCK / shape.s_k) if causal else 1.0)
    e_f = law.fwd_e_max * d / (d + law.fwd_d0)
    e_b = law.bwd_e_max * d / (d + law.bwd_d0)
    fwd = law.fwd_latency_s + max(work / (peak * e_f), cost.bytes_fwd / hbm)
    memory_side = law.bwd_bytes_per_element * shape.bh * shape.s_q * shape.d / hbm
    bwd = max(BACKWARD_FLOP_RATIO * work / (peak * e_b), cost.bytes_bwd / hbm) + memory_side
    return fwd * scale[0], bwd * scale[1]


def flash_saved_lse_bytes(shape: FlashShape) -> float:
    """Bytes of the log-sum-exp a flash kernel saves for its backward: ``b h s_q`` fp32."""
    return float(shape.bh * shape.s_q * LSE_BYTES)
