"""Advice a reviewer asks for next, each candidate evaluated by the sweep's evaluator.

Two lists sit on the overview and in data.json:

- :func:`speed_recommendations`: changes on the same GPUs and global batch that shorten the
  iteration by at least 1% -- more micro-batches (half the micro-batch size), interleaving (2
  chunks per GPU; Narayanan et al. 2021 Sec. 2.2.2), the tensor group inside one node (Takeaway
  #1), sequence parallelism (Korthikanti et al. 2022), ZeRO-1 (Rajbhandari et al. 2020);
- :func:`alignment_recommendations`: a matrix product whose row length is not a multiple of 8
  16-bit elements (GPT-2's vocabulary of 50,257) runs cuBLAS's slow fallback kernel; padding that
  dimension to a multiple of 64, as Megatron-LM does with its vocabulary, is evaluated by the
  GEMM model on every GEMM it touches (:func:`dml2comm.cost.gemm.padding_saving_s`);
- :func:`memory_suggestions`: when the run does not fit, the smallest single changes that make
  it fit -- a higher ZeRO stage, selective or full recomputation, twice the tensor or pipeline
  size at half the data-parallel size.

Each candidate is evaluated, not guessed, by :class:`dml2comm.model.FastEvaluator` -- the
stage plans of :mod:`dml2comm.cost.stages` the analysis itself reads, simulated without the
drawings' comm nodes and events -- so a recommendation's time is the time the analysis of that
command prints (to the collapse's 1e-12).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

from dml2comm.cost.stages import Pricing
from dml2comm.errors import Dml2CommError
from dml2comm.hardware.cluster import Cluster
from dml2comm.ir.onnx_import import ImportResult
from dml2comm.parallel.config import RECOMPUTE_MODES, ParallelConfig, Schedule
from dml2comm.model import FastEvaluator

#: The multiple a dimension is padded to (:func:`dml2comm.cost.gemm.aligned_dim`: 64 16-bit
#: elements, 128 bytes; nanoGPT pads GPT-2's vocabulary to 50,304, Megatron-LM to 128 x t).
PAD_MULTIPLE = 64

__all__ = ["alignment_recommendations", "config_warnings", "memory_suggestions", "speed_recommendations"]

#: A gain under 1% is within the model's own error (``python main.py validate``): noise, not advice.
MIN_GAIN = 0.01


def _evaluate(evaluator: FastEvaluator, config: ParallelConfig) -> dict[str, Any]:
    """One candidate's summary numbers, or ``{"error": message}`` (any refusal of the tool)."""
    try:
        return evaluator.evaluate([config])[0]
    except Dml2CommError as exc:
        return {"error": " ".join(str(exc).split())}


def speed_recommendations(imported: ImportResult, config: ParallelConfig, cluster: Cluster, base_iteration_s: float, *,
                          lenient: bool = False, reimport: Callable[[int], ImportResult] | None = None) -> list[dict[str, Any]]:
    """The changes that help, fastest first (module docstring); ``reimport(b)``: the model bound
    to micro-batch ``b`` (without it, the micro-batch size is not varied)."""
    tries: list[tuple[str, ParallelConfig, ImportResult]] = []
    if reimport is not None and config.micro_batch_size % 2 == 0:
        b = config.micro_batch_size // 2
        tries.append((f"--micro-batch-size {b} ({2 * config.num_micro_batches} micro-batches)",
                      replace(config, micro_batch_size=b), reimport(b)))
    if config.pp_size > 1 and config.schedule is not Schedule.INTERLEAVED and config.num_micro_batches % config.pp_size == 0:
        tries.append(("--schedule interleaved --virtual-stages 2",
                      replace(config, schedule=Schedule.INTERLEAVED, virtual_stages=2), imported))
    gpn = cluster.gpus_per_node
    if config.tp_size > gpn and config.tp_size % gpn == 0:
        k = config.tp_size // gpn
        tries.append((f"--t {gpn} --d {config.dp_size * k} (tensor group inside a node)",
                      replace(config, tp_size=gpn, dp_size=config.dp_size * k), imported))
    if config.tp_size > 1 and not config.sequence_parallel:
        tries.append(("--sequence-parallel", replace(config, sequence_parallel=True), imported))
    if config.dp_size > 1 and config.zero_stage == 0:
        tries.append(("--zero 1", replace(config, zero_stage=1), imported))
    evaluators: dict[int, FastEvaluator] = {}
    pricing = Pricing(cluster)  # one cluster: the evaluators of the imports share its prices
    out = []
    for change, cfg, imp in tries:
        if cfg.global_batch_size % (cfg.micro_batch_size * cfg.dp_size):
            continue
        ev = evaluators.get(id(imp))
        if ev is None:
            ev = evaluators[id(imp)] = FastEvaluator(imp, cluster, lenient=lenient, pricing=pricing)
        row = _evaluate(ev, cfg)
        if row.get("error"):
            continue
        t = row["iteration_time_s"]
        if t < base_iteration_s * (1 - MIN_GAIN):
            out.append({"change": change, "iteration_time_s": t, "speedup": base_iteration_s / t, "fits_in_memory": row["fits_in_memory"],
                        "peak_memory_bytes": row["peak_memory_bytes"]})
    return sorted(out, key=lambda r: r["iteration_time_s"])


def memory_suggestions(imported: ImportResult, config: ParallelConfig, cluster: Cluster, *, lenient: bool = False) -> list[dict[str, Any]]:
    """Each single change that may make the run fit, with its peak memory and whether it fits
    (a refused change keeps its reason as ``note``)."""
    candidates: list[tuple[str, ParallelConfig]] = []
    if config.dp_size > 1:
        candidates += [(f"--zero {z}", replace(config, zero_stage=z)) for z in range(config.zero_stage + 1, 4)]
    for mode in RECOMPUTE_MODES[RECOMPUTE_MODES.index(config.recompute) + 1:]:
        candidates.append((f"--recompute {mode}", replace(config, recompute=mode)))
    if config.dp_size % 2 == 0:
        half = config.dp_size // 2
        if config.global_batch_size % (config.micro_batch_size * half) == 0:
            candidates.append((f"--t {config.tp_size * 2} --d {half}", replace(config, tp_size=config.tp_size * 2, dp_size=half)))
            candidates.append((f"--p {config.pp_size * 2} --d {half}", replace(config, pp_size=config.pp_size * 2, dp_size=half)))
    evaluator = FastEvaluator(imported, cluster, lenient=lenient)
    out = []
    for change, cfg in candidates:
        row = _evaluate(evaluator, cfg)
        if row.get("error"):  # e.g. t no longer divides the heads
            out.append({"change": change, "peak_bytes": None, "fits": False, "note": row["error"]})
        else:
            out.append({"change": change, "peak_bytes": row["peak_memory_bytes"], "fits": row["fits_in_memory"],
                        "iteration_time_s": row["iteration_time_s"]})
    return out


def alignment_recommendations(graph, tp, config: ParallelConfig, cluster: Cluster, stage_of_op, stage_busy_s,
                              base_iteration_s: float, fits_in_memory: bool = True,
                              peak_memory_bytes: float | None = None) -> list[dict[str, Any]]:
    """Padding each unaligned GEMM dimension to a multiple of :data:`PAD_MULTIPLE`, evaluated.

    For every matrix product on its tensor-parallel shard whose forward, data- or weight-gradient
    GEMM is not aligned (:func:`dml2comm.cost.gemm.is_aligned`), the three GEMMs are timed as
    they are and padded (:func:`dml2comm.cost.gemm.padding_saving_s`); the savings of the ops that
    share an unaligned dimension add up per stage and micro-batch.  The iteration gains that times
    the micro-batches on the stage that holds them when it is the busiest stage (``stage_busy_s``),
    else only what takes it below the next busiest: a pipeline runs at its slowest stage.  Empty
    where every GEMM is aligned or padding would not save :data:`MIN_GAIN`, and under ``--stack
    megatron``, which pads its vocabulary itself (and is costed so).  ``stage_busy_s``: each
    stage's compute per iteration; ``fits_in_memory`` and ``peak_memory_bytes``: the run's own (the
    padded rows add a few parameters, not counted).
    """
    from dml2comm.cost.gemm import aligned_dim, is_aligned, padding_saving_s
    from dml2comm.cost.ops import op_gemms
    from dml2comm.parallel.config import Stack

    if config.stack is Stack.MEGATRON:  # Megatron-LM pads its vocabulary itself (dml2comm.cost.ops.MEGATRON_PAD)
        return []

    saving: dict[int, dict[int, float]] = {}  # dimension -> stage -> seconds per micro-batch
    for op in graph.ops:
        shard = tp.shards[op.index]
        gemms = op_gemms(op.op_type, shard.inputs, shard.outputs, op.attrs) if op.op_type != "Conv" else None
        if gemms is None or all(is_aligned(config.dtype, *g) for g in gemms):
            continue
        fwd = gemms[0]
        dims = sorted({d for d in (fwd.n, fwd.k, fwd.m) if d % 8})
        if not dims:
            continue
        gain = sum(padding_saving_s(cluster.gpu, config.dtype, *g, multiple=PAD_MULTIPLE)[1] for g in gemms)
        if gain > 0:
            per_stage = saving.setdefault(dims[0], {})
            per_stage[stage_of_op[op.index]] = per_stage.get(stage_of_op[op.index], 0.0) + gain
    out = []
    busy = list(stage_busy_s)
    for dim, per_stage in sorted(saving.items()):
        shortened = list(busy)
        for stage, gain in per_stage.items():
            shortened[stage] = busy[stage] - gain * config.num_micro_batches
        gained = max(busy) - max(shortened)
        if gained < base_iteration_s * MIN_GAIN:
            continue
        t = base_iteration_s - gained
        out.append({"change": f"pad the dimension {dim:,} to {aligned_dim(dim, PAD_MULTIPLE):,}",
                    "note": (f"a multiple of {PAD_MULTIPLE}: cuBLAS runs a slow fallback kernel for 16-bit GEMMs whose rows are not "
                             "a multiple of 8 elements; Megatron-LM pads its vocabulary, in Hugging Face "
                             f"model.resize_token_embeddings(n, pad_to_multiple_of={PAD_MULTIPLE}); the GEMMs re-timed padded"),
                    "iteration_time_s": t, "speedup": base_iteration_s / t, "fits_in_memory": fits_in_memory,
                    "peak_memory_bytes": peak_memory_bytes})
    return out


def config_warnings(config: Any, cluster: Any) -> tuple[str, ...]:
    """Valid configurations a reviewer should be told about (they go to ``warnings`` in data.json,
    the site and the terminal).

    - Tensor parallelism wider than a node: its all-reduces of every layer cross the NICs, which
      Megatron-LM avoids (Narayanan et al. 2021, Sec. 3.3: "tensor model parallelism ... within a
      multi-GPU server"; the takeaway of their Sec. 5.4 keeps t at or below the GPUs per node).
    - ZeRO-2/3 with pipeline parallelism: DeepSpeed refuses it (``deepspeed/runtime/pipe/engine.py``,
      ``PipelineEngine.__init__``: ``assert self.zero_optimization_stage() < 2, "ZeRO-2 and ZeRO-3
      are incompatible with pipeline parallelism"``; DeepSpeed issue #1110). PyTorch FSDP with a
      pipeline (torchtitan) does combine them, so this is a warning, not an error.
    """
    out = []
    per_node = cluster.gpus_per_node
    if config.tp_size > per_node and config.num_gpus > per_node:
        out.append(f"tensor parallelism t={config.tp_size} is wider than a node of {per_node} GPUs: its per-layer all-reduces "
                   f"cross the inter-node network (Megatron-LM keeps t <= GPUs per node); try --t {per_node} with more --p or --d")
    if config.zero_stage >= 2 and config.pp_size > 1:
        out.append(f"ZeRO-{config.zero_stage} with pipeline parallelism (p={config.pp_size}): DeepSpeed refuses this combination "
                   "(its PipelineEngine asserts ZeRO stage < 2: gradient/parameter sharding conflicts with per-micro-batch "
                   "gradient accumulation across stages); the figures assume an FSDP-style implementation (e.g. torchtitan); "
                   "use --zero 1 for DeepSpeed or Megatron-LM")
    return tuple(out)
