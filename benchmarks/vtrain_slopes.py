"""Split vTrain's single-node runs into a per-layer slope and a per-iteration intercept, measured
against predicted.

    PYTHONPATH=. .venv/bin/python benchmarks/vtrain_slopes.py [--min-b 1] [--per-micro-batch]

vTrain's runs (dml2comm/validate/data/vtrain_ground_truth_single.csv) vary the layer count L at
otherwise fixed (h, t, p, d, b, B); within such a cell the measured iteration time is linear in L
to 0.1 ms.  A least-squares line ``time = intercept + slope x L`` per cell (cells with at least
three layer counts) separates what grows with the layers (the transformer layers' compute,
collectives and host time) from what does not (embedding, LM head, loss, optimizer step,
pipeline fill).  The tool is fitted on the total only, so a per-layer term that is too large can
hide a non-layer term that is too small; this prints both for each cell, with the predicted /
measured slope ratio, and a summary per (h, t).  A diagnostic, not a fit: nothing here changes a
constant.

``--per-micro-batch`` goes one step further: within each (h, t, p, d, b) the cells differ only in
the number of micro-batches m = B / (d b), so a line in m through the per-cell slopes and
intercepts splits each into a part per micro-batch and a part per iteration.  It prints, measured
/ predicted: the time of one layer for one micro-batch (p x the slope per micro-batch: forward,
recomputed forward and backward of the layers a stage holds), the per-layer time per iteration
(optimizer step, gradient all-reduce), the non-layer time per micro-batch (embedding, LM head,
loss) and the constant per iteration.  Measured, the first is the same to 4 digits for every d
and p of an (h, t, b): one measurement per (h, t, b), composed.
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import numpy as np

from dml2comm.validate import vtrain


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--min-b", type=int, default=1, help="only cells with micro-batch >= this")
    ap.add_argument("--per-micro-batch", action="store_true", help="split each cell's slope and intercept per micro-batch")
    args = ap.parse_args()
    cases, runs = vtrain.cases(), vtrain.runs()
    cells: dict[tuple, dict[int, tuple[float, float]]] = defaultdict(dict)
    for c, r in zip(cases, runs):
        if r["b"] >= args.min_b:
            cells[(r["h"], r["t"], r["p"], r["d"], r["b"], r["B"])][r["L"]] = (c.measured, c.predicted)
    if args.per_micro_batch:
        per_micro_batch(cells)
        return
    print("cell (h t p d b B)          slope ms/layer meas / pred (ratio)   intercept ms meas / pred   "
          "intercept per sample per GPU meas / pred")
    summary: dict[tuple[int, int], list[tuple[float, float, float]]] = defaultdict(list)
    for key in sorted(cells):
        by_l = cells[key]
        if len(by_l) < 3:
            continue
        layers = np.array(sorted(by_l), dtype=float)
        meas = np.array([by_l[int(x)][0] for x in layers]) * 1e3
        pred = np.array([by_l[int(x)][1] for x in layers]) * 1e3
        sm, im = np.polyfit(layers, meas, 1)
        sp, ip = np.polyfit(layers, pred, 1)
        h, t, p, d, b, big_b = key
        samples = big_b / d
        summary[(h, t)].append((sp / sm, im / samples, ip / samples))
        print(f"{h:5d} {t} {p} {d} {b} {big_b:4d}   {sm:8.2f} / {sp:8.2f} ({sp / sm:5.3f})   "
              f"{im:8.1f} / {ip:8.1f}   {im / samples:6.2f} / {ip / samples:6.2f}")
    print("\nper (h, t): predicted / measured slope (mean, range); intercept per sample per GPU, measured / predicted (mean)")
    for (h, t), rows in sorted(summary.items()):
        ratio = np.array([r[0] for r in rows])
        print(f"h={h:5d} t={t}: slope ratio {ratio.mean():.3f} ({ratio.min():.3f}-{ratio.max():.3f}), "
              f"intercept per sample {np.mean([r[1] for r in rows]):.2f} / {np.mean([r[2] for r in rows]):.2f} ms "
              f"({len(rows)} cells)")


def per_micro_batch(cells: dict[tuple, dict[int, tuple[float, float]]]) -> None:
    """Lines in m through the per-cell slopes and intercepts of each (h, t, p, d, b) (module docstring)."""
    lines: dict[tuple, list[tuple[int, float, float, float, float]]] = defaultdict(list)
    for (h, t, p, d, b, big_b), by_l in cells.items():
        if len(by_l) < 3:
            continue
        layers = np.array(sorted(by_l), dtype=float)
        sm, im = np.polyfit(layers, [by_l[int(x)][0] * 1e3 for x in layers], 1)
        sp, ip = np.polyfit(layers, [by_l[int(x)][1] * 1e3 for x in layers], 1)
        lines[(h, t, p, d, b)].append((big_b // (d * b), sm, sp, im, ip))
    print("h     t p d b   layer x micro-batch ms meas / pred (ratio) | layer per iteration | "
          "non-layer per micro-batch | constant per iteration")
    for key in sorted(lines):
        pts = sorted(lines[key])
        if len(pts) < 2:
            continue
        m = np.array([x[0] for x in pts], dtype=float)
        fits = [np.polyfit(m, [x[j] for x in pts], 1) for j in (1, 2, 3, 4)]
        (km, cm), (kp, cp), (kim, cim), (kip, cip) = fits
        h, t, p, d, b = key
        print(f"{h:5d} {t} {p} {d} {b}   {km * p:7.2f} / {kp * p:7.2f} ({kp / km:4.2f}) | {cm:5.2f} / {cp:5.2f} | "
              f"{kim:6.2f} / {kip:6.2f} | {cim:6.1f} / {cip:6.1f}")


if __name__ == "__main__":
    main()
