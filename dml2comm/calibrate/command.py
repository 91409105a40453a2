"""``python main.py calibrate TRACES... [--cluster BASE] [-o cluster.yaml] [--holdout 0.3]``.

Reads PyTorch-profiler (Kineto) traces of one short run on the user's cluster, fits the cost
models' constants to them (:mod:`dml2comm.calibrate.fit` on the samples of
:mod:`dml2comm.calibrate.samples`) and writes a cluster file (:mod:`dml2comm.hardware.cluster_file`):
the base preset's fields, the fitted values on the GPU (``gemm_sustained_factor``,
``hbm_efficiency``) and the measured collectives (``collective_fits``), and a ``calibration``
record with every fitted value, its sample count, residual, held-out error and provenance (trace
file names and sha256, the PyTorch/CUDA/NCCL versions the traces record, the date), and the
values that stayed from the base.

The GPU is identified from the traces' ``deviceProperties`` (name, else compute capability, SM
count and memory); ``--cluster`` names the base (a preset or a cluster file), by default the
identified GPU's usual node.  Bad input (no trace, traces of two GPU types, nothing usable in
them) is a one-line error and nothing is written; a term without enough samples keeps the
base's value with a warning naming what to record.

Each trace file is read where ``--executor`` says (:mod:`dml2comm.executors`: in this process by
default, ``--processes N`` local processes, or Dask workers): the map step
:func:`~dml2comm.calibrate.samples.file_samples` returns the file's provenance and samples only;
the GPU check, the node size, the collectives' link levels and the fits run here once every
file is in, in the order of the files, so the outputs are byte-identical whichever executor read
them.  A file that cannot be read is left out with a warning naming it and why.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import os
import sys
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence

from dml2comm.argtypes import OneLineParser, positive_int
from dml2comm.export.files import check_output_file, check_output_folder
from dml2comm.calibrate.fit import (GEMM_FIT_DTYPES, MIN_COLLECTIVE_SIZES, MIN_GEMM_FLOPS, MIN_GEMM_SHAPES, MIN_MEMORY_BYTES,
                                    MIN_MEMORY_SHAPES, SUSTAINED_BOUNDS, FitOutcome, fit_collective, fit_gemm_sustained,
                                    fit_hbm_efficiency)
from dml2comm.calibrate.base import REFERENCE_SIZES, collective_times_s
from dml2comm.calibrate.points import collective_points, gemm_points, log_sizes, memory_points
from dml2comm.calibrate.samples import (CollectiveSample, GemmSample, MemorySample, TraceFile, classify_collectives,
                                        file_samples)
from dml2comm.cost.compute import hbm_efficiency_of
from dml2comm.cost.gemm import sustained_factor
from dml2comm.errors import ConfigError
from dml2comm.executors import Executor, LocalExecutor, add_executor_args, executor_from_args, progress_bar
from dml2comm.hardware.cluster import Cluster, CollectiveFit, default_preset_name, get_cluster, is_cluster_file
from dml2comm.hardware.cluster_file import cluster_file_dict, dump_cluster_file
from dml2comm.hardware.gpus import GPU, GPU_ALIASES, GPUS
from dml2comm.traces.load import TraceError, find_trace_files

__all__ = ["CalibrationError", "Calibration", "calibrate", "read_traces", "identify_gpu", "run_calibrate_command", "default_site_dir"]

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

_RECORD_SHAPES = "profile with torch.profiler.profile(record_shapes=True)"


class CalibrationError(ConfigError):
    """The traces cannot calibrate anything (none usable, mixed GPU types, unknown GPU)."""


@dataclass
class Calibration:
    """What :func:`calibrate` found: the calibrated cluster, the file's document, the report."""

    cluster: Cluster
    document: dict[str, Any]
    lines: list[str]
    warnings: list[str] = field(default_factory=list)
    #: the fitted samples, one point per shape or size (:mod:`dml2comm.calibrate.points`), for the page
    points: dict[str, Any] = field(default_factory=dict)


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


# ------------------------------------------------------------------------------ calibration


def _round(x: float) -> float:
    return float(f"{x:.6g}")


def _term(outcome: FitOutcome, base: float | None, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    d: dict[str, Any] = {k: _round(v) for k, v in outcome.values.items()}
    if base is not None:
        d["base_value"] = _round(base)
    d["residual"] = outcome.residual.to_dict()
    d["holdout"] = outcome.holdout.to_dict() if outcome.holdout is not None else None
    d.update(extra or {})
    return d


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _res_text(outcome: FitOutcome) -> str:
    r = outcome.residual
    text = f"{r.samples} samples / {r.shapes} shapes, error median {_pct(r.median_rel_error)} worst {_pct(r.worst_rel_error)}"
    if outcome.holdout is not None:
        h = outcome.holdout
        text += f"; held out {h.shapes} shapes: median {_pct(h.median_rel_error)} worst {_pct(h.worst_rel_error)}"
    return text


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


def _gpu_name(preset: str, values: dict[str, float]) -> str:
    digest = hashlib.sha256(repr(sorted(values.items())).encode()).hexdigest()[:8]
    return f"{preset.split(' cal-')[0]} cal-{digest}"


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


#: The longest a profiled kernel may take (one hour): a longer or non-finite duration (a trace
#: whose dur reads 1e308) is not a measurement, and fitting it gives a zero efficiency.
MAX_KERNEL_S = 3600.0


def _plausible(samples: list[Any]) -> list[Any]:
    """The samples whose ``time_s`` is a finite duration in (0, :data:`MAX_KERNEL_S`]."""
    return [x for x in samples if 0.0 < x.time_s <= MAX_KERNEL_S]


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
    files = find_trace_files(list(paths))
    infos, failed = read_traces(files, executor, on_progress)
    if not infos:
        raise TraceError("no trace could be read: " + "; ".join(f"{name}: {why}" for name, why in failed))
    warnings = [f"{name} could not be read and is left out: {why}" for name, why in failed]
    # ---- what needs every file: one GPU type, its node size, hence each collective's link level
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
    gpu = cluster.gpu
    per_node = max((len(i.devices) for i in infos), default=0) or cluster.gpus_per_node
    gemms: list[GemmSample] = [g for i in infos for g in i.samples.gemms]
    memory: list[MemorySample] = [m for i in infos for m in i.samples.memory]
    colls: list[CollectiveSample] = [c for i in infos for c in classify_collectives(i.samples.collectives, i.world_size, per_node)]
    before = len(gemms) + len(memory) + len(colls)
    gemms, memory, colls = _plausible(gemms), _plausible(memory), _plausible(colls)
    absurd = before - len(gemms) - len(memory) - len(colls)
    if absurd:
        warnings.append(f"{absurd} kernel sample(s) left out: a duration that is not a positive number below "
                        f"{MAX_KERNEL_S:.0f} s (the trace's dur is in microseconds); check how the trace was written")
    shaped = sum(i.samples.shaped_ops for i in infos)
    nccl = sum(i.samples.nccl_kernels for i in infos)
    if not shaped and not colls:
        why = "no NCCL kernels" if not nccl else "NCCL kernels without message sizes (PyTorch >= 2.1 records them)"
        raise CalibrationError(f"nothing to fit in {len(infos)} trace(s): no operator shapes ({_RECORD_SHAPES}) and {why}")
    fitted: dict[str, Any] = {}
    points: dict[str, Any] = {"gemm": [], "memory": [], "collectives": []}
    lines: list[str] = [f"GPU: {gpu.name} ({how}); base: {base_name}; {len(infos)} trace(s)"
                        + (f" ({len(failed)} unreadable, left out)" if failed else "")]
    from_base: list[str] = []
    gpu_values: dict[str, float] = {}

    # ---- GEMM sustained factor
    usable = [g for g in gemms if g.dtype in GEMM_FIT_DTYPES and g.dtype in gpu.peak_flops_per_s
              and 2 * g.b * g.m * g.n * g.k >= MIN_GEMM_FLOPS]
    if len(usable) < len(gemms):
        warnings.append(f"{len(gemms) - len(usable)} of {len(gemms)} GEMM samples left out of the sustained-factor fit: "
                        f"below {MIN_GEMM_FLOPS:.0e} FLOPs, fp32 on CUDA cores, or a data type {gpu.name} has no peak for")
    gemm_shapes = len({(g.b, g.m, g.n, g.k, g.dtype) for g in usable})
    out = None
    if not shaped:
        warnings.append(f"GEMM sustained factor: no operator shapes in the traces; kept from the base ({_RECORD_SHAPES})")
    elif gemm_shapes < MIN_GEMM_SHAPES + (1 if holdout else 0) or not gpu.sm_count:
        warnings.append(f"GEMM sustained factor: {gemm_shapes} usable GEMM shape(s) (aten::mm/addmm/bmm/matmul/linear with their "
                        f"kernels) found, {MIN_GEMM_SHAPES} needed; kept from the base (profile steps with large matrix products)")
    else:
        out = fit_gemm_sustained(gpu, usable, holdout)
        f = out.values["gemm_sustained_factor"]
        if not SUSTAINED_BOUNDS[0] * 1.01 < f < SUSTAINED_BOUNDS[1] * 0.99:
            warnings.append(f"GEMM sustained factor: the fit ran to its bound ({f:.3g}): the shape law does not describe these "
                            "GEMMs; kept from the base")
            out = None
    if out is not None:
        dtypes = sorted({g.dtype for g in usable})
        fitted["gemm_sustained_factor"] = _term(out, sustained_factor(gpu), {"dtypes": dtypes})
        gpu_values["gemm_sustained_factor"] = out.values["gemm_sustained_factor"]
        points["gemm"] = gemm_points(gpu, usable, out.values["gemm_sustained_factor"], sustained_factor(gpu), holdout)
        lines.append(f"GEMM sustained factor {out.values['gemm_sustained_factor']:.4f} (base {sustained_factor(gpu):.3f}, "
                     f"{'/'.join(dtypes)}): {_res_text(out)}")
    if "gemm_sustained_factor" not in fitted:
        from_base.append("gpu.gemm_sustained_factor")

    # ---- HBM efficiency
    big = [m for m in memory if m.bytes >= MIN_MEMORY_BYTES]
    mem_shapes = len({(m.op, m.shape, m.bytes) for m in big})
    if shaped and mem_shapes >= MIN_MEMORY_SHAPES + (1 if holdout else 0):
        out = fit_hbm_efficiency(gpu, big, holdout)
        base_e = hbm_efficiency_of(gpu)
        fitted["hbm_efficiency"] = _term(out, base_e, {"min_bytes": MIN_MEMORY_BYTES,
                                                       "ops": sorted({m.op for m in big})})
        gpu_values["hbm_efficiency"] = out.values["hbm_efficiency"]
        points["memory"] = memory_points(gpu, big, out.values["hbm_efficiency"], base_e, holdout)
        lines.append(f"HBM efficiency {out.values['hbm_efficiency']:.4f} (base {base_e:.3f}): {_res_text(out)}")
    else:
        from_base.append("gpu.hbm_efficiency")
        if shaped:
            warnings.append(f"HBM efficiency: {mem_shapes} element-wise/normalisation shape(s) of at least "
                            f"{MIN_MEMORY_BYTES // 2**20} MiB found, {MIN_MEMORY_SHAPES} needed; kept from the base "
                            "(profile a step with large activations)")

    # ---- collectives
    fits: dict[tuple[str, int, str], CollectiveFit] = {(f.kind, f.group_size, f.level): f for f in cluster.collective_fits}
    coll_records = []
    groups: dict[tuple[str, int, str], list[CollectiveSample]] = {}
    for c in colls:
        groups.setdefault((c.kind, c.group_size, c.level), []).append(c)
    if not nccl:
        warnings.append("collectives: no NCCL kernels in the traces; the base's network constants stay (profile a "
                        "step that communicates)")
    elif not colls:
        warnings.append("collectives: NCCL kernels without message sizes or group sizes; the base's network constants "
                        "stay (PyTorch >= 2.1 records In msg nelems/Group size on them)")
    for key in sorted(groups):
        ss = groups[key]
        sizes = len({s.size_bytes for s in ss})
        label = f"{key[0]} n={key[1]} {key[2].replace('_', '-')}"
        if sizes < MIN_COLLECTIVE_SIZES + (1 if holdout else 0):
            warnings.append(f"collective {label}: {sizes} message size(s), {MIN_COLLECTIVE_SIZES + (1 if holdout else 0)} needed for latency and "
                            "bandwidth; kept from the base (profile more than one bucket size)")
            continue
        out2 = fit_collective(ss, holdout)
        if out2 is None:
            warnings.append(f"collective {label}: no positive bandwidth term fits (sizes too alike or times too noisy); kept from the base")
            continue
        fit = CollectiveFit(key[0], key[1], key[2], _round(out2.values["alpha_s"]), _round(out2.values["beta_s_per_byte"]))
        fits[key] = fit
        pts = collective_points(ss, holdout)
        grid = log_sizes(min(p["size_bytes"] for p in pts), max(p["size_bytes"] for p in pts))
        base_times = collective_times_s(lambda n: cluster if n is None else replace(cluster, num_gpus=n), *key, grid)
        points["collectives"].append({
            "kind": key[0], "group_size": key[1], "level": key[2], "alpha_s": fit.alpha_s, "beta_s_per_byte": fit.beta_s_per_byte,
            "busbw_bytes_per_s": _round(fit.busbw_bytes_per_s), "points": pts,
            "line": [[x, _round(fit.alpha_s + fit.beta_s_per_byte * x)] for x in grid],
            "base_line": None if base_times is None else [[x, _round(t)] for x, t in zip(grid, base_times)]})
        at = collective_times_s(lambda n: cluster if n is None else replace(cluster, num_gpus=n), *key, REFERENCE_SIZES)
        reference = [{"size_bytes": size, "fitted_s": _round(fit.alpha_s + fit.beta_s_per_byte * size),
                      "base_s": None if at is None else _round(at[i])} for i, size in enumerate(REFERENCE_SIZES)]
        coll_records.append({"kind": key[0], "group_size": key[1], "level": key[2],
                             **_term(out2, None, {"busbw_bytes_per_s": _round(fit.busbw_bytes_per_s), "reference_times_s": reference})})
        lines.append(f"{label}: alpha {fit.alpha_s * 1e6:.2f} µs, busbw {fit.busbw_bytes_per_s / 1e9:.2f} GB/s: {_res_text(out2)}")
    if coll_records:
        fitted["collectives"] = coll_records
    from_base += ["gpu (peaks, memory, link line rates)", "links.intra_node", "links.inter_node",
                  "network (library, per-call overhead)"]
    if not coll_records:
        from_base.append("collectives (none fitted: the link model answers)")
    else:
        from_base.append("collectives of other kinds and levels (the link model answers)")
    if not fitted:
        raise CalibrationError("nothing could be fitted: " + "; ".join(warnings))

    # ---- the calibrated cluster
    if gpu_values:
        values = {k: _round(v) for k, v in gpu_values.items()}
        sources = dict(gpu.sources)
        for k in values:
            sources[k] = f"calibrated by python main.py calibrate on {', '.join(i.file for i in infos)} (see calibration)"
        gpu = replace(gpu, name=_gpu_name(gpu.name, values), sources=sources, **values)
    calibrated = replace(cluster, gpu=gpu, name=f"{base_name} calibrated", collective_fits=tuple(fits[k] for k in sorted(fits)),
                         source_file=None)
    record = {
        "tool": "python main.py calibrate",
        "date": (today or datetime.date.today()).isoformat(),
        "base": base_name,
        "holdout": holdout or None,
        "gpu": {"preset": preset, "identified_by": how, "gpus_per_node_seen": per_node},
        "traces": [{"file": i.file, "sha256": i.sha256, "rank": i.rank, "world_size": i.world_size, "versions": i.versions}
                   for i in infos],
        "fitted": fitted,
        "from_base": from_base,
        "warnings": warnings,
    }
    doc = cluster_file_dict(calibrated, base=base_name, calibration=record)
    return Calibration(calibrated, doc, lines, warnings, points)


# ---------------------------------------------------------------------------------- command


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text!r}") from None
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text!r}")
    return value


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder moved into place
    (nothing half-written)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
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
    parser.add_argument("--holdout", type=_fraction, default=0.0,
                        help="share of the shapes (sizes) held out of each fit and scored alone, e.g. 0.3 (default 0)")
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
        from dml2comm.calibrate.site import publish_calibration_site

        publish_calibration_site(site, result.document, result.points, out.name, text, hashlib.sha256(text.encode()).hexdigest())
    write_atomic(out, text)
    for line in result.lines:
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
