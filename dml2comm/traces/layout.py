"""Where each traced rank sits: its (dp, tp, pp, cp) coordinates and its model replica.

A **model replica** is the set of ranks that hold one copy of the model and train on one data
shard: the tp x cp x pp ranks with the same data-parallel index (tp x pp without context
parallelism).  Comparing replicas shows a straggling replica; the ranks inside one show the
slow pipeline stage or tensor rank.

Sources, the first that applies (:attr:`Layout.method`):

1. ``"process groups"``: each rank's own groups, from its trace.  Described groups
   (``distributedInfo.pg_config`` and the ``record_param_comms`` ``Process Group Ranks`` of a
   described group) count when the description names one pure dimension
   (:data:`~dml2comm.traces.patterns.COORD_GROUPS`: ``TENSOR_MODEL_PARALLEL_GROUP``,
   ``CONTEXT_PARALLEL_GROUP``, ``PIPELINE_MODEL_PARALLEL_GROUP``, ``DATA_PARALLEL_GROUP``,
   torchtitan's ``mesh_tp`` ...); groups known only by their ranks count with the dimension
   their collectives were classified into (:attr:`~dml2comm.traces.classify.Activity.group_dims`).
   A rank's coordinate in a dimension is its index in the sorted group (PyTorch's group rank).
   Ranks joined by tensor, context or pipeline groups are one replica (a replica holds whole
   groups of those dimensions), and so are ranks with the same data-parallel coordinate; the
   replica's number is that coordinate.  A set of joined ranks that knows no data-parallel
   coordinate, or whose ranks disagree on it (a group known only by its ranks that really
   combines data and context parallelism), is a replica of its own, numbered after the others
   in order of its smallest rank.
2. ``"send/recv peers"``: no rank names a group, but the point-to-point operations name their
   peers (``record_param_comms``' ``Dst Rank``/``Src Rank``; the ``c10d::send``/``c10d::recv_``
   operators' peer argument, recorded with ``record_shapes=True``): ranks that exchange
   activations are pipeline neighbours of one replica (a pair counts when both ranks' traces
   name each other, or when only one of the two was traced).  The stage order follows the
   direction of the traffic: in every schedule (GPipe, 1F1B, interleaved) the first message two
   neighbours exchange in a step is the first micro-batch's forward activation, so per step the
   rank whose first operation with a peer is a receive is downstream of it (phases cannot tell:
   1F1B sends gradients outside the backward pass); stage = longest chain of upstream
   neighbours (a ring, as interleaved schedules make, starts at its smallest rank).  The
   data-parallel index comes from the process groups that name no dimension (``pg_config``'s
   ``undefined`` groups, groups known by their ranks) whose members sit at the same stage of
   different pipelines: a rank's index in that sorted group; pipelines whose ranks disagree or
   know none are replicas numbered after the others.  With groups (1.), the peers still give the
   pipeline groups and stages, which a group known only by its ranks cannot (a send over the
   default group names the whole world).
3. ``"configuration"``: no rank names a group or a peer, and ``--d --t --p [--cp]`` multiply to
   the world size: the coordinates follow the rank order (:class:`~dml2comm.hardware.cluster.RankMap`,
   Megatron-LM's default: tensor fastest, then context, data, pipeline).
4. ``"assumed"``: nothing is known: each rank is drawn as its own replica, which is what a run
   with data parallelism only (DDP, FSDP) is.

References: PyTorch ``torch.distributed.new_group`` (members sorted; group rank = index),
Megatron-LM ``megatron/core/parallel_state.py`` (``RankGenerator``, group descriptions).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, NamedTuple

from dml2comm.traces.patterns import COORD_GROUPS

__all__ = ["COORD_DIMS", "DIM_WORDS", "RankPlace", "Layout", "ParallelSizes", "PeerCounts", "RankLinks", "Pipelines",
           "coordinate_groups", "pipelines_from_peers", "rank_layout"]

#: The coordinates of a rank, in the order they are shown (slowest-varying first).
COORD_DIMS = ("dp", "pp", "cp", "tp")
#: What a size of each dimension is called in messages, and its command-line flag.
DIM_WORDS = {"dp": ("data-parallel replica", "--d"), "pp": ("pipeline stage", "--p"), "cp": ("context-parallel rank", "--cp"),
             "tp": ("tensor-parallel rank", "--t")}


@dataclass(frozen=True)
class ParallelSizes:
    """The run's sizes as given on the command line, for the ``"configuration"`` fallback."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    order: str = "tdp"

    @property
    def world(self) -> int:
        return self.dp * self.tp * self.pp * self.cp


@dataclass(frozen=True)
class RankPlace:
    rank: int
    replica: int
    dp: int | None = None
    tp: int | None = None
    pp: int | None = None
    cp: int | None = None

    def label(self) -> str:
        """``rank 5 · pp 1 · tp 1`` (the coordinates that are known)."""
        parts = [f"rank {self.rank}"] + [f"{d} {getattr(self, d)}" for d in ("pp", "cp", "tp") if getattr(self, d) is not None]
        return " · ".join(parts)


class PeerCounts(NamedTuple):
    """What one rank's point-to-point operations with one peer say."""

    ops: int  # sends and receives with the peer
    upstream: int  # steps whose first operation with the peer is a receive (+1: the peer is upstream) or a send (-1)


@dataclass(frozen=True)
class RankLinks:
    """One rank's evidence for the ``"send/recv peers"`` layout."""

    peers: Mapping[int, PeerCounts]  # peer rank -> counts
    #: member ranks (sorted) of the rank's process groups that name no dimension
    groups: tuple[tuple[int, ...], ...] = ()
    #: the peers are ranks in a group the trace does not name (c10d operators), read as global ranks
    group_local: bool = False


@dataclass(frozen=True)
class Pipelines:
    """Pipeline groups found from send/recv peers."""

    stage: Mapping[int, int]  # rank -> stage index
    chains: tuple[tuple[int, ...], ...]  # the ranks of each pipeline by (stage, rank), by smallest rank
    notes: tuple[str, ...]  # what was assumed or dropped

    def simple(self, chain: tuple[int, ...]) -> bool:
        """One rank per stage (a line or a ring), so that a rank's index in ``chain`` is its stage."""
        return len({self.stage[r] for r in chain}) == len(chain)


@dataclass(frozen=True)
class Layout:
    method: str  # "process groups", "send/recv peers", "configuration" or "assumed"
    detail: str  # one sentence: what the layout rests on
    places: Mapping[int, RankPlace]
    replicas: tuple[tuple[int, ...], ...]  # the analysed ranks of each replica, by (pp, cp, tp, rank)
    replica_ids: tuple[int, ...]  # the replica number (data-parallel index) of each entry of replicas
    #: the size of each dimension (dp, pp, cp, tp) the traces show, None where they do not tell
    #: (see :func:`rank_layout`); the ``"configuration"`` and ``"assumed"`` layouts show none
    sizes: Mapping[str, int | None] = field(default_factory=lambda: dict.fromkeys(COORD_DIMS))

    def shown(self) -> str:
        """``2 pipeline stages x 2 data-parallel replicas`` (the sizes > 1 the traces show)."""
        parts = [f"{n} {DIM_WORDS[d][0]}s" for d in ("pp", "dp", "tp", "cp") if (n := self.sizes.get(d) or 0) > 1]
        if parts:
            return " x ".join(parts)
        return "one rank per replica and stage" if any(self.sizes.get(d) for d in COORD_DIMS) else "no sizes"

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.method, "detail": self.detail, "sizes": dict(self.sizes),
                "ranks": [{"rank": p.rank, "replica": p.replica, "dp": p.dp, "tp": p.tp, "pp": p.pp, "cp": p.cp}
                          for _, p in sorted(self.places.items())],
                "replicas": [{"replica": i, "ranks": list(r)} for i, r in zip(self.replica_ids, self.replicas)]}


def coordinate_groups(rank: int, described: Iterable[tuple[str, tuple[int, ...]]],
                      ranks_only: Mapping[tuple[int, ...], str]) -> dict[str, tuple[int, ...]]:
    """The groups of ``rank`` that give its coordinates: dimension -> sorted member ranks.

    ``described``: (description, members) pairs (pg_config, described collectives);
    ``ranks_only``: groups known only by their members -> the dimension of their collectives.
    A described group wins over one known by ranks only; groups without ``rank`` and groups of one
    rank (a dimension of size 1: coordinate 0, joins nothing) are ignored."""
    out: dict[str, tuple[int, ...]] = {}
    for desc, members in described:
        if rank not in members or len(members) < 2:
            continue
        for pattern, dim in COORD_GROUPS:
            if pattern.search(desc):
                out.setdefault(dim, tuple(sorted(members)))
                break
    for members, dim in ranks_only.items():
        if rank in members and len(members) > 1 and dim in ("dp", "tp", "pp", "cp"):
            out.setdefault(dim, tuple(sorted(members)))
    return out


class _Components:
    """Union-find over ranks."""

    def __init__(self) -> None:
        self.parent: dict[int, int] = {}

    def find(self, x: int) -> int:
        self.parent.setdefault(x, x)
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)


def pipelines_from_peers(links: Mapping[int, RankLinks], world: int | None = None) -> Pipelines | None:
    """Pipeline groups and stages from the analysed ranks' send/recv peers (module docstring,
    method 2), or None when no pair of ranks exchanged anything."""
    votes: dict[tuple[int, int], int] = {}  # (a, b), a < b -> evidence that a is upstream of b
    unconfirmed: set[tuple[int, int]] = set()
    for r, lk in links.items():
        for peer, counts in lk.peers.items():
            if peer == r or peer < 0 or (world is not None and peer >= world):
                continue
            pair = (min(r, peer), max(r, peer))
            if peer in links and r not in links[peer].peers:
                unconfirmed.add(pair)  # e.g. a rank in an unnamed group read as a global rank
                continue
            votes[pair] = votes.get(pair, 0) + (counts.upstream if peer == pair[0] else -counts.upstream)
    if not votes:
        return None
    notes = []
    if unconfirmed:
        shown = ", ".join(f"{a}-{b}" for a, b in sorted(unconfirmed)[:4]) + (" ..." if len(unconfirmed) > 4 else "")
        notes.append(f"peers that the other rank's trace does not name are ignored ({shown})")
    uf = _Components()
    succ: dict[int, set[int]] = {}
    guessed = []
    for (a, b), v in sorted(votes.items()):
        uf.union(a, b)
        up, down = (b, a) if v < 0 else (a, b)
        if v == 0:
            guessed.append(f"{a}-{b}")
        succ.setdefault(up, set()).add(down)
        succ.setdefault(down, set())
    if guessed:
        notes.append(f"the traffic does not tell the direction of {', '.join(guessed[:4])}: the smaller rank is taken as "
                     "upstream")
    members: dict[int, list[int]] = {}
    for r in sorted(succ):
        members.setdefault(uf.find(r), []).append(r)
    stage: dict[int, int] = {}
    chains = []
    for comp in sorted(members.values(), key=min):
        # longest path from the sources (Kahn's algorithm)
        indeg = {r: 0 for r in comp}
        for r in comp:
            for d in succ[r]:
                indeg[d] += 1
        level = {r: 0 for r in comp}
        ready = sorted(r for r in comp if indeg[r] == 0)
        seen = 0
        while ready:
            r = ready.pop(0)
            seen += 1
            for d in sorted(succ[r]):
                level[d] = max(level[d], level[r] + 1)
                indeg[d] -= 1
                if indeg[d] == 0:
                    ready.append(d)
        if seen < len(comp):  # a cycle: number the stages along the traffic from the smallest rank
            notes.append(f"ranks {', '.join(map(str, comp))} send in a ring (an interleaved schedule?): stage 0 is taken "
                         "at its smallest rank")
            level, order, r = {}, 0, min(comp)
            while r is not None and r not in level:
                level[r] = order
                order += 1
                r = next((d for d in sorted(succ[r]) if d not in level), None)
            for r in comp:
                level.setdefault(r, order)
        stage.update(level)
        chains.append(tuple(sorted(comp, key=lambda r: (level[r], r))))
    return Pipelines(stage, tuple(chains), tuple(notes))


def rank_layout(groups: Mapping[int, Mapping[str, tuple[int, ...]]], world: int | None = None,
                sizes: ParallelSizes | None = None, links: Mapping[int, RankLinks] | None = None) -> Layout:
    """The layout of the analysed ranks (the keys of ``groups``; see the module docstring).

    Parameters
    ----------
    groups : per analysed rank, its coordinate groups (:func:`coordinate_groups`).
    world : the world size the traces report, if any.
    sizes : the run's sizes from the command line, if given.
    links : per analysed rank, its send/recv peers and its groups that name no dimension.

    The :attr:`Layout.sizes` a layout from groups or peers shows: per dimension the largest group
    (pipeline: the longest pipeline; data parallelism from peers: the largest data-parallel
    group, else the number of pipelines when they all have the same length and fill the world);
    when the world size is known and one dimension is still unknown, world / the others."""
    ranks = sorted(groups)
    pipes = pipelines_from_peers(links, world) if links else None
    if any(groups[r] for r in ranks):
        if pipes is None:
            return _from_groups(groups, ranks, world)
        # the peers give each rank's pipeline group, ordered by stage (its index = its stage)
        merged = {r: dict(groups[r]) for r in ranks}
        for chain in pipes.chains:
            if pipes.simple(chain):
                for r in chain:
                    if r in merged:
                        merged[r]["pp"] = chain
        lay = _from_groups(merged, ranks, world)
        detail = lay.detail + "; pipeline groups and stages from the send/recv peers" + \
            "".join(f"; {n}" for n in pipes.notes)
        return Layout(lay.method, detail, lay.places, lay.replicas, lay.replica_ids, lay.sizes)
    if pipes is not None and links is not None:
        return _from_peers(ranks, pipes, links, world)
    if sizes is not None and sizes.world > 1 and (world is None or world == sizes.world) and ranks and ranks[-1] < sizes.world:
        return _from_sizes(ranks, sizes)
    places = {r: RankPlace(r, replica=i) for i, r in enumerate(ranks)}
    detail = ("no rank names its tensor, context, pipeline or data-parallel group or a send/recv peer, and no --d/--t/--p "
              "matching the world size was given: each rank is drawn as its own replica (right for data parallelism only)")
    return Layout("assumed", detail, places, tuple((r,) for r in ranks), tuple(range(len(ranks))))


def _complete(sizes: dict[str, int | None], world: int | None) -> dict[str, int | None]:
    """One unknown dimension of a known world: world / the product of the others (when it divides)."""
    unknown = [d for d in COORD_DIMS if sizes[d] is None]
    if world is not None and len(unknown) == 1:
        known = 1
        for d in COORD_DIMS:
            known *= sizes[d] or 1
        if world % known == 0:
            sizes[unknown[0]] = world // known
    return sizes


def _from_peers(ranks: list[int], pipes: Pipelines, links: Mapping[int, RankLinks], world: int | None) -> Layout:
    chain_of = {r: i for i, chain in enumerate(pipes.chains) for r in chain}
    candidates = sorted({g for r in ranks for g in links[r].groups if len(g) > 1})
    dp_groups = []
    for g in candidates:
        placed = [r for r in g if r in chain_of]
        if len(placed) == len(g) and len({chain_of[r] for r in g}) == len(g) and len({pipes.stage[r] for r in g}) == 1:
            dp_groups.append(g)
    dp_of: dict[int, int] = {}
    for g in dp_groups:
        for i, r in enumerate(g):
            dp_of.setdefault(r, i)
    # replicas: a pipeline is one; its number is its ranks' common data-parallel index
    replica_of: dict[int, int] = {}
    coord_dp: dict[int, int | None] = {}
    unknown: list[tuple[int, ...]] = []
    lone = [r for r in ranks if r not in chain_of]
    for chain in pipes.chains:
        dps = {dp_of[r] for r in chain if r in dp_of}
        if len(dps) != 1:  # none known, or they disagree: a replica of its own, numbered after the others
            unknown.append(chain)
            continue
        dp = next(iter(dps))
        for r in chain:
            replica_of[r] = coord_dp[r] = dp
    next_id = max(replica_of.values(), default=-1) + 1
    for chain in sorted(unknown + [(r,) for r in lone], key=min):
        for r in chain:
            replica_of[r] = next_id
        next_id += 1
    places = {r: RankPlace(r, replica_of[r], coord_dp.get(r), None, pipes.stage.get(r), None) for r in ranks}
    simple = [c for c in pipes.chains if pipes.simple(c)]
    lengths = {len(c) for c in pipes.chains}
    sizes: dict[str, int | None] = dict.fromkeys(COORD_DIMS)
    if simple:
        sizes["pp"] = max(len(c) for c in simple)
    if dp_groups:
        sizes["dp"] = max(len(g) for g in dp_groups)
    elif len(lengths) == 1 and world is not None and len(pipes.chains) * lengths.pop() == world and not lone:
        sizes["dp"] = len(pipes.chains)
    if world is not None and sizes["dp"] and sizes["pp"] and sizes["dp"] * sizes["pp"] == world:
        sizes["tp"] = sizes["cp"] = 1  # every rank is one stage of one replica
    source = "c10d::send/recv_ peer arguments (record_shapes)" if any(lk.group_local for lk in links.values()) else \
        "record_param_comms Dst Rank/Src Rank"
    shape = ", ".join(" -> ".join(map(str, c)) for c in pipes.chains[:4]) + (" ..." if len(pipes.chains) > 4 else "")
    detail = (f"no rank names its groups: pipeline neighbours from the send/recv peers ({source}), stage order from the "
              f"first message of each step between neighbours ({len(pipes.chains)} pipeline{'s' if len(pipes.chains) != 1 else ''}: "
              f"{shape})")
    if dp_groups:
        shown = ", ".join("(" + ", ".join(map(str, g)) + ")" for g in dp_groups[:4]) + (" ..." if len(dp_groups) > 4 else "")
        detail += f"; data-parallel index from the process groups {shown}, whose ranks sit at one stage of different pipelines"
    else:
        detail += "; no process group joins the pipelines: replicas numbered by their smallest rank"
    if lone:
        detail += f"; {len(lone)} rank{'s' if len(lone) != 1 else ''} without peers ({', '.join(map(str, lone[:8]))}) " \
                  f"{'form replicas' if len(lone) != 1 else 'forms a replica'} of {'their' if len(lone) != 1 else 'its'} own"
    detail += "".join(f"; {n}" for n in pipes.notes)
    return _finish("send/recv peers", detail, places, _complete(sizes, world))


def _from_groups(groups: Mapping[int, Mapping[str, tuple[int, ...]]], ranks: list[int], world: int | None = None) -> Layout:
    """Coordinates = index in each group (sorted members; a pipeline group from the peers is in
    stage order), replicas as in the module docstring."""
    sizes: dict[str, int | None] = dict.fromkeys(COORD_DIMS)
    for r in ranks:
        for dim, members in groups[r].items():
            if dim in sizes and r in members:
                sizes[dim] = max(sizes[dim] or 0, len(members))
    coord: dict[int, dict[str, int]] = {}
    uf = _Components()
    for r in ranks:
        coord[r] = {dim: members.index(r) for dim, members in groups[r].items() if r in members}
        uf.find(r)
        for dim in ("tp", "cp", "pp"):
            for m in groups[r].get(dim, ()):
                uf.union(r, m)
    components: dict[int, list[int]] = {}
    for r in ranks:
        components.setdefault(uf.find(r), []).append(r)
    replica_of: dict[int, int] = {}
    unknown: list[list[int]] = []
    for members in components.values():
        dps = {coord[r]["dp"] for r in members if "dp" in coord[r]}
        if len(dps) != 1:  # none known, or they disagree: a replica of its own, numbered after the others
            for r in members:
                coord[r].pop("dp", None)  # disagreeing indices are not coordinates
            unknown.append(members)
            continue
        for r in members:
            replica_of[r] = next(iter(dps))
    next_id = max(replica_of.values(), default=-1) + 1
    for members in sorted(unknown, key=min):
        for r in members:
            replica_of[r] = next_id
        next_id += 1
    places = {r: RankPlace(r, replica_of[r], coord[r].get("dp"), coord[r].get("tp"), coord[r].get("pp"), coord[r].get("cp"))
              for r in ranks}
    without = [r for r in ranks if not groups[r] and len(components[uf.find(r)]) == 1]
    detail = "each rank's tensor, context, pipeline and data-parallel groups as its trace names them"
    if without:
        one = len(without) == 1
        detail += (f"; {len(without)} rank{'' if one else 's'} without group information "
                   f"({', '.join(map(str, without[:8]))}{' ...' if len(without) > 8 else ''}) "
                   f"{'forms a replica' if one else 'form replicas'} of {'its' if one else 'their'} own")
    return _finish("process groups", detail, places, _complete(sizes, world))


def _from_sizes(ranks: list[int], sizes: ParallelSizes) -> Layout:
    from dml2comm.hardware.cluster import RankMap

    rm = RankMap(sizes.dp, sizes.tp, sizes.pp, sizes.order, cp=sizes.cp)
    places = {}
    for r in ranks:
        d, p, t = rm.coords(r)
        places[r] = RankPlace(r, d, d, t, p, rm.cp_rank(r))
    detail = (f"no rank names its groups: coordinates from --d {sizes.dp} --t {sizes.tp} --p {sizes.pp} --cp {sizes.cp} "
              f"in rank order {sizes.order!r} (first letter fastest)")
    return _finish("configuration", detail, places)


def _finish(method: str, detail: str, places: dict[int, RankPlace], sizes: Mapping[str, int | None] | None = None) -> Layout:
    by_replica: dict[int, list[RankPlace]] = {}
    for p in places.values():
        by_replica.setdefault(p.replica, []).append(p)
    ids = tuple(sorted(by_replica))
    replicas = tuple(tuple(p.rank for p in sorted(by_replica[i], key=lambda p: (p.pp or 0, p.cp or 0, p.tp or 0, p.rank)))
                     for i in ids)
    return Layout(method, detail, places, replicas, ids, dict(sizes) if sizes is not None else dict.fromkeys(COORD_DIMS))
