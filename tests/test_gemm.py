"""The shape-aware GEMM model (dml2comm/cost/gemm.py): table, analytical law, training shapes."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dml2comm.cost import gemm
from dml2comm.errors import ConfigError, ModelError
from dml2comm.hardware.gpus import GPU, get_gpu

H100 = get_gpu("h100")
A100 = get_gpu("a100")
TABLES = [(H100, "bf16"), (H100, "tf32"), (gemm.B200, "bf16"), (gemm.B200, "tf32"), (gemm.B200, "fp8")]


# ------------------------------------------------------------------------------ measured table


@pytest.mark.parametrize(("device", "dtype"), TABLES, ids=lambda v: getattr(v, "name", v))
def test_reproduces_the_measured_points_inside_the_grid(device, dtype) -> None:
    table = gemm.measured_table(gemm.gemm_device(device).name, dtype)
    assert len(table.nodes) == 375  # b in {1,2,4} x M, N, K in {256..4096}: 3 x 5^3
    for x, node in table.nodes.items():
        assert gemm.gemm_time_s(device, dtype, *x) == pytest.approx(node, rel=1e-12)
        if x not in table.adjusted:
            assert node == table.measured[x]
        else:  # the monotone lower envelope only ever lowers a point, to a bigger shape's time
            assert node < table.measured[x]
    assert len(table.adjusted) < 50  # B200 fp8 has the most (47); see the module docstring


def test_one_measured_point_by_hand() -> None:
    # H100 bf16, b=1, M=N=K=4096: 780.193877565849 TFLOP/s in the table, so
    # 2 * 4096^3 / 780.193877565849e12 = 176.1609 us; 989.4 TFLOP/s peak -> efficiency 0.78855.
    assert gemm.gemm_time_s(H100, "bf16", 1, 4096, 4096, 4096) == pytest.approx(2 * 4096**3 / 780.193877565849e12, rel=1e-12)
    assert gemm.gemm_efficiency(H100, "bf16", 1, 4096, 4096, 4096) == pytest.approx(780.193877565849 / 989.4, rel=1e-12)
    # fp16 reads the bf16 table (same tensor-core rate and bytes); H100 has 12 adjusted bf16 points
    assert gemm.gemm_time_s(H100, "fp16", 1, 4096, 4096, 4096) == gemm.gemm_time_s(H100, "bf16", 1, 4096, 4096, 4096)
    assert len(gemm.measured_table(H100.name, "bf16").adjusted) == 12


def test_the_table_maps_its_n_to_our_rows() -> None:
    # The table's dot is [b,n,k] @ [b,k,m]; row "H100,bf16,1,256,4096,1024" (m=256, n=4096) is our
    # M=4096, N=256.  Read the CSV row and compare.
    import csv

    with open(gemm.TABLE_FILE, newline="") as f:
        row = next(r for r in csv.DictReader(f) if (r["gpu_name"], r["dtype"], r["b"], r["m"], r["n"], r["k"])
                   == ("H100", "bf16", "1", "256", "4096", "1024"))
    t = 2 * 256 * 4096 * 1024 / float(row["flops_per_s"])
    assert gemm.measured_table(H100.name, "bf16").measured[(1, 4096, 256, 1024)] == pytest.approx(t, rel=1e-12)


def test_interpolation_is_multilinear_in_log_space() -> None:
    # 2x2x2x2 grid, time = 1e-6 * b * M * N * K / 2^40 at the corners (axes {1,2}, {1,4}...).
    axes = ((1, 2), (1024, 4096), (1024, 4096), (256, 1024))
    times = {(b, m, n, k): 1e-6 * b * m * n * k / 2**40 for b in axes[0] for m in axes[1] for n in axes[2] for k in axes[3]}
    table = gemm.MeasuredTable(times)
    assert table.adjusted == ()
    # log-linear in each log coordinate: the product law is reproduced exactly between nodes
    x = (1.5, 2048, 3000, 300)
    assert table.time_s(x) == pytest.approx(1e-6 * 1.5 * 2048 * 3000 * 300 / 2**40, rel=1e-12)
    with pytest.raises(ModelError, match="outside the measured grid"):
        table.time_s((1, 512, 1024, 256))


def test_lower_envelope_of_a_non_monotone_table() -> None:
    # 1x1x1x2 "grid" on K: K=256 measured 8 us, K=512 measured 6 us -> K=256 lowered to 6 us.
    times = {(1, 256, 256, 256): 8e-6, (1, 256, 256, 512): 6e-6}
    table = gemm.MeasuredTable(times)
    assert table.nodes[(1, 256, 256, 256)] == 6e-6 and table.adjusted == ((1, 256, 256, 256),)
    with pytest.raises(ModelError, match="not a full grid"):
        gemm.MeasuredTable({(1, 256, 256, 256): 1e-6, (1, 512, 512, 256): 2e-6})


# ------------------------------------------------------------------------------ monotone in size

DIMS = (1, 100, 256, 300, 1024, 3000, 4096, 5000, 8192)
BATCH = (1, 3, 4, 8)


@pytest.mark.parametrize(("device", "dtype"), [(H100, "bf16"), (H100, "tf32"), (gemm.B200, "fp8"), (A100, "bf16"),
                                               (get_gpu("v100"), "fp16"), (get_gpu("l40s"), "bf16"),
                                               (H100, "fp8"), (A100, "fp32")],
                         ids=lambda v: getattr(v, "name", v))
def test_more_work_of_the_same_shape_never_takes_less_time(device, dtype) -> None:
    # on and off the grid (100, 300, 3000, 5000, 8192 are off it; b = 3 and 8 too)
    t = np.array([[[[gemm.gemm_time_s(device, dtype, b, m, n, k) for k in DIMS] for n in DIMS] for m in DIMS]
                  for b in BATCH])
    for axis in range(4):
        assert (np.diff(t, axis=axis) >= -1e-12 * t.max()).all(), axis


@settings(max_examples=200, deadline=None)
@given(st.sampled_from([H100, A100, gemm.B200, get_gpu("mi300x")]), st.integers(1, 64), st.integers(1, 20000),
       st.integers(1, 20000), st.integers(1, 20000))
def test_no_gemm_beats_the_roofline(device, b, m, n, k) -> None:
    dev = gemm.gemm_device(device)
    t = gemm.gemm_time_s(device, "bf16", b, m, n, k)
    assert t >= 2 * b * m * n * k / dev.peak("bf16")
    assert t >= (2 * b * (m * k + k * n) + 2 * b * m * n) / dev.hbm_bytes_per_s


# ---------------------------------------------------------------------------- analytical model


def test_held_out_accuracy_on_h100_bf16() -> None:
    # Fit on B200 + the H100 shapes with even log2(b M N K); check the odd ones of >= 1 GFLOP.
    # benchmarks/fit_gemm.py prints the figure: median 3.4%, mean 4.2% (164 shapes).
    keys = sorted(gemm.measured_table(H100.name, "bf16").nodes)
    even = [x for x in keys if round(math.log2(math.prod(x))) % 2 == 0]
    odd = [x for x in keys if round(math.log2(math.prod(x))) % 2 == 1 and 2 * math.prod(x) >= 1e9]
    fit = gemm.fit_shape_law([gemm.table_samples(H100, "bf16", even), gemm.table_samples(gemm.B200, "bf16")])
    _, _, shapes, times = gemm.table_samples(H100, "bf16", odd)
    pred = gemm.analytical_times_s(*shapes.T, peak_flops_per_s=989.4e12, sm_count=132, hbm_bytes_per_s=3350e9,
                                   in_bytes=2, out_bytes=2, sustained=fit.sustained[H100.name], law=fit.law)
    err = np.abs(pred / times - 1)
    assert len(err) > 150
    assert np.median(err) <= 0.08


def test_module_constants_are_the_fit() -> None:
    # The numbers written into the module are what benchmarks/fit_gemm.py finds (to their rounding).
    fit = gemm.fit_shape_law([gemm.table_samples(H100, "bf16"), gemm.table_samples(gemm.B200, "bf16")])
    law = gemm.SHAPE_LAW
    for name in ("epilogue_bytes", "tile_edge", "latency_s", "hbm_efficiency", "tail_wave"):
        assert getattr(fit.law, name) == pytest.approx(getattr(law, name), rel=0.005), name
    for name, f in fit.sustained.items():
        assert gemm.SUSTAINED_FACTOR[name] == pytest.approx(f, abs=0.001)
    assert gemm.DEFAULT_SUSTAINED_FACTOR == pytest.approx((gemm.SUSTAINED_FACTOR["H100-SXM5-80GB"]
                                                            + gemm.SUSTAINED_FACTOR["B200"]) / 2, abs=0.001)


def test_a100_numbers_are_sensible() -> None:
    # No A100 table: the shape law with A100's 312 TFLOP/s, 108 SMs, 2.04 TB/s, f = 0.723.
    big = gemm.gemm_efficiency(A100, "bf16", 1, 8192, 8192, 8192)
    small = gemm.gemm_efficiency(A100, "bf16", 1, 1024, 1024, 256)
    assert 0.70 <= big <= 0.85
    assert small < 0.3 < big
    # fitted on Narayanan et al. 2021 Table 1 (benchmarks/fit_a100.py), the same for both A100 presets
    assert gemm.SUSTAINED_FACTOR["A100-SXM4-80GB"] == gemm.SUSTAINED_FACTOR["A100-SXM4-40GB"] == 0.723


def test_split_k_for_small_outputs_with_long_k() -> None:
    # A100 bf16, M=N=256, K=65536.  Without split-K the best tile (256x128) makes 2 tiles, one
    # wave: 2*256*128*(65536 + 204.2) / (312e12/108 * 0.848 * 1) = 4.31e9 / 2.450e12 = 1.76 ms.
    # Split 16 ways: 32 tiles, still one wave, K per tile 4096 + 204.2: 0.115 ms + partial sums
    # (2*16*256*256*4 B / (2039e9 * 0.970) = 4.2 us) + 5.2 us latency.
    t = gemm.analytical_time_s(A100, "bf16", 1, 256, 256, 65536)
    assert t < 0.2e-3
    assert t > 2 * 256 * 256 * 65536 / 312e12


def test_latency_floor_and_memory_floor() -> None:
    # A 1x1x1 product is all latency: t_lat plus one tile's fixed cost.
    t = gemm.analytical_time_s(A100, "bf16", 1, 1, 1, 1)
    assert gemm.SHAPE_LAW.latency_s < t < 10 * gemm.SHAPE_LAW.latency_s
    # fp32 on CUDA cores (19.5 TFLOP/s) is far slower than bf16 tensor cores at the same shape
    assert gemm.gemm_time_s(A100, "fp32", 1, 4096, 4096, 4096) > 10 * gemm.gemm_time_s(A100, "bf16", 1, 4096, 4096, 4096)
    assert gemm.gemm_time_s(A100, "fp32", 1, 4096, 4096, 4096, allow_tf32=True) == gemm.gemm_time_s(A100, "tf32", 1, 4096, 4096, 4096)


def test_bad_input_raises_errors_that_say_what_to_do() -> None:
    with pytest.raises(ConfigError, match="unknown dtype"):
        gemm.gemm_time_s(A100, "int4", 1, 2, 2, 2)
    with pytest.raises(ConfigError, match="no sourced bf16 peak"):
        gemm.gemm_time_s(get_gpu("v100"), "bf16", 1, 2, 2, 2)
    with pytest.raises(ConfigError, match="must be positive"):
        gemm.gemm_time_s(A100, "bf16", 1, 0, 2, 2)
    bare = GPU("x", {"bf16": 1e12}, 1e9, 1e9, 0.0, 1e9, {})
    with pytest.raises(ConfigError, match="sm_count"):
        gemm.gemm_time_s(bare, "bf16", 1, 2, 2, 2)


# ------------------------------------------------------------------------------ training shapes


def test_training_gemms_of_a_linear_layer() -> None:
    # [4, 2048, 1024] @ [1024, 4096]: rows flatten to 8192; dX = dY @ W^T; dW = X^T @ dY (K = tokens)
    g = gemm.training_gemms("MatMul", (4, 2048, 1024), (1024, 4096))
    assert g.forward == (1, 8192, 4096, 1024)
    assert g.data_grad == (1, 8192, 1024, 4096)
    assert g.weight_grad == (1, 1024, 4096, 8192)
    assert g.forward.flops == g.data_grad.flops == g.weight_grad.flops == 2 * 8192 * 4096 * 1024


def test_training_gemms_of_batched_and_other_products() -> None:
    # attention scores [8, 16, 2048, 64] @ [8, 16, 64, 2048]: 128 products of 2048x2048x64
    g = gemm.training_gemms("MatMul", (8, 16, 2048, 64), (8, 16, 64, 2048))
    assert g == ((128, 2048, 2048, 64), (128, 2048, 64, 2048), (128, 64, 2048, 2048))
    # Gemm with transB: A [512, 256], B^T stored as [128, 256] -> M=512, N=128, K=256
    g = gemm.training_gemms("Gemm", (512, 256), (128, 256), {"transB": 1})
    assert g == ((1, 512, 128, 256), (1, 512, 256, 128), (1, 256, 128, 512))
    # shared A [64, 32] @ batched B [5, 32, 16]: dA sums over the batch -> K = 5 * 16
    g = gemm.training_gemms("MatMul", (64, 32), (5, 32, 16))
    assert g == ((5, 64, 16, 32), (1, 64, 32, 80), (5, 32, 16, 64))
    # a vector [32] @ [32, 8]: one row
    assert gemm.training_gemms("MatMul", (32,), (32, 8)).forward == (1, 1, 8, 32)
    with pytest.raises(ModelError, match="contraction dimensions differ"):
        gemm.training_gemms("MatMul", (4, 32), (16, 8))
    with pytest.raises(ModelError, match="not 'Conv'"):
        gemm.training_gemms("Conv", (1, 3, 8, 8), (4, 3, 3, 3))
    with pytest.raises(ModelError, match="2-D"):
        gemm.training_gemms("Gemm", (2, 4, 8), (8, 4))


def test_backward_gemms_cost_their_own_shapes() -> None:
    # A Megatron MLP down-projection on 8 tensor ranks (h = 12288, t = 8, 2048 tokens):
    # [2048, 6144] @ [6144, 12288]: dW contracts over only 2048 tokens and dX has N = 6144.
    g = gemm.training_gemms("MatMul", (1, 2048, 6144), (6144, 12288))
    times = [gemm.gemm_time_s(A100, "bf16", *s) for s in g]
    assert len(set(times)) == 3  # three shapes, three different times, same FLOPs


# ------------------------------------------------------------------ wired into the op costing
def _analyse(nodes, inputs, outputs, initializers=(), cluster_name="dgx-h100", batch=1):
    from dataclasses import replace

    import onnx
    from onnx import helper

    from dml2comm.analysis import analyze_graph
    from dml2comm.hardware.cluster import get_cluster
    from dml2comm.ir.onnx_import import ImportOptions, load_model_proto
    from dml2comm.parallel.config import ParallelConfig

    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    onnx.checker.check_model(model)
    # the GEMM model's own times: the host model's per-kernel floor off (dml2comm.cost.host)
    cluster = replace(get_cluster(cluster_name, 1), collective_overhead_s=0.0, host_model="none")
    config = ParallelConfig(dtype="bf16", micro_batch_size=batch, global_batch_size=batch)
    analysis = analyze_graph(load_model_proto(model, ImportOptions(batch_size=batch)), config, cluster,
                             advise=False, timeline=False)
    return {op.name: op for op in analysis.ops}


def test_op_costing_times_linear_and_attention_matmuls_with_the_gemm_model() -> None:
    """The analysis times a MatMul by gemm_time_s: forward at its own shape, backward as the
    data-gradient plus the weight-gradient GEMM, each at its own shape (training_gemms)."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.zeros((4096, 1024), dtype=np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"], name="linear"),
             helper.make_node("MatMul", ["q", "k"], ["s"], name="scores")]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 1024, 4096]),
              helper.make_tensor_value_info("q", TensorProto.FLOAT, ["batch", 4, 512, 64]),
              helper.make_tensor_value_info("k", TensorProto.FLOAT, ["batch", 4, 64, 512])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 1024, 1024]),
               helper.make_tensor_value_info("s", TensorProto.FLOAT, ["batch", 4, 512, 512])]
    ops = _analyse(nodes, inputs, outputs, [w], batch=2)
    t = lambda *shape: gemm.gemm_time_s(H100, "bf16", *shape)  # noqa: E731
    # linear: the 2 x 1024 tokens flatten into M = 2048 rows; dX = dY W^T (2048, 4096, K=1024);
    # dW = X^T dY (4096, 1024, K=2048): all on the measured grid, so the table's values
    assert ops["linear"].time_fwd_s == t(1, 2048, 1024, 4096)
    assert ops["linear"].time_bwd_s == t(1, 2048, 4096, 1024) + t(1, 4096, 1024, 2048)
    # attention scores: 2 x 4 products [512, 64] @ [64, 512]; K = 64 and b = 8 are outside the
    # grid (analytical, bounded by the table); backward dQ (8, 512, 64, 512), dK (8, 64, 512, 512)
    assert ops["scores"].time_fwd_s == t(8, 512, 512, 64)
    assert ops["scores"].time_bwd_s == t(8, 512, 64, 512) + t(8, 64, 512, 512)
    assert ops["linear"].time_bwd_s != 2 * ops["linear"].time_fwd_s


def test_gemm_bias_flops_are_added_at_the_flop_efficiency() -> None:
    """Gemm Y = A B + C on A100 (no table): the GEMM model's time plus the bias's M N FLOPs at
    peak x FLOP_EFFICIENCY (forward) and 2 M N (backward, the rule's 2x)."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    from dml2comm.cost.compute import FLOP_EFFICIENCY

    inits = [numpy_helper.from_array(np.zeros((1024, 2048), dtype=np.float32), "w"),
             numpy_helper.from_array(np.zeros((2048,), dtype=np.float32), "c")]
    nodes = [helper.make_node("Gemm", ["a", "w", "c"], ["y"], name="fc")]
    ops = _analyse(nodes, [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["batch", 1024])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2048])], inits, "dgx-a100", batch=4096)
    t = lambda *shape: gemm.gemm_time_s(A100, "bf16", *shape)  # noqa: E731
    rate = 312e12 * FLOP_EFFICIENCY
    assert ops["fc"].time_fwd_s == pytest.approx(t(1, 4096, 2048, 1024) + 4096 * 2048 / rate, rel=1e-12)
    assert ops["fc"].time_bwd_s == pytest.approx(t(1, 4096, 1024, 2048) + t(1, 1024, 2048, 4096) + 2 * 4096 * 2048 / rate,
                                                 rel=1e-12)


def test_a_partial_last_wave_costs_part_of_a_wave() -> None:
    """One tile past a full wave (109 one-tile products on the A100's 108 SMs) no longer costs a
    whole second wave: the fitted tail weight makes the partial wave cheaper than the classic
    ceil(tiles / SMs), and a full wave is still cheaper than it (monotone)."""
    import dataclasses

    kw = dict(peak_flops_per_s=312e12, sm_count=108, hbm_bytes_per_s=A100.hbm_bytes_per_s, in_bytes=2, out_bytes=2,
              sustained=0.7)
    assert 0.3 < gemm.SHAPE_LAW.tail_wave < 0.7  # the tables' fit (benchmarks/fit_gemm.py)
    shipped = gemm.analytical_times_s([108, 109, 216], [256] * 3, [128] * 3, [8192] * 3, **kw)
    classic = gemm.analytical_times_s([108, 109, 216], [256] * 3, [128] * 3, [8192] * 3,
                                      law=dataclasses.replace(gemm.SHAPE_LAW, tail_wave=0.0), **kw)
    assert shipped[0] == classic[0] and shipped[2] == classic[2]  # whole waves are unchanged
    assert shipped[0] < shipped[1] < classic[1] < shipped[2]
    assert shipped[1] / shipped[0] < 1.1 < classic[1] / classic[0]
