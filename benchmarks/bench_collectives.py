"""Collective cost library: calibration against measured NCCL all-reduces, and evaluation speed.

Prints (asserts nothing):

1. Every row of shared/data/nccl_allreduce_measured.csv (vTrain's A100 and V100 single-node
   lookup tables) with the calibrated prediction of
   :func:`dml2comm.network.model.collective_cost_for_group` on the matching preset (A100 ->
   dgx-a100, V100 -> dgx-v100), the error ``(predicted - measured) / measured``, the protocol
   NCCL's tuner would pick, and the error of the previous baseline (a ring on one link at the
   maintainers' 230/300 efficiency, V100 at NCCL's 20/25 for every group) for comparison; then
   the calibration parameters and their sources.
2. Evaluations per second: the vectorised formulas (:func:`collective_time_vec`, one algorithm
   and the fastest of all), and the per-call group API with and without its cache.

Usage::

    python benchmarks/bench_collectives.py [--csv PATH] [--evals N]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from dml2comm.hardware import cluster as cluster_mod  # noqa: E402
from dml2comm.hardware import Link, get_cluster  # noqa: E402
from dml2comm.network import model  # noqa: E402
from dml2comm.network.collectives import collective_cost, collective_time_vec, registered_algorithms  # noqa: E402
from dml2comm.network.kinds import Algorithm, CollectiveKind  # noqa: E402
from dml2comm.validate.collectives import nccl_rows, predict  # noqa: E402

DEFAULT_CSV = REPO_ROOT.parent / "shared" / "data" / "nccl_allreduce_measured.csv"
PRESET_FOR_GPU = {"A100": "dgx-a100", "V100": "dgx-v100"}
MIB = 2**20
# The model this library replaced: one link per group, efficiency = achieved / line at n = 8.
BASELINE_LINK = {"A100": Link("A100 NVLink, baseline", 300e9, 3.4e-6, 230 / 300), "V100": Link("V100 NVLink, baseline", 150e9, 3.4e-6, 0.8)}


def _size(b: int) -> str:
    return f"{b // (1024 * MIB)} GiB" if b >= 1024 * MIB else f"{b // MIB} MiB"


def calibration(csv_path: Path) -> list[dict[str, object]]:
    """Every row costed as ``python main.py validate --source nccl`` costs it
    (:mod:`dml2comm.validate.collectives`: the ``collective --cluster`` path), with the baseline."""
    rows = []
    for r in nccl_rows(csv_path):
        cost = predict(r)
        baseline = collective_cost(CollectiveKind.ALL_REDUCE, r.ranks, float(r.size_bytes), BASELINE_LINK[r.gpu])
        rows.append({
            "gpu": r.gpu, "n": r.ranks, "size": r.size_bytes, "measured_s": r.time_s, "predicted_s": cost.time_s,
            "error": (cost.time_s - r.time_s) / r.time_s, "protocol": cost.protocol, "algorithm": cost.algorithm,
            "measured_busbw": r.busbw_bytes_per_s, "predicted_busbw": cost.busbw_bytes_per_s,
            "baseline_error": (baseline.time_s - r.time_s) / r.time_s,
        })
    return rows


def print_calibration(rows: list[dict[str, object]]) -> None:
    print("1. AllReduce, calibrated NCCL model (collective_cost_for_group) vs measured NCCL (vTrain LUTs)")
    head = (f"{'gpu':5} {'n':>2} {'size':>8} {'measured us':>12} {'predicted':>10} {'error':>7} {'protocol':>8} "
            f"{'meas busbw':>10} {'pred busbw':>10} {'baseline':>9}")
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['gpu']:5} {r['n']:>2} {_size(r['size']):>8} {r['measured_s'] * 1e6:>12.1f} {r['predicted_s'] * 1e6:>10.1f} "
              f"{r['error']:>+7.1%} {r['protocol']:>8} {r['measured_busbw'] / 1e9:>10.1f} {r['predicted_busbw'] / 1e9:>10.1f} "
              f"{r['baseline_error']:>+9.1%}")
    for gpu in sorted({r["gpu"] for r in rows}):
        big = [r for r in rows if r["gpu"] == gpu and r["size"] >= 16 * MIB]
        worst = max(big, key=lambda r: abs(r["error"]))
        mean = sum(abs(r["error"]) for r in big) / len(big)
        print(f"{gpu} rows >= 16 MiB: mean |error| {mean:.1%}, worst {worst['error']:+.1%} (n={worst['n']}, {_size(worst['size'])}); "
              f"all rows within {max(abs(r['error']) for r in rows if r['gpu'] == gpu):.1%}")
    a100 = get_cluster("dgx-a100").intra_node
    v100 = get_cluster("dgx-v100").intra_node
    print("parameters:")
    print(f"  A100 NVLink: line rate {a100.bandwidth_bytes_per_s / 1e9:g} GB/s x efficiency {a100.efficiency:g}, "
          f"kernel term delta {a100.kernel_s_per_byte * 1e12:.3f} ps/B (from the maintainers' 230 GB/s at n = 8)")
    print(f"  V100 NVLink: {v100.per_link_bytes_per_s / 1e9:g} GB/s per link x efficiency {v100.efficiency:g} "
          "(the two 1 GiB V100 rows), links per pair from the DGX-1 cube-mesh matrix")
    print(f"  per-call overhead {cluster_mod.NCCL_CALL_OVERHEAD_S * 1e6:.1f} us (the 8 x A100 1 MiB row); "
          "NCCL baseLat / hwLat / protocol factors from src/graph/tuning.cc")


def _rate(fn, count: int, repeat: int = 5) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return count / best


def print_speed(evals: int) -> None:
    print()
    print("2. Speed (evaluations per second; best of 5)")
    rng = np.random.default_rng(0)
    n = rng.integers(1, 4097, size=evals).astype(float)
    size = 10 ** rng.uniform(0, 10, size=evals)
    alpha, beta = 3.4e-6, 1 / 300e9
    ring = _rate(lambda: collective_time_vec(CollectiveKind.ALL_REDUCE, Algorithm.RING, n, size, alpha, beta,
                                             base_latency_s=8.4e-6, kernel_s_per_byte=1.775e-12), evals)
    print(f"  collective_time_vec, AllReduce ring, {evals:,} (n, S) pairs: {ring:,.0f} evaluations/s")
    algs = [a for a in registered_algorithms(CollectiveKind.ALL_REDUCE) if a is not Algorithm.HIERARCHICAL]

    def best_of_all() -> None:
        np.min([collective_time_vec(CollectiveKind.ALL_REDUCE, a, n, size, alpha, beta) for a in algs], axis=0)

    best = _rate(best_of_all, evals)
    print(f"  fastest of {len(algs)} AllReduce algorithms per (n, S), vectorised: {best:,.0f} pairs/s "
          f"({best * len(algs):,.0f} formula evaluations/s)")
    hier = _rate(lambda: collective_time_vec(CollectiveKind.ALL_REDUCE, Algorithm.HIERARCHICAL, n * 8, size, alpha, beta,
                                             gpus_per_node=8.0, alpha_inter_s=14e-6, beta_inter_s_per_byte=1 / 24e9), evals)
    print(f"  collective_time_vec, two-level AllReduce (8 GPUs per node): {hier:,.0f} evaluations/s")
    cluster = get_cluster("dgx-a100", 1024)
    groups = [list(range(8 * i, 8 * i + 8)) for i in range(8)] + [list(range(i, 1024, 8)) for i in range(8)]
    sizes = [2.0 ** k for k in range(10, 31)]
    calls = len(groups) * len(sizes)

    def uncached() -> None:
        model._cost_cached.cache_clear()
        model._uses_of.cache_clear()
        for g in groups:
            for s in sizes:
                model.collective_cost_for_group(cluster, CollectiveKind.ALL_REDUCE, g, s)

    def cached() -> None:
        for g in groups:
            for s in sizes:
                model.collective_cost_for_group(cluster, CollectiveKind.ALL_REDUCE, g, s)

    print(f"  collective_cost_for_group (1,024 x A100, TP groups of 8 and DP groups of 128, NCCL candidates and protocols): "
          f"{_rate(uncached, calls, 3):,.0f} calls/s uncached, {_rate(cached, calls):,.0f} calls/s cached")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", type=Path, default=DEFAULT_CSV, help=f"measured rows (default {DEFAULT_CSV})")
    parser.add_argument("--evals", type=int, default=1_000_000, help="vector length for the speed test (default 1,000,000)")
    args = parser.parse_args(argv)
    if not args.csv.is_file():
        print(f"error: {args.csv} not found; pass --csv PATH", file=sys.stderr)
        return 2
    print_calibration(calibration(args.csv))
    print_speed(args.evals)
    return 0


if __name__ == "__main__":
    sys.exit(main())
