"""Cost rules for normalisations: LayerNormalization, RMSNormalization, BatchNormalization,
InstanceNormalization, GroupNormalization, Softmax, LogSoftmax, and ONNX Runtime's
``SimplifiedLayerNormalization``, ``SkipLayerNormalization`` and
``SkipSimplifiedLayerNormalization``.

Conventions
-----------
- **Forward FLOPs are counted on the ONNX function body of each op**, with the element-wise
  and reduction conventions of :mod:`~dml2comm.ops.elementwise` and :mod:`~dml2comm.ops.reduce`
  (1 FLOP per primitive op; a ReduceMean over ``L`` elements is ``L - 1`` adds and a divide, so
  ``L``).  For ``n`` elements in ``rows`` normalised groups:

  - LayerNormalization-17 (ReduceMean, Sub, Mul, ReduceMean, Add eps, Sqrt, Reciprocal, Mul,
    Mul Scale, Add B): ``7 n + 3 rows``; ``6 n + 3 rows`` without ``B``.  (fvcore's
    ``norm_flop_counter`` and DeepSpeed's ``_layer_norm_flops_compute`` use the rougher "5 per
    element with affine".)
  - RMSNormalization-23 (Mul, ReduceMean, Add eps, Sqrt, Div, Mul Scale): ``4 n + 2 rows``; ORT's
    SimplifiedLayerNormalization computes the same (``x / sqrt(mean(x^2) + eps) * scale``).
  - BatchNormalization in training (batch statistics; the mode dml2comm analyses, whatever
    ``training_mode`` the export recorded): as LayerNorm over ``rows = C`` channels,
    ``7 n + 3 C``, plus the running-statistics update ``r = m r + (1 - m) s`` (3 FLOPs) for mean
    and variance, ``6 C``.  InstanceNormalization (``rows = N C``) and GroupNormalization
    (``rows = N num_groups``) as LayerNorm with ``B``.
  - Softmax-13 (ReduceMax, Sub, Exp, ReduceSum, Div): ``5 n - 2 rows``; LogSoftmax-13
    (ReduceMax, Sub, Exp, ReduceSum, Log, Sub): ``5 n - rows``.  ``rows = n / shape[axis]``
    (opset >= 13 semantics; PyTorch exports use opset >= 14).
- **Backward FLOPs**: normalisations 2x forward.  The explicit LayerNorm gradient
  ``dx = inv_std (g - mean(g) - x_hat mean(g x_hat))`` with ``g = dy * Scale``, recomputing
  ``x_hat``, plus ``dScale = sum(dy x_hat)`` and ``dB = sum(dy)``, is about 13 FLOPs per element
  against 7 forward; 2x is that, rounded (DESIGN.md: "per-op rules otherwise").  Softmax
  backward ``dx = y (dy - sum(dy y))`` is ``4 n - rows``; LogSoftmax backward
  ``dx = dy - exp(y) sum(dy)`` is ``4 n - rows`` too.
- **Bytes**: forward reads the inputs and writes the outputs once (a fused kernel).  Backward
  reads the output gradient, ``X`` and ``Scale`` (and the saved statistics when the graph
  exposes them), and writes the gradients of ``X``, ``Scale`` and ``B``.  Softmax backward reads
  ``dY`` and the saved output ``Y`` and writes ``dX``.
"""

from __future__ import annotations

import dataclasses

import math
from typing import Sequence

from dml2comm.errors import ModelError
from dml2comm.ir.graph import Op, Tensor
from dml2comm.ops._common import backward_bytes, nbytes, needs_grad, positive_axis, require, softmax_flops, tensor_at
from dml2comm.ops.registry import OpCost, cost_rule, io_bytes

__all__ = [
    "layer_norm_flops",
    "rms_norm_flops",
    "layer_normalization",
    "rms_normalization",
    "skip_layer_normalization",
    "skip_simplified_layer_normalization",
    "batch_normalization",
    "instance_normalization",
    "group_normalization",
    "softmax",
    "log_softmax",
]

#: Backward FLOPs of a normalisation as a multiple of forward (see the module docstring).
NORM_BWD_FACTOR = 2


def layer_norm_flops(n: int, rows: int, has_bias: bool) -> int:
    """LayerNormalization-17 function body: ``6 n + 3 rows``, ``+ n`` for the bias ``B``."""
    return 6 * n + 3 * rows + (n if has_bias else 0)


def rms_norm_flops(n: int, rows: int) -> int:
    """RMSNormalization-23 function body: ``4 n + 2 rows``."""
    return 4 * n + 2 * rows


def _rows(op: Op, x: Tensor, default_axis: int = -1) -> int:
    """Number of normalised groups: ``prod(X.shape[:axis])``."""
    axis = positive_axis(int(op.attr("axis", default_axis)), x.rank, op)
    return math.prod(x.shape[:axis])


def _norm_cost(
    flops: int,
    bwd_flops: int,
    inputs: Sequence[Tensor | None],
    outputs: Sequence[Tensor | None],
    *,
    grad_out: Sequence[Tensor | None],
    saved: Sequence[Tensor | None],
    grads_of: Sequence[Tensor | None],
    rule: str = "normalization",
) -> OpCost:
    """Forward: inputs read, outputs written.  Backward (when any of ``grads_of`` needs a
    gradient): ``bwd_flops``; read ``grad_out`` gradients and ``saved``, write the gradients."""
    fwd = io_bytes(inputs, outputs)
    if not any(needs_grad(t) for t in grads_of):
        return OpCost(float(flops), fwd, 0.0, 0.0, rule)
    return OpCost(float(flops), fwd, float(bwd_flops), backward_bytes(grad_out, saved, grads_of), rule)


@cost_rule("LayerNormalization")
def layer_normalization(op: Op, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor | None]) -> OpCost:
    """LayerNormalization over axes ``[axis, rank)``: ``7 n + 3 rows`` FLOPs (``6 n`` without B)."""
    x = require(op, inputs, 0, "X")
    scale, bias = tensor_at(inputs, 1), tensor_at(inputs, 2)
    flops = layer_norm_flops(x.numel, _rows(op, x), bias is not None)
    return _norm_cost(
        flops, NORM_BWD_FACTOR * flops, inputs, outputs, grad_out=outputs, saved=(x, scale), grads_of=(x, scale, bias)
    )


@cost_rule("RMSNormalization", "SimplifiedLayerNormalization")
def rms_normalization(op: Op, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor | None]) -> OpCost:
    """RMS normalisation over axes ``[axis, rank)``: ``4 n + 2 rows`` FLOPs."""
    x = require(op, inputs, 0, "X")
    scale = tensor_at(inputs, 1)
    flops = rms_norm_flops(x.numel, _rows(op, x))
    return _norm_cost(flops, NORM_BWD_FACTOR * flops, inputs, outputs, grad_out=outputs, saved=(x, scale), grads_of=(x, scale))


def _skip_grad_outputs(outputs: Sequence[Tensor | None]) -> tuple[Tensor | None, ...]:
    """Outputs of the Skip* norms that receive a gradient: the normalised ``output`` and the
    residual sum ``input_skip_bias_sum`` (position 3), which feeds the next residual add."""
    return (tensor_at(outputs, 0), tensor_at(outputs, 3))


@cost_rule("SkipLayerNormalization")
def skip_layer_normalization(op: Op, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor | None]) -> OpCost:
    """ORT ``SkipLayerNormalization(input, skip, gamma, beta, bias)``: LayerNorm of
    ``input + skip (+ bias)`` over the last axis: ``n`` (+ ``n``) adds plus LayerNorm."""
    x = require(op, inputs, 0, "input")
    skip, gamma, beta, bias = (tensor_at(inputs, i) for i in (1, 2, 3, 4))
    rows = x.numel // x.shape[-1] if x.rank else 1
    flops = x.numel * (1 + int(bias is not None)) + layer_norm_flops(x.numel, rows, beta is not None)
    saved = (x, gamma)  # the pre-norm sum, saved by the kernel, has the size of ``input``
    return _norm_cost(
        flops,
        NORM_BWD_FACTOR * flops,
        inputs,
        outputs,
        grad_out=_skip_grad_outputs(outputs),
        saved=saved,
        grads_of=(x, skip, gamma, beta, bias),
    )


@cost_rule("SkipSimplifiedLayerNormalization")
def skip_simplified_layer_normalization(op: Op, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor | None]) -> OpCost:
    """ORT ``SkipSimplifiedLayerNormalization(input, skip, gamma, bias)``: RMS norm of
    ``input + skip (+ bias)``."""
    x = require(op, inputs, 0, "input")
    skip, gamma, bias = (tensor_at(inputs, i) for i in (1, 2, 3))
    rows = x.numel // x.shape[-1] if x.rank else 1
    flops = x.numel * (1 + int(bias is not None)) + rms_norm_flops(x.numel, rows)
    return _norm_cost(
        flops,
        NORM_BWD_FACTOR * flops,
        inputs,
        outputs,
        grad_out=_skip_grad_outputs(outputs),
        saved=(x, gamma),
        grads_of=(x, skip, gamma, bias),
    )


@cost_rule("BatchNormalization")
def batch_normalization(op: Op, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor | None]) -> OpCost:
    """Training-mode BatchNorm over ``C`` channels: ``7 n + 3 C`` + ``6 C`` running statistics;
    backward 2x the normalisation (``7 n + 3 C``); bytes with the statistics' extra passes (below)."""
    x = require(op, inputs, 0, "X")
    scale, bias = tensor_at(inputs, 1), tensor_at(inputs, 2)
    if x.rank < 2:
        raise ModelError(f"BatchNormalization node {op.name!r}: X must be [N, C, ...], got {x.shape}")
    channels = x.shape[1]
    normalise = layer_norm_flops(x.numel, channels, True)
    flops = normalise + 6 * channels
    cost = _norm_cost(
        flops, NORM_BWD_FACTOR * normalise, inputs, outputs, grad_out=outputs[:1], saved=(x, scale), grads_of=(x, scale, bias)
    )
    # Batch statistics need a whole pass over X before any element can be normalised, so a
    # training BatchNorm reads X twice forward (PyTorch's CUDA batch norm:
    # batch_norm_collect_statistics_kernel, then batch_norm_transform_input_kernel;
    # aten/src/ATen/native/cuda/Normalization.cuh) and reads X and dY twice backward
    # (batch_norm_backward_reduce_kernel for the two channel sums, then
    # batch_norm_backward_elemt_kernel for dX): one more read of X forward, of X and dY backward.
    dy = nbytes(outputs[0]) if outputs and outputs[0] is not None else 0
    extra_bwd = (nbytes(x) + dy) if cost.flops_bwd else 0.0
    return dataclasses.replace(cost, bytes_fwd=cost.bytes_fwd + nbytes(x), bytes_bwd=cost.bytes_bwd + extra_bwd)


@cost_rule("InstanceNormalization")
def instance_normalization(op: Op, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor | None]) -> OpCost:
    """Per-(sample, channel) normalisation with scale and bias: ``7 n + 3 N C``."""
    x = require(op, inputs, 0, "input")
    scale, bias = tensor_at(inputs, 1), tensor_at(inputs, 2)
    if x.rank < 2:
        raise ModelError(f"InstanceNormalization node {op.name!r}: input must be [N, C, ...], got {x.shape}")
    flops = layer_norm_flops(x.numel, x.shape[0] * x.shape[1], True)
    return _norm_cost(
        flops, NORM_BWD_FACTOR * flops, inputs, outputs, grad_out=outputs, saved=(x, scale), grads_of=(x, scale, bias)
    )


@cost_rule("GroupNormalization")
def group_normalization(op: Op, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor | None]) -> OpCost:
    """Per-(sample, group) normalisation with scale and bias: ``7 n + 3 N num_groups``."""
    x = require(op, inputs, 0, "X")
    scale, bias = tensor_at(inputs, 1), tensor_at(inputs, 2)
    groups = op.attr("num_groups")
    if not isinstance(groups, int) or groups <= 0 or x.rank < 2:
        raise ModelError(f"GroupNormalization node {op.name!r}: needs X [N, C, ...] and a positive 'num_groups'")
    flops = layer_norm_flops(x.numel, x.shape[0] * groups, True)
    return _norm_cost(
        flops, NORM_BWD_FACTOR * flops, inputs, outputs, grad_out=outputs, saved=(x, scale), grads_of=(x, scale, bias)
    )


def _softmax_like(op: Op, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor | None], log: bool) -> OpCost:
    x = require(op, inputs, 0, "input")
    n = x.numel
    axis = positive_axis(int(op.attr("axis", -1)), x.rank, op)
    rows = n // x.shape[axis] if x.rank and x.shape[axis] else n
    flops = softmax_flops(n, rows) + (rows if log else 0)
    y = tensor_at(outputs, 0)
    return _norm_cost(flops, 4 * n - rows, inputs, outputs, grad_out=outputs, saved=(y,), grads_of=(x,), rule="softmax")


@cost_rule("Softmax")
def softmax(op: Op, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor | None]) -> OpCost:
    """Softmax along ``axis``: ``5 n - 2 rows`` forward, ``4 n - rows`` backward."""
    return _softmax_like(op, inputs, outputs, log=False)


@cost_rule("LogSoftmax")
def log_softmax(op: Op, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor | None]) -> OpCost:
    """LogSoftmax along ``axis``: ``5 n - rows`` forward, ``4 n - rows`` backward."""
    return _softmax_like(op, inputs, outputs, log=True)
