"""One enumeration of a configuration's collectives (:meth:`StageCoster.comm_specs`).

The analysis's comm nodes (what the site draws and data.json lists) are the stage coster's
specs, described -- not a second walk of the graph -- and the specs add up to the stage times the
sweep reads on the collapsed graph, whose count tables aggregate the same per-layer records."""

from __future__ import annotations

from collections import Counter

import pytest

from dml2comm import zoo
from dml2comm.analysis import analyze_graph
from dml2comm.cost.stages import StageCoster
from dml2comm.hardware.cluster import make_cluster
from dml2comm.ir.onnx_import import ImportOptions
from dml2comm.load import load_model_proto
from dml2comm.network.kinds import CollectiveKind, ParallelDim, Phase
from dml2comm.parallel.config import ParallelConfig

S = 64


@pytest.fixture(scope="module")
def models():
    """A tied-embedding GPT of 8 blocks (its middle blocks collapse) and a small MoE."""
    gpt = zoo.build("gpt", layers=8, hidden=64, heads=8, vocab=128, seq_len=S)
    moe = zoo.build("moe", layers=4, hidden=64, heads=8, kv_heads=2, ffn_hidden=128, experts=8, top_k=2, vocab=128, seq_len=S)
    return {"gpt": load_model_proto(gpt, ImportOptions(batch_size=2, seq_len=S), name="gpt-specs"),
            "moe": load_model_proto(moe, ImportOptions(batch_size=2, seq_len=S), name="moe-specs")}


CASES = [
    ("gpt", dict(dp_size=2, tp_size=2, pp_size=2, global_batch_size=16)),
    ("gpt", dict(dp_size=2, tp_size=2, pp_size=4, global_batch_size=16, zero_stage=3, sequence_parallel=True)),
    ("gpt", dict(dp_size=2, tp_size=2, pp_size=2, global_batch_size=16, async_tp_allreduce=True, tp_comm_overlap=False)),
    ("gpt", dict(dp_size=1, tp_size=2, pp_size=2, cp_size=2, global_batch_size=8, cp_scheme="ulysses", zero_stage=1)),
    ("gpt", dict(dp_size=2, tp_size=1, pp_size=2, cp_size=2, global_batch_size=8, cp_scheme="ring")),
    ("moe", dict(dp_size=4, tp_size=1, pp_size=2, ep_size=2, global_batch_size=16)),
    ("moe", dict(dp_size=2, tp_size=2, pp_size=2, ep_size=2, global_batch_size=16, zero_stage=2)),
]


def _config(kw):
    return ParallelConfig(micro_batch_size=2, seq_len=S, **kw)


@pytest.mark.parametrize("name,kw", CASES)
def test_the_comm_nodes_are_the_stage_coster_specs(models, name, kw):
    """Same count, same order, same fields: a node is its spec with a description (and a
    divergence in any (kind, dim, stage, bytes, count) fails the multiset check too)."""
    config = _config(kw)
    cluster = make_cluster("a100", config.num_gpus, 4)
    a = analyze_graph(models[name], config, cluster, advise=False)
    specs = StageCoster(models[name], cluster, collapse=False).comm_specs(config)
    assert len(a.comms) == len(specs) > 0
    assert (Counter((c.kind, c.dim, c.stage, c.message_bytes, c.count_per_iteration) for c in a.comms)
            == Counter((s.kind, s.dim, s.stage, float(s.message_bytes), s.count) for s in specs))
    for node, spec in zip(a.comms, specs):
        assert (node.kind, node.dim, node.phase, node.stage, node.layer, node.after_op, node.tensor, node.group,
                node.message_bytes, node.count_per_iteration, node.per_micro_batch, node.reason, node.host_s) == (
            spec.kind, spec.dim, spec.phase, spec.stage, spec.layer, spec.after_op, spec.tensor, spec.group,
            float(spec.message_bytes), spec.count, spec.per_micro_batch, spec.reason, spec.host_s)
        assert node.time_s == spec.seconds + spec.host_s
    dims = {c.dim for c in specs}
    assert ParallelDim.PP in dims and (config.ep_size == 1 or ParallelDim.EP in dims)
    assert config.cp_size == 1 or ParallelDim.CP in dims


def _per_mb(specs, s, m, phase, dims):
    return sum((c.seconds + c.host_s) * c.count / m for c in specs
               if c.stage == s and c.per_micro_batch and c.phase is phase and c.dim in dims)


@pytest.mark.parametrize("name,kw", [CASES[0], CASES[1], CASES[3], CASES[5], CASES[6]])
def test_the_specs_add_up_to_the_sweeps_stage_times(models, name, kw):
    """The whole graph's specs sum, stage by stage, to the plan the sweep builds on the collapsed
    graph: pipeline sends both ways (host time included), the collectives on the critical path
    (TP, Ulysses, MoE AllToAlls; no overlap, and no asynchronous TP all-reduce, configured), the tied-weight all-reduces and the
    data-parallel buckets."""
    config = _config(dict(kw, async_tp_allreduce=False))  # the drawn nodes show a collective's full time
    cluster = make_cluster("a100", config.num_gpus, 4)
    specs = StageCoster(models[name], cluster, collapse=False).comm_specs(config)
    sweep = StageCoster(models[name], cluster)
    plan = sweep.prepare(config)
    assert name != "gpt" or sweep.collapsed is not None  # the sweep's collapsed tables
    m = config.num_micro_batches
    on_path = (ParallelDim.TP, ParallelDim.CP, ParallelDim.EP)
    tied = [c for c in specs if c.dim is ParallelDim.PP and c.phase is Phase.OPTIMIZER]
    assert name != "gpt" or tied  # the GPT's LM head reads the embedding: a held copy
    for s in range(config.pp_size):
        assert _per_mb(specs, s, m, Phase.FORWARD, (ParallelDim.PP,)) == pytest.approx(plan.send_f[s], rel=1e-12)
        assert _per_mb(specs, s, m, Phase.BACKWARD, (ParallelDim.PP,)) == pytest.approx(plan.send_b[s], rel=1e-12)
        assert _per_mb(specs, s, m, Phase.FORWARD, on_path) == pytest.approx(plan.tp_f[s], rel=1e-12)
        assert _per_mb(specs, s, m, Phase.BACKWARD, on_path) == pytest.approx(plan.tp_b[s], rel=1e-12)
        assert sum(c.seconds * c.count for c in tied if c.stage == s) == pytest.approx(plan.tied[s], rel=1e-12)
        buckets = sum(c.seconds * c.count for c in specs if c.stage == s and c.dim is ParallelDim.DP
                      and not c.per_micro_batch and c.phase is Phase.BACKWARD)
        assert buckets == pytest.approx(float((plan.runs_tau[s] * plan.runs_count[s]).sum()), rel=1e-12)


def test_the_async_tp_note_and_the_ring_step_come_with_the_specs(models):
    """What only the analysis used to add is in the spec: the asynchronous TP all-reduce's note
    on the collectives its weight gradient hides, and a ring step on its slower hop."""
    config = _config(CASES[2][1])
    cluster = make_cluster("a100", config.num_gpus, 4)
    specs = StageCoster(models["gpt"], cluster, collapse=False).comm_specs(config)
    hidden = [c for c in specs if c.dim is ParallelDim.TP and "asynchronous TP all-reduce" in c.reason]
    assert hidden and all(c.phase is Phase.BACKWARD for c in hidden)
    config = _config(CASES[4][1])
    coster = StageCoster(models["gpt"], cluster, collapse=False)
    rank_map = coster.stage_table(config).rank_map
    ring = [c for c in coster.comm_specs(config) if c.dim is ParallelDim.CP]
    assert ring
    for c in ring:
        g = rank_map.cp_group(0, c.stage, 0)
        assert c.kind is CollectiveKind.SEND_RECV and c.group in ((g[0], g[1]), (g[-1], g[0]))
        assert c.seconds == max(coster.price(c.kind, pair, c.message_bytes) for pair in ((g[0], g[1]), (g[-1], g[0])))


def test_the_sweeps_coster_builds_no_per_op_specs(models):
    """The enumeration is for the whole graph only: the collapsed coster refuses it."""
    config = _config(CASES[0][1])
    coster = StageCoster(models["gpt"], make_cluster("a100", config.num_gpus, 4))
    coster.prepare(config)
    with pytest.raises(ValueError, match="whole graph"):
        coster.comm_specs(config)


def test_stage_tables_are_per_split_and_forgotten_with_the_graph(models):
    """:meth:`StageCoster.stage_table`'s look-up: configurations differing only in what the
    table holds no term for share it; any field of its key (the stack, the gradient dtype, the
    bucket, the optimizer, ...) gives another; and a coster that changes graph (``_use``)
    builds its tables again."""
    cluster = make_cluster("a100", 8, 4)
    coster = StageCoster(models["gpt"], cluster, collapse=False)  # eager PyTorch needs the whole graph
    base = _config(dict(dp_size=2, tp_size=2, pp_size=2, global_batch_size=16))
    table = coster.stage_table(base)
    import dataclasses

    assert coster.stage_table(dataclasses.replace(base, zero_stage=1, recompute="full")) is table
    for change in (dict(stack="pytorch"), dict(grad_reduce_dtype="fp32"), dict(bucket_bytes=1 << 20), dict(optimizer="sgd"),
                   dict(precision="amp"), dict(attention="flash"), dict(rank_order="dtp"), dict(sequence_parallel=True)):
        other = coster.stage_table(dataclasses.replace(base, **change))
        assert other is not table, change
        assert coster.stage_table(dataclasses.replace(base, **change)) is other, change
    coster._use(None)
    assert coster.stage_table(base) is not table
