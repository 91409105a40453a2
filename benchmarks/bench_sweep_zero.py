"""Speed of a ZeRO-2/3 sweep against the same sweep at ZeRO 0/1: configurations evaluated per second.

Model: a 24-layer GPT from the zoo (hidden 2048, 16 heads, vocab 51200, s = 2048), global batch
512 on 64 A100s (``dgx-a100``): every valid d, t, p, micro-batch 1/2/4/8, virtual stages 1/2/4,
recomputation none/selective/full, SP on/off, once with ZeRO stages 0/1 and once with 2/3,
through :func:`dml2comm.search.sweep.run_sweep` (2 workers by default).  Until issue 17 the fast
path did not cover ZeRO-2/3 and the sweep evaluated them with the full analysis (about 69
configurations/s on this machine against about 2,500 for ZeRO 0/1); since, both run on the fast
path (:func:`dml2comm.sim.levels.pipeline_end_times_zero` carries the per-micro-batch ZeRO
collectives).  Each run is a fresh process with the modules imported and no caches warmed
(:mod:`fresh`), as a command-line sweep starts.

Target (issue 17): the ZeRO-2/3 rate at least half the ZeRO-0/1 rate.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_sweep_zero.py [--workers 2] [--limit N]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from dml2comm import zoo  # noqa: E402
from fresh import in_fresh_process  # noqa: E402
import dml2comm.analysis  # noqa: E402,F401 - imported before timing: a sweep run from the command line has them loaded
import dml2comm.model  # noqa: E402,F401
from dml2comm.hardware.cluster import get_cluster  # noqa: E402
from dml2comm.search.space import Constraints  # noqa: E402
from dml2comm.search.sweep import SweepSpace, run_sweep  # noqa: E402

GPUS = 64
GLOBAL_BATCH = 512


def _builder(num_gpus: int):
    return dataclasses.replace(get_cluster("dgx-a100", num_gpus), collective_overhead_s=0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2, help="processes (default 2)")
    parser.add_argument("--limit", type=int, default=None, help="only the first N configurations")
    args = parser.parse_args()
    rates = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "gpt24.onnx"
        zoo.save(zoo.build_gpt(layers=24, hidden=2048, heads=16, vocab=51200, seq_len=2048), path)
        for zeros in ((0, 1), (2, 3)):
            space = SweepSpace(global_batch_size=GLOBAL_BATCH, constraints=Constraints(zero_stages=zeros))

            def measure(space=space):
                start = time.perf_counter()
                sweep = run_sweep(str(path), GPUS, _builder, space, workers=args.workers, limit=args.limit)
                return time.perf_counter() - start, sweep

            wall, result = in_fresh_process(measure)
            rates[zeros] = len(result.rows) / wall
            print(f"ZeRO {'/'.join(map(str, zeros))} sweep: {len(result.rows)} configurations, {args.workers} worker(s): "
                  f"{wall:.2f} s, {rates[zeros]:.0f} configurations/s ({sum(r['fits'] for r in result.rows)} fit in 80 GB)")
    print(f"ZeRO-2/3 rate / ZeRO-0/1 rate: {rates[(2, 3)] / rates[(0, 1)]:.2f} (target: at least 0.5)")


if __name__ == "__main__":
    main()
