"""Expected error of a prediction, from the validation residuals of the nearest published runs.

Every iteration time the tool predicts comes with the error it made on the bundled end-to-end
runs closest to it: :func:`expected_error_for` reads ``data/expected_error.csv`` (one row per
end-to-end validation case: Narayanan et al. 2021 Table 1, vTrain's single-node runs and the
one-GPU PyTorch steps measured on H100 and H200 machines, with the run's GPU, model size, GPU
count and t, p, the tool's absolute error on it and, for the PyTorch steps, the share of the
predicted step in which the GPU waits for the CPU; provenance in
``data/EXPECTED_ERROR_PROVENANCE.md``), precomputed by ``benchmarks/expected_error.py`` from
``validate`` (never at analysis time; rerun it after a cost model change).  The validation side,
which writes those rows and counts how often a band holds, is :mod:`dml2comm.validate.bands`;
this module is what the analysis, the sweep and ``--profile`` read, below the back ends.

Kinds: a run's kind is its GPU and training stack (``--stack``).  A prediction for a kind with
at least :data:`MIN_KIND` validated runs is banded by its nearest runs of that kind (below).  A
kind with fewer (a GPU or a stack the bundled sets did not run, or only a handful of runs) gets
the :data:`UNVALIDATED_QUANTILE` quantile of the absolute errors of every validated source, each
source weighing the same (its runs share its weight), and never less than the mean error of the
few runs it has: the tool's error on kinds it was checked on, not the error of the A100 runs that
happen to be nearest in size (those were fitted there, so they say how well the fit holds, not how
well it carries).

Nearest: runs in the same regime first (one node, or several), then by distance
``|log10(params / params_i)| + 0.5 |log2(t / t_i)| + 0.5 |log2(p / p_i)|``, plus
``HOST_WEIGHT |h - h_i|`` where both the prediction and the run state their host-wait share
``h`` (:func:`host_wait_share`: eager PyTorch's); the expected error is
the :data:`BAND_QUANTILE` (0.9) quantile of the absolute errors of the :data:`K` nearest (fewer
where the regime has fewer), so that the band holds for about nine predictions in ten
(``validate`` prints each source's share of runs inside their own band:
:func:`dml2comm.validate.bands.band_coverage`).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from dml2comm.cost.cache import CacheKey, derived, flash_cores_of
from dml2comm.cost.profile import scaled_share, scaled_share_of
from dml2comm.hardware.cluster import Cluster
from dml2comm.hardware.gpus import base_gpu_name
from dml2comm.ir.gemms import graph_gemms, shape_doublings
from dml2comm.parallel.config import ParallelConfig

__all__ = ["BANDS_FILE", "BANDS_PATH", "BAND_QUANTILE", "FIELDS", "K", "HOST_WEIGHT", "MIN_KIND", "PROFILE_HOST_SPREAD", "PROFILE_TIMING_NOISE", "UNVALIDATED_QUANTILE", "BandRow", "expected_error_for", "host_wait_share", "load_bands", "plan_doublings", "profile_band", "profile_expected_error", "summary_band",
           "weighted_quantile"]

BANDS_FILE = "expected_error.csv"
#: The bundled bands file (``benchmarks/expected_error.py`` writes it).
BANDS_PATH = Path(__file__).with_name("data") / BANDS_FILE
#: Nearest runs averaged.
K = 20
#: Validated runs of a kind (GPU and stack) below which its own residuals do not band it alone.
MIN_KIND = 10
#: Quantile of the validated sources' absolute errors (each source weighing the same) that bands
#: a prediction of a kind with fewer than :data:`MIN_KIND` runs: 0.9, so that about nine of ten
#: predictions of a new kind fall inside it if the tool errs there as it does on the kinds it was
#: checked on.
UNVALIDATED_QUANTILE = 0.9
#: Quantile of the nearest runs' absolute errors that bands a prediction of a validated kind: the
#: same 0.9, so that a band holds for about nine predictions in ten (the mean of the nearest runs'
#: errors, the band until 2026-11, held for only 55% of vTrain's runs and 70% of Narayanan's).
BAND_QUANTILE = UNVALIDATED_QUANTILE
#: Decades of model size beyond which the nearest run of the same regime is too far to speak
#: for this one (a factor of 10 in parameters).
FAR = 1.0
#: The columns of the bands file (written by :func:`dml2comm.validate.bands.bands_csv`).
FIELDS = ("source", "case", "gpu", "params", "num_gpus", "gpus_per_node", "t", "p", "abs_error", "stack", "host_share")
#: Distance per unit of host-wait share (:func:`host_wait_share`) between a prediction and a run
#: that both state one (the eager-PyTorch runs and predictions): a step whose GPU waits for the
#: CPU a fifth of the time more than a run's is as far from it as a decade of model size.  A
#: host-bound step's time carries its machine's CPU speed (1.7x apart between the measuring
#: machines: :data:`dml2comm.cost.host.PYTORCH`), a GPU-bound one's does not, so the band of
#: each comes from runs bound alike.  5 is a choice, not a fit (none of the bundled sets is used to
#: tune it; ``validate`` prints the share of runs inside their own band).
HOST_WEIGHT = 5.0
#: The largest host component of a ``--profile`` band (:func:`profile_band`): how far a profiled
#: step's CPU slowdown strays from the median the host model divides by
#: (:data:`dml2comm.traces.host.PROFILER_CPU_SLOWDOWN`), the 90% quantile of |slowdown / median
#: - 1| over the 93 measured steps whose launch queue never filled
#: (``benchmarks/data/gpu_steps/profiler_slowdown.csv``: 0.220).  A step the CPU sets entirely is
#: off by as much as the CPU's speed; a plan waiting for it a larger share than this is no less
#: certain.
PROFILE_HOST_SPREAD = 0.22
#: The least a ``--profile`` band holds (:func:`profile_band`'s ``timing``): the measured step it
#: is held against is a median of ten steps, uncertain by its standard error, 1.2533 x sigma /
#: sqrt(10) with sigma from the run's fastest-to-slowest range / 3.078 (the expected range of ten
#: normal draws): median 0.0087 over the 108 runs of ``benchmarks/data/gpu_steps/h*.json``.  A
#: GPU-bound step whose identical blocks ran alike would otherwise get a band of a few tenths of a
#: percent (ResNet-18 at b = 256: 0.2%, 0.7% off the mean of its two processes).
PROFILE_TIMING_NOISE = 0.0087


@dataclass(frozen=True)
class BandRow:
    """One end-to-end validation run: where it sits and the tool's absolute error on it."""

    source: str
    case: str
    gpu: str
    params: float
    num_gpus: int
    gpus_per_node: int
    t: int
    p: int
    abs_error: float
    stack: str = "megatron"
    #: the share of the run's predicted step in which the GPU waits for eager PyTorch's CPU
    #: (:func:`host_wait_share`); None where the run does not state one (Megatron runs)
    host_share: float | None = None

    @property
    def single_node(self) -> bool:
        return self.num_gpus <= self.gpus_per_node


@lru_cache(maxsize=1)
def load_bands() -> tuple[BandRow, ...]:
    """The bundled rows (``data/expected_error.csv``)."""
    text = BANDS_PATH.read_text(encoding="utf-8")
    return tuple(BandRow(r["source"], r["case"], r["gpu"], float(r["params"]), int(r["num_gpus"]), int(r["gpus_per_node"]),
                         int(r["t"]), int(r["p"]), float(r["abs_error"]), r.get("stack") or "megatron",
                         float(r["host_share"]) if r.get("host_share") else None)
                 for r in csv.DictReader(io.StringIO(text)))


def _distance(row: BandRow, params: float, t: int, p: int, host_share: float | None = None) -> float:
    d = abs(math.log10(params / row.params)) + 0.5 * abs(math.log2(t / row.t)) + 0.5 * abs(math.log2(p / row.p))
    if host_share is not None and row.host_share is not None:
        d += HOST_WEIGHT * abs(host_share - row.host_share)
    return d


def expected_error_for(config: ParallelConfig, cluster: Cluster, model_params: float,
                       rows: Sequence[BandRow] | None = None, min_kind: int = MIN_KIND,
                       host_share: float | None = None) -> tuple[float, str]:
    """(expected relative error, where it comes from) of an iteration time predicted for
    ``config`` on ``cluster`` for a model of ``model_params`` parameters (module docstring).

    ``rows`` defaults to the bundled file; ``min_kind``: :data:`MIN_KIND`; ``host_share``: the
    share of the predicted step the GPU waits for the CPU (:func:`host_wait_share`; None: not
    stated), which ranks the runs that state theirs (:data:`HOST_WEIGHT`).  The source reads like ``"vtrain: mean |error| of the
    20 nearest single-node A100-SXM4-80GB runs (1.3e+08-3.5e+08 parameters)"``.

    Raises
    ------
    ValueError
        ``model_params`` not positive, or no rows (programming errors: the bundled file is fixed).
    """
    if not (model_params > 0):
        raise ValueError(f"model_params must be positive, got {model_params!r}")
    stack = str(getattr(config, "stack", "megatron"))
    single = cluster.num_gpus <= cluster.gpus_per_node
    host = None if host_share is None else round(float(host_share), 2)  # the bands' resolution: the analysis and the sweep agree
    gpu = base_gpu_name(cluster.gpu.name)  # a calibrated GPU: its base preset's validated runs
    if rows is None and min_kind == MIN_KIND:  # the bundled file: one answer per what it depends on
        return _bundled_error(gpu, stack, single, config.tp_size, config.pp_size, float(model_params), host)
    return _error_of(load_bands() if rows is None else rows, gpu, stack, single, config.tp_size, config.pp_size,
                     float(model_params), min_kind, host_share=host)


@lru_cache(maxsize=4096)
def _bundled_error(gpu: str, stack: str, single: bool, t: int, p: int, model_params: float,
                   host_share: float | None = None) -> tuple[float, str]:
    """:func:`expected_error_for` on the bundled rows, cached per the inputs it reads (a sweep
    asks for the same few (t, p) many times: about 2 ms each uncached)."""
    return _error_of(load_bands(), gpu, stack, single, t, p, model_params, MIN_KIND, _bundled_pools(gpu, stack, single), host_share)


@lru_cache(maxsize=64)
def _bundled_pools(gpu: str, stack: str, single: bool) -> tuple[list[BandRow], list[BandRow]]:
    """:func:`_pools` of the bundled rows, once per (gpu, stack, regime): a sweep's rows ask
    for a few regimes at many (t, p) and sizes, and the filter reads every one of ~1,600 rows."""
    return _pools(load_bands(), gpu, stack, single)


def _pools(rows: Sequence[BandRow], gpu: str, stack: str, single: bool) -> tuple[list[BandRow], list[BandRow]]:
    """(the rows of this ``gpu`` and ``stack``, those of them in the ``single``-node regime or,
    when there are none, all of them)."""
    kind = [r for r in rows if r.gpu == gpu and r.stack == stack]
    return kind, [r for r in kind if r.single_node == single] or list(kind)


def _error_of(rows: Sequence[BandRow], gpu: str, stack: str, single: bool, t: int, p: int, model_params: float,
              min_kind: int, pools: tuple[list[BandRow], list[BandRow]] | None = None,
              host_share: float | None = None) -> tuple[float, str]:
    """:func:`expected_error_for` of a ``gpu``/``stack`` prediction at ``t``, ``p``, one node or
    several (``single``), for ``model_params`` parameters; ``pools``: :func:`_pools` of the
    same arguments, when the caller holds them."""
    if not rows:
        raise ValueError("no validation rows to derive an expected error from")
    kind, pool = pools if pools is not None else _pools(rows, gpu, stack, single)
    if len(kind) < min_kind:
        return _unvalidated(rows, kind, gpu, stack)
    rows = kind

    def distance(r: BandRow) -> float:
        return _distance(r, model_params, t, p, host_share)

    far = ""
    if min(abs(math.log10(model_params / r.params)) for r in pool) > FAR:
        # no run of this regime within a decade of this one (a small model on many GPUs): the
        # nearest runs of either regime say more than distant runs of the same one
        pool = list(rows)
        regime_runs = "single-node" if single else "multi-node"
        far = f"; no validated {regime_runs} run within 10x of this model's size: nearest runs of either kind"
    near = sorted(pool, key=lambda r: (distance(r), r.source, r.case))[:K]
    error = weighted_quantile([dataclasses.replace(r, source="near") for r in near], BAND_QUANTILE)
    sources = sorted({r.source for r in near})
    lo, hi = min(r.params for r in near), max(r.params for r in near)
    kinds = sorted({"single-node" if r.single_node else "multi-node" for r in near})
    regime = "/".join(kinds)
    gpus = sorted({r.gpu for r in near})
    hosted = [r.host_share for r in near if r.host_share is not None]
    bound = (f", GPU waiting for the CPU {_share_range(min(hosted), max(hosted))} of the step, this one {host_share:.0%}"
             if host_share is not None and hosted else "")
    return error, (f"{', '.join(sources)}: the {BAND_QUANTILE:.0%} quantile of |error| of the {len(near)} nearest {regime} {'/'.join(gpus)} {stack} runs "
                   f"({_size_range(lo, hi)} parameters{bound}){far}")


def weighted_quantile(rows: Sequence[BandRow], q: float) -> float:
    """The ``q`` quantile of the rows' absolute errors with each source weighing the same (a
    source's runs share its weight): the smallest error whose cumulative weight reaches ``q``."""
    counts: dict[str, int] = {}
    for r in rows:
        counts[r.source] = counts.get(r.source, 0) + 1
    ranked = sorted(rows, key=lambda r: r.abs_error)
    total, need = 0.0, q * len(counts)
    for r in ranked:
        total += 1.0 / counts[r.source]
        if total >= need - 1e-12:
            return r.abs_error
    return ranked[-1].abs_error


def _unvalidated(rows: Sequence[BandRow], kind: Sequence[BandRow], gpu: str, stack: str) -> tuple[float, str]:
    error = weighted_quantile(rows, UNVALIDATED_QUANTILE)
    own = sum(r.abs_error for r in kind) / len(kind) if kind else 0.0
    sources = sorted({r.source for r in rows})
    have = f"only {len(kind)} validated {stack} run{'s' if len(kind) != 1 else ''} on {gpu}" if kind else f"no validated {stack} run on {gpu}"
    if own > error:
        return own, f"{have}: their mean |error|, above the {UNVALIDATED_QUANTILE:.0%} quantile of every validated source's"
    return error, (f"{have}: the {UNVALIDATED_QUANTILE:.0%} quantile of |error| over every validated source, each weighing the same "
                   f"({', '.join(sources)})")


def _share_range(lo: float, hi: float) -> str:
    """``12%`` when both ends print alike, else ``0-12%``."""
    a, b = f"{lo:.0%}", f"{hi:.0%}"
    return a if a == b else f"{a[:-1]}-{b}"


def host_wait_share(coster: Any, config: ParallelConfig, iteration_s: float) -> float | None:
    """The share of ``config``'s iteration in which the GPUs wait for eager PyTorch's CPU: the
    run-ahead host model's stretch of the layers' kernel times (``LayerTable.idle``, per
    micro-batch) times the micro-batches, over the pipeline depth and the iteration time; None
    under another host model (Megatron's states none).  What the band ranks runs by
    (:data:`HOST_WEIGHT`), for the analysis, the sweep and ``validate`` alike."""
    if iteration_s <= 0 or not coster.host_for(config).run_ahead:  # no table lookup per sweep row otherwise
        return None
    idle = coster.layer_table(config).idle
    if idle is None:
        return None
    return min(1.0, float(idle.sum()) * config.num_micro_batches / config.pp_size / iteration_s)


def _size_range(lo: float, hi: float) -> str:
    """``1.2e+08`` when both ends print alike, else ``1.2e+08-3.5e+08``."""
    a, b = f"{lo:.2g}", f"{hi:.2g}"
    return a if a == b else f"{a}-{b}"


# ----------------------------------------------------------------------------- --profile band
def profile_expected_error(config: ParallelConfig, cluster: Cluster, num_params: float, layered: Any,
                           layers: Sequence[Any], stages: Sequence[Any], iteration_s: float,
                           exposed_comm_s: float, plan_wait: float | None = None) -> dict[str, Any] | None:
    """The expected relative error of an iteration time predicted with a profile's measured
    ratios (``--profile``; None without one), from what the traces measured rather than from the
    validated runs nearest this one.  Components, each a share of the iteration time:

    - ``timing``: :data:`PROFILE_TIMING_NOISE`, the uncertainty of the measured step itself (a
      median of ten steps).
    - ``host``: the share of the step in which the GPU waited for the CPU (the profiled step's
      starved idle over its span; with ``--step-time``, the step without the profiler less the
      GPU's busy and queued idle time: :func:`dml2comm.traces.predict.error_figures`), or, for a
      plan off the profiled shapes (``doublings`` > 0), the plan's own predicted wait
      (``plan_wait``: :func:`host_wait_share`), larger or smaller: a plan at a smaller
      micro-batch waits longer for the CPU than a GPU-bound profiled step showed (Llama-1B's H100
      step at b = 4 waited 1.1% of it; the plan at b = 2, 4%), and a plan at a larger one than a
      host-bound step's waits less (the CPU's speed, uncertain under the profiler, moves the plan
      only where the CPU sets it; over 228 dev pairs of unbundled traces, each trace predicting
      the other shapes of its process, the plan's own wait kept 227 inside their band at a median
      of ±12.5%, the larger of the two 228 at ±23.5%); at most
      :data:`PROFILE_HOST_SPREAD`, the spread of the CPU's speed under the profiler, which bounds
      the error of a step the CPU sets entirely.  The host model predicts that wait; the trace
      bounds it only by its size.  Without
      ``--step-time`` the profiler's CPU slowdown is taken as its measured median
      (:data:`dml2comm.traces.host.PROFILER_CPU_SLOWDOWN`), which a given machine may not show.  Where the host model is not the trace's (``--host-model`` names one),
      all of the profiled step's GPU idle (:func:`~dml2comm.traces.predict.error_figures`'
      ``idle_share``): the idle between queued kernels is then a preset's too.
    - ``noise``: half the spread of the step's identical blocks ((max - min) / mean of the
      measured times of blocks modelled alike: the variation of the same kernels within one step;
      :func:`dml2comm.traces.predict.measured_and_modelled`'s ``block_spread``), on the scaled
      compute.
    - ``join``: the share of the trace's GPU time the join could not attribute to a layer (the
      ratios miss it), on the scaled compute.
    - ``shapes``: the held-out shape error per doubling of GEMM shape
      (:func:`dml2comm.traces.predict.held_out_shapes`) times how many doublings the plan's
      GEMMs are from the profiled ones (:func:`plan_doublings`: 0 at the profiled shape), on
      the scaled compute (the model's own band where the traces hold one GEMM shape only).
    - ``unscaled``, ``communication``, ``other_gpu``: the compute no ratio scaled, the exposed
      communication (the trace ran d = t = p = 1), and, on a GPU other than the profiled one,
      the scaled compute, each times the model's own validated band (:func:`expected_error_for`).

    The band is their sum: the components are errors of separate parts of the step, which may add
    (no constant is fitted)."""
    scale = cluster.profile_scale
    if scale is None:
        return None
    return profile_band(config, cluster, num_params, layered, scaled_share(scale, layers, stages, config.num_micro_batches),
                        iteration_s, exposed_comm_s, plan_wait=plan_wait)


def profile_band(config: ParallelConfig, cluster: Cluster, num_params: float, layered: Any, scaled: float,
                 iteration_s: float, exposed_comm_s: float, copies: Sequence[int] | None = None,
                 plan_wait: float | None = None) -> dict[str, Any] | None:
    """:func:`profile_expected_error` given the share of the plan's compute the ratios scaled
    (``scaled``: :func:`dml2comm.cost.profile.scaled_share`), for a caller without the analysis's
    layer and stage rows (:func:`summary_band`); ``copies``: per layer of ``layered``, how many
    layers of the full model it stands for (:func:`plan_doublings`; None: ``layered`` is the
    full model); ``plan_wait``: the plan's own host-wait share (:func:`host_wait_share`)."""
    scale = cluster.profile_scale
    fig = dict(scale.detail).get("error") if scale is not None else None
    if fig is None:
        return None
    own, own_source = expected_error_for(config, cluster, float(max(num_params, 1)))
    comm = min(1.0, exposed_comm_s / iteration_s) if iteration_s > 0 else 0.0
    a = scaled * (1.0 - comm)
    doublings = plan_doublings(layered, fig["shapes"], config.tp_size, config.cp_size, copies, fig.get("batch_seqs", ()))
    other_gpu = cluster.gpu.name not in fig["gpus"]
    fitted = scale.host is not None  # the trace's host model (else the stack's preset or a named one)
    parts = {
        "timing": PROFILE_TIMING_NOISE,
        "host": _host_part(fig, plan_wait if doublings > 0 else None) if fitted else fig["idle_share"],
        "noise": fig["block_spread"] / 2 * a,
        "join": fig["unattributed_share"] * a,
        "shapes": _shape_part(fig["held_out"], doublings, own) * a,
        "unscaled": own * max(0.0, 1.0 - comm - a),
        "communication": own * comm,
        "other_gpu": own * a if other_gpu else 0.0,
    }
    total = sum(parts.values())
    files = ", ".join(f for f, _ in scale.files)
    names = dict(_PART_NAMES, host="host wait" if fitted else "GPU idle (a host model not the trace's)")
    source = f"from the profile ({files}): " + " + ".join(f"{names[k]} {v:.1%}" for k, v in parts.items() if v >= 5e-4)
    if fitted and fig["host_bound"] and fig["step_time_s"] is None:
        source += ("; the profiled step is host-bound and the profiler's CPU slowdown is taken as its measured median "
                   "(1.03-1.53 seen): --step-time measures it")
    return {"total": total, "source": source, "components": parts, "scaled_share_of_iteration": a, "exposed_comm_share": comm,
            "doublings": doublings, "held_out": fig["held_out"], "host_bound": fig["host_bound"],
            "step_time_s": fig["step_time_s"], "model_band": own, "model_band_source": own_source,
            "rule": "sum of the components (each a share of the iteration time)"}


def _shape_part(held_out: dict[str, Any], doublings: float, own: float) -> float:
    """The ``shapes`` component per unit of scaled compute: the held-out error per doubling times
    the plan's doublings; where the traces had one GEMM shape (nothing to hold out), the model's
    own band for a plan off the profiled shape (the trace cannot tell how its ratios carry)."""
    if doublings <= 0:
        return 0.0
    if held_out["shapes"] < 2:
        return own
    return held_out["per_doubling"] * doublings


_PART_NAMES = {"timing": "timed median", "host": "host wait", "noise": "block spread", "join": "unattributed", "shapes": "held-out shapes",
               "unscaled": "unscaled compute", "communication": "communication", "other_gpu": "other GPU"}


def plan_doublings(layered: Any, profiled: Sequence[Sequence[int]], tp_size: int = 1, cp_size: int = 1,
                   copies: Sequence[int] | None = None, batch_seqs: Sequence[Sequence[int]] = ()) -> float:
    """How far a plan's GEMMs are from the profiled ones, in doublings: per weight GEMM of the
    plan's graph ((M, N, K) at its micro-batch and sequence), the distance to the nearest profiled
    shape (:func:`dml2comm.ir.gemms.shape_doublings`), averaged weighting each by its FLOPs;
    plus ``log2 t`` and ``log2 c`` (tensor and context parallelism split N or K and M of every
    GEMM, which the unsharded graph does not show).  0 at the profiled shape itself.  With the
    profiled (micro-batch, sequence) pairs ``batch_seqs``, each attention core of the plan (a flash
    core: :func:`dml2comm.cost.cache.flash_cores_of`, its query ``[b, h, s, d]``) joins the
    average too, weighing its ``4 b h s s_k d`` FLOPs as a GEMM weighs its ``2 M N K``, at
    ``|log2(b s / (b' s'))| + |log2(s_k / s')|`` from the nearest profiled pair ``(b', s')``: its
    rows as a GEMM's M, its keys besides (a plan with the profiled tokens in shorter sequences has
    the profiled GEMMs, but not the profiled attention).

    ``copies``: per layer of ``layered``, how many layers of the full model it stands for (a
    collapsed graph's layer map counted: :mod:`dml2comm.ir.repeats`), each GEMM's FLOPs weighing
    that many times; None: one each.  The FLOPs are integers (exact in floats), so a collapsed
    graph gives the full graph's figure exactly.  The average is cached on the graph per
    profiled shapes and copies (a sweep asks for it per configuration)."""
    if not profiled:
        return 0.0
    key = _DoublingsKey(tuple(tuple(int(x) for x in p) for p in profiled), None if copies is None else tuple(int(c) for c in copies),
                        tuple((int(b), int(s)) for b, s in batch_seqs))
    near = derived(layered.graph, key, lambda: _mean_doublings(layered, key.profiled, key.copies, key.batch_seqs))
    return near + math.log2(max(tp_size, 1)) + math.log2(max(cp_size, 1))


@dataclass(frozen=True, slots=True)
class _DoublingsKey(CacheKey):
    """:func:`plan_doublings`' FLOPs-weighted mean distance: the graph, the profiled shapes and the layer copies."""

    profiled: tuple[tuple[int, ...], ...]
    copies: tuple[int, ...] | None
    batch_seqs: tuple[tuple[int, int], ...] = ()


def _mean_doublings(layered: Any, profiled: Sequence[Sequence[int]], copies: Sequence[int] | None,
                    batch_seqs: Sequence[tuple[int, int]] = ()) -> float:
    flops: dict[tuple[int, ...], float] = {}
    for key, layer in graph_gemms(layered):
        flops[key] = flops.get(key, 0.0) + float(math.prod(key)) * (1 if copies is None else copies[layer])
    total = sum(flops.values())
    weighted = sum(w * min(shape_doublings(k, p) for p in profiled) for k, w in flops.items())
    for work, tokens, s_k, layer in _attention_work(layered) if batch_seqs else ():
        w = work * (1 if copies is None else copies[layer])
        total += w
        weighted += w * min(abs(math.log2(tokens / (b * s))) + abs(math.log2(s_k / s)) for b, s in batch_seqs)
    return weighted / total if total > 0 else 0.0


def _attention_work(layered: Any) -> list[tuple[float, int, int, int]]:
    """Per flash core of the graph whose query is ``[b, h, s_q, d]``: half its ``4 b h s_q s_k d``
    FLOPs (as a GEMM's ``M N K`` is half of its), its query tokens ``b s_q``, its key length and
    its layer."""
    out = []
    graph = layered.graph
    for core in flash_cores_of(graph):
        q, k = graph.tensor(core.q), graph.tensor(core.k)
        if q is None or k is None or len(q.shape) != 4 or len(k.shape) < 2:
            continue
        s_q, d = int(q.shape[-2]), int(q.shape[-1])
        s_k = int(k.shape[-1] if k.shape[-2] == d else k.shape[-2])  # K^T as the product reads it: [.., d, s_k]
        if s_k < 1 or s_q < 1:
            continue
        out.append((2.0 * (q.numel // (s_q * d)) * s_q * s_k * d, int(q.shape[0]) * s_q, s_k, layered.layer_of_op[core.context_op]))
    return out


# ----------------------------------------------------------------------------- one band per summary
def _host_part(fig: dict[str, Any], plan_wait: float | None) -> float:
    """The host component of a profile band under the trace's host model (:func:`profile_band`):
    at the profiled shape the profiled step's wait, which the trace measured (``plan_wait``
    None); off it the plan's own predicted wait (the CPU's speed, which the profile leaves
    uncertain, moves a step only as much as the CPU sets it: a GPU-bound plan from a host-bound
    trace is no less certain than the GPU's side, a plan at a smaller micro-batch than a GPU-bound
    trace's waits longer than the trace showed); at most :data:`PROFILE_HOST_SPREAD`."""
    return min(fig["host_wait_share"] if plan_wait is None else plan_wait, PROFILE_HOST_SPREAD)


def summary_band(config: ParallelConfig, cluster: Cluster, coster: Any, plan: Any, iteration_s: float,
                 exposed_comm_s: float, wait: float | None = None) -> tuple[float, str]:
    """(expected relative error, where it comes from) of the iteration time predicted for
    ``config``: what the analysis's summary and the sweep's row both state.  With a profile
    (``cluster.profile_scale``, ``--profile``), the trace-derived band (:func:`profile_band`),
    else the validated runs nearest this one (:func:`expected_error_for`).

    ``coster``: the :class:`~dml2comm.cost.stages.StageCoster` that priced ``plan`` (its
    :class:`~dml2comm.cost.stages.StagePlan` for ``config``), on the whole graph (the analysis)
    or a collapsed one (the sweep): it gives the full model's parameter count
    (``model_params``), per full layer its kind (``kinds``) and forward/backward time
    (``layer_table``), per stage the loss (``stage_table``), and the graph (``layered``,
    ``layer_map``) whose GEMMs :func:`plan_doublings` reads, each collapsed layer counted as many
    times as the full layers it stands for.  ``wait``: the plan's :func:`host_wait_share` where the
    caller has it (else computed here)."""
    params = float(max(coster.model_params, 1))
    wait = host_wait_share(coster, config, iteration_s) if wait is None else wait
    scale = cluster.profile_scale
    if scale is not None and dict(scale.detail).get("error") is not None:
        layers = coster.layer_table(config)
        table = coster.stage_table(config)
        scaled = scaled_share_of(scale, coster.kinds, layers.fwd.tolist(), layers.bwd.tolist(), plan.compute_f.tolist(),
                                 plan.compute_b.tolist(), table.loss_f.tolist(), table.loss_b.tolist(), plan.optimizer.tolist(),
                                 config.num_micro_batches)
        copies = None if coster.collapsed is None else np.bincount(coster.layer_map, minlength=len(coster.layered.layers))
        band = profile_band(config, cluster, params, coster.layered, scaled, iteration_s, exposed_comm_s, copies, wait)
        if band is not None:
            return band["total"], band["source"]
    return expected_error_for(config, cluster, params, host_share=wait)
