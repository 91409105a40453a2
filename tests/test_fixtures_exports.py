"""The issue-16 real-export fixtures (made by tests/fixtures/export_models.py, see its README).

Each file holds one construct that real torch exports contain: model-local functions, weights
de-duplicated through ``Identity``, attention that merges batch and heads in a Reshape, a fixed
input shape, ``If`` + ``LSTM``, ``Loop`` + ``GRU``/``RNN``, a plain CNN. The first tests check that
the file really contains its construct (so a regenerated fixture cannot silently lose it); the
last one imports every file with dml2comm and compares its parameter count with torch's
``sum(p.numel() for p in model.parameters())`` recorded in ``fixtures_expected.json``.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import onnx
import pytest

from dml2comm.ir.onnx_import import ImportOptions
from dml2comm.load import load_model

FIXTURES = Path(__file__).parent / "fixtures"
EXPECTED = json.loads((FIXTURES / "fixtures_expected.json").read_text())

#: file -> the ImportOptions a user's command line gives it (``--seq-len 16``, ``--dim``, ...).
ISSUE16_FIXTURES: dict[str, dict] = {
    "resnet18_functions_legacy.onnx": {},
    # a Sequential stem (stem.0 conv, stem.2 ReLU numbered) before the residual blocks
    "resnet_seq_stem_functions_legacy.onnx": {},
    "resnet_seq_stem_dynamo.onnx": {},
    "bert_shared_legacy.onnx": {"seq_len": 16},
    "minilm_legacy.onnx": {"seq_len": 16},
    "minilm_dynamo.onnx": {"seq_len": 16},
    "minilm_dynamo_b2.onnx": {"seq_len": 16},
    "gpt2_fixed_legacy.onnx": {"tie_embeddings": True},  # fixed [2, 32]: nothing to bind
    "vad_lstm_if.onnx": {"dims": {"samples": 512}},
    "rnn_loop.onnx": {"seq_len": 16},
    "cnn_classifier_legacy.onnx": {},
    "cnn_classifier_dynamo.onnx": {},
    # fused QKV projections whose head-splitting views are not [.., n, d] of the query heads
    "falcon_mqa_legacy.onnx": {"seq_len": 16, "tie_embeddings": True},
    "falcon_mqa_dynamo.onnx": {"seq_len": 16},
    "bloom_legacy.onnx": {"seq_len": 16, "tie_embeddings": True},
    "bloom_dynamo.onnx": {"seq_len": 16},
    "gpt_neox_legacy.onnx": {"seq_len": 16},
    "gpt_neox_dynamo.onnx": {"seq_len": 16},
    # two stacks of numbered blocks (encoder and decoder), two token inputs
    "bart_legacy.onnx": {"seq_len": 16, "tie_embeddings": True},
    "bart_dynamo.onnx": {"seq_len": 16},
    # disentangled attention: relative-position scores repeated over the batch and gathered per position
    "deberta_v2_legacy.onnx": {"seq_len": 16},
    "deberta_v2_dynamo.onnx": {"seq_len": 16},
    # numbered sub-layers inside each block; a relative position bias made once per stack
    "t5_legacy.onnx": {"seq_len": 16, "tie_embeddings": True},
    "t5_dynamo.onnx": {"seq_len": 16},
    # factorized embeddings projected to the hidden size: the projection's output is layer 0's input
    "electra_legacy.onnx": {"seq_len": 16},
    "electra_dynamo.onnx": {"seq_len": 16},
    # issue 34: a parallel block summed (x + attn) + mlp; norms left at ones (merged by dynamo); buffers
    "cohere_tiny_dynamo.onnx": {"seq_len": 16},
    "qwen3_init_dynamo.onnx": {"seq_len": 16},
    "deepseek_v3_tiny_legacy.onnx": {"seq_len": 16},
    "deepseek_v3_tiny_dynamo.onnx": {"seq_len": 16},
    "gemma_tiny_legacy.onnx": {"seq_len": 16, "tie_embeddings": True},
    "gemma_tiny_dynamo.onnx": {"seq_len": 16},
    # a gated shared expert: shared_expert_gate is a Linear hidden -> 1 (benchmarks/newarch_findings.md)
    "qwen2_moe_tiny_dynamo.onnx": {"seq_len": 16},
    # exported through the model's own forward: logits_to_keep an input, logits of one position
    "llama_logits_default_legacy.onnx": {"seq_len": 16},
    # the held-out measured steps' models (set 6, benchmarks/bench_held_out.py)
    **{f"step_{m}_dynamo.onnx": {"seq_len": 16} for m in ("mixtral_8x0_1b", "qwen3_0_6b", "gemma_1b", "llama_3b_8l", "qwen2_0_5b",
                                                            "gpt2_large", "bert_base", "mixtral_4x0_3b_top1",
                                                            "mixtral_16x0_03b_top4")},
    "step_bert_base_legacy.onnx": {"seq_len": 16, "tie_embeddings": True},  # the legacy export stores the tied decoder twice
    **{f"step_{m}_{e}.onnx": {} for m in ("vit_base", "resnet50") for e in ("legacy", "dynamo")},
}

#: Elements that folding eval-mode BatchNorm into the preceding Conv removes (both exporters do
#: it: y = gamma * (conv(x) - mean) / sqrt(var + eps) + beta becomes one Conv with weight
#: W * gamma / sqrt(var + eps) and a C-element bias). A bias-free Conv gains that C-element bias,
#: so the graph has C fewer elements than torch's gamma + beta (2C); a Conv that has a bias
#: absorbs beta into it, so the graph has 2C fewer.
BN_FOLDED = {
    # restored at import (dml2comm.ir.onnx_import._restore_folded_batchnorm): ResNet-18's
    # bias-free convolutions get the BatchNorm back, torch's count exactly; the dynamo export
    # keeps CnnClassifier's own conv biases by name (torch's count too); the TorchScript export's
    # folding constants cannot say whether a conv had a bias of its own, so CnnClassifier's
    # (32 + 64 + 128 + 256 = 480) are dropped with the folded ones
    "cnn_classifier_legacy.onnx": 480,
}


#: Constants the tool counts as parameters (a known limitation, README "Known limitations"):
#: BLOOM's ALiBi slopes, which the dynamo exporter folds into a [heads, 1, 1] float initializer
#: with a generated name (``unsqueeze_1``) read by a Mul, like a norm's scale would be.  Weight
#: values are never read and the dynamo exporter also gives folded (transposed) weights generated
#: names, so nothing in the graph tells them apart.  And BART's ``final_logits_bias`` buffer
#: ([1, 1000], added to the logits): the legacy exporter folds its ``.to(device)`` into an
#: initializer named ``onnx::Add_784`` (the dynamo export keeps the buffer's name, which the
#: importer knows), as it names a folded ``1 + w`` norm scale that is the parameter itself.
#: DeBERTa's shared relative-position table (``encoder.rel_embeddings.weight``, 64 x 128): the
#: dynamo exporter folds it into two initializers, one per use (``unsqueeze_8``, ``unsqueeze_10``),
#: so the folded copy counts as a second parameter (values are never read).
CONSTANTS_COUNTED = {"bloom_dynamo.onnx": 4, "bart_legacy.onnx": 1000, "deberta_v2_dynamo.onnx": 8192}


def _record(name: str) -> dict:
    return next(r for r in EXPECTED["files"] if r["file"] == name)


def _torch(name: str) -> dict:
    return EXPECTED["models"][_record(name)["model"]]["torch"]


def _load(name: str) -> onnx.ModelProto:
    return onnx.load(FIXTURES / name, load_external_data=False)


def _numel(t: onnx.TensorProto) -> int:
    n = 1
    for d in t.dims:
        n *= d
    return n


def test_every_issue16_fixture_is_recorded_and_the_list_is_complete():
    recorded = {r["file"] for r in EXPECTED["files"] if "constructs" in r and not r.get("dir")}  # "dir": kept elsewhere
    assert recorded == set(ISSUE16_FIXTURES)
    assert all((FIXTURES / name).is_file() for name in ISSUE16_FIXTURES)


def test_resnet_blocks_are_model_local_functions():
    m = _load("resnet18_functions_legacy.onnx")
    calls = Counter(n.op_type for n in m.graph.node if n.domain == "__main__")
    # 8 BasicBlocks: layer1.0, layer1.1, layer2.1, layer3.1, layer4.1 without a downsample,
    # layer2.0, layer3.0, layer4.0 with a 1x1 downsample Conv (a second function)
    assert calls == {"BasicBlock": 5, "BasicBlock.1": 3}
    convs = {f.name: sum(n.op_type == "Conv" for n in f.node) for f in m.functions}
    assert convs == {"BasicBlock": 2, "BasicBlock.1": 3}
    assert sum(n.op_type == "Conv" for n in m.graph.node) == 1  # only the stem conv is outside


def test_seq_stem_resnet_numbers_its_stem_layers_and_calls_its_blocks():
    m = _load("resnet_seq_stem_functions_legacy.onnx")
    assert [n.name for n in m.graph.node if n.domain == "" and n.op_type in ("Conv", "Relu")] == [
        "/stem/stem.0/Conv", "/stem/stem.2/Relu"]
    calls = [n.name for n in m.graph.node if n.domain == "__main__"]
    assert calls == ["/layer1/layer1.0/relu/BasicBlock", "/layer1/layer1.1/relu/BasicBlock",
                     "/layer2/layer2.0/relu/BasicBlock.1", "/layer2/layer2.1/relu/BasicBlock"]


def test_llama_own_forward_keeps_one_position_for_the_lm_head():
    m = _load("llama_logits_default_legacy.onnx")
    ins = {i.name: [d.dim_value or d.dim_param for d in i.type.tensor_type.shape.dim] for i in m.graph.input}
    assert ins == {"input_ids": ["batch", "seq"], "logits_to_keep": []}  # the default 0, now an input
    (pick,) = [n for n in m.graph.node if "logits_to_keep" in n.input]
    assert pick.op_type == "Gather" and [a.i for a in pick.attribute if a.name == "axis"] == [1]
    (head,) = [n for n in m.graph.node if pick.output[0] in n.input]
    assert (head.name, list(head.output)) == ("/lm_head/MatMul", ["logits"])
    assert [d.dim_value or d.dim_param for d in m.graph.output[0].type.tensor_type.shape.dim][1:] == [1000]


def test_bert_shared_routes_equal_parameters_through_identity():
    m = _load("bert_shared_legacy.onnx")
    inits = {t.name: _numel(t) for t in m.graph.initializer}
    idents = [n for n in m.graph.node if n.op_type == "Identity" and n.input[0] in inits]
    # library init: zero [768] = 5 Linear biases + 2 LayerNorm biases per layer x 4 + the
    # embedding LayerNorm bias = 29; ones [768] = 2 LayerNorm weights x 4 + 1 = 9; zero [3072] =
    # the 4 intermediate biases. One of each is kept: 28 + 8 = 36 Identities of 768, 3 of 3072
    assert Counter(inits[n.input[0]] for n in idents) == {768: 36, 3072: 3}
    float_elements = sum(_numel(t) for t in m.graph.initializer if t.data_type == onnx.TensorProto.FLOAT)
    # 52,151,808 in initializers + 36 x 768 + 3 x 3072 = 36,864 behind Identity = torch's count
    assert float_elements + sum(inits[n.input[0]] for n in idents) == _torch("bert_shared_legacy.onnx")["parameter_count"]


@pytest.mark.parametrize("name", ["minilm_dynamo.onnx", "minilm_dynamo_b2.onnx"])
def test_minilm_dynamo_merges_batch_and_heads_in_a_reshape(name):
    m = _load(name)
    batch = [d.dim_value or d.dim_param for d in m.graph.input[0].type.tensor_type.shape.dim][0]
    assert batch == (2 if name.endswith("_b2.onnx") else "batch")
    for vi in m.graph.input:
        for d in vi.type.tensor_type.shape.dim:
            if d.dim_param:
                d.dim_value = {"batch": 2, "seq": 16}[d.dim_param]
    inferred = onnx.shape_inference.infer_shapes(m, data_prop=True)
    dims = {vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim] for vi in inferred.graph.value_info}
    merges = [(dims[n.input[0]], dims[n.output[0]]) for n in m.graph.node if n.op_type == "Reshape"
              and len(dims.get(n.input[0], ())) == 4 and len(dims.get(n.output[0], ())) == 3
              and dims[n.output[0]][0] == dims[n.input[0]][0] * dims[n.input[0]][1]]
    # K of each of the 4 layers: [batch 2, heads 12, seq 16, head_dim 32] -> [2 * 12, 16, 32]
    assert merges == [([2, 12, 16, 32], [24, 16, 32])] * 4


def test_gpt2_fixed_has_no_symbolic_dim_and_1024_positions():
    m = _load("gpt2_fixed_legacy.onnx")
    shapes = {vi.name: [d.dim_value or d.dim_param for d in vi.type.tensor_type.shape.dim]
              for vi in list(m.graph.input) + list(m.graph.output)}
    assert shapes == {"input_ids": [2, 32], "logits": [2, 32, 50257]}
    assert [list(t.dims) for t in m.graph.initializer if t.name == "transformer.wpe.weight"] == [[1024, 768]]


def test_vad_has_an_if_with_an_lstm_in_each_branch_and_different_output_ranks():
    m = _load("vad_lstm_if.onnx")
    (node,) = [n for n in m.graph.node if n.op_type == "If"]
    branches = {a.name: a.g for a in node.attribute}
    assert {k: sum(n.op_type == "LSTM" for n in g.node) for k, g in branches.items()} == {"then_branch": 1, "else_branch": 1}
    # 16 kHz: out[:, -1] -> [b, 64]; 8 kHz: out[:, -1:] -> [b, 1, 64]
    assert {k: len(g.output[0].type.tensor_type.shape.dim) for k, g in branches.items()} == {"then_branch": 2, "else_branch": 3}
    sr = [i for i in m.graph.input if i.name == "sr"]
    assert len(sr) == 1 and sr[0].type.tensor_type.elem_type == onnx.TensorProto.INT64


def test_rnn_loop_has_a_data_dependent_loop_around_a_gru():
    m = _load("rnn_loop.onnx")
    (loop,) = [n for n in m.graph.node if n.op_type == "Loop"]
    assert loop.input[0] == "steps"  # the trip count is a graph input: known only at run time
    body = next(a.g for a in loop.attribute if a.name == "body")
    assert [n.op_type for n in body.node if n.op_type in ("GRU", "LSTM", "RNN")] == ["GRU"]
    assert [n.op_type for n in m.graph.node if n.op_type in ("GRU", "LSTM", "RNN")] == ["RNN"]
    # the RNN's weights are Constant nodes (scripted export), stripped like the initializers
    rnn = next(n for n in m.graph.node if n.op_type == "RNN")
    consts = {n.output[0]: n.attribute[0].t for n in m.graph.node if n.op_type == "Constant"}
    assert [(list(consts[x].dims), consts[x].data_location) for x in rnn.input[1:4]] == [
        ([1, 32, 16], onnx.TensorProto.EXTERNAL), ([1, 32, 32], onnx.TensorProto.EXTERNAL), ([1, 64], onnx.TensorProto.EXTERNAL)]


def test_cnn_classifier_has_no_attention():
    for name in ("cnn_classifier_legacy.onnx", "cnn_classifier_dynamo.onnx"):
        ops = Counter(n.op_type for n in _load(name).graph.node)
        assert ops["Conv"] == 4 and ops["Gemm"] == 1 and not ops["Softmax"] and not ops["MatMul"]


@pytest.mark.parametrize("name", ["bart_legacy.onnx", "bart_dynamo.onnx"])
def test_an_encoder_decoder_has_both_stacks_as_blocks(name):
    """BART's encoder and decoder layers are two numbered containers at one depth
    (``model.encoder.layers.N``, ``model.decoder.layers.N``): both are blocks, in order, where
    only the larger stack was before (the other one went whole into the embedding or head)."""
    from dml2comm.ir.layers import group_layers

    g = load_model(FIXTURES / name, ImportOptions(batch_size=2, **ISSUE16_FIXTURES[name])).graph
    layers = group_layers(g).layers
    assert [layer.name for layer in layers] == ["embedding", "model.encoder.layers.0", "model.encoder.layers.1",
                                                "model.decoder.layers.0", "model.decoder.layers.1", "head"]


def test_fixtures_are_graph_only():
    """No float initializer with more than one element keeps its values (the weights file the
    stripped tensors point to is never written)."""
    for name in ISSUE16_FIXTURES:
        kept = [t.name for t in _load(name).graph.initializer if t.data_type == onnx.TensorProto.FLOAT
                and _numel(t) > 1 and t.data_location != onnx.TensorProto.EXTERNAL]
        assert kept == [], name
        assert not (FIXTURES / name.replace(".onnx", ".weights.bin")).exists()


@pytest.mark.parametrize("name", sorted(ISSUE16_FIXTURES))
def test_issue16_fixture_has_the_torch_parameter_count(name):
    """dml2comm's count equals torch's ``sum(p.numel())`` (minus what BatchNorm folding removes).

    Before issue 16 (HEAD at the time the fixtures were added) three of these failed:
    bert_shared_legacy counted 52,151,808 (36,864 short: the 39 parameters behind Identity
    nodes were activations), and vad_lstm_if / rnn_loop raised ModelError ("control flow is not
    supported ... pass --lenient"; with lenient=True "ONNX shape inference cannot infer the
    output of op 'If'/'Loop'").
    """
    torch = _torch(name)
    g = load_model(FIXTURES / name, ImportOptions(batch_size=2, **ISSUE16_FIXTURES[name])).graph
    assert g.num_params == torch["parameter_count"] - BN_FOLDED.get(name, 0) + CONSTANTS_COUNTED.get(name, 0)
