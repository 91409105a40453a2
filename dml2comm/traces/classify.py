"""Classify every GPU kernel (or, in CPU-only gloo traces, every top-level operator) of a rank.

Categories (:class:`Category`): forward, backward and recomputation compute, the optimizer
step, communication by parallel dimension (tp, dp, pp, cp, ep, other), memcpy and memset.  Idle time
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
   group (a group known only by name takes its description from ``distributedInfo.pg_config``).
   The dimension, first hit wins: the group's description; a context-parallel attention span
   around the launch (-> cp); the dimension a description gave the same group (same ranks)
   elsewhere in the trace; the collective's name (with the phase and the group size for
   reductions); the kernel's name (:mod:`dml2comm.traces.patterns`).
4. **Step**: the ``ProfilerStep#N`` annotation whose span holds the launch.
5. **Micro-batch segments** (:func:`segments`): explicit markers when the step has them
   (Megatron-LM's ``forward_step``/``backward_step``, ``torch.distributed.pipelining``'s
   ``Forward i``/``Backward i``/``PP:sFi``, ``## forward ##``, ``forward_mbN``/``backward_mbN``,
   user ``microbatch N`` ranges), else
   runs of forward and backward kernels in launch order; :attr:`Activity.segment_methods` says
   which, per step.

CPU-only traces (gloo): the collectives are the ``c10d::*``/``gloo:*``/``record_param_comms``
operators and everything on gloo threads; compute is the other top-level CPU operators.

References: Kineto ``libkineto/src/output_json.cpp`` (fields), PyTorch
``torch/csrc/distributed/c10d/ParamCommsUtils.hpp`` (record_param_comms args), HTA
``hta/common/trace.py`` (linking kernels to launches by correlation id).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import IntEnum
from functools import lru_cache

import numpy as np

from dml2comm.traces.layout import PeerCounts
from dml2comm.traces.load import CommRecord, Kind, RankTrace, step_names
from dml2comm.traces.patterns import (BACKWARD_MARKERS, BACKWARD_MICROBATCH, BACKWARD_THREAD, COLLECTIVE_DIMS, COMM_KERNEL,
                                      CP_MARKERS, FORWARD_MICROBATCH, GLOO_THREAD, KERNEL_DIMS, MICROBATCH, OPTIMIZER_MARKERS,
                                      P2P_OP, PG_DIMS, RECOMPUTE_MARKERS, STEP_ANNOTATION)

__all__ = ["Category", "DIMS", "COMPUTE", "COMM", "Activity", "classify", "dim_of", "pg_dim", "peer_counts", "SEGMENT_METHODS"]


class Category(IntEnum):
    FORWARD = 0
    BACKWARD = 1
    RECOMPUTE = 2
    OPTIMIZER = 3
    COMM_TP = 4
    COMM_DP = 5
    COMM_PP = 6
    COMM_CP = 7
    COMM_EP = 8
    COMM_OTHER = 9
    MEMCPY = 10
    MEMSET = 11

    @property
    def label(self) -> str:
        return self.name.lower()


#: Dimensions of ``comm_s`` in the outputs, and the category of each.
DIMS: dict[str, Category] = {"tp": Category.COMM_TP, "dp": Category.COMM_DP, "pp": Category.COMM_PP, "cp": Category.COMM_CP,
                             "ep": Category.COMM_EP, "other": Category.COMM_OTHER}
COMPUTE = (Category.FORWARD, Category.BACKWARD, Category.RECOMPUTE, Category.OPTIMIZER)
COMM = tuple(DIMS.values())


#: How the micro-batch segments of a step were found (:attr:`Activity.segment_methods`).
SEGMENT_METHODS: dict[str, str] = {
    "markers": "explicit micro-batch markers: forward_step/backward_step (Megatron-LM), Forward i/Backward i or PP:sFi "
               "(torch.distributed.pipelining), ## forward ##/## backward ##, forward_mbN/backward_mbN (hand-written "
               "pipeline loops), microbatch N",
    "heuristic": "no micro-batch markers in the step: each run of forward or backward kernels in launch order is one segment",
    "none": "no compute in the step",
}


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
    segments: list[list[str]]  # per step: segment labels ("F1", "B1", ...; "M1" for whole micro-batch markers)
    problems: list[str]
    segment_methods: list[str] = field(default_factory=list)  # per step: a key of SEGMENT_METHODS
    markers: list[str] = field(default_factory=list)  # the micro-batch marker names found (at most 8)
    #: process groups known only by their ranks (no description, or one that names no dimension
    #: such as ``default_pg``) -> the dimension most of their collectives were given; with the
    #: described groups, the input of the model-replica layout
    group_dims: dict[tuple[int, ...], str] = field(default_factory=dict)


@lru_cache(maxsize=4096)
def pg_dim(text: str) -> str | None:
    """The dimension a process-group description or name names (:data:`PG_DIMS`), or None."""
    for pattern, dim in PG_DIMS:
        if pattern.search(text):
            return dim
    return None


def dim_of(record: CommRecord | None, collective: str, phase: Category, world: int | None, kernel: str,
           in_cp: bool = False, group_dim: str | None = None) -> str:
    """The parallel dimension of one collective (order in the module docstring, patterns in
    :mod:`dml2comm.traces.patterns`).

    ``in_cp``: the launch is inside a context-parallel attention span; ``group_dim``: the
    dimension a description gave the same group (same member ranks) elsewhere in the trace."""
    if record is not None:
        for text in (record.pg_desc, record.pg_name):
            if text:
                dim = pg_dim(text)
                if dim is not None:
                    return dim
    if in_cp:
        return "cp"
    if group_dim is not None:
        return group_dim
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


def _described_groups(trace: RankTrace) -> dict[tuple[int, ...], str]:
    """Member ranks -> dimension, for every group whose description (or name) names one.  Member
    sets that two descriptions give different dimensions (Megatron-LM's context-parallel and
    expert-parallel groups can hold the same ranks) are left out: the ranks do not decide."""
    found: dict[tuple[int, ...], set[str]] = {}
    for r in trace.comms:
        if r.ranks and (r.pg_desc or r.pg_name):
            dim = (pg_dim(r.pg_desc) if r.pg_desc else None) or (pg_dim(r.pg_name) if r.pg_name else None)
            if dim is not None:
                found.setdefault(r.ranks, set()).add(dim)
    for pg in trace.pg_config:
        ranks = pg.get("ranks")
        dim = pg_dim(str(pg.get("pg_desc") or ""))
        if isinstance(ranks, list) and dim is not None:
            found.setdefault(tuple(sorted(x for x in ranks if isinstance(x, int) and not isinstance(x, bool))), set()).add(dim)
    return {ranks: next(iter(dims)) for ranks, dims in found.items() if len(dims) == 1}


def _name_mask(trace: RankTrace, pattern: re.Pattern[str]) -> np.ndarray:
    ids = np.array([i for i, nm in enumerate(trace.names) if pattern.search(nm)], dtype=np.int32)
    if ids.size == 0:
        return np.zeros(trace.name.size, dtype=bool)
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
        if not self.by_thread:
            return out
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


def _marker_spans(trace: RankTrace, pattern: re.Pattern[str], cpu: np.ndarray, end: np.ndarray) -> _Spans:
    m = cpu & _name_mask(trace, pattern)
    return _Spans(trace.thread[m], trace.ts[m], end[m], merge=True)


def _phases(trace: RankTrace, thread: np.ndarray, t: np.ndarray, cpu: np.ndarray, end: np.ndarray) -> np.ndarray:
    opt = _marker_spans(trace, OPTIMIZER_MARKERS, cpu, end).covers(thread, t)
    bwd_span = _marker_spans(trace, BACKWARD_MARKERS, cpu, end).covers(thread, t)
    rec = _marker_spans(trace, RECOMPUTE_MARKERS, cpu, end).covers(thread, t) & ~bwd_span
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


@dataclass(frozen=True)
class MicroBatchMarkers:
    """The outermost micro-batch marker spans of a rank (trace clock), sorted by start."""

    start: np.ndarray
    end: np.ndarray
    kind: np.ndarray  # 1 forward, 2 backward, 3 whole micro-batch
    names: list[str]  # distinct marker names, at most 8


def micro_batch_markers(trace: RankTrace) -> MicroBatchMarkers:
    """Forward/backward markers (:data:`~dml2comm.traces.patterns.FORWARD_MICROBATCH`,
    :data:`~dml2comm.traces.patterns.BACKWARD_MICROBATCH`) on any CPU thread, else whole
    micro-batch markers (:data:`~dml2comm.traces.patterns.MICROBATCH`).  A marker inside another
    (Megatron's ``forward_step`` calls the user's ``forward_step``; ``## forward ##`` inside
    ``Forward 3``) is dropped: the outermost one is the micro-batch.  Spans of any thread count,
    because the backward of a micro-batch is launched from the autograd thread while the main
    thread waits inside ``backward_step``."""
    cpu = _cpu_mask(trace)
    rows, kinds = [], []
    for pattern, code in ((FORWARD_MICROBATCH, 1), (BACKWARD_MICROBATCH, 2)):
        r = np.flatnonzero(cpu & _name_mask(trace, pattern))
        rows.append(r)
        kinds.append(np.full(r.size, code, dtype=np.int8))
    if not any(r.size for r in rows):
        r = np.flatnonzero(cpu & _name_mask(trace, MICROBATCH))
        rows, kinds = [r], [np.full(r.size, 3, dtype=np.int8)]
    row = np.concatenate(rows)
    kind = np.concatenate(kinds)
    s, e = trace.ts[row], trace.ts[row] + trace.dur[row]
    order = np.lexsort((-e, s))
    row, kind, s, e = row[order], kind[order], s[order], e[order]
    keep = np.ones(row.size, dtype=bool)
    if row.size > 1:
        run = np.maximum.accumulate(e)
        keep[1:] = e[1:] > run[:-1]  # not contained in an earlier-starting marker
    row, kind, s, e = row[keep], kind[keep], s[keep], e[keep]
    names = list(dict.fromkeys(trace.names[trace.name[i]] for i in row))[:8]
    return MicroBatchMarkers(s, e, kind, names)


def _segments(step: np.ndarray, category: np.ndarray, order_key: np.ndarray, bounds: tuple[np.ndarray, np.ndarray],
              markers: MicroBatchMarkers) -> tuple[np.ndarray, list[list[str]], list[str]]:
    """Micro-batch segments of every step, the labels of each step's segments and how they were
    found (a key of :data:`SEGMENT_METHODS`).

    With markers in the step, each marker span is one segment (``F``/``B`` numbered in order,
    ``M`` for whole micro-batches); without, each run of forward compute is one forward segment
    and each run of backward (with its recomputation) one backward segment.  Either way an event
    joins the segment that started last at or before its launch (the first one for events
    launched earlier), so communication launched between two markers (Megatron's
    ``send_forward`` after ``forward_step``) joins the micro-batch before it; the optimizer step
    stays outside segments."""
    starts, ends = bounds
    nsteps = starts.size
    segment = np.full(step.size, -1, dtype=np.int32)
    labels: list[list[str]] = [[] for _ in range(nsteps)]
    methods = ["none"] * nsteps
    prefix = {1: "F", 2: "B", 3: "M"}
    for k in range(nsteps):
        sel = np.flatnonzero(step == k)
        if sel.size == 0:
            continue
        sel = sel[np.argsort(order_key[sel], kind="stable")]
        cat = category[sel]
        in_step = (markers.start >= starts[k]) & (markers.start < ends[k])
        if in_step.any():
            m_start, m_kind = markers.start[in_step], markers.kind[in_step]
            count = {1: 0, 2: 0, 3: 0}
            for kind in m_kind:
                count[int(kind)] += 1
                labels[k].append(f"{prefix[int(kind)]}{count[int(kind)]}")
            seg = np.clip(np.searchsorted(m_start, order_key[sel], side="right") - 1, 0, None).astype(np.int32)
            methods[k] = "markers"
        else:
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
            pos = np.searchsorted(compute_pos, np.arange(sel.size), side="right") - 1
            seg = seg_ids[np.clip(pos, 0, None)].astype(np.int32)
            methods[k] = "heuristic"
        seg[cat == Category.OPTIMIZER] = -1
        segment[sel] = seg
    return segment, labels, methods


def peer_counts(trace: RankTrace) -> tuple[dict[int, PeerCounts], bool]:
    """The rank's send/recv peers (:class:`~dml2comm.traces.layout.PeerCounts` per peer) and
    whether they are ranks in an unnamed group (c10d operators) rather than global ranks.

    Records with a global peer (``record_param_comms``) win over the c10d operators around them.
    Point-to-point traffic of context parallelism (inside a CP attention span, or over a group
    described as another dimension than pipelining) is left out.  Direction: per step, the first
    operation with a peer (by start time) is a receive when the peer is upstream (see
    :mod:`dml2comm.traces.layout`)."""
    recs = [r for r in trace.comms if r.peer >= 0]
    if any(r.peer_global for r in recs):
        recs = [r for r in recs if r.peer_global]
    if not recs:
        return {}, False
    rows = np.array([r.index for r in recs], dtype=np.int64)
    cpu, end = _cpu_mask(trace), trace.ts + trace.dur
    in_cp = _marker_spans(trace, CP_MARKERS, cpu, end).covers(trace.thread[rows], trace.ts[rows]).tolist()
    steps, s_start, s_end = _steps(trace, [])
    step = _step_of(trace.ts[rows], s_start, s_end).tolist()
    ops: dict[int, int] = {}
    first: dict[tuple[int, int], tuple[float, int]] = {}  # (step, peer) -> (start, +1 recv / -1 send)
    for rec, cp, k in zip(recs, in_cp, step):
        if cp or (rec.pg_desc and pg_dim(rec.pg_desc) not in (None, "pp")):
            continue
        m = P2P_OP.search(rec.collective)
        if m is None:
            continue
        ops[rec.peer] = ops.get(rec.peer, 0) + 1
        t = float(trace.ts[rec.index])
        vote = -1 if m.group(1).lower() == "send" else 1
        if (k, rec.peer) not in first or t < first[(k, rec.peer)][0]:
            first[(k, rec.peer)] = (t, vote)
    upstream: dict[int, int] = {}
    for (_, peer), (_, vote) in first.items():
        upstream[peer] = upstream.get(peer, 0) + vote
    return {p: PeerCounts(n, upstream.get(p, 0)) for p, n in sorted(ops.items())}, not recs[0].peer_global


def classify(trace: RankTrace) -> Activity:
    """Classify one rank (see the module docstring)."""
    problems = list(trace.problems)
    gpu = np.isin(trace.kind, Kind.GPU)
    if gpu.any():
        return _classify_gpu(trace, np.flatnonzero(gpu), problems)
    return _classify_cpu(trace, problems)


class _CommDims:
    """Dimension of each communication event, with the process-group bookkeeping around
    :func:`dim_of` (results memoised: a trace repeats the same few collectives thousands of times)."""

    def __init__(self, trace: RankTrace) -> None:
        self.trace = trace
        self.described = _described_groups(trace)
        self.memo: dict[tuple[object, ...], str] = {}
        self.ranks_only: dict[tuple[int, ...], dict[str, int]] = {}
        self.collectives: list[str] = []
        self.coll_ids: dict[str, int] = {}

    def dim(self, rec: CommRecord | None, coll: str, phase: int, kernel: str, in_cp: bool) -> str:
        key = (rec.pg_desc, rec.pg_name, rec.ranks, rec.group_size) if rec is not None else None
        full = (key, coll, phase, kernel, in_cp)
        dim = self.memo.get(full)
        if dim is None:
            group_dim = self.described.get(rec.ranks) if rec is not None and rec.ranks else None
            dim = self.memo[full] = dim_of(rec, coll, Category(phase), self.trace.world_size, kernel, in_cp, group_dim)
        if rec is not None and rec.ranks and rec.ranks not in self.described and \
                (not rec.pg_desc or pg_dim(rec.pg_desc) is None) and (not rec.pg_name or pg_dim(rec.pg_name) is None):
            votes = self.ranks_only.setdefault(rec.ranks, {})
            votes[dim] = votes.get(dim, 0) + 1
        return dim

    def collective_id(self, coll: str) -> int:
        cid = self.coll_ids.get(coll)
        if cid is None:
            cid = self.coll_ids[coll] = len(self.collectives)
            self.collectives.append(coll)
        return cid

    def group_dims(self) -> dict[tuple[int, ...], str]:
        return {g: max(sorted(v), key=lambda d: v[d]) for g, v in sorted(self.ranks_only.items())}


def launch_rows(trace: RankTrace, rows: np.ndarray) -> np.ndarray:
    """Per GPU event row, the row of the CUDA runtime call that launched it (the same
    ``correlation`` id; HTA's ``hta/common/trace.py`` links them so), -1 where there is none."""
    rt = np.flatnonzero((trace.kind == Kind.RUNTIME) & (trace.correlation >= 0))
    if rt.size == 0:
        return np.full(rows.size, -1, dtype=np.int64)
    rt = rt[np.argsort(trace.correlation[rt], kind="stable")]
    rcorr = trace.correlation[rt]
    corr = trace.correlation[rows]
    pos = np.clip(np.searchsorted(rcorr, corr), 0, rcorr.size - 1)
    linked = (corr >= 0) & (rcorr[pos] == corr)
    return np.where(linked, rt[pos], -1).astype(np.int64)


def _classify_gpu(trace: RankTrace, idx: np.ndarray, problems: list[str]) -> Activity:
    cpu = _cpu_mask(trace)
    end = trace.ts + trace.dur
    # 1. launches: GPU correlation -> the runtime call with the same id
    launch_row = launch_rows(trace, idx)
    linked = launch_row >= 0
    launch_thread = np.where(linked, trace.thread[np.maximum(launch_row, 0)], -1)
    launch_ts = np.where(linked, trace.ts[np.maximum(launch_row, 0)], trace.ts[idx])
    unlinked = int((~linked).sum())
    if unlinked:
        problems.append(f"{unlinked} of {idx.size} GPU events have no CUDA launch with their correlation id "
                        "(their phase is unknown: counted as forward; their step is taken from their GPU time)")
    # 2. phase of the launch
    phase = _phases(trace, launch_thread, launch_ts, cpu, end)
    kind = trace.kind[idx]
    names = trace.names
    is_comm_name = np.array([bool(COMM_KERNEL.match(nm)) for nm in names], dtype=bool)
    comm = (kind == Kind.KERNEL) & is_comm_name[trace.name[idx]]
    category = phase.copy()
    category[kind == Kind.MEMCPY] = Category.MEMCPY
    category[kind == Kind.MEMSET] = Category.MEMSET
    # 3. communication: the enclosing collective records on the launching thread
    dims = _CommDims(trace)
    collective = np.full(idx.size, -1, dtype=np.int32)
    ci = np.flatnonzero(comm)
    if ci.size:
        recs = trace.comms
        rec_rows = np.array([r.index for r in recs], dtype=np.int64)
        rich = np.array([bool(r.pg_desc or r.pg_name or r.ranks) for r in recs], dtype=bool)
        named = np.array([r.collective != "record_param_comms" for r in recs], dtype=bool)

        def lookup(sel: np.ndarray) -> np.ndarray:
            if not sel.any():
                return np.full(ci.size, -1, dtype=np.int64)
            rows = rec_rows[sel]
            found = _Spans(trace.thread[rows], trace.ts[rows], end[rows], merge=False).find(launch_thread[ci], launch_ts[ci])
            where = np.flatnonzero(sel)
            return np.where(found >= 0, where[np.maximum(found, 0)], -1)

        rich_hit = lookup(rich).tolist() if recs else [-1] * ci.size
        named_hit = lookup(named).tolist() if recs else [-1] * ci.size
        in_cp = _marker_spans(trace, CP_MARKERS, cpu, end).covers(launch_thread[ci], launch_ts[ci]).tolist()
        kernel_names = trace.name[idx[ci]].tolist()
        phases = phase[ci].tolist()
        cat_out = np.empty(ci.size, dtype=np.int8)
        coll_out = np.full(ci.size, -1, dtype=np.int32)
        for j in range(ci.size):
            rh, nh = rich_hit[j], named_hit[j]
            rec = recs[rh] if rh >= 0 else None
            coll = (rec.collective if rec is not None and rec.collective != "record_param_comms" else "") or \
                   (recs[nh].collective if nh >= 0 else "")
            cat_out[j] = DIMS[dims.dim(rec, coll, phases[j], names[kernel_names[j]], in_cp[j])]
            if coll:
                coll_out[j] = dims.collective_id(coll)
        category[ci] = cat_out
        collective[ci] = coll_out
    # 4. steps and 5. micro-batch segments
    steps, s_start, s_end = _steps(trace, problems)
    step = _step_of(launch_ts, s_start, s_end)
    markers = micro_batch_markers(trace)
    segment, labels, methods = _segments(step, category, launch_ts, (s_start, s_end), markers)
    base = trace.base_us
    return Activity(
        rank=trace.rank, device="gpu", start=trace.ts[idx] + base, end=trace.ts[idx] + trace.dur[idx] + base, category=category,
        step=step, segment=segment, name=trace.name[idx], stream=trace.stream[idx], collective=collective, names=trace.names,
        collectives=dims.collectives, steps=[(n, a + base, b + base) for n, a, b in steps], segments=labels, problems=problems,
        segment_methods=methods, markers=markers.names if "markers" in methods else [], group_dims=dims.group_dims(),
    )


def _classify_cpu(trace: RankTrace, problems: list[str]) -> Activity:
    cpu_mask = _cpu_mask(trace)
    end_all = trace.ts + trace.dur
    cpu = np.flatnonzero((trace.kind == Kind.CPU_OP) | (trace.kind == Kind.ANNOTATION))
    if cpu.size == 0:
        problems.append("no GPU events and no CPU operators: nothing to classify")
    gloo_threads = np.array([h for h, nm in trace.thread_names.items() if GLOO_THREAD.search(nm)], dtype=np.int64)
    comm_rows = np.array(sorted(r.index for r in trace.comms), dtype=np.int64)
    th, ts, end = trace.thread[cpu], trace.ts[cpu], end_all[cpu]
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
    phase = _phases(trace, trace.thread[rows], trace.ts[rows], cpu_mask, end_all)
    in_cp = _marker_spans(trace, CP_MARKERS, cpu_mask, end_all).covers(trace.thread[rows], trace.ts[rows])
    category = phase.copy()
    recs = {r.index: r for r in trace.comms}
    dims = _CommDims(trace)
    collective = np.full(rows.size, -1, dtype=np.int32)
    for j, row in enumerate(rows):
        if not is_comm[sel[j]]:
            continue
        rec = recs.get(int(row))
        nm = trace.names[trace.name[row]]
        coll = rec.collective if rec is not None and rec.collective != "record_param_comms" else nm
        category[j] = DIMS[dims.dim(rec, coll, int(phase[j]), nm, bool(in_cp[j]))]
        collective[j] = dims.collective_id(coll)
    steps, s_start, s_end = _steps(trace, problems)
    step = _step_of(trace.ts[rows], s_start, s_end)
    markers = micro_batch_markers(trace)
    segment, labels, methods = _segments(step, category, trace.ts[rows], (s_start, s_end), markers)
    base = trace.base_us
    return Activity(
        rank=trace.rank, device="cpu", start=trace.ts[rows] + base, end=trace.ts[rows] + trace.dur[rows] + base,
        category=category, step=step, segment=segment, name=trace.name[rows], stream=trace.thread[rows].astype(np.int64),
        collective=collective, names=trace.names, collectives=dims.collectives, steps=[(n, a + base, b + base) for n, a, b in steps],
        segments=labels, problems=problems, segment_methods=methods, markers=markers.names if "markers" in methods else [],
        group_dims=dims.group_dims(),
    )
