"""Issue 18: Megatron-LM's asynchronous tensor-parallel all-reduce.

In backward, the input gradient of a column-parallel GEMM is all-reduced (reduce-scattered with
sequence parallelism) while the same GEMM's weight gradient is computed
(``LinearWithGradAccumulationAndAsyncCommunication``; ``--no-async-tensor-model-parallel-allreduce``
turns it off).  The tool hides ``min(collective, weight-gradient GEMM)`` of each such collective
and nothing else; ``async_tp_allreduce=False`` (``--no-async-tp-allreduce``) is the 2021 code."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dml2comm import zoo
from dml2comm.analysis import analyze_graph
from dml2comm.cli import main
from dml2comm.cost.stages import StageCoster
from dml2comm.hardware.cluster import make_cluster
from dml2comm.ir.onnx_import import ImportOptions
from dml2comm.load import load_model
from dml2comm.network.kinds import CollectiveKind, ParallelDim, Phase
from dml2comm.parallel.config import ParallelConfig


@pytest.fixture(scope="module")
def gpt_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("gpt") / "gpt.onnx"
    zoo.save(zoo.build_gpt(layers=4, hidden=512, heads=8, vocab=8192, seq_len=256), path)
    return path


@pytest.fixture(scope="module")
def gpt(gpt_path):
    return load_model(str(gpt_path), ImportOptions(batch_size=2))


def _plan(gpt, **kw):
    config = ParallelConfig(micro_batch_size=2, global_batch_size=8, **kw)
    cluster = make_cluster("a100", config.num_gpus, 8)
    return StageCoster(gpt, cluster, collapse=False).prepare(config), analyze_graph(gpt, config, cluster, advise=False)


@pytest.mark.parametrize("sp", [False, True])
def test_the_column_input_gradient_collectives_are_marked(gpt, sp):
    _, a = _plan(gpt, tp_size=2, pp_size=1, sequence_parallel=sp)
    comms = a.tp.comms
    marked = [c for c in comms if c.overlaps_wgrad]
    # one per column-parallel entry of each block (QKV and the first MLP GEMM) plus the LM head
    assert len(marked) == 2 * 4 + 1
    want = CollectiveKind.REDUCE_SCATTER if sp else CollectiveKind.ALL_REDUCE
    for c in marked:
        assert c.phase is Phase.BACKWARD and c.kind is want
        assert a.graph.ops[c.op_index].op_type in ("MatMul", "Gemm")
    # the forward collectives and the backward all-gathers of SP are never marked
    assert not any(c.overlaps_wgrad for c in comms if c.phase is Phase.FORWARD or c.kind is CollectiveKind.ALL_GATHER)


@pytest.mark.parametrize("sp", [False, True])
def test_async_hides_at_most_the_weight_gradient_of_each_collective(gpt, sp):
    on, a = _plan(gpt, tp_size=2, pp_size=2, sequence_parallel=sp)
    off, _ = _plan(gpt, tp_size=2, pp_size=2, sequence_parallel=sp, async_tp_allreduce=False)
    # the forward is untouched; the backward loses exactly the hidden part, computed here from
    # the drawn comm nodes (kernel times) and the ops' own backward times (data + weight gradient)
    assert np.array_equal(on.tp_f, off.tp_f) and np.array_equal(on.compute_b, off.compute_b)
    ops = {o.index: o for o in a.ops}
    m = a.config.num_micro_batches
    for s in range(2):
        hidden = sum(min(c.time_s, ops[c.after_op].time_bwd_s / 2) * c.count_per_iteration / m
                     for c, spec in zip([c for c in a.comms if c.dim is ParallelDim.TP], a.tp.comms)
                     if c.stage == s and spec.overlaps_wgrad)
        assert hidden > 0
        assert off.tp_b[s] - on.tp_b[s] == pytest.approx(hidden, rel=1e-9)
        assert on.bwd[s] < off.bwd[s]
    # what stays exposed is never negative
    assert (on.tp_b >= 0).all()


def test_async_does_nothing_without_tensor_parallelism(gpt):
    on, _ = _plan(gpt, tp_size=1, pp_size=2, dp_size=2)
    off, _ = _plan(gpt, tp_size=1, pp_size=2, dp_size=2, async_tp_allreduce=False)
    assert np.array_equal(on.bwd, off.bwd) and np.array_equal(on.fwd, off.fwd)


def test_the_flag_reaches_the_config_in_data_json(gpt_path, tmp_path):
    for flag, key in (("--no-async-tp-allreduce", "async_tp_allreduce"), ("--no-gradient-accumulation-fusion", "grad_accumulation_fusion")):
        for given, want in (([], True), ([flag], False)):
            out = tmp_path / f"{key}-{want}"
            assert main([str(gpt_path), "--t", "2", "--micro-batch-size", "2", "--out", str(out), "--no-site", *given]) == 0
            data = json.loads((out / "data.json").read_text())
            assert data["config"][key] is want


# ---- gradient accumulation into main_grad (Megatron-LM's DDP hook, per micro-batch)

def test_unfused_parameters_are_vectors_and_gathered_tables(gpt):
    from dml2comm.cost.layers import unfused_parameters

    unfused = unfused_parameters(gpt.graph)
    weights = {t.name: t for t in gpt.graph.weights if t.is_parameter}
    assert unfused and unfused < set(weights)
    for name, t in weights.items():
        gathered = any(op.op_type == "Gather" and name in gpt.graph.parameter_sources(op.inputs[0]) for op in gpt.graph.ops)
        assert (name in unfused) == (t.rank < 2 or gathered), name
    # the token embedding (tied to the LM head) is accumulated by the hook; the MLP matrices are not
    assert any(weights[n].rank == 2 for n in unfused)


def test_the_accumulation_pass_costs_its_bytes_per_micro_batch(gpt):
    from dml2comm.cost.compute import HBM_EFFICIENCY
    from dml2comm.cost.layers import unfused_parameters

    fused, _ = _plan(gpt, tp_size=2, pp_size=2, dtype="bf16", grad_reduce_dtype="fp32")
    plain, a = _plan(gpt, tp_size=2, pp_size=2, dtype="bf16", grad_reduce_dtype="fp32", grad_accumulation_fusion=False)
    hbm = a.cluster.gpu.hbm_bytes_per_s * HBM_EFFICIENCY
    assert fused.compute_b.shape == (2,)
    unfused = unfused_parameters(gpt.graph)
    for s, st in enumerate(a.stages):
        # bf16 gradient read, fp32 main_grad read and written: 2 + 4 + 4 bytes per parameter
        local = st.params_per_gpu
        assert plain.compute_b[s] - fused.compute_b[s] == pytest.approx(
            (local - sum(gpt.graph.tensors[w].numel / a.tp.weight_factor.get(w, 1) for w in unfused
                         if a.stages[s].layers and _owner_stage(a, w) == s)) * 10 / hbm, rel=1e-9)
    assert (plain.bwd > fused.bwd).all() and np.array_equal(plain.fwd, fused.fwd)
    # the analysis names the pass per stage (data.json's stages[].grad_accumulation_s, the stage page)
    for s, st in enumerate(a.stages):
        assert st.grad_accumulation_s > 0 and st.compute_bwd_s == plain.compute_b[s]
        assert st.grad_accumulation_s == pytest.approx(st.params_per_gpu * 10 / hbm, rel=1e-9)


def _owner_stage(a, w):
    """The stage of the first layer reading parameter ``w`` (the layer that owns it)."""
    for s, st in enumerate(a.stages):
        for li in st.layers:
            if any(w in a.graph.ops[i].inputs or w in sum((a.graph.parameter_sources(n) for n in a.graph.ops[i].inputs if n), ())
                   for i in a.layered.layers[li].op_indices):
                return s
    return None
