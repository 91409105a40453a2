"""What is derived from one imported graph, cached explicitly under typed keys.

An :class:`~dml2comm.ir.graph.OpGraph` is immutable, so what is computed from it and a few
configuration values (its layers, its tensor-parallel shards, every op's cost) is shared by all
the configurations analysed or swept on it.  Each such value is stored in ``graph.derived``
under a *key*: an instance of a frozen dataclass, one small class per cached quantity, whose
fields are exactly the inputs the value depends on besides the graph.  Two keys are equal only
when they are of the same class and every field is equal, so a value can never be read back
for other inputs by a key that was typed differently at another call site (what hand-typed
string tuples invited).

Values that depend on the cluster (its network and topology, not only its GPU) are not stored
on the graph: they live in the cache of the one object that holds the cluster
(:class:`dml2comm.model.FastEvaluator` keeps its stage tables in its own store), so one
imported model evaluated on two clusters gets each cluster's own numbers.

Usage::

    layered = layers_of(graph)                          # one accessor per shared quantity
    table = derived(graph, MyKey(t=2, sp=True), build)  # or any CacheKey with its builder

The keys below are those read by more than one module (the analysis, the sweep and its fast
path); a module's own cached quantities declare their key classes beside their builders
(:mod:`dml2comm.cost.ops`, :mod:`dml2comm.model`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, MutableMapping, TypeVar

from dml2comm.cost.attention import FlashCore, find_flash_cores
from dml2comm.cost.gelu import GeluCall, gelu_calls
from dml2comm.cost.memory import ActivationModel, autocast_dtypes, fp32_islands
from dml2comm.cost.norm import UpcastRmsNorm, castless_rms_norms
from dml2comm.ir.graph import GROUPED_MM, DType, OpGraph
from dml2comm.ir.layers import LayeredGraph, group_layers
from dml2comm.ir.repeats import Collapsed, collapse_repeats
from dml2comm.parallel.config import DTYPES, AttentionKernel, Stack
from dml2comm.parallel.context import AttentionSite, find_attention
from dml2comm.parallel.expert import MoEInfo, find_moe
from dml2comm.parallel.pipeline import parameter_layers, weight_derived
from dml2comm.parallel.tensor import AttentionCore, TensorParallelPlan, find_attention as find_attention_cores, requires_grad, shard_tensor_parallel

__all__ = ["CacheKey", "cached", "derived", "LayersKey", "CollapsedKey", "TensorParallelKey", "NeedsGradKey",
           "ParameterReadersKey", "WeightDerivedKey", "MoEKey", "AttentionSitesKey", "ActivationsKey", "FlashCoresKey",
           "Fp32IslandsKey", "layers_of", "collapsed_of", "tensor_parallel_of", "needs_grad_of", "parameter_readers_of",
           "weight_derived_of", "moe_of", "attention_sites_of", "activation_model_of", "flash_cores_of", "fp32_islands_of", "castless_rms_norms_of", "grouped_products_of",
           "AttentionCoresKey", "attention_cores_of", "GeluCallsKey", "gelu_calls_of"]

T = TypeVar("T")


class CacheKey:
    """Base of every cache key.  Subclasses are ``@dataclass(frozen=True, slots=True)`` with
    one field per input of the cached value (besides the graph or store it is cached on)."""

    __slots__ = ()


def cached(store: MutableMapping[object, object], key: CacheKey, build: Callable[[], T]) -> T:
    """``store[key]``, calling ``build()`` to fill it on the first request.

    Parameters
    ----------
    store
        Where the values live: ``graph.derived`` (values of one graph) or an object's own dict
        (values that also depend on what the object holds, e.g. a cluster).
    key
        A :class:`CacheKey` instance holding every input of the value.
    build
        Computes the value from those inputs.

    Raises
    ------
    TypeError
        ``key`` is not a :class:`CacheKey` (a tuple or a string): the typed keys are the point.
    """
    if not isinstance(key, CacheKey):
        raise TypeError(f"cache keys are CacheKey dataclasses, not {type(key).__name__}: declare a key class for this value")
    try:
        return store[key]  # type: ignore[return-value]
    except KeyError:
        value = store[key] = build()
        return value


def derived(graph: OpGraph, key: CacheKey, build: Callable[[], T]) -> T:
    """``build()`` once per (graph, key): :func:`cached` on ``graph.derived``."""
    return cached(graph.derived, key, build)


# ----------------------------------------------------------------------------- shared keys
@dataclass(frozen=True, slots=True)
class LayersKey(CacheKey):
    """The graph's layers (:func:`dml2comm.ir.layers.group_layers`): the graph alone."""


@dataclass(frozen=True, slots=True)
class CollapsedKey(CacheKey):
    """The graph with long runs of identical blocks collapsed (:func:`dml2comm.ir.repeats.collapse_repeats`)."""


@dataclass(frozen=True, slots=True)
class TensorParallelKey(CacheKey):
    """Tensor-parallel shards (:func:`dml2comm.parallel.tensor.shard_tensor_parallel`)."""

    tp_size: int
    sequence_parallel: bool
    dtype_bytes: int


@dataclass(frozen=True, slots=True)
class NeedsGradKey(CacheKey):
    """Tensors that need a gradient (:func:`dml2comm.parallel.tensor.requires_grad`)."""


@dataclass(frozen=True, slots=True)
class ParameterReadersKey(CacheKey):
    """Per parameter, the layers reading it (:func:`dml2comm.parallel.pipeline.parameter_layers`)."""


@dataclass(frozen=True, slots=True)
class WeightDerivedKey(CacheKey):
    """Activations a pipeline stage rebuilds from parameters (:func:`dml2comm.parallel.pipeline.weight_derived`)."""


@dataclass(frozen=True, slots=True)
class MoEKey(CacheKey):
    """The model's mixture-of-experts layers (:func:`dml2comm.parallel.expert.find_moe`)."""


@dataclass(frozen=True, slots=True)
class AttentionSitesKey(CacheKey):
    """Attention sites for context parallelism (:func:`dml2comm.parallel.context.find_attention`)."""

    seq_len: int | None


@dataclass(frozen=True, slots=True)
class ActivationsKey(CacheKey):
    """Saved-for-backward bytes (:class:`dml2comm.cost.memory.ActivationModel`) on the
    tensor-parallel shard of (t, SP) in ``dtype``, with or without assumed dropout masks, for
    the training stack (eager or fused point-wise ops) and attention kernel."""

    tp_size: int
    sequence_parallel: bool
    dtype: str
    assumed_dropout: bool
    stack: str = Stack.MEGATRON
    attention: str = AttentionKernel.UNFUSED
    autocast: bool = False


@dataclass(frozen=True, slots=True)
class FlashCoresKey(CacheKey):
    """The attention cores that run as flash kernels (:func:`dml2comm.cost.attention.find_flash_cores`)."""


@dataclass(frozen=True, slots=True)
class GeluCallsKey(CacheKey):
    """The ``F.gelu`` calls written as primitives (:func:`dml2comm.cost.gelu.gelu_calls`)."""


@dataclass(frozen=True, slots=True)
class Fp32IslandsKey(CacheKey):
    """Tensors eager code holds in fp32 (:func:`dml2comm.cost.memory.fp32_islands`)."""


@dataclass(frozen=True, slots=True)
class GroupedProductsKey(CacheKey):
    """The routed expert products (:func:`grouped_products_of`)."""


@dataclass(frozen=True, slots=True)
class CastlessRmsNormsKey(CacheKey):
    """RMSNorms whose casts the export dropped (:func:`dml2comm.cost.norm.castless_rms_norms`)."""


# ----------------------------------------------------------------------------- accessors
# ``layered`` arguments: the grouping the caller works on, one per graph (group_layers(graph), or
# for a collapsed graph its Collapsed.layered): the keys leave it out because the graph fixes it.
def layers_of(graph: OpGraph) -> LayeredGraph:
    """:func:`~dml2comm.ir.layers.group_layers` of ``graph``, once."""
    return derived(graph, LayersKey(), lambda: group_layers(graph))


def collapsed_of(graph: OpGraph) -> Collapsed | None:
    """:func:`~dml2comm.ir.repeats.collapse_repeats` of ``graph`` (None: nothing to collapse), once;
    the collapsed graph's :func:`layers_of` is the collapse's own layering (which the fused kernels read)."""

    def build() -> Collapsed | None:
        collapsed = collapse_repeats(graph, layers_of(graph))
        if collapsed is not None:
            derived(collapsed.graph, LayersKey(), lambda: collapsed.layered)
        return collapsed

    return derived(graph, CollapsedKey(), build)


def tensor_parallel_of(graph: OpGraph, tp_size: int, sequence_parallel: bool, dtype_bytes: int) -> TensorParallelPlan:
    """:func:`~dml2comm.parallel.tensor.shard_tensor_parallel` of ``graph``, once per (t, SP, bytes per element);
    the tensors that need a gradient and the attention cores, which every sharding reads, once per graph."""
    return derived(graph, TensorParallelKey(tp_size, sequence_parallel, dtype_bytes),
                   lambda: shard_tensor_parallel(graph, tp_size, sequence_parallel, dtype_bytes, needs_grad_of(graph),
                                                 attention_cores_of(graph)))


@dataclass(frozen=True, slots=True)
class AttentionCoresKey(CacheKey):
    """The attention cores (:func:`dml2comm.parallel.tensor.find_attention`): the graph alone."""


def attention_cores_of(graph: OpGraph) -> tuple[AttentionCore, ...]:
    """:func:`~dml2comm.parallel.tensor.find_attention` of ``graph``, once."""
    return derived(graph, AttentionCoresKey(), lambda: tuple(find_attention_cores(graph)))


def needs_grad_of(graph: OpGraph) -> frozenset[str]:
    """:func:`~dml2comm.parallel.tensor.requires_grad` of ``graph``, once."""
    return derived(graph, NeedsGradKey(), lambda: requires_grad(graph))


def parameter_readers_of(graph: OpGraph, layered: LayeredGraph) -> dict[str, tuple[int, ...]]:
    """:func:`~dml2comm.parallel.pipeline.parameter_layers` of ``graph``, once."""
    return derived(graph, ParameterReadersKey(), lambda: parameter_layers(graph, layered.layer_of_op, weight_derived_of(graph)))


def weight_derived_of(graph: OpGraph) -> dict[str, tuple[str, ...]]:
    """:func:`~dml2comm.parallel.pipeline.weight_derived` of ``graph``, once."""
    return derived(graph, WeightDerivedKey(), lambda: weight_derived(graph))


def moe_of(graph: OpGraph, layered: LayeredGraph) -> MoEInfo | None:
    """:func:`~dml2comm.parallel.expert.find_moe` of ``graph`` (None: no experts), once."""
    return derived(graph, MoEKey(), lambda: find_moe(graph, layered.layer_of_op))


def attention_sites_of(graph: OpGraph, layered: LayeredGraph, seq_len: int | None) -> tuple[AttentionSite, ...]:
    """:func:`~dml2comm.parallel.context.find_attention` of ``graph``, once per sequence length."""
    return derived(graph, AttentionSitesKey(seq_len), lambda: find_attention(graph, layered.layer_of_op, seq_len))


def activation_model_of(graph: OpGraph, tp_size: int, sequence_parallel: bool, dtype: str,
                        assumed_dropout: bool, stack: str = Stack.MEGATRON,
                        attention: str = AttentionKernel.UNFUSED, autocast: bool = False) -> ActivationModel:
    """The :class:`~dml2comm.cost.memory.ActivationModel` of ``graph`` on the (t, SP) shard in
    ``dtype`` (a :data:`~dml2comm.parallel.config.DTYPES` name) for the training ``stack``
    (``pytorch``: eager, no point-wise fusion, fp32 islands) and ``attention`` kernel
    (``flash``: the flash cores keep no scores), an fp32 model under ``torch.autocast(dtype)``
    when ``autocast`` (:func:`~dml2comm.cost.memory.autocasts_activations`: ``--stack pytorch
    --precision amp``), once per those inputs."""
    stack, attention = Stack.of(stack), AttentionKernel.of(attention)

    def build() -> ActivationModel:
        train = DTYPES[dtype]
        tp = tensor_parallel_of(graph, tp_size, sequence_parallel, train.itemsize)
        eager = stack is Stack.PYTORCH
        flash = flash_cores_of(graph) if attention is AttentionKernel.FLASH else ()
        return ActivationModel(graph, [sh.inputs for sh in tp.shards], [sh.outputs for sh in tp.shards], needs_grad_of(graph),
                               train, assumed_dropout=assumed_dropout, eager=eager, flash=flash,
                               fp32=fp32_islands_of(graph) if eager else frozenset(),
                               autocast=autocast_dtypes_of(graph, train, bool(flash)) if autocast and eager else None,
                               gelus=gelu_calls_of(graph) if eager else (), castless=castless_rms_norms_of(graph) if eager else None)

    return derived(graph, ActivationsKey(tp_size, sequence_parallel, dtype, assumed_dropout, stack, attention, autocast), build)


@dataclass(frozen=True, slots=True)
class AutocastDtypesKey(CacheKey):
    """:func:`autocast_dtypes_of`: the autocast dtype, and whether the flash cores' outputs count."""

    low: DType
    flash: bool


def autocast_dtypes_of(graph: OpGraph, low: DType, flash: bool) -> dict[str, DType]:
    """:func:`~dml2comm.cost.memory.autocast_dtypes` of ``graph`` under ``torch.autocast(low)``,
    with the flash cores' outputs in ``low`` when ``flash``, once (the op costs and the activation
    model read the same map)."""
    return derived(graph, AutocastDtypesKey(low, flash),
                   lambda: autocast_dtypes(graph, low, flash_cores_of(graph) if flash else (), gelu_calls_of(graph)))


def flash_cores_of(graph: OpGraph) -> tuple[FlashCore, ...]:
    """:func:`~dml2comm.cost.attention.find_flash_cores` of ``graph``, once."""
    return derived(graph, FlashCoresKey(), lambda: find_flash_cores(graph))


def gelu_calls_of(graph: OpGraph) -> tuple[GeluCall, ...]:
    """:func:`~dml2comm.cost.gelu.gelu_calls` of ``graph``, once."""
    return derived(graph, GeluCallsKey(), lambda: gelu_calls(graph))


def fp32_islands_of(graph: OpGraph) -> frozenset[str]:
    """:func:`~dml2comm.cost.memory.fp32_islands` of ``graph``, once."""
    return derived(graph, Fp32IslandsKey(), lambda: fp32_islands(graph))


def grouped_products_of(graph: OpGraph) -> tuple[int, ...]:
    """The ops the importer read as routed expert products (``Op.aten`` ==
    :data:`~dml2comm.ir.graph.GROUPED_MM`), once."""
    return derived(graph, GroupedProductsKey(), lambda: tuple(op.index for op in graph.ops if op.aten == GROUPED_MM))


def castless_rms_norms_of(graph: OpGraph) -> tuple[UpcastRmsNorm, ...]:
    """:func:`~dml2comm.cost.norm.castless_rms_norms` of ``graph`` (outside its fp32 islands), once."""
    return derived(graph, CastlessRmsNormsKey(), lambda: castless_rms_norms(graph, fp32_islands_of(graph)))
