"""End-to-end behaviour: zoo -> CLI -> data.json, sequence parallelism, ZeRO, determinism."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dml2comm import zoo
from dml2comm.analysis import analyze_graph
from dml2comm.cli import main
from dml2comm.hardware.cluster import make_cluster
from dml2comm.ir import onnx_import
from dml2comm.ir.onnx_import import ImportOptions
from dml2comm.load import load_model, load_model_proto
from dml2comm.network.kinds import CollectiveKind, ParallelDim, Phase
from dml2comm.parallel.config import ParallelConfig
from tests.test_cli import ROOT, assert_bad, run

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="module")
def gpt_small():
    return zoo.build_gpt(layers=4, hidden=256, heads=8, vocab=1024, seq_len=128)


def _analysis(model, **cfg):
    base = dict(micro_batch_size=2, global_batch_size=8, seq_len=128)
    base.update(cfg)
    config = ParallelConfig(**base)
    return analyze_graph(load_model_proto(model, ImportOptions(batch_size=config.micro_batch_size)), config,
                         make_cluster("a100", config.num_gpus, min(8, config.num_gpus)))


def test_sequence_parallel_keeps_the_volume_of_the_allreduces(gpt_small):
    plain = _analysis(gpt_small, tp_size=4)
    sp = _analysis(gpt_small, tp_size=4, sequence_parallel=True)

    def per_block(a):
        counts = {}
        for c in a.comms:
            if c.dim is ParallelDim.TP and a.layers[c.layer].kind == "block":
                counts.setdefault((c.layer, c.kind, c.phase), []).append(c.message_bytes)
        return counts

    b, s, h = 2, 128, 256
    for (layer, kind, phase), sizes in per_block(sp).items():
        assert kind in (CollectiveKind.REDUCE_SCATTER, CollectiveKind.ALL_GATHER)
        assert len(sizes) == 2 and all(x == b * s * h * 2 for x in sizes)
    # an all-reduce moves 2(n-1)/n S per GPU, a reduce-scatter plus an all-gather (n-1)/n S each
    vol = lambda a: sum(c.bytes_sent_per_gpu for c in a.comms if c.dim is ParallelDim.TP and a.layers[c.layer].kind == "block")
    assert vol(sp) == pytest.approx(vol(plain))


def test_zero3_moves_three_psi_per_micro_batch(gpt_small):
    a = _analysis(gpt_small, dp_size=4, zero_stage=3)
    psi_bytes = a.stages[0].params_per_gpu * 2
    dp = [c for c in a.comms if c.dim is ParallelDim.DP]
    m = a.config.num_micro_batches
    total = sum(c.message_bytes * c.count_per_iteration for c in dp)
    assert total == pytest.approx(3 * psi_bytes * m)
    assert {(c.kind, c.phase) for c in dp} == {
        (CollectiveKind.ALL_GATHER, Phase.FORWARD), (CollectiveKind.ALL_GATHER, Phase.BACKWARD),
        (CollectiveKind.REDUCE_SCATTER, Phase.BACKWARD)}


def test_zero_memory_matches_rajbhandari_table(gpt_small):
    # 2 + 2 + 12 bytes per parameter, divided by N_d for what each stage shards
    for z, expect in ((0, 16), (1, 4 + 12 / 4), (2, 2 + 14 / 4), (3, 16 / 4)):
        mem = _analysis(gpt_small, dp_size=4, zero_stage=z).stages[0].memory
        per_param = (mem["weights_bytes"] + mem["grads_bytes"] + mem["optimizer_bytes"]) / _analysis(gpt_small, dp_size=4).stages[0].params_per_gpu
        assert per_param == pytest.approx(expect)


def test_t_not_dividing_heads_names_the_heads(tmp_path):
    out = tmp_path / "out"
    result = run(str(ROOT / "examples" / "gpt2-small.onnx"), "--t", "5", "--out", str(out), cwd=tmp_path)
    assert_bad(result, out, "does not divide the 12 attention heads")


def test_unbound_sequence_dim_names_the_flag(tmp_path):
    out = tmp_path / "out"
    result = run(str(FIXTURES / "gpt2_legacy.onnx"), "--out", str(out), cwd=tmp_path)
    assert_bad(result, out, "--seq-len")


def test_zoo_command_then_analysis_binds_micro_batch(tmp_path):
    model = tmp_path / "llama.onnx"
    assert main(["zoo", "llama", "--layers", "2", "--hidden", "256", "--heads", "8", "--kv-heads", "2",
                 "--ffn-hidden", "512", "--vocab", "1000", "--seq-len", "64", "-o", str(model)]) == 0
    assert not (tmp_path / "llama.weights.bin").exists()
    assert main([str(model), "--t", "2", "--micro-batch-size", "3", "--global-batch-size", "6", "--out", str(tmp_path), "--no-site", "--json"]) == 0
    data = json.loads((tmp_path / "data.json").read_text())
    assert data["config"]["micro_batch_size"] == 3 and data["config"]["num_micro_batches"] == 2
    assert data["model"]["num_blocks"] == 2


def test_outputs_are_byte_identical(tmp_path):
    args = [str(ROOT / "examples" / "gpt2-small.onnx"), "--d", "2", "--p", "4", "--t", "2", "--no-site", "--json"]
    assert main(args + ["--out", str(tmp_path / "a")]) == 0
    assert main(args + ["--out", str(tmp_path / "b")]) == 0
    assert (tmp_path / "a" / "data.json").read_bytes() == (tmp_path / "b" / "data.json").read_bytes()


def test_path_based_shape_inference_for_large_models(monkeypatch):
    """Files over 2 GB are inferred from their path; force that path on a small file."""
    monkeypatch.setattr(onnx_import, "PROTO_LIMIT_BYTES", 0)
    g = load_model(FIXTURES / "llama_gqa_legacy.onnx", ImportOptions(seq_len=32)).graph
    ref = load_model_proto(__import__("onnx").load(FIXTURES / "llama_gqa_legacy.onnx", load_external_data=False),
                           ImportOptions(seq_len=32)).graph
    assert {k: v.shape for k, v in g.tensors.items()} == {k: v.shape for k, v in ref.tensors.items()}


def test_gqa_kv_heads_replicated_when_t_does_not_divide_them():
    imported = load_model(FIXTURES / "llama_gqa_legacy.onnx", ImportOptions(seq_len=64))
    a = analyze_graph(imported, ParallelConfig(tp_size=4, seq_len=64), make_cluster("a100", 4, 4))
    assert a.tp.heads == 8 and a.tp.kv_heads == 2
    rules = {op.name: info.shard_rule for op, info in zip(a.graph.ops, a.ops)}
    assert rules["/model/layers.0/self_attn/q_proj/MatMul"] == "column-parallel"
    assert rules["/model/layers.0/self_attn/k_proj/MatMul"].startswith("replicated")
    assert any("grouped-query" in w for w in a.warnings)
    # with t = 2 the two KV heads split as well
    b = analyze_graph(imported, ParallelConfig(tp_size=2, seq_len=64), make_cluster("a100", 2, 2))
    assert {op.name: info.shard_rule for op, info in zip(b.graph.ops, b.ops)}["/model/layers.0/self_attn/k_proj/MatMul"] == "column-parallel"
