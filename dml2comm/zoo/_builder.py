"""Graph builder shared by the zoo models: scoped node names, exporter metadata, external weights.

The zoo writes ONNX graphs that look like what PyTorch's two exporters emit, without torch:

* **Node names** follow the legacy TorchScript exporter (``torch.onnx.export(dynamo=False)``):
  ``/transformer/h.5/attn/c_attn/MatMul``, the op type suffixed ``_1``, ``_2`` ... when it repeats
  in one scope, outputs named ``<node name>_output_<i>``.  Each scope segment is the module's name
  relative to its nearest non-container ancestor, so a ``ModuleList`` child reads ``h.5`` and a
  ``Sequential`` child reads ``layer1/layer1.0`` (as in torchvision exports:
  ``/layer1/layer1.0/conv1/Conv``).
* **Node metadata** follows the dynamo exporter (``torch.onnx.export(dynamo=True)``), which stores
  on every node, as ``repr()`` of Python lists (format checked against public dynamo exports and
  the tests of tools that parse them, e.g. onnxscript's ``graph_view_utils`` tests):

  - ``pkg.torch.onnx.name_scopes``: ``['', 'transformer', 'transformer.h.5', ...,
    'transformer.h.5.attn.c_attn', 'linear_12']`` -- cumulative module paths from the root ``''``,
    the last entry the FX node's own name;
  - ``pkg.torch.onnx.class_hierarchy``: the aligned class names, the last entry the ATen target
    (``'aten.linear.default'``);
  - ``namespace``: ``': <root class>/transformer: <GPT2Model class>/...`` ending in
    ``'/linear_12: aten.linear.default'`` (``<full scope>: <class>`` pairs joined by ``/``).

  The FX node names are synthetic (``<aten op>_<n>``, numbered over the graph as FX does); a
  grouping pass should read the module entries (all but the last).  All ONNX nodes decomposed
  from one ATen call (the MatMul and Add of one ``nn.Linear``) share one FX name.
* **Weights** are initializers whose data live in a file that is never written:
  ``data_location = EXTERNAL`` with ``location``/``offset``/``length`` entries pointing into
  ``<model name>.weights.bin``.  ``dims`` and ``data_type`` are exact, so parameter counts and
  bytes come straight from the protos.  Load saved zoo models with
  ``onnx.load(path, load_external_data=False)``.
* **Constants** (reshape targets, scales, epsilon, masks' shapes) are small ``Constant`` nodes in
  the scope that uses them, as the legacy exporter emits them; the largest is RoPE's
  ``inv_freq`` (head_dim / 2 floats), so no constant is mistaken for a weight.  Their FX entry
  is ``_tensor_constant_<n>`` / ``aten.lift_fresh_copy.default``, what a ``torch.tensor``
  literal in ``forward`` becomes in FX.

References
----------
PyTorch, ``torch/onnx/_internal/exporter`` (dynamo metadata keys) and
``torch/csrc/jit/passes/onnx/naming.cpp`` (scoped node names).
ONNX IR spec, "External Tensor Data" (``docs/ExternalData.md``).
"""

from __future__ import annotations

import contextlib
import json
import math
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper

from dml2comm import __version__
from dml2comm.errors import ConfigError

__all__ = [
    "DTYPES",
    "OPSET",
    "IR_VERSION",
    "GraphBuilder",
    "check_positive",
    "check_flag",
    "check_divides",
    "check_choice",
    "check_name",
    "resolve_dtype",
    "model_metadata",
    "split_heads",
    "scaled_scores",
    "merge_heads",
]

OPSET = 18
"""Default-domain opset of every zoo model (LayerNormalization needs >= 17; Split's
``num_outputs`` and ReduceMean's ``axes`` input need 18)."""

IR_VERSION = 10
"""IR version 10 (ONNX 1.16) is the first with ``NodeProto.metadata_props``; it is what the
dynamo exporter writes, and the onnx 1.23 checker accepts it."""

DTYPES: dict[str, int] = {
    "fp32": TensorProto.FLOAT,
    "fp16": TensorProto.FLOAT16,
    "bf16": TensorProto.BFLOAT16,
}
"""Element type of weights and activations, by the names of dml2comm's ``--dtype`` flag."""

# Most negative finite value of each float type: torch.finfo(dtype).min, which HF models use
# for masked attention scores.  bf16: -(2 - 2**-7) * 2**127.
_FINFO_MIN: dict[int, float] = {
    TensorProto.FLOAT: float(np.finfo(np.float32).min),
    TensorProto.FLOAT16: float(np.finfo(np.float16).min),
    TensorProto.BFLOAT16: -(2.0 - 2.0**-7) * 2.0**127,
}

# ONNX op type -> (FX node base name, ATen target) the dynamo exporter records for it when the
# op is not part of a larger ATen call (those pass ``fx=`` explicitly).
_ATEN: dict[str, tuple[str, str]] = {
    "Add": ("add", "aten.add.Tensor"),
    "BatchNormalization": (
        "_native_batch_norm_legit_no_training",
        "aten._native_batch_norm_legit_no_training.default",
    ),
    "Cast": ("_to_copy", "aten._to_copy.default"),
    "Concat": ("cat", "aten.cat.default"),
    "Constant": ("_tensor_constant", "aten.lift_fresh_copy.default"),
    "ConstantOfShape": ("ones", "aten.ones.default"),
    "Conv": ("conv2d", "aten.conv2d.default"),
    "Cos": ("cos", "aten.cos.default"),
    "Div": ("div", "aten.div.Tensor"),
    "Erf": ("erf", "aten.erf.default"),
    "Expand": ("expand", "aten.expand.default"),
    "Flatten": ("flatten", "aten.flatten.using_ints"),
    "Gather": ("embedding", "aten.embedding.default"),
    "GatherElements": ("gather", "aten.gather.default"),
    "Gemm": ("linear", "aten.linear.default"),
    "GlobalAveragePool": ("adaptive_avg_pool2d", "aten.adaptive_avg_pool2d.default"),
    "LayerNormalization": ("layer_norm", "aten.layer_norm.default"),
    "MatMul": ("matmul", "aten.matmul.default"),
    "MaxPool": ("max_pool2d", "aten.max_pool2d.default"),
    "Mul": ("mul", "aten.mul.Tensor"),
    "Neg": ("neg", "aten.neg.default"),
    "Pow": ("pow", "aten.pow.Tensor_Scalar"),
    "Range": ("arange", "aten.arange.start"),
    "Reciprocal": ("reciprocal", "aten.reciprocal.default"),
    "ReduceMean": ("mean", "aten.mean.dim"),
    "Relu": ("relu", "aten.relu.default"),
    "Reshape": ("view", "aten.view.default"),
    "ScatterElements": ("scatter_add", "aten.scatter_add.default"),
    "Sigmoid": ("sigmoid", "aten.sigmoid.default"),
    "Sin": ("sin", "aten.sin.default"),
    "Softmax": ("softmax", "aten._softmax.default"),
    "Dropout": ("dropout", "aten.dropout.default"),
    "Split": ("split", "aten.split.Tensor"),
    "Sqrt": ("sqrt", "aten.sqrt.default"),
    "Sub": ("sub", "aten.sub.Tensor"),
    "Tanh": ("tanh", "aten.tanh.default"),
    "TopK": ("topk", "aten.topk.default"),
    "Transpose": ("permute", "aten.permute.default"),
    "Trilu": ("tril", "aten.tril.default"),
    "Unsqueeze": ("unsqueeze", "aten.unsqueeze.default"),
    "Where": ("where", "aten.where.self"),
}

NAME_SCOPES_KEY = "pkg.torch.onnx.name_scopes"
CLASS_HIERARCHY_KEY = "pkg.torch.onnx.class_hierarchy"
NAMESPACE_KEY = "namespace"


# --------------------------------------------------------------------------------------------
# Parameter validation (boundary checks; messages name the problem and the fix)
# --------------------------------------------------------------------------------------------


def check_positive(**values: int) -> None:
    """Raise :class:`ConfigError` unless every value is an ``int`` (not ``bool``) above zero."""
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(
                f"{name}={value!r} is not an integer; pass a positive whole number for {name}"
            )
        if value <= 0:
            raise ConfigError(f"{name}={value} must be positive; pass {name} >= 1")


def check_flag(**values: bool) -> None:
    """Raise :class:`ConfigError` unless every value is a ``bool``."""
    for name, value in values.items():
        if not isinstance(value, bool):
            raise ConfigError(f"{name}={value!r} is not a boolean; pass True or False for {name}")


def check_divides(
    divisor_name: str, divisor: int, dividend_name: str, dividend: int
) -> None:
    """Raise :class:`ConfigError` unless ``divisor`` divides ``dividend``."""
    if dividend % divisor:
        options = [k for k in range(1, dividend + 1) if dividend % k == 0]
        near = min(options, key=lambda k: (abs(k - divisor), k))
        raise ConfigError(
            f"{divisor_name}={divisor} does not divide {dividend_name}={dividend}; "
            f"choose {divisor_name} among the divisors of {dividend_name} (nearest: {near})"
        )


def check_choice(name: str, value: object, choices: Sequence[object]) -> None:
    """Raise :class:`ConfigError` unless ``value`` is one of ``choices``."""
    if value not in choices:
        listed = ", ".join(repr(c) for c in choices)
        raise ConfigError(f"{name}={value!r} is not supported; choose one of {listed}")


def check_name(name: str) -> None:
    """Raise :class:`ConfigError` unless ``name`` can be a file stem (``<name>.weights.bin``)."""
    if not isinstance(name, str) or not name or name.startswith(".") or any(
        c in name for c in "/\\\0"
    ):
        raise ConfigError(
            f"name={name!r} cannot name a weights file; use letters, digits, '-', '_' or '.'"
        )


def resolve_dtype(dtype: str, allowed: Sequence[str] = tuple(DTYPES)) -> int:
    """``TensorProto`` element type for a ``--dtype`` name, or :class:`ConfigError`."""
    check_choice("dtype", dtype, allowed)
    return DTYPES[dtype]


def model_metadata(kind: str, config: dict[str, object]) -> dict[str, str]:
    """``ModelProto.metadata_props``: the zoo kind and its resolved parameters as JSON."""
    return {"dml2comm.zoo.kind": kind, "dml2comm.zoo.config": json.dumps(config, sort_keys=True)}


# --------------------------------------------------------------------------------------------
# Builder
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Scope:
    """One open module scope: its dotted path, legacy name prefix and dynamo metadata prefix."""

    full: str  # "transformer.h.5.attn" ("" at the root)
    prefix: str  # "/transformer/h.5/attn/" ("/" at the root)
    scopes: tuple[str, ...]  # ("", "transformer", "transformer.h.5", "transformer.h.5.attn")
    classes: tuple[str, ...]  # aligned class names
    namespace: str  # ": GPT2LMHeadModel/transformer: GPT2Model/..."


class GraphBuilder:
    """Accumulates nodes and external-data initializers of one zoo model.

    Parameters
    ----------
    name:
        Graph name; the weights file is ``<name>.weights.bin``.
    root_class:
        Fully qualified class name of the root module (first ``class_hierarchy`` entry).
    dtype:
        ``TensorProto`` element type of weights and float activations.
    """

    def __init__(self, name: str, root_class: str, dtype: int) -> None:
        self.name = name
        self.dtype = dtype
        self.np_dtype = helper.tensor_dtype_to_np_dtype(dtype)
        self.itemsize = int(np.dtype(self.np_dtype).itemsize)
        self.finfo_min = _FINFO_MIN[dtype]
        self.weights_file = f"{name}.weights.bin"
        # Nodes and initializers are written straight into the final ModelProto: protobuf
        # ``extend``/``make_graph`` would copy every message once more.
        self._model = onnx.ModelProto()
        self._graph = self._model.graph
        self._offset = 0
        self._stack: list[_Scope] = [
            _Scope("", "/", ("",), (root_class,), f": {root_class}")
        ]
        self._node_counts: dict[tuple[str, str], int] = {}
        self._fx_counts: dict[str, int] = {}
        self._const_cache: dict[tuple[int, tuple[int, ...], bytes], TensorProto] = {}
        self._weight_names: set[str] = set()

    # ---- scopes --------------------------------------------------------------------------

    @contextlib.contextmanager
    def scope(self, attr: str, cls: str, segment: str | None = None) -> Iterator[None]:
        """Enter the submodule ``attr`` (path relative to the current module) of class ``cls``.

        ``segment`` is the legacy exporter's name for this level when it differs from ``attr``:
        children of an ``nn.Sequential`` keep the container's name (``layer1.0``).
        """
        parent = self._stack[-1]
        full = f"{parent.full}.{attr}" if parent.full else attr
        seg = attr if segment is None else segment
        self._stack.append(
            _Scope(
                full=full,
                prefix=f"{parent.prefix}{seg}/",
                scopes=parent.scopes + (full,),
                classes=parent.classes + (cls,),
                namespace=f"{parent.namespace}/{full}: {cls}",
            )
        )
        try:
            yield
        finally:
            self._stack.pop()

    def fx(self, base: str, target: str) -> tuple[str, str]:
        """Allocate one FX node name (``linear_3``) for ONNX nodes decomposed from one ATen call."""
        k = self._fx_counts.get(base, 0)
        self._fx_counts[base] = k + 1
        return (base if k == 0 else f"{base}_{k}", target)

    # ---- nodes ---------------------------------------------------------------------------

    def node(
        self,
        op_type: str,
        inputs: Sequence[str],
        *,
        n_out: int = 1,
        outputs: Sequence[str] | None = None,
        fx: tuple[str, str] | None = None,
        **attrs: object,
    ) -> list[str]:
        """Append one node in the current scope and return its output names."""
        sc = self._stack[-1]
        key = (sc.prefix, op_type)
        k = self._node_counts.get(key, 0)
        self._node_counts[key] = k + 1
        name = f"{sc.prefix}{op_type}" if k == 0 else f"{sc.prefix}{op_type}_{k}"
        if outputs is None:
            outs = [f"{name}_output_{i}" for i in range(n_out)]
        else:
            outs = list(outputs)
        fx_name, target = fx if fx is not None else self.fx(*_ATEN[op_type])

        n = self._graph.node.add()
        n.op_type = op_type
        n.name = name
        n.input.extend(inputs)
        n.output.extend(outs)
        for attr_name, value in attrs.items():
            n.attribute.append(helper.make_attribute(attr_name, value))
        md = n.metadata_props
        e = md.add()
        e.key = NAME_SCOPES_KEY
        e.value = repr([*sc.scopes, fx_name])
        e = md.add()
        e.key = CLASS_HIERARCHY_KEY
        e.value = repr([*sc.classes, target])
        e = md.add()
        e.key = NAMESPACE_KEY
        e.value = f"{sc.namespace}/{fx_name}: {target}"
        return outs

    def op(
        self, op_type: str, *inputs: str, fx: tuple[str, str] | None = None, **attrs: object
    ) -> str:
        """Append a single-output node and return its output name."""
        return self.node(op_type, inputs, fx=fx, **attrs)[0]

    def const(self, values: object, dtype: int | None = None) -> str:
        """Append a ``Constant`` node holding ``values`` (default element type: the model's)."""
        dt = self.dtype if dtype is None else dtype
        arr = np.asarray(values, dtype=helper.tensor_dtype_to_np_dtype(dt))
        key = (dt, arr.shape, arr.tobytes())
        tensor = self._const_cache.get(key)
        if tensor is None:
            tensor = onnx.numpy_helper.from_array(arr)
            self._const_cache[key] = tensor
        return self.op("Constant", value=tensor)

    def dropout(self, x: str, ratio: float) -> str:
        """Training-mode ``Dropout`` with its mask output (what a training step keeps for the
        backward pass); ``ratio`` 0 returns ``x`` unchanged."""
        if ratio <= 0:
            return x
        out, _mask = self.node(
            # the ratio is float32: opset 18 Dropout takes no bfloat16 ratio (T1)
            "Dropout", [x, self.const(ratio, TensorProto.FLOAT), self.const(True, TensorProto.BOOL)], n_out=2
        )
        return out

    def const_i64(self, values: object) -> str:
        """``Constant`` of int64 values (shapes, axes, indices)."""
        return self.const(values, TensorProto.INT64)

    # ---- tensors -------------------------------------------------------------------------

    def weight(self, attr: str, shape: Sequence[int], dtype: int | None = None) -> str:
        """Add an external-data initializer named ``<current module path>.<attr>``.

        Use this for trainable parameters and for buffers alike (``running_mean``); the name
        tells them apart.  Returns the initializer name.
        """
        full = self._stack[-1].full
        name = f"{full}.{attr}" if full else attr
        return self.weight_named(name, shape, dtype)

    def weight_named(self, name: str, shape: Sequence[int], dtype: int | None = None) -> str:
        """Add an external-data initializer with an explicit full name."""
        if name in self._weight_names:
            raise ValueError(f"zoo builder bug: initializer {name!r} added twice")
        self._weight_names.add(name)
        dt = self.dtype if dtype is None else dtype
        itemsize = (
            self.itemsize if dt == self.dtype
            else int(np.dtype(helper.tensor_dtype_to_np_dtype(dt)).itemsize)
        )
        length = math.prod(shape) * itemsize
        t = self._graph.initializer.add()
        t.name = name
        t.data_type = dt
        t.dims.extend(shape)
        t.data_location = TensorProto.EXTERNAL
        for key, value in (
            ("location", self.weights_file),
            ("offset", str(self._offset)),
            ("length", str(length)),
        ):
            e = t.external_data.add()
            e.key = key
            e.value = value
        self._offset += length
        return name

    def add_input(self, name: str, elem_type: int, dims: Sequence[int | str]) -> str:
        """Declare a graph input; string dims become ``dim_param`` (symbolic)."""
        self._graph.input.append(helper.make_tensor_value_info(name, elem_type, list(dims)))
        return name

    def add_output(self, name: str, elem_type: int, dims: Sequence[int | str]) -> str:
        """Declare a graph output (the producing node must write ``name``)."""
        self._graph.output.append(helper.make_tensor_value_info(name, elem_type, list(dims)))
        return name

    # ---- common modules ------------------------------------------------------------------

    def linear(self, x: str, in_features: int, out_features: int, bias: bool) -> str:
        """``nn.Linear`` on a rank >= 3 input as exporters emit it: MatMul [in, out] (+ Add bias).

        The weight is stored already transposed, ``[in_features, out_features]`` (the exporter
        folds the Transpose of torch's ``[out, in]`` weight into the initializer).
        """
        fx = self.fx("linear", "aten.linear.default")
        w = self.weight("weight", (in_features, out_features))
        y = self.op("MatMul", x, w, fx=fx)
        if bias:
            b = self.weight("bias", (out_features,))
            y = self.op("Add", y, b, fx=fx)
        return y

    def layer_norm(self, x: str, width: int, eps: float) -> str:
        """``nn.LayerNorm(width)`` as one LayerNormalization (opset 17+) with weight and bias."""
        w = self.weight("weight", (width,))
        b = self.weight("bias", (width,))
        return self.op("LayerNormalization", x, w, b, axis=-1, epsilon=eps)

    def causal_mask(self, seq_len: int) -> str:
        """Boolean lower-triangular ``[s, s]`` mask (True where a query may attend a key).

        ``ConstantOfShape`` + ``Trilu`` keeps the graph small for any ``s`` (GPT-2's ``bias``
        buffer and HF's causal masks are the same lower triangle).
        """
        shape = self.const_i64([seq_len, seq_len])
        true = helper.make_tensor("value", TensorProto.BOOL, [1], [True])
        ones = self.op("ConstantOfShape", shape, value=true)
        return self.op("Trilu", ones, upper=0)

    # ---- result --------------------------------------------------------------------------

    def model(self, doc: str, metadata: dict[str, str]) -> onnx.ModelProto:
        """Finish and return the ModelProto (opset 18, IR 10); the builder is spent afterwards."""
        model = self._model
        model.graph.name = self.name
        model.ir_version = IR_VERSION
        model.opset_import.append(helper.make_opsetid("", OPSET))
        model.producer_name = "dml2comm.zoo"
        model.producer_version = __version__
        model.doc_string = doc
        helper.set_model_props(model, metadata)
        return model


def scaled_scores(b: GraphBuilder, q: str, k: str, v: str, heads: int, head_dim: int) -> tuple[str, str]:
    """Split Q, K and V into heads (K transposed for the product) and form ``Q K^T / sqrt(d)``:
    the score tensor and V's heads, as GPT-2's and BERT's eager attention write them."""
    shape = b.const_i64([0, 0, heads, head_dim])
    q = split_heads(b, q, shape, [0, 2, 1, 3])
    k = split_heads(b, k, shape, [0, 2, 3, 1])
    v = split_heads(b, v, shape, [0, 2, 1, 3])
    scores = b.op("MatMul", q, k)
    return b.op("Div", scores, b.const(math.sqrt(head_dim))), v


def split_heads(b: GraphBuilder, x: str, shape: str, perm: list[int]) -> str:
    """``[b, s, n*d] -> [b, s, n, d]`` (Reshape whose target copies dims with ``0``), Transpose.

    ``0`` rather than ``-1`` keeps the symbolic batch dim inferable before it is bound.
    """
    return b.op("Transpose", b.op("Reshape", x, shape), perm=perm)


def merge_heads(b: GraphBuilder, x: str, width: int) -> str:
    """``[b, n, s, d] -> [b, s, n*d]``: Transpose then Reshape to ``[0, 0, width]``."""
    x = b.op("Transpose", x, perm=[0, 2, 1, 3])
    return b.op("Reshape", x, b.const_i64([0, 0, width]))
