"""Load an ONNX model: the one loader every command, back end, test and benchmark uses.

:mod:`dml2comm.ir.onnx_import` reads the file; where an ``If``'s condition is known only at run
time it keeps the heavier branch, costed op by op with the forward cost it is given.  That cost is
the op rules' (:func:`dml2comm.ops.registry.op_cost`), which sit above the reader in the layering,
so this module, above both, passes them in (:func:`forward_cost`).  Loading through here is what
makes every caller choose branches by the one cost model; ``tests/test_import_layers.py`` checks
that nothing else calls the bare readers.
"""

from __future__ import annotations

import os
from typing import Sequence

import onnx

from dml2comm.ir.graph import Op, Tensor
from dml2comm.ir.onnx_import import ImportOptions, ImportResult, read_model, read_model_proto
from dml2comm.ops.registry import op_cost

__all__ = ["forward_cost", "load_model", "load_model_proto"]


def forward_cost(op: Op, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor | None]) -> tuple[float, float]:
    """Forward ``(FLOPs, bytes)`` of ``op`` by its registered cost rule, lenient (an op without a
    rule counts its bytes, :func:`dml2comm.ops.registry.memory_bound_cost`): what an ``If``'s
    branches are compared by (:class:`dml2comm.ir.onnx_import.OpForwardCost`)."""
    cost = op_cost(op, inputs, outputs, lenient=True)
    return cost.flops_fwd, cost.bytes_fwd


def load_model(path: str | os.PathLike[str], options: ImportOptions | None = None) -> ImportResult:
    """Read the model at ``path`` and return the shape-inferred op graph
    (:func:`dml2comm.ir.onnx_import.read_model`, which says what it raises)."""
    return read_model(path, options, op_cost=forward_cost)


def load_model_proto(model: onnx.ModelProto, options: ImportOptions | None = None, name: str | None = None) -> ImportResult:
    """Like :func:`load_model` for an in-memory proto (tests build these with onnx.helper)."""
    return read_model_proto(model, options, name, op_cost=forward_cost)
