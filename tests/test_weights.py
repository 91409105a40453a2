"""Parameter-derived tensors (issue 16 part 2) and tied embeddings under pipeline parallelism (part 4).

Anything computed only from parameters is a weight: a de-duplicated parameter routed through
``Identity`` counts as the parameter torch has, a view (Transpose, Cast, Reshape...) counts
once as its source, is sharded as its source and is never sent between pipeline stages.  A
parameter read on several stages (a tied word embedding) is held by each, and its gradient is
all-reduced between them once per iteration (Megatron-LM's embedding group).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from onnx import TensorProto, helper

from dml2comm.analysis import analyze_graph, comm_by_dim
from dml2comm.errors import Dml2CommError
from dml2comm.hardware.cluster import make_cluster
from dml2comm.ir.layers import group_layers
from dml2comm.ir.onnx_import import ImportOptions
from dml2comm.load import load_model, load_model_proto
from dml2comm.network.kinds import CollectiveKind, ParallelDim, Phase
from dml2comm.parallel.config import ParallelConfig
from dml2comm.parallel.pipeline import held_copies
from dml2comm.sim.engine import DeviceWork, simulate
from tests.oracles import build_schedule
from tests.helpers import PACKAGED_MODELS, fixture_path, model, weight

FIXTURES = Path(__file__).parent / "fixtures"
H = 16  # hidden size of the hand-built graphs


def _analyse(imported, p, t=1, m=8, b=1, timeline=False):
    config = ParallelConfig(dp_size=1, tp_size=t, pp_size=p, micro_batch_size=b, global_batch_size=m * b, seq_len=None)
    return analyze_graph(imported, config, make_cluster("a100", t * p), advise=False, timeline=timeline)


def _sends(a):
    return [c for c in a.comms if c.dim is ParallelDim.PP and c.kind is CollectiveKind.SEND_RECV]


def _tied(a):
    return [c for c in a.comms if c.dim is ParallelDim.PP and c.kind is CollectiveKind.ALL_REDUCE]


# ---------------------------------------------------------------------------- part 2: import


def _dedup_graph():
    """Two LayerNorms whose parameters the legacy exporter de-duplicated (the second reads
    ``Identity`` copies named after its own parameters), and a MatMul reading an ``Identity``
    copy with a generated name (a view, not a parameter)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, H])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, H])
    nodes = [
        helper.make_node("Identity", ["a.ln.weight"], ["b.ln.weight"], name="Identity_1"),
        helper.make_node("Identity", ["a.ln.bias"], ["b.ln.bias"], name="Identity_2"),
        helper.make_node("Identity", ["a.fc.weight"], ["onnx::MatMul_9"], name="Identity_3"),
        helper.make_node("LayerNormalization", ["x", "a.ln.weight", "a.ln.bias"], ["n1"], name="/a/ln/LayerNormalization"),
        helper.make_node("MatMul", ["n1", "a.fc.weight"], ["h1"], name="/a/fc/MatMul"),
        helper.make_node("LayerNormalization", ["h1", "b.ln.weight", "b.ln.bias"], ["n2"], name="/b/ln/LayerNormalization"),
        helper.make_node("MatMul", ["n2", "onnx::MatMul_9"], ["y"], name="/b/fc/MatMul"),
    ]
    inits = [weight("a.ln.weight", [H]), weight("a.ln.bias", [H]), weight("a.fc.weight", [H, H])]
    return model(nodes, [x], [y], inits)


def test_deduplicated_parameters_count_as_torch_counts_them():
    r = load_model_proto(_dedup_graph())
    g = r.graph
    # torch: a.ln (16 + 16) + a.fc (256) + b.ln (16 + 16) = 320; the generated-name copy of
    # a.fc is the same parameter read twice (counted once)
    assert g.num_params == 320
    assert g.tensors["b.ln.weight"].is_parameter and g.tensors["b.ln.bias"].is_parameter
    assert g.producer("b.ln.weight") is None  # the de-duplication Identity nodes are gone
    assert [op.op_type for op in g.ops].count("Identity") == 1
    view = g.tensors["onnx::MatMul_9"]
    assert view.is_weight and not view.is_parameter and view.tied_to == "a.fc.weight"
    assert g.parameter_sources("onnx::MatMul_9") == ("a.fc.weight",)
    assert any("de-duplicated" in w and "restored" in w for w in r.warnings)


def _blocks_graph(blocks=4):
    """``blocks`` numbered blocks ``x -> MatMul(w_i) -> Relu``; the last block's weight reaches
    it through ``Transpose -> Cast`` ops the exporter hoisted to the top of the graph (unscoped),
    as legacy exports place their weight-only nodes."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, H])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, H])
    last = blocks - 1
    nodes = [
        helper.make_node("Transpose", [f"blocks.{last}.w"], ["wt"], name="Transpose_0", perm=[1, 0]),
        helper.make_node("Cast", ["wt"], ["wc"], name="Cast_1", to=TensorProto.FLOAT),
    ]
    inits = []
    prev = "x"
    for i in range(blocks):
        w = "wc" if i == last else f"blocks.{i}.w"
        nodes.append(helper.make_node("MatMul", [prev, w], [f"h{i}"], name=f"/blocks.{i}/fc/MatMul"))
        out = "y" if i == last else f"a{i}"
        nodes.append(helper.make_node("Relu", [f"h{i}"], [out], name=f"/blocks.{i}/act/Relu"))
        inits.append(weight(f"blocks.{i}.w", [H, H]))
        prev = out
    return model(nodes, [x], [y], inits)


def test_weight_views_join_their_consumers_layer():
    g = load_model_proto(_blocks_graph()).graph
    layered = group_layers(g)
    by_name = {op.name: op for op in g.ops}
    consumer = by_name["/blocks.3/fc/MatMul"]
    for name in ("Transpose_0", "Cast_1"):
        op = by_name[name]
        assert op.scope == consumer.scope and op.index < consumer.index  # moved next to the MatMul, in order
        assert layered.layer_of_op[op.index] == layered.layer_of_op[consumer.index]
    assert [op.index for op in g.ops] == list(range(len(g.ops)))
    assert g.tensors["wc"].tied_to == "blocks.3.w" and g.num_params == 4 * H * H


def test_weight_views_are_never_sent_between_stages():
    """p = 4 stages of one block each, m = 8: one activation [1, 8, 16] crosses each boundary
    (256 B in bf16), forward and backward once per micro-batch: at most 2m = 16 sends per GPU."""
    a = _analyse(load_model_proto(_blocks_graph()), p=4)
    sends = _sends(a)
    assert {c.tensor for c in sends} == {"a0", "a1", "a2"}
    assert {c.message_bytes for c in sends} == {1 * 8 * H * 2}
    for s in range(4):
        assert sum(c.count_per_iteration for c in sends if c.stage == s) == (8 if s in (0, 3) else 16)
    assert not _tied(a)  # blocks.3.w is read on stage 3 only
    assert [st.params for st in a.stages] == [H * H] * 4


def test_views_of_a_weight_are_sharded_as_their_source():
    """An untied Transpose(W) -> MatMul pair at t = 2: W splits (column-parallel then
    row-parallel), so each GPU holds half of both: (2 x 16 x 64) / 2 = 1,024 parameters."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, H])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, H])
    nodes = [
        helper.make_node("Transpose", ["fc1.weight"], ["w1t"], name="/fc1/Transpose", perm=[1, 0]),
        helper.make_node("MatMul", ["x", "w1t"], ["h"], name="/fc1/MatMul"),
        helper.make_node("Relu", ["h"], ["r"], name="/act/Relu"),
        helper.make_node("Transpose", ["fc2.weight"], ["w2t"], name="/fc2/Transpose", perm=[1, 0]),
        helper.make_node("MatMul", ["r", "w2t"], ["y"], name="/fc2/MatMul"),
    ]
    g = load_model_proto(model(nodes, [x], [y], [weight("fc1.weight", [64, H]), weight("fc2.weight", [H, 64])]))
    a = _analyse(g, p=1, t=2, m=1)
    assert a.tp.weight_factor["fc1.weight"] == 2 and a.tp.weight_factor["fc2.weight"] == 2
    assert a.stages[0].params == 2 * 64 * H and a.stages[0].params_per_gpu == 64 * H


# ---------------------------------------------------------------------------- the real exports


#: Tensors crossing each boundary where more than one activation legitimately does: the
#: recurrent model's RNN hands the GRU both its output sequence and its final hidden state.
#: Megatron-Core sends each tensor of a boundary as its own point-to-point message
#: (``schedules.send_forward`` loops over ``tensor_shapes``, one ``p2p_communication`` call per
#: tensor, as for T5's encoder output), so such a boundary carries 2m messages per tensor.  The
#: encoder-decoder's boundaries inside the decoder carry its hidden state and the encoder's output,
#: which every decoder layer's cross-attention reads.
_MULTI_TENSOR_BOUNDARY = {"rnn_loop.onnx": 2, "bart_legacy.onnx": 2, "bart_dynamo.onnx": 2, "t5_legacy.onnx": 2,
                          "t5_dynamo.onnx": 2}


@pytest.mark.parametrize("name", sorted(p.name for p in [*FIXTURES.glob("*.onnx"), *PACKAGED_MODELS.glob("*.onnx")]))
def test_each_gpu_sends_at_most_2m_messages_of_the_boundary_activation(name):
    """Every real export (tests/fixtures and the measured steps' models in the package) at p = 4 (fewer when it has fewer layers), m = 8, 1F1B: no stage sends more
    than m activations and m gradients per iteration per tensor crossing its boundary (one, but
    for the recurrent model), and each message is the size of its activation (bf16, t = 1),
    never a weight."""
    imported = load_model(fixture_path(name), ImportOptions(batch_size=1, seq_len=16 if "vad" not in name else 512,
                                                         tie_embeddings="gpt2" in name))
    b = imported.model_batch or 1
    p = min(4, len(group_layers(imported.graph).layers))
    a = _analyse(imported, p=p, b=b)
    m = a.config.num_micro_batches
    sends = _sends(a)
    assert sends or p == 1
    crossing = [len({c.tensor for c in sends if c.phase is Phase.FORWARD and c.stage == k}) for k in range(p - 1)]
    assert max(crossing, default=1) == _MULTI_TENSOR_BOUNDARY.get(name, 1), crossing
    for s in range(p):
        sent_by = [c for c in sends if c.stage == s]
        # stage s sends activations over boundary s and gradients over boundary s - 1
        widest = max(([crossing[s - 1]] if s > 0 else []) + ([crossing[s]] if s < p - 1 else []), default=1)
        assert sum(c.count_per_iteration for c in sent_by) <= 2 * m * widest
    for c in sends:
        t = a.graph.tensors[c.tensor]
        assert not t.is_weight
        assert c.message_bytes == t.nbytes_in(a.config.train_dtype)


def test_bert_with_deduplicated_weights_counts_torchs_parameters():
    """The library-initialised legacy BERT (4 layers of BERT-base): 39 LayerNorm and bias
    parameters reach their layers through Identity copies.  torch counts 23,837,184 for the
    embeddings (30522 x 768 + 512 x 768 + 2 x 768 + 2 x 768) and 7,087,872 per layer: 52,188,672."""
    path = FIXTURES / "bert_shared_legacy.onnx"
    g = load_model(path, ImportOptions(batch_size=1, seq_len=16)).graph
    assert g.num_params == 23_837_184 + 4 * 7_087_872
    assert not any(op.op_type == "Identity" and g.tensors[op.inputs[0]].is_weight for op in g.ops)


# ---------------------------------------------------------------------------- part 4: tied embeddings

VOCAB, GPT2_H = 50257, 768


@pytest.fixture(scope="module", params=["gpt2_legacy.onnx", "gpt2_dynamo.onnx"])
def gpt2(request):
    return load_model(FIXTURES / request.param, ImportOptions(batch_size=1, seq_len=16, tie_embeddings=True))


@pytest.mark.parametrize("t", [1, 2])
def test_tied_embedding_gradient_is_all_reduced_between_first_and_last_stage(gpt2, t):
    """p = 4: stages 0 and 3 both hold the word embedding; its gradient, vocab x h / t
    elements in bf16 (50257 x 768 x 2 / t = 77,194,752 / t bytes), is all-reduced once per
    iteration in their embedding group, and reported under pp in comm_by_dim."""
    a = _analyse(gpt2, p=4, t=t, timeline=True)
    tied = _tied(a)
    assert sorted(c.stage for c in tied) == [0, 3]
    for c in tied:
        assert c.kind is CollectiveKind.ALL_REDUCE and c.phase is Phase.OPTIMIZER and c.count_per_iteration == 1
        assert c.group == (a.rank_map.rank(0, 0, 0), a.rank_map.rank(0, 3, 0))
        assert c.message_bytes == VOCAB * GPT2_H * 2 / t
        assert "embedding group" in c.reason
    # the last stage holds the table (the dynamo export used to leave it without the LM head's weight)
    assert a.stages[3].params >= VOCAB * GPT2_H
    assert a.stages[3].params_per_gpu >= VOCAB * GPT2_H / t
    assert sum(st.params for st in a.stages) == a.graph.num_params + VOCAB * GPT2_H
    # under pp: stage 0 sends m = 8 activations and takes part in 1 all-reduce per iteration
    # (with t = 2 and no sequence parallelism, each of its sends also feeds the receivers'
    # scatter/gather all-gather: 8 more messages)
    sends = 8 if t == 1 else 2 * 8
    assert sum(c.count_per_iteration for c in a.comms if c.dim is ParallelDim.PP and c.stage == 0) == sends + 1
    assert comm_by_dim(a)["pp"]["count"] in (sends + 1, 2 * sends)  # the stage with the most pp time: an end or a middle one
    # timeline: on both devices after their gradient reduction, before their optimizer steps
    events = [e for e in a.timeline.events if e.name == "tied-weight gradient all-reduce"]
    assert sorted(e.device for e in events) == [0, 3] and len({e.start_s for e in events}) == 1
    for e in events:
        step = next(x for x in a.timeline.events if x.device == e.device and x.stream == "optimizer")
        assert e.start_s + e.dur_s == pytest.approx(step.start_s, rel=1e-12)


def test_no_tied_all_reduce_at_p1_or_for_untied_models(gpt2):
    assert not _tied(_analyse(gpt2, p=1))
    for name in ("llama_gqa_legacy.onnx", "llama_gqa_dynamo.onnx"):
        llama = load_model(FIXTURES / name, ImportOptions(batch_size=1, seq_len=16))
        assert not _tied(_analyse(llama, p=4))


def test_legacy_copy_without_the_flag_is_a_parameter_of_its_own():
    """Without --tie-embeddings the legacy head's stored copy is an untied parameter: counted
    (163,037,184 = 124,439,808 + 50257 x 768), no all-reduce, a warning says what to pass."""
    r = load_model(FIXTURES / "gpt2_legacy.onnx", ImportOptions(batch_size=1, seq_len=16))
    assert r.graph.num_params == 124_439_808 + VOCAB * GPT2_H
    assert any("--tie-embeddings" in w for w in r.warnings)
    assert not _tied(_analyse(r, p=4))


def test_held_copies_by_hand():
    """A table read by layers 0 and 5 and a bias read by layers 1 and 2, over stages
    [0, 0, 1, 1, 2, 2]: the table is copied on stage 2, the bias on stage 1."""
    copies = held_copies([((0, 5), 100.0, 50.0), ((1, 2), 10.0, 10.0), ((3,), 7.0, 7.0)], [0, 0, 1, 1, 2, 2], 3)
    assert copies.extra == (0.0, 10.0, 100.0) and copies.extra_local == (0.0, 10.0, 50.0)
    assert copies.groups == (((0, 1), 10.0), ((0, 2), 50.0))


def test_simulated_all_reduce_waits_for_both_stages():
    """Two devices, one micro-batch, 1 s forward and 2 s backward each: device 1 ends its
    backward at 1 + 1 + 2 = 4 s, device 0 at 4 + 2 = 6 s.  The all-reduce (0.5 s) starts at 6 s
    on both, then the optimizer (1 s): the iteration is 7.5 s, device 1 ends at 7.5 s too."""
    work = [DeviceWork(1.0, 2.0, tied_s=0.5, optimizer_s=1.0), DeviceWork(1.0, 2.0, tied_s=0.5, optimizer_s=1.0)]
    sim = simulate(build_schedule("1f1b", 2, 1, 1), work, 1)
    assert sim.compute_end_s == (6.0, 4.0)
    assert sim.device_end_s == (7.5, 7.5) and sim.iteration_time_s == 7.5
