"""Exports that are not a training step's graph, said and, where the graph allows, planned as one.

- An LM head over fewer positions than the model reads: transformers' ``logits_to_keep``
  (``num_logits_to_keep`` before 4.50) keeps the last positions for generation, and the
  TorchScript exporter turns its default 0 into a graph input that keeps one position
  (``tests/fixtures/llama_logits_default_legacy.onnx``).  A training step computes the logits
  of every position.
- A graph whose shapes contradict themselves (the legacy export of interleaved rotary
  embeddings): the error names the clash and the likely cause, not a shape to declare.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from dml2comm.cost.loss import logits_outputs
from dml2comm.errors import ModelError
from dml2comm.ir.onnx_import import ImportOptions
from dml2comm.load import load_model, load_model_proto
from tests.helpers import model, weight

FIXTURES = Path(__file__).parent / "fixtures"
V, H = 50, 8  # vocabulary and hidden size of the hand-built language model


def _lm(pick: str) -> onnx.ModelProto:
    """input_ids [batch, seq] -> embedding [V, H] -> MatMul [H, H] -> ``pick`` -> lm_head [H, V].

    ``pick``: ``"slice"`` keeps the last position (``hidden[:, -1:, :]``, logits_to_keep=1),
    ``"slice_reshape"`` does too and then reshapes to a fixed [2, H] (which cannot take every
    position), ``"none"`` keeps them all."""
    ids = helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"])
    logits = helper.make_tensor_value_info("logits", TensorProto.FLOAT, [2, V] if pick == "slice_reshape" else ["batch", "kept", V])
    nodes = [helper.make_node("Gather", ["wte", "input_ids"], ["e"], name="/embed/Gather"),
             helper.make_node("MatMul", ["e", "body.w"], ["hidden"], name="/body/MatMul")]
    inits = [weight("wte", [V, H]), weight("body.w", [H, H]), weight("lm_head.w", [H, V])]
    head_in = "hidden"
    if pick.startswith("slice"):
        inits += [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in
                  (("starts", [-1]), ("ends", [2**62]), ("axes", [1]))]
        nodes.append(helper.make_node("Slice", ["hidden", "starts", "ends", "axes"], ["kept"], name="/Slice"))
        head_in = "kept"
    if pick == "slice_reshape":
        inits.append(numpy_helper.from_array(np.array([2, H], np.int64), "to"))
        nodes.append(helper.make_node("Reshape", ["kept", "to"], ["flat"], name="/Reshape"))
        head_in = "flat"
    nodes.append(helper.make_node("MatMul", [head_in, "lm_head.w"], ["logits"], name="/lm_head/MatMul"))
    return model(nodes, [ids], [logits], inits)


def test_a_legacy_export_with_logits_to_keep_is_planned_over_every_position():
    r = load_model(FIXTURES / "llama_logits_default_legacy.onnx", ImportOptions(batch_size=2, seq_len=16))
    (note,) = [w for w in r.warnings if "LM head's output" in w]
    # 2 x 16 = 32 token positions read, the export's logits hold 2 (one per sequence)
    assert "holds the logits of 2 of the 32 token positions the model reads (1 in 16)" in note
    assert "node '/Gather' (Gather) keeps only those" in note
    assert "over all 32 positions" in note
    assert "logits_to_keep=0" in note and "num_logits_to_keep" in note and "dynamo=True" in note
    g = r.graph
    head = g.ops[g.producer("logits")]
    assert head.name == "/lm_head/MatMul" and g.tensors[head.inputs[0]].shape == (2, 16, 64)
    assert g.tensors["logits"].shape == (2, 16, 1000)
    # the loss is the training step's: over 2 x 16 x 1000 logits
    assert [(name, g.tensors[name].numel) for name, _ in logits_outputs(g)] == [("logits", 32_000)]
    # the position the export kept was a graph input; the training step has none
    assert g.inputs == ("input_ids",) and g.num_params == 202_048


def test_a_head_after_a_slice_of_the_last_position_is_widened():
    r = load_model_proto(_lm("slice"), ImportOptions(batch_size=2, seq_len=8))
    (note,) = [w for w in r.warnings if "LM head's output" in w]
    assert "2 of the 16 token positions the model reads (1 in 8): node '/Slice' (Slice)" in note
    assert r.graph.tensors["logits"].shape == (2, 8, V)
    assert not any(op.op_type == "Slice" for op in r.graph.ops)
    # the same model with its head over every position: as it was, nothing said
    full = load_model_proto(_lm("none"), ImportOptions(batch_size=2, seq_len=8))
    assert not any("LM head's output" in w for w in full.warnings)
    assert [(op.name, op.op_type) for op in full.graph.ops] == [(op.name, op.op_type) for op in r.graph.ops]


def test_a_head_that_cannot_take_every_position_is_costed_as_exported_and_said():
    r = load_model_proto(_lm("slice_reshape"), ImportOptions(batch_size=2, seq_len=8))
    (note,) = [w for w in r.warnings if "LM head's output" in w]
    assert "costed for those 2 positions only, not the 16 a training step computes" in note
    assert r.graph.tensors["logits"].shape == (2, V)


def _clash(op: str, producer: str) -> onnx.ModelProto:
    """x [batch, 16, 16]; its first 8 features [batch, 16, 8] added back to it (``Add``), or x
    expanded to [2, 16, 8] (``Expand``): shapes that do not broadcast."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16, 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 16, "d"])
    inits = [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in
             (("starts", [0]), ("ends", [8]), ("axes", [2]), ("to", [2, 16, 8]))]
    if op == "Add":
        nodes = [helper.make_node("Slice", ["x", "starts", "ends", "axes"], ["half"], name="/attn/Slice"),
                 helper.make_node("Add", ["x", "half"], ["y"], name="/attn/Add")]
    else:
        nodes = [helper.make_node("Expand", ["x", "to"], ["y"], name="/attn/Expand")]
    m = model(nodes, [x], [y], inits)
    m.producer_name = producer
    return m


@pytest.mark.parametrize("op,producer,clash,cause", [
    ("Add", "pytorch", "Add combines shapes [2, 16, 16] and [2, 16, 8], which do not broadcast",
     "interleaved rotary embeddings"),
    ("Expand", "", "Expand takes a tensor of shape [2, 16, 16] to shape [2, 16, 8], which it does not broadcast to",
     "fix it in the exporting code"),
])
def test_shapes_that_contradict_themselves_name_the_clash_and_the_cause(op, producer, clash, cause):
    with pytest.raises(ModelError) as err:
        load_model_proto(_clash(op, producer), ImportOptions(batch_size=2))
    message = str(err.value)
    assert f"the export is inconsistent at node '/attn/{op}': {clash}" in message
    assert "no shape you declare can make it run" in message and cause in message
    if producer == "pytorch":  # a TorchScript export: the dynamo exporter writes these models right
        assert "dynamo=True" in message
