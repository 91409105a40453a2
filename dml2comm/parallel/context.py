"""Context parallelism: the sequence split into c chunks, and the collectives that stitch attention.

Every op of a transformer except attention is token-wise, so with the sequence split c-way each
GPU holds b x s/c tokens: activations, FLOPs and the tensor-/pipeline-parallel messages shrink
by c.  Attention needs every key for every query; two schemes make that work:

- **Ulysses** (Jacobs et al., "DeepSpeed Ulysses", arXiv:2309.14509, Sec. 3.1): before attention
  an AllToAll over the CP group turns Q, K and V from sequence-sharded (s/c tokens, all local
  heads) into head-sharded (all s tokens, a/(t c) heads); after attention one more AllToAll turns
  the output back.  Forward: 4 AllToAlls of b s h / c elements per GPU each (with tensor
  parallelism, of the a/t local heads: b s h / (t c)); backward mirrors them (the gradients
  of the output, Q, K and V).  The heads must divide by t x c.
- **Ring attention** (Liu et al., "Ring Attention with Blockwise Transformers", arXiv:2310.01889;
  Megatron-Core ``--cp-comm-type p2p``, Transformer Engine ``AttnFuncWithCPAndKVP2P``): each
  GPU keeps its Q chunk and passes its K/V block around the CP ring with Send/Recv; c - 1
  transfers per layer in forward, each overlapped with the attention of the block in hand.  The
  backward pass circulates K/V together with the partial dK/dV (Transformer Engine sends ``kv``
  and ``dkv``): c - 1 transfers of twice the bytes.  Causal load balancing (Megatron-Core splits
  the sequence into 2c chunks and gives GPU i chunks i and 2c-1-i) makes every GPU's share of
  the causal attention FLOPs 1/c of the total.

Gradients: CP ranks hold the same weights and see different tokens, so their gradients are
reduced together with the data-parallel group (Megatron-Core's data-parallel group "with
context parallel", d x c ranks).

Message sizes follow the nccl-tests convention (AllToAll: the bytes one rank holds and
scatters; SendRecv: the bytes sent).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from dml2comm.errors import ConfigError
from dml2comm.ir.graph import OpGraph
from dml2comm.network.kinds import CollectiveKind, Phase
from dml2comm.parallel.config import CpScheme

__all__ = ["AttentionSite", "CPComm", "find_attention", "check_context_parallel", "context_parallel_comms"]


@dataclass(frozen=True, slots=True)
class AttentionSite:
    """The attention core of one layer: QK^T (``scores_op``) and scores x V (``context_op``).

    Element counts are of the unsharded tensors of one micro-batch as they meet attention
    (after any grouped-query head repetition the export does before the scores).
    """

    layer: int
    scores_op: int
    context_op: int
    heads: int | None
    q_elems: int
    k_elems: int
    v_elems: int
    out_elems: int


@dataclass(frozen=True, slots=True)
class CPComm:
    kind: CollectiveKind
    phase: Phase
    layer: int
    after_op: int
    tensor: str
    message_bytes: float  # per GPU, one call
    count: int  # calls per micro-batch
    reason: str


def find_attention(graph: OpGraph, layer_of_op: Sequence[int], seq_len: int | None) -> tuple[AttentionSite, ...]:
    """Attention cores: a MatMul producing ``[..., s, s]`` scores, then the MatMul of the same
    layer that multiplies ``[..., s, s]`` probabilities by V."""
    if not seq_len:
        return ()
    s = seq_len
    out: list[AttentionSite] = []
    pending: dict[int, int] = {}
    for op in graph.ops:
        if op.op_type != "MatMul" or len(op.inputs) < 2:
            continue
        a = graph.tensors.get(op.inputs[0])
        b = graph.tensors.get(op.inputs[1])
        y = graph.tensors.get(op.outputs[0]) if op.outputs else None
        if a is None or b is None or y is None or a.is_weight or b.is_weight or y.rank < 3:
            continue
        layer = layer_of_op[op.index]
        if y.shape[-2:] == (s, s) and layer not in pending:
            pending[layer] = op.index
        elif a.shape[-2:] == (s, s) and layer in pending:
            first = graph.ops[pending.pop(layer)]
            q = graph.tensors[first.inputs[0]]
            k = graph.tensors[first.inputs[1]]
            heads = q.shape[-3] if q.rank >= 4 else None
            out.append(AttentionSite(layer, first.index, op.index, heads, q.numel, k.numel, b.numel, y.numel))
    return tuple(out)


def check_context_parallel(sites: Sequence[AttentionSite], cp: int, tp: int, scheme: CpScheme | str, seq_len: int | None) -> None:
    """One-line :class:`ConfigError` when c does not divide the sequence or (Ulysses) the heads."""
    if cp <= 1:
        return
    if not seq_len:
        raise ConfigError(f"--cp {cp} needs a known sequence length; pass --seq-len")
    if seq_len % cp:
        raise ConfigError(f"--cp {cp} does not divide the sequence length {seq_len}; choose a --cp that divides it or change --seq-len")
    if not sites:
        raise ConfigError(f"--cp {cp}: the model has no attention (MatMul to [.., s, s] scores) to split by sequence; drop --cp")
    if CpScheme.of(scheme) is CpScheme.ULYSSES:
        for site in sites:
            if site.heads is not None and site.heads % (tp * cp):
                raise ConfigError(
                    f"--cp-scheme ulysses needs the {site.heads} attention heads to divide by t x c = {tp} x {cp} = {tp * cp}; "
                    "use --cp-scheme ring or a smaller --cp"
                )


def context_parallel_comms(sites: Sequence[AttentionSite], cp: int, tp: int, scheme: CpScheme | str, dtype_bytes: int) -> tuple[CPComm, ...]:
    """Per micro-batch collectives of one GPU's CP group, per attention layer.

    Ulysses: 4 AllToAlls forward (Q, K, V before attention, the output after) and 4 backward,
    each of ``elements / (t c)`` per GPU; ring: c - 1 SendRecv of the local K/V block
    (``(k + v) / (t c)`` elements) forward, c - 1 of K/V plus dK/dV backward.
    """
    if cp <= 1:
        return ()
    out: list[CPComm] = []
    share, ulysses = dtype_bytes / (tp * cp), CpScheme.of(scheme) is CpScheme.ULYSSES
    for site in sites:
        if ulysses:
            before = ((site.q_elems, "Q"), (site.k_elems, "K"), (site.v_elems, "V"))
            for elems, name in before:
                out.append(CPComm(CollectiveKind.ALL_TO_ALL, Phase.FORWARD, site.layer, site.scores_op, name, elems * share, 1,
                                  f"Ulysses AllToAll of {name}: sequence-sharded to head-sharded"))
            out.append(CPComm(CollectiveKind.ALL_TO_ALL, Phase.FORWARD, site.layer, site.context_op, "attention output",
                              site.out_elems * share, 1, "Ulysses AllToAll of the attention output: head-sharded back to sequence-sharded"))
            out.append(CPComm(CollectiveKind.ALL_TO_ALL, Phase.BACKWARD, site.layer, site.context_op, "attention output gradient",
                              site.out_elems * share, 1, "Ulysses AllToAll of the output gradient (mirror of the output's)"))
            for elems, name in before:
                out.append(CPComm(CollectiveKind.ALL_TO_ALL, Phase.BACKWARD, site.layer, site.scores_op, f"d{name}", elems * share, 1,
                                  f"Ulysses AllToAll of d{name}: head-sharded back to sequence-sharded"))
        else:
            kv = (site.k_elems + site.v_elems) * share
            out.append(CPComm(CollectiveKind.SEND_RECV, Phase.FORWARD, site.layer, site.scores_op, "K/V block", kv, cp - 1,
                              f"ring attention: K/V block to the next GPU of the CP ring ({cp - 1} steps, overlapped with attention)"))
            out.append(CPComm(CollectiveKind.SEND_RECV, Phase.BACKWARD, site.layer, site.scores_op, "K/V + dK/dV block", 2 * kv, cp - 1,
                              f"ring attention backward: K/V and partial dK/dV to the next GPU ({cp - 1} steps, overlapped)"))
    return tuple(out)
