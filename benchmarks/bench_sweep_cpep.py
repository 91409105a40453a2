"""Speed of a sweep over context- and expert-parallel sizes: configurations evaluated per second.

Model: a zoo mixture-of-experts with Mixtral-8x7B's shape (32 layers, hidden 4096, 32 heads, 8
KV heads, FFN 14336, 8 experts, top-2, vocab 32000, s = 4096), global batch 256 on ``--gpus``
A100s (``dgx-a100``).  The space: every valid d, t, p, micro-batch, virtual stages, ZeRO 0/1,
recomputation and SP, times c in {1, 2, 4} (``--scheme`` ulysses or ring) and e in {1, 2, 4, 8}
(10,896 configurations on 32 GPUs), through :func:`dml2comm.search.sweep.run_sweep` with the fast
path.  The rate counts the whole call (import included), each run in a fresh process with no
caches warmed (:mod:`fresh`).

Target (issue 9): adding c and e keeps the sweep at the search issue's rate (2,000/s).

    .venv/bin/python benchmarks/bench_sweep_cpep.py [--gpus 32] [--workers 2] [--scheme ring]
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
import dml2comm.analysis  # noqa: E402,F401 - imported before timing, as a command-line run has it
from dml2comm.hardware.cluster import get_cluster  # noqa: E402
from dml2comm.model import supports  # noqa: E402
from dml2comm.search.space import Constraints  # noqa: E402
from dml2comm.search.sweep import SweepSpace, config_from_dict, run_sweep  # noqa: E402


def _builder(num_gpus: int):
    return dataclasses.replace(get_cluster("dgx-a100", num_gpus), collective_overhead_s=0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=32)
    parser.add_argument("--batch", type=int, default=256, help="global batch (default 256)")
    parser.add_argument("--scheme", default="ulysses", choices=("ulysses", "ring"))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--limit", type=int, default=None, help="only the first N configurations")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "mixtral.onnx"
        zoo.save(zoo.build_moe(layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, experts=8, top_k=2,
                               vocab=32000, seq_len=4096), path)
        space = SweepSpace(global_batch_size=args.batch,
                           constraints=Constraints(cp=(1, 2, 4), ep=(1, 2, 4, 8), cp_scheme=args.scheme))
        for workers in sorted({1, args.workers}):
            def measure(workers=workers):
                start = time.perf_counter()
                sweep = run_sweep(str(path), args.gpus, _builder, space, workers=workers, limit=args.limit)
                return time.perf_counter() - start, sweep

            wall, result = in_fresh_process(measure)  # no caches warmed by the run before
            rows = result.rows
            cpep = sum(1 for r in rows if r["config"]["c"] > 1 or r["config"]["e"] > 1)
            fast = sum(1 for r in rows if supports(config_from_dict(r["config"])))
            print(f"MoE sweep ({args.scheme}), {args.gpus} GPUs: {len(rows)} of {result.num_configs} configurations "
                  f"({cpep} with c > 1 or e > 1, {fast} on the fast path), {workers} worker(s): {wall:.2f} s, "
                  f"{len(rows) / wall:.0f} configurations/s")
        if result.best is not None:
            c = result.best["config"]
            print("best:", " ".join(f"{k}={c[k]}" for k in ("d", "t", "p", "c", "e", "micro_batch_size", "virtual_stages",
                                                             "zero_stage", "recompute", "sequence_parallel")),
                  f"{result.best['iteration_time_s']:.3f} s, {result.best['tflops_per_gpu']:.0f} TFLOP/s/GPU")
        print("target: the 530B sweep's rate (2,000 configurations/s on 2 cores)")


if __name__ == "__main__":
    main()
