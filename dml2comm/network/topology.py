"""Network topologies: which links a group of ranks uses, and how many hops a message takes.

A :class:`Topology` is a stack of :class:`Level` s (the ASTRA-sim "multi-dimensional" view of a
network), fastest-varying first: rank ``r`` has coordinate ``r mod m_0`` on level 0, ``(r //
m_0) mod m_1`` on level 1, and so on.  A cluster is two levels (GPUs of a node on NVSwitch, nodes
on the NIC fabric); a 2D torus is two ring levels; a fat tree is one switch level per tier.
Each level has a kind, a size and one :class:`~dml2comm.hardware.cluster.Link` class:

``switch``
    Every GPU has a port (``link``: the per-GPU bandwidth, all its links together) into a
    non-blocking switch; any pair is one hop.  ``oversubscription`` divides the per-GPU share
    (upper tiers of an oversubscribed fat tree); ``in_network`` marks a switch that reduces
    (NVLink SHARP, InfiniBand SHARP).
``ring``
    A bidirectional ring (torus dimension): each GPU has one link to each neighbour.
``line``
    A ring without the wrap-around link (mesh dimension).
``fully_connected``
    One link between every pair (e.g. AMD Infinity Fabric boxes).
``link_matrix``
    Point-to-point links given by a matrix of link counts (the DGX-1 hybrid cube-mesh); ``link``
    is one physical link.

The delay formulas live in :mod:`dml2comm.network.collectives` and assume one hop per message and
no link sharing.  A level adapts them to itself through a :class:`Path` per communication
:class:`Pattern`: ``alpha_hops`` multiplies alpha (a message forwarded over h links pays h
latencies) and ``beta_share`` multiplies beta (how many messages share the busiest link, divided
by the parallel links a GPU drives).  Switch and fully connected levels are exact (both 1, or the
parallel-link count); on ring and line levels the butterfly and all-to-all patterns are summed in
closed form over their steps (below).  Exact for ranks numbered level by level and, for the
butterfly algorithms, powers of two.

Ring and line levels, size m, XOR partners at distance d = 2^i travel h(d) = min(d, m - d) hops
(d on a line) and d messages share the busiest link:

- ring pattern: two counter-rotating rings on a ring level (``beta_share`` 1/2, one hop); a folded
  ring on a line (``alpha_hops`` 2 for m > 2, ``beta_share`` 1: each link carries two ring edges);
- equal-size butterfly steps (recursive doubling, binomial and double binary trees, Bruck
  all-to-all): ``alpha_hops = beta_share = sum_i h(2^i) / L``, L = ceil(log2 m);
- halving/doubling steps (Rabenseifner, recursive halving, Bruck all-gather; the largest piece
  to the nearest partner): ``alpha_hops = sum_i h(2^i) / L`` and ``beta_share = sum_i h(2^i)
  2^-(i+1) / ((m-1)/m)``;
- pairwise exchange (step j: shift by j): mean over j of the hops (both shares);
- all peers at once: the bisection load, ``m / 8`` per link on a ring (``floor(m/2) ceil(m/2) /
  (4 m)`` on a line, per direction) relative to ``(m-1)/m`` of the buffer; alpha counts the
  diameter.

A flat ring over several levels (NCCL's ring across nodes) uses :func:`ring_path`: with switch
levels, k rings (one per GPU of a node) leave each node through k NIC shares, so the busiest link
is ``max(beta_0, max_l beta_l / s_l)`` with s_l the ranks below level l; its alpha is the mean
over ring edges (NCCL: ``(nsteps - nInterSteps) intraLat + nInterSteps interLat``).  On tori and
meshes the ring snakes through every level on one link pair (a Hamiltonian cycle; two hops per
step on a mesh with an odd number of ranks).

References
----------
ASTRA-sim 2.0 analytical network backend (multi-dimensional topologies: Ring, FullyConnected,
Switch per dimension; Won et al., ISPASS 2023).  Thakur, Rabenseifner, Gropp 2005 (the patterns).
NVIDIA NCCL src/graph/tuning.cc (ring latency across nodes; one ring per NIC).
Al-Fares, Loukissas, Vahdat, "A Scalable, Commodity Data Center Network Architecture", SIGCOMM
2008 (fat trees, oversubscription).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Callable, Sequence

from dml2comm.choices import Choice
from dml2comm.errors import ConfigError
from dml2comm.hardware.cluster import Cluster, IntraTopology, Link

__all__ = [
    "LevelKind",
    "Level",
    "LevelUse",
    "Path",
    "Pattern",
    "Topology",
    "TOPOLOGY_NAMES",
    "TopologyName",
    "cluster_topology",
    "direct_path",
    "in_network_path",
    "fat_tree",
    "fully_connected",
    "hierarchical",
    "make_topology",
    "mesh2d",
    "path",
    "ring",
    "ring_path",
    "switch",
    "torus2d",
    "torus3d",
    "tree",
]


class Pattern(enum.Enum):
    """Who talks to whom in an algorithm's steps (what a level needs to cost it)."""

    RING = "ring"  # neighbours on a ring, every step
    LOG_EQUAL = "log_equal"  # partners at distances 2^i, equal bytes per step
    LOG_GEOMETRIC = "log_geometric"  # partners at distances 2^i, halving/doubling bytes
    ALL_SEQUENTIAL = "all_sequential"  # one peer per step, every peer once
    ALL_CONCURRENT = "all_concurrent"  # every peer at once
    POINT = "point"  # one neighbour (send/recv)
    IN_NETWORK = "in_network"  # up to the switch and back


class LevelKind(enum.Enum):
    SWITCH = "switch"
    RING = "ring"
    LINE = "line"
    FULLY_CONNECTED = "fully_connected"
    LINK_MATRIX = "link_matrix"


@dataclass(frozen=True, slots=True)
class Level:
    """One level (dimension) of a topology.

    Parameters
    ----------
    kind, size
        Level kind (module docstring) and ranks along it (>= 1).
    link
        The link class: per-GPU port bandwidth for ``switch``; one connection otherwise.
    name
        Shown as the limiting link (e.g. ``"inter-node: InfiniBand HDR 200 Gb/s (...)"``).
    oversubscription
        ``switch`` only: the per-GPU share is ``link`` / this (>= 1).
    in_network
        ``switch`` only: the switch can reduce (enables the ``in_network`` algorithm).
    matrix
        ``link_matrix`` only: ``size`` x ``size`` link counts.
    hops_per_message
        Switch traversals a message makes at this level (reported; alpha already covers them).
    """

    kind: LevelKind
    size: int
    link: Link
    name: str
    oversubscription: float = 1.0
    in_network: bool = False
    matrix: tuple[tuple[int, ...], ...] | None = None
    hops_per_message: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.size, int) or isinstance(self.size, bool) or self.size < 1:
            raise ConfigError(f"level {self.name!r}: size must be a positive integer, got {self.size!r}")
        if not (math.isfinite(self.oversubscription) and self.oversubscription >= 1):
            raise ConfigError(f"level {self.name!r}: oversubscription must be >= 1, got {self.oversubscription!r}")
        if self.kind is LevelKind.LINK_MATRIX and (self.matrix is None or len(self.matrix) != self.size):
            raise ConfigError(f"level {self.name!r}: a link_matrix level needs a {self.size} x {self.size} matrix")

    def to_dict(self) -> dict[str, object]:
        return {
            "kind": self.kind.value,
            "size": self.size,
            "name": self.name,
            "link": self.link.name,
            "bandwidth_bytes_per_s": self.link.effective_bytes_per_s,
            "latency_s": self.link.latency_s,
            "oversubscription": self.oversubscription,
            "in_network": self.in_network,
            "hops_per_message": self.hops_per_message,
        }


@dataclass(frozen=True, slots=True)
class LevelUse:
    """How a group spreads over one level: ``extent`` ranks along it (the fullest block's count).

    ``members``: for ``link_matrix`` levels, the local indices the group occupies on its fullest
    node (which links it can use); empty otherwise.
    """

    level: Level
    extent: int
    members: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Path:
    """What one level does to the uniform formulas: alpha x ``alpha_hops``, beta x ``beta_share``."""

    alpha_hops: float
    beta_share: float


# --------------------------------------------------------------------------------------------
# Paths per level and pattern
# --------------------------------------------------------------------------------------------


def _log_distances(m: int) -> list[int]:
    out, d = [], 1
    while d < m:
        out.append(d)
        d *= 2
    return out


def _ring_hops(d: int, m: int) -> int:
    return min(d, m - d)


def _fc_rings(m: int) -> int:
    """Edge-disjoint directed Hamiltonian rings of K_m (Walecki): m-1 (odd m), m-2 (even m >= 4)."""
    if m <= 2:
        return 1
    return m - 1 if m % 2 else m - 2


def _matrix_path(use: LevelUse, pattern: Pattern) -> Path:
    matrix = use.level.matrix or ()
    members = use.members or tuple(range(use.extent))
    if len(members) < 2:
        return Path(1.0, 1.0)
    if pattern is Pattern.RING:
        degree = min(sum(matrix[i][j] for j in members if j != i) for i in members)
        return Path(1.0, 1.0 / degree) if degree > 0 else Path(2.0, 1.0)
    pairs = [matrix[i][j] for i in members for j in members if i < j]
    if min(pairs) > 0:
        return Path(1.0, 1.0 / min(pairs))
    return Path(2.0, 1.0)  # some pair has no direct NVLink: relayed through a GPU that has


def path(use: LevelUse, pattern: Pattern) -> Path:
    """Hop and link-sharing multipliers of ``pattern`` over ``use.extent`` ranks of one level.

    Raises
    ------
    ConfigError
        ``in_network`` on a level whose switch cannot reduce.
    """
    level, m = use.level, use.extent
    kind = level.kind
    if pattern is Pattern.IN_NETWORK and not (kind is LevelKind.SWITCH and level.in_network):
        raise ConfigError(f"{level.name}: no in-network reduction on a {kind.value} level")
    if m <= 1:
        return Path(1.0, 1.0)
    if kind is LevelKind.SWITCH:
        if pattern is Pattern.IN_NETWORK:
            eff = level.link.in_network_efficiency or level.link.efficiency
            return Path(1.0, level.oversubscription * level.link.efficiency / eff)
        return Path(1.0, level.oversubscription)
    if kind is LevelKind.LINK_MATRIX:
        return _matrix_path(use, pattern)
    if kind is LevelKind.FULLY_CONNECTED:
        if pattern is Pattern.RING:
            return Path(1.0, 1.0 / _fc_rings(m))
        if pattern is Pattern.ALL_CONCURRENT:
            return Path(1.0, 1.0 / (m - 1))
        return Path(1.0, 1.0)
    # ring and line levels
    wrap = kind is LevelKind.RING
    hops = (lambda d: _ring_hops(d, m)) if wrap else (lambda d: d)
    if pattern is Pattern.RING:
        if wrap:
            return Path(1.0, 0.5)
        return Path(2.0 if m > 2 else 1.0, 1.0)
    if pattern is Pattern.POINT:
        return Path(1.0, 0.5 if wrap and m == 2 else 1.0)
    if pattern in (Pattern.LOG_EQUAL, Pattern.LOG_GEOMETRIC):
        dist = _log_distances(m)
        h = [hops(d) for d in dist]
        alpha = sum(h) / len(h)
        if pattern is Pattern.LOG_EQUAL:
            return Path(alpha, alpha)
        moved = sum(hi * 0.5 ** (i + 1) for i, hi in enumerate(h))
        return Path(alpha, max(moved / ((m - 1) / m), 1.0))
    if pattern is Pattern.ALL_SEQUENTIAL:
        h = [hops(j) if wrap else max(j, m - j) for j in range(1, m)]
        share = [hops(j) if wrap else j for j in range(1, m)]
        return Path(sum(h) / len(h), sum(share) / len(share))
    # ALL_CONCURRENT: bisection load per directed link over the (m-1)/m of the buffer a GPU sends
    if wrap:  # two cut links per direction
        load, diameter, floor = m / 8.0, m // 2, 0.5
    else:  # one cut link per direction
        load, diameter, floor = (m // 2) * ((m + 1) // 2) / m, m - 1, 1.0
    return Path(float(diameter), max(load / ((m - 1) / m), floor))


def ring_path(
    uses: Sequence[LevelUse], alpha_of: Callable[[Link], float] | None = None
) -> tuple[float, float, float, LevelUse]:
    """A flat ring over every level the group spans.

    ``alpha_of(link)`` gives a link's per-step latency (default ``link.latency_s``; NCCL's
    protocols pass their own).

    Returns
    -------
    (alpha_s, beta_s_per_byte, kernel_s_per_byte, limiting)
        Mean per-step latency, the busiest link's seconds per byte of ring traffic, the kernel
        term of the limiting level, and the limiting level (module docstring).
    """
    lat = alpha_of or (lambda link: link.latency_s)
    pattern = Pattern.RING
    active = [u for u in uses if u.extent > 1]
    if not active:
        raise ConfigError("a ring needs at least two ranks")
    if len(active) == 1:
        u = active[0]
        p = path(u, pattern)
        link = u.level.link
        return lat(link) * p.alpha_hops, link.beta_s_per_byte * p.beta_share, link.kernel_s_per_byte, u
    if any(u.level.kind in (LevelKind.RING, LevelKind.LINE, LevelKind.FULLY_CONNECTED) for u in active):
        # Hamiltonian snake on one link pair per GPU; the slowest level's link.
        slowest = max(active, key=lambda u: u.level.link.beta_s_per_byte)
        n = math.prod(u.extent for u in active)
        mesh_odd = all(u.level.kind is LevelKind.LINE for u in active) and n % 2 == 1
        link = slowest.level.link
        both_ways = all(u.level.kind is LevelKind.RING for u in active) or not mesh_odd
        beta = link.beta_s_per_byte * (0.5 if both_ways else 1.0)
        return lat(link) * (2.0 if mesh_odd else 1.0), beta, link.kernel_s_per_byte, slowest
    # Switch levels (a node, a fat-tree tier): one ring per GPU of a block leaves the block through
    # that GPU's share, so level l carries the ring traffic on s_l shares (s_l = ranks below it).
    n = math.prod(u.extent for u in active)
    below = 1
    edges_above = []  # ring edges whose endpoints differ at this level or higher
    betas = []
    first = path(active[0], pattern)
    for i, u in enumerate(active):
        if i == 0:
            betas.append(u.level.link.beta_s_per_byte * first.beta_share)
        else:
            betas.append(u.level.link.beta_s_per_byte * u.level.oversubscription / below)
        blocks = n // below
        edges_above.append(blocks if blocks > 1 else 0)
        below *= u.extent
    alpha = 0.0
    for i, u in enumerate(active):
        exact = edges_above[i] - (edges_above[i + 1] if i + 1 < len(active) else 0)
        alpha += exact * lat(u.level.link) * (first.alpha_hops if i == 0 else 1.0)
    alpha /= n
    worst = max(range(len(active)), key=lambda i: betas[i])
    return alpha, betas[worst], active[worst].level.link.kernel_s_per_byte, active[worst]


def in_network_path(
    uses: Sequence[LevelUse], alpha_of: Callable[[Link], float] | None = None
) -> tuple[float, float, float, LevelUse]:
    """In-network reduction up a tree of reducing switches (every level the group spans).

    Each switch reduces what its subtree sends, so every uplink carries the buffer once: level l
    (s_l ranks below it, per-GPU share ``link / oversubscription``) takes ``S x oversubscription /
    (s_l x link)``, the leaf port ``S / link``; the busiest wins.  Alpha: one hop up and one down
    per level, so ``2 alpha`` of the formula becomes ``2 alpha x levels``.

    Returns
    -------
    (alpha_s, beta_s_per_byte, kernel_s_per_byte, limiting)

    Raises
    ------
    ConfigError
        A level whose switches cannot reduce.
    """
    lat = alpha_of or (lambda link: link.latency_s)
    active = [u for u in uses if u.extent > 1]
    if not active:
        raise ConfigError("a reduction needs at least two ranks")
    below = 1
    betas, alpha = [], 0.0
    for u in active:
        p = path(u, Pattern.IN_NETWORK)  # raises where the switch cannot reduce
        betas.append(u.level.link.beta_s_per_byte * p.beta_share / below)
        alpha += lat(u.level.link)
        below *= u.extent
    worst = max(range(len(active)), key=lambda i: betas[i])
    return alpha, betas[worst], active[worst].level.link.kernel_s_per_byte, active[worst]


def direct_path(
    uses: Sequence[LevelUse], alpha_of: Callable[[Link], float] | None = None
) -> tuple[float, float, float, LevelUse]:
    """Every peer at once over every level the group spans (NCCL's all-to-all: grouped sends).

    On switch levels a GPU reaches the ``(m_l - 1) s_l`` peers whose highest differing level is l
    through its level-l link (s_l ranks below l), all levels at once; on ring and line levels
    (dimension-ordered routing) a fraction (m_l - 1)/m_l of its buffer crosses level l at the
    level's bisection share.  Beta is scaled so that ``((n-1)/n) S beta`` is the busiest level's
    time; alpha is the largest per-level latency times its hops.

    Returns
    -------
    (alpha_s, beta_s_per_byte, kernel_s_per_byte, limiting)
    """
    lat = alpha_of or (lambda link: link.latency_s)
    active = [u for u in uses if u.extent > 1]
    if not active:
        raise ConfigError("an exchange needs at least two ranks")
    n = math.prod(u.extent for u in active)
    below = 1
    times, alphas = [], []
    for u in active:
        p = path(u, Pattern.ALL_CONCURRENT)
        m = u.extent
        if u.level.kind in (LevelKind.RING, LevelKind.LINE):
            fraction = (m - 1) / m * p.beta_share
        else:
            fraction = (m - 1) * below / n * p.beta_share
        times.append(fraction * u.level.link.beta_s_per_byte)
        alphas.append(lat(u.level.link) * p.alpha_hops)
        below *= m
    worst = max(range(len(active)), key=lambda i: times[i])
    beta = times[worst] / ((n - 1) / n)
    return max(alphas), beta, active[worst].level.link.kernel_s_per_byte, active[worst]


# --------------------------------------------------------------------------------------------
# Topology
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Topology:
    """A stack of levels, fastest-varying first (module docstring).

    Parameters
    ----------
    name
        One of :data:`TOPOLOGY_NAMES` (or ``"cluster"``).
    levels
        The levels; ``num_ranks`` is the product of their sizes.
    description
        One line for outputs.
    """

    name: str
    levels: tuple[Level, ...]
    description: str

    @property
    def num_ranks(self) -> int:
        return math.prod(lv.size for lv in self.levels)

    def coords(self, rank: int) -> tuple[int, ...]:
        """Coordinate of ``rank`` on each level."""
        out = []
        for lv in self.levels:
            out.append(rank % lv.size)
            rank //= lv.size
        return tuple(out)

    def uses(self, ranks: Sequence[int] | None = None) -> tuple[LevelUse, ...]:
        """How the group ``ranks`` (default: every rank) spreads over the levels.

        The extent on level l is the largest number of distinct level-l coordinates among ranks
        that agree on every level above l (a group spread unevenly is costed as if each block held
        as many ranks as its fullest one).

        Raises
        ------
        ConfigError
            Empty group, or a rank outside ``[0, num_ranks)``.
        """
        total = self.num_ranks
        if ranks is None:
            return tuple(LevelUse(lv, lv.size, tuple(range(lv.size)) if lv.kind is LevelKind.LINK_MATRIX else ()) for lv in self.levels)
        if len(ranks) == 0:
            raise ConfigError("a communication group needs at least one rank")
        for r in ranks:
            if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < total:
                raise ConfigError(f"rank {r!r} is outside the topology's {total} ranks (0..{total - 1})")
        out = []
        below = 1  # ranks per block of the levels under this one
        for lv in self.levels:
            above = below * lv.size
            # a rank's coordinates on the levels above this one, as one number: r // above
            # (:meth:`coords` digit by digit); its coordinate on this level: r // below % size
            blocks: dict[int, set[int]] = {}
            for r in ranks:
                blocks.setdefault(r // above, set()).add(r // below % lv.size)
            below = above
            fullest = max(blocks.values(), key=lambda s: (len(s), -min(s)))
            members = tuple(sorted(fullest)) if lv.kind is LevelKind.LINK_MATRIX else ()
            out.append(LevelUse(lv, len(fullest), members))
        return tuple(out)

    def hops(self, a: int, b: int) -> int:
        """Link traversals of a message from rank ``a`` to rank ``b`` (dimension-ordered routing)."""
        ca, cb = self.coords(a), self.coords(b)
        total = 0
        for lv, x, y in zip(self.levels, ca, cb):
            if x == y:
                continue
            d = abs(x - y)
            if lv.kind is LevelKind.RING:
                total += min(d, lv.size - d)
            elif lv.kind is LevelKind.LINE:
                total += d
            elif lv.kind is LevelKind.LINK_MATRIX:
                total += 1 if (lv.matrix and lv.matrix[x][y]) else 2
            else:
                total += lv.hops_per_message
        return total

    def to_dict(self) -> dict[str, object]:
        return {"name": self.name, "description": self.description, "levels": [lv.to_dict() for lv in self.levels]}


class TopologyName(Choice):
    """The topologies :func:`make_topology` builds; :data:`TOPOLOGY_NAMES` spells the values out
    (for the site's reference page; tests/test_closed_sets.py checks they agree)."""

    RING = "ring"
    TREE = "tree"
    SWITCH = "switch"
    FAT_TREE = "fat-tree"
    MESH2D = "mesh2d"
    TORUS2D = "torus2d"
    TORUS3D = "torus3d"
    FULLY_CONNECTED = "fully-connected"
    HIERARCHICAL = "hierarchical"


#: Names accepted by :func:`make_topology` (and ``collective --topology``).
TOPOLOGY_NAMES: tuple[str, ...] = (
    "ring",
    "tree",
    "switch",
    "fat-tree",
    "mesh2d",
    "torus2d",
    "torus3d",
    "fully-connected",
    "hierarchical",
)


def _check_n(n: int) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(f"the number of ranks n must be a positive integer, got {n!r}")
    return n


def ring(n: int, link: Link) -> Topology:
    """n GPUs on a bidirectional ring, one ``link`` to each neighbour."""
    _check_n(n)
    return Topology("ring", (Level(LevelKind.RING, n, link, f"ring: {link.name}"),), f"ring of {n}, {link.name} to each neighbour")


def switch(n: int, link: Link, *, in_network: bool = False) -> Topology:
    """n GPUs on one non-blocking switch, ``link`` = each GPU's port."""
    _check_n(n)
    return Topology(
        "switch",
        (Level(LevelKind.SWITCH, n, link, f"switch: {link.name}", in_network=in_network),),
        f"{n} GPUs on one switch{' with in-network reduction' if in_network else ''}, {link.name} per GPU",
    )


def fully_connected(n: int, link: Link) -> Topology:
    """One ``link`` between every pair of n GPUs."""
    _check_n(n)
    return Topology(
        "fully-connected",
        (Level(LevelKind.FULLY_CONNECTED, n, link, f"point-to-point: {link.name}"),),
        f"{n} GPUs fully connected, {link.name} per pair",
    )


def _tiers(n: int, radix: int, levels: int | None, what: str) -> list[int]:
    if isinstance(radix, bool) or not isinstance(radix, int) or radix < 2:
        raise ConfigError(f"{what}: radix must be an integer >= 2, got {radix!r}")
    if levels is not None and (isinstance(levels, bool) or not isinstance(levels, int) or levels < 1):
        raise ConfigError(f"{what}: levels must be a positive integer, got {levels!r}")
    sizes, rem = [], n
    while rem > radix and (levels is None or len(sizes) < levels - 1):
        if rem % radix:
            raise ConfigError(
                f"{what}: n={n} does not fill switches of radix {radix} (n must be a multiple of {radix ** (len(sizes) + 1)} "
                f"at tier {len(sizes) + 1}); pick n or --radix so that each tier divides evenly"
            )
        sizes.append(radix)
        rem //= radix
    if rem > radix:
        raise ConfigError(f"{what}: n={n} does not fit in {levels} tier(s) of radix {radix} (at most {radix ** (levels or 1)}); raise --levels or --radix")
    sizes.append(rem)
    if levels is not None:
        sizes += [1] * (levels - len(sizes))
    return sizes


def fat_tree(n: int, link: Link, *, radix: int = 8, levels: int | None = None, oversubscription: float = 1.0,
             in_network: bool = False) -> Topology:
    """A fat tree: ``radix`` GPUs per leaf switch, ``radix`` children per upper switch.

    Each tier above the leaves is oversubscribed ``oversubscription``:1 (the per-GPU share of
    the uplinks at tier l is ``link / oversubscription^(l-1)``); 1 is full bisection.
    """
    _check_n(n)
    if not (isinstance(oversubscription, (int, float)) and math.isfinite(oversubscription) and oversubscription >= 1):
        raise ConfigError(f"fat-tree: oversubscription must be >= 1, got {oversubscription!r}")
    sizes = _tiers(n, radix, levels, "fat-tree")
    lvls = tuple(
        Level(LevelKind.SWITCH, s, link, f"fat-tree tier {i + 1}: {link.name}", oversubscription=float(oversubscription) ** i,
              in_network=in_network, hops_per_message=2 * i + 1)
        for i, s in enumerate(sizes)
    )
    return Topology(
        "fat-tree", lvls,
        f"fat tree of {n} GPUs, radix {radix}, {len(sizes)} tier(s), {oversubscription:g}:1 per tier above the leaves, {link.name} per GPU",
    )


def tree(n: int, link: Link, *, radix: int = 2) -> Topology:
    """A tree of switches with one uplink each (oversubscribed ``radix``:1 at every tier)."""
    _check_n(n)
    sizes = _tiers(n, radix, None, "tree")
    lvls = tuple(
        Level(LevelKind.SWITCH, s, link, f"tree tier {i + 1}: {link.name}", oversubscription=float(radix) ** i, hops_per_message=2 * i + 1)
        for i, s in enumerate(sizes)
    )
    return Topology("tree", lvls, f"switch tree of {n} GPUs, radix {radix}, one uplink per switch ({radix}:1 per tier), {link.name}")


def _check_dims(dims: Sequence[int], n: int, name: str, count: int) -> tuple[int, ...]:
    dims = tuple(dims)
    if len(dims) != count or any(isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in dims):
        raise ConfigError(f"{name}: give {count} positive dimensions (e.g. --dims {'x'.join(['4'] * count)}), got {dims!r}")
    if math.prod(dims) != n:
        raise ConfigError(f"{name}: dimensions {'x'.join(map(str, dims))} multiply to {math.prod(dims)}, not n={n}; make them multiply to n")
    return dims


def _balanced_dims(n: int, count: int) -> tuple[int, ...]:
    """The most nearly equal factorisation of n into ``count`` factors (largest first)."""
    best: tuple[int, ...] | None = None

    def rec(rem: int, k: int, lo: int, acc: tuple[int, ...]) -> None:
        nonlocal best
        if k == 1:
            cand = tuple(sorted(acc + (rem,), reverse=True))
            if best is None or (max(cand) - min(cand), cand) < (max(best) - min(best), best):
                best = cand
            return
        for f in range(lo, int(round(rem ** (1 / k))) + 2):
            if f >= 1 and rem % f == 0:
                rec(rem // f, k - 1, f, acc + (f,))

    rec(n, count, 1, ())
    assert best is not None
    return best


def mesh2d(n: int, link: Link, dims: Sequence[int] | None = None) -> Topology:
    """A 2D mesh (no wrap-around) of ``dims`` = (a, b) GPUs, a x b = n."""
    _check_n(n)
    a, b = _check_dims(dims, n, "mesh2d", 2) if dims is not None else _balanced_dims(n, 2)
    lvls = (Level(LevelKind.LINE, a, link, f"mesh x: {link.name}"), Level(LevelKind.LINE, b, link, f"mesh y: {link.name}"))
    return Topology("mesh2d", lvls, f"{a}x{b} 2D mesh, {link.name} to each neighbour")


def torus2d(n: int, link: Link, dims: Sequence[int] | None = None) -> Topology:
    """A 2D torus of ``dims`` = (a, b) GPUs, a x b = n."""
    _check_n(n)
    a, b = _check_dims(dims, n, "torus2d", 2) if dims is not None else _balanced_dims(n, 2)
    lvls = (Level(LevelKind.RING, a, link, f"torus x: {link.name}"), Level(LevelKind.RING, b, link, f"torus y: {link.name}"))
    return Topology("torus2d", lvls, f"{a}x{b} 2D torus, {link.name} to each neighbour")


def torus3d(n: int, link: Link, dims: Sequence[int] | None = None) -> Topology:
    """A 3D torus of ``dims`` = (a, b, c) GPUs, a x b x c = n."""
    _check_n(n)
    a, b, c = _check_dims(dims, n, "torus3d", 3) if dims is not None else _balanced_dims(n, 3)
    lvls = tuple(Level(LevelKind.RING, s, link, f"torus {ax}: {link.name}") for s, ax in zip((a, b, c), "xyz"))
    return Topology("torus3d", lvls, f"{a}x{b}x{c} 3D torus, {link.name} to each neighbour")


def hierarchical(n: int, intra: Link, inter: Link, *, gpus_per_node: int, in_network: bool = False) -> Topology:
    """Nodes of ``gpus_per_node`` GPUs on a switch (``intra`` per GPU), nodes on a switched network.

    ``inter`` is the per-GPU share of the node's NICs (all GPUs of a node talk across nodes at once).
    """
    _check_n(n)
    k = gpus_per_node
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ConfigError(f"hierarchical: gpus_per_node must be a positive integer, got {k!r}")
    if n % k:
        raise ConfigError(f"hierarchical: n={n} is not a multiple of gpus_per_node={k}; use whole nodes")
    lvls = (
        Level(LevelKind.SWITCH, k, intra, f"intra-node: {intra.name}", in_network=in_network),
        Level(LevelKind.SWITCH, n // k, inter, f"inter-node: {inter.name}", hops_per_message=3),
    )
    return Topology("hierarchical", lvls, f"{n // k} node(s) of {k} GPUs; {intra.name} inside, {inter.name} per GPU between nodes")


def cluster_topology(cluster: Cluster) -> Topology:
    """The two-level network of ``cluster``: its node (NVSwitch, PCIe switch or NVLink cube-mesh) and its NICs.

    Levels are sized ``gpus_per_node`` and ``num_nodes``; a partly filled last node is fine
    (groups never reach the empty slots).
    """
    k = cluster.gpus_per_node
    intra = cluster.intra_node
    if cluster.intra_topology is IntraTopology.HYBRID_CUBE_MESH:
        one = Link(
            name=f"{intra.name}, one link",
            bandwidth_bytes_per_s=intra.per_link_bytes_per_s,
            latency_s=intra.latency_s,
            efficiency=intra.efficiency,
            sources=intra.sources,
            kernel_s_per_byte=intra.kernel_s_per_byte,
            hw=intra.hw,
        )
        first = Level(LevelKind.LINK_MATRIX, k, one, f"intra-node: {intra.name}", matrix=cluster.nvlink_matrix)
    else:
        first = Level(LevelKind.SWITCH, k, intra, f"intra-node: {intra.name}", in_network=intra.in_network_efficiency is not None)
    second = Level(LevelKind.SWITCH, cluster.num_nodes, cluster.inter_node, f"inter-node: {cluster.inter_node.name}", hops_per_message=3)
    return Topology("cluster", (first, second), f"{cluster.name}: {cluster.num_nodes} node(s) of {k} GPUs")


def make_topology(
    name: str,
    n: int,
    link: Link,
    *,
    dims: Sequence[int] | None = None,
    radix: int | None = None,
    levels: int | None = None,
    oversubscription: float = 1.0,
    in_network: bool = False,
    gpus_per_node: int | None = None,
    inter_link: Link | None = None,
) -> Topology:
    """Build the topology ``name`` (one of :data:`TOPOLOGY_NAMES`; ``_`` reads as ``-``) of n ranks.

    Raises
    ------
    ConfigError
        Unknown name (the message lists the valid ones), bad sizes, or dimensions that do not
        multiply to n.
    """
    _check_n(n)
    key = name.strip().lower().replace("_", "-")
    if key not in TOPOLOGY_NAMES:
        raise ConfigError(f"unknown topology {name!r}; valid topologies: {', '.join(TOPOLOGY_NAMES)}")
    T = TopologyName
    key = T(key)
    if dims is not None and key not in (T.MESH2D, T.TORUS2D, T.TORUS3D):
        raise ConfigError(f"--dims applies to mesh2d, torus2d and torus3d, not {key}")
    if in_network and key not in (T.SWITCH, T.FAT_TREE, T.HIERARCHICAL):
        raise ConfigError(f"in-network reduction needs a switch: use switch, fat-tree or hierarchical, not {key}")
    if key is T.RING:
        return ring(n, link)
    if key is T.SWITCH:
        return switch(n, link, in_network=in_network)
    if key is T.FULLY_CONNECTED:
        return fully_connected(n, link)
    if key is T.TREE:
        return tree(n, link, radix=radix or 2)
    if key is T.FAT_TREE:
        return fat_tree(n, link, radix=radix or 8, levels=levels, oversubscription=oversubscription, in_network=in_network)
    if key is T.MESH2D:
        return mesh2d(n, link, dims)
    if key is T.TORUS2D:
        return torus2d(n, link, dims)
    if key is T.TORUS3D:
        return torus3d(n, link, dims)
    if gpus_per_node is None or inter_link is None:
        raise ConfigError("hierarchical needs --gpus-per-node and an inter-node link (--inter-bandwidth), or use --cluster NAME")
    return hierarchical(n, link, inter_link, gpus_per_node=gpus_per_node, in_network=in_network)
