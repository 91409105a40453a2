"""Speed of the configuration sweep: configurations evaluated per second.

Model: the zoo 530B GPT shape (105 blocks, hidden 20480, 128 heads, vocab 51200, s = 2048),
global batch 2240 on 2,240 A100s (``dgx-a100``), as Narayanan et al. 2021 (Table 1: the paper's
run is t=8, p=35, d=8).  The full default space: every valid d, t, p, micro-batch 1/2/4/8,
virtual stages 1/2/4, ZeRO 0/1, recomputation none/selective/full, SP on/off (4,686
configurations), through :func:`dml2comm.search.sweep.run_sweep` with the fast path
(:mod:`dml2comm.model`; the model's 105 identical blocks collapsed to four by
:mod:`dml2comm.ir.repeats`), with 1 and ``--workers`` processes.  The rate counts the whole
call: the first import of the model, the collapsed imports of the other micro-batch sizes,
forking the workers, evaluation and ranking.  Each run is a fresh process with the modules
imported and no caches warmed (:mod:`fresh`), as a command-line sweep starts.

Target (issue 7): 2,000 configurations/s on 2 cores.  Prints the best configuration found
beside the paper's choice at its best micro-batch and recomputation.

    .venv/bin/python benchmarks/bench_sweep.py [--workers 2] [--limit N]
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

GPUS = 2240
GLOBAL_BATCH = 2240


def _builder(num_gpus: int):
    return dataclasses.replace(get_cluster("dgx-a100", num_gpus), collective_overhead_s=0.0)


def _describe(row) -> str:
    c = row["config"]
    return (f"d={c['d']} t={c['t']} p={c['p']} b={c['micro_batch_size']} v={c['virtual_stages']} zero={c['zero_stage']} "
            f"recompute={c['recompute']} sp={int(c['sequence_parallel'])}: {row['iteration_time_s']:.2f} s, "
            f"{row['tflops_per_gpu']:.0f} TFLOP/s/GPU, {row['peak_memory_bytes'] / 2**30:.1f} GiB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2, help="processes for the parallel run (default 2)")
    parser.add_argument("--limit", type=int, default=None, help="only the first N configurations")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "gpt530b.onnx"
        zoo.save(zoo.build_gpt(layers=105, hidden=20480, heads=128, vocab=51200, seq_len=2048), path)
        space = SweepSpace(global_batch_size=GLOBAL_BATCH, constraints=Constraints())
        result = None
        for workers in sorted({1, args.workers}):
            def measure(workers=workers):
                start = time.perf_counter()
                sweep = run_sweep(str(path), GPUS, _builder, space, workers=workers, limit=args.limit)
                return time.perf_counter() - start, sweep

            wall, result = in_fresh_process(measure)  # no caches warmed by the run before
            print(f"530B sweep: {len(result.rows)} of {result.num_configs} configurations, {workers} worker(s): "
                  f"{wall:.2f} s, {len(result.rows) / wall:.0f} configurations/s "
                  f"({sum(r['fits'] for r in result.rows)} fit in 80 GB)")
        assert result is not None
        paper = [r for r in result.rows if r["fits"] and r["config"]["t"] == 8 and r["config"]["p"] == 35]
        if paper:
            print("paper's t=8 p=35 at its best", _describe(min(paper, key=lambda r: r["iteration_time_s"])),
                  "(paper: 163 TFLOP/s/GPU)")
        if result.best is not None:
            print("best found                  ", _describe(result.best))
        print("target: 2,000 configurations/s on 2 cores")


if __name__ == "__main__":
    main()
