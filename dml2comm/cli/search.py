"""The ``sweep`` and ``compare`` subcommands.

    python main.py sweep model.onnx --gpus 64 --global-batch-size 512 --t 1,2,4,8 --max-p 16 --workers 8
    python main.py compare model.onnx --global-batch-size 512 --configs "d=2,t=2,p=4" "d=4,t=2,p=2,b=2,zero=1"

:func:`run_sweep_command` and :func:`run_compare_command` parse ``argv``, print, write into
``--out`` and return an exit code; bad input raises :class:`~dml2comm.errors.ConfigError` with a
one-line message, which :func:`dml2comm.cli.main` prints as ``error: ...`` with exit code 2.  What
they report is computed by :mod:`dml2comm.search.report`, :mod:`~dml2comm.search.sweep` and
:mod:`~dml2comm.search.scaling`.

Outputs of ``sweep`` (``--out DIR``): ``sweep.csv`` and ``sweep.parquet`` (every configuration,
failed ones with their reason; the same columns, typed in Parquet), ``data.json`` (schema_version
1, a ``sweep`` object) and, unless ``--no-site``, ``site/`` (the comparison page,
:mod:`dml2comm.site.compare`) and ``top/1`` ... ``top/N`` (``--build-top N``, default 3): the
full analysis of the N fastest fitting configurations, built after the sweep by the main
command's own code path (:mod:`dml2comm.search.reproduce`) and linked from the page, which
also shows every listed configuration's command line.  While the sweep runs, rows are appended to
``DIR/sweep.partial.csv`` as they finish; at the end (or on Ctrl-C, with what finished) the
outputs are published atomically and the partial file removed.

``sweep --scaling 8,16,32`` runs one sweep per GPU count (:mod:`dml2comm.search.scaling`) and
writes ``scaling.csv``, ``sweep.csv``/``sweep.parquet`` (every configuration of every count),
``data.json`` (a ``scaling`` object; each point with its ``command`` and ``site``), ``site/`` (the
scaling page, with each count's command line) and ``top/8-gpus`` ... (``--build-top N``: the
analysis site of the best configuration of the first N GPU counts that have one, linked from
the page).  ``compare`` writes ``compare.csv``,
``compare.parquet``, ``data.json`` (``compare``), ``site/`` and the analysis sites of the N fastest
fitting configurations, each in ``top/K`` with K its position in ``--configs``: the "#K" of the
printed table, of the page and of the "analysis site: #K" lines.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from dml2comm.cli.analyse import analyse_and_publish
from dml2comm.cli.args import (DTYPE_CHOICES, OneLineParser, add_hardware_arguments, add_stack_arguments, check_cp_scheme, finite_float,
                               host_model_of, non_negative_int, positive_int, resolve_gpus_per_node, sequence_length, stack_kwargs)
from dml2comm.executors import add_executor_args, executor_from_args
from dml2comm.fmt import decimal_int
from dml2comm.errors import ConfigError
from dml2comm.cost.memory import allocator_capacity_bytes
from dml2comm.cost.profile import ProfileScale
from dml2comm.parallel.config import CP_SCHEMES, OPTIMIZERS, RECOMPUTE_MODES, check_gpu_count
from dml2comm.search.report import (cluster_builder, cluster_dict, entry, gpu_label, parquet_bytes, parse_config_spec, space_dict,
                                    space_view, sweep_dict)
from dml2comm.search.reproduce import DEFAULT_BUILD_TOP, Hardware, listed_commands, scaling_folder, scaling_reproduce
from dml2comm.search.space import Constraints, parse_int_list, parse_name_list
from dml2comm.search.sweep import CsvStream, Evaluator, SweepResult, SweepSpace, csv_text, model_shape, run_sweep

__all__ = ["build_sites", "compare_parser", "run_compare_command", "run_sweep_command", "sweep_parser"]

SWEEP_EXAMPLES = """examples (run as written from the repository root; default output folder out/sweep):
  python main.py sweep examples/gpt2-small.onnx --gpus 64 --global-batch-size 512
  python main.py sweep examples/gpt2-small.onnx --scaling 8,16,32,64 --global-batch-size 512
  python main.py sweep examples/gpt2-small.onnx --scaling 8,16,...,1024 --per-gpu-batch 4 --weak
  python main.py sweep examples/gpt2-small.onnx --gpus 64 --global-batch-size 512 --t 1,2,4 --max-p 16 --zero 0,1,2 --workers 2
  python main.py sweep examples/gpt2-small.onnx --gpus 16 --cluster dgx-h100 --recompute none,full --no-sp --out out/sweep16
  python main.py sweep examples/gpt2-small.onnx --gpus 64 --global-batch-size 512 --t 1,2,4 --max-p 16 --executor dask --workers 2
(--executor dask needs pip install 'dml2comm[dask]'; with --scheduler tcp://HOST:8786 the chunks run on a running Dask cluster)
(--scaling: strong scaling at a fixed global batch; with --weak and --per-gpu-batch: weak scaling; 8,16,...,1024 continues the ratio of 8 and 16 up to 1024)
"""

COMPARE_EXAMPLES = """examples (run as written from the repository root; default output folder out/compare):
  python main.py compare examples/gpt2-small.onnx --global-batch-size 64 --configs "d=2,t=2,p=4" "d=4,t=2,p=2"
  python main.py compare examples/gpt2-small.onnx --global-batch-size 64 --configs "d=2,t=2,p=4,b=1,zero=1,recompute=full,sp=1,v=2"
"""

#: Rows of the Pareto front printed (data.json holds all of them).
PARETO_SHOWN = 20


def _hardware_args(p: argparse.ArgumentParser, scaling: bool = False, compare: bool = False) -> None:
    add_hardware_arguments(p, main=False)
    b = p.add_argument_group("batch")
    b.add_argument("--global-batch-size", type=positive_int, help="global batch B (sweep default: --gpus; compare: required)")
    b.add_argument("--seq-len", type=sequence_length, help="sequence length; binds the symbolic sequence axis")
    b.add_argument("--dtype", default="bf16", choices=DTYPE_CHOICES)
    b.add_argument("--optimizer", default="adam", choices=OPTIMIZERS)
    add_stack_arguments(b)
    p.add_argument("--out", help="output folder (default: out/sweep or out/compare, beside the analysis's out/)")
    p.add_argument("--no-site", action="store_true", help="do not build the comparison site (DIR/site/)")
    p.add_argument("--build-top", type=non_negative_int, default=None, metavar="N",
                   help=f"build the full analysis site of the N fastest fitting configurations into "
                        + ("DIR/top/K, K being the configuration's number in the table (its position in --configs)"
                           if compare else "DIR/top/1 ... DIR/top/N")
                        + f", linked from the page (default {DEFAULT_BUILD_TOP}; 0 skips)"
                        + ("; with --scaling: of the best configuration of each of the first N GPU counts that have one, into "
                           "DIR/top/COUNT-gpus (every count when N is at least the number of counts)" if scaling else ""))
    p.add_argument("--json", action="store_true", help="print the result object as JSON instead of tables")


def _short(config: Mapping[str, Any]) -> str:
    parts = [f"d={config['d']}", f"t={config['t']}", f"p={config['p']}", f"b={config['micro_batch_size']}"]
    if config["virtual_stages"] > 1:
        parts.append(f"v={config['virtual_stages']}")
    parts.append(f"zero={config['zero_stage']}")
    parts.append(f"recompute={config['recompute']}")
    if config["sequence_parallel"]:
        parts.append("sp=1")
    return ",".join(parts)


def _table(title: str, rows: Sequence[Mapping[str, Any]], width: int):
    """The ranked rows for the terminal, laid out for ``width`` (split or stacked when narrow,
    every value whole: :func:`dml2comm.render.terminal.fit_table`)."""
    from dml2comm.fmt import fmt_bytes, fmt_s, fmt_s_band, fmt_share
    from dml2comm.render.terminal import fit_table

    cells = []
    for i, r in enumerate(rows, 1):
        if r["error"]:
            cells.append([str(i), _short(r["config"]), "failed", "", "", "", "", "", r["error"]])
            continue
        cells.append([str(i), _short(r["config"]), fmt_s_band(r["iteration_time_s"], r.get("expected_error")), f"{r['tflops_per_gpu']:.1f}",
                      fmt_share(r["mfu"]) if r["mfu"] is not None else "-", fmt_bytes(r["peak_memory_bytes"]),
                      "yes" if r["fits"] else "NO", fmt_share(r["bubble_fraction"]), fmt_s(r["exposed_comm_time_s"])])
    return fit_table(title, ("#", "config", "iteration ± error", "TFLOP/s/GPU", "MFU", "peak memory", "fits", "bubble", "exposed comm"),
                     cells, width, left=(0, 1))


def sweep_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python main.py sweep", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=SWEEP_EXAMPLES,
                description="Evaluate every valid configuration for a GPU count; rank the fitting ones by iteration time.")
    p.add_argument("model", help="the ONNX model")
    p.add_argument("--gpus", type=positive_int, help="GPU count (d*t*p); or --scaling")
    s = p.add_argument_group("scaling study (instead of --gpus)")
    s.add_argument("--scaling", metavar="N1,N2,...", help="GPU counts, e.g. 8,16,32,64 or 8,16,...,1024: one sweep each, "
                                                         "the best of each compared (strong scaling: fixed --global-batch-size)")
    s.add_argument("--weak", action="store_true", help="weak scaling: fixed batch per GPU (global batch = per-GPU batch x GPUs)")
    s.add_argument("--per-gpu-batch", type=positive_int, help="weak scaling: samples per GPU per iteration (default: "
                                                          "--global-batch-size / the first count, else 1)")
    s.add_argument("--efficiency-threshold", type=finite_float(), default=0.8,
                   help="parallel efficiency below which scaling breaks down (default 0.8)")
    c = p.add_argument_group("constraints (comma-separated lists)")
    for flag in ("--d", "--t", "--p"):
        c.add_argument(flag, help=f"allowed {flag[2:]} sizes, e.g. {flag} 1,2,4 (default: every divisor of --gpus)")
    for flag in ("--max-d", "--max-t", "--max-p"):
        c.add_argument(flag, type=positive_int, help="upper bound")
    c.add_argument("--micro-batch-sizes", default="1,2,4,8", help="micro-batch sizes to try (default 1,2,4,8)")
    c.add_argument("--virtual-stages", default="1,2,4", help="interleaved-schedule chunks to try (default 1,2,4)")
    c.add_argument("--zero", default="0,1", help="ZeRO stages to try (default 0,1)")
    c.add_argument("--recompute", default=",".join(RECOMPUTE_MODES), help="recomputation modes (default none,selective,full)")
    c.add_argument("--no-sp", action="store_true", help="never use sequence parallelism")
    c.add_argument("--sp-only", action="store_true", help="always use sequence parallelism when t > 1")
    c.add_argument("--allow-cross-node-tp", action="store_true", help="allow t larger than the GPUs per node")
    c.add_argument("--cp", default="1", help="context-parallel sizes to try, e.g. --cp 1,2,4 (default 1)")
    c.add_argument("--cp-scheme", default=None, choices=CP_SCHEMES,
                   help="context-parallel scheme (default ulysses); needs a --cp list with a size of 2 or more")
    c.add_argument("--ep", default="1", help="expert-parallel sizes to try on a MoE model, e.g. --ep 1,8 (default 1)")
    r = p.add_argument_group("run")
    r.add_argument("--workers", type=positive_int, default=1,
                   help="worker processes (default 1; with --executor dask and no --scheduler: LocalCluster workers)")
    r.add_argument("--top", type=positive_int, default=10, help="how many ranked configurations to print and keep (default 10)")
    r.add_argument("--limit", type=positive_int, help="evaluate only the first N configurations of the enumeration")
    add_executor_args(p, "--workers")
    _hardware_args(p, scaling=True)
    return p


def _constraints(args: argparse.Namespace) -> Constraints:
    if args.no_sp and args.sp_only:
        raise ConfigError("--no-sp and --sp-only contradict each other; drop one")
    cp = parse_int_list(args.cp, "--cp")
    check_cp_scheme(args.cp_scheme, max(cp), f"--cp {args.cp} does not try", "add a size of 2 or more to --cp (e.g. --cp 1,2), or drop --cp-scheme")
    return Constraints(
        d=parse_int_list(args.d, "--d") if args.d else None,
        t=parse_int_list(args.t, "--t") if args.t else None,
        p=parse_int_list(args.p, "--p") if args.p else None,
        max_d=args.max_d, max_t=args.max_t, max_p=args.max_p,
        micro_batch_sizes=parse_int_list(args.micro_batch_sizes, "--micro-batch-sizes"),
        virtual_stages=parse_int_list(args.virtual_stages, "--virtual-stages"),
        zero_stages=_zero_list(args.zero),
        recompute=parse_name_list(args.recompute, "--recompute", RECOMPUTE_MODES),
        sequence_parallel=(False,) if args.no_sp else (True,) if args.sp_only else (False, True),
        allow_cross_node_tp=args.allow_cross_node_tp, gpus_per_node=args.gpus_per_node,
        dtype=args.dtype, optimizer=args.optimizer, **stack_kwargs(args),
        cp=cp, ep=parse_int_list(args.ep, "--ep"), **({} if args.cp_scheme is None else {"cp_scheme": args.cp_scheme}),
    )


def _zero_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(sorted({decimal_int(x.strip()) for x in text.split(",") if x.strip()}))
    except ValueError:
        values = ()
    if not values:
        raise ConfigError(f"--zero expects stages from 0,1,2,3, got {text!r}; e.g. --zero 0,1")
    return values  # their range: the sweep space's check, in the configuration's words


def _site_flags(args: argparse.Namespace) -> argparse.Namespace:
    """``--build-top N`` builds sites: refused with ``--no-site``; unset, its default."""
    if args.no_site and args.build_top:
        raise ConfigError(f"--build-top {args.build_top} builds the sites of the best configurations, which --no-site turns "
                          "off; drop one of them")
    if args.build_top is None:
        args.build_top = DEFAULT_BUILD_TOP
    return args


def _profile(args: argparse.Namespace) -> ProfileScale | None:
    """``--profile``: the traces' measured ratios, modelled with the command's stack, precision,
    dtype and optimizer (None without the flag)."""
    if not args.profile:
        return None
    from dml2comm.hardware.cluster import plan_cluster
    from dml2comm.parallel.config import ParallelConfig
    from dml2comm.traces.predict import profile_from_args

    template = ParallelConfig(dp_size=1, tp_size=1, pp_size=1, micro_batch_size=1, global_batch_size=1, seq_len=args.seq_len,
                              dtype=args.dtype, optimizer=args.optimizer, **stack_kwargs(args))
    gpu = plan_cluster(args.gpu, args.cluster, 1, 1).gpu.name  # a trace that names no device is modelled on it
    return profile_from_args(args.profile, args.model, template, fit_host=args.host_model is None, gpu=gpu)


def run_sweep_command(argv: Sequence[str]) -> int:
    args = _site_flags(sweep_parser().parse_args(argv))
    resolve_gpus_per_node(args)
    constraints = _constraints(args)
    if args.scaling is not None:
        if args.gpus is not None:
            raise ConfigError("give --gpus N (one sweep) or --scaling N1,N2,... (a scaling study), not both")
        return _run_scaling_command(args, constraints)
    if args.weak or args.per_gpu_batch is not None:
        raise ConfigError("--weak and --per-gpu-batch belong to a scaling study; add --scaling N1,N2,...")
    if args.gpus is None:
        raise ConfigError("sweep needs --gpus N (or --scaling N1,N2,... for a scaling study)")
    check_gpu_count(args.gpus)
    space = SweepSpace(global_batch_size=args.global_batch_size or args.gpus, seq_len=args.seq_len, constraints=constraints)
    constraints.check(args.gpus)  # bad constraints fail before the model is read
    out = Path(args.out or "out/sweep")
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {str(out)!r} is a file; give a folder")
    builder = cluster_builder(args.gpu, args.cluster, args.gpus_per_node, host_model_of(args), args.nics_per_node, _profile(args))
    builder(args.gpus)  # an unknown --gpu / --cluster fails here, before anything is written
    partial = out / "sweep.partial.csv"
    stream: CsvStream | None = None
    progress = None
    task = None
    if sys.stderr.isatty() and not args.json:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        progress = Progress(TextColumn("sweep"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                            console=Console(stderr=True), transient=True)

    def on_result(row: dict[str, Any], done: int, total: int) -> None:
        nonlocal stream, task
        if stream is None:
            stream = CsvStream(partial)
        stream.write(row)
        if progress is not None:
            if task is None:  # started at the first result: after the workers are forked, so no thread is forked
                progress.start()
                task = progress.add_task("sweep", total=total)
            progress.update(task, completed=done)

    import dml2comm.model  # noqa: F401 - loaded before the sweep's clock starts: the rate it reports is evaluation's

    try:
        with executor_from_args(args, args.workers) as executor:
            result = run_sweep(args.model, args.gpus, builder, space, on_result=on_result, limit=args.limit, executor=executor)
    finally:
        if progress is not None:
            progress.stop()
        if stream is not None:
            stream.close()
    cluster = builder(args.gpus)

    allocator = allocator_capacity_bytes(cluster.gpu.hbm_bytes)  # what "fits" is measured against
    data = {"schema_version": 1, "model": result.model, "cluster": cluster_dict(cluster),
            "space": space_dict(space, args.gpus), "sweep": sweep_dict(result, args.top, allocator)}
    if not args.json:  # the ranking first: building the analysis sites can take longer than the sweep
        _print_sweep(result, data["sweep"], args.top)
    files: dict[str, str | bytes] = {"sweep.csv": csv_text(result.rows), "sweep.parquet": parquet_bytes(result.rows),
                                     "data.json": json.dumps(data, sort_keys=True, indent=1) + "\n"}
    hardware = Hardware(args.gpu, args.cluster, args.gpus_per_node, args.seq_len, host_model_of(args), args.nics_per_node, tuple(args.profile))
    ranked = result.ranked()
    commands, jobs, sites = listed_commands(args.model, out, ranked, ranked[:args.top] + result.pareto(), hardware,
                                       0 if args.no_site or result.interrupted else args.build_top)
    top_staging = _build_top(out, jobs, args.json)  # after the sweep: its speed is the sweep's
    site = _publish(out, files, None if args.no_site else dict(
        kind="sweep", rows=result.rows, capacity_bytes=allocator_capacity_bytes(cluster.gpu.hbm_bytes), capacity_label=gpu_label(cluster),
        model=result.model, cluster=data["cluster"], space=space_view(data["space"]), sweep=data["sweep"], top=args.top,
        commands=commands, sites=sites), top_staging)
    partial.unlink(missing_ok=True)
    if args.json:
        print(json.dumps(data["sweep"], sort_keys=True))
    else:
        _print_written(out, ["sweep.csv", "sweep.parquet", "data.json"], site)
        _print_sites(out, ranked, commands, sites)
    return 130 if result.interrupted else 0


def _run_scaling_command(args: argparse.Namespace, constraints: Constraints) -> int:
    """``sweep --scaling``: one sweep per GPU count, then the scaling table, files and page."""
    from dml2comm.search.scaling import parse_gpu_counts, plan_scaling, run_scaling, scaling_csv

    counts = parse_gpu_counts(args.scaling)
    check_gpu_count(max(counts), "--scaling")
    plan = plan_scaling(counts, args.weak, args.global_batch_size, args.per_gpu_batch, args.efficiency_threshold)
    dataclasses.replace(constraints, d=None, t=None, p=None).check(counts[0])  # bad constraints fail before the model is read
    out = Path(args.out or "out/sweep")
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {str(out)!r} is a file; give a folder")
    builder = cluster_builder(args.gpu, args.cluster, args.gpus_per_node, host_model_of(args), args.nics_per_node, _profile(args))
    for n in counts:
        builder(n)  # an unknown --gpu / --cluster, or a count the cluster cannot hold, fails here
    space = SweepSpace(global_batch_size=plan.batch_for(counts[0]), seq_len=args.seq_len, constraints=constraints)
    console = None if args.json else _console()

    def on_count(n: int, result: SweepResult | None) -> None:
        if console is not None:
            what = f"{result.num_configs} configurations in {result.seconds:.1f} s" if result else "no valid configuration"
            _say(console, f"  {n} GPUs (global batch {plan.batch_for(n)}): {what}")

    with executor_from_args(args, args.workers) as executor:
        study = run_scaling(args.model, plan, builder, space, limit=args.limit, on_count=on_count, executor=executor)
    points = study.summary["points"]
    for p in points:
        if p.get("best"):
            p["best"] = entry(p["best"])
    hardware = Hardware(args.gpu, args.cluster, args.gpus_per_node, args.seq_len, host_model_of(args), args.nics_per_node, tuple(args.profile))
    commands, jobs, sites = scaling_reproduce(args.model, out, points, hardware,
                                              0 if args.no_site or study.interrupted else args.build_top)
    for p in points:
        p["command"] = commands.get(p["gpus"])  # data.json: the main command that analyses the count's best
        p["site"] = f"top/{sites[p['gpus']]}/site/index.html" if p["gpus"] in sites else None
    first = next(iter(study.sweeps.values()))
    scaling = dict(plan.to_dict(), **study.summary, interrupted=study.interrupted)
    base = builder(counts[0])
    data = {"schema_version": 1, "model": first.model, "cluster": cluster_dict(base),
            "space": dict(space_dict(space, counts[0]), num_gpus=list(counts), global_batch_size=plan.to_dict()["global_batch_sizes"]),
            "scaling": scaling}
    rows = [r for n in counts if n in study.sweeps for r in study.sweeps[n].rows]
    files: dict[str, str | bytes] = {"scaling.csv": scaling_csv(points), "sweep.csv": csv_text(rows), "sweep.parquet": parquet_bytes(rows),
                                     "data.json": json.dumps(data, sort_keys=True, indent=1) + "\n"}
    cluster_view = dict(cluster_dict(builder(counts[-1])), num_gpus=f"{counts[0]}–{counts[-1]}")
    if not args.json:  # the table first: the analysis sites take longer to build
        _print_scaling(scaling)
    top_staging = _build_top(out, jobs, args.json, folder=scaling_folder, label=lambda n: f"the best on {n} GPUs")
    site = _publish(out, files, None if args.no_site else dict(
        kind="scaling", rows=rows, capacity_bytes=allocator_capacity_bytes(base.gpu.hbm_bytes), capacity_label=gpu_label(base), model=first.model,
        cluster=cluster_view, space=space_view(data["space"]), scaling=scaling, commands=commands, sites=sites), top_staging)
    if args.json:
        print(json.dumps(scaling, sort_keys=True))
    else:
        _print_written(out, ["scaling.csv", "sweep.csv", "sweep.parquet", "data.json"], site)
        _print_scaling_sites(scaling, out)
    return 130 if study.interrupted else 0


def _print_scaling(scaling: Mapping[str, Any]) -> None:
    from dml2comm.fmt import fmt_s
    from dml2comm.render.terminal import fit_table

    console = _console()
    cells = []
    for p in scaling["points"]:
        best = p.get("best")
        if not best:
            cells.append([str(p["gpus"]), str(p["global_batch_size"]), p["status"].replace("_", " "), "", "", "", "", ""])
            continue
        cells.append([str(p["gpus"]), str(p["global_batch_size"]), _short(best["config"]), fmt_s(best["iteration_time_s"]),
                      f"{p['samples_per_s']:,.1f}", f"{p['tokens_per_s']:,.0f}" if p["tokens_per_s"] else "-",
                      f"{p['speedup']:.2f}x of {p['ideal_speedup']:.2f}x", f"{p['efficiency']:.0%}"])
    console.print(fit_table(f"{scaling['mode']} scaling (efficiency against {scaling['baseline_gpus']} GPUs)",
                            ("GPUs", "global batch", "best configuration", "iteration", "samples/s", "tokens/s", "speed-up",
                             "efficiency"), cells, console.width, left=(0, 2)))
    _say(console, scaling["verdict"])
    if scaling.get("interrupted"):
        _say(console, "interrupted: the outputs hold the GPU counts that finished")


def _print_scaling_sites(scaling: Mapping[str, Any], out: Path) -> None:
    from dml2comm.render.terminal import line

    console = _console()
    for p in scaling["points"]:  # the built analysis sites, each with the command that rebuilds it
        if p.get("site"):
            console.print(line(f"{p['gpus']} GPUs {_short(p['best']['config'])}: {out / p['site']}", console.width,
                               prefix="analysis site:"), highlight=False)
            console.print("  " + p["command"], soft_wrap=True, highlight=False, markup=False)  # one line: copy and run


def _build_top(out: Path, jobs: Sequence[tuple[int, Sequence[str]]], quiet: bool, folder: Callable[[int], str] = str,
               label: Callable[[int], str] = lambda rank: f"#{rank}") -> Path | None:
    """Build the analysis sites of ``jobs`` ((key, argv): a rank, or a GPU count for a scaling
    study) into ``top/folder(key)`` of a staging folder inside ``out`` (moved to ``out/top`` with
    the page, by :func:`_publish`); None when there is nothing to build."""
    if not jobs:
        return None
    import tempfile

    out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".dml2comm-top-", dir=out))
    show = not quiet and sys.stderr.isatty()

    done = [0]

    def built(rank: int, path: Path) -> None:
        done[0] += 1
        if show:
            print(f"built the analysis site of {label(rank)} ({done[0]}/{len(jobs)})", file=sys.stderr, flush=True)

    try:
        build_sites(jobs, lambda rank: staging / "top" / folder(rank), on_built=built)
    except BaseException:
        import shutil

        shutil.rmtree(staging, ignore_errors=True)
        raise
    return staging


def build_sites(jobs: Sequence[tuple[int, Sequence[str]]], dest: Callable[[int], Path],
                on_built: Callable[[int, Path], None] | None = None) -> dict[int, Path]:
    """Run the main command for each ``(rank, argv)`` with ``--out`` replaced by ``dest(rank)``
    (a staging folder; the caller moves it to the ``--out`` the command line shows).  Returns
    {rank: the folder written}."""
    built: dict[int, Path] = {}
    for rank, argv in jobs:
        folder = dest(rank)
        args = list(argv)
        args[args.index("--out") + 1] = str(folder)
        analyse_and_publish(args)
        built[rank] = folder
        if on_built is not None:
            on_built(rank, folder)
    return built


def _publish(out: Path, files: Mapping[str, str | bytes], page: Mapping[str, Any] | None,
             top_staging: Path | None = None) -> Path | None:
    """Write ``files`` and (``page``: the keyword arguments of
    :func:`dml2comm.site.compare.comparison_page`) the comparison site into ``out`` atomically,
    with the analysis sites built in ``top_staging/top`` as ``out/top``."""
    import shutil

    from dml2comm.site.compare import build_and_publish_comparison, comparison_page

    try:
        if page is None:
            build_and_publish_comparison(out, files)
            return None
        kwargs = dict(page)
        ctx, charts = comparison_page(kwargs.pop("kind"), kwargs.pop("rows"), downloads=list(files), **kwargs)
        build_and_publish_comparison(out, files, ctx, charts, top=top_staging / "top" if top_staging else None)
        return out / "site" / "index.html"
    finally:
        if top_staging is not None:
            shutil.rmtree(top_staging, ignore_errors=True)


def _say(console: Any, text: str) -> None:
    """One message, wrapped at ASCII spaces (a number keeps its unit, a path stays whole)."""
    from dml2comm.render.terminal import line

    console.print(line(text, console.width))


def _console():
    from rich.console import Console

    from dml2comm.render.terminal import console_width

    return Console(width=console_width(), soft_wrap=True)  # COLUMNS, the terminal, or 160 for files and pipes


def _stack_of(rows: Sequence[Mapping[str, Any]]) -> str:
    """``training stack: pytorch, bf16 precision, flash attention`` of the rows' (shared) stack."""
    for row in rows:
        c = row.get("config") or {}
        if c.get("stack"):
            return f"training stack: {c['stack']}, {c.get('precision')} precision, {c.get('attention')} attention"
    return "training stack: -"


def _print_sweep(result: SweepResult, sweep: Mapping[str, Any], top: int) -> None:
    """The ranking: the top table, the memory caution, the Pareto front (the fitting part; the
    faster configurations on it that do not fit as a count) and the counts."""
    from dml2comm.fmt import fmt_bytes, fmt_s

    console = _console()
    best = result.top(top)
    _say(console, _stack_of(best))
    console.print(_table(f"top {top} (fitting configurations, fastest first)", best, console.width))
    caution = sweep.get("memory_caution")
    if caution:
        _say(console, _caution_text(caution, best[0]))
    front = result.pareto()
    fitting = [r for r in front if r["fits"]]
    over = [r for r in front if not r["fits"]]
    if fitting:
        console.print(_table("Pareto front of the fitting configurations (iteration time vs peak memory, fastest first)",
                             fitting[:PARETO_SHOWN], console.width))
        if len(fitting) > PARETO_SHOWN:
            _say(console, f"({len(fitting) - PARETO_SHOWN} more fitting configurations on the front in data.json)")
        if over:
            fastest = over[0]
            _say(console, f"{len(over)} faster configuration{'s' if len(over) > 1 else ''} on the front do{'' if len(over) > 1 else 'es'} "
                          f"not fit ({fmt_bytes(over[-1]['peak_memory_bytes'])} to {fmt_bytes(fastest['peak_memory_bytes'])} per GPU; "
                          f"the fastest, {_short(fastest['config'])}, {fmt_s(fastest['iteration_time_s'])}); all in data.json")
    elif front:  # nothing fits: the front shows how close the configurations come
        console.print(_table("Pareto front (iteration time vs peak memory, fastest first; none fits)", front[:PARETO_SHOWN],
                             console.width))
        if len(front) > PARETO_SHOWN:
            _say(console, f"({len(front) - PARETO_SHOWN} more on the front in data.json)")
    rate = sweep["configs_per_s"]
    line = (f"{sweep['num_configs']} configurations, {sweep['num_evaluated']} evaluated, {sweep['num_failed']} failed, "
            f"{sweep['num_fit']} fit, in {sweep['seconds']:.1f} s ({rate:.1f}/s)") if rate else "no configuration evaluated"
    _say(console, line)
    for reason, count in sweep["failure_reasons"].items():
        _say(console, f"  failed ({count}): {reason}")
    if result.interrupted:
        _say(console, "interrupted: the outputs hold the configurations that finished")


def _caution_text(caution: Mapping[str, Any], best: Mapping[str, Any]) -> str:
    """The caution line of :func:`~dml2comm.search.sweep.headroom_caution`'s result."""
    from dml2comm.fmt import fmt_bytes, fmt_s

    text = (f"caution: #1 leaves only {fmt_bytes(caution['headroom_bytes'])} ({caution['headroom_fraction']:.1%}) of the "
            f"{fmt_bytes(caution['capacity_bytes'])} the allocator can hold free; the caching allocator's fragmentation often "
            f"takes more, and the run fails out of memory. Keep at least {caution['threshold_fraction']:.0%} "
            f"({fmt_bytes(caution['keep_bytes'])}) free")
    safer = caution.get("safer")
    if safer is None:
        return text + " (no fitting configuration does)"
    row = safer.get("row", safer)
    slower = row["iteration_time_s"] / best["iteration_time_s"] - 1
    return (text + f": the fastest that does is #{safer['rank']} {_short(row['config'])}, {fmt_s(row['iteration_time_s'])} "
            f"({slower:.1%} slower), {fmt_bytes(row['peak_memory_bytes'])}")


def _print_written(out: Path, names: Sequence[str], site: Path | None) -> None:
    console = _console()
    paths = [str(out / n) for n in names]
    _say(console, f"wrote {', '.join(paths[:-1])} and {paths[-1]}" if len(paths) > 1 else f"wrote {paths[0]}")
    if site is not None:
        _say(console, f"comparison page: {site}")


def compare_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python main.py compare", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=COMPARE_EXAMPLES,
                description="Analyse a few configurations of one model side by side.")
    p.add_argument("model", help="the ONNX model")
    p.add_argument("--configs", nargs="+", required=True, metavar="SPEC",
                   help="configurations as KEY=VALUE lists: d, t, p, b (micro-batch), zero, recompute, sp, v (virtual stages)")
    _hardware_args(p, compare=True)
    return p


def run_compare_command(argv: Sequence[str]) -> int:
    args = _site_flags(compare_parser().parse_args(argv))
    resolve_gpus_per_node(args)
    if args.global_batch_size is None:
        raise ConfigError("compare needs --global-batch-size (the same batch for every configuration)")
    builder = cluster_builder(args.gpu, args.cluster, args.gpus_per_node, host_model_of(args), args.nics_per_node, _profile(args))
    evaluator = Evaluator(args.model, builder, seq_len=args.seq_len)
    seq_len = args.seq_len or model_shape(evaluator.imported(1))["seq_len"]
    configs = [parse_config_spec(s, args.global_batch_size, seq_len, args.dtype, args.optimizer, stack_kwargs(args))
               for s in args.configs]
    rows = []
    for i, (spec, config) in enumerate(zip(args.configs, configs)):
        try:
            row = evaluator.evaluate(config)
        except ConfigError as exc:  # pragma: no cover - evaluate records errors; cluster errors land here
            raise ConfigError(f"--configs {spec!r}: {exc}") from None
        if row["error"]:
            raise ConfigError(f"--configs {spec!r}: {row['error']}")
        row["index"] = i
        row["spec"] = spec
        rows.append(row)
    entries = [dict(entry(r), spec=r["spec"]) for r in rows]
    cluster = builder(max(c.num_gpus for c in configs))
    data = {"schema_version": 1, "model": {"path": str(args.model)}, "compare": entries}
    out = Path(args.out or "out/compare")
    files: dict[str, str | bytes] = {"compare.csv": csv_text(rows), "compare.parquet": parquet_bytes(rows),
                                     "data.json": json.dumps(data, sort_keys=True, indent=1) + "\n"}
    model = {"path": str(args.model), "name": evaluator.imported(1).graph.name}
    hardware = Hardware(args.gpu, args.cluster, args.gpus_per_node, args.seq_len, host_model_of(args), args.nics_per_node, tuple(args.profile))
    ranked = sorted((r for r in rows if r["fits"]), key=lambda r: (r["iteration_time_s"], r["index"]))
    commands, jobs, sites = listed_commands(args.model, out, ranked, rows, hardware, 0 if args.no_site else args.build_top,
                                       number=lambda row, rank: row["index"] + 1)  # "#K": the K-th of --configs, as in the table
    if not args.json:  # the table first: the analysis sites take longer to build
        console = _console()
        _say(console, _stack_of(rows))
        console.print(_table("configurations side by side", rows, console.width))
    top_staging = _build_top(out, jobs, args.json)
    site = _publish(out, files, None if args.no_site else dict(
        kind="compare", rows=rows, capacity_bytes=allocator_capacity_bytes(cluster.gpu.hbm_bytes), capacity_label=gpu_label(cluster), model=model,
        cluster={"name": cluster.name, "gpu": cluster.gpu.name, "gpus_per_node": cluster.gpus_per_node,
                 "num_gpus": "/".join(str(n) for n in sorted({c.num_gpus for c in configs}))},
        commands=commands, sites=sites), top_staging)
    if args.json:
        print(json.dumps(entries, sort_keys=True))
        return 0
    _print_written(out, ["compare.csv", "compare.parquet", "data.json"], site)
    _print_sites(out, ranked, commands, sites)
    return 0


def _print_sites(out: Path, ranked: Sequence[Mapping[str, Any]], commands: Mapping[int, str], sites: Mapping[int, int]) -> None:
    """The built analysis sites (fastest first), each with the command that rebuilds it; "#N" is
    the number ``sites`` gives the row (the same as in the table printed above it)."""
    from dml2comm.render.terminal import line

    console = _console()
    for r in ranked:
        rank = sites.get(r["index"])
        if rank is None:
            continue
        console.print(line(f"#{rank} {_short(r['config'])}: {out / 'top' / str(rank) / 'site' / 'index.html'}", console.width,
                           prefix="analysis site:"), highlight=False)
        console.print("  " + commands[r["index"]], soft_wrap=True, highlight=False, markup=False)  # one line: copy and run
