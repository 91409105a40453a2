"""Cost rules for data movement, views and generators.

Families
--------
- **Views** (Reshape, Squeeze, Unsqueeze, Flatten, Identity, Shape, Size, Constant): 0 FLOPs
  and 0 bytes forward and backward.  In PyTorch these are metadata operations on a tensor's
  size/stride (``view``, ``squeeze``, ``unsqueeze``, ``flatten`` of a contiguous tensor,
  ``size()``), and ONNX constants are materialised once at load time.
- **Copies** (Transpose, Concat, Split, Expand, Tile, Pad, Trilu, DepthToSpace, SpaceToDepth):
  0 FLOPs (a Transpose of a weight is a view: PyTorch passes transposed parameters to the GEMM
  with a transpose flag, never copying them); forward reads every input once and writes every output once (integer shape/index
  tensors count their own item size).  Backward applies the adjoint movement: read the output
  gradient(s), write the gradient of each float input.  Expand/Tile backward sums the gradient
  back to the input shape: ``numel(Y) - numel(X)`` adds.  Pad backward reads the ``X``-sized
  interior of ``dY``.
- **Slicing and gathering** (Slice, Gather, GatherElements, GatherND, Compress): only the
  selected elements are read, so forward reads ``numel(Y)`` elements of the data plus the index
  tensors and writes ``Y``.  For an embedding lookup (Gather on a weight table) that is the
  gathered rows, not the table.  Backward of a gather is a scatter-add of the output's size
  (``numel(Y)`` adds) into a gradient of the *whole* data shape that the backward allocates
  zero-filled on every call: ``embedding_dense_backward`` allocates ``at::zeros({num_weights,
  dim})`` (aten/src/ATen/native/cuda/Embedding.cu, EmbeddingBackwardKernel.cu) and
  ``index_select``/``gather`` backward is ``zeros_like(self).index_add_/scatter_add_``
  (tools/autograd/derivatives.yaml), so the fill writes ``numel(data)`` elements per micro-batch
  (for a 50k x 768 table that is 77 MB; measured on H100, 24 us of a 282 us embedding backward,
  benchmarks/data/h100/trace_gpt2-small_bf16_b8.json.gz).  An embedding lookup (Gather on axis
  0 of a 2-D weight) sums its rows in two steps through partial sums in the accumulation type
  (``compute_grad_weight`` writes fp32 partials of ``NROWS_PER_THREAD`` rows, ``sum_and_scatter``
  reads them and writes the rows: EmbeddingBackwardKernel.cu), so it reads ``dY`` and writes
  the rows once each plus an fp32 write and read of ``numel(Y)`` partials; other gathers read
  ``dY`` and the indices and write ``numel(Y)`` gradient elements.  Slice/Compress backward
  reads ``dY`` and writes the full ``dX`` (zeros outside the selection).
- **Scatters** (ScatterND, ScatterElements, TensorScatter): forward copies ``data`` to the
  output and writes ``updates`` through ``indices``: reads data, indices and updates, writes the
  output; a ``reduction`` (add/mul/max/min) costs one FLOP per update.  Backward: ``d_data`` is
  ``dY`` with the scattered positions cleared (read ``dY`` and the indices, write ``d_data``),
  ``d_updates`` gathers ``dY`` at the indices (read and write ``numel(updates)``).
- **Resize**: ``nearest`` moves data only; ``linear`` and ``cubic`` form each output element as
  a weighted sum of ``taps^r`` inputs (``taps`` = 2 or 4 neighbours per resized axis, ONNX
  Resize-19 spec; ``r`` = number of axes whose size changes), ``2 taps^r`` FLOPs per output
  element (a multiply-add per tap, weights precomputed per axis).  ``antialias`` widening of the
  filter on downsampling is not counted.  Backward is the adjoint (transposed) interpolation:
  the same FLOPs, reading ``dY`` and writing ``dX``.
- **Generators** (OneHot, Range, ConstantOfShape, EyeLike, NonZero): write their output and read
  their (small) inputs; no backward.  Range computes ``start + i * delta`` (one multiply-add,
  2 FLOPs, per element); NonZero compares each input element with zero (1 FLOP each); EyeLike
  reads only its input's shape.
"""

from __future__ import annotations

import math
from typing import Sequence

from dml2comm.errors import ModelError
from dml2comm.ir.graph import Op, Tensor
from dml2comm.ops._common import (
    float_bytes,
    grad_bytes,
    nbytes,
    needs_grad,
    positive_axis,
    require,
    tensor_at,
    total_bytes,
)
from dml2comm.ops.registry import OpCost, cost_rule, io_bytes

__all__ = [
    "view",
    "copy",
    "expand",
    "pad",
    "slice_",
    "gather",
    "compress",
    "scatter",
    "resize",
    "one_hot",
    "range_",
    "constant_of_shape",
    "eye_like",
    "non_zero",
]

_ZERO = OpCost(0.0, 0.0, 0.0, 0.0, "view")


def _movement_cost(
    flops_fwd: float,
    bytes_fwd: float,
    grads_of: Sequence[Tensor | None],
    bwd_flops: float,
    bwd_bytes: float,
    rule: str = "movement",
) -> OpCost:
    """Zero backward when no input gets a gradient (no backward kernel runs)."""
    if not any(needs_grad(t) for t in grads_of):
        return OpCost(float(flops_fwd), float(bytes_fwd), 0.0, 0.0, rule)
    return OpCost(float(flops_fwd), float(bytes_fwd), float(bwd_flops), float(bwd_bytes), rule)


@cost_rule("Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Shape", "Size", "Constant")
def view(op: Op, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor | None]) -> OpCost:
    """Metadata-only ops: nothing computed, nothing moved."""
    return _ZERO


@cost_rule("Transpose", "Concat", "Split", "Trilu", "DepthToSpace", "SpaceToDepth")
def copy(op: Op, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor | None]) -> OpCost:
    """Pure copies: forward and backward each read and write their tensors once.

    A Transpose of a weight is a view instead: PyTorch never copies a transposed parameter
    (``F.linear`` and ``weight.t()`` hand cuBLAS the untransposed buffer with a transpose flag);
    the exporters spell it ``Transpose`` + ``MatMul``, e.g. a tied LM head.
    """
    first = tensor_at(inputs, 0)
    if op.op_type == "Transpose" and first is not None and first.is_weight:
        return _ZERO
    bwd = float_bytes(outputs) + grad_bytes(inputs)
    return _movement_cost(0.0, io_bytes(inputs, outputs), inputs, 0.0, bwd)


@cost_rule("Expand", "Tile")
def expand(op: Op, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor | None]) -> OpCost:
    """Broadcast copy; backward sums ``dY`` back to ``X``'s shape (``numel(Y) - numel(X)`` adds)."""
    x = require(op, inputs, 0, "input")
    y = require(op, outputs, 0, "output")
    return _movement_cost(0.0, io_bytes(inputs, outputs), (x,), y.numel - x.numel, y.nbytes + grad_bytes((x,)))


@cost_rule("Pad")
def pad(op: Op, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor | None]) -> OpCost:
    """Copy into a padded buffer; backward copies the ``X``-sized interior of ``dY`` to ``dX``."""
    x = require(op, inputs, 0, "data")
    return _movement_cost(0.0, io_bytes(inputs, outputs), (x,), 0.0, 2 * x.nbytes)


@cost_rule("Slice")
def slice_(op: Op, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor | None]) -> OpCost:
    """Reads the selected ``numel(Y)`` elements and the index tensors, writes ``Y``;
    backward writes the full ``dX``."""
    x = require(op, inputs, 0, "data")
    y = require(op, outputs, 0, "output")
    fwd = 2 * y.nbytes + total_bytes(inputs[1:])
    return _movement_cost(0.0, fwd, (x,), 0.0, y.nbytes + x.nbytes)


def _gathered_numel(op: Op, data: Tensor, indices: Tensor, outputs: Sequence[Tensor | None]) -> int:
    """Elements a gather produces: the output's, else from the ONNX shape rules.

    Gather: ``data[:axis] + indices + data[axis+1:]``; GatherElements: ``indices``;
    GatherND: ``indices[:-1] + data[batch_dims + indices[-1]:]``.
    """
    y = tensor_at(outputs, 0)
    if y is not None:
        return y.numel
    if op.op_type == "GatherElements":
        return indices.numel
    if op.op_type == "GatherND":
        if not indices.rank:
            raise ModelError(f"GatherND node {op.name!r}: indices must have rank >= 1")
        tail = data.shape[int(op.attr("batch_dims", 0)) + indices.shape[-1] :]
        return math.prod(indices.shape[:-1]) * math.prod(tail)
    axis = positive_axis(int(op.attr("axis", 0)), data.rank, op)
    return data.numel // data.shape[axis] * indices.numel if data.shape[axis] else 0


@cost_rule("Gather", "GatherElements", "GatherND")
def gather(op: Op, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor | None]) -> OpCost:
    """Reads ``numel(Y)`` data elements and the indices, writes ``Y``; backward zero-fills a
    gradient of the data's shape and scatter-adds ``numel(Y)`` elements into it (``numel(Y)``
    adds; an embedding's through fp32 partial sums: module docstring)."""
    data = require(op, inputs, 0, "data")
    indices = require(op, inputs, 1, "indices")
    n_out = _gathered_numel(op, data, indices, outputs)
    moved = 2 * n_out * data.dtype.itemsize + indices.nbytes  # fwd: read + write; bwd: dY + scatter-add
    bwd = data.nbytes + moved  # the zero-filled whole-data gradient, then the scatter-add
    if _is_embedding(op, data, indices):
        bwd += 2 * n_out * EMBEDDING_PARTIAL_BYTES  # fp32 partial sums written, then read
    return _movement_cost(0.0, moved, (data,), n_out, bwd, "gather")


#: Bytes per element of the embedding backward's partial sums: ``acc_type`` of the 16- and
#: 32-bit floating types is float (ATen/AccumulateType.h), 4 bytes.
EMBEDDING_PARTIAL_BYTES = 4


def _is_embedding(op: Op, data: Tensor, indices: Tensor) -> bool:
    """A lookup of rows of a 2-D weight table by integer ids (``F.embedding`` exports to
    ``Gather(weight, ids, axis=0)``), whose backward is ``embedding_dense_backward``."""
    return (op.op_type == "Gather" and int(op.attr("axis", 0)) == 0 and data.rank == 2 and data.is_weight
            and not indices.dtype.is_float)


@cost_rule("Compress")
def compress(op: Op, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor | None]) -> OpCost:
    """Reads the condition and the kept ``numel(Y)`` elements, writes ``Y``; backward writes
    the full ``dX``."""
    x = require(op, inputs, 0, "input")
    condition = require(op, inputs, 1, "condition")
    y = require(op, outputs, 0, "output")
    return _movement_cost(0.0, 2 * y.nbytes + condition.nbytes, (x,), 0.0, y.nbytes + condition.nbytes + x.nbytes, "gather")


def _scatter_parts(op: Op, inputs: Sequence[Tensor | None]) -> tuple[Tensor, Tensor | None, Tensor]:
    """``(data, indices, updates)``; TensorScatter is ``(past_cache, update, write_indices)``."""
    data = require(op, inputs, 0, "data")
    if op.op_type == "TensorScatter":
        return data, tensor_at(inputs, 2), require(op, inputs, 1, "update")
    return data, require(op, inputs, 1, "indices"), require(op, inputs, 2, "updates")


@cost_rule("ScatterND", "ScatterElements", "TensorScatter")
def scatter(op: Op, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor | None]) -> OpCost:
    """Copy ``data`` to the output and write ``updates`` through the indices; a reduction costs
    ``numel(updates)`` FLOPs."""
    data, indices, updates = _scatter_parts(op, inputs)
    reducing = str(op.attr("reduction", "none")) != "none"
    flops = updates.numel if reducing else 0
    y = tensor_at(outputs, 0)
    bwd = 0
    if needs_grad(data):
        bwd += nbytes(y) + nbytes(indices) + data.nbytes
    if needs_grad(updates):
        bwd += 2 * updates.nbytes + nbytes(indices)
    return _movement_cost(flops, io_bytes(inputs, outputs), (data, updates), 0.0, bwd, "scatter")


_RESIZE_TAPS = {"nearest": 0, "linear": 2, "cubic": 4}


@cost_rule("Resize")
def resize(op: Op, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor | None]) -> OpCost:
    """Interpolation: ``2 taps^r`` FLOPs per output element (0 for ``nearest``)."""
    x = require(op, inputs, 0, "X")
    y = require(op, outputs, 0, "Y")
    mode = str(op.attr("mode", "nearest"))
    if mode not in _RESIZE_TAPS:
        raise ModelError(f"Resize node {op.name!r}: unknown mode {mode!r}")
    if x.rank != y.rank:
        raise ModelError(f"Resize node {op.name!r}: X {x.shape} and Y {y.shape} differ in rank")
    resized = sum(a != b for a, b in zip(x.shape, y.shape))
    taps = _RESIZE_TAPS[mode]
    flops = 2 * taps**resized * y.numel if taps and resized else 0
    return _movement_cost(flops, io_bytes(inputs, outputs), (x,), flops, y.nbytes + grad_bytes((x,)), "resize")


def _generator(flops: float, read: Sequence[Tensor | None], outputs: Sequence[Tensor | None]) -> OpCost:
    return OpCost(float(flops), io_bytes(read, outputs), 0.0, 0.0, "generator")


@cost_rule("OneHot")
def one_hot(op: Op, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor | None]) -> OpCost:
    """Writes the one-hot output; reads indices, depth and values."""
    return _generator(0.0, inputs, outputs)


@cost_rule("Range")
def range_(op: Op, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor | None]) -> OpCost:
    """``start + i * delta``: 2 FLOPs per output element."""
    y = require(op, outputs, 0, "output")
    return _generator(2 * y.numel, inputs, outputs)


@cost_rule("ConstantOfShape")
def constant_of_shape(op: Op, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor | None]) -> OpCost:
    """Fills the output; reads the shape tensor."""
    return _generator(0.0, inputs, outputs)


@cost_rule("EyeLike")
def eye_like(op: Op, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor | None]) -> OpCost:
    """Writes an identity matrix; the input contributes only its shape."""
    return _generator(0.0, (), outputs)


@cost_rule("NonZero")
def non_zero(op: Op, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor | None]) -> OpCost:
    """One comparison with zero per input element; writes the int64 coordinates."""
    x = require(op, inputs, 0, "X")
    return _generator(x.numel, inputs, outputs)
