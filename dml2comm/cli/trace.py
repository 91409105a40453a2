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
the exit code is 0 when at least one rank was analysed and 2 when none was.  (This module prints
because it *is* a command front end, called only from ``cli.py``.)
"""

from __future__ import annotations

import argparse
import io
import json
import math
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from dml2comm.cli.args import DTYPE_CHOICES, ZERO_STAGES, OneLineParser, positive_int
from dml2comm.cli.progress import progress_bar
from dml2comm.executors import add_executor_args, executor_from_args
from dml2comm.export.files import check_output_folder
from dml2comm.fmt import fmt_s
from dml2comm.traces.analyze import RankResult, TraceSet, analyze_traces
from dml2comm.traces.classify import DIMS
from dml2comm.errors import ConfigError
from dml2comm.parallel.config import CP_SCHEMES, RECOMPUTE_MODES, SCHEDULES
from dml2comm.traces.layout import COORD_DIMS, DIM_WORDS, ParallelSizes
from dml2comm.traces.load import TraceError, find_trace_files

__all__ = ["trace_parser", "run_trace_command", "trace_analysis_dict", "events_parquet", "steps_parquet", "refuse_unused_flags",
           "run_sizes", "PREDICTION_DEFAULTS", "join_rows", "join_summary"]

EXAMPLES = """examples (on the bundled 4-rank PyTorch-profiler trace; yours: a folder of rank-N.json[.gz]):
  python main.py trace tests/fixtures/traces/gloo_pp2_dp2 --processes 2 --out out/trace
  python main.py trace tests/fixtures/traces/gloo_pp2_dp2/rank-0.json.gz tests/fixtures/traces/gloo_pp2_dp2/rank-1.json.gz --json --no-site
  python main.py trace tests/fixtures/traces/gloo_pp2_dp2 --model examples/gpt2-small.onnx --global-batch-size 8 --gpu h100
  python main.py trace tests/fixtures/traces/gloo_pp2_dp2 --executor dask --processes 2
(--executor dask needs pip install 'dml2comm[dask]'; with --scheduler tcp://HOST:8786 the ranks are analysed on a running Dask
cluster, whose workers read the trace files from a filesystem they share with this machine)
"""

#: Gantt charts drawn at most (pipeline groups; model replicas), rows per chart at most, ranks in
#: the replica bar chart at most.
MAX_GANTTS = 8
MAX_ROWS = 32
MAX_BAR_RANKS = 256


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
    f.add_argument("--cp-scheme", choices=CP_SCHEMES, help="default ulysses")
    f.add_argument("--ep", type=positive_int, help="expert-parallel size (carved out of d x cp; default 1)")
    f.add_argument("--micro-batch-size", type=positive_int)
    f.add_argument("--global-batch-size", type=positive_int)
    f.add_argument("--seq-len", type=positive_int)
    f.add_argument("--dtype", choices=DTYPE_CHOICES, help="default bf16")
    f.add_argument("--schedule", choices=SCHEDULES, help="default 1f1b")
    f.add_argument("--virtual-stages", type=positive_int, help="default 1")
    f.add_argument("--recompute", choices=RECOMPUTE_MODES, help="default none")
    f.add_argument("--zero", type=int, choices=ZERO_STAGES, help="default 0")
    f.add_argument("--sequence-parallel", action="store_true", default=None)
    f.add_argument("--gpu", help="default a100")
    f.add_argument("--cluster", help="a cluster preset or file; a file from python main.py calibrate also predicts with its base "
                   "preset's constants, side by side")
    f.add_argument("--gpus-per-node", type=positive_int, help="default 8")
    return p


# ---------------------------------------------------------------------------------------------
# outputs
# ---------------------------------------------------------------------------------------------


def _mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values) if values else 0.0


def rank_summary(r: RankResult) -> dict[str, Any]:
    """Mean over the rank's steps of each figure."""
    s = r.steps
    out = {k: _mean([x[k] for x in s]) for k in ("wall_s", "compute_s", "comm_total_s", "overlap_s", "exposed_comm_s", "idle_s",
                                                 "forward_s", "backward_s", "recompute_s", "optimizer_s", "memcpy_s")}
    out["comm_s"] = {d: _mean([x["comm_s"][d] for x in s]) for d in DIMS}
    out["steps"] = len(s)
    return out


def trace_analysis_dict(ts: TraceSet, comparison: dict[str, Any] | None = None) -> dict[str, Any]:
    from dml2comm.traces.overlap import percentages

    breakdown = _kernel_types(ts)
    ranks = []
    for r in ts.ranks:
        d = r.to_dict()
        d["summary"] = rank_summary(r)
        ranks.append(d)
    return {
        "schema_version": 1,
        "ranks": ranks,
        "failed_files": [{"file": f.path, "reason": f.reason} for f in ts.failures],
        "problems": ts.problems,
        "pipeline_groups": [list(g) for g in ts.pipeline_groups],
        "layout": _layout_dict(ts, {r["rank"]: r["summary"] for r in ranks}),
        "hta": {"kernel_type_breakdown_us": breakdown, "kernel_type_percentage": percentages(breakdown),
                "reference": "holistictraceanalysis 0.5.0 definitions (get_comm_comp_overlap, get_gpu_kernel_breakdown, "
                             "get_temporal_breakdown)"},
        "comparison": comparison,
    }


def _layout_dict(ts: TraceSet, summaries: dict[int, dict[str, Any]]) -> dict[str, Any] | None:
    """The layout with, per replica, its step (the slowest of its ranks' mean steps) and that rank."""
    if ts.layout is None:
        return None
    out = ts.layout.to_dict()
    for rep in out["replicas"]:
        walls = [(summaries[r]["wall_s"], r) for r in rep["ranks"] if r in summaries and summaries[r]["steps"]]
        rep["step_s"], rep["slowest_rank"] = max(walls, key=lambda w: (w[0], -w[1])) if walls else (None, None)
    return out


def _kernel_types(ts: TraceSet) -> dict[str, int]:
    """HTA's kernel-type table over the set: the per-rank tables (computed in the workers) summed."""
    total: dict[str, int] = {}
    for r in ts.ranks:
        for k, v in r.hta["kernel_types_us"].items():
            total[k] = total.get(k, 0) + v
    return dict(sorted(total.items(), key=lambda kv: (-kv[1], kv[0])))


def _parquet(table: Any) -> bytes:
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd")
    return buf.getvalue()


def events_parquet(ts: TraceSet) -> bytes:
    """Every classified event (:func:`dml2comm.traces.analyze.activity_events_table`, per rank,
    computed where the rank was analysed), ranks in order."""
    import pyarrow as pa

    parts = [r.events_table() for r in ts.ranks]
    if not parts:
        return _parquet(pa.table({"rank": pa.array([], pa.int32())}))
    return _parquet(pa.concat_tables(parts, promote_options="permissive"))


def steps_parquet(ts: TraceSet) -> bytes:
    """Per rank and step: every figure of :func:`dml2comm.traces.metrics.step_metrics`, with
    ``comm_s`` spread into ``comm_tp_s`` ... ``comm_other_s``."""
    import pyarrow as pa

    rows = []
    for r in ts.ranks:
        for s in r.steps:
            row = {"rank": r.rank, **{k: v for k, v in s.items() if k != "comm_s"}}
            row.update({f"comm_{d}_s": v for d, v in s["comm_s"].items()})
            rows.append(row)
    return _parquet(pa.Table.from_pylist(rows) if rows else pa.table({"rank": pa.array([], pa.int32())}))


# ---------------------------------------------------------------------------------------------
# flags against the traces
# ---------------------------------------------------------------------------------------------

#: Flags only the prediction reads, with their defaults: refused without ``--model`` (the
#: command could not honour them).
PREDICTION_DEFAULTS: dict[str, Any] = {
    "cp_scheme": "ulysses", "ep": 1, "micro_batch_size": None, "global_batch_size": None, "seq_len": None, "dtype": "bf16",
    "schedule": "1f1b", "virtual_stages": 1, "recompute": "none", "zero": 0, "sequence_parallel": False, "gpu": "a100",
    "cluster": None, "gpus_per_node": 8,
}
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


def _prediction(args: argparse.Namespace, ts: TraceSet, run: dict[str, int], source: str) -> dict[str, Any] | None:
    if not args.model:
        return None
    from dataclasses import replace

    from dml2comm.analysis import analyze, comm_by_dim
    from dml2comm.hardware.cluster import get_cluster, is_cluster_file, make_cluster
    from dml2comm.parallel.config import ParallelConfig
    from dml2comm.traces.compare import comparison_caveat, comparison_rows, measured_per_category, predicted_per_category

    args = argparse.Namespace(**{**vars(args), **{k: v for k, v in PREDICTION_DEFAULTS.items() if getattr(args, k) is None}})
    d, t, p, cp = run["dp"], run["tp"], run["pp"], run["cp"]
    num = d * t * p * cp
    micro = args.micro_batch_size or 1
    config = ParallelConfig(dp_size=d, tp_size=t, pp_size=p, micro_batch_size=micro,
                            global_batch_size=args.global_batch_size or micro * d * p, seq_len=args.seq_len,
                            dtype=args.dtype, schedule=args.schedule, virtual_stages=args.virtual_stages, zero_stage=args.zero,
                            sequence_parallel=args.sequence_parallel, recompute=args.recompute,
                            rank_order=args.rank_order or "tdp", cp_size=cp, cp_scheme=args.cp_scheme, ep_size=args.ep)
    cluster = get_cluster(args.cluster, num) if args.cluster else make_cluster(args.gpu, num, min(args.gpus_per_node, num))
    cluster = replace(cluster, collective_overhead_s=0.0)
    analysis = analyze(args.model, config, cluster)
    predicted = predicted_per_category(analysis.summary, comm_by_dim(analysis))
    measured = measured_per_category([{"steps": r.steps} for r in ts.ranks])
    sizes = f"d={d} t={t} p={p}" + (f" cp={cp} ({args.cp_scheme})" if cp > 1 else "") + \
        (f" ep={args.ep}" if args.ep > 1 else "")
    what = (f"{Path(args.model).name}, {sizes} ({source}), b={config.micro_batch_size} "
            f"B={config.global_batch_size}, {config.schedule}, {cluster.gpu.name}")
    caveat = comparison_caveat([r.activity.device for r in ts.ranks], {r.backend for r in ts.ranks}, cluster.gpu.name)
    file_info, base = _base_prediction(args, config, num) if args.cluster and is_cluster_file(args.cluster) else (None, None)
    rows = comparison_rows(predicted, measured, comparable=caveat is None, base=base)
    return {"model": str(args.model), "what": what, "rows": rows, "comparable": caveat is None, "caveat": caveat,
            "cluster_file": file_info}


def _base_prediction(args: argparse.Namespace, config: Any, num: int) -> tuple[dict[str, Any], dict[str, float | None] | None]:
    """For ``--cluster FILE.yaml``: the file's identity and, when its ``base`` is a preset (or a
    cluster file beside it), the prediction per category with the base's constants
    (:func:`dml2comm.calibrate.base.base_cluster`), so that the table shows what calibrating
    changed."""
    from dataclasses import replace

    from dml2comm.analysis import analyze, comm_by_dim
    from dml2comm.calibrate.base import base_cluster
    from dml2comm.hardware.cluster_file import load_cluster_file
    from dml2comm.traces.compare import predicted_per_category

    spec = load_cluster_file(args.cluster)
    info: dict[str, Any] = {"name": spec.file_name, "sha256": spec.sha256, "calibrated": bool(spec.calibration),
                            "date": spec.calibration.get("date"), "base": spec.base, "base_gpu": None, "note": None}
    found = base_cluster(spec, num)
    if found is None:
        info["note"] = (f"its base {spec.base!r} is neither a preset nor a cluster file beside it" if spec.base
                        else "it names no base") + ": no prediction with the base's constants"
        return info, None
    cluster = replace(found[0], collective_overhead_s=0.0)
    info["base_gpu"] = cluster.gpu.name
    analysis = analyze(args.model, config, cluster)
    return info, predicted_per_category(analysis.summary, comm_by_dim(analysis))


def _comparison_csv(comparison: dict[str, Any]) -> str:
    keys = ["predicted_s", "measured_s", "error"]
    if comparison["rows"] and "predicted_base_s" in comparison["rows"][0]:
        keys += ["predicted_base_s", "error_base"]
    lines = ["category," + ",".join(keys)]
    for r in comparison["rows"]:
        lines.append(",".join([r["category"]] + ["" if r[k] is None else f"{r[k]:.9g}" for k in keys]))
    return "\n".join(lines) + "\n"


def _join(args: argparse.Namespace, ts: TraceSet) -> dict[str, Any] | None:
    """The lowest rank's step mapped onto operators, phases and (with ``--model``) the model's
    layers (:func:`dml2comm.traces.join.join_trace`).  The model's symbolic batch and sequence
    dims are bound to ``--micro-batch-size``/``--seq-len`` or, unset, to the token ids' shape the
    trace recorded; a model that cannot be read so gives the join without layers and a note."""
    from dml2comm.traces.join import join_trace, token_shape
    from dml2comm.traces.load import load_trace

    if not ts.ranks:
        return None
    first = min(ts.ranks, key=lambda r: r.rank)
    trace = load_trace(first.path, shapes=True)
    layered, note = None, None
    if args.model:
        from dml2comm.errors import Dml2CommError
        from dml2comm.ir.layers import group_layers
        from dml2comm.ir.onnx_import import ImportOptions, load_model

        shape = token_shape(trace)
        batch = args.micro_batch_size or (shape[0] if shape else None)
        seq = args.seq_len or (shape[1] if shape else None)
        try:
            layered = group_layers(load_model(args.model, ImportOptions(batch_size=batch, seq_len=seq)).graph)
        except Dml2CommError as exc:
            note = f"the model's layers are not used: {exc}"
    joined = join_trace(trace, layered)
    if joined.kernels == 0:
        return None  # a CPU-only (gloo) run: no GPU kernels to place
    out = joined.to_dict()
    if note:
        out["notes"].insert(0, note)
    return out


# ---------------------------------------------------------------------------------------------
# drawings and page data
# ---------------------------------------------------------------------------------------------


def _drawings(ts: TraceSet) -> tuple[dict[str, str], dict[str, Any]]:
    """The SVGs of the site: a Gantt chart per pipeline group, then one per model replica not
    already drawn (both on the global clock, step ``segment_step`` of each rank), the ranks'
    mean steps grouped by replica, and the micro-batch bars."""
    from dml2comm.traces.charts import GanttInput, ReplicaRow, pipeline_gantt, replica_bars, stacked_bars

    svgs: dict[str, str] = {}
    by_rank = {r.rank: r for r in ts.ranks}
    places = ts.layout.places if ts.layout is not None else {}

    def label(rank: int) -> str:
        return places[rank].label() if rank in places else f"rank {rank}"

    def gantt(ranks: Sequence[int]) -> list[GanttInput]:
        rows = []
        for rank in [x for x in ranks if x in by_rank][:MAX_ROWS]:
            r = by_rank[rank]
            k = next((i for i, s in enumerate(r.activity.steps) if s[0] == r.segment_step), None)
            if k is not None:
                rows.append(GanttInput(label(rank), r.activity, k))
        return rows

    candidates: list[tuple[str, tuple[int, ...]]] = []
    groups = [g for g in ts.pipeline_groups if any(x in by_rank for x in g)]
    for gi, group in enumerate(groups):
        candidates.append((f"Pipeline group {gi}: ranks {', '.join(map(str, group))}", group))
    if not groups:
        candidates.append(("All ranks", tuple(sorted(by_rank))))
    drawn = [frozenset(x for x in g if x in by_rank) for _, g in candidates]
    if ts.layout is not None and ts.layout.method != "assumed":
        for rid, members in zip(ts.layout.replica_ids, ts.layout.replicas):
            if len(members) > 1 and frozenset(members) not in drawn:
                candidates.append((f"Model replica {rid}: ranks {', '.join(map(str, members))}", members))
                drawn.append(frozenset(members))
    gantts = []
    n_pipe = n_rep = 0
    for title, ranks in candidates:
        replica = title.startswith("Model replica")
        if (n_rep if replica else n_pipe) >= MAX_GANTTS:
            continue
        rows = gantt(ranks)
        if not rows:
            continue
        step = by_rank[[x for x in ranks if x in by_rank][0]].segment_step
        name = f"trace_replica_{n_rep}" if replica else f"trace_gantt_{n_pipe}"
        if replica:
            n_rep += 1
        else:
            n_pipe += 1
        svgs[name] = pipeline_gantt(rows, f"{title}, step {step}")
        gantts.append({"name": name, "title": f"{title}, step {step}"})
    has_bars = bool(ts.ranks)
    if has_bars:
        if ts.layout is not None:
            ids, members = ts.layout.replica_ids, ts.layout.replicas
        else:
            ids, members = tuple(range(len(ts.ranks))), tuple((r.rank,) for r in ts.ranks)
        blocks, shown = [], 0
        for rid, ranks in zip(ids, members):
            if shown >= MAX_BAR_RANKS:
                break
            rows = []
            for rank in ranks[:MAX_BAR_RANKS - shown]:
                summ = rank_summary(by_rank[rank])
                rows.append(ReplicaRow(label(rank), _parts(summ), dict(summ["comm_s"])))
            shown += len(rows)
            walls = [(rank_summary(by_rank[x])["wall_s"], x) for x in ranks]
            wall, slowest = max(walls, key=lambda w: (w[0], -w[1]))
            head = f"Replica {rid}: step {fmt_s(wall)}" + (f", slowest rank {slowest}" if len(ranks) > 1 else "")
            blocks.append((head, rows))
        method = ts.layout.method if ts.layout is not None else "assumed"
        note = f"replicas from {method}" + (f"; the first {shown} of {len(ts.ranks)} ranks shown" if shown < len(ts.ranks) else "")
        svgs["rank_bars"] = replica_bars(blocks, "Mean step per rank, by model replica", note)
    micro = []
    for r in ts.ranks[:MAX_GANTTS]:
        if r.segments:
            name = f"trace_microbatches_rank_{r.rank}"
            how = "explicit markers" if r.segment_method == "markers" else "kernel-run heuristic (no markers)"
            svgs[name] = stacked_bars([(s["segment"], _parts(s, idle=False)) for s in r.segments],
                                      f"Micro-batches of rank {r.rank}, step {r.segment_step} ({how})")
            micro.append({"name": name, "title": f"Rank {r.rank}, step {r.segment_step}: segments from {how}"})
    return svgs, {"gantts": gantts, "microbatches": micro, "has_bars": has_bars}


def _parts(s: dict[str, Any], idle: bool = True) -> dict[str, float]:
    """The bar parts of a step or segment (:data:`~dml2comm.traces.charts.PART_COLOURS`), which add
    up to its window: compute alone = compute - overlap; compute + communication = overlap;
    exposed communication; copies only = window - idle - |compute ∪ communication| (with
    |compute ∪ communication| = compute + exposed); idle."""
    out = {"compute": max(s["compute_s"] - s["overlap_s"], 0.0), "compute + communication": s["overlap_s"],
           "exposed communication": s["exposed_comm_s"]}
    if idle:
        out["copies only"] = max(s["wall_s"] - s["idle_s"] - s["compute_s"] - s["exposed_comm_s"], 0.0)
        out["idle"] = s["idle_s"]
    return out


def _pct_error(e: float | None) -> str:
    return f"{e:+.1%}" if e is not None else "n/a"


def _page_context(ts: TraceSet, data: dict[str, Any], files: int, extra: dict[str, Any]) -> dict[str, Any]:
    ranks = []
    for r in data["ranks"]:
        s = r["summary"]
        ranks.append({"rank": r["rank"], "steps": s["steps"], "wall": fmt_s(s["wall_s"]), "compute": fmt_s(s["compute_s"]),
                      **{d: fmt_s(s["comm_s"][d]) for d in DIMS}, "comm": {d: fmt_s(s["comm_s"][d]) for d in DIMS},
                      "overlap": fmt_s(s["overlap_s"]), "exposed": fmt_s(s["exposed_comm_s"]), "idle": fmt_s(s["idle_s"]),
                      "hta_overlap": _hta_overlap(r["hta"]), "file": Path(r["file"]).name})
    bd = data["hta"]["kernel_type_breakdown_us"]
    pct = data["hta"]["kernel_type_percentage"]
    kernel_types = [{"label": k, "time": fmt_s(v * 1e-6), "share": f"{pct.get(k, 0):.1f}%"} for k, v in bd.items()]
    problems = list(data["problems"]) + [f"rank {r['rank']}: {p}" for r in data["ranks"] for p in r["problems"]]
    comparison = None
    if data["comparison"]:
        cmp = data["comparison"]
        with_base = bool(cmp["rows"]) and "predicted_base_s" in cmp["rows"][0]
        comparison = {"what": cmp["what"], "caveat": cmp.get("caveat"), "with_base": with_base, "column": _file_column(cmp),
                      "constants": _file_note(cmp["cluster_file"]) if cmp.get("cluster_file") else "",
                      "base": (cmp.get("cluster_file") or {}).get("base") or "", "rows": [
            {"label": c["label"], "predicted": fmt_s(c["predicted_s"]), "measured": fmt_s(c["measured_s"]),
             "error": _pct_error(c["error"]),
             "base": fmt_s(c["predicted_base_s"]) if with_base else "", "base_error": _pct_error(c.get("error_base"))}
            for c in cmp["rows"]]}
    layout = data["layout"]
    join = data.get("join")
    join_page = {"rows": join_rows(join), "columns": join_columns(join), "summary": join_summary(join),
                 "notes": join["notes"], "method": join["method"], "rank": join["rank"],
                 "ops": [{"name": o["name"], "phase": o["phase"], "calls": o["calls"], "time": fmt_s(o["gpu_s"]),
                          "share": f"{o['gpu_s'] / join['gpu_s']:.1%}" if join["gpu_s"] > 0 else "n/a"} for o in join["ops"]]} \
        if join else None
    return {"ranks": ranks, "join": join_page, "files": files, "failures": len(ts.failures), "problems": problems, "kernel_types": kernel_types,
            "comparison": comparison, "dims": list(DIMS),
            "layout": {"method": layout["method"], "detail": layout["detail"], "replicas": len(layout["replicas"])} if layout else None,
            **extra}


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
    comparison = _prediction(args, ts, run, source)
    data = trace_analysis_dict(ts, comparison)
    data["join"] = _join(args, ts)
    out_files: dict[str, str | bytes] = {
        "trace_analysis.json": json.dumps(data, sort_keys=True, indent=1, default=_json_default) + "\n",
        "events.parquet": events_parquet(ts),
        "steps.parquet": steps_parquet(ts),
    }
    if comparison is not None:
        out_files["comparison.csv"] = _comparison_csv(comparison)
    svgs, extra = _drawings(ts)
    context = None if args.no_site else _page_context(ts, data, len(files), extra)
    from dml2comm.traces.site import publish_trace_outputs

    out = Path(args.out)
    publish_trace_outputs(out, out_files, context, svgs)
    if args.json:
        print(json.dumps({"ranks": [{"rank": r["rank"], "summary": r["summary"], "problems": r["problems"]} for r in data["ranks"]],
                          "problems": data["problems"]}, sort_keys=True, default=_json_default))
    else:
        _print(ts, data, out, time.perf_counter() - start, site=not args.no_site)
    return 0


def _file_column(comparison: dict[str, Any]) -> str:
    """The heading of the prediction made with ``--cluster FILE``: ``calibrated`` for a file
    ``calibrate`` wrote, ``cluster file`` for a hand-written one, ``predicted`` for a preset."""
    info = comparison.get("cluster_file")
    return "predicted" if not info else "calibrated" if info["calibrated"] else "cluster file"


def _file_note(info: dict[str, Any]) -> str:
    """Which constants the two predictions used, in words."""
    made = f"calibrated {info['date']}" if info["calibrated"] and info.get("date") else "calibrated" if info["calibrated"] \
        else "hand-written"
    text = f"{info['name']} ({made}, sha256 {info['sha256'][:12]})"
    if info.get("note"):
        return f"{text}; {info['note']}"
    return f"{text} against its base {info['base']} ({info['base_gpu']}, preset constants)"


def _hta_overlap(hta: dict[str, Any]) -> str:
    """HTA's overlap in percent, or ``n/a (CPU x%)`` for a CPU-only rank (no GPU kernels)."""
    if hta.get("comm_comp_overlap_pct") is not None:
        return f"{hta['comm_comp_overlap_pct']:.2f}%"
    cpu = hta.get("cpu_comm_comp_overlap_pct")
    return "n/a" + (f" (CPU {cpu:.2f}%)" if cpu is not None else "")


def _json_default(x: Any) -> Any:
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating,)):
        return float(x)
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")


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
                          fmt_s(s["exposed_comm_s"]), fmt_s(s["idle_s"]), _hta_overlap(r["hta"])])
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
        mine = _file_column(cmp)
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
            console.print(line(_file_note(cmp["cluster_file"]), w, prefix="constants:"))
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


def join_rows(join: dict[str, Any]) -> list[list[str]]:
    """The join's table rows: per layer (then loss, optimizer, unattributed) forward, backward,
    other and total GPU time and share; without a model, per phase."""
    if join["layers"]:
        return [[x["name"], fmt_s(x["forward_s"]), fmt_s(x["backward_s"]), fmt_s(x["other_s"]), fmt_s(x["total_s"]),
                 f"{x['share']:.1%}"] for x in join["layers"]]
    total = join["gpu_s"]
    return [[p, fmt_s(v), f"{v / total:.1%}" if total > 0 else "n/a"] for p, v in join["phases_s"].items()]


def join_columns(join: dict[str, Any]) -> tuple[str, ...]:
    return ("layer", "forward", "backward", "other", "total", "share") if join["layers"] else ("phase", "time", "share")


def join_summary(join: dict[str, Any]) -> str:
    """One line: attributed and unattributed GPU time and the blocks' spread."""
    text = (f"{fmt_s(join['attributed_s'])} of {fmt_s(join['gpu_s'])} GPU time in {join['kernels']} kernels attributed "
            f"({join['attributed_share']:.1%}); unattributed {fmt_s(join['unattributed_s'])} "
            f"({1 - join['attributed_share'] if join['gpu_s'] > 0 else 0:.1%})")
    blocks = [x["total_s"] for x in join["layers"] if x["kind"] == "block"]
    if join["block_spread"] is not None:
        text += (f"; {len(blocks)} blocks, {fmt_s(min(blocks))} to {fmt_s(max(blocks))} each "
                 f"(spread (max - min) / mean {join['block_spread']:.1%})")
    return text


def _print_join(console: Any, join: dict[str, Any]) -> None:
    from dml2comm.render.terminal import fit_table, line

    w = console.width
    cols = join_columns(join)
    console.print(fit_table(f"GPU time by {cols[0]}, rank {join['rank']}'s step", cols, join_rows(join), w))
    console.print(line(join_summary(join), w, prefix="join:"))
    for n in join["notes"]:
        console.print(line(n, w, prefix="join:", style="yellow"))
