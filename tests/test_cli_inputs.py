"""Flags that must not mislead, and errors that point at the right thing (issue 16, parts 6-7).

Every case goes through the real command line (``dml2comm.cli.main``, and ``main.py`` in a
subprocess for the non-ONNX file): exit code 2, exactly one ``error:`` line, nothing written.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from dml2comm.cli import main
from tests.helpers import model, weight

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
POSITIONS, VOCAB, HIDDEN = 32, 100, 8


def tiny_lm(seq: int | str) -> onnx.ModelProto:
    """GPT-2's embedding pattern: ``wte(ids) + wpe(arange(seq))`` then an LM head.

    ``seq`` is the sequence axis of ``ids``: a name (symbolic, bound by --seq-len) or a number
    (a fixed-length export).  The position table ``wpe`` has 32 rows."""
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", seq])
    logits = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", seq, VOCAB])
    scalar = lambda name, v: helper.make_node("Constant", [], [name], value=helper.make_tensor(name, TensorProto.INT64, [], [v]))
    nodes = [
        helper.make_node("Shape", ["ids"], ["shape"], name="/Shape"),
        scalar("one", 1), scalar("zero", 0),
        helper.make_node("Gather", ["shape", "one"], ["n"], name="/Gather", axis=0),
        helper.make_node("Range", ["zero", "n", "one"], ["pos"], name="/Range"),
        helper.make_node("Gather", ["wte", "ids"], ["te"], name="/wte/Gather"),
        helper.make_node("Gather", ["wpe", "pos"], ["pe"], name="/wpe/Gather"),
        helper.make_node("Add", ["te", "pe"], ["h"], name="/Add"),
        helper.make_node("MatMul", ["h", "lm_head"], ["logits"], name="/lm_head/MatMul"),
    ]
    return model(nodes, [ids], [logits], [weight("wte", [VOCAB, HIDDEN]), weight("wpe", [POSITIONS, HIDDEN]),
                                          weight("lm_head", [HIDDEN, VOCAB])])


def ocr_like() -> onnx.ModelProto:
    """An OCR recogniser's input as Paddle2ONNX writes it: ``x[?, 3, ?, p2o.DynamicDimension.0]``
    (axis 0 is the batch; axis 2 has no name at all)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["", 3, "", "p2o.DynamicDimension.0"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 8, "m"])
    nodes = [
        helper.make_node("Conv", ["x", "conv.weight"], ["c"], name="/conv/Conv", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Shape", ["c"], ["s"], name="/Shape"),
        helper.make_node("Constant", [], ["target"], value=helper.make_tensor("t", TensorProto.INT64, [3], [0, 8, -1])),
        helper.make_node("Reshape", ["c", "target"], ["y"], name="/Reshape"),
    ]
    return model(nodes, [x], [y], [weight("conv.weight", [8, 3, 3, 3])])


def cli(tmp_path: Path, capsys, model_proto: onnx.ModelProto | None, *args: str, name: str = "m.onnx") -> tuple[int, list[str], Path]:
    path = tmp_path / name
    if model_proto is not None:
        onnx.save(model_proto, path)
    out = tmp_path / "out"
    code = main([str(path), *args, "--out", str(out), "--no-site", "--no-advice"])
    err = capsys.readouterr().err.strip().splitlines()
    return code, err, out


def assert_refused(result: tuple[int, list[str], Path], *patterns: str) -> str:
    code, err, out = result
    assert code == 2, err
    assert len(err) == 1 and err[0].startswith("error: "), err
    assert not out.exists() or not list(out.iterdir())
    for pattern in patterns:
        assert pattern in err[0], err[0]
    return err[0]


# ----------------------------------------------------------------------------- part 6: flags


def test_seq_len_on_a_fixed_length_export_is_refused(tmp_path, capsys):
    line = assert_refused(cli(tmp_path, capsys, tiny_lm(16), "--seq-len", "4096"),
                          "--seq-len 4096", "fixed at 16", "'ids'", "drop --seq-len", "re-export with a dynamic sequence axis")
    assert "positions" not in line  # the fixed length is the problem named first
    code, _, out = cli(tmp_path, capsys, tiny_lm(16), "--seq-len", "16")  # the model's own length: harmless
    assert code == 0 and json.loads((out / "data.json").read_text())["config"]["seq_len"] == 16


def test_seq_len_beyond_the_position_table_is_refused(tmp_path, capsys):
    assert_refused(cli(tmp_path, capsys, tiny_lm("seq"), "--seq-len", "33"), "--seq-len 33", "32 positions", "'wpe'")
    assert_refused(cli(tmp_path, capsys, tiny_lm("seq"), "--dim", "seq=64"), "64", "32 positions")
    code, _, out = cli(tmp_path, capsys, tiny_lm("seq"), "--seq-len", "32")
    assert code == 0 and json.loads((out / "data.json").read_text())["config"]["seq_len"] == 32


def test_seq_len_conflicting_with_dim_and_on_a_model_without_sequence(tmp_path, capsys):
    assert_refused(cli(tmp_path, capsys, tiny_lm("seq"), "--seq-len", "8", "--dim", "seq=16"), "conflicts with --dim")
    assert_refused(cli(tmp_path, capsys, ocr_like(), "--seq-len", "8", "--dim", "x:2=32", "--dim", "p2o.DynamicDimension.0=64"),
                   "no sequence axis", "drop --seq-len")


def test_real_gpt2_exports(tmp_path, capsys):
    """The legacy GPT-2 fixture has a symbolic sequence axis and 1,024 positions (n_positions);
    the fixed-length one was traced at [2, 32] without dynamic axes."""
    gpt2 = FIXTURES / "gpt2_legacy.onnx"
    assert_refused(cli(tmp_path, capsys, onnx.load(str(gpt2), load_external_data=False), "--seq-len", "4096"),
                   "--seq-len 4096 exceeds the model's 1,024 positions", "'transformer.wpe.weight'")
    fixed = FIXTURES / "gpt2_fixed_legacy.onnx"
    if fixed.is_file():
        assert_refused(cli(tmp_path, capsys, onnx.load(str(fixed), load_external_data=False), "--seq-len", "4096",
                           "--micro-batch-size", "2"), "fixed at 32")


def test_dim_the_model_does_not_have_is_refused_listing_its_dims(tmp_path, capsys):
    assert_refused(cli(tmp_path, capsys, tiny_lm("seq"), "--seq-len", "8", "--dim", "sequence=8"),
                   "no input dim named 'sequence'", "batch, seq")
    assert_refused(cli(tmp_path, capsys, tiny_lm("seq"), "--seq-len", "8", "--dim", "ids:5=8"), "'ids' has 2 axes")
    assert_refused(cli(tmp_path, capsys, tiny_lm(16), "--dim", "ids:1=8"), "fixed at 16")


@pytest.mark.parametrize("name, content", [("model.json", '{"graph": 1}'), ("model.json", '{"a": 1}'),
                                           ("notes.txt", "hello")])
def test_non_onnx_file_is_one_error_line(tmp_path, name, content):
    (tmp_path / name).write_text(content)
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, str(ROOT / "main.py"), name, "--out", str(out)], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert f"{name!r} is not a readable ONNX model" in lines[0] and not out.exists()


# ----------------------------------------------------------------------------- part 7: errors


def test_unbound_unnamed_and_paddle_dims_name_the_inputs_and_the_flags(tmp_path, capsys):
    line = assert_refused(cli(tmp_path, capsys, ocr_like()),
                          "'x' axis 2 (unnamed)", "'x' axis 3 ('p2o.DynamicDimension.0')",
                          "--dim x:2=N", "--dim p2o.DynamicDimension.0=N")
    assert "shape inference" not in line and "Reshape" not in line
    code, err, out = cli(tmp_path, capsys, ocr_like(), "--dim", "x:2=32", "--dim", "p2o.DynamicDimension.0=320")
    assert code == 0, err
    data = json.loads((out / "data.json").read_text())
    # conv: 2 * (3*3*3) * 8 output channels * 32 * 320 pixels = 4,423,680 FLOPs per sample
    assert data["model"]["flops_fwd_per_sample"] == pytest.approx(2 * 27 * 8 * 32 * 320)


def test_unbound_sequence_axis_leads_with_the_input_and_the_flag(tmp_path, capsys):
    line = assert_refused(cli(tmp_path, capsys, tiny_lm("seq")), "input dims not bound: 'ids' axis 1 ('seq')", "--seq-len N")
    assert "unk__" not in line and len(line) < 300


def test_many_unbound_dims_stay_one_short_line(tmp_path, capsys):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", *(f"unk__{i}" for i in range(62)), "seq"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", *(f"unk__{i}" for i in range(62)), "seq"])
    line = assert_refused(cli(tmp_path, capsys, model([helper.make_node("Relu", ["x"], ["y"])], [x], [y])), "and 59 more")
    assert len(line) < 300


def test_tp_divisibility_names_the_op_and_weight(tmp_path, capsys):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 64])
    nodes = [helper.make_node("MatMul", ["x", "fc1.weight"], ["h"], name="/fc1/MatMul"),
             helper.make_node("Relu", ["h"], ["r"], name="/act/Relu"),
             helper.make_node("MatMul", ["r", "fc2.weight"], ["y"], name="/fc2/MatMul")]
    m = model(nodes, [x], [y], [weight("fc1.weight", [64, 214]), weight("fc2.weight", [214, 64])])
    line = assert_refused(cli(tmp_path, capsys, m, "--t", "4"), "214", "MatMul '/fc1/MatMul'", "'fc1.weight'")
    assert "hidden or FFN" not in line


@pytest.mark.parametrize("yaml_text, pattern", [
    ("d: 0\n", "d: expected a positive integer, got '0' (as --d on the command line)"),
    ("t: 1.5\n", "t: expected a positive integer"),
    ("micro_batch_size: 0\n", "(as --micro-batch-size on the command line)"),
    ("zero: 5\n", "zero: 5 is not one of 0, 1, 2, 3"),
    ("lenient: 1\n", "lenient must be true or false"),
    ("dim: 3\n", "dim: expected NAME=VALUE"),
])
def test_config_errors_name_the_flag_not_the_field(tmp_path, capsys, yaml_text, pattern):
    (tmp_path / "c.yaml").write_text(yaml_text)
    line = assert_refused(cli(tmp_path, capsys, tiny_lm(16), "--config", str(tmp_path / "c.yaml")), "--config 'c.yaml'", pattern)
    assert "_size" not in line.replace("micro_batch_size", "")


def test_config_values_are_converted_like_flags(tmp_path, capsys):
    (tmp_path / "c.yaml").write_text("d: 2\ndim: {seq: 8}\nlenient: true\n")
    code, err, out = cli(tmp_path, capsys, tiny_lm("seq"), "--config", str(tmp_path / "c.yaml"))
    assert code == 0, err
    config = json.loads((out / "data.json").read_text())["config"]
    assert (config["d"], config["seq_len"]) == (2, 8)


def test_data_dependent_internal_dims_name_a_few_and_no_useless_flag(tmp_path, capsys):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    y = helper.make_tensor_value_info("y", TensorProto.INT64, [2, "n"])
    nodes = [helper.make_node("ReduceMax", ["x"], ["m"], keepdims=0, name="/max"),
             helper.make_node("Cast", ["m"], ["n"], to=TensorProto.INT64, name="/cast"),
             helper.make_node("Constant", [], ["zero"], value=helper.make_tensor("zero", TensorProto.INT64, [], [0])),
             helper.make_node("Constant", [], ["one"], value=helper.make_tensor("one", TensorProto.INT64, [], [1])),
             helper.make_node("Range", ["zero", "n", "one"], ["r"], name="/range")]
    r = helper.make_tensor_value_info("r", TensorProto.INT64, ["k"])
    m = model(nodes, [x], [r])
    line = assert_refused(cli(tmp_path, capsys, m), "internal dimension(s) stay unknown", "unk__0", "re-export it with static shapes")
    assert "--dim" not in line and "--seq-len" not in line  # binding flags cannot fix a data-dependent shape


def test_data_dependent_routing_names_the_op_and_a_fixed_size_export(tmp_path, capsys):
    """NonZero (a mixture of experts' token routing in transformers' eager experts) sizes its
    output from values: static shapes cannot help, so the message names the op and the fix."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    y = helper.make_tensor_value_info("y", TensorProto.INT64, [2, "n"])
    m = model([helper.make_node("NonZero", ["x"], ["y"], name="/experts/nz")], [x], [y])
    line = assert_refused(cli(tmp_path, capsys, m), "op NonZero at node '/experts/nz' sizes its output from the data",
                          "static shapes cannot help", "batched_mm")
    assert "--dim" not in line and "re-export it with static shapes" not in line


def paddle_placeholder_dims() -> onnx.ModelProto:
    """Paddle2ONNX's classifier input ``x[?, 3, ?, ?]``: ``?`` is written for *every* unknown
    dim (rapidocr's ``ch_ppocr_mobile_v2.0_cls_infer.onnx``), so it is a placeholder, not a
    name: binding ``?`` by name would give height and width one value."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["?", 3, "?", "?"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["?", 8, "?", "?"])
    nodes = [helper.make_node("Conv", ["x", "conv.weight"], ["y"], name="/conv/Conv", kernel_shape=[3, 3], pads=[1, 1, 1, 1])]
    return model(nodes, [x], [y], [weight("conv.weight", [8, 3, 3, 3])])


def test_placeholder_dim_names_are_bound_by_input_and_axis(tmp_path, capsys):
    line = assert_refused(cli(tmp_path, capsys, paddle_placeholder_dims()),
                          "'x' axis 2 (unnamed)", "'x' axis 3 (unnamed)", "--dim x:2=N", "--dim x:3=N")
    assert "--dim ?=" not in line
    code, err, out = cli(tmp_path, capsys, paddle_placeholder_dims(), "--dim", "x:2=48", "--dim", "x:3=192")
    assert code == 0, err
    data = json.loads((out / "data.json").read_text())
    # 2 * 27 * 8 * 48 * 192 FLOPs per sample (the two axes keep their own values)
    assert data["model"]["flops_fwd_per_sample"] == pytest.approx(2 * 27 * 8 * 48 * 192)
    assert data["config"]["micro_batch_size"] == 1  # the '?' batch axis defaults to 1


def test_a_static_leading_axis_of_a_state_input_is_not_the_batch():
    """Silero VAD: ``input[batch, sequence]`` and an LSTM state ``state[2, batch, 128]``; the
    static 2 in front of the state is the layers x directions axis, not a fixed batch."""
    from dml2comm.ir.onnx_import import ImportOptions
    from dml2comm.load import load_model_proto

    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", "sequence"])
    state = helper.make_tensor_value_info("state", TensorProto.FLOAT, [2, "batch", 128])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [])
    nodes = [helper.make_node("ReduceSum", ["state"], ["s"], keepdims=0),
             helper.make_node("ReduceSum", ["input"], ["i"], keepdims=0),
             helper.make_node("Add", ["s", "i"], ["y"])]
    r = load_model_proto(model(nodes, [x, state], [y], []), ImportOptions(seq_len=64))
    assert r.model_batch is None
    assert dict(r.bound_dims) == {"batch": 1, "sequence": 64}


@pytest.mark.parametrize("command", [
    ["sweep", "--gpus", "4", "--global-batch-size", "8", "--workers", "1"],
    ["compare", "--global-batch-size", "8", "--configs", "d=2,t=2"],
])
def test_sweep_and_compare_refuse_a_seq_len_the_model_cannot_take(tmp_path, capsys, command):
    """A fixed-length export's --seq-len would be ignored by every configuration: refused as by
    the single analysis (one line, exit 2, nothing written)."""
    out = tmp_path / "out"
    code = main([command[0], str(FIXTURES / "gpt2_fixed_legacy.onnx"), *command[1:], "--seq-len", "4096",
                 "--out", str(out), "--no-site"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("error: ") and "--seq-len 4096: the model's sequence length is fixed at 32" in err[0], err
    assert not out.exists() or not list(out.iterdir())
