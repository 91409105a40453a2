"""Expert parallelism: the experts of each MoE layer placed e-way, tokens routed by AllToAll.

- **Placement** (Lepikhin et al., GShard, arXiv:2006.16668, Sec. 2.2; Megatron-Core MoE): the
  E experts of a layer are split over the e GPUs of an expert-parallel group, E/e each.  The
  EP group is carved out of the d x c data- and context-parallel ranks (see
  :class:`~dml2comm.hardware.cluster.RankMap`), so e divides d x c and no GPU is added.
- **Routing traffic**: per MoE layer and micro-batch, a *dispatch* AllToAll sends every routed
  (token, expert) pair's hidden vector to the GPU holding the expert and a *combine* AllToAll
  brings the outputs back: each of ``tokens x top_k x hidden`` elements per GPU, times the
  capacity factor when experts compute on capacity-padded buffers (Fedus et al., Switch
  Transformers, Sec. 2.1: capacity = tokens/E x capacity factor).  Backward mirrors both.
  On the wire a rank keeps 1/e of it: (e - 1)/e of the message is sent.
- **Expert FLOPs** follow routed tokens: with balanced routing each of a GPU's E/e experts
  receives e x T x k / E tokens of the group's e x T, i.e. T x k token-expert pairs per GPU
  whatever e (:func:`expert_flops_per_gpu`); the graph already costs experts by routed tokens
  (zoo ``moe``: capacity ``ceil(s k / E)`` rows per expert; real exports: top-k gathers).
- **Expert weights** and their gradients and optimizer states are sharded by e; their
  gradients are reduced over the expert-data-parallel group (d x c / e ranks).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Sequence

from dml2comm.errors import ConfigError
from dml2comm.ir.graph import OpGraph
from dml2comm.network.kinds import CollectiveKind, Phase

__all__ = ["MoELayer", "MoEInfo", "EPComm", "find_moe", "check_expert_parallel", "expert_parallel_comms", "expert_flops_per_gpu",
           "is_expert_scope"]

_EXPERTS = re.compile(r"(^|\.)experts(\.|$)")

# Ops through which an expert op may read its weight (a view of it): exports transpose, reshape,
# slice or split stacked [E, ...] expert weights before the gather or MatMul that uses them.
_WEIGHT_VIEWS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Cast", "Transpose", "Slice", "Split",
                           "Expand", "Concat", "Tile"})


def is_expert_scope(scope: str) -> bool:
    """True for ops inside an expert module (``...mlp.experts``, ``...block_sparse_moe.experts.3``)."""
    return bool(_EXPERTS.search(scope))


@dataclass(frozen=True, slots=True)
class MoELayer:
    layer: int
    dispatch_op: int  # the op the dispatch follows (the router's TopK, else the first expert op)
    combine_op: int  # the last expert op
    expert_ops: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class MoEInfo:
    experts: int  # E per layer
    top_k: int
    hidden: int
    layers: tuple[MoELayer, ...]
    expert_weights: frozenset[str]
    expert_ops: frozenset[int]


@dataclass(frozen=True, slots=True)
class EPComm:
    kind: CollectiveKind
    phase: Phase
    layer: int
    after_op: int
    tensor: str
    message_bytes: float
    count: int  # per micro-batch
    reason: str


def find_moe(graph: OpGraph, layer_of_op: Sequence[int]) -> MoEInfo | None:
    """Experts, top-k and hidden size of a MoE model, or None when it has no experts.

    Zoo ``moe`` models carry them in their metadata; real exports are read from the router's
    TopK (k = its output width, E = its input width) and the router weight ([E, h] or [h, E]).
    """
    expert_ops = [op.index for op in graph.ops if is_expert_scope(op.scope)]
    if not expert_ops:
        return None
    expert_set = frozenset(expert_ops)
    weights = frozenset(w for i in expert_ops for name in graph.ops[i].inputs if name for w in _weights_behind(graph, name))
    by_layer: dict[int, list[int]] = {}
    for i in expert_ops:
        by_layer.setdefault(layer_of_op[i], []).append(i)
    experts = top_k = hidden = None
    zoo = graph.metadata.get("dml2comm.zoo.config")
    if graph.metadata.get("dml2comm.zoo.kind") == "moe" and zoo:
        cfg = json.loads(zoo)
        experts, top_k, hidden = int(cfg["experts"]), int(cfg["top_k"]), int(cfg["hidden"])
    layers: list[MoELayer] = []
    for layer, ops in sorted(by_layer.items()):
        first = min(ops)
        router = [op for op in graph.ops if layer_of_op[op.index] == layer and op.op_type == "TopK" and op.index < first
                  and not is_expert_scope(op.scope)]
        dispatch = router[-1].index if router else first
        if router and experts is None:
            top = router[-1]
            scores = graph.tensors.get(top.inputs[0])
            chosen = graph.tensors.get(top.outputs[0])
            if scores is not None and chosen is not None and scores.rank and chosen.rank:
                experts, top_k = scores.shape[-1], chosen.shape[-1]
                for op in graph.ops[dispatch::-1]:
                    if layer_of_op[op.index] != layer:
                        break
                    w = next((graph.tensors[n] for n in op.inputs if n and n in graph.tensors and graph.tensors[n].is_weight
                              and graph.tensors[n].rank == 2 and experts in graph.tensors[n].shape), None)
                    if w is not None:
                        hidden = w.shape[1] if w.shape[0] == experts else w.shape[0]
                        break
        layers.append(MoELayer(layer, dispatch, max(ops), tuple(sorted(ops))))
    if experts is None or top_k is None or hidden is None:
        raise ConfigError("the model has expert modules but no router TopK and router weight to read experts, top-k and hidden "
                          "size from; export the router with the model")
    return MoEInfo(experts, top_k, hidden, tuple(layers), weights, expert_set)


def _weights_behind(graph: OpGraph, name: str, depth: int = 8) -> set[str]:
    """The weights ``name`` is, or is a view of through at most ``depth`` view ops."""
    found: set[str] = set()
    seen, frontier = {name}, [name]
    for _ in range(depth + 1):
        following: list[str] = []
        for tensor_name in frontier:
            t = graph.tensors.get(tensor_name)
            if t is not None and t.is_parameter:  # a parameter-derived view is followed to its parameter
                found.add(tensor_name)
                continue
            producer = graph.producer(tensor_name)
            if producer is not None and graph.ops[producer].op_type in _WEIGHT_VIEWS:
                following.extend(n for n in graph.ops[producer].inputs if n and n not in seen)
                seen.update(graph.ops[producer].inputs)
        frontier = following
    return found


def check_expert_parallel(moe: MoEInfo | None, ep: int) -> None:
    """One-line :class:`ConfigError` for ``--ep`` on a dense model or e not dividing E."""
    if ep <= 1:
        return
    if moe is None:
        raise ConfigError(f"--ep {ep} needs a mixture-of-experts model (ops under an 'experts' scope); this model has no experts, drop --ep")
    if moe.experts % ep:
        raise ConfigError(f"--ep {ep} does not divide the {moe.experts} experts per layer; choose an --ep that divides {moe.experts}")


def expert_flops_per_gpu(tokens_per_gpu: float, top_k: int, experts: int, ep: int, flops_per_routed_token: float,
                         capacity_factor: float = 1.0) -> float:
    """Expert FLOPs one GPU of an EP group of ``ep`` does for one micro-batch.

    It holds ``E / e`` experts; with balanced routing each receives ``e T k / E`` of the group's
    ``e T`` tokens (``T`` = ``tokens_per_gpu``), padded to capacity by ``capacity_factor``.
    ``flops_per_routed_token`` is one expert MLP's FLOPs for one token.  The result equals
    ``T k cf f`` for every e: expert parallelism moves expert work, it does not change it.
    """
    experts_here = experts / ep
    tokens_per_expert = ep * tokens_per_gpu * top_k / experts * capacity_factor
    return experts_here * tokens_per_expert * flops_per_routed_token


def expert_parallel_comms(moe: MoEInfo, tokens_per_gpu: float, ep: int, dtype_bytes: int, capacity_factor: float) -> tuple[EPComm, ...]:
    """Per micro-batch AllToAlls of one GPU's EP group: dispatch and combine, forward and backward,
    each of ``tokens x top_k x hidden x capacity_factor`` elements per MoE layer."""
    if ep <= 1:
        return ()
    size = tokens_per_gpu * moe.top_k * moe.hidden * capacity_factor * dtype_bytes
    out: list[EPComm] = []
    for ml in moe.layers:
        out.append(EPComm(CollectiveKind.ALL_TO_ALL, Phase.FORWARD, ml.layer, ml.dispatch_op, "routed tokens", size, 1,
                          f"MoE dispatch AllToAll: top-{moe.top_k} routed tokens to the GPUs of their experts"))
        out.append(EPComm(CollectiveKind.ALL_TO_ALL, Phase.FORWARD, ml.layer, ml.combine_op, "expert outputs", size, 1,
                          "MoE combine AllToAll: expert outputs back to their tokens' GPUs"))
        out.append(EPComm(CollectiveKind.ALL_TO_ALL, Phase.BACKWARD, ml.layer, ml.combine_op, "expert output gradients", size, 1,
                          "MoE combine backward AllToAll: output gradients to the experts' GPUs"))
        out.append(EPComm(CollectiveKind.ALL_TO_ALL, Phase.BACKWARD, ml.layer, ml.dispatch_op, "routed token gradients", size, 1,
                          "MoE dispatch backward AllToAll: input gradients back to their tokens' GPUs"))
    return tuple(out)
