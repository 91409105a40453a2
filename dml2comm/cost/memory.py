"""Per-GPU memory: model states, activations from the op graph, buffers, the step's peak and
the fit check.

Model states by precision mode (:class:`~dml2comm.parallel.config.Precision`,
:func:`state_bytes_per_param`), bytes per parameter with a 16-bit training dtype:

=========  =======  =====  ===============  ======  =====================================
mode       weights  grads  optimizer states master  source
=========  =======  =====  ===============  ======  =====================================
mixed      2        2      8 (Adam)         4       Rajbhandari et al. 2020 Sec. 3.1, K = 12
amp        4        4      8 (Adam)         0       torch.autocast: fp32 parameters
bf16       2        2      4 (Adam)         0       ``model.to(torch.bfloat16)``
=========  =======  =====  ===============  ======  =====================================

``mixed`` (Rajbhandari et al., "ZeRO", SC'20, arXiv:1910.02054, Sec. 3.1 and Table 1): 16-bit
weights and gradients and K bytes of optimizer state per parameter (Adam: fp32 master weights,
momentum, variance, K = 12; SGD with momentum: master weights and momentum, K = 8); in fp32
training there is no separate master copy (K - 4) and weights and gradients take 4 bytes.
``amp`` (``torch.autocast``, PyTorch "Automatic Mixed Precision" docs): the parameters stay
fp32, so do their gradients (``param.grad`` has the parameter's dtype) and the Adam states
(``torch.optim.AdamW`` creates ``exp_avg``/``exp_avg_sq`` with ``torch.zeros_like(param)``,
torch/optim/adamw.py), the fp32 parameters being the master copy.  ``bf16``: the same
``zeros_like`` makes both Adam states bf16.  SGD's momentum buffer is one state of the same
dtype.  ZeRO stage 1 shards the optimizer states (master copy included) over the N_d
data-parallel ranks, stage 2 also the gradients, stage 3 also the weights: for ``mixed`` 16 Psi,
4 Psi + 12 Psi / N_d, 2 Psi + 14 Psi / N_d, 16 Psi / N_d.

AMP's 16-bit weight copies: autocast casts each GEMM weight to the 16-bit dtype in forward
(``torch.autocast``: "the cast ... is cached" for the region; aten/src/ATen/autocast_mode.cpp,
``cached_cast``) and autograd saves the cast weight for the data-gradient GEMM of backward, so a
copy of 2 bytes per GEMM-weight parameter (:func:`amp_weight_copy_bytes`) lives from each
micro-batch's forward to its backward: counted with the activations of each micro-batch in
flight.  Measured on the fake-tensor step of GPT-2 small under AMP (``benchmarks/fake_memory.py``):
2 x 123.5 M parameters of linear layers and the tied LM head.

AMP's activations (``--stack pytorch --precision amp``): an fp32 model under CUDA autocast holds
each activation in the dtype autocast's op lists give it (:func:`autocast_dtypes`: GEMM and SDPA
outputs 16-bit; the residual stream, norms, ``pow``/``exp``/``softmax`` outputs fp32), and autograd
keeps the casts autocast makes: a 16-bit copy of each fp32 input per GEMM (q, k, v projections of
one norm output: three copies), an fp32 copy of each 16-bit input of an fp32-list op.  On the
fake-tensor steps with CUDA's lists (``benchmarks/fake_memory.py``): Llama-0.3B b=8 19.893 GB for
19.891 counted, GPT-2 small b=4 7.554 for 7.555.

The step's peak (:func:`step_peak_bytes`) is what ``torch.cuda.max_memory_allocated()``
reports: the highest count of bytes the caching allocator has handed out during the step
(PyTorch "CUDA semantics" / ``torch.cuda.max_memory_allocated`` docs: "the maximum GPU memory
occupied by tensors"), so not the CUDA context (:data:`FRAMEWORK_OVERHEAD_BYTES` is added on top
for the fit check).

Activations are read off the op graph, not a closed formula: every op keeps what its backward
needs, as PyTorch autograd does (``saved_tensors``), on its tensor-parallel shard:

- MatMul / Gemm / Conv / Einsum keep each activation operand whose partner needs a gradient
  (the input of a weight layer; both Q and K of Q.K^T).
- LayerNorm / RMSNorm / BatchNorm / GroupNorm keep their input; Softmax keeps its output;
  Dropout keeps its 1-byte mask; MaxPool its input and int64 indices; embedding Gather its ids;
  LSTM / GRU / RNN keep X, Y and cuDNN's reserve space (every step's gate activations).
- An op inlined from a Loop/Scan body (``Op.repeat`` > 1) keeps its tensors once per iteration.
- Point-wise ops are taken as fused kernels (Megatron-LM's fused bias-GeLU, bias-dropout-add
  and scale-mask-softmax; torch.compile): a connected region of point-wise ops keeps only the
  region inputs that its members' backward needs, and recomputes the rest.  A tanh-GeLU
  written as eight primitives therefore keeps one tensor, its input, as the fused kernel does.
  Eager PyTorch (``--stack pytorch``, ``eager=True``) fuses nothing: every op keeps what its own
  backward needs (the eight-op GeLU keeps its input, ``x^3``'s input, the tanh output and the
  products its multiplies read), and a tensor eager code holds in fp32 (:func:`fp32_islands`:
  Hugging Face's ``LlamaRMSNorm`` between its two casts) is sized at 4 bytes per element.
  Eagerly, ``x * Sigmoid(x)`` is ``F.silu`` and keeps x only, so does an ``F.gelu`` the export
  wrote as primitives (:mod:`dml2comm.cost.gelu`: the exact form around its ``Erf``, either form
  by the exporter's record of ``aten.gelu``); a cast-free RMSNorm keeps the fp32
  copy of its input; a flash core keeps Q, K, V as SDPA received them (no scale Mul, no
  ``repeat_kv``), a causal core's K and V as the KV cache's copies (:meth:`ActivationModel.
  kernel_input`; ``benchmarks/fake_saved.py`` lists what autograd saves).
- A flash attention core (``--attention flash``, :mod:`dml2comm.cost.attention`) keeps Q, K, V,
  its output and the log-sum-exp (``b h s_q`` fp32), nothing of size s^2 and no dropout mask
  (Dao 2023, Sec. 3.1.2); selective recomputation then has nothing left to drop in it.
- A tensor kept by several ops is stored once, and views (Reshape, Transpose, Split, ...) share
  their base's storage.
- A tensor is sized as its producer holds it: with sequence parallelism the input of a
  column-parallel layer is kept as the sequence shard and gathered again in backward
  (Korthikanti et al. 2022, Sec. 4.2.3).

For a GPT layer this reproduces Korthikanti et al. 2022 (arXiv:2205.05198), Table 2:
s b h (34 + 5 a s / h) bytes without parallelism, (10 + 24/t + 5 a s/(h t)) with tensor
parallelism, (34/t + 5 a s/(h t)) with sequence parallelism; selective recomputation drops the
attention core (the 5 a s / h terms); full recomputation keeps the layer input, 2 s b h.

In-flight micro-batches per stage s of p (:func:`in_flight_micro_batches`): a forward keeps its
activations until its backward has run, so a device holds at its peak the most forwards it has
run whose backward has not, counted over the schedule's own order
(:mod:`dml2comm.parallel.schedule`, the order the simulator runs), not a separate formula.  With
``W`` warm-up forwards of ``T = m v``, that is ``min(W + 1, T)`` forwards: GPipe m; 1F1B
min(p - s, m) (Narayanan et al. 2021, Sec. 2.2.1); interleaved 1F1B
min(2 (p - s - 1) + (v - 1) p + 1, m v) chunk forwards, each ``1 / v`` of a micro-batch's
activations (the device's layers split evenly over its v chunks), so the first stage holds
p + (p - 1) / v = p (1 + (p - 1) / (p v)) micro-batches when m v is large enough: Korthikanti
et al. 2022, Sec. 4.2.3 (who write 1 + (p - 1) / (p m) with m the number of interleaving stages,
our v, not the micro-batches), and Megatron-LM's ``interleaved_schedule_memory_penalty = 1 +
(pp - 1) / (pp * virtual_pipeline_model_parallel_size)`` (megatron/training/
theoretical_memory_usage.py).  The first stage under 1F1B therefore holds L layers' worth
whatever p, and interleaving adds (p - 1) / v micro-batches of its layers on top.

Other memory: pipeline receive buffers (one activation and one gradient per boundary), one
data-parallel gradient bucket for NCCL, the largest transient of one op (its outputs while
it runs; under full recomputation also one layer's activations rebuilt for its backward), and
a framework constant of 1 GB for the CUDA context, cuBLAS/cuDNN workspaces and launch buffers
(NAIRR GPU-estimation guide: "300 MB to 1 GB per process", modelled as a 1 GB constant).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np

from dml2comm.cost.attention import FlashCore, flash_saved_lse_bytes, flash_shape
from dml2comm.cost.gelu import GeluCall, gelu_calls
from dml2comm.cost.norm import UpcastRmsNorm, castless_rms_norms
from dml2comm.cost.pointwise import POINTWISE_OPS
from dml2comm.ir.graph import GROUPED_MM, DType, Op, OpGraph, Tensor
from dml2comm.parallel.config import Optimizer, Precision, Recompute, Stack
from dml2comm.parallel.schedule import device_order

__all__ = [
    "fusible_regions",
    "fp32_islands",
    "AUTOCAST_FP32_OPS",
    "AUTOCAST_LOWER_OPS",
    "autocast_dtypes",
    "autocasts_activations",
    "linear_bias",
    "REDUCTION_OPS",
    "FRAMEWORK_OVERHEAD_BYTES",
    "allocator_capacity_bytes",
    "AMP_COPY_BYTES",
    "ModelStates",
    "StateBytes",
    "StepPeak",
    "amp_weight_copy_bytes",
    "gradients_live_in_backward",
    "model_state_bytes",
    "state_bytes_per_param",
    "step_peak_bytes",
    "step_peak_held",
    "step_peak_with",
    "stage_memory_dict",
    "in_flight_micro_batches",
    "ActivationModel",
    "POINTWISE_OPS",
    "VIEW_OPS",
]

#: CUDA context, cuBLAS/cuDNN workspaces, launch buffers (NAIRR GPU-estimation guide, 1 GB).
FRAMEWORK_OVERHEAD_BYTES = 1.0e9

VIEW_OPS = frozenset({"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Split", "Expand", "Slice"})


# What each point-wise op's backward reads, by operand: "in<i>" input i (only when the other
# operand needs a gradient for Mul/Div), "out" its output, "self" its inputs that need gradients.
_POINTWISE_NEEDS = {
    "Mul": "partner", "Div": "div", "Pow": "all", "Sqrt": "out", "Reciprocal": "out", "Exp": "out",
    "Tanh": "out", "Sigmoid": "out", "Relu": "out", "Log": "in0", "Abs": "in0", "Erf": "in0",
    "Gelu": "in0", "Sin": "in0", "Cos": "in0", "LeakyRelu": "in0", "Elu": "out", "Selu": "out",
    "Celu": "out", "Softplus": "in0", "Softsign": "in0", "HardSigmoid": "in0", "HardSwish": "in0",
    "Mish": "in0", "Max": "all", "Min": "all", "Clip": "in0", "PRelu": "all", "ThresholdedRelu": "in0",
}

#: Reductions an fp32 island (:func:`fp32_islands`) may hold: Hugging Face's RMSNorm takes
#: ``hidden_states.pow(2).mean(-1, keepdim=True)`` between its casts.
REDUCTION_OPS = frozenset({"ReduceMean", "ReduceSum", "ReduceSumSquare", "ReduceMax", "ReduceMin", "ReduceL2",
                           "ReduceL1", "ReduceProd", "ReduceLogSumExp"})

_NORMS = frozenset(
    {"LayerNormalization", "RMSNormalization", "SimplifiedLayerNormalization", "BatchNormalization",
     "InstanceNormalization", "GroupNormalization", "SkipLayerNormalization", "SkipSimplifiedLayerNormalization"}
)
_KEEP_OUTPUT = frozenset({"Softmax", "LogSoftmax"})
_LINEAR = frozenset({"MatMul", "Gemm", "Conv", "ConvTranspose", "Einsum"})
#: Recurrent layers: keep X, Y and the reserve space of gate activations (ActivationModel).
_RECURRENT = frozenset({"LSTM", "GRU", "RNN"})
#: Views an exported attention core puts between eager SDPA's operands and its MatMuls
#: (ActivationModel.kernel_input).
_HEAD_VIEWS = frozenset({"Reshape", "Transpose", "Unsqueeze", "Squeeze", "Expand", "Identity", "Flatten"})


@dataclass(frozen=True, slots=True)
class StateBytes:
    """Bytes per parameter one precision mode keeps (module docstring's table): ``master`` is
    the fp32 master copy of ``mixed``, the optimizer's too (ZeRO shards it with the states)."""

    weights: int
    grads: int
    optimizer_states: int
    master: int

    @property
    def optimizer(self) -> int:
        """What ZeRO stage 1 shards: the optimizer states and the master copy (ZeRO's K)."""
        return self.optimizer_states + self.master


def state_bytes_per_param(precision: Precision | str = Precision.MIXED, optimizer: str = "adam", dtype_bytes: int = 2) -> StateBytes:
    """Bytes per parameter of weights, gradients, optimizer states and master copy under
    ``precision`` with a training dtype of ``dtype_bytes`` (module docstring).

    ``mixed``: 16-bit weights and gradients, K = 12 (Adam) or 8 (SGD with momentum) bytes of
    fp32 master weight and states (Rajbhandari et al. 2020, Sec. 3.1); in fp32 training the
    weights are the master copy (K - 4).  ``amp``: fp32 weights, gradients and states, 4 bytes
    per Adam moment (``torch.zeros_like(param)``, torch/optim/adamw.py ``_init_group``).
    ``bf16``: every state in the 16-bit dtype of the parameters.
    """
    precision = Precision.of(precision)
    moments = 2 if Optimizer.of(optimizer).is_adam else 1  # Adam: exp_avg, exp_avg_sq; SGD: momentum_buffer
    if precision is Precision.MIXED:
        k = 12 if moments == 2 else 8
        if dtype_bytes >= 4:
            k -= 4  # the fp32 weights are the master copy
        master = 4 if dtype_bytes < 4 else 0
        return StateBytes(dtype_bytes, dtype_bytes, k - master, master)
    if precision is Precision.AMP:
        return StateBytes(4, 4, 4 * moments, 0)
    return StateBytes(dtype_bytes, dtype_bytes, dtype_bytes * moments, 0)


@dataclass(frozen=True, slots=True)
class ModelStates:
    weights_bytes: float
    grads_bytes: float
    optimizer_bytes: float

    @property
    def total_bytes(self) -> float:
        return self.weights_bytes + self.grads_bytes + self.optimizer_bytes


def model_state_bytes(params: float, dp_size: int, zero_stage: int, optimizer: str = "adam", dtype_bytes: int = 2,
                      precision: Precision | str = Precision.MIXED) -> ModelStates:
    """Weights, gradients and optimizer states (master copy included) of ``params`` parameters
    on one GPU (module docstring; :func:`state_bytes_per_param`), ZeRO-sharded over ``dp_size``
    ranks.  ``params`` is what the GPU holds after tensor and pipeline parallelism."""
    per = state_bytes_per_param(precision, optimizer, dtype_bytes)
    d = dp_size
    return ModelStates(
        weights_bytes=params * per.weights / (d if zero_stage >= 3 else 1),
        grads_bytes=params * per.grads / (d if zero_stage >= 2 else 1),
        optimizer_bytes=params * per.optimizer / (d if zero_stage >= 1 else 1),
    )


#: Bytes per GEMM-weight parameter of the 16-bit copy autocast makes in forward and autograd
#: keeps for backward (module docstring): the bf16/fp16 element size.
AMP_COPY_BYTES = 2


def amp_weight_copy_bytes(gemm_params, precision: Precision | str, dtype_bytes: int):
    """Per micro-batch in flight: the 16-bit copies ``torch.autocast`` makes of ``gemm_params``
    GEMM weights (the weight matrices of linear layers, a tied LM head included), kept from the
    forward to the backward of their GEMM (module docstring).  None outside ``amp`` or when the
    training dtype is fp32 (autocast to fp32 casts nothing)."""
    copies = Precision.of(precision) is Precision.AMP and dtype_bytes < 4
    return gemm_params * (AMP_COPY_BYTES if copies else 0)  # float or per-stage array alike


def gradients_live_in_backward(stack: Stack | str, num_micro_batches: int) -> bool:
    """Whether the gradients exist while activations are held (at the forward/backward peak).

    Megatron-LM keeps them in persistent buffers (``_ParamAndGradBuffer.grad_data``, allocated
    once and zeroed in place by ``zero_grad_buffer``: megatron/core/distributed/
    param_and_grad_buffer.py).  PyTorch frees them after each step: ``Optimizer.zero_grad``
    sets them to ``None`` (``set_to_none=True``, the default since PyTorch 2.0,
    torch/optim/optimizer.py) and ``AccumulateGrad`` allocates each again in the next backward
    (torch/csrc/autograd/functions/accumulate_grad.h), so with one micro-batch per step none
    exists before backward starts; with gradient accumulation they exist from the first
    micro-batch's backward on, while later micro-batches hold activations."""
    return Stack.of(stack) is Stack.MEGATRON or num_micro_batches > 1


@dataclass(frozen=True)
class StepPeak:
    """The candidate peaks of one training step on one GPU (:func:`step_peak_bytes`), in bytes
    the caching allocator hands out (no framework constant); floats or per-stage arrays."""

    forward_backward: float | np.ndarray
    optimizer_step: float | np.ndarray
    grads_held: float | np.ndarray  # gradients counted in ``forward_backward``

    @property
    def peak(self) -> float | np.ndarray:
        return np.maximum(self.forward_backward, self.optimizer_step)


def step_peak_bytes(states: ModelStates, activations, buffers, transient, grads_in_backward: bool = True) -> StepPeak:
    """The peak within one training step as ``torch.cuda.max_memory_allocated()`` sees it:
    the larger of two candidates (floats, or numpy arrays per stage).

    - ``forward_backward``: weights + optimizer states + the gradients if they exist then
      (:func:`gradients_live_in_backward`) + the activations of the micro-batches in flight
      + communication buffers + the largest transient.  It stands for (a) the end of forward with
      the loss's forward transient and (b) the start of backward, when the loss's gradient
      buffers (``cost.loss``: the HF loss's fp32 log-softmax gradient and input gradient) join
      every activation not yet freed.  Later in backward each layer frees its activations
      (autograd releases a node's saved tensors once it has run, ``retain_graph=False``:
      torch/csrc/autograd/engine.cpp) and adds its weights' gradients; both change layer by
      layer, so the sum is largest at the start or the end of backward -- the end is the
      optimizer candidate.
    - ``optimizer_step``: weights + every gradient + optimizer states + buffers, activations
      freed.  The fused optimizers update in place and allocate no temporaries: PyTorch's
      ``AdamW(fused=True)`` (aten/src/ATen/native/cuda/fused_adamw_impl.cu, one
      multi-tensor kernel over param, grad, exp_avg, exp_avg_sq) and Megatron-LM's apex /
      Transformer Engine ``FusedAdam``.

    Checked on the fake-tensor steps of ``benchmarks/fake_memory.py`` (nine Hugging Face models,
    bf16 and AMP): every peak falls at the start of backward, with no gradient yet, and the two
    steps measured on an H100 are reproduced within 1% there.  The ``mixed`` (Megatron) total is
    the sum it always was: its gradients always exist, so ``forward_backward`` is never below
    ``optimizer_step``.
    """
    return step_peak_with(step_peak_held(states, buffers, grads_in_backward), activations, buffers, transient)


def step_peak_held(states: ModelStates, buffers, grads_in_backward: bool = True) -> tuple:
    """The terms of :func:`step_peak_bytes` that the activations do not change, summed in its
    order: (weights + the gradients if they exist at the forward/backward peak + optimizer
    states, the ``optimizer_step`` candidate, the gradients counted).  A sweep keeps them per
    stage table and ZeRO stage (:meth:`dml2comm.cost.stages.StageCoster.prepare`)."""
    grads = states.grads_bytes if grads_in_backward else 0.0
    held = states.weights_bytes + grads + states.optimizer_bytes
    optimizer_step = (states.weights_bytes + states.grads_bytes + states.optimizer_bytes) + buffers
    return held, optimizer_step, grads


def step_peak_with(held: tuple, activations, buffers, transient) -> StepPeak:
    """:func:`step_peak_bytes` from its :func:`step_peak_held` terms: ``forward_backward`` adds
    the activations in flight, the buffers and the largest transient to them, in that order."""
    before, optimizer_step, grads = held
    return StepPeak(before + activations + buffers + transient, optimizer_step, grads)


@functools.lru_cache(maxsize=1024)
def in_flight_micro_batches(schedule: str, pp_size: int, num_micro_batches: int, virtual_stages: int = 1) -> np.ndarray:
    """[p] micro-batches whose activations each stage holds at its peak (module docstring):
    counted over the schedule's order (:func:`dml2comm.parallel.schedule.device_order`), the most
    forwards a device has run whose backward has not, a chunk's forward being ``1 / v`` of a
    micro-batch.  Cached (the sweep asks once per stage plan); the array is read-only."""
    order = device_order(schedule, pp_size, num_micro_batches, virtual_stages)
    rows = np.arange(order.p)[:, None]
    step = np.zeros((order.p, 2 * order.total), dtype=np.int32)
    step[rows, order.forward_at] = 1  # a forward saves its activations
    step[rows, order.backward_at] = -1  # its backward frees them
    held = np.cumsum(step, axis=1).max(axis=1) / order.v
    held.flags.writeable = False
    return held


def fusible_regions(graph: OpGraph, kinds: frozenset[str], joins: Callable[[str, int], bool] | None = None,
                    exclude: frozenset[int] = frozenset()) -> dict[int, int]:
    """op index -> region id: connected groups of ops of ``kinds`` joined by a tensor
    (union-find), i.e. what a fusing compiler or Megatron-LM's fused kernels run as one kernel.
    ``joins(tensor, producer)``, when given, says whether that tensor joins its producer's group
    to its reader's; ops in ``exclude`` (a flash attention core's) are in no region."""
    parent: dict[int, int] = {}

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for op in graph.ops:
        if op.op_type in kinds and op.index not in exclude:
            parent[op.index] = op.index
    for op in graph.ops:
        if op.index not in parent:
            continue
        for name in op.inputs:
            prod = graph.producer(name) if name else None
            # ops that run a different number of times (a Loop body's and the ops around it,
            # Op.repeat) are separate kernels
            if (prod is not None and prod in parent and graph.ops[prod].repeat == op.repeat
                    and (joins is None or joins(name, prod))):
                a, b = find(op.index), find(prod)
                if a != b:
                    parent[a] = b
    return {i: find(i) for i in parent}


def fp32_islands(graph: OpGraph) -> frozenset[str]:
    """Float tensors that eager code holds in fp32 while the model trains in 16 bits: those
    between a ``Cast`` to fp32 and the ``Cast`` that closes it, through point-wise ops and
    reductions (Hugging Face's ``LlamaRMSNorm``: ``x.to(torch.float32)``, ``pow(2).mean(-1)``,
    ``rsqrt``, ``x * rsqrt``, ``.to(input_dtype)``; transformers ``modeling_llama.py``; the softmax
    probabilities between ``softmax(.., dtype=torch.float32)`` and ``.to(query.dtype)``).

    An export made in fp32 writes both casts as ``Cast(to=FLOAT)``, so the pair, not the target
    type, marks the island: starting from a cast's output, an op joins when every float
    activation it reads is already in the island (constants, weights and scalars may join it:
    the ``eps``, the norm's scale), and the island is kept only up to the casts it reaches
    (none reached: the cast was a no-op ``.to(device)`` or ``.type(value.dtype)``, GPT-2's).  The
    residual add that reads the upcast input together with another branch does not join.  An
    export without those casts (torch.export/dynamo drops no-op casts of an fp32 model) shows no
    island here: its RMSNorms are found by their ops instead
    (:func:`dml2comm.cost.norm.castless_rms_norms`): the op costs add their fp32 traffic and casts
    (:func:`dml2comm.cost.ops.eager_rms_norm_upcasts`) and the activations keep the fp32 copy of
    their input (:meth:`ActivationModel._rms_input`)."""
    float_kind = 1  # TensorProto.FLOAT
    kinds = (POINTWISE_OPS - {"Cast", "CastLike"}) | REDUCTION_OPS
    inputs = set(graph.inputs)

    def free(name: str, island: set[str]) -> bool:  # may join an island without being in it
        t = graph.tensor(name)
        return (name in island or t is None or not t.dtype.is_float or t.is_weight or t.numel <= 1
                or (graph.producer(name) is None and name not in inputs))

    out: set[str] = set()
    for op in graph.ops:
        if op.op_type != "Cast" or int(op.attr("to", 0)) != float_kind or not op.outputs or not op.outputs[0]:
            continue
        src = graph.tensor(op.inputs[0]) if op.inputs else None
        if src is None or not src.dtype.is_float:
            continue
        island = {op.outputs[0]}
        producer_of: dict[str, int] = {}
        closing: list[int] = []
        pending: set[int] = set()
        frontier = [op.outputs[0]]
        while frontier:
            for c in graph.consumers(frontier.pop()):
                reader = graph.ops[c]
                if reader.op_type == "Cast":
                    closing.append(c)
                elif reader.op_type in kinds and not set(reader.outputs) & island:
                    pending.add(c)
            if not frontier:  # an op joins once all it reads is in (a Mul of x and rsqrt(x))
                for c in sorted(pending):
                    reader = graph.ops[c]
                    if all(free(n, island) for n in reader.inputs if n):
                        pending.discard(c)
                        for o in reader.outputs:
                            if o and o not in island:
                                island.add(o)
                                producer_of[o] = c
                                frontier.append(o)
        # keep what the closing casts read, back to the opening cast
        kept: set[str] = set()
        stack = [graph.ops[c].inputs[0] for c in closing if graph.ops[c].inputs and graph.ops[c].inputs[0] in island]
        while stack:
            name = stack.pop()
            if name in kept:
                continue
            kept.add(name)
            p = producer_of.get(name)
            if p is not None:
                stack.extend(n for n in graph.ops[p].inputs if n and n in island)
        out |= kept
    return frozenset(out)


#: ONNX ops that CUDA autocast runs in its 16-bit dtype: PyTorch docs, "Automatic Mixed Precision
#: package - torch.amp", "CUDA Ops that can autocast to float16" (``matmul``, ``linear``, ``addmm``,
#: ``bmm``, ``baddbmm``, ``conv*``, ...; the same list for bfloat16), aten/src/ATen/autocast_mode.cpp
#: ``KERNEL_CUDA(..., lower_precision_fp)``, which also lists ``scaled_dot_product_attention`` (a
#: flash core: :func:`autocast_dtypes`).
AUTOCAST_LOWER_OPS = _LINEAR
#: ONNX ops that CUDA autocast runs in fp32 whatever their inputs: the same docs, "CUDA Ops that can
#: autocast to float32" (``pow``, ``exp``, ``log``, ``reciprocal``, ``rsqrt``, ``softmax``,
#: ``log_softmax``, ``layer_norm``, ``group_norm``, ``sum``, ``prod``, ``cumsum``, ``norm``,
#: ``softplus``, ``tan``, ``acos``, ``asin``, ``cosh``, ``sinh``, ``nll_loss``, ``cross_entropy``);
#: autocast_mode.cpp registers ``rms_norm`` there too (``torch._C._dispatch_dump_table(
#: "aten::rms_norm")`` shows an AutocastCUDA kernel).  ONNX has no Rsqrt: exports write it as
#: Reciprocal(Sqrt).  Not on the list, so run in their inputs' dtype: ``mean``, ``sqrt``, ``tanh``,
#: ``erf``, ``gelu``, ``silu``, ``sigmoid``, ``embedding``, element-wise arithmetic.
#: ONNX ops that return their input's dtype under autocast whatever their weights' dtype: off
#: autocast's lists, PyTorch's batch norm takes a 16-bit input with fp32 weights and statistics
#: and returns the input's dtype (``aten/src/ATen/native/cuda/Normalization.cu``, its mixed-type
#: path; the bundled H100 ResNet-18 AMP trace runs ``batch_norm_transform_input_kernel<
#: c10::BFloat16, ...>``), where type promotion would make it fp32.
MIXED_TYPE_OPS = frozenset({"BatchNormalization"})
AUTOCAST_FP32_OPS = frozenset({
    "Pow", "Exp", "Log", "Reciprocal", "Softmax", "LogSoftmax", "LayerNormalization", "GroupNormalization",
    "RMSNormalization", "SimplifiedLayerNormalization", "SkipLayerNormalization", "SkipSimplifiedLayerNormalization",
    "ReduceSum", "ReduceSumSquare", "ReduceProd", "ReduceL1", "ReduceL2", "CumSum", "Softplus", "Tan", "Acos", "Asin",
    "Cosh", "Sinh", "NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss",
})


def autocasts_activations(stack: Stack | str, precision: Precision | str, dtype_bytes: int) -> bool:
    """Whether activations take ``torch.autocast``'s dtypes (:func:`autocast_dtypes`): eager
    PyTorch (``--stack pytorch``) under ``--precision amp`` with a 16-bit autocast dtype."""
    return Stack.of(stack) is Stack.PYTORCH and Precision.of(precision) is Precision.AMP and dtype_bytes < 4


#: Hugging Face norm modules that multiply their weight in fp32 before casting back to the
#: input's dtype (the class of the module running the op, :attr:`dml2comm.ir.graph.Op.module_class`):
#: ``GemmaRMSNorm`` (and Gemma 2/3's: ``output * (1.0 + self.weight.float())`` then
#: ``.type_as(x)``, transformers ``modeling_gemma.py``), ``Olmo2RMSNorm`` (``(self.weight *
#: hidden_states).to(input_dtype)``, ``modeling_olmo2.py``), ``CohereLayerNorm``
#: (``self.weight.to(torch.float32) * hidden_states``, ``modeling_cohere.py``).  Llama's kind
#: casts back first and multiplies in 16 bits (``self.weight * hidden_states.to(input_dtype)``).
#: ``benchmarks/fake_fixtures_findings.md`` section 3, ``benchmarks/newarch_findings.md``.
FP32_SCALE_NORMS = frozenset({"GemmaRMSNorm", "Gemma2RMSNorm", "Gemma3RMSNorm", "Olmo2RMSNorm", "CohereLayerNorm"})


def export_dtype(graph: OpGraph) -> DType | None:
    """The dtype the model was exported in: that of most of its float weights' elements (None
    without float weights)."""
    elements: dict[DType, int] = {}
    for t in graph.tensors.values():
        if t.is_weight and t.dtype.is_float:
            elements[t.dtype] = elements.get(t.dtype, 0) + t.numel
    return max(elements, key=elements.__getitem__) if elements else None


def linear_bias(graph: OpGraph, op: Op, out: Mapping[str, DType], low: DType) -> bool:
    """Whether ``op`` is the bias ``Add`` of a linear layer: a GEMM's ``low`` output plus a 1-D
    float weight.  ``F.linear(x, W, b)`` is one autocast op (``linear``/``addmm`` on the
    lower-precision list, autocast_mode.cpp) that casts ``b`` with ``W`` and returns ``low``;
    the export splits it into ``MatMul`` and ``Add``."""
    if op.op_type != "Add" or len(op.inputs) != 2:
        return False
    for a, b in (op.inputs, op.inputs[::-1]):
        prod = graph.producer(a) if a else None
        bias = graph.tensor(b) if b else None
        if (prod is not None and graph.ops[prod].op_type in AUTOCAST_LOWER_OPS and out.get(a) is low
                and bias is not None and bias.is_weight and bias.dtype.is_float and len(bias.shape) == 1):
            return True
    return False


def autocast_dtypes(graph: OpGraph, low: DType, flash: Sequence[FlashCore] = (),
                    gelus: Sequence[GeluCall] | None = None) -> dict[str, DType]:
    """The dtype of every float activation of an fp32 model run under CUDA
    ``torch.autocast(dtype=low)``, read off an fp32 export (which shows no casts).

    Rules (PyTorch docs, "Automatic Mixed Precision package": "Ops that can autocast to
    float16/bfloat16" run in ``low`` and return it, ops that "autocast to float32" return fp32,
    "other ops ... run in the widest input type"), by op, in graph order:

    - GEMMs (:data:`AUTOCAST_LOWER_OPS`), a linear layer's bias ``Add`` (:func:`linear_bias`)
      and the flash cores' outputs (SDPA is on the CUDA lower-precision list,
      autocast_mode.cpp): ``low``.
    - :data:`AUTOCAST_FP32_OPS`, and the routed expert products read as ``torch._grouped_mm``
      (on neither list, its fast path bf16 only: :func:`dml2comm.cost.ops.fp32_grouped_products`): fp32.
    - ``BatchNormalization``: its input's dtype (:data:`MIXED_TYPE_OPS`), not its weights'.
    - ``Cast``: its target type.
    - Anything else: PyTorch's type promotion over its float operands ("Tensor Attributes -
      type promotion": a dimensioned tensor outranks a zero-dim one of the same category), so a
      ``low`` GEMM output added to the fp32 residual stream is fp32, a Q scaled by an fp32 RoPE
      ``cos`` is fp32; zero-dim constants (``0.5 * x``) do not promote; a view, a Split, a
      ``Gather`` of an fp32 embedding table keep their input's dtype.  Parameters and constants
      keep their exported (fp32) type.

    So the residual stream, norms and their outputs stay fp32 (Hugging Face's embeddings and
    RMSNorm/LayerNorm run in fp32), GEMM outputs are 16-bit, and a GEMM reading an fp32
    activation casts it (:class:`ActivationModel` counts that copy).

    An export made in 16 bits (its weights 16-bit: ``torch_dtype=torch.bfloat16``, the zoo's
    ``--dtype bf16`` graphs) shows the model's dtype where the code wrote it: its weights,
    buffers and inputs are 16-bit, and a ``Cast`` to that dtype is the code casting back to the
    model's or its input's dtype (``LlamaRMSNorm``'s ``.to(input_dtype)``, RoPE's
    ``cos.to(x.dtype)``).  Autocast runs the fp32 model, so those read as fp32 here: weights,
    buffers and inputs of the export's dtype are fp32, and such a ``Cast`` yields fp32 (a norm's
    output stays fp32 and each GEMM reading it makes its own 16-bit copy, as on an fp32 export;
    :func:`export_dtype`)."""
    out: dict[str, DType] = {}
    lowered = {core.context_op for core in flash}
    lowered_names = {core.out for core in flash}
    model = export_dtype(graph)
    low_export = model is not None and model.itemsize < DType.FLOAT.itemsize
    # aten::gelu runs in x's dtype (``gelus``: the graph's gelu_calls, when the caller holds them)
    gelu_input = {i: call.x for call in (gelu_calls(graph) if gelus is None else gelus) for i in call.ops}

    def dtype_of(name: str) -> DType | None:
        if name in out:
            return out[name]
        t = graph.tensor(name)
        if t is None:
            return None
        return DType.FLOAT if low_export and t.dtype is model else t.dtype

    def promotes(name: str) -> bool:
        t = graph.tensor(name)
        if t is None or not t.dtype.is_float:
            return False
        return name in out or t.is_input or t.is_weight or t.numel > 1

    for op in graph.ops:
        floats = [o for o in op.outputs if o and (t := graph.tensor(o)) is not None and t.dtype.is_float]
        if not floats:
            continue
        kind = op.op_type
        if op.index in gelu_input:  # an F.gelu written as primitives: one op off autocast's lists
            dt = dtype_of(gelu_input[op.index])
        elif (kind in AUTOCAST_LOWER_OPS and op.aten != GROUPED_MM) or op.index in lowered or linear_bias(graph, op, out, low):
            dt = low
        elif kind in AUTOCAST_FP32_OPS or op.aten == GROUPED_MM:
            dt = DType.FLOAT
        elif kind in MIXED_TYPE_OPS and op.inputs and op.inputs[0]:
            dt = dtype_of(op.inputs[0])
        elif kind in ("Cast", "CastLike"):
            dt = None  # its exported target type; a cast to a 16-bit export's own dtype: fp32
            if low_export and all(graph.tensor(o).dtype is model for o in floats):
                dt = DType.FLOAT
        else:
            ins = [dtype_of(n) for n in op.inputs if n and promotes(n)]
            dt = max(ins, key=lambda d: d.itemsize) if ins else None
        for o in floats:
            out[o] = low if o in lowered_names else (dt or dtype_of(o))
    return out


class ActivationModel:
    """Saved-for-backward bytes per micro-batch, per op set, on one tensor rank.

    Built once per analysis (linear in ops); :meth:`saved_bytes` answers for any set of ops.
    """

    def __init__(
        self,
        graph: OpGraph,
        local_inputs: Sequence[tuple[Tensor | None, ...]],
        local_outputs: Sequence[tuple[Tensor | None, ...]],
        needs_grad: frozenset[str],
        train_dtype: DType,
        assumed_dropout: bool = False,
        eager: bool = False,
        flash: Sequence[FlashCore] = (),
        fp32: frozenset[str] = frozenset(),
        autocast: Mapping[str, DType] | None = None,
        gelus: Sequence[GeluCall] | None = None,
        castless: Sequence[UpcastRmsNorm] | None = None,
    ) -> None:
        """``eager``: no point-wise fusion (``--stack pytorch``); ``flash``: the attention cores
        that run as flash kernels (:func:`dml2comm.cost.attention.find_flash_cores`); ``fp32``:
        float tensors held in fp32 (:func:`fp32_islands`; eager only); ``autocast``: the dtype
        of every float activation of an fp32 model under ``torch.autocast(train_dtype)``
        (:func:`autocast_dtypes`; eager only), with the casts autocast makes (:meth:`_autocast_copies`);
        ``gelus``: the graph's :func:`~dml2comm.cost.gelu.gelu_calls` when the caller holds them
        (:func:`dml2comm.cost.cache.activation_model_of`: found once per graph), ``castless`` its
        :func:`~dml2comm.cost.norm.castless_rms_norms` outside ``fp32`` likewise."""
        self.graph = graph
        self.needs_grad = needs_grad
        self.train_dtype = train_dtype
        self.eager = eager
        self.autocast = autocast
        # local (sharded) size of every tensor, in the training dtype for floats (fp32 for ``fp32``;
        # its autocast dtype under ``autocast``)
        size: dict[str, float] = {}
        numel: dict[str, float] = {}
        for op, ins, outs in zip(graph.ops, local_inputs, local_outputs):
            for name, t in list(zip(op.inputs, ins)) + list(zip(op.outputs, outs)):
                if name and t is not None and name not in size:
                    held = DType.FLOAT if name in fp32 and t.dtype.is_float else train_dtype
                    if autocast is not None and name in autocast:
                        held = autocast[name]
                    size[name] = float(t.nbytes_in(held))
                    numel[name] = float(t.numel)
        self.size = size
        self._numel = numel
        self.fp32 = fp32
        self._castless = castless
        self.base = self._view_bases(self._copied_outputs(flash) if eager else frozenset())
        self.flash_ops = frozenset(i for core in flash for i in core.ops)
        self.flash_carriers = frozenset(core.context_op for core in flash)  # the op holding each kernel
        self.region = {} if eager else fusible_regions(self.graph, POINTWISE_OPS, exclude=self.flash_ops)
        self.region_members: dict[int, list[int]] = {}
        for i, r in sorted(self.region.items()):
            self.region_members.setdefault(r, []).append(i)
        # eager F.gelu written as primitives (cost.gelu): op -> its input, kept once by the first op
        calls = (gelu_calls(graph) if gelus is None else gelus) if eager else ()
        self._gelu = {i: call.x for call in calls for i in call.ops}
        self._gelu_keeper = {call.ops[0] for call in calls}
        self._fp32_softmax = self._fp32_softmaxes() if eager and autocast is None else frozenset()
        self.saved_by_op = [() if op.index in self.flash_ops else self._saved(op) for op in graph.ops]
        for core in flash:
            self.saved_by_op[core.context_op] = self._flash_saved(core, local_inputs, local_outputs)
        self._inside: dict[tuple[int, ...], frozenset[str]] = {}  # _region_saved: outputs of a region's ops
        self._inputs: dict[tuple[frozenset[str], tuple[str, ...]], tuple[str, ...]] = {}  # _region_inputs answers
        if assumed_dropout and not any(op.op_type == "Dropout" for op in graph.ops):
            self._add_assumed_dropout()

    # -- structure ---------------------------------------------------------------------

    def _view_bases(self, copied: frozenset[str] = frozenset()) -> dict[str, str]:
        """tensor -> the storage it views (a view op's output shares its input's); a view op
        whose input is in ``copied`` makes a storage of its own (:meth:`_copied_outputs`)."""
        base: dict[str, str] = {}
        for op in self.graph.ops:
            if op.op_type in VIEW_OPS and op.inputs and op.inputs[0]:
                src = op.outputs[0] if op.inputs[0] in copied else base.get(op.inputs[0], op.inputs[0])
                for out in op.outputs:
                    if out:
                        base[out] = src
        return base

    def _copied_outputs(self, flash: Sequence[FlashCore]) -> frozenset[str]:
        """The flash cores' outputs that eager code copies before the output projection: SDPA
        allocates its output in its query's memory layout (``torch/_meta_registrations.py``,
        ``alloc_with_matching_layout``, as the CUDA kernels do), and a query built by ``torch.cat``
        on the ``[b, heads, s, d]`` tensor (partial rotary: GPT-NeoX, Phi, Phi-3, StableLM) is
        contiguous in that order, so transformers' ``attn_output.transpose(1, 2).contiguous()``
        copies it and the projection keeps the copy besides the kernel's output; a query that is
        a transposed view of its projection (Llama) makes that transpose free
        (``benchmarks/newarch_findings.md``: Phi-3)."""
        g = self.graph
        out = set()
        for core in flash:
            q = self.kernel_input(core.q)
            prod = g.producer(q) if q else None
            if prod is not None and g.ops[prod].op_type == "Concat":
                out.add(core.out)
        return frozenset(out)

    def _flash_saved(self, core: FlashCore, local_inputs: Sequence[tuple[Tensor | None, ...]],
                     local_outputs: Sequence[tuple[Tensor | None, ...]]) -> tuple[tuple[str, float], ...]:
        """What a flash kernel keeps (Dao 2023, Sec. 3.1.2): Q, K, V (their storage: a view keeps
        its base), the output and the log-sum-exp, ``b h s_q`` fp32 on this rank."""
        if self.eager:
            saved = self._eager_flash_inputs(core)
        else:
            kept = {self.base.get(n, n) for n in (core.q, core.k, core.v) if self._is_activation(n)} | {core.out}
            saved = tuple((b, self.size.get(b, 0.0)) for b in sorted(kept))
        q = local_inputs[core.scores_op][0]
        v = local_inputs[core.context_op][1]
        out = local_outputs[core.context_op][0]
        if q is None or v is None or out is None:
            return saved
        return saved + ((f"lse:{core.context_op}", flash_saved_lse_bytes(flash_shape(q, v, out))),)

    def _eager_flash_inputs(self, core: FlashCore) -> tuple[tuple[str, float], ...]:
        """What eager SDPA's flash / cuDNN kernel keeps of its operands: Q, K and V as the kernel
        received them, not as the export's decomposition of SDPA shows them.  derivatives.yaml
        (``_scaled_dot_product_flash_attention`` / ``_cudnn_attention``) saves ``query, key,
        value, output, logsumexp``: the arguments of the aten op.  The export writes the kernel
        as ``Mul(Q, sqrt(scale))``, ``Mul(K^T, sqrt(scale))`` and two MatMuls (torch.onnx's
        ``aten_scaled_dot_product_attention``), and a grouped-query model's K and V as
        ``repeat_kv`` (Unsqueeze, Expand, Reshape), whereas eager SDPA scales inside the kernel
        and, given ``enable_gqa`` (transformers' ``use_gqa_in_sdpa``: no mask), reads the
        KV heads unrepeated (the H100 Llama trace's cuDNN backward reads K, V of [4, 8, 2048,
        64]).  So each operand is traced back through a scale Mul and views
        (:meth:`kernel_input`) and kept as that tensor's storage.

        A causal core's K and V are kept as tensors of their own: a Hugging Face causal LM
        called in training with its config's ``use_cache=True`` builds a ``DynamicCache`` whose
        ``update`` stores ``torch.cat([empty, key_states])`` (transformers ``cache_utils.py``,
        ``DynamicLayer.update``) and attends with those copies, so a fused QKV projection
        (GPT-2's ``c_attn``) keeps its output for Q and two [b, h_kv, s, d] copies for K and V
        (``benchmarks/fake_saved.py``)."""
        q, k, v = (self.kernel_input(n) for n in (core.q, core.k, core.v))
        kept: dict[str, float] = {self.base.get(core.out, core.out): self.size.get(core.out, 0.0)}
        for role, n in (("q", q), ("k", k), ("v", v)):
            if not self._is_activation(n):
                continue
            if self._autocast_casts(n):  # SDPA's autocast casts an fp32 operand: it keeps the copy
                kept[f"cast:{core.context_op}:{role}"] = self._local_numel(n) * self.train_dtype.itemsize
            elif core.causal and role != "q":
                kept[f"kv:{core.context_op}:{role}"] = self.size.get(n, 0.0)
            else:
                kept[self.base.get(n, n)] = self.size.get(self.base.get(n, n), 0.0)
        return tuple(sorted(kept.items()))

    def kernel_input(self, name: str) -> str:
        """The tensor an attention operand of the export was made from as eager SDPA receives
        it: back through one ``Mul`` by a constant scalar (the decomposition's ``sqrt(scale)``)
        and through Reshape / Transpose / Unsqueeze / Squeeze / Expand / Identity (the
        decomposition's head folding and ``repeat_kv``), stopping at any other producer (a
        Split or Slice picks a part of a fused projection: its own size is the operand's)."""
        g = self.graph
        prod = g.producer(name)
        if prod is not None and g.ops[prod].op_type == "Mul":
            ins = [n for n in g.ops[prod].inputs if n]
            acts = [n for n in ins if self._is_activation(n)]
            scalars = [n for n in ins if n not in acts and (t := g.tensor(n)) is not None and t.numel <= 1]
            if len(acts) == 1 and len(scalars) == len(ins) - 1:
                name = acts[0]
        while (prod := g.producer(name)) is not None and g.ops[prod].op_type in _HEAD_VIEWS and g.ops[prod].inputs[0]:
            name = g.ops[prod].inputs[0]
        return name

    def _is_activation(self, name: str) -> bool:
        """Produced by an op or fed as a graph input (not a weight, not a constant)."""
        t = self.graph.tensors.get(name) if name else None
        if t is None or t.is_weight:
            return False
        return t.is_input or self.graph.producer(name) is not None

    # -- per-op needs --------------------------------------------------------------------

    def _saved(self, op: Op) -> tuple[tuple[str, float], ...]:
        """(storage key, bytes) this op keeps for backward, before de-duplication."""
        grad = self.needs_grad
        kind = op.op_type
        keep: list[str] = []
        extra: list[tuple[str, float]] = []
        ins = [n for n in op.inputs if n]
        if op.index in self._gelu:  # eager F.gelu written as primitives: its input, once (cost.gelu)
            x = self._gelu[op.index]
            keep.extend([x] if op.index in self._gelu_keeper and x in grad else [])
        elif kind in _LINEAR:
            acts = [n for n in op.inputs[:2] if n and self._is_activation(n)]
            others = [n for n in op.inputs[:2] if n]
            for n in acts:
                partners = [o for o in others if o != n]
                if any(o in grad for o in partners):
                    keep.append(n)
        elif kind in _NORMS:
            if ins and self._is_activation(ins[0]):
                keep.append(ins[0])
        elif kind in _KEEP_OUTPUT:
            keep.extend(o for o in op.outputs[:1] if o)
        elif kind == "Dropout":  # a 1-byte mask per element, whether the graph names it or not
            extra.append((f"mask:{op.index}", self._local_numel(op.outputs[0])))
        elif kind == "MaxPool":
            if ins and self._is_activation(ins[0]):
                keep.append(ins[0])
            extra.append((f"indices:{op.index}", self._local_numel(op.outputs[0]) * 8))
        elif kind in ("Gather", "GatherElements", "GatherND", "ScatterElements", "ScatterND", "TopK"):
            idx = op.inputs[1] if len(op.inputs) > 1 else ""
            if kind == "TopK":
                idx = op.outputs[1] if len(op.outputs) > 1 else ""
            if idx and idx in self.size:
                keep.append(idx)
        elif kind in ("ReduceMax", "ReduceMin", "ArgMax", "ArgMin"):
            keep.extend(n for n in ins[:1] if self._is_activation(n))
        elif kind in _RECURRENT:
            keep.extend(n for n in ins[:1] if self._is_activation(n))  # X, for dW
            keep.extend(o for o in op.outputs[:1] if o)  # Y, the hidden states, for dR
            extra.append((f"reserve:{op.index}", self._recurrent_reserve(op)))
        elif self.eager and (x := self._silu_input(op)) is not None:
            keep.extend([x] if kind == "Mul" and self._is_activation(x) else [])
        elif kind in _POINTWISE_NEEDS:
            keep.extend(self._pointwise_needs(op))
        # a kept view retains its base's whole storage (a view of Q keeps the fused QKV alive);
        # an op of an inlined Loop/Scan body (Op.repeat) keeps its tensors once per iteration:
        # those made in the body, and the loop-carried ones (bound to their initial value at
        # import, a new value each iteration)
        if self.eager and kind in ("Pow", "Mul") and (x := self._rms_input(op)) in keep and self._fp32_copy(x):
            keep.remove(x)  # the fp32 copy Hugging Face's RMSNorm makes of its input (_rms_input)
            extra.append((f"fp32:{x}", self._local_numel(x) * DType.FLOAT.itemsize))
        elif self.eager and kind == "Mul" and op.module_class in FP32_SCALE_NORMS and (x := self._fp32_scaled(op)) in keep:
            keep.remove(x)  # a norm that multiplies its weight in fp32 keeps its normalised input so
            extra.append((f"fp32:{x}", self._local_numel(x) * DType.FLOAT.itemsize))
        if op.index in self._fp32_softmax and (out := op.outputs[0]) in keep:  # its fp32 result (_fp32_softmaxes)
            keep.remove(out)
            extra.append((f"fp32:{out}", self._local_numel(out) * DType.FLOAT.itemsize))
        if self.autocast is not None and op.index not in self._gelu:  # aten::gelu is on neither list
            keep, copies = self._autocast_copies(op, keep)
            extra.extend(copies)
        kept = (self.base.get(n, n) for n in keep if n in self.size)
        return (tuple((b, self.size.get(b, 0.0) * self._copies(b, op.repeat)) for b in kept)
                + tuple((k, v * op.repeat) for k, v in extra))

    def _fp32_copy(self, x: str) -> bool:
        """Whether ``x.to(torch.float32)`` copies: not for an activation autocast holds in fp32
        already (the residual stream of an fp32 model: ``Tensor.to`` returns ``self`` when the
        dtype matches, PyTorch docs ``torch.Tensor.to``)."""
        return self.autocast is None or self.autocast.get(x) is not DType.FLOAT

    def _autocast_casts(self, name: str) -> bool:
        """Whether autocast casts activation ``name`` to the 16-bit dtype for a GEMM or SDPA
        that reads it: it is held in fp32 (:func:`autocast_dtypes`)."""
        return self.autocast is not None and self.autocast.get(name) is DType.FLOAT and self._is_activation(name)

    def _autocast_copies(self, op: Op, keep: list[str]) -> tuple[list[str], list[tuple[str, float]]]:
        """What ``op`` keeps under autocast instead of ``keep``: autocast casts an op's operands
        before the op runs (aten/src/ATen/autocast_mode.cpp, ``cached_cast`` inside the Autocast
        dispatch key, above Autograd), so autograd saves the cast copy, not the tensor the graph
        shows.  A GEMM (:data:`AUTOCAST_LOWER_OPS`) keeps a 16-bit copy of each fp32 activation
        it keeps, one per GEMM: autocast caches casts only of leaf tensors that require grad
        (``cached_cast``: ``arg.is_leaf() && arg.requires_grad()``, the weights), so the q, k and
        v projections of one norm output make three copies.  An fp32-list op
        (:data:`AUTOCAST_FP32_OPS`) keeps an fp32 copy of each 16-bit activation it keeps (GPT-2's
        ``torch.pow(x, 3.0)`` of its 16-bit ``c_fc`` output).  Keys: ``cast:<op>:<tensor>``."""
        assert self.autocast is not None
        rest: list[str] = []
        copies: list[tuple[str, float]] = []
        for n in keep:
            if op.op_type in AUTOCAST_LOWER_OPS and self._autocast_casts(n):
                copies.append((f"cast:{op.index}:{n}", self._local_numel(n) * self.train_dtype.itemsize))
            elif (op.op_type in AUTOCAST_FP32_OPS and self._is_activation(n)
                  and (d := self.autocast.get(n)) is not None and d.itemsize < DType.FLOAT.itemsize):
                copies.append((f"cast:{op.index}:{n}", self._local_numel(n) * DType.FLOAT.itemsize))
            else:
                rest.append(n)
        return rest, copies

    def _rms_input(self, op: Op) -> str | None:
        """x when ``op`` is the ``Pow(x, 2)`` or the ``Mul(x, rsqrt(...))`` (or ``Div``) of an
        RMSNorm written as primitives whose input shows no fp32 cast
        (:func:`dml2comm.cost.norm.castless_rms_norms`, the same norms the op costs upcast: an
        export made in fp32 drops ``.to(torch.float32)`` as a no-op) while training is 16-bit.
        Hugging Face's RMSNorms (``LlamaRMSNorm``, ``Qwen2RMSNorm``, ...; transformers
        ``modeling_llama.py``) compute ``hidden_states.to(torch.float32)`` first, so eager
        autograd keeps that fp32 copy for both ops (derivatives.yaml, ``pow.Tensor_Scalar``:
        ``pow_backward(grad, self, exponent)``; ``mul.Tensor``: ``grad * other``), 4 bytes per
        element (``benchmarks/fake_saved.py``: Llama-1B's norms keep [4, 2048, 2048] fp32)."""
        if self.train_dtype.itemsize >= DType.FLOAT.itemsize:
            return None
        return self._castless_inputs.get(op.index)

    @functools.cached_property
    def _castless_inputs(self) -> dict[int, str]:
        """The ``Pow`` and output ``Mul`` of each cast-free RMSNorm -> the norm's input."""
        out: dict[int, str] = {}
        for norm in castless_rms_norms(self.graph, self.fp32) if self._castless is None else self._castless:
            x = self.graph.ops[norm.pow_op].inputs[0]
            if self._is_activation(x):
                out[norm.pow_op] = out[norm.mul_op] = x
        return out

    def _fp32_softmaxes(self) -> frozenset[int]:
        """The softmaxes eager code runs in fp32 while training is 16-bit, where the export does
        not show it: ``F.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)``, every
        transformers ``eager_attention_forward`` (``modeling_llama.py``; BLOOM's own attention),
        which the dynamo exporter records as ``aten.softmax.int(..., torch.float32)`` (an fp32
        export drops the casts themselves).  ATen converts a 16-bit input before the softmax
        (``SoftMax.cpp``: only Half takes the fused ``half_to_float`` path), and
        ``SoftmaxBackward0`` keeps the fp32 result (derivatives.yaml, ``_softmax``); the reader
        after ``.to(query.dtype)`` keeps the 16-bit copy (``benchmarks/fake_fixtures_findings.md``,
        section 5: BLOOM keeps [4, 4, 512, 512] in fp32 and in bf16)."""
        if self.train_dtype.itemsize >= DType.FLOAT.itemsize:
            return frozenset()
        return frozenset(op.index for op in self.graph.ops
                         if op.op_type == "Softmax" and op.fx_dtype == "float32" and op.index not in self.flash_ops
                         and op.outputs and op.outputs[0] not in self.fp32)

    def _fp32_scaled(self, op: Op) -> str | None:
        """The normalised activation a norm of :data:`FP32_SCALE_NORMS` multiplies by its weight
        in ``op``, when training is 16-bit without autocast and the export shows no fp32 cast
        (an fp32 export drops them): that product runs in fp32, so ``MulBackward0`` keeps the
        fp32 activation, not the 16-bit one the export's dtype suggests."""
        if self.train_dtype.itemsize >= DType.FLOAT.itemsize or self.autocast is not None or len(op.inputs) != 2:
            return None
        for x, w in (op.inputs, op.inputs[::-1]):
            t = self.graph.tensor(w)
            if t is not None and t.is_weight and self._is_activation(x) and x not in self.fp32:
                return x
        return None

    def _silu_input(self, op: Op) -> str | None:
        """x when ``op`` is the Sigmoid or the Mul of ``x * Sigmoid(x)``, the sigmoid read by that
        Mul alone: how both torch.onnx exporters write ``F.silu`` (torchlib ``aten_silu``,
        symbolic_opset9 ``silu``: ``Mul(x, Sigmoid(x))``).  Eager PyTorch runs it as one op whose
        backward reads only its input (derivatives.yaml, ``silu``: ``silu_backward(grad, self)``),
        where the two ops would keep the sigmoid's output and both factors; a model that writes
        ``x * torch.sigmoid(x)`` itself is taken as ``F.silu`` too."""
        g = self.graph
        if op.op_type == "Sigmoid":
            sig = op
        elif op.op_type == "Mul" and len(op.inputs) == 2:
            prods = [g.producer(n) for n in op.inputs]
            sigs = [g.ops[p] for p in prods if p is not None and g.ops[p].op_type == "Sigmoid"]
            if not sigs:
                return None
            sig = next((sg for sg in sigs if sg.inputs[0] in op.inputs and sg.outputs[0] in op.inputs), None)
            if sig is None:
                return None
        else:
            return None
        x, y = sig.inputs[0], sig.outputs[0]
        readers = g.consumers(y)
        if not x or len(readers) != 1:
            return None
        mul = g.ops[readers[0]]
        if mul.op_type != "Mul" or sorted(n for n in mul.inputs if n) != sorted((x, y)) or x == y:
            return None
        return x if op.index in (sig.index, mul.index) else None

    def _copies(self, name: str, repeat: int) -> int:
        """Copies of ``name`` kept by an op that runs ``repeat`` times per forward pass: one per
        run of the op or of the producer, whichever runs more; none for an op that never runs
        (the branch of an ``If`` not taken, kept for its parameters)."""
        producer = self.graph.producer(name)
        return 0 if repeat == 0 else max(repeat, 1 if producer is None else self.graph.ops[producer].repeat)

    def _recurrent_reserve(self, op: Op) -> float:
        """What cuDNN's training reserve space holds for an LSTM/GRU/RNN's backward: the gate
        activations of every step and direction, ``T D B G H`` elements, plus the LSTM's cell
        states ``T D B H``, plus the hidden states when ``Y`` is not an output (cuDNN
        ``cudnnRNNForward``: "reserveSpace ... used to pass intermediate results from
        cudnnRNNForward() to the backward calls"; sizes as in :mod:`dml2comm.ops.recurrent`)."""
        from dml2comm.ops.recurrent import recurrent_shape

        s = recurrent_shape(op, self.graph.op_inputs(op))
        per_state = s.steps * s.directions * s.batch * s.hidden
        elements = s.gates * per_state + (s.states - 1) * per_state + (0 if op.outputs and op.outputs[0] else per_state)
        return float(elements * self.train_dtype.itemsize)

    def _local_numel(self, name: str) -> float:
        t = self.graph.tensor(name)
        if t is None:
            return 0.0
        if self.autocast is not None:
            return self._numel.get(name, float(t.numel))
        full = self.size.get(name)
        return full / (self.train_dtype.itemsize if t.dtype.is_float else t.dtype.itemsize) if full else float(t.numel)

    def _pointwise_needs(self, op: Op) -> list[str]:
        rule = _POINTWISE_NEEDS[op.op_type]
        grad = self.needs_grad
        ins = [n for n in op.inputs if n]
        if not any(n in grad for n in ins):
            return []
        acts = [n for n in ins if self._is_activation(n)]
        if rule == "out":
            return [o for o in op.outputs[:1] if o]
        if rule == "in0":
            return [n for n in ins[:1] if n in acts]
        if rule == "partner":  # d(a*b)/da = b: keep b when a needs a gradient
            return [n for n in acts if any(o in grad for o in ins if o != n)]
        if rule == "div":  # d(a/b)/da = 1/b; d(a/b)/db = -a/b^2: keep b, and a if b needs one
            keep = [n for n in ins[1:2] if n in acts]
            if len(ins) > 1 and ins[1] in grad:
                keep.extend(n for n in ins[:1] if n in acts)
            return keep
        return acts

    def _add_assumed_dropout(self) -> None:
        """Exports are inference graphs: add the masks of the Dropout a training step runs
        where GPT-2 / Megatron-LM place it (Korthikanti et al. 2022, Sec. 4.1): on the attention
        probabilities (a 1-byte mask and the dropped-out copy the next MatMul keeps) and on each
        residual branch (a 1-byte mask), i.e. the branch input of an Add of two equal-shaped
        gradient-carrying activations (the later-produced one)."""
        g = self.graph
        for op in g.ops:
            extra: list[tuple[str, float]] = []
            if op.index in self.flash_ops:  # a flash kernel regenerates its dropout mask (Dao et al. 2022, Sec. 3.1)
                continue
            if op.op_type == "Softmax":
                t = g.tensor(op.outputs[0])
                if t is not None and t.rank >= 2 and t.shape[-1] == t.shape[-2]:
                    extra.append((f"mask:{op.index}", self._local_numel(op.outputs[0])))
                    # the MatMul with V keeps the dropped-out copy; when it reads the softmax
                    # output itself (no Cast between) that copy is a tensor of its own
                    if any(g.ops[c].op_type in _LINEAR for c in g.consumers(op.outputs[0])):
                        extra.append((f"mask:{op.index}:dropped", self.size.get(op.outputs[0], 0.0)))
            elif op.op_type == "Add" and len(op.inputs) == 2:
                a, b = op.inputs
                ta, tb = g.tensor(a), g.tensor(b)
                if (ta is not None and tb is not None and ta.shape == tb.shape and a in self.needs_grad and b in self.needs_grad
                        and self._is_activation(a) and self._is_activation(b)):
                    branch = max((a, b), key=lambda n: g.producer(n) if g.producer(n) is not None else -1)
                    if self._from_linear(branch):
                        extra.append((f"mask:{op.index}", self._local_numel(branch)))
            if extra:
                self.saved_by_op[op.index] = self.saved_by_op[op.index] + tuple(extra)

    def _from_linear(self, name: str) -> bool:
        """Output of a weight layer, possibly through its bias Add (a residual branch's end)."""
        g = self.graph
        prod = g.producer(name)
        while prod is not None and g.ops[prod].op_type in VIEW_OPS:  # Gemm on [b*s, h], then Reshape
            prod = g.producer(g.ops[prod].inputs[0])
        if prod is None:
            return False
        op = g.ops[prod]
        if op.op_type in _LINEAR:
            return True
        if op.op_type == "Add":
            others = [n for n in op.inputs if n]
            weights = [n for n in others if (t := g.tensor(n)) is not None and t.is_weight]
            acts = [n for n in others if n not in weights]
            return len(weights) == 1 and len(acts) == 1 and (p := g.producer(acts[0])) is not None and g.ops[p].op_type in _LINEAR
        return False

    # -- queries -------------------------------------------------------------------------

    def saved_bytes(self, op_indices: Iterable[int], recompute: Recompute | str = Recompute.NONE, attention_core: frozenset[int] = frozenset()) -> float:
        """Bytes kept for backward by ``op_indices`` for one micro-batch.

        ``recompute``: ``none``; ``selective`` drops what the ops in ``attention_core`` keep
        (their inputs from outside the core stay); ``full`` keeps only the inputs of the set.
        """
        ops = list(op_indices)
        members = set(ops)
        recompute = Recompute.of(recompute)
        if recompute is Recompute.FULL:
            return self.boundary_bytes(members)
        stored: dict[str, float] = {}
        regions_seen: set[int] = set()
        core = attention_core if recompute is Recompute.SELECTIVE else frozenset()
        for i in ops:
            region = self.region.get(i)
            if region is not None:
                if region in regions_seen:
                    continue
                regions_seen.add(region)
                for key, nbytes in self._region_saved(region, members, core):
                    stored[key] = nbytes
                continue
            for key, nbytes in self.saved_by_op[i]:
                # selective recomputation rebuilds what the attention core produces (its masks
                # included) from the core's inputs, which stay
                if i in core and (key.startswith("mask:") or self._produced_in(key, core)):
                    continue
                stored[key] = max(stored.get(key, 0.0), nbytes)
        return sum(stored.values())

    def _produced_in(self, key: str, ops: frozenset[int]) -> bool:
        prod = self.graph.producer(key)
        return prod is not None and prod in ops

    def _region_saved(self, region: int, members: set[int], core: frozenset[int]) -> list[tuple[str, float]]:
        """A fused point-wise region keeps its masks and the region inputs its ops need."""
        ops = tuple(i for i in self.region_members[region] if i in members)
        inside = self._inside.get(ops)
        if inside is None:
            inside = self._inside[ops] = frozenset(o for i in ops for o in self.graph.ops[i].outputs if o)
        out: dict[str, float] = {}
        repeat = self.graph.ops[ops[0]].repeat if ops else 1  # a region never joins ops of different repeats
        kept: list[str] = []  # what the region's ops keep, to be traced back to the region's inputs
        for i in ops:
            for key, nbytes in self.saved_by_op[i]:
                if key.startswith(("mask:", "indices:")):
                    if i not in core:
                        out[key] = nbytes
                    continue
                if i in core and self._produced_in(key, core):
                    continue
                kept.append(key)
        if kept:
            asked = (inside, tuple(kept))
            found = self._inputs.get(asked)
            if found is None:  # the same (part of a) region is asked about for many op sets
                found = self._inputs[asked] = self._region_inputs(kept, inside)
            for src in found:
                out[src] = self.size.get(src, 0.0) * self._copies(src, repeat)
        return list(out.items())

    def _region_inputs(self, names: Sequence[str], inside: frozenset[str]) -> tuple[str, ...]:
        """Activation inputs of the region that ``names`` are computed from (a name computed
        outside the region stands for itself), their view bases, in the order found.

        One walk back from all of ``names`` together, each tensor visited once: linear in the
        region's size (a walk per name was quadratic on a long point-wise chain, issue 36)."""
        seen: set[str] = set()
        stack = list(reversed(names))
        found: dict[str, None] = {}
        while stack:
            n = stack.pop()
            if n in seen:
                continue
            seen.add(n)
            prod = self.graph.producer(n)
            if n in inside and prod is not None:
                stack.extend(x for x in self.graph.ops[prod].inputs if x)
            elif self._is_activation(n):
                found[self.base.get(n, n)] = None
        return tuple(found)

    def boundary_bytes(self, members: set[int]) -> float:
        """Activations entering ``members`` from outside that need gradients (a checkpoint)."""
        stored: dict[str, float] = {}
        for i in members:
            for name in self.graph.ops[i].inputs:
                if not name or name not in self.needs_grad or not self._is_activation(name):
                    continue
                prod = self.graph.producer(name)
                if prod is not None and prod not in members:
                    stored[self.base.get(name, name)] = self.size.get(name, 0.0)
        return sum(stored.values())

    def transient_bytes(self, op_indices: Iterable[int]) -> float:
        """The largest set of outputs one op materialises (its working set while it runs); a
        flash kernel materialises its output only."""
        best = 0.0
        for i in op_indices:
            op = self.graph.ops[i]
            if op.op_type in VIEW_OPS or (i in self.flash_ops and i not in self.flash_carriers):
                continue
            if i in self._fp32_softmax:  # its fp32 result (in backward: the fp32 gradient it makes)
                best = max(best, self._local_numel(op.outputs[0]) * DType.FLOAT.itemsize)
                continue
            best = max(best, sum(self.size.get(o, 0.0) for o in op.outputs if o))
        return best


def stage_memory_dict(states: ModelStates, activations: float, buffers: float, transient: float,
                      grads_in_backward: bool = True) -> Mapping[str, float]:
    """One stage's memory per GPU at its step's peak (:func:`step_peak_bytes`), as the caching
    allocator holds it (``torch.cuda.max_memory_allocated()``): the parts held at that peak (they
    sum to ``total_bytes``; gradients not yet allocated, or activations already freed at the
    optimizer step, count 0), and both candidate peaks (``step_forward_backward_bytes``,
    ``step_optimizer_bytes``).  ``framework_bytes``, the CUDA context and workspaces outside the
    allocator, is reported beside them and not in the total: it is taken off the GPU's capacity
    (:func:`allocator_capacity_bytes`)."""
    step = step_peak_bytes(states, activations, buffers, transient, grads_in_backward)
    at_optimizer = step.optimizer_step > step.forward_backward
    return {
        "weights_bytes": states.weights_bytes,
        "grads_bytes": states.grads_bytes if at_optimizer else float(step.grads_held),
        "optimizer_bytes": states.optimizer_bytes,
        "activations_bytes": 0.0 if at_optimizer else activations,
        "buffers_bytes": buffers,
        "transient_bytes": 0.0 if at_optimizer else transient,
        "framework_bytes": FRAMEWORK_OVERHEAD_BYTES,
        "total_bytes": float(step.peak),
        "step_forward_backward_bytes": float(step.forward_backward),
        "step_optimizer_bytes": float(step.optimizer_step),
    }


def allocator_capacity_bytes(hbm_bytes: float) -> float:
    """What the caching allocator can hand out on a GPU of ``hbm_bytes``: its memory less the
    framework constant (:data:`FRAMEWORK_OVERHEAD_BYTES`: the CUDA context, cuBLAS/cuDNN
    workspaces and launch buffers, which ``torch.cuda.max_memory_allocated()`` does not count).
    A plan fits when its peak (allocated) is at most this."""
    return float(hbm_bytes) - FRAMEWORK_OVERHEAD_BYTES
