"""Held-out check of the compute model: predicted vs published TFLOP/s per GPU on published A100
runs that were NOT used to calibrate it (benchmarks/data/heldout_runs.json, each run with its
source).  Nothing is tuned to these numbers; the calibration is bench_narayanan.py (Table 1).

Runs: Narayanan et al. 2021 Table 2, PTD-P rows (GPT-3 175B on 384/768/1536 GPUs and the
529.6B model on 560/1120/2240 GPUs, micro-batch size 1 as published).  They are costed with
bench_narayanan.py's Megatron-LM 2021 setup (fp16 with fp16 gradient all-reduce after the
backward pass, full recomputation, interleaved schedule with the fewest chunks that split the
stage evenly), t = 8 and p = model-parallel size / 8 (the paper's heuristic; Table 2 gives the
model-parallel size only).  TFLOP/s counts the paper's eq. (3).

    .venv/bin/python benchmarks/bench_heldout.py
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_narayanan import model_chunks, predict  # noqa: E402

RUNS = Path(__file__).resolve().parent / "data" / "heldout_runs.json"


def runs():
    for r in json.loads(RUNS.read_text())["runs"]:
        yield r["id"], r["model"], r["parallelism"], r["measured"]["tflops_per_gpu"]


def main() -> None:
    errors = []
    print(f"{'run':36s} {'t':>2s} {'p':>3s} {'d':>3s} {'b':>2s} {'v':>2s} {'published':>9s} {'predicted':>9s} {'error':>7s} {'s':>5s}")
    for name, m, par, published in runs():
        start = time.perf_counter()
        b = par["micro_batch"]
        pred, _ = predict(m, par, b)
        v = model_chunks(m["num_layers"], par["pipeline"], par["global_batch"] // (b * par["data_derived"]))
        err = pred / published - 1
        errors.append(abs(err))
        print(f"{name:36s} {par['tensor']:2d} {par['pipeline']:3d} {par['data_derived']:3d} {b:2d} {v:2d} {published:9.0f} "
              f"{pred:9.1f} {err:+7.1%} {time.perf_counter() - start:5.1f}")
        sys.stdout.flush()
    print(f"mean |error| {sum(errors) / len(errors):.1%}, worst {max(errors):.1%}")


if __name__ == "__main__":
    main()
