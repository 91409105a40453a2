"""The training loss an export leaves out (dml2comm.cost.loss): Megatron-LM's vocabulary-parallel
cross-entropy over the logits, costed once per micro-batch on the stage that holds them."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from onnx import TensorProto, helper

from dml2comm import zoo
from dml2comm.analysis import analyze_graph
from dml2comm.cost.compute import hbm_efficiency_of
from dml2comm.cost.host import DEFAULT as HOST
from dml2comm.cost.loss import CE_BWD_KERNELS, CE_FWD_KERNELS, cross_entropy_s, logits_outputs
from dml2comm.hardware.cluster import get_cluster
from dml2comm.ir.onnx_import import ImportOptions
from dml2comm.load import load_model, load_model_proto
from dml2comm.parallel.config import ParallelConfig
from dml2comm.parallel.tensor import padded_vocab
from tests.helpers import model, weight

FIXTURES = Path(__file__).parent / "fixtures"
VOCAB, HIDDEN, SEQ, BATCH = 500, 128, 64, 2


def _gpt(layers: int = 4):
    proto = zoo.build_gpt(layers=layers, hidden=HIDDEN, heads=4, vocab=VOCAB, seq_len=SEQ)
    return load_model_proto(proto, ImportOptions(batch_size=BATCH))


def _lm(with_loss: bool):
    """ids -> embedding -> MatMul(h, V) -> logits; optionally the loss inside the graph."""
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 8])
    nodes = [helper.make_node("Gather", ["emb", "ids"], ["x"], name="/embed/Gather", axis=0),
             helper.make_node("MatMul", ["x", "head"], ["logits"], name="/lm_head/MatMul")]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [2, 8, 64])]
    inputs = [ids]
    if with_loss:
        inputs.append(helper.make_tensor_value_info("labels", TensorProto.INT64, [2, 8]))
        nodes += [helper.make_node("Transpose", ["logits"], ["scores"], perm=[0, 2, 1]),
                  helper.make_node("SoftmaxCrossEntropyLoss", ["scores", "labels"], ["loss"], reduction="mean")]
        outputs = [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])]
    return load_model_proto(model(nodes, inputs, outputs, [weight("emb", [64, 16]), weight("head", [16, 64])]),
                            ImportOptions(batch_size=2)).graph


def test_cross_entropy_bytes_and_kernels_follow_megatrons_code() -> None:
    """38 bytes forward and 14 backward per logit with 16-bit logits (the fp32 cast both ways),
    32 and 8 in fp32; the host's launches bound a small loss."""
    hbm = 1e12
    f, b = cross_entropy_s(1e9, 2, hbm, 0.0)
    assert (f, b) == pytest.approx((38e-3, 14e-3))
    assert cross_entropy_s(1e9, 4, hbm, 0.0) == pytest.approx((32e-3, 8e-3))
    assert cross_entropy_s(10.0, 2, hbm, 50e-6) == pytest.approx((CE_FWD_KERNELS * 50e-6, CE_BWD_KERNELS * 50e-6))


def test_logits_found_on_the_zoo_and_real_exports_and_not_when_the_graph_has_its_loss() -> None:
    graph = _gpt(2).graph
    (name, producer), = logits_outputs(graph)
    assert graph.tensor(name).shape == (BATCH, SEQ, VOCAB) and graph.ops[producer].op_type == "MatMul"
    for fixture in ("gpt2_legacy.onnx", "gpt2_dynamo.onnx", "llama_gqa_dynamo.onnx"):
        g = load_model(str(FIXTURES / fixture), ImportOptions(batch_size=2, seq_len=16)).graph
        found = logits_outputs(g)
        assert len(found) == 1, fixture
        assert g.ops[found[0][1]].op_type in ("MatMul", "Gemm"), fixture
    assert logits_outputs(_lm(with_loss=False)) == (("logits", 1),)
    assert logits_outputs(_lm(with_loss=True)) == ()  # costed as the graph's own ops
    # an encoder whose outputs are hidden states has no logits
    assert logits_outputs(load_model(str(FIXTURES / "bert_legacy.onnx"), ImportOptions(batch_size=2, seq_len=16)).graph) == ()


@pytest.mark.parametrize("t,p", [(1, 1), (2, 2)])
def test_loss_on_the_last_stage_per_micro_batch_with_local_vocab(t: int, p: int) -> None:
    imported = _gpt()
    config = ParallelConfig(dp_size=1, tp_size=t, pp_size=p, micro_batch_size=BATCH, global_batch_size=4 * BATCH,
                            seq_len=SEQ, dtype="bf16", recompute="full")
    cluster = get_cluster("dgx-a100", t * p)
    a = analyze_graph(imported, config, cluster, advise=False, timeline=False)
    gpu = cluster.gpu
    local = BATCH * SEQ * (padded_vocab(VOCAB, t) // t if t > 1 else VOCAB)
    expected = cross_entropy_s(local, 2, gpu.hbm_bytes_per_s * hbm_efficiency_of(gpu), HOST.kernel_s)
    *first, last = a.stages
    assert (last.loss_fwd_s, last.loss_bwd_s) == pytest.approx(expected)
    assert all(st.loss_fwd_s == 0.0 and st.loss_bwd_s == 0.0 for st in first)
    # part of the stage's compute, once per micro-batch, never recomputed
    ops_fwd = sum(o.time_fwd_s for o in a.ops if o.stage == last.index)
    assert last.compute_fwd_s == pytest.approx(ops_fwd + last.loss_fwd_s)


def test_loss_is_reported_in_data_json_and_on_the_stage_page(tmp_path: Path) -> None:
    from dml2comm.export.report import report_dict

    imported = _gpt(2)
    config = ParallelConfig(dp_size=1, tp_size=1, pp_size=1, micro_batch_size=BATCH, global_batch_size=BATCH, seq_len=SEQ)
    a = analyze_graph(imported, config, get_cluster("dgx-a100", 1), advise=False, timeline=False)
    stage = report_dict(a)["stages"][0]
    assert stage["loss_fwd_s"] == a.stages[0].loss_fwd_s > 0.0 and stage["loss_bwd_s"] == a.stages[0].loss_bwd_s > 0.0
    json.dumps(stage)


def test_host_model_off_leaves_the_bytes() -> None:
    """With the host model off (CUDA graphs), the loss is its HBM traffic alone."""
    imported = _gpt(2)
    cluster = dataclasses.replace(get_cluster("dgx-a100", 1), host_model="none")
    config = ParallelConfig(dp_size=1, tp_size=1, pp_size=1, micro_batch_size=BATCH, global_batch_size=BATCH, seq_len=SEQ)
    a = analyze_graph(imported, config, cluster, advise=False, timeline=False)
    hbm = cluster.gpu.hbm_bytes_per_s * hbm_efficiency_of(cluster.gpu)
    assert a.stages[0].loss_fwd_s == pytest.approx(BATCH * SEQ * VOCAB * 38 / hbm)
    assert a.stages[0].loss_bwd_s == pytest.approx(BATCH * SEQ * VOCAB * 14 / hbm)
