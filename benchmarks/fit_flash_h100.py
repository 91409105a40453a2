"""Fit the flash-attention throughput law (``H100_FLASH`` in dml2comm/cost/attention.py) on the
bundled H100 SDPA measurements, and print in-sample and leave-one-shape-out errors.

    PYTHONPATH=. .venv/bin/python benchmarks/fit_flash_h100.py

Data: ``benchmarks/data/h100/kernels.json`` (a byte-for-byte copy of
shared/data/gpu_measured/h100/kernels.json, measured by shared/tools/measure_gpu.py on one H100
80GB HBM3, PyTorch 2.11, cuDNN 9.19), its ``attn`` rows: ``F.scaled_dot_product_attention(q, k,
v, is_causal=True)`` in bf16 on ``[b, heads, s, d]``; ``fwd_s`` from a CUDA graph,
``fwd_bwd_s`` from 20 queued calls of ``o = sdpa(q, k, v); o.backward(go)``.

Two properties of the measurement, both handled here, not in the tool:

- the first row's ``fwd_bwd_s`` includes a one-time warm-up (PROVENANCE.md): left out;
- ``o.backward(go)`` is never preceded by zeroing the gradients, so after the 3 warm-up calls
  every timed call also accumulates dQ, dK and dV into ``q.grad``, ``k.grad``, ``v.grad``
  (``AccumulateGrad``: three element-wise adds, each reading two bf16 tensors of ``b h s d``
  and writing one).  The law's backward is fitted on ``fwd_bwd_s - fwd_s - accumulation``, the
  accumulation timed at the tool's memory-bound rate (H100 HBM 3.35 TB/s x 0.85); without it the
  b = 16 row's backward would read 388 us, while the GPT-2 trace (12 layers of the b = 8 shape)
  shows 154 us per layer, half of the 308 us the correction leaves.

Fit (per pass, least squares on relative errors): ``d0`` on a grid of 0.5, the other two
constants linear given ``d0``: forward ``t = t0 + W/(peak e_max) (d + d0)/d``, backward
``t = beta (b h s d)/HBM + 2.5 W/(peak e_max) (d + d0)/d``, ``W`` the causal FLOPs times
``1 + B/s`` (:mod:`dml2comm.cost.attention`).  Every error printed is of the tool's own
:func:`~dml2comm.cost.attention.flash_times_s` with the fitted constants.  Leave-one-out refits
both passes without the shape it then predicts.  An independent check: the bundled GPT-2 small
trace (trace_gpt2-small_bf16_b8.json.gz, b = 8, 12 heads, s = 1024, d = 64: the kernels.json
first row's shape) ran its forward flash kernel in 47.0 us and its backward (preprocessing,
main kernel, dQ conversion) in 154 us per layer.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from dml2comm.cost.attention import BACKWARD_FLOP_RATIO, FLASH_BLOCK, H100_FLASH, FlashLaw, FlashShape, flash_cost, flash_times_s
from dml2comm.cost.compute import HBM_EFFICIENCY
from dml2comm.hardware.gpus import get_gpu
from dml2comm.ir.graph import DType

DATA = Path(__file__).resolve().parent / "data" / "h100" / "kernels.json"
GPU = get_gpu("h100")
PEAK = GPU.peak_flops("bf16")
HBM = GPU.hbm_bytes_per_s * HBM_EFFICIENCY
D0_GRID = np.arange(0.0, 300.0, 0.5)
#: The GPT-2 small trace's flash kernels per layer (b=8, 12 heads, s=1024, d=64), seconds.
TRACE_GPT2 = (FlashShape(96, 1024, 1024, 64, 64), 47.0e-6, 154.0e-6)


def rows() -> list[dict]:
    return json.loads(DATA.read_text())["attn"]


def shape_of(r: dict) -> FlashShape:
    return FlashShape(r["b"] * r["heads"], r["seq"], r["seq"], r["head_dim"], r["head_dim"])


def accumulation_s(r: dict) -> float:
    """The measurement's AccumulateGrad adds: 3 tensors x (read 2 + write 1) x b h s d x 2 bytes."""
    s = shape_of(r)
    return 3 * 3 * s.bh * s.s_q * s.d * 2 / HBM


def measured_bwd_s(r: dict) -> float:
    return r["fwd_bwd_s"] - r["fwd_s"] - accumulation_s(r)


def _work(r: dict) -> float:
    s = shape_of(r)
    return flash_cost(s, r["causal"], DType.BFLOAT16).flops_fwd * ((1 + FLASH_BLOCK / s.s_k) if r["causal"] else 1.0)


def _fit_pass(rs: list[dict], forward: bool) -> tuple[float, float, float]:
    """(first constant, e_max, d0) of one pass: t0 for the forward, beta for the backward."""
    best = None
    for d0 in D0_GRID:
        a, y = [], []
        for r in rs:
            s = shape_of(r)
            t = r["fwd_s"] if forward else measured_bwd_s(r)
            compute = (1.0 if forward else BACKWARD_FLOP_RATIO) * _work(r) * (s.d + d0) / s.d / PEAK
            first = 1.0 if forward else s.bh * s.s_q * s.d / HBM
            a.append([first / t, compute / t])
            y.append(1.0)
        c, *_ = np.linalg.lstsq(np.array(a), np.array(y), rcond=None)
        loss = float(np.sum(np.square(np.array(a) @ c - 1.0)))
        if best is None or loss < best[0]:
            best = (loss, float(c[0]), 1.0 / float(c[1]), float(d0))
    return best[1], best[2], best[3]


def predict(law: FlashLaw, r: dict) -> tuple[float, float]:
    s = shape_of(r)
    return flash_times_s(s, r["causal"], flash_cost(s, r["causal"], DType.BFLOAT16), PEAK, HBM, law)


def errors(law_of, rs: list[dict], bwd_rows: list[dict]) -> tuple[list[float], list[float], list[float]]:
    """Per row: forward, backward and forward+backward (as measured: + the accumulation) errors;
    ``law_of(r)`` gives the law that predicts row ``r``."""
    fwd, bwd, both = [], [], []
    for r in rs:
        f, _ = predict(law_of(r), r)
        fwd.append(f / r["fwd_s"] - 1)
    for r in bwd_rows:
        f, b = predict(law_of(r), r)
        bwd.append(b / measured_bwd_s(r) - 1)
        both.append((f + b + accumulation_s(r)) / r["fwd_bwd_s"] - 1)
    return fwd, bwd, both


def main() -> int:
    rs = rows()
    bwd_rows = rs[1:]  # the first row's forward+backward includes a warm-up (PROVENANCE.md)
    t0, ef, d0f = _fit_pass(rs, True)
    beta, eb, d0b = _fit_pass(bwd_rows, False)
    law = FlashLaw(t0, ef, d0f, beta, eb, d0b)
    print(f"fitted: t0 = {t0 * 1e6:.2f} us, forward e_max = {ef:.3f}, d0 = {d0f:.1f}; "
          f"backward beta = {beta:.1f} B/element, e_max = {eb:.3f}, d0 = {d0b:.1f}")
    print(f"shipped: {H100_FLASH}")

    def loo_law(r: dict) -> FlashLaw:
        others = [x for x in rs if x is not r]
        a, e1, d1 = _fit_pass(others, True)
        b, e2, d2 = _fit_pass([x for x in bwd_rows if x is not r], False)
        return FlashLaw(a, e1, d1, b, e2, d2)

    cache: dict[int, FlashLaw] = {}
    loo = lambda r: cache.setdefault(id(r), loo_law(r))  # noqa: E731
    for name, law_of in (("fitted", lambda r: law), ("shipped", lambda r: H100_FLASH), ("leave-one-out", loo)):
        f, b, fb = errors(law_of, rs, bwd_rows)
        med = lambda e: 100 * float(np.median(np.abs(e)))  # noqa: E731
        print(f"{name:>14}: median |error| forward {med(f):.1f}% (max {100 * max(map(abs, f)):.1f}%), "
              f"backward {med(b):.1f}%, forward+backward {med(fb):.1f}% (max {100 * max(map(abs, fb)):.1f}%)")
    print("\n   b heads    s   d | fwd meas   pred  LOO err | f+b meas   pred  LOO err")
    for r in rs:
        f, b = predict(H100_FLASH, r)
        lf, lb = predict(loo(r), r)
        line = (f"{r['b']:4d} {r['heads']:5d} {r['seq']:4d} {r['head_dim']:3d} | {r['fwd_s'] * 1e6:7.1f} {f * 1e6:6.1f} "
                f"{100 * (lf / r['fwd_s'] - 1):+6.1f}%")
        if r is not rs[0]:
            meas, pred = r["fwd_bwd_s"], f + b + accumulation_s(r)
            line += f" | {meas * 1e6:7.1f} {pred * 1e6:6.1f} {100 * ((lf + lb + accumulation_s(r)) / meas - 1):+6.1f}%"
        else:
            line += " |  (warm-up: not used)"
        print(line)
    shape, tf, tb = TRACE_GPT2
    f, b = flash_times_s(shape, True, flash_cost(shape, True, DType.BFLOAT16), PEAK, HBM, H100_FLASH)
    print(f"\nGPT-2 small trace, per layer: forward {f * 1e6:.1f} us (trace {tf * 1e6:.1f}), "
          f"backward {b * 1e6:.1f} us (trace {tb * 1e6:.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
