"""The ``collective`` subcommand: one collective's cost, or an nccl-tests-style table.

    python main.py collective --op all_reduce --topology ring --n 8 --size 1GiB --bandwidth 100GB/s --latency 5us
    python main.py collective --op all_reduce --cluster dgx-a100 --n 16 --size 256MiB --verbose
    python main.py collective --op all_gather --cluster dgx-h100 --n 8 --table --csv

:func:`run_collective` parses ``argv``, prints, and returns 0; bad input raises
:class:`~dml2comm.errors.ConfigError` with a one-line message, which :func:`dml2comm.cli.main`
prints as ``error: ...`` with exit code 2.  The costs come from :mod:`dml2comm.network.query`.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import io
import json
from typing import Sequence

from dml2comm.cli.args import OneLineParser, finite_float, positive_int
from dml2comm.errors import ConfigError
from dml2comm.fmt import decimal_int
from dml2comm.parallel.config import check_gpu_count
from dml2comm.hardware.cluster import CLUSTERS, NVLINK3_NVSWITCH_A100, Link, cluster_names
from dml2comm.network.collectives import CollectiveCost
from dml2comm.network.kinds import Algorithm, CollectiveKind
from dml2comm.network.model import LIBRARIES
from dml2comm.network.query import (TOPOLOGY_ALIASES, CollectiveSetup, collective_cost, cost_record, faster_elsewhere, nic_share,
                                    parse_algorithm, parse_op, table_rows, table_sizes)
from dml2comm.network.topology import TOPOLOGY_NAMES, TopologyName, cluster_topology, make_topology
from dml2comm.network.units import format_bytes, format_rate, format_seconds, parse_latency, parse_rate, parse_size

__all__ = ["run_collective"]


EXAMPLES = """examples:
  python main.py collective --op all_reduce --topology ring --n 8 --size 1GiB --bandwidth 100GB/s --latency 5us
  python main.py collective --op all_reduce --cluster dgx-a100 --n 16 --size 256MiB --verbose
  python main.py collective --op all_to_all --topology torus2d --dims 4x4 --n 16 --size 64MiB --bandwidth 50GB/s
  python main.py collective --op all_reduce --topology fat-tree --radix 4 --oversubscription 2 --n 64 --size 1GiB --bandwidth 25GB/s
  python main.py collective --op all_reduce --cluster dgx-h100 --n 8 --table --csv
  python main.py collective --op all_reduce --topology ring --algorithm ring --one-direction --n 8 --size 1GiB --verbose

sizes: 4096, 1e9, 64MB (10^6), 64MiB or 64M (2^20); rates: 100GB/s, 200Gb/s (bits), 25e9; latencies: 5us, 1.5ms, 2e-6.
busbw follows nccl-tests: AllReduce 2(n-1)/n x algbw; AllGather, ReduceScatter, AllToAll (n-1)/n; others 1.
topologies: torus and mesh read as torus2d and mesh2d. On ring and torus levels the ring algorithm runs two
counter-rotating rings (both directions of every link, half the textbook bandwidth term); --one-direction
costs the textbook single ring (one direction of each link).
"""


def _dims(text: str) -> tuple[int, ...]:
    parts = text.lower().replace("*", "x").replace(",", "x").split("x")
    try:
        dims = tuple(decimal_int(p.strip()) for p in parts)
    except ValueError:
        raise ConfigError(f"--dims must look like 4x4 or 4x2x2, got {text!r}") from None
    if any(d < 1 for d in dims):
        raise ConfigError(f"--dims must be positive integers, got {text!r}")
    return dims


#: The ``--table`` range flags' defaults (refused without ``--table``: they set nothing else).
_TABLE_DEFAULTS = {"min_bytes": "1KiB", "max_bytes": "1GiB", "step_factor": 4.0}
#: The topology flags and the topologies that read them (:func:`make_topology`); the others ignore them.
_TOPOLOGY_FLAGS = (("--radix", "radix", (TopologyName.TREE, TopologyName.FAT_TREE)), ("--levels", "levels", (TopologyName.FAT_TREE,)),
                   ("--oversubscription", "oversubscription", (TopologyName.FAT_TREE,)))


def _parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        command="collective",
        prog="python main.py collective",
        description="Cost one collective (alpha-beta models over a topology, or a cluster preset calibrated to NCCL).",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--op", required=True, help="all_reduce, all_gather, reduce_scatter, broadcast, reduce, all_to_all, send_recv")
    p.add_argument("--n", required=True, type=positive_int, help="ranks in the group (>= 1)")
    p.add_argument("--size", help="message size S (nccl-tests convention: AllGather output, ReduceScatter input, ...)")
    p.add_argument("--algorithm", help="force an algorithm (default: the fastest, as NCCL's tuner picks)")
    t = p.add_argument_group("topology (without --cluster)")
    t.add_argument("--topology", help="one of " + ", ".join(TOPOLOGY_NAMES) + " (torus, mesh: the 2-D forms; default switch; "
                   "hierarchical with --cluster)")
    t.add_argument("--one-direction", action="store_true",
                   help="ring and torus topologies: the ring algorithm uses one direction of each link (the textbook "
                        "single ring) instead of two counter-rotating rings over both")
    t.add_argument("--bandwidth", help="per link and direction, e.g. 100GB/s (default: one A100's NVLink, 300 GB/s)")
    t.add_argument("--latency", help="per message / per hop, e.g. 5us (default 3.4 µs, NCCL's NVLink step latency)")
    t.add_argument("--links-per-gpu", type=positive_int, default=1, help="parallel links per connection (default 1)")
    t.add_argument("--dims", type=_dims, help="mesh2d/torus2d/torus3d dimensions, e.g. 4x4 (default: as square as possible)")
    t.add_argument("--radix", type=positive_int, help="tree/fat-tree: GPUs per leaf switch and children per switch "
                                                      "(refused with the other topologies)")
    t.add_argument("--levels", type=positive_int, help="fat-tree tiers (default: as few as the radix allows)")
    t.add_argument("--oversubscription", type=finite_float(1.0), default=None,
                   help="fat-tree: per tier above the leaves (default 1: full bisection; refused with the other topologies)")
    t.add_argument("--in-network", action="store_true", help="switches reduce (SHARP / NVLink SHARP)")
    h = p.add_argument_group("cluster (two levels: nodes of GPUs, NICs between nodes)")
    h.add_argument("--cluster", help="preset: " + ", ".join(cluster_names()) + " (calibrated to NCCL)")
    h.add_argument("--gpus-per-node", type=positive_int, help="GPUs per node (hierarchical / overrides the preset)")
    h.add_argument("--nics-per-node", type=positive_int, help="NICs per node (default: one per GPU, or the preset's)")
    h.add_argument("--inter-bandwidth", help="per NIC, e.g. 200Gb/s (hierarchical / overrides the preset)")
    h.add_argument("--inter-latency", help="per inter-node step (default 14 µs, NCCL's network step latency)")
    m = p.add_argument_group("model")
    m.add_argument("--library", choices=LIBRARIES, help="textbook formulas, or NCCL's protocols and algorithms (default: nccl with --cluster)")
    m.add_argument("--overhead", help="fixed time per call, e.g. 50us (default: the preset's fitted overhead, 0 without --cluster)")
    m.add_argument("--gamma", type=finite_float(0.0), default=0.0, help="reduction seconds per byte (default 0)")
    o = p.add_argument_group("output")
    o.add_argument("--verbose", action="store_true", help="the formula with its symbols filled in, every candidate, the levels")
    o.add_argument("--json", action="store_true", help="print one JSON object")
    o.add_argument("--table", action="store_true", help="an nccl-tests-style table: sizes x algorithms")
    o.add_argument("--csv", action="store_true", help="with --table: CSV (one row per size and algorithm)")
    o.add_argument("--min-bytes", "-b", help=f"--table: smallest size (default {_TABLE_DEFAULTS['min_bytes']})")
    o.add_argument("--max-bytes", "-e", help=f"--table: largest size (default {_TABLE_DEFAULTS['max_bytes']})")
    o.add_argument("--step-factor", "-f", type=finite_float(1.0 + 1e-9), help=f"--table: size multiplier (default {_TABLE_DEFAULTS['step_factor']:g})")
    return p


def _setup(args: argparse.Namespace) -> CollectiveSetup:
    """The group the flags describe: ``--n`` ranks of a ``--cluster`` preset (two levels, calibrated
    to NCCL, its links overridable) or of a ``--topology`` built from the link flags."""
    kind = parse_op(args.op)
    overhead = parse_latency(args.overhead) if args.overhead is not None else None
    if args.cluster:
        return _cluster_setup(args, kind, overhead)
    return _topology_setup(args, kind, overhead)


def _cluster_setup(args: argparse.Namespace, kind: CollectiveKind, overhead: float | None) -> CollectiveSetup:
    n = args.n
    key = args.cluster.strip().lower().replace("_", "-")
    preset = CLUSTERS.get(key)
    if preset is None:
        raise ConfigError(f"unknown cluster {args.cluster!r}; valid names: {', '.join(cluster_names())}")
    if args.topology and args.topology.strip().lower() not in ("hierarchical", "cluster"):
        raise ConfigError(f"--cluster implies its own two-level topology; drop --topology {args.topology}")
    for flag, value in (("--dims", args.dims), ("--radix", args.radix), ("--levels", args.levels), ("--oversubscription", args.oversubscription)):
        if value is not None:
            raise ConfigError(f"{flag} does not apply to --cluster (a cluster is nodes of GPUs joined by NICs)")
    k = args.gpus_per_node or preset.gpus_per_node
    if preset.nvlink_matrix is not None and k > len(preset.nvlink_matrix):
        raise ConfigError(f"{preset.name} has {len(preset.nvlink_matrix)} GPUs per node; --gpus-per-node {k} is too many")
    cluster = preset.build(n, k)
    intra = cluster.intra_node
    if args.bandwidth is not None:
        intra = dataclasses.replace(intra, bandwidth_bytes_per_s=parse_rate(args.bandwidth) * args.links_per_gpu,
                                    name=f"{intra.name} at {args.bandwidth}")
    if args.latency is not None:
        intra = dataclasses.replace(intra, latency_s=parse_latency(args.latency))
    nic = preset.nic
    if args.inter_bandwidth is not None:
        nic = dataclasses.replace(nic, bandwidth_bytes_per_s=parse_rate(args.inter_bandwidth), name=f"NIC at {args.inter_bandwidth}")
    if args.inter_latency is not None:
        nic = dataclasses.replace(nic, latency_s=parse_latency(args.inter_latency))
    if args.in_network:
        intra = dataclasses.replace(intra, in_network_efficiency=intra.in_network_efficiency or intra.efficiency)
    nics = args.nics_per_node or preset.nics_per_node
    cluster = dataclasses.replace(
        cluster,
        intra_node=intra,
        inter_node=nic_share(nic, nics, k),
        nics_per_node=nics,
        collective_library=args.library or cluster.collective_library,
        collective_overhead_s=overhead if overhead is not None else cluster.collective_overhead_s,
    )
    topo = cluster_topology(cluster)
    desc = f"{preset.name}: {cluster.num_nodes} node(s) of {k} GPUs, {intra.name} inside, {cluster.inter_node.name} per GPU"
    return CollectiveSetup(kind, n, topo, cluster, cluster.collective_library, cluster.collective_overhead_s, args.gamma, desc)


def _topology_setup(args: argparse.Namespace, kind: CollectiveKind, overhead: float | None) -> CollectiveSetup:
    n = args.n
    for flag, value in (("--nics-per-node", args.nics_per_node),):
        if value is not None and (args.topology or "").strip().lower() != "hierarchical":
            raise ConfigError(f"{flag} applies to --topology hierarchical or --cluster")
    name = args.topology or "switch"
    name = TOPOLOGY_ALIASES.get(name.strip().lower().replace("_", "-"), name)
    _check_topology_flags(args, name)
    if args.bandwidth is None:
        per_link = NVLINK3_NVSWITCH_A100.bandwidth_bytes_per_s
        source = "default: one A100's 12 NVLink3 links (300 GB/s per direction)"
    else:
        per_link = parse_rate(args.bandwidth)
        source = f"--bandwidth {args.bandwidth}"
    latency = parse_latency(args.latency) if args.latency is not None else NVLINK3_NVSWITCH_A100.latency_s
    bw = per_link * args.links_per_gpu
    label = f"{format_rate(bw)}" + (f" ({args.links_per_gpu} x {format_rate(per_link)})" if args.links_per_gpu > 1 else "")
    if args.one_direction:
        # Two counter-rotating rings share each link's two directions (topology.path: beta_share 1/2 on
        # a ring level); one ring on one direction is the same formula over links of half the bandwidth:
        # 2((n-1)/n) S / B per AllReduce, Patarasuk & Yuan 2009 / Thakur et al. 2005.
        _check_one_direction(args, name)
        bw /= 2
        label += " (the ring uses one direction)"
    link = Link(
        name=f"link {label}, {format_seconds(latency)}",
        bandwidth_bytes_per_s=bw,
        latency_s=latency,
        efficiency=1.0,
        sources={"bandwidth_bytes_per_s": source, "latency_s": "--latency" if args.latency else "NCCL hwLat NVLink Ring Simple 3.4 µs"},
        links_per_gpu=args.links_per_gpu,
        in_network_efficiency=1.0 if args.in_network else None,
    )
    inter = None
    if name.strip().lower() == "hierarchical":
        if args.gpus_per_node is None or args.inter_bandwidth is None:
            raise ConfigError("--topology hierarchical needs --gpus-per-node and --inter-bandwidth (per NIC), or use --cluster NAME")
        nic_bw = parse_rate(args.inter_bandwidth)
        nic_lat = parse_latency(args.inter_latency) if args.inter_latency is not None else 14e-6
        nic = Link(f"NIC {format_rate(nic_bw)}, {format_seconds(nic_lat)}", nic_bw, nic_lat, 1.0,
                   {"bandwidth_bytes_per_s": "--inter-bandwidth", "latency_s": "--inter-latency or NCCL hwLat NET Ring Simple 14 µs"})
        inter = nic_share(nic, args.nics_per_node or args.gpus_per_node, args.gpus_per_node)
    elif args.gpus_per_node is not None or args.inter_bandwidth is not None:
        raise ConfigError("--gpus-per-node and --inter-bandwidth apply to --topology hierarchical or --cluster")
    topo = make_topology(name, n, link, dims=args.dims, radix=args.radix, levels=args.levels,
                         oversubscription=args.oversubscription or 1.0, in_network=args.in_network,
                         gpus_per_node=args.gpus_per_node, inter_link=inter)
    return CollectiveSetup(kind, n, topo, None, args.library or "textbook", overhead or 0.0, args.gamma, topo.description)


def _check_topology_flags(args: argparse.Namespace, name: str) -> None:
    """``--radix``, ``--levels`` and ``--oversubscription`` shape only the topologies of
    :data:`_TOPOLOGY_FLAGS`; given with another they would be ignored, so they are refused."""
    key = name.strip().lower().replace("_", "-")
    if key not in TOPOLOGY_NAMES:
        return  # make_topology refuses the name, listing the valid ones
    topology = TopologyName.of(key)
    for flag, attr, readers in _TOPOLOGY_FLAGS:
        if getattr(args, attr) is not None and topology not in readers:
            raise ConfigError(f"{flag} shapes --topology {' or '.join(readers)}, not {topology}; drop {flag} or change --topology")


def _check_one_direction(args: argparse.Namespace, topology: str) -> None:
    if topology.strip().lower() not in ("ring", "torus2d", "torus3d"):
        raise ConfigError(f"--one-direction applies to --topology ring, torus2d or torus3d (links with two directions "
                          f"that the ring algorithm can both use), not {topology}")
    if (args.algorithm or "").strip().lower() != "ring":
        raise ConfigError("--one-direction describes the ring algorithm; add --algorithm ring")


def _ring_note(setup: CollectiveSetup, cost: CollectiveCost, one_direction: bool) -> str:
    """How the ring algorithm uses a ring/torus level's links (the formula line alone does not say)."""
    if cost.algorithm != Algorithm.RING.value or not any(lv.kind.value == "ring" for lv in setup.topology.levels):
        return ""
    if one_direction:
        return " (one direction of each link: the textbook single ring; b = 1/link bandwidth)"
    return (" (two counter-rotating rings: both directions of every link, so b = 1/(2 x link bandwidth), half the "
            "textbook term; --one-direction for the single ring)")


def _how_chosen(setup: CollectiveSetup, cost: CollectiveCost, forced: bool) -> str:
    if forced:
        return "as requested"
    if not cost.alternatives:
        return "one rank: nothing to send"
    k = len(cost.alternatives)
    if setup.library == "nccl":
        return (f"NCCL's only algorithm here" if k == 1 else f"fastest of the {k} algorithms NCCL implements here")
    return f"fastest of {k} candidates"


def _print_one(setup: CollectiveSetup, cost: CollectiveCost, verbose: bool, forced: bool, one_direction: bool = False) -> None:
    print(f"{cost.kind.value}, {format_bytes(cost.message_bytes)} over {cost.n} rank(s): {setup.description}")
    how = _how_chosen(setup, cost, forced)
    print(f"  algorithm      {cost.algorithm} ({how}; protocol {cost.protocol}, {setup.library} model)")
    print(f"  time           {format_seconds(cost.time_s)}")
    print(f"  algbw / busbw  {format_rate(cost.algbw_bytes_per_s)} / {format_rate(cost.busbw_bytes_per_s)} (nccl-tests conventions)")
    print(f"  sent per GPU   {format_bytes(cost.bytes_sent_per_gpu)} in {cost.steps} step(s)")
    print(f"  limiting link  {cost.limiting_link or '-'}")
    if verbose:
        print(f"  links          {cost.link or '-'}")
        print(f"  formula        {cost.formula}{_ring_note(setup, cost, one_direction)}")
        alts = ", ".join(f"{a} {format_seconds(t)}" for a, t in cost.alternatives)
        print(f"  candidates     {alts or '-'}")
    faster = [] if forced else faster_elsewhere(setup, cost)
    if faster:
        print(f"  faster         {', '.join(f'{a} {format_seconds(t)}' for a, t in faster)}: not among the {setup.library} "
              "model's candidates, so not the default (--algorithm NAME forces one)")
    if verbose:
        for lv in setup.topology.levels:
            print(f"  level          {lv.kind.value} x{lv.size}: {lv.name} ({format_rate(lv.link.effective_bytes_per_s)}, "
                  f"{format_seconds(lv.link.latency_s)}, oversubscription {lv.oversubscription:g})")


def _table(setup: CollectiveSetup, args: argparse.Namespace) -> None:
    sizes = {k: default if getattr(args, k) is None else getattr(args, k) for k, default in _TABLE_DEFAULTS.items()}
    algs, rows = table_rows(setup, table_sizes(sizes["min_bytes"], sizes["max_bytes"], sizes["step_factor"]), args.algorithm)
    names = [a.value for a in algs]
    if args.csv:
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(["size_bytes", "algorithm", "protocol", "time_s", "algbw_bytes_per_s", "busbw_bytes_per_s", "steps", "selected"])
        for size, best, per in rows:
            for name in names:
                c = per.get(name)
                if c is not None:
                    w.writerow([f"{size:.0f}", name, c.protocol, repr(c.time_s), repr(c.algbw_bytes_per_s), repr(c.busbw_bytes_per_s),
                                c.steps, int(name == best.algorithm)])
        print(buf.getvalue(), end="")
        return
    print(f"# {setup.kind.value} over {setup.n} rank(s): {setup.description}; {setup.library} model")
    cands = sorted({a for _, best, _ in rows for a, _t in best.alternatives})
    if setup.library == "nccl":
        pool = f"the fastest of the algorithms NCCL implements here ({', '.join(cands)})"
    else:
        pool = f"the fastest of the {setup.library} model's candidates ({', '.join(cands)})"
    print(f"# time in µs, busbw in GB/s (nccl-tests conventions); * = the default choice: {pool}")
    if any(name not in cands for name in names):
        print("# + = the fastest in its row where that is an algorithm outside the default's candidates (--algorithm NAME forces it)")
    head = f"# {'size (B)':>12}" + "".join(f"  {name[:18]:>18} {'':>7}" for name in names) + f"  {'default':>18}"
    sub = f"# {'':>12}" + "".join(f"  {'time(µs)':>18} {'busbw':>7}" for _ in names)
    print(head)
    print(sub)
    for size, best, per in rows:
        cells = []
        for name in names:
            c = per.get(name)
            if c is None:
                cells.append(f"  {'n/a':>18} {'':>7}")
            else:
                fastest = min(per, key=lambda a: per[a].time_s)
                mark = "*" if name == best.algorithm else "+" if name == fastest and per[name].time_s < best.time_s else " "
                cells.append(f"  {c.time_s * 1e6:>17.2f}{mark} {c.busbw_bytes_per_s / 1e9:>7.2f}")
        print(f"  {size:>12.0f}" + "".join(cells) + f"  {best.algorithm[:18]:>18}")


_VALUE_FLAGS = {
    "--n", "--size", "--bandwidth", "--latency", "--inter-bandwidth", "--inter-latency", "--overhead", "--gamma",
    "--min-bytes", "--max-bytes", "--step-factor", "-b", "-e", "-f", "--links-per-gpu", "--radix", "--levels",
    "--oversubscription", "--gpus-per-node", "--nics-per-node",
}


def _attach_negative_values(argv: list[str]) -> list[str]:
    """``--size -1GiB`` -> ``--size=-1GiB``, so a negative value gets its own error, not argparse's."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok in _VALUE_FLAGS and i + 1 < len(argv) and len(argv[i + 1]) > 1 and argv[i + 1][0] == "-" and (
            argv[i + 1][1].isdigit() or argv[i + 1][1] == "."
        ):
            out.append(f"{tok}={argv[i + 1]}")
            i += 2
            continue
        out.append(tok)
        i += 1
    return out


def run_collective(argv: Sequence[str]) -> int:
    """``python main.py collective ...``: parse, cost, print; returns 0.

    Raises
    ------
    ConfigError
        Bad input, one line: n < 1; a size that is zero, negative or unreadable; an unknown op,
        topology, cluster or algorithm (the message lists the valid ones); mesh or torus
        dimensions that do not multiply to n; an algorithm unavailable on the topology.
    """
    args = _parser().parse_args(_attach_negative_values(list(argv)))
    check_gpu_count(args.n, "--n")  # a group of GPUs, bounded as a plan's are (its ranks are listed)
    setup = _setup(args)
    if args.table:
        if args.json:
            raise ConfigError("--table prints a table (or --csv); drop --json")
        _table(setup, args)
        return 0
    if args.csv:
        raise ConfigError("--csv goes with --table")
    for key in _TABLE_DEFAULTS:
        if getattr(args, key) is not None:
            flag = "--" + key.replace("_", "-")
            raise ConfigError(f"{flag} sets the range of --table; add --table, or drop {flag}")
    if args.size is None:
        raise ConfigError("give --size (e.g. 1GiB), or --table for a range of sizes")
    size = parse_size(args.size)
    algorithm = parse_algorithm(args.algorithm, setup.kind) if args.algorithm else None
    cost = collective_cost(setup, size, algorithm)
    if args.json:
        print(json.dumps(cost_record(setup, cost), sort_keys=True))
    else:
        _print_one(setup, cost, args.verbose, algorithm is not None, args.one_direction)
    return 0


