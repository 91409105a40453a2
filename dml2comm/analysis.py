"""``analyze(model, config, cluster) -> Analysis``: one configuration, in short named steps.

import -> layers -> tensor-parallel shards -> per-op costs (for the drawings' op boxes) ->
stage plan (:class:`dml2comm.cost.stages.StageCoster`, the cost model the sweep reads too) ->
the plan's run (:func:`dml2comm.model.run.run`, the sweep's: the iteration, the same without
communication, and the timeline's events) -> summary
(:mod:`dml2comm.cost.summary`).  The comm nodes are the stage coster's collective specs
(tensor, context, expert, pipeline, tied-weight and data-parallel:
:meth:`~dml2comm.cost.stages.StageCoster.comm_specs`, read off the tables the plan's stage times
are summed from, each priced by :meth:`~dml2comm.cost.stages.StageCoster.price`), described with
the algorithms, links and formulas of those prices for the drawings and data.json; their
per-stage sums equal the plan's stage times (``tests/test_one_path.py``).

Symmetry: replicas and tensor ranks are identical up to GPU ids, so every op is costed once
(on its tensor-parallel shard) and every stage once; per-GPU views are derived on demand.
Nothing here grows with d*t*p except the O(1) look-ups of one representative group per stage.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from dml2comm.advice import alignment_recommendations, memory_suggestions, speed_recommendations
from dml2comm.cost.cache import (attention_cores_of, attention_sites_of, flash_cores_of, grouped_products_of, layers_of, moe_of, parameter_readers_of, tensor_parallel_of)
from dml2comm.cost.compute import FLOP_EFFICIENCY, hbm_efficiency_of
from dml2comm.fmt import fmt_s
from dml2comm.cost.gemm import sustained_factor, sustained_source
from dml2comm.cost.host import host_model
from dml2comm.cost.layers import per_gpu_op_times
from dml2comm.cost.memory import FRAMEWORK_OVERHEAD_BYTES, ModelStates, allocator_capacity_bytes, stage_memory_dict
from dml2comm.cost.ops import infer_seq_len, shard_op_costs
from dml2comm.cost.summary import Summary, breakdown, summary_of
from dml2comm.cost.stages import StageCoster
from dml2comm.errors import ConfigError
from dml2comm.hardware.cluster import Cluster, RankMap
from dml2comm.ir.graph import OpGraph, Tensor
from dml2comm.ir.layers import LayerKind, LayeredGraph
from dml2comm.ir.onnx_import import ImportOptions, ImportResult, check_seq_len
from dml2comm.load import load_model
from dml2comm.model.run import FreeRun, run
from dml2comm.network.model import collective_cost_for_group
from dml2comm.network.kinds import CollectiveKind, ParallelDim, Phase
from dml2comm.ops.registry import OpCost
from dml2comm.parallel.config import AttentionKernel, ParallelConfig, Precision, Schedule, Stack
from dml2comm.parallel.context import check_context_parallel
from dml2comm.parallel.expert import check_expert_parallel
from dml2comm.parallel.tensor import TensorParallelPlan
from dml2comm.sim.engine import SimResult
from dml2comm.cost.bands import host_wait_share, summary_band

__all__ = ["OpInfo", "CommNode", "StageInfo", "LayerInfo", "Analysis", "analyze", "analyze_graph"]

@dataclass(frozen=True, slots=True)
class OpInfo:
    """One op as it runs on one tensor rank, for one micro-batch."""

    index: int
    name: str
    op_type: str
    layer: int
    stage: int
    cost: OpCost
    time_fwd_s: float
    time_bwd_s: float
    shard_factor: int
    shard_rule: str
    output_shape: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class CommNode:
    """A communication op of the plan, costed: count is per iteration on one GPU of its group."""

    kind: CollectiveKind
    dim: ParallelDim
    phase: Phase
    stage: int
    layer: int | None
    after_op: int | None
    tensor: str
    group_size: int
    group: tuple[int, ...]  # ranks of the representative group (replica 0, tensor rank 0)
    message_bytes: float
    bytes_sent_per_gpu: float
    time_s: float
    algorithm: str
    link: str
    count_per_iteration: int
    per_micro_batch: bool
    reason: str
    limiting_link: str = ""
    steps: int = 0
    protocol: str = ""
    formula: str = ""  # the cost formula with its symbols filled in
    host_s: float = 0.0  # the framework's host time for the message, part of time_s (a pipeline Send/Recv's)


@dataclass(frozen=True, slots=True)
class LayerInfo:
    index: int
    name: str
    kind: str
    stage: int
    num_ops: int
    params: int  # unsharded
    flops_fwd: float  # unsharded, per micro-batch
    time_fwd_s: float  # per micro-batch on one GPU (sharded), compute only
    time_bwd_s: float


@dataclass(frozen=True, slots=True)
class StageInfo:
    index: int
    layers: tuple[int, ...]
    params: int  # unsharded
    params_per_gpu: float  # after tensor parallelism (before ZeRO)
    flops_fwd: float  # unsharded, per micro-batch
    time_fwd_s: float  # per micro-batch: compute + tp comm + pp send + read + zero per-mb
    time_bwd_s: float  # per micro-batch, including recomputation
    compute_fwd_s: float
    compute_bwd_s: float
    dp_time_s: float  # once-per-iteration data-parallel collectives
    optimizer_time_s: float
    memory: Mapping[str, float | None]
    ranks: tuple[int, ...]  # GPUs of replica 0 in this stage (tensor group)
    grad_accumulation_s: float = 0.0  # per micro-batch, part of compute_bwd_s (cost.compute.grad_accumulation_s)
    loss_fwd_s: float = 0.0  # per micro-batch, the loss the graph leaves out (cost.loss), part of compute_fwd_s
    loss_bwd_s: float = 0.0  # ... and of compute_bwd_s
    #: a copy of parameters an earlier stage owns (a tied word embedding on the LM head's stage):
    #: counted in ``params`` beside its layers' own, so the layers' parameters + ``held_params`` = ``params``
    held_params: int = 0
    held_tensors: tuple[str, ...] = ()  # the held parameters' names
    held_from: tuple[int, ...] = ()  # the stages owning them


@dataclass(frozen=True)
class Analysis:
    model_path: str
    graph: OpGraph
    layered: LayeredGraph
    config: ParallelConfig
    cluster: Cluster
    rank_map: RankMap
    tp: TensorParallelPlan
    ops: tuple[OpInfo, ...]
    layers: tuple[LayerInfo, ...]
    stages: tuple[StageInfo, ...]
    comms: tuple[CommNode, ...]
    summary: Summary
    model_info: Mapping[str, Any]
    #: what the user should act on (it does not fit, BatchNorm folded at export, --lenient
    #: fallbacks, a split the model does not divide); the modelling choices are ``assumptions``
    warnings: tuple[str, ...] = field(default_factory=tuple)
    memory: Mapping[str, Any] = field(default_factory=dict)
    timeline: SimResult | None = None  # the simulated iteration (events per GPU and stream)
    recommendations: tuple[Mapping[str, Any], ...] = ()
    #: each stage's compute per iteration: its busy time with every collective free (the run the
    #: summary's breakdown reads), so ``summary["compute_time_s"]`` is the largest of them.  The
    #: overview's compute card, the timeline's per-stage table and the stage pages all read it.
    stage_compute_s: tuple[float, ...] = ()
    #: what the plan assumed, said once per run (dropout, compute efficiencies, attention kernel,
    #: host model, the training stack by default, vocabulary padding): not for the user to fix
    assumptions: tuple[str, ...] = ()


def analyze(
    model_path: str | os.PathLike[str],
    config: ParallelConfig,
    cluster: Cluster,
    import_options: ImportOptions | None = None,
    lenient: bool = False,
) -> Analysis:
    """Import ``model_path`` and analyse it under ``config`` on ``cluster``."""
    options = import_options or ImportOptions(batch_size=config.micro_batch_size, seq_len=config.seq_len, lenient=lenient)
    imported = load_model(model_path, options)
    check_seq_len(imported, options.seq_len)
    return analyze_graph(imported, config, cluster, str(model_path), lenient=lenient)


#: Ops that normalise activations between convolutions in a training graph.
_NORMALIZATIONS = frozenset({"BatchNormalization", "InstanceNormalization", "GroupNormalization", "LayerNormalization",
                             "RMSNormalization", "SimplifiedLayerNormalization"})


def folded_normalization_warning(graph) -> str | None:
    """A warning when a convolutional export has no normalisation at all but biased convolutions:
    BatchNorm folded into them at export (the dynamo exporter folds it even for a model in
    training mode; TorchScript's does in eval mode, its default ``training=TrainingMode.EVAL``).
    A training step still runs BatchNorm, as separate memory-bound kernels in forward and
    backward (about half of a ResNet-50 step's GPU time on an H100, measured with
    ``measure_gpu.py``), so the plan misses that time and those activations.  None otherwise."""
    convs = [op for op in graph.ops if op.op_type == "Conv"]
    if len(convs) < 2 or any(op.op_type in _NORMALIZATIONS for op in graph.ops):
        return None
    if sum(1 for op in convs if len(op.inputs) >= 3 and op.inputs[2]) < len(convs) // 2 + 1:
        return None  # mostly bias-free convolutions without normalisation: a network built that way
    return (f"normalization: {len(convs)} convolutions and no BatchNormalization between them: BatchNorm was likely folded into "
            "the convolutions at export, so its training-time kernels and saved activations are not costed; export with "
            "torch.onnx.export(model.train(), args, dynamo=False, training=torch.onnx.TrainingMode.TRAINING, "
            "do_constant_folding=False) to keep them")


def analyze_graph(imported: ImportResult, config: ParallelConfig, cluster: Cluster, model_path: str = "", lenient: bool = False,
                  advise: bool = True, reimport: Callable[[int], ImportResult] | None = None, timeline: bool = True) -> Analysis:
    """Analyse an imported model.

    ``advise`` adds memory suggestions when it does not fit and speed recommendations, each
    re-analysed; ``reimport(b)`` (the model bound to micro-batch ``b``) lets them try smaller
    micro-batches.  ``timeline=False`` skips the per-event timeline (sweeps need only the numbers)."""
    _check_plan(imported, config, cluster)
    graph = imported.graph
    warnings: list[str] = list(imported.warnings)
    layered = layers_of(graph)
    warnings.extend(layered.warnings)
    train = config.train_dtype
    dtype_bytes = train.itemsize
    tp = tensor_parallel_of(graph, config.tp_size, config.sequence_parallel, dtype_bytes)
    warnings.extend(tp.warnings)
    assumptions: list[str] = list(tp.assumptions)

    gpu = cluster.gpu
    peak = gpu.peak_flops(config.dtype)

    # ---- per-op costs on the tensor-parallel shard (each op once; cached per graph: dml2comm.cost.ops)
    # "auto": the stack's (cost.host.STACK_HOST_MODEL); --profile: the one measured from the trace
    host = host_model(cluster.host_model, config.stack, cluster.profile_scale.host if cluster.profile_scale else None)
    op_costs = shard_op_costs(graph, config.tp_size, config.sequence_parallel, config.dtype, gpu, lenient, host, config.stack,
                              config.attention, config.precision, cluster.profile_scale, layered)
    costs, times, full_flops, fallback_types = op_costs.costs, op_costs.times, op_costs.full_flops, op_costs.fallback_types
    if fallback_types:
        warnings.append(f"no cost rule for {', '.join(sorted(fallback_types))}: costed as memory-bound (--lenient)")

    # ---- context and expert parallelism (dml2comm.parallel.context / .expert)
    times, seq_len = _context_and_experts(graph, layered, config, times, assumptions)

    # ---- layers and stages: the stage tables the sweep reads too (dml2comm.cost.layers / .stages):
    # per-layer times and parameters, the min-max partition, every stage-level term
    coster = StageCoster(imported, cluster, collapse=False, lenient=lenient)  # the whole graph: exact per-layer sums
    plan = coster.prepare(config)
    layer_table = coster.layer_table(config)
    table = coster.stage_table(config)
    ranges = table.ranges
    stage_of_layer = [s for s, (a, b) in enumerate(ranges) for _ in range(a, b)]
    stage_of_op = [stage_of_layer[layered.layer_of_op[i]] for i in range(len(graph.ops))]
    # A parameter read on several stages (a tied embedding: the LM head on the last stage) is
    # held by each of them, and their gradients are all-reduced (Megatron-LM's embedding group)
    readers = parameter_readers_of(graph, layered)
    copies = table.copies  # the stage table's (on the whole graph: the analysis's own layers)

    rank_map = table.rank_map
    comms = _comm_nodes(coster, config, cluster)

    folded = folded_normalization_warning(graph)
    if folded:
        warnings.append(folded)
    if config.stack is Stack.PYTORCH and Precision.of(config.precision) is Precision.AMP and grouped_products_of(graph):
        warnings.append("experts under --precision amp: PyTorch's grouped GEMM takes bf16 operands only, so under autocast "
                        "Hugging Face's experts fall back to fp32 products without tensor cores, costed so (a measured "
                        "Mixtral-style step on an H200 took 2.9x its bf16 time); --precision bf16 runs them as one grouped GEMM")
    assumptions.append(_dropout_assumption(graph, config))

    # ---- stages: every number from the stage plan (the sweep's numbers, by construction)
    stages = _stage_infos(plan, table, comms, rank_map, copies, readers, stage_of_layer)
    ran = run([plan], events=timeline)[0]  # the sweep's run of the same plan (dml2comm.model)
    sim, sim_free = ran.timeline, ran.free
    layers_info, ops_info = _rows(graph, layered, layer_table, tp, costs, times, stage_of_layer, stage_of_op)
    memory = _memory_report(stages, cluster, config)
    summary, model_info = _summarize(graph, layered, config, cluster, stages, comms, sim, sim_free, full_flops, peak, seq_len,
                                     model_path, memory)
    # the expected error the sweep's row states too (--profile: the traces' own band replaces the borrowed one)
    wait = host_wait_share(coster, config, summary.iteration_time_s)
    error, error_source = summary_band(config, cluster, coster, plan, summary.iteration_time_s, summary.exposed_comm_time_s, wait)
    summary = replace(summary, expected_error=error, expected_error_source=error_source, host_wait_share=wait)
    assumptions.extend(_cost_assumptions(graph, config, cluster, host))
    if not any(l.kind is LayerKind.BLOCK for l in layered.layers):
        warnings.append("no repeated blocks found; pipeline stages split whole layers only")
    warnings.extend(_profile_stack_warnings(cluster, config))
    recommendations = _advice(imported, config, cluster, tp, stage_of_op, stages, summary, memory, lenient, reimport) if advise else []
    return Analysis(model_path, graph, layered, config, cluster, rank_map, tp, ops_info, layers_info, tuple(stages), tuple(comms),
                    summary, model_info, tuple(dict.fromkeys(warnings)), memory, sim, tuple(recommendations),
                    tuple(float(x) for x in sim_free.compute_busy_s), tuple(dict.fromkeys(assumptions)))


def _profile_stack_warnings(cluster: Cluster, config: ParallelConfig) -> list[str]:
    """A ``--profile`` trace of an eager PyTorch step (PyTorch's own fused Adam/AdamW ran) under
    ``--stack megatron``: its ratios then stand for eager kernels against Megatron's fused ones,
    which they scale correctly only at the profiled shape."""
    scale = cluster.profile_scale
    if scale is None or config.stack is not Stack.MEGATRON:
        return []
    eager = [t["file"] for t in dict(scale.detail).get("traces", ()) if t.get("eager_optimizer")]
    return [f"--profile {', '.join(eager)}: an eager PyTorch step (its optimizer is PyTorch's fused AdamW) costed with "
            "--stack megatron's fused kernels; pass --stack pytorch (and its --precision) to model the kernels it ran"] if eager else []


_MEMORY_PARTS = ("weights_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes", "buffers_bytes", "transient_bytes")


def _rows(graph: OpGraph, layered: Any, layer_table: Any, tp: Any, costs: Any, times: Any, stage_of_layer: Sequence[int],
          stage_of_op: Sequence[int]) -> tuple[tuple[LayerInfo, ...], tuple[OpInfo, ...]]:
    """The layer rows (the layer table's times, parameters and FLOPs) and the operator rows (each
    op's cost and per-GPU times on its tensor-parallel shard)."""
    layer_params = [int(x) for x in layer_table.params]
    layer_fwd, layer_bwd, layer_flops = layer_table.fwd.tolist(), layer_table.bwd.tolist(), layer_table.flops.tolist()
    layers_info = tuple(
        LayerInfo(l.index, l.name, l.kind, stage_of_layer[l.index], len(l.op_indices), layer_params[l.index], layer_flops[l.index], layer_fwd[l.index], layer_bwd[l.index])
        for l in layered.layers
    )
    ops_info = tuple(
        OpInfo(op.index, op.name, op.op_type, layered.layer_of_op[op.index], stage_of_op[op.index], costs[op.index],
               times[op.index][0], times[op.index][1], tp.shards[op.index].factor, tp.shards[op.index].rule,
               _shape(tp.shards[op.index].outputs))
        for op in graph.ops
    )
    return layers_info, ops_info


def _check_plan(imported: ImportResult, config: ParallelConfig, cluster: Cluster) -> None:
    """Refuse a micro-batch the export fixed otherwise, and a cluster of another size than d t p c."""
    if imported.model_batch is not None and imported.model_batch != config.micro_batch_size:
        raise ConfigError(
            f"the model fixes its batch dimension at {imported.model_batch}, but --micro-batch-size is "
            f"{config.micro_batch_size}; use --micro-batch-size {imported.model_batch} or export with a dynamic batch axis"
        )
    if cluster.num_gpus != config.num_gpus:
        raise ConfigError(f"the cluster has {cluster.num_gpus} GPUs but d*t*p*c = {config.num_gpus}; make them equal")


def _context_and_experts(graph: OpGraph, layered: Any, config: ParallelConfig, times: Any,
                         assumptions: list[str]) -> tuple[Any, Any]:
    """Context and expert parallelism (:mod:`dml2comm.parallel.context` / ``.expert``): their
    checks, the per-GPU op times (1/c of each op, expert ops on capacity-padded buffers: one rule,
    :func:`dml2comm.cost.layers.per_gpu_op_times`) and their assumptions.  Returns (the per-GPU
    times, the sequence length); their collectives are the stage coster's (:meth:`StageCoster.comm_specs`)."""
    cp, ep = config.cp_size, config.ep_size
    seq_len = config.seq_len or infer_seq_len(graph)
    attn_sites = attention_sites_of(graph, layered, seq_len) if cp > 1 else ()
    check_context_parallel(attn_sites, cp, config.tp_size, config.cp_scheme, seq_len)
    moe = moe_of(graph, layered) if ep > 1 or config.capacity_factor != 1.0 else None
    check_expert_parallel(moe, ep)
    times = per_gpu_op_times(times, cp, config.capacity_factor if moe is not None else 1.0,
                             moe.expert_ops if moe is not None else frozenset())
    if cp > 1:
        assumptions.append(f"context parallelism: c={cp} ({config.cp_scheme}); per-GPU op times, activations and tensor/pipeline "
                           "messages are 1/c of the unsplit ones (causal load balancing; GEMM efficiency of the full sequence)")
    if moe is not None and ep > 1:
        assumptions.append(f"expert parallelism: e={ep}, {moe.experts} experts per layer ({moe.experts // ep} per GPU), top-{moe.top_k}, "
                           f"capacity factor {config.capacity_factor}; balanced routing assumed (every expert gets its even share)")
    return times, seq_len


def _advice(imported: ImportResult, config: ParallelConfig, cluster: Cluster, tp: Any, stage_of_op: Sequence[int],
            stages: Sequence[StageInfo], summary: Any, memory: dict[str, Any], lenient: bool,
            reimport: Callable[[int], ImportResult] | None) -> list[dict[str, Any]]:
    """Memory suggestions when the plan does not fit (into ``memory``), and the speed and
    alignment recommendations, each re-analysed, fastest first."""
    if not memory["fits"]:
        memory["suggestions"] = memory_suggestions(imported, config, cluster, lenient=lenient)
    recommendations = speed_recommendations(imported, config, cluster, summary["iteration_time_s"], lenient=lenient, reimport=reimport)
    busy = [config.num_micro_batches * (st.time_fwd_s + st.time_bwd_s) for st in stages]
    return sorted(recommendations + alignment_recommendations(
        imported.graph, tp, config, cluster, stage_of_op, busy, summary["iteration_time_s"], bool(memory["fits"]), memory["peak_bytes"]),
        key=lambda r: r["iteration_time_s"])


def _comm_nodes(coster: StageCoster, config: ParallelConfig, cluster: Cluster) -> list[CommNode]:
    """The analysis's communication nodes: the stage coster's collectives of ``config``
    (:meth:`StageCoster.comm_specs`: the very specs its stage times are summed from, each with the
    seconds it was priced at), described for the drawings and data.json: the algorithm, links,
    steps and formula of that price (:func:`dml2comm.network.model.collective_cost_for_group`)."""
    nodes: list[CommNode] = []
    for spec in coster.comm_specs(config):
        cc = collective_cost_for_group(cluster, spec.kind, spec.group, spec.message_bytes)
        nodes.append(
            CommNode(spec.kind, spec.dim, spec.phase, spec.stage, spec.layer, spec.after_op, spec.tensor, len(spec.group), spec.group,
                     float(spec.message_bytes), cc.bytes_sent_per_gpu, spec.seconds + spec.host_s, str(cc.algorithm), cc.link,
                     spec.count, spec.per_micro_batch, spec.reason, cc.limiting_link, cc.steps, str(cc.protocol), cc.formula,
                     float(spec.host_s))
        )
    return nodes


def _dropout_assumption(graph: OpGraph, config: ParallelConfig) -> str:
    """How dropout is counted: the export's own Dropout nodes, else ``--dropout``'s assumed rate."""
    if any(op.op_type == "Dropout" for op in graph.ops):
        return "dropout: the model's own Dropout nodes (their masks count as activations)"
    if config.dropout > 0:
        return (f"dropout: assumed p={config.dropout} on attention probabilities and residual branches (--dropout); "
                "the export has no Dropout nodes")
    return "dropout: none (the export has no Dropout nodes; pass --dropout 0.1 to count a training run's masks)"


def _cost_assumptions(graph: OpGraph, config: ParallelConfig, cluster: Cluster, host: Any) -> list[str]:
    """The compute, attention and host models the times rest on, one sentence each."""
    out: list[str] = []
    out.append(
        f"compute: GEMMs by the tile/split-K shape law at {sustained_factor(cluster.gpu):.3f} of peak sustained on "
        f"{cluster.gpu.name} ({sustained_source(cluster.gpu)}), other FLOP-bound kernels at {FLOP_EFFICIENCY:.3f} of peak, "
        f"memory-bound ops at {hbm_efficiency_of(cluster.gpu):.2f} of HBM bandwidth, "
        + ("point-wise chains fused as Megatron-LM" if config.stack is Stack.MEGATRON else
           "one kernel per op as eager PyTorch runs it (a linear layer's bias add in the GEMM's epilogue)")
    )
    if config.attention is AttentionKernel.FLASH:
        cores, flash = attention_cores_of(graph), flash_cores_of(graph)
        if cores:
            out.append(
                f"attention: {len(flash)} of {len(cores)} attention cores run as one flash kernel each "
                f"({sum(c.causal for c in flash)} causal, read off the mask), its time by a law fitted on H100 SDPA "
                "(benchmarks/fit_flash_h100.py)"
                + ("; the others (a learned or per-head bias in the scores) are costed as exported" if len(flash) < len(cores) else ""))
    if host.run_ahead:
        where = ("read from the profiled step (the CPU side over the profiler's slowdown)" if host.name == "trace"
                 else "fitted on 49 PyTorch 2.11 steps measured on four H100 and H200 machines")
        cpu = (fmt_s(host.kernel_s) if host.backward_kernel_s is None
               else f"{fmt_s(host.kernel_s)} forward and {fmt_s(host.backward_kernel_s)} backward")
        host_text = (f"host: {host.name} ({cpu} of CPU per kernel, the CPU running ahead of the GPU, and "
                     f"{fmt_s(host.gap_s)} of GPU idle per kernel, {where}; a step waits "
                     "for the CPU only when its kernels are shorter)")
    elif host.kernel_s > 0:
        host_text = (f"host: {host.name} ({fmt_s(host.kernel_s)} of CPU per kernel"
                     + (f" and {fmt_s(host.p2p_s)} per pipeline message" if host.p2p_s else "")
                     + ", fitted on vTrain's single-node runs; small kernels wait for the CPU)")
    else:
        host_text = "host: none (kernel time only, as a CUDA-graph captured step; --host-model eager or pytorch for eager steps)"
    out.append(host_text)
    return out


def _stage_infos(plan: Any, table: Any, comms: Sequence[CommNode], rank_map: Any, copies: Any,
                 readers: Mapping[str, Any], stage_of_layer: Sequence[int]) -> list[StageInfo]:
    """Per stage its :class:`StageInfo` (every number from the stage plan: the sweep's, by
    construction); a stage's held copies are the
    parameters it reads that an earlier stage owns (:func:`dml2comm.parallel.pipeline.held_copies`)."""
    ranges = table.ranges
    held_names: list[list[str]] = [[] for _ in ranges]
    held_owner: list[set[int]] = [set() for _ in ranges]
    for w, readers_of_w in readers.items():
        holders = sorted({stage_of_layer[li] for li in readers_of_w})
        for s in holders[1:]:
            held_names[s].append(w)
            held_owner[s].add(holders[0])
    stages: list[StageInfo] = []
    for s, (a, b) in enumerate(ranges):
        mine = [c for c in comms if c.stage == s]
        dp_once = sum(c.time_s * c.count_per_iteration for c in mine if c.dim is ParallelDim.DP and not c.per_micro_batch)
        weights, grads, optimizer_states = plan.states[s].tolist()
        memory = dict(stage_memory_dict(ModelStates(weights, grads, optimizer_states), float(plan.activations_per_mb[s] * plan.in_flight[s]),
                                        float(plan.buffers[s]), float(plan.transient[s]), plan.grads_in_backward),
                      activations_per_micro_batch_bytes=float(plan.activations_per_mb[s]), in_flight_micro_batches=float(plan.in_flight[s]))
        stages.append(
            StageInfo(
                index=s,
                layers=tuple(range(a, b)),
                params=int(table.params[s]),
                params_per_gpu=float(table.params_local[s]),
                flops_fwd=float(table.flops[s]),
                time_fwd_s=float(plan.fwd[s]),
                time_bwd_s=float(plan.bwd[s]),
                compute_fwd_s=float(plan.compute_f[s]),
                compute_bwd_s=float(plan.compute_b[s]),
                dp_time_s=dp_once,
                optimizer_time_s=float(plan.optimizer[s]),
                grad_accumulation_s=float(table.accumulate[s]),
                loss_fwd_s=float(table.loss_f[s]),
                loss_bwd_s=float(table.loss_b[s]),
                memory=memory,
                ranks=rank_map.tp_group(0, s),
                held_params=int(copies.extra[s]),
                held_tensors=tuple(held_names[s]),
                held_from=tuple(sorted(held_owner[s])),
            )
        )
    return stages


def _memory_report(stages: list[StageInfo], cluster: Cluster, config: ParallelConfig) -> dict[str, Any]:
    """Peak per GPU against the GPU's capacity, and what dominates it."""
    worst = max(stages, key=lambda st: st.memory["total_bytes"])
    capacity = allocator_capacity_bytes(cluster.gpu.hbm_bytes)  # the GPU less the CUDA context (cost.memory)
    peak = worst.memory["total_bytes"]
    part = max(_MEMORY_PARTS, key=lambda k: worst.memory[k])
    return {
        "capacity_bytes": capacity,
        "gpu_memory_bytes": float(cluster.gpu.hbm_bytes),
        "framework_bytes": FRAMEWORK_OVERHEAD_BYTES,
        "peak_bytes": peak,
        "peak_stage": worst.index,
        "headroom_bytes": capacity - peak,
        "fits": peak <= capacity,
        "largest_contributor": part.removesuffix("_bytes"),
        "over_capacity_stages": [st.index for st in stages if st.memory["total_bytes"] > capacity],
        "suggestions": [],
    }


def _shape(outputs: tuple[Tensor | None, ...]) -> tuple[int, ...]:
    for t in outputs:
        if t is not None:
            return t.shape
    return ()


def _summarize(graph, layered, config, cluster, stages, comms, sim: SimResult, sim_free: FreeRun, full_flops, peak, seq_len,
               model_path, memory) -> tuple[Summary, dict[str, Any]]:
    """The :class:`~dml2comm.cost.summary.Summary` of the simulated iteration (the four parts of
    the iteration, the bubble's two ratios and the busiest stage as
    :func:`dml2comm.cost.summary.breakdown` defines them for the sweep's rows too; the expected
    error is set after it, by :func:`dml2comm.cost.bands.summary_band` as on the sweep's rows),
    plus what only the analysis has: ``comm_time_s`` is the collective time of every stage of one
    replica (each stage's GPU), so that ``exposed_comm_time_s`` <= ``comm_time_s`` (removing all collectives
    shortens the critical path by at most the collective time on it);
    ``comm_time_busiest_stage_s`` is the busiest stage's own share of it; the bottleneck in words.
    """
    iteration = sim.iteration_time_s
    parts = breakdown(np.array([iteration]), np.array([sim_free.iteration_time_s]), np.array([sim_free.compute_end_s]),
                      np.array([sim_free.compute_busy_s]))
    crit = int(parts.critical_stage[0])
    comm_by_stage_dim = {dim: sum(c.time_s * c.count_per_iteration for c in comms if c.dim is dim and c.stage == crit) for dim in ParallelDim}
    shares = {
        "compute": float(parts.compute_s[0]),
        "pipeline bubble": float(parts.bubble_s[0]),
        "exposed communication": float(parts.exposed_comm_s[0]),
        "optimizer step": float(parts.optimizer_s[0]),
    }
    name, share = max(shares.items(), key=lambda kv: kv[1])
    if name == "exposed communication":
        dim = max(comm_by_stage_dim, key=comm_by_stage_dim.get)
        name = f"exposed communication (mostly {dim.value})"
    flops_fwd_per_sample = sum(full_flops) / config.micro_batch_size
    summary = summary_of(
        parts, 0, iteration, flops_fwd_per_sample=flops_fwd_per_sample, global_batch_size=config.global_batch_size,
        num_gpus=config.num_gpus, peak_flops=peak, seq_len=seq_len, peak_memory_bytes=memory["peak_bytes"],
        capacity_bytes=memory["capacity_bytes"],
        comm_time_s=sum(c.time_s * c.count_per_iteration for c in comms),
        comm_time_busiest_stage_s=sum(comm_by_stage_dim.values()),
        bottleneck=f"{name}: {share / iteration:.0%} of the iteration (stage {crit} is the busiest)" if iteration else None,
    )
    model_info = {
        "path": model_path,
        "name": graph.name,
        "num_ops": len(graph.ops),
        "num_layers": len(layered.layers),
        "num_blocks": layered.num_blocks,
        "layer_source": layered.source,
        "params": graph.num_params,
        "flops_fwd_per_sample": flops_fwd_per_sample,
        "attention_cores": len(attention_cores_of(graph)),
    }
    return summary, model_info


def comm_by_dim(analysis: Analysis) -> dict[str, dict[str, float | int]]:
    """Per iteration, for the GPU (stage) that spends the most time on each dimension."""
    out: dict[str, dict[str, float | int]] = {}
    for dim in ParallelDim:
        best: dict[str, float | int] = {"message_bytes": 0.0, "bytes_sent_per_gpu": 0.0, "time_s": 0.0, "count": 0}
        for st in analysis.stages:
            nodes = [c for c in analysis.comms if c.dim is dim and c.stage == st.index]
            entry = {
                "message_bytes": math.fsum(c.message_bytes * c.count_per_iteration for c in nodes),
                "bytes_sent_per_gpu": math.fsum(c.bytes_sent_per_gpu * c.count_per_iteration for c in nodes),
                "time_s": math.fsum(c.time_s * c.count_per_iteration for c in nodes),
                "count": sum(c.count_per_iteration for c in nodes),
            }
            if entry["time_s"] > best["time_s"] or (entry["count"] and not best["count"]):
                best = entry
        out[dim.value] = best
    return out
