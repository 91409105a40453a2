"""Hardware: GPU presets (:mod:`.gpus`) and clusters, links and rank mapping (:mod:`.cluster`).

Every preset number carries its source; see each module's docstring for the conventions
(dense peaks, per-direction line rates, achieved-vs-line efficiencies, NCCL latencies).
"""

from __future__ import annotations

from dml2comm.hardware.cluster import (
    CLUSTERS,
    Cluster,
    ClusterPreset,
    Link,
    RankMap,
    cluster_names,
    get_cluster,
    make_cluster,
)
from dml2comm.hardware.gpus import DTYPE_KEYS, GPU, GPU_ALIASES, GPUS, get_gpu, gpu_names
from dml2comm.hardware import cluster_file as _cluster_file  # noqa: F401 (registers get_cluster's file reader)

__all__ = [
    "CLUSTERS",
    "Cluster",
    "ClusterPreset",
    "DTYPE_KEYS",
    "GPU",
    "GPUS",
    "GPU_ALIASES",
    "Link",
    "RankMap",
    "cluster_names",
    "get_cluster",
    "get_gpu",
    "gpu_names",
    "make_cluster",
]
