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
from dml2comm.ir.onnx_import import ImportOptions, load_model, load_model_proto
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
            yield name, (lambda p=path: load_model(p, ImportOptions(batch_size=B, seq_len=S)))


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
    pp = [c for c in analysis.comms if c.dim is ParallelDim.PP]
    fwd = [c for c in pp if c.phase is Phase.FORWARD]
    bwd = [c for c in pp if c.phase is Phase.BACKWARD]
    assert sorted(c.stage for c in fwd) == [0, 1, 2]  # sender of the activation
    assert sorted(c.stage for c in bwd) == [1, 2, 3]  # sender of the gradient
    for c in pp:
        assert c.kind is CollectiveKind.SEND_RECV
        assert c.message_bytes == B * S * H * 2
        assert c.count_per_iteration == analysis.config.num_micro_batches


def test_dp_allreduce_adds_up_to_stage_params_over_t(analysis):
    for stage in analysis.stages:
        dp = [c for c in analysis.comms if c.dim is ParallelDim.DP and c.stage == stage.index]
        assert all(c.kind is CollectiveKind.ALL_REDUCE and c.group_size == 2 for c in dp)
        total = sum(c.message_bytes * c.count_per_iteration for c in dp)
        # tensor-split weights count 1/t, replicated ones (LayerNorms, row-parallel biases) in full
        expected = sum(
            analysis.graph.tensors[w].numel / analysis.tp.weight_factor[w] * 2
            for w in analysis.tp.weight_factor
            if analysis.stages[stage.index] is stage and _weight_stage(analysis, w) == stage.index
        )
        assert total == pytest.approx(expected, rel=1e-12)
        assert total == pytest.approx(stage.params_per_gpu * 2, rel=1e-12)


def _weight_stage(analysis, weight):
    for op in analysis.graph.ops:
        if weight in op.inputs:
            return analysis.ops[op.index].stage
    return None


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
