"""The event simulation of :mod:`dml2comm.sim.engine`, vectorised: many iterations at once.

A sweep simulates thousands of configurations; the engine's per-step Python loop costs
milliseconds to tenths of a second each.  Here a schedule is compiled once per
``(schedule, p, m, v)`` into flat step arrays, the steps are grouped by their depth in the
dependency graph (a step's depth exceeds the depth of the step before it on its device and
of the step whose output it needs), and each depth is one vectorised update for all steps in
it and all ``K`` configurations of a batch::

    end[i] = max(end[previous step on the device], end[needed step] + send) + duration[i]

This is the engine's recurrence (a step starts when its device is free and its input has
arrived; sends leave when the producing step ends) with two simplifications, which the
sweep's fast path accepts and the tests bound:

- a device's sends are not queued behind one another (the engine serialises them on a pp
  stream; they only queue when a send outlasts the step after it);
- only works without per-micro-batch data-parallel collectives (ZeRO-2/3) are supported:
  the caller uses the engine for those.

The data-parallel tail (gradient buckets after or overlapping the device's last backward,
then the optimizer step and any collective after it) is evaluated in closed form: for
buckets of equal duration ``tau`` becoming ready at linearly spaced times, the stream's end
is ``max_i(ready_i + sum_{l >= i} tau_l)``, attained at an end of each run of equal buckets.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from dml2comm.sim.schedules import check_schedule

__all__ = ["CompiledSchedule", "compile_schedule", "pipeline_end_times", "bucket_tail_end", "bucket_tail_end_many", "pipeline_end_times_many"]


@dataclass(frozen=True)
class CompiledSchedule:
    p: int
    v: int
    num_steps: int
    device: np.ndarray  # [S] device of each step
    forward: np.ndarray  # [S] bool
    prev: np.ndarray  # [S] previous step on the device, or S (a zero column)
    need: np.ndarray  # [S] step whose output this one needs, or S
    depths: tuple[np.ndarray, ...]  # step indices per depth
    depth: np.ndarray  # [S] depth of each step
    last_step: np.ndarray  # [p] index of each device's last step
    last_backward: np.ndarray  # [p] index of each device's last backward step


@functools.lru_cache(maxsize=256)
def compile_schedule(name: str, p: int, m: int, v: int = 1) -> CompiledSchedule:
    """Flat arrays and depth groups of :func:`~dml2comm.sim.schedules.build_schedule`'s order.

    Built with array arithmetic rather than from the step lists: every device runs ``T = m v``
    forwards and ``T`` backwards; with ``W`` warm-up forwards (GPipe ``T``; 1F1B
    ``min(p - s - 1, m)``; interleaved ``min(2 (p - s - 1) + (v - 1) p, T)``) the k-th forward
    sits at position ``k`` (``k < W``) or ``2k - W``, the k-th backward at ``W + 2k + 1``
    (``k < T - W``) or ``T + k``.  The k-th op's micro-batch and chunk follow
    ``schedules._interleaved`` (GPipe runs its backwards last micro-batch first).
    """
    check_schedule(name, p, m, v)  # the same validation (and errors) as the engine's
    if name == "interleaved" and v < 2:
        name = "1f1b"
    if name != "interleaved":
        v = 1
    total = m * v
    two = 2 * total
    s = np.arange(p)
    if name == "gpipe":
        warm = np.full(p, total)
    elif name == "1f1b":
        warm = np.minimum(p - s - 1, m)
    else:
        warm = np.minimum((p - s - 1) * 2 + (v - 1) * p, total)
    k = np.arange(total)

    def fwd_pos(w, kk):
        return np.where(kk < w, kk, 2 * kk - w)

    def bwd_pos(w, kk):
        return np.where(kk < total - w, w + 2 * kk + 1, total + kk)

    def fwd_k(mb, chunk):  # inverse of schedules._interleaved's forward(k)
        if v == 1:
            return mb
        return (mb // p) * p * v + chunk * p + mb % p

    def bwd_k(mb, chunk):
        if name == "gpipe":
            return m - 1 - mb
        if v == 1:
            return mb
        return (mb // p) * p * v + (v - 1 - chunk) * p + mb % p

    if v == 1:
        mb_f = k
        chunk_f = np.zeros_like(k)
        mb_b = m - 1 - k if name == "gpipe" else k
        chunk_b = np.zeros_like(k)
    else:
        mb_f = (k // (p * v)) * p + k % p
        chunk_f = (k // p) % v
        mb_b = mb_f
        chunk_b = v - 1 - (k // p) % v
    n = p * two
    device = np.repeat(s, two)
    forward = np.zeros(n, dtype=bool)
    need = np.full(n, n, dtype=np.int64)
    last_vs = p * v - 1
    for d in range(p):
        w = warm[d]
        base = d * two
        pf = base + fwd_pos(w, k)
        pb = base + bwd_pos(w, k)
        forward[pf] = True
        vs = chunk_f * p + d
        up = vs - 1  # forward needs the previous virtual stage's output
        ok = vs > 0
        dev = up % p
        kk = fwd_k(mb_f, up // p)
        need[pf[ok]] = (dev * two + fwd_pos(warm[dev], kk))[ok]
        vs = chunk_b * p + d
        down = vs + 1  # backward needs the next virtual stage's gradient
        ok = vs < last_vs
        dev = down % p
        kk = bwd_k(mb_b, down // p)
        need[pb[ok]] = (dev * two + bwd_pos(warm[dev], kk))[ok]
    pos = np.tile(np.arange(two), p)
    prev = np.where(pos > 0, np.arange(n) - 1, n)
    # depth = longest dependency chain ending at the step.  Relax: across devices through
    # ``need``, along each device with a running maximum of depth - position (the chain
    # constraint depth[n] >= depth[n - 1] + 1); each round crosses one more device hop.
    depth = pos.copy()
    padded = np.empty(n + 1, dtype=np.int64)
    padded[n] = -1
    for _ in range(n + 1):
        padded[:n] = depth
        new = np.maximum(depth, padded[need] + 1)
        new = (np.maximum.accumulate((new - pos).reshape(p, two), axis=1).reshape(n) + pos)
        if np.array_equal(new, depth):
            break
        depth = new
    else:  # pragma: no cover - build_schedule's orders never deadlock
        raise ValueError("the pipeline schedule deadlocks")
    by_depth = np.argsort(depth, kind="stable")
    bounds = np.searchsorted(depth[by_depth], np.arange(depth.max() + 2))
    groups = tuple(by_depth[bounds[i]:bounds[i + 1]] for i in range(len(bounds) - 1))
    last_step = s * two + two - 1
    last_backward = last_step.copy()  # every order ends with a backward
    return CompiledSchedule(p, v, n, device, forward, prev, need, groups, depth, last_step, last_backward)


def pipeline_end_times(cs: CompiledSchedule, fwd_s: np.ndarray, bwd_s: np.ndarray, send_fwd_s: np.ndarray,
                       send_bwd_s: np.ndarray) -> np.ndarray:
    """End time of every step, ``[K, S]``, for ``K`` configurations' per-device costs ``[K, p]``
    (per model chunk under interleaving)."""
    k = fwd_s.shape[0]
    dev = cs.device
    dur = np.where(cs.forward, fwd_s[:, dev], bwd_s[:, dev])
    # the needed step's device sends: forward activations with its send_fwd, gradients with send_bwd
    need_dev = dev[np.minimum(cs.need, cs.num_steps - 1)]
    send = np.where(cs.forward, send_fwd_s[:, need_dev], send_bwd_s[:, need_dev])
    send[:, cs.need == cs.num_steps] = 0.0
    end = np.zeros((k, cs.num_steps + 1))
    prev, need = cs.prev, cs.need
    for idx in cs.depths:
        start = np.maximum(end[:, prev[idx]], end[:, need[idx]] + send[:, idx])
        end[:, idx] = start + dur[:, idx]
    return end[:, :-1]


def pipeline_end_times_many(items: list[tuple[CompiledSchedule, np.ndarray, np.ndarray, np.ndarray, np.ndarray]]) -> list[np.ndarray]:
    """:func:`pipeline_end_times` for several schedules at once: ``items`` are
    ``(schedule, fwd, bwd, send_fwd, send_bwd)``; returns each item's ``[K, S]`` end times.

    Every item's steps go into one flat array laid out depth by depth (a counting sort: level
    ``L`` of every item, then level ``L + 1``), so one pass over the deepest schedule's levels
    updates all of them; the per-level cost of numpy calls is paid once, not once per schedule.
    """
    if not items:
        return []
    levels = max(int(cs.depth.max()) + 1 for cs, *_ in items)
    counts = [np.bincount(cs.depth, minlength=levels) * f.shape[0] for cs, f, *_ in items]
    per_level = np.sum(counts, axis=0)
    level_start = np.zeros(levels + 1, dtype=np.int64)
    np.cumsum(per_level, out=level_start[1:])
    total = int(level_start[-1])
    slots = sum(f.shape[0] * (cs.num_steps + 1) for cs, f, *_ in items)
    order_idx = np.empty(total, dtype=np.int64)
    order_prev = np.empty(total, dtype=np.int64)
    order_need = np.empty(total, dtype=np.int64)
    order_dur = np.empty(total)
    order_send = np.empty(total)
    prior = np.zeros(levels, dtype=np.int64)  # elements of earlier items already placed per level
    bases = []
    base = 0
    for (cs, f, b, sf, sb), count in zip(items, counts):
        k, n = f.shape[0], cs.num_steps
        dev = cs.device
        dur = np.where(cs.forward, f[:, dev], b[:, dev])
        need_dev = dev[np.minimum(cs.need, n - 1)]
        send = np.where(cs.forward, sf[:, need_dev], sb[:, need_dev])
        send[:, cs.need == n] = 0.0
        row = base + np.arange(k, dtype=np.int64)[:, None] * (n + 1)  # each configuration's block; slot n stays 0
        order = np.argsort(cs.depth, kind="stable")
        lev = cs.depth[order]
        own = np.bincount(cs.depth, minlength=levels)
        own_start = np.zeros(levels, dtype=np.int64)
        np.cumsum(own[:-1], out=own_start[1:])
        # destination of (configuration r, j-th step in depth order): its level's region, this
        # item's share of it, configuration-major inside the share
        dest = ((level_start[lev] + prior[lev] - own_start[lev] + np.arange(n))[None, :]
                + np.arange(k, dtype=np.int64)[:, None] * own[lev][None, :]).ravel()
        order_idx[dest] = (row + order).ravel()
        order_prev[dest] = (row + cs.prev[order]).ravel()
        order_need[dest] = (row + cs.need[order]).ravel()
        order_dur[dest] = dur[:, order].ravel()
        order_send[dest] = send[:, order].ravel()
        prior += count
        bases.append((base, k, n))
        base += k * (n + 1)
    end = np.zeros(slots)
    for level in range(levels):
        a, b_ = level_start[level], level_start[level + 1]
        start = np.maximum(end[order_prev[a:b_]], end[order_need[a:b_]] + order_send[a:b_])
        end[order_idx[a:b_]] = start + order_dur[a:b_]
    return [end[b0:b0 + k * (n + 1)].reshape(k, n + 1)[:, :n] for b0, k, n in bases]


def bucket_tail_end(start: float, duration: float, compute_end: float, buckets: list[tuple[float, int]],
                    overlap: bool, stream_free: float = 0.0) -> float:
    """End of the gradient-bucket stream of one device (the engine's loop, in closed form).

    ``buckets``: runs of ``(seconds, count)`` in order.  Bucket ``i`` of ``K`` is ready at
    ``start + duration * (i + 1) / K`` with overlap, else at ``compute_end``.
    """
    total = sum(c for _, c in buckets)
    if total == 0:
        return stream_free
    best = stream_free + sum(t * c for t, c in buckets)
    suffix = best - stream_free
    i = 0
    for tau, count in buckets:
        # candidates: the first and the last bucket of the run (ready times and suffix sums are
        # linear in the position inside the run, so the maximum is at an end)
        for pos, rest in ((i, suffix), (i + count - 1, suffix - tau * (count - 1))):
            ready = start + duration * (pos + 1) / total if overlap else compute_end
            best = max(best, ready + rest)
        suffix -= tau * count
        i += count
    return best


def bucket_tail_end_many(start: np.ndarray, duration: np.ndarray, compute_end: np.ndarray, tau: np.ndarray,
                         count: np.ndarray, overlap: np.ndarray) -> np.ndarray:
    """:func:`bucket_tail_end` (stream free at 0) for arrays of devices: ``start``,
    ``duration``, ``compute_end`` ``[..., p]``; runs ``tau``, ``count`` ``[..., p, R]`` (count 0:
    no run); ``overlap`` broadcasts against ``[..., p]``."""
    total = count.sum(axis=-1)
    best = (tau * count).sum(axis=-1)
    suffix = best.copy()
    safe = np.where(total > 0, total, 1)
    i = np.zeros_like(total)
    for r in range(tau.shape[-1]):
        t, c = tau[..., r], count[..., r]
        for pos, rest in ((i, suffix), (i + c - 1, suffix - t * (c - 1))):
            ready = np.where(overlap, start + duration * (pos + 1) / safe, compute_end)
            best = np.where(c > 0, np.maximum(best, ready + rest), best)
        suffix = suffix - t * c
        i = i + c
    return np.where(total > 0, best, 0.0)
