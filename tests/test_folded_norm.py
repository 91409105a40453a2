"""BatchNorm an exporter folded into the convolutions is put back at import (a training step runs
it); a convolutional export with no normalisation the import can restore is warned."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from dml2comm import zoo
from dml2comm.analysis import folded_normalization_warning
from dml2comm.ir.onnx_import import ImportOptions
from dml2comm.load import load_model, load_model_proto
from tests.helpers import fixture_path

FIXTURES = Path(__file__).resolve().parent / "fixtures"


@pytest.mark.parametrize("name, convs", [("resnet18_dynamo", 20), ("resnet18_legacy", 20), ("resnet18_functions_legacy", 20),
                                         ("cnn_classifier_dynamo", 4), ("cnn_classifier_legacy", 4)])
def test_folded_batchnorm_is_restored_after_each_convolution(name, convs):
    imported = load_model(str(fixture_path(f"{name}.onnx")), ImportOptions(batch_size=2))
    ops = imported.graph.ops
    bns = [op for op in ops if op.op_type == "BatchNormalization"]
    assert len(bns) == convs
    for bn in bns:  # each reads a convolution's output, with a learned scale and shift
        producer = imported.graph.producer(bn.inputs[0])
        assert ops[producer].op_type == "Conv"
        assert [imported.graph.tensors[n].is_weight for n in bn.inputs[1:]] == [True, True, False, False]
    assert any(w.startswith(f"normalization: BatchNorm was folded into {convs} convolution(s)") for w in imported.warnings)
    assert folded_normalization_warning(imported.graph) is None


def _vgg_like(named_bias: bool) -> onnx.ModelProto:
    """Two biased 3x3 convolutions and no normalisation (a VGG-style network)."""
    names = ("features.0.weight", "features.0.bias", "features.2.weight", "features.2.bias") if named_bias else \
        ("onnx::Conv_7", "onnx::Conv_8", "onnx::Conv_9", "onnx::Conv_10")
    inits = [helper.make_tensor(names[0], TensorProto.FLOAT, [8, 3, 3, 3], [0.0] * 216),
             helper.make_tensor(names[1], TensorProto.FLOAT, [8], [0.0] * 8),
             helper.make_tensor(names[2], TensorProto.FLOAT, [8, 8, 3, 3], [0.0] * 576),
             helper.make_tensor(names[3], TensorProto.FLOAT, [8], [0.0] * 8)]
    nodes = [helper.make_node("Conv", ["x", names[0], names[1]], ["a"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["a"], ["b"]),
             helper.make_node("Conv", ["b", names[2], names[3]], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"])]
    graph = helper.make_graph(nodes, "vgg", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8, 16, 16])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_network_without_normalisation_keeps_its_biased_convolutions_and_is_warned():
    kept = load_model_proto(_vgg_like(named_bias=True), ImportOptions())
    assert [op.op_type for op in kept.graph.ops] == ["Conv", "Relu", "Conv", "Relu"]
    assert kept.graph.num_params == 216 + 8 + 576 + 8
    text = folded_normalization_warning(kept.graph)
    assert text is not None and "TrainingMode.TRAINING" in text
    # TorchScript's folding constants on weight and bias: BatchNorm restored, the biases dropped
    restored = load_model_proto(_vgg_like(named_bias=False), ImportOptions())
    assert [op.op_type for op in restored.graph.ops] == ["Conv", "BatchNormalization", "Relu", "Conv", "BatchNormalization", "Relu"]
    assert restored.graph.num_params == 216 + 576 + 2 * (8 + 8)


def test_kept_batchnorm_and_transformers_are_left_alone():
    resnet = load_model_proto(zoo.build_resnet(depth=18, image_size=64), ImportOptions(batch_size=2))
    assert not any(w.startswith("normalization:") for w in resnet.warnings)
    assert folded_normalization_warning(resnet.graph) is None
    gpt = load_model(str(FIXTURES / "gpt2_legacy.onnx"), ImportOptions(batch_size=1, seq_len=16))
    assert folded_normalization_warning(gpt.graph) is None


def test_a_marked_convolution_whose_zero_bias_was_dropped_is_restored_too():
    """A model at its initial BatchNorm shift (0) exported by the dynamo exporter: onnxscript folds
    the BatchNorm (FuseBatchNormIntoConv), then drops the all-zero bias it made
    (RemoveOptionalBiasFromConv), leaving a bias-free Conv that still carries the mark (seen on a
    transformers ResNet exported with torch 2.13 at its initial weights)."""
    w = helper.make_tensor("stem.conv.weight", TensorProto.FLOAT, [8, 3, 3, 3], [0.0] * 216)
    conv = helper.make_node("Conv", ["x", "stem.conv.weight"], ["a"], pads=[1, 1, 1, 1], name="node_Conv_1")
    conv.metadata_props.add(key="pkg.onnxscript.rewriter.rule_name",
                            value="RemoveOptionalBiasFromConv, FuseBatchNormIntoConv, RemoveOptionalBiasFromConv")
    graph = helper.make_graph([conv, helper.make_node("Relu", ["a"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8, 16, 16])], [w])
    imported = load_model_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), ImportOptions())
    assert [op.op_type for op in imported.graph.ops] == ["Conv", "BatchNormalization", "Relu"]
    assert imported.graph.num_params == 216 + 2 * 8
