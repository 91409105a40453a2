"""Compute time of one op and of the optimizer step on one GPU: a roofline with efficiencies.

time = max(FLOPs / (peak x e_gemm), bytes / (HBM bandwidth x e_hbm))  (Williams, Waterman,
Patterson, "Roofline", CACM 2009), where

- ``e_gemm`` applies to matrix multiplications (MatMul, Gemm, Conv as implicit GEMM) and
  depends on their shape and on the GPU: ``E_MAX x tile(M, N) x wave(M, N, batch, SMs)``,
  the two dimension-quantisation effects of NVIDIA's "Matrix Multiplication Background"
  guide (Deep Learning Performance documentation, Sec. 3): the output is cut into 256 x 128
  tiles; ``tile`` is the share of the launched tiles' area that is inside the output
  (``M N / (ceil(M/256) 256 ceil(N/128) 128)``, Sec. 3.1), and ``wave`` the share of the last
  wave of tiles that is used, one tile per SM at a time (``tiles / (ceil(tiles/SMs) SMs)``,
  Sec. 3.2).  ``E_MAX``, the share of peak a large, well-shaped GEMM reaches in training
  (``GEMM_E_MAX``), is the one fitted parameter.  A short-K penalty ``K / (K + K0)`` was tried
  is left out (an earlier fit chose K0 = 0).
- ``e_hbm`` applies to memory-bound ops: the share of the HBM bandwidth a streaming kernel
  reaches (STREAM-like copies on A100 reach about 1.7-1.8 of 2.04 TB/s).
- Point-wise chains run as fused kernels (Megatron-LM's fused bias-GeLU, bias-dropout-add and
  scale-mask-softmax; the attention dropout after the softmax is its own kernel): see
  ``fused_kernels`` and ``fuse_pointwise`` in :mod:`dml2comm.cost.ops`.

Calibration: Narayanan et al. 2021 Table 1 (A100, ten GPT runs from 1.7B to 1T parameters;
``benchmarks/bench_narayanan.py`` prints every row, all within 5%), checked on held-out runs
by ``benchmarks/bench_heldout.py``.
"""

from __future__ import annotations

from dml2comm.ops.registry import OpCost

__all__ = ["roofline_s", "op_times_s", "optimizer_bytes_per_param", "optimizer_step_s", "gemm_efficiency", "gemm_dims",
           "SM_COUNT", "GEMM_E_MAX", "HBM_EFFICIENCY"]

#: Streaming multiprocessors (compute units) per GPU, from the vendors' architecture
#: whitepapers: A100 108 (NVIDIA A100 Tensor Core GPU Architecture, 2020), H100 SXM5 and H200 132
#: (NVIDIA H100 Tensor Core GPU Architecture, 2022; H200 is the same GH100 configuration),
#: V100 80 (NVIDIA Tesla V100 GPU Architecture, 2017), RTX A6000 84 (NVIDIA Ampere GA102 GPU
#: Architecture, 2021), L40S 142 (NVIDIA ADA GPU Architecture, 2023), MI300X 304 CUs (AMD
#: CDNA 3 Architecture white paper, 2023).
SM_COUNT = {
    "A100-SXM4-80GB": 108, "A100-SXM4-40GB": 108, "H100-SXM5-80GB": 132, "H200-SXM-141GB": 132,
    "V100-SXM2-32GB": 80, "RTX-A6000": 84, "L40S": 142, "MI300X": 304,
}
#: Output tile of a large GEMM kernel (NVIDIA "Matrix Multiplication Background", Sec. 2.3 and
#: 3: cuBLAS's most efficient A100 tensor-core tile, 256 x 128).
TILE_M, TILE_N = 256, 128
#: Share of the dense peak a large, well-shaped GEMM reaches inside a training step, the one
#: fitted parameter: fitted to Narayanan et al. 2021 Table 1 and nothing else
#: (benchmarks/bench_narayanan.py prints every row: all ten within 5%).  For scale: cuBLAS
#: FP16/BF16 GEMMs of a few thousand per side reach about 230-260 of 312 TFLOP/s on A100 when
#: timed alone (0.74-0.83); back-to-back in a training step, with sustained clocks often below
#: the 1.41 GHz boost clock the peak assumes (400 W power limit), the share is a little lower.
GEMM_E_MAX = 0.685  # refitted when fused kernels stopped spanning blocks (was 0.68)
#: Achieved share of HBM bandwidth for streaming kernels (STREAM-like copies on A100 reach
#: about 1.7-1.8 TB/s of 2.04 TB/s; e.g. the "GPU-STREAM"/BabelStream A100 results).
HBM_EFFICIENCY = 0.85


def roofline_s(flops: float, bytes_moved: float, peak_flops_per_s: float, hbm_bytes_per_s: float) -> float:
    """max(flops / peak, bytes / bandwidth) in seconds."""
    return max(flops / peak_flops_per_s if peak_flops_per_s else 0.0, bytes_moved / hbm_bytes_per_s if hbm_bytes_per_s else 0.0)


def op_times_s(cost: OpCost, peak_flops_per_s: float, hbm_bytes_per_s: float, gemm_eff: float = 1.0,
               hbm_eff: float = 1.0) -> tuple[float, float]:
    """(forward, backward) seconds of one op for one micro-batch."""
    peak = peak_flops_per_s * gemm_eff
    hbm = hbm_bytes_per_s * hbm_eff
    return (roofline_s(cost.flops_fwd, cost.bytes_fwd, peak, hbm), roofline_s(cost.flops_bwd, cost.bytes_bwd, peak, hbm))


def gemm_dims(op_type: str, inputs, attrs, outputs=()) -> tuple[int, int, int, int] | None:
    """(batch, M, N, K) of a MatMul / Gemm / Conv (implicit GEMM) from its local input shapes."""
    import math

    if op_type == "MatMul" and len(inputs) >= 2 and inputs[0] is not None and inputs[1] is not None:
        a, b = inputs[0].shape, inputs[1].shape
        if len(a) < 1 or len(b) < 1:
            return None
        a2 = a if len(a) >= 2 else (1,) + a
        b2 = b if len(b) >= 2 else b + (1,)
        batch = max(math.prod(a2[:-2]), math.prod(b2[:-2]))
        return batch, a2[-2], b2[-1], a2[-1]
    if op_type == "Gemm" and len(inputs) >= 2 and inputs[0] is not None and inputs[1] is not None:
        a, b = inputs[0].shape, inputs[1].shape
        m, k = (a[1], a[0]) if attrs.get("transA", 0) else (a[0], a[1])
        n = b[0] if attrs.get("transB", 0) else b[1]
        return 1, m, n, k
    if op_type == "Conv" and len(inputs) >= 2 and inputs[0] is not None and inputs[1] is not None:
        x, w = inputs[0].shape, inputs[1].shape
        if len(x) < 3 or len(w) < 3:
            return None
        group = int(attrs.get("group", 1))
        y = outputs[0].shape if outputs and outputs[0] is not None else x
        return group, x[0] * math.prod(y[2:]), w[0] // group, w[1] * math.prod(w[2:])
    return None


def gemm_efficiency(batch: int, m: int, n: int, k: int, sms: int, e_max: float = GEMM_E_MAX) -> float:
    """Share of peak a GEMM of this shape reaches: ``e_max x tile x wave`` (module docstring);
    ``k`` does not enter."""
    rows, cols = -(-m // TILE_M), -(-n // TILE_N)
    tile = (m * n) / (rows * TILE_M * cols * TILE_N) if rows and cols else 1.0
    tiles = batch * rows * cols
    waves = -(-tiles // sms)
    wave = tiles / (waves * sms) if waves else 1.0
    return e_max * tile * wave


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
