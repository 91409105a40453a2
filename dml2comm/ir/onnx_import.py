"""ONNX file -> :class:`~dml2comm.ir.graph.OpGraph`.  The only module that reads ONNX protobufs.

What it does, in order:

1. Loads the model *without* external data (weights are never read: shapes and dtypes are
   enough), so exports whose weight files are absent work, and so do models over 2 GB.
2. Inlines model-local functions (``onnx.inliner``).
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

Every failure raises a :class:`~dml2comm.errors.Dml2CommError` with a one-line message.
"""

from __future__ import annotations

import ast
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

import onnx
from google.protobuf.message import DecodeError
from onnx import TensorProto

from dml2comm.errors import InputFileError, ModelError, UnboundDimError
from dml2comm.ir.graph import DType, Op, OpGraph, Tensor

__all__ = ["ImportOptions", "load_model", "load_model_proto", "CONTROL_FLOW_OPS"]

#: Protobuf refuses messages over 2 GiB; such models are inferred from their path instead.
PROTO_LIMIT_BYTES = 2**31

#: Constant nodes with at least this many float elements are treated as weights (Paddle-style
#: exports keep parameters in Constant nodes rather than initializers).
CONSTANT_WEIGHT_MIN_ELEMENTS = 4096

CONTROL_FLOW_OPS = frozenset({"If", "Loop", "Scan", "SequenceMap"})

# Initializers that are buffers, not trainable parameters (PyTorch ``register_buffer``):
# BatchNorm running statistics, rotary-embedding tables, position-id ranges, attention masks.
_BUFFER_NAME = re.compile(
    r"(running_mean|running_var|num_batches_tracked|inv_freq|cos_cached|sin_cached|_cos_|_sin_|"
    r"position_ids|token_type_ids|masked_bias|causal_mask|(^|\.)attn\.bias|rotary)",
    re.IGNORECASE,
)

# Op types in which a float initializer input is a learned parameter.
_PARAMETRIC_CONSUMERS = frozenset(
    {
        "MatMul", "Gemm", "Conv", "ConvTranspose", "Gather", "Einsum", "Transpose",
        "LayerNormalization", "BatchNormalization", "InstanceNormalization", "GroupNormalization",
        "RMSNormalization", "SimplifiedLayerNormalization", "SkipLayerNormalization",
        "SkipSimplifiedLayerNormalization", "Add", "Mul", "Sub", "PRelu", "Cast",
        "Attention", "MultiHeadAttention", "Embedding", "EmbedLayerNormalization", "GatherND",
    }
)

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


def _dtype(elem_type: int) -> DType:
    return _DTYPE_BY_ONNX.get(elem_type, DType.UNDEFINED)


@dataclass(frozen=True)
class ImportOptions:
    """How to bind symbolic dims and what to tolerate.

    ``batch_size`` binds axis 0 of every graph input (the micro-batch size); ``seq_len`` binds
    axis 1 of integer token inputs and of rank-3 float inputs; ``dims`` binds by dim name and
    wins over both.  ``lenient`` turns control flow into a warning.
    """

    batch_size: int | None = None
    seq_len: int | None = None
    dims: Mapping[str, int] = field(default_factory=dict)
    lenient: bool = False
    tie_embeddings: bool = False


@dataclass(frozen=True)
class ImportResult:
    graph: OpGraph
    bound_dims: Mapping[str, int]
    model_batch: int | None  # the batch size the model fixes itself, if its axis 0 is static
    warnings: tuple[str, ...]


# ----------------------------------------------------------------------------- loading

Dml2CommErrorTypes = (InputFileError, ModelError, UnboundDimError)


def load_model(path: str | os.PathLike[str], options: ImportOptions | None = None) -> ImportResult:
    """Read ``path`` and return the shape-inferred op graph.

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
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise ModelError(
            f"{p.name!r} is not a readable ONNX model ({_first_line(exc)}); "
            "check that the file is a complete .onnx export"
        ) from exc
    except OSError as exc:
        raise InputFileError(f"cannot read {str(p)!r}: {exc.strerror or exc}") from exc
    if not model.graph.node:
        raise ModelError(
            f"{p.name!r} has no graph nodes: it is empty, truncated or not an ONNX model; re-export it"
        )
    return load_model_proto(model, options, name=p.stem, path_for_large=p if size >= PROTO_LIMIT_BYTES else None)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else type(exc).__name__


def load_model_proto(
    model: onnx.ModelProto,
    options: ImportOptions | None = None,
    name: str | None = None,
    path_for_large: Path | None = None,
) -> ImportResult:
    """Like :func:`load_model` for an in-memory proto (tests build these with onnx.helper)."""
    options = options or ImportOptions()
    warnings: list[str] = []
    model = _copy_without_weight_data(model)
    if model.functions:
        try:
            from onnx import inliner

            model = inliner.inline_local_functions(model)
        except Exception as exc:  # noqa: BLE001 - onnx raises plain exceptions here
            raise ModelError(f"cannot inline the model's local functions: {_first_line(exc)}") from exc
        warnings.append(f"inlined {len(model.functions)} model-local function(s)")
    graph = model.graph
    initializer_names = {init.name for init in graph.initializer}
    bound, model_batch = _bind_input_dims(graph, initializer_names, options)
    _forget_inferred_shapes(graph)
    inferred = _infer(model, path_for_large)
    shapes = _shapes(inferred.graph)
    if _has_unknown_dims(inferred, shapes):
        inferred, folded = _fold_shape_computations(inferred, path_for_large)
        if folded:
            warnings.append(f"folded {folded} shape-computation node(s) into constants after binding the input dims")
        shapes = _shapes(inferred.graph)
    op_graph, more_warnings = _convert(inferred, name or graph.name or "model", options, shapes)
    warnings.extend(more_warnings)
    return ImportResult(op_graph, MappingProxyType(bound), model_batch, tuple(warnings))


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


# ----------------------------------------------------------------------------- dims


def _bind_input_dims(
    graph: onnx.GraphProto, initializer_names: set[str], options: ImportOptions
) -> tuple[dict[str, int], int | None]:
    """Replace symbolic dims of graph inputs with values.  Returns the bindings made."""
    bound: dict[str, int] = {}
    model_batch: int | None = None
    for value in graph.input:
        if value.name in initializer_names or not value.type.HasField("tensor_type"):
            continue
        ttype = value.type.tensor_type
        if not ttype.HasField("shape"):
            continue
        is_int = _dtype(ttype.elem_type) in (DType.INT64, DType.INT32)
        rank = len(ttype.shape.dim)
        for axis, dim in enumerate(ttype.shape.dim):
            if dim.HasField("dim_value") and dim.dim_value > 0:
                if axis == 0 and model_batch is None:
                    model_batch = dim.dim_value
                continue
            label = dim.dim_param
            value_ = None
            if label and label in options.dims:
                value_ = options.dims[label]
            elif label and label in bound:
                value_ = bound[label]
            elif axis == 0 and options.batch_size is not None:
                value_ = options.batch_size
            elif axis == 1 and options.seq_len is not None and ((is_int and rank == 2) or rank == 3):
                value_ = options.seq_len
            elif axis == 0:
                value_ = 1  # documented default: micro-batch size 1 for a symbolic batch axis
            if value_ is not None:
                dim.Clear()
                dim.dim_value = int(value_)
                bound[label or f"{value.name}[{axis}]"] = int(value_)
    return bound, model_batch


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
    """Shape and dtype of every declared or inferred value, by name."""
    return {vi.name: _shape_of(vi.type) for vi in (*graph.input, *graph.value_info, *graph.output)}


def _has_unknown_dims(model: onnx.ModelProto, shapes: dict | None = None) -> bool:
    graph = model.graph
    if shapes is None:
        shapes = _shapes(graph)
    inputs = {vi.name for vi in graph.input}
    for name, (shape, _) in shapes.items():
        if name not in inputs and (shape is None or any(not isinstance(d, int) for d in shape)):
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
    """Module path of a node: dynamo metadata first, legacy scoped node name second."""
    for prop in node.metadata_props:
        if prop.key == "pkg.torch.onnx.name_scopes":
            return _innermost_module(_parse_list(prop.value))
    name = node.name
    if name.startswith("/") and name.count("/") >= 2:
        parts = [p for p in name.split("/") if p]
        return ".".join(parts[:-1])
    return ""


def _innermost_module(scopes: list[Any]) -> str:
    """The deepest module path of a dynamo ``name_scopes`` list.

    Entries are full dotted paths (``['', 'transformer', 'transformer.h.5', ...]``), possibly
    ending with the operation's own name (``'linear_12'``), which is not a module: keep each
    entry only while it extends the previous one.
    """
    scope = ""
    for entry in scopes:
        entry = str(entry)
        if not entry:
            continue
        if not scope or entry.startswith(scope + "."):
            scope = entry
        else:
            break
    return scope


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

    It must have more than one element, not be named like a buffer (:data:`_BUFFER_NAME`) and
    reach an op of :data:`_PARAMETRIC_CONSUMERS` directly or through at most
    :data:`_WEIGHT_VIEW_DEPTH` view ops (:data:`_WEIGHT_VIEWS`).  Only the tensor itself is a
    parameter; the views' outputs are activations of the graph.
    """
    numel = 1
    for d in shape:
        numel *= d
    if not dtype.is_float or numel <= 1 or _BUFFER_NAME.search(name):
        return False
    seen, frontier = {name}, [name]
    for _ in range(_WEIGHT_VIEW_DEPTH + 1):
        following: list[str] = []
        for tensor in frontier:
            for node in consumers.get(tensor, ()):
                if node.op_type in _PARAMETRIC_CONSUMERS:
                    return True
                if node.op_type in _WEIGHT_VIEWS:
                    following.extend(o for o in node.output if o and o not in seen)
                    seen.update(node.output)
        frontier = following
    return False


_GENERATED_NAME = re.compile(r"^(onnx::|val_|_val_|\d+$)")


def _tied_copies(ops: list[Op], tensors: dict[str, Tensor], tie: bool) -> list[str]:
    """The legacy exporter stores a tied LM head as a second, transposed initializer with a
    generated name (GPT-2: ``onnx::MatMul_2808`` = wte^T).  Values are never read, and an untied
    head (Llama) looks the same, so the user says which: with ``tie`` the copy stays a weight
    (sharded, costed) but is not a parameter of its own; without it, a warning names it."""
    tables: dict[tuple[int, ...], str] = {}
    for op in ops:
        if op.op_type == "Gather" and op.inputs and (t := tensors.get(op.inputs[0])) is not None and t.is_weight and t.rank == 2:
            tables.setdefault(t.shape[::-1], t.name)
    notes = []
    for op in ops:
        if op.op_type not in ("MatMul", "Gemm") or len(op.inputs) < 2:
            continue
        w = tensors.get(op.inputs[1])
        if w is None or not w.is_weight or w.rank != 2 or w.tied_to or not _GENERATED_NAME.match(w.name):
            continue
        table = tables.get(w.shape)
        if table is None or table == w.name:
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


def _convert(model: onnx.ModelProto, name: str, options: ImportOptions,
             shapes: dict[str, tuple[tuple[int | str, ...] | None, DType]]) -> tuple[OpGraph, list[str]]:
    graph = model.graph
    warnings: list[str] = []
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for inp in node.input:
            if inp:
                consumers.setdefault(inp, []).append(node)

    tensors: dict[str, Tensor] = {}
    initializer_names = set()
    for init in graph.initializer:
        initializer_names.add(init.name)
        shape = tuple(int(d) for d in init.dims)
        dtype = _dtype(init.data_type)
        tensors[init.name] = Tensor(init.name, shape, dtype, is_weight=_is_parameter(init.name, dtype, shape, consumers))

    inputs: list[str] = []
    unknown: dict[str, list[str]] = {}
    no_shape: dict[str, tuple[str, str]] = {}
    for vi in graph.input:
        if vi.name in initializer_names:
            continue
        shape, dtype = shapes[vi.name]
        if shape is None or any(not isinstance(d, int) for d in shape):
            unknown.setdefault(vi.name, []).extend(str(d) for d in (shape or ("?",)) if not isinstance(d, int))
            continue
        tensors[vi.name] = Tensor(vi.name, shape, dtype, is_input=True)  # type: ignore[arg-type]
        inputs.append(vi.name)

    ops: list[Op] = []
    control_flow: list[str] = []
    no_attrs: Mapping[str, Any] = MappingProxyType({})
    for node in graph.node:
        op_type, domain = node.op_type, node.domain
        if op_type == "Constant" and domain in ("", "ai.onnx"):
            const = _constant_tensor(node)
            out = node.output[0]
            if const is not None:
                shape, dtype = const
                numel = 1
                for d in shape:
                    numel *= d
                folded = any(p.key == _FOLDED_KEY for p in node.metadata_props)
                weight = not folded and numel >= CONSTANT_WEIGHT_MIN_ELEMENTS and _is_parameter(out, dtype, shape, consumers)
                tensors[out] = Tensor(out, shape, dtype, is_weight=weight)
            else:
                inferred = shapes.get(out)
                if inferred and inferred[0] is not None and all(isinstance(d, int) for d in inferred[0]):
                    tensors[out] = Tensor(out, inferred[0], inferred[1])  # type: ignore[arg-type]
                else:
                    tensors[out] = Tensor(out, (), DType.FLOAT)
            continue
        if op_type in CONTROL_FLOW_OPS:
            control_flow.append(f"{op_type} at node {node.name or '(unnamed)'!r}")
        outputs = tuple(node.output)
        for out in outputs:
            if not out:
                continue
            shape, dtype = shapes.get(out, (None, DType.UNDEFINED))
            if shape is None:
                no_shape.setdefault(op_type, (domain, node.name or "(unnamed)"))
                continue
            if not all(type(d) is int for d in shape):
                unknown.setdefault(out, []).extend(str(d) for d in shape if not isinstance(d, int))
                continue
            tensors[out] = Tensor(out, shape, dtype)  # type: ignore[arg-type]
        attrs = MappingProxyType({a.name: _attr_value(a) for a in node.attribute}) if len(node.attribute) else no_attrs
        index = len(ops)
        ops.append(Op(index, node.name or f"{op_type}_{index}", op_type, domain, tuple(node.input), outputs, attrs, _scope(node)))

    warnings.extend(_tied_copies(ops, tensors, options.tie_embeddings))
    if control_flow:
        where = ", ".join(control_flow[:3])
        if not options.lenient:
            raise ModelError(
                f"control flow is not supported ({where}); re-export with loops unrolled "
                "(torch.onnx.export traces Python loops), or pass --lenient to cost each as one memory-bound op"
            )
        warnings.append(f"control flow costed as memory-bound ops without their subgraphs: {where}")

    if no_shape:
        op_type, (domain, node_name) = next(iter(no_shape.items()))
        where = f" (domain {domain!r})" if domain not in ("", "ai.onnx") else ""
        raise ModelError(
            f"ONNX shape inference cannot infer the output of op {op_type!r}{where} at node {node_name!r}; "
            "declare its output shapes in the model's value_info, or replace the op with standard ONNX ops"
        )
    if unknown:
        dims = sorted({d for ds in unknown.values() for d in ds})
        first = sorted(unknown)[:3]
        raise UnboundDimError(
            f"unknown dimensions {', '.join(dims)} remain (e.g. tensors {', '.join(map(repr, first))}); "
            "bind them with --batch-size N, --seq-len N or --dim NAME=VALUE"
        )
    outputs = tuple(o.name for o in graph.output if o.name in tensors)
    metadata = {p.key: p.value for p in model.metadata_props}
    return OpGraph(name, tuple(ops), tensors, tuple(inputs), outputs, metadata), warnings
