"""Megatron-LM tensor parallelism by sharding propagation over the op graph.

Every activation gets a state on the ``t`` ranks of a tensor group:

- ``R``: replicated (every rank holds the whole tensor),
- ``S(axis)``: split along ``axis`` into ``t`` equal parts,
- ``P``: partial sums (every rank holds a full-shape addend).

Rules (Shoeybi et al. 2019, "Megatron-LM", arXiv:1909.08053, Sec. 3 and Fig. 3; Narayanan et
al. 2021, arXiv:2104.04473, Sec. 2.3; Korthikanti et al. 2022, arXiv:2205.05198, Sec. 4.2.2):

- A weight MatMul/Gemm/Conv whose input is ``R`` is **column-parallel**: its weight is split
  along the output features, its output is ``S(last)``.  In backward the input gradient is a
  partial sum: an **AllReduce** (Megatron's ``f``), one per input tensor however many
  column-parallel ops read it (Q, K and V share one).
- A weight MatMul/Gemm/Conv whose input is split along its reduction axis is
  **row-parallel**: the weight is split along the input features, the output is ``P``.
- A ``P`` tensor is all-reduced in forward before its first consumer (Megatron's ``g``;
  backward identity).  ``P + P`` stays ``P``, and so does ``P + bias`` when it is next added
  to another projection's output: a parallel block's attention and MLP outputs (GPT-J,
  GPT-NeoX, Phi) are summed and reduced once, each bias added once (:func:`_meets_projection`).
- With sequence parallelism (Korthikanti et al. 2022, Sec. 4.2.2) that AllReduce becomes a
  **ReduceScatter** to ``S(sequence axis)``; norms, dropout and residual adds run on the
  sequence shard, and a column-parallel op first **AllGathers** its input.  Backward mirrors
  them (AllGather <-> ReduceScatter), the same total volume.
- Head-parallel attention follows from the rules: Reshape/Transpose/Split carry the split axis,
  Q.K^T and the attention-weighted V are batched matmuls over the split head axis, softmax
  and masks act on other axes.  A replicated operand is sliced locally (free).
- The largest embedding table read by ``Gather`` is **vocabulary-parallel** (output ``P``); a
  LM head MatMul with that (tied, transposed) table is column-parallel over the vocabulary,
  and a vocabulary-split graph output adds Megatron's parallel cross-entropy: three
  AllReduces of ``b*s`` fp32 values (max logit, target logit, sum of exponentials;
  Megatron-LM ``tensor_parallel/cross_entropy.py``).
- Head counts come from the attention cores (``Q.K^T -> Softmax -> .V``, :func:`find_attention`):
  each operand is followed back to its head-splitting Reshape ``[.., n*d] -> [.., n, d]`` and its
  projection, so they do not depend on the batch size or on how the exporter lays out batch and
  heads.  A split survives a Reshape that merges it into a more significant axis (batch*heads,
  ``[b, n, s, d] -> [b*n, s, d]``) and returns to the head axis when unmerged.
- Grouped-query attention: when ``t`` does not divide the KV heads, the K/V projections are
  replicated (detected as a split that the head Reshape cannot keep, or that would cut
  ``head_dim``); ``t`` must divide the query heads.  A split that
  some other Reshape cannot keep replicates the op that made it, with a warning naming that
  Reshape (never a grouped-query warning on a model without attention).
- A low-rank bottleneck stays whole: a GEMM that narrows the features at least two times and
  whose output is normalised over its features before another GEMM reads it (multi-head latent
  attention's ``q_a_proj``/``kv_a_proj_with_mqa`` and their norms, DeepSeek-V2/V3) is replicated,
  as Megatron-Core's MLA keeps its down-projections ("duplicated"); the up-projections are then
  column-parallel by heads and the output projection row-parallel (:func:`_low_rank_bottleneck`).
- Anything else that reads a split tensor on its split axis (a norm over the hidden axis, a
  softmax over a split axis) gets an AllGather first, with a warning.
- Experts stored as one stacked weight ``[E, n, k]`` whose matrices a ``Gather``/``GatherND``
  picks for the batched products (transformers' ``batched_mm`` mixture-of-experts layers) are
  split as Megatron-Core's expert tensor parallelism (ETP = t): the up/gate product
  column-parallel, the down product row-parallel, its partial sums reduced once after the
  weighted sum over the top-k choices (:func:`_sum_ahead`).  Where t does not divide them, or the
  products do not read as an expert MLP, they stay whole with one warning for the model.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping

from dml2comm.errors import ConfigError
from dml2comm.ir.graph import Op, OpGraph, Tensor, vocab_table
from dml2comm.network.kinds import CollectiveKind, Phase

__all__ = ["AttentionCore", "Shard", "TPComm", "TensorParallelPlan", "shard_tensor_parallel", "attention_heads",
           "find_attention", "padded_vocab", "requires_grad", "vocab_table"]

R = "R"
P = "P"

#: Megatron-LM's default ``--make-vocab-size-divisible-by``.
VOCAB_PAD_MULTIPLE = 128

_WEIGHT_OPS = frozenset({"MatMul", "Gemm", "Conv", "ConvTranspose"})
_VIEWS_PASS = frozenset(
    {
        "Relu", "Gelu", "Erf", "Tanh", "Sigmoid", "Exp", "Log", "Sqrt", "Reciprocal", "Neg", "Abs",
        "Cast", "CastLike", "Dropout", "Identity", "LeakyRelu", "Elu", "Selu", "Celu", "Softplus",
        "Softsign", "HardSigmoid", "HardSwish", "Mish", "Sin", "Cos", "Floor", "Ceil", "Round",
        "Sign", "Not", "IsNaN", "IsInf", "Clip", "ThresholdedRelu", "BatchNormalization",
        "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "LpPool", "Trilu",
    }
)
_ELEMENTWISE = frozenset(
    {
        "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Where", "Equal", "Less", "Greater",
        "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor", "Mod", "PRelu", "BitShift", "Sum", "Mean",
    }
)
_NO_DATA = frozenset({"Shape", "Size"})


@dataclass(frozen=True, slots=True)
class Shard:
    """How one op runs on one tensor rank."""

    inputs: tuple[Tensor | None, ...]  # local shapes
    outputs: tuple[Tensor | None, ...]
    factor: int  # 1 (replicated) or t (its work is split t ways)
    rule: str  # "column-parallel", "row-parallel", "head-parallel", "replicated", ...


@dataclass(frozen=True, slots=True)
class TPComm:
    """A tensor-parallel collective, per micro-batch, inserted after op ``op_index``."""

    kind: CollectiveKind
    phase: Phase
    op_index: int
    tensor: str
    message_bytes: float  # nccl-tests buffer size convention, in the training dtype
    reason: str
    # the input gradient of a column-parallel GEMM (backward all-reduce, or reduce-scatter with
    # SP): Megatron-LM launches it asynchronously and computes the weight gradient meanwhile
    # (``async_tensor_model_parallel_allreduce``; ParallelConfig.async_tp_allreduce)
    overlaps_wgrad: bool = False


@dataclass(frozen=True)
class TensorParallelPlan:
    tp_size: int
    shards: tuple[Shard, ...]  # per op
    comms: tuple[TPComm, ...]
    weight_factor: dict[str, int]  # weight name -> t if split, 1 if replicated
    heads: int | None
    kv_heads: int | None
    warnings: tuple[str, ...] = ()  # what the user should act on
    assumptions: tuple[str, ...] = ()  # what the plan assumed as the training framework would (vocabulary padding)


@dataclass
class _State:
    """``R``, ``P`` or ``S(axis)``.

    A split axis is read as ``[outer, t, rest]`` (row-major): every rank holds one of the ``t``
    slices for each of the ``outer`` leading coordinates.  ``outer`` is 1 for a plain
    contiguous split; it is larger after a Reshape merges a split axis into a more significant
    one, e.g. heads split ``[b, n/t, s, d]`` merged into ``[b*n, s, d]`` (``outer = b``), so the
    split survives the merge and the later ``[b*n, s, s] -> [b, n, s, s]`` puts it back on
    ``n``, whatever ``b`` is.
    """

    kind: str  # R, P or "S"
    axis: int = -1
    origin: int | None = None  # op index that introduced the split
    outer: int = 1

    def moved(self, axis: int) -> "_State":
        """The same split, now on ``axis`` (a view that keeps the split axis whole)."""
        return _State("S", axis, self.origin, self.outer)


#: The state of every tensor no rule split (states are never mutated: one shared instance).
_REPLICATED = _State(R)


@dataclass(frozen=True, slots=True)
class AttentionCore:
    """One scaled-dot-product attention ``softmax(Q.K^T [+ mask]) . V`` found in the graph.

    ``q_heads``/``kv_heads`` are read off the head-splitting Reshape ``[.., n*d] -> [.., n, d]``
    on each operand's path back to its projection (or the projection's width over ``d`` when no
    Reshape splits heads off, as in multi-query attention), so they do not depend on how the
    export lays out batch and heads later (``[b, n, s, d]`` or merged ``[b*n, s, d]``).
    """

    scores_op: int  # op index of Q.K^T
    context_op: int  # op index of P.V
    head_dim: int
    q_heads: int | None
    kv_heads: int | None
    q_projections: frozenset[int]  # weight ops (MatMul/Gemm) that produce Q
    kv_projections: frozenset[int]  # weight ops that produce K or V
    head_reshapes: frozenset[int] = frozenset()  # the Reshapes ``[.., n*d] -> [.., n, d]`` of Q, K, V
    kv_reshapes: frozenset[int] = frozenset()  # those of them on the K or V path


#: Ops between Q.K^T and Softmax (scale, mask, soft-capping, dtype casts, a merged/unmerged view).
_SCORE_OPS = frozenset({"Mul", "Div", "Add", "Sub", "Where", "Cast", "Identity", "Tanh", "Reshape", "Dropout", "Min", "Max"})
#: Ops between Softmax and P.V (dropout, head mask, dtype casts, a view).
_PROB_OPS = frozenset({"Cast", "Identity", "Dropout", "Where", "Mul", "Reshape"})
#: Ops on the path from a projection to a Q/K/V operand that keep its head structure.
_HEAD_PATH_OPS = _VIEWS_PASS | _ELEMENTWISE | frozenset(
    {"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Expand", "Tile", "Split", "Slice", "Concat", "Flatten",
     "Gather", "GatherND"}  # BLOOM (Gather) and Falcon (GatherND, dynamo) pick Q, K, V out of a fused view
)


def _parameter_derived(graph: OpGraph) -> frozenset[str]:
    """Weights and tensors computed from weights and constants only (a transposed or cast
    weight): the weight operands of projections, never attention activations."""
    derived = {w.name for w in graph.weights}
    constant: set[str] = set()  # Constant nodes and what is computed from them alone
    inputs = set(graph.inputs)
    for op in graph.ops:
        names = [n for n in op.inputs if n]
        if all(n in derived or n in constant or (graph.producer(n) is None and n not in inputs) for n in names):
            (derived if any(n in derived for n in names) else constant).update(o for o in op.outputs if o)
    return frozenset(derived)


def _is_weight_op(op: Op, derived: frozenset[str]) -> bool:
    return op.op_type in ("MatMul", "Gemm") and any(n in derived for n in op.inputs[:2] if n)


def _activation_inputs(graph: OpGraph, op: Op, derived: frozenset[str]) -> list[Tensor]:
    out = []
    for name in op.inputs:
        tensor = graph.tensor(name) if name else None
        if tensor is not None and name not in derived and tensor.dtype.is_float and graph.producer(name) is not None:
            out.append(tensor)
    return out


def _score_matmul(graph: OpGraph, name: str, derived: frozenset[str], depth: int = 8) -> int | None:
    """The activation x activation MatMul that ``name`` (a Softmax input) is computed from."""
    at = graph.producer(name)
    if at is None or depth == 0:
        return None
    op = graph.ops[at]
    if op.op_type == "MatMul":
        return at if len(_activation_inputs(graph, op, derived)) == 2 else None
    if op.op_type not in _SCORE_OPS:
        return None
    for tensor in sorted(_activation_inputs(graph, op, derived), key=lambda x: -x.numel):
        found = _score_matmul(graph, tensor.name, derived, depth - 1)
        if found is not None:
            return found
    return None


def _context_matmul(graph: OpGraph, name: str, derived: frozenset[str], depth: int = 6) -> int | None:
    """The MatMul that reads the attention probabilities ``name`` as its left operand."""
    if depth == 0:
        return None
    for at in graph.consumers(name):
        op = graph.ops[at]
        if op.op_type == "MatMul" and op.inputs[0] == name and len(_activation_inputs(graph, op, derived)) == 2:
            return at
        if op.op_type in _PROB_OPS and op.outputs and op.outputs[0]:
            found = _context_matmul(graph, op.outputs[0], derived, depth - 1)
            if found is not None:
                return found
    return None


def _trace_heads(graph: OpGraph, name: str, head_dim: int, derived: frozenset[str],
                 _depth: int = 0) -> tuple[int | None, int | None, int | None]:
    """(heads, projection op index, head-splitting Reshape op index) of an attention operand,
    walking back from ``name`` to its projection.

    The heads are read off the first head-splitting Reshape met: its output ends in
    ``[.., n, head_dim]`` and its input's last axis holds ``n * head_dim`` (or a multiple: a
    fused ``[.., 3, n, d]`` QKV view); one head (multi-query attention) only where the Reshape
    adds the size-1 head axis to an otherwise unchanged ``[.., d]``.  Reshapes that keep
    ``head_dim`` last without splitting it off (batch*heads merges and unmerges,
    ``repeat_kv``) are views of the same heads and are walked through, so the count does not
    depend on the batch size or on how the exporter lays batch and heads out.  With no such
    Reshape the projection's width over ``head_dim`` is the head count.

    A Split or Slice that narrows the last axis (walked back) widens ``head_dim`` to its input's:
    the head-splitting Reshape before it is ``[.., n*e] -> [.., n, e]`` with each head's parts side
    by side (DeepSeek's ``kv_b_proj`` viewed as ``[.., n, nope + v]``, then split into the key's
    no-position part and the value).  A ``ScatterND`` (a slice assignment that assembles the key
    from parts, ``key[..., :nope] = k_pass``) is followed into its data, else into its updates,
    whichever reaches a projection first.
    """
    heads: int | None = None
    split_at: int | None = None
    for _ in range(64):
        at = graph.producer(name)
        if at is None:
            return heads, None, split_at
        op = graph.ops[at]
        if _is_weight_op(op, derived):
            out = graph.tensor(op.outputs[0])
            if heads is None and out is not None and out.rank >= 1 and out.shape[-1] % head_dim == 0:
                heads = out.shape[-1] // head_dim
            return heads, at, split_at
        if op.op_type == "ScatterND" and _depth < 4:
            for part in (op.inputs[0], op.inputs[2] if len(op.inputs) > 2 else ""):
                if part and any(x.name == part for x in _activation_inputs(graph, op, derived)):
                    found = _trace_heads(graph, part, head_dim, derived, _depth + 1)
                    if found[1] is not None:
                        return (heads, found[1], split_at) if heads is not None else found
            return heads, None, split_at
        if op.op_type not in _HEAD_PATH_OPS:
            return heads, None, split_at
        if op.op_type in ("Split", "Slice") and heads is None:
            src, dst = graph.tensor(op.inputs[0]), graph.tensor(name)
            if (src is not None and dst is not None and src.rank == dst.rank >= 1
                    and src.shape[:-1] == dst.shape[:-1] and dst.shape[-1] < src.shape[-1]):
                head_dim = src.shape[-1]
        if op.op_type == "Reshape" and heads is None:
            src, dst = graph.tensor(op.inputs[0]), graph.tensor(op.outputs[0])
            if src is not None and dst is not None and src.rank >= 1 and dst.rank >= 2 and dst.shape[-1] == head_dim:
                n = dst.shape[-2]
                if src.shape[-1] % (n * head_dim) == 0 and (
                    src.shape[-1] != head_dim or (n == 1 and dst.shape[:-2] == src.shape[:-1])
                ):
                    heads, split_at = n, at
        ins = _activation_inputs(graph, op, derived)
        if not ins:
            return heads, None, split_at
        name = max(ins, key=lambda x: x.numel).name  # the data path, not a scale, mask or rotary table
    return heads, None, split_at


def find_attention(graph: OpGraph) -> tuple[AttentionCore, ...]:
    """Every ``Q.K^T -> Softmax -> .V`` attention core of ``graph`` (see :class:`AttentionCore`)."""
    cores = []
    derived = _parameter_derived(graph)
    for op in graph.ops:
        if op.op_type != "Softmax" or not op.outputs or not op.outputs[0]:
            continue
        x = graph.tensor(op.inputs[0])
        if x is None or x.rank < 2 or int(op.attr("axis", -1)) % x.rank != x.rank - 1:
            continue
        scores = _score_matmul(graph, op.inputs[0], derived)
        context = _context_matmul(graph, op.outputs[0], derived)
        if scores is None or context is None:
            continue
        mm = graph.ops[scores]
        q = graph.tensor(mm.inputs[0])
        v = graph.tensor(graph.ops[context].inputs[1])
        if q is None or v is None or q.rank < 2 or v.rank < 2:
            continue
        d = q.shape[-1]
        q_heads, q_proj, q_split = _trace_heads(graph, mm.inputs[0], d, derived)
        k_heads, k_proj, k_split = _trace_heads(graph, mm.inputs[1], d, derived)
        v_heads, v_proj, v_split = _trace_heads(graph, v.name, v.shape[-1], derived)
        # one view [.., n, e] of a fused K/V projection with each head's K and V parts side by
        # side (e neither d nor dv: DeepSeek's kv_b_proj, e = nope + v) counts the heads itself
        kv_view = (k_heads if k_split is not None and k_split == v_split
                   and graph.tensor(graph.ops[k_split].outputs[0]).shape[-1] not in (d, v.shape[-1]) else None)
        sized = _heads_by_size(graph, q, d, v.shape[-1], q_proj, k_proj, v_proj, kv_view)
        if sized is not None:
            q_heads, k_heads, v_heads = sized
        kv = [n for n in (k_heads, v_heads) if n is not None]
        cores.append(AttentionCore(
            scores, context, d, q_heads, min(kv) if kv else None,
            frozenset(p for p in (q_proj,) if p is not None),
            frozenset(p for p in (k_proj, v_proj) if p is not None),
            frozenset(p for p in (q_split, k_split, v_split) if p is not None),
            frozenset(p for p in (k_split, v_split) if p is not None),
        ))
    return tuple(cores)


def _heads_by_size(graph: OpGraph, q: Tensor, d: int, dv: int, q_proj: int | None, k_proj: int | None,
                   v_proj: int | None, kv_view: int | None = None) -> tuple[int, int, int] | None:
    """(query, key, value heads) from sizes alone, whatever the export's layout, or None where a
    projection is missing or the sizes do not divide.

    A projection writes ``W`` features per token (its output's last axis) for ``numel / W``
    tokens.  The Q operand of ``Q.K^T`` holds ``n_q x d`` numbers per query token however the
    export lays out batch and heads (``[b, n, s, d]``, ``[b*n, s, d]``), and is never repeated for
    grouped-query attention, so ``n_q = numel(Q) / (tokens x d)``.  K and V are read off their
    projections' widths, before any ``repeat_kv``: a projection of their own gives ``W / d``; one
    fused for K and V ``W / 2d``; one fused for Q, K and V (GPT-2's ``c_attn``, GPT-NeoX's and
    BLOOM's per-head ``[n, 3, d]`` layout, Falcon's ``[n + 2, d]`` multi-query and
    ``[kv, n/kv + 2, d]`` grouped layouts) ``(W / d - n_q) / 2``.  Head-splitting Reshapes cannot
    tell these layouts apart (a fused ``[.., n + 2, d]`` view reads as ``n + 2`` heads).

    ``kv_view``: the heads of one Reshape ``[.., n*e] -> [.., n, e]`` of a projection fused for K and
    V that both operands are split off, each head's parts side by side in ``e`` (neither ``d`` nor
    ``dv``).  Its ``n`` is the KV head count: the key need not come whole from that projection
    (multi-head latent attention, Liu et al. 2024, arXiv:2405.04434, Sec. 2.1.3: ``kv_b_proj``
    gives each head's key without its rotary part, ``e = d - d_rope + dv``, and the rotary part is
    shared by all heads), so ``W / 2d`` would miscount (3 for DeepSeek-V3's 4 heads)."""
    if q_proj is None or k_proj is None or v_proj is None:
        return None
    widths = {}
    for at in {q_proj, k_proj, v_proj}:
        out = graph.tensor(graph.ops[at].outputs[0])
        if out is None or out.rank < 1 or out.shape[-1] <= 0:
            return None
        widths[at] = (out.shape[-1], out.numel // out.shape[-1])  # (features per token, tokens)
    width_q, tokens_q = widths[q_proj]
    if tokens_q <= 0 or q.numel % (tokens_q * d):
        return None
    n_q = q.numel // (tokens_q * d)
    if n_q < 1:
        return None
    if k_proj == q_proj:  # fused Q, K, V (V from the same projection, or its own: then K alone)
        rest = width_q - n_q * d
        if v_proj == q_proj:
            if d != dv or rest <= 0 or rest % (2 * d):
                return None
            n_k = n_v = rest // (2 * d)
        else:
            if rest <= 0 or rest % d or widths[v_proj][0] % dv:
                return None
            n_k, n_v = rest // d, widths[v_proj][0] // dv
    elif k_proj == v_proj and kv_view is not None:  # fused K and V, viewed per head
        n_k = n_v = kv_view
    elif k_proj == v_proj:  # fused K and V
        w = widths[k_proj][0]
        if d != dv or w % (2 * d):
            return None
        n_k = n_v = w // (2 * d)
    else:
        if widths[k_proj][0] % d or widths[v_proj][0] % dv:
            return None
        n_k, n_v = widths[k_proj][0] // d, widths[v_proj][0] // dv
    if n_k < 1 or n_v < 1:
        return None
    return n_q, n_k, n_v


def _head_reshape_divisors(cores: tuple[AttentionCore, ...]) -> Mapping[int, int]:
    """Per head-splitting Reshape (:attr:`AttentionCore.head_reshapes`), the heads a
    tensor-parallel split of it must divide: the core's KV heads where the view carries K or V
    (its own, or a projection fused with them), else its query heads; the fewest over the cores
    sharing it."""
    out: dict[int, int] = {}
    for core in cores:
        for at in core.head_reshapes:
            kv_view = at in core.kv_reshapes or bool(core.q_projections & core.kv_projections)
            heads = core.kv_heads if kv_view else core.q_heads
            if heads is not None:
                out[at] = min(out.get(at, heads), heads)
    return MappingProxyType(out)


def attention_heads(graph: OpGraph) -> tuple[int | None, int | None]:
    """(query heads, KV heads) of the attention cores of ``graph``; (None, None) without attention.

    The most query heads and the fewest KV heads over all cores (they agree in every layer of
    the models we know).
    """
    return _heads_of(find_attention(graph))


def _heads_of(cores: tuple[AttentionCore, ...]) -> tuple[int | None, int | None]:
    """(most query heads, fewest KV heads of a grouped-query core): a model whose stages have
    different head counts (Swin: 2 then 4) is not grouped-query for it, so its KV heads are its
    query heads, not the fewest heads of any stage."""
    q = [c.q_heads for c in cores if c.q_heads is not None]
    if not q:
        return None, None
    grouped = [c.kv_heads for c in cores if c.kv_heads is not None and c.q_heads is not None and c.kv_heads < c.q_heads]
    return max(q), (min(grouped) if grouped else max(q))


class _Conflict(Exception):
    """A split introduced by op ``origin`` cannot pass the Reshape ``at``."""

    def __init__(self, origin: int, at: int) -> None:
        self.origin = origin
        self.at = at


def _token_outer(graph: OpGraph, name: str, t: int) -> int:
    """The ``outer`` of a sequence-parallel reduce-scatter of ``name``.

    A reduce-scatter may hand each rank any fixed part of the tokens.  On a merged token axis
    ``[b*s, h]`` (exports that flatten batch and sequence around a Gemm) the part that matches
    the residual stream's ``[b, s/t, h]`` split is ``[b, s/t]`` of ``b*s``, i.e. ``outer = b``
    (read off the Reshape that unflattens it), whatever the batch size; else 1.
    """
    tensor = graph.tensor(name)
    if tensor is None or tensor.rank != 2:
        return 1
    for at in graph.consumers(name):
        op = graph.ops[at]
        dst = graph.tensor(op.outputs[0]) if op.op_type == "Reshape" and op.outputs and op.outputs[0] else None
        if (dst is not None and dst.rank >= 3 and dst.shape[-1] == tensor.shape[-1] and dst.shape[-2] % t == 0
                and dst.numel == tensor.numel):
            outer = 1
            for dim in dst.shape[:-2]:
                outer *= dim
            return outer
    return 1


def _replication_warning(graph: OpGraph, conflict: _Conflict, t: int, cores: tuple[AttentionCore, ...]) -> str:
    """Why op ``conflict.origin`` is kept whole: grouped-query KV heads only where they are.

    A K/V projection of an attention core whose KV heads are fewer than the query heads and
    not divisible by t is replicated (Megatron-LM itself requires t to divide
    ``num_query_groups``, ``megatron/core/transformer/attention.py``; vLLM's
    ``QKVParallelLinear`` replicates KV heads when t exceeds them); any other split that a
    Reshape cannot keep is named with that Reshape.
    """
    op = graph.ops[conflict.origin]
    for core in cores:
        if (conflict.origin in core.kv_projections and core.kv_heads is not None and core.q_heads is not None
                and core.kv_heads < core.q_heads and core.kv_heads % t):
            return (f"{op.op_type} {op.name!r} replicated: t={t} does not divide its grouped-query KV heads "
                    f"({core.kv_heads} KV, {core.q_heads} query heads)")
    at = graph.ops[conflict.at]
    src, dst = graph.tensor(at.inputs[0]), graph.tensor(at.outputs[0])
    shapes = f" ({list(src.shape)} -> {list(dst.shape)})" if src is not None and dst is not None else ""
    return (f"{op.op_type} {op.name!r} replicated: its output split over t={t} cannot pass "
            f"{at.op_type} {at.name!r}{shapes}")


def shard_tensor_parallel(
    graph: OpGraph,
    tp_size: int,
    sequence_parallel: bool = False,
    dtype_bytes: int = 2,
    needs_grad: frozenset[str] | None = None,
    cores: tuple[AttentionCore, ...] | None = None,
) -> TensorParallelPlan:
    """Propagate tensor-parallel sharding through ``graph`` (see module docstring).

    ``needs_grad`` (:func:`requires_grad`) and ``cores`` (:func:`find_attention`) depend on the
    graph alone: a caller sharding one graph several ways passes them once computed (None: found here).

    Raises
    ------
    ConfigError
        ``tp_size`` does not divide the attention heads or a column-parallel output size.
    """
    cores = find_attention(graph) if cores is None else cores
    heads, kv_heads = _heads_of(cores)
    if tp_size == 1:
        shards = tuple(
            Shard(graph.op_inputs(op), graph.op_outputs(op), 1, "replicated (t=1)") for op in graph.ops
        )
        return TensorParallelPlan(1, shards, (), {w.name: 1 for w in graph.weights}, heads, kv_heads)
    if heads is not None and heads % tp_size:
        divisors = [d for d in range(1, heads + 1) if heads % d == 0]
        raise ConfigError(
            f"--t {tp_size} does not divide the {heads} attention heads; choose t from {divisors}"
        )
    replicated: dict[int, str] = {}  # op index -> why it is kept whole
    while True:
        try:
            return _propagate(graph, tp_size, sequence_parallel, dtype_bytes, replicated, heads, kv_heads, needs_grad,
                              _head_reshape_divisors(cores))
        except _Conflict as conflict:
            if conflict.origin in replicated:  # pragma: no cover - defensive: cannot loop
                raise ConfigError("tensor-parallel sharding did not converge; report this model") from None
            replicated[conflict.origin] = _replication_warning(graph, conflict, tp_size, cores)


def _propagate(
    graph: OpGraph,
    t: int,
    sp: bool,
    dtype_bytes: int,
    replicated: dict[int, str],
    heads: int | None,
    kv_heads: int | None,
    needs_grad: frozenset[str] | None,
    head_reshapes: Mapping[int, int] = MappingProxyType({}),
) -> TensorParallelPlan:
    """One pass over ``graph`` in order: each op's rule, then the graph outputs' collectives
    (raises :class:`_Conflict` when an op must be kept whole: the caller retries without it)."""
    run = _Propagation(graph, t, sp, dtype_bytes, replicated, needs_grad, head_reshapes)
    for op in graph.ops:
        run.step(op)
    run.graph_outputs()
    run.warn_whole_stacked()
    weight_factor = {w.name: (t if w.name in run.weight_split else 1) for w in graph.weights}
    return TensorParallelPlan(t, tuple(run.shards), tuple(run.comms), weight_factor, heads, kv_heads,
                              tuple(dict.fromkeys(run.warnings)), tuple(run.assumptions))


class _Propagation:
    """The state of one :func:`_propagate` pass: each tensor's ``_State``, the weights' splits, the
    collectives and shards found so far.  Its bound methods (``state``, ``to_replicated``,
    ``weight_of``, ...) are what the per-op rules (``_linear``, ``_movement``, ...) receive."""

    def __init__(self, graph: OpGraph, t: int, sp: bool, dtype_bytes: int, replicated: dict[int, str],
                 needs_grad: frozenset[str] | None, head_reshapes: Mapping[int, int]) -> None:
        self.graph, self.t, self.sp, self.dtype_bytes = graph, t, sp, dtype_bytes
        self.replicated, self.head_reshapes = replicated, head_reshapes
        self.states: dict[str, _State] = {}
        self.weight_split: dict[str, int] = {}  # weight -> split axis (of the weight's own shape)
        self.weight_alias: dict[str, tuple[str, tuple[int, ...]]] = {}  # tensor -> (weight, perm to weight)
        self.comms: list[TPComm] = []
        self.shards: list[Shard] = []
        self.warnings: list[str] = []
        self.bwd_reduced: set[str] = set()
        self.vocab = vocab_table(graph)
        self.vocab_rows = graph.tensors[self.vocab].shape[0] if self.vocab else None
        self.assumptions: list[str] = []
        if self.vocab_rows and self.vocab_rows % t:
            self.assumptions.append(
                f"vocabulary of {self.vocab_rows} padded to {padded_vocab(self.vocab_rows, t)} for t={t} "
                "(Megatron-LM --make-vocab-size-divisible-by 128)"
            )
        self.grad = needs_grad if needs_grad is not None else requires_grad(graph)
        self.stacked: list[str] = []  # stacked expert weights picked by a Gather (those left whole: one warning)
        self.picked: set[str] = set()  # the matrices picked from them, views of the stacked weight
        # partial sums a bias was added to: the op that made them (the reduction belongs to it)
        self.origin: dict[str, int] = {}
        self.summed: set[str] = set()  # sums of partial sums (a parallel block's attention + MLP outputs)
        # (tensor, split axis) -> the rank's view: one Tensor per split, not one per read (a
        # tensor is read as an output and by each consumer; _split_shape is pure in its inputs)
        self.views: dict[tuple[str, int], Tensor] = {}

    # ------------------------------------------------------------------ tensor views and states

    def local(self, name: str) -> Tensor | None:
        """The shape one rank holds of ``name``: split weights and split activations cut by t."""
        tensor = self.graph.tensors.get(name) if name else None  # graph.tensor(name), without the call
        if tensor is None:
            return None
        if tensor.is_weight or name in self.weight_alias:
            base, perm = self.weight_alias.get(name, (name, ()))
            axis = self.weight_split.get(base)
            if axis is None:
                return tensor
            return self._split_view(tensor, perm.index(axis) if perm else axis)
        st = self.states.get(name)
        if st is None or st.kind != "S":
            return tensor
        view = self.views.get((name, st.axis))  # _split_view's cache, read inline: the common case
        return view if view is not None else self._split_view(tensor, st.axis)

    def _split_view(self, tensor: Tensor, axis: int) -> Tensor:
        """:func:`_split_shape` of ``tensor`` on ``axis``, once per (tensor, axis)."""
        key = (tensor.name, axis)
        view = self.views.get(key)
        if view is None:
            view = self.views[key] = _split_shape(tensor, axis, self.t, self.vocab_rows)
        return view

    def state(self, name: str) -> _State:
        return self.states.get(name) or _REPLICATED

    def nbytes(self, name: str) -> float:
        tensor = self.graph.tensor(name)
        return float(tensor.numel * self.dtype_bytes) if tensor is not None else 0.0

    def weight_of(self, name: str) -> tuple[str, tuple[int, ...]] | None:
        """``(weight, perm to the weight)`` when ``name`` is a weight or a view of one, else None."""
        if name in self.weight_alias:  # a view of a weight (itself a parameter-derived weight): split as its source
            return self.weight_alias[name]
        tensor = self.graph.tensor(name)
        if tensor is not None and tensor.is_weight:
            return name, ()
        return None

    def split_weight(self, name: str, axis_in_tensor: int, op: Op) -> None:
        """Split the weight behind ``name`` on ``axis_in_tensor`` (of ``name``'s shape); a second,
        different split of the same weight is warned about and ignored."""
        base, perm = self.weight_of(name) or (name, ())
        axis = perm[axis_in_tensor] if perm else axis_in_tensor
        prev = self.weight_split.get(base)
        if prev is not None and prev != axis:
            self.warnings.append(f"weight {base!r} is used with two different splits; costed with the first")
            return
        self.weight_split[base] = axis

    # ------------------------------------------------------------------ collectives

    def to_replicated(self, op: Op, name: str, why: str, column: bool = False) -> None:
        """Make ``name`` replicated before ``op`` reads it, inserting the collective (``column``:
        ``op`` is a column-parallel GEMM, whose weight gradient the backward collective overlaps)."""
        st = self.state(name)
        if st.kind == R:
            return
        if st.kind == P:
            self.comms.append(TPComm(CollectiveKind.ALL_REDUCE, Phase.FORWARD, op.index, name, self.nbytes(name), why))
        else:
            self.comms.append(TPComm(CollectiveKind.ALL_GATHER, Phase.FORWARD, op.index, name, self.nbytes(name), why))
            if name in self.grad:
                self.comms.append(
                    TPComm(CollectiveKind.REDUCE_SCATTER, Phase.BACKWARD, op.index, name, self.nbytes(name), "gradient of " + why,
                           overlaps_wgrad=column)
                )
                # that reduce-scatter already sums the input gradient: no Megatron-f all-reduce
                self.bwd_reduced.add(name)
        self.states[name] = _State(R)

    def resolve_partial(self, op: Op, name: str) -> None:
        """Reduce the partial sums ``name`` before ``op`` reads it: an all-reduce (Megatron g), or a
        reduce-scatter onto the sequence axis under sequence parallelism."""
        st = self.state(name)
        if st.kind != P:
            return
        graph, t = self.graph, self.t
        at = self.origin.get(name, graph.producer(name))
        at = op.index if at is None else at  # the reduction belongs to the op that made the partial sums
        tensor = graph.tensor(name)
        seq_axis = tensor.rank - 2 if tensor is not None and tensor.rank >= 2 else -1
        if self.sp and tensor is not None and seq_axis >= 0 and tensor.shape[seq_axis] % t == 0:
            self.comms.append(
                TPComm(CollectiveKind.REDUCE_SCATTER, Phase.FORWARD, at, name, self.nbytes(name),
                       ("summed row-parallel outputs" if name in self.summed else "row-parallel output") + " (sequence parallel)")
            )
            if name in self.grad:
                self.comms.append(
                    TPComm(CollectiveKind.ALL_GATHER, Phase.BACKWARD, at, name, self.nbytes(name),
                           "gradient of a sequence-parallel reduce-scatter")
                )
            self.states[name] = _State("S", seq_axis, None, _token_outer(graph, name, t))
        else:
            why = "summed row-parallel outputs, reduced once (Megatron g)" if name in self.summed else "row-parallel output (Megatron g)"
            self.comms.append(TPComm(CollectiveKind.ALL_REDUCE, Phase.FORWARD, at, name, self.nbytes(name), why))
            self.states[name] = _State(R)

    def column_input_grad(self, op: Op, name: str) -> None:
        """The backward all-reduce of a column-parallel op's input gradient (Megatron f), once per tensor."""
        if name in self.bwd_reduced or name not in self.grad:
            return
        self.bwd_reduced.add(name)
        self.comms.append(
            TPComm(CollectiveKind.ALL_REDUCE, Phase.BACKWARD, op.index, name, self.nbytes(name),
                   "input gradient of column-parallel ops (Megatron f)", overlaps_wgrad=True)
        )

    # ------------------------------------------------------------------ one op

    def step(self, op: Op) -> None:
        """Apply ``op``'s rule: reduce or keep its partial-sum inputs, find its output's state, record its shard."""
        ins = list(op.inputs)
        tensors, alias = self.graph.tensors, self.weight_alias
        # activations: not a weight, nor a view of one (weight_of None), and known to the graph
        act_ins = [n for n in ins if n and n not in alias and (t := tensors.get(n)) is not None and not t.is_weight]
        states = self.states
        if any((st := states.get(n)) is not None and st.kind == P for n in act_ins):
            out_state, rule = self._partial_sums(op, ins, act_ins)
        else:  # no partial sums read: nothing to keep or reduce (_partial_sums' every branch needs one)
            out_state, rule = _REPLICATED, "replicated"
        factor = 1
        if out_state.kind != P:
            found = self._weight_rule(op, ins)
            out_state, rule, factor = found if found is not None else self._activation_rule(op, act_ins)
        kind = out_state.kind
        if kind == "S" or kind == P:
            for o in op.outputs:
                if o:
                    states[o] = out_state.moved(out_state.axis) if kind == "S" else _State(P)
        local = self.local
        in_views = tuple([local(n) for n in ins])  # local("") is None, as an omitted input's view
        if kind == "S" and factor > 1:
            in_views = _slice_replicated(self.graph, op, in_views, out_state.axis, self.t, self.vocab_rows)
        self.shards.append(Shard(in_views, tuple([local(n) for n in op.outputs]), factor, rule))

    def _partial_sums(self, op: Op, ins: list[str], act_ins: list[str]) -> tuple[_State, str]:
        """Every partial sum is reduced before it is read (P + P excepted, and a bias added to a
        partial sum that then meets another projection's: see _meets_projection).  Returns
        ``(P, rule)`` when ``op`` keeps the partial sums, else ``(R, "replicated")`` after reducing them."""
        graph, state, weight_of = self.graph, self.state, self.weight_of
        outs = [o for o in op.outputs if o]
        if op.op_type in ("Add", "Sub", "Sum") and act_ins and all(state(n).kind == P for n in act_ins) and len(act_ins) == len([n for n in ins if n]):
            self.summed.update(o for o in outs)
            return _State(P), "partial sum"
        if (op.op_type == "Add" and len(act_ins) == 1 and state(act_ins[0]).kind == P
                and _bias_operand(graph, op, act_ins[0], weight_of) and _meets_projection(graph, op.outputs[0], weight_of)):
            self.origin[op.outputs[0]] = self.origin.get(act_ins[0], graph.producer(act_ins[0]))  # type: ignore[assignment]
            return _State(P), "partial sum + bias (added once, after the reduction)"
        if (len(p_ins := [n for n in act_ins if state(n).kind == P]) == 1 and _linear_in(graph, op, p_ins[0], state)
                and _sum_ahead(graph, op, p_ins[0])):
            # partial sums on their way to a sum that shrinks them (the experts' outputs weighted
            # and summed over the top-k choices): reduced once after that sum, the smaller tensor
            return _State(P), "partial sum (reduced after the sum ahead)"
        if (op.op_type == "Add" and (partial := _residual_partial(graph, op, act_ins, state, self.sp, self.t)) is not None
                and _only_meets_projections(graph, op.outputs[0], weight_of)):
            # a parallel block summed (x + attn) + mlp (Cohere): x is added once, after the
            # one reduction of attn + mlp, as when it is summed (attn + mlp) + x (GPT-NeoX)
            self.origin[op.outputs[0]] = self.origin.get(partial, graph.producer(partial))  # type: ignore[assignment]
            return _State(P), "partial sum + residual (added once, after the reduction)"
        for n in act_ins:
            self.resolve_partial(op, n)
        return _State(R), "replicated"

    def _weight_rule(self, op: Op, ins: list[str]) -> tuple[_State, str, int] | None:
        """The rules tried first, in order: shape-only ops, views of weights, GEMMs with a weight
        (or a picked expert matrix), stacked expert weights, embeddings; None when none applies."""
        graph, t, weight_of = self.graph, self.t, self.weight_of
        if op.op_type in _NO_DATA:
            return _State(R), "shape", 1
        if op.op_type == "Transpose" and weight_of(ins[0]) is not None:
            base, perm0 = weight_of(ins[0])  # type: ignore[misc]
            perm = tuple(op.attr("perm") or tuple(reversed(range(graph.tensor(ins[0]).rank))))  # type: ignore[union-attr]
            self.weight_alias[op.outputs[0]] = (base, tuple(perm0[p] if perm0 else p for p in perm))
            return _State(R), "weight view", 1
        if op.op_type in ("Cast", "Identity") and weight_of(ins[0]) is not None:
            self.weight_alias[op.outputs[0]] = weight_of(ins[0])  # type: ignore[assignment]
            return _State(R), "weight view", 1
        if op.op_type == "MatMul" and any(n in self.picked for n in ins[:2]):
            return _stacked_expert_matmul(op, graph, t, self.sp, self.state, self.to_replicated, self.column_input_grad,
                                          self.split_weight, weight_of, self.replicated, self.picked)
        if op.op_type in _WEIGHT_OPS and _weight_operand(op, weight_of) is not None:
            return _linear(op, graph, t, self.sp, self.state, self.to_replicated, self.column_input_grad, self.split_weight,
                           weight_of, self.replicated, self.warnings, self.vocab_rows)
        if op.op_type in ("Gather", "GatherND") and _stacked_matrices(graph, op, weight_of):
            base, perm0 = weight_of(ins[0])  # type: ignore[misc]
            self.stacked.append(base)
            axes = _picked_axes(graph, op)
            if axes is None:
                return _State(R), "replicated (stacked expert weights)", 1
            # the picked matrices are a view of the stacked weight: split as it is
            self.picked.add(op.outputs[0])
            self.weight_alias[op.outputs[0]] = (base, tuple(perm0[a] if perm0 else a for a in axes))
            return _State(R), "stacked expert weights (picked)", 1
        if op.op_type == "Gather" and weight_of(ins[0]) is not None:
            base, _ = weight_of(ins[0])  # type: ignore[misc]
            if base == self.vocab and graph.tensor(base) is not None:
                self.split_weight(ins[0], 0, op)
                return _State(P), "vocab-parallel embedding", t
            return _State(R), "replicated embedding", 1
        return None

    def _activation_rule(self, op: Op, act_ins: list[str]) -> tuple[_State, str, int]:
        """The rules for ops on activations only: batched MatMul, elementwise, gathers and scatters,
        data movement, reductions; any other op gathers its split inputs (with a warning)."""
        graph, t, state, to_replicated = self.graph, self.t, self.state, self.to_replicated
        if op.op_type == "MatMul":
            return _batched_matmul(op, graph, t, state, to_replicated)
        if op.op_type in _VIEWS_PASS or op.op_type in _ELEMENTWISE:
            return _elementwise(op, graph, act_ins, state, to_replicated, self.split_weight, self.weight_of, t)
        if op.op_type == "GatherElements":
            return _gather_elements(op, graph, t, state, to_replicated)
        if op.op_type == "ScatterND":
            return _scatter_nd(op, graph, t, state, to_replicated)
        if op.op_type in ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Expand", "Split", "Slice", "Concat", "Gather",
                          "GatherND", "Tile", "Pad"):
            return _movement(op, graph, t, state, to_replicated, self.head_reshapes)
        if op.op_type in ("Softmax", "LogSoftmax", "LayerNormalization", "RMSNormalization", "SimplifiedLayerNormalization",
                          "ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL2", "ReduceSumSquare",
                          "ReduceLogSumExp", "ArgMax", "ArgMin", "CumSum", "TopK", "InstanceNormalization", "GroupNormalization"):
            return _reduction(op, graph, t, state, to_replicated)
        for n in act_ins:
            if state(n).kind == "S":
                to_replicated(op, n, f"{op.op_type} has no sharding rule: gathered")
                self.warnings.append(f"{op.op_type} {op.name!r} reads a tensor-parallel split tensor; gathered and replicated")
        return _State(R), "replicated", 1

    # ------------------------------------------------------------------ the end of the graph

    def graph_outputs(self) -> None:
        """Graph outputs: a vocabulary-split logits tensor -> Megatron's parallel cross-entropy;
        partial or split outputs are reduced or gathered."""
        graph = self.graph
        for name in graph.outputs:
            st = self.state(name)
            tensor = graph.tensor(name)
            if tensor is None:
                continue
            last = graph.producer(name) if graph.producer(name) is not None else len(graph.ops) - 1
            if st.kind == "S" and st.axis == tensor.rank - 1:
                tokens = tensor.numel // tensor.shape[-1]
                for what in ("max logit", "target logit", "sum of exponentials"):
                    self.comms.append(
                        TPComm(CollectiveKind.ALL_REDUCE, Phase.FORWARD, last, name, float(tokens * 4),
                               f"vocab-parallel cross-entropy: {what} (Megatron)")
                    )
            elif st.kind == P:
                self.comms.append(TPComm(CollectiveKind.ALL_REDUCE, Phase.FORWARD, last, name, self.nbytes(name), "partial graph output"))
            elif st.kind == "S":
                self.comms.append(TPComm(CollectiveKind.ALL_GATHER, Phase.FORWARD, last, name, self.nbytes(name), "split graph output gathered"))

    def warn_whole_stacked(self) -> None:
        """One warning for the stacked expert weights no rule split (kept whole on every rank)."""
        whole = [w for w in dict.fromkeys(self.stacked) if w not in self.weight_split]
        if whole:
            first = self.graph.tensor(whole[0])
            names = whole
            self.warnings.append(
                f"{len(names)} stacked expert weight(s) ({names[0]!r} {first.shape if first is not None else ''}"
                f"{', ...' if len(names) > 1 else ''}) are picked by Gather for the experts' products: kept whole on every "
                f"tensor-parallel rank (t does not divide the experts' intermediate size, or the products do not read as an "
                f"expert MLP; costed replicated); --ep splits the experts across ranks"
            )


def _slice_replicated(graph: OpGraph, op: Op, views: tuple, axis: int, t: int, vocab_rows: int | None) -> tuple:
    """A replicated operand of a split op is read only in the rank's slice (a free local view):
    show it with the slice's shape so the op's cost sees consistent operands."""
    y = graph.tensor(op.outputs[0]) if op.outputs and op.outputs[0] else None
    if y is None or axis >= y.rank:
        return views
    full = y.shape[axis]
    out = list(views)
    for i, (name, view) in enumerate(zip(op.inputs, views)):
        tensor = graph.tensor(name) if name else None
        if tensor is None or view is None or view.shape != tensor.shape:
            continue
        if op.op_type in ("MatMul", "Gemm", "Conv", "ConvTranspose") and axis >= y.rank - 2:
            continue  # only batch (head) axes of a matmul are sliced; weights keep their split
        a = axis - (y.rank - tensor.rank)
        if 0 <= a < tensor.rank and tensor.shape[a] == full and full > 1:
            out[i] = _split_shape(tensor, a, t, vocab_rows)
    return tuple(out)


def requires_grad(graph: OpGraph) -> frozenset[str]:
    """Activations that depend on a weight (their gradient is computed in backward).  Integer
    and boolean tensors never carry a gradient, whatever they are computed from: the shape of
    an activation (``Shape -> Gather -> Unsqueeze``, which BART's legacy export computes in one
    decoder layer and reuses in the next), an ``ArgMax``, a comparison."""
    needs: set[str] = {w.name for w in graph.weights}
    for op in graph.ops:
        if any(n in needs for n in op.inputs if n):
            needs.update(o for o in op.outputs
                         if o and not ((t := graph.tensors.get(o)) is not None and not t.dtype.is_float))
    return frozenset(needs)


def padded_vocab(vocab: int, t: int, multiple: int = VOCAB_PAD_MULTIPLE) -> int:
    """Megatron-LM pads the vocabulary to a multiple of ``multiple * t``
    (``--make-vocab-size-divisible-by 128``; megatron/training/tokenizer ``_vocab_size_with_padding``)."""
    step = multiple * t
    return -(-vocab // step) * step


def _split_shape(tensor: Tensor, axis: int, t: int, vocab_rows: int | None = None) -> Tensor:
    if axis < 0 or axis >= tensor.rank:
        return tensor
    shape = list(tensor.shape)
    if shape[axis] % t:
        if vocab_rows is None or shape[axis] != vocab_rows:
            return tensor
        shape[axis] = padded_vocab(vocab_rows, t)
    shape[axis] //= t
    return tensor.with_shape(tuple(shape))


def _bias_operand(graph: OpGraph, op: Op, partial: str, weight_of) -> bool:
    """Whether ``op`` adds a bias to ``partial``: its other operand is a weight that broadcasts
    along the last axis only (``[n]`` or ``[1, .., 1, n]``)."""
    others = [n for n in op.inputs if n and n != partial]
    if len(others) != 1 or weight_of(others[0]) is None:
        return False
    bias, x = graph.tensor(others[0]), graph.tensor(partial)
    if bias is None or x is None or not bias.shape or bias.shape[-1] != x.shape[-1]:
        return False
    return all(d == 1 for d in bias.shape[:-1])


def _meets_projection(graph: OpGraph, name: str, weight_of, only: Op | None = None) -> bool:
    """Whether ``name`` (a row-parallel output plus its bias) is next added to another
    projection's output (plus its bias): the attention and MLP outputs of a parallel block
    (GPT-J, GPT-NeoX, Phi: ``x + attn(ln(x)) + mlp(ln(x))``).

    There the two partial sums are added first and reduced once, as GPT-NeoX's library does
    (``gpt_j_residual``: "we can avoid doing the allreduce in the attn / mlp outputs ... we can
    do a single allreduce after we add mlp / attn outputs", megatron/model/transformer.py
    ``ParallelTransformerLayer.forward``), with each bias added once after the reduction.
    Elsewhere (a sequential block's ``x + proj(h) + b``) the partial sum is reduced before its
    bias as Megatron-LM's ``RowParallelLinear`` does, so the bias add runs on the reduced (with
    sequence parallelism, the sequence-sharded) tensor.  The other operand's producer is
    followed back through bias adds to a weight ``MatMul``/``Gemm``; ``only``: look at that
    reader alone."""
    for c in graph.consumers(name):
        op = graph.ops[c]
        if op.op_type not in ("Add", "Sum") or (only is not None and op is not only):
            continue
        for other in op.inputs:
            if not other or other == name:
                continue
            seen = 0
            while other and seen < 4:
                p = graph.producer(other)
                if p is None:
                    break
                prod = graph.ops[p]
                if prod.op_type in ("MatMul", "Gemm") and _weight_operand(prod, weight_of) is not None:
                    return True
                if prod.op_type != "Add" or not any(n and weight_of(n) is not None for n in prod.inputs):
                    break
                other = next((n for n in prod.inputs if n and weight_of(n) is None), "")
                seen += 1
    return False


def _residual_partial(graph: OpGraph, op: Op, act_ins: list[str], state, sp: bool, t: int) -> str | None:
    """The partial sum of an ``Add`` of a partial sum and a residual stream ``x`` of the output's
    full shape that every rank holds alike: replicated, or with sequence parallelism split along
    the sequence axis the reduce-scatter gives (:func:`_only_meets_projections` says whether the
    sum can stay partial); ``None`` otherwise."""
    ins = [n for n in op.inputs if n]
    if len(ins) != 2 or len(act_ins) != 2 or not op.outputs or not op.outputs[0]:
        return None
    kinds = [state(n).kind for n in act_ins]
    if kinds.count(P) != 1:
        return None
    partial, x = (act_ins[0], act_ins[1]) if kinds[0] == P else (act_ins[1], act_ins[0])
    out, xt = graph.tensor(op.outputs[0]), graph.tensor(x)
    if out is None or xt is None or xt.shape != out.shape:
        return None
    st = state(x)
    if st.kind == R:
        return partial
    seq_axis = out.rank - 2
    if sp and st.kind == "S" and seq_axis >= 0 and st.axis == seq_axis and st.outer == 1 and out.shape[seq_axis] % t == 0:
        return partial
    return None


def _only_meets_projections(graph: OpGraph, name: str, weight_of) -> bool:
    """Whether every reader of ``name`` (a partial sum plus the residual stream) adds it to
    another projection's output: the parallel block ``x + attn(ln(x)) + mlp(ln(x))`` summed in
    the order ``(x + attn) + mlp`` (Cohere).  The order of additions does not change the sum, so
    it is reduced once, as ``(attn + mlp) + x`` (GPT-J, GPT-NeoX) is: x joins after the
    reduction.  A sequential block's ``h = x + attn`` is also read by the next norm, so it is
    reduced at once there, as before."""
    readers = graph.consumers(name)
    if not readers:
        return False
    for c in readers:
        op = graph.ops[c]
        if op.op_type not in ("Add", "Sum") or not _meets_projection(graph, name, weight_of, only=op):
            return False
    return True


#: Ops that pass a projection's output on unchanged in layout (its bias add is checked apart).
_PASS_THROUGH = ("Dropout", "Identity", "Cast")


def _feeds_block(graph: OpGraph, name: str, weight_of) -> bool:
    """Whether ``name`` (a weight GEMM's output), after its bias add and any dropout, identity
    or cast, is read by several ops of which at least one is a weight GEMM taking it as its
    activation: the output is then a block's input (ELECTRA's embedding projection feeds layer
    0's query, key and value and its residual), not the hidden activation of a column-parallel /
    row-parallel pair, whose column-split output goes to exactly one consumer (an activation, a
    Split of fused Q/K/V, a head reshape) on its way to the row-parallel GEMM."""
    seen = 0
    while seen < 4:
        consumers = [graph.ops[c] for c in graph.consumers(name)]
        if len(consumers) != 1:
            break
        nxt = consumers[0]
        passes = nxt.op_type in _PASS_THROUGH or (nxt.op_type == "Add" and _bias_operand(graph, nxt, name, weight_of))
        if not passes or not nxt.outputs or not nxt.outputs[0]:
            return False
        name, seen = nxt.outputs[0], seen + 1
    consumers = [graph.ops[c] for c in graph.consumers(name)]
    if len(consumers) < 2:
        return False
    for c in consumers:
        if c.op_type in ("MatMul", "Gemm"):
            slot = _weight_operand(c, weight_of)
            if slot is not None and c.inputs[1 - slot] == name:
                return True
    return False


#: Ops a normalised low-rank code passes on its way to the up-projection (:func:`_low_rank_bottleneck`).
_BOTTLENECK_OPS = _VIEWS_PASS | _ELEMENTWISE | frozenset(
    {"Split", "Slice", "Reshape", "Squeeze", "Unsqueeze", "ReduceMean", "LayerNormalization", "RMSNormalization",
     "SimplifiedLayerNormalization"})
#: How many ops after a down-projection :func:`_low_rank_bottleneck` looks at for its norm and up-projection.
_BOTTLENECK_WINDOW = 48


def _low_rank_bottleneck(graph: OpGraph, op: Op, weight_of) -> bool:
    """Whether ``op`` (a weight GEMM; its caller checks that it narrows the features at least two
    times) is the down-projection of a low-rank bottleneck ``x -> down -> norm -> up``: multi-head
    latent attention (DeepSeek-V2/V3, Liu et al. 2024, arXiv:2405.04434, Sec. 2.1.2) compresses the
    hidden state to a latent ``c = W_down x`` (``q_a_proj``; ``kv_a_proj_with_mqa``, whose output
    also carries the shared rotary key, split off first), normalises it (``q_a_layernorm``,
    ``kv_a_layernorm``) and expands it per head (``q_b_proj``, ``kv_b_proj``).

    Read off the ops computed from ``op``'s output alone (with weights and constants) in the next
    :data:`_BOTTLENECK_WINDOW` ops, through point-wise ops, slices and views that keep the feature
    axis last: one of them normalises over that last axis (a norm op, or the ``ReduceMean`` of a
    decomposed RMSNorm/LayerNorm), and a weight GEMM reads one of them.  A residual add or a
    head-splitting Reshape ends the walk, so a per-head q/k norm (Qwen3) or a block's output
    projection (whose output meets the residual stream) is not a bottleneck.  Bounded: at most
    :data:`_BOTTLENECK_WINDOW` ops per GEMM."""
    reached = {op.outputs[0]}
    inputs = set(graph.inputs)
    normalised = False
    for nxt in graph.ops[op.index + 1: op.index + 1 + _BOTTLENECK_WINDOW]:
        mine = [n for n in nxt.inputs if n in reached]
        if not mine:
            continue
        if nxt.op_type in ("MatMul", "Gemm") and (slot := _weight_operand(nxt, weight_of)) is not None:
            if normalised and nxt.inputs[1 - slot] in reached:
                return True
            continue
        if nxt.op_type not in _BOTTLENECK_OPS or not nxt.outputs or not nxt.outputs[0]:
            continue
        others = [n for n in nxt.inputs if n and n not in reached and weight_of(n) is None]
        if any(graph.producer(n) is not None or n in inputs for n in others):
            continue  # mixes in another activation (a residual add): not the code's own norm
        x, y = graph.tensor(mine[0]), graph.tensor(nxt.outputs[0])
        if x is None or y is None or x.rank < 1 or y.rank < 1:
            continue
        if nxt.op_type in ("ReduceMean", "LayerNormalization", "RMSNormalization", "SimplifiedLayerNormalization"):
            if nxt.op_type == "ReduceMean":
                last_only = y.shape[-1] == 1 < x.shape[-1] if y.rank == x.rank else y.shape == x.shape[:-1]
                if not last_only:
                    continue
            elif (_norm_axes(nxt, x.rank) or set()) != {x.rank - 1}:
                continue
            normalised = True
        elif nxt.op_type in ("Reshape", "Squeeze", "Unsqueeze") and y.shape[-1] != x.shape[-1]:
            continue  # splits the features (heads): no longer one code vector
        reached.update(o for o in nxt.outputs if o)
    return False


def _stacked_matrices(graph: OpGraph, op: Op, weight_of) -> bool:
    """Whether ``op`` (a Gather or GatherND) picks matrices out of a stacked weight of rank >= 3
    for a matrix product: the experts of a mixture-of-experts layer exported as one ``[E, n, k]``
    parameter indexed by the router's choice (transformers' ``batched_mm`` experts)."""
    source = weight_of(op.inputs[0]) if op.inputs and op.inputs[0] else None
    table = graph.tensor(source[0]) if source is not None else None
    out = op.outputs[0] if op.outputs else ""
    return (table is not None and table.rank >= 3 and bool(out)
            and any(graph.ops[c].op_type in ("MatMul", "Einsum") for c in graph.consumers(out)))


def _picked_axes(graph: OpGraph, op: Op) -> tuple[int, ...] | None:
    """For each axis of the matrices ``op`` picks from a stacked weight, the stacked weight's axis
    it is (the index axes map to the expert axis 0), or None when ``op`` does not pick along the
    expert axis.  ``Gather(data, idx, axis=0)``: ``idx.shape + data.shape[1:]``; ``GatherND`` with
    ``batch_dims=0`` and one index per row: ``idx.shape[:-1] + data.shape[1:]`` (ONNX)."""
    data, out = graph.tensor(op.inputs[0]), graph.tensor(op.outputs[0])
    if data is None or out is None or out.rank < data.rank - 1:
        return None
    if op.op_type == "Gather" and int(op.attr("axis", 0)) % data.rank != 0:
        return None
    if op.op_type == "GatherND":
        idx = graph.tensor(op.inputs[1])
        if int(op.attr("batch_dims", 0)) or idx is None or not idx.rank or idx.shape[-1] != 1:
            return None
    lead = out.rank - (data.rank - 1)
    return tuple(0 if j < lead else j - lead + 1 for j in range(out.rank))


def _is_picked_expert(graph: OpGraph, name: str, weight_of) -> bool:
    producer = graph.producer(name)
    return (producer is not None and graph.ops[producer].op_type in ("Gather", "GatherND")
            and _stacked_matrices(graph, graph.ops[producer], weight_of))


def _feeds_expert_product(graph: OpGraph, name: str, weight_of, depth: int = 12) -> bool:
    """Whether ``name`` (an expert's first projection) reaches, through point-wise ops, slices and
    views (the gated activation), the activation operand of another expert product: a MatMul with
    matrices picked from a stacked weight (the expert's down projection)."""
    frontier, seen = [name], {name}
    for _ in range(depth):
        following = []
        for tensor_name in frontier:
            for at in graph.consumers(tensor_name):
                nxt = graph.ops[at]
                if nxt.op_type == "MatMul":
                    other = nxt.inputs[0] if nxt.inputs[1] == tensor_name else nxt.inputs[1]
                    if _is_picked_expert(graph, other, weight_of):
                        return True
                    continue
                if nxt.op_type in _VIEWS_PASS or nxt.op_type in _ELEMENTWISE or nxt.op_type in (
                        "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Split", "Slice", "Transpose"):
                    following.extend(o for o in nxt.outputs if o and o not in seen)
                    seen.update(nxt.outputs)
        frontier = following
    return False


def _row_or_gathered(op, x_name, w_name, in_size, red_axis, in_axis, t, sp, state, to_replicated, split_weight, label):
    """A weight product whose input is split on its reduction axis runs row-parallel (the weight
    split on its input axis, a partial sum out: Megatron-LM's RowParallelLinear); an input split
    any other way is gathered first, as a column-parallel op reads it whole.  Returns the
    row-parallel state, else None (the caller goes on to the column-parallel rule)."""
    xs = state(x_name)
    if xs.kind == "S" and xs.axis == red_axis and in_size % t == 0:
        split_weight(w_name, in_axis, op)
        return _State(P), label, t
    if xs.kind == "S":
        to_replicated(op, x_name, "sequence-parallel input of a column-parallel op" if sp else "split input of a column-parallel op",
                      column=True)
    return None


def _stacked_expert_matmul(op, graph, t, sp, state, to_replicated, column_input_grad, split_weight, weight_of, replicated, picked):
    """Expert tensor parallelism for a product with matrices picked from a stacked weight
    (Megatron-Core's ``expert_tensor_parallel_size``, equal to t by default): an expert's up/gate
    projection is column-parallel over its output features, its down projection row-parallel
    over its input features, so its output is a partial sum reduced once after the combine."""
    slot = 0 if op.inputs[0] in picked else 1
    w_name, x_name = op.inputs[slot], op.inputs[1 - slot]
    w, x, y = graph.tensor(w_name), graph.tensor(x_name), graph.tensor(op.outputs[0])
    if w is None or x is None or y is None or min(w.rank, x.rank, y.rank) < 2:
        to_replicated(op, x_name, "expert product of unknown shape")
        return _State(R), "replicated (stacked expert weights)", 1
    if slot == 0:  # W[.., n, k] @ x[.., k, m]
        out_w, in_w, x_red, y_axis = w.rank - 2, w.rank - 1, x.rank - 2, y.rank - 2
    else:  # x[.., m, k] @ W[.., k, n]
        out_w, in_w, x_red, y_axis = w.rank - 1, w.rank - 2, x.rank - 1, y.rank - 1
    row = _row_or_gathered(op, x_name, w_name, w.shape[in_w], x_red, in_w, t, sp, state, to_replicated, split_weight,
                           "row-parallel (experts)")
    if row is not None:
        return row
    if op.index in replicated or w.shape[out_w] % t or not _feeds_expert_product(graph, op.outputs[0], weight_of):
        return _State(R), "replicated (stacked expert weights)", 1
    split_weight(w_name, out_w, op)
    column_input_grad(op, x_name)
    return _State("S", y_axis, op.index), "column-parallel (experts)", t


#: Ops linear in one operand, through which partial sums may pass on the way to a sum.
_LINEAR_VIEWS = frozenset({"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Transpose", "Identity", "Cast", "ReduceSum"})


def _linear_in(graph: OpGraph, op: Op, name: str, state) -> bool:
    """Whether ``op`` is linear in ``name`` (a partial sum), every other activation operand
    replicated: a view, a sum over axes, or a scaling (``Mul``, ``Div`` by it)."""
    if op.op_type in _LINEAR_VIEWS:
        return bool(op.inputs) and op.inputs[0] == name
    if op.op_type in ("Mul", "Div") and len(op.inputs) == 2 and name in op.inputs:
        other = op.inputs[1] if op.inputs[0] == name else op.inputs[0]
        return (op.op_type == "Mul" or op.inputs[0] == name) and other != name and state(other).kind == R
    return False


def _sum_ahead(graph: OpGraph, op: Op, name: str, depth: int = 8) -> bool:
    """Whether ``op`` (linear in the partial sums ``name``), and the single consumers after it
    that are linear too, reach a ``ReduceSum`` that makes them smaller: reducing after it sends
    fewer bytes (Megatron-Core reduces the experts' outputs after the combine over top-k)."""
    current = op
    for _ in range(depth):
        if current.op_type not in _LINEAR_VIEWS and current.op_type not in ("Mul", "Div"):
            return False
        if current.op_type == "ReduceSum":
            x, y = graph.tensor(current.inputs[0]), graph.tensor(current.outputs[0])
            return x is not None and y is not None and y.numel < x.numel
        if current.op_type == "Div" and current.inputs[0] != name:
            return False
        name = current.outputs[0]
        consumers = graph.consumers(name) if name else ()
        if len(consumers) != 1 or name in graph.outputs:
            return False
        current = graph.ops[consumers[0]]
    return False


def _weight_operand(op: Op, weight_of) -> int | None:
    slots = {"MatMul": (1, 0), "Gemm": (1, 0), "Conv": (1,), "ConvTranspose": (1,)}[op.op_type]
    for slot in slots:
        if slot < len(op.inputs) and op.inputs[slot] and weight_of(op.inputs[slot]) is not None:
            return slot
    return None


def _linear(op, graph, t, sp, state, to_replicated, column_input_grad, split_weight, weight_of, replicated, warnings, vocab_rows):
    """Column- or row-parallel MatMul/Gemm/Conv with a weight operand."""
    slot = _weight_operand(op, weight_of)
    w_name = op.inputs[slot]
    x_name = op.inputs[1 - slot] if op.op_type in ("MatMul", "Gemm") else op.inputs[0]
    w = graph.tensor(w_name)
    x = graph.tensor(x_name)
    if x is None or w is None:
        return _State(R), "replicated", 1
    conv = op.op_type in ("Conv", "ConvTranspose")
    if conv:
        out_axis_w, in_axis_w, x_red_axis, y_axis = (0, 1, 1, 1) if op.op_type == "Conv" else (1, 0, 1, 1)
        n_out = w.shape[out_axis_w] * (int(op.attr("group", 1)) if op.op_type == "ConvTranspose" else 1)
        if int(op.attr("group", 1)) != 1:
            to_replicated(op, x_name, "grouped convolution is not tensor-parallel")
            return _State(R), "replicated (grouped conv)", 1
    elif op.op_type == "Gemm":
        trans_b = int(op.attr("transB", 0))
        trans_a = int(op.attr("transA", 0))
        if slot == 0:  # weight as A: treat as replicated (rare)
            to_replicated(op, x_name, "Gemm with weight as A")
            return _State(R), "replicated", 1
        out_axis_w, in_axis_w = (0, 1) if trans_b else (1, 0)
        x_red_axis = 0 if trans_a else 1
        y_axis = 1
        n_out = w.shape[out_axis_w]
    else:
        if slot == 0:  # W @ x: rare in exports; replicate
            to_replicated(op, x_name, "MatMul with a weight on the left")
            return _State(R), "replicated", 1
        if w.rank != 2:
            to_replicated(op, x_name, "batched weight MatMul")
            return _State(R), "replicated (batched weight)", 1
        out_axis_w, in_axis_w = 1, 0
        x_red_axis = x.rank - 1
        y_axis = max(x.rank, 2) - 1
        n_out = w.shape[1]
    row = _row_or_gathered(op, x_name, w_name, w.shape[in_axis_w], x_red_axis, in_axis_w, t, sp, state, to_replicated, split_weight,
                           "row-parallel")
    if row is not None:
        return row
    if op.index in replicated:
        warnings.append(replicated[op.index])
        gqa = "grouped-query" in replicated[op.index]
        return _State(R), "replicated (KV heads not divisible by t)" if gqa else "replicated (split cannot pass a Reshape)", 1
    whole = _kept_whole(op, graph, t, n_out, w.shape[in_axis_w], conv, vocab_rows, x_name, to_replicated, weight_of, warnings)
    if whole is not None:
        return whole
    if n_out % t and not (vocab_rows and n_out == vocab_rows):
        raise ConfigError(
            f"--t {t} does not divide the output size {n_out} of {op.op_type} {op.name!r} "
            f"(weight {w_name!r} of shape {list(w.shape)}); choose t dividing {n_out}"
        )
    split_weight(w_name, out_axis_w, op)
    if op.op_type == "Gemm" and len(op.inputs) > 2 and op.inputs[2] and weight_of(op.inputs[2]) is not None:
        b = graph.tensor(op.inputs[2])
        if b is not None and b.rank >= 1 and b.shape[-1] == n_out:
            split_weight(op.inputs[2], b.rank - 1, op)
    column_input_grad(op, x_name)
    return _State("S", y_axis, op.index), "column-parallel", t


def _kept_whole(op, graph, t, n_out, n_in, conv, vocab_rows, x_name, to_replicated, weight_of, warnings):
    """The (state, rule, factor) of a weight GEMM kept whole on every tensor rank where Megatron
    keeps it so (an output head, a low-rank bottleneck, a block's input projection, a one-output
    gate), None for one to split."""
    if n_out % t and not (vocab_rows and n_out == vocab_rows) and _is_output_head(graph, op):
        # a classification or regression head (10 classes at t=4): Megatron-LM's heads are plain
        # replicated linears (``get_linear_layer``), so it stays whole on every rank
        warnings.append(f"{op.op_type} {op.name!r} replicated: t={t} does not divide its {n_out} outputs, and it is "
                        "the model's output head (kept whole on every tensor rank, as Megatron-LM keeps its heads)")
        return _State(R), "replicated (output head)", 1
    if not conv and n_out * 2 <= n_in and _low_rank_bottleneck(graph, op, weight_of):
        # multi-head latent attention's down-projections (DeepSeek-V2/V3 q_a_proj, kv_a_proj_with_mqa):
        # a norm over all their outputs comes before the up-projection, so a column split would be
        # gathered at once and would make the up-projections row-parallel; Megatron-Core keeps them
        # whole ("duplicated") and splits the up-projections by heads
        return _State(R), "replicated (low-rank bottleneck)", 1
    if not conv and _feeds_block(graph, op.outputs[0], weight_of):
        # a projection whose output is the input of a block (ELECTRA's and ALBERT's embedding
        # projection): read whole by the block's Q/K/V projections and its residual, so splitting
        # its columns would turn those into row-parallel GEMMs and gather the residual
        warnings.append(f"{op.op_type} {op.name!r} replicated: its output feeds several projections and a "
                        "residual as a block's input, so it is kept whole on every tensor rank (a column split "
                        "would make the block's own projections row-parallel)")
        return _State(R), "replicated (block input)", 1
    if n_out == 1 and not conv:
        # a per-token scalar gate (Qwen2-MoE's shared_expert_gate, nn.Linear(hidden, 1) under a
        # sigmoid that scales the shared expert): Megatron-Core's SharedExpertMLP keeps its
        # gate_weight [1, hidden] whole on every tensor rank and applies it to the full hidden states
        to_replicated(op, x_name, "a one-output gate kept whole on every tensor rank")
        warnings.append(f"{op.op_type} {op.name!r} replicated: its one output (a per-token gate) cannot be split over "
                        f"t={t} ranks, so it is kept whole on every tensor rank, as Megatron-Core keeps a shared expert's gate")
        return _State(R), "replicated (one-output gate)", 1
    return None


#: Ops between a head's projection and the graph output that keep it the output (bias, a
#: squeeze or reshape, an activation, a softmax or cast of the logits).
_HEAD_TAIL_OPS = _VIEWS_PASS | _ELEMENTWISE | frozenset({"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Softmax", "LogSoftmax"})


def _is_output_head(graph: OpGraph, op: Op, depth: int = 6) -> bool:
    """Whether every path from ``op``'s output reaches a graph output through a few point-wise or
    view ops only (a classifier or regression head, not a hidden projection)."""
    outputs = set(graph.outputs)
    frontier, seen = [op.outputs[0]], set()
    for _ in range(depth):
        following = []
        for name in frontier:
            if name in seen:
                continue
            seen.add(name)
            if name in outputs:
                continue
            consumers = graph.consumers(name)
            if not consumers:
                return False
            for at in consumers:
                nxt = graph.ops[at]
                if nxt.op_type not in _HEAD_TAIL_OPS:
                    return False
                following.extend(o for o in nxt.outputs if o)
        if not following:
            return True
        frontier = following
    return False


def _batched_matmul(op, graph, t, state, to_replicated):
    a_name, b_name = op.inputs[0], op.inputs[1]
    a, b, y = graph.tensor(a_name), graph.tensor(b_name), graph.tensor(op.outputs[0])
    if a is None or b is None or y is None:
        return _State(R), "replicated", 1
    sa, sb = state(a_name), state(b_name)
    r = y.rank

    def out_axis(tensor: Tensor, axis: int) -> int:
        return axis + (r - tensor.rank)

    a_batch = sa.kind == "S" and sa.axis < a.rank - 2
    b_batch = sb.kind == "S" and sb.axis < b.rank - 2
    if a_batch or b_batch:
        axes = {(out_axis(a, sa.axis), sa.outer)} if a_batch else set()
        if b_batch:
            axes.add((out_axis(b, sb.axis), sb.outer))
        if len(axes) == 1:
            ax, _ = next(iter(axes))
            for name, s, tensor in ((a_name, sa, a), (b_name, sb, b)):
                if s.kind == "S" and out_axis(tensor, s.axis) != ax:
                    to_replicated(op, name, "operand split on another axis")
            return (sa if a_batch else sb).moved(ax), "head-parallel", t
    if sa.kind == "S" and sa.axis == a.rank - 1 and sb.kind == "S" and sb.axis == b.rank - 2:
        return _State(P), "row-parallel (activations)", t
    if sa.kind == "S" and sa.axis == a.rank - 2 and sb.kind == R:
        return sa.moved(r - 2), "row-split", t
    if sb.kind == "S" and sb.axis == b.rank - 1 and sa.kind == R:
        return sb.moved(r - 1), "column-split", t
    for name in (a_name, b_name):
        if state(name).kind == "S":
            to_replicated(op, name, "MatMul operands split incompatibly")
    return _State(R), "replicated", 1


def _elementwise(op, graph, act_ins, state, to_replicated, split_weight, weight_of, t):
    y = graph.tensor(op.outputs[0]) if op.outputs and op.outputs[0] else None
    if y is None:
        return _State(R), "replicated", 1
    r = y.rank
    axes: dict[tuple[int, int], _State] = {}  # (output axis, outer) -> split
    for name in act_ins:
        s = state(name)
        tensor = graph.tensor(name)
        if s.kind == "S" and tensor is not None:
            axes.setdefault((s.axis + (r - tensor.rank), s.outer), s)
    if not axes:
        return _State(R), "replicated", 1
    if len(axes) > 1:
        keep = min(axes)
        for name in act_ins:
            s = state(name)
            tensor = graph.tensor(name)
            if s.kind == "S" and (s.axis + (r - tensor.rank), s.outer) != keep:
                to_replicated(op, name, "operands split on different axes")
        axes = {keep: axes[keep]}
    (ax, _), split = next(iter(axes.items()))
    # Weights (bias, norm scale) aligned with the split axis are split with it.
    for name in op.inputs:
        if name and weight_of(name) is not None:
            w = graph.tensor(name)
            w_axis = ax - (r - w.rank)
            if 0 <= w_axis < w.rank and w.shape[w_axis] == y.shape[ax]:
                split_weight(name, w_axis, op)
    return split.moved(ax), "split (elementwise)", t


def _norm_axes(op: Op, rank: int) -> set[int] | None:
    """Axes an op reduces over; None means all of them."""
    kind = op.op_type
    if kind in ("Softmax", "LogSoftmax", "CumSum", "TopK", "ArgMax", "ArgMin"):
        axis = int(op.attr("axis", -1))
        return {axis % rank}
    if kind in ("LayerNormalization", "RMSNormalization", "SimplifiedLayerNormalization"):
        axis = int(op.attr("axis", -1)) % rank
        return set(range(axis, rank))
    if kind in ("InstanceNormalization", "GroupNormalization"):
        return set(range(1, rank)) if kind == "GroupNormalization" else set(range(2, rank))
    axes = op.attr("axes")
    if axes is None:
        return None
    return {int(a) % rank for a in axes}


def _reduction(op, graph, t, state, to_replicated):
    x_name = op.inputs[0]
    x = graph.tensor(x_name)
    s = state(x_name)
    if x is None or s.kind != "S":
        return _State(R), "replicated", 1
    axes = _norm_axes(op, x.rank)
    if op.op_type.startswith("Reduce") and len(op.inputs) > 1 and op.inputs[1]:
        # axes given as an input tensor (opset 18, as the dynamo exporter writes them): with
        # keepdims the reduced axes are those that shrank to 1 (an axis already of size 1 is
        # the same either way); otherwise be conservative.
        y = graph.tensor(op.outputs[0]) if op.outputs and op.outputs[0] else None
        keep = int(op.attr("keepdims", 1))
        axes = ({i for i in range(x.rank) if y.shape[i] != x.shape[i]}
                if keep and y is not None and y.rank == x.rank else None)
    if axes is None or s.axis in axes:
        to_replicated(op, x_name, f"{op.op_type} over the split axis")
        return _State(R), "replicated", 1
    keepdims = int(op.attr("keepdims", 1))
    axis = s.axis
    if op.op_type.startswith("Reduce") and not keepdims:
        axis -= sum(1 for a in axes if a < s.axis)
    return s.moved(axis), "split (reduction on other axes)", t


def _reshape_axis(src: tuple[int, ...], dst: tuple[int, ...], axis: int, t: int, outer: int = 1) -> tuple[int, int] | None:
    """Where a split ``[outer, t, rest]`` of ``src[axis]`` lands after a reshape to ``dst``:
    ``(dst axis, its outer)``, or None if no dst axis holds it.

    Row-major reshapes group dims into blocks of equal product.  Inside its block the split
    factor ``t`` sits below ``o = prod(src[block start:axis]) * outer`` more significant
    coordinates; it lands on the dst dim ``k`` of the block with ``q = prod(dst[block
    start:k])`` dividing ``o`` and ``(o / q) * t`` dividing ``dst[k]`` (then every rank's
    elements are exactly ``[o/q, 1 of t, rest]`` of ``dst[k]``; at most one ``k`` qualifies).
    So heads split ``[b, n, s, d]`` stay split when merged into ``[b*n, s, d]`` (outer ``b``)
    for any batch ``b``, and return to ``n`` when unmerged.
    """
    i = j = 0
    while i < len(src) and j < len(dst):
        i0, j0 = i, j
        pi, pj = src[i], dst[j]
        i += 1
        j += 1
        while pi != pj:
            if pi < pj:
                if i >= len(src):
                    return None
                pi *= src[i]
                i += 1
            else:
                if j >= len(dst):
                    return None
                pj *= dst[j]
                j += 1
        if i0 <= axis < i:
            o = outer
            for dim in src[i0:axis]:
                o *= dim
            q = 1
            for k in range(j0, j):
                if o % q == 0 and dst[k] % ((o // q) * t) == 0:
                    return k, o // q
                q *= dst[k]
                if q > o:
                    return None
            return None
    return None


def _movement(op, graph, t, state, to_replicated, head_reshapes: Mapping[int, int] = MappingProxyType({})):
    """Data movement on a split tensor: where the split axis goes (views, transposes, broadcasts,
    slices, gathers), or a gather before the op when it cannot keep the split."""
    x_name = op.inputs[0]
    x = graph.tensor(x_name)
    y = graph.tensor(op.outputs[0]) if op.outputs and op.outputs[0] else None
    s = state(x_name)
    kind = op.op_type
    if kind == "Concat":
        return _concat(op, t, state, to_replicated)
    if x is None or y is None or s.kind != "S":
        return _State(R), "replicated", 1
    ax = s.axis
    if kind in ("Reshape", "Flatten"):
        return _reshape(op, x, y, s, t, to_replicated, head_reshapes)
    if kind in ("Squeeze", "Unsqueeze"):
        return _squeeze(op, x, y, s, t)
    if kind == "Transpose":
        perm = list(op.attr("perm") or reversed(range(x.rank)))
        return s.moved(perm.index(ax)), "split (transpose)", t
    if kind == "Tile":
        # repeating the split axis k times gives k blocks, each split as before (DeBERTa repeats
        # its head-split relative-position keys b times to match queries merged as [b*n, ..])
        new_ax = ax + (y.rank - x.rank)
        k = y.shape[new_ax] // x.shape[ax] if x.shape[ax] else 1
        return _State("S", new_ax, s.origin, s.outer * max(k, 1)), "split (broadcast)", t
    if kind in ("Expand", "Pad"):
        return s.moved(ax + (y.rank - x.rank)), "split (broadcast)", t
    if kind in ("Split", "Slice"):
        # Megatron lays fused QKV out so each rank's columns hold its own q, k and v heads:
        # splitting or slicing along the split axis keeps each output split.
        return s.moved(ax), "split (slice)", t
    if kind in ("Gather", "GatherND"):
        return _gather_split(op, graph, x, s, t, to_replicated)
    to_replicated(op, x_name, f"{kind} on a split tensor")
    return _State(R), "replicated", 1


def _concat(op, t, state, to_replicated):
    """Concat keeps a split all its inputs share (same axis and outer); else it gathers the split ones."""
    split = [state(n) for n in op.inputs if n]
    if all(st.kind == "S" for st in split) and len({(st.axis, st.outer) for st in split}) == 1:
        return split[0].moved(split[0].axis), "split (concat)", t
    for n in op.inputs:
        if n and state(n).kind == "S":
            to_replicated(op, n, "Concat of mixed splits")
    return _State(R), "replicated", 1


def _reshape(op, x, y, s, t, to_replicated, head_reshapes):
    """Reshape/Flatten of a split tensor: the split follows the view (heads split or merged), else
    the split's origin conflicts (a Reshape) or the input is gathered."""
    ax, kind = s.axis, op.op_type
    if op.index in head_reshapes and ax == x.rank - 1:
        # [.., n*d] -> [.., n, d] or a fused view ([.., 3, n, d], [.., n, 3, d], [.., n + 2, d]):
        # whole heads per rank.  A head is indivisible, so t must divide the heads this view
        # carries (the KV heads where it carries K or V: a fused multi-query view holds one K
        # and one V head, which no t > 1 splits), else the projection is replicated.  The
        # split goes where the export's own column order puts whole heads per rank (GPT-2's
        # [.., n, d], BLOOM's [.., n, 3, d], GPT-NeoX's [.., n, 3d], Falcon's grouped
        # [.., kv, n/kv + 2, d]); where it does not (timm's [.., 3, n, d]), Megatron-LM's own
        # order (fused QKV columns by KV group) is assumed, on the head axis.
        if head_reshapes[op.index] % t:
            new = None
        else:
            new = _reshape_axis(x.shape, y.shape, ax, t, s.outer)
            if new is None and y.rank >= 2 and y.shape[-2] % t == 0:
                new = (y.rank - 2, 1)
    else:
        new = _reshape_axis(x.shape, y.shape, ax, t, s.outer)
    if new is None:
        if kind == "Reshape" and s.origin is not None:
            raise _Conflict(s.origin, op.index)
        to_replicated(op, op.inputs[0], f"{kind} cannot keep the split")
        return _State(R), "replicated", 1
    return _State("S", new[0], s.origin, new[1]), "split (view)", t


def _squeeze(op, x, y, s, t):
    """Squeeze/Unsqueeze: the split axis shifts by the axes removed or inserted before it."""
    ax, kind = s.axis, op.op_type
    axes = op.attr("axes")
    if axes is None and len(op.inputs) > 1:
        # axes given as input (opset 13+): infer from shapes
        return s.moved(_match_axis(x.shape, y.shape, ax)), "split (view)", t
    axes = sorted(int(a) % (y.rank if kind == "Unsqueeze" else x.rank) for a in (axes or ()))
    if kind == "Squeeze":
        return s.moved(ax - sum(1 for a in axes if a < ax)), "split (view)", t
    new = ax
    for a in axes:
        if a <= new:
            new += 1
    return s.moved(new), "split (view)", t


def _gather_split(op, graph, x, s, t, to_replicated):
    """Gather/GatherND of a split tensor: the split moves with the axes the gather keeps; a gather
    along the split axis gathers the tensor first."""
    x_name, ax = op.inputs[0], s.axis
    if op.op_type == "Gather":
        gaxis = int(op.attr("axis", 0)) % x.rank
        if gaxis == ax:
            to_replicated(op, x_name, "Gather along the split axis")
            return _State(R), "replicated", 1
        idx = graph.tensor(op.inputs[1])
        idx_rank = idx.rank if idx is not None else 0
        new = ax if ax < gaxis else ax + idx_rank - 1
        return s.moved(new), "split (gather)", t
    # indices [.., k] pick along data's k axes after batch_dims b; the output is
    # data[:b] + indices[b:-1] + data[b + k:] (ONNX GatherND): a split on a batch axis or
    # on an axis after the picked ones moves with it (Falcon's dynamo export picks K and V
    # out of a fused view this way)
    idx = graph.tensor(op.inputs[1])
    b = int(op.attr("batch_dims", 0))
    if idx is not None and idx.rank >= 1:
        k = idx.shape[-1]
        if ax < b:
            return s.moved(ax), "split (gather)", t
        if ax >= b + k:
            return s.moved(idx.rank - 1 + ax - b - k), "split (gather)", t
    to_replicated(op, x_name, "GatherND along the split axis")
    return _State(R), "replicated", 1


def _gather_elements(op, graph, t, state, to_replicated):
    """``GatherElements(data, indices, axis)``: ``out[.., i, ..] = data[.., indices[.., i, ..], ..]``
    along ``axis``, ``out`` shaped like ``indices``.  A split of ``data`` on another axis stays:
    each rank gathers its own rows with its slice of the indices (DeBERTa's relative-position
    scores, split by heads, gathered along the key axis with position-derived indices every rank
    computes whole).  A split on the gathered axis, or indices split differently, is gathered."""
    data, idx = op.inputs[0], op.inputs[1]
    x = graph.tensor(data)
    sd, si = state(data), state(idx)
    if x is None or sd.kind != "S":
        if si.kind == "S":
            to_replicated(op, idx, "GatherElements indices split")
        return _State(R), "replicated", 1
    gaxis = int(op.attr("axis", 0)) % x.rank
    if sd.axis == gaxis or (si.kind == "S" and (si.axis, si.outer) != (sd.axis, sd.outer)) or si.kind == P:
        to_replicated(op, data, "GatherElements along the split axis")
        if si.kind == "S":
            to_replicated(op, idx, "GatherElements indices split")
        return _State(R), "replicated", 1
    return sd.moved(sd.axis), "split (gather)", t


def _scatter_nd(op, graph, t, state, to_replicated):
    """``ScatterND(data, indices, updates)``: ``indices [.., k]`` address data's first ``k`` axes and
    ``updates`` is ``indices.shape[:-1] + data.shape[k:]`` (ONNX ScatterND).  A split of data or
    updates on an axis the indices do not address stays: each rank writes its own slice (the
    dynamo export of a slice assignment ``key[..., :d] = k_pass`` with the heads split, DeepSeek's
    multi-latent attention keys).  Where the indices address every axis element by element
    (``indices.shape[:-1] == updates.shape``, as the legacy exporter writes a slice assignment),
    a split axis that updates spans whole (the same extent as data's) also stays: the assignment
    does not move data along it.  Replicated operands (and the indices every rank computes whole)
    are read in the rank's slice; anything else is gathered."""
    data, idx_name, upd = op.inputs[0], op.inputs[1], op.inputs[2]
    x, idx, u = graph.tensor(data), graph.tensor(idx_name), graph.tensor(upd)
    sd, su, si = state(data), state(upd), state(idx_name)

    def gathered():
        for name in (data, idx_name, upd):
            if state(name).kind == "S":
                to_replicated(op, name, "ScatterND along the split axis")
        return _State(R), "replicated", 1

    if sd.kind != "S" and su.kind != "S":
        return gathered()
    if x is None or idx is None or u is None or idx.rank < 1 or si.kind != R or sd.kind == P or su.kind == P:
        return gathered()
    k = idx.shape[-1]
    if k == x.rank and idx.shape[:-1] == u.shape and u.rank == x.rank:
        u_axis = lambda a: a  # noqa: E731 - element-wise indices: updates laid out as data
        spans = lambda a: u.shape[a] == x.shape[a]  # noqa: E731
    else:
        u_axis = lambda a: idx.rank - 1 + a - k  # noqa: E731
        spans = lambda a: a >= k  # noqa: E731
    axes = set()
    if sd.kind == "S":
        axes.add((sd.axis, sd.outer))
    if su.kind == "S":
        a = next((a for a in range(x.rank) if u_axis(a) == su.axis), None)
        if a is None:
            return gathered()
        axes.add((a, su.outer))
    if len(axes) != 1:
        return gathered()
    ax, outer = next(iter(axes))
    if not spans(ax) or not 0 <= u_axis(ax) < u.rank or u.shape[u_axis(ax)] % t or x.shape[ax] % t:
        return gathered()
    return _State("S", ax, (sd if sd.kind == "S" else su).origin, outer), "split (scatter)", t


def _match_axis(src: tuple[int, ...], dst: tuple[int, ...], axis: int) -> int:
    """The dst axis of ``src[axis]`` when only size-1 dims were added or removed."""
    non1_src = [i for i, d in enumerate(src) if d != 1]
    non1_dst = [i for i, d in enumerate(dst) if d != 1]
    if axis in non1_src and len(non1_src) == len(non1_dst):
        return non1_dst[non1_src.index(axis)]
    return min(axis, len(dst) - 1)
