"""Analyse a set of per-rank traces as a map-reduce: a task per rank, the set's views gathered here.

:func:`analyze_file` loads, classifies and measures one file and never raises on bad input: a
file that cannot be read comes back as :class:`RankFailure` with the one-line reason, so the
good ranks of a set are still analysed.  :func:`rank_tables` is the map step: it runs
:func:`analyze_file` where the task runs (a local process, a Dask worker next to the file) and
reduces the result to what the outputs read, so that only that travels: the per-step and
per-micro-batch tables, the rank's event table (Arrow IPC, zstd) for ``events.parquet``, and the
events of the one step the Gantt charts draw.  :func:`analyze_traces` is the reduce: it maps
:func:`rank_tables` over a set on an executor (:mod:`dml2comm.executors`: local processes or
Dask), adds the set-level problems (duplicate ranks, ranks missing from ``world_size``) and
places the ranks in model replicas (:mod:`dml2comm.traces.layout`).  Every executor runs the
same two functions, so the outputs do not depend on where the ranks were analysed.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from dml2comm.errors import Dml2CommError
from dml2comm.traces.classify import SEGMENT_METHODS, Activity, Category, classify, peer_counts, pg_dim
from dml2comm.traces.layout import Layout, ParallelSizes, RankLinks, coordinate_groups, rank_layout
from dml2comm.traces.load import RankTrace, load_trace
from dml2comm.traces.metrics import segment_metrics, step_metrics
from dml2comm.traces.overlap import hta_gpu_events, hta_kernel_type_breakdown, hta_overlap_pct, hta_temporal_breakdown

if TYPE_CHECKING:
    import pyarrow as pa

    from dml2comm.executors import Executor

__all__ = ["RankResult", "RankFailure", "TraceSet", "analyze_file", "rank_tables", "activity_events_table", "analyze_traces"]


@dataclass
class RankResult:
    path: str
    rank: int
    world_size: int | None
    device: str
    backend: str
    schema_version: Any
    activity: Activity
    steps: list[dict[str, Any]]
    segments: list[dict[str, Any]]  # of the first complete step (the middle one when there are 3+)
    segment_step: int | None
    hta: dict[str, Any]
    pipeline_groups: list[tuple[int, ...]]
    problems: list[str]
    seconds: float = 0.0
    #: this rank's coordinate groups (dimension -> sorted member ranks), see :mod:`dml2comm.traces.layout`
    groups: dict[str, tuple[int, ...]] = field(default_factory=dict)
    segment_method: str = "none"  # how the micro-batches of segment_step were found (SEGMENT_METHODS)
    links: RankLinks = field(default_factory=lambda: RankLinks({}))  # send/recv peers, groups naming no dimension
    #: the rank's event table (:func:`activity_events_table`) as Arrow IPC bytes, set by
    #: :func:`rank_tables` (whose ``activity`` then holds only the drawn step); empty: built from ``activity``
    events: bytes = b""

    def events_table(self) -> "pa.Table":
        """Every classified event of the rank (see :func:`activity_events_table`)."""
        if self.events:
            import pyarrow as pa

            return pa.ipc.open_stream(self.events).read_all()
        return activity_events_table(self.rank, self.activity)

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "file": self.path, "world_size": self.world_size, "device": self.device,
                "backend": self.backend, "schema_version": self.schema_version, "activity": self.activity.device,
                "steps": self.steps,
                "micro_batches": {"step": self.segment_step, "method": self.segment_method,
                                  "method_detail": SEGMENT_METHODS[self.segment_method],
                                  "markers": self.activity.markers if self.segment_method == "markers" else [],
                                  "segments": self.segments},
                "hta": self.hta, "groups": {d: list(g) for d, g in sorted(self.groups.items())}, "problems": self.problems}


@dataclass
class RankFailure:
    path: str
    reason: str


@dataclass
class TraceSet:
    ranks: list[RankResult]
    failures: list[RankFailure]
    problems: list[str] = field(default_factory=list)
    pipeline_groups: list[tuple[int, ...]] = field(default_factory=list)
    layout: Layout | None = None


def _coordinate_groups(trace: RankTrace, act: Activity) -> dict[str, tuple[int, ...]]:
    """The rank's own tensor/context/pipeline/data-parallel groups (pg_config, described
    collectives, then groups known by their ranks only)."""
    described: list[tuple[str, tuple[int, ...]]] = []
    for pg in trace.pg_config:
        ranks = pg.get("ranks")
        if isinstance(ranks, list) and pg.get("pg_desc"):
            described.append((str(pg["pg_desc"]), tuple(int(x) for x in ranks if isinstance(x, int) and not isinstance(x, bool))))
    seen: set[tuple[str, tuple[int, ...]]] = set()
    for r in trace.comms:
        if r.ranks and r.pg_desc and (r.pg_desc, r.ranks) not in seen:
            seen.add((r.pg_desc, r.ranks))
            described.append((r.pg_desc, r.ranks))
    return coordinate_groups(trace.rank, described, act.group_dims)


def _links(trace: RankTrace) -> RankLinks:
    """The rank's send/recv peers and the member ranks of its groups that name no dimension
    (pg_config's ``default_pg``/``undefined`` groups, collectives over groups known by ranks)."""
    peers, local = peer_counts(trace)
    groups: set[tuple[int, ...]] = set()
    for pg in trace.pg_config:
        ranks = pg.get("ranks")
        if isinstance(ranks, list) and pg_dim(str(pg.get("pg_desc") or "")) is None:
            groups.add(tuple(sorted({x for x in ranks if isinstance(x, int) and not isinstance(x, bool)})))
    for r in trace.comms:
        if r.ranks and not (r.pg_desc and pg_dim(r.pg_desc)):
            groups.add(r.ranks)
    return RankLinks(peers, tuple(sorted(g for g in groups if trace.rank in g)), local)


def analyze_file(path: str) -> RankResult | RankFailure:
    """Load, classify and measure one rank's trace; bad input becomes a :class:`RankFailure`."""
    import time

    start = time.perf_counter()
    try:
        trace = load_trace(path)
        act = classify(trace)
    except Dml2CommError as exc:
        return RankFailure(str(path), " ".join(str(exc).split()))
    except (MemoryError, RecursionError) as exc:
        return RankFailure(str(path), f"{Path(path).name!r} could not be analysed: {type(exc).__name__}")
    steps = step_metrics(act)
    seg_step = None
    segments: list[dict[str, Any]] = []
    with_events = [k for k in range(len(act.steps)) if (act.step == k).any()]
    if with_events:
        seg_step = with_events[len(with_events) // 2]
        segments = segment_metrics(act, seg_step)
    groups = _coordinate_groups(trace, act)
    links = _links(trace)
    ev = hta_gpu_events(trace)
    hta: dict[str, Any] = {"comm_comp_overlap_pct": hta_overlap_pct(ev), "temporal_breakdown_us": hta_temporal_breakdown(ev),
                           "kernel_types_us": hta_kernel_type_breakdown([ev])}
    if act.device == "cpu":
        # HTA counts GPU kernels only: on a CPU-only trace its overlap would read 0.00 % for want of
        # kernels, not of overlap.  The same ratio (|comm ∩ compute| / |comm|, HTA's
        # get_comm_comp_overlap) on the classified CPU operators, summed over the steps, instead.
        comm = math.fsum(s["comm_total_s"] for s in steps)
        hta["comm_comp_overlap_pct"] = None
        hta["cpu_comm_comp_overlap_pct"] = round(100 * math.fsum(s["overlap_s"] for s in steps) / comm, 2) if comm > 0 else None
        hta["not_applicable"] = ("CPU-only trace (no GPU kernels): HolisticTraceAnalysis's figures count GPU kernels; "
                                 "cpu_comm_comp_overlap_pct is the same ratio on the CPU operators (compute operators "
                                 "against c10d operators and gloo threads)")
    problems = list(act.problems)
    if not steps:
        problems.append("no step has device activity")
    return RankResult(
        path=str(path), rank=trace.rank, world_size=trace.world_size, device=trace.device, backend=trace.backend,
        schema_version=trace.schema_version, activity=act, steps=steps, segments=segments,
        segment_step=act.steps[seg_step][0] if seg_step is not None else None, hta=hta,
        pipeline_groups=[groups["pp"]] if "pp" in groups else [], problems=problems, seconds=time.perf_counter() - start,
        groups=groups, segment_method=act.segment_methods[seg_step] if seg_step is not None else "none", links=links,
    )


def activity_events_table(rank: int, a: Activity) -> "pa.Table":
    """Every classified event of a rank: rank, step (ProfilerStep number, -1 none), segment label,
    start and duration (us, global clock), category, name, stream, collective, device."""
    import pyarrow as pa

    cat_names = [c.label for c in Category]
    n = a.start.size
    step_numbers = np.array([s[0] for s in a.steps] + [-1], dtype=np.int64)
    names = pa.DictionaryArray.from_arrays(pa.array(a.name, pa.int32()), pa.array(a.names, pa.string()))
    colls = pa.DictionaryArray.from_arrays(pa.array(np.where(a.collective >= 0, a.collective, 0), pa.int32(),
                                                    mask=a.collective < 0), pa.array(a.collectives or [""], pa.string()))
    return pa.table({
        "rank": pa.array(np.full(n, rank, dtype=np.int32)),
        "step": pa.array(step_numbers[np.where(a.step >= 0, a.step, len(a.steps))]),
        "segment": pa.array(a.segment),
        "start_us": pa.array(a.start),
        "dur_us": pa.array(a.end - a.start),
        "category": pa.DictionaryArray.from_arrays(pa.array(a.category.astype(np.int32)), pa.array(cat_names)),
        "name": names,
        "stream": pa.array(a.stream),
        "collective": colls,
        "device": pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, dtype=np.int32)), pa.array([a.device])),
    })


def _drawn_step(a: Activity, step_number: int | None) -> Activity:
    """The activity of the one step the Gantt charts draw (ProfilerStep ``step_number``; none:
    no event): the steps and segment labels of every step kept, so step indices still hold."""
    k = next((i for i, s in enumerate(a.steps) if s[0] == step_number), None) if step_number is not None else None
    keep = a.step == k if k is not None else np.zeros(a.start.size, dtype=bool)
    used, name = np.unique(a.name[keep], return_inverse=True)  # only the names of the kept events travel
    return dataclasses.replace(a, start=a.start[keep], end=a.end[keep], category=a.category[keep], step=a.step[keep],
                               segment=a.segment[keep], name=name.astype(np.int32).reshape(-1), stream=a.stream[keep],
                               collective=a.collective[keep], names=[a.names[i] for i in used])


def rank_tables(path: str) -> RankResult | RankFailure:
    """The map step of :func:`analyze_traces`: :func:`analyze_file`, reduced to what the outputs
    read (the tables; the event table as Arrow IPC with zstd; the events of the drawn step only),
    so that tens of kilobytes to a few megabytes travel back instead of the rank's whole activity."""
    import pyarrow as pa

    result = analyze_file(path)
    if isinstance(result, RankFailure):
        return result
    table = activity_events_table(result.rank, result.activity)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema, options=pa.ipc.IpcWriteOptions(compression="zstd")) as writer:
        writer.write_table(table)
    return dataclasses.replace(result, activity=_drawn_step(result.activity, result.segment_step),
                               events=sink.getvalue().to_pybytes())


def analyze_traces(paths: Sequence[str | os.PathLike[str]], processes: int = 1, sizes: ParallelSizes | None = None,
                   executor: "Executor | None" = None, on_progress: Callable[[int, int], None] | None = None) -> TraceSet:
    """Analyse every file, sorted by rank: :func:`rank_tables` per file on ``executor`` (default:
    :class:`~dml2comm.executors.LocalExecutor` of ``processes`` processes); ``sizes`` (the run's
    --d/--t/--p/--cp) place the ranks in replicas when the traces name no group;
    ``on_progress(done, total)`` after each file.  A file whose task fails (a worker that dies,
    an error) is a :class:`RankFailure` with the reason, as an unreadable file is."""
    from dml2comm.executors import LocalExecutor

    files = [str(p) for p in paths]
    results: list[RankResult | RankFailure] = [RankFailure(f, "not analysed") for f in files]
    remote = executor is not None and executor.name != "local"
    # a remote worker's working folder is not ours: it reads absolute paths (on the shared filesystem)
    tasks = [str(Path(f).resolve()) for f in files] if remote else files
    ex = executor or LocalExecutor(processes)  # the caller closes an executor it passes
    for done, (i, result, error) in enumerate(ex.map_unordered(rank_tables, tasks), 1):
        if error is not None:
            result = RankFailure(files[i], f"{Path(files[i]).name!r} could not be analysed: {error}")
        result.path = files[i]  # as given, whichever path the task read
        results[i] = result
        if on_progress is not None:
            on_progress(done, len(files))
    ranks = sorted((r for r in results if isinstance(r, RankResult)), key=lambda r: (r.rank, r.path))
    failures = [r for r in results if isinstance(r, RankFailure)]
    problems = [f"{Path(f.path).name}: {f.reason}" for f in failures]
    seen: dict[int, str] = {}
    unique = []
    for r in ranks:
        if r.rank in seen:
            problems.append(f"rank {r.rank} appears twice ({Path(seen[r.rank]).name} and {Path(r.path).name}); the second is ignored")
            continue
        seen[r.rank] = r.path
        unique.append(r)
    worlds = {r.world_size for r in unique if r.world_size}
    if len(worlds) > 1:
        problems.append(f"the traces disagree on world_size ({sorted(worlds)}): they may come from different runs")
    if worlds:
        world = max(worlds)
        missing = sorted(set(range(world)) - set(seen))
        if missing:
            shown = ", ".join(map(str, missing[:20])) + (f" and {len(missing) - 20} more" if len(missing) > 20 else "")
            problems.append(f"{len(missing)} of {world} ranks have no trace (ranks {shown}): cross-rank views cover the others only")
    groups = sorted({g for r in unique for g in r.pipeline_groups})
    layout = rank_layout({r.rank: r.groups for r in unique}, max(worlds) if worlds else None, sizes,
                         {r.rank: r.links for r in unique})
    if not groups and layout.method == "send/recv peers":  # each replica is one pipeline, in stage order
        groups = [members for members in layout.replicas if len(members) > 1]
    return TraceSet(ranks=unique, failures=failures, problems=problems, pipeline_groups=groups, layout=layout)
