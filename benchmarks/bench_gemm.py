"""Accuracy and speed of the GEMM model (dml2comm/cost/gemm.py).

    PYTHONPATH=. .venv/bin/python benchmarks/bench_gemm.py

Prints, per measured GPU and data type: the error of the analytical part alone against the
table (all shapes and those of at least 1 GFLOP; for H100 bf16 that is the H100 law fitted on
PyTorch/cuBLAS, which no longer reproduces OpenXLA's table: benchmarks/fit_h100_gemm.py has the
H100's own residuals); the error of the interpolation when the K=1024
layer of the grid is left out (interpolated from K=512 and K=2048).  Then a few
A100 efficiencies and the cost of a call (first call of a shape, then cached).
"""

from __future__ import annotations

import math
import time

import numpy as np

from dml2comm.cost import gemm
from dml2comm.hardware.gpus import get_gpu

CASES = (("h100", "bf16"), ("h100", "tf32"), ("b200", "bf16"), ("b200", "tf32"), ("b200", "fp8"))


def device(name: str):
    return gemm.B200 if name == "b200" else get_gpu(name)


def summary(err: np.ndarray, big: np.ndarray) -> str:
    err = np.abs(err)
    return (f"median {np.median(err):6.1%} mean {np.mean(err):6.1%} max {np.max(err):6.1%} | >=1 GFLOP "
            f"median {np.median(err[big]):6.1%} mean {np.mean(err[big]):6.1%}")


def main() -> None:
    print("errors against the measured tables (the table's monotone lower envelope; 375 shapes each)")
    for name, dtype in CASES:
        dev = gemm.gemm_device(device(name))
        table = gemm.measured_table(dev.name, dtype)
        keys = sorted(table.nodes)
        meas = np.array([table.nodes[x] for x in keys])
        big = np.array([2 * math.prod(x) >= 1e9 for x in keys])
        ana = np.array([gemm.analytical_time_s(dev, dtype, *x) for x in keys])
        print(f"{dev.name} {dtype}  ({len(table.adjusted)} points lowered by the envelope)")
        print(f"  analytical alone      {summary(ana / meas - 1, big)}")
        # interpolation: drop the K=1024 layer, interpolate it from K=512 and K=2048
        sub = gemm.MeasuredTable({x: t for x, t in table.nodes.items() if x[3] != 1024})
        mid = [i for i, x in enumerate(keys) if x[3] == 1024]
        interp = np.array([sub.time_s(keys[i]) for i in mid])
        print(f"  interpolation, K=1024 left out: {summary(interp / meas[mid] - 1, big[mid])}")

    print("A100 bf16 (no table: the shape law, sustained factor "
          f"{gemm.SUSTAINED_FACTOR['A100-SXM4-80GB']}):")
    a100 = get_gpu("a100")
    for shape in ((1, 8192, 8192, 8192), (1, 4096, 4096, 4096), (1, 1024, 1024, 256), (1, 8192, 3 * 12288 // 8, 12288),
                  (1, 8192, 12288, 4 * 12288 // 8), (1, 12288, 4 * 12288 // 8, 8192), (96, 2048, 2048, 128)):
        g = gemm.gemm_efficiency(a100, "bf16", *shape)
        print(f"  b={shape[0]:3d} M={shape[1]:6d} N={shape[2]:6d} K={shape[3]:6d}: {g:5.1%} of 312 TFLOP/s")

    rng = np.random.default_rng(0)
    shapes = [tuple(int(v) for v in row) for row in
              np.column_stack([rng.integers(1, 9, 2000), rng.integers(64, 16384, (2000, 3))])]
    h100 = get_gpu("h100")
    for label, dev in (("H100 (table + model)", h100), ("A100 (model)", a100)):
        t0 = time.perf_counter()
        for s in shapes:
            gemm.gemm_time_s(dev, "bf16", *s)
        cold = (time.perf_counter() - t0) / len(shapes)
        t0 = time.perf_counter()
        for _ in range(5):
            for s in shapes:
                gemm.gemm_time_s(dev, "bf16", *s)
        warm = (time.perf_counter() - t0) / (5 * len(shapes))
        print(f"call cost, {label}: {cold * 1e6:.1f} us for a new shape, {warm * 1e6:.2f} us cached")
    t0 = time.perf_counter()
    arr = np.array(shapes, dtype=float)
    gemm.analytical_times_s(*arr.T, peak_flops_per_s=312e12, sm_count=108, hbm_bytes_per_s=2039e9,
                            in_bytes=2, out_bytes=2, sustained=gemm.DEFAULT_SUSTAINED_FACTOR)
    print(f"vectorised analytical model: {(time.perf_counter() - t0) / len(shapes) * 1e6:.2f} us per shape "
          f"({len(shapes)} shapes in one call)")


if __name__ == "__main__":
    main()
