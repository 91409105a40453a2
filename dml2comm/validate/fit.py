"""Leave-one-source-out refits of the tool's fitted compute constant.

What is fitted to what
----------------------
The tool has one fitted constant that the bundled sets bear on: the A100's sustained GEMM factor
(``SUSTAINED_FACTOR["A100-SXM4-80GB"]`` in :mod:`dml2comm.cost.gemm`: the share of the dense peak
a large, well-tiled GEMM sustains in a training step), fitted on the three training-step
sources below together and held to Narayanan's every-row-within-5% target
(``benchmarks/fit_a100.py``).  It is refitted here as a factor ``s`` on it
(:func:`~dml2comm.validate.cases.scaled_cluster`: exactly ``f x s``) on the
training-step sources (``Source.fit``: Narayanan 2021, vTrain, Korthikanti 2022):

- *in-sample*: ``s`` fitted on every selected training-step source, the source's error at it;
- *leave-one-source-out* (LOSO): ``s`` fitted on the other selected training-step sources, the
  left-out source's error at it (the figure to expect on a run of a kind never fitted to).
  Sources outside the fit get the in-sample fit, which excludes them.

The objective is the mean over the fitted sources of each source's mean absolute error (each
source weighs the same, whatever its number of cases).  The search is bounded to
``s`` in [:data:`LOW`, :data:`HIGH`] (``f x s`` from 0.37 to 1.06 for the A100's 0.732): every case is evaluated for real at the :data:`GRID` scales, its prediction
interpolated linearly in ``1/s`` between them (a compute-bound time is proportional to ``1/s``),
the interpolated objective scanned at steps of 0.001, and the errors reported at the chosen
``s`` come from real evaluations again, never from the interpolation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np

from dml2comm.validate.cases import Case, Source

__all__ = ["GRID", "HIGH", "LOW", "Refit", "leave_one_source_out"]

LOW, HIGH = 0.5, 1.45
#: Scales evaluated for real before the search (1.0: the tool as shipped).
GRID = (0.5, 0.65, 0.8, 0.9, 1.0, 1.15, 1.3, 1.45)
STEP = 0.001


@dataclass(frozen=True)
class Refit:
    """One source's errors: as shipped (s = 1), in-sample and leave-one-source-out.

    ``*_scale``: the fitted factor on the peak (None where no fit applies); ``*_mean_abs_error``:
    the source's mean absolute error evaluated at it; ``fitted_on``: the sources of each fit."""

    source: str
    shipped_mean_abs_error: float
    in_sample_scale: float | None
    in_sample_mean_abs_error: float | None
    in_sample_fitted_on: tuple[str, ...]
    loso_scale: float | None
    loso_mean_abs_error: float | None
    loso_fitted_on: tuple[str, ...]

    def to_dict(self) -> dict:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}


def _mean_abs(cases: Sequence[Case]) -> float:
    return float(np.mean([abs(c.error) for c in cases]))


def leave_one_source_out(sources: Sequence[Source], evaluate: Callable[[Source, float], list[Case]],
                         shipped: Mapping[str, list[Case]]) -> list[Refit]:
    """In-sample and LOSO refits for the compute-dependent ``sources`` (module docstring).

    ``evaluate(source, s)`` returns the source's cases at scale ``s`` (the caller's sample);
    ``shipped`` holds each source's cases at ``s = 1``."""
    compute = [s for s in sources if s.compute]
    pool = [s.name for s in compute if s.fit]
    if not compute:
        return []
    xs = np.array(sorted(1.0 / g for g in GRID))  # interpolation abscissa: 1/s, ascending
    measured: dict[str, np.ndarray] = {}
    predicted: dict[str, np.ndarray] = {}  # [len(xs), cases]
    for src in compute:
        rows = []
        for x in xs:
            s = 1.0 / x
            cases = shipped[src.name] if abs(s - 1.0) < 1e-12 else evaluate(src, s)
            rows.append([c.predicted for c in cases])
        measured[src.name] = np.array([c.measured for c in shipped[src.name]])
        predicted[src.name] = np.array(rows)
    scan = np.arange(LOW, HIGH + STEP / 2, STEP)
    scan_x = 1.0 / scan

    def source_error(name: str) -> np.ndarray:  # mean |error| per scanned scale (interpolated)
        p = predicted[name]
        interp = np.stack([np.interp(scan_x, xs, p[:, j]) for j in range(p.shape[1])], axis=1)
        return np.mean(np.abs(interp / measured[name] - 1.0), axis=1)

    curves = {name: source_error(name) for name in pool}

    def fit(names: Sequence[str]) -> float | None:
        if not names:
            return None
        objective = np.mean([curves[n] for n in names], axis=0)
        return round(float(scan[int(np.argmin(objective))]), 3)

    real: dict[tuple[str, float], float] = {}

    def error_at(src: Source, s: float | None) -> float | None:
        if s is None:
            return None
        if (src.name, s) not in real:
            real[(src.name, s)] = _mean_abs(shipped[src.name] if s == 1.0 else evaluate(src, s))
        return real[(src.name, s)]

    all_fit = fit(pool)
    out = []
    for src in compute:
        others = [n for n in pool if n != src.name]
        loso = fit(others) if src.fit else all_fit
        loso_on = tuple(others) if src.fit else tuple(pool)
        out.append(Refit(src.name, _mean_abs(shipped[src.name]), all_fit, error_at(src, all_fit), tuple(pool),
                         loso, error_at(src, loso), loso_on if loso is not None else ()))
    return out
