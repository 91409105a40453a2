"""The sweep's fast path: the analysis's numbers for many configurations at once.

The analysis of one configuration and the sweep read the same stage tables
(:class:`dml2comm.cost.stages.StageCoster`, on the per-layer tables of
:class:`dml2comm.cost.layers.LayerCoster`): every op time, collective, send, memory and
data-parallel term is computed once, there.  What this module adds is speed for many
configurations: :class:`FastEvaluator` keeps one coster per imported model and cluster (its
caches shared by every configuration of a sweep), simulates configurations that share a schedule
``(schedule, p, m, v)`` together, and all schedules of a call in one pass, with
:mod:`dml2comm.sim.levels` (the engine's recurrence, vectorised over configurations), and turns
the end times into the summary numbers (:func:`_finish`, the analysis's breakdown vectorised).

What it returns equals ``analyze_graph``'s summary on iteration time, memory and the breakdown
(``tests/test_search.py`` and ``tests/test_cpep.py`` check it against full runs, ZeRO 0-3,
``--tp-comm-overlap``, CP/EP, interleaving and send-bound pipelines included).
"""

from __future__ import annotations

import functools
from collections import defaultdict
from typing import Any, Sequence

import numpy as np

from dml2comm.cost.layers import NotRepeating
from dml2comm.cost.memory import allocator_capacity_bytes
from dml2comm.cost.stages import StageCoster, StagePlan
from dml2comm.cost.ops import infer_seq_len
from dml2comm.cost.summary import Summary, breakdown, summary_of
from dml2comm.errors import ConfigError
from dml2comm.hardware.cluster import Cluster
from dml2comm.parallel.config import ParallelConfig
from dml2comm.sim.levels import bucket_tail_end_many, compile_schedule, pipeline_end_times_many

__all__ = ["FastEvaluator", "NotRepeating", "supports"]


def supports(config: ParallelConfig) -> bool:
    """Whether the fast path covers ``config`` (else the full analysis evaluates it): every
    configuration since issue 17 (ZeRO 0-3, ``--tp-comm-overlap``, any context and expert
    parallelism and capacity factor); kept as the sweep's routing point."""
    return True


class FastEvaluator(StageCoster):
    """Summary numbers of configurations of one imported model on one cluster (module docstring)."""

    @functools.cached_property
    def seq_len(self) -> int | None:
        """Tokens per sample when a configuration has no ``--seq-len`` (tokens/s), as the analysis infers it."""
        return infer_seq_len(self.imported.graph)

    def evaluate(self, configs: Sequence[ParallelConfig]) -> list[Summary | dict[str, Any]]:
        """The :class:`~dml2comm.cost.summary.Summary` of each configuration (the analysis's,
        without the fields only its comm nodes give); raises nothing: a failed configuration
        gets ``{"error": message}``."""
        out: list[dict[str, Any] | None] = [None] * len(configs)
        groups: dict[tuple, list[tuple[int, StagePlan]]] = defaultdict(list)
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
            summaries = _finish([(sim, end) for _, sim, end in batch], self.cluster, self.seq_len)
            for (i, _), summary in zip((m for members, _, _ in batch for m in members), summaries):
                out[i] = summary
        return out  # type: ignore[return-value]


class _GroupSim:
    """Configurations sharing a schedule: the inputs of the batched pipeline simulation
    (:func:`_finish` turns its end times into iteration time and breakdown)."""

    def __init__(self, schedule: str, p: int, m: int, v: int, preps: list[StagePlan]) -> None:
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


def _finish(sims: list[tuple[_GroupSim, np.ndarray]], cluster: Cluster, seq_len: int | None) -> list[Summary]:
    """Iteration time and breakdown (analysis._simulate and _summarize, vectorised) of groups
    with the same number of devices, from their simulations' end times (``[2K, p]`` each: the
    pipeline with communication, then without), in the groups' order."""
    preps = [pr for sim, _ in sims for pr in sim.preps]
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
    parts = breakdown(iterations, free_iterations, ce_free, mv[:, None] * free)
    hbm = allocator_capacity_bytes(cluster.gpu.hbm_bytes)  # the GPU less the CUDA context, as the analysis
    peaks: dict[str, float] = {}
    out = []
    for k, (pr, iteration) in enumerate(zip(preps, iterations.tolist())):
        config = pr.config
        peak = peaks.get(config.dtype)
        if peak is None:
            peak = peaks[config.dtype] = cluster.gpu.peak_flops(config.dtype)
        out.append(summary_of(parts, k, iteration, flops_fwd_per_sample=pr.flops_fwd_per_sample,
                              global_batch_size=config.global_batch_size, num_gpus=config.num_gpus, peak_flops=peak,
                              seq_len=config.seq_len or seq_len, peak_memory_bytes=pr.peak_memory, capacity_bytes=hbm))
    return out
