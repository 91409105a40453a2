"""Closed sets shared by the plan, the network models and the outputs.

Collective kinds are spelled as in NCCL (``ALL_REDUCE``); parallel dimensions as in
Megatron-LM (tp, dp, pp, cp, ep); phases as the places in a training step.
"""

from __future__ import annotations

import enum

__all__ = ["CollectiveKind", "ParallelDim", "Phase"]


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
