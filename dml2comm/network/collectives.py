"""Alpha-beta cost of collectives: one small function per (collective, algorithm).

Each function is the textbook formula on a *uniform* network (every partner one hop away, no
link shared), as tabulated by Thakur, Rabenseifner and Gropp (2005) and reproduced in
shared/REFERENCES.md.  A topology adapts alpha and beta to itself (:mod:`.topology`), the NCCL
calibration adds its base latency and protocols (:mod:`.nccl`), and :mod:`.model` composes levels
and picks the fastest algorithm; the formulas here never change for any of that.

Every function takes ``(n, S, alpha, beta, gamma)`` and works elementwise on numpy arrays as well
as on Python numbers (scalars stay pure Python, so the per-call path is fast); a group of one rank
costs 0.  :func:`collective_time_vec` is the vectorised entry point for sweeps.

Symbols (SI units)
------------------
n
    Ranks in the group.  For the butterfly algorithms ``p = 2^floor(log2 n)`` and ``e = 1`` when
    n is not a power of two (``e = 0`` otherwise): the ``n - p`` extra ranks first hand their data
    to a partner and get the result back at the end (Thakur et al. 2005 Sec. 4; Rabenseifner and
    Traeff 2004), which adds the ``e`` terms.  With n = 2^k every formula is the table's.
S
    ``message_bytes``, the buffer size as nccl-tests reports it: the AllReduce buffer; the
    *output* of AllGather (n x the per-rank input); the *input* of ReduceScatter (n x the
    per-rank output); the Broadcast/Reduce buffer; for AllToAll the total a rank sends,
    *including* the 1/n share it keeps for itself (``sendcount * n * sizeof``); the pairwise
    exchange sends ``M = ((n-1)/n) S`` to others, Bruck forwards ``S/2`` per step; for SendRecv
    the bytes each rank sends to its peer.
alpha
    Per-message (per-step) latency in seconds (:attr:`Link.latency_s`).
beta
    Seconds per byte, 1 / (line rate x efficiency) (:attr:`Link.beta_s_per_byte`).
gamma
    Seconds per byte of reduction arithmetic.  Default 0: NCCL fuses the reduction into the
    copy kernel, and at HBM speed (2-5 TB/s) it hides under link transfers of 25-450 GB/s.
    Pass ``gamma_s_per_byte`` to include it.

Bus bandwidth follows nccl-tests: ``algbw = S / t``, ``busbw = algbw x factor`` with factor
2(n-1)/n for AllReduce; (n-1)/n for ReduceScatter, AllGather, AllToAll; 1 for Broadcast, Reduce,
SendRecv.  A group of one rank moves nothing and costs 0 (its algbw and busbw are reported as 0).

References
----------
R. Thakur, R. Rabenseifner, W. Gropp, "Optimization of Collective Communication Operations in
MPICH", IJHPCA 19(1), 2005 (formulas as listed in shared/REFERENCES.md).
R. Rabenseifner, J. L. Traeff, "More Efficient Reduction Algorithms for Non-Power-of-Two Number
of Processors in Message-Passing Parallel Systems", EuroPVM/MPI 2004.
J. Bruck et al., "Efficient Algorithms for All-to-All Communications in Multiport
Message-Passing Systems", IEEE TPDS 8(11), 1997.
P. Sanders, J. Speck, J. L. Traeff, "Two-tree algorithms for full bandwidth broadcast, reduction
and scan", Parallel Computing 35(12), 2009 (double binary tree); S. Jeaugey, "Massively Scale
Your Deep Learning Training with NCCL 2.4", NVIDIA blog 2019.
NVIDIA nccl-tests, doc/PERFORMANCE.md (algbw, busbw and the size conventions above).
NVIDIA NCCL src/graph/tuning.cc (ring step counts: 2(n-1) for AllReduce, n-1 for AllGather and
ReduceScatter).
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Mapping

import numpy as np

from dml2comm.errors import ConfigError, RegistryError
from dml2comm.hardware.cluster import Link
from dml2comm.network.kinds import Algorithm, AlgorithmFamily, CollectiveKind
from dml2comm.network.topology import Pattern
from dml2comm.fmt import fmt_s

__all__ = [
    "Algorithm",
    "AlgorithmRule",
    "CollectiveCost",
    "DEFAULT_ALGORITHMS",
    "allgather_bruck",
    "allgather_direct",
    "allgather_hierarchical",
    "allgather_recursive_doubling",
    "allgather_ring",
    "allreduce_double_binary_tree",
    "allreduce_hierarchical",
    "allreduce_in_network",
    "allreduce_rabenseifner",
    "allreduce_recursive_doubling",
    "allreduce_ring",
    "alltoall_bruck",
    "alltoall_direct",
    "alltoall_hierarchical",
    "alltoall_pairwise",
    "bandwidth_lower_bound_s",
    "broadcast_binomial_tree",
    "broadcast_hierarchical",
    "broadcast_ring",
    "broadcast_scatter_allgather",
    "busbw_factor",
    "collective_cost",
    "collective_time",
    "collective_time_vec",
    "get_rule",
    "kernel_bytes",
    "reduced_block_bytes",
    "reduce_binomial_tree",
    "reduce_hierarchical",
    "reduce_rabenseifner",
    "reduce_ring",
    "reducescatter_direct",
    "reducescatter_hierarchical",
    "reducescatter_pairwise",
    "reducescatter_recursive_halving",
    "reducescatter_ring",
    "registered_algorithms",
    "sendrecv_direct",
]

Num = Any  # float or numpy array
TimeFn = Callable[..., Num]
BytesFn = Callable[[Num, Num], Num]
StepsFn = Callable[[Num], Num]


@dataclass(frozen=True, slots=True)
class AlgorithmRule:
    """A registered (collective, algorithm): its time formula and what it moves.

    Attributes
    ----------
    time_s
        ``(n, S, alpha, beta, gamma, **levels) -> seconds``.
    bytes_sent_per_gpu
        ``(n, S) -> bytes`` the busiest GPU puts on its links.
    steps
        ``n -> sequential message steps`` (the alpha count).
    pattern
        Who talks to whom (:class:`~dml2comm.network.topology.Pattern`); ``None`` for the
        two-level closed forms (``hierarchical``), which a topology composes level by level.
    formula
        The formula as text, in the symbols of the module docstring.
    family
        :class:`~dml2comm.network.kinds.AlgorithmFamily`: ``ring``, ``tree`` or ``nvls`` where NCCL runs the algorithm (its protocol and
        latency tables apply), ``other`` otherwise.
    """

    kind: CollectiveKind
    algorithm: Algorithm
    time_s: TimeFn
    bytes_sent_per_gpu: BytesFn
    home: str  # module.function, for error messages
    steps: StepsFn = field(default=lambda n: 0)
    pattern: Pattern | None = Pattern.RING
    formula: str = ""
    family: AlgorithmFamily = AlgorithmFamily.OTHER


_RULES: dict[tuple[CollectiveKind, Algorithm], AlgorithmRule] = {}


def collective_time(
    kind: CollectiveKind,
    algorithm: Algorithm,
    *,
    bytes_sent: BytesFn,
    steps: StepsFn | None = None,
    pattern: Pattern | None = Pattern.RING,
    formula: str = "",
    family: AlgorithmFamily = AlgorithmFamily.OTHER,
) -> Callable[[TimeFn], TimeFn]:
    """Register ``fn(n, S, alpha, beta, gamma) -> seconds`` for (kind, algorithm).

    Parameters
    ----------
    kind, algorithm
        What the function costs.
    bytes_sent
        ``(n, S) -> bytes`` the busiest GPU sends under this algorithm.
    steps, pattern, formula, family
        See :class:`AlgorithmRule`.

    Raises
    ------
    RegistryError
        (kind, algorithm) already has a function.
    """

    def register(fn: TimeFn) -> TimeFn:
        key = (kind, algorithm)
        home = f"{fn.__module__}.{fn.__qualname__}"
        if key in _RULES:
            raise RegistryError(
                f"collective time for {kind.value}/{algorithm.value} registered twice "
                f"({_RULES[key].home} and {home}); keep one"
            )
        _RULES[key] = AlgorithmRule(
            kind, algorithm, fn, bytes_sent, home, steps or (lambda n: 0), pattern, formula, AlgorithmFamily.of(family)
        )
        return fn

    return register


def registered_algorithms(kind: CollectiveKind) -> tuple[Algorithm, ...]:
    """Algorithms with a registered time function for ``kind``, in registration order."""
    return tuple(a for (k, a) in _RULES if k is kind)


def get_rule(kind: CollectiveKind, algorithm: Algorithm) -> AlgorithmRule:
    """The rule for (kind, algorithm).

    Raises
    ------
    ConfigError
        None registered: the message names the registered algorithms and where to add one.
    """
    rule = _RULES.get((kind, algorithm))
    if rule is None:
        known = ", ".join(a.value for a in registered_algorithms(kind)) or "none"
        raise ConfigError(
            f"no {algorithm.value} algorithm for {kind.value} (registered: {known}); add one with "
            f"@collective_time(CollectiveKind.{kind.name}, Algorithm.{algorithm.name}, bytes_sent=...) in "
            "dml2comm/network/collectives.py"
        )
    return rule


# --------------------------------------------------------------------------------------------
# Scalar-or-array helpers (scalars stay in pure Python for speed)
# --------------------------------------------------------------------------------------------


def _is_array(*xs: Any) -> bool:
    return any(isinstance(x, np.ndarray) for x in xs)


def _multi(n: Num, value: Num) -> Num:
    """``value`` where n > 1, else 0."""
    if _is_array(n, value):
        return np.where(np.asarray(n) > 1, value, 0.0)
    return value if n > 1 else 0.0


def _ceil_log2(n: Num) -> Num:
    if isinstance(n, np.ndarray):
        return np.ceil(np.log2(np.maximum(n, 1)))
    return float((int(n) - 1).bit_length()) if n >= 1 else 0.0


def _floor_log2(n: Num) -> Num:
    if isinstance(n, np.ndarray):
        return np.floor(np.log2(np.maximum(n, 1)))
    return float(int(n).bit_length() - 1) if n >= 1 else 0.0


def _pow2_split(n: Num) -> tuple[Num, Num, Num]:
    """(p, log2 p, e): the largest power of two <= n, its log, 1 if n is not a power of two."""
    lg = _floor_log2(n)
    p = 2.0**lg
    e = (np.asarray(n) != p).astype(float) if isinstance(n, np.ndarray) else float(n != p)
    return p, lg, e


def _frac(n: Num) -> Num:
    return (n - 1) / n


# --------------------------------------------------------------------------------------------
# AllReduce
# --------------------------------------------------------------------------------------------


@collective_time(
    CollectiveKind.ALL_REDUCE, Algorithm.RING, bytes_sent=lambda n, s: 2 * _frac(n) * s, steps=lambda n: 2 * (n - 1),
    pattern=Pattern.RING, formula="2(n-1) a + 2((n-1)/n) S b + ((n-1)/n) S g", family=AlgorithmFamily.RING,
)
def allreduce_ring(n: Num, message_bytes: Num, alpha_s: Num, beta_s_per_byte: Num, gamma_s_per_byte: Num = 0.0) -> Num:
    """Ring AllReduce (a ring ReduceScatter followed by a ring AllGather).

    ``t = 2(n-1) alpha + 2((n-1)/n) S beta + ((n-1)/n) S gamma``

    Parameters
    ----------
    n
        Ranks (>= 1).
    message_bytes
        S, the AllReduce buffer in bytes (the same on every rank).
    alpha_s, beta_s_per_byte, gamma_s_per_byte
        Latency per message (s), transfer time per byte (s/B), reduction time per byte (s/B).

    Returns
    -------
    float
        Seconds (an array when any argument is one).

    References
    ----------
    Thakur, Rabenseifner, Gropp 2005, ring allreduce (REFERENCES.md "AllReduce ring (RS + AG)");
    NCCL tuning.cc: nsteps = 2(n-1).
    """
    f = _frac(n)
    return _multi(n, 2 * (n - 1) * alpha_s + 2 * f * message_bytes * beta_s_per_byte + f * message_bytes * gamma_s_per_byte)


def _rd_steps(n: Num) -> Num:
    _, lg, e = _pow2_split(n)
    return lg + 2 * e


@collective_time(
    CollectiveKind.ALL_REDUCE, Algorithm.RECURSIVE_DOUBLING, bytes_sent=lambda n, s: (_pow2_split(n)[1] + _pow2_split(n)[2]) * s,
    steps=_rd_steps, pattern=Pattern.LOG_EQUAL, formula="(log2 p + 2e)(a + S b) + (log2 p + e) S g",
)
def allreduce_recursive_doubling(n: Num, message_bytes: Num, alpha_s: Num, beta_s_per_byte: Num, gamma_s_per_byte: Num = 0.0) -> Num:
    """Recursive-doubling AllReduce: every step exchanges and reduces the whole buffer.

    ``t = (log2 p + 2e)(alpha + S beta) + (log2 p + e) S gamma``; for n = 2^k the table's
    ``log2(n) alpha + log2(n) S (beta + gamma)``.  Non-powers of two: the n - p extra ranks send
    their buffer to a partner first (one step, reduced there) and receive the result last.

    References
    ----------
    Thakur, Rabenseifner, Gropp 2005 (REFERENCES.md "AllReduce recursive doubling"; Sec. 4 for
    non-powers of two).
    """
    _, lg, e = _pow2_split(n)
    s = message_bytes
    return _multi(n, (lg + 2 * e) * (alpha_s + s * beta_s_per_byte) + (lg + e) * s * gamma_s_per_byte)


@collective_time(
    CollectiveKind.ALL_REDUCE, Algorithm.RABENSEIFNER,
    bytes_sent=lambda n, s: 2 * _frac(_pow2_split(n)[0]) * s + _pow2_split(n)[2] * s,
    steps=lambda n: 2 * _pow2_split(n)[1] + 2 * _pow2_split(n)[2], pattern=Pattern.LOG_GEOMETRIC,
    formula="2 log2(p) a + 2((p-1)/p) S b + ((p-1)/p) S g + e (2 a + 2 S b + S g)",
)
def allreduce_rabenseifner(n: Num, message_bytes: Num, alpha_s: Num, beta_s_per_byte: Num, gamma_s_per_byte: Num = 0.0) -> Num:
    """Rabenseifner AllReduce: recursive-halving ReduceScatter, then recursive-doubling AllGather.

    ``t = 2 log2(p) alpha + 2((p-1)/p) S beta + ((p-1)/p) S gamma + e (2 alpha + 2 S beta + S gamma)``;
    for n = 2^k the table's ``2 log2(n) alpha + 2((n-1)/n) S beta + ((n-1)/n) S gamma``.  Non-powers
    of two: the first 2(n - p) ranks pair up, one of each pair hands its whole buffer to the other
    (reduced there) before the halving-doubling on p ranks and gets the result back after it.

    References
    ----------
    Thakur, Rabenseifner, Gropp 2005 (REFERENCES.md "AllReduce Rabenseifner"); Rabenseifner and
    Traeff 2004 (non-powers of two, the simple variant).
    """
    p, lg, e = _pow2_split(n)
    s, fp = message_bytes, _frac(p)
    core = 2 * lg * alpha_s + 2 * fp * s * beta_s_per_byte + fp * s * gamma_s_per_byte
    extra = e * (2 * alpha_s + 2 * s * beta_s_per_byte + s * gamma_s_per_byte)
    return _multi(n, core + extra)


@collective_time(
    CollectiveKind.ALL_REDUCE, Algorithm.DOUBLE_BINARY_TREE, bytes_sent=lambda n, s: _multi(n, 2.0 * s),
    steps=lambda n: 2 * _ceil_log2(n), pattern=Pattern.LOG_EQUAL, formula="2 ceil(log2 n) a + 2 S b + S g", family=AlgorithmFamily.TREE,
)
def allreduce_double_binary_tree(n: Num, message_bytes: Num, alpha_s: Num, beta_s_per_byte: Num, gamma_s_per_byte: Num = 0.0) -> Num:
    """Double-binary-tree AllReduce (pipelined reduce up and broadcast down two complementary trees).

    ``t = 2 ceil(log2 n) alpha + 2 S beta + S gamma``: each tree carries half the buffer; every
    rank is interior in at most one tree, so it sends S up and S down in all, full bandwidth
    with logarithmic depth.  NCCL's model has the same bandwidth: tree algbw = busBw / 2.

    References
    ----------
    Sanders, Speck, Traeff 2009; Jeaugey 2019 (NCCL 2.4 blog); NCCL tuning.cc (tree ratio .5).
    """
    s = message_bytes
    return _multi(n, 2 * _ceil_log2(n) * alpha_s + 2 * s * beta_s_per_byte + s * gamma_s_per_byte)


@collective_time(
    CollectiveKind.ALL_REDUCE, Algorithm.IN_NETWORK, bytes_sent=lambda n, s: _multi(n, 1.0 * s), steps=lambda n: 2,
    pattern=Pattern.IN_NETWORK, formula="2 a + S b", family=AlgorithmFamily.NVLS,
)
def allreduce_in_network(n: Num, message_bytes: Num, alpha_s: Num, beta_s_per_byte: Num, gamma_s_per_byte: Num = 0.0) -> Num:
    """In-network AllReduce (the switch reduces: NVLink SHARP, InfiniBand SHARP).

    ``t = 2 alpha + S beta``: every rank sends its buffer once to the switch and receives the
    reduced buffer once (both directions of its link at once); the switch does the arithmetic, so
    no gamma.  busbw = 2((n-1)/n) / beta exceeds the link rate: that is the point of it.

    References
    ----------
    Graham et al., "Scalable Hierarchical Aggregation Protocol (SHArP)", COMHPC 2016; NVIDIA
    NVLink SHARP (NCCL NVLS algorithm; about 480 GB/s busbw on 8 H100, REFERENCES.md).
    """
    return _multi(n, 2 * alpha_s + message_bytes * beta_s_per_byte)


def _levels(n: Num, gpus_per_node: Num | None, alpha_inter_s: Num | None, beta_inter: Num | None,
            alpha_s: Num, beta: Num) -> tuple[Num, Num, Num, Num]:
    k = n if gpus_per_node is None else gpus_per_node
    nodes = n / k
    a2 = alpha_s if alpha_inter_s is None else alpha_inter_s
    b2 = beta if beta_inter is None else beta_inter
    return k, nodes, a2, b2


@collective_time(
    CollectiveKind.ALL_REDUCE, Algorithm.HIERARCHICAL, bytes_sent=lambda n, s: 2 * _frac(n) * s, steps=lambda n: 2 * (n - 1),
    pattern=None, formula="RS ring over k + AR ring over N of S/k (a', b') + AG ring over k",
)
def allreduce_hierarchical(
    n: Num, message_bytes: Num, alpha_s: Num, beta_s_per_byte: Num, gamma_s_per_byte: Num = 0.0, *,
    gpus_per_node: Num | None = None, alpha_inter_s: Num | None = None, beta_inter_s_per_byte: Num | None = None,
) -> Num:
    """Two-level AllReduce over N = n/k nodes of k ranks, every phase a ring.

    ``t = RS_ring(k, S; a, b) + AR_ring(N, S/k; a', b') + AG_ring(k, S; a, b)``: reduce-scatter
    inside each node, all-reduce each 1/k slice across nodes (k of them at once, one per local
    rank, each on its own NIC share), all-gather inside the node.  With one node (k = n) it is
    the flat ring on the intra-node link; with one rank per node (k = 1) the flat ring on the
    inter-node link.  ``a, b`` are the intra-node alpha and beta, ``a', b'`` the inter-node ones
    (default: the same).

    References
    ----------
    REFERENCES.md "Hierarchical all-reduce over k GPUs per node and N nodes (a composition, not a
    published closed form)".
    """
    k, nodes, a2, b2 = _levels(n, gpus_per_node, alpha_inter_s, beta_inter_s_per_byte, alpha_s, beta_s_per_byte)
    g = gamma_s_per_byte
    intra = reducescatter_ring(k, message_bytes, alpha_s, beta_s_per_byte, g) + allgather_ring(k, message_bytes, alpha_s, beta_s_per_byte)
    inter = allreduce_ring(nodes, message_bytes / k, a2, b2, g)
    return _multi(n, intra + inter)


# --------------------------------------------------------------------------------------------
# AllGather (S = the gathered output)
# --------------------------------------------------------------------------------------------


@collective_time(
    CollectiveKind.ALL_GATHER, Algorithm.RING, bytes_sent=lambda n, s: _frac(n) * s, steps=lambda n: n - 1,
    pattern=Pattern.RING, formula="(n-1) a + ((n-1)/n) S b", family=AlgorithmFamily.RING,
)
def allgather_ring(n: Num, message_bytes: Num, alpha_s: Num, beta_s_per_byte: Num, gamma_s_per_byte: Num = 0.0) -> Num:
    """Ring AllGather: ``t = (n-1) alpha + ((n-1)/n) S beta`` (no reduction, gamma unused).

    ``message_bytes`` S is the gathered *output* (n x each rank's contribution), as in nccl-tests.

    References
    ----------
    Thakur, Rabenseifner, Gropp 2005, ring allgather (REFERENCES.md "AllGather ring").
    """
    return _multi(n, (n - 1) * alpha_s + _frac(n) * message_bytes * beta_s_per_byte)


@collective_time(
    CollectiveKind.ALL_GATHER, Algorithm.RECURSIVE_DOUBLING,
    bytes_sent=lambda n, s: (_frac(_pow2_split(n)[0]) + _pow2_split(n)[2]) * s, steps=_rd_steps,
    pattern=Pattern.LOG_GEOMETRIC, formula="(log2 p + 2e) a + ((p-1)/p + e) S b",
)
def allgather_recursive_doubling(n: Num, message_bytes: Num, alpha_s: Num, beta_s_per_byte: Num, gamma_s_per_byte: Num = 0.0) -> Num:
    """Recursive-doubling AllGather: ``t = (log2 p + 2e) alpha + ((p-1)/p + e) S beta``.

    For n = 2^k the table's ``log2(n) alpha + ((n-1)/n) S beta``.  Non-powers of two: each extra
    rank hands its block to a partner first and receives the whole output last.

    References
    ----------
    Thakur, Rabenseifner, Gropp 2005 (REFERENCES.md "AllGather recursive doubling / Bruck").
    """
    p, lg, e = _pow2_split(n)
    return _multi(n, (lg + 2 * e) * alpha_s + (_frac(p) + e) * message_bytes * beta_s_per_byte)


@collective_time(
    CollectiveKind.ALL_GATHER, Algorithm.BRUCK, bytes_sent=lambda n, s: _frac(n) * s, steps=_ceil_log2,
    pattern=Pattern.LOG_GEOMETRIC, formula="ceil(log2 n) a + ((n-1)/n) S b",
)
def allgather_bruck(n: Num, message_bytes: Num, alpha_s: Num, beta_s_per_byte: Num, gamma_s_per_byte: Num = 0.0) -> Num:
    """Bruck AllGather (any n): ``t = ceil(log2 n) alpha + ((n-1)/n) S beta``.

    The local rotations before and after are memory copies, not modelled.

    References
    ----------
    Bruck et al. 1997; Thakur, Rabenseifner, Gropp 2005 (REFERENCES.md "AllGather recursive
    doubling / Bruck").
    """
    return _multi(n, _ceil_log2(n) * alpha_s + _frac(n) * message_bytes * beta_s_per_byte)


@collective_time(
    CollectiveKind.ALL_GATHER, Algorithm.DIRECT, bytes_sent=lambda n, s: _frac(n) * s, steps=lambda n: 1,
    pattern=Pattern.ALL_CONCURRENT, formula="a + ((n-1)/n) S b",
)
def allgather_direct(n: Num, message_bytes: Num, alpha_s: Num, beta_s_per_byte: Num, gamma_s_per_byte: Num = 0.0) -> Num:
    """Direct AllGather: every rank sends its block to all n-1 peers at once.

    ``t = alpha + ((n-1)/n) S beta`` on one port (the latencies overlap); a fully connected
    topology divides beta by the n-1 links it drives.

    References
    ----------
    Hockney alpha-beta model (Thakur et al. 2005 Sec. 2) applied to n-1 concurrent sends.
    """
    return _multi(n, alpha_s + _frac(n) * message_bytes * beta_s_per_byte)


@collective_time(
    CollectiveKind.ALL_GATHER, Algorithm.HIERARCHICAL, bytes_sent=lambda n, s: _frac(n) * s, steps=lambda n: n - 1,
    pattern=None, formula="AG ring over N of S/k (a', b') + AG ring over k",
)
def allgather_hierarchical(
    n: Num, message_bytes: Num, alpha_s: Num, beta_s_per_byte: Num, gamma_s_per_byte: Num = 0.0, *,
    gpus_per_node: Num | None = None, alpha_inter_s: Num | None = None, beta_inter_s_per_byte: Num | None = None,
) -> Num:
    """Two-level AllGather: across nodes first (each local rank gathers its 1/k of the output),
    then inside each node: ``t = AG_ring(N, S/k; a', b') + AG_ring(k, S; a, b)``.

    References
    ----------
    Composition of Thakur et al. 2005 ring all-gathers, as for the hierarchical all-reduce.
    """
    k, nodes, a2, b2 = _levels(n, gpus_per_node, alpha_inter_s, beta_inter_s_per_byte, alpha_s, beta_s_per_byte)
    return _multi(n, allgather_ring(nodes, message_bytes / k, a2, b2) + allgather_ring(k, message_bytes, alpha_s, beta_s_per_byte))


# --------------------------------------------------------------------------------------------
# ReduceScatter (S = each rank's input)
# --------------------------------------------------------------------------------------------


@collective_time(
    CollectiveKind.REDUCE_SCATTER, Algorithm.RING, bytes_sent=lambda n, s: _frac(n) * s, steps=lambda n: n - 1,
    pattern=Pattern.RING, formula="(n-1) a + ((n-1)/n) S (b + g)", family=AlgorithmFamily.RING,
)
def reducescatter_ring(n: Num, message_bytes: Num, alpha_s: Num, beta_s_per_byte: Num, gamma_s_per_byte: Num = 0.0) -> Num:
    """Ring ReduceScatter: ``t = (n-1) alpha + ((n-1)/n) S (beta + gamma)``.

    ``message_bytes`` S is the *input* on each rank (n x each rank's output), as in nccl-tests.

    References
    ----------
    Thakur, Rabenseifner, Gropp 2005, pairwise/ring reduce-scatter (REFERENCES.md "ReduceScatter
    pairwise / ring").
    """
    return _multi(n, (n - 1) * alpha_s + _frac(n) * message_bytes * (beta_s_per_byte + gamma_s_per_byte))


@collective_time(
    CollectiveKind.REDUCE_SCATTER, Algorithm.PAIRWISE, bytes_sent=lambda n, s: _frac(n) * s, steps=lambda n: n - 1,
    pattern=Pattern.ALL_SEQUENTIAL, formula="(n-1) a + ((n-1)/n) S (b + g)",
)
def reducescatter_pairwise(n: Num, message_bytes: Num, alpha_s: Num, beta_s_per_byte: Num, gamma_s_per_byte: Num = 0.0) -> Num:
    """Pairwise-exchange ReduceScatter: in step j each rank sends the block of rank (r + j) mod n.

    ``t = (n-1) alpha + ((n-1)/n) S (beta + gamma)`` -- the ring's cost on a uniform network, but
    with one distinct peer per step (a different pattern on rings and meshes).

    References
    ----------
    Thakur, Rabenseifner, Gropp 2005 (REFERENCES.md "ReduceScatter pairwise / ring").
    """
    return _multi(n, (n - 1) * alpha_s + _frac(n) * message_bytes * (beta_s_per_byte + gamma_s_per_byte))


@collective_time(
    CollectiveKind.REDUCE_SCATTER, Algorithm.RECURSIVE_HALVING,
    bytes_sent=lambda n, s: (_frac(_pow2_split(n)[0]) + _pow2_split(n)[2]) * s, steps=_rd_steps,
    pattern=Pattern.LOG_GEOMETRIC, formula="(log2 p + 2e) a + ((p-1)/p + e (1 + 1/n)) S b + ((p-1)/p + e) S g",
)
def reducescatter_recursive_halving(n: Num, message_bytes: Num, alpha_s: Num, beta_s_per_byte: Num, gamma_s_per_byte: Num = 0.0) -> Num:
    """Recursive-halving ReduceScatter.

    ``t = (log2 p + 2e) alpha + ((p-1)/p + e (1 + 1/n)) S beta + ((p-1)/p + e) S gamma``; for
    n = 2^k the table's ``log2(n) alpha + ((n-1)/n) S (beta + gamma)``.  Non-powers of two: each
    extra rank sends its whole input to a partner (reduced there) and gets its S/n block back.

    References
    ----------
    Thakur, Rabenseifner, Gropp 2005 (REFERENCES.md "ReduceScatter recursive halving (n = 2^k)").
    """
    p, lg, e = _pow2_split(n)
    fp, s = _frac(p), message_bytes
    return _multi(n, (lg + 2 * e) * alpha_s + (fp + e * (1 + 1 / n)) * s * beta_s_per_byte + (fp + e) * s * gamma_s_per_byte)


@collective_time(
    CollectiveKind.REDUCE_SCATTER, Algorithm.DIRECT, bytes_sent=lambda n, s: _frac(n) * s, steps=lambda n: 1,
    pattern=Pattern.ALL_CONCURRENT, formula="a + ((n-1)/n) S (b + g)",
)
def reducescatter_direct(n: Num, message_bytes: Num, alpha_s: Num, beta_s_per_byte: Num, gamma_s_per_byte: Num = 0.0) -> Num:
    """Direct ReduceScatter: every rank sends each peer its block at once and reduces what arrives.

    ``t = alpha + ((n-1)/n) S (beta + gamma)``.

    References
    ----------
    Hockney alpha-beta model (Thakur et al. 2005 Sec. 2) applied to n-1 concurrent sends.
    """
    return _multi(n, alpha_s + _frac(n) * message_bytes * (beta_s_per_byte + gamma_s_per_byte))


@collective_time(
    CollectiveKind.REDUCE_SCATTER, Algorithm.HIERARCHICAL, bytes_sent=lambda n, s: _frac(n) * s, steps=lambda n: n - 1,
    pattern=None, formula="RS ring over k + RS ring over N of S/k (a', b')",
)
def reducescatter_hierarchical(
    n: Num, message_bytes: Num, alpha_s: Num, beta_s_per_byte: Num, gamma_s_per_byte: Num = 0.0, *,
    gpus_per_node: Num | None = None, alpha_inter_s: Num | None = None, beta_inter_s_per_byte: Num | None = None,
) -> Num:
    """Two-level ReduceScatter: inside each node first, then across nodes on the 1/k slices:
    ``t = RS_ring(k, S; a, b) + RS_ring(N, S/k; a', b')``.

    References
    ----------
    Composition of Thakur et al. 2005 ring reduce-scatters.
    """
    k, nodes, a2, b2 = _levels(n, gpus_per_node, alpha_inter_s, beta_inter_s_per_byte, alpha_s, beta_s_per_byte)
    g = gamma_s_per_byte
    return _multi(n, reducescatter_ring(k, message_bytes, alpha_s, beta_s_per_byte, g) + reducescatter_ring(nodes, message_bytes / k, a2, b2, g))


# --------------------------------------------------------------------------------------------
# Broadcast and Reduce (S = the buffer)
# --------------------------------------------------------------------------------------------


def _whole_buffer(n: Num, s: Num) -> Num:
    return _multi(n, 1.0 * s)


@collective_time(
    CollectiveKind.BROADCAST, Algorithm.RING, bytes_sent=_whole_buffer, steps=lambda n: n - 1, pattern=Pattern.RING,
    formula="(n-1) a + S b", family=AlgorithmFamily.RING,
)
def broadcast_ring(n: Num, message_bytes: Num, alpha_s: Num, beta_s_per_byte: Num, gamma_s_per_byte: Num = 0.0) -> Num:
    """Pipelined ring (chain) Broadcast, NCCL's algorithm: ``t = (n-1) alpha + S beta``.

    The root streams the buffer in chunks down a chain of n ranks: the first chunk needs n-1
    hops (the latency term), and in the many-chunk limit every link carries S once (the
    bandwidth term; nccl-tests: "all data has to get out of the root rank", t = S/B).  Per-chunk
    latency is not modelled.

    References
    ----------
    NVIDIA nccl-tests doc/PERFORMANCE.md, Broadcast (t = S/B, busbw factor 1); NCCL tuning.cc
    (Broadcast runs only as a ring).
    """
    return _multi(n, (n - 1) * alpha_s + message_bytes * beta_s_per_byte)


@collective_time(
    CollectiveKind.BROADCAST, Algorithm.BINOMIAL_TREE, bytes_sent=lambda n, s: _ceil_log2(n) * s, steps=_ceil_log2,
    pattern=Pattern.LOG_EQUAL, formula="ceil(log2 n) (a + S b)",
)
def broadcast_binomial_tree(n: Num, message_bytes: Num, alpha_s: Num, beta_s_per_byte: Num, gamma_s_per_byte: Num = 0.0) -> Num:
    """Binomial-tree Broadcast: ``t = ceil(log2 n) (alpha + S beta)`` (MPICH's short-message choice).

    References
    ----------
    Thakur, Rabenseifner, Gropp 2005, binomial-tree broadcast (REFERENCES.md "Broadcast binomial
    tree"); ceil for n not a power of two.
    """
    return _multi(n, _ceil_log2(n) * (alpha_s + message_bytes * beta_s_per_byte))


@collective_time(
    CollectiveKind.BROADCAST, Algorithm.SCATTER_ALLGATHER, bytes_sent=lambda n, s: 2 * _frac(n) * s,
    steps=lambda n: 2 * _ceil_log2(n), pattern=Pattern.LOG_GEOMETRIC, formula="2 ceil(log2 n) a + 2((n-1)/n) S b",
)
def broadcast_scatter_allgather(n: Num, message_bytes: Num, alpha_s: Num, beta_s_per_byte: Num, gamma_s_per_byte: Num = 0.0) -> Num:
    """Scatter + allgather Broadcast (van de Geijn): ``t = 2 ceil(log2 n) alpha + 2((n-1)/n) S beta``.

    A binomial scatter of the n blocks, then a recursive-doubling (Bruck for non-powers of two)
    all-gather; for n = 2^k the table's ``2 log2(n) alpha + 2((n-1)/n) S beta``.

    References
    ----------
    Thakur, Rabenseifner, Gropp 2005 (REFERENCES.md "Broadcast scatter + allgather").
    """
    return _multi(n, 2 * _ceil_log2(n) * alpha_s + 2 * _frac(n) * message_bytes * beta_s_per_byte)


@collective_time(
    CollectiveKind.BROADCAST, Algorithm.HIERARCHICAL, bytes_sent=_whole_buffer, steps=lambda n: n - 1, pattern=None,
    formula="chain over N (a', b') + chain over k",
)
def broadcast_hierarchical(
    n: Num, message_bytes: Num, alpha_s: Num, beta_s_per_byte: Num, gamma_s_per_byte: Num = 0.0, *,
    gpus_per_node: Num | None = None, alpha_inter_s: Num | None = None, beta_inter_s_per_byte: Num | None = None,
) -> Num:
    """Two-level Broadcast: along the nodes, then inside each: ``t = BC_ring(N, S; a', b') + BC_ring(k, S; a, b)``.

    References
    ----------
    Composition of the pipelined chain broadcasts (nccl-tests doc/PERFORMANCE.md).
    """
    k, nodes, a2, b2 = _levels(n, gpus_per_node, alpha_inter_s, beta_inter_s_per_byte, alpha_s, beta_s_per_byte)
    return _multi(n, broadcast_ring(nodes, message_bytes, a2, b2) + broadcast_ring(k, message_bytes, alpha_s, beta_s_per_byte))


@collective_time(
    CollectiveKind.REDUCE, Algorithm.RING, bytes_sent=_whole_buffer, steps=lambda n: n - 1, pattern=Pattern.RING,
    formula="(n-1) a + S (b + g)", family=AlgorithmFamily.RING,
)
def reduce_ring(n: Num, message_bytes: Num, alpha_s: Num, beta_s_per_byte: Num, gamma_s_per_byte: Num = 0.0) -> Num:
    """Pipelined ring (chain) Reduce toward the root: ``t = (n-1) alpha + S (beta + gamma)``.

    The mirror image of :func:`broadcast_ring`: partial sums stream along a chain ending at the
    root, each link carrying S once and each rank reducing S once.

    References
    ----------
    NVIDIA nccl-tests doc/PERFORMANCE.md, Reduce (t = S/B, busbw factor 1); NCCL tuning.cc
    (Reduce runs only as a ring).
    """
    return _multi(n, (n - 1) * alpha_s + message_bytes * (beta_s_per_byte + gamma_s_per_byte))


@collective_time(
    CollectiveKind.REDUCE, Algorithm.BINOMIAL_TREE, bytes_sent=_whole_buffer, steps=_ceil_log2, pattern=Pattern.LOG_EQUAL,
    formula="ceil(log2 n) (a + S (b + g))",
)
def reduce_binomial_tree(n: Num, message_bytes: Num, alpha_s: Num, beta_s_per_byte: Num, gamma_s_per_byte: Num = 0.0) -> Num:
    """Binomial-tree Reduce: ``t = ceil(log2 n) (alpha + S (beta + gamma))``.

    References
    ----------
    Thakur, Rabenseifner, Gropp 2005 Sec. 4.5 (binomial tree for short messages; the mirror of the
    broadcast).
    """
    return _multi(n, _ceil_log2(n) * (alpha_s + message_bytes * (beta_s_per_byte + gamma_s_per_byte)))


@collective_time(
    CollectiveKind.REDUCE, Algorithm.RABENSEIFNER,
    bytes_sent=lambda n, s: 2 * _frac(_pow2_split(n)[0]) * s + _pow2_split(n)[2] * s,
    steps=lambda n: 2 * _pow2_split(n)[1] + _pow2_split(n)[2], pattern=Pattern.LOG_GEOMETRIC,
    formula="2 log2(p) a + 2((p-1)/p) S b + ((p-1)/p) S g + e (a + S b + S g)",
)
def reduce_rabenseifner(n: Num, message_bytes: Num, alpha_s: Num, beta_s_per_byte: Num, gamma_s_per_byte: Num = 0.0) -> Num:
    """Rabenseifner Reduce: recursive-halving ReduceScatter, then a binomial gather to the root.

    ``t = 2 log2(p) alpha + 2((p-1)/p) S beta + ((p-1)/p) S gamma + e (alpha + S beta + S gamma)``
    (non-powers of two: one extra step in which the n - p extra ranks hand their buffers over).

    References
    ----------
    Thakur, Rabenseifner, Gropp 2005 Sec. 4.5 (Rabenseifner's reduce, long messages).
    """
    p, lg, e = _pow2_split(n)
    fp, s = _frac(p), message_bytes
    core = 2 * lg * alpha_s + 2 * fp * s * beta_s_per_byte + fp * s * gamma_s_per_byte
    return _multi(n, core + e * (alpha_s + s * (beta_s_per_byte + gamma_s_per_byte)))


@collective_time(
    CollectiveKind.REDUCE, Algorithm.HIERARCHICAL, bytes_sent=_whole_buffer, steps=lambda n: n - 1, pattern=None,
    formula="chain over k + chain over N (a', b')",
)
def reduce_hierarchical(
    n: Num, message_bytes: Num, alpha_s: Num, beta_s_per_byte: Num, gamma_s_per_byte: Num = 0.0, *,
    gpus_per_node: Num | None = None, alpha_inter_s: Num | None = None, beta_inter_s_per_byte: Num | None = None,
) -> Num:
    """Two-level Reduce: inside each node, then across the nodes:
    ``t = RE_ring(k, S; a, b) + RE_ring(N, S; a', b')``.

    References
    ----------
    Composition of the pipelined chain reduces (nccl-tests doc/PERFORMANCE.md).
    """
    k, nodes, a2, b2 = _levels(n, gpus_per_node, alpha_inter_s, beta_inter_s_per_byte, alpha_s, beta_s_per_byte)
    g = gamma_s_per_byte
    return _multi(n, reduce_ring(k, message_bytes, alpha_s, beta_s_per_byte, g) + reduce_ring(nodes, message_bytes, a2, b2, g))


# --------------------------------------------------------------------------------------------
# AllToAll (S = everything a rank sends, its own block included) and SendRecv
# --------------------------------------------------------------------------------------------


@collective_time(
    CollectiveKind.ALL_TO_ALL, Algorithm.PAIRWISE, bytes_sent=lambda n, s: _frac(n) * s, steps=lambda n: n - 1,
    pattern=Pattern.ALL_SEQUENTIAL, formula="(n-1) a + M b, M = ((n-1)/n) S",
)
def alltoall_pairwise(n: Num, message_bytes: Num, alpha_s: Num, beta_s_per_byte: Num, gamma_s_per_byte: Num = 0.0) -> Num:
    """Pairwise-exchange AllToAll: ``t = (n-1) alpha + ((n-1)/n) S beta``.

    In n-1 steps each rank sends one S/n block to a different peer.  Thakur et al. write
    ``(n-1) alpha + M beta`` with M = the bytes a rank sends to *other* ranks; with the nccl-tests
    convention used here (S includes the rank's own block) M = ((n-1)/n) S, which is also why the
    nccl-tests busbw factor is (n-1)/n.

    References
    ----------
    Thakur, Rabenseifner, Gropp 2005, pairwise all-to-all (REFERENCES.md "AllToAll pairwise");
    nccl-tests doc/PERFORMANCE.md (AlltoAll factor (n-1)/n).
    """
    return _multi(n, (n - 1) * alpha_s + _frac(n) * message_bytes * beta_s_per_byte)


@collective_time(
    CollectiveKind.ALL_TO_ALL, Algorithm.BRUCK, bytes_sent=lambda n, s: _multi(n, _ceil_log2(n) * s / 2),
    steps=_ceil_log2, pattern=Pattern.LOG_EQUAL, formula="ceil(log2 n) a + (S/2) ceil(log2 n) b",
)
def alltoall_bruck(n: Num, message_bytes: Num, alpha_s: Num, beta_s_per_byte: Num, gamma_s_per_byte: Num = 0.0) -> Num:
    """Bruck AllToAll: ``t = ceil(log2 n) alpha + (S/2) ceil(log2 n) beta``.

    In step k every rank forwards the blocks whose index has bit k set: n/2 blocks of S/n, i.e.
    half its buffer (its own block included, the nccl-tests S).  This is the table's ``log2(n)
    alpha + (M/2) log2(n) beta`` with M the rank's whole all-to-all buffer; reading M as the
    bytes bound for *other* ranks, ((n-1)/n) S, would send less than the pairwise exchange for
    n = 2, below the bandwidth bound.  Fewer messages than the pairwise exchange, log2(n)/2 times
    the bytes.

    References
    ----------
    Bruck et al. 1997; Thakur, Rabenseifner, Gropp 2005 (REFERENCES.md "AllToAll Bruck").
    """
    lg = _ceil_log2(n)
    return _multi(n, lg * alpha_s + message_bytes / 2 * lg * beta_s_per_byte)


@collective_time(
    CollectiveKind.ALL_TO_ALL, Algorithm.DIRECT, bytes_sent=lambda n, s: _frac(n) * s, steps=lambda n: 1,
    pattern=Pattern.ALL_CONCURRENT, formula="a + M b, M = ((n-1)/n) S",
)
def alltoall_direct(n: Num, message_bytes: Num, alpha_s: Num, beta_s_per_byte: Num, gamma_s_per_byte: Num = 0.0) -> Num:
    """Direct AllToAll (NCCL: all sends and receives posted in one group): ``t = alpha + M beta``.

    The n-1 sends share the rank's port and their latencies overlap; a fully connected topology
    divides beta by the n-1 links.

    References
    ----------
    NCCL ncclAllToAll = grouped ncclSend/ncclRecv (nccl-tests alltoall); Hockney alpha-beta model.
    """
    return _multi(n, alpha_s + _frac(n) * message_bytes * beta_s_per_byte)


@collective_time(
    CollectiveKind.ALL_TO_ALL, Algorithm.HIERARCHICAL, bytes_sent=lambda n, s: 2 * _frac(n) * s, steps=lambda n: n - 1,
    pattern=None, formula="A2A pairwise over k + A2A pairwise over N (a', b')",
)
def alltoall_hierarchical(
    n: Num, message_bytes: Num, alpha_s: Num, beta_s_per_byte: Num, gamma_s_per_byte: Num = 0.0, *,
    gpus_per_node: Num | None = None, alpha_inter_s: Num | None = None, beta_inter_s_per_byte: Num | None = None,
) -> Num:
    """Two-level AllToAll: exchange inside the node (regrouping blocks by destination node), then
    across nodes: ``t = A2A_pairwise(k, S; a, b) + A2A_pairwise(N, S; a', b')``.  Each rank sends
    ((N-1)/N) S across nodes, as much as a flat exchange, in N-1 instead of n-k messages.

    References
    ----------
    Composition of Thakur et al. 2005 pairwise exchanges (two-phase all-to-all).
    """
    k, nodes, a2, b2 = _levels(n, gpus_per_node, alpha_inter_s, beta_inter_s_per_byte, alpha_s, beta_s_per_byte)
    return _multi(n, alltoall_pairwise(k, message_bytes, alpha_s, beta_s_per_byte) + alltoall_pairwise(nodes, message_bytes, a2, b2))


@collective_time(
    CollectiveKind.SEND_RECV, Algorithm.DIRECT, bytes_sent=_whole_buffer, steps=lambda n: 1, pattern=Pattern.POINT,
    formula="a + S b",
)
def sendrecv_direct(n: Num, message_bytes: Num, alpha_s: Num, beta_s_per_byte: Num, gamma_s_per_byte: Num = 0.0) -> Num:
    """Point-to-point: every rank sends S bytes to one peer at once, ``t = alpha + S beta``.

    n = 2 is a plain send/receive (a pipeline hand-off); larger n is a ring shift as in
    nccl-tests ``sendrecv_perf`` -- every link carries S, so the time does not depend on n.

    References
    ----------
    Hockney's alpha-beta point-to-point model as used by Thakur, Rabenseifner, Gropp 2005 Sec. 2;
    nccl-tests doc/PERFORMANCE.md (SendRecv busbw factor 1).
    """
    return _multi(n, alpha_s + message_bytes * beta_s_per_byte)


#: The algorithm :func:`collective_cost` uses when none is given (NCCL's only or usual choice).
DEFAULT_ALGORITHMS: Mapping[CollectiveKind, Algorithm] = MappingProxyType(
    {
        CollectiveKind.ALL_REDUCE: Algorithm.RING,
        CollectiveKind.ALL_GATHER: Algorithm.RING,
        CollectiveKind.REDUCE_SCATTER: Algorithm.RING,
        CollectiveKind.BROADCAST: Algorithm.RING,
        CollectiveKind.REDUCE: Algorithm.RING,
        CollectiveKind.ALL_TO_ALL: Algorithm.PAIRWISE,
        CollectiveKind.SEND_RECV: Algorithm.DIRECT,
    }
)


def busbw_factor(kind: CollectiveKind, n: Num) -> Num:
    """nccl-tests bus-bandwidth factor: busbw = algbw x factor.

    AllReduce 2(n-1)/n; ReduceScatter, AllGather, AllToAll (n-1)/n; Broadcast, Reduce, SendRecv 1.

    References
    ----------
    NVIDIA nccl-tests doc/PERFORMANCE.md, "Summary".
    """
    if kind is CollectiveKind.ALL_REDUCE:
        return 2 * (n - 1) / n
    if kind in (CollectiveKind.REDUCE_SCATTER, CollectiveKind.ALL_GATHER, CollectiveKind.ALL_TO_ALL):
        return (n - 1) / n
    return np.ones_like(n, dtype=float) if isinstance(n, np.ndarray) else 1.0


def kernel_bytes(kind: CollectiveKind, n: Num, message_bytes: Num) -> Num:
    """Bytes of user buffer one GPU reads plus writes, halved: what the kernel term delta multiplies.

    An AllReduce reads its S input and writes its S output: S, the normalisation in which delta
    was calibrated (hardware/cluster.py).  ReduceScatter reads S and writes S/n, AllGather the
    reverse: (S + S/n)/2; Broadcast and Reduce (the root) read S and write S, or a relay writes
    S: S; a SendRecv ring shift reads S and writes S: S.  An AllToAll moves only the blocks bound
    for the n - 1 peers through the communication kernel, ((n-1)/n) S: the block a rank keeps is
    a local copy (NCCL runs AllToAll as grouped sends and receives, one per peer; the send to
    itself is a device-memory copy that takes no link).  Fitted check: the H100 all-to-all rows of
    the bundled OpenXLA table, whose large-message slope per byte is ((n-1)/n)(1/B + delta) within
    10 % for n = 2, 4, 8 (benchmarks/fit_h100_collectives.py), where S delta overshot n = 2 by 29 %.
    """
    s = message_bytes
    if kind in (CollectiveKind.REDUCE_SCATTER, CollectiveKind.ALL_GATHER):
        return (s + s / n) / 2
    if kind is CollectiveKind.ALL_TO_ALL:
        return s * (n - 1) / n
    return s


def reduced_block_bytes(kind: CollectiveKind, n: Num, message_bytes: Num) -> Num:
    """Bytes of the reduced block one GPU writes to its output: what the reduction term rho
    (:attr:`Link.reduce_s_per_byte`) multiplies.

    S/n for a ReduceScatter (its output) and for an AllReduce whose GPUs reduce (the block its
    reduce-scatter half leaves on each rank); 0 for every other kind and for an AllReduce
    reduced in the switch (the caller passes no rho there).  The form is empirical: on the
    bundled H100 table the ReduceScatter / AllGather time gap at 512 MiB-2 GiB is 1.2-1.4 ps per
    byte of S/n for n = 2, 4 and 8 alike, not per byte of the ((n-1)/n) S a ring reduces (the
    textbook gamma term, Thakur et al. 2005), which would make it grow with n where it shrinks
    (hardware/cluster.py NVLINK4_NVSWITCH_H100 ``reduce_s_per_byte``).
    """
    if kind in (CollectiveKind.REDUCE_SCATTER, CollectiveKind.ALL_REDUCE):
        return message_bytes / n
    return message_bytes * 0


def bandwidth_lower_bound_s(kind: CollectiveKind, n: int, message_bytes: float, link: Link, *, in_network: bool = False) -> float:
    """The best possible time on ``link`` whatever the algorithm: ``S x factor / (B x efficiency)``.

    This is nccl-tests' "perfect" time (each rank's link busy the whole time, no latency); no
    collective in this module beats it (property-tested).  With ``in_network`` (the switch
    reduces) an AllReduce needs only ``S / B``: each rank must still send and receive its buffer
    once.  0 for n = 1.
    """
    if n <= 1:
        return 0.0
    if in_network and kind is CollectiveKind.ALL_REDUCE:
        return message_bytes * link.beta_s_per_byte
    return message_bytes * busbw_factor(kind, n) * link.beta_s_per_byte


@dataclass(frozen=True, slots=True)
class CollectiveCost:
    """Cost of one collective on one group.

    Attributes
    ----------
    kind, algorithm
        What ran (``algorithm`` is an :class:`Algorithm` value such as ``"ring"``).
    n
        Ranks in the group.
    message_bytes
        S in the nccl-tests convention (module docstring).
    bytes_sent_per_gpu
        Bytes the busiest GPU puts on its links.
    time_s
        Seconds.
    algbw_bytes_per_s, busbw_bytes_per_s
        S / time and algbw x :func:`busbw_factor`; 0 when nothing moves (n = 1 or S = 0).
    link
        Name of the link class it was costed on (several joined by ``" + "``).
    steps
        Sequential message steps (the number of alphas paid).
    limiting_link
        The level whose bandwidth term is largest (the bottleneck), e.g.
        ``"inter-node: InfiniBand HDR 200 Gb/s (8 per node, 8 GPUs)"``.
    formula
        The formula with its symbols filled in, one ``;``-separated part per phase.
    protocol
        NCCL protocol (``"ll"``, ``"ll128"``, ``"simple"``); ``"simple"`` for the textbook model.
    alternatives
        ``(algorithm, time_s)`` of every candidate that was costed, fastest first.
    """

    kind: CollectiveKind
    algorithm: str
    n: int
    message_bytes: float
    bytes_sent_per_gpu: float
    time_s: float
    algbw_bytes_per_s: float
    busbw_bytes_per_s: float
    link: str
    steps: int = 0
    limiting_link: str = ""
    formula: str = ""
    protocol: str = "simple"
    alternatives: tuple[tuple[str, float], ...] = ()

    def to_dict(self) -> dict[str, object]:
        """Plain-data view (enum as its NCCL-style name)."""
        return {
            "kind": self.kind.value,
            "algorithm": self.algorithm,
            "group_size": self.n,
            "message_bytes": self.message_bytes,
            "bytes_sent_per_gpu": self.bytes_sent_per_gpu,
            "time_s": self.time_s,
            "algbw_bytes_per_s": self.algbw_bytes_per_s,
            "busbw_bytes_per_s": self.busbw_bytes_per_s,
            "link": self.link,
            "steps": self.steps,
            "limiting_link": self.limiting_link,
            "formula": self.formula,
            "protocol": self.protocol,
            "alternatives": {a: t for a, t in self.alternatives},
        }


def check_group_size(kind: CollectiveKind, n: object) -> int:
    """``n`` as an int >= 1, else a ConfigError naming ``kind``."""
    try:
        size = operator.index(n)  # type: ignore[arg-type]
    except TypeError:
        size = 0
    if isinstance(n, bool) or size < 1:
        raise ConfigError(f"{kind.value}: group size must be a positive integer, got {n!r}")
    return size


def check_message_bytes(kind: CollectiveKind, message_bytes: object) -> float:
    """``message_bytes`` as a finite float >= 0, else a ConfigError naming ``kind``."""
    try:
        value = float(message_bytes)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        value = math.nan
    if isinstance(message_bytes, bool) or not (math.isfinite(value) and value >= 0):
        raise ConfigError(f"{kind.value}: message_bytes must be a finite number >= 0, got {message_bytes!r}")
    return value


def fill_formula(rule: AlgorithmRule, n: float, size: float, alpha: float, beta: float, gamma: float) -> str:
    """``rule.formula`` with its symbols' values, e.g. ``"2(n-1) a + ... with n=8, S=1.07e+09 B, ..."``."""
    bw = f"1/({1 / beta / 1e9:.4g} GB/s)" if beta > 0 else "0"
    g = f", g={gamma:.3g} s/B" if gamma else ""
    return f"{rule.formula} with n={n:g}, S={size:.6g} B, a={fmt_s(alpha, sig=4) if alpha else 0}, b={bw}{g}"


def collective_cost(
    kind: CollectiveKind,
    n: int,
    message_bytes: float,
    link: Link,
    *,
    algorithm: Algorithm | None = None,
    gamma_s_per_byte: float = 0.0,
) -> CollectiveCost:
    """Cost of ``kind`` over ``n`` ranks joined by one ``link`` (a uniform network: every partner one hop).

    ``time = formula(n, S, alpha, beta, gamma) + delta K`` with alpha = ``link.latency_s``, beta =
    ``link.beta_s_per_byte``, delta = ``link.kernel_s_per_byte`` (0 unless calibrated) and K =
    :func:`kernel_bytes` (S for an AllReduce).  For
    the costs of a real group on a cluster (several link classes, NCCL protocols, the fastest
    algorithm) use :func:`dml2comm.network.model.collective_cost_for_group`.

    Parameters
    ----------
    kind
        The collective.
    n
        Ranks in the group (>= 1).
    message_bytes
        S, nccl-tests convention (module docstring), >= 0.
    link
        Supplies alpha, beta and delta.
    algorithm
        Default :data:`DEFAULT_ALGORITHMS` [kind].  ``hierarchical`` on one link is its one-node
        case (the flat ring).
    gamma_s_per_byte
        Reduction time per byte (>= 0); 0 by default (module docstring).

    Returns
    -------
    CollectiveCost

    Raises
    ------
    ConfigError
        Bad n, S or gamma, or no function registered for (kind, algorithm) -- the message names
        the registered algorithms and where to add one.
    """
    n = check_group_size(kind, n)
    size = check_message_bytes(kind, message_bytes)
    if not (math.isfinite(gamma_s_per_byte) and gamma_s_per_byte >= 0):
        raise ConfigError(f"gamma_s_per_byte must be a finite number >= 0, got {gamma_s_per_byte!r}")
    chosen = DEFAULT_ALGORITHMS[kind] if algorithm is None else algorithm
    rule = get_rule(kind, chosen)  # a two-level closed form on one link is its one-node case
    alpha, beta = link.latency_s, link.beta_s_per_byte
    if rule.pattern is Pattern.IN_NETWORK:
        if link.in_network_efficiency is None:
            raise ConfigError(f"{chosen.value} needs a switch that reduces; {link.name!r} has no in_network_efficiency")
        beta = 1.0 / (link.bandwidth_bytes_per_s * link.in_network_efficiency)
    time_s = float(rule.time_s(n, size, alpha, beta, gamma_s_per_byte))
    if n > 1:
        time_s += link.kernel_s_per_byte * kernel_bytes(kind, n, size)
        if rule.pattern is not Pattern.IN_NETWORK:
            time_s += link.reduce_s_per_byte * float(reduced_block_bytes(kind, n, size))
    sent = float(rule.bytes_sent_per_gpu(n, size)) if n > 1 else 0.0
    moving = n > 1 and size > 0 and time_s > 0
    algbw = size / time_s if moving else 0.0
    return CollectiveCost(
        kind=kind,
        algorithm=chosen.value,
        n=n,
        message_bytes=size,
        bytes_sent_per_gpu=sent,
        time_s=time_s,
        algbw_bytes_per_s=algbw,
        busbw_bytes_per_s=algbw * busbw_factor(kind, n),
        link=link.name,
        steps=int(rule.steps(n)) if n > 1 else 0,
        limiting_link=link.name if n > 1 else "",
        formula=_formula_text(rule, kind, n, size, alpha, beta, gamma_s_per_byte, link),
    )


def _formula_text(rule: AlgorithmRule, kind: CollectiveKind, n: int, size: float, alpha: float, beta: float, gamma: float,
                  link: Link) -> str:
    """:func:`collective_cost`'s formula with the numbers filled in, plus its calibrated kernel
    (K d) and reduced-block (R r) terms when the link has them."""
    return fill_formula(rule, n, size, alpha, beta, gamma) + (
        f" + K d (K = {float(kernel_bytes(kind, n, size)):.6g} B, d = {link.kernel_s_per_byte * 1e12:.4g} ps/B)"
        if link.kernel_s_per_byte else ""
    ) + (
        f" + R r (R = {float(reduced_block_bytes(kind, n, size)):.6g} B, r = {link.reduce_s_per_byte * 1e12:.4g} ps/B)"
        if link.reduce_s_per_byte and rule.pattern is not Pattern.IN_NETWORK and float(reduced_block_bytes(kind, n, size))
        else ""
    )


def collective_time_vec(
    kind: CollectiveKind,
    algorithm: Algorithm,
    n: Any,
    message_bytes: Any,
    alpha_s: Any,
    beta_s_per_byte: Any,
    gamma_s_per_byte: Any = 0.0,
    *,
    base_latency_s: Any = 0.0,
    kernel_s_per_byte: Any = 0.0,
    reduce_s_per_byte: Any = 0.0,
    **levels: Any,
) -> np.ndarray:
    """Vectorised time of (kind, algorithm) for arrays of group sizes and message sizes (seconds).

    ``t = base + formula(n, S, alpha, beta, gamma) + delta K + rho R`` elementwise (0 where n <= 1;
    K = :func:`kernel_bytes`, S for an AllReduce; R = :func:`reduced_block_bytes`, 0 for an
    in-network algorithm), all
    arguments broadcast against each other.  ``levels`` go to the two-level closed forms
    (``gpus_per_node``, ``alpha_inter_s``, ``beta_inter_s_per_byte``).  No validation: this is the
    inner loop of configuration search (about 10^7 evaluations per second, see
    benchmarks/bench_collectives.py); validate at the boundary.
    """
    rule = get_rule(kind, algorithm)
    n_arr = np.asarray(n, dtype=float)
    s_arr = np.asarray(message_bytes, dtype=float)
    t = rule.time_s(n_arr, s_arr, np.asarray(alpha_s, dtype=float), np.asarray(beta_s_per_byte, dtype=float),
                    np.asarray(gamma_s_per_byte, dtype=float), **levels)
    extra = np.asarray(base_latency_s, dtype=float) + np.asarray(kernel_s_per_byte, dtype=float) * kernel_bytes(kind, n_arr, s_arr)
    if rule.pattern is not Pattern.IN_NETWORK:
        extra = extra + np.asarray(reduce_s_per_byte, dtype=float) * reduced_block_bytes(kind, n_arr, s_arr)
    return np.where(n_arr > 1, t + extra, 0.0)
