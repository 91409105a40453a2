"""Simulator speed (issue 6 targets): p = 64 with m = 512 micro-batches under 2 s; a 175B GPT
(zoo) on 1,536 GPUs, analysis plus simulation without the site, under 10 s.

    .venv/bin/python benchmarks/bench_sim.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository: tests/oracles.py's step lists

from dml2comm import zoo
from dml2comm.analysis import analyze_graph
from dml2comm.hardware.cluster import get_cluster
from dml2comm.ir.onnx_import import ImportOptions
from dml2comm.load import load_model_proto
from dml2comm.parallel.config import ParallelConfig
from dml2comm.sim.engine import DeviceWork, simulate
from tests.oracles import build_schedule  # the step lists simulate() also takes (the schedules step by step)


def main() -> None:
    for name, v in (("1f1b", 1), ("gpipe", 1), ("interleaved", 2)):
        schedule = build_schedule(name, 64, 512, v)
        work = [DeviceWork(1.0 / v, 2.0 / v, send_fwd_s=0.01, send_bwd_s=0.01, dp_buckets_s=(0.5,) * 8)] * 64
        start = time.perf_counter()
        result = simulate(schedule, work, v)
        print(f"p=64 m=512 {name:11s} v={v}: {time.perf_counter() - start:.2f} s for {len(result.events)} events (target < 2 s for 1f1b)")
    start = time.perf_counter()
    imported = load_model_proto(zoo.build_preset("gpt3-175b"), ImportOptions(batch_size=1))
    config = ParallelConfig(dp_size=12, tp_size=8, pp_size=16, micro_batch_size=1, global_batch_size=1536, seq_len=2048, recompute="full")
    analysis = analyze_graph(imported, config, get_cluster("dgx-a100", 1536), advise=False)
    print(f"GPT-3 175B on 1,536 A100s (t=8 p=16 d=12, m=128): import + analysis + simulation {time.perf_counter() - start:.2f} s "
          f"(target < 10 s); iteration {analysis.summary['iteration_time_s']:.2f} s, MFU {analysis.summary['mfu']:.1%}")


if __name__ == "__main__":
    main()
