"""Map a profiled training step onto the model: which operator and layer every GPU kernel belongs to.

The join, in four links (all read from one rank's Kineto trace, ``record_shapes=True``):

1. **kernel -> launch**: a GPU event's ``args.correlation`` equals the one of the CUDA runtime
   call that launched it.
2. **launch -> operator**: the runtime call lies inside a CPU operator on its thread; the
   outermost one (the *top-level* operator: ``aten::linear``, ``aten::layer_norm``, an
   ``autograd::engine::evaluate_function: XBackward0``, the ``Optimizer.step#...`` annotation) is
   the one the kernel is charged to.  Other annotations (a user's ``record_function`` around a
   pass) are looked through.
3. **operator -> phase**: ``Optimizer.*`` annotations are the optimizer; operators run by the
   autograd engine (``autograd::engine::evaluate_function: ...``) are the backward; the rest of
   the step is the forward, whose tail from the loss operator on (``cross_entropy``, ``nll_loss``...;
   with a model: everything after the head's last GEMM) is the loss.
4. **operator -> layer** (with a model, :func:`join_trace`'s ``layered``): the forward GEMMs
   (``aten::linear``/``addmm``/``mm``/``matmul`` with a 2-D weight, (M, N, K) from ``Input Dims``)
   are matched in order to the graph's weight MatMul/Gemm ops in topological order, which carry
   their layer (embedding, block i, head).  The operators between two matched GEMMs of one layer
   belong to it; in a gap between two layers the first normalisation (``*norm*``, or a decomposed
   RMSNorm's ``pow``/``rsqrt``, with the ``to`` cast just before it) starts the next layer where
   that layer opens with one in the graph (pre-norm), else the gap is the earlier layer's
   (post-norm: BERT, ResNet).  Convolutions are matched like GEMMs, by their input and weight
   shapes.  A
   backward operator's autograd ``Sequence number`` names the forward operator that created its
   node, hence its layer; one without a number (``AccumulateGrad``, which stores the gradient just
   produced) goes with the backward operator before it on its thread.

What the links cannot place is *unattributed* and reported as a number: kernels whose launch is
outside every operator, backward operators whose sequence number no forward operator carries,
and, without a model, every forward and backward operator's layer.

Module scopes (``with_modules``/``with_stack`` traces, ``nn.Module: ...`` Python events) are not
read: record_shapes alone gives none, and the GEMM match needs none.

References: PyTorch ``torch/csrc/autograd/function.h`` (sequence_nr and the profiler's
``Sequence number``/``Fwd thread id``); Kineto ``libkineto/src/output_json.cpp``
(``correlation``, ``External id``).
"""

from __future__ import annotations

import bisect
import math
import re
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from dml2comm.ir.gemms import conv_key, gemm_key, graph_weight_ops
from dml2comm.ir.layers import LayerKind
from dml2comm.traces.classify import launch_rows
from dml2comm.traces.load import Kind, RankTrace, step_names, step_windows
from dml2comm.traces.patterns import COMM_KERNEL

__all__ = ["Phase", "LayerTime", "OpTime", "TraceJoin", "join_trace", "step_shape", "token_shape", "block_times"]


class Phase:
    """Where in the step an operator ran (strings: they go to JSON as they are)."""

    FORWARD = "forward"
    BACKWARD = "backward"
    LOSS = "loss"
    OPTIMIZER = "optimizer"
    OTHER = "other"

    ALL = (FORWARD, LOSS, BACKWARD, OPTIMIZER, OTHER)


#: Top-level forward operators that are GEMMs with a weight (their (M, N, K) is matched to the graph).
GEMM_OPS = frozenset({"aten::linear", "aten::addmm", "aten::mm", "aten::matmul"})
#: Top-level forward convolutions, matched to the graph's weight ``Conv`` ops by their input and
#: weight shapes (:func:`dml2comm.ir.gemms.conv_key`).
CONV_OPS = frozenset({"aten::conv1d", "aten::conv2d", "aten::conv3d", "aten::convolution"})
#: Operators that compute a loss: the forward from the first of them on is the loss (no model).
LOSS_OPS = re.compile(r"^aten::(cross_entropy(_loss)?|nll_loss(_nd|2d)?(_forward)?|mse_loss|l1_loss|"
                      r"binary_cross_entropy(_with_logits)?|kl_div|smooth_l1_loss|huber_loss)$")
_NORM = re.compile(r"norm", re.IGNORECASE)
_RMS_PARTS = frozenset({"aten::pow", "aten::rsqrt"})
_BACKWARD_PREFIX = "autograd::engine::evaluate_function"
_OPTIMIZER_PREFIX = "Optimizer."
#: At most this many operators are listed (by GPU time) in the join's ``ops``.
TOP_OPS = 20
#: Layer names of the rows that are not layers of the graph.
LOSS, OPTIMIZER, UNATTRIBUTED = "loss", "optimizer", "unattributed"
#: The forward's host-to-device copies (the batch a data loader hands over), charged to no layer:
#: the cost model charges the input's read over PCIe to the stage (``--profile``'s ``input`` kind).
INPUT = "input"
#: The run's collectives (NCCL kernels: a data-parallel step's gradient all-reduce, launched from
#: autograd's hooks inside the backward), charged to no layer: the cost model prices communication.
COMMUNICATION = "communication"


@dataclass(frozen=True)
class LayerTime:
    """GPU time of one layer (or of the loss, the optimizer, the unattributed rest), seconds."""

    name: str
    kind: str  # embedding, block, head, other, loss, optimizer, unattributed, input, communication
    forward_s: float
    backward_s: float
    other_s: float  # optimizer, loss, or time of no phase
    kernels: int

    @property
    def total_s(self) -> float:
        return self.forward_s + self.backward_s + self.other_s


@dataclass(frozen=True)
class OpTime:
    """GPU time of one top-level operator name within one phase."""

    name: str
    phase: str
    calls: int
    gpu_s: float


@dataclass(frozen=True)
class TraceJoin:
    """The step's GPU time, attributed.

    ``gpu_s``: sum of the durations of the step's GPU events (kernels, copies, sets: busy time per
    event, so concurrent streams count twice); ``attributed_s``: the part charged to a layer, the
    loss or the optimizer; ``phases``: per phase; ``layers``: per layer in model order, then
    loss, optimizer, unattributed, and where the step had any, its input copies and its
    collectives (empty without a model); ``ops``: the largest operators;
    ``block_spread``: (max - min) / mean of the blocks' times (None with fewer than two)."""

    file: str
    rank: int
    gpu_s: float
    kernels: int
    attributed_s: float
    phases: dict[str, float]
    layers: tuple[LayerTime, ...]
    ops: tuple[OpTime, ...]
    block_spread: float | None
    method: str
    notes: tuple[str, ...] = field(default_factory=tuple)
    #: (graph op index, forward GPU seconds) of each weight GEMM matched to the graph (with a model)
    gemms: tuple[tuple[int, float], ...] = ()
    #: forward passes whose weight GEMMs all matched (gradient accumulation: several in one step;
    #: 1 without a model); the layers' times are the step's, summed over them
    passes: int = 1
    #: profiled steps (``ProfilerStep#N`` annotations) the times are the mean of (1: one step)
    steps: int = 1

    @property
    def unattributed_s(self) -> float:
        return self.gpu_s - self.attributed_s

    @property
    def attributed_share(self) -> float:
        return self.attributed_s / self.gpu_s if self.gpu_s > 0 else 0.0

    def blocks(self) -> list[LayerTime]:
        return [x for x in self.layers if x.kind == LayerKind.BLOCK]

    def to_dict(self) -> dict[str, Any]:
        return {
            "file": self.file, "rank": self.rank, "gpu_s": self.gpu_s, "kernels": self.kernels,
            "attributed_s": self.attributed_s, "unattributed_s": self.unattributed_s,
            "attributed_share": self.attributed_share, "phases_s": dict(self.phases),
            "layers": [{"name": x.name, "kind": x.kind, "forward_s": x.forward_s, "backward_s": x.backward_s,
                        "other_s": x.other_s, "total_s": x.total_s, "kernels": x.kernels,
                        "share": x.total_s / self.gpu_s if self.gpu_s > 0 else 0.0} for x in self.layers],
            "ops": [{"name": o.name, "phase": o.phase, "calls": o.calls, "gpu_s": o.gpu_s} for o in self.ops],
            "block_spread": self.block_spread, "method": self.method, "notes": list(self.notes), "passes": self.passes,
            "steps": self.steps,
        }


# ---------------------------------------------------------------------------------------------
# the trace's side
# ---------------------------------------------------------------------------------------------


def _trace_gemm_key(name: str, dims: Any) -> tuple[int, ...] | None:
    """(M, N, K) of a top-level GEMM operator from its ``Input Dims``, None when it has no 2-D weight."""
    if not isinstance(dims, list):
        return None
    shapes = [d for d in dims if isinstance(d, list) and d and all(isinstance(v, int) for v in d)]
    try:
        if name == "aten::linear" and len(shapes) >= 2 and len(shapes[1]) == 2:
            x, w = shapes[0], shapes[1]
            return gemm_key(math.prod(x[:-1]), w[0], x[-1])
        if name == "aten::addmm" and len(shapes) >= 3 and len(shapes[1]) == 2 and len(shapes[2]) == 2:
            return gemm_key(shapes[1][0], shapes[2][1], shapes[1][1])
        if name in ("aten::mm", "aten::matmul") and len(shapes) >= 2 and len(shapes[1]) == 2:
            x, w = shapes[0], shapes[1]
            return gemm_key(math.prod(x[:-1]), w[1], x[-1])
    except (TypeError, IndexError):
        return None
    return None


def _trace_conv_key(dims: Any) -> tuple[Any, ...] | None:
    """:func:`dml2comm.ir.gemms.conv_key` of a top-level convolution from its ``Input Dims``
    ([input, weight, ...]), None when they are not two shapes of one rank (3 to 5)."""
    if not isinstance(dims, list) or len(dims) < 2:
        return None
    x, w = dims[0], dims[1]
    if not (isinstance(x, list) and isinstance(w, list) and 3 <= len(x) <= 5 and len(w) == len(x)
            and all(isinstance(v, int) for v in x + w)):
        return None
    return conv_key(x, w)


@dataclass
class _Tops:
    """Top-level CPU events (operators and annotations) of the step, per thread and in time order."""

    rows: list[int]  # event row
    names: list[str]
    phase: list[str]
    by_thread: dict[int, tuple[list[float], list[float], list[int]]]  # thread -> (starts, ends, positions)


def _top_level(trace: RankTrace, window: tuple[float, float] | None) -> _Tops:
    """The top-level operators: outermost CPU operators and the optimizer's annotations.  Other
    annotations (a user's ``record_function("forward")`` around a whole pass) are transparent:
    taken as top level they would hide every operator of the pass (no GEMM to match)."""
    step_mask = step_names(trace)
    names = trace.names
    optimizer = np.array([n.startswith(_OPTIMIZER_PREFIX) for n in names], dtype=bool)
    marks = (trace.kind == Kind.ANNOTATION) & optimizer[trace.name] if len(names) else np.zeros(trace.kind.shape, bool)
    cpu = np.flatnonzero(((trace.kind == Kind.CPU_OP) | marks) & ~step_mask)
    if window is not None:
        cpu = cpu[(trace.ts[cpu] >= window[0]) & (trace.ts[cpu] < window[1])]
    order = cpu[np.lexsort((-trace.dur[cpu], trace.ts[cpu], trace.thread[cpu]))]
    rows: list[int] = []
    end_of: dict[int, float] = {}
    for i in order.tolist():
        t = int(trace.thread[i])
        if trace.ts[i] < end_of.get(t, -math.inf):
            continue  # inside a top-level event of its thread
        end_of[t] = float(trace.ts[i] + trace.dur[i])
        rows.append(i)
    rows.sort(key=lambda i: (float(trace.ts[i]), int(trace.thread[i])))
    names = [trace.names[int(trace.name[i])] for i in rows]
    by_thread: dict[int, tuple[list[float], list[float], list[int]]] = {}
    for pos, i in enumerate(rows):
        s, e, p = by_thread.setdefault(int(trace.thread[i]), ([], [], []))
        s.append(float(trace.ts[i]))
        e.append(float(trace.ts[i] + trace.dur[i]))
        p.append(pos)
    phase = []
    for nm in names:
        if nm.startswith(_OPTIMIZER_PREFIX):
            phase.append(Phase.OPTIMIZER)
        elif nm.startswith(_BACKWARD_PREFIX):
            phase.append(Phase.BACKWARD)
        else:
            phase.append(Phase.FORWARD)
    # each forward pass's tail from its first loss operator on is the loss
    for fwd in _passes(phase):
        first_loss = next((k for k, p in enumerate(fwd) if LOSS_OPS.match(names[p])), None)
        if first_loss is not None:
            for p in fwd[first_loss:]:
                phase[p] = Phase.LOSS
    return _Tops(rows, names, phase, by_thread)


def _passes(phase: list[str]) -> list[list[int]]:
    """The forward (and loss) positions, split where a backward operator comes between two: one
    list per forward pass (gradient accumulation runs several per step)."""
    out: list[list[int]] = [[]]
    for p, ph in enumerate(phase):
        if ph == Phase.BACKWARD and out[-1]:
            out.append([])
        elif ph in (Phase.FORWARD, Phase.LOSS):
            out[-1].append(p)
    return [x for x in out if x]


def _enclosing(tops: _Tops, thread: int, ts: float) -> int | None:
    """Position of the top-level event of ``thread`` that contains time ``ts``."""
    entry = tops.by_thread.get(thread)
    if entry is None:
        return None
    starts, ends, pos = entry
    k = bisect.bisect_right(starts, ts) - 1
    if k >= 0 and ts <= ends[k]:
        return pos[k]
    return None


def _op_of_gpu_events(trace: RankTrace, tops: _Tops, window: tuple[float, float] | None) -> tuple[np.ndarray, np.ndarray]:
    """The step's GPU event rows and, for each, the position of its top-level operator (-1: none)."""
    gpu = np.flatnonzero(np.isin(trace.kind, Kind.GPU))
    ops = np.full(gpu.size, -1, dtype=np.int64)
    for k, i in enumerate(launch_rows(trace, gpu).tolist()):
        pos = _enclosing(tops, int(trace.thread[i]), float(trace.ts[i])) if i >= 0 else None
        if pos is not None:
            ops[k] = pos
    if window is not None:  # a kernel belongs to the step when its operator does (GPU time lags CPU time)
        keep = ops >= 0
        gpu, ops = gpu[keep], ops[keep]
    return gpu, ops


# ---------------------------------------------------------------------------------------------
# layers
# ---------------------------------------------------------------------------------------------


def _starts_norm(names: list[str], positions: list[int]) -> int | None:
    """Index (into ``positions``) where a normalisation starts, None when the gap has none."""
    for k, p in enumerate(positions):
        nm = names[p]
        if _NORM.search(nm):
            return k
        if nm in _RMS_PARTS:
            return k - 1 if k > 0 and names[positions[k - 1]] == "aten::to" else k
    return None


#: Graph ops that normalise (a decomposed RMSNorm by its ``Pow``/``ReduceMean``).
_GRAPH_NORMS = frozenset({"LayerNormalization", "SimplifiedLayerNormalization", "SkipLayerNormalization", "RMSNormalization",
                          "BatchNormalization", "InstanceNormalization", "GroupNormalization", "Pow", "ReduceMean"})


def _opens_with_norm(layered: Any, weights: set[int]) -> list[bool]:
    """Per layer: a normalisation comes before its first weight GEMM or convolution (a pre-norm
    transformer block).  Where one does, the gap between two layers' matched operators is cut at
    its first normalisation; where none does (a post-norm block: BERT's, a ResNet's, which end
    with their normalisation), the whole gap is the earlier layer's."""
    g = layered.graph
    out = []
    for layer in layered.layers:
        opens = False
        for i in sorted(layer.op_indices):
            if i in weights:
                break
            if g.ops[i].op_type in _GRAPH_NORMS:
                opens = True
                break
        out.append(opens)
    return out


def _forward_layers(trace: RankTrace, tops: _Tops, layered: Any, notes: list[str],
                    gemm_ops: dict[int, int] | None = None) -> tuple[dict[int, int], int]:
    """Top-level forward operator position -> layer index (see the module docstring, link 4), and
    the forward passes whose weight GEMMs all matched (gradient accumulation: several per step,
    each followed by its backward; a stretch of the forward with no GEMM is the pass before it's,
    or after the last backward, the optimizer's: gradient clipping, AMP's unscaling, whose work
    grows with the parameters, as the optimizer step's).  Positions after a pass's head's
    last matched GEMM become the loss (their phase is changed).  ``gemm_ops`` receives each
    matched GEMM's position -> the graph op index it matched."""
    wanted = graph_weight_ops(layered)
    keys: dict[int, Any] = {}
    for p, ph in enumerate(tops.phase):
        nm = tops.names[p]
        if ph in (Phase.FORWARD, Phase.LOSS) and (nm in GEMM_OPS or nm in CONV_OPS):
            dims = trace.inputs.get(tops.rows[p], (None, None))[0]
            key = _trace_gemm_key(nm, dims) if nm in GEMM_OPS else _trace_conv_key(dims)
            if key is not None:
                keys[p] = key
    stretches = _passes(tops.phase)
    last = max((i for i, fwd in enumerate(stretches) if any(p in keys for p in fwd)), default=len(stretches) - 1)
    for fwd in stretches[last + 1:]:  # after the last backward: gradient clipping, AMP's unscaling
        for p in fwd:
            tops.phase[p] = Phase.OPTIMIZER
    passes: list[list[int]] = []
    pending: list[int] = []  # a stretch before the first GEMM goes with the pass after it
    for fwd in stretches[:last + 1]:
        if not any(p in keys for p in fwd):
            if passes:
                passes[-1] += fwd
            else:
                pending += fwd
        else:
            passes.append(pending + fwd)
            pending = []
    if pending:
        passes.append(pending)
    layer_of: dict[int, int] = {}
    complete, short = 0, []
    opens = _opens_with_norm(layered, {i for _, _, i in wanted})
    for fwd in passes:
        matched = _pass_layers(tops, layered, wanted, opens, fwd, keys, layer_of, gemm_ops)
        complete += matched == len(wanted)
        short += [matched] if matched < len(wanted) else []
    if short:
        notes.append(f"{short[0]} of the graph's {len(wanted)} weight GEMMs matched a forward GEMM of the trace "
                     f"(by (M, N, K), in order; convolutions by their input and weight shapes): the layers after the last "
                     f"match are not placed")
    if complete > 1:
        notes.append(f"{complete} forward and backward passes in the step (gradient accumulation): the layers' times are "
                     f"the step's, over its {complete} micro-batches")
    return layer_of, complete


def _pass_layers(tops: _Tops, layered: Any, wanted: list, opens: list[bool], fwd: list[int], keys: dict[int, Any],
                 layer_of: dict[int, int], gemm_ops: dict[int, int] | None) -> int:
    """One forward pass's positions ``fwd`` -> layer into ``layer_of`` (the module docstring,
    link 4; ``opens``: :func:`_opens_with_norm`); returns how many of the ``wanted`` weight GEMMs
    matched."""
    matched: list[tuple[int, int]] = []  # (index into fwd, layer)
    j = 0
    for k, p in enumerate(fwd):
        if p in keys and j < len(wanted) and keys[p] == wanted[j][0]:
            matched.append((k, wanted[j][1]))
            if gemm_ops is not None:
                gemm_ops[p] = wanted[j][2]
            j += 1
    if not matched:
        return 0
    layers = layered.layers
    first_k, first_layer = matched[0]
    lead = list(range(0, first_k))
    emb = next((x.index for x in layers if x.kind is LayerKind.EMBEDDING), None)
    cut = _starts_norm(tops.names, [fwd[k] for k in lead]) if emb is not None else 0
    for idx, k in enumerate(lead):
        layer_of[fwd[k]] = emb if (emb is not None and (cut is None or idx < cut)) else first_layer
    for (ka, la), (kb, lb) in zip(matched, matched[1:]):
        gap = list(range(ka, kb))
        if la == lb:
            for k in gap:
                layer_of[fwd[k]] = la
            continue
        c = _starts_norm(tops.names, [fwd[k] for k in gap[1:]]) if opens[lb] else None
        c = len(gap) if c is None else c + 1
        for idx, k in enumerate(gap):
            layer_of[fwd[k]] = la if idx < c else lb
    last_k, last_layer = matched[-1]
    layer_of[fwd[last_k]] = last_layer
    tail = fwd[last_k + 1:]
    if layers[last_layer].kind is LayerKind.HEAD and j == len(wanted):
        for p in tail:  # the head's output is the logits: what follows computes the loss
            tops.phase[p] = Phase.LOSS
    else:
        for p in tail:
            if tops.phase[p] == Phase.FORWARD:
                layer_of[p] = last_layer
    return j


def _backward_layers(trace: RankTrace, tops: _Tops, fwd_layer: dict[int, Any]) -> tuple[dict[int, Any], int]:
    """Backward top-level position -> what its forward operator is charged to (layer index or a
    phase name), through the autograd sequence number; and the count of backward operators left
    unplaced (a number no forward operator carries)."""
    seq = trace.sequence
    assert seq is not None
    by_seq: dict[int, Any] = {}
    fwd_rows = np.flatnonzero((seq >= 0) & (trace.kind == Kind.CPU_OP))
    for i in fwd_rows.tolist():
        pos = _enclosing(tops, int(trace.thread[i]), float(trace.ts[i]))
        if pos is None or tops.phase[pos] not in (Phase.FORWARD, Phase.LOSS):
            continue
        by_seq.setdefault(int(seq[i]), fwd_layer.get(pos, LOSS if tops.phase[pos] == Phase.LOSS else None))
    out: dict[int, Any] = {}
    lost = 0
    prev: dict[int, Any] = {}
    for pos, ph in enumerate(tops.phase):
        if ph != Phase.BACKWARD:
            continue
        row = tops.rows[pos]
        t = int(trace.thread[row])
        s = int(seq[row])
        if s >= 0:
            target = by_seq.get(s)
            if target is None:
                lost += 1
        else:
            target = prev.get(t)  # AccumulateGrad: the gradient the operator before it produced
        prev[t] = target
        if target is not None:
            out[pos] = target
    return out, lost


# ---------------------------------------------------------------------------------------------
# the join
# ---------------------------------------------------------------------------------------------


def join_trace(trace: RankTrace, layered: Any = None) -> TraceJoin:
    """Attribute every GPU event of the trace's step to its operator, phase and, with ``layered``
    (a :class:`dml2comm.ir.layers.LayeredGraph` of the model the run trained), layer.  A trace of
    several profiled steps (``schedule(active=N)``: one ``ProfilerStep#N`` annotation each) is
    joined step by step, and the join is their mean step (:func:`_mean_step`).

    Parameters
    ----------
    trace : loaded with ``load_trace(path, shapes=True)`` (shapes and sequence numbers).
    layered : the model's layers, or None (phases and operators only).

    Raises
    ------
    ValueError
        the trace was loaded without ``shapes=True``."""
    if trace.sequence is None:
        raise ValueError("join_trace needs load_trace(path, shapes=True): the sequence numbers and shapes")
    joins = [_join_step(trace, layered, w) for w in step_windows(trace) or [None]]
    joins = [j for j in joins if j.kernels] or joins[:1]  # a ProfilerStep that ran no GPU work is no step
    return joins[0] if len(joins) == 1 else _mean_step(joins)


def _join_step(trace: RankTrace, layered: Any, window: tuple[float, float] | None) -> TraceJoin:
    """:func:`join_trace` of the step whose CPU span is ``window`` (None: the whole trace)."""
    tops = _top_level(trace, window)
    gpu, ops = _op_of_gpu_events(trace, tops, window)
    notes: list[str] = []
    fwd_layer: dict[int, Any] = {}
    bwd_layer: dict[int, Any] = {}
    passes = 1
    gemm_ops: dict[int, int] = {}
    if layered is not None:
        fwd_layer, passes = _forward_layers(trace, tops, layered, notes, gemm_ops)
        bwd_layer, lost = _backward_layers(trace, tops, fwd_layer)
        if lost:
            notes.append(f"{lost} backward operators carry a sequence number no forward operator of the step has")
    else:
        notes.append("no model: the kernels are attributed to operators and phases, not to layers (pass --model)")
    dur_s = trace.dur[gpu] * 1e-6
    total = float(math.fsum(dur_s.tolist()))
    phases = {p: 0.0 for p in Phase.ALL}
    by_op: dict[tuple[str, str], list[float]] = {}
    n_layers = len(layered.layers) if layered is not None else 0
    lay_f = [0.0] * n_layers
    lay_b = [0.0] * n_layers
    lay_n = [0] * n_layers
    extra = {name: [0.0, 0.0, 0.0, 0] for name in (LOSS, OPTIMIZER, UNATTRIBUTED, INPUT, COMMUNICATION)}
    gemm_s = dict.fromkeys(gemm_ops, 0.0)
    names = [trace.names[int(trace.name[i])] for i in gpu.tolist()]
    host_copy = [trace.kind[i] == Kind.MEMCPY and n.startswith("Memcpy HtoD") for i, n in zip(gpu.tolist(), names)]
    collective = [bool(COMM_KERNEL.match(n)) for n in names]
    for d, pos, to_device, comm in zip(dur_s.tolist(), ops.tolist(), host_copy, collective):
        if pos in gemm_s:
            gemm_s[pos] += d
        if pos < 0:
            phases[Phase.OTHER] += d
            _add(extra[COMMUNICATION if comm and layered is not None else UNATTRIBUTED], 2, d)
            continue
        ph = tops.phase[pos]
        phases[ph] += d
        acc = by_op.setdefault((_op_label(tops.names[pos]), ph), [0.0, 0])
        acc[0] += d
        if layered is None:
            continue
        if ph == Phase.OPTIMIZER:
            _add(extra[OPTIMIZER], 2, d)
            continue
        target = fwd_layer.get(pos) if ph == Phase.FORWARD else bwd_layer.get(pos) if ph == Phase.BACKWARD else LOSS
        target = INPUT if to_device and ph == Phase.FORWARD else COMMUNICATION if comm else target
        col = 1 if ph == Phase.BACKWARD else 0
        if target is None:
            _add(extra[UNATTRIBUTED], col, d)
        elif target in (LOSS, INPUT, COMMUNICATION):
            _add(extra[target], col, d)
        else:
            (lay_b if col else lay_f)[target] += d
            lay_n[target] += 1
    if extra[COMMUNICATION][3]:
        comm_s = sum(extra[COMMUNICATION][:3])
        notes.append(f"{extra[COMMUNICATION][3]} collective kernels ({comm_s * 1e3:.2f} ms) are the run's communication, no "
                     f"layer's: a profile's ratios leave them out, the cost model prices a plan's")
    op_rows = _op_rows(tops, ops, by_op)
    layers, attributed, method = _layer_rows(layered, lay_f, lay_b, lay_n, extra, total, phases)
    blocks = [x.total_s for x in layers if x.kind == LayerKind.BLOCK]
    spread = (max(blocks) - min(blocks)) / (sum(blocks) / len(blocks)) if len(blocks) > 1 and sum(blocks) > 0 else None
    return TraceJoin(trace.path, trace.rank, total, int(gpu.size), attributed, phases, tuple(layers), op_rows,
                     spread, method, tuple(notes), tuple((gemm_ops[p], gemm_s[p]) for p in sorted(gemm_ops)), max(passes, 1))


def _mean_step(joins: list[TraceJoin]) -> TraceJoin:
    """The mean of the joins of several profiled steps of one trace: each time (layers, phases,
    operators, matched GEMMs) averaged over the steps, the blocks' spread that of the mean blocks.
    Steps with another number of forward passes than most (a gradient-accumulation cycle cut by
    the profiler's schedule) are left out, with a note."""
    counts = [j.passes for j in joins]
    passes = max(set(counts), key=lambda k: (counts.count(k), -counts.index(k)))
    kept = [j for j in joins if j.passes == passes]
    n = len(kept)
    notes = [f"{len(joins)} profiled steps: the times are the mean step's"]
    if n < len(joins):
        notes.append(f"{len(joins) - n} of them left out: {', '.join(str(k) for k in counts if k != passes)} forward passes "
                     f"against {passes} in the others")
    for j in kept:
        notes.extend(x for x in j.notes if x not in notes)
    rows: dict[str, list[Any]] = {}
    for j in kept:
        for x in j.layers:
            acc = rows.setdefault(x.name, [x.kind, 0.0, 0.0, 0.0, 0])
            acc[1:] = [acc[1] + x.forward_s / n, acc[2] + x.backward_s / n, acc[3] + x.other_s / n, acc[4] + x.kernels]
    layers = tuple(LayerTime(name, kind, f, b, o, round(k / n)) for name, (kind, f, b, o, k) in rows.items())
    ops: dict[tuple[str, str], list[float]] = {}
    for j in kept:
        for o in j.ops:
            acc = ops.setdefault((o.name, o.phase), [0, 0.0])
            acc[0] += o.calls
            acc[1] += o.gpu_s / n
    gemms: dict[int, float] = {}
    for j in kept:
        for i, t in j.gemms:
            gemms[i] = gemms.get(i, 0.0) + t / n
    blocks = [x.total_s for x in layers if x.kind == LayerKind.BLOCK]
    spread = (max(blocks) - min(blocks)) / (sum(blocks) / len(blocks)) if len(blocks) > 1 and sum(blocks) > 0 else None
    first = kept[0]
    return TraceJoin(first.file, first.rank, sum(j.gpu_s for j in kept) / n, round(sum(j.kernels for j in kept) / n),
                     sum(j.attributed_s for j in kept) / n, {p: sum(j.phases[p] for j in kept) / n for p in Phase.ALL},
                     layers, tuple(sorted((OpTime(nm, ph, round(c / n), t) for (nm, ph), (c, t) in ops.items()),
                                          key=lambda o: (-o.gpu_s, o.name, o.phase))[:TOP_OPS]),
                     spread, first.method, tuple(notes), tuple(sorted(gemms.items())), passes, n)


def _op_rows(tops: _Tops, ops: np.ndarray, by_op: dict[tuple[str, str], list[float]]) -> tuple[OpTime, ...]:
    """The :data:`TOP_OPS` operators (by label and phase) with the most GPU time, each with its
    number of calls in the step."""
    calls: dict[tuple[str, str], set[int]] = {}
    for pos in set(ops.tolist()) - {-1}:
        calls.setdefault((_op_label(tops.names[pos]), tops.phase[pos]), set()).add(pos)
    return tuple(sorted((OpTime(nm, ph, len(calls.get((nm, ph), ())), v[0]) for (nm, ph), v in by_op.items()),
                        key=lambda o: (-o.gpu_s, o.name, o.phase))[:TOP_OPS])


def _layer_rows(layered: Any, lay_f: list[float], lay_b: list[float], lay_n: list[int], extra: dict[str, list[Any]],
                total: float, phases: dict[str, float]) -> tuple[list[LayerTime], float, str]:
    """(one row per layer, then the loss, the optimizer and what was left unattributed; the GPU
    seconds attributed; how the join was made); without a model, no rows."""
    if layered is None:
        return [], total - phases[Phase.OTHER], "kernel -> launch -> operator only (no model)"
    layers = [LayerTime(x.name, x.kind, lay_f[x.index], lay_b[x.index], 0.0, lay_n[x.index]) for x in layered.layers]
    for name in (LOSS, OPTIMIZER, UNATTRIBUTED, INPUT, COMMUNICATION):
        f, b, o, n = extra[name]
        if name not in (INPUT, COMMUNICATION) or n:  # the input's copies and collectives where the step made any
            layers.append(LayerTime(name, name, f, b, o, int(n)))
    attributed = total - extra[UNATTRIBUTED][0] - extra[UNATTRIBUTED][1] - extra[UNATTRIBUTED][2]
    method = (f"forward GEMMs matched to the graph's {len(graph_weight_ops(layered))} weight GEMMs by (M, N, K) "
              f"(convolutions by their input and weight shapes); "
              f"backward through autograd sequence numbers; layers from {layered.source}")
    return layers, attributed, method


def _add(acc: list[Any], col: int, d: float) -> None:
    acc[col] += d
    acc[3] += 1


def _op_label(name: str) -> str:
    """``autograd::engine::evaluate_function: AddmmBackward0`` -> ``AddmmBackward0``."""
    return name.split(": ", 1)[1] if name.startswith(_BACKWARD_PREFIX) and ": " in name else name


def block_times(join: TraceJoin) -> Sequence[float]:
    return [x.total_s for x in join.blocks()]


def token_shape(trace: RankTrace) -> tuple[int, int] | None:
    """(batch, sequence) of the step's token ids: the index input of the first ``aten::embedding``
    whose indices are 2-D (``Input Dims`` [[vocab, hidden], [batch, seq], ...]); None when the
    trace has none.  Binds a model's symbolic input dims to the run's."""
    rows = sorted(trace.inputs, key=lambda i: float(trace.ts[i]))
    for i in rows:
        if trace.names[int(trace.name[i])] != "aten::embedding":
            continue
        dims = trace.inputs[i][0]
        if isinstance(dims, list) and len(dims) >= 2 and isinstance(dims[1], list) and len(dims[1]) == 2:
            b, s = dims[1]
            if isinstance(b, int) and isinstance(s, int) and b > 0 and s > 0:
                return b, s
    return None


#: The convolutions whose first input is the step's images (``aten::conv2d`` and the ops it
#: dispatches to, whichever the trace recorded first).
_CONVOLUTIONS = frozenset({"aten::conv1d", "aten::conv2d", "aten::conv3d", "aten::convolution", "aten::_convolution",
                           "aten::cudnn_convolution"})


def step_shape(trace: RankTrace) -> tuple[int, int | None] | None:
    """(micro-batch, sequence) of a profiled step: the token ids' (:func:`token_shape`), else the
    batch of the first convolution's input (``Input Dims`` [[N, C, H, W], weight, ...]; 3-D to
    5-D inputs) with no sequence: an image model, whose spatial size the model fixes.  None when
    the trace records neither."""
    shape = token_shape(trace)
    if shape is not None:
        return shape
    for i in sorted(trace.inputs, key=lambda i: float(trace.ts[i])):
        if trace.names[int(trace.name[i])] not in _CONVOLUTIONS:
            continue
        dims = trace.inputs[i][0]
        if isinstance(dims, list) and dims and isinstance(dims[0], list) and 3 <= len(dims[0]) <= 5:
            b = dims[0][0]
            if isinstance(b, int) and b > 0:
                return b, None
    return None
