"""Measured collectives against the network model, costed as ``python main.py collective
--cluster NAME --n N --size S`` costs them (:func:`~dml2comm.network.model.collective_cost_for_group`
on the preset built with N GPUs, ranks 0..N-1, the preset's per-call overhead).

- ``nccl``: NCCL all-reduce lookup tables measured by the vTrain authors on one DGX A100 and one
  DGX-1 V100 (2-8 GPUs, 64 MiB-1 GiB, float32): A100 -> ``dgx-a100``, V100 -> ``dgx-v100``
  (``benchmarks/bench_collectives.py`` prints the same rows with the protocol chosen and the
  previous baseline; ``benchmarks/bench_nccl_baseline.py`` the textbook ring).
- ``xla_collectives``: OpenXLA's measured H100 table (8 GPUs of one node, replica groups of 2, 4
  or 8, 1 KiB-2 GiB, float32) -> ``dgx-h100``.  ``message_bytes`` follows the nccl-tests size
  convention the tool uses (all-gather: the output; reduce-scatter: the input; all-to-all: one
  rank's buffer).  XLA runs the 8 / n groups at once; inside an NVSwitch node they share no
  link, so one group of n is costed.  XLA timed the executable on the GPU (``compute_time_ns`` of
  its execution profile, median of the runs: openxla/xla ``xla/tools/collective_perf_table_gen.cc``
  ``GetMedianRuntimeNs``), not through PyTorch, so the preset's per-call overhead (51.5 us, the
  PyTorch path of vTrain's A100 measurements) is replaced by :data:`XLA_CALL_OVERHEAD_S`
  (``collective --cluster dgx-h100 --overhead 20us`` costs the same).
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass, replace

from dml2comm.hardware.cluster import get_cluster
from dml2comm.network.kinds import CollectiveKind
from dml2comm.network.model import collective_cost_for_group
from dml2comm.validate.cases import Case, sample_indices
from dml2comm.validate.data import read_csv

__all__ = ["NCCL_FILE", "PRESET_FOR_GPU", "XLA_CALL_OVERHEAD_S", "XLA_FILE", "XLA_KINDS", "XLA_SOURCE", "MeasuredCollective",
           "nccl_cases", "nccl_rows", "predict", "xla_cases", "xla_rows"]

NCCL_FILE = "nccl_allreduce_measured.csv"
XLA_FILE = "xla_collectives_h100.csv"
#: GPU of a measurement -> the cluster preset of its node.
PRESET_FOR_GPU = {"A100": "dgx-a100", "V100": "dgx-v100", "H100": "dgx-h100"}
#: OpenXLA opcode -> kind.
XLA_KINDS = {"all-reduce": CollectiveKind.ALL_REDUCE, "all-gather": CollectiveKind.ALL_GATHER,
             "reduce-scatter": CollectiveKind.REDUCE_SCATTER, "all-to-all": CollectiveKind.ALL_TO_ALL}
MIB = 2**20
#: ``source`` of the OpenXLA rows.
XLA_SOURCE = "OpenXLA default_collective_perf_table"
#: Fixed time per call of XLA's measurement (launching the executable and its collective thunk
#: on the GPU, beyond NCCL's own base latency), seconds: fitted, with the H100 link constants,
#: on the groups of 2 and 8 of the bundled table (``benchmarks/fit_h100_collectives.py``; the
#: groups of 4 are held out).
XLA_CALL_OVERHEAD_S = 20e-6


@dataclass(frozen=True)
class MeasuredCollective:
    """One measured collective: ``size_bytes`` in the nccl-tests convention, ``time_s`` measured;
    ``busbw_bytes_per_s`` where the source gives it; ``source`` the file it came from."""

    gpu: str
    kind: CollectiveKind
    ranks: int
    size_bytes: int
    time_s: float
    busbw_bytes_per_s: float | None
    source: str

    @property
    def preset(self) -> str:
        return PRESET_FOR_GPU[self.gpu]


def nccl_rows(path: str | os.PathLike[str] | None = None) -> list[MeasuredCollective]:
    """The single-node rows of the NCCL all-reduce tables (the bundled file, or ``path`` in its
    format) whose GPU has a preset."""
    if path is None:
        records = read_csv(NCCL_FILE)
    else:
        with open(path, newline="") as handle:
            records = list(csv.DictReader(handle))
    out = []
    for rec in records:
        if rec["gpu"] not in PRESET_FOR_GPU or rec["scope"] != "single node":
            continue
        out.append(MeasuredCollective(rec["gpu"], CollectiveKind.ALL_REDUCE, int(rec["ranks"]), int(rec["size_bytes"]),
                                      float(rec["time_us"]) * 1e-6, float(rec["busbw_GBps"]) * 1e9, rec["source"]))
    return out


def xla_rows() -> list[MeasuredCollective]:
    """The bundled H100 rows (all-reduce, all-gather, reduce-scatter, all-to-all)."""
    out = []
    for rec in read_csv(XLA_FILE):
        kind = XLA_KINDS.get(rec["opcode"])
        if kind is None or rec["gpu_name"] not in PRESET_FOR_GPU:
            continue
        out.append(MeasuredCollective(rec["gpu_name"], kind, int(rec["num_devices_per_group"]), int(rec["message_bytes"]),
                                      float(rec["derived_time_us"]) * 1e-6, None, XLA_SOURCE))
    return out


def predict(row: MeasuredCollective):
    """The tool's :class:`~dml2comm.network.collectives.CollectiveCost` of ``row``, as the
    ``collective --cluster`` command costs it (for the OpenXLA rows, with ``--overhead`` set to
    :data:`XLA_CALL_OVERHEAD_S`: module docstring)."""
    cluster = get_cluster(row.preset, row.ranks)
    if row.source == XLA_SOURCE:
        cluster = replace(cluster, collective_overhead_s=XLA_CALL_OVERHEAD_S)
    return collective_cost_for_group(cluster, row.kind, list(range(row.ranks)), float(row.size_bytes))


def _size(b: int) -> str:
    if b >= 1024 * MIB:
        return f"{b / (1024 * MIB):g}GiB"
    return f"{b / MIB:g}MiB" if b >= MIB else f"{b / 1024:g}KiB"


def _cases(source: str, rows: list[MeasuredCollective], sample: int | None) -> list[Case]:
    out = []
    for i in sample_indices(len(rows), sample):
        r = rows[i]
        # (op, group size) is a subset of its own: the H100 target is a mean per (op, group)
        tags = (r.gpu, f"{r.kind.value.lower()}/n{r.ranks}") + ((">=16MiB",) if r.size_bytes >= 16 * MIB else ())
        case_id = f"{r.gpu}/{r.kind.value.lower()}/n{r.ranks}/{_size(r.size_bytes)}"
        out.append(Case(source, case_id, "collective_time_s", r.time_s, predict(r).time_s,
                        f"{r.preset} {r.kind.value} n={r.ranks} size={r.size_bytes}", tags))
    return out


def nccl_cases(sample: int | None = None, compute_scale: float = 1.0) -> list[Case]:
    """One case per measured NCCL all-reduce (the compute constant plays no part)."""
    return _cases("nccl", nccl_rows(), sample)


def xla_cases(sample: int | None = None, compute_scale: float = 1.0) -> list[Case]:
    """One case per measured H100 collective (the compute constant plays no part)."""
    return _cases("xla_collectives", xla_rows(), sample)
