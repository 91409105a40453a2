"""Exact checks of the op cost rules (dml2comm/ops/*): every expectation is computed by hand in
the comment beside it.  FLOAT tensors are 4 bytes per element, INT64 8, BOOL 1."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dml2comm.errors import ModelError, RegistryError, UnsupportedOpError
from dml2comm.ir.graph import DType, Op, Tensor
from dml2comm.ops.linalg import einsum_flops
from dml2comm.ops.registry import OpCost, cost_rule, lookup, op_cost, registered_op_types

F = DType.FLOAT
I64 = DType.INT64


def t(name: str, shape: Sequence[int], dtype: DType = F, **kw: Any) -> Tensor:
    return Tensor(name, tuple(shape), dtype, **kw)


def w(name: str, shape: Sequence[int], dtype: DType = F) -> Tensor:
    return Tensor(name, tuple(shape), dtype, is_weight=True)


def make_op(op_type: str, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor | None], domain: str = "", **attrs: Any) -> Op:
    return Op(
        index=0,
        name="n",
        op_type=op_type,
        domain=domain,
        inputs=tuple(x.name if x is not None else "" for x in inputs),
        outputs=tuple(x.name if x is not None else "" for x in outputs),
        attrs=MappingProxyType(dict(attrs)),
    )


def cost(op_type: str, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor | None], domain: str = "", **attrs: Any) -> OpCost:
    return op_cost(make_op(op_type, inputs, outputs, domain, **attrs), inputs, outputs)


# --------------------------------------------------------------------------- registry behaviour


def test_duplicate_registration_is_refused_and_leaves_registry_unchanged() -> None:
    before = lookup("MatMul")

    def other(op: Op, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor | None]) -> OpCost:
        return OpCost(0.0, 0.0, 0.0, 0.0, "other")

    with pytest.raises(RegistryError, match="MatMul"):
        cost_rule("MatMul")(other)
    assert lookup("MatMul") is before


def test_unknown_op_names_op_and_decorator() -> None:
    x, y = t("x", (2,)), t("y", (2,))
    with pytest.raises(UnsupportedOpError) as info:
        cost("FrobnicateXYZ", [x], [y])
    assert "FrobnicateXYZ" in str(info.value)
    assert "@cost_rule" in str(info.value)


def test_lenient_fallback_is_flagged() -> None:
    x, y = t("x", (2, 3)), t("y", (2, 3))
    c = op_cost(make_op("FrobnicateXYZ", [x], [y]), [x], [y], lenient=True)
    assert c.fallback is True
    assert c.flops_fwd == 0.0
    assert c.bytes_fwd == (6 + 6) * 4  # x read + y written


COMMON_OP_TYPES = """
Abs Add And ArgMax ArgMin Attention AveragePool BatchNormalization BitShift BitwiseAnd BitwiseNot
BitwiseOr BitwiseXor Cast CastLike Ceil Celu Clip Compress Concat Constant ConstantOfShape Conv
ConvTranspose Cos CumSum DepthToSpace Div Dropout Einsum Elu Equal Erf Exp Expand EyeLike Flatten
Floor Gather GatherElements GatherND Gelu Gemm GlobalAveragePool GlobalMaxPool Greater
GreaterOrEqual GroupNormalization HardSigmoid HardSwish Identity InstanceNormalization IsInf IsNaN
LayerNormalization LeakyRelu Less LessOrEqual Log LogSoftmax MatMul Max MaxPool Mean Min Mish Mod
Mul Neg NegativeLogLikelihoodLoss NonZero Not OneHot Or Pad Pow PRelu RMSNormalization Range
Reciprocal ReduceL1 ReduceL2 ReduceLogSum ReduceLogSumExp ReduceMax ReduceMean ReduceMin ReduceProd
ReduceSum ReduceSumSquare Relu Reshape Resize RotaryEmbedding Round ScatterElements ScatterND Selu
Shape Sigmoid Sign Sin Size Slice Softmax SoftmaxCrossEntropyLoss Softplus Softsign SpaceToDepth
Split Sqrt Squeeze Sub Sum Tan Tanh ThresholdedRelu Tile TopK Transpose Trilu Unsqueeze Where Xor
SwiGLU Swish TensorScatter
SimplifiedLayerNormalization SkipLayerNormalization SkipSimplifiedLayerNormalization FastGelu
BiasGelu QuickGelu BiasAdd MultiHeadAttention GroupQueryAttention
""".split()


def test_common_op_types_are_registered() -> None:
    assert len(COMMON_OP_TYPES) >= 120
    missing = sorted(set(COMMON_OP_TYPES) - set(registered_op_types()))
    assert missing == []


# --------------------------------------------------------------------------- linalg


def test_matmul_batched_times_matrix() -> None:
    a, b, y = t("a", (2, 3, 4)), w("b", (4, 5)), t("y", (2, 3, 5))
    c = cost("MatMul", [a, b], [y])
    assert c.flops_fwd == 240  # 2 * batch 2 * M 3 * K 4 * N 5
    assert c.bytes_fwd == (24 + 20 + 30) * 4  # A + B read, Y written
    assert c.flops_bwd == 480  # 2 x forward
    assert c.bytes_bwd == (30 + 2 * 24 + 2 * 20) * 4  # read dY, A, B; write dA, dB = 472
    assert c.rule == "matmul"


@pytest.mark.parametrize(
    ("a", "b", "flops"),
    [
        ((4,), (4, 5), 40),  # [1,4] x [4,5]: 2 * 1 * 4 * 5
        ((2, 3, 4), (4,), 48),  # [2,3,4] x [4,1]: 2 * 2 * 3 * 4 * 1
        ((4,), (4,), 8),  # dot product: 2 * 4
        ((2, 1, 3, 4), (5, 4, 6), 1440),  # batch broadcast [2,1] x [5] -> 10: 2 * 10 * 3 * 4 * 6
    ],
)
def test_matmul_numpy_rules(a: tuple[int, ...], b: tuple[int, ...], flops: int) -> None:
    assert cost("MatMul", [t("a", a), t("b", b)], [None]).flops_fwd == flops


def test_matmul_inner_mismatch_is_a_model_error() -> None:
    with pytest.raises(ModelError):
        cost("MatMul", [t("a", (2, 3)), t("b", (4, 5))], [t("y", (2, 5))])


def test_gemm_trans_b_with_bias() -> None:
    a, b, bias, y = t("a", (8, 16)), w("b", (32, 16)), w("c", (32,)), t("y", (8, 32))
    c = cost("Gemm", [a, b, bias], [y], transB=1)
    assert c.flops_fwd == 2 * 8 * 16 * 32 + 8 * 32  # 8192 + 256 = 8448
    assert c.bytes_fwd == (128 + 512 + 32 + 256) * 4  # 3712
    assert c.flops_bwd == 2 * 8448
    assert c.bytes_bwd == (256 + 2 * (128 + 512) + 32) * 4  # dY, A, B read; dA, dB, dC written = 6272


def test_gemm_trans_a_alpha_without_bias() -> None:
    a, b = t("a", (16, 8)), w("b", (16, 32))
    c = cost("Gemm", [a, b], [t("y", (8, 32))], transA=1, alpha=0.5)
    assert c.flops_fwd == 2 * 8 * 16 * 32 + 8 * 32  # M=8, K=16, N=32; alpha multiply: 8448


def test_einsum_attention_scores() -> None:
    q, k, y = t("q", (2, 3, 4, 8)), t("k", (2, 3, 5, 8)), t("y", (2, 3, 4, 5))
    c = cost("Einsum", [q, k], [y], equation="bhqd,bhkd->bhqk")
    assert c.flops_fwd == 2 * 2 * 3 * 4 * 5 * 8  # 2 x b h q k d = 1920
    assert c.flops_bwd == 2 * 1920
    assert c.bytes_fwd == (192 + 240 + 120) * 4


@pytest.mark.parametrize(
    ("equation", "shapes", "flops"),
    [
        ("ij,jk", [(2, 3), (3, 4)], 48),  # implicit output "ik": 2 * 2 * 3 * 4
        ("...ij,...jk->...ik", [(5, 2, 3), (5, 3, 4)], 240),  # 2 * 5 * 2 * 3 * 4
        ("...ij,jk->...ik", [(5, 2, 3), (3, 4)], 240),  # ellipsis on one operand only
        ("ij,ij->ij", [(3, 4), (3, 4)], 12),  # Hadamard: multiplies only, 3 * 4
        ("ij->i", [(3, 4)], 9),  # row sums: 12 - 3 adds
        ("ij->ji", [(3, 4)], 0),  # pure permutation
        ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)], 128),  # (ij,jk->ik) 2*2*3*4=48 + (ik,kl->il) 2*2*4*5=80
        ("b i d, b j d -> b i j", [(2, 4, 8), (2, 6, 8)], 768),  # spaces ignored: 2 * 2 * 4 * 6 * 8
    ],
)
def test_einsum_equations(equation: str, shapes: list[tuple[int, ...]], flops: int) -> None:
    assert einsum_flops(equation, shapes) == flops


def test_einsum_bad_equation() -> None:
    with pytest.raises(ModelError):
        einsum_flops("ij,jk->ik", [(2, 3, 1), (3, 4)])


@settings(max_examples=40, deadline=None)
@given(
    batch=st.lists(st.integers(1, 4), max_size=2),
    m=st.integers(1, 6),
    k=st.integers(1, 6),
    n=st.integers(1, 6),
)
def test_einsum_matches_matmul(batch: list[int], m: int, k: int, n: int) -> None:
    a, b = (*batch, m, k), (*batch, k, n)
    mm = cost("MatMul", [t("a", a), t("b", b)], [None]).flops_fwd
    assert einsum_flops("...mk,...kn->...mn", [a, b]) == mm
    assert mm == 2 * m * k * n * (batch[0] if batch else 1) * (batch[1] if len(batch) > 1 else 1)


def test_onnx_attention_gqa_causal_4d() -> None:
    q, k, v = t("q", (2, 8, 16, 64)), t("k", (2, 2, 16, 64)), t("v", (2, 2, 16, 64))
    y = t("y", (2, 8, 16, 64))
    c = cost("Attention", [q, k, v], [y], is_causal=1)
    # scores n = 2*8*16*16 = 4096, rows = 2*8*16 = 256
    # QK^T 2*4096*64 + PV 2*4096*64 = 1048576; softmax 5*4096 - 2*256 = 19968; scale + causal 2*4096 = 8192
    assert c.flops_fwd == 1048576 + 19968 + 8192
    assert c.flops_bwd == 2 * c.flops_fwd
    assert c.bytes_fwd == (16384 + 4096 + 4096 + 16384) * 4  # Q, K, V read; Y written
    assert c.bytes_bwd == (2 * (16384 + 4096 + 4096) + 2 * 16384) * 4  # Q,K,V,Y,dY read; dQ,dK,dV written


def test_onnx_attention_3d_matches_4d() -> None:
    q, k, v = t("q", (2, 16, 512)), t("k", (2, 16, 128)), t("v", (2, 16, 128))
    c = cost("Attention", [q, k, v], [t("y", (2, 16, 512))], is_causal=1, q_num_heads=8, kv_num_heads=2)
    assert c.flops_fwd == 1048576 + 19968 + 8192  # same problem as the 4-D test


def test_microsoft_attention_adds_projection() -> None:
    x, wq, b = t("x", (2, 16, 64)), w("w", (64, 192)), w("b", (192,))
    c = cost("Attention", [x, wq, b], [t("y", (2, 16, 64))], domain="com.microsoft", num_heads=4)
    # projection 2*2*16*64*192 = 786432 + bias 2*16*192 = 6144
    # core: b=2, h=4, s=16, d=16: scores 2048; 2*2048*16*2 = 131072; softmax 5*2048 - 2*128 = 9984; scale 2048
    assert c.flops_fwd == 786432 + 6144 + 131072 + 9984 + 2048


def test_microsoft_multi_head_attention() -> None:
    q, k, v = t("q", (2, 16, 64)), t("k", (2, 16, 64)), t("v", (2, 16, 64))
    c = cost("MultiHeadAttention", [q, k, v], [t("y", (2, 16, 64))], domain="com.microsoft", num_heads=4)
    # b=2, N=4, s=16, d=16: scores 2048; 2*2048*16*2 = 131072; softmax 5*2048 - 2*128 = 9984; scale 2048
    assert c.flops_fwd == 131072 + 9984 + 2048


def test_microsoft_group_query_attention_with_rotary() -> None:
    q, k, v = t("q", (2, 16, 64)), t("k", (2, 16, 32)), t("v", (2, 16, 32))
    cos, sin = t("cos", (16, 8)), t("sin", (16, 8))
    ins = [q, k, v, None, None, t("seqlens", (2,), DType.INT32), t("total", (), DType.INT32), cos, sin]
    c = cost("GroupQueryAttention", ins, [t("y", (2, 16, 64))], domain="com.microsoft", num_heads=4, kv_num_heads=2, do_rotary=1)
    # as above with causal mask: 131072 + 9984 + 2*2048; rotary 3 * (2*16 tokens) * (4+2 heads) * 16 = 9216
    assert c.flops_fwd == 131072 + 9984 + 4096 + 9216


def test_microsoft_rotary_embedding_input_order() -> None:
    x, pos = t("x", (2, 16, 64)), t("pos", (2, 16), I64, is_input=True)
    cos, sin = t("cos", (32, 4)), t("sin", (32, 4))
    c = cost("RotaryEmbedding", [x, pos, cos, sin], [t("y", (2, 16, 64))], domain="com.microsoft", num_heads=4)
    # head 64/4 = 16, rotated width 2*4 = 8: 2048/16*8 = 1024 rotated elements x 3
    assert c.flops_fwd == 3072
    assert c.bytes_fwd == 8192 + (32 * 8 * 4 + 32 * 8) + 8192  # X, cos/sin for 32 tokens + pos, Y


def test_swiglu() -> None:
    a, b, y = t("a", (4, 8)), t("b", (4, 8)), t("y", (4, 8))
    c = cost("SwiGLU", [a, b], [y])
    assert c.flops_fwd == 7 * 32  # alpha a, sigmoid (4), a s, * b
    assert c.flops_bwd == (6 + 7) * 32


# --------------------------------------------------------------------------- conv and pooling


@pytest.mark.parametrize("with_output", [True, False])
def test_conv_3x3_stride2_groups(with_output: bool) -> None:
    x, wt, bias = t("x", (2, 8, 16, 16)), w("w", (16, 4, 3, 3)), w("b", (16,))
    y = t("y", (2, 16, 8, 8)) if with_output else None  # out = floor((16 + 2 - 3) / 2) + 1 = 8
    c = cost("Conv", [x, wt, bias], [y], group=2, strides=(2, 2), pads=(1, 1, 1, 1), kernel_shape=(3, 3))
    # positions N*Cout*out = 2*16*64 = 2048; 2 * 2048 * (Cin/g = 4) * 9 + bias 2048
    assert c.flops_fwd == 147456 + 2048
    assert c.flops_bwd == 2 * 149504
    if with_output:
        assert c.bytes_fwd == (4096 + 576 + 16 + 2048) * 4  # X, W, B read; Y written
        assert c.bytes_bwd == (2048 + 2 * (4096 + 576) + 16) * 4  # dY, X, W read; dX, dW, dB written


def test_conv_transpose_stride2() -> None:
    x, wt, bias = t("x", (1, 4, 5, 5)), w("w", (4, 3, 2, 2)), w("b", (3,))
    c = cost("ConvTranspose", [x, wt, bias], [None], strides=(2, 2))
    # 2 * N*Cin*in (1*4*25) * (Cout/g = 3) * 4 = 2400; out = 2*(5-1) + 2 = 10: bias 1*3*100 = 300
    assert c.flops_fwd == 2400 + 300


def test_max_pool_counts_saved_indices() -> None:
    x, y = t("x", (1, 2, 4, 4)), t("y", (1, 2, 2, 2))
    c = cost("MaxPool", [x], [y], kernel_shape=(2, 2), strides=(2, 2))
    assert c.flops_fwd == 8 * 3  # 8 outputs x (4 - 1) comparisons
    assert c.bytes_fwd == (32 + 8) * 4 + 8 * 8  # X read, Y written, int64 indices written = 224
    assert c.flops_bwd == 8  # scatter-add of dY
    assert c.bytes_bwd == 8 * 4 + 8 * 8 + 32 * 4  # dY + indices read, dX written = 224


def test_global_average_pool() -> None:
    x, y = t("x", (2, 4, 3, 3)), t("y", (2, 4, 1, 1))
    c = cost("GlobalAveragePool", [x], [y])
    assert c.flops_fwd == 72  # 8 rows x (8 adds + 1 divide)
    assert c.bytes_bwd == (8 + 72) * 4  # dY read, dX written


# --------------------------------------------------------------------------- norms and softmax


def test_layer_norm() -> None:
    x, s, b, y = t("x", (2, 4, 8)), w("s", (8,)), w("b", (8,)), t("y", (2, 4, 8))
    c = cost("LayerNormalization", [x, s, b], [y], axis=-1)
    assert c.flops_fwd == 7 * 64 + 3 * 8  # n = 64, rows = 8: 472
    assert c.flops_bwd == 2 * 472
    assert c.bytes_fwd == (64 + 8 + 8 + 64) * 4
    assert c.bytes_bwd == (64 + 64 + 8 + 64 + 8 + 8) * 4  # dY, X, Scale read; dX, dScale, dB written


def test_layer_norm_without_bias_and_axis() -> None:
    x, s = t("x", (2, 4, 8)), w("s", (4, 8))
    c = cost("LayerNormalization", [x, s], [t("y", (2, 4, 8))], axis=1)
    assert c.flops_fwd == 6 * 64 + 3 * 2  # rows = 2: 390


def test_rms_norm() -> None:
    x, s = t("x", (2, 4, 8)), w("s", (8,))
    assert cost("RMSNormalization", [x, s], [t("y", (2, 4, 8))]).flops_fwd == 4 * 64 + 2 * 8  # 272
    assert cost("SimplifiedLayerNormalization", [x, s], [t("y", (2, 4, 8))]).flops_fwd == 272


def test_skip_layer_norm() -> None:
    x, skip, g, beta, bias = t("x", (2, 4, 8)), t("s", (2, 4, 8)), w("g", (8,)), w("be", (8,)), w("bi", (8,))
    c = cost("SkipLayerNormalization", [x, skip, g, beta, bias], [t("y", (2, 4, 8))], domain="com.microsoft")
    assert c.flops_fwd == 2 * 64 + 7 * 64 + 3 * 8  # skip + bias adds, then LayerNorm: 600


def test_batch_norm_training() -> None:
    x, y = t("x", (2, 3, 4, 4)), t("y", (2, 3, 4, 4))
    params = [w(name, (3,)) for name in ("s", "b", "m", "v")]
    c = cost("BatchNormalization", [x, *params], [y])
    assert c.flops_fwd == 7 * 96 + 3 * 3 + 6 * 3  # n = 96, C = 3: 699
    assert c.flops_bwd == 2 * (7 * 96 + 3 * 3)  # 1362


def test_group_norm() -> None:
    x, s, b = t("x", (2, 8, 4)), w("s", (8,)), w("b", (8,))
    assert cost("GroupNormalization", [x, s, b], [t("y", (2, 8, 4))], num_groups=4).flops_fwd == 7 * 64 + 3 * 8


def test_softmax_last_axis() -> None:
    x, y = t("x", (2, 3, 10)), t("y", (2, 3, 10))
    c = cost("Softmax", [x], [y], axis=-1)
    assert c.flops_fwd == 5 * 60 - 2 * 6  # n = 60, rows = 6: 288
    assert c.flops_bwd == 4 * 60 - 6  # 234
    assert c.bytes_fwd == (60 + 60) * 4
    assert c.bytes_bwd == (60 + 60 + 60) * 4  # dY, Y read; dX written


def test_softmax_middle_axis_and_log_softmax() -> None:
    x, y = t("x", (2, 3, 10)), t("y", (2, 3, 10))
    assert cost("Softmax", [x], [y], axis=1).flops_fwd == 5 * 60 - 2 * 20  # rows = 60 / 3 = 20: 260
    assert cost("LogSoftmax", [x], [y]).flops_fwd == 5 * 60 - 6  # 294


# --------------------------------------------------------------------------- element-wise


def test_add_with_broadcast_bias() -> None:
    a, b, y = t("a", (2, 3)), w("b", (3,)), t("y", (2, 3))
    c = cost("Add", [a, b], [y])
    assert c.flops_fwd == 6
    assert c.bytes_fwd == (6 + 3 + 6) * 4
    assert c.flops_bwd == 6 - 3  # dB summed over the broadcast rows: 3 adds
    assert c.bytes_bwd == (6 + 6 + 3) * 4  # dY read; dA, dB written


def test_mul_by_scalar_constant_has_one_gradient() -> None:
    x, s, y = t("x", (4, 4)), t("s", ()), t("y", (4, 4))
    c = cost("Mul", [x, s], [y])
    assert c.flops_fwd == 16
    assert c.flops_bwd == 16  # dX = dY * s only; the scalar literal gets no gradient
    assert c.bytes_bwd == (16 + 16 + 1 + 16) * 4  # dY, X, s read; dX written


@pytest.mark.parametrize(
    ("op_type", "attrs", "fwd", "bwd"),
    [
        ("Relu", {}, 1, 2),
        ("Sigmoid", {}, 4, 3),
        ("Tanh", {}, 1, 3),
        ("Gelu", {}, 5, 11),
        ("Gelu", {"approximate": "tanh"}, 9, 18),
        ("Erf", {}, 1, 5),
        ("Exp", {}, 1, 1),
        ("Neg", {}, 1, 1),
        ("Floor", {}, 1, 0),
    ],
)
def test_unary_per_element_counts(op_type: str, attrs: dict[str, Any], fwd: int, bwd: int) -> None:
    x, y = t("x", (10,)), t("y", (10,))
    c = cost(op_type, [x], [y], **attrs)
    assert c.flops_fwd == 10 * fwd
    assert c.flops_bwd == 10 * bwd


def test_comparison_on_integers_has_no_backward() -> None:
    a, b, y = t("a", (5,), I64), t("b", (5,), I64), t("y", (5,), DType.BOOL)
    c = cost("Equal", [a, b], [y])
    assert (c.flops_fwd, c.bytes_fwd, c.flops_bwd, c.bytes_bwd) == (5, 5 * 8 + 5 * 8 + 5, 0, 0)


def test_where_reads_condition_in_backward() -> None:
    cond, x, other, y = t("c", (4,), DType.BOOL), t("x", (4,)), t("o", (4,)), t("y", (4,))
    c = cost("Where", [cond, x, other], [y])
    assert c.flops_fwd == 4
    assert c.flops_bwd == 8  # one select per gradient
    assert c.bytes_bwd == 16 + 4 + 16 + 16  # dY + cond read; dX, dOther written


def test_clip_with_one_bound() -> None:
    x, lo, y = t("x", (8,)), t("lo", ()), t("y", (8,))
    c = cost("Clip", [x, lo, None], [y])
    assert c.flops_fwd == 8  # one max per element
    assert c.flops_bwd == 16  # compare + select


def test_variadic_max_and_mean() -> None:
    xs = [t(f"x{i}", (6,)) for i in range(3)]
    assert cost("Max", xs, [t("y", (6,))]).flops_fwd == 6 * 2  # n - 1 = 2 per element
    assert cost("Mean", xs, [t("y", (6,))]).flops_fwd == 6 * 3  # 2 adds + 1 divide


def test_cast_and_dropout_are_memory_bound() -> None:
    x, y = t("x", (10,)), t("y", (10,), DType.FLOAT16)
    c = cost("Cast", [x], [y], to=10)
    assert (c.flops_fwd, c.bytes_fwd, c.bytes_bwd) == (0, 40 + 20, 20 + 40)
    d = cost("Dropout", [x], [t("z", (10,))])
    assert d.bytes_fwd == 40 + 40 + 10  # X read, Y written, 1-byte mask written
    assert d.bytes_bwd == 40 + 10 + 40  # dY, mask read; dX written


def test_rotary_embedding_full_rotation() -> None:
    x, cos, sin = t("x", (2, 4, 16, 64)), t("cos", (16, 32)), t("sin", (16, 32))
    c = cost("RotaryEmbedding", [x, cos, sin], [t("y", (2, 4, 16, 64))])
    assert c.flops_fwd == 3 * 8192  # 2*4*16*64 elements, all rotated
    assert c.bytes_fwd == 32768 + (2 * 16) * 64 * 4 + 32768  # X, 32 tokens x (32 cos + 32 sin), Y


# --------------------------------------------------------------------------- reductions


def test_reduce_mean_and_sum() -> None:
    x, y = t("x", (4, 8)), t("y", (4, 1))
    mean = cost("ReduceMean", [x], [y], axes=(1,))
    assert mean.flops_fwd == 32  # 28 adds + 4 divides
    assert mean.flops_bwd == 32
    assert mean.bytes_bwd == (4 + 32) * 4  # dY read, dX written
    assert cost("ReduceSum", [x, t("axes", (1,), I64)], [y]).flops_fwd == 28
    assert cost("ReduceSum", [x, t("axes", (1,), I64)], [y]).bytes_fwd == (32 + 4) * 4 + 8


@pytest.mark.parametrize(("k", "flops"), [(1, 48), (2, 48), (4, 96), (8, 144)])
def test_topk_heap_comparisons(k: int, flops: int) -> None:
    x = t("x", (6, 8))
    values, indices = t("v", (6, k)), t("i", (6, k), I64)
    assert cost("TopK", [x, t("k", (1,), I64)], [values, indices]).flops_fwd == flops  # 48 * max(1, ceil(log2 k))


# --------------------------------------------------------------------------- movement


def test_gather_embedding_reads_rows_not_table() -> None:
    table, ids, y = w("emb", (1000, 16)), t("ids", (2, 5), I64, is_input=True), t("y", (2, 5, 16))
    c = cost("Gather", [table, ids], [y], axis=0)
    assert c.flops_fwd == 0
    assert c.bytes_fwd == 2 * 160 * 4 + 10 * 8  # 160 gathered elements read + written, ids read = 1360
    assert c.flops_bwd == 160  # scatter-add of the output-sized gradient
    # the whole table's gradient zero-filled (1000 x 16), dY + ids read, 160 rows written, and the
    # 160 fp32 partial sums of embedding_dense_backward written and read
    assert c.bytes_bwd == 1000 * 16 * 4 + 2 * 160 * 4 + 10 * 8 + 2 * 160 * 4


def test_gather_of_activations_zero_fills_the_input_gradient() -> None:
    # index_select/gather backward: zeros_like(x).index_add_(...) -- a fill of x, no partial sums
    x, idx, y = t("x", (4, 50, 8)), t("i", (3,), I64), t("y", (4, 3, 8))
    c = cost("Gather", [x, idx], [y], axis=1)
    assert c.bytes_bwd == 4 * 50 * 8 * 4 + 2 * 96 * 4 + 3 * 8


def test_gather_on_shapes_has_no_backward() -> None:
    shape, idx, y = t("s", (3,), I64), t("i", (), I64), t("y", (), I64)
    c = cost("Gather", [shape, idx], [y])
    assert (c.bytes_fwd, c.flops_bwd, c.bytes_bwd) == (8 + 8 + 8, 0, 0)


@pytest.mark.parametrize("op_type", ["Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Shape", "Size", "Constant"])
def test_views_are_free(op_type: str) -> None:
    x, shape, y = t("x", (4, 6)), t("shape", (2,), I64), t("y", (6, 4))
    c = cost(op_type, [x, shape], [y])
    assert (c.flops_fwd, c.bytes_fwd, c.flops_bwd, c.bytes_bwd) == (0, 0, 0, 0)


def test_transpose_and_concat() -> None:
    x, y = t("x", (4, 6)), t("y", (6, 4))
    c = cost("Transpose", [x], [y], perm=(1, 0))
    assert (c.bytes_fwd, c.bytes_bwd) == (48 * 4, 48 * 4)
    a, b, z = t("a", (2, 3)), t("b", (2, 5)), t("z", (2, 8))
    assert cost("Concat", [a, b], [z], axis=1).bytes_fwd == (6 + 10 + 16) * 4


def test_transpose_of_a_weight_is_a_view() -> None:
    table, y = w("emb", (100, 16)), t("y", (16, 100))
    c = cost("Transpose", [table], [y], perm=(1, 0))
    assert (c.flops_fwd, c.bytes_fwd, c.flops_bwd, c.bytes_bwd) == (0, 0, 0, 0)


def test_slice_reads_only_the_slice() -> None:
    x, y = t("x", (4, 8)), t("y", (4, 2))
    starts, ends = t("st", (1,), I64), t("en", (1,), I64)
    c = cost("Slice", [x, starts, ends], [y])
    assert c.bytes_fwd == 2 * 8 * 4 + 16  # 8 elements read and written, starts/ends read
    assert c.bytes_bwd == (8 + 32) * 4  # dY read, full dX written


def test_expand_backward_reduces() -> None:
    x, shape, y = t("x", (1, 8)), t("s", (2,), I64), t("y", (4, 8))
    c = cost("Expand", [x, shape], [y])
    assert c.flops_bwd == 32 - 8  # 24 adds back to [1, 8]


def test_scatter_nd_add() -> None:
    data, idx, upd, y = t("d", (10, 4)), t("i", (3, 1), I64), t("u", (3, 4)), t("y", (10, 4))
    c = cost("ScatterND", [data, idx, upd], [y], reduction="add")
    assert c.flops_fwd == 12  # one add per update element
    assert c.bytes_fwd == (40 + 12 + 40) * 4 + 24  # data, updates read, output written, indices read
    assert c.bytes_bwd == (40 + 40) * 4 + 24 + 2 * 12 * 4 + 24  # d_data: dY, idx, write; d_updates: gather


def test_resize_bilinear() -> None:
    x, y = t("x", (1, 1, 2, 2)), t("y", (1, 1, 4, 4))
    c = cost("Resize", [x, None, t("scales", (4,))], [y], mode="linear")
    assert c.flops_fwd == 2 * 2**2 * 16  # 2 resized axes: 4 taps x 2 FLOPs x 16 outputs = 128


def test_range_and_nonzero() -> None:
    s = [t(n, (), I64) for n in ("start", "limit", "delta")]
    assert cost("Range", s, [t("y", (7,), I64)]).flops_fwd == 14  # 7 multiply-adds
    x = t("x", (3, 4))
    nz = cost("NonZero", [x], [t("y", (2, 5), I64)])
    assert (nz.flops_fwd, nz.bytes_fwd) == (12, 12 * 4 + 10 * 8)


# --------------------------------------------------------------------------- losses and defensiveness


def test_softmax_cross_entropy_mean() -> None:
    scores, labels, loss = t("s", (4, 10)), t("l", (4,), I64, is_input=True), t("loss", ())
    c = cost("SoftmaxCrossEntropyLoss", [scores, labels], [loss], reduction="mean")
    # log-softmax 5*40 - 4 = 196; negate 4; mean 3 adds + 1 divide = 4
    assert c.flops_fwd == 196 + 4 + 4
    assert c.flops_bwd == 2 * 40 + 4


def test_missing_required_input_is_a_model_error() -> None:
    with pytest.raises(ModelError, match="LayerNormalization"):
        cost("LayerNormalization", [None], [t("y", (2, 3))])


# --------------------------------------------------------------------------- a real export


@pytest.mark.parametrize("exporter", ["legacy", "dynamo"])
def test_gpt2_export_matmul_flops_match_narayanan(exporter: str) -> None:
    """GPT-2 small (12 layers, h 768, V 50257) traced at B 2, s 16, from both exporters.

    Narayanan et al. 2021 eq. (3)'s forward count, 24 B s h^2 L + 4 B s^2 h L + 2 B s h V, counts
    the products only; the four Gemm biases per layer (3h + h + 4h + h outputs per token) add
    9 B s h L.  24*2*16*768^2*12 + 4*2*16^2*768*12 + 2*2*16*768*50257 + 9*2*16*768*12
    = 5435817984 + 18874368 + 2470232064 + 2654208 = 7927578624.
    """
    from pathlib import Path

    from dml2comm.ir.onnx_import import ImportOptions
    from dml2comm.load import load_model

    path = Path(__file__).parent / "fixtures" / f"gpt2_{exporter}.onnx"
    graph = load_model(path, ImportOptions(batch_size=2, seq_len=16)).graph
    costs = [op_cost(op, graph.op_inputs(op), graph.op_outputs(op)) for op in graph.ops]
    matmul_like = sum(c.flops_fwd for c in costs if c.rule in ("matmul", "gemm"))
    assert matmul_like == 7927578624


def test_megatron_fused_softmax_runs_only_where_its_kernel_is_available():
    """Megatron-LM's FusedScaleMaskSoftmax.is_kernel_available: 16-bit input, 16 < sk <= 16384,
    sq and sk multiples of 4, attention batches (b x heads per tensor rank) a multiple of 4 and of
    the kernel's batches per block (4 at sk = 1024, 8 at sk <= 128; causal when sq == sk)."""
    from dml2comm.cost.ops import softmax_kernel_available
    from dml2comm.ir.graph import DType

    bf16 = DType.BFLOAT16
    assert softmax_kernel_available((1, 4, 1024, 1024), bf16)  # vTrain t=4 b=1 (16 heads): 4 batches
    assert not softmax_kernel_available((1, 2, 1024, 1024), bf16)  # t=8 b=1: 2 batches -> unfused
    assert softmax_kernel_available((2, 2, 1024, 1024), bf16)  # t=8 b=2: 4
    assert softmax_kernel_available((8, 1024, 1024), bf16)  # dynamo's merged batch x heads axis
    assert not softmax_kernel_available((1, 6, 1024, 1024), bf16)  # GPT-2 small at t=2, b=1: 6 batches
    assert softmax_kernel_available((4, 16, 128, 128), bf16) and not softmax_kernel_available((1, 4, 128, 128), bf16)  # 8 per block
    assert not softmax_kernel_available((1, 4, 1024, 1024), DType.FLOAT)  # fp32 training: never
    assert not softmax_kernel_available((1, 4, 16, 16), bf16)  # sk must exceed 16


def test_an_unavailable_fused_softmax_costs_its_ops_as_separate_kernels():
    from dml2comm import zoo
    from dml2comm.cost.cache import tensor_parallel_of
    from dml2comm.cost.ops import fused_kernels, shard_op_costs, unfused_softmax_ops
    from dml2comm.hardware.cluster import get_cluster
    from dml2comm.ir.graph import DType
    from dml2comm.ir.onnx_import import ImportOptions
    from dml2comm.load import load_model_proto

    graph = load_model_proto(zoo.build_gpt(layers=2, hidden=256, heads=8, vocab=512, seq_len=1024), ImportOptions(batch_size=1)).graph
    gpu = get_cluster("dgx-a100", 8).gpu
    softmax = [op.index for op in graph.ops if op.op_type == "Softmax"]
    # t = 2: 4 heads x b = 1 = 4 attention batches: fused; t = 4: 2 batches: not
    assert not unfused_softmax_ops(graph, tensor_parallel_of(graph, 2, False, 2), DType.BFLOAT16)
    unfused = unfused_softmax_ops(graph, tensor_parallel_of(graph, 4, False, 2), DType.BFLOAT16)
    regions = fused_kernels(graph)
    assert all(i in unfused for i in softmax) and all(i in unfused for i in regions if regions[i] in {regions[s] for s in softmax})
    from dml2comm.cost import host

    fused = shard_op_costs(graph, 2, False, "bf16", gpu, False, host.NONE).times  # kernel time only
    apart = shard_op_costs(graph, 4, False, "bf16", gpu, False, host.NONE).times
    # the softmax region at t = 4 reads and writes every intermediate: more than half the t = 2
    # region's time although it works on half the heads
    region_t2 = sum(fused[i][0] for i in regions if regions[i] == regions[softmax[0]])
    region_t4 = sum(apart[i][0] for i in regions if regions[i] == regions[softmax[0]])
    assert region_t4 > 0.5 * region_t2


def test_sequence_parallel_bias_dropout_add_reads_the_reduce_scattered_slice():
    """With sequence parallelism the row-parallel GEMM writes the full partial sum, and the
    bias-dropout-add after its reduce-scatter reads 1/t of it: the fused region is timed at the
    sizes its own ops see (it was timed reading the GEMM's full output, 8x too much at t = 8)."""
    from dml2comm import zoo
    from dml2comm.cost import host
    from dml2comm.cost.ops import fused_kernels, shard_op_costs
    from dml2comm.hardware.cluster import get_cluster
    from dml2comm.ir.onnx_import import ImportOptions
    from dml2comm.load import load_model_proto

    graph = load_model_proto(zoo.build_gpt(layers=1, hidden=1024, heads=8, vocab=512, seq_len=1024),
                             ImportOptions(batch_size=4)).graph
    gpu = get_cluster("dgx-a100", 8).gpu
    regions = fused_kernels(graph)
    proj = next(op.index for op in graph.ops if op.op_type == "MatMul" and op.name.endswith("attn/c_proj/MatMul"))
    bias = next(c for c in graph.consumers(graph.ops[proj].outputs[0]))
    bda = [i for i in regions if regions[i] == regions[bias]]
    assert {graph.ops[i].op_type for i in bda} >= {"Add", "Dropout"}
    plain = shard_op_costs(graph, 8, False, "bf16", gpu, False, host.NONE).times  # kernel time only
    sp = shard_op_costs(graph, 8, True, "bf16", gpu, False, host.NONE).times
    t_plain, t_sp = (sum(times[i][0] for i in bda) for times in (plain, sp))
    assert t_sp == pytest.approx(t_plain / 8, rel=0.15)  # the memory-bound region on 1/t of the tokens


def test_the_optimizer_step_names_its_passes():
    """Adam, bf16: update 2 (gradient) + 12 (fp32 master, momentum, variance read) + 12 (written)
    + 2 (16-bit copy) = 28 bytes per updated parameter, + 4 for the gradient-norm pass = 32; fp16
    with loss scaling adds the unscale pass's 8 (read and write the fp32 main gradient) = 40."""
    from dml2comm.cost.compute import GRAD_NORM_BYTES_PER_PARAM, UNSCALE_BYTES_PER_PARAM, optimizer_step_s

    assert (GRAD_NORM_BYTES_PER_PARAM, UNSCALE_BYTES_PER_PARAM) == (4, 8)
    assert optimizer_step_s(1e9, "adam", 2, 2e12) == pytest.approx(1e9 * 32 / 2e12)
    assert optimizer_step_s(1e9, "adam", 2, 2e12, loss_scaled=True) == pytest.approx(1e9 * 40 / 2e12)
    assert optimizer_step_s(1e9, "sgd", 4, 2e12) == pytest.approx(1e9 * (4 + 8 + 8 + 4) / 2e12)  # fp32: no copy
