"""Measured / modelled kernel-time ratios of a profiled step (``--profile TRACE``).

A profiled step of the model (one rank's Kineto trace with ``record_shapes=True``) is joined to
the model's layers (:func:`dml2comm.traces.join.join_trace`); per layer kind (embedding, blocks,
head, the loss, the optimizer) and pass the measured GPU time is divided by the tool's own kernel
time for the same layers: the profiled micro-batch and sequence (the token ids' shape the trace
recorded), the trace's GPU, d = t = p = 1, the plan's stack, precision and optimizer, and no host
model (:data:`dml2comm.cost.host.NONE`: kernel time, as the trace measures).  The ratios
(:class:`dml2comm.cost.profile.ProfileScale`) then scale the cost model's kernel times of any
plan of the same model.

The same trace gives the host model (:mod:`dml2comm.traces.host`: the CPU's issue time and the
GPU's idle time per kernel, the issue time scaled by the profiler's slowdown where ``--step-time``
gives the step's time without the profiler): it replaces the stack's preset host model on top of
the scaled kernel times, unless the user names one (``--host-model``).

Several traces: per kind, the sum of the measured times over the sum of the modelled ones; the
host figures likewise summed.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import re
from pathlib import Path
from typing import Any, Sequence

from dml2comm.cost.host import AUTO, host_model
from dml2comm.cost.profile import KINDS, ProfileScale, scaled_share
from dml2comm.errors import ConfigError
from dml2comm.ir.layers import LayerKind

__all__ = ["attributed_share", "error_figures", "expected_error_of", "held_out_shapes", "split_halves", "measured_and_modelled",
           "eager_precision", "profile_from_args", "profile_scale", "trace_gpu", "traced_precision"]


def trace_gpu(device: str) -> str | None:
    """The GPU preset a trace's device name (``deviceProperties``' ``name``) is, None when none is
    recognised (``NVIDIA H100 80GB HBM3`` -> ``h100``)."""
    from dml2comm.hardware.gpus import GPU_ALIASES

    text = device.lower()
    best = None
    for alias in GPU_ALIASES:
        token = alias.split("-")[0]
        if token and len(token) >= 4 and token in text.split() and (best is None or len(alias) < len(best)):
            best = alias
    return best


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def measured_and_modelled(trace_path: str, model_path: str, config: Any, options: Any = None, gpu: str | None = None,
                          lenient: bool = False, check_model: bool = True, fallback_gpu: str | None = None) -> dict[str, Any]:
    """Per kind of :data:`~dml2comm.cost.profile.KINDS`: measured and modelled (forward, backward)
    seconds of one profiled step (module docstring).

    Parameters
    ----------
    trace_path : the profiled step (one rank's trace).
    model_path : the ONNX model the run trained.
    config : a :class:`~dml2comm.parallel.config.ParallelConfig` whose stack, precision, attention,
        dtype and optimizer the modelled times take (its sizes are replaced by the profiled ones).
    options : :class:`~dml2comm.ir.onnx_import.ImportOptions` of the model (its batch size and
        sequence length are replaced by the trace's).
    gpu : the GPU preset to model the step on; None: the trace's own device.
    check_model : refuse a trace whose forward GEMMs do not match the model's.
    fallback_gpu : the GPU to model a trace on that names no device (None: refuse it).

    Returns
    -------
    dict with ``measured`` and ``modelled`` ({kind: (forward, backward)}: blocks as the mean of
    the blocks, the optimizer's step as its forward), ``micro_batch``, ``seq_len``, ``gpu``,
    ``file``, ``sha256``, ``unattributed_s``, ``gpu_s``, ``passes`` (the step's micro-batches:
    gradient accumulation runs several, and the measured times are per micro-batch, the
    optimizer's per step), ``host`` (its
    :class:`~dml2comm.traces.host.HostFigures`), ``block_spread`` (:func:`_ratio_spread`) and ``gemms``
    ((M, N, K) key, measured, modelled forward seconds) of each weight GEMM the join matched.

    Raises
    ------
    ConfigError
        The trace has no token ids, its device is not a known GPU (and ``gpu`` is None), or
        (``check_model``) it is not a step of this model."""
    from dml2comm.cost.cache import layers_of
    from dml2comm.cost.ops import shard_op_costs
    from dml2comm.cost.stages import StageCoster
    from dml2comm.hardware.cluster import make_cluster
    from dml2comm.ir.gemms import graph_gemm_ops
    from dml2comm.ir.onnx_import import ImportOptions
    from dml2comm.traces.host import host_figures
    from dml2comm.traces.join import OPTIMIZER, join_trace

    name = Path(trace_path).name
    trace, b, s, gpu_name = _profiled_step(trace_path, gpu, fallback_gpu)
    updated = _fused_adam_dtypes(trace)  # PyTorch's own optimizer ran: an eager PyTorch step
    _check_precision(updated, config, name)
    options = options or ImportOptions()
    imported = _bound_model(model_path, dataclasses.replace(options, batch_size=b, seq_len=s, lenient=lenient), name, b)
    layered = layers_of(imported.graph)
    join = join_trace(trace, layered)
    if check_model:
        _check_model(join, layered, name, b, s)
        _check_attributed(join, name)
    one = _one_gpu(config, b, s)
    cluster = make_cluster(gpu_name, 1, 1)
    cluster = dataclasses.replace(cluster, host_model="none", profile_scale=None)
    coster = StageCoster(imported, cluster, collapse=False, lenient=lenient)
    table = coster.layer_table(one)
    plan = coster.prepare(one)
    op_times = shard_op_costs(imported.graph, 1, False, one.dtype, cluster.gpu, lenient, coster.host_for(one), one.stack,
                              one.attention, one.precision, None, layered).times  # the layer table's own (cached)
    keys = {i: key for key, _, i in graph_gemm_ops(layered)}
    kinds = [x.kind for x in layered.layers]
    measured, modelled = _per_kind(join, kinds, table, plan, float(coster.stage_table(one).reads.sum()))
    k = join.passes  # micro-batches of the step (gradient accumulation): the model's times are one's
    measured = {kind: v if kind == OPTIMIZER else (v[0] / k, v[1] / k) for kind, v in measured.items()}
    shared_s = _shared_sum_s(coster, one, cluster) if LayerKind.EMBEDDING in measured else 0.0
    if shared_s:  # the tied gradient's sum runs in the embedding's backward; the model charges it apart
        f, b_s = measured["embedding"]
        measured["embedding"] = (f, max(b_s - shared_s / len([x for x in join.layers if x.kind == LayerKind.EMBEDDING]), 0.0))
    return {"file": name, "sha256": _sha256(trace_path), "micro_batch": b, "seq_len": s, "gpu": cluster.gpu.name,
            "measured": measured, "modelled": modelled, "gpu_s": join.gpu_s, "unattributed_s": join.unattributed_s,
            "shared_sum_s": shared_s,
            "blocks": len([k for k in kinds if k is LayerKind.BLOCK]), "host": host_figures(trace),
            "passes": k, "eager_optimizer": bool(updated),
            **_launches(imported, one, cluster, lenient, layered, k),
            "block_spread": _ratio_spread(join, kinds, table),
            "gemms": [(keys[i], meas, op_times[i][0]) for i, meas in join.gemms if i in keys],
            "own_step_s": functools.partial(_own_step_s, imported, gpu_name, dataclasses.replace(one, global_batch_size=k * b),
                                            lenient)}


#: Blocks whose modelled times differ by less than this share are alike: their measured times
#: differ by noise (GPT-2 small's twelve blocks are modelled within 0.5%, ResNet-18's stages' first
#: and second blocks 27-37% apart).
ALIKE_BLOCKS = 0.05


def _ratio_spread(join: Any, kinds: list[Any], table: Any) -> float:
    """The noise in the blocks' one ratio: (max - min) / mean of the measured times of blocks the
    model times alike (within :data:`ALIKE_BLOCKS` of each other: a transformer's, whose first
    block may add a cast or a mask; a ResNet's two blocks of one shape, not its stages, whose
    times differ by their shapes: 268% between its blocks at b = 128), weighted by their time
    where there are several such groups; where no two blocks are alike, the spread of each block's
    measured over modelled time."""
    idx = [i for i, k in enumerate(kinds) if k == LayerKind.BLOCK]
    rows = [x for x in join.layers if x.kind == LayerKind.BLOCK]
    pairs = [(x.total_s, float(table.fwd[i] + table.bwd[i])) for x, i in zip(rows, idx)]
    groups: list[list[tuple[float, float]]] = []
    for measured, modelled in sorted(pairs, key=lambda x: x[1]):
        if groups and modelled <= groups[-1][0][1] * (1 + ALIKE_BLOCKS):
            groups[-1].append((measured, modelled))
        else:
            groups.append([(measured, modelled)])
    alike = [[m for m, _ in g] for g in groups if len(g) > 1 and sum(m for m, _ in g) > 0]
    if alike:
        weight = sum(sum(g) for g in alike)
        return sum((max(g) - min(g)) / (sum(g) / len(g)) * sum(g) for g in alike) / weight
    ratios = [m / d for m, d in pairs if d > 0]
    if len(ratios) < 2 or sum(ratios) <= 0:
        return 0.0
    return (max(ratios) - min(ratios)) / (sum(ratios) / len(ratios))


def _own_step_s(imported: Any, gpu_name: str, config: Any, lenient: bool, scale: ProfileScale) -> float:
    """The model's time of the profiled step (``config`` on one ``gpu_name``) with the profile
    ``scale`` (its ratios and host model): the sweep's evaluator, which equals the analysis.
    NaN where the evaluator refuses the configuration."""
    from dml2comm.hardware.cluster import make_cluster
    from dml2comm.model.evaluator import FastEvaluator

    cluster = dataclasses.replace(make_cluster(gpu_name, 1, 1), profile_scale=scale)
    row = FastEvaluator(imported, cluster, lenient=lenient).evaluate([config])[0]
    return float("nan") if row["error"] is not None else float(row["iteration_time_s"])


def _profiled_step(trace_path: str, gpu: str | None, fallback_gpu: str | None = None) -> tuple[Any, int, int | None, str]:
    """(the trace, its micro-batch and sequence (:func:`dml2comm.traces.join.step_shape`: None
    for an image model's), the GPU preset to model it on: ``gpu``, the trace's device, or where
    the trace names none ``fallback_gpu``); a one-line :class:`ConfigError` when either is
    missing, or when the trace holds events whose times cannot be (a damaged file)."""
    from dml2comm.traces.join import step_shape
    from dml2comm.traces.load import load_trace

    name = Path(trace_path).name
    trace = load_trace(trace_path, shapes=True)
    if trace.bad_events:
        raise ConfigError(f"--profile {name}: {trace.bad_events} of its events have times that cannot be (missing, not "
                          "numbers, infinite, negative or over a day): a damaged or edited file; export the step again")
    _check_linked(trace, name)
    shape = step_shape(trace)
    if shape is None:
        raise ConfigError(f"--profile {name}: the trace records no input shapes (token ids for aten::embedding, images for "
                          "a convolution); profile the step with record_shapes=True")
    gpu_name = gpu or trace_gpu(trace.device or "") or (fallback_gpu if not trace.device else None)
    if gpu_name is None:
        raise ConfigError(f"--profile {name}: its device {trace.device!r} is not a GPU the tool knows (the ratios need the "
                          "modelled times of the GPU that ran it); profile on one of the preset GPUs")
    return trace, shape[0], shape[1], gpu_name


#: The parameters' dtype as PyTorch's fused Adam/AdamW kernel names it (its first template argument).
_FUSED_ADAM = re.compile(r"FusedAdamMathFunctor<(float|double|c10::BFloat16|c10::Half)\b")


def _precision_of(dtype: str) -> Any:
    """The eager-PyTorch :class:`~dml2comm.parallel.config.Precision` whose optimizer updates
    parameters of ``dtype`` (a fused AdamW kernel's template argument): fp32 ones ``amp``
    (autocast), 16-bit ones ``bf16`` (the whole model in 16 bits, ``--dtype`` bf16 or fp16)."""
    from dml2comm.parallel.config import Precision

    return Precision.AMP if dtype in ("float", "double") else Precision.BF16


def _check_precision(updated: set[str], config: Any, name: str) -> None:
    """Refuse a trace whose optimizer updated parameters (``updated``: their dtypes,
    :func:`_fused_adam_dtypes`) of another precision than ``config``'s under the pytorch stack:
    the ratios would carry the other precision's casts and the plan would be costed in one
    precision and scaled by another's.  So is ``--optimizer sgd`` against a step that ran
    Adam(W): the optimizer's ratio (Adam's measured time over SGD's modelled) would give the plan
    Adam's step back."""
    from dml2comm.parallel.config import Optimizer, Precision, Stack

    if updated and config.optimizer is Optimizer.SGD:
        raise ConfigError(f"--profile {name}: the profiled step ran PyTorch's fused Adam/AdamW, but --optimizer sgd plans "
                          "another optimizer step; pass --optimizer adamw (or adam), or profile an SGD step")
    ran = {_precision_of(d) for d in updated}
    if config.stack is not Stack.PYTORCH or not ran or config.precision in ran:
        return
    full = Precision.AMP in ran  # the step's parameters were fp32: autocast (or fp32 training)
    holds = "16 bits" if config.precision is Precision.BF16 else "fp32 master copies beside 16-bit ones" \
        if config.precision is Precision.MIXED else "fp32"
    raise ConfigError(f"--profile {name}: its optimizer updated {'fp32' if full else '16-bit'} parameters, but --precision "
                      f"{config.precision} holds them in {holds}; pass --precision "
                      f"{'amp' if full else 'bf16'} (the profiled step's), or profile a step of this precision")


def _check_one_precision(paths: Sequence[str], config: Any) -> None:
    """Refuse ``--profile`` traces that ran different eager precisions (one ``bf16``, one
    ``amp``) under the pytorch stack: no one ``--precision`` fits both."""
    from dml2comm.parallel.config import Stack

    if config.stack is not Stack.PYTORCH or len(paths) < 2:
        return
    ran = {Path(p).name: traced_precision([p]) for p in paths}
    if len({v for v in ran.values() if v is not None}) > 1:
        listed = ", ".join(f"{k} {v}" for k, v in ran.items() if v is not None)
        raise ConfigError(f"--profile: the traces ran different precisions ({listed}); pass traces of one precision")


def _bound_model(model_path: str, options: Any, name: str, b: int) -> Any:
    """The model bound to the profiled step's sizes; a trace of an image model (no token ids,
    ``options.seq_len`` None) on a model with a sequence to bind is not a step of it."""
    from dml2comm.errors import Dml2CommError
    from dml2comm.load import load_model

    try:
        return load_model(model_path, options)
    except Dml2CommError as exc:
        if options.seq_len is None and "not bound" in str(exc):
            raise ConfigError(f"--profile {name}: the step has no token ids (an image model's: its first convolution's batch "
                              f"is {b}), and this model takes a sequence: not a step of this model; profile this model") from None
        raise


#: Below this share of the step's GPU time placed on the model, a trace's ratios measure nothing
#: of it (kernels without their launch's correlation id, a step of another program).
MIN_ATTRIBUTED_SHARE = 0.5


#: A kernel starting this long before its launch call (microseconds) is a damaged trace: Kineto
#: puts CUPTI's GPU timestamps on the CPU's clock, within microseconds of each other.
KERNEL_BEFORE_LAUNCH_US = 1e6


def _check_linked(trace: Any, name: str) -> None:
    """Refuse a trace most of whose GPU time has no launch call joined to it (kernels without the
    runtime call's ``correlation`` id): no kernel could be charged to an operator; and one whose
    kernels start long before their launch (:data:`KERNEL_BEFORE_LAUNCH_US`)."""
    import numpy as np

    from dml2comm.traces.classify import launch_rows
    from dml2comm.traces.load import Kind

    gpu = np.flatnonzero(np.isin(trace.kind, Kind.GPU))
    launch = launch_rows(trace, gpu)
    total = float(trace.dur[gpu].sum())
    linked = float(trace.dur[gpu][launch >= 0].sum())
    early = trace.ts[gpu][launch >= 0] - trace.ts[launch[launch >= 0]]
    if early.size and float(early.min()) < -KERNEL_BEFORE_LAUNCH_US:
        raise ConfigError(f"--profile {name}: a kernel starts {-float(early.min()) / 1e6:.3g} s before the call that launched it: "
                          "a damaged or edited file (the profiler's CPU and GPU clocks agree within microseconds); export "
                          "the step again")
    if total > 0 and linked < MIN_ATTRIBUTED_SHARE * total:
        raise ConfigError(f"--profile {name}: {linked / total:.0%} of its GPU time has its launch call linked (the kernels "
                          "carry no correlation id of a CUDA runtime call); profile the step with CPU and CUDA activities, "
                          "as the documentation shows")


def _check_attributed(join: Any, name: str) -> None:
    """Refuse a trace whose GPU time the join could mostly not place (:data:`MIN_ATTRIBUTED_SHARE`)."""
    if join.gpu_s > 0 and join.attributed_share < MIN_ATTRIBUTED_SHARE:
        raise ConfigError(f"--profile {name}: only {join.attributed_share:.0%} of its GPU time could be placed on the model "
                          "(its kernels' launches are not linked: no correlation ids, or work of another program); profile "
                          "the step with CPU and CUDA activities, as the documentation shows")


def traced_precision(paths: Sequence[str]) -> str | None:
    """The eager-PyTorch ``--precision`` the profiled steps ran, read off their fused Adam/AdamW
    kernels' names in the files (fp32 parameters: ``amp``; 16-bit: ``bf16``); None where a trace
    ran none, or the traces disagree.  A scan of the raw text (the first such kernel name), not a
    parse: it decides the precision before the traces are modelled in it."""
    import gzip

    found = set()
    for path in paths:
        try:
            with open(path, "rb") as head:
                zipped = head.read(2) == b"\x1f\x8b"  # by content, as the loader reads it, not by suffix
            opener = gzip.open if zipped else open
            with opener(path, "rt", encoding="utf-8", errors="replace") as f:
                tail, match = "", None
                for chunk in iter(lambda: f.read(1 << 20), ""):
                    match = _FUSED_ADAM.search(tail + chunk)
                    if match:
                        break
                    tail = chunk[-200:]
        except (OSError, EOFError, ValueError):
            return None  # unreadable: the trace's own reading says why
        if match is None:
            return None
        found.add(_precision_of(match.group(1)))
    return str(found.pop()) if len(found) == 1 else None


def eager_precision(trace: Any) -> str | None:
    """The eager-PyTorch ``--precision`` a loaded trace's step ran (:func:`traced_precision`'s
    reading, from its fused Adam/AdamW kernels); None where it ran none or several."""
    ran = {_precision_of(d) for d in _fused_adam_dtypes(trace)}
    return str(ran.pop()) if len(ran) == 1 else None


def _fused_adam_dtypes(trace: Any) -> set[str]:
    """The parameter dtypes PyTorch's own fused Adam/AdamW kernels updated in ``trace`` (their
    names' first template argument; empty where it ran none: another optimizer, or Megatron's
    apex / Transformer Engine Adam)."""
    import numpy as np

    from dml2comm.traces.load import Kind

    kernels = np.unique(trace.name[trace.kind == Kind.KERNEL])
    return {m.group(1) for i in kernels.tolist() for m in [_FUSED_ADAM.search(trace.names[i])] if m}


def _one_gpu(config: Any, b: int, s: int) -> Any:
    """``config``'s stack, precision, attention, dtype and optimizer on one GPU at the profiled
    micro-batch ``b`` and sequence ``s``, nothing parallel, recomputed or overlapped."""
    from dml2comm.parallel.config import Recompute

    return dataclasses.replace(config, dp_size=1, tp_size=1, pp_size=1, cp_size=1, ep_size=1, micro_batch_size=b,
                               global_batch_size=b, seq_len=s, sequence_parallel=False, zero_stage=0,
                               recompute=Recompute.NONE, virtual_stages=1, schedule="1f1b", rank_order="tpd",
                               tp_comm_overlap=False)


def _per_kind(join: Any, kinds: list[Any], table: Any, plan: Any, reads_s: float) -> tuple[dict, dict]:
    """Measured and modelled (forward, backward) seconds per layer kind (blocks: the mean of the
    blocks), the loss, the optimizer step (its forward) and, where the model reads its inputs
    over PCIe (``reads_s``), the input (the step's host-to-device copies in its forward, 0 where
    it made none: a batch already on the GPU, or copied on another stream)."""
    from dml2comm.traces.join import INPUT, LOSS, OPTIMIZER

    measured: dict[str, tuple[float, float]] = {}
    modelled: dict[str, tuple[float, float]] = {}
    for kind in (LayerKind.EMBEDDING, LayerKind.BLOCK, LayerKind.HEAD):
        rows = [x for x in join.layers if x.kind == kind]
        idx = [i for i, k in enumerate(kinds) if k == kind]
        if not rows or not idx:
            continue
        measured[kind] = (sum(x.forward_s for x in rows) / len(rows), sum(x.backward_s for x in rows) / len(rows))
        modelled[kind] = (float(table.fwd[idx].sum()) / len(idx), float(table.bwd[idx].sum()) / len(idx))
    by_name = {x.name: x for x in join.layers}
    if table.loss_f is not None and LOSS in by_name:
        measured["loss"] = (by_name[LOSS].forward_s, by_name[LOSS].backward_s)
        modelled["loss"] = (float(table.loss_f.sum()), float(table.loss_b.sum()))
    if OPTIMIZER in by_name:
        measured["optimizer"] = (by_name[OPTIMIZER].other_s, 0.0)
        modelled["optimizer"] = (float(plan.optimizer.sum()), 0.0)
    if reads_s > 0:
        measured["input"] = (by_name[INPUT].forward_s if INPUT in by_name else 0.0, 0.0)
        modelled["input"] = (reads_s, 0.0)
    return measured, modelled


def _check_model(join: Any, layered: Any, name: str, b: int, s: int) -> None:
    """Refuse a trace whose forward GEMMs do not all match the model's, or with a block no kernel
    falls in: a step of another model or shape."""
    from dml2comm.ir.gemms import graph_weight_ops

    wanted = len(graph_weight_ops(layered))
    blocks = [x for x in join.layers if x.kind == LayerKind.BLOCK]
    short = [n for n in join.notes if "weight GEMMs matched" in n]
    empty = [x.name for x in blocks if x.forward_s <= 0 or x.backward_s <= 0]
    if short or empty or not blocks:
        why = short[0].split(":")[0] if short else (f"no kernel of the trace falls in {empty[0]}" if empty else "the model has no blocks")
        raise ConfigError(f"--profile {name}: not a step of this model at micro-batch {b}, sequence {s}: {why} "
                          f"(the graph has {wanted} weight GEMMs and convolutions in {len(blocks)} blocks); profile this model")


def _shared_sum_s(coster: Any, config: Any, cluster: Any) -> float:
    """Seconds of autograd's sums of shared parameters' gradients in the profiled step (a tied
    embedding: the LM head's and the embedding's, :func:`dml2comm.cost.compute.
    shared_gradient_sum_s`).  The trace shows that add among the kernels of the backward that
    ran last, the embedding's; the cost model charges it to the stage, so it comes off the
    embedding's measured time before the ratio is taken (else it would count twice)."""
    from dml2comm.cost.compute import hbm_efficiency_of, shared_gradient_sum_s

    summed = sum(coster.stage_table(config).copies.summed_local)
    return shared_gradient_sum_s(summed, config, cluster.gpu.kernel_hbm_bytes_per_s * hbm_efficiency_of(cluster.gpu))


def profile_scale(parts: Sequence[dict[str, Any]], stack: str | None = None, step_time_s: float | None = None) -> ProfileScale:
    """The ratios of one or more :func:`measured_and_modelled` results: per kind and pass, the
    sum of the measured seconds over the sum of the modelled (a pass either side of which is 0
    keeps factor 1); with a ``stack``, also the host model fitted on them
    (:func:`dml2comm.traces.host.fitted_host_model` on that stack's preset), whose CPU side
    ``step_time_s`` (the step's time without the profiler, one trace) sets where the step is
    host-bound (:func:`dml2comm.traces.host.step_time_factor` on the model's time of the profiled
    step).

    Raises
    ------
    ConfigError
        ``step_time_s`` with several traces (which step is it?) or not a positive number."""
    from dml2comm.traces.host import check_step_time, fitted_host_model

    if step_time_s is not None:
        check_step_time(step_time_s)
    ratios = []
    for kind in KINDS:
        have = [p for p in parts if kind in p["measured"] and kind in p["modelled"]]
        if not have:
            continue
        r = []
        for k in (0, 1):
            meas = sum(p["measured"][kind][k] for p in have)
            model = sum(p["modelled"][kind][k] for p in have)
            # a step that copied no input (measured 0) reads none: factor 0
            r.append(meas / model if model > 0 and (meas > 0 or kind == "input") else 1.0)
        ratios.append((kind, r[0], r[1]))
    detail = (("traces", tuple({"file": p["file"], "micro_batch": p["micro_batch"], "seq_len": p["seq_len"], "gpu": p["gpu"],
                                "eager_optimizer": p.get("eager_optimizer", False),
                                "gpu_s": p["gpu_s"], "unattributed_s": p["unattributed_s"],
                                "measured_s": {k: list(v) for k, v in p["measured"].items()},
                                "modelled_s": {k: list(v) for k, v in p["modelled"].items()}} for p in parts)),)
    detail += (("error", error_figures(parts, step_time_s)),)
    host = None
    if stack is not None:
        figures, launches = [p["host"] for p in parts], [p.get("launches") for p in parts]
        forward = [p.get("forward_launches") for p in parts]
        traced = fitted_host_model(figures, host_model(AUTO, stack), 1.0, launches, forward)
        factor = _cpu_factor(parts, tuple(ratios), traced, step_time_s)
        host = traced.with_cpu_factor(factor)
        detail += (("host", {"kernel_s": host.kernel_s, "backward_kernel_s": host.backward_s, "gap_s": host.gap_s, "run_ahead": host.run_ahead,
                             "step_time_s": step_time_s, "cpu_slowdown_factor": factor,
                             "traces": [{"file": p["file"], **p["host"].to_dict(), "launches": p.get("launches"),
                                        "forward_launches": p.get("forward_launches")} for p in parts]}),)
    return ProfileScale(tuple(ratios), tuple((p["file"], p["sha256"]) for p in parts), host, detail)


def _launches(imported: Any, one: Any, cluster: Any, lenient: bool, layered: Any, passes: int) -> dict[str, int]:
    """The kernels the stack's host model charges CPU time for in the profiled step (its
    ``passes`` micro-batches), all and the forward pass's (:class:`dml2comm.cost.ops.OpCosts`)."""
    from dml2comm.cost.ops import shard_op_costs

    costs = shard_op_costs(imported.graph, 1, False, one.dtype, cluster.gpu, lenient, host_model(AUTO, one.stack),
                           one.stack, one.attention, one.precision, None, layered)
    return {"launches": passes * costs.launches, "forward_launches": passes * costs.forward_launches}


def _cpu_factor(parts: Sequence[dict[str, Any]], ratios: tuple, traced: Any, step_time_s: float | None) -> float:
    """The factor on the traces' CPU side (:func:`dml2comm.traces.host.fitted_host_model`'s):
    the profiler's median slowdown removed, or with ``step_time_s`` the one that best explains
    the timed step (:func:`dml2comm.traces.host.step_time_factor`, the model's time of the
    profiled step with ``traced``, the host model at the trace's own issue time, scaled)."""
    from dml2comm.traces.host import PROFILER_CPU_SLOWDOWN, step_time_factor

    if step_time_s is None:
        return 1.0 / PROFILER_CPU_SLOWDOWN
    if len(parts) != 1:
        raise ConfigError("--step-time is the time of one profiled step; pass one --profile trace with it")
    _check_step_time_fits(step_time_s, parts[0]["host"])

    def step_s(factor: float) -> float:
        host = traced.with_cpu_factor(factor)
        return parts[0]["own_step_s"](ProfileScale(ratios, host=host))

    return step_time_factor(step_s, step_time_s)


#: ``--step-time`` is refused below this share of the profiled step's GPU busy time (the profiler
#: does not slow the GPU's kernels; run-to-run kernel times differ by a few percent) and above
#: :data:`STEP_TIME_MAX_SPAN` times its span (the profiler only slows the step down: 0.9-1.9x in
#: the measured steps), where it cannot be the same step's time: a time in milliseconds, or of
#: another step.
STEP_TIME_MIN_BUSY = 0.9
STEP_TIME_MAX_SPAN = 5.0


def _check_step_time_fits(step_time_s: float, figures: Any) -> None:
    """Refuse a ``--step-time`` that the profiled step (its host ``figures``, per step) rules out."""
    busy, span = figures.gpu_busy_s / figures.steps, figures.gpu_span_s / figures.steps
    if step_time_s < STEP_TIME_MIN_BUSY * busy:
        raise ConfigError(f"--step-time {step_time_s:g}: shorter than the profiled step's GPU work alone ({busy:.4g} s of "
                          "kernels, which the profiler does not slow); pass the step's time without the profiler, in seconds")
    if step_time_s > STEP_TIME_MAX_SPAN * span:
        raise ConfigError(f"--step-time {step_time_s:g}: {step_time_s / span:.0f} times the profiled step ({span:.4g} s), "
                          "which the profiler only slows; pass the same step's time without the profiler, in seconds "
                          "(not milliseconds)")


def held_out_shapes(gemms: Sequence[tuple[tuple[int, ...], float, float]]) -> dict[str, Any]:
    """How well a measured / modelled ratio carries to GEMM shapes it was not measured on: the
    distinct (M, N, K) keys of ``gemms`` ((key, measured s, modelled s)) split in two halves by a
    hash of the key (:func:`split_halves`); each half's
    ratio (sum measured / sum modelled) predicts the other half's measured time.  ``error`` is the
    mean of the two relative errors; ``doublings`` the mean distance of a held-out key to the
    nearest key of the other half (:func:`dml2comm.ir.gemms.shape_doublings`, weighted by measured time);
    ``per_doubling`` their quotient (0 with fewer than two keys)."""
    from dml2comm.ir.gemms import shape_doublings

    fit, held = split_halves([g for g in gemms if g[1] > 0 and g[2] > 0])
    if not held or not fit:
        return {"shapes": len({g[0] for g in gemms}), "error": 0.0, "doublings": 0.0, "per_doubling": 0.0}
    errors, dists = [], []
    for a, b in ((fit, held), (held, fit)):
        ratio = sum(g[1] for g in a) / sum(g[2] for g in a)
        errors.append(abs(ratio * sum(g[2] for g in b) / sum(g[1] for g in b) - 1.0))
        near = [(min(shape_doublings(g[0], h[0]) for h in a), g[1]) for g in b]
        dists.append(sum(d * w for d, w in near) / sum(w for _, w in near))
    error, doublings = sum(errors) / 2, sum(dists) / 2
    return {"shapes": len({g[0] for g in gemms}), "error": error, "doublings": doublings,
            "per_doubling": error / doublings if doublings > 0 else 0.0}


def split_halves(gemms: Sequence[tuple[tuple[int, ...], float, float]]) -> tuple[list, list]:
    """(fit, held out): the distinct keys ordered by the sha256 of their ``repr``, the first
    ``round(keys / 2)`` (at least one, at most all but one) held out: the rule of
    :func:`dml2comm.calibrate.fit.split_by_shape` at ``holdout=0.5``, here without importing the
    calibration's fitting (its import is a third of a second; ``--profile`` stays interactive)."""
    keys = sorted({g[0] for g in gemms}, key=lambda k: hashlib.sha256(repr(k).encode()).hexdigest())
    if len(keys) < 2:
        return list(gemms), []
    held = set(keys[:min(max(1, round(0.5 * len(keys))), len(keys) - 1)])
    return [g for g in gemms if g[0] not in held], [g for g in gemms if g[0] in held]


def error_figures(parts: Sequence[dict[str, Any]], step_time_s: float | None = None) -> dict[str, Any]:
    """What the traces say about the error of a prediction scaled by their ratios (data.json
    ``profile.error``; :func:`dml2comm.cost.bands.profile_expected_error` turns them into a
    band): the join's unattributed share of the GPU time, the blocks' spread, the held-out shape
    error (:func:`held_out_shapes` over every trace's matched GEMMs), the share of the step the GPU
    waited for the CPU (module :mod:`dml2comm.traces.host`: the profiled starved idle over the
    profiled GPU span; with ``step_time_s``, the step's time without the profiler less the GPU's
    busy time and its queued idle, over that time), the share of the profiled span the GPU was idle
    at all (``idle_share``) and the profiled GEMM shapes, (micro-batch, sequence) pairs and GPUs."""
    figures = [p["host"] for p in parts]
    gpu_s = sum(p["gpu_s"] for p in parts)
    queued_idle = sum(f.gap_s * f.queued_gaps for f in figures)
    if step_time_s is not None and len(figures) == 1:  # one step's busy and queued idle against its time
        wait = max(0.0, step_time_s - (figures[0].gpu_busy_s + queued_idle) / figures[0].steps) / step_time_s
    else:
        span = sum(f.gpu_span_s for f in figures)
        wait = sum(f.starved_idle_s for f in figures) / span if span > 0 else 0.0
    gemms = [g for p in parts for g in p.get("gemms", ())]
    span = sum(f.gpu_span_s for f in figures)
    return {"unattributed_share": sum(p["unattributed_s"] for p in parts) / gpu_s if gpu_s > 0 else 0.0,
            "idle_share": (span - sum(f.gpu_busy_s for f in figures)) / span if span > 0 else 0.0,
            "block_spread": max(p.get("block_spread", 0.0) for p in parts),
            "held_out": held_out_shapes(gemms),
            "host_wait_share": wait, "host_bound": any(f.host_bound for f in figures), "step_time_s": step_time_s,
            "shapes": sorted({tuple(g[0]) for g in gemms}), "gpus": sorted({p["gpu"] for p in parts}),
            "tokens": sorted({p["micro_batch"] * (p["seq_len"] or 1) for p in parts}),
            "batch_seqs": sorted({(int(p["micro_batch"]), int(p["seq_len"])) for p in parts if p["seq_len"]})}


def attributed_share(analysis: Any) -> float:
    """Share of the plan's predicted compute whose time a measured ratio scaled
    (:func:`dml2comm.cost.profile.scaled_share` of the analysis's layers and stages)."""
    scale = analysis.cluster.profile_scale
    if scale is None:
        return 0.0
    return scaled_share(scale, analysis.layers, analysis.stages, analysis.config.num_micro_batches)


def expected_error_of(analysis: Any) -> dict[str, Any] | None:
    """The analysis's trace-derived band and its components
    (:func:`dml2comm.cost.bands.profile_expected_error`, the one its summary's
    ``expected_error`` holds); None without ``--profile``."""
    from dml2comm.cost.bands import profile_expected_error

    s = analysis.summary
    return profile_expected_error(analysis.config, analysis.cluster, analysis.graph.num_params, analysis.layered,
                                  analysis.layers, analysis.stages, s["iteration_time_s"], s["exposed_comm_time_s"],
                                  s["host_wait_share"])


def profile_from_args(paths: Sequence[str], model_path: str, config: Any, options: Any = None,
                      lenient: bool = False, step_time_s: float | None = None, fit_host: bool = True,
                      gpu: str | None = None) -> ProfileScale | None:
    """``--profile`` of the commands: the ratios of the traces ``paths`` (None without any),
    modelled with ``config``'s stack, precision and optimizer; with ``fit_host`` (no
    ``--host-model`` named) also their host model for ``config``'s stack, ``step_time_s``
    (``--step-time``) the step's time without the profiler.  ``gpu``: the plan's GPU, on which a
    trace that names no device (no ``deviceProperties``) is modelled.

    Raises
    ------
    ConfigError
        A path that is not a file, or a trace :func:`measured_and_modelled` refuses."""
    if not paths:
        return None
    for p in paths:
        if not Path(p).is_file():
            what = "a folder" if Path(p).is_dir() else "not a regular file" if Path(p).exists() else "no such file"
            raise ConfigError(f"--profile {p}: {what}; pass a PyTorch-profiler trace (.json or .json.gz) of this model")
    _check_one_precision(paths, config)
    parts = [measured_and_modelled(p, model_path, config, options, lenient=lenient, fallback_gpu=gpu) for p in paths]
    return profile_scale(parts, config.stack if fit_host else None, step_time_s if fit_host else None)
