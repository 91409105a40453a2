"""Measured samples of one Kineto trace: GEMMs with their shapes, memory-bound kernels with their
bytes, NCCL collectives with their sizes and groups.

A GPU kernel is joined to the CPU operator that launched it in one of two ways:

- **External id** (PyTorch >= 2.0 writes it on kernels): the kernel's ``External id`` is the
  ``External id`` of the innermost recorded operator around the launch.  Used when the trace's
  kernels carry ids that differ from their correlation ids.
- **Enclosure** (older traces write the correlation id there): the ``cuda_runtime`` launch with the
  kernel's ``correlation`` runs on a CPU thread at a time; the innermost operator of interest that
  spans that time on that thread launched it.

A sample's time is the sum of the durations of the kernels its operator launched (a split-K GEMM
runs a GEMM and a reduction kernel).  Shapes come from ``Input Dims``/``Input type``, which the
profiler records only with ``record_shapes=True``.

Collectives: recent PyTorch writes ``Collective name``, ``In msg nelems``, ``Out msg nelems``,
``Group size``, ``dtype`` and the process group's ranks on the NCCL kernel itself; older traces
only on the enclosing ``record_param_comms`` operator (joined by enclosure as above).  The
message size S follows nccl-tests (:mod:`dml2comm.network.collectives`): the all-reduce buffer,
the all-gather *output*, the reduce-scatter *input*, the all-to-all total a rank sends.

Map and reduce (issue 21): :func:`file_samples` is the map step, one task per trace file on an
executor (:mod:`dml2comm.executors`: this process, a process pool or Dask workers): it reads the
file's provenance (sha256, versions, ``deviceProperties``) and its samples, and only that travels
back (shapes, dtypes and times; a collective keeps its process group's ranks as
:class:`RawCollective`).  What needs every file (the node size, hence each collective's link
level, :func:`classify_collectives`; the GPU identity check) runs on the client afterwards.

References: Kineto ``libkineto/src/output_json.cpp``; PyTorch ``torch/csrc/profiler/util.cpp``
(``saveNcclMeta``: the collective arguments) and ``torch/csrc/autograd/profiler_kineto.cpp``
(``Input Dims``, ``Input type``); c10 ``ScalarType`` names for element sizes.
"""

from __future__ import annotations

import hashlib
import mmap
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Sequence

import msgspec
import numpy as np

from dml2comm.cost.gemm import training_gemms
from dml2comm.errors import ModelError
from dml2comm.traces.load import CommRecord, Kind, RankTrace, TraceError, load_trace, read_trace_bytes

__all__ = ["GemmSample", "MemorySample", "NormSample", "LAYER_NORM_OPS", "norm_sample", "CollectiveSample", "RawCollective", "TraceSamples", "TraceFile", "trace_samples",
           "file_samples", "classify_collectives", "collective_kind", "GEMM_KERNEL", "GEMM_OPS", "MEMORY_OPS", "ELEMENT_BYTES",
           "COMM_DTYPE_BYTES"]

#: Bytes per element of PyTorch's ``Input type`` strings (``scalarTypeToTypeMeta().name()``).
ELEMENT_BYTES: dict[str, int] = {
    "float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "long int": 8, "int": 4, "short int": 2, "bool": 1,
    "unsigned char": 1, "signed char": 1, "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1,
}
#: Bytes per element of the collectives' ``dtype`` argument (c10 ``ScalarType`` names).
COMM_DTYPE_BYTES: dict[str, int] = {
    "Float": 4, "Double": 8, "Half": 2, "BFloat16": 2, "Long": 8, "Int": 4, "Short": 2, "Char": 1, "Byte": 1, "Bool": 1,
    "Float8_e4m3fn": 1, "Float8_e5m2": 1,
}
#: ``Input type`` -> GEMM data-type key of the GPU presets (float -> fp32 or tf32 by the kernel).
_GEMM_DTYPES = {"float": "fp32", "c10::Half": "fp16", "c10::BFloat16": "bf16"}
#: GEMM operators (innermost first when nested: matmul/linear call mm/addmm/bmm).
GEMM_OPS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear"})
#: Kernels a GEMM operator runs (cuBLAS, cuBLASLt, CUTLASS; split-K reductions).
GEMM_KERNEL = re.compile(r"gemm|cutlass|xmma|cublas|nvjet|splitKreduce|ampere_|volta_|turing_|hopper_|sm\d\d_", re.I)
#: TF32 tensor-core kernels of float GEMMs (CUTLASS ``tensorop_s1688``/``s16816``, ``tf32`` in cuBLAS names).
_TF32_KERNEL = re.compile(r"tf32|tensorop_s\d|s1688|s16816", re.I)
#: Memory-bound operators whose bytes follow from their inputs: ``unary`` read one tensor and
#: write one like it; ``binary`` read every tensor input and write their broadcast shape;
#: ``write`` only write their first input.  LayerNorm and RMSNorm are not among them: their
#: kernels have their own law (:data:`LAYER_NORM_OPS`).
MEMORY_OPS: dict[str, str] = {
    **{f"aten::{n}": "unary" for n in ("relu", "relu_", "gelu", "sigmoid", "tanh", "exp", "exp_", "neg", "log", "log2", "sqrt",
                                        "rsqrt", "silu", "abs", "clamp_min_", "nan_to_num", "_softmax", "softmax",
                                        "dropout")},
    **{f"aten::{n}": "binary" for n in ("add", "add_", "mul", "mul_", "sub", "sub_", "div", "div_", "rsub",
                                         "threshold_backward", "gelu_backward", "sigmoid_backward", "copy_")},
    **{f"aten::{n}": "write" for n in ("fill_", "zero_")},
    **{f"aten::{n}": "reduce" for n in ("mean", "sum", "amax", "logsumexp", "norm")},
    # backward kernels reading the output gradient and one saved tensor of the same shape
    **{f"aten::{n}": "binary" for n in ("_softmax_backward_data",)},
    # the loss's log-softmax, forward and backward: four passes over the logits each, as
    # dml2comm.cost.loss counts them (cunn_SoftMaxForward: max, sum of exp and output passes;
    # cunn_SoftMaxBackward: the gradient read for its sum, then gradient and output read, input
    # gradient written); the loss term is timed at the element-wise efficiency, so they are
    # ``pointwise`` samples
    **{f"aten::{n}": "softmax4" for n in ("_log_softmax", "_log_softmax_backward_data")},
}
#: Memory-bound operators of the ``norm`` class (dml2comm.cost.calibrated): normalisations,
#: softmaxes and reductions, block-reduction kernels; every other one of MEMORY_OPS is ``pointwise``.
NORM_ATEN_OPS = frozenset({"aten::_softmax", "aten::softmax", "aten::_softmax_backward_data", "aten::mean", "aten::sum", "aten::amax",
                           "aten::logsumexp", "aten::norm"})
#: Eager LayerNorm/RMSNorm operators, the kernels of ``layer_norm_kernel.cu`` whose time law is
#: :mod:`dml2comm.cost.norm` (the ``layer_norm`` class): op -> (pass, RMSNorm?).  The forward
#: operator owns ``vectorized_layer_norm_kernel``; the backward one owns
#: ``layer_norm_grad_input_kernel*`` and ``GammaBetaBackward*`` (the bundled GPT-2 trace, joined
#: by External id), so a backward sample's time is both kernels'.  ``aten::layer_norm`` is the
#: composite around ``native_layer_norm`` (it owns kernels only when the inner one is not recorded).
LAYER_NORM_OPS: dict[str, tuple[str, bool]] = {
    "aten::layer_norm": ("fwd", False), "aten::native_layer_norm": ("fwd", False),
    "aten::native_layer_norm_backward": ("bwd", False),
    "aten::_fused_rms_norm": ("fwd", True), "aten::_fused_rms_norm_backward": ("bwd", True),
}
#: The fused scaled-dot-product attention operators that launch the flash kernels (cuDNN's and
#: FlashAttention-2's, PyTorch 2.x ``F.scaled_dot_product_attention``), forward and backward; the
#: innermost operator around the launch owns the kernels.
ATTENTION_OPS: dict[str, str] = {
    **{f"aten::{n}": "fwd" for n in ("_cudnn_attention_forward", "_flash_attention_forward",
                                      "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention")},
    **{f"aten::{n}": "bwd" for n in ("_cudnn_attention_backward", "_flash_attention_backward",
                                      "_scaled_dot_product_cudnn_attention_backward",
                                      "_scaled_dot_product_flash_attention_backward")},
}
#: Fused optimizer steps (``torch.optim.AdamW(fused=True)``: ``aten::_fused_adamw_``); their
#: tensor lists carry no shapes, so the parameter count is the autograd ``AccumulateGrad`` inputs'.
OPTIMIZER_OPS = frozenset({"aten::_fused_adamw_", "aten::_fused_adam_"})
_ACCUMULATE = "torch::autograd::AccumulateGrad"
#: Convolutions (cuDNN's implicit GEMMs), forward only.
CONV_OPS = frozenset({"aten::cudnn_convolution", "aten::convolution", "aten::_convolution"})
_COLLECTIVES = (
    (re.compile(r"coalesced"), None),
    (re.compile(r"^all_?reduce"), "ALL_REDUCE"),
    (re.compile(r"^(all_?gather|allgather_into_tensor|all_gather_into_tensor)"), "ALL_GATHER"),
    (re.compile(r"^reduce_?scatter"), "REDUCE_SCATTER"),
    (re.compile(r"^all_?to_?all"), "ALL_TO_ALL"),
    (re.compile(r"^broadcast"), "BROADCAST"),
    (re.compile(r"^reduce$"), "REDUCE"),
    (re.compile(r"^(send|recv|sendrecv)"), "SEND_RECV"),
)


class GemmSample(NamedTuple):
    b: int
    m: int
    n: int
    k: int
    dtype: str  # fp32, tf32, bf16, fp16
    time_s: float
    op: str


class MemorySample(NamedTuple):
    bytes: float
    time_s: float
    op: str
    shape: tuple[int, ...]
    cls: str = "pointwise"  # or "norm" (NORM_ATEN_OPS)


class NormSample(NamedTuple):
    """One eager LayerNorm/RMSNorm pass (:data:`LAYER_NORM_OPS`): its kernels' time over ``rows``
    rows of ``width`` normalised elements of ``itemsize`` bytes."""

    pass_: str  # fwd or bwd
    rows: int
    width: int
    itemsize: int
    rms: bool
    time_s: float
    op: str


class AttentionSample(NamedTuple):
    """One flash kernel (forward: its kernel; backward: the three of its pass) with its problem:
    ``bh`` = batch x query heads, lengths, head dims (``Input Dims`` of Q, K, V)."""

    pass_: str  # fwd or bwd
    bh: int
    s_q: int
    s_k: int
    d: int
    d_v: int
    time_s: float
    op: str


class OptimizerSample(NamedTuple):
    """One fused optimizer step: the parameters it updated (the step's ``AccumulateGrad``
    inputs) and their element size."""

    params: int
    element_bytes: int
    time_s: float
    op: str


class CollectiveSample(NamedTuple):
    """A collective sample with its link level: what the collective fits group by."""

    kind: str  # CollectiveKind value
    group_size: int
    level: str  # intra_node / inter_node
    size_bytes: float
    time_s: float


class RawCollective(NamedTuple):
    """A collective sample as one trace gives it: its level is not known until the node size is
    (from every file's ``deviceProperties``, or the base cluster), :func:`classify_collectives`."""

    kind: str  # CollectiveKind value
    group_size: int
    ranks: tuple[int, ...]  # the process group's global ranks; () when the trace does not record them
    size_bytes: float
    time_s: float


@dataclass
class TraceSamples:
    gemms: list[GemmSample] = field(default_factory=list)
    memory: list[MemorySample] = field(default_factory=list)
    collectives: list[RawCollective] = field(default_factory=list)
    attention: list[AttentionSample] = field(default_factory=list)
    optimizer: list[OptimizerSample] = field(default_factory=list)
    convs: list[GemmSample] = field(default_factory=list)
    layer_norm: list[NormSample] = field(default_factory=list)
    shaped_ops: int = 0  # CPU operators with recorded shapes
    nccl_kernels: int = 0
    link: str = ""  # "External id" or "enclosure"
    notes: list[str] = field(default_factory=list)


@dataclass
class TraceFile:
    """What the map step (:func:`file_samples`) returns for one trace file: its provenance and
    its samples, about 33 bytes each pickled (123 kB for HTA's 25.8 MB ``negative_queue_length``
    trace and its 3,675 samples): what travels from a worker, never the trace."""

    file: str  # the file's name
    sha256: str  # of the file as stored
    rank: int
    world_size: int | None
    devices: list[dict[str, Any]]  # deviceProperties entries
    versions: dict[str, str]  # PyTorch/CUDA/NCCL/Kineto versions the trace records
    samples: TraceSamples
    #: events the loader left out for durations that cannot be (:data:`dml2comm.traces.load.MAX_EVENT_US`)
    bad_events: int = 0


def collective_kind(name: str) -> str | None:
    """The CollectiveKind value of a trace's collective name (``allreduce``, ``_allgather_base``,
    ``nccl:all_reduce``...), None for coalesced or unknown ones."""
    bare = re.sub(r"^(c10d::|nccl:|gloo:)", "", name.strip().lower()).strip("_")
    for pattern, kind in _COLLECTIVES:
        if pattern.search(bare):
            return kind
    return None


def _numel(dims: Any) -> int | None:
    if not isinstance(dims, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in dims):
        return None
    return math.prod(dims)


def _tensor(dims: list[Any], types: Any, i: int) -> tuple[tuple[int, ...], int] | None:
    """(shape, element bytes) of positional input ``i`` when it is a tensor, else None (a Scalar,
    a list of ints, None, or a missing position)."""
    if i >= len(dims) or not isinstance(types, list) or i >= len(types):
        return None
    size = ELEMENT_BYTES.get(types[i]) if isinstance(types[i], str) else None
    if size is None or _numel(dims[i]) is None:
        return None
    return tuple(dims[i]), size


def gemm_shape(op: str, dims: list[Any]) -> tuple[int, int, int, int] | None:
    """(b, M, N, K) of a GEMM operator from its ``Input Dims``, None when they do not fit."""
    try:
        if op in ("aten::mm",) and len(dims) >= 2:
            (m, k), (k2, n) = dims[0], dims[1]
            return (1, m, n, k) if k == k2 else None
        if op == "aten::addmm" and len(dims) >= 3:
            (m, k), (k2, n) = dims[1], dims[2]
            return (1, m, n, k) if k == k2 else None
        if op in ("aten::bmm",) and len(dims) >= 2:
            (b, m, k), (b2, k2, n) = dims[0], dims[1]
            return (b, m, n, k) if k == k2 and b == b2 else None
        if op == "aten::baddbmm" and len(dims) >= 3:
            (b, m, k), (b2, k2, n) = dims[1], dims[2]
            return (b, m, n, k) if k == k2 and b == b2 else None
        if op == "aten::matmul" and len(dims) >= 2:
            f = training_gemms("MatMul", dims[0], dims[1]).forward
            return (f.b, f.m, f.n, f.k)
        if op == "aten::linear" and len(dims) >= 2:
            x, w = dims[0], dims[1]
            if len(w) != 2 or not x or x[-1] != w[1]:
                return None
            return (1, math.prod(x[:-1]), w[0], w[1])
    except (TypeError, ValueError, ModelError):
        return None
    return None


def memory_bytes(op: str, dims: list[Any], types: Any) -> tuple[float, tuple[int, ...]] | None:
    """(bytes moved, shape) of a memory-bound operator (:data:`MEMORY_OPS`), None when unknown.

    Inputs by position, as in the ATen schemas (``native_functions.yaml``): ``self`` first; a
    binary op's ``other`` second (a 0-d tensor or Scalar reads nothing worth counting); an
    ``out=`` tensor after them is the output, not an input; ``copy_(self, src)`` writes
    ``self`` and reads ``src``; ``layer_norm(input, normalized_shape, weight, bias, ...)`` reads
    input, weight and bias and writes an output like its input."""
    rule = MEMORY_OPS.get(op)
    first = _tensor(dims, types, 0)
    if rule is None or first is None or not first[0]:
        return None
    shape0, size0 = first
    n0 = math.prod(shape0)
    if rule == "unary":
        return 2.0 * n0 * size0, shape0
    if rule == "write":
        return float(n0 * size0), shape0
    if rule == "reduce":  # read the input once; the reduced output is small
        return float(n0 * size0), shape0
    if rule == "softmax4":
        return 4.0 * n0 * size0, shape0
    other = _tensor(dims, types, 1)
    if op == "aten::copy_":
        if other is None:
            return None
        return float(n0 * size0 + math.prod(other[0]) * other[1]), shape0
    read = n0 * size0
    shape = shape0
    if other is not None and other[0]:  # a tensor operand (0-d ones are wrapped scalars)
        try:
            shape = tuple(int(x) for x in np.broadcast_shapes(shape0, other[0]))
        except ValueError:
            return None
        read += math.prod(other[0]) * other[1]
    return float(read + math.prod(shape) * size0), shape


_OWNERS = frozenset(GEMM_OPS | set(MEMORY_OPS) | set(LAYER_NORM_OPS) | set(ATTENTION_OPS) | OPTIMIZER_OPS | CONV_OPS)


def norm_sample(op: str, dims: list[Any], types: Any, t: float) -> NormSample | None:
    """The rows and width of a LayerNorm/RMSNorm operator (:data:`LAYER_NORM_OPS`): its input
    ``x`` is the first input forward, the second backward (after the output gradient:
    ``native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight, bias,
    output_mask)``, ``native_functions.yaml``); its width is the numel of its weight, the first
    later tensor input whose shape is a proper trailing part of ``x``'s (``normalized_shape``:
    schema-independent, ``mean``/``rstd`` keep ``x``'s rank).  An operator without a weight is
    left out: the law prices the weight gradient's GammaBeta kernel, which it does not run."""
    pass_, rms = LAYER_NORM_OPS[op]
    first = 0 if pass_ == "fwd" else 1
    x = _tensor(dims, types, first)
    if x is None or not x[0]:
        return None
    shape = x[0]
    for i in range(first + 1, len(dims)):
        w = _tensor(dims, types, i)
        if w is not None and 0 < len(w[0]) < len(shape) and tuple(w[0]) == shape[len(shape) - len(w[0]):]:
            width = math.prod(w[0])
            rows = math.prod(shape) // width if width else 0
            return NormSample(pass_, rows, width, x[1], rms, t, op) if rows > 0 else None
    return None


def attention_sample(op: str, dims: list[Any], t: float) -> AttentionSample | None:
    """The flash kernel's problem from Q, K, V ``[b, h, s, d]`` (the first three inputs forward;
    backward: the output gradient first, then Q, K, V).  Causality is not in the shapes (the
    profiler records ``is_causal`` only among the ``Concrete Inputs``): the fit costs every
    sample as causal, as a decoder language model runs it (dml2comm.calibrate.classes)."""
    first = 1 if ATTENTION_OPS[op] == "bwd" else 0
    try:
        q, k, v = (dims[first + i] for i in range(3))
        if len(q) != 4 or len(k) != 4 or len(v) != 4 or q[0] != k[0]:
            return None
        return AttentionSample(ATTENTION_OPS[op], int(q[0] * q[1]), int(q[2]), int(k[2]), int(q[3]), int(v[3]), t, op)
    except (IndexError, TypeError, ValueError):
        return None


def conv_sample(op: str, dims: list[Any], types: Any, t: float) -> GemmSample | None:
    """A convolution's implicit GEMM ``(groups, N x output pixels, K / groups, C / groups x R x S)``
    (:func:`dml2comm.cost.compute.gemm_dims`), its output pixels taken as its input's (the
    profiler records no strides or padding of a convolution: a same-padded, stride-1 one)."""
    try:
        x, w = dims[0], dims[1]
        if len(x) < 3 or len(w) != len(x):
            return None
        dtype = _GEMM_DTYPES.get(types[0]) if isinstance(types, list) and types else None
        groups = max(1, x[1] // w[1]) if w[1] else 1
        if dtype is None:
            return None
        return GemmSample(groups, x[0] * math.prod(x[2:]), w[0] // groups, w[1] * math.prod(w[2:]), dtype, t, op)
    except (IndexError, TypeError, ValueError, ZeroDivisionError):
        return None


def optimizer_samples(trace: RankTrace, steps: Sequence[tuple[str, float]]) -> list[OptimizerSample]:
    """One sample per fused optimizer step: its kernels' time and the parameters it updated, the
    numel of the trace's ``AccumulateGrad`` inputs (one per parameter and backward) over the steps."""
    if not steps:
        return []
    numel, size = 0, 0
    for row, (dims, types) in trace.inputs.items():
        if trace.names[trace.name[row]] == _ACCUMULATE and dims and isinstance(types, list) and types:
            n = _numel(dims[0])
            if n:
                numel += n
                size = size or ELEMENT_BYTES.get(types[0], 0)
    if not numel or not size:
        return []
    per_step = numel // len(steps)
    return [OptimizerSample(per_step, size, t, op) for op, t in steps]


def _innermost(trace: RankTrace, rows: np.ndarray, thread: np.ndarray, t: np.ndarray) -> np.ndarray:
    """For each (thread, time) query, the row (of ``rows``, CPU operators) of the latest-starting
    operator on that thread that spans the time, -1 when none."""
    out = np.full(t.size, -1, dtype=np.int64)
    for h in np.unique(thread):
        mine = rows[trace.thread[rows] == h]
        if mine.size == 0:
            continue
        order = np.argsort(trace.ts[mine], kind="stable")
        mine = mine[order]
        starts, ends = trace.ts[mine], (trace.ts[mine] + trace.dur[mine])
        for qi in np.flatnonzero(thread == h).tolist():
            j = int(np.searchsorted(starts, t[qi], side="right")) - 1
            while j >= 0 and ends[j] < t[qi]:
                j -= 1
            if j >= 0:
                out[qi] = mine[j]
    return out


def _level(ranks: tuple[int, ...], group_size: int, world: int | None, per_node: int) -> str | None:
    if ranks:
        return "intra_node" if len({r // per_node for r in ranks}) == 1 else "inter_node"
    if world and group_size == world:
        return "intra_node" if world <= per_node else "inter_node"
    return None


def classify_collectives(raw: Sequence[RawCollective], world_size: int | None, gpus_per_node: int) -> list[CollectiveSample]:
    """The samples of ``raw`` (one trace's, of a run of ``world_size`` ranks) whose link level
    is known on nodes of ``gpus_per_node`` GPUs, with that level: intra-node when the group's
    ranks (ranks are numbered node by node, as torchrun does) share a node; a group whose ranks
    are not recorded is known only when it is the whole world.  The others are left out."""
    out = []
    for c in raw:
        level = _level(c.ranks, c.group_size, world_size, gpus_per_node)
        if level is not None:
            out.append(CollectiveSample(c.kind, c.group_size, level, c.size_bytes, c.time_s))
    return out


def _metadata(path: Path) -> tuple[str, dict[str, Any]]:
    """(sha256 of the file as stored, the trace's top-level keys other than ``traceEvents``);
    the text read as :func:`~dml2comm.traces.load.read_trace_bytes` reads it (a gzip inflated
    under the cap)."""
    try:
        with open(path, "rb") as fh:
            digest = hashlib.file_digest(fh, "sha256").hexdigest()
    except OSError as exc:
        raise TraceError(f"cannot read {path.name!r}: {exc.strerror or exc}; check the path and its permissions") from exc
    text = read_trace_bytes(path)
    meta: dict[str, Any] = {}
    try:
        top = msgspec.json.decode(text, type=dict[str, msgspec.Raw])
        for key, value in top.items():
            if key == "traceEvents":
                continue
            try:
                meta[key] = msgspec.json.decode(value)
            except (msgspec.DecodeError, RecursionError):
                continue
        top = value = None  # the Raw views into the mapped text, released before it is closed
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return digest, {}  # a bare event list, or not JSON: load_trace says which
    finally:
        if isinstance(text, mmap.mmap):
            try:
                text.close()
            except BufferError:  # a Raw view is still alive (an error's traceback): closed when collected
                pass
    return digest, meta


def _versions(meta: dict[str, Any]) -> dict[str, str]:
    """PyTorch/CUDA/NCCL/CUPTI versions the trace records (any top-level ``*version*`` key and
    ``distributedInfo.nccl_version``)."""
    out = {k: str(v) for k, v in meta.items() if "version" in k.lower() and isinstance(v, (str, int, float)) and k != "schemaVersion"}
    info = meta.get("distributedInfo")
    if isinstance(info, dict) and info.get("nccl_version") is not None:
        out["nccl_version"] = str(info["nccl_version"])
    if meta.get("schemaVersion") is not None:
        out["kineto_schema_version"] = str(meta["schemaVersion"])
    return dict(sorted(out.items()))


def file_samples(path: str) -> TraceFile:
    """The map step of ``calibrate``, one task per trace file (it runs where the executor puts it:
    this process, a local worker process or a Dask worker): the file's provenance and
    :func:`trace_samples`; the trace itself is dropped here.

    Raises
    ------
    TraceError
        The file is missing, truncated or not a PyTorch-profiler trace.
    """
    p = Path(path)
    trace = load_trace(p, shapes=True)  # first: it names what is wrong with a file that is not a trace
    digest, meta = _metadata(p)
    props = meta.get("deviceProperties")
    devices = [d for d in props if isinstance(d, dict)] if isinstance(props, list) else []
    return TraceFile(p.name, digest, trace.rank, trace.world_size, devices, _versions(meta), trace_samples(trace),
                     trace.bad_events)


def _add_op_sample(out: TraceSamples, op: str, dims: list[Any], types: Any, t: float, knames: list[str]) -> None:
    """The sample of one shaped operator whose kernels took ``t`` seconds (``knames``), if any."""
    if op in GEMM_OPS:
        if not any(GEMM_KERNEL.search(n) for n in knames):
            return
        shape = gemm_shape(op, dims)
        tensor_types = [x for x in (types or []) if x in _GEMM_DTYPES] if isinstance(types, list) else []
        if shape is None or not tensor_types or min(shape) < 1:
            return
        dtype = _GEMM_DTYPES[tensor_types[0]]
        if dtype == "fp32" and any(_TF32_KERNEL.search(n) for n in knames):
            dtype = "tf32"
        out.gemms.append(GemmSample(*shape, dtype, t, op))
    elif op in MEMORY_OPS:
        if any(n.lower().startswith("nccl") or GEMM_KERNEL.search(n) for n in knames):
            return
        moved = memory_bytes(op, dims, types)
        if moved is not None and moved[0] > 0:
            out.memory.append(MemorySample(moved[0], t, op, moved[1], "norm" if op in NORM_ATEN_OPS else "pointwise"))
    elif op in LAYER_NORM_OPS:
        if any(GEMM_KERNEL.search(n) for n in knames):
            return
        norm = norm_sample(op, dims, types, t)
        if norm is not None:
            out.layer_norm.append(norm)
    elif op in ATTENTION_OPS:
        att = attention_sample(op, dims, t)
        if att is not None:
            out.attention.append(att)
    elif op in CONV_OPS:
        conv = conv_sample(op, dims, types, t)
        if conv is not None:
            out.convs.append(conv)


def trace_samples(trace: RankTrace) -> TraceSamples:
    """Every GEMM, memory-bound, LayerNorm/RMSNorm, flash-attention, convolution, fused-optimizer and collective
    sample of one trace loaded with ``shapes=True`` (collectives raw: :func:`classify_collectives`
    gives their levels)."""
    out = TraceSamples(shaped_ops=len(trace.inputs))
    kernels = np.flatnonzero(trace.kind == Kind.KERNEL)
    cpu = np.flatnonzero(trace.kind == Kind.CPU_OP)
    names = trace.names
    interesting_ids = np.array([i for i, nm in enumerate(names) if nm in _OWNERS or nm == "record_param_comms"], dtype=np.int32)
    ops = cpu[np.isin(trace.name[cpu], interesting_ids)]
    owner = np.full(kernels.size, -1, dtype=np.int64)
    ext = trace.external_id if trace.external_id is not None else np.full(trace.kind.size, -1, dtype=np.int64)
    kernel_ext = ext[kernels]
    by_ext = kernels.size > 0 and bool(np.any((kernel_ext >= 0) & (kernel_ext != trace.correlation[kernels])))
    if by_ext:
        out.link = "External id"
        op_of_ext = {int(e): int(r) for r, e in zip(ops.tolist(), ext[ops].tolist()) if e >= 0}
        owner = np.array([op_of_ext.get(int(e), -1) for e in kernel_ext.tolist()], dtype=np.int64)
    if not by_ext or not np.any(owner >= 0):
        out.link = "enclosure"
        runtime = np.flatnonzero(trace.kind == Kind.RUNTIME)
        launch_of = {int(c): int(r) for r, c in zip(runtime.tolist(), trace.correlation[runtime].tolist()) if c >= 0}
        launch = np.array([launch_of.get(int(c), -1) for c in trace.correlation[kernels].tolist()], dtype=np.int64)
        ok = launch >= 0
        found = _innermost(trace, ops, trace.thread[launch[ok]], trace.ts[launch[ok]]) if ok.any() else np.zeros(0, np.int64)
        owner = np.full(kernels.size, -1, dtype=np.int64)
        owner[ok] = found
    # per operator: its kernels' total time and names
    per_op: dict[int, list[int]] = {}
    for k, o in zip(kernels.tolist(), owner.tolist()):
        if o >= 0:
            per_op.setdefault(o, []).append(k)
    comm_by_row = {r.index: r for r in trace.comms}
    nccl = [k for k in kernels.tolist() if names[trace.name[k]].lower().startswith("nccl")]
    out.nccl_kernels = len(nccl)
    steps: list[tuple[str, float]] = []
    for row, ks in per_op.items():
        op = names[trace.name[row]]
        if op in OPTIMIZER_OPS:  # tensor lists: no shapes recorded
            t_opt = float(sum(trace.dur[k] for k in ks)) * 1e-6
            if t_opt > 0:
                steps.append((op, t_opt))
            continue
        shapes = trace.inputs.get(row)
        t = float(sum(trace.dur[k] for k in ks)) * 1e-6
        if shapes is not None and t > 0:
            _add_op_sample(out, op, shapes[0], shapes[1], t, [names[trace.name[k]] for k in ks])
    out.optimizer = optimizer_samples(trace, steps)
    # collectives: the kernel's own arguments, else the record_param_comms operator that launched it
    kernel_owner = dict(zip(kernels.tolist(), owner.tolist()))
    for k in nccl:
        rec: CommRecord | None = trace.kernel_comms.get(k)
        if rec is None or not rec.in_nelems and not rec.out_nelems:
            rec = comm_by_row.get(kernel_owner.get(k, -1))
        if rec is None or not (rec.in_nelems or rec.out_nelems):
            continue
        kind = collective_kind(rec.collective)
        size = COMM_DTYPE_BYTES.get(rec.dtype)
        group = rec.group_size or len(rec.ranks)
        if kind is None or size is None or group < 2:
            continue
        nelems = rec.out_nelems if kind == "ALL_GATHER" else rec.in_nelems or rec.out_nelems
        if kind == "SEND_RECV" and not rec.in_nelems:
            nelems = rec.out_nelems
        out.collectives.append(RawCollective(kind, group, tuple(rec.ranks), float(nelems * size), float(trace.dur[k]) * 1e-6))
    return out
