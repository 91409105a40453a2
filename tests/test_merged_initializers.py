"""Issue 34 items 3 and 4: parameters as torch counts them in dynamo exports.

* The dynamo exporter stores value-equal initializers once.  A model built from a config has
  every norm weight equal to ones, so one initializer is read by the norms of every layer.
  torch counts one parameter per module; before, the tool counted one (Qwen3 tiny: -304) and,
  read on several pipeline stages, took it for a tied weight: a "tied-weight gradient
  all-reduce" between stages of a model that ties nothing.
* Buffers are not parameters: DeepSeek-V3's router ``e_score_correction_bias`` (no gradient
  reaches it: it only picks the experts) and Gemma's ``embed_scale`` (a rank-0 buffer).
"""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest

from dml2comm.analysis import analyze_graph
from dml2comm.hardware.cluster import make_cluster
from dml2comm.ir.onnx_import import ImportOptions
from dml2comm.load import load_model
from dml2comm.network.kinds import CollectiveKind, ParallelDim
from dml2comm.parallel.config import ParallelConfig

FIXTURES = Path(__file__).parent / "fixtures"
EXPECTED = json.loads((FIXTURES / "fixtures_expected.json").read_text())


def _torch(name: str) -> dict:
    rec = next(r for r in EXPECTED["files"] if r["file"] == name)
    return EXPECTED["models"][rec["model"]]["torch"]


def _load(name: str, **options):
    return load_model(FIXTURES / name, ImportOptions(batch_size=2, seq_len=16, **options))


def test_the_dynamo_export_merges_the_equal_norm_weights():
    """The fixture shows the merge: Qwen3 tiny has 5 [64] norms (2 layers x 2 + the final one)
    and 4 [16] q/k norms; the export keeps one initializer of each shape."""
    m = onnx.load(FIXTURES / "qwen3_init_dynamo.onnx", load_external_data=False)
    norms = [i.name for i in m.graph.initializer if i.name.endswith("norm.weight")]
    assert norms == ["model.layers.0.self_attn.q_norm.weight", "model.layers.0.input_layernorm.weight"]


@pytest.mark.parametrize("name", ["qwen3_init_dynamo.onnx", "deepseek_v3_tiny_dynamo.onnx", "gemma_tiny_dynamo.onnx",
                                  "cohere_tiny_dynamo.onnx"])
def test_parameter_count_is_torchs(name):
    """qwen3_init: 202,112 (was 201,808: 4 x 64 + 3 x 16 = 304 merged away); DeepSeek-V3
    tiny: 206,496 (was + 4, the correction bias); Gemma tiny: 133,952 (was + 1, embed_scale)."""
    assert _load(name).graph.num_params == _torch(name)["parameter_count"]


def test_gemma_legacy_counts_torchs_parameters_with_its_tied_head():
    assert _load("gemma_tiny_legacy.onnx", tie_embeddings=True).graph.num_params == _torch("gemma_tiny_legacy.onnx")["parameter_count"]


def test_each_norm_reads_its_own_parameter_named_as_torch_names_it():
    g = _load("qwen3_init_dynamo.onnx").graph
    params = {n for n, t in g.tensors.items() if t.is_weight and t.is_parameter}
    for layer in (0, 1):
        for norm in ("input_layernorm", "post_attention_layernorm", "self_attn.q_norm", "self_attn.k_norm"):
            assert f"model.layers.{layer}.{norm}.weight" in params
    assert "model.norm.weight" in params


def test_buffers_are_not_parameters():
    g = _load("deepseek_v3_tiny_dynamo.onnx").graph
    assert not g.tensors["model.layers.1.mlp.gate.e_score_correction_bias"].is_weight
    assert g.tensors["model.layers.1.mlp.gate.weight"].is_weight  # the router's own weight is a parameter
    g = _load("gemma_tiny_dynamo.onnx").graph
    assert not g.tensors["model.embed_tokens.embed_scale"].is_weight


@pytest.mark.parametrize("p", [2, 3])
def test_no_tied_weight_all_reduce_for_a_model_that_ties_nothing(p):
    """Qwen3 tiny ties nothing: no stage holds a weight another stage reads, so no pipeline
    all-reduce (before: the merged norm weight, read on every stage, was all-reduced)."""
    imported = _load("qwen3_init_dynamo.onnx")
    config = ParallelConfig(dp_size=1, tp_size=1, pp_size=p, micro_batch_size=1, global_batch_size=8, seq_len=None)
    a = analyze_graph(imported, config, make_cluster("a100", p), advise=False, timeline=False)
    assert not [c for c in a.comms if c.dim is ParallelDim.PP and c.kind is CollectiveKind.ALL_REDUCE]
    assert sum(st.params for st in a.stages) == a.graph.num_params
