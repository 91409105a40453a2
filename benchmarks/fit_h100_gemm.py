"""Fit the H100's GEMM law on the bundled PyTorch/cuBLAS measurement, and print the evidence.

    PYTHONPATH=. .venv/bin/python benchmarks/fit_h100_gemm.py        (about a minute on one core)

Data: ``dml2comm/validate/data/h100_kernels_measured.json`` (140 ``nn.Linear`` shapes x the
forward, data-gradient and weight-gradient layouts, as ``training_gemms`` gives their GEMMs;
:mod:`dml2comm.validate.h100_gemm`).  Prints:

1. how OpenXLA's H100 bf16 table (what the tool used to answer from) compares with the
   measurement where the two meet (PyTorch time / XLA time at the table's grid), and the
   shipped H100 model with the whole table;
2. the fit of :data:`~dml2comm.cost.gemm.H100_SHAPE_LAW` and the H100 sustained factor on the
   402 aligned GEMMs (:func:`~dml2comm.cost.gemm.fit_device_law`, ``latency_s`` and
   ``tail_wave`` free, the other numbers of ``SHAPE_LAW`` kept), next to the factor alone
   refitted under the shared law and the numbers written into the module;
3. :data:`~dml2comm.cost.gemm.UNALIGNED_RATE` fitted on the 18 unaligned GEMMs
   (:func:`~dml2comm.cost.gemm.fit_unaligned_rate`);
4. residuals of the shipped model (``gemm_time_s``) and the held-out ones: every number refitted
   without one (M, N, K) row (its three layouts), that row predicted (leave-one-row-out; for the
   unaligned rate also leave-one-GEMM-out).
"""

from __future__ import annotations

import math
import time

import numpy as np

from dml2comm.cost import gemm
from dml2comm.hardware.gpus import get_gpu
from dml2comm.validate.h100_gemm import measured_gemms

H100 = get_gpu("h100")
FREE = ("latency_s", "tail_wave")


def predict(law: gemm.ShapeLaw, f: float, shapes: np.ndarray, aligned) -> np.ndarray:
    dev = gemm.gemm_device(H100)
    return gemm.analytical_times_s(*shapes.T, peak_flops_per_s=dev.peak("bf16"), sm_count=dev.sm_count,
                                   hbm_bytes_per_s=dev.hbm_bytes_per_s, in_bytes=2, out_bytes=2, sustained=f, law=law,
                                   aligned=aligned)


def line(label: str, err: np.ndarray) -> str:
    a = np.abs(err)
    return (f"  {label:<34} n={len(a):3d}  median |e| {np.median(a):5.1%}  mean {np.mean(a):5.1%}  "
            f"max {np.max(a):5.1%}  signed median {np.median(err):+5.1%}")


def main() -> None:
    rows = measured_gemms()
    shapes = np.array([r.shape for r in rows], dtype=float)
    times = np.array([r.seconds for r in rows])
    layouts = np.array([r.layout for r in rows])
    layer = [r.layer for r in rows]
    aligned = np.array([gemm.is_aligned("bf16", *r.shape) for r in rows])
    print(f"{len(rows)} measured GEMMs ({aligned.sum()} aligned, {(~aligned).sum()} unaligned), "
          f"{2 * shapes.prod(axis=1).min() / 1e9:.1f}-{2 * shapes.prod(axis=1).max() / 1e9:.0f} GFLOP")

    # 1. OpenXLA's table against the measurement, at the grid points both have
    table = gemm.measured_table(H100.name, "bf16")
    hits = [(tuple(int(v) for v in s), t / table.measured[tuple(int(v) for v in s)])
            for s, t in zip(shapes, times) if tuple(int(v) for v in s) in table.measured]
    print(f"1. PyTorch time / OpenXLA table time at the {len(hits)} grid points measured:")
    for s, ratio in sorted(hits, key=lambda h: math.prod(h[0])):
        print(f"     {s}  {2 * math.prod(s) / 1e9:6.1f} GFLOP  {ratio:.3f}")
    small = [ratio for s, ratio in hits if 2 * math.prod(s) < 10e9]
    large = [ratio for s, ratio in hits if 2 * math.prod(s) >= 30e9]
    print(f"   median ratio below 10 GFLOP {np.median(small):.3f} ({len(small)}), at 30 GFLOP and above "
          f"{np.median(large):.3f} ({len(large)}): no one scale maps the table onto the measurement")
    grid = [x for x in sorted(table.measured) if 2 * math.prod(x) >= 1e9]
    off = np.array([gemm.gemm_time_s(H100, "bf16", *x) / table.measured[x] - 1 for x in grid])
    print(f"   the shipped H100 model against the table's {len(grid)} shapes >= 1 GFLOP: median |e| "
          f"{np.median(np.abs(off)):.1%}, signed median {np.median(off):+.1%}")

    # 2. the aligned law
    idx = np.flatnonzero(aligned)
    t0 = time.perf_counter()
    alone = gemm.fit_device_law(H100, "bf16", shapes[idx], times[idx], free=())
    fit = gemm.fit_device_law(H100, "bf16", shapes[idx], times[idx], free=FREE)
    f_alone, f = alone.sustained[H100.name], fit.sustained[H100.name]
    print(f"2. aligned GEMMs ({time.perf_counter() - t0:.1f} s):")
    print(f"   factor alone under SHAPE_LAW: f = {f_alone:.4f}, sum of squared log errors {alone.loss:.3f}")
    print(line("residuals", predict(gemm.SHAPE_LAW, f_alone, shapes[idx], True) / times[idx] - 1))
    print(f"   f, {', '.join(FREE)} free: f = {f:.4f}, latency_s = {fit.law.latency_s:.4g}, "
          f"tail_wave = {fit.law.tail_wave:.4g}, sum of squared log errors {fit.loss:.3f}")
    print(f"   in the module: f = {gemm.SUSTAINED_FACTOR[H100.name]}, {gemm.H100_SHAPE_LAW}")
    err_in = predict(fit.law, f, shapes[idx], True) / times[idx] - 1
    print(line("residuals", err_in))
    for name in ("fwd", "dgrad", "wgrad"):
        pick = layouts[idx] == name
        print(line(f"  {name}", err_in[pick]))

    # 3. the unaligned rate
    udx = np.flatnonzero(~aligned)
    r = gemm.fit_unaligned_rate(H100, "bf16", shapes[udx], times[udx], law=fit.law, sustained=f)
    print(f"3. unaligned GEMMs: UNALIGNED_RATE = {r:.4f} (in the module {gemm.UNALIGNED_RATE}; "
          f"{r * f * 989.4:.0f} TFLOP/s main-loop rate)")
    err_u = predict(fit.law, f * r, shapes[udx], True) / times[udx] - 1
    print(line("residuals", err_u))
    for name in ("fwd", "dgrad", "wgrad"):
        pick = layouts[udx] == name
        print(line(f"  {name}", err_u[pick]))
    for i in range(0, len(udx), 3):
        three = udx[i:i + 3]
        total = predict(fit.law, f * r, shapes[three], True).sum() / times[three].sum() - 1
        print(f"     {layer[three[0]]}: the three layouts together {total:+.1%}")

    # 4. shipped model and held-out
    shipped = np.array([gemm.gemm_time_s(H100, "bf16", *r.shape) for r in rows]) / times - 1
    print("4. the shipped model (gemm_time_s on the h100 preset):")
    print(line("all", shipped))
    print(line("aligned", shipped[aligned]))
    print(line("unaligned", shipped[~aligned]))
    t0 = time.perf_counter()
    held = np.empty(len(rows))
    for key in sorted(set(layer)):
        out = np.array([lay == key for lay in layer])
        train_a, train_u = np.flatnonzero(aligned & ~out), np.flatnonzero(~aligned & ~out)
        part = gemm.fit_device_law(H100, "bf16", shapes[train_a], times[train_a], free=FREE,
                                   base=fit.law, iters=200)
        fp = part.sustained[H100.name]
        rp = gemm.fit_unaligned_rate(H100, "bf16", shapes[train_u], times[train_u], law=part.law, sustained=fp)
        test = np.flatnonzero(out)  # a row's three layouts are all aligned or all not (its N is in each)
        rate = 1.0 if aligned[test].all() else rp
        held[test] = predict(part.law, fp * rate, shapes[test], True) / times[test] - 1
    print(f"   leave-one-row-out ({len(set(layer))} refits, {time.perf_counter() - t0:.0f} s):")
    print(line("all", held))
    print(line("aligned", held[aligned]))
    print(line("unaligned", held[~aligned]))
    one = np.empty(len(udx))
    for j in range(len(udx)):
        rest = np.delete(udx, j)
        rj = gemm.fit_unaligned_rate(H100, "bf16", shapes[rest], times[rest], law=fit.law, sustained=f)
        one[j] = predict(fit.law, f * rj, shapes[udx[j:j + 1]], True)[0] / times[udx[j]] - 1
    print(line("unaligned, leave-one-GEMM-out", one))


if __name__ == "__main__":
    main()
