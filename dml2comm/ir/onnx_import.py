"""ONNX file -> :class:`~dml2comm.ir.graph.OpGraph`.  The only module that reads ONNX protobufs.

What it does, in order:

1. Loads the model *without* external data (weights are never read: shapes and dtypes are
   enough), so exports whose weight files are absent work, and so do models over 2 GB.
2. Inlines model-local functions (``onnx.inliner``), each inlined node keeping the module scope
   of its call and the chain of calls it came from (:func:`_inline_functions`, ``Op.calls``).
3. Binds symbolic input dims: ``dims`` by name first, then the batch axis (axis 0 of every
   input) from ``batch_size`` and the sequence axis (axis 1 of token inputs) from ``seq_len``.
4. Runs ONNX shape inference with data propagation (so ``Shape -> Gather -> Concat -> Reshape``
   chains of dynamic exports resolve).  Small protos are inferred in memory; a file over 2 GB
   goes through :func:`onnx.shape_inference.infer_shapes_path`.
5. Converts every node into a frozen :class:`Op` with its scope (module path) from the dynamo
   exporter's ``pkg.torch.onnx.name_scopes`` metadata or from legacy scoped node names
   (``/transformer/h.5/attn/c_attn/Gemm``), and every value into a :class:`Tensor`.  A float
   initializer is a weight when a parametric op reads it, directly or through views (the dynamo
   exporter's ``GatherND`` of stacked expert weights, ``Reshape``/``Slice``/``Split`` chains);
   large float ``Constant`` nodes (Paddle-style exports) too, but never those folding made.
   What is computed from parameters alone is a weight too (:func:`_parameter_derived`): the
   legacy exporter's de-duplicated ``Identity`` copies become the parameters torch has, and
   views, casts and transposes of parameters are weights derived from them (``tied_to``),
   placed in their consumer's layer.

Every failure raises a :class:`~dml2comm.errors.Dml2CommError` with a one-line message.

The readers here (:func:`read_model`, :func:`read_model_proto`) take the op rules' forward cost
(:class:`OpForwardCost`), with which an ``If`` whose condition is known only at run time keeps its
heavier branch (:func:`_expand_if`): the rules sit above this layer, so the caller passes them in.
Everything else loads models through :func:`dml2comm.load.load_model`, which passes them.
"""

from __future__ import annotations

import ast
import functools
import json
import os
import re
import tempfile
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping, Protocol, Sequence

import onnx
from onnx import TensorProto

from dml2comm.errors import ConfigError, Dml2CommError, InputFileError, ModelError, UnboundDimError
from dml2comm.ir.graph import GROUPED_MM, Call, DType, Op, OpGraph, Tensor, vocab_table

__all__ = ["ImportOptions", "ImportResult", "OpForwardCost", "SequenceInfo", "read_model", "read_model_proto", "check_seq_len", "tied_copies",
           "CONTROL_FLOW_OPS"]

#: Protobuf refuses messages over 2 GiB; such models are inferred from their path instead.
PROTO_LIMIT_BYTES = 2**31

#: Constant nodes with at least this many float elements are treated as weights (Paddle-style
#: exports keep parameters in Constant nodes rather than initializers).
CONSTANT_WEIGHT_MIN_ELEMENTS = 4096

CONTROL_FLOW_OPS = frozenset({"If", "Loop", "Scan", "SequenceMap"})

# Initializers that are buffers, not trainable parameters (PyTorch ``register_buffer``):
# BatchNorm running statistics, rotary-embedding tables, position-id ranges, attention masks.
# Neither exporter records buffer vs parameter (no initializer doc string or metadata; torch
# 2.13), and a buffer that no gradient reaches is found from the graph (:func:`_gradient_reach`:
# DeepSeek-V3's ``e_score_correction_bias``), so a name here is the last resort, for buffers a
# gradient does reach: Gemma's ``embed_scale`` (sqrt(hidden), a rank-0 non-persistent buffer
# multiplying the embedding) reads exactly like a learned scalar (CLIP's ``logit_scale``).
_BUFFER_NAME = re.compile(
    r"(running_mean|running_var|num_batches_tracked|inv_freq|cos_cached|sin_cached|_cos_|_sin_|"
    r"position_ids|token_type_ids|masked_bias|causal_mask|(^|\.)attn\.bias|rotary|final_logits_bias|"
    r"(^|\.)embed_scale$)",
    re.IGNORECASE,
)

#: Ops whose float output has a zero gradient almost everywhere: no gradient flows back through them.
_ZERO_GRADIENT = frozenset({"Floor", "Ceil", "Round", "Sign"})

# Op types in which a float initializer input is a learned parameter.
_PARAMETRIC_CONSUMERS = frozenset(
    {
        "MatMul", "Gemm", "Conv", "ConvTranspose", "Gather", "Einsum", "Transpose",
        "LayerNormalization", "BatchNormalization", "InstanceNormalization", "GroupNormalization",
        "RMSNormalization", "SimplifiedLayerNormalization", "SkipLayerNormalization",
        "SkipSimplifiedLayerNormalization", "Add", "Mul", "Sub", "PRelu", "Cast",
        "Attention", "MultiHeadAttention", "Embedding", "EmbedLayerNormalization", "GatherND",
        "LSTM", "GRU", "RNN",
    }
)

#: Inputs of the recurrent ops that are parameters (ONNX LSTM/GRU/RNN: W, R, B and the LSTM's
#: peepholes P); their other float inputs are states (initial_h, initial_c: zeros when an
#: exporter folds them into an initializer), never parameters.
_RECURRENT_PARAMETER_INPUTS = {"LSTM": (1, 2, 3, 7), "GRU": (1, 2, 3), "RNN": (1, 2, 3)}

# Ops that pass a weight's values on unchanged (views and selections).  A float initializer that
# reaches a parametric consumer only through these is still a parameter: the dynamo exporter
# gathers stacked expert weights ([E, out, in]) with GatherND, and exporters reshape, slice,
# split or concatenate weights before their MatMul.
_WEIGHT_VIEWS = frozenset(
    {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Slice", "Split", "Expand", "Concat", "Tile"}
)

#: How many view ops a weight may pass through before its parametric consumer.
_WEIGHT_VIEW_DEPTH = 8

#: ``metadata_props`` key marking the ``Constant`` nodes that folding made: computed values,
#: never parameters.
_FOLDED_KEY = "dml2comm.folded"

_DTYPE_BY_ONNX = {
    TensorProto.FLOAT: DType.FLOAT,
    TensorProto.FLOAT16: DType.FLOAT16,
    TensorProto.BFLOAT16: DType.BFLOAT16,
    TensorProto.DOUBLE: DType.DOUBLE,
    TensorProto.INT8: DType.INT8,
    TensorProto.UINT8: DType.UINT8,
    TensorProto.INT16: DType.INT16,
    TensorProto.UINT16: DType.UINT16,
    TensorProto.INT32: DType.INT32,
    TensorProto.UINT32: DType.UINT32,
    TensorProto.INT64: DType.INT64,
    TensorProto.UINT64: DType.UINT64,
    TensorProto.BOOL: DType.BOOL,
    TensorProto.STRING: DType.STRING,
    TensorProto.COMPLEX64: DType.COMPLEX64,
    TensorProto.COMPLEX128: DType.COMPLEX128,
}
for _name in ("FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2", "FLOAT8E5M2FNUZ", "FLOAT8E8M0"):
    if hasattr(TensorProto, _name):
        _DTYPE_BY_ONNX[getattr(TensorProto, _name)] = DType.FLOAT8


#: Ops whose output size depends on tensor values, not on shapes (ONNX operator specs: NonZero's
#: output is [rank, number of non-zeros]; Unique, Compress and NonMaxSuppression likewise).
_DATA_DEPENDENT_SIZE = frozenset({"NonZero", "Unique", "Compress", "NonMaxSuppression"})


def _dtype(elem_type: int) -> DType:
    return _DTYPE_BY_ONNX.get(elem_type, DType.UNDEFINED)


@dataclass(frozen=True)
class ImportOptions:
    """How to bind symbolic dims and what to tolerate.

    ``batch_size`` binds axis 0 of every graph input (the micro-batch size); ``seq_len`` binds
    axis 1 of integer token inputs, of rank-3 inputs and of symbolic rank-2 float inputs (audio
    samples); ``dims`` binds by dim name
    (``{"sequence": 128}``) or, for a dim without a name, by input and axis (``{"image:2": 32}``,
    the command line's ``--dim image:2=32``) and wins over both; a ``dims`` key the model's
    inputs do not have is refused.  ``lenient`` is read by the analysis (ops without a cost rule are costed as
    memory-bound, with a warning); control flow needs no flag (:func:`_expand_control_flow`).
    """

    batch_size: int | None = None
    seq_len: int | None = None
    dims: Mapping[str, int] = field(default_factory=dict)
    lenient: bool = False
    tie_embeddings: bool = False


class OpForwardCost(Protocol):
    """Forward ``(FLOPs, bytes)`` of one op on its input and output tensors (None where a shape is
    unknown), under the same cost rules as the analysis (:func:`dml2comm.load.forward_cost`);
    it may raise when a rule needs a shape it was not given (the op then counts zero)."""

    def __call__(self, op: Op, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor | None]) -> tuple[float, float]: ...


@dataclass(frozen=True)
class SequenceInfo:
    """What the import learnt about the sequence axis, to check ``--seq-len`` (:func:`check_seq_len`).

    ``bound``: the value a symbolic sequence axis was bound to (by ``seq_len`` or ``dims``), or
    ``None`` when there is none.  ``fixed``: (input, length)
    of a static sequence axis (axis 1 of a rank-2 integer or of a rank-3 input).  ``positions``:
    (table, rows) of the learned position-embedding table, a ``Gather`` on a 2-D float table
    whose indices come from a ``Range`` (``torch.arange``) or a position-ids input or buffer.
    """

    bound: int | None = None
    fixed: tuple[str, int] | None = None
    positions: tuple[str, int] | None = None


@dataclass(frozen=True)
class ImportResult:
    graph: OpGraph
    bound_dims: Mapping[str, int]
    model_batch: int | None  # the batch size the model fixes itself (a static axis 0), or ``dims`` bound its symbolic one to
    warnings: tuple[str, ...]
    sequence: SequenceInfo = SequenceInfo()


# ----------------------------------------------------------------------------- loading

Dml2CommErrorTypes = (InputFileError, ModelError, UnboundDimError)


def read_model(path: str | os.PathLike[str], options: ImportOptions | None = None, *, op_cost: OpForwardCost) -> ImportResult:
    """Read ``path`` and return the shape-inferred op graph; ``op_cost`` costs the ops of an ``If``'s
    branches (:func:`_expand_if`).  Callers load through :func:`dml2comm.load.load_model`.

    Raises
    ------
    InputFileError
        The file is missing or unreadable.
    ModelError
        The file is not a (complete) ONNX model, or uses unsupported constructs.
    UnboundDimError
        A tensor still has an unknown dimension after binding and shape inference.
    """
    options = options or ImportOptions()
    p = Path(path)
    if not p.exists():
        raise InputFileError(f"model file not found: {str(p)!r}; check the path")
    if not p.is_file():
        raise InputFileError(f"model path is not a file: {str(p)!r}; pass the .onnx file itself")
    try:
        size = p.stat().st_size
        if size == 0:
            raise ModelError(f"{p.name!r} is empty; pass an ONNX model file (.onnx)")
        model = onnx.load(str(p), load_external_data=False)
    except Dml2CommErrorTypes:
        raise
    except OSError as exc:
        raise InputFileError(f"cannot read {str(p)!r}: {exc.strerror or exc}") from exc
    except Exception as exc:  # noqa: BLE001 - DecodeError, and the json/text_format ParseError that
        # onnx.load raises for a .json/.txt path (it picks the parser by extension), are no ValueError
        raise ModelError(
            f"{p.name!r} is not a readable ONNX model ({_first_line(exc)}); "
            "pass a complete .onnx export"
        ) from exc
    if not model.graph.node:
        raise ModelError(
            f"{p.name!r} has no graph nodes: it is empty, truncated or not an ONNX model; re-export it"
        )
    return read_model_proto(model, options, name=p.stem, path_for_large=p if size >= PROTO_LIMIT_BYTES else None, op_cost=op_cost)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else type(exc).__name__


def read_model_proto(
    model: onnx.ModelProto,
    options: ImportOptions | None = None,
    name: str | None = None,
    path_for_large: Path | None = None,
    *,
    op_cost: OpForwardCost,
) -> ImportResult:
    """Like :func:`read_model` for an in-memory proto (tests build these with onnx.helper); callers
    load through :func:`dml2comm.load.load_model_proto`."""
    options = options or ImportOptions()
    warnings: list[str] = []
    model = _copy_without_weight_data(model)
    _check_topological(model.graph)
    if model.functions:
        model, num_functions, num_calls = _inline_functions(model)
        _check_topological(model.graph)  # the functions' bodies, now in the graph
        warnings.append(
            f"inlined {num_functions} model-local function(s) ({num_calls} call(s)); "
            "each inlined op keeps its call's module scope"
        )
    routed = _group_routed_expert_products(model)
    if routed:
        warnings.append(f"experts: {routed} routed expert product(s) written as a per-token gather of the expert weights "
                        "(Hugging Face's batched_mm) costed as the grouped GEMM a training step runs (every token against "
                        "its top-k experts, the weights read once)")
    restored = _restore_folded_batchnorm(model)
    if restored:
        warnings.append(
            f"normalization: BatchNorm was folded into {restored} convolution(s) at export; restored as training "
            "BatchNormalization after each (a training step runs it: its kernels, parameters and saved activations count)")
    graph = model.graph
    initializer_names = {init.name for init in graph.initializer}
    binding = _bind_input_dims(graph, initializer_names, options)
    if binding.unbound:
        raise _unbound_inputs_error(binding.unbound)
    sequence = SequenceInfo(binding.seq_bound, binding.fixed_seq, _position_table(graph))
    if len(binding.seq_inputs) > 1:
        # an encoder-decoder's source and target lengths (BART, T5, Whisper's decoder) are
        # separate axes; --seq-len gives them one value
        warnings.append(f"--seq-len {options.seq_len} bound the sequence axes of {', '.join(map(repr, binding.seq_inputs))} "
                        f"alike; to give one its own length pass --dim {binding.seq_inputs[-1]}:1=N")
    _forget_inferred_shapes(graph)
    inferred = _infer(model, path_for_large)
    shapes = _shapes(inferred.graph)
    if _has_unknown_dims(inferred, shapes):
        inferred, folded = _fold_shape_computations(inferred, path_for_large)
        if folded:
            warnings.append(f"folded {folded} shape-computation node(s) into constants after binding the input dims")
            _check_table_lookups(inferred.graph, sequence.positions[0] if sequence.positions else None, binding.seq_bound)
        shapes = _shapes(inferred.graph)
    if any(n.op_type in CONTROL_FLOW_OPS and n.domain in _ONNX_DOMAINS for n in inferred.graph.node):
        inferred = _expand_control_flow(inferred, path_for_large, warnings, op_cost)
        shapes = _shapes(inferred.graph)
    op_graph, more_warnings = _convert(inferred, name or graph.name or "model", options, shapes)
    short = _short_logits(op_graph)
    if short is not None:
        widened = _logits_of_every_position(inferred, short, name or graph.name or "model", options, path_for_large)
        if widened is not None:
            op_graph, more_warnings = widened
        warnings.append(_short_logits_warning(short, widened is not None))
    warnings.extend(more_warnings)
    model_batch = binding.model_batch if binding.model_batch is not None else binding.dims_batch  # fixed: by the model or --dim
    return ImportResult(op_graph, MappingProxyType(binding.bound), model_batch, tuple(warnings), sequence)


# ----------------------------------------------------------------------------- short logits

#: Ops that keep some positions of a ``[.., positions, features]`` tensor: the generation-time
#: pick before an LM head (transformers' ``hidden_states[:, slice_indices, :]``, a ``Gather``
#: when the legacy exporter made ``logits_to_keep`` a tensor, a ``Slice`` for ``-k:``).
_POSITION_PICKS = frozenset({"Gather", "Slice"})
#: How many ops back from the logits the pick is looked for (a norm, a scale or a softcap may
#: follow the head's projection).
_PICK_SEARCH_OPS = 8


@dataclass(frozen=True)
class _ShortLogits:
    """An LM head whose output holds the logits of fewer positions than the model reads."""

    output: str  # the graph output (the logits)
    positions: int  # positions it holds (its elements / the vocabulary)
    tokens: int  # positions the token embedding looks up
    pick: Op | None  # the op keeping those positions, when found


def _short_logits(graph: OpGraph) -> _ShortLogits | None:
    """The LM head output that covers fewer positions than the model's tokens, if any.

    The logits are a float graph output that no op reads whose last dimension is the
    vocabulary (the rows of :func:`~dml2comm.ir.graph.vocab_table`); the tokens are the rows of
    the token embedding's lookup (the fewest where several read it: an encoder-decoder's
    shorter side).  A training step computes the logits of every position; an export for
    generation (transformers' ``logits_to_keep=1``, or its default 0 that the TorchScript
    exporter turns into a graph input) keeps one."""
    vocab = vocab_table(graph)
    if vocab is None:
        return None
    rows = graph.tensors[vocab].shape[0]
    lookups = [t for op in graph.ops if op.op_type == "Gather" and op.inputs[0] == vocab and int(op.attr("axis", 0)) == 0
               and (t := graph.tensor(op.outputs[0])) is not None and t.rank >= 2 and t.shape[-1]]
    if not lookups:
        return None
    tokens = min(t.numel // t.shape[-1] for t in lookups)
    for name in graph.outputs:
        t = graph.tensor(name)
        if (t is None or not t.dtype.is_float or not t.shape or t.shape[-1] != rows or graph.consumers(name)
                or graph.producer(name) is None):
            continue
        if t.numel // rows < tokens:
            return _ShortLogits(name, t.numel // rows, tokens, _position_pick(graph, name, tokens))
    return None


def _position_pick(graph: OpGraph, output: str, tokens: int) -> Op | None:
    """The op that keeps fewer than ``tokens`` positions on the way to ``output``: walking back
    along the largest activation input, the first op whose input holds ``tokens`` positions, when
    it is a :data:`_POSITION_PICKS` op that leaves the features (the last axis) whole."""
    name = output
    for _ in range(_PICK_SEARCH_OPS):
        index = graph.producer(name)
        if index is None:
            return None
        op = graph.ops[index]
        data = [n for n in op.inputs if (t := graph.tensor(n)) is not None and not t.is_weight and t.dtype.is_float and t.shape]
        if not data:
            return None
        name = max(data, key=lambda n: graph.tensors[n].numel)
        t = graph.tensors[name]
        if t.numel // max(t.shape[-1], 1) < tokens:
            continue
        out = graph.tensor(op.outputs[0]) if op.outputs else None
        if op.op_type in _POSITION_PICKS and op.inputs[0] == name and out is not None and out.shape[-1:] == t.shape[-1:]:
            return op
        return None
    return None


def _logits_of_every_position(model: onnx.ModelProto, short: _ShortLogits, name: str, options: ImportOptions,
                              path_for_large: Path | None) -> tuple[OpGraph, list[str]] | None:
    """The graph with ``short``'s position pick removed (its consumers read all positions) and
    the shapes after it inferred again, converted: the LM head as a training step runs it.  None
    when there is no pick, or the graph after it does not take every position."""
    pick = short.pick
    if pick is None or not pick.outputs:
        return None
    picked, data = pick.outputs[0], pick.inputs[0]
    wide = onnx.ModelProto()
    wide.CopyFrom(model)
    graph = wide.graph
    nodes = [n for n in graph.node if picked not in n.output]
    if len(nodes) != len(graph.node) - 1:
        return None
    after = {picked}  # values computed from the picked positions: their shapes change
    for node in nodes:
        if any(i in after for i in node.input):
            after.update(o for o in node.output if o)
        node.input[:] = [data if i == picked else i for i in node.input]
    # the pick's index (a graph input, constants, a small computation) is now read by nothing:
    # drop what only it read (ops the export left unread before stay as they were)
    outputs = {o.name for o in graph.output}
    read_before = {i for node in graph.node for i in node.input}
    while True:
        read = {i for node in nodes for i in node.input} | outputs
        unread = {id(n) for n in nodes if all(o not in read for o in n.output if o) and any(o in read_before for o in n.output)}
        if not unread:
            break
        nodes = [n for n in nodes if id(n) not in unread]
    del graph.node[:]
    graph.node.extend(nodes)
    inputs = [vi for vi in graph.input if vi.name in read or vi.name not in read_before]
    del graph.input[:]
    graph.input.extend(inputs)
    _forget_declared_shapes(graph, after)
    try:
        inferred = _infer(wide, path_for_large)
        converted = _convert(inferred, name, options, _shapes(inferred.graph))
    except ModelError:
        return None
    return None if _short_logits(converted[0]) is not None else converted


def _short_logits_warning(short: _ShortLogits, widened: bool) -> str:
    share = (f"1 in {short.tokens // short.positions}" if short.positions and short.tokens % short.positions == 0
             else f"{short.positions / short.tokens:.1%}")
    where = f"node {short.pick.name!r} ({short.pick.op_type}) keeps" if short.pick is not None else "the export keeps"
    cause = (f"the LM head's output {short.output!r} holds the logits of {short.positions} of the {short.tokens} "
             f"token positions the model reads ({share}): {where} only those, as an export for generation does "
             "(transformers' logits_to_keep, num_logits_to_keep before 4.50, whose default 0 the TorchScript exporter "
             "turns into a graph input that keeps one position)")
    fix = ("re-export it with torch.onnx.export(..., dynamo=True), or through a forward that takes the token inputs "
           "only and calls the model with logits_to_keep=0")
    if widened:
        return (f"{cause}; planned as a training step runs it, with the LM head and its loss over all {short.tokens} "
                f"positions; to make the file match, {fix}")
    return (f"{cause}; the LM head and its loss are costed for those {short.positions} positions only, not the "
            f"{short.tokens} a training step computes: {fix}")


# ----------------------------------------------------------------------------- node order


def _node_label(node: onnx.NodeProto, index: int) -> str:
    return f"{node.name!r} ({node.op_type})" if node.name else f"{node.op_type} #{index}"


def _outer_reads(graph: onnx.GraphProto, into: set[str]) -> None:
    """Add to ``into`` the names a control-flow body reads from its enclosing graphs."""
    local = {vi.name for vi in graph.input} | {init.name for init in graph.initializer}
    for node in graph.node:
        for name in node.input:
            if name and name not in local:
                into.add(name)
        for attr in node.attribute:
            for sub in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs):
                inner: set[str] = set()
                _outer_reads(sub, inner)
                into.update(inner - local)
        local.update(o for o in node.output if o)


def _forget_declared_shapes(graph: onnx.GraphProto, names) -> None:
    """Drop the declared shapes of ``names`` (their ``value_info`` entries and, for graph outputs,
    the output's shape) so that shape inference computes them afresh."""
    kept = [vi for vi in graph.value_info if vi.name not in names]
    del graph.value_info[:]
    graph.value_info.extend(kept)
    for out in graph.output:
        if out.name in names and out.type.HasField("tensor_type"):
            out.type.tensor_type.ClearField("shape")


def _check_topological(graph: onnx.GraphProto) -> None:
    """Refuse a graph whose nodes are not in topological order (ONNX IR spec, "Graphs": "each
    node ... must be topologically sorted"; ``onnx.checker`` rejects it): a node that reads its
    own output, a cycle of nodes, or an acyclic graph listed out of order.  The op list, the
    layer grouping and the schedule all read the node order as the execution order.

    One pass over the nodes (each node's inputs, and the names its control-flow bodies read from
    the graph, against the tensors earlier nodes produced; the few read ahead are then looked up
    in the finished producer table); only a graph that fails it is searched for a cycle
    (:func:`networkx.find_cycle`, linear too).

    Raises
    ------
    ModelError
        Naming the node that reads its own output, the nodes of a cycle, or the first node
        that reads a tensor before the node computing it.
    """
    available = {vi.name for vi in graph.input} | {init.name for init in graph.initializer}
    producer: dict[str, int] = {}  # each tensor's first producing node, filled as the pass goes
    nodes = graph.node
    ahead: list[tuple[int, str]] = []  # (consumer, tensor): a read of a tensor no earlier node produced
    body_reads: dict[int, list[str]] = {}  # a control-flow node's inputs and its bodies' outer reads
    graph_attrs = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
    for i, node in enumerate(nodes):
        reads: Any = node.input
        if node.attribute and any(attr.type in graph_attrs for attr in node.attribute):
            outer: set[str] = set()
            for attr in node.attribute:
                for sub in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs):
                    _outer_reads(sub, outer)
            reads = body_reads[i] = [*node.input, *sorted(outer)]
        for name in reads:
            if name and name not in producer and name not in available:
                ahead.append((i, name))
        for out in node.output:
            if out and out not in available and out not in producer:
                producer[out] = i
    late: list[tuple[int, int, str]] = []  # (producer, consumer, tensor) with producer >= consumer
    for i, name in ahead:  # in node order, as read: the first node reading its own output is named
        j = producer.get(name)
        if j is not None:  # else produced by no node: not an ordering question
            if j == i:
                raise ModelError(
                    f"node {_node_label(nodes[i], i)} reads its own output {name!r}: the graph has a cycle, and an ONNX "
                    "graph must be acyclic (onnx.checker rejects it); fix the export so no node feeds itself"
                )
            late.append((j, i, name))
    if not late:
        return
    import networkx as nx

    edges = nx.DiGraph()
    for i, node in enumerate(nodes):
        for name in body_reads.get(i, node.input):
            j = producer.get(name) if name else None
            if j is not None:
                edges.add_edge(j, i)
    try:
        cycle = [u for u, _ in nx.find_cycle(edges)]
        first = cycle.index(min(cycle))  # start from the node listed first
        cycle = cycle[first:] + cycle[:first]
    except nx.NetworkXNoCycle:
        j, i, name = late[0]
        raise ModelError(
            f"the graph's nodes are not in topological order: node {_node_label(nodes[i], i)} reads {name!r} before "
            f"node {_node_label(nodes[j], j)} computes it (ONNX requires topological order; onnx.checker rejects it); "
            "re-export the model, or sort its nodes (onnx-ir: m = ir.load(PATH); m.graph.sort(); ir.save(m, PATH))"
        ) from None
    shown = [_node_label(nodes[k], k) for k in cycle[:6]]
    more = f" ... ({len(cycle)} nodes)" if len(cycle) > 6 else ""
    raise ModelError(
        f"the graph has a cycle: nodes {' -> '.join(shown)}{more} -> {shown[0]} feed each other, and an ONNX graph "
        "must be acyclic (onnx.checker rejects it); fix the export so no node reads a value computed from its own output"
    ) from None


# ----------------------------------------------------------------------------- folded BatchNorm

#: The rewrite rule onnxscript's optimizer (the dynamo exporter's) records on a Conv it folded a
#: BatchNorm into (node ``metadata_props`` ``pkg.onnxscript.rewriter.rule_name``); it folds even
#: a model exported in training mode.
_FOLDED_BN_RULE = "FuseBatchNormIntoConv"
#: Names the TorchScript exporter gives constants it computed by folding (``onnx::Conv_193``): a
#: Conv whose weight and bias both carry one no longer holds the module's own parameters.
_FOLDED_CONSTANT = re.compile(r"^onnx::Conv_\d+$")
#: PyTorch's BatchNorm defaults (``torch.nn.BatchNorm2d``: eps 1e-5, momentum 0.1, i.e. ONNX's
#: momentum 0.9 on the running statistic).
_BN_EPSILON, _BN_MOMENTUM = 1e-5, 0.9


def _group_routed_expert_products(model: onnx.ModelProto) -> int:
    """Rewrite each routed expert product an export writes per token into one matrix product;
    returns how many.

    Hugging Face's MoE layers with ``experts_implementation="batched_mm"`` (the exportable one:
    ``grouped_mm``, the default on a GPU, and ``eager`` export in neither exporter; transformers
    ``integrations/moe.py``) gather every routed (token, expert) pair's expert matrix and multiply
    one vector by it: ``GatherND(W[E, N, K], expert[M, 1]) -> [M, N, K]``, ``MatMul`` with
    ``Unsqueeze(x[M, K], -1)``, ``Squeeze``.  Costed as written that is ``M`` matrix-vector
    products over ``M`` copies of the weights (the gathered ``[M, N, K]`` tensor: terabytes at a
    real model's size).  A training step runs it as a grouped GEMM (``torch._grouped_mm`` over
    the tokens sorted by expert: the measured Mixtral-style step of
    ``benchmarks/data/gpu_steps/h200_set6_*.json``): the same ``2 M N K`` FLOPs, each expert's
    weights read once.  So ``(W[0] @ x^T)^T`` stands for it (``Gather(W, 0)``, ``MatMul``, a
    ``Transpose`` either side): an ``[N, K] x [K, M]`` product of the routed rows with its weight
    gradient of the same size, the activation it saves ``x``, and the copies that permute the
    rows into expert order and back (grouped_mm's ``index_select`` and scatter); the expert
    weights keep their ``[E, N, K]`` parameters, and the tensor-parallel plan splits the picked
    matrix as the stacked weight's (expert tensor parallelism)."""
    graph = model.graph
    if not any(n.op_type == "GatherND" for n in graph.node):
        return 0
    producer = {o: n for n in graph.node for o in n.output}
    weights = {init.name: len(init.dims) for init in graph.initializer}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for n in graph.node:
        for i in n.input:
            if i:
                consumers.setdefault(i, []).append(n)
    readers = {name: len(nodes) for name, nodes in consumers.items()}
    replace_at: dict[int, list[onnx.NodeProto]] = {}
    drop: set[int] = set()
    for node in graph.node:
        if node.op_type != "MatMul" or node.domain not in _ONNX_DOMAINS or len(node.input) != 2:
            continue
        gather, unsq = producer.get(node.input[0]), producer.get(node.input[1])
        squeeze = consumers.get(node.output[0], [])
        if (gather is None or unsq is None or gather.op_type != "GatherND" or unsq.op_type != "Unsqueeze"
                or not _is_parameter_view(gather.input[0], producer, weights)
                or len(squeeze) != 1 or squeeze[0].op_type != "Squeeze"
                or readers.get(gather.output[0]) != 1 or any(a.name == "batch_dims" and a.i for a in gather.attribute)):
            continue
        base = node.output[0]
        zero, w0, xt, yt = (f"{base}__{part}" for part in ("expert0", "expert_weight", "rows_t", "grouped_t"))
        made = [onnx.helper.make_node("Constant", [], [zero], value=onnx.helper.make_tensor(zero, TensorProto.INT64, [], [0])),
                onnx.helper.make_node("Gather", [gather.input[0], zero], [w0], name=f"{node.name}/expert_weight", axis=0),
                onnx.helper.make_node("Transpose", [unsq.input[0]], [xt], name=f"{node.name}/permute", perm=[1, 0]),
                onnx.helper.make_node("MatMul", [w0, xt], [yt], name=f"{node.name}/grouped"),
                onnx.helper.make_node("Transpose", [yt], [squeeze[0].output[0]], name=f"{node.name}/unpermute", perm=[1, 0])]
        for n in made:  # the module scope stays; the exporter's record of torch.bmm does not
            n.metadata_props.extend(p for p in node.metadata_props if p.key != "pkg.torch.onnx.fx_node")
        made[3].metadata_props.add(key="pkg.torch.onnx.fx_node", value=f"%{made[3].name} : [num_users=1] = "
                                   f"call_function[target=torch.ops.{GROUPED_MM}](args = (...))")
        replace_at[id(node)] = made
        drop.update({id(gather), id(squeeze[0])} | ({id(unsq)} if readers.get(unsq.output[0]) == 1 else set()))
    if not replace_at:
        return 0
    nodes = []
    for n in graph.node:
        if id(n) in replace_at:
            nodes.extend(replace_at[id(n)])
        elif id(n) not in drop:
            nodes.append(n)
    del graph.node[:]
    graph.node.extend(nodes)
    return len(replace_at)


def _is_parameter_view(name: str, producer: Mapping[str, onnx.NodeProto], weights: Mapping[str, int], depth: int = 4) -> bool:
    """``name`` is a 3-D initializer (``weights``: name -> rank), or one seen through at most
    ``depth`` transposes, casts or identities: the stacked ``[E, n, k]`` expert weights a routed
    product picks from."""
    for _ in range(depth + 1):
        if name in weights:
            return weights[name] == 3
        node = producer.get(name)
        if node is None or node.op_type not in ("Transpose", "Identity", "Cast") or not node.input:
            return False
        name = node.input[0]
    return False


def _restore_folded_batchnorm(model: onnx.ModelProto) -> int:
    """Put back the BatchNorm an exporter folded into convolutions; returns how many.

    A folded Conv is one the dynamo exporter marks with :data:`_FOLDED_BN_RULE`, or one whose
    weight and bias are both TorchScript folding constants (:data:`_FOLDED_CONSTANT`; eval-mode
    exports fold ``conv -> bn`` into a biased conv).  Each becomes the Conv without its bias
    (the module had none: torchvision's and Hugging Face's convolutions before a BatchNorm are
    ``bias=False``; a dynamo export that still names the module's own bias keeps it) followed by a training ``BatchNormalization`` over its output channels,
    with a learned scale and shift and the two running statistics as buffers: the parameter
    count becomes torch's (the folded bias stood for the BatchNorm's two vectors), and the step
    pays the BatchNorm's kernels and saved activations, which a training run has.  A Conv with
    its own named bias and no such mark is left alone (a network without normalisation, VGG)."""
    graph = model.graph
    inits = {init.name: init for init in graph.initializer}
    folded = []
    for node in graph.node:
        if node.op_type != "Conv" or node.domain not in _ONNX_DOMAINS or len(node.input) < 2:
            continue
        biased = len(node.input) >= 3 and bool(node.input[2])
        # the mark stays when the optimizer then drops an all-zero folded bias (a BatchNorm at its
        # initial shift of 0: RemoveOptionalBiasFromConv), so a marked conv needs no bias
        marked = any(p.key == "pkg.onnxscript.rewriter.rule_name" and _FOLDED_BN_RULE in p.value for p in node.metadata_props)
        constants = biased and bool(_FOLDED_CONSTANT.match(node.input[1]) and _FOLDED_CONSTANT.match(node.input[2]))
        if (marked or constants) and node.input[1] in inits and inits[node.input[1]].dims:
            folded.append(node)
    if not folded:
        return 0
    taken = set(inits) | {o for n in graph.node for o in n.output} | {i.name for i in graph.input}
    new_nodes, dropped = [], set()
    bn_of = {id(n): n for n in folded}
    for node in graph.node:
        new_nodes.append(node)
        if id(node) not in bn_of:
            continue
        channels = int(inits[node.input[1]].dims[0])
        base = node.input[1][:-len(".weight")] if node.input[1].endswith(".weight") else (node.name or node.output[0]).strip("/")
        names = []
        for part in ("weight", "bias", "running_mean", "running_var"):
            name, k = f"{base}.restored_bn.{part}", 1
            while name in taken:
                name, k = f"{base}.restored_bn{k}.{part}", k + 1
            taken.add(name)
            names.append(name)
            value = 1.0 if part in ("weight", "running_var") else 0.0
            graph.initializer.append(onnx.helper.make_tensor(name, TensorProto.FLOAT, [channels], [value] * channels))
        out = node.output[0]
        pre, k = f"{out}__conv", 1
        while pre in taken:
            pre, k = f"{out}__conv{k}", k + 1
        taken.add(pre)
        # the dynamo exporter keeps a convolution's own bias under its parameter name
        # (``features.0.conv.bias``) and names the one folding made up ``<weight>_bias``
        biased = len(node.input) >= 3 and bool(node.input[2])
        own_bias = biased and node.input[1].endswith(".weight") and node.input[2] == node.input[1][:-len("weight")] + "bias"
        if biased and not own_bias:
            dropped.add(node.input[2])
            del node.input[2]
        node.output[0] = pre
        bn = onnx.helper.make_node("BatchNormalization", [pre, *names], [out], name=f"{node.name}/restored_bn",
                                   epsilon=_BN_EPSILON, momentum=_BN_MOMENTUM)
        bn.metadata_props.extend(node.metadata_props)
        new_nodes.append(bn)
    del graph.node[:]
    graph.node.extend(new_nodes)
    used = {i for n in graph.node for i in n.input}
    keep = [init for init in graph.initializer if init.name not in dropped or init.name in used]
    del graph.initializer[:]
    graph.initializer.extend(keep)
    _forget_declared_shapes(graph, dropped)
    return len(folded)


def _copy_without_weight_data(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy whose large initializers carry no bytes (shape inference never needs them)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for init in out.graph.initializer:
        numel = 1
        for d in init.dims:
            numel *= d
        if numel > 1024 and init.data_location != TensorProto.EXTERNAL:
            _mark_external(init)
    return out


def _mark_external(tensor: TensorProto) -> None:
    for field_name in ("raw_data", "float_data", "int32_data", "int64_data", "double_data", "uint64_data", "string_data"):
        tensor.ClearField(field_name)
    tensor.data_location = TensorProto.EXTERNAL
    del tensor.external_data[:]
    entry = tensor.external_data.add()
    entry.key, entry.value = "location", "dml2comm-not-loaded.bin"


# ----------------------------------------------------------------------------- functions

#: ``metadata_props`` key carrying the module scope of a model-local function call onto the
#: nodes inlined from its body (``onnx.inliner`` keeps node metadata, names nodes ``Conv_22__1``).
_CALL_SCOPE_KEY = "dml2comm.scope"
#: ``metadata_props`` key carrying the chain of calls (outermost first) a node was inlined from,
#: as JSON ``[[function, call number, call scope], ...]``; read into ``Op.calls``.
_CALLS_KEY = "dml2comm.calls"

#: Nesting depth beyond which function calls are refused (ONNX forbids recursion).
_MAX_CALL_DEPTH = 64

#: The TorchScript exporter numbers the variants of one module class: ``BasicBlock.1``.
_VARIANT_SUFFIX = re.compile(r"\.\d+$")
#: A legacy scope component naming an instance of a numbered container (``layer1.0``, ``h.3``, ``0``).
_NUMBERED_COMPONENT = re.compile(r"(^|\.)\d+$")


def _inline_functions(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int, int]:
    """Inline the model-local functions with ``onnx.inliner``, keeping each call's module scope.

    A function body is shared by all its calls, so every call first gets its own copy of the
    function whose nodes carry the call's scope (:data:`_CALL_SCOPE_KEY`) and the chain of calls
    they are in (:data:`_CALLS_KEY`: each call numbered in the model, so layer grouping can
    take a repeated function's calls as blocks whatever the modules are named); nested calls
    extend both.  The scope of a call (:func:`_call_scope`) comes from the call node: the dynamo
    exporter's ``name_scopes`` metadata, else its legacy scoped name, else the caller's scope
    plus the function's name (numbered among same-named sibling calls, as ``torch.nn.Sequential``
    numbers its children), so ``export_modules_as_functions`` ResNets keep their residual blocks.

    Rewrites the call nodes of ``model`` (a private copy).  Returns the inlined model, the
    number of functions and the number of calls inlined.
    """
    functions = {(f.domain, f.name, getattr(f, "overload", "")): f for f in model.functions}
    num_functions = len(functions)
    copies: list[onnx.FunctionProto] = []

    def specialise(nodes: Any, prefix: str, depth: int, chain: list[list[Any]]) -> None:
        calls = [n for n in nodes if (n.domain, n.op_type, getattr(n, "overload", "")) in functions]
        same_name = Counter(_function_base(n.op_type) for n in calls)
        seen: Counter[str] = Counter()
        for node in nodes:
            for attr in node.attribute:  # calls inside control-flow bodies keep the caller's scope
                for sub in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs):
                    specialise(sub.node, prefix, depth, chain)
        for node in calls:
            if depth >= _MAX_CALL_DEPTH:
                raise ModelError(
                    f"model-local function {node.op_type!r} nests deeper than {_MAX_CALL_DEPTH} calls (recursive?); "
                    "re-export without export_modules_as_functions"
                )
            base = _function_base(node.op_type)
            segment = f"{base}.{seen[base]}" if same_name[base] > 1 else base
            seen[base] += 1
            scope = _call_scope(node, prefix, segment)
            copy = onnx.FunctionProto()
            copy.CopyFrom(functions[(node.domain, node.op_type, getattr(node, "overload", ""))])
            inner = chain + [[base, len(copies), scope]]
            copy.name = f"{copy.name}__dml2comm{len(copies)}"
            copies.append(copy)
            for body_node in copy.node:
                prop = body_node.metadata_props.add()
                prop.key, prop.value = _CALL_SCOPE_KEY, scope
                prop = body_node.metadata_props.add()
                prop.key, prop.value = _CALLS_KEY, json.dumps(inner)
            specialise(copy.node, scope, depth + 1, inner)
            node.op_type = copy.name

    specialise(model.graph.node, "", 0, [])
    model.functions.extend(copies)
    try:
        from onnx import inliner

        inlined = inliner.inline_local_functions(model)
    except Exception as exc:  # noqa: BLE001 - onnx raises plain exceptions here
        raise ModelError(
            f"cannot inline the model's local functions: {_first_line(exc)}; re-export without export_modules_as_functions"
        ) from exc
    return inlined, num_functions, len(copies)


def _function_base(name: str) -> str:
    """``BasicBlock.1`` -> ``BasicBlock``: one scope name for the variants of one module class."""
    return _VARIANT_SUFFIX.sub("", name).replace(".", "_") or "function"


def _call_scope(node: onnx.NodeProto, prefix: str, segment: str) -> str:
    """Module scope of a function call node.

    1. The dynamo exporter's ``name_scopes`` metadata of the call, when present.
    2. A legacy scoped name (``/layer1/layer1.0/relu/BasicBlock``): the TorchScript exporter
       names a call after the scope of the *last* op it ran, so a last component that is not a
       numbered instance (``relu``: the block's last child module) is dropped, giving
       ``layer1.0``; ``/h.0/Blk`` (a block ending in its own op) keeps ``h.0``.
       Observed with torch 2.13 ``torch.onnx.export(..., dynamo=False,
       export_modules_as_functions=...)``; the root module's call (``/fc/ResNet``) gives ``''``.
    3. Otherwise (nested calls, named ``Sequential_20``): ``prefix.segment``.
    """
    for prop in node.metadata_props:
        if prop.key == "pkg.torch.onnx.name_scopes":
            scope = _innermost_module(_parse_list(prop.value))
            if scope:
                return scope
    name = node.name
    if not prefix and name.startswith("/") and name.count("/") >= 2:
        parts = [p for p in name.split("/") if p][:-1]
        if parts and not _NUMBERED_COMPONENT.search(parts[-1]):
            parts = parts[:-1]
        return _legacy_path(parts)
    return f"{prefix}.{segment}" if prefix else segment


# ----------------------------------------------------------------------------- dims


@dataclass
class _Binding:
    bound: dict[str, int] = field(default_factory=dict)  # dim name (or INPUT:AXIS) -> value
    model_batch: int | None = None
    dims_batch: int | None = None  # a symbolic batch axis (axis 0) bound by ``dims`` (``--dim batch=4``)
    seq_bound: int | None = None  # the value bound to the first symbolic sequence axis
    fixed_seq: tuple[str, int] | None = None
    unbound: list[tuple[str, int, str, bool]] = field(default_factory=list)  # input, axis, name, sequence axis?
    seq_inputs: list[str] = field(default_factory=list)  # inputs whose own sequence axis took --seq-len


def _bind_input_dims(graph: onnx.GraphProto, initializer_names: set[str], options: ImportOptions) -> _Binding:
    """Replace symbolic dims of graph inputs with values (see :class:`ImportOptions`).

    Returns the bindings made and the input dims left unbound.  Raises :class:`ConfigError` for
    a ``dims`` key that names no input dim, or that binds a static axis to another value.
    """
    out = _Binding()
    inputs = [v for v in graph.input if v.name not in initializer_names and v.type.HasField("tensor_type")]
    out.unbound.extend((v.name, -1, "", False) for v in inputs if not v.type.tensor_type.HasField("shape"))
    inputs = [v for v in inputs if v.type.tensor_type.HasField("shape")]
    _check_dim_keys(inputs, options.dims)
    symbolic_batch = any(
        v.type.tensor_type.shape.dim and not (v.type.tensor_type.shape.dim[0].HasField("dim_value")
                                              and v.type.tensor_type.shape.dim[0].dim_value > 0)
        for v in inputs)
    for value in inputs:
        ttype = value.type.tensor_type
        is_int = _dtype(ttype.elem_type) in (DType.INT64, DType.INT32)
        rank = len(ttype.shape.dim)
        for axis, dim in enumerate(ttype.shape.dim):
            static = dim.HasField("dim_value") and dim.dim_value > 0
            # the sequence axis: axis 1 of token ids [b, s] and of hidden states [b, s, h]; also
            # of a symbolic rank-2 float input (audio samples [b, samples]), never a static one
            # (features [b, f])
            is_seq = axis == 1 and ((is_int and rank == 2) or rank == 3 or (rank == 2 and not static))
            by_axis = f"{value.name}:{axis}"
            if static:
                # a static axis 0 is the model's own batch only when no input's axis 0 is
                # symbolic: Silero VAD's LSTM state [2, batch, 128] has a static 2 in front
                if axis == 0 and out.model_batch is None and not symbolic_batch:
                    out.model_batch = dim.dim_value
                if is_seq and out.fixed_seq is None:
                    out.fixed_seq = (value.name, dim.dim_value)
                continue
            label = _dim_label(dim)
            value_ = None
            if by_axis in options.dims:
                value_ = options.dims[by_axis]
            elif label and label in options.dims:
                value_ = options.dims[label]
            elif label and label in out.bound:
                value_ = out.bound[label]
            elif axis == 0 and options.batch_size is not None:
                value_ = options.batch_size
            elif is_seq and options.seq_len is not None:
                value_ = options.seq_len
                out.seq_inputs.append(value.name)
            elif axis == 0:
                value_ = 1  # documented default: micro-batch size 1 for a symbolic batch axis
            if value_ is None:
                out.unbound.append((value.name, axis, label, is_seq))
                continue
            if axis == 0 and out.dims_batch is None and (by_axis in options.dims or (label and label in options.dims)):
                out.dims_batch = int(value_)  # --dim set the micro-batch: the analysis reports it as such
            dim.Clear()
            dim.dim_value = int(value_)
            out.bound[label or by_axis] = int(value_)
            if is_seq and out.seq_bound is None:
                out.seq_bound = int(value_)
    return out


#: ``dim_param`` values that are placeholders, not names: Paddle2ONNX writes ``?`` for every
#: unknown dim, so binding by that "name" would give unrelated axes (height, width) one value.
_PLACEHOLDER_DIM_NAMES = frozenset({"?", "-1", "None", "unk"})


def _dim_label(dim: onnx.TensorShapeProto.Dimension) -> str:
    """The symbolic name of an input dim, ``""`` for none or a placeholder (bound by
    ``INPUT:AXIS`` instead)."""
    label = dim.dim_param
    return "" if label in _PLACEHOLDER_DIM_NAMES else label


def _check_dim_keys(inputs: list[onnx.ValueInfoProto], dims: Mapping[str, int]) -> None:
    """Every ``dims`` key must name a symbolic input dim or an ``INPUT:AXIS`` of the model."""
    if not dims:
        return
    names: dict[str, None] = {}  # symbolic dim names in input order
    axes: dict[str, int | None] = {}  # INPUT:AXIS -> static value (None when symbolic/unnamed)
    for value in inputs:
        for axis, dim in enumerate(value.type.tensor_type.shape.dim):
            static = dim.dim_value if dim.HasField("dim_value") and dim.dim_value > 0 else None
            axes[f"{value.name}:{axis}"] = static
            if static is None and _dim_label(dim):
                names[_dim_label(dim)] = None
    for key, val in dims.items():
        if key in names:
            continue
        if key in axes:
            static = axes[key]
            if static is not None and static != val:
                raise ConfigError(f"--dim {key}={val}: that axis is fixed at {static} in the model; drop the flag "
                                  "or re-export with a dynamic axis")
            continue
        listed = ", ".join(list(names)[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
        inp, colon, _ = key.rpartition(":")
        if colon and inp in {v.name for v in inputs}:
            rank = len(next(v for v in inputs if v.name == inp).type.tensor_type.shape.dim)
            raise ConfigError(f"--dim {key}={val}: input {inp!r} has {rank} axes (0-{rank - 1}); name an axis it has")
        raise ConfigError(
            f"--dim {key}={val}: the model has no input dim named {key!r}; "
            + (f"its symbolic input dims are: {listed}" if names else "its inputs have no named symbolic dims")
            + " (an unnamed dim is bound as --dim INPUT:AXIS=VALUE)"
        )


#: At most this many dims are named in an error message (one short line).
_MAX_DIMS_NAMED = 4


def _unbound_inputs_error(unbound: list[tuple[str, int, str, bool]]) -> UnboundDimError:
    """Input dims left unbound: name them (input, axis, dim name) and the flag binding each.

    Raised before shape inference, whose failure on a downstream ``Reshape`` would point at the
    wrong thing."""
    no_shape = [inp for inp, axis, _, _ in unbound if axis < 0]
    if no_shape:
        return UnboundDimError(f"input {no_shape[0]!r} declares no shape; re-export the model with input shapes "
                               "(symbolic dims are fine)")
    shown = [f"{inp!r} axis {axis} ({repr(label) if label else 'unnamed'})" for inp, axis, label, _ in unbound[:_MAX_DIMS_NAMED]]
    if len(unbound) > _MAX_DIMS_NAMED:
        shown[-1] += f" and {len(unbound) - _MAX_DIMS_NAMED} more"
    fixes: dict[str, None] = {}
    for inp, axis, label, is_seq in unbound:
        fix = "--seq-len N" if is_seq else f"--dim {label}=N" if label else f"--dim {inp}:{axis}=N"
        fixes.setdefault(fix, None)
    fix_text = ", ".join(list(fixes)[:3]) + (" ..." if len(fixes) > 3 else "")
    return UnboundDimError(f"input dims not bound: {', '.join(shown)}; bind them with {fix_text}")


#: Ops a position-ids tensor passes through between ``Range`` and the embedding ``Gather``.
_POSITION_INDEX_PATH = frozenset({"Unsqueeze", "Squeeze", "Expand", "Reshape", "Cast", "Slice", "Identity", "Add", "Flatten"})
_POSITION_NAME = re.compile(r"position", re.IGNORECASE)


def _position_table(graph: onnx.GraphProto) -> tuple[str, int] | None:
    """The learned position-embedding table (name, rows), or ``None``.

    GPT-2 and BERT look positions up as ``wpe(arange(seq))``: a ``Gather`` on axis 0 of a 2-D
    float table (an initializer, possibly through ``Identity``/``Cast``) whose indices come,
    through :data:`_POSITION_INDEX_PATH` ops, from a ``Range``, a ``position_ids`` input or an
    integer ``position_ids`` buffer: named so, or holding ``0, 1, ..., n-1`` (the legacy
    exporter turns BERT's ``position_ids`` buffer into a ``Constant``; ``transformers``
    ``GPT2Model.forward``/``BertEmbeddings``).  Its row count is the longest sequence the model
    can take.
    """
    producers = {o: n for n in graph.node for o in n.output if o}
    tables = {i.name: (i.name, int(i.dims[0])) for i in graph.initializer if len(i.dims) == 2 and _dtype(i.data_type).is_float}
    int_inits = {i.name: i for i in graph.initializer if not _dtype(i.data_type).is_float}
    inputs = {v.name for v in graph.input}

    def is_arange(tensor: TensorProto | None) -> bool:
        if tensor is None or _dtype(tensor.data_type).is_float or tensor.data_location == TensorProto.EXTERNAL:
            return False
        import numpy as np
        from onnx import numpy_helper

        try:
            values = numpy_helper.to_array(tensor).reshape(-1)
        except Exception:  # noqa: BLE001 - odd encodings are simply not position ids
            return False
        return values.size > 1 and bool(np.array_equal(values, np.arange(values.size)))

    def table_of(name: str) -> tuple[str, int] | None:
        for _ in range(4):
            if name in tables:
                return tables[name]
            node = producers.get(name)
            if node is None or node.op_type not in ("Identity", "Cast") or not node.input:
                return None
            name = node.input[0]
        return None

    def from_positions(name: str) -> bool:
        frontier, seen = [name], {name}
        for _ in range(8):
            following = []
            for tensor in frontier:
                if (tensor in inputs or tensor in int_inits) and _POSITION_NAME.search(tensor) or is_arange(int_inits.get(tensor)):
                    return True
                node = producers.get(tensor)
                if node is None:
                    continue
                if node.op_type == "Range" or node.op_type == "Constant" and is_arange(next(
                        (a.t for a in node.attribute if a.name == "value" and a.type == onnx.AttributeProto.TENSOR), None)):
                    return True
                if node.op_type in _POSITION_INDEX_PATH:
                    nxt = node.input if node.op_type == "Add" else node.input[:1]
                    following.extend(i for i in nxt if i and i not in seen)
                    seen.update(nxt)
            frontier = following
        return False

    for node in graph.node:
        if node.op_type != "Gather" or len(node.input) < 2 or any(a.name == "axis" and a.i != 0 for a in node.attribute):
            continue
        table = table_of(node.input[0])
        if table is not None and from_positions(node.input[1]):
            return table
    return None


def check_seq_len(imported: ImportResult, seq_len: int | None) -> None:
    """Refuse a ``--seq-len`` the model cannot take (the command line calls this after import).

    Raises :class:`ConfigError` when ``seq_len`` bound no axis and differs from the model's
    fixed sequence length (it would only scale tokens/s), when the model has no sequence axis
    at all, when it contradicts a ``--dim`` on the sequence axis, or when the sequence length
    (``seq_len`` or the ``--dim`` one) exceeds the rows of the position-embedding table
    (GPT-2: 1,024).
    """
    info = imported.sequence
    if seq_len is not None and info.bound is not None and info.bound != seq_len:
        raise ConfigError(f"--seq-len {seq_len} conflicts with --dim binding the sequence axis to {info.bound}; drop one of them")
    if seq_len is not None and info.bound is None:
        if info.fixed is None:
            raise ConfigError(
                f"--seq-len {seq_len}: the model has no sequence axis to bind (no rank-2 integer or rank-3 input); "
                "drop --seq-len"
            )
        name, length = info.fixed
        if length != seq_len:
            raise ConfigError(
                f"--seq-len {seq_len}: the model's sequence length is fixed at {length} (input {name!r}); "
                f"drop --seq-len or re-export with a dynamic sequence axis"
            )
    length = seq_len if seq_len is not None else info.bound
    if length is not None and info.positions is not None and length > info.positions[1]:
        table, rows = info.positions
        flag = f"--seq-len {seq_len}" if seq_len is not None else f"the sequence length {length} (--dim)"
        raise ConfigError(
            f"{flag} exceeds the model's {rows:,} positions (position table {table!r}); "
            f"use a sequence length of {rows} or less"
        )


def _check_table_lookups(graph: onnx.GraphProto, position_table: str | None = None, seq_len: int | None = None) -> None:
    """Refuse bound dims that index past a table: a ``Gather`` from a 2-D float initializer (a
    position-embedding table) whose indices folded to constants once the input dims were bound.
    OPT and RoBERTa offset their positions by 2 (a 64-position OPT has a 66-row table), so their
    table rows are not a sequence-length limit :func:`check_seq_len` can read off the table;
    the folded indices are the positions the model would really look up.  A lookup of
    ``position_table`` (a ``Range`` lookup, GPT-2's) at positions ``0 .. seq_len - 1`` is left to
    :func:`check_seq_len` and its message in terms of ``--seq-len``.

    Raises
    ------
    ModelError
        An index is past the table's rows."""
    import numpy as np

    tables = {i.name: int(i.dims[0]) for i in graph.initializer if len(i.dims) == 2 and _dtype(i.data_type).is_float}
    constants = _constant_values(graph)
    for node in graph.node:
        if node.op_type != "Gather" or len(node.input) < 2 or node.input[0] not in tables or node.input[1] not in constants:
            continue
        if any(a.name == "axis" and a.i != 0 for a in node.attribute):
            continue
        values = np.asarray(constants[node.input[1]])
        if values.size == 0 or not np.issubdtype(values.dtype, np.integer):
            continue
        rows, top = tables[node.input[0]], int(values.max())
        if node.input[0] == position_table and seq_len is not None and top == seq_len - 1:
            continue  # check_seq_len's case
        if top >= rows:
            over = top + 1 - rows
            raise ModelError(
                f"the bound sequence length looks up position {top} of table {node.input[0]!r}, which has {rows:,} rows "
                f"(Gather {node.name!r}); use a sequence length {over} shorter (--seq-len)"
            )


def _forget_inferred_shapes(graph: onnx.GraphProto) -> None:
    """Drop exporter-written shapes that hold symbolic dims (they are stale once the inputs
    are bound); keep fully static ones, the only shape information for custom-domain ops."""
    keep = [vi for vi in graph.value_info if _is_static(vi.type)]
    del graph.value_info[:]
    graph.value_info.extend(keep)
    for out in graph.output:
        if out.type.HasField("tensor_type") and not _is_static(out.type):
            out.type.tensor_type.ClearField("shape")


def _is_static(vtype: onnx.TypeProto) -> bool:
    shape, _ = _shape_of(vtype)
    return shape is not None and all(isinstance(d, int) for d in shape)


def _infer(model: onnx.ModelProto, path_for_large: Path | None) -> onnx.ModelProto:
    try:
        if path_for_large is None:
            return onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=False, data_prop=True)
        with tempfile.TemporaryDirectory() as tmp:
            src = Path(tmp) / "in.onnx"
            dst = Path(tmp) / "out.onnx"
            onnx.save_model(model, str(src))
            onnx.shape_inference.infer_shapes_path(str(src), str(dst), check_type=False, strict_mode=False, data_prop=True)
            return onnx.load(str(dst), load_external_data=False)
    except Exception as exc:  # noqa: BLE001 - onnx raises InferenceError / RuntimeError
        raise ModelError(f"ONNX shape inference failed: {_first_line(exc)}; check the model with onnx.checker") from exc


# ----------------------------------------------------------------------------- folding

#: Shape computations produce small integer tensors; nothing larger is folded.
FOLD_MAX_ELEMENTS = 4096
_NEVER_FOLD = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli", "Dropout"})


def _shapes(graph: onnx.GraphProto) -> dict[str, tuple[tuple[int | str, ...] | None, DType]]:
    """Shape and dtype of every declared or inferred value, by name; each distinct type read
    once (keyed by its serialized bytes: a 105-layer GPT's 6,300 values have a few dozen types,
    and protobuf serializes in C where :func:`_shape_of` walks the dims in Python)."""
    read: dict[bytes, tuple[tuple[int | str, ...] | None, DType]] = {}
    out: dict[str, tuple[tuple[int | str, ...] | None, DType]] = {}
    for vi in (*graph.input, *graph.value_info, *graph.output):
        key = vi.type.SerializeToString()
        got = read.get(key)
        if got is None:
            got = read[key] = _shape_of(vi.type)
        out[vi.name] = got
    return out


def _has_unknown_dims(model: onnx.ModelProto, shapes: dict | None = None) -> bool:
    graph = model.graph
    if shapes is None:
        shapes = _shapes(graph)
    inputs = {vi.name for vi in graph.input}
    unknown: dict[Any, bool] = {}  # per distinct shape: a few dozen types for thousands of values (_shapes)
    for name, (shape, _) in shapes.items():
        if name in inputs:
            continue
        bad = unknown.get(shape)
        if bad is None:
            bad = unknown[shape] = shape is None or any(not isinstance(d, int) for d in shape)
        if bad:
            return True
    return any(out and out not in shapes for node in graph.node for out in node.output)


def _fold_shape_computations(model: onnx.ModelProto, path_for_large: Path | None) -> tuple[onnx.ModelProto, int]:
    """Evaluate ``Shape`` of static tensors and the small integer subgraphs fed by them
    (``Shape -> Squeeze -> Range``, ``Shape -> Gather -> Concat -> Reshape``) with onnx's
    reference evaluator, replace them by ``Constant`` nodes and infer shapes again.

    Dynamic-shape exports (torch dynamo) compute sizes at run time; ONNX's data propagation
    does not cover every op (``Range`` notably), so once the input dims are bound we fold.
    """
    import numpy as np
    from onnx import numpy_helper
    from onnx.reference import ReferenceEvaluator

    total = 0
    for _ in range(8):
        shapes = {vi.name: _shape_of(vi.type)[0] for vi in list(model.graph.value_info) + list(model.graph.input) + list(model.graph.output)}
        known: dict[str, Any] = {}
        for init in model.graph.initializer:
            if init.data_location != TensorProto.EXTERNAL:
                n = 1
                for d in init.dims:
                    n *= d
                # float tensors of more than one element may be weights: folding a view of one
                # (bias -> Reshape) would leave the weight unused and uncounted
                if n <= FOLD_MAX_ELEMENTS and not (n > 1 and _dtype(init.data_type).is_float):
                    known[init.name] = numpy_helper.to_array(init)
        replaced: dict[int, onnx.NodeProto] = {}
        for idx, node in enumerate(model.graph.node):
            if node.domain not in ("", "ai.onnx") or node.op_type in _NEVER_FOLD:
                continue
            if node.op_type == "Constant":
                try:
                    known[node.output[0]] = numpy_helper.to_array(node.attribute[0].t) if node.attribute[0].type == onnx.AttributeProto.TENSOR else None
                except Exception:  # noqa: BLE001 - sparse or odd constants are simply not folded
                    pass
                continue
            values: list[Any]
            if node.op_type == "Shape":
                shape = shapes.get(node.input[0])
                if shape is None or any(not isinstance(d, int) for d in shape):
                    continue
                attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
                start, end = attrs.get("start", 0), attrs.get("end", len(shape))
                values = [np.array(shape[start:end] if end is not None else shape[start:], dtype=np.int64)]
            elif node.input and all((not i) or (i in known and known[i] is not None) for i in node.input):
                try:
                    # T5's position buckets take log(0) = -inf and cast it to an integer that a
                    # Where then discards: numpy's warnings about it are not the user's concern
                    with np.errstate(all="ignore"):
                        values = list(ReferenceEvaluator(node).run(None, {i: known[i] for i in node.input if i}))
                except Exception:  # noqa: BLE001 - anything the evaluator cannot run stays an op
                    continue
            else:
                continue
            if any(np.asarray(v).size > FOLD_MAX_ELEMENTS for v in values):
                continue
            outs = [o for o in node.output]
            for name, value in zip(outs, values):
                known[name] = np.asarray(value)
            if len(outs) == 1:
                const = onnx.helper.make_node(
                    "Constant", [], [outs[0]], name=node.name, value=numpy_helper.from_array(np.asarray(values[0]), outs[0])
                )
                mark = const.metadata_props.add()
                mark.key, mark.value = _FOLDED_KEY, node.op_type
                replaced[idx] = const
        if not replaced:
            break
        nodes = [replaced.get(i, n) for i, n in enumerate(model.graph.node)]
        del model.graph.node[:]
        model.graph.node.extend(nodes)
        total += sum(1 for n in replaced.values())
        _forget_inferred_shapes(model.graph)
        model = _infer(model, path_for_large)
        if not _has_unknown_dims(model):
            break
    return model, total


# ----------------------------------------------------------------------------- control flow

#: ``metadata_props`` key on a node inlined from a ``Loop``/``Scan`` body: how many times it runs
#: per forward pass (the trip count; products for nested loops).  Read into ``Op.repeat``.
_REPEAT_KEY = "dml2comm.repeat"

#: Control flow nested deeper than this is refused (each round inlines one level).
_MAX_CONTROL_FLOW_DEPTH = 16

#: A ``Loop`` trip count ``M`` at or above this is a "no limit" sentinel (the TorchScript
#: exporter writes ``INT64_MAX`` for ``while`` loops), not a count.
_TRIP_COUNT_SENTINEL = 2**31 - 1

_ONNX_DOMAINS = ("", "ai.onnx")


def _expand_control_flow(model: onnx.ModelProto, path_for_large: Path | None, warnings: list[str],
                         op_cost: OpForwardCost) -> onnx.ModelProto:
    """Replace every ``If``, ``Loop`` and ``Scan`` by the nodes of its subgraph, so that the
    rest of dml2comm sees ordinary ops.

    Why inline rather than keep one op with a precomputed cost: the subgraph's ops then get
    layers, tensor-parallel sharding, saved activations, per-op times in the training dtype and
    drawings like every other op, from the same rules, and the parameters they read (an LSTM's
    ``W``, ``R``, ``B`` in a branch) are counted and placed on their pipeline stage.  A single
    opaque op would carry a cost computed before sharding and the dtype were known.

    - ``If``: the branch taken when the condition is a constant, else the **heavier** branch (the
      larger forward FLOPs, then bytes, of its ops under the same cost rules as the analysis,
      ``op_cost``; :func:`_subgraph_cost`).  The If's outputs take that branch's shapes: ONNX shape inference
      leaves them unknown when the branches return different ranks.  A warning names the choice.
    - ``Loop``: the body is inlined once and each of its ops runs ``M`` times (``Op.repeat``),
      ``M`` being the trip-count input when it is a constant (an initializer, a ``Constant`` or a
      value folded from the bound input dims).  Otherwise the trip count is unknown: costed as
      ONE iteration, with a warning.  Loop-carried values enter the body as their initial
      values; scan outputs are the per-iteration value expanded to ``[M, ...]``.
    - ``Scan``: likewise with the sequence length (the scan axis of its first scan input) as the
      trip count; each scan input enters the body as its slice at index 0 of the scan axis.

    Subgraph values are renamed ``<first output of the control-flow node>.<subgraph>/<name>``
    (outer-scope references keep their names, also inside nested subgraphs); nested control
    flow becomes top-level and is expanded in the next round.  Shapes are inferred again (and
    shape computations folded) after each round.

    Raises
    ------
    ModelError
        ``SequenceMap`` (sequence values have no tensor shape), or nesting deeper than
        :data:`_MAX_CONTROL_FLOW_DEPTH`.
    """
    notes: dict[str, list[str]] = {}
    for _ in range(_MAX_CONTROL_FLOW_DEPTH):
        graph = model.graph
        flow = [n for n in graph.node if n.domain in _ONNX_DOMAINS and n.op_type in CONTROL_FLOW_OPS]
        if not flow:
            break
        opset = next((o.version for o in model.opset_import if o.domain in _ONNX_DOMAINS), 1)
        shapes = _shapes(graph)
        for init in graph.initializer:
            shapes.setdefault(init.name, (tuple(int(d) for d in init.dims), _dtype(init.data_type)))
        constants = _constant_values(graph)
        replaced: set[str] = set()
        nodes: list[onnx.NodeProto] = []
        for node in graph.node:
            if node.domain not in _ONNX_DOMAINS or node.op_type not in CONTROL_FLOW_OPS:
                nodes.append(node)
                continue
            replaced.update(o for o in node.output if o)
            expand = {"If": _expand_if, "Loop": _expand_loop, "Scan": _expand_scan}.get(node.op_type)
            if expand is None:
                raise ModelError(
                    f"{node.op_type} at node {node.name or '(unnamed)'!r} is not supported: it maps over ONNX sequences, "
                    "which have no tensor shape; re-export the model without sequence ops"
                )
            nodes.extend(expand(node, graph, shapes, constants, opset, notes, op_cost))
        del graph.node[:]
        graph.node.extend(nodes)
        # the control-flow outputs' declared shapes may be another branch's: infer them afresh
        _forget_declared_shapes(graph, replaced)
        _forget_inferred_shapes(graph)
        model = _infer(model, path_for_large)
        if _has_unknown_dims(model):
            model, _ = _fold_shape_computations(model, path_for_large)
        model = _drop_idle_unknown(model, path_for_large, notes)
    else:
        raise ModelError(
            f"control flow nests deeper than {_MAX_CONTROL_FLOW_DEPTH} levels; re-export the model with its loops unrolled"
        )
    for text in notes.values():
        warnings.extend(text)
    return model


def _drop_idle_unknown(model: onnx.ModelProto, path_for_large: Path | None, notes: dict[str, list[str]]) -> onnx.ModelProto:
    """Remove the ops of branches not taken (repeat 0) whose shapes inference cannot give, and
    the idle ops reading them: they cost nothing, and an unknown shape there must not fail the
    import of a model whose taken path is fine.  Their parameters are then not counted (noted)."""
    shapes = _shapes(model.graph)
    known = {n for n, (shape, _) in shapes.items() if shape is not None and all(type(d) is int for d in shape)}
    known |= {i.name for i in model.graph.initializer}
    drop: set[int] = set()
    dead: set[str] = set()
    for idx, node in enumerate(model.graph.node):
        if _node_repeat(node) != 0 or node.op_type == "Constant":
            continue
        if any(i in dead for i in node.input) or any(o and o not in known for o in node.output):
            drop.add(idx)
            dead.update(o for o in node.output if o)
    if not drop:
        return model
    names = sorted({n.name or n.op_type for i, n in enumerate(model.graph.node) if i in drop})
    _note(notes, "idle-dropped", (
        f"{len(drop)} op(s) of If branches not taken have shapes ONNX inference cannot give and were left out "
        f"(e.g. {', '.join(map(repr, names[:3]))}); parameters only they read are not counted"
    ))
    nodes = [n for i, n in enumerate(model.graph.node) if i not in drop]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    _forget_inferred_shapes(model.graph)
    return _infer(model, path_for_large)


def _note(notes: dict[str, list[str]], kind: str, text: str) -> None:
    notes.setdefault(kind, []).append(text)


def _trips_noted(notes: dict[str, list[str]], what: str, trips: int | None, why: str, fix: str) -> int:
    """A loop body's repeat count, noted: ``trips`` when known (``why`` says where it came from),
    else one iteration with a warning that says ``why`` not and how to ``fix`` it."""
    if trips is None:
        _note(notes, "loop-unknown", f"{what}: {why}, so it is costed as ONE iteration{fix}")
        return 1
    _note(notes, "loop", f"{what}: body costed {trips} times ({why})")
    return trips


def _constant_values(graph: onnx.GraphProto) -> dict[str, Any]:
    """Values of the small constants of ``graph`` (initializers whose data is loaded, and
    ``Constant`` nodes, folded ones included), by name."""
    from onnx import numpy_helper

    values: dict[str, Any] = {}
    for init in graph.initializer:
        if init.data_location != TensorProto.EXTERNAL:
            try:
                values[init.name] = numpy_helper.to_array(init)
            except Exception:  # noqa: BLE001 - odd encodings are simply not known
                pass
    for node in graph.node:
        if node.op_type == "Constant" and node.domain in _ONNX_DOMAINS and node.attribute:
            attr = node.attribute[0]
            try:
                value = numpy_helper.to_array(attr.t) if attr.type == onnx.AttributeProto.TENSOR else onnx.helper.get_attribute_value(attr)
            except Exception:  # noqa: BLE001
                continue
            values[node.output[0]] = value
    return values


def _scalar(constants: Mapping[str, Any], name: str) -> int | None:
    """The integer value of the one-element constant ``name``, or None when not a constant."""
    import numpy as np

    if not name or name not in constants:
        return None
    value = np.asarray(constants[name])
    return int(value.reshape(-1)[0]) if value.size == 1 and value.dtype.kind in "biuf" else None


def _node_repeat(node: onnx.NodeProto) -> int:
    for prop in node.metadata_props:
        if prop.key == _REPEAT_KEY:
            return int(prop.value)
    return 1


def _set_repeat(node: onnx.NodeProto, repeat: int) -> None:
    props = [p for p in node.metadata_props if p.key != _REPEAT_KEY]
    del node.metadata_props[:]
    node.metadata_props.extend(props)
    if repeat != 1:
        prop = node.metadata_props.add()
        prop.key, prop.value = _REPEAT_KEY, str(repeat)


def _prefix(node: onnx.NodeProto, what: str) -> str:
    base = next((o for o in node.output if o), "") or node.name or node.op_type
    return f"{base}.{what}/"


def _subgraph(node: onnx.NodeProto, name: str) -> onnx.GraphProto:
    for attr in node.attribute:
        if attr.name == name and attr.type == onnx.AttributeProto.GRAPH:
            return attr.g
    raise ModelError(f"{node.op_type} at node {node.name or '(unnamed)'!r} has no {name!r} subgraph; the model is malformed, re-export it")


def _helper_node(op_type: str, inputs: list[str], outputs: list[str], parent: onnx.NodeProto, repeat: int, **attrs: Any) -> onnx.NodeProto:
    """A node dml2comm adds while inlining ``parent``: named after it, in its scope."""
    node = onnx.helper.make_node(op_type, inputs, outputs, name=f"{parent.name or parent.op_type}/{op_type}_{outputs[0].rsplit('/', 1)[-1]}", **attrs)
    _copy_scope(parent, node)
    _set_repeat(node, repeat)
    return node


def _copy_scope(parent: onnx.NodeProto, node: onnx.NodeProto, subgraph: str = "") -> None:
    """Give ``node`` the module scope of ``parent`` (extended by ``<parent>.<subgraph>`` for a
    node of one of its subgraphs) when it has none of its own: the nodes of a branch or loop
    body then group into one module, as layer grouping expects.  A ``node`` without a function
    call of its own (:data:`_CALLS_KEY`) is in ``parent``'s calls."""
    if not _calls(node):
        node.metadata_props.extend(p for p in parent.metadata_props if p.key == _CALLS_KEY)
    if _scope(node):
        return
    scope = _scope(parent)
    if subgraph:
        label = re.sub(r"[^A-Za-z0-9_]", "_", (parent.name or parent.op_type).rstrip("/").rsplit("/", 1)[-1]) or parent.op_type
        scope = f"{scope}.{label}.{subgraph}" if scope else f"{label}.{subgraph}"
    if scope:
        prop = node.metadata_props.add()
        prop.key, prop.value = _CALL_SCOPE_KEY, scope


def _int64_const(name: str, values: list[int] | int, parent: onnx.NodeProto, repeat: int) -> onnx.NodeProto:
    dims = [] if isinstance(values, int) else [len(values)]
    vals = [values] if isinstance(values, int) else values
    return _helper_node("Constant", [], [name], parent, repeat, value=onnx.helper.make_tensor(name, TensorProto.INT64, dims, vals))


def _inline_body(body: onnx.GraphProto, parent: onnx.NodeProto, graph: onnx.GraphProto, prefix: str,
                 bound: Mapping[str, str], repeat: int) -> tuple[list[onnx.NodeProto], dict[str, str]]:
    """Copies of ``body``'s nodes for the outer graph: local values renamed with ``prefix``, body
    inputs replaced by the outer values in ``bound``, initializers moved to ``graph`` (their
    data dropped, as for the main graph's), each node's repeat multiplied by ``repeat`` and its
    scope defaulting to ``parent``'s.  Returns the nodes and the renaming."""
    local = {i.name for i in body.initializer} | {o for n in body.node for o in n.output if o}
    rename = {n: prefix + n for n in local}
    rename.update(bound)
    for init in body.initializer:
        copy = graph.initializer.add()
        copy.CopyFrom(init)
        copy.name = rename[init.name]
        numel = 1
        for d in copy.dims:
            numel *= d
        if numel > 1024 and copy.data_location != TensorProto.EXTERNAL:
            _mark_external(copy)
    nodes = []
    for node in body.node:
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        copy.input[:] = [rename.get(i, i) if i else i for i in node.input]
        copy.output[:] = [rename.get(o, o) if o else o for o in node.output]
        if not copy.name:
            copy.name = f"{prefix}{node.op_type}_{len(nodes)}"
        for attr in copy.attribute:
            for sub in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs):
                _rename_outer_refs(sub, rename)
        _set_repeat(copy, _node_repeat(node) * repeat)
        _copy_scope(parent, copy, prefix.rstrip("/").rsplit(".", 1)[-1])
        nodes.append(copy)
    return nodes, rename


def _rename_outer_refs(graph: onnx.GraphProto, rename: Mapping[str, str]) -> None:
    """Rename the references of a nested subgraph to outer values, honouring shadowing."""
    defined = {i.name for i in graph.input} | {i.name for i in graph.initializer} | {o for n in graph.node for o in n.output}
    outer = {k: v for k, v in rename.items() if k not in defined}
    if not outer:
        return
    for node in graph.node:
        node.input[:] = [outer.get(i, i) for i in node.input]
        for attr in node.attribute:
            for sub in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs):
                _rename_outer_refs(sub, outer)
    for out in graph.output:
        out.name = outer.get(out.name, out.name)


def _outputs_of(sources: Any, rename: Mapping[str, str], parent: onnx.NodeProto, targets: Any, repeat: int) -> list[onnx.NodeProto]:
    """``Identity`` nodes giving the outer names ``targets`` to the body outputs ``sources``."""
    return [
        _helper_node("Identity", [rename.get(src.name, src.name)], [dst], parent, repeat)
        for src, dst in zip(sources, targets) if dst
    ]


def _stacked(value: str, axis: int, trips: int, out: str, parent: onnx.NodeProto, opset: int, repeat: int) -> list[onnx.NodeProto]:
    """Nodes making ``out`` = the per-iteration ``value`` stacked ``trips`` times on ``axis``
    (a Loop's or Scan's scan output): ``Expand(Reshape(value, head + [1] + tail), head + [trips]
    + tail)``, ``head``/``tail`` being ``Shape(value)`` before/after ``axis``.  The Expand writes
    the whole stacked output once, as the control-flow op does."""
    p = out + "/stack/"
    shape, head, tail, one, n, unit_shape, full_shape, unit = (p + s for s in ("shape", "head", "tail", "one", "n", "unit_shape", "full_shape", "unit"))
    nodes = [_helper_node("Shape", [value], [shape], parent, repeat)]
    if opset >= 10:
        nodes += [
            _int64_const(p + "zero", [0], parent, repeat), _int64_const(p + "axis", [axis], parent, repeat),
            _int64_const(p + "end", [2**62], parent, repeat),
            _helper_node("Slice", [shape, p + "zero", p + "axis"], [head], parent, repeat),
            _helper_node("Slice", [shape, p + "axis", p + "end"], [tail], parent, repeat),
        ]
    else:
        nodes += [
            _helper_node("Slice", [shape], [head], parent, repeat, starts=[0], ends=[axis]),
            _helper_node("Slice", [shape], [tail], parent, repeat, starts=[axis], ends=[2**62]),
        ]
    nodes += [
        _int64_const(one, [1], parent, repeat), _int64_const(n, [trips], parent, repeat),
        _helper_node("Concat", [head, one, tail], [unit_shape], parent, repeat, axis=0),
        _helper_node("Concat", [head, n, tail], [full_shape], parent, repeat, axis=0),
        _helper_node("Reshape", [value, unit_shape], [unit], parent, repeat),
        _helper_node("Expand", [unit, full_shape], [out], parent, repeat),
    ]
    return nodes


def _expand_if(node: onnx.NodeProto, graph: onnx.GraphProto, shapes: dict, constants: Mapping[str, Any], opset: int,
               notes: dict[str, list[str]], op_cost: OpForwardCost) -> list[onnx.NodeProto]:
    """The nodes of the ``If``'s chosen branch (:func:`_expand_control_flow`)."""
    repeat = _node_repeat(node)
    where = node.name or "(unnamed)"
    branches = {name: _subgraph(node, name) for name in ("then_branch", "else_branch")}
    cond = _scalar(constants, node.input[0] if node.input else "")
    if cond is not None:
        chosen = "then_branch" if cond else "else_branch"
        _note(notes, "if-constant", f"If at node {where!r}: its condition is the constant {bool(cond)}; {chosen} inlined, the other "
              "branch kept run 0 times for its parameters")
    else:
        costs = {name: _subgraph_cost(g, shapes, constants, op_cost) for name, g in branches.items()}
        chosen = max(branches, key=lambda b: (costs[b], len(branches[b].node), b == "then_branch"))
        other = "else_branch" if chosen == "then_branch" else "then_branch"
        ranks = {name: ", ".join("?" if (shape := _shape_of(o.type)[0]) is None else str(len(shape)) for o in g.output)
                 for name, g in branches.items()}
        shape_note = ""
        if ranks["then_branch"] != ranks["else_branch"]:
            shape_note = (f"; the branches return different ranks (then_branch {ranks['then_branch']}, else_branch "
                          f"{ranks['else_branch']}), so the If's outputs take {chosen}'s shapes")
        _note(notes, "if", (
            f"If at node {where!r}: its condition is known only at run time; costed as its heavier branch, {chosen} "
            f"({costs[chosen][0]:.3g} forward FLOPs vs {costs[other][0]:.3g} for {other}, kept run 0 times for its "
            f"parameters){shape_note}"
        ))
    body = branches[chosen]
    nodes, rename = _inline_body(body, node, graph, _prefix(node, chosen), {}, repeat)
    # the branch not taken runs 0 times (no cost, no activations) but its parameters exist and
    # train (torch counts both branches' modules): its ops stay, so its weights are counted,
    # sharded and placed on a stage like any other
    other = "else_branch" if chosen == "then_branch" else "then_branch"
    idle, _ = _inline_body(branches[other], node, graph, _prefix(node, other), {}, 0)
    return nodes + _outputs_of(body.output, rename, node, node.output, repeat) + idle


def _expand_loop(node: onnx.NodeProto, graph: onnx.GraphProto, shapes: dict, constants: Mapping[str, Any], opset: int,
                 notes: dict[str, list[str]], op_cost: OpForwardCost) -> list[onnx.NodeProto]:
    """The ``Loop``'s body, inlined once, its nodes repeated ``M`` times (:func:`_expand_control_flow`)."""
    repeat = _node_repeat(node)
    where = node.name or "(unnamed)"
    body = _subgraph(node, "body")
    m_name = node.input[0] if node.input else ""
    cond_name = node.input[1] if len(node.input) > 1 else ""
    carried = list(node.input[2:])
    trips = _scalar(constants, m_name)
    if trips is None or trips >= _TRIP_COUNT_SENTINEL or trips < 0:
        why = "it has no trip count (a while loop)" if not m_name or trips is not None else "its trip count is computed at run time"
        trips = None
    else:
        why = "its constant trip count"
    trips = _trips_noted(notes, f"Loop at node {where!r}", trips, why, (
        " (its cost and activations are too low); re-export it with a constant trip count or unrolled "
        "(torch.onnx.export traces Python loops) to cost every iteration"))
    prefix = _prefix(node, "body")
    pre: list[onnx.NodeProto] = []
    bound: dict[str, str] = {}
    names = [i.name for i in body.input]
    if names:
        pre.append(_int64_const(prefix + "iteration", 0, node, repeat))
        bound[names[0]] = prefix + "iteration"
    if len(names) > 1:
        if cond_name:
            bound[names[1]] = cond_name
        else:
            pre.append(_helper_node("Constant", [], [prefix + "cond"], node, repeat,
                                    value=onnx.helper.make_tensor(prefix + "cond", TensorProto.BOOL, [], [True])))
            bound[names[1]] = prefix + "cond"
    bound.update({b: c for b, c in zip(names[2:], carried) if c})
    nodes, rename = _inline_body(body, node, graph, prefix, bound, repeat * trips)
    n_carried = len(carried)
    outs = list(node.output)
    post = _outputs_of(body.output[1:1 + n_carried], rename, node, outs[:n_carried], repeat)
    for src, dst in zip(body.output[1 + n_carried:], outs[n_carried:]):
        if dst:
            post += _stacked(rename.get(src.name, src.name), 0, trips, dst, node, opset, repeat)
    return pre + nodes + post


def _expand_scan(node: onnx.NodeProto, graph: onnx.GraphProto, shapes: dict, constants: Mapping[str, Any], opset: int,
                 notes: dict[str, list[str]], op_cost: OpForwardCost) -> list[onnx.NodeProto]:
    """The ``Scan``'s body, inlined once, its nodes repeated once per element of the scanned
    axis (:func:`_expand_control_flow`)."""
    repeat = _node_repeat(node)
    where = node.name or "(unnamed)"
    if opset < 9:
        raise ModelError(f"Scan at node {where!r} is the opset-8 form (batched, with sequence_lens); re-export with opset 9 or later")
    body = _subgraph(node, "body")
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute if a.type != onnx.AttributeProto.GRAPH}
    num_scan = int(attrs.get("num_scan_inputs", 0))
    n_state = len(node.input) - num_scan
    scan_inputs = list(node.input[n_state:])
    in_axes = list(attrs.get("scan_input_axes") or [0] * num_scan)
    out_axes = list(attrs.get("scan_output_axes") or [0] * (len(body.output) - n_state))
    trips = None
    if scan_inputs:
        shape = (shapes.get(scan_inputs[0]) or (None, None))[0]
        if shape is not None:
            axis = in_axes[0] + len(shape) if in_axes[0] < 0 else in_axes[0]
            trips = shape[axis] if 0 <= axis < len(shape) and isinstance(shape[axis], int) else None
    trips = _trips_noted(notes, f"Scan at node {where!r}", trips,
                         "the length of its scanned axis" if trips is not None else "the length of its scanned axis is unknown",
                         "; re-export it with a static sequence length to cost every iteration")
    prefix = _prefix(node, "body")
    names = [i.name for i in body.input]
    bound = {b: s for b, s in zip(names[:n_state], node.input[:n_state]) if s}
    pre: list[onnx.NodeProto] = []
    if scan_inputs:
        pre.append(_int64_const(prefix + "index", 0, node, repeat * trips))
    for j, (b, x) in enumerate(zip(names[n_state:], scan_inputs)):
        rank = len((shapes.get(x) or (None, None))[0] or ())
        axis = in_axes[j] + rank if in_axes[j] < 0 else in_axes[j]
        pre.append(_helper_node("Gather", [x, prefix + "index"], [prefix + b], node, repeat * trips, axis=axis))
        bound[b] = prefix + b
    nodes, rename = _inline_body(body, node, graph, prefix, bound, repeat * trips)
    outs = list(node.output)
    post = _outputs_of(body.output[:n_state], rename, node, outs[:n_state], repeat)
    for k, (src, dst) in enumerate(zip(body.output[n_state:], outs[n_state:])):
        if not dst:
            continue
        axis = out_axes[k] if k < len(out_axes) else 0
        if axis < 0:  # relative to the stacked output's rank, one more than the element's
            elem = _shape_of(src.type)[0]
            if elem is None:
                raise ModelError(f"Scan at node {where!r}: a negative scan_output_axes needs the body output's rank; re-export with shapes")
            axis += len(elem) + 1
        post += _stacked(rename.get(src.name, src.name), axis, trips, dst, node, opset, repeat)
    return pre + nodes + post


def _subgraph_cost(graph: onnx.GraphProto, outer: Mapping[str, tuple[Any, DType]], constants: Mapping[str, Any],
                   op_cost: OpForwardCost) -> tuple[float, float]:
    """Forward ``(FLOPs, bytes)`` of a subgraph's ops, for choosing an ``If``'s heavier branch.

    Each node is costed by ``op_cost``, the same registered cost rules as in the analysis
    (:func:`dml2comm.load.forward_cost`: lenient, an op without a rule counts its bytes), on the
    shapes ONNX inference wrote into the subgraph; an op whose shapes are unknown counts zero.  A
    nested ``If`` counts its heavier branch, a nested ``Loop``/``Scan`` its body once per known
    trip (else once).  The op rules sit above ``ir`` in the layering, so the caller passes them
    in (:func:`dml2comm.load.load_model`): the choice uses the one cost model, not a second one.
    """

    shapes = dict(outer)
    for vi in (*graph.input, *graph.value_info, *graph.output):
        shapes[vi.name] = _shape_of(vi.type)
    inits = {init.name for init in graph.initializer}
    for init in graph.initializer:
        shapes[init.name] = (tuple(int(d) for d in init.dims), _dtype(init.data_type))

    def tensor(name: str) -> Tensor | None:
        shape, dtype = shapes.get(name, (None, DType.UNDEFINED)) if name else (None, DType.UNDEFINED)
        if shape is None or not all(type(d) is int for d in shape):
            return None
        numel = 1
        for d in shape:
            numel *= d
        return Tensor(name, shape, dtype, is_weight=dtype.is_float and numel > 1 and name in inits)

    flops = bytes_ = 0.0
    for node in graph.node:
        if node.op_type == "Constant":
            continue
        if node.op_type == "If" and node.domain in _ONNX_DOMAINS:
            costs = [_subgraph_cost(a.g, shapes, constants, op_cost) for a in node.attribute if a.type == onnx.AttributeProto.GRAPH]
            f, b = max(costs, default=(0.0, 0.0))
        elif node.op_type in ("Loop", "Scan") and node.domain in _ONNX_DOMAINS:
            f, b = _subgraph_cost(_subgraph(node, "body"), shapes, constants, op_cost)
            trips = _scalar(constants, node.input[0] if node.input else "") if node.op_type == "Loop" else None
            scale = trips if trips is not None and 0 <= trips < _TRIP_COUNT_SENTINEL else 1
            f, b = f * scale, b * scale
        else:
            op = Op(0, node.name, node.op_type, node.domain, tuple(node.input), tuple(node.output),
                    MappingProxyType({a.name: _attr_value(a) for a in node.attribute}))
            ins = [tensor(n) for n in node.input]
            outs = [tensor(n) for n in node.output]
            try:
                f, b = op_cost(op, ins, outs)
            except (Dml2CommError, TypeError, AttributeError, IndexError, KeyError, ZeroDivisionError):
                continue  # a rule that needs a shape inference could not give: counts zero
        flops += f
        bytes_ += b
    return flops, bytes_


# ----------------------------------------------------------------------------- conversion


def _shape_of(vtype: onnx.TypeProto) -> tuple[tuple[int | str, ...] | None, DType]:
    if not vtype.HasField("tensor_type"):
        return None, DType.UNDEFINED
    ttype = vtype.tensor_type
    dtype = _dtype(ttype.elem_type)
    if not ttype.HasField("shape"):
        return None, dtype
    dims: list[int | str] = []
    for d in ttype.shape.dim:
        v = d.dim_value  # 0 when unset: a set dim_value of 0 is a real (empty) axis
        if v > 0 or (v == 0 and d.HasField("dim_value")):
            dims.append(v)
        else:
            dims.append(d.dim_param or "?")
    return tuple(dims), dtype


def _scope(node: onnx.NodeProto) -> str:
    """Module path of a node: dynamo metadata first, then the scope of the model-local function
    call it was inlined from (:func:`_inline_functions`), then its legacy scoped node name."""
    call_scope = None
    for prop in node.metadata_props:
        if prop.key == "pkg.torch.onnx.name_scopes":
            return _innermost_module(_parse_list(prop.value))
        if prop.key == _CALL_SCOPE_KEY:
            call_scope = prop.value
    if call_scope is not None:
        return call_scope
    return _legacy_scope(node.name)


def _node_meta(node: onnx.NodeProto) -> tuple[str, int, tuple[Call, ...], tuple[str, str, str], str]:
    """(:func:`_scope`, :func:`_node_repeat`, :func:`_calls`, the PyTorch operator and FX node
    the exporter made the node from (:func:`_fx_origin`), and the class of the module that ran it
    (:func:`_module_class`)) of a node in one pass over its metadata (the importer reads every
    node's; a 105-layer GPT has some 5,000 nodes)."""
    names_text = call_scope = repeat_text = None
    origin = ("", "", "")
    module_class = ""
    chains: list[str] = []
    for prop in node.metadata_props:
        key = prop.key
        if key == "pkg.torch.onnx.name_scopes":
            if names_text is None:
                names_text = prop.value
        elif key == "pkg.torch.onnx.fx_node":
            origin = _fx_origin(prop.value)
        elif key == "pkg.torch.onnx.class_hierarchy":
            module_class = _module_class(prop.value)
        elif key == _CALL_SCOPE_KEY:
            call_scope = prop.value
        elif key == _REPEAT_KEY:
            if repeat_text is None:
                repeat_text = prop.value
        elif key == _CALLS_KEY:
            chains.append(prop.value)
    if names_text is not None:
        scope = _scope_of_names(names_text)
    elif call_scope is not None:
        scope = call_scope
    else:
        scope = _legacy_scope(node.name)
    return scope, int(repeat_text) if repeat_text is not None else 1, _longest_chain(chains) if chains else (), origin, module_class


@functools.lru_cache(maxsize=4096)
def _module_class(text: str) -> str:
    """The innermost module's class name in a ``pkg.torch.onnx.class_hierarchy`` value, a list
    of qualified class names ending with the node's own operator (``[..., 'transformers.models.
    gemma.modeling_gemma.GemmaRMSNorm', 'aten.mul.Tensor']``): ``"GemmaRMSNorm"``."""
    items = text.rsplit("', '", 2)
    if len(items) < 2:
        return ""
    last = items[-2] if len(items) == 3 else items[0].lstrip("['")
    return last.rsplit(".", 1)[-1]


#: torch.onnx's ``pkg.torch.onnx.fx_node`` text: ``%gelu_1 : [num_users=1] =
#: call_function[target=torch.ops.aten.gelu.default](args = ..., kwargs = {approximate: tanh})``.
_FX_NODE = re.compile(r"%(\S+) : .*?call_function\[target=torch\.ops\.(aten\.[\w.]+)\]")
#: A floating dtype named in the call's arguments (``softmax.int(%x, -1, torch.float32)``).
_FX_DTYPE = re.compile(r"torch\.(float32|float16|bfloat16|float64)\b")


def _fx_origin(text: str) -> tuple[str, str, str]:
    """(the aten operator, the FX node's name, the floating dtype its arguments name) of a
    ``pkg.torch.onnx.fx_node`` value, ``("", "", "")`` for any other node (a placeholder, a call of
    something else)."""
    found = _FX_NODE.match(text)
    if not found:
        return "", "", ""
    dtype = _FX_DTYPE.search(text, found.end())
    return found.group(2), found.group(1), dtype.group(1) if dtype else ""


def _scope_of_names(text: str) -> str:
    """:func:`_innermost_module` of a ``name_scopes`` list, the list without its last entry read
    once (:func:`_scope_prefix`): the nodes of one module share it, and only the last entry (the
    node's own name, or a deeper module) differs."""
    cut = text.rfind(", '")
    last = text[cut + 3:-2] if cut >= 0 and text.endswith("']") else None
    if last is None or "'" in last or "\\" in last:
        return _innermost_module(_parse_list(text))
    scope, closed = _scope_prefix(text[:cut] + "]")
    if closed or not last:
        return scope
    return last if not scope or last.startswith(scope + ".") else scope


@functools.lru_cache(maxsize=4096)
def _scope_prefix(text: str) -> tuple[str, bool]:
    """:func:`_fold_scope` of the list ``text``."""
    return _fold_scope(_parse_list(text))


def _legacy_scope(name: str) -> str:
    """The module path in a TorchScript-exporter scoped node name (``/h.0/attn/MatMul``), else ``""``."""
    if name.startswith("/") and name.count("/") >= 2:
        parts = [p for p in name.split("/") if p]
        return _legacy_path(parts[:-1])
    return ""


def _calls(node: onnx.NodeProto) -> tuple[Call, ...]:
    """The model-local function calls a node was inlined from, outermost first
    (:func:`_inline_functions`); the longest chain recorded on it."""
    return _longest_chain([prop.value for prop in node.metadata_props if prop.key == _CALLS_KEY])


def _longest_chain(texts: list[str]) -> tuple[Call, ...]:
    """The longest of the call chains written as ``texts`` (:data:`_CALLS_KEY` values), the first
    of equal length; a text this module did not write is skipped."""
    best: tuple[Call, ...] = ()
    for text in texts:
        try:
            chain = tuple(Call(str(function), int(index), str(scope)) for function, index, scope in json.loads(text))
        except (ValueError, TypeError):  # not a chain this module wrote
            continue
        if len(chain) > len(best):
            best = chain
    return best


def _legacy_path(parts: list[str]) -> str:
    """Module path from the components of a TorchScript-exporter scoped name.

    Each component names a called module by its path relative to the nearest called ancestor,
    so a child of a called ``Sequential``/``ModuleList`` container repeats the container's name
    (``/features/features.0/Conv``, ``/layer1/layer1.0/conv1/Conv``: torch.onnx's
    ``_jit_pass_onnx_scope`` naming, observed with torch 2.13): a component that extends the one
    before it replaces it, giving ``features.0`` and ``layer1.0.conv1``, the paths
    ``named_modules()`` and the dynamo exporter give.
    """
    out: list[str] = []
    for part in parts:
        if out and part.startswith(out[-1] + "."):
            out[-1] = part
        else:
            out.append(part)
    return ".".join(out)


def _innermost_module(scopes: list[Any]) -> str:
    """The deepest module path of a dynamo ``name_scopes`` list.

    Entries are full dotted paths (``['', 'transformer', 'transformer.h.5', ...]``), possibly
    ending with the operation's own name (``'linear_12'``), which is not a module: keep each
    entry only while it extends the previous one.
    """
    return _fold_scope(scopes)[0]


def _fold_scope(scopes: list[Any]) -> tuple[str, bool]:
    """(the deepest module path of ``scopes``, kept while each entry extends the one before;
    whether an entry that does not extend it stopped the fold before the end)."""
    scope = ""
    for entry in scopes:
        entry = str(entry)
        if not entry:
            continue
        if not scope or entry.startswith(scope + "."):
            scope = entry
        else:
            return scope, True
    return scope, False


#: A Python list of plain single-quoted strings (what the dynamo exporter writes for
#: ``name_scopes``): read by a regular expression, 10x faster than ``ast.literal_eval``.
_PLAIN_STR_LIST = re.compile(r"\[\s*(?:'[^'\\\n]*'\s*(?:,\s*'[^'\\\n]*'\s*)*,?\s*)?\]")
_PLAIN_STR = re.compile(r"'([^'\\\n]*)'")


def _parse_list(text: str) -> list[Any]:
    if _PLAIN_STR_LIST.fullmatch(text):
        return _PLAIN_STR.findall(text)
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return []
    return list(value) if isinstance(value, (list, tuple)) else []


def _attr_value(attr: onnx.AttributeProto) -> Any:
    if attr.type == onnx.AttributeProto.TENSOR:
        t = attr.t
        return {"tensor_dims": tuple(t.dims), "dtype": _dtype(t.data_type).label}
    if attr.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
        return "<subgraph>"
    value = onnx.helper.get_attribute_value(attr)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, list):
        return tuple(v.decode("utf-8", "replace") if isinstance(v, bytes) else v for v in value)
    return value


def _constant_tensor(node: onnx.NodeProto) -> tuple[tuple[int, ...], DType] | None:
    for attr in node.attribute:
        if attr.name == "value" and attr.type == onnx.AttributeProto.TENSOR:
            return tuple(int(d) for d in attr.t.dims), _dtype(attr.t.data_type)
    return None


def _is_parameter(name: str, dtype: DType, shape: tuple[int, ...], consumers: Mapping[str, list[onnx.NodeProto]]) -> bool:
    """Whether the float initializer or ``Constant`` output ``name`` is a trainable parameter.

    It must not be named like a buffer (:data:`_BUFFER_NAME`), have more than one element or be
    named like a module parameter (:data:`_PARAMETER_PATH`: a ``Linear(64, 1)``'s ``head.bias``;
    a generated scalar such as ``onnx::Mul_12`` is a constant), and reach an op of
    :data:`_PARAMETRIC_CONSUMERS` directly or through at most :data:`_WEIGHT_VIEW_DEPTH` view
    ops (:data:`_WEIGHT_VIEWS`).  Only the tensor itself is a parameter; what is computed from it
    alone is a parameter-derived weight (:func:`_parameter_derived`).
    """
    numel = 1
    for d in shape:
        numel *= d
    if not dtype.is_float or _BUFFER_NAME.search(name) or (numel <= 1 and not _PARAMETER_PATH.match(name)):
        return False
    seen, frontier = {name}, [name]
    for _ in range(_WEIGHT_VIEW_DEPTH + 1):
        following: list[str] = []
        for tensor in frontier:
            for node in consumers.get(tensor, ()):
                if node.op_type in _PARAMETRIC_CONSUMERS and _parameter_slot(node, tensor):
                    return True
                if node.op_type in _WEIGHT_VIEWS:
                    following.extend(o for o in node.output if o and o not in seen)
                    seen.update(node.output)
        frontier = following
    return False


def _parameter_slot(node: onnx.NodeProto, tensor: str) -> bool:
    """Whether ``node`` reads ``tensor`` at an input that holds parameters (every input, except
    for the recurrent ops: :data:`_RECURRENT_PARAMETER_INPUTS`)."""
    slots = _RECURRENT_PARAMETER_INPUTS.get(node.op_type)
    return slots is None or any(i in slots for i, name in enumerate(node.input) if name == tensor)


def _feeds_recurrent_weights(name: str, consumers: Mapping[str, list[onnx.NodeProto]]) -> bool:
    """Whether ``name`` reaches the W, R, B or P input of an LSTM/GRU/RNN directly or through
    view ops.  Such a ``Constant`` is a parameter whatever its size: the TorchScript exporter
    writes a recurrent layer's weights as ``Constant`` nodes, gate-reordered by Slice/Concat
    (a GRU(32, 32)'s bias is 192 elements), below :data:`CONSTANT_WEIGHT_MIN_ELEMENTS`."""
    seen, frontier = {name}, [name]
    for _ in range(_WEIGHT_VIEW_DEPTH + 1):
        following: list[str] = []
        for tensor in frontier:
            for node in consumers.get(tensor, ()):
                if node.op_type in _RECURRENT_PARAMETER_INPUTS and _parameter_slot(node, tensor):
                    return True
                if node.op_type in _WEIGHT_VIEWS:
                    following.extend(o for o in node.output if o and o not in seen)
                    seen.update(node.output)
        frontier = following
    return False


_GENERATED_NAME = re.compile(r"^(onnx::|val_|_val_|\d+$)")


def _is_dynamo_export(graph: onnx.GraphProto) -> bool:
    """Whether torch's dynamo exporter wrote ``graph``: it records each node's FX origin in
    ``pkg.torch.onnx.*`` metadata (``name_scopes``, ``class_hierarchy``, ``fx_node``), which the
    TorchScript exporter never writes."""
    return any(prop.key.startswith("pkg.torch.onnx.") for node in graph.node for prop in node.metadata_props)


def _tied_copies(ops: list[Op], tensors: dict[str, Tensor], tie: bool, dynamo: bool = False) -> list[str]:
    """The legacy exporter stores a tied LM head as a second, transposed initializer with a
    generated name (GPT-2: ``onnx::MatMul_2808`` = wte^T).  Values are never read, and an untied
    head (Llama) looks the same, so the user says which: with ``tie`` the copy stays a weight
    (sharded, costed) but is not a parameter of its own; without it, a warning names it.

    A ``dynamo`` export (:func:`_is_dynamo_export`) keeps a tied head as the embedding itself,
    so a transposed table there is an untied head the exporter folded (GPT-NeoX's ``embed_out``):
    no warning, and ``tie`` leaves it a parameter, with a note saying why.

    A tied head is one matrix: where several such weights have one table's transposed shape
    (BERT with h = 512 and 512 positions: every [512, 512] projection looks like the position
    table transposed), none of them is taken for a copy; they stay parameters, without a note."""
    tables: dict[tuple[int, ...], str] = {}
    for op in ops:
        if op.op_type == "Gather" and op.inputs and (t := tensors.get(op.inputs[0])) is not None and t.is_weight and t.rank == 2:
            tables.setdefault(t.shape[::-1], t.name)
    candidates: dict[str, dict[str, Tensor]] = {}  # table -> {weight name: weight}, in graph order
    for op in ops:
        if op.op_type not in ("MatMul", "Gemm") or len(op.inputs) < 2:
            continue
        w = tensors.get(op.inputs[1])
        if w is None or not w.is_weight or w.rank != 2 or w.tied_to or not _GENERATED_NAME.match(w.name):
            continue
        table = tables.get(w.shape)
        if table is None or table == w.name:
            continue
        candidates.setdefault(table, {})[w.name] = w
    notes = []
    for table, by_name in candidates.items():
        if len(by_name) != 1:
            continue
        (w,) = by_name.values()
        if dynamo:
            if tie:
                notes.append(f"weight {w.name!r} has the shape of {table!r} transposed but is a separate LM head: the dynamo "
                             "exporter keeps a tied head as the embedding itself; --tie-embeddings leaves it counted")
            continue
        if tie:
            tensors[w.name] = Tensor(w.name, w.shape, w.dtype, True, False, table)
            notes.append(f"weight {w.name!r} counted as the tied (transposed) copy of {table!r} (--tie-embeddings)")
        else:
            notes.append(
                f"weight {w.name!r} has the shape of {table!r} transposed: if the model ties its LM head to the "
                "embedding (GPT-2 does), the legacy exporter stored a copy; pass --tie-embeddings to count it once"
            )
    return notes


def tied_copies(graph: OpGraph) -> tuple[str, ...]:
    """The weights ``tie_embeddings`` counted as stored copies of an embedding table
    (:func:`_tied_copies`): tied to another parameter, yet no op computes them (a view of a
    parameter, the other kind of tied weight, is its op's output).  Empty without the option, or
    where the export stores no such copy."""
    return tuple(name for name, t in graph.tensors.items() if t.is_weight and t.tied_to is not None and graph.producer(name) is None)


# ----------------------------------------------------------------------------- parameter-derived tensors

#: Ops that compute a weight for its consumer from parameters (and constants) alone: views,
#: layout changes, casts and point-wise arithmetic with constants (Gemma's ``1 + w``).  Their
#: outputs are *parameter-derived*: weights of the graph, never activations.  Lookups
#: (``Gather`` of a position table with constant ids) and contractions are not listed: their
#: outputs are activations of the layer that computes them.
_DERIVING_OPS = frozenset(
    {
        "Identity", "Cast", "CastLike", "Transpose", "Reshape", "Flatten", "Squeeze", "Unsqueeze",
        "Slice", "Split", "Concat", "Expand", "Tile", "Add", "Sub", "Mul", "Div", "Neg", "Sqrt",
        "Reciprocal", "Exp", "Abs", "Pow",
    }
)

#: A PyTorch parameter path: dotted module names ending in the parameter's name
#: (``encoder.layer.3.output.LayerNorm.bias``), or a top-level ``weight``/``bias``.
_PARAMETER_PATH = re.compile(r"^[A-Za-z_]\w*(?:\.\w+)+$|^(?:weight|bias)$")


def _parameter_derived(ops: list[Op], tensors: dict[str, Tensor], consumers: Mapping[str, list[onnx.NodeProto]],
                       warnings: list[str]) -> list[Op]:
    """Mark what is computed only from parameters (and constants), in place in ``tensors``;
    return the ops, with the exporters' de-duplication ``Identity`` nodes removed and every
    weight-preparing op moved next to (and into the module scope of) its first consumer.

    Two kinds of tensor are computed from a parameter alone:

    * **A de-duplicated parameter.**  The TorchScript exporter stores equal-valued parameters
      once: ``torch.onnx.export`` runs ``DeduplicateInitializersByValue``
      (``torch/csrc/jit/passes/onnx/deduplicate_initializers.cpp``), and the graph reads each
      dropped parameter through an ``Identity`` of the kept one, the ``Identity`` output
      carrying the dropped parameter's own name (library-initialised BERT: all LayerNorm
      weights are ones and all biases zeros, so ``encoder.layer.11.output.LayerNorm.bias =
      Identity(embeddings.LayerNorm.bias)``).  ``torch.nn.Module.parameters()`` lists each of
      them (torch's parameter count includes every copy), each has its own gradient and
      optimizer state, and each lives with the module that uses it.  So an ``Identity`` of an
      initializer parameter whose output is named like a parameter path (:data:`_PARAMETER_PATH`:
      dotted, not a generated ``onnx::``/``val_`` name or a ``/scope/op_output_0`` value) is a
      parameter of its own: the node is dropped and its output becomes a weight.
      A *tied* parameter (GPT-2's ``lm_head.weight is transformer.wte.weight``) is one Python
      object, exported once and never de-duplicated, so this never double-counts a tie.
    * **A view of a parameter** (:data:`_DERIVING_OPS` on parameters and constants only,
      chains included: ``Transpose`` of a tied embedding table for the LM head, ``Cast`` to
      the compute type, ``Reshape`` of a Paddle ``Constant``).  It is not a parameter (counted
      once, as its source), it is a weight of the graph (``is_weight``; ``tied_to`` names the
      source parameter; sharded as the source) and every pipeline stage that reads it derives
      it locally from its own copy of the source: it is never sent between stages
      (Megatron-LM keeps the word embedding on the first and last stages and the LM head
      reads it there).  Its op is moved right before its first consumer and takes that
      consumer's module scope, so layer grouping puts it in the consumer's layer.

    An ``Identity`` copy with a generated name is taken as a view: the legacy exporter names
    de-duplicated parameters after the parameter, so a generated name means the exporter made
    the value, not torch.  (A de-duplicated *folded* weight, e.g. two all-zero linear weights
    transposed by constant folding, would be undercounted; see the README's limitations.)
    """
    kept, produced, restored = _restore_deduplicated(ops, tensors, consumers)
    if restored:
        warnings.append(
            f"{len(restored)} parameter(s) the exporter de-duplicated into Identity nodes (equal values) restored as "
            f"parameters of their own, as torch counts them (e.g. {restored[0]!r})"
        )
    deriving = _mark_views(kept, tensors, produced)
    if not deriving:
        return [replace(op, index=i) for i, op in enumerate(kept)] if restored else ops
    return _place_views(kept, deriving)


def _restore_deduplicated(ops: list[Op], tensors: dict[str, Tensor], consumers: Mapping[str, list[onnx.NodeProto]]
                          ) -> tuple[list[Op], set[str], list[str]]:
    """Drop the de-duplication ``Identity`` nodes whose output is named like a parameter, making that
    output a weight (see :func:`_parameter_derived`).  Returns the ops kept, the tensors they
    produce and the parameters restored."""
    produced = {o for op in ops for o in op.outputs if o}
    restored: list[str] = []
    kept: list[Op] = []
    for op in ops:
        if (op.op_type == "Identity" and len(op.inputs) == 1 and len(op.outputs) == 1 and op.outputs[0]
                and op.inputs[0] not in produced):
            src, out = tensors.get(op.inputs[0]), op.outputs[0]
            t = tensors.get(out)
            if (src is not None and src.is_weight and src.tied_to is None and t is not None and _PARAMETER_PATH.match(out)
                    and _is_parameter(out, t.dtype, t.shape, consumers)):
                tensors[out] = Tensor(out, t.shape, t.dtype, is_weight=True)
                produced.discard(out)
                restored.append(out)
                continue
        kept.append(op)
    return kept, produced, restored


def _mark_views(kept: list[Op], tensors: dict[str, Tensor], produced: set[str]) -> set[int]:
    """Views: in topological order, an op of _DERIVING_OPS reading only weights and constants.  Its
    float outputs become weights tied to the source parameter; returns the views' op positions."""
    deriving: set[int] = set()
    for i, op in enumerate(kept):
        if op.op_type not in _DERIVING_OPS or op.domain not in ("", "ai.onnx"):
            continue
        ins = [tensors.get(n) for n in op.inputs if n]
        if not ins or any(t is None or not (t.is_weight or (t.name not in produced and not t.is_input)) for t in ins):
            continue
        sources = [t for t in ins if t is not None and t.is_weight]
        if not sources:
            continue
        root = sources[0].tied_to or sources[0].name
        deriving.add(i)
        for out in op.outputs:
            t = tensors.get(out) if out else None
            if t is not None and t.dtype.is_float:
                tensors[out] = Tensor(out, t.shape, t.dtype, True, False, root)
    return deriving


def _place_views(kept: list[Op], deriving: set[int]) -> list[Op]:
    """Move each weight-preparing op right before its first consumer, into the consumer's scope,
    and renumber the ops."""
    producer = {o: i for i, op in enumerate(kept) for o in op.outputs if o}
    readers: dict[int, int] = {}
    for i, op in enumerate(kept):
        for n in op.inputs:
            j = producer.get(n) if n else None
            if j is not None and j in deriving and j not in readers:
                readers[j] = i
    order: list[tuple[int, str | None]] = []
    placed: set[int] = set()

    def place(i: int, scope: str | None) -> None:
        for n in kept[i].inputs:
            j = producer.get(n) if n else None
            if j is not None and j in deriving and j not in placed:
                place(j, scope if scope is not None else kept[i].scope)
        placed.add(i)
        order.append((i, scope))

    for i, op in enumerate(kept):
        if i in placed or (i in deriving and i in readers):
            continue  # placed by its first consumer
        place(i, None)
    out: list[Op] = []
    for index, (i, scope) in enumerate(order):
        op = kept[i]
        scope = scope if scope is not None and i in deriving else op.scope
        # an op that keeps its place and scope is kept as it is (Op is frozen: equal to its copy)
        out.append(op if index == op.index and scope == op.scope else replace(op, index=index, scope=scope))
    return out


def _gradient_reach(graph: onnx.GraphProto, dtype_of: Mapping[str, DType]) -> set[str] | None:
    """The values a gradient of the graph's float outputs reaches: followed back from each float
    output through float values only (an index, a mask or a comparison carries none) and never
    through :data:`_ZERO_GRADIENT` ops.  A float initializer outside it is a buffer, not a
    parameter, whatever reads it: DeepSeek-V3's router adds ``e_score_correction_bias`` to its
    scores only to pick the experts (``TopK``'s indices), and torch registers it as a buffer.

    ``None`` (no rule) when no output is float or a control-flow op with subgraphs is left (its
    subgraphs read outer values implicitly).  A value of unknown type counts as float, and the
    ops of an ``If`` branch not taken (:func:`_expand_if`: run 0 times) as reaching the loss."""
    def is_float(name: str) -> bool:
        dtype = dtype_of.get(name, DType.UNDEFINED)
        return dtype is DType.UNDEFINED or dtype.is_float

    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for node in graph.node for a in node.attribute):
        return None
    reach = {o.name for o in graph.output if is_float(o.name)}
    if not reach:
        return None
    for node in reversed(graph.node):
        if node.op_type in _ZERO_GRADIENT:
            continue
        # an ``If`` branch not taken (run 0 times) keeps its parameters: reached as if it ran
        if reach.isdisjoint(node.output) and _node_repeat(node) != 0:
            continue
        for n in node.input:
            if n and n not in reach and is_float(n):
                reach.add(n)
    return reach


def _split_merged_initializers(ops: list[Op], tensors: dict[str, Tensor], initializers: set[str],
                               warnings: list[str]) -> list[Op]:
    """Give every module its own copy of a parameter the dynamo exporter merged with equal ones.

    The dynamo exporter stores value-equal initializers once (onnxscript's optimizer, run by
    ``torch.onnx.export(..., optimize=True)``): in a model built from a config every norm weight
    is ones and every bias zeros, and one initializer, named after the first of them
    (``model.layers.0.input_layernorm.weight``), is read by the norms of every layer.  torch
    counts one parameter per module, each with its own gradient and optimizer state, living
    with its module on its pipeline stage; read as one weight it would be undercounted and
    taken for a weight tied across stages.  The readers' ``pkg.torch.onnx.name_scopes`` still
    name their modules (``Op.scope``).

    An initializer weight is taken as merged when ops of at least two modules read it directly,
    all with the same op type at the same input (a norm's ``Mul``, a bias ``Add``) and none of
    them a lookup (``Gather``/``GatherND``), and named like a parameter (:data:`_PARAMETER_PATH`;
    a value the exporter folded, DeBERTa's ``unsqueeze_8``, is not torch's).  A tied weight is read in different roles (GPT-2's
    table by the embedding's ``Gather`` and the head's ``Transpose``/``MatMul``), and a table
    shared by several embeddings (an encoder-decoder's) by lookups, so neither is split.  The
    module the name belongs to (else the first reader's) keeps the initializer; each other
    module reads a new weight named ``<module>.<attribute>``, torch's name for its parameter.
    A merged weight read through a view (a ``Cast``) stays one weight (the README's
    limitations)."""
    readers: dict[str, list[tuple[int, int]]] = {}
    for i, op in enumerate(ops):
        for slot, n in enumerate(op.inputs):
            if n in initializers:
                readers.setdefault(n, []).append((i, slot))
    renamed: dict[int, dict[int, str]] = {}
    split: list[str] = []
    for name, reads in readers.items():
        t = tensors.get(name)
        if t is None or not t.is_weight or t.tied_to is not None:
            continue
        roles = {(ops[i].op_type, ops[i].domain, slot) for i, slot in reads}
        scopes = list(dict.fromkeys(ops[i].scope for i, _ in reads))
        if (len(scopes) < 2 or len(roles) != 1 or "" in scopes or next(iter(roles))[0] in ("Gather", "GatherND")
                or not _PARAMETER_PATH.match(name)):
            continue
        owner, _, leaf = name.rpartition(".")
        keep = owner if owner in scopes else scopes[0]
        copies = {scope: f"{scope}.{leaf or name}" for scope in scopes if scope != keep}
        if any(c in tensors for c in copies.values()):
            continue
        for copy in copies.values():
            tensors[copy] = Tensor(copy, t.shape, t.dtype, is_weight=True)
        for i, slot in reads:
            if ops[i].scope != keep:
                renamed.setdefault(i, {})[slot] = copies[ops[i].scope]
        split.append(name)
    if not split:
        return ops
    warnings.append(
        f"{len(split)} initializer(s) the dynamo exporter merged (equal values) read by several modules: each module "
        f"counts its own parameter, as torch does (e.g. {split[0]!r})"
    )
    out = list(ops)
    for i, slots in renamed.items():
        out[i] = replace(ops[i], inputs=tuple(slots.get(k, n) for k, n in enumerate(ops[i].inputs)))
    return out


#: Ops whose inputs broadcast against each other (numpy's rules, ONNX "multidirectional").
_BROADCASTING_OPS = frozenset({
    "Add", "Sub", "Mul", "Div", "Pow", "Mod", "Max", "Min", "Sum", "Mean", "Where", "Equal", "Less", "LessOrEqual",
    "Greater", "GreaterOrEqual", "And", "Or", "Xor", "BitShift", "PRelu", "Expand",
})


def _broadcast(shapes: list[tuple[int, ...]]) -> bool:
    """Whether the static ``shapes`` broadcast together: aligned from the last axis, each axis's
    sizes are one value or 1."""
    for axis in range(1, max(len(s) for s in shapes) + 1):
        sizes = {s[-axis] for s in shapes if len(s) >= axis} - {1}
        if len(sizes) > 1:
            return False
    return True


def _int_values(graph: onnx.GraphProto, name: str) -> tuple[int, ...] | None:
    """The values of a small constant integer tensor (an initializer or a ``Constant`` node), else None."""
    from onnx import numpy_helper

    tensor = next((init for init in graph.initializer if init.name == name), None)
    if tensor is None:
        node = next((n for n in graph.node if n.op_type == "Constant" and n.output and n.output[0] == name), None)
        attr = next((a for a in node.attribute if a.type == onnx.AttributeProto.TENSOR), None) if node is not None else None
        tensor = attr.t if attr is not None else None
    if tensor is None or tensor.data_location == TensorProto.EXTERNAL or _dtype(tensor.data_type) not in (DType.INT64, DType.INT32):
        return None
    return tuple(int(v) for v in numpy_helper.to_array(tensor).reshape(-1))


def _clashing_shapes(node: onnx.NodeProto, shapes: dict[str, tuple[tuple[int | str, ...] | None, DType]],
                     graph: onnx.GraphProto) -> str | None:
    """How ``node``'s static input shapes contradict its op (the reason shape inference gave it
    no output shape), or None when they do not (or are not all known)."""
    def static(name: str) -> tuple[int, ...] | None:
        shape = shapes.get(name, (None, DType.UNDEFINED))[0]
        return shape if shape is not None and all(isinstance(d, int) for d in shape) else None  # type: ignore[return-value]

    def show(shape: tuple[int, ...]) -> str:
        return "[" + ", ".join(map(str, shape)) + "]"

    if node.domain not in _ONNX_DOMAINS:
        return None
    if node.op_type == "Expand" and len(node.input) == 2:
        data, target = static(node.input[0]), _int_values(graph, node.input[1])
        if data is not None and target is not None and not _broadcast([data, target]):
            return f"takes a tensor of shape {show(data)} to shape {show(target)}, which it does not broadcast to"
        return None
    if node.op_type in _BROADCASTING_OPS:
        ins = [static(n) for n in node.input if n]
        if len(ins) >= 2 and all(s is not None for s in ins) and not _broadcast(ins):  # type: ignore[arg-type]
            return "combines shapes " + " and ".join(show(s) for s in ins if s is not None) + ", which do not broadcast"
        return None
    if node.op_type == "MatMul" and len(node.input) == 2:
        a, b = static(node.input[0]), static(node.input[1])
        if a and b and a[-1] != (b[-2] if len(b) >= 2 else b[0]):
            return f"multiplies shapes {show(a)} and {show(b)}, whose inner sizes differ"
    return None


def _convert(model: onnx.ModelProto, name: str, options: ImportOptions,
             shapes: dict[str, tuple[tuple[int | str, ...] | None, DType]]) -> tuple[OpGraph, list[str]]:
    """The :class:`OpGraph` of a shape-inferred model: its tensors (weights, inputs, every op's
    outputs) and ops, then the rewrites of parameters (merged initializers, parameter-derived
    weights, tied copies); refuses a model whose shapes stay unknown."""
    graph = model.graph
    warnings: list[str] = []
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for inp in node.input:
            if inp:
                consumers.setdefault(inp, []).append(node)
    tensors: dict[str, Tensor] = {}
    initializer_names = _initializer_tensors(graph, shapes, consumers, tensors, warnings)
    unknown: dict[str, list[str]] = {}  # tensor -> its dims that are not numbers
    inputs = _input_tensors(graph, shapes, initializer_names, tensors, unknown)
    no_shape: dict[str, tuple[str, str]] = {}  # op type -> (domain, node) of an output shape inference left out
    ops, unshaped = _node_ops(graph, shapes, consumers, tensors, unknown, no_shape)

    if _is_dynamo_export(graph):
        ops = _split_merged_initializers(ops, tensors, initializer_names, warnings)
    ops = _parameter_derived(ops, tensors, consumers, warnings)
    warnings.extend(_tied_copies(ops, tensors, options.tie_embeddings, _is_dynamo_export(graph)))
    if no_shape:
        _refuse_unshaped(model, shapes, no_shape, unshaped)
    if unknown:
        _refuse_unknown(ops, unknown)
    outputs = tuple(o.name for o in graph.output if o.name in tensors)
    metadata = {p.key: p.value for p in model.metadata_props}
    return OpGraph(name, tuple(ops), tensors, tuple(inputs), outputs, metadata), warnings


def _initializer_tensors(graph: onnx.GraphProto, shapes: Mapping[str, tuple[tuple[int | str, ...] | None, DType]],
                         consumers: Mapping[str, list[onnx.NodeProto]], tensors: dict[str, Tensor], warnings: list[str]) -> set[str]:
    """Add a tensor per initializer to ``tensors``, a weight when it is a parameter a gradient
    reaches; returns the initializers' names."""
    initializer_names = set()
    dtype_of = {n: dtype for n, (_, dtype) in shapes.items()}
    dtype_of.update((init.name, _dtype(init.data_type)) for init in graph.initializer)
    reach = _gradient_reach(graph, dtype_of)
    unreached: list[str] = []
    for init in graph.initializer:
        initializer_names.add(init.name)
        shape = tuple(int(d) for d in init.dims)
        dtype = _dtype(init.data_type)
        weight = _is_parameter(init.name, dtype, shape, consumers)
        if weight and reach is not None and init.name not in reach:
            weight = False
            unreached.append(init.name)
        tensors[init.name] = Tensor(init.name, shape, dtype, is_weight=weight)
    if unreached:
        warnings.append(f"{len(unreached)} float initializer(s) no gradient reaches (buffers, e.g. {unreached[0]!r}): "
                        "not counted as parameters")
    return initializer_names


def _input_tensors(graph: onnx.GraphProto, shapes: Mapping[str, tuple[tuple[int | str, ...] | None, DType]],
                   initializer_names: set[str], tensors: dict[str, Tensor], unknown: dict[str, list[str]]) -> list[str]:
    """Add a tensor per graph input (initializers excepted) with numeric dims to ``tensors`` and
    return their names; the others go to ``unknown``."""
    inputs: list[str] = []
    for vi in graph.input:
        if vi.name in initializer_names:
            continue
        shape, dtype = shapes[vi.name]
        if shape is None or any(not isinstance(d, int) for d in shape):
            unknown.setdefault(vi.name, []).extend(str(d) for d in (shape or ("?",)) if not isinstance(d, int))
            continue
        tensors[vi.name] = Tensor(vi.name, shape, dtype, is_input=True)  # type: ignore[arg-type]
        inputs.append(vi.name)
    return inputs


def _constant_output(node: onnx.NodeProto, shapes: Mapping[str, tuple[tuple[int | str, ...] | None, DType]],
                     consumers: Mapping[str, list[onnx.NodeProto]], tensors: dict[str, Tensor], recurrent: bool = True) -> None:
    """A ``Constant`` node's output: a weight when it is a large float parameter (or feeds a recurrent
    op's weights) that constant folding did not make, else a plain tensor (``recurrent``: whether
    the graph has a recurrent op at all; without one no constant feeds one)."""
    const = _constant_tensor(node)
    out = node.output[0]
    if const is not None:
        shape, dtype = const
        numel = 1
        for d in shape:
            numel *= d
        # (the size or the recurrent weights first: most constants are neither, and are read no further)
        weight = ((numel >= CONSTANT_WEIGHT_MIN_ELEMENTS or (recurrent and _feeds_recurrent_weights(out, consumers)))
                  and not any(p.key == _FOLDED_KEY for p in node.metadata_props) and _is_parameter(out, dtype, shape, consumers))
        tensors[out] = Tensor(out, shape, dtype, is_weight=weight)
    else:
        inferred = shapes.get(out)
        if inferred and inferred[0] is not None and all(isinstance(d, int) for d in inferred[0]):
            tensors[out] = Tensor(out, inferred[0], inferred[1])  # type: ignore[arg-type]
        else:
            tensors[out] = Tensor(out, (), DType.FLOAT)


def _node_ops(graph: onnx.GraphProto, shapes: Mapping[str, tuple[tuple[int | str, ...] | None, DType]],
              consumers: Mapping[str, list[onnx.NodeProto]], tensors: dict[str, Tensor], unknown: dict[str, list[str]],
              no_shape: dict[str, tuple[str, str]]) -> tuple[list[Op], onnx.NodeProto | None]:
    """An :class:`Op` per node (``Constant`` nodes become tensors only), its outputs added to
    ``tensors``; outputs without a shape go to ``no_shape``, with symbolic dims to ``unknown``.
    Returns the ops and the first node with an output shape inference left out."""
    ops: list[Op] = []
    unshaped: onnx.NodeProto | None = None
    no_attrs: Mapping[str, Any] = MappingProxyType({})
    recurrent = any(node.op_type in _RECURRENT_PARAMETER_INPUTS for node in graph.node)
    for node in graph.node:
        op_type, domain = node.op_type, node.domain
        if op_type == "Constant" and domain in ("", "ai.onnx"):
            _constant_output(node, shapes, consumers, tensors, recurrent)
            continue
        outputs = tuple(node.output)
        for out in outputs:
            if not out:
                continue
            shape, dtype = shapes.get(out, (None, DType.UNDEFINED))
            if shape is None:
                no_shape.setdefault(op_type, (domain, node.name or "(unnamed)"))
                unshaped = unshaped or node
                continue
            if not all(type(d) is int for d in shape):
                unknown.setdefault(out, []).extend(str(d) for d in shape if not isinstance(d, int))
                continue
            tensors[out] = Tensor(out, shape, dtype)  # type: ignore[arg-type]
        attrs = MappingProxyType({a.name: _attr_value(a) for a in node.attribute}) if len(node.attribute) else no_attrs
        index = len(ops)
        scope, repeat, calls, (aten, fx, fx_dtype), module_class = _node_meta(node)
        ops.append(Op(index, node.name or f"{op_type}_{index}", op_type, domain, tuple(node.input), outputs, attrs, scope,
                      repeat, calls, aten, fx, fx_dtype, module_class))
    return ops, unshaped


def _refuse_unshaped(model: onnx.ModelProto, shapes: Mapping[str, tuple[tuple[int | str, ...] | None, DType]],
                     no_shape: Mapping[str, tuple[str, str]], unshaped: onnx.NodeProto | None) -> None:
    """Raise :class:`ModelError` for the first op whose output shape inference left out, naming the
    fix: declare a custom op's shapes, fix a Reshape target, re-export an inconsistent graph."""
    graph = model.graph
    op_type, (domain, node_name) = next(iter(no_shape.items()))
    where = f" (domain {domain!r})" if domain not in ("", "ai.onnx") else ""
    if domain not in ("", "ai.onnx"):  # a custom op: only declared, fully numeric shapes size it
        raise ModelError(
            f"ONNX shape inference cannot infer the output of custom op {op_type!r}{where} at node {node_name!r}; "
            "declare its output shapes in the model's value_info with every dim a number for the sizes you bind "
            "(symbolic dims there are dropped once the inputs are bound), or replace the op with standard ONNX ops"
        )
    if op_type == "Reshape":
        raise ModelError(
            f"ONNX shape inference cannot apply the target shape of Reshape at node {node_name!r}: a target holds sizes "
            ">= 0, at most one -1, and multiplies to the input's size (a size below -1 is invalid); fix the target in "
            "the exporting code"
        )
    clash = _clashing_shapes(unshaped, shapes, graph) if unshaped is not None else None
    if clash is not None:
        legacy = model.producer_name == "pytorch" and not _is_dynamo_export(graph)
        raise ModelError(
            f"the export is inconsistent at node {node_name!r}: {op_type} {clash}, so no size you bind and no shape "
            "you declare can make it run (onnxruntime cannot run it either): an op before it computed a wrong shape"
            + ("; the TorchScript exporter (dynamo=False) writes such graphs for interleaved rotary embeddings "
               "(x[..., ::2] and x[..., 1::2] stacked on a new last axis, as Cohere's): re-export with "
               "torch.onnx.export(..., dynamo=True)" if legacy else "; fix it in the exporting code")
        )
    raise ModelError(
        f"ONNX shape inference cannot infer the output of op {op_type!r} at node {node_name!r} from its inputs; "
        "onnx.shape_inference.infer_shapes(model, strict_mode=True) names the inconsistent input or attribute: "
        "fix it in the exporting code"
    )


def _refuse_unknown(ops: list[Op], unknown: Mapping[str, list[str]]) -> None:
    """Raise :class:`UnboundDimError` for internal dims that stay unknown, naming the data-dependent op
    when one sizes them."""
    # Every input dim is bound by now (read_model_proto refuses unbound ones first), so these
    # are computed inside the model; name a few, exporter-named ones before ``unk__N``.
    dims = sorted({d for ds in unknown.values() for d in ds}, key=lambda d: (d.startswith("unk__") or d == "?", d))
    named = ", ".join(dims[:3]) + (f" and {len(dims) - 3} more" if len(dims) > 3 else "")
    first = next(iter(unknown))
    origin = next((op for op in ops if op.op_type in _DATA_DEPENDENT_SIZE and any(o in unknown for o in op.outputs)), None)
    if origin is not None:
        raise UnboundDimError(
            f"op {origin.op_type} at node {origin.name!r} sizes its output from the data ({len(dims)} internal "
            f"dimension(s) follow from it, first tensor {first!r}), so no input size fixes them and static "
            "shapes cannot help; in a mixture of experts this is the token routing: export the experts in "
            "a fixed-size form (every expert applied to all tokens, e.g. transformers' "
            "experts_implementation='batched_mm'), or remove the data-dependent op"
        )
    raise UnboundDimError(
        f"{len(dims)} internal dimension(s) stay unknown although every input dim is bound ({named}; first tensor {first!r}): "
        "the model computes them from data; re-export it with static shapes"
    )
