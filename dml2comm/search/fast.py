"""The sweep's fast path: the analysis's numbers for many configurations without rebuilding them.

:func:`dml2comm.analysis.analyze_graph` builds every comm node, stage record and (for the site)
event of one configuration; a sweep needs only the summary numbers.  :class:`FastEvaluator`
computes the same numbers from parts that configurations share:

- per (micro-batch, t, SP, dtype): op costs and times on the tensor-parallel shard (the
  analysis's own memoised ``_op_costs``), summed per layer with prefix sums, the layers'
  parameters, recomputation time and tensor-parallel collectives;
- per (.., p): the pipeline partition (the analysis's min-max ``partition_layers``) and the
  boundary tensors;
- per (.., p, recomputation, first, last layer): the stage's activation memory (the
  analysis's ``ActivationModel``);
- per (collective, bytes, how the group sits on the cluster): the collective's time.

Configurations that share a schedule ``(schedule, p, m, v)`` are simulated together by
:mod:`dml2comm.sim.levels` (the engine's recurrence, vectorised over configurations).

What it returns equals ``analyze_graph``'s summary on iteration time, memory and the breakdown
(``tests/test_search.py`` checks it against full runs).  Configurations it does not cover —
ZeRO-2/3 (per-micro-batch collectives on the data-parallel stream), context or expert
parallelism — are evaluated by the full analysis (``Evaluator``).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from dml2comm.analysis import (PCIE4_X16_BYTES_PER_S, _infer_seq_len, _is_attention_core, _memo, _op_costs,
                                weight_layers)
from dml2comm.cost.compute import optimizer_step_s
from dml2comm.cost.memory import ActivationModel, in_flight_micro_batches, model_state_bytes, stage_memory_dict
from dml2comm.errors import ConfigError
from dml2comm.hardware.cluster import Cluster, RankMap
from dml2comm.ir.graph import OpGraph
from dml2comm.ir.layers import group_layers
from dml2comm.ir.onnx_import import ImportResult
from dml2comm.network.kinds import CollectiveKind, Phase
from dml2comm.network.model import collective_cost_for_group
from dml2comm.parallel.config import DTYPES, ParallelConfig
from dml2comm.parallel.data import data_parallel_comms
from dml2comm.parallel.pipeline import partition_layers
from dml2comm.parallel.tensor import requires_grad, shard_tensor_parallel
from dml2comm.sim.levels import bucket_tail_end, compile_schedule, pipeline_end_times

__all__ = ["FastEvaluator", "supports"]


def supports(config: ParallelConfig) -> bool:
    """Whether the fast path covers ``config`` (else the full analysis evaluates it)."""
    return (config.zero_stage < 2 and not config.tp_comm_overlap and getattr(config, "cp_size", 1) == 1 and getattr(config, "ep_size", 1) == 1)


@dataclass
class _Layers:
    """Per-layer sums for one (micro-batch, t, SP, dtype), with prefix sums over layers."""

    fwd: np.ndarray  # compute seconds per micro-batch
    bwd: np.ndarray
    selective: np.ndarray  # forward seconds of the attention core (selective recomputation)
    params: np.ndarray
    params_local: np.ndarray
    reads_input: np.ndarray  # bool: the layer has an op that reads a graph input
    tp: dict[tuple[CollectiveKind, Phase, float], np.ndarray]  # per-layer counts of each TP collective
    tp_overlap: dict[tuple[CollectiveKind, Phase, float], np.ndarray]  # per-layer adjacent GEMM seconds (sum)
    tied: list[tuple[int, int, float, float]]  # (copy layer, table layer, numel, numel local)
    flops_fwd: float  # unsharded forward FLOPs of the model per micro-batch


@dataclass
class _Prepared:
    """One configuration, ready for the batched simulation."""

    config: ParallelConfig
    fwd: np.ndarray  # per device, per micro-batch (whole stage)
    bwd: np.ndarray
    tp_f: np.ndarray
    tp_b: np.ndarray
    send_f: np.ndarray
    send_b: np.ndarray
    compute_f: np.ndarray  # pure op time (no TP collectives, no input read)
    compute_b: np.ndarray
    buckets: list[list[tuple[float, int]]]  # per device: (seconds, count) runs
    optimizer: np.ndarray
    after_step: np.ndarray
    peak_memory: float
    flops_fwd_per_sample: float


def _prefix(values: Sequence[float]) -> np.ndarray:
    out = np.zeros(len(values) + 1)
    np.cumsum(values, out=out[1:])
    return out


class FastEvaluator:
    """Summary numbers of configurations of one imported model on one cluster (module docstring)."""

    def __init__(self, imported: ImportResult, cluster: Cluster) -> None:
        self.imported = imported
        self.graph: OpGraph = imported.graph
        self.cluster = cluster
        self.layered = _memo(self.graph, ("layers",), lambda: group_layers(self.graph))
        self._costs: dict[tuple, float] = {}
        self._uses: dict[tuple[int, ...], Any] = {}

    # ---- shared parts
    def _core(self, seq_len: int | None) -> list[bool]:
        """Per op: on the attention scores (what selective recomputation rebuilds)."""
        graph = self.graph
        return _memo(graph, ("fast-core", seq_len), lambda: [_is_attention_core(graph, i, seq_len) for i in range(len(graph.ops))])

    def _signature(self, li: int) -> tuple:
        """A layer's structure (op types and output shapes): equal layers keep equal activations."""
        graph, layered = self.graph, self.layered

        def build() -> list[tuple]:
            out = []
            for layer in layered.layers:
                out.append((layer.kind, tuple((graph.ops[i].op_type, tuple(tuple(graph.tensors[o].shape) if o in graph.tensors else ()
                                                                          for o in graph.ops[i].outputs if o))
                                              for i in layer.op_indices)))
            return out

        sigs = _memo(graph, ("fast-signatures",), build)
        return sigs[li] if 0 <= li < len(sigs) else None

    def _tp(self, config: ParallelConfig):
        graph, train = self.graph, config.train_dtype
        return _memo(graph, ("tp", config.tp_size, config.sequence_parallel, train.itemsize),
                     lambda: shard_tensor_parallel(graph, config.tp_size, config.sequence_parallel, train.itemsize))

    def _layers(self, config: ParallelConfig) -> _Layers:
        key = ("fast-layers", config.tp_size, config.sequence_parallel, config.dtype, self.cluster.gpu.name)
        return _memo(self.graph, key, lambda: self._build_layers(config))

    def _build_layers(self, config: ParallelConfig) -> _Layers:
        graph, layered = self.graph, self.layered
        gpu = self.cluster.gpu
        peak, hbm = gpu.peak_flops(config.dtype), gpu.hbm_bytes_per_s
        tp = self._tp(config)
        costs, times, full_flops, _ = _memo(
            graph, ("costs", config.tp_size, config.sequence_parallel, config.dtype, gpu.name, peak, hbm, False),
            lambda: _op_costs(graph, tp, config.train_dtype, gpu, peak, hbm, False))
        n = len(layered.layers)
        seq_len = config.seq_len or _infer_seq_len(graph)
        fwd = np.array([sum(times[i][0] for i in layer.op_indices) for layer in layered.layers])
        bwd = np.array([sum(times[i][1] for i in layer.op_indices) for layer in layered.layers])
        core = self._core(seq_len)
        selective = np.array([sum(times[i][0] for i in layer.op_indices if core[i]) for layer in layered.layers])
        weight_layer = weight_layers(graph, layered)
        own = {w: li for w, li in weight_layer.items() if graph.tensors[w].tied_to is None}
        params = np.zeros(n)
        params_local = np.zeros(n)
        by_layer: dict[int, list[str]] = defaultdict(list)
        for w, li in own.items():
            by_layer[li].append(w)
        for li in range(n):
            params[li] = sum(graph.tensors[w].numel for w in by_layer[li])
            params_local[li] = sum(graph.tensors[w].numel / tp.weight_factor.get(w, 1) for w in by_layer[li])
        tied = []
        for w, li in weight_layer.items():
            table = graph.tensors[w].tied_to
            if table is not None and table in weight_layer:
                numel = graph.tensors[w].numel
                tied.append((li, weight_layer[table], float(numel), numel / tp.weight_factor.get(w, 1)))
        inputs = set(graph.inputs)
        reads = np.array([any(graph.ops[i].inputs and set(graph.ops[i].inputs) & inputs for i in layer.op_indices)
                          for layer in layered.layers], dtype=bool)
        tp_counts: dict[tuple, np.ndarray] = {}
        tp_gemm: dict[tuple, np.ndarray] = {}
        if config.tp_size > 1:
            for c in tp.comms:
                key = (c.kind, c.phase, float(c.message_bytes))
                li = layered.layer_of_op[c.op_index]
                tp_counts.setdefault(key, np.zeros(n))[li] += 1
        return _Layers(fwd, bwd, selective, params, params_local, reads, tp_counts, tp_gemm, tied, float(sum(full_flops)))

    def _partition(self, config: ParallelConfig, layers: _Layers):
        key = ("fast-partition", config.tp_size, config.sequence_parallel, config.dtype, self.cluster.gpu.name, config.pp_size)
        return _memo(self.graph, key, lambda: partition_layers(list(layers.fwd + layers.bwd), config.pp_size))

    def _boundary_bytes(self, config: ParallelConfig, ranges) -> list[list[float]]:
        """Per stage boundary, the bytes of each activation crossing it per micro-batch."""
        key = ("fast-boundaries", config.tp_size, config.sequence_parallel, config.dtype, tuple(ranges))
        return _memo(self.graph, key, lambda: self._build_boundaries(config, ranges))

    def _build_boundaries(self, config: ParallelConfig, ranges) -> list[list[float]]:
        table = _memo(self.graph, ("fast-tensor-table", config.tp_size, config.sequence_parallel, config.dtype),
                      lambda: self._tensor_table(config))
        stage_of_layer = np.zeros(len(self.layered.layers), dtype=np.int64)
        for s, (a, b) in enumerate(ranges):
            stage_of_layer[a:b] = s
        names, prod, last, sizes = table
        src, dst = stage_of_layer[prod], stage_of_layer[last]
        crossing: list[list[tuple[str, float]]] = [[] for _ in range(max(len(ranges) - 1, 0))]
        for i in np.nonzero(dst > src)[0]:
            for k in range(src[i], dst[i]):
                crossing[k].append((names[i], sizes[i]))
        return [[size for _, size in sorted(c)] for c in crossing]

    def _tensor_table(self, config: ParallelConfig):
        """Activations that need a gradient: name, producing layer, last consuming layer, bytes."""
        graph, layered = self.graph, self.layered
        tp = self._tp(config)
        train = config.train_dtype
        needs_grad = _memo(graph, ("needs_grad",), lambda: requires_grad(graph))
        local_out = {}
        for op, shard in zip(graph.ops, tp.shards):
            for name, t in zip(op.outputs, shard.outputs):
                if name and t is not None:
                    local_out[name] = t
        producer: dict[str, int] = {}
        last_consumer: dict[str, int] = {}
        for op in graph.ops:
            li = layered.layer_of_op[op.index]
            for name in op.outputs:
                if name:
                    producer[name] = li
            for name in op.inputs:
                if name:
                    last_consumer[name] = max(last_consumer.get(name, li), li)
        names = [n for n in producer if n in needs_grad]
        prod = np.array([producer[n] for n in names], dtype=np.int64)
        last = np.array([max(last_consumer.get(n, producer[n]), producer[n]) for n in names], dtype=np.int64)
        sizes = [float((local_out.get(n) or graph.tensors[n]).nbytes_in(train)) for n in names]
        return names, prod, last, sizes

    def _activation_model(self, config: ParallelConfig) -> ActivationModel:
        graph = self.graph
        tp = self._tp(config)
        needs_grad = _memo(graph, ("needs_grad",), lambda: requires_grad(graph))
        return _memo(graph, ("activations", config.tp_size, config.sequence_parallel, config.dtype, config.dropout > 0),
                     lambda: ActivationModel(graph, [sh.inputs for sh in tp.shards], [sh.outputs for sh in tp.shards],
                                             needs_grad, config.train_dtype, assumed_dropout=config.dropout > 0))

    def _per_layer(self, config: ParallelConfig) -> tuple[list[float], list[float], list[float]]:
        """Per layer: saved bytes under full recomputation (the analysis's rule: blocks keep
        their input, other layers everything), saved bytes without recomputation, transient bytes."""
        key = ("fast-act-layers", config.tp_size, config.sequence_parallel, config.dtype, config.dropout > 0)

        def build():
            act = self._activation_model(config)
            layers = self.layered.layers
            full = [act.saved_bytes(l.op_indices, "full" if l.kind == "block" else "none") for l in layers]
            plain = [act.saved_bytes(l.op_indices) for l in layers]
            transient = [act.transient_bytes(l.op_indices) for l in layers]
            return full, plain, transient

        return _memo(self.graph, key, build)

    def _activations(self, config: ParallelConfig, first: int, last: int) -> tuple[float, float, float]:
        """(saved bytes per micro-batch, rebuilt layer bytes, transient bytes) of a stage, as
        the analysis's ``_stage_memory`` computes them."""
        full, plain, transient_l = self._per_layer(config)
        transient = max(transient_l[first:last], default=0.0)
        if config.recompute == "full":
            per_mb = sum(full[first:last])
            rebuilt = max((plain[li] for li in range(first, last) if self.layered.layers[li].kind == "block"), default=0.0)
            return per_mb, rebuilt, transient
        # ranges of structurally equal layers (with equal neighbours) keep equal activations
        shape = (tuple(self._signature(li) for li in range(first - 1, last + 1)), first == 0, last == len(self.layered.layers))
        key = ("fast-act", config.tp_size, config.sequence_parallel, config.dtype, config.dropout > 0, config.recompute, shape)

        def build() -> float:
            seq_len = config.seq_len or _infer_seq_len(self.graph)
            core_flags = self._core(seq_len)
            op_idx = [i for li in range(first, last) for i in self.layered.layers[li].op_indices]
            core = frozenset(i for i in op_idx if core_flags[i]) if config.recompute == "selective" else frozenset()
            return self._activation_model(config).saved_bytes(op_idx, config.recompute, core)

        return _memo(self.graph, key, build), 0.0, transient

    def _cost(self, kind: CollectiveKind, group: tuple[int, ...], size: float) -> float:
        gpn = self.cluster.gpus_per_node
        if group[0] // gpn == group[-1] // gpn and len(group) <= gpn:
            where: tuple = ("node", tuple(r % gpn for r in group))  # inside one node: the same links wherever
        else:
            where = group
        key = (kind, where, size)
        cost = self._costs.get(key)
        if cost is None:
            cost = collective_cost_for_group(self.cluster, kind, group, size).time_s
            self._costs[key] = cost
        return cost

    # ---- one configuration
    def prepare(self, config: ParallelConfig) -> _Prepared:
        """Per-device costs of ``config`` (raises ConfigError as the analysis does)."""
        if not supports(config):
            raise ConfigError("the fast path does not cover this configuration")
        if self.cluster.num_gpus != config.num_gpus:
            raise ConfigError(f"the cluster has {self.cluster.num_gpus} GPUs but d*t*p = {config.num_gpus}; make them equal")
        if self.imported.model_batch is not None and self.imported.model_batch != config.micro_batch_size:
            raise ConfigError(f"the model fixes its batch dimension at {self.imported.model_batch}")
        layers = self._layers(config)
        ranges = self._partition(config, layers)
        p, m, d = config.pp_size, config.num_micro_batches, config.dp_size
        rank_map = RankMap(d, config.tp_size, p, config.rank_order)
        dtype_bytes = config.train_dtype.itemsize
        gpu = self.cluster.gpu
        pcie = getattr(gpu, "pcie_bytes_per_s", 0.0) or PCIE4_X16_BYTES_PER_S
        input_bytes = sum(self.graph.tensors[n].nbytes for n in self.graph.inputs)
        crossing = self._boundary_bytes(config, ranges)
        boundary = [sum(sizes) for sizes in crossing]
        pairs = [(rank_map.rank(0, s, 0), rank_map.rank(0, s + 1, 0)) for s in range(p - 1)]
        send = [sum(self._cost(CollectiveKind.SEND_RECV, pair, x) for x in sizes) for pair, sizes in zip(pairs, crossing)]
        send_back = [sum(self._cost(CollectiveKind.SEND_RECV, pair[::-1], x) for x in sizes) for pair, sizes in zip(pairs, crossing)]
        tied_local = [0.0] * p
        stage_of_layer = np.zeros(len(layers.fwd), dtype=np.int64)
        for s, (a, b) in enumerate(ranges):
            stage_of_layer[a:b] = s
        tied_extra = [0.0] * p
        for copy, table, numel, local in layers.tied:
            if stage_of_layer[table] != stage_of_layer[copy]:
                tied_extra[stage_of_layer[copy]] += numel
                tied_local[stage_of_layer[copy]] += local
        grad_bytes = DTYPES[config.grad_reduce_dtype].itemsize if config.grad_reduce_dtype else dtype_bytes
        fwd, bwd, tp_f, tp_b, comp_f, comp_b = (np.zeros(p) for _ in range(6))
        opt, after = np.zeros(p), np.zeros(p)
        buckets: list[list[tuple[float, int]]] = []
        peak = 0.0
        for s, (a, b) in enumerate(ranges):
            compute_f = sum(layers.fwd[a:b].tolist())
            compute_b = sum(layers.bwd[a:b].tolist())
            if config.recompute == "full":
                recompute = compute_f
            elif config.recompute == "selective":
                recompute = sum(layers.selective[a:b].tolist())
            else:
                recompute = 0.0
            tf = tb = 0.0
            if layers.tp:
                group = rank_map.tp_group(0, s)
                for (kind, phase, size), counts in layers.tp.items():
                    count = float(counts[a:b].sum())
                    if count:
                        t = self._cost(kind, group, size) * count
                        if phase is Phase.FORWARD:
                            tf += t
                        elif phase is Phase.BACKWARD:
                            tb += t
            if config.recompute == "full":
                tb += tf
            reads = input_bytes / pcie if layers.reads_input[a:b].any() else 0.0
            fwd[s] = compute_f + tf + reads
            bwd[s] = compute_b + recompute + tb
            tp_f[s], tp_b[s] = tf, tb
            comp_f[s], comp_b[s] = compute_f, compute_b + recompute
            local = sum(layers.params_local[a:b].tolist()) + tied_local[s]
            runs: list[tuple[float, int]] = []
            after_s = 0.0
            group = rank_map.dp_group(s, 0)
            for dc in data_parallel_comms(local * grad_bytes, d, config.zero_stage, config.bucket_bytes):
                t = self._cost(dc.kind, group, dc.message_bytes)
                if dc.phase is Phase.BACKWARD:
                    runs.append((t, dc.count))
                elif dc.phase is Phase.OPTIMIZER:
                    after_s += t * dc.count
            buckets.append(runs)
            after[s] = after_s
            opt_params = local / (d if config.zero_stage >= 1 else 1)
            opt[s] = optimizer_step_s(opt_params, config.optimizer, dtype_bytes, gpu.hbm_bytes_per_s)
            # memory, as the analysis's _stage_memory
            states = model_state_bytes(local, d, config.zero_stage, config.optimizer, dtype_bytes)
            per_mb, rebuilt, transient = self._activations(config, a, b)
            in_flight = in_flight_micro_batches(config.schedule, p, m, s, config.virtual_stages)
            buffers = (boundary[s - 1] if s > 0 else 0.0) + (boundary[s] if s < len(boundary) else 0.0)
            dp_bucket = float(config.bucket_bytes) if d > 1 else 0.0
            total = stage_memory_dict(states, per_mb * in_flight, buffers + dp_bucket, transient + rebuilt)["total_bytes"]
            peak = max(peak, total)
        send_f = np.array(send + [0.0])
        send_b = np.array([0.0] + send_back)
        return _Prepared(config, fwd, bwd, tp_f, tp_b, send_f, send_b, comp_f, comp_b, buckets, opt, after, peak,
                         layers.flops_fwd / config.micro_batch_size)

    # ---- many configurations
    def evaluate(self, configs: Sequence[ParallelConfig]) -> list[dict[str, Any]]:
        """Summary numbers per configuration (the analysis's keys); raises nothing: a failed
        configuration's dict has ``error``."""
        out: list[dict[str, Any] | None] = [None] * len(configs)
        groups: dict[tuple, list[tuple[int, _Prepared]]] = defaultdict(list)
        for i, config in enumerate(configs):
            try:
                prep = self.prepare(config)
            except ConfigError as exc:
                out[i] = {"error": " ".join(str(exc).split())}
                continue
            v = config.virtual_stages if config.schedule == "interleaved" else 1
            groups[(config.schedule, config.pp_size, config.num_micro_batches, v)].append((i, prep))
        for (schedule, p, m, v), members in groups.items():
            for i, summary in zip((i for i, _ in members), _simulate_group(schedule, p, m, v, [pr for _, pr in members],
                                                                          self.cluster)):
                out[i] = summary
        return out  # type: ignore[return-value]


def _simulate_group(schedule: str, p: int, m: int, v: int, preps: list[_Prepared], cluster: Cluster) -> list[dict[str, Any]]:
    """Iteration time and breakdown of configurations sharing a schedule (analysis._simulate and
    _summarize, vectorised)."""
    cs = compile_schedule(schedule, p, m, v)
    k = len(preps)
    f = np.stack([pr.fwd for pr in preps])
    b = np.stack([pr.bwd for pr in preps])
    tf = np.stack([pr.tp_f for pr in preps])
    tb = np.stack([pr.tp_b for pr in preps])
    sf = np.stack([pr.send_f for pr in preps])
    sb = np.stack([pr.send_b for pr in preps])
    if v > 1:  # each chunk is 1/v of the device's work; the wrap-around uses the largest send
        wrap = sf[:, :-1].max(axis=1, initial=0.0)
        wrap_b = sb[:, 1:].max(axis=1, initial=0.0)
        sf = np.where(sf > 0, sf, wrap[:, None])
        sb = np.where(sb > 0, sb, wrap_b[:, None])
        f, b, tf, tb = f / v, b / v, tf / v, tb / v
    free_f, free_b = f - tf, b - tb
    zeros = np.zeros_like(f)
    end = pipeline_end_times(cs, np.vstack([f, free_f]), np.vstack([b, free_b]), np.vstack([sf, zeros]),
                             np.vstack([sb, zeros]))
    ce = end[:, cs.last_step]  # [2K, p] compute end per device
    ce_full, ce_free = ce[:k], ce[k:]
    out = []
    for i, pr in enumerate(preps):
        config = pr.config
        ends = []
        for dev in range(p):
            c_end = ce_full[i, dev]
            dur = b[i, dev]
            t = bucket_tail_end(c_end - dur, dur, c_end, pr.buckets[dev], config.overlap_grad_reduce)
            ends.append(max(t, c_end) + pr.optimizer[dev] + pr.after_step[dev])
        iteration = float(max(ends))
        free_iteration = float(np.max(ce_free[i] + pr.optimizer))
        busy = m * v * (free_f[i] + free_b[i])
        crit = max(range(p), key=lambda dev: (busy[dev], -dev))
        compute = float(m * (pr.compute_f[crit] + pr.compute_b[crit]))
        bubble = max(float(ce_free[i].max()) - float(busy[crit]), 0.0)
        model_flops = 3 * pr.flops_fwd_per_sample * config.global_batch_size
        peak = cluster.gpu.peak_flops(config.dtype)
        out.append({
            "error": None,
            "iteration_time_s": iteration,
            "compute_time_s": compute,
            "exposed_comm_time_s": max(iteration - free_iteration, 0.0),
            "bubble_time_s": bubble,
            "bubble_fraction": float(bubble / busy[crit]) if busy[crit] else 0.0,
            "optimizer_time_s": float(pr.optimizer[crit]),
            "mfu": model_flops / (iteration * config.num_gpus * peak) if iteration > 0 else None,
            "tflops_per_gpu": model_flops / (iteration * config.num_gpus) / 1e12 if iteration > 0 else None,
            "peak_memory_bytes": float(pr.peak_memory),
            "fits": pr.peak_memory <= float(cluster.gpu.hbm_bytes),
        })
    return out
