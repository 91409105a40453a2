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
:mod:`dml2comm.site.validate`; not with ``--no-site``) into ``--out``, all or nothing.  Bad input raises
:class:`~dml2comm.errors.ConfigError` (one line; :func:`dml2comm.cli.main` prints it, exit code 2,
nothing written).  The run itself is :func:`dml2comm.validate.run.validate`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from dml2comm.cli.args import OneLineParser, positive_int
from dml2comm.errors import ConfigError
from dml2comm.validate.cases import SOURCES
from dml2comm.validate.run import Step, cases_csv, sources_named, validate
from dml2comm.site.validate import publish_validation

__all__ = ["run_validate_command", "validate_parser"]

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
    sources = sources_named(args.source)
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
