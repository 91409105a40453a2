"""F.gelu calls an export wrote as primitives (dml2comm.cost.gelu): found by the dynamo exporter's
record or by shape, one eager kernel per pass, their input kept once, in its own dtype under
autocast; and the decoder fixtures' step peaks against PyTorch's FakeTensor count."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dml2comm.analysis import analyze_graph
from dml2comm.cost.cache import activation_model_of, autocast_dtypes_of, gelu_calls_of
from dml2comm.cost.gelu import GELU_ATEN, gelu_calls
from dml2comm.cost.host import NONE
from dml2comm.cost.ops import kernel_regions, shard_op_costs
from dml2comm.hardware.cluster import make_cluster
from dml2comm.hardware.gpus import get_gpu
from dml2comm.ir.graph import DType
from dml2comm.ir.onnx_import import ImportOptions, _fx_origin
from dml2comm.load import load_model
from dml2comm.parallel.config import ParallelConfig
from tests.helpers import fixture_path

FIXTURES = Path(__file__).parent / "fixtures"
FAKE = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "fake_memory_fixtures.json"


def _graph(name: str, b: int = 4, s: int | None = 512):
    return load_model(fixture_path(f"{name}.onnx"), ImportOptions(batch_size=b, seq_len=s)).graph


def test_the_exporters_record_names_the_aten_call():
    text = ("%gelu_1 : [num_users=1] = call_function[target=torch.ops.aten.gelu.default](args = (%linear_11,), "
            "kwargs = {approximate: tanh})")
    assert _fx_origin(text) == (GELU_ATEN, "gelu_1", "")
    assert _fx_origin("%input_ids : [num_users=2] = placeholder[target=input_ids]") == ("", "", "")
    softmax = "%softmax : [num_users=1] = call_function[target=torch.ops.aten.softmax.int](args = (%add_152, -1, torch.float32), kwargs = {})"
    assert _fx_origin(softmax) == ("aten.softmax.int", "softmax", "float32")
    ops = [op for op in _graph("gemma_tiny_dynamo").ops if op.aten == GELU_ATEN]
    assert {op.fx for op in ops} == {"gelu", "gelu_1"} and len(ops) == 16


@pytest.mark.parametrize("name, calls, ops", [
    ("gemma_tiny_dynamo", 2, 8),   # gelu_pytorch_tanh: the recorded aten.gelu, eight primitives
    ("bert_dynamo", 12, 5),        # exact GELU, recorded (and of the Erf shape)
    ("bert_legacy", 12, 4),        # exact GELU, no record: by the Erf's shape
    ("gpt2_dynamo", 0, 0),         # NewGELUActivation: written out in Python, eager runs it op by op
])
def test_gelu_calls_are_found_by_record_or_shape(name, calls, ops):
    graph = _graph(name, 2, 64)
    found = gelu_calls(graph)
    assert len(found) == calls and all(len(call.ops) == ops for call in found)
    for call in found:
        assert graph.ops[call.ops[-1]].outputs[0] == call.out
        assert any(call.x in graph.ops[i].inputs for i in call.ops)


def test_eager_gelu_is_one_kernel_per_pass_reading_its_input():
    """Eager F.gelu (aten::gelu): the forward reads x and writes y, the backward reads the output's
    gradient and x and writes x's gradient, all on the call's last op; its other ops cost nothing
    and the call is one kernel region."""
    graph = _graph("step_bert_6l_512_dynamo", 64, 128)
    costs = shard_op_costs(graph, 1, False, "bf16", get_gpu("h100"), False, NONE, "pytorch", "flash")
    regions = kernel_regions(graph, "pytorch", "flash")
    for call in gelu_calls_of(graph):
        x = graph.tensor(call.x)
        nbytes = x.numel * 2  # bf16
        last = costs.costs[call.ops[-1]]
        assert (last.bytes_fwd, last.bytes_bwd) == (2 * nbytes, 3 * nbytes)
        assert all(costs.times[i] == (0.0, 0.0) for i in call.ops[:-1])
        assert {regions[i] for i in call.ops} == {call.ops[0]}


def test_eager_gelu_keeps_its_input_once_in_its_own_dtype_under_autocast():
    """Gemma's tanh GELU (fx record aten.gelu): the block keeps the GEMM output x once, in bf16 under
    amp (gelu is on neither of autocast's lists), where the eight primitives kept four tensors and
    Pow's fp32 copy (benchmarks/fake_fixtures_findings.md, section 4)."""
    graph = _graph("gemma_tiny_dynamo")
    amp = autocast_dtypes_of(graph, DType.BFLOAT16, True)
    act = activation_model_of(graph, 1, False, "bf16", False, "pytorch", "flash", autocast=True)
    for call in gelu_calls_of(graph):
        assert amp[call.out] is DType.BFLOAT16 and amp[call.x] is DType.BFLOAT16
        assert act.saved_bytes(call.ops) == graph.tensor(call.x).numel * 2


MATCHED = ("gpt2_dynamo.onnx", "llama_gqa_dynamo.onnx", "qwen3_init_dynamo.onnx", "gemma_tiny_dynamo.onnx", "gpt_neox_dynamo.onnx")


@pytest.mark.parametrize("row", [r for r in json.loads(FAKE.read_text())["runs"]
                                 if r["fixture"] in MATCHED and r["use_cache"]],
                         ids=lambda r: f"{r['name']}-{r['mode']}")
def test_decoder_fixture_peaks_match_the_fake_tensor_steps(row):
    """The eager step's peak on the real dynamo exports whose every saved tensor the model knows,
    against PyTorch's FakeTensor count of the same step (benchmarks/fake_fixtures.py, with the
    KV cache transformers keeps by default): within 2.5%.  The other decoders' known gaps (Falcon's
    materialised mask, BLOOM's eager softmax and GELU Function, Cohere's fp32 LayerNorm, the MoE
    peaks' timing) are listed in benchmarks/fake_fixtures_findings.md and docs/limitations.md."""
    b, s = row["b"], row["s"]
    imported = load_model(FIXTURES / row["fixture"], ImportOptions(batch_size=b, seq_len=s))
    cfg = ParallelConfig(micro_batch_size=b, global_batch_size=b, seq_len=s, stack="pytorch", precision=row["mode"], dtype="bf16")
    peak = analyze_graph(imported, cfg, make_cluster("h100", 1), advise=False, timeline=False).stages[0].memory["total_bytes"]
    assert peak == pytest.approx(row["peak_alloc_bytes"], rel=0.025)


def test_eager_fp32_softmax_keeps_and_moves_fp32():
    """transformers' eager attention, softmax(scores, dtype=torch.float32).to(query.dtype), recorded
    by the dynamo exporter as aten.softmax.int(..., torch.float32) in an fp32 export: in a bf16 step
    SoftmaxBackward0 keeps the fp32 result and the P.V product the bf16 copy; the largest transient
    is that fp32 result; the softmax's kernels move (2t + 16) bytes per element forward and
    (2t + 20) backward, two casts more per pass (benchmarks/fake_fixtures_findings.md, section 5)."""
    from dml2comm.cost.ops import eager_fp32_softmax_costs

    graph = _graph("llama_gqa_dynamo", 2, 256)
    soft = [op for op in graph.ops if op.op_type == "Softmax"]
    assert soft and all(op.fx_dtype == "float32" for op in soft)
    act = activation_model_of(graph, 1, False, "bf16", False, "pytorch", "unfused")
    n = graph.tensor(soft[0].outputs[0]).numel
    keys = dict(act.saved_by_op[soft[0].index])
    assert keys[f"fp32:{soft[0].outputs[0]}"] == n * 4 and soft[0].outputs[0] not in keys
    readers = [i for i in graph.consumers(soft[0].outputs[0])]
    assert any(dict(act.saved_by_op[i]).get(soft[0].outputs[0]) == n * 2 for i in readers)
    assert act.transient_bytes([soft[0].index]) == n * 4
    # with flash attention the core's softmax is in the kernel: nothing of this
    assert not activation_model_of(graph, 1, False, "bf16", False, "pytorch", "flash")._fp32_softmax
    costs = shard_op_costs(graph, 1, False, "bf16", get_gpu("h100"), False, NONE, "pytorch", "unfused")
    c = costs.costs[soft[0].index]
    assert (c.bytes_fwd, c.bytes_bwd) == (n * 20, n * 24)
    _, _, casts = eager_fp32_softmax_costs(graph, _tp(graph), lambda name, t: t.with_dtype(DType.BFLOAT16) if t is not None and t.dtype.is_float else t,
                                           costs.costs, costs.times, 1e12)
    assert casts[soft[0].index] == (2, 2)


def _tp(graph):
    from dml2comm.cost.cache import tensor_parallel_of

    return tensor_parallel_of(graph, 1, False, 2)


def test_a_norm_that_scales_in_fp32_keeps_its_normalised_input_in_fp32():
    """GemmaRMSNorm multiplies ``output * (1.0 + weight.float())`` in fp32 before ``.type_as(x)``
    (memory.FP32_SCALE_NORMS), which an fp32 export cannot show: in a bf16 step the weight's Mul
    keeps the fp32 normalised input (the module class comes from the exporter's class hierarchy)."""
    graph = _graph("gemma_tiny_dynamo")
    act = activation_model_of(graph, 1, False, "bf16", False, "pytorch", "flash")
    scaled = [op for op in graph.ops if op.module_class == "GemmaRMSNorm" and op.op_type == "Mul"
              and any((t := graph.tensor(n)) is not None and t.is_weight for n in op.inputs)]
    assert len(scaled) == 5  # two per block and the final norm
    for op in scaled:
        x = next(n for n in op.inputs if not graph.tensor(n).is_weight)
        assert dict(act.saved_by_op[op.index]) == {f"fp32:{x}": graph.tensor(x).numel * 4}
    # Llama's RMSNorm casts back before its weight: nothing of the kind
    llama = _graph("llama_gqa_dynamo")
    plain = activation_model_of(llama, 1, False, "bf16", False, "pytorch", "flash")
    assert not any(key.startswith("fp32:") and op.module_class.endswith("RMSNorm") and op.op_type == "Mul"
                   and any(llama.tensor(n) is not None and llama.tensor(n).is_weight for n in op.inputs)
                   for op in llama.ops for key, _ in plain.saved_by_op[op.index])


def test_a_concatenated_query_makes_the_attention_output_a_copy():
    """GPT-NeoX's partial rotary builds Q with torch.cat on [b, heads, s, d]: SDPA's output takes that
    layout, so transpose(1, 2).contiguous() copies it and the output projection keeps the copy
    besides the kernel's output (memory.ActivationModel._copied_outputs); Llama's transposed-view
    query makes that transpose free."""
    from dml2comm.cost.cache import flash_cores_of

    for name, copied in (("gpt_neox_dynamo", True), ("llama_gqa_dynamo", False)):
        graph = _graph(name)
        act = activation_model_of(graph, 1, False, "bf16", False, "pytorch", "flash")
        for core in flash_cores_of(graph):
            assert (core.out in act._copied_outputs([core])) is copied
            chain = [c for c in graph.consumers(core.out) if graph.ops[c].op_type == "Transpose"]
            assert chain and (act.base[graph.ops[chain[0]].outputs[0]] != core.out) is copied
