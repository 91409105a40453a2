"""What ``trace`` reports of an analysed trace set (:class:`~dml2comm.traces.analyze.TraceSet`):
``trace_analysis.json`` (:func:`trace_analysis_dict`), the Parquet tables, the comparison's CSV,
and the texts the terminal and the page share (the join's table, HTA's overlap, the cluster
file's note).  ``python main.py trace`` (:mod:`dml2comm.cli.trace`) prints and writes them.
"""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from dml2comm.errors import ConfigError
from dml2comm.fmt import fmt_s
from dml2comm.traces.analyze import RankResult, TraceSet
from dml2comm.traces.classify import DIMS

__all__ = ["PREDICTION_DEFAULTS", "base_prediction", "comparison_csv", "events_parquet", "file_column", "file_note", "hta_overlap", "join_columns", "join_rows", "join_step", "join_summary",
           "json_default", "predicted_comparison", "rank_summary", "steps_parquet", "trace_analysis_dict"]


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


def comparison_csv(comparison: dict[str, Any]) -> str:
    keys = ["predicted_s", "measured_s", "error"]
    if comparison["rows"] and "predicted_base_s" in comparison["rows"][0]:
        keys += ["predicted_base_s", "error_base"]
    lines = ["category," + ",".join(keys)]
    for r in comparison["rows"]:
        lines.append(",".join([r["category"]] + ["" if r[k] is None else f"{r[k]:.9g}" for k in keys]))
    return "\n".join(lines) + "\n"


def file_column(comparison: dict[str, Any]) -> str:
    """The heading of the prediction made with ``--cluster FILE``: ``calibrated`` for a file
    ``calibrate`` wrote, ``cluster file`` for a hand-written one, ``predicted`` for a preset."""
    info = comparison.get("cluster_file")
    return "predicted" if not info else "calibrated" if info["calibrated"] else "cluster file"


def file_note(info: dict[str, Any]) -> str:
    """Which constants the two predictions used, in words."""
    made = f"calibrated {info['date']}" if info["calibrated"] and info.get("date") else "calibrated" if info["calibrated"] \
        else "hand-written"
    text = f"{info['name']} ({made}, sha256 {info['sha256'][:12]})"
    if info.get("note"):
        return f"{text}; {info['note']}"
    return f"{text} against its base {info['base']} ({info['base_gpu']}, preset constants)"


def hta_overlap(hta: dict[str, Any]) -> str:
    """HTA's overlap in percent, or ``n/a (CPU x%)`` for a CPU-only rank (no GPU kernels)."""
    if hta.get("comm_comp_overlap_pct") is not None:
        return f"{hta['comm_comp_overlap_pct']:.2f}%"
    cpu = hta.get("cpu_comm_comp_overlap_pct")
    return "n/a" + (f" (CPU {cpu:.2f}%)" if cpu is not None else "")


def json_default(x: Any) -> Any:
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating,)):
        return float(x)
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")


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
    if join.get("passes", 1) > 1:
        text += f"; {join['passes']} forward and backward passes (gradient accumulation), summed"
    if join.get("steps", 1) > 1:
        text += f"; the mean of {join['steps']} profiled steps"
    return text


def base_prediction(cluster_file: str, model: str, config: Any, num: int) -> tuple[dict[str, Any], dict[str, float | None] | None]:
    """For ``--cluster FILE.yaml`` (``cluster_file``): the file's identity and, when its ``base`` is a preset (or a
    cluster file beside it), the prediction per category with the base's constants
    (:func:`dml2comm.calibrate.base.base_cluster`), so that the table shows what calibrating
    changed."""
    from dataclasses import replace

    from dml2comm.analysis import analyze, comm_by_dim
    from dml2comm.calibrate.base import base_cluster
    from dml2comm.hardware.cluster_file import load_cluster_file
    from dml2comm.traces.compare import predicted_per_category

    spec = load_cluster_file(cluster_file)
    info: dict[str, Any] = {"name": spec.file_name, "sha256": spec.sha256, "calibrated": bool(spec.calibration),
                            "date": spec.calibration.get("date"), "base": spec.base, "base_gpu": None, "note": None}
    found = base_cluster(spec, num)
    if found is None:
        info["note"] = (f"its base {spec.base!r} is neither a preset nor a cluster file beside it" if spec.base
                        else "it names no base") + ": no prediction with the base's constants"
        return info, None
    cluster = replace(found[0], collective_overhead_s=0.0)
    info["base_gpu"] = cluster.gpu.name
    analysis = analyze(model, config, cluster)
    return info, predicted_per_category(analysis.summary, comm_by_dim(analysis))


def join_step(ts: TraceSet, model: str | None = None, micro_batch_size: int | None = None,
              seq_len: int | None = None) -> dict[str, Any] | None:
    """The lowest rank's step mapped onto operators, phases and (with ``model``) the model's
    layers (:func:`dml2comm.traces.join.join_trace`).  The model's symbolic batch and sequence
    dims are bound to ``micro_batch_size``/``seq_len`` (``--micro-batch-size``/``--seq-len``) or,
    unset, to the token ids' shape the trace recorded (an image model's batch: its first
    convolution's); a model that cannot be read so gives the join without layers and a note.
    ``micro_batch`` and ``seq_len`` in the result: the sizes the model was bound to."""
    from dml2comm.traces.join import join_trace, step_shape
    from dml2comm.traces.load import load_trace
    from dml2comm.traces.predict import eager_precision

    if not ts.ranks:
        return None
    first = min(ts.ranks, key=lambda r: r.rank)
    trace = load_trace(first.path, shapes=True)
    layered, note, batch, seq, shape = None, None, None, None, None
    if model:
        from dml2comm.errors import Dml2CommError
        from dml2comm.ir.layers import group_layers
        from dml2comm.ir.onnx_import import ImportOptions
        from dml2comm.load import load_model

        shape = step_shape(trace)
        batch = micro_batch_size or (shape[0] if shape else None)
        seq = seq_len or (shape[1] if shape else None)
        try:
            layered = group_layers(load_model(model, ImportOptions(batch_size=batch, seq_len=seq)).graph)
        except Dml2CommError as exc:
            note = f"the model's layers are not used: {exc}"
    joined = join_trace(trace, layered)
    if joined.kernels == 0:
        return None  # a CPU-only (gloo) run: no GPU kernels to place
    out = joined.to_dict()
    if note:
        out["notes"].insert(0, note)
    out["micro_batch"], out["seq_len"] = batch, seq  # what the model was bound to (None: its own)
    out["traced_shape"] = list(shape) if shape else None  # the step's own (micro-batch, sequence), as the trace recorded them
    out["eager_precision"] = eager_precision(trace)  # an eager PyTorch step's, from its fused AdamW (None: not one)
    return out


#: The prediction's options (``trace``'s flags that only it reads, refused without ``--model``),
#: with their defaults.
PREDICTION_DEFAULTS: dict[str, Any] = {
    "cp_scheme": "ulysses", "ep": 1, "micro_batch_size": None, "global_batch_size": None, "seq_len": None, "dtype": "bf16",
    "schedule": "1f1b", "virtual_stages": 1, "recompute": "none", "zero": 0, "sequence_parallel": False, "gpu": "a100",
    "cluster": None, "gpus_per_node": 8, "stack": "megatron", "precision": None, "optimizer": "adam", "inputs_on_gpu": False,
}


def predicted_comparison(ts: TraceSet, model: str, run: Mapping[str, int], source: str, options: Mapping[str, Any],
                         rank_order: str | None = None) -> dict[str, Any]:
    """The run predicted and compared with the traces, category by category
    (:func:`dml2comm.traces.compare.comparison_rows`): ``model`` at the ``run``'s sizes (``source``:
    where they come from, for the heading) with ``options`` (keys of :data:`PREDICTION_DEFAULTS`;
    a missing or None one takes its default); with a cluster file, beside its base's prediction."""
    from dataclasses import replace
    from types import SimpleNamespace

    from dml2comm.analysis import analyze, comm_by_dim
    from dml2comm.hardware.cluster import is_cluster_file, plan_cluster
    from dml2comm.parallel.config import ParallelConfig
    from dml2comm.traces.compare import comparison_caveat, comparison_rows, measured_per_category, predicted_per_category

    o = SimpleNamespace(**{k: options.get(k) if options.get(k) is not None else v for k, v in PREDICTION_DEFAULTS.items()},
                           model=model, rank_order=rank_order)
    d, t, p, cp = run["dp"], run["tp"], run["pp"], run["cp"]
    num = d * t * p * cp
    if o.sequence_parallel and t == 1:
        raise ConfigError("--sequence-parallel needs tensor parallelism, and the run has none (t = 1); drop it, or pass --t")
    micro = o.micro_batch_size or 1
    config = ParallelConfig(dp_size=d, tp_size=t, pp_size=p, micro_batch_size=micro,
                            global_batch_size=o.global_batch_size or micro * d * p, seq_len=o.seq_len,
                            dtype=o.dtype, schedule=o.schedule, virtual_stages=o.virtual_stages, zero_stage=o.zero,
                            sequence_parallel=o.sequence_parallel, recompute=o.recompute,
                            rank_order=o.rank_order or "tdp", cp_size=cp, cp_scheme=o.cp_scheme, ep_size=o.ep,
                            stack=o.stack, precision=o.precision, optimizer=o.optimizer, inputs_on_gpu=o.inputs_on_gpu)
    # the analysis's own reading of --gpu/--cluster (a --gpu naming another GPU than the cluster's: refused)
    cluster = replace(plan_cluster(options.get("gpu"), o.cluster, num, o.gpus_per_node), collective_overhead_s=0.0)
    analysis = analyze(o.model, config, cluster)
    predicted = predicted_per_category(analysis.summary, comm_by_dim(analysis))
    measured = measured_per_category([{"steps": r.steps} for r in ts.ranks])
    sizes = f"d={d} t={t} p={p}" + (f" cp={cp} ({o.cp_scheme})" if cp > 1 else "") + \
        (f" ep={o.ep}" if o.ep > 1 else "")
    what = (f"{Path(o.model).name}, {sizes} ({source}), b={config.micro_batch_size} "
            f"B={config.global_batch_size}, {config.schedule}, {config.stack} {config.precision}, {cluster.gpu.name}")
    caveat = comparison_caveat([r.activity.device for r in ts.ranks], {r.backend for r in ts.ranks}, cluster.gpu.name)
    file_info, base = base_prediction(o.cluster, o.model, config, num) if o.cluster and is_cluster_file(o.cluster) else (None, None)
    rows = comparison_rows(predicted, measured, comparable=caveat is None, base=base)
    return {"model": str(o.model), "what": what, "rows": rows, "comparable": caveat is None, "caveat": caveat,
            "cluster_file": file_info}
