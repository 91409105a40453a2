"""The attention head split as strided views (dml2comm.cost.ops.attention_head_views): Megatron
reads Q, K and V in place from the QKV projection's output, so the export's Split/Transpose ops
between the projection and the attention core's batched products cost nothing forward; the
heads' merge after P.V stays a copy."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from dml2comm import zoo
from dml2comm.cost.ops import attention_head_views, shard_op_costs
from dml2comm.hardware.cluster import get_cluster
from dml2comm.ir.onnx_import import ImportOptions
from dml2comm.load import load_model, load_model_proto

FIXTURES = Path(__file__).parent / "fixtures"


def _gpt(layers: int = 2):
    model = zoo.build_gpt(layers=layers, hidden=256, heads=4, vocab=512, seq_len=64)
    return load_model_proto(model, ImportOptions(batch_size=2)).graph


def test_gpt_head_split_is_views_and_head_merge_is_a_copy() -> None:
    graph = _gpt()
    views = attention_head_views(graph)
    kinds = Counter(graph.ops[i].op_type for i in views)
    assert kinds == {"Split": 2, "Transpose": 6}  # per layer: the QKV Split and the Q, K, V transposes
    costs = shard_op_costs(graph, 1, False, "bf16", get_cluster("dgx-a100", 1).gpu, False)
    for i in views:
        assert costs.times[i][0] == 0.0 and costs.costs[i].bytes_fwd == 0.0
        if graph.ops[i].op_type == "Split":  # SplitBackward assembles the projection's gradient: a copy
            assert costs.times[i][1] > 0.0
        else:
            assert costs.times[i][1] == 0.0
    # the heads' merge after P.V (Megatron: permute(...).contiguous()) still costs a copy each pass
    merges = [op for op in graph.ops if op.op_type == "Transpose" and op.index not in views and op.scope != "lm_head"]
    assert len(merges) == 2
    assert all(costs.times[op.index][0] > 0.0 and costs.times[op.index][1] > 0.0 for op in merges)


def test_views_shorten_the_layer_by_exactly_their_copies() -> None:
    """Kernel time alone (host model off: with it, a window's host excess is spread over its
    kernels), the layer loses the head-split copies' time and nothing else."""
    from dml2comm.cost.ops import op_costs
    from dml2comm.cost import ops as ops_module
    from dml2comm.cost.cache import tensor_parallel_of
    from dml2comm.cost.host import NONE
    from dml2comm.parallel.config import DTYPES

    graph = _gpt(1)
    gpu = get_cluster("dgx-a100", 1).gpu
    train = DTYPES["bf16"]
    tp = tensor_parallel_of(graph, 1, False, train.itemsize)
    with_views = op_costs(graph, tp, train, gpu, gpu.peak_flops("bf16"), gpu.hbm_bytes_per_s, False, NONE)
    original = ops_module.attention_head_views
    try:
        ops_module.attention_head_views = lambda g: frozenset()
        without = op_costs(graph, tp, train, gpu, gpu.peak_flops("bf16"), gpu.hbm_bytes_per_s, False, NONE)
    finally:
        ops_module.attention_head_views = original
    views = attention_head_views(graph)
    assert views
    for i, (a, b) in enumerate(zip(with_views.times, without.times)):
        if i not in views:
            assert a == pytest.approx(b)
    assert sum(f for f, _ in with_views.times) < sum(f for f, _ in without.times)


@pytest.mark.parametrize("name, per_kind", [
    ("gpt2_legacy", {"Split": 12, "Transpose": 36}),
    ("gpt2_dynamo", {"Split": 12, "Transpose": 36}),
    ("bert_legacy", {"Transpose": 36}),
])
def test_real_exports(name: str, per_kind: dict[str, int]) -> None:
    graph = load_model(FIXTURES / f"{name}.onnx", ImportOptions(batch_size=2, seq_len=16)).graph
    views = attention_head_views(graph)
    assert Counter(graph.ops[i].op_type for i in views) == per_kind


def test_rotary_and_materialised_outputs_stay_copies() -> None:
    """A Transpose whose output also feeds something other than the head split or the core's
    products (RoPE, a KV-cache graph output) is a real copy."""
    graph = load_model(FIXTURES / "llama_gqa_legacy.onnx", ImportOptions(batch_size=2, seq_len=16)).graph
    for i in attention_head_views(graph):
        for out in graph.ops[i].outputs:
            assert out not in graph.outputs
            for c in graph.consumers(out):
                assert graph.ops[c].op_type in ("Split", "Transpose", "Reshape", "Squeeze", "Unsqueeze", "Flatten",
                                                "Identity", "MatMul")
    # a toy core whose transposed K is also a graph output (a KV cache): that Transpose stays
    b, s, n, d = 2, 8, 2, 4
    nodes = [
        helper.make_node("Transpose", ["q"], ["qt"], perm=[0, 2, 1, 3]),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 3, 1]),
        helper.make_node("Transpose", ["v"], ["vt"], perm=[0, 2, 1, 3]),
        helper.make_node("MatMul", ["qt", "kt"], ["scores"]),
        helper.make_node("Softmax", ["scores"], ["probs"], axis=-1),
        helper.make_node("MatMul", ["probs", "vt"], ["ctx"]),
    ]
    f = TensorProto.FLOAT
    inputs = [helper.make_tensor_value_info(x, f, [b, s, n, d]) for x in ("q", "k", "v")]
    outputs = [helper.make_tensor_value_info("ctx", f, [b, n, s, d]), helper.make_tensor_value_info("kt", f, [b, n, d, s])]
    model = helper.make_model(helper.make_graph(nodes, "core", inputs, outputs), opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    graph = load_model_proto(model, ImportOptions()).graph
    names = {graph.ops[i].outputs[0] for i in attention_head_views(graph)}
    assert names == {"qt", "vt"}
