"""``calibrate``'s domain: traces in, a calibrated cluster and its record out; nothing printed.

Reads PyTorch-profiler (Kineto) traces of one short run on the user's cluster, fits one value per
kernel class (:mod:`dml2comm.calibrate.classes`, each judged on held-out shapes against the base
model) and the measured collectives (:func:`dml2comm.calibrate.fit.fit_collective`), and returns
the calibrated cluster with the cluster file's document (:mod:`dml2comm.hardware.cluster_file`):
the base preset's fields, the used class values on the GPU (``gpu.calibrated_classes``) and the
measured collectives (``collective_fits``), and a ``calibration`` record with every class's
value, samples, residual, held-out error, base error and verdict, the collectives' fits and the
provenance (trace file names and sha256, the PyTorch/CUDA/NCCL versions the traces record, the
date).  :mod:`dml2comm.cli.calibrate` parses the arguments, prints and writes.

The GPU is identified from the traces' ``deviceProperties`` (name, else compute capability, SM
count and memory); ``base`` names the base (a preset or a cluster file), by default the
identified GPU's usual node.  Bad input (no trace, traces of two GPU types, nothing usable in
them) raises one :class:`CalibrationError` or :class:`~dml2comm.traces.load.TraceError`.

Each trace file is read on an executor (:mod:`dml2comm.executors`): the map step
:func:`~dml2comm.calibrate.samples.file_samples` returns the file's provenance and samples only;
the GPU check, the node size, the collectives' link levels and the fits run here once every
file is in, in the order of the files, so the outputs are byte-identical whichever executor read
them.  A file that cannot be read is left out with a warning naming it and why.
"""

from __future__ import annotations

import datetime
import hashlib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence

from dml2comm.calibrate.base import REFERENCE_SIZES, collective_times_s
from dml2comm.calibrate.classes import ClassFit, StepGuard, class_specs, fit_class, launch_bound, step_guard
from dml2comm.calibrate.fit import MIN_COLLECTIVE_SIZES, FitOutcome, fit_collective
from dml2comm.calibrate.points import class_points, collective_points, log_sizes
from dml2comm.calibrate.samples import CollectiveSample, TraceFile, TraceSamples, classify_collectives, file_samples
from dml2comm.errors import ConfigError
from dml2comm.executors import Executor, LocalExecutor
from dml2comm.hardware.cluster import Cluster, CollectiveFit, default_preset_name, get_cluster, is_cluster_file
from dml2comm.hardware.cluster_file import cluster_file_dict
from dml2comm.hardware.gpus import CALIBRATED_SUFFIX, GPU_ALIASES, GPUS, base_gpu_name
from dml2comm.traces.load import TraceError, find_trace_files

__all__ = ["CalibrationError", "Calibration", "calibrate", "read_traces", "identify_gpu", "MAX_KERNEL_S", "RECORD_SHAPES"]

RECORD_SHAPES = "profile with torch.profiler.profile(record_shapes=True)"
#: The longest a profiled kernel may take (one hour): a longer or non-finite duration (a trace
#: whose dur reads 1e308) is not a measurement, and fitting it gives a zero efficiency.
MAX_KERNEL_S = 3600.0


class CalibrationError(ConfigError):
    """The traces cannot calibrate anything (none usable, mixed GPU types, unknown GPU)."""


@dataclass
class Calibration:
    """What :func:`calibrate` found: the calibrated cluster, the file's document and the parts of
    the report (the front end words them)."""

    cluster: Cluster
    document: dict[str, Any]
    warnings: list[str] = field(default_factory=list)
    #: the fitted samples, one point per shape or size (:mod:`dml2comm.calibrate.points`), for the page
    points: dict[str, Any] = field(default_factory=dict)
    #: every kernel class's fit and verdict, in the order of dml2comm.cost.calibrated.CLASSES
    classes: list[ClassFit] = field(default_factory=list)
    #: (label, fitted collective, its outcome) per fitted collective
    collectives: list[tuple[str, CollectiveFit, FitOutcome]] = field(default_factory=list)
    #: the GPU, how it was identified, the base's label, files read and files left out
    header: dict[str, Any] = field(default_factory=dict)
    #: the step-level check over every class together (None: --holdout 0, or no kernel classes)
    guard: StepGuard | None = None


# ------------------------------------------------------------------------------------ GPU


#: (compute capability, SMs) -> presets by memory (bytes below which the first, else the second):
#: NVIDIA's CUDA compute-capability table and the presets' SM counts (dml2comm/hardware/gpus.py).
_BY_PROPERTIES: dict[tuple[int, int, int], tuple[str, float, str]] = {
    (8, 0, 108): ("A100-SXM4-40GB", 60e9, "A100-SXM4-80GB"),
    (9, 0, 132): ("H100-SXM5-80GB", 100e9, "H200-SXM-141GB"),
    (7, 0, 80): ("V100-SXM2-32GB", 1e30, "V100-SXM2-32GB"),
    (8, 6, 84): ("RTX-A6000", 1e30, "RTX-A6000"),
    (8, 9, 142): ("L40S", 1e30, "L40S"),
}


def identify_gpu(props: dict[str, Any]) -> tuple[str | None, str]:
    """(preset name or None, how it was identified) from one ``deviceProperties`` entry: its
    name when it is a preset's (``NVIDIA A100-SXM4-80GB``), else compute capability, SM count and
    memory (``NVIDIA A100-PG509-200``: 8.0, 108 SMs, 39 GiB -> A100-SXM4-40GB)."""
    name = str(props.get("name", ""))
    bare = name.replace("NVIDIA ", "").strip().lower().replace(" ", "-").replace("_", "-")
    if bare in GPU_ALIASES:
        return GPU_ALIASES[bare], f"deviceProperties name {name!r}"
    key = (props.get("computeMajor"), props.get("computeMinor"), props.get("numSms"))
    mem = props.get("totalGlobalMem")
    if key in _BY_PROPERTIES and isinstance(mem, (int, float)):
        small, limit, large = _BY_PROPERTIES[key]  # type: ignore[index]
        chosen = small if mem < limit else large
        return chosen, (f"deviceProperties of {name!r}: compute capability {key[0]}.{key[1]}, {key[2]} SMs, "
                        f"{mem / 2**30:.1f} GiB -> {chosen}")
    return None, f"deviceProperties name {name!r} matches no preset"


def _base_cluster(base: str | None, preset: str | None, how: str) -> tuple[Cluster, str]:
    if base is None:
        if preset is None:
            raise CalibrationError(f"cannot tell the GPU from the traces ({how}); pass --cluster PRESET (python main.py presets)")
        name = default_preset_name(preset)
        if name is None:
            raise CalibrationError(f"no default node for {preset}; pass --cluster PRESET or a cluster file")
        cluster = get_cluster(name)
        if cluster.gpu.name != preset:  # e.g. A100 40 GB in a DGX A100 node
            cluster = replace(cluster, gpu=GPUS[preset])
        return cluster, name
    cluster = get_cluster(base)
    label = Path(base).name if is_cluster_file(base) else base.strip().lower()
    if preset is not None and not cluster.gpu.name.startswith(preset):
        raise CalibrationError(f"the traces ran on {preset} ({how}) but --cluster {label} has {cluster.gpu.name}; "
                               "pass a base of the traces' GPU, or leave --cluster out")
    return cluster, label


def _round(x: float) -> float:
    return float(f"{x:.6g}")


def _gpu_name(preset: str, values: dict[str, float]) -> str:
    digest = hashlib.sha256(repr(sorted(values.items())).encode()).hexdigest()[:8]
    return f"{base_gpu_name(preset)}{CALIBRATED_SUFFIX}{digest}"


# ------------------------------------------------------------------------------ the steps


def read_traces(files: Sequence[Path], executor: Executor | None = None,
                on_progress: Callable[[int, int], None] | None = None) -> tuple[list[TraceFile], list[tuple[str, str]]]:
    """The map: :func:`~dml2comm.calibrate.samples.file_samples` of every file on ``executor``
    (default: this process, one file after the other), in the order of ``files`` whatever order
    they finish in; ``on_progress(done, total)`` after each.  Returns (the files read, (name, why)
    of each file that could not be read: a trace error, or the worker that read it died)."""
    # absolute paths: a worker's working folder is not ours (a Dask worker reads the shared filesystem)
    tasks = [str(Path(f).resolve()) for f in files]
    results: list[TraceFile | None] = [None] * len(files)
    errors: list[str | None] = [None] * len(files)
    for done, (i, result, error) in enumerate((executor or LocalExecutor(1)).map_unordered(file_samples, tasks), 1):
        results[i], errors[i] = result, error
        if on_progress is not None:
            on_progress(done, len(files))
    failed = [(Path(files[i]).name, e) for i, e in enumerate(errors) if e is not None]
    return [r for r in results if r is not None], failed


def _identify(infos: list[TraceFile], base: str | None, warnings: list[str]) -> tuple[Cluster, dict[str, Any]]:
    """The base cluster and the header (GPU, how identified, base label, GPUs per node seen)."""
    names = sorted({str(d.get("name", "")) for i in infos for d in i.devices})
    if len(names) > 1:
        raise CalibrationError(f"the traces come from different GPU types ({', '.join(names)}); calibrate each type "
                               "separately (one cluster file per GPU type)")
    props = next((i.devices[0] for i in infos if i.devices), None)
    preset, how = identify_gpu(props) if props is not None else (None, "no deviceProperties in the traces")
    if props is None:
        warnings.append("the traces record no deviceProperties: the GPU is taken from --cluster (PyTorch >= 1.13 records it)")
    elif preset is not None and not how.startswith("deviceProperties name"):
        warnings.append(f"GPU identified by its properties: {how}")
    cluster, base_name = _base_cluster(base, preset, how)
    per_node = max((len(i.devices) for i in infos), default=0) or cluster.gpus_per_node
    return cluster, {"gpu": cluster.gpu.name, "preset": preset, "how": how, "base": base_name, "per_node": per_node}


def _plausible(samples: list[Any]) -> list[Any]:
    """The samples whose ``time_s`` is a finite duration in (0, :data:`MAX_KERNEL_S`]."""
    return [x for x in samples if 0.0 < x.time_s <= MAX_KERNEL_S]


_KINDS = ("gemms", "memory", "layer_norm", "attention", "optimizer", "convs")


def _pool(infos: list[TraceFile], per_node: int, warnings: list[str]) -> tuple[TraceSamples, list[CollectiveSample]]:
    """Every file's samples in one :class:`TraceSamples` (implausible durations left out with a
    warning) and the collectives with their link levels; raises when nothing can be fitted."""
    pooled = TraceSamples(shaped_ops=sum(i.samples.shaped_ops for i in infos), nccl_kernels=sum(i.samples.nccl_kernels for i in infos))
    before = after = 0
    for kind in _KINDS:
        every = [x for i in infos for x in getattr(i.samples, kind)]
        kept = _plausible(every)
        setattr(pooled, kind, kept)
        before, after = before + len(every), after + len(kept)
    raw = [c for i in infos for c in classify_collectives(i.samples.collectives, i.world_size, per_node)]
    colls = _plausible(raw)
    absurd = before - after + len(raw) - len(colls) + sum(i.bad_events for i in infos)  # the loader's too
    if absurd:
        warnings.append(f"{absurd} kernel sample(s) left out: a duration that is not a positive number below "
                        f"{MAX_KERNEL_S:.0f} s (the trace's dur is in microseconds); check how the trace was written")
    if not pooled.shaped_ops and not colls:
        why = "no NCCL kernels" if not pooled.nccl_kernels else "NCCL kernels without message sizes (PyTorch >= 2.1 records them)"
        raise CalibrationError(f"nothing to fit in {len(infos)} trace(s): no operator shapes ({RECORD_SHAPES}) and {why}")
    return pooled, colls


def _fit_classes(cluster: Cluster, pooled: TraceSamples, holdout: float, warnings: list[str]
                 ) -> tuple[list[ClassFit], dict[str, Any], StepGuard | None]:
    """Every kernel class's fit and verdict (:mod:`dml2comm.calibrate.classes`), its points, and
    the step guard over them all (with held-out shapes only)."""
    if not pooled.shaped_ops:
        warnings.append(f"kernel classes: no operator shapes in the traces; every class kept from the base ({RECORD_SHAPES})")
        return [], {}, None
    if not cluster.gpu.sm_count:
        warnings.append(f"GEMM classes: {cluster.gpu.name} has no SM count for the GEMM shape law; kept from the base")
    fits, points = [], {}
    for spec in class_specs(cluster.gpu, pooled, holdout):
        if spec.name.startswith(("gemm", "conv")) and not cluster.gpu.sm_count:
            continue
        fit = fit_class(spec, holdout)
        fits.append(fit)
        if fit.value is not None:
            points[fit.key] = class_points(spec, fit.value, holdout)
        if fit.value is None and fit.samples:  # too few shapes, or no fit: what to record is in the reason
            warnings.append(f"{fit.key} ({fit.label}): {fit.why}")
    guard = step_guard(cluster.gpu, fits, launch_bound(cluster.gpu, pooled)) if holdout else None
    return fits, points, guard


def _fit_collectives(cluster: Cluster, colls: list[CollectiveSample], holdout: float, nccl: int, warnings: list[str]
                     ) -> tuple[list[tuple[str, CollectiveFit, FitOutcome]], list[dict[str, Any]]]:
    """``t = alpha + beta S`` per (kind, group size, level) with enough message sizes, and the
    page's points of each."""
    if not nccl:
        warnings.append("collectives: no NCCL kernels in the traces; the base's network constants stay (profile a "
                        "step that communicates)")
    elif not colls:
        warnings.append("collectives: NCCL kernels without message sizes or group sizes; the base's network constants "
                        "stay (PyTorch >= 2.1 records In msg nelems/Group size on them)")
    groups: dict[tuple[str, int, str], list[CollectiveSample]] = {}
    for c in colls:
        groups.setdefault((c.kind, c.group_size, c.level), []).append(c)
    need = MIN_COLLECTIVE_SIZES + (1 if holdout else 0)
    fitted, points = [], []
    for key in sorted(groups):
        ss = groups[key]
        sizes = len({s.size_bytes for s in ss})
        label = f"{key[0]} n={key[1]} {key[2].replace('_', '-')}"
        if sizes < need:
            warnings.append(f"collective {label}: {sizes} message size(s), {need} needed for latency and "
                            "bandwidth; kept from the base (profile more than one bucket size)")
            continue
        out = fit_collective(ss, holdout)
        if out is None:
            warnings.append(f"collective {label}: no positive bandwidth term fits (sizes too alike or times too noisy); kept from the base")
            continue
        fit = CollectiveFit(key[0], key[1], key[2], _round(out.values["alpha_s"]), _round(out.values["beta_s_per_byte"]))
        fitted.append((label, fit, out))
        points.append(_collective_entry(cluster, key, fit, ss, holdout))
    return fitted, points


def _collective_entry(cluster: Cluster, key: tuple[str, int, str], fit: CollectiveFit, ss: list[CollectiveSample],
                      holdout: float) -> dict[str, Any]:
    pts = collective_points(ss, holdout)
    grid = log_sizes(min(p["size_bytes"] for p in pts), max(p["size_bytes"] for p in pts))
    base_times = collective_times_s(lambda n: cluster if n is None else replace(cluster, num_gpus=n), *key, grid)
    return {"kind": key[0], "group_size": key[1], "level": key[2], "alpha_s": fit.alpha_s, "beta_s_per_byte": fit.beta_s_per_byte,
            "busbw_bytes_per_s": _round(fit.busbw_bytes_per_s), "points": pts,
            "line": [[x, _round(fit.alpha_s + fit.beta_s_per_byte * x)] for x in grid],
            "base_line": None if base_times is None else [[x, _round(t)] for x, t in zip(grid, base_times)]}


def _collective_records(cluster: Cluster, fitted: list[tuple[str, CollectiveFit, FitOutcome]]) -> list[dict[str, Any]]:
    """The record's entry per fitted collective, with its time at the reference sizes against the base's."""
    records = []
    for _, fit, out in fitted:
        key = (fit.kind, fit.group_size, fit.level)
        at = collective_times_s(lambda n: cluster if n is None else replace(cluster, num_gpus=n), *key, REFERENCE_SIZES)
        reference = [{"size_bytes": size, "fitted_s": _round(fit.alpha_s + fit.beta_s_per_byte * size),
                      "base_s": None if at is None else _round(at[i])} for i, size in enumerate(REFERENCE_SIZES)]
        term: dict[str, Any] = {k: _round(v) for k, v in out.values.items()}
        term.update(residual=out.residual.to_dict(), holdout=out.holdout.to_dict() if out.holdout is not None else None,
                    busbw_bytes_per_s=_round(fit.busbw_bytes_per_s), reference_times_s=reference)
        records.append({"kind": fit.kind, "group_size": fit.group_size, "level": fit.level, **term})
    return records


def _calibrated_cluster(cluster: Cluster, base_name: str, classes: list[ClassFit], fitted: list[tuple[str, CollectiveFit, FitOutcome]],
                        files: str) -> Cluster:
    """The base cluster with the used class values on its GPU (renamed apart: the cost caches
    tell GPUs apart by name) and the fitted collectives."""
    gpu = cluster.gpu
    values = {c.key: _round(c.value) for c in classes if c.used and c.value is not None}
    if values:
        sources = dict(gpu.sources)
        sources["calibrated_classes"] = f"calibrated by python main.py calibrate on {files} (see calibration)"
        gpu = replace(gpu, name=_gpu_name(gpu.name, values), sources=sources, calibrated_classes=values)
    fits = {(f.kind, f.group_size, f.level): f for f in cluster.collective_fits}
    fits.update({(f.kind, f.group_size, f.level): f for _, f, _ in fitted})
    return replace(cluster, gpu=gpu, name=f"{base_name} calibrated", collective_fits=tuple(fits[k] for k in sorted(fits)),
                   source_file=None)


def _distinct(infos: list[Any], warnings: list[str]) -> list[Any]:
    """The traces, each file's content once: a copy (the same sha256 under another name) would
    count its samples twice; it is left out with a warning."""
    seen: dict[str, str] = {}
    out = []
    for info in infos:
        if info.sha256 in seen:
            warnings.append(f"{info.file} is a copy of {seen[info.sha256]} (the same sha256) and is left out: its samples "
                            "would count twice")
            continue
        seen[info.sha256] = info.file
        out.append(info)
    return out


def _from_base(classes: list[ClassFit], fitted: list[Any]) -> list[str]:
    out = [f"gpu.calibrated_classes.{c.key} ({c.why})" for c in classes if not c.used]
    out += ["gpu (peaks, memory, link line rates)", "links.intra_node", "links.inter_node", "network (library, per-call overhead)"]
    out.append("collectives of other kinds and levels (the link model answers)" if fitted
               else "collectives (none fitted: the link model answers)")
    return out


def calibrate(paths: Sequence[str], base: str | None = None, holdout: float = 0.0, *,
              today: datetime.date | None = None, executor: Executor | None = None,
              on_progress: Callable[[int, int], None] | None = None) -> Calibration:
    """Fit the traces in ``paths`` (files or folders); see the module docstring.  Each file is
    read on ``executor`` (:func:`read_traces`; default: in this process; the caller closes an
    executor it passes); a file that cannot be read is left out with a warning naming it.

    Raises
    ------
    CalibrationError
        No usable sample at all, traces of two GPU types, or an unknown GPU without ``base``.
    TraceError
        A path is missing, or no trace could be read (each one missing, truncated or not a
        PyTorch-profiler trace).
    """
    if not 0.0 <= holdout < 1.0:
        raise CalibrationError(f"--holdout must be in [0, 1), got {holdout!r} (0.3 holds 30% of the shapes out)")
    infos, failed = read_traces(find_trace_files(list(paths)), executor, on_progress)
    if not infos:
        raise TraceError("no trace could be read: " + "; ".join(f"{name}: {why}" for name, why in failed))
    warnings = [f"{name} could not be read and is left out: {why}" for name, why in failed]
    infos = _distinct(infos, warnings)
    cluster, header = _identify(infos, base, warnings)
    header.update(traces=len(infos), unreadable=len(failed))
    pooled, colls = _pool(infos, header["per_node"], warnings)
    classes, class_pts, guard = _fit_classes(cluster, pooled, holdout, warnings)
    fitted, coll_pts = _fit_collectives(cluster, colls, holdout, pooled.nccl_kernels, warnings)
    if not any(c.value is not None for c in classes) and not fitted:
        raise CalibrationError("nothing could be fitted: " + "; ".join(warnings))
    calibrated = _calibrated_cluster(cluster, header["base"], classes, fitted, ", ".join(i.file for i in infos))
    record = {
        "tool": "python main.py calibrate",
        "date": (today or datetime.date.today()).isoformat(),
        "base": header["base"],
        "holdout": holdout or None,
        "gpu": {"preset": header["preset"], "identified_by": header["how"], "gpus_per_node_seen": header["per_node"]},
        "traces": [{"file": i.file, "sha256": i.sha256, "rank": i.rank, "world_size": i.world_size, "versions": i.versions}
                   for i in infos],
        "classes": [c.to_dict() for c in classes],
        "step_guard": None if guard is None else guard.to_dict(),
        "fitted": {"collectives": _collective_records(cluster, fitted)} if fitted else {},
        "from_base": _from_base(classes, fitted),
        "warnings": warnings,
    }
    doc = cluster_file_dict(calibrated, base=header["base"], calibration=record)
    points = {"classes": class_pts, "collectives": coll_pts}
    return Calibration(calibrated, doc, warnings, points, classes, fitted, header, guard)
