"""A calibrated cluster beside the base it was calibrated from: the base's cluster, and the
collective times of both for one measured (kind, group size, level).

Used by the ``trace`` command's predicted-vs-measured table (the prediction with the base
preset's constants beside the calibrated one), the calibration page's charts (the base's curve
beside the fitted line) and the References page (calibrated values against the base's).

The base of a cluster file is its ``base`` key (``python main.py calibrate`` writes the preset or
the cluster file it started from): a preset name, or the name of a cluster file looked up in the
calibrated file's folder.  Where ``calibrate`` swapped the preset's GPU for the one the traces
ran on (an A100 40 GB in a ``dgx-a100`` node), the calibrated GPU's name says so
(``A100-SXM4-40GB cal-1a2b3c4d``: the base GPU's name before `` cal-``) and the base gets that GPU
preset back.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Callable, Sequence

from dml2comm.errors import ConfigError
from dml2comm.hardware.cluster import Cluster, cluster_names, get_cluster, is_cluster_file
from dml2comm.hardware.cluster_file import ClusterFile
from dml2comm.hardware.gpus import GPUS, base_gpu_name

__all__ = ["base_cluster", "group_ranks", "collective_times_s", "REFERENCE_SIZES"]

#: Message sizes (bytes, nccl-tests convention) at which the References page compares a
#: calibrated collective with the base's: a small bucket (latency-bound) and a large one
#: (bandwidth-bound), e.g. PyTorch DDP's default 25 MiB bucket lies between them.
REFERENCE_SIZES: tuple[float, ...] = (1 * 2**20, 256 * 2**20)


def base_cluster(spec: ClusterFile, num_gpus: int | None = None) -> tuple[Cluster, str] | None:
    """(the base's cluster with ``num_gpus`` GPUs, its label), or None when the file names no
    base, or one that is neither a preset nor a cluster file in the file's folder."""
    name = (spec.base or "").strip()
    if not name:
        return None
    try:
        if is_cluster_file(name):
            path = Path(spec.folder) / name if spec.folder else None
            if path is None or not path.is_file():
                return None
            cluster = get_cluster(str(path), num_gpus)
        elif name.lower().replace("_", "-") in cluster_names():
            cluster = get_cluster(name, num_gpus)
        else:
            return None
    except ConfigError:
        return None
    gpu = base_gpu_name(spec.gpu.name)
    if gpu in GPUS and gpu != cluster.gpu.name:
        cluster = replace(cluster, gpu=GPUS[gpu])
    return cluster, name


def group_ranks(group_size: int, level: str, gpus_per_node: int) -> tuple[int, ...] | None:
    """Global ranks of a group of ``group_size`` on ``level``: consecutive ranks inside node 0
    (intra-node), one rank per node when the group fits one per node, else consecutive ranks
    over several nodes (inter-node); None for an intra-node group larger than a node."""
    if level == "intra_node":
        return tuple(range(group_size)) if group_size <= gpus_per_node else None
    if group_size <= gpus_per_node:
        return tuple(i * gpus_per_node for i in range(group_size))
    return tuple(range(group_size))


def collective_times_s(cluster_of: Callable[[int | None], Cluster], kind: str, group_size: int, level: str,
                       sizes: Sequence[float]) -> list[float] | None:
    """Kernel times (s, no per-call host overhead) of ``kind`` over a group of ``group_size`` on
    ``level`` at each message size, from :func:`dml2comm.network.model.collective_cost_for_group`
    on ``cluster_of(num_gpus)``; None when the group cannot be placed on that cluster."""
    from dml2comm.network.kinds import CollectiveKind
    from dml2comm.network.model import collective_cost_for_group

    probe = cluster_of(None)
    ranks = group_ranks(group_size, level, probe.gpus_per_node)
    if ranks is None:
        return None
    per = probe.gpus_per_node
    num = -(-(max(ranks) + 1) // per) * per
    if level == "inter_node":
        num = max(num, 2 * per)
    cluster = replace(cluster_of(num), collective_overhead_s=0.0)
    try:
        return [float(collective_cost_for_group(cluster, CollectiveKind(kind), ranks, float(s)).time_s) for s in sizes]
    except (ConfigError, ValueError):
        return None
