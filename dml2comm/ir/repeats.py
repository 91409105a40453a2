"""Collapse long runs of identical blocks to a few representatives (the sweep's fast path).

A 105-block GPT has 105 copies of the same ~40 ops.  Everything the fast path derives per
(micro-batch, t, SP) — tensor-parallel shards, op costs, saved activations — is the same for
every copy once the state entering a block has settled, so it is computed on a graph that
keeps, of each run of structurally identical consecutive blocks ``i..j``, only

- ``i`` (its predecessor is the embedding or another kind of layer),
- ``i + 1`` and ``i + 2`` (successors of an identical block: ``i + 2`` stands for every
  interior block ``i + 2 .. j - 1``),
- ``j`` (its successor is the head: reads of its output may differ),

with ``j``'s inputs from block ``j - 1`` rewired to the same outputs of block ``i + 2``.
Per-layer values of the full model are read through :attr:`Collapsed.layer_map`.

Two layers are *identical* when their ops match one to one in type, domain, attributes and
output shapes and dtypes, and every input is the same kind of reference: an output of the
same op position in the layer itself or in the previous layer, a weight or constant of the
same shape, or the very same graph input or earlier tensor (an attention mask built once).
Anything else (a later layer reading a dropped block's tensor, a graph output inside the
dropped range is kept as is only if its producer is kept) stops the collapse: ``None`` is
returned and the caller uses the whole graph.  The fast path checks that the representatives
give equal per-layer numbers (``i + 1`` and ``i + 2``) before it relies on them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dml2comm.ir.graph import OpGraph
from dml2comm.ir.layers import Layer, LayerKind, LayeredGraph

if TYPE_CHECKING:
    import onnx

__all__ = ["Collapsed", "collapse_repeats", "matches", "rebind", "reduced_model", "MIN_RUN"]

#: Runs shorter than this are kept whole (four blocks are kept of every collapsed run).
MIN_RUN = 6


@dataclass(frozen=True)
class Collapsed:
    """A smaller graph standing for the full one, layer by layer."""

    graph: OpGraph
    layered: LayeredGraph
    layer_map: tuple[int, ...]  # full layer -> reduced layer whose per-layer values it has
    full_index: tuple[int, ...]  # reduced layer -> the full layer it is a copy of
    runs: tuple[tuple[int, int, int], ...]  # (first full block, last full block, reduced index of the first)
    interior: tuple[tuple[int, int], ...]  # per run: (reduced index of i + 1, of i + 2)
    full_params: int = 0  # the full graph's trainable parameters (OpGraph.num_params): what the reduced one stands for


def _freeze(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    return value


def _signatures(graph: OpGraph, layered: LayeredGraph) -> list[tuple]:
    """Per layer: the structural signature described in the module docstring."""
    position: dict[int, tuple[int, int]] = {}  # op index -> (layer, position in layer)
    for layer in layered.layers:
        for q, i in enumerate(layer.op_indices):
            position[i] = (layer.index, q)
    out = []
    for layer in layered.layers:
        ops = []
        for i in layer.op_indices:
            op = graph.ops[i]
            refs = []
            for name in op.inputs:
                if not name:
                    refs.append(("",))
                    continue
                prod = graph.producer(name)
                tensor = graph.tensors.get(name)
                if prod is not None:
                    src_layer, q = position[prod]
                    k = graph.ops[prod].outputs.index(name)
                    if src_layer == layer.index:
                        refs.append(("L", q, k))
                    elif src_layer == layer.index - 1:
                        refs.append(("P", q, k))
                    else:
                        refs.append(("X", name))
                elif tensor is not None and tensor.is_weight:
                    refs.append(("W", tensor.shape, tensor.dtype, tensor.tied_to is not None))
                elif tensor is not None and not tensor.is_input and name not in graph.inputs:
                    refs.append(("C", tensor.shape, tensor.dtype))
                else:
                    refs.append(("X", name))
            outs = tuple((graph.tensors[o].shape, graph.tensors[o].dtype) if o and o in graph.tensors else None
                         for o in op.outputs)
            attrs = tuple(sorted((k, _freeze(v)) for k, v in op.attrs.items())) if op.attrs else ()  # _freeze(dict(op.attrs))
            ops.append((op.op_type, op.domain, attrs, tuple(refs), outs))
        out.append((layer.kind, tuple(ops)))
    return out


def collapse_repeats(graph: OpGraph, layered: LayeredGraph, min_run: int = MIN_RUN) -> Collapsed | None:
    """The collapsed graph, or None when no run of ``min_run`` identical blocks can be collapsed."""
    layers = layered.layers
    sigs = _signatures(graph, layered)
    runs: list[tuple[int, int]] = []
    a = 0
    while a < len(layers):
        b = a
        while b + 1 < len(layers) and layers[a].kind is LayerKind.BLOCK and sigs[b + 1] == sigs[a]:
            b += 1
        # the first block of a run reads another kind of layer: its signature may differ from
        # the second's ("P" refs into the embedding); a run starts at the block after it
        if b - a + 1 >= min_run:
            runs.append((a, b))
        a = b + 1
    if not runs:
        return None
    dropped: set[int] = set()
    for i, j in runs:
        dropped.update(range(i + 3, j))
    kept = [li for li in range(len(layers)) if li not in dropped]
    reduced_of = {li: r for r, li in enumerate(kept)}
    # rename: block j's inputs from block j - 1 -> the same outputs of block i + 2
    rename: dict[str, str] = {}
    for i, j in runs:
        src, dst = layers[j - 1].op_indices, layers[i + 2].op_indices
        for q_src, q_dst in zip(src, dst):
            for o_src, o_dst in zip(graph.ops[q_src].outputs, graph.ops[q_dst].outputs):
                if o_src:
                    rename[o_src] = o_dst
    dropped_ops = {i for li in dropped for i in layers[li].op_indices}
    dropped_tensors = {o for i in dropped_ops for o in graph.ops[i].outputs if o}
    last_block = {j for _, j in runs}
    new_index: dict[int, int] = {}
    ops = []
    for op in graph.ops:
        if op.index in dropped_ops:
            continue
        li = layered.layer_of_op[op.index]
        inputs = op.inputs
        if li in last_block:
            inputs = tuple(rename.get(n, n) for n in inputs)
        if any(n in dropped_tensors for n in inputs):
            return None  # a kept op reads a dropped block other than through the rewiring
        new_index[op.index] = len(ops)
        ops.append(dataclasses.replace(op, index=len(ops), inputs=inputs))
    used = {n for op in ops for n in op.inputs + op.outputs if n} | set(graph.inputs)
    tensors = {name: t for name, t in graph.tensors.items() if name in used}
    outputs = tuple(o for o in graph.outputs if o in used and o not in dropped_tensors)
    reduced = OpGraph(graph.name, tuple(ops), tensors, graph.inputs, outputs, graph.metadata)
    new_layers = []
    layer_of_op = [0] * len(ops)
    for r, li in enumerate(kept):
        layer = layers[li]
        idx = tuple(new_index[i] for i in layer.op_indices)
        new_layers.append(Layer(r, layer.name, layer.kind, idx))
        for i in idx:
            layer_of_op[i] = r
    new_layered = LayeredGraph(reduced, tuple(new_layers), tuple(layer_of_op), layered.source, layered.warnings)
    layer_map = []
    for li in range(len(layers)):
        rep = li
        for i, j in runs:
            if i + 2 <= li < j:
                rep = i + 2
        layer_map.append(reduced_of[rep])
    return Collapsed(reduced, new_layered, tuple(layer_map), tuple(kept),
                     tuple((i, j, reduced_of[i]) for i, j in runs),
                     tuple((reduced_of[i + 1], reduced_of[i + 2]) for i, j in runs), graph.num_params)


def reduced_model(model: "onnx.ModelProto", full: OpGraph, collapsed: Collapsed) -> "onnx.ModelProto | None":
    """The ONNX model of ``collapsed`` (a copy of ``model`` without the dropped blocks' nodes),
    so that other micro-batch sizes are imported — and shape-inferred — at the collapsed size.

    Nodes are matched to the full graph's ops by name; nodes that are not ops (constants, shape
    computations the importer folded) are kept when a kept node needs them.  None when node
    names are missing or repeated (the caller imports the whole model).
    """
    import onnx

    kept_ops = {op.name for op in collapsed.graph.ops}
    all_ops = {op.name for op in full.ops}
    names = [n.name for n in model.graph.node]
    if any(not n for n in names) or len(set(names)) != len(names) or not kept_ops <= set(names):
        return None
    # block j's inputs from block j - 1, as in the collapsed graph
    rename: dict[str, str] = {}
    collapsed_inputs = {op.name: op.inputs for op in collapsed.graph.ops}
    for op in full.ops:
        new = collapsed_inputs.get(op.name)
        if new is not None and new != op.inputs:
            for a, b in zip(op.inputs, new):
                if a != b:
                    rename[a] = b
    needed: set[str] = set(collapsed.graph.outputs)
    keep = [False] * len(names)
    in_order = list(model.graph.node)  # each node (and its name, above) read from the proto once
    for k in range(len(in_order) - 1, -1, -1):
        name = names[k]
        if name in kept_ops:
            keep[k] = True
            needed.update(rename.get(i, i) for i in in_order[k].input if i)
        elif name not in all_ops and any(o in needed for o in in_order[k].output):
            keep[k] = True
            needed.update(i for i in in_order[k].input if i)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    nodes = [n for n, k in zip(graph.node, keep) if k]
    copies = []
    for node in nodes:
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        if node.name in kept_ops:
            for idx, name in enumerate(copy.input):
                if name in rename:
                    copy.input[idx] = rename[name]
        copies.append(copy)
    del graph.node[:]
    graph.node.extend(copies)
    dropped = {i.name for i in graph.initializer if i.name not in needed}
    inits = [i for i in graph.initializer if i.name in needed]
    del graph.initializer[:]
    graph.initializer.extend(inits)
    inputs = [i for i in graph.input if i.name not in dropped]  # old exports list initializers as inputs
    del graph.input[:]
    graph.input.extend(inputs)
    outputs = [o for o in graph.output if o.name in set(collapsed.graph.outputs)]
    del graph.output[:]
    graph.output.extend(outputs)
    del graph.value_info[:]
    return out


def matches(collapsed: Collapsed, layered: LayeredGraph) -> bool:
    """Whether ``layered`` (the grouping of a re-imported collapsed model) has the collapsed
    graph's layers: same kinds and op names, in order."""
    want = collapsed.layered
    if len(want.layers) != len(layered.layers):
        return False
    for a, b in zip(want.layers, layered.layers):
        if a.kind != b.kind or [want.graph.ops[i].name for i in a.op_indices] != [layered.graph.ops[i].name for i in b.op_indices]:
            return False
    return True


def rebind(collapsed: Collapsed, graph: OpGraph, layered: LayeredGraph) -> Collapsed:
    """``collapsed``'s layer maps on another import of the same collapsed model."""
    return dataclasses.replace(collapsed, graph=graph, layered=layered)
