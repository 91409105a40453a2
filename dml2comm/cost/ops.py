"""Every op's cost and time on its tensor-parallel shard, as the training stack runs it.

One op's FLOPs and bytes come from its rule (:mod:`dml2comm.ops.registry`); a matrix product's
time (MatMul, Gemm, Conv as implicit GEMM) from the shape-aware GEMM model
(:func:`dml2comm.cost.gemm.gemm_time_s`), its forward, data-gradient and weight-gradient GEMMs
each at its own shape (:func:`dml2comm.cost.gemm.training_gemms`); every other op's time from the
roofline (:mod:`dml2comm.cost.compute`).  Then the kernels the stack runs:

- ``--stack megatron``: point-wise chains run as fused kernels (:func:`fused_kernels`,
  :func:`fuse_pointwise`): Megatron-LM's fused bias-GeLU, bias-dropout-add and
  scale-mask-softmax (Narayanan et al. 2021, Sec. 4.2).
- ``--stack pytorch`` (eager PyTorch 2.x, Hugging Face): one kernel per op, each reading its
  inputs and writing its output through HBM at the roofline (a tanh-GeLU written as eight ops is
  eight kernels), with what eager PyTorch does run as one: a linear layer's bias add is the
  GEMM's epilogue (``addmm`` / ``F.linear`` call cuBLASLt with a bias epilogue: the
  ``..._bias_...`` GEMM kernels of the bundled H100 traces, and no separate add), and an
  ``Add``'s backward passes the gradient through without a kernel (``AddBackward0`` returns
  ``grad``, torch ``derivatives.yaml``), reducing it only onto a broadcast operand
  (:func:`eager_costs`).  Float tensors eager code holds in fp32 (:func:`~dml2comm.cost.memory.fp32_islands`)
  are costed at 4 bytes per element.
- ``--attention flash``: each attention core that SDPA runs fused is one flash kernel
  (:mod:`dml2comm.cost.attention`), costed on the ``P.V`` op; its other ops cost nothing.

Backward then pays autograd's gradient sums where several kernels read one tensor
(:func:`gradient_forks`: PyTorch's ``InputBuffer::accumulate``, one add per extra reader).

The analysis (:func:`dml2comm.analysis.analyze_graph`) and the sweep's fast path
(:mod:`dml2comm.model`) both read op times through :func:`shard_op_costs`, cached per graph
under typed keys (:mod:`dml2comm.cost.cache`).  Also here: what selective recomputation
recomputes (:func:`is_attention_core`, Korthikanti et al. 2022, Sec. 5) and the model's own
sequence length (:func:`infer_seq_len`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from types import MappingProxyType
from typing import Callable, Iterable, Mapping, NamedTuple, Sequence

from dml2comm.cost.attention import BACKWARD_KERNELS, FlashCore, flash_cost, flash_shape, flash_times_s
from dml2comm.cost.cache import (CacheKey, attention_cores_of, autocast_dtypes_of, castless_rms_norms_of, derived, flash_cores_of, fp32_islands_of, grouped_products_of, gelu_calls_of, layers_of, needs_grad_of, tensor_parallel_of,
                                 weight_derived_of)
from dml2comm.cost.calibrated import NORM_OPS, class_value, gemm_regime
from dml2comm.cost.compute import FLOP_EFFICIENCY, gemm_dims, hbm_efficiency_of, op_times_s, roofline_s
from dml2comm.cost import host as host_model
from dml2comm.cost.loss import graph_loss_upcasts, logits_outputs, queued_loss
from dml2comm.cost.colsum import column_sum_s
from dml2comm.cost.gemm import IN_STEP_GEMM_SHARE, GemmShape, TrainingGemms, aligned_dim, gemm_time_s, is_aligned, training_gemms
from dml2comm.cost.host import HostModel, host_bound_times, kernel_counts
from dml2comm.cost.memory import AUTOCAST_FP32_OPS, POINTWISE_OPS, autocasts_activations, fusible_regions, linear_bias
from dml2comm.cost.norm import BATCH_NORM_OPS, LAW_NORM_OPS, UpcastRmsNorm, op_norm_times_s
from dml2comm.cost.profile import ProfileScale
from dml2comm.hardware.gpus import GPU
from dml2comm.ir.graph import GROUPED_MM, DType, Op, OpGraph, Tensor
from dml2comm.ir.layers import LayeredGraph
from dml2comm.ops.registry import OpCost, op_cost
from dml2comm.parallel.config import DTYPES, AttentionKernel, Precision, Stack
from dml2comm.parallel.tensor import TensorParallelPlan

__all__ = ["OpCosts", "op_costs", "shard_op_costs", "fused_kernels", "fuse_pointwise", "FUSED_KINDS", "REGION_ENDS",
           "infer_seq_len", "is_attention_core", "attention_head_views", "HEAD_SPLIT_OPS", "HeadViewsKey", "softmax_kernel_available", "unfused_softmax_ops", "attention_core_flags", "op_gemms", "gemm_op_times_s", "op_kernel_counts", "eager_embedding_kernels",
           "GradientFork", "gradient_forks", "gradient_sum_bytes", "GradientForksKey", "OpCostsKey", "OpSignaturesKey",
           "OpCostTableKey", "FusedGroupsKey", "AttentionCoreKey", "eager_costs", "flash_core_costs", "kernel_regions",
           "EMBEDDING_SORT_THRESHOLD", "EMBEDDING_BACKWARD_LAUNCHES"]

#: Megatron-LM pads its vocabulary to a multiple of ``--make-vocab-size-divisible-by`` (default
#: 128) times t (megatron/training/tokenizer: ``_vocab_size_with_padding``), so the embedding and
#: LM-head GEMMs it runs are aligned: under ``--stack megatron`` an unaligned GEMM row length is
#: timed padded to this multiple (on the tensor-parallel shard, a multiple of 128 too).
MEGATRON_PAD = 128
#: Ops a fused kernel absorbs: point-wise chains and the softmax they feed (Megatron-LM's
#: fused bias-GeLU, bias-dropout-add and scale-mask-softmax kernels).
FUSED_KINDS = POINTWISE_OPS | frozenset({"Softmax", "LogSoftmax"})
#: Reductions that end a fused kernel: they absorb the point-wise ops feeding them (scale and
#: mask) but not the ones reading their output.  Megatron-LM's ``FusedScaleMaskSoftmax`` fuses
#: scale, mask and softmax only; the attention dropout after it is its own kernel
#: (``ParallelAttention.forward``: ``attention_probs = self.attention_dropout(attention_probs)``
#: after ``self.scale_mask_softmax(...)``, Megatron-LM v2.x, as Narayanan et al. 2021 ran it,
#: Sec. 4.2: "two custom kernels to enable the fusion of scale, mask, and softmax").
REGION_ENDS = frozenset({"Softmax", "LogSoftmax"})
#: Bytes per score element of the two casts around Megatron-LM's unfused attention softmax in
#: fp32 (``FusedScaleMaskSoftmax.forward_torch_softmax`` with ``softmax_in_fp32``, which
#: ``--apply-query-key-layer-scaling`` forces: on by default in Megatron-DeepSpeed and in
#: Megatron-LM before 2023, ``--no-query-key-layer-scaling`` then): 16-bit read
#: and fp32 written before, fp32 read and 16-bit written after (2 + 4 + 4 + 2), in each pass
#: (the backward casts the gradients the same way).
SOFTMAX_CAST_BYTES = 12
#: Eager PyTorch's 16-bit convolutions on NCHW tensors (the default memory format) run cuDNN's
#: NHWC kernels between layout conversions (``cudnn::engines_precompiled::nchwToNhwcKernel`` and
#: ``nhwcToNchwKernel``): on the bundled H100 ResNet-18 trace
#: (``benchmarks/data/gpu_steps/h100_trace_resnet18_bf16_b256_s224.json.gz``, cuDNN 9.19) each
#: convolution converts its input and output forward, the output's gradient and the input's
#: gradient in the data-gradient pass, and its input and the output's gradient again in the
#: weight-gradient pass (78 activation conversions to NHWC and 38 back for 20 convolutions, the
#: stem's input needing no gradient), each a read and a write of the tensor.  Their rate, as a
#: share of the HBM bandwidth: 14.18 GB moved by that rule in 7.57 ms of conversion kernels =
#: 1.87 TB/s = 0.559 of 3.35 TB/s.  Held out: the b = 128 step (3.79 ms predicted, 3.98 measured,
#: -5%), the AMP step (7.62 ms measured) and the b = 256 step of a second process (7.61 ms).
CONV_LAYOUT_HBM_SHARE = 0.559
#: The conversion kernels per 16-bit convolution, (forward, backward), read off the same trace
#: (166 conversions for 20 convolutions): forward its input, weight and output, backward the
#: output's gradient twice, the weight, the weight's gradient and the input's gradient (one fewer
#: where the input needs no gradient), besides the convolution's own kernels; none for a 1x1
#: stride-1 convolution, which cuDNN mostly runs on NCHW directly (``_pointwise_conv``).
CONV_LAYOUT_KERNELS = (3, 5)
#: Kernels of an eager training-mode BatchNorm beyond one per pass (:mod:`dml2comm.cost.norm`),
#: (forward, backward): the running-statistics update and the normalisation after the
#: statistics (4 BatchNorm kernels per layer and step in the bundled H100 ResNet-18 trace).
BATCH_NORM_EXTRA_KERNELS = (2, 0)
#: An eager embedding's backward (``embedding_dense_backward_cuda``, aten/src/ATen/native/cuda/
#: Embedding.cu) takes a direct path up to this many indices (``num_indices <= 3072 &&
#: !scale_grad_by_freq``): a zero-filled table gradient and one ``embedding_backward_feature_kernel``.
#: Above it, a sorted path: the indices radix-sorted (cub), segments found and scanned, the
#: partial sums and their scatter.
EMBEDDING_SORT_THRESHOLD = 3072
#: Its launches (kernels and memsets), direct and sorted, counted on the H100 traces of
#: ``benchmarks/data/gpu_steps/`` (the CPU op ``aten::embedding_dense_backward`` and the launches
#: inside it, every GPT-2, Llama, Qwen2 and BERT trace): 2 kernels at
#: <= 3,072 indices; 21 kernels and 10 memsets above (24 and 10 for BERT's 30,522-row table).
EMBEDDING_BACKWARD_LAUNCHES = (2, 31)
#: Layout ops that can sit between a projection and the attention core's batched products as
#: strided views (:func:`attention_head_views`); the view ops among them cost nothing anyway.
HEAD_SPLIT_OPS = frozenset({"Split", "Transpose", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity"})


class OpCosts(NamedTuple):
    """Per op of a graph (index order), on its tensor-parallel shard."""

    costs: list[OpCost]  #: FLOPs and bytes of the shard, forward and backward
    times: list[tuple[float, float]]  #: (forward, backward) seconds, point-wise chains fused
    full_flops: list[float]  #: forward FLOPs of the unsharded op (shard FLOPs x shard factor)
    fallback_types: set[str]  #: op types costed by the memory-bound fallback (``--lenient``)
    #: under a run-ahead host model (eager PyTorch, :data:`dml2comm.cost.host.PYTORCH`): the
    #: times before it, so that ``times`` less these is the GPU's wait for the CPU; else None
    kernel_times: list[tuple[float, float]] | None = None
    #: under a run-ahead host model, per logits output the training loss's (producer op,
    #: forward s, backward s, forward kernel s, backward kernel s) in the same queue between the
    #: two passes (:func:`dml2comm.cost.host.queue_between_times`); else empty (the stage tables
    #: time the loss by :func:`dml2comm.cost.loss.cross_entropy_s`' own floor)
    loss: tuple[tuple[int, float, float, float, float], ...] = ()
    #: the kernels the host model charges ``kernel_s`` for (the ops', and the queued loss's), 0
    #: without a host model
    launches: int = 0
    #: those of ``launches`` in the forward pass (the ops' forward kernels, the loss's forward)
    forward_launches: int = 0


# ----------------------------------------------------------------------------- cache keys
@dataclass(frozen=True, slots=True)
class OpCostsKey(CacheKey):
    """:func:`shard_op_costs`: the shard (t, SP, dtype), the GPU (its name picks the GEMM
    model's table and sustained factor; peak FLOP/s in ``dtype`` and HBM bandwidth) and ``--lenient``."""

    tp_size: int
    sequence_parallel: bool
    dtype: str
    gpu_name: str
    peak_flops: float
    hbm_bytes_per_s: float
    lenient: bool
    #: the GPU's calibrated (GEMM sustained factor, HBM efficiency) (``calibrate``), None for presets
    calibration: tuple[float | None, float | None] = (None, None)
    #: the host-side model (:mod:`dml2comm.cost.host`); None: :data:`dml2comm.cost.host.DEFAULT`
    host: HostModel | None = None
    #: the training stack (eager or fused point-wise kernels) and the attention kernel
    stack: str = Stack.MEGATRON
    attention: str = AttentionKernel.UNFUSED
    #: activations in torch.autocast's dtypes, with its casts (cost.memory.autocasts_activations)
    autocast: bool = False
    #: measured / modelled kernel-time ratios per layer kind (``--profile``: cost.profile), None: none
    profile: ProfileScale | None = None


@dataclass(frozen=True, slots=True)
class OpSignaturesKey(CacheKey):
    """Per op, its type, domain, attributes and repeat count as text (the graph alone)."""


@dataclass(frozen=True, slots=True)
class OpCostTableKey(CacheKey):
    """The table of op costs already computed, by (signature, operands): one per training
    dtype and GPU, shared by every sharding of the graph (:func:`op_costs`)."""

    train: DType
    gpu_name: str
    peak_flops: float
    hbm_bytes_per_s: float
    lenient: bool
    #: what else of the GPU the costs read: its calibrated values, SMs and L2
    calibration: tuple = (None, None)
    #: the multiple unaligned GEMM row lengths are padded to before timing (:data:`MEGATRON_PAD`
    #: under Megatron-LM), None: timed as exported
    pad: int | None = None


@dataclass(frozen=True, slots=True)
class FusedGroupsKey(CacheKey):
    """Fused kernels of two or more ops with their crossing tensors (the graph alone)."""


@dataclass(frozen=True, slots=True)
class FusedKernelsKey(CacheKey):
    """:func:`fused_kernels` (the graph and its layers, which the graph fixes)."""


@dataclass(frozen=True, slots=True)
class GradientForksKey(CacheKey):
    """:func:`gradient_forks` with the kernels of the stack and attention kernel (:func:`kernel_regions`)."""

    stack: str = Stack.MEGATRON
    attention: str = AttentionKernel.UNFUSED


@dataclass(frozen=True, slots=True)
class HeadViewsKey(CacheKey):
    """:func:`attention_head_views` (the graph alone)."""


@dataclass(frozen=True, slots=True)
class AttentionCoreKey(CacheKey):
    """:func:`attention_core_flags` for one sequence length and attention kernel."""

    seq_len: int | None
    attention: str = AttentionKernel.UNFUSED


# ----------------------------------------------------------------------------- op costs
def shard_op_costs(graph: OpGraph, tp_size: int, sequence_parallel: bool, dtype: str, gpu: GPU, lenient: bool,
                   host: HostModel | None = None, stack: str = Stack.MEGATRON,
                   attention: str = AttentionKernel.UNFUSED, precision: str = Precision.MIXED,
                   profile: ProfileScale | None = None, layered: LayeredGraph | None = None) -> OpCosts:
    """:func:`op_costs` on the (t, SP) shard in ``dtype`` on ``gpu`` with the host model ``host``
    (None: :data:`dml2comm.cost.host.DEFAULT`) for the training ``stack``, ``attention`` kernel
    and ``precision`` mode, its kernel times scaled by ``profile`` per the kind of each op's layer
    in ``layered`` (None: the graph's own layers), once per those inputs (cached on the graph; the
    analysis and the sweep share it)."""
    peak, hbm = gpu.peak_flops(dtype), gpu.kernel_hbm_bytes_per_s
    train = DTYPES[dtype]
    host = host_model.DEFAULT if host is None else host
    stack, attention = Stack.of(stack), AttentionKernel.of(attention)
    autocast = autocasts_activations(stack, precision, train.itemsize)

    def build() -> OpCosts:
        tp = tensor_parallel_of(graph, tp_size, sequence_parallel, train.itemsize)
        scale = None
        if profile is not None:
            lay = layered if layered is not None else layers_of(graph)
            scale = [profile.factor(lay.layers[lay.layer_of_op[i]].kind) for i in range(len(graph.ops))]
        loss = ()
        if host.run_ahead:  # the loss the graph leaves out, queued between the passes
            locals_ = [(producer, tp.shards[producer].outputs[graph.ops[producer].outputs.index(name)].numel)
                       for name, producer in logits_outputs(graph)]
            upcast = graph_loss_upcasts(graph, stack, precision, train.itemsize)
            factor = profile.factor("loss") if profile is not None else (1.0, 1.0)
            work = queued_loss([n for _, n in locals_], train.itemsize, hbm * hbm_efficiency_of(gpu), stack, upcast, factor)
            loss = tuple((producer, w) for (producer, _), w in zip(locals_, work))
        return op_costs(graph, tp, train, gpu, peak, hbm, lenient, host, stack, attention, autocast, scale, loss)

    calibration = (gpu.gemm_sustained_factor, gpu.hbm_efficiency, tuple(sorted(gpu.calibrated_classes.items())))
    return derived(graph, OpCostsKey(tp_size, sequence_parallel, dtype, gpu.name, peak, hbm, lenient, calibration, host,
                                     stack, attention, autocast, profile), build)


def op_costs(graph: OpGraph, tp: TensorParallelPlan, train: DType, gpu: GPU, peak: float, hbm: float, lenient: bool,
             host: HostModel | None = None, stack: str = Stack.MEGATRON,
             attention: str = AttentionKernel.UNFUSED, autocast: bool = False,
             scale: Sequence[tuple[float, float]] | None = None,
             loss: Sequence[tuple[int, tuple[float, float, int, int]]] = ()) -> OpCosts:
    """Cost and time of every op on its tensor-parallel shard, and the unsharded forward FLOPs.

    Parameters
    ----------
    graph, tp
        The graph and its tensor-parallel plan (one shard per op).
    train
        Training element type: float operands are costed in it.
    gpu, peak, hbm
        The GPU (the GEMM model reads its SM count, peaks and name:
        :func:`~dml2comm.cost.gemm.gemm_time_s`), its dense peak in ``train`` (FLOP/s) and HBM
        bandwidth (bytes/s).
    lenient
        Cost ops without a rule as memory-bound (their types in ``fallback_types``) instead of
        raising :class:`~dml2comm.errors.UnsupportedOpError`.
    host
        The host-side model (None: :data:`dml2comm.cost.host.DEFAULT`).
    stack
        ``megatron``: point-wise chains fused; ``pytorch``: eager, one kernel per op
        (:func:`eager_costs`), fp32 islands at 4 bytes (module docstring).
    attention
        ``flash``: the flash cores as one kernel each (:func:`flash_core_costs`); ``unfused``:
        the core's ops as exported.
    scale
        Per op, (forward, backward) factors of its kernel time (a profiled step's measured /
        modelled ratios: :mod:`dml2comm.cost.profile`), applied before the host model; None: 1.
    loss
        Per logits output, its producer op and :func:`dml2comm.cost.loss.queued_loss`'s work:
        queued between the passes under a run-ahead host model (``OpCosts.loss``), else ignored.

    Returns
    -------
    OpCosts
        Times: matrix products by the GEMM model (:func:`gemm_op_times_s`), every other op by
        the roofline (Williams et al. 2009) with ``FLOP_EFFICIENCY`` and ``HBM_EFFICIENCY``; then
        point-wise chains fused (:func:`fuse_pointwise`, Megatron only); then flash kernels;
        then the host's per-kernel floor (:func:`dml2comm.cost.host.host_bound_times`, kernels
        by :func:`op_kernel_counts`).  Steps: :func:`_shard_costs`, :func:`_head_split_views`,
        the stack's kernels, :func:`_softmax_fp32_casts`, :func:`_gradient_sums`, casts, host.
    """
    stack, attention = Stack.of(stack), AttentionKernel.of(attention)
    eager = stack is Stack.PYTORCH
    # under torch.autocast every activation has autocast's dtype (cost.memory.autocast_dtypes):
    # the residual stream, norms and fp32-list ops in fp32, GEMM and SDPA outputs 16-bit
    amp = autocast_dtypes_of(graph, train, True) if autocast else {}
    norms, train_view = _eager_fp32(graph, eager, amp, train)
    # a calibrated GPU's own memory-bound efficiency (``calibrate``: element-wise), else the preset constant
    hbm_eff = hbm_efficiency_of(gpu)
    costs, times, full_flops, fallback_types, is_gemm, norm_kernels = _shard_costs(graph, tp, train, gpu, peak, hbm, lenient, stack,
                                                                                 train_view)
    _head_split_views(graph, costs, times)
    if eager:
        costs, times = _eager_stack(graph, tp, train_view, costs, times, hbm, hbm_eff, norm_kernels, gpu, train, is_gemm,
                                    peak / gpu.peak_flops("fp32") if amp else 1.0)
        unfused: frozenset[int] = frozenset()
    else:
        unfused = unfused_softmax_ops(graph, tp, train)
        times = fuse_pointwise(graph, tp, train, costs, times, peak * FLOP_EFFICIENCY, hbm * hbm_eff, unfused)
    flash = flash_cores_of(graph) if attention is AttentionKernel.FLASH else ()
    costs, times, unfused = _attention_kernels(graph, tp, train, gpu, peak, hbm * hbm_eff, flash, unfused, costs, times)
    forks = derived(graph, GradientForksKey(stack, attention), lambda: gradient_forks(graph, kernel_regions(graph, stack, attention)))
    costs, times, sums = _gradient_sums(forks, tp, train, costs, times, hbm * hbm_eff) if forks else (costs, times, [0] * len(costs))
    counted = costs  # the ops' own kernels; the casts below count theirs (``casts``)
    costs, times, casts = _stack_casts(graph, tp, amp, eager and train.itemsize < 4, train_view, norms, is_gemm, flash,
                                       costs, times, hbm * hbm_eff)
    if scale is not None:
        times = [(f * sf, b * sb) for (f, b), (sf, sb) in zip(times, scale)]
    host, kernel_times = host_model.DEFAULT if host is None else host, times  # the times before the host model
    queued, launches = (), (0, 0)
    if host.kernel_s > 0:
        kernels = op_kernel_counts(graph, counted, is_gemm, unfused, train.itemsize == 2, kernel_regions(graph, stack, attention), flash)
        times, queued, launches = _host_times(times, _more_kernels(kernels, sums, casts, norm_kernels), is_gemm, host, loss)
    return OpCosts(costs, times, full_flops, fallback_types, kernel_times if host.run_ahead else None, queued, *launches)


def _in_step_gemms(graph: OpGraph, tp: TensorParallelPlan, train: DType, gpu: GPU, is_gemm: Sequence[bool],
                   times: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Eager PyTorch's linear-layer GEMMs at :data:`dml2comm.cost.gemm.IN_STEP_GEMM_SHARE` of the
    GEMM law's time: the non-batched products whose every GEMM is aligned (the unaligned ones run
    cuBLAS's fallback kernels, as measured alone).  Not where the GPU's GEMM factor was
    calibrated (``calibrate``: a global factor, or a class value for the product's regime): that
    factor was fitted on a profiled step's own GEMMs, which ran in a step already."""
    if gpu.gemm_sustained_factor is not None:
        return list(times)
    out = list(times)
    for i, op in enumerate(graph.ops):
        if not is_gemm[i] or op.op_type not in ("MatMul", "Gemm"):
            continue
        shard = tp.shards[i]
        gemms = op_gemms(op.op_type, shard.inputs, shard.outputs, op.attrs)
        if gemms is None or not all(g.b == 1 and is_aligned(train.label, *g) for g in gemms):
            continue
        if gpu.calibrated_classes and any(class_value(gpu, gemm_regime(2.0 * g.m * g.n * g.k, True), min(g.m, g.n, g.k)) is not None
                                          for g in gemms):
            continue
        out[i] = (times[i][0] * IN_STEP_GEMM_SHARE, times[i][1] * IN_STEP_GEMM_SHARE)
    return out


def _attention_kernels(graph: OpGraph, tp: TensorParallelPlan, train: DType, gpu: GPU, peak: float, hbm: float,
                       flash: Sequence[FlashCore], unfused: frozenset[int], costs: list[OpCost], times: list[tuple[float, float]]
                       ) -> tuple[list[OpCost], list[tuple[float, float]], frozenset[int]]:
    """The flash cores as one kernel each (:func:`flash_core_costs`, at the GPU's calibrated
    attention factors where ``calibrate`` kept them), and the fp32 casts around each unfused
    16-bit softmax left (:func:`_softmax_fp32_casts`).  ``hbm``: the achieved HBM rate.  Returns
    the costs, the times and the unfused softmax ops left."""
    if flash:
        costs, times = flash_core_costs(flash, tp, train, costs, times, peak, hbm,
                                        (class_value(gpu, "attention_fwd") or 1.0, class_value(gpu, "attention_bwd") or 1.0))
        unfused = frozenset(i for i in unfused if not any(i in core.ops for core in flash))
    if unfused and train.itemsize == 2:
        times = _softmax_fp32_casts(graph, tp, unfused, times, hbm)
    return costs, times, unfused


def _host_times(times: list[tuple[float, float]], kernels: list[tuple[int, int]], is_gemm: Sequence[bool], host: HostModel,
                loss: Sequence[tuple[int, tuple[float, float, int, int]]]
                ) -> tuple[list[tuple[float, float]], tuple[tuple[int, float, float, float, float], ...], tuple[int, int]]:
    """The op times with the host model (:func:`dml2comm.cost.host.host_bound_times`); under a
    run-ahead model the loss queued between the passes: per logits output (producer op, its
    forward and backward time in the queue, its forward and backward kernel time); and the
    kernels charged ``kernel_s`` (the ops', the queued loss's), all and the forward pass's."""
    between = [work for _, work in loss] if host.run_ahead else []
    times, loss_times = host_bound_times(times, kernels, is_gemm, host, between)
    forward = sum(f for f, _ in kernels) + sum(w[2] for w in between)
    launches = (sum(f + b for f, b in kernels) + sum(w[2] + w[3] for w in between), forward)
    if not loss_times:
        return times, (), launches
    return times, tuple((i, f, b, w[0], w[1]) for (i, w), (f, b) in zip(loss, loss_times)), launches


def _eager_stack(graph: OpGraph, tp: TensorParallelPlan, view: Callable[[str, Tensor | None], Tensor | None],
                 costs: list[OpCost], times: list[tuple[float, float]], hbm: float, hbm_eff: float,
                 extra_kernels: dict[int, tuple[int, int]], gpu: GPU, train: DType, is_gemm: Sequence[bool],
                 fp32_slowdown: float = 1.0) -> tuple[list[OpCost], list[tuple[float, float]]]:
    """The eager-PyTorch kernels on top of the op rules: :func:`eager_costs` (bias adds, gradient
    sums to broadcast operands, GELU calls), :func:`eager_conv_layouts` and
    :func:`eager_autograd_costs`, whose extra (forward, backward) kernels are added to
    ``extra_kernels`` in place, with BatchNorm's (:data:`BATCH_NORM_EXTRA_KERNELS`); first the
    GEMMs at their in-step share (:func:`_in_step_gemms`).  ``hbm``: the GPU's kernel bandwidth;
    ``hbm_eff``: its memory-bound efficiency; ``gpu`` (its SMs for the column sums' law,
    :mod:`dml2comm.cost.colsum`), ``train`` (the training dtype) and ``is_gemm`` (which ops are
    matrix products): for the GEMMs' in-step share; ``fp32_slowdown``: under autocast, the grouped
    expert products' (:func:`fp32_grouped_products`), 1 otherwise."""
    times = _in_step_gemms(graph, tp, train, gpu, is_gemm, times)  # the products alone, before the bias sums join them
    times = fp32_grouped_products(graph, times, fp32_slowdown) if fp32_slowdown != 1.0 else times
    sums = ColumnSums(hbm, gpu.sm_count)
    costs, times = eager_costs(graph, tp, view, costs, times, hbm * hbm_eff, sums)
    costs, times, conv = eager_conv_layouts(graph, tp, view, costs, times, hbm)
    costs, times, routing = eager_expert_routing(graph, tp, view, costs, times, hbm)
    costs, times, autograd = eager_autograd_costs(graph, tp, view, costs, times, hbm * hbm_eff, sums)
    batch_norm = {op.index: BATCH_NORM_EXTRA_KERNELS for op in graph.ops if op.op_type in BATCH_NORM_OPS and not costs[op.index].fallback}
    for more in (conv, routing, autograd, batch_norm, eager_embedding_kernels(graph, costs)):
        for i, (f, b) in more.items():
            f0, b0 = extra_kernels.get(i, (0, 0))
            extra_kernels[i] = (f0 + f, b0 + b)
    return costs, times


#: Hugging Face's grouped-GEMM experts (transformers ``grouped_mm``, the default on a GPU) around
#: the grouped products of each MoE layer, read off set 6's bf16 Mixtral-style traces (H200; the
#: b = 4 and b = 2 ones bundled in ``benchmarks/data/gpu_steps/held_out/``, recomputed by
#: ``benchmarks/fit_held_out_traces.py``): (1) ``masked_fill_`` over the routed rows (``[P, n]`` with a ``[P, 1]`` mask, P =
#: tokens x top-k): each product's output and the first product's input, forward and on their
#: gradients, at :data:`EXPERT_FILL_SHARE` of the kernel bandwidth (1.50-1.54 TB/s on the H200:
#: 0.367-0.377); (2) the sorts, gathers and scatter-adds that put the rows in expert order and
#: back (``sort``, ``index``, ``_index_put_impl_``, ``histc``, ``cumsum``, ``scatter_``): 126 us a
#: layer plus :data:`EXPERT_ROUTING_BYTES` per routed row element of the hidden size at the kernel
#: bandwidth (272 us a layer at P h = 16.8 M, 199 us at 8.4 M); (3) their launches: 1,800 kernels
#: in the b = 4 trace where the export's ops make 1,323, about 60 more a layer (as in set 7's
#: traces).  The host model's CPU time per kernel (:data:`dml2comm.cost.host.PYTORCH`, fitted on
#: the export-modelled counts of dense models) charges those small launches too much: counted
#: whole, set 6's bf16 steps came out +15 to +25%; :data:`EXPERT_ROUTING_KERNELS` is fitted on
#: set 6's three bf16 steps instead (10 a pass: 3.3% mean; 0: 11.2%, 15: 4.1%, 30: 19.4%).  Held
#: out, set 7's top-1-of-4 and top-4-of-16 models (``benchmarks/bench_held_out.py``): 9.4% mean
#: over their six steps, 18.1% before this routing was costed.
EXPERT_FILL_SHARE = 0.37
#: The routing's fixed time a MoE layer (seconds; :data:`EXPERT_FILL_SHARE` says how it was read).
EXPERT_ROUTING_LAYER_S = 126e-6
#: The routing's bytes per routed row element of the hidden size, at the kernel bandwidth (the same).
EXPERT_ROUTING_BYTES = 36.0
#: The routing's (forward, backward) launches a MoE layer charged to the host model: fitted on set
#: 6's bf16 step times (:data:`EXPERT_FILL_SHARE`), of about 60 launched a layer.
EXPERT_ROUTING_KERNELS = (10, 10)


def eager_expert_routing(graph: OpGraph, tp: TensorParallelPlan, view: Callable[[str, Tensor | None], Tensor | None],
                         costs: list[OpCost], times: list[tuple[float, float]], hbm: float
                         ) -> tuple[list[OpCost], list[tuple[float, float]], dict[int, tuple[int, int]]]:
    """The routing work eager Hugging Face experts run around their grouped products
    (:data:`~dml2comm.ir.graph.GROUPED_MM`, :data:`EXPERT_FILL_SHARE` and the constants beside
    it), charged to each MoE layer's products: every product its output's masked fill, forward
    and backward; the first of a layer also its input's and the layer's sorts, gathers and
    scatters, with their launches.  ``hbm``: the GPU's kernel bandwidth (bytes/s)."""
    kernels: dict[int, tuple[int, int]] = {}
    grouped = [graph.ops[i] for i in grouped_products_of(graph) if not costs[i].fallback]
    if not grouped:
        return costs, times, kernels
    costs, times = list(costs), list(times)
    layer_of = layers_of(graph).layer_of_op
    first = {}
    for op in grouped:
        first.setdefault(layer_of[op.index], op.index)
    for op in grouped:
        shard = tp.shards[op.index]
        rows = view(op.inputs[1], shard.inputs[1] if len(shard.inputs) > 1 else None)
        out = view(op.outputs[0], shard.outputs[0] if shard.outputs else None)
        if rows is None or out is None or rows.rank != 2 or out.rank != 2:
            continue
        t = out.dtype.itemsize
        fill = 2.0 * out.numel * t * op.repeat
        _add_traffic(costs, times, op.index, fill, fill, hbm * EXPERT_FILL_SHARE, "; expert rows masked (grouped_mm)")
        if first[layer_of[op.index]] != op.index:
            continue
        head = 2.0 * rows.numel * rows.dtype.itemsize * op.repeat
        _add_traffic(costs, times, op.index, head, head, hbm * EXPERT_FILL_SHARE, "")
        route = (EXPERT_ROUTING_LAYER_S * hbm + EXPERT_ROUTING_BYTES * rows.numel) * op.repeat / 2
        _add_traffic(costs, times, op.index, route, route, hbm, "; expert routing (sort, gather, scatter)")
        kernels[op.index] = EXPERT_ROUTING_KERNELS
    return costs, times, kernels


def eager_embedding_kernels(graph: OpGraph, costs: Sequence[OpCost]) -> dict[int, tuple[int, int]]:
    """Per embedding lookup (a ``Gather`` from a weight whose table gradient is computed), the
    backward launches eager PyTorch runs beyond the one the op rule counts: the direct or the
    sorted path of :data:`EMBEDDING_BACKWARD_LAUNCHES`, by its indices' count
    (:data:`EMBEDDING_SORT_THRESHOLD`; every micro-batch's token, not sharded)."""
    out = {}
    for op in graph.ops:
        if op.op_type != "Gather" or len(op.inputs) < 2 or costs[op.index].bytes_bwd <= 0:
            continue
        table, indices = graph.tensors.get(op.inputs[0]), graph.tensors.get(op.inputs[1])
        if table is None or indices is None or not table.is_weight or indices.dtype.is_float:
            continue
        direct, sorted_ = EMBEDDING_BACKWARD_LAUNCHES
        out[op.index] = (0, (sorted_ if indices.numel > EMBEDDING_SORT_THRESHOLD else direct) - 1)
    return out


def _stack_casts(graph: OpGraph, tp: TensorParallelPlan, amp: dict[str, DType], eager16: bool,
                 view: Callable[[str, Tensor | None], Tensor | None], norms: Sequence[UpcastRmsNorm], is_gemm: Sequence[bool],
                 flash: Sequence[FlashCore], costs: list[OpCost], times: list[tuple[float, float]], rate: float
                 ) -> tuple[list[OpCost], list[tuple[float, float]], list[tuple[int, int]]]:
    """The casts the stack adds, with their kernels per op: autocast's (``amp``), else in a pure
    16-bit eager step (``eager16``) the fp32 softmaxes' and RMSNorms' the export does not show."""
    if amp:
        return autocast_cast_costs(graph, tp, amp, is_gemm, costs, times, rate)
    if eager16:
        costs, times, casts = eager_fp32_softmax_costs(graph, tp, view, costs, times, rate, flash)
        return (*eager_rms_norm_upcasts(graph, tp, view, norms, costs, times, rate), casts)
    return costs, times, [(0, 0)] * len(costs)


def fp32_grouped_products(graph: OpGraph, times: list[tuple[float, float]], slowdown: float) -> list[tuple[float, float]]:
    """Under ``torch.autocast`` the routed expert products (:data:`~dml2comm.ir.graph.GROUPED_MM`)
    run in fp32 on the CUDA cores: ``torch._grouped_mm`` is on neither of autocast's lists and
    its fast path takes bf16 operands only (``aten/src/ATen/native/cuda/GroupedBlas.cpp``), so
    transformers' fallback multiplies the fp32 operands expert by expert, without tensor cores
    (``cutlass_80_simt_sgemm`` and ``sm80_xmma_gemm_f32f32`` kernels in the measured AMP trace of
    ``benchmarks/data/gpu_steps/held_out/``, no TF32: PyTorch's default).  Their times are the
    16-bit GEMM model's scaled by the peaks' ratio (``slowdown``: dense 16-bit over plain fp32,
    14.8 on an H100 or H200) at the same efficiency.  Measured: that step took 169.8 ms, 2.9x its
    bf16 step; its fp32 GEMM kernels ran 4.9 TFLOP at about 45 TFLOP/s (0.67 of the 67 TFLOP/s
    plain fp32 peak)."""
    grouped = grouped_products_of(graph)
    if not grouped:
        return times
    times = list(times)
    for i in grouped:
        times[i] = (times[i][0] * slowdown, times[i][1] * slowdown)
    return times


def _eager_fp32(graph: OpGraph, eager: bool, amp: Mapping[str, DType], train: DType
                ) -> tuple[tuple[UpcastRmsNorm, ...], Callable[[str, Tensor | None], Tensor | None]]:
    """The RMSNorms eager code upcasts that the export shows without casts (pure 16-bit training
    only: under autocast its own casts rule), and the stack's view of every tensor
    (:func:`_train_view`) with their squares and mean in fp32 beside the export's fp32 islands."""
    norms = castless_rms_norms_of(graph) if eager and train.itemsize < 4 and not amp else ()
    fp32 = fp32_islands_of(graph) if eager and train.itemsize < 4 else frozenset()
    return norms, _train_view(fp32.union(*(n.inner for n in norms)) if norms else fp32, amp, train)


def _more_kernels(kernels: list[tuple[int, int]], sums: list[int] | None, casts: list[tuple[int, int]] | None,
                  norm_kernels: Mapping[int, tuple[int, int]]) -> list[tuple[int, int]]:
    """Per op, its (forward, backward) kernels (:func:`op_kernel_counts`) with the ones added
    after it: autograd's gradient sums (``sums``, backward), autocast's casts (``casts``) and an
    eager norm's extra backward kernels (``norm_kernels``); None: none of that kind."""
    if sums is not None or casts is not None:
        sums = sums if sums is not None else [0] * len(kernels)
        casts = casts if casts is not None else [(0, 0)] * len(kernels)
        kernels = [(f + cf, b + extra + cb) for (f, b), extra, (cf, cb) in zip(kernels, sums, casts)]
    for i, (f, b) in norm_kernels.items():
        kernels[i] = (kernels[i][0] + f, kernels[i][1] + b)
    return kernels


def _train_view(fp32: frozenset[str], amp: Mapping[str, DType], train: DType) -> Callable[[str, Tensor | None], Tensor | None]:
    """A float tensor as the stack holds it: in fp32 in eager code's fp32 islands
    (:func:`~dml2comm.cost.memory.fp32_islands`), in autocast's dtype under ``torch.autocast``
    (``amp``; weights in ``train``), else in ``train``."""

    def train_view(name: str, t: Tensor | None) -> Tensor | None:
        if t is None or not t.dtype.is_float:
            return t
        want = DType.FLOAT if name in fp32 else amp.get(name, train) if not t.is_weight else train
        return t if t.dtype is want else t.with_dtype(want)

    return train_view


def _shard_costs(graph: OpGraph, tp: TensorParallelPlan, train: DType, gpu: GPU, peak: float, hbm: float, lenient: bool,
                 stack: Stack, train_view: Callable[[str, Tensor | None], Tensor | None]):
    """Every op alone on its shard: its cost (:func:`~dml2comm.ops.registry.op_cost`), its
    (forward, backward) seconds (:func:`gemm_op_times_s` for a matrix product, else the
    roofline :func:`~dml2comm.cost.compute.op_times_s`; an eager LayerNorm/RMSNorm by
    :func:`_eager_norm`), its unsharded forward FLOPs, the fallback types, whether it is a GEMM
    and the eager norms' extra backward kernels: ``(costs, times, full_flops, fallback_types,
    is_gemm, norm_kernels)``."""
    costs: list[OpCost] = []
    times: list[tuple[float, float]] = []
    fallback_types: set[str] = set()
    full_flops: list[float] = []
    # an op's cost and times depend on its type, attributes and operands' shapes and kinds only
    # (the cost rules read no names): repeated blocks, and the same op under another sharding
    # that leaves its operands alike, are costed once per graph
    signature = derived(graph, OpSignaturesKey(), lambda: _op_signatures(graph))
    pad = MEGATRON_PAD if stack == Stack.MEGATRON else None
    is_gemm: list[bool] = []
    known: dict[tuple, tuple[OpCost, tuple[float, float], bool, int]] = derived(
        graph, OpCostTableKey(train, gpu.name, peak, hbm, lenient, (gpu.gemm_sustained_factor, gpu.hbm_efficiency,
                                                                 tuple(sorted(gpu.calibrated_classes.items())),
                                                                 gpu.sm_count, gpu.l2_bytes), pad), dict)
    # a calibrated GPU's own memory-bound efficiencies (``calibrate``: element-wise, and the
    # normalisation/reduction class of NORM_OPS), else the preset constant
    hbm_eff = hbm_efficiency_of(gpu)
    norm_eff = hbm_efficiency_of(gpu, "norm")
    # eager LayerNorm/RMSNorm: PyTorch's kernels' own law (cost.norm) times the calibrated
    # ``layer_norm`` scale (a calibrated ``norm`` efficiency is the other NORM_OPS'); the table
    # key tells the stacks apart by ``pad`` (set under Megatron only)
    norm_law, ln_scale = stack is Stack.PYTORCH, class_value(gpu, "layer_norm") or 1.0
    norm_kernels: dict[int, tuple[int, int]] = {}
    # (name, the shard's tensor) -> its train view and what a cost rule reads of it (_operand):
    # once per tensor, not per read (the shards share their tensors; they outlive this loop)
    seen: dict[tuple[str, int], tuple[Tensor | None, tuple | None]] = {}

    def operands(names: Sequence[str], tensors: Sequence[Tensor | None]) -> tuple[tuple, tuple]:
        found = []
        for name, t in zip(names, tensors):
            got = seen.get((name, id(t)))
            if got is None:
                view = train_view(name, t)
                got = seen[(name, id(t))] = (view, _operand(view))
            found.append(got)
        return tuple([v for v, _ in found]), tuple([o for _, o in found])

    for op, shard in zip(graph.ops, tp.shards):
        ins, read_ins = operands(op.inputs, shard.inputs)
        outs, read_outs = operands(op.outputs, shard.outputs)
        key = (signature[op.index], read_ins, read_outs)
        hit = known.get(key)
        if hit is None:  # the law and its extra backward kernels depend on the key's shapes only
            law = _eager_norm(op, ins, gpu, hbm) if norm_law and op.op_type in LAW_NORM_OPS else None
            c = op_cost(op, ins, outs, lenient=lenient)
            gemm = None if c.fallback or not gpu.sm_count else gemm_op_times_s(op, c, ins, outs, train, gpu, peak, pad)
            eff = norm_eff if op.op_type in NORM_OPS else hbm_eff
            t = None if law is None else (ln_scale * law[0][0] * op.repeat,
                                          ln_scale * law[0][1] * op.repeat if c.bytes_bwd > 0 else 0.0)
            if gemm is None and t is None:
                t = op_times_s(c, peak, hbm, FLOP_EFFICIENCY, eff)
            extra = law[1] if law is not None and c.bytes_bwd > 0 else 0
            hit = known[key] = (c, gemm if gemm is not None else t, gemm is not None, extra)
        c, t, g, extra = hit
        if extra:
            norm_kernels[op.index] = (0, extra)
        is_gemm.append(g)
        if c.fallback:
            fallback_types.add(op.op_type)
        costs.append(c)
        times.append(t)
        full_flops.append(c.flops_fwd * shard.factor)
    return costs, times, full_flops, fallback_types, is_gemm, norm_kernels


def _head_split_views(graph: OpGraph, costs: list[OpCost], times: list[tuple[float, float]]) -> None:
    """Megatron's attention head split, in place: Q, K and V are strided views of the
    projection's output read by the batched GEMMs (:func:`attention_head_views`), at no cost;
    the Split's backward still assembles the projection's input gradient from the three
    gradients (one copy)."""
    for i in attention_head_views(graph):
        c = costs[i]
        keep_bwd = graph.ops[i].op_type == "Split"
        costs[i] = OpCost(0.0, 0.0, 0.0, c.bytes_bwd if keep_bwd else 0.0, "view (attention head split)")
        times[i] = (0.0, times[i][1] if keep_bwd else 0.0)


def _softmax_fp32_casts(graph: OpGraph, tp: TensorParallelPlan, unfused: frozenset[int], times: list[tuple[float, float]],
                        bandwidth: float) -> list[tuple[float, float]]:
    """``times`` with the casts around each unfused 16-bit softmax: Megatron's
    forward_torch_softmax with softmax_in_fp32 (forced by query-key layer scaling, the default of
    Megatron-DeepSpeed and of Megatron-LM before 2023) casts the scores to fp32 before and the
    probabilities back after the softmax, two more kernels per pass (:data:`SOFTMAX_CAST_BYTES`
    per score element at ``bandwidth``, the achieved HBM bytes/s)."""
    times = list(times)
    for i in unfused:
        if graph.ops[i].op_type == "Softmax" and tp.shards[i].outputs and tp.shards[i].outputs[0] is not None:
            extra = tp.shards[i].outputs[0].numel * SOFTMAX_CAST_BYTES / bandwidth
            times[i] = (times[i][0] + extra, times[i][1] + extra)
    return times


def _gradient_sums(forks: Sequence[GradientFork], tp: TensorParallelPlan, train: DType, costs: list[OpCost],
                   times: list[tuple[float, float]], bandwidth: float) -> tuple[list[OpCost], list[tuple[float, float]], list[int]]:
    """Autograd's sums of the gradients of a tensor that several kernels read
    (:func:`gradient_forks`): one add per extra reader (:func:`gradient_sum_bytes` at
    ``bandwidth``, the achieved HBM bytes/s), charged to the backward of its first reader (the
    last to run).  Returns the costs, the times and per op its extra backward kernels."""
    times = list(times)
    sums = [0] * len(costs)
    for fork in forks:
        moved = gradient_sum_bytes(fork, tp, train)
        i = fork.reader
        _add_traffic(costs, times, i, 0, moved, bandwidth, f" + gradient sum of its input's {fork.extra + 1} readers")
        sums[i] += fork.extra
    return costs, times, sums


def _add_traffic(costs: list[OpCost], times: list[tuple[float, float]], i: int, fwd_bytes: float, bwd_bytes: float,
                 rate: float, note: str) -> None:
    """In place: op ``i`` moves ``fwd_bytes`` / ``bwd_bytes`` more in its forward / backward, timed
    at ``rate`` (bytes/s), with ``note`` appended to its rule."""
    c = costs[i]
    costs[i] = OpCost(c.flops_fwd, c.bytes_fwd + fwd_bytes, c.flops_bwd, c.bytes_bwd + bwd_bytes, f"{c.rule}{note}", c.fallback)
    times[i] = (times[i][0] + fwd_bytes / rate, times[i][1] + bwd_bytes / rate)


def _eager_norm(op: Op, ins: Sequence[Tensor | None], gpu: GPU, hbm: float) -> tuple[tuple[float, float], int] | None:
    """An eager LayerNorm/RMSNorm's or BatchNorm's (forward, backward) seconds and extra backward
    kernels by :func:`dml2comm.cost.norm.op_norm_times_s` on its shard's input, or None (another op)."""
    x = ins[0] if ins else None
    if x is None or not x.dtype.is_float:
        return None
    return op_norm_times_s(op.op_type, int(op.attr("axis", -1)), tuple(x.shape), x.dtype.itemsize, gpu, hbm)


def autocast_cast_costs(graph: OpGraph, tp: TensorParallelPlan, amp: dict[str, DType], is_gemm: Sequence[bool],
                        costs: list[OpCost], times: list[tuple[float, float]], hbm: float
                        ) -> tuple[list[OpCost], list[tuple[float, float]], list[tuple[int, int]]]:
    """The cast kernels ``torch.autocast`` and autograd add to an fp32 model's step (each read
    4, write 2 bytes per element or the reverse), charged to the op that causes them, with their
    kernels for the host model (``aten/src/ATen/autocast_mode.cpp``; autograd's engine casts a
    gradient to its input's dtype, ``validate_outputs`` in ``torch/csrc/autograd/engine.cpp``):

    - **Weights** (:func:`_autocast_weight_casts`): a matrix product's or convolution's weight
      and a linear layer's bias, once per parameter and forward (autocast caches the cast of a
      leaf tensor for the region: a tied table the LM head reads once), and the cast's backward
      (``ToCopyBackward0``: the 16-bit gradient back to the fp32 ``.grad``).
    - **Activations into a 16-bit product** (:func:`_autocast_input_casts`): each fp32 input of a
      matrix product or flash core, one copy per product (activations are not cached), and its
      backward where the input needs a gradient.
    - **16-bit activations into fp32** (:func:`_autocast_promotion_casts`): an op of autocast's
      fp32 list (``pow``, ``layer_norm``, ``softmax``, ...) casts its 16-bit input forward and the
      gradient back; an op that type promotion runs in fp32 (a 16-bit GEMM output added to the
      fp32 residual stream) casts nothing forward (TensorIterator reads mixed dtypes), but its
      backward hands the 16-bit input an fp32 gradient that autograd casts.

    Widening casts (16 bits to fp32) run at :data:`WIDENING_CAST_SHARE` of the memory-bound rate.
    GPT-2 small under AMP: 340 cast kernels per step, the number of ``bfloat16_copy`` and
    ``direct_copy`` kernels more than its bf16 step in the bundled H100 traces
    (``benchmarks/data/gpu_steps/``)."""
    costs, times = list(costs), list(times)
    kernels = [(0, 0)] * len(costs)
    grads = needs_grad_of(graph)
    flash = {core.context_op: (core.q, core.k, core.v) for core in flash_cores_of(graph)}
    in_core = {i for core in flash_cores_of(graph) for i in core.ops}
    seen: set[str] = set()
    low = _low_of(amp)
    for op in graph.ops:
        if (op.index in in_core and op.index not in flash) or op.aten == GROUPED_MM:  # fp32 operands: no casts
            continue
        product = op.index in flash or (is_gemm[op.index] and op.op_type != "Conv")
        parts = [_autocast_weight_casts(graph, tp, op, amp, low, seen, is_gemm[op.index])]
        if product:
            parts.append(_autocast_input_casts(graph, tp, op, amp, grads, flash.get(op.index)))
        elif not is_gemm[op.index]:
            parts.append(_autocast_promotion_casts(graph, tp, op, amp, grads))
        c = CastPasses(*(sum(x) for x in zip(*parts)))
        if c.fwd_kernels or c.bwd_kernels:
            _add_traffic(costs, times, op.index, c.fwd_narrow, c.bwd_narrow, hbm, " + autocast casts")
            _add_traffic(costs, times, op.index, c.fwd_widen, c.bwd_widen, hbm * WIDENING_CAST_SHARE, "")
            kernels[op.index] = (c.fwd_kernels, c.bwd_kernels)
    return costs, times, kernels


def _local_input(tp: TensorParallelPlan, op: Op, k: int) -> Tensor | None:
    """``op``'s ``k``-th input as this rank holds it (its tensor-parallel shard)."""
    ins = tp.shards[op.index].inputs
    return ins[k] if k < len(ins) else None


def _autocast_weight_casts(graph: OpGraph, tp: TensorParallelPlan, op: Op, amp: Mapping[str, DType], low: DType,
                           seen: set[str], gemm: bool) -> CastPasses:
    """The casts of the weights ``op`` reads as autocast's lower-precision op: a product's or convolution's weight
    operands and bias (``addmm``/``linear``/``conv`` cast the bias with the weight), or the bias
    of a linear layer's exported ``Add`` (:func:`~dml2comm.cost.memory.linear_bias`); each
    parameter once per forward (``seen``: the ones cast already; ``low``: autocast's dtype)."""
    if gemm:
        indices = range(min(len(op.inputs), 3))
    elif linear_bias(graph, op, amp, low):
        indices = range(len(op.inputs))
    else:
        return NO_CASTS
    casts = []
    for k in indices:
        name = op.inputs[k]
        t = graph.tensor(name) if name else None
        local = _local_input(tp, op, k)
        if t is None or not t.is_weight or not t.dtype.is_float or local is None:
            continue
        fresh = [s for s in graph.parameter_sources(name) if s not in seen]
        if fresh:
            seen.update(fresh)
            casts.append((local.numel, True, any(graph.tensor(s).is_parameter for s in fresh), False))
    return _casts(casts)


def _low_of(amp: Mapping[str, DType]) -> DType:
    """The 16-bit dtype of an autocast dtype map (bf16 where it holds none)."""
    return next((d for d in amp.values() if d.is_float and d.itemsize == 2), DType.BFLOAT16)


def _autocast_input_casts(graph: OpGraph, tp: TensorParallelPlan, op: Op, amp: Mapping[str, DType], grads: frozenset[str],
                          core: tuple[str, str, str] | None) -> CastPasses:
    """The casts of a 16-bit product's fp32 activation inputs (``core``: a flash core's Q, K, V,
    which SDPA casts; its scores never exist)."""
    if core is not None:
        operands = [(n, _local_of(graph, tp, n)) for n in core]
    else:
        operands = [(n, _local_input(tp, op, k)) for k, n in enumerate(op.inputs)]
    return _casts((local.numel, True, name in grads, False) for name, local in operands
                  if name and local is not None and (t := graph.tensor(name)) is not None and not t.is_weight
                  and amp.get(name) is DType.FLOAT)


class CastPasses(NamedTuple):
    """Bytes and kernels of an op's casts, forward and backward, narrowing (fp32 to 16 bits:
    PyTorch's vectorized ``bfloat16_copy``/``half`` kernels) and widening (16 bits to fp32: its
    unrolled ``direct_copy`` kernel, :data:`WIDENING_CAST_SHARE`)."""

    fwd_narrow: float
    fwd_widen: float
    bwd_narrow: float
    bwd_widen: float
    fwd_kernels: int
    bwd_kernels: int


NO_CASTS = CastPasses(0.0, 0.0, 0.0, 0.0, 0, 0)
#: The rate of a widening cast (bf16 or fp16 to fp32) as a share of the memory-bound rate the tool
#: gives a kernel (kernel bandwidth x HBM efficiency): PyTorch vectorizes only the narrowing
#: copies (``bfloat16_copy_kernel_cuda``, ``aten/src/ATen/native/cuda/Copy.cu``) and runs the
#: others through the unrolled ``direct_copy_kernel_cuda``.  Measured in the bundled H100 AMP
#: traces of GPT-2 small and Llama-1B (``benchmarks/data/gpu_steps/``, 2026-11-28): the nine
#: widening casts of >= 4 M elements ran 1.78-2.01 TB/s (median 1.88), the narrowing ones
#: 2.89-3.1 TB/s, where the tool's rate is 3.35 x 0.85 = 2.85 TB/s: 1.88 / 2.85 = 0.66.
WIDENING_CAST_SHARE = 0.66


def _casts(casts: Iterable[tuple[float, bool, bool, bool]]) -> CastPasses:
    """:class:`CastPasses` of casts given as (elements, cast forward, cast back in backward,
    the forward cast widens): each a pass of 4 + 2 bytes per element, the backward one in the
    other direction."""
    out = [0.0, 0.0, 0.0, 0.0, 0, 0]
    for numel, forward, backward, widens in casts:
        if forward:
            out[1 if widens else 0] += numel * (4 + 2)
            out[4] += 1
        if backward:
            out[2 if widens else 3] += numel * (2 + 4)
            out[5] += 1
    return CastPasses(*out)


def _local_of(graph: OpGraph, tp: TensorParallelPlan, name: str) -> Tensor | None:
    """``name`` on this rank, as its producer writes it."""
    prod = graph.producer(name)
    if prod is None:
        return None
    outs = tp.shards[prod].outputs
    k = graph.ops[prod].outputs.index(name)
    return outs[k] if k < len(outs) else None


def _autocast_promotion_casts(graph: OpGraph, tp: TensorParallelPlan, op: Op, amp: Mapping[str, DType],
                              grads: frozenset[str]) -> CastPasses:
    """The casts of 16-bit activations an op runs in fp32: an op of autocast's fp32 list casts
    each forward and its gradient back; another op whose output type promotion makes fp32 casts
    only the gradient (``Cast`` is an op of its own and has its own costs)."""
    if op.op_type == "Cast" or not op.outputs or amp.get(op.outputs[0]) is not DType.FLOAT:
        return NO_CASTS
    fp32_list = op.op_type in AUTOCAST_FP32_OPS

    def low(name: str) -> bool:  # a 16-bit activation
        t, dtype = graph.tensor(name), amp.get(name)
        return t is not None and not t.is_weight and dtype is not None and dtype.is_float and dtype.itemsize == 2

    return _casts((local.numel, fp32_list, name in grads, True) for k, name in enumerate(op.inputs)
                  if name and low(name) and (local := _local_input(tp, op, k)) is not None)


def kernel_regions(graph: OpGraph, stack: str, attention: str) -> dict[int, int]:
    """op index -> kernel id for the ops that share a kernel: Megatron's fused point-wise
    regions (:func:`fused_kernels`), in eager PyTorch each ``F.gelu`` the export wrote as
    primitives (:mod:`dml2comm.cost.gelu`, id its first op), and each flash core (its ops, one
    kernel, id its ``P.V`` op) with ``attention`` flash."""
    if Stack.of(stack) is Stack.PYTORCH:  # each F.gelu written as primitives: aten's one kernel
        regions = {i: call.ops[0] for call in gelu_calls_of(graph) for i in call.ops}
    else:
        regions = dict(fused_kernels(graph))
    if AttentionKernel.of(attention) is AttentionKernel.FLASH:
        for core in flash_cores_of(graph):
            for i in core.ops:
                regions[i] = -1 - core.context_op  # negative: never a fused region's id (an op index)
    return regions


class ColumnSums(NamedTuple):
    """The GPU terms of eager column sums (:func:`dml2comm.cost.colsum.column_sum_s`)."""

    hbm_bytes_per_s: float  #: the GPU's kernel HBM bandwidth
    sm_count: int | None

    def seconds(self, reduced: Tensor, of: Tensor) -> float:
        """One reduction of the gradient of ``of``'s shape onto ``reduced``'s (fewer elements):
        ``of.numel / reduced.numel`` rows of ``reduced.numel`` columns in ``of``'s dtype."""
        cols = max(reduced.numel, 1)
        return column_sum_s(of.numel // cols, cols, of.dtype.itemsize, self.hbm_bytes_per_s, self.sm_count)


def eager_costs(graph: OpGraph, tp: TensorParallelPlan, view: Callable[[str, Tensor | None], Tensor | None],
                costs: list[OpCost], times: list[tuple[float, float]], hbm: float, sums: ColumnSums | None = None
                ) -> tuple[list[OpCost], list[tuple[float, float]]]:
    """The eager-PyTorch kernels of ops the export split from what PyTorch runs as one, or runs
    without a kernel (module docstring); every other op keeps its own cost.

    - A linear layer's bias ``Add`` (a 1-D weight added to the output of a MatMul/Gemm that reads
      a weight, read by nothing else): forward in the GEMM's epilogue (``torch.addmm`` / ``F.linear``
      with cuBLASLt's bias epilogue), no kernel, no HBM traffic of its own.
    - An ``Add``'s backward (``AddBackward0``): the gradient passes through to an operand of
      the output's shape without a kernel; an operand broadcast to it (a bias, a mask) gets
      the gradient summed onto its shape (autograd's ``sum_to``): one reduction that reads the
      output gradient and writes the operand's gradient, one add per output element, timed by
      the column-sum law (``sums``, :mod:`dml2comm.cost.colsum`; without one at ``hbm``).
    - A ``Gemm``'s bias (``addmm``, GPT-2's ``Conv1D``): its gradient is the same column sum of the
      output gradient (``addmm``'s backward, ``grad.sum(0)``), added to the backward when
      ``sums`` is given.
    - An ``F.gelu`` written as primitives: one kernel per pass (:func:`eager_gelu_costs`).

    ``view(name, tensor)``: a shard tensor as costed (the training dtype, fp32 islands);
    ``hbm``: the achieved HBM rate (bytes/s)."""
    needs = needs_grad_of(graph)
    costs, times = list(costs), list(times)
    for op in graph.ops:
        if sums is not None and op.op_type == "Gemm":
            _gemm_bias_sum(op, tp, view, needs, costs, times, sums)
            continue
        if op.op_type != "Add" or len(op.inputs) != 2 or op.domain not in ("", "ai.onnx") or costs[op.index].fallback:
            continue
        i, shard = op.index, tp.shards[op.index]
        out = view(op.outputs[0], shard.outputs[0]) if op.outputs and shard.outputs else None
        if out is None or not out.dtype.is_float:
            continue
        ins = [view(n, t) for n, t in zip(op.inputs, shard.inputs)]
        reduced = [t for n, t in zip(op.inputs, ins) if t is not None and n in needs and t.numel < out.numel]
        bwd_bytes = float(out.nbytes + sum(t.nbytes for t in reduced)) * op.repeat if reduced else 0.0
        flops_bwd = float(out.numel) * op.repeat if reduced else 0.0
        c = costs[i]
        fwd = (c.flops_fwd, c.bytes_fwd, times[i][0], c.rule)
        if _is_linear_bias(graph, op):
            fwd = (0.0, 0.0, 0.0, "bias add in the GEMM's epilogue (addmm)")
        costs[i] = OpCost(fwd[0], fwd[1], flops_bwd, bwd_bytes, f"{fwd[3]}; eager backward (AddBackward0)", c.fallback)
        bwd = (sum(sums.seconds(t, out) for t in reduced) * op.repeat) if sums is not None else bwd_bytes / hbm
        times[i] = (fwd[2], bwd)
    return eager_gelu_costs(graph, tp, view, costs, times, hbm)


def _gemm_bias_sum(op: Op, tp: TensorParallelPlan, view: Callable[[str, Tensor | None], Tensor | None], needs: frozenset[str],
                   costs: list[OpCost], times: list[tuple[float, float]], sums: ColumnSums) -> None:
    """In place: a ``Gemm`` whose bias (third input) needs a gradient gets its column sum in the
    backward (:func:`eager_costs`): the output gradient read once, the bias gradient written."""
    c = costs[op.index]
    if len(op.inputs) < 3 or op.inputs[2] not in needs or c.fallback or not op.outputs:
        return
    shard = tp.shards[op.index]
    out = view(op.outputs[0], shard.outputs[0]) if shard.outputs else None
    bias = view(op.inputs[2], shard.inputs[2]) if len(shard.inputs) > 2 else None
    if out is None or bias is None or not out.dtype.is_float or bias.numel >= out.numel:
        return
    costs[op.index] = OpCost(c.flops_fwd, c.bytes_fwd, c.flops_bwd, c.bytes_bwd + (out.nbytes + bias.nbytes) * op.repeat,
                             f"{c.rule}; the bias gradient's column sum (addmm)", c.fallback)
    times[op.index] = (times[op.index][0], times[op.index][1] + sums.seconds(bias, out) * op.repeat)


def eager_autograd_costs(graph: OpGraph, tp: TensorParallelPlan, view: Callable[[str, Tensor | None], Tensor | None],
                         costs: list[OpCost], times: list[tuple[float, float]], hbm: float, sums: ColumnSums | None = None
                         ) -> tuple[list[OpCost], list[tuple[float, float]], dict[int, tuple[int, int]]]:
    """The backward kernels eager autograd runs where the op rules count one fused pass
    (PyTorch ``tools/autograd/derivatives.yaml`` and ``FunctionsManual.cpp``):

    - ``Pow`` with a constant scalar exponent (``PowBackward0``, ``pow_backward``):
      ``grad * (exponent * self.pow(exponent - 1))``, three kernels over the input's shape that
      read and write 7 tensors of it where the fused formula reads 2 and writes 1;
    - ``Mul`` (``MulBackward0``, ``mul_tensor_backward``): one kernel per operand gradient, each
      reading the output gradient (read twice when both operands need one), and for an operand
      broadcast to the output (a norm's weight, ``x * rsqrt(var)``'s factor) a gradient of the
      output's shape written and then summed to the operand's (``sum_to``: one more kernel).

    ``hbm``: the achieved HBM rate (bytes/s); ``sums``: the column-sum law's GPU terms, which time
    each ``sum_to`` (:mod:`dml2comm.cost.colsum`; without them its read is timed at ``hbm``).
    Returns the costs, the times and per op its extra (forward, backward) kernels."""
    needs = needs_grad_of(graph)
    costs, times = list(costs), list(times)
    extra_kernels: dict[int, tuple[int, int]] = {}
    in_gelu = {i for call in gelu_calls_of(graph) for i in call.ops}  # one kernel per pass (eager_gelu_costs)
    for op in graph.ops:
        c = costs[op.index]
        if (op.op_type not in ("Pow", "Mul") or op.index in in_gelu or c.fallback or c.bytes_bwd <= 0 or len(op.inputs) != 2
                or not op.outputs):
            continue
        shard = tp.shards[op.index]
        ins = [view(n, t) for n, t in zip(op.inputs, shard.inputs)]
        out = view(op.outputs[0], shard.outputs[0]) if shard.outputs else None
        if out is None or any(t is None for t in ins):
            continue
        grads = [t for n, t in zip(op.inputs, ins) if n in needs and t.dtype.is_float]
        if op.op_type == "Pow":
            if ins[1].numel != 1 or op.inputs[0] not in needs:
                continue
            extra, kernels = 4.0 * ins[0].nbytes, 2  # 7 passes where the rule counts 3
        else:
            broadcast = [t for t in grads if t.numel < out.numel]
            extra = (out.nbytes if len(grads) == 2 else 0) + 2.0 * out.nbytes * len(broadcast)
            kernels = len(broadcast)
            if sums is not None and broadcast:  # the sum_to's read of the written gradient: the column-sum law
                extra -= out.nbytes * len(broadcast)
                f, b = times[op.index]
                c = costs[op.index]
                costs[op.index] = OpCost(c.flops_fwd, c.bytes_fwd, c.flops_bwd, c.bytes_bwd + out.nbytes * len(broadcast) * op.repeat,
                                         c.rule, c.fallback)
                times[op.index] = (f, b + sum(sums.seconds(t, out) for t in broadcast) * op.repeat)
        if extra <= 0:
            continue
        _add_traffic(costs, times, op.index, 0, extra * op.repeat, hbm, "; eager autograd's kernels")
        if kernels:
            extra_kernels[op.index] = (0, kernels)
    return costs, times, extra_kernels


def _pointwise_conv(graph: OpGraph, op: Op) -> bool:
    """A 1x1 convolution with stride 1, no padding and one group: cuDNN runs most of them on the
    NCHW tensors directly, without layout conversions.  Measured on the held-out ResNet-50 step
    (``benchmarks/data/gpu_steps/held_out/``, H200, cuDNN 9.19, b = 128): 27 of its 33 such
    convolutions launched no conversion forward (the six that did, five at 7 x 7 and one at
    14 x 14, two each; the trace is bundled there, ``benchmarks/fit_held_out_traces.py`` counts
    them); its stride-2 1x1 and its 3x3 and 7x7 convolutions converted as
    ResNet-18's (:data:`CONV_LAYOUT_KERNELS`).  Costed with conversions, its conversions came out
    12.4 ms against 6.3 ms in the trace, the step +9% (b = 128) and +30% (b = 64, the
    conversions' launches on the CPU); without them -11% and -2%.  ResNet-18 has none (its 1x1
    convolutions are stride-2)."""
    w = graph.tensor(op.inputs[1]) if len(op.inputs) > 1 else None
    if w is None or w.rank < 3 or any(d != 1 for d in w.shape[2:]):
        return False
    ones = [int(v) for key in ("strides", "dilations") for v in (op.attr(key) or ())]
    pads = [int(v) for v in (op.attr("pads") or ())]
    return int(op.attr("group", 1)) == 1 and all(v == 1 for v in ones) and not any(pads) and op.attr("auto_pad", "NOTSET") in (
        "NOTSET", "VALID")


def eager_conv_layouts(graph: OpGraph, tp: TensorParallelPlan, view: Callable[[str, Tensor | None], Tensor | None],
                       costs: list[OpCost], times: list[tuple[float, float]], hbm: float
                       ) -> tuple[list[OpCost], list[tuple[float, float]], dict[int, tuple[int, int]]]:
    """Each 16-bit ``Conv``'s cuDNN layout conversions in eager PyTorch (:data:`CONV_LAYOUT_HBM_SHARE`):
    forward reads and writes its input and output once each; backward its output's gradient
    twice, its input once and its input's gradient once where the input needs one, at
    ``CONV_LAYOUT_HBM_SHARE`` of the GPU's HBM bandwidth ``hbm`` (bytes/s).  Also returns each
    convolution's extra (forward, backward) kernels (:data:`CONV_LAYOUT_KERNELS`)."""
    needs = needs_grad_of(graph)
    costs, times = list(costs), list(times)
    kernels: dict[int, tuple[int, int]] = {}
    rate = hbm * CONV_LAYOUT_HBM_SHARE
    for op in graph.ops:
        if op.op_type != "Conv" or costs[op.index].fallback or not op.outputs or _pointwise_conv(graph, op):
            continue
        shard = tp.shards[op.index]
        x = view(op.inputs[0], shard.inputs[0]) if shard.inputs else None
        y = view(op.outputs[0], shard.outputs[0]) if shard.outputs else None
        if x is None or y is None or y.dtype.itemsize != 2:  # the convolution runs in its output's dtype (autocast's too)
            continue
        nx, ny = x.numel * 2, y.numel * 2  # the 16-bit copies cuDNN converts (autocast casts an fp32 input first)
        fwd = 2.0 * (nx + ny) * op.repeat
        bwd = 2.0 * (2 * ny + nx + (nx if op.inputs[0] in needs else 0)) * op.repeat
        _add_traffic(costs, times, op.index, fwd, bwd, rate, "; cuDNN NCHW/NHWC layout conversions")
        f, b = CONV_LAYOUT_KERNELS
        kernels[op.index] = (f, b if op.inputs[0] in needs else b - 1)
    return costs, times, kernels


def eager_gelu_costs(graph: OpGraph, tp: TensorParallelPlan, view: Callable[[str, Tensor | None], Tensor | None],
                     costs: list[OpCost], times: list[tuple[float, float]], hbm: float) -> tuple[list[OpCost], list[tuple[float, float]]]:
    """Each ``F.gelu`` the export wrote as primitives (:func:`dml2comm.cost.gelu.gelu_calls`) as
    eager PyTorch runs it: one kernel that reads x and writes the output (``aten::gelu``) and one
    backward kernel that reads the output's gradient and x and writes x's gradient
    (``gelu_backward``), at the roofline's memory term (``hbm``: the achieved HBM rate; its few
    FLOPs per element never bind); the cost sits on the call's last op, its other ops have none.
    ``view(name, tensor)``: a shard tensor as costed (module docstring of :func:`eager_costs`)."""
    costs, times = list(costs), list(times)
    for call in gelu_calls_of(graph):
        last = call.ops[-1]
        x_op = next(i for i in call.ops if call.x in graph.ops[i].inputs)
        x = view(call.x, tp.shards[x_op].inputs[list(graph.ops[x_op].inputs).index(call.x)])
        y = view(call.out, tp.shards[last].outputs[list(graph.ops[last].outputs).index(call.out)])
        if x is None or y is None or any(costs[i].fallback for i in call.ops):
            continue
        repeat = graph.ops[last].repeat
        flops_f, flops_b = (sum(getattr(costs[i], f) for i in call.ops) for f in ("flops_fwd", "flops_bwd"))
        fwd_bytes, bwd_bytes = float(x.nbytes + y.nbytes) * repeat, float(2 * x.nbytes + y.nbytes) * repeat
        for i in call.ops:
            costs[i] = OpCost(0.0, 0.0, 0.0, 0.0, "in the GELU kernel (aten::gelu)")
            times[i] = (0.0, 0.0)
        costs[last] = OpCost(flops_f, fwd_bytes, flops_b, bwd_bytes, "eager F.gelu: one kernel per pass (aten::gelu, gelu_backward)")
        times[last] = (fwd_bytes / hbm, bwd_bytes / hbm)
    return costs, times


def eager_fp32_softmax_costs(graph: OpGraph, tp: TensorParallelPlan, view: Callable[[str, Tensor | None], Tensor | None],
                             costs: list[OpCost], times: list[tuple[float, float]], hbm: float, flash: Sequence[FlashCore] = ()
                             ) -> tuple[list[OpCost], list[tuple[float, float]], list[tuple[int, int]]]:
    """The softmaxes eager code runs in fp32 in a 16-bit model, where the export shows no cast
    (``aten.softmax.int(..., torch.float32)`` in the dynamo exporter's record: transformers'
    ``eager_attention_forward``, ``softmax(scores, dtype=torch.float32).to(query.dtype)``): ATen
    converts the input first (``SoftMax.cpp``: only Half takes the fused ``half_to_float`` path),
    the softmax runs in fp32, and ``.to`` converts back; the backward runs the same three kernels
    on the gradient.  Per element of an input of ``t`` bytes: forward ``(t + 4) + 8 + (4 + t)``
    bytes, backward ``(t + 4) + 12 + (4 + t)``, two more kernels per pass (returned per op like
    :func:`autocast_cast_costs`' casts).  Not for a softmax in an fp32 island the export shows
    (its casts are ops of their own) or in a flash core."""
    costs, times = list(costs), list(times)
    casts = [(0, 0)] * len(costs)
    in_flash = {i for core in flash for i in core.ops}
    for op in graph.ops:
        if op.op_type != "Softmax" or op.fx_dtype != "float32" or op.index in in_flash or not op.outputs:
            continue
        shard = tp.shards[op.index]
        out = view(op.outputs[0], shard.outputs[0] if shard.outputs else None)
        if out is None or not out.dtype.is_float or out.dtype.itemsize >= DType.FLOAT.itemsize:
            continue
        t, n = out.dtype.itemsize, float(out.numel) * op.repeat
        c = costs[op.index]
        fwd, bwd = n * (2 * t + 16), n * (2 * t + 20)
        costs[op.index] = OpCost(c.flops_fwd, fwd, c.flops_bwd, bwd, f"{c.rule}; in fp32 (softmax(..., dtype=torch.float32))", c.fallback)
        times[op.index] = (fwd / hbm, bwd / hbm)
        casts[op.index] = (2, 2)
    return costs, times, casts


def eager_rms_norm_upcasts(graph: OpGraph, tp: TensorParallelPlan, view: Callable[[str, Tensor | None], Tensor | None],
                           norms: Sequence[UpcastRmsNorm], costs: list[OpCost], times: list[tuple[float, float]], hbm: float
                           ) -> tuple[list[OpCost], list[tuple[float, float]]]:
    """What eager code's fp32 RMSNorms (:func:`~dml2comm.cost.norm.castless_rms_norms`: the export
    dropped their casts) move beyond the same ops in the model's ``t``-byte dtype, per element of
    the norm's input, charged to the ``Mul`` writing its output: forward, ``x.to(torch.float32)``
    (``t + 4`` bytes at :data:`WIDENING_CAST_SHARE` of the rate, one kernel), the ``Pow`` and the
    ``Mul`` reading ``x`` and the ``Mul`` writing in fp32 (``3 (4 - t)``) and ``.to(input_dtype)``
    (``4 + t``, one kernel); backward, autograd's casts of the gradient (``ToCopyBackward0``: one
    widening, one narrowing, a kernel each) and the ``Mul``'s and ``Pow``'s backward reading the
    gradient and ``x`` and writing ``x``'s gradient in fp32 (``5 (4 - t)``).  The squares and
    their mean are already costed in fp32 (the view of ``norms``' inner tensors).  Measured: the
    bundled trace of the Llama-3B-like held-out step (``benchmarks/data/gpu_steps/held_out/``,
    ``benchmarks/fit_held_out_traces.py``) has 68 cast kernels on its ``[4, 2048, 3072]`` stream
    (eight a block and the final norm's), 58 us each.

    The casts' launches are not added to the host model's kernel count: its CPU time per kernel (:data:`dml2comm.cost.host.PYTORCH`) is fitted on the
    modelled counts, which already count more forward kernels than eager PyTorch launches (views
    such as ``Slice`` and ``Expand`` launch nothing).  Counted, the refit (``bench_gpu_steps.py
    --kernel-us``) put the 49 fitted steps at 7.1% at best (37 us), uncounted 6.65% (39 us)."""
    if not norms:
        return costs, times
    costs, times = list(costs), list(times)
    for norm in norms:
        op = graph.ops[norm.mul_op]
        shard = tp.shards[op.index]
        out = view(op.outputs[0], shard.outputs[0] if shard.outputs else None)
        if out is None or not out.dtype.is_float or out.dtype.itemsize >= DType.FLOAT.itemsize:
            continue
        t, n = out.dtype.itemsize, float(out.numel) * op.repeat
        wider = DType.FLOAT.itemsize - t
        narrow, widen = n * (DType.FLOAT.itemsize + t), n * (t + DType.FLOAT.itemsize)
        _add_traffic(costs, times, op.index, 3 * n * wider + narrow, 5 * n * wider + narrow, hbm,
                     "; RMSNorm in fp32 (x.to(torch.float32) ... .to(input_dtype))")
        _add_traffic(costs, times, op.index, widen, widen, hbm * WIDENING_CAST_SHARE, "")
    return costs, times


def _is_linear_bias(graph: OpGraph, op: Op) -> bool:
    """``op`` (an Add) adds a 1-D weight to the output of a MatMul or Gemm that reads a weight,
    and is that output's only reader (``nn.Linear`` / GPT-2's ``Conv1D`` exported as MatMul + Add)."""
    names = [n for n in op.inputs if n]
    if len(names) != 2:
        return False
    for gemm_out, bias in (names, names[::-1]):
        b = graph.tensor(bias)
        p = graph.producer(gemm_out)
        if b is None or not b.is_weight or b.rank != 1 or p is None or graph.ops[p].op_type not in ("MatMul", "Gemm"):
            continue
        product = graph.ops[p]
        if any((t := graph.tensor(n)) is not None and t.is_weight for n in product.inputs[:2] if n) \
                and list(graph.consumers(gemm_out)) == [op.index] and gemm_out not in graph.outputs:
            return True
    return False


def flash_core_costs(flash: Sequence[FlashCore], tp: TensorParallelPlan, train: DType, costs: list[OpCost],
                     times: list[tuple[float, float]], peak: float, hbm: float,
                     scale: tuple[float, float] = (1.0, 1.0)) -> tuple[list[OpCost], list[tuple[float, float]]]:
    """Each flash core as one kernel (:mod:`dml2comm.cost.attention`) on its tensor-parallel
    shard: its cost and time on the ``P.V`` op, nothing on its other ops.  ``peak``: the dense
    peak in ``train``; ``hbm``: the achieved HBM rate; ``scale``: the calibrated (forward,
    backward) time scales (:mod:`dml2comm.cost.calibrated`)."""
    costs, times = list(costs), list(times)
    for core in flash:
        q = tp.shards[core.scores_op].inputs[0]
        v = tp.shards[core.context_op].inputs[1]
        out = tp.shards[core.context_op].outputs[0]
        if q is None or v is None or out is None or q.rank < 2 or v.rank < 2 or out.rank < 2:
            continue
        shape = flash_shape(q, v, out)
        cost = flash_cost(shape, core.causal, train)
        fwd, bwd = flash_times_s(shape, core.causal, cost, peak, hbm, scale=scale)
        for i in core.ops:
            costs[i] = OpCost(0.0, 0.0, 0.0, 0.0, "in the flash attention kernel")
            times[i] = (0.0, 0.0)
        costs[core.context_op] = cost
        times[core.context_op] = (fwd, bwd)
    return costs, times


class GradientFork(NamedTuple):
    """An activation whose gradient autograd sums from several backward kernels."""

    tensor: str
    #: its first reader in forward order: its backward runs last, the sum follows it there (in the
    #: readers' layer and pipeline stage: a stage that receives the tensor sums its gradient
    #: before sending it back), and the tensor's shard size is read from its view of it
    reader: int
    position: int  #: the tensor's input position in that reader
    extra: int  #: additions: the gradient-producing kernels reading it, less one
    repeat: int  #: times the reader runs (Loop/Scan bodies)


def gradient_forks(graph: OpGraph, regions: Mapping[int, int] | None = None) -> tuple[GradientFork, ...]:
    """The activations whose gradient is a sum: read by two or more kernels whose outputs need a
    gradient (:func:`~dml2comm.parallel.tensor.requires_grad`).

    PyTorch's autograd accumulates the gradients flowing into one tensor from its readers in an
    input buffer: the second and every later gradient is added to the first, one element-wise
    add each that reads two gradients and writes one (``InputBuffer::add`` / ``accumulate`` in
    torch/csrc/autograd/input_buffer.cpp, in place where it can, out of place otherwise: the
    same traffic).  In a transformer layer these are the residual stream, read by the LayerNorm
    and by the residual add (twice per layer: before attention and before the MLP), and, in
    exports with separate projections, the normalised input read by the Q, K and V (or gate and
    up) GEMMs.  Readers fused into one kernel (:func:`fused_kernels`, e.g. the tanh-GeLU's
    ``Mul``, ``Pow`` and ``Add`` of one input) have one fused backward that sums in registers and
    count once; readers without a gradient (``Shape``, a comparison) do not count.  Weights and
    tensors derived from weights alone are left out: their gradients go to the parameter's own
    gradient buffer (``main_grad`` in Megatron-LM), costed with the optimizer terms.
    ``regions``: the kernels (:func:`kernel_regions`; None: Megatron's :func:`fused_kernels`);
    in eager PyTorch every op is its own kernel, so the tanh-GeLU's readers of one input sum."""
    needs = needs_grad_of(graph)
    weight_derived = weight_derived_of(graph)
    regions = fused_kernels(graph) if regions is None else regions
    out = []
    for name, tensor in graph.tensors.items():
        # a tensor that needs a gradient is a weight or an op's output: no graph input reaches here
        if name not in needs or tensor.is_weight or name in weight_derived or not tensor.dtype.is_float:
            continue
        readers = sorted(c for c in set(graph.consumers(name)) if any(o in needs for o in graph.ops[c].outputs if o))
        kernels = {regions.get(c, -1 - c) for c in readers}
        if len(kernels) >= 2:
            first = graph.ops[readers[0]]
            out.append(GradientFork(name, first.index, first.inputs.index(name), len(kernels) - 1, first.repeat))
    return tuple(out)


def gradient_sum_bytes(fork: GradientFork, tp: TensorParallelPlan, train: DType) -> float:
    """HBM bytes of ``fork``'s additions on this tensor-parallel shard in ``train``: each reads
    two gradients of the tensor's size as its reader sees it (1/t of the sequence under
    sequence parallelism) and writes one."""
    inputs = tp.shards[fork.reader].inputs
    seen = inputs[fork.position] if fork.position < len(inputs) else None
    if seen is None:
        return 0.0
    return 3.0 * seen.with_dtype(train).nbytes * fork.extra * fork.repeat


def attention_head_views(graph: OpGraph) -> frozenset[int]:
    """The Split and Transpose ops that split heads off a projection's output on the way into an
    attention core's batched products (``Q.K^T`` and ``P.V``, :func:`~dml2comm.parallel.tensor.find_attention`),
    which Megatron-LM runs as strided views, not copies.

    Megatron lays the fused QKV projection's output out as ``[s, b, np, 3 hn]``, takes Q, K and V
    as views of it (``split_tensor_along_last_dim``, ``contiguous_split_chunks=False``), and hands
    them to ``torch.baddbmm`` / ``torch.bmm`` transposed (``query_layer.transpose(0, 1)``,
    ``key_layer.transpose(0, 1).transpose(1, 2)``): one batch stride and a unit-stride matrix, which
    cuBLAS's strided-batched GEMM reads in place (``ParallelAttention`` / ``CoreAttention``,
    Megatron-LM v2-v3 and Megatron-DeepSpeed).  An export spells the same head split as Split,
    Reshape and Transpose ops; those whose every output feeds only further such ops or the core's
    products (nothing else, not a graph output such as a KV cache) are views here.  The merge of
    the heads after ``P.V`` is not: Megatron copies it (``context_layer.permute(2, 0, 1, 3).contiguous()``),
    and so does the tool.  The Split's backward, assembling the projection's gradient from the
    three, stays a copy (``SplitBackward``); the Transposes' backward are views."""
    def build() -> frozenset[int]:
        cores = attention_cores_of(graph)
        targets = {c.scores_op for c in cores} | {c.context_op for c in cores}
        # every layout op reachable backwards from the cores' operands (P.V: its V operand only)
        chain: set[int] = set()
        stack = [graph.ops[c.scores_op].inputs[i] for c in cores for i in (0, 1)]
        stack += [graph.ops[c.context_op].inputs[1] for c in cores]
        while stack:
            name = stack.pop()
            prod = graph.producer(name) if name else None
            if prod is None or prod in chain or graph.ops[prod].op_type not in HEAD_SPLIT_OPS:
                continue
            chain.add(prod)
            stack.extend(graph.ops[prod].inputs[:1])
        # keep the ops whose outputs go nowhere else (fixpoint: dropping one can expose another)
        changed = True
        while changed:
            changed = False
            for i in sorted(chain):
                op = graph.ops[i]
                if any(not o or o in graph.outputs or any(c not in chain and c not in targets for c in graph.consumers(o))
                       for o in op.outputs):
                    chain.discard(i)
                    changed = True
        return frozenset(i for i in chain if graph.ops[i].op_type in ("Split", "Transpose"))
    return derived(graph, HeadViewsKey(), build)


def op_kernel_counts(graph: OpGraph, costs: Sequence[OpCost], is_gemm: Sequence[bool],
                     unfused: frozenset[int] = frozenset(), fp32_casts: bool = False,
                     regions: Mapping[int, int] | None = None, flash: Sequence[FlashCore] = ()) -> list[tuple[int, int]]:
    """(forward, backward) kernels each op launches (:func:`dml2comm.cost.host.kernel_counts`):
    one per pass with FLOPs or bytes (two for a GEMM's backward), one per fused region of two or
    more ops (``regions``, :func:`kernel_regions`; None: :func:`fused_kernels`), except the ops in
    ``unfused`` (:func:`unfused_softmax_ops`), each its own kernel; a flash core (``flash``) one
    forward and :data:`~dml2comm.cost.attention.BACKWARD_KERNELS` backward kernels, on its ``P.V`` op."""
    work = [(c.flops_fwd > 0 or c.bytes_fwd > 0, c.flops_bwd > 0 or c.bytes_bwd > 0) for c in costs]
    regions = fused_kernels(graph) if regions is None else regions
    if unfused:
        regions = {i: r for i, r in regions.items() if i not in unfused}
    counts = kernel_counts(work, is_gemm, regions)
    for core in flash:
        for i in core.ops:
            counts[i] = (1, BACKWARD_KERNELS) if i == core.context_op else (0, 0)
    if unfused and fp32_casts:
        # the two fp32 casts around each unfused attention softmax, in each pass (SOFTMAX_CAST_BYTES)
        counts = [(f + 2, b + 2) if i in unfused and graph.ops[i].op_type == "Softmax" else (f, b)
                  for i, (f, b) in enumerate(counts)]
    return counts


def op_gemms(op_type: str, ins: Sequence[Tensor | None], outs: Sequence[Tensor | None], attrs) -> TrainingGemms | None:
    """The forward, data-gradient and weight-gradient GEMMs of a MatMul, Gemm or Conv on float
    operands of known shape, or None (another op, an operand missing or not float).

    MatMul and Gemm: :func:`~dml2comm.cost.gemm.training_gemms`.  Conv as implicit GEMM
    (``Y[N P Q, Cout] = im2col(X)[N P Q, Cin R S] @ W[Cin R S, Cout]`` per group, NVIDIA "Convolutional
    Layers User's Guide", Sec. "Convolution Algorithms" / implicit GEMM): the same three GEMMs as a
    linear layer of that shape, dX by ``dY @ W^T`` and dW by ``im2col(X)^T @ dY``."""
    if op_type not in ("MatMul", "Gemm", "Conv") or len(ins) < 2:
        return None
    a, b = ins[0], ins[1]
    if a is None or b is None or not (a.dtype.is_float and b.dtype.is_float):
        return None
    if op_type == "Conv":
        dims = gemm_dims(op_type, ins, attrs, outs)
        if dims is None:
            return None
        g, m, n, k = dims
        return TrainingGemms(GemmShape(g, m, n, k), GemmShape(g, m, k, n), GemmShape(g, k, n, m))
    return training_gemms(op_type, a.shape, b.shape, attrs)


def gemm_op_times_s(op: Op, cost: OpCost, ins: Sequence[Tensor | None], outs: Sequence[Tensor | None], train: DType,
                    gpu: GPU, peak: float, pad: int | None = None) -> tuple[float, float] | None:
    """(forward, backward) seconds of a matrix product by the GEMM model, or None where
    :func:`op_gemms` has none (the caller uses the roofline).

    forward = ``gemm_time_s(forward)``; backward = ``gemm_time_s(data_grad) +
    gemm_time_s(weight_grad)`` (both gradients, as the 2x-forward FLOP rule counts; Narayanan et
    al. 2021, eq. (3)); each includes the GEMM model's fixed kernel latency.  FLOPs of the op's
    rule (``cost``) beyond the GEMMs (a Gemm's bias, ``alpha``, ``beta``; a Conv's bias) are added
    at ``peak x FLOP_EFFICIENCY``.  Times ``op.repeat`` (Loop/Scan bodies run once per iteration).
    ``pad``: a GEMM that is not aligned (:func:`dml2comm.cost.gemm.is_aligned`) is timed with its
    row lengths padded to that multiple (Megatron-LM's padded vocabulary, :data:`MEGATRON_PAD`)."""
    gemms = op_gemms(op.op_type, ins, outs, op.attrs)
    if gemms is None:
        return None
    if pad and op.op_type != "Conv" and not all(is_aligned(train.label, *g) for g in gemms):
        def padded(d: int) -> int:  # only the unaligned row lengths (a multiple of 8 elements is aligned)
            return aligned_dim(d, pad) if d % 8 else d

        gemms = TrainingGemms(*(GemmShape(g.b, g.m, padded(g.n), padded(g.k)) for g in gemms))
    label, n = train.label, op.repeat
    # a Conv's implicit-GEMM K (C R S) is no row length of a stored tensor, so the GEMM model's row
    # alignment rule does not apply; cuDNN's own channel rules are not modelled: costed as aligned
    kw = {"aligned": True, "conv": True} if op.op_type == "Conv" else {}
    fwd = gemm_time_s(gpu, label, *gemms.forward, **kw) * n
    bwd = (gemm_time_s(gpu, label, *gemms.data_grad, **kw) + gemm_time_s(gpu, label, *gemms.weight_grad, **kw)) * n
    rate = peak * FLOP_EFFICIENCY
    extra_fwd = max(0.0, cost.flops_fwd - n * gemms.forward.flops)
    extra_bwd = max(0.0, cost.flops_bwd - n * (gemms.data_grad.flops + gemms.weight_grad.flops))
    return fwd + extra_fwd / rate, bwd + extra_bwd / rate


def _op_signatures(graph: OpGraph) -> list[str]:
    """Per op: its type, domain, attributes and repeat count (Loop/Scan trip count) as text
    (equal for the ops of repeated blocks)."""
    return [f"{op.domain}:{op.op_type}:{sorted(op.attrs.items())!r}:x{op.repeat}" for op in graph.ops]


def _operand(t: Tensor | None) -> tuple | None:
    """What a cost rule reads of an operand: its shape, element type and kind."""
    return None if t is None else (t.shape, t.dtype, t.is_weight, t.is_input)


# ----------------------------------------------------------------------------- fused kernels
def fused_kernels(graph: OpGraph) -> Mapping[int, int]:
    """op index -> kernel id: connected groups of :data:`FUSED_KINDS` ops joined by a tensor
    (union-find), except that an op reading a :data:`REGION_ENDS` op's output starts a new
    kernel, and so does an op reading a tensor that another kind of op also reads, or that an op
    of another layer (:func:`~dml2comm.cost.cache.layers_of`) reads: that tensor is written to
    memory anyway, and Megatron-LM's kernels end there (the residual stream leaving a
    bias-dropout-add feeds the next LayerNorm and, separately, the next block's bias-dropout-add
    kernel; each transformer layer is its own module, ``TransformerLayer.forward``).  Kernels
    therefore never span layers, also where a norm is exported as point-wise ops that read the
    residual stream directly (Llama's RMSNorm: ``Pow``, ``Mul``), and a block costs the same
    wherever it sits in a run of identical blocks (what the collapse, :mod:`dml2comm.ir.repeats`,
    relies on).  Found once per graph (read-only: the op costs, kernel counts and gradient forks
    of every configuration read it)."""
    return derived(graph, FusedKernelsKey(), lambda: MappingProxyType(_fused_kernels(graph)))


def _fused_kernels(graph: OpGraph) -> dict[int, int]:
    """:func:`fused_kernels`, computed."""
    layer_of = layers_of(graph).layer_of_op

    def joins(name: str, producer: int) -> bool:
        layer = layer_of[producer]
        materialized = name in graph.outputs or any(graph.ops[c].op_type not in FUSED_KINDS or layer_of[c] != layer
                                                    for c in graph.consumers(name))
        return graph.ops[producer].op_type not in REGION_ENDS and not materialized

    return fusible_regions(graph, FUSED_KINDS, joins)


def softmax_kernel_available(shape: Sequence[int], train: DType) -> bool:
    """Whether Megatron-LM's fused scale-mask-softmax kernel runs on attention scores of
    ``shape`` (``[..., sq, sk]``, the leading axes the attention batches: micro-batch x heads on
    this tensor rank) in ``train``: ``FusedScaleMaskSoftmax.is_kernel_available``
    (megatron/core/fusions/fused_softmax.py) requires a 16-bit input, ``16 < sk <= 16384``,
    ``sq % 4 == 0``, ``sk % 4 == 0`` and ``attn_batches % 4 == 0``, and then that the CUDA
    kernel's batches per block divide the attention batches (causal, ``sq == sk`` here) or ``sq``
    (padding mask); batches per block = (128 / warp) x (2 if sk <= 128 else 1), warp = min(32,
    the next power of two >= sk) (``dispatch_scaled_masked_softmax_forward``,
    megatron/fused_kernels/scaled_masked_softmax.h).  Otherwise Megatron runs the unfused
    ``forward_torch_softmax``: fp32 upcast, scale, mask and softmax as separate kernels."""
    if len(shape) < 3 or train.itemsize != 2:
        return False
    sq, sk = int(shape[-2]), int(shape[-1])
    batches = math.prod(int(x) for x in shape[:-2])
    if not (16 < sk <= 16384 and sq % 4 == 0 and sk % 4 == 0 and batches % 4 == 0):
        return False
    power = 1 << max(sk - 1, 0).bit_length()
    warp = min(32, power)
    per_block = (128 // warp) * (2 if power <= 128 else 1)
    return (batches if sq == sk else sq) % per_block == 0


def unfused_softmax_ops(graph: OpGraph, tp: TensorParallelPlan, train: DType) -> frozenset[int]:
    """The ops of fused regions (:func:`fused_kernels`) whose attention softmax cannot take
    Megatron-LM's fused kernel on this shard (:func:`softmax_kernel_available`): each runs as
    its own kernel.  Only softmaxes over attention scores (rank >= 3, the last two axes the
    query and key lengths) are judged; other point-wise regions fuse as before."""
    out: set[int] = set()
    for ops, _ in derived(graph, FusedGroupsKey(), lambda: _fused_groups(graph)):
        for i in ops:
            op = graph.ops[i]
            if op.op_type not in REGION_ENDS:
                continue
            shard = tp.shards[i].inputs[0] if tp.shards[i].inputs else None
            if shard is not None and shard.rank >= 3 and not softmax_kernel_available(shard.shape, train):
                out.update(ops)
                break
    return frozenset(out)


def _fused_groups(graph: OpGraph) -> list[tuple[list[int], tuple[str, ...]]]:
    """Each fused kernel of two or more ops (:func:`fused_kernels`) with the tensors it reads
    from outside and writes for outside (a property of the graph: shared by every configuration)."""
    regions = fused_kernels(graph)
    members: dict[int, list[int]] = defaultdict(list)
    for i, r in regions.items():
        members[r].append(i)
    outputs = set(graph.outputs)
    groups = []
    for ops in members.values():
        if len(ops) < 2:
            continue
        inside = {o for i in ops for o in graph.ops[i].outputs if o}
        read = {n for i in ops for n in graph.ops[i].inputs if n and n not in inside}
        written = {o for o in inside if o in outputs or any(regions.get(c) != regions[ops[0]] for c in graph.consumers(o))}
        groups.append((ops, tuple(read | written)))
    return groups


def fuse_pointwise(graph: OpGraph, tp: TensorParallelPlan, train: DType, costs: list[OpCost], times: list[tuple[float, float]],
                   peak: float, hbm: float, unfused: frozenset[int] = frozenset()) -> list[tuple[float, float]]:
    """Time each fused region as one kernel: it reads the tensors entering it and writes the
    tensors leaving it once (not every intermediate); the region's time is spread over its ops
    in proportion to their unfused times, so per-op figures still add up.

    ``peak`` and ``hbm`` are the achieved rates (FLOP/s x ``FLOP_EFFICIENCY``, bytes/s x
    ``HBM_EFFICIENCY``); each region is timed with :func:`~dml2comm.cost.compute.roofline_s`.
    Regions whose ops are in ``unfused`` (:func:`unfused_softmax_ops`) keep their ops' own times."""
    out = list(times)
    for ops, crossing in derived(graph, FusedGroupsKey(), lambda: _fused_groups(graph)):
        if ops[0] in unfused:  # Megatron's softmax kernel does not run on this shard: separate kernels
            continue
        # each crossing tensor at the size the region's own ops see it on this rank: read as its
        # readers inside the region take it, written as its producer inside leaves it.  The two
        # differ across a collective: with sequence parallelism a row-parallel GEMM writes the
        # full partial sum and the bias-dropout-add after it reads the reduce-scattered 1/t
        size: dict[str, float] = {}
        for i in ops:
            op, shard = graph.ops[i], tp.shards[i]
            for name, t in list(zip(op.inputs, shard.inputs)) + list(zip(op.outputs, shard.outputs)):
                if name in crossing and t is not None:
                    size[name] = max(size.get(name, 0.0), float(t.nbytes_in(train)))
        # a region's ops share one repeat count (Loop/Scan bodies: fusible_regions never joins
        # ops of different counts); the kernel runs that many times
        fwd_bytes = sum(size.get(n, 0.0) for n in crossing) * graph.ops[ops[0]].repeat
        unfused_fwd = sum(costs[i].bytes_fwd for i in ops)
        ratio = fwd_bytes / unfused_fwd if unfused_fwd else 1.0
        flops_f = sum(costs[i].flops_fwd for i in ops)
        flops_b = sum(costs[i].flops_bwd for i in ops)
        t_f = roofline_s(flops_f, fwd_bytes, peak, hbm)
        t_b = roofline_s(flops_b, ratio * sum(costs[i].bytes_bwd for i in ops), peak, hbm)
        sum_f = sum(times[i][0] for i in ops) or 1.0
        sum_b = sum(times[i][1] for i in ops) or 1.0
        for i in ops:
            out[i] = (t_f * times[i][0] / sum_f, t_b * times[i][1] / sum_b)
    return out


# ----------------------------------------------------------------------------- sequence and attention core
def infer_seq_len(graph: OpGraph) -> int | None:
    """The model's sequence length: axis 1 of its first rank-2 integer input (token ids), or
    None when it has none (an image or audio model)."""
    for name in graph.inputs:
        t = graph.tensors[name]
        if not t.dtype.is_float and t.rank == 2:
            return t.shape[1]
    return None


def is_attention_core(graph: OpGraph, index: int, seq_len: int | None) -> bool:
    """Whether op ``index`` works on the s x s attention scores: what selective recomputation
    recomputes (Korthikanti et al. 2022, Sec. 5): QK^T, scale, mask, softmax, dropout, scores x V.

    An op is in the core when one of its non-weight operands or outputs ends in ``(s, s)``;
    always False without a sequence length."""
    if not seq_len:
        return False
    op = graph.ops[index]
    for name in op.outputs + op.inputs:
        t = graph.tensors.get(name) if name else None
        if t is not None and t.rank >= 2 and t.shape[-1] == seq_len and t.shape[-2] == seq_len and not t.is_weight:
            return True
    return False


def attention_core_flags(graph: OpGraph, seq_len: int | None, attention: str = AttentionKernel.UNFUSED) -> list[bool]:
    """:func:`is_attention_core` of every op, once per (graph, sequence length, attention
    kernel).  With ``attention`` flash the flash cores' ops are not flagged: the kernel keeps
    no s x s tensor, so selective recomputation has nothing to drop or recompute there
    (Korthikanti et al. 2022, Sec. 5, recompute the core because it keeps ``5 a s / h`` bytes
    per token; a flash core keeps Q, K, V, its output and the log-sum-exp, which the layer
    keeps anyway)."""
    attention = AttentionKernel.of(attention)

    def build() -> list[bool]:
        flags = [is_attention_core(graph, i, seq_len) for i in range(len(graph.ops))]
        if attention is AttentionKernel.FLASH:
            for core in flash_cores_of(graph):
                for i in core.ops:
                    flags[i] = False
        return flags

    return derived(graph, AttentionCoreKey(seq_len, attention), build)
