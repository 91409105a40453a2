"""Cost rules for matrix products and attention: MatMul, Gemm, Einsum, Attention and the
ONNX Runtime (``com.microsoft``) attention kernels.

Conventions
-----------
- A multiply-add is 2 FLOPs, so ``[.., M, K] x [.., K, N]`` costs ``2 * batch * M * K * N`` with
  the batch dimensions broadcast as in numpy (Narayanan et al. 2021, arXiv:2104.04473, Sec. 5.1
  and the appendix derivation of eq. (3); the same 2-FLOPs-per-MAC count as the DeepSpeed flops
  profiler, ``deepspeed/profiling/flops_profiler/profiler.py``, ``_matmul_flops_compute``).
  1-D operands follow the ONNX MatMul / ``numpy.matmul`` rules: a 1-D ``A`` is ``[1, K]`` and a
  1-D ``B`` is ``[K, 1]``, the inserted dimension being dropped from the result.
- Gemm ``Y = alpha * A' B' + beta * C`` honours ``transA``/``transB``; the bias adds ``M * N``
  FLOPs when ``C`` is present, and a non-unit ``alpha`` (or ``beta`` with ``C``) one multiply per
  output element each.
- Einsum is parsed (explicit ``->`` or implicit output, ``...`` broadcasting) and costed with
  numpy's own counting rule (``numpy/_core/einsumfunc.py``, ``_flop_count``): contracting two
  operands over the set ``I`` of all their distinct indices costs ``2 * prod(size[i] for i in I)``
  when some index is summed away, ``prod(...)`` (multiplies only) when none is.  Three or more
  operands are contracted pairwise left to right, the order ``torch.einsum`` uses without
  ``opt_einsum``.  A one-operand Einsum costs the additions of its reduction, or nothing for a
  pure permutation/diagonal.
- Backward of every op here is 2x its forward FLOPs (gradient w.r.t. each operand is one more
  product of the same size; Narayanan et al. 2021, derivation of eq. (3): "the backward pass ...
  2x the forward").  dml2comm applies 2x to every matmul-like op (DESIGN.md, section 3) even
  when one operand is data that needs no gradient (a first layer's input).  Backward bytes: read the output gradient and both operands, write the
  gradients of both operands (and of a Gemm bias).
- Attention (``Attention``, ``MultiHeadAttention``, ``GroupQueryAttention``) counts
  ``Q K^T`` and ``P V`` as matmuls, the softmax as in :func:`~dml2comm.ops._common.softmax_flops`
  (``5 n - 2 rows``), plus one op per score for the scale, one for each mask/bias added, and 3
  for a soft cap (``c * tanh(s / c)``).  The full ``Sq x Sk`` score matrix is counted even when
  causal, as in Narayanan et al. 2021 eq. (3) (``4 B s^2 h`` per layer forward).  Bytes assume a
  fused kernel that keeps the scores on chip (FlashAttention; Dao et al. 2022, arXiv:2205.14135):
  forward reads Q, K, V and masks and writes the outputs; backward reads Q, K, V, masks, the
  output and its gradient and writes dQ, dK, dV.  Backward FLOPs are 2x forward like the other
  matmul-like ops (FlashAttention's recomputation of ``Q K^T`` is extra hardware work not counted
  as model FLOPs).
"""

from __future__ import annotations

import math
import string
from typing import Sequence

from dml2comm.errors import ModelError
from dml2comm.ir.graph import Op, Tensor
from dml2comm.ops._common import broadcast_shape, nbytes, require, softmax_flops, tensor_at, total_bytes
from dml2comm.ops.registry import OpCost, cost_rule, io_bytes

__all__ = [
    "matmul",
    "gemm",
    "einsum",
    "attention",
    "multi_head_attention",
    "group_query_attention",
    "matmul_dims",
    "einsum_flops",
    "attention_core_flops",
]

#: Backward FLOPs of matmul-like ops as a multiple of forward (Narayanan et al. 2021, eq. (3)).
MATMUL_BWD_FACTOR = 2

_MICROSOFT = "com.microsoft"


def _matmul_like_cost(
    flops_fwd: float, operands: Sequence[Tensor | None], outputs: Sequence[Tensor | None], rule: str
) -> OpCost:
    """Forward: operands read, outputs written.  Backward: 2x FLOPs; read dY and the operands,
    write one gradient per operand."""
    y = tensor_at(outputs, 0)
    bwd_bytes = nbytes(y) + 2 * total_bytes(operands)
    return OpCost(float(flops_fwd), io_bytes(operands, outputs), float(MATMUL_BWD_FACTOR * flops_fwd), float(bwd_bytes), rule)


def matmul_dims(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, int, int, int]:
    """``(batch, M, K, N)`` of ``numpy.matmul(A, B)`` for shapes ``a`` and ``b``.

    Raises
    ------
    ModelError
        A scalar operand, mismatched inner dimensions, or batch dimensions that do not broadcast.
    """
    if not a or not b:
        raise ModelError(f"MatMul operands must have rank >= 1, got {a} and {b}")
    a2 = (1, *a) if len(a) == 1 else a
    b2 = (*b, 1) if len(b) == 1 else b
    m, k = a2[-2], a2[-1]
    k_b, n = b2[-2], b2[-1]
    if k != k_b:
        raise ModelError(f"MatMul inner dimensions differ: {a} x {b}")
    batch = math.prod(broadcast_shape([a2[:-2], b2[:-2]]))
    return batch, m, k, n


@cost_rule("MatMul")
def matmul(op: Op, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor | None]) -> OpCost:
    """``Y = A @ B``: ``2 * batch * M * K * N`` FLOPs (ONNX MatMul, numpy semantics)."""
    a = require(op, inputs, 0, "A")
    b = require(op, inputs, 1, "B")
    batch, m, k, n = matmul_dims(a.shape, b.shape)
    return _matmul_like_cost(2 * batch * m * k * n, (a, b), outputs, "matmul")


@cost_rule("Gemm")
def gemm(op: Op, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor | None]) -> OpCost:
    """``Y = alpha * A' B' + beta * C`` (ONNX Gemm): ``2 M K N`` plus ``M N`` per extra term.

    ``A'`` is ``A`` or ``A^T`` (``transA``), ``B'`` likewise; ``A'`` is ``[M, K]`` and ``B'`` is
    ``[K, N]``.  Adding ``C`` costs ``M N``; ``alpha != 1`` and (with ``C``) ``beta != 1`` cost
    ``M N`` multiplies each.  Backward is 2x forward; it writes dA, dB and dC.
    """
    a = require(op, inputs, 0, "A")
    b = require(op, inputs, 1, "B")
    c = tensor_at(inputs, 2)
    if a.rank != 2 or b.rank != 2:
        raise ModelError(f"Gemm node {op.name!r}: A and B must be 2-D, got {a.shape} and {b.shape}")
    m, k = (a.shape[1], a.shape[0]) if op.attr("transA", 0) else a.shape
    k_b, n = (b.shape[1], b.shape[0]) if op.attr("transB", 0) else b.shape
    if k != k_b:
        raise ModelError(f"Gemm node {op.name!r}: inner dimensions differ ({a.shape}, {b.shape}, transA/transB)")
    flops = 2 * m * k * n
    if float(op.attr("alpha", 1.0)) != 1.0:
        flops += m * n
    if c is not None:
        flops += m * n
        if float(op.attr("beta", 1.0)) != 1.0:
            flops += m * n
    y = tensor_at(outputs, 0)
    bwd_bytes = nbytes(y) + 2 * (a.nbytes + b.nbytes) + nbytes(c)
    return OpCost(float(flops), io_bytes(inputs, outputs), float(MATMUL_BWD_FACTOR * flops), float(bwd_bytes), "gemm")


# --------------------------------------------------------------------------- Einsum


def _einsum_operand_labels(
    terms: list[str], shapes: list[tuple[int, ...]], op: Op
) -> tuple[list[list[str]], int]:
    """Per-operand index labels (ellipsis dimensions named ``...0``, ``...1`` right-aligned)."""
    letters = set(string.ascii_letters)
    parsed: list[tuple[str, int, str]] = []
    for term, shape in zip(terms, shapes):
        head, dots, tail = term.partition("...")
        n_ell = len(shape) - len(head) - len(tail) if dots else 0
        if not set(head + tail) <= letters or n_ell < 0 or (not dots and len(term) != len(shape)):
            raise ModelError(f"Einsum node {op.name!r}: term {term!r} does not match operand shape {shape}")
        parsed.append((head, n_ell, tail))
    max_ell = max((n for _, n, _ in parsed), default=0)
    labels = [
        [*head, *(f"...{max_ell - n_ell + i}" for i in range(n_ell)), *tail] for head, n_ell, tail in parsed
    ]
    return labels, max_ell


def _einsum_output_labels(rhs: str | None, operands: list[list[str]], max_ell: int, op: Op) -> list[str]:
    ellipsis = [f"...{i}" for i in range(max_ell)]
    if rhs is None:  # implicit mode: ellipsis dims, then letters seen exactly once, sorted (ONNX Einsum)
        counts: dict[str, int] = {}
        for labels in operands:
            for label in labels:
                if not label.startswith("..."):
                    counts[label] = counts.get(label, 0) + 1
        return ellipsis + sorted(label for label, c in counts.items() if c == 1)
    head, dots, tail = rhs.partition("...")
    if not set(head + tail) <= set(string.ascii_letters):
        raise ModelError(f"Einsum node {op.name!r}: bad output term {rhs!r}")
    return [*head, *(ellipsis if dots else []), *tail]


def _einsum_sizes(operands: list[list[str]], shapes: list[tuple[int, ...]], op: Op) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for labels, shape in zip(operands, shapes):
        for label, size in zip(labels, shape):
            old = sizes.get(label, 1)
            if size != 1 and old not in (1, size):
                raise ModelError(f"Einsum node {op.name!r}: index {label!r} has sizes {old} and {size}")
            sizes[label] = max(old, size)
    return sizes


def einsum_flops(equation: str, shapes: Sequence[tuple[int, ...]], op: Op | None = None) -> int:
    """FLOPs of ``einsum(equation, *operands)`` with the given operand shapes.

    Pairwise, left to right: each step over index set ``I`` costs ``prod(size[I])`` multiplies
    plus as many adds when an index is summed away (numpy ``_flop_count``).  One operand: the
    adds of its reduction only.

    Raises
    ------
    ModelError
        The equation does not match the operand shapes.
    """
    op = op or Op(index=-1, name="einsum", op_type="Einsum", domain="", inputs=(), outputs=())
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    shapes = [tuple(s) for s in shapes]
    if len(terms) != len(shapes):
        raise ModelError(f"Einsum node {op.name!r}: equation {equation!r} has {len(terms)} terms for {len(shapes)} operands")
    operands, max_ell = _einsum_operand_labels(terms, shapes, op)
    output = _einsum_output_labels(rhs if arrow else None, operands, max_ell, op)
    sizes = _einsum_sizes(operands, shapes, op)
    if not set(output) <= set(sizes):
        raise ModelError(f"Einsum node {op.name!r}: output term of {equation!r} names an index no operand has")

    def size(labels: set[str]) -> int:
        return math.prod(sizes[label] for label in labels)

    if len(operands) == 1:
        labels, out = set(operands[0]), set(output)
        return size(labels) - size(out) if labels - out else 0
    total = 0
    current = set(operands[0])
    for i in range(1, len(operands)):
        involved = current | set(operands[i])
        later = set(output).union(*map(set, operands[i + 1 :]))
        kept = involved & later
        total += size(involved) * (2 if involved - kept else 1)
        current = kept
    return total


@cost_rule("Einsum")
def einsum(op: Op, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor | None]) -> OpCost:
    """ONNX Einsum: FLOPs from the parsed ``equation`` (see :func:`einsum_flops`)."""
    equation = op.attr("equation")
    if not isinstance(equation, str):
        raise ModelError(f"Einsum node {op.name!r} has no 'equation' attribute")
    operands = [require(op, inputs, i, f"operand {i}") for i in range(len(inputs))]
    flops = einsum_flops(equation, [t.shape for t in operands], op)
    return _matmul_like_cost(flops, operands, outputs, "einsum")


# --------------------------------------------------------------------------- attention


def attention_core_flops(b: int, hq: int, sq: int, sk: int, d_qk: int, d_v: int, score_ops: int) -> int:
    """FLOPs of ``softmax(scale * Q K^T + masks) V`` for ``hq`` query heads.

    ``2 b hq sq sk d_qk`` (scores) + ``2 b hq sq sk d_v`` (weighted sum of values) + softmax
    ``5 n - 2 rows`` over ``n = b hq sq sk`` scores in ``rows = b hq sq`` rows + ``score_ops``
    element-wise ops per score (scale, masks, soft cap).  Grouped-query attention shares K/V
    heads but every query head still does its own products, so the count depends on ``hq``
    only.
    """
    scores = b * hq * sq * sk
    return 2 * scores * d_qk + 2 * scores * d_v + softmax_flops(scores, b * hq * sq) + score_ops * scores


def _attention_cost(
    flops_fwd: int,
    qkv: Sequence[Tensor | None],
    others: Sequence[Tensor | None],
    outputs: Sequence[Tensor | None],
    rule: str,
) -> OpCost:
    """Fused-kernel bytes: forward reads ``qkv`` and ``others`` and writes ``outputs``; backward
    reads them and the first output and its gradient, and writes a gradient per ``qkv`` tensor."""
    y = tensor_at(outputs, 0)
    fwd_bytes = io_bytes([*qkv, *others], outputs)
    bwd_bytes = 2 * total_bytes(qkv) + total_bytes(others) + 2 * nbytes(y)
    return OpCost(float(flops_fwd), fwd_bytes, float(MATMUL_BWD_FACTOR * flops_fwd), float(bwd_bytes), rule)


def _heads_attr(op: Op, key: str) -> int:
    value = op.attr(key)
    if not isinstance(value, int) or value <= 0:
        raise ModelError(f"{op.op_type} node {op.name!r}: 3-D inputs need a positive {key!r} attribute")
    return value


def _score_ops(scale: bool, masks: int, softcap: float) -> int:
    """Element-wise ops per score: scale (1), each additive mask or bias (1), soft cap (3)."""
    return int(scale) + masks + (3 if softcap > 0 else 0)


def _onnx_attention(op: Op, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor | None]) -> OpCost:
    """ONNX Attention (opset 23+): Q, K, V as ``[B, H, S, D]`` or ``[B, S, H*D]``."""
    q = require(op, inputs, 0, "Q")
    k = require(op, inputs, 1, "K")
    v = require(op, inputs, 2, "V")
    mask, past_k, past_v = tensor_at(inputs, 3), tensor_at(inputs, 4), tensor_at(inputs, 5)
    if q.rank == 4:
        b, hq, sq, d_qk = q.shape
    elif q.rank == 3:
        hq = _heads_attr(op, "q_num_heads")
        b, sq, d_qk = q.shape[0], q.shape[1], q.shape[2] // hq
    else:
        raise ModelError(f"Attention node {op.name!r}: Q must be 3-D or 4-D, got {q.shape}")
    if v.rank == 4:
        skv, d_v = k.shape[2], v.shape[3]
    else:
        skv, d_v = k.shape[1], v.shape[2] // _heads_attr(op, "kv_num_heads")
    present_k = tensor_at(outputs, 1)
    if present_k is not None and present_k.rank == 4:
        sk = present_k.shape[2]
    else:
        sk = skv + (past_k.shape[2] if past_k is not None else 0)
    masks = int(mask is not None) + int(bool(op.attr("is_causal", 0)))
    flops = attention_core_flops(b, hq, sq, sk, d_qk, d_v, _score_ops(True, masks, float(op.attr("softcap", 0.0))))
    return _attention_cost(flops, (q, k, v), (mask, past_k, past_v, tensor_at(inputs, 6)), outputs, "attention")


def _microsoft_attention(op: Op, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor | None]) -> OpCost:
    """ORT ``com.microsoft.Attention``: packed QKV projection of ``input`` then attention.

    ``input [B, S, Hin]``, ``weights [Hin, Dq + Dk + Dv]`` (``qkv_hidden_sizes``, else three
    equal parts), ``bias``, ``mask_index``, ``past [2, B, N, Sp, D]``, ``attention_bias``.
    The projection is a Gemm: ``2 B S Hin (Dq+Dk+Dv)`` plus ``B S (Dq+Dk+Dv)`` for the bias.
    """
    x = require(op, inputs, 0, "input")
    w = require(op, inputs, 1, "weights")
    bias, mask, past, attn_bias = (tensor_at(inputs, i) for i in (2, 3, 4, 5))
    heads = _heads_attr(op, "num_heads")
    if x.rank != 3 or w.rank != 2:
        raise ModelError(f"Attention node {op.name!r}: input must be [B, S, H] and weights 2-D, got {x.shape}, {w.shape}")
    b, s, h_in = x.shape
    total = w.shape[1]
    sizes = op.attr("qkv_hidden_sizes") or (total // 3, total // 3, total - 2 * (total // 3))
    d_q, _, d_v = (int(v) for v in sizes)
    present = tensor_at(outputs, 1)
    if present is not None and present.rank == 5:
        sk = present.shape[3]
    else:
        sk = s + (past.shape[3] if past is not None else 0)
    masks = int(mask is not None or bool(op.attr("unidirectional", 0))) + int(attn_bias is not None)
    flops = 2 * b * s * h_in * total + (b * s * total if bias is not None else 0)
    flops += attention_core_flops(b, heads, s, sk, d_q // heads, d_v // heads, _score_ops(True, masks, 0.0))
    return _attention_cost(flops, (x, w, bias), (mask, past, attn_bias), outputs, "attention")


@cost_rule("Attention")
def attention(op: Op, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor | None]) -> OpCost:
    """ONNX Attention (opset 23+), or ORT's ``com.microsoft.Attention`` (chosen by domain)."""
    if op.domain == _MICROSOFT:
        return _microsoft_attention(op, inputs, outputs)
    return _onnx_attention(op, inputs, outputs)


@cost_rule("MultiHeadAttention")
def multi_head_attention(op: Op, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor | None]) -> OpCost:
    """ORT ``com.microsoft.MultiHeadAttention``.

    ``query [B, Sq, N*D]`` (or packed ``[B, S, N, 3, D]``), ``key`` ``[B, Skv, N*D]``,
    ``[B, N, Skv, D]`` or packed ``[B, Skv, N, 2, D]``, ``value``, ``bias [3 N D]``,
    ``key_padding_mask``, ``attention_bias``, ``past_key``, ``past_value``; output
    ``[B, Sq, N*Dv]``.  The total key length is ``present_key``'s when that output exists.
    A bias adds one FLOP per element of Q, K and V.
    """
    q = require(op, inputs, 0, "query")
    k, v, bias, kpm, attn_bias, past_k, past_v = (tensor_at(inputs, i) for i in range(1, 8))
    heads = _heads_attr(op, "num_heads")
    if q.rank not in (3, 5):
        raise ModelError(f"MultiHeadAttention node {op.name!r}: query must be 3-D or packed 5-D, got {q.shape}")
    b, sq = q.shape[0], q.shape[1]
    d_qk = q.shape[4] if q.rank == 5 else q.shape[2] // heads
    if v is None:  # packed QKV or KV: V has Q's head size
        d_v = d_qk
    else:
        d_v = v.shape[3] if v.rank == 4 else v.shape[2] // heads
    if k is None:
        skv = sq
    elif k.rank == 4:
        skv = k.shape[2]
    else:
        skv = k.shape[1]
    present_k = tensor_at(outputs, 1)
    if present_k is not None and present_k.rank == 4:
        sk = present_k.shape[2]
    else:
        sk = skv + (past_k.shape[2] if past_k is not None and k is not None and k.rank == 3 else 0)
    masks = int(kpm is not None) + int(attn_bias is not None)
    flops = attention_core_flops(b, heads, sq, sk, d_qk, d_v, _score_ops(True, masks, 0.0))
    if bias is not None:
        flops += b * heads * (sq * d_qk + skv * (d_qk + d_v))
    return _attention_cost(flops, (q, k, v), (bias, kpm, attn_bias, past_k, past_v), outputs, "attention")


@cost_rule("GroupQueryAttention")
def group_query_attention(op: Op, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor | None]) -> OpCost:
    """ORT ``com.microsoft.GroupQueryAttention``.

    ``query [B, S, Nq*D]`` (or packed ``[B, S, (Nq + 2 Nkv) D]`` when ``key`` is omitted),
    ``key``/``value`` ``[B, S, Nkv*D]``, ``past_key [B, Nkv, Sp, D]``, ..., ``cos_cache``,
    ``sin_cache``.  The kernel is always causal (one mask op per score).  With ``do_rotary`` the
    rotation of Q and K costs 3 FLOPs per rotated element (see :mod:`~dml2comm.ops.elementwise`,
    RotaryEmbedding).  ``local_window_size`` is not discounted (the full score matrix is counted,
    as for causal masks).
    """
    q = require(op, inputs, 0, "query")
    k, v, past_k, past_v = (tensor_at(inputs, i) for i in (1, 2, 3, 4))
    cos_cache = tensor_at(inputs, 7)
    heads = _heads_attr(op, "num_heads")
    kv_heads = _heads_attr(op, "kv_num_heads")
    if q.rank != 3:
        raise ModelError(f"GroupQueryAttention node {op.name!r}: query must be [B, S, width], got {q.shape}")
    b, s, width = q.shape
    d = width // heads if k is not None else width // (heads + 2 * kv_heads)
    present_k = tensor_at(outputs, 1)
    if present_k is not None and present_k.rank == 4:
        sk = present_k.shape[2]
    else:
        sk = s + (past_k.shape[2] if past_k is not None else 0)
    flops = attention_core_flops(b, heads, s, sk, d, d, _score_ops(True, 1, float(op.attr("softcap", 0.0))))
    if op.attr("do_rotary", 0):
        rot = 2 * cos_cache.shape[-1] if cos_cache is not None else d
        flops += 3 * b * s * (heads + kv_heads) * rot
    others = (past_k, past_v, *(tensor_at(inputs, i) for i in range(5, len(inputs))))
    return _attention_cost(flops, (q, k, v), others, outputs, "attention")
