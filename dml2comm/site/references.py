"""Collect the formulas and preset constants the numbers come from, out of the code itself.

The references page is built from what the code says, so it cannot drift from it:

- module docstrings and the docstrings of public functions of the cost and plan modules
  (each formula's docstring defines its symbols and cites its source, STYLE.md);
- module-level constants documented with a ``#:`` comment (e.g. the PCIe bandwidth of the input
  Read, Megatron's vocabulary padding, DDP's bucket size);
- every number of the GPU and cluster presets with its ``sources`` entry, the ones in use first.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from dataclasses import dataclass
from typing import Any, Mapping

from dml2comm.analysis import Analysis
from dml2comm.fmt import fmt_bytes, fmt_flops, fmt_s

__all__ = ["DocEntry", "Section", "reference_sections", "preset_tables", "calibration_table"]

#: (section title, module) in reading order: how an iteration's time is put together, then the
#: parts.  Op-family modules are added after ``dml2comm.ops.registry``.
MODULES: tuple[tuple[str, str], ...] = (
    ("Analysis: how the pieces are chained", "dml2comm.analysis"),
    ("Compute time (roofline)", "dml2comm.cost.compute"),
    ("GEMM time: measured tables and the shape law", "dml2comm.cost.gemm"),
    ("Op costs and fused kernels", "dml2comm.cost.ops"),
    ("Eager LayerNorm, RMSNorm and BatchNorm kernels", "dml2comm.cost.norm"),
    ("Eager column sums (bias and weight gradients)", "dml2comm.cost.colsum"),
    ("Eager GELU written as primitives", "dml2comm.cost.gelu"),
    ("Host-side time", "dml2comm.cost.host"),
    ("Training loss (cross-entropy)", "dml2comm.cost.loss"),
    ("Per-layer tables", "dml2comm.cost.layers"),
    ("Stage tables: every stage-level term", "dml2comm.cost.stages"),
    ("Memory per GPU", "dml2comm.cost.memory"),
    ("Expected error: the bands every prediction states", "dml2comm.cost.bands"),
    ("A profiled step's CPU and idle time (--profile)", "dml2comm.traces.host"),
    ("Pipeline schedules", "dml2comm.parallel.schedule"),
    ("Iteration simulation", "dml2comm.sim.engine"),
    ("Operator FLOPs and bytes", "dml2comm.ops.registry"),
    ("Tensor parallelism", "dml2comm.parallel.tensor"),
    ("Pipeline parallelism", "dml2comm.parallel.pipeline"),
    ("Data parallelism", "dml2comm.parallel.data"),
    ("Parallel configuration", "dml2comm.parallel.config"),
    ("Collective algorithms", "dml2comm.network.collectives"),
    ("Network model", "dml2comm.network.model"),
    ("Network topologies", "dml2comm.network.topology"),
    ("NCCL algorithm and protocol choice", "dml2comm.network.nccl"),
    ("Cluster, links and rank mapping", "dml2comm.hardware.cluster"),
    ("GPU presets", "dml2comm.hardware.gpus"),
)


@dataclass(frozen=True)
class DocEntry:
    name: str
    doc: str


@dataclass(frozen=True)
class Constant:
    name: str
    value: str
    doc: str


@dataclass(frozen=True)
class Section:
    title: str
    module: str
    doc: str
    functions: tuple[DocEntry, ...]
    constants: tuple[Constant, ...]


_CONST = re.compile(r"^([A-Z][A-Z0-9_]*)\s*(?::[^=]+)?=\s*(.+)$")


def _constants(module: Any) -> tuple[Constant, ...]:
    """Module-level ``NAME = value`` lines preceded by ``#:`` comment lines."""
    try:
        source = inspect.getsource(module)
    except (OSError, TypeError):
        return ()
    out: list[Constant] = []
    comment: list[str] = []
    for line in source.splitlines():
        if line.startswith("#:"):
            comment.append(line[2:].strip())
            continue
        m = _CONST.match(line)
        if m and comment:
            value = getattr(module, m.group(1), m.group(2))
            if isinstance(value, (int, float, str)):
                text = repr(value)
            elif isinstance(value, Mapping) and all(isinstance(v, (int, float, str)) for v in value.values()):
                text = repr(dict(value))  # a table of numbers (e.g. a fitted factor per GPU)
            else:
                text = m.group(2).strip()
            if len(text) > 120:
                text = text[:117] + "..."
            out.append(Constant(m.group(1), text, " ".join(comment)))
        comment = []
    return tuple(out)


def _functions(module: Any) -> tuple[DocEntry, ...]:
    names = getattr(module, "__all__", ())
    out = []
    for name in names:
        obj = getattr(module, name, None)
        if inspect.isfunction(obj) and obj.__module__ == module.__name__ and obj.__doc__:
            sig = ""
            try:
                sig = str(inspect.signature(obj))
            except (TypeError, ValueError):
                pass
            out.append(DocEntry(f"{name}{sig}", inspect.cleandoc(obj.__doc__)))
    return tuple(out)


def _section(title: str, name: str) -> Section | None:
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as exc:  # a module of a later milestone: nothing to cite yet
        if exc.name == name:
            return None
        raise
    return Section(title, name, inspect.cleandoc(module.__doc__ or ""), _functions(module), _constants(module))


def reference_sections() -> list[Section]:
    """Every module of :data:`MODULES` (op families after the op registry)."""
    import dml2comm.ops as ops_pkg

    sections: list[Section] = []
    for title, name in MODULES:
        section = _section(title, name)
        if section is None:
            continue
        sections.append(section)
        if name == "dml2comm.ops.registry":
            for info in sorted(pkgutil.iter_modules(ops_pkg.__path__), key=lambda i: i.name):
                if info.name in ("registry", "__init__") or info.name.startswith("_"):
                    continue
                op_section = _section(f"Operators: {info.name}", f"dml2comm.ops.{info.name}")
                if op_section is not None:
                    sections.append(op_section)
    return sections


def _gpu_rows(gpu: Any) -> list[tuple[str, str, str]]:
    rows = []
    for key, value in sorted(gpu.peak_flops_per_s.items()):
        rows.append((f"peak_flops_per_s.{key}", fmt_flops(value) + "/s", gpu.sources.get(f"peak_flops_per_s.{key}", "")))
    for key in ("hbm_bytes", "hbm_bytes_per_s", "nvlink_bytes_per_s", "pcie_bytes_per_s"):
        value = getattr(gpu, key)
        shown = f"{value / 1e9:g} GB" if key == "hbm_bytes" else f"{value / 1e9:g} GB/s"
        rows.append((key, shown, gpu.sources.get(key, "")))
    if gpu.sm_count:  # the GEMM law's waves, the eager norm law's blocks
        rows.append(("sm_count", str(gpu.sm_count), gpu.sources.get("sm_count", "")))
    if gpu.l2_bytes:  # the eager norm law's spill
        rows.append(("l2_bytes", f"{gpu.l2_bytes / 1e6:g} MB", gpu.sources.get("l2_bytes", "")))
    if gpu.kernel_bandwidth_share != 1.0:  # memory-bound kernels' share of hbm_bytes_per_s (the H200)
        rows.append(("kernel_bandwidth_share", f"{gpu.kernel_bandwidth_share:.4g}", gpu.sources.get("kernel_bandwidth_share", "")))
    for key in ("gemm_sustained_factor", "hbm_efficiency"):  # a calibrated GPU's own values (python main.py calibrate)
        value = getattr(gpu, key, None)
        if value is not None:
            rows.append((key, f"{value:.4g}", gpu.sources.get(key, "")))
    return rows


def _link_rows(link: Any) -> list[tuple[str, str, str]]:
    return [
        ("bandwidth_bytes_per_s", f"{link.bandwidth_bytes_per_s / 1e9:g} GB/s", link.sources.get("bandwidth_bytes_per_s", "")),
        ("efficiency", f"{link.efficiency:.4g}", link.sources.get("efficiency", "")),
        ("latency_s", fmt_s(link.latency_s), link.sources.get("latency_s", "")),
    ]


def preset_tables(analysis: Analysis) -> dict[str, Any]:
    """The GPU and links in use, then every other preset, each number with its source."""
    from dml2comm.hardware.cluster import CLUSTERS
    from dml2comm.hardware.gpus import GPUS, get_gpu

    cluster = analysis.cluster
    in_use = [
        {"title": f"GPU in use: {cluster.gpu.name}", "rows": _gpu_rows(cluster.gpu)},
        {"title": f"Link inside a node: {cluster.intra_node.name}", "rows": _link_rows(cluster.intra_node)},
        {"title": f"Link between nodes: {cluster.inter_node.name}", "rows": _link_rows(cluster.inter_node)},
    ]
    others = []
    for name in sorted(GPUS):
        gpu = get_gpu(name)
        if gpu.name != cluster.gpu.name:
            others.append({"title": f"GPU preset {gpu.name}", "rows": _gpu_rows(gpu)})
    for name in sorted(CLUSTERS):
        preset = CLUSTERS[name]
        others.append({"title": f"Cluster preset {name}: {preset.description}",
                       "rows": [("gpu", preset.gpu_name, ""), ("gpus_per_node", str(preset.gpus_per_node), ""),
                                ("nics_per_node", str(preset.nics_per_node), "")]
                       + [(f"intra_node.{k}", v, s) for k, v, s in _link_rows(preset.intra_node)]
                       + [(f"nic.{k}", v, s) for k, v, s in _link_rows(preset.nic)]
                       + [("assumption", a, "") for a in preset.assumptions]})
    assumptions = list(cluster.assumptions)
    return {"in_use": in_use, "others": others, "assumptions": assumptions,
            "bucket": fmt_bytes(analysis.config.bucket_bytes), "calibration": calibration_table(cluster)}


def calibration_table(cluster: Any) -> dict[str, Any] | None:
    """For a cluster loaded from a cluster file (``--cluster FILE.yaml``): the file (name,
    sha256), its calibration (date, base, traces) and one row per calibrated constant with its
    value, the base preset's, its residuals and held-out errors
    (:func:`dml2comm.calibrate.rows.fitted_rows`); None for a preset."""
    from dml2comm.calibrate.rows import fitted_rows
    from dml2comm.hardware.cluster_file import loaded_cluster_file

    if cluster.source_file is None:
        return None
    name, sha = cluster.source_file
    out: dict[str, Any] = {"file": name, "sha256": sha, "date": "", "base": "", "traces": [], "rows": [], "from_base": [],
                           "note": ""}
    spec = loaded_cluster_file(sha)
    if spec is None:
        out["note"] = "the file's calibration record is not at hand (the file was read in another process)"
        return out
    record = spec.calibration
    if not record:
        out["note"] = "a hand-written cluster file (no calibration record): its values are used as written"
        return out
    out.update(date=str(record.get("date", "")), base=str(record.get("base") or spec.base or ""), rows=fitted_rows(record),
               traces=[str(t.get("file", "")) for t in record.get("traces") or []],
               from_base=[str(f) for f in record.get("from_base") or []])
    return out
