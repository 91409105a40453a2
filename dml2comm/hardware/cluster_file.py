"""Cluster files: a whole cluster (its GPU, nodes, links, network and measured collectives) in YAML.

``--cluster FILE.yaml`` works wherever a preset name does (``get_cluster`` sends a ``.yaml`` or
``.yml`` value here).  ``python main.py calibrate`` writes one (:mod:`dml2comm.calibrate`); one can
also be written by hand.  The schema is the data.json ``cluster`` block
(:meth:`dml2comm.hardware.cluster.Cluster.to_dict`) with the GPU as a mapping
(:meth:`dml2comm.hardware.gpus.GPU.to_dict`) instead of a name, plus::

    format: dml2comm-cluster/1       # required, first key written
    base: dgx-a100                   # the preset it started from (informational, may be null)
    collective_fits: [...]           # measured collectives (CollectiveFit), optional
    calibration: {...}               # the calibration record (fits, residuals, provenance), optional

Keys that data.json derives (``num_gpus``, ``num_nodes``, a link's ``effective_bytes_per_s``, a
fit's ``busbw_bytes_per_s``) are accepted and ignored: the run's d x t x p x c sets the size.
Every other unknown key, a missing field or a bad value is refused with a one-line
:class:`~dml2comm.errors.ConfigError` naming the key and the fix.

A GPU that carries calibrated values (``calibrated_classes``: one value per kernel class,
:mod:`dml2comm.cost.calibrated`; or, in files written before the classes, the single
``gemm_sustained_factor`` and ``hbm_efficiency``, still read) may not use
a preset's name: the cost caches tell GPUs apart by name, so a calibrated GPU is named apart
(``calibrate`` writes ``A100-SXM4-80GB cal-1a2b3c4d``, the suffix a hash of the values).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

from dml2comm.errors import ConfigError
from dml2comm.hardware.cluster import (COLLECTIVE_LIBRARIES, INTRA_TOPOLOGIES, Cluster, CollectiveFit, Link,
                                       register_cluster_file_loader)
from dml2comm.hardware.gpus import CALIBRATED_CLASSES as CLASSES, GPUS, GPU, parse_class_key

__all__ = ["FORMAT", "ClusterFile", "load_cluster_file", "loaded_cluster_file", "parse_cluster_file", "cluster_file_dict", "dump_cluster_file"]

#: The value of the required ``format`` key.
FORMAT = "dml2comm-cluster/1"

_TOP_REQUIRED = ("format", "name", "gpu", "gpus_per_node", "topology", "links")
#: A cluster file's ``assumptions``: at most this many sentences of at most this many characters
#: (they are copied into every data.json, summary and page that uses the file).
MAX_ASSUMPTIONS = 64
MAX_ASSUMPTION_CHARS = 1000
_TOP_OPTIONAL = ("base", "assumptions", "network", "collective_fits", "calibration")
_TOP_DERIVED = ("num_gpus", "num_nodes")
_GPU_REQUIRED = ("name", "peak_flops_per_s", "hbm_bytes", "hbm_bytes_per_s", "nvlink_bytes_per_s", "pcie_bytes_per_s")
_GPU_OPTIONAL = ("sm_count", "l2_bytes", "sources", "gemm_sustained_factor", "hbm_efficiency", "calibrated_classes",
                 "kernel_bandwidth_share")
_LINK_REQUIRED = ("name", "bandwidth_bytes_per_s", "latency_s")
_LINK_OPTIONAL = ("efficiency", "kernel_s_per_byte", "hw", "links_per_gpu", "in_network_efficiency", "reduce_s_per_byte",
                  "alltoall_latency_s", "sources")
_LINK_DERIVED = ("effective_bytes_per_s",)
_NETWORK_OPTIONAL = ("intra_topology", "nvlink_matrix", "nics_per_node", "collective_library", "collective_overhead_s", "host_model",
                     "sources")
_FIT_REQUIRED = ("kind", "group_size", "level", "alpha_s", "beta_s_per_byte")
_FIT_DERIVED = ("busbw_bytes_per_s",)


@dataclass(frozen=True)
class ClusterFile:
    """A loaded cluster file: everything but the size; :meth:`build` makes the :class:`Cluster`."""

    name: str
    base: str | None
    gpu: GPU
    gpus_per_node: int
    topology: str
    intra_node: Link
    inter_node: Link
    assumptions: tuple[str, ...]
    intra_topology: str
    nvlink_matrix: tuple[tuple[int, ...], ...] | None
    nics_per_node: int | None
    collective_library: str
    collective_overhead_s: float
    sources: tuple[tuple[str, str], ...]
    collective_fits: tuple[CollectiveFit, ...]
    calibration: Mapping[str, Any] = field(default_factory=dict)
    file_name: str = ""
    sha256: str = ""
    host_model: str = "auto"
    folder: str = ""  # the folder the file was read from ("" when parsed from a document)

    def build(self, num_gpus: int | None = None) -> Cluster:
        """The cluster with ``num_gpus`` GPUs (default one node), named as presets are."""
        total = self.gpus_per_node if num_gpus is None else num_gpus
        return Cluster(
            gpu=self.gpu, num_gpus=total, gpus_per_node=self.gpus_per_node, intra_node=self.intra_node,
            inter_node=self.inter_node, topology=self.topology,
            name=f"{self.name} x{total}" if total != self.gpus_per_node else self.name,
            assumptions=self.assumptions, intra_topology=self.intra_topology, nvlink_matrix=self.nvlink_matrix,
            nics_per_node=self.nics_per_node, collective_library=self.collective_library,
            collective_overhead_s=self.collective_overhead_s, sources=self.sources,
            collective_fits=self.collective_fits, source_file=(self.file_name, self.sha256) if self.file_name else None,
            host_model=self.host_model,
        )


# ------------------------------------------------------------------------------------ reading


def _keys(data: Any, where: str, required: tuple[str, ...], optional: tuple[str, ...] = (),
          derived: tuple[str, ...] = ()) -> dict[str, Any]:
    """``data`` as a dict after checking it is a mapping with the required keys and no unknown one."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where} must be a mapping of keys to values, got {type(data).__name__}")
    for key in data:
        if key not in required and key not in optional and key not in derived:
            allowed = ", ".join(required + optional)
            raise ConfigError(f"{where}: unknown key {key!r}; allowed: {allowed} (check the spelling)")
    for key in required:
        if key not in data:
            raise ConfigError(f"{where}: missing key {key!r}; add it (see dml2comm/hardware/cluster_file.py)")
    return {k: v for k, v in data.items() if k not in derived}


def _number(value: Any, where: str, *, positive: bool = False, allow_none: bool = False) -> float | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0 \
            or (positive and value == 0):
        raise ConfigError(f"{where} must be a {'positive' if positive else 'non-negative'} number, got {value!r}")
    return float(value)


def _integer(value: Any, where: str, allow_none: bool = False) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{where} must be a positive integer, got {value!r}")
    return value


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{where} must be a non-empty string, got {value!r}")
    return value


def _sources(value: Any, where: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise ConfigError(f"{where} must be a mapping of field names to source texts")
    return dict(value)


def _classes(value: Any) -> dict[str, float]:
    """``gpu.calibrated_classes``: kernel class -> calibrated value (:mod:`dml2comm.cost.calibrated`)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError("gpu.calibrated_classes must be a mapping of kernel classes to values "
                          f"({', '.join(CLASSES)}), as python main.py calibrate writes it")
    out = {}
    for key, v in value.items():
        try:
            parse_class_key(key)
        except ConfigError as e:
            raise ConfigError(f"gpu.calibrated_classes: {e}") from None
        out[key] = _number(v, f"gpu.calibrated_classes.{key}", positive=True)
    return out


def _gpu(data: Any) -> GPU:
    d = _keys(data, "gpu", _GPU_REQUIRED, _GPU_OPTIONAL)
    name = _text(d["name"], "gpu.name")
    peaks = d["peak_flops_per_s"]
    if not isinstance(peaks, dict) or not peaks:
        raise ConfigError("gpu.peak_flops_per_s must be a mapping of dtype keys (bf16, fp16, tf32, fp32, fp8) to FLOP/s")
    peaks = {str(k): _number(v, f"gpu.peak_flops_per_s.{k}", positive=True) for k, v in peaks.items()}
    calibrated: dict[str, Any] = {k: _number(d.get(k), f"gpu.{k}", positive=True, allow_none=True)
                                  for k in ("gemm_sustained_factor", "hbm_efficiency")}
    calibrated["calibrated_classes"] = _classes(d.get("calibrated_classes"))
    if (any(v is not None for k, v in calibrated.items() if k != "calibrated_classes") or calibrated["calibrated_classes"]) \
            and name in GPUS:
        raise ConfigError(f"gpu.name {name!r} is a preset's name but the GPU carries calibrated values; rename it "
                          f"(e.g. {name + ' (mine)'!r}) so that costs cached for the preset are not reused")
    sm = d.get("sm_count", 0)
    if isinstance(sm, bool) or not isinstance(sm, int) or sm < 0:
        raise ConfigError(f"gpu.sm_count must be a non-negative integer, got {sm!r}")
    return GPU(name=name, peak_flops_per_s=peaks,  # type: ignore[arg-type]
               hbm_bytes=_number(d["hbm_bytes"], "gpu.hbm_bytes", positive=True),  # type: ignore[arg-type]
               hbm_bytes_per_s=_number(d["hbm_bytes_per_s"], "gpu.hbm_bytes_per_s", positive=True),  # type: ignore[arg-type]
               nvlink_bytes_per_s=_number(d["nvlink_bytes_per_s"], "gpu.nvlink_bytes_per_s"),  # type: ignore[arg-type]
               pcie_bytes_per_s=_number(d["pcie_bytes_per_s"], "gpu.pcie_bytes_per_s"),  # type: ignore[arg-type]
               sources=_sources(d.get("sources"), "gpu.sources"), sm_count=sm,
               l2_bytes=_number(d.get("l2_bytes", 0.0), "gpu.l2_bytes"),  # type: ignore[arg-type]
               kernel_bandwidth_share=_number(d.get("kernel_bandwidth_share", 1.0), "gpu.kernel_bandwidth_share", positive=True),  # type: ignore[arg-type]
               **calibrated)


def _link(data: Any, where: str) -> Link:
    d = _keys(data, where, _LINK_REQUIRED, _LINK_OPTIONAL, _LINK_DERIVED)
    kwargs: dict[str, Any] = {
        "name": _text(d["name"], f"{where}.name"),
        "bandwidth_bytes_per_s": _number(d["bandwidth_bytes_per_s"], f"{where}.bandwidth_bytes_per_s", positive=True),
        "latency_s": _number(d["latency_s"], f"{where}.latency_s"),
        "sources": _sources(d.get("sources"), f"{where}.sources"),
    }
    if "efficiency" in d:
        kwargs["efficiency"] = _number(d["efficiency"], f"{where}.efficiency", positive=True)
    for name in ("kernel_s_per_byte", "reduce_s_per_byte", "alltoall_latency_s"):
        if name in d:
            kwargs[name] = _number(d[name], f"{where}.{name}")
    if "hw" in d:
        kwargs["hw"] = "" if d["hw"] is None else d["hw"]
    if "links_per_gpu" in d:
        kwargs["links_per_gpu"] = _integer(d["links_per_gpu"], f"{where}.links_per_gpu")
    if "in_network_efficiency" in d:
        kwargs["in_network_efficiency"] = _number(d["in_network_efficiency"], f"{where}.in_network_efficiency", positive=True,
                                                  allow_none=True)
    try:
        return Link(**kwargs)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _fit(data: Any, where: str) -> CollectiveFit:
    d = _keys(data, where, _FIT_REQUIRED, (), _FIT_DERIVED)
    try:
        return CollectiveFit(kind=d["kind"], group_size=d["group_size"], level=d["level"], alpha_s=d["alpha_s"],
                             beta_s_per_byte=d["beta_s_per_byte"])
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def parse_cluster_file(data: Any, file_name: str = "", sha256: str = "") -> ClusterFile:
    """A :class:`ClusterFile` from the YAML document ``data`` (already parsed)."""
    top = _keys(data, "cluster file", _TOP_REQUIRED, _TOP_OPTIONAL, _TOP_DERIVED)
    if top["format"] != FORMAT:
        raise ConfigError(f"cluster file: format must be {FORMAT!r}, got {top['format']!r}; write a new one with "
                          "python main.py calibrate")
    links = _keys(top["links"], "links", ("intra_node", "inter_node"))
    net = _keys(top.get("network") or {}, "network", (), _NETWORK_OPTIONAL)
    intra_topology = net.get("intra_topology", "switch")
    if intra_topology not in INTRA_TOPOLOGIES:
        raise ConfigError(f"network.intra_topology must be one of {', '.join(INTRA_TOPOLOGIES)}, got {intra_topology!r}")
    library = net.get("collective_library", "nccl")
    if library not in COLLECTIVE_LIBRARIES:
        raise ConfigError(f"network.collective_library must be one of {', '.join(COLLECTIVE_LIBRARIES)}, got {library!r}")
    matrix = net.get("nvlink_matrix")
    if matrix is not None:
        if not isinstance(matrix, list) or not all(isinstance(r, list) and all(isinstance(x, int) for x in r) for r in matrix):
            raise ConfigError("network.nvlink_matrix must be a list of rows of link counts (integers) or null")
        matrix = tuple(tuple(r) for r in matrix)
    assumptions = top.get("assumptions") or []
    if not isinstance(assumptions, list) or not all(isinstance(a, str) for a in assumptions):
        raise ConfigError("assumptions must be a list of sentences")
    if len(assumptions) > MAX_ASSUMPTIONS or any(len(a) > MAX_ASSUMPTION_CHARS for a in assumptions):
        longest = max(map(len, assumptions), default=0)
        raise ConfigError(f"assumptions: {len(assumptions):,} sentences, the longest {longest:,} characters; keep at most "
                          f"{MAX_ASSUMPTIONS} of at most {MAX_ASSUMPTION_CHARS:,} characters each (they are copied into "
                          "every data.json and page)")
    fits_data = top.get("collective_fits") or []
    if not isinstance(fits_data, list):
        raise ConfigError("collective_fits must be a list of {kind, group_size, level, alpha_s, beta_s_per_byte}")
    fits = tuple(_fit(f, f"collective_fits[{i}]") for i, f in enumerate(fits_data))
    keys = [(f.kind, f.group_size, f.level) for f in fits]
    if len(set(keys)) != len(keys):
        raise ConfigError("collective_fits: two fits for the same kind, group_size and level; keep one")
    calibration = top.get("calibration") or {}
    if not isinstance(calibration, dict):
        raise ConfigError("calibration must be a mapping (the record python main.py calibrate writes)")
    base = top.get("base")
    if base is not None and not isinstance(base, str):
        raise ConfigError(f"base must be a preset name or null, got {base!r}")
    try:
        spec = ClusterFile(
            name=_text(top["name"], "name"), base=base, gpu=_gpu(top["gpu"]),
            gpus_per_node=_integer(top["gpus_per_node"], "gpus_per_node"),  # type: ignore[arg-type]
            topology=_text(top["topology"], "topology"),
            intra_node=_link(links["intra_node"], "links.intra_node"), inter_node=_link(links["inter_node"], "links.inter_node"),
            assumptions=tuple(assumptions), intra_topology=intra_topology, nvlink_matrix=matrix,
            nics_per_node=_integer(net.get("nics_per_node"), "network.nics_per_node", allow_none=True),
            collective_library=library,
            collective_overhead_s=_number(net.get("collective_overhead_s", 0.0), "network.collective_overhead_s"),  # type: ignore[arg-type]
            sources=tuple(sorted(_sources(net.get("sources"), "network.sources").items())),
            collective_fits=fits, calibration=MappingProxyType(calibration), file_name=file_name, sha256=sha256,
            host_model=_text(net.get("host_model", "auto"), "network.host_model"),
        )
        spec.build()  # the cluster's own checks (a link matrix of the wrong size...) fail here, at load time
    except ConfigError as exc:
        raise ConfigError(f"cluster file {file_name or ''}: {exc}".replace("cluster file : ", "cluster file: ")) from None
    return spec


#: The cluster files loaded in this process by sha256: the site's References page finds the
#: calibration record of a cluster (which carries only the file's name and hash) here.
_LOADED: dict[str, ClusterFile] = {}


@functools.lru_cache(maxsize=32)
def _load(path: str, mtime_ns: int, size: int) -> ClusterFile:
    import yaml  # here, not at import: only a cluster file needs the YAML parser (it costs every command ~10 ms to import)

    raw = Path(path).read_bytes()
    name = Path(path).name
    try:
        data = yaml.safe_load(raw.decode("utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cluster file {name!r} is not valid YAML: {str(exc).splitlines()[0]}") from None
    spec = dataclasses.replace(parse_cluster_file(data, name, hashlib.sha256(raw).hexdigest()), folder=str(Path(path).parent))
    _LOADED[spec.sha256] = spec
    return spec


def loaded_cluster_file(sha256: str) -> ClusterFile | None:
    """The cluster file with this sha256 if this process loaded it (:func:`load_cluster_file`), else None."""
    return _LOADED.get(sha256)


def load_cluster_file(path: str | Path) -> ClusterFile:
    """Read and check a cluster file (cached by path and modification time).

    Raises
    ------
    ConfigError
        The file is missing, not YAML, or breaks the schema (module docstring).
    """
    p = Path(path)
    try:
        st = p.stat()
    except OSError:
        raise ConfigError(f"cluster file not found: {str(p)!r}; check the path, or write one with python main.py calibrate") from None
    if not p.is_file():
        raise ConfigError(f"cluster file {str(p)!r} is not a file")
    return _load(str(p.resolve()), st.st_mtime_ns, st.st_size)


# ------------------------------------------------------------------------------------ writing


def _plain(value: Any) -> Any:
    """Mapping proxies, tuples and numpy scalars as plain YAML types."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        return value.item()
    return value


def cluster_file_dict(cluster: Cluster, *, base: str | None, calibration: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The cluster-file document of ``cluster`` (its size left out)."""
    block = cluster.to_dict()
    links = block["links"]
    for link in links.values():  # type: ignore[union-attr]
        link.pop("effective_bytes_per_s", None)
    net = dict(block["network"])  # type: ignore[arg-type]
    doc: dict[str, Any] = {
        "format": FORMAT,
        "name": cluster.name,
        "base": base,
        "gpu": cluster.gpu.to_dict(),
        "gpus_per_node": cluster.gpus_per_node,
        "topology": cluster.topology,
        "links": links,
        "assumptions": list(cluster.assumptions),
        "network": net,
    }
    if cluster.collective_fits:
        doc["collective_fits"] = [{k: v for k, v in f.to_dict().items() if k not in _FIT_DERIVED} for f in cluster.collective_fits]
    if calibration:
        doc["calibration"] = dict(calibration)
    return _plain(doc)


def dump_cluster_file(doc: Mapping[str, Any]) -> str:
    """YAML text of a cluster-file document (keys sorted, ``format`` first; floats written so
    that they read back equal)."""
    import yaml  # as in _load

    head = yaml.safe_dump({"format": doc["format"]}, sort_keys=True, allow_unicode=True, width=100)
    rest = yaml.safe_dump({k: v for k, v in doc.items() if k != "format"}, sort_keys=True, allow_unicode=True,
                          default_flow_style=False, width=100)
    return head + rest


register_cluster_file_loader(load_cluster_file)  # get_cluster reads cluster files through it
