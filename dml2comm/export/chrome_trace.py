"""The simulated iteration as a Chrome Trace Event file (``trace.json``; opens in Perfetto).

Format: the Trace Event Format (Google, "Trace Event Format" document): complete events
(``"ph": "X"``, microseconds), one process per pipeline stage's representative GPU, one thread
per stream (compute, pp, dp, optimizer), flow arrows (``"s"``/``"f"``) from each pipeline send
to the step that receives it, and a memory counter (``"C"``) per GPU: model states plus the
activations of the micro-batches in flight.

Times are quantised once, to integer nanoseconds, and every slice is written from those integers:
``ts = start_ns / 1000`` and ``dur = (end_ns - start_ns) / 1000`` (microseconds with three
decimals, as the format requires). A viewer that reads ``ts``/``dur`` back to nanoseconds
(Perfetto: ``llround(value * 1000)``, ``src/trace_processor/importers/json/json_utils``) gets
``ts + dur == end_ns`` exactly, so slices that follow each other in the simulation touch and
never overlap, and slices inside one another nest (rounding ``ts`` and ``dur`` separately
produced 1 ns overlaps that Perfetto flags). Each counter has one sample per timestamp (the last
value at that instant). ``displayTimeUnit`` stays ``"ms"``: the format says it changes the display
only, but Perfetto's JSON importer reads ``"ns"`` as the unit of ``ts`` itself (its
``JsonTracker::SetTimeUnit(kNs)``; test ``JsonTrackerTest.Ns``), which would shrink the trace
1000-fold there while chrome://tracing shows it right.
"""

from __future__ import annotations

import json
from typing import Any

from dml2comm.analysis import Analysis
from dml2comm.sim.engine import SimResult, Stream

__all__ = ["trace_dict", "trace_json", "STREAMS"]

STREAMS = tuple(Stream)


def _ns(seconds: float) -> int:
    """Seconds -> integer nanoseconds: the one rounding every timestamp of the trace goes through."""
    return int(round(seconds * 1e9))


def _us(ns: int) -> float:
    """Integer nanoseconds -> the format's microseconds (exact to the nanosecond after a reader's rounding)."""
    return ns / 1000.0


def _counter(events: list[dict[str, Any]], pid: int, samples: list[tuple[int, float]]) -> None:
    """One ``memory`` sample per timestamp, in time order; the last value at an instant wins."""
    last: dict[int, float] = {}
    for ts, value in samples:
        last[ts] = value
    for ts in sorted(last):
        events.append({"ph": "C", "name": "memory", "pid": pid, "ts": _us(ts), "args": {"bytes": last[ts]}})


def trace_dict(analysis: Analysis, sim: SimResult) -> dict[str, Any]:
    events: list[dict[str, Any]] = []
    v = analysis.config.chunks
    for stage in analysis.stages:
        ranks = ", ".join(str(r) for r in stage.ranks)
        events.append({"ph": "M", "name": "process_name", "pid": stage.index, "tid": 0,
                       "args": {"name": f"stage {stage.index} (replica 0, GPUs {ranks})"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": stage.index, "tid": 0, "args": {"sort_index": stage.index}})
        for tid, stream in enumerate(STREAMS):
            events.append({"ph": "M", "name": "thread_name", "pid": stage.index, "tid": tid, "args": {"name": stream}})
    starts: dict[tuple[int, str], float] = {}
    for ev in sim.events:
        tid = STREAMS.index(ev.stream)
        args: dict[str, Any] = {}
        if ev.micro_batch >= 0:
            args["micro_batch"] = ev.micro_batch
        if v > 1:
            args["chunk"] = ev.chunk
        start_ns, end_ns = _ns(ev.start_s), _ns(ev.start_s + ev.dur_s)
        events.append({"ph": "X", "name": ev.name, "cat": ev.stream, "pid": ev.device, "tid": tid,
                       "ts": _us(start_ns), "dur": _us(max(end_ns - start_ns, 0)), "args": args})
        if ev.stream is Stream.COMPUTE:
            starts[(ev.device, ev.name)] = ev.start_s
    flow = 0
    for ev in sim.events:
        if ev.flow_to is None or ev.flow_to not in starts:
            continue
        flow += 1
        dest, _ = ev.flow_to
        events.append({"ph": "s", "name": "send", "cat": "pp", "id": flow, "pid": ev.device, "tid": STREAMS.index(Stream.PP),
                       "ts": _us(_ns(ev.start_s + ev.dur_s * 0.5))})
        events.append({"ph": "f", "bp": "e", "name": "send", "cat": "pp", "id": flow, "pid": dest, "tid": 0,
                       "ts": _us(_ns(starts[ev.flow_to]))})
    # memory: model states + activations of the micro-batches in flight
    for stage in analysis.stages:
        mem = stage.memory
        base = mem["weights_bytes"] + mem["grads_bytes"] + mem["optimizer_bytes"]  # allocated (the context is not)
        per = mem["activations_per_micro_batch_bytes"] / v
        level = 0.0
        samples: list[tuple[int, float]] = [(0, base)]
        for ev in sim.events:
            if ev.device != stage.index or ev.stream is not Stream.COMPUTE:
                continue
            if ev.name.startswith("F"):
                level += per
                samples.append((_ns(ev.start_s), base + level))
            else:
                level -= per
                samples.append((_ns(ev.start_s + ev.dur_s), base + level))
        _counter(events, stage.index, samples)
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"tool": "dml2comm", "iteration_time_s": sim.iteration_time_s, "schedule": analysis.config.schedule}}


def trace_json(analysis: Analysis, sim: SimResult) -> str:
    return json.dumps(trace_dict(analysis, sim), sort_keys=True, separators=(",", ":")) + "\n"
