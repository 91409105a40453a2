"""The headline numbers of a simulated iteration, defined once for the analysis and the sweep.

The iteration splits into four named parts that add up to it (issue 19's one definition):

- **compute**: the busiest GPU's compute stream with every collective free (its ops,
  recomputation and the micro-batches' input reads);
- **pipeline bubble**: that GPU's idle time within the pipeline's span, in the same schedule with
  every collective free; ``bubble_fraction`` = bubble / iteration (the breakdown bar's share) and
  ``bubble_ratio`` = bubble / busy time, Narayanan et al. 2021's (p - 1) / (v m) for uniform
  stages (Sec. 2.2);
- **exposed communication**: what the collectives add (simulated iteration minus the
  collective-free one), so it never exceeds the collective time on the critical path;
- **optimizer step**: from the last backward to the end of the collective-free iteration (the
  device that ends last, whose step may be longer than the busiest stage's).

:func:`breakdown` computes them for K configurations at once from the simulations' end and busy
times; :func:`dml2comm.analysis.analyze_graph` calls it with K = 1 (engine results),
:func:`dml2comm.search.fast.FastEvaluator.evaluate` for many (the batched recurrence).
:func:`model_flops` / :func:`mfu` / :func:`tflops_per_gpu` are the throughput figures of both
and of the sweep's rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["BUSY_TIE_RTOL", "Breakdown", "breakdown", "model_flops", "mfu", "tflops_per_gpu"]

#: Stages whose collective-free busy times agree to this relative tolerance are equally busy, and
#: the first of them is "the busiest" (identical blocks on two stages must not pick a stage by
#: floating-point summation noise, ~1e-15).
BUSY_TIE_RTOL = 1e-9


@dataclass(frozen=True)
class Breakdown:
    """Per configuration (arrays of length K): the four parts and the busiest stage."""

    critical_stage: np.ndarray  # int: the first device with the most collective-free work
    compute_s: np.ndarray
    bubble_s: np.ndarray
    exposed_comm_s: np.ndarray
    optimizer_s: np.ndarray
    bubble_fraction: np.ndarray  # bubble / iteration
    bubble_ratio: np.ndarray  # bubble / busy time (Narayanan et al. 2021)


def breakdown(iteration_s: np.ndarray, free_iteration_s: np.ndarray, free_compute_end_s: np.ndarray,
              free_busy_s: np.ndarray) -> Breakdown:
    """The parts of K iterations: ``iteration_s`` [K] simulated with communication,
    ``free_iteration_s`` [K] with every collective free, ``free_compute_end_s`` [K, p] each
    device's last compute end and ``free_busy_s`` [K, p] its busy time in the collective-free run."""
    iteration = np.asarray(iteration_s, dtype=float)
    free_iteration = np.asarray(free_iteration_s, dtype=float)
    end = np.asarray(free_compute_end_s, dtype=float)
    busy_all = np.asarray(free_busy_s, dtype=float)
    k = len(iteration)
    top = busy_all.max(axis=1)
    crit = np.argmax(busy_all >= top[:, None] * (1.0 - BUSY_TIE_RTOL), axis=1)
    last_end = end.max(axis=1)
    bubble = np.maximum(last_end - top, 0.0)  # idle within the pipeline's span
    return Breakdown(
        critical_stage=crit,
        compute_s=top,
        bubble_s=bubble,
        exposed_comm_s=np.maximum(iteration - free_iteration, 0.0),
        optimizer_s=np.maximum(free_iteration - last_end, 0.0),
        bubble_fraction=np.divide(bubble, iteration, out=np.zeros(k), where=iteration != 0),
        bubble_ratio=np.divide(bubble, top, out=np.zeros(k), where=top != 0),
    )


def model_flops(flops_fwd_per_sample: float, global_batch_size: int) -> float:
    """Model FLOPs of one iteration: forward + 2x backward, no recomputation (the MFU convention
    of Chowdhery et al. 2022, PaLM, App. B; Narayanan et al. 2021 count 3x forward the same way
    before adding recomputation)."""
    return 3 * flops_fwd_per_sample * global_batch_size


def mfu(flops: float, iteration_s: float, num_gpus: int, peak_flops: float) -> float | None:
    """Model FLOPs utilisation: model FLOPs / (iteration time x GPUs x dense peak)."""
    return flops / (iteration_s * num_gpus * peak_flops) if iteration_s > 0 else None


def tflops_per_gpu(flops: float, iteration_s: float, num_gpus: int) -> float | None:
    """Model TFLOP/s per GPU (what Narayanan et al. 2021 Table 1 reports, there with recomputation's FLOPs)."""
    return flops / (iteration_s * num_gpus) / 1e12 if iteration_s > 0 else None
