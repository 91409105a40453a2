"""Speed of the configuration sweep: configurations analysed per second.

Model: the zoo 530B GPT shape (105 blocks, hidden 20480, 128 heads, vocab 51200, s = 2048),
global batch 2240 on 2,240 A100s (``dgx-a100``), as Narayanan et al. 2021 (Table 1: the paper's
run is t=8, p=35, d=8).  Two bounded subsets of the space:

- ``first``: the first ``--limit`` configurations of the full enumeration, with 1 and ``--workers``
  processes;
- ``paper``: t=8, d=8 (so p=35), b in {1, 2}, ZeRO 0/1, every recomputation mode, SP on/off,
  which contains the paper's choice; prints the best one found beside it.

Target (issue 7): 2,000 configurations/s.  This first increment runs the full analysis per
configuration (about 0.5 s each for this model), so it is orders of magnitude below the target;
the fast path (a closed-form evaluation per configuration) is future work.

    .venv/bin/python benchmarks/bench_sweep.py [--limit 40] [--workers 2]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dml2comm import zoo  # noqa: E402
from dml2comm.hardware.cluster import get_cluster  # noqa: E402
from dml2comm.search.space import Constraints  # noqa: E402
from dml2comm.search.sweep import SweepSpace, run_sweep  # noqa: E402

GPUS = 2240
GLOBAL_BATCH = 2240


def _builder(num_gpus: int):
    return dataclasses.replace(get_cluster("dgx-a100", num_gpus), collective_overhead_s=0.0)


def _describe(row) -> str:
    c = row["config"]
    return (f"d={c['d']} t={c['t']} p={c['p']} b={c['micro_batch_size']} v={c['virtual_stages']} zero={c['zero_stage']} "
            f"recompute={c['recompute']} sp={int(c['sequence_parallel'])}: {row['iteration_time_s']:.2f} s, "
            f"{row['tflops_per_gpu']:.0f} TFLOP/s/GPU, {row['peak_memory_bytes'] / 2**30:.1f} GiB, "
            f"{'fits' if row['fits'] else 'does not fit'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=40, help="configurations of the 'first' subset (default 40)")
    parser.add_argument("--workers", type=int, default=2, help="processes for the parallel runs (default 2)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "gpt530b.onnx"
        zoo.save(zoo.build_gpt(layers=105, hidden=20480, heads=128, vocab=51200, seq_len=2048), path)
        space = SweepSpace(global_batch_size=GLOBAL_BATCH, constraints=Constraints())
        for workers in (1, args.workers):
            start = time.perf_counter()
            result = run_sweep(str(path), GPUS, _builder, space, workers=workers, limit=args.limit)
            wall = time.perf_counter() - start
            print(f"first {len(result.rows)} of {result.num_configs} configurations, {workers} worker(s): "
                  f"{len(result.rows) / wall:.2f} configurations/s ({wall:.1f} s, including the model import)")
        paper = SweepSpace(global_batch_size=GLOBAL_BATCH, constraints=Constraints(
            d=(8,), t=(8,), micro_batch_sizes=(1, 2), virtual_stages=(1,), zero_stages=(0, 1)))
        start = time.perf_counter()
        result = run_sweep(str(path), GPUS, _builder, paper, workers=args.workers)
        wall = time.perf_counter() - start
        print(f"paper slice (d=8 t=8 p=35): {len(result.rows)} configurations, {args.workers} worker(s): "
              f"{len(result.rows) / wall:.2f} configurations/s")
        chosen = next((r for r in result.rows if r["error"] is None and r["config"]["micro_batch_size"] == 1
                       and r["config"]["zero_stage"] == 0 and r["config"]["recompute"] == "full"
                       and not r["config"]["sequence_parallel"]), None)
        if chosen is not None:
            print("paper's choice   ", _describe(chosen))
        if result.best is not None:
            print("best in the slice", _describe(result.best))
        print("target: 2,000 configurations/s; the per-configuration fast path is future work")


if __name__ == "__main__":
    main()
