"""Compute time of one op and of the optimizer step on one GPU: a roofline with efficiencies.

time = max(FLOPs / (peak x e), bytes / (HBM bandwidth x e_hbm))  (Williams, Waterman, Patterson,
"Roofline", CACM 2009), except for matrix multiplications, where

- MatMul, Gemm and Conv (as implicit GEMM) are timed by the shape-aware GEMM model of
  :mod:`dml2comm.cost.gemm` (:func:`~dml2comm.cost.gemm.gemm_time_s`: OpenXLA's measured H100/B200
  tables inside their grid, an analytical tile/split-K/wave model with a per-GPU sustained factor
  elsewhere), with the forward, data-gradient and weight-gradient GEMMs each at its own shape
  (:func:`~dml2comm.cost.gemm.training_gemms`); :func:`gemm_dims` gives a Conv's implicit-GEMM
  shape.  The wiring is in :func:`dml2comm.cost.ops.op_costs`.
- ``e`` = :data:`FLOP_EFFICIENCY` applies to the FLOP-bound work outside the GEMM model: fused
  point-wise kernels, Einsum and fused-attention ops, and GEMMs on a GPU without an SM count.
- ``e_hbm`` applies to memory-bound ops: the share of the HBM bandwidth a streaming kernel
  reaches (STREAM-like copies on A100 reach about 1.7-1.8 of 2.04 TB/s).
- Point-wise chains run as fused kernels (Megatron-LM's fused bias-GeLU, bias-dropout-add and
  scale-mask-softmax; the attention dropout after the softmax is its own kernel): see
  ``fused_kernels`` and ``fuse_pointwise`` in :mod:`dml2comm.cost.ops`.

Calibration: the A100's sustained GEMM factor (:data:`dml2comm.cost.gemm.SUSTAINED_FACTOR`) is
fitted on the bundled A100 training-step sets together (Narayanan et al. 2021 Table 1, vTrain's
single-node runs, Korthikanti et al. 2022 Table 4; ``benchmarks/fit_a100.py``, ``python main.py
validate`` for every source's error and its leave-one-source-out error), checked on held-out runs
by ``benchmarks/bench_heldout.py``.
"""

from __future__ import annotations

from dml2comm.cost.calibrated import class_value
from dml2comm.ops.registry import OpCost
from dml2comm.parallel.config import Optimizer, Precision, Stack

__all__ = ["eager_accumulate_grad_s", "shared_gradient_sum_s", "grad_accumulation_s", "hbm_efficiency_of", "roofline_s", "op_times_s", "optimizer_bytes_per_param", "optimizer_step_s", "FUSED_ADAMW_HBM_EFFICIENCY", "GRAD_NORM_BYTES_PER_PARAM", "UNSCALE_BYTES_PER_PARAM", "gemm_dims", "FLOP_EFFICIENCY",
           "HBM_EFFICIENCY"]

#: Share of the dense peak reached by FLOP-bound work outside the GEMM model (fused point-wise
#: kernels, Einsum and fused-attention ops, GEMMs on a GPU without an SM count).  This was the
#: fitted ``GEMM_E_MAX`` of the earlier one-constant GEMM model (``E_MAX x tile x wave``, fitted
#: to Narayanan et al. 2021 Table 1); it is kept at that value, not refitted, for these
#: secondary kernels (on the bundled GPT runs they are memory-bound, so it rarely matters).
#: For scale: cuBLAS FP16/BF16 GEMMs of a few thousand per side reach about 230-260 of
#: 312 TFLOP/s on A100 when timed alone (0.74-0.83).
FLOP_EFFICIENCY = 0.685
#: Achieved share of HBM bandwidth for streaming kernels (STREAM-like copies on A100 reach
#: about 1.7-1.8 TB/s of 2.04 TB/s; e.g. the "GPU-STREAM"/BabelStream A100 results).
HBM_EFFICIENCY = 0.85


def hbm_efficiency_of(gpu, kind: str = "pointwise") -> float:
    """The share of HBM bandwidth memory-bound kernels of class ``kind`` (``pointwise`` or
    ``norm``: :mod:`dml2comm.cost.calibrated`) reach on ``gpu``: the class's calibrated value
    (``python main.py calibrate``, :attr:`dml2comm.hardware.gpus.GPU.calibrated_classes`), else the
    GPU's single calibrated value (:attr:`~dml2comm.hardware.gpus.GPU.hbm_efficiency`, files
    written before the classes), else :data:`HBM_EFFICIENCY`."""
    own = class_value(gpu, kind)
    if own is not None:
        return own
    return gpu.hbm_efficiency if gpu.hbm_efficiency is not None else HBM_EFFICIENCY


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


def optimizer_bytes_per_param(optimizer: str, dtype_bytes: int, precision: Precision | str = Precision.MIXED) -> int:
    """HBM bytes the optimizer step's update moves per (locally held) parameter.

    ``mixed``, Adam/AdamW (Kingma & Ba 2015, Alg. 1; state layout of Rajbhandari et al. 2020,
    Sec. 3.1, K = 12): read the gradient (``dtype_bytes``) and the fp32 master weight, momentum
    and variance (12), write those three back (12) and the 16-bit weight copy
    (``dtype_bytes``).  In fp32 training there is no separate copy: 4 + 12 + 12.  SGD with
    momentum: gradient + master weight and momentum read (8) and written (8), plus the 16-bit
    copy.

    ``amp`` and ``bf16`` run PyTorch's fused optimizer on the parameters as they are held
    (:func:`dml2comm.cost.memory.state_bytes_per_param`): ``AdamW(fused=True)`` reads param,
    grad, exp_avg and exp_avg_sq and writes param, exp_avg and exp_avg_sq in place
    (aten/src/ATen/native/cuda/fused_adam_utils.cuh, ``FusedAdamMathFunctor``: loads 4, stores
    3), i.e. 7 elements: 28 bytes in fp32 (``amp``), 14 in bf16.  SGD with momentum: param,
    grad, momentum read, param and momentum written, 5 elements.
    """
    precision, adam = Precision.of(precision), Optimizer.of(optimizer).is_adam
    if precision is Precision.MIXED:
        copy = dtype_bytes if dtype_bytes < 4 else 0
        grad = dtype_bytes
        if adam:
            return grad + 12 + 12 + copy
        return grad + 8 + 8 + copy
    element = 4 if precision is Precision.AMP else dtype_bytes
    return element * (7 if adam else 5)


#: Megatron-LM's optimizer step besides the update (``MixedPrecisionOptimizer.step`` /
#: ``FP32Optimizer.step``, megatron/core/optimizer/optimizer.py), as named per-parameter HBM
#: traffic on the parameters this GPU updates: the gradient clipping norm
#: (``clip_grad_norm_fp32``: ``multi_tensor_l2norm`` reads each fp32 main gradient once;
#: ``--clip-grad 1.0`` in Megatron-LM's GPT scripts; the scaling pass after it runs only when the
#: norm exceeds the clip and is not counted) ...
GRAD_NORM_BYTES_PER_PARAM = 4
#: ... and, with fp16 loss scaling only, unscaling the main gradients and checking them for
#: inf/NaN (``_unscale_main_grads_and_check_for_nan``: ``torch._amp_foreach_non_finite_check_and_unscale_``
#: reads and writes each fp32 main gradient; ``torch.amp.GradScaler.unscale_`` runs the same op
#: on AMP's fp32 gradients).
UNSCALE_BYTES_PER_PARAM = 8

#: Share of the HBM bandwidth PyTorch's fused AdamW reaches, by the element size of its
#: parameters and states (bytes -> share), measured on one H100 SXM (3.35 TB/s): one
#: ``torch.optim.AdamW(fused=True)`` step over 1.2 B bf16 parameters took 7.458 ms (14 B x 1.2e9
#: / 7.458 ms = 2.25 TB/s, 0.672) and over 500 M fp32 ones 5.335 ms (28 B x 5e8 / 5.335 ms =
#: 2.62 TB/s, 0.783) (shared/data/gpu_measured/h100/kernels.json ``misc``, the largest size per
#: dtype).  The kernel moves 4 elements per thread per iteration (``kILP = 4``,
#: aten/src/ATen/native/cuda/MultiTensorApply.cuh), so 2-byte elements keep half as many bytes
#: in flight as 4-byte ones and reach a lower share.  The 124 M-parameter rows check it:
#: fp32 1.325 ms predicted for 1.359 measured (-2.5%); bf16 0.771 ms for 0.993 (-22%: that
#: row, the first of the four to run, reached 1.75 TB/s, which the bytes do not explain).
FUSED_ADAMW_HBM_EFFICIENCY = {2: 0.672, 4: 0.783}


def optimizer_step_s(params_local: float, optimizer: str, dtype_bytes: int, hbm_bytes_per_s: float, loss_scaled: bool = False,
                     precision: Precision | str = Precision.MIXED) -> float:
    """Memory-bound optimizer step for ``params_local`` parameters on one GPU.

    ``mixed`` (Megatron-LM): the gradient norm pass (:data:`GRAD_NORM_BYTES_PER_PARAM`), the fp16
    unscale pass when ``loss_scaled`` (:data:`UNSCALE_BYTES_PER_PARAM`) and the update
    (:func:`optimizer_bytes_per_param`), at the full ``hbm_bytes_per_s``.  ``amp`` / ``bf16``
    (PyTorch): the fused AdamW update at :data:`FUSED_ADAMW_HBM_EFFICIENCY` of
    ``hbm_bytes_per_s``, plus ``GradScaler``'s unscale pass when ``loss_scaled`` (fp16); no
    gradient clipping (a bare ``opt.step()``, as the measured steps ran; Hugging Face's
    ``Trainer`` clips at ``max_grad_norm=1.0`` with one more pass over the gradients).
    """
    precision = Precision.of(precision)
    update = optimizer_bytes_per_param(optimizer, dtype_bytes, precision)
    if precision is Precision.MIXED:
        per_param = update + GRAD_NORM_BYTES_PER_PARAM + (UNSCALE_BYTES_PER_PARAM if loss_scaled else 0)
        return params_local * per_param / hbm_bytes_per_s
    element = 4 if precision is Precision.AMP else dtype_bytes  # bf16 runs with --dtype bf16 only (ParallelConfig)
    seconds = params_local * update / (hbm_bytes_per_s * FUSED_ADAMW_HBM_EFFICIENCY[element])
    if loss_scaled:
        seconds += params_local * UNSCALE_BYTES_PER_PARAM / hbm_bytes_per_s
    return seconds


def grad_accumulation_s(params: float, grad_bytes: int, main_grad_bytes: int, hbm_bytes_per_s: float) -> float:
    """Per micro-batch: adding ``params`` fresh weight gradients into their accumulation buffer.

    Megatron-LM's data-parallel wrapper accumulates every parameter's gradient into its
    ``main_grad`` buffer in a backward hook, once per micro-batch (``param.main_grad.add_(
    param.grad.data)``: megatron/core/distributed/distributed_data_parallel.py,
    ``_make_backward_post_hook``; ``megatron/model/distributed.py`` in the 2021 code): read the
    gradient (``grad_bytes``) and the buffer (``main_grad_bytes``), write the buffer back.  With
    ``--gradient-accumulation-fusion`` (Megatron-LM's default since 2022, ParallelConfig.
    grad_accumulation_fusion) the weight-gradient GEMM of every linear layer accumulates into
    ``main_grad`` itself and the hook skips it (``grad_added_to_main_grad``); the other
    parameters (layer norms, biases, embedding tables) still take this pass.
    """
    return params * (grad_bytes + 2 * main_grad_bytes) / hbm_bytes_per_s


def shared_gradient_sum_s(summed_elements, config, hbm_bytes_per_s: float):
    """Per micro-batch: autograd summing the gradients of a parameter that several layers of one
    stage read (a tied embedding: the LM head's weight gradient and the embedding's), read both,
    write one (3 x the gradient's bytes per element summed).

    The engine adds every later gradient of one input into the first in its ``InputBuffer``
    before ``AccumulateGrad`` runs (torch/csrc/autograd/input_buffer.cpp, ``InputBuffer::add``).
    Megatron-LM with gradient-accumulation fusion has no such sum: the LM head's weight-gradient
    GEMM adds into ``main_grad`` itself and hands autograd no weight gradient
    (``LinearWithGradAccumulationAndAsyncCommunication``), so the caller charges this under the
    ``pytorch`` stack and under Megatron without the fusion only (0 otherwise).  The gradient is fp32 under
    ``amp`` (the embedding reads the fp32 weight; the head's cast returns fp32), else the training
    dtype.  Measured on H100 (benchmarks/data/h100 traces): the ``CUDAFunctor_add`` of GPT-2
    small's 50,257 x 768 bf16 table takes 76 us (3.0 TB/s), Llama-1B's 128,256 x 2,048 510 us.
    """
    if config.stack is not Stack.PYTORCH and config.grad_accumulation_fusion:
        return summed_elements * 0.0
    element = 4 if config.precision is Precision.AMP else config.train_dtype.itemsize
    return summed_elements * 3 * element / hbm_bytes_per_s


def eager_accumulate_grad_s(params: float, precision: str, num_micro_batches: int, hbm_bytes_per_s: float) -> float:
    """Backward seconds per micro-batch of eager PyTorch's ``AccumulateGrad`` (``--stack
    pytorch``): from the second micro-batch on, each fresh gradient is added into ``.grad`` (read
    both, write one: 3 x the gradient's bytes, fp32 under amp, 16-bit in bf16, the 16-bit gradient
    into an fp32 buffer in mixed); with one micro-batch the fresh gradient is stolen, no pass
    (torch/csrc/autograd/functions/accumulate_grad.h, ``accumulateGrad``).  Averaged over the
    ``num_micro_batches`` micro-batches of a step.  AMP's weight casts are the ops' own
    (:func:`dml2comm.cost.ops.autocast_cast_costs`)."""
    later = (num_micro_batches - 1) / num_micro_batches if num_micro_batches > 1 else 0.0
    precision = Precision.of(precision)
    if precision is Precision.AMP:
        moved = later * params * 3 * 4
    elif precision is Precision.BF16:
        moved = later * params * 3 * 2
    else:  # mixed: 16-bit gradients into fp32 main gradients
        moved = later * params * (2 + 2 * 4)
    return moved / hbm_bytes_per_s
