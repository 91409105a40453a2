"""Eager PyTorch's column sums: the reduction autograd runs to sum a gradient onto a broadcast operand
(``sum_to``), a linear layer's bias gradient (``grad.sum(0)`` in ``addmm``'s and ``AddBackward0``'s
backward) or a norm's weight gradient written as primitives (``x_hat * w``'s ``MulBackward0``).

``--stack pytorch`` runs them as ``at::native::reduce_kernel`` (``aten/src/ATen/native/cuda/
Reduce.cuh``): a reduction over the rows of a row-major ``[rows, cols]`` gradient into ``cols``
outputs, the reduced dimension not the contiguous one.  The bundled H100 traces show it far from
the memory-bound rate: GPT-2 small's 768-wide bias gradients of 2,048 and 8,192 rows take 9.2 and
17.9 us, 0.3-0.7 TB/s where the roofline's 85% of the HBM bandwidth gives 2.8 TB/s; the 30,522-wide
gradient of BERT's output bias reaches 2.6 TB/s.  ``Reduce.cuh`` gives each thread four adjacent
outputs (``vectorize_output``) and splits the rows over blocks that accumulate partial sums in
global memory behind a semaphore (``ctas_per_output``), the last block of each output finishing the
sum: a fixed cost for the two-phase accumulation, the bytes at a share of the HBM bandwidth, and a
cost per row walked that few columns cannot spread over the GPU.

Time :func:`column_sum_s` = ``latency_s + bytes / (hbm_share x HBM) + rows x row_s x 132 / SMs``
(the per-row cost measured on the H100's 132 SMs, shared by more blocks on a GPU with more).
Fitted by ``benchmarks/fit_column_sum.py`` on the bundled H100 traces' bf16 column sums
(``benchmarks/data/column_sums.csv``: GPT-2 small's bias gradients at 2,048 and 8,192 rows, BERT's
at 8,192 and 16,384, ResNet-18's classifier's at 128 and 256: 5.0% mean error, 8.1% leaving each
shape out); that script prints the in-sample and leave-one-shape-out errors and the H200 traces'
column sums, predicted from the H100 constants and the H200's bandwidth.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["ColumnSumLaw", "H100_COLUMN_SUM", "REFERENCE_SMS", "column_sum_s"]

#: The SMs of the GPU the per-row cost was measured on (H100 SXM5).
REFERENCE_SMS = 132


class ColumnSumLaw(NamedTuple):
    """Constants of :func:`column_sum_s` (module docstring)."""

    latency_s: float  #: fixed time of one column sum (launch, the partial sums' second phase)
    hbm_share: float  #: share of the GPU's kernel HBM bandwidth the bytes stream at
    row_s: float  #: time per row walked, on :data:`REFERENCE_SMS` SMs


#: Fitted by ``benchmarks/fit_column_sum.py`` (module docstring).
H100_COLUMN_SUM = ColumnSumLaw(latency_s=7.0e-6, hbm_share=0.81, row_s=0.7e-9)


def column_sum_s(rows: int, cols: int, itemsize: int, hbm_bytes_per_s: float, sm_count: int | None,
                 law: ColumnSumLaw = H100_COLUMN_SUM) -> float:
    """Seconds of one eager column sum of a ``[rows, cols]`` gradient of ``itemsize`` bytes per
    element into ``cols`` outputs (module docstring): ``hbm_bytes_per_s`` the GPU's kernel HBM
    bandwidth, ``sm_count`` its SMs (None: :data:`REFERENCE_SMS`)."""
    sms = sm_count or REFERENCE_SMS
    return law.latency_s + rows * cols * itemsize / (law.hbm_share * hbm_bytes_per_s) + rows * law.row_s * REFERENCE_SMS / sms
