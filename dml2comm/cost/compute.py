"""Compute time of one op and of the optimizer step on one GPU: the roofline model.

time = max(FLOPs / peak FLOP/s, bytes / HBM bytes/s)  (Williams, Waterman, Patterson,
"Roofline", CACM 2009).  Peak is the GPU preset's dense tensor-core rate for the training
dtype; no achieved-efficiency factor is applied yet, so this is a lower bound on time (the
iteration-simulator issue adds shape-dependent GEMM efficiency calibrated on Narayanan et
al. 2021 Table 1).  The analysis records that assumption in ``warnings``.
"""

from __future__ import annotations

from dml2comm.ops.registry import OpCost

__all__ = ["roofline_s", "op_times_s", "optimizer_bytes_per_param", "optimizer_step_s"]


def roofline_s(flops: float, bytes_moved: float, peak_flops_per_s: float, hbm_bytes_per_s: float) -> float:
    """max(flops / peak, bytes / bandwidth) in seconds."""
    return max(flops / peak_flops_per_s if peak_flops_per_s else 0.0, bytes_moved / hbm_bytes_per_s if hbm_bytes_per_s else 0.0)


def op_times_s(cost: OpCost, peak_flops_per_s: float, hbm_bytes_per_s: float) -> tuple[float, float]:
    """(forward, backward) seconds of one op for one micro-batch."""
    return (
        roofline_s(cost.flops_fwd, cost.bytes_fwd, peak_flops_per_s, hbm_bytes_per_s),
        roofline_s(cost.flops_bwd, cost.bytes_bwd, peak_flops_per_s, hbm_bytes_per_s),
    )


def optimizer_bytes_per_param(optimizer: str, dtype_bytes: int) -> int:
    """HBM bytes the optimizer step moves per (locally held) parameter.

    Adam/AdamW with mixed precision (Kingma & Ba 2015, Alg. 1; state layout of Rajbhandari et
    al. 2020, Sec. 3.1, K = 12): read the gradient (``dtype_bytes``) and the fp32 master
    weight, momentum and variance (12), write those three back (12) and the 16-bit weight
    copy (``dtype_bytes``).  In fp32 training there is no separate copy: 4 + 12 + 12.
    SGD with momentum: gradient + master weight and momentum read (8) and written (8), plus
    the 16-bit copy.
    """
    copy = dtype_bytes if dtype_bytes < 4 else 0
    grad = dtype_bytes
    if optimizer in ("adam", "adamw"):
        return grad + 12 + 12 + copy
    return grad + 8 + 8 + copy


def optimizer_step_s(params_local: float, optimizer: str, dtype_bytes: int, hbm_bytes_per_s: float) -> float:
    """Memory-bound optimizer step for ``params_local`` parameters on one GPU."""
    return params_local * optimizer_bytes_per_param(optimizer, dtype_bytes) / hbm_bytes_per_s
