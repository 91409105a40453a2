"""Tensor-parallel sharding of real exports does not depend on the batch size or the exporter.

Issue 16, part 3: exports that merge batch and heads (``[b, n, s, d] -> [b*n, s, d]``) kept
the Q/K/V projections whole with a false grouped-query warning, and the same warning appeared on
models without attention.  Head counts now come from the attention cores (Q.K^T -> Softmax ->
.V) and a split survives a batch*heads merge for any batch.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from onnx import TensorProto, helper

from dml2comm.ir.onnx_import import ImportOptions
from dml2comm.load import load_model, load_model_proto
from dml2comm.network.kinds import CollectiveKind, Phase
from dml2comm.parallel.tensor import attention_heads, find_attention, shard_tensor_parallel
from tests.helpers import model, weight
from tests.helpers import PACKAGED_MODELS

FIXTURES = Path(__file__).parent / "fixtures"


def _per_gpu(graph, plan) -> float:
    """Parameters one tensor rank holds (a stored copy of a tied weight counts once, as in the analysis)."""
    return sum(w.numel / plan.weight_factor.get(w.name, 1) for w in graph.weights if w.tied_to is None)


def _gqa_warnings(plan) -> list[str]:
    return [w for w in plan.warnings if "grouped-query" in w]


# ----------------------------------------------------------------------------- hand-built attention


def _i64(name: str, values: list[int]) -> TensorProto:
    return helper.make_tensor(name, TensorProto.INT64, [len(values)], values)


def attention(s: int = 8, n: int = 4, kv: int = 4, d: int = 16, merge: bool = True, sdpa: bool = False):
    """x[b, s, n*d] -> q/k/v projections -> [b, s, heads, d] -> [b, heads, s, d] (K and V
    repeated to n heads when kv < n, as HF ``repeat_kv``) -> with ``merge`` the ``[b*n, s, d]``
    views of torch's matmul decomposition -> Q.K^T -> Softmax -> .V -> back to [b, s, n*d] ->
    output projection.  ``sdpa``: only K is merged, as the dynamo exporter decomposes
    scaled_dot_product_attention: ``[b, n, s, d] -> [b*n, s, d] -> Transpose -> [b*n, d, s] ->
    [b, n, d, s]``.  The batch is symbolic."""
    h = n * d
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", s, h])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", s, h])
    inits = [weight("wq", [h, h]), weight("wk", [h, kv * d]), weight("wv", [h, kv * d]), weight("wo", [h, h]),
             _i64("s_q", [0, 0, n, d]), _i64("s_kv", [0, 0, kv, d]), _i64("s_m", [-1, s, d]), _i64("s_mt", [-1, d, s]),
             _i64("s_u", [-1, n, s, d]), _i64("s_o", [0, 0, h]), _i64("ax", [2]), _i64("e", [1, 1, n // kv, 1, 1]),
             _i64("s_rep", [0, n, s, d]), _i64("s_kt", [-1, n, d, s])]
    nodes = []
    for nm, shape, w in (("q", "s_q", "wq"), ("k", "s_kv", "wk"), ("v", "s_kv", "wv")):
        nodes.append(helper.make_node("MatMul", ["x", w], [nm + "0"], name=f"/attn/{nm}_proj/MatMul"))
        nodes.append(helper.make_node("Reshape", [nm + "0", shape], [nm + "1"], name=f"/attn/{nm}_heads"))
        nodes.append(helper.make_node("Transpose", [nm + "1"], [nm + "2"], name=f"/attn/{nm}_t", perm=[0, 2, 1, 3]))
        last = nm + "2"
        if nm != "q" and kv != n:
            nodes.append(helper.make_node("Unsqueeze", [last, "ax"], [nm + "3"], name=f"/attn/{nm}_unsqueeze"))
            nodes.append(helper.make_node("Expand", [nm + "3", "e"], [nm + "4"], name=f"/attn/{nm}_expand"))
            nodes.append(helper.make_node("Reshape", [nm + "4", "s_rep"], [nm + "5"], name=f"/attn/{nm}_repeat"))
            last = nm + "5"
        if nm == "k" and sdpa:
            nodes.append(helper.make_node("Reshape", [last, "s_m"], ["km"], name="/attn/k_merge"))
            nodes.append(helper.make_node("Transpose", ["km"], ["kmT"], name="/attn/k_T", perm=[0, 2, 1]))
            nodes.append(helper.make_node("Reshape", ["kmT", "s_kt"], ["kT"], name="/attn/k_unmerge"))
            last = "kT"
        elif nm == "k":
            nodes.append(helper.make_node("Transpose", [last], ["kT"], name="/attn/k_T", perm=[0, 1, 3, 2]))
            last = "kT"
        if merge and not sdpa:
            nodes.append(helper.make_node("Reshape", [last, "s_mt" if nm == "k" else "s_m"], [nm + "m"], name=f"/attn/{nm}_merge"))
            last = nm + "m"
        nodes.append(helper.make_node("Identity", [last], [nm + "_in"], name=f"/attn/{nm}_in"))
    nodes += [
        helper.make_node("MatMul", ["q_in", "k_in"], ["scores"], name="/attn/qk/MatMul"),
        helper.make_node("Softmax", ["scores"], ["probs"], name="/attn/Softmax", axis=-1),
        helper.make_node("MatMul", ["probs", "v_in"], ["ctx"], name="/attn/pv/MatMul"),
    ]
    last = "ctx"
    if merge and not sdpa:
        nodes.append(helper.make_node("Reshape", ["ctx", "s_u"], ["ctx4"], name="/attn/unmerge"))
        last = "ctx4"
    nodes += [
        helper.make_node("Transpose", [last], ["ctx_t"], name="/attn/ctx_t", perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["ctx_t", "s_o"], ["ctx3"], name="/attn/ctx_view"),
        helper.make_node("MatMul", ["ctx3", "wo"], ["y"], name="/attn/o_proj/MatMul"),
    ]
    return model(nodes, [x], [y], inits)


def _rules(graph, plan) -> dict[str, str]:
    return {op.name: shard.rule for op, shard in zip(graph.ops, plan.shards)}


@pytest.mark.parametrize("b", [1, 2, 3])
def test_merged_batch_heads_attention_is_head_parallel_for_any_batch(b):
    g = load_model_proto(attention(merge=True), ImportOptions(batch_size=b)).graph
    plan = shard_tensor_parallel(g, 4)
    assert (plan.heads, plan.kv_heads) == (4, 4)
    # every projection split: q/k/v column-parallel, o row-parallel; nothing replicated, no warning
    assert plan.weight_factor == {"wq": 4, "wk": 4, "wv": 4, "wo": 4}
    assert plan.warnings == ()
    rules = _rules(g, plan)
    assert rules["/attn/qk/MatMul"] == rules["/attn/pv/MatMul"] == "head-parallel"
    assert rules["/attn/o_proj/MatMul"] == "row-parallel"
    shard = plan.shards[next(op.index for op in g.ops if op.name == "/attn/qk/MatMul")]
    # merged scores [b*4, 8, 8]: one head of four per rank -> [b, 8, 8]
    assert shard.outputs[0].shape == (b, 8, 8)
    # the only collective: the row-parallel output all-reduced, [b, 8, 64] in 2-byte elements
    assert [(c.kind.value, c.message_bytes) for c in plan.comms] == [("ALL_REDUCE", b * 8 * 64 * 2)]
    # the same plan as the unmerged [b, n, s, d] layout
    flat = load_model_proto(attention(merge=False), ImportOptions(batch_size=b)).graph
    flat_plan = shard_tensor_parallel(flat, 4)
    assert flat_plan.weight_factor == plan.weight_factor
    assert [c.message_bytes for c in flat_plan.comms] == [c.message_bytes for c in plan.comms]


@pytest.mark.parametrize("b", [1, 2])
def test_sdpa_decomposition_with_k_through_a_merged_view(b):
    g = load_model_proto(attention(sdpa=True), ImportOptions(batch_size=b)).graph
    plan = shard_tensor_parallel(g, 4)
    assert (plan.heads, plan.kv_heads) == (4, 4)
    assert plan.weight_factor == {"wq": 4, "wk": 4, "wv": 4, "wo": 4} and plan.warnings == ()
    # K^T back at rank 4, [b, 4, 16, 8]: one head per rank -> [b, 1, 16, 8]
    shard = plan.shards[next(op.index for op in g.ops if op.name == "/attn/qk/MatMul")]
    assert shard.inputs[1].shape == (b, 1, 16, 8)


@pytest.mark.parametrize("merge", [False, True])
@pytest.mark.parametrize("b", [1, 2])
def test_gqa_warning_exactly_when_t_does_not_divide_the_kv_heads(merge, b):
    g = load_model_proto(attention(kv=2, merge=merge), ImportOptions(batch_size=b)).graph
    assert attention_heads(g) == (4, 2)
    # t = 2 divides the 2 KV heads: K and V split, no warning
    two = shard_tensor_parallel(g, 2)
    assert two.weight_factor == {"wq": 2, "wk": 2, "wv": 2, "wo": 2}
    assert two.warnings == ()
    # t = 4 does not: K and V projections replicated (Megatron-LM), each named once
    four = shard_tensor_parallel(g, 4)
    assert four.weight_factor == {"wq": 4, "wk": 1, "wv": 1, "wo": 4}
    warned = _gqa_warnings(four)
    assert len(warned) == 2 and "'/attn/k_proj/MatMul'" in warned[0] and "'/attn/v_proj/MatMul'" in warned[1]
    assert "(2 KV, 4 query heads" in warned[0]


def test_multi_query_attention_keeps_heads_whole():
    """One KV head: splitting it would split head_dim; it is replicated with the warning."""
    g = load_model_proto(attention(kv=1), ImportOptions(batch_size=2)).graph
    assert attention_heads(g) == (4, 1)
    plan = shard_tensor_parallel(g, 2)
    assert plan.weight_factor == {"wq": 2, "wk": 1, "wv": 1, "wo": 2}
    assert len(_gqa_warnings(plan)) == 2
    # no all-gather of a head_dim-split K before Q.K^T
    assert all(c.kind.value != "ALL_GATHER" for c in plan.comms)


def fused_qkv(s: int = 8, n: int = 4, d: int = 16):
    """timm-ViT / SVTR-style fused attention: x[b, s, n*d] -> one qkv projection [b, s, 3*n*d]
    -> Reshape [b, s, 3, n, d] -> Transpose [3, b, n, s, d] -> Split + Squeeze into q, k, v
    -> Q.K^T -> Softmax -> .V -> [b, s, n*d] -> output projection."""
    h = n * d
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", s, h])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", s, h])
    nodes = [
        helper.make_node("MatMul", ["x", "wqkv"], ["qkv0"], name="/attn/qkv/MatMul"),
        helper.make_node("Add", ["qkv0", "bqkv"], ["qkv1"], name="/attn/qkv/Add"),
        helper.make_node("Reshape", ["qkv1", "s5"], ["qkv2"], name="/attn/Reshape"),
        helper.make_node("Transpose", ["qkv2"], ["qkv3"], name="/attn/Transpose", perm=[2, 0, 3, 1, 4]),
        helper.make_node("Split", ["qkv3"], ["q1", "k1", "v1"], name="/attn/Split", axis=0, num_outputs=3),
        helper.make_node("Squeeze", ["q1", "a0"], ["q"], name="/attn/q"),
        helper.make_node("Squeeze", ["k1", "a0"], ["k"], name="/attn/k"),
        helper.make_node("Squeeze", ["v1", "a0"], ["v"], name="/attn/v"),
        helper.make_node("Transpose", ["k"], ["kT"], name="/attn/kT", perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "kT"], ["scores"], name="/attn/qk/MatMul"),
        helper.make_node("Softmax", ["scores"], ["probs"], name="/attn/Softmax", axis=-1),
        helper.make_node("MatMul", ["probs", "v"], ["ctx"], name="/attn/pv/MatMul"),
        helper.make_node("Transpose", ["ctx"], ["ctx_t"], name="/attn/ctx_t", perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["ctx_t", "s3"], ["ctx3"], name="/attn/ctx_view"),
        helper.make_node("MatMul", ["ctx3", "wo"], ["y"], name="/attn/proj/MatMul"),
    ]
    inits = [weight("wqkv", [h, 3 * h]), weight("bqkv", [3 * h]), weight("wo", [h, h]),
             _i64("s5", [0, 0, 3, n, d]), _i64("s3", [0, 0, h]), _i64("a0", [0])]
    return model(nodes, [x], [y], inits)


@pytest.mark.parametrize("b", [1, 2])
def test_fused_qkv_viewed_as_3_heads_dim_is_split_by_heads(b):
    """The [.., 3, n, d] view used to hide the heads (none found) and keep qkv whole with a
    grouped-query warning; each rank now holds its own q, k and v heads."""
    g = load_model_proto(fused_qkv(), ImportOptions(batch_size=b)).graph
    assert attention_heads(g) == (4, 4)
    plan = shard_tensor_parallel(g, 4)
    assert plan.weight_factor == {"wqkv": 4, "bqkv": 4, "wo": 4} and plan.warnings == ()
    shard = plan.shards[next(op.index for op in g.ops if op.name == "/attn/qk/MatMul")]
    # q [b, 4, 8, 16] and k^T [b, 4, 16, 8]: one head per rank
    assert [v.shape for v in shard.inputs] == [(b, 1, 8, 16), (b, 1, 16, 8)]
    assert [c.reason for c in plan.comms] == ["partial graph output"]


def test_a_split_that_no_reshape_keeps_is_not_called_grouped_query():
    """No attention: x[b, 8, 64] -> MatMul [64, 48] -> Reshape [b, 8, 3, 16] -> Relu.

    At t=4 each rank would hold 12 of the 48 columns, which straddle the 3 x 16 view: the
    MatMul is replicated, and the warning names the Reshape, not grouped-query heads."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8, 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8, 3, 16])
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="/proj/MatMul"),
        helper.make_node("Reshape", ["h", "shape"], ["v"], name="/view/Reshape"),
        helper.make_node("Relu", ["v"], ["y"], name="/act/Relu"),
    ]
    g = load_model_proto(model(nodes, [x], [y], [weight("w", [64, 48]), _i64("shape", [0, 0, 3, 16])]),
                         ImportOptions(batch_size=2)).graph
    assert attention_heads(g) == (None, None) and find_attention(g) == ()
    plan = shard_tensor_parallel(g, 4)
    assert plan.weight_factor == {"w": 1}
    assert plan.warnings == ("MatMul '/proj/MatMul' replicated: its output split over t=4 cannot pass "
                             "Reshape '/view/Reshape' ([2, 8, 48] -> [2, 8, 3, 16])",)


# ----------------------------------------------------------------------------- real exports

# (fixture stem, import options beyond batch/seq, t, per-GPU parameters expected)
#
# GPT-2 small at t=4: wte 50257*768 = 38,597,376 vocab-parallel -> 9,649,344; wpe 786,432
# replicated; per block ln_1 1,536 + c_attn (768*2304 + 2304)/4 = 442,944 + c_proj 589,824/4 +
# bias 768 = 148,224 + ln_2 1,536 + c_fc (768*3072 + 3072)/4 = 590,592 + c_proj 2,359,296/4 +
# 768 = 590,592 -> 1,775,424 x 12 = 21,305,088; ln_f 1,536.  Total 31,742,400.  The legacy
# export stores the tied LM head as a second, transposed initializer that no graph structure
# ties to wte; --tie-embeddings declares it (without it the copy counts as 38.6 M parameters
# more: a weights question, not a sharding one).
# BERT-base at t=4: word embeddings 30522*768/4 = 5,860,224; position 393,216, token type
# 1,536 and LayerNorm 1,536 replicated; per layer the same 1,775,424 as GPT-2 -> 21,305,088.
# Total 27,561,600.
# Llama GQA (hidden 256, 8 q / 2 kv heads of 32, ffn 688, 4 layers, vocab 1000, untied) at
# t=4: embed and lm_head 256,000/4 each; per layer q 65,536/4 + o 65,536/4 + k, v 16,384 each
# replicated (2 KV heads, t=4) + MLP 528,384/4 = 132,096 + norms 512 -> 198,144 x 4 =
# 792,576; final norm 256.  Total 920,832.  At t=2 the KV heads split too: per layer
# 32,768 + 8,192 + 8,192 + 32,768 + 264,192 + 512 = 346,624 x 4 = 1,386,496 + 2 x 128,000 + 256
# = 1,642,752.
# MiniLM (hidden 384, 12 heads, ffn 1536, 4 layers) at t=4: word embeddings 30522*384/4 =
# 2,930,112; position 196,608 + token type 768 + LayerNorm 768 replicated; per layer
# qkv (3*384*384 + 3*384)/4 = 110,880 + o 147,456/4 + 384 = 37,248 + LN 768 + ffn1
# (384*1536 + 1536)/4 = 147,840 + ffn2 589,824/4 + 384 = 147,840 + LN 768 -> 445,344 x 4 =
# 1,781,376.  Total 4,909,632.
CASES = [
    ("gpt2", {"tie_embeddings": True}, 4, 31_742_400),
    ("bert", {}, 4, 27_561_600),
    ("llama_gqa", {}, 4, 920_832),
    ("llama_gqa", {}, 2, 1_642_752),
    ("minilm", {}, 4, 4_909_632),
]
SEQ = 32


def _exports(stem: str) -> list[Path]:
    """A model's legacy and dynamo exports, here or in the package data folder (the measured
    steps' models: ``resnet18_dynamo``)."""
    paths = sorted([*FIXTURES.glob(f"{stem}_*.onnx"), *PACKAGED_MODELS.glob(f"{stem}_*.onnx")], key=lambda p: p.name)
    return [p for p in paths if p.stem.removeprefix(stem + "_").split("_")[0] in ("legacy", "dynamo")]


def _load(path: Path, batch: int | None, seq: int | None = SEQ, **options):
    return load_model(path, ImportOptions(batch_size=batch, seq_len=seq, **options))


@pytest.mark.parametrize("stem, options, t, expected", CASES, ids=[f"{c[0]}-t{c[2]}" for c in CASES])
def test_params_per_gpu_do_not_depend_on_batch_or_exporter(stem, options, t, expected):
    paths = _exports(stem)
    assert len(paths) >= 2, f"the {stem} fixtures are missing (tests/fixtures/export_models.py builds them)"
    collectives = {}
    for path in paths:  # minilm_dynamo_b2 fixes its batch at 2: it keeps it whatever is asked
        for batch in (1, 4):
            graph = _load(path, batch, **options).graph
            plan = shard_tensor_parallel(graph, t)
            assert _per_gpu(graph, plan) == expected, (path.name, batch)
            heads, kv = attention_heads(graph)
            # one warning per K and per V projection exactly where t does not divide the KV heads
            assert len(_gqa_warnings(plan)) == (2 * len(find_attention(graph)) if kv and kv % t else 0), path.name
            # the same tensor-parallel collectives (kind, phase, count), with and without
            # sequence parallelism: a [b*s, h] view no longer costs a batch-dependent gather
            collectives[path.name, batch] = [
                Counter((c.kind.value, c.phase.value) for c in shard_tensor_parallel(graph, t, sp).comms)
                for sp in (False, True)
            ]
    first = next(iter(collectives.values()))
    assert all(v == first for v in collectives.values()), collectives


# cnn_classifier has 10 classes: t=4 does not divide its classifier (an error, tested elsewhere)
@pytest.mark.parametrize("stem, ts", [("resnet18", (2, 4)), ("cnn_classifier", (2,))])
def test_cnn_has_no_attention_and_the_same_shards_from_both_exporters(stem, ts):
    paths = _exports(stem)
    assert len(paths) >= 2, f"the {stem} fixtures are missing (tests/fixtures/export_models.py builds them)"
    for t in ts:
        seen = set()
        for path in paths:
            for batch in (1, 3):
                graph = _load(path, batch, seq=None).graph
                assert attention_heads(graph) == (None, None)
                plan = shard_tensor_parallel(graph, t)
                assert not _gqa_warnings(plan), plan.warnings
                seen.add(_per_gpu(graph, plan))
        # the dynamo export's ReduceMean (axes as an input) and the legacy GlobalAveragePool
        # both keep the channel split: one per-GPU count per exporter for every batch, the two
        # apart only by the conv biases the TorchScript export's restored BatchNorm drops (480
        # channels, split or held whole as the plan shards each conv; tests/test_fixtures_exports.py
        # BN_FOLDED)
        assert len(seen) <= 2, seen
        if len(seen) == 2:
            assert 480 / t <= max(seen) - min(seen) <= 480, seen


@pytest.mark.parametrize("exporter", ["legacy", "dynamo"])
def test_a_classifier_head_t_does_not_divide_is_replicated_not_refused(exporter):
    """The CNN classifier's Linear(256, 10) head at t=4: 10 outputs do not split 4 ways.  It is
    the model's output head, so it stays whole on every rank with a warning (Megatron-LM keeps
    its heads replicated) instead of refusing the run, as any 10-class ViT or ConvNeXt was; a
    hidden projection t does not divide is still refused (test_parallel)."""
    from pathlib import Path

    g = load_model(Path(__file__).parent / "fixtures" / f"cnn_classifier_{exporter}.onnx", ImportOptions(batch_size=2)).graph
    plan = shard_tensor_parallel(g, 4)
    head = next(op.index for op in g.ops if op.op_type in ("Gemm", "MatMul"))
    assert plan.shards[head].rule == "replicated (output head)"
    assert any("does not divide its 10 outputs" in w for w in plan.warnings)


@pytest.mark.parametrize("exporter", ["legacy", "dynamo"])
def test_deberta_relative_position_scores_stay_split_by_heads_at_any_micro_batch(exporter):
    """DeBERTa's content-to-position scores: head-split queries merged as [b*n, s, d] against
    relative-position keys [n, 2k, d] repeated b times (Tile), then GatherElements per position.
    The repeat keeps each rank's heads in every copy, and GatherElements keeps a split on an axis
    it does not gather along, so the plan is Megatron's 2 + 2 all-reduces per layer whatever the
    micro-batch (it gathered the scores at b = 1 and replicated the score MatMuls at b = 2,
    without a warning)."""
    from pathlib import Path

    path = Path(__file__).parent / "fixtures" / f"deberta_v2_{exporter}.onnx"
    plans = {}
    for b in (1, 2, 3):
        g = load_model(path, ImportOptions(batch_size=b, seq_len=16)).graph
        plan = shard_tensor_parallel(g, 2)
        assert plan.warnings == ()
        assert {c.kind.name for c in plan.comms} == {"ALL_REDUCE"}
        plans[b] = Counter((c.phase.name, c.reason.split(";")[0]) for c in plan.comms)
        assert [s.rule for s, op in zip(plan.shards, g.ops) if op.op_type == "GatherElements"] == ["split (gather)"] * 4
    assert plans[1] == plans[2] == plans[3]


@pytest.mark.parametrize("exporter", ["legacy", "dynamo"])
@pytest.mark.parametrize("sp", [False, True])
def test_electra_embedding_projection_stays_whole_so_layer_zero_is_planned_like_the_others(exporter, sp):
    """ELECTRA projects its 64-wide embeddings to the hidden size 128 with a Linear whose output
    is layer 0's input: read by its query, key and value projections and by its residual.  Split
    by columns, it made layer 0's Q/K/V row-parallel, its attention core replicated and added an
    all-gather (4 forward all-reduces + 1 all-gather against 2 in layer 1).  It is kept whole
    (warned), and every encoder layer gets Megatron's plan: Q/K/V and the MLP's first GEMM
    column-parallel, the output projections row-parallel."""
    from pathlib import Path

    path = Path(__file__).parent / "fixtures" / f"electra_{exporter}.onnx"
    g = load_model(path, ImportOptions(batch_size=2, seq_len=16)).graph
    plan = shard_tensor_parallel(g, 2, sequence_parallel=sp)
    rules = Counter(s.rule for op, s in zip(g.ops, plan.shards) if op.op_type in ("MatMul", "Gemm"))
    assert rules == {"column-parallel": 8, "row-parallel": 4, "head-parallel": 4, "replicated (block input)": 1}, rules
    assert sum("feeds several projections" in w for w in plan.warnings) == 1
    per_kind = Counter(c.kind.name for c in plan.comms)
    if sp:
        assert "ALL_REDUCE" not in per_kind or per_kind["ALL_REDUCE"] <= 1
    else:
        assert set(per_kind) == {"ALL_REDUCE"}


#: Tiny Mixtral (tests/fixtures): 350,016 parameters, 196,608 of them in the stacked experts
#: (2 layers x (gate_up_proj [4, 256, 64] + down_proj [4, 64, 128])).
MIXTRAL_PARAMS, MIXTRAL_EXPERT_PARAMS = 350_016, 2 * (4 * 256 * 64 + 4 * 64 * 128)


@pytest.mark.parametrize("exporter", ["legacy", "dynamo"])
def test_experts_picked_from_a_stacked_weight_are_expert_tensor_parallel(exporter):
    """Mixtral's experts exported as one [E, n, k] weight per projection, picked by Gather (the
    legacy exporter) or GatherND (dynamo) for batched products, are split as Megatron-Core's
    expert tensor parallelism (ETP = t): gate_up_proj over its 256 output features, down_proj over
    its 128 input features.  They were kept whole on every rank (273,472 parameters per GPU at
    t=2, 0.78 of the model)."""
    graph = load_model(FIXTURES / f"mixtral_tiny_{exporter}.onnx", ImportOptions(batch_size=2, seq_len=16)).graph
    plan = shard_tensor_parallel(graph, 2)
    assert not [w for w in plan.warnings if "stacked expert weight" in w]
    gate_up = [w for w in graph.weights if w.rank == 3 and w.shape == (4, 256, 64)]
    down = [w for w in graph.weights if w.rank == 3 and w.shape == (4, 64, 128)]
    assert len(gate_up) == len(down) == 2
    assert all(plan.weight_factor[w.name] == 2 for w in gate_up + down)
    rules = Counter(sh.rule for op, sh in zip(graph.ops, plan.shards) if op.op_type == "MatMul" and "experts" in op.scope)
    assert rules == {"column-parallel (experts)": 2, "row-parallel (experts)": 2}, rules
    # the split expert products compute half of each picked matrix: [64, 128, 64] of [64, 256, 64]
    # (legacy: a batched product per routed pair); the dynamo export's per-pair gather is imported
    # as one product of the 64 routed rows, [128, 64] of the picked [256, 64] matrix
    col = next(sh for sh in plan.shards if sh.rule == "column-parallel (experts)")
    picked = [tuple(v.shape) for v in col.inputs if v is not None and v.rank >= 2]
    assert (64, 128, 64) in picked if exporter == "legacy" else picked == [(128, 64), (64, 64)], picked
    # params per GPU: every other weight is planned as before, so the whole model loses exactly
    # half of the expert parameters: 273,472 - 196,608 / 2 = 175,168
    per_gpu = sum(w.numel / plan.weight_factor[w.name] for w in graph.weights)
    assert per_gpu == 273_472 - MIXTRAL_EXPERT_PARAMS / 2 == 175_168
    # the vocabulary embedding is still a vocab-parallel Gather
    assert any(sh.rule == "vocab-parallel embedding" for sh in plan.shards)


@pytest.mark.parametrize("sp", [False, True])
@pytest.mark.parametrize("exporter", ["legacy", "dynamo"])
def test_expert_outputs_are_reduced_once_after_the_combine(exporter, sp):
    """The row-parallel experts' partial sums pass through the routing weights and the sum over
    the top-2 choices and are reduced once per MoE layer, on the combined [32 tokens, 64] output
    (4,096 bytes in bf16), not on the [64 pairs, 64] expert outputs: one all-reduce forward (a
    reduce-scatter with sequence parallelism), like a dense MLP's."""
    graph = load_model(FIXTURES / f"mixtral_tiny_{exporter}.onnx", ImportOptions(batch_size=2, seq_len=16)).graph
    plan = shard_tensor_parallel(graph, 2, sequence_parallel=sp)
    moe_fwd = [c for c in plan.comms if c.phase is Phase.FORWARD and "experts" in graph.ops[c.op_index].scope
               and c.kind in (CollectiveKind.ALL_REDUCE, CollectiveKind.REDUCE_SCATTER)]
    kind = CollectiveKind.REDUCE_SCATTER if sp else CollectiveKind.ALL_REDUCE
    assert [(c.kind, c.message_bytes) for c in moe_fwd] == [(kind, 32 * 64 * 2)] * 2, moe_fwd
    assert all(graph.ops[c.op_index].op_type == "ReduceSum" for c in moe_fwd)


# ----------------------------------------------------------------------------- multi-head latent attention


def _deepseek(exporter: str, batch: int = 2):
    return load_model(FIXTURES / f"deepseek_v3_tiny_{exporter}.onnx", ImportOptions(batch_size=batch, seq_len=16)).graph


def _weight_gemms(graph) -> list[int]:
    """Op indices of the GEMMs with a 2-D weight operand, in graph order."""
    return [op.index for op in graph.ops if op.op_type in ("MatMul", "Gemm")
            and any(graph.tensor(n) is not None and graph.tensor(n).is_weight and graph.tensor(n).rank == 2
                    for n in op.inputs[:2] if n)]


#: DeepSeek-V3's dense block (layer 0) in graph order: q_a_proj, q_b_proj, kv_a_proj_with_mqa,
#: kv_b_proj, o_proj, the MLP's gate_proj, up_proj, down_proj (both exporters write them so).
MLA_DENSE_BLOCK = ["replicated (low-rank bottleneck)", "column-parallel", "replicated (low-rank bottleneck)",
                   "column-parallel", "row-parallel", "column-parallel", "column-parallel", "row-parallel"]


@pytest.mark.parametrize("t", [2, 4])
@pytest.mark.parametrize("exporter", ["legacy", "dynamo"])
def test_mla_dense_block_is_planned_as_megatron_core(exporter, t):
    """Issue 34: DeepSeek-V3's multi-head latent attention ran out of step (q_a_proj column-parallel,
    its norm gathered, q_b/kv_b row-parallel, o_proj column-parallel, the MLP's gate/up row-parallel;
    4 all-reduces and 4 all-gathers forward in the dense block, and a row-parallel LM head reducing
    the full logits).  Megatron-Core's MLA keeps the low-rank down-projections and their norms
    whole, splits the up-projections by heads and reduces once after o_proj: with the MLP, 2
    forward all-reduces and nothing gathered; the LM head is vocabulary-parallel as for Llama."""
    graph = _deepseek(exporter)
    plan = shard_tensor_parallel(graph, t)
    gemms = _weight_gemms(graph)
    assert [plan.shards[i].rule for i in gemms[:8]] == MLA_DENSE_BLOCK
    down = gemms[7]
    forward = Counter(c.kind.value for c in plan.comms if 0 < c.op_index <= down and c.phase.value == "forward")
    assert forward == {"ALL_REDUCE": 2}, forward
    assert {c.op_index for c in plan.comms if 0 < c.op_index <= down and c.phase.value == "forward"} == {gemms[4], down}
    # backward: the input gradients of q_b_proj, kv_b_proj (the latents) and of the MLP (Megatron f)
    backward = Counter(c.kind.value for c in plan.comms if 0 < c.op_index <= down and c.phase.value == "backward")
    assert backward == {"ALL_REDUCE": 3}, backward
    # the down-projections' weights stay whole, the up-projections' are split
    for i, whole in zip(gemms[:4], (True, False, True, False)):
        w = next(n for n in graph.ops[i].inputs[:2] if graph.tensor(n).is_weight)
        assert (plan.weight_factor[w] == 1) is whole, graph.ops[i].name
    # the LM head is column-parallel over the vocabulary: Megatron's parallel cross-entropy
    # (three b*s fp32 all-reduces), never an all-reduce of the full logits
    assert plan.shards[gemms[-1]].rule == "column-parallel"
    last = [c for c in plan.comms if c.op_index == gemms[-1] and c.phase.value == "forward"]
    assert [c.reason for c in last] == [f"vocab-parallel cross-entropy: {w} (Megatron)"
                                        for w in ("max logit", "target logit", "sum of exponentials")]
    assert not [c for c in plan.comms if c.reason == "partial graph output"]
    assert not [w for w in plan.warnings if "ScatterND" in w or "gathered" in w]


@pytest.mark.parametrize("exporter", ["legacy", "dynamo"])
def test_mla_dense_block_with_sequence_parallelism(exporter):
    """With sequence parallelism the dense MLA block gathers the sequence once before the (whole)
    down-projections and once before the MLP, and reduce-scatters after o_proj and down_proj."""
    graph = _deepseek(exporter)
    plan = shard_tensor_parallel(graph, 2, sequence_parallel=True)
    down = _weight_gemms(graph)[7]
    forward = Counter(c.kind.value for c in plan.comms if 0 < c.op_index <= down and c.phase.value == "forward")
    assert forward == {"ALL_GATHER": 2, "REDUCE_SCATTER": 2}, forward


@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("exporter", ["legacy", "dynamo"])
def test_mla_parameters_per_gpu(exporter, batch):
    """DeepSeek-V3 tiny at t=2: embedding and LM head vocab-split, 2 x 64,000 / 2; per layer the MLA
    down-projections and norms whole (q_a 2,048 + kv_a 1,536 + 32 + 16 + the block's two norms 128)
    and q_b 2,048, kv_b 1,536, o_proj 4,096 halved (3,840): 7,600 x 2 layers; the dense MLP
    24,576 / 2; the MoE layer's router 256 / 2, stacked experts 24,576 / 2 (expert tensor parallel;
    they were whole), shared expert 6,144 / 2; the final norm 64:
    64,000 + 15,200 + 12,288 + 128 + 12,288 + 3,072 + 64 = 107,040."""
    graph = _deepseek(exporter, batch)
    assert _per_gpu(graph, shard_tensor_parallel(graph, 2)) == 107_040


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("exporter", ["legacy", "dynamo"])
def test_mla_reads_num_attention_heads_for_queries_and_keys(exporter, batch):
    """MLA is not grouped-query: every core has the config's 4 query and 4 KV heads (the core read 6
    KV heads off kv_b_proj's width 96 = 4 x (8 + 16) over head_dim 16), whatever the batch."""
    graph = _deepseek(exporter, batch)
    cores = find_attention(graph)
    assert len(cores) == 2
    assert {(c.q_heads, c.kv_heads, c.head_dim) for c in cores} == {(4, 4, 16)}
    assert attention_heads(graph) == (4, 4)


def _bottleneck(rank: int, norm: bool, hidden: int = 64):
    """x[b, 8, h] -> MatMul [h, rank] (-> LayerNormalization over its features) -> MatMul [rank, h]
    -> Relu -> MatMul [h, h] -> + x: a low-rank code expanded again, with or without its norm."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8, hidden])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8, hidden])
    nodes = [helper.make_node("MatMul", ["x", "down.w"], ["c"], name="down")]
    if norm:
        nodes.append(helper.make_node("LayerNormalization", ["c", "ln.w", "ln.b"], ["cn"], name="norm", axis=-1))
    nodes += [helper.make_node("MatMul", ["cn" if norm else "c", "up.w"], ["u"], name="up"),
              helper.make_node("Relu", ["u"], ["r"], name="act"),
              helper.make_node("MatMul", ["r", "out.w"], ["o"], name="out"),
              helper.make_node("Add", ["o", "x"], ["y"], name="residual")]
    inits = [weight("down.w", [hidden, rank]), weight("ln.w", [rank]), weight("ln.b", [rank]),
             weight("up.w", [rank, hidden]), weight("out.w", [hidden, hidden])]
    return load_model_proto(model(nodes, [x], [y], inits), ImportOptions(batch_size=2)).graph


@pytest.mark.parametrize("rank, norm, expected", [
    (16, True, ["replicated (low-rank bottleneck)", "column-parallel", "row-parallel"]),  # 4x narrower, normalised
    (32, True, ["replicated (low-rank bottleneck)", "column-parallel", "row-parallel"]),  # 2x narrower
    (16, False, ["column-parallel", "row-parallel", "column-parallel"]),  # no norm: a plain column/row pair
    (48, True, ["column-parallel", "column-parallel", "row-parallel"]),  # under 2x narrower: split, its norm gathers
])
def test_a_normalised_low_rank_code_stays_whole_by_its_shape_not_its_name(rank, norm, expected):
    """The bottleneck rule reads structure only (a GEMM narrowing the features at least 2x whose
    output is normalised over its features and then read by another GEMM): no DeepSeek names."""
    graph = _bottleneck(rank, norm)
    plan = shard_tensor_parallel(graph, 2)
    by_name = {op.name: sh.rule for op, sh in zip(graph.ops, plan.shards)}
    assert [by_name[n] for n in ("down", "up", "out")] == expected
    if norm and expected[0].startswith("replicated"):
        assert Counter((c.kind.value, c.phase.value) for c in plan.comms) == {("ALL_REDUCE", "forward"): 1,
                                                                            ("ALL_REDUCE", "backward"): 1}


@pytest.mark.parametrize("t", [2, 4])
def test_qwen2_moe_shared_expert_gate_stays_whole(t):
    """Qwen2-MoE scales each layer's shared expert by ``sigmoid(shared_expert_gate(x))``, a Linear
    hidden -> 1 (``transformers/models/qwen2_moe/modeling_qwen2_moe.py``: ``nn.Linear(config.hidden_size,
    1, bias=False)``).  Megatron-Core keeps that gate whole on every tensor rank
    (``megatron/core/transformer/moe/shared_experts.py``: ``gate_weight`` of shape (1, hidden), applied
    with ``F.linear`` to the full hidden states), so t=2 and t=4 are legitimate plans: the gate is
    replicated (once refused: "--t 2 does not divide the output size 1 of Gemm ...", and the sweep
    dropped every t>1 configuration), the rest of the layer still split."""
    graph = load_model(FIXTURES / "qwen2_moe_tiny_dynamo.onnx", ImportOptions(batch_size=2, seq_len=16)).graph
    plan = shard_tensor_parallel(graph, t)
    gates = [w for w in graph.weights if w.name.endswith("shared_expert_gate.weight")]
    assert len(gates) == 2
    assert all(plan.weight_factor[w.name] == 1 for w in gates)
    rules = {sh.rule for op, sh in zip(graph.ops, plan.shards) if any(n.endswith("shared_expert_gate.weight") for n in op.inputs)}
    assert rules == {"replicated (one-output gate)"}
    assert any(factor == t for factor in plan.weight_factor.values())  # the experts' and attention's weights are split
