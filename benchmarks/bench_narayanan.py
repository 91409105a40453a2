"""Predicted vs measured TFLOP/s per GPU on Narayanan et al. 2021 Table 1 (A100, V=51200,
s=2048, full recomputation, interleaved schedule).  TFLOP/s counts eq. (3)'s FLOPs, as the
paper does: F = 96 B s L h^2 (1 + s/(6h) + V/(16 L h)) per iteration.

This table is the compute model's only calibration target (the A100's sustained GEMM
factor in dml2comm/cost/gemm.py, fitted by benchmarks/fit_a100.py); ``bench_heldout.py`` checks other published runs without tuning.

The setup (Megatron-LM as the paper ran it: fp16, gradients all-reduced after the backward
pass, full recomputation, the interleaving rule and the recorded micro-batch sizes) lives in
:mod:`dml2comm.validate.narayanan`, which ``python main.py validate`` shares; see its docstring.
``--sweep`` re-runs the micro-batch sweep (fastest size in {1, 2, 4, 8} that fits) instead of
using the record ``MICRO_BATCH`` and reports any row where the record is stale (~4x as long).
``--sc21`` uses the authors' reproduction script's settings instead (``SC21``: micro-batch,
model chunks and PyTorch DDP's overlapped gradient all-reduce per row), a sensitivity check.

    .venv/bin/python benchmarks/bench_narayanan.py [--sweep | --sc21]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from dml2comm.validate.narayanan import (MICRO_BATCH, MICRO_BATCH_CANDIDATES, SC21, best_micro_batch,  # noqa: E402,F401
                                         model_chunks, predict, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--sweep", action="store_true", help="re-run the micro-batch sweep instead of using MICRO_BATCH")
    mode.add_argument("--sc21", action="store_true", help="the authors' examples/sc21/run_table_1.sh settings (SC21)")
    args = parser.parse_args()
    errors, stale = [], []
    print(f"{'model':24s} {'t':>2s} {'p':>3s} {'d':>3s} {'b':>2s} {'v':>2s} {'measured':>9s} {'predicted':>9s} {'error':>7s} {'s':>5s}")
    for name, m, par, measured in rows():
        start = time.perf_counter()
        if args.sweep:
            b, pred = best_micro_batch(m, par)
            if MICRO_BATCH.get(name) != b:
                stale.append(f"{name}: recorded {MICRO_BATCH.get(name)}, sweep {b}")
        elif args.sc21:
            b, v, ddp = SC21[name]
            pred, _ = predict(m, par, b, chunks=v, overlap_grad_reduce=ddp)
        else:
            b = MICRO_BATCH[name]
            pred, _ = predict(m, par, b)
        if not args.sc21:
            v = model_chunks(m["num_layers"], par["pipeline"], par["global_batch"] // (b * par["data_derived"]))
        err = pred / measured - 1
        errors.append(abs(err))
        print(f"{name:24s} {par['tensor']:2d} {par['pipeline']:3d} {par['data_derived']:3d} {b:2d} {v:2d} {measured:9.0f} "
              f"{pred:9.1f} {err:+7.1%} {time.perf_counter() - start:5.1f}")
        sys.stdout.flush()
    print(f"mean |error| {sum(errors) / len(errors):.1%}, worst {max(errors):.1%}")
    for line in stale:
        print(f"MICRO_BATCH is stale: {line}")


if __name__ == "__main__":
    main()
