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
behind, :func:`dml2comm.cost.host.host_bound_times`'s window rule), except under a host model
whose CPU runs ahead of the GPU (eager PyTorch): there the loss is queued with the ops' kernels,
after the forward pass and before the backward one (:func:`queued_loss`,
:func:`dml2comm.cost.host.queue_between_times`), so that where the CPU sets the step's pace the
loss's long kernels only deepen the queue, as in the measured host-bound steps, whose whole time
is the CPU's.

With ``--stack pytorch`` the loss is Hugging Face's ``ForCausalLMLoss``
(transformers/loss/loss_utils.py: ``logits = logits.float()``, then ``F.cross_entropy``, i.e.
``log_softmax`` and ``nll_loss``), one ATen kernel per op, traffic per logit:

==================================================  =========  ==========
kernel                                              forward    backward
==================================================  =========  ==========
``logits.float()`` / its gradient back to 16 bits        6          6
``log_softmax`` (``cunn_SoftMaxForward``: max,             16
sum of exp and output passes: 3 fp32 reads, 1 write)
``nll_loss`` gradient: zero-filled fp32 buffer                          4
``_log_softmax_backward_data`` (``cunn_SoftMaxBackward``:              16
gradient read for its sum, then gradient and output
read, input gradient written)
==================================================  =========  ==========

22 bytes forward and 26 backward per logit (fp32 training: 16 and 20).  Kernels: 6 forward
(the cast, the labels' pad and two small copies, ``log_softmax``, ``nll_loss``) and 5 backward
(two fills, ``nll_loss`` backward, ``log_softmax`` backward, the cast), as the H100 traces of
GPT-2 small and Llama-1B show them (shared/data/gpu_measured/h100/trace_*.json.gz).  Checked
on those traces at the default 0.85 of 3.35 TB/s: GPT-2 small (411.7 M logits) 3.18 ms forward
for 3.36 measured, 3.76 backward for 3.59; Llama-1B (1,050.7 M logits) 8.12 for 8.85 and 9.59
for 9.05.

Memory (:func:`loss_memory_bytes`): ``log_softmax`` saves its fp32 output for backward, 4 bytes
per logit from the forward to the backward of each micro-batch (an activation); in backward
the ``nll_loss`` gradient (4) and the input gradient ``_log_softmax_backward_data`` writes (4)
join it, 8 bytes per logit of transient at the start of backward, when every activation is
still held (:func:`dml2comm.cost.memory.step_peak_bytes`).  The forward's transient (the 16-bit
logits, their fp32 copy) is 6 and never the larger.  Measured on the fake-tensor steps of
``benchmarks/fake_memory.py``: the peak is the start of backward, at activations + 12 bytes per
logit (GPT-2 small b=8: 4.94 GB of its 10.25; Llama-1B b=4: 12.6 of 34.4).  Megatron-LM's loss
memory is left as the stage's largest op transient (the 16-bit logits).

Added for each graph output that is language-model logits left to the training loop: a float
output whose last dimension is the vocabulary (the rows of the largest embedding table a
``Gather`` reads, :func:`dml2comm.parallel.tensor.vocab_table`) and that no op of the graph
reads.  Not added when the graph computes its loss itself (a ``SoftmaxCrossEntropyLoss`` or
``NegativeLogLikelihoodLoss`` op, or logits that other ops go on to read, as an export with
labels decomposes ``F.cross_entropy``): those ops are costed like any other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from dml2comm.cost.cache import CacheKey, derived
from dml2comm.ir.graph import OpGraph
from dml2comm.parallel.config import Precision, Stack
from dml2comm.parallel.tensor import vocab_table

__all__ = ["CE_BWD_BYTES", "CE_BWD_KERNELS", "CE_CAST_BYTES", "CE_FWD_BYTES", "CE_FWD_KERNELS", "HF_BWD_BYTES", "HF_BWD_KERNELS",
           "HF_FWD_BYTES", "HF_FWD_KERNELS", "HF_SAVED_BYTES", "HF_TRANSIENT_BYTES", "LOSS_OPS", "cross_entropy_s",
           "hf_loss_upcasts", "logits_outputs", "loss_memory_bytes", "graph_loss_upcasts", "loss_kernels", "queued_loss"]

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
#: Hugging Face's loss (module docstring), fp32 bytes per logit: ``log_softmax``'s three reads
#: and one write.
HF_FWD_BYTES = 16
#: ... its backward: the zero-filled ``nll_loss`` gradient (4) and ``_log_softmax_backward_data``
#: (16).
HF_BWD_BYTES = 20
#: Its kernels per micro-batch, forward and backward (module docstring, from the H100 traces).
HF_FWD_KERNELS = 6
HF_BWD_KERNELS = 5
#: Bytes per logit ``log_softmax`` saves for backward: its fp32 output.
HF_SAVED_BYTES = 4
#: Bytes per logit of the backward's transient: the fp32 ``nll_loss`` gradient and input gradient.
HF_TRANSIENT_BYTES = 8
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


def cross_entropy_s(local_logits: float, train_bytes: int, hbm_bytes_per_s: float, kernel_s: float,
                    stack: Stack | str = Stack.MEGATRON, upcast: bool = True,
                    scale: tuple[float, float] = (1.0, 1.0)) -> tuple[float, float]:
    """(forward, backward) seconds per micro-batch of the training loss over ``local_logits``
    logits on one GPU: Megatron-LM's vocabulary-parallel cross-entropy, or Hugging Face's
    ``ForCausalLMLoss`` with ``stack="pytorch"``; the HBM traffic of the module docstring at
    ``hbm_bytes_per_s`` (already times the memory-bound efficiency), or the host's launch time
    (``kernel_s`` per kernel) where that is longer.  ``upcast`` False (``stack="pytorch"`` only):
    the loss runs in the logits' own dtype (:func:`hf_loss_upcasts`), the same passes at
    ``train_bytes`` per element and no cast.  ``scale``: (forward, backward) factors of the
    kernel time (a profiled step's measured / modelled ratios, :mod:`dml2comm.cost.profile`),
    applied before the host's launch time."""
    cast = CE_CAST_BYTES if train_bytes < 4 else 0
    if Stack.of(stack) is Stack.PYTORCH:
        fwd_bytes, bwd_bytes, fwd_kernels, bwd_kernels = HF_FWD_BYTES, HF_BWD_BYTES, HF_FWD_KERNELS, HF_BWD_KERNELS
        if not upcast:
            fwd_bytes, bwd_bytes, cast = fwd_bytes * train_bytes // 4, bwd_bytes * train_bytes // 4, 0
    else:
        fwd_bytes, bwd_bytes, fwd_kernels, bwd_kernels = CE_FWD_BYTES, CE_BWD_BYTES, CE_FWD_KERNELS, CE_BWD_KERNELS
    fwd = local_logits * (fwd_bytes + cast) / hbm_bytes_per_s
    bwd = local_logits * (bwd_bytes + cast) / hbm_bytes_per_s
    return max(fwd * scale[0], fwd_kernels * kernel_s), max(bwd * scale[1], bwd_kernels * kernel_s)


def loss_kernels(stack: Stack | str) -> tuple[int, int]:
    """(forward, backward) kernels per micro-batch of the stack's loss (module docstring)."""
    return (HF_FWD_KERNELS, HF_BWD_KERNELS) if Stack.of(stack) is Stack.PYTORCH else (CE_FWD_KERNELS, CE_BWD_KERNELS)


def graph_loss_upcasts(graph: OpGraph, stack: Stack | str, precision: str, train_bytes: int) -> bool:
    """Whether the loss over ``graph``'s logits runs on fp32 logits: Megatron-LM's always
    (``logits.float()``), Hugging Face's as :func:`hf_loss_upcasts` reads the graph's attention."""
    if Stack.of(stack) is not Stack.PYTORCH:
        return True
    from dml2comm.cost.cache import flash_cores_of

    cores = flash_cores_of(graph)
    return hf_loss_upcasts(sum(c.causal for c in cores), len(cores), precision, train_bytes)


def queued_loss(local_logits: Sequence[float], train_bytes: int, hbm_bytes_per_s: float,
                stack: Stack | str, upcast: bool, scale: tuple[float, float] = (1.0, 1.0)) -> tuple[tuple[float, float, int, int], ...]:
    """Per logits output (``local_logits``: its logits on one GPU), the loss
    as work a run-ahead host model queues between the forward and the backward pass
    (:func:`dml2comm.cost.host.queue_between_times`): (forward GPU s, backward GPU s, forward
    kernels, backward kernels), the kernel time of :func:`cross_entropy_s` with no host floor."""
    k_f, k_b = loss_kernels(stack)
    out = []
    for numel in local_logits:
        f, b = cross_entropy_s(numel, train_bytes, hbm_bytes_per_s, 0.0, stack, upcast, scale)
        out.append((f, b, k_f, k_b))
    return tuple(out)


def loss_memory_bytes(local_logits: float, stack: Stack | str = Stack.MEGATRON, upcast: bool = True,
                      train_bytes: int = 2) -> tuple[float, float]:
    """(saved per micro-batch, transient) bytes of the training loss over ``local_logits``
    logits on one GPU (module docstring): Hugging Face's fp32 ``log_softmax`` output kept for
    backward and its backward's two fp32 buffers, or with ``upcast`` False the same tensors in
    the logits' dtype (``train_bytes``); none added for Megatron-LM's loss."""
    if Stack.of(stack) is Stack.PYTORCH:
        per = HF_SAVED_BYTES if upcast else train_bytes
        return local_logits * per, local_logits * 2 * per
    return 0.0, 0.0


def hf_loss_upcasts(causal_cores: int, cores: int, precision: str, train_bytes: int) -> bool:
    """Whether Hugging Face's training loss runs on fp32 logits.  Decoder-only causal language
    models compute it with ``self.loss_function``, ``ForCausalLMLoss``, which upcasts
    (``logits = logits.float()``, transformers/loss/loss_utils.py); encoder and encoder-decoder
    heads call ``CrossEntropyLoss()`` on the logits as they are (``BertForMaskedLM``,
    ``BartForConditionalGeneration``, ``T5ForConditionalGeneration`` in transformers 5.x), in
    the training dtype under pure 16-bit training; under ``torch.autocast`` ``log_softmax`` and
    ``nll_loss`` run in fp32 either way (autocast's fp32 op list), and fp32 training has nothing
    to upcast.  Decoder-only: the graph has attention cores and every one is causal
    (:class:`dml2comm.cost.attention.FlashCore`)."""
    if Precision.of(precision) is Precision.AMP or train_bytes >= 4:
        return True
    return cores > 0 and causal_cores == cores
