"""Issue 17: the analysis and the sweep read one cost model.

The analysis's stages are the :class:`dml2comm.cost.stages.StagePlan` the sweep simulates (not a
second computation kept equal by tolerance), the comm nodes drawn on the site add up to the stage
times they stand for, and the breakdown has one definition (:mod:`dml2comm.cost.summary`)."""

from __future__ import annotations

import numpy as np
import pytest

from dml2comm import zoo
from dml2comm.analysis import analyze_graph
from dml2comm.cost.stages import StageCoster
from dml2comm.cost.summary import breakdown
from dml2comm.hardware.cluster import make_cluster
from dml2comm.ir.onnx_import import ImportOptions
from dml2comm.load import load_model
from dml2comm.network.kinds import ParallelDim, Phase
from dml2comm.parallel.config import ParallelConfig, Recompute, Schedule


@pytest.fixture(scope="module")
def gpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("gpt") / "gpt.onnx"
    zoo.save(zoo.build_gpt(layers=6, hidden=512, heads=8, vocab=8192, seq_len=256), path)
    return load_model(str(path), ImportOptions(batch_size=2))


CONFIGS = [
    dict(dp_size=2, tp_size=2, pp_size=2, global_batch_size=16),
    dict(dp_size=2, tp_size=2, pp_size=2, global_batch_size=16, zero_stage=3, sequence_parallel=True, tp_comm_overlap=True),
    dict(dp_size=1, tp_size=1, pp_size=4, global_batch_size=16, schedule="interleaved", virtual_stages=2, recompute="full"),
    dict(dp_size=2, tp_size=1, pp_size=2, cp_size=2, global_batch_size=8, cp_scheme="ring", recompute="selective"),
]


@pytest.mark.parametrize("kw", CONFIGS)
def test_the_analysis_stages_are_the_stage_plan_bit_for_bit(gpt, kw):
    """Every stage number of the analysis is the stage plan's value, not a recomputation."""
    config = ParallelConfig(micro_batch_size=2, **kw)
    cluster = make_cluster("a100", config.num_gpus, 4)
    a = analyze_graph(gpt, config, cluster, advise=False)
    plan = StageCoster(gpt, cluster, collapse=False).prepare(config)
    for s, st in enumerate(a.stages):
        assert st.time_fwd_s == plan.fwd[s] and st.time_bwd_s == plan.bwd[s]
        assert st.compute_fwd_s == plan.compute_f[s] and st.compute_bwd_s == plan.compute_b[s]
        assert st.optimizer_time_s == plan.optimizer[s]
        assert st.memory["total_bytes"] == plan.total_memory[s]
    assert a.memory["peak_bytes"] == plan.peak_memory


@pytest.mark.parametrize("kw", [CONFIGS[0], CONFIGS[3]])
def test_drawn_comm_nodes_add_up_to_the_stage_times(gpt, kw):
    """The site's comm nodes (expanded from the same collective specs, costed on their ranks) sum
    per stage to the plan's TP/CP and send times (no --tp-comm-overlap, Ulysses or ring steps
    counted as the plan counts them)."""
    config = ParallelConfig(micro_batch_size=2, **kw)
    cluster = make_cluster("a100", config.num_gpus, 4)
    a = analyze_graph(gpt, config, cluster, advise=False)
    plan = StageCoster(gpt, cluster, collapse=False).prepare(config)
    m = config.num_micro_batches
    for s in range(config.pp_size):
        sends = sum(c.time_s * c.count_per_iteration / m for c in a.comms
                    if c.stage == s and c.dim is ParallelDim.PP and c.per_micro_batch and c.phase is Phase.FORWARD)
        assert sends == pytest.approx(plan.send_f[s], rel=1e-12)
        if config.cp_size == 1:
            tp = sum(c.time_s * c.count_per_iteration / m for c in a.comms
                     if c.stage == s and c.dim is ParallelDim.TP and c.phase is Phase.FORWARD)
            assert tp == pytest.approx(plan.tp_f[s], rel=1e-12)


@pytest.mark.parametrize("kw", [CONFIGS[1], CONFIGS[3],
                                dict(dp_size=2, tp_size=2, pp_size=2, cp_size=2, global_batch_size=16, cp_scheme="ulysses",
                                     zero_stage=1, sequence_parallel=True)])
def test_comm_nodes_take_the_plans_prices(gpt, kw):
    """One pricing of communication: every comm node's seconds are the stage coster's price of
    its collective on its group (the cache the plan's stage times are read from), the
    data-parallel nodes are the plan's own priced specs (their sums are the plan's bucket runs,
    the collective after the step and the ZeRO-3 per-micro-batch terms), and with context
    parallelism the TP and Ulysses nodes add up to the plan's critical-path collectives."""
    config = ParallelConfig(micro_batch_size=2, **kw)
    cluster = make_cluster("a100", config.num_gpus, 4)
    a = analyze_graph(gpt, config, cluster, advise=False)
    coster = StageCoster(gpt, cluster, collapse=False)
    plan = coster.prepare(config)
    for c in a.comms:
        assert c.time_s == coster.price(c.kind, c.group, c.message_bytes) + c.host_s, c
    m = config.num_micro_batches
    for s in range(config.pp_size):
        dp = [c for c in a.comms if c.stage == s and c.dim is ParallelDim.DP]
        buckets = sum(c.time_s * c.count_per_iteration for c in dp if not c.per_micro_batch and c.phase is Phase.BACKWARD)
        assert buckets == pytest.approx(float((plan.runs_tau[s] * plan.runs_count[s]).sum()), rel=1e-12)
        after = sum(c.time_s * c.count_per_iteration for c in dp if c.phase is Phase.OPTIMIZER)
        assert after == pytest.approx(float(plan.after_step[s]), rel=1e-12)
        if plan.zero_mb is not None:
            fwd = sum(c.time_s * c.count_per_iteration / m for c in dp if c.per_micro_batch and c.phase is Phase.FORWARD)
            assert fwd == pytest.approx(float(plan.zero_mb[s, 0]), rel=1e-12) and fwd > 0
        if config.cp_scheme == "ulysses" and config.cp_size > 1:
            on_path = sum(c.time_s * c.count_per_iteration / m for c in a.comms
                          if c.stage == s and c.dim in (ParallelDim.TP, ParallelDim.CP) and c.phase is Phase.FORWARD)
            assert on_path == pytest.approx(float(plan.tp_f[s]), rel=1e-12)


def test_equally_busy_stages_name_the_first_as_the_busiest():
    # two stages with the same work up to summation noise (1e-16): stage 0, not whichever
    # rounding happened to make larger; a real difference (1e-6) still wins
    busy = np.array([[1.0, 1.0 + 2e-16, 0.5], [1.0, 1.0 + 1e-6, 0.5]])
    end = np.array([[3.0, 3.0, 3.0], [3.0, 3.0, 3.0]])
    parts = breakdown(np.array([4.0, 4.0]), np.array([3.5, 3.5]), end, busy)
    assert parts.critical_stage.tolist() == [0, 1]
    # the parts add up to the iteration: compute + bubble + exposed + optimizer
    total = parts.compute_s + parts.bubble_s + parts.exposed_comm_s + parts.optimizer_s
    assert total.tolist() == pytest.approx([4.0, 4.0])


def test_flag_strings_become_enums_and_print_as_flags():
    c = ParallelConfig(pp_size=2, global_batch_size=4, schedule="interleaved", virtual_stages=2, recompute="full")
    assert c.schedule is Schedule.INTERLEAVED and c.recompute is Recompute.FULL
    assert f"{c.schedule} {c.recompute}" == "interleaved full" and c.to_dict()["schedule"] == "interleaved"
    assert c.chunks == 2 and ParallelConfig(virtual_stages=3).chunks == 1  # v only counts when interleaved


def test_one_typed_summary_for_the_analysis_the_sweep_and_data_json(gpt):
    """The analysis's summary and the sweep evaluator's rows are the same Summary type built by one
    function (cost.summary.summary_of): equal on every field both have, TFLOP/s included (it had a
    third copy in sweep.py), and data.json's summary block is its dict."""
    import json

    from dml2comm.cost.summary import Summary
    from dml2comm.export.report import report_json
    from dml2comm.model import FastEvaluator

    config = ParallelConfig(micro_batch_size=2, dp_size=2, tp_size=2, pp_size=2, global_batch_size=16)
    cluster = make_cluster("a100", config.num_gpus, 4)
    a = analyze_graph(gpt, config, cluster, advise=False)
    row = FastEvaluator(gpt, cluster, collapse=False).evaluate([config])[0]
    assert isinstance(a.summary, Summary) and isinstance(row, Summary)
    for name in ("iteration_time_s", "compute_time_s", "bubble_fraction", "optimizer_time_s", "mfu", "tflops_per_gpu",
                 "tokens_per_s", "peak_memory_bytes", "fits_in_memory", "critical_stage"):
        assert row[name] == pytest.approx(a.summary[name], rel=1e-9), name
    assert row.bottleneck is None and a.summary.bottleneck and a.summary.expected_error > 0
    # tokens/s = B s / T; TFLOP/s per GPU = 3 x forward FLOPs per sample x B / (T x GPUs)
    t = a.summary.iteration_time_s
    assert a.summary.tokens_per_s == pytest.approx(16 * 256 / t)
    assert a.summary.tflops_per_gpu == pytest.approx(3 * a.model_info["flops_fwd_per_sample"] * 16 / (t * 8) / 1e12)
    assert json.loads(report_json(a))["summary"] == json.loads(json.dumps(a.summary.to_dict()))
    with pytest.raises(KeyError):
        a.summary["iteration"]  # noqa: B018 - a mapping of its fields only
