"""Fitting helpers shared by the kernel classes (:mod:`dml2comm.calibrate.classes`), and the
collectives' fit, with residuals and held-out errors.

- :func:`gemm_predict`: the GEMM shape law (:func:`dml2comm.cost.gemm.analytical_times_s`) on
  profiled shapes at a sustained factor; :func:`golden_min`: a bounded golden-section search
  (Kiefer, "Sequential minimax search for a maximum", Proc. AMS 4, 1953); :func:`medians`: the
  median time per distinct shape.
- **Collectives** ``t = alpha + beta S`` per (kind, group size, level): weighted least squares of
  the relative error over the distinct sizes (their median time: a collective inside a training
  step also waits for its slowest peer, the median resists those outliers), ``alpha >= 0``,
  ``beta > 0``.

Residuals are relative errors ``|model - measured| / measured`` over every sample (median and
worst).  Held-out (``holdout`` > 0): the distinct shapes (sizes) are ordered by a hash of the
shape and the first ``holdout`` share is left out of the fit and scored alone, so every repeat
of one shape is on the same side (split by shape, not at random within a shape).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Callable, Hashable, Sequence, TypeVar

import numpy as np

from dml2comm.calibrate.samples import CollectiveSample
from dml2comm.cost.gemm import ALIGNMENT_BYTES, analytical_times_s, shape_law
from dml2comm.hardware.gpus import GPU

__all__ = ["Residual", "FitOutcome", "fit_collective", "split_by_shape",
           "gemm_predict", "golden_min", "medians", "MIN_MEMORY_BYTES", "MIN_COLLECTIVE_SIZES",
           "GEMM_FIT_DTYPES", "GEMM_BYTES", "SUSTAINED_BOUNDS"]

#: Fewest distinct message sizes a collective is fitted on; fewer -> a warning and the base value
#: (the kernel classes' minimums: dml2comm.calibrate.classes.MIN_SHAPES).
MIN_COLLECTIVE_SIZES = 2
#: Memory-bound kernels smaller than this are left out of the HBM fit: the model has no latency
#: term, and a kernel's fixed cost (launch, tail: a few microseconds) would pass for low
#: bandwidth.  32 MiB streams in about 20 us at 1.7 TB/s (A100), so a 2 us fixed cost is <= 10%.
MIN_MEMORY_BYTES = 32 * 2**20
#: Data types of the tensor-core law (dml2comm/cost/gemm.py); fp32 on CUDA cores is not modelled by it.
GEMM_FIT_DTYPES = ("tf32", "bf16", "fp16", "fp8")
#: Search interval of the sustained factor; a fit at either end is refused (the law does not fit).
SUSTAINED_BOUNDS = (0.02, 1.5)
#: (operand, output) bytes per element of the GEMM data types (as :mod:`dml2comm.cost.gemm`).
GEMM_BYTES = {"fp32": (4, 4), "tf32": (4, 4), "bf16": (2, 2), "fp16": (2, 2), "fp8": (1, 2)}

T = TypeVar("T")


@dataclass(frozen=True)
class Residual:
    """Relative errors of a fit on a set of samples."""

    samples: int
    shapes: int
    median_rel_error: float
    worst_rel_error: float

    def to_dict(self) -> dict[str, float | int]:
        return {"samples": self.samples, "shapes": self.shapes, "median_rel_error": round(self.median_rel_error, 6),
                "worst_rel_error": round(self.worst_rel_error, 6)}


@dataclass(frozen=True)
class FitOutcome:
    """A fitted term: its value(s), residual on the fitted samples, and held-out residual."""

    values: dict[str, float]
    residual: Residual
    holdout: Residual | None


def _residual(pred: np.ndarray, meas: np.ndarray, shapes: int) -> Residual:
    rel = np.abs(pred - meas) / meas
    return Residual(int(meas.size), shapes, float(np.median(rel)), float(rel.max()))


def _shape_hash(key: Hashable) -> str:
    return hashlib.sha256(repr(key).encode()).hexdigest()


def split_by_shape(samples: Sequence[T], key: Callable[[T], Hashable], holdout: float) -> tuple[list[T], list[T]]:
    """(fit, held out): the distinct keys ordered by a hash of the key, the first
    ``round(holdout x keys)`` held out (at least one when ``holdout > 0`` and two keys or more;
    at most all but one)."""
    keys = sorted({key(s) for s in samples}, key=_shape_hash)
    if holdout <= 0 or len(keys) < 2:
        return list(samples), []
    count = min(max(1, round(holdout * len(keys))), len(keys) - 1)
    held = set(keys[:count])
    return [s for s in samples if key(s) not in held], [s for s in samples if key(s) in held]


def medians(samples: Sequence[T], key: Callable[[T], Hashable], time: Callable[[T], float]) -> tuple[list[Hashable], np.ndarray]:
    groups: dict[Hashable, list[float]] = {}
    for s in samples:
        groups.setdefault(key(s), []).append(time(s))
    keys = sorted(groups, key=repr)
    return keys, np.array([float(np.median(groups[k])) for k in keys])


# ----------------------------------------------------------------------------------- GEMMs


def gemm_predict(gpu: GPU, keys: Sequence[tuple], f: float, aligned: bool | None = None) -> np.ndarray:
    """Analytical times (s) of GEMM keys ``(b, m, n, k, dtype)`` on ``gpu`` at sustained factor ``f``
    (``aligned``: every shape aligned, e.g. a convolution's implicit GEMM; None: by the rule below)."""
    out = np.empty(len(keys))
    by_dtype: dict[str, list[int]] = {}
    for i, k in enumerate(keys):
        by_dtype.setdefault(k[4], []).append(i)
    for dtype, idx in by_dtype.items():
        shp = np.array([keys[i][:4] for i in idx], dtype=float)
        in_b, out_b = GEMM_BYTES[dtype]
        # a profiled aten::mm gives its operands' shapes, not their strides: a transposed view
        # (the weight gradient's dY^T) makes M a row length too, so a 16-bit GEMM counts as
        # aligned only when M, N and K all are (dml2comm.cost.gemm.is_aligned's rule on N and K)
        dims = shp[:, 1:4].astype(np.int64)
        rows = (np.ones(len(idx), dtype=bool) if in_b != 2 or aligned
                else np.all(dims % (ALIGNMENT_BYTES // in_b) == 0, axis=1))
        out[idx] = analytical_times_s(shp[:, 0], shp[:, 1], shp[:, 2], shp[:, 3], peak_flops_per_s=gpu.peak_flops_per_s[dtype],
                                      sm_count=gpu.sm_count, hbm_bytes_per_s=gpu.kernel_hbm_bytes_per_s, in_bytes=in_b,
                                      out_bytes=out_b, sustained=f, law=shape_law(gpu), aligned=rows)
    return out


def golden_min(fun: Callable[[float], float], lo: float, hi: float, iters: int = 60) -> float:
    """Minimum of a unimodal ``fun`` on [lo, hi] by golden-section search (Kiefer 1953)."""
    g = (math.sqrt(5) - 1) / 2
    a, b = lo, hi
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = fun(c), fun(d)
    for _ in range(iters):
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = fun(c)
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = fun(d)
    return (a + b) / 2


# --------------------------------------------------------------------------- collectives


def fit_collective(samples: Sequence[CollectiveSample], holdout: float = 0.0) -> FitOutcome | None:
    """``alpha_s`` and ``beta_s_per_byte`` of ``t = alpha + beta S`` for samples of one (kind,
    group size, level) (module docstring); None when no positive bandwidth term fits (sizes too
    alike or times too noisy)."""
    fit_s, held_s = split_by_shape(samples, lambda s: s.size_bytes, holdout)
    sizes, meas = medians(fit_s, lambda s: s.size_bytes, lambda s: s.time_s)
    size = np.array(sizes, dtype=float)
    # minimise sum ((alpha + beta S - t) / t)^2: rows [1/t, S/t] x [alpha, beta] = 1
    a = np.stack([1.0 / meas, size / meas], axis=1)
    (alpha, beta), *_ = np.linalg.lstsq(a, np.ones(size.size), rcond=None)
    if alpha < 0:  # the latency term cannot be negative: bandwidth alone
        alpha = 0.0
        beta = float(np.sum(size / meas) / np.sum((size / meas) ** 2))
    if not beta > 0:
        return None

    def predict(ss: Sequence[CollectiveSample]) -> np.ndarray:
        return alpha + beta * np.array([s.size_bytes for s in ss])

    residual = _residual(predict(fit_s), np.array([s.time_s for s in fit_s]), len(sizes))
    held = None
    if held_s:
        held = _residual(predict(held_s), np.array([s.time_s for s in held_s]), len({s.size_bytes for s in held_s}))
    return FitOutcome({"alpha_s": float(alpha), "beta_s_per_byte": float(beta)}, residual, held)
