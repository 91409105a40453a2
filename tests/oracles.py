"""Reference implementations the tests check the simulator's vectorised code against (kept out
of the package: nothing in ``dml2comm`` runs them)."""

from __future__ import annotations

import numpy as np

from dml2comm.parallel.config import Schedule
from dml2comm.sim.levels import CompiledSchedule, pipeline_steps
from dml2comm.parallel.schedule import Step, StepKind, check_schedule


def pipeline_end_times(cs: CompiledSchedule, fwd_s: np.ndarray, bwd_s: np.ndarray, send_fwd_s: np.ndarray,
                       send_bwd_s: np.ndarray) -> np.ndarray:
    """End time of every step, ``[K, S]``, for ``K`` configurations (:func:`dml2comm.sim.levels.pipeline_steps`)."""
    return pipeline_steps(cs, fwd_s, bwd_s, send_fwd_s, send_bwd_s).end


def bucket_tail_end(start: float, duration: float, compute_end: float, buckets: list[tuple[float, int]],
                    overlap: bool, stream_free: float = 0.0) -> float:
    """End of the gradient-bucket stream of one device (:func:`dml2comm.sim.levels.iteration_tail`'s
    bucket-by-bucket loop, in closed form: equal to it to rounding).

    ``buckets``: runs of ``(seconds, count)`` in order.  Bucket ``i`` of ``K`` is ready at
    ``start + duration * (i + 1) / K`` with overlap, else at ``compute_end``.  For buckets of
    equal duration ``tau`` becoming ready at linearly spaced times, the stream's end is
    ``max_i(ready_i + sum_{l >= i} tau_l)``, attained at an end of each run of equal buckets.
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


def build_schedule(name: str, p: int, m: int, v: int = 1) -> list[list[Step]]:
    """Per-device step lists for schedule ``name`` (``gpipe``, ``1f1b``, ``interleaved``), step by
    step as :mod:`dml2comm.parallel.schedule` describes them (the reference for
    :func:`dml2comm.sim.levels.compile_schedule`)."""
    check_schedule(name, p, m, v)
    name = Schedule(name)
    if name is Schedule.GPIPE:
        return [_gpipe(m) for _ in range(p)]
    if name is Schedule.ONE_F_ONE_B or v < 2:
        return [_one_f_one_b(p, m, s) for s in range(p)]
    return [_interleaved(p, m, v, s) for s in range(p)]


def _gpipe(m: int) -> list[Step]:
    return [Step(StepKind.FORWARD, i) for i in range(m)] + [Step(StepKind.BACKWARD, i) for i in reversed(range(m))]


def _one_f_one_b(p: int, m: int, s: int) -> list[Step]:
    warmup = min(p - s - 1, m)
    steps = [Step(StepKind.FORWARD, i) for i in range(warmup)]
    for i in range(m - warmup):
        steps.append(Step(StepKind.FORWARD, warmup + i))
        steps.append(Step(StepKind.BACKWARD, i))
    steps.extend(Step(StepKind.BACKWARD, i) for i in range(m - warmup, m))
    return steps


def _interleaved(p: int, m: int, v: int, s: int) -> list[Step]:
    total = m * v

    def forward(k: int) -> Step:
        chunk = (k // p) % v
        return Step(StepKind.FORWARD, (k // (p * v)) * p + k % p, chunk)

    def backward(k: int) -> Step:
        chunk = v - 1 - (k // p) % v
        return Step(StepKind.BACKWARD, (k // (p * v)) * p + k % p, chunk)

    warmup = min((p - s - 1) * 2 + (v - 1) * p, total)
    steps = [forward(k) for k in range(warmup)]
    for i in range(total - warmup):
        steps.append(forward(warmup + i))
        steps.append(backward(i))
    steps.extend(backward(k) for k in range(total - warmup, total))
    return steps


def bucket_stream(start: float, duration: float, compute_end: float, buckets: list[float], overlap: bool,
                  stream_free: float = 0.0) -> tuple[float, list[float]]:
    """The gradient-bucket stream of one device bucket by bucket, as Python floats: its end and
    every bucket's start (``t = max(t, ready_i) + tau_i``; bucket ``i`` of ``K`` ready at
    ``start + duration * (i + 1) / K`` with overlap, else at ``compute_end``): the order of
    additions :func:`dml2comm.sim.levels.iteration_tail` reproduces to the last bit."""
    t, starts = stream_free, []
    n = len(buckets)
    for i, tau in enumerate(buckets):
        ready = start + duration * (i + 1) / n if overlap else compute_end
        starts.append(max(t, ready))
        t = starts[-1] + tau
    return t, starts
