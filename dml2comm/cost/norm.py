"""Eager PyTorch's LayerNorm and RMSNorm kernels on CUDA: a time law from their launch structure.

``--stack pytorch`` runs ``F.layer_norm`` (and ``F.rms_norm``, ``aten::_fused_rms_norm``, the same
kernels with their ``rms_norm`` template flag) as the kernels of PyTorch's
``aten/src/ATen/native/cuda/layer_norm_kernel.cu``; the bundled H100 trace of GPT-2 small
(``benchmarks/data/h100/trace_gpt2-small_bf16_b8.json.gz``) shows exactly these per LayerNorm:

- forward, ``vectorized_layer_norm_kernel``: one block of 4 warps (``num_threads()``, 128 threads)
  per row; each block reads its row twice (Welford statistics, then the normalised output: the
  second read hits the cache while the rows resident on the GPU fit in L2) and writes the output.
  Time = bytes / (HBM x :attr:`EagerNormLaw.fwd_hbm_share`) + rows x
  :attr:`EagerNormLaw.fwd_row_sm_s` / SMs (a per-block cost: the block reduction and its
  ``__syncthreads``), with the row read twice from HBM when ``min(rows, 16 x SMs)`` rows (16
  such blocks fill an SM's 2,048 threads, CUDA C Programming Guide, compute capability 8.x/9.0)
  exceed the L2 (:attr:`dml2comm.hardware.gpus.GPU.l2_bytes`; a GPU whose L2 is unknown is
  taken never to spill).
- backward, two kernels (``LayerNormBackwardKernelImplInternal``):
  ``layer_norm_grad_input_kernel_vectorized`` (one block per row: reads ``dY`` and ``X``, writes
  ``dX``) at :attr:`EagerNormLaw.grad_input_hbm_share` of the HBM bandwidth, and
  ``GammaBetaBackwardCUDAKernelTemplate`` (``LaunchGammaBetaBackwardCUDAKernel``): the column sums
  ``dgamma = sum_rows dY x_hat``, ``dbeta = sum_rows dY`` with fp32 accumulators in one
  ``32 x 32`` block per 32 columns (``blocks.x = ceil(N / 32)``, ``blocks.y = 1``), each block
  walking all ``M`` rows.  GPT-2's width 768 gives 24 blocks on 132 SMs: the kernel streams at
  one block's rate (:attr:`EagerNormLaw.gamma_beta_block_share` of an SM's share of the
  bandwidth) times the blocks, up to :attr:`EagerNormLaw.gamma_beta_hbm_share` of the HBM
  bandwidth.  When ``M > 65,536`` and ``N / 32 < SMs / 2`` PyTorch splits the rows instead
  (``blocks.y = min(32768 / blocks.x, ceil(M / 32))`` blocks of 32 rows writing partial sums,
  then ``.sum(0)`` per output: two more kernels, one for RMSNorm).

The constants are fitted by ``benchmarks/fit_h100_norm.py`` on the bundled H100 LayerNorm
measurements only (``benchmarks/data/h100/kernels.json``'s ``misc`` rows: forward from CUDA graphs,
forward+backward from queued calls; and the three LayerNorm kernels of the GPT-2 trace); that
script prints the fit and its leave-one-shape-out errors.  Megatron-LM's stack runs Apex's or
Transformer Engine's fused LayerNorm and keeps the roofline (:mod:`dml2comm.cost.compute`).
"""

from __future__ import annotations

import math
from typing import NamedTuple


__all__ = ["EagerNormLaw", "H100_NORM_LAW", "EAGER_NORM_OPS", "RMS_NORM_OPS", "eager_norm_times_s",
           "eager_norm_kernels", "gamma_beta_split", "op_norm_times_s"]

#: ONNX ops eager PyTorch runs as ``layer_norm_kernel.cu``'s kernels: ``F.layer_norm`` and
#: ``F.rms_norm`` (``aten::_fused_rms_norm``, PyTorch pull request #153666, 2025).
RMS_NORM_OPS = frozenset({"RMSNormalization", "SimplifiedLayerNormalization"})
EAGER_NORM_OPS = frozenset({"LayerNormalization"}) | RMS_NORM_OPS

#: ``layer_norm_kernel.cu``: ``block_dim_x = 32`` columns per GammaBeta block (CUDA), the
#: partial-sum path's row threshold ``M > 64 * 1024``, its ``rows_per_block_y = 32`` and
#: ``max_grid_size = 64 * 1024 / 2``.
GAMMA_BETA_COLUMNS = 32
PARTIAL_MIN_ROWS = 64 * 1024
PARTIAL_ROWS_PER_BLOCK = 32
PARTIAL_MAX_GRID = 64 * 1024 // 2
#: Forward blocks resident per SM: 2,048 threads per SM (CUDA C Programming Guide, "Technical
#: Specifications per Compute Capability", 8.0 and 9.0) / 128 threads per block.
FORWARD_BLOCKS_PER_SM = 16

class EagerNormLaw(NamedTuple):
    """Rates of the eager LayerNorm/RMSNorm kernels as shares of the GPU's HBM bandwidth (module
    docstring); fitted by ``benchmarks/fit_h100_norm.py``."""

    fwd_hbm_share: float
    fwd_row_sm_s: float
    grad_input_hbm_share: float
    gamma_beta_block_share: float
    gamma_beta_hbm_share: float


#: Fitted on the H100 (``benchmarks/fit_h100_norm.py``, data in the module docstring), used for
#: every GPU with an SM count: the launch structure is the same on sm_70 to sm_90.
H100_NORM_LAW = EagerNormLaw(
    fwd_hbm_share=0.795,
    fwd_row_sm_s=1.43e-7,
    grad_input_hbm_share=0.662,
    gamma_beta_block_share=1.175,
    gamma_beta_hbm_share=0.452,
)


def gamma_beta_split(rows: int, width: int, sm_count: int) -> int:
    """``blocks.y`` of PyTorch's partial-sum GammaBeta path, 0 where it takes the one-kernel path
    (``LaunchGammaBetaBackwardCUDAKernel``)."""
    bx = math.ceil(width / GAMMA_BETA_COLUMNS)
    if rows > PARTIAL_MIN_ROWS and width // GAMMA_BETA_COLUMNS < sm_count // 2:
        return min(PARTIAL_MAX_GRID // bx, math.ceil(rows / PARTIAL_ROWS_PER_BLOCK))
    return 0


def eager_norm_kernels(rows: int, width: int, sm_count: int, rms: bool) -> tuple[int, int]:
    """(forward, backward) kernels of one eager LayerNorm/RMSNorm with weight gradients."""
    split = gamma_beta_split(rows, width, sm_count) > 0
    return 1, 2 + ((1 if rms else 2) if split else 0)


def eager_norm_times_s(rows: int, width: int, itemsize: int, hbm_bytes_per_s: float, sm_count: int, l2_bytes: float,
                       rms: bool = False, law: EagerNormLaw = H100_NORM_LAW) -> tuple[float, float]:
    """(forward, backward) seconds of ``F.layer_norm`` / ``F.rms_norm`` over ``rows`` rows of
    ``width`` elements of ``itemsize`` bytes (module docstring)."""
    n = rows * width
    resident = min(rows, FORWARD_BLOCKS_PER_SM * sm_count)
    reread = 1 if resident * width * itemsize > l2_bytes else 0
    fwd = n * itemsize * (2 + reread) / (hbm_bytes_per_s * law.fwd_hbm_share) + rows * law.fwd_row_sm_s / sm_count
    grad_input = 3 * n * itemsize / (hbm_bytes_per_s * law.grad_input_hbm_share)
    full = hbm_bytes_per_s * law.gamma_beta_hbm_share
    split = gamma_beta_split(rows, width, sm_count)
    if split:
        partials = (1 if rms else 2) * split * width * itemsize
        gamma_beta = (2 * n * itemsize + 2 * partials) / full
    else:
        blocks = min(math.ceil(width / GAMMA_BETA_COLUMNS), sm_count)
        rate = min(full, law.gamma_beta_block_share * blocks * hbm_bytes_per_s / sm_count)
        gamma_beta = 2 * n * itemsize / rate
    return fwd, grad_input + gamma_beta


def op_norm_times_s(op_type: str, axis: int, x_shape: tuple[int, ...], itemsize: int, gpu,
                    hbm_bytes_per_s: float) -> tuple[tuple[float, float], int] | None:
    """An eager LayerNorm/RMSNorm op's (forward, backward) seconds on ``gpu`` and its extra
    backward kernels beyond one (:func:`eager_norm_kernels`), or None where the law does not
    apply (another op type, no SM count, an unknown shape)."""
    if op_type not in EAGER_NORM_OPS or not gpu.sm_count or not x_shape:
        return None
    axis = axis + len(x_shape) if axis < 0 else axis
    rows, width = math.prod(x_shape[:axis]), math.prod(x_shape[axis:])
    if rows <= 0 or width <= 0:
        return None
    rms = op_type in RMS_NORM_OPS
    fwd, bwd = eager_norm_times_s(rows, width, itemsize, hbm_bytes_per_s, gpu.sm_count,
                                  gpu.l2_bytes or math.inf, rms)
    return (fwd, bwd), eager_norm_kernels(rows, width, gpu.sm_count, rms)[1] - 1
