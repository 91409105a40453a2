"""Pipeline parallelism: contiguous stages that minimise the slowest stage, and their Send/Recv.

Stage assignment solves the linear-partition problem (split a sequence of layer costs into
``p`` contiguous non-empty parts minimising the largest part; Bokhari 1988, "Partitioning
problems in parallel, pipelined and distributed computing") by bisection on the bottleneck
value with a greedy feasibility check (on prefix sums; each probe moves a bound to a value a
range can take), then splits the largest parts until there are
exactly ``p``.  This is what the pipeline-balancing tools of PipeDream (Narayanan et al.,
SOSP'19, Sec. 3.1) and DeepSpeed's ``partition_method=parameters|type`` approximate.

Boundary traffic (Narayanan et al. 2021, Sec. 2.2): per micro-batch, each activation that is
produced before a boundary and read after it is sent forward, and its gradient backward.
Tensors that need no gradient (masks, position tables: they depend only on inputs) are
rebuilt by each stage from the inputs, as Megatron-LM does, and are not sent; neither are
weights (parameters and tensors computed from them alone): a stage reading one holds it
(:func:`sent_activations`), and a parameter held by several stages has its gradient
all-reduced among them (:func:`held_copies`: tied embeddings).  Tensors computed from
parameters and the input *shapes* only (:func:`weight_derived`: T5's relative position bias,
a heads x s x s table that block 0 gathers and every later block adds to its scores) are
rebuilt the same way by each stage that reads them, from its copy of the parameters.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
import itertools
from typing import Mapping, Sequence

from dml2comm.errors import ConfigError
from dml2comm.ir.graph import OpGraph

__all__ = ["partition_layers", "Boundary", "stage_boundaries", "sent_activations", "parameter_layers",
           "parameter_shard_factors", "HeldCopies", "held_copies", "weight_derived"]

#: Ops whose outputs are not a function of their inputs alone (a stage cannot rebuild them) or
#: that the derivation below does not look inside (control flow).
_NOT_REBUILT = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
                          "Bernoulli", "Dropout", "If", "Loop", "Scan"})
#: Ops whose outputs depend on the shape of their input only (every dim is bound at import).
_SHAPE_ONLY = frozenset({"Shape", "Size"})


def partition_layers(costs: Sequence[float], p: int) -> tuple[tuple[int, int], ...]:
    """Split ``costs`` (one per layer) into ``p`` contiguous ranges ``[start, end)``.

    Minimises the largest range sum (to within 1e-9 relative).  Raises ConfigError when
    ``p`` exceeds the number of layers.
    """
    n = len(costs)
    if p > n:
        raise ConfigError(f"--p {p} is larger than the model's {n} layers; use --p {n} or fewer")
    if p == 1:
        return ((0, n),)
    lo = max(costs)
    hi = sum(costs)
    if hi <= 0:
        costs = [1.0] * n
        lo, hi = 1.0, float(n)
    prefix = list(itertools.accumulate(costs, initial=0.0))
    bisect_right = bisect.bisect_right

    def greedy(limit: float, most: int) -> list[tuple[int, int]]:
        """Longest ranges of sum <= limit from the left (at least one layer each); stops once
        there are more than ``most``."""
        parts: list[tuple[int, int]] = []
        start = 0
        while start < n and len(parts) <= most:
            end = bisect_right(prefix, prefix[start] + limit, start + 1) - 1
            if end <= start:  # at least one layer
                end = start + 1
            parts.append((start, end))
            start = end
        return parts

    # bisection on the bottleneck, each probe moving a bound to a value the greedy can reach:
    # a feasible probe lowers ``hi`` to its largest range; an infeasible one raises ``lo`` to
    # the least limit at which one of its ranges would take one more layer
    lo = max(lo, hi / p)
    parts = [(0, n)]
    for _ in range(200):
        if hi - lo <= 1e-12 * hi:
            break
        mid = (lo + hi) / 2
        probe = greedy(mid, p)
        if len(probe) <= p:
            parts = probe
            largest = max([prefix[b] - prefix[a] for a, b in probe])
            hi = mid if mid < largest else largest  # min(mid, largest)
        else:
            least = min([prefix[b + 1] - prefix[a] for a, b in probe if b < n])
            lo = least if mid < least else mid  # max(mid, least)
    tight = greedy(hi, p)  # the greedy at the bottleneck itself: the fullest leading stages
    if len(tight) <= p:
        parts = tight
    sums = [sum(costs[a:b]) for a, b in parts]
    while len(parts) < p:  # split the costliest multi-layer part; never raises the maximum
        k = max((i for i, (a, b) in enumerate(parts) if b - a > 1), key=sums.__getitem__)
        a, b = parts[k]
        best, cut = None, a + 1
        for c in range(a + 1, b):
            worst = max(sum(costs[a:c]), sum(costs[c:b]))
            if best is None or worst < best:
                best, cut = worst, c
        parts[k:k + 1] = [(a, cut), (cut, b)]
        sums[k:k + 1] = [sum(costs[a:cut]), sum(costs[cut:b])]
    return tuple(parts)


@dataclass(frozen=True, slots=True)
class Boundary:
    """Activations crossing from stage ``stage`` to ``stage + 1`` (names; sizes come later)."""

    stage: int
    tensors: tuple[str, ...]


def stage_boundaries(
    producer_stage: dict[str, int], consumer_stages: dict[str, set[int]], needs_grad: frozenset[str], p: int
) -> tuple[Boundary, ...]:
    """For each boundary k (between stage k and k+1), the tensors that cross it."""
    crossing: list[list[str]] = [[] for _ in range(max(p - 1, 0))]
    for name, src in producer_stage.items():
        if name not in needs_grad:
            continue
        last = max(consumer_stages.get(name, ()), default=src)
        for k in range(src, last):
            crossing[k].append(name)
    return tuple(Boundary(k, tuple(sorted(c))) for k, c in enumerate(crossing))


def sent_activations(graph: OpGraph, needs_grad: frozenset[str],
                     rebuilt: Mapping[str, tuple[str, ...]] | None = None) -> frozenset[str]:
    """The tensors a pipeline boundary may carry: those that need a gradient, less every weight.

    A parameter, a stored copy of one and a parameter-derived tensor (a ``Transpose``, ``Cast``
    or ``Reshape`` of a parameter; :attr:`dml2comm.ir.graph.Tensor.tied_to`) are never sent:
    every stage that reads one holds the source parameter and derives the tensor locally, as
    Megatron-LM's last stage holds its own copy of the word embedding for the LM head
    (``LanguageModule.setup_embeddings_and_output_layer``) instead of receiving it.

    Ops that run 0 times (the branch of an ``If`` that is not costed, kept for its parameters:
    :attr:`dml2comm.ir.graph.Op.repeat`) neither send nor receive: their outputs and the
    tensors only they read never cross a boundary.
    """
    live_reads = {n for op in graph.ops if op.repeat for n in op.inputs if n}
    never_made = {n for op in graph.ops if not op.repeat for n in op.outputs if n}
    rebuilt = weight_derived(graph) if rebuilt is None else rebuilt
    return frozenset(n for n in needs_grad if n in live_reads and n not in never_made and n not in rebuilt
                     and not ((t := graph.tensors.get(n)) is not None and t.is_weight))


def weight_derived(graph: OpGraph) -> dict[str, tuple[str, ...]]:
    """Activations computed from parameters and constants alone, with the parameters they come
    from: float tensors no input's *values* reach (an input's shape may: every dim is bound at
    import).  T5's relative position bias is one: block 0 gathers a (heads, s, s) table from its
    ``relative_attention_bias`` weight with bucket indices computed from ``Range(s)``, and every
    later block of the stack adds it to its attention scores (HF ``T5Stack`` passes
    ``position_bias`` on); DeBERTa's normalised relative embeddings are another.

    A pipeline stage that reads one rebuilds it from its own copy of those parameters instead of
    receiving it per micro-batch and sending its gradient back; the copies' gradients are
    all-reduced after the backward pass like a tied embedding's (:func:`held_copies`).  This is
    how Megatron-Core treats position embeddings that are not a layer's: the model, not a
    transformer layer, holds them (``RotaryEmbedding``, T5's ``RelativePositionEmbedding``) and
    every pipeline stage computes them for its own layers.  The few ops that rebuild the tensor
    are costed on its first reader only: they touch (heads, s, s) elements once per micro-batch,
    small next to the attention that adds them.

    Parameters and their stored views (``is_weight``) are not listed: they are never activations.
    Random ops (dropout) and control flow end a derivation; ops that run 0 times are skipped.
    """
    dynamic: set[str] = set(graph.inputs)  # tensors an input's values reach
    sources: dict[str, frozenset[str]] = {}  # static tensors computed from parameters
    out: dict[str, tuple[str, ...]] = {}
    for op in graph.ops:
        names = [n for n in op.inputs if n]
        if op.op_type in _SHAPE_ONLY:
            continue  # static, and no parameter reaches a shape
        if op.op_type in _NOT_REBUILT or not op.repeat or any(n in dynamic for n in names):
            dynamic.update(o for o in op.outputs if o)
            continue
        found: set[str] = set()
        for n in names:
            t = graph.tensors.get(n)
            if t is not None and t.is_weight:
                found.update(graph.parameter_sources(n))
            elif n in sources:
                found.update(sources[n])
        if not found:
            continue
        params = frozenset(found)
        for o in op.outputs:
            t = graph.tensors.get(o) if o else None
            if t is None or t.is_weight:
                continue
            sources[o] = params
            if t.dtype.is_float:
                out[o] = tuple(sorted(params))
    return out


def parameter_layers(graph: OpGraph, layer_of_op: Sequence[int],
                     rebuilt: Mapping[str, tuple[str, ...]] | None = None) -> dict[str, tuple[int, ...]]:
    """Per parameter, the layers that read it directly or through a weight carrying its values
    (a tied copy, a parameter-derived tensor: :meth:`OpGraph.parameter_sources`; an activation
    rebuilt from it: :func:`weight_derived`), ascending.

    The first is the parameter's owner: it counts there.  Every other stage that reads it holds
    a copy (memory, optimizer state) whose gradient is all-reduced with the owner's
    (:func:`held_copies`).  Parameters no op reads are left out."""
    readers: dict[str, set[int]] = {}
    rebuilt = weight_derived(graph) if rebuilt is None else rebuilt
    for op in graph.ops:
        li = layer_of_op[op.index]
        for name in op.inputs:
            if name:
                for src in graph.parameter_sources(name) or rebuilt.get(name, ()):
                    readers.setdefault(src, set()).add(li)
    return {w: tuple(sorted(layers)) for w, layers in readers.items()}


def parameter_shard_factors(graph: OpGraph, weight_factor: Mapping[str, int]) -> dict[str, int]:
    """Per parameter, the tensor-parallel factor it is held with: its own, or that of a weight
    derived from it (a Transpose of the embedding split over the vocabulary for the LM head):
    a parameter is sharded as the weights computed from it."""
    out: dict[str, int] = {}
    for name, factor in weight_factor.items():
        for src in graph.parameter_sources(name):
            out[src] = max(out.get(src, 1), factor)
    return out


@dataclass(frozen=True, slots=True)
class HeldCopies:
    """Parameters held by more than one pipeline stage (tied embeddings)."""

    extra: tuple[float, ...]  # per stage: elements held that another (earlier) stage owns
    extra_local: tuple[float, ...]  # the same per GPU, after tensor parallelism
    groups: tuple[tuple[tuple[int, ...], float], ...]  # (stages holding them, elements per GPU to all-reduce)
    #: per stage: elements per GPU of the gradient sums autograd makes inside the stage, one per
    #: extra layer reading a shared parameter there (a tied embedding read by the embedding and
    #: the LM head of one stage: :func:`dml2comm.cost.compute.shared_gradient_sum_s`)
    summed_local: tuple[float, ...] = ()


def held_copies(shared: Sequence[tuple[Sequence[int], float, float]], stage_of_layer: Sequence[int], p: int) -> HeldCopies:
    """Which stages hold a copy of a parameter another stage owns, and the gradient all-reduce
    that keeps the copies equal.

    ``shared``: per parameter read by more than one layer, (its reader layers ascending, its
    elements, its elements per GPU after tensor parallelism).  A parameter read on stages
    s_0 < s_1 < ... is owned by s_0 and copied on the others; after the backward pass their
    gradients are summed by an all-reduce over one GPU of each of those stages (same data and
    tensor rank): Megatron-LM's *embedding group* of the first and last stage
    (``parallel_state.get_embedding_group``; ``finalize_model_grads`` calls
    ``_allreduce_word_embedding_grads`` after the data-parallel gradient sync and before the
    optimizer step, an all-reduce of the word embedding's gradient, vocab x hidden / t
    elements).  Parameters shared by the same stages are all-reduced together.
    """
    extra = [0.0] * p
    extra_local = [0.0] * p
    groups: dict[tuple[int, ...], float] = {}
    summed_local = [0.0] * p
    for layers, numel, local in shared:
        for li in layers:  # every reader after the first on a stage adds one gradient sum there
            summed_local[stage_of_layer[li]] += local
        for s in {stage_of_layer[li] for li in layers}:
            summed_local[s] -= local
        stages = tuple(sorted({stage_of_layer[li] for li in layers}))
        if len(stages) < 2:
            continue
        for s in stages[1:]:
            extra[s] += numel
            extra_local[s] += local
        groups[stages] = groups.get(stages, 0.0) + local
    return HeldCopies(tuple(extra), tuple(extra_local), tuple(sorted(groups.items())), tuple(summed_local))
