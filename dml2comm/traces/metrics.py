"""Per-step and per-micro-batch measurements of one classified rank.

For step ``k`` of a rank, over the events launched in that step (their GPU time):

- ``window``: from the first event's start to the last event's end; ``wall_s`` its length;
- ``compute_s`` = |union of compute events| (forward, backward, recomputation, optimizer);
- ``comm_s[dim]`` = |union of that dimension's communication|; ``comm_total_s`` = |union of all
  communication|;
- ``overlap_s`` = |union(comm) ∩ union(compute)| (HTA's overlap numerator);
- ``exposed_comm_s`` = ``comm_total_s - overlap_s`` (communication with no compute beside it);
- ``idle_s`` = ``wall_s`` - |union of every event| (nothing runs: pipeline bubbles, waits,
  host-bound gaps).

Times are seconds.  Reference for the definitions: HTA ``get_comm_comp_overlap`` and
``get_temporal_breakdown`` (holistictraceanalysis 0.5.0), here applied per step and per dimension.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dml2comm.traces.classify import COMM, COMPUTE, DIMS, Activity, Category
from dml2comm.traces.overlap import intersection_measure, union

__all__ = ["step_metrics", "segment_metrics"]

_US = 1e-6


def _measure(start: np.ndarray, end: np.ndarray) -> float:
    s, e = union(start, end)
    return float(np.sum(e - s))


def _block(act: Activity, sel: np.ndarray) -> dict[str, Any]:
    s, e, c = act.start[sel], act.end[sel], act.category[sel]
    comp = np.isin(c, COMPUTE)
    comm = np.isin(c, COMM)
    comp_u = union(s[comp], e[comp])
    comm_u = union(s[comm], e[comm])
    compute = float(np.sum(comp_u[1] - comp_u[0]))
    comm_total = float(np.sum(comm_u[1] - comm_u[0]))
    overlap = intersection_measure(comm_u, comp_u)
    out: dict[str, Any] = {
        "compute_s": compute * _US,
        "comm_s": {dim: _measure(s[c == cat], e[c == cat]) * _US for dim, cat in DIMS.items()},
        "comm_total_s": comm_total * _US,
        "overlap_s": overlap * _US,
        "exposed_comm_s": (comm_total - overlap) * _US,
    }
    return out


def step_metrics(act: Activity) -> list[dict[str, Any]]:
    """One dict per step that has events (see the module docstring for the definitions), with
    the compute split by phase and the copies: ``forward_s``, ``backward_s``, ``recompute_s``,
    ``optimizer_s``, ``memcpy_s`` (memcpy and memset)."""
    out = []
    for k, (number, cpu_start, cpu_end) in enumerate(act.steps):
        sel = act.step == k
        if not sel.any():
            continue
        s, e, c = act.start[sel], act.end[sel], act.category[sel]
        lo, hi = float(s.min()), float(e.max())
        row: dict[str, Any] = {"step": number, "start_s": lo * _US, "end_s": hi * _US, "wall_s": (hi - lo) * _US,
                               "cpu_start_s": cpu_start * _US, "cpu_wall_s": (cpu_end - cpu_start) * _US,
                               "events": int(sel.sum())}
        row.update(_block(act, sel))
        row["idle_s"] = (hi - lo - _measure(s, e)) * _US
        for key, cats in (("forward_s", (Category.FORWARD,)), ("backward_s", (Category.BACKWARD,)),
                          ("recompute_s", (Category.RECOMPUTE,)), ("optimizer_s", (Category.OPTIMIZER,)),
                          ("memcpy_s", (Category.MEMCPY, Category.MEMSET))):
            m = np.isin(c, cats)
            row[key] = _measure(s[m], e[m]) * _US
        out.append(row)
    return out


def segment_metrics(act: Activity, k: int) -> list[dict[str, Any]]:
    """Per micro-batch segment of step index ``k`` (``F1``, ``B1``, ...): start, end, compute,
    communication, overlap (seconds)."""
    out = []
    for j, label in enumerate(act.segments[k] if k < len(act.segments) else []):
        sel = (act.step == k) & (act.segment == j)
        if not sel.any():
            continue
        row = {"segment": label, "start_s": float(act.start[sel].min()) * _US, "end_s": float(act.end[sel].max()) * _US}
        row.update(_block(act, sel))
        out.append(row)
    return out
