"""Imports point down: the modules of ``dml2comm`` form layers, and a module imports only from its own
layer or the ones below it, never in a circle (issue 37, "Imports point down").

The check parses every module with :mod:`ast` (nothing is imported) and collects every import of a
``dml2comm`` module, at module level and inside functions (a lazy import is still a dependency: it
only hides the circle until the function runs).  ``tests/test_architecture.py`` checks the other half
of the contract (no module reads another module's ``_private`` names) and lends its path helpers.

An import of ``dml2comm.pkg.mod`` is an edge to that module; ``from dml2comm.pkg import name`` is an
edge to ``dml2comm.pkg.name`` when that is a module, else to the package's ``__init__``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

from tests.test_architecture import PACKAGE, ROOT, _is_module, _module_name, _resolve, _write

# The layers, lowest first.  A module belongs to the layer of the longest prefix that names it (a
# package prefix covers the package's modules), and may import only from its own layer or a lower one.
# Each row is one layer; the prefixes in one row are peers that may import each other (without a circle).
LAYERS: list[tuple[str, ...]] = [
    # foundations: the package, the exception hierarchy, the stdlib-only launcher, number formatting,
    # the closed sets' enum base
    ("dml2comm", "dml2comm.errors", "dml2comm.choices", "dml2comm.bootstrap", "dml2comm.fmt"),
    ("dml2comm.ir",),                                   # the graph read from ONNX
    ("dml2comm.ops", "dml2comm.hardware", "dml2comm.zoo"),  # op rules; GPUs and clusters; model builders
    ("dml2comm.load",),                                 # the model loader: the ONNX reader given the op rules' costs
    ("dml2comm.network",),                              # collectives on a topology
    ("dml2comm.parallel",),                             # data/tensor/pipeline/expert parallelism
    ("dml2comm.cost",),                                 # per-op, per-layer, per-stage costs
    ("dml2comm.sim",),                                  # the pipeline simulation
    ("dml2comm.model",),                                # priced plans run once: the analysis's and the sweep's evaluator
    ("dml2comm.analysis", "dml2comm.advice"),           # one plan's analysis and its advice
    # the commands' back ends, and the executors their parallel work runs on
    ("dml2comm.search", "dml2comm.traces", "dml2comm.calibrate", "dml2comm.validate", "dml2comm.executors"),
    ("dml2comm.export", "dml2comm.render"),             # files and drawings of the results
    ("dml2comm.site",),                                 # the static site
    # the front end: the only package that parses arguments, prints and sets exit codes
    # (tests/test_front_end.py), one module per command
    ("dml2comm.cli",),
]

# Known violations, each ``(importer, imported)``: none left. The test fails on any upward import, and
# on an entry here that no longer occurs (so the list only shrinks).
ALLOWED_UPWARD: set[tuple[str, str]] = set()
ALLOWED_CYCLES: list[set[str]] = []  # none left: the test fails on any circle


def layer_of(module: str) -> int:
    best, best_len = None, -1
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_len:
                best, best_len = index, len(prefix)
    if best is None:
        raise AssertionError(f"{module} is in no layer: add it to LAYERS in {__file__}")
    return best


def import_graph(root: Path = ROOT, package: str = PACKAGE) -> nx.DiGraph:
    """Every module of ``root/package`` and an edge ``a -> b`` (with the ``lines``) for each import."""
    graph = nx.DiGraph()
    for path in sorted((root / package).rglob("*.py")):
        module = _module_name(path, root)
        is_package = path.name == "__init__.py"
        graph.add_node(module)
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom):
                source = _resolve(node, module, is_package)
                if not (source == package or source.startswith(package + ".")):
                    continue
                for alias in node.names:
                    sub = f"{source}.{alias.name}"
                    targets.append(sub if _is_module(sub, root) else source)
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name == package or a.name.startswith(package + ".")]
            for target in targets:
                if target == module:
                    continue
                if graph.has_edge(module, target):
                    graph.edges[module, target]["lines"].append(node.lineno)
                else:
                    graph.add_edge(module, target, lines=[node.lineno])
    return graph


def upward_imports(graph: nx.DiGraph) -> set[tuple[str, str]]:
    return {(a, b) for a, b in graph.edges if layer_of(b) > layer_of(a)}


def cycles(graph: nx.DiGraph) -> list[set[str]]:
    """The strongly connected components of more than one module: each holds at least one circle."""
    return sorted((c for c in nx.strongly_connected_components(graph) if len(c) > 1), key=sorted)


def _describe(graph: nx.DiGraph, edges) -> str:
    return "\n".join(f"  {a} -> {b} (line {', '.join(map(str, sorted(set(graph.edges[a, b]['lines']))))})"
                     for a, b in sorted(edges))


def test_every_module_is_in_a_layer():
    for module in import_graph().nodes:
        layer_of(module)


def test_imports_point_down():
    graph = import_graph()
    found = upward_imports(graph)
    new = found - ALLOWED_UPWARD
    assert not new, "imports from a higher layer (move the shared piece down):\n" + _describe(graph, new)
    gone = ALLOWED_UPWARD - found
    assert not gone, f"fixed, so drop from ALLOWED_UPWARD: {sorted(gone)}"


def test_no_import_circles():
    graph = import_graph()
    found = cycles(graph)
    new = [c for c in found if c not in ALLOWED_CYCLES]
    detail = []
    for component in new:
        detail.append(_describe(graph, graph.subgraph(component).edges))
    assert not new, "import circles (each block is one strongly connected set):\n" + "\n\n".join(detail)
    gone = [c for c in ALLOWED_CYCLES if c not in found]
    assert not gone, f"fixed, so drop from ALLOWED_CYCLES: {gone}"


#: The ONNX reader's entry points, which take the op rules' forward cost (an ``If``'s heavier
#: branch), and the one module that may call them (it passes the op rules in).
BARE_READERS = frozenset({"read_model", "read_model_proto"})
LOADER = "dml2comm/load.py"


def bare_reader_uses(root: Path = ROOT) -> list[str]:
    """``path:line`` of each use of :data:`BARE_READERS` (imported from ``dml2comm.ir.onnx_import``
    or read as an attribute) in the package, the tests and the benchmarks, outside the reader and
    :data:`LOADER`."""
    found = []
    for folder in (PACKAGE, "tests", "benchmarks"):
        for path in sorted((root / folder).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel in (LOADER, f"{PACKAGE}/ir/onnx_import.py"):
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
                if isinstance(node, ast.ImportFrom) and node.module == f"{PACKAGE}.ir.onnx_import":
                    hit = any(a.name in BARE_READERS for a in node.names)
                elif isinstance(node, ast.Attribute):
                    hit = node.attr in BARE_READERS
                else:
                    continue
                if hit:
                    found.append(f"{rel}:{node.lineno}")
    return found


def test_models_are_loaded_through_the_one_loader():
    """Every caller loads through ``dml2comm.load`` (which passes the op rules' costs to the reader
    for ``If`` branches), never through the bare reader (``tests/test_control_flow.py`` calls it on
    purpose, with a cost of its own)."""
    found = [u for u in bare_reader_uses() if not u.startswith("tests/test_control_flow.py:")]
    assert not found, "load models with dml2comm.load.load_model / load_model_proto:\n  " + "\n  ".join(found)


def test_the_loader_check_finds_imports_and_attributes(tmp_path):
    _write(tmp_path, {
        "dml2comm/__init__.py": "",
        "dml2comm/load.py": "from dml2comm.ir.onnx_import import read_model\n",
        "dml2comm/cost/x.py": "from dml2comm.ir.onnx_import import ImportOptions, read_model_proto\n",
        "tests/test_y.py": "from dml2comm.ir import onnx_import\nonnx_import.read_model('m.onnx')\n",
        "benchmarks/z.py": "from dml2comm.load import load_model\n",
    })
    assert bare_reader_uses(tmp_path) == ["dml2comm/cost/x.py:1", "tests/test_y.py:2"]


def test_the_check_finds_lazy_upward_imports_and_circles(tmp_path):
    _write(tmp_path, {
        "dml2comm/__init__.py": "",
        "dml2comm/ir/__init__.py": "",
        "dml2comm/ir/graph.py": "def f():\n    from dml2comm.cost import layers\n",  # lazy, upward
        "dml2comm/cost/__init__.py": "",
        "dml2comm/cost/layers.py": "from dml2comm.cost.stages import X\nfrom dml2comm.ir import graph\n",
        "dml2comm/cost/stages.py": "from . import layers\nX = 1\n",
    })
    graph = import_graph(tmp_path)
    assert upward_imports(graph) == {("dml2comm.ir.graph", "dml2comm.cost.layers")}
    assert cycles(graph) == [{"dml2comm.cost.layers", "dml2comm.cost.stages", "dml2comm.ir.graph"}]
