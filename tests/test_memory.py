"""Memory model: ZeRO Table 1, Korthikanti et al. per-layer activations, in-flight micro-batches."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dml2comm import zoo
from dml2comm.analysis import analyze_graph
from dml2comm.cost.ops import is_attention_core
from dml2comm.cost.memory import ActivationModel, in_flight_micro_batches, model_state_bytes
from dml2comm.hardware.cluster import make_cluster
from dml2comm.ir.graph import DType
from dml2comm.ir.layers import group_layers
from dml2comm.ir.onnx_import import ImportOptions
from dml2comm.load import load_model_proto
from dml2comm.parallel.config import ParallelConfig
from dml2comm.parallel.schedule import StepKind
from dml2comm.parallel.tensor import requires_grad, shard_tensor_parallel
from tests.oracles import build_schedule
from tests.test_cli import ROOT, assert_bad, run

ZERO_TABLE = Path(__file__).resolve().parent / "fixtures" / "published" / "zero2020_table1.json"


def _zero_rows():
    assert ZERO_TABLE.exists(), f"{ZERO_TABLE} is missing: it is a bundled test fixture (restore it from git)"
    return json.loads(ZERO_TABLE.read_text())["rows"]


def _printed_precision(value: float) -> float:
    """One unit in the last printed digit: Table 1 sometimes truncates (2218.75 is printed
    2218, 4187.5 as 4187) and sometimes rounds (1.875 as 1.88)."""
    text = repr(value)
    decimals = len(text.split(".")[1]) if "." in text else 0
    return 10.0 ** -decimals


def test_zero_table1_all_54_cells():
    """Rajbhandari et al. 2020, Table 1: GB (1e9) per device for Psi parameters, N_d ranks, K = 12."""
    rows = _zero_rows()
    cells = 0
    for dp, psi_billion, p_os, p_os_g, p_os_g_p in rows:
        psi = psi_billion * 1e9
        for stage, printed in ((0, None), (1, p_os), (2, p_os_g), (3, p_os_g_p)):
            got = model_state_bytes(psi, dp, stage, "adam", 2).total_bytes / 1e9
            if stage == 0:
                assert got == pytest.approx(16 * psi_billion)  # the baseline column, 16 Psi
                cells += 1
                continue
            assert abs(got - printed) <= _printed_precision(printed) + 1e-9, (dp, psi_billion, stage, got, printed)
            cells += 1
    assert cells == 18 * 3 + 18  # 54 printed cells of the three ZeRO columns, plus the baseline


SHAPES = [(6144, 64), (12288, 96)]  # 22B and 175B (Korthikanti et al. 2022, Table 3)


@pytest.fixture(scope="module", params=SHAPES, ids=["22B", "175B"])
def layer_graph(request):
    h, a = request.param
    graph = load_model_proto(zoo.build_gpt(layers=1, hidden=h, heads=a, vocab=1024, seq_len=2048), ImportOptions(batch_size=1)).graph
    return h, a, graph


CONFIGS = [
    # (t, sequence parallel, recompute, Korthikanti et al. 2022 Table 2 bytes per layer / (s b h))
    (1, False, "none", lambda a, s, h, t: 34 + 5 * a * s / h),
    (8, False, "none", lambda a, s, h, t: 10 + 24 / t + 5 * a * s / (h * t)),
    (8, True, "none", lambda a, s, h, t: 34 / t + 5 * a * s / (h * t)),
    (8, False, "selective", lambda a, s, h, t: 10 + 24 / t),
    (8, True, "selective", lambda a, s, h, t: 34 / t),
    (8, False, "full", lambda a, s, h, t: 2),
]


@pytest.mark.parametrize("b", [1, 4])
@pytest.mark.parametrize("t,sp,recompute,formula", CONFIGS, ids=["none", "tp", "tp+sp", "tp+sel", "tp+sp+sel", "full"])
def test_korthikanti_activations_per_layer_from_the_op_graph(layer_graph, b, t, sp, recompute, formula):
    h, a, graph = layer_graph
    s = 2048
    if b != 1:
        graph = load_model_proto(zoo.build_gpt(layers=1, hidden=h, heads=a, vocab=1024, seq_len=s), ImportOptions(batch_size=b)).graph
    block = next(l for l in group_layers(graph).layers if l.kind == "block")
    plan = shard_tensor_parallel(graph, t, sp)
    model = ActivationModel(graph, [x.inputs for x in plan.shards], [x.outputs for x in plan.shards], requires_grad(graph), DType.BFLOAT16)
    core = frozenset(i for i in block.op_indices if is_attention_core(graph, i, s))
    got = model.saved_bytes(block.op_indices, recompute, core)
    expected = s * b * h * formula(a, s, h, t)
    assert got == pytest.approx(expected, rel=0.02)


@pytest.mark.parametrize("p", [1, 2, 4, 8])
def test_1f1b_first_stage_holds_L_layers_whatever_p(p):
    """Korthikanti et al. 2022 Sec. 4.3: p in-flight micro-batches x L/p layers = L layers."""
    L = 8
    model = zoo.build_gpt(layers=L, hidden=256, heads=8, vocab=256, seq_len=128)
    imported = load_model_proto(model, ImportOptions(batch_size=2))
    config = ParallelConfig(pp_size=p, micro_batch_size=2, global_batch_size=32, seq_len=128)
    a = analyze_graph(imported, config, make_cluster("a100", p, min(p, 8)))
    acts = ActivationModel(a.graph, [x.inputs for x in a.tp.shards], [x.outputs for x in a.tp.shards], requires_grad(a.graph), DType.BFLOAT16)
    layers = a.layered.layers
    per_block = acts.saved_bytes(next(l for l in layers if l.kind == "block").op_indices)
    first = a.stages[0]
    assert first.memory["in_flight_micro_batches"] == p
    blocks = [li for li in first.layers if layers[li].kind == "block"]
    assert len(blocks) == L // p  # the balanced partition gives stage 0 its L/p blocks
    non_blocks = sum(acts.saved_bytes(layers[li].op_indices) for li in first.layers if layers[li].kind != "block")
    # blocks' share of stage 0's peak: (L/p blocks) x p in flight = L blocks' worth, whatever p
    assert first.memory["activations_bytes"] - non_blocks * p == pytest.approx(L * per_block, rel=1e-9)


@pytest.mark.parametrize("p", [1, 2, 3, 4, 8])
def test_in_flight_gpipe_and_1f1b(p):
    """GPipe holds every micro-batch; 1F1B's stage s holds min(p - s, m) (Narayanan et al. 2021,
    Sec. 2.2.1: p - s - 1 warm-up forwards, then one more before the first backward), fewer
    micro-batches than stages (m < p) included."""
    for m in range(1, 2 * p + 2):
        assert in_flight_micro_batches("gpipe", p, m).tolist() == [m] * p
        assert in_flight_micro_batches("1f1b", p, m).tolist() == [min(p - s, m) for s in range(p)]
        # --virtual-stages is ignored by the other schedules (ParallelConfig.chunks)
        assert in_flight_micro_batches("1f1b", p, m, 4).tolist() == [min(p - s, m) for s in range(p)]


def test_in_flight_interleaved_worked_example():
    """p=4, v=2, m=8: stage 0 runs (p-1)*2 + (v-1)*p = 10 warm-up chunk forwards and one more
    before its first backward, 11 chunk forwards = 5.5 micro-batches = 4 (1 + 3/8)."""
    assert in_flight_micro_batches("interleaved", 4, 8, 2).tolist() == [5.5, 4.5, 3.5, 2.5]
    assert in_flight_micro_batches("interleaved", 4, 8, 2)[0] == 4 * (1 + 3 / 8)


@pytest.mark.parametrize("p", [2, 3, 4, 8])
@pytest.mark.parametrize("v", [2, 3, 4])
def test_in_flight_interleaved_first_stage_is_megatrons_penalty(p, v):
    """Stage 0 holds p (1 + (p - 1) / (p v)) micro-batches: Megatron-LM's
    ``interleaved_schedule_memory_penalty`` (megatron/training/theoretical_memory_usage.py) and
    Korthikanti et al. 2022 Sec. 4.2.3, with v (not the micro-batch count) in the denominator."""
    for m in (2 * p, 4 * p, 8 * p):
        assert in_flight_micro_batches("interleaved", p, m, v)[0] == pytest.approx(p * (1 + (p - 1) / (p * v)))


@pytest.mark.parametrize("p", [2, 3, 4, 8])
@pytest.mark.parametrize("v", [2, 3])
def test_in_flight_interleaved_every_stage_follows_megatrons_warm_up(p, v):
    """Stage s holds Megatron-Core's warm-up forwards plus the first steady-state one, in chunk
    forwards of 1/v micro-batch: (min((p - s - 1) * 2 + (v - 1) * p, m v) + 1, at most m v) / v
    (``num_warmup_microbatches``, megatron/core/pipeline_parallel/schedules.py, capped at the
    total); m = p, where later stages' warm-up is cut short by the total, included."""
    for m in (p, 2 * p, 3 * p):
        expected = [min((p - s - 1) * 2 + (v - 1) * p + 1, m * v) / v for s in range(p)]
        assert in_flight_micro_batches("interleaved", p, m, v).tolist() == pytest.approx(expected)


def _held_by_stepping(steps, v):
    """The most forwards run whose backward has not, walking one device's step list."""
    held, most = set(), 0
    for step in steps:
        key = (step.micro_batch, step.chunk)
        if step.kind is StepKind.FORWARD:
            held.add(key)
            most = max(most, len(held))
        else:
            assert key in held, "a backward before its forward"
            held.remove(key)
    assert not held
    return most / v


@pytest.mark.parametrize(("name", "p", "m", "v"), [("gpipe", 3, 5, 1), ("1f1b", 4, 2, 1), ("1f1b", 4, 9, 1),
                                                   ("interleaved", 4, 4, 2), ("interleaved", 3, 9, 3),
                                                   ("interleaved", 2, 6, 4)])
def test_in_flight_is_the_count_over_the_step_lists(name, p, m, v):
    """The count over the schedule's arrays equals the count over the step lists that
    ``tests/oracles.py`` writes out step by step."""
    lists = build_schedule(name, p, m, v)
    assert in_flight_micro_batches(name, p, m, v).tolist() == [_held_by_stepping(steps, v) for steps in lists]


def test_in_flight_is_cached_and_read_only():
    first = in_flight_micro_batches("interleaved", 8, 64, 4)
    assert in_flight_micro_batches("interleaved", 8, 64, 4) is first
    with pytest.raises(ValueError):
        first[0] = 0.0


def test_interleaved_analysis_reads_the_schedules_count():
    """An interleaved analysis's stage memory uses the schedule's count: p=2, v=2 holds
    2 + 1/2 micro-batches on stage 0 and 1.5 on stage 1."""
    model = zoo.build_gpt(layers=8, hidden=256, heads=8, vocab=256, seq_len=128)
    imported = load_model_proto(model, ImportOptions(batch_size=2))
    config = ParallelConfig(pp_size=2, micro_batch_size=2, global_batch_size=16, seq_len=128, schedule="interleaved",
                            virtual_stages=2)
    a = analyze_graph(imported, config, make_cluster("a100", 2, 2))
    assert [st.memory["in_flight_micro_batches"] for st in a.stages] == [2.5, 1.5]
    assert a.stages[0].memory["activations_bytes"] == pytest.approx(2.5 * a.stages[0].memory["activations_per_micro_batch_bytes"])


def test_fit_check_and_suggestions_are_reanalysed():
    model = zoo.build_gpt(layers=4, hidden=1024, heads=16, vocab=1024, seq_len=2048)
    imported = load_model_proto(model, ImportOptions(batch_size=32))
    config = ParallelConfig(dp_size=2, micro_batch_size=32, global_batch_size=128, seq_len=2048, dtype="fp16")
    cluster = make_cluster("v100", 2, 2)  # 32 GB
    a = analyze_graph(imported, config, cluster)
    assert not a.memory["fits"] and a.summary["fits_in_memory"] is False
    assert a.memory["largest_contributor"] == "activations"
    changes = {s["change"]: s for s in a.memory["suggestions"]}
    assert changes["--recompute full"]["fits"]
    assert changes["--recompute full"]["peak_bytes"] < a.memory["peak_bytes"]


@pytest.mark.parametrize("flag,value,needle", [("--optimizer", "adagrad", "invalid choice"), ("--zero", "4", "invalid choice"),
                                               ("--recompute", "some", "invalid choice")])
def test_bad_memory_options(tmp_path, flag, value, needle):
    out = tmp_path / "out"
    assert_bad(run(str(ROOT / "examples" / "gpt2-small.onnx"), flag, value, "--out", str(out), cwd=tmp_path), out, needle)


def test_assumed_dropout_on_an_export_matches_the_zoo_graph_with_dropout():
    """A graph without Dropout nodes plus --dropout keeps the same masks as the graph with them."""
    s, h, a = 256, 256, 8
    with_nodes = load_model_proto(zoo.build_gpt(layers=1, hidden=h, heads=a, vocab=256, seq_len=s), ImportOptions(batch_size=2)).graph
    without = load_model_proto(zoo.build_gpt(layers=1, hidden=h, heads=a, vocab=256, seq_len=s, dropout=0.0), ImportOptions(batch_size=2)).graph

    def block_bytes(graph, assumed):
        block = next(l for l in group_layers(graph).layers if l.kind == "block")
        plan = shard_tensor_parallel(graph, 2)
        m = ActivationModel(graph, [x.inputs for x in plan.shards], [x.outputs for x in plan.shards], requires_grad(graph),
                            DType.BFLOAT16, assumed_dropout=assumed)
        return m.saved_bytes(block.op_indices)

    assert block_bytes(without, True) == pytest.approx(block_bytes(with_nodes, False))
    assert block_bytes(without, False) < block_bytes(with_nodes, False)


@pytest.mark.parametrize("name", ["gpt2_legacy.onnx", "gpt2_dynamo.onnx"])
def test_real_gpt2_exports_with_assumed_dropout_match_korthikanti(name):
    """Real exports (no Dropout nodes) + --dropout: one GPT-2 block keeps s b h (34 + 5 a s / h)."""
    from dml2comm.load import load_model

    s, b, h, a = 1024, 1, 768, 12
    graph = load_model(Path(__file__).parent / "fixtures" / name, ImportOptions(batch_size=b, seq_len=s)).graph
    block = [l for l in group_layers(graph).layers if l.kind == "block"][3]
    plan = shard_tensor_parallel(graph, 1)
    m = ActivationModel(graph, [x.inputs for x in plan.shards], [x.outputs for x in plan.shards], requires_grad(graph),
                        DType.BFLOAT16, assumed_dropout=True)
    assert m.saved_bytes(block.op_indices) == pytest.approx(s * b * h * (34 + 5 * a * s / h), rel=0.02)


def _autocast_block(b: int = 2, s: int = 4, h: int = 8, vocab: int = 16):
    """A hand-made block of an fp32 model: e = embedding(ids); n = LayerNorm(e); q = n Wq;
    k = n Wk; t = tanh(q ** 3); y = t * k + e; o = y Wo."""
    from onnx import TensorProto, helper, numpy_helper
    import numpy as np

    f = TensorProto.FLOAT
    inits = [numpy_helper.from_array(np.ones(shape, np.float32), name) for name, shape in
             (("W_e", (vocab, h)), ("gamma", (h,)), ("beta", (h,)), ("Wq", (h, h)), ("Wk", (h, h)), ("Wo", (h, h)))]
    inits.append(numpy_helper.from_array(np.array(3.0, np.float32), "three"))
    nodes = [helper.make_node("Gather", ["W_e", "ids"], ["e"]),
             helper.make_node("LayerNormalization", ["e", "gamma", "beta"], ["n"], axis=-1),
             helper.make_node("MatMul", ["n", "Wq"], ["q"]), helper.make_node("MatMul", ["n", "Wk"], ["k"]),
             helper.make_node("Pow", ["q", "three"], ["p"]), helper.make_node("Tanh", ["p"], ["t"]),
             helper.make_node("Mul", ["t", "k"], ["m"]), helper.make_node("Add", ["m", "e"], ["y"]),
             helper.make_node("MatMul", ["y", "Wo"], ["o"])]
    graph = helper.make_graph(nodes, "amp_block", [helper.make_tensor_value_info("ids", TensorProto.INT64, [b, s])],
                              [helper.make_tensor_value_info("o", f, [b, s, h])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return load_model_proto(model, ImportOptions(batch_size=b)).graph


def test_autocast_saved_bytes_of_a_hand_made_block():
    """torch.autocast(bfloat16) on CUDA (memory.autocast_dtypes): e (embedding of an fp32 table),
    n (layer_norm: fp32 list), t (tanh of pow: fp32 list) and y (fp32 + bf16 promotes) are fp32;
    q, k, o (GEMMs) bf16.  Kept, N = b s h elements: LayerNorm its input e (4N); each GEMM its
    own bf16 cast of n (2N + 2N: autocast caches only weight casts) and of y (2N); Pow an fp32
    copy of its bf16 input q (4N); Tanh its fp32 output (4N); Mul t (already kept) and k (2N);
    Gather the int64 ids (8 b s).  20 N + 8 b s, against 12 N + 8 b s in pure bf16 (e, n, q, t,
    k, y at 2N each)."""
    from dml2comm.cost.memory import autocast_dtypes

    b, s, h = 2, 4, 8
    n_el = b * s * h
    graph = _autocast_block(b, s, h)
    dtypes = autocast_dtypes(graph, DType.BFLOAT16)
    assert {k: dtypes[k] for k in ("e", "n", "q", "k", "p", "t", "m", "y", "o")} == dict(
        e=DType.FLOAT, n=DType.FLOAT, q=DType.BFLOAT16, k=DType.BFLOAT16, p=DType.FLOAT, t=DType.FLOAT, m=DType.FLOAT,
        y=DType.FLOAT, o=DType.BFLOAT16)
    plan = shard_tensor_parallel(graph, 1)

    def saved(autocast):
        m = ActivationModel(graph, [x.inputs for x in plan.shards], [x.outputs for x in plan.shards], requires_grad(graph),
                            DType.BFLOAT16, eager=True, autocast=dtypes if autocast else None)
        return m.saved_bytes(range(len(graph.ops)))

    assert saved(True) == 20 * n_el + 8 * b * s == 1344
    assert saved(False) == 12 * n_el + 8 * b * s == 832


def test_eager_erf_gelu_keeps_its_input_only():
    """F.gelu exported as Div(x, sqrt 2), Erf, Add 1, Mul 0.5, Mul x (torchlib aten_gelu): eager
    PyTorch keeps x alone (gelu_backward(grad, self)), 2 N bytes in bf16 for N = b s f; fused
    (Megatron) the region keeps its input x too; unfused primitives would keep x / sqrt 2, x and
    0.5 (1 + erf): 6 N."""
    from onnx import TensorProto, helper, numpy_helper
    import numpy as np

    b, s, h, f = 2, 4, 8, 16
    inits = [numpy_helper.from_array(np.ones((h, f), np.float32), "W1"), numpy_helper.from_array(np.ones((f, h), np.float32), "W2")]
    inits += [numpy_helper.from_array(np.array(v, np.float32), n) for n, v in (("sqrt2", 2 ** 0.5), ("one", 1.0), ("half", 0.5))]
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["a"]), helper.make_node("Div", ["a", "sqrt2"], ["d"]),
             helper.make_node("Erf", ["d"], ["e"]), helper.make_node("Add", ["e", "one"], ["p"]),
             helper.make_node("Mul", ["half", "p"], ["q"]), helper.make_node("Mul", ["a", "q"], ["y"]),
             helper.make_node("MatMul", ["y", "W2"], ["o"])]
    graph = helper.make_graph(nodes, "gelu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [b, s, h])],
                              [helper.make_tensor_value_info("o", TensorProto.FLOAT, [b, s, h])], inits)
    g = load_model_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), ImportOptions(batch_size=b)).graph
    plan = shard_tensor_parallel(g, 1)
    n = b * s * f
    gelu = [op.index for op in g.ops if op.op_type not in ("MatMul",)]
    eager = ActivationModel(g, [x.inputs for x in plan.shards], [x.outputs for x in plan.shards], requires_grad(g), DType.BFLOAT16, eager=True)
    assert eager.saved_bytes(gelu) == 2 * n
