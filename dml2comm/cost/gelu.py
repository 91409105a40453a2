"""``F.gelu`` calls that an export wrote as primitives: eager PyTorch runs each as one kernel.

PyTorch's ``F.gelu(x)`` (``approximate="none"``: ``0.5 x (1 + erf(x / sqrt 2))``; ``"tanh"``:
``0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))``) is one aten operator, ``aten::gelu``:
one CUDA kernel that reads x and writes the output, and one backward kernel,
``gelu_backward(grad, self, approximate)``, that reads the output gradient and x and writes
x's gradient; autograd keeps x alone (derivatives.yaml, ``gelu``).  ONNX before opset 20 has no
``Gelu`` operator, so torch.onnx writes it as primitives (torchlib ``aten_gelu``; the
TorchScript exporter's ``gelu`` symbolic): ``Div``/``Mul``, ``Erf``, ``Add``, ``Mul`` (exact) or
``Pow``, ``Mul``, ``Add``, ``Mul``, ``Tanh``, ``Add``, ``Mul``, ``Mul`` (tanh).  Costed as
written, the eight ops of a tanh GELU are eight kernels that each read and write the whole
tensor, and keep four tensors for backward where PyTorch keeps one.

Found two ways:

- by the exporter's own record: torch.onnx's dynamo exporter tags every node with the FX node it
  came from (``pkg.torch.onnx.fx_node``, :attr:`dml2comm.ir.graph.Op.aten`): the nodes of one
  ``aten.gelu.default`` call are one call, whatever their shape (Gemma's ``gelu_pytorch_tanh``,
  BERT's ``GELUActivation``).  A GELU written out in Python (GPT-2's ``NewGELUActivation``,
  transformers ``activations.py``) is tagged ``aten.tanh``, ``aten.mul``, ...: eager PyTorch runs
  those ops one by one too, and they stay separate.
- by shape, for exports without the record (the TorchScript exporter): the exact GELU's
  pattern around its ``Erf`` (the tanh form's pattern is the written-out GELU's too, so it is
  left as written).

(``benchmarks/fake_fixtures_findings.md``: Gemma's tanh GELU under ``--precision amp`` kept
+3.7 MB per block at b=4, s=512, h=64 until these were found.)
"""

from __future__ import annotations

from typing import NamedTuple

from dml2comm.ir.graph import Op, OpGraph

__all__ = ["GeluCall", "gelu_calls", "GELU_ATEN"]

#: The aten operator of ``F.gelu`` (either approximation) in torch.onnx's ``fx_node`` records.
GELU_ATEN = "aten.gelu.default"


class GeluCall(NamedTuple):
    """One ``F.gelu`` call written as primitives: its input, its ops (graph order) and output."""

    x: str
    ops: tuple[int, ...]
    out: str


def gelu_calls(graph: OpGraph) -> tuple[GeluCall, ...]:
    """Every ``F.gelu`` call of ``graph`` written as two or more ops (module docstring), in
    graph order of their first op."""
    calls = list(_recorded_calls(graph))
    taken = {i for call in calls for i in call.ops}
    calls += [call for call in _erf_calls(graph) if not taken.intersection(call.ops)]
    return tuple(sorted(calls, key=lambda c: c.ops[0]))


def _is_activation(graph: OpGraph, name: str) -> bool:
    t = graph.tensors.get(name) if name else None
    return t is not None and not t.is_weight and (t.is_input or graph.producer(name) is not None)


def _recorded_calls(graph: OpGraph) -> list[GeluCall]:
    """The ``aten.gelu.default`` calls by their FX node: the ops sharing it, the one activation
    they read from outside, the one tensor read outside them."""
    members: dict[str, list[int]] = {}
    for op in graph.ops:
        if op.aten == GELU_ATEN and op.fx:
            members.setdefault(op.fx, []).append(op.index)
    out = []
    for ops in members.values():
        if len(ops) < 2:
            continue
        inside = set(ops)
        made = {o for i in ops for o in graph.ops[i].outputs if o}
        xs = {n for i in ops for n in graph.ops[i].inputs if n and n not in made and _is_activation(graph, n)}
        leaving = [o for o in made if o in graph.outputs or any(c not in inside for c in graph.consumers(o))]
        if len(xs) == 1 and len(leaving) == 1:
            out.append(GeluCall(xs.pop(), tuple(ops), leaving[0]))
    return out


def _erf_calls(graph: OpGraph) -> list[GeluCall]:
    """Each exact GELU written as primitives without the exporter's record: ``Div(x, sqrt 2)``
    (or ``Mul`` by a scalar), ``Erf``, ``Add``/``Mul`` by scalars, and the ``Mul`` with x (or with
    ``x * 0.5``)."""
    found = []
    for erf in graph.ops:
        if erf.op_type != "Erf" or not erf.inputs or (p := graph.producer(erf.inputs[0])) is None:
            continue
        call = _erf_call(graph, graph.ops[p], erf)
        if call is not None:
            found.append(call)
    return found


def _scalars_besides(graph: OpGraph, op: Op, name: str) -> bool:
    others = [n for n in op.inputs if n and n != name]
    return len(others) == len([n for n in op.inputs if n]) - 1 and all(
        (t := graph.tensor(n)) is not None and t.numel <= 1 and not _is_activation(graph, n) for n in others)


def _erf_call(graph: OpGraph, scale: Op, erf: Op) -> GeluCall | None:
    x = next((n for n in scale.inputs if n and _is_activation(graph, n)), None)
    if (scale.op_type not in ("Div", "Mul") or x is None or not _scalars_besides(graph, scale, x)
            or len(graph.consumers(scale.outputs[0])) != 1):
        return None
    members, cur = [scale.index, erf.index], erf.outputs[0]
    while len(cs := graph.consumers(cur)) == 1 and graph.ops[cs[0]].op_type in ("Add", "Mul") \
            and _scalars_besides(graph, graph.ops[cs[0]], cur):
        members.append(cs[0])
        cur = graph.ops[cs[0]].outputs[0]
    if len(cs := graph.consumers(cur)) != 1:
        return None
    last = graph.ops[cs[0]]
    if last.op_type != "Mul" or len(last.inputs) != 2:
        return None
    other = last.inputs[0] if last.inputs[1] == cur else last.inputs[1]
    if other != x:  # (x * 0.5) * (1 + erf)
        po = graph.producer(other)
        if (po is None or graph.ops[po].op_type != "Mul" or x not in graph.ops[po].inputs
                or not _scalars_besides(graph, graph.ops[po], x) or len(graph.consumers(other)) != 1):
            return None
        members.append(po)
    members.append(last.index)
    return GeluCall(x, tuple(sorted(members)), last.outputs[0])
