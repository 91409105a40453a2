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
- **GEMM regimes by shape** (:func:`gemm_regimes`): each GEMM class is split further by the
  octave of the GEMM's smallest dimension ``min(M, N, K)``, each regime with its own factor,
  verdict and **validity range** (the smallest and largest ``min(M, N, K)`` of its samples, the
  key ``gemm_large@768..2048``): the cost model applies a regime's factor only to GEMMs inside
  that range, and a GEMM outside every range keeps the base law
  (:func:`dml2comm.cost.calibrated.class_value`).  An octave with too few shapes for a fit and
  its check is merged into its nearer neighbour.  Why this feature: of the shape features, the
  octave of ``min(M, N, K)`` explains the largest share of the law's residual for the fewest
  groups.  On the 402 aligned GEMMs of ``benchmarks/data/h100/kernels.json`` (the H100 law's own
  fit data, so the residuals are small) the between-octave share of the variance of
  ``log(measured / law)`` (adjusted R^2) is 0.14 for ``min(M, N, K)`` in 5 octaves, against 0.09
  for K, 0.07 for N, 0.06 for M (0.17 for the FLOPs, in 11 octaves; the FLOPs already split
  ``gemm_small`` off).  On the 20 aligned shapes of the two bundled step traces it is 0.21 in 2
  octaves (measured / law 0.944 at 512-1,023, GPT-2 small's 768 and Llama-1B's 512; 0.872 at
  2,048, Llama's), against 0.03 for K and 0.06 for N.  It is also what tells models apart: a
  transformer's linear layers have the hidden or feed-forward width (or the token count) as
  their smallest dimension, so a factor fitted on a 768-wide model says nothing about a
  2,048-wide one, and the range keeps it off.
- **Memory-bound classes** (``pointwise``, ``norm``): the HBM efficiency
  ``e = sum bytes / (HBM x sum t)`` over the samples of at least
  :data:`~dml2comm.calibrate.fit.MIN_MEMORY_BYTES` (smaller ones are launch-bound).  Softmaxes
  and reductions run as block-reduction kernels that reach a fraction of the bandwidth
  element-wise kernels do on the bundled H100 traces (the reductions of at least 32 MiB 0.43 of
  3.35 TB/s on GPT-2's, 0.57 on Llama-1B's; eager LayerNorm 0.39, its backward 0.22; against
  0.85-0.95 for large contiguous element-wise kernels), so one efficiency for both fits neither
  (the single efficiency's 33% median residual on the Llama-1B trace).  The loss's log-softmax passes are ``pointwise`` samples with the cost model's
  byte count (:mod:`dml2comm.cost.loss`, which times them at the element-wise efficiency).
  Eager LayerNorm/RMSNorm kernels are not ``norm`` samples: they have their own law and class
  (``layer_norm`` below), and ``norm`` is fitted on the softmaxes and reductions.
- **Time scales** (``attention_fwd``, ``attention_bwd``, ``optimizer``): ``c = sum t / sum law``;
  the law is the base model's: :func:`dml2comm.cost.attention.flash_times_s` (costed causal: the
  profiler's shapes do not record ``is_causal``), :func:`dml2comm.cost.compute.optimizer_step_s`
  (AdamW, the parameters' element size: bf16 -> ``bf16``, fp32 -> ``amp``).
- **Eager LayerNorm/RMSNorm** (``layer_norm``): a time scale on :mod:`dml2comm.cost.norm`'s law
  (:func:`~dml2comm.cost.norm.op_norm_times_s`), fitted on the forward samples
  (``vectorized_layer_norm_kernel``) and the backward ones (``layer_norm_grad_input_kernel*`` +
  ``GammaBetaBackward*``, one sample per backward operator) together, a shape being the pass, the
  rows, the width, the element size and RMS or not.  One scale, not one per pass: the bundled GPT-2
  trace has one LayerNorm shape (8,192 rows x 768, bf16) per pass, so a scale per pass could never
  be checked on a held-out shape there (as with ``attention_fwd``), while one scale is fitted on one
  pass and judged on the other; a GPU or PyTorch build that runs the law's kernels faster or slower
  moves both.  The law was fitted on this trace's three kernels (:mod:`dml2comm.cost.norm`), so on
  it the scale is near 1 and the base's held-out error is the smaller: the base stays.

Verdict: the distinct shapes of a class are split by a hash of the shape
(:func:`~dml2comm.calibrate.fit.split_by_shape`, ``holdout`` of them held out); the value is
fitted on the rest and **used only when, on the held-out shapes, it beats the base model on
both their median relative error and the relative error of their summed time** (the base is
the uncalibrated cost model: the preset's GEMM model, tables included,
:data:`~dml2comm.cost.compute.HBM_EFFICIENCY`, the flash and optimizer laws as they are).
Otherwise the base stays, with the reason.  A class with too few shapes for a fit and a held-out
shape keeps the base with a warning naming what to record.  With ``holdout`` = 0 there is no
check and every fitted value is used.

**Step guard** (:func:`step_guard`, with held-out shapes only): a value can fix its own kernels
and still make a step's prediction worse, when the base's error on its class was offsetting
other classes' errors.  The guard adds up the kernel time of every class together (every sample,
and the launch-bound memory kernels below :data:`~dml2comm.calibrate.fit.MIN_MEMORY_BYTES`, which
the class's efficiency also times): the measured sum; the base's prediction of it; and each
value's change to it, estimated on its held-out shapes (the class's measured time x the held-out
ratio predicted / measured at the value, less the same at the base; a class's held-out shapes
stand for all its kernels).  Of the values that passed their own check it keeps the set that
brings the sum nearest the measured one (every subset tried, up to 12 values, else a greedy
search; the larger set on a tie); the others go back to the base, with the reason and their change in the report.  No
step time enters it: only the traces' kernels.  On the bundled H100 traces this is what keeps
calibration from making either model's step worse: Llama-1B's GEMMs run 6-16% faster in its
step than the same shapes measured back to back (``kernels.json``: e.g. 8192 x 8192 x 2048, 363
us in the step, 375-431 us measured alone, 417 us by the law), so a fitted GEMM factor is right
for them (0.842 on the 2,048-wide ones, held-out total 2.8% against the base's 17.7%); but the
base's excess on them was offsetting the element-wise kernels (10% too fast on Llama's trace)
and the softmaxes and reductions of ``norm`` (held-out total 21% off at the base on both traces),
and the guard sees the sum of both traces move from +0.7% to -4.6% and keeps the base.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Sequence

import numpy as np

from dml2comm.calibrate.fit import (GEMM_BYTES, GEMM_FIT_DTYPES, MIN_MEMORY_BYTES, SUSTAINED_BOUNDS, Residual, golden_min,
                                    medians, gemm_predict, split_by_shape)
from dml2comm.calibrate.samples import GemmSample, MemorySample, NormSample, TraceSamples
from dml2comm.cost.attention import FlashShape, flash_cost, flash_times_s
from dml2comm.cost.calibrated import GEMM_CLASSES, gemm_regime
from dml2comm.cost.compute import hbm_efficiency_of, optimizer_step_s
from dml2comm.cost.gemm import ALIGNMENT_BYTES, gemm_time_s, sustained_factor
from dml2comm.cost.norm import op_norm_times_s
from dml2comm.hardware.gpus import GPU, regime_key
from dml2comm.ir.graph import DType

__all__ = ["ClassSpec", "ClassFit", "class_specs", "fit_class", "MIN_SHAPES", "SCALE_BOUNDS", "LABELS", "QUANTITIES"]

#: Fewest distinct shapes a class is fitted on (a held-out split needs one more).  A sustained
#: factor or an efficiency over three shapes, as the single fits asked; a time scale of a law
#: that already has the shape in it from one.
MIN_SHAPES = {"gemm_large": 3, "gemm_small": 3, "gemm_unaligned": 3, "conv": 3, "pointwise": 3, "norm": 3,
              "attention_fwd": 1, "attention_bwd": 1, "layer_norm": 1, "optimizer": 1}
#: Search interval of a time scale; a fit outside is refused (the law does not describe the kernels).
SCALE_BOUNDS = (0.2, 5.0)
#: Efficiencies outside this interval are refused (a class whose bytes the operator shapes miscount).
EFFICIENCY_BOUNDS = (0.05, 1.5)
LABELS = {"gemm_large": "GEMM, aligned, >= 1 GFLOP", "gemm_small": "GEMM, aligned, < 1 GFLOP",
          "gemm_unaligned": "GEMM, unaligned 16-bit rows", "conv": "convolution (implicit GEMM)",
          "attention_fwd": "flash attention forward", "attention_bwd": "flash attention backward",
          "pointwise": "element-wise", "norm": "softmax / reduction / other normalisations",
          "layer_norm": "LayerNorm / RMSNorm (eager PyTorch kernels)", "optimizer": "fused optimizer step"}
QUANTITIES = {**{c: "sustained factor" for c in GEMM_CLASSES}, "pointwise": "HBM efficiency", "norm": "HBM efficiency",
              "attention_fwd": "time scale", "attention_bwd": "time scale", "layer_norm": "time scale", "optimizer": "time scale"}
#: What to record when a class has too few shapes.
_RECORD = {"gemm_large": "profile steps with large matrix products of several shapes",
           "gemm_small": "profile steps with small matrix products of several shapes",
           "gemm_unaligned": "profile a model with odd dimensions (an unpadded vocabulary)",
           "conv": "profile a convolutional model",
           "attention_fwd": "profile steps at two or more sequence lengths or head counts (SDPA flash attention)",
           "attention_bwd": "profile steps at two or more sequence lengths or head counts (SDPA flash attention)",
           "pointwise": "profile a step with large activations",
           "norm": "profile a step with large activations",
           "layer_norm": "profile steps at two or more hidden widths or token counts (nn.LayerNorm or F.rms_norm with weights)",
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
    #: the range of the GEMMs' smallest dimension this spec's samples cover (a GEMM regime), else None
    regime: tuple[int, int] | None = None

    @property
    def key_name(self) -> str:
        """The :attr:`dml2comm.hardware.gpus.GPU.calibrated_classes` key its value is stored under."""
        return self.name if self.regime is None else regime_key(self.name, *self.regime)


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
    #: the GEMM regime's range of min(M, N, K) (None: the whole class)
    regime: tuple[int, int] | None = None
    #: for the step guard (:func:`step_guard`): the measured time of every sample of the class,
    #: and predicted / measured summed time of its held-out samples at the value and at the base
    #: (of every sample at the base where nothing was held out)
    measured_s: float = 0.0
    holdout_ratio: float | None = None
    base_holdout_ratio: float | None = None
    base_ratio: float | None = None  # the base's predicted / measured over every sample

    @property
    def key(self) -> str:
        """The :attr:`dml2comm.hardware.gpus.GPU.calibrated_classes` key of its value."""
        return self.name if self.regime is None else regime_key(self.name, *self.regime)

    @property
    def label(self) -> str:
        if self.regime is None:
            return LABELS[self.name]
        lo, hi = self.regime
        return f"{LABELS[self.name]}, smallest dimension {lo}" + ("" if lo == hi else f"-{hi}")

    def to_dict(self) -> dict[str, Any]:
        r = lambda x: None if x is None else float(f"{x:.6g}")  # noqa: E731
        regime = None if self.regime is None else {"feature": "min(M, N, K)", "lo": self.regime[0], "hi": self.regime[1]}
        return {"class": self.key, "kernel_class": self.name, "regime": regime, "label": self.label,
                "quantity": QUANTITIES[self.name], "value": r(self.value),
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
    every = np.array([s.time_s for s in spec.samples])
    empty = ClassFit(spec.name, None, spec.base, len(spec.samples), shapes, None, None, None, False, "", regime=spec.regime,
                     measured_s=float(every.sum()))
    if spec.samples:
        empty.base_ratio = float(_per_sample(spec.base_predict, [spec.key(s) for s in spec.samples]).sum() / every.sum())
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
                   "no held-out check (--holdout 0): used", [spec.describe(k) for k in keys[:4]], regime=spec.regime,
                   measured_s=empty.measured_s, base_ratio=empty.base_ratio)
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
    out.holdout_ratio, out.base_holdout_ratio = float(pred.sum() / hm.sum()), float(base.sum() / hm.sum())
    out.holdout_total, out.base_holdout_total = abs(out.holdout_ratio - 1.0), abs(out.base_holdout_ratio - 1.0)
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


def smallest_dim(s: GemmSample) -> int:
    """The regime feature of a GEMM: ``min(M, N, K)`` (module docstring)."""
    return min(s.m, s.n, s.k)


def gemm_regimes(samples: Sequence[GemmSample], need: int) -> list[list[GemmSample]]:
    """The samples by octave of their smallest dimension (``floor(log2 min(M, N, K))``), in
    order; an octave with fewer than ``need`` distinct shapes is merged into its neighbour nearer
    in ``log2 min(M, N, K)`` (the nearer range's edge) until every regime has ``need`` or only one
    is left."""
    octaves: dict[int, list[GemmSample]] = {}
    for g in samples:
        octaves.setdefault(int(math.log2(smallest_dim(g))), []).append(g)
    groups = [octaves[o] for o in sorted(octaves)]

    def shapes(ss: list[GemmSample]) -> int:
        return len({(g.b, g.m, g.n, g.k, g.dtype) for g in ss})

    def gap(a: list[GemmSample], b: list[GemmSample]) -> float:  # a's range lies below b's
        return math.log2(min(map(smallest_dim, b))) - math.log2(max(map(smallest_dim, a)))

    while len(groups) > 1 and (i := next((j for j, ss in enumerate(groups) if shapes(ss) < need), -1)) >= 0:
        below = gap(groups[i - 1], groups[i]) if i > 0 else math.inf
        above = gap(groups[i], groups[i + 1]) if i + 1 < len(groups) else math.inf
        j = i - 1 if below <= above else i + 1
        lo, hi = min(i, j), max(i, j)
        groups[lo:hi + 1] = [groups[lo] + groups[hi]]
    return groups


def _gemm_regime_specs(name: str, gpu: GPU, samples: list[GemmSample], need: int) -> list[ClassSpec]:
    """One spec per regime (:func:`gemm_regimes`), its range the smallest and largest ``min(M, N,
    K)`` among its samples; one spec without a range for no samples."""
    if not samples:
        return [_gemm_spec(name, gpu, [])]
    return [_gemm_spec(name, gpu, ss, (min(map(smallest_dim, ss)), max(map(smallest_dim, ss)))) for ss in gemm_regimes(samples, need)]


def _gemm_spec(name: str, gpu: GPU, samples: list[GemmSample], regime: tuple[int, int] | None = None) -> ClassSpec:
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
                     SUSTAINED_BOUNDS, lambda k: f"{k[0]}x[{k[1]}x{k[3]}]@[{k[3]}x{k[2]}] {k[4]}", regime)  # type: ignore[index]


def _memory_spec(name: str, gpu: GPU, samples: list[MemorySample]) -> ClassSpec:
    hbm = gpu.kernel_hbm_bytes_per_s
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
    peak, hbm = gpu.peak_flops("bf16"), gpu.kernel_hbm_bytes_per_s * hbm_efficiency_of(gpu)

    def law(key: Hashable) -> float:
        shape = FlashShape(*key)  # type: ignore[misc]
        fwd, bwd = flash_times_s(shape, True, flash_cost(shape, True, DType.BFLOAT16), peak, hbm)
        return fwd if pass_ == "fwd" else bwd
    return law


def _layer_norm_law(gpu: GPU) -> Callable[[Hashable], float]:
    """The cost model's eager LayerNorm/RMSNorm law (:func:`dml2comm.cost.norm.op_norm_times_s`,
    as :func:`dml2comm.cost.ops.op_costs` calls it: the GPU's full HBM bandwidth) for the pass of
    a :class:`~dml2comm.calibrate.samples.NormSample` key."""
    def law(key: Hashable) -> float:
        pass_, rows, width, itemsize, rms = key  # type: ignore[misc]
        got = op_norm_times_s("RMSNormalization" if rms else "LayerNormalization", -1, (rows, width), itemsize, gpu,
                              gpu.kernel_hbm_bytes_per_s)
        assert got is not None  # the specs hold samples only on a GPU with an SM count
        fwd, bwd = got[0]
        return fwd if pass_ == "fwd" else bwd
    return law


def _layer_norm_key(s: NormSample) -> Hashable:
    return (s.pass_, s.rows, s.width, s.itemsize, s.rms)


def _describe_layer_norm(k: Hashable) -> str:
    pass_, rows, width, itemsize, rms = k  # type: ignore[misc]
    return f"{'RMSNorm' if rms else 'LayerNorm'} {'forward' if pass_ == 'fwd' else 'backward'} {rows} x {width} x {itemsize} B"


def _optimizer_law(gpu: GPU) -> Callable[[Hashable], float]:
    def law(key: Hashable) -> float:
        params, element = key  # type: ignore[misc]
        return optimizer_step_s(params, "adamw", element, gpu.kernel_hbm_bytes_per_s, precision="bf16" if element == 2 else "amp")
    return law


def class_specs(gpu: GPU, samples: TraceSamples, holdout: float = 0.0) -> list[ClassSpec]:
    """Every class's spec on ``gpu`` (the base's GPU) from the pooled samples of the traces, in
    the order of :data:`dml2comm.cost.calibrated.CLASSES`, a GEMM class's one per regime (with
    the shapes a fit and its held-out check need at ``holdout``, :func:`gemm_regimes`)."""
    extra = 1 if holdout else 0
    gemms = [g for g in samples.gemms if g.dtype in GEMM_FIT_DTYPES and g.dtype in gpu.peak_flops_per_s]
    convs = [g for g in samples.convs if g.dtype in GEMM_FIT_DTYPES and g.dtype in gpu.peak_flops_per_s]
    big = [m for m in samples.memory if m.bytes >= MIN_MEMORY_BYTES]
    specs = [sp for c in ("gemm_large", "gemm_small", "gemm_unaligned")
             for sp in _gemm_regime_specs(c, gpu, [g for g in gemms if gemm_class_of(g) == c], MIN_SHAPES[c] + extra)]
    specs += _gemm_regime_specs("conv", gpu, convs, MIN_SHAPES["conv"] + extra)
    for pass_ in ("fwd", "bwd"):
        att = [a for a in samples.attention if a.pass_ == pass_] if "bf16" in gpu.peak_flops_per_s else []
        specs.append(_scale_spec(f"attention_{pass_}", att, lambda a: (a.bh, a.s_q, a.s_k, a.d, a.d_v), _attention_law(gpu, pass_),
                                 lambda k: "bh={} s={}x{} d={}".format(*k[:4])))  # type: ignore[index]
    specs += [_memory_spec(c, gpu, [m for m in big if m.cls == c]) for c in ("pointwise", "norm")]
    specs.append(_scale_spec("layer_norm", list(samples.layer_norm) if gpu.sm_count else [], _layer_norm_key,
                             _layer_norm_law(gpu), _describe_layer_norm))
    specs.append(_scale_spec("optimizer", list(samples.optimizer), lambda o: (o.params, o.element_bytes), _optimizer_law(gpu),
                             lambda k: f"{k[0] / 1e6:.1f} M params x {k[1]} B"))  # type: ignore[index]
    return specs


# ------------------------------------------------------------------------------ step guard


@dataclass(frozen=True)
class LaunchBound:
    """The memory-bound kernels of a class below :data:`~dml2comm.calibrate.fit.MIN_MEMORY_BYTES`
    (never fitted: launch-bound), which the class's efficiency still times: their measured time
    and ``bytes / HBM`` (their time at efficiency 1)."""

    name: str
    measured_s: float
    ideal_s: float


def launch_bound(gpu: GPU, samples: TraceSamples) -> list[LaunchBound]:
    """The :class:`LaunchBound` kernels of ``pointwise`` and ``norm``."""
    small = [m for m in samples.memory if m.bytes < MIN_MEMORY_BYTES]
    return [LaunchBound(c, sum(m.time_s for m in small if m.cls == c), sum(m.bytes for m in small if m.cls == c) / gpu.kernel_hbm_bytes_per_s)
            for c in ("pointwise", "norm") if any(m.cls == c for m in small)]


@dataclass
class StepGuard:
    """The step-level check (module docstring): the summed kernel time of every class together,
    measured, at the base, and with the set of values used."""

    measured_s: float
    base_s: float
    used_s: float
    #: key -> the change its value makes to the summed time (s), for every value that passed its own check
    effects: dict[str, float]
    #: the keys the guard left at the base although their own check passed
    dropped: list[str]

    def to_dict(self) -> dict[str, Any]:
        r = lambda x: float(f"{x:.6g}")  # noqa: E731
        return {"measured_s": r(self.measured_s), "base_s": r(self.base_s), "used_s": r(self.used_s),
                "effects_s": {k: r(v) for k, v in self.effects.items()}, "dropped": list(self.dropped)}


def _effect(fit: ClassFit, base_eff: float, small: Sequence[LaunchBound]) -> float:
    """The change fit's value makes to the summed time: its held-out change scaled to the class's
    measured time, and its launch-bound kernels retimed at the fitted efficiency."""
    assert fit.value is not None and fit.holdout_ratio is not None and fit.base_holdout_ratio is not None
    change = fit.measured_s * (fit.holdout_ratio - fit.base_holdout_ratio)
    if QUANTITIES[fit.name] == "HBM efficiency":
        change += sum(lb.ideal_s / fit.value - lb.ideal_s / base_eff for lb in small if lb.name == fit.name)
    return change


def step_guard(gpu: GPU, fits: list[ClassFit], small: Sequence[LaunchBound]) -> StepGuard:
    """Keep the set of values (of those that passed their own held-out check) that brings the
    summed kernel time of every class nearest the measured one; the others go back to the base
    with the reason."""
    candidates = [f for f in fits if f.used and f.holdout_ratio is not None]
    measured = sum(f.measured_s for f in fits) + sum(lb.measured_s for lb in small)
    base = (sum(f.measured_s * f.base_ratio for f in fits if f.base_ratio is not None)
            + sum(lb.ideal_s / hbm_efficiency_of(gpu, lb.name) for lb in small))
    effects = {f.key: _effect(f, hbm_efficiency_of(gpu, f.name), small) for f in candidates}
    best = min(_subsets(effects, measured - base), key=lambda ks: (abs(base + sum(effects[k] for k in ks) - measured), -len(ks)))
    used = base + sum(effects[k] for k in best)
    dropped = [k for k in effects if k not in best]
    for f in candidates:
        if f.key in dropped:
            f.used = False
            f.why += (f"; but the step guard keeps the base: it moves the summed kernel time of every class "
                      f"{_ms(effects[f.key])}, away from the measured {measured * 1e3:.2f} ms ({used / measured - 1:+.1%} "
                      f"without it, {(used + effects[f.key]) / measured - 1:+.1%} with it)")
    return StepGuard(measured, base, used, effects, dropped)


def _ms(x: float) -> str:
    return f"{x * 1e3:+.2f} ms"


def _subsets(effects: dict[str, float], gap: float) -> list[tuple[str, ...]]:
    """The sets of keys to try for a sum of ``effects`` nearest ``gap``: every subset of up to 12
    keys; beyond, the sets a greedy search passes through (add the key that brings the sum
    nearest, while one does)."""
    keys = list(effects)
    if len(keys) <= 12:
        return [tuple(k for i, k in enumerate(keys) if mask >> i & 1) for mask in range(1 << len(keys))]
    path: list[tuple[str, ...]] = [()]
    total = 0.0
    while rest := [k for k in keys if k not in path[-1]]:
        k = min(rest, key=lambda x: abs(total + effects[x] - gap))
        if abs(total + effects[k] - gap) >= abs(total - gap):
            break
        total += effects[k]
        path.append(path[-1] + (k,))
    return path
