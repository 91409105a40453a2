"""Cost a collective on the links a group really uses, and pick the fastest algorithm.

:func:`collective_cost_for_group` is what the analysis calls for every collective and Send/Recv
of a plan: it finds how the group spreads over the cluster (GPUs per node, nodes, which NVLinks
on a cube-mesh, the NIC shares), builds every candidate algorithm as one or more *phases* and
returns the fastest, as NCCL's tuner does.  :func:`cost_on_topology` does the same on any
:class:`~dml2comm.network.topology.Topology` (the ``collective`` command).

A phase is one registered formula over one level (or, for a ring that crosses levels, over the
whole group with the bottleneck link).  Its time is the one delay formula of the library::

    t_phase = formula(m, S_phase, alpha x hops, beta x share / f_protocol, gamma) + delta K_phase

(K: :func:`~dml2comm.network.collectives.kernel_bytes`, the buffer the kernel streams)

and a collective's time is ``overhead + base latency + sum of its phases``
(:func:`_phase_time`; the symbols are those of :mod:`.collectives`, :mod:`.topology` and
:mod:`.nccl`).

Phases of an algorithm over several levels (fastest level first, ``m_l`` ranks on level l):

- ``ring``: one flat ring over all ranks (NCCL's ring across nodes; one ring per GPU of a node,
  each leaving through its own NIC share; :func:`~dml2comm.network.topology.ring_path`).
- ``direct``: every peer at once over every level, each level's link carrying the traffic to
  the peers it reaches (:func:`~dml2comm.network.topology.direct_path`).
- ``in_network``: one reduction up a tree of reducing switches and the result back down
  (:func:`~dml2comm.network.topology.in_network_path`).
- ``hierarchical``: AllReduce = ReduceScatter up the levels, AllReduce on the top level,
  AllGather down; ReduceScatter and AllGather level by level (the big pieces on the fast links);
  Broadcast, Reduce and AllToAll level by level on the whole buffer.  Each phase uses the fastest
  algorithm available on its level.
- any other algorithm: the same decomposition with that algorithm on every level (its
  reduce-scatter and all-gather halves for Rabenseifner); for a butterfly with ranks numbered
  level by level this *is* the flat algorithm.

A group spread unevenly (3 GPUs on one node, 1 on another) is costed as if every node held as
many as the fullest: an upper bound.

References
----------
NVIDIA NCCL src/graph/tuning.cc and enqueue.cc (topoGetAlgoInfo: the (algorithm, protocol) with
the least predicted time wins); Thakur, Rabenseifner, Gropp 2005; shared/REFERENCES.md
"Hierarchical all-reduce".
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from typing import Callable, Sequence

from dml2comm.errors import ConfigError
from dml2comm.hardware.cluster import Cluster, CollectiveLibrary, Link
from dml2comm.network import nccl
from dml2comm.network.collectives import (
    AlgorithmRule,
    CollectiveCost,
    busbw_factor,
    check_message_bytes,
    fill_formula,
    get_rule,
    kernel_bytes,
    reduced_block_bytes,
    registered_algorithms,
)
from dml2comm.network.kinds import Algorithm, AlgorithmFamily, CollectiveKind, Protocol
from dml2comm.network.topology import (
    LevelKind,
    LevelUse,
    Pattern,
    Topology,
    cluster_topology,
    direct_path,
    in_network_path,
    path,
    ring_path,
)
from dml2comm.fmt import fmt_s

__all__ = [
    "LIBRARIES",
    "available_algorithms",
    "collective_cost_for_group",
    "cost_on_topology",
    "group_placement",
    "collective_time_on_placement",
]

#: How collectives are costed: the plain formulas, or NCCL's protocols, latencies and algorithms.
LIBRARIES: tuple[str, ...] = ("textbook", "nccl")
_TEXTBOOK, _NCCL = CollectiveLibrary.TEXTBOOK, CollectiveLibrary.NCCL  # compared by identity below

K = CollectiveKind
A = Algorithm

# AllReduce algorithms that split into a reduce-scatter half and an all-gather half.
_HALVES: dict[Algorithm, tuple[Algorithm, Algorithm]] = {
    A.RABENSEIFNER: (A.RECURSIVE_HALVING, A.RECURSIVE_DOUBLING),
    A.RING: (A.RING, A.RING),
}


class _Unavailable(Exception):
    """This (algorithm, protocol) cannot run here; the message says why."""


@dataclass(frozen=True, slots=True)
class _Ctx:
    library: CollectiveLibrary
    protocol: Protocol
    multi_node: bool
    ranks_per_node: int
    gamma: float


@dataclass(frozen=True, slots=True)
class _Phase:
    kind: CollectiveKind
    rule: AlgorithmRule
    m: float
    size: float
    alpha: float
    beta: float
    delta: float
    where: str
    links: tuple[str, ...]
    rho: float = 0.0  # s/B of the reduced block (Link.reduce_s_per_byte; 0 where the switch reduces)


def _phase_time(ph: _Phase, gamma: float) -> float:
    """The delay formula: the rule's formula on this phase's alpha and beta, plus the kernel term."""
    return _time_at(ph, ph.size, gamma)


def _time_at(ph: _Phase, size: float, gamma: float) -> float:
    """:func:`_phase_time` of ``ph`` moving ``size`` bytes (a phase's other parameters do not
    depend on its size)."""
    t = float(ph.rule.time_s(ph.m, size, ph.alpha, ph.beta, gamma))
    return t + _kernel_time(ph, size) if ph.m > 1 else t


def _kernel_time(ph: _Phase, size: float) -> float:
    """The kernel terms of a phase moving ``size`` bytes: ``delta K + rho R`` (K:
    :func:`~dml2comm.network.collectives.kernel_bytes`, R:
    :func:`~dml2comm.network.collectives.reduced_block_bytes`)."""
    t = ph.delta * float(kernel_bytes(ph.kind, ph.m, size))
    return t + ph.rho * float(reduced_block_bytes(ph.kind, ph.m, size)) if ph.rho else t


def _phase_bandwidth_time(ph: _Phase, gamma: float) -> float:
    """The size-dependent part of :func:`_phase_time` (which link limits)."""
    t = float(ph.rule.time_s(ph.m, ph.size, 0.0, ph.beta, gamma))
    return t + _kernel_time(ph, ph.size) if ph.m > 1 else t


# --------------------------------------------------------------------------------------------
# Phases
# --------------------------------------------------------------------------------------------


def _alpha(link: Link, family: AlgorithmFamily, ctx: _Ctx) -> float:
    if ctx.library is _TEXTBOOK:
        if ctx.protocol is not Protocol.SIMPLE:
            raise _Unavailable("the textbook model has one protocol")
        return link.latency_s
    if ctx.protocol is not Protocol.SIMPLE and family not in (AlgorithmFamily.RING, AlgorithmFamily.TREE):
        raise _Unavailable(f"NCCL runs {family} algorithms with the Simple protocol only")
    lat = nccl.hop_latency_s(link.hw, family, ctx.protocol, link.latency_s)
    if lat is None:
        raise _Unavailable(f"no {ctx.protocol.value} protocol on {link.name}")
    return lat


def _alltoall_latency(kind: CollectiveKind, rule: AlgorithmRule, links: Sequence[Link], ctx: _Ctx) -> float:
    """The fitted fixed time of NCCL's grouped point-to-point AllToAll on these links
    (:attr:`Link.alltoall_latency_s`, the largest; 0 for other kinds, algorithms or libraries)."""
    if ctx.library is not _NCCL or kind is not K.ALL_TO_ALL or rule.algorithm is not A.DIRECT:
        return 0.0
    return max(link.alltoall_latency_s for link in links)


def _factor(family: AlgorithmFamily, kind: CollectiveKind, ctx: _Ctx) -> float:
    if ctx.library is _TEXTBOOK:
        return 1.0
    return nccl.protocol_bandwidth_factor(family, ctx.protocol, kind, ctx.multi_node, ctx.ranks_per_node)


def _level_phase(kind: CollectiveKind, algorithm: Algorithm, use: LevelUse, size: float, ctx: _Ctx) -> _Phase:
    try:
        rule = get_rule(kind, algorithm)
    except ConfigError as exc:
        raise _Unavailable(str(exc)) from None
    if rule.pattern is None:
        raise _Unavailable(f"{algorithm.value} is composed from levels, not a level's algorithm")
    try:
        p = path(use, rule.pattern)
    except ConfigError as exc:
        raise _Unavailable(str(exc)) from None
    link = use.level.link
    alpha = _alpha(link, rule.family, ctx) * p.alpha_hops + _alltoall_latency(kind, rule, (link,), ctx)
    beta = link.beta_s_per_byte * p.beta_share / _factor(rule.family, kind, ctx)
    rho = 0.0 if rule.pattern is Pattern.IN_NETWORK else link.reduce_s_per_byte
    return _Phase(kind, rule, float(use.extent), size, alpha, beta, link.kernel_s_per_byte, use.level.name, (link.name,), rho)


def _ring_phase(kind: CollectiveKind, active: Sequence[LevelUse], size: float, ctx: _Ctx) -> _Phase:
    rule = get_rule(kind, A.RING)

    def alpha_of(link: Link) -> float:
        return _alpha(link, "ring", ctx)

    alpha, beta, delta, limiting = ring_path(active, alpha_of)
    n = math.prod(u.extent for u in active)
    links = tuple(dict.fromkeys(u.level.link.name for u in active))
    return _Phase(kind, rule, float(n), size, alpha, beta / _factor("ring", kind, ctx), delta, limiting.level.name, links,
                  limiting.level.link.reduce_s_per_byte)


def _direct_phase(kind: CollectiveKind, active: Sequence[LevelUse], size: float, ctx: _Ctx) -> _Phase:
    rule = get_rule(kind, A.DIRECT)

    def alpha_of(link: Link) -> float:
        return _alpha(link, rule.family, ctx)

    alpha, beta, delta, limiting = direct_path(active, alpha_of)
    alpha += _alltoall_latency(kind, rule, [u.level.link for u in active], ctx)
    n = math.prod(u.extent for u in active)
    links = tuple(dict.fromkeys(u.level.link.name for u in active))
    return _Phase(kind, rule, float(n), size, alpha, beta, delta, limiting.level.name, links, limiting.level.link.reduce_s_per_byte)


def _in_network_phase(kind: CollectiveKind, active: Sequence[LevelUse], size: float, ctx: _Ctx) -> _Phase:
    rule = get_rule(kind, A.IN_NETWORK)

    def alpha_of(link: Link) -> float:
        return _alpha(link, rule.family, ctx)

    try:
        alpha, beta, delta, limiting = in_network_path(active, alpha_of)
    except ConfigError as exc:
        raise _Unavailable(str(exc)) from None
    n = math.prod(u.extent for u in active)
    links = tuple(dict.fromkeys(u.level.link.name for u in active))
    return _Phase(kind, rule, float(n), size, alpha, beta, delta, limiting.level.name, links)


@dataclass(frozen=True, slots=True)
class _Slot:
    """One phase of an algorithm, all but its size: a sweep costs one group at many sizes."""

    divisor: int | None  # the phase moves the size / divisor (None: the size as given)
    candidates: tuple[_Phase, ...]  # built at size 0, in the order a chooser tries them
    by_time: bool  # the fastest at the size is chosen (a level of ``hierarchical``), else the one is taken
    kind: CollectiveKind
    level: str


def _inner_candidates(kind: CollectiveKind, use: LevelUse, top: bool, level_index: int, ctx: _Ctx) -> tuple[Algorithm, ...]:
    if ctx.library is _NCCL:
        algs = list(nccl.default_algorithms(kind, levels=1, spans_nodes=level_index > 0, in_network=use.level.in_network,
                                            ranks=use.extent))
        return tuple(a for a in algs if a is not A.HIERARCHICAL)
    return tuple(a for a in registered_algorithms(kind) if get_rule(kind, a).pattern is not None)


def _slots(kind: CollectiveKind, algorithm: Algorithm, uses: Sequence[LevelUse], ctx: _Ctx) -> list[_Slot]:
    """The phases of ``algorithm`` on the group, as slots (raises _Unavailable where it cannot
    run, at any size)."""
    active = [u for u in uses if u.extent > 1]

    def one(ph: _Phase) -> _Slot:
        return _Slot(None, (ph,), False, ph.kind, ph.where)

    if algorithm is A.HIERARCHICAL:
        index = {id(u): i for i, u in enumerate(uses)}  # level number in the topology (0: inside a node)

        def best(k: CollectiveKind, use: LevelUse, top: bool) -> tuple[_Phase, ...]:
            found = []
            for alg in _inner_candidates(k, use, top, index.get(id(use), 0), ctx):
                try:
                    found.append(_level_phase(k, alg, use, 0.0, ctx))
                except _Unavailable:
                    continue
            if not found:
                raise _Unavailable(f"no {k.value} algorithm on {use.level.name}")
            return tuple(found)

        return _compose(kind, active, best, True)
    if len(active) == 1:
        return [one(_level_phase(kind, algorithm, active[0], 0.0, ctx))]
    if algorithm is A.RING:
        return [one(_ring_phase(kind, active, 0.0, ctx))]
    if algorithm is A.DIRECT and kind is not K.SEND_RECV:
        return [one(_direct_phase(kind, active, 0.0, ctx))]
    if algorithm is A.IN_NETWORK:
        return [one(_in_network_phase(kind, active, 0.0, ctx))]
    if kind is K.ALL_REDUCE and algorithm not in _HALVES:
        # no reduce-scatter half: the all-reduce on every level, on the whole buffer
        return [one(_level_phase(kind, algorithm, u, 0.0, ctx)) for u in active]

    def fixed(k: CollectiveKind, use: LevelUse, top: bool) -> tuple[_Phase, ...]:
        alg = algorithm
        if k is not K.ALL_REDUCE and algorithm in _HALVES:
            rs, ag = _HALVES[algorithm]
            alg = rs if k is K.REDUCE_SCATTER else ag if k is K.ALL_GATHER else algorithm
        return (_level_phase(k, alg, use, 0.0, ctx),)

    return _compose(kind, active, fixed, False)


def _compose(kind: CollectiveKind, active: Sequence[LevelUse],
             candidates: Callable[[CollectiveKind, LevelUse, bool], tuple[_Phase, ...]], by_time: bool) -> list[_Slot]:
    """Slots of a level-by-level algorithm (module docstring): level i moves the size divided
    by the ranks below it; ``candidates(kind, use, top)``."""
    below, divisors = 1, []
    for u in active:
        divisors.append(below)
        below *= u.extent
    top = len(active) - 1

    def slot(k: CollectiveKind, u: LevelUse, divisor: int | None, is_top: bool) -> _Slot:
        return _Slot(divisor, candidates(k, u, is_top), by_time, k, u.level.name)

    if kind is K.ALL_REDUCE:
        slots = [slot(K.REDUCE_SCATTER, u, divisors[i], False) for i, u in enumerate(active[:-1])]
        slots.append(slot(K.ALL_REDUCE, active[-1], divisors[top], True))
        slots += [slot(K.ALL_GATHER, u, divisors[i], False) for i, u in reversed(list(enumerate(active[:-1])))]
        return slots
    if kind is K.REDUCE_SCATTER:
        return [slot(kind, u, divisors[i], i == top) for i, u in enumerate(active)]
    if kind is K.ALL_GATHER:
        return [slot(kind, u, divisors[i], i == top) for i, u in reversed(list(enumerate(active)))]
    if kind is K.SEND_RECV:
        return [slot(kind, active[-1], None, True)]
    return [slot(kind, u, None, i == top) for i, u in enumerate(active)]


def _pick(slot: _Slot, size: float, gamma: float) -> tuple[_Phase, float, float] | None:
    """(phase, bytes it moves, seconds) of ``slot`` for a message of ``size``: the first of the
    fastest candidates where chosen by time; None when none has a finite time."""
    moved = size if slot.divisor is None else size / slot.divisor
    if not slot.by_time:
        ph = slot.candidates[0]
        return ph, moved, _time_at(ph, moved, gamma)
    best: _Phase | None = None
    best_t = math.inf
    for ph in slot.candidates:
        t = _time_at(ph, moved, gamma)
        if t < best_t:
            best, best_t = ph, t
    return None if best is None else (best, moved, best_t)


def _phases(kind: CollectiveKind, algorithm: Algorithm, uses: Sequence[LevelUse], size: float, ctx: _Ctx) -> list[_Phase]:
    phases = []
    for slot in _slots(kind, algorithm, uses, ctx):
        picked = _pick(slot, size, ctx.gamma)
        if picked is None:
            raise _Unavailable(f"no {slot.kind.value} algorithm on {slot.level}")
        ph, moved, _ = picked
        phases.append(replace(ph, size=moved))
    return phases


# --------------------------------------------------------------------------------------------
# Selection
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Result:
    algorithm: Algorithm
    protocol: Protocol
    phases: tuple[_Phase, ...]
    base_s: float
    time_s: float


def _candidates(kind: CollectiveKind, uses: Sequence[LevelUse], library: CollectiveLibrary) -> tuple[Algorithm, ...]:
    active = [u for u in uses if u.extent > 1]
    in_network = all(u.level.in_network for u in active)
    if library is _NCCL:
        spans_nodes = any(u.extent > 1 for u in uses[1:])
        return nccl.default_algorithms(kind, levels=len(active), spans_nodes=spans_nodes, in_network=in_network,
                                       ranks=math.prod(u.extent for u in active))
    algs = [a for a in registered_algorithms(kind) if get_rule(kind, a).pattern is not None]
    if len(active) > 1 and A.HIERARCHICAL in registered_algorithms(kind):
        algs.append(A.HIERARCHICAL)
    return tuple(algs)


def _evaluate(kind: CollectiveKind, algorithm: Algorithm, uses: tuple[LevelUse, ...], size: float, library: CollectiveLibrary,
              overhead_s: float, gamma: float) -> _Result:
    active = [u for u in uses if u.extent > 1]
    multi_node = any(u.extent > 1 for u in uses[1:])
    ranks_per_node = uses[0].extent if uses else 1
    if library is _NCCL:
        protocols = nccl.available_protocols(u.level.link.hw for u in active)
    else:
        protocols = (Protocol.SIMPLE,)
    best: _Result | None = None
    reasons: list[str] = []
    for protocol in protocols:
        ctx = _Ctx(library, protocol, multi_node, ranks_per_node, gamma)
        try:
            phases = _phases(kind, algorithm, uses, size, ctx)
        except _Unavailable as exc:
            reasons.append(str(exc))
            continue
        base = 0.0
        if library is _NCCL:
            base = max(nccl.base_latency_s(ph.rule.family, protocol) for ph in phases)
        total = overhead_s + base + sum(_phase_time(ph, gamma) for ph in phases)
        if best is None or total < best.time_s:
            best = _Result(algorithm, protocol, tuple(phases), base, total)
    if best is None:
        raise _Unavailable(reasons[-1] if reasons else f"{algorithm.value} is not available")
    return best


def _fmt_s(t: float) -> str:
    return fmt_s(t, sig=4)  # one unit style with the site: µs, never us


def _describe(result: _Result, overhead_s: float, gamma: float, library: CollectiveLibrary) -> str:
    parts = []
    if overhead_s:
        parts.append(f"overhead {_fmt_s(overhead_s)}")
    if library is _NCCL:
        parts.append(f"base latency {_fmt_s(result.base_s)} ({result.protocol.value})")
    for ph in result.phases:
        text = fill_formula(ph.rule, ph.m, ph.size, ph.alpha, ph.beta, gamma)
        if ph.delta and ph.m > 1:
            text += f", + K d (K={float(kernel_bytes(ph.kind, ph.m, ph.size)):.6g} B, d={ph.delta * 1e12:.4g} ps/B)"
        reduced = float(reduced_block_bytes(ph.kind, ph.m, ph.size)) if ph.rho and ph.m > 1 else 0.0
        if reduced:
            text += f", + R r (R={reduced:.6g} B, r={ph.rho * 1e12:.4g} ps/B)"
        parts.append(f"[{ph.kind.value} {ph.rule.algorithm.value} on {ph.where}: {text} = {_fmt_s(_phase_time(ph, gamma))}]")
    return " + ".join(parts) + f" = {_fmt_s(result.time_s)}"


@functools.lru_cache(maxsize=65536)
def _cost_cached(kind: CollectiveKind, uses: tuple[LevelUse, ...], n: int, size: float, algorithm: Algorithm | None,
                 library: CollectiveLibrary, overhead_s: float, gamma: float) -> CollectiveCost:
    active = [u for u in uses if u.extent > 1]
    if n <= 1 or not active:
        chosen = algorithm or (nccl.default_algorithms(kind, levels=1, spans_nodes=False, in_network=False)[0])
        return CollectiveCost(kind, chosen.value, n, size, 0.0, 0.0, 0.0, 0.0, "", 0, "", "n = 1: nothing to send")
    if algorithm is not None:
        try:
            results = [_evaluate(kind, algorithm, uses, size, library, overhead_s, gamma)]
        except _Unavailable as exc:
            valid = _valid(kind, uses, size, library, overhead_s, gamma)
            raise ConfigError(
                f"{algorithm.value} is not available for {kind.value} here ({exc}); valid: {', '.join(a.value for a in valid) or 'none'}"
            ) from None
        alternatives = [(algorithm.value, results[0].time_s)]
    else:
        results = []
        for alg in _candidates(kind, uses, library):
            try:
                results.append(_evaluate(kind, alg, uses, size, library, overhead_s, gamma))
            except _Unavailable:
                continue
        if not results:
            raise ConfigError(f"no algorithm can run {kind.value} on this network")
        results.sort(key=lambda r: r.time_s)
        alternatives = [(r.algorithm.value, r.time_s) for r in results]
    best = results[0]
    sent = sum(float(ph.rule.bytes_sent_per_gpu(ph.m, ph.size)) for ph in best.phases)
    steps = sum(int(round(float(ph.rule.steps(ph.m)))) for ph in best.phases)
    limiting = max(best.phases, key=lambda ph: _phase_bandwidth_time(ph, gamma)).where
    links = " + ".join(dict.fromkeys(name for ph in best.phases for name in ph.links))
    moving = size > 0 and best.time_s > 0
    algbw = size / best.time_s if moving else 0.0
    return CollectiveCost(
        kind=kind,
        algorithm=best.algorithm.value,
        n=n,
        message_bytes=size,
        bytes_sent_per_gpu=sent,
        time_s=best.time_s,
        algbw_bytes_per_s=algbw,
        busbw_bytes_per_s=algbw * busbw_factor(kind, n),
        link=links,
        steps=steps,
        limiting_link=limiting,
        formula=_describe(best, overhead_s, gamma, library),
        protocol=best.protocol.value,
        alternatives=tuple(alternatives),
    )


def _valid(kind: CollectiveKind, uses: tuple[LevelUse, ...], size: float, library: CollectiveLibrary, overhead_s: float, gamma: float) -> list[Algorithm]:
    out = []
    levels = sum(1 for u in uses if u.extent > 1)
    for alg in registered_algorithms(kind):
        if alg is A.HIERARCHICAL and levels < 2:
            continue  # on one level it is that level's best algorithm, not a choice of its own
        try:
            _evaluate(kind, alg, uses, size, library, overhead_s, gamma)
        except _Unavailable:
            continue
        out.append(alg)
    return out


def available_algorithms(topology: Topology, kind: CollectiveKind, *, ranks: Sequence[int] | None = None,
                         library: str = "textbook") -> tuple[Algorithm, ...]:
    """Every algorithm that can run ``kind`` on ``topology`` (what ``--algorithm`` accepts there)."""
    uses = topology.uses(ranks)
    if not any(u.extent > 1 for u in uses):
        return registered_algorithms(kind)
    return tuple(_valid(kind, uses, 1.0, CollectiveLibrary.of(library), 0.0, 0.0))


def _check_common(kind: CollectiveKind, message_bytes: float, algorithm: Algorithm | None, library: str, overhead_s: float,
                  gamma_s_per_byte: float) -> float:
    if not isinstance(kind, CollectiveKind):
        raise ConfigError(f"kind must be a CollectiveKind, got {kind!r}")
    size = check_message_bytes(kind, message_bytes)
    if algorithm is not None and not isinstance(algorithm, Algorithm):
        raise ConfigError(f"algorithm must be an Algorithm or None, got {algorithm!r}")
    if algorithm is not None and algorithm not in registered_algorithms(kind):
        valid = ", ".join(a.value for a in registered_algorithms(kind))
        raise ConfigError(f"{algorithm.value} is not an algorithm for {kind.value}; valid: {valid}")
    if library not in LIBRARIES:
        raise ConfigError(f"library must be one of {', '.join(LIBRARIES)}, got {library!r}")
    if not (math.isfinite(overhead_s) and overhead_s >= 0):
        raise ConfigError(f"overhead_s must be a finite number >= 0, got {overhead_s!r}")
    if not (math.isfinite(gamma_s_per_byte) and gamma_s_per_byte >= 0):
        raise ConfigError(f"gamma_s_per_byte must be a finite number >= 0, got {gamma_s_per_byte!r}")
    return size


def cost_on_topology(
    topology: Topology,
    kind: CollectiveKind,
    message_bytes: float,
    *,
    ranks: Sequence[int] | None = None,
    algorithm: Algorithm | None = None,
    library: str = "textbook",
    overhead_s: float = 0.0,
    gamma_s_per_byte: float = 0.0,
) -> CollectiveCost:
    """Cost of ``kind`` over ``ranks`` (default: every rank) of ``topology``.

    Parameters
    ----------
    topology
        Where the ranks sit (:mod:`.topology`).
    kind, message_bytes
        The collective and S (nccl-tests convention, :mod:`.collectives`).
    ranks
        The group; default all ``topology.num_ranks`` ranks.
    algorithm
        ``None``: the fastest candidate (``library`` decides which are candidates).
    library
        ``"textbook"`` (plain formulas; every algorithm the topology supports is a candidate) or
        ``"nccl"`` (:mod:`.nccl`: protocols, base latencies, NCCL's algorithms).
    overhead_s, gamma_s_per_byte
        Per-call overhead (s) and reduction cost (s/B).

    Raises
    ------
    ConfigError
        Bad size, an unknown or unavailable algorithm (the message lists the valid ones), a rank
        outside the topology.
    """
    size = _check_common(kind, message_bytes, algorithm, library, overhead_s, gamma_s_per_byte)
    library = CollectiveLibrary.of(library)  # a flag's string becomes the member the model compares by identity
    uses = topology.uses(ranks)
    n = topology.num_ranks if ranks is None else len(set(ranks))
    if ranks is not None and len(set(ranks)) != len(ranks):
        raise ConfigError("a communication group lists a rank twice")
    return _cost_cached(kind, uses, n, size, algorithm, library, float(overhead_s), float(gamma_s_per_byte))


@functools.lru_cache(maxsize=256)
def _topology_of(cluster: Cluster) -> Topology:
    return cluster_topology(cluster)


@functools.lru_cache(maxsize=4096)
def _uses_of(cluster: Cluster, ranks: tuple[int, ...]) -> tuple[LevelUse, ...]:
    for r in ranks:
        if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < cluster.num_gpus:
            raise ConfigError(f"rank {r!r} is outside the cluster's {cluster.num_gpus} GPUs (0..{cluster.num_gpus - 1})")
    if len(set(ranks)) != len(ranks):
        raise ConfigError("a communication group lists a rank twice")
    return _topology_of(cluster).uses(ranks)


def collective_cost_for_group(
    cluster: Cluster,
    kind: CollectiveKind,
    ranks: Sequence[int],
    message_bytes: float,
    *,
    algorithm: Algorithm | None = None,
    gamma_s_per_byte: float = 0.0,
) -> CollectiveCost:
    """Cost of ``kind`` over the global ``ranks`` of ``cluster``, on the links the group really uses.

    The group is placed on the cluster's two levels (GPUs of a node; nodes): a tensor group inside
    a node runs on NVLink (on a DGX-1 cube-mesh, only the NVLinks between its GPUs), a data group
    with one GPU per node on that GPU's NIC share, a group with k GPUs on each of N nodes on k NIC
    shares per node (NCCL runs one ring per NIC; the baseline's one-share limitation is gone) or
    hierarchically.  With ``algorithm=None`` the fastest of the library's algorithms wins
    (``cluster.collective_library``: ``"nccl"`` for the presets).

    Parameters
    ----------
    cluster
        The hardware.
    kind
        The collective.
    ranks
        Global ranks of the group (any order, no repeats).
    message_bytes
        S, nccl-tests convention (:mod:`.collectives`).
    algorithm
        Force an algorithm (``Algorithm.HIERARCHICAL``, ``Algorithm.RING``, ...).
    gamma_s_per_byte
        Reduction cost (s/B), default 0.

    Returns
    -------
    CollectiveCost
        With ``steps``, ``limiting_link``, ``formula`` (symbols filled in), ``protocol`` and the
        costed ``alternatives``.  Results are cached: the analysis calls this a few hundred times.

    Raises
    ------
    ConfigError
        Empty group, a rank outside the cluster or repeated, a bad size, an unknown or
        unavailable algorithm.
    """
    size = _check_common(kind, message_bytes, algorithm, cluster.collective_library, cluster.collective_overhead_s,
                         gamma_s_per_byte)
    group = tuple(ranks)
    if not group:
        raise ConfigError("a communication group needs at least one rank")
    uses = _uses_of(cluster, group)
    cost = _cost_cached(kind, uses, len(group), size, algorithm, cluster.collective_library,
                        float(cluster.collective_overhead_s), float(gamma_s_per_byte))
    fitted = _fitted_time(cluster, kind, uses, len(group), size) if algorithm is None else None
    if fitted is None:
        return cost
    t, text = fitted
    algbw = size / t if size > 0 and t > 0 else 0.0
    return replace(cost, time_s=t, algbw_bytes_per_s=algbw, busbw_bytes_per_s=algbw * busbw_factor(kind, len(group)),
                   formula=text)


def _fitted_time(cluster: Cluster, kind: CollectiveKind, uses: tuple[LevelUse, ...], n: int,
                 size: float) -> tuple[float, str] | None:
    """(seconds, formula) of ``kind`` from the cluster's measured collectives
    (:attr:`~dml2comm.hardware.cluster.Cluster.collective_fits`, written by ``python main.py
    calibrate``), or None when none was measured for this kind on this level (the link model
    answers).  ``t = overhead + alpha + beta S f(n) / f(n_fit)``: the fit of the same kind and
    level with the nearest group size, its bus bandwidth kept for another size (``f``: the
    nccl-tests bus-bandwidth factor; nccl-tests doc/PERFORMANCE.md: busbw is meant to be
    independent of the rank count, so it carries over), its latency as measured."""
    if not cluster.collective_fits or n <= 1:
        return None
    level = "inter_node" if any(u.extent > 1 for u in uses[1:]) else "intra_node"
    same = [f for f in cluster.collective_fits if f.kind == kind.value and f.level == level]
    if not same:
        return None
    fit = min(same, key=lambda f: (abs(math.log(f.group_size / n)), f.group_size))
    scale = float(busbw_factor(kind, n)) / float(busbw_factor(kind, fit.group_size))
    t = cluster.collective_overhead_s + fit.alpha_s + fit.beta_s_per_byte * size * scale
    where = "" if fit.group_size == n else f", busbw carried from n={fit.group_size}"
    text = (f"calibrated {kind.value} n={fit.group_size} {level.replace('_', '-')}{where}: "
            + (f"overhead {_fmt_s(cluster.collective_overhead_s)} + " if cluster.collective_overhead_s else "")
            + f"alpha {_fmt_s(fit.alpha_s)} + S x beta ({size:.6g} B x {fit.beta_s_per_byte * scale * 1e12:.4g} ps/B) = {_fmt_s(t)}")
    return t, text


def group_placement(cluster: Cluster, ranks: Sequence[int]) -> tuple[LevelUse, ...]:
    """How the group ``ranks`` sits on the cluster's levels: what its cost depends on (groups
    with equal placements cost the same; the sweep's fast path keys its cache on this)."""
    group = tuple(ranks)
    if not group:
        raise ConfigError("a communication group needs at least one rank")
    return _uses_of(cluster, group)


def placement_period(cluster: Cluster) -> int:
    """A rank shift under which every group keeps its placement (:func:`group_placement`):
    shifting a group by a multiple of the ranks below the top level moves only its top-level
    coordinates, all by the same amount, so its extent on every level is unchanged.  When the
    top level records which coordinates a group uses (a link matrix), no shift but the whole
    cluster is safe."""
    levels = _topology_of(cluster).levels
    if levels[-1].kind is LevelKind.LINK_MATRIX:
        return cluster.num_gpus
    return math.prod(lv.size for lv in levels[:-1])


def collective_time_on_placement(cluster: Cluster, kind: CollectiveKind, placement: tuple[LevelUse, ...], n: int,
                                 message_bytes: float) -> float:
    """Seconds of ``kind`` over ``n`` ranks placed as ``placement`` (:func:`group_placement`);
    equals ``collective_cost_for_group(cluster, kind, ranks, message_bytes).time_s``."""
    size = _check_common(kind, message_bytes, None, cluster.collective_library, cluster.collective_overhead_s, 0.0)
    fitted = _fitted_time(cluster, kind, placement, n, size)
    if fitted is not None:
        return fitted[0]
    return _time_cached(kind, placement, n, size, cluster.collective_library, float(cluster.collective_overhead_s), 0.0)


@functools.lru_cache(maxsize=65536)
def _time_cached(kind: CollectiveKind, uses: tuple[LevelUse, ...], n: int, size: float, library: CollectiveLibrary, overhead_s: float,
                 gamma: float) -> float:
    """``_cost_cached(...).time_s`` with the library's choice of algorithm, without building
    the description (a sweep asks for times only, at many sizes): the same phases from
    :func:`_plan`'s size-independent parameters, timed and chosen as :func:`_evaluate` does."""
    if n <= 1 or not any(u.extent > 1 for u in uses):
        return 0.0
    best = math.inf
    for by_protocol in _plan(kind, uses, library, gamma):
        total = _plan_time(by_protocol, size, library, overhead_s, gamma)
        if total is not None:
            best = min(best, total)
    if best == math.inf:
        raise ConfigError(f"no algorithm can run {kind.value} on this network")
    return best


#: (kind, id of the placement, library, gamma) -> (placement, plan): the placement is held so
#: that its id stays its own.
_PLANS: dict[tuple, tuple] = {}


def _plan(kind: CollectiveKind, uses: tuple[LevelUse, ...], library: CollectiveLibrary, gamma: float) -> list[list[tuple[Protocol, list[_Slot]]]]:
    """Per candidate algorithm (:func:`_candidates`), per protocol that can run it (in
    :func:`_evaluate`'s order), its slots (:func:`_slots`)."""
    key = (kind, id(uses), library, gamma)
    held = _PLANS.get(key)
    if held is not None and held[0] is uses:
        return held[1]
    active = [u for u in uses if u.extent > 1]
    multi_node = any(u.extent > 1 for u in uses[1:])
    ranks_per_node = uses[0].extent if uses else 1
    protocols = nccl.available_protocols(u.level.link.hw for u in active) if library is _NCCL else (Protocol.SIMPLE,)
    plan = []
    for algorithm in _candidates(kind, uses, library):
        by_protocol = []
        for protocol in protocols:
            ctx = _Ctx(library, protocol, multi_node, ranks_per_node, gamma)
            try:
                by_protocol.append((protocol, _slots(kind, algorithm, uses, ctx)))
            except _Unavailable:
                continue
        plan.append(by_protocol)
    _PLANS[key] = (uses, plan)
    return plan


def _plan_time(by_protocol: list[tuple[Protocol, list[_Slot]]], size: float, library: CollectiveLibrary, overhead_s: float,
               gamma: float) -> float | None:
    """:func:`_evaluate`'s time of one algorithm (None: no protocol can run it)."""
    best: float | None = None
    for protocol, slots in by_protocol:
        chosen = [_pick(slot, size, gamma) for slot in slots]
        if any(c is None for c in chosen):  # _phases finds no algorithm for a level
            continue
        base = max(nccl.base_latency_s(ph.rule.family, protocol) for ph, _, _ in chosen) if library is _NCCL else 0.0
        total = overhead_s + base + sum(t for _, _, t in chosen)
        if best is None or total < best:
            best = total
    return best
