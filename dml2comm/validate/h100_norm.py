"""This project's measured H100 LayerNorms (PyTorch 2.11, bf16), as the eager norm law reads them.

``data/h100_kernels_measured.json`` (provenance in ``data/PROVENANCE.md``), ``misc`` rows
``layernorm_gelu_copy``: ``F.layer_norm`` over ``[M, h]`` with weight and bias, its forward timed
from a CUDA graph (``ln_fwd_s``: the one forward kernel) and forward+backward from 20 calls queued
between two events (``ln_fwd_bwd_s``, ``x``, weight and bias leaves that need gradients).  That
second figure holds more than the LayerNorm's three kernels: autograd accumulates each call's
gradients into the leaves' ``.grad`` (``AccumulateGrad``: an in-place add over ``[M, h]``, read 2
and write 1, and two adds over ``h``), and where the host's dispatch of the eager forward and
``backward()`` outlasts the kernels the queue runs empty.  :func:`measured_norms` removes the adds
(the ``[M, h]`` one at the copy rate the same row measured, ``copy_4h_bytes / copy_4h_s``; the two
small ones at :data:`SMALL_KERNEL_S` each); the first row (``h = 768``, 143.7 us against 70 us of
LayerNorm kernels in the GPT-2 trace) is host-bound and its backward is taken from the trace
instead (:data:`GPT2_TRACE_KERNELS_S`).
"""

from __future__ import annotations

from typing import NamedTuple

from dml2comm.validate.data import read_json

__all__ = ["FILE", "GPT2_TRACE_KERNELS_S", "GPT2_TRACE_SHAPE", "SMALL_KERNEL_S", "HOST_BOUND", "MeasuredNorm", "measured_norms"]

FILE = "h100_kernels_measured.json"
#: The LayerNorm shape of the bundled GPT-2 small trace (b 8 x s 1,024 rows of width 768) and the
#: median duration of its 25 calls of each kernel, seconds (read by ``benchmarks/fit_h100_norm.py``
#: from ``benchmarks/data/h100/trace_gpt2-small_bf16_b8.json.gz``, which prints them again).
GPT2_TRACE_SHAPE = (8192, 768)
GPT2_TRACE_KERNELS_S = {"forward": 19.30e-6, "grad_input": 16.58e-6, "gamma_beta": 33.79e-6}
#: One tiny element-wise kernel in a queue (the weight's and the bias's ``.grad`` adds over ``h``
#: elements): the GPT-2 trace's kernels over a few thousand elements run 1.0-1.7 us
#: (``arange``, ``fill_``, the ``long`` add); 1.5 us.
SMALL_KERNEL_S = 1.5e-6
#: Rows whose forward+backward figure is host-bound (module docstring): (M, h).
HOST_BOUND = frozenset({(8192, 768)})


class MeasuredNorm(NamedTuple):
    """One measured LayerNorm ``[rows, width]`` bf16: the forward kernel's seconds and the two
    backward kernels' seconds (grad-input + gamma/beta), as :func:`measured_norms` derives them;
    ``extra_s`` is what the queued forward+backward figure holds besides (the ``.grad`` adds)."""

    rows: int
    width: int
    forward_s: float
    backward_s: float
    fwd_bwd_s: float
    extra_s: float
    source: str


def measured_norms() -> list[MeasuredNorm]:
    """Every measured LayerNorm shape, in file order (module docstring)."""
    out = []
    for row in read_json(FILE)["misc"]:
        if row.get("op") != "layernorm_gelu_copy":
            continue
        m, h = int(row["M"]), int(row["h"])
        copy_rate = float(row["copy_4h_bytes"]) / float(row["copy_4h_s"])
        extra = 3 * m * h * 2 / copy_rate + 2 * SMALL_KERNEL_S
        fwd, both = float(row["ln_fwd_s"]), float(row["ln_fwd_bwd_s"])
        if (m, h) in HOST_BOUND:
            t = GPT2_TRACE_KERNELS_S
            out.append(MeasuredNorm(m, h, fwd, t["grad_input"] + t["gamma_beta"], both, extra, "gpt2 trace (backward)"))
        else:
            out.append(MeasuredNorm(m, h, fwd, both - fwd - extra, both, extra, "kernels.json"))
    return out
