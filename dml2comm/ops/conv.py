"""Cost rules for convolutions and pooling: Conv, ConvTranspose, MaxPool, AveragePool,
GlobalAveragePool, GlobalMaxPool.

Conventions
-----------
- Conv (ONNX ``X [N, Cin, *in]``, ``W [Cout, Cin/group, *k]``, ``Y [N, Cout, *out]``): every
  output element is a dot product of length ``(Cin/group) * prod(k)``, so
  ``FLOPs = 2 * N * Cout * prod(out) * (Cin/group) * prod(k)``, plus ``N * Cout * prod(out)``
  for the bias.  This is the DeepSpeed flops profiler's ``_conv_flops_compute`` (2 FLOPs per
  MAC, bias counted); fvcore's ``conv_flop_count`` is the same count in MACs without the bias.
  ``Cin/group`` is read from ``W.shape[1]``, so grouped and depthwise convolutions need no
  special case.
- ConvTranspose (``W [Cin, Cout/group, *k]``): every input element is scattered to
  ``(Cout/group) * prod(k)`` outputs: ``2 * N * Cin * prod(in) * (Cout/group) * prod(k)``
  (DeepSpeed ``_conv_trans_flops_compute``; fvcore uses the input spatial size for transposed
  convolutions too), plus ``N * Cout * prod(out)`` for the bias.
- Output spatial sizes come from the output tensor; when it is absent they are computed with the
  ONNX formulas (``pads``, ``strides``, ``dilations``, ``auto_pad``, ``ceil_mode``,
  ``output_padding``, ``output_shape``).
- Backward of Conv/ConvTranspose is 2x forward (data gradient + weight gradient, each a
  convolution of the forward's size; Narayanan et al. 2021, arXiv:2104.04473, derivation of
  eq. (3)); it reads dY, X and W and writes dX, dW and the bias gradient.
- Pooling over a window of ``p = prod(kernel_shape)`` elements: max pooling ``p - 1``
  comparisons per output element, average pooling ``p - 1`` adds and 1 divide (= ``p``).  The
  global variants use ``p = prod(X.shape[2:])``.  Max pooling in PyTorch training
  (``max_pool2d_with_indices``, ``adaptive_max_pool2d``) writes an int64 index per output element
  and its backward scatters ``dY`` through those indices (``numel(Y)`` adds), reading dY and the
  indices and writing dX; those index bytes are counted whether or not the ONNX graph exposes the
  ``Indices`` output.  Average-pooling backward spreads ``dY / p`` over each window, the same
  FLOPs as forward, reading dY and writing dX.
"""

from __future__ import annotations

import math
from typing import Sequence

from dml2comm.errors import ModelError
from dml2comm.ir.graph import Op, Tensor
from dml2comm.ops._common import grad_bytes, nbytes, needs_grad, require, tensor_at
from dml2comm.ops.registry import OpCost, cost_rule, io_bytes

__all__ = [
    "conv",
    "conv_transpose",
    "max_pool",
    "average_pool",
    "global_average_pool",
    "global_max_pool",
    "conv_output_spatial",
]

#: Backward FLOPs of convolutions as a multiple of forward (Narayanan et al. 2021, eq. (3)).
CONV_BWD_FACTOR = 2
#: Bytes of one saved max-pooling index (PyTorch stores int64 indices).
INDEX_BYTES = 8


def _ints(op: Op, key: str, default: Sequence[int]) -> tuple[int, ...]:
    value = op.attr(key)
    return tuple(int(v) for v in value) if value else tuple(default)


def conv_output_spatial(op: Op, in_spatial: Sequence[int], kernel: Sequence[int]) -> tuple[int, ...]:
    """Output spatial sizes of Conv/MaxPool/AveragePool per the ONNX operator spec.

    Explicit pads: ``floor((in + pad_begin + pad_end - ((k-1) d + 1)) / s) + 1`` (``ceil`` with
    ``ceil_mode``); ``SAME_UPPER``/``SAME_LOWER``: ``ceil(in / s)``; ``VALID``:
    ``floor((in - ((k-1) d + 1)) / s) + 1``.
    """
    rank = len(in_spatial)
    strides = _ints(op, "strides", [1] * rank)
    dilations = _ints(op, "dilations", [1] * rank)
    pads = _ints(op, "pads", [0] * (2 * rank))
    auto_pad = str(op.attr("auto_pad", "NOTSET"))
    rounding = math.ceil if op.attr("ceil_mode", 0) else math.floor
    out = []
    for i, (size, k) in enumerate(zip(in_spatial, kernel)):
        span = (k - 1) * dilations[i] + 1
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            out.append(math.ceil(size / strides[i]))
        elif auto_pad == "VALID":
            out.append((size - span) // strides[i] + 1)
        else:
            out.append(int(rounding((size + pads[i] + pads[i + rank] - span) / strides[i])) + 1)
    return tuple(out)


def _out_spatial(op: Op, x: Tensor, outputs: Sequence[Tensor | None], kernel: Sequence[int]) -> tuple[int, ...]:
    y = tensor_at(outputs, 0)
    if y is not None and y.rank == x.rank:
        return y.shape[2:]
    return conv_output_spatial(op, x.shape[2:], kernel)


def _conv_cost(
    flops: int, x: Tensor, w: Tensor, bias: Tensor | None, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor | None]
) -> OpCost:
    """Backward 2x forward; reads dY, X, W and writes dX, dW, dB."""
    y = tensor_at(outputs, 0)
    bwd_bytes = nbytes(y) + 2 * (x.nbytes + w.nbytes) + nbytes(bias)
    return OpCost(float(flops), io_bytes(inputs, outputs), float(CONV_BWD_FACTOR * flops), float(bwd_bytes), "conv")


@cost_rule("Conv")
def conv(op: Op, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor | None]) -> OpCost:
    """``2 N Cout prod(out) (Cin/group) prod(k)`` (+ ``N Cout prod(out)`` bias) FLOPs."""
    x = require(op, inputs, 0, "X")
    w = require(op, inputs, 1, "W")
    bias = tensor_at(inputs, 2)
    if x.rank < 3 or w.rank != x.rank:
        raise ModelError(f"Conv node {op.name!r}: X {x.shape} and W {w.shape} must be [N, C, ...] of equal rank")
    kernel = w.shape[2:]
    positions = x.shape[0] * w.shape[0] * math.prod(_out_spatial(op, x, outputs, kernel))
    flops = 2 * positions * w.shape[1] * math.prod(kernel) + (positions if bias is not None else 0)
    return _conv_cost(flops, x, w, bias, inputs, outputs)


def _conv_transpose_out_spatial(
    op: Op, x: Tensor, outputs: Sequence[Tensor | None], kernel: Sequence[int]
) -> tuple[int, ...]:
    y = tensor_at(outputs, 0)
    if y is not None and y.rank == x.rank:
        return y.shape[2:]
    given = _ints(op, "output_shape", [])
    if given:
        return given[-len(kernel) :]
    rank = len(kernel)
    strides = _ints(op, "strides", [1] * rank)
    dilations = _ints(op, "dilations", [1] * rank)
    pads = _ints(op, "pads", [0] * (2 * rank))
    out_pad = _ints(op, "output_padding", [0] * rank)
    if str(op.attr("auto_pad", "NOTSET")) in ("SAME_UPPER", "SAME_LOWER"):
        return tuple(size * s for size, s in zip(x.shape[2:], strides))
    return tuple(
        strides[i] * (size - 1) + out_pad[i] + (kernel[i] - 1) * dilations[i] + 1 - pads[i] - pads[i + rank]
        for i, size in enumerate(x.shape[2:])
    )


@cost_rule("ConvTranspose")
def conv_transpose(op: Op, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor | None]) -> OpCost:
    """``2 N Cin prod(in) (Cout/group) prod(k)`` (+ ``N Cout prod(out)`` bias) FLOPs."""
    x = require(op, inputs, 0, "X")
    w = require(op, inputs, 1, "W")
    bias = tensor_at(inputs, 2)
    if x.rank < 3 or w.rank != x.rank:
        raise ModelError(f"ConvTranspose node {op.name!r}: X {x.shape} and W {w.shape} must be [N, C, ...] of equal rank")
    kernel = w.shape[2:]
    flops = 2 * x.numel * w.shape[1] * math.prod(kernel)
    if bias is not None:
        c_out = w.shape[1] * int(op.attr("group", 1))
        flops += x.shape[0] * c_out * math.prod(_conv_transpose_out_spatial(op, x, outputs, kernel))
    return _conv_cost(flops, x, w, bias, inputs, outputs)


def _pooled(op: Op, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor | None]) -> tuple[Tensor, int, int]:
    """``(X, numel(Y), p)`` for a windowed pool with ``kernel_shape``."""
    x = require(op, inputs, 0, "X")
    kernel = _ints(op, "kernel_shape", [])
    if not kernel:
        raise ModelError(f"{op.op_type} node {op.name!r} has no 'kernel_shape' attribute")
    n_out = x.shape[0] * x.shape[1] * math.prod(_out_spatial(op, x, outputs, kernel))
    return x, n_out, math.prod(kernel)


def _max_pool_cost(x: Tensor, n_out: int, flops: int, outputs: Sequence[Tensor | None]) -> OpCost:
    indices = tensor_at(outputs, 1)
    index_bytes = nbytes(indices) if indices is not None else INDEX_BYTES * n_out
    y = tensor_at(outputs, 0)
    fwd = float(x.nbytes + nbytes(y) + index_bytes)
    if not needs_grad(x):
        return OpCost(float(flops), fwd, 0.0, 0.0, "pool")
    bwd_bytes = nbytes(y) + index_bytes + x.nbytes
    return OpCost(float(flops), fwd, float(n_out), float(bwd_bytes), "pool")


def _avg_pool_cost(x: Tensor, flops: int, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor | None]) -> OpCost:
    fwd = io_bytes(inputs, outputs)
    if not needs_grad(x):
        return OpCost(float(flops), fwd, 0.0, 0.0, "pool")
    bwd_bytes = nbytes(tensor_at(outputs, 0)) + grad_bytes([x])
    return OpCost(float(flops), fwd, float(flops), float(bwd_bytes), "pool")


@cost_rule("MaxPool")
def max_pool(op: Op, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor | None]) -> OpCost:
    """``numel(Y) (p - 1)`` comparisons; saved int64 indices; backward ``numel(Y)`` adds."""
    x, n_out, p = _pooled(op, inputs, outputs)
    return _max_pool_cost(x, n_out, n_out * (p - 1), outputs)


@cost_rule("AveragePool")
def average_pool(op: Op, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor | None]) -> OpCost:
    """``numel(Y) p`` FLOPs (``p - 1`` adds and a divide per output); backward the same."""
    x, n_out, p = _pooled(op, inputs, outputs)
    return _avg_pool_cost(x, n_out * p, inputs, outputs)


@cost_rule("GlobalAveragePool")
def global_average_pool(op: Op, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor | None]) -> OpCost:
    """Mean over all spatial positions: ``numel(X)`` FLOPs (``N C`` rows of ``p`` each)."""
    x = require(op, inputs, 0, "X")
    return _avg_pool_cost(x, x.numel, inputs, outputs)


@cost_rule("GlobalMaxPool")
def global_max_pool(op: Op, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor | None]) -> OpCost:
    """Max over all spatial positions: ``N C (p - 1)`` comparisons."""
    x = require(op, inputs, 0, "X")
    n_out = x.shape[0] * x.shape[1] if x.rank >= 2 else 1
    return _max_pool_cost(x, n_out, x.numel - n_out, outputs)
