"""Closed sets are enums: the code compares a closed set's members, never the raw strings (issue 37,
"Closed sets as enums").

A closed set -- a flag's choices (``--cp-scheme``, ``--optimizer``, ``--dtype``), a layer's kind, a
simulated stream, a topology name, a cluster's collective library -- is a
:class:`dml2comm.choices.Choice` enum: a ``str`` that equals, hashes and prints as its flag value, so
data.json, CSV rows and printed lines do not change, while the code compares members by identity.

The check parses every module with :mod:`ast` (nothing is imported), collects the values of every
``Choice`` subclass, and fails on a comparison (``==``, ``!=``, ``in``, ``not in``, ``is``) of a
string constant equal to one of those values -- a new place that compares the raw string instead of
the member -- unless the place is listed below.  The list may only shrink: the test fails on an
entry whose count is higher than what is found, so fix the count (or delete the entry) when a
comparison goes.
"""

from __future__ import annotations

import ast
import json
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "dml2comm"
_BASES = {"Choice", "_Choice"}

# ``(path relative to dml2comm, the string) -> how many comparisons``: the raw-string comparisons
# left, each for a reason.  Shrink it, never grow it.
ALLOWED: dict[tuple[str, str], int] = {
    # -- modules other work is changing now: convert them when it has landed --------------------
    ("cli/collective.py", "hierarchical"): 3,   # the --topology flag's string, before make_topology
    ("cli/collective.py", "torus2d"): 1,
    ("cli/collective.py", "torus3d"): 1,
    ("cli/collective.py", "ring"): 3,           # --topology/--algorithm strings and LevelKind.value
    ("cli/collective.py", "nccl"): 2,           # _Setup.library: the --library flag's string
    ("search/reproduce.py", "1f1b"): 1,         # a sweep row's config dict (plain strings from CSV)
    ("search/reproduce.py", "adam"): 1,
    ("search/reproduce.py", "bf16"): 1,
    ("search/reproduce.py", "megatron"): 1,
    ("search/reproduce.py", "none"): 1,
    ("calibrate/classes.py", "bf16"): 1,        # a profiler's GEMM dtype label (with tf32, fp8)
    ("calibrate/samples.py", "fp32"): 1,
    ("cost/gemm.py", "fp32"): 1,                # the GEMM tables' dtype keys (with tf32, fp8)
    ("hardware/gpus.py", "fp32"): 1,            # the peak tables' dtype keys (with tf32, fp8)
    ("traces/report.py", "block"): 1,           # a join's layer rows as JSON dicts
    # -- data read back as plain strings (JSON, CSV, trace files) --------------------------------
    ("search/sweep.py", "amp"): 1,              # config_from_dict: a sweep row's precision
    ("validate/steps.py", "bf16"): 1,           # a published run's mode column
    ("traces/analyze.py", "pp"): 1,             # process-group dimensions named in a trace file
    ("traces/classify.py", "pp"): 1,
    ("cli/trace.py", "dp"): 1,
    ("traces/layout.py", "dp"): 2,
    ("traces/layout.py", "pp"): 1,
    ("traces/compare.py", "compute"): 1,        # a measured summary's time keys
    ("traces/compare.py", "optimizer"): 1,
    # -- other closed sets that share a value ------------------------------------------------------
    ("ops/loss.py", "none"): 1,                 # ONNX's reduction attribute
    ("ops/movement.py", "none"): 1,
    ("ir/onnx_import.py", "pytorch"): 1,        # an ONNX model's producer_name
    ("cost/profile.py", "optimizer"): 1,        # a profile scale's kinds (cost/profile.py KINDS)
    ("cli/analyse.py", "optimizer"): 1,
}


def choice_values(root: Path = PACKAGE) -> dict[str, str]:
    """``value -> "module.Class"`` of every member of every ``Choice`` subclass under ``root`` (a value
    several enums share names them all)."""
    values: dict[str, str] = {}
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and any(isinstance(b, ast.Name) and b.id in _BASES for b in node.bases):
                for stmt in node.body:
                    if (isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Constant)
                            and isinstance(stmt.value.value, str)):
                        where = f"{path.relative_to(root).as_posix()}:{node.name}"
                        values[stmt.value.value] = f"{values[stmt.value.value]} or {where}" if stmt.value.value in values else where
    return values


def _strings(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return []


_OPS = (ast.Eq, ast.NotEq, ast.In, ast.NotIn, ast.Is, ast.IsNot)


def raw_comparisons(source: str, watched: set[str]) -> list[tuple[int, str]]:
    """``(line, string)`` of each comparison in ``source`` of a string constant in ``watched``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        for i, op in enumerate(node.ops):
            if isinstance(op, _OPS):
                for s in _strings(operands[i]) + _strings(operands[i + 1]):
                    if s in watched:
                        found.append((node.lineno, s))
    return found


def found_comparisons() -> tuple[Counter, dict[tuple[str, str], list[int]]]:
    watched = set(choice_values())
    counts: Counter = Counter()
    lines: dict[tuple[str, str], list[int]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(PACKAGE).as_posix()
        for line, s in raw_comparisons(path.read_text(encoding="utf-8"), watched):
            counts[(module, s)] += 1
            lines.setdefault((module, s), []).append(line)
    return counts, lines


def test_no_new_raw_string_comparison_against_a_closed_set():
    values = choice_values()
    counts, lines = found_comparisons()
    new = [f"dml2comm/{m}:{lines[(m, s)][0]} compares {s!r} (a {values[s]} value): compare the member"
           for (m, s), n in sorted(counts.items()) if n > ALLOWED.get((m, s), 0)]
    assert not new, "raw strings compared where a closed set's member belongs:\n" + "\n".join(new)


def test_the_allow_list_only_shrinks():
    counts, _ = found_comparisons()
    stale = [f"{m} {s!r}: listed {n}, found {counts.get((m, s), 0)}" for (m, s), n in sorted(ALLOWED.items())
             if n > counts.get((m, s), 0)]
    assert not stale, "lower (or delete) these ALLOWED entries in tests/test_closed_sets.py:\n" + "\n".join(stale)


def test_the_scan_finds_a_raw_comparison():
    source = 'if cfg.cp_scheme == "ring" or kind in ("block", "head") or "amp" != p or x is CpScheme.RING:\n    pass\n'
    assert raw_comparisons(source, {"ring", "block", "amp"}) == [(1, "ring"), (1, "block"), (1, "amp")]
    assert {"ulysses", "ring", "block", "compute", "nccl", "fat-tree", "adamw", "fp16", "ring"} <= set(choice_values())


def test_the_spelled_out_value_lists_agree_with_their_enums():
    """Tuples kept as literals (the site's reference page shows a constant's source) name the
    same values, in the same order, as the enum they list."""
    from dml2comm.export.chrome_trace import STREAMS
    from dml2comm.hardware.cluster import COLLECTIVE_LIBRARIES, INTRA_TOPOLOGIES, CollectiveLibrary, IntraTopology
    from dml2comm.network.model import LIBRARIES
    from dml2comm.network.topology import TOPOLOGY_NAMES, TopologyName
    from dml2comm.parallel.config import CP_SCHEMES, DTYPES, OPTIMIZERS, CpScheme, DTypeName, Optimizer
    from dml2comm.sim.engine import Stream

    for spelled, enum in ((CP_SCHEMES, CpScheme), (OPTIMIZERS, Optimizer), (tuple(DTYPES), DTypeName),
                          (TOPOLOGY_NAMES, TopologyName), (INTRA_TOPOLOGIES, IntraTopology),
                          (COLLECTIVE_LIBRARIES, CollectiveLibrary), (LIBRARIES, CollectiveLibrary), (STREAMS, Stream)):
        assert tuple(spelled) == tuple(m.value for m in enum), enum


def test_a_member_reads_as_its_flag_value():
    """data.json, CSV rows, messages and dict look-ups see the flag's string."""
    from dml2comm.parallel.config import CpScheme

    ring = CpScheme.RING
    assert f"{ring}" == str(ring) == "%s" % ring == "ring"
    assert json.dumps({ring: [ring]}) == '{"ring": ["ring"]}'
    assert hash(ring) == hash("ring") and {"ring": 1}[ring] == 1 and {ring: 1}["ring"] == 1


def test_strings_at_the_boundary_become_members():
    """Strings from flags, files and callers become members where they enter, so the code may
    compare by identity."""
    from dml2comm.hardware.cluster import CollectiveLibrary, IntraTopology, get_cluster
    from dml2comm.ir.layers import Layer, LayerKind
    from dml2comm.parallel.config import CpScheme, DTypeName, Optimizer, ParallelConfig

    cfg = ParallelConfig(cp_scheme="ring", optimizer="sgd", dtype="fp16")
    assert cfg.cp_scheme is CpScheme.RING and cfg.optimizer is Optimizer.SGD and cfg.dtype is DTypeName.FP16
    assert Layer(0, "h.0", "block", (0,)).kind is LayerKind.BLOCK
    v100 = get_cluster("dgx-v100")
    assert v100.intra_topology is IntraTopology.HYBRID_CUBE_MESH and v100.collective_library is CollectiveLibrary.NCCL
