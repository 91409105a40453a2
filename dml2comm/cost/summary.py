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
:func:`dml2comm.model.FastEvaluator.evaluate` for many (the batched recurrence).
:func:`model_flops` / :func:`mfu` / :func:`tflops_per_gpu` are the throughput figures of both
and of the sweep's rows, and :func:`summary_of` assembles the one typed :class:`Summary` that
data.json, the terminal, the site and the sweep's rows read.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np

__all__ = ["BUSY_TIE_RTOL", "Breakdown", "Summary", "breakdown", "model_flops", "mfu", "summary_of", "tflops_per_gpu"]

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


@dataclass(frozen=True)
class Summary(Mapping):
    """The headline numbers of one configuration, built once (:func:`summary_of`) by the analysis
    and by the sweep's evaluator.  Read it by attribute; it is also a read-only mapping of its
    fields (``dict(summary)`` is data.json's ``summary`` block, ``summary["mfu"]`` works), so
    templates and JSON need no second copy.  The fields after ``critical_stage`` are the
    analysis's alone (its comm nodes and the validation bands): None on the sweep's rows."""

    iteration_time_s: float
    compute_time_s: float
    exposed_comm_time_s: float
    bubble_time_s: float
    bubble_fraction: float
    bubble_ratio: float
    optimizer_time_s: float
    mfu: float | None
    tflops_per_gpu: float | None
    samples_per_s: float | None
    tokens_per_s: float | None
    peak_memory_bytes: float
    fits_in_memory: bool
    critical_stage: int
    comm_time_s: float | None = None
    comm_time_busiest_stage_s: float | None = None
    bottleneck: str | None = None
    expected_error: float | None = None
    expected_error_source: str | None = None
    #: the share of the iteration in which the GPUs wait for eager PyTorch's CPU (the run-ahead host
    #: model's stretch of the kernel times: :func:`dml2comm.cost.bands.host_wait_share`); None
    #: under another host model
    host_wait_share: float | None = None

    def __getitem__(self, key: str) -> Any:
        if key not in _FIELD_SET:
            if key == "error":  # a Summary is a successful evaluation; a failed one is {"error": message}
                return None
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter(_FIELDS)

    def __len__(self) -> int:
        return len(_FIELDS)

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _FIELDS}


_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Summary))
_FIELD_SET = frozenset(_FIELDS)


def summary_of(parts: Breakdown, k: int, iteration_s: float, *, flops_fwd_per_sample: float, global_batch_size: int, num_gpus: int,
               peak_flops: float, seq_len: int | None, peak_memory_bytes: float, capacity_bytes: float, **analysis_only: Any) -> Summary:
    """Configuration ``k`` of :func:`breakdown`'s ``parts`` as a :class:`Summary`: throughput from
    the model FLOPs (:func:`model_flops`), samples and tokens per second, whether the peak
    memory fits ``capacity_bytes``; ``analysis_only``: the fields the analysis adds."""
    flops = model_flops(flops_fwd_per_sample, global_batch_size)
    tokens = global_batch_size * seq_len if seq_len else None
    return Summary(
        iteration_time_s=iteration_s,
        compute_time_s=float(parts.compute_s[k]),
        exposed_comm_time_s=float(parts.exposed_comm_s[k]),
        bubble_time_s=float(parts.bubble_s[k]),
        bubble_fraction=float(parts.bubble_fraction[k]),
        bubble_ratio=float(parts.bubble_ratio[k]),
        optimizer_time_s=float(parts.optimizer_s[k]),
        mfu=mfu(flops, iteration_s, num_gpus, peak_flops),
        tflops_per_gpu=tflops_per_gpu(flops, iteration_s, num_gpus),
        samples_per_s=global_batch_size / iteration_s if iteration_s else None,
        tokens_per_s=tokens / iteration_s if tokens and iteration_s else None,
        peak_memory_bytes=peak_memory_bytes,
        fits_in_memory=peak_memory_bytes <= capacity_bytes,
        critical_stage=int(parts.critical_stage[k]),
        **analysis_only,
    )
