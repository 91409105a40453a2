"""Tensor-parallel propagation and pipeline partitioning on hand-built graphs."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dml2comm.errors import ConfigError
from dml2comm.ir.onnx_import import ImportOptions
from dml2comm.load import load_model_proto
from dml2comm.parallel.config import ParallelConfig
from dml2comm.parallel.pipeline import partition_layers
from dml2comm.parallel.tensor import shard_tensor_parallel
from tests.helpers import mlp


def _graph():
    return load_model_proto(mlp(hidden=16, ffn=64), ImportOptions(batch_size=2)).graph


def test_mlp_column_then_row_with_one_allreduce_each_way():
    g = _graph()
    plan = shard_tensor_parallel(g, 4, dtype_bytes=2)
    rules = {op.name.split("/")[-2] + "/" + op.op_type: s.rule for op, s in zip(g.ops, plan.shards)}
    assert rules["fc1/MatMul"] == "column-parallel"
    assert rules["fc2/MatMul"] == "row-parallel"
    kinds = sorted((c.kind.value, c.phase.value) for c in plan.comms)
    assert kinds == [("ALL_REDUCE", "backward"), ("ALL_REDUCE", "forward")]
    # both messages are the [2, 8, 16] activation in 2-byte elements: 2*8*16*2 = 512 bytes
    assert all(c.message_bytes == 512 for c in plan.comms)
    # fc1 weight [16, 64] split on columns, fc2 [64, 16] on rows; bias of fc1 split, of fc2 not
    assert plan.weight_factor == {"ln.w": 1, "ln.b": 1, "fc1.w": 4, "fc1.b": 4, "fc2.w": 4, "fc2.b": 1}
    h3 = plan.shards[3].outputs[0]
    assert h3.shape == (2, 8, 16)  # 64 / 4


def test_sequence_parallel_replaces_allreduce_by_reduce_scatter_and_all_gather():
    g = _graph()
    plan = shard_tensor_parallel(g, 4, sequence_parallel=True, dtype_bytes=2)
    kinds = sorted((c.kind.value, c.phase.value) for c in plan.comms)
    # the input x is replicated, so the first column-parallel op needs no gather; the row-parallel
    # output is reduce-scattered (its gradient all-gathered) and the residual add runs on the shard
    assert ("REDUCE_SCATTER", "forward") in kinds and ("ALL_GATHER", "backward") in kinds
    assert not any(k == "ALL_REDUCE" and p == "forward" for k, p in kinds)


@given(st.sampled_from([1, 2, 4, 8, 16]))
@settings(max_examples=10, deadline=None)
def test_sharding_conserves_flops_of_matmuls(t):
    from dml2comm.ops.registry import op_cost

    g = _graph()
    plan = shard_tensor_parallel(g, t, dtype_bytes=2)
    for op, shard in zip(g.ops, plan.shards):
        full = op_cost(op, g.op_inputs(op), g.op_outputs(op))
        local = op_cost(op, shard.inputs, shard.outputs)
        assert local.flops_fwd * shard.factor == pytest.approx(full.flops_fwd)


def test_t_not_dividing_ffn_is_an_error():
    g = _graph()
    with pytest.raises(ConfigError, match="does not divide the output size 64"):
        shard_tensor_parallel(g, 3)


def _brute(costs, p):
    n = len(costs)
    best = None
    for cuts in itertools.combinations(range(1, n), p - 1):
        bounds = (0, *cuts, n)
        worst = max(sum(costs[a:b]) for a, b in zip(bounds, bounds[1:]))
        best = worst if best is None else min(best, worst)
    return best


@given(st.lists(st.floats(0.1, 10.0), min_size=1, max_size=9), st.integers(1, 9))
@settings(max_examples=60, deadline=None)
def test_partition_is_optimal_and_contiguous(costs, p):
    if p > len(costs):
        with pytest.raises(ConfigError, match="larger than the model's"):
            partition_layers(costs, p)
        return
    parts = partition_layers(costs, p)
    assert len(parts) == p and parts[0][0] == 0 and parts[-1][1] == len(costs)
    assert all(a < b for a, b in parts) and all(parts[i][1] == parts[i + 1][0] for i in range(p - 1))
    worst = max(sum(costs[a:b]) for a, b in parts)
    assert worst == pytest.approx(_brute(costs, p), rel=1e-6)


def test_config_errors():
    with pytest.raises(ConfigError, match="not divisible"):
        ParallelConfig(dp_size=2, micro_batch_size=3, global_batch_size=8)
    with pytest.raises(ConfigError, match="--zero"):
        ParallelConfig(zero_stage=4)
    c = ParallelConfig(dp_size=2, pp_size=4, tp_size=2, micro_batch_size=1, global_batch_size=16)
    assert c.num_micro_batches == 8 and c.num_gpus == 16
