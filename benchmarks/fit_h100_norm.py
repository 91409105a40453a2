"""Fit the eager LayerNorm/RMSNorm law (:mod:`dml2comm.cost.norm`) on the bundled H100 data and
print the evidence: the fitted constants, every shape's error, and the leave-one-shape-out errors.

    PYTHONPATH=. .venv/bin/python benchmarks/fit_h100_norm.py        (a few seconds)

Data (:func:`dml2comm.validate.h100_norm.measured_norms`): the five LayerNorm shapes of
``benchmarks/data/h100/kernels.json`` (forward kernel; backward kernels = forward+backward less
the forward and autograd's ``.grad`` adds), the first of them host-bound and its backward taken
from the GPT-2 trace, whose per-kernel medians this script reads again from
``benchmarks/data/h100/trace_gpt2-small_bf16_b8.json.gz`` and checks.

Forward: ``fwd_hbm_share`` and ``fwd_row_sm_s`` by least squares on relative errors (the law is
linear in their inverses).  Backward: ``grad_input_hbm_share``, ``gamma_beta_block_share`` and
``gamma_beta_hbm_share`` by a grid search on relative errors over the four queued backward figures
and the trace's two backward kernels (each kernel its own equation).
"""

from __future__ import annotations

import gzip
import json
import statistics
from pathlib import Path

import numpy as np

from dml2comm.cost import norm
from dml2comm.hardware.gpus import get_gpu
from dml2comm.validate.h100_norm import GPT2_TRACE_KERNELS_S, GPT2_TRACE_SHAPE, measured_norms

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT / "benchmarks" / "data" / "h100" / "trace_gpt2-small_bf16_b8.json.gz"
H100 = get_gpu("h100")
HBM, SMS, L2 = H100.hbm_bytes_per_s, H100.sm_count, H100.l2_bytes
KERNELS = {"forward": "vectorized_layer_norm_kernel", "grad_input": "layer_norm_grad_input_kernel",
           "gamma_beta": "GammaBetaBackwardCUDAKernel"}


def trace_kernels() -> dict[str, float]:
    """Median seconds of each LayerNorm kernel in the GPT-2 trace."""
    events = json.load(gzip.open(TRACE))["traceEvents"]
    out = {}
    for key, name in KERNELS.items():
        durs = [e["dur"] * 1e-6 for e in events if e.get("cat") == "kernel" and name in e["name"]]
        out[key] = statistics.median(durs)
    return out


def times(law: norm.EagerNormLaw, rows: int, width: int) -> tuple[float, float]:
    return norm.eager_norm_times_s(rows, width, 2, HBM, SMS, L2, law=law)


def gi_gb(law: norm.EagerNormLaw, rows: int, width: int) -> tuple[float, float]:
    """The backward's two kernels apart: grad-input, and gamma/beta by difference."""
    bwd = times(law, rows, width)[1]
    gi = 3 * rows * width * 2 / (HBM * law.grad_input_hbm_share)
    return gi, bwd - gi


def fit_forward(shapes) -> tuple[float, float]:
    """(fwd_hbm_share, fwd_row_sm_s): minimise sum ((bytes a + rows b) / t - 1)^2."""
    cols, y = [], []
    for s in shapes:
        resident = min(s.rows, norm.FORWARD_BLOCKS_PER_SM * SMS)
        reread = 1 if resident * s.width * 2 > L2 else 0
        cols.append((s.rows * s.width * 2 * (2 + reread) / HBM, s.rows / SMS))
        y.append(s.forward_s)
    a = np.array(cols) / np.array(y)[:, None]
    inv_share, row = np.linalg.lstsq(a, np.ones(len(y)), rcond=None)[0]
    return 1 / inv_share, row


def _terms(s) -> tuple[float, float, float]:
    """The backward law's pieces for one shape (:func:`dml2comm.cost.norm.eager_norm_times_s`,
    vectorised for the grid): grad-input bytes / HBM, gamma/beta bytes / HBM, and the share of
    the SMs the gamma/beta blocks fill (1 on the partial-sum path)."""
    n = s.rows * s.width
    split = norm.gamma_beta_split(s.rows, s.width, SMS)
    occupancy = 1e9 if split else min(-(-s.width // norm.GAMMA_BETA_COLUMNS), SMS) / SMS
    return 3 * n * 2 / HBM, 2 * n * 2 / HBM, occupancy


def fit(shapes) -> norm.EagerNormLaw:
    share, row = fit_forward(shapes)
    gi = np.arange(0.40, 1.0001, 0.002)[:, None, None]
    blk = np.arange(0.60, 2.5001, 0.005)[None, :, None]
    cap = np.arange(0.30, 1.0001, 0.002)[None, None, :]
    err = np.zeros(np.broadcast_shapes(gi.shape, blk.shape, cap.shape))
    for s in shapes:
        a, b, occ = _terms(s)
        grad_input, gamma_beta = a / gi, b / np.minimum(cap, blk * occ)
        if (s.rows, s.width) == GPT2_TRACE_SHAPE:
            err = err + (grad_input / GPT2_TRACE_KERNELS_S["grad_input"] - 1) ** 2 \
                + (gamma_beta / GPT2_TRACE_KERNELS_S["gamma_beta"] - 1) ** 2
        else:
            err = err + ((grad_input + gamma_beta) / s.backward_s - 1) ** 2
    i, j, k = np.unravel_index(np.argmin(err), err.shape)
    return norm.EagerNormLaw(float(share), float(row), float(gi[i, 0, 0]), float(blk[0, j, 0]), float(cap[0, 0, k]))


def report(law: norm.EagerNormLaw, shapes, label: str) -> None:
    print(label)
    for s in shapes:
        f, b = times(law, s.rows, s.width)
        print(f"  M={s.rows:6d} h={s.width:6d}  forward {s.forward_s * 1e6:6.1f} us model {f * 1e6:6.1f} ({f / s.forward_s - 1:+6.1%})"
              f"   backward kernels {s.backward_s * 1e6:6.1f} us model {b * 1e6:6.1f} ({b / s.backward_s - 1:+6.1%})  [{s.source}]")


def main() -> None:
    shapes = measured_norms()
    got = trace_kernels()
    print("GPT-2 trace LayerNorm kernels (median us):", {k: round(v * 1e6, 2) for k, v in got.items()},
          "bundled constants:", {k: round(v * 1e6, 2) for k, v in GPT2_TRACE_KERNELS_S.items()})
    law = fit(shapes)
    print("fitted:", law)
    print("shipped:", norm.H100_NORM_LAW)
    report(norm.H100_NORM_LAW, shapes, "shipped law, in sample:")
    gi, gb = gi_gb(norm.H100_NORM_LAW, *GPT2_TRACE_SHAPE)
    print(f"  trace kernels at {GPT2_TRACE_SHAPE}: grad-input {GPT2_TRACE_KERNELS_S['grad_input'] * 1e6:.1f} us model {gi * 1e6:.1f}, "
          f"gamma/beta {GPT2_TRACE_KERNELS_S['gamma_beta'] * 1e6:.1f} us model {gb * 1e6:.1f}")
    print("leave-one-shape-out (refit without the shape, predict it):")
    fe, be = [], []
    for i, s in enumerate(shapes):
        held = fit(shapes[:i] + shapes[i + 1:])
        f, b = times(held, s.rows, s.width)
        fe.append(f / s.forward_s - 1)
        be.append(b / s.backward_s - 1)
        print(f"  M={s.rows:6d} h={s.width:6d}  forward {fe[-1]:+6.1%}  backward {be[-1]:+6.1%}   ({held})")
    print(f"  worst |error|: forward {max(map(abs, fe)):.1%}, backward {max(map(abs, be)):.1%}")
    print("queued forward+backward as kernels.json times it (model + the .grad adds):")
    for s in shapes:
        f, b = times(norm.H100_NORM_LAW, s.rows, s.width)
        print(f"  M={s.rows:6d} h={s.width:6d}  measured {s.fwd_bwd_s * 1e6:6.1f} us  model {(f + b + s.extra_s) * 1e6:6.1f} us")


if __name__ == "__main__":
    main()
