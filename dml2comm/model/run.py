"""The one run of priced plans: a configuration's iteration, simulated once for every caller.

:meth:`dml2comm.cost.stages.StageCoster.prepare` prices a configuration into a
:class:`~dml2comm.cost.stages.StagePlan`; :func:`run` (one plan or thousands) simulates it and
returns what the analysis and the sweep both read: the iteration time, each device's iteration
end, compute end, busy, tensor-parallel and exposed data-parallel time, and the same iteration
with every collective free (for the breakdown of :func:`dml2comm.cost.summary.breakdown`); with
``events=True``, the timeline's events too (:func:`dml2comm.sim.engine.simulate`).

Written once here, for both: the interleaved split (each device's work over its ``v`` model
chunks, the wrap-around send from the last device to the first), the run without communication,
and, in :mod:`dml2comm.sim.levels`, the recurrence (:func:`~dml2comm.sim.levels.pipeline_end_times_many`:
plans that share a schedule ``(schedule, p, m, v)`` together, every schedule in one pass), the
iteration's tail (:func:`~dml2comm.sim.levels.iteration_tail`) and the per-device sums
(:func:`~dml2comm.sim.levels.device_sums`).  Sums are taken in one order, so the sweep's rows
equal the analysis's numbers to the last bit.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from dml2comm.cost.stages import StagePlan
from dml2comm.sim.engine import DeviceWork, SimResult, simulate
from dml2comm.sim.levels import CompiledSchedule, compile_schedule, device_sums, iteration_tail, pipeline_end_times_many

__all__ = ["Batch", "FreeRun", "PlanRun", "run", "run_batches"]


@dataclass(frozen=True)
class FreeRun:
    """A plan's iteration with every collective free (the breakdown's reference)."""

    iteration_time_s: float
    compute_end_s: tuple[float, ...]
    compute_busy_s: tuple[float, ...]  # per device, its steps' compute in program order


@dataclass(frozen=True)
class PlanRun:
    """One plan's run: its iteration (a :class:`~dml2comm.sim.engine.SimResult`, with the events
    when asked for) and the same iteration without communication."""

    plan: StagePlan
    timeline: SimResult
    free: FreeRun


@dataclass(frozen=True)
class Batch:
    """Plans with as many devices, run together: ``[K]`` or ``[K, p]`` arrays, one row per plan
    (``index``: each plan's place in :func:`run_batches`' input)."""

    plans: list[StagePlan]
    index: list[int]
    iteration_s: np.ndarray
    device_end_s: np.ndarray
    compute_end_s: np.ndarray
    dp_exposed_s: np.ndarray
    free_iteration_s: np.ndarray
    free_compute_end_s: np.ndarray
    free_busy_s: np.ndarray
    splits: list[tuple[_Split, int]]  # per plan, its group's split and its row in it


class _Split:
    """Plans sharing a schedule: their per-chunk costs (the interleaved split), and the rows the
    recurrence runs, with communication and without (equal rows simulated once)."""

    def __init__(self, schedule: str, p: int, m: int, v: int, plans: list[StagePlan]) -> None:
        self.cs = cs = compile_schedule(schedule, p, m, v)
        self.plans = plans
        f, b, tf, tb, sf, sb = (np.array([getattr(pr, name) for pr in plans]) for name in ("fwd", "bwd", "tp_f", "tp_b", "send_f", "send_b"))
        # ZeRO-2/3 (a group has them all or none): per micro-batch forward all-gather, backward
        # all-gather, backward reduce-scatter per device, [K, p] each
        zero = [np.array([pr.zero_mb[:, j] for pr in plans]) for j in range(3)] if plans[0].zero_mb is not None else []
        if v > 1:  # each chunk is 1/v of the device's work; the wrap-around uses the largest send
            wrap = sf[:, :-1].max(axis=1, initial=0.0)
            wrap_b = sb[:, 1:].max(axis=1, initial=0.0)
            sf = np.where(sf > 0, sf, wrap[:, None])
            sb = np.where(sb > 0, sb, wrap_b[:, None])
            f, b, tf, tb = f / v, b / v, tf / v, tb / v
            zero = [z / v for z in zero]
        self.f, self.b, self.tf, self.tb, self.sf, self.sb, self.zero_split = f, b, tf, tb, sf, sb, zero
        self.free_f, self.free_b = f - tf, b - tb
        # the pipeline with communication and without (for the exposed communication); rows that
        # are equal (ZeRO-0 and ZeRO-1 differ only after the last backward) are simulated once
        parts = [f, b, sf, sb, *zero]
        k, width = len(plans), cs.p  # rows: the K plans, then the K without communication (sends and ZeRO terms 0)
        rows = np.zeros((2 * k, len(parts) * width))
        for i, x in enumerate(parts):
            rows[:k, i * width:(i + 1) * width] = x
        rows[k:, :width] = self.free_f
        rows[k:, width:2 * width] = self.free_b
        first: dict[bytes, int] = {}
        kept: list[int] = []
        inverse = []
        flat, size = rows.tobytes(), rows.shape[1] * rows.itemsize  # each row's bytes, sliced from one copy
        for r in range(2 * k):
            j = first.setdefault(flat[r * size:(r + 1) * size], len(kept))
            if j == len(kept):
                kept.append(r)
            inverse.append(j)
        self.inverse = np.array(inverse, dtype=np.int64)
        unique = rows[kept]
        split = [unique[:, i * width:(i + 1) * width] for i in range(len(parts))]
        self.item = (cs, *split[:4])
        self.zero = split[4:] or None  # the ZeRO-2/3 terms of the unique rows
        self.dp_end: np.ndarray | None = None  # per unique row and device: the dp stream's end (ZeRO-2/3)

    def work(self, k: int) -> list[DeviceWork]:
        """What the engine needs of the group's ``k``-th plan, per device (its events)."""
        pr = self.plans[k]
        zero = [z[k].tolist() for z in self.zero_split] or [[0.0] * self.cs.p] * 3
        return [DeviceWork(fwd_s=float(self.f[k, s]), bwd_s=float(self.b[k, s]), tp_fwd_s=float(self.tf[k, s]),
                           tp_bwd_s=float(self.tb[k, s]), send_fwd_s=float(self.sf[k, s]), send_bwd_s=float(self.sb[k, s]),
                           zero_fwd_s=zero[0][s], zero_bwd_pre_s=zero[1][s], zero_bwd_post_s=zero[2][s],
                           dp_buckets_s=tuple(tau for tau, n in zip(pr.runs_tau[s].tolist(), pr.runs_count[s].tolist())
                                              for _ in range(int(n))),
                           optimizer_s=float(pr.optimizer[s]), after_step_s=float(pr.after_step[s]),
                           overlap_dp=pr.config.overlap_grad_reduce, tied_s=float(pr.tied[s]))
                for s in range(self.cs.p)]


def run_batches(plans: Sequence[StagePlan]) -> list[Batch]:
    """Run ``plans`` (the numbers only): plans that share a schedule together, every schedule in
    one pass of the recurrence, then each batch of plans with as many devices in one tail."""
    groups: dict[tuple, list[tuple[int, StagePlan]]] = defaultdict(list)
    for i, plan in enumerate(plans):
        c = plan.config
        groups[(c.schedule, c.pp_size, c.num_micro_batches, c.chunks, plan.zero_mb is not None)].append((i, plan))
    staged = [(members, _Split(schedule, p, m, v, [pr for _, pr in members])) for (schedule, p, m, v, _), members in groups.items()]
    by_p: dict[int, list[tuple[list, _Split, np.ndarray]]] = defaultdict(list)
    plain = [(members, sim) for members, sim in staged if sim.zero is None]
    # every schedule without ZeRO-2/3 in one pass; only each device's last step is read
    ends = pipeline_end_times_many([sim.item for _, sim in plain], [sim.cs.last_step for _, sim in plain])
    for (members, sim), end in zip(plain, ends):
        by_p[sim.cs.p].append((members, sim, end))
    zero = [(members, sim) for members, sim in staged if sim.zero is not None]
    if zero:  # ZeRO-2/3: the recurrence with the dp stream per step, in one pass too
        ends, dps = pipeline_end_times_many([sim.item for _, sim in zero], [sim.cs.last_step for _, sim in zero],
                                            zero_terms=[sim.zero for _, sim in zero])
        for (members, sim), end, dp in zip(zero, ends, dps):
            sim.dp_end = dp
            by_p[sim.cs.p].append((members, sim, end))
    return [_batch(batch) for batch in by_p.values()]


def _batch(groups: list[tuple[list[tuple[int, StagePlan]], _Split, np.ndarray]]) -> Batch:
    """The tails of groups with as many devices (their end times: ``[2K, p]`` each, the pipeline
    with communication, then without), in the groups' order."""
    plans = [pr for _, sim, _ in groups for pr in sim.plans]
    ends = [end[sim.inverse] for _, sim, end in groups]  # compute end per device (the last steps' end times)
    ce_full = np.concatenate([e[:len(sim.plans)] for (_, sim, _), e in zip(groups, ends)])
    ce_free = np.concatenate([e[len(sim.plans):] for (_, sim, _), e in zip(groups, ends)])
    b = np.concatenate([sim.b for _, sim, _ in groups])
    free_b = np.concatenate([sim.free_b for _, sim, _ in groups])
    free_busy = np.concatenate([device_sums(sim.cs, sim.free_f, sim.free_b) for _, sim, _ in groups])
    stream = np.concatenate([sim.dp_end[sim.inverse[:len(sim.plans)]] if sim.dp_end is not None  # ZeRO-2/3's dp stream
                             else np.zeros((len(sim.plans), sim.cs.p)) for _, sim, _ in groups])
    overlap = np.array([pr.config.overlap_grad_reduce for pr in plans])[:, None]
    runs_tau = np.array([pr.runs_tau for pr in plans])
    runs_count = np.array([pr.runs_count for pr in plans])
    used = np.flatnonzero(runs_count.any(axis=(0, 1)))  # runs no plan has are dropped (a run of no buckets adds nothing)
    r = int(used[-1]) + 1 if used.size else 0
    opt, none = np.array([pr.optimizer for pr in plans]), np.zeros_like(ce_full)
    tail = iteration_tail(ce_full, b, stream, runs_tau[..., :r], runs_count[..., :r], overlap, np.array([pr.tied for pr in plans]),
                          opt, np.array([pr.after_step for pr in plans]))
    free = iteration_tail(ce_free, free_b, none, runs_tau[..., :0], runs_count[..., :0], False, none, opt, none)
    return Batch(plans, [i for members, _, _ in groups for i, _ in members], tail.end.max(axis=1), tail.end, ce_full,
                 tail.reduced - ce_full, free.end.max(axis=1), ce_free, free_busy,
                 [(sim, k) for _, sim, _ in groups for k in range(len(sim.plans))])


def run(plans: Sequence[StagePlan], events: bool = False) -> list[PlanRun]:
    """The run of each of ``plans`` (module docstring), in their order; ``events``: with the
    timeline's events (:func:`dml2comm.sim.engine.simulate` on the same split, whose numbers are
    the batch's: the same recurrence and tail)."""
    out: list[PlanRun | None] = [None] * len(plans)
    for batch in run_batches(plans):
        for j, (i, (sim, k)) in enumerate(zip(batch.index, batch.splits)):
            free = FreeRun(float(batch.free_iteration_s[j]), tuple(batch.free_compute_end_s[j].tolist()),
                           tuple(batch.free_busy_s[j].tolist()))
            timeline = simulate(sim.cs, sim.work(k), keep_events=True) if events else _result(batch, j, sim.cs, sim, k)
            out[i] = PlanRun(plans[i], timeline, free)
    return out  # type: ignore[return-value]


def _result(batch: Batch, j: int, cs: CompiledSchedule, sim: _Split, k: int) -> SimResult:
    """Row ``j`` of ``batch`` as the engine's result without events."""
    return SimResult(
        iteration_time_s=float(batch.iteration_s[j]),
        device_end_s=tuple(batch.device_end_s[j].tolist()),
        compute_end_s=tuple(batch.compute_end_s[j].tolist()),
        compute_busy_s=tuple(device_sums(cs, sim.f[k:k + 1], sim.b[k:k + 1])[0].tolist()),
        tp_s=tuple(device_sums(cs, sim.tf[k:k + 1], sim.tb[k:k + 1])[0].tolist()),
        dp_exposed_s=tuple(batch.dp_exposed_s[j].tolist()),
    )
