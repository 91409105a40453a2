"""Layer grouping from dynamo metadata, legacy scoped names, and structure alone."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from dml2comm import zoo
from dml2comm.ir.layers import group_layers
from dml2comm.ir.onnx_import import ImportOptions
from dml2comm.load import load_model_proto
from tests.helpers import fixture_path, model, weight

FIXTURES = Path(__file__).parent / "fixtures"

EXPECTED_BLOCKS = {
    "gpt2_legacy.onnx": 12, "gpt2_dynamo.onnx": 12, "bert_legacy.onnx": 12, "bert_dynamo.onnx": 12,
    "llama_gqa_legacy.onnx": 4, "llama_gqa_dynamo.onnx": 4, "resnet18_legacy.onnx": 8, "resnet18_dynamo.onnx": 8,
    "mixtral_tiny_legacy.onnx": 2, "mixtral_tiny_dynamo.onnx": 2,
}


def _load(m: onnx.ModelProto):
    return load_model_proto(m, ImportOptions(seq_len=128)).graph


def _strip(m: onnx.ModelProto) -> onnx.ModelProto:
    for node in m.graph.node:
        node.name = ""
        del node.metadata_props[:]
    return m


@pytest.mark.parametrize("name", sorted(EXPECTED_BLOCKS))
def test_exports_group_into_their_blocks(name):
    path = fixture_path(name)
    lg = group_layers(_load(onnx.load(path, load_external_data=False)))
    assert lg.source == "scopes"
    assert lg.num_blocks == EXPECTED_BLOCKS[name]
    assert lg.layers[0].kind == "embedding"
    # BertModel ends with its last encoder layer (no head); the others have one
    assert lg.layers[-1].kind == ("block" if name.startswith("bert") else "head")
    # every op in exactly one layer, layers contiguous in op order
    assert sorted(i for l in lg.layers for i in l.op_indices) == list(range(len(lg.graph.ops)))


@pytest.mark.parametrize("name", [n for n in sorted(EXPECTED_BLOCKS) if not n.startswith("resnet")])
def test_structure_alone_finds_transformer_blocks(name):
    lg = group_layers(_load(_strip(onnx.load(FIXTURES / name, load_external_data=False))))
    assert lg.source == "structure"
    assert lg.num_blocks == EXPECTED_BLOCKS[name]


def test_structure_alone_finds_resnet_residual_blocks():
    lg = group_layers(_load(_strip(onnx.load(FIXTURES / "resnet18_legacy.onnx", load_external_data=False))))
    assert lg.source == "structure" and lg.num_blocks == 8


@pytest.mark.parametrize("preset,blocks", [("gpt2-small", 12), ("llama2-7b", 32), ("bert-base", 12), ("mixtral-8x7b", 32), ("resnet50", 16)])
def test_zoo_models_group_by_scope(preset, blocks):
    lg = group_layers(_load(zoo.build_preset(preset)))
    assert lg.num_blocks == blocks


def test_moe_experts_do_not_become_layers():
    lg = group_layers(_load(zoo.build_preset("mixtral-8x7b")))
    assert all(".experts." not in l.name for l in lg.layers)


def _resnet_with_a_sequential_stem(stem: list[str], stages: int) -> onnx.ModelProto:
    """Legacy-named ResNet: a stem of numbered children (``stem``: each ``conv`` or ``relu``, one
    module ``stem.N`` each; ``convrelu``: a ConvBnAct-style module of two ops), ``stages`` x 2
    residual blocks ``layer{s}.{0,1}`` (conv, relu, conv, + x, relu) and the classifier."""
    c = 8
    conv = dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    nodes, inits, prev, k = [], [weight("fc.weight", [10, c])], "x", 0
    for i, kind in enumerate(stem):
        if "conv" in kind:
            inits.append(weight(f"stem.{i}.weight", [c, c, 3, 3]))
            nodes.append(helper.make_node("Conv", [prev, f"stem.{i}.weight"], [f"t{k}"], name=f"/stem/stem.{i}/conv/Conv", **conv))
            prev, k = f"t{k}", k + 1
        if "relu" in kind:
            nodes.append(helper.make_node("Relu", [prev], [f"t{k}"], name=f"/stem/stem.{i}/Relu"))
            prev, k = f"t{k}", k + 1
    for s_ in range(1, stages + 1):
        for j in (0, 1):
            block = f"/layer{s_}/layer{s_}.{j}"
            w1, w2 = f"layer{s_}.{j}.conv1.weight", f"layer{s_}.{j}.conv2.weight"
            inits += [weight(w1, [c, c, 3, 3]), weight(w2, [c, c, 3, 3])]
            a, b, d, e, out = (f"t{k + n}" for n in range(5))
            nodes += [helper.make_node("Conv", [prev, w1], [a], name=f"{block}/conv1/Conv", **conv),
                      helper.make_node("Relu", [a], [b], name=f"{block}/relu/Relu"),
                      helper.make_node("Conv", [b, w2], [d], name=f"{block}/conv2/Conv", **conv),
                      helper.make_node("Add", [d, prev], [e], name=f"{block}/Add"),
                      helper.make_node("Relu", [e], [out], name=f"{block}/relu_1/Relu")]
            prev, k = out, k + 5
    nodes += [helper.make_node("GlobalAveragePool", [prev], ["gap"], name="/avgpool/GlobalAveragePool"),
              helper.make_node("Flatten", ["gap"], ["flat"], name="/Flatten"),
              helper.make_node("Gemm", ["flat", "fc.weight"], ["y"], name="/fc/Gemm", transB=1)]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", c, 16, 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 10])
    return model(nodes, [x], [y], inits)


@pytest.mark.parametrize("stem,stages", [(["conv", "relu"], 1), (["convrelu", "convrelu"], 4)])
def test_a_sequential_stem_does_not_hide_the_residual_blocks(stem, stages):
    """A stem ``nn.Sequential`` numbers its children (``stem.0``), and ``layer1.0`` is one
    numbered level too: the blocks are the residual blocks, whether the stem's children are a
    conv and an activation (the activation applies no weight: ``stem.*`` is no stack of blocks,
    even where its 2 ops are 13% of a small model's 15) or two conv modules (``stem.*`` covers
    fewer ops than ``layer*.*``).  Before, ``stem.*`` (one numbered level against
    ``layer*.*``'s two wildcards) made the blocks and the residual blocks one head."""
    lg = group_layers(_load(_resnet_with_a_sequential_stem(stem, stages)))
    assert lg.source == "scopes"
    blocks = [f"layer{s}.{j}" for s in range(1, stages + 1) for j in (0, 1)]
    assert [layer.name for layer in lg.layers] == ["embedding"] + blocks + ["head"]
