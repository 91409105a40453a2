"""Interval arithmetic on GPU activity, and the HolisticTraceAnalysis-compatible figures.

All functions take start/end arrays (any unit; the callers use microseconds) and return
numbers in the same unit.  ``union`` merges overlapping or touching intervals; the measure of an
intersection of two unions is computed by a sweep over their merged boundaries.

HTA-compatible figures (holistictraceanalysis 0.5.0, ``hta/analyzers/communication_analysis.py``
and ``hta/analyzers/breakdown_analysis.py``; Meta Platforms, MIT licence), reproduced exactly:

- **communication/computation overlap** of a rank = |union(comm kernels) ∩ union(compute
  kernels)| / |union(comm kernels)|, kernel types from HTA's regexes
  (:data:`~dml2comm.traces.patterns.HTA_COMM_KERNEL` etc.), reported in percent to 2 decimals;
- **kernel-type breakdown** = time in which exactly a given set of kernel types runs
  (COMPUTATION, COMMUNICATION, MEMORY, "COMPUTATION overlapping COMMUNICATION", ...), each
  segment truncated to an integer, summed over ranks;
- **temporal breakdown** = idle (span of the GPU events minus their union), compute (union of
  compute kernels), non-compute (the rest) over the span from the first GPU event to the last.

HTA's input preparation is mirrored in :func:`hta_gpu_events`: GPU events are those with a stream
and a correlation id; if any ``ts`` in the file is fractional, ``ts`` is rounded up and the end
down to whole microseconds (``round_down_time_stamps``); when the trace has at least two
``ProfilerStep`` annotations, only GPU events launched before the start of the last step are kept
(``_filter_irrelevant_gpu_kernels``).
"""

from __future__ import annotations

from typing import Iterable, Mapping

import numpy as np

from dml2comm.traces.load import RankTrace, step_names
from dml2comm.traces.patterns import HTA_COMM_KERNEL, HTA_MEMORY_KERNEL, HTA_NOT_COMPUTE_KERNEL

__all__ = [
    "union",
    "measure",
    "intersection_measure",
    "clip",
    "HtaEvents",
    "hta_gpu_events",
    "hta_kernel_type",
    "hta_overlap_pct",
    "hta_kernel_type_breakdown",
    "hta_temporal_breakdown",
    "percentages",
]


def union(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Disjoint sorted intervals covering the same points as ``[start, end)`` (HTA's
    ``merge_kernel_intervals``: an interval starting at or before the running maximum end joins
    the group)."""
    if start.size == 0:
        return start.astype(np.float64), end.astype(np.float64)
    order = np.argsort(start, kind="stable")
    s, e = start[order], end[order]
    run = np.maximum.accumulate(e)
    new = np.empty(s.size, dtype=bool)
    new[0] = True
    new[1:] = s[1:] > run[:-1]
    group = np.cumsum(new) - 1
    starts = s[new]
    ends = np.full(starts.size, -np.inf)
    np.maximum.at(ends, group, e)
    return starts, ends


def measure(start: np.ndarray, end: np.ndarray) -> float:
    """Length of the union of the intervals."""
    s, e = union(start, end)
    return float(np.sum(e - s))


def intersection_measure(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> float:
    """|A ∩ B| for two unions (disjoint sorted intervals each), by a boundary sweep."""
    if a[0].size == 0 or b[0].size == 0:
        return 0.0
    times = np.concatenate([a[0], a[1], b[0], b[1]])
    delta = np.concatenate([np.ones(a[0].size), -np.ones(a[1].size), 2 * np.ones(b[0].size), -2 * np.ones(b[1].size)])
    order = np.argsort(times, kind="stable")
    t, running = times[order], np.cumsum(delta[order])
    seg = np.diff(t)
    return float(np.sum(seg[running[:-1] == 3]))


def clip(start: np.ndarray, end: np.ndarray, lo: float, hi: float) -> tuple[np.ndarray, np.ndarray]:
    """The parts of the intervals inside ``[lo, hi]``."""
    s, e = np.maximum(start, lo), np.minimum(end, hi)
    keep = e > s
    return s[keep], e[keep]


# ---------------------------------------------------------------------------------------------
# HolisticTraceAnalysis-compatible figures
# ---------------------------------------------------------------------------------------------


class HtaEvents:
    """The GPU events HTA analyses for one rank: start and end (integer-valued floats when HTA
    rounds), and the HTA kernel type of each (``COMMUNICATION``/``MEMORY``/``COMPUTATION``/``OTHER``)."""

    def __init__(self, rank: int, start: np.ndarray, end: np.ndarray, types: np.ndarray) -> None:
        self.rank, self.start, self.end, self.types = rank, start, end, types


def hta_kernel_type(name: str) -> str:
    """HTA 0.5.0 ``get_kernel_type``."""
    if HTA_COMM_KERNEL.match(name):
        return "COMMUNICATION"
    if HTA_MEMORY_KERNEL.match(name):
        return "MEMORY"
    if not HTA_NOT_COMPUTE_KERNEL.match(name):
        return "COMPUTATION"
    return "OTHER"


def hta_gpu_events(trace: RankTrace, filter_last_step: bool | None = None) -> HtaEvents:
    """The events HTA counts as GPU kernels for ``trace`` (see the module docstring).

    ``filter_last_step`` defaults to "the trace has two or more ProfilerStep names" (HTA checks
    the names over all ranks it loads; pass it explicitly for a set)."""
    ts, end = trace.ts, trace.ts + trace.dur
    if trace.ts_float:
        ts, end = np.ceil(ts), np.floor(end)
    is_gpu = (trace.stream >= 0) & (trace.correlation >= 0)
    steps = step_names(trace)
    if filter_last_step is None:
        filter_last_step = len({trace.name[i] for i in np.flatnonzero(steps)}) >= 2
    if filter_last_step and steps.any():
        cpu = ~is_gpu
        last_start = ts[steps & cpu].max()
        launched = np.unique(trace.correlation[cpu & (ts < last_start)])
        is_gpu &= np.isin(trace.correlation, launched)
    idx = np.flatnonzero(is_gpu)
    kinds = {nid: hta_kernel_type(trace.names[nid]) for nid in np.unique(trace.name[idx])}
    types = np.array([kinds[n] for n in trace.name[idx]], dtype=object)
    return HtaEvents(trace.rank, ts[idx], end[idx], types)


def hta_overlap_pct(ev: HtaEvents) -> float:
    """HTA ``get_comm_comp_overlap``: percent of communication-kernel time overlapped by
    computation kernels, rounded to 2 decimals."""
    comm = union(ev.start[ev.types == "COMMUNICATION"], ev.end[ev.types == "COMMUNICATION"])
    comp = union(ev.start[ev.types == "COMPUTATION"], ev.end[ev.types == "COMPUTATION"])
    total = float(np.sum(comm[1] - comm[0]))
    if total <= 0:
        return 0.0
    return round(100 * intersection_measure(comm, comp) / total, 2)


_BREAKDOWN_TYPES = ("COMPUTATION", "COMMUNICATION", "MEMORY")


def hta_kernel_type_breakdown(events: Iterable[HtaEvents]) -> dict[str, int]:
    """HTA ``get_gpu_kernel_breakdown`` kernel-type table: microseconds in which exactly a set of
    types runs, labelled as HTA labels them ("COMPUTATION overlapping COMMUNICATION"), summed
    over ranks."""
    total: dict[str, int] = {}
    for ev in events:
        times, deltas = [], []
        for bit, kt in enumerate(_BREAKDOWN_TYPES):
            s, e = union(ev.start[ev.types == kt], ev.end[ev.types == kt])
            times += [s, e]
            deltas += [np.full(s.size, 1 << bit), np.full(e.size, -(1 << bit))]
        if not times:
            continue
        t = np.concatenate(times)
        d = np.concatenate(deltas)
        order = np.argsort(t, kind="stable")
        t, running = t[order], np.cumsum(d[order])
        seg = np.diff(t)
        for state in np.unique(running[:-1]):
            if state <= 0:
                continue
            label = " overlapping ".join(kt for bit, kt in enumerate(_BREAKDOWN_TYPES) if state & (1 << bit))
            dur = seg[running[:-1] == state].astype(np.int64).sum()  # HTA: .astype(int) per segment
            total[label] = total.get(label, 0) + int(dur)
    return dict(sorted(total.items(), key=lambda kv: -kv[1]))


def hta_temporal_breakdown(ev: HtaEvents) -> dict[str, float]:
    """HTA ``get_temporal_breakdown`` for one rank: idle, compute, non-compute and kernel time (us)."""
    if ev.start.size == 0:
        return {"idle_time_us": 0.0, "compute_time_us": 0.0, "non_compute_time_us": 0.0, "kernel_time_us": 0.0}
    s, e = union(ev.start, ev.end)
    kernel_time = float(e[-1] - s[0])
    idle = kernel_time - float(np.sum(e - s))
    compute = measure(ev.start[ev.types == "COMPUTATION"], ev.end[ev.types == "COMPUTATION"])
    return {"idle_time_us": idle, "compute_time_us": compute, "non_compute_time_us": kernel_time - compute - idle,
            "kernel_time_us": kernel_time}


def percentages(breakdown: Mapping[str, int]) -> dict[str, float]:
    """HTA's ``percentage`` column: share of the summed time, rounded to 1 decimal."""
    total = sum(breakdown.values())
    return {k: round(100 * v / total, 1) for k, v in breakdown.items()} if total else {}
