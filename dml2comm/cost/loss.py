"""The training loss an export leaves out: a language model's cross-entropy over its logits.

A GPT exported for training planning usually ends at its logits (``torch.onnx.export`` of the
model's ``forward``; every model of the zoo), yet every training step computes the loss from
them.  Megatron-LM computes it as the **vocabulary-parallel cross-entropy**
(``megatron/core/tensor_parallel/cross_entropy.py``, ``_VocabParallelCrossEntropy``; called
by the GPT model's ``compute_language_model_loss`` on ``logits.float()`` unless
``--fp16-lm-cross-entropy``): a chain of memory-bound passes over the local logits, a handful
of small kernels, and three all-reduces of one value per token (the all-reduces are inserted by
:mod:`dml2comm.parallel.tensor` as the graph output's collectives).  This module costs the
passes, once per micro-batch on the stage that holds the logits, as the stage table's named
``loss`` term (:class:`dml2comm.cost.stages.StageTable`): forward with the stage's forward
compute, backward with its backward compute; never recomputed (full recomputation repeats
transformer layers only).

HBM traffic per local logit (bytes), from the code path above with a 16-bit training dtype:

==========================================  =========  ==========
pass                                        forward    backward
==========================================  =========  ==========
``logits.float()`` (16-bit read, fp32 write;       6          6
backward: fp32 read, 16-bit write)
``max`` over the vocabulary (read)                 4
``sub_`` of the max (read, write)                  8
``exp`` in place (read, write)                     8
``sum`` over the vocabulary (read)                 4
``div_`` by the sum, saved softmax (r, w)          8
``mul_`` by the loss gradient (r, w)                          8
==========================================  =========  ==========

38 bytes forward and 14 backward per logit (fp32 training: no cast, 32 and 8).  Kernels (for
the host model, :mod:`dml2comm.cost.host`): 16 forward (the cast, max, subtract, target mask
and gather, exp, sum, log, loss reduction and their small index ops) and 5 backward (the
one-hot subtraction's index ops, the multiply and the cast back), counted from the same code.
A pass takes the longer of its GPU time and its host time (no GEMM to hide the launches
behind, :func:`dml2comm.cost.host.host_bound_times`'s window rule).

Added for each graph output that is language-model logits left to the training loop: a float
output whose last dimension is the vocabulary (the rows of the largest embedding table a
``Gather`` reads, :func:`dml2comm.parallel.tensor.vocab_table`) and that no op of the graph
reads.  Not added when the graph computes its loss itself (a ``SoftmaxCrossEntropyLoss`` or
``NegativeLogLikelihoodLoss`` op, or logits that other ops go on to read, as an export with
labels decomposes ``F.cross_entropy``): those ops are costed like any other.
"""

from __future__ import annotations

from dataclasses import dataclass

from dml2comm.cost.cache import CacheKey, derived
from dml2comm.ir.graph import OpGraph
from dml2comm.parallel.tensor import vocab_table

__all__ = ["CE_BWD_BYTES", "CE_BWD_KERNELS", "CE_CAST_BYTES", "CE_FWD_BYTES", "CE_FWD_KERNELS", "LOSS_OPS",
           "cross_entropy_s", "logits_outputs"]

#: fp32 bytes per local logit of the cross-entropy's forward passes: max 4, sub 8, exp 8, sum 4,
#: div 8 (module docstring).
CE_FWD_BYTES = 32
#: fp32 bytes per local logit of its backward pass: the multiply by the loss gradient, 8.
CE_BWD_BYTES = 8
#: The fp32 cast of 16-bit logits and of their gradient back: 2 + 4 bytes per logit each way.
CE_CAST_BYTES = 6
#: Kernels per micro-batch of the cross-entropy's forward (module docstring).
CE_FWD_KERNELS = 16
#: Kernels per micro-batch of its backward (module docstring).
CE_BWD_KERNELS = 5
#: ONNX ops that compute a loss inside the graph (then nothing is added).
LOSS_OPS = frozenset({"SoftmaxCrossEntropyLoss", "NegativeLogLikelihoodLoss"})


@dataclass(frozen=True, slots=True)
class _LogitsKey(CacheKey):
    pass


def logits_outputs(graph: OpGraph) -> tuple[tuple[str, int], ...]:
    """The graph's language-model logits left for the training loop's loss: ``(output name,
    producer op index)`` of each float graph output whose last dimension is the vocabulary and
    that no op reads; none when the graph has a loss op (module docstring).  Cached on the graph."""
    def build() -> tuple[tuple[str, int], ...]:
        if any(op.op_type in LOSS_OPS for op in graph.ops):
            return ()
        vocab = vocab_table(graph)
        if vocab is None:
            return ()
        rows = graph.tensors[vocab].shape[0]
        out = []
        for name in graph.outputs:
            tensor, producer = graph.tensor(name), graph.producer(name)
            if (tensor is not None and producer is not None and tensor.dtype.is_float and tensor.rank >= 2
                    and tensor.shape[-1] == rows and not graph.consumers(name)):
                out.append((name, producer))
        return tuple(out)
    return derived(graph, _LogitsKey(), build)


def cross_entropy_s(local_logits: float, train_bytes: int, hbm_bytes_per_s: float, kernel_s: float) -> tuple[float, float]:
    """(forward, backward) seconds per micro-batch of Megatron-LM's cross-entropy over
    ``local_logits`` logits on one GPU: the HBM traffic of the module docstring at
    ``hbm_bytes_per_s`` (already times the memory-bound efficiency), or the host's launch time
    (``kernel_s`` per kernel) where that is longer."""
    cast = CE_CAST_BYTES if train_bytes < 4 else 0
    fwd = local_logits * (CE_FWD_BYTES + cast) / hbm_bytes_per_s
    bwd = local_logits * (CE_BWD_BYTES + cast) / hbm_bytes_per_s
    return max(fwd, CE_FWD_KERNELS * kernel_s), max(bwd, CE_BWD_KERNELS * kernel_s)
