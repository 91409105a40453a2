"""One validation run: the tool on every bundled public measurement of the chosen sources
(:data:`dml2comm.validate.cases.SOURCES`), each case's error, the per-source summary with its
target (:mod:`dml2comm.validate.targets`) and band coverage, and the leave-one-source-out
refits (:mod:`dml2comm.validate.fit`).  ``python main.py validate`` (:mod:`dml2comm.cli.validate`)
prints and writes what :func:`validate` returns.
"""

from __future__ import annotations

import csv
import io
from typing import Any, Callable, NamedTuple, Sequence

from dml2comm.errors import ConfigError
from dml2comm.validate.cases import SOURCES, Case, Source, summarize
from dml2comm.validate.fit import leave_one_source_out
from dml2comm.validate.targets import check_target

__all__ = ["Step", "cases_csv", "planned_steps", "sources_named", "validate"]


def sources_named(names: Sequence[str]) -> list[Source]:
    """The sources ``--source`` names (each entry one name or a comma-separated list; none: all)."""
    wanted = [n.strip() for text in names for n in text.split(",") if n.strip()]
    if names and not wanted:  # --source "" asked for one and named none: not every source
        raise ConfigError(f"--source is empty; name one or more of {', '.join(SOURCES)}, or leave --source out for all")
    if not wanted:
        return list(SOURCES.values())
    for name in wanted:
        if name not in SOURCES:
            raise ConfigError(f"unknown --source {name!r}; valid: {', '.join(SOURCES)}")
    return [s for s in SOURCES.values() if s.name in wanted]


class Step(NamedTuple):
    """One step of :func:`validate`: ``source``'s cases at ``compute_scale`` (1.0: the shipped
    constant; others: the leave-one-source-out refits); ``cases``: how many it evaluated, None
    while it runs."""

    source: str
    compute_scale: float
    cases: int | None


def planned_steps(sources: Sequence[Source], loso: bool = True) -> int:
    """How many steps :func:`validate` runs: each source once, and with ``loso`` each source
    whose time depends on the fitted constant at the other scales of the grid and at its two
    refitted scales (an estimate by at most those two: a refit landing on 1.0 is not rerun)."""
    from dml2comm.validate.fit import GRID

    compute = sum(1 for s in sources if s.compute) if loso else 0
    return len(sources) + compute * (len(GRID) - 1 + 2)


def validate(sources: Sequence[Source], sample: int | None = None, loso: bool = True,
             on_step: Callable[[int, int, Step], None] | None = None) -> tuple[list[Case], dict[str, Any]]:
    """(every case, the summary dict written as validation.json) for ``sources``.

    ``on_step(done, total, step)`` is called before each step (``step.cases`` None) and after it
    (``done`` counted, ``step.cases`` set); ``total`` is :func:`planned_steps`, and the last call
    has ``done == total``."""
    total = planned_steps(sources, loso)
    done = 0

    def run(src: Source, scale: float) -> list[Case]:
        nonlocal done, total
        if on_step is not None:
            on_step(done, total, Step(src.name, scale, None))
        cases = src.cases(sample) if scale == 1.0 else src.cases(sample, compute_scale=scale)
        done += 1
        total = max(total, done)
        if on_step is not None:
            on_step(done, total, Step(src.name, scale, len(cases)))
        return cases

    shipped = {src.name: run(src, 1.0) for src in sources}
    refits = leave_one_source_out(sources, run, shipped) if loso else []
    if on_step is not None and done < total:  # a refitted scale needed no run: the bar ends full
        on_step(total, total, Step("", 1.0, 0))
    from dml2comm.cost import gemm

    constant = gemm.SUSTAINED_FACTOR.get("A100-SXM4-80GB")
    summary = {
        "schema_version": 1,
        "sample": sample,
        "error_definition": "predicted / measured - 1",
        "sources": {src.name: {"title": src.title, "target": src.target, "quantity": shipped[src.name][0].quantity if shipped[src.name] else None,
                               "depends_on_fitted_constant": src.compute, "in_fit": src.fit,
                               **_target(src.name, shipped[src.name]),
                               **summarize(shipped[src.name], src.subsets)} for src in sources},
        "fitted_constant": {"name": "SUSTAINED_FACTOR['A100-SXM4-80GB']", "value": constant, "module": "dml2comm.cost.gemm",
                            "fitted_to": "narayanan2021, vtrain and korthikanti2022 jointly, held to narayanan2021's every row within 5%",
                            "refit_as": "a factor s on it: the A100 evaluated with SUSTAINED_FACTOR x s exactly (the GPU's calibrated-factor field)"},
        "loso": [r.to_dict() for r in refits],
    }
    _add_band_coverage(summary, shipped)
    return [c for src in sources for c in shipped[src.name]], summary


def _add_band_coverage(summary: dict[str, Any], shipped: dict[str, list[Case]]) -> None:
    """Each end-to-end source's share of runs inside the band the tool prints for them
    (:func:`dml2comm.validate.bands.band_coverage`); None for the others."""
    from dml2comm.hardware.cluster import get_cluster
    from dml2comm.validate.bands import band_coverage, band_rows

    a100 = get_cluster("dgx-a100", 8).gpu.name  # the bundled end-to-end runs' GPU (PROVENANCE.md)
    for name, cases in shipped.items():
        cover = band_coverage(band_rows(cases, a100)).get(name)
        summary["sources"][name]["band_coverage"] = None if cover is None else cover[0] / cover[1]


def _target(source: str, cases: Sequence[Case]) -> dict[str, Any]:
    check = check_target(source, cases)
    return {"target_met": check.met, "target_check": check.detail}


def cases_csv(cases: Sequence[Case]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["source", "case", "quantity", "setup", "measured", "predicted", "error"])
    for c in cases:
        w.writerow([c.source, c.case_id, c.quantity, c.setup, repr(c.measured), repr(c.predicted), repr(c.error)])
    return buf.getvalue()
