"""Classify every GPU kernel (or, in CPU-only gloo traces, every top-level operator) of a rank.

Categories (:class:`Category`): forward, backward and recomputation compute, the optimizer
step, communication by parallel dimension (tp, dp, pp, ep, other), memcpy and memset.  Idle time
is what no event covers and is measured in :mod:`dml2comm.traces.metrics`.

How a GPU event gets its category:

1. **Launch.** Its ``correlation`` id is looked up among the CUDA runtime calls (``cuda_runtime``
   events carry the same id), which gives the CPU thread and time of the launch.  Flow arrows
   (``ac2g``) are not used: real traces contain unpaired ones.
2. **Phase** from what encloses the launch on that thread (patterns in
   :mod:`dml2comm.traces.patterns`): inside the optimizer step -> optimizer; inside a
   checkpointed block's backward but not inside a nested backward function -> recomputation;
   inside an autograd backward function, or on an autograd worker thread -> backward; else forward.
   Enclosure is tested against the union of the marker spans on the thread, so partially
   overlapping slices (which real traces have) cannot break a nesting assumption.
3. **Communication** (NCCL kernels): the innermost enclosing ``record_param_comms`` /
   ``c10d::*`` / ``nccl:*`` event on the launching thread gives the collective and its process
   group; the dimension comes from the group's description first, the collective's name second,
   the kernel's name last (:mod:`dml2comm.traces.patterns`).
4. **Step**: the ``ProfilerStep#N`` annotation whose span holds the launch.

CPU-only traces (gloo): the collectives are the ``c10d::*``/``gloo:*``/``record_param_comms``
operators and everything on gloo threads; compute is the other top-level CPU operators.

References: Kineto ``libkineto/src/output_json.cpp`` (fields), PyTorch
``torch/csrc/distributed/c10d/ParamCommsUtils.hpp`` (record_param_comms args), HTA
``hta/common/trace.py`` (linking kernels to launches by correlation id).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import IntEnum

import numpy as np

from dml2comm.traces.load import CommRecord, Kind, RankTrace, step_names
from dml2comm.traces.patterns import (BACKWARD_MARKERS, BACKWARD_THREAD, COLLECTIVE_DIMS, COMM_KERNEL, GLOO_THREAD,
                                      KERNEL_DIMS, OPTIMIZER_MARKERS, PG_DIMS, RECOMPUTE_MARKERS, STEP_ANNOTATION)

__all__ = ["Category", "DIMS", "COMPUTE", "COMM", "Activity", "classify", "dim_of"]


class Category(IntEnum):
    FORWARD = 0
    BACKWARD = 1
    RECOMPUTE = 2
    OPTIMIZER = 3
    COMM_TP = 4
    COMM_DP = 5
    COMM_PP = 6
    COMM_EP = 7
    COMM_OTHER = 8
    MEMCPY = 9
    MEMSET = 10

    @property
    def label(self) -> str:
        return self.name.lower()


#: Dimensions of ``comm_s`` in the outputs, and the category of each.
DIMS: dict[str, Category] = {"tp": Category.COMM_TP, "dp": Category.COMM_DP, "pp": Category.COMM_PP, "ep": Category.COMM_EP,
                             "other": Category.COMM_OTHER}
COMPUTE = (Category.FORWARD, Category.BACKWARD, Category.RECOMPUTE, Category.OPTIMIZER)
COMM = tuple(DIMS.values())


@dataclass
class Activity:
    """One rank's classified device activity, a row per event (GPU kernels, memcpy, memset; or
    CPU operators for CPU-only traces), times in microseconds on the global clock."""

    rank: int
    device: str  # "gpu" or "cpu"
    start: np.ndarray  # float64
    end: np.ndarray  # float64
    category: np.ndarray  # int8 Category
    step: np.ndarray  # int32 index into steps, -1 outside every step
    segment: np.ndarray  # int32 micro-batch segment within its step (-1: none)
    name: np.ndarray  # int32 into names
    stream: np.ndarray  # int64 (GPU stream, or CPU thread index)
    collective: np.ndarray  # int32 into collectives, -1 none
    names: list[str]
    collectives: list[str]
    steps: list[tuple[int, float, float]]  # (ProfilerStep number, CPU start, CPU end), global clock
    segments: list[list[str]]  # per step: segment labels ("F1", "B1", ...)
    problems: list[str]


def dim_of(record: CommRecord | None, collective: str, phase: Category, world: int | None, kernel: str) -> str:
    """The parallel dimension of one collective (see :mod:`dml2comm.traces.patterns`)."""
    if record is not None:
        for text in (record.pg_desc, record.pg_name):
            if text:
                for pattern, dim in PG_DIMS:
                    if pattern.search(text):
                        return dim
    if collective:
        bare = re.sub(r"^(c10d::|nccl:|gloo:)", "", collective)
        for pattern, dim in COLLECTIVE_DIMS:
            if pattern.search(bare):
                if dim is not None:
                    return dim
                size = (record.group_size or len(record.ranks)) if record is not None else 0
                if phase in (Category.BACKWARD, Category.RECOMPUTE, Category.OPTIMIZER):
                    return "dp"
                if size and world and size < world:
                    return "tp"
                return "dp"
    for pattern, dim in KERNEL_DIMS:
        if pattern.search(kernel):
            return dim
    return "other"


def _name_mask(trace: RankTrace, pattern: re.Pattern[str]) -> np.ndarray:
    ids = np.array([i for i, nm in enumerate(trace.names) if pattern.search(nm)], dtype=np.int32)
    return np.isin(trace.name, ids)


class _Spans:
    """Per-thread spans for "which span holds time t on thread h" queries (vectorised)."""

    def __init__(self, thread: np.ndarray, start: np.ndarray, end: np.ndarray, merge: bool) -> None:
        self.by_thread: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}
        idx_all = np.arange(thread.size)
        for h in np.unique(thread):
            sel = thread == h
            s, e, idx = start[sel], end[sel], idx_all[sel]
            order = np.argsort(s, kind="stable")
            s, e, idx = s[order], e[order], idx[order]
            if merge:
                from dml2comm.traces.overlap import union

                s, e = union(s, e)
                idx = np.arange(s.size)
            run = np.maximum.accumulate(e) if e.size else e
            # index of the span reaching furthest so far (fallback when the last one started ended)
            arg = np.maximum.accumulate(np.where(e == run, np.arange(e.size), 0)) if e.size else np.zeros(0, dtype=np.int64)
            self.by_thread[int(h)] = (s, e, idx, np.stack([run, arg.astype(np.float64)]) if e.size else np.zeros((2, 0)))

    def find(self, thread: np.ndarray, t: np.ndarray) -> np.ndarray:
        """Index (into the constructor's arrays) of a span holding ``t`` on ``thread``, -1 when none:
        the latest-starting span if it holds ``t``, else the one reaching furthest."""
        out = np.full(t.size, -1, dtype=np.int64)
        for h, (s, e, idx, acc) in self.by_thread.items():
            sel = np.flatnonzero(thread == h)
            if sel.size == 0 or s.size == 0:
                continue
            q = t[sel]
            j = np.searchsorted(s, q, side="right") - 1
            ok = j >= 0
            jj = np.where(ok, j, 0)
            last_holds = ok & (e[jj] >= q)
            far = acc[1][jj].astype(np.int64)
            far_holds = ok & ~last_holds & (acc[0][jj] >= q)
            res = np.full(sel.size, -1, dtype=np.int64)
            res[last_holds] = idx[jj[last_holds]]
            res[far_holds] = idx[far[far_holds]]
            out[sel] = res
        return out

    def covers(self, thread: np.ndarray, t: np.ndarray) -> np.ndarray:
        return self.find(thread, t) >= 0


def _cpu_mask(trace: RankTrace) -> np.ndarray:
    return (trace.kind == Kind.CPU_OP) | (trace.kind == Kind.ANNOTATION) | (trace.kind == Kind.PYTHON)


def _phases(trace: RankTrace, thread: np.ndarray, t: np.ndarray) -> np.ndarray:
    cpu = _cpu_mask(trace)
    end = trace.ts + trace.dur

    def spans(pattern: re.Pattern[str]) -> _Spans:
        m = cpu & _name_mask(trace, pattern)
        return _Spans(trace.thread[m], trace.ts[m], end[m], merge=True)

    opt = spans(OPTIMIZER_MARKERS).covers(thread, t)
    bwd_span = spans(BACKWARD_MARKERS).covers(thread, t)
    rec = spans(RECOMPUTE_MARKERS).covers(thread, t) & ~bwd_span
    bwd_threads = np.array([h for h, nm in trace.thread_names.items() if BACKWARD_THREAD.search(nm)], dtype=np.int64)
    bwd = bwd_span | np.isin(thread, bwd_threads)
    phase = np.full(t.size, Category.FORWARD, dtype=np.int8)
    phase[bwd] = Category.BACKWARD
    phase[rec] = Category.RECOMPUTE
    phase[opt] = Category.OPTIMIZER
    return phase


def _steps(trace: RankTrace, problems: list[str]) -> tuple[list[tuple[int, float, float]], np.ndarray, np.ndarray]:
    m = step_names(trace) & _cpu_mask(trace)
    idx = np.flatnonzero(m)
    order = idx[np.argsort(trace.ts[idx], kind="stable")]
    steps = []
    for i in order:
        num = int(STEP_ANNOTATION.match(trace.names[trace.name[i]]).group(1))  # type: ignore[union-attr]
        steps.append((num, float(trace.ts[i]), float(trace.ts[i] + trace.dur[i])))
    if not steps:
        problems.append("no ProfilerStep annotations: the whole trace is taken as one step")
        lo, hi = float(trace.ts.min()), float((trace.ts + trace.dur).max())
        steps = [(0, lo, hi)]
    return steps, np.array([s[1] for s in steps]), np.array([s[2] for s in steps])


def _step_of(t: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    j = np.searchsorted(starts, t, side="right") - 1
    jj = np.clip(j, 0, max(starts.size - 1, 0))
    ok = (j >= 0) & (t < ends[jj]) if starts.size else np.zeros(t.size, dtype=bool)
    return np.where(ok, j, -1).astype(np.int32)


def _segments(step: np.ndarray, category: np.ndarray, order_key: np.ndarray, nsteps: int) -> tuple[np.ndarray, list[list[str]]]:
    """Micro-batch segments: within a step, in launch order, each run of forward compute is one
    forward segment and each run of backward (with its recomputation) one backward segment;
    communication and copies join the segment of the compute launched just before them."""
    segment = np.full(step.size, -1, dtype=np.int32)
    labels: list[list[str]] = [[] for _ in range(nsteps)]
    for k in range(nsteps):
        sel = np.flatnonzero(step == k)
        if sel.size == 0:
            continue
        sel = sel[np.argsort(order_key[sel], kind="stable")]
        cat = category[sel]
        fwd = cat == Category.FORWARD
        bwd = (cat == Category.BACKWARD) | (cat == Category.RECOMPUTE)
        state = np.where(fwd, 1, np.where(bwd, 2, 0))
        compute_pos = np.flatnonzero(state > 0)
        if compute_pos.size == 0:
            continue
        st = state[compute_pos]
        new = np.ones(st.size, dtype=bool)
        new[1:] = st[1:] != st[:-1]
        seg_ids = np.cumsum(new) - 1
        f = b = 0
        for s in st[new]:
            if s == 1:
                f += 1
                labels[k].append(f"F{f}")
            else:
                b += 1
                labels[k].append(f"B{b}")
        # every event takes the segment of the last compute launched at or before it (the first
        # compute's for events before it); the optimizer step stays outside segments
        pos = np.searchsorted(compute_pos, np.arange(sel.size), side="right") - 1
        seg = seg_ids[np.clip(pos, 0, None)]
        seg[cat == Category.OPTIMIZER] = -1
        segment[sel] = seg
    return segment, labels


def classify(trace: RankTrace) -> Activity:
    """Classify one rank (see the module docstring)."""
    problems = list(trace.problems)
    gpu = np.isin(trace.kind, Kind.GPU)
    if gpu.any():
        return _classify_gpu(trace, np.flatnonzero(gpu), problems)
    return _classify_cpu(trace, problems)


def _classify_gpu(trace: RankTrace, idx: np.ndarray, problems: list[str]) -> Activity:
    # 1. launches: GPU correlation -> the runtime call with the same id
    rt = np.flatnonzero((trace.kind == Kind.RUNTIME) & (trace.correlation >= 0))
    rt = rt[np.argsort(trace.correlation[rt], kind="stable")]
    rcorr = trace.correlation[rt]
    corr = trace.correlation[idx]
    pos = np.clip(np.searchsorted(rcorr, corr), 0, max(rcorr.size - 1, 0))
    linked = (rcorr.size > 0) & (corr >= 0) & (rcorr[pos] == corr) if rcorr.size else np.zeros(idx.size, dtype=bool)
    launch_row = np.where(linked, rt[pos] if rcorr.size else 0, -1)
    launch_thread = np.where(linked, trace.thread[np.maximum(launch_row, 0)], -1)
    launch_ts = np.where(linked, trace.ts[np.maximum(launch_row, 0)], trace.ts[idx])
    unlinked = int((~linked).sum())
    if unlinked:
        problems.append(f"{unlinked} of {idx.size} GPU events have no CUDA launch with their correlation id "
                        "(their phase is unknown: counted as forward; their step is taken from their GPU time)")
    # 2. phase of the launch
    phase = _phases(trace, launch_thread, launch_ts)
    kind = trace.kind[idx]
    names = trace.names
    is_comm_name = np.array([bool(COMM_KERNEL.match(nm)) for nm in names], dtype=bool)
    comm = (kind == Kind.KERNEL) & is_comm_name[trace.name[idx]]
    category = phase.copy()
    category[kind == Kind.MEMCPY] = Category.MEMCPY
    category[kind == Kind.MEMSET] = Category.MEMSET
    # 3. communication: the enclosing collective records on the launching thread
    collectives: list[str] = []
    coll_ids: dict[str, int] = {}
    collective = np.full(idx.size, -1, dtype=np.int32)
    ci = np.flatnonzero(comm)
    if ci.size:
        recs = trace.comms
        rec_rows = np.array([r.index for r in recs], dtype=np.int64)
        end = trace.ts + trace.dur
        rich = np.array([bool(r.pg_desc or r.pg_name or r.ranks) for r in recs], dtype=bool)
        named = np.array([r.collective != "record_param_comms" for r in recs], dtype=bool)

        def lookup(sel: np.ndarray) -> np.ndarray:
            if not sel.any():
                return np.full(ci.size, -1, dtype=np.int64)
            rows = rec_rows[sel]
            found = _Spans(trace.thread[rows], trace.ts[rows], end[rows], merge=False).find(launch_thread[ci], launch_ts[ci])
            where = np.flatnonzero(sel)
            return np.where(found >= 0, where[np.maximum(found, 0)], -1)

        rich_hit = lookup(rich) if recs else np.full(ci.size, -1)
        named_hit = lookup(named) if recs else np.full(ci.size, -1)
        world = trace.world_size
        for j, row in enumerate(ci):
            rec = recs[rich_hit[j]] if rich_hit[j] >= 0 else None
            name_rec = recs[named_hit[j]] if named_hit[j] >= 0 else None
            coll = (rec.collective if rec is not None and rec.collective != "record_param_comms" else "") or \
                   (name_rec.collective if name_rec is not None else "")
            dim = dim_of(rec, coll, Category(phase[row]), world, names[trace.name[idx[row]]])
            category[row] = DIMS[dim]
            if coll:
                cid = coll_ids.get(coll)
                if cid is None:
                    cid = coll_ids[coll] = len(collectives)
                    collectives.append(coll)
                collective[row] = cid
    # 4. steps and micro-batch segments
    steps, s_start, s_end = _steps(trace, problems)
    step = _step_of(launch_ts, s_start, s_end)
    segment, labels = _segments(step, category, launch_ts, len(steps))
    base = trace.base_us
    return Activity(
        rank=trace.rank, device="gpu", start=trace.ts[idx] + base, end=trace.ts[idx] + trace.dur[idx] + base, category=category,
        step=step, segment=segment, name=trace.name[idx], stream=trace.stream[idx], collective=collective, names=trace.names,
        collectives=collectives, steps=[(n, a + base, b + base) for n, a, b in steps], segments=labels, problems=problems,
    )


def _classify_cpu(trace: RankTrace, problems: list[str]) -> Activity:
    cpu = np.flatnonzero((trace.kind == Kind.CPU_OP) | (trace.kind == Kind.ANNOTATION))
    if cpu.size == 0:
        problems.append("no GPU events and no CPU operators: nothing to classify")
    gloo_threads = np.array([h for h, nm in trace.thread_names.items() if GLOO_THREAD.search(nm)], dtype=np.int64)
    comm_rows = np.array(sorted(r.index for r in trace.comms), dtype=np.int64)
    th, ts, end = trace.thread[cpu], trace.ts[cpu], trace.ts[cpu] + trace.dur[cpu]
    is_comm = np.isin(cpu, comm_rows) | np.isin(th, gloo_threads)
    is_op = trace.kind[cpu] == Kind.CPU_OP
    # top level: not inside an earlier-starting operator of the same thread
    top = np.zeros(cpu.size, dtype=bool)
    for h in np.unique(th):
        sel = np.flatnonzero((th == h) & (is_op | is_comm))
        sel = sel[np.lexsort((-end[sel], ts[sel]))]
        if sel.size:
            run = np.maximum.accumulate(end[sel])
            inside = np.zeros(sel.size, dtype=bool)
            inside[1:] = ts[sel][1:] < run[:-1]
            top[sel[~inside]] = True
    keep = top | is_comm
    keep &= is_op | is_comm
    sel = np.flatnonzero(keep)
    rows = cpu[sel]
    phase = _phases(trace, trace.thread[rows], trace.ts[rows])
    category = phase.copy()
    recs = {r.index: r for r in trace.comms}
    collectives: list[str] = []
    coll_ids: dict[str, int] = {}
    collective = np.full(rows.size, -1, dtype=np.int32)
    for j, row in enumerate(rows):
        if not is_comm[sel[j]]:
            continue
        rec = recs.get(int(row))
        nm = trace.names[trace.name[row]]
        coll = rec.collective if rec is not None and rec.collective != "record_param_comms" else nm
        category[j] = DIMS[dim_of(rec, coll, Category(phase[j]), trace.world_size, nm)]
        cid = coll_ids.setdefault(coll, len(coll_ids))
        if cid == len(collectives):
            collectives.append(coll)
        collective[j] = cid
    steps, s_start, s_end = _steps(trace, problems)
    step = _step_of(trace.ts[rows], s_start, s_end)
    segment, labels = _segments(step, category, trace.ts[rows], len(steps))
    base = trace.base_us
    return Activity(
        rank=trace.rank, device="cpu", start=trace.ts[rows] + base, end=trace.ts[rows] + trace.dur[rows] + base,
        category=category, step=step, segment=segment, name=trace.name[rows], stream=trace.thread[rows].astype(np.int64),
        collective=collective, names=trace.names, collectives=collectives, steps=[(n, a + base, b + base) for n, a, b in steps],
        segments=labels, problems=problems,
    )
