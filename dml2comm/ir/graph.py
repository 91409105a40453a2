"""dml2comm's own frozen operator graph.

Only :mod:`dml2comm.ir.onnx_import` reads ONNX protobufs; everything after it sees these
classes.  An :class:`OpGraph` is the forward graph of one model replica with every tensor's
shape static (symbolic dims bound at import).  Weights are tensors with ``is_weight=True``;
their values are never read.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

__all__ = ["Call", "DType", "GROUPED_MM", "Tensor", "Op", "OpGraph", "vocab_table"]

#: ``Op.aten`` of a routed expert product the importer reads as the grouped GEMM a training step
#: runs (:func:`dml2comm.ir.onnx_import._group_routed_expert_products`: ``torch._grouped_mm``).
GROUPED_MM = "aten._grouped_mm.default"


class DType(enum.Enum):
    """Element types, named as in the ONNX spec (TensorProto.DataType), with byte sizes."""

    FLOAT = ("float32", 4, True)
    FLOAT16 = ("float16", 2, True)
    BFLOAT16 = ("bfloat16", 2, True)
    DOUBLE = ("float64", 8, True)
    FLOAT8 = ("float8", 1, True)
    INT8 = ("int8", 1, False)
    UINT8 = ("uint8", 1, False)
    INT16 = ("int16", 2, False)
    UINT16 = ("uint16", 2, False)
    INT32 = ("int32", 4, False)
    UINT32 = ("uint32", 4, False)
    INT64 = ("int64", 8, False)
    UINT64 = ("uint64", 8, False)
    BOOL = ("bool", 1, False)
    STRING = ("string", 8, False)
    COMPLEX64 = ("complex64", 8, True)
    COMPLEX128 = ("complex128", 16, True)
    UNDEFINED = ("undefined", 4, False)

    def __init__(self, label: str, itemsize: int, is_float: bool) -> None:
        self.label = label
        self.itemsize = itemsize
        self.is_float = is_float

    @classmethod
    def from_label(cls, label: str) -> "DType":
        for member in cls:
            if member.label == label:
                return member
        raise KeyError(label)


@dataclass(frozen=True, slots=True)
class Tensor:
    """A value in the graph: a static shape and an element type.

    ``shape`` is a tuple of ints (``()`` for scalars).  ``is_weight`` marks weights: trainable
    parameters (initializers or large Constant nodes) and tensors computed from parameters
    alone; ``is_input`` marks graph inputs that carry the micro-batch (read from the host each
    step).  ``tied_to`` names the parameter a weight's values come from when the weight is not
    a parameter of its own: a stored copy of a tied weight (the legacy exporter's transposed LM
    head, ``--tie-embeddings``) or a parameter-derived tensor (a ``Transpose``/``Cast``/
    ``Reshape``... of a parameter, :func:`dml2comm.ir.onnx_import._parameter_derived`).  Such a
    weight is never sent between pipeline stages: a stage reading it holds its source.
    """

    name: str
    shape: tuple[int, ...]
    dtype: DType
    is_weight: bool = False
    is_input: bool = False
    tied_to: str | None = None  # the parameter this weight copies or is derived from: not a parameter itself

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def is_parameter(self) -> bool:
        """A trainable parameter of its own (a weight that copies or derives from none)."""
        return self.is_weight and self.tied_to is None

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    def nbytes_in(self, float_dtype: DType) -> int:
        """Bytes when floating-point values are held in ``float_dtype`` (the training dtype);
        integer and boolean tensors keep their own element size."""
        return self.numel * (float_dtype.itemsize if self.dtype.is_float else self.dtype.itemsize)

    @property
    def rank(self) -> int:
        return len(self.shape)

    def with_shape(self, shape: tuple[int, ...]) -> "Tensor":
        return Tensor(self.name, tuple(shape), self.dtype, self.is_weight, self.is_input, self.tied_to)

    def with_dtype(self, dtype: DType) -> "Tensor":
        return Tensor(self.name, self.shape, dtype, self.is_weight, self.is_input, self.tied_to)


@dataclass(frozen=True, slots=True)
class Call:
    """One call of a model-local function (``export_modules_as_functions``) that the importer
    inlined: ``function`` is the function's name without the exporter's variant suffix
    (``BasicBlock`` for ``BasicBlock.1``), ``index`` numbers the calls of the model (unique),
    ``scope`` is the call's module path (``layer1.0``)."""

    function: str
    index: int
    scope: str


@dataclass(frozen=True, slots=True)
class Op:
    """One ONNX node after shape inference.

    ``inputs``/``outputs`` are tensor names; an omitted optional input is ``""``.
    ``scope`` is the module path the exporter recorded (``transformer.h.5.attn``), or ``""``.
    ``attrs`` holds plain Python values (ints, floats, strings, lists of those).
    ``repeat`` is how many times the op runs per forward pass: 1, or the trip count of the
    ``Loop``/``Scan`` body the importer inlined it from (its cost and the activations it keeps
    are that many times one run's; see :mod:`dml2comm.ir.onnx_import`).
    ``calls`` are the model-local function calls the op was inlined from, outermost first
    (``()`` for an op of the main graph): one call of a function is one instance of a module.
    ``aten`` and ``fx`` name the PyTorch operator the exporter made the node from and that
    call's FX node (``"aten.gelu.default"``, ``"gelu_1"``: torch.onnx's dynamo exporter records
    them in ``pkg.torch.onnx.fx_node``), ``""`` when the export does not say: the nodes of one
    call that the export decomposed (a tanh ``F.gelu`` at opset 18) share them, and eager
    PyTorch runs that call as one kernel.  ``fx_dtype`` is the floating dtype that call names
    (``"float32"`` for transformers' ``softmax(scores, dim=-1, dtype=torch.float32)``), ``""`` if none.
    ``module_class`` is the class of the innermost module that ran the node
    (``"GemmaRMSNorm"``: the last class of ``pkg.torch.onnx.class_hierarchy``), ``""`` if unknown.
    """

    index: int
    name: str
    op_type: str
    domain: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    scope: str = ""
    repeat: int = 1
    calls: tuple[Call, ...] = ()
    aten: str = ""
    fx: str = ""
    fx_dtype: str = ""
    module_class: str = ""

    def attr(self, key: str, default: Any = None) -> Any:
        return self.attrs.get(key, default)


class OpGraph:
    """Forward graph of one replica: ops in topological order and every tensor by name.

    Immutable after construction (mappings are read-only views).
    """

    __slots__ = ("name", "ops", "tensors", "inputs", "outputs", "_producer", "_consumers", "metadata", "derived", "_sources")

    def __init__(
        self,
        name: str,
        ops: tuple[Op, ...],
        tensors: Mapping[str, Tensor],
        inputs: tuple[str, ...],
        outputs: tuple[str, ...],
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        self.name = name
        self.ops = tuple(ops)
        self.tensors = MappingProxyType(dict(tensors))
        self.inputs = tuple(inputs)
        self.outputs = tuple(outputs)
        self.metadata = MappingProxyType(dict(metadata or {}))
        producer: dict[str, int] = {}
        consumers: dict[str, list[int]] = {}
        for op in self.ops:
            for name_ in op.outputs:
                if name_:
                    producer[name_] = op.index
            for name_ in op.inputs:
                if name_:
                    consumers.setdefault(name_, []).append(op.index)
        # Results derived from this (immutable) graph, cached by the analysis and the sweep under
        # typed keys (dml2comm.cost.cache): layer grouping, tensor-parallel shards and per-op costs
        # do not change with d, p, ZeRO or the schedule.
        self.derived: dict[object, object] = {}
        self._producer = MappingProxyType(producer)
        self._consumers = MappingProxyType({k: tuple(v) for k, v in consumers.items()})
        self._sources: dict[str, tuple[str, ...]] = {}

    def producer(self, tensor: str) -> int | None:
        """Index of the op producing ``tensor``, or None for inputs and weights."""
        return self._producer.get(tensor)

    def consumers(self, tensor: str) -> tuple[int, ...]:
        """Indices of ops reading ``tensor``."""
        return self._consumers.get(tensor, ())

    def tensor(self, name: str) -> Tensor | None:
        return self.tensors.get(name) if name else None

    def op_inputs(self, op: Op) -> tuple[Tensor | None, ...]:
        return tuple(self.tensors.get(n) if n else None for n in op.inputs)

    def op_outputs(self, op: Op) -> tuple[Tensor | None, ...]:
        return tuple(self.tensors.get(n) if n else None for n in op.outputs)

    @property
    def weights(self) -> tuple[Tensor, ...]:
        return tuple(t for t in self.tensors.values() if t.is_weight)

    def parameter_sources(self, name: str) -> tuple[str, ...]:
        """The parameters whose values the weight ``name`` carries: itself for a parameter, the
        copied parameter for a stored tied copy, the parameters its producing ops read for a
        parameter-derived tensor (``Concat`` of Q, K and V weights: three); ``()`` for a tensor
        that is not a weight.  A pipeline stage that reads ``name`` holds these."""
        known = self._sources.get(name)
        if known is not None:
            return known
        t = self.tensors.get(name)
        if t is None or not t.is_weight:
            out: tuple[str, ...] = ()
        elif t.tied_to is None:
            out = (name,)
        else:
            prod = self._producer.get(name)
            if prod is None:
                out = (t.tied_to,)
            else:
                found = [s for n in self.ops[prod].inputs if n and n != name for s in self.parameter_sources(n)]
                out = tuple(dict.fromkeys(found)) or (t.tied_to,)
        self._sources[name] = out
        return out

    @property
    def num_params(self) -> int:
        """Trainable parameters; a stored copy of a tied weight counts once."""
        return sum(t.numel for t in self.tensors.values() if t.is_weight and t.tied_to is None)

    def __len__(self) -> int:
        return len(self.ops)

    def __repr__(self) -> str:
        return f"OpGraph({self.name!r}, ops={len(self.ops)}, params={self.num_params})"


def vocab_table(graph: OpGraph) -> str | None:
    """The vocabulary: the largest 2-D weight a ``Gather`` on axis 0 reads (the token embedding), or None."""
    best, rows = None, 0
    for op in graph.ops:
        if op.op_type == "Gather" and int(op.attr("axis", 0)) == 0:
            t = graph.tensor(op.inputs[0])
            if t is not None and t.is_weight and t.rank == 2 and t.shape[0] > rows:
                best, rows = t.name, t.shape[0]
    return best
