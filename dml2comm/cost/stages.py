"""Stage-level terms of data parallelism and ZeRO, computed once for the analysis and the sweep.

A pipeline stage's data-parallel part depends only on its parameters per GPU (dense and, with
expert parallelism, expert), the sizes of its data-parallel groups, the ZeRO stage, the bucket
size and the optimizer.  :func:`dml2comm.analysis.analyze_graph` calls these functions for one
configuration (and expands the collectives into comm nodes with ranks for the drawings);
:class:`dml2comm.search.fast.FastEvaluator` calls the same functions once per distinct stage of
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
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Iterable, Protocol

from dml2comm.cost.compute import optimizer_step_s
from dml2comm.cost.memory import ModelStates, model_state_bytes
from dml2comm.network.kinds import CollectiveKind, Phase
from dml2comm.parallel.data import data_parallel_comms

__all__ = ["DPGroup", "StageDPCollective", "StageDPTimes", "Timed", "TimedDPCollective", "dp_bucket_buffer_bytes", "stage_dp_collectives",
           "stage_dp_times", "stage_model_states", "stage_optimizer_params", "stage_optimizer_s"]


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
                      optimizer: str, dtype_bytes: int, hbm_bytes_per_s: float) -> float:
    """The memory-bound optimizer step of one GPU of the stage (:func:`dml2comm.cost.compute.optimizer_step_s`)."""
    return optimizer_step_s(stage_optimizer_params(dense_params, expert_params, dp_cp_size, expert_dp_size, zero_stage),
                            optimizer, dtype_bytes, hbm_bytes_per_s)


def stage_model_states(dense_params: float, expert_params: float, dp_cp_size: int, expert_dp_size: int, zero_stage: int,
                       optimizer: str, dtype_bytes: int) -> ModelStates:
    """Weights, gradients and optimizer states on one GPU of the stage: the dense ones
    ZeRO-sharded over the d x c ranks, the expert ones over the expert-data-parallel ranks."""
    states = model_state_bytes(dense_params, dp_cp_size, zero_stage, optimizer, dtype_bytes)
    if expert_params:
        ex = model_state_bytes(expert_params, expert_dp_size, zero_stage, optimizer, dtype_bytes)
        states = ModelStates(states.weights_bytes + ex.weights_bytes, states.grads_bytes + ex.grads_bytes,
                             states.optimizer_bytes + ex.optimizer_bytes)
    return states


def dp_bucket_buffer_bytes(bucket_bytes: int, dp_cp_size: int) -> float:
    """The communication buffer of the gradient bucket being reduced (none without data parallelism)."""
    return float(bucket_bytes) if dp_cp_size > 1 else 0.0
