"""Graphs that are not DAGs in topological order are refused (issue 36, item 5).

ONNX requires a graph's nodes to be topologically sorted (``onnx.checker``: "Nodes in a graph
must be topologically sorted"), and dml2comm reads the node order as the execution order.  With
fixed dims and ``value_info`` declaring every tensor, shape inference has nothing to complain
about, so the import itself checks the order.  Every case goes through the real command line:
exit code 2, one ``error:`` line naming the nodes, nothing written.
"""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from dml2comm.cli import main
from dml2comm.errors import ModelError
from dml2comm.load import load_model_proto


def graph(nodes: list[onnx.NodeProto], *, checked: bool = False) -> onnx.ModelProto:
    """x[2, 4] -> ... -> y[2, 4], every intermediate tensor declared in value_info."""
    info = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, [2, 4])
    inner = sorted({o for n in nodes for o in n.output} - {"y"})
    g = helper.make_graph(nodes, "g", [info("x")], [info("y")], value_info=[info(n) for n in inner])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    if checked:
        onnx.checker.check_model(m)
    return m


def refused(tmp_path: Path, capsys, model: onnx.ModelProto) -> str:
    path, out = tmp_path / "m.onnx", tmp_path / "out"
    onnx.save(model, path)
    code = main([str(path), "--out", str(out), "--no-site", "--no-advice"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    assert len(err) == 1 and err[0].startswith("error: "), err
    assert not out.exists() or not list(out.iterdir())
    return err[0]


def test_cycle_is_refused_naming_its_nodes(tmp_path, capsys):
    # add1 reads c, which mul computes from relu's output, which reads add1's output
    nodes = [
        helper.make_node("Add", ["x", "c"], ["a"], name="add1"),
        helper.make_node("Relu", ["a"], ["b"], name="relu"),
        helper.make_node("Mul", ["b", "x"], ["c"], name="mul"),
        helper.make_node("Relu", ["b"], ["y"], name="out"),
    ]
    with pytest.raises(onnx.checker.ValidationError, match="topologically sorted"):
        graph(nodes, checked=True)
    line = refused(tmp_path, capsys, graph(nodes))
    assert "has a cycle: nodes 'add1' (Add) -> 'relu' (Relu) -> 'mul' (Mul) -> 'add1' (Add)" in line, line
    assert "acyclic" in line and "fix the export" in line
    assert "'out'" not in line  # not on the cycle


def test_self_loop_is_refused_naming_the_node(tmp_path, capsys):
    nodes = [helper.make_node("Add", ["x", "a"], ["a"], name="acc"), helper.make_node("Relu", ["a"], ["y"], name="out")]
    line = refused(tmp_path, capsys, graph(nodes))
    assert "node 'acc' (Add) reads its own output 'a'" in line, line
    assert "acyclic" in line and "fix the export" in line


def test_acyclic_graph_out_of_order_is_refused_with_the_fix(tmp_path, capsys):
    nodes = [helper.make_node("Relu", ["a"], ["y"], name="late"), helper.make_node("Add", ["x", "x"], ["a"], name="first")]
    line = refused(tmp_path, capsys, graph(nodes))
    assert "not in topological order: node 'late' (Relu) reads 'a' before node 'first' (Add) computes it" in line, line
    assert "re-export" in line and "sort" in line


def test_unnamed_nodes_are_named_by_type_and_position():
    nodes = [helper.make_node("Relu", ["b"], ["a"]), helper.make_node("Neg", ["a"], ["b"]), helper.make_node("Relu", ["a"], ["y"])]
    with pytest.raises(ModelError, match=r"nodes Relu #0 -> Neg #1 -> Relu #0 feed each other"):
        load_model_proto(graph(nodes))


def test_cycle_through_a_control_flow_body_is_refused():
    # the If's branches read 'b', which is computed from the If's own output
    branch = lambda name: helper.make_graph([helper.make_node("Identity", ["b"], [f"{name}_out"])], name, [],
                                            [helper.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT, [2, 4])])
    cond = helper.make_tensor("cond", TensorProto.BOOL, [], [True])
    nodes = [
        helper.make_node("Constant", [], ["c"], name="cond", value=cond),
        helper.make_node("If", ["c"], ["a"], name="branch", then_branch=branch("then"), else_branch=branch("else")),
        helper.make_node("Relu", ["a"], ["b"], name="relu"),
        helper.make_node("Relu", ["b"], ["y"], name="out"),
    ]
    with pytest.raises(ModelError, match=r"nodes 'branch' \(If\) -> 'relu' \(Relu\) -> 'branch' \(If\)"):
        load_model_proto(graph(nodes))


def test_a_sorted_graph_passes():
    nodes = [helper.make_node("Add", ["x", "x"], ["a"], name="first"), helper.make_node("Relu", ["a"], ["y"], name="second")]
    imported = load_model_proto(graph(nodes, checked=True))
    assert [op.name for op in imported.graph.ops] == ["first", "second"]
