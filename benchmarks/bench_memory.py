"""Time the memory model adds to the analysis (issue 5 target: under 1 s for the zoo Llama-70B
shape at d=16 t=8 p=8), and print the per-stage breakdown it produces.

    .venv/bin/python benchmarks/bench_memory.py
"""

from __future__ import annotations

import time

import dml2comm.analysis as analysis
from dml2comm import zoo
from dml2comm.hardware.cluster import make_cluster
from dml2comm.ir.onnx_import import ImportOptions
from dml2comm.load import load_model_proto
from dml2comm.parallel.config import ParallelConfig


def main() -> None:
    imported = load_model_proto(zoo.build_preset("llama2-70b"), ImportOptions(batch_size=1))
    config = ParallelConfig(dp_size=16, tp_size=8, pp_size=8, micro_batch_size=1, global_batch_size=1024)
    cluster = make_cluster("a100", 1024)
    analysis.analyze_graph(imported, config, cluster)  # warm up
    spent = [0.0]

    def timed(fn):
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[0] += time.perf_counter() - start
        return wrapper

    originals = analysis.ActivationModel, analysis._stage_memory
    analysis.ActivationModel, analysis._stage_memory = timed(originals[0]), timed(originals[1])
    try:
        start = time.perf_counter()
        result = analysis.analyze_graph(imported, config, cluster)
        total = time.perf_counter() - start
    finally:
        analysis.ActivationModel, analysis._stage_memory = originals
    print(f"zoo Llama-70B, d=16 t=8 p=8: analysis {total:.3f} s, of which memory model {spent[0]:.3f} s (target < 1 s)")
    for st in result.stages:
        m = st.memory
        print(f"  stage {st.index}: states {(m['weights_bytes'] + m['grads_bytes'] + m['optimizer_bytes']) / 1e9:6.2f} GB, "
              f"activations {m['activations_bytes'] / 1e9:6.2f} GB ({m['in_flight_micro_batches']:.0f} in flight), "
              f"total {m['total_bytes'] / 1e9:6.2f} GB")
    print(f"  peak {result.memory['peak_bytes'] / 1e9:.2f} GB of {result.memory['capacity_bytes'] / 1e9:.0f} GB: "
          f"{'fits' if result.memory['fits'] else 'does not fit'}")


if __name__ == "__main__":
    main()
