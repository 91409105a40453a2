"""NCCL's cost model (src/graph/tuning.cc), as the cluster presets use it, and its calibration.

A cluster whose ``collective_library`` is ``"nccl"`` costs a collective the way NCCL's tuner
predicts it, on the links :mod:`.topology` finds, and picks the fastest (algorithm, protocol)
pair as the tuner does:

``t = overhead + baseLat[family][protocol] + formula(n, S, alpha_p, beta / f_p, gamma) + delta S``

- ``formula``: the textbook function of :mod:`.collectives` (ring, double binary tree, ...).
- ``alpha_p``: NCCL's per-step latency ``hwLat[link class][family][protocol]`` (NVLink, PCIe,
  network); for Simple on the ring family, :attr:`Link.latency_s` (the same 3.4 / 5.7 / 14.0 us,
  overridable).
- ``f_p``: the protocol's share of the link bandwidth (LL sends 8 data bytes per 16-byte line
  and NCCL's model takes 1/4 of busBw for all-reduce, 1/3 otherwise; LL128 120 of 128 bytes,
  0.92, 0.7 with one GPU per node; trees a further 0.92).
- ``baseLat``: NCCL's per-collective base latency (Ring: LL 6.6, LL128 14.0, Simple 8.4 us).
- ``delta``: :attr:`Link.kernel_s_per_byte`, the kernel term of the link that limits the
  collective (NVLink presets only; hardware/cluster.py).
- ``rho R``: :attr:`Link.reduce_s_per_byte` times the reduced block S/n of a ReduceScatter or of
  an AllReduce the GPUs reduce (H100/H200 only; 0 elsewhere), and an AllToAll adds
  :attr:`Link.alltoall_latency_s` (H100/H200 only).
- ``overhead``: :attr:`Cluster.collective_overhead_s`, fitted below.

Algorithms NCCL runs (the default candidates): AllReduce -- ring; NVLink SHARP (``in_network``)
inside an H100/H200 node; across nodes the double binary tree when a group has one GPU per node,
and ``hierarchical`` (reduce-scatter ring inside the node, ring or double binary tree across
nodes, all-gather ring; this is how NCCL's tree spans nodes, chains inside and trees between)
when it has several; AllGather, ReduceScatter, Broadcast, Reduce -- ring; AllToAll and SendRecv
-- direct point-to-point.  Any other registered algorithm can be asked for by name and is costed
with the same links under Simple.

Not modelled: NCCL's per-channel caps (llMaxBw, perChMaxRingLL128Bw, perChMaxTreeBw), the tree
correction factors for mid-size messages, the 1.4x "plateau" latency of multi-node Simple rings,
CollNet, and NVLS across nodes.

Calibration
-----------
Measured: shared/data/nccl_allreduce_measured.csv (vTrain's single-node A100 and V100 lookup
tables, float32).  Four numbers carry the fit, each from one source (hardware/cluster.py):

1. A100 NVLink at its 300 GB/s line rate (efficiency 1.0).  Free fit of t/S = 2((n-1)/n) /
   (e x 300 GB/s) + delta to the three 1 GiB rows: e = 0.996.
2. delta_A100 = 1.775 ps/B, from the maintainers' 230 GB/s 8-GPU busbw alone (not the CSV).  It
   is what makes busbw depend on n: the free fit gives 1.63 ps/B.
3. The per-call overhead, 51.5 us: the 1 MiB, 8-GPU row (92.79 us measured) minus the model
   (41.3 us with LL, the protocol the tuner picks there).  The only parameter fitted to a row
   of the table; NCCL's own baseLat (6.6 us) is inside the model, the rest is launch and the
   measurement's framework overhead.
4. V100 NVLink efficiency 0.90 from the two V100 1 GiB rows (one NVLink between GPUs 0 and 1:
   0.902; six links for 8 GPUs: 0.897) -- the hybrid cube-mesh link matrix explains the 6x gap.

Error per row (prediction - measured) / measured, ``benchmarks/bench_collectives.py``:

====  ===  ========  ===========  ==========  ========  ========
GPU   n    size      measured us  predicted   error     protocol
====  ===  ========  ===========  ==========  ========  ========
A100  2    64 MiB    404.7        409.5       +1.2%    simple
A100  2    256 MiB   1455.8       1438.1      -1.2%    simple
A100  2    1 GiB     5442.8       5552.1      +2.0%    simple
A100  4    64 MiB    543.8        535.0       -1.6%    simple
A100  4    256 MiB   1929.0       1899.0      -1.6%    simple
A100  4    1 GiB     7259.4       7355.3      +1.3%    simple
A100  8    1 MiB     92.8         92.8        +0.0%    ll (the overhead's fit point)
A100  8    16 MiB    232.4        228.3       -1.8%    ll128
A100  8    64 MiB    579.9        618.1       +6.6%    simple
A100  8    256 MiB   2162.3       2149.9      -0.6%    simple
A100  8    1 GiB     8193.0       8277.3      +1.0%    simple
V100  2    1 GiB     47610.0      47788.6     +0.4%    simple (one NVLink)
V100  8    64 MiB    911.3        977.4       +7.3%    simple
V100  8    1 GiB     13969.0      14026.4     +0.4%    simple
====  ===  ========  ===========  ==========  ========  ========

A100 rows of 16 MiB and more: mean |error| 1.9 %, worst +6.6 % (n = 8, 64 MiB); the baseline ring
model (one link at 230/300 efficiency) was off by up to 26 % (n = 2, 64 MiB) and 25 % (n = 8,
16 MiB).  V100: worst +7.3 %; the baseline was off by 81 % on the pair that shares one NVLink.  The worst rows are the 64 MiB ones, where NCCL switches from LL128
to Simple and the real curve bends more smoothly than a min of two lines.

H100 (OpenXLA's measured table, ``python main.py validate --source xla_collectives``)
---------------------------------------------------------------------------------------
Measured: dml2comm/validate/data/xla_collectives_h100.csv (8 H100s, groups of 2, 4 and 8, all-reduce,
all-gather, reduce-scatter, all-to-all, 1 KiB-2 GiB, float32), timed by XLA on the GPU
(``compute_time_ns`` of the executable, not through PyTorch).  What was wrong, and the fixes:

1. The preset's 51.5 us per-call overhead (the PyTorch path of vTrain's A100 tables) was added
   to kernel-level measurements whose floor is 11-35 us: the comparison now uses XLA's own
   per-call overhead (validate/collectives.py ``XLA_CALL_OVERHEAD_S``, fitted, 20 us).
2. NVLS (NVLink SHARP) was costed at the maintainers' 480 GB/s busbw; the f32 table reaches 402
   GB/s at 8 GPUs and 2 GiB and 300-370 GB/s below 512 MiB: efficiency 0.57 (fitted), latency 25 us
   (NCCL 2.28 tuning.cc, was 23), and never for two GPUs (nvls.cc).
3. ReduceScatter runs slower than AllGather on the same bytes by 1.2-1.4 ps per byte of its
   output S/n, at every group size: rho = 1.85 ps/B (fitted), also on an AllReduce ring's
   reduce-scatter half (measured AllReduce ring = ReduceScatter + AllGather within 6 %).
4. AllToAll: the block a rank keeps never crosses NVLink (kernel bytes ((n-1)/n) S, was S: the
   n = 2 slope was 29 % too slow) and NCCL's grouped point-to-point launch costs 22 us more than
   a ring's Simple latency (fitted).

The four fitted numbers come from one coordinate descent on the rows of groups 2 and 8
(``benchmarks/fit_h100_collectives.py``); held out, the groups of 4 reach mean |error| at >= 16
MiB of 4.3 % (all-gather), 9.2 % (all-reduce), 4.6 % (all-to-all), 4.4 % (reduce-scatter), median
12.2 % over all their sizes.  Whole table: every (op, group) within 9.2 % at >= 16 MiB (was
9.4-25.6 %), median 11.2 % over all sizes (was 56.8 %).  The A100 and V100 rows above are
unchanged (no constant of theirs moved; the AllToAll kernel bytes apply to every preset but no
A100 all-to-all is measured).

References
----------
NVIDIA NCCL src/graph/tuning.cc (baseLat, hwLat, the protocol refinements, ncclTopoGetAlgoTime:
time = lat + bytes / bw); NVIDIA nccl-tests doc/PERFORMANCE.md; sjeaugey in NVIDIA/nccl-tests#149
and #212 (expected bus bandwidths); vTrain (MICRO 2024) measured lookup tables.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Iterable, Mapping

from dml2comm.network.kinds import Algorithm, AlgorithmFamily, CollectiveKind, Protocol

__all__ = [
    "BASE_LATENCY_S",
    "HW_LATENCY_S",
    "available_protocols",
    "base_latency_s",
    "default_algorithms",
    "hop_latency_s",
    "protocol_bandwidth_factor",
]

_LL, _LL128, _SIMPLE = Protocol.LL, Protocol.LL128, Protocol.SIMPLE

#: NCCL baseLat (seconds) by algorithm family and protocol; "ring" also serves the algorithms NCCL
#: does not have.  NVLS has no base latency (its hwLat is the whole latency).
BASE_LATENCY_S: Mapping[str, Mapping[Protocol, float]] = MappingProxyType(
    {
        "ring": MappingProxyType({_LL: 6.6e-6, _LL128: 14.0e-6, _SIMPLE: 8.4e-6}),
        "tree": MappingProxyType({_LL: 6.8e-6, _LL128: 14.0e-6, _SIMPLE: 0.0}),
        "nvls": MappingProxyType({_SIMPLE: 0.0}),
    }
)

#: NCCL hwLat (seconds per step) by link class, algorithm family and protocol.  NVLS: 25 us for the
#: whole operation (NCCL 2.28 src/graph/tuning.cc, hwLatencies[NVLINK][NVLS][Simple] = 25; 23 in
#: NCCL 2.18), i.e. 12.5 us for each of the two hops of ``2 alpha + S beta``.
HW_LATENCY_S: Mapping[str, Mapping[str, Mapping[Protocol, float]]] = MappingProxyType(
    {
        "nvlink": MappingProxyType(
            {
                "ring": MappingProxyType({_LL: 0.6e-6, _LL128: 1.9e-6, _SIMPLE: 3.4e-6}),
                "tree": MappingProxyType({_LL: 0.6e-6, _LL128: 1.25e-6, _SIMPLE: 28e-6}),
                "nvls": MappingProxyType({_SIMPLE: 12.5e-6}),
            }
        ),
        "pcie": MappingProxyType(
            {
                "ring": MappingProxyType({_LL: 1.0e-6, _LL128: 2.5e-6, _SIMPLE: 5.7e-6}),
                "tree": MappingProxyType({_LL: 1.0e-6, _LL128: 1.9e-6, _SIMPLE: 28e-6}),
            }
        ),
        "net": MappingProxyType(
            {
                "ring": MappingProxyType({_LL: 2.7e-6, _LL128: 4.0e-6, _SIMPLE: 14.0e-6}),
                "tree": MappingProxyType({_LL: 5.0e-6, _LL128: 8.5e-6, _SIMPLE: 28e-6}),
            }
        ),
    }
)


_F = AlgorithmFamily


def _row(family: AlgorithmFamily) -> AlgorithmFamily:
    family = _F(family)
    return family if family in (_F.RING, _F.TREE, _F.NVLS) else _F.RING


def base_latency_s(family: AlgorithmFamily, protocol: Protocol) -> float:
    """NCCL baseLat for the algorithm family (``"other"`` algorithms use the ring row)."""
    return BASE_LATENCY_S[_row(family)].get(protocol, BASE_LATENCY_S[_F.RING][protocol])


def hop_latency_s(hw: str, family: AlgorithmFamily, protocol: Protocol, simple_latency_s: float) -> float | None:
    """Per-step latency on a link of class ``hw``; ``None`` if NCCL has no such protocol there.

    Simple on the ring row returns ``simple_latency_s`` (the link's own ``latency_s``), so a
    user's latency override applies; a generic link (``hw == ""``) knows only that.
    """
    row = _row(family)
    if protocol is _SIMPLE and row is _F.RING:
        return simple_latency_s
    table = HW_LATENCY_S.get(hw)
    if table is None:
        return None
    return table.get(row, {}).get(protocol)


def available_protocols(hws: Iterable[str]) -> tuple[Protocol, ...]:
    """Protocols NCCL enables on a path over links of these classes.

    LL needs every link to be NVLink, PCIe or network; LL128 needs NVLink or network everywhere
    (NCCL enables it only on NVLink nodes with the NIC close to the GPU, tuning.cc).
    """
    classes = set(hws)
    out = []
    if classes and classes <= {"nvlink", "pcie", "net"}:
        out.append(_LL)
    if classes and classes <= {"nvlink", "net"}:
        out.append(_LL128)
    out.append(_SIMPLE)
    return tuple(out)


def protocol_bandwidth_factor(family: AlgorithmFamily, protocol: Protocol, kind: CollectiveKind, multi_node: bool, ranks_per_node: int) -> float:
    """Share of the link bandwidth a protocol delivers, NCCL's "various model refinements".

    Ring: LL 1/4 (AllReduce, Reduce or several nodes) else 1/3; LL128 0.92 (0.7 with one rank per
    node); Simple 1.  Tree: 0.92 x (LL 1/3.8; LL128 7/9 on one node, 120/128 across nodes;
    Simple 1).  NVLS and the other algorithms: 1 (Simple only).
    """
    row = _row(family)
    if row is _F.TREE:
        factor = 0.92
        if protocol is _LL:
            factor /= 3.8
        elif protocol is _LL128:
            factor *= 120.0 / 128.0 if multi_node else 7.0 / 9.0
        return factor
    if _F(family) is not _F.RING or protocol is _SIMPLE:
        return 1.0
    if protocol is _LL:
        return 1.0 / 4.0 if (multi_node or kind in (CollectiveKind.ALL_REDUCE, CollectiveKind.REDUCE)) else 1.0 / 3.0
    return 0.92 if ranks_per_node >= 2 else 0.7


def default_algorithms(kind: CollectiveKind, *, levels: int, spans_nodes: bool, in_network: bool,
                       ranks: int | None = None) -> tuple[Algorithm, ...]:
    """The algorithms NCCL would choose among for ``kind`` (module docstring).

    Parameters
    ----------
    levels
        Network levels the group spans (1: one node, or one GPU per node; 2: several of each).
    spans_nodes
        The group crosses nodes.
    in_network
        Its only level can reduce in the switch (NVLink SHARP).
    ranks
        GPUs in the group (None: not known).  NVLS needs more than two: NCCL disables it on a
        communicator of two GPUs (src/transport/nvls.cc ncclNvlsInit: ``if (... gpuCount <= 2)
        return``, NCCL 2.18-2.28).
    """
    if kind is CollectiveKind.ALL_REDUCE:
        out = [Algorithm.RING]
        if levels > 1:
            out.append(Algorithm.HIERARCHICAL)
        elif spans_nodes:
            out.append(Algorithm.DOUBLE_BINARY_TREE)
        if in_network and levels == 1 and (ranks is None or ranks > 2):
            out.append(Algorithm.IN_NETWORK)
        return tuple(out)
    if kind in (CollectiveKind.ALL_TO_ALL, CollectiveKind.SEND_RECV):
        return (Algorithm.DIRECT,)
    return (Algorithm.RING,)
