"""Cost rules for reductions and scans: ReduceSum, ReduceMean, ReduceMax, ReduceMin, ReduceProd,
ReduceL1, ReduceL2, ReduceSumSquare, ReduceLogSum, ReduceLogSumExp, ArgMax, ArgMin, CumSum, TopK.

Conventions
-----------
- Reducing ``L`` elements to one takes ``L - 1`` binary operations, so a reduction of ``X``
  (``nx`` elements) to ``Y`` (``ny`` elements) costs ``nx - ny`` operations whatever the axes
  (which opset 18 passes as a tensor whose values rules do not see; the output shape carries
  them).  Element-wise work around it is counted as in :mod:`~dml2comm.ops.elementwise` (1 FLOP
  per primitive op, including ``exp``, ``log``, ``sqrt``):

  - ReduceSum: ``nx - ny`` adds; backward broadcasts ``dY`` (0 FLOPs), saves nothing.
  - ReduceMean: ``nx - ny`` adds + ``ny`` divides = ``nx``; backward ``nx`` divides.
  - ReduceMax / ReduceMin: ``nx - ny`` compares; backward ``2 nx`` (compare X with Y, select),
    reads X and Y.
  - ReduceProd: ``nx - ny`` multiplies; backward ``dy * y / x``, ``2 nx``, reads X and Y.
  - ReduceL1: ``nx`` abs + ``nx - ny`` adds; backward ``dy * sign(x)``, ``2 nx``, reads X.
  - ReduceL2: ``nx`` squares + ``nx - ny`` adds + ``ny`` square roots = ``2 nx``; backward
    ``dy * x / y``, ``2 nx``, reads X and Y.
  - ReduceSumSquare: ``nx`` squares + ``nx - ny`` adds; backward ``2 x dy``, ``2 nx``, reads X.
  - ReduceLogSum: ``nx - ny`` adds + ``ny`` logs = ``nx``; backward ``dy / exp(y)``,
    ``nx + ny``, reads Y.
  - ReduceLogSumExp: ``nx`` exps + ``nx - ny`` adds + ``ny`` logs = ``2 nx``; backward
    ``dy * exp(x - y)``, ``3 nx``, reads X and Y.
  - ArgMax / ArgMin: ``nx - ny`` compares; integer output, no backward.

  PyTorch's ``mean_backward`` divides the expanded gradient (``nx`` divides); ``amax`` routes
  it to the extreme elements by comparing ``X`` with ``Y``.
- CumSum: a scan of a line of ``L`` elements takes ``L - 1`` adds; the axis arrives as a tensor
  whose value rules do not see, so it is counted as one add per element (``nx``), an upper bound
  off by ``nx / L``.  Backward is the reverse scan of ``dY``, the same count.
- TopK along an axis of length ``L`` keeping ``k``: a size-``k`` binary heap costs at most
  ``ceil(log2 k)`` comparisons per element and at least one (the comparison with the heap's
  root), so ``nx * max(1, ceil(log2 k))``.  ``k`` is read from the ``Values`` output.  Backward
  scatters ``dValues`` into a zero ``dX`` through the indices: no FLOPs; reads dValues and
  Indices, writes dX.
- Bytes: forward reads the inputs (axes tensors included) and writes the outputs; backward reads
  ``dY`` and the saved tensors and writes ``dX``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from dml2comm.ir.graph import DType, Op, Tensor
from dml2comm.errors import ModelError
from dml2comm.ops._common import backward_bytes, nbytes, needs_grad, positive_axis, require, tensor_at, total_bytes
from dml2comm.ops.registry import OpCost, cost_rule, io_bytes

__all__ = ["Reduction", "REDUCTIONS", "reduction", "arg_reduction", "cum_sum", "top_k"]


@dataclass(frozen=True, slots=True)
class Reduction:
    """FLOPs of a reduction from ``(nx, ny)``; ``saved`` names what backward reads ("X", "Y")."""

    fwd: Callable[[int, int], int]
    bwd: Callable[[int, int], int]
    saved: tuple[str, ...]


#: Reduce ops and their counts (see the module docstring's table).
REDUCTIONS: Mapping[str, Reduction] = {
    "ReduceSum": Reduction(lambda nx, ny: nx - ny, lambda nx, ny: 0, ()),
    "ReduceMean": Reduction(lambda nx, ny: nx, lambda nx, ny: nx, ()),
    "ReduceMax": Reduction(lambda nx, ny: nx - ny, lambda nx, ny: 2 * nx, ("X", "Y")),
    "ReduceMin": Reduction(lambda nx, ny: nx - ny, lambda nx, ny: 2 * nx, ("X", "Y")),
    "ReduceProd": Reduction(lambda nx, ny: nx - ny, lambda nx, ny: 2 * nx, ("X", "Y")),
    "ReduceL1": Reduction(lambda nx, ny: 2 * nx - ny, lambda nx, ny: 2 * nx, ("X",)),
    "ReduceL2": Reduction(lambda nx, ny: 2 * nx, lambda nx, ny: 2 * nx, ("X", "Y")),
    "ReduceSumSquare": Reduction(lambda nx, ny: 2 * nx - ny, lambda nx, ny: 2 * nx, ("X",)),
    "ReduceLogSum": Reduction(lambda nx, ny: nx, lambda nx, ny: nx + ny, ("Y",)),
    "ReduceLogSumExp": Reduction(lambda nx, ny: 2 * nx, lambda nx, ny: 3 * nx, ("X", "Y")),
}


def _reduced_numel(op: Op, x: Tensor, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor | None]) -> int:
    """Elements of the reduced output: the output's, else from the ``axes`` attribute
    (opset < 18; all axes when none is given and ``noop_with_empty_axes`` is 0).

    Raises
    ------
    ModelError
        No output shape and the axes arrive as a tensor (opset 18) whose values are unknown.
    """
    y = tensor_at(outputs, 0)
    if y is not None:
        return y.numel
    if tensor_at(inputs, 1) is not None:
        raise ModelError(
            f"{op.op_type} node {op.name!r}: the output has no known shape and the axes are a tensor input; "
            "re-export the model with shape inference"
        )
    axes = op.attr("axes")
    if axes is None:
        return x.numel if op.attr("noop_with_empty_axes", 0) else 1
    reduced = {positive_axis(int(a), x.rank, op) for a in axes}
    return math.prod(d for i, d in enumerate(x.shape) if i not in reduced)


@cost_rule(*REDUCTIONS)
def reduction(op: Op, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor | None]) -> OpCost:
    """A Reduce* op of :data:`REDUCTIONS`, costed from the element counts of X and Y."""
    spec = REDUCTIONS[op.op_type]
    x = require(op, inputs, 0, "data")
    ny = _reduced_numel(op, x, inputs, outputs)
    y_bytes = ny * x.dtype.itemsize
    flops = spec.fwd(x.numel, ny)
    fwd = float(total_bytes(inputs) + y_bytes)
    if not needs_grad(x):
        return OpCost(float(flops), fwd, 0.0, 0.0, "reduction")
    saved_bytes = sum({"X": x.nbytes, "Y": y_bytes}[name] for name in spec.saved)
    bwd = float(y_bytes + saved_bytes + x.nbytes)  # read dY and the saved tensors, write dX
    return OpCost(float(flops), fwd, float(spec.bwd(x.numel, ny)), bwd, "reduction")


@cost_rule("ArgMax", "ArgMin")
def arg_reduction(op: Op, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor | None]) -> OpCost:
    """Index of the extreme element: ``nx - ny`` comparisons, integer output, no backward."""
    x = require(op, inputs, 0, "data")
    axis = positive_axis(int(op.attr("axis", 0)), x.rank, op)
    ny = x.numel // x.shape[axis] if x.shape[axis] else 0
    y = tensor_at(outputs, 0)
    y_bytes = y.nbytes if y is not None else ny * DType.INT64.itemsize  # ONNX ArgMax/ArgMin output int64
    return OpCost(float(x.numel - ny), float(x.nbytes + y_bytes), 0.0, 0.0, "reduction")


@cost_rule("CumSum")
def cum_sum(op: Op, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor | None]) -> OpCost:
    """Inclusive/exclusive scan: one add per element, forward and backward (reverse scan)."""
    x = require(op, inputs, 0, "x")
    fwd = io_bytes(inputs, outputs)
    if not needs_grad(x):
        return OpCost(float(x.numel), fwd, 0.0, 0.0, "reduction")
    return OpCost(float(x.numel), fwd, float(x.numel), backward_bytes(outputs, (), (x,)), "reduction")


@cost_rule("TopK")
def top_k(op: Op, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor | None]) -> OpCost:
    """``nx * max(1, ceil(log2 k))`` comparisons; backward scatters dValues (0 FLOPs)."""
    x = require(op, inputs, 0, "X")
    values = require(op, outputs, 0, "Values")
    k = values.shape[positive_axis(int(op.attr("axis", -1)), values.rank, op)] if values.rank else 1
    flops = x.numel * max(1, math.ceil(math.log2(k))) if k > 0 else 0
    fwd = io_bytes(inputs, outputs)
    if not needs_grad(x):
        return OpCost(float(flops), fwd, 0.0, 0.0, "reduction")
    indices = tensor_at(outputs, 1)
    bwd = float(values.nbytes + nbytes(indices) + x.nbytes)
    return OpCost(float(flops), fwd, 0.0, bwd, "reduction")
