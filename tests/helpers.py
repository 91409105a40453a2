"""Small ONNX graphs built by hand with onnx.helper (checked by onnx.checker), and where the real exports are."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import numpy as np
import onnx
from onnx import TensorProto, helper

#: The real exports: tests/fixtures, and the package data folder of the models the validation reads
#: (the measured steps' models: their records in fixtures_expected.json carry ``dir``).
FIXTURES = Path(__file__).resolve().parent / "fixtures"
PACKAGED_MODELS = FIXTURES.parents[1] / "dml2comm" / "validate" / "data" / "models"


#: The benchmark scripts (a folder, not a package).
BENCHMARKS = FIXTURES.parents[1] / "benchmarks"


def benchmark(name: str) -> ModuleType:
    """The script ``benchmarks/<name>.py`` loaded as a module (the folder is no package)."""
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def fixture_path(name: str) -> Path:
    """The real export ``name`` (``resnet18_dynamo.onnx``): in tests/fixtures, else in the package
    data folder the export script writes the measured steps' models to."""
    here = FIXTURES / name
    return here if here.is_file() else PACKAGED_MODELS / name


def weight(name: str, shape: list[int]) -> onnx.TensorProto:
    return helper.make_tensor(name, TensorProto.FLOAT, shape, np.zeros(int(np.prod(shape)), np.float32).tobytes(), raw=True)


def model(nodes, inputs, outputs, initializers=(), opset: int = 18, functions=()) -> onnx.ModelProto:
    graph = helper.make_graph(list(nodes), "g", list(inputs), list(outputs), list(initializers))
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], functions=list(functions))
    onnx.checker.check_model(m)
    return m


def mlp(hidden: int = 16, ffn: int = 64, batch: str | int = "batch", scoped: bool = True) -> onnx.ModelProto:
    """x[b, s, h] -> LN -> MatMul(h, ffn) + b1 -> Relu -> MatMul(ffn, h) + b2 -> + x."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 8, hidden])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 8, hidden])
    pre = "/mlp" if scoped else ""
    nodes = [
        helper.make_node("LayerNormalization", ["x", "ln.w", "ln.b"], ["n"], name=f"{pre}/ln/LayerNormalization" if scoped else "", axis=-1),
        helper.make_node("MatMul", ["n", "fc1.w"], ["h1"], name=f"{pre}/fc1/MatMul" if scoped else ""),
        helper.make_node("Add", ["h1", "fc1.b"], ["h2"], name=f"{pre}/fc1/Add" if scoped else ""),
        helper.make_node("Relu", ["h2"], ["h3"], name=f"{pre}/act/Relu" if scoped else ""),
        helper.make_node("MatMul", ["h3", "fc2.w"], ["h4"], name=f"{pre}/fc2/MatMul" if scoped else ""),
        helper.make_node("Add", ["h4", "fc2.b"], ["h5"], name=f"{pre}/fc2/Add" if scoped else ""),
        helper.make_node("Add", ["h5", "x"], ["y"], name=f"{pre}/Add" if scoped else ""),
    ]
    inits = [weight("ln.w", [hidden]), weight("ln.b", [hidden]), weight("fc1.w", [hidden, ffn]), weight("fc1.b", [ffn]),
             weight("fc2.w", [ffn, hidden]), weight("fc2.b", [hidden])]
    return model(nodes, [x], [y], inits)
