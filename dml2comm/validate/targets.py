"""The issue's accuracy target of each source, checked on its cases.

Each source's target (issue 18, "Targets"; in words in ``Source.target``) becomes one function
of its cases that returns a :class:`TargetCheck`: met or not, and the figures it was judged on
in one line.  On a ``--sample`` run the verdict is the sample's, not the full set's (the page and
the summary say so).

- ``narayanan2021``: every row within 5%;
- ``vtrain``: mean |error| <= 8% and worst |error| <= 25%;
- ``korthikanti2022``: forward and backward each within 5% (every case of each quantity);
- ``nccl``: every A100 all-reduce within 10%;
- ``xla_collectives``: mean |error| <= 10% for each (op, group size) over its sizes >= 16 MiB,
  and median |error| <= 15% over all sizes;
- ``gemm`` and ``h100-gemm``: median |error| <= 8% over the shapes of at least 1 GFLOP.
- ``h100-steps`` (issue 32): every step's time and peak memory each within 5%.
- ``gpu-steps``: the mean |error| of the step times and of the peak memories each within 8% (the
  host-bound steps carry the measuring machines' CPU speed, 1.7x apart: no per-step bound).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from dml2comm.validate.cases import Case

__all__ = ["TargetCheck", "TARGET_CHECKS", "check_target"]


@dataclass(frozen=True)
class TargetCheck:
    """``met``: the target holds on the cases (None: no cases to judge or no target);
    ``detail``: the figures judged, in one line (``worst |error| 4.4% <= 5%``)."""

    met: bool | None
    detail: str


def _abs(cases: Sequence[Case]) -> np.ndarray:
    return np.abs(np.array([c.error for c in cases], dtype=float))


def _within(cases: Sequence[Case], bound: float, what: str) -> tuple[bool, str]:
    worst = float(_abs(cases).max())
    return worst <= bound, f"{what} worst |error| {worst:.1%} {'<=' if worst <= bound else '>'} {bound:.0%}"


def _every_within(bound: float) -> Callable[[Sequence[Case]], TargetCheck]:
    def check(cases: Sequence[Case]) -> TargetCheck:
        met, text = _within(cases, bound, "")
        return TargetCheck(met, text.strip())
    return check


def _vtrain(cases: Sequence[Case]) -> TargetCheck:
    e = _abs(cases)
    mean, worst = float(e.mean()), float(e.max())
    return TargetCheck(mean <= 0.08 and worst <= 0.25, f"mean |error| {mean:.1%} (<= 8%), worst {worst:.1%} (<= 25%)")


def _per_quantity(judge: Callable[[Sequence[Case], float, str], tuple[bool, str]], bound: float,
                  quantities: Sequence[tuple[str, str]]) -> Callable[[Sequence[Case]], TargetCheck]:
    """The cases of each (quantity, label) in ``quantities`` judged against ``bound`` by ``judge``
    (:func:`_within`, :func:`_mean_within`) and reported per quantity."""
    def check(cases: Sequence[Case]) -> TargetCheck:
        parts = []
        met = True
        for quantity, label in quantities:
            picked = [c for c in cases if c.quantity == quantity]
            if picked:
                ok, text = judge(picked, bound, label)
                met &= ok
                parts.append(text)
        return TargetCheck(met if parts else None, "; ".join(parts))
    return check


def _each_quantity_within(bound: float, quantities: Sequence[tuple[str, str]]) -> Callable[[Sequence[Case]], TargetCheck]:
    """Every case of each (quantity, label) in ``quantities`` within ``bound``."""
    return _per_quantity(_within, bound, quantities)


def _mean_within(cases: Sequence[Case], bound: float, label: str) -> tuple[bool, str]:
    errors = _abs(cases)
    mean = float(np.mean(errors))
    worst = cases[int(np.argmax(errors))]
    return mean <= bound, f"{label} mean |error| {mean:.1%} (<= {bound:.0%}), worst {worst.error:+.1%} ({worst.case_id})"


def _each_quantity_mean_within(bound: float, quantities: Sequence[tuple[str, str]]) -> Callable[[Sequence[Case]], TargetCheck]:
    """The mean |error| of each (quantity, label) in ``quantities`` within ``bound``, with its worst case."""
    return _per_quantity(_mean_within, bound, quantities)


def _nccl(cases: Sequence[Case]) -> TargetCheck:
    a100 = [c for c in cases if "A100" in c.tags]
    if not a100:
        return TargetCheck(None, "no A100 rows in this run")
    met, text = _within(a100, 0.10, "A100 rows:")
    return TargetCheck(met, text)


def _xla(cases: Sequence[Case]) -> TargetCheck:
    large = [c for c in cases if ">=16MiB" in c.tags]
    groups: dict[str, list[Case]] = {}
    for c in large:
        group = next((t for t in c.tags if "/n" in t), "?")  # the (op, group size) tag
        groups.setdefault(group, []).append(c)
    worst_group, worst_mean = None, 0.0
    for group, picked in groups.items():
        mean = float(_abs(picked).mean())
        if worst_group is None or mean > worst_mean:
            worst_group, worst_mean = group, mean
    median = float(np.median(_abs(cases)))
    met = median <= 0.15 and (worst_group is None or worst_mean <= 0.10)
    per_group = (f"worst (op, group) mean |error| at >= 16 MiB {worst_mean:.1%} ({worst_group}; <= 10%)" if worst_group
                 else "no case >= 16 MiB")
    return TargetCheck(met, f"{per_group}, median over all sizes {median:.1%} (<= 15%)")


def _gemm(cases: Sequence[Case]) -> TargetCheck:
    big = [c for c in cases if ">=1GFLOP" in c.tags]
    if not big:
        return TargetCheck(None, "no shape >= 1 GFLOP in this run")
    median = float(np.median(_abs(big)))
    return TargetCheck(median <= 0.08, f"median |error| over shapes >= 1 GFLOP {median:.1%} (<= 8%)")


#: source name -> its target's check (sources without one report ``met`` None).
TARGET_CHECKS: dict[str, Callable[[Sequence[Case]], TargetCheck]] = {
    "narayanan2021": _every_within(0.05),
    "vtrain": _vtrain,
    "korthikanti2022": _each_quantity_within(0.05, (("layer_forward_time_s", "forward"), ("layer_backward_time_s", "backward"))),
    "nccl": _nccl,
    "xla_collectives": _xla,
    "gemm": _gemm,
    "h100-steps": _each_quantity_within(0.05, (("iteration_time_s", "time"), ("peak_memory_bytes", "peak memory"))),
    "h100-gemm": _gemm,
    "gpu-steps": _each_quantity_mean_within(0.08, (("iteration_time_s", "time"), ("peak_memory_bytes", "peak memory"))),
}


def check_target(source: str, cases: Sequence[Case]) -> TargetCheck:
    """The target of ``source`` checked on ``cases`` (module docstring)."""
    check = TARGET_CHECKS.get(source)
    if check is None:
        return TargetCheck(None, "no machine-checked target")
    if not cases:
        return TargetCheck(None, "no cases")
    return check(cases)
