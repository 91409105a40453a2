"""Simulation of one training iteration, one representative GPU per pipeline rank: the events.

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

The recurrence itself is :mod:`dml2comm.sim.levels`' (the same one a sweep runs for thousands
of configurations at once); :func:`simulate` runs it for one configuration and turns every
step's times into the events of the timeline and of ``trace.json``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import groupby, repeat
from typing import NamedTuple, Sequence

import numpy as np

from dml2comm.choices import Choice
from dml2comm.errors import ConfigError
from dml2comm.sim.levels import CompiledSchedule, StepTimes, Tail, compile_steps, device_sums, iteration_tail, pipeline_steps
from dml2comm.parallel.schedule import Step

__all__ = ["DeviceWork", "Event", "SimResult", "Stream", "simulate"]


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


class Stream(Choice):
    """The streams of a simulated device, one timeline row (and trace.json thread) each: its
    compute (the steps, with their tensor-parallel collectives), its pipeline sends and the
    tied-weight all-reduce, its data-parallel collectives, and its optimizer step."""

    COMPUTE = "compute"
    PP = "pp"
    DP = "dp"
    OPTIMIZER = "optimizer"


class Event(NamedTuple):
    """One slice of the timeline (a named tuple: a long schedule has hundreds of thousands, and
    a tuple is built in a fraction of a frozen dataclass's time)."""

    device: int
    stream: Stream
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


def simulate(schedule: Sequence[Sequence[Step]] | CompiledSchedule, work: Sequence[DeviceWork], virtual_stages: int = 1,
             keep_events: bool = True) -> SimResult:
    """Simulate one iteration of ``schedule`` with per-device ``work``: the recurrence of
    :func:`dml2comm.sim.levels.pipeline_steps` and :func:`~dml2comm.sim.levels.iteration_tail`
    for one configuration, turned into events.

    ``schedule``: the per-device step lists of one of the schedules (:mod:`~dml2comm.parallel.schedule`;
    ``virtual_stages`` model chunks per device), or their
    :func:`~dml2comm.sim.levels.compile_schedule` (which carries its own chunk count, and
    saves reading the lists).  Events come in the order of
    :attr:`~dml2comm.sim.levels.CompiledSchedule.scan_order`, each step's ZeRO-3 all-gather,
    the step, its reduce-scatter and its send together, then each device's gradient buckets,
    then each device's tied-weight all-reduce, optimizer step and parameter all-gather.

    Raises
    ------
    ConfigError
        The step lists are not one of the schedules, or ``work`` has not one entry per device.
    """
    cs = schedule if isinstance(schedule, CompiledSchedule) else compile_steps(schedule, virtual_stages)
    p = cs.p
    if len(work) != p:
        raise ConfigError(f"the simulation got work for {len(work)} devices and a schedule of {p}; give one DeviceWork per pipeline rank")

    costs = np.array([(w.fwd_s, w.bwd_s, w.send_fwd_s, w.send_bwd_s, w.zero_fwd_s, w.zero_bwd_pre_s, w.zero_bwd_post_s,
                        w.tp_fwd_s, w.tp_bwd_s, w.tied_s, w.optimizer_s, w.after_step_s) for w in work], dtype=np.float64).T
    fwd, bwd, send_fwd, send_bwd = costs[0:1], costs[1:2], costs[2:3], costs[3:4]  # [1, p] each
    zero = (costs[4:5], costs[5:6], costs[6:7])
    times = pipeline_steps(cs, fwd, bwd, send_fwd, send_bwd, zero if costs[4:7].any() else None)
    last = cs.last_step
    compute_end = times.end[:, last]
    runs = [[(t, len(list(same))) for t, same in groupby(w.dp_buckets_s)] for w in work]  # runs of equal buckets
    width = max(map(len, runs), default=0)
    tau, count = np.zeros((1, p, width)), np.zeros((1, p, width), dtype=np.int64)
    for d, device_runs in enumerate(runs):
        for r, (t, n) in enumerate(device_runs):
            tau[0, d, r], count[0, d, r] = t, n
    tail = iteration_tail(compute_end, bwd, times.dp[:, last], tau, count, np.array([w.overlap_dp for w in work]),
                          costs[9:10], costs[10:11], costs[11:12], starts=keep_events)
    return SimResult(
        iteration_time_s=float(tail.end.max()),
        device_end_s=tuple(tail.end[0].tolist()),
        compute_end_s=tuple(compute_end[0].tolist()),
        compute_busy_s=tuple(device_sums(cs, fwd, bwd)[0].tolist()),
        tp_s=tuple(device_sums(cs, costs[7:8], costs[8:9])[0].tolist()),
        dp_exposed_s=tuple((tail.reduced - compute_end)[0].tolist()),
        events=_events(cs, times, fwd[0], bwd[0], send_fwd[0], send_bwd[0], zero, tail, work) if keep_events else (),
    )


def _events(cs: CompiledSchedule, times: StepTimes, fwd: np.ndarray, bwd: np.ndarray, send_fwd: np.ndarray, send_bwd: np.ndarray,
            zero: tuple[np.ndarray, ...], tail: Tail, work: Sequence[DeviceWork]) -> tuple[Event, ...]:
    """The events of one simulated iteration (:func:`simulate`'s docstring gives their order).

    Built a kind at a time over the steps that have one, then put in order by the key
    ``4 * (the step's place in the scan) + (0 all-gather, 1 step, 2 reduce-scatter, 3 send)``."""
    dev, forward = cs.device, cs.forward
    dur = np.where(forward, fwd[dev], bwd[dev])
    order = cs.scan_order
    rank = np.empty(cs.num_steps, dtype=np.int64)
    rank[order] = np.arange(cs.num_steps)
    send = np.where(cs.has_send, np.where(forward, send_fwd[dev], send_bwd[dev]), 0.0)
    pre = np.where(forward, zero[0][0, dev], zero[1][0, dev])
    post = np.where(forward, 0.0, zero[2][0, dev])
    labels = cs.labels
    make = tuple.__new__
    parts, keys = [], []

    def kind(steps: np.ndarray, slot: int, stream: Stream, names, at: np.ndarray, length: np.ndarray, flows=repeat(None)) -> None:
        rows = zip(dev[steps].tolist(), repeat(stream), names, at[steps].tolist(), length[steps].tolist(),
                   cs.micro_batch[steps].tolist(), cs.chunk[steps].tolist(), flows)
        parts.extend(map(make, repeat(Event), rows))
        keys.append(4 * rank[steps] + slot)

    steps = order
    kind(steps, 1, Stream.COMPUTE, [labels[i] for i in steps.tolist()], times.start[0], dur)
    steps = np.nonzero(pre > 0)[0]
    kind(steps, 0, Stream.DP, repeat("ZeRO-3 all-gather"), times.gather_start[0], pre)
    steps = np.nonzero(post > 0)[0]
    kind(steps, 2, Stream.DP, repeat("ZeRO reduce-scatter"), times.scatter_start[0], post)
    steps = np.nonzero(send > 0)[0]
    receiver = cs.receiver[steps]
    kind(steps, 3, Stream.PP, ["send " + labels[i] for i in steps.tolist()], times.send_start[0], send,
         zip(dev[receiver].tolist(), [labels[r] for r in receiver.tolist()]))
    key = np.concatenate(keys)
    events = parts if len(parts) == cs.num_steps else [parts[i] for i in np.argsort(key).tolist()]
    buckets = tail.bucket_start[0].tolist()
    for d, w in enumerate(work):
        for i, bucket in enumerate(w.dp_buckets_s):
            events.append(Event(d, Stream.DP, f"gradient bucket {i}", buckets[d][i], bucket))
    step_start = tail.step_start[0].tolist()
    tied_start = float(tail.tied_start[0])
    for d, w in enumerate(work):
        if w.tied_s > 0:
            events.append(Event(d, Stream.PP, "tied-weight gradient all-reduce", tied_start, w.tied_s))
        if w.optimizer_s > 0:
            events.append(Event(d, Stream.OPTIMIZER, "optimizer step", step_start[d], w.optimizer_s))
        if w.after_step_s > 0:
            events.append(Event(d, Stream.DP, "parameter all-gather", step_start[d] + w.optimizer_s, w.after_step_s))
    return tuple(events)
