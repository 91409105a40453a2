"""Model-local functions (``export_modules_as_functions``): inlined ops keep their call's scope.

The graphs mimic what torch 2.13's TorchScript exporter writes (checked on a ResNet-18 export):
with ``export_modules_as_functions={BasicBlock}`` the top-level call nodes are named after the
scope of the last op the block ran (``/layer1/layer1.0/relu/BasicBlock``), variants of one class
are numbered functions (``BasicBlock``, ``BasicBlock.1``), weights are function inputs, and with
``export_modules_as_functions=True`` nested calls are named ``Sequential_20``, ``BasicBlock_27``.
"""

from __future__ import annotations

import dataclasses

from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from dml2comm.ir.layers import group_layers
from dml2comm.load import load_model, load_model_proto
from tests.helpers import weight

FIXTURES = Path(__file__).parent / "fixtures"
OPSETS = [helper.make_opsetid("", 17), helper.make_opsetid("__main__", 1), helper.make_opsetid("torch.nn.modules.container", 1)]
C, HW = 64, 56  # ResNet-18's first stage: 64 channels at 56 x 56


def _block_function(name: str) -> onnx.FunctionProto:
    """conv -> relu -> conv -> + x -> relu, weights passed in (as the legacy exporter does)."""
    conv = dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["a"], name="Conv_22", **conv),
        helper.make_node("Relu", ["a"], ["b"], name="Relu_23"),
        helper.make_node("Conv", ["b", "w2"], ["c"], name="Conv_24", **conv),
        helper.make_node("Add", ["c", "x"], ["d"], name="Add_25"),
        helper.make_node("Relu", ["d"], ["y"], name="Relu_26"),
    ]
    return helper.make_function("__main__", name, ["x", "w1", "w2"], ["y"], nodes, [helper.make_opsetid("", 17)])


def _stem_and_head(x: str, y: str) -> tuple[list, list, list]:
    inits = [weight("conv1.weight", [C, 3, 7, 7]), weight("fc.weight", [10, C]), weight("fc.bias", [10])]
    stem = [helper.make_node("Conv", ["input", "conv1.weight"], [x], name="/conv1/Conv", kernel_shape=[7, 7], strides=[4, 4], pads=[3, 3, 3, 3])]
    head = [
        helper.make_node("GlobalAveragePool", [y], ["gap"], name="/avgpool/GlobalAveragePool"),
        helper.make_node("Flatten", ["gap"], ["flat"], name="/Flatten"),
        helper.make_node("Gemm", ["flat", "fc.weight", "fc.bias"], ["logits"], name="/fc/Gemm", transB=1),
    ]
    return stem, head, inits


def resnet_blocks_as_functions() -> onnx.ModelProto:
    """Stem, 8 residual blocks as calls of two functions (``BasicBlock``, ``BasicBlock.1``), head."""
    stem, head, inits = _stem_and_head("s", "h8")
    calls, prev = [], "s"
    for i in range(8):
        stage, j = i // 2 + 1, i % 2
        fn = "BasicBlock.1" if i % 2 else "BasicBlock"
        w = [f"layer{stage}.{j}.conv1.weight", f"layer{stage}.{j}.conv2.weight"]
        inits += [weight(n, [C, C, 3, 3]) for n in w]
        calls.append(helper.make_node(fn, [prev, *w], [f"h{i + 1}"], domain="__main__", name=f"/layer{stage}/layer{stage}.{j}/relu/{fn}"))
        prev = f"h{i + 1}"
    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 3, 4 * HW, 4 * HW])
    y = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])
    graph = helper.make_graph(stem + calls + head, "resnet", [x], [y], inits)
    m = helper.make_model(graph, opset_imports=OPSETS, functions=[_block_function("BasicBlock"), _block_function("BasicBlock.1")])
    onnx.checker.check_model(m)
    return m


def resnet_all_modules_as_functions() -> onnx.ModelProto:
    """``export_modules_as_functions=True``: the top level holds one call per stage
    (``Sequential``), each calling two blocks; nested call nodes carry no scope in their names."""
    stem, head, inits = _stem_and_head("s", "h4")
    seq_nodes = [
        helper.make_node("BasicBlock", ["x", "w1", "w2"], ["m"], domain="__main__", name="BasicBlock_27"),
        helper.make_node("BasicBlock.1", ["m", "w3", "w4"], ["y"], domain="__main__", name="BasicBlock.1_28"),
    ]
    seq = helper.make_function("torch.nn.modules.container", "Sequential", ["x", "w1", "w2", "w3", "w4"], ["y"], seq_nodes,
                               [helper.make_opsetid("", 17), helper.make_opsetid("__main__", 1)])
    calls, prev = [], "s"
    for stage in range(1, 5):
        w = [f"layer{stage}.{j}.conv{k}.weight" for j in (0, 1) for k in (1, 2)]
        inits += [weight(n, [C, C, 3, 3]) for n in w]
        calls.append(helper.make_node("Sequential", [prev, *w], [f"h{stage}"], domain="torch.nn.modules.container",
                                      name=f"Sequential_{18 + stage}"))
        prev = f"h{stage}"
    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 3, 4 * HW, 4 * HW])
    y = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])
    graph = helper.make_graph(stem + calls + head, "resnet", [x], [y], inits)
    m = helper.make_model(graph, opset_imports=OPSETS,
                          functions=[seq, _block_function("BasicBlock"), _block_function("BasicBlock.1")])
    onnx.checker.check_model(m)
    return m


def resnet_named_blocks_as_functions() -> onnx.ModelProto:
    """A Sequential stem (``/stem/stem.0/Conv``, ``/stem/stem.2/Relu``: numbered children), then
    4 residual blocks that are attributes of the model (``self.res1 = BasicBlock(...)``: no
    number in their scope), each a call of ``BasicBlock``, and the head."""
    _, head, inits = _stem_and_head("s", "h4")
    stem = [helper.make_node("Conv", ["input", "conv1.weight"], ["c"], name="/stem/stem.0/Conv", kernel_shape=[7, 7],
                             strides=[4, 4], pads=[3, 3, 3, 3]),
            helper.make_node("Relu", ["c"], ["s"], name="/stem/stem.2/Relu")]
    calls, prev = [], "s"
    for i in range(1, 5):
        w = [f"res{i}.conv1.weight", f"res{i}.conv2.weight"]
        inits += [weight(n, [C, C, 3, 3]) for n in w]
        calls.append(helper.make_node("BasicBlock", [prev, *w], [f"h{i}"], domain="__main__", name=f"/res{i}/relu/BasicBlock"))
        prev = f"h{i}"
    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 3, 4 * HW, 4 * HW])
    y = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])
    graph = helper.make_graph(stem + calls + head, "resnet", [x], [y], inits)
    m = helper.make_model(graph, opset_imports=OPSETS, functions=[_block_function("BasicBlock")])
    onnx.checker.check_model(m)
    return m


def test_calls_of_one_function_are_the_blocks_whatever_the_modules_are_named():
    """The residual blocks have no number in their module paths (``res1`` .. ``res4``); the
    stem's layers do (``stem.0``, ``stem.2``).  Before, the stem's conv and ReLU were the two
    blocks and the 4 residual blocks one head; the calls of ``BasicBlock`` are the blocks."""
    r = load_model_proto(resnet_named_blocks_as_functions())
    layered = group_layers(r.graph)
    assert [(layer.name, len(layer.op_indices)) for layer in layered.layers] == [
        ("embedding", 2), ("res1", 5), ("res2", 5), ("res3", 5), ("res4", 5), ("head", 3)]
    assert layered.source == "calls"
    from dml2comm.ir.graph import Call

    # each inlined op knows its call: the function, the call's number and its module scope
    assert [op.calls for op in r.graph.ops if op.calls][::5] == [(Call("BasicBlock", i, f"res{i + 1}"),) for i in range(4)]


def test_block_calls_keep_their_module_scope_and_become_layers():
    r = load_model_proto(resnet_blocks_as_functions())
    # 2 functions before inlining (BasicBlock, BasicBlock.1), called 8 times
    assert "inlined 2 model-local function(s) (8 call(s))" in r.warnings[0]
    ops = r.graph.ops
    assert len(ops) == 1 + 8 * 5 + 3
    # '/layer2/layer2.1/relu/BasicBlock.1': the last component ('relu', the block's last child) is dropped
    assert {op.scope for op in ops[1 + 3 * 5:1 + 4 * 5]} == {"layer2.1"}
    layered = group_layers(r.graph)
    assert layered.source == "scopes"
    names = [layer.name for layer in layered.layers]
    assert names == ["embedding"] + [f"layer{s}.{j}" for s in range(1, 5) for j in (0, 1)] + ["head"]
    assert all(len(layer.op_indices) == 5 for layer in layered.layers if layer.kind == "block")


def test_nested_calls_extend_the_scope_chain():
    r = load_model_proto(resnet_all_modules_as_functions())
    # 3 functions (Sequential, BasicBlock, BasicBlock.1); 4 Sequential calls + 8 block calls
    assert "inlined 3 model-local function(s) (12 call(s))" in r.warnings[0]
    # the stage calls are numbered among their 4 same-named siblings, the blocks among their 2
    # ('BasicBlock' and 'BasicBlock.1' are variants of one class)
    assert r.graph.ops[1].scope == "Sequential.0.BasicBlock.0"
    assert r.graph.ops[1 + 7 * 5].scope == "Sequential.3.BasicBlock.1"
    layered = group_layers(r.graph)
    assert [layer.name for layer in layered.layers if layer.kind == "block"] == [
        f"Sequential.{s}.BasicBlock.{j}" for s in range(4) for j in (0, 1)
    ]


def test_dynamo_call_metadata_wins():
    m = resnet_blocks_as_functions()
    prop = m.graph.node[1].metadata_props.add()
    prop.key, prop.value = "pkg.torch.onnx.name_scopes", "['', 'layer1', 'layer1.0']"
    r = load_model_proto(m)
    assert r.graph.ops[1].scope == "layer1.0"


def test_pipeline_splits_the_blocks_and_is_faster_per_sample():
    """p=4 with 8 micro-batches beats p=1 per sample once the blocks are separate layers
    (before, all 8 inlined blocks sat in one layer and p=4 could not split them).  Kernel time
    (host model none): with the eager model's 1.5 ms of host time per pipeline message, a
    ResNet-18 micro-batch of one image is too small to gain from a pipeline."""
    from dml2comm.analysis import analyze_graph
    from dml2comm.hardware.cluster import make_cluster
    from dml2comm.parallel.config import ParallelConfig

    r = load_model_proto(resnet_blocks_as_functions())
    rates = {}
    for p in (1, 4):
        config = ParallelConfig(dp_size=1, tp_size=1, pp_size=p, micro_batch_size=1, global_batch_size=8)
        a = analyze_graph(r, config, dataclasses.replace(make_cluster("a100", p, p), host_model="none"), advise=False,
                          timeline=False)
        assert a.config.num_micro_batches == 8
        rates[p] = a.summary["samples_per_s"]
        if p == 4:  # 10 layers (embedding, 8 blocks, head) over 4 stages: every stage holds a block
            assert [layer.name for layer in a.layers if layer.kind == "block"] == [
                f"layer{s}.{j}" for s in range(1, 5) for j in (0, 1)]
            assert all(any(a.layers[i].kind == "block" for i in st.layers) for st in a.stages)
    assert rates[4] > rates[1]


def test_real_legacy_export_with_functions():
    from dml2comm.analysis import analyze
    from dml2comm.hardware.cluster import make_cluster
    from dml2comm.parallel.config import ParallelConfig

    path = FIXTURES / "resnet18_functions_legacy.onnx"
    r = load_model(path)
    assert any(w.startswith("inlined ") and not w.startswith("inlined 0 ") for w in r.warnings)
    assert group_layers(r.graph).num_blocks == 8  # torchvision ResNet-18: 4 stages x 2 BasicBlocks
    rates = {}
    for p in (1, 4):
        config = ParallelConfig(dp_size=1, tp_size=1, pp_size=p, micro_batch_size=1, global_batch_size=8)
        # kernel time (host model none), as above
        rates[p] = analyze(path, config, dataclasses.replace(make_cluster("a100", p, p), host_model="none")).summary["samples_per_s"]
    assert rates[4] > rates[1]


@pytest.mark.parametrize("text", [
    "['', 'transformer', 'transformer.h.0', 'transformer.h.0.mlp', 'transformer.h.0.mlp.act', '_tensor_constant_16']",
    "['', 'model', 'model.layers.1', 'model.layers.1.self_attn', 'model.layers.1.self_attn.q_proj']",
    "['', 'a', 'b', 'a.c']", "['', 'a.b', 'a.b.c', '']", "['']", "[]", "['a', \"b'c\"]", "['a', 'a.b\\\\c']", "not a list",
])
def test_scope_of_names_reads_as_the_whole_list_does(text):
    """The importer reads a node's module scope from its ``name_scopes`` list with the list's head
    cached per module (onnx_import._scope_of_names); it gives what reading the whole list gives."""
    from dml2comm.ir.onnx_import import _innermost_module, _parse_list, _scope_of_names

    assert _scope_of_names(text) == _innermost_module(_parse_list(text))
