"""GPT-2 small at d=2 p=4 t=2, b=1, s=1024: the communication Megatron-LM would issue.

Run on the zoo GPT-2 shape and on the real exports in tests/fixtures (both torch exporters).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dml2comm.analysis import analyze_graph
from dml2comm.hardware.cluster import make_cluster
from dml2comm.ir.onnx_import import ImportOptions
from dml2comm.load import load_model, load_model_proto
from dml2comm.network.kinds import CollectiveKind, ParallelDim, Phase
from dml2comm.ops.registry import op_cost
from dml2comm.parallel.config import ParallelConfig
from dml2comm.parallel.tensor import padded_vocab, shard_tensor_parallel
from dml2comm import zoo

FIXTURES = Path(__file__).parent / "fixtures"
B, S, H = 1, 1024, 768


def _zoo_gpt2():
    return load_model_proto(zoo.build_preset("gpt2-small"), ImportOptions(batch_size=B, seq_len=S), name="gpt2-zoo")


def _sources():
    yield "zoo", _zoo_gpt2
    for name in ("gpt2_legacy.onnx", "gpt2_dynamo.onnx"):
        path = FIXTURES / name
        if path.exists():
            # GPT-2 ties its LM head to the embedding: the legacy export's stored copy needs the flag
            yield name, (lambda p=path: load_model(p, ImportOptions(batch_size=B, seq_len=S, tie_embeddings=True)))


SOURCES = dict(_sources())


@pytest.fixture(scope="module", params=sorted(SOURCES))
def analysis(request):
    imported = SOURCES[request.param]()
    config = ParallelConfig(dp_size=2, tp_size=2, pp_size=4, micro_batch_size=B, global_batch_size=8, seq_len=S)
    return analyze_graph(imported, config, make_cluster("a100", 16))


def test_twelve_blocks(analysis):
    assert analysis.layered.num_blocks == 12
    kinds = [l.kind for l in analysis.layered.layers]
    assert kinds[0] == "embedding" and kinds[-1] == "head" and kinds.count("block") == 12


def test_each_block_has_two_forward_and_two_backward_tp_allreduces_of_bsh(analysis):
    m = analysis.config.num_micro_batches
    per_layer = Counter()
    for c in analysis.comms:
        if c.dim is ParallelDim.TP and analysis.layers[c.layer].kind == "block":
            assert c.kind is CollectiveKind.ALL_REDUCE
            assert c.message_bytes == B * S * H * 2  # b*s*h elements in bf16
            assert c.count_per_iteration == m
            per_layer[(c.layer, c.phase)] += 1
    blocks = [l.index for l in analysis.layered.layers if l.kind == "block"]
    for layer in blocks:
        assert per_layer[(layer, Phase.FORWARD)] == 2
        assert per_layer[(layer, Phase.BACKWARD)] == 2


def test_three_boundaries_one_send_each_way_per_micro_batch(analysis):
    pp = [c for c in analysis.comms if c.dim is ParallelDim.PP and c.kind is CollectiveKind.SEND_RECV]
    fwd = [c for c in pp if c.phase is Phase.FORWARD]
    bwd = [c for c in pp if c.phase is Phase.BACKWARD]
    assert sorted(c.stage for c in fwd) == [0, 1, 2]  # sender of the activation
    assert sorted(c.stage for c in bwd) == [1, 2, 3]  # sender of the gradient
    t = analysis.config.tp_size
    for c in pp:
        assert c.kind is CollectiveKind.SEND_RECV
        # Megatron-LM's scatter/gather (Narayanan et al. 2021 Sec. 4.1): without sequence
        # parallelism each tensor rank sends 1/t of the b*s*h activation ...
        assert c.message_bytes == B * S * H * 2 / t
        assert c.count_per_iteration == analysis.config.num_micro_batches
    # ... and the receiving stage all-gathers the whole b*s*h over its t tensor ranks
    gathers = [c for c in analysis.comms if c.dim is ParallelDim.PP and c.kind is CollectiveKind.ALL_GATHER]
    assert sorted((c.phase.value, c.stage) for c in gathers) == [("backward", 1), ("backward", 2), ("backward", 3),
                                                                  ("forward", 0), ("forward", 1), ("forward", 2)]
    assert all(c.message_bytes == B * S * H * 2 and c.group_size == t for c in gathers)


def test_tied_embedding_gradient_all_reduced_between_first_and_last_stage(analysis):
    """Megatron-LM's embedding group: the word embedding's gradient, vocab x h / t elements in
    bf16, all-reduced once per iteration between stage 0 and stage 3 of each (data, tensor) rank,
    after the backward pass; the last stage holds the copy (memory and parameters)."""
    tied = [c for c in analysis.comms if c.dim is ParallelDim.PP and c.kind is CollectiveKind.ALL_REDUCE]
    assert sorted(c.stage for c in tied) == [0, 3]
    vocab_h_over_t = 50257 * H / 2
    for c in tied:
        assert c.kind is CollectiveKind.ALL_REDUCE and c.phase is Phase.OPTIMIZER and c.count_per_iteration == 1
        assert c.group == (analysis.rank_map.rank(0, 0, 0), analysis.rank_map.rank(0, 3, 0))
        assert c.message_bytes == vocab_h_over_t * 2  # 38,597,376 bytes
    assert analysis.stages[3].params_per_gpu >= vocab_h_over_t  # the head's copy of the table is on the last stage
    assert sum(st.params for st in analysis.stages) == analysis.graph.num_params + 50257 * H  # counted on both
    # the timeline: on both stages, after the last backward and before the optimizer step
    events = [e for e in analysis.timeline.events if e.name == "tied-weight gradient all-reduce"]
    assert sorted(e.device for e in events) == [0, 3]
    for e in events:
        last_bwd = max(x.start_s + x.dur_s for x in analysis.timeline.events if x.device == e.device and x.stream == "compute")
        step = next(x for x in analysis.timeline.events if x.device == e.device and x.stream == "optimizer")
        assert last_bwd <= e.start_s and e.start_s + e.dur_s == pytest.approx(step.start_s, rel=1e-12)


def test_dp_allreduce_adds_up_to_stage_params_over_t(analysis):
    for stage in analysis.stages:
        dp = [c for c in analysis.comms if c.dim is ParallelDim.DP and c.stage == stage.index]
        assert all(c.kind is CollectiveKind.ALL_REDUCE and c.group_size == 2 for c in dp)
        total = sum(c.message_bytes * c.count_per_iteration for c in dp)
        # tensor-split weights count 1/t, replicated ones (LayerNorms, row-parallel biases) in full;
        # the tied embedding on both stages that read it (the last one through the LM head's copy)
        expected = sum(
            analysis.graph.tensors[w].numel / max(analysis.tp.weight_factor[x] for x in analysis.tp.weight_factor
                                                  if w in analysis.graph.parameter_sources(x)) * 2
            for w in analysis.tp.weight_factor
            if analysis.graph.tensors[w].is_parameter and stage.index in _weight_stages(analysis, w)
        )
        assert total == pytest.approx(expected, rel=1e-12)
        assert total == pytest.approx(stage.params_per_gpu * 2, rel=1e-12)


def _weight_stages(analysis, weight):
    """The stages reading ``weight`` directly or through a weight carrying its values."""
    g = analysis.graph
    return {analysis.ops[op.index].stage for op in g.ops if any(weight in g.parameter_sources(n) for n in op.inputs if n)}


@given(st.sampled_from([1, 2, 3, 4, 6, 12]))
@settings(max_examples=6, deadline=None)
def test_sharded_flops_times_t_equal_unsharded(t):
    """Every op: per-shard FLOPs x its split factor = unsharded FLOPs (the vocabulary-parallel
    head and embedding are checked against Megatron's padded vocabulary)."""
    g = _zoo_gpt2().graph
    plan = shard_tensor_parallel(g, t)
    vocab = 50257
    for op, shard in zip(g.ops, plan.shards):
        full = op_cost(op, g.op_inputs(op), g.op_outputs(op)).flops_fwd
        local = op_cost(op, shard.inputs, shard.outputs).flops_fwd * shard.factor
        if any(x is not None and vocab in x.shape for x in g.op_outputs(op)) and vocab % t:
            full = full * padded_vocab(vocab, t) / vocab
        assert local == pytest.approx(full, rel=1e-12), (op.name, shard.rule)
