"""Encoder-decoder exports (T5, BART) split into blocks and pipeline stages as a user expects.

- T5 numbers the sub-layers of a block (``encoder.block.N.layer.0`` self-attention, ``layer.1``
  feed-forward): the blocks are ``encoder.block.N``, never the sub-layers.
- T5's relative position bias is computed once per stack from a weight and the sequence length
  and read by every block of that stack: a stage rebuilds it from its own copy of the weight
  (gradients all-reduced like a tied embedding), it is never sent between stages.
- A decoder's token embedding, computed from the inputs between the two stacks, opens the
  decoder's first block: a split between the stacks sends the encoder output only.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from dml2comm.analysis import analyze_graph
from dml2comm.hardware.cluster import get_cluster
from dml2comm.ir.layers import group_layers
from dml2comm.ir.onnx_import import ImportOptions
from dml2comm.load import load_model, load_model_proto
from dml2comm.network.kinds import CollectiveKind, ParallelDim, Phase
from dml2comm.parallel.config import ParallelConfig
from dml2comm.parallel.pipeline import weight_derived

FIXTURES = Path(__file__).parent / "fixtures"
T5 = {"t5_legacy.onnx": {"tie_embeddings": True}, "t5_dynamo.onnx": {}}
BART = {"bart_legacy.onnx": {"tie_embeddings": True}, "bart_dynamo.onnx": {}}
SEQ, HEADS, D_MODEL = 16, 4, 64


def _load(name: str, options: dict, b: int = 2):
    return load_model(FIXTURES / name, ImportOptions(batch_size=b, seq_len=SEQ, **options))


def _analyse(imported, p: int, b: int = 2):
    config = ParallelConfig(dp_size=1, tp_size=1, pp_size=p, micro_batch_size=b, global_batch_size=8 * b, seq_len=SEQ)
    return analyze_graph(imported, config, get_cluster("dgx-a100", p), advise=False, timeline=False)


def _forward_sends(a, stage: int | None = None):
    return [c for c in a.comms if c.dim is ParallelDim.PP and c.kind is CollectiveKind.SEND_RECV
            and c.phase is Phase.FORWARD and (stage is None or c.stage == stage)]


@pytest.mark.parametrize("name", sorted(T5))
def test_t5_blocks_are_the_numbered_blocks_not_their_sub_layers(name):
    """Before: 12 blocks (``encoder.block.0.layer.0``, ``encoder.block.0.layer.1``, ...), so a
    pipeline stage could end between a block's attention and its feed-forward."""
    layers = group_layers(_load(name, T5[name]).graph).layers
    assert [layer.name for layer in layers] == ["embedding", "encoder.block.0", "encoder.block.1", "encoder.block.2",
                                                "decoder.block.0", "decoder.block.1", "head"]


def test_nested_blocks_that_repeat_inside_their_parent_stay_the_blocks():
    """ResNet's ``stages.N.layers.M`` residual blocks (alike inside a stage) are still the blocks."""
    layers = group_layers(load_model(FIXTURES / "resnet18_legacy.onnx", ImportOptions(batch_size=1)).graph).layers
    assert sum(layer.kind == "block" for layer in layers) == 8


@pytest.mark.parametrize("name", sorted(T5))
@pytest.mark.parametrize("p", [2, 3, 4])
def test_t5_position_bias_is_rebuilt_on_each_stage_not_sent(name, p):
    """Every tensor crossing a boundary is a (b, s, d_model) hidden state; each stack's
    ``relative_attention_bias`` table is held by every stage whose blocks read its bias, and its
    gradient all-reduced among them.  Before: the (1, heads, s, s) bias went forward every
    micro-batch and its gradient back."""
    imported = _load(name, T5[name])
    a = _analyse(imported, p)
    sends = _forward_sends(a)
    assert sends
    for c in sends:
        assert a.graph.tensors[c.tensor].shape == (2, SEQ, D_MODEL), c.tensor
    stage_of_layer = {layer.index: layer.stage for layer in a.layers}
    tied = [c for c in a.comms if c.dim is ParallelDim.PP and c.kind is CollectiveKind.ALL_REDUCE]
    for stack in ("encoder", "decoder"):
        table = f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
        stages = sorted({stage_of_layer[layer.index] for layer in a.layers if layer.name.startswith(f"{stack}.block.")})
        holders = sorted({c.stage for c in tied if table in c.tensor.split(", ")})
        assert holders == (stages if len(stages) > 1 else []), (stack, stages, holders)


@pytest.mark.parametrize("name", sorted(T5))
def test_t5_position_bias_is_weight_derived(name):
    """The bias each stack's block 0 makes is listed with the one table it comes from."""
    g = _load(name, T5[name]).graph
    rebuilt = weight_derived(g)
    read_by_later_blocks = {n for n, srcs in rebuilt.items() if len(g.consumers(n)) > 1
                            and g.tensors[n].shape == (1, HEADS, SEQ, SEQ)}
    assert len(read_by_later_blocks) == 2
    assert sorted(rebuilt[n] for n in read_by_later_blocks) == [
        ("decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",),
        ("encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",)]


@pytest.mark.parametrize("name", sorted(BART) + sorted(T5))
def test_a_split_between_the_stacks_sends_the_encoder_output_only(name):
    """p = 2 puts the encoder on stage 0 and the decoder on stage 1: the decoder's token
    embedding (computed from decoder_input_ids) is made on stage 1, in the decoder's first
    block.  Before, it joined the encoder's last block and crossed the boundary as a second
    activation every micro-batch."""
    options = {**BART, **T5}[name]
    a = _analyse(_load(name, options), 2)
    stage0 = [layer.name for layer in a.layers if layer.stage == 0]
    assert not any("decoder" in n for n in stage0) and any("encoder" in n for n in stage0), stage0
    (send,) = _forward_sends(a, 0)
    producer = a.graph.ops[a.graph.producer(send.tensor)]
    assert "encoder" in producer.scope and "decoder" not in producer.scope, producer.scope
    decoder_embedding = [op for op in a.graph.ops if op.op_type == "Gather" and "decoder" in op.scope
                         and "embed_tokens" in op.scope]
    assert decoder_embedding
    first_decoder = next(layer for layer in a.layered.layers if layer.kind == "block" and "decoder" in layer.name)
    members = set(first_decoder.op_indices)
    assert all(op.index in members for op in decoder_embedding)


# ---------------------------------------------------------------------------- weight_derived rules


def _positions_graph(index_from: str, dropout: bool = False):
    """A (s, s) bias gathered from a [32, 4] weight table, added to x [1, 4, s, s]; the bucket
    index comes from the input's shape (``Range(Shape(x)[-1])``) or from an index input."""
    s = 8
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, s, s])
    inputs = [x]
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, s, s])
    table = numpy_helper.from_array(np.zeros((32, 4), np.float32), "rel.weight")
    consts = [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in
              (("zero", 0), ("one", 1), ("last", [-1]), ("axes0", [0]), ("perm_axes", [0]))]
    nodes = []
    if index_from == "shape":
        nodes += [helper.make_node("Shape", ["x"], ["shape"]),
                  helper.make_node("Gather", ["shape", "last"], ["len1"]),
                  helper.make_node("Squeeze", ["len1", "axes0"], ["len"]),
                  helper.make_node("Range", ["zero", "len", "one"], ["pos"]),
                  helper.make_node("Unsqueeze", ["pos", "axes0"], ["row"]),
                  helper.make_node("Unsqueeze", ["pos", "one"], ["col"]),
                  helper.make_node("Sub", ["row", "col"], ["rel"]),
                  helper.make_node("Abs", ["rel"], ["bucket"])]
    else:
        inputs.append(helper.make_tensor_value_info("bucket", TensorProto.INT64, [s, s]))
    nodes += [helper.make_node("Gather", ["rel.weight", "bucket"], ["bias_ssh"]),
              helper.make_node("Transpose", ["bias_ssh"], ["bias_hss"], perm=[2, 0, 1])]
    src = "bias_hss"
    if dropout:
        nodes.append(helper.make_node("Dropout", [src], ["bias_drop"]))
        src = "bias_drop"
    nodes.append(helper.make_node("Add", ["x", src], ["y"]))
    graph = helper.make_graph(nodes, "positions", inputs, [y], [table, *consts])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return load_model_proto(model, ImportOptions(batch_size=1)).graph


def test_a_bias_from_a_table_and_the_input_shape_is_weight_derived():
    g = _positions_graph("shape")
    assert weight_derived(g) == {"bias_ssh": ("rel.weight",), "bias_hss": ("rel.weight",)}


def test_a_bias_indexed_by_input_values_or_through_dropout_is_not():
    assert weight_derived(_positions_graph("input")) == {}
    assert "bias_drop" not in weight_derived(_positions_graph("shape", dropout=True))
