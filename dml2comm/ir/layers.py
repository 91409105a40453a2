"""Group the ops of an :class:`OpGraph` into layers: embedding, repeated blocks, head.

Sources, tried in order:

1. **Scopes** (dynamo ``pkg.torch.onnx.name_scopes`` metadata or legacy scoped node names,
   both already in ``Op.scope``): the repeated container is the numbered module path
   (``transformer.h.5``, ``model.layers.3``, ``bert.encoder.layer.7``,
   ``resnet.encoder.stages.1.layers.0``).  Only instances that apply a weight count: the
   numbered children of an ``nn.Sequential`` of single layers (a stem ``conv, bn, relu``) are
   one convolution and an activation, not a stack of blocks.  The outermost numbered level
   wins, counting the numbered components only (``layer1.0`` is one level, as ``stem.0`` is;
   the digits of ``layer1`` are a name's), and at that level the container covering the most
   ops.  Among nested numbered containers the inner one is
   preferred only when it covers (almost) the same ops as the outer one: ResNet's
   ``stages.N.layers.M`` residual blocks win over ``stages.N``, but Mixtral's
   ``layers.N.block_sparse_moe.experts.M`` do not win over ``layers.N``; nor do numbered
   sub-layers that never repeat inside their parent (T5's ``block.N.layer.M``).
2. **Function calls** (``export_modules_as_functions``: ``Op.calls``): the calls of a
   model-local function called at least twice are its blocks, whatever the modules are named
   (``self.res1 = BasicBlock(...)``), when they cover at least half of the graph and the
   scopes' blocks cover under :data:`NESTED_COVERAGE` of their ops; nested calls as nested
   containers above.
3. **Structure** (graphs with empty names): cut the topological order wherever a single
   activation tensor carries all live state (small side tensors such as masks and position
   tables are ignored), then merge the repeating unit of segments (attention half + MLP half)
   into one block.
4. Otherwise one layer holding everything, with a warning.

Ops before the first block form the ``embedding`` layer, ops after the last the ``head``.
"""

from __future__ import annotations

import functools
import os
import re
from collections import Counter
from dataclasses import dataclass

from dml2comm.choices import Choice
from dml2comm.ir.graph import OpGraph

__all__ = ["Layer", "LayerKind", "LayeredGraph", "group_layers"]

#: An inner numbered container replaces an outer one when it covers this share of its ops.
NESTED_COVERAGE = 0.9
#: A numbered container with a single instance is the block container if it covers this share.
SINGLE_BLOCK_COVERAGE = 0.3
#: A second numbered container at the depth of the first (a decoder beside an encoder) is a
#: stack of blocks too when it repeats and covers this share of the ops.
STACK_COVERAGE = 0.1
#: A repeated unit must cover this share of the ops to define the blocks.
STRUCTURE_MIN_COVERAGE = 0.5
#: Live tensors smaller than this share of the largest live tensor are side inputs, not state.
SIDE_TENSOR_SHARE = 0.25

_NUMBERED = re.compile(r"^\d+$")
_TRAILING_DIGITS = re.compile(r"\d+$")


class LayerKind(Choice):
    """What a layer is (the module docstring): the ops before the first block, a repeated block,
    the ops after the last block, or the whole graph when no blocks were found."""

    EMBEDDING = "embedding"
    BLOCK = "block"
    HEAD = "head"
    OTHER = "other"


@dataclass(frozen=True, slots=True)
class Layer:
    """A contiguous group of ops.  ``kind`` is ``embedding``, ``block``, ``head`` or ``other``
    (a :class:`LayerKind`; a string is converted)."""

    index: int
    name: str
    kind: LayerKind
    op_indices: tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", LayerKind.of(self.kind))


@dataclass(frozen=True)
class LayeredGraph:
    graph: OpGraph
    layers: tuple[Layer, ...]
    layer_of_op: tuple[int, ...]  # op index -> layer index
    source: str  # "scopes", "calls", "structure" or "single"
    warnings: tuple[str, ...] = ()

    @property
    def num_blocks(self) -> int:
        return sum(1 for layer in self.layers if layer.kind is LayerKind.BLOCK)


def group_layers(graph: OpGraph) -> LayeredGraph:
    """Assign every op to a layer (see module docstring)."""
    keys = _block_keys_from_scopes(graph)
    calls = _block_keys_from_calls(graph)
    # the calls replace the scopes' blocks where those miss some of the calls' ops (blocks that
    # are no numbered module); the module paths name the same blocks better where they do not
    if calls is not None and (keys is None or _covered(keys) < NESTED_COVERAGE * _covered(calls)):
        return _assemble(graph, calls, "calls")
    if keys is not None:
        return _assemble(graph, keys, "scopes")
    keys = _block_keys_from_structure(graph)
    if keys is not None:
        return _assemble(graph, keys, "structure")
    layer = Layer(0, graph.name or "model", LayerKind.OTHER, tuple(range(len(graph.ops))))
    return LayeredGraph(
        graph,
        (layer,),
        tuple(0 for _ in graph.ops),
        "single",
        ("no repeated layers found (no scopes and no single-tensor cut points): the model is one layer",),
    )


# ----------------------------------------------------------------------------- scopes


@functools.lru_cache(maxsize=4096)
def _containers(scope: str) -> tuple[tuple[str, str], ...]:
    """(pattern, instance key) for each numbered component: ``a.h.5.x`` -> (``a.h.*``, ``a.h.5``).

    Trailing digits of names are wildcards in the pattern too, so torchvision's
    ``layer1.layer1.0`` and ``layer2.layer2.1`` are instances of one pattern ``layer*.layer*.*``.
    Once per scope (a module's ops share it: the 530B GPT's 4,103 ops have 1,055 scopes).
    """
    parts = scope.split(".") if scope else []
    out = []
    for i, part in enumerate(parts):
        if _NUMBERED.match(part):
            pattern = ".".join(_TRAILING_DIGITS.sub("*", p) for p in parts[: i + 1])
            out.append((pattern, ".".join(parts[: i + 1])))
    return tuple(out)


def _levels(pattern: str) -> int:
    """Numbered levels of a container pattern: ``layer*.*`` has one, as ``stem.*`` has (the
    wildcard in ``layer*`` stands for a name's digits, not for an index)."""
    return pattern.split(".").count("*")


def _block_keys_from_scopes(graph: OpGraph) -> list[str | None] | None:
    per_op = [_containers(op.scope) for op in graph.ops]
    coverage: Counter[str] = Counter()
    instances: dict[str, set[str]] = {}
    weighted: dict[str, set[str]] = {}  # instances holding an op that applies a weight
    for op, conts in zip(graph.ops, per_op):
        applies = bool(conts) and _has_weight(graph, op)
        for pattern, key in conts:
            coverage[pattern] += 1
            instances.setdefault(pattern, set()).add(key)
            if applies:
                weighted.setdefault(pattern, set()).add(key)
    # A numbered container repeats blocks that apply weights; a model with one block still has
    # one that covers most ops.
    candidates = [p for p in coverage if len(weighted.get(p, ())) >= 2 or coverage[p] >= SINGLE_BLOCK_COVERAGE * len(graph.ops)]
    if not candidates:
        return None
    # The outermost numbered container that covers the most ops, and beside it every other
    # stack at that depth: an encoder-decoder's ``encoder.layers.*`` and ``decoder.layers.*``,
    # CLIP's text and vision towers
    depth = min(_levels(p) for p in candidates)
    top = [p for p in candidates if _levels(p) == depth]
    first = max(top, key=lambda p: coverage[p])
    stacks = [first] + [p for p in top if p != first and len(weighted.get(p, ())) >= 2
                        and coverage[p] >= STACK_COVERAGE * len(graph.ops)]
    chosen = []
    for best in stacks:
        # Descend into nested containers that cover almost the same ops.
        while True:
            inner = [
                p
                for p in candidates
                if p.startswith(best + ".") and _levels(p) == _levels(best) + 1
                and coverage[p] >= NESTED_COVERAGE * coverage[best]
            ]
            if not inner:
                break
            candidate = max(inner, key=lambda p: coverage[p])
            if _sub_layers(graph, per_op, candidate):
                break
            best = candidate
        chosen.append(best)
    keys: list[str | None] = []
    for conts in per_op:
        key = next((k for p, k in conts if p in chosen), None)
        keys.append(key)
    return keys


def _covered(keys: list[str | None]) -> int:
    return sum(1 for key in keys if key is not None)


# ----------------------------------------------------------------------------- function calls


def _block_keys_from_calls(graph: OpGraph) -> list[str | None] | None:
    """Blocks from the model-local function calls the ops were inlined from (``Op.calls``).

    A function's calls are instances of one module class, so the calls of a function called at
    least twice (each applying a weight) are blocks, named after the call's module scope.  The
    outermost such function covering the most ops wins; a nested function replaces it when its
    calls cover almost the same ops (:data:`NESTED_COVERAGE`: ``Sequential`` stages whose
    blocks are functions too).  None when there is no such function, or its calls cover less
    than :data:`STRUCTURE_MIN_COVERAGE` of the ops (functions for a small module class, a
    ``Linear``, do not make blocks)."""
    ops = graph.ops
    if not any(op.calls for op in ops):
        return None
    coverage: Counter[tuple[str, ...]] = Counter()
    weighted: dict[tuple[str, ...], set[int]] = {}
    for op in ops:
        applies = bool(op.calls) and _has_weight(graph, op)
        for level in range(len(op.calls)):
            path = tuple(call.function for call in op.calls[: level + 1])
            coverage[path] += 1
            if applies:
                weighted.setdefault(path, set()).add(op.calls[level].index)
    candidates = [path for path in coverage if len(weighted.get(path, ())) >= 2]
    if not candidates:
        return None
    depth = min(len(path) for path in candidates)
    best = max((path for path in candidates if len(path) == depth), key=lambda path: coverage[path])
    while True:
        inner = [path for path in candidates if len(path) == len(best) + 1 and path[: len(best)] == best
                 and coverage[path] >= NESTED_COVERAGE * coverage[best]]
        if not inner:
            break
        best = max(inner, key=lambda path: coverage[path])
    if coverage[best] < STRUCTURE_MIN_COVERAGE * len(ops):
        return None
    level = len(best) - 1
    names: dict[int, str] = {}  # call index -> block name: its scope, numbered when calls share one
    taken: Counter[str] = Counter()
    keys: list[str | None] = []
    for op in ops:
        if len(op.calls) <= level or tuple(call.function for call in op.calls[: level + 1]) != best:
            keys.append(None)
            continue
        call = op.calls[level]
        if call.index not in names:
            base = call.scope or call.function
            names[call.index] = base if not taken[base] else f"{base}#{taken[base]}"
            taken[base] += 1
        keys.append(names[call.index])
    return keys


def _sub_layers(graph: OpGraph, per_op: list[tuple[tuple[str, str], ...]], pattern: str) -> bool:
    """Whether the instances of the numbered container ``pattern`` are the sub-layers of their
    parent block, not blocks of their own (``per_op``: each op's :func:`_containers`).

    T5 numbers the parts of a block: ``encoder.block.3.layer.0`` is its self-attention,
    ``layer.1`` its feed-forward (``decoder.block.3.layer.1`` the cross-attention, ``layer.2``
    the feed-forward).  Blocks nested in a container repeat their modules inside one parent
    (ResNet's ``stages.1.layers.0`` and ``layers.1``, Swin's ``layers.1.blocks.0`` and
    ``blocks.1``); sub-layers never do.  So the children are sub-layers when some parent has
    several and no parent has two with the same module names below them.  A parent with one
    child says nothing either way (the child is then taken as the block, as before).
    """
    modules: dict[str, set[str]] = {}
    for op, conts in zip(graph.ops, per_op):
        for p, key in conts:
            if p == pattern:
                modules.setdefault(key, set()).add(op.scope[len(key) + 1:])
    children: dict[str, list[frozenset[str]]] = {}
    for key, names in modules.items():
        children.setdefault(key.rsplit(".", 1)[0], []).append(frozenset(names))
    if all(len(kids) < 2 for kids in children.values()):
        return False
    return all(len(set(kids)) == len(kids) for kids in children.values())


# ----------------------------------------------------------------------------- structure


#: Normalisations of a convolution's output: their scale and shift are weights, but they belong
#: to the op before them (a transformer's pre-norms open the block they feed, and stay so).
_NORM_OPS = frozenset({"BatchNormalization", "InstanceNormalization", "GroupNormalization"})


def _block_keys_from_structure(graph: OpGraph) -> list[str | None] | None:
    ops = graph.ops
    if len(ops) < 4:
        return None
    last_use: dict[str, int] = {}
    for op in ops:
        for name in op.inputs:
            if name:
                last_use[name] = op.index
    # State is what carries gradients: masks, positions and rotary tables depend on the inputs
    # only and are side tensors however large.
    needs_grad = {w.name for w in graph.weights}
    for op in ops:
        if any(n in needs_grad for n in op.inputs if n):
            needs_grad.update(o for o in op.outputs if o)
    live: dict[str, int] = {}  # activation name -> bytes
    cuts: list[int] = []  # cut after op index
    for op in ops:
        for name in op.inputs:
            if name in live and last_use.get(name) == op.index:
                del live[name]
        for name in op.outputs:
            t = graph.tensors.get(name)
            if t is not None and name in last_use and not t.is_weight and name in needs_grad:
                live[name] = t.nbytes
        if live:
            largest = max(live.values())
            state = [n for n, b in live.items() if b >= SIDE_TENSOR_SHARE * largest]
            if len(state) == 1 and op.index < len(ops) - 1:
                cuts.append(op.index)
    if not cuts:
        return None
    bounds = [0] + [c + 1 for c in cuts] + [len(ops)]
    segments = [(bounds[i], bounds[i + 1]) for i in range(len(bounds) - 1) if bounds[i] < bounds[i + 1]]
    # A segment without a weight op (shape bookkeeping, a lone cast) joins the next one.
    # (each op asked once: a long run of weightless segments is not rescanned from its start)
    weighty = [_has_weight(graph, op) for op in ops]
    merged: list[tuple[int, int]] = []
    pending = None
    for a, b in segments:
        weighted = [j for j in range(a, b) if weighty[j]]  # a pending run before ``a`` has none
        a = pending if pending is not None else a
        if weighted and merged and pending is None and all(ops[j].op_type in _NORM_OPS for j in weighted):
            # a normalisation alone (a BatchNorm after its convolution: the conv's output is the
            # one live tensor on both sides) belongs to the op it normalises
            merged[-1] = (merged[-1][0], b)
        elif weighted:
            merged.append((a, b))
            pending = None
        else:
            pending = a
    if pending is not None:
        if merged:
            merged[-1] = (merged[-1][0], len(ops))
        else:
            merged.append((pending, len(ops)))
    segments = merged
    # Compare segments by their weight ops only: bookkeeping ops (masks, shapes) differ
    # between the first block and the rest in real exports.
    sigs = [tuple(_weight_signature(graph, ops[j]) for j in range(a, b) if weighty[j]) for a, b in segments]
    start, period, reps = _find_repeats(sigs)
    covered = sum(b - a for a, b in segments[start:start + reps * period]) if reps >= 2 else 0
    keys: list[str | None] = [None] * len(ops)
    if covered < STRUCTURE_MIN_COVERAGE * len(ops):
        # No dominant repeated unit (a CNN whose blocks change shape stage by stage): every
        # segment between the first and the last is a block of its own.
        if len(segments) < 3:
            return None
        for r, (a, b) in enumerate(segments[1:-1]):
            for j in range(a, b):
                keys[j] = f"block.{r}"
        return keys
    for r in range(reps):
        first = segments[start + r * period][0]
        last = segments[start + (r + 1) * period - 1][1]
        for j in range(first, last):
            keys[j] = f"block.{r}"
    return keys


def _find_repeats(sigs: list[tuple[str, ...]]) -> tuple[int, int, int]:
    """Longest run of a repeated unit of 1-6 segments: (start, period, repetitions).

    The first (by period, then start) of the runs covering the most segments.  Linear in the
    number of segments: for a period ``p``, copy ``k`` of the unit at ``start`` equals the unit
    exactly when every segment from ``start`` to the end of copy ``k`` equals the one ``p``
    before it (equality is transitive), so the repetitions at ``start`` are one plus the run of
    such matches from ``start`` (``matching``, counted backwards once), divided by ``p``.
    """
    best = (0, 1, 0)
    n = len(sigs)
    for period in range(1, 7):
        if n < 2 * period:
            break
        matching = [0] * (n - period + 1)  # matching[i]: segments j >= i in a row with sigs[j] == sigs[j + period]
        for i in range(n - period - 1, -1, -1):
            matching[i] = matching[i + 1] + 1 if sigs[i] == sigs[i + period] else 0
        for start in range(0, n - 2 * period + 1):
            reps = 1 + matching[start] // period
            if reps >= 2 and reps * period > best[1] * best[2]:
                best = (start, period, reps)
    return best


def _weight_signature(graph: OpGraph, op) -> tuple:
    """Op type and weight shapes: tells an attention half ([h, 3h]) from an MLP half ([h, 4h])."""
    return (op.op_type,) + tuple(graph.tensors[n].shape for n in op.inputs if n and n in graph.tensors and graph.tensors[n].is_weight)


def _has_weight(graph: OpGraph, op) -> bool:
    """Whether ``op`` applies a weight to activations.  Ops that only prepare weights (every
    output a weight: the scripted exporter's ``Slice``/``Concat`` re-ordering of LSTM gates, a
    ``Transpose`` of a tied table) are bookkeeping of their consumer's layer, not a layer."""
    tensors = graph.tensors
    if op.outputs and all(not name or ((t := tensors.get(name)) is not None and t.is_weight) for name in op.outputs):
        return False
    return any(name and (t := tensors.get(name)) is not None and t.is_weight for name in op.inputs)


# ----------------------------------------------------------------------------- assembly


def _between(scope: str, running: str, upcoming: str | None) -> str:
    """The block an op outside every block (but between two) joins: the running block, or the
    next one when the op's module shares more of its path with the next block's stack.  An
    encoder-decoder's decoder embedding (``decoder.embed_tokens``, ``model.decoder.
    layernorm_embedding``) opens the decoder stack, so it joins ``decoder.block.0``; the
    encoder's final norm (``encoder.final_layer_norm``) closes the encoder with its last block.
    Unscoped ops (structure-found blocks, exporter glue) join the running block."""
    if upcoming is None or upcoming == running or not scope:
        return running
    parts = scope.split(".")

    def shared(key: str) -> int:  # leading path components in common
        return len(os.path.commonprefix([parts, key.split(".")]))

    return upcoming if shared(upcoming) > shared(running) else running


def _assemble(graph: OpGraph, keys: list[str | None], source: str) -> LayeredGraph:
    n = len(graph.ops)
    first = next(i for i, k in enumerate(keys) if k is not None)
    last = max(i for i, k in enumerate(keys) if k is not None)
    assigned: list[str] = [""] * n
    current = keys[first]
    following: list[str | None] = [None] * n  # the next block key at or after each op
    upcoming = None
    for i in range(n - 1, -1, -1):
        if keys[i] is not None:
            upcoming = keys[i]
        following[i] = upcoming
    for i in range(n):
        if i < first:
            assigned[i] = "#embedding"
        elif i > last:
            assigned[i] = "#head"
        else:
            if keys[i] is not None:
                current = keys[i]
                assigned[i] = current
            else:
                # ops between blocks join the running block, unless their module belongs to the
                # next block's stack (a decoder's token embedding after the encoder's last block)
                assigned[i] = _between(graph.ops[i].scope, current, following[i])
    order: list[str] = []
    for key in assigned:
        if not order or order[-1] != key:
            order.append(key)
    # A block key seen again after another block means its ops interleave; keep first order.
    seen: dict[str, int] = {}
    layer_names: list[str] = []
    for key in order:
        if key not in seen:
            seen[key] = len(layer_names)
            layer_names.append(key)
    members: dict[str, list[int]] = {k: [] for k in layer_names}
    for i, key in enumerate(assigned):
        members[key].append(i)
    layers = []
    layer_of_op = [0] * n
    for idx, key in enumerate(layer_names):
        kind = LayerKind.EMBEDDING if key == "#embedding" else LayerKind.HEAD if key == "#head" else LayerKind.BLOCK
        name = {"#embedding": "embedding", "#head": "head"}.get(key, key)
        layers.append(Layer(idx, name, kind, tuple(members[key])))
        for i in members[key]:
            layer_of_op[i] = idx
    return LayeredGraph(graph, tuple(layers), tuple(layer_of_op), source)
