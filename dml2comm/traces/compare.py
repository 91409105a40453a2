"""Predicted (dml2comm's analysis) versus measured (the traces) time per category.

Measured figures are per training step: each rank's mean over its steps, then the largest over
ranks (the analysis reports the busiest stage, and a step ends when its slowest rank does).
Predicted figures come from :func:`dml2comm.analysis.analyze` on the same model and
configuration: ``summary`` (``compute_time_s``, ``optimizer_time_s``, ``exposed_comm_time_s``,
``bubble_time_s``, ``iteration_time_s``) and :func:`dml2comm.analysis.comm_by_dim` (tp, dp, pp, cp,
ep; a dimension the prediction does not report stays ``None``).

The error of a category is ``(predicted - measured) / measured``; ``None`` where nothing was
measured (a category absent from the traces cannot have a relative error), and for every
category when the two are not comparable (:func:`comparison_caveat`: CPU-only traces against a
GPU prediction).  Sizes that do not match the traces are refused before (the ``trace``
command's ``run_sizes``).
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, Sequence

__all__ = ["CATEGORIES", "measured_per_category", "predicted_per_category", "comparison_rows", "comparison_caveat"]

#: (key, label) of each compared category
CATEGORIES: tuple[tuple[str, str], ...] = (
    ("compute", "compute (forward + backward + recomputation)"),
    ("optimizer", "optimizer step"),
    ("comm_tp", "tensor-parallel communication"),
    ("comm_dp", "data-parallel communication"),
    ("comm_pp", "pipeline communication"),
    ("comm_cp", "context-parallel communication"),
    ("comm_ep", "expert-parallel communication"),
    ("exposed_comm", "exposed communication"),
    ("idle", "idle / pipeline bubble"),
    ("iteration", "iteration (step)"),
)


def _step_value(step: Mapping[str, Any], key: str) -> float:
    if key == "compute":
        return step["forward_s"] + step["backward_s"] + step["recompute_s"]
    if key == "optimizer":
        return step["optimizer_s"]
    if key.startswith("comm_"):
        return step["comm_s"].get(key[5:], 0.0)
    if key == "exposed_comm":
        return step["exposed_comm_s"]
    if key == "idle":
        return step["idle_s"]
    return step["wall_s"]


def measured_per_category(ranks: Sequence[Mapping[str, Any]]) -> dict[str, float | None]:
    """Per category: the largest over ranks of the rank's mean over its steps (seconds)."""
    out: dict[str, float | None] = {}
    for key, _ in CATEGORIES:
        means = [math.fsum(_step_value(s, key) for s in r["steps"]) / len(r["steps"]) for r in ranks if r["steps"]]
        out[key] = max(means) if means else None
    return out


def predicted_per_category(summary: Mapping[str, Any], comm: Mapping[str, Mapping[str, Any]]) -> dict[str, float | None]:
    """Per category from an analysis summary and its ``comm_by_dim``."""
    def dim(d: str) -> float | None:
        entry = comm.get(d)
        return float(entry["time_s"]) if entry is not None else None

    return {
        "compute": summary.get("compute_time_s"), "optimizer": summary.get("optimizer_time_s"),
        "comm_tp": dim("tp"), "comm_dp": dim("dp"), "comm_pp": dim("pp"), "comm_cp": dim("cp"), "comm_ep": dim("ep"),
        "exposed_comm": summary.get("exposed_comm_time_s"), "idle": summary.get("bubble_time_s"),
        "iteration": summary.get("iteration_time_s"),
    }


def comparison_caveat(devices: Sequence[str], backends: Iterable[str], gpu: str) -> str | None:
    """Why the measured and predicted times cannot be compared, or None.

    The prediction is always a GPU iteration (roofline of ``gpu``, NCCL-like collectives); a
    rank traced without GPU kernels (``device == "cpu"``: gloo on CPUs) measured CPU operators, so
    a relative error would measure the hardware, not the model (a 4-rank gloo run against an
    A100 prediction reads about -99 %)."""
    cpu = sum(1 for d in devices if d == "cpu")
    if not cpu:
        return None
    backend = ", ".join(sorted(b for b in backends if b)) or "no GPU"
    which = "the traces are" if cpu == len(devices) else f"{cpu} of {len(devices)} traces are"
    return (f"{which} CPU-only ({backend} backend, no GPU kernels): their times are CPU operator times while the prediction "
            f"is for {gpu} GPUs, so no error is computed; compare the shares of the categories, not the times")


def comparison_rows(predicted: Mapping[str, float | None], measured: Mapping[str, float | None],
                    comparable: bool = True, base: Mapping[str, float | None] | None = None) -> list[dict[str, Any]]:
    """One row per category: ``category``, ``label``, ``predicted_s``, ``measured_s``, ``error``
    (None for every row when not ``comparable``); with ``base`` (the prediction with the base
    preset's constants, when ``predicted`` used a calibrated cluster file) also
    ``predicted_base_s`` and ``error_base``, the same relative error."""
    rows = []
    for key, label in CATEGORIES:
        p, m = predicted.get(key), measured.get(key)
        row = {"category": key, "label": label, "predicted_s": p, "measured_s": m, "error": _error(p, m, comparable)}
        if base is not None:
            row["predicted_base_s"] = base.get(key)
            row["error_base"] = _error(base.get(key), m, comparable)
        rows.append(row)
    return rows


def _error(p: float | None, m: float | None, comparable: bool) -> float | None:
    return (p - m) / m if p is not None and m and comparable else None
