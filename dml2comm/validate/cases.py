"""Cases, sources and error statistics of the validation.

A :class:`Case` is one published measurement next to the tool's prediction of the same
quantity; its error is ``predicted / measured - 1`` (signed: below zero the tool predicts less
than was measured, i.e. too fast for a time, too slow for a throughput).  A :class:`Source` is one
bundled measurement set and the module that predicts its cases.

The fitted compute constant
---------------------------
The number the bundled A100 training-step sets bear on is the A100's sustained GEMM factor
``f`` (``SUSTAINED_FACTOR`` in :mod:`dml2comm.cost.gemm`, fitted on them by
``benchmarks/fit_a100.py``).  The A100 has no measured GEMM table: a GEMM's time is its tiles'
main loops and fixed costs over ``peak x f x shape terms``, plus a fixed per-kernel latency, or
its memory floor.  :func:`scaled_cluster` evaluates with ``f x s`` exactly: it gives a copy of the
cluster's GPU the calibrated factor ``f x s`` (:attr:`dml2comm.hardware.gpus.GPU.gemm_sustained_factor`,
the field ``calibrate`` fills), so no module global is touched and caches keyed by the GPU stay
correct.  Every GEMM's time less its latency scales by ``1/s`` unless it is memory-bound; the
other kernels do not change.  (A GPU with a measured table leaves it for the analytical law when
given a factor: only the table-less A100 is refitted.)
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np

from dml2comm.cost.gemm import sustained_factor
from dml2comm.hardware.cluster import Cluster

__all__ = ["Case", "Source", "SOURCES", "sample_indices", "scaled_cluster", "summarize"]


@dataclass(frozen=True)
class Case:
    """One measurement and the tool's prediction of it.

    ``case_id`` is unique within its source; ``quantity`` names what is compared with its unit
    (``iteration_time_s``, ``tflops_per_gpu``, ...); ``setup`` is how the tool was run, in short
    (``t=2 d=2 p=2 b=4 B=32``); ``tags`` name the subsets the case belongs to (``>=1GFLOP``)."""

    source: str
    case_id: str
    quantity: str
    measured: float
    predicted: float
    setup: str = ""
    tags: tuple[str, ...] = ()

    @property
    def error(self) -> float:
        """``predicted / measured - 1``."""
        return self.predicted / self.measured - 1.0


@dataclass(frozen=True)
class Source:
    """A bundled measurement set.

    ``compute``: its predictions depend on the fitted compute constant; ``fit``: it is one of the
    training-step sources the constant is (re)fitted on (leave-one-source-out,
    :mod:`dml2comm.validate.fit`); ``subsets``: (tag, label) of the subsets reported on their own
    lines; ``target``: the issue's accuracy target, in words."""

    name: str
    title: str
    function: str  # "module:function" that returns its cases
    compute: bool
    fit: bool
    target: str
    subsets: tuple[tuple[str, str], ...] = ()

    def cases(self, sample: int | None = None, compute_scale: float = 1.0) -> list[Case]:
        """The source's cases (a deterministic sample of at most ``sample``), predicted with the
        compute constant scaled by ``compute_scale``."""
        module, _, function = self.function.partition(":")
        return getattr(importlib.import_module(module), function)(sample=sample, compute_scale=compute_scale)


SOURCES: dict[str, Source] = {s.name: s for s in (
    Source("narayanan2021", "Narayanan et al. 2021 Table 1: TFLOP/s per GPU, GPT 1.7B-1T on 32-3,072 A100s",
           "dml2comm.validate.narayanan:cases", compute=True, fit=True, target="every row within 5%"),
    Source("vtrain", "vTrain single-node Megatron-DeepSpeed runs: iteration time, 2-8 A100s",
           "dml2comm.validate.vtrain:cases", compute=True, fit=True, target="mean |error| <= 8%, worst <= 25%"),
    Source("korthikanti2022", "Korthikanti et al. 2022 Table 4: one 22B layer's forward and backward time, t=8",
           "dml2comm.validate.korthikanti:cases", compute=True, fit=True, target="forward and backward each within 5%"),
    Source("nccl", "measured NCCL all-reduce (vTrain LUTs): A100 and V100, 2-8 GPUs, 64 MiB-1 GiB",
           "dml2comm.validate.collectives:nccl_cases", compute=False, fit=False, target="A100 all-reduce within 10%",
           subsets=(("A100", "A100 rows"),)),
    Source("xla_collectives", "measured H100 collectives (OpenXLA): AR/AG/RS/A2A, groups of 2/4/8, 1 KiB-2 GiB",
           "dml2comm.validate.collectives:xla_cases", compute=False, fit=False,
           target="mean |error| <= 10% per (op, group) at >= 16 MiB; median <= 15% over all sizes",
           subsets=((">=16MiB", ">= 16 MiB"),)),
    Source("gemm", "measured H100 bf16 matmuls (OpenXLA), held-out half: the shared analytical GEMM law (A100, B200, "
                   "GPUs without a fit) fitted without them. Not what an H100 gets: the H100 law is fitted on PyTorch/cuBLAS "
                   "(h100-gemm) and does not reproduce this table (its small shapes are slower, its large ones faster)",
           "dml2comm.validate.gemm:cases", compute=False, fit=False,
           target="median |error| <= 8% over shapes >= 1 GFLOP (the shared law, held out)",
           subsets=((">=1GFLOP", ">= 1 GFLOP"),)),
    Source("h100-gemm", "measured H100 bf16 nn.Linear GEMMs, PyTorch 2.11 / cuBLAS (this project's run): forward, data- "
                        "and weight-gradient layouts, 6 of 140 shapes unaligned (N = 50,257), vs the shipped GEMM model, "
                        "in sample (benchmarks/fit_h100_gemm.py prints the leave-one-row-out errors)",
           "dml2comm.validate.h100_gemm:cases", compute=False, fit=False,
           target="median |error| <= 8% over shapes >= 1 GFLOP, all three layouts, unaligned included",
           subsets=((">=1GFLOP", ">= 1 GFLOP"), ("aligned", "aligned"), ("unaligned", "unaligned (N = 50,257)"),
                    ("fwd", "forward"), ("dgrad", "data gradient"), ("wgrad", "weight gradient"))),
    Source("h100-steps", "measured H100 training steps (PyTorch 2.11 / transformers 5.17, pure bf16): GPT-2 small, Llama-1B",
           "dml2comm.validate.steps:cases", compute=False, fit=False, target="time and peak memory each within 5%"),
    Source("gpu-steps", "measured one-GPU training steps on H100 and H200 machines (PyTorch 2.11 / transformers 5.17, bf16 "
                        "and AMP, b = 1-256): GPT-2, Llama, Qwen2, BERT, ViT, ResNet-18; the pytorch host model is fitted "
                        "on them (benchmarks/bench_gpu_steps.py --kernel-us prints leave-one-machine-out errors)",
           "dml2comm.validate.gpu_steps:cases", compute=False, fit=False,
           target="mean |error| <= 8% for step time and for peak memory"),
)}


def sample_indices(n: int, sample: int | None) -> list[int]:
    """Indices of a deterministic sample of at most ``sample`` of ``n`` items (all when ``sample``
    is None or >= n): a seeded draw without replacement, in order."""
    if sample is None or sample >= n:
        return list(range(n))
    rng = np.random.default_rng(0)
    return sorted(int(i) for i in rng.choice(n, size=sample, replace=False))


def scaled_cluster(cluster: Cluster, compute_scale: float) -> Cluster:
    """``cluster`` whose GPU's sustained GEMM factor is ``compute_scale`` times its own (module
    docstring)."""
    if compute_scale == 1.0:
        return cluster
    gpu = cluster.gpu
    return dataclasses.replace(cluster, gpu=dataclasses.replace(gpu, gemm_sustained_factor=sustained_factor(gpu) * compute_scale))


def _stats(errors: Sequence[float], ids: Sequence[str]) -> dict[str, Any]:
    e = np.asarray(errors, dtype=float)
    if not len(e):
        return {"count": 0, "mean_abs_error": None, "median_abs_error": None, "signed_mean_error": None,
                "worst_error": None, "worst_case": None}
    worst = int(np.argmax(np.abs(e)))
    return {"count": int(len(e)), "mean_abs_error": float(np.mean(np.abs(e))), "median_abs_error": float(np.median(np.abs(e))),
            "signed_mean_error": float(np.mean(e)), "worst_error": float(e[worst]), "worst_case": ids[worst]}


def summarize(cases: Iterable[Case], subsets: Sequence[tuple[str, str]] = ()) -> dict[str, Any]:
    """Count, mean / median absolute error, signed mean and worst (signed) error of ``cases``,
    and the same per subset tag in ``subsets``."""
    cases = list(cases)
    out = _stats([c.error for c in cases], [c.case_id for c in cases])
    out["subsets"] = {}
    for tag, label in subsets:
        picked = [c for c in cases if tag in c.tags]
        out["subsets"][tag] = {"label": label, **_stats([c.error for c in picked], [c.case_id for c in picked])}
    return out


