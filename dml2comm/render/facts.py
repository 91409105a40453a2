"""What the drawings and pages read from an :class:`~dml2comm.analysis.Analysis`, derived once.

Nothing here re-costs anything: it groups the analysis's communication nodes by where they
sit (layer, stage, pipeline boundary), and turns times into shares of the iteration so that
every drawing colours by the same scale.

Share of the iteration (the heat scale): the time a node keeps one GPU busy per iteration,
divided by the iteration time.  For an op: ``m (t_fwd + t_bwd) / T``; for a collective:
``count_per_iteration x time_s / T``; for a layer: its ops plus its tensor-parallel
collectives; for a stage: ``m (t_f + t_b) / T`` (its per-micro-batch times already include
its TP collectives and pipeline sends).  Stages run in parallel, so shares of different
stages do not add up to 100%.
"""

from __future__ import annotations

import re

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from dml2comm.analysis import Analysis, CommNode
from dml2comm.ir.graph import Tensor
from dml2comm.network.kinds import CollectiveKind, ParallelDim, Phase
from dml2comm.fmt import fmt_bytes, fmt_s

__all__ = ["Facts", "Boundary", "KIND_LABEL", "kind_label"]

KIND_LABEL: Mapping[CollectiveKind, str] = {
    CollectiveKind.ALL_REDUCE: "AllReduce",
    CollectiveKind.ALL_GATHER: "AllGather",
    CollectiveKind.REDUCE_SCATTER: "ReduceScatter",
    CollectiveKind.BROADCAST: "Broadcast",
    CollectiveKind.REDUCE: "Reduce",
    CollectiveKind.ALL_TO_ALL: "AllToAll",
    CollectiveKind.SEND_RECV: "Send/Recv",
}


def kind_label(kind: CollectiveKind) -> str:
    return KIND_LABEL.get(kind, kind.value)


@dataclass(frozen=True)
class Boundary:
    """Pipeline boundary ``stage`` -> ``stage + 1``: activations forward, gradients backward."""

    stage: int
    forward: tuple[CommNode, ...]  # the Send/Recv of each activation (per micro-batch)
    backward: tuple[CommNode, ...]  # the Send/Recv of each gradient
    # Megatron-LM's scatter/gather (dml2comm.cost.stages.scatter_gather): the receivers'
    # all-gather of each activation / gradient sent 1/t per tensor rank; part of the boundary's time
    gather_fwd: tuple[CommNode, ...] = ()
    gather_bwd: tuple[CommNode, ...] = ()

    @property
    def comms(self) -> tuple[CommNode, ...]:
        """Every comm node of the boundary (sends and the receivers' all-gathers)."""
        return self.forward + self.backward + self.gather_fwd + self.gather_bwd

    @property
    def tensors(self) -> tuple[str, ...]:
        return tuple(c.tensor for c in self.forward)

    @property
    def bytes_fwd(self) -> float:
        return sum(c.message_bytes for c in self.forward)

    @property
    def bytes_bwd(self) -> float:
        return sum(c.message_bytes for c in self.backward)

    @property
    def time_fwd_s(self) -> float:
        return sum(c.time_s for c in self.forward + self.gather_fwd)

    @property
    def time_bwd_s(self) -> float:
        return sum(c.time_s for c in self.backward + self.gather_bwd)

    @property
    def host_fwd_s(self) -> float:
        """The framework's host time in :attr:`time_fwd_s` (per pipeline message, not the wire's)."""
        return sum(c.host_s for c in self.forward + self.gather_fwd)

    @property
    def host_bwd_s(self) -> float:
        return sum(c.host_s for c in self.backward + self.gather_bwd)

    def time_text(self, backward: bool = False) -> str:
        """``1.53 ms (30 µs transfer + 1.50 ms host)``: the boundary's time with its host part named."""
        total, host = (self.time_bwd_s, self.host_bwd_s) if backward else (self.time_fwd_s, self.host_fwd_s)
        return f"{fmt_s(total)} ({fmt_s(total - host)} transfer + {fmt_s(host)} host)" if host > 0 else fmt_s(total)

    @property
    def link(self) -> str:
        return self.forward[0].link if self.forward else ""


@dataclass(frozen=True)
class Facts:
    """Groupings of one analysis for drawing; build with :meth:`of`."""

    analysis: Analysis
    m: int
    iteration_s: float
    tp_by_layer: Mapping[int, tuple[CommNode, ...]]
    tp_by_stage: Mapping[int, tuple[CommNode, ...]]
    dp_by_stage: Mapping[int, tuple[CommNode, ...]]
    boundaries: tuple[Boundary, ...]
    layer_share: tuple[float, ...]
    stage_share: tuple[float, ...]  # stage_busy_s over the iteration
    local_shape: Mapping[str, Tensor] = field(repr=False)
    # context- and expert-parallel collectives per stage (also in tp_by_stage/tp_by_layer: like
    # TP's they sit on the critical path and are drawn at layer level)
    cp_by_stage: Mapping[int, tuple[CommNode, ...]] = field(default_factory=dict)
    ep_by_stage: Mapping[int, tuple[CommNode, ...]] = field(default_factory=dict)
    # tied-weight gradient all-reduces (the embedding group of the first and last stage): one
    # CommNode per stage of each group, keyed by the group's stages
    tied_groups: Mapping[tuple[int, ...], tuple[CommNode, ...]] = field(default_factory=dict)
    # per stage and iteration (one GPU): its compute (its own operators, every collective free:
    # the overview's "compute" is the largest) and its busy time (the compute stream, with the
    # tensor/context/expert-parallel collectives that run in it: the drawings' "% busy")
    stage_compute_s: tuple[float, ...] = ()
    stage_busy_s: tuple[float, ...] = ()

    @classmethod
    def of(cls, analysis: Analysis) -> "Facts":
        m = analysis.config.num_micro_batches
        iteration = float(analysis.summary.get("iteration_time_s") or 0.0)
        tp_layer: dict[int, list[CommNode]] = defaultdict(list)
        tp_stage: dict[int, list[CommNode]] = defaultdict(list)
        dp_stage: dict[int, list[CommNode]] = defaultdict(list)
        fwd: dict[int, list[CommNode]] = defaultdict(list)
        bwd: dict[int, list[CommNode]] = defaultdict(list)
        other: dict[ParallelDim, dict[int, list[CommNode]]] = {ParallelDim.CP: defaultdict(list), ParallelDim.EP: defaultdict(list)}
        tied: dict[tuple[int, ...], list[CommNode]] = defaultdict(list)
        gather_f: dict[int, list[CommNode]] = defaultdict(list)
        gather_b: dict[int, list[CommNode]] = defaultdict(list)
        stage_of_rank = {r: st.index for st in analysis.stages for r in st.ranks}
        for c in analysis.comms:
            if c.dim in other:
                other[c.dim][c.stage].append(c)
            if c.dim is ParallelDim.PP and not c.per_micro_batch:  # the tied-weight all-reduce, once per iteration
                tied[tuple(stage_of_rank.get(r, -1) for r in c.group)].append(c)
            elif c.dim is ParallelDim.PP:
                sends = c.kind is CollectiveKind.SEND_RECV
                if c.phase is Phase.FORWARD:
                    (fwd if sends else gather_f)[c.stage].append(c)
                else:
                    (bwd if sends else gather_b)[c.stage - 1].append(c)
            elif c.dim is ParallelDim.DP:
                dp_stage[c.stage].append(c)
            else:
                tp_stage[c.stage].append(c)
                if c.layer is not None:
                    tp_layer[c.layer].append(c)
        p = analysis.config.pp_size
        boundaries = tuple(Boundary(s, tuple(fwd.get(s, ())), tuple(bwd.get(s, ())), tuple(gather_f.get(s, ())), tuple(gather_b.get(s, ())))
                           for s in range(p - 1))

        def share(seconds: float) -> float:
            return seconds / iteration if iteration > 0 else 0.0

        layer_share = tuple(
            share(m * (l.time_fwd_s + l.time_bwd_s) + sum(c.time_s * c.count_per_iteration for c in tp_layer.get(l.index, ())))
            for l in analysis.layers
        )
        stage_busy = tuple(m * (st.time_fwd_s + st.time_bwd_s) for st in analysis.stages)
        stage_share = tuple(share(b) for b in stage_busy)
        stage_compute = tuple(analysis.stage_compute_s) or tuple(m * (st.compute_fwd_s + st.compute_bwd_s) for st in analysis.stages)
        local: dict[str, Tensor] = {}
        for op, shard in zip(analysis.graph.ops, analysis.tp.shards):
            for name, t in zip(op.outputs, shard.outputs):
                if name and t is not None:
                    local[name] = t
        return cls(
            analysis=analysis,
            m=m,
            iteration_s=iteration,
            tp_by_layer={k: tuple(v) for k, v in tp_layer.items()},
            tp_by_stage={k: tuple(v) for k, v in tp_stage.items()},
            dp_by_stage={k: tuple(v) for k, v in dp_stage.items()},
            boundaries=boundaries,
            layer_share=layer_share,
            stage_share=stage_share,
            local_shape=local,
            cp_by_stage={k: tuple(v) for k, v in other[ParallelDim.CP].items()},
            ep_by_stage={k: tuple(v) for k, v in other[ParallelDim.EP].items()},
            tied_groups={k: tuple(v) for k, v in tied.items()},
            stage_compute_s=stage_compute,
            stage_busy_s=stage_busy,
        )

    # ------------------------------------------------------------------ shares

    def share(self, seconds: float) -> float:
        """``seconds`` per iteration as a fraction of the iteration time."""
        return seconds / self.iteration_s if self.iteration_s > 0 else 0.0

    def op_share(self, index: int) -> float:
        op = self.analysis.ops[index]
        return self.share(self.m * (op.time_fwd_s + op.time_bwd_s))

    def comm_share(self, c: CommNode) -> float:
        return self.share(c.time_s * c.count_per_iteration)

    def comms_share(self, comms: Sequence[CommNode]) -> float:
        return self.share(sum(c.time_s * c.count_per_iteration for c in comms))

    # ------------------------------------------------------------------ GPUs

    @property
    def dp(self) -> int:
        return self.analysis.config.dp_size

    @property
    def tp(self) -> int:
        return self.analysis.config.tp_size

    @property
    def pp(self) -> int:
        return self.analysis.config.pp_size

    def ranks(self, d: int, p: int) -> tuple[int, ...]:
        """GPUs of stage ``p`` in replica ``d`` (its tensor group, ordered by t)."""
        return self.analysis.rank_map.tp_group(d, p)

    def replica_ranks(self, d: int) -> tuple[int, ...]:
        return tuple(r for p in range(self.pp) for r in self.ranks(d, p))

    def node_of(self, rank: int) -> int:
        return self.analysis.cluster.node_of(rank)

    def nodes_of(self, ranks: Sequence[int]) -> tuple[int, ...]:
        return tuple(sorted({self.node_of(r) for r in ranks}))

    def link_between(self, a: int, b: int) -> str:
        return self.analysis.cluster.link_for_group((a, b)).name

    def layer_range(self, p: int) -> tuple[int, int]:
        layers = self.analysis.stages[p].layers
        return layers[0], layers[-1]

    def layer_title(self, li: int) -> str:
        """The layer's own name from the layer grouping (``transformer.h.4``, ``embedding``),
        limited to ``[A-Za-z0-9._-]`` (titles reach MkDocs' navigation unescaped); ``layer
        {li}`` when nothing is left.  Positions count the embedding, so layer 5 of GPT-2 is
        ``transformer.h.4``: showing the name avoids the off-by-one."""
        name = re.sub(r"[^A-Za-z0-9._-]", "", self.analysis.layers[li].name)[:40]
        return name or f"layer {li}"

    def layer_span(self, p: int) -> str:
        """Stage ``p``'s layers by name: ``transformer.h.3 … transformer.h.6``."""
        lo, hi = self.layer_range(p)
        return self.layer_title(lo) if lo == hi else f"{self.layer_title(lo)} … {self.layer_title(hi)}"

    def stage_of_layer(self, layer: int) -> int:
        return self.analysis.layers[layer].stage

    def memory_per_gpu(self, p: int) -> float:
        """Peak bytes on one GPU of stage ``p``: the analysis's total, or the sum of the parts it has."""
        mem = self.analysis.stages[p].memory
        total = mem.get("total_bytes")
        if total is not None:
            return float(total)
        return float(sum(v for k, v in mem.items() if k != "total_bytes" and isinstance(v, (int, float))))

    @property
    def capacity_bytes(self) -> float:
        """Memory of one GPU: the analysis's memory report, else the GPU preset's HBM."""
        cap = self.analysis.memory.get("capacity_bytes") if self.analysis.memory else None
        return float(cap) if cap else float(self.analysis.cluster.gpu.hbm_bytes)

    def over_capacity(self, p: int) -> bool:
        """True when one GPU of stage ``p`` needs more memory than the GPU has."""
        return self.memory_per_gpu(p) > self.capacity_bytes

    @property
    def over_stages(self) -> tuple[int, ...]:
        return tuple(p for p in range(self.pp) if self.over_capacity(p))

    def over_memory_text(self, p: int) -> str:
        """``over memory: 31.53 GiB of 29.80 GiB`` for stage ``p`` ("" when it fits)."""
        if not self.over_capacity(p):
            return ""
        return f"over memory: {fmt_bytes(self.memory_per_gpu(p))} of {fmt_bytes(self.capacity_bytes)}"

    @property
    def activations_modelled(self) -> bool:
        return all(st.memory.get("activations_bytes") is not None for st in self.analysis.stages)
