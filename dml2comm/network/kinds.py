"""Closed sets shared by the plan, the network models and the outputs.

Collective kinds are spelled as in NCCL (``ALL_REDUCE``); parallel dimensions as in
Megatron-LM (tp, dp, pp, cp, ep); phases as the places in a training step; algorithms and
transport protocols as written in data.json and on the command line (``ring``, ``ll128``).
"""

from __future__ import annotations

import enum

from dml2comm.choices import Choice

__all__ = ["Algorithm", "AlgorithmFamily", "CollectiveKind", "ParallelDim", "Phase", "Protocol"]


class CollectiveKind(enum.Enum):
    ALL_REDUCE = "ALL_REDUCE"
    ALL_GATHER = "ALL_GATHER"
    REDUCE_SCATTER = "REDUCE_SCATTER"
    BROADCAST = "BROADCAST"
    REDUCE = "REDUCE"
    ALL_TO_ALL = "ALL_TO_ALL"
    SEND_RECV = "SEND_RECV"


class ParallelDim(enum.Enum):
    TP = "tp"
    DP = "dp"
    PP = "pp"
    CP = "cp"
    EP = "ep"


class Phase(enum.Enum):
    FORWARD = "forward"
    BACKWARD = "backward"
    OPTIMIZER = "optimizer"


class Algorithm(enum.Enum):
    """Collective algorithms (values as written in data.json ``collectives[].algorithm``).

    ``ring``: pipelined ring (chain for Broadcast/Reduce); ``double_binary_tree``: NCCL's two
    complementary binary trees; ``recursive_doubling`` / ``recursive_halving``: butterfly
    exchanges of the whole / a halving message; ``rabenseifner``: reduce-scatter by recursive
    halving then all-gather by recursive doubling; ``bruck``: log-step rotations; ``pairwise``:
    n-1 exchange steps, one peer per step; ``direct``: every peer at once; ``binomial_tree``;
    ``scatter_allgather``: binomial scatter then all-gather (van de Geijn broadcast);
    ``hierarchical``: one phase per network level (two-level on clusters); ``in_network``:
    the switch reduces (NVLink SHARP / SHARP).
    """

    RING = "ring"
    PAIRWISE = "pairwise"
    DIRECT = "direct"
    BINOMIAL_TREE = "binomial_tree"
    DOUBLE_BINARY_TREE = "double_binary_tree"
    RECURSIVE_DOUBLING = "recursive_doubling"
    RECURSIVE_HALVING = "recursive_halving"
    RABENSEIFNER = "rabenseifner"
    BRUCK = "bruck"
    SCATTER_ALLGATHER = "scatter_allgather"
    HIERARCHICAL = "hierarchical"
    IN_NETWORK = "in_network"


class AlgorithmFamily(Choice):
    """Where NCCL runs an algorithm (its protocol and latency tables' rows, src/graph/tuning.cc):
    the ring, tree or NVLS family; ``other`` for the algorithms NCCL does not have."""

    RING = "ring"
    TREE = "tree"
    NVLS = "nvls"
    OTHER = "other"


class Protocol(enum.Enum):
    """Transport protocols of NCCL (src/graph/tuning.cc): low-latency LL and LL128, and Simple.

    ``simple`` is also the only protocol of the textbook (uncalibrated) model.
    """

    LL = "ll"
    LL128 = "ll128"
    SIMPLE = "simple"
