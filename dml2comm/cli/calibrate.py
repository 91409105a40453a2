"""``python main.py calibrate TRACES... [--cluster BASE] [-o cluster.yaml] [--holdout 0.3]``: the
front end (arguments, the page, the file, the terminal report) of
:mod:`dml2comm.calibrate.calibration`, which reads the traces and fits one value per kernel class
and per measured collective.

The report: one line for the GPU and base, then the per-class table (one row per class, or per
GEMM regime: value, base, samples and shapes, residual, held-out error against the base's on the
same shapes, used or not and why), the step guard's line (the summed kernel time of every class
together: measured, base, with the values used, and the values it left at the base), then one
line per fitted collective, then the warnings.  Bad input is one ``error:`` line (exit
2) and nothing is written; the page is built before the file, so a failed build leaves neither.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
from pathlib import Path
from typing import Sequence

from dml2comm.cli.args import OneLineParser, positive_int
from dml2comm.calibrate.calibration import (MAX_KERNEL_S, Calibration, CalibrationError, calibrate, identify_gpu,
                                            read_traces)
from dml2comm.calibrate.classes import QUANTITIES, ClassFit, StepGuard
from dml2comm.errors import ConfigError
from dml2comm.cli.progress import progress_bar
from dml2comm.executors import add_executor_args, executor_from_args
from dml2comm.export.files import check_output_file, check_output_folder
from dml2comm.hardware.cluster_file import dump_cluster_file
from dml2comm.traces.load import find_trace_files

__all__ = ["CalibrationError", "Calibration", "calibrate", "read_traces", "identify_gpu", "run_calibrate_command",
           "default_site_dir", "report_lines", "MAX_KERNEL_S"]

EXAMPLES = """examples (each runs as written from the repository root):
  python main.py calibrate tests/fixtures/traces/hta/nccl_parser_config__nccl_data.json.gz
  python main.py calibrate tests/fixtures/traces/hta/trace_filter__sampled_rank-0.json.gz tests/fixtures/traces/hta/trace_filter__sampled_rank-1.json.gz --cluster dgx-a100 --holdout 0.3 --processes 2 -o out/calibrate/a100.yaml
(--processes 2: two files read at once; --executor dask --processes 2: on a Dask LocalCluster of 2 workers; --executor dask
--scheduler tcp://HOST:8786: on a running Dask cluster whose workers see the same files; Dask: pip install 'dml2comm[dask]')
each also writes a page beside the file (out/calibrate/cluster_site/index.html: fitted values, residuals, scatter charts;
--site DIR elsewhere, --no-site none), then use the file wherever a preset name goes:
  main.py model.onnx --d 8 --cluster out/calibrate/cluster.yaml (also sweep, compare, trace: with --model, trace shows the
  prediction with the base preset's constants beside the calibrated one)
"""


# ---------------------------------------------------------------------------------- command


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text!r}") from None
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text!r}")
    return value


def _umask() -> int:
    """The process's umask (read by setting it, then put back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder moved into place
    (nothing half-written)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        mode = path.stat().st_mode & 0o777 if path.exists() else 0o666 & ~_umask()
        os.chmod(tmp, mode)  # mkstemp's 0600 would replace the file's own mode (or the usual 0644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def run_calibrate_command(argv: Sequence[str]) -> int:
    parser = OneLineParser(
        prog="python main.py calibrate",
        description="Fit the cost model to PyTorch-profiler traces of your own cluster and write a cluster file "
                    "for --cluster FILE.yaml.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("traces", nargs="+", help="trace files (.json, .json.gz) or folders of them, one GPU type")
    parser.add_argument("--cluster", help="base: a cluster preset or file (default: the traces' GPU's usual node)")
    parser.add_argument("-o", "--output", default="out/calibrate/cluster.yaml",
                        help="cluster file to write (default out/calibrate/cluster.yaml)")
    parser.add_argument("--holdout", type=_fraction, default=0.3,
                        help="share of the shapes (sizes) held out of each fit and scored alone; a kernel class's value is "
                             "used only when it beats the base model on its held-out shapes and the step guard keeps it "
                             "(the set of values that brings every class's summed kernel time nearest the measured one) "
                             "(default 0.3; 0: no checks, every fitted value used)")
    parser.add_argument("--site", metavar="DIR",
                        help="folder of the calibration page (default: beside the file, OUTPUT_STEM_site/, e.g. cluster_site/)")
    parser.add_argument("--no-site", action="store_true", help="write the cluster file only")
    parser.add_argument("--processes", type=positive_int, default=1,
                        help="trace files read in parallel (default 1: in this process; with --executor dask and no "
                             "--scheduler: LocalCluster workers)")
    add_executor_args(parser, "--processes")
    args = parser.parse_args(argv)
    out = Path(args.output)
    if out.suffix.lower() not in (".yaml", ".yml"):
        raise ConfigError(f"-o {args.output!r}: a cluster file ends in .yaml or .yml")
    if args.site and args.no_site:
        raise ConfigError("--site and --no-site contradict each other; keep one")
    site = None if args.no_site else Path(args.site) if args.site else default_site_dir(out)
    if site is not None and (site.resolve() == out.resolve() or out.resolve().is_relative_to(site.resolve())):
        raise ConfigError(f"--site {str(site)!r} would hold the cluster file {str(out)!r}; pick another folder")
    check_output_file(out, "-o")  # before any trace is read or the page is written
    if site is not None:
        check_output_folder(site, "--site")
    files = find_trace_files(list(args.traces))  # a missing path is an error before any worker starts
    progress = progress_bar("traces", sys.stderr.isatty())
    try:
        with executor_from_args(args, args.processes) as executor:
            result = calibrate([str(f) for f in files], args.cluster, args.holdout, executor=executor, on_progress=progress)
    finally:
        if progress is not None:
            progress.stop()  # type: ignore[attr-defined]
    text = dump_cluster_file(result.document)
    if site is not None:  # the page first: a failed build leaves neither
        from dml2comm.site.calibrate import publish_calibration_site

        publish_calibration_site(site, result.document, result.points, out.name, text, hashlib.sha256(text.encode()).hexdigest())
    write_atomic(out, text)
    for line in report_lines(result):
        print(line)
    for w in result.warnings:
        print(f"warning: {w}")
    print(f"wrote {out} (use it as --cluster {out})")
    if site is not None:
        print(f"calibration page: open {(site / 'index.html').resolve()}")
    return 0


def default_site_dir(output: Path) -> Path:
    """The calibration page's folder for cluster file ``output``: ``STEM_site`` beside it."""
    return output.with_name(f"{output.stem}_site")


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _class_row(c: ClassFit) -> list[str]:
    res = "-" if c.residual is None else f"{_pct(c.residual.median_rel_error)} / {_pct(c.residual.worst_rel_error)}"
    held = "-" if c.holdout is None else f"{_pct(c.holdout.median_rel_error)} ({c.holdout.shapes})"
    base_held = "-" if c.base_holdout is None else _pct(c.base_holdout.median_rel_error)
    return [c.key, "-" if c.value is None else f"{c.value:.4g}", f"{c.base:.4g}", f"{c.samples}/{c.shapes}", res, held,
            base_held, ("used: " if c.used else "base: ") + c.why]


def guard_line(g: StepGuard) -> str:
    """The step guard in one line: the summed kernel time of every class, measured, at the base and
    with the values used, and the values it left at the base."""
    text = (f"step guard (summed kernel time of every class, held-out estimate): measured {g.measured_s * 1e3:.2f} ms, "
            f"base {g.base_s / g.measured_s - 1:+.1%}, with the values used {g.used_s / g.measured_s - 1:+.1%}")
    if g.dropped:
        text += ("; left at the base although better on their own shapes (they move the sum away from the measured one: "
                 "other classes' errors were offsetting theirs): " + ", ".join(f"{k} ({g.effects[k] * 1e3:+.2f} ms)" for k in g.dropped))
    return text


def report_lines(result: Calibration) -> list[str]:
    """The terminal report of a calibration (module docstring)."""
    h = result.header
    lines = [f"GPU: {h['gpu']} ({h['how']}); base: {h['base']}; {h['traces']} trace(s)"
             + (f" ({h['unreadable']} unreadable, left out)" if h.get("unreadable") else "")]
    if result.classes:
        rows = [["class", "value", "base", "samples/shapes", "error median / worst", "held out (shapes)", "base held out",
                 "verdict"]] + [_class_row(c) for c in result.classes]
        widths = [max(len(r[i]) for r in rows) for i in range(7)]
        lines.append("kernel classes (value: " + "; ".join(sorted({f"{QUANTITIES[c.name]} for "
                     + ", ".join(dict.fromkeys(x.name for x in result.classes if QUANTITIES[x.name] == QUANTITIES[c.name]))
                     for c in result.classes})) + "):")
        lines += ["  " + "  ".join(r[i].ljust(widths[i]) for i in range(7)) + "  " + r[7] for r in rows]
        lines.append("  (" + "; ".join(f"{c.key}: {c.label}" for c in result.classes) + ")")
        if result.guard is not None:
            lines.append(guard_line(result.guard))
    for label, fit, out in result.collectives:
        r = out.residual
        text = f"{r.samples} samples / {r.shapes} sizes, error median {_pct(r.median_rel_error)} worst {_pct(r.worst_rel_error)}"
        if out.holdout is not None:
            text += f"; held out {out.holdout.shapes} sizes: median {_pct(out.holdout.median_rel_error)}"
        lines.append(f"{label}: alpha {fit.alpha_s * 1e6:.2f} µs, busbw {fit.busbw_bytes_per_s / 1e9:.2f} GB/s: {text}")
    return lines
