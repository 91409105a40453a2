"""Per-layer tables: what every configuration with the same shard reads, built once.

The analysis of one configuration (:func:`dml2comm.analysis.analyze_graph`) and the sweep
(:class:`dml2comm.model.FastEvaluator`) both read a model through :class:`LayerCoster`:

- the model with long runs of identical blocks collapsed to four (:mod:`dml2comm.ir.repeats`):
  everything below is computed on it and read per full layer through a layer map (when the
  collapse does not hold for a model, :class:`NotRepeating` sends the caller to the whole graph);
- per (micro-batch, t, SP, dtype, c, capacity factor, GPU): op costs and times on the
  tensor-parallel shard (:func:`dml2comm.cost.ops.shard_op_costs`) summed per layer, the
  layers' parameters, recomputation time and tensor/context-parallel collectives
  (:class:`LayerTable`), activation bytes per layer, the pipeline partition
  (:func:`dml2comm.parallel.pipeline.partition_layers`) and the tensors crossing each boundary.

What depends on the graph, configuration values and the GPU is cached on the graph under
typed keys (:mod:`dml2comm.cost.cache`); what depends on the cluster's network lives in
:class:`dml2comm.cost.stages.StageCoster`, one per cluster.
"""

from __future__ import annotations

from collections import defaultdict
import dataclasses
from dataclasses import dataclass
from typing import Mapping, Protocol

import numpy as np

from dml2comm.cost.cache import (CacheKey, activation_model_of, attention_sites_of, collapsed_of, derived, layers_of, moe_of,
                                 needs_grad_of, parameter_readers_of, tensor_parallel_of, weight_derived_of)
from dml2comm.cost.compute import hbm_efficiency_of
from dml2comm.cost.host import AUTO, DEFAULT as DEFAULT_HOST, HostModel, host_model
from dml2comm.cost.loss import cross_entropy_s, graph_loss_upcasts, logits_outputs, loss_memory_bytes
from dml2comm.cost.memory import ActivationModel, autocasts_activations
from dml2comm.cost.ops import attention_core_flags, infer_seq_len, shard_op_costs
from dml2comm.cost.profile import ProfileScale
from dml2comm.hardware.gpus import GPU
from dml2comm.ir.graph import OpGraph
from dml2comm.ir.layers import LayerKind
from dml2comm.ir.onnx_import import ImportResult
from dml2comm.ir.repeats import Collapsed
from dml2comm.network.kinds import CollectiveKind, ParallelDim, Phase
from dml2comm.parallel.config import ParallelConfig, Recompute, Stack
from dml2comm.parallel.context import check_context_parallel, context_parallel_comms
from dml2comm.parallel.expert import MoEInfo, check_expert_parallel, expert_parallel_comms
from dml2comm.parallel.pipeline import parameter_shard_factors, partition_layers, sent_activations

__all__ = ["LayerComm", "LayerCoster", "LayerTable", "NotRepeating", "StageActivationsKey", "StageRanges", "gemm_parameters",
           "per_gpu_op_times", "shared_parameters"]


class StageRanges(Protocol):
    """What :meth:`LayerCoster._signatures` reads of a stage table
    (:class:`dml2comm.cost.stages.StageTable`): named here so that this module, which stages.py
    builds on, does not import stages.py back."""

    ranges: list[tuple[int, int]]  # per stage: its full layers first..last - 1
    signatures: list[tuple[int, ...]] | None  # filled on first use


def shared_parameters(graph: OpGraph, readers: Mapping[str, tuple[int, ...]],
                      factor: Mapping[str, int]) -> list[tuple[tuple[int, ...], float, float]]:
    """The parameters read by more than one layer, as :func:`dml2comm.parallel.pipeline.held_copies`
    takes them: (reader layers, elements, elements per GPU after tensor parallelism)."""
    return [(layers, float(graph.tensors[w].numel), graph.tensors[w].numel / factor.get(w, 1))
            for w, layers in readers.items() if len(layers) > 1]


@dataclass
class LayerTable:
    """Per-layer sums for one (micro-batch, t, SP, dtype, c, capacity factor), per full layer
    (op times are per GPU: 1/c of the unsplit ones, expert ops times the capacity factor)."""

    fwd: np.ndarray  # compute seconds per micro-batch
    bwd: np.ndarray
    selective: np.ndarray  # forward seconds of the attention core (selective recomputation)
    params: np.ndarray
    params_local: np.ndarray
    reads_input: np.ndarray  # bool: the layer has an op that reads a graph input
    tp: dict[tuple[CollectiveKind, Phase, float], np.ndarray]  # per-layer counts of each TP collective (bytes per GPU: 1/c)
    shared: list[tuple[tuple[int, ...], float, float]]  # parameters read by several full layers (analysis.shared_parameters)
    flops_fwd: float  # unsharded forward FLOPs of the model per micro-batch
    flops: np.ndarray  # per layer: unsharded forward FLOPs per micro-batch
    # context parallelism (c > 1): per-layer counts of each Ulysses AllToAll (kind, phase, bytes),
    # of ring-attention sites per (phase, bytes), and each layer's attention core (ring overlap)
    cp: dict[tuple[CollectiveKind, Phase, float], np.ndarray] = dataclasses.field(default_factory=dict)
    ring: dict[tuple[Phase, float], np.ndarray] = dataclasses.field(default_factory=dict)
    core_f: np.ndarray | None = None
    core_b: np.ndarray | None = None
    # --tp-comm-overlap: per-layer counts of each TP collective by (kind, phase, bytes, seconds
    # of the GEMM it overlaps: LayerComm.gemm_s)
    tp_gemm: dict[tuple[CollectiveKind, Phase, float, float], np.ndarray] = dataclasses.field(default_factory=dict)
    # Megatron's asynchronous TP all-reduce: per-layer counts of each backward collective on a
    # column-parallel GEMM's input gradient by (kind, bytes, seconds of that GEMM's weight
    # gradient, which runs while it is in flight): TPComm.overlaps_wgrad
    tp_wgrad: dict[tuple[CollectiveKind, float, float], np.ndarray] = dataclasses.field(default_factory=dict)
    # per layer: parameters per GPU whose gradients gradient-accumulation fusion does not take
    # (not a GEMM's weight matrix: norms, biases, tables a Gather reads): unfused_parameters
    unfused_local: np.ndarray | None = None
    # per layer: seconds per micro-batch of the training loss the graph leaves out (forward,
    # backward): Megatron-LM's cross-entropy over the logits the layer produces (dml2comm.cost.loss)
    loss_f: np.ndarray | None = None
    loss_b: np.ndarray | None = None
    # per layer: bytes per GPU the loss keeps per micro-batch and its transient (cost.loss.loss_memory_bytes)
    loss_saved: np.ndarray | None = None
    loss_transient: np.ndarray | None = None
    # per layer: parameters per GPU that a GEMM reads as a weight matrix (gemm_parameters; AMP's cast copies)
    gemm_local: np.ndarray | None = None
    # the tensor- then context-parallel collectives the counts above count, in the order the
    # graph inserts them, on the coster's graph (:class:`LayerComm`; StageCoster.comm_specs)
    comms: tuple[LayerComm, ...] = ()
    # per layer: seconds per micro-batch the GPU waits for eager PyTorch's CPU in its ops (the
    # run-ahead host model's stretch of their kernel times); None under another host model
    idle: np.ndarray | None = None


#: Ops whose weight operand ``torch.autocast`` casts to the 16-bit dtype (its lower-precision
#: list: ``linear``, ``matmul``, ``addmm``, ``bmm``, ``conv*``; aten/src/ATen/autocast_mode.cpp).
_AUTOCAST_GEMMS = frozenset({"MatMul", "Gemm", "Conv", "ConvTranspose", "Einsum"})


def _autocast(config: ParallelConfig) -> bool:
    """Whether ``config``'s activations take autocast's dtypes (:func:`dml2comm.cost.memory.autocasts_activations`)."""
    return autocasts_activations(config.stack, config.precision, config.train_dtype.itemsize)


def gemm_parameters(graph) -> frozenset[str]:
    """Parameters a GEMM reads as a weight matrix (rank >= 2): the weights ``torch.autocast``
    copies to 16 bits in forward (:func:`dml2comm.cost.memory.amp_weight_copy_bytes`), a tied
    embedding table that the LM head's MatMul reads included."""
    def build() -> frozenset[str]:
        read = {src for op in graph.ops if op.op_type in _AUTOCAST_GEMMS for name in op.inputs[:2] if name
                for src in graph.parameter_sources(name)}
        return frozenset(t.name for t in graph.weights if t.is_parameter and t.rank >= 2 and t.name in read)
    return derived(graph, _GemmParamsKey(), build)


def unfused_parameters(graph) -> frozenset[str]:
    """Parameters whose gradients gradient-accumulation fusion leaves to the accumulation pass
    (:func:`dml2comm.cost.compute.grad_accumulation_s`): every parameter except the weight
    matrices (rank >= 2) of linear layers, i.e. vectors (norm scales, biases) and any table a
    ``Gather`` reads (embeddings; a tied embedding too, whose lookup gradient is not a GEMM's)."""
    def build() -> frozenset[str]:
        gathered = {src for op in graph.ops if op.op_type == "Gather" and op.inputs
                    for src in graph.parameter_sources(op.inputs[0])}
        return frozenset(t.name for t in graph.weights if t.is_parameter and (t.rank < 2 or t.name in gathered))
    return derived(graph, _UnfusedKey(), build)


# ---- cache keys (dml2comm.cost.cache): one per cached quantity, holding what it depends on
# besides the graph it is cached on (a collapsed graph fixes its layer map)
@dataclass(frozen=True, slots=True)
class _LayersKey(CacheKey):
    """:class:`LayerTable` (and, inside :class:`_PartitionKey`, what the per-layer times depend on):
    the shard, the GPU, c and the capacity factor the
    op times are scaled by, the CP scheme (with c > 1), ``--seq-len`` and the stack (the loss's
    kernels)."""

    tp_size: int
    sequence_parallel: bool
    dtype: str
    gpu: GPU  # the whole GPU (hashed on every field, a calibrated one's fitted constants included)
    cp_size: int
    capacity_factor: float
    cp_scheme: str | None
    seq_len: int | None
    lenient: bool
    host: HostModel
    stack: Stack
    attention: str = "unfused"  # the attention kernel (ParallelConfig.attention): flash cores, selective recompute
    precision: str = "mixed"  # the precision mode (Hugging Face's loss runs in fp32 under amp: cost.loss.hf_loss_upcasts)
    profile: ProfileScale | None = None  # measured / modelled ratios per layer kind (--profile: cost.profile)


@dataclass(frozen=True, slots=True)
class _PartitionKey(CacheKey):
    """The pipeline partition of the layers of ``layers`` into ``pp_size`` stages."""

    layers: _LayersKey
    pp_size: int


@dataclass(frozen=True, slots=True)
class _GemmParamsKey(CacheKey):
    """:func:`gemm_parameters` (the graph alone)."""


@dataclass(frozen=True, slots=True)
class _UnfusedKey(CacheKey):
    """:func:`unfused_parameters` (the graph alone)."""


@dataclass(frozen=True, slots=True)
class _OwnWeightsKey(CacheKey):
    """Per layer, the parameters it owns (the graph alone)."""


@dataclass(frozen=True, slots=True)
class _ExpertParamsKey(CacheKey):
    """Per full layer, parameters per GPU and their expert part with e > 1."""

    tp_size: int
    sequence_parallel: bool
    dtype_bytes: int
    ep_size: int


@dataclass(frozen=True, slots=True)
class _ExpertCommsKey(CacheKey):
    """Per full layer, counts of the MoE AllToAlls per (phase, bytes)."""

    ep_size: int
    tokens: float
    dtype_bytes: int
    capacity_factor: float


@dataclass(frozen=True, slots=True)
class _CrossingKey(CacheKey):
    """Per boundary after each collapsed layer, the crossing tensors' bytes."""

    tp_size: int
    sequence_parallel: bool
    dtype: str


@dataclass(frozen=True, slots=True)
class _BoundariesKey(CacheKey):
    """Per stage boundary of the partition ``ranges``, the crossing tensors' bytes."""

    tp_size: int
    sequence_parallel: bool
    dtype: str
    ranges: tuple[tuple[int, int], ...]


@dataclass(frozen=True, slots=True)
class _LayerActivationsKey(CacheKey):
    """Per full layer: saved bytes under full recomputation and without, transient bytes."""

    tp_size: int
    sequence_parallel: bool
    dtype: str
    assumed_dropout: bool
    stack: str = "megatron"
    attention: str = "unfused"
    autocast: bool = False  # memory.autocasts_activations


@dataclass(frozen=True, slots=True)
class _SavedKey(CacheKey):
    """The table of saved bytes of collapsed layer ranges ``(first, last)`` under ``recompute``
    (``seq_len``: ``--seq-len``, which picks the attention core selective recomputation drops)."""

    tp_size: int
    sequence_parallel: bool
    dtype: str
    assumed_dropout: bool
    recompute: str
    seq_len: int | None
    stack: str = "megatron"
    attention: str = "unfused"
    autocast: bool = False  # memory.autocasts_activations


@dataclass(frozen=True, slots=True)
class StageActivationsKey(CacheKey):
    """The table of stage activations already computed, by stage signature, per recomputation
    mode (and ``--seq-len``, as :class:`_SavedKey`), stack and attention kernel."""

    tp_size: int
    sequence_parallel: bool
    dtype: str
    assumed_dropout: bool
    recompute: str
    seq_len: int | None
    stack: str = "megatron"
    attention: str = "unfused"
    autocast: bool = False  # memory.autocasts_activations


class NotRepeating(Exception):
    """The collapsed graph's interior representatives disagree: use the whole graph."""


def per_gpu_op_times(times: list[tuple[float, float]], cp: int, capacity_factor: float,
                     expert_ops: frozenset[int]) -> list[tuple[float, float]]:
    """Per-GPU (forward, backward) seconds of each op: with context parallelism every op is
    token-wise or (attention, with causal load balancing) splits its s^2 work evenly, so 1/c of
    each op runs per GPU (Megatron-Core context parallelism; Jacobs et al. 2023 for Ulysses);
    experts compute on capacity-padded buffers (x capacity factor: Fedus et al. 2022 Sec. 2.1)."""
    if cp == 1 and capacity_factor == 1.0:
        return times
    return [(f * (capacity_factor if i in expert_ops else 1.0) / cp, b * (capacity_factor if i in expert_ops else 1.0) / cp)
            for i, (f, b) in enumerate(times)]


def _op_sums(layered, times: list[tuple[float, float]], full_flops: list[float],
             core: list[bool]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per layer: forward and backward seconds of its ops (per GPU), their unsharded forward
    FLOPs, and the forward seconds of its attention-core ops (``core``: what selective
    recomputation rebuilds, Korthikanti et al. 2022 Sec. 5), each summed in op order."""
    fwd = np.array([sum(times[i][0] for i in layer.op_indices) for layer in layered.layers])
    bwd = np.array([sum(times[i][1] for i in layer.op_indices) for layer in layered.layers])
    flops = np.array([sum(full_flops[i] for i in layer.op_indices) for layer in layered.layers])
    selective = np.array([sum(times[i][0] for i in layer.op_indices if core[i]) for layer in layered.layers])
    return fwd, bwd, flops, selective


@dataclass(frozen=True, slots=True)
class LayerComm:
    """One collective inside a layer, per micro-batch, as the per-layer tables count it and as
    the analysis draws it (:meth:`dml2comm.cost.stages.StageCoster.comm_specs`): ``layer`` and
    ``after_op`` on the coster's graph (the collapsed one in a sweep), ``message_bytes`` per GPU
    as it is priced (1/c of a tensor-parallel message with context parallelism), ``count`` calls
    per micro-batch; ``gemm_s``: a TP collective's adjacent GEMM seconds it can overlap
    (``--tp-comm-overlap``), ``wgrad_s``: a backward TP collective on a column-parallel GEMM's
    input gradient, its weight-gradient seconds (Megatron's asynchronous TP all-reduce), else None."""

    kind: CollectiveKind
    dim: ParallelDim
    phase: Phase
    layer: int
    after_op: int
    tensor: str
    message_bytes: float
    count: int
    reason: str
    gemm_s: float = 0.0
    wgrad_s: float | None = None


def _tp_comms(comms, layered, times: list[tuple[float, float]], cp: int) -> tuple[LayerComm, ...]:
    """The tensor-parallel collectives (:class:`dml2comm.parallel.tensor.TPComm`) as
    :class:`LayerComm` records: 1/c of the message per GPU, the adjacent GEMM's seconds (in
    backward its input-gradient half) and, for a collective on a column-parallel GEMM's input
    gradient, that GEMM's weight-gradient seconds: a GEMM's backward is its data and weight
    gradients, of equal FLOPs, half each."""
    out = []
    for c in comms:
        f, b = times[c.op_index]
        wgrad = b / 2 if c.overlaps_wgrad and c.phase is Phase.BACKWARD else None
        out.append(LayerComm(c.kind, ParallelDim.TP, c.phase, layered.layer_of_op[c.op_index], c.op_index, c.tensor,
                             c.message_bytes / cp, 1, c.reason, f if c.phase is Phase.FORWARD else b / 2, wgrad))
    return tuple(out)


def _tp_tables(comms: tuple[LayerComm, ...], n: int) -> tuple[dict, dict, dict]:
    """Per-layer counts of each tensor-parallel collective (:func:`_tp_comms`): by (kind,
    phase, bytes); by (kind, phase, bytes, seconds of the adjacent GEMM it can overlap, for
    ``--tp-comm-overlap``); and of each backward collective that overlaps its GEMM's weight
    gradient (Megatron's asynchronous TP all-reduce, TPComm.overlaps_wgrad) by (kind, bytes,
    seconds of that weight gradient)."""
    tp_counts: dict[tuple, np.ndarray] = {}
    tp_gemm: dict[tuple, np.ndarray] = {}
    tp_wgrad: dict[tuple, np.ndarray] = {}
    for c in comms:
        key = (c.kind, c.phase, float(c.message_bytes))
        tp_counts.setdefault(key, np.zeros(n))[c.layer] += 1
        tp_gemm.setdefault(key + (c.gemm_s,), np.zeros(n))[c.layer] += 1
        if c.wgrad_s is not None:
            tp_wgrad.setdefault((c.kind, float(c.message_bytes), c.wgrad_s), np.zeros(n))[c.layer] += 1
    return tp_counts, tp_gemm, tp_wgrad


def _cp_tables(config: ParallelConfig, graph: OpGraph, layered, seq_len: int | None, times: list[tuple[float, float]],
               cp: int) -> tuple[dict, dict, np.ndarray, np.ndarray, tuple[LayerComm, ...]]:
    """With context parallelism (c > 1; else empty): per-layer counts of each Ulysses AllToAll
    by (kind, phase, bytes), of ring-attention sites by (phase, bytes) (one entry per site and
    phase: c - 1 steps each), each layer's attention-core forward and backward seconds (the
    analysis's attn_core: a layer's last site wins), :mod:`dml2comm.parallel.context`, and the
    collectives they count as :class:`LayerComm` records."""
    n = len(layered.layers)
    cp_counts: dict[tuple, np.ndarray] = {}
    ring: dict[tuple, np.ndarray] = {}
    core_f, core_b = np.zeros(n), np.zeros(n)
    if cp <= 1:
        return cp_counts, ring, core_f, core_b, ()
    sites = attention_sites_of(graph, layered, seq_len)
    check_context_parallel(sites, cp, config.tp_size, config.cp_scheme, seq_len)
    for site in sites:
        ops = [i for i in range(site.scores_op, site.context_op + 1) if layered.layer_of_op[i] == site.layer]
        core_f[site.layer] = sum(times[i][0] for i in ops)
        core_b[site.layer] = sum(times[i][1] for i in ops)
    comms = tuple(LayerComm(cc.kind, ParallelDim.CP, cc.phase, cc.layer, cc.after_op, cc.tensor, cc.message_bytes, cc.count,
                            cc.reason)
                  for cc in context_parallel_comms(sites, cp, config.tp_size, config.cp_scheme, config.train_dtype.itemsize))
    for cc in comms:
        if cc.kind is CollectiveKind.SEND_RECV:
            ring.setdefault((cc.phase, float(cc.message_bytes)), np.zeros(n))[cc.layer] += 1
        else:
            cp_counts.setdefault((cc.kind, cc.phase, float(cc.message_bytes)), np.zeros(n))[cc.layer] += cc.count
    return cp_counts, ring, core_f, core_b, comms


class LayerCoster:
    """Per-layer tables of one imported model on one GPU (module docstring)."""

    def __init__(self, imported: ImportResult, gpu: GPU, collapse: bool = True, collapsed: Collapsed | None = None,
                 lenient: bool = False, host: HostModel | None = DEFAULT_HOST, profile: ProfileScale | None = None) -> None:
        """``collapsed``: ``imported`` is already the collapsed model (another micro-batch size
        of a model whose collapse was found on a full import); else the collapse is found here
        (``collapse=False``: the whole graph).  ``lenient``: ops without a cost rule are costed
        as memory-bound (``--lenient``) instead of refused.  ``host``: the host-side model the
        op times include (:mod:`dml2comm.cost.host`); None: the one each configuration's stack
        runs (:meth:`host_for`).  ``profile``: measured / modelled kernel-time ratios per layer
        kind (``--profile``, :mod:`dml2comm.cost.profile`) the op and loss times are scaled by."""
        self.imported = imported
        self.profile = profile
        self.gpu = gpu
        self.lenient = lenient
        self.host = host
        self.pre_collapsed = collapsed is not None
        #: The full model's trainable parameters (``imported`` may be the collapsed model)
        self.model_params = collapsed.full_params if collapsed is not None else imported.graph.num_params
        if collapsed is None:
            full = imported.graph
            self.full_layered = layers_of(full)
            collapsed = collapsed_of(full) if collapse else None
        self._use(collapsed)

    def _use(self, collapsed: Collapsed | None) -> None:
        """Work on ``collapsed`` (or the whole graph when None)."""
        full = self.imported.graph
        self.collapsed = collapsed
        self._copies: dict[int, np.ndarray] = {}  # LayerCoster._copies_before
        if collapsed is None:
            self.graph, self.layered = full, self.full_layered
            n = len(self.full_layered.layers)
            self.layer_map = np.arange(n)
            self.full_index = list(range(n))
            self.interior: tuple[tuple[int, int], ...] = ()
        else:
            self.graph, self.layered = collapsed.graph, collapsed.layered
            self.layer_map = np.array(collapsed.layer_map, dtype=np.int64)
            self.full_index = list(collapsed.full_index)
            self.interior = collapsed.interior
        self.kinds = [self.layered.layers[r].kind for r in self.layer_map]

    # ---- shared parts (computed on the collapsed graph, read per full layer through layer_map)
    def _core(self, seq_len: int | None, attention: str) -> list[bool]:
        """Per op: on the attention scores (what selective recomputation rebuilds; nothing in a
        flash core)."""
        return attention_core_flags(self.graph, seq_len, attention)

    def _tp(self, config: ParallelConfig):
        return tensor_parallel_of(self.graph, config.tp_size, config.sequence_parallel, config.train_dtype.itemsize)

    def _moe(self) -> MoEInfo | None:
        return moe_of(self.graph, self.layered)

    def _scale(self, config: ParallelConfig) -> tuple[int, float]:
        """(c, the factor expert ops' times take): the analysis looks for experts only with e > 1
        or a capacity factor other than 1, and scales expert ops only when it finds some."""
        cf = 1.0
        if config.ep_size > 1 or config.capacity_factor != 1.0:
            if self._moe() is not None:
                cf = config.capacity_factor
        return config.cp_size, cf

    def host_for(self, config: ParallelConfig) -> HostModel:
        """The host model of ``config``: the coster's own, else its stack's
        (:data:`dml2comm.cost.host.STACK_HOST_MODEL`)."""
        return self.host if self.host is not None else host_model(AUTO, config.stack)

    def _layer_key(self, config: ParallelConfig) -> _LayersKey:
        """What the per-layer times depend on (the layers' and the partition's cache key)."""
        cp, cf = self._scale(config)
        gpu = self.gpu
        return _LayersKey(config.tp_size, config.sequence_parallel, config.dtype, gpu, cp, cf, config.cp_scheme if cp > 1 else None, config.seq_len, self.lenient,
                          self.host_for(config), config.stack, config.attention, str(config.precision), self.profile)

    def layer_table(self, config: ParallelConfig) -> LayerTable:
        return derived(self.graph, self._layer_key(config), lambda: self._build_layers(config))

    def _check_interior(self, *arrays: np.ndarray) -> None:
        """Blocks i + 1 and i + 2 of a collapsed run must agree (the state entering a block has
        settled); else the collapse is not valid for this model."""
        for r1, r2 in self.interior:
            for a in arrays:
                x, y = float(a[r1]), float(a[r2])
                # np.isclose(x, y, rtol=1e-12, atol=0) (infinities equal, NaN never), without its
                # per-call array setup: the sweep checks some 2,000 pairs of scalars
                if not (x == y or abs(x - y) <= 1e-12 * abs(y)):
                    raise NotRepeating

    def _build_layers(self, config: ParallelConfig) -> LayerTable:
        """The :class:`LayerTable` of ``config``'s shard: the op times summed per layer
        (:func:`_op_sums`), parameters (:meth:`_parameter_sums`), the parameters several layers
        read (:meth:`_shared`), the tensor- and context-parallel collectives
        (:func:`_tp_tables`, :func:`_cp_tables`) and the loss (:meth:`_loss_tables`), checked
        on the collapsed blocks (:meth:`_check_interior`) and read per full layer."""
        if self.collapsed is not None and self.host_for(config).run_ahead:
            # eager PyTorch's CPU runs ahead over the whole pass (cost.host.queue_times): its lead
            # carries across blocks, so a block's time depends on how many came before and the
            # collapsed model does not hold; the caller takes the whole graph
            raise NotRepeating
        graph, layered = self.graph, self.layered
        tp = self._tp(config)
        op_costs = shard_op_costs(graph, config.tp_size, config.sequence_parallel, config.dtype, self.gpu, self.lenient,
                                  self.host_for(config), config.stack, config.attention, config.precision, self.profile, layered)
        times, full_flops, kernel_times, queued_loss = op_costs.times, op_costs.full_flops, op_costs.kernel_times, op_costs.loss
        n = len(layered.layers)
        seq_len = config.seq_len or infer_seq_len(graph)
        cp, cf = self._scale(config)
        moe = self._moe() if cf != 1.0 else None
        experts = moe.expert_ops if moe is not None else frozenset()
        times = per_gpu_op_times(times, cp, cf, experts)
        fwd, bwd, flops, selective = _op_sums(layered, times, full_flops, self._core(seq_len, config.attention))
        idle = None
        if kernel_times is not None:  # eager PyTorch: the GPU's wait for the CPU, per layer
            kernel = per_gpu_op_times(kernel_times, cp, cf, experts)
            idle = np.maximum(fwd + bwd - np.array([sum(kernel[i][0] + kernel[i][1] for i in layer.op_indices)
                                                    for layer in layered.layers]), 0.0)
        factor = parameter_shard_factors(graph, tp.weight_factor)
        params, params_local, unfused_local, gemm_local = self._parameter_sums(factor)
        shared = self._shared(factor)
        inputs = set(graph.inputs)
        reads = np.array([any(graph.ops[i].inputs and set(graph.ops[i].inputs) & inputs for i in layer.op_indices)
                          for layer in layered.layers], dtype=bool)
        tp_comms = _tp_comms(tp.comms, layered, times, cp) if config.tp_size > 1 else ()
        tp_counts, tp_gemm, tp_wgrad = _tp_tables(tp_comms, n)
        cp_counts, ring, core_f, core_b, cp_comms = _cp_tables(config, graph, layered, seq_len, times, cp)
        loss_f, loss_b, loss_saved, loss_transient = self._loss_tables(config, tp, cp, queued_loss)
        if queued_loss and idle is not None:  # the loss's own wait for the CPU, on its layer
            for producer, f, b, kf, kb in queued_loss:
                idle[self.layered.layer_of_op[producer]] += max(f + b - (kf + kb), 0.0) / cp
        self._check_interior(fwd, bwd, selective, params, params_local, unfused_local, gemm_local, flops, *tp_counts.values(),
                             *cp_counts.values(), *ring.values(), core_f, core_b, loss_f, loss_b, loss_saved, loss_transient)
        m = self.layer_map
        return LayerTable(fwd[m], bwd[m], selective[m], params[m], params_local[m], reads[m],
                       {k: v[m] for k, v in tp_counts.items()}, shared, float(flops[m].sum()), flops[m],
                       {k: v[m] for k, v in cp_counts.items()}, {k: v[m] for k, v in ring.items()}, core_f[m], core_b[m],
                       {k: v[m] for k, v in tp_gemm.items()}, {k: v[m] for k, v in tp_wgrad.items()}, unfused_local[m],
                       loss_f[m], loss_b[m], loss_saved[m], loss_transient[m], gemm_local[m], tp_comms + cp_comms,
                       None if idle is None else idle[m])

    def _parameter_sums(self, factor: Mapping[str, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per (collapsed) layer, the parameters it owns (:meth:`_own_weights`): elements, and
        per GPU (after the shard ``factor``) all of them, those gradient-accumulation fusion does
        not take (:func:`unfused_parameters`) and those a GEMM reads as a weight matrix
        (:func:`gemm_parameters`)."""
        graph = self.graph
        by_layer = self._own_weights()
        n = len(self.layered.layers)
        params, params_local, unfused_local, gemm_local = np.zeros(n), np.zeros(n), np.zeros(n), np.zeros(n)
        unfused = unfused_parameters(graph)
        gemm = gemm_parameters(graph)
        for li in range(n):
            params[li] = sum(graph.tensors[w].numel for w in by_layer[li])
            params_local[li] = sum(graph.tensors[w].numel / factor.get(w, 1) for w in by_layer[li])
            unfused_local[li] = sum(graph.tensors[w].numel / factor.get(w, 1) for w in by_layer[li] if w in unfused)
            gemm_local[li] = sum(graph.tensors[w].numel / factor.get(w, 1) for w in by_layer[li] if w in gemm)
        return params, params_local, unfused_local, gemm_local

    def _shared(self, factor: Mapping[str, int]) -> list[tuple[tuple[int, ...], float, float]]:
        """The parameters read by several layers (:func:`shared_parameters`) with their full
        layers; :class:`NotRepeating` when one is shared across collapsed blocks (ALBERT-style:
        the whole graph counts them)."""
        shared = []
        if self.collapsed is not None:
            copies = np.bincount(self.layer_map, minlength=len(self.layered.layers))
        for layers_read, numel, local in shared_parameters(self.graph, self._readers(), factor):
            if self.collapsed is not None and any(copies[li] != 1 for li in layers_read):
                raise NotRepeating
            shared.append((tuple(self.full_index[li] for li in layers_read), numel, local))
        return shared

    def _loss_tables(self, config: ParallelConfig, tp, cp: int,
                     queued: tuple = ()) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per layer, the training loss the graph leaves out (Megatron-LM's or Hugging Face's
        cross-entropy over the logits the layer produces, :mod:`dml2comm.cost.loss`): forward
        and backward seconds per micro-batch, the bytes it keeps and its transient, per GPU 1/c
        of the unsplit loss, as the op times (:func:`per_gpu_op_times`).  ``queued``: the
        run-ahead host model's times of the loss in the ops' queue (``OpCosts.loss``), which
        replace :func:`~dml2comm.cost.loss.cross_entropy_s`' own host floor."""
        graph, gpu = self.graph, self.gpu
        n = len(self.layered.layers)
        loss_f, loss_b = np.zeros(n), np.zeros(n)
        loss_saved, loss_transient = np.zeros(n), np.zeros(n)
        achieved_hbm = gpu.kernel_hbm_bytes_per_s * hbm_efficiency_of(gpu)  # bytes/s memory-bound kernels reach
        logits = logits_outputs(graph)
        # which Hugging Face loss (cost.loss.hf_loss_upcasts); Megatron-LM's always upcasts
        upcast = graph_loss_upcasts(graph, config.stack, config.precision, config.train_dtype.itemsize) if logits else True
        in_queue = {producer: (f, b) for producer, f, b, _, _ in queued}
        for name, producer in logits:
            local = tp.shards[producer].outputs[graph.ops[producer].outputs.index(name)]
            if producer in in_queue:
                f, b = in_queue[producer]
            else:
                f, b = cross_entropy_s(local.numel, config.train_dtype.itemsize, achieved_hbm, self.host_for(config).kernel_s, config.stack,
                                       upcast, self.profile.factor("loss") if self.profile is not None else (1.0, 1.0))
            saved, transient = loss_memory_bytes(local.numel, config.stack, upcast, config.train_dtype.itemsize)
            li = self.layered.layer_of_op[producer]
            loss_f[li] += f / cp
            loss_b[li] += b / cp
            loss_saved[li] += saved / cp
            loss_transient[li] += transient / cp
        return loss_f, loss_b, loss_saved, loss_transient

    def _readers(self) -> dict[str, tuple[int, ...]]:
        """Per parameter, the (collapsed) layers reading it: the analysis's ``parameter_layers``."""
        return parameter_readers_of(self.graph, self.layered)

    def _own_weights(self) -> dict[int, list[str]]:
        """Per (collapsed) layer, the parameters it owns (the first layer reading each) in the
        analysis's order."""

        def build() -> dict[int, list[str]]:
            by_layer: dict[int, list[str]] = defaultdict(list)
            for w, layers in self._readers().items():
                by_layer[layers[0]].append(w)
            return by_layer

        return derived(self.graph, _OwnWeightsKey(), build)

    def _expert_params(self, config: ParallelConfig) -> tuple[np.ndarray, np.ndarray] | None:
        """Per full layer with e > 1: parameters per GPU (expert weights 1/e) and the expert part
        of them; None without expert parallelism (the layers' own ``params_local``)."""
        if config.ep_size <= 1:
            return None
        moe = self._moe()
        check_expert_parallel(moe, config.ep_size)
        key = _ExpertParamsKey(config.tp_size, config.sequence_parallel, config.train_dtype.itemsize, config.ep_size)

        def build():
            graph, ep = self.graph, config.ep_size
            tp = self._tp(config)
            experts = moe.expert_weights
            by_layer = self._own_weights()
            factor = parameter_shard_factors(graph, tp.weight_factor)
            n = len(self.layered.layers)
            local, expert = np.zeros(n), np.zeros(n)
            for li in range(n):  # the analysis's sums, weight by weight in the same order
                local[li] = sum(graph.tensors[w].numel / factor.get(w, 1) / (ep if w in experts else 1)
                                for w in by_layer[li])
                expert[li] = sum(graph.tensors[w].numel / factor.get(w, 1) / ep for w in by_layer[li] if w in experts)
            self._check_interior(local, expert)
            m = self.layer_map
            return local[m], expert[m]

        return derived(self.graph, key, build)

    def _ep_counts(self, config: ParallelConfig) -> dict[tuple[Phase, float], np.ndarray]:
        """Per full layer with e > 1: counts of the MoE AllToAlls per (phase, bytes) per micro-batch
        (of :meth:`ep_comms`)."""
        return self._ep_tables(config)[1]

    def ep_comms(self, config: ParallelConfig) -> tuple[LayerComm, ...]:
        """With e > 1: the MoE dispatch and combine AllToAlls
        (:func:`dml2comm.parallel.expert.expert_parallel_comms`) as :class:`LayerComm` records on
        the coster's graph, in the order of the graph; else none."""
        return self._ep_tables(config)[0]

    def _ep_tables(self, config: ParallelConfig) -> tuple[tuple[LayerComm, ...], dict[tuple[Phase, float], np.ndarray]]:
        """:meth:`ep_comms` and, per full layer, their counts per (phase, bytes) (:meth:`_ep_counts`)."""
        if config.ep_size <= 1:
            return (), {}
        moe = self._moe()
        check_expert_parallel(moe, config.ep_size)
        assert moe is not None
        seq_len = config.seq_len or infer_seq_len(self.graph)
        tokens = config.micro_batch_size * (seq_len or 1) / config.cp_size
        dtype_bytes = config.train_dtype.itemsize
        key = _ExpertCommsKey(config.ep_size, tokens, dtype_bytes, config.capacity_factor)

        def build():
            n = len(self.layered.layers)
            comms = tuple(LayerComm(ec.kind, ParallelDim.EP, ec.phase, ec.layer, ec.after_op, ec.tensor, ec.message_bytes, ec.count,
                                    ec.reason)
                          for ec in expert_parallel_comms(moe, tokens, config.ep_size, dtype_bytes, config.capacity_factor))
            counts: dict[tuple, np.ndarray] = {}
            for ec in comms:
                counts.setdefault((ec.phase, float(ec.message_bytes)), np.zeros(n))[ec.layer] += ec.count
            self._check_interior(*counts.values())
            return comms, {k: v[self.layer_map] for k, v in counts.items()}

        return derived(self.graph, key, build)

    def partition(self, config: ParallelConfig, layers: LayerTable):
        key = _PartitionKey(self._layer_key(config), config.pp_size)
        # Python floats: the partition's prefix sums and bisections run a quarter faster on them
        # than on numpy scalars (the same doubles, the same ranges)
        return derived(self.graph, key, lambda: partition_layers((layers.fwd + layers.bwd).tolist(), config.pp_size))

    def _boundary_bytes(self, config: ParallelConfig, ranges) -> list[list[tuple[float, bool]]]:
        """Per stage boundary, the bytes of each activation crossing it per micro-batch (and
        whether it is replicated over the tensor ranks)."""
        key = _BoundariesKey(config.tp_size, config.sequence_parallel, config.dtype, tuple(ranges))
        return derived(self.graph, key, lambda: self._build_boundaries(config, ranges))

    def _build_boundaries(self, config: ParallelConfig, ranges) -> list[list[tuple[float, bool]]]:
        """A tensor crosses the boundary after full layer k when it is produced at or before
        and read after it; on the collapsed graph, after ``layer_map[k]``."""
        return [[(size, rep) for _, size, rep in tensors] for tensors in self.boundary_tensors(config, ranges)]

    def boundary_tensors(self, config: ParallelConfig, ranges) -> list[list[tuple[str, float, bool]]]:
        """Per stage boundary, the activations crossing it per micro-batch by name: (name, bytes
        per GPU before 1/c, replicated over the tensor ranks), the sends' table
        (:meth:`_boundary_bytes`) with the tensors' names."""
        per_boundary = derived(self.graph, _CrossingKey(config.tp_size, config.sequence_parallel, config.dtype),
                               lambda: self._crossing(config))
        return [per_boundary[int(self.layer_map[b - 1])] for _, b in ranges[:-1]]

    def _crossing(self, config: ParallelConfig) -> list[list[tuple[str, float, bool]]]:
        """Per boundary after each (collapsed) layer: the crossing tensors' names, bytes per GPU
        and whether every tensor rank holds the whole tensor (replicated), by name."""
        names, prod, last, sizes, replicated = self._tensor_table(config)
        out = []
        for rb in range(len(self.layered.layers)):
            sel = np.nonzero((prod <= rb) & (last > rb))[0]
            out.append(sorted((names[i], sizes[i], replicated[i]) for i in sel))
        return out

    def _tensor_table(self, config: ParallelConfig):
        """Activations that need a gradient: name, producing layer, last consuming layer, bytes
        per GPU, replicated over the tensor ranks (t > 1 and the shard holds the whole tensor)."""
        graph, layered = self.graph, self.layered
        tp = self._tp(config)
        train = config.train_dtype
        needs_grad = needs_grad_of(graph)
        local_out = {}
        for op, shard in zip(graph.ops, tp.shards):
            for name, t in zip(op.outputs, shard.outputs):
                if name and t is not None:
                    local_out[name] = t
        producer: dict[str, int] = {}
        last_consumer: dict[str, int] = {}
        for op in graph.ops:
            li = layered.layer_of_op[op.index]
            for name in op.outputs:
                if name:
                    producer[name] = li
            for name in op.inputs:
                if name:
                    last_consumer[name] = max(last_consumer.get(name, li), li)
        sent = sent_activations(graph, needs_grad, weight_derived_of(graph))
        names = [n for n in producer if n in sent]
        prod = np.array([producer[n] for n in names], dtype=np.int64)
        last = np.array([max(last_consumer.get(n, producer[n]), producer[n]) for n in names], dtype=np.int64)
        sizes = [float((local_out.get(n) or graph.tensors[n]).nbytes_in(train)) for n in names]
        full = [float(graph.tensors[n].nbytes_in(train)) for n in names]
        replicated = [config.tp_size > 1 and size == whole for size, whole in zip(sizes, full)]
        return names, prod, last, sizes, replicated

    def _activation_model(self, config: ParallelConfig) -> ActivationModel:
        return activation_model_of(self.graph, config.tp_size, config.sequence_parallel, config.dtype, config.dropout > 0,
                                   config.stack, config.attention, _autocast(config))

    def _per_layer(self, config: ParallelConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per full layer: saved bytes under full recomputation (the analysis's rule: blocks
        keep their input, other layers everything), saved bytes without recomputation, transient bytes."""
        key = _LayerActivationsKey(config.tp_size, config.sequence_parallel, config.dtype, config.dropout > 0, config.stack,
                                   config.attention, _autocast(config))

        def build():
            act = self._activation_model(config)
            layers = self.layered.layers
            full = np.array([act.saved_bytes(l.op_indices, Recompute.FULL if l.kind is LayerKind.BLOCK else Recompute.NONE) for l in layers])
            plain = np.array([act.saved_bytes(l.op_indices) for l in layers])
            transient = np.array([act.transient_bytes(l.op_indices) for l in layers])
            self._check_interior(full, plain, transient)
            m = self.layer_map
            return full[m], plain[m], transient[m]

        return derived(self.graph, key, build)

    def _saved_table(self, config: ParallelConfig) -> dict[tuple[int, int], float]:
        """The saved bytes of collapsed layer ranges already computed for ``config``'s shard and
        recomputation mode, by ``(first, last)`` (:meth:`_saved` fills it)."""
        key = _SavedKey(config.tp_size, config.sequence_parallel, config.dtype, config.dropout > 0, config.recompute, config.seq_len,
                        config.stack, config.attention, _autocast(config))
        return derived(self.graph, key, dict)

    def _saved(self, config: ParallelConfig, table: dict[tuple[int, int], float], first: int, last: int) -> float:
        """Saved bytes of the collapsed layers ``first..last - 1`` taken together (``table``:
        :meth:`_saved_table` of ``config``)."""
        value = table.get((first, last))
        if value is None:
            seq_len = config.seq_len or infer_seq_len(self.graph)
            core_flags = self._core(seq_len, config.attention)
            op_idx = [i for li in range(first, last) for i in self.layered.layers[li].op_indices]
            core = frozenset(i for i in op_idx if core_flags[i]) if config.recompute is Recompute.SELECTIVE else frozenset()
            value = table[(first, last)] = self._activation_model(config).saved_bytes(op_idx, config.recompute, core)
        return value

    def _signatures(self, table: StageRanges) -> list[tuple[int, ...]]:
        """Per stage, what its activations depend on: each stage's layers map to a contiguous
        collapsed range ``lo..hi - 1`` with each interior block r2 repeated, so (lo, hi, how many
        extra copies of each interior block) determines the answer (vectorised over stages)."""
        if table.signatures is None:
            starts = np.array([a for a, _ in table.ranges])
            ends = np.array([b for _, b in table.ranges])
            columns = [self.layer_map[starts], self.layer_map[ends - 1] + 1]
            for _, r2 in self.interior:
                cum = self._copies_before(r2)
                columns.append(cum[ends] - cum[starts] - 1)
            table.signatures = list(zip(*(c.tolist() for c in columns)))
        return table.signatures

    def _copies_before(self, r2: int) -> np.ndarray:
        """``cum[k]``: full layers before layer k that map to collapsed layer ``r2``."""
        cum = self._copies.get(r2)
        if cum is None:
            cum = self._copies[r2] = np.concatenate(([0], np.cumsum(self.layer_map == r2)))
        return cum

    def _stage_activations(self, config: ParallelConfig, per_layer: tuple[np.ndarray, np.ndarray, np.ndarray],
                           saved_table: dict[tuple[int, int], float], first: int, last: int, lo: int, hi: int,
                           extras: tuple[int, ...]) -> tuple[float, float, float]:
        """(saved bytes per micro-batch, rebuilt layer bytes, transient bytes) of the stage of
        full layers ``first..last - 1`` (collapsed ``lo..hi - 1`` with ``extras`` more copies of
        each interior block); ``per_layer``: :meth:`_per_layer`, ``saved_table``: :meth:`_saved_table`."""
        full, plain, transient_l = per_layer
        transient = float(transient_l[first:last].max(initial=0.0))
        if config.recompute is Recompute.FULL:
            per_mb = float(full[first:last].sum())
            blocks = [li for li in range(first, last) if self.kinds[li] is LayerKind.BLOCK]
            rebuilt = float(plain[blocks].max(initial=0.0)) if blocks else 0.0
            return per_mb, rebuilt, transient
        # every interior block beyond the first adds what one more interior block adds (blocks
        # keep disjoint tensors but for the one they pass on, which the next block's saved set
        # already holds)
        saved = self._saved(config, saved_table, lo, hi)
        for (r1, r2), extra in zip(self.interior, extras):
            if extra > 0:
                saved += extra * (self._saved(config, saved_table, r1, r2 + 1) - self._saved(config, saved_table, r1, r1 + 1))
        return saved, 0.0, transient
