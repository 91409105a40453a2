"""Clusters: nodes of GPUs, the two link classes between them, and the (d, p, t) -> rank mapping.

A :class:`Cluster` is ``num_gpus`` GPUs of one :class:`~dml2comm.hardware.gpus.GPU` model packed
``gpus_per_node`` to a node.  Two :class:`Link` classes connect them: ``intra_node`` (NVLink /
NVSwitch, a DGX-1 NVLink cube-mesh, or PCIe) between GPUs of one node, and ``inter_node`` (the
InfiniBand NICs) between nodes; the inter-node network is taken as non-blocking, a fat tree as in
Narayanan et al. 2021, Sec. 5.  :func:`dml2comm.network.model.collective_cost_for_group` costs a
group on the links it really uses (GPUs per node, nodes, which NVLinks, how many NIC shares);
:meth:`Cluster.link_for_group` is the older one-link answer (the slowest link class a group
crosses), kept for the single-link :func:`~dml2comm.network.collectives.collective_cost`.

Link conventions
----------------
- ``bandwidth_bytes_per_s`` is the *line rate per direction available to one GPU*: the sum over
  the GPU's ``links_per_gpu`` NVLinks for the intra-node link; for the NIC link, the node's NIC
  line rate divided among its GPUs (DGX A100: 8 x 200 Gb/s NICs for 8 GPUs -> 25 GB/s per GPU;
  DGX-1: 4 x 100 Gb/s for 8 GPUs -> 6.25 GB/s per GPU).  That share is what each GPU gets when all
  GPUs of a node talk across nodes at once, as data-parallel groups do; a group with k GPUs on a
  node uses k shares (NCCL runs one ring per NIC).
- ``efficiency`` = achieved / line rate of the transfer: NIC 24 of 25 (HDR), 46-48 of 50 (NDR)
  from NCCL maintainers; PCIe Gen4 24 of 32 from NCCL's model; NVLink see below.  Time models use
  ``bandwidth_bytes_per_s * efficiency`` (:attr:`Link.effective_bytes_per_s`).
- ``latency_s`` is the per-message (per ring step) latency alpha of the alpha-beta model with the
  Simple protocol: NCCL ``src/graph/tuning.cc`` ``hwLat[hw][Ring][Simple]`` -- 3.4 us over NVLink,
  5.7 us over PCIe, 14.0 us over the network.  ``hw`` names the class so that the NCCL model
  (:mod:`dml2comm.network.nccl`) can look up its LL/LL128 latencies and its base latency.

Calibration (NVLink)
--------------------
Measured A100 all-reduce bus bandwidth grows with the group: 197, 222 and 229 GB/s at n = 2, 4 and
8 for 1 GiB (shared/data/nccl_allreduce_measured.csv).  One efficiency cannot give that; a
per-byte kernel term can: ``t/S = 2((n-1)/n) beta + delta`` (the kernel reading the input and
writing the output, not overlapped with the transfer).  A free fit to the three rows gives the
line rate (efficiency 0.996) and delta = 1.63 ps/B; the presets keep the line rate and take delta
from the maintainers' 8-GPU figure alone (A100: 230 of 300 GB/s -> 1.775 ps/B; H100: 370 of 450 ->
0.841 ps/B), which predicts the n = 2 and n = 4 rows within 2 %.  V100 (DGX-1): every pair of GPUs
has 0, 1 or 2 NVLinks (:data:`DGX1_V100_NVLINK_MATRIX`); efficiency 0.90 fits both measured V100
rows, the pair with one link (22.6 GB/s) and the ring over six (134.5 GB/s).  NVLink SHARP (H100):
``in_network_efficiency`` gives the maintainers' 480 GB/s.  :data:`NCCL_CALL_OVERHEAD_S` is the one
number fitted to a single measured row.  Per-row errors: dml2comm/network/nccl.py.

Rank mapping
------------
:class:`RankMap` places coordinates (d, p, t) on global ranks.  The default order ``"tdp"`` is
Megatron-LM's: tensor fastest, then data, then pipeline, ``rank = t + tp * (d + dp * p)``, so a
tensor group is contiguous and stays inside a node when t <= GPUs per node.

References
----------
Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM", SC'21 (arXiv:2104.04473), Sec. 5 (8 x A100 per node, NVSwitch, 8 x 200 Gb/s HDR).
NVIDIA nccl-tests issues #119, #149, #212, #267, #290 (expected bus bandwidths, maintainers).
NVIDIA NCCL 2.20.3 src/graph/tuning.cc (hwLat) and src/graph/topo.h / topo.cc (SM70_NVLINK_BW,
kvDictPciGen).  NVIDIA DGX-1 with Tesla V100 system-architecture whitepaper.  vTrain (MICRO 2024)
measured NCCL lookup tables (shared/data/nccl_allreduce_measured.csv).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Iterator, Mapping, Protocol, Sequence

from dml2comm.choices import Choice
from dml2comm.errors import ConfigError
from dml2comm.hardware.gpus import GPU, get_gpu



class MeasuredScale(Protocol):
    """What a cluster carries from a profiled step: :class:`dml2comm.cost.profile.ProfileScale`
    (the cost layer's type; the hardware layer only stores it, compares and hashes it)."""

    host: Any

    def factor(self, kind: str) -> tuple[float, float]: ...

    def to_dict(self) -> dict[str, Any]: ...

__all__ = [
    "COLLECTIVE_KIND_NAMES",
    "COLLECTIVE_LEVELS",
    "CollectiveFit",
    "check_gpu_matches_cluster",
    "plan_cluster",
    "default_preset_name",
    "is_cluster_file",
    "COLLECTIVE_LIBRARIES",
    "CollectiveLibrary",
    "IntraTopology",
    "DGX1_V100_NVLINK_MATRIX",
    "INTRA_TOPOLOGIES",
    "LINK_HW_CLASSES",
    "NCCL_CALL_OVERHEAD_S",
    "Link",
    "Cluster",
    "ClusterPreset",
    "CLUSTERS",
    "get_cluster",
    "cluster_names",
    "make_cluster",
    "RankMap",
    "NVLINK3_NVSWITCH_A100",
    "NVLINK4_NVSWITCH_H100",
    "NVLINK2_CUBE_MESH_V100",
    "PCIE_GEN4_X16",
    "IB_EDR_100G",
    "IB_HDR_200G",
    "IB_NDR_400G",
]

_GB = 1e9  # bytes per GB, for messages


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# --------------------------------------------------------------------------------------------
# Links
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Link:
    """One class of link as seen by one GPU.

    Parameters
    ----------
    name
        Human-readable name, shown in outputs (e.g. ``"NVLink3 x12 + NVSwitch (A100)"``).
    bandwidth_bytes_per_s
        Line rate per direction available to one GPU (bytes/s), summed over ``links_per_gpu``.
    latency_s
        Per-message latency alpha (seconds), see the module docstring.
    efficiency
        Achieved / line rate, in (0, 1]; time models use ``bandwidth_bytes_per_s * efficiency``.
    sources
        Field name -> where the number comes from (``"bandwidth_bytes_per_s"``, ``"latency_s"``,
        ``"efficiency"``, and any non-default field below).
    kernel_s_per_byte
        delta: seconds per byte of the collective's buffer that the GPU kernel spends outside the
        link transfer (reading the input, writing the output), added once per byte of the buffer
        whatever the group size; 0 by default.  See "Calibration" in the module docstring.
    hw
        Hardware class for NCCL's latency tables: ``"nvlink"``, ``"pcie"``, ``"net"``, or ``""``
        (a generic link: the textbook model with ``latency_s`` only).
    links_per_gpu
        How many physical links ``bandwidth_bytes_per_s`` sums (12 NVLink3 links on A100; 1 NIC).
    in_network_efficiency
        Achieved / line rate of in-network reduction through the switch this link reaches (NVLink
        SHARP); ``None`` when the switch cannot reduce.
    reduce_s_per_byte
        rho: seconds per byte of the reduced block a rank writes to its output (S/n of a
        ReduceScatter, and of the reduce-scatter half of an AllReduce that the GPUs reduce;
        :func:`dml2comm.network.collectives.reduced_block_bytes`); 0 by default (fitted on H100,
        :mod:`dml2comm.network.nccl` "Calibration").
    alltoall_latency_s
        Fixed time an AllToAll (NCCL: grouped point-to-point sends and receives) adds on this link
        beyond the Simple protocol's latency; 0 by default (fitted on H100).

    Raises
    ------
    ConfigError
        Non-positive bandwidth, negative latency or delta, efficiency outside (0, 1], an unknown
        ``hw`` class or a non-positive link count.
    """

    name: str
    bandwidth_bytes_per_s: float
    latency_s: float
    efficiency: float = 1.0
    sources: Mapping[str, str] = field(default_factory=dict)
    kernel_s_per_byte: float = 0.0
    hw: str = ""
    links_per_gpu: int = 1
    in_network_efficiency: float | None = None
    reduce_s_per_byte: float = 0.0
    alltoall_latency_s: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.bandwidth_bytes_per_s) and self.bandwidth_bytes_per_s > 0):
            raise ConfigError(f"link {self.name!r}: bandwidth_bytes_per_s must be positive, got {self.bandwidth_bytes_per_s!r}")
        if not (math.isfinite(self.latency_s) and self.latency_s >= 0):
            raise ConfigError(f"link {self.name!r}: latency_s must be >= 0, got {self.latency_s!r}")
        if not (math.isfinite(self.efficiency) and 0 < self.efficiency <= 1):
            raise ConfigError(f"link {self.name!r}: efficiency must be in (0, 1], got {self.efficiency!r}")
        if not (math.isfinite(self.kernel_s_per_byte) and self.kernel_s_per_byte >= 0):
            raise ConfigError(f"link {self.name!r}: kernel_s_per_byte must be >= 0, got {self.kernel_s_per_byte!r}")
        if self.hw not in LINK_HW_CLASSES:
            raise ConfigError(f"link {self.name!r}: hw must be one of {', '.join(repr(h) for h in LINK_HW_CLASSES)}, got {self.hw!r}")
        if not _is_int(self.links_per_gpu) or self.links_per_gpu < 1:
            raise ConfigError(f"link {self.name!r}: links_per_gpu must be a positive integer, got {self.links_per_gpu!r}")
        eff = self.in_network_efficiency
        if eff is not None and not (math.isfinite(eff) and 0 < eff <= 1):
            raise ConfigError(f"link {self.name!r}: in_network_efficiency must be in (0, 1] or None, got {eff!r}")
        for name in ("reduce_s_per_byte", "alltoall_latency_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ConfigError(f"link {self.name!r}: {name} must be >= 0, got {value!r}")
        object.__setattr__(self, "sources", MappingProxyType(dict(self.sources)))

    def _key(self) -> tuple[object, ...]:
        return (
            self.name,
            self.bandwidth_bytes_per_s,
            self.latency_s,
            self.efficiency,
            tuple(sorted(self.sources.items())),
            self.kernel_s_per_byte,
            self.hw,
            self.links_per_gpu,
            self.in_network_efficiency,
            self.reduce_s_per_byte,
            self.alltoall_latency_s,
        )

    def __hash__(self) -> int:
        return hash(self._key())

    def __reduce__(self) -> tuple[object, ...]:
        # mappingproxy does not pickle; rebuild from a plain dict (copy, deepcopy, multiprocessing).
        return (
            type(self),
            (
                self.name,
                self.bandwidth_bytes_per_s,
                self.latency_s,
                self.efficiency,
                dict(self.sources),
                self.kernel_s_per_byte,
                self.hw,
                self.links_per_gpu,
                self.in_network_efficiency,
                self.reduce_s_per_byte,
                self.alltoall_latency_s,
            ),
        )

    @property
    def effective_bytes_per_s(self) -> float:
        """Achievable bandwidth per direction: line rate x efficiency (bytes/s)."""
        return self.bandwidth_bytes_per_s * self.efficiency

    @property
    def beta_s_per_byte(self) -> float:
        """Seconds per byte of the alpha-beta model: 1 / (line rate x efficiency)."""
        return 1.0 / self.effective_bytes_per_s

    @property
    def per_link_bytes_per_s(self) -> float:
        """Line rate of one physical link: ``bandwidth_bytes_per_s / links_per_gpu``."""
        return self.bandwidth_bytes_per_s / self.links_per_gpu

    def expected_allreduce_busbw(self, n: int) -> float:
        """Large-message ring AllReduce bus bandwidth over ``n`` ranks on this link (bytes/s).

        ``busbw = f / (f beta + delta)`` with ``f = 2(n-1)/n`` (nccl-tests factor): the line rate x
        efficiency when delta is 0, less when the kernel term matters.  Latency is ignored.
        """
        if n < 2:
            return 0.0
        f = 2 * (n - 1) / n
        return f / (f * self.beta_s_per_byte + self.kernel_s_per_byte)

    def scaled(self, factor: float, name: str | None = None) -> "Link":
        """The same link class with ``factor`` x the bandwidth (e.g. k parallel NIC shares)."""
        return Link(
            name=self.name if name is None else name,
            bandwidth_bytes_per_s=self.bandwidth_bytes_per_s * factor,
            latency_s=self.latency_s,
            efficiency=self.efficiency,
            sources=self.sources,
            kernel_s_per_byte=self.kernel_s_per_byte,
            hw=self.hw,
            links_per_gpu=self.links_per_gpu,
            in_network_efficiency=self.in_network_efficiency,
        )

    def unsourced_fields(self) -> tuple[str, ...]:
        """Numbers without a non-empty entry in :attr:`sources` (empty for every preset link).

        ``kernel_s_per_byte``, ``in_network_efficiency``, ``reduce_s_per_byte`` and
        ``alltoall_latency_s`` need a source only when set.
        """
        wanted = ["bandwidth_bytes_per_s", "latency_s", "efficiency"]
        for name in ("kernel_s_per_byte", "reduce_s_per_byte", "alltoall_latency_s"):
            if getattr(self, name):
                wanted.append(name)
        if self.in_network_efficiency is not None:
            wanted.append("in_network_efficiency")
        return tuple(f for f in wanted if not str(self.sources.get(f, "")).strip())

    def to_dict(self) -> dict[str, object]:
        """Plain-data view for data.json ``cluster.links``."""
        return {
            "name": self.name,
            "bandwidth_bytes_per_s": self.bandwidth_bytes_per_s,
            "efficiency": self.efficiency,
            "effective_bytes_per_s": self.effective_bytes_per_s,
            "latency_s": self.latency_s,
            "kernel_s_per_byte": self.kernel_s_per_byte,
            "hw": self.hw,
            "links_per_gpu": self.links_per_gpu,
            "in_network_efficiency": self.in_network_efficiency,
            "reduce_s_per_byte": self.reduce_s_per_byte,
            "alltoall_latency_s": self.alltoall_latency_s,
            "sources": dict(self.sources),
        }


class IntraTopology(Choice):
    """How GPUs of a node are joined (:attr:`Cluster.intra_topology`); :data:`INTRA_TOPOLOGIES`
    spells the values out (for the site's reference page; tests/test_closed_sets.py checks they agree)."""

    SWITCH = "switch"
    HYBRID_CUBE_MESH = "hybrid-cube-mesh"


class CollectiveLibrary(Choice):
    """How collectives are costed (:attr:`Cluster.collective_library`); :data:`COLLECTIVE_LIBRARIES`
    spells the values out (for the site's reference page; tests/test_closed_sets.py checks they agree)."""

    TEXTBOOK = "textbook"
    NCCL = "nccl"


#: Hardware classes of :attr:`Link.hw` ("" = generic, textbook alpha-beta only).
LINK_HW_CLASSES: tuple[str, ...] = ("", "nvlink", "pcie", "net")
#: Values of :attr:`Cluster.intra_topology`.
INTRA_TOPOLOGIES: tuple[str, ...] = ("switch", "hybrid-cube-mesh")
#: Values of :attr:`Cluster.collective_library`.
COLLECTIVE_LIBRARIES: tuple[str, ...] = ("textbook", "nccl")


def _kernel_delta(busbw_bytes_per_s: float, line_bytes_per_s: float, n: int = 8) -> float:
    """delta such that an n-rank ring AllReduce at line rate reaches ``busbw``: f (1/busbw - 1/line)."""
    f = 2 * (n - 1) / n
    return f * (1.0 / busbw_bytes_per_s - 1.0 / line_bytes_per_s)


_LAT_NVLINK = (
    "NCCL 2.20.3 src/graph/tuning.cc hwLat[NCCL_HW_NVLINK][Ring][Simple] = 3.4 µs per ring step "
    "(baseLat 8.4 µs not included)"
)
_LAT_PCI = "NCCL 2.20.3 src/graph/tuning.cc hwLat[NCCL_HW_PCI][Ring][Simple] = 5.7 µs per ring step (baseLat 8.4 µs not included)"
_LAT_NET = (
    "NCCL 2.20.3 src/graph/tuning.cc hwLat[NCCL_HW_NET][Ring][Simple] = 14.0 µs per ring step "
    "(9.6 µs in NCCL 2.7; baseLat 8.4 µs not included)"
)

_DELTA_A100 = _kernel_delta(230e9, 300e9)  # 1.775 ps/B
_DELTA_H100 = _kernel_delta(370e9, 450e9)  # 0.841 ps/B
# H100 constants fitted on the groups of 2 and 8 of the bundled OpenXLA table (all sizes; the
# groups of 4 held out): benchmarks/fit_h100_collectives.py, dml2comm/network/nccl.py "Calibration".
_H100_FIT = "benchmarks/fit_h100_collectives.py on dml2comm/validate/data/xla_collectives_h100.csv"
_NVLS_EFFICIENCY_H100 = 0.57
_REDUCE_H100_S_PER_BYTE = 1.85e-12
_ALLTOALL_LATENCY_H100_S = 22e-6

_CSV = "shared/data/nccl_allreduce_measured.csv"

#: A100 SXM4: 12 NVLink3 links through NVSwitch (DGX/HGX A100).
NVLINK3_NVSWITCH_A100 = Link(
    name="NVLink3 x12 + NVSwitch (A100)",
    bandwidth_bytes_per_s=300e9,
    latency_s=3.4e-6,
    efficiency=1.0,
    kernel_s_per_byte=_DELTA_A100,
    hw="nvlink",
    links_per_gpu=12,
    sources={
        "bandwidth_bytes_per_s": "12 NVLink3 links x 25 GB/s per direction = 300 GB/s (sjeaugey, NVIDIA/nccl-tests#149)",
        "latency_s": _LAT_NVLINK,
        "efficiency": (
            "1.0: the transfer runs at the line rate and the gap to the achieved busbw is the kernel term delta. "
            f"A least-squares fit of t/S = f/(e x 300 GB/s) + delta to the three 1 GiB A100 rows of {_CSV} "
            "(n = 2, 4, 8; f = 2(n-1)/n) gives e = 0.996 and delta = 1.63 ps/B"
        ),
        "kernel_s_per_byte": (
            "1.775 ps/B = 1.75 x (1/230 - 1/300) ns/kB: makes the 8-GPU ring all-reduce busbw the maintainers' "
            "expected 230 GB/s (sjeaugey, NVIDIA/nccl-tests#149) at line rate; the same delta predicts the measured "
            f"1 GiB busbw at n = 2 (196 vs 197 GB/s) and n = 4 (221 vs 222) of {_CSV}. NCCL's own model caps "
            "Ampere busBw at 235 GB/s (tuning.cc, NCCL 2.8: 'if (compCap80) busBw = std::min(busBw, 235.0f)')"
        ),
    },
)

#: H100/H200 SXM: 18 NVLink4 links through NVSwitch (DGX/HGX H100, HGX H200), NVLink SHARP.
NVLINK4_NVSWITCH_H100 = Link(
    name="NVLink4 x18 + NVSwitch (H100/H200)",
    bandwidth_bytes_per_s=450e9,
    latency_s=3.4e-6,
    efficiency=1.0,
    kernel_s_per_byte=_DELTA_H100,
    hw="nvlink",
    links_per_gpu=18,
    in_network_efficiency=_NVLS_EFFICIENCY_H100,
    reduce_s_per_byte=_REDUCE_H100_S_PER_BYTE,
    alltoall_latency_s=_ALLTOALL_LATENCY_H100_S,
    sources={
        "bandwidth_bytes_per_s": "'450GB/s is the line rate' per direction (sjeaugey, NVIDIA/nccl-tests#212); 900 GB/s bidirectional",
        "latency_s": _LAT_NVLINK,
        "efficiency": (
            "1.0 by analogy with the A100 fit (the transfer at line rate, the gap in delta); no measured H100 rows"
        ),
        "kernel_s_per_byte": (
            "0.841 ps/B = 1.75 x (1/370 - 1/450) ns/kB: makes the 8-GPU ring busbw the expected 370 GB/s ('With the "
            "protocol overhead (~20%) NCCL can get an effective NVLink bandwidth of 370GB/s', sjeaugey, "
            "NVIDIA/nccl-tests#212; also 18 x SM90_NVLINK_BW 20.6 in NCCL src/graph/topo.h)"
        ),
        "in_network_efficiency": (
            f"0.57, fitted ({_H100_FIT}; groups of 2 and 8, groups of 4 held out): the measured f32 NVLS all-reduce "
            "reaches 402 GB/s busbw at 8 GPUs and 2 GiB, not the 480 GB/s the NCCL maintainers quote (which gave 0.792, "
            "20% too fast); t = 2 x 12.5 us + S/(0.57 x 450 GB/s) + delta S"
        ),
        "reduce_s_per_byte": (
            f"1.85 ps/B per byte of the reduced block S/n, fitted ({_H100_FIT}): reduce-scatter runs 1.2-1.4 ps per "
            "byte of S/n slower than all-gather on the same bytes for n = 2, 4 and 8"
        ),
        "alltoall_latency_s": (
            f"22 us, fitted ({_H100_FIT}): NCCL's all-to-all is grouped point-to-point sends, which its tuner does "
            "not model; the measured large-message all-to-all carries 70-110 us of fixed time"
        ),
    },
)

#: V100 SXM2 in a DGX-1 hybrid cube-mesh: six NVLink2 links per GPU, 1 or 2 to each of four peers.
NVLINK2_CUBE_MESH_V100 = Link(
    name="NVLink2 x6 hybrid cube-mesh (V100)",
    bandwidth_bytes_per_s=150e9,
    latency_s=3.4e-6,
    efficiency=0.90,
    hw="nvlink",
    links_per_gpu=6,
    sources={
        "bandwidth_bytes_per_s": (
            "six NVLinks x 25 GB/s per direction; the hybrid cube-mesh is 'three interwoven rings of single NVLink "
            "connections', so an 8-GPU ring in both directions uses all six (NVIDIA DGX-1 with V100 whitepaper). "
            "Subsets of the GPUs see fewer links: Cluster.nvlink_matrix gives the links between each pair"
        ),
        "latency_s": _LAT_NVLINK,
        "efficiency": (
            f"0.90, fitted to the two 1 GiB V100 rows of {_CSV}: n = 2 over the single NVLink between GPU 0 and 1 "
            "reaches 22.55 of 25 GB/s (0.902), n = 8 over six links 134.5 of 150 GB/s (0.897); a fit with a kernel "
            "term gives delta = 0.1 ps/B, so delta = 0. (NCCL's own Volta model is 20 of 25 GB/s, SM70_NVLINK_BW, "
            "src/graph/topo.h)"
        ),
    },
)

#: PCIe Gen4 x16 between GPUs of a PCIe box (no NVSwitch).
PCIE_GEN4_X16 = Link(
    name="PCIe Gen4 x16",
    bandwidth_bytes_per_s=32e9,
    latency_s=5.7e-6,
    efficiency=24.0 / 32.0,
    hw="pcie",
    sources={
        "bandwidth_bytes_per_s": "16 GT/s x 16 lanes / 8 = 32 GB/s per direction (PCIe 4.0 x16 line rate, before 128b/130b)",
        "latency_s": _LAT_PCI,
        "efficiency": (
            "NCCL models Gen4 as 120 x 100 Mb/s per lane (kvDictPciGen, src/graph/topo.cc), 'for PCIe 4.0*16, the "
            "bandwidth is 24(GBps)' (NVIDIA/nccl#1206, sjeaugey: the line rate 'doesn't account for the protocol'): 24/32. "
            "An upper bound: 8-GPU PCIe boxes are often limited by the CPU root complex (sjeaugey, NVIDIA/nccl#1639)"
        ),
    },
)

#: One 100 Gb/s EDR InfiniBand NIC.
IB_EDR_100G = Link(
    name="InfiniBand EDR 100 Gb/s",
    bandwidth_bytes_per_s=12.5e9,
    latency_s=14.0e-6,
    efficiency=12.0 / 12.5,
    hw="net",
    sources={
        "bandwidth_bytes_per_s": "100 Gb/s / 8 = 12.5 GB/s per direction",
        "latency_s": _LAT_NET,
        "efficiency": "'We usually consider 24GB/s is the peak performance per 200G NIC (12 GB/s for 100G NICs)' (sjeaugey, NVIDIA/nccl-tests#119)",
    },
)

#: One 200 Gb/s HDR InfiniBand NIC (DGX A100 has one per GPU).
IB_HDR_200G = Link(
    name="InfiniBand HDR 200 Gb/s",
    bandwidth_bytes_per_s=25e9,
    latency_s=14.0e-6,
    efficiency=24.0 / 25.0,
    hw="net",
    sources={
        "bandwidth_bytes_per_s": "200 Gb/s / 8 = 25 GB/s per direction",
        "latency_s": _LAT_NET,
        "efficiency": "'We usually consider 24GB/s is the peak performance per 200G NIC' (sjeaugey, NVIDIA/nccl-tests#119; also NVIDIA/nccl#412)",
    },
)

#: One 400 Gb/s NDR InfiniBand NIC (ConnectX-7; DGX H100 has one per GPU).
IB_NDR_400G = Link(
    name="InfiniBand NDR 400 Gb/s",
    bandwidth_bytes_per_s=50e9,
    latency_s=14.0e-6,
    efficiency=47.0 / 50.0,
    hw="net",
    sources={
        "bandwidth_bytes_per_s": "400 Gb/s / 8 = 50 GB/s per direction",
        "latency_s": _LAT_NET,
        "efficiency": (
            "46-48 GB/s achievable per NDR NIC (AddyLaddy, NVIDIA/nccl-tests#290; 'should achieve up to 48-49GB/s per NIC', "
            "NVIDIA/nccl-tests#267): midpoint 47 of 50"
        ),
    },
)


def _per_gpu_nic_share(nic: Link, nics_per_node: int, gpus_per_node: int) -> Link:
    """The NIC bandwidth one GPU gets when all ``gpus_per_node`` GPUs talk across nodes at once."""
    used = min(nics_per_node, gpus_per_node)
    share = nic.bandwidth_bytes_per_s * used / gpus_per_node
    sources = dict(nic.sources)
    sources["bandwidth_bytes_per_s"] = (
        f"{nics_per_node} NIC(s) per node shared by {gpus_per_node} GPU(s): {used} x "
        f"{nic.bandwidth_bytes_per_s / _GB:g} GB/s / {gpus_per_node} = {share / _GB:g} GB/s per GPU; per NIC: "
        + nic.sources.get("bandwidth_bytes_per_s", "")
    )
    return Link(
        name=f"{nic.name} ({nics_per_node} per node, {gpus_per_node} GPUs)",
        bandwidth_bytes_per_s=share,
        latency_s=nic.latency_s,
        efficiency=nic.efficiency,
        sources=sources,
        kernel_s_per_byte=nic.kernel_s_per_byte,
        hw=nic.hw,
        links_per_gpu=nic.links_per_gpu,
        in_network_efficiency=nic.in_network_efficiency,
    )


# --------------------------------------------------------------------------------------------
# Calibrated collectives
# --------------------------------------------------------------------------------------------

#: Collective kinds a :class:`CollectiveFit` may name (the values of
#: :class:`dml2comm.network.kinds.CollectiveKind`, spelled as in NCCL; hardware sits below network).
COLLECTIVE_KIND_NAMES: tuple[str, ...] = ("ALL_REDUCE", "ALL_GATHER", "REDUCE_SCATTER", "BROADCAST", "REDUCE", "ALL_TO_ALL",
                                          "SEND_RECV")
#: Where a fitted group runs: every rank on one node, or across nodes.
COLLECTIVE_LEVELS: tuple[str, ...] = ("intra_node", "inter_node")


@dataclass(frozen=True, slots=True)
class CollectiveFit:
    """A collective's time measured on the user's cluster (``python main.py calibrate``):
    ``t = alpha_s + beta_s_per_byte x S`` for ``kind`` over ``group_size`` ranks on ``level``,
    S in the nccl-tests convention (:mod:`dml2comm.network.collectives`).  The network model
    (:func:`dml2comm.network.model.collective_cost_for_group`) uses it instead of its link
    constants for that kind and level; other group sizes keep the fitted bus bandwidth (nccl-tests
    doc/PERFORMANCE.md: busbw is meant to be independent of the rank count).

    Raises
    ------
    ConfigError
        Unknown kind or level, a group size below 2, a negative alpha or a non-positive beta.
    """

    kind: str
    group_size: int
    level: str
    alpha_s: float
    beta_s_per_byte: float

    def __post_init__(self) -> None:
        if self.kind not in COLLECTIVE_KIND_NAMES:
            raise ConfigError(f"collective fit: kind {self.kind!r} is not one of {', '.join(COLLECTIVE_KIND_NAMES)}")
        if self.level not in COLLECTIVE_LEVELS:
            raise ConfigError(f"collective fit: level {self.level!r} is not one of {', '.join(COLLECTIVE_LEVELS)}")
        if not _is_int(self.group_size) or self.group_size < 2:
            raise ConfigError(f"collective fit: group_size must be an integer >= 2, got {self.group_size!r}")
        for label, value, low_ok in (("alpha_s", self.alpha_s, True), ("beta_s_per_byte", self.beta_s_per_byte, False)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or value < 0 or (value == 0 and not low_ok):
                raise ConfigError(f"collective fit {self.kind} n={self.group_size}: {label} must be a "
                                  f"{'non-negative' if low_ok else 'positive'} number, got {value!r}")

    def to_dict(self) -> dict[str, object]:
        return {"kind": self.kind, "group_size": self.group_size, "level": self.level, "alpha_s": self.alpha_s,
                "beta_s_per_byte": self.beta_s_per_byte, "busbw_bytes_per_s": self.busbw_bytes_per_s}

    @property
    def busbw_bytes_per_s(self) -> float:
        """The fitted bus bandwidth: ``factor / beta`` (nccl-tests factor of ``kind`` and ``group_size``)."""
        n = self.group_size
        factor = 2 * (n - 1) / n if self.kind == "ALL_REDUCE" else (n - 1) / n if self.kind in (
            "REDUCE_SCATTER", "ALL_GATHER", "ALL_TO_ALL") else 1.0
        return factor / self.beta_s_per_byte


# --------------------------------------------------------------------------------------------
# Cluster
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Cluster:
    """``num_gpus`` GPUs, ``gpus_per_node`` to a node, two link classes.

    Parameters
    ----------
    gpu
        The GPU model (all GPUs are the same).
    num_gpus
        Total GPUs (>= 1).  The last node may be partly filled.
    gpus_per_node
        GPUs per node (>= 1); ranks ``[k * gpus_per_node, (k + 1) * gpus_per_node)`` are node ``k``.
    intra_node, inter_node
        Links between GPUs of one node, and between nodes (per-GPU share of the NICs).
    topology
        ``"<intra-node>/<inter-node>"`` identifier, e.g. ``"nvswitch/fat-tree"``.
    name
        Display name.
    assumptions
        What the preset assumed rather than sourced, in words; the analysis copies these into
        data.json ``warnings``.
    intra_topology
        How GPUs of a node are joined: ``"switch"`` (NVSwitch or a PCIe switch: every pair one
        hop at the full per-GPU bandwidth) or ``"hybrid-cube-mesh"`` (DGX-1: point-to-point
        NVLinks given by :attr:`nvlink_matrix`).
    nvlink_matrix
        For ``"hybrid-cube-mesh"``: links between local GPUs i and j (symmetric, 0 on the
        diagonal), ``gpus_per_node`` square; one link = ``intra_node.per_link_bytes_per_s``.
    nics_per_node
        NICs of a node (informational; ``inter_node`` already holds the per-GPU share).
    collective_library
        ``"nccl"``: cost collectives as NCCL runs them (protocols LL/LL128/Simple, its base
        latencies and algorithms, see :mod:`dml2comm.network.nccl`); ``"textbook"``: the plain
        alpha-beta formulas with ``latency_s`` as alpha.
    collective_overhead_s
        Fixed time added to every collective call (launch and measurement overhead), seconds.
    sources
        ``(field, source)`` pairs for the numbers above that are not links.
    collective_fits
        Collectives measured on this cluster (:class:`CollectiveFit`, from a calibration file);
        empty for the presets.
    source_file
        ``(file name, sha256)`` of the cluster file it was loaded from (``--cluster FILE``), else None.
    host_model
        The framework's host-side (CPU) model by name (:data:`dml2comm.cost.host.HOST_MODELS`):
        ``"auto"`` (the default: the one the run's training stack runs,
        :data:`dml2comm.cost.host.STACK_HOST_MODEL`), ``"eager"`` (Megatron-DeepSpeed's dispatch
        per kernel), ``"pytorch"`` (eager PyTorch 2.x, the CPU running ahead) or ``"none"``
        (kernel time only: CUDA-graph captured steps).  Software, like ``collective_library``:
        the same GPUs run either.
    profile_scale
        Measured / modelled kernel-time ratios per layer kind from a profiled step of the model
        (``--profile``: :class:`dml2comm.cost.profile.ProfileScale`), None: the cost model alone.
        Part of the cluster's equality and hash, so every table built for one cluster reads it.

    Raises
    ------
    ConfigError
        Non-positive sizes, an unknown intra-node topology or library, or a bad link matrix.
    """

    gpu: GPU
    num_gpus: int
    gpus_per_node: int
    intra_node: Link
    inter_node: Link
    topology: str
    name: str
    assumptions: tuple[str, ...] = ()
    intra_topology: IntraTopology = IntraTopology.SWITCH
    nvlink_matrix: tuple[tuple[int, ...], ...] | None = None
    nics_per_node: int | None = None
    collective_library: CollectiveLibrary = CollectiveLibrary.TEXTBOOK
    collective_overhead_s: float = 0.0
    sources: tuple[tuple[str, str], ...] = ()
    collective_fits: tuple[CollectiveFit, ...] = ()
    source_file: tuple[str, str] | None = None
    host_model: str = "auto"
    profile_scale: MeasuredScale | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.host_model, str) or not self.host_model:
            raise ConfigError(f"cluster {self.name!r}: host_model must be a host model's name (auto, eager, pytorch, none), got {self.host_model!r}")
        object.__setattr__(self, "collective_fits", tuple(self.collective_fits))
        for label, value in (("num_gpus", self.num_gpus), ("gpus_per_node", self.gpus_per_node)):
            if not _is_int(value) or value < 1:
                raise ConfigError(f"cluster {self.name!r}: {label} must be a positive integer, got {value!r}")
        object.__setattr__(self, "assumptions", tuple(self.assumptions))
        object.__setattr__(self, "sources", tuple((str(k), str(v)) for k, v in self.sources))
        if self.intra_topology not in INTRA_TOPOLOGIES:
            raise ConfigError(
                f"cluster {self.name!r}: intra_topology must be one of {', '.join(INTRA_TOPOLOGIES)}, got {self.intra_topology!r}"
            )
        if self.collective_library not in COLLECTIVE_LIBRARIES:
            raise ConfigError(
                f"cluster {self.name!r}: collective_library must be one of {', '.join(COLLECTIVE_LIBRARIES)}, "
                f"got {self.collective_library!r}"
            )
        object.__setattr__(self, "intra_topology", IntraTopology.of(self.intra_topology))
        object.__setattr__(self, "collective_library", CollectiveLibrary.of(self.collective_library))
        if not (math.isfinite(self.collective_overhead_s) and self.collective_overhead_s >= 0):
            raise ConfigError(f"cluster {self.name!r}: collective_overhead_s must be >= 0, got {self.collective_overhead_s!r}")
        if self.nics_per_node is not None and (not _is_int(self.nics_per_node) or self.nics_per_node < 1):
            raise ConfigError(f"cluster {self.name!r}: nics_per_node must be a positive integer, got {self.nics_per_node!r}")
        if self.intra_topology is IntraTopology.HYBRID_CUBE_MESH:
            matrix = self.nvlink_matrix
            k = self.gpus_per_node
            if matrix is None:
                raise ConfigError(f"cluster {self.name!r}: a hybrid-cube-mesh needs nvlink_matrix ({k} x {k} link counts)")
            rows = tuple(tuple(int(x) for x in row) for row in matrix)
            ok = len(rows) == k and all(len(r) == k for r in rows)
            ok = ok and all(rows[i][j] == rows[j][i] >= 0 for i in range(k) for j in range(k)) and all(rows[i][i] == 0 for i in range(k))
            if not ok:
                raise ConfigError(
                    f"cluster {self.name!r}: nvlink_matrix must be a symmetric {k} x {k} matrix of link counts >= 0 "
                    "with zeros on the diagonal"
                )
            object.__setattr__(self, "nvlink_matrix", rows)

    @property
    def num_nodes(self) -> int:
        """Nodes used (the last one may be partly filled)."""
        return -(-self.num_gpus // self.gpus_per_node)

    def node_of(self, rank: int) -> int:
        """Index of the node holding global ``rank``.

        Raises
        ------
        ConfigError
            ``rank`` outside ``[0, num_gpus)``.
        """
        if not _is_int(rank) or not 0 <= rank < self.num_gpus:
            raise ConfigError(f"rank {rank!r} is outside the cluster's {self.num_gpus} GPUs (0..{self.num_gpus - 1})")
        return rank // self.gpus_per_node

    def link_for_group(self, ranks: Sequence[int]) -> Link:
        """The slowest link class a communication group crosses (the one-link view).

        For costs use :func:`dml2comm.network.model.collective_cost_for_group`, which also sees
        how many GPUs per node the group has (and so how many NIC shares), which NVLinks a
        cube-mesh subgroup has, and NCCL's protocols.

        Parameters
        ----------
        ranks
            Global ranks of the group (any order).

        Returns
        -------
        Link
            :attr:`intra_node` when every rank is on one node (a single rank included),
            otherwise :attr:`inter_node`.

        Raises
        ------
        ConfigError
            Empty group or a rank outside the cluster.
        """
        if len(ranks) == 0:
            raise ConfigError("a communication group needs at least one rank")
        first = self.node_of(ranks[0])
        crosses = False
        for rank in ranks:
            if self.node_of(rank) != first:
                crosses = True
        return self.inter_node if crosses else self.intra_node

    def to_dict(self) -> dict[str, object]:
        """The data.json ``cluster`` block: gpu, num_gpus, gpus_per_node, topology, links (and name,
        num_nodes, assumptions)."""
        return {
            "name": self.name,
            "gpu": self.gpu.name,
            "num_gpus": self.num_gpus,
            "gpus_per_node": self.gpus_per_node,
            "num_nodes": self.num_nodes,
            "topology": self.topology,
            "links": {"intra_node": self.intra_node.to_dict(), "inter_node": self.inter_node.to_dict()},
            "assumptions": list(self.assumptions),
            "network": {
                "intra_topology": self.intra_topology.value,  # plain strings: cluster files are YAML
                "nvlink_matrix": [list(r) for r in self.nvlink_matrix] if self.nvlink_matrix is not None else None,
                "nics_per_node": self.nics_per_node,
                "collective_library": self.collective_library.value,
                "collective_overhead_s": self.collective_overhead_s,
                "host_model": self.host_model,
                "sources": dict(self.sources),
            },
            # only for a cluster file (presets' blocks stay as they were)
            **({"collective_fits": [f.to_dict() for f in self.collective_fits]} if self.collective_fits else {}),
            **({"file": {"name": self.source_file[0], "sha256": self.source_file[1]}} if self.source_file else {}),
        }


@dataclass(frozen=True, slots=True)
class ClusterPreset:
    """A node recipe: which GPU, the intra-node link, the NICs, and where the numbers come from.

    :meth:`build` turns it into a :class:`Cluster` of a given size; the inter-node link is the
    per-GPU share of ``nics_per_node`` copies of ``nic`` (see the module docstring).
    """

    name: str
    gpu_name: str
    intra_node: Link
    nic: Link
    nics_per_node: int
    gpus_per_node: int
    topology: str
    description: str
    assumptions: tuple[str, ...] = ()
    intra_topology: str = "switch"
    nvlink_matrix: tuple[tuple[int, ...], ...] | None = None
    collective_library: str = "nccl"
    collective_overhead_s: float = 0.0
    sources: tuple[tuple[str, str], ...] = ()

    def build(self, num_gpus: int | None = None, gpus_per_node: int | None = None, gpu: GPU | None = None,
              nics_per_node: int | None = None) -> Cluster:
        """A cluster of ``num_gpus`` GPUs (default: one full node) from this recipe.

        Parameters
        ----------
        num_gpus
            Total GPUs; default ``gpus_per_node``.
        gpus_per_node
            Override the recipe's GPUs per node (the NIC share is recomputed).
        gpu
            Override the GPU (e.g. A100 40 GB in a DGX A100 node).
        nics_per_node
            Override the recipe's NICs per node (``--nics-per-node``): each GPU's inter-node
            share is recomputed, so a group spanning nodes runs on the NICs a node really has.
        """
        per_node = self.gpus_per_node if gpus_per_node is None else gpus_per_node
        if not _is_int(per_node) or per_node < 1:
            raise ConfigError(f"gpus_per_node must be a positive integer, got {per_node!r}")
        if nics_per_node is not None and (not _is_int(nics_per_node) or nics_per_node < 1):
            raise ConfigError(f"--nics-per-node must be a positive integer, got {nics_per_node!r}")
        nics = self.nics_per_node if nics_per_node is None else nics_per_node
        total = per_node if num_gpus is None else num_gpus
        chosen = gpu if gpu is not None else get_gpu(self.gpu_name)
        matrix = self.nvlink_matrix
        if matrix is not None:
            if per_node > len(matrix):
                raise ConfigError(
                    f"{self.name}: its NVLink hybrid cube-mesh joins {len(matrix)} GPUs; gpus_per_node={per_node} "
                    f"is too many (use {len(matrix)} or fewer)"
                )
            matrix = tuple(tuple(row[:per_node]) for row in matrix[:per_node])
        return Cluster(
            gpu=chosen,
            num_gpus=total,
            gpus_per_node=per_node,
            intra_node=self.intra_node,
            inter_node=_per_gpu_nic_share(self.nic, nics, per_node),
            topology=self.topology,
            name=f"{self.name} x{total}" if total != per_node else self.name,
            assumptions=self.assumptions,
            intra_topology=self.intra_topology,
            nvlink_matrix=matrix,
            nics_per_node=nics,
            collective_library=self.collective_library,
            collective_overhead_s=self.collective_overhead_s,
            sources=self.sources,
        )


#: Links between the eight V100s of a DGX-1 (hybrid cube-mesh): ``nvidia-smi topo -m`` shows NV1 or
#: NV2 (one or two bonded NVLinks) between linked pairs, SYS (no NVLink) otherwise.
DGX1_V100_NVLINK_MATRIX: tuple[tuple[int, ...], ...] = (
    (0, 1, 1, 2, 2, 0, 0, 0),
    (1, 0, 2, 1, 0, 2, 0, 0),
    (1, 2, 0, 2, 0, 0, 1, 0),
    (2, 1, 2, 0, 0, 0, 0, 1),
    (2, 0, 0, 0, 0, 1, 1, 2),
    (0, 2, 0, 0, 1, 0, 2, 1),
    (0, 0, 1, 0, 1, 2, 0, 2),
    (0, 0, 0, 1, 2, 1, 2, 0),
)
_DGX1_MATRIX_SOURCE = (
    "nvidia-smi topo -m of an 8x V100-SXM2 server (NV1/NV2/SYS), as printed in OneFlow's DLPerf benchmark reports; "
    "6 links per GPU, a cube with doubled edges and two face diagonals ('a cube with GPUs at its corners and with all "
    "twelve edges connected through NVLink (some edges have two NVLink connections), and with two of the six faces "
    "having their diagonals connected as well', NVIDIA DGX-1 with V100 whitepaper)"
)

#: Fixed time per collective call in the NCCL presets (kernel launch and measurement overhead beyond
#: NCCL's own base latency), fitted to the one small-message measurement: 8 x A100, 1 MiB all-reduce,
#: 92.79 us measured where the NCCL model (LL protocol, base latency 6.6 us + 14 x 0.6 us, 75 GB/s bus
#: bandwidth, kernel term) gives 41.3 us.  See dml2comm/network/nccl.py, "Calibration".
NCCL_CALL_OVERHEAD_S = 51.5e-6
_OVERHEAD_SOURCE = (
    f"fitted: the 8 x A100 1 MiB all-reduce of {_CSV} (vTrain LUT) takes 92.79 µs, the NCCL model without it 41.3 µs; "
    "other GPUs assume the A100 figure (no small-message measurements)"
)

_OVERHEAD_NOTE = (
    "collective times include a fixed 51.5 µs per call, fitted to NCCL all-reduces measured through PyTorch "
    "(vTrain, 8 x A100); a CPU that runs ahead of the GPU can hide part of it in training"
)
_ASSUMED_OVERHEAD = (
    "the per-call collective overhead (51.5 µs) is the one fitted to A100 measurements; no small-message "
    "measurements exist for this GPU"
)

_PCIE_BOX_ASSUMPTIONS = (
    _OVERHEAD_NOTE,
    _ASSUMED_OVERHEAD,
    "PCIe box: no vendor reference node exists; one 200 Gb/s HDR InfiniBand NIC per 8-GPU node is assumed "
    "(pass inter_node= to make_cluster to change it)",
    "PCIe intra-node bandwidth is NCCL's 24 GB/s model of a Gen4 x16 slot, an upper bound: 8-GPU PCIe "
    "servers are often limited by the CPU root complex",
)

_PRESETS: tuple[ClusterPreset, ...] = (
    ClusterPreset(
        name="dgx-a100",
        gpu_name="A100-SXM4-80GB",
        intra_node=NVLINK3_NVSWITCH_A100,
        nic=IB_HDR_200G,
        nics_per_node=8,
        gpus_per_node=8,
        topology="nvswitch/fat-tree",
        description=(
            "8x A100 80GB, NVSwitch, 8x 200 Gb/s HDR InfiniBand per node, fat tree (the Selene nodes of "
            "Narayanan et al. 2021 Sec. 5 / Table 1)"
        ),
        collective_overhead_s=NCCL_CALL_OVERHEAD_S,
        sources=(("collective_overhead_s", _OVERHEAD_SOURCE),),
        assumptions=(_OVERHEAD_NOTE,),
    ),
    ClusterPreset(
        name="dgx-h100",
        gpu_name="H100-SXM5-80GB",
        intra_node=NVLINK4_NVSWITCH_H100,
        nic=IB_NDR_400G,
        nics_per_node=8,
        gpus_per_node=8,
        topology="nvswitch/fat-tree",
        description=(
            "8x H100 SXM5, NVLink4 + NVSwitch, 8x 400 Gb/s NDR (ConnectX-7) per node, one per GPU "
            "(400 Gb/s NDR per GPU: AddyLaddy, NVIDIA/nccl-tests#290)"
        ),
        collective_overhead_s=NCCL_CALL_OVERHEAD_S,
        sources=(("collective_overhead_s", _OVERHEAD_SOURCE),),
        assumptions=(_OVERHEAD_NOTE, _ASSUMED_OVERHEAD),
    ),
    ClusterPreset(
        name="hgx-h200",
        gpu_name="H200-SXM-141GB",
        intra_node=NVLINK4_NVSWITCH_H100,
        nic=IB_NDR_400G,
        nics_per_node=8,
        gpus_per_node=8,
        topology="nvswitch/fat-tree",
        description="8x H200 SXM 141GB, NVLink4 + NVSwitch, 400 Gb/s NDR InfiniBand (MLCommons H200-SXM-141GBx8 system JSON)",
        assumptions=(
            "hgx-h200: the MLCommons H200x8 host lists 10x 400 Gb/s InfiniBand; 8 of them (one per GPU, as on DGX H100) "
            "are assumed to carry GPU traffic",
            _OVERHEAD_NOTE,
            _ASSUMED_OVERHEAD,
        ),
        collective_overhead_s=NCCL_CALL_OVERHEAD_S,
        sources=(("collective_overhead_s", _OVERHEAD_SOURCE),),
    ),
    ClusterPreset(
        name="dgx-v100",
        gpu_name="V100-SXM2-32GB",
        intra_node=NVLINK2_CUBE_MESH_V100,
        nic=IB_EDR_100G,
        nics_per_node=4,
        gpus_per_node=8,
        topology="hybrid-cube-mesh/fat-tree",
        description=(
            "DGX-1: 8x V100 SXM2 in an NVLink2 hybrid cube-mesh, 'four 100 Gb InfiniBand network interface "
            "cards' (NVIDIA DGX-1 with V100 whitepaper)"
        ),
        assumptions=(_OVERHEAD_NOTE, _ASSUMED_OVERHEAD),
        intra_topology="hybrid-cube-mesh",
        nvlink_matrix=DGX1_V100_NVLINK_MATRIX,
        collective_overhead_s=NCCL_CALL_OVERHEAD_S,
        sources=(("collective_overhead_s", _OVERHEAD_SOURCE), ("nvlink_matrix", _DGX1_MATRIX_SOURCE)),
    ),
    ClusterPreset(
        name="pcie-a6000",
        gpu_name="RTX-A6000",
        intra_node=PCIE_GEN4_X16,
        nic=IB_HDR_200G,
        nics_per_node=1,
        gpus_per_node=8,
        topology="pcie/fat-tree",
        description="8x RTX A6000 on PCIe Gen4 x16, no NVSwitch; 2-GPU NVLink bridges are not modelled",
        assumptions=_PCIE_BOX_ASSUMPTIONS
        + ("pcie-a6000: 2-GPU NVLink bridges (56.25 GB/s per direction) are ignored; all intra-node groups use PCIe",),
        collective_overhead_s=NCCL_CALL_OVERHEAD_S,
        sources=(("collective_overhead_s", _OVERHEAD_SOURCE),),
    ),
    ClusterPreset(
        name="pcie-l40s",
        gpu_name="L40S",
        intra_node=PCIE_GEN4_X16,
        nic=IB_HDR_200G,
        nics_per_node=1,
        gpus_per_node=8,
        topology="pcie/fat-tree",
        description="8x L40S on PCIe Gen4 x16 (no NVLink)",
        assumptions=_PCIE_BOX_ASSUMPTIONS,
        collective_overhead_s=NCCL_CALL_OVERHEAD_S,
        sources=(("collective_overhead_s", _OVERHEAD_SOURCE),),
    ),
)

#: Cluster presets by name (read-only); build one with :func:`get_cluster`.
CLUSTERS: Mapping[str, ClusterPreset] = MappingProxyType({p.name: p for p in _PRESETS})

# Default node recipe per GPU for make_cluster (MI300X has none: no sourced RCCL efficiency).
_DEFAULT_PRESET_FOR_GPU: Mapping[str, str] = MappingProxyType(
    {
        "A100-SXM4-80GB": "dgx-a100",
        "A100-SXM4-40GB": "dgx-a100",
        "H100-SXM5-80GB": "dgx-h100",
        "H200-SXM-141GB": "hgx-h200",
        "V100-SXM2-32GB": "dgx-v100",
        "RTX-A6000": "pcie-a6000",
        "L40S": "pcie-l40s",
    }
)


def cluster_names() -> tuple[str, ...]:
    """Names :func:`get_cluster` accepts, sorted."""
    return tuple(sorted(CLUSTERS))


#: The cluster-file reader :func:`get_cluster` calls for a ``.yaml`` name.  The file format builds on
#: this module, so :mod:`dml2comm.hardware.cluster_file` registers its reader here when it is imported
#: (:func:`register_cluster_file_loader`), and the package's ``__init__`` imports it: any import of
#: ``dml2comm.hardware.cluster`` has it in place, and this module never imports the file format.
_CLUSTER_FILE_LOADER: list = []


def register_cluster_file_loader(load) -> None:
    """Install the reader of cluster files (``load(path)`` returning an object with
    ``build(num_gpus) -> Cluster``): :func:`dml2comm.hardware.cluster_file.load_cluster_file`."""
    _CLUSTER_FILE_LOADER[:] = [load]


def is_cluster_file(name: str) -> bool:
    """Whether a ``--cluster`` value names a cluster file (``.yaml``/``.yml``) rather than a preset."""
    return name.strip().lower().endswith((".yaml", ".yml"))


def default_preset_name(gpu_name: str) -> str | None:
    """The cluster preset :func:`make_cluster` builds nodes of ``gpu_name`` from (None: no default)."""
    return _DEFAULT_PRESET_FOR_GPU.get(get_gpu(gpu_name).name)


def get_cluster(name: str, num_gpus: int | None = None, nics_per_node: int | None = None) -> Cluster:
    """Build the preset ``name`` (case-insensitive) with ``num_gpus`` GPUs (default: one node),
    or, for a ``.yaml``/``.yml`` path, the cluster file there
    (:func:`dml2comm.hardware.cluster_file.load_cluster_file`: a calibration from
    ``python main.py calibrate`` or a hand-written file).

    Raises
    ------
    ConfigError
        Unknown name (the message lists the valid ones), a non-positive size, or a cluster file
        that is missing or invalid (the message names the key and the fix).
    """
    if is_cluster_file(name):
        if nics_per_node is not None:
            raise ConfigError("--nics-per-node works with a preset or --gpu; a cluster file gives its own per-GPU inter_node "
                              "link: edit the file's links.inter_node instead")
        return _CLUSTER_FILE_LOADER[0](name).build(num_gpus)
    preset = CLUSTERS.get(name.strip().lower().replace("_", "-"))
    if preset is None:
        raise ConfigError(
            f"unknown cluster {name!r}; valid names: {', '.join(cluster_names())} "
            "(or use --gpu NAME with --gpus-per-node for a cluster built from a GPU preset, or a cluster file cluster.yaml)"
        )
    return preset.build(num_gpus, nics_per_node=nics_per_node)


def _node_fields(base: Cluster, own_intra: bool) -> dict[str, object]:
    """The fields :func:`make_cluster` takes from the GPU's usual node ``base`` besides its links:
    its NICs, collective costing and sources, and (``own_intra``: the intra-node link is the
    node's) its intra-node topology and NVLink matrix."""
    extra: dict[str, object] = {
        "nics_per_node": base.nics_per_node,
        "collective_library": base.collective_library,
        "collective_overhead_s": base.collective_overhead_s,
        "sources": base.sources,
    }
    if own_intra:
        extra["intra_topology"] = base.intra_topology
        extra["nvlink_matrix"] = base.nvlink_matrix
    return extra


def make_cluster(
    gpu_name: str,
    num_gpus: int,
    gpus_per_node: int = 8,
    *,
    intra_node: Link | None = None,
    inter_node: Link | None = None,
    topology: str | None = None,
    name: str | None = None,
    collective_library: str | None = None,
    collective_overhead_s: float | None = None,
    nics_per_node: int | None = None,
) -> Cluster:
    """A cluster of ``num_gpus`` GPUs of model ``gpu_name`` with sensible default links.

    Defaults come from the GPU's usual node (each documented, with sources, on its preset):
    A100 -> dgx-a100 (NVSwitch, one HDR NIC per GPU); H100 -> dgx-h100 (NVSwitch, one NDR NIC per
    GPU); H200 -> hgx-h200; V100 -> dgx-v100 (hybrid cube-mesh, 4 EDR NICs per node); RTX A6000 and
    L40S -> PCIe Gen4 boxes with one HDR NIC per node (an assumption, recorded in
    ``Cluster.assumptions``).  MI300X has no default: pass both links.

    Parameters
    ----------
    gpu_name
        Any name :func:`~dml2comm.hardware.gpus.get_gpu` accepts.
    num_gpus, gpus_per_node
        Sizes; the NIC share per GPU is recomputed for ``gpus_per_node``.
    intra_node, inter_node
        Override the links (``inter_node`` is taken as the per-GPU link as given).
    nics_per_node
        NICs per node (``--nics-per-node``); each GPU's inter-node share is the node's NICs over its
        GPUs (the preset's NIC), so groups spanning nodes run on the NICs a node really has.
        Override the identifiers.
    collective_library, collective_overhead_s
        Override how collectives are costed (default: the GPU's usual node, ``"nccl"``; a GPU
        without one gets ``"textbook"`` and no overhead).

    Raises
    ------
    ConfigError
        Unknown GPU, bad sizes, or no default node for the GPU and a link not given.
    """
    gpu = get_gpu(gpu_name)
    preset_name = _DEFAULT_PRESET_FOR_GPU.get(gpu.name)
    if nics_per_node is not None and (preset_name is None or inter_node is not None):
        raise ConfigError(f"--nics-per-node needs the NIC of a node preset ({gpu.name} has none here, or inter_node was given); "
                          "pass inter_node= as the per-GPU share instead")
    assumptions: tuple[str, ...] = ()
    default_topology = "custom"
    extra: dict[str, object] = {}
    if preset_name is not None:
        base = CLUSTERS[preset_name].build(num_gpus, gpus_per_node, gpu=gpu, nics_per_node=nics_per_node)
        assumptions, default_topology, extra = base.assumptions, base.topology, _node_fields(base, intra_node is None)
        intra_node = intra_node if intra_node is not None else base.intra_node
        inter_node = inter_node if inter_node is not None else base.inter_node
    if collective_library is not None:
        extra["collective_library"] = collective_library
    if collective_overhead_s is not None:
        extra["collective_overhead_s"] = collective_overhead_s
        assumptions = tuple(a for a in assumptions if a not in (_OVERHEAD_NOTE, _ASSUMED_OVERHEAD))
    if intra_node is None or inter_node is None:
        raise ConfigError(
            f"no sourced default node for {gpu.name}; pass intra_node= and inter_node= Links "
            f"(GPUs with defaults: {', '.join(sorted(_DEFAULT_PRESET_FOR_GPU))})"
        )
    return Cluster(
        gpu=gpu,
        num_gpus=num_gpus,
        gpus_per_node=gpus_per_node,
        intra_node=intra_node,
        inter_node=inter_node,
        topology=topology if topology is not None else default_topology,
        name=name if name is not None else f"{gpu.name} x{num_gpus} ({gpus_per_node} per node)",
        assumptions=assumptions,
        **extra,  # type: ignore[arg-type]
    )


# --------------------------------------------------------------------------------------------
# Rank mapping
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RankMap:
    """Global rank <-> (d, p, t, c) coordinates for ``dp x tp x pp x cp`` GPUs.

    ``order`` lists the dimensions from fastest- to slowest-varying; the default ``"tdp"`` is
    Megatron-LM's (tensor, then data, then pipeline): ``rank = t + tp * (d + dp * p)``.  Every
    method is O(1) per rank; the ``*_groups`` generators are the only way to walk all groups.

    Context parallelism adds a dimension ``c`` (``cp`` ranks per sequence).  An order without
    ``"c"`` gets it right after ``"t"``: Megatron-Core's default ``"tp-cp-ep-dp-pp"`` (tensor
    fastest, then context, then data, then pipeline), so ``rank = t + tp * (c + cp * (d + dp * p))``
    and a CP group stays inside a node when t x c <= GPUs per node.  Expert parallelism (``ep``)
    adds no GPUs: as in Megatron-Core's MoE "parallel folding" (expert rank generator
    ``tp-ep-dp-pp`` over the same world), the ``dp x cp`` ranks of one (stage, tensor rank),
    taken in rank order, split into consecutive EP groups of ``ep`` ranks; ranks ``ep`` apart
    form an expert-data-parallel group of ``dp * cp / ep`` ranks.

    Parameters
    ----------
    dp, tp, pp
        Data-, tensor- and pipeline-parallel sizes (>= 1).
    order
        A permutation of ``"t"``, ``"d"``, ``"p"`` (case-insensitive), first letter fastest,
        optionally with ``"c"`` (placed after ``"t"`` when absent).
    cp, ep
        Context- and expert-parallel sizes (>= 1; ``ep`` divides ``dp * cp``).

    Raises
    ------
    ConfigError
        Non-positive size or an order that is not a permutation of ``"tdp"`` (or ``"tcdp"``).

    References
    ----------
    Megatron-LM ``megatron/core/parallel_state.py`` (default order ``"tp-cp-ep-dp-pp"``);
    Narayanan et al. 2021, Sec. 3.
    """

    dp: int
    tp: int
    pp: int
    order: str = "tdp"
    cp: int = 1
    ep: int = 1
    _stride: tuple[int, int, int] = field(init=False, repr=False, compare=False)
    _cstride: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for label, value in (("dp", self.dp), ("tp", self.tp), ("pp", self.pp), ("cp", self.cp), ("ep", self.ep)):
            if not _is_int(value) or value < 1:
                raise ConfigError(f"{label} must be a positive integer, got {value!r}")
        order = self.order.strip().lower() if isinstance(self.order, str) else self.order
        if not isinstance(order, str) or sorted(order.replace("c", "", 1)) != ["d", "p", "t"]:
            raise ConfigError(
                f"rank order {self.order!r} must be a permutation of 't', 'd', 'p' (first letter fastest), "
                "e.g. 'tdp' (Megatron-LM default)"
            )
        if (self.dp * self.cp) % self.ep:
            raise ConfigError(f"ep={self.ep} must divide dp x cp = {self.dp * self.cp}")
        object.__setattr__(self, "order", order)
        full = order if "c" in order else order.replace("t", "tc", 1)
        sizes = {"d": self.dp, "p": self.pp, "t": self.tp, "c": self.cp}
        stride: dict[str, int] = {}
        step = 1
        for letter in full:
            stride[letter] = step
            step *= sizes[letter]
        object.__setattr__(self, "_stride", (stride["d"], stride["p"], stride["t"]))
        object.__setattr__(self, "_cstride", stride["c"])

    @property
    def strides(self) -> tuple[int, int, int, int]:
        """Rank distance between neighbours along d, p, t and c: every group is an arithmetic
        progression (``dp_group(p, t)`` is ``rank(0, p, t) + i * strides[0]``)."""
        return (*self._stride, self._cstride)

    @property
    def world_size(self) -> int:
        """dp x tp x pp x cp."""
        return self.dp * self.tp * self.pp * self.cp

    def _check(self, label: str, value: int, size: int) -> None:
        if not _is_int(value) or not 0 <= value < size:
            raise ConfigError(f"{label}={value!r} is outside 0..{size - 1}")

    def rank(self, d: int, p: int, t: int, c: int = 0) -> int:
        """Global rank of coordinates (d, p, t) and context rank c."""
        self._check("d", d, self.dp)
        self._check("p", p, self.pp)
        self._check("t", t, self.tp)
        self._check("c", c, self.cp)
        sd, sp, st = self._stride
        return d * sd + p * sp + t * st + c * self._cstride

    def coords(self, rank: int) -> tuple[int, int, int]:
        """(d, p, t) of global ``rank`` (its context rank: :meth:`cp_rank`)."""
        self._check("rank", rank, self.world_size)
        sd, sp, st = self._stride
        return (rank // sd) % self.dp, (rank // sp) % self.pp, (rank // st) % self.tp

    def cp_rank(self, rank: int) -> int:
        """Context-parallel rank c of global ``rank``."""
        self._check("rank", rank, self.world_size)
        return (rank // self._cstride) % self.cp

    def tp_group(self, d: int, p: int, c: int = 0) -> tuple[int, ...]:
        """Ranks of the tensor-parallel group at (d, p, c), ordered by t."""
        base = self.rank(d, p, 0, c)
        st = self._stride[2]
        return tuple(base + t * st for t in range(self.tp))

    def dp_group(self, p: int, t: int, c: int = 0) -> tuple[int, ...]:
        """Ranks of the data-parallel group at (p, t, c), ordered by d."""
        base = self.rank(0, p, t, c)
        sd = self._stride[0]
        return tuple(base + d * sd for d in range(self.dp))

    def pp_group(self, d: int, t: int, c: int = 0) -> tuple[int, ...]:
        """Ranks of the pipeline of replica d, tensor rank t, context rank c, ordered by stage p."""
        base = self.rank(d, 0, t, c)
        sp = self._stride[1]
        return tuple(base + p * sp for p in range(self.pp))

    def cp_group(self, d: int, p: int, t: int) -> tuple[int, ...]:
        """Ranks sharing one sequence (context-parallel group) at (d, p, t), ordered by c."""
        base = self.rank(d, p, t, 0)
        return tuple(base + c * self._cstride for c in range(self.cp))

    def dp_cp_group(self, p: int, t: int) -> tuple[int, ...]:
        """The ``dp x cp`` ranks of (p, t) in rank order: they reduce the non-expert gradients
        together (Megatron-Core's data-parallel group "with context parallel")."""
        sd, _, _ = self._stride
        base = self.rank(0, p, t, 0)
        return tuple(sorted(base + d * sd + c * self._cstride for d in range(self.dp) for c in range(self.cp)))

    def ep_group(self, p: int, t: int, k: int = 0) -> tuple[int, ...]:
        """The k-th expert-parallel group of (p, t): ``ep`` consecutive ranks of :meth:`dp_cp_group`."""
        self._check("k", k, self.dp * self.cp // self.ep)
        return self.dp_cp_group(p, t)[k * self.ep:(k + 1) * self.ep]

    def expert_dp_group(self, p: int, t: int, j: int = 0) -> tuple[int, ...]:
        """Ranks holding the same experts (expert rank j) at (p, t): every ``ep``-th rank of
        :meth:`dp_cp_group`, ``dp * cp / ep`` of them; they reduce the expert gradients."""
        self._check("j", j, self.ep)
        return self.dp_cp_group(p, t)[j::self.ep]

    def tp_groups(self) -> Iterator[tuple[int, ...]]:
        """Every tensor-parallel group (dp x pp x cp of them), generated lazily."""
        for c in range(self.cp):
            for p in range(self.pp):
                for d in range(self.dp):
                    yield self.tp_group(d, p, c)

    def dp_groups(self) -> Iterator[tuple[int, ...]]:
        """Every data-parallel group (pp x tp x cp of them), generated lazily."""
        for c in range(self.cp):
            for p in range(self.pp):
                for t in range(self.tp):
                    yield self.dp_group(p, t, c)

    def pp_groups(self) -> Iterator[tuple[int, ...]]:
        """Every pipeline (dp x tp x cp of them), generated lazily."""
        for c in range(self.cp):
            for d in range(self.dp):
                for t in range(self.tp):
                    yield self.pp_group(d, t, c)

    def cp_groups(self) -> Iterator[tuple[int, ...]]:
        """Every context-parallel group (dp x pp x tp of them), generated lazily."""
        for p in range(self.pp):
            for d in range(self.dp):
                for t in range(self.tp):
                    yield self.cp_group(d, p, t)

    def ep_groups(self) -> Iterator[tuple[int, ...]]:
        """Every expert-parallel group (pp x tp x dp*cp/ep of them), generated lazily."""
        for p in range(self.pp):
            for t in range(self.tp):
                for k in range(self.dp * self.cp // self.ep):
                    yield self.ep_group(p, t, k)


def check_gpu_matches_cluster(gpu: str | None, cluster_name: str, cluster: "Cluster") -> None:
    """``--gpu v100 --cluster dgx-a100`` is a contradiction, not a preference: refuse it (the
    cluster preset fixes its GPU with its nodes and network; silently using either would mislead).

    Raises
    ------
    ConfigError
        ``gpu`` names another GPU than the preset's.
    """
    if gpu is None:
        return
    if get_gpu(gpu).name != cluster.gpu.name:
        raise ConfigError(f"--gpu {gpu} conflicts with --cluster {cluster_name}, whose GPU is {cluster.gpu.name}; "
                          f"drop --gpu, or drop --cluster to build nodes of {gpu} (--gpu {gpu} --gpus-per-node N)")


def plan_cluster(gpu: str | None, cluster: str | None, num_gpus: int, gpus_per_node: int = 8, *,
                 nics_per_node: int | None = None, topology: str | None = None) -> "Cluster":
    """The cluster a plan of ``num_gpus`` GPUs runs on, from the hardware flags (``--gpu``,
    ``--cluster``, ``--gpus-per-node``, ``--nics-per-node``, ``--topology``) as the main command,
    ``sweep`` and ``compare`` read them: the ``cluster`` preset or file (a ``gpu`` naming another
    GPU is refused: :func:`check_gpu_matches_cluster`), else nodes of ``gpus_per_node`` GPUs of
    ``gpu`` (default a100; one node of ``num_gpus`` when the plan is smaller than a node)."""
    for flag, value in (("--gpu", gpu), ("--cluster", cluster)):
        if value is not None and not value.strip():
            raise ConfigError(f"{flag} is empty; give a name (python main.py presets lists them) or leave {flag} out")
    if cluster:
        built = get_cluster(cluster, num_gpus, nics_per_node=nics_per_node)
        check_gpu_matches_cluster(gpu, cluster, built)
        return built
    return make_cluster(gpu or "a100", num_gpus, min(gpus_per_node, num_gpus), topology=topology, nics_per_node=nics_per_node)
