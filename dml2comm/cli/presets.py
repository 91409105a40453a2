"""The ``presets`` subcommand: the GPU, cluster and network presets (``--json``: with every number's source)."""

from __future__ import annotations

import json
from typing import Sequence

from dml2comm.cli.args import OneLineParser

__all__ = ["run_presets"]


def run_presets(argv: Sequence[str]) -> int:
    parser = OneLineParser(prog="python main.py presets", description="List GPU and cluster presets with their sources.")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    from dml2comm.hardware.cluster import cluster_names, get_cluster
    from dml2comm.hardware.gpus import GPUS, get_gpu

    from dml2comm.network.query import network_presets

    gpus = {name: get_gpu(name).to_dict() for name in sorted(GPUS)}
    clusters = {name: get_cluster(name).to_dict() for name in cluster_names()}
    net = network_presets()
    if args.json:
        print(json.dumps({"gpus": gpus, "clusters": clusters, "network": net}, sort_keys=True, indent=1, default=str))
        return 0
    print("GPUs:", ", ".join(sorted(GPUS)))
    print("clusters:", ", ".join(cluster_names()))
    print("topologies:", ", ".join(net["topologies"]))
    print("(--json prints every number with its source)")
    return 0

