"""Alpha-beta cost of collectives: one small function per (collective, algorithm).

This is the baseline model: ring algorithms (plus pairwise AllToAll, point-to-point SendRecv and
a binomial-tree Broadcast), each costed with the textbook alpha-beta formula of Thakur,
Rabenseifner and Gropp (2005) over a single :class:`~dml2comm.hardware.cluster.Link`.  Trees,
halving-doubling, hierarchical and in-network algorithms register further functions the same way
(:func:`collective_time`), without touching the ones here.

Symbols (SI units)
------------------
n
    Ranks in the group.
S
    ``message_bytes``, the buffer size as nccl-tests reports it: the AllReduce buffer; the
    *output* of AllGather (n x the per-rank input); the *input* of ReduceScatter (n x the
    per-rank output); the Broadcast/Reduce buffer; for AllToAll the total a rank sends,
    *including* the 1/n share it keeps for itself (``sendcount * n * sizeof``); for SendRecv the
    bytes each rank sends to its peer.
alpha
    Per-message latency in seconds (:attr:`Link.latency_s`).
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
NVIDIA nccl-tests, doc/PERFORMANCE.md (algbw, busbw and the size conventions above).
NVIDIA NCCL src/graph/tuning.cc (ring step counts: 2(n-1) for AllReduce, n-1 for AllGather and
ReduceScatter).
"""

from __future__ import annotations

import enum
import math
import operator
from dataclasses import dataclass
from types import MappingProxyType
from typing import Callable, Mapping

from dml2comm.errors import ConfigError, RegistryError
from dml2comm.hardware.cluster import Link
from dml2comm.network.kinds import CollectiveKind

__all__ = [
    "Algorithm",
    "CollectiveCost",
    "DEFAULT_ALGORITHMS",
    "AlgorithmRule",
    "allgather_ring",
    "allreduce_ring",
    "alltoall_pairwise",
    "bandwidth_lower_bound_s",
    "broadcast_binomial_tree",
    "broadcast_ring",
    "busbw_factor",
    "collective_cost",
    "collective_time",
    "reduce_ring",
    "reducescatter_ring",
    "registered_algorithms",
    "sendrecv_direct",
]


class Algorithm(enum.Enum):
    """Collective algorithms (values as written in data.json ``collectives[].algorithm``)."""

    RING = "ring"
    PAIRWISE = "pairwise"
    DIRECT = "direct"
    BINOMIAL_TREE = "binomial_tree"


TimeFn = Callable[[int, float, float, float, float], float]
BytesFn = Callable[[int, float], float]


@dataclass(frozen=True, slots=True)
class AlgorithmRule:
    """A registered (collective, algorithm): its time formula and the bytes one GPU sends."""

    kind: CollectiveKind
    algorithm: Algorithm
    time_s: TimeFn  # (n, S, alpha, beta, gamma) -> seconds
    bytes_sent_per_gpu: BytesFn  # (n, S) -> bytes the busiest GPU puts on its link
    home: str  # module.function, for error messages


_RULES: dict[tuple[CollectiveKind, Algorithm], AlgorithmRule] = {}


def collective_time(kind: CollectiveKind, algorithm: Algorithm, *, bytes_sent: BytesFn) -> Callable[[TimeFn], TimeFn]:
    """Register ``fn(n, S, alpha, beta, gamma) -> seconds`` for (kind, algorithm).

    Parameters
    ----------
    kind, algorithm
        What the function costs.
    bytes_sent
        ``(n, S) -> bytes`` the busiest GPU sends under this algorithm.

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
        _RULES[key] = AlgorithmRule(kind, algorithm, fn, bytes_sent, home)
        return fn

    return register


def registered_algorithms(kind: CollectiveKind) -> tuple[Algorithm, ...]:
    """Algorithms with a registered time function for ``kind``."""
    return tuple(a for (k, a) in _RULES if k is kind)


def _ring_steps_fraction(n: int, s: float) -> float:
    return (n - 1) / n * s


def _twice_ring_fraction(n: int, s: float) -> float:
    return 2 * (n - 1) / n * s


def _whole_buffer(n: int, s: float) -> float:
    return s if n > 1 else 0.0


# --------------------------------------------------------------------------------------------
# One function per (collective, algorithm).  Each returns seconds; n == 1 costs 0.
# --------------------------------------------------------------------------------------------


@collective_time(CollectiveKind.ALL_REDUCE, Algorithm.RING, bytes_sent=_twice_ring_fraction)
def allreduce_ring(n: int, message_bytes: float, alpha_s: float, beta_s_per_byte: float, gamma_s_per_byte: float = 0.0) -> float:
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
        Seconds.

    References
    ----------
    Thakur, Rabenseifner, Gropp 2005, ring allreduce (REFERENCES.md "AllReduce ring (RS + AG)");
    NCCL tuning.cc: nsteps = 2(n-1).
    """
    if n <= 1:
        return 0.0
    f = (n - 1) / n
    return 2 * (n - 1) * alpha_s + 2 * f * message_bytes * beta_s_per_byte + f * message_bytes * gamma_s_per_byte


@collective_time(CollectiveKind.ALL_GATHER, Algorithm.RING, bytes_sent=_ring_steps_fraction)
def allgather_ring(n: int, message_bytes: float, alpha_s: float, beta_s_per_byte: float, gamma_s_per_byte: float = 0.0) -> float:
    """Ring AllGather: ``t = (n-1) alpha + ((n-1)/n) S beta`` (no reduction, gamma unused).

    ``message_bytes`` S is the gathered *output* (n x each rank's contribution), as in nccl-tests.

    References
    ----------
    Thakur, Rabenseifner, Gropp 2005, ring allgather (REFERENCES.md "AllGather ring").
    """
    if n <= 1:
        return 0.0
    return (n - 1) * alpha_s + (n - 1) / n * message_bytes * beta_s_per_byte


@collective_time(CollectiveKind.REDUCE_SCATTER, Algorithm.RING, bytes_sent=_ring_steps_fraction)
def reducescatter_ring(n: int, message_bytes: float, alpha_s: float, beta_s_per_byte: float, gamma_s_per_byte: float = 0.0) -> float:
    """Ring ReduceScatter: ``t = (n-1) alpha + ((n-1)/n) S (beta + gamma)``.

    ``message_bytes`` S is the *input* on each rank (n x each rank's output), as in nccl-tests.

    References
    ----------
    Thakur, Rabenseifner, Gropp 2005, pairwise/ring reduce-scatter (REFERENCES.md "ReduceScatter
    pairwise / ring").
    """
    if n <= 1:
        return 0.0
    return (n - 1) * alpha_s + (n - 1) / n * message_bytes * (beta_s_per_byte + gamma_s_per_byte)


@collective_time(CollectiveKind.BROADCAST, Algorithm.RING, bytes_sent=_whole_buffer)
def broadcast_ring(n: int, message_bytes: float, alpha_s: float, beta_s_per_byte: float, gamma_s_per_byte: float = 0.0) -> float:
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
    if n <= 1:
        return 0.0
    return (n - 1) * alpha_s + message_bytes * beta_s_per_byte


def _binomial_root_bytes(n: int, s: float) -> float:
    # The root sends the whole buffer to each of its ceil(log2 n) children in turn.
    return math.ceil(math.log2(n)) * s if n > 1 else 0.0


@collective_time(CollectiveKind.BROADCAST, Algorithm.BINOMIAL_TREE, bytes_sent=_binomial_root_bytes)
def broadcast_binomial_tree(
    n: int, message_bytes: float, alpha_s: float, beta_s_per_byte: float, gamma_s_per_byte: float = 0.0
) -> float:
    """Binomial-tree Broadcast: ``t = ceil(log2 n) (alpha + S beta)`` (MPICH's short-message choice).

    References
    ----------
    Thakur, Rabenseifner, Gropp 2005, binomial-tree broadcast (REFERENCES.md "Broadcast binomial
    tree"); ceil for n not a power of two.
    """
    if n <= 1:
        return 0.0
    return math.ceil(math.log2(n)) * (alpha_s + message_bytes * beta_s_per_byte)


@collective_time(CollectiveKind.REDUCE, Algorithm.RING, bytes_sent=_whole_buffer)
def reduce_ring(n: int, message_bytes: float, alpha_s: float, beta_s_per_byte: float, gamma_s_per_byte: float = 0.0) -> float:
    """Pipelined ring (chain) Reduce toward the root: ``t = (n-1) alpha + S (beta + gamma)``.

    The mirror image of :func:`broadcast_ring`: partial sums stream along a chain ending at the
    root, each link carrying S once and each rank reducing S once.

    References
    ----------
    NVIDIA nccl-tests doc/PERFORMANCE.md, Reduce (t = S/B, busbw factor 1); NCCL tuning.cc
    (Reduce runs only as a ring).
    """
    if n <= 1:
        return 0.0
    return (n - 1) * alpha_s + message_bytes * (beta_s_per_byte + gamma_s_per_byte)


@collective_time(CollectiveKind.ALL_TO_ALL, Algorithm.PAIRWISE, bytes_sent=_ring_steps_fraction)
def alltoall_pairwise(n: int, message_bytes: float, alpha_s: float, beta_s_per_byte: float, gamma_s_per_byte: float = 0.0) -> float:
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
    if n <= 1:
        return 0.0
    return (n - 1) * alpha_s + (n - 1) / n * message_bytes * beta_s_per_byte


@collective_time(CollectiveKind.SEND_RECV, Algorithm.DIRECT, bytes_sent=_whole_buffer)
def sendrecv_direct(n: int, message_bytes: float, alpha_s: float, beta_s_per_byte: float, gamma_s_per_byte: float = 0.0) -> float:
    """Point-to-point: every rank sends S bytes to one peer at once, ``t = alpha + S beta``.

    n = 2 is a plain send/receive (a pipeline hand-off); larger n is a ring shift as in
    nccl-tests ``sendrecv_perf`` -- every link carries S, so the time does not depend on n.

    References
    ----------
    Hockney's alpha-beta point-to-point model as used by Thakur, Rabenseifner, Gropp 2005 Sec. 2;
    nccl-tests doc/PERFORMANCE.md (SendRecv busbw factor 1).
    """
    if n <= 1:
        return 0.0
    return alpha_s + message_bytes * beta_s_per_byte


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


def busbw_factor(kind: CollectiveKind, n: int) -> float:
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
    return 1.0


def bandwidth_lower_bound_s(kind: CollectiveKind, n: int, message_bytes: float, link: Link) -> float:
    """The best possible time on ``link`` whatever the algorithm: ``S x factor / (B x efficiency)``.

    This is nccl-tests' "perfect" time (each rank's link busy the whole time, no latency); no
    collective in this module beats it (property-tested).  0 for n = 1.
    """
    if n <= 1:
        return 0.0
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
        Bytes the busiest GPU puts on its link.
    time_s
        Seconds.
    algbw_bytes_per_s, busbw_bytes_per_s
        S / time and algbw x :func:`busbw_factor`; 0 when nothing moves (n = 1 or S = 0).
    link
        Name of the link it was costed on.
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
        }


def collective_cost(
    kind: CollectiveKind,
    n: int,
    message_bytes: float,
    link: Link,
    *,
    algorithm: Algorithm | None = None,
    gamma_s_per_byte: float = 0.0,
) -> CollectiveCost:
    """Cost of ``kind`` over ``n`` ranks joined by ``link``.

    Parameters
    ----------
    kind
        The collective.
    n
        Ranks in the group (>= 1).
    message_bytes
        S, nccl-tests convention (module docstring), >= 0.
    link
        Supplies alpha = ``link.latency_s`` and beta = 1 / (``link.bandwidth_bytes_per_s`` x
        ``link.efficiency``).
    algorithm
        Default :data:`DEFAULT_ALGORITHMS` [kind].
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
    try:
        size = operator.index(n)
    except TypeError:
        size = 0
    if isinstance(n, bool) or size < 1:
        raise ConfigError(f"{kind.value}: group size must be a positive integer, got {n!r}")
    n = size
    if not (math.isfinite(message_bytes) and message_bytes >= 0):
        raise ConfigError(f"{kind.value}: message_bytes must be a finite number >= 0, got {message_bytes!r}")
    if not (math.isfinite(gamma_s_per_byte) and gamma_s_per_byte >= 0):
        raise ConfigError(f"gamma_s_per_byte must be a finite number >= 0, got {gamma_s_per_byte!r}")
    chosen = DEFAULT_ALGORITHMS[kind] if algorithm is None else algorithm
    rule = _RULES.get((kind, chosen))
    if rule is None:
        known = ", ".join(a.value for a in registered_algorithms(kind)) or "none"
        raise ConfigError(
            f"no {chosen.value} algorithm for {kind.value} (registered: {known}); add one with "
            f"@collective_time(CollectiveKind.{kind.name}, Algorithm.{chosen.name}, bytes_sent=...) in "
            "dml2comm/network/collectives.py"
        )
    time_s = rule.time_s(n, float(message_bytes), link.latency_s, link.beta_s_per_byte, gamma_s_per_byte)
    sent = rule.bytes_sent_per_gpu(n, float(message_bytes)) if n > 1 else 0.0
    moving = n > 1 and message_bytes > 0 and time_s > 0
    algbw = message_bytes / time_s if moving else 0.0
    return CollectiveCost(
        kind=kind,
        algorithm=chosen.value,
        n=n,
        message_bytes=float(message_bytes),
        bytes_sent_per_gpu=sent,
        time_s=time_s,
        algbw_bytes_per_s=algbw,
        busbw_bytes_per_s=algbw * busbw_factor(kind, n),
        link=link.name,
    )
