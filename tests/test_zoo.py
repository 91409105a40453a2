"""Tests of the shape-only model zoo (dml2comm.zoo).

Expected values are computed in comments from the published formulas (Narayanan et al. SC'21
eq. 2 and 3) or are the parameter counts published for the real models (torchvision docs,
Hugging Face model cards / ``num_parameters()`` of the checkpoints).
"""

from __future__ import annotations

import ast
import copy
import inspect
import math
import time
from pathlib import Path

import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto

from dml2comm import zoo
from dml2comm.errors import ConfigError, Dml2CommError, ModelError
from dml2comm.zoo.catalog import REQUIRED

# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------

SMALL: dict[str, dict[str, object]] = {
    "gpt": dict(layers=2, hidden=64, heads=4, vocab=101, seq_len=16),
    "llama": dict(layers=2, hidden=64, heads=4, kv_heads=2, ffn_hidden=96, vocab=101, seq_len=16),
    "moe": dict(
        layers=2, hidden=64, heads=4, kv_heads=2, ffn_hidden=96, experts=3, top_k=2, vocab=101,
        seq_len=10,
    ),
    "bert": dict(layers=2, hidden=64, heads=4, vocab=101, seq_len=16, pooler=True),
    "resnet": dict(depth=18, num_classes=10, image_size=64),
    "mlp": dict(in_features=12, hidden=[32, 16], out_features=5),
}
DTYPES_BY_KIND = {k: ("fp32", "fp16", "bf16") for k in SMALL} | {"resnet": ("fp32", "fp16")}


def trainable_params(model: onnx.ModelProto) -> int:
    """Sum of dims products of all initializers except BatchNorm statistics."""
    return sum(
        math.prod(t.dims)
        for t in model.graph.initializer
        if not t.name.endswith(zoo.NON_TRAINABLE_SUFFIXES)
    )


def bind_batch(model: onnx.ModelProto, batch: int) -> onnx.ModelProto:
    """Copy with ``dim_param "batch"`` replaced by ``batch`` on inputs and outputs."""
    out = copy.deepcopy(model)
    for vi in [*out.graph.input, *out.graph.output]:
        for dim in vi.type.tensor_type.shape.dim:
            if dim.dim_param == "batch":
                dim.dim_value = batch
    return out


def inferred_shapes(model: onnx.ModelProto) -> dict[str, list[int | str | None]]:
    """Shapes of every value after strict shape inference (None: unknown dim)."""
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    g = inferred.graph
    shapes: dict[str, list[int | str | None]] = {}
    for vi in [*g.input, *g.output, *g.value_info]:
        tt = vi.type.tensor_type
        assert tt.HasField("shape"), f"{vi.name} has no inferred shape"
        shapes[vi.name] = [
            d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
            for d in tt.shape.dim
        ]
    for t in g.initializer:
        shapes[t.name] = list(t.dims)
    return shapes


def matmul_flops(model: onnx.ModelProto, batch: int = 1) -> int:
    """2*M*K*N summed over MatMul (batched) and Gemm nodes, from inferred shapes."""
    bound = bind_batch(model, batch)
    shapes = inferred_shapes(bound)
    total = 0
    for n in bound.graph.node:
        if n.op_type == "MatMul":
            k = shapes[n.input[0]][-1]
            total += 2 * math.prod(shapes[n.output[0]]) * k
        elif n.op_type == "Gemm":
            k = shapes[n.input[0]][-1]  # transA is never set by the zoo
            total += 2 * math.prod(shapes[n.output[0]]) * k
    return total


def eq2_params(L: int, h: int, V: int, s: int) -> int:
    """Narayanan et al. eq. (2): 12 L h^2 (1 + 13/(12h) + (V+s)/(12 L h))."""
    return 12 * L * h * h + 13 * L * h + (V + s) * h


def eq3_fwd_flops(L: int, h: int, V: int, s: int) -> int:
    """Forward matmul FLOPs per sample behind eq. (3): L (24 s h^2 + 4 s^2 h) + 2 s h V."""
    return L * (24 * s * h * h + 4 * s * s * h) + 2 * s * h * V


# ---------------------------------------------------------------------------------------------
# validity: checker, shape inference, conventions
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kind,dtype", [(k, d) for k in SMALL for d in DTYPES_BY_KIND[k]]
)
def test_checker_passes(kind: str, dtype: str) -> None:
    model = zoo.build(kind, **SMALL[kind], dtype=dtype)
    zoo.check(model)  # onnx.checker.check_model(full_check=True) on a saved copy
    assert model.opset_import[0].domain == "" and model.opset_import[0].version == 18
    assert model.ir_version == 10
    for t in model.graph.initializer:
        assert t.data_location == TensorProto.EXTERNAL and not t.HasField("raw_data")
        assert t.data_type == zoo._builder.DTYPES[dtype]


@pytest.mark.parametrize(
    "kind,overrides",
    [
        ("llama", dict(kv_heads=4)),  # MHA: repeat_kv is skipped
        ("llama", dict(kv_heads=1, tied_embeddings=True)),  # MQA, tied head
        ("moe", dict(experts=1, top_k=1)),  # one expert: no Split
        ("moe", dict(experts=3, top_k=3)),  # every expert takes every token
        ("gpt", dict(tied_embeddings=False, final_norm=False, ffn_hidden=40)),
        ("bert", dict(pooler=False, ffn_hidden=48, max_positions=32)),
        ("resnet", dict(depth=50, image_size=32)),
        ("resnet", dict(depth=34, image_size=1)),
        ("mlp", dict(hidden=[])),
    ],
)
def test_checker_passes_edge_cases(kind: str, overrides: dict[str, object]) -> None:
    model = zoo.build(kind, **{**SMALL[kind], **overrides})
    zoo.check(model)
    shapes = inferred_shapes(bind_batch(model, 2))
    assert all(isinstance(d, int) for n in model.graph.node for o in n.output for d in shapes[o])


@pytest.mark.parametrize(
    "preset", ["gpt3-175b", "llama2-70b", "mixtral-8x7b", "bert-large", "resnet152"]
)
def test_checker_passes_large_presets(preset: str) -> None:
    zoo.check(zoo.build_preset(preset))


def test_plain_checker_needs_the_weights_file() -> None:
    """Why zoo.check exists: the onnx 1.23 checker insists the external file is present."""
    model = zoo.build("mlp", **SMALL["mlp"])
    with pytest.raises(onnx.checker.ValidationError, match="not regular file"):
        onnx.checker.check_model(model)


def test_check_reports_broken_graph() -> None:
    model = zoo.build("mlp", **SMALL["mlp"])
    model.graph.node[0].input[0] = "no_such_value"
    with pytest.raises(ModelError, match="fails the ONNX checker"):
        zoo.check(model)


def test_external_data_is_contiguous_and_exact() -> None:
    model = zoo.build("gpt", **SMALL["gpt"], dtype="fp16")
    offset = 0
    for t in model.graph.initializer:
        ext = {e.key: e.value for e in t.external_data}
        assert ext["location"] == "gpt.weights.bin"
        assert int(ext["offset"]) == offset
        assert int(ext["length"]) == math.prod(t.dims) * 2  # fp16
        offset += int(ext["length"])


@pytest.mark.parametrize("kind", list(SMALL))
@pytest.mark.parametrize("batch", [1, 3])
def test_shape_inference_is_static_once_batch_is_bound(kind: str, batch: int) -> None:
    model = zoo.build(kind, **SMALL[kind])
    shapes = inferred_shapes(bind_batch(model, batch))
    produced = {o for n in model.graph.node for o in n.output}
    assert produced <= set(shapes)
    for name in produced:
        assert all(isinstance(d, int) and d > 0 for d in shapes[name]), (name, shapes[name])


@pytest.mark.parametrize("kind", list(SMALL))
def test_shape_inference_keeps_symbolic_batch(kind: str) -> None:
    shapes = inferred_shapes(zoo.build(kind, **SMALL[kind]))
    produced = {o for n in zoo.build(kind, **SMALL[kind]).graph.node for o in n.output}
    for name in produced:
        assert all(isinstance(d, int) or d == "batch" for d in shapes[name]), (name, shapes[name])


def test_inputs_and_outputs() -> None:
    gpt = zoo.build("gpt", **SMALL["gpt"])
    (ids,) = gpt.graph.input
    dims = ids.type.tensor_type.shape.dim
    assert ids.name == "input_ids" and ids.type.tensor_type.elem_type == TensorProto.INT64
    assert dims[0].dim_param == "batch" and dims[1].dim_value == 16
    assert [o.name for o in gpt.graph.output] == ["logits"]
    resnet = zoo.build("resnet", **SMALL["resnet"])
    assert [i.name for i in resnet.graph.input] == ["pixel_values"]
    bert = zoo.build("bert", **SMALL["bert"])
    assert [i.name for i in bert.graph.input] == ["input_ids", "attention_mask", "token_type_ids"]
    assert [o.name for o in bert.graph.output] == ["logits", "pooler_output"]
    mlp = zoo.build("mlp", **SMALL["mlp"])
    assert [i.name for i in mlp.graph.input] == ["features"]


def test_node_names_follow_legacy_exporter() -> None:
    names = {n.name for n in zoo.build("gpt", **SMALL["gpt"]).graph.node}
    for expected in (
        "/transformer/wte/Gather",
        "/transformer/h.1/attn/c_attn/MatMul",
        "/transformer/h.1/attn/c_attn/Add",
        "/transformer/h.1/attn/MatMul_1",
        "/transformer/h.1/ln_1/LayerNormalization",
        "/transformer/h.1/mlp/act/Tanh",
        "/transformer/ln_f/LayerNormalization",
        "/lm_head/Transpose",
        "/lm_head/MatMul",
    ):
        assert expected in names
    names = {n.name for n in zoo.build("llama", **SMALL["llama"]).graph.node}
    assert "/model/layers.1/self_attn/q_proj/MatMul" in names
    assert "/model/layers.1/mlp/down_proj/MatMul" in names
    names = {n.name for n in zoo.build("bert", **SMALL["bert"]).graph.node}
    assert "/bert/encoder/layer.1/attention/self/query/MatMul" in names
    names = {n.name for n in zoo.build("resnet", **SMALL["resnet"]).graph.node}
    assert {"/conv1/Conv", "/layer1/layer1.0/conv1/Conv", "/layer1/layer1.0/relu_1/Relu",
            "/layer2/layer2.0/downsample/downsample.0/Conv", "/fc/Gemm"} <= names
    names = {n.name for n in zoo.build("mlp", **SMALL["mlp"]).graph.node}
    assert {"/layers.0/linear/Gemm", "/layers.0/act/Relu", "/layers.2/linear/Gemm"} <= names


def test_initializer_names_follow_state_dict() -> None:
    gpt = {t.name: list(t.dims) for t in zoo.build("gpt", **SMALL["gpt"]).graph.initializer}
    assert gpt["transformer.h.1.attn.c_attn.weight"] == [64, 192]
    assert gpt["transformer.h.1.attn.c_attn.bias"] == [192]
    assert gpt["transformer.wte.weight"] == [101, 64]
    assert gpt["transformer.wpe.weight"] == [16, 64]
    res = {t.name for t in zoo.build("resnet", **SMALL["resnet"]).graph.initializer}
    assert {"layer2.0.downsample.1.running_mean", "layer2.0.downsample.0.weight",
            "bn1.running_var", "fc.weight"} <= res


def test_dynamo_metadata_on_every_node() -> None:
    model = zoo.build("gpt", **SMALL["gpt"])
    for n in model.graph.node:
        md = {e.key: e.value for e in n.metadata_props}
        scopes = ast.literal_eval(md["pkg.torch.onnx.name_scopes"])
        classes = ast.literal_eval(md["pkg.torch.onnx.class_hierarchy"])
        assert scopes[0] == "" and len(scopes) == len(classes)
        assert classes[-1].startswith("aten.")
        # the module path in the legacy name matches the last module scope
        module = scopes[-2] if len(scopes) > 2 else ""
        legacy = n.name.strip("/").split("/")[:-1]
        assert ".".join(legacy) == module
    qkv = next(n for n in model.graph.node if n.name == "/transformer/h.1/attn/c_attn/MatMul")
    md = {e.key: e.value for e in qkv.metadata_props}
    assert ast.literal_eval(md["pkg.torch.onnx.name_scopes"])[:-1] == [
        "", "transformer", "transformer.h.1", "transformer.h.1.attn", "transformer.h.1.attn.c_attn"
    ]
    add = next(n for n in model.graph.node if n.name == "/transformer/h.1/attn/c_attn/Add")
    same_call = {e.key: e.value for e in add.metadata_props}
    assert same_call["pkg.torch.onnx.name_scopes"] == md["pkg.torch.onnx.name_scopes"]


def test_no_large_constants() -> None:
    """Constants are shapes/scalars/inv_freq only, so no Constant node passes for a weight."""
    model = zoo.build_preset("llama2-7b")
    sizes = [
        math.prod(a.t.dims) for n in model.graph.node if n.op_type == "Constant"
        for a in n.attribute
    ]
    assert max(sizes) == 64  # inv_freq: head_dim / 2 = 128 / 2


# ---------------------------------------------------------------------------------------------
# GPT: Narayanan et al. eq. (2) and (3)
# ---------------------------------------------------------------------------------------------

GPT_SHAPES = [  # (L, h, a, V, s)
    (2, 64, 4, 101, 16),
    (12, 768, 12, 50257, 1024),
    (24, 2304, 24, 51200, 2048),
    (96, 12288, 96, 51200, 2048),
]


@pytest.mark.parametrize("L,h,a,V,s", GPT_SHAPES)
def test_gpt_params_equal_eq2_plus_final_norm(L: int, h: int, a: int, V: int, s: int) -> None:
    model = zoo.build_gpt(L, h, a, V, s)
    # e.g. 175B shape: 12*96*12288^2 + 13*96*12288 + (51200+2048)*12288 + 2*12288
    #                = 173,946,175,488 + 15,335,424 + 654,311,424 + 24,576 = 174,615,846,912
    assert trainable_params(model) == eq2_params(L, h, V, s) + 2 * h


def test_gpt_175b_exact_count() -> None:
    assert trainable_params(zoo.build_gpt(96, 12288, 96, 51200, 2048)) == 174_615_846_912


def test_gpt_variants() -> None:
    L, h, a, V, s = GPT_SHAPES[1]
    no_final_norm = zoo.build_gpt(L, h, a, V, s, final_norm=False)
    assert trainable_params(no_final_norm) == eq2_params(L, h, V, s)
    untied = zoo.build_gpt(L, h, a, V, s, tied_embeddings=False)
    assert trainable_params(untied) == eq2_params(L, h, V, s) + 2 * h + h * V
    # ffn 3h: per layer the MLP has 2*h*f + f + h instead of 8h^2 + 5h
    narrow = zoo.build_gpt(L, h, a, V, s, ffn_hidden=3 * h)
    assert trainable_params(narrow) == eq2_params(L, h, V, s) + 2 * h - L * (2 * h * h + h)
    # GPT-2 checkpoints: 1024 positions whatever s is
    assert trainable_params(zoo.build_gpt(L, h, a, V, 128, max_positions=1024)) == 124_439_808


def test_gpt_tied_head_reuses_the_embedding() -> None:
    model = zoo.build("gpt", **SMALL["gpt"])
    users = [n for n in model.graph.node if "transformer.wte.weight" in n.input]
    assert sorted(n.op_type for n in users) == ["Gather", "Transpose"]
    assert not any(list(t.dims) == [64, 101] for t in model.graph.initializer)


@pytest.mark.parametrize("L,h,a,V,s", GPT_SHAPES)
def test_gpt_matmul_flops_equal_eq3_terms(L: int, h: int, a: int, V: int, s: int) -> None:
    # (2, 64, 4, 101, 16): 2*(24*16*64^2 + 4*16^2*64) + 2*16*64*101 = 3,276,800 + 206,848
    # (96, 12288, 96, 51200, 2048): 96*(24*2048*12288^2 + 4*2048^2*12288) + 2*2048*12288*51200
    assert matmul_flops(zoo.build_gpt(L, h, a, V, s)) == eq3_fwd_flops(L, h, V, s)


def test_gpt_flops_scale_with_batch() -> None:
    model = zoo.build("gpt", **SMALL["gpt"])
    assert matmul_flops(model, batch=4) == 4 * eq3_fwd_flops(2, 64, 101, 16)


@settings(max_examples=15, deadline=None)
@given(
    L=st.integers(1, 3),
    a=st.integers(1, 4),
    d=st.integers(1, 8),
    V=st.integers(1, 64),
    s=st.integers(1, 12),
)
def test_gpt_counts_hold_for_any_shape(L: int, a: int, d: int, V: int, s: int) -> None:
    h = a * d
    model = zoo.build_gpt(L, h, a, V, s)
    assert trainable_params(model) == eq2_params(L, h, V, s) + 2 * h
    assert matmul_flops(model) == eq3_fwd_flops(L, h, V, s)


# ---------------------------------------------------------------------------------------------
# Llama / GQA
# ---------------------------------------------------------------------------------------------


def test_llama_70b_builds_fast() -> None:
    start = time.perf_counter()
    model = zoo.build_preset("llama2-70b")
    elapsed = time.perf_counter() - start
    print(f"\nllama2-70b: {len(model.graph.node)} nodes built in {elapsed:.3f} s")
    # HF meta-llama/Llama-2-70b-hf: 68,976,648,192 parameters
    # = 80*(2*8192^2 + 2*8192*1024 + 3*8192*28672 + 2*8192) + 2*32000*8192 + 8192
    assert trainable_params(model) == 68_976_648_192


def test_gqa_shapes() -> None:
    kw = SMALL["llama"]  # h=64, a=4, kv=2 -> d=16, kv*d=32
    model = zoo.build("llama", **kw)
    dims = {t.name: list(t.dims) for t in model.graph.initializer}
    assert dims["model.layers.0.self_attn.q_proj.weight"] == [64, 64]
    assert dims["model.layers.0.self_attn.k_proj.weight"] == [64, 32]
    assert dims["model.layers.0.self_attn.v_proj.weight"] == [64, 32]
    assert dims["model.layers.0.self_attn.o_proj.weight"] == [64, 64]
    assert dims["model.layers.0.mlp.gate_proj.weight"] == [64, 96]
    assert dims["model.layers.0.mlp.down_proj.weight"] == [96, 64]
    assert dims["lm_head.weight"] == [64, 101]
    assert not any(name.endswith("bias") for name in dims)
    shapes = inferred_shapes(bind_batch(model, 2))
    repeat = next(n for n in model.graph.node if n.name == "/model/layers.0/self_attn/Reshape_3")
    assert shapes[repeat.output[0]] == [2, 4, 16, 16]  # [b, a, s, d] after repeat_kv


def test_llama_flops_per_sample() -> None:
    L, h, a, kv, f, V, s = 2, 64, 4, 2, 96, 101, 16
    d = h // a
    model = zoo.build_llama(L, h, a, kv, f, V, s)
    # per layer: q,o 2*(2 s h a d); k,v 2*(2 s h kv d); scores + context 2*(2 s^2 a d);
    # MLP 3*(2 s h f)
    per_layer = 4 * s * h * a * d + 4 * s * h * kv * d + 4 * s * s * a * d + 6 * s * h * f
    assert matmul_flops(model) == L * per_layer + 2 * s * h * V


@pytest.mark.parametrize(
    "preset,expected",
    [
        ("llama2-7b", 6_738_415_616),  # HF meta-llama/Llama-2-7b-hf
        ("llama2-13b", 13_015_864_320),  # HF meta-llama/Llama-2-13b-hf
        ("llama3-8b", 8_030_261_248),  # HF meta-llama/Meta-Llama-3-8B
        ("mixtral-8x7b", 46_702_792_704),  # HF mistralai/Mixtral-8x7B-v0.1
        ("gpt2-small", 124_439_808),  # HF gpt2
        ("gpt2-xl", 1_557_611_200),  # HF gpt2-xl
        ("bert-base", 109_514_298),  # HF bert-base-uncased as BertForMaskedLM
    ],
)
def test_preset_params_match_published_checkpoints(preset: str, expected: int) -> None:
    assert trainable_params(zoo.build_preset(preset)) == expected


def test_megatron_presets_reproduce_table1_sizes() -> None:
    """Narayanan et al. Table 1 model sizes (billions, one decimal) from eq. (2) + final LN."""
    table = {"1.7b": 1.7, "3.6b": 3.6, "7.5b": 7.5, "18.4b": 18.4, "39.1b": 39.1,
             "76.1b": 76.1, "145.6b": 145.6, "310.1b": 310.1, "529.6b": 529.6, "1008b": 1008.0}
    for suffix, billions in table.items():
        params = trainable_params(zoo.build_preset(f"megatron-{suffix}"))
        assert round(params / 1e9, 1) == billions


# ---------------------------------------------------------------------------------------------
# MoE
# ---------------------------------------------------------------------------------------------


def test_moe_experts_and_routed_rows() -> None:
    kw = SMALL["moe"]  # s=10, k=2, E=3 -> C = ceil(20/3) = 7 tokens per expert per sample
    model = zoo.build("moe", **kw)
    capacity = zoo.moe_capacity(10, 2, 3)
    assert capacity == 7
    names = {t.name for t in model.graph.initializer}
    for i in range(2):
        experts = {n.split(".")[5] for n in names if f"layers.{i}.block_sparse_moe.experts." in n}
        assert experts == {"0", "1", "2"}
        assert f"model.layers.{i}.block_sparse_moe.gate.weight" in names
    dims = {t.name: list(t.dims) for t in model.graph.initializer}
    assert dims["model.layers.1.block_sparse_moe.experts.2.w1.weight"] == [64, 96]
    assert dims["model.layers.1.block_sparse_moe.experts.2.w2.weight"] == [96, 64]
    assert dims["model.layers.1.block_sparse_moe.gate.weight"] == [64, 3]
    batch = 3
    shapes = inferred_shapes(bind_batch(model, batch))
    expert_matmuls = [
        n for n in model.graph.node
        if n.op_type == "MatMul" and "/block_sparse_moe/experts." in n.name
    ]
    assert len(expert_matmuls) == 2 * 3 * 3  # layers x experts x (w1, w3, w2)
    for n in expert_matmuls:
        assert shapes[n.input[0]][:2] == [batch, capacity]
    # total expert FLOPs: E experts x C rows x 3 matmuls of h x f, i.e. about k dense MLPs
    expert_flops = sum(2 * math.prod(shapes[n.output[0]]) * shapes[n.input[0]][-1]
                       for n in expert_matmuls)
    assert expert_flops == 2 * batch * 3 * capacity * 3 * 2 * 64 * 96


def test_moe_capacity_divisible_case() -> None:
    # Mixtral preset: s=4096, k=2, E=8 -> 1024 tokens per expert
    assert zoo.moe_capacity(4096, 2, 8) == 1024
    assert zoo.moe_capacity(5, 1, 8) == 1


# ---------------------------------------------------------------------------------------------
# BERT, ResNet, MLP
# ---------------------------------------------------------------------------------------------


def test_bert_params() -> None:
    # without pooler (BertForMaskedLM): 109,514,298; the pooler adds 768^2 + 768 = 590,592
    with_pooler = zoo.build_preset("bert-base", pooler=True)
    assert trainable_params(with_pooler) == 109_514_298 + 590_592


@pytest.mark.parametrize(
    "depth,expected",
    [(18, 11_689_512), (34, 21_797_672), (50, 25_557_032), (101, 44_549_160), (152, 60_192_808)],
)
def test_resnet_params_match_torchvision(depth: int, expected: int) -> None:
    model = zoo.build_resnet(depth)
    assert trainable_params(model) == expected
    buffers = [t for t in model.graph.initializer if t.name.endswith(zoo.NON_TRAINABLE_SUFFIXES)]
    assert buffers and all(t.name.endswith(("running_mean", "running_var")) for t in buffers)


def test_resnet_fc_flops() -> None:
    model = zoo.build_resnet(18)
    shapes = inferred_shapes(bind_batch(model, 2))
    assert shapes["logits"] == [2, 1000]
    assert matmul_flops(model, batch=2) == 2 * 2 * 512 * 1000  # the only Gemm


def test_mlp_params_and_flops() -> None:
    model = zoo.build_mlp(12, [32, 16], 5)
    # (12*32+32) + (32*16+16) + (16*5+5) = 416 + 528 + 85
    assert trainable_params(model) == 1029
    assert matmul_flops(model, batch=7) == 7 * 2 * (12 * 32 + 32 * 16 + 16 * 5)
    assert trainable_params(zoo.build_mlp(4, [], 3)) == 15


# ---------------------------------------------------------------------------------------------
# save / load
# ---------------------------------------------------------------------------------------------


def test_save_writes_only_the_onnx(tmp_path: Path) -> None:
    model = zoo.build("llama", **SMALL["llama"])
    path = zoo.save(model, tmp_path / "tiny.onnx")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.onnx"]
    loaded = onnx.load(path, load_external_data=False)
    locations = {e.value for t in loaded.graph.initializer for e in t.external_data
                 if e.key == "location"}
    assert locations == {"tiny.weights.bin"}
    assert trainable_params(loaded) == trainable_params(model)
    # the model passed in is untouched
    assert {e.value for e in model.graph.initializer[0].external_data if e.key == "location"} == {
        "llama.weights.bin"
    }


# ---------------------------------------------------------------------------------------------
# API: KINDS, PRESETS, build, errors
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", list(zoo.KINDS))
def test_kinds_match_builder_signatures(kind: str) -> None:
    spec = zoo.KINDS[kind]
    sig = inspect.signature(spec.builder)
    assert [p.name for p in spec.params] == list(sig.parameters)
    for p in spec.params:
        default = sig.parameters[p.name].default
        expected = REQUIRED if default is inspect.Parameter.empty else default
        assert p.default == expected or (p.required and expected is REQUIRED), p.name
        assert p.help and p.type in (int, float, bool, str)


def test_presets_name_known_kinds_and_params() -> None:
    assert {"gpt2-small", "gpt3-175b", "llama2-7b", "llama2-70b", "llama-70b", "mixtral-8x7b",
            "bert-base", "resnet18", "resnet50"} <= set(zoo.PRESETS)
    for name, (kind, params) in zoo.PRESETS.items():
        known = {p.name for p in zoo.KINDS[kind].params}
        assert set(params) <= known, name


@pytest.mark.parametrize(
    "kind,kwargs,match",
    [
        ("gpt", dict(SMALL["gpt"], heads=5), "heads=5 does not divide hidden=64"),
        ("llama", dict(SMALL["llama"], kv_heads=3), "kv_heads=3 does not divide heads=4"),
        ("moe", dict(SMALL["moe"], top_k=4), "top_k=4 exceeds experts=3"),
        ("gpt", dict(SMALL["gpt"], layers=0), "layers=0 must be positive"),
        ("gpt", dict(SMALL["gpt"], hidden=64.0), "hidden=64.0 is not an integer"),
        ("gpt", dict(SMALL["gpt"], vocab=True), "vocab=True is not an integer"),
        ("gpt", dict(SMALL["gpt"], max_positions=8), "max_positions=8 is smaller than seq_len"),
        ("llama", dict(SMALL["llama"], hidden=60, heads=4, kv_heads=2), "head_dim"),
        ("gpt", dict(SMALL["gpt"], dtype="fp64"), "dtype='fp64'"),
        ("resnet", dict(depth=20), "depth=20"),
        ("resnet", dict(depth=18, dtype="bf16"), "dtype='bf16'"),
        ("mlp", dict(in_features=4, hidden=[8, 0], out_features=2), r"hidden\[1\]=0"),
        ("gpt", dict(SMALL["gpt"], name="a/b"), "cannot name a weights file"),
        ("gpt", dict(SMALL["gpt"], bogus=1), "no parameter 'bogus'"),
        ("gpt", dict(SMALL["gpt"], tied_embeddings="no"), "not a boolean"),
        ("gpt", dict(layers=2), "needs hidden, heads, vocab, seq_len"),
        ("transformerxl", dict(), "unknown zoo kind"),
    ],
)
def test_errors(kind: str, kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match) as info:
        zoo.build(kind, **kwargs)
    assert isinstance(info.value, Dml2CommError) and isinstance(info.value, ValueError)
    assert "\n" not in str(info.value) and ";" in str(info.value)  # one line: problem; fix


def test_unknown_preset() -> None:
    with pytest.raises(ConfigError, match="unknown zoo preset 'gpt5'"):
        zoo.build_preset("gpt5")
