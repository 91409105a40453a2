"""Control flow (If, Loop, Scan) and recurrent ops (LSTM, GRU, RNN): import and costs.

Graphs are built with onnx.helper and checked by onnx.checker; expected numbers are worked out
in comments from the ONNX operator definitions (see dml2comm/ops/recurrent.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from dml2comm.analysis import analyze_graph
from dml2comm.errors import ModelError
from dml2comm.hardware.cluster import make_cluster
from dml2comm.ir.onnx_import import ImportOptions, read_model_proto
from dml2comm.load import load_model_proto
from dml2comm.ops.registry import op_cost
from dml2comm.parallel.config import ParallelConfig

F = TensorProto.FLOAT


def _model(nodes, inputs, outputs, inits=(), opset=17):
    m = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, list(inits)), opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(m)
    return m


def _out(name, rank):
    """A graph output of known rank and unknown dims (what exporters write for dynamic axes)."""
    return helper.make_tensor_value_info(name, F, [f"{name}_{i}" for i in range(rank)])


def _zeros(name, shape, dtype=np.float32):
    return numpy_helper.from_array(np.zeros(shape, dtype=dtype), name)


def _cost(graph, op_type):
    op = next(o for o in graph.ops if o.op_type == op_type)
    return op, op_cost(op, graph.op_inputs(op), graph.op_outputs(op))


def _recurrent_model(op_type, gates, direction="forward", peephole=False, seq_lens=False, bias=True):
    # X [T=3, B=2, I=4], hidden H=5
    d = 2 if direction == "bidirectional" else 1
    x = helper.make_tensor_value_info("x", F, [3, 2, 4])
    inits = [_zeros("W", [d, gates * 5, 4]), _zeros("R", [d, gates * 5, 5])]
    ins = ["x", "W", "R", "B" if bias else ""]
    if bias:
        inits.append(_zeros("B", [d, 2 * gates * 5]))
    graph_inputs = [x]
    if seq_lens:
        graph_inputs.append(helper.make_tensor_value_info("lens", TensorProto.INT32, [2]))
    ins.append("lens" if seq_lens else "")
    if op_type == "LSTM":
        inits.append(_zeros("h0", [d, 2, 5]))  # a folded zero state: not a parameter
        ins += ["h0", "", "P" if peephole else ""]
        if peephole:
            inits.append(_zeros("P", [d, 15]))
    outs = ["y", "y_h"] + (["y_c"] if op_type == "LSTM" else [])
    node = helper.make_node(op_type, ins, outs, hidden_size=5, direction=direction)
    return _model([node], graph_inputs, [_out("y", 4)], inits)


# --------------------------------------------------------------------------- recurrent op costs


def test_lstm_flops_from_the_onnx_equations():
    g = load_model_proto(_recurrent_model("LSTM", 4)).graph
    op, c = _cost(g, "LSTM")
    # per step (B=2, G=4, H=5, I=4): gates' matmuls 2 B G H (I + H) = 2*2*4*5*9 = 720;
    # XW + HR: B G H = 40; + Wb + Rb: 2 B G H = 80; Ct = ft Ct-1 + it ct: 3 B H = 30; Ht = ot h(Ct): 10;
    # activations: Sigmoid (4) on i, f, o, Tanh (1) on c and on Ct: (3*4 + 1 + 1) * B H = 140
    # -> 720 + 300 = 1020 per step, x T=3 steps x D=1 = 3060; backward 2x (BPTT)
    assert c.flops_fwd == 3060
    assert c.flops_bwd == 6120
    # W [1,20,4] + R [1,20,5] + B [1,40] = 80 + 100 + 40 = 220 parameters; h0 is a state, not one
    assert g.num_params == 220
    assert not g.tensors["h0"].is_weight


def test_bidirectional_lstm_with_peepholes_and_sequence_lens():
    g = load_model_proto(_recurrent_model("LSTM", 4, "bidirectional", peephole=True, seq_lens=True)).graph
    _, c = _cost(g, "LSTM")
    # as above (1020 per step) plus peepholes 3 x 2 B H = 60 -> 1080; x T=3 x D=2 directions = 6480
    # (sequence_lens is not read: every sequence costs all T steps)
    assert c.flops_fwd == 6480
    # 2 x (80 + 100 + 40) + P [2, 15] = 440 + 30 = 470
    assert g.num_params == 470


def test_gru_flops():
    g = load_model_proto(_recurrent_model("GRU", 3)).graph
    _, c = _cost(g, "GRU")
    # matmuls 2*2*3*5*9 = 540; XW + HR 30; biases 60; rt (.) Ht-1: 10; Ht = (1-z) h + z Ht-1: 4*10 = 40;
    # Sigmoid on z, r and Tanh on h: (2*4 + 1) * 10 = 90 -> 770 per step, x 3 = 2310
    assert c.flops_fwd == 2310
    assert g.num_params == 15 * 4 + 15 * 5 + 2 * 15  # W [1,15,4] 60 + R [1,15,5] 75 + B [1,30] 30 = 165


def test_rnn_flops_and_bytes():
    g = load_model_proto(_recurrent_model("RNN", 1)).graph
    _, c = _cost(g, "RNN")
    # matmuls 2*2*1*5*9 = 180; XW + HR 10; biases 20; Tanh 10 -> 220 per step, x 3 = 660
    assert c.flops_fwd == 660
    # bytes (fp32): once: X 24*4 = 96, W 20*4 = 80, Y_h [1,2,5] 40 -> 216;
    # per step: R 100 + B 40 = 140, x 3 = 420; gates T D B G H e = 3*1*2*1*5*4 = 120, written and
    # read twice (projection, recurrent product) = 480; states T D S B H e = 120, read and written = 240
    assert c.bytes_fwd == 216 + 420 + 480 + 240
    # backward: dY 120 + dY_h 40; R per step 300 + W 80 + X 96; reserve 120 + states 120;
    # gate gradients written and read 240; dW 80 + dR 100 + dB 40 (X is data: no gradient)
    assert c.bytes_bwd == 160 + 476 + 240 + 240 + 220


def test_rnn_without_bias_and_layout_1():
    x = helper.make_tensor_value_info("x", F, [2, 3, 4])  # layout=1: [B, T, I]
    node = helper.make_node("RNN", ["x", "W", "R"], ["y"], hidden_size=5, layout=1)
    m = _model([node], [x], [_out("y", 4)], [_zeros("W", [1, 5, 4]), _zeros("R", [1, 5, 5])], opset=14)
    _, c = _cost(load_model_proto(m).graph, "RNN")
    # 180 + 10 (XW + HR) + 10 (Tanh) = 200 per step, x T=3 = 600
    assert c.flops_fwd == 600


# --------------------------------------------------------------------------- If


def _if_model(cond_init=None):
    x = helper.make_tensor_value_info("x", F, [2, 3])
    then = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["t1"]), helper.make_node("Relu", ["t1"], ["t2"])],
        "then", [], [helper.make_tensor_value_info("t2", F, [2, 4])])
    other = helper.make_graph([helper.make_node("ReduceSum", ["x"], ["e1"], keepdims=0)], "else", [], [helper.make_tensor_value_info("e1", F, [])])
    inputs = [x]
    inits = [_zeros("w", [3, 4])]
    if cond_init is None:
        inputs.append(helper.make_tensor_value_info("c", TensorProto.BOOL, []))
    else:
        inits.append(numpy_helper.from_array(np.array(cond_init), "c"))
    node = helper.make_node("If", ["c"], ["y"], name="choose", then_branch=then, else_branch=other)
    return _model([node, helper.make_node("Relu", ["y"], ["z"])], inputs, [_out("z", 2)], inits)


def test_if_with_different_ranks_is_costed_as_its_heavier_branch_without_lenient():
    r = load_model_proto(_if_model())
    g = r.graph
    # then: MatMul 2*2*3*4 = 48 FLOPs + Relu 8; else: ReduceSum 6 - 1 = 5 adds -> then is heavier
    # (inlined); the else branch stays, run 0 times: no cost
    assert [(o.op_type, o.repeat) for o in g.ops] == [("MatMul", 1), ("Relu", 1), ("Identity", 1), ("ReduceSum", 0), ("Relu", 1)]
    assert _cost(g, "ReduceSum")[1].flops_fwd == 0 and _cost(g, "MatMul")[1].flops_fwd == 48
    assert g.tensors["y"].shape == (2, 4) and g.tensors["z"].shape == (2, 4)
    assert g.num_params == 12
    note = next(w for w in r.warnings if "'choose'" in w)
    assert "heavier branch, then_branch" in note and "different ranks" in note


def test_if_branch_choice_reads_the_cost_it_is_given():
    """The reader (ir, below the op rules) decides by the forward cost its caller passes in
    (``dml2comm.load`` passes the op rules'): cost the else branch's ReduceSum above the then
    branch's MatMul and the else branch is kept; the reader has no cost of its own to fall back on."""
    def reduce_heavy(op, inputs, outputs):
        return (1e9, 0.0) if op.op_type == "ReduceSum" else (1.0, 0.0)

    r = read_model_proto(_if_model(), op_cost=reduce_heavy)
    assert [(o.op_type, o.repeat) for o in r.graph.ops][:2] == [("ReduceSum", 1), ("Identity", 1)]
    assert "heavier branch, else_branch (1e+09 forward FLOPs" in next(w for w in r.warnings if "'choose'" in w)
    with pytest.raises(TypeError, match="op_cost"):
        read_model_proto(_if_model())  # type: ignore[call-arg]


def test_if_with_a_constant_condition_takes_that_branch():
    r = load_model_proto(_if_model(cond_init=False))
    assert [(o.op_type, o.repeat) for o in r.graph.ops] == [("ReduceSum", 1), ("Identity", 1), ("MatMul", 0), ("Relu", 0), ("Relu", 1)]
    assert r.graph.tensors["y"].shape == ()
    # the branch not taken still holds its parameter w [3, 4]
    assert r.graph.num_params == 12
    assert any("constant False" in w for w in r.warnings)


def test_lstm_inside_if_keeps_its_weights_and_scope():
    # a voice-activity-detector shape: the 16 kHz branch runs an LSTM, the other returns a rank-0 zero
    x = helper.make_tensor_value_info("x", F, [3, 2, 4])
    sr = helper.make_tensor_value_info("sr", TensorProto.INT64, [])
    lstm = helper.make_node("LSTM", ["x", "W", "R", "B"], ["y", "y_h", "y_c"], hidden_size=5, name="/decoder/rnn/LSTM")
    then = helper.make_graph([lstm], "then", [], [helper.make_tensor_value_info("y_h", F, [1, 2, 5])])
    zero = helper.make_node("Constant", [], ["zero"], value=helper.make_tensor("zv", F, [], [0.0]))
    other = helper.make_graph([zero], "else", [], [helper.make_tensor_value_info("zero", F, [])])
    nodes = [
        helper.make_node("Constant", [], ["k"], value=helper.make_tensor("kv", TensorProto.INT64, [], [16000])),
        helper.make_node("Equal", ["sr", "k"], ["is16k"]),
        helper.make_node("If", ["is16k"], ["out"], name="/decoder/If", then_branch=then, else_branch=other),
    ]
    inits = [_zeros("W", [1, 20, 4]), _zeros("R", [1, 20, 5]), _zeros("B", [1, 40])]
    r = load_model_proto(_model(nodes, [x, sr], [_out("out", 3)], inits))
    op = next(o for o in r.graph.ops if o.op_type == "LSTM")
    assert op.scope == "decoder.rnn"
    assert r.graph.tensors["out"].shape == (1, 2, 5)
    assert r.graph.num_params == 80 + 100 + 40


# --------------------------------------------------------------------------- Loop and Scan


def _loop_model(trip_count, batch=2):
    # body: h' = MatMul(h, w), scan output h'; w is [4, 4], h is [2, 4]
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("MatMul", ["h", "w"], ["h2"]),
         helper.make_node("Identity", ["h2"], ["h2_scan"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []), helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h", F, [2, 4])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []), helper.make_tensor_value_info("h2", F, [2, 4]),
         helper.make_tensor_value_info("h2_scan", F, [2, 4])])
    h0 = helper.make_tensor_value_info("h0", F, [batch, 4])
    inputs, inits = [h0], [_zeros("w", [4, 4])]
    if trip_count is None:
        inputs.append(helper.make_tensor_value_info("M", TensorProto.INT64, []))
    else:
        inits.append(numpy_helper.from_array(np.array(trip_count, dtype=np.int64), "M"))
    node = helper.make_node("Loop", ["M", "", "h0"], ["h_final", "h_all"], name="steps", body=body)
    outs = [_out("h_final", 2), _out("h_all", 3)]
    return _model([node], inputs, outs, inits)


def test_loop_costs_trip_count_times_its_body():
    r = load_model_proto(_loop_model(5))
    g = r.graph
    op, c = _cost(g, "MatMul")
    # one iteration: [2,4] x [4,4] = 2*2*4*4 = 64 FLOPs; the trip count is 5 -> 320
    assert op.repeat == 5
    assert c.flops_fwd == 5 * 64 and c.flops_bwd == 2 * 5 * 64
    assert g.tensors["h_final"].shape == (2, 4)
    assert g.tensors["h_all"].shape == (5, 2, 4)
    assert g.num_params == 16
    assert any("'steps'" in w and "5 times" in w for w in r.warnings)


def test_loop_with_unknown_trip_count_warns_and_costs_one_iteration():
    r = load_model_proto(_loop_model(None))
    op, c = _cost(r.graph, "MatMul")
    assert op.repeat == 1 and c.flops_fwd == 64
    assert r.graph.tensors["h_all"].shape == (1, 2, 4)
    note = next(w for w in r.warnings if "'steps'" in w)
    assert "ONE iteration" in note and "re-export" in note and "--lenient" not in note


def test_scan_costs_its_sequence_length():
    # Scan over x [6, 2, 3] on axis 0: s' = s + x_t w, w [3, 4]; scan output s'
    body = helper.make_graph(
        [helper.make_node("MatMul", ["xt", "w"], ["p"]), helper.make_node("Add", ["s", "p"], ["s2"]),
         helper.make_node("Identity", ["s2"], ["y"])],
        "body", [helper.make_tensor_value_info("s", F, [2, 4]), helper.make_tensor_value_info("xt", F, [2, 3])],
        [helper.make_tensor_value_info("s2", F, [2, 4]), helper.make_tensor_value_info("y", F, [2, 4])])
    node = helper.make_node("Scan", ["s0", "x"], ["s_final", "ys"], name="scan", body=body, num_scan_inputs=1)
    m = _model([node], [helper.make_tensor_value_info("s0", F, [2, 4]), helper.make_tensor_value_info("x", F, [6, 2, 3])],
               [_out("s_final", 2), _out("ys", 3)], [_zeros("w", [3, 4])])
    g = load_model_proto(m).graph
    op, c = _cost(g, "MatMul")
    # per step [2,3] x [3,4] = 2*2*3*4 = 48 FLOPs, 6 steps -> 288
    assert op.repeat == 6 and c.flops_fwd == 288
    assert g.tensors["ys"].shape == (6, 2, 4) and g.tensors["s_final"].shape == (2, 4)


def test_sequence_map_is_refused_without_advising_lenient():
    body = helper.make_graph([helper.make_node("Identity", ["a"], ["b"])], "body",
                             [helper.make_tensor_value_info("a", F, [2])], [helper.make_tensor_value_info("b", F, [2])])
    seq = helper.make_tensor_sequence_value_info("s", F, [2])
    node = helper.make_node("SequenceMap", ["s"], ["t"], body=body, name="map")
    m = _model([node], [seq], [helper.make_tensor_sequence_value_info("t", F, [2])])
    with pytest.raises(ModelError, match="SequenceMap") as err:
        load_model_proto(m, ImportOptions(lenient=True))
    assert "--lenient" not in str(err.value)


def _activation_bytes(m):
    config = ParallelConfig(micro_batch_size=2, global_batch_size=2)
    imported = load_model_proto(m, ImportOptions(batch_size=2))
    analysis = analyze_graph(imported, config, make_cluster("a100", 1, 1), advise=False)
    return analysis.stages[0].memory["activations_bytes"]


def test_loop_body_keeps_its_activations_once_per_iteration():
    # the body's MatMul keeps h (the carried state, a new value each iteration) for dw:
    # [2, 4] in bf16 = 16 bytes per iteration, 5 iterations -> 80
    assert _activation_bytes(_loop_model(5)) == 5 * _activation_bytes(_loop_model(None)) == 80


FIXTURES = Path(__file__).parent / "fixtures"


def _torch_params(model: str) -> int:
    import json

    return json.loads((FIXTURES / "fixtures_expected.json").read_text())["models"][model]["torch"]["parameter_count"]


def test_vad_fixture_runs_through_the_command_line_without_lenient(tmp_path):
    """The real TorchScript export (tests/fixtures/export_models.py, TinyVAD): an If on the sample
    rate whose branches hold a Conv1d + LSTM each and return ranks 2 and 3."""
    import json
    import subprocess
    import sys

    out = tmp_path / "out"
    root = FIXTURES.parents[1]
    result = subprocess.run([sys.executable, str(root / "main.py"), str(FIXTURES / "vad_lstm_if.onnx"), "--dim", "samples=512",
                             "--no-site", "--out", str(out)], capture_output=True, text=True, cwd=root)
    assert result.returncode == 0, result.stderr
    data = json.loads((out / "data.json").read_text())
    assert any("heavier branch" in w and "different ranks" in w for w in data["warnings"])
    # torch: 50,817. Both branches' Conv1d (256 + 32) and LSTM (W 8192 + R 16384 + B 512) count,
    # the branch not taken included; the one-element head.bias of Linear(64, 1) is the 1 missing
    # (one-element initializers are not parameters in the importer's weight rules)
    assert _torch_params("vad_lstm_if") - data["model"]["params"] in (0, 1)


def test_rnn_loop_fixture_counts_torch_parameters_and_warns_of_the_trip_count():
    # RNN (main-graph Constant weights) + GRU in a Loop body (gate-reordered Constant weights)
    r = load_model_proto(onnx.load(FIXTURES / "rnn_loop.onnx", load_external_data=False), ImportOptions(seq_len=16))
    assert r.graph.num_params == _torch_params("rnn_loop") == 8464
    assert {o.op_type for o in r.graph.ops} >= {"RNN", "GRU"}
    assert any("Loop" in w and "ONE iteration" in w for w in r.warnings)


def test_fast_path_equals_the_analysis_on_a_loop(tmp_path):
    import dataclasses

    from dml2comm.hardware.cluster import get_cluster
    from dml2comm.search.space import Constraints
    from dml2comm.search.sweep import SweepSpace, run_sweep

    path = tmp_path / "loop.onnx"
    onnx.save(_loop_model(5, batch="batch"), path)

    def builder(n):
        return dataclasses.replace(get_cluster("dgx-a100", n), collective_overhead_s=0.0)

    space = SweepSpace(global_batch_size=4, constraints=Constraints(micro_batch_sizes=(1, 2), zero_stages=(0,), recompute=("none",)))
    full = run_sweep(str(path), 2, builder, space, fast=False)
    quick = run_sweep(str(path), 2, builder, space, fast=True)
    assert len(full.rows) == len(quick.rows) > 0
    for a, b in zip(full.rows, quick.rows):
        assert a["config"] == b["config"] and a["error"] == b["error"]
        if not a["error"]:
            assert b["iteration_time_s"] == pytest.approx(a["iteration_time_s"], rel=1e-9)
            assert b["peak_memory_bytes"] == a["peak_memory_bytes"]
