"""Scaling studies: the best configuration at each GPU count, its throughput and efficiency.

    python main.py sweep model.onnx --scaling 8,16,32,64 --global-batch-size 512          # strong
    python main.py sweep model.onnx --scaling 8,16,32,64 --global-batch-size 512 --weak   # weak

For each GPU count N of the study one sweep (:func:`~dml2comm.search.sweep.run_sweep`, the same
space and constraints) finds the fastest configuration that fits in memory.  Then, against the
*baseline* (the first count with a fitting configuration, N1 with iteration time T1):

- strong scaling keeps the global batch B fixed: speed-up S = T1 / TN, ideal N / N1, parallel
  efficiency E = T1 N1 / (TN N);
- weak scaling keeps the samples per GPU fixed (B_N = b_gpu N): throughput grows with N,
  speed-up S = (B_N / TN) / (B_1 / T1), efficiency E = T1 / TN.

Both are the same quantity: E = (throughput per GPU at N) / (throughput per GPU at N1).
Scaling *breaks down* at the first count after the baseline where E falls below the threshold
(default 0.8), where no configuration fits, or where the global batch cannot be split over the
GPUs (no valid configuration).  The reason is read from the breakdown of the best
configurations: against the ideal (each part of the baseline iteration scaled by N1/N for
strong scaling, unchanged for weak) the part that grew most -- the pipeline bubble (fewer
micro-batches per pipeline), exposed communication (and which dimension's collectives cost
most on the busiest stage), compute that does not shrink with the GPU count, or the
optimizer step.

Pure functions (:func:`parse_gpu_counts`, :func:`plan_scaling`, :func:`scaling_summary`,
:func:`breakdown_reason`) are separate from :func:`run_scaling`, which runs the sweeps.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Sequence

from dml2comm.choices import Choice
from dml2comm.errors import ConfigError
from dml2comm.hardware.cluster import Cluster
from dml2comm.search.explain import BREAKDOWN, breakdown, config_diff, config_text
from dml2comm.search.space import Constraints
from dml2comm.search.sweep import SweepResult, SweepSpace, config_from_dict, run_sweep
from dml2comm.fmt import decimal_int, fmt_bytes, fmt_s

__all__ = ["DEFAULT_THRESHOLD", "ScalingPlan", "parse_gpu_counts", "plan_scaling", "run_scaling", "scaling_summary",
           "breakdown_reason", "SCALING_COLUMNS", "scaling_csv"]

#: Parallel efficiency below which scaling is said to break down.
DEFAULT_THRESHOLD = 0.8


def parse_gpu_counts(text: str, flag: str = "--scaling") -> tuple[int, ...]:
    """``"8,16,32"`` -> ``(8, 16, 32)``; ``"8,16,...,128"`` continues the ratio of the two
    counts before ``...`` up to the last one (8, 16, 32, 64, 128).  At least two distinct
    positive counts, ascending; anything else is a one-line :class:`ConfigError`."""
    example = f"e.g. {flag} 8,16,32,64 or {flag} 8,16,...,1024"
    parts = [x.strip() for x in str(text).split(",") if x.strip()]
    counts: list[int] = []
    pending = False
    for part in parts:
        if part in ("...", "…"):
            if len(counts) < 2 or pending:
                raise ConfigError(f"{flag} {text!r}: '...' needs two counts before it (their ratio) and one after; {example}")
            pending = True
            continue
        try:
            n = decimal_int(part)
        except ValueError:
            raise ConfigError(f"{flag} expects comma-separated positive GPU counts, got {text!r}; {example}") from None
        if n < 1:
            raise ConfigError(f"{flag} expects positive GPU counts, got {n} in {text!r}; {example}")
        if pending:
            a, b = counts[-2], counts[-1]
            if b % a or b // a < 2:
                raise ConfigError(f"{flag} {text!r}: '...' continues a whole ratio, but {b}/{a} is not one; {example}")
            ratio, x = b // a, b
            while x < n:
                x *= ratio
                if x <= n:
                    counts.append(x)
            if counts[-1] != n:
                raise ConfigError(f"{flag} {text!r}: {n} is not {b} times a power of {ratio}; end the series at {counts[-1]}")
            pending = False
            continue
        counts.append(n)
    if pending:
        raise ConfigError(f"{flag} {text!r} ends with '...'; give the last count; {example}")
    if len(counts) < 2:
        raise ConfigError(f"{flag} needs at least two GPU counts, got {text!r}; {example}")
    if any(b <= a for a, b in zip(counts, counts[1:])):
        raise ConfigError(f"{flag} expects distinct GPU counts in ascending order, got {text!r}; {example}")
    return tuple(counts)


class ScalingMode(Choice):
    """Strong scaling (the global batch fixed) or weak scaling (the batch per GPU fixed)."""

    STRONG = "strong"
    WEAK = "weak"


@dataclass(frozen=True)
class ScalingPlan:
    """The GPU counts and the global batch at each: fixed (strong) or per GPU x N (weak)."""

    counts: tuple[int, ...]
    mode: ScalingMode
    global_batch_size: int | None = None  # strong
    per_gpu_batch: int | None = None  # weak: samples per GPU per iteration
    threshold: float = DEFAULT_THRESHOLD

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", ScalingMode.of(self.mode))

    def batch_for(self, num_gpus: int) -> int:
        if self.mode is ScalingMode.WEAK:
            assert self.per_gpu_batch is not None
            return self.per_gpu_batch * num_gpus
        assert self.global_batch_size is not None
        return self.global_batch_size

    def to_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "gpu_counts": list(self.counts), "global_batch_size": self.global_batch_size,
                "per_gpu_batch": self.per_gpu_batch, "threshold": self.threshold,
                "global_batch_sizes": [self.batch_for(n) for n in self.counts]}


def plan_scaling(counts: Sequence[int], weak: bool = False, global_batch_size: int | None = None,
                 per_gpu_batch: int | None = None, threshold: float = DEFAULT_THRESHOLD) -> ScalingPlan:
    """Check and fix the batch of a study.

    Strong: ``global_batch_size`` (default: the largest count, one sample per GPU there).
    Weak: ``per_gpu_batch``, else ``global_batch_size`` / the first count (which must divide
    it), else 1.  ``per_gpu_batch`` is for weak scaling only."""
    counts = tuple(counts)
    if len(counts) < 2 or any(not isinstance(n, int) or n < 1 for n in counts):
        raise ConfigError(f"--scaling needs at least two positive GPU counts, got {list(counts)}")
    if not (isinstance(threshold, (int, float)) and 0 < threshold <= 1):
        raise ConfigError(f"--efficiency-threshold must be in (0, 1], got {threshold!r}; e.g. 0.8")
    if not weak:
        if per_gpu_batch is not None:
            raise ConfigError("--per-gpu-batch is for weak scaling; add --weak, or give --global-batch-size for strong scaling")
        return ScalingPlan(counts, ScalingMode.STRONG, global_batch_size or max(counts), None, float(threshold))
    if per_gpu_batch is not None and global_batch_size is not None:
        raise ConfigError("--weak takes --per-gpu-batch or --global-batch-size (divided by the first GPU count), not both")
    if per_gpu_batch is None:
        if global_batch_size is None:
            per_gpu_batch = 1
        elif global_batch_size % counts[0]:
            raise ConfigError(f"--weak: --global-batch-size {global_batch_size} is not a multiple of the first GPU count "
                              f"{counts[0]}, so the batch per GPU is not whole; give a multiple of {counts[0]} or --per-gpu-batch")
        else:
            per_gpu_batch = global_batch_size // counts[0]
    return ScalingPlan(counts, ScalingMode.WEAK, None, per_gpu_batch, float(threshold))


def _narrowed(constraints: Constraints, num_gpus: int) -> Constraints | None:
    """``--d/--t/--p`` lists keep the sizes that divide ``num_gpus`` (None: nothing left)."""
    kw: dict[str, Any] = {}
    for name in ("d", "t", "p"):
        values = getattr(constraints, name)
        if values is not None:
            kept = tuple(v for v in values if num_gpus % v == 0)
            if not kept:
                return None
            kw[name] = kept
    return replace(constraints, **kw) if kw else constraints


def _comm_by_dim(model_path: str, cluster_builder: Callable[[int], Cluster], space: SweepSpace,
                 config: Mapping[str, Any]) -> dict[str, float]:
    """Collective seconds per iteration on the busiest stage of one configuration, by dimension
    (dp / tp / pp / ...); {} when the analysis is not available."""
    from dml2comm.search.sweep import Evaluator

    try:
        analysis = Evaluator(model_path, cluster_builder, space.dims, space.seq_len).analyze(config_from_dict(config))
    except Exception:  # noqa: BLE001 - only words depend on it
        return {}
    crit = analysis.summary.get("critical_stage")
    out: dict[str, float] = {}
    for c in analysis.comms:
        if crit is None or c.stage == crit:
            key = getattr(c.dim, "value", str(c.dim))
            out[key] = out.get(key, 0.0) + c.time_s * c.count_per_iteration
    return out


@dataclass
class ScalingResult:
    plan: ScalingPlan
    points: list[dict[str, Any]]
    sweeps: dict[int, SweepResult] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    interrupted: bool = False


def run_scaling(model_path: str, plan: ScalingPlan, cluster_builder: Callable[[int], Cluster], space: SweepSpace,
                workers: int = 1, limit: int | None = None,
                on_count: Callable[[int, SweepResult | None], None] | None = None, executor: Any = None) -> ScalingResult:
    """One sweep per GPU count of ``plan`` (``space.global_batch_size`` is replaced by the plan's);
    returns the points and :func:`scaling_summary`.  A count with no valid configuration is a
    point with status ``no_config``; Ctrl-C stops the study with the counts that finished.
    ``executor``: where every count's chunks run (:func:`run_sweep`; default local ``workers``).

    Raises :class:`ConfigError` when no count has a configuration that fits (nothing to compare)."""
    points: list[dict[str, Any]] = []
    sweeps: dict[int, SweepResult] = {}
    seq_len = space.seq_len
    interrupted = False
    for n in plan.counts:
        batch = plan.batch_for(n)
        point: dict[str, Any] = {"gpus": n, "global_batch_size": batch, "status": "ok", "best": None, "reason": None,
                                 "num_configs": 0, "num_fit": 0, "comm_time_by_dim_s": {}}
        constraints = _narrowed(space.constraints, n)
        if constraints is None:
            point.update(status="no_config", reason=f"none of the --d/--t/--p sizes divides {n} GPUs")
            points.append(point)
            continue
        try:
            result = run_sweep(model_path, n, cluster_builder, replace(space, global_batch_size=batch, constraints=constraints),
                               workers=workers, limit=limit, executor=executor)
        except ConfigError as exc:
            point.update(status="no_config", reason=str(exc))
            points.append(point)
            if on_count is not None:
                on_count(n, None)
            continue
        sweeps[n] = result
        seq_len = seq_len or result.model.get("seq_len")
        point["num_configs"] = result.num_configs
        point["num_fit"] = sum(1 for r in result.evaluated if r["fits"])
        best = result.best
        if best is None:
            smallest = min((r["peak_memory_bytes"] for r in result.evaluated), default=None)
            capacity = float(cluster_builder(n).gpu.hbm_bytes)
            point.update(status="no_fit", reason=(
                f"no configuration fits in memory on {n} GPUs" + (f": the smallest peak is {fmt_bytes(smallest)} per GPU of "
                                                                  f"{fmt_bytes(capacity)}" if smallest is not None else "")))
        else:
            point["best"] = dict(best)
            point["comm_time_by_dim_s"] = _comm_by_dim(model_path, cluster_builder, space, best["config"])
        points.append(point)
        if on_count is not None:
            on_count(n, result)
        if result.interrupted:
            interrupted = True
            break
    summary = scaling_summary(points, plan, seq_len, gpus_per_node=cluster_builder(plan.counts[0]).gpus_per_node)
    if summary["baseline_gpus"] is None:
        reasons = "; ".join(f"{p['gpus']} GPUs: {p['reason']}" for p in points if p["reason"])
        raise ConfigError(f"no GPU count of the study has a configuration that fits, so there is nothing to scale from ({reasons})"[:600])
    return ScalingResult(plan, points, sweeps, summary, interrupted)


def _metrics(point: Mapping[str, Any], seq_len: int | None) -> tuple[float | None, float | None]:
    best = point.get("best")
    if not best or not best.get("iteration_time_s"):
        return None, None
    samples = point["global_batch_size"] / best["iteration_time_s"]
    return samples, samples * seq_len if seq_len else None


def scaling_summary(points: list[dict[str, Any]], plan: ScalingPlan, seq_len: int | None,
                    gpus_per_node: int = 8) -> dict[str, Any]:
    """Fill each point's throughput, speed-up and efficiency (in place) and find where scaling
    breaks down.  Returns the ``scaling`` object of data.json (without the plan's fields)."""
    base = next((p for p in points if p.get("best")), None)
    base_samples, _ = _metrics(base, seq_len) if base else (None, None)
    breakdown_at: dict[str, Any] | None = None
    after_base = False
    for p in points:
        samples, tokens = _metrics(p, seq_len)
        p["samples_per_s"] = samples
        p["tokens_per_s"] = tokens
        p["ideal_speedup"] = p["gpus"] / base["gpus"] if base else None
        if samples is not None and base_samples:
            p["speedup"] = samples / base_samples
            p["efficiency"] = p["speedup"] / p["ideal_speedup"]
        else:
            p["speedup"] = p["efficiency"] = None
        if p is base:
            after_base = True
            continue
        if not after_base or breakdown_at is not None:
            continue
        if p["status"] != "ok":
            kind = "no_fit" if p["status"] == "no_fit" else "cannot_split"
            breakdown_at = {"gpus": p["gpus"], "kind": kind, "efficiency": None, "reason": (
                f"the global batch of {p['global_batch_size']} cannot be split over {p['gpus']} GPUs: {p['reason']}"
                if kind == "cannot_split" else p["reason"])}
        elif p["efficiency"] is not None and p["efficiency"] < plan.threshold:
            kind, reason = breakdown_reason(base, p, plan.mode, gpus_per_node)
            breakdown_at = {"gpus": p["gpus"], "kind": kind, "efficiency": p["efficiency"],
                            "reason": f"efficiency {p['efficiency']:.0%} is below {plan.threshold:.0%} with "
                                      f"{config_text(p['best']['config'])}; {reason}"}
    for p in points:
        if p.get("best") and base and p is not base:
            p["limit"] = breakdown_reason(base, p, plan.mode, gpus_per_node)[1]
        else:
            p["limit"] = None
    last_ok = [p for p in points if p.get("efficiency") is not None]
    if breakdown_at is None and base is not None:
        verdict = (f"scaling holds from {_gpus(base['gpus'])} to {_gpus(last_ok[-1]['gpus'])}: parallel efficiency stays at or above "
                   f"{plan.threshold:.0%} (lowest {min(p['efficiency'] for p in last_ok):.0%})")
    elif breakdown_at is not None:
        verdict = f"scaling breaks down at {_gpus(breakdown_at['gpus'])}: {breakdown_at['reason']}"
    else:
        verdict = "no GPU count has a configuration that fits"
    return {"baseline_gpus": base["gpus"] if base else None, "seq_len": seq_len, "breakdown": breakdown_at,
            "verdict": verdict, "points": points}


_DIM_WORDS = {"dp": "data-parallel gradient reduction", "tp": "tensor-parallel collectives", "pp": "pipeline sends",
              "cp": "context-parallel exchanges", "ep": "expert-parallel all-to-alls"}


def _gpus(n: int) -> str:
    return f"{n} GPU" if n == 1 else f"{n} GPUs"


def _mb(m: Any) -> str:
    return f"{m} micro-batch" if m == 1 else f"{m} micro-batches"


def breakdown_reason(base: Mapping[str, Any], point: Mapping[str, Any], mode: ScalingMode | str, gpus_per_node: int = 8) -> tuple[str, str]:
    """``(kind, words)``: which part of the iteration grew most beyond the ideal between the
    baseline and ``point`` (kind: ``bubble``, ``exposed_comm``, ``compute``, ``optimizer``).

    The ideal is each part of the baseline's iteration times N1/N (strong) or 1 (weak); the
    part with the largest excess over it is named, with its share of the time lost."""
    b, q = base["best"], point["best"]
    n1, n = base["gpus"], point["gpus"]
    strong = ScalingMode.of(mode) is ScalingMode.STRONG
    ideal = n1 / n if strong else 1.0
    pb, pq = breakdown(b), breakdown(q)
    excess = {k: pq[k] - ideal * pb[k] for k, _ in BREAKDOWN}
    key = max(excess, key=lambda k: excess[k])
    t1, tn = b["iteration_time_s"], q["iteration_time_s"]
    lost = tn - ideal * t1
    cb, cq = b["config"], q["config"]
    loss = f"{min(excess[key] / lost, 1.0):.0%} of the time lost" if lost > 0 else "the largest change"
    if key == "bubble_time_s":
        words = (f"pipeline bubble {fmt_s(pq[key])} ({q.get('bubble_fraction') or 0:.0%} of the iteration, was "
                 f"{b.get('bubble_fraction') or 0:.0%} on {_gpus(n1)}; {loss}): p={cq['p']} stages with "
                 f"{_mb(cq.get('num_micro_batches'))} per pipeline (was p={cb['p']} with {cb.get('num_micro_batches')})")
        if strong and (cq.get("num_micro_batches") or 0) < (cb.get("num_micro_batches") or 0):
            words += "; the fixed global batch leaves fewer micro-batches per pipeline"
        elif strong and cq["p"] > cb["p"]:
            words += (f"; the fixed global batch of {point['global_batch_size']} allows at most d="
                      f"{point['global_batch_size'] // cq['micro_batch_size']} replicas at b={cq['micro_batch_size']}, so the "
                      f"added GPUs become pipeline stages with too few micro-batches to fill them")
        return "bubble", words
    if key == "exposed_comm_time_s":
        dims = point.get("comm_time_by_dim_s") or {}
        dim = max(dims, key=lambda k: dims[k]) if dims and max(dims.values()) > 0 else None
        words = (f"exposed communication {fmt_s(pq[key])} ({pq[key] / tn:.0%} of the iteration, was {pb[key] / t1:.0%} on "
                 f"{_gpus(n1)}; {loss})")
        if dim:
            what = _DIM_WORDS.get(dim, f"{dim} collectives")
            size = {"dp": f" over d={cq['d']} replicas", "tp": f" at t={cq['t']}", "pp": f" between p={cq['p']} stages"}.get(dim, "")
            words += f", mostly {what}{size}"
            if dim == "tp" and cq["t"] > gpus_per_node:
                words += " across nodes"
        return "exposed_comm", words
    if key == "optimizer_time_s":
        return "optimizer", (f"optimizer step {fmt_s(pq[key])} against an ideal {fmt_s(ideal * pb[key])} ({loss}): it shrinks "
                             f"only with the model shard per GPU (t={cq['t']}, p={cq['p']}, ZeRO {cq['zero_stage']}), not with the batch")
    changed = config_diff(cq, cb)
    return "compute", (f"compute per GPU {fmt_s(pq[key])} against an ideal {fmt_s(ideal * pb[key])} ({loss}): "
                       + ("smaller matrices per GPU run less efficiently" if strong else "the work per GPU grew")
                       + (f" ({', '.join(changed)} than on {_gpus(n1)})" if changed else ""))


#: Columns of scaling.csv (one row per GPU count).
SCALING_COLUMNS = ("gpus", "global_batch_size", "status", "d", "t", "p", "micro_batch_size", "num_micro_batches",
                   "virtual_stages", "zero_stage", "recompute", "sequence_parallel", "iteration_time_s", "compute_time_s",
                   "bubble_time_s", "exposed_comm_time_s", "optimizer_time_s", "bubble_fraction", "peak_memory_bytes",
                   "tflops_per_gpu", "samples_per_s", "tokens_per_s", "speedup", "ideal_speedup", "efficiency", "reason")


def scaling_rows(points: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One flat dict per GPU count, keys :data:`SCALING_COLUMNS`."""
    out = []
    for p in points:
        best = p.get("best") or {}
        config = best.get("config") or {}
        row: dict[str, Any] = {}
        for k in SCALING_COLUMNS:
            if k in p and k not in ("reason",):
                row[k] = p[k]
            elif k in config:
                row[k] = config[k]
            else:
                row[k] = best.get(k)
        row["reason"] = p.get("reason") or p.get("limit") or ""
        out.append(row)
    return out


def scaling_csv(points: Sequence[Mapping[str, Any]]) -> str:
    import csv
    import io

    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(SCALING_COLUMNS)
    for row in scaling_rows(points):
        writer.writerow(["" if row[k] is None else repr(row[k]) if isinstance(row[k], float) else row[k] for k in SCALING_COLUMNS])
    return buf.getvalue()

