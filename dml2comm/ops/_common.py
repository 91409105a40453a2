"""Helpers shared by the op-family modules: sizes, broadcasting, gradient bookkeeping.

Nothing here is registered; the family modules (:mod:`~dml2comm.ops.linalg`,
:mod:`~dml2comm.ops.conv`, :mod:`~dml2comm.ops.elementwise`, :mod:`~dml2comm.ops.norm`,
:mod:`~dml2comm.ops.reduce`, :mod:`~dml2comm.ops.movement`, :mod:`~dml2comm.ops.loss`) build
their :class:`~dml2comm.ops.registry.OpCost` from these pieces so that every family counts bytes
and gradients the same way.

Conventions defined here
------------------------
- **Which inputs get a gradient** (:func:`needs_grad`): a floating-point tensor that is neither a
  graph input carrying the micro-batch (``is_input``; PyTorch never differentiates w.r.t. data)
  nor a one-element non-weight tensor.  PyTorch exports turn Python scalars (the ``3.0`` in
  ``x ** 3``, the ``1/sqrt(d)`` attention scale, the ``eps`` of a hand-written norm) into
  one-element ``Constant`` nodes, which autograd never differentiates.  Integer and bool tensors
  (indices, masks, shapes) never get a gradient.  Matmul-like ops ignore this and always write
  the gradients of both operands (see :mod:`~dml2comm.ops.linalg`).
- **Backward traffic** (:func:`backward_bytes`): the output gradients read (one per
  floating-point output), the tensors the backward formula reads back ("saved" tensors), and the
  input gradients written, each touched once.  When no input gets a gradient no backward kernel
  runs and the backward cost is zero.
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

from dml2comm.errors import ModelError
from dml2comm.ir.graph import Op, Tensor

__all__ = [
    "tensor_at",
    "require",
    "nbytes",
    "total_bytes",
    "numel",
    "needs_grad",
    "grad_bytes",
    "float_bytes",
    "backward_bytes",
    "broadcast_shape",
    "out_numel",
    "unbroadcast_flops",
    "positive_axis",
    "softmax_flops",
]


def tensor_at(tensors: Sequence[Tensor | None], index: int) -> Tensor | None:
    """The tensor at ``index``, or None when the position is absent or omitted."""
    return tensors[index] if 0 <= index < len(tensors) else None


def require(op: Op, tensors: Sequence[Tensor | None], index: int, role: str) -> Tensor:
    """The tensor at ``index``; a missing one is a model error (rules never guess sizes).

    Raises
    ------
    ModelError
        The node has no tensor (or no shape) at that position.
    """
    t = tensor_at(tensors, index)
    if t is None:
        raise ModelError(
            f"{op.op_type} node {op.name!r}: {role} (position {index}) has no tensor with a known shape; "
            "re-export the model with shape inference or bind its symbolic dimensions"
        )
    return t


def nbytes(t: Tensor | None) -> int:
    """Bytes of ``t`` (0 for an absent tensor)."""
    return 0 if t is None else t.nbytes


def total_bytes(tensors: Iterable[Tensor | None]) -> int:
    """Sum of :func:`nbytes` over ``tensors``."""
    return sum(nbytes(t) for t in tensors)


def numel(t: Tensor | None) -> int:
    """Element count of ``t`` (0 for an absent tensor)."""
    return 0 if t is None else t.numel


def needs_grad(t: Tensor | None) -> bool:
    """Whether backward writes a gradient for ``t`` (see the module docstring)."""
    if t is None or not t.dtype.is_float or t.is_input:
        return False
    return t.is_weight or t.numel > 1


def grad_bytes(tensors: Iterable[Tensor | None]) -> int:
    """Bytes of the gradients written for those of ``tensors`` that need one."""
    return sum(t.nbytes for t in tensors if t is not None and needs_grad(t))


def float_bytes(tensors: Iterable[Tensor | None]) -> int:
    """Bytes of the floating-point tensors among ``tensors`` (output gradients flowing back)."""
    return sum(t.nbytes for t in tensors if t is not None and t.dtype.is_float)


def backward_bytes(
    outputs: Iterable[Tensor | None], saved: Iterable[Tensor | None], grads_of: Iterable[Tensor | None]
) -> float:
    """Backward HBM traffic: read output gradients and saved tensors, write input gradients.

    Parameters
    ----------
    outputs:
        The op's outputs; each floating-point one contributes its gradient (read once).
    saved:
        Tensors the backward formula reads back (forward inputs or outputs), any dtype.
    grads_of:
        Inputs whose gradient is written if they :func:`needs_grad`.
    """
    return float(float_bytes(outputs) + total_bytes(saved) + grad_bytes(grads_of))


def broadcast_shape(shapes: Iterable[tuple[int, ...]]) -> tuple[int, ...]:
    """Numpy/ONNX multidirectional broadcast of ``shapes`` (ONNX ``Broadcasting.md``).

    A size-1 (or missing leading) dimension stretches to the other size; two different sizes
    other than 1 are a model error.
    """
    shapes = list(shapes)
    rank = max((len(s) for s in shapes), default=0)
    out: list[int] = []
    for i in range(rank):
        size = 1
        for s in shapes:
            j = len(s) - rank + i
            if j < 0 or s[j] == 1:
                continue
            if size not in (1, s[j]):
                raise ModelError(f"shapes {shapes} do not broadcast (dimension {i}: {size} vs {s[j]})")
            size = s[j]
        out.append(size)
    return tuple(out)


def out_numel(inputs: Sequence[Tensor | None], outputs: Sequence[Tensor | None]) -> int:
    """Elements of an element-wise op's output: the output's shape, else the inputs' broadcast."""
    y = tensor_at(outputs, 0)
    if y is not None:
        return y.numel
    return math.prod(broadcast_shape(t.shape for t in inputs if t is not None))


def unbroadcast_flops(n_out: int, t: Tensor | None) -> int:
    """Additions that reduce an output-sized gradient to a broadcast input's shape.

    Summing ``n_out`` gradient elements into ``t.numel`` slots takes ``n_out - t.numel`` adds
    (0 when ``t`` was not broadcast, or needs no gradient).
    """
    if t is None or not needs_grad(t):
        return 0
    return max(n_out - t.numel, 0)


def positive_axis(axis: int, rank: int, op: Op) -> int:
    """``axis`` in ``[0, rank)``, with ONNX's negative-axis convention.

    Raises
    ------
    ModelError
        ``axis`` is out of range for ``rank``.
    """
    a = axis + rank if axis < 0 else axis
    if not 0 <= a < max(rank, 1):
        raise ModelError(f"{op.op_type} node {op.name!r}: axis {axis} out of range for rank {rank}")
    return a


def softmax_flops(n: int, rows: int) -> int:
    """Forward FLOPs of a numerically stable softmax over ``rows`` rows holding ``n`` elements.

    Counted on the ONNX Softmax-13 function body (ReduceMax, Sub, Exp, ReduceSum, Div): a
    reduction of a row of L elements takes L-1 binary ops, so
    ``(n - rows) + n + n + (n - rows) + n = 5 n - 2 rows``.
    """
    return 5 * n - 2 * rows
