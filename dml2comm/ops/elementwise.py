"""Cost rules for element-wise ops: arithmetic, comparisons, logic, activations, Cast, Dropout,
Where, Clip, the variadic Max/Min/Sum/Mean, RotaryEmbedding, and the ONNX Runtime fused
activations (``FastGelu``, ``BiasGelu``, ``QuickGelu``, ``BiasAdd``).

Conventions
-----------
- **FLOPs per output element.**  Every primitive scalar operation counts 1: add, subtract,
  multiply, divide, compare, select, min/max, abs, negate, and one evaluation of an elementary
  function (exp, log, sqrt, pow, erf, tanh, sin, cos, ...).  This is the counting of thop
  (``Lyken17/pytorch-OpCounter``, ``thop/vision/calc_func.py``: ``counter_pow``,
  ``counter_sqrt``, ``counter_div`` are one op per element and a softmax counts one op per
  ``exp``) and of the DeepSpeed flops profiler, which counts one FLOP per element for ReLU,
  GELU, SiLU, ELU and the element-wise ``add``/``mul``
  (``deepspeed/profiling/flops_profiler/profiler.py``).  Composite activations count the
  primitive operations of their ONNX definition, so e.g. Sigmoid ``1 / (1 + exp(-x))`` is 4
  and exact Gelu ``0.5 x (1 + erf(x / sqrt(2)))`` is 5; each entry of :data:`POINTWISE` states
  its formula.  PyTorch's ``torch.utils.flop_counter`` and fvcore count only matmul-like ops, so
  these counts matter for completeness, not for time: element-wise kernels are memory-bound.
- **Backward FLOPs** are counted from the derivative formula, per output element, separately
  for each input's gradient, and are typically 1-2x the forward: the derivative costs about as
  much as the function (often reusing the saved output) plus one multiply by the incoming
  gradient, and a binary op produces two gradients.  A broadcast input's gradient is also
  reduced to its shape (``numel(Y) - numel(input)`` adds).  Piecewise-constant ops (Sign, Floor,
  Ceil, Round) have a zero gradient (PyTorch ``derivatives.yaml``: ``zeros_like(grad)``): no
  FLOPs, but the gradient is written.  Comparisons, logic, bit operations, IsNaN/IsInf and
  integer Mod have no backward.
- **Bytes.**  Forward: every input read once and every output written once (unfused kernel);
  integer and bool tensors count their own item size.  Backward: read the output gradient and
  the saved tensors the derivative needs, write the input gradients (see
  :func:`~dml2comm.ops._common.backward_bytes`; which inputs get a gradient is
  :func:`~dml2comm.ops._common.needs_grad`).
- **Cast/CastLike** do no floating-point arithmetic: 0 FLOPs, input read and output written
  (CastLike reads only the dtype of its second input); backward casts the gradient back.
- **Dropout** is costed as in training (the mode dml2comm analyses; exporters drop the node in
  eval mode): a comparison of a uniform draw with the ratio and a multiply by the kept-and-scaled
  mask, 2 FLOPs per element; PyTorch saves a bool mask (1 byte per element) that is written
  forward and read backward, counted whether or not the ONNX graph exposes the ``mask`` output.
- **RotaryEmbedding** (ONNX opset 23 and ``com.microsoft``): ``x1 cos - x2 sin`` and
  ``x2 cos + x1 sin`` are 3 FLOPs per rotated element (2 multiplies, 1 add); backward rotates the
  gradient by the opposite angle, the same count.  It reads one cos and one sin value per rotated
  pair of each token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from dml2comm.errors import ModelError
from dml2comm.ir.graph import Op, Tensor
from dml2comm.ops._common import (
    backward_bytes,
    grad_bytes,
    nbytes,
    needs_grad,
    out_numel,
    require,
    tensor_at,
    unbroadcast_flops,
)
from dml2comm.ops.registry import OpCost, cost_rule, io_bytes

__all__ = [
    "Pointwise",
    "POINTWISE",
    "pointwise_cost",
    "pointwise",
    "gelu",
    "fast_gelu",
    "bias_gelu",
    "mod",
    "clip",
    "variadic",
    "cast",
    "cast_like",
    "dropout",
    "rotary_embedding",
]

_MICROSOFT = "com.microsoft"


@dataclass(frozen=True, slots=True)
class Pointwise:
    """FLOP counts of one element-wise op, per output element.

    Attributes
    ----------
    fwd:
        Forward FLOPs per output element.
    grads:
        Backward FLOPs per output element for the gradient of input ``i`` (``grads[i]``);
        inputs past the end of the tuple (or an empty tuple) get no gradient.
    saved:
        Positions of the inputs the backward formula reads back.
    formula:
        The forward and backward formulas the counts come from.
    """

    fwd: int
    grads: tuple[int, ...]
    saved: tuple[int, ...]
    formula: str


def _unary(fwd: int, bwd: int, formula: str, saved: bool = True) -> Pointwise:
    return Pointwise(fwd, (bwd,), (0,) if saved else (), formula)


def _no_grad(fwd: int, formula: str) -> Pointwise:
    return Pointwise(fwd, (), (), formula)


#: Element-wise ops whose counts do not depend on attributes or arity.
POINTWISE: Mapping[str, Pointwise] = {
    # arithmetic
    "Add": Pointwise(1, (0, 0), (), "a + b; da = db = dy"),
    "Sub": Pointwise(1, (0, 1), (), "a - b; da = dy, db = -dy"),
    "Mul": Pointwise(1, (1, 1), (0, 1), "a * b; da = dy b, db = dy a"),
    "Div": Pointwise(1, (1, 3), (0, 1), "a / b; da = dy / b, db = -(da a) / b"),
    "Pow": Pointwise(1, (4, 4), (0, 1), "a ** b; da = dy b a**(b-1), db = dy a**b log(a)"),
    "Neg": _unary(1, 1, "-x; dx = -dy", saved=False),
    "Abs": _unary(1, 2, "|x|; dx = dy sign(x)"),
    "Reciprocal": _unary(1, 3, "1 / x; dx = -dy y y"),
    "Sqrt": _unary(1, 2, "sqrt(x); dx = dy / (2 y)"),
    "Exp": _unary(1, 1, "exp(x); dx = dy y"),
    "Log": _unary(1, 1, "log(x); dx = dy / x"),
    "Sign": _unary(1, 0, "sign(x); zero gradient", saved=False),
    "Floor": _unary(1, 0, "floor(x); zero gradient", saved=False),
    "Ceil": _unary(1, 0, "ceil(x); zero gradient", saved=False),
    "Round": _unary(1, 0, "round(x); zero gradient", saved=False),
    # trigonometric and hyperbolic
    "Sin": _unary(1, 2, "sin(x); dx = dy cos(x)"),
    "Cos": _unary(1, 3, "cos(x); dx = -dy sin(x)"),
    "Tan": _unary(1, 3, "tan(x); dx = dy (1 + y y)"),
    "Asin": _unary(1, 4, "asin(x); dx = dy / sqrt(1 - x x)"),
    "Acos": _unary(1, 5, "acos(x); dx = -dy / sqrt(1 - x x)"),
    "Atan": _unary(1, 3, "atan(x); dx = dy / (1 + x x)"),
    "Sinh": _unary(1, 2, "sinh(x); dx = dy cosh(x)"),
    "Cosh": _unary(1, 2, "cosh(x); dx = dy sinh(x)"),
    "Asinh": _unary(1, 4, "asinh(x); dx = dy / sqrt(x x + 1)"),
    "Acosh": _unary(1, 4, "acosh(x); dx = dy / sqrt(x x - 1)"),
    "Atanh": _unary(1, 3, "atanh(x); dx = dy / (1 - x x)"),
    "Tanh": _unary(1, 3, "tanh(x); dx = dy (1 - y y)"),
    "Erf": _unary(1, 5, "erf(x); dx = dy (2 / sqrt(pi)) exp(-(x x))"),
    # activations
    "Sigmoid": _unary(4, 3, "1 / (1 + exp(-x)); dx = dy y (1 - y)"),
    "Relu": _unary(1, 2, "max(x, 0); dx = x > 0 ? dy : 0"),
    "LeakyRelu": _unary(3, 3, "x < 0 ? alpha x : x; dx = x < 0 ? alpha dy : dy"),
    "ThresholdedRelu": _unary(2, 2, "x > alpha ? x : 0; dx = x > alpha ? dy : 0"),
    "Elu": _unary(5, 4, "x > 0 ? x : alpha (exp(x) - 1); dx = x > 0 ? dy : dy (y + alpha)"),
    "Selu": _unary(6, 6, "gamma (x > 0 ? x : alpha exp(x) - alpha); dx = dy gamma (x > 0 ? 1 : alpha exp(x))"),
    "Celu": _unary(7, 5, "max(0, x) + min(0, alpha (exp(x / alpha) - 1)); dx = x > 0 ? dy : dy exp(x / alpha)"),
    "HardSigmoid": _unary(4, 7, "max(0, min(1, alpha x + beta)); dx = 0 < alpha x + beta < 1 ? alpha dy : 0"),
    "HardSwish": _unary(5, 7, "x max(0, min(1, x / 6 + 1/2)); dx = x < -3 ? 0 : x <= 3 ? dy (x / 3 + 1/2) : dy"),
    "Softplus": _unary(3, 4, "log(exp(x) + 1); dx = dy / (1 + exp(-x))"),
    "Softsign": _unary(3, 4, "x / (1 + |x|); dx = dy / (1 + |x|)^2"),
    "Mish": _unary(5, 14, "x tanh(softplus(x)); dx = dy (t + x sigmoid(x) (1 - t t)), t = tanh(softplus(x))"),
    "PRelu": Pointwise(3, (3, 3), (0, 1), "x < 0 ? slope x : x; dx = x < 0 ? slope dy : dy, dslope = x < 0 ? x dy : 0"),
    "Swish": _unary(6, 11, "x sigmoid(alpha x); dx = dy (s + alpha x s (1 - s)), s = sigmoid(alpha x)"),
    "QuickGelu": _unary(6, 11, "com.microsoft: x sigmoid(alpha x), as Swish"),
    "SwiGLU": Pointwise(7, (6, 7), (0, 1), "swish(a) b; db = dy swish(a) (7, with the recompute), da = dy b swish'(a) (6)"),
    "BiasAdd": Pointwise(2, (0, 0, 0), (), "com.microsoft: x + bias + skip; gradients pass through"),
    "Where": Pointwise(1, (0, 1, 1), (0,), "c ? x : y; dx = c ? dy : 0, dy_ = c ? 0 : dy"),
    # comparisons, logic, bits: no gradient
    "Equal": _no_grad(1, "a == b"),
    "Less": _no_grad(1, "a < b"),
    "LessOrEqual": _no_grad(1, "a <= b"),
    "Greater": _no_grad(1, "a > b"),
    "GreaterOrEqual": _no_grad(1, "a >= b"),
    "Not": _no_grad(1, "not x"),
    "And": _no_grad(1, "a and b"),
    "Or": _no_grad(1, "a or b"),
    "Xor": _no_grad(1, "a xor b"),
    "BitwiseNot": _no_grad(1, "~x"),
    "BitwiseAnd": _no_grad(1, "a & b"),
    "BitwiseOr": _no_grad(1, "a | b"),
    "BitwiseXor": _no_grad(1, "a ^ b"),
    "BitShift": _no_grad(1, "a << b or a >> b"),
    "IsNaN": _no_grad(1, "x != x"),
    "IsInf": _no_grad(1, "x == +-inf"),
}


def pointwise_cost(spec: Pointwise, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor | None]) -> OpCost:
    """Cost of an element-wise op from its per-element counts (see :class:`Pointwise`)."""
    n = out_numel(inputs, outputs)
    fwd_bytes = io_bytes(inputs, outputs)
    grads = [(i, t) for i, t in enumerate(inputs[: len(spec.grads)]) if needs_grad(t)]
    if not grads:
        return OpCost(float(spec.fwd * n), fwd_bytes, 0.0, 0.0, "elementwise")
    flops_bwd = sum(spec.grads[i] * n + unbroadcast_flops(n, t) for i, t in grads)
    saved = [tensor_at(inputs, i) for i in spec.saved]
    bwd_bytes = backward_bytes(outputs, saved, [t for _, t in grads])
    return OpCost(float(spec.fwd * n), fwd_bytes, float(flops_bwd), bwd_bytes, "elementwise")


@cost_rule(*POINTWISE)
def pointwise(op: Op, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor | None]) -> OpCost:
    """Element-wise ops of :data:`POINTWISE`."""
    return pointwise_cost(POINTWISE[op.op_type], inputs, outputs)


_GELU_ERF = Pointwise(5, (11,), (0,), "0.5 x (1 + erf(x / sqrt 2)); dx = dy (Phi(x) + x phi(x))")
_GELU_TANH = Pointwise(
    9, (18,), (0,), "0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))); dx per PyTorch's GeluBackward (tanh)"
)


@cost_rule("Gelu")
def gelu(op: Op, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor | None]) -> OpCost:
    """Gelu (ONNX opset 20, ``com.microsoft``): 5 FLOPs exact (erf), 9 with ``approximate="tanh"``."""
    spec = _GELU_TANH if str(op.attr("approximate", "none")) == "tanh" else _GELU_ERF
    return pointwise_cost(spec, inputs, outputs)


@cost_rule("FastGelu")
def fast_gelu(op: Op, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor | None]) -> OpCost:
    """``com.microsoft.FastGelu``: tanh-Gelu of ``x (+ bias)``: 9 FLOPs, +1 with the bias."""
    has_bias = tensor_at(inputs, 1) is not None
    spec = Pointwise(_GELU_TANH.fwd + int(has_bias), (_GELU_TANH.grads[0], 0), (0, 1), "tanh-Gelu(x + bias)")
    return pointwise_cost(spec, inputs, outputs)


@cost_rule("BiasGelu")
def bias_gelu(op: Op, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor | None]) -> OpCost:
    """``com.microsoft.BiasGelu``: exact Gelu of ``x + bias``: 6 FLOPs."""
    spec = Pointwise(_GELU_ERF.fwd + 1, (_GELU_ERF.grads[0], 0), (0, 1), "Gelu(x + bias)")
    return pointwise_cost(spec, inputs, outputs)


@cost_rule("Mod")
def mod(op: Op, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor | None]) -> OpCost:
    """Integer Mod: 1 remainder op, no gradient.  Float Mod (``fmod``):
    ``a - b trunc(a / b)``, 4 FLOPs; ``da = dy``, ``db = -dy trunc(a / b)`` (4)."""
    a = require(op, inputs, 0, "A")
    if not a.dtype.is_float:
        return pointwise_cost(_no_grad(1, "a mod b"), inputs, outputs)
    return pointwise_cost(Pointwise(4, (0, 4), (0, 1), "a - b trunc(a / b)"), inputs, outputs)


@cost_rule("Clip")
def clip(op: Op, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor | None]) -> OpCost:
    """``min(max(x, lo), hi)``: one min/max per bound given; backward masks the gradient
    (a compare per bound, an ``and`` between two bounds, a select: ``2 * bounds``)."""
    if len(inputs) > 1:
        bounds = sum(tensor_at(inputs, i) is not None for i in (1, 2))
    else:  # Clip-6: bounds are attributes, both always in effect
        bounds = 2 if op.attr("min") is not None or op.attr("max") is not None else 0
    spec = Pointwise(bounds, (2 * bounds,), (0, 1, 2), "min(max(x, lo), hi); dx = lo <= x <= hi ? dy : 0")
    return pointwise_cost(spec, inputs, outputs)


def _variadic_spec(op_type: str, arity: int) -> Pointwise:
    if op_type in ("Max", "Min"):
        return Pointwise(arity - 1, (2,) * arity, tuple(range(arity)), "pairwise max/min; dx_i = (x_i == y) ? dy : 0")
    if op_type == "Sum":
        return Pointwise(arity - 1, (0,) * arity, (), "x_1 + ... + x_n; dx_i = dy")
    return Pointwise(arity, (1,) * arity, (), "(x_1 + ... + x_n) / n; dx_i = dy / n")


@cost_rule("Max", "Min", "Sum", "Mean")
def variadic(op: Op, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor | None]) -> OpCost:
    """Variadic Max/Min/Sum (``n - 1`` ops per output element) and Mean (``n``), broadcasting."""
    arity = sum(t is not None for t in inputs)
    return pointwise_cost(_variadic_spec(op.op_type, arity), inputs, outputs)


def _cast_cost(x: Tensor, inputs_read: Sequence[Tensor | None], outputs: Sequence[Tensor | None]) -> OpCost:
    y = tensor_at(outputs, 0)
    fwd = io_bytes(inputs_read, outputs)
    if not needs_grad(x) or y is None or not y.dtype.is_float:
        return OpCost(0.0, fwd, 0.0, 0.0, "cast")
    return OpCost(0.0, fwd, 0.0, float(y.nbytes + x.nbytes), "cast")


@cost_rule("Cast")
def cast(op: Op, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor | None]) -> OpCost:
    """Type conversion: memory-bound, 0 FLOPs."""
    x = require(op, inputs, 0, "input")
    return _cast_cost(x, inputs, outputs)


@cost_rule("CastLike")
def cast_like(op: Op, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor | None]) -> OpCost:
    """Type conversion to the second input's dtype (its data is not read): 0 FLOPs."""
    x = require(op, inputs, 0, "input")
    return _cast_cost(x, (x,), outputs)


@cost_rule("Dropout")
def dropout(op: Op, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor | None]) -> OpCost:
    """Training-mode dropout: 2 FLOPs per element; a 1-byte mask written and read back."""
    x = require(op, inputs, 0, "data")
    mask = tensor_at(outputs, 1)
    mask_bytes = nbytes(mask) if mask is not None else x.numel
    y = tensor_at(outputs, 0)
    fwd = float(sum(nbytes(t) for t in inputs) + nbytes(y) + mask_bytes)
    if not needs_grad(x):
        return OpCost(float(2 * x.numel), fwd, 0.0, 0.0, "elementwise")
    bwd = float(nbytes(y) + mask_bytes + x.nbytes)
    return OpCost(float(2 * x.numel), fwd, float(2 * x.numel), bwd, "elementwise")


@cost_rule("RotaryEmbedding")
def rotary_embedding(op: Op, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor | None]) -> OpCost:
    """RoPE (ONNX opset 23: ``X, cos_cache, sin_cache, position_ids``; ``com.microsoft``:
    ``input, position_ids, cos_cache, sin_cache``): 3 FLOPs per rotated element.

    ``X`` is ``[B, N, S, H]`` or ``[B, S, N*H]``; the rotated width per head is
    ``2 * cos_cache.shape[-1]`` (``rotary_embedding_dim``); each token reads that many cos and
    sin values in total (``rot/2`` of each).
    """
    x = require(op, inputs, 0, "X")
    if op.domain == _MICROSOFT:
        pos, cos_cache = tensor_at(inputs, 1), require(op, inputs, 2, "cos_cache")
    else:
        cos_cache, pos = require(op, inputs, 1, "cos_cache"), tensor_at(inputs, 3)
    rot = 2 * cos_cache.shape[-1]
    if x.rank == 4:
        head, tokens = x.shape[3], x.shape[0] * x.shape[2]
    elif x.rank == 3:
        heads = op.attr("num_heads", 0)
        head, tokens = (x.shape[2] // heads if heads else rot), x.shape[0] * x.shape[1]
    else:
        raise ModelError(f"RotaryEmbedding node {op.name!r}: input must be 3-D or 4-D, got {x.shape}")
    if head <= 0 or rot > head:
        raise ModelError(f"RotaryEmbedding node {op.name!r}: rotary width {rot} exceeds head size {head}")
    rotated = x.numel // head * rot
    cache_bytes = tokens * rot * cos_cache.dtype.itemsize + nbytes(pos)
    y = tensor_at(outputs, 0)
    fwd = float(x.nbytes + cache_bytes + nbytes(y))
    if not needs_grad(x):
        return OpCost(float(3 * rotated), fwd, 0.0, 0.0, "elementwise")
    bwd = float(nbytes(y) + cache_bytes + grad_bytes([x]))
    return OpCost(float(3 * rotated), fwd, float(3 * rotated), bwd, "elementwise")

