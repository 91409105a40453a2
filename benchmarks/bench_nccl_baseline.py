"""Single-link ring AllReduce versus measured NCCL all-reduce times (prints; asserts nothing).

Reads shared/data/nccl_allreduce_measured.csv (vTrain's A100 and V100 single-node lookup
tables), costs each row with the textbook ring of :func:`dml2comm.network.collectives.collective_cost`
on the matching preset's :meth:`~dml2comm.hardware.Cluster.link_for_group` link (A100 ->
dgx-a100, V100 -> dgx-v100: no NCCL base latency, protocols, overhead or NVLink matrix) and
prints measured and predicted time and bus bandwidth with the relative error
``(predicted - measured) / measured``.  The calibrated model the analysis uses, and the
previous baseline's errors, are in benchmarks/bench_collectives.py.

Usage::

    python benchmarks/bench_nccl_baseline.py [--csv PATH]
"""

from __future__ import annotations

import argparse
import csv
import sys
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from dml2comm.hardware import get_cluster  # noqa: E402
from dml2comm.network.collectives import collective_cost  # noqa: E402
from dml2comm.network.kinds import CollectiveKind  # noqa: E402

DEFAULT_CSV = REPO_ROOT.parent / "shared" / "data" / "nccl_allreduce_measured.csv"
PRESET_FOR_GPU = {"A100": "dgx-a100", "V100": "dgx-v100"}
MIB = 2**20


@dataclass(frozen=True)
class Row:
    gpu: str
    ranks: int
    size_bytes: int
    measured_s: float
    measured_busbw: float  # bytes/s
    predicted_s: float
    predicted_busbw: float  # bytes/s
    preset: str

    @property
    def error(self) -> float:
        return (self.predicted_s - self.measured_s) / self.measured_s


def compare(csv_path: Path) -> list[Row]:
    """Cost every single-node row of ``csv_path`` whose GPU has a preset."""
    rows: list[Row] = []
    with csv_path.open(newline="") as handle:
        for rec in csv.DictReader(handle):
            preset = PRESET_FOR_GPU.get(rec["gpu"])
            if preset is None or rec["scope"] != "single node":
                continue
            n = int(rec["ranks"])
            cluster = get_cluster(preset)  # one node
            link = cluster.link_for_group(range(n))
            cost = collective_cost(CollectiveKind.ALL_REDUCE, n, float(rec["size_bytes"]), link)
            rows.append(
                Row(
                    gpu=rec["gpu"],
                    ranks=n,
                    size_bytes=int(rec["size_bytes"]),
                    measured_s=float(rec["time_us"]) * 1e-6,
                    measured_busbw=float(rec["busbw_GBps"]) * 1e9,
                    predicted_s=cost.time_s,
                    predicted_busbw=cost.busbw_bytes_per_s,
                    preset=preset,
                )
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", type=Path, default=DEFAULT_CSV, help=f"measured rows (default {DEFAULT_CSV})")
    args = parser.parse_args(argv)
    if not args.csv.is_file():
        print(f"error: {args.csv} not found; pass --csv PATH", file=sys.stderr)
        return 2
    rows = compare(args.csv)
    header = f"{'gpu':5} {'preset':9} {'n':>2} {'size':>9} {'meas us':>9} {'pred us':>9} {'error':>7} {'meas busbw':>11} {'pred busbw':>11}"
    print("Ring AllReduce on one link (textbook formula, no NCCL latencies) vs measured NCCL (vTrain LUTs); busbw in GB/s")
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r.gpu:5} {r.preset:9} {r.ranks:>2} {r.size_bytes / MIB:>5.0f} MiB {r.measured_s * 1e6:>9.1f} "
            f"{r.predicted_s * 1e6:>9.1f} {r.error:>+7.1%} {r.measured_busbw / 1e9:>11.1f} {r.predicted_busbw / 1e9:>11.1f}"
        )
    for gpu in sorted({r.gpu for r in rows}):
        big = [r for r in rows if r.gpu == gpu and r.size_bytes >= 64 * MIB]
        if big:
            worst = max(big, key=lambda r: abs(r.error))
            mean_abs = sum(abs(r.error) for r in big) / len(big)
            print(
                f"{gpu} rows >= 64 MiB: mean |error| {mean_abs:.1%}, worst {worst.error:+.1%} "
                f"(n={worst.ranks}, {worst.size_bytes / MIB:.0f} MiB)"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
