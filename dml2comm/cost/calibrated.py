"""Kernel classes a calibrated GPU carries its own values for, and the one reader of them.

``python main.py calibrate`` (:mod:`dml2comm.calibrate`) fits one value per kernel class on the
user's traces and keeps it only where it beats the base model on held-out shapes; the cluster
file stores the kept values as ``gpu.calibrated_classes``
(:attr:`dml2comm.hardware.gpus.GPU.calibrated_classes`).  Every cost term reads its class's value
through :func:`class_value` (the analysis, the sweep and the site share those terms):

==================  ===================================  ==========================================
class               value                                read by
==================  ===================================  ==========================================
``gemm_large``      sustained factor ``f_gpu`` of the    :func:`dml2comm.cost.gemm.gemm_time_s`
                    shape law, aligned GEMMs of at
                    least :data:`GEMM_SMALL_FLOPS`
``gemm_small``      the same, aligned GEMMs below it     (the law's latency and tail wave rule them)
``gemm_unaligned``  the same, 16-bit GEMMs whose rows    (the law's fallback at ``UNALIGNED_RATE``)
                    are not 16-byte multiples
``conv``            the same, convolutions' implicit     (cuDNN, not cuBLAS)
                    GEMMs
``attention_fwd``   time scale of the flash forward      :func:`dml2comm.cost.ops.flash_core_costs`
``attention_bwd``   time scale of the flash backward     (:func:`dml2comm.cost.attention.flash_times_s`)
``pointwise``       HBM efficiency of element-wise ops   :func:`dml2comm.cost.compute.hbm_efficiency_of`
``norm``            HBM efficiency of normalisation,     the roofline of those ops
                    softmax, reductions, the loss        (:data:`NORM_OPS`) and the loss; under
                                                         ``--stack pytorch`` not LayerNorm/RMSNorm
``layer_norm``      time scale of eager PyTorch's        :func:`dml2comm.cost.ops.op_costs`
                    LayerNorm/RMSNorm kernels            (:func:`dml2comm.cost.norm.op_norm_times_s`,
                                                         ``--stack pytorch``)
``optimizer``       time scale of the fused optimizer    :func:`dml2comm.cost.compute.optimizer_step_s`
==================  ===================================  ==========================================

The GEMM regimes are the ones the shape law (:mod:`dml2comm.cost.gemm`) itself tells apart:
below about 1 GFLOP a GEMM's time is the law's fixed latency and partial last wave rather than
its rate (the threshold the GEMM model reports its residuals at), an unaligned GEMM runs cuBLAS's
fallback kernel at a fitted fraction of the rate, and a convolution is cuDNN's implicit GEMM.  A
GEMM class's value applies only inside the range of GEMM shapes it was fitted on (its key names
the range of ``min(M, N, K)``, ``gemm_large@768..2048``; :func:`class_value`): a factor fitted
on a 768-wide model says nothing about a 2,048-wide one, and a GEMM outside every fitted range
keeps the base law.  A class without a value falls back to the GPU's single calibrated field (``gemm_sustained_factor``,
``hbm_efficiency``: files written before the classes) and then to the preset's model.
"""

from __future__ import annotations

from typing import Any

from dml2comm.hardware.gpus import CALIBRATED_CLASSES as CLASSES, base_gpu_name, parse_class_key, regime_key

__all__ = ["preset_of", "CLASSES", "GEMM_CLASSES", "MEMORY_CLASSES", "SCALE_CLASSES", "NORM_OPS", "GEMM_SMALL_FLOPS", "class_value",
           "gemm_regime", "regime_key", "parse_class_key"]

GEMM_CLASSES = ("gemm_large", "gemm_small", "gemm_unaligned", "conv")
MEMORY_CLASSES = ("pointwise", "norm")
SCALE_CLASSES = ("attention_fwd", "attention_bwd", "layer_norm", "optimizer")

#: GEMMs below this many FLOPs (``2 b M N K``) form the ``gemm_small`` regime: their time is the
#: shape law's fixed latency and partial wave, not its rate (the threshold dml2comm/cost/gemm.py
#: reports the law's residuals at, and the old single fit left them out).
GEMM_SMALL_FLOPS = 1e9

#: ONNX ops of the ``norm`` class: normalisations, softmaxes and reductions (PyTorch runs them as
#: block-reduction kernels, ``vectorized_layer_norm_kernel``, ``cunn_SoftMaxForward``,
#: ``reduce_kernel``, which reach a lower share of the HBM bandwidth than element-wise ones).
NORM_OPS = frozenset({"LayerNormalization", "SimplifiedLayerNormalization", "RMSNormalization", "SkipLayerNormalization",
                      "GroupNormalization", "InstanceNormalization", "BatchNormalization", "Softmax", "LogSoftmax",
                      "ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL2", "ReduceSumSquare",
                      "ReduceLogSumExp", "CumSum", "ArgMax", "ArgMin"})


def class_value(gpu: Any, name: str, smallest_dim: int | None = None) -> float | None:
    """The calibrated value of kernel class ``name`` on ``gpu`` (a preset, a calibrated GPU or a
    :class:`dml2comm.cost.gemm.GemmDevice`), None when it has none.

    A GEMM class's values may be per regime (key ``gemm_large@768..2048``,
    :func:`dml2comm.hardware.gpus.regime_key`): the value whose range holds the GEMM's smallest
    dimension ``smallest_dim`` answers; a GEMM outside every range gets the class's plain value
    (files written before the regimes) or None (the base law)."""
    values = getattr(gpu, "calibrated_classes", None)
    if not values:
        return None
    if smallest_dim is not None:
        for key, value in values.items():
            cls, rng = parse_class_key(key)
            if cls == name and rng is not None and rng[0] <= smallest_dim <= rng[1]:
                return value
    return values.get(name)


def gemm_regime(flops: float, aligned: bool, conv: bool = False) -> str:
    """The GEMM class of a product of ``flops`` FLOPs (module docstring)."""
    if conv:
        return "conv"
    if not aligned:
        return "gemm_unaligned"
    return "gemm_small" if flops < GEMM_SMALL_FLOPS else "gemm_large"


def preset_of(gpu_name: str) -> str:
    """The preset a GPU name stands for: ``calibrate`` names a calibrated GPU after its base
    preset with a hash of its values (``H100-SXM5-80GB cal-1a2b3c4d``), and the per-GPU fitted laws
    keyed by preset name (the H100's GEMM shape law and sustained factor, its measured tables)
    still describe that silicon for every class the calibration left at the base."""
    return base_gpu_name(gpu_name)
