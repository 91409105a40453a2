"""Refit the GEMM model's shape law and sustained factors, and print them with their residuals.

    PYTHONPATH=. .venv/bin/python benchmarks/fit_gemm.py

Fit: least squares of log(analytical / measured) over the H100 and B200 bf16 tables (their
monotone lower envelope, 750 shapes), :func:`dml2comm.cost.gemm.fit_shape_law`.  The printed
numbers are the ones written into ``SHAPE_LAW`` and ``SUSTAINED_FACTOR`` (B200; the H100's only
into ``DEFAULT_SUSTAINED_FACTOR``) in ``dml2comm/cost/gemm.py``.  Then the held-out check: fit on B200 and the H100 shapes whose
``log2(b M N K)`` is even, report the error on the odd ones (shapes of at least 1 GFLOP).
"""

from __future__ import annotations

import math
import time

import numpy as np

from dml2comm.cost import gemm
from dml2comm.hardware.gpus import get_gpu


def errors(fit: gemm.FitResult, device, dtype: str, shapes: np.ndarray, times: np.ndarray) -> np.ndarray:
    key, in_bytes, out_bytes = {"bf16": ("bf16", 2, 2), "tf32": ("tf32", 4, 4), "fp8": ("fp8", 1, 2)}[dtype]
    dev = gemm.gemm_device(device)
    f = fit.sustained.get(dev.name, gemm.DEFAULT_SUSTAINED_FACTOR)
    pred = gemm.analytical_times_s(*shapes.T, peak_flops_per_s=dev.peak(key), sm_count=dev.sm_count,
                                   hbm_bytes_per_s=dev.hbm_bytes_per_s, in_bytes=in_bytes, out_bytes=out_bytes,
                                   sustained=f, law=fit.law)
    return pred / times - 1.0


def report(fit: gemm.FitResult, device, dtype: str, shapes: np.ndarray, times: np.ndarray, label: str) -> None:
    err = np.abs(errors(fit, device, dtype, shapes, times))
    big = 2 * np.prod(shapes, axis=1) >= 1e9
    print(f"  {label:<24} n={len(err):4d}  median {np.median(err):6.1%}  mean {np.mean(err):6.1%}  "
          f"max {np.max(err):6.1%}   >=1 GFLOP: n={int(big.sum()):3d} median {np.median(err[big]):6.1%} "
          f"mean {np.mean(err[big]):6.1%}")


def main() -> None:
    h100 = get_gpu("h100")
    samples = [gemm.table_samples(h100, "bf16"), gemm.table_samples(gemm.B200, "bf16")]
    t0 = time.perf_counter()
    fit = gemm.fit_shape_law(samples)
    print(f"fit on H100 + B200 bf16 ({sum(len(s[3]) for s in samples)} shapes, {time.perf_counter() - t0:.1f} s), "
          f"sum of squared log errors {fit.loss:.4f}")
    law = fit.law
    print(f"  SHAPE_LAW = ShapeLaw(epilogue_bytes={law.epilogue_bytes:.4f}, tile_edge={law.tile_edge:.2f}, "
          f"latency_s={law.latency_s:.3e}, hbm_efficiency={law.hbm_efficiency:.3f}, tail_wave={law.tail_wave:.3f})")
    print("  sustained factors: " + ", ".join(f"{k} {v:.3f}" for k, v in sorted(fit.sustained.items())))
    print(f"  in the module:     B200 {gemm.SUSTAINED_FACTOR['B200']:.3f}; {gemm.SHAPE_LAW}; default factor "
          f"{gemm.DEFAULT_SUSTAINED_FACTOR} (the mean of the two fits)")
    print("  (the H100 fit here no longer ships: an H100 gets H100_SHAPE_LAW and its factor, fitted on PyTorch/cuBLAS "
          "by benchmarks/fit_h100_gemm.py)")
    print("residuals of the analytical part alone (fitted numbers):")
    for device, dtype in ((h100, "bf16"), (gemm.B200, "bf16"), (h100, "tf32"), (gemm.B200, "tf32"), (gemm.B200, "fp8")):
        _, _, shapes, times = gemm.table_samples(device, dtype)
        report(fit, device, dtype, shapes, times, f"{gemm.gemm_device(device).name} {dtype}"
               + ("" if dtype == "bf16" else " (not fitted)"))

    keys = sorted(gemm.measured_table(h100.name, "bf16").nodes)
    even = [x for x in keys if round(math.log2(math.prod(x))) % 2 == 0]
    odd = [x for x in keys if round(math.log2(math.prod(x))) % 2 == 1]
    held = gemm.fit_shape_law([gemm.table_samples(h100, "bf16", even), gemm.table_samples(gemm.B200, "bf16")])
    print(f"held out: fit on B200 + {len(even)} H100 shapes (even log2(bMNK)); "
          f"H100 factor {held.sustained[h100.name]:.3f}, {held.law}")
    _, _, shapes, times = gemm.table_samples(h100, "bf16", odd)
    report(held, h100, "bf16", shapes, times, "H100 bf16 held-out half")


if __name__ == "__main__":
    main()
