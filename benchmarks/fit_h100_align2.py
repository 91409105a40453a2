"""Fit :data:`dml2comm.cost.gemm.ALIGN2_RATE`: the main-loop rate, as a share of the aligned
kernels', of the 16-bit GEMMs whose row lengths are even but not multiples of 8 (cuBLAS runs
CUTLASS's ``..._align2`` tensor-core kernels for them; odd ones take the slower
``cutlass_75_..._s1688gemm`` fallback of :data:`~dml2comm.cost.gemm.UNALIGNED_RATE`).

    PYTHONPATH=. python benchmarks/fit_h100_align2.py

Data: BERT's masked-LM decoder (512 -> 30,522 words, even) in the bundled H100 traces of
``benchmarks/data/gpu_steps/`` (PROVENANCE.md there): its forward, data-gradient and weight-gradient
GEMMs, the only ``align2`` kernels of each step, at 8,192 and 16,384 tokens (the bf16 steps at
b = 64 and 128, s = 128); the AMP step at b = 64 is held out.  Fitted as ``UNALIGNED_RATE`` is
(:func:`~dml2comm.cost.gemm.fit_unaligned_rate`: the H100's shape law and sustained factor, the
rate minimising the squared log error), then each GEMM predicted.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np

from dml2comm.cost import gemm
from dml2comm.hardware.gpus import get_gpu

DATA = Path(__file__).resolve().parent / "data" / "gpu_steps"
FIT = {"h100_trace_bert-6l-512_bf16_b64_s128.json.gz": 8192, "h100_trace_bert-6l-512_bf16_b128_s128.json.gz": 16384}
HELD_OUT = {"h100_trace_bert-6l-512_amp_b64_s128.json.gz": 8192}
VOCAB, HIDDEN = 30522, 512


def gemms(file: str, tokens: int) -> list[tuple[tuple[int, int, int, int], float]]:
    """((b, M, N, K), seconds) of the trace's three align2 GEMMs, in launch order: forward, then
    (autograd's order) data gradient and weight gradient, told apart by CUTLASS's layout suffix
    (``tn`` forward, ``nn`` data gradient, ``nt`` weight gradient)."""
    events = json.load(gzip.open(DATA / file))["traceEvents"]
    shape = {"tn": (1, tokens, VOCAB, HIDDEN), "nn": (1, tokens, HIDDEN, VOCAB), "nt": (1, HIDDEN, VOCAB, tokens)}
    out = []
    for e in events:
        if e.get("cat") == "kernel" and "align2" in e["name"]:
            layout = e["name"].split("_align2")[0].rsplit("_", 1)[1]
            out.append((shape[layout], e["dur"] * 1e-6))
    return out


def predict(shape, rate: float) -> float:
    h100 = gemm.gemm_device(get_gpu("h100"))
    return float(gemm.analytical_times_s(*(np.array([v]) for v in shape), peak_flops_per_s=h100.peak("bf16"), sm_count=h100.sm_count,
                                         hbm_bytes_per_s=h100.hbm_bytes_per_s, in_bytes=2, out_bytes=2,
                                         sustained=gemm.SUSTAINED_FACTOR[h100.name] * rate, law=gemm.shape_law(h100), aligned=True)[0])


def main() -> None:
    h100 = get_gpu("h100")
    rows = [r for f, m in FIT.items() for r in gemms(f, m)]
    shapes = np.array([s for s, _ in rows], dtype=float)
    times = np.array([t for _, t in rows])
    rate = gemm.fit_unaligned_rate(h100, "bf16", shapes, times, law=gemm.shape_law(h100), sustained=gemm.SUSTAINED_FACTOR[h100.name])
    print(f"ALIGN2_RATE fitted on {len(rows)} GEMMs: {rate:.4f} (shipped {gemm.ALIGN2_RATE}; UNALIGNED_RATE {gemm.UNALIGNED_RATE})")
    for label, files in (("fitted", FIT), ("held out", HELD_OUT)):
        for f, m in files.items():
            for shape, t in gemms(f, m):
                p = predict(shape, gemm.ALIGN2_RATE)
                print(f"  {label:8s} {str(shape):28s} measured {t * 1e3:6.3f} ms  law {p * 1e3:6.3f} ms  {p / t - 1:+6.1%}"
                      f"  (at the odd rate {predict(shape, gemm.UNALIGNED_RATE) / t - 1:+.0%})")


if __name__ == "__main__":
    main()
