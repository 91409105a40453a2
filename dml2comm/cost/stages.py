"""Stage-level terms of data parallelism and ZeRO, computed once for the analysis and the sweep.

A pipeline stage's data-parallel part depends only on its parameters per GPU (dense and, with
expert parallelism, expert), the sizes of its data-parallel groups, the ZeRO stage, the bucket
size and the optimizer.  :func:`dml2comm.analysis.analyze_graph` calls these functions for one
configuration (its comm nodes are their specs with ranks: :meth:`StageCoster.comm_specs`);
:class:`dml2comm.model.FastEvaluator` calls the same functions once per distinct stage of
a sweep and caches the result per (parameters, group placement, ZeRO stage, ...):

- :func:`stage_dp_collectives`: the gradient and parameter collectives of one stage
  (:func:`dml2comm.parallel.data.data_parallel_comms`: 25 MiB DDP buckets, ZeRO-1/2
  reduce-scatter + updated-parameter all-gather, ZeRO-2's per-micro-batch reduce-scatter,
  ZeRO-3's parameter all-gathers in every forward and backward), non-expert gradients over the
  d x c ranks then expert gradients over the d x c / e expert-data-parallel ranks;
- :func:`stage_dp_times`: what the simulator needs of them (:class:`dml2comm.sim.engine.DeviceWork`'s
  ``dp_buckets_s``, ``after_step_s``, ``zero_*_s``);
- :func:`stage_optimizer_params` / :func:`stage_optimizer_s`: the memory-bound optimizer step on
  the parameters this GPU updates (1/(d c) of the dense, 1/(d c / e) of the expert ones from ZeRO-1 on);
- :func:`stage_model_states`: weights, gradients and optimizer states per GPU by ZeRO stage
  (:func:`dml2comm.cost.memory.model_state_bytes`, Rajbhandari et al., SC'20, Fig. 1), expert
  states sharded over the expert-data-parallel ranks;
- :func:`dp_bucket_buffer_bytes`: the communication buffer of the bucket being reduced.

:class:`StageCoster` builds, per configuration split, the one :class:`StageTable` every
stage-level term is read from -- compute, tensor/context/expert-parallel time on the critical
path (``--tp-comm-overlap`` and ring attention's overlap included), pipeline sends, input
reads, tied-weight all-reduces, parameters, buffers -- and per ZeRO stage and recomputation mode
its data-parallel, optimizer and memory parts (:meth:`StageCoster.plan`: a :class:`StagePlan`).
The analysis reads its stages from it; the sweep simulates many plans at once.  Collective
times come from :func:`dml2comm.network.model.collective_time_on_placement`, cached per
(collective, how the group sits on the cluster, bytes).

Every collective of a configuration is enumerated in one place, :meth:`StageCoster.comm_specs`
(a :class:`CommSpec` each: kind, parallel dimension, phase, stage, layer, the op it follows,
tensor, group, bytes, count per iteration, per micro-batch or not, reason, host time and its
seconds from the same cache, :meth:`StageCoster.price`), read off the very tables the stage
times are summed from: the layers' tensor-, context- and expert-parallel collectives
(:class:`dml2comm.cost.layers.LayerComm` records, which the per-layer count tables aggregate),
the tensors crossing each boundary, the held copies and the priced data-parallel specs
(:meth:`StageCoster.dp_specs`).  The analysis's comm nodes are those specs, described; the
sweep, on collapsed graphs, reads only the sums and never builds the per-op list.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import Iterable, NamedTuple, Protocol, Sequence

import numpy as np

from dml2comm.cost.cache import CacheKey, cached, derived
from dml2comm.cost.calibrated import class_value
from dml2comm.cost.compute import eager_accumulate_grad_s, grad_accumulation_s, shared_gradient_sum_s, hbm_efficiency_of, optimizer_step_s
from dml2comm.cost.host import AUTO, host_model, pipeline_message_s
from dml2comm.cost.layers import LayerCoster, NotRepeating, StageActivationsKey
from dml2comm.cost.memory import (ModelStates, amp_weight_copy_bytes, autocasts_activations, gradients_live_in_backward,
                                  in_flight_micro_batches, model_state_bytes, step_peak_held, step_peak_with)
from dml2comm.errors import ConfigError
from dml2comm.fmt import fmt_s
from dml2comm.hardware.cluster import Cluster, RankMap
from dml2comm.ir.layers import LayerKind
from dml2comm.ir.onnx_import import ImportResult
from dml2comm.ir.repeats import Collapsed
from dml2comm.network.kinds import CollectiveKind, ParallelDim, Phase
from dml2comm.network.model import collective_time_on_placement, group_placement, placement_period
from dml2comm.parallel.config import DTypeName, ParallelConfig, Precision, Recompute, Stack
from dml2comm.parallel.data import data_parallel_comms
from dml2comm.parallel.pipeline import HeldCopies, held_copies

__all__ = ["CommSpec", "PCIE4_X16_BYTES_PER_S", "pipeline_messages", "pipeline_send_s", "scatter_gather", "Pricing", "StageCoster", "StagePlan", "StageTable", "DPGroup", "StageDPCollective", "StageDPTimes", "Timed", "TimedDPCollective", "dp_bucket_buffer_bytes", "stage_dp_collectives",
           "stage_dp_times", "stage_model_states", "stage_optimizer_params", "stage_optimizer_s"]


#: Host-to-device bandwidth for the input Read when a GPU preset gives none: PCIe 4.0 x16,
#: 32 GB/s per direction (PCI-SIG PCIe 4.0 specification, 16 GT/s x 16 lanes).
PCIE4_X16_BYTES_PER_S = 32e9


class DPGroup(enum.Enum):
    """The data-parallel group a stage's collective runs over."""

    DENSE = "dense"  # the d x c ranks of the stage (RankMap.dp_cp_group)
    EXPERT = "expert"  # the d x c / e expert-data-parallel ranks (RankMap.expert_dp_group)


@dataclass(frozen=True, slots=True)
class StageDPCollective:
    """One data-parallel collective of a stage: ``count`` messages per iteration, or per
    micro-batch when ``per_micro_batch``."""

    group: DPGroup
    kind: CollectiveKind
    phase: Phase
    message_bytes: float
    count: int
    per_micro_batch: bool
    tensor: str  # what travels: gradients, parameters, expert gradients, expert parameters
    reason: str


def stage_dp_collectives(dense_params: float, expert_params: float, grad_bytes: int, dp_cp_size: int, expert_dp_size: int,
                         zero_stage: int, bucket_bytes: int) -> tuple[StageDPCollective, ...]:
    """The stage's data-parallel collectives, dense then expert (``dense_params``,
    ``expert_params``: per GPU, after t and e; ``grad_bytes``: the gradient dtype's size)."""
    out: list[StageDPCollective] = []
    for dc in data_parallel_comms(dense_params * grad_bytes, dp_cp_size, zero_stage, bucket_bytes):
        out.append(StageDPCollective(DPGroup.DENSE, dc.kind, dc.phase, dc.message_bytes, dc.count, dc.per_micro_batch,
                                     "gradients" if dc.kind is not CollectiveKind.ALL_GATHER else "parameters", dc.reason))
    for dc in data_parallel_comms(expert_params * grad_bytes, expert_dp_size, zero_stage, bucket_bytes):
        out.append(StageDPCollective(DPGroup.EXPERT, dc.kind, dc.phase, dc.message_bytes, dc.count, dc.per_micro_batch,
                                     "expert gradients" if dc.kind is not CollectiveKind.ALL_GATHER else "expert parameters",
                                     f"{dc.reason} of the experts (expert-data-parallel group)"))
    return tuple(out)


class TimedDPCollective(Protocol):
    """A costed data-parallel collective (the analysis's ``CommNode`` is one)."""

    @property
    def kind(self) -> CollectiveKind: ...

    @property
    def phase(self) -> Phase: ...

    @property
    def per_micro_batch(self) -> bool: ...

    @property
    def count_per_iteration(self) -> int: ...

    @property
    def time_s(self) -> float: ...


@dataclass(frozen=True, slots=True)
class Timed:
    """A :class:`StageDPCollective` with its time (``count_per_iteration``: ``count`` times the
    micro-batches when per micro-batch)."""

    kind: CollectiveKind
    phase: Phase
    per_micro_batch: bool
    count_per_iteration: int
    time_s: float


@dataclass(frozen=True, slots=True)
class StageDPTimes:
    """One stage's data-parallel work as the simulator takes it (``sim.engine``'s dp stream)."""

    bucket_runs: tuple[tuple[float, int], ...]  # once-per-iteration gradient buckets in order: (seconds, count) runs
    after_step_s: float  # collectives after the optimizer step (ZeRO-1/2 updated-parameter all-gather)
    zero_fwd_s: float  # per micro-batch: ZeRO-3 parameter all-gather before each forward
    zero_bwd_pre_s: float  # per micro-batch: ZeRO-3 parameter all-gather before each backward
    zero_bwd_post_s: float  # per micro-batch: ZeRO-2/3 gradient reduce-scatter after each backward

    @property
    def buckets_s(self) -> tuple[float, ...]:
        """Every bucket's seconds, in order (``DeviceWork.dp_buckets_s``)."""
        return tuple(t for t, n in self.bucket_runs for _ in range(n))


def stage_dp_times(collectives: Iterable[TimedDPCollective], m: int) -> StageDPTimes:
    """The simulator's view of a stage's costed data-parallel collectives over ``m``
    micro-batches: per-iteration backward ones are gradient buckets (in order), optimizer-phase
    ones follow the step, per-micro-batch ones are the ZeRO-2/3 terms (seconds per micro-batch)."""
    runs: list[tuple[float, int]] = []
    after = zf = zb_pre = zb_post = 0.0
    for c in collectives:
        if c.per_micro_batch:
            per_mb = c.time_s * c.count_per_iteration / m
            if c.phase is Phase.FORWARD:
                zf += per_mb
            elif c.phase is Phase.BACKWARD and c.kind is CollectiveKind.ALL_GATHER:
                zb_pre += per_mb
            elif c.phase is Phase.BACKWARD and c.kind is CollectiveKind.REDUCE_SCATTER:
                zb_post += per_mb
        elif c.phase is Phase.BACKWARD:
            runs.append((c.time_s, c.count_per_iteration))
        elif c.phase is Phase.OPTIMIZER:
            after += c.time_s * c.count_per_iteration
    return StageDPTimes(tuple(runs), after, zf, zb_pre, zb_post)


def stage_optimizer_params(dense_params: float, expert_params: float, dp_cp_size: int, expert_dp_size: int,
                           zero_stage: int) -> float:
    """Parameters one GPU updates: from ZeRO-1 on, its 1/(d c) shard of the dense ones and its
    1/(d c / e) shard of the expert ones (Rajbhandari et al., SC'20, Sec. 5.1)."""
    return (dense_params / (dp_cp_size if zero_stage >= 1 else 1)
            + expert_params / (expert_dp_size if zero_stage >= 1 else 1))


def stage_optimizer_s(dense_params: float, expert_params: float, dp_cp_size: int, expert_dp_size: int, zero_stage: int,
                      optimizer: str, dtype_bytes: int, hbm_bytes_per_s: float, loss_scaled: bool = False,
                      precision: Precision | str = Precision.MIXED) -> float:
    """The memory-bound optimizer step of one GPU of the stage (:func:`dml2comm.cost.compute.optimizer_step_s`;
    ``loss_scaled``: fp16 training, whose gradients are unscaled first; ``precision``: how the
    parameters and states are held)."""
    return optimizer_step_s(stage_optimizer_params(dense_params, expert_params, dp_cp_size, expert_dp_size, zero_stage),
                            optimizer, dtype_bytes, hbm_bytes_per_s, loss_scaled, precision)


def stage_model_states(dense_params: float, expert_params: float, dp_cp_size: int, expert_dp_size: int, zero_stage: int,
                       optimizer: str, dtype_bytes: int, precision: Precision | str = Precision.MIXED) -> ModelStates:
    """Weights, gradients and optimizer states on one GPU of the stage under ``precision``
    (:func:`dml2comm.cost.memory.model_state_bytes`): the dense ones ZeRO-sharded over the d x c
    ranks, the expert ones over the expert-data-parallel ranks."""
    states = model_state_bytes(dense_params, dp_cp_size, zero_stage, optimizer, dtype_bytes, precision)
    if expert_params:
        ex = model_state_bytes(expert_params, expert_dp_size, zero_stage, optimizer, dtype_bytes, precision)
        states = ModelStates(states.weights_bytes + ex.weights_bytes, states.grads_bytes + ex.grads_bytes,
                             states.optimizer_bytes + ex.optimizer_bytes)
    return states


def dp_bucket_buffer_bytes(bucket_bytes: int, dp_cp_size: int) -> float:
    """The communication buffer of the gradient bucket being reduced (none without data parallelism)."""
    return float(bucket_bytes) if dp_cp_size > 1 else 0.0


def scatter_gather(replicated: bool, tp_size: int, sequence_parallel: bool = False) -> bool:
    """Whether a pipeline message goes with Megatron-LM's scatter/gather optimisation: a tensor
    every tensor rank holds whole (no sequence parallelism) is sent 1/t per rank over the
    network and all-gathered over the receiving tensor group (Narayanan et al. 2021, Sec. 4.1:
    "reduces the amount of communication between pipeline stages by a factor of t"; Megatron-LM
    ``scatter_gather_tensors_in_pipeline``, on by default)."""
    return replicated and tp_size > 1 and not sequence_parallel


def pipeline_messages(size: float, replicated: bool, tp_size: int) -> tuple[tuple[CollectiveKind, bool, float], ...]:
    """The collectives of one pipeline message of ``size`` bytes per GPU, each as (kind, over the
    receivers' tensor group rather than the sending pair, bytes): with scatter/gather
    (:func:`scatter_gather`), 1/t of it point-to-point then an all-gather of the whole tensor
    over the receivers' tensor group; else the whole of it point-to-point."""
    if scatter_gather(replicated, tp_size):
        return (CollectiveKind.SEND_RECV, False, size / tp_size), (CollectiveKind.ALL_GATHER, True, size)
    return ((CollectiveKind.SEND_RECV, False, size),)


def pipeline_send_s(cost_at, pair, receivers, size: float, replicated: bool, tp_size: int) -> float:
    """Seconds of one pipeline message of ``size`` bytes per GPU between the placed ``pair``
    (:func:`pipeline_messages`, the all-gather over the placed ``receivers`` group;
    ``cost_at(kind, placement, bytes)``)."""
    return sum(cost_at(kind, receivers if gathered else pair, b) for kind, gathered, b in pipeline_messages(size, replicated, tp_size))


#: Gradient-bucket runs per device: equal buckets and the remainder (``parallel.data.buckets``),
#: of the non-expert gradients (over the d x c ranks) then of the expert ones (expert-data-parallel).
_MAX_RUNS = 4


@dataclass
class StagePlan:
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
    # memory per device (the analysis's per-stage memory reports read them)
    states: np.ndarray | None = None  # [p, 3]: weights, gradients, optimizer states (bytes)
    activations_per_mb: np.ndarray | None = None  # saved activations per micro-batch (the loss's and AMP's weight copies included)
    in_flight: np.ndarray | None = None  # micro-batches whose activations are held at the peak
    buffers: np.ndarray | None = None  # pipeline send/receive buffers and the DP bucket being reduced
    transient: np.ndarray | None = None  # the largest op's transient bytes (+ the rebuilt layer under full recomputation)
    total_memory: np.ndarray | None = None  # peak bytes per device (cost.memory.step_peak_bytes + the framework constant)
    grads_in_backward: bool = True  # the gradients exist at the forward/backward peak (cost.memory.gradients_live_in_backward)


@dataclass(frozen=True, slots=True)
class CommSpec:
    """One collective of a configuration as the stage table prices it
    (:meth:`StageCoster.comm_specs`; the analysis's ``CommNode`` adds only its description):
    ``count`` calls per iteration (the micro-batches' included when ``per_micro_batch``),
    ``seconds`` of one call (:meth:`StageCoster.price` on ``group``; the data-parallel ones as
    the plan priced them), ``host_s`` the framework's host time added to it (a pipeline
    message's, :func:`dml2comm.cost.host.pipeline_message_s`)."""

    kind: CollectiveKind
    dim: ParallelDim
    phase: Phase
    stage: int
    layer: int | None
    after_op: int | None
    tensor: str
    group: tuple[int, ...]
    message_bytes: float
    count: int
    per_micro_batch: bool
    reason: str
    seconds: float
    host_s: float = 0.0


@dataclass(frozen=True, slots=True)
class _StageTableKey(CacheKey):
    """:class:`StageTable`, cached per evaluator, hence per cluster and GPU (the evaluator's
    network, GPU and placement ids are fixed; its graph too: :meth:`StageCoster._use` empties
    the store): the shard (t, SP, dtype), c and its scheme, ``--seq-len``, the split (p, d, e,
    rank order), the gradient dtype and bucket, the optimizer, the capacity factor (expert op
    times, EP messages), the micro-batch size, the stack (the loss) and the precision mode (one
    flat key: it is built per configuration)."""

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
    async_tp_allreduce: bool
    grad_accumulation_fusion: bool
    #: the training stack, precision and attention kernel (what runs; :class:`ParallelConfig`)
    stack: str = "megatron"
    precision: str = "mixed"
    attention: str = "unfused"
    #: micro-batches per step where the stack's per-micro-batch passes depend on them (eager
    #: PyTorch's AccumulateGrad from the second micro-batch on), else None
    eager_micro_batches: int | None = None
    #: the inputs are on the GPU before each micro-batch (no PCIe read: ParallelConfig.inputs_on_gpu)
    inputs_on_gpu: bool = False


@dataclass
class StageTable:
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
    signatures: list[tuple[int, ...]] | None = None  # per stage: LayerCoster._signatures
    by_mode: dict[str, tuple] = dataclasses.field(default_factory=dict)  # per recomputation mode: StageCoster._prepare
    held: dict[tuple[int, bool], tuple] = dataclasses.field(default_factory=dict)  # per (ZeRO, gradients held): memory.step_peak_held
    flops_fwd: float = 0.0  # unsharded forward FLOPs of the model per micro-batch (LayerTable.flops_fwd)
    params: np.ndarray | None = None  # per stage: parameters (before t and e; tied copies included)
    flops: np.ndarray | None = None  # per stage: unsharded forward FLOPs per micro-batch
    copies: HeldCopies | None = None  # tied parameters held by several stages and their gradient all-reduce groups
    recompute_full: np.ndarray | None = None  # per stage: forward seconds full recomputation repeats (transformer layers)
    tp_f_blocks: np.ndarray | None = None  # per stage: the forward collectives on the critical path of those layers
    accumulate: np.ndarray | None = None  # per stage: seconds per micro-batch of the gradient-accumulation pass
    loss_f: np.ndarray | None = None  # per stage: seconds per micro-batch of the loss the graph leaves out (cost.loss),
    loss_b: np.ndarray | None = None  # forward and backward, part of compute_f and compute_b
    loss_saved: np.ndarray | None = None  # per stage: bytes per micro-batch the loss keeps (cost.loss.loss_memory_bytes)
    loss_transient: np.ndarray | None = None  # per stage: the loss backward's transient bytes
    amp_copies: np.ndarray | None = None  # per stage: bytes per micro-batch of AMP's 16-bit weight copies (cost.memory)


class _PerStage:
    """Sums of per-layer values over each stage's layers (``ranges``: ``[start, end)`` per stage)."""

    def __init__(self, ranges: list[tuple[int, int]]) -> None:
        self.starts = np.array([a for a, _ in ranges])
        self.ends = np.array([b for _, b in ranges])
        self.stage_of_layer = np.repeat(np.arange(len(ranges)), self.ends - self.starts)  # the stage of each full layer

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """Per stage, the sum of ``x`` (per layer) over its layers (a difference of prefix sums)."""
        cum = np.zeros(len(x) + 1)
        np.cumsum(x, out=cum[1:])
        return cum[self.ends] - cum[self.starts]

    def many(self, *xs: np.ndarray) -> list[np.ndarray]:
        """``[self(x) for x in xs]`` in one prefix sum over the stacked rows (a running sum along
        each row, as for one: the same values to the bit)."""
        cum = np.zeros((len(xs), len(xs[0]) + 1))
        np.cumsum(np.stack(xs), axis=1, out=cum[:, 1:])
        return list(cum[:, self.ends] - cum[:, self.starts])


class _StageGroups(NamedTuple):
    """Where each stage's groups sit (:meth:`StageCoster._stage_groups`): per stage its residue
    and the residue's position ``at`` in the distinct residues; per distinct residue the tensor,
    context and expert-parallel groups' (placement id, ranks) and the ring-attention step costs
    by message size; per stage its (d x c, ep, expert-dp) groups (:meth:`StageCoster._dp_wheres`)."""

    residue: list[int]
    at: np.ndarray
    tp: list[tuple[int, int]]
    cp: list[tuple[int, int]]
    dp: list[tuple[tuple[int, int], tuple[int, int], tuple[int, int]]]
    ep: list[tuple[int, int]]
    ring: dict[float, list[float]]


class Pricing:
    """The prices a cluster fixes, shared by every :class:`StageCoster` on it (a sweep's
    evaluators, one per micro-batch size, price the same data-parallel groups): where each
    group sits on the cluster (placement ids), each collective's seconds on a placement, and one
    stage's ZeRO part by its parameters and groups (:meth:`StageCoster.zero_part`).  None of
    them depends on the model or the micro-batch: only on the cluster (its GPU, network and
    ``--profile`` scale)."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.costs: dict[tuple, float] = {}
        self.placements: dict[tuple[int, int, int], tuple[int, int]] = {}  # (base mod period, stride, n) -> (placement id, ranks)
        self.rank_placements: dict[tuple[int, ...], tuple[int, int]] = {}  # groups that are no progression, by their ranks
        self.period = placement_period(cluster)
        self.placement_list: list[tuple] = []
        self.placement_ids: dict[tuple, int] = {}
        self.stage_states: dict[tuple, tuple] = {}  # one stage's ZeRO part (StageCoster.zero_part)


class StageCoster(LayerCoster):
    """The stage tables of one imported model on one cluster (module docstring).  Values that
    depend on the cluster (send, TP/CP/EP and tied-weight times, placement ids) are kept here,
    never on the graph, which other clusters share."""

    def __init__(self, imported: ImportResult, cluster: Cluster, collapse: bool = True, collapsed: Collapsed | None = None,
                 lenient: bool = False, pricing: Pricing | None = None) -> None:
        """``pricing``: the cluster's prices to share with other costers on ``cluster``
        (:class:`Pricing`); None: this coster's own."""
        if pricing is None:
            pricing = Pricing(cluster)
        elif pricing.cluster is not cluster:
            raise ValueError("the pricing given to StageCoster is another cluster's")
        self.cluster = cluster
        self.pricing = pricing
        self._costs = pricing.costs
        self._placements = pricing.placements
        self._rank_placements = pricing.rank_placements
        self._period = pricing.period
        self._placement_list = pricing.placement_list
        self._placement_ids = pricing.placement_ids
        self._stage_states = pricing.stage_states
        self._per_cluster: dict[object, object] = {}
        self._tables: dict[tuple, StageTable] = {}  # stage_table's look-up by a plain tuple
        fitted = cluster.profile_scale.host if cluster.profile_scale is not None else None  # --profile's measured one
        host = None if fitted is None and str(cluster.host_model).strip().lower() == AUTO else host_model(cluster.host_model, fitted=fitted)
        super().__init__(imported, cluster.gpu, collapse, collapsed, lenient, host, cluster.profile_scale)

    def _use(self, collapsed: Collapsed | None) -> None:
        self._per_cluster.clear()  # stage tables of the graph worked on before
        self._tables.clear()
        super()._use(collapsed)

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

    def prepare(self, config: ParallelConfig) -> StagePlan:
        """Per-device costs of ``config`` (raises ConfigError as the analysis does)."""
        try:
            return self._prepare(config)
        except NotRepeating:
            if self.pre_collapsed:
                raise  # the caller imports the whole model
            self._use(None)  # the collapse does not hold for this model: the whole graph from now on
            return self._prepare(config)

    def stage_table(self, config: ParallelConfig) -> StageTable:
        """What every configuration with this model split (t, SP, p, c, e, hence d) shares.

        Looked up first by a plain tuple of the same fields (the closed sets by their flag
        values, which hash in C): a sweep asks once per configuration, and building and hashing
        the :class:`_StageTableKey` dataclass each time cost about 4 us more (20 ms over the
        530B sweep's 4,686)."""
        cp, stack = config.cp_size, config.stack
        memo = (config.tp_size, config.sequence_parallel, config.dtype._value_, cp, config.cp_scheme._value_ if cp > 1 else None,
                config.seq_len, config.pp_size, config.dp_size, config.ep_size, config.rank_order, config.grad_reduce_dtype,
                config.bucket_bytes, config.optimizer._value_, config.capacity_factor, config.micro_batch_size,
                config.tp_comm_overlap, config.async_tp_allreduce, config.grad_accumulation_fusion, stack._value_,
                config.precision._value_, config.attention._value_, config.num_micro_batches if stack is Stack.PYTORCH else None,
                config.inputs_on_gpu)
        table = self._tables.get(memo)
        if table is None:
            key = _StageTableKey(config.tp_size, config.sequence_parallel, config.dtype, cp, config.cp_scheme if cp > 1 else None,
                                 config.seq_len, config.pp_size, config.dp_size, config.ep_size, config.rank_order,
                                 config.grad_reduce_dtype, config.bucket_bytes, config.optimizer, config.capacity_factor,
                                 config.micro_batch_size, config.tp_comm_overlap, config.async_tp_allreduce,
                                 config.grad_accumulation_fusion, str(stack), str(config.precision), str(config.attention),
                                 config.num_micro_batches if stack is Stack.PYTORCH else None, config.inputs_on_gpu)
            table = self._tables[memo] = cached(self._per_cluster, key, lambda: self._build_stage_table(config))
        return table

    def _build_stage_table(self, config: ParallelConfig) -> StageTable:
        """The :class:`StageTable` of ``config``'s split: the layers' sums per stage
        (:class:`_PerStage`), the groups' placements (:meth:`_stage_groups`), the pipeline sends
        (:meth:`_pipeline_sends`), the tied-weight all-reduces (:meth:`_tied_allreduces`), the
        collectives on the critical path (:meth:`_critical_path`), the input reads and buffers
        (:func:`_stage_buffers`) and the per-micro-batch parameter passes (:meth:`_parameter_passes`)."""
        layers = self.layer_table(config)
        ranges = self.partition(config, layers)
        p, d, cp = config.pp_size, config.dp_size, config.cp_size
        expert_params = self._expert_params(config)  # raises the analysis's --ep errors
        ep_counts = self._ep_counts(config)
        rank_map = RankMap(d, config.tp_size, p, config.rank_order, cp=cp, ep=config.ep_size)
        crossing = self._boundary_bytes(config, ranges)
        if cp > 1:  # each GPU sends 1/c of every boundary tensor
            crossing = [[(x / cp, rep) for x, rep in sizes] for sizes in crossing]
        groups = self._stage_groups(config, rank_map, layers)
        send, send_back = self._pipeline_sends(config, crossing, groups, rank_map.strides[1])
        per_stage = _PerStage(ranges)
        copies = held_copies(layers.shared, per_stage.stage_of_layer.tolist(), p)
        tied = self._tied_allreduces(copies, rank_map, config)
        layer_f, layer_b = self._critical_path(config, layers, ep_counts, groups, per_stage.stage_of_layer)
        fwd, bwd, selective, loss_f, loss_b, params, flops, loss_saved, loss_transient, gemm_local, tp_f, tp_b = per_stage.many(
            layers.fwd, layers.bwd, layers.selective, layers.loss_f, layers.loss_b, layers.params, layers.flops,
            layers.loss_saved, layers.loss_transient, layers.gemm_local, layer_f, layer_b)
        # Full recomputation re-runs the forward of transformer layers only, never the embedding
        # or the LM head (Megatron-LM --recompute-granularity full: the checkpointed unit is a
        # TransformerLayer; Korthikanti et al. 2022 Sec. 4), collectives included
        blocks = np.array([kind is LayerKind.BLOCK for kind in self.kinds], dtype=float)
        if blocks.all():
            recompute_full, tp_f_blocks = fwd, tp_f
        else:
            recompute_full, tp_f_blocks = per_stage.many(layers.fwd * blocks, layer_f * blocks)
        reads, buffers = self._stage_buffers(config, layers, per_stage, crossing)
        none = (-1, 1)
        dp_where = [w[0] for w in groups.dp] if d * cp > 1 else [none] * p
        edp_where = [w[2] for w in groups.dp] if config.expert_dp_size > 1 else [none] * p
        params_local, expert_local, accumulate = self._parameter_passes(config, layers, expert_params, copies, per_stage)
        # the training loss the graph leaves out (loss_f, loss_b: on the stage holding the logits, dml2comm.cost.loss)
        return StageTable(config, ranges, fwd + loss_f, bwd + accumulate + loss_b, selective,
                           tp_f, tp_b, reads, params_local, buffers,
                           np.array(send + [0.0]), np.array([0.0] + send_back), tied, rank_map, {}, {}, dp_where,
                           expert_local, edp_where, flops_fwd=layers.flops_fwd,
                           params=params + np.array(copies.extra), flops=flops, copies=copies,
                           recompute_full=recompute_full, tp_f_blocks=tp_f_blocks, accumulate=accumulate,
                           loss_f=loss_f, loss_b=loss_b, loss_saved=loss_saved, loss_transient=loss_transient,
                           amp_copies=amp_weight_copy_bytes(gemm_local, config.precision, config.train_dtype.itemsize))

    def _stage_groups(self, config: ParallelConfig, rank_map: RankMap, layers) -> _StageGroups:
        """Where each stage's groups sit on the cluster, found once per placement: stage s's
        first rank is s * sp, groups placed alike cost alike, and a stage's groups are placed
        as those of the first stage whose first rank has the same residue mod placement_period
        (:meth:`_where`)."""
        p, cp = config.pp_size, config.cp_size
        _, sp, stt, sc = rank_map.strides
        period = self._period
        residue = [(st * sp) % period for st in range(p)]
        first: dict[int, int] = {}
        for st, r in enumerate(residue):
            first.setdefault(r, st)
        uniq = list(first)
        at = np.array([uniq.index(r) for r in residue])  # per stage: its residue's position in uniq
        base = {r: first[r] * sp for r in uniq}  # a stage of each residue (its actual first rank)
        tp_groups = [self._where(base[r], stt, config.tp_size) for r in uniq]
        cp_groups = [self._where(base[r], sc, cp) for r in uniq] if layers.cp else []
        wheres_u = [self._dp_wheres(rank_map, first[r]) for r in uniq]
        # ring attention: each step on the slower hop of the ring (the first rank's two neighbours)
        ring_costs = {size: [max(self._cost_at(CollectiveKind.SEND_RECV, self._where(base[r], sc, 2), size),
                                 self._cost_at(CollectiveKind.SEND_RECV, self._where(base[r] + (cp - 1) * sc, -(cp - 1) * sc, 2), size))
                             for r in uniq]
                      for (_, size) in layers.ring}
        return _StageGroups(residue, at, tp_groups, cp_groups, [wheres_u[i] for i in at.tolist()], [w[1] for w in wheres_u],
                            ring_costs)

    def _pipeline_sends(self, config: ParallelConfig, crossing: list[list[tuple[float, bool]]], groups: _StageGroups,
                        sp: int) -> tuple[list[float], list[float]]:
        """Per boundary (stages st and st + 1): seconds of the forward send of its tensors from
        stage st's first rank to the one sp further, and of the backward send back, each
        tensor scattered and gathered over the receivers' tensor group where it pays
        (:func:`pipeline_send_s`), plus the framework's host time for the message
        (:func:`dml2comm.cost.host.pipeline_message_s`); priced once per (pair, group, tensors)."""
        residue, at, tp_groups = groups.residue, groups.at, groups.tp
        cost_at, where = self._cost_at, self._where
        ahead_of: dict[int, tuple[int, int]] = {}
        back_of: dict[int, tuple[int, int]] = {}
        sent: dict[tuple, float] = {}
        # a boundary's two sends depend only on its stages' residues and its tensors
        by_pair: dict[tuple, tuple[float, float]] = {}
        send, send_back = [], []
        for st, sizes in enumerate(crossing):  # boundary st: stages st and st + 1
            key = tuple(sizes)
            both = by_pair.get((residue[st], residue[st + 1], key))
            if both is not None:
                send.append(both[0])
                send_back.append(both[1])
                continue
            ahead = ahead_of.get(residue[st])
            if ahead is None:
                ahead = ahead_of[residue[st]] = where(st * sp, sp, 2)
            r_back = residue[st + 1]
            back = back_of.get(r_back)
            if back is None:
                back = back_of[r_back] = where((st + 1) * sp, -sp, 2)
            gather_f, gather_b = tp_groups[at[st + 1]], tp_groups[at[st]]  # the receivers' tensor groups
            fwd = sent.get((ahead, gather_f, key))
            if fwd is None:  # the boundary's tensors, plus the framework's host time for the message
                fwd = sent[(ahead, gather_f, key)] = pipeline_message_s(
                    sum(pipeline_send_s(cost_at, ahead, gather_f, x, rep, config.tp_size) for x, rep in sizes), self.host_for(config))
            bwd = sent.get((back, gather_b, key))
            if bwd is None:
                bwd = sent[(back, gather_b, key)] = pipeline_message_s(
                    sum(pipeline_send_s(cost_at, back, gather_b, x, rep, config.tp_size) for x, rep in sizes), self.host_for(config))
            by_pair[(residue[st], residue[st + 1], key)] = (fwd, bwd)
            send.append(fwd)
            send_back.append(bwd)
        return send, send_back

    def _tied_allreduces(self, copies: HeldCopies, rank_map: RankMap, config: ParallelConfig) -> np.ndarray:
        """Per stage, seconds of its tied-weight gradient all-reduces (:meth:`_tied_groups`), each
        on every stage of its group."""
        tied = np.zeros(config.pp_size)
        for held_by, group, size in self._tied_groups(copies, rank_map, config):
            tied[list(held_by)] += self.price(CollectiveKind.ALL_REDUCE, group, size)
        return tied

    @staticmethod
    def _tied_groups(copies: HeldCopies, rank_map: RankMap,
                     config: ParallelConfig) -> list[tuple[tuple[int, ...], tuple[int, ...], float]]:
        """One all-reduce per group of stages holding a copy of a tied parameter: (the stages,
        the ranks: one GPU per stage, same data and tensor rank, the gradient bytes), what the
        stage times (:meth:`_tied_allreduces`) and the specs (:meth:`_tied_specs`) read."""
        return [(held_by, tuple(rank_map.rank(0, s, 0) for s in held_by), local_numel * config.grad_bytes)
                for held_by, local_numel in copies.groups]

    def _critical_path(self, config: ParallelConfig, layers, ep_counts: dict, groups: _StageGroups,
                       layer_stage: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per layer and micro-batch: forward and backward seconds of the tensor-, context- and
        expert-parallel collectives on the critical path (summed per stage by the caller, and
        per stage of the transformer layers alone for full recomputation), each layer's count of
        a collective times its cost on its stage's group."""
        cp, at = config.cp_size, groups.at
        layer_f, layer_b = np.zeros(len(layer_stage)), np.zeros(len(layer_stage))

        def on_path(phase: Phase, counts: np.ndarray, kind: CollectiveKind, wheres: list[tuple[int, int]], size: float) -> None:
            """Add each layer's count of one collective times its cost on its stage's group
            (``wheres``: per residue in ``uniq``)."""
            cost = np.array([self._cost_at(kind, w, size) for w in wheres])[at][layer_stage]
            (layer_f if phase is Phase.FORWARD else layer_b)[:] += counts * cost

        self._tp_on_path(config, layers, groups, layer_stage, layer_f, layer_b, on_path)
        # CP and EP collectives sit on the critical path like TP's: AllToAlls (Ulysses, MoE
        # dispatch/combine) block the next op
        for (kind, phase, size), counts in layers.cp.items():  # Ulysses AllToAlls over cp_group(0, s, 0)
            on_path(phase, counts, kind, groups.cp, size)
        for (phase, size), counts in layers.ring.items():
            # c - 1 ring steps per site, each on the slower hop of the ring, exposing what 1/c of
            # the layer's attention core does not hide (Liu et al. 2023, Sec. 3)
            core = (layers.core_f if phase is Phase.FORWARD else layers.core_b) / cp
            cost = np.array(groups.ring[size])[at][layer_stage]
            (layer_f if phase is Phase.FORWARD else layer_b)[:] += counts * (np.maximum(cost - core, 0.0) * (cp - 1))
        for (phase, size), counts in ep_counts.items():  # MoE AllToAlls over ep_group(s, 0, 0)
            on_path(phase, counts, CollectiveKind.ALL_TO_ALL, groups.ep, size)
        return layer_f, layer_b

    def _tp_on_path(self, config: ParallelConfig, layers, groups: _StageGroups, layer_stage: np.ndarray, layer_f: np.ndarray,
                    layer_b: np.ndarray, on_path) -> None:
        """Add the tensor-parallel collectives' critical-path seconds to ``layer_f`` and
        ``layer_b`` (in place; ``on_path``: :meth:`_critical_path`'s)."""
        cp, at, tp_groups = config.cp_size, groups.at, groups.tp
        if config.tp_comm_overlap:
            # Wang et al. (ASPLOS'23) / Megatron --tp-comm-overlap: the all-gather before a
            # column-parallel GEMM and the reduce-scatter after a row-parallel one are split into
            # t chunks pipelined with the GEMM; what the adjacent GEMM (its input-gradient half in
            # backward) does not hide stays exposed, and at least one chunk (t_comm / t) always is
            t = config.tp_size
            for (kind, phase, size, gemm), counts in layers.tp_gemm.items():
                if phase in (Phase.FORWARD, Phase.BACKWARD):
                    cost = np.array([self._cost_at(kind, w, size) for w in tp_groups])
                    exposed = np.maximum(cost - gemm, cost / t)[at][layer_stage]
                    (layer_f if phase is Phase.FORWARD else layer_b)[:] += counts * exposed
            return
        for (kind, phase, size), counts in layers.tp.items():
            if phase in (Phase.FORWARD, Phase.BACKWARD):
                on_path(phase, counts, kind, tp_groups, size)
        if config.async_tp_allreduce:
            # Megatron-LM's asynchronous TP all-reduce (ParallelConfig.async_tp_allreduce): the
            # input-gradient collective of a column-parallel GEMM runs while its weight
            # gradient is computed; the part that GEMM hides leaves the critical path
            for (kind, size, wgrad), counts in layers.tp_wgrad.items():
                cost = np.array([self._cost_at(kind, w, size) for w in tp_groups])
                layer_b -= counts * np.minimum(cost, wgrad)[at][layer_stage]

    def _stage_buffers(self, config: ParallelConfig, layers, per_stage: _PerStage,
                       crossing: list[list[tuple[float, bool]]]) -> tuple[np.ndarray, np.ndarray]:
        """Per stage: seconds of its input reads (the graph's inputs, 1/c of them, over the
        host-to-device link: the GPU's PCIe bandwidth, else :data:`PCIE4_X16_BYTES_PER_S`) where
        a layer reads a graph input, and its buffers: the pipeline send and receive buffers of
        its boundaries and the DP bucket being reduced (:func:`dp_bucket_buffer_bytes`)."""
        p, cp = config.pp_size, config.cp_size
        pcie = getattr(self.cluster.gpu, "pcie_bytes_per_s", 0.0) or PCIE4_X16_BYTES_PER_S
        input_bytes = sum(self.graph.tensors[n].nbytes for n in self.graph.inputs) / cp
        reads = np.logical_or.reduceat(layers.reads_input, per_stage.starts) * (0.0 if config.inputs_on_gpu else input_bytes / pcie)
        if self.profile is not None:  # --profile: the profiled step's own copies (none: its batch was on the GPU)
            reads = reads * self.profile.factor("input")[0]
        boundary = np.array([sum(x for x, _ in sizes) for sizes in crossing])
        buffers = np.zeros(p)
        buffers[1:] += boundary
        buffers[:-1] += boundary
        buffers += dp_bucket_buffer_bytes(config.bucket_bytes, config.dp_size * cp)  # the DP bucket being reduced
        return reads, buffers

    def _parameter_passes(self, config: ParallelConfig, layers, expert_params: tuple[np.ndarray, np.ndarray] | None,
                          copies: HeldCopies, per_stage: _PerStage) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per stage: parameters per GPU (tied copies included) and the expert part of them,
        then the per-micro-batch backward passes over them: eager PyTorch's AccumulateGrad
        (:func:`~dml2comm.cost.compute.eager_accumulate_grad_s`; AMP's weight casts are the ops',
        :func:`~dml2comm.cost.ops.autocast_cast_costs`), or
        Megatron-LM's gradient accumulation (:func:`~dml2comm.cost.compute.grad_accumulation_s`:
        every local parameter without gradient-accumulation fusion, else those no GEMM
        accumulates), plus autograd's sum of a tied table's gradients
        (:func:`~dml2comm.cost.compute.shared_gradient_sum_s`)."""
        p, gpu = config.pp_size, self.cluster.gpu
        tied_local = np.array(copies.extra_local)
        if expert_params is None:
            params_local, expert_local = per_stage(layers.params_local) + tied_local, np.zeros(p)
        else:
            params_local, expert_local = per_stage(expert_params[0]) + tied_local, per_stage(expert_params[1])
        achieved_hbm = gpu.kernel_hbm_bytes_per_s * hbm_efficiency_of(gpu)
        if config.stack is Stack.PYTORCH:
            accumulate = np.zeros(p) + eager_accumulate_grad_s(params_local, config.precision, config.num_micro_batches, achieved_hbm)
        else:
            accumulated = params_local if not config.grad_accumulation_fusion else per_stage(layers.unfused_local)
            accumulate = grad_accumulation_s(accumulated, config.train_dtype.itemsize, config.grad_bytes, achieved_hbm)
        accumulate = accumulate + shared_gradient_sum_s(np.array(copies.summed_local), config, achieved_hbm)
        return params_local, expert_local, accumulate

    def zero_part(self, table: StageTable, config: ParallelConfig):
        """Per stage for ZeRO stage z: gradient-bucket runs, the collective after the step,
        the optimizer step and the model states (weights + gradients + optimizer).

        Non-expert gradients reduce over the d x c ranks, expert gradients over the d x c / e
        expert-data-parallel ranks, one bucket stream after the other (``_device_work``)."""
        z = config.zero_stage  # the table is per precision already (_StageTableKey)
        if z not in table.by_zero:
            dtype_bytes = config.train_dtype.itemsize
            common = (config.dp_size * config.cp_size, config.expert_dp_size, z, config.grad_bytes, dtype_bytes,
                      config.bucket_bytes, config.optimizer, config.dtype is DTypeName.FP16, config.precision)
            expert = table.expert_local if table.expert_local is not None else np.zeros(config.pp_size)
            dense = table.params_local - expert
            # stages with equal parameters on alike groups share their part: each distinct one
            # is found (and its arrays built) once, and the stages read theirs by index
            at: dict[tuple, int] = {}
            parts: list[tuple] = []
            index = []
            for stage in zip(dense.tolist(), expert.tolist(), table.dp_where, table.edp_where):
                j = at.get(stage)
                if j is None:
                    key = stage + common
                    part = self._stage_states.get(key)
                    if part is None:
                        part = self._stage_states[key] = self._one_stage_states(*key)
                    j = at[stage] = len(parts)
                    parts.append(part)
                index.append(j)
            rows = np.array(index)
            n = len(parts)
            table.by_zero[z] = (np.array([r[0] for r in parts])[rows], np.array([r[1] for r in parts])[rows],
                                np.array([r[2] for r in parts])[rows], np.array([r[3] for r in parts])[rows],
                                np.array([r[4] for r in parts]).reshape(n, 3)[rows],
                                np.array([r[5] for r in parts]).reshape(n, 3)[rows], [parts[j][6] for j in index])
        return table.by_zero[z]

    def dp_specs(self, table: StageTable, config: ParallelConfig) -> list[tuple[tuple[StageDPCollective, float], ...]]:
        """Per stage, its data-parallel collectives with the seconds of one message as the plan
        priced them (:meth:`zero_part`): what the analysis expands into comm nodes with ranks."""
        return self.zero_part(table, config)[6]

    def price(self, kind: CollectiveKind, ranks: Sequence[int], size: float) -> float:
        """Seconds of ``kind`` over the global ``ranks`` with ``size`` bytes, from the cache every
        stage-table term is priced from (:meth:`_cost_at`: the group's placement on the cluster)."""
        return self._cost_at(kind, self._where_ranks(ranks), size)

    def comm_specs(self, config: ParallelConfig) -> tuple[CommSpec, ...]:
        """Every collective of ``config`` (one GPU's view, replica 0, tensor rank 0) as a
        :class:`CommSpec`, read off the tables the stage times are summed from: the tensor-,
        context- and expert-parallel collectives of each layer (:attr:`LayerTable.comms`,
        :meth:`ep_comms`: :meth:`_critical_path` counts them), the pipeline messages of each
        boundary (:meth:`boundary_tensors`: :meth:`_pipeline_sends`), the tied-weight
        all-reduces (:attr:`StageTable.copies`: :meth:`_tied_allreduces`) and the data-parallel
        collectives (:meth:`dp_specs`: :meth:`zero_part`), in that order.  Per op and layer, so
        on the whole graph only (``collapse=False``: the analysis's coster); the sweep reads the
        sums alone."""
        if self.collapsed is not None:
            raise ValueError("comm_specs needs the whole graph: a StageCoster built with collapse=False")
        table = self.stage_table(config)
        stage_of_layer = _PerStage(table.ranges).stage_of_layer.tolist()
        m = config.num_micro_batches
        return (self._layer_specs(config, table, stage_of_layer, m) + self._pipeline_specs(config, table, m)
                + self._tied_specs(config, table, stage_of_layer) + self._dp_comm_specs(config, table, m))

    def _layer_specs(self, config: ParallelConfig, table: StageTable, stage_of_layer: list[int],
                     m: int) -> tuple[CommSpec, ...]:
        """The per-micro-batch collectives inside a stage: tensor parallel (on the stage's tensor
        group), context parallel (Ulysses AllToAlls over its context group; a ring step on the
        slower of the ring's two hops from the first rank, as :meth:`_stage_groups` prices it)
        and expert parallel (MoE dispatch and combine AllToAlls over its first expert group)."""
        rank_map, out = table.rank_map, []
        hidden = ("; runs during the op's weight-gradient GEMM, which hides up to its length "
                  "(Megatron-LM's asynchronous TP all-reduce)")
        for c in self.layer_table(config).comms + self.ep_comms(config):
            s = stage_of_layer[c.layer]
            reason = c.reason
            if c.dim is ParallelDim.TP:
                group = rank_map.tp_group(0, s)
                if c.wgrad_s is not None and config.async_tp_allreduce and not config.tp_comm_overlap:
                    reason += hidden
            elif c.dim is ParallelDim.CP:
                group = rank_map.cp_group(0, s, 0)
                if c.kind is CollectiveKind.SEND_RECV:  # a ring step lasts as long as its slowest hop
                    group = max(((group[0], group[1]), (group[-1], group[0])),
                                key=lambda pair: self.price(c.kind, pair, c.message_bytes))
            else:
                group = rank_map.ep_group(s, 0, 0)
            out.append(CommSpec(c.kind, c.dim, c.phase, s, c.layer, c.after_op, c.tensor, tuple(group), c.message_bytes,
                                c.count * m, True, reason, self.price(c.kind, group, c.message_bytes)))
        return tuple(out)

    def _pipeline_specs(self, config: ParallelConfig, table: StageTable, m: int) -> tuple[CommSpec, ...]:
        """Between pipeline stages: each boundary's activations forward and their gradients
        backward (:meth:`boundary_tensors`, 1/c per GPU), split 1/t with Megatron-LM's
        scatter/gather where every tensor rank holds them whole (:func:`pipeline_messages`, as
        :meth:`_pipeline_sends` prices them: the receivers' all-gather costed with the send that
        feeds them); the framework's host time
        per message (:func:`dml2comm.cost.host.pipeline_message_s`) on the boundary's first tensor
        in each direction."""
        rank_map, cp, t = table.rank_map, config.cp_size, config.tp_size
        host = self.host_for(config)
        p2p_note = f"; with {fmt_s(host.p2p_s)} of host time for the message (--host-model {host.name})" if host.p2p_s else ""
        out = []
        for s, tensors in enumerate(self.boundary_tensors(config, table.ranges)):
            pair = (rank_map.rank(0, s, 0), rank_map.rank(0, s + 1, 0))
            for k, (name, whole, rep) in enumerate(tensors):
                host_s, host_note = (host.p2p_s, p2p_note) if k == 0 else (0.0, "")
                prod = self.graph.producer(name)
                (_, _, sent), *gathers = pipeline_messages(whole / cp, rep, t)
                note = f" (1/{t} per tensor rank: scatter/gather)" if gathers else ""
                out += [CommSpec(CollectiveKind.SEND_RECV, ParallelDim.PP, Phase.FORWARD, s, None, prod, name, pair, sent, m, True,
                                 f"activation from stage {s} to stage {s + 1}{note}{host_note}",
                                 self.price(CollectiveKind.SEND_RECV, pair, sent), host_s),
                        CommSpec(CollectiveKind.SEND_RECV, ParallelDim.PP, Phase.BACKWARD, s + 1, None, prod, name, pair[::-1], sent, m,
                                 True, f"gradient from stage {s + 1} to stage {s}{note}{host_note}",
                                 self.price(CollectiveKind.SEND_RECV, pair[::-1], sent), host_s)]
                for kind, _, size in gathers:  # the receivers rebuild the whole tensor
                    for phase, at, to, what in ((Phase.FORWARD, s, s + 1, "activation"), (Phase.BACKWARD, s + 1, s, "gradient")):
                        group = rank_map.tp_group(0, to)
                        out.append(CommSpec(kind, ParallelDim.PP, phase, at, None, prod, name, group, size, m, True,
                                            f"stage {to} all-gathers the {what} from its {t} tensor ranks (scatter/gather)",
                                            self.price(kind, group, size)))
        return tuple(out)

    def _tied_specs(self, config: ParallelConfig, table: StageTable, stage_of_layer: list[int]) -> tuple[CommSpec, ...]:
        """After the backward pass, the gradient of each parameter held by several stages
        all-reduced between them (one GPU per stage, same data and tensor rank), before the
        optimizer step (Megatron-LM finalize_model_grads -> _allreduce_word_embedding_grads),
        on each of its stages, named by the parameters it carries."""
        out = []
        readers = self._readers()
        for held_by, group, size in self._tied_groups(table.copies, table.rank_map, config):
            names = ", ".join(w for w, layers in readers.items() if len({stage_of_layer[li] for li in layers}) > 1
                              and tuple(sorted({stage_of_layer[li] for li in layers})) == held_by)
            seconds = self.price(CollectiveKind.ALL_REDUCE, group, size)
            for s in held_by:
                out.append(CommSpec(CollectiveKind.ALL_REDUCE, ParallelDim.PP, Phase.OPTIMIZER, s, None, None, names, group, size,
                                    1, False, f"tied-weight gradient all-reduce between stages {', '.join(map(str, held_by))} "
                                    "(Megatron-LM embedding group, after the backward pass, before the optimizer step)", seconds))
        return tuple(out)

    def _dp_comm_specs(self, config: ParallelConfig, table: StageTable, m: int) -> tuple[CommSpec, ...]:
        """Per stage, its data-parallel collectives as the plan priced them (:meth:`dp_specs`):
        non-expert gradients over the stage's d x c ranks (CP ranks reduce with DP), expert
        gradients over its d x c / e expert-data-parallel ranks."""
        out = []
        for s, specs in enumerate(self.dp_specs(table, config)):
            for dc, seconds in specs:
                group = table.rank_map.dp_cp_group(s, 0) if dc.group is DPGroup.DENSE else table.rank_map.expert_dp_group(s, 0, 0)
                out.append(CommSpec(dc.kind, ParallelDim.DP, dc.phase, s, None, None, dc.tensor, tuple(group), dc.message_bytes,
                                    dc.count * (m if dc.per_micro_batch else 1), dc.per_micro_batch, dc.reason, seconds))
        return tuple(out)

    def _one_stage_states(self, dense: float, expert: float, where: tuple[int, int], ewhere: tuple[int, int], d: int,
                          edp: int, z: int, grad_bytes: int, dtype_bytes: int, bucket_bytes: int, optimizer: str,
                          loss_scaled: bool = False, precision: Precision = Precision.MIXED) -> tuple:
        """One stage's ZeRO part (:mod:`dml2comm.cost.stages`, as the analysis): (bucket seconds
        per run, buckets per run, seconds of the collective after the step, optimizer step
        seconds, model-state bytes, ZeRO per-micro-batch seconds: forward all-gather, backward
        all-gather, backward reduce-scatter, and the collectives with the seconds of one message)."""
        specs = tuple((dc, self._cost_at(dc.kind, where if dc.group is DPGroup.DENSE else ewhere, dc.message_bytes))
                      for dc in stage_dp_collectives(dense, expert, grad_bytes, d, edp, z, bucket_bytes))
        timed = [Timed(dc.kind, dc.phase, dc.per_micro_batch, dc.count, seconds) for dc, seconds in specs]
        dp = stage_dp_times(timed, 1)  # per micro-batch terms: count x seconds
        if len(dp.bucket_runs) > _MAX_RUNS:  # pragma: no cover - buckets() gives at most two sizes per stream
            raise ConfigError("more gradient-bucket sizes than the fast path handles")
        tau, count = np.zeros(_MAX_RUNS), np.zeros(_MAX_RUNS)
        for r, (t, n) in enumerate(dp.bucket_runs):
            tau[r], count[r] = t, n
        states = stage_model_states(dense, expert, d, edp, z, optimizer, dtype_bytes, precision)
        opt = stage_optimizer_s(dense, expert, d, edp, z, optimizer, dtype_bytes, self.cluster.gpu.kernel_hbm_bytes_per_s, loss_scaled,
                                precision)
        opt *= class_value(self.cluster.gpu, "optimizer") or 1.0  # a calibrated time scale (cost.calibrated)
        if self.profile is not None:  # a profiled step's measured / modelled ratio (cost.profile)
            opt *= self.profile.factor("optimizer")[0]
        return (tau, count, dp.after_step_s, opt, (states.weights_bytes, states.grads_bytes, states.optimizer_bytes),
                (dp.zero_fwd_s, dp.zero_bwd_pre_s, dp.zero_bwd_post_s), specs)

    def activation_part(self, table: StageTable, config: ParallelConfig):
        """Per stage for one recomputation mode: saved bytes per micro-batch and the
        transient (+ rebuilt layer) bytes, 1/c of them with context parallelism."""
        mode = config.recompute
        if mode not in table.by_recompute:
            known = derived(self.graph, StageActivationsKey(config.tp_size, config.sequence_parallel, config.dtype,
                                                             config.dropout > 0, mode, config.seq_len, config.stack,
                                                             config.attention, autocasts_activations(
                                                                 config.stack, config.precision, config.train_dtype.itemsize)), dict)
            # each distinct stage signature looked up once, the stages reading theirs by index; the
            # per-layer tables are read only when a signature is new (known ones were computed
            # from the same tables, already built)
            at: dict[tuple, int] = {}
            values: list[tuple[float, float, float]] = []
            index = []
            tables = None
            for sig, (first, last) in zip(self._signatures(table), table.ranges):
                j = at.get(sig)
                if j is None:
                    value = known.get(sig)
                    if value is None:
                        if tables is None:
                            tables = (self._per_layer(config), self._saved_table(config))
                        value = known[sig] = self._stage_activations(config, *tables, first, last, sig[0], sig[1], sig[2:])
                    j = at[sig] = len(values)
                    values.append(value)
                index.append(j)
            saved, rebuilt, transient = np.array(values)[np.array(index)].T
            cp = config.cp_size
            table.by_recompute[mode] = (saved / cp, (transient + rebuilt) / cp)
        return table.by_recompute[mode]

    def _mode_part(self, table: StageTable, config: ParallelConfig) -> tuple:
        """What every configuration of ``table`` with ``config``'s recomputation mode shares, per
        stage: forward, backward compute, backward and backward TP seconds, and the saved bytes
        per micro-batch and transient bytes (:meth:`activation_part`) with the loss's and AMP's."""
        if config.recompute is Recompute.FULL:  # the transformer layers' forward again, collectives included
            recompute = table.recompute_full
            tp_b = table.tp_b + table.tp_f_blocks
        elif config.recompute is Recompute.SELECTIVE:
            recompute, tp_b = table.selective, table.tp_b
        else:
            recompute, tp_b = 0.0, table.tp_b
        comp_b = table.compute_b + recompute
        per_mb, extra = self.activation_part(table, config)
        # what the loss keeps per micro-batch and AMP's weight copies join the saved activations;
        # the loss backward's buffers are a transient like the largest op's (cost.memory, cost.loss)
        if table.loss_saved.any() or table.amp_copies.any():
            per_mb = per_mb + table.loss_saved + table.amp_copies
        if table.loss_transient.any():
            extra = np.maximum(extra, table.loss_transient)
        return table.compute_f + table.tp_f + table.reads, comp_b, comp_b + tp_b, tp_b, per_mb, extra

    def _prepare(self, config: ParallelConfig) -> StagePlan:
        if self.cluster.num_gpus != config.num_gpus:
            raise ConfigError(f"the cluster has {self.cluster.num_gpus} GPUs but d*t*p = {config.num_gpus}; make them equal")
        if self.imported.model_batch is not None and self.imported.model_batch != config.micro_batch_size:
            raise ConfigError(f"the model fixes its batch dimension at {self.imported.model_batch}")
        table = self.stage_table(config)
        p, m = config.pp_size, config.num_micro_batches
        times = table.by_mode.get(config.recompute)
        if times is None:  # per recomputation mode, once per table (_mode_part)
            times = table.by_mode[config.recompute] = self._mode_part(table, config)
        fwd, comp_b, bwd, tp_b, per_mb, extra = times
        runs_tau, runs_count, after, opt, states, zero_mb, _ = self.zero_part(table, config)
        in_flight = in_flight_micro_batches(config.schedule, p, m, config.chunks)
        # cost.memory.stage_memory_dict's peak, per stage
        grads_held = gradients_live_in_backward(config.stack, m)
        held = table.held.get((config.zero_stage, grads_held))
        if held is None:  # step_peak_bytes' terms the activations do not change, once per table, ZeRO stage and gradients
            held = table.held[(config.zero_stage, grads_held)] = step_peak_held(
                ModelStates(states[:, 0], states[:, 1], states[:, 2]), table.buffers, grads_held)
        step = step_peak_with(held, per_mb * in_flight, table.buffers, extra)
        total = step.peak  # the allocator's peak (cost.memory.stage_memory_dict); the context is off the capacity
        return StagePlan(config, fwd, bwd, table.tp_f, tp_b, table.send_f, table.send_b, table.compute_f, comp_b,
                         runs_tau, runs_count, opt, after, table.tied, float(total.max()), table.flops_fwd / config.micro_batch_size,
                         zero_mb if config.zero_stage >= 2 else None, states, per_mb, in_flight, table.buffers, extra, total,
                         grads_held)
