"""This project's measured H100 GEMMs (PyTorch 2.11, cuBLAS) against the GEMM model.

``data/h100_kernels_measured.json`` (provenance in ``data/PROVENANCE.md``) holds 140
``nn.Linear`` shapes ``x [M, K] @ W[N, K]^T``, each timed in the three layouts autograd runs:
``fwd`` (``x @ W^T``), ``dgrad`` (``g @ W``) and ``wgrad`` (``g^T @ x``).  Each layout is one
case: the GEMM of :func:`dml2comm.cost.gemm.training_gemms` for that layer (``forward``,
``data_grad``, ``weight_grad``: what the analysis times for a MatMul) costed by
:func:`dml2comm.cost.gemm.gemm_time_s` on the ``h100`` preset in bf16, against the measured
seconds per call.

These shapes are the ones :data:`dml2comm.cost.gemm.H100_SHAPE_LAW`, the H100's sustained
factor and :data:`dml2comm.cost.gemm.UNALIGNED_RATE` are fitted on: the errors here are
in-sample.  ``benchmarks/fit_h100_gemm.py`` refits them leaving one ``(M, N, K)`` row (its three
layouts) out at a time and prints the held-out errors.

Tags: ``>=1GFLOP`` (2 M N K of at least 1e9: every row), ``unaligned`` / ``aligned``
(:func:`dml2comm.cost.gemm.is_aligned`; the six rows with N = 50,257), and the layout.
"""

from __future__ import annotations

import dataclasses
from types import MappingProxyType
from typing import NamedTuple

from dml2comm.cost import gemm as cost_gemm
from dml2comm.hardware.gpus import get_gpu
from dml2comm.validate.cases import Case, sample_indices
from dml2comm.validate.data import read_json

__all__ = ["FILE", "LAYOUTS", "MeasuredGemm", "cases", "measured_gemms"]

FILE = "h100_kernels_measured.json"
#: The measurement's layout names and the :class:`dml2comm.cost.gemm.TrainingGemms` field each is.
LAYOUTS = (("fwd", "forward"), ("dgrad", "data_grad"), ("wgrad", "weight_grad"))
GFLOP = 1e9


class MeasuredGemm(NamedTuple):
    """One measured GEMM: the layer ``(M, N, K)``, the layout, its GEMM shape as
    :func:`~dml2comm.cost.gemm.training_gemms` gives it, and the measured seconds per call."""

    layer: tuple[int, int, int]
    layout: str
    shape: cost_gemm.GemmShape
    seconds: float


def measured_gemms() -> list[MeasuredGemm]:
    """Every measured GEMM, rows in file order, the three layouts of a row together."""
    out = []
    for row in read_json(FILE)["gemm"]:
        m, n, k = int(row["M"]), int(row["N"]), int(row["K"])
        shapes = cost_gemm.training_gemms("MatMul", (m, k), (k, n))
        for layout, field in LAYOUTS:
            out.append(MeasuredGemm((m, n, k), layout, getattr(shapes, field), float(row[f"{layout}_s"])))
    return out


def cases(sample: int | None = None, compute_scale: float = 1.0) -> list[Case]:
    """One case per measured GEMM (``compute_scale`` multiplies the H100's dense peaks, as
    :func:`~dml2comm.validate.cases.scaled_cluster` scales the sustained factor)."""
    h100 = cost_gemm.gemm_device(get_gpu("h100"))
    if compute_scale != 1.0:
        h100 = dataclasses.replace(h100, peak_flops_per_s=MappingProxyType(
            {key: value * compute_scale for key, value in h100.peak_flops_per_s.items()}))
    rows = measured_gemms()
    out = []
    for i in sample_indices(len(rows), sample):
        (m, n, k), layout, shape, seconds = rows[i]
        aligned = cost_gemm.is_aligned("bf16", *shape)
        tags = ((">=1GFLOP",) if shape.flops >= GFLOP else ()) + ("aligned" if aligned else "unaligned", layout)
        out.append(Case("h100-gemm", f"{layout}_M{m}_N{n}_K{k}", "gemm_time_s", seconds,
                        cost_gemm.gemm_time_s(h100, "bf16", *shape),
                        f"H100 bf16 nn.Linear [{m},{k}]x[{n},{k}]^T {layout}: GEMM b,M,N,K = {tuple(shape)}", tags))
    return out
