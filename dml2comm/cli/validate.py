"""The ``validate`` subcommand: run the tool on every bundled public measurement.

    python main.py validate                                  all sources, full sets, with LOSO
    python main.py validate --source vtrain --sample 100     one source, a deterministic sample
    python main.py validate --source nccl,xla_collectives --json --out val/

Prints per source the number of cases, the mean / median absolute error, the signed mean and
the worst error (and its case), whether the source's target is met
(:mod:`dml2comm.validate.targets`), then the leave-one-source-out refits
(:mod:`dml2comm.validate.fit`); on a terminal (stderr, and not ``--json``) a progress bar
shows the steps done (a step: one source's cases at one compute scale) and a line per source as
its cases finish; writes ``validation.csv`` (one row per case),
``validation.json`` (the summary) and ``site/`` (the Validation page,
:mod:`dml2comm.validate.site`; not with ``--no-site``) into ``--out``, all or nothing.  Bad input raises
:class:`~dml2comm.errors.ConfigError` (one line; ``cli.py`` prints it, exit code 2, nothing
written).  This module prints because it is a command front end, called only from ``cli.py``.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable, NamedTuple, Sequence

from dml2comm.cli.args import OneLineParser, positive_int
from dml2comm.errors import ConfigError
from dml2comm.validate.cases import SOURCES, Case, Source, summarize
from dml2comm.validate.fit import leave_one_source_out
from dml2comm.validate.site import publish_validation
from dml2comm.validate.targets import check_target

__all__ = ["run_validate_command", "validate", "validate_parser", "Step"]

EXAMPLES = """duration: the full sets take about 1.5-2 minutes on 2 CPU cores, most of it the leave-one-source-out
refits (each source that depends on the fitted constant is rerun at 8 compute scales; --no-loso skips them);
--sample N runs at most N cases per source, for a quick run (--sample 3: about half a minute).
On a terminal a progress bar shows the steps done and a line per source its cases.

examples:
  python main.py validate
  python main.py validate --source vtrain --sample 100
  python main.py validate --source narayanan2021,korthikanti2022 --no-loso --out out/validate-two
  python main.py validate --sample 5 --no-site

sources: """ + ", ".join(SOURCES) + """ (data and provenance: dml2comm/validate/data/PROVENANCE.md)
error = predicted / measured - 1 of the quantity the source publishes (TFLOP/s per GPU for
narayanan2021, peak memory as well as the step time for h100-steps, a time for the others).
"""


def validate_parser() -> argparse.ArgumentParser:
    p = OneLineParser(command="validate", prog="python main.py validate", description="Run the tool on the bundled public measurements and report its errors.",
                epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--source", action="append", default=[], metavar="NAME[,NAME...]",
                   help="sources to run (repeatable or comma-separated; default: all)")
    p.add_argument("--sample", type=positive_int, metavar="N",
                   help="at most N cases per source, a deterministic sample (default: every case)")
    p.add_argument("--no-loso", action="store_true", help="skip the leave-one-source-out refits (faster)")
    p.add_argument("--out", default="out/validate",
                   help="folder for validation.csv, validation.json and site/ (the Validation page) (default: out/validate)")
    p.add_argument("--no-site", action="store_true", help="write validation.csv and validation.json only, no site/")
    p.add_argument("--json", action="store_true", help="print the summary as JSON instead of tables")
    return p


def _sources(names: Sequence[str]) -> list[Source]:
    wanted = [n.strip() for text in names for n in text.split(",") if n.strip()]
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


def _pct(x: float | None, signed: bool = False) -> str:
    if x is None:
        return "-"
    return f"{x:+.1%}" if signed else f"{x:.1%}"


def _verdict(s: dict[str, Any]) -> str:
    met = s.get("target_met")
    return s["target"] if met is None else f"{s['target']}: {'met' if met else 'NOT met'} ({s['target_check']})"


def _print(summary: dict[str, Any], out: Path, elapsed: float, n: int, site: bool) -> None:
    """The error tables, laid out for the console (:mod:`dml2comm.render.terminal`: split or
    stacked when narrow, every value whole)."""
    from rich.console import Console

    from dml2comm.render.terminal import console_width, fit_table, line

    console = Console(highlight=False, width=console_width(), soft_wrap=True)
    sample = summary["sample"]
    console.print(line(f"validated {n} case(s) from {len(summary['sources'])} source(s) in {elapsed:.1f} s"
                       + (f" (at most {sample} per source, a deterministic sample)" if sample else " (full sets)"), console.width))
    rows = []
    for name, s in summary["sources"].items():
        rows.append([name, str(s["count"]), _pct(s["mean_abs_error"]), _pct(s["median_abs_error"]),
                     _pct(s["signed_mean_error"], True), _pct(s["worst_error"], True), _pct(s.get("band_coverage")),
                     str(s["worst_case"]), _verdict(s)])
        for sub in s["subsets"].values():
            rows.append([f"  {sub['label']}", str(sub["count"]), _pct(sub["mean_abs_error"]), _pct(sub["median_abs_error"]),
                         _pct(sub["signed_mean_error"], True), _pct(sub["worst_error"], True), "", str(sub["worst_case"]), ""])
    console.print(fit_table("error against each source (in band: the share of its runs inside the expected error the tool "
                            "prints for them)", ("source", "cases", "mean |error|", "median", "signed mean", "worst", "in band",
                                                 "worst case", "target"), rows, console.width, left=(0, 7, 8)))
    if summary["loso"]:
        const = summary["fitted_constant"]
        value = const["value"]
        console.print(line(f"fitted constant {const['name']} = {value} (fitted to {const['fitted_to']}); refits as "
                           f"{const['refit_as']}:", console.width))
        loso = []
        for r in summary["loso"]:
            s_in = "-" if r["in_sample_scale"] is None else f"{r['in_sample_scale']:.3f}"
            s_lo = "-" if r["loso_scale"] is None else f"{r['loso_scale']:.3f}"
            loso.append([r["source"], _pct(r["shipped_mean_abs_error"]), _pct(r["in_sample_mean_abs_error"]), s_in,
                         _pct(r["loso_mean_abs_error"]), s_lo, ", ".join(r["loso_fitted_on"]) or "-"])
        console.print(fit_table("mean |error|: shipped, refitted in sample, leave-one-source-out", (
            "source", "shipped", "in-sample", "s", "LOSO", "LOSO s", "LOSO fitted on"), loso, console.width, left=(0, 6)))
        if value is not None:
            scales = sorted({r[k] for r in summary["loso"] for k in ("in_sample_scale", "loso_scale") if r[k] is not None})
            console.print(line("(" + ", ".join(f"s={s:.3f}: {const['name']} {value * s:.3f}" for s in scales) + ")", console.width))
    if site:
        print(f"wrote {out / 'validation.csv'}, {out / 'validation.json'} and the Validation page {out / 'site' / 'index.html'}")
    else:
        print(f"wrote {out / 'validation.csv'} and {out / 'validation.json'}")


def _progress(enabled: bool) -> Callable[[int, int, Step], None] | None:
    """The terminal's progress of :func:`validate` (None when not ``enabled``): a bar of the
    steps with the one running, and a line per source when its shipped cases are done."""
    from dml2comm.cli.progress import progress_bar

    bar = progress_bar("validate", enabled)
    if bar is None:
        return None
    started = [time.perf_counter()]

    def on_step(done: int, total: int, step: Step) -> None:
        if step.cases is None:
            started[0] = time.perf_counter()
            what = step.source if step.compute_scale == 1.0 else f"{step.source}, refit ×{step.compute_scale:.2f}"
            bar(done, total, what)
            return
        if step.compute_scale == 1.0 and step.source:
            bar.say(f"  {step.source}: {step.cases} case{'' if step.cases == 1 else 's'} in "  # type: ignore[attr-defined]
                    f"{time.perf_counter() - started[0]:.1f} s")
        bar(done, total, "")

    return on_step


def run_validate_command(argv: Sequence[str]) -> int:
    args = validate_parser().parse_args(argv)
    sources = _sources(args.source)
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {str(out)!r} is a file; give a folder")
    start = time.perf_counter()
    cases, summary = validate(sources, args.sample, loso=not args.no_loso,
                              on_step=_progress(sys.stderr.isatty() and not args.json))  # as the sweep decides
    elapsed = time.perf_counter() - start
    files = {"validation.csv": cases_csv(cases), "validation.json": json.dumps(summary, sort_keys=True, indent=1) + "\n"}
    if args.no_site:
        publish_validation(out, files)
    else:
        publish_validation(out, files, cases, summary)
    if args.json:
        print(json.dumps(summary, sort_keys=True))
    else:
        _print(summary, out, elapsed, len(cases), not args.no_site)
    return 0
