"""Autograd's gradient sums (dml2comm.cost.ops.gradient_forks): a tensor read by several kernels
whose outputs need a gradient gets one add per extra reader in backward (PyTorch's
InputBuffer::accumulate), charged to its first reader; readers fused into one kernel count once,
readers without a gradient not at all."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from onnx import TensorProto, helper, numpy_helper
import numpy as np

from dml2comm import zoo
from dml2comm.cost import ops as ops_module
from dml2comm.cost.cache import tensor_parallel_of
from dml2comm.cost.compute import hbm_efficiency_of
from dml2comm.cost.host import NONE
from dml2comm.cost.ops import gradient_forks, gradient_sum_bytes, op_costs
from dml2comm.hardware.cluster import get_cluster
from dml2comm.ir.onnx_import import ImportOptions
from dml2comm.load import load_model, load_model_proto
from dml2comm.parallel.config import DTYPES

FIXTURES = Path(__file__).parent / "fixtures"
BF16 = DTYPES["bf16"]


def _gpt(layers: int, hidden: int = 256, heads: int = 4, seq: int = 64, batch: int = 2):
    model = zoo.build_gpt(layers=layers, hidden=hidden, heads=heads, vocab=512, seq_len=seq)
    return load_model_proto(model, ImportOptions(batch_size=batch)).graph


def test_gpt_residual_stream_is_summed_twice_per_layer_and_the_gelu_fork_is_fused() -> None:
    graph = _gpt(2)
    forks = gradient_forks(graph)
    # the embedding's output and each layer's two residual adds except the last (which feeds ln_f
    # only): the stream entering attention and the stream entering the MLP, read by the
    # LayerNorm and by the residual add
    assert len(forks) == 4
    for fork in forks:
        readers = Counter(graph.ops[c].op_type for c in graph.consumers(fork.tensor))
        assert readers == {"LayerNormalization": 1, "Add": 1} and fork.extra == 1
    # the tanh-GeLU reads the fc output three times (Mul, Pow, Add) inside one fused kernel
    fc = [op for op in graph.ops if op.scope.endswith("mlp.c_fc") and op.op_type == "Add"]
    assert fc and len(graph.consumers(fc[0].outputs[0])) == 3
    assert all(f.tensor != fc[0].outputs[0] for f in forks)
    # each sum is charged to the LayerNorm reading the stream: in the readers' layer
    assert all(graph.ops[f.reader].op_type == "LayerNormalization" for f in forks)


@pytest.mark.parametrize("t, sp", [(1, False), (4, False), (4, True)])
def test_sum_moves_three_tensors_of_the_shard_the_readers_see(t: int, sp: bool) -> None:
    """Two gradients read, one written, each b s h in the training dtype; under sequence
    parallelism the residual stream is 1/t of the sequence, without it whole on every rank."""
    b, s, h = 2, 64, 256
    graph = _gpt(1, hidden=h, seq=s, batch=b)
    tp = tensor_parallel_of(graph, t, sp, BF16.itemsize)
    sizes = {gradient_sum_bytes(f, tp, BF16) for f in gradient_forks(graph)}
    assert sizes == {3 * b * s * h * 2 / (t if sp else 1)}


def test_backward_of_the_first_reader_grows_by_the_sum_and_nothing_else_changes() -> None:
    graph = _gpt(1)
    gpu = get_cluster("dgx-a100", 1).gpu
    tp = tensor_parallel_of(graph, 1, False, BF16.itemsize)
    args = (graph, tp, BF16, gpu, gpu.peak_flops("bf16"), gpu.hbm_bytes_per_s, False, NONE)
    with_sums = op_costs(*args)
    original = ops_module.gradient_forks
    try:
        ops_module.gradient_forks = lambda g, regions=None: ()
        graph.derived.clear()
        without = op_costs(*args)
    finally:
        ops_module.gradient_forks = original
        graph.derived.clear()
    forks = {f.reader: f for f in gradient_forks(graph)}
    assert len(forks) == 2
    rate = gpu.hbm_bytes_per_s * hbm_efficiency_of(gpu)
    for i, (a, b) in enumerate(zip(with_sums.times, without.times)):
        assert a[0] == b[0]
        if i in forks:
            moved = gradient_sum_bytes(forks[i], tp, BF16)
            assert a[1] == pytest.approx(b[1] + moved / rate)
            assert with_sums.costs[i].bytes_bwd == pytest.approx(without.costs[i].bytes_bwd + moved)
            assert "gradient sum of its input's 2 readers" in with_sums.costs[i].rule
        else:
            assert a[1] == b[1]


def _toy(extra_nodes, outputs):
    """x [4, 16] @ W [16, 16] -> y, then ``extra_nodes`` reading y."""
    w = numpy_helper.from_array(np.ones((16, 16), dtype=np.float32), "W")
    w2 = numpy_helper.from_array(np.ones((16, 16), dtype=np.float32), "W2")
    nodes = [helper.make_node("MatMul", ["x", "W"], ["y"])] + extra_nodes
    graph = helper.make_graph(nodes, "toy", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
                              outputs, initializer=[w, w2])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return load_model_proto(model, ImportOptions()).graph


def test_readers_without_a_gradient_do_not_count() -> None:
    """A Shape (integer output) reads y but sends no gradient back; two GEMMs reading y do."""
    shape_only = _toy([helper.make_node("Shape", ["y"], ["s"]), helper.make_node("MatMul", ["y", "W2"], ["z"])],
                      [helper.make_tensor_value_info("z", TensorProto.FLOAT, [4, 16]),
                       helper.make_tensor_value_info("s", TensorProto.INT64, [2])])
    assert gradient_forks(shape_only) == ()
    two_gemms = _toy([helper.make_node("MatMul", ["y", "W2"], ["z1"]), helper.make_node("MatMul", ["y", "W2"], ["z2"]),
                      helper.make_node("Add", ["z1", "z2"], ["z"])],
                     [helper.make_tensor_value_info("z", TensorProto.FLOAT, [4, 16])])
    (fork,) = gradient_forks(two_gemms)
    assert (fork.tensor, two_gemms.ops[fork.reader].outputs, fork.extra) == ("y", ("z1",), 1)


def test_weights_are_not_activation_forks() -> None:
    """W2 is read by two GEMMs: its gradient goes to the parameter's own buffer, not here."""
    graph = _toy([helper.make_node("MatMul", ["y", "W2"], ["z1"]), helper.make_node("MatMul", ["z1", "W2"], ["z"])],
                 [helper.make_tensor_value_info("z", TensorProto.FLOAT, [4, 16])])
    assert gradient_forks(graph) == ()


@pytest.mark.parametrize("name, expected", [
    # BERT: the LayerNorm's output read by the Q, K and V projections and the residual add
    # (3 sums), and the one before the FFN read by it and the residual add (1)
    ("bert_legacy", {("LayerNormalization", 3): 12, ("LayerNormalization", 1): 12}),
    # GPT-2: the residual stream (the embedding sum and 23 of the 24 residual adds)
    ("gpt2_legacy", {("Add", 1): 24}),
    ("gpt2_dynamo", {("Add", 1): 24}),
])
def test_real_exports(name: str, expected: dict[tuple[str, int], int]) -> None:
    graph = load_model(FIXTURES / f"{name}.onnx", ImportOptions(batch_size=2, seq_len=16)).graph
    kinds = Counter((graph.ops[graph.producer(f.tensor)].op_type, f.extra) for f in gradient_forks(graph))
    assert kinds == expected
