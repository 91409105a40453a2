"""Fit and check the host model's per-kernel time (dml2comm.cost.host.EAGER.kernel_s) on vTrain's
single-node runs.

    PYTHONPATH=. .venv/bin/python benchmarks/host_vtrain.py [--values 40,44,48,52] [--p2p-values 0,1,1.5,2]

Prints (1) the measured and predicted time per layer slot (one layer's forward, recomputed
forward and backward for one micro-batch: time / ((L / p) (m + p - 1))) per hidden size, t and
micro-batch, with the host model off and at the shipped value: the measured slot stops falling at
about 3.3-3.7 ms however small the GEMMs; (2) vTrain's mean absolute error per candidate
``kernel_s`` (all runs, and each hidden-size half), the in-sample fit, and the two-fold held-out
error (fit on one hidden size, predict the other); (3) with ``--p2p-values``, the same for the
host time per pipeline message (``p2p_s``, milliseconds) at the shipped ``kernel_s``: the error
overall and per pipeline depth, and the two-fold held-out error by depth (fit on p = 2, predict
p = 4, and back).  Fitted on vTrain only; the A100 sustained
factor stays fitted on Narayanan 2021 (benchmarks/fit_a100.py).
"""

from __future__ import annotations

import argparse
import time
from types import MappingProxyType

import numpy as np

from dml2comm.cost import host
from dml2comm.validate import vtrain


SHIPPED_MODELS = host.HOST_MODELS


def evaluate(kernel_s: float, p2p_s: float | None = None):
    # the stage tables resolve the cluster's host model by name (host.host_model reads
    # host.HOST_MODELS), so the candidate replaces the "eager" preset; patching host.DEFAULT alone
    # changes nothing on that path
    p2p = SHIPPED_MODELS["eager"].p2p_s if p2p_s is None else p2p_s
    candidate = host.HostModel("eager", kernel_s=kernel_s, p2p_s=p2p)
    host.HOST_MODELS = MappingProxyType({**SHIPPED_MODELS, "eager": candidate})
    host.DEFAULT = candidate
    vtrain.clear_cache()
    cases = vtrain.cases()
    runs = vtrain.runs()
    return cases, runs


def slots(cases, runs):
    table = {}
    for c, r in zip(cases, runs):
        m = r["B"] // (r["b"] * r["d"])
        slot = (r["L"] / r["p"]) * (m + r["p"] - 1)
        table.setdefault((r["h"], r["t"], r["b"]), []).append((c.measured / slot, c.predicted / slot))
    return table


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--values", default="36,40,42,44,46,48,50,52,56", help="kernel_s candidates in microseconds")
    ap.add_argument("--p2p-values", default="", help="p2p_s candidates in milliseconds (e.g. 0,0.5,1,1.5,2)")
    args = ap.parse_args()
    if args.p2p_values:
        fit_p2p([float(v) * 1e-3 for v in args.p2p_values.split(",")])
        return
    shipped = host.EAGER.kernel_s
    off = slots(*evaluate(0.0))
    on = slots(*evaluate(shipped))
    print(f"time per layer slot (ms): measured, predicted with the host model off and at kernel_s = {shipped * 1e6:.0f} us")
    print(f"{'h':>5} {'t':>2} {'b':>2} {'runs':>4} {'measured':>9} {'off':>7} {'on':>7}")
    for key in sorted(off):
        m = np.mean([x[0] for x in off[key]]) * 1e3
        print(f"{key[0]:>5} {key[1]:>2} {key[2]:>2} {len(off[key]):>4} {m:9.3f} {np.mean([x[1] for x in off[key]]) * 1e3:7.3f} "
              f"{np.mean([x[1] for x in on[key]]) * 1e3:7.3f}")
    values = [float(v) * 1e-6 for v in args.values.split(",")]
    res = {}
    for v in values:
        start = time.perf_counter()
        cases, runs = evaluate(v)
        e = np.array([c.error for c in cases])
        h = np.array([r["h"] for r in runs])
        res[v] = {"all": np.mean(np.abs(e)), **{hh: np.mean(np.abs(e[h == hh])) for hh in sorted(set(h))},
                  "worst": e[np.argmax(np.abs(e))]}
        print(f"kernel_s {v * 1e6:5.1f} us: mean |error| {res[v]['all']:.4f}, " + ", ".join(
            f"h={hh} {res[v][hh]:.4f}" for hh in sorted(set(h))) + f", worst {res[v]['worst']:+.3f} ({time.perf_counter() - start:.0f} s)")
    best = min(values, key=lambda v: res[v]["all"])
    print(f"in-sample fit: kernel_s = {best * 1e6:.0f} us, mean |error| {res[best]['all']:.4f}")
    halves = [k for k in res[best] if isinstance(k, (int, np.integer))]
    for fit_on in halves:
        other = [k for k in halves if k != fit_on][0]
        v = min(values, key=lambda x: res[x][fit_on])
        own = min(res[x][other] for x in values)
        print(f"fit on h={fit_on}: kernel_s = {v * 1e6:.0f} us; h={other} held out: {res[v][other]:.4f} (its own best {own:.4f})")
    host.HOST_MODELS = SHIPPED_MODELS
    host.DEFAULT = host.EAGER
    vtrain.clear_cache()


def fit_p2p(values: list[float]) -> None:
    shipped = host.EAGER.kernel_s
    res = {}
    for v in values:
        cases, runs = evaluate(shipped, v)
        e = np.abs(np.array([c.error for c in cases]))
        p = np.array([r["p"] for r in runs])
        res[v] = {"all": e.mean(), **{pp: e[p == pp].mean() for pp in sorted(set(p))}}
        print(f"p2p_s {v * 1e3:5.2f} ms: mean |error| {res[v]['all']:.4f}, "
              + ", ".join(f"p={pp} {res[v][pp]:.4f}" for pp in sorted(set(p))))
    best = min(values, key=lambda x: res[x]["all"])
    print(f"in-sample fit: p2p_s = {best * 1e3:.2f} ms, mean |error| {res[best]['all']:.4f}")
    for fit_on, other in ((2, 4), (4, 2)):
        v = min(values, key=lambda x: res[x][fit_on])
        print(f"fit on p={fit_on}: p2p_s = {v * 1e3:.2f} ms; p={other} held out: {res[v][other]:.4f} "
              f"(its own best {min(res[x][other] for x in values):.4f})")
    host.HOST_MODELS = SHIPPED_MODELS
    host.DEFAULT = host.EAGER
    vtrain.clear_cache()


if __name__ == "__main__":
    main()
