"""Time of one GEMM on one GPU as a function of its shape (batch, M, N, K), data type and GPU.

A GEMM here is ``b`` independent products ``[M, K] @ [K, N] -> [M, N]``: ``2 b M N K`` FLOPs.
Two sources, used in this order by :func:`gemm_time_s`:

1. **Measured table** (where the GPU and data type have one and the GEMM is aligned: B200
   bf16/fp16/tf32/fp8, H100 tf32; no longer H100 bf16/fp16, see "H100" below): kernel times
   measured by the OpenXLA project on a grid
   ``b in {1, 2, 4}``, ``M, N, K in {256, ..., 4096}`` (``data/xla_matmul_measured.csv``,
   provenance in ``data/XLA_MATMUL_PROVENANCE.md``).  Inside the grid the time is the
   multilinear interpolation of ``log(time)`` over ``(log b, log M, log N, log K)``, which
   returns the table's value at every grid point.  Before interpolation the table is made
   monotone by its *lower envelope* ``T(x) <- min over grid points y >= x of T(y)`` (a GEMM can
   always be padded to a bigger one, so it never needs longer than the bigger one took); this
   changes the few small, latency-bound points where the library picked a slow kernel (H100 bf16:
   12 of 375, see :func:`measured_table`), and keeps the others exactly.
2. **Analytical model** (outside the grid, other GPUs, other data types, unaligned GEMMs), one
   shape law with few fitted numbers (:data:`SHAPE_LAW`; the H100 and H200 have their own,
   :data:`H100_SHAPE_LAW`, :func:`shape_law`) and one sustained factor per GPU
   (:data:`SUSTAINED_FACTOR`).  For every candidate kernel -- an output tile ``(tm, tn)`` from
   :data:`TILE_SHAPES` and a split-K factor ``s`` from :data:`SPLIT_K_FACTORS` -- ::

       tiles   = b ceil(M / tm) ceil(N / tn) s                 output tiles (x K splits) to run
       waves   = floor(x) + [(1 - w) + w frac(x) if frac(x) > 0]   x = tiles / SMs, one tile per SM at a time
       k_tile  = ceil(K / s / kb) kb + K0                       K steps per tile (kb = 128 B of K)
       K0      = e_epi peak / (2 HBM)                           the tile's fixed cost, in K steps
       t_tile  = 2 tm tn k_tile / (peak / SMs x f_gpu x eta(tm, tn))
       t_split = 2 s b M N 4 B / (HBM x e_hbm)   if s > 1       fp32 partial sums written, read
       t_cand  = waves t_tile + t_split

   and the GEMM takes ``max(min over candidates t_cand, bytes / (HBM x e_hbm)) + t_lat`` with
   ``bytes = b (M K + K N) in_bytes + b M N out_bytes``.  The pieces: dimension quantisation in
   tiles and waves (NVIDIA, "Matrix Multiplication Background User's Guide", Sec. 3.1-3.2: tile
   sizes 256x128, 128x256, 128x128, 256x64, 64x256, 128x64, 64x128, 64x64, the larger being the
   more efficient), the last, partial wave costing ``(1 - w) + w frac`` of a full one (``w``,
   fitted: with fewer tiles resident, each gets more of the L2 and HBM bandwidth the full waves
   share, so a partial wave ends sooner than a full one; ``w = 0`` is the classic
   ``ceil(tiles / SMs)``, which the tables reject: their fit prefers ``w`` of about 0.5, and on
   the A100, whose GEMMs the law extrapolates to, the three bundled training-step sources then
   agree on one sustained factor within 0.5% instead of 3%); the kernel choice as the fastest
   candidate (what cuBLAS's heuristics aim for); split-K for small ``M N`` with long ``K`` (CUTLASS "split-K" / "parallel reduction"
   GEMMs; the partial sums' traffic is the cost); the roofline's memory floor (Williams et al.,
   CACM 2009); ``K0``, a per-tile fixed cost in K steps (pipeline fill and epilogue: why a
   4096x4096 GEMM reaches 0.79 of peak at K=4096 but 0.40 at K=256 on H100), the time of moving
   ``e_epi`` bytes per output element of the tile at the SM's share of the HBM bandwidth
   (``2 tm tn K0 / (peak / SMs) = e_epi tm tn / (HBM / SMs)``): a memory-bound cost, so in K
   steps it is proportional to the GPU's FLOP-to-byte ratio ``peak / HBM`` -- about 290 FLOP/B on
   H100 and B200, whose tables fit it, 153 on A100, whose GEMMs the law extrapolates to (the
   fitted ``e_epi`` of 1.4 bytes is about one 16-bit output element written per tile element; a
   ``K0`` fixed in K steps instead fits the two tables equally well, H100 and B200 having nearly
   the same ratio, but makes an A100 tile's fixed cost twice as long, and the bundled A100 runs
   then need sustained factors 10% apart: Korthikanti's thin-K attention products disagree with
   Narayanan's large GEMMs); ``eta``, the
   lower main-loop rate of smaller tiles (``(1 + c (1/256 + 1/128)) / (1 + c (1/tm + 1/tn))``,
   1 for the 256x128 tile: operand bytes per FLOP grow as ``1/tm + 1/tn``); ``t_lat``, a fixed
   time per kernel; ``f_gpu``, the sustained share of the spec peak a large, well-tiled GEMM
   reaches on that GPU (clocks under load below the boost clock the peak assumes).

   Every candidate's time is non-decreasing in b, M, N and K, so their minimum is too, and so
   is the combination with the table (below): more work of the same shape and alignment never
   takes less time (tested on and off the grid, on every preset GPU).

3. **Alignment** (:func:`is_aligned`): a 16-bit GEMM whose row lengths ``N`` or ``K`` are not
   multiples of 8 elements (16 bytes) cannot use the library's vectorised tensor-core kernels
   (NVIDIA's guide, "Tensor Core Requirements"); cuBLAS falls back to another kernel (on the
   H100, ``cutlass_75_tensorop_bf16_s1688gemm_*_align1``, a Turing-era kernel).  Modelled with
   one number: the same law with its main-loop rate at :data:`UNALIGNED_RATE` of the aligned one
   (latency and memory floor unchanged), applied on every GPU; the tables (aligned grids) are
   not used for such a GEMM.  So padding a dimension (:func:`aligned_dim`,
   :func:`padding_saving_s`) can make a bigger GEMM faster: monotonicity holds between shapes of
   the same alignment only.

Combining the two outside the grid (for a GPU with a table): ``T = min(max(A, L), U)``, with
``A`` the analytical time, ``L`` the table's time at ``min(x, grid max)`` (a lower bound, used
when no coordinate is below the grid) and ``U`` its time at ``max(x, grid min)`` (an upper bound,
used when no coordinate is above it).  ``A``, ``L`` and ``U`` are each non-decreasing, so ``T``
is; inside the grid ``L = U`` = the table.

Fit (``benchmarks/fit_gemm.py`` reprints it): least squares of ``log(model / measured)`` over the
H100 and B200 bf16 tables (750 shapes, the lower envelope), Nelder-Mead over ``e_epi``, ``c``,
``t_lat``, ``e_hbm``, ``w`` and one ``f`` per GPU (:func:`fit_shape_law`).  Residuals of the
analytical part alone, median / mean absolute error: H100 bf16 3.6% / 4.1% (the 310 shapes of at
least 1 GFLOP: median 3.4%), B200 bf16 2.8% / 4.2% (2.8%).  Held out (fit on B200 and the H100
shapes with even ``log2(b M N K)``, checked on the odd ones of at least 1 GFLOP): median 3.7%,
mean 4.4%.  Not fitted: B200 fp8 median 4.2%; tf32 (the ``f32`` tables) median 11.1% on B200 but
26.1% on H100 -- inside the grid the table answers; outside it the bf16 law is a rough guide for
tf32.  With the classic whole last wave (``w`` = 0, the law until 2026-11) the sum of squared log
errors is 10% higher (3.08 against 2.78) and the held-out median 3.4% (in-sample 3.3%): the
partial wave fits the tables better and carries slightly worse to the held-out half, and it is
kept for what it does on the A100 (``SUSTAINED_FACTOR``).  These numbers describe how well the
shared law reproduces the tables; the H100 itself no longer uses them (below).

H100 (and H200): PyTorch/cuBLAS, not OpenXLA's table.  The bundled measurement of what PyTorch
2.11 runs (``dml2comm/validate/data/h100_kernels_measured.json``: 140 ``nn.Linear`` shapes, M
2,048-16,384 tokens, each in its forward, data-gradient and weight-gradient layout; CUDA graphs of
back-to-back calls, random operands, a 700 W H100 SXM) contradicts the table in both directions
(``benchmarks/fit_h100_gemm.py`` prints it): at the 21 grid points it hits, PyTorch takes 0.72-0.82
of the table's time below 10 GFLOP and 0.99-1.11 of it at 30 GFLOP and above; large GEMMs
sustain about 690 TFLOP/s (0.70 of peak) where the table's reach 760-780.  The methods differ:
the table times each kernel alone (``xla/tools/matmul_perf_table_gen.cc``: the median CUPTI
kernel time of 5 runs of the kernel XLA's compiler picks), the measurement a stream of
back-to-back calls as a training step issues them.  A plausible reading (not measured: no clock
was logged): a lone large kernel runs at the boost clock of a cool GPU, a stream of them at the
clock the power limit allows; a lone small kernel pays a ramp (the tables' ``t_lat`` of 5.3 us)
that queued kernels overlap.  No one scale maps one onto the other, and what PyTorch runs is what
our users run: the H100 gets
:data:`H100_SHAPE_LAW` and its own factor, fitted on the measurement's 402 aligned GEMMs
(:func:`fit_device_law`: ``f`` = 0.7345, ``t_lat`` = 1.27 us, ``w`` = 0.94; the other numbers of
:data:`SHAPE_LAW` kept; the factor alone under :data:`SHAPE_LAW` fits 0.804 and leaves a median
error of 8.2%, the small shapes 30-50% too slow).  Residuals, median / mean / worst absolute
error: 3.5% / 4.8% / 21.5% (forward 3.5%, data gradient 3.8%, weight gradient 2.6%); held out,
every number refitted without one ``(M, N, K)`` row and its three layouts: 3.5% / 4.9% / 21.7%.
The previous model (the table, ``f`` = 0.913 outside it) was 17.5% off the aligned ones (median,
signed -15.8%: too fast) and 80-87% too fast on the unaligned.
Unaligned (:data:`UNALIGNED_RATE` = 0.1934, fitted on the 18 GEMMs with N = 50,257 by
:func:`fit_unaligned_rate`): 11.3% / 9.9% / 15.9% (forward -14%, the fallback's rate being lower
for it, data gradient +3%, weight gradient +11%; each row's three layouts together within 3.1%);
leave-one-GEMM-out 12.0% / 10.5% / 16.7%, leave-one-row-out 11.0%.  An even row length that is
not a multiple of 8 gets CUTLASS's ``align2`` kernels instead (:data:`ALIGN2_RATE` = 0.377,
:func:`alignment_class`).  All 420 measured GEMMs
(``validate --source h100-gemm``): median 3.5%, held out 3.6%.  Not measured, so not checked:
H100 tf32 (the table still answers) and fp8, the H200, the unaligned rate on other GPUs and
narrow unaligned products (N or K < 8, GEMV-like: the law may be up to 1 / UNALIGNED_RATE too
slow where the library runs a memory-bound kernel).

References
----------
NVIDIA, "Matrix Multiplication Background User's Guide" (Deep Learning Performance
documentation), Sec. 2.3 and 3, and "Tensor Core Requirements".  NVIDIA CUTLASS documentation,
"Efficient GEMM in CUDA" (tiling, split-K, k-block of 64 16-bit elements).  Williams, Waterman,
Patterson, "Roofline", CACM 2009.  OpenXLA, ``xla/service/gpu/model/default_matmul_perf_table.txtpb``
(the measured table) and ``xla/tools/matmul_perf_table_gen.cc`` (how it was measured).
"""

from __future__ import annotations

import bisect
import csv
import dataclasses
import functools
import math
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Callable, Iterable, Mapping, NamedTuple, Sequence

import numpy as np

from dml2comm.cost.calibrated import GEMM_CLASSES, class_value, gemm_regime, parse_class_key, preset_of
from dml2comm.errors import ConfigError, ModelError
from dml2comm.hardware.gpus import GPU

__all__ = [
    "ALIGNMENT_BYTES",
    "B200",
    "H100_SHAPE_LAW",
    "IN_STEP_GEMM_SHARE",
    "UNALIGNED_RATE",
    "ALIGN2_RATE",
    "alignment_class",
    "aligned_dim",
    "fit_device_law",
    "fit_unaligned_rate",
    "is_aligned",
    "padding_saving_s",
    "shape_law",
    "DEFAULT_SUSTAINED_FACTOR",
    "sustained_factor",
    "sustained_source",
    "SUSTAINED_SOURCE",
    "FitResult",
    "GemmDevice",
    "GemmShape",
    "MeasuredTable",
    "SHAPE_LAW",
    "SPLIT_K_FACTORS",
    "SUSTAINED_FACTOR",
    "TABLE_FILE",
    "ShapeLaw",
    "TILE_SHAPES",
    "TrainingGemms",
    "analytical_time_s",
    "analytical_times_s",
    "fit_shape_law",
    "gemm_device",
    "gemm_efficiency",
    "gemm_time_s",
    "measured_table",
    "table_samples",
    "training_gemms",
]

# ------------------------------------------------------------------------------------ constants

#: Output tiles (rows x columns) a GEMM library chooses among: the cuBLAS tile sizes listed in
#: NVIDIA's "Matrix Multiplication Background User's Guide", Sec. 3.1 (256x128 and 128x256 the
#: most efficient, 64x64 the least).
TILE_SHAPES: tuple[tuple[int, int], ...] = (
    (256, 128), (128, 256), (128, 128), (256, 64), (64, 256), (128, 64), (64, 128), (64, 64))
#: Split-K factors considered (CUTLASS's split-K GEMMs divide K among 2..16 thread blocks that
#: each write fp32 partial sums, then reduce them).
SPLIT_K_FACTORS: tuple[int, ...] = (1, 2, 4, 8, 16)
#: Bytes of K one main-loop step loads per operand row: 64 16-bit elements (CUTLASS's
#: ``128x256x64`` / ``128x128x64`` tensor-core tiles), so 32 tf32 or 128 fp8 elements.
K_BLOCK_BYTES = 128
#: Bytes of an fp32 partial sum written and read per split-K slice.
_PARTIAL_BYTES = 4


@dataclass(frozen=True, slots=True)
class ShapeLaw:
    """The fitted numbers of the analytical model, shared by every GPU (module docstring).

    Parameters
    ----------
    epilogue_bytes
        ``e_epi``: fixed cost of one output tile, as bytes per output element moved at the SM's
        share of the HBM bandwidth; in K steps ``K0 = e_epi peak / (2 HBM)``, added to the tile's own K.
    tile_edge
        ``c`` (elements): how fast the main-loop rate falls for smaller tiles.
    latency_s
        ``t_lat``: fixed time per kernel (seconds).
    hbm_efficiency
        ``e_hbm``: share of the HBM bandwidth the memory floor and the split-K traffic reach.
    tail_wave
        ``w``: how much of a partial last wave's time is proportional to the tiles it holds; it
        costs ``(1 - w) + w x frac`` of a full wave (``frac`` = its share of the SMs).  0 is the
        classic ceil(tiles / SMs); 1 would be no wave quantisation at all.
    """

    epilogue_bytes: float
    tile_edge: float
    latency_s: float
    hbm_efficiency: float
    tail_wave: float = 0.0


#: Fitted by ``benchmarks/fit_gemm.py`` (least squares in log time on the H100 and B200 bf16
#: tables, 750 shapes, Nelder-Mead; sum of squared log errors 2.782; residuals in the module
#: docstring: median 3.6% on H100, 2.8% on B200).
SHAPE_LAW = ShapeLaw(epilogue_bytes=1.3495, tile_edge=55.06, latency_s=5.275e-6, hbm_efficiency=0.983, tail_wave=0.496)

#: Eager PyTorch's linear-layer GEMMs inside a training step run this share of the time the law
#: gives them (``--stack pytorch``; the law is fitted on GEMMs measured alone, and matches them:
#: ``benchmarks/gemm_step_vs_isolated.py``).  The blocks' aligned GEMMs of the two bundled H100
#: steps ran 0.911 (GPT-2 small, b = 8) and 0.878 (Llama-1B, b = 4) of the law's time, and of the
#: same shapes measured alone 0.933 and 0.870; their mean, 0.89.  The 44 unbundled set-3 traces
#: (H100 and H200, every shape) gave 0.85-0.91.  Why a GEMM runs faster between the step's
#: memory-bound kernels than back to back is not established here (the clocks a sustained GEMM
#: load holds are one candidate); the share is measured, not derived.
IN_STEP_GEMM_SHARE = 0.89

#: H100 and B200 factors fitted with :data:`SHAPE_LAW` on OpenXLA's tables (``benchmarks/fit_gemm.py``).
#: The H100 one is no longer what an H100 gets (:data:`H100_SHAPE_LAW`); it is kept for the default.
_F_H100_XLA, _F_B200 = 0.913, 0.727
_F_A100 = 0.723
#: Sustained factor of a GPU without a table or a fit: the mean of the H100 and B200 fits on
#: OpenXLA's tables (under :data:`SHAPE_LAW`, the law those GPUs use).
DEFAULT_SUSTAINED_FACTOR = round((_F_H100_XLA + _F_B200) / 2, 3)

#: The law of the GEMMs PyTorch runs through cuBLAS on an H100 (and an H200: the same GH100 chip,
#: clocks and SMs), fitted by ``benchmarks/fit_h100_gemm.py`` on the bundled H100 measurement
#: (``dml2comm/validate/data/h100_kernels_measured.json``: 134 aligned ``nn.Linear`` shapes x the
#: forward, data-gradient and weight-gradient layouts, 402 GEMMs of 2.4-4,300 GFLOP, PyTorch 2.11,
#: CUDA graphs of back-to-back calls).  Of :data:`SHAPE_LAW`'s numbers two are refitted with the
#: sustained factor, the others kept: ``latency_s`` (5.3 us fitted on OpenXLA's kernels timed one
#: at a time, 1.27 us on kernels queued on one stream, as a training step queues them) and
#: ``tail_wave``, 0.94 against the tables' 0.50 (a partial last wave costs little more than its
#: share of the SMs, as with persistent kernels that take tile after tile from a scheduler, like
#: CUTLASS 3's sm90 GEMMs; cuBLAS runs ``nvjet_sm90_tst_*`` kernels in the bundled GPT-2 trace).
#: Residuals in the module docstring.
H100_SHAPE_LAW = ShapeLaw(epilogue_bytes=SHAPE_LAW.epilogue_bytes, tile_edge=SHAPE_LAW.tile_edge, latency_s=1.275e-6,
                          hbm_efficiency=SHAPE_LAW.hbm_efficiency, tail_wave=0.937)
_F_H100 = 0.7345
#: Shape law per GPU name; every GPU not named here uses :data:`SHAPE_LAW`.
SHAPE_LAWS: Mapping[str, ShapeLaw] = MappingProxyType({"H100-SXM5-80GB": H100_SHAPE_LAW, "H200-SXM-141GB": H100_SHAPE_LAW})

#: Row alignment a tensor-core GEMM kernel needs for its 16-byte vector loads and stores: NVIDIA,
#: "Matrix Multiplication Background User's Guide", section "Tensor Core Requirements" (M, N, K
#: multiples of 16 bytes -- 8 fp16/bf16, 4 tf32, 16 fp8/int8 elements -- a requirement before
#: cuBLAS 11.0, a condition of full speed since; 128 bytes best on A100), and the cuBLAS
#: documentation's tensor-core usage notes (leading dimensions and pointers multiples of 16 bytes).
#: Applied to 16-bit operands only (:func:`is_aligned`).
ALIGNMENT_BYTES = 16
#: Main-loop rate of an unaligned 16-bit GEMM's kernel as a share of the aligned one's (the same
#: GPU's ``f_gpu``), one number for every GPU: fitted by ``benchmarks/fit_h100_gemm.py`` on the 18
#: unaligned GEMMs of the H100 measurement (N = 50,257, GPT-2's vocabulary; cuBLAS falls back to
#: ``cutlass_75_tensorop_bf16_s1688gemm_*_align1``, a Turing-era kernel, at 95-155 TFLOP/s).  On
#: other GPUs an extrapolation: no bundled 16-bit unaligned GEMM measures it (the A100's tf32
#: ones lose less, :func:`is_aligned`).  Residuals in the module docstring.
UNALIGNED_RATE = 0.1934
#: The main-loop rate, as a share of the aligned kernels', of a 16-bit GEMM whose dimensions
#: (M, N and K) are all even but whose row lengths are not all multiples of 8: cuBLAS runs CUTLASS's sm_80 tensor-core
#: kernels with 2-element alignment (``cutlass_80_tensorop_bf16_s16816gemm_..._align2``) instead
#: of the sm_75 fallback an odd row length gets (:data:`UNALIGNED_RATE`).  Fitted by
#: ``benchmarks/fit_h100_align2.py`` on BERT's 512 -> 30,522 masked-LM decoder in the bundled H100
#: traces (its three GEMMs at 8,192 and 16,384 tokens: 216-269 TFLOP/s measured, where the odd
#: rate predicts them 78-115% too slow): 0.377, each of the six within 10.2% (forward +10%, data
#: gradient -1%, weight gradient -7% to -9%); held out, the AMP step's three within the same
#: (+10.9%, -1.0%, -7.2%).  One vocabulary only (30,522): the rate of other even row lengths is
#: taken to be the same.
ALIGN2_RATE = 0.377
#: Sustained share of the dense spec peak a large, well-tiled GEMM reaches (``f_gpu``), per GPU.
#: H100 and H200: fitted with :data:`H100_SHAPE_LAW` on the bundled PyTorch/cuBLAS measurement
#: (above; OpenXLA's table gave 0.913 under :data:`SHAPE_LAW`: see the module docstring for why
#: the two differ).  B200: fitted with :data:`SHAPE_LAW` on its OpenXLA table
#: (``benchmarks/fit_gemm.py``).  A100 (80 GB and
#: 40 GB: same GA100 configuration, clocks and peaks): fitted on the three bundled A100
#: training-step sources together (``benchmarks/fit_a100.py``, the validation's in-sample refit,
#: each source's mean absolute error weighing the same): Narayanan et al. 2021 Table 1 (ten
#: end-to-end runs on 32-3,072 A100s, Megatron-LM of 2021), vTrain's 1,440 single-node
#: Megatron-DeepSpeed runs and Korthikanti et al. 2022 Table 4 (one 22B layer).  Their joint
#: optimum, 0.727, puts Narayanan's 76.1B row beyond 5% too fast; the factor shipped is the
#: nearest one that keeps every Narayanan row within 5% (that table's target) with a margin,
#: 0.723 (worst row 4.88%; at 0.724 a real evaluation puts that row at 4.99%, on the edge).
#: Leave-one-source-out the other two fit 0.734 (for Narayanan), 0.726 (for vTrain) and 0.726
#: (for Korthikanti), 1.1% apart: with the partial last wave (``ShapeLaw.tail_wave``) the three
#: agree (with the whole last wave they wanted 0.755, 0.738 and 0.733).  Earlier each source alone fitted 0.729
#: (Narayanan), 0.755 (Korthikanti) and 0.775 (vTrain), 6% apart since the tile's fixed cost is
#: memory-bound (``epilogue_bytes``); with it fixed in K steps they were 0.73, 0.86 and 0.78.
#: History: 0.732 -> 0.725 (Megatron's pipeline scatter/gather, full recomputation of transformer
#: layers only) -> 0.727 (optimizer gradient-norm and unscale passes; then the asynchronous TP
#: all-reduce, the gradient accumulation pass and the memory-bound tile cost, refitted on all
#: three sources) -> 0.724 (the attention head split as strided views,
#: :func:`dml2comm.cost.ops.attention_head_views`) -> 0.726 (the training loss an export leaves
#: out, :mod:`dml2comm.cost.loss`) -> 0.715 (the partial last wave, refitted shape law) -> 0.723
#: (autograd's gradient sums, :func:`dml2comm.cost.ops.gradient_forks`: backward time that no
#: term held, so the sources that time backward apart from forward, Korthikanti's layer, and the
#: backward-heavy rows of all three, no longer need slower GEMMs to make it up).
#: Every other GPU (V100, L40S, RTX A6000, MI300X) has no table and no fit:
#: it gets :data:`DEFAULT_SUSTAINED_FACTOR`, the mean of the two table-fitted values.
SUSTAINED_FACTOR: Mapping[str, float] = MappingProxyType({
    "H100-SXM5-80GB": _F_H100,
    "H200-SXM-141GB": _F_H100,
    "B200": _F_B200,
    "A100-SXM4-80GB": _F_A100,
    "A100-SXM4-40GB": _F_A100,
})

# Data-type labels accepted (as GPU.peak_flops) -> (peak key, operand bytes, output bytes).
_DTYPES: Mapping[str, tuple[str, int, int]] = MappingProxyType({
    "fp32": ("fp32", 4, 4), "float32": ("fp32", 4, 4), "float": ("fp32", 4, 4),
    "tf32": ("tf32", 4, 4),
    "bf16": ("bf16", 2, 2), "bfloat16": ("bf16", 2, 2),
    "fp16": ("fp16", 2, 2), "float16": ("fp16", 2, 2), "half": ("fp16", 2, 2),
    # fp8 operands, 16-bit output (as in the measured table and Transformer Engine's fp8 GEMMs)
    "fp8": ("fp8", 1, 2), "float8": ("fp8", 1, 2),
})


# ----------------------------------------------------------------------------------- devices


@dataclass(frozen=True, slots=True)
class GemmDevice:
    """What the GEMM model needs of a GPU: dense peaks per data-type key, SMs, HBM bandwidth.

    Built from a preset by :func:`gemm_device`, or directly for a device that has a measured
    table but no preset (:data:`B200`).  ``name`` keys :data:`SUSTAINED_FACTOR` and the tables.
    ``sustained``: a calibrated ``f_gpu`` (:attr:`dml2comm.hardware.gpus.GPU.gemm_sustained_factor`,
    fitted by ``python main.py calibrate`` on the user's own kernels); when set it replaces
    :data:`SUSTAINED_FACTOR` and the measured table (someone else's GPU) is not used.
    """

    name: str
    peak_flops_per_s: Mapping[str, float]
    sm_count: int
    hbm_bytes_per_s: float
    sustained: float | None = None
    #: calibrated sustained factors per GEMM class (:data:`dml2comm.cost.calibrated.GEMM_CLASSES`);
    #: a class named here replaces ``sustained`` and the table for its GEMMs
    calibrated_classes: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))

    def __hash__(self) -> int:  # cheap (it keys the per-shape cache); equality still compares the peaks
        return hash((self.name, self.sm_count, self.hbm_bytes_per_s))

    def peak(self, key: str) -> float:
        """Dense peak FLOP/s for a data-type key (``bf16``, ``tf32``...)."""
        value = self.peak_flops_per_s.get(key)
        if not value:
            raise ConfigError(f"GPU {self.name!r} has no sourced {key} peak; use one of "
                              f"{', '.join(sorted(self.peak_flops_per_s))} (dtype)")
        return value


#: NVIDIA B200 (HGX, 1,000 W), the device of the sm_100 table; not a preset of
#: :mod:`dml2comm.hardware.gpus` (no cluster uses it yet).  Dense peaks TF32 1,100, BF16/FP16
#: 2,250, FP8 4,500 TFLOP/s, 8 TB/s HBM3e (glennklockwood.com/garden/processors/B200, "HGX
#: variant of B200 ... at 1,000 W", matrix column); 148 SMs ("B200 enables 74 SMs per die,
#: giving 148 SMs across the GPU", Chips and Cheese, "Nvidia's B200: Keeping the CUDA
#: Juggernaut Rolling", 2025).
B200 = GemmDevice(name="B200", peak_flops_per_s=MappingProxyType(
    {"tf32": 1100e12, "bf16": 2250e12, "fp16": 2250e12, "fp8": 4500e12}), sm_count=148, hbm_bytes_per_s=8000e9)


#: Where each fitted sustained factor comes from, for the summary's compute line.
SUSTAINED_SOURCE: Mapping[str, str] = MappingProxyType({
    "H100-SXM5-80GB": "fitted on 420 GEMMs measured under PyTorch/cuBLAS on an H100 (python main.py validate --source h100-gemm)",
    "H200-SXM-141GB": "the H100's, fitted on 420 GEMMs measured under PyTorch/cuBLAS on an H100 (same GH100 silicon)",
    "B200": "fitted on OpenXLA's measured B200 table",
    "A100-SXM4-80GB": "fitted on Narayanan et al. 2021 Table 1, vTrain and Korthikanti et al. 2022 together (python main.py validate)",
    "A100-SXM4-40GB": "the A100 80 GB's, fitted on Narayanan et al. 2021 Table 1, vTrain and Korthikanti et al. 2022 together",
})


def sustained_source(gpu: GPU | GemmDevice) -> str:
    """Where :func:`sustained_factor`'s value for ``gpu`` comes from, in words."""
    own = gpu.sustained if isinstance(gpu, GemmDevice) else gpu.gemm_sustained_factor
    if own is not None:
        return "calibrated on your own kernels (python main.py calibrate)"
    classes = {k: v for k, v in gpu.calibrated_classes.items() if parse_class_key(k)[0] in GEMM_CLASSES}
    if classes:
        mine = ", ".join(f"{k} {v:.3g}" for k, v in sorted(classes.items()))
        return (f"{SUSTAINED_SOURCE.get(preset_of(gpu.name), 'the preset')}; calibrated on your own kernels for {mine} "
                "(python main.py calibrate)")
    return SUSTAINED_SOURCE.get(preset_of(gpu.name), "no fit for this GPU: the mean of the H100 and B200 table fits")


def sustained_factor(gpu: GPU | GemmDevice) -> float:
    """The share of the dense peak a GPU sustains on large GEMMs: its calibrated factor where it
    has one (``calibrate``), else :data:`SUSTAINED_FACTOR` (fitted per GPU, see there), else
    :data:`DEFAULT_SUSTAINED_FACTOR`."""
    own = gpu.sustained if isinstance(gpu, GemmDevice) else gpu.gemm_sustained_factor
    if own is not None:
        return own
    return SUSTAINED_FACTOR.get(preset_of(gpu.name), DEFAULT_SUSTAINED_FACTOR)


def shape_law(gpu: GPU | GemmDevice) -> ShapeLaw:
    """The shape law of a GPU: :data:`SHAPE_LAWS` by its name (H100, H200; a calibrated GPU by
    its preset's, :func:`dml2comm.cost.calibrated.preset_of`), else :data:`SHAPE_LAW`."""
    return SHAPE_LAWS.get(preset_of(gpu.name), SHAPE_LAW)


def gemm_device(gpu: GPU | GemmDevice) -> GemmDevice:
    """The :class:`GemmDevice` of a GPU preset (or the device itself).

    Raises
    ------
    ConfigError
        The GPU has no SM count (``GPU(..., sm_count=N)`` with its source fixes it).
    """
    if isinstance(gpu, GemmDevice):
        return gpu
    if not gpu.sm_count:
        raise ConfigError(f"GPU {gpu.name!r} has no sm_count; the GEMM model needs it "
                          "(build the GPU with sm_count=N and its source)")
    gemm = {k: v for k, v in gpu.calibrated_classes.items() if parse_class_key(k)[0] in GEMM_CLASSES}
    return GemmDevice(gpu.name, gpu.peak_flops_per_s, gpu.sm_count, gpu.kernel_hbm_bytes_per_s, gpu.gemm_sustained_factor,
                      MappingProxyType(gemm))


def _dtype(dtype: str, allow_tf32: bool) -> tuple[str, int, int]:
    entry = _DTYPES.get(dtype.strip().lower())
    if entry is None:
        raise ConfigError(f"unknown dtype {dtype!r} for a GEMM; use one of fp32, tf32, bf16, fp16, fp8")
    if entry[0] == "fp32" and allow_tf32:
        return ("tf32", 4, 4)
    return entry


def _row_aligned(n, k, in_bytes: int):
    """For 16-bit operands, ``N`` and ``K`` both multiples of :data:`ALIGNMENT_BYTES` / 2 = 8
    elements; other operand sizes count as aligned (:func:`is_aligned`).  Works on arrays."""
    if in_bytes != 2:
        return np.ones(np.shape(n), dtype=bool) if np.ndim(n) else np.bool_(True)
    step = ALIGNMENT_BYTES // in_bytes
    return (np.asarray(n) % step == 0) & (np.asarray(k) % step == 0)


def is_aligned(dtype: str, b: int, m: int, n: int, k: int, *, allow_tf32: bool = False) -> bool:
    """Whether a GEMM ``[M, K] @ [K, N]`` runs the library's aligned tensor-core kernels.

    A tensor-core kernel loads and stores 16-byte vectors (:data:`ALIGNMENT_BYTES`), so every
    row of every operand must start on a 16-byte boundary.  With the operands stored row by row
    (``A [M, K]``, ``B [K, N]``, ``C [M, N]``) the row lengths are ``K`` and ``N``: for 16-bit
    operands (bf16, fp16) both must be multiples of 8.  ``M`` and ``b`` are row and matrix
    counts, never a row length, so they do not enter (NVIDIA's guide asks it of M too, for the
    column-major view; in ``nn.Linear``'s three GEMMs the token count is never a leading
    dimension).  Other data types count as aligned: the fallback's rate
    (:data:`UNALIGNED_RATE`) is measured on 16-bit operands only, and does not carry to tf32
    (on the bundled A100 tf32 trace of HTA, ``tests/fixtures/traces/hta``, unaligned GEMMs run at
    about 0.6 of the aligned rate, not 0.19: an odd tf32 dimension is still 4-byte aligned); fp8
    GEMMs need 16-byte alignment in cuBLASLt (frameworks pad them); fp32 on CUDA cores has no
    tensor-core kernel to fall back from.
    """
    key, in_bytes, _ = _dtype(dtype, allow_tf32)
    return bool(_row_aligned(n, k, in_bytes))


def alignment_class(dtype: str, b: int, m: int, n: int, k: int, *, allow_tf32: bool = False) -> int:
    """Which kernels a GEMM runs, by the rate its main loop gets: 8 the aligned ones
    (:func:`is_aligned`), 2 CUTLASS's ``align2`` ones (16-bit, every dimension even:
    :data:`ALIGN2_RATE`), 1 the sm_75 fallback (an odd dimension: :data:`UNALIGNED_RATE`)."""
    if is_aligned(dtype, b, m, n, k, allow_tf32=allow_tf32):
        return 8
    return 2 if m % 2 == 0 and n % 2 == 0 and k % 2 == 0 else 1


def aligned_dim(n: int, multiple: int = 64) -> int:
    """The smallest multiple of ``multiple`` that is at least ``n``: a dimension padded for the
    aligned kernels (64 16-bit elements = 128 bytes, what NVIDIA's guide recommends on A100 and
    what nanoGPT pads GPT-2's vocabulary to, 50,257 -> 50,304; Megatron-LM pads it to 128 x t).

    Raises
    ------
    ConfigError
        ``n`` or ``multiple`` below 1.
    """
    if n < 1 or multiple < 1:
        raise ConfigError(f"aligned_dim needs n >= 1 and multiple >= 1, got n={n}, multiple={multiple}")
    return -(-int(n) // int(multiple)) * int(multiple)


# ------------------------------------------------------------------------- analytical model

_TN = np.array([t[1] for t in TILE_SHAPES for _ in SPLIT_K_FACTORS], dtype=float)
_SPLIT = np.array([s for _ in TILE_SHAPES for s in SPLIT_K_FACTORS], dtype=float)
_TM = np.array([t[0] for t in TILE_SHAPES for _ in SPLIT_K_FACTORS], dtype=float)


def analytical_times_s(b, m, n, k, *, peak_flops_per_s: float, sm_count: int, hbm_bytes_per_s: float,
                       in_bytes: int, out_bytes: int, sustained: float, law: ShapeLaw = SHAPE_LAW,
                       aligned=None) -> np.ndarray:
    """Analytical GEMM times (seconds) for arrays of shapes (module docstring, item 2).

    Parameters
    ----------
    b, m, n, k
        Array-likes of equal length: batch count and the ``[M, K] @ [K, N]`` dimensions.
    peak_flops_per_s, sm_count, hbm_bytes_per_s
        Dense peak of the data type (FLOP/s), SMs, HBM bandwidth (bytes/s).
    in_bytes, out_bytes
        Bytes per operand element and per output element.
    sustained
        ``f_gpu`` (:data:`SUSTAINED_FACTOR`).
    law
        The shape law's fitted numbers.
    aligned
        Per shape (or one bool for all): whether it runs the aligned kernels; an unaligned one's
        main loop runs at :data:`UNALIGNED_RATE` of the rate.  None: by the rule of
        :func:`is_aligned` (16-bit operands with ``N`` or ``K`` not a multiple of 8).

    Returns
    -------
    numpy.ndarray
        Seconds per shape.
    """
    if aligned is None:
        aligned = _row_aligned(np.asarray(n, dtype=np.int64), np.asarray(k, dtype=np.int64), in_bytes)
    b, m, n, k = (np.asarray(x, dtype=float)[:, None] for x in (b, m, n, k))
    # align2 kernels (ALIGN2_RATE) where every dimension that may be a row length is even (M too:
    # a transposed operand makes it one, as calibrate's traced shapes have it)
    even = ((np.ravel(m) % 2 == 0) & (np.ravel(n) % 2 == 0) & (np.ravel(k) % 2 == 0)) if in_bytes == 2 else False
    rate = np.where(np.broadcast_to(np.asarray(aligned, dtype=bool), (len(b),)), 1.0,
                    np.where(np.broadcast_to(even, (len(b),)), ALIGN2_RATE, UNALIGNED_RATE))[:, None]
    hbm = hbm_bytes_per_s * law.hbm_efficiency
    kb = max(1, K_BLOCK_BYTES // in_bytes)
    c = law.tile_edge
    eta = (1 + c * (1 / 256 + 1 / 128)) / (1 + c * (1 / _TM + 1 / _TN))
    per_sm = peak_flops_per_s / sm_count * sustained * rate
    tiles = b * np.ceil(m / _TM) * np.ceil(n / _TN) * _SPLIT
    k_overhead = law.epilogue_bytes * peak_flops_per_s / (2 * hbm_bytes_per_s)  # K0: the tile's fixed cost in K steps
    k_tile = np.ceil(k / (_SPLIT * kb)) * kb + k_overhead
    x = tiles / sm_count
    full = np.floor(x)
    frac = x - full
    waves = full + np.where(frac > 0, (1.0 - law.tail_wave) + law.tail_wave * frac, 0.0)  # the partial last wave
    t_cand = waves * (2 * _TM * _TN * k_tile / (per_sm * eta))
    t_cand = t_cand + np.where(_SPLIT > 1, 2 * _SPLIT * b * m * n * _PARTIAL_BYTES / hbm, 0.0)
    t_mem = (b * (m * k + k * n) * in_bytes + b * m * n * out_bytes)[:, 0] / hbm
    return np.maximum(t_cand.min(axis=1), t_mem) + law.latency_s


def analytical_time_s(gpu: GPU | GemmDevice, dtype: str, b: int, m: int, n: int, k: int, *,
                      allow_tf32: bool = False, sustained: float | None = None, aligned: bool | None = None) -> float:
    """The analytical model alone for one GEMM (seconds), with the GPU's shape law
    (:func:`shape_law`); ``sustained`` overrides ``f_gpu``, ``aligned`` the alignment rule
    (:func:`is_aligned`)."""
    dev = gemm_device(gpu)
    key, in_bytes, out_bytes = _dtype(dtype, allow_tf32)
    f = sustained_factor(dev) if sustained is None else sustained
    if aligned is None:
        aligned = is_aligned(dtype, b, m, n, k, allow_tf32=allow_tf32)
    return float(analytical_times_s([b], [m], [n], [k], peak_flops_per_s=dev.peak(key), sm_count=dev.sm_count,
                                    hbm_bytes_per_s=dev.hbm_bytes_per_s, in_bytes=in_bytes, out_bytes=out_bytes,
                                    sustained=f, law=shape_law(dev), aligned=aligned)[0])


# --------------------------------------------------------------------------- measured tables

#: The bundled measured table (a subset of OpenXLA's; data/XLA_MATMUL_PROVENANCE.md).
TABLE_FILE = Path(__file__).with_name("data") / "xla_matmul_measured.csv"
# (device name, peak key) -> (gpu_name, dtype) rows of the table.  fp16 runs on the same tensor
# cores at the same rate and with the same bytes as bf16, so it reads the bf16 table; XLA's f32
# dots run on TF32 tensor cores (data/XLA_MATMUL_PROVENANCE.md).  H100 fp8 is left out (suspect).
_TABLES: Mapping[tuple[str, str], tuple[str, str]] = MappingProxyType({
    ("H100-SXM5-80GB", "bf16"): ("H100", "bf16"), ("H100-SXM5-80GB", "fp16"): ("H100", "bf16"),
    ("H100-SXM5-80GB", "tf32"): ("H100", "f32"),
    ("B200", "bf16"): ("B200", "bf16"), ("B200", "fp16"): ("B200", "bf16"), ("B200", "tf32"): ("B200", "f32"),
    ("B200", "fp8"): ("B200", "f8e4m3fn"),
})
#: The tables :func:`gemm_time_s` answers from.  Not H100 bf16/fp16: the bundled PyTorch/cuBLAS
#: measurement contradicts OpenXLA's table (module docstring), so an H100 gets
#: :data:`H100_SHAPE_LAW`; the table stays for :func:`fit_shape_law` (the law other GPUs use) and
#: the ``gemm`` validation source.  H100 tf32 has no PyTorch measurement to check it: kept.
_ANSWERING_TABLES = frozenset(_TABLES) - {("H100-SXM5-80GB", "bf16"), ("H100-SXM5-80GB", "fp16")}


class MeasuredTable:
    """One device's measured times on its grid, made monotone, interpolated in log space.

    Parameters
    ----------
    times
        ``{(b, M, N, K): seconds}`` on a full grid (every combination of the axes' values).

    Attributes
    ----------
    axes
        The sorted grid values of b, M, N and K.
    measured
        The times as given; :attr:`nodes` the monotone lower envelope used for interpolation.
    adjusted
        Grid points whose node differs from the measurement.
    """

    def __init__(self, times: Mapping[tuple[int, int, int, int], float]) -> None:
        self.axes = tuple(tuple(sorted({key[d] for key in times})) for d in range(4))
        shape = tuple(len(a) for a in self.axes)
        if math.prod(shape) != len(times):
            raise ModelError(f"measured GEMM table is not a full grid ({len(times)} points for axes of sizes {shape})")
        arr = np.empty(shape)
        for key, t in times.items():
            arr[tuple(a.index(v) for a, v in zip(self.axes, key))] = t
        env = arr.copy()
        for d in range(4):  # suffix minimum along every axis = min over all grid points >= x
            env = np.flip(np.minimum.accumulate(np.flip(env, d), axis=d), d)
        self.measured = MappingProxyType(dict(times))
        self._log = np.log(env)
        self._loga = tuple(tuple(math.log(v) for v in a) for a in self.axes)
        self.nodes = MappingProxyType({key: float(env[tuple(a.index(v) for a, v in zip(self.axes, key))])
                                       for key in times})
        self.adjusted = tuple(sorted(key for key in times if self.nodes[key] != times[key]))
        self.lo = tuple(a[0] for a in self.axes)
        self.hi = tuple(a[-1] for a in self.axes)

    def inside(self, x: Sequence[float]) -> bool:
        return all(lo <= v <= hi for lo, v, hi in zip(self.lo, x, self.hi))

    def time_s(self, x: Sequence[float]) -> float:
        """Interpolated seconds at ``x = (b, M, N, K)`` inside the grid (ModelError outside)."""
        if not self.inside(x):
            raise ModelError(f"GEMM shape {tuple(x)} is outside the measured grid {self.lo}..{self.hi}")
        idx, wts = [], []
        for la, v in zip(self._loga, x):
            lv = math.log(v)
            i = min(bisect.bisect_right(la, lv) - 1, len(la) - 2) if len(la) > 1 else 0
            w = (lv - la[i]) / (la[i + 1] - la[i]) if len(la) > 1 else 0.0
            idx.append(i)
            wts.append(w)
        total = 0.0
        for corner in range(16):
            weight, pos = 1.0, []
            for d in range(4):
                up = (corner >> d) & 1
                weight *= wts[d] if up else 1.0 - wts[d]
                pos.append(idx[d] + up if len(self._loga[d]) > 1 else idx[d])
            if weight:
                total += weight * self._log[tuple(pos)]
        return math.exp(total)


@functools.lru_cache(maxsize=None)
def _table_rows() -> dict[tuple[str, str], dict[tuple[int, int, int, int], float]]:
    out: dict[tuple[str, str], dict[tuple[int, int, int, int], float]] = {}
    with open(TABLE_FILE, newline="") as f:
        for r in csv.DictReader(f):
            b, tm, tn, k = int(r["b"]), int(r["m"]), int(r["n"]), int(r["k"])
            # the table's dot is [b,n,k] @ [b,k,m] -> [b,n,m]: its n is our M, its m our N
            out.setdefault((r["gpu_name"], r["dtype"]), {})[(b, tn, tm, k)] = 2.0 * b * tm * tn * k / float(r["flops_per_s"])
    return out


@functools.lru_cache(maxsize=None)
def measured_table(device_name: str, dtype: str, allow_tf32: bool = False) -> MeasuredTable | None:
    """The measured table of a device (name of a preset or ``"B200"``) and data type, or None."""
    rows = _TABLES.get((device_name, _dtype(dtype, allow_tf32)[0]))
    return MeasuredTable(_table_rows()[rows]) if rows else None


# ------------------------------------------------------------------------------- public API


def gemm_time_s(gpu: GPU | GemmDevice, dtype: str, b: int, m: int, n: int, k: int, *, allow_tf32: bool = False,
                aligned: bool | None = None, conv: bool = False) -> float:
    """Seconds one GEMM (``b`` products ``[M, K] @ [K, N]``) takes on one GPU.

    The measured table inside its grid, the analytical model elsewhere, combined so that the
    time never decreases when a dimension grows (module docstring); an unaligned GEMM
    (:func:`is_aligned`) by the analytical model at :data:`UNALIGNED_RATE` (the tables hold
    aligned shapes only).  Cached by shape.

    Parameters
    ----------
    gpu
        A preset (:func:`dml2comm.hardware.gpus.get_gpu`) or a :class:`GemmDevice`.
    dtype
        ``bf16``, ``fp16``, ``fp32`` (CUDA cores unless ``allow_tf32``), ``tf32``, ``fp8``.
    b, m, n, k
        Positive integers.
    aligned
        Override of the alignment rule (:func:`is_aligned`): True for a product whose library
        pads or lays out its operands itself (a cuDNN convolution's implicit GEMM, whose ``K``
        is ``C R S`` and not a row length).
    conv
        A convolution's implicit GEMM: timed with the calibrated ``conv`` class's factor where
        the GPU has one (:mod:`dml2comm.cost.calibrated`).

    Raises
    ------
    ConfigError
        Unknown dtype, no peak for it on this GPU, a dimension below 1, or no SM count.
    """
    if min(b, m, n, k) < 1:
        raise ConfigError(f"GEMM dimensions must be positive, got b={b} M={m} N={n} K={k}")
    if aligned is None:
        aligned = is_aligned(dtype, b, m, n, k, allow_tf32=allow_tf32)
    return _gemm_time_s(gemm_device(gpu), dtype, int(b), int(m), int(n), int(k), allow_tf32, bool(aligned), conv)


@functools.lru_cache(maxsize=65536)
def _gemm_time_s(dev: GemmDevice, dtype: str, b: int, m: int, n: int, k: int, allow_tf32: bool, aligned: bool,
                 conv: bool = False) -> float:
    # a calibrated class's factor (dml2comm.cost.calibrated, the one place GEMM classes are read)
    own = class_value(dev, gemm_regime(2.0 * b * m * n * k, aligned, conv), min(m, n, k)) if dev.calibrated_classes else None
    answers = (dev.sustained is None and own is None and aligned
               and (preset_of(dev.name), _dtype(dtype, allow_tf32)[0]) in _ANSWERING_TABLES)
    table = measured_table(preset_of(dev.name), dtype, allow_tf32) if answers else None
    x = (b, m, n, k)
    if table is not None and table.inside(x):
        return table.time_s(x)
    a = analytical_time_s(dev, dtype, b, m, n, k, allow_tf32=allow_tf32, aligned=aligned, sustained=own)
    if table is None:
        return a
    if all(v >= lo for v, lo in zip(x, table.lo)):
        a = max(a, table.time_s(tuple(min(v, hi) for v, hi in zip(x, table.hi))))
    if all(v <= hi for v, hi in zip(x, table.hi)):
        a = min(a, table.time_s(tuple(max(v, lo) for v, lo in zip(x, table.lo))))
    return a


def gemm_efficiency(gpu: GPU | GemmDevice, dtype: str, b: int, m: int, n: int, k: int, *, allow_tf32: bool = False) -> float:
    """Achieved share of the dense peak: ``2 b M N K / (time x peak)``."""
    dev = gemm_device(gpu)
    peak = dev.peak(_dtype(dtype, allow_tf32)[0])
    return 2.0 * b * m * n * k / (gemm_time_s(dev, dtype, b, m, n, k, allow_tf32=allow_tf32) * peak)


def padding_saving_s(gpu: GPU | GemmDevice, dtype: str, b: int, m: int, n: int, k: int, *, multiple: int = 64,
                     allow_tf32: bool = False) -> tuple["GemmShape", float]:
    """What padding a GEMM's unaligned row lengths ``N`` and ``K`` to multiples of ``multiple``
    (:func:`aligned_dim`; an aligned one stays) would save: ``(padded shape, seconds saved)``, the saving being
    ``gemm_time_s(shape) - gemm_time_s(padded)`` (negative where the padded GEMM's extra work
    costs more than alignment gains; 0 for a shape already padded).  ``M`` is not a row length
    (:func:`is_aligned`) and stays.  For the advice layer: a vocabulary of 50,257 padded to
    50,304 on an H100 saves about 80% of each LM-head GEMM."""
    _, in_bytes, _ = _dtype(dtype, allow_tf32)

    def pad(d: int) -> int:  # an aligned row length stays (padding it would only add work)
        return d if _row_aligned(d, d, in_bytes) else aligned_dim(d, multiple)

    padded = GemmShape(int(b), int(m), pad(int(n)), pad(int(k)))
    if padded == (b, m, n, k):
        return padded, 0.0
    return padded, (gemm_time_s(gpu, dtype, b, m, n, k, allow_tf32=allow_tf32)
                    - gemm_time_s(gpu, dtype, *padded, allow_tf32=allow_tf32))


# -------------------------------------------------------------------- training GEMM shapes


class GemmShape(NamedTuple):
    """``b`` products ``[m, k] @ [k, n]``."""

    b: int
    m: int
    n: int
    k: int

    @property
    def flops(self) -> int:
        return 2 * self.b * self.m * self.n * self.k


class TrainingGemms(NamedTuple):
    """The three GEMMs of a MatMul/Gemm in training.

    ``forward``: ``Y = A @ B``; ``data_grad``: ``dA = dY @ B^T``; ``weight_grad``: ``dB = A^T @ dY``
    (the gradient of the second operand, the weight of a linear layer).  Each does the forward's
    FLOPs; which of the two backward ones a framework runs depends on which operands need gradients.
    """

    forward: GemmShape
    data_grad: GemmShape
    weight_grad: GemmShape


def training_gemms(op_type: str, a_shape: Sequence[int], b_shape: Sequence[int],
                   attrs: Mapping[str, object] | None = None) -> TrainingGemms:
    """Forward, data-gradient and weight-gradient GEMM shapes of a MatMul or Gemm.

    Shapes follow ``numpy.matmul`` (ONNX MatMul) and ONNX Gemm (``transA``/``transB``).  When
    only the first operand has leading (batch) dimensions -- a linear layer, ``[.., T, K] @
    [K, N]`` -- frameworks flatten them into rows (one GEMM of ``M = prod(..) T``), and the
    weight gradient contracts over all the tokens: ``dW = X^T @ dY`` is ``[K, M] @ [M, N]``,
    so its ``K`` is the token count.  When both operands carry the batch (attention's
    ``Q K^T``, ``P V``), the three are batched GEMMs of ``b`` products.  When only the second
    operand is batched, ``dA`` sums over the batch: one GEMM with ``K = b N``.

    Returns
    -------
    TrainingGemms
        ``forward = (b, M, N, K)``, ``data_grad = (b, M, K, N)``, ``weight_grad = (b, K, N, M)``
        (with the flattening above).

    Raises
    ------
    ModelError
        Not a MatMul/Gemm, an operand of rank 0, a non-positive dimension or mismatched K.
    """
    attrs = attrs or {}
    a, w = tuple(int(v) for v in a_shape), tuple(int(v) for v in b_shape)
    if not a or not w or min(a + w) < 1:
        raise ModelError(f"{op_type}: operand shapes {a} and {w} must have rank >= 1 and positive dimensions")
    if op_type == "Gemm":
        if len(a) != 2 or len(w) != 2:
            raise ModelError(f"Gemm: operands must be 2-D, got {a} and {w} (use MatMul for batched products)")
        m, k = (a[1], a[0]) if attrs.get("transA", 0) else a
        k2, n = (w[1], w[0]) if attrs.get("transB", 0) else w
        ba, bb = 1, 1
    elif op_type == "MatMul":
        a2 = a if len(a) >= 2 else (1,) + a
        w2 = w if len(w) >= 2 else w + (1,)
        m, k, k2, n = a2[-2], a2[-1], w2[-2], w2[-1]
        ba, bb = math.prod(a2[:-2]), math.prod(w2[:-2])
    else:
        raise ModelError(f"training_gemms handles MatMul and Gemm, not {op_type!r}")
    if k != k2:
        raise ModelError(f"{op_type}: contraction dimensions differ ({a} @ {w}); fix the shapes")
    if bb == 1:  # linear layer: batch dims of A flatten into rows
        rows = ba * m
        return TrainingGemms(GemmShape(1, rows, n, k), GemmShape(1, rows, k, n), GemmShape(1, k, n, rows))
    b = max(ba, bb)
    if ba == 1:  # A shared by every product: dA sums over the batch
        return TrainingGemms(GemmShape(b, m, n, k), GemmShape(1, m, k, b * n), GemmShape(b, k, n, m))
    return TrainingGemms(GemmShape(b, m, n, k), GemmShape(b, m, k, n), GemmShape(b, k, n, m))


# ------------------------------------------------------------------------------------- fit


class FitResult(NamedTuple):
    """What :func:`fit_shape_law` found: the shape law, a sustained factor per device name, and
    the sum of squared log errors."""

    law: ShapeLaw
    sustained: Mapping[str, float]
    loss: float


def _nelder_mead(fun: Callable[[np.ndarray], float], x0: Sequence[float], steps: Sequence[float],
                 iters: int) -> tuple[np.ndarray, float]:
    """Minimise ``fun`` (Nelder & Mead, Computer Journal 1965; standard coefficients 1, 2, 1/2, 1/2)."""
    pts = [np.asarray(x0, float)] + [np.asarray(x0, float) + np.eye(len(x0))[i] * steps[i] for i in range(len(x0))]
    vals = [fun(p) for p in pts]
    for _ in range(iters):
        order = np.argsort(vals)
        pts, vals = [pts[i] for i in order], [vals[i] for i in order]
        if vals[-1] - vals[0] <= 1e-12 * (1.0 + abs(vals[0])):  # converged: the simplex is flat
            break
        centre = np.mean(pts[:-1], axis=0)
        xr = centre + (centre - pts[-1])
        fr = fun(xr)
        if fr < vals[0]:
            xe = centre + 2 * (centre - pts[-1])
            fe = fun(xe)
            pts[-1], vals[-1] = (xe, fe) if fe < fr else (xr, fr)
        elif fr < vals[-2]:
            pts[-1], vals[-1] = xr, fr
        else:
            xc = centre + 0.5 * (pts[-1] - centre)
            fc = fun(xc)
            if fc < vals[-1]:
                pts[-1], vals[-1] = xc, fc
            else:
                pts = [pts[0] + 0.5 * (p - pts[0]) for p in pts]
                vals = [fun(p) for p in pts]
    i = int(np.argmin(vals))
    return pts[i], vals[i]


def table_samples(device: GPU | GemmDevice, dtype: str, keys: Iterable[tuple[int, int, int, int]] | None = None):
    """``(device, dtype, shapes array (n, 4), seconds array)`` of a device's table (its nodes)."""
    device = gemm_device(device)
    table = measured_table(device.name, dtype)
    if table is None:
        raise ConfigError(f"no measured GEMM table for {device.name} {dtype}")
    chosen = sorted(table.nodes) if keys is None else list(keys)
    return device, dtype, np.array(chosen, dtype=float), np.array([table.nodes[x] for x in chosen])


def fit_shape_law(samples: Sequence[tuple], start: FitResult | None = None, iters: int = 400) -> FitResult:
    """Least squares of ``log(analytical / measured)`` over samples from :func:`table_samples`.

    Free: ``e_epi``, ``c``, ``t_lat`` (fitted in log), ``e_hbm``, ``w`` and one sustained factor
    per device.  Two Nelder-Mead passes (the second from the first's optimum with smaller steps).
    """
    names = sorted({s[0].name for s in samples})
    base = start or FitResult(ShapeLaw(1.0, 16.0, 3e-6, 0.8, 0.3), {name: 0.8 for name in names}, math.inf)
    prepared = []
    for dev, dtype, shapes, times in samples:
        key, in_bytes, out_bytes = _dtype(dtype, False)
        prepared.append((dev, dict(peak_flops_per_s=dev.peak(key), sm_count=dev.sm_count,
                                   hbm_bytes_per_s=dev.hbm_bytes_per_s, in_bytes=in_bytes, out_bytes=out_bytes),
                         shapes, np.log(times)))

    def unpack(x: np.ndarray) -> tuple[ShapeLaw, dict[str, float]]:
        law = ShapeLaw(math.exp(x[0]), math.exp(x[1]), math.exp(x[2]), float(x[3]), float(x[4]))
        return law, {name: float(v) for name, v in zip(names, x[5:])}

    def loss(x: np.ndarray) -> float:
        law, f = unpack(x)
        if not (0.2 < law.hbm_efficiency <= 1.0 and 0.0 <= law.tail_wave <= 1.0 and all(0.1 < v <= 1.2 for v in f.values())):
            return 1e9
        total = 0.0
        for dev, kw, shapes, logt in prepared:
            pred = analytical_times_s(*shapes.T, sustained=f[dev.name], law=law, **kw)
            total += float(np.sum((np.log(pred) - logt) ** 2))
        return total

    x0 = [math.log(base.law.epilogue_bytes), math.log(base.law.tile_edge), math.log(base.law.latency_s),
          base.law.hbm_efficiency, base.law.tail_wave] + [base.sustained.get(name, 0.8) for name in names]
    x, _ = _nelder_mead(loss, x0, [0.5, 0.5, 0.5, 0.1, 0.2] + [0.05] * len(names), iters)
    x, v = _nelder_mead(loss, x, [0.2, 0.2, 0.2, 0.05, 0.1] + [0.02] * len(names), iters)
    law, f = unpack(x)
    return FitResult(law, MappingProxyType(f), v)


#: ShapeLaw fields fitted in log (positive scales); the others (shares in [0, 1]) as they are.
_LOG_FIELDS = ("epilogue_bytes", "tile_edge", "latency_s")


def fit_device_law(device: GPU | GemmDevice, dtype: str, shapes: np.ndarray, times: np.ndarray, *,
                   base: ShapeLaw = SHAPE_LAW, free: Sequence[str] = ("latency_s", "tail_wave"),
                   iters: int = 400) -> FitResult:
    """Refit some of a shape law's numbers and the sustained factor on one device's measured GEMMs.

    Least squares of ``log(analytical / measured)`` (the loss of :func:`fit_shape_law`) over
    ``shapes`` (an ``(n, 4)`` array of ``b, M, N, K``, aligned ones: :func:`is_aligned`) and
    ``times`` (seconds); ``free`` names the :class:`ShapeLaw` fields fitted (``latency_s``,
    ``epilogue_bytes`` and ``tile_edge`` in log, ``hbm_efficiency`` and ``tail_wave`` held to
    [0, 1] by clipping, so a fit that wants to leave the range lands on its bound exactly), the
    rest taken from ``base``.  Two Nelder-Mead passes, as :func:`fit_shape_law`.
    ``benchmarks/fit_h100_gemm.py`` fits :data:`H100_SHAPE_LAW` with it.

    Raises
    ------
    ConfigError
        A name in ``free`` is not a field of :class:`ShapeLaw`.
    """
    fields = ShapeLaw.__dataclass_fields__
    for name in free:
        if name not in fields:
            raise ConfigError(f"fit_device_law: {name!r} is not a ShapeLaw field ({', '.join(fields)})")
    dev = gemm_device(device)
    key, in_bytes, out_bytes = _dtype(dtype, False)
    kw = dict(peak_flops_per_s=dev.peak(key), sm_count=dev.sm_count, hbm_bytes_per_s=dev.hbm_bytes_per_s,
              in_bytes=in_bytes, out_bytes=out_bytes)
    shapes = np.asarray(shapes, dtype=float)
    logt = np.log(np.asarray(times, dtype=float))

    def unpack(x: np.ndarray) -> tuple[ShapeLaw, float]:
        values = {name: (math.exp(v) if name in _LOG_FIELDS else float(min(max(v, 0.0), 1.0)))
                  for name, v in zip(free, x[1:])}
        return dataclasses.replace(base, **values), float(x[0])

    def loss(x: np.ndarray) -> float:
        law, f = unpack(x)
        if not 0.1 < f <= 1.2 or law.hbm_efficiency <= 0.2:
            return 1e9
        return float(np.sum((np.log(analytical_times_s(*shapes.T, sustained=f, law=law, **kw)) - logt) ** 2))

    x0 = [sustained_factor(dev)] + [math.log(getattr(base, n)) if n in _LOG_FIELDS else getattr(base, n) for n in free]
    steps = [0.05] + [0.5 if n in _LOG_FIELDS else 0.2 for n in free]
    x, _ = _nelder_mead(loss, x0, steps, iters)
    x, v = _nelder_mead(loss, x, [s / 2.5 for s in steps], iters)
    law, f = unpack(x)
    return FitResult(law, MappingProxyType({dev.name: f}), v)


def fit_unaligned_rate(device: GPU | GemmDevice, dtype: str, shapes: np.ndarray, times: np.ndarray, *,
                       law: ShapeLaw, sustained: float) -> float:
    """:data:`UNALIGNED_RATE` fitted on one device's unaligned GEMMs: the ``r`` minimising
    ``sum (log analytical(f r) - log measured)^2`` with the device's shape law and sustained
    factor ``f`` fixed (a golden-section search on ``log r`` in [0.01, 1]; Kiefer 1953)."""
    dev = gemm_device(device)
    key, in_bytes, out_bytes = _dtype(dtype, False)
    shapes = np.asarray(shapes, dtype=float)
    logt = np.log(np.asarray(times, dtype=float))

    def loss(log_r: float) -> float:  # f r as the aligned kernels' factor = f at the unaligned rate
        pred = analytical_times_s(*shapes.T, peak_flops_per_s=dev.peak(key), sm_count=dev.sm_count,
                                  hbm_bytes_per_s=dev.hbm_bytes_per_s, in_bytes=in_bytes, out_bytes=out_bytes,
                                  sustained=sustained * math.exp(log_r), law=law, aligned=True)
        return float(np.sum((np.log(pred) - logt) ** 2))

    lo, hi, g = math.log(0.01), 0.0, (math.sqrt(5) - 1) / 2
    for _ in range(80):
        a, b = hi - g * (hi - lo), lo + g * (hi - lo)
        if loss(a) < loss(b):
            hi = b
        else:
            lo = a
    return math.exp((lo + hi) / 2)
