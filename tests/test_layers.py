"""Layer grouping from dynamo metadata, legacy scoped names, and structure alone."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from dml2comm import zoo
from dml2comm.ir.layers import group_layers
from dml2comm.ir.onnx_import import ImportOptions, load_model_proto

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
    path = FIXTURES / name
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
