"""The parallelism and batching configuration of one training run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from dml2comm.choices import Choice as _Choice
from dml2comm.errors import ConfigError
from dml2comm.ir.graph import DType

__all__ = ["ParallelConfig", "check_choice", "check_zero_stage", "DTYPES", "Schedule", "Recompute", "Stack", "Precision", "AttentionKernel", "Optimizer", "CpScheme", "DTypeName", "DEFAULT_PRECISION", "DEFAULT_ATTENTION", "SCHEDULES",
           "RECOMPUTE_MODES", "STACKS", "PRECISIONS", "ATTENTION_KERNELS", "OPTIMIZERS", "CP_SCHEMES",
           "MAX_GPUS", "MAX_MICRO_BATCH", "MAX_SCHEDULE_STEPS", "MAX_SEQ_LEN", "check_gpu_count"]

DTYPES = {"bf16": DType.BFLOAT16, "fp16": DType.FLOAT16, "fp32": DType.FLOAT}


class DTypeName(_Choice):
    """The training dtypes (``--dtype``), by their flag names: the keys of :data:`DTYPES`."""

    BF16 = "bf16"
    FP16 = "fp16"
    FP32 = "fp32"


class Schedule(_Choice):
    """Pipeline schedules: GPipe (Huang et al. 2019), 1F1B (PipeDream-Flush, Narayanan et al.
    2021 Sec. 2.2.1) and interleaved 1F1B (Sec. 2.2.2, v model chunks per GPU)."""

    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"
    INTERLEAVED = "interleaved"


class Recompute(_Choice):
    """Activation recomputation: none, selective (the attention core, Korthikanti et al. 2022
    Sec. 5) or full (each transformer layer's input kept, the layer recomputed, Megatron-LM
    ``--recompute-granularity full``)."""

    NONE = "none"
    SELECTIVE = "selective"
    FULL = "full"


class Stack(_Choice):
    """What runs the model, which decides the kernels that exist (``--stack``).

    - ``megatron``: Megatron-LM / Megatron-Core: fused point-wise kernels (bias-GeLU,
      bias-dropout-add, scale-mask-softmax; Narayanan et al. 2021 Sec. 4.2), fused or flash
      attention, a vocabulary-parallel cross-entropy in fp32.
    - ``pytorch``: eager PyTorch 2.x / Hugging Face transformers: one kernel per op, the casts
      the model code makes, ``F.scaled_dot_product_attention`` (flash kernels on sm_80+), the
      loss as written (``ForCausalLMLoss`` upcasts the logits to fp32).
    """

    MEGATRON = "megatron"
    PYTORCH = "pytorch"


class Precision(_Choice):
    """How parameters, gradients and optimizer states are held (``--precision``).

    - ``mixed``: Megatron's mixed precision: 16-bit parameters and gradients for the passes,
      fp32 master weights and Adam states (Rajbhandari et al. 2020 Sec. 3.1: 2 + 2 + 12 bytes
      per parameter), fp32 main gradients where ``--grad-reduce-dtype fp32``.
    - ``amp``: ``torch.autocast``: fp32 parameters, gradients and Adam states (4 + 4 + 8), the
      GEMMs in the 16-bit dtype on 16-bit copies autocast makes of the weights each forward.
    - ``bf16``: the whole model in 16 bits (``model.to(torch.bfloat16)``): parameters, gradients
      and both Adam states 16-bit, no master copy (2 + 2 + 4).
    """

    MIXED = "mixed"
    AMP = "amp"
    BF16 = "bf16"


class AttentionKernel(_Choice):
    """How the attention core (scores, softmax, context) runs (``--attention``).

    - ``flash``: one fused kernel (FlashAttention-2, Dao 2023; cuDNN / PyTorch SDPA flash on
      sm_90): no score matrix in memory, the output and log-sum-exp saved for backward.
    - ``unfused``: batched GEMMs with the scores through HBM (Megatron-LM 2020-2022, the
      sources Narayanan 2021, Korthikanti 2022 and vTrain ran).
    """

    FLASH = "flash"
    UNFUSED = "unfused"


class Optimizer(_Choice):
    """The optimizer (``--optimizer``): Adam (Kingma & Ba 2015), AdamW (Loshchilov & Hutter
    2019; the same two moment states as Adam) or plain SGD (no state)."""

    ADAM = "adam"
    ADAMW = "adamw"
    SGD = "sgd"

    @property
    def is_adam(self) -> bool:
        """Adam and AdamW: two fp32 moment states per parameter and the same update kernels."""
        return self is not Optimizer.SGD


class CpScheme(_Choice):
    """Context-parallel schemes: DeepSpeed-Ulysses (Jacobs et al. 2023, arXiv:2309.14509:
    AllToAll of Q, K, V and the output, heads split c-way) and ring attention (Liu et al. 2023,
    arXiv:2310.01889; Megatron-Core ``--cp-comm-type p2p``: K/V blocks passed around the group).  :data:`CP_SCHEMES` spells the values out (for the
    site's reference page; tests/test_closed_sets.py checks they agree)."""

    ULYSSES = "ulysses"
    RING = "ring"


#: The precision each stack runs by default: Megatron's fp32 master weights; torch AMP for
#: PyTorch / Hugging Face (``Trainer(bf16=True)`` runs the model under ``torch.autocast``).
DEFAULT_PRECISION = {Stack.MEGATRON: Precision.MIXED, Stack.PYTORCH: Precision.AMP}
#: The attention kernel each stack runs by default: SDPA's flash kernel for PyTorch; for
#: Megatron the unfused core its 2020-2022 sources ran (``--attention flash`` for
#: Megatron-Core with ``--use-flash-attn`` / Transformer Engine).
DEFAULT_ATTENTION = {Stack.MEGATRON: AttentionKernel.UNFUSED, Stack.PYTORCH: AttentionKernel.FLASH}

SCHEDULES = tuple(s.value for s in Schedule)
STACKS = tuple(s.value for s in Stack)
PRECISIONS = tuple(p.value for p in Precision)
ATTENTION_KERNELS = tuple(a.value for a in AttentionKernel)
RECOMPUTE_MODES = tuple(r.value for r in Recompute)
OPTIMIZERS = tuple(o.value for o in Optimizer)
#: Context-parallel schemes: DeepSpeed-Ulysses (Jacobs et al. 2023, arXiv:2309.14509: AllToAll
#: of Q, K, V and the output, heads split c-way) and ring attention (Liu et al. 2023,
#: arXiv:2310.01889; Megatron-Core ``--cp-comm-type p2p``: K/V blocks passed around the group).
CP_SCHEMES = ("ulysses", "ring")

#: PyTorch DDP's default gradient bucket (``bucket_cap_mb=25``,
#: torch.nn.parallel.DistributedDataParallel documentation).
DEFAULT_BUCKET_BYTES = 25 * 1024 * 1024


#: The most GPUs a configuration may span, d x t x p x c (4,194,304 = 2**22): four times the
#: largest clusters planned today (about a million GPUs, which still plan in seconds); the
#: rank lists of larger products would not fit in memory.
MAX_GPUS = 2**22
#: The most micro-batch slots the simulator holds, p x m x v (the pipeline's steps; 131,072 =
#: 2**17 take about 5 s and 1 GB): real runs have thousands (Megatron's 1T GPT: p=64, m=192).
MAX_SCHEDULE_STEPS = 2**17
#: The largest micro-batch b (1,048,576 = 2**20 samples): real runs use 1 to a few thousand
#: (Megatron's GPTs 1-16 per GPU, large-batch ResNet training 32-256 per GPU); a micro-batch of
#: 10**12 planned a step of 10**9 s.
MAX_MICRO_BATCH = 2**20
#: The longest sequence (4,194,304 = 2**22 tokens): four times the longest contexts models are
#: trained at (1M tokens: Liu et al. 2024, "World Model on Million-Length Video and Language with
#: Blockwise RingAttention"); the import's memory grows with it (2**24 tokens: about 7 GB, and
#: 10**9 exhausted the machine).
MAX_SEQ_LEN = 2**22


def check_choice(flag: str, value, choices: Sequence[str]) -> None:
    """Refuse a value outside a closed set, in the one wording every command uses (a
    configuration here, the sweep's space in :mod:`dml2comm.search.space`)."""
    if value not in choices:
        raise ConfigError(f"unknown {flag} {str(value)!r}; choose one of {', '.join(choices)}")


def check_zero_stage(stage) -> None:
    """Refuse a ZeRO stage other than 0-3 (Rajbhandari et al. 2020: stages 1-3; 0 is plain DP)."""
    if stage not in (0, 1, 2, 3):
        raise ConfigError(f"--zero must be 0, 1, 2 or 3, got {stage!r}")


def check_gpu_count(gpus: int, flag: str = "--gpus") -> None:
    """Refuse a GPU count above :data:`MAX_GPUS` (a sweep's ``--gpus``, ``--scaling``) before
    anything is enumerated."""
    if gpus > MAX_GPUS:
        raise ConfigError(f"{flag} {gpus:,} is beyond the {MAX_GPUS:,} GPUs dml2comm plans (far beyond any real cluster); "
                          f"use at most {MAX_GPUS:,}")


#: The closed-set fields of :class:`ParallelConfig`, in the order :func:`_resolve_choices` returns them.
_CHOICE_FIELDS = ("dtype", "schedule", "recompute", "stack", "precision", "attention", "optimizer", "cp_scheme")
#: :func:`_resolve_choices` by its arguments: a sweep builds thousands of configurations from a
#: handful of flag combinations (bounded: at most 256 kept).
_RESOLVED_CHOICES: dict[tuple, tuple] = {}


def _resolve_choices(dtype, schedule, recompute, stack, precision, attention, optimizer, cp_scheme) -> tuple:
    """The members of the configuration's closed sets (:data:`_CHOICE_FIELDS`), the stack's
    default precision and attention kernel where they are None; refuses a value outside its set
    and bf16 precision without a bf16 dtype."""
    check_choice("--dtype", dtype, DTYPES)
    check_choice("--schedule", schedule, SCHEDULES)
    check_choice("--recompute", recompute, RECOMPUTE_MODES)
    check_choice("--stack", stack, STACKS)
    if precision is not None:
        check_choice("--precision", precision, PRECISIONS)
    if attention is not None:
        check_choice("--attention", attention, ATTENTION_KERNELS)
    the_dtype, the_stack = DTypeName.of(dtype), Stack.of(stack)
    the_precision = Precision.of(precision) if precision is not None else DEFAULT_PRECISION[the_stack]
    if the_precision is Precision.BF16 and the_dtype is not DTypeName.BF16:
        raise ConfigError(f"--precision bf16 holds the whole model in bf16 but --dtype is {the_dtype}; use --dtype bf16 "
                          "or --precision amp/mixed")
    check_choice("--optimizer", optimizer, OPTIMIZERS)
    check_choice("--cp-scheme", cp_scheme, CP_SCHEMES)
    return (the_dtype, Schedule.of(schedule), Recompute.of(recompute), the_stack, the_precision,
            AttentionKernel.of(attention) if attention is not None else DEFAULT_ATTENTION[the_stack],
            Optimizer.of(optimizer), CpScheme.of(cp_scheme))


@dataclass(frozen=True)
class ParallelConfig:
    """Sizes ``dp_size`` (d), ``tp_size`` (t), ``pp_size`` (p) and the batch.

    ``global_batch_size`` = ``micro_batch_size`` x ``dp_size`` x ``num_micro_batches``
    (Narayanan et al. 2021, Sec. 2.2: m = B / (b d)).
    """

    dp_size: int = 1
    tp_size: int = 1
    pp_size: int = 1
    micro_batch_size: int = 1
    global_batch_size: int = 1
    seq_len: int | None = None
    dtype: DTypeName = DTypeName.BF16
    schedule: Schedule = Schedule.ONE_F_ONE_B
    virtual_stages: int = 1
    zero_stage: int = 0
    sequence_parallel: bool = False
    recompute: Recompute = Recompute.NONE
    optimizer: Optimizer = Optimizer.ADAM
    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    rank_order: str = "tdp"
    dropout: float = 0.0  # assumed training dropout for exports that carry no Dropout nodes
    tp_comm_overlap: bool = False  # Megatron --tp-comm-overlap (needs sequence parallelism)
    # Megatron-LM's asynchronous tensor-parallel all-reduce (async_tensor_model_parallel_allreduce,
    # on unless --no-async-tensor-model-parallel-allreduce; always on in Megatron-Core, where the
    # flag is deprecated and ignored): in backward the input gradient of a column-parallel GEMM is
    # all-reduced (reduce-scattered with SP) while the weight gradient is computed
    # (LinearWithGradAccumulationAndAsyncCommunication.backward).  False: the Megatron-LM of 2021
    # (Narayanan et al.), which waited for the all-reduce.
    async_tp_allreduce: bool = True
    # Megatron-LM's --gradient-accumulation-fusion (default on since 2022; off with
    # --no-gradient-accumulation-fusion): linear layers' weight-gradient GEMMs accumulate into the
    # main_grad buffer; False: every parameter's gradient is added to it in a separate pass per
    # micro-batch (dml2comm.cost.compute.grad_accumulation_s), as the 2021 code did.
    grad_accumulation_fusion: bool = True
    overlap_grad_reduce: bool = True  # DDP / Megatron --overlap-grad-reduce: buckets during backward
    grad_reduce_dtype: str | None = None  # None: the training dtype; "fp32": Megatron-LM's
    # --accumulate-allreduce-grads-in-fp32 (fp32 main grads, reduced in fp32)
    # Context parallelism (c): the sequence split into c chunks; num_gpus = d*t*p*c.
    cp_size: int = 1
    cp_scheme: CpScheme = CpScheme.ULYSSES
    # Expert parallelism (e): carved out of the d*c data-and-context ranks as in Megatron-Core
    # (megatron/core/parallel_state.py, MoE "parallel folding": expert_data_parallel_size =
    # world / (expert_tensor_parallel_size * ep * pp), i.e. d*c/e here with ETP = t); adds no GPUs.
    ep_size: int = 1
    # Expert capacity factor: each expert's buffer holds capacity_factor x its even share of the
    # routed tokens (Fedus et al., Switch Transformers, JMLR 2022, Sec. 2.1); 1.0 is DeepSpeed
    # MoE's default (deepspeed.moe.layer.MoE(capacity_factor=1.0)).
    capacity_factor: float = 1.0
    # The training stack (what runs the model), its precision mode and attention kernel; None
    # picks the stack's default (DEFAULT_PRECISION, DEFAULT_ATTENTION).  Resolved, never None,
    # after construction.
    stack: Stack = Stack.MEGATRON
    precision: Precision | None = None
    attention: AttentionKernel | None = None
    # Each micro-batch's inputs are on the GPU before its forward (made there, as the measuring
    # steps of benchmarks/data/gpu_steps do, or prefetched on a side stream): no host-to-device
    # read of the graph's inputs on the step's path (dml2comm.cost.stages).  False: a data
    # loader's .to(device) copies them over PCIe each micro-batch.
    inputs_on_gpu: bool = False

    def __post_init__(self) -> None:
        for name in ("dp_size", "tp_size", "pp_size", "micro_batch_size", "global_batch_size", "virtual_stages", "cp_size", "ep_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        raw = (self.dtype, self.schedule, self.recompute, self.stack, self.precision, self.attention, self.optimizer, self.cp_scheme)
        try:
            resolved = _RESOLVED_CHOICES.get(raw)
        except TypeError:  # an unhashable value: _resolve_choices names it
            resolved = None
        if resolved is None:
            resolved = _resolve_choices(*raw)
            if len(_RESOLVED_CHOICES) < 256:
                _RESOLVED_CHOICES[raw] = resolved
        # flag strings become the enums (frozen: written to the instance's dict, as
        # object.__setattr__ would, in one call: a sweep builds thousands of configurations)
        self.__dict__.update(zip(_CHOICE_FIELDS, resolved))
        self._check_plannable()
        check_zero_stage(self.zero_stage)
        per_step = self.micro_batch_size * self.dp_size
        if self.global_batch_size % per_step:
            raise ConfigError(
                f"global batch {self.global_batch_size} is not divisible by micro-batch {self.micro_batch_size} x d {self.dp_size} "
                f"= {per_step}; choose a global batch that is a multiple of {per_step}"
            )
        if self.grad_reduce_dtype is not None and self.grad_reduce_dtype not in DTYPES:
            raise ConfigError(f"unknown gradient-reduction dtype {self.grad_reduce_dtype!r}; choose one of {', '.join(DTYPES)}")
        if self.tp_comm_overlap and not self.sequence_parallel:
            raise ConfigError("--tp-comm-overlap needs --sequence-parallel (it overlaps the all-gather and reduce-scatter that SP issues)")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"--dropout {self.dropout} must be in [0, 1)")
        if self.schedule is Schedule.INTERLEAVED and self.virtual_stages < 2:
            raise ConfigError("--schedule interleaved needs --virtual-stages of 2 or more")
        if not isinstance(self.capacity_factor, (int, float)) or not self.capacity_factor > 0:
            raise ConfigError(f"--capacity-factor must be positive, got {self.capacity_factor!r}")
        if (self.dp_size * self.cp_size) % self.ep_size:
            raise ConfigError(
                f"--ep {self.ep_size} must divide d x c = {self.dp_size} x {self.cp_size} = {self.dp_size * self.cp_size} "
                "(expert parallelism is carved out of the data- and context-parallel ranks); change --ep or --d"
            )

    def _check_plannable(self) -> None:
        """Refuse sizes the planner cannot hold (:data:`MAX_GPUS`, :data:`MAX_SCHEDULE_STEPS`) or
        no real run has (:data:`MAX_MICRO_BATCH`, :data:`MAX_SEQ_LEN`) before any rank list or
        schedule array is built."""
        gpus = self.dp_size * self.tp_size * self.pp_size * self.cp_size
        if gpus > MAX_GPUS:
            raise ConfigError(f"d x t x p x c = {self.dp_size} x {self.tp_size} x {self.pp_size} x {self.cp_size} = {gpus:,} GPUs "
                              f"is beyond the {MAX_GPUS:,} GPUs dml2comm plans (far beyond any real cluster); use smaller --d/--t/--p/--cp")
        if self.micro_batch_size > MAX_MICRO_BATCH:
            raise ConfigError(f"micro-batch {self.micro_batch_size:,} is beyond the {MAX_MICRO_BATCH:,} samples dml2comm plans (far "
                              "beyond any real run's); use a smaller --micro-batch-size")
        if isinstance(self.seq_len, int) and self.seq_len > MAX_SEQ_LEN:
            raise ConfigError(f"sequence length {self.seq_len:,} is beyond the {MAX_SEQ_LEN:,} tokens dml2comm plans (far beyond any "
                              "trained context); use a smaller --seq-len")
        if self.micro_batch_size * self.dp_size > self.global_batch_size:
            return  # the divisibility check below says what is wrong
        m = self.global_batch_size // (self.micro_batch_size * self.dp_size)
        chunks = self.virtual_stages if self.schedule is Schedule.INTERLEAVED else 1
        steps = self.pp_size * m * chunks
        if steps > MAX_SCHEDULE_STEPS:
            raise ConfigError(f"p x m x v = {self.pp_size} x {m:,} x {chunks} = {steps:,} pipeline steps (m = global batch "
                              f"{self.global_batch_size:,} / (b {self.micro_batch_size} x d {self.dp_size})) is beyond the "
                              f"{MAX_SCHEDULE_STEPS:,} the simulator holds; use a smaller --global-batch-size, a larger "
                              "--micro-batch-size" + (" or fewer --virtual-stages" if chunks > 1 else ""))

    @property
    def num_micro_batches(self) -> int:
        return self.global_batch_size // (self.micro_batch_size * self.dp_size)

    @property
    def chunks(self) -> int:
        """Model chunks per GPU: v with the interleaved schedule, else 1 (``--virtual-stages``
        is ignored by the other schedules, as in Megatron-LM)."""
        return self.virtual_stages if self.schedule is Schedule.INTERLEAVED else 1

    @property
    def num_gpus(self) -> int:
        return self.dp_size * self.tp_size * self.pp_size * self.cp_size

    @property
    def expert_dp_size(self) -> int:
        """Ranks that hold the same experts and reduce their gradients: d*c/e (Megatron-Core)."""
        return self.dp_size * self.cp_size // self.ep_size

    @property
    def train_dtype(self) -> DType:
        return DTYPES[self.dtype]

    @property
    def grad_bytes(self) -> int:
        """Bytes per gradient element as accumulated and reduced: ``grad_reduce_dtype``'s, else
        fp32 under ``--precision amp`` (the gradients of fp32 parameters are fp32: DDP reduces
        them so), else the training dtype's."""
        if self.grad_reduce_dtype:
            return DTYPES[self.grad_reduce_dtype].itemsize
        return 4 if self.precision is Precision.AMP else self.train_dtype.itemsize

    def stack_text(self, attention: bool = True) -> str:
        """The stack in words, for summaries: ``pytorch stack, bf16 precision, flash attention``
        (``no attention`` for a model without any: ``attention`` False)."""
        return f"{self.stack} stack, {self.precision} precision, " + (f"{self.attention} attention" if attention else "no attention")

    def to_dict(self) -> dict[str, object]:
        """The configuration as data (data.json's ``config``, a sweep row's): closed-set values as
        plain ``str`` (their flag values), so rows pickle as strings between a sweep's processes
        (an enum member unpickles through its class's call: 30 ms over the 530B sweep's rows)."""
        return {
            "d": self.dp_size,
            "t": self.tp_size,
            "p": self.pp_size,
            "micro_batch_size": self.micro_batch_size,
            "global_batch_size": self.global_batch_size,
            "num_micro_batches": self.num_micro_batches,
            "seq_len": self.seq_len,
            "dtype": self.dtype._value_,
            "schedule": self.schedule._value_,
            "virtual_stages": self.virtual_stages,
            "zero_stage": self.zero_stage,
            "sequence_parallel": self.sequence_parallel,
            "recompute": self.recompute._value_,
            "optimizer": self.optimizer._value_,
            "bucket_bytes": self.bucket_bytes,
            "rank_order": self.rank_order,
            "dropout": self.dropout,
            "tp_comm_overlap": self.tp_comm_overlap,
            "async_tp_allreduce": self.async_tp_allreduce,
            "grad_accumulation_fusion": self.grad_accumulation_fusion,
            "overlap_grad_reduce": self.overlap_grad_reduce,
            "grad_reduce_dtype": self.grad_reduce_dtype or ("fp32" if self.precision is Precision.AMP else self.dtype._value_),
            "c": self.cp_size,
            "cp_scheme": self.cp_scheme._value_,
            "e": self.ep_size,
            "capacity_factor": self.capacity_factor,
            "stack": self.stack._value_,
            "precision": self.precision._value_,
            "attention": self.attention._value_,
            "inputs_on_gpu": self.inputs_on_gpu,
        }
