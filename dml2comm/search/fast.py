"""The sweep's fast path: the analysis's numbers for many configurations without rebuilding them.

:func:`dml2comm.analysis.analyze_graph` builds every comm node, stage record and (for the site)
event of one configuration; a sweep needs only the summary numbers.  :class:`FastEvaluator`
computes the same numbers from parts that configurations share:

- the model with long runs of identical blocks collapsed to four (:mod:`dml2comm.ir.repeats`):
  everything below is computed on it and read per full layer through a layer map;
- per (micro-batch, t, SP, dtype): op costs and times on the tensor-parallel shard (the
  analysis's own cached :func:`dml2comm.cost.ops.shard_op_costs`) summed per layer, the layers'
  parameters, recomputation time and tensor-parallel collectives, activation bytes per layer;
- per (.., p): the pipeline partition (the analysis's min-max ``partition_layers``), the
  boundary tensors and a stage table (compute, TP and send times, parameters, buffers), with
  per-ZeRO-stage and per-recomputation parts filled on first use;
- per (collective, bytes, how the group sits on the cluster): the collective's time.

What depends on the graph, configuration values and at most the GPU is cached on the graph
under typed keys (:mod:`dml2comm.cost.cache`, shared with the analysis); the stage tables, which hold the
cluster's send and collective times and this evaluator's placement ids, are cached in the
evaluator (one cluster each), so one imported model evaluated on two clusters gets each
cluster's own numbers.

Configurations that share a schedule ``(schedule, p, m, v)`` are simulated together, and all
schedules of a call in one pass, by :mod:`dml2comm.sim.levels` (the engine's recurrence,
vectorised over configurations).

Context parallelism (Ulysses AllToAlls, ring-attention Send/Recv hidden behind 1/c of the
layer's attention core) and expert parallelism (MoE dispatch/combine AllToAlls, expert weights
sharded by e and reduced over the expert-data-parallel group) are covered as the analysis models
them: per-layer counts of their collectives like the TP counts, op times scaled by 1/c (and the
capacity factor on expert ops), TP/PP messages, input read and activations 1/c.

The stage-level data-parallel terms (gradient buckets, ZeRO collectives, the optimizer step,
the model states) come from :mod:`dml2comm.cost.stages`, the functions the analysis calls.
ZeRO-2/3's per-micro-batch collectives ride on each device's dp stream in the batched
recurrence (``pipeline_end_times_many(..., zero_terms=...)``, the engine's loop per step);
``--tp-comm-overlap`` exposes, per TP collective, what its adjacent GEMM does not hide (at least
1/t), as ``analysis._tp_overlapped_per_mb``.

What it returns equals ``analyze_graph``'s summary on iteration time, memory and the breakdown
(``tests/test_search.py`` and ``tests/test_cpep.py`` check it against full runs, ZeRO 0-3 and
``--tp-comm-overlap`` included).
"""

from __future__ import annotations

from collections import defaultdict
import dataclasses
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from dml2comm.analysis import PCIE4_X16_BYTES_PER_S, shared_parameters
from dml2comm.cost.cache import (CacheKey, activation_model_of, attention_sites_of, cached, collapsed_of, derived, layers_of, moe_of,
                                 needs_grad_of, parameter_readers_of, tensor_parallel_of)
from dml2comm.cost.ops import attention_core_flags, infer_seq_len, shard_op_costs
from dml2comm.cost.memory import FRAMEWORK_OVERHEAD_BYTES, ActivationModel, in_flight_micro_batches
from dml2comm.cost.stages import (DPGroup, Timed, dp_bucket_buffer_bytes, stage_dp_collectives, stage_dp_times, stage_model_states,
                                  stage_optimizer_s)
from dml2comm.errors import ConfigError
from dml2comm.hardware.cluster import Cluster, RankMap
from dml2comm.ir.onnx_import import ImportResult
from dml2comm.ir.repeats import Collapsed
from dml2comm.network.kinds import CollectiveKind, Phase
from dml2comm.network.model import collective_time_on_placement, group_placement, placement_period
from dml2comm.parallel.config import DTYPES, ParallelConfig, Recompute, Schedule
from dml2comm.parallel.context import check_context_parallel, context_parallel_comms
from dml2comm.parallel.expert import MoEInfo, check_expert_parallel, expert_parallel_comms
from dml2comm.parallel.pipeline import held_copies, parameter_shard_factors, partition_layers, sent_activations
from dml2comm.sim.levels import bucket_tail_end_many, compile_schedule, pipeline_end_times_many

__all__ = ["FastEvaluator", "NotRepeating", "supports"]


def supports(config: ParallelConfig) -> bool:
    """Whether the fast path covers ``config`` (else the full analysis evaluates it): every
    configuration since issue 17 (ZeRO 0-3, ``--tp-comm-overlap``, any context and expert
    parallelism and capacity factor); kept as the sweep's routing point."""
    return True


@dataclass
class _Layers:
    """Per-layer sums for one (micro-batch, t, SP, dtype, c, capacity factor), per full layer
    (op times are per GPU: 1/c of the unsplit ones, expert ops times the capacity factor)."""

    fwd: np.ndarray  # compute seconds per micro-batch
    bwd: np.ndarray
    selective: np.ndarray  # forward seconds of the attention core (selective recomputation)
    params: np.ndarray
    params_local: np.ndarray
    reads_input: np.ndarray  # bool: the layer has an op that reads a graph input
    tp: dict[tuple[CollectiveKind, Phase, float], np.ndarray]  # per-layer counts of each TP collective
    shared: list[tuple[tuple[int, ...], float, float]]  # parameters read by several full layers (analysis.shared_parameters)
    flops_fwd: float  # unsharded forward FLOPs of the model per micro-batch
    # context parallelism (c > 1): per-layer counts of each Ulysses AllToAll (kind, phase, bytes),
    # of ring-attention sites per (phase, bytes), and each layer's attention core (ring overlap)
    cp: dict[tuple[CollectiveKind, Phase, float], np.ndarray] = dataclasses.field(default_factory=dict)
    ring: dict[tuple[Phase, float], np.ndarray] = dataclasses.field(default_factory=dict)
    core_f: np.ndarray | None = None
    core_b: np.ndarray | None = None
    # --tp-comm-overlap: per-layer counts of each TP collective by (kind, phase, bytes, seconds
    # of the GEMM it overlaps: analysis._tp_overlapped_per_mb)
    tp_gemm: dict[tuple[CollectiveKind, Phase, float, float], np.ndarray] = dataclasses.field(default_factory=dict)


@dataclass
class _Prepared:
    """One configuration, ready for the batched simulation."""

    config: ParallelConfig
    fwd: np.ndarray  # per device, per micro-batch (whole stage)
    bwd: np.ndarray
    tp_f: np.ndarray
    tp_b: np.ndarray
    send_f: np.ndarray
    send_b: np.ndarray
    compute_f: np.ndarray  # pure op time (no TP collectives, no input read)
    compute_b: np.ndarray
    runs_tau: np.ndarray  # [p, R]: gradient-bucket runs per device, seconds per bucket
    runs_count: np.ndarray  # [p, R]: buckets in the run (0: no run)
    optimizer: np.ndarray
    after_step: np.ndarray
    tied: np.ndarray  # per device: its tied-weight gradient all-reduce (0: holds no shared copy)
    peak_memory: float
    flops_fwd_per_sample: float
    zero_mb: np.ndarray | None = None  # [p, 3] ZeRO-2/3 per micro-batch: forward all-gather, backward all-gather, reduce-scatter


#: Gradient-bucket runs per device: equal buckets and the remainder (``parallel.data.buckets``),
#: of the non-expert gradients (over the d x c ranks) then of the expert ones (expert-data-parallel).
_MAX_RUNS = 4


# ---- cache keys (dml2comm.cost.cache): one per cached quantity, holding what it depends on
# besides the graph it is cached on (a collapsed graph fixes its layer map)
@dataclass(frozen=True, slots=True)
class _LayersKey(CacheKey):
    """:class:`_Layers` (and, inside :class:`_PartitionKey`, what the per-layer times depend on):
    the shard, the GPU (name, peak in ``dtype``, HBM bandwidth), c and the capacity factor the
    op times are scaled by, the CP scheme (with c > 1) and ``--seq-len``."""

    tp_size: int
    sequence_parallel: bool
    dtype: str
    gpu_name: str
    peak_flops: float
    hbm_bytes_per_s: float
    cp_size: int
    capacity_factor: float
    cp_scheme: str | None
    seq_len: int | None


@dataclass(frozen=True, slots=True)
class _PartitionKey(CacheKey):
    """The pipeline partition of the layers of ``layers`` into ``pp_size`` stages."""

    layers: _LayersKey
    pp_size: int


@dataclass(frozen=True, slots=True)
class _StageTableKey(CacheKey):
    """:class:`_StageTable`, cached per evaluator, hence per cluster and GPU (the evaluator's
    network, GPU and placement ids are fixed; its graph too: :meth:`FastEvaluator._use` empties
    the store): the shard (t, SP, dtype), c and its scheme, ``--seq-len``, the split (p, d, e,
    rank order), the gradient dtype and bucket, the optimizer, the capacity factor (expert op
    times, EP messages) and the micro-batch size (one flat key: it is built per configuration)."""

    tp_size: int
    sequence_parallel: bool
    dtype: str
    cp_size: int
    cp_scheme: str | None
    seq_len: int | None
    pp_size: int
    dp_size: int
    ep_size: int
    rank_order: str
    grad_reduce_dtype: str | None
    bucket_bytes: int
    optimizer: str
    capacity_factor: float
    micro_batch_size: int
    tp_comm_overlap: bool


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


@dataclass(frozen=True, slots=True)
class _StageActivationsKey(CacheKey):
    """The table of stage activations already computed, by stage signature, per recomputation
    mode (and ``--seq-len``, as :class:`_SavedKey`)."""

    tp_size: int
    sequence_parallel: bool
    dtype: str
    assumed_dropout: bool
    recompute: str
    seq_len: int | None


@dataclass
class _StageTable:
    """Per stage, for one (t, SP, p, d, c, e): compute and TP times (with the exposed CP and EP
    collectives), sends, parameters, buffers."""

    config: ParallelConfig
    ranges: list[tuple[int, int]]
    compute_f: np.ndarray
    compute_b: np.ndarray
    selective: np.ndarray
    tp_f: np.ndarray
    tp_b: np.ndarray
    reads: np.ndarray
    params_local: np.ndarray
    buffers: np.ndarray
    send_f: np.ndarray
    send_b: np.ndarray
    tied: np.ndarray  # per stage: seconds of its tied-weight gradient all-reduces
    rank_map: RankMap
    by_zero: dict[int, tuple]
    by_recompute: dict[str, tuple]
    dp_where: list[tuple[int, int]] = dataclasses.field(default_factory=list)  # per stage: its d x c group's placement
    expert_local: np.ndarray | None = None  # per stage: expert parameters per GPU (after t and e; part of params_local)
    edp_where: list[tuple[int, int]] = dataclasses.field(default_factory=list)  # per stage: its expert-data-parallel group
    signatures: list[tuple[int, ...]] | None = None  # per stage: FastEvaluator._signatures
    by_mode: dict[str, tuple] = dataclasses.field(default_factory=dict)  # per recomputation mode: FastEvaluator._prepare
    flops_fwd: float = 0.0  # unsharded forward FLOPs of the model per micro-batch (_Layers.flops_fwd)


class NotRepeating(Exception):
    """The collapsed graph's interior representatives disagree: use the whole graph."""


class FastEvaluator:
    """Summary numbers of configurations of one imported model on one cluster (module docstring)."""

    def __init__(self, imported: ImportResult, cluster: Cluster, collapse: bool = True, collapsed: Collapsed | None = None) -> None:
        """``collapsed``: ``imported`` is already the collapsed model (another micro-batch size
        of a model whose collapse was found on a full import); else the collapse is found here."""
        self.imported = imported
        self.cluster = cluster
        self._costs: dict[tuple, float] = {}
        self._placements: dict[tuple[int, int, int], tuple[int, int]] = {}  # (base mod period, stride, n) -> (placement id, ranks)
        self._rank_placements: dict[tuple[int, ...], tuple[int, int]] = {}  # groups that are no progression, by their ranks
        self._period = placement_period(cluster)
        self._placement_list: list[tuple] = []
        self._placement_ids: dict[tuple, int] = {}
        self._in_flight: dict[tuple, np.ndarray] = {}
        self._stage_states: dict[tuple, tuple] = {}  # one stage's ZeRO part (FastEvaluator._zero_part)
        # values that depend on the cluster (stage tables: send, TP/CP/EP and tied-weight times,
        # placement ids of this evaluator): kept here, never on the graph, which other clusters share
        self._per_cluster: dict[object, object] = {}
        self.pre_collapsed = collapsed is not None
        if collapsed is None:
            full = imported.graph
            self.full_layered = layers_of(full)
            collapsed = collapsed_of(full) if collapse else None
        self._use(collapsed)

    def _use(self, collapsed: Collapsed | None) -> None:
        """Work on ``collapsed`` (or the whole graph when None)."""
        full = self.imported.graph
        self.collapsed = collapsed
        self._copies: dict[int, np.ndarray] = {}  # FastEvaluator._copies_before
        self._per_cluster.clear()  # stage tables of the graph worked on before
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
    def _core(self, seq_len: int | None) -> list[bool]:
        """Per op: on the attention scores (what selective recomputation rebuilds)."""
        return attention_core_flags(self.graph, seq_len)

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

    def _layer_key(self, config: ParallelConfig) -> _LayersKey:
        """What the per-layer times depend on (the layers' and the partition's cache key)."""
        cp, cf = self._scale(config)
        gpu = self.cluster.gpu
        return _LayersKey(config.tp_size, config.sequence_parallel, config.dtype, gpu.name, gpu.peak_flops(config.dtype),
                          gpu.hbm_bytes_per_s, cp, cf, config.cp_scheme if cp > 1 else None, config.seq_len)

    def _layers(self, config: ParallelConfig) -> _Layers:
        return derived(self.graph, self._layer_key(config), lambda: self._build_layers(config))

    def _check_interior(self, *arrays: np.ndarray) -> None:
        """Blocks i + 1 and i + 2 of a collapsed run must agree (the state entering a block has
        settled); else the collapse is not valid for this model."""
        for r1, r2 in self.interior:
            for a in arrays:
                if not np.isclose(a[r1], a[r2], rtol=1e-12, atol=0.0):
                    raise NotRepeating

    def _build_layers(self, config: ParallelConfig) -> _Layers:
        graph, layered = self.graph, self.layered
        gpu = self.cluster.gpu
        peak, hbm = gpu.peak_flops(config.dtype), gpu.hbm_bytes_per_s
        tp = self._tp(config)
        costs, times, full_flops, _ = shard_op_costs(graph, config.tp_size, config.sequence_parallel, config.dtype, gpu, False)
        n = len(layered.layers)
        seq_len = config.seq_len or infer_seq_len(graph)
        cp, cf = self._scale(config)
        if cp > 1 or cf != 1.0:  # the analysis's per-GPU op times: 1/c, expert ops on capacity-padded buffers
            moe = self._moe() if cf != 1.0 else None
            expert_ops = moe.expert_ops if moe is not None else frozenset()
            times = [(f * (cf if i in expert_ops else 1.0) / cp, b * (cf if i in expert_ops else 1.0) / cp)
                     for i, (f, b) in enumerate(times)]
        fwd = np.array([sum(times[i][0] for i in layer.op_indices) for layer in layered.layers])
        bwd = np.array([sum(times[i][1] for i in layer.op_indices) for layer in layered.layers])
        flops = np.array([sum(full_flops[i] for i in layer.op_indices) for layer in layered.layers])
        core = self._core(seq_len)
        selective = np.array([sum(times[i][0] for i in layer.op_indices if core[i]) for layer in layered.layers])
        by_layer = self._own_weights()
        factor = parameter_shard_factors(graph, tp.weight_factor)
        params = np.zeros(n)
        params_local = np.zeros(n)
        for li in range(n):
            params[li] = sum(graph.tensors[w].numel for w in by_layer[li])
            params_local[li] = sum(graph.tensors[w].numel / factor.get(w, 1) for w in by_layer[li])
        shared = []
        if self.collapsed is not None:
            copies = np.bincount(self.layer_map, minlength=n)
        for layers_read, numel, local in shared_parameters(graph, self._readers(), factor):
            if self.collapsed is not None and any(copies[li] != 1 for li in layers_read):
                raise NotRepeating  # shared across collapsed blocks (ALBERT-style): the whole graph counts them
            shared.append((tuple(self.full_index[li] for li in layers_read), numel, local))
        inputs = set(graph.inputs)
        reads = np.array([any(graph.ops[i].inputs and set(graph.ops[i].inputs) & inputs for i in layer.op_indices)
                          for layer in layered.layers], dtype=bool)
        tp_counts: dict[tuple, np.ndarray] = {}
        tp_gemm: dict[tuple, np.ndarray] = {}
        if config.tp_size > 1:
            for c in tp.comms:
                key = (c.kind, c.phase, float(c.message_bytes))
                li = layered.layer_of_op[c.op_index]
                tp_counts.setdefault(key, np.zeros(n))[li] += 1
                # the adjacent GEMM (its input-gradient half in backward): analysis._tp_overlapped_per_mb
                gemm = times[c.op_index][0] if c.phase is Phase.FORWARD else times[c.op_index][1] / 2
                tp_gemm.setdefault(key + (gemm,), np.zeros(n))[li] += 1
        cp_counts: dict[tuple, np.ndarray] = {}
        ring: dict[tuple, np.ndarray] = {}
        core_f, core_b = np.zeros(n), np.zeros(n)
        if cp > 1:
            sites = attention_sites_of(graph, layered, seq_len)
            check_context_parallel(sites, cp, config.tp_size, config.cp_scheme, seq_len)
            for site in sites:  # the analysis's attn_core: a layer's last site wins
                ops = [i for i in range(site.scores_op, site.context_op + 1) if layered.layer_of_op[i] == site.layer]
                core_f[site.layer] = sum(times[i][0] for i in ops)
                core_b[site.layer] = sum(times[i][1] for i in ops)
            for cc in context_parallel_comms(sites, cp, config.tp_size, config.cp_scheme, config.train_dtype.itemsize):
                if cc.kind is CollectiveKind.SEND_RECV:  # one entry per site and phase: cc.count = c - 1 steps
                    ring.setdefault((cc.phase, float(cc.message_bytes)), np.zeros(n))[cc.layer] += 1
                else:
                    cp_counts.setdefault((cc.kind, cc.phase, float(cc.message_bytes)), np.zeros(n))[cc.layer] += cc.count
        self._check_interior(fwd, bwd, selective, params, params_local, flops, *tp_counts.values(), *cp_counts.values(),
                             *ring.values(), core_f, core_b)
        m = self.layer_map
        return _Layers(fwd[m], bwd[m], selective[m], params[m], params_local[m], reads[m],
                       {k: v[m] for k, v in tp_counts.items()}, shared, float(flops[m].sum()),
                       {k: v[m] for k, v in cp_counts.items()}, {k: v[m] for k, v in ring.items()}, core_f[m], core_b[m],
                       {k: v[m] for k, v in tp_gemm.items()})

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
        """Per full layer with e > 1: counts of the MoE AllToAlls per (phase, bytes) per micro-batch."""
        if config.ep_size <= 1:
            return {}
        moe = self._moe()
        check_expert_parallel(moe, config.ep_size)
        assert moe is not None
        seq_len = config.seq_len or infer_seq_len(self.graph)
        tokens = config.micro_batch_size * (seq_len or 1) / config.cp_size
        dtype_bytes = config.train_dtype.itemsize
        key = _ExpertCommsKey(config.ep_size, tokens, dtype_bytes, config.capacity_factor)

        def build():
            n = len(self.layered.layers)
            counts: dict[tuple, np.ndarray] = {}
            for ec in expert_parallel_comms(moe, tokens, config.ep_size, dtype_bytes, config.capacity_factor):
                counts.setdefault((ec.phase, float(ec.message_bytes)), np.zeros(n))[ec.layer] += ec.count
            self._check_interior(*counts.values())
            return {k: v[self.layer_map] for k, v in counts.items()}

        return derived(self.graph, key, build)

    def _partition(self, config: ParallelConfig, layers: _Layers):
        key = _PartitionKey(self._layer_key(config), config.pp_size)
        return derived(self.graph, key, lambda: partition_layers(list(layers.fwd + layers.bwd), config.pp_size))

    def _boundary_bytes(self, config: ParallelConfig, ranges) -> list[list[float]]:
        """Per stage boundary, the bytes of each activation crossing it per micro-batch."""
        key = _BoundariesKey(config.tp_size, config.sequence_parallel, config.dtype, tuple(ranges))
        return derived(self.graph, key, lambda: self._build_boundaries(config, ranges))

    def _build_boundaries(self, config: ParallelConfig, ranges) -> list[list[float]]:
        """A tensor crosses the boundary after full layer k when it is produced at or before
        and read after it; on the collapsed graph, after ``layer_map[k]``."""
        per_boundary = derived(self.graph, _CrossingKey(config.tp_size, config.sequence_parallel, config.dtype),
                               lambda: self._crossing(config))
        return [per_boundary[int(self.layer_map[b - 1])] for _, b in ranges[:-1]]

    def _crossing(self, config: ParallelConfig) -> list[list[float]]:
        """Per boundary after each (collapsed) layer: the crossing tensors' bytes, by name."""
        names, prod, last, sizes = self._tensor_table(config)
        out = []
        for rb in range(len(self.layered.layers)):
            sel = np.nonzero((prod <= rb) & (last > rb))[0]
            out.append([size for _, size in sorted((names[i], sizes[i]) for i in sel)])
        return out

    def _tensor_table(self, config: ParallelConfig):
        """Activations that need a gradient: name, producing layer, last consuming layer, bytes."""
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
        sent = sent_activations(graph, needs_grad)
        names = [n for n in producer if n in sent]
        prod = np.array([producer[n] for n in names], dtype=np.int64)
        last = np.array([max(last_consumer.get(n, producer[n]), producer[n]) for n in names], dtype=np.int64)
        sizes = [float((local_out.get(n) or graph.tensors[n]).nbytes_in(train)) for n in names]
        return names, prod, last, sizes

    def _activation_model(self, config: ParallelConfig) -> ActivationModel:
        return activation_model_of(self.graph, config.tp_size, config.sequence_parallel, config.dtype, config.dropout > 0)

    def _per_layer(self, config: ParallelConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per full layer: saved bytes under full recomputation (the analysis's rule: blocks
        keep their input, other layers everything), saved bytes without recomputation, transient bytes."""
        key = _LayerActivationsKey(config.tp_size, config.sequence_parallel, config.dtype, config.dropout > 0)

        def build():
            act = self._activation_model(config)
            layers = self.layered.layers
            full = np.array([act.saved_bytes(l.op_indices, "full" if l.kind == "block" else "none") for l in layers])
            plain = np.array([act.saved_bytes(l.op_indices) for l in layers])
            transient = np.array([act.transient_bytes(l.op_indices) for l in layers])
            self._check_interior(full, plain, transient)
            m = self.layer_map
            return full[m], plain[m], transient[m]

        return derived(self.graph, key, build)

    def _saved_table(self, config: ParallelConfig) -> dict[tuple[int, int], float]:
        """The saved bytes of collapsed layer ranges already computed for ``config``'s shard and
        recomputation mode, by ``(first, last)`` (:meth:`_saved` fills it)."""
        key = _SavedKey(config.tp_size, config.sequence_parallel, config.dtype, config.dropout > 0, config.recompute, config.seq_len)
        return derived(self.graph, key, dict)

    def _saved(self, config: ParallelConfig, table: dict[tuple[int, int], float], first: int, last: int) -> float:
        """Saved bytes of the collapsed layers ``first..last - 1`` taken together (``table``:
        :meth:`_saved_table` of ``config``)."""
        value = table.get((first, last))
        if value is None:
            seq_len = config.seq_len or infer_seq_len(self.graph)
            core_flags = self._core(seq_len)
            op_idx = [i for li in range(first, last) for i in self.layered.layers[li].op_indices]
            core = frozenset(i for i in op_idx if core_flags[i]) if config.recompute is Recompute.SELECTIVE else frozenset()
            value = table[(first, last)] = self._activation_model(config).saved_bytes(op_idx, config.recompute, core)
        return value

    def _signatures(self, table: _StageTable) -> list[tuple[int, ...]]:
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
            blocks = [li for li in range(first, last) if self.kinds[li] == "block"]
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

    def _where(self, base: int, stride: int, n: int) -> tuple[int, int]:
        """(placement id, ranks) of the group ``base + i * stride`` (``i < n``; every group of a
        rank map is one): groups placed alike on the cluster cost the same, and a group shifted
        by a multiple of :func:`placement_period` is placed alike."""
        key = (base % self._period, stride, n)
        where = self._placements.get(key)
        if where is None:
            placement = group_placement(self.cluster, range(base, base + stride * n, stride) if n > 1 else (base,))
            where = self._placements[key] = (self._placement_id(placement), n)
        return where

    def _where_ranks(self, ranks: Sequence[int]) -> tuple[int, int]:
        """(placement id, ranks) of any group: a progression through :meth:`_where`, else keyed
        by its ranks shifted by a multiple of :func:`placement_period` (placed alike)."""
        ranks = tuple(ranks)
        n = len(ranks)
        step = ranks[1] - ranks[0] if n > 1 else 1
        if all(ranks[i + 1] - ranks[i] == step for i in range(n - 1)):
            return self._where(ranks[0], step, n)
        low = min(ranks)
        shift = low - low % self._period
        key = tuple(r - shift for r in ranks)
        where = self._rank_placements.get(key)
        if where is None:
            where = self._rank_placements[key] = (self._placement_id(group_placement(self.cluster, ranks)), n)
        return where

    def _placement_id(self, placement: tuple) -> int:
        """A small int per distinct placement (cheap to hash in the cost cache's keys)."""
        pid = self._placement_ids.setdefault(placement, len(self._placement_list))
        if pid == len(self._placement_list):
            self._placement_list.append(placement)
        return pid

    def _dp_wheres(self, rank_map: RankMap, stage: int) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int]]:
        """Placements of stage ``stage``'s (tensor rank 0) d x c group (``dp_cp_group``), its first
        expert-parallel group (``ep_group``) and its first expert-data-parallel group
        (``expert_dp_group``).  The d x c group is a progression unless the rank order puts
        another dimension between d and c: then it is placed by its ranks."""
        d, c, e = rank_map.dp, rank_map.cp, rank_map.ep
        sd, sp, _, sc = rank_map.strides
        base = stage * sp
        if c == 1:
            step = sd
        elif d == 1:
            step = sc
        elif sd == sc * c:
            step = sc
        elif sc == sd * d:
            step = sd
        else:
            ranks = rank_map.dp_cp_group(stage, 0)
            return self._where_ranks(ranks), self._where_ranks(ranks[:e]), self._where_ranks(ranks[::e])
        n = d * c
        return self._where(base, step, n), self._where(base, step, e), self._where(base, step * e, n // e)

    def _cost_at(self, kind: CollectiveKind, where: tuple[int, int], size: float) -> float:
        key = (kind, where, size)  # small ints: cheap to hash
        cost = self._costs.get(key)
        if cost is None:
            cost = self._costs[key] = collective_time_on_placement(self.cluster, kind, self._placement_list[where[0]], where[1], size)
        return cost

    # ---- one configuration
    def prepare(self, config: ParallelConfig) -> _Prepared:
        """Per-device costs of ``config`` (raises ConfigError as the analysis does)."""
        try:
            return self._prepare(config)
        except NotRepeating:
            if self.pre_collapsed:
                raise  # the caller imports the whole model
            self._use(None)  # the collapse does not hold for this model: the whole graph from now on
            return self._prepare(config)

    def _stage_table(self, config: ParallelConfig) -> _StageTable:
        """What every configuration with this model split (t, SP, p, c, e, hence d) shares."""
        cp = config.cp_size
        key = _StageTableKey(config.tp_size, config.sequence_parallel, config.dtype, cp, config.cp_scheme if cp > 1 else None,
                             config.seq_len, config.pp_size, config.dp_size, config.ep_size, config.rank_order,
                             config.grad_reduce_dtype, config.bucket_bytes, config.optimizer, config.capacity_factor,
                             config.micro_batch_size, config.tp_comm_overlap)
        return cached(self._per_cluster, key, lambda: self._build_stage_table(config))

    def _build_stage_table(self, config: ParallelConfig) -> _StageTable:
        layers = self._layers(config)
        ranges = self._partition(config, layers)
        p, d = config.pp_size, config.dp_size
        cp, ep = config.cp_size, config.ep_size
        expert_params = self._expert_params(config)  # raises the analysis's --ep errors
        ep_counts = self._ep_counts(config)
        rank_map = RankMap(d, config.tp_size, p, config.rank_order, cp=cp, ep=ep)
        _, sp, stt, sc = rank_map.strides
        gpu = self.cluster.gpu
        pcie = getattr(gpu, "pcie_bytes_per_s", 0.0) or PCIE4_X16_BYTES_PER_S
        input_bytes = sum(self.graph.tensors[n].nbytes for n in self.graph.inputs) / cp
        crossing = self._boundary_bytes(config, ranges)
        if cp > 1:  # each GPU sends 1/c of every boundary tensor
            crossing = [[x / cp for x in sizes] for sizes in crossing]
        boundary = np.array([sum(sizes) for sizes in crossing])
        # stage s's first rank is s * sp; its send partner is sp further (or back).  Groups placed
        # alike cost alike, and a stage's groups are placed as those of the first stage whose
        # first rank has the same residue mod placement_period: find each placement once
        period = self._period
        residue = [(st * sp) % period for st in range(p)]
        first: dict[int, int] = {}
        for st, r in enumerate(residue):
            first.setdefault(r, st)
        uniq = list(first)
        at = np.array([uniq.index(r) for r in residue])  # per stage: its residue's position in uniq

        def per_residue(values: list) -> list:
            return [values[i] for i in at.tolist()]

        cost_at, where, sr = self._cost_at, self._where, CollectiveKind.SEND_RECV
        base = {r: first[r] * sp for r in uniq}  # a stage of each residue (its actual first rank)
        ahead_of: dict[int, tuple[int, int]] = {}
        back_of: dict[int, tuple[int, int]] = {}
        sent: dict[tuple, float] = {}
        send, send_back = [], []
        for st, sizes in enumerate(crossing):  # boundary st: stages st and st + 1
            key = tuple(sizes)
            ahead = ahead_of.get(residue[st])
            if ahead is None:
                ahead = ahead_of[residue[st]] = where(st * sp, sp, 2)
            r_back = residue[st + 1]
            back = back_of.get(r_back)
            if back is None:
                back = back_of[r_back] = where((st + 1) * sp, -sp, 2)
            fwd = sent.get((ahead, key))
            if fwd is None:
                fwd = sent[(ahead, key)] = sum(cost_at(sr, ahead, x) for x in sizes)
            bwd = sent.get((back, key))
            if bwd is None:
                bwd = sent[(back, key)] = sum(cost_at(sr, back, x) for x in sizes)
            send.append(fwd)
            send_back.append(bwd)
        starts = np.array([a for a, _ in ranges])
        ends = np.array([b for _, b in ranges])

        def per_stage(x: np.ndarray) -> np.ndarray:
            cum = np.zeros(len(x) + 1)
            np.cumsum(x, out=cum[1:])
            return cum[ends] - cum[starts]

        stage_of_layer = np.repeat(np.arange(p), ends - starts)
        copies = held_copies(layers.shared, stage_of_layer.tolist(), p)
        tied_local = np.array(copies.extra_local)
        tied = np.zeros(p)
        if copies.groups:  # analysis: one all-reduce per group of stages, on each of its stages
            dtype_bytes = config.train_dtype.itemsize
            grad_bytes = DTYPES[config.grad_reduce_dtype].itemsize if config.grad_reduce_dtype else dtype_bytes
            for held_by, local_numel in copies.groups:
                cost = self._cost_at(CollectiveKind.ALL_REDUCE, self._where_ranks([rank_map.rank(0, s, 0) for s in held_by]),
                                     local_numel * grad_bytes)
                tied[list(held_by)] += cost
        tp_f, tp_b = np.zeros(p), np.zeros(p)

        def on_path(phase: Phase, counts: np.ndarray, kind: CollectiveKind, wheres: list[tuple[int, int]], size: float) -> None:
            """Add each stage's count of one collective times its cost on that stage's group
            (``wheres``: per residue in ``uniq``)."""
            cost = np.array([self._cost_at(kind, w, size) for w in wheres])[at]
            (tp_f if phase is Phase.FORWARD else tp_b)[:] += per_stage(counts) * cost

        tp_groups = [self._where(base[r], stt, config.tp_size) for r in uniq]
        if config.tp_comm_overlap:
            # analysis._tp_overlapped_per_mb: what the adjacent GEMM does not hide, at least 1/t
            t = config.tp_size
            for (kind, phase, size, gemm), counts in layers.tp_gemm.items():
                if phase in (Phase.FORWARD, Phase.BACKWARD):
                    cost = np.array([self._cost_at(kind, w, size / cp) for w in tp_groups])
                    exposed = np.maximum(cost - gemm, cost / t)[at]
                    (tp_f if phase is Phase.FORWARD else tp_b)[:] += per_stage(counts) * exposed
        else:
            for (kind, phase, size), counts in layers.tp.items():
                if phase in (Phase.FORWARD, Phase.BACKWARD):
                    on_path(phase, counts, kind, tp_groups, size / cp)
        # CP and EP collectives sit on the critical path like TP's (analysis._cp_ep_exposed_per_mb)
        cp_groups = [self._where(base[r], sc, cp) for r in uniq] if layers.cp else []
        for (kind, phase, size), counts in layers.cp.items():  # Ulysses AllToAlls over cp_group(0, s, 0)
            on_path(phase, counts, kind, cp_groups, size)
        for (phase, size), counts in layers.ring.items():
            # c - 1 ring steps per site, each on the slower hop of the ring, exposing what 1/c of
            # the layer's attention core does not hide
            core = (layers.core_f if phase is Phase.FORWARD else layers.core_b) / cp
            target = tp_f if phase is Phase.FORWARD else tp_b
            by_cost: dict[float, np.ndarray] = {}
            ring_cost = [max(self._cost_at(CollectiveKind.SEND_RECV, self._where(base[r], sc, 2), size),
                             self._cost_at(CollectiveKind.SEND_RECV, self._where(base[r] + (cp - 1) * sc, -(cp - 1) * sc, 2), size))
                         for r in uniq]
            for st in range(p):
                cost = ring_cost[at[st]]
                exposed = by_cost.get(cost)
                if exposed is None:
                    exposed = by_cost[cost] = per_stage(counts * (np.maximum(cost - core, 0.0) * (cp - 1)))
                target[st] += exposed[st]
        wheres_u = [self._dp_wheres(rank_map, first[r]) for r in uniq]
        wheres = per_residue(wheres_u)
        ep_groups = [w[1] for w in wheres_u]
        for (phase, size), counts in ep_counts.items():  # MoE AllToAlls over ep_group(s, 0, 0)
            on_path(phase, counts, CollectiveKind.ALL_TO_ALL, ep_groups, size)
        reads = np.logical_or.reduceat(layers.reads_input, starts) * (input_bytes / pcie)
        buffers = np.zeros(p)
        buffers[1:] += boundary
        buffers[:-1] += boundary
        buffers += dp_bucket_buffer_bytes(config.bucket_bytes, d * cp)  # the DP bucket being reduced
        none = (-1, 1)
        dp_where = [w[0] for w in wheres] if d * cp > 1 else [none] * p
        edp_where = [w[2] for w in wheres] if config.expert_dp_size > 1 else [none] * p
        if expert_params is None:
            params_local, expert_local = per_stage(layers.params_local) + tied_local, np.zeros(p)
        else:
            params_local, expert_local = per_stage(expert_params[0]) + tied_local, per_stage(expert_params[1])
        return _StageTable(config, ranges, per_stage(layers.fwd), per_stage(layers.bwd), per_stage(layers.selective),
                           tp_f, tp_b, reads, params_local, buffers,
                           np.array(send + [0.0]), np.array([0.0] + send_back), tied, rank_map, {}, {}, dp_where,
                           expert_local, edp_where, flops_fwd=layers.flops_fwd)

    def _zero_part(self, table: _StageTable, config: ParallelConfig):
        """Per stage for ZeRO stage z: gradient-bucket runs, the collective after the step,
        the optimizer step and the model states (weights + gradients + optimizer).

        Non-expert gradients reduce over the d x c ranks, expert gradients over the d x c / e
        expert-data-parallel ranks, one bucket stream after the other (``_device_work``)."""
        z = config.zero_stage
        if z not in table.by_zero:
            dtype_bytes = config.train_dtype.itemsize
            grad_bytes = DTYPES[config.grad_reduce_dtype].itemsize if config.grad_reduce_dtype else dtype_bytes
            common = (config.dp_size * config.cp_size, config.expert_dp_size, z, grad_bytes, dtype_bytes,
                      config.bucket_bytes, config.optimizer)
            expert = table.expert_local if table.expert_local is not None else np.zeros(config.pp_size)
            dense = table.params_local - expert
            # stages with equal parameters on alike groups share their part
            stages = list(zip(dense.tolist(), expert.tolist(), table.dp_where, table.edp_where))
            parts: dict[tuple, tuple] = {}
            for stage in stages:
                if stage not in parts:
                    key = stage + common
                    part = self._stage_states.get(key)
                    if part is None:
                        part = self._stage_states[key] = self._one_stage_states(*key)
                    parts[stage] = part
            rows = [parts[stage] for stage in stages]
            table.by_zero[z] = (np.array([r[0] for r in rows]), np.array([r[1] for r in rows]),
                                np.array([r[2] for r in rows]), np.array([r[3] for r in rows]), np.array([r[4] for r in rows]),
                                np.array([r[5] for r in rows]).reshape(len(rows), 3))
        return table.by_zero[z]

    def _one_stage_states(self, dense: float, expert: float, where: tuple[int, int], ewhere: tuple[int, int], d: int,
                          edp: int, z: int, grad_bytes: int, dtype_bytes: int, bucket_bytes: int, optimizer: str) -> tuple:
        """One stage's ZeRO part (:mod:`dml2comm.cost.stages`, as the analysis): (bucket seconds
        per run, buckets per run, seconds of the collective after the step, optimizer step
        seconds, model-state bytes, ZeRO per-micro-batch seconds: forward all-gather, backward
        all-gather, backward reduce-scatter)."""
        timed = [Timed(dc.kind, dc.phase, dc.per_micro_batch, dc.count,
                       self._cost_at(dc.kind, where if dc.group is DPGroup.DENSE else ewhere, dc.message_bytes))
                 for dc in stage_dp_collectives(dense, expert, grad_bytes, d, edp, z, bucket_bytes)]
        dp = stage_dp_times(timed, 1)  # per micro-batch terms: count x seconds
        if len(dp.bucket_runs) > _MAX_RUNS:  # pragma: no cover - buckets() gives at most two sizes per stream
            raise ConfigError("more gradient-bucket sizes than the fast path handles")
        tau, count = np.zeros(_MAX_RUNS), np.zeros(_MAX_RUNS)
        for r, (t, n) in enumerate(dp.bucket_runs):
            tau[r], count[r] = t, n
        states = stage_model_states(dense, expert, d, edp, z, optimizer, dtype_bytes).total_bytes
        opt = stage_optimizer_s(dense, expert, d, edp, z, optimizer, dtype_bytes, self.cluster.gpu.hbm_bytes_per_s)
        return tau, count, dp.after_step_s, opt, states, (dp.zero_fwd_s, dp.zero_bwd_pre_s, dp.zero_bwd_post_s)

    def _activation_part(self, table: _StageTable, config: ParallelConfig):
        """Per stage for one recomputation mode: saved bytes per micro-batch and the
        transient (+ rebuilt layer) bytes, 1/c of them with context parallelism."""
        mode = config.recompute
        if mode not in table.by_recompute:
            known = derived(self.graph, _StageActivationsKey(config.tp_size, config.sequence_parallel, config.dtype,
                                                             config.dropout > 0, mode, config.seq_len), dict)
            per_layer, saved_table = self._per_layer(config), self._saved_table(config)
            values = []
            for sig, (first, last) in zip(self._signatures(table), table.ranges):
                value = known.get(sig)
                if value is None:
                    value = known[sig] = self._stage_activations(config, per_layer, saved_table, first, last, sig[0], sig[1],
                                                                 sig[2:])
                values.append(value)
            saved, rebuilt, transient = np.array(values).T
            cp = config.cp_size
            table.by_recompute[mode] = (saved / cp, (transient + rebuilt) / cp)
        return table.by_recompute[mode]

    def _prepare(self, config: ParallelConfig) -> _Prepared:
        if not supports(config):
            raise ConfigError("the fast path does not cover this configuration")
        if self.cluster.num_gpus != config.num_gpus:
            raise ConfigError(f"the cluster has {self.cluster.num_gpus} GPUs but d*t*p = {config.num_gpus}; make them equal")
        if self.imported.model_batch is not None and self.imported.model_batch != config.micro_batch_size:
            raise ConfigError(f"the model fixes its batch dimension at {self.imported.model_batch}")
        table = self._stage_table(config)
        p, m = config.pp_size, config.num_micro_batches
        times = table.by_mode.get(config.recompute)
        if times is None:  # per recomputation mode: forward, backward compute, backward, backward TP
            if config.recompute is Recompute.FULL:
                recompute = table.compute_f
                tp_b = table.tp_b + table.tp_f
            elif config.recompute is Recompute.SELECTIVE:
                recompute, tp_b = table.selective, table.tp_b
            else:
                recompute, tp_b = 0.0, table.tp_b
            comp_b = table.compute_b + recompute
            times = table.by_mode[config.recompute] = (table.compute_f + table.tp_f + table.reads, comp_b, comp_b + tp_b, tp_b)
        fwd, comp_b, bwd, tp_b = times
        runs_tau, runs_count, after, opt, states, zero_mb = self._zero_part(table, config)
        per_mb, extra = self._activation_part(table, config)
        v = config.chunks
        key = (config.schedule, p, m, v)
        in_flight = self._in_flight.get(key)
        if in_flight is None:
            in_flight = self._in_flight[key] = np.array([in_flight_micro_batches(config.schedule, p, m, st, config.virtual_stages)
                                                         for st in range(p)])
        total = states + per_mb * in_flight + table.buffers + extra + FRAMEWORK_OVERHEAD_BYTES
        return _Prepared(config, fwd, bwd, table.tp_f, tp_b, table.send_f, table.send_b, table.compute_f, comp_b,
                         runs_tau, runs_count, opt, after, table.tied, float(total.max()), table.flops_fwd / config.micro_batch_size,
                         zero_mb if config.zero_stage >= 2 else None)

    # ---- many configurations
    def evaluate(self, configs: Sequence[ParallelConfig]) -> list[dict[str, Any]]:
        """Summary numbers per configuration (the analysis's keys); raises nothing: a failed
        configuration's dict has ``error``."""
        out: list[dict[str, Any] | None] = [None] * len(configs)
        groups: dict[tuple, list[tuple[int, _Prepared]]] = defaultdict(list)
        for i, config in enumerate(configs):
            try:
                prep = self.prepare(config)
            except ConfigError as exc:
                out[i] = {"error": " ".join(str(exc).split())}
                continue
            v = config.chunks
            groups[(config.schedule, config.pp_size, config.num_micro_batches, v, prep.zero_mb is not None)].append((i, prep))
        staged = [(members, _GroupSim(schedule, p, m, v, [pr for _, pr in members]))
                  for (schedule, p, m, v, _), members in groups.items()]
        plain = [(members, sim) for members, sim in staged if sim.zero is None]
        # every schedule without ZeRO-2/3 in one pass; only each device's last step is read
        ends = pipeline_end_times_many([sim.item for _, sim in plain], [sim.cs.last_step for _, sim in plain])
        by_p: dict[int, list[tuple[list, _GroupSim, np.ndarray]]] = defaultdict(list)
        for (members, sim), end in zip(plain, ends):
            by_p[sim.cs.p].append((members, sim, end))
        zero = [(members, sim) for members, sim in staged if sim.zero is not None]
        if zero:  # ZeRO-2/3: the recurrence with the dp stream per step, in one pass too
            ends, dps = pipeline_end_times_many([sim.item for _, sim in zero], [sim.cs.last_step for _, sim in zero],
                                                zero_terms=[sim.zero for _, sim in zero])
            for (members, sim), end, dp in zip(zero, ends, dps):
                sim.dp_end = dp
                by_p[sim.cs.p].append((members, sim, end))
        for batch in by_p.values():  # groups with as many devices: their summaries in one go
            summaries = _finish([(sim, end) for _, sim, end in batch], self.cluster)
            for (i, _), summary in zip((m for members, _, _ in batch for m in members), summaries):
                out[i] = summary
        return out  # type: ignore[return-value]


class _GroupSim:
    """Configurations sharing a schedule: the inputs of the batched pipeline simulation
    (:func:`_finish` turns its end times into iteration time and breakdown)."""

    def __init__(self, schedule: str, p: int, m: int, v: int, preps: list[_Prepared]) -> None:
        self.cs = cs = compile_schedule(schedule, p, m, v)
        self.preps, self.m, self.v = preps, m, v
        f = np.array([pr.fwd for pr in preps])
        b = np.array([pr.bwd for pr in preps])
        tf = np.array([pr.tp_f for pr in preps])
        tb = np.array([pr.tp_b for pr in preps])
        sf = np.array([pr.send_f for pr in preps])
        sb = np.array([pr.send_b for pr in preps])
        # ZeRO-2/3 (a group has them all or none): per micro-batch forward all-gather, backward
        # all-gather, backward reduce-scatter per device, [K, p] each
        zero = [np.array([pr.zero_mb[:, j] for pr in preps]) for j in range(3)] if preps[0].zero_mb is not None else []
        if v > 1:  # each chunk is 1/v of the device's work; the wrap-around uses the largest send
            wrap = sf[:, :-1].max(axis=1, initial=0.0)
            wrap_b = sb[:, 1:].max(axis=1, initial=0.0)
            sf = np.where(sf > 0, sf, wrap[:, None])
            sb = np.where(sb > 0, sb, wrap_b[:, None])
            f, b, tf, tb = f / v, b / v, tf / v, tb / v
            zero = [z / v for z in zero]
        self.b = b
        self.free_f, self.free_b = f - tf, b - tb
        zeros = np.zeros_like(f)
        # the pipeline with communication and without (for the exposed communication); rows that
        # are equal (ZeRO-0 and ZeRO-1 differ only after the last backward) are simulated once
        parts = [f, b, sf, sb, *zero]
        rows = np.hstack([np.vstack([x, free]) for x, free in zip(parts, [self.free_f, self.free_b] + [zeros] * (len(parts) - 2))])
        first: dict[bytes, int] = {}
        kept: list[int] = []
        self.inverse = np.empty(len(rows), dtype=np.int64)
        for r, row in enumerate(rows):
            j = first.setdefault(row.tobytes(), len(kept))
            if j == len(kept):
                kept.append(r)
            self.inverse[r] = j
        unique = rows[kept]
        split = np.split(unique, len(parts), axis=1)
        self.item = (cs, *split[:4])
        self.zero = split[4:] or None  # the ZeRO-2/3 terms of the unique rows (pipeline_end_times_zero)
        self.dp_end: np.ndarray | None = None  # per unique row and device: the dp stream's end (ZeRO-2/3)


def _finish(sims: list[tuple[_GroupSim, np.ndarray]], cluster: Cluster) -> list[dict[str, Any]]:
    """Iteration time and breakdown (analysis._simulate and _summarize, vectorised) of groups
    with the same number of devices, from their simulations' end times (``[2K, p]`` each: the
    pipeline with communication, then without), in the groups' order."""
    preps = [pr for sim, _ in sims for pr in sim.preps]
    k = len(preps)
    ends = [end[sim.inverse] for sim, end in sims]  # [2K, p] compute end per device (the last steps' end times)
    ce_full = np.concatenate([e[:len(sim.preps)] for (sim, _), e in zip(sims, ends)])
    ce_free = np.concatenate([e[len(sim.preps):] for (sim, _), e in zip(sims, ends)])
    b = np.concatenate([sim.b for sim, _ in sims])
    free = np.concatenate([sim.free_f + sim.free_b for sim, _ in sims])
    m = np.concatenate([np.full(len(sim.preps), sim.m) for sim, _ in sims])
    mv = np.concatenate([np.full(len(sim.preps), sim.m * sim.v) for sim, _ in sims])
    overlap = np.array([pr.config.overlap_grad_reduce for pr in preps])[:, None]
    runs_tau = np.array([pr.runs_tau for pr in preps])
    runs_count = np.array([pr.runs_count for pr in preps])
    used = np.flatnonzero(runs_count.any(axis=(0, 1)))  # runs no configuration has are dropped (a run of no buckets adds nothing)
    r = int(used[-1]) + 1 if used.size else 0
    tail = bucket_tail_end_many(ce_full - b, b, ce_full, runs_tau[..., :r], runs_count[..., :r], overlap)
    if any(sim.dp_end is not None for sim, _ in sims):  # ZeRO-2/3 have no buckets: their stream ends with the last step's
        tail = np.maximum(tail, np.concatenate([sim.dp_end[sim.inverse[:len(sim.preps)]] if sim.dp_end is not None
                                                else np.zeros((len(sim.preps), sim.cs.p)) for sim, _ in sims]))
    opt = np.array([pr.optimizer for pr in preps])
    after = np.array([pr.after_step for pr in preps])
    reduced = np.maximum(tail, ce_full)
    tied = np.array([pr.tied for pr in preps])
    holders = tied > 0
    if holders.any():  # engine.simulate: the tied-weight all-reduce starts when all its devices are ready
        start = np.where(holders, reduced, -np.inf).max(axis=1, keepdims=True)
        reduced = np.where(holders, start + tied, reduced)
    iterations = (reduced + opt + after).max(axis=1)
    free_iterations = (ce_free + opt).max(axis=1)
    busy_all = mv[:, None] * free
    rows = np.arange(k)
    crit = np.argmax(busy_all, axis=1)  # per configuration, the first device with the most work
    busy = busy_all[rows, crit]
    compute = busy  # the busiest device's collective-free compute stream, as the analysis's compute_time_s
    bubble = np.maximum(ce_free.max(axis=1) - busy, 0.0)
    # the bubble's share of the iteration, and Narayanan's bubble / busy time (the analysis's
    # bubble_fraction and bubble_ratio)
    fraction = np.divide(bubble, iterations, out=np.zeros(k), where=iterations != 0)
    ratio = np.divide(bubble, busy, out=np.zeros(k), where=busy != 0)
    exposed = np.maximum(iterations - free_iterations, 0.0)
    # the optimizer step from the last backward to the end of the collective-free iteration
    # (the analysis's optimizer_time_s): the four parts add up to the iteration
    opt_part = np.maximum(free_iterations - ce_free.max(axis=1), 0.0)
    hbm = float(cluster.gpu.hbm_bytes)
    peaks: dict[str, float] = {}
    out = []
    for pr, iteration, compute_i, exposed_i, bubble_i, fraction_i, ratio_i, opt_i in zip(
            preps, iterations.tolist(), compute.tolist(), exposed.tolist(), bubble.tolist(), fraction.tolist(),
            ratio.tolist(), opt_part.tolist()):
        config = pr.config
        gpus = config.num_gpus
        peak = peaks.get(config.dtype)
        if peak is None:
            peak = peaks[config.dtype] = cluster.gpu.peak_flops(config.dtype)
        model_flops = 3 * pr.flops_fwd_per_sample * config.global_batch_size
        out.append({
            "error": None,
            "iteration_time_s": iteration,
            "compute_time_s": compute_i,
            "exposed_comm_time_s": exposed_i,
            "bubble_time_s": bubble_i,
            "bubble_fraction": fraction_i,
            "bubble_ratio": ratio_i,
            "optimizer_time_s": opt_i,
            "mfu": model_flops / (iteration * gpus * peak) if iteration > 0 else None,
            "tflops_per_gpu": model_flops / (iteration * gpus) / 1e12 if iteration > 0 else None,
            "peak_memory_bytes": pr.peak_memory,
            "fits": pr.peak_memory <= hbm,
        })
    return out
