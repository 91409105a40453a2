"""Padding an unaligned GEMM dimension is recommended with its evaluated gain; aligned models get
no such line."""

from __future__ import annotations

from pathlib import Path

import pytest

from dml2comm import zoo
from dml2comm.analysis import analyze_graph
from dml2comm.cost.gemm import gemm_time_s, training_gemms
from dml2comm.hardware.cluster import get_cluster
from dml2comm.ir.onnx_import import ImportOptions
from dml2comm.load import load_model, load_model_proto
from dml2comm.parallel.config import ParallelConfig

GPT2 = Path(__file__).resolve().parent.parent / "dml2comm" / "validate" / "data" / "models" / "step_gpt2_small_dynamo.onnx"


def test_gpt2_vocabulary_padding_is_evaluated_on_the_lm_head():
    imported = load_model(str(GPT2), ImportOptions(batch_size=2, seq_len=256))
    config = ParallelConfig(micro_batch_size=2, global_batch_size=4, seq_len=256, stack="pytorch", precision="bf16")
    cluster = get_cluster("dgx-h100", 1)
    a = analyze_graph(imported, config, cluster, advise=True, timeline=False)
    pad = [r for r in a.recommendations if r["change"] == "pad the dimension 50,257 to 50,304"]
    assert len(pad) == 1
    # the gain is the LM head's three GEMMs padded, per micro-batch, times m = 2 (one stage)
    h100 = cluster.gpu
    gain = sum(gemm_time_s(h100, "bf16", *g) for g in training_gemms("MatMul", (2, 256, 768), (768, 50257), {}))
    gain -= sum(gemm_time_s(h100, "bf16", *g) for g in training_gemms("MatMul", (2, 256, 768), (768, 50304), {}))
    assert a.summary["iteration_time_s"] - pad[0]["iteration_time_s"] == pytest.approx(2 * gain, rel=1e-6)
    assert pad[0]["speedup"] > 1.01  # at least MIN_GAIN (2.3% here; 1.31x at b=8, s=1024)


def test_an_aligned_model_gets_no_padding_advice():
    imported = load_model_proto(zoo.build_gpt(layers=2, hidden=256, heads=4, vocab=1024, seq_len=128), ImportOptions(batch_size=2))
    a = analyze_graph(imported, ParallelConfig(micro_batch_size=2, global_batch_size=2, seq_len=128), get_cluster("dgx-h100", 1),
                      advise=True, timeline=False)
    assert not [r for r in a.recommendations if r["change"].startswith("pad the dimension")]


def test_megatron_runs_its_padded_vocabulary():
    """Under --stack megatron the LM head is timed at Megatron-LM's padded vocabulary (a multiple of
    128: 50,257 -> 50,304) and no padding is advised; eager PyTorch runs it as exported."""
    from dml2comm.cost.ops import MEGATRON_PAD, shard_op_costs
    from dml2comm.cost.host import NONE

    imported = load_model(str(GPT2), ImportOptions(batch_size=2, seq_len=256))
    h100 = get_cluster("dgx-h100", 1).gpu
    head = next(op.index for op in imported.graph.ops if op.op_type == "MatMul" and imported.graph.tensors[op.outputs[0]].shape[-1] == 50257)
    times = {stack: shard_op_costs(imported.graph, 1, False, "bf16", h100, False, NONE, stack=stack).times[head] for stack in ("megatron", "pytorch")}
    padded = training_gemms("MatMul", (2, 256, 768), (768, 50304), {})
    assert MEGATRON_PAD == 128 and times["megatron"][0] == pytest.approx(gemm_time_s(h100, "bf16", *padded[0]), rel=1e-9)
    assert times["pytorch"][0] > 2 * times["megatron"][0]  # the unaligned fallback kernel
    a = analyze_graph(imported, ParallelConfig(micro_batch_size=2, global_batch_size=2, seq_len=256), get_cluster("dgx-h100", 1),
                      advise=True, timeline=False)
    assert not [r for r in a.recommendations if r["change"].startswith("pad the dimension")]
