"""Per-kernel-class fits with a held-out verdict: which of the user's kernel classes the calibration
can be trusted for.

One value per class of :mod:`dml2comm.cost.calibrated` (the classes the cost model reads), each
fitted on its own samples (:mod:`dml2comm.calibrate.samples`).  Every fit matches the class's
**summed time** over its fitted shapes (each shape's median time times its repeats): a step adds
its kernels' times up, so that is the quantity a value must get right; the per-shape median and
worst errors are reported beside it.

- **GEMM regimes** (``gemm_large``, ``gemm_small``, ``gemm_unaligned``, ``conv``): the sustained
  factor ``f`` of the shape law (:func:`dml2comm.cost.gemm.analytical_times_s`) at which the law's
  summed time equals the measured one (a golden-section search on ``log f``, Kiefer 1953, the
  law's time falling as ``f`` grows).  The regimes are the law's own cases
  (:func:`dml2comm.cost.calibrated.gemm_regime`): the tiled rate of large aligned GEMMs, the
  latency and partial-wave time of small ones (below 1 GFLOP), cuBLAS's fallback kernel for
  unaligned 16-bit rows, cuDNN's implicit GEMMs.  One factor cannot serve all four: the fallback
  runs at a fitted fraction of the rate and small GEMMs at the law's fixed latency, so a factor
  fitted on their mix describes none of them.
- **Memory-bound classes** (``pointwise``, ``norm``): the HBM efficiency
  ``e = sum bytes / (HBM x sum t)`` over the samples of at least
  :data:`~dml2comm.calibrate.fit.MIN_MEMORY_BYTES` (smaller ones are launch-bound).  Normalisations
  and reductions run as block-reduction kernels that reach a fraction of the bandwidth
  element-wise kernels do on the bundled H100 traces (``vectorized_layer_norm_kernel`` 0.39 of
  3.35 TB/s, its backward 0.22, against 0.85-0.95 for large contiguous element-wise kernels), so
  one efficiency for both fits neither (the single efficiency's 33% median residual on the
  Llama-1B trace).  The loss's log-softmax passes are ``pointwise`` samples with the cost model's
  byte count (:mod:`dml2comm.cost.loss`, which times them at the element-wise efficiency).
- **Time scales** (``attention_fwd``, ``attention_bwd``, ``optimizer``): ``c = sum t / sum law``;
  the law is the base model's: :func:`dml2comm.cost.attention.flash_times_s` (costed causal: the
  profiler's shapes do not record ``is_causal``), :func:`dml2comm.cost.compute.optimizer_step_s`
  (AdamW, the parameters' element size: bf16 -> ``bf16``, fp32 -> ``amp``).

Verdict: the distinct shapes of a class are split by a hash of the shape
(:func:`~dml2comm.calibrate.fit.split_by_shape`, ``holdout`` of them held out); the value is
fitted on the rest and **used only when, on the held-out shapes, it beats the base model on
both their median relative error and the relative error of their summed time** (the base is
the uncalibrated cost model: the preset's GEMM model, tables included,
:data:`~dml2comm.cost.compute.HBM_EFFICIENCY`, the flash and optimizer laws as they are).
Otherwise the base stays, with the reason.  A class with too few shapes for a fit and a held-out
shape keeps the base with a warning naming what to record.  With ``holdout`` = 0 there is no
check and every fitted value is used.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Sequence

import numpy as np

from dml2comm.calibrate.fit import (GEMM_BYTES, GEMM_FIT_DTYPES, MIN_MEMORY_BYTES, SUSTAINED_BOUNDS, Residual, golden_min,
                                    medians, gemm_predict, split_by_shape)
from dml2comm.calibrate.samples import GemmSample, MemorySample, TraceSamples
from dml2comm.cost.attention import FlashShape, flash_cost, flash_times_s
from dml2comm.cost.calibrated import GEMM_CLASSES, gemm_regime
from dml2comm.cost.compute import hbm_efficiency_of, optimizer_step_s
from dml2comm.cost.gemm import ALIGNMENT_BYTES, gemm_time_s, sustained_factor
from dml2comm.hardware.gpus import GPU
from dml2comm.ir.graph import DType

__all__ = ["ClassSpec", "ClassFit", "class_specs", "fit_class", "MIN_SHAPES", "SCALE_BOUNDS", "LABELS", "QUANTITIES"]

#: Fewest distinct shapes a class is fitted on (a held-out split needs one more).  A sustained
#: factor or an efficiency over three shapes, as the single fits asked; a time scale of a law
#: that already has the shape in it from one.
MIN_SHAPES = {"gemm_large": 3, "gemm_small": 3, "gemm_unaligned": 3, "conv": 3, "pointwise": 3, "norm": 3,
              "attention_fwd": 1, "attention_bwd": 1, "optimizer": 1}
#: Search interval of a time scale; a fit outside is refused (the law does not describe the kernels).
SCALE_BOUNDS = (0.2, 5.0)
#: Efficiencies outside this interval are refused (a class whose bytes the operator shapes miscount).
EFFICIENCY_BOUNDS = (0.05, 1.5)
LABELS = {"gemm_large": "GEMM, aligned, >= 1 GFLOP", "gemm_small": "GEMM, aligned, < 1 GFLOP",
          "gemm_unaligned": "GEMM, unaligned 16-bit rows", "conv": "convolution (implicit GEMM)",
          "attention_fwd": "flash attention forward", "attention_bwd": "flash attention backward",
          "pointwise": "element-wise", "norm": "normalisation / softmax / reduction", "optimizer": "fused optimizer step"}
QUANTITIES = {**{c: "sustained factor" for c in GEMM_CLASSES}, "pointwise": "HBM efficiency", "norm": "HBM efficiency",
              "attention_fwd": "time scale", "attention_bwd": "time scale", "optimizer": "time scale"}
#: What to record when a class has too few shapes.
_RECORD = {"gemm_large": "profile steps with large matrix products of several shapes",
           "gemm_small": "profile steps with small matrix products of several shapes",
           "gemm_unaligned": "profile a model with odd dimensions (an unpadded vocabulary)",
           "conv": "profile a convolutional model",
           "attention_fwd": "profile steps at two or more sequence lengths or head counts (SDPA flash attention)",
           "attention_bwd": "profile steps at two or more sequence lengths or head counts (SDPA flash attention)",
           "pointwise": "profile a step with large activations",
           "norm": "profile a step with large activations",
           "optimizer": "profile steps of two models, or of one model at two sizes, with torch.optim.AdamW(fused=True)"}


@dataclass(frozen=True)
class ClassSpec:
    """How one class is fitted: its samples, their shape key and time, the model at a value, the
    base model, the closed-form or searched fit."""

    name: str
    samples: list[Any]
    key: Callable[[Any], Hashable]
    predict: Callable[[Sequence[Hashable], float], np.ndarray]  # model times of shape keys at a value
    base_predict: Callable[[Sequence[Hashable]], np.ndarray]  # the uncalibrated cost model's times
    fit: Callable[[Sequence[Hashable], np.ndarray, np.ndarray], float]  # (shape keys, median times, repeats)
    base: float  # the base's value of the quantity
    bounds: tuple[float, float]
    describe: Callable[[Hashable], str]  # a shape in words, for the page


@dataclass
class ClassFit:
    """One class's outcome (module docstring)."""

    name: str
    value: float | None
    base: float
    samples: int
    shapes: int
    residual: Residual | None
    holdout: Residual | None
    base_holdout: Residual | None
    used: bool
    why: str
    examples: list[str] = field(default_factory=list)
    #: relative error of the held-out shapes' summed time (every repeat), calibrated and base
    holdout_total: float | None = None
    base_holdout_total: float | None = None

    def to_dict(self) -> dict[str, Any]:
        r = lambda x: None if x is None else float(f"{x:.6g}")  # noqa: E731
        return {"class": self.name, "label": LABELS[self.name], "quantity": QUANTITIES[self.name], "value": r(self.value),
                "base_value": r(self.base), "samples": self.samples, "shapes": self.shapes,
                "residual": None if self.residual is None else self.residual.to_dict(),
                "holdout": None if self.holdout is None else self.holdout.to_dict(),
                "base_holdout": None if self.base_holdout is None else self.base_holdout.to_dict(),
                "holdout_total_rel_error": r(self.holdout_total), "base_holdout_total_rel_error": r(self.base_holdout_total),
                "used": self.used, "why": self.why, "examples": self.examples}


def _rel(pred: np.ndarray, meas: np.ndarray, shapes: int) -> Residual:
    rel = np.abs(pred - meas) / meas
    return Residual(int(meas.size), shapes, float(np.median(rel)), float(rel.max()))


def _per_sample(fn: Callable[[Sequence[Hashable]], np.ndarray], keys: Sequence[Hashable]) -> np.ndarray:
    """``fn`` on the distinct keys, spread back to every sample's key."""
    distinct = sorted(set(keys), key=repr)
    values = dict(zip(distinct, fn(distinct)))
    return np.array([values[k] for k in keys])


def fit_class(spec: ClassSpec, holdout: float) -> ClassFit:
    """Fit ``spec`` on its fit-side shapes and judge it on the held-out ones (module docstring)."""
    shapes = len({spec.key(s) for s in spec.samples})
    need = MIN_SHAPES[spec.name] + (1 if holdout else 0)
    empty = ClassFit(spec.name, None, spec.base, len(spec.samples), shapes, None, None, None, False, "")
    if shapes < need:
        empty.why = f"{shapes} shape(s), {need} needed: the base stays ({_RECORD[spec.name]})"
        return empty
    fit_s, held_s = split_by_shape(spec.samples, spec.key, holdout)
    keys, meas = medians(fit_s, spec.key, lambda s: s.time_s)
    repeats = np.array([sum(1 for s in fit_s if spec.key(s) == k) for k in keys], dtype=float)
    value = spec.fit(keys, meas, repeats)
    lo, hi = spec.bounds
    if not (math.isfinite(value) and lo * 1.01 < value < hi * 0.99):
        empty.why = f"the fit ran to its bound ({value:.3g}): the law does not describe these kernels; the base stays"
        return empty
    fk = [spec.key(s) for s in fit_s]
    residual = _rel(_per_sample(lambda k: spec.predict(k, value), fk), np.array([s.time_s for s in fit_s]), len(keys))
    out = ClassFit(spec.name, value, spec.base, len(spec.samples), shapes, residual, None, None, True,
                   "no held-out check (--holdout 0): used", [spec.describe(k) for k in keys[:4]])
    if held_s:
        _judge(out, spec, value, held_s)
    return out


def _judge(out: ClassFit, spec: ClassSpec, value: float, held_s: Sequence[Any]) -> None:
    """The verdict on the held-out samples: used when the fitted value beats the base both on the
    shapes' median error and on their summed time (what a step adds up)."""
    hk = [spec.key(s) for s in held_s]
    hm = np.array([s.time_s for s in held_s])
    pred, base = _per_sample(lambda k: spec.predict(k, value), hk), _per_sample(spec.base_predict, hk)
    out.holdout = _rel(pred, hm, len(set(hk)))
    out.base_holdout = _rel(base, hm, len(set(hk)))
    out.holdout_total = abs(float(pred.sum() / hm.sum()) - 1.0)
    out.base_holdout_total = abs(float(base.sum() / hm.sum()) - 1.0)
    median_ok = out.holdout.median_rel_error < out.base_holdout.median_rel_error
    total_ok = out.holdout_total < out.base_holdout_total
    out.used = median_ok and total_ok
    text = (f"held out: median {out.holdout.median_rel_error:.1%} against the base's {out.base_holdout.median_rel_error:.1%}, "
            f"total {out.holdout_total:.1%} against {out.base_holdout_total:.1%}")
    if out.used:
        out.why = f"{text}: better on both"
    else:
        worse = " and ".join(w for w, ok in (("median", median_ok), ("total", total_ok)) if not ok)
        out.why = f"{text}: not better on the {worse}; the base stays"


# ------------------------------------------------------------------------------- the specs


def _log_search(loss: Callable[[float], float], bounds: tuple[float, float]) -> float:
    """The value minimising ``loss(log value)``: a coarse grid, then golden section around its best."""
    grid = np.linspace(math.log(bounds[0]), math.log(bounds[1]), 49)
    best = int(np.argmin([loss(x) for x in grid]))
    return math.exp(golden_min(loss, grid[max(best - 1, 0)], grid[min(best + 1, grid.size - 1)]))


def _gemm_aligned(s: GemmSample) -> bool:
    """The profiled operator's alignment (every one of M, N, K: a transposed operand makes M a row
    length too; :func:`dml2comm.calibrate.fit.gemm_predict`)."""
    in_b = GEMM_BYTES[s.dtype][0]
    return in_b != 2 or all(x % (ALIGNMENT_BYTES // in_b) == 0 for x in (s.m, s.n, s.k))


def gemm_class_of(s: GemmSample, conv: bool = False) -> str:
    return gemm_regime(2.0 * s.b * s.m * s.n * s.k, _gemm_aligned(s), conv)


def _gemm_spec(name: str, gpu: GPU, samples: list[GemmSample]) -> ClassSpec:
    conv = name == "conv"

    def predict(keys: Sequence[Hashable], f: float) -> np.ndarray:
        return gemm_predict(gpu, keys, f, aligned=True if conv else None)  # type: ignore[arg-type]

    def base_predict(keys: Sequence[Hashable]) -> np.ndarray:
        out = []
        for b, m, n, k, dtype in keys:  # type: ignore[misc]
            aligned = True if conv else _gemm_aligned(GemmSample(b, m, n, k, dtype, 0.0, ""))
            out.append(gemm_time_s(gpu, dtype, b, m, n, k, aligned=aligned, conv=conv))
        return np.array(out)

    def fit(keys: Sequence[Hashable], meas: np.ndarray, repeats: np.ndarray) -> float:
        total = float(np.sum(repeats * meas))
        return _log_search(lambda lf: (math.log(float(np.sum(repeats * predict(keys, math.exp(lf))))) - math.log(total)) ** 2,
                           SUSTAINED_BOUNDS)

    return ClassSpec(name, samples, lambda s: (s.b, s.m, s.n, s.k, s.dtype), predict, base_predict, fit, sustained_factor(gpu),
                     SUSTAINED_BOUNDS, lambda k: f"{k[0]}x[{k[1]}x{k[3]}]@[{k[3]}x{k[2]}] {k[4]}")  # type: ignore[index]


def _memory_spec(name: str, gpu: GPU, samples: list[MemorySample]) -> ClassSpec:
    hbm = gpu.hbm_bytes_per_s
    base = hbm_efficiency_of(gpu, name)

    def fit(keys: Sequence[Hashable], meas: np.ndarray, repeats: np.ndarray) -> float:
        moved = np.array([k[2] for k in keys])  # type: ignore[index]
        return float(np.sum(repeats * moved) / (hbm * np.sum(repeats * meas)))

    return ClassSpec(name, samples, lambda s: (s.op, s.shape, s.bytes),
                     lambda keys, e: np.array([k[2] for k in keys]) / (hbm * e),  # type: ignore[index]
                     lambda keys: np.array([k[2] for k in keys]) / (hbm * base),  # type: ignore[index]
                     fit, base, EFFICIENCY_BOUNDS, lambda k: f"{k[0]} {list(k[1])} {k[2] / 2**20:.0f} MiB")  # type: ignore[index]


def _scale_spec(name: str, samples: list[Any], key: Callable[[Any], Hashable], law: Callable[[Hashable], float],
                describe: Callable[[Hashable], str]) -> ClassSpec:
    def base_predict(keys: Sequence[Hashable]) -> np.ndarray:
        return np.array([law(k) for k in keys])

    def fit(keys: Sequence[Hashable], meas: np.ndarray, repeats: np.ndarray) -> float:
        return float(np.sum(repeats * meas) / np.sum(repeats * base_predict(keys)))

    return ClassSpec(name, samples, key, lambda keys, c: c * base_predict(keys), base_predict, fit, 1.0, SCALE_BOUNDS, describe)


def _attention_law(gpu: GPU, pass_: str) -> Callable[[Hashable], float]:
    peak, hbm = gpu.peak_flops("bf16"), gpu.hbm_bytes_per_s * hbm_efficiency_of(gpu)

    def law(key: Hashable) -> float:
        shape = FlashShape(*key)  # type: ignore[misc]
        fwd, bwd = flash_times_s(shape, True, flash_cost(shape, True, DType.BFLOAT16), peak, hbm)
        return fwd if pass_ == "fwd" else bwd
    return law


def _optimizer_law(gpu: GPU) -> Callable[[Hashable], float]:
    def law(key: Hashable) -> float:
        params, element = key  # type: ignore[misc]
        return optimizer_step_s(params, "adamw", element, gpu.hbm_bytes_per_s, precision="bf16" if element == 2 else "amp")
    return law


def class_specs(gpu: GPU, samples: TraceSamples) -> list[ClassSpec]:
    """Every class's spec on ``gpu`` (the base's GPU) from the pooled samples of the traces, in
    the order of :data:`dml2comm.cost.calibrated.CLASSES`."""
    gemms = [g for g in samples.gemms if g.dtype in GEMM_FIT_DTYPES and g.dtype in gpu.peak_flops_per_s]
    convs = [g for g in samples.convs if g.dtype in GEMM_FIT_DTYPES and g.dtype in gpu.peak_flops_per_s]
    big = [m for m in samples.memory if m.bytes >= MIN_MEMORY_BYTES]
    specs = [_gemm_spec(c, gpu, [g for g in gemms if gemm_class_of(g) == c]) for c in ("gemm_large", "gemm_small", "gemm_unaligned")]
    specs.append(_gemm_spec("conv", gpu, convs))
    for pass_ in ("fwd", "bwd"):
        att = [a for a in samples.attention if a.pass_ == pass_] if "bf16" in gpu.peak_flops_per_s else []
        specs.append(_scale_spec(f"attention_{pass_}", att, lambda a: (a.bh, a.s_q, a.s_k, a.d, a.d_v), _attention_law(gpu, pass_),
                                 lambda k: "bh={} s={}x{} d={}".format(*k[:4])))  # type: ignore[index]
    specs += [_memory_spec(c, gpu, [m for m in big if m.cls == c]) for c in ("pointwise", "norm")]
    specs.append(_scale_spec("optimizer", list(samples.optimizer), lambda o: (o.params, o.element_bytes), _optimizer_law(gpu),
                             lambda k: f"{k[0] / 1e6:.1f} M params x {k[1]} B"))  # type: ignore[index]
    return specs
