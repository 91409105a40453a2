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
2. ``"configuration"``: no rank names a group, and ``--d --t --p [--cp]`` multiply to the world
   size: the coordinates follow the rank order (:class:`~dml2comm.hardware.cluster.RankMap`,
   Megatron-LM's default: tensor fastest, then context, data, pipeline).
3. ``"assumed"``: nothing is known: each rank is drawn as its own replica, which is what a run
   with data parallelism only (DDP, FSDP) is.

References: PyTorch ``torch.distributed.new_group`` (members sorted; group rank = index),
Megatron-LM ``megatron/core/parallel_state.py`` (``RankGenerator``, group descriptions).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from dml2comm.traces.patterns import COORD_GROUPS

__all__ = ["COORD_DIMS", "RankPlace", "Layout", "ParallelSizes", "coordinate_groups", "rank_layout"]

#: The coordinates of a rank, in the order they are shown (slowest-varying first).
COORD_DIMS = ("dp", "pp", "cp", "tp")


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


@dataclass(frozen=True)
class Layout:
    method: str  # "process groups", "configuration" or "assumed"
    detail: str  # one sentence: what the layout rests on
    places: Mapping[int, RankPlace]
    replicas: tuple[tuple[int, ...], ...]  # the analysed ranks of each replica, by (pp, cp, tp, rank)
    replica_ids: tuple[int, ...]  # the replica number (data-parallel index) of each entry of replicas

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.method, "detail": self.detail,
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


def rank_layout(groups: Mapping[int, Mapping[str, tuple[int, ...]]], world: int | None = None,
                sizes: ParallelSizes | None = None) -> Layout:
    """The layout of the analysed ranks (the keys of ``groups``; see the module docstring).

    Parameters
    ----------
    groups : per analysed rank, its coordinate groups (:func:`coordinate_groups`).
    world : the world size the traces report, if any.
    sizes : the run's sizes from the command line, if given.
    """
    ranks = sorted(groups)
    if any(groups[r] for r in ranks):
        return _from_groups(groups, ranks)
    if sizes is not None and sizes.world > 1 and (world is None or world == sizes.world) and ranks and ranks[-1] < sizes.world:
        return _from_sizes(ranks, sizes)
    places = {r: RankPlace(r, replica=i) for i, r in enumerate(ranks)}
    detail = ("no rank names its tensor, context, pipeline or data-parallel group and no --d/--t/--p matching the world size "
              "was given: each rank is drawn as its own replica (right for data parallelism only)")
    return Layout("assumed", detail, places, tuple((r,) for r in ranks), tuple(range(len(ranks))))


def _from_groups(groups: Mapping[int, Mapping[str, tuple[int, ...]]], ranks: list[int]) -> Layout:
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
    return _finish("process groups", detail, places)


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


def _finish(method: str, detail: str, places: dict[int, RankPlace]) -> Layout:
    by_replica: dict[int, list[RankPlace]] = {}
    for p in places.values():
        by_replica.setdefault(p.replica, []).append(p)
    ids = tuple(sorted(by_replica))
    replicas = tuple(tuple(p.rank for p in sorted(by_replica[i], key=lambda p: (p.pp or 0, p.cp or 0, p.tp or 0, p.rank)))
                     for i in ids)
    return Layout(method, detail, places, replicas, ids)
