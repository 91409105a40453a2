"""Context parallelism (--cp, Ulysses and ring) and expert parallelism (--ep) end to end.

Counts and volumes are checked against the published schemes: DeepSpeed-Ulysses' 4 AllToAlls of
b s h / c elements per GPU per layer (Jacobs et al. 2023, Sec. 3.1), ring attention's c - 1 K/V
block transfers per layer and direction, and the MoE dispatch + combine AllToAlls of
tokens x top-k x hidden elements each (GShard / Megatron-Core).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dml2comm import zoo
from dml2comm.analysis import analyze_graph, comm_by_dim
from dml2comm.errors import ConfigError
from dml2comm.hardware.cluster import RankMap, get_cluster, make_cluster
from dml2comm.ir.onnx_import import ImportOptions
from dml2comm.load import load_model, load_model_proto
from dml2comm.network.kinds import CollectiveKind, ParallelDim, Phase
from dml2comm.parallel.config import ParallelConfig
from dml2comm.parallel.expert import expert_flops_per_gpu
from dml2comm.model import FastEvaluator, supports

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).parent / "fixtures"
B, S, H, HEADS, L = 2, 64, 64, 8, 2
BYTES = 2  # bf16


@pytest.fixture(scope="module")
def gpt():
    model = zoo.build("gpt", layers=L, hidden=H, heads=HEADS, vocab=128, seq_len=S)
    return load_model_proto(model, ImportOptions(batch_size=B, seq_len=S), name="gpt-cp")


@pytest.fixture(scope="module")
def moe():
    model = zoo.build("moe", layers=L, hidden=H, heads=HEADS, kv_heads=2, ffn_hidden=128, experts=8, top_k=2, vocab=128, seq_len=S)
    return load_model_proto(model, ImportOptions(batch_size=B, seq_len=S), name="moe-ep")


def _analyse(imported, gpus_per_node=8, **kw):
    cfg = ParallelConfig(micro_batch_size=B, seq_len=S, **{"global_batch_size": B * kw.get("dp_size", 1) * 2, **kw})
    return analyze_graph(imported, cfg, make_cluster("a100", cfg.num_gpus, min(gpus_per_node, cfg.num_gpus)), advise=False)


def _accumulate(imported, a):
    """Per stage: seconds per micro-batch of the gradient-accumulation pass (its stage table)."""
    from dml2comm.cost.stages import StageCoster

    return StageCoster(imported, a.cluster, collapse=False).stage_table(a.config).accumulate


def _per_layer(a, dim, phase):
    out = Counter()
    for c in a.comms:
        if c.dim is dim and c.phase is phase:
            out[c.layer] += c.count_per_iteration // a.config.num_micro_batches
    return out


# ---- context parallelism: Ulysses


@pytest.mark.parametrize("c", [2, 4])
def test_ulysses_four_alltoalls_per_layer_each_way_of_bsh_over_c(gpt, c):
    a = _analyse(gpt, dp_size=1, cp_size=c, cp_scheme="ulysses")
    blocks = {l.index for l in a.layers if l.kind == "block"}
    cp = [x for x in a.comms if x.dim is ParallelDim.CP]
    assert cp and all(x.kind is CollectiveKind.ALL_TO_ALL and x.group_size == c for x in cp)
    assert _per_layer(a, ParallelDim.CP, Phase.FORWARD) == {li: 4 for li in blocks}
    assert _per_layer(a, ParallelDim.CP, Phase.BACKWARD) == {li: 4 for li in blocks}
    # each of b*s*h/c elements per GPU: 2*64*64/c * 2 bytes; (c-1)/c of it leaves the GPU
    for x in cp:
        assert x.message_bytes == B * S * H / c * BYTES
        assert x.bytes_sent_per_gpu == pytest.approx(x.message_bytes * (c - 1) / c)
        assert x.per_micro_batch and x.layer in blocks and x.after_op is not None


def test_ulysses_with_tensor_parallelism_splits_heads_t_times_c(gpt):
    a = _analyse(gpt, tp_size=2, cp_size=2)
    sizes = {x.message_bytes for x in a.comms if x.dim is ParallelDim.CP}
    assert sizes == {B * S * H / (2 * 2) * BYTES}


# ---- context parallelism: ring attention


@pytest.mark.parametrize("c", [2, 4])
def test_ring_attention_c_minus_1_kv_transfers_per_layer_per_direction(gpt, c):
    a = _analyse(gpt, cp_size=c, cp_scheme="ring")
    blocks = {l.index for l in a.layers if l.kind == "block"}
    cp = [x for x in a.comms if x.dim is ParallelDim.CP]
    assert all(x.kind is CollectiveKind.SEND_RECV and x.group_size == 2 for x in cp)
    assert _per_layer(a, ParallelDim.CP, Phase.FORWARD) == {li: c - 1 for li in blocks}
    assert _per_layer(a, ParallelDim.CP, Phase.BACKWARD) == {li: c - 1 for li in blocks}
    kv = 2 * B * S * H / c * BYTES  # the local K and V blocks
    assert {x.message_bytes for x in cp if x.phase is Phase.FORWARD} == {kv}
    assert {x.message_bytes for x in cp if x.phase is Phase.BACKWARD} == {2 * kv}  # K/V + dK/dV


def test_ring_hides_what_attention_covers(gpt):
    """Exposed ring time per micro-batch never exceeds the transfers' own time."""
    a = _analyse(gpt, cp_size=2, cp_scheme="ring")
    st = a.stages[0]
    raw = sum(x.time_s * x.count_per_iteration for x in a.comms if x.dim is ParallelDim.CP) / a.config.num_micro_batches
    added = (st.time_fwd_s - st.compute_fwd_s) + (st.time_bwd_s - st.compute_bwd_s)
    assert added <= raw + 1e-12


# ---- context parallelism: compute, activations, gradients, memory


@pytest.mark.parametrize("scheme", ["ulysses", "ring"])
def test_cp_activations_times_c_equal_the_unsplit_ones(gpt, scheme):
    base = _analyse(gpt)
    for c in (2, 4):
        a = _analyse(gpt, cp_size=c, cp_scheme=scheme)
        for s0, s1 in zip(base.stages, a.stages):
            assert s1.memory["activations_per_micro_batch_bytes"] * c == pytest.approx(s0.memory["activations_per_micro_batch_bytes"])
            assert s1.compute_fwd_s * c == pytest.approx(s0.compute_fwd_s)
            # the ops' backward splits c ways; the gradient-accumulation pass runs on the whole
            # local parameters, which context parallelism does not split
            acc0, acc1 = (_accumulate(gpt, x)[s0.index] for x in (base, a))
            assert acc0 == acc1 > 0
            assert (s1.compute_bwd_s - acc1) * c == pytest.approx(s0.compute_bwd_s - acc0)
            assert s1.flops_fwd == s0.flops_fwd  # the model's FLOPs do not change, only who does them


def test_cp_gradients_reduce_over_d_times_c(gpt):
    a = _analyse(gpt, dp_size=2, cp_size=2)
    dp = [x for x in a.comms if x.dim is ParallelDim.DP]
    assert dp and {x.group_size for x in dp} == {4}
    assert set(dp[0].group) == set(a.rank_map.dp_cp_group(0, 0))
    c1 = _analyse(gpt, dp_size=1, cp_size=2)
    assert {x.group_size for x in c1.comms if x.dim is ParallelDim.DP} == {2}  # CP alone still reduces gradients


def test_cp_shows_in_comm_by_dim_and_the_simulated_iteration(gpt):
    a = _analyse(gpt, cp_size=2)
    by = comm_by_dim(a)
    assert by["cp"]["count"] == sum(x.count_per_iteration for x in a.comms if x.dim is ParallelDim.CP) and by["cp"]["time_s"] > 0
    assert by["ep"]["count"] == 0
    assert a.summary["exposed_comm_time_s"] > 0
    assert a.config.to_dict()["c"] == 2 and a.config.to_dict()["cp_scheme"] == "ulysses"


def test_cp_checks_sequence_and_heads(gpt):
    with pytest.raises(ConfigError, match="does not divide the sequence length 64"):
        _analyse(gpt, cp_size=3)
    with pytest.raises(ConfigError, match="heads to divide by t x c"):
        _analyse(gpt, tp_size=2, cp_size=8)
    _analyse(gpt, tp_size=2, cp_size=8, cp_scheme="ring")  # ring has no heads constraint


# ---- expert parallelism


@pytest.mark.parametrize("e", [2, 4, 8])
def test_moe_dispatch_combine_volume(moe, e):
    a = _analyse(moe, dp_size=8, ep_size=e, gpus_per_node=4)
    ep = [x for x in a.comms if x.dim is ParallelDim.EP]
    moe_layers = {l.index for l in a.layers if l.kind == "block"}
    tokens, k = B * S, 2
    for phase in (Phase.FORWARD, Phase.BACKWARD):
        per_layer = Counter()
        for x in ep:
            if x.phase is phase:
                assert x.kind is CollectiveKind.ALL_TO_ALL and x.group_size == e
                per_layer[x.layer] += x.message_bytes * x.count_per_iteration / a.config.num_micro_batches
                # (e-1)/e of it on the wire
                assert x.bytes_sent_per_gpu == pytest.approx(x.message_bytes * (e - 1) / e)
        # dispatch + combine = 2 x tokens x top-k x hidden x bytes per layer per pass
        assert per_layer == {li: 2 * tokens * k * H * BYTES for li in moe_layers}


def test_capacity_factor_scales_alltoalls_and_expert_compute(moe):
    a = _analyse(moe, dp_size=2, ep_size=2)
    b = _analyse(moe, dp_size=2, ep_size=2, capacity_factor=1.25)
    ma = {x.message_bytes for x in a.comms if x.dim is ParallelDim.EP}
    mb = {x.message_bytes for x in b.comms if x.dim is ParallelDim.EP}
    assert {v * 1.25 for v in ma} == mb
    assert b.stages[0].compute_fwd_s > a.stages[0].compute_fwd_s


@settings(max_examples=60, deadline=None)
@given(experts_log=st.integers(0, 6), ep_log=st.integers(0, 6), tokens=st.integers(1, 1 << 16), k=st.integers(1, 8),
       flops=st.floats(1.0, 1e9), cf=st.sampled_from([1.0, 1.25, 2.0]))
def test_expert_flops_conserved_across_e(experts_log, ep_log, tokens, k, flops, cf):
    experts = 1 << experts_log
    ep = 1 << min(ep_log, experts_log)
    per_gpu = expert_flops_per_gpu(tokens, k, experts, ep, flops, cf)
    # the EP group does e GPUs' worth of routed tokens, whatever e
    assert per_gpu * ep == pytest.approx(ep * tokens * k * cf * flops, rel=1e-12)
    assert per_gpu == pytest.approx(expert_flops_per_gpu(tokens, k, experts, 1, flops, cf), rel=1e-12)


def test_expert_compute_per_gpu_does_not_change_with_e(moe):
    times = [_analyse(moe, dp_size=8, ep_size=e, gpus_per_node=8).stages[0].compute_fwd_s for e in (1, 2, 8)]
    assert times[1] == pytest.approx(times[0]) and times[2] == pytest.approx(times[0])


def test_expert_weights_and_states_sharded_by_e(moe):
    g = moe.graph
    expert = sum(t.numel for n, t in g.tensors.items() if t.is_weight and ".experts." in n)
    base = _analyse(moe, dp_size=8)
    for e in (2, 8):
        a = _analyse(moe, dp_size=8, ep_size=e)
        assert base.stages[0].params_per_gpu - a.stages[0].params_per_gpu == pytest.approx(expert * (1 - 1 / e))
        # expert gradients reduce over d*c/e ranks, the rest over d*c
        sizes = Counter(x.group_size for x in a.comms if x.dim is ParallelDim.DP)
        assert set(sizes) == ({8, 8 // e} if e < 8 else {8})
        assert a.stages[0].memory["weights_bytes"] < base.stages[0].memory["weights_bytes"]
    z1 = _analyse(moe, dp_size=8, ep_size=2, zero_stage=1)
    dense = base.stages[0].params_per_gpu - expert
    assert z1.stages[0].memory["optimizer_bytes"] == pytest.approx(12 * (dense / 8 + expert / 2 / 4))


# Tiny Mixtral fixtures: 2 layers, each with gate_up_proj [4, 256, 64] and down_proj [4, 64, 128]
MIXTRAL_PARAMS = 350_016  # torch's parameter count (tests/fixtures/fixtures_expected.json)
MIXTRAL_EXPERT_PARAMS = 2 * (4 * 256 * 64 + 4 * 64 * 128)  # 196,608


@pytest.mark.parametrize("exporter", ["legacy", "dynamo"])
def test_ep_on_the_real_mixtral_export(exporter):
    path = FIXTURES / f"mixtral_tiny_{exporter}.onnx"
    imported = load_model(path, ImportOptions(batch_size=2, seq_len=16))
    assert imported.graph.num_params == MIXTRAL_PARAMS
    cfg = ParallelConfig(dp_size=4, ep_size=4, micro_batch_size=2, global_batch_size=8, seq_len=16)
    a = analyze_graph(imported, cfg, make_cluster("a100", 4, 4), advise=False)
    ep = [x for x in a.comms if x.dim is ParallelDim.EP]
    # 2 MoE layers x (dispatch + combine) x (forward + backward); 32 tokens x top-2 x 64 hidden x 2 bytes
    assert len(ep) == 8 and {x.message_bytes for x in ep} == {32 * 2 * 64 * 2}
    assert comm_by_dim(a)["ep"]["count"] == 8 * a.config.num_micro_batches
    # every expert weight is found and sharded 4 ways: 350,016 - 196,608 x 3/4 = 202,560 per GPU
    assert a.stages[0].params_per_gpu == MIXTRAL_PARAMS - MIXTRAL_EXPERT_PARAMS * 3 / 4
    # expert gradients reduce over d/e = 1 rank (nothing to send), the other 153,408 over d = 4
    dp = [x for x in a.comms if x.dim is ParallelDim.DP]
    assert dp and {x.group_size for x in dp} == {4}
    assert sum(x.message_bytes for x in dp) == (MIXTRAL_PARAMS - MIXTRAL_EXPERT_PARAMS) * 2


def test_find_moe_follows_views_to_the_expert_weights():
    """An expert MatMul reading a slice of a stacked [E, h, f] weight taken outside the experts
    scope still owns that weight; E and top-k come from the router's TopK, h from its weight."""
    from onnx import TensorProto, helper

    from dml2comm.parallel.expert import find_moe
    from tests.helpers import model, weight

    i64 = lambda name, values: helper.make_tensor(name, TensorProto.INT64, [len(values)], values)  # noqa: E731
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8, 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8, 32])
    nodes = [
        helper.make_node("MatMul", ["x", "gate.w"], ["logits"], name="/model/layers.0/mlp/gate/MatMul"),
        helper.make_node("TopK", ["logits", "k"], ["top_v", "top_i"], name="/model/layers.0/mlp/TopK"),
        helper.make_node("Slice", ["stacked", "s0", "s1", "ax"], ["w_s"], name="/model/layers.0/mlp/Slice"),
        helper.make_node("Squeeze", ["w_s", "ax"], ["w"], name="/model/layers.0/mlp/Squeeze"),
        helper.make_node("MatMul", ["x", "w"], ["ye"], name="/model/layers.0/mlp/experts/MatMul"),
        # the routing weights scale the expert's output (so the router gets a gradient)
        helper.make_node("ReduceSum", ["top_v", "last"], ["r"], name="/model/layers.0/mlp/ReduceSum", keepdims=1),
        helper.make_node("Mul", ["ye", "r"], ["y"], name="/model/layers.0/mlp/Mul"),
    ]
    inits = [weight("gate.w", [16, 4]), weight("stacked", [4, 16, 32]), i64("k", [2]), i64("s0", [0]), i64("s1", [1]), i64("ax", [0]),
             i64("last", [-1])]
    g = load_model_proto(model(nodes, [x], [y], inits)).graph
    assert g.num_params == 16 * 4 + 4 * 16 * 32
    moe = find_moe(g, [0] * len(g.ops))
    assert moe is not None and (moe.experts, moe.top_k, moe.hidden) == (4, 2, 16)
    assert moe.expert_weights == {"stacked"}


def test_ep_checks(moe, gpt):
    with pytest.raises(ConfigError, match="does not divide the 8 experts"):
        _analyse(moe, dp_size=3, ep_size=3)
    with pytest.raises(ConfigError, match="no experts"):
        _analyse(gpt, dp_size=2, ep_size=2)
    with pytest.raises(ConfigError, match="must divide d x c"):
        ParallelConfig(dp_size=2, ep_size=4, global_batch_size=2)
    ParallelConfig(dp_size=2, cp_size=2, ep_size=4, global_batch_size=2)  # e divides d*c


# ---- rank map


def test_rank_order_with_cp_and_ep_groups():
    rm = RankMap(dp=2, tp=2, pp=2, cp=2, ep=4)
    assert rm.world_size == 16
    # Megatron-Core tp-cp-ep-dp-pp: rank = t + 2 (c + 2 (d + 2 p))
    assert rm.rank(1, 1, 1, 1) == 1 + 2 * (1 + 2 * (1 + 2 * 1))
    assert rm.cp_group(0, 0, 0) == (0, 2) and rm.tp_group(0, 0, 1) == (2, 3)
    assert rm.dp_cp_group(0, 0) == (0, 2, 4, 6)
    assert rm.ep_group(0, 0) == (0, 2, 4, 6) and rm.expert_dp_group(0, 0) == (0,)
    assert sorted(r for g in rm.cp_groups() for r in g) == list(range(16))
    assert sorted(r for g in rm.ep_groups() for r in g) == list(range(16))
    assert all(rm.cp_rank(rm.rank(d, p, t, c)) == c for d in range(2) for p in range(2) for t in range(2) for c in range(2))
    rm2 = RankMap(dp=4, tp=1, pp=1, cp=1, ep=2)
    assert list(rm2.ep_groups()) == [(0, 1), (2, 3)] and rm2.expert_dp_group(0, 0, 1) == (1, 3)
    assert RankMap(2, 2, 2).rank(1, 1, 1) == RankMap(2, 2, 2, cp=1).rank(1, 1, 1, 0)  # unchanged without CP


def test_cp_group_inside_a_node_uses_nvlink(gpt):
    a = _analyse(gpt, dp_size=4, cp_size=2, gpus_per_node=4)
    cp_links = {x.link for x in a.comms if x.dim is ParallelDim.CP}
    dp_links = {x.link for x in a.comms if x.dim is ParallelDim.DP}
    assert cp_links and cp_links != dp_links  # CP (2 GPUs, adjacent ranks) stays in the node, DP (8) crosses nodes


# ---- the sweep's fast path (dml2comm.model) with context and expert parallelism
#
# The batched simulation the fast path uses (dml2comm.sim.levels) queues a device's sends on its
# pp stream as the engine does (tests/test_sim.py; a send-bound sweep in tests/test_search.py),
# so the two agree to rounding on any cluster.
BREAKDOWN = ("compute_time_s", "bubble_time_s", "exposed_comm_time_s", "optimizer_time_s", "bubble_fraction", "mfu")


def _dgx(num_gpus):
    return dataclasses.replace(get_cluster("dgx-a100", num_gpus), collective_overhead_s=0.0)


def _grid(d, t, p, combos, zeros=(0, 1), **kw):
    """Every (c, scheme, e) of ``combos`` x recomputation x ZeRO ``zeros`` x 1F1B/interleaved (m = 4)."""
    out = []
    for (cp, scheme, ep), rec, zero, (schedule, v) in itertools.product(
            combos, ("none", "selective", "full"), zeros, (("1f1b", 1), ("interleaved", 2))):
        out.append(ParallelConfig(dp_size=d, tp_size=t, pp_size=p, cp_size=cp, cp_scheme=scheme, ep_size=ep, micro_batch_size=B,
                                  seq_len=S, global_batch_size=B * d * 4, recompute=rec, zero_stage=zero, schedule=schedule,
                                  virtual_stages=v, **kw))
    return out


def _fast_equals_full(imported, configs):
    """FastEvaluator's numbers against analyze_graph's, configuration by configuration."""
    assert configs
    by_size: dict[int, list[ParallelConfig]] = {}
    for config in configs:
        assert supports(config), config
        by_size.setdefault(config.num_gpus, []).append(config)
    for n, group in by_size.items():
        cluster = _dgx(n)
        fast = FastEvaluator(imported, cluster)
        for config, row in zip(group, fast.evaluate(group)):
            full = analyze_graph(imported, config, cluster, advise=False, timeline=False).summary
            assert row["error"] is None, (config, row["error"])
            assert row["iteration_time_s"] == pytest.approx(full["iteration_time_s"], rel=1e-9), config
            assert row["peak_memory_bytes"] == full["peak_memory_bytes"], config
            for key in BREAKDOWN:
                assert row[key] == pytest.approx(full[key], rel=1e-9, abs=1e-15), (key, config)
            assert row["fits_in_memory"] == full["fits_in_memory"]


def test_fast_path_covers_cp_ep_and_capacity_factor():
    for kw in ({"cp_size": 2}, {"cp_size": 4, "cp_scheme": "ring"}, {"dp_size": 2, "ep_size": 2},
               {"dp_size": 2, "cp_size": 2, "ep_size": 4, "zero_stage": 1}, {"capacity_factor": 1.25}):
        assert supports(ParallelConfig(global_batch_size=4, **kw)), kw
    # issue 17: ZeRO-2/3 and --tp-comm-overlap too
    assert supports(ParallelConfig(dp_size=2, cp_size=2, zero_stage=2, global_batch_size=4))
    assert supports(ParallelConfig(tp_size=2, cp_size=2, sequence_parallel=True, tp_comm_overlap=True, global_batch_size=4))


def test_fast_path_equals_the_analysis_with_cp_ep_and_zero_2_3(gpt, moe):
    """Issue 17: ZeRO-2/3 with context parallelism (the d x c group shards the states and
    carries the per-micro-batch collectives), with expert parallelism (the expert stream's
    reduce-scatters and all-gathers over d x c / e queue on the same dp stream after the dense
    ones), and --tp-comm-overlap with c = 2."""
    cp = _grid(2, 2, 2, [(2, "ulysses", 1), (2, "ring", 1)], zeros=(2, 3))
    overlap = _grid(2, 2, 2, [(2, "ring", 1)], zeros=(0, 3), sequence_parallel=True, tp_comm_overlap=True)
    _fast_equals_full(gpt, cp + overlap)
    _fast_equals_full(moe, _grid(4, 1, 2, [(1, "ulysses", 2), (1, "ulysses", 4), (2, "ring", 4)], zeros=(2, 3)))


def test_fast_path_equals_the_analysis_with_context_parallelism(gpt):
    """c = 1, 2, 4, Ulysses and ring, with t = 2 (TP messages 1/c) on up to 4 DGX nodes; c
    without d (the d x c gradient reduction and its bucket); a ring whose wrap-around hop
    crosses nodes (rank order "dtp": the CP group is 0, 4, 8, 12; the slower hop counts)."""
    combos = [(1, "ulysses", 1)] + [(c, scheme, 1) for c in (2, 4) for scheme in ("ulysses", "ring")]
    configs = _grid(2, 2, 2, combos) + _grid(1, 2, 2, [(2, "ulysses", 1), (4, "ring", 1)])[::2]
    spread = [dataclasses.replace(c, rank_order="dtp") for c in _grid(2, 2, 2, [(4, "ring", 1)])]
    assert RankMap(2, 2, 2, "dtp", cp=4).cp_group(0, 0, 0) == (0, 4, 8, 12)
    _fast_equals_full(gpt, configs + spread)


def test_fast_path_equals_the_analysis_with_expert_parallelism(moe):
    """e = 1, 2, 4 (8 with c = 2) alone and with c = 2 (both schemes): expert weights 1/e, the
    d x c and expert-data-parallel bucket streams, the MoE AllToAlls."""
    combos = [(1, "ulysses", e) for e in (1, 2, 4)] + [(2, scheme, e) for scheme in ("ulysses", "ring") for e in (1, 2, 4, 8)]
    _fast_equals_full(moe, _grid(4, 1, 2, combos))


def test_fast_path_equals_the_analysis_on_rank_orders_and_capacity_factors(moe):
    """Rank orders that put t between d and c make the d x c group no arithmetic progression
    (placed by its ranks); a capacity factor scales expert ops with and without e."""
    rm = RankMap(2, 2, 2, "dtp", cp=2, ep=2)
    group = rm.dp_cp_group(0, 0)
    assert len({b - a for a, b in zip(group, group[1:])}) > 1  # not a progression
    configs = [dataclasses.replace(c, rank_order=order) for order in ("dtp", "pdt", "tdp", "cdtp")
               for c in _grid(2, 2, 2, [(2, "ring", 2), (2, "ulysses", 4)])[::3]]
    configs += _grid(2, 1, 2, [(1, "ulysses", 1), (1, "ulysses", 2), (2, "ring", 4)], capacity_factor=1.25)[::2]
    _fast_equals_full(moe, configs)


def test_fast_path_with_cp_and_ep_on_collapsed_blocks():
    """Eight MoE blocks collapse to four: CP/EP counts, attention cores and expert parameters
    are read per full layer through the layer map."""
    model = zoo.build("moe", layers=8, hidden=H, heads=HEADS, kv_heads=2, ffn_hidden=128, experts=8, top_k=2, vocab=128, seq_len=S)
    imported = load_model_proto(model, ImportOptions(batch_size=B, seq_len=S), name="moe-deep")
    fast = FastEvaluator(imported, _dgx(8))
    assert fast.collapsed is not None and len(fast.layered.layers) < len(fast.layer_map)
    combos = [(1, "ulysses", 4), (2, "ring", 2), (2, "ulysses", 8)]
    _fast_equals_full(imported, [c for c in _grid(4, 1, 4, combos) if c.recompute != "selective"])


def test_sweep_with_cp_and_ep_fast_equals_full(tmp_path):
    """Through run_sweep: the collapsed model re-imported for a second micro-batch size (the
    sweep's reduced ONNX model) keeps its experts and attention; every row equals the full run's."""
    from dml2comm.search.space import Constraints
    from dml2comm.search.sweep import SweepSpace, run_sweep

    path = tmp_path / "moe8.onnx"
    zoo.save(zoo.build("moe", layers=8, hidden=H, heads=HEADS, kv_heads=2, ffn_hidden=128, experts=8, top_k=2, vocab=128,
                       seq_len=S), path)
    constraints = Constraints(micro_batch_sizes=(1, 2), virtual_stages=(1,), zero_stages=(0, 1), recompute=("full",),
                              sequence_parallel=(False,), t=(1,), p=(2,), cp=(1, 2), ep=(1, 2, 4), cp_scheme="ring")
    space = SweepSpace(global_batch_size=16, constraints=constraints)
    full = run_sweep(str(path), 8, _dgx, space, fast=False)
    quick = run_sweep(str(path), 8, _dgx, space, fast=True)
    assert len(full.rows) == len(quick.rows) == 24
    assert {(r["config"]["c"], r["config"]["e"]) for r in quick.rows} >= {(2, 4), (1, 4), (2, 1)}
    for a, b in zip(full.rows, quick.rows):
        assert a["config"] == b["config"] and a["error"] == b["error"] is None
        assert b["iteration_time_s"] == pytest.approx(a["iteration_time_s"], rel=1e-9)
        assert b["peak_memory_bytes"] == a["peak_memory_bytes"]
        for key in BREAKDOWN:
            assert b[key] == pytest.approx(a[key], rel=1e-9, abs=1e-15), key


def test_fast_path_cp_ep_errors_are_the_analysis_errors(gpt, moe):
    cases = [(gpt, {"cp_size": 3}), (gpt, {"tp_size": 2, "cp_size": 8}), (moe, {"dp_size": 3, "ep_size": 3}),
             (gpt, {"dp_size": 2, "ep_size": 2})]
    for imported, kw in cases:
        config = ParallelConfig(micro_batch_size=B, seq_len=S, global_batch_size=B * kw.get("dp_size", 1) * 2, **kw)
        cluster = _dgx(config.num_gpus)
        row = FastEvaluator(imported, cluster).evaluate([config])[0]
        with pytest.raises(ConfigError) as info:
            analyze_graph(imported, config, cluster, advise=False)
        assert row["error"] == " ".join(str(info.value).split())


# ---- command line


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / "main.py"), *args], cwd=cwd, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("cpep")
    onnx.save(zoo.build("gpt", layers=1, hidden=H, heads=HEADS, vocab=128, seq_len=S), d / "gpt.onnx")
    onnx.save(zoo.build("moe", layers=1, hidden=H, heads=HEADS, kv_heads=2, ffn_hidden=128, experts=4, top_k=2, vocab=128, seq_len=S),
              d / "moe.onnx")
    return d


@pytest.mark.parametrize("model, args, pattern", [
    ("gpt.onnx", ["--cp", "3"], "does not divide the sequence length"),
    ("gpt.onnx", ["--cp", "16", "--seq-len", "64"], "heads to divide by t x c"),
    ("moe.onnx", ["--d", "3", "--ep", "3"], "does not divide the 4 experts"),
    ("gpt.onnx", ["--d", "2", "--ep", "2"], "no experts"),
    ("gpt.onnx", ["--ep", "2"], "must divide d x c"),
])
def test_cli_errors_one_line_exit_2_nothing_written(models, model, args, pattern):
    out = models / "out"
    result = _run(str(models / model), *args, "--out", str(out), cwd=models)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and pattern in lines[0], result.stderr
    assert not out.exists() or not list(out.iterdir())


def test_cli_cp_ep_data_json(models):
    out = models / "ok"
    result = _run(str(models / "moe.onnx"), "--d", "2", "--cp", "2", "--cp-scheme", "ring", "--ep", "4", "--no-site", "--no-advice",
                  "--out", str(out), cwd=models)
    assert result.returncode == 0, result.stderr
    data = json.loads((out / "data.json").read_text())
    assert data["cluster"]["num_gpus"] == 4
    assert data["config"]["c"] == 2 and data["config"]["e"] == 4 and data["config"]["cp_scheme"] == "ring"
    assert data["comm_by_dim"]["cp"]["count"] > 0 and data["comm_by_dim"]["ep"]["count"] > 0
    assert {c["dim"] for c in data["collectives"]} >= {"cp", "ep", "dp"}


def test_cli_ep_on_the_dynamo_mixtral_export(tmp_path):
    out = tmp_path / "out"
    result = _run(str(FIXTURES / "mixtral_tiny_dynamo.onnx"), "--d", "2", "--ep", "2", "--seq-len", "16", "--no-site", "--no-advice",
                  "--out", str(out), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    data = json.loads((out / "data.json").read_text())
    assert data["config"]["e"] == 2 and data["model"]["params"] == MIXTRAL_PARAMS
    assert data["comm_by_dim"]["ep"]["count"] == 8 and data["comm_by_dim"]["ep"]["message_bytes"] > 0
    # b = 1: 16 tokens x top-2 x 64 hidden x 2 bytes per AllToAll
    assert {c["message_bytes"] for c in data["collectives"] if c["dim"] == "ep"} == {16 * 2 * 64 * 2}


def test_site_draws_cp_and_ep_groups_and_layer_level_collectives(moe):
    from dml2comm.render.dot import all_drawings
    from dml2comm.render.facts import Facts

    a = _analyse(moe, dp_size=2, tp_size=2, cp_size=2, ep_size=4)
    facts = Facts.of(a)
    names = {d.name for d in all_drawings(facts, 4)}
    assert {"gpu_comm_cp_0", "gpu_comm_ep_0", "gpu_comm_tp_0"} <= names
    cp_dot = next(d for d in all_drawings(facts, 4) if d.name == "gpu_comm_cp_0").dot
    for r in a.rank_map.cp_group(0, 0, 0):
        assert f"GPU {r}" in cp_dot
    # CP and EP collectives are drawn at layer level with the layer's other collectives
    blocks = [l.index for l in a.layers if l.kind == "block"]
    dims = {c.dim for li in blocks for c in facts.tp_by_layer.get(li, ())}
    assert dims == {ParallelDim.TP, ParallelDim.CP, ParallelDim.EP}
    assert {c.dim for c in facts.cp_by_stage.get(0, ())} == {ParallelDim.CP} and {c.dim for c in facts.ep_by_stage.get(0, ())} == {ParallelDim.EP}
