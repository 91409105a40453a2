"""The iteration simulator's recurrence, vectorised: one configuration or many at once.

A schedule is compiled once per ``(schedule, p, m, v)`` into flat step arrays, the steps are
grouped by their depth in the dependency graph (a step's depth exceeds the depth of the step
before it on its device and of the step whose output it needs), and each depth is one
vectorised update for all steps in it and all ``K`` configurations of a batch::

    end[i] = max(end[previous step on the device], pp[needed step]) + duration[i]
    pp[i]  = max(end[i], pp[previous step on the device]) + send[i]

A step starts when its device is free and its input has arrived; a step's output leaves on
its device's pp stream when the step has ended and the device's previous send has gone
(``pp[i]``: when the stream is free after step ``i``, which is when its output arrives), and
``send[i]`` is 0 for a step whose output stays on the device (the last virtual stage's
forwards, the first one's backwards).  Such a step still sets ``pp[i] = max(end[i], pp[prev])``:
the stream is not busy in between, and every later send leaves after ``end[i]`` anyway
(durations are not negative).  Per-micro-batch data-parallel collectives (ZeRO-2/3) add the
device's dp stream per step (:func:`pipeline_steps` with ``zero``).

Three users: :func:`dml2comm.sim.engine.simulate` runs :func:`pipeline_steps` for one
configuration (``K = 1``) and turns every step's start and end, every send, the ZeRO traffic and
the tail into the events of the timeline and ``trace.json``; the run of priced plans
(:mod:`dml2comm.model.run`, the analysis's and the sweep's) runs :func:`pipeline_end_times_many`,
the same update for many schedules and configurations in one pass, reading only the end times;
and ``tests/test_sim.py`` checks the two against each other and against schedules worked by hand.

Both then run one tail, :func:`iteration_tail`, on ``[K, p]`` arrays (the engine with
``K = 1``): the gradient buckets after or overlapping the device's last backward, the
tied-weight all-reduce, the optimizer step and any collective after it.  The buckets' end is the
bucket-by-bucket loop's to the last bit (:func:`_bucket_stream`, which the timeline's bucket
events read), computed a run of equal buckets at a time (:func:`_bucket_end`), so a sweep with
tens of thousands of buckets per device costs what the closed form
``max_i(ready_i + sum_{l >= i} tau_l)`` did (``tests/oracles.py`` keeps that closed form, which
the tests check the tail against to rounding).  :func:`device_sums` is the one order in which a
device's step times are summed (its busy and tensor-parallel time).
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass
from typing import NamedTuple, Sequence

import numpy as np

from dml2comm.errors import ConfigError
from dml2comm.parallel.config import Schedule
from dml2comm.parallel.schedule import (DeviceOrder, Step, StepKind, backward_index, backward_position, device_order,
                                        forward_index, forward_position)

__all__ = ["CompiledSchedule", "StepTimes", "Tail", "compile_schedule", "compile_steps", "pipeline_steps",
           "pipeline_end_times_zero", "pipeline_end_times_many", "iteration_tail", "device_sums"]


@dataclass(frozen=True)
class CompiledSchedule:
    p: int
    v: int
    num_steps: int
    forward: np.ndarray  # [S] bool
    last_step: np.ndarray  # [p] index of each device's last step
    last_backward: np.ndarray  # [p] index of each device's last backward step
    # the steps in depth order (what pipeline_end_times_many lays out), ``_o``: per position in it
    position: np.ndarray  # [S] position of each step
    level_sizes: np.ndarray  # [D] steps per depth
    level_starts: np.ndarray  # [D] first position of each depth
    prev_o: np.ndarray  # [S] position of the previous step on the device, or S
    need_o: np.ndarray  # [S] position of the needed step, or S
    forward_o: np.ndarray
    has_send: np.ndarray  # [S] bool: the step's output goes to another virtual stage (over its pp stream)
    has_send_o: np.ndarray
    device_order: DeviceOrder  # the schedule's order, each device's k-th forward and backward (micro_batch, chunk)

    @functools.cached_property
    def slot_o(self) -> np.ndarray:
        """[S] each position's row in its device's block of costs: ``4 (device) + 2 (sends?) +
        forward`` (:func:`_many_layout`)."""
        device_o = self._steps_in_order() // (self.num_steps // self.p)  # not kept: the timeline's device_o
        return (4 * device_o + 2 * self.has_send_o + self.forward_o).astype(np.int32)  # under 4 p

    @functools.cached_property
    def forward_by_position(self) -> np.ndarray:
        """``[2 m v, 1, p]`` bool, C order: whether each device's step at each position in its
        list is a forward (:func:`device_sums`' mask, broadcast over the configurations)."""
        return np.ascontiguousarray(self.forward.reshape(self.p, -1).T[:, None, :])

    @functools.cached_property
    def micro_batch(self) -> np.ndarray:
        """[S] micro-batch of each step (read by the timeline and :func:`compile_steps`, not by
        the batched run: built on first use)."""
        order = self.device_order
        return self._by_step(order.forward_micro_batch, order.backward_micro_batch)

    @functools.cached_property
    def chunk(self) -> np.ndarray:
        """[S] model chunk of each step (0 unless interleaved), as :attr:`micro_batch`."""
        order = self.device_order
        return self._by_step(order.forward_chunk, order.backward_chunk)

    def _by_step(self, forward_values: np.ndarray, backward_values: np.ndarray) -> np.ndarray:
        order = self.device_order
        first = (np.arange(self.p) * (2 * order.total))[:, None]  # each device's first step
        return _by_step(self.num_steps, first + order.forward_at, first + order.backward_at, forward_values, backward_values)

    @functools.cached_property
    def device(self) -> np.ndarray:
        """[S] device of each step (``p`` devices of ``2 m v`` steps each, in device order); built
        on first use, as :attr:`prev`: the batched run reads neither (a sweep holds some 180
        schedules of up to 80,000 steps)."""
        return np.repeat(np.arange(self.p), self.num_steps // self.p)

    @functools.cached_property
    def prev(self) -> np.ndarray:
        """[S] previous step on the device, or S (a device's first step: a zero column)."""
        step = np.arange(self.num_steps)
        return np.where(step % (self.num_steps // self.p) > 0, step - 1, self.num_steps)

    def _steps_in_order(self) -> np.ndarray:
        """[S] step at each position: the inverse of :attr:`position`."""
        out = np.empty(self.num_steps, dtype=np.int64)
        out[self.position] = np.arange(self.num_steps)
        return out

    @functools.cached_property
    def order(self) -> np.ndarray:
        """[S] step at each position (built on first use, as :attr:`depth`, :attr:`device`,
        :attr:`prev`, :attr:`need` and :attr:`device_o`: the sweep's batched run reads none of
        them, and a sweep holds some 180 schedules of up to 80,000 steps)."""
        return self._steps_in_order()

    @functools.cached_property
    def need(self) -> np.ndarray:
        """[S] step whose output this one needs, or S."""
        return np.append(self.order, self.num_steps)[self.need_o[self.position]]

    @functools.cached_property
    def device_o(self) -> np.ndarray:
        """[S] device of the step at each position."""
        return self.order // (self.num_steps // self.p)

    @functools.cached_property
    def depth(self) -> np.ndarray:
        """[S] depth of each step (its position's depth; built on first use)."""
        return np.repeat(np.arange(len(self.level_sizes)), self.level_sizes)[self.position]

    @functools.cached_property
    def level_bounds(self) -> list[tuple[int, int]]:
        """Per depth, its first position and the one after its last (in :attr:`order`)."""
        return list(zip(self.level_starts.tolist(), (self.level_starts + self.level_sizes).tolist()))

    @functools.cached_property
    def scan_order(self) -> np.ndarray:
        """The steps in the order of a scan that runs each device, first to last, as far as its
        inputs allow, and repeats until every step has run: the order of :func:`simulate`'s
        events (the per-step loop that this recurrence replaced emitted them so, and the trace
        and timeline keep it).  Step ``i`` on device ``d`` runs in visit ``(round, d)`` keyed
        ``round * p + d``: the visit of the step before it, or the first visit of ``d`` after
        the one that ran the step it needs (the same round if that device comes first, else the
        next), whichever is later."""
        p, n = self.p, self.num_steps
        key = np.full(n + 1, -1, dtype=np.int64)  # by position; slot n: no step
        for a, b in self.level_bounds:
            d = self.device_o[a:b]
            kn = key[self.need_o[a:b]]
            after = np.where(kn < 0, -1, kn - kn % p + d + np.where(kn % p > d, p, 0))
            key[a:b] = np.maximum(np.maximum(key[self.prev_o[a:b]], after), d)
        return np.argsort(key[self.position], kind="stable")

    @functools.cached_property
    def labels(self) -> list[str]:
        """Each step's name: ``F``/``B``, the micro-batch, and ``.chunk`` when interleaved (``B3.1``)."""
        kind = np.where(self.forward, "F", "B").tolist()
        mb = self.micro_batch.tolist()
        if self.v == 1:
            return [f"{k}{b}" for k, b in zip(kind, mb)]
        return [f"{k}{b}.{c}" for k, b, c in zip(kind, mb, self.chunk.tolist())]

    @functools.cached_property
    def receiver(self) -> np.ndarray:
        """[S] the step that needs each step's output, or -1 (the output stays on the device)."""
        out = np.full(self.num_steps + 1, -1, dtype=np.int64)
        out[self.need] = np.arange(self.num_steps)
        return out[:-1]


@functools.lru_cache(maxsize=256)
def compile_schedule(name: str, p: int, m: int, v: int = 1) -> CompiledSchedule:
    """Flat arrays and depth groups of a schedule's order (:func:`dml2comm.parallel.schedule.device_order`,
    the one place the order is written; ``tests/oracles.py`` writes the same orders step by step):
    every device's k-th forward and backward placed in its list, and each step's dependency on
    the neighbouring virtual stage's step with the same micro-batch."""
    order = device_order(name, p, m, v)
    name, v, warm, total = order.name, order.v, order.warm, order.total
    two = 2 * total
    s = np.arange(p)
    mb_f, chunk_f, mb_b, chunk_b = order.forward_micro_batch, order.forward_chunk, order.backward_micro_batch, order.backward_chunk
    n = p * two
    forward = np.zeros(n, dtype=bool)
    need = np.full(n, n, dtype=np.int64)
    last_vs = p * v - 1
    # [p, T]: device d's k-th forward and backward (all devices at once)
    d = s[:, None]
    pf = d * two + order.forward_at
    pb = d * two + order.backward_at
    forward[pf.ravel()] = True
    vs = chunk_f * p + d
    up = vs - 1  # forward needs the previous virtual stage's output
    ok = vs > 0
    dev = up % p
    kk = forward_index(mb_f, up // p, p, v)
    need[pf[ok]] = (dev * two + forward_position(warm[dev], kk))[ok]
    vs = chunk_b * p + d
    down = vs + 1  # backward needs the next virtual stage's gradient
    ok = vs < last_vs
    dev = down % p
    kk = backward_index(name, mb_b, down // p, p, m, v)
    need[pb[ok]] = (dev * two + backward_position(warm[dev], kk, total))[ok]
    pos = np.tile(np.arange(two), p)
    prev = np.where(pos > 0, np.arange(n) - 1, n)
    if name is Schedule.ONE_F_ONE_B:
        depth = _one_f_one_b_depths(p, m)
    elif name is Schedule.INTERLEAVED:
        depth = _stretched_depths(p, m, v)
    else:
        depth = None
    if depth is None or not _is_layering(depth, prev, need):
        depth = _depths(pos.reshape(p, two)[0], need, p)
    return _grouped(p, v, forward, prev, need, depth, order)


def _by_step(n: int, pf: np.ndarray, pb: np.ndarray, forward_values: np.ndarray, backward_values: np.ndarray) -> np.ndarray:
    """A per-step array from the k-th forward's and k-th backward's values (``pf``/``pb``: the
    [p, T] positions of those steps)."""
    out = np.empty(n, dtype=np.int64)
    out[pf.ravel()] = np.broadcast_to(forward_values, pf.shape).ravel()
    out[pb.ravel()] = np.broadcast_to(backward_values, pb.shape).ravel()
    return out


def _grouped(p: int, v: int, forward: np.ndarray, prev: np.ndarray, need: np.ndarray, depth: np.ndarray,
             order_of: DeviceOrder) -> CompiledSchedule:
    """A schedule's steps (``p`` devices of ``2 m v`` steps each, in device order) grouped by
    depth: the order the recurrence visits them, each depth's size and start, the positions of
    each step's predecessor and of the step it needs, and which steps send their output."""
    n = forward.size
    two = n // p
    order = np.argsort(depth, kind="stable")
    sizes = np.bincount(depth)
    starts = np.zeros(len(sizes), dtype=np.int64)
    np.cumsum(sizes[:-1], out=starts[1:])
    last_step = np.arange(p) * two + two - 1
    last_backward = last_step.copy()  # every order ends with a backward
    position = np.empty(n + 1, dtype=np.int64)
    position[order] = np.arange(n)
    position[n] = n
    need_o = need[order]
    has_send = np.zeros(n + 1, dtype=bool)
    has_send[need] = True  # a step some step needs sends it its output (slot n: no need)
    has_send = has_send[:n]
    return CompiledSchedule(p, v, n, forward, last_step, last_backward, position[:n], sizes, starts, position[prev[order]],
                            position[need_o], forward[order], has_send, has_send[order], order_of)


def compile_steps(schedule: Sequence[Sequence[Step]], v: int = 1) -> CompiledSchedule:
    """The compiled form of per-device step lists of one of the schedules (``v`` model chunks per
    device; :mod:`dml2comm.parallel.schedule`): the name, ``p`` and ``m`` are read off the lists, and the
    lists are checked to be that schedule's, step for step.

    Raises
    ------
    ConfigError
        The lists are not a gpipe, 1f1b or interleaved schedule.
    """
    p = len(schedule)
    lengths = {len(steps) for steps in schedule}
    per = next(iter(lengths)) if len(lengths) == 1 else -1
    if p and per > 0 and per % (2 * v) == 0:
        m = per // (2 * v)
        flat = np.array([(s.kind is StepKind.FORWARD, s.micro_batch, s.chunk) for steps in schedule for s in steps],
                        dtype=np.int64).reshape(-1, 3)
        for name in ("interleaved",) if v > 1 else ("1f1b", "gpipe"):
            try:
                cs = compile_schedule(name, p, m, v)
            except ConfigError:
                continue
            if (cs.v == v and np.array_equal(flat[:, 0], cs.forward) and np.array_equal(flat[:, 1], cs.micro_batch)
                    and np.array_equal(flat[:, 2], cs.chunk)):
                return cs
    raise ConfigError(f"the simulator runs the gpipe, 1f1b and interleaved schedules (parallel.schedule); these {p} step lists "
                      f"with {v} model chunks are none of them: compile one with sim.levels.compile_schedule")


def _stretched_depths(p: int, m: int, v: int) -> np.ndarray | None:
    """Depths of the interleaved schedule with more than ``2 p`` micro-batches from those of
    ``2 p`` (compiled once per ``(p, v)``), or None when ``m`` is not larger.

    In the steady 1F1B phase every device runs one forward and one backward in turn, and its
    depth rises by one a position (depth - position stays constant); ``p`` more micro-batches
    add ``2 p v`` steady positions to each device and leave the warm-up and the cooldown as they
    were.  With ``2 p`` micro-batches the middle position ``2 p v`` of every device is steady (the
    most warm-up forwards, device 0's ``(v + 1) p - 2``, are fewer than ``2 p v``), so the
    depths of ``m`` are those of ``2 p`` with their offsets at the middle repeated over the
    extra positions.  The caller checks the result is a valid layering; ``tests/test_sim.py``
    checks it equals :func:`_depths` (the longest chains, so no more depths than needed)."""
    base_m = 2 * p
    if m <= base_m:
        return None
    base = compile_schedule(Schedule.INTERLEAVED, p, base_m, v).depth
    mid, total = base_m * v, m * v  # the middle position of the base's 2 m v, and this schedule's forwards
    offset = base.reshape(p, 2 * mid) - np.arange(2 * mid)
    if not np.array_equal(offset[:, mid - 1], offset[:, mid]):  # pragma: no cover - steady there (docstring)
        return None
    extra = 2 * (total - mid)
    out = np.empty((p, 2 * total), dtype=np.int64)
    out[:, :mid] = offset[:, :mid]
    out[:, mid:mid + extra] = offset[:, mid:mid + 1]
    out[:, mid + extra:] = offset[:, mid:]
    out += np.arange(2 * total)
    return out.ravel()


def _one_f_one_b_depths(p: int, m: int) -> np.ndarray:
    """Depths of 1F1B in closed form (unit-time 1F1B: device ``s`` starts ``s`` levels late,
    waits for the pipeline to fill after its ``w = min(p - s - 1, m)`` warm-up forwards, then
    drains one level later per cooldown step); equal to :func:`_depths` for every ``m``
    (``tests/test_sim.py``), and checked to be a valid layering before use.

    With fewer micro-batches than devices, a device with ``p - s - 1 >= m`` runs all its
    forwards first (its position ``m`` is its first backward, not a forward), and its backwards
    wait on the chain of backwards coming back from device ``p - m - 1``: ``p - s - 1 - m``
    levels later than the drain alone."""
    two = 2 * m
    s = np.arange(p)[:, None]
    pos = np.arange(two)[None, :]
    w = np.minimum(p - s - 1, m)
    warm = (pos < w) | ((pos == w) & (w < m))
    drain = p - 1 + pos - (two - w - 1) + np.maximum(p - 1 - s - m, 0)
    off = np.where(warm, s, np.where(pos < two - w, p - 1, drain))
    return (pos + off).ravel()


def _is_layering(depth: np.ndarray, prev: np.ndarray, need: np.ndarray) -> bool:
    """Every step deeper than the step before it on its device and the step it needs: what the
    batched simulation requires of its levels."""
    padded = np.append(depth, -1)
    return bool(np.all(depth > padded[prev]) and np.all(depth > padded[need]))


def _depths(pos: np.ndarray, need: np.ndarray, p: int) -> np.ndarray:
    """Longest dependency chain ending at each step (``p`` devices of ``len(pos)`` steps).

    Gauss-Seidel relaxation, a device at a time: a device's depths are raised to one more than
    the steps they need, then along the device by a running maximum of depth - position (the
    chain ``depth[i] >= depth[i - 1] + 1``).  Sweeping the devices first to last carries
    forward chains across the whole pipeline in one sweep, last to first the backward ones;
    alternating sweeps converge after a few (as many as the longest chain changes direction).
    A step that needs none reads slot ``n``, a depth below every other, so each relaxation is a
    few whole-row array operations.
    """
    n = len(need)
    two = len(pos)
    depth = np.empty(n + 1, dtype=np.int64)
    depth[:n] = np.tile(pos, p)
    depth[n] = -n - 1  # no step: below every depth - position
    rows = depth[:n].reshape(p, two)
    below = pos - 1  # depth - position from a needed step's depth: depth[need] + 1 - position
    needs = []
    for d in range(p):
        nd = need[d * two:(d + 1) * two]
        needs.append((nd, set((nd[nd < n] // two).tolist())))
    stamp = [0] * p  # when each device's depths last changed
    seen = [-1] * p  # the time each device was last relaxed
    clock = 0
    for _ in range(n + 1):
        changed = False
        for devices in (range(p), range(p - 1, -1, -1)):
            for d in devices:
                src, sources = needs[d]
                clock += 1
                if seen[d] >= 0 and all(stamp[e] < seen[d] for e in sources):
                    continue  # nothing it reads changed since it was last relaxed
                seen[d] = clock
                row = rows[d]
                new = depth[src]
                new -= below
                np.maximum(new, row - pos, out=new)
                np.maximum.accumulate(new, out=new)
                new += pos
                if (new != row).any():  # it only rises: any difference is a change
                    row[:] = new
                    stamp[d] = clock
                    changed = True
        if not changed:
            return depth[:n]
    raise ValueError("the pipeline schedule deadlocks")  # pragma: no cover - the schedules' orders never do


@dataclass(frozen=True)
class StepTimes:
    """Every step's times for ``K`` configurations, ``[K, S]`` each (steps in schedule order)."""

    start: np.ndarray
    end: np.ndarray
    send_start: np.ndarray  # when the step's output leaves on its device's pp stream
    arrival: np.ndarray  # when that stream is free after the step: its output arrived
    gather_start: np.ndarray  # the ZeRO-3 all-gather before the step (where it has one)
    scatter_start: np.ndarray  # the ZeRO-2/3 reduce-scatter after the step (a backward with one)
    dp: np.ndarray  # when the device's dp stream is free after the step


def _advance(end_prev: np.ndarray, pp_need: np.ndarray, pp_prev: np.ndarray, dur: np.ndarray, send: np.ndarray,
             end_out: np.ndarray, pp_out: np.ndarray, start_out: np.ndarray | None = None,
             queued_out: np.ndarray | None = None, zero: tuple | None = None) -> None:
    """One depth of the recurrence (:func:`pipeline_steps`' docstring), for every step of the
    depth and every configuration at once, whatever the layout: the inputs are the gathered
    values of each step's previous step on its device (``end_prev``, ``pp_prev``; copies, which
    it overwrites) and of its needed step (``pp_need``), its duration and send; it writes the
    steps' end and pp-stream times (``end_out``, ``pp_out``) and, when given, their start and
    the time their send leaves (``start_out``, ``queued_out``).

    ``zero``: the dp stream, ``(dp_prev, st_prev, pre, pre_mask, post, post_mask, dp_out,
    gather_out, scatter_out)``: the previous step's dp-stream time and start (copies), the
    all-gather before and reduce-scatter after the step with their masks (0, or -inf where the
    step has none: added before a maximum, so that a term of 0 leaves the step and the stream
    alone without a branch), and the outputs (the dp stream after the step; when given, the
    all-gather's and the reduce-scatter's starts)."""
    maximum, add = np.maximum, np.add
    if zero is None:
        started = maximum(end_prev, pp_need, out=end_prev if start_out is None else start_out)  # device free, input arrived
    else:
        dp_prev, st_prev, pre, pre_mask, post, post_mask, dp_out, gather_out, scatter_out = zero
        ready = maximum(end_prev, pp_need, out=end_prev)
        gather = maximum(dp_prev, st_prev, out=st_prev if gather_out is None else gather_out)  # prefetched when j started
        gathered = add(gather, pre, out=st_prev if gather_out is None else None)
        gathered += pre_mask  # -inf: no all-gather
        started = maximum(ready, gathered, out=start_out)
    ended = add(started, dur, out=end_out)
    if zero is not None:
        stream = maximum(dp_prev, gathered, out=dp_prev)
        scatter = maximum(stream, ended + post_mask, out=stream if scatter_out is None else scatter_out)  # -inf: none
        add(scatter, post, out=dp_out)
    queued = maximum(ended, pp_prev, out=pp_prev if queued_out is None else queued_out)  # ended, and the stream free
    add(queued, send, out=pp_out)


def pipeline_steps(cs: CompiledSchedule, fwd_s: np.ndarray, bwd_s: np.ndarray, send_fwd_s: np.ndarray, send_bwd_s: np.ndarray,
                   zero: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> StepTimes:
    """The recurrence, every step's times, for ``K`` configurations' per-device costs ``[K, p]``
    (per model chunk under interleaving); ``send_fwd_s``/``send_bwd_s``: a device's send of an
    activation to the next virtual stage / of a gradient to the previous one; ``zero``: the
    per-micro-batch ZeRO-2/3 terms ``(zero_fwd, zero_bwd_pre, zero_bwd_post)`` on the dp stream.

    Per step ``i`` after step ``j`` on its device (``dp[j]``: the dp stream free after ``j``,
    ``st[j]``: when ``j`` started; no step: 0)::

        ready  = max(end[j], pp[needed step])
        ag     = max(dp[j], st[j])                  # ZeRO-3 all-gather, prefetched when j started
        st[i]  = max(ready, ag + pre_i)   if pre_i > 0 else ready
        end[i] = st[i] + duration_i
        dp[i]  = ag + pre_i if pre_i > 0 else dp[j];  then, after a backward with a reduce-scatter,
        rs     = max(dp[i], end[i]);  dp[i] = rs + post_i
        q[i]   = max(end[i], pp[j]);  pp[i] = q[i] + send_i     # the send queues on the pp stream

    ``pre_i`` is the forward or backward all-gather, ``post_i`` the reduce-scatter (backward
    only); a term of 0 leaves the stream and the step alone.  With ``K = 1`` this is the
    simulation of one iteration (:func:`dml2comm.sim.engine.simulate` turns it into events)."""
    k = fwd_s.shape[0]
    dev, fw = cs.device_o, cs.forward_o
    # [S + 1, K] by position (depth by depth, so that a depth is a slice); row S: no step (zeros);
    # one configuration: [S + 1] (numpy gathers 1-d items faster than rows)
    shape = (cs.num_steps + 1, k) if k > 1 else (cs.num_steps + 1,)

    def by_position(values: np.ndarray) -> np.ndarray:  # [K, S] -> [S + 1, K]
        out = np.zeros(shape)
        out[:-1] = values.T if k > 1 else values[0]
        return out

    dur = by_position(np.where(fw, fwd_s[:, dev], bwd_s[:, dev]))
    send = by_position(np.where(cs.has_send_o, np.where(fw, send_fwd_s[:, dev], send_bwd_s[:, dev]), 0.0))
    end, pp, st, queued = np.zeros(shape), np.zeros(shape), np.zeros(shape), np.zeros(shape)
    prev, need = cs.prev_o, cs.need_o
    pos = cs.position

    def by_step(values: np.ndarray) -> np.ndarray:  # [S + 1, K] -> [K, S]
        return values[pos].T if k > 1 else values[pos][None, :]

    if zero is None:
        for a, b in cs.level_bounds:
            before = prev[a:b]
            _advance(end[before], pp[need[a:b]], pp[before], dur[a:b], send[a:b], end[a:b], pp[a:b], st[a:b], queued[a:b])
        nothing = np.zeros((k, cs.num_steps))
        return StepTimes(by_step(st), by_step(end), by_step(queued), by_step(pp), nothing, nothing, nothing)
    zero_fwd_s, zero_bwd_pre_s, zero_bwd_post_s = zero
    pre = np.where(fw, zero_fwd_s[:, dev], zero_bwd_pre_s[:, dev])
    post = np.where(fw, 0.0, zero_bwd_post_s[:, dev])
    no_pre = by_position(np.where(pre > 0, 0.0, -np.inf))  # _advance's masks
    no_post = by_position(np.where(post > 0, 0.0, -np.inf))
    pre, post = by_position(pre), by_position(post)
    dp, ag, rs = np.zeros(shape), np.zeros(shape), np.zeros(shape)
    for a, b in cs.level_bounds:
        before = prev[a:b]
        _advance(end[before], pp[need[a:b]], pp[before], dur[a:b], send[a:b], end[a:b], pp[a:b], st[a:b], queued[a:b],
                 (dp[before], st[before], pre[a:b], no_pre[a:b], post[a:b], no_post[a:b], dp[a:b], ag[a:b], rs[a:b]))
    return StepTimes(by_step(st), by_step(end), by_step(queued), by_step(pp), by_step(ag), by_step(rs), by_step(dp))


def pipeline_end_times_zero(cs: CompiledSchedule, fwd_s: np.ndarray, bwd_s: np.ndarray, send_fwd_s: np.ndarray,
                            send_bwd_s: np.ndarray, zero_fwd_s: np.ndarray, zero_bwd_pre_s: np.ndarray,
                            zero_bwd_post_s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`pipeline_steps` with the per-micro-batch ZeRO-2/3 collectives on each device's dp
    stream (``[K, p]`` each, per model chunk): the end time of every step and when the device's
    dp stream is free after it (``[K, S]`` each)."""
    times = pipeline_steps(cs, fwd_s, bwd_s, send_fwd_s, send_bwd_s, (zero_fwd_s, zero_bwd_pre_s, zero_bwd_post_s))
    return times.end, times.dp


def pipeline_end_times_many(items: list[tuple[CompiledSchedule, np.ndarray, np.ndarray, np.ndarray, np.ndarray]],
                            columns: list[np.ndarray] | None = None,
                            zero_terms: list[tuple[np.ndarray, np.ndarray, np.ndarray]] | None = None):
    """:func:`pipeline_steps`' end times for several schedules at once: ``items`` are
    ``(schedule, fwd, bwd, send_fwd, send_bwd)``; returns each item's ``[K, S]`` end times, or
    ``[K, len(columns[i])]``, the end times of the steps ``columns[i]`` only.

    ``zero_terms``: per item, its ZeRO-2/3 terms ``(zero_fwd, zero_bwd_pre, zero_bwd_post)`` (``[K, p]``
    each): the recurrence of :func:`pipeline_end_times_zero`, and the result is a pair, the end
    times and the dp-stream times of the same steps.  Every depth is one call of
    :func:`_advance`, the update :func:`pipeline_steps` runs too (a term of 0 carried by a mask).

    Each item's configurations are cut into groups of ``w`` (zero-padded), and a group's steps
    become rows of ``w`` floats.  All rows go into one ``[rows, w]`` array of end times laid out
    depth by depth (a counting sort: depth ``L`` of every item, then depth ``L + 1``), beside
    one of pp-stream times, so one pass over the deepest schedule's depths updates every item,
    each depth with a few numpy calls on contiguous rows (:func:`_many_layout` builds the
    layout, :func:`_many_plain` / :func:`_many_zero` run the depths, :func:`_many_picked` reads
    the results back).  Durations and sends are read from small per-(item, group, device)
    tables through row indices: the setup builds three integers per row, no per-step floats.
    """
    if not items:
        return []
    lay = _many_layout(items, zero_terms)
    if zero_terms is not None:
        end, dp = _many_zero(lay)
        return _many_picked(items, columns, lay, end), _many_picked(items, columns, lay, dp)
    return _many_picked(items, columns, lay, _many_plain(lay))


class _ManyLayout(NamedTuple):
    """The row layout of :func:`pipeline_end_times_many` (its docstring): row ``r`` (depth by
    depth) reads its previous step's row ``prev[r]``, its needed step's ``need[r]`` and its costs'
    row ``cost_at[r]`` of the tables (``w``-float void items: :func:`_row_items`); ``rows_of``:
    per item, (the row of each position's group 0, groups, configurations)."""

    w: int
    rows: int  # rows of the end and pp arrays: the laid-out steps, then the zero rows
    row_type: np.dtype
    level_start: np.ndarray  # [depths + 1]: the first row of each depth
    prev: np.ndarray
    need: np.ndarray
    cost_at: np.ndarray
    durs: np.ndarray
    sends: np.ndarray
    zero: list[np.ndarray] | None  # the ZeRO tables: pre, its mask, post, its mask
    rows_of: list[tuple[np.ndarray, int, int]]


def _level_starts(items: list, groups: list[int]) -> np.ndarray:
    """The first row of each depth (and the total after the last): every item's groups of a
    depth's steps, counted over items (the counting sort's offsets)."""
    levels = max(len(cs.level_sizes) for cs, *_ in items)
    per_level = np.zeros(levels, dtype=np.int64)
    for (cs, *_), g in zip(items, groups):
        per_level[:len(cs.level_sizes)] += cs.level_sizes * g
    level_start = np.zeros(levels + 1, dtype=np.int64)
    np.cumsum(per_level, out=level_start[1:])
    return level_start


def _cost_block(g: int, w: int, *per_slot: np.ndarray) -> np.ndarray:
    """One item's per-device costs as a table ``w`` configurations wide: four ``[K, p]`` arrays,
    one per slot ``2 (sends?) + forward``, to ``[g p 4, w]``, row ``4 (device) + slot`` of group
    ``q`` at ``4 p q`` (configurations past ``K`` zero)."""
    k, p = per_slot[0].shape
    both = np.stack(per_slot, axis=-1)  # [K, p, 4]
    if g * w > k:
        both = np.concatenate([both, np.zeros((g * w - k, p, 4))])
    return both.reshape(g, w, p * 4).transpose(0, 2, 1).reshape(g * p * 4, w)


def _zero_blocks(g: int, w: int, zero: np.ndarray, terms: tuple[np.ndarray, np.ndarray, np.ndarray]) -> list[np.ndarray]:
    """One item's ZeRO tables (:func:`_cost_block`): the all-gather before a step, its mask (0
    where there is one, else -inf: :func:`_advance`), the reduce-scatter after a backward and its mask."""
    zf, zb, zr = terms
    no_ag_b, no_ag_f, no_rs = (np.where(x > 0, 0.0, -np.inf) for x in (zb, zf, zr))
    return [_cost_block(g, w, *values) for values in ((zb, zf, zb, zf), (no_ag_b, no_ag_f, no_ag_b, no_ag_f),
                                                      (zr, zero, zr, zero), (no_rs, zero - np.inf, no_rs, zero - np.inf))]


def _row_items(tables: list[np.ndarray], row_type: np.dtype) -> np.ndarray:
    """Tables' rows as single elements of a ``w``-float void type: numpy gathers 1-d items in
    about half the time it takes for rows of a 2-d array, and the element-wise calls see
    contiguous memory (np.concatenate keeps the inputs' memory order, which a transposed block
    can make Fortran's)."""
    return np.ascontiguousarray(np.concatenate(tables), dtype=np.float64).view(row_type).ravel()


def _many_layout(items: list, zero_terms: list | None) -> _ManyLayout:
    """The rows of every item's groups of steps, depth by depth, with their previous, needed
    and cost rows, and the cost tables (:func:`pipeline_end_times_many`).  Each item's rows are
    written in place (a scatter to their rows), so the setup holds three integers per row and
    no per-item copies of them."""
    w = _row_width([f.shape[0] for _, f, *_ in items], [cs.num_steps for cs, *_ in items])
    groups = [-(-f.shape[0] // w) for _, f, *_ in items]
    level_start = _level_starts(items, groups)
    total = int(level_start[-1])
    prior = np.zeros(len(level_start) - 1, dtype=np.int64)  # rows of earlier items already placed per depth
    # per-device costs of every (item, group) as small tables, w configurations wide: row
    # ``4 (device) + 2 (sends?) + forward`` of the item's block holds the step's duration and
    # its own send, the send 0 in the rows of steps whose output stays on the device
    dur_table, send_table = [], []
    zero_tables: tuple[list, list, list, list] = ([], [], [], [])  # pre, its mask, post, its mask
    rows_ints = _scratch(3 * total, np.int64)  # reused memory, as the depth loops' (:func:`_scratch`)
    prev, need, cost_at = (rows_ints[i * total:(i + 1) * total] for i in range(3))
    rows_of = []
    base = 0
    for item_index, ((cs, f, b, sf, sb), g) in enumerate(zip(items, groups)):
        p = cs.p
        # the row of (position j, group 0); group q is q rows further; a missing step reads the
        # zero rows after the last one
        # (depth L's positions are contiguous from level_starts[L]: row = level_start[L] + prior[L]
        # + (j - level_starts[L]) g, written as a per-depth shift plus j g)
        depths = len(cs.level_sizes)
        shift = level_start[:depths] + prior[:depths] - cs.level_starts * g
        row = np.repeat(shift, cs.level_sizes) + np.arange(cs.num_steps) * g
        ext = np.append(row, total)
        q = np.arange(g)
        at = (row[:, None] + q).ravel()
        prev[at] = (ext[cs.prev_o][:, None] + q).ravel()
        need[at] = (ext[cs.need_o][:, None] + q).ravel()
        cost_at[at] = (base + cs.slot_o[:, None] + 4 * p * q).ravel()
        zero = np.zeros_like(f)
        dur_table.append(_cost_block(g, w, b, f, b, f))
        send_table.append(_cost_block(g, w, zero, zero, sb, sf))
        if zero_terms is not None:
            for table, block in zip(zero_tables, _zero_blocks(g, w, zero, zero_terms[item_index])):
                table.append(block)
        prior[:len(cs.level_sizes)] += cs.level_sizes * g
        rows_of.append((row, g, f.shape[0]))
        base += g * p * 4
    row_type = np.dtype((np.void, 8 * w))
    return _ManyLayout(w, total + max(groups), row_type, level_start, prev, need, cost_at, _row_items(dur_table, row_type),
                       _row_items(send_table, row_type),
                       None if zero_terms is None else [_row_items(t, row_type) for t in zero_tables], rows_of)


def _many_plain(lay: _ManyLayout) -> np.ndarray:
    """The depth loop of :func:`pipeline_end_times_many`: every row's end time, ``[rows, w]``
    (the zero rows after the last step: what a missing step reads)."""
    w, row_type, prev, need, cost_at = lay.w, lay.row_type, lay.prev, lay.need, lay.cost_at
    end, pp = _many_state(lay, 2)  # pp: when the step's device's pp stream is free after it (its output arrived)
    # ``take`` of the 1-d row items: the cheapest gather numpy has for them
    end_at, pp_at, dur_at, send_at = end.view(row_type).take, pp.view(row_type).take, lay.durs.take, lay.sends.take
    f8 = np.float64
    for a, b_ in zip(lay.level_start[:-1].tolist(), lay.level_start[1:].tolist()):
        before, at = prev[a:b_], cost_at[a:b_]
        _advance(end_at(before).view(f8), pp_at(need[a:b_]).view(f8), pp_at(before).view(f8), dur_at(at).view(f8),
                 send_at(at).view(f8), end[a * w:b_ * w], pp[a * w:b_ * w])
    return end.reshape(lay.rows, w)


def _many_state(lay: _ManyLayout, count: int) -> list[np.ndarray]:
    """``count`` arrays of ``rows x w`` floats for the depth loops, zero in the rows after the
    last step (what a missing step reads); the other rows are left unset: each depth writes its
    own rows before a deeper one reads them (a step's depth exceeds its previous and needed
    steps' depths).  They are views of this thread's scratch (:func:`_scratch`), valid until the
    next call: the loops' results are copied out (:func:`_many_picked`) before it."""
    size = lay.rows * lay.w
    flat = _scratch(count * size)
    out = [flat[i * size:(i + 1) * size] for i in range(count)]
    for x in out:
        x[int(lay.level_start[-1]) * lay.w:] = 0.0
    return out


_SCRATCH = threading.local()


def _scratch(size: int, dtype: type = np.float64) -> np.ndarray:
    """``size`` floats (or ``dtype`` items: the layout's row indices) of this thread's scratch,
    kept between calls of :func:`pipeline_end_times_many`: a sweep's chunks each need tens of
    MB for their depth loops, and fresh memory costs a page fault per 4 KiB on first touch (the
    530B sweep: about 23,000 of them for the floats, a tenth of a second of system time on a
    shared 2-core machine; the row indices held too, about 3,500 fewer) where reused memory
    costs none.  It grows to the largest call's need and is held by the thread (a sweep's
    first chunk is its largest: ``search.sweep._chunks``).  The layout's indices and the
    loops' floats are separate buffers: both are in use at once."""
    name = np.dtype(dtype).name
    held = getattr(_SCRATCH, name, None)
    if held is None or held.size < size:
        held = np.empty(size, dtype=dtype)
        setattr(_SCRATCH, name, held)
    return held[:size]


def _many_zero(lay: _ManyLayout) -> tuple[np.ndarray, np.ndarray]:
    """The depth loop of :func:`pipeline_end_times_many` with the ZeRO dp stream (its
    docstring): every row's end time and dp-stream time, ``[rows, w]`` each."""
    w, row_type, prev, need, cost_at, durs, sends = lay.w, lay.row_type, lay.prev, lay.need, lay.cost_at, lay.durs, lay.sends
    pre_t, pre_mask, post_t, post_mask = lay.zero
    end, pp, dp, st = _many_state(lay, 4)
    end_rows, pp_rows, dp_rows, st_rows = (x.view(row_type) for x in (end, pp, dp, st))
    f8 = np.float64
    for a, b_ in zip(lay.level_start[:-1].tolist(), lay.level_start[1:].tolist()):
        before, at = prev[a:b_], cost_at[a:b_]
        _advance(end_rows[before].view(f8), pp_rows[need[a:b_]].view(f8), pp_rows[before].view(f8), durs[at].view(f8),
                 sends[at].view(f8), end[a * w:b_ * w], pp[a * w:b_ * w], st[a * w:b_ * w], None,
                 (dp_rows[before].view(f8), st_rows[before].view(f8), pre_t[at].view(f8), pre_mask[at].view(f8),
                  post_t[at].view(f8), post_mask[at].view(f8), dp[a * w:b_ * w], None, None))
    return end.reshape(lay.rows, w), dp.reshape(lay.rows, w)


def _many_picked(items: list, columns: list[np.ndarray] | None, lay: _ManyLayout, values: np.ndarray) -> list[np.ndarray]:
    """Per item, ``values`` (``[rows, w]``, a depth loop's result) of its steps (``columns[i]``,
    or all) for its configurations: ``[K, steps]``."""
    out = []
    for i, ((cs, *_), (row, g, k)) in enumerate(zip(items, lay.rows_of)):
        pos = cs.position if columns is None else cs.position[columns[i]]
        picked = values[row[pos][:, None] + np.arange(g)]  # [c, g, w]
        out.append(np.ascontiguousarray(picked.reshape(len(pos), g * lay.w)[:, :k].T))
    return out


def _row_width(ks: list[int], steps: list[int]) -> int:
    """Configurations per row: the width with the least padded work (a row costs about as much
    to move as four more floats)."""
    def cost(w: int) -> int:
        return sum(n * -(-k // w) * (w + 4) for k, n in zip(ks, steps))

    return min(range(1, min(max(ks), 16) + 1), key=cost)


def device_sums(cs: CompiledSchedule, fwd_s: np.ndarray, bwd_s: np.ndarray) -> np.ndarray:
    """Per device, the sum of its steps' durations (``fwd_s``/``bwd_s``: ``[K, p]``, per step) in
    program order, a running sum as the steps run: ``[K, p]``.  The one order every caller sums
    in (the timeline's busy and tensor-parallel times, the breakdown's compute), so that the
    sweep's numbers are the analysis's to the last bit.  Configurations with equal costs, bit for
    bit (a sweep's ZeRO-0 and ZeRO-1 rows), are summed once."""
    first: dict[bytes, int] = {}
    kept: list[int] = []
    inverse = []
    both = np.concatenate([fwd_s, bwd_s], axis=1)
    flat, size = both.tobytes(), both.shape[1] * both.itemsize  # each row's bytes, sliced from one copy
    for r in range(both.shape[0]):
        j = first.setdefault(flat[r * size:(r + 1) * size], len(kept))
        if j == len(kept):
            kept.append(r)
        inverse.append(j)
    repeated = len(kept) < len(inverse)
    if repeated:
        fwd_s, bwd_s = fwd_s[kept], bwd_s[kept]
    # [steps, K', p], C order, so that reducing the first axis adds the steps one after the
    # other in program order (numpy adds along an outer axis row by row; only along the
    # contiguous inner axis does it sum pairwise): the running sum's last value, without
    # writing the running sums (a cumsum's second [K', p, steps] array)
    # (np.where lays its result out as its operands: C order from the C-ordered mask, else made so)
    dur = np.ascontiguousarray(np.where(cs.forward_by_position, fwd_s, bwd_s))
    sums = np.add.reduce(dur, axis=0)
    return sums[inverse] if repeated else sums


@dataclass(frozen=True)
class Tail:
    """``K`` configurations' iterations after their pipelines, per device (``[K, p]``)."""

    bucket_start: np.ndarray | None  # [K, p, B] start of each gradient bucket (when asked for; B: the most buckets of a device)
    reduced: np.ndarray  # gradients reduced: the dp stream's end, at least the compute's
    tied_start: np.ndarray  # [K] the tied-weight all-reduce (one collective of every device with a copy; 0 if none)
    step_start: np.ndarray  # the optimizer step
    end: np.ndarray  # the device's iteration end (after any collective that follows the step)


#: Floats per array of :func:`_bucket_stream`'s chunks (bucket positions x devices), and how many
#: alternations of a chunk are taken as whole runs before the rest goes position by position.
_CHUNK_FLOATS = 1 << 19
_MAX_ROUNDS = 8


def iteration_tail(compute_end: np.ndarray, last_dur: np.ndarray, stream_free: np.ndarray, tau: np.ndarray, count: np.ndarray,
                   overlap: np.ndarray, tied_s: np.ndarray, optimizer_s: np.ndarray, after_step_s: np.ndarray,
                   starts: bool = False) -> Tail:
    """The data-parallel tail of ``K`` configurations, device by device (``[K, p]`` arrays; the
    gradient buckets as runs ``tau``, ``count`` ``[K, p, R]`` of equal buckets, in order; ``overlap``
    broadcasts against ``[K, p]``): the one tail the timeline and the sweep both run.

    The buckets go on the dp stream (free at ``stream_free``, after any ZeRO traffic), bucket
    ``i`` of ``n`` ready at ``compute_end - last_dur + last_dur (i + 1) / n`` during the last
    backward with ``overlap`` (PyTorch DDP / Megatron ``--overlap-grad-reduce``), else at
    ``compute_end``, each starting at ``max(previous bucket's end, ready)``; then the tied-weight
    all-reduce once every device holding a copy has reduced its gradients (Megatron-LM
    ``finalize_model_grads``: data-parallel sync, then ``_allreduce_embedding_grads``); the
    optimizer step; the collective after it (ZeRO-1/2 parameter all-gather).  ``starts``: keep
    every bucket's start (the timeline's events).

    The stream's end is the bucket-by-bucket loop's (:func:`_bucket_stream`) to the last bit,
    taken a run of equal buckets at a time (:func:`_bucket_end`), so it is the same whatever the
    batch and however many buckets a device has (``tests/test_model.py``); it equals the closed
    form ``max_i(ready_i + sum_{l >= i} tau_l)`` to rounding (``tests/oracles.py``, ``tests/test_sim.py``)."""
    last_start = compute_end - last_dur
    t = _bucket_end(last_start, last_dur, compute_end, stream_free, tau, count, overlap)
    bucket_start = _bucket_stream(last_start, last_dur, compute_end, stream_free, tau, count, overlap, True)[1] if starts else None
    reduced = np.maximum(t, compute_end)
    holders = tied_s > 0
    tied_start = np.where(holders, reduced, -np.inf).max(axis=-1, initial=-np.inf)
    tied_start = np.where(holders.any(axis=-1), tied_start, 0.0)
    step_start = np.where(holders, tied_start[..., None] + tied_s, reduced)
    return Tail(bucket_start, reduced, tied_start, step_start, step_start + optimizer_s + after_step_s)


def _bucket_end(start: np.ndarray, dur: np.ndarray, compute_end: np.ndarray, stream_free: np.ndarray, tau: np.ndarray,
                count: np.ndarray, overlap: np.ndarray) -> np.ndarray:
    """The dp stream's time after every device's buckets: :func:`_bucket_stream`'s end, to the
    last bit, without visiting every bucket.

    A run of ``c`` equal buckets after its first: while the stream is behind (``t >= ready``, as
    it stays when a bucket takes longer than the backward that fills the next one, or without
    overlap), ``t`` is ``t + tau`` repeated (:func:`_repeated_sum`, exact); while it keeps up
    (a bucket shorter than that), ``t`` after the run is ``ready_last + tau``.  A device whose
    run is neither (a bucket as long as its backward share, to within rounding, or a stream
    that catches up inside a run) goes bucket by bucket (:func:`_bucket_stream`)."""
    count = np.asarray(count, dtype=np.int64)
    total = count.sum(axis=-1)
    shape = total.shape
    t = np.array(np.broadcast_to(stream_free, shape), dtype=np.float64).ravel()
    if not t.size or not total.any():
        return t.reshape(shape)
    rows = t.size
    safe = np.maximum(total, 1).ravel()
    on = np.broadcast_to(overlap, shape).ravel()
    x0, d, ce = (np.broadcast_to(v, shape).ravel() for v in (start, dur, compute_end))
    taus, counts = np.asarray(tau, dtype=np.float64).reshape(rows, -1), count.reshape(rows, -1)
    slow = np.zeros(rows, dtype=bool)
    i = np.zeros(rows, dtype=np.int64)

    def ready(at: np.ndarray) -> np.ndarray:  # bucket ``at``'s ready time, as _bucket_stream computes it
        return np.where(on, x0 + d * (at + 1) / safe, ce)

    for r in range(taus.shape[1]):
        x, c = taus[:, r], counts[:, r]
        first = c > 0
        t = np.where(first, np.maximum(t, ready(i)) + x, t)  # the run's first bucket as the loop takes it
        i, c = i + first, c - first
        if not c.any():
            continue
        now, last = ready(i), ready(i + c - 1)
        gap = d / safe  # the backward share between two buckets' ready times
        # far above the few ulps (2^-52 relative) by which the rounded ready times and sums can
        # stray from the exact ones over a run: a closer call goes bucket by bucket
        margin = 1e-12 * (np.abs(t) + np.abs(x0) + d + x * c)
        behind = (c == 0) | ~on | (t >= last) | ((t >= now) & (x - gap > margin))
        keeps = ~behind & (t < now) & (gap - x > margin)
        t, tied = _repeated_sum(t, x, np.where(behind, c, 0))
        t = np.where(keeps, last + x, t)
        slow |= tied | ~(behind | keeps)
        i = i + c
    if slow.any():
        k = np.flatnonzero(slow)
        t[k] = _bucket_stream(x0[k], d[k], ce[k], np.broadcast_to(stream_free, shape).ravel()[k], taus[k], counts[k],
                              on[k], False)[0]
    return t.reshape(shape)


def _repeated_sum(t: np.ndarray, x: np.ndarray, n: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``t + x + x + ... + x`` (``n`` additions, in order, each rounded) for arrays, in a few
    steps: while the sum stays in one binade ``[2^e, 2^(e+1))`` (ulp ``u``) every addition of
    ``x`` adds the same multiple of ``u`` (``x / u`` rounded to the nearest integer), so ``k``
    additions are one multiplication; the addition that leaves the binade is made as it is.
    Also returns where an addition falls on a tie (``x / u`` ending in exactly one half, whose
    rounding goes to even and so alternates): those entries are not summed here."""
    t, n = t.copy(), np.where(x == 0, 0, n)
    tied = np.zeros(t.shape, dtype=bool)
    while True:
        go = (n > 0) & ~tied
        if not go.any():
            return t, tied
        if (t[go] <= 0).any():  # only positive sums are stepped by binades: the rest one at a time
            at = go & (t <= 0)
            t[at] += x[at]
            n[at] -= 1
            continue
        _, e = np.frexp(np.where(go, t, 1.0))
        # the ulp of [2^(e-1), 2^e), 2^-1074 at most below 2^-1021 (subnormals and the first
        # normal binade: IEEE 754 binary64), and the binade's top in ulps (2^53 above that)
        u = np.ldexp(1.0, np.maximum(e - 53, -1074))
        top = np.ldexp(1.0, e) / u
        q = x / u  # exact: a power-of-two scaling
        whole = np.floor(q)
        frac = q - whole
        tied |= go & (frac == 0.5)
        step = whole + (frac > 0.5)  # ulps added per addition
        m = t / u  # an integer in [top / 2, top)
        room = np.where(step > 0, np.floor((top - 1 - m) / np.maximum(step, 1)), 0.0)
        room = np.where(m + room * step > top - 1, room - 1, room)  # the division may have rounded up
        room[step == 0] = np.inf
        k = np.where(go & ~tied, np.minimum(n, room), 0)
        t = np.where(k > 0, (m + k * step) * u, t)
        n = n - k.astype(np.int64)
        cross = go & ~tied & (n > 0) & (step > 0)
        t[cross] += x[cross]  # the addition that leaves the binade
        n[cross] -= 1
        n[go & ~tied & (step == 0)] = 0  # x below half an ulp: the sum no longer moves


def _bucket_stream(start: np.ndarray, dur: np.ndarray, compute_end: np.ndarray, stream_free: np.ndarray, tau: np.ndarray,
                   count: np.ndarray, overlap: np.ndarray, keep: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """The dp stream's time after every device's buckets (:func:`iteration_tail`), and each
    bucket's start when ``keep``: ``t_(i+1) = max(t_i, ready_i) + tau_i``, bucket after bucket.

    Taken a chunk of bucket positions at a time, for every device at once, in runs rather than
    position by position: while the stream is behind (``t_i >= ready_i``), ``t`` is a running
    sum from the run's first value (one ``cumsum``, the same additions in the same order); while
    it keeps up (``ready_i > t_i``), ``t_(i+1) = ready_i + tau_i`` for every position at once.
    A device alternates between the two a few times (:func:`_chunk_runs`), so the work is a few
    array passes however many buckets it has (tens of thousands for a large stage)."""
    count = np.asarray(count, dtype=np.int64)
    total = count.sum(axis=-1)
    shape = total.shape
    width = int(total.max()) if total.size else 0
    t = np.array(np.broadcast_to(stream_free, shape), dtype=np.float64).ravel()
    if width == 0:
        return t.reshape(shape), (np.zeros(shape + (0,)) if keep else None)
    rows = t.size
    safe = np.maximum(total, 1).reshape(rows, 1)
    flat_total = total.reshape(rows, 1)
    overlap = np.broadcast_to(overlap, shape).reshape(rows, 1)
    start, dur = (np.broadcast_to(x, shape).reshape(rows, 1) for x in (start, dur))
    compute_end = np.broadcast_to(compute_end, shape).reshape(rows, 1)
    cum = np.cumsum(count, axis=-1).reshape(rows, 1, -1)
    padded = np.concatenate([np.asarray(tau, dtype=np.float64).reshape(rows, -1), np.zeros((rows, 1))], axis=-1)
    out = np.zeros((rows, width)) if keep else None
    step = max(8, _CHUNK_FLOATS // rows)
    for a in range(0, width, step):
        pos = np.arange(a, min(a + step, width))
        run = (cum <= pos[:, None]).sum(axis=-1)  # [rows, C]: the run of each position (R past the last)
        taus = np.take_along_axis(padded, run, axis=-1)  # 0 past a device's last bucket
        ready = np.where(pos < flat_total, np.where(overlap, start + dur * (pos + 1) / safe, compute_end), -np.inf)
        times = _chunk_runs(t, ready, taus)  # [rows, C + 1]: t before each position, and after the last
        if keep:
            out[:, a:a + len(pos)] = np.maximum(times[:, :-1], ready)
        t = times[:, -1]
    return t.reshape(shape), (out.reshape(shape + (width,)) if keep else None)


def _chunk_runs(t: np.ndarray, ready: np.ndarray, taus: np.ndarray) -> np.ndarray:
    """``t`` before every position of a chunk and after its last (``[rows, C + 1]``), from ``t``
    at its start, the buckets' ready times (``-inf`` past a device's last) and durations.

    A round takes each device's run behind the stream from its current position ``i0`` (the
    running sum ``S``, valid up to the first ``j`` with ``ready_j > S_j``), then its run keeping
    up from ``j`` (``t_(i+1) = ready_i + tau_i``, valid up to the first ``k`` with
    ``t_k > ready_k``), and starts the next round at ``k``; after :data:`_MAX_ROUNDS` rounds the
    devices still going finish position by position."""
    rows, c = ready.shape
    times = np.zeros((rows, c + 1))
    times[:, 0] = t
    up = ready + taus  # t after position i if the bucket waited for its gradients
    cols = np.arange(c + 1)
    live = np.arange(rows)
    i0 = np.zeros(rows, dtype=np.int64)
    for _ in range(_MAX_ROUNDS):
        if not live.size:
            return times
        first = i0[:, None]
        seq = np.where(cols == first, times[live, i0][:, None], 0.0)
        seq[:, 1:] += np.where(cols[1:] > first, taus[live], 0.0)
        behind = np.cumsum(seq, axis=1)  # exact: 0 + x = x before i0, then the sums in order
        late = (ready[live] > behind[:, :-1]) & (cols[:-1] >= first)
        has = late.any(axis=1)
        j = np.where(has, late.argmax(axis=1), c)
        mine = (cols >= first) & (cols <= j[:, None])
        times[live] = np.where(mine, behind, times[live])
        kept = np.zeros((live.size, c), dtype=bool)  # at k = column + 1: t_k > ready_k (the last column: none)
        kept[:, :-1] = (up[live, :-1] > ready[live, 1:]) & (cols[1:-1] > j[:, None])
        more = kept.any(axis=1) & has
        k = np.where(more, kept.argmax(axis=1) + 1, c)
        keeps = (cols > j[:, None]) & (cols <= k[:, None]) & has[:, None]
        times[live] = np.where(keeps, np.concatenate([np.zeros((live.size, 1)), up[live]], axis=1), times[live])
        live, i0 = live[more], k[more]
    for i in range(int(i0.min()) if live.size else c, c):  # what is left, position by position
        go = i0 <= i
        step_t = np.maximum(times[live, i], ready[live, i]) + taus[live, i]
        times[live, i + 1] = np.where(go, step_t, times[live, i + 1])
    return times
