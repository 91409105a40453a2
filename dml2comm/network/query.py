"""One collective as ``python main.py collective`` asks for it: the names users give (``--op``,
``--algorithm``, topology aliases), a group on a topology or cluster (:class:`CollectiveSetup`),
its cost with what NCCL's candidates leave out, the nccl-tests-style table's rows, and the
presets' networks.  :mod:`dml2comm.cli.collective` reads the flags and prints.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from dml2comm.errors import ConfigError
from dml2comm.hardware.cluster import CLUSTERS, Cluster, Link, cluster_names
from dml2comm.network.collectives import CollectiveCost, busbw_factor, registered_algorithms
from dml2comm.network.kinds import Algorithm, CollectiveKind
from dml2comm.network.model import LIBRARIES, available_algorithms, collective_cost_for_group, cost_on_topology
from dml2comm.network.topology import TOPOLOGY_NAMES, Topology
from dml2comm.network.units import parse_size

__all__ = ["OPS", "TOPOLOGY_ALIASES", "CollectiveSetup", "collective_cost", "cost_record", "faster_elsewhere", "network_presets",
           "nic_share", "parse_algorithm", "parse_op", "table_rows", "table_sizes"]


#: ``--op`` spellings (lower case, ``_``/``-`` ignored) -> kind.
OPS: dict[str, CollectiveKind] = {
    "allreduce": CollectiveKind.ALL_REDUCE,
    "allgather": CollectiveKind.ALL_GATHER,
    "reducescatter": CollectiveKind.REDUCE_SCATTER,
    "broadcast": CollectiveKind.BROADCAST,
    "reduce": CollectiveKind.REDUCE,
    "alltoall": CollectiveKind.ALL_TO_ALL,
    "sendrecv": CollectiveKind.SEND_RECV,
}


ALGORITHM_ALIASES = {
    "tree": Algorithm.DOUBLE_BINARY_TREE,
    "dbt": Algorithm.DOUBLE_BINARY_TREE,
    "halving_doubling": Algorithm.RABENSEIFNER,
    "nvls": Algorithm.IN_NETWORK,
    "sharp": Algorithm.IN_NETWORK,
    "switch": Algorithm.IN_NETWORK,
    "two_level": Algorithm.HIERARCHICAL,
}


#: Names users bring from the literature and comparable tools (ASTRA-sim's "Torus2D", "Mesh") -> ours.
TOPOLOGY_ALIASES = {"torus": "torus2d", "2d-torus": "torus2d", "3d-torus": "torus3d", "mesh": "mesh2d", "2d-mesh": "mesh2d"}


def parse_op(text: str) -> CollectiveKind:
    """``all_reduce`` / ``ALL_REDUCE`` / ``allreduce`` -> kind; a ConfigError lists the valid ones."""
    key = text.strip().lower().replace("_", "").replace("-", "")
    kind = OPS.get(key)
    if kind is None:
        valid = ", ".join(k.value.lower() for k in CollectiveKind)
        raise ConfigError(f"unknown --op {text!r}; valid: {valid}")
    return kind


def parse_algorithm(text: str, kind: CollectiveKind) -> Algorithm:
    """An algorithm name (or alias: tree, nvls, ...) valid for ``kind``; a ConfigError lists the valid ones."""
    key = text.strip().lower().replace("-", "_")
    valid = registered_algorithms(kind)
    names = ", ".join(a.value for a in valid)
    try:
        alg = ALGORITHM_ALIASES.get(key) or Algorithm(key)
    except ValueError:
        raise ConfigError(f"unknown --algorithm {text!r} for {kind.value}; valid: {names}") from None
    if alg not in valid:
        raise ConfigError(f"--algorithm {alg.value} is not an algorithm for {kind.value}; valid: {names}")
    return alg


@dataclasses.dataclass(frozen=True)
class CollectiveSetup:
    kind: CollectiveKind
    n: int
    topology: Topology
    cluster: Cluster | None
    library: str
    overhead_s: float
    gamma: float
    description: str


def nic_share(nic: Link, nics: int, k: int) -> Link:
    used = min(nics, k)
    return dataclasses.replace(nic, bandwidth_bytes_per_s=nic.bandwidth_bytes_per_s * used / k,
                               name=f"{nic.name} ({nics} per node, {k} GPUs)")


def collective_cost(setup: CollectiveSetup, size: float, algorithm: Algorithm | None) -> CollectiveCost:
    if setup.cluster is not None:
        return collective_cost_for_group(setup.cluster, setup.kind, range(setup.n), size, algorithm=algorithm,
                                         gamma_s_per_byte=setup.gamma)
    return cost_on_topology(setup.topology, setup.kind, size, algorithm=algorithm, library=setup.library,
                            overhead_s=setup.overhead_s, gamma_s_per_byte=setup.gamma)


def cost_record(setup: CollectiveSetup, cost: CollectiveCost) -> dict[str, Any]:
    return {
        "kind": cost.kind.value,
        "n": cost.n,
        "message_bytes": cost.message_bytes,
        "time_s": cost.time_s,
        "bytes_sent_per_gpu": cost.bytes_sent_per_gpu,
        "steps": cost.steps,
        "algbw_bytes_per_s": cost.algbw_bytes_per_s,
        "busbw_bytes_per_s": cost.busbw_bytes_per_s,
        "busbw_factor": float(busbw_factor(cost.kind, cost.n)) if cost.n > 1 else 0.0,
        "algorithm": cost.algorithm,
        "protocol": cost.protocol,
        "limiting_link": cost.limiting_link,
        "links": cost.link,
        "formula": cost.formula,
        "alternatives": {a: t for a, t in cost.alternatives},
        "topology": setup.topology.to_dict(),
        "library": setup.library,
        "overhead_s": setup.overhead_s,
    }


def faster_elsewhere(setup: CollectiveSetup, cost: CollectiveCost) -> list[tuple[str, float]]:
    """Algorithms that run here, are not among the library's candidates (NCCL implements only some)
    and beat its pick: (name, time), fastest first."""
    if cost.n <= 1:
        return []
    candidates = {a for a, _ in cost.alternatives}
    out = []
    for alg in available_algorithms(setup.topology, setup.kind, ranks=list(range(setup.n)), library=setup.library):
        if alg.value in candidates:
            continue
        try:
            other = collective_cost(setup, cost.message_bytes, alg)
        except ConfigError:
            continue
        if other.time_s < cost.time_s:
            out.append((alg.value, other.time_s))
    return sorted(out, key=lambda x: x[1])


def table_sizes(min_bytes: str, max_bytes: str, step_factor: float) -> list[float]:
    """The message sizes of ``--table``: ``min_bytes`` times ``step_factor`` to the power 0, 1, ...
    up to ``max_bytes`` (at most 200), as nccl-tests' ``-b``/``-e``/``-f`` step them."""
    lo, hi = parse_size(min_bytes), parse_size(max_bytes)
    if hi < lo:
        raise ConfigError(f"--max-bytes ({max_bytes}) is smaller than --min-bytes ({min_bytes})")
    out, s = [], lo
    while s <= hi * (1 + 1e-12) and len(out) < 200:
        out.append(float(round(s)) if s >= 1 else s)
        s *= step_factor
    return out


def table_rows(setup: CollectiveSetup, sizes: Sequence[float], algorithm: str | None = None
               ) -> tuple[list[Algorithm], list[tuple[float, CollectiveCost, dict[str, CollectiveCost]]]]:
    """The algorithms of the table (every one available on the setup's topology, or only
    ``algorithm``) and per size (size, the default choice's cost, {algorithm: its cost}); an
    algorithm that cannot run at a size is left out of that row."""
    algs = list(available_algorithms(setup.topology, setup.kind, ranks=list(range(setup.n)), library=setup.library))
    if algorithm:
        algs = [parse_algorithm(algorithm, setup.kind)]
    rows = []
    for size in sizes:
        best = collective_cost(setup, size, None)
        per = {}
        for alg in algs:
            try:
                per[alg.value] = collective_cost(setup, size, alg)
            except ConfigError:
                continue
        rows.append((size, best, per))
    return algs, rows


def network_presets() -> dict[str, object]:
    """Topologies, algorithms per collective and each cluster preset's network, for ``presets``."""
    clusters = {}
    for name in cluster_names():
        c = CLUSTERS[name].build()
        clusters[name] = {
            "intra_topology": c.intra_topology,
            "intra_node": c.intra_node.name,
            "inter_node_per_gpu": c.inter_node.name,
            "nics_per_node": c.nics_per_node,
            "collective_library": c.collective_library,
            "collective_overhead_s": c.collective_overhead_s,
            "allreduce_busbw_8_gpus_bytes_per_s": collective_cost_for_group(c, CollectiveKind.ALL_REDUCE, range(c.gpus_per_node), 2.0**30).busbw_bytes_per_s,
        }
    return {
        "topologies": list(TOPOLOGY_NAMES),
        "algorithms": {k.value: [a.value for a in registered_algorithms(k)] for k in CollectiveKind},
        "libraries": list(LIBRARIES),
        "cluster_networks": clusters,
    }
