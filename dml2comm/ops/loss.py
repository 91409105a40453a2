"""Cost rules for the losses PyTorch exports with a model that is given labels:
SoftmaxCrossEntropyLoss (``F.cross_entropy``) and NegativeLogLikelihoodLoss (``F.nll_loss``).

Conventions
-----------
- ``scores``/``input`` is ``[N, C, d1, ...]`` with ``n`` elements; the labels name one class per
  sample, ``samples = numel(labels)``.
- NegativeLogLikelihoodLoss-13 (ONNX function body): gather the target log-probability (data
  movement), negate it (1 FLOP per sample), multiply by the class weight when ``weight`` is
  given (1), compare with ``ignore_index`` when that attribute is set (1); then reduce:
  ``none`` nothing, ``sum`` ``samples - 1`` adds, ``mean`` ``samples - 1`` adds and a divide
  (``samples``), plus ``samples - 1`` adds for the weight total of a weighted mean.
- SoftmaxCrossEntropyLoss-13 = LogSoftmax over the class axis (``5 n - samples``, see
  :mod:`~dml2comm.ops.norm`) + the NLL above.
- Backward: cross-entropy's ``d scores = (softmax(scores) - onehot(label)) * g`` with ``g`` the
  scaled loss gradient costs ``exp`` and a multiply per score and a subtract per sample,
  ``2 n + samples``; it reads the loss gradient, the scores, labels and weights and writes
  ``d scores``.  NLL's gradient is ``-g * w`` at each target (``samples`` or ``2 samples`` with
  weights), written into a zero ``d input`` of full size.
- Forward bytes: SoftmaxCrossEntropyLoss reads its inputs and writes its outputs; NLL reads only
  the gathered ``samples`` elements of ``input`` (plus target and weight) and writes the loss.
"""

from __future__ import annotations

from typing import Sequence

from dml2comm.ir.graph import Op, Tensor
from dml2comm.ops._common import backward_bytes, nbytes, needs_grad, require, tensor_at, total_bytes
from dml2comm.ops.registry import OpCost, cost_rule, io_bytes

__all__ = ["nll_flops", "softmax_cross_entropy_loss", "negative_log_likelihood_loss"]


def nll_flops(samples: int, weighted: bool, ignore_index: bool, reduction: str) -> int:
    """Forward FLOPs of the NLL part for ``samples`` labels (see the module docstring)."""
    per_sample = 1 + int(weighted) + int(ignore_index)
    if reduction == "none":
        reduce = 0
    elif reduction == "sum":
        reduce = samples - 1
    else:
        reduce = samples + (samples - 1 if weighted else 0)
    return per_sample * samples + reduce


def _nll_of(op: Op, samples: int, weight: Tensor | None) -> int:
    return nll_flops(samples, weight is not None, op.attr("ignore_index") is not None, str(op.attr("reduction", "mean")))


@cost_rule("SoftmaxCrossEntropyLoss")
def softmax_cross_entropy_loss(op: Op, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor | None]) -> OpCost:
    """LogSoftmax over classes (``5 n - samples``) + NLL; backward ``2 n + samples``."""
    scores = require(op, inputs, 0, "scores")
    labels = require(op, inputs, 1, "labels")
    weights = tensor_at(inputs, 2)
    n, samples = scores.numel, labels.numel
    flops = 5 * n - samples + _nll_of(op, samples, weights)
    fwd = io_bytes(inputs, outputs)
    if not needs_grad(scores):
        return OpCost(float(flops), fwd, 0.0, 0.0, "loss")
    bwd = backward_bytes(outputs[:1], (scores, labels, weights), (scores,))
    return OpCost(float(flops), fwd, float(2 * n + samples), bwd, "loss")


@cost_rule("NegativeLogLikelihoodLoss")
def negative_log_likelihood_loss(op: Op, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor | None]) -> OpCost:
    """Gather the target log-probabilities, negate, weight, reduce; backward scatters
    ``-g w`` into a zero gradient of ``input``'s size."""
    x = require(op, inputs, 0, "input")
    target = require(op, inputs, 1, "target")
    weight = tensor_at(inputs, 2)
    samples = target.numel
    flops = _nll_of(op, samples, weight)
    fwd = float(samples * x.dtype.itemsize + total_bytes(inputs[1:]) + total_bytes(outputs))
    if not needs_grad(x):
        return OpCost(float(flops), fwd, 0.0, 0.0, "loss")
    bwd = float(nbytes(tensor_at(outputs, 0)) + target.nbytes + nbytes(weight) + x.nbytes)
    return OpCost(float(flops), fwd, float(samples * (1 + int(weight is not None))), bwd, "loss")
