"""The ``trace`` subcommand: what really happened in a profiled run, beside what was predicted.

    python main.py trace torch_profile/ --processes 8 --out trace_out
    python main.py trace rank-0.json.gz rank-1.json.gz --model gpt.onnx --d 2 --t 1 --p 1 --global-batch-size 16

Outputs (``--out DIR``, published together): ``trace_analysis.json`` (schema_version 1: per rank
``rank``, ``steps`` with ``compute_s``, ``comm_s`` by tp/dp/pp/cp/ep/other, ``overlap_s``,
``exposed_comm_s``, ``idle_s``, its ``micro_batches`` with the detection ``method``, and the
``problems`` found; the set's problems; the ``layout`` (coordinates and model replicas, with how
they were found); the HolisticTraceAnalysis-compatible figures; the comparison when a model is
given; ``join``: the lowest rank's step's GPU time per operator, phase and, with ``--model``,
layer, with what stayed unattributed, :mod:`dml2comm.traces.join`; null for a run without GPU
kernels),
``events.parquet`` (every classified event), ``steps.parquet`` (per-step metrics),
``comparison.csv`` (with ``--model``), ``svg_file/`` and ``site/`` (unless ``--no-site``).

Bad files do not stop the others: each is listed with its reason in ``problems`` and on stdout;
the exit code is 0 when at least one rank was analysed and 2 when none was.  What it reports is
computed by :mod:`dml2comm.traces.report` and :mod:`dml2comm.site.traces`.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from dml2comm.cli.args import (DTYPE_CHOICES, ZERO_STAGES, OneLineParser, check_cp_scheme, check_gpus_per_node, check_virtual_stages,
                               micro_batch_size, non_negative_int, positive_int, sequence_length)
from dml2comm.cli.progress import progress_bar
from dml2comm.executors import add_executor_args, executor_from_args
from dml2comm.export.files import check_output_folder
from dml2comm.fmt import fmt_s
from dml2comm.traces.analyze import TraceSet, analyze_traces
from dml2comm.traces.classify import DIMS
from dml2comm.errors import ConfigError
from dml2comm.parallel.config import CP_SCHEMES, OPTIMIZERS, PRECISIONS, RECOMPUTE_MODES, SCHEDULES, STACKS
from dml2comm.traces.layout import COORD_DIMS, DIM_WORDS, ParallelSizes
from dml2comm.traces.load import TraceError, find_trace_files
from dml2comm.traces.report import (PREDICTION_DEFAULTS, comparison_csv, events_parquet, file_column, file_note, hta_overlap, join_columns,
                                    join_rows, join_step, join_summary, json_default, predicted_comparison, steps_parquet,
                                    trace_analysis_dict)
from dml2comm.site.traces import page_context, publish_trace_outputs, trace_drawings

__all__ = ["trace_parser", "run_trace_command", "refuse_idle_prediction_flags", "refuse_unused_flags", "run_sizes"]

EXAMPLES = """examples (on the bundled 4-rank PyTorch-profiler trace; yours: a folder of rank-N.json[.gz]):
  python main.py trace tests/fixtures/traces/gloo_pp2_dp2 --processes 2 --out out/trace
  python main.py trace tests/fixtures/traces/gloo_pp2_dp2/rank-0.json.gz tests/fixtures/traces/gloo_pp2_dp2/rank-1.json.gz --json --no-site
  python main.py trace tests/fixtures/traces/gloo_pp2_dp2 --model examples/gpt2-small.onnx --global-batch-size 8 --gpu h100
  python main.py trace tests/fixtures/traces/gloo_pp2_dp2 --executor dask --processes 2
(--executor dask needs pip install 'dml2comm[dask]'; with --scheduler tcp://HOST:8786 the ranks are analysed on a running Dask
cluster, whose workers read the trace files from a filesystem they share with this machine)
"""


def trace_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python main.py trace", description="Analyse per-rank PyTorch-profiler (Kineto) traces.",
                      epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="+", help="trace files (.json, .json.gz) or folders holding them (e.g. Megatron's torch_profile/)")
    p.add_argument("--processes", type=positive_int, default=1,
                   help="ranks analysed in parallel (default 1; with --executor dask and no --scheduler: LocalCluster workers)")
    p.add_argument("--out", default="out/trace", help="output folder (default: out/trace, beside the analysis's out/; its site/ and svg_file/ "
                   "are replaced)")
    p.add_argument("--no-site", action="store_true", help="write trace_analysis.json and the Parquet tables only")
    p.add_argument("--json", action="store_true", help="print trace_analysis.json's per-rank summary as JSON")
    add_executor_args(p, "--processes")
    m = p.add_argument_group("the run's sizes (optional)",
                             "--d/--t/--p/--cp must agree with what the traces show (refused otherwise); they place the ranks "
                             "in model replicas when the traces name no process group and no send/recv peer "
                             "(--rank-order: in which order), and are the prediction's sizes (unset: taken from the traces)")
    m.add_argument("--d", type=positive_int, help="data-parallel size")
    m.add_argument("--t", type=positive_int, help="tensor-parallel size")
    m.add_argument("--p", type=positive_int, help="pipeline-parallel size")
    m.add_argument("--cp", type=positive_int, help="context-parallel size")
    m.add_argument("--rank-order", help="rank order, fastest first (default tdp: Megatron)")
    f = p.add_argument_group("prediction (optional): the model and configuration of the run; these flags need --model")
    f.add_argument("--model", help="the ONNX model the run trained")
    f.add_argument("--cp-scheme", choices=CP_SCHEMES, help="default ulysses; needs a context-parallel run (cp 2 or more)")
    f.add_argument("--ep", type=positive_int, help="expert-parallel size (carved out of d x cp; default 1)")
    f.add_argument("--micro-batch-size", type=micro_batch_size)
    f.add_argument("--global-batch-size", type=positive_int)
    f.add_argument("--seq-len", type=sequence_length)
    f.add_argument("--dtype", choices=DTYPE_CHOICES, help="default bf16")
    f.add_argument("--schedule", choices=SCHEDULES, help="default 1f1b")
    f.add_argument("--virtual-stages", type=positive_int, help="default 1; needs --schedule interleaved and p of 2 or more")
    f.add_argument("--recompute", choices=RECOMPUTE_MODES, help="default none")
    f.add_argument("--zero", type=non_negative_int, choices=ZERO_STAGES, help="default 0")
    f.add_argument("--sequence-parallel", action="store_true", default=None)
    f.add_argument("--stack", choices=STACKS, help="what ran the model: megatron (default) or pytorch (eager PyTorch / Hugging "
                                                   "Face: one kernel per op, SDPA flash attention)")
    f.add_argument("--precision", choices=PRECISIONS, help="default: mixed with --stack megatron, amp with --stack pytorch")
    f.add_argument("--optimizer", choices=OPTIMIZERS, help="default adam")
    f.add_argument("--inputs-on-gpu", action="store_true", default=None,
                   help="the step's inputs were on the GPU before its forward (default: as the trace shows: on the GPU "
                        "where the step copied no input there)")
    f.add_argument("--gpu", help="default a100")
    f.add_argument("--cluster", help="a cluster preset or file; a file from python main.py calibrate also predicts with its base "
                   "preset's constants, side by side")
    f.add_argument("--gpus-per-node", type=positive_int, help="GPUs per node of --gpu (default 8); a --cluster has its own, another "
                                                             "value is refused")
    return p


# ---------------------------------------------------------------------------------------------
# flags against the traces
# ---------------------------------------------------------------------------------------------

#: (layout dimension, flag attribute) of the sizes
_SIZE_FLAGS = (("dp", "d"), ("tp", "t"), ("pp", "p"), ("cp", "cp"))
#: Layout methods whose sizes come from the traces themselves (flags are checked against them).
_FROM_TRACES = ("process groups", "send/recv peers")


def _flag(attr: str) -> str:
    return "--" + attr.replace("_", "-")


def refuse_unused_flags(args: argparse.Namespace) -> None:
    """A prediction flag without ``--model`` would be silently ignored: refuse it."""
    if args.model:
        return
    unused = [_flag(k) for k in PREDICTION_DEFAULTS if getattr(args, k) is not None]
    if unused:
        raise ConfigError(f"{', '.join(unused)} {'is' if len(unused) == 1 else 'are'} used only by the prediction: "
                          f"add --model MODEL.onnx or drop {'it' if len(unused) == 1 else 'them'}")


def refuse_idle_prediction_flags(args: argparse.Namespace, run: dict[str, int]) -> None:
    """Prediction flags the run's sizes (:func:`run_sizes`) give nothing to act on, refused as the
    analysis refuses them: ``--virtual-stages`` without the interleaved schedule over p >= 2
    (:func:`~dml2comm.cli.args.check_virtual_stages`), ``--cp-scheme`` without context
    parallelism and a ``--gpus-per-node`` that contradicts ``--cluster``."""
    check_virtual_stages(args.virtual_stages or 1, args.schedule or PREDICTION_DEFAULTS["schedule"], run["pp"])
    check_cp_scheme(args.cp_scheme, run["cp"], "this run (cp 1) does not use", "drop --cp-scheme")
    check_gpus_per_node(args.gpus_per_node, args.cluster)


def run_sizes(args: argparse.Namespace, ts: TraceSet) -> tuple[dict[str, int], str]:
    """The run's sizes (dp, tp, pp, cp) for the prediction, and where they come from.

    A flag that contradicts a size the traces show (:attr:`~dml2comm.traces.layout.Layout.sizes`
    of a layout from process groups or send/recv peers), or sizes whose product is not the
    traces' world size, raise :class:`ConfigError`.  An unset size is the traces' (a layout from
    groups or peers), else the one left by the world size and the others (data parallelism when
    several are unknown; ``--d`` = world size when nothing is known: each rank its own replica),
    else 1."""
    lay = ts.layout
    worlds = [r.world_size for r in ts.ranks if r.world_size]
    world = max(worlds) if worlds else None
    given = {dim: getattr(args, attr) for dim, attr in _SIZE_FLAGS if getattr(args, attr) is not None}
    shown = dict(lay.sizes) if lay is not None and lay.method in _FROM_TRACES else {}
    for dim, attr in _SIZE_FLAGS:
        n = shown.get(dim)
        if dim in given and n is not None and n != given[dim]:
            raise ConfigError(f"--{attr} {given[dim]} contradicts the traces: they show {lay.shown()} "  # type: ignore[union-attr]
                              f"(from {lay.method}: {n} {DIM_WORDS[dim][0]}{'s' if n != 1 else ''}); "  # type: ignore[union-attr]
                              f"pass --{attr} {n} or leave --{attr} out")
    sizes: dict[str, int | None] = {d: given.get(d, shown.get(d)) for d in COORD_DIMS}
    unknown = [d for d in COORD_DIMS if sizes[d] is None]
    used_shown = any(d not in given and shown.get(d) is not None for d in COORD_DIMS)
    origin = [x for x in ("the flags" if given else "", f"the traces' {lay.method}" if used_shown else "") if x]  # type: ignore[union-attr]
    source = "from " + " and ".join(origin) if origin else "no size given or shown by the traces"
    if unknown:
        rest = "dp" if "dp" in unknown else unknown[0]
        for d in unknown:
            if d != rest:
                sizes[d] = 1
        known = math.prod(v or 1 for d, v in sizes.items() if d != rest)
        if world is not None and world % known == 0:
            sizes[rest] = world // known
            source += f"; {DIM_WORDS[rest][1]} {world // known} = world size {world} / the others"
        else:
            sizes[rest] = 1
    total = math.prod(v or 1 for v in sizes.values())
    if world is not None and total != world and given:
        flags = " ".join(f"--{attr} {sizes[dim]}" for dim, attr in _SIZE_FLAGS)
        raise ConfigError(f"{flags} make {total} ranks, but the traces come from a world of {world} ranks"
                          + (f" ({lay.shown()})" if shown else "") + f"; give sizes whose product is {world}")
    if args.rank_order is not None and not args.model and (lay is None or lay.method != "configuration"):
        why = f"the ranks are placed from {lay.method}" if lay is not None else "no layout is drawn"
        raise ConfigError(f"--rank-order is not used: {why}, and there is no --model to predict; drop --rank-order")
    return {d: int(v or 1) for d, v in sizes.items()}, source


# ---------------------------------------------------------------------------------------------
# prediction
# ---------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------
# command
# ---------------------------------------------------------------------------------------------


def run_trace_command(argv: Sequence[str]) -> int:
    args = trace_parser().parse_args(argv)
    start = time.perf_counter()
    from dml2comm.hardware.cluster import RankMap

    refuse_unused_flags(args)
    check_output_folder(args.out)  # before any trace is read
    flags = ParallelSizes(args.d or 1, args.t or 1, args.p or 1, args.cp or 1, args.rank_order or "tdp")
    RankMap(flags.dp, flags.tp, flags.pp, flags.order, cp=flags.cp)  # a bad --rank-order is an error before any work
    files = find_trace_files(list(args.paths))
    progress = progress_bar("ranks", sys.stderr.isatty() and not args.json)
    try:
        with executor_from_args(args, args.processes) as executor:
            ts = analyze_traces(files, sizes=flags, executor=executor, on_progress=progress)
    finally:
        if progress is not None:
            progress.stop()  # type: ignore[attr-defined]
    if not ts.ranks:
        reasons = "; ".join(ts.problems) or "no trace could be read"
        raise TraceError(f"no rank could be analysed: {reasons}")
    run, source = run_sizes(args, ts)  # flags that contradict the traces: an error before anything is written
    refuse_idle_prediction_flags(args, run)
    join = join_step(ts, args.model, args.micro_batch_size, args.seq_len)
    options = {k: getattr(args, k) for k in PREDICTION_DEFAULTS}
    if join is not None and options["micro_batch_size"] is None and join.get("micro_batch"):
        # the step's own inputs (token ids, or an image model's batch), as the join bound the model
        options["micro_batch_size"] = join["micro_batch"]
        source += "; the micro-batch from the trace's inputs"
    if join is not None and options["seq_len"] is None and join.get("seq_len"):
        options["seq_len"] = join["seq_len"]  # the token ids' length, as the join bound the model
    if join is not None and join.get("passes", 1) > 1 and options["global_batch_size"] is None and run["pp"] == 1:
        # gradient accumulation: the step ran its passes' micro-batches on each replica
        options["global_batch_size"] = join["passes"] * run["dp"] * (options["micro_batch_size"] or 1)
        source += f"; {join['passes']} micro-batches per step from the trace's passes"
    if join is not None and join["layers"] and not any(x["kind"] == "input" for x in join["layers"]):
        options["inputs_on_gpu"] = True  # the step copied no input to the GPU: its batch was there
        source += "; no input copy in the step"
    if join is not None and args.model:
        source = _what_the_step_ran(ts, join, options, source)
    comparison = None if not args.model else predicted_comparison(ts, args.model, run, source, options, args.rank_order)
    data = trace_analysis_dict(ts, comparison)
    data["join"] = join
    out_files: dict[str, str | bytes] = {
        "trace_analysis.json": json.dumps(data, sort_keys=True, indent=1, default=json_default) + "\n",
        "events.parquet": events_parquet(ts),
        "steps.parquet": steps_parquet(ts),
    }
    if comparison is not None:
        out_files["comparison.csv"] = comparison_csv(comparison)
    svgs, extra = trace_drawings(ts)
    context = None if args.no_site else page_context(ts, data, len(files), extra)
    out = Path(args.out)
    publish_trace_outputs(out, out_files, context, svgs)
    if args.json:
        print(json.dumps({"ranks": [{"rank": r["rank"], "summary": r["summary"], "problems": r["problems"]} for r in data["ranks"]],
                          "problems": data["problems"]}, sort_keys=True, default=json_default))
    else:
        _print(ts, data, out, time.perf_counter() - start, site=not args.no_site)
    return 0


def _what_the_step_ran(ts: TraceSet, join: dict[str, Any], options: dict[str, Any], source: str) -> str:
    """The prediction's options the traces show, where no flag sets them: the GPU the ranks ran on
    (no ``--gpu`` or ``--cluster``; all ranks one GPU the tool knows), and an eager PyTorch step's
    stack and precision (its fused AdamW kernels: no ``--stack``, no ``--precision``), as
    ``--profile`` takes them.  Returns ``source`` with what was taken, and a warning where the
    flags bind the model to another shape than the traced step's."""
    from dml2comm.parallel.config import Stack
    from dml2comm.traces.predict import trace_gpu

    taken = []
    if options["gpu"] is None and options["cluster"] is None:
        gpus = {trace_gpu(r.device or "") for r in ts.ranks}
        if len(gpus) == 1 and None not in gpus:
            options["gpu"] = gpus.pop()
            taken.append(f"the traces' GPU ({options['gpu']})")
    ran = join.get("eager_precision")
    if ran is not None and options["stack"] is None:
        options["stack"] = str(Stack.PYTORCH)
        taken.append("the pytorch stack (PyTorch's fused AdamW ran)")
    if ran is not None and options["precision"] is None and Stack.of(options["stack"]) is Stack.PYTORCH:
        options["precision"] = ran
        taken.append(f"precision {ran} (its optimizer's parameters)")
    traced = join.get("traced_shape")
    if traced and (options["micro_batch_size"] not in (None, traced[0])
                   or traced[1] is not None and options["seq_len"] not in (None, traced[1])):
        ran = f"b={traced[0]}" + (f" s={traced[1]}" if traced[1] is not None else "")
        taken.append(f"NOT the traced step's shape, which ran {ran}: the errors compare two workloads")
    return source + "".join(f"; {t}" for t in taken)


def _print(ts: TraceSet, data: dict[str, Any], out: Path, elapsed: float, site: bool) -> None:
    from rich.console import Console

    from dml2comm.render.terminal import console_width, fit_table, line

    console = Console(highlight=False, width=console_width(), soft_wrap=True)
    w = console.width  # at 80 columns the tables split or stack, values whole
    clock = "CPU" if all(r.activity.device == "cpu" for r in ts.ranks) else "GPU"
    rank_rows = []
    for r in data["ranks"]:
        s = r["summary"]
        rank_rows.append([str(r["rank"]), str(s["steps"]), fmt_s(s["wall_s"]), fmt_s(s["compute_s"]),
                          *[fmt_s(s["comm_s"][d]) for d in DIMS], fmt_s(s["overlap_s"]),
                          fmt_s(s["exposed_comm_s"]), fmt_s(s["idle_s"]), hta_overlap(r["hta"])])
    console.print(fit_table(f"per rank, mean per step ({clock} time)",
                            ("rank", "steps", "step", "compute", *DIMS, "overlap", "exposed comm", "idle", "HTA overlap"),
                            rank_rows, console.width))
    na = next((r["hta"]["not_applicable"] for r in data["ranks"] if r["hta"].get("not_applicable")), None)
    if na:
        console.print(line(na, w, prefix="HTA overlap n/a:"))
    if data["comparison"]:
        cmp = data["comparison"]
        comparable = cmp.get("comparable", True)
        with_base = bool(cmp["rows"]) and "predicted_base_s" in cmp["rows"][0]
        mine = file_column(cmp)
        if with_base:
            cols = ("category", "measured", "base", mine) + (("base error", f"{mine} error") if comparable else ())
        else:
            cols = ("category", "predicted", "measured") + (("error",) if comparable else ())
        cmp_rows = []
        for row in cmp["rows"]:
            if with_base:
                cells = [row["label"], fmt_s(row["measured_s"]), fmt_s(row["predicted_base_s"]), fmt_s(row["predicted_s"])]
                errors = [row["error_base"], row["error"]]
            else:
                cells = [row["label"], fmt_s(row["predicted_s"]), fmt_s(row["measured_s"])]
                errors = [row["error"]]
            if comparable:
                cells += [f"{e:+.1%}" if e is not None else "n/a" for e in errors]
            cmp_rows.append(cells)
        console.print(fit_table(f"predicted vs measured ({cmp['what']})", cols, cmp_rows, console.width))
        if cmp.get("cluster_file"):
            console.print(line(file_note(cmp["cluster_file"]), w, prefix="constants:"))
        if cmp.get("caveat"):
            console.print(line(cmp["caveat"], w, prefix="not comparable:", style="yellow"))
    if data.get("join"):
        _print_join(console, data["join"])
    if data["layout"]:
        lay = data["layout"]
        console.print(line(f"{len(lay['replicas'])} (from {lay['method']}: {lay['detail']})", w, prefix="model replicas:"))
    for p in data["problems"]:
        console.print(line(p, w, prefix="problem:", style="yellow"))
    for r in data["ranks"]:
        for p in r["problems"]:
            console.print(line(f"rank {r['rank']}: {p}", w, prefix="problem:", style="yellow"))
    wrote = ["trace_analysis.json", "events.parquet", "steps.parquet"] + (["comparison.csv"] if data["comparison"] else [])
    console.print(line(f"wrote {', '.join(str(out / name) for name in wrote)} in {elapsed:.2f} s "
                       f"({len(ts.ranks)} rank{'s' if len(ts.ranks) != 1 else ''}, {len(ts.failures)} failed)", w))
    if site:
        console.print(line(f"site: open {(out / 'site' / 'index.html').resolve()}", w))


def _print_join(console: Any, join: dict[str, Any]) -> None:
    from dml2comm.render.terminal import fit_table, line

    w = console.width
    cols = join_columns(join)
    console.print(fit_table(f"GPU time by {cols[0]}, rank {join['rank']}'s step", cols, join_rows(join), w))
    console.print(line(join_summary(join), w, prefix="join:"))
    for n in join["notes"]:
        console.print(line(n, w, prefix="join:", style="yellow"))
