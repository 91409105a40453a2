"""Fit the H100 collective constants on part of the bundled OpenXLA table and report the rest.

Prints (asserts nothing):

1. The fit: four constants, by coordinate descent over grids, on the rows of groups of 2 and 8
   (all sizes, all four ops) through the tool's own model
   (:func:`dml2comm.network.model.collective_time_on_placement` on ``dgx-h100`` with the
   candidate constants in its NVLink4 link):

   - ``XLA_CALL_OVERHEAD_S``      fixed time per call of XLA's measurement (validate/collectives.py);
   - ``in_network_efficiency``    NVLS (NVLink SHARP) share of the 450 GB/s line rate;
   - ``reduce_s_per_byte``        rho, per byte of the reduced block S/n (collectives.reduced_block_bytes);
   - ``alltoall_latency_s``       fixed time of NCCL's grouped point-to-point AllToAll.

   The loss is what the targets measure: the mean over (op, group) of the mean |error| at
   16 MiB and above, plus the median |error| over all sizes.
2. Training and held-out (groups of 4) figures, and the per-(op, group) table of the shipped
   constants (hardware/cluster.py, validate/collectives.py) over the whole table.

Everything else is sourced, not fitted: line rate 450 GB/s and delta 0.841 ps/B (the
maintainers' 370 GB/s ring busbw), NCCL's latencies (NVLS 25 us, NCCL 2.28 tuning.cc), NVLS only
for groups of more than two GPUs (nvls.cc), AllToAll kernel bytes ((n-1)/n) S.

Usage::

    python benchmarks/fit_h100_collectives.py [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from dml2comm.hardware import get_cluster  # noqa: E402
from dml2comm.network.model import collective_time_on_placement, group_placement  # noqa: E402
from dml2comm.validate.collectives import MIB, XLA_CALL_OVERHEAD_S, xla_rows  # noqa: E402

KEYS = ("overhead_s", "in_network_efficiency", "reduce_s_per_byte", "alltoall_latency_s")


def _shipped() -> dict[str, float]:
    link = get_cluster("dgx-h100", 8).intra_node
    return {"overhead_s": XLA_CALL_OVERHEAD_S, "in_network_efficiency": float(link.in_network_efficiency or 0.0),
            "reduce_s_per_byte": link.reduce_s_per_byte, "alltoall_latency_s": link.alltoall_latency_s}


def _predict(rows, p: dict[str, float]) -> list[float]:
    out = []
    clusters = {}
    for r in rows:
        cl = clusters.get(r.ranks)
        if cl is None:
            base = get_cluster("dgx-h100", r.ranks)
            link = replace(base.intra_node, in_network_efficiency=p["in_network_efficiency"],
                           reduce_s_per_byte=p["reduce_s_per_byte"], alltoall_latency_s=p["alltoall_latency_s"])
            cl = clusters[r.ranks] = replace(base, intra_node=link, collective_overhead_s=p["overhead_s"])
        out.append(collective_time_on_placement(cl, r.kind, group_placement(cl, list(range(r.ranks))), r.ranks,
                                                float(r.size_bytes)))
    return out


def _errors(rows, p):
    return [pred / r.time_s - 1 for r, pred in zip(rows, _predict(rows, p))]


def _by_group(rows, errs):
    big = defaultdict(list)
    for r, e in zip(rows, errs):
        if r.size_bytes >= 16 * MIB:
            big[(r.kind.value, r.ranks)].append(e)
    return big


def _loss(rows, p) -> float:
    errs = _errors(rows, p)
    big = _by_group(rows, errs)
    return float(np.mean([np.mean(np.abs(v)) for v in big.values()]) + np.median(np.abs(errs)))


def fit(rows, start: dict[str, float], grids: dict[str, np.ndarray], rounds: int = 3) -> dict[str, float]:
    """Coordinate descent of :func:`_loss` over the grids, from ``start``."""
    p = dict(start)
    for _ in range(rounds):
        for k in KEYS:
            p[k] = float(min(grids[k], key=lambda v: _loss(rows, dict(p, **{k: float(v)}))))
    return p


def report(title: str, rows, p) -> None:
    errs = _errors(rows, p)
    big = _by_group(rows, errs)
    print(f"{title}: {len(rows)} rows, median |error| {statistics.median(abs(e) for e in errs):.1%}, "
          f"mean |error| {np.mean(np.abs(errs)):.1%}")
    for key in sorted(big):
        v = big[key]
        print(f"  {key[0]:<15} n={key[1]}  >= 16 MiB: mean |error| {np.mean(np.abs(v)):5.1%}  signed {np.mean(v):+6.1%}  "
              f"worst {max(v, key=abs):+6.1%}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="coarser grids (a few seconds)")
    args = ap.parse_args(argv)
    rows = xla_rows()
    train = [r for r in rows if r.ranks in (2, 8)]
    held = [r for r in rows if r.ranks == 4]
    step = 4 if args.quick else 1
    grids = {
        "overhead_s": np.arange(0.0, 30.01e-6, 0.5e-6 * step),
        "in_network_efficiency": np.arange(0.40, 0.901, 0.005 * step),
        "reduce_s_per_byte": np.arange(0.0, 3.001e-12, 0.05e-12 * step),
        "alltoall_latency_s": np.arange(0.0, 120.01e-6, 1e-6 * step),
    }
    start = {"overhead_s": 0.0, "in_network_efficiency": 0.792, "reduce_s_per_byte": 0.0, "alltoall_latency_s": 0.0}
    p = fit(train, start, grids)
    print("fitted on groups of 2 and 8 (all sizes):")
    print(f"  overhead {p['overhead_s'] * 1e6:.1f} us, NVLS efficiency {p['in_network_efficiency']:.3f}, "
          f"rho {p['reduce_s_per_byte'] * 1e12:.2f} ps/B, all-to-all latency {p['alltoall_latency_s'] * 1e6:.0f} us")
    report("training rows (n = 2, 8)", train, p)
    report("held-out rows (n = 4)", held, p)
    shipped = _shipped()
    print("\nshipped constants:", ", ".join(f"{k} {v:.4g}" for k, v in shipped.items()))
    report("whole table, shipped constants", rows, shipped)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
