"""Registry of per-op cost rules: FLOPs and HBM bytes, forward and backward.

A rule is a function ``rule(op, inputs, outputs) -> OpCost`` registered for one or more ONNX
op types with :func:`cost_rule`.  ``inputs``/``outputs`` are :class:`~dml2comm.ir.graph.Tensor`
objects (``None`` for an omitted optional input) whose shapes are the ones the op really runs
on: the analysis passes *sharded* shapes under tensor parallelism and the training dtype's
element size, so a rule never looks anything up in the graph.

Conventions every rule follows (the per-family modules cite their sources):
- ``flops_fwd`` counts a multiply-add as 2 FLOPs (Narayanan et al. 2021, Sec. 5.1 / App.).
- ``bytes_fwd`` is the HBM traffic of an unfused kernel: every input read once plus every
  output written once (weights included).  View ops (Reshape, Squeeze, ...) move no data.
- ``flops_bwd``/``bytes_bwd`` are the backward pass of the op: for matmul-like ops 2x the
  forward FLOPs (gradient w.r.t. input and w.r.t. weight; Narayanan et al. 2021, eq. (3)
  derivation); per-family rules otherwise.

Duplicates are refused at import time; a miss raises :class:`UnsupportedOpError` naming the
op and where to add a rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from dml2comm.errors import RegistryError, UnsupportedOpError
from dml2comm.ir.graph import Op, Tensor

__all__ = [
    "OpCost",
    "Rule",
    "cost_rule",
    "lookup",
    "op_cost",
    "registered_op_types",
    "io_bytes",
    "memory_bound_cost",
]


@dataclass(frozen=True, slots=True)
class OpCost:
    """Cost of one op for one micro-batch on one GPU (SI units: FLOPs and bytes)."""

    flops_fwd: float
    bytes_fwd: float
    flops_bwd: float
    bytes_bwd: float
    rule: str  # which rule produced it, shown in tooltips ("matmul", "elementwise", ...)
    fallback: bool = False  # True when --lenient guessed a memory-bound cost for an unknown op


Rule = Callable[[Op, Sequence["Tensor | None"], Sequence["Tensor | None"]], OpCost]

_RULES: dict[str, Rule] = {}
_RULE_HOME: dict[str, str] = {}


def cost_rule(*op_types: str) -> Callable[[Rule], Rule]:
    """Register ``fn`` as the cost rule for ``op_types``; a second rule for a type is refused."""

    def register(fn: Rule) -> Rule:
        for op_type in op_types:
            if op_type in _RULES:
                raise RegistryError(
                    f"cost rule for {op_type!r} registered twice "
                    f"({_RULE_HOME[op_type]} and {fn.__module__}.{fn.__qualname__}); keep one"
                )
            _RULES[op_type] = fn
            _RULE_HOME[op_type] = f"{fn.__module__}.{fn.__qualname__}"
        return fn

    return register


def lookup(op_type: str) -> Rule | None:
    """The rule for ``op_type`` (None: no rule).  Every family is registered by then: importing this
    module first runs the package's ``__init__``, which imports every family module."""
    return _RULES.get(op_type)


def registered_op_types() -> tuple[str, ...]:
    return tuple(sorted(_RULES))


def io_bytes(inputs: Iterable[Tensor | None], outputs: Iterable[Tensor | None]) -> float:
    """Bytes read plus bytes written by an unfused kernel: each tensor touched once."""
    return float(sum(t.nbytes for t in inputs if t is not None) + sum(t.nbytes for t in outputs if t is not None))


def memory_bound_cost(inputs: Sequence[Tensor | None], outputs: Sequence[Tensor | None], rule: str, fallback: bool = False) -> OpCost:
    """Zero-FLOP cost: forward moves inputs+outputs; backward reads the output gradient and
    writes the gradients of float inputs (same sizes), i.e. about the same traffic."""
    fwd = io_bytes(inputs, outputs)
    bwd = io_bytes([t for t in inputs if t is not None and t.dtype.is_float], outputs)
    return OpCost(0.0, fwd, 0.0, bwd, rule, fallback)


def _repeated(cost: OpCost, repeat: int) -> OpCost:
    """``cost`` of one run times ``repeat``: an op inlined from a ``Loop``/``Scan`` body runs
    once per iteration (:attr:`~dml2comm.ir.graph.Op.repeat`), each run costing the same."""
    if repeat == 1:
        return cost
    return OpCost(cost.flops_fwd * repeat, cost.bytes_fwd * repeat, cost.flops_bwd * repeat, cost.bytes_bwd * repeat,
                  f"{cost.rule} x {repeat} iterations", cost.fallback)


def op_cost(op: Op, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor | None], lenient: bool = False) -> OpCost:
    """Cost of ``op`` on the given (possibly sharded) tensors, times ``op.repeat``.

    Raises
    ------
    UnsupportedOpError
        No rule for ``op.op_type`` and ``lenient`` is false.
    """
    rule = lookup(op.op_type)
    if rule is not None:
        return _repeated(rule(op, inputs, outputs), op.repeat)
    if lenient:
        return _repeated(memory_bound_cost(inputs, outputs, "unknown op: memory-bound guess", fallback=True), op.repeat)
    domain = f" (domain {op.domain!r})" if op.domain not in ("", "ai.onnx") else ""
    raise UnsupportedOpError(
        f"no cost rule for op type {op.op_type!r}{domain} at node {op.name!r}; add one with "
        f"@cost_rule({op.op_type!r}) in a module of dml2comm/ops/, or analyse the model with "
        "`python main.py MODEL.onnx --lenient` to cost it as memory-bound (sweep and compare have no --lenient)"
    )
