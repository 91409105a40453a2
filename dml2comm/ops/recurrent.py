"""Cost rules for the ONNX recurrent layers: ``LSTM``, ``GRU`` and ``RNN``.

Each op runs one recurrent layer over ``T`` time steps for a batch of ``B`` sequences, in
``D`` directions (``D = 2`` for ``direction="bidirectional"``, else 1), with hidden size ``H``
and input size ``I``.  ``X`` is ``[T, B, I]`` (``layout=0``, the default) or ``[B, T, I]``
(``layout=1``); ``W`` is ``[D, G H, I]``, ``R`` is ``[D, G H, H]``, ``B`` is ``[D, 2 G H]``
(``Wb`` then ``Rb``), and the LSTM peephole ``P`` is ``[D, 3 H]``.  ``G`` is the number of
gates.  ``e`` below is the element size of ``X`` (the training dtype: the analysis passes it).

Equations (ONNX operator definitions, https://onnx.ai/onnx/operators/onnx__LSTM.html,
``onnx__GRU.html``, ``onnx__RNN.html``; ``*`` a matrix product, ``(.)`` element-wise):

- **LSTM**, ``G = 4``::

      it = f(Xt*(Wi^T) + Ht-1*(Ri^T) + Pi (.) Ct-1 + Wbi + Rbi)
      ft = f(Xt*(Wf^T) + Ht-1*(Rf^T) + Pf (.) Ct-1 + Wbf + Rbf)
      ct = g(Xt*(Wc^T) + Ht-1*(Rc^T) + Wbc + Rbc)
      Ct = ft (.) Ct-1 + it (.) ct
      ot = f(Xt*(Wo^T) + Ht-1*(Ro^T) + Po (.) Ct + Wbo + Rbo)
      Ht = ot (.) h(Ct)

- **GRU**, ``G = 3``::

      zt = f(Xt*(Wz^T) + Ht-1*(Rz^T) + Wbz + Rbz)
      rt = f(Xt*(Wr^T) + Ht-1*(Rr^T) + Wbr + Rbr)
      ht = g(Xt*(Wh^T) + (rt (.) Ht-1)*(Rh^T) + Rbh + Wbh)      # linear_before_reset = 0
      ht = g(Xt*(Wh^T) + (rt (.) (Ht-1*(Rh^T) + Rbh)) + Wbh)    # linear_before_reset != 0
      Ht = (1 - zt) (.) ht + zt (.) Ht-1

- **RNN**, ``G = 1``: ``Ht = f(Xt*(Wi^T) + Ht-1*(Ri^T) + Wbi + Rbi)``.

Default activations: LSTM ``f, g, h = Sigmoid, Tanh, Tanh``; GRU ``f, g = Sigmoid, Tanh``; RNN
``f = Tanh``; the ``activations`` attribute overrides them (one set per direction).

FLOPs (a multiply-add is 2 FLOPs, as in :mod:`~dml2comm.ops.linalg`), per direction and time
step:

- the gates' matrix products ``Xt W^T`` and ``Ht-1 R^T``: ``2 B G H (I + H)``;
- adding the two products: ``B G H``; the biases ``Wb + Rb``, when ``B`` is given: ``2 B G H``;
  ``clip`` (a min and a max before every activation), when set: ``2 B G H``;
- LSTM: peepholes (when ``P`` is given) ``3 x 2 B H``; ``Ct``: ``3 B H``; ``Ht = ot (.) h(Ct)``:
  ``B H``; GRU: ``rt (.) ...``: ``B H``, ``Ht``: ``4 B H`` (a subtraction, two products, an add);
- activations: the per-element forward count of each function in
  :data:`~dml2comm.ops.elementwise.POINTWISE` (Sigmoid 4, Tanh 1, Relu 1, ...), applied to each
  gate's ``B H`` elements (LSTM: f on i, f, o; g on c; h on Ct. GRU: f on z, r; g on h.
  RNN: f on H).

The total is ``D T`` times the per-step count.  ``sequence_lens`` is not read (values are never
loaded): every sequence is costed for all ``T`` steps, the padded upper bound.

Backward (back-propagation through time, Werbos 1990, "Backpropagation through time: what it
does and how to do it", Proc. IEEE 78(10)): per step the gate gradients go through ``R`` (dH)
and ``W`` (dX), and ``dW``, ``dR`` accumulate ``dGates^T X`` and ``dGates^T H``; each of the
two products of the forward gives two products of the same size, so the matmul FLOPs are 2x the
forward's (Narayanan et al. 2021, arXiv:2104.04473, derivation of eq. (3), as for every
matmul-like op here).  The element-wise part is also taken as 2x (each Hadamard product gives
two products; each activation's derivative costs about as much as the function, see
:mod:`~dml2comm.ops.elementwise`); it is ``O(B H)`` per step against ``O(B H (I + H))``.

Bytes (HBM traffic), following the cuDNN implementation described by Appleyard, Kocisky and
Blunsom 2016, "Optimizing Performance of Recurrent Neural Networks on GPUs" (arXiv:1604.01946),
Sec. 3.2: the input projections ``Xt W^T`` do not depend on the recurrence, so the ``T``
per-step products are grouped into one large GEMM: ``X`` and ``W`` are read **once per
sequence** and the projection (``T B G H`` elements per direction) is written once and read
back once by the step kernels.  The recurrent product ``Ht-1 R^T`` depends on the previous step,
so it is one GEMM per step: ``R`` is read **once per time step**.  cuDNN's persistent kernels
(Diamos et al. 2016, "Persistent RNNs: Stashing Recurrent Weights On-Chip", ICML) keep ``R`` in
registers across steps, but only while ``G H x H`` fits the GPUs' register files (small ``H``);
the plain reading (``R`` per step) is the general case and the one costed here.  Per step and
direction, the recurrent product is written and read back by the fused element-wise kernel
(``2 B G H e``), the biases and peepholes are read, and the previous states are read and the new
ones written (``2 S B H e``, ``S = 2`` states for the LSTM's ``H, C``, else 1); the new hidden
states are ``Y``, so ``Y`` is not counted again.  ``initial_h``, ``initial_c`` and
``sequence_lens`` are read once and ``Y_h``/``Y_c`` written once.

Backward bytes: the output gradients are read; ``R`` is read again per step (for dH) and ``W`` and
``X`` once (the batched dX and dW GEMMs); the saved gate activations (cuDNN's reserve space,
``T D B G H e``) and the states (``T D S B H e``) are read; the gate gradients are written and read
back by the GEMMs (``2 T D B G H e``); the input gradients (``dX``, ``dW``, ``dR``, ``dB``,
``dP``, the initial states') are written once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from dml2comm.errors import ModelError
from dml2comm.ir.graph import Op, Tensor
from dml2comm.ops._common import float_bytes, grad_bytes, nbytes, require, tensor_at, total_bytes
from dml2comm.ops.elementwise import POINTWISE
from dml2comm.ops.linalg import MATMUL_BWD_FACTOR
from dml2comm.ops.registry import OpCost, cost_rule

__all__ = ["RecurrentShape", "recurrent_shape", "recurrent_flops", "lstm", "gru", "rnn", "ACTIVATION_FLOPS"]

#: Forward FLOPs per element of the activation functions the ONNX recurrent ops accept, by their
#: ONNX names: the counts of :data:`~dml2comm.ops.elementwise.POINTWISE` where that table has the
#: function, else from the formula in the LSTM operator page ("Affine(x) - alpha*x + beta": a
#: multiply and an add; "ScaledTanh(x) - alpha*Tanh(beta*x)": two multiplies and a tanh).
ACTIVATION_FLOPS: dict[str, int] = {
    **{name: POINTWISE[name].fwd for name in ("Relu", "Tanh", "Sigmoid", "LeakyRelu", "ThresholdedRelu", "HardSigmoid",
                                               "Elu", "Softsign", "Softplus")},
    "Affine": 2,
    "ScaledTanh": 3,
}

#: Gates, states and default activations per op (ONNX operator definitions, module docstring).
_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
_STATES = {"LSTM": 2, "GRU": 1, "RNN": 1}
_DEFAULT_ACTIVATIONS = {"LSTM": ("Sigmoid", "Tanh", "Tanh"), "GRU": ("Sigmoid", "Tanh"), "RNN": ("Tanh",)}


@dataclass(frozen=True, slots=True)
class RecurrentShape:
    """Sizes of one recurrent op: steps ``T``, batch ``B``, input ``I``, hidden ``H``,
    directions ``D``, gates ``G``, states ``S`` (module docstring)."""

    steps: int
    batch: int
    input_size: int
    hidden: int
    directions: int
    gates: int
    states: int


def recurrent_shape(op: Op, inputs: Sequence[Tensor | None]) -> RecurrentShape:
    """Read ``T, B, I, H, D`` off ``X``, ``R`` and the attributes.

    Raises
    ------
    ModelError
        ``X`` is not rank 3, ``R`` disagrees with ``hidden_size`` or the gate count, or the
        direction is not one of the three the spec allows.
    """
    x = require(op, inputs, 0, "X")
    r = require(op, inputs, 2, "R")
    direction = str(op.attr("direction", "forward"))
    if direction not in ("forward", "reverse", "bidirectional"):
        raise ModelError(f"{op.op_type} node {op.name!r}: direction {direction!r} is not forward, reverse or bidirectional")
    directions = 2 if direction == "bidirectional" else 1
    if x.rank != 3 or r.rank != 3:
        raise ModelError(f"{op.op_type} node {op.name!r}: X and R must be 3-D, got {x.shape} and {r.shape}")
    steps, batch = (x.shape[1], x.shape[0]) if int(op.attr("layout", 0)) else (x.shape[0], x.shape[1])
    gates = _GATES[op.op_type]
    hidden = int(op.attr("hidden_size", 0)) or r.shape[-1]
    if r.shape[1] != gates * hidden or r.shape[2] != hidden:
        raise ModelError(
            f"{op.op_type} node {op.name!r}: R has shape {r.shape}, expected [{directions}, {gates * hidden}, {hidden}] "
            f"for hidden_size {hidden}"
        )
    return RecurrentShape(steps, batch, x.shape[2], hidden, directions, gates, _STATES[op.op_type])


def _activations(op: Op) -> tuple[str, ...]:
    """The activation names of the first direction (both directions count the same when the
    attribute lists the same functions, the only case exporters write)."""
    default = _DEFAULT_ACTIVATIONS[op.op_type]
    given = op.attr("activations")
    names = tuple(str(a) for a in given[: len(default)]) if given else default
    for name in names:
        if name not in ACTIVATION_FLOPS:
            raise ModelError(f"{op.op_type} node {op.name!r}: activation {name!r} is not one the ONNX spec defines")
    return names


def recurrent_flops(op: Op, inputs: Sequence[Tensor | None]) -> tuple[float, float]:
    """``(matmul FLOPs, element-wise FLOPs)`` of the forward pass over all steps and directions
    (module docstring)."""
    s = recurrent_shape(op, inputs)
    bh = s.batch * s.hidden
    gh = s.gates * bh
    matmul = 2 * gh * (s.input_size + s.hidden)
    acts = [ACTIVATION_FLOPS[a] for a in _activations(op)]
    pointwise = gh  # Xt W^T + Ht-1 R^T
    if tensor_at(inputs, 3) is not None:
        pointwise += 2 * gh  # + Wb + Rb
    if op.attr("clip") is not None:
        pointwise += 2 * gh  # min and max before each activation
    if op.op_type == "LSTM":
        f, g, h = acts
        if tensor_at(inputs, 7) is not None:
            pointwise += 3 * 2 * bh  # Pi (.) Ct-1, Pf (.) Ct-1, Po (.) Ct, each added
        pointwise += 3 * bh + bh  # Ct = ft Ct-1 + it ct; Ht = ot h(Ct)
        pointwise += (3 * f + g + h) * bh  # f on i, f, o; g on c; h on Ct
    elif op.op_type == "GRU":
        f, g = acts
        pointwise += bh + 4 * bh  # rt (.) ...; Ht = (1 - zt) ht + zt Ht-1
        pointwise += (2 * f + g) * bh  # f on z, r; g on h
    else:
        (f,) = acts
        pointwise += f * bh
    steps = s.steps * s.directions
    return float(steps * matmul), float(steps * pointwise)


def _recurrent_cost(op: Op, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor | None]) -> OpCost:
    s = recurrent_shape(op, inputs)
    x, w, r = require(op, inputs, 0, "X"), require(op, inputs, 1, "W"), require(op, inputs, 2, "R")
    b, seq_lens, h0 = tensor_at(inputs, 3), tensor_at(inputs, 4), tensor_at(inputs, 5)
    c0, p = tensor_at(inputs, 6), tensor_at(inputs, 7)
    e = x.dtype.itemsize
    matmul, pointwise = recurrent_flops(op, inputs)
    td = s.steps * s.directions
    gates = td * s.batch * s.gates * s.hidden * e  # one direction-step's gate values, over all steps
    states = td * s.states * s.batch * s.hidden * e
    finals = total_bytes(o for i, o in enumerate(outputs) if i >= 1)  # Y_h, Y_c (Y = the states written)
    once = nbytes(x) + nbytes(w) + nbytes(seq_lens) + nbytes(h0) + nbytes(c0) + finals
    per_step = s.steps * (nbytes(r) + nbytes(b) + nbytes(p))
    fwd_bytes = once + per_step + 2 * gates + 2 * gates + 2 * states  # projection w+r, recurrent w+r, states r+w
    bwd_bytes = (
        float_bytes(outputs)  # dY, dY_h, dY_c read
        + s.steps * nbytes(r) + nbytes(w) + nbytes(x)  # R per step (dH), W and X once (dX, dW)
        + gates + states  # saved gate activations (reserve space) and states read
        + 2 * gates  # gate gradients written and read back by the GEMMs
        + grad_bytes(t for i, t in enumerate(inputs) if i != 4)  # dX, dW, dR, dB, dh0, dc0, dP
    )
    return OpCost(matmul + pointwise, float(fwd_bytes), float(MATMUL_BWD_FACTOR * (matmul + pointwise)), float(bwd_bytes),
                  op.op_type.lower())


@cost_rule("LSTM")
def lstm(op: Op, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor | None]) -> OpCost:
    """One LSTM layer over the sequence (ONNX LSTM; module docstring)."""
    return _recurrent_cost(op, inputs, outputs)


@cost_rule("GRU")
def gru(op: Op, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor | None]) -> OpCost:
    """One GRU layer over the sequence (ONNX GRU; module docstring)."""
    return _recurrent_cost(op, inputs, outputs)


@cost_rule("RNN")
def rnn(op: Op, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor | None]) -> OpCost:
    """One simple (Elman) RNN layer over the sequence (ONNX RNN; module docstring)."""
    return _recurrent_cost(op, inputs, outputs)
