"""Eager PyTorch's LayerNorm, RMSNorm and BatchNorm kernels on CUDA: time laws from their launch
structure (BatchNorm: the section before :func:`batch_norm_times_s`).

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


__all__ = ["BatchNormLaw", "EagerNormLaw", "H100_BATCH_NORM_LAW", "H100_NORM_LAW", "EAGER_NORM_OPS", "LAW_NORM_OPS", "RMS_NORM_OPS",
           "batch_norm_times_s", "batch_norm_waves", "eager_norm_times_s", "eager_norm_kernels", "gamma_beta_split",
           "op_norm_times_s", "UpcastRmsNorm", "castless_rms_norms"]

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


class BatchNormLaw(NamedTuple):
    """Rates of eager PyTorch's training-mode BatchNorm kernels on NCHW tensors (the section
    below); fitted by ``benchmarks/fit_h100_batchnorm.py``."""

    stats_elements_per_s: float
    backward_elements_per_s: float
    transform_hbm_share: float


# --------------------------------------------------------------------------------- BatchNorm
#: Eager BatchNorm in training mode (``F.batch_norm``, ``aten::native_batch_norm``) on a
#: contiguous NCHW tensor runs PyTorch's own CUDA kernels (``aten/src/ATen/native/cuda/
#: Normalization.cuh``, the channels-first path): forward ``batch_norm_collect_statistics_kernel``
#: (Welford mean and variance, **one thread block per channel**, ``grid = C``, up to 512 threads)
#: then ``batch_norm_transform_input_kernel`` (the normalisation, ``grid = (C, N)``: fully
#: parallel, bandwidth-bound); backward one ``batch_norm_backward_kernel`` (again one block per
#: channel: the two reductions, then the input gradient).  A per-channel block walks that
#: channel's ``N H W`` elements alone, so with fewer channels than the GPU holds blocks the
#: kernels run at a fraction of the bandwidth: on the bundled H100 ResNet-18 trace the 64-channel
#: statistics of a 256 x 64 x 112 x 112 input take 2.6 ms (1.2 elements per ns per block) where
#: the bandwidth would allow 0.25 ms.  Law: ``N H W x waves / rate`` for each per-channel
#: kernel, ``waves = ceil(C / (SMs x 4))`` (four 512-thread blocks fill an SM's 2,048 threads,
#: CUDA C Programming Guide, compute capability 8.x/9.0), and the transform's read and write of
#: the tensor at a share of the HBM bandwidth.  Fitted on the trace's 20 BatchNorms
#: (``benchmarks/fit_h100_batchnorm.py`` prints each kernel and the held-out steps).
BATCH_NORM_BLOCKS_PER_SM = 4
#: ONNX ops eager PyTorch runs as ``F.batch_norm``'s kernels (training mode, whatever the export's
#: ``training_mode``: the tool costs a training step).
BATCH_NORM_OPS = frozenset({"BatchNormalization"})
#: Every op a law of this module times (:func:`op_norm_times_s`).
LAW_NORM_OPS = EAGER_NORM_OPS | BATCH_NORM_OPS
#: Fitted on the 60 BatchNorm kernels of the bundled H100 ResNet-18 trace (b = 256, bf16):
#: statistics 1.09e9 and backward 0.495e9 elements per second per channel block, normalisation at
#: 0.390 of the HBM bandwidth (each the summed work over the summed measured time).  The trace's
#: forward (9.05 ms) and backward (15.63 ms) totals are met; held out, the b = 128 step within
#: +0.9% / -0.8% and the AMP step within -0.5% / +0.0%.  Per kernel the law is within 1-37% on
#: the 64- to 256-channel ones and 40-76% short on the 512-channel ones at 7 x 7 (tens of us).
#: Used for every GPU with an SM count (the launch structure is PyTorch's, not the GPU's).
H100_BATCH_NORM_LAW = BatchNormLaw(stats_elements_per_s=1.090e9, backward_elements_per_s=0.4952e9, transform_hbm_share=0.390)


def batch_norm_waves(channels: int, sm_count: int) -> int:
    """Waves of per-channel blocks (module section on BatchNorm)."""
    return max(1, math.ceil(channels / (sm_count * BATCH_NORM_BLOCKS_PER_SM)))


def batch_norm_times_s(n: int, c: int, spatial: int, itemsize: int, hbm_bytes_per_s: float, sm_count: int,
                       law: BatchNormLaw = H100_BATCH_NORM_LAW, parts: bool = False):
    """(forward, backward) seconds of one eager training-mode BatchNorm over an ``[n, c, *]``
    tensor with ``spatial`` elements per channel and sample (the BatchNorm section above);
    ``parts``: the three kernels' seconds by name (``stats``, ``transform``, ``backward``)."""
    per_channel = n * spatial * batch_norm_waves(c, sm_count)
    stats = per_channel / law.stats_elements_per_s
    transform = 2 * n * c * spatial * itemsize / (hbm_bytes_per_s * law.transform_hbm_share)
    backward = per_channel / law.backward_elements_per_s
    if parts:
        return {"stats": stats, "transform": transform, "backward": backward}
    return stats + transform, backward


def op_norm_times_s(op_type: str, axis: int, x_shape: tuple[int, ...], itemsize: int, gpu,
                    hbm_bytes_per_s: float) -> tuple[tuple[float, float], int] | None:
    """An eager LayerNorm/RMSNorm op's (forward, backward) seconds on ``gpu`` and its extra
    backward kernels beyond one (:func:`eager_norm_kernels`), or an eager BatchNorm's on an NCHW
    input (:func:`batch_norm_times_s`, no extra backward kernel); None where no law applies
    (another op type, no SM count, an unknown shape)."""
    if op_type in BATCH_NORM_OPS and gpu.sm_count and len(x_shape) >= 3 and all(d > 0 for d in x_shape):
        return batch_norm_times_s(x_shape[0], x_shape[1], math.prod(x_shape[2:]), itemsize, hbm_bytes_per_s, gpu.sm_count), 0
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


class UpcastRmsNorm(NamedTuple):
    """A Hugging Face RMSNorm written out as point-wise ops in an export that dropped its casts
    (:func:`castless_rms_norms`): the ``Pow`` reading the input, the ``Mul`` writing the normalised
    output, and the ops' tensors between them (the squares, their mean, ``mean + eps``, its
    square root and reciprocal)."""

    pow_op: int
    mul_op: int
    inner: frozenset[str]


def castless_rms_norms(graph, islands: frozenset[str] = frozenset()) -> tuple[UpcastRmsNorm, ...]:
    """The RMSNorms an export shows without the casts eager code runs them between.

    Hugging Face's ``LlamaRMSNorm`` (and Mistral's, Qwen2's and 3's, Gemma's, Mixtral's, T5's)
    computes ``x.to(torch.float32)``, ``pow(2).mean(-1, keepdim=True)``, ``x * torch.rsqrt(var +
    eps)`` and ``.to(input_dtype)`` (transformers ``modeling_llama.py``): in a 16-bit model two
    cast kernels and fp32 arithmetic.  An export made in fp32 by torch.export/dynamo drops both
    casts as no-ops, leaving ``Pow(x) -> ReduceMean -> Add -> Sqrt -> Reciprocal -> Mul(x, .)``
    (or ``Div(x, Sqrt(..))``).  Those chains are returned, except where the export kept the casts
    (the squares already in ``islands``, :func:`dml2comm.cost.memory.fp32_islands`: the casts
    are ops of their own there)."""
    out = []

    def only(name: str, op_types: tuple[str, ...]):
        readers = list(graph.consumers(name))
        if len(readers) != 1 or graph.ops[readers[0]].op_type not in op_types:
            return None
        return graph.ops[readers[0]]

    for op in graph.ops:
        if op.op_type != "Pow" or len(op.inputs) < 2 or not op.outputs or not op.outputs[0] or op.outputs[0] in islands:
            continue
        x, exponent = op.inputs[0], graph.tensor(op.inputs[1])
        if exponent is None or exponent.numel > 1:  # x ** 2, a scalar exponent
            continue
        mean = only(op.outputs[0], ("ReduceMean",))
        add = mean and only(mean.outputs[0], ("Add",))
        sqrt = add and only(add.outputs[0], ("Sqrt",))
        if sqrt is None:
            continue
        inner = [op.outputs[0], mean.outputs[0], add.outputs[0], sqrt.outputs[0]]
        last = only(sqrt.outputs[0], ("Reciprocal", "Div"))
        if last is not None and last.op_type == "Reciprocal":
            inner.append(last.outputs[0])
            last = only(last.outputs[0], ("Mul",))
        if last is None or x not in last.inputs or (last.op_type == "Div" and last.inputs[0] != x):
            continue
        out.append(UpcastRmsNorm(op.index, last.index, frozenset(inner)))
    return tuple(out)
