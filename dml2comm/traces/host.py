"""Host-side figures of one profiled step: the CPU's issue time per GPU kernel and the GPU's idle
time per kernel while its queue is full, and a host model (:class:`dml2comm.cost.host.HostModel`)
built from them (``--profile``).

Read from one rank's trace (:func:`dml2comm.traces.load.load_trace`), GPU work being its kernels,
memsets and copies, each joined to the CUDA runtime or driver call that launched it by its
``correlation`` id:

- **issue time per kernel** (``kernel_s``): the intervals between consecutive launches shorter
  than :data:`ISSUE_GAP_S`, summed, over the kernels.  A longer interval is the CPU blocked
  (crossing the loss and optimizer: a ``cudaDeviceSynchronize``, a long ``aten::add_``), not issue
  work.  So is the interval after a launch that found CUDA's launch queue full (about a thousand
  GPU items launched and not finished: the call waits for the GPU to free a slot, and the
  intervals there follow the GPU's kernels, not the CPU): in a GPU-bound step whose queue fills,
  these intervals are left out and the issue time of the others is scaled up to all launches
  (:data:`QUEUE_BLOCKED_SHARE`).  Counted, they made the issue time per kernel of the measured
  Llama-1B steps at 16,384 tokens 6-33% longer than without them.
- **idle per kernel in GPU-bound stretches** (``gap_s``): the mean idle time between consecutive
  GPU items where the next one's launch call had returned before the GPU finished the one before
  (the queue was not empty: the device's own latency between back-to-back kernels).
- **starved idle**: the other gaps, where the GPU waited for the CPU to launch.  A step whose
  starved idle is more than :data:`HOST_BOUND_SHARE` of its GPU span is *host-bound*: its span is
  set by the CPU.

The profiler slows the CPU side (``record_shapes=True`` records about five CPU operators per
kernel), so the issue time is that of the profiled step.  It is multiplied by a factor that
removes the profiler's slowdown: ``1 / PROFILER_CPU_SLOWDOWN``, the measured median, unless the
step's time without the profiler is known (``--step-time``).  Then the factor is the most
probable one given both (:func:`step_time_factor`): the measured slowdowns spread about their
median (:data:`PROFILER_SLOWDOWN_SPREAD`, in ``log``), and the model's time of the profiled step
with the factor applied should be the timed step's (within :data:`STEP_TIME_SPREAD`, the timed
median's own uncertainty).  Where the step is host-bound its time follows the CPU and sets the
factor; where it is GPU-bound its time hardly moves with it, and the median stays.  (The simpler
``timed step / profiled span`` takes a partly GPU-bound step's span for the CPU's and leaves the
step's CPU time outside launches out: on the 44 profiled steps of the measuring runs of
``benchmarks/data/gpu_steps`` it puts the profiled steps themselves 3.2% off on average, 15% at
worst, against 0.8% and 2.3%.)  The GPU's idle per kernel is not scaled: the profiler does not
slow the device.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from dml2comm.cost.host import HostModel
from dml2comm.errors import ConfigError
from dml2comm.traces.classify import launch_rows
from dml2comm.traces.load import Kind, RankTrace, step_windows

__all__ = ["HOST_BOUND_SHARE", "ISSUE_GAP_S", "LAUNCH_BLOCKED_S", "PROFILER_CPU_SLOWDOWN", "PROFILER_SLOWDOWN_SPREAD",
           "QUEUE_BLOCKED_SHARE", "QUEUE_FULL_LAUNCHES", "STEP_TIME_GRID", "STEP_TIME_SPREAD", "HostFigures",
           "check_step_time", "fitted_host_model", "host_figures", "step_time_factor"]

#: Below this a launch-to-launch interval is the CPU issuing, not waiting (seconds).
ISSUE_GAP_S = 200e-6
#: A launch finds the launch queue full when the GPU items launched before it and not yet
#: finished are the most the trace ever had pending, or one fewer, and at least this share of the
#: launches at that depth were blocked (CUDA's queue holds about a thousand launches, after which
#: ``cudaLaunchKernel`` waits for a slot: stackoverflow.com/q/53970187).  In the Llama-1B traces
#: of ``benchmarks/data/gpu_steps/profiler_slowdown.csv`` (H100 and H200) whose queue filled, the
#: depth is 1,022 (once 1,023) and 61-87% of the launches there were blocked (0-7% at 1,021), the
#: interval after them 92-116 us against 20-51 us one below; in the traces whose queue never
#: filled, none, or a handful at their deepest.
QUEUE_BLOCKED_SHARE = 0.2
#: The fewest launches made at the trace's deepest queue (its two deepest levels) for it to be a
#: full one: a queue that fills stays full (85-585 launches at 1,022 or 1,023 in the measured
#: Llama-1B traces); a trace whose queue never fills can have one launch at its deepest that
#: waited for another reason (GPT-2 small's bundled H100 trace: one at 418, blocked), and has at
#: most 33 launches in its two deepest levels.
QUEUE_FULL_LAUNCHES = 32
#: A launch call this much longer than the trace's 10th-percentile call waited (seconds; that call
#: takes 4-5 us in the measured traces, the median one 5-9 us; in a step whose queue stays full
#: most calls wait, so the median is no reference).
LAUNCH_BLOCKED_S = 20e-6
#: A step is host-bound when the GPU waited for launches longer than this share of its span.
HOST_BOUND_SHARE = 0.05
#: How much slower the CPU issues a step's kernels under ``torch.profiler`` (CPU and CUDA
#: activities, ``record_shapes=True``) than without it: the issue time read from the trace
#: (:func:`host_figures`' ``issue_s``) over the time the same step took to issue unprofiled
#: (step start to ``step()`` returning, median of 10 steps).  Median 1.219 over the 38 GPT-2
#: small steps of ``benchmarks/data/gpu_steps/`` (H100 and H200, four machines, 8 shapes, bf16
#: and AMP, two processes each; 10th-90th percentile 1.03-1.53; ``profiler_slowdown.csv`` there,
#: written by ``benchmarks/profiler_slowdown.py``), the steps whose launch queue never fills
#: (under a thousand kernels), so that the unprofiled time is all issue work.  Per GPU: the H100's 24
#: give 1.215, the H200's 14 give 1.267.  Every step of the file whose queue never filled
#: (:attr:`HostFigures.full_queue_launches` 0: 93 of 108, nine models) gives 1.216, each model
#: 1.11-1.37 (Llama-1B's nine 1.199): the GPT-2 figure holds for the others.  Used where the
#: step's own unprofiled time is not given (no ``--step-time``), and as the prior of
#: :func:`step_time_factor` where it is.  All but the first step of each measuring process were
#: timed after an earlier step's profiling, with CUPTI still attached (Kineto detaches it only
#: with ``TEARDOWN_CUPTI=1``; pytorch/pytorch#144455): the six first steps of GPT-2 small launched their kernels 1.212 times faster than the same
#: model's later ones (median; 1.087-1.608; ``benchmarks/profiler_linger.py``), so against a
#: process that never profiled the slowdown is about 1.219 x 1.212 = 1.48.
PROFILER_CPU_SLOWDOWN = 1.219
#: How far a profiled step's slowdown strays from :data:`PROFILER_CPU_SLOWDOWN`: the standard
#: deviation of ``log(slowdown)`` over the 93 steps of ``profiler_slowdown.csv`` whose launch queue
#: never filled, estimated robustly (1.4826 x the median absolute deviation: 0.120; their plain
#: standard deviation is 0.146, their 16th-84th percentile half-width 0.126).  The prior of
#: :func:`step_time_factor`.
PROFILER_SLOWDOWN_SPREAD = 0.120
#: How far the model's time of the profiled step may be from the timed step for a factor to
#: explain it (``log``): the standard error of a ten-step median of a host-bound step, whose steps
#: vary with the CPU (1.2533 x sigma / sqrt(steps), sigma from each run's fastest-to-slowest range
#: / 3.078, the expected range of ten normal draws): median 0.0169 over the 31 host-bound runs
#: (host issue time over 90% of the step) of ``benchmarks/data/gpu_steps/h*.json``; in quadrature
#: with the model's own error at the profiled shape, 0.54% RMS over the four bundled profiled steps
#: (``benchmarks/bench_gpu_steps.py``: -0.1, -1.0, -0.4, -0.1%): 0.0177.
STEP_TIME_SPREAD = 0.018
#: Factors :func:`step_time_factor` evaluates the model at (odd: the median slowdown is one).
STEP_TIME_GRID = 17


@dataclass(frozen=True, slots=True)
class HostFigures:
    """Host-side figures of one profiled step (seconds; module docstring).

    Attributes
    ----------
    kernels : GPU kernels (memsets and copies not counted).
    gpu_items : kernels, memsets and copies.
    gpu_busy_s : the union of the GPU items' intervals (summed over the profiled steps, as the
        two below: a trace of several steps, ``ProfilerStep#N``, leaves the gaps between its steps
        out, each item belonging to the step whose annotation holds its launch).
    gpu_span_s : first GPU item's start to the last one's end (per step, summed).
    cpu_span_s : the CPU operators' span (first start to last end).
    issue_s : launch-to-launch intervals below :data:`ISSUE_GAP_S`, summed (those after a launch
        that found the queue full left out, the others scaled up to all launches).
    kernel_s : ``issue_s / kernels``: the CPU's issue time per kernel.
    queued_gaps : gaps between consecutive GPU items whose launch came before the GPU was free.
    gap_s : their mean idle time (0 without any).
    starved_idle_s : idle time of the other gaps (the GPU waiting for the CPU).
    steps : the profiled steps the trace holds (``ProfilerStep#N`` annotations that launched GPU
        work, at least 1).
    full_queue_launches : launches that found the launch queue full (module docstring).
    """

    kernels: int
    gpu_items: int
    gpu_busy_s: float
    gpu_span_s: float
    cpu_span_s: float
    issue_s: float
    kernel_s: float
    queued_gaps: int
    gap_s: float
    starved_idle_s: float
    #: the ``ProfilerStep#N`` annotations the trace holds (at least 1: a trace without any is one step)
    steps: int = 1
    #: launches that found the launch queue full (their intervals left out of ``issue_s``)
    full_queue_launches: int = 0
    #: the launches of the forward pass (the loss's forward with it) and of the backward pass
    #: (:func:`_pass_launches`; per step, summed); None where the trace's launches do not come
    #: from two threads (eager PyTorch runs the backward on autograd's device thread)
    pass_launches: tuple[int, int] | None = None

    @property
    def host_bound(self) -> bool:
        """The GPU waited for the CPU more than :data:`HOST_BOUND_SHARE` of its span."""
        return self.gpu_span_s > 0 and self.starved_idle_s > HOST_BOUND_SHARE * self.gpu_span_s

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "host_bound": self.host_bound}


def host_figures(trace: RankTrace) -> HostFigures:
    """The host-side figures of ``trace`` (module docstring).

    Raises
    ------
    ConfigError
        The trace has no GPU kernel, or none of its GPU items has a launch call (a trace without
        CUDA runtime events: profile with CPU and CUDA activities).
    """
    gpu = np.nonzero(np.isin(trace.kind, Kind.GPU))[0]
    kernels = int(np.count_nonzero(trace.kind == Kind.KERNEL))
    name = trace.path.rsplit("/", 1)[-1]
    if kernels == 0:
        raise ConfigError(f"{name}: no GPU kernel in the trace; profile the step with CUDA activities")
    gpu = gpu[np.argsort(trace.ts[gpu], kind="stable")]
    launch = launch_rows(trace, gpu)
    if not np.any(launch >= 0):
        raise ConfigError(f"{name}: no GPU kernel has its launch call in the trace; profile with CPU and CUDA activities")
    start = trace.ts[gpu]
    end = np.maximum.accumulate(start + trace.dur[gpu])  # the GPU is free after every item before
    issue_us, full = _issue_us(trace, launch[launch >= 0], (start + trace.dur[gpu])[launch >= 0])
    step = _step_of(trace, launch)
    within = (step[1:] == step[:-1]) & (step[1:] >= 0)  # gaps inside one profiled step
    idle = np.where(within, np.clip(start[1:] - end[:-1], 0.0, None), 0.0)
    returned = np.where(launch >= 0, trace.ts[np.maximum(launch, 0)] + trace.dur[np.maximum(launch, 0)], np.inf)
    queued = (returned[1:] <= end[:-1]) & within
    steps = np.unique(step[step >= 0])  # the profiled steps that launched GPU work
    span_us = sum(float(end[step == k].max() - start[step == k].min()) for k in steps.tolist())
    cpu = np.nonzero(trace.kind == Kind.CPU_OP)[0]
    cpu_span_us = float((trace.ts[cpu] + trace.dur[cpu]).max() - trace.ts[cpu].min()) if cpu.size else 0.0
    n_queued = int(np.count_nonzero(queued))
    return HostFigures(kernels=kernels, gpu_items=int(gpu.size), gpu_busy_s=(span_us - float(idle.sum())) * 1e-6,
                       gpu_span_s=span_us * 1e-6, cpu_span_s=cpu_span_us * 1e-6, issue_s=issue_us * 1e-6,
                       kernel_s=issue_us * 1e-6 / kernels, queued_gaps=n_queued,
                       gap_s=float(idle[queued].sum()) * 1e-6 / n_queued if n_queued else 0.0,
                       starved_idle_s=float(idle[~queued].sum()) * 1e-6, steps=max(1, int(steps.size)),
                       full_queue_launches=full, pass_launches=_pass_launches(trace, launch[launch >= 0]))


def _step_of(trace: RankTrace, launch: np.ndarray) -> np.ndarray:
    """Per GPU item (``launch``: its launch call's row, -1 for none), the profiled step it belongs
    to: the ``ProfilerStep#N`` annotation whose CPU span holds its launch (-1: none holds it, or
    the item has no launch).  All 0 in a trace without annotations (one step)."""
    windows = step_windows(trace)
    if not windows:
        return np.zeros(launch.size, dtype=np.int64)
    starts = np.array([w[0] for w in windows])
    ends = np.array([w[1] for w in windows])
    ts = np.where(launch >= 0, trace.ts[np.maximum(launch, 0)], -np.inf)
    k = np.searchsorted(starts, ts, side="right") - 1
    inside = (k >= 0) & (ts <= ends[np.maximum(k, 0)])
    return np.where(inside, k, -1)


def _issue_us(trace: RankTrace, launch: np.ndarray, gpu_end: np.ndarray) -> tuple[float, int]:
    """The CPU's issue time of the step (microseconds) and the launches it made with the launch
    queue full (module docstring).

    ``launch``: the runtime-call rows of the GPU items that have one; ``gpu_end``: those items' end
    times.  A launch's interval runs from its call to the next launch's.  An interval below
    :data:`ISSUE_GAP_S` counts as issue work unless its launch found the queue full: the GPU items
    launched before it and not yet finished are the most the trace ever had pending or one fewer,
    at least :data:`QUEUE_FULL_LAUNCHES` launches were made at that depth, and at least
    :data:`QUEUE_BLOCKED_SHARE` of them were blocked (their call longer than
    :data:`LAUNCH_BLOCKED_S` past the 10th-percentile call).  The issue time of the other
    intervals is scaled up to all of them (the CPU's work per launch taken to be the same).
    """
    launch = launch[np.argsort(trace.ts[launch], kind="stable")]
    launch_ts, call = trace.ts[launch], trace.dur[launch]
    interval = np.diff(launch_ts)
    pending = np.arange(launch_ts.size) - np.searchsorted(np.sort(gpu_end), launch_ts, side="right")
    deep = pending >= pending.max() - 1  # the queue's last two slots (a GPU item may end during the call)
    blocked = call > np.percentile(call, 10) + LAUNCH_BLOCKED_S * 1e6  # past a call that did not wait
    n_deep = np.count_nonzero(deep)
    filled = n_deep >= QUEUE_FULL_LAUNCHES and np.count_nonzero(blocked & deep) >= QUEUE_BLOCKED_SHARE * n_deep
    full = deep if filled else np.zeros_like(deep)
    free = ~full[:-1]
    if not np.any(free):
        return float(interval[interval < ISSUE_GAP_S * 1e6].sum()), int(np.count_nonzero(full))
    kept = free & (interval < ISSUE_GAP_S * 1e6)
    return float(interval[kept].sum()) * interval.size / np.count_nonzero(free), int(np.count_nonzero(full))


def _pass_launches(trace: RankTrace, launch: np.ndarray) -> tuple[int, int] | None:
    """(forward, backward) launches of the profiled steps (``launch``: the GPU items' launch-call
    rows).  Eager PyTorch launches the backward from autograd's device thread and everything else
    from the thread that runs the step: a launch from another thread than the first launch's is
    the backward's; one from the step's thread before its profiled step's last backward launch
    the forward's (the loss's forward with it); the rest (the optimizer, after the backward)
    neither.  None: one thread launched everything, or nothing came before the backward."""
    launch = launch[np.argsort(trace.ts[launch], kind="stable")]
    ts, thread = trace.ts[launch], trace.thread[launch]
    backward = thread != thread[0]
    if not np.any(backward):
        return None
    steps = _step_of(trace, launch)
    last = {k: float(ts[backward & (steps == k)].max()) for k in np.unique(steps[backward]).tolist()}
    cut = np.array([last.get(k, -np.inf) for k in steps.tolist()])
    forward = int(np.count_nonzero(~backward & (ts < cut)))
    return (forward, int(np.count_nonzero(backward))) if forward else None


def fitted_host_model(figures: list[HostFigures], preset: HostModel, factor: float | None = None,
                      launches: list[int | None] | None = None, forward_launches: list[int | None] | None = None) -> HostModel:
    """The host model of one or more profiled steps: ``preset`` (the stack's) with their issue time
    per kernel and idle per queued kernel (summed over the traces, over their kernels and queued
    gaps), named ``trace``.

    Parameters
    ----------
    figures : :func:`host_figures` of each trace.
    preset : the stack's host model, whose other terms (run-ahead queue, per-message times) stay.
    factor : the profiler's slowdown removed from the issue time: the issue time per kernel is
        multiplied by it (:func:`step_time_factor` where the step's time without the profiler is
        known); None: ``1 / PROFILER_CPU_SLOWDOWN``.
    launches : per trace, the kernels the cost model charges the host's ``kernel_s`` for in one
        step at the profiled shape (``OpCosts.launches``), over which its issue time is spread
        (times its ``steps``), so that the model's host time of that step is the trace's issue
        time (the trace's own kernels count no memsets and the model's count differs by a few
        percent: GPT-2 small 753 at b = 8 against 704 kernels and 119 memsets); None (for all, or
        for one trace, or 0): that trace's own kernels, every step's.
    forward_launches : per trace, those of ``launches`` in the forward pass (the loss's forward
        with them).  Given for every trace, each a step whose launch queue filled
        (:attr:`HostFigures.full_queue_launches`) and whose passes launched from their own threads
        (:attr:`HostFigures.pass_launches`), the issue time is shared between the passes as the
        traces' launches were, and each pass's share spread over its modelled kernels
        (``kernel_s`` and ``backward_kernel_s``; :func:`_pass_rates`); else one time per kernel
        for both passes.
    """
    launches = launches if launches is not None else [None] * len(figures)
    kernels = sum(n * f.steps if n else f.kernels for n, f in zip(launches, figures))
    queued = sum(f.queued_gaps for f in figures)
    issue_s = sum(f.issue_s for f in figures)
    gap_s = sum(f.gap_s * f.queued_gaps for f in figures) / queued if queued else 0.0
    factor = 1.0 / PROFILER_CPU_SLOWDOWN if factor is None else factor
    uniform = dataclasses.replace(preset, name="trace", kernel_s=issue_s / kernels, gap_s=gap_s)
    split = _pass_rates(figures, launches, forward_launches, issue_s)
    fitted = uniform if split is None else dataclasses.replace(uniform, kernel_s=split[0], backward_kernel_s=split[1])
    return fitted.with_cpu_factor(factor)


def _pass_rates(figures: list[HostFigures], launches: list[int | None], forward_launches: list[int | None] | None,
                issue_s: float) -> tuple[float, float] | None:
    """(forward, backward) CPU time per modelled kernel (:func:`fitted_host_model`): the issue time
    ``issue_s`` shared between the passes by the traces' launches, each share over that pass's
    modelled kernels; None where a trace's launch queue never filled or a count is missing.

    The model counts the kernels an op would launch, and eager PyTorch launches others: views
    such as a slice launch nothing forward and a zero fill and a copy backward, and the
    backward's gradient sums are its own kernels.  Llama-1B's model counts 822 forward and 1,221
    backward kernels where its traces launch 718 and 1,448: one time per kernel put a sixth too
    much of the CPU's time in the forward pass, which starved the GPU there at a smaller
    micro-batch than the profiled GPU-bound step's (from the bundled b = 4 traces, the step at
    b = 2 was predicted 5.3% long on the H100 and 2.7% on the H200; 0.0% and 0.5% short with the
    split: ``benchmarks/bench_gpu_steps.py``).  The passes are shared by launches,
    the CPU's work per launch taken to be the same in both, where the queue filled: there the
    backward's launch intervals follow the GPU (each launch waits for a slot) and measure nothing
    of the CPU.  Where it never filled (a step the CPU sets, or nearly) one time per kernel
    stays: over the unbundled dev pairs of the measuring sessions (each trace predicting the
    other shapes of its process) sharing by launches there took GPT-2 small's 124 pairs from 84
    to 76 within 5% (its forward launches cost the CPU 1.3-2 times its backward's: their median
    intervals 35-72 against 21-34 us), and sharing by each pass's measured intervals to 79; the
    split where the queue filled takes all 228 pairs from 166 to 176 within 5% (mean 4.3% to
    4.0%) and leaves the profiled steps themselves as they were."""
    if forward_launches is None or any(f.pass_launches is None or not f.full_queue_launches or not n or not m
                                       for f, n, m in zip(figures, launches, forward_launches)):
        return None
    fwd = sum(f.pass_launches[0] for f in figures)  # type: ignore[index]
    bwd = sum(f.pass_launches[1] for f in figures)  # type: ignore[index]
    n_f = sum(m * f.steps for m, f in zip(forward_launches, figures))  # type: ignore[operator]
    n_b = sum(n * f.steps for n, f in zip(launches, figures)) - n_f  # type: ignore[operator]
    if n_f <= 0 or n_b <= 0:
        return None
    share = fwd / (fwd + bwd)
    return issue_s * share / n_f, issue_s * (1.0 - share) / n_b


def check_step_time(step_time_s: float) -> None:
    """Refuse a ``--step-time`` that is not a positive number of seconds (one-line
    :class:`ConfigError`)."""
    if not (step_time_s > 0 and np.isfinite(step_time_s)):
        raise ConfigError(f"--step-time must be a positive number of seconds (the step timed without the profiler), "
                          f"got {step_time_s!r}")


def step_time_factor(step_s: Callable[[float], float], step_time_s: float) -> float:
    """The factor on a profiled step's CPU side that best explains its time without the profiler
    (``--step-time``): the most probable one given the profiler's measured slowdowns and the timed
    step (module docstring).

    ``step_s(factor)``: the model's time of the profiled step with the trace's issue time per
    kernel multiplied by ``factor`` (non-decreasing in it).  Over :data:`STEP_TIME_GRID` factors
    spaced evenly in ``log`` within ``PROFILER_SLOWDOWN_SPREAD x 4`` of the median slowdown's
    ``1 / PROFILER_CPU_SLOWDOWN``, the factor minimises ``(log(factor x PROFILER_CPU_SLOWDOWN) /
    PROFILER_SLOWDOWN_SPREAD)^2 + (log(step_s(factor) / step_time_s) / STEP_TIME_SPREAD)^2``
    (``step_s`` interpolated linearly in ``log factor`` between the grid's points, on a grid 16
    times finer).  A host-bound step's time moves with the factor, so the timed step sets it; a
    GPU-bound step's hardly does, and the median slowdown stays.

    Raises
    ------
    ConfigError
        ``step_time_s`` not a positive number.
    """
    check_step_time(step_time_s)
    prior = -np.log(PROFILER_CPU_SLOWDOWN)
    coarse = prior + np.linspace(-4.0, 4.0, STEP_TIME_GRID) * PROFILER_SLOWDOWN_SPREAD
    times = np.array([step_s(float(np.exp(x))) for x in coarse])
    if not np.all(np.isfinite(times) & (times > 0)):
        return float(np.exp(prior))  # the model could not time the step: the median slowdown
    fine = np.linspace(coarse[0], coarse[-1], 16 * (STEP_TIME_GRID - 1) + 1)
    misfit = np.log(np.interp(fine, coarse, times) / step_time_s) / STEP_TIME_SPREAD
    cost = ((fine - prior) / PROFILER_SLOWDOWN_SPREAD) ** 2 + misfit ** 2
    return float(np.exp(fine[int(np.argmin(cost))]))
