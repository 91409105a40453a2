"""Event-driven simulation of one training iteration, one representative GPU per pipeline rank.

Replicas and tensor ranks are symmetric, so each pipeline rank (device) is simulated once.
Every device has four streams:

- ``compute``: its schedule's forward and backward steps in order; a step's time includes its
  tensor-parallel collectives, which sit on the critical path in Megatron-LM (Narayanan et al.
  2021, Sec. 3.2), and recomputation (in backward);
- ``pp``: sends to the neighbouring stage, issued when the producing step ends, serialised on
  the device; the consumer step waits for the send to finish;
- ``dp``: data-parallel traffic: gradient buckets reduced while the device's last backward
  runs (PyTorch DDP / Megatron ``--overlap-grad-reduce``: bucket k of K is ready after (k+1)/K
  of that step) or, without overlap (Megatron-LM before 2023), after it,
  serialised on the stream; per-micro-batch ZeRO-3 parameter all-gathers (prefetched when the
  previous step starts) and ZeRO-2/3 gradient reduce-scatters (after each backward);
- ``pp`` also carries the tied-weight gradient all-reduce of the devices that hold a copy of a
  parameter another stage owns (tied embeddings: the first and last stage): it starts once
  every such device has reduced its gradients, and precedes their optimizer steps
  (Megatron-LM ``finalize_model_grads``: data-parallel sync, then ``_allreduce_embedding_grads``);
- ``optimizer``: after the device's compute and its gradient reduction, then any collective
  that must follow the step (ZeRO-1/2 parameter all-gather).

A step starts when the device's previous step has ended and its input has arrived (the
previous virtual stage's activation for a forward, the next one's gradient for a backward).
The iteration ends when every device has finished its optimizer step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from dml2comm.errors import ConfigError
from dml2comm.sim.schedules import Step, StepKind

__all__ = ["DeviceWork", "Event", "SimResult", "simulate"]


@dataclass(frozen=True, slots=True)
class DeviceWork:
    """One device's costs, per micro-batch and per model chunk (interleaved: a chunk is 1/v)."""

    fwd_s: float
    bwd_s: float
    tp_fwd_s: float = 0.0  # the part of fwd_s spent in tensor-parallel collectives
    tp_bwd_s: float = 0.0
    send_fwd_s: float = 0.0  # activation to the next virtual stage
    send_bwd_s: float = 0.0  # gradient to the previous virtual stage
    zero_fwd_s: float = 0.0  # ZeRO-3 parameter all-gather before each forward
    zero_bwd_pre_s: float = 0.0  # ZeRO-3 parameter all-gather before each backward
    zero_bwd_post_s: float = 0.0  # ZeRO-2/3 gradient reduce-scatter after each backward
    dp_buckets_s: tuple[float, ...] = ()  # once-per-iteration gradient collectives, in order
    optimizer_s: float = 0.0
    after_step_s: float = 0.0  # collectives that follow the optimizer step
    overlap_dp: bool = True  # False: gradient buckets start after the last backward (no overlap)
    tied_s: float = 0.0  # tied-weight gradient all-reduce with the other devices that have one, before the step


@dataclass(frozen=True, slots=True)
class Event:
    device: int
    stream: str  # compute, pp, dp, optimizer
    name: str
    start_s: float
    dur_s: float
    micro_batch: int = -1
    chunk: int = 0
    flow_to: tuple[int, str] | None = None  # (device, step name) a send feeds


@dataclass(frozen=True)
class SimResult:
    iteration_time_s: float
    device_end_s: tuple[float, ...]
    compute_end_s: tuple[float, ...]
    compute_busy_s: tuple[float, ...]  # sum of step durations per device
    tp_s: tuple[float, ...]
    dp_exposed_s: tuple[float, ...]  # time from compute end to the end of gradient reduction
    events: tuple[Event, ...] = field(repr=False, default=())


def simulate(schedule: Sequence[Sequence[Step]], work: Sequence[DeviceWork], virtual_stages: int = 1,
             keep_events: bool = True) -> SimResult:
    """Simulate one iteration of ``schedule`` (per-device step lists) with per-device ``work``.

    Raises
    ------
    ConfigError
        The schedule deadlocks (a step waits for one that can never run).
    """
    p = len(schedule)
    v = virtual_stages
    last_vs = p * v - 1
    pos = [0] * p
    free = [0.0] * p  # compute stream
    pp_free = [0.0] * p
    dp_free = [0.0] * p
    busy = [0.0] * p
    tp = [0.0] * p
    prev_start = [0.0] * p
    last_bwd: list[tuple[float, float]] = [(0.0, 0.0)] * p
    avail: dict[tuple[bool, int, int], float] = {}  # (forward?, micro-batch, virtual stage) -> ready
    events: list[Event] = []
    # plain tuples in the hot loop: enum hashing dominated the time of long schedules
    plans = [[(st.kind is StepKind.FORWARD, st.micro_batch, st.chunk, st) for st in steps] for steps in schedule]
    remaining = sum(len(s) for s in plans)
    while remaining:
        progressed = False
        for d in range(p):
            steps = plans[d]
            w = work[d]
            n_steps = len(steps)
            while pos[d] < n_steps:
                fwd, mb, chunk, step = steps[pos[d]]
                vs = chunk * p + d
                if fwd:
                    need = (True, mb, vs - 1) if vs > 0 else None
                else:
                    need = (False, mb, vs + 1) if vs < last_vs else None
                if need is not None:
                    ready = avail.get(need)
                    if ready is None:
                        break
                    start = free[d] if free[d] > ready else ready
                else:
                    start = free[d]
                pre = w.zero_fwd_s if fwd else w.zero_bwd_pre_s
                if pre > 0:  # ZeRO-3 all-gather, prefetched when the previous step started
                    ag_start = max(dp_free[d], prev_start[d])
                    dp_free[d] = ag_start + pre
                    start = max(start, dp_free[d])
                    if keep_events:
                        events.append(Event(d, "dp", "ZeRO-3 all-gather", ag_start, pre, mb, chunk))
                dur = w.fwd_s if fwd else w.bwd_s
                end = start + dur
                if keep_events:
                    name = f"{step.kind.value}{mb}" + (f".{chunk}" if v > 1 else "")
                    events.append(Event(d, "compute", name, start, dur, mb, chunk))
                prev_start[d] = start
                free[d] = end
                busy[d] += dur
                tp[d] += w.tp_fwd_s if fwd else w.tp_bwd_s
                if not fwd:
                    last_bwd[d] = (start, dur)
                    if w.zero_bwd_post_s > 0:
                        rs_start = max(dp_free[d], end)
                        dp_free[d] = rs_start + w.zero_bwd_post_s
                        if keep_events:
                            events.append(Event(d, "dp", "ZeRO reduce-scatter", rs_start, w.zero_bwd_post_s, mb, chunk))
                # hand the result to the neighbouring virtual stage
                if fwd and vs < last_vs:
                    target, send = vs + 1, w.send_fwd_s
                elif not fwd and vs > 0:
                    target, send = vs - 1, w.send_bwd_s
                else:
                    target, send = -1, 0.0
                if target >= 0:
                    s_start = end if end > pp_free[d] else pp_free[d]
                    pp_free[d] = s_start + send
                    avail[(fwd, mb, vs)] = pp_free[d]
                    if keep_events and send > 0:
                        dest_name = f"{step.kind.value}{mb}" + (f".{target // p}" if v > 1 else "")
                        events.append(Event(d, "pp", f"send {step.kind.value}{mb}" + (f".{chunk}" if v > 1 else ""),
                                            s_start, send, mb, chunk, (target % p, dest_name)))
                else:
                    avail[(fwd, mb, vs)] = end
                pos[d] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise ConfigError("the pipeline schedule deadlocks: a step waits for data that is never produced")

    device_end = []
    dp_exposed = []
    reduced_at = []
    for d in range(p):
        w = work[d]
        start, dur = last_bwd[d]
        t = dp_free[d]
        k = len(w.dp_buckets_s)
        for i, bucket in enumerate(w.dp_buckets_s):
            ready = start + dur * (i + 1) / k if w.overlap_dp else free[d]
            b_start = max(t, ready)
            t = b_start + bucket
            if keep_events:
                events.append(Event(d, "dp", f"gradient bucket {i}", b_start, bucket))
        reduced_at.append(max(t, free[d]))
    tied = [d for d in range(p) if work[d].tied_s > 0]
    tied_start = max((reduced_at[d] for d in tied), default=0.0)  # a collective: it starts when all are ready
    for d in range(p):
        w = work[d]
        reduced = reduced_at[d]
        dp_exposed.append(reduced - free[d])
        if w.tied_s > 0:
            if keep_events:
                events.append(Event(d, "pp", "tied-weight gradient all-reduce", tied_start, w.tied_s))
            reduced = tied_start + w.tied_s
        end = reduced + w.optimizer_s
        if keep_events and w.optimizer_s > 0:
            events.append(Event(d, "optimizer", "optimizer step", reduced, w.optimizer_s))
        if w.after_step_s > 0:
            if keep_events:
                events.append(Event(d, "dp", "parameter all-gather", end, w.after_step_s))
            end += w.after_step_s
        device_end.append(end)
    return SimResult(
        iteration_time_s=max(device_end) if device_end else 0.0,
        device_end_s=tuple(device_end),
        compute_end_s=tuple(free),
        compute_busy_s=tuple(busy),
        tp_s=tuple(tp),
        dp_exposed_s=tuple(dp_exposed),
        events=tuple(events),
    )
