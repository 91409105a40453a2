"""The join of a profiled step onto the model, on the two bundled H100 traces (real Hugging Face
training steps, PyTorch 2.11, record_shapes=True) and their real ONNX exports."""

from pathlib import Path

import pytest

from dml2comm.ir.layers import group_layers
from dml2comm.ir.onnx_import import ImportOptions
from dml2comm.load import load_model
from dml2comm.traces.join import join_trace, token_shape
from dml2comm.traces.load import load_trace

ROOT = Path(__file__).resolve().parents[1]
CASES = [("trace_gpt2-small_bf16_b8", "step_gpt2_small_dynamo", 12, (8, 1024)),
         ("trace_llama-1b_bf16_b4", "step_llama_1b_dynamo", 16, (4, 2048))]


@pytest.fixture(scope="module", params=CASES, ids=[c[0] for c in CASES])
def joined(request):
    trace_name, model, blocks, shape = request.param
    trace = load_trace(ROOT / "benchmarks/data/h100" / f"{trace_name}.json.gz", shapes=True)
    layered = group_layers(load_model(ROOT / "dml2comm/validate/data/models" / f"{model}.onnx",
                                      ImportOptions(batch_size=shape[0], seq_len=shape[1])).graph)
    return trace, layered, join_trace(trace, layered), blocks, shape


def test_token_shape_read_from_the_trace(joined):
    trace, _, _, _, shape = joined
    assert token_shape(trace) == shape


def test_at_least_95_percent_of_gpu_time_attributed(joined):
    _, _, j, _, _ = joined
    assert j.gpu_s > 0
    assert j.attributed_share >= 0.95
    rows = {x.name: x for x in j.layers}
    assert abs(rows["unattributed"].total_s - j.unattributed_s) < 1e-9
    assert abs(sum(x.total_s for x in j.layers) - j.gpu_s) < 1e-9  # every kernel in exactly one row


def test_one_row_per_block_of_the_graph_and_blocks_alike(joined):
    _, layered, j, blocks, _ = joined
    times = [x.total_s for x in j.blocks()]
    assert len(times) == layered.num_blocks == blocks
    mean = sum(times) / len(times)
    assert all(abs(t - mean) <= 0.10 * mean for t in times)
    assert j.block_spread is not None and j.block_spread <= 0.10
    for b in j.blocks():  # each block has both passes
        assert b.forward_s > 0 and b.backward_s > b.forward_s


def test_loss_and_optimizer_found(joined):
    _, _, j, _, _ = joined
    rows = {x.name: x for x in j.layers}
    assert rows["loss"].forward_s > 0 and rows["loss"].backward_s > 0
    assert rows["optimizer"].other_s > 0 and j.phases["optimizer"] == pytest.approx(rows["optimizer"].other_s)


def test_without_a_model_phases_only(joined):
    trace, _, j, _, _ = joined
    bare = join_trace(trace)
    assert bare.layers == () and bare.block_spread is None
    assert bare.gpu_s == pytest.approx(j.gpu_s)
    assert bare.phases["backward"] > bare.phases["forward"] > 0
    assert any("no model" in n for n in bare.notes)


def test_needs_shapes():
    trace = load_trace(ROOT / "benchmarks/data/h100/trace_gpt2-small_bf16_b8.json.gz")
    with pytest.raises(ValueError, match="shapes=True"):
        join_trace(trace)
