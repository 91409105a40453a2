"""ONNX import: binding dims, scopes, weights, and every bad-input path."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from dml2comm.errors import InputFileError, ModelError, UnboundDimError
from dml2comm.ir.onnx_import import ImportOptions
from dml2comm.load import load_model, load_model_proto
from tests.helpers import mlp, model, weight
from tests.test_fixtures_exports import ISSUE16_FIXTURES

FIXTURES = Path(__file__).parent / "fixtures"


def test_binds_symbolic_batch_and_infers_every_shape():
    r = load_model_proto(mlp(), ImportOptions(batch_size=4))
    g = r.graph
    assert r.bound_dims == {"batch": 4}
    assert g.tensors["h3"].shape == (4, 8, 64)
    assert g.tensors["x"].is_input and not g.tensors["x"].is_weight
    # params: LN 2*16 + fc1 16*64 + 64 + fc2 64*16 + 16 = 32 + 1088 + 1040
    assert g.num_params == 32 + 1088 + 1040
    assert [op.scope for op in g.ops][:2] == ["mlp.ln", "mlp.fc1"]


def test_symbolic_batch_defaults_to_one_and_fixed_batch_is_reported():
    assert load_model_proto(mlp()).graph.tensors["x"].shape == (1, 8, 16)
    r = load_model_proto(mlp(batch=3))
    assert r.model_batch == 3 and r.graph.tensors["y"].shape == (3, 8, 16)


def test_dim_by_name_wins():
    r = load_model_proto(mlp(), ImportOptions(batch_size=4, dims={"batch": 2}))
    assert r.graph.tensors["x"].shape == (2, 8, 16)


def test_unbound_dim_names_the_dim_and_the_flag():
    x = helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "sequence"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "sequence", 4])
    m = model([helper.make_node("Gather", ["emb", "ids"], ["y"], name="/wte/Gather")], [x], [y], [weight("emb", [10, 4])])
    with pytest.raises(UnboundDimError, match=r"sequence.*--seq-len"):
        load_model_proto(m)
    r = load_model_proto(m, ImportOptions(seq_len=7))
    assert r.graph.tensors["y"].shape == (1, 7, 4)


def test_dynamo_metadata_scope_wins_over_name():
    m = mlp()
    prop = m.graph.node[1].metadata_props.add()
    prop.key, prop.value = "pkg.torch.onnx.name_scopes", "['', 'model', 'model.layers.0', 'model.layers.0.fc1']"
    g = load_model_proto(m).graph
    assert g.ops[1].scope == "model.layers.0.fc1"


def test_large_constant_is_a_weight_small_is_not():
    import numpy as np

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 128])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 64])
    big = helper.make_tensor("wc", TensorProto.FLOAT, [128, 64], np.zeros(128 * 64, np.float32))
    nodes = [helper.make_node("Constant", [], ["w"], value=big), helper.make_node("MatMul", ["x", "w"], ["y"])]
    g = load_model_proto(model(nodes, [x], [y])).graph
    assert g.tensors["w"].is_weight and g.num_params == 128 * 64
    assert [op.op_type for op in g.ops] == ["MatMul"]


def test_buffers_are_not_parameters():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4, 8, 8])
    bn = helper.make_node("BatchNormalization", ["x", "bn.weight", "bn.bias", "bn.running_mean", "bn.running_var"], ["y"])
    inits = [weight(n, [4]) for n in ("bn.weight", "bn.bias", "bn.running_mean", "bn.running_var")]
    g = load_model_proto(model([bn], [x], [y], inits)).graph
    assert g.num_params == 8


def test_local_functions_are_inlined():
    fn = helper.make_function(
        "custom", "DoubleRelu", ["a"], ["b"],
        [helper.make_node("Relu", ["a"], ["r"]), helper.make_node("Add", ["r", "r"], ["b"])],
        opset_imports=[helper.make_opsetid("", 18)],
    )
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    graph = helper.make_graph([helper.make_node("DoubleRelu", ["x"], ["y"], domain="custom")], "g", [x], [y])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("custom", 1)], functions=[fn])
    r = load_model_proto(m)
    assert sorted(op.op_type for op in r.graph.ops) == ["Add", "Relu"]
    assert any("inlined" in w for w in r.warnings)


def test_control_flow_needs_no_flag():
    # If is a supported construct (tests/test_control_flow.py): inlined, not an error, no --lenient
    cond = helper.make_tensor_value_info("c", TensorProto.BOOL, [])
    out = helper.make_tensor_value_info("o", TensorProto.FLOAT, [2])
    then = helper.make_graph([helper.make_node("Constant", [], ["t"], value=helper.make_tensor("tv", TensorProto.FLOAT, [2], [1, 2]))], "then", [], [helper.make_tensor_value_info("t", TensorProto.FLOAT, [2])])
    other = helper.make_graph([helper.make_node("Constant", [], ["e"], value=helper.make_tensor("ev", TensorProto.FLOAT, [2], [3, 4]))], "else", [], [helper.make_tensor_value_info("e", TensorProto.FLOAT, [2])])
    m = model([helper.make_node("If", ["c"], ["o"], name="branch", then_branch=then, else_branch=other)], [cond], [out])
    r = load_model_proto(m)
    assert [op.op_type for op in r.graph.ops] == ["Identity"]
    assert r.graph.tensors["o"].shape == (2,)
    assert any("'branch'" in w for w in r.warnings)


def test_missing_file(tmp_path):
    with pytest.raises(InputFileError, match="not found"):
        load_model(tmp_path / "nope.onnx")


def test_not_onnx_and_truncated(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_text("this is not a model")
    with pytest.raises(ModelError):
        load_model(bad)
    good = tmp_path / "good.onnx"
    onnx.save(mlp(), good)
    cut = tmp_path / "cut.onnx"
    cut.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(ModelError):
        load_model(cut)
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    with pytest.raises(ModelError, match="empty"):
        load_model(empty)


def test_external_weights_that_are_absent_are_fine(tmp_path):
    m = mlp()
    onnx.save(m, tmp_path / "m.onnx", save_as_external_data=True, all_tensors_to_one_file=True, location="w.bin", size_threshold=0)
    (tmp_path / "w.bin").unlink()
    g = load_model(tmp_path / "m.onnx", ImportOptions(batch_size=2)).graph
    assert g.num_params == 32 + 1088 + 1040


def test_tied_copy_in_legacy_gpt2_is_named_and_counted_once_on_request():
    from pathlib import Path

    path = Path(__file__).parent / "fixtures" / "gpt2_legacy.onnx"
    plain = load_model(path, ImportOptions(seq_len=16))
    assert plain.graph.num_params == 163_037_184  # wte stored twice by the legacy exporter
    assert any("--tie-embeddings" in w for w in plain.warnings)
    tied = load_model(path, ImportOptions(seq_len=16, tie_embeddings=True))
    assert tied.graph.num_params == 124_439_808  # GPT2LMHeadModel's parameter count in torch


def test_square_weights_shaped_like_a_square_table_are_not_its_tied_copy():
    """A tied head is one matrix.  Hand-built legacy-style graph: token table [10, 4] and position
    table [4, 4] (Gather), two [4, 4] projections and a [4, 10] head, all with generated names.
    The head is the token table's only transposed-shaped weight: with --tie-embeddings it is its
    copy (40 elements not counted); the projections both have the position table's (square)
    shape, so neither is a copy.  Parameters: 40 + 16 + 16 + 16 = 88 (before: 56, the two
    projections dropped as well; the legacy BERT-MLM export with h = 512 and 512 positions lost
    25 such [512, 512] weights, 6,553,600 parameters)."""
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4, 10])
    pos = helper.make_tensor("pos_ids", TensorProto.INT64, [4], [0, 1, 2, 3])
    nodes = [helper.make_node("Gather", ["tok.weight", "ids"], ["x0"]),
             helper.make_node("Gather", ["pos.weight", "pos_ids"], ["p"]),
             helper.make_node("Add", ["x0", "p"], ["x1"]),
             helper.make_node("MatMul", ["x1", "onnx::MatMul_1"], ["x2"]),
             helper.make_node("MatMul", ["x2", "onnx::MatMul_2"], ["x3"]),
             helper.make_node("MatMul", ["x3", "onnx::MatMul_3"], ["y"])]
    inits = [weight("tok.weight", [10, 4]), weight("pos.weight", [4, 4]), weight("onnx::MatMul_1", [4, 4]),
             weight("onnx::MatMul_2", [4, 4]), weight("onnx::MatMul_3", [4, 10]), pos]
    m = model(nodes, [ids], [y], inits)
    plain = load_model_proto(m, ImportOptions(batch_size=2))
    assert plain.graph.num_params == 40 + 16 + 16 + 16 + 40
    assert [w for w in plain.warnings if "--tie-embeddings" in w] == [
        "weight 'onnx::MatMul_3' has the shape of 'tok.weight' transposed: if the model ties its LM head to the embedding "
        "(GPT-2 does), the legacy exporter stored a copy; pass --tie-embeddings to count it once"]
    tied = load_model_proto(m, ImportOptions(batch_size=2, tie_embeddings=True))
    assert tied.graph.num_params == 88
    assert tied.graph.tensors["onnx::MatMul_3"].tied_to == "tok.weight"
    assert tied.graph.tensors["onnx::MatMul_1"].tied_to is None and tied.graph.tensors["onnx::MatMul_2"].tied_to is None
    # the real case: DeBERTa-v2 (h = 128, 128 positions, no tied head), whose 12 [128, 128] projections
    # have the position table's shape; --tie-embeddings took them for copies (418,816 counted)
    torch = _torch_record("deberta_v2_legacy.onnx")["parameter_count"]
    for tie in (False, True):
        r = load_model(FIXTURES / "deberta_v2_legacy.onnx", ImportOptions(seq_len=16, tie_embeddings=tie))
        assert r.graph.num_params == torch == 615_424
        assert not any("tie" in w for w in r.warnings)


def test_an_untied_head_in_a_dynamo_export_is_not_taken_for_a_tied_copy():
    """GPT-NeoX's untied ``embed_out``: the dynamo exporter folds its transpose into an
    initializer with a generated name and the embedding's transposed shape, as a legacy export's
    tied copy looks.  A dynamo export keeps a tied head as the embedding itself, so there is no
    advice to pass --tie-embeddings, and passing it does not drop the head (it did: 0.80x torch's
    count)."""
    import json
    from pathlib import Path

    fixtures = Path(__file__).parent / "fixtures"
    torch = json.loads((fixtures / "fixtures_expected.json").read_text())["models"]["gpt_neox"]["torch"]["parameter_count"]
    plain = load_model(fixtures / "gpt_neox_dynamo.onnx", ImportOptions(seq_len=16))
    assert plain.graph.num_params == torch
    assert not any("--tie-embeddings" in w for w in plain.warnings)
    tied = load_model(fixtures / "gpt_neox_dynamo.onnx", ImportOptions(seq_len=16, tie_embeddings=True))
    assert tied.graph.num_params == torch
    assert any("separate LM head" in w for w in tied.warnings)
    # the legacy export of the same model cannot be told from a tied copy (values are never read)
    legacy = load_model(fixtures / "gpt_neox_legacy.onnx", ImportOptions(seq_len=16))
    assert any("--tie-embeddings" in w for w in legacy.warnings) and legacy.graph.num_params == torch


# ---- which tensors are parameters


def _dynamic(nodes, x, y, inits=()):
    """``nodes`` plus a ``Range`` over x's last dim, which ONNX data propagation cannot size:
    the importer then folds the graph's shape computations (as for torch dynamo exports)."""
    extra = [
        helper.make_node("Shape", ["x"], ["x_last"], start=-1),
        helper.make_node("Squeeze", ["x_last"], ["n"]),
        helper.make_node("Range", ["zero", "n", "one"], ["r"]),
        helper.make_node("Cast", ["r"], ["rf"], to=TensorProto.FLOAT),
        helper.make_node("Add", ["pre_y", "rf"], [y.name]),
    ]
    ints = [helper.make_tensor("zero", TensorProto.INT64, [], [0]), helper.make_tensor("one", TensorProto.INT64, [], [1])]
    return model(list(nodes) + extra, [x], [y], list(inits) + ints)


def test_weights_reached_through_views_are_parameters():
    """A stacked [E, in, out] expert weight used by GatherND (the dynamo Mixtral export) or
    through Slice -> Squeeze, and a bias reshaped before its Add, are parameters; folding the
    reshape of the bias into a constant must not lose it."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8, 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8, 32])
    i64 = lambda name, values: helper.make_tensor(name, TensorProto.INT64, [len(values)], values)  # noqa: E731
    nodes = [
        helper.make_node("GatherND", ["stacked", "pick"], ["w0"]),  # [4, 16, 32] -> [16, 32]
        helper.make_node("MatMul", ["x", "w0"], ["h0"]),
        helper.make_node("Slice", ["sliced", "s0", "s1", "s_axes"], ["w1s"]),  # [4, 16, 32] -> [1, 16, 32]
        helper.make_node("Squeeze", ["w1s", "s_axes"], ["w1"]),
        helper.make_node("MatMul", ["x", "w1"], ["h1"]),
        helper.make_node("Reshape", ["bias", "b_shape"], ["b"]),  # [32] -> [1, 1, 32]
        helper.make_node("Add", ["h0", "h1"], ["h"]),
        helper.make_node("Add", ["h", "b"], ["pre_y"]),
    ]
    inits = [weight("stacked", [4, 16, 32]), i64("pick", [2]), weight("sliced", [4, 16, 32]), i64("s0", [0]), i64("s1", [1]),
             i64("s_axes", [0]), weight("bias", [32]), i64("b_shape", [1, 1, 32])]
    r = load_model_proto(_dynamic(nodes, x, y, inits), ImportOptions(batch_size=2))
    assert any("folded" in w for w in r.warnings)
    g = r.graph
    assert {w.name for w in g.weights if w.is_parameter} == {"stacked", "sliced", "bias"}
    assert g.num_params == 2 * 4 * 16 * 32 + 32  # two stacked weights of 2048 and the bias; no view counted
    # the views computed from parameters alone are parameter-derived weights, not parameters
    assert {(n, g.tensors[n].tied_to) for n in ("w1s", "w1", "b")} == {("w1s", "sliced"), ("w1", "sliced"), ("b", "bias")}
    assert g.parameter_sources("w1") == ("sliced",) and not g.tensors["w0"].is_weight  # GatherND by index: an activation


def test_folded_constants_are_never_parameters():
    """A float mask computed from shapes (Shape -> ConstantOfShape, 1 x 64 x 64 = 4096 elements)
    is folded into a Constant as large as a Paddle-style weight; it is a computed value."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64, 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 64, 64])
    zero = helper.make_tensor("z", TensorProto.FLOAT, [1], [0.0])
    nodes = [helper.make_node("Shape", ["x"], ["sx"]), helper.make_node("ConstantOfShape", ["sx"], ["mask"], value=zero),
             helper.make_node("Add", ["x", "mask"], ["pre_y"])]
    r = load_model_proto(_dynamic(nodes, x, y), ImportOptions(batch_size=1))
    assert any("folded" in w for w in r.warnings)
    assert r.graph.tensors["mask"].shape == (1, 64, 64) and not r.graph.tensors["mask"].is_weight
    assert r.graph.num_params == 0


def _torch_record(file: str) -> dict:
    expected = json.loads((FIXTURES / "fixtures_expected.json").read_text())
    model_name = next(f["model"] for f in expected["files"] if f["file"] == file)
    return expected["models"][model_name]["torch"]


@pytest.mark.parametrize("name", sorted(p.name for p in FIXTURES.glob("*.onnx") if p.name not in ISSUE16_FIXTURES))
def test_real_exports_have_the_torch_parameter_count(name):
    # the issue-16 fixtures need their own options (--dim, fixed shapes, conv biases under
    # folded BatchNorm): tests/test_fixtures_exports.py checks their counts
    """``sum(p.numel() for p in model.parameters())`` as recorded by tests/fixtures/export_models.py.

    A tied LM head is counted once only with --tie-embeddings (the legacy GPT-2 export stores a
    transposed copy).  Both exporters fold BatchNorm into the preceding Conv (its C-element scale
    and shift become one C-element Conv bias); the import restores it (ResNet-18's bias-free
    convolutions: torch's count exactly, where the folded graph had 4,800 fewer).
    """
    torch = _torch_record(name)
    g = load_model(FIXTURES / name, ImportOptions(seq_len=16, tie_embeddings=torch["weights_tied"])).graph
    assert g.num_params == torch["parameter_count"]


#: fixtures_expected.json's records of the exports written outside tests/fixtures (``dir``: the
#: package data folder of the models the validation reads, dml2comm/validate/data/models).
ROOT = FIXTURES.parents[1]
ELSEWHERE = [r for r in json.loads((FIXTURES / "fixtures_expected.json").read_text())["files"] if r.get("dir")]


def test_exports_kept_elsewhere_are_all_recorded():
    """Every .onnx of a folder the export script writes to besides this one has its record, and
    every such record its file (so the parameter-count check below covers all of them)."""
    folders = {r["dir"] for r in ELSEWHERE}
    assert folders == {"dml2comm/validate/data/models"}
    on_disk = sorted(f"{d}/{p.name}" for d in folders for p in (ROOT / d).glob("*.onnx"))
    assert on_disk == sorted(f"{r['dir']}/{r['file']}" for r in ELSEWHERE)


@pytest.mark.parametrize("record", ELSEWHERE, ids=lambda r: r["file"])
def test_exports_kept_elsewhere_have_the_torch_parameter_count(record):
    """As test_real_exports_have_the_torch_parameter_count, for the exports of the measured H100
    steps' models (GPT-2 small: 124,439,808; Llama-1B: 1,235,814,400; h100_steps.json records the
    same counts from the measured models)."""
    torch = _torch_record(record["file"])
    g = load_model(ROOT / record["dir"] / record["file"], ImportOptions(seq_len=16, tie_embeddings=torch["weights_tied"])).graph
    assert g.num_params == torch["parameter_count"]


def test_a_sequence_longer_than_an_offset_position_table_is_refused():
    """OPT-style learned positions: ``Range(0, s) + 2`` looks up a table of 10 rows (8 positions
    plus the offset of 2), so s = 8 fits and s = 9 looks up row 10.  The table's rows are not the
    limit (check_seq_len reads those off a ``Range`` lookup), the folded indices are: refused
    with the length to drop (the real OPT export took --seq-len 128 on its 66-row table)."""
    from dml2comm.errors import ModelError

    ids = helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 8])
    nodes = [
        helper.make_node("Gather", ["wte", "input_ids"], ["tok"], name="/embed_tokens/Gather"),
        helper.make_node("Shape", ["input_ids"], ["s_shape"], start=1, end=2),
        helper.make_node("Squeeze", ["s_shape"], ["s"]),
        helper.make_node("Range", ["zero", "s", "one"], ["r"]),
        helper.make_node("Add", ["r", "two"], ["positions"]),
        helper.make_node("Gather", ["wpe", "positions"], ["pos"], name="/embed_positions/Gather"),
        helper.make_node("Add", ["tok", "pos"], ["y"]),
    ]
    ints = [helper.make_tensor(n, TensorProto.INT64, [], [v]) for n, v in (("zero", 0), ("one", 1), ("two", 2))]
    m = model(nodes, [ids], [y], [weight("wte", [100, 8]), weight("wpe", [10, 8])] + ints)
    assert load_model_proto(m, ImportOptions(batch_size=2, seq_len=8)).graph.num_params == 100 * 8 + 10 * 8
    with pytest.raises(ModelError, match=r"looks up position 10 of table 'wpe', which has 10 rows .*1 shorter"):
        load_model_proto(m, ImportOptions(batch_size=2, seq_len=9))


def test_seq_len_binding_two_token_inputs_says_so():
    """An encoder-decoder's source and target token ids have separate symbolic lengths;
    ``--seq-len`` binds both alike, and the warning names them and the --dim that separates
    them (which then binds the target alone)."""
    src = helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "src_len"])
    tgt = helper.make_tensor_value_info("decoder_input_ids", TensorProto.INT64, ["batch", "tgt_len"])
    y1 = helper.make_tensor_value_info("enc", TensorProto.FLOAT, ["batch", "src_len", 8])
    y2 = helper.make_tensor_value_info("dec", TensorProto.FLOAT, ["batch", "tgt_len", 8])
    nodes = [helper.make_node("Gather", ["wte", "input_ids"], ["enc"]), helper.make_node("Gather", ["wte", "decoder_input_ids"], ["dec"])]
    m = model(nodes, [src, tgt], [y1, y2], [weight("wte", [100, 8])])
    both = load_model_proto(m, ImportOptions(batch_size=2, seq_len=16))
    assert any("'input_ids', 'decoder_input_ids' alike" in w and "--dim decoder_input_ids:1=N" in w for w in both.warnings)
    assert both.graph.tensors["dec"].shape == (2, 16, 8)
    apart = load_model_proto(m, ImportOptions(batch_size=2, seq_len=16, dims={"decoder_input_ids:1": 4}))
    assert not any("alike" in w for w in apart.warnings)
    assert apart.graph.tensors["enc"].shape == (2, 16, 8) and apart.graph.tensors["dec"].shape == (2, 4, 8)


@pytest.mark.parametrize("fixture, products", [("mixtral_tiny_dynamo", 4), ("qwen2_moe_tiny_dynamo", 4), ("mixtral_tiny_legacy", 0)])
def test_routed_expert_products_are_imported_as_one_product_of_the_routed_rows(fixture, products):
    """Hugging Face's batched_mm experts gather an expert matrix per routed (token, expert) pair
    and multiply one vector by each: costed as exported, the gathered [pairs, n, k] copies of
    the weights made a 0.5 B-parameter Mixtral step 6.7 s and 1.6 TiB (measured: 58 ms, 9.7 GiB).
    Imported, each is one [n, k] x [k, pairs] product (the grouped GEMM the step runs), the
    parameters unchanged, nothing of pairs x n x k elements left; the legacy export (a loop over
    the experts hit, unrolled) has no such products."""
    imported = load_model(FIXTURES / f"{fixture}.onnx", ImportOptions(batch_size=2, seq_len=16))
    graph = imported.graph
    note = [w for w in imported.warnings if "routed expert product" in w]
    assert (note[0].startswith(f"experts: {products} routed") if products else not note), note
    expected = json.loads((FIXTURES / "fixtures_expected.json").read_text())["models"][fixture.rsplit("_", 1)[0]]
    assert graph.num_params == expected["torch"]["parameter_count"]
    if not products:
        return
    grouped = [op for op in graph.ops if op.name.endswith("/grouped")]
    assert len(grouped) == products and not [op for op in graph.ops if op.op_type == "GatherND" and "experts" in op.scope]
    assert {op.aten for op in grouped} == {"aten._grouped_mm.default"} and all("experts" in op.scope for op in grouped)
    pairs = 2 * 16 * 2  # tokens x top-2
    for op in grouped:
        w, x = graph.tensor(op.inputs[0]), graph.tensor(op.inputs[1])
        assert w.rank == 2 and x.shape == (w.shape[1], pairs)
    assert max(t.numel for t in graph.tensors.values() if t.dtype.is_float and not t.is_weight) < pairs * 256 * 64


@pytest.mark.parametrize("table_is_weight", [True, False])
def test_only_a_gather_of_stacked_weights_is_read_as_routed_experts(table_is_weight):
    """The per-token GatherND -> MatMul -> Squeeze is rewritten only where the gathered tensor is a
    parameter (the stacked experts), not where it is an activation."""
    E, N, K, M = 4, 16, 8, 6
    nodes = [helper.make_node("Constant", [], ["axes"], value=helper.make_tensor("axes", TensorProto.INT64, [1], [-1])),
             helper.make_node("GatherND", ["table", "idx"], ["picked"]),
             helper.make_node("Unsqueeze", ["x", "axes"], ["col"]),
             helper.make_node("MatMul", ["picked", "col"], ["prod"]),
             helper.make_node("Squeeze", ["prod", "axes"], ["y"])]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [M, K]),
              helper.make_tensor_value_info("idx", TensorProto.INT64, [M, 1])]
    inits = []
    if table_is_weight:
        inits.append(helper.make_tensor("table", TensorProto.FLOAT, [E, N, K], [0.0] * (E * N * K)))
    else:
        inputs.append(helper.make_tensor_value_info("table", TensorProto.FLOAT, [E, N, K]))
    graph = helper.make_graph(nodes, "routed", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [M, N])], inits)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    imported = load_model_proto(proto, ImportOptions(batch_size=1))
    rewritten = [w for w in imported.warnings if "routed expert product" in w]
    assert bool(rewritten) == table_is_weight
    if table_is_weight:
        (grouped,) = [op for op in imported.graph.ops if op.op_type == "MatMul"]
        assert imported.graph.tensor(grouped.inputs[0]).shape == (N, K) and imported.graph.tensor(grouped.outputs[0]).shape == (N, M)
        assert imported.graph.tensor("y").shape == (M, N) and imported.graph.num_params == E * N * K
