"""The fitted samples kept for the calibration page: one point per distinct shape (size) with its
median measured time, its model times (calibrated and base) and which side of the held-out split
it fell on (:func:`dml2comm.calibrate.fit.split_by_shape`, the same split the fits used).

Plain JSON-able dicts: ``calibrate`` writes them beside the page (``samples.json`` in the site)
and :mod:`dml2comm.render.calibration_charts` draws them.
"""

from __future__ import annotations

from typing import Any, Callable, Hashable, Sequence, TypeVar

import numpy as np

from dml2comm.calibrate.fit import split_by_shape
from dml2comm.calibrate.samples import CollectiveSample

__all__ = ["collective_points", "class_points", "log_sizes"]

T = TypeVar("T")


def _grouped(samples: Sequence[T], key: Callable[[T], Hashable], holdout: float) -> list[tuple[Hashable, list[T], bool]]:
    """(key, its samples, held out?) per distinct key, keys in a stable order."""
    held = {key(s) for s in split_by_shape(samples, key, holdout)[1]}
    groups: dict[Hashable, list[T]] = {}
    for s in samples:
        groups.setdefault(key(s), []).append(s)
    return [(k, groups[k], k in held) for k in sorted(groups, key=repr)]


def _f(x: float) -> float:
    return float(f"{x:.6g}")


def collective_points(samples: Sequence[CollectiveSample], holdout: float) -> list[dict[str, Any]]:
    """One point per message size of one (kind, group size, level): median measured time."""
    return [{"size_bytes": key, "repeats": len(ss), "measured_s": _f(float(np.median([s.time_s for s in ss]))), "held_out": held}
            for key, ss, held in _grouped(samples, lambda s: s.size_bytes, holdout)]


def log_sizes(lo: float, hi: float, count: int = 25) -> list[float]:
    """``count`` sizes evenly spaced in log between ``lo/2`` and ``2 hi`` (the fitted and base
    lines are drawn through them)."""
    return [_f(x) for x in np.geomspace(max(lo / 2, 1.0), max(hi * 2, 2.0), count)]


def class_points(spec: Any, value: float, holdout: float) -> list[dict[str, Any]]:
    """One point per shape of a kernel class (:class:`dml2comm.calibrate.classes.ClassSpec`):
    its description, median measured time, the class's model at the fitted ``value`` and the
    base model's time, and which side of the held-out split it fell on."""
    groups = _grouped(spec.samples, spec.key, holdout)
    keys = [k for k, _, _ in groups]
    model, base = spec.predict(keys, value), spec.base_predict(keys)
    return [{"shape": spec.describe(key), "ops": sorted({s.op for s in ss}), "repeats": len(ss),
             "measured_s": _f(float(np.median([s.time_s for s in ss]))), "model_s": _f(float(m)), "base_s": _f(float(b)),
             "held_out": held} for (key, ss, held), m, b in zip(groups, model, base)]
