"""Read one PyTorch-profiler (Kineto) trace into compact arrays.

A Kineto trace is Chrome Trace Event JSON: ``{"schemaVersion", "distributedInfo",
"deviceProperties", "baseTimeNanoseconds", "traceEvents": [...]}`` (or a bare list of events).
Complete events (``"ph": "X"``) carry ``cat`` (``cpu_op``, ``user_annotation``, ``cuda_runtime``,
``kernel``, ``gpu_memcpy``, ``gpu_memset``, ``gpu_user_annotation``, ...), ``ts``/``dur`` in
microseconds (integers in older schemas, floats with nanosecond digits since PyTorch 2.3),
``pid``/``tid`` (any integer, negative ones included, or a string), and ``args``.  A GPU event's
``args.correlation`` equals the one of the CUDA runtime call that launched it; flow events
(``ac2g``) repeat that link but are often unpaired, so they are not read.

The loader decodes with ``msgspec`` straight from a memory map of the file (or the decompressed
bytes of a ``.gz``) into structs that keep only the fields used here (every other key is skipped
while parsing, never materialised; the phase is a tagged union, so flow and instant events keep
nothing but ``ts``), then packs them column by column into numpy arrays with C-level
``map``/``attrgetter`` passes and drops the structs: a 100 MB trace loads in about 1.3 s of CPU
in under 300 MiB (``benchmarks/bench_traces.py``).  A file the typed decoder refuses (a numeric
name, a string correlation id, a phase outside the Trace Event Format) goes through a lenient
path that accepts any JSON value, with the same results, several times slower.

References: Chrome Trace Event Format (Google, "Trace Event Format" document);
Kineto ``libkineto/src/output_json.cpp``; HolisticTraceAnalysis ``hta/common/trace_parser.py``.
"""

from __future__ import annotations

import gc
import gzip
import mmap
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from operator import attrgetter
from typing import Any, NamedTuple, Union

import msgspec
import numpy as np

from dml2comm.errors import InputFileError
from dml2comm.fmt import fmt_bytes, plain
from dml2comm.traces.patterns import COMM_CPU_OPS, P2P_OP, STEP_ANNOTATION

__all__ = ["TraceError", "Kind", "CommRecord", "RankTrace", "load_trace", "find_trace_files", "rank_from_name",
           "read_trace_bytes", "step_names", "step_windows", "MAX_DECOMPRESSED_TRACE_BYTES", "MAX_EVENT_US"]


class TraceError(InputFileError):
    """A trace file is missing, truncated, not JSON, or not a PyTorch-profiler trace."""


class Kind:
    """Event kinds (codes in :attr:`RankTrace.kind`), from the Kineto ``cat`` field."""

    OTHER = 0
    CPU_OP = 1
    ANNOTATION = 2  # user_annotation (CPU ranges: ProfilerStep#N, nccl:*, ## forward ##)
    RUNTIME = 3  # cuda_runtime / cuda_driver (kernel launches)
    KERNEL = 4
    MEMCPY = 5
    MEMSET = 6
    GPU_ANNOTATION = 7
    PYTHON = 8
    SYNC = 9  # cuda_sync (Event Sync, Context Sync)
    TRACE = 10  # the profiler's own "Trace" span

    GPU = (KERNEL, MEMCPY, MEMSET)


#: ``cat`` (lower case; older schemas spelled them "Kernel", "Memcpy", "Runtime", "Operator") -> kind
_CATS = {
    "cpu_op": Kind.CPU_OP, "operator": Kind.CPU_OP, "user_annotation": Kind.ANNOTATION,
    "cuda_runtime": Kind.RUNTIME, "runtime": Kind.RUNTIME, "cuda_driver": Kind.RUNTIME,
    "kernel": Kind.KERNEL, "gpu_memcpy": Kind.MEMCPY, "memcpy": Kind.MEMCPY, "gpu_memset": Kind.MEMSET,
    "memset": Kind.MEMSET, "gpu_user_annotation": Kind.GPU_ANNOTATION, "python_function": Kind.PYTHON,
    "cuda_sync": Kind.SYNC, "trace": Kind.TRACE,
}


class _Args(msgspec.Struct, gc=False):
    # typed: Kineto writes integers; anything else sends the file down the lenient path, whose
    # _Args (built without validation) may hold any value, checked per value in _int_column
    correlation: int = -1
    external_id: Any = msgspec.field(name="External id", default=None)
    stream: int = -1
    collective: Any = msgspec.field(name="Collective name", default=None)
    pg_name: Any = msgspec.field(name="Process Group Name", default=None)
    pg_desc: Any = msgspec.field(name="Process Group Description", default=None)
    pg_ranks: Any = msgspec.field(name="Process Group Ranks", default=None)
    group_size: Any = msgspec.field(name="Group size", default=None)
    in_nelems: Any = msgspec.field(name="In msg nelems", default=None)
    out_nelems: Any = msgspec.field(name="Out msg nelems", default=None)
    dtype: Any = None
    name: Any = None  # metadata events: thread_name / process_name
    labels: Any = None  # metadata: process_labels ("CPU", "GPU 0")
    nbytes: Any = msgspec.field(name="bytes", default=None)
    # point-to-point peers: record_param_comms' "Dst Rank" of a send and "Src Rank" of a recv
    # (global ranks: torch/csrc/profiler/util.cpp saveNcclMeta writes groupRanks[rank]); the
    # c10d::send / c10d::recv_ operators' "Concrete Inputs" (record_shapes=True) hold the peer's
    # rank in the operator's group at index 2.  Kept undecoded (a view into the file's bytes, so
    # the map is closed only after packing): every operator has them, only p2p ones are read.
    src_rank: Any = msgspec.field(name="Src Rank", default=None)
    dst_rank: Any = msgspec.field(name="Dst Rank", default=None)
    concrete: msgspec.Raw = msgspec.field(name="Concrete Inputs", default=msgspec.Raw())
    # record_shapes=True: an operator's input shapes and element types (kept undecoded; decoded
    # only by load_trace(..., shapes=True), for the calibration of dml2comm.calibrate)
    input_dims: msgspec.Raw = msgspec.field(name="Input Dims", default=msgspec.Raw())
    input_types: msgspec.Raw = msgspec.field(name="Input type", default=msgspec.Raw())
    # autograd's sequence number: a forward operator that records a graph node and the backward
    # node it created (on the autograd thread) carry the same one
    sequence: Any = msgspec.field(name="Sequence number", default=None)


class _Event(msgspec.Struct, gc=False):
    """Lenient shape: any JSON value in any field."""

    ph: Any = None
    cat: Any = None
    name: Any = None
    pid: Any = None
    tid: Any = None
    ts: Any = None
    dur: Any = None
    args: Any = None


class _XEvent(msgspec.Struct, gc=False, tag_field="ph", tag="X"):
    """A complete event, typed (the fast path): what Kineto writes."""

    cat: str = ""
    name: str = ""
    pid: int | str | None = None
    tid: int | str | None = None
    ts: int | float | None = None
    dur: int | float | None = None
    args: _Args | None = None


class _MEvent(msgspec.Struct, gc=False, tag_field="ph", tag="M"):
    """A metadata event (thread and process names, labels); not a subclass of :class:`_XEvent`,
    so that ``isinstance`` tells the two apart."""

    cat: str = ""
    name: str = ""
    pid: int | str | None = None
    tid: int | str | None = None
    ts: int | float | None = None
    dur: int | float | None = None
    args: _Args | None = None


#: Every other phase of the Trace Event Format (flows s/t/f, instants, counters, async, ...):
#: decoded into a struct that keeps only ``ts`` (HTA's rounding rule looks at every event's
#: ``ts``); everything else in them is skipped while parsing.  A phase not listed here sends the
#: file down the lenient path.
_OTHER_PHASES = "BEiICbnestfPNODVvRcSTpF()"
_OTHER_EVENTS = tuple(msgspec.defstruct(f"_Phase{k}", [("ts", Any, None)], tag_field="ph", tag=ph, gc=False)
                      for k, ph in enumerate(_OTHER_PHASES))
_TypedEvent = Union[(_XEvent, _MEvent, *_OTHER_EVENTS)]  # type: ignore[valid-type]
_Other = msgspec.defstruct("_Other", [("ts", Any, None)], gc=False)  # any other phase, lenient path


class _Trace(msgspec.Struct, gc=False):
    traceEvents: Any = None
    schemaVersion: Any = None
    distributedInfo: Any = None
    deviceProperties: Any = None
    baseTimeNanoseconds: Any = None


class _TraceEvents(_Trace, gc=False):
    traceEvents: list[_TypedEvent] | None = None  # type: ignore[valid-type]


class CommRecord(NamedTuple):
    """One CPU event that carries or wraps a collective (``record_param_comms``, ``c10d::*``,
    ``nccl:*``/``gloo:*``): where it ran and what the trace says about it.  (A named tuple: a
    trace has tens of thousands and a frozen dataclass costs several times more to build.)"""

    index: int  # into the event arrays
    collective: str  # "allreduce", "c10d::alltoall_base_", "nccl:all_to_all", ...
    pg_name: str = ""
    pg_desc: str = ""
    ranks: tuple[int, ...] = ()
    group_size: int = 0
    in_nelems: int = 0
    out_nelems: int = 0
    dtype: str = ""
    #: a send's destination or a recv's source, -1 when the trace does not say; ``peer_global``:
    #: a global rank (record_param_comms) rather than a rank in an unnamed group (c10d operators)
    peer: int = -1
    peer_global: bool = False


@dataclass
class RankTrace:
    """One rank's trace as arrays (one row per complete event; times in microseconds on the
    trace's own clock, ``base_us`` added gives the global clock)."""

    path: str
    rank: int
    world_size: int | None
    backend: str
    schema_version: Any
    device: str
    base_us: float
    pg_config: list[dict[str, Any]]
    names: list[str]  # name ids -> text
    threads: list[tuple[Any, Any]]  # thread ids -> (pid, tid)
    thread_names: dict[int, str]  # thread id -> Kineto thread name
    gpu_pids: set[Any]
    kind: np.ndarray  # int8, Kind
    name: np.ndarray  # int32 into names
    thread: np.ndarray  # int32 into threads
    ts: np.ndarray  # float64 us
    dur: np.ndarray  # float64 us
    correlation: np.ndarray  # int64, -1 when absent
    stream: np.ndarray  # int64, -1 when absent
    comms: list[CommRecord]
    ts_float: bool  # any ts given as a float or missing (HTA then rounds; see overlap.hta_*)
    problems: list[str] = field(default_factory=list)
    #: events left out for times that cannot be (see :data:`MAX_EVENT_US`; listed in ``problems``)
    bad_events: int = 0
    #: filled by ``load_trace(path, shapes=True)`` only: every event's ``External id`` (int64,
    #: -1 when absent), the ``Input Dims``/``Input type`` of CPU operators that recorded them
    #: (row -> (dims, types), as the trace writes them), and the collective arguments GPU kernels
    #: carry in recent PyTorch (row -> CommRecord: ``In msg nelems``, ``Group size``, ``dtype``...),
    #: and every event's autograd ``Sequence number`` (int64, -1 when absent)
    external_id: np.ndarray | None = None
    sequence: np.ndarray | None = None
    inputs: dict[int, tuple[Any, Any]] = field(default_factory=dict)
    kernel_comms: dict[int, CommRecord] = field(default_factory=dict)

    @property
    def num_events(self) -> int:
        return int(self.kind.size)


_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)


def rank_from_name(path: str | Path) -> int | None:
    """The rank in a file name (Megatron ``torch_profile/rank-3.json.gz``, ``rank3``, ``rank_3``)."""
    m = _RANK_IN_NAME.search(Path(path).name)
    return int(m.group(1)) if m else None


def find_trace_files(paths: list[str]) -> list[Path]:
    """Expand folders to the ``*.json``/``*.json.gz`` files inside (sorted); files stay as given.

    Raises :class:`TraceError` when a path does not exist or a folder holds no trace."""
    out: list[Path] = []
    for text in paths:
        p = Path(text)
        if p.is_dir():
            found = sorted(q for q in p.rglob("*") if q.is_file() and (q.name.endswith(".json") or q.name.endswith(".json.gz")))
            if not found:
                raise TraceError(f"no .json or .json.gz trace in folder {str(p)!r}; pass the trace files or their folder")
            out.extend(found)
        elif p.is_file():
            out.append(p)
        else:
            raise TraceError(f"trace not found: {str(p)!r}; check the path")
    return list(dict.fromkeys(out))


#: The most bytes a compressed trace may inflate to (2 GiB: a 100k-step Kineto trace of one
#: rank is a few hundred MB).  A 3 MB ``.json.gz`` can inflate to 3 GiB (a decompression
#: bomb); the reader stops at this cap instead of holding the whole text in memory.  A plain
#: ``.json`` is memory-mapped, not read into memory, and has no cap.
MAX_DECOMPRESSED_TRACE_BYTES = 2 * 1024**3
#: The longest event a trace can hold, microseconds (a day): a profiled run is minutes at most;
#: a longer (or negative, or infinite) duration is a damaged or edited file, and such an event is
#: left out like one without a numeric time.
MAX_EVENT_US = 86_400e6
_CHUNK = 1 << 20


def read_trace_bytes(path: Path, limit: int | None = None) -> bytes | mmap.mmap:
    """The trace's JSON text: a read-only memory map of a plain file (no copy of a 100 MB file
    into fresh memory), or the inflated text of a gzip file (recognised by its magic bytes),
    inflated as a stream and refused past ``limit`` bytes (default
    :data:`MAX_DECOMPRESSED_TRACE_BYTES`), before more than that is held.

    Raises
    ------
    TraceError
        unreadable file, truncated or corrupt gzip, or a gzip that inflates past the cap."""
    cap = MAX_DECOMPRESSED_TRACE_BYTES if limit is None else limit
    try:
        with open(path, "rb") as fh:
            if fh.read(2) == b"\x1f\x8b":
                fh.seek(0)
                return _gunzip_capped(fh, path.name, cap)
            fh.seek(0)
            try:
                return mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
            except (ValueError, OSError):  # an empty file, or one that cannot be mapped (a pipe)
                return fh.read()
    except OSError as exc:
        if isinstance(exc, TraceError):
            raise
        raise TraceError(f"cannot read {path.name!r}: {exc.strerror or exc}; check the path and its permissions") from exc


def _gunzip_capped(fh: Any, name: str, cap: int) -> bytes:
    """Inflate the gzip stream ``fh`` chunk by chunk (every member, as ``gzip.decompress``
    does); refuse it once more than ``cap`` bytes have come out."""
    out = bytearray()
    try:
        with gzip.GzipFile(fileobj=fh, mode="rb") as gz:
            while chunk := gz.read(min(_CHUNK, cap + 1 - len(out))):
                out += chunk
                if len(out) > cap:
                    raise TraceError(
                        f"{name!r} inflates to more than {plain(fmt_bytes(cap))} (the cap on a decompressed trace; "
                        "refused unread as a possible decompression bomb); if it is a real trace, decompress it yourself "
                        f"(gunzip -k {name}) and pass the .json, which is read from disk without the cap")
    except (EOFError, OSError, zlib.error) as exc:
        if isinstance(exc, TraceError):
            raise
        raise TraceError(f"{name!r} is a truncated or corrupt .gz file ({exc}); copy it again from the run") from exc
    return bytes(out)


def _int(value: Any, default: int = -1) -> int:
    if isinstance(value, bool):
        return default
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            return default
    return default


def _ranks(value: Any) -> tuple[int, ...]:
    """Member ranks of a process group, sorted (PyTorch's ``new_group`` sorts them: a rank's index
    in the tuple is its group rank)."""
    if isinstance(value, list):
        return tuple(sorted(_int(v) for v in value if _int(v, -10**9) != -10**9))
    if isinstance(value, str):
        return tuple(sorted(int(x) for x in re.findall(r"-?\d+", value)))
    return ()


def _peer(collective: str, a: _Args) -> tuple[int, bool]:
    """(peer rank, whether it is global) of a point-to-point record, (-1, False) otherwise.

    ``record_param_comms`` of a ``send``/``recv``: ``Dst Rank``/``Src Rank``, global ranks
    (PyTorch ``torch/csrc/profiler/util.cpp``, ``saveNcclMeta``: ``groupRanks[rank]``).  The
    ``c10d::send(Tensor[] tensors, ProcessGroup process_group, int dstRank, int tag)`` and
    ``c10d::recv_(..., int srcRank, int tag)`` operators (``torch/csrc/distributed/c10d/Ops.cpp``):
    their third ``Concrete Inputs`` entry (only with ``record_shapes=True``), the peer's rank in the
    operator's process group, which the trace does not name."""
    kind = P2P_OP.search(collective)
    if kind is None:
        return -1, False
    send = kind.group(1).lower() == "send"
    value = _int(a.dst_rank if send else a.src_rank, -1)
    if value >= 0:
        return value, True
    concrete = a.concrete
    if isinstance(concrete, msgspec.Raw):
        if not concrete:
            return -1, False
        try:
            concrete = msgspec.json.decode(concrete)
        except msgspec.DecodeError:
            return -1, False
    if isinstance(concrete, list) and len(concrete) > 2:
        return _int(concrete[2], -1), False
    return -1, False


def load_trace(path: str | Path, *, shapes: bool = False) -> RankTrace:
    """Load one rank's trace.

    Parameters
    ----------
    path : a ``.json`` or ``.json.gz`` (gzip is recognised by its magic bytes) Kineto trace.
    shapes : also keep ``External id``, operators' recorded input shapes and types, and the
        collective arguments of GPU kernels (:attr:`RankTrace.inputs`, ...; the calibration
        reads them; off by default, it costs time on large traces).

    Returns
    -------
    RankTrace with every complete (``X``) event as a row; metadata events give thread names and
    which pids are GPUs.

    Raises
    ------
    TraceError
        truncated gzip, not JSON, JSON that is not a trace, or a trace without events.
    """
    path = Path(path)
    raw = read_trace_bytes(path)
    enabled = gc.isenabled()
    gc.disable()  # millions of small objects: collections during the decode would only cost time
    try:
        typed = True
        try:
            doc = msgspec.json.decode(raw, type=_TraceEvents | list[_TypedEvent])  # type: ignore[valid-type]
        except msgspec.ValidationError:
            # a field of an unexpected type (a numeric name, args not an object, a phase not in
            # the Trace Event Format): the lenient shape
            typed = False
            try:
                doc = msgspec.json.decode(raw, type=_Trace | list[_Event])
            except msgspec.DecodeError as exc:
                raise TraceError(f"{path.name!r} is not a PyTorch-profiler trace ({exc})") from exc
            except RecursionError as exc:
                raise _too_deep(path) from exc
        except RecursionError as exc:
            raise _too_deep(path) from exc
        except msgspec.DecodeError as exc:
            reason = "is empty" if not bytes(raw).strip() else f"is not valid JSON ({exc})"
            raise TraceError(f"{path.name!r} {reason}; a PyTorch-profiler trace is a JSON object with traceEvents") from exc
        if isinstance(doc, list):
            events, meta = doc, _Trace()
        else:
            events, meta = doc.traceEvents, doc
            if events is None:
                raise TraceError(f"{path.name!r} is JSON but not a PyTorch-profiler trace: it has no traceEvents list")
            if not isinstance(events, list):
                raise TraceError(f"{path.name!r}: traceEvents is not a list")
            if typed:
                meta = _Trace(None, doc.schemaVersion, doc.distributedInfo, doc.deviceProperties, doc.baseTimeNanoseconds)
        del doc
        trace = _pack(path, events, meta, typed, shapes)
        del events, meta  # the last references to the decoded values (``Concrete Inputs`` are views into raw)
        return trace
    finally:
        if isinstance(raw, mmap.mmap):
            try:
                raw.close()  # the map is not needed any more
            except BufferError:  # an error left a view alive (its traceback holds it): closed when collected
                pass
        if enabled:
            gc.enable()


def _too_deep(path: Path) -> TraceError:
    return TraceError(f"{path.name!r} nests JSON arrays or objects too deeply to decode (Python's recursion limit); a "
                      "PyTorch-profiler trace nests a few levels (traceEvents, each event's args): pass the trace file itself")


def _sanitise(events: list[Any]) -> tuple[list[Any], int]:
    """Events of the lenient shape made regular (slow path, only for files the typed decoder
    refused): complete events as :class:`_XEvent` with strings where strings belong and numbers or
    None for times, metadata as :class:`_MEvent`, any other phase as ``_Other`` (its ``ts`` only)."""
    out: list[Any] = []
    bad = 0
    rename = {"External id": "external_id", "Collective name": "collective", "Process Group Name": "pg_name",
              "Process Group Description": "pg_desc", "Process Group Ranks": "pg_ranks", "Group size": "group_size",
              "In msg nelems": "in_nelems", "Out msg nelems": "out_nelems", "bytes": "nbytes", "Src Rank": "src_rank",
              "Dst Rank": "dst_rank", "Concrete Inputs": "concrete", "Input Dims": "input_dims", "Input type": "input_types"}
    keep = set(_Args.__struct_fields__)
    for e in events:
        if isinstance(e, dict):
            e = _Event(**{k: e.get(k) for k in _Event.__struct_fields__})
        if not isinstance(e, _Event):
            bad += 1
            continue
        ts = e.ts if isinstance(e.ts, (int, float)) and not isinstance(e.ts, bool) else None
        if e.ph not in ("X", "M"):
            out.append(_Other(ts))
            continue
        a = e.args
        args = None
        if isinstance(a, dict):
            args = _Args(**{rename.get(k, k): v for k, v in a.items() if rename.get(k, k) in keep})
        dur = e.dur if isinstance(e.dur, (int, float)) and not isinstance(e.dur, bool) else None
        cls = _XEvent if e.ph == "X" else _MEvent
        out.append(cls(str(e.cat or ""), str(e.name if e.name is not None else ""),
                       e.pid if isinstance(e.pid, (int, str)) else str(e.pid), e.tid if isinstance(e.tid, (int, str)) else str(e.tid),
                       ts, dur, args))
    return out, bad


_TS, _DUR, _CAT, _NAME, _ARGS = (attrgetter(k) for k in ("ts", "dur", "cat", "name", "args"))
_PID, _TID = attrgetter("pid"), attrgetter("tid")
_IS_X, _IS_M = _XEvent.__instancecheck__, _MEvent.__instancecheck__
_CORR, _STREAM = attrgetter("correlation"), attrgetter("stream")
_NO_ARGS = _Args()


def _ids(values: list[Any]) -> tuple[list[Any], np.ndarray]:
    """Distinct values in first-seen order, and each value's index among them (int32)."""
    distinct = list(dict.fromkeys(values))
    index = dict(zip(distinct, range(len(distinct))))
    return distinct, np.fromiter(map(index.__getitem__, values), dtype=np.int32, count=len(values))


def _int_column(values: list[Any]) -> np.ndarray:
    """int64 column: integers as they are, anything else (absent, a string, a float) -1."""
    if set(map(type, values)) <= {int}:
        return np.array(values, dtype=np.int64)
    return np.fromiter((v if type(v) is int else -1 for v in values), dtype=np.int64, count=len(values))


def _pack(path: Path, events: list[Any], meta: _Trace, typed: bool, shapes: bool = False) -> RankTrace:
    """Column-wise conversion (C-level ``map``/``attrgetter`` passes, no per-event Python code on
    the common path: a 100 MB trace's ~400k events take a few tenths of a second)."""
    problems: list[str] = []
    bad = 0
    if not typed:
        events, bad = _sanitise(events)
    ts_float = not set(map(type, map(_TS, events))) <= {int}  # HTA rounds when any ts is fractional or absent
    meta_events = list(filter(_IS_M, events))
    xs = list(filter(_IS_X, events))
    del events
    ts = np.fromiter(map(_TS, xs), dtype=np.float64, count=len(xs))  # None -> NaN
    dur = np.fromiter(map(_DUR, xs), dtype=np.float64, count=len(xs))
    with np.errstate(invalid="ignore"):
        valid = np.isfinite(ts) & np.isfinite(dur) & (dur >= 0) & (dur <= MAX_EVENT_US)
    if not valid.all():
        bad += int((~valid).sum())
        xs = [e for e, ok in zip(xs, valid.tolist()) if ok]
        ts, dur = ts[valid], dur[valid]
    if bad:
        problems.append(f"{bad} events without usable ts/dur were skipped (missing, not numbers, infinite, negative, or "
                        f"over a day long)")
    if not xs:
        if bad:
            raise TraceError(f"{path.name!r} has no usable complete (ph X) events: {bad} have no numeric ts/dur (e.g. times "
                             "written as strings); the Trace Event Format gives ts and dur as numbers of microseconds: "
                             "export the trace with torch.profiler's export_chrome_trace")
        raise TraceError(f"{path.name!r} is an empty trace: no complete (ph X) events; profile at least one step")
    thread_names, gpu_pids = _thread_metadata(meta_events)
    cats, cat_id = _ids(list(map(_CAT, xs)))
    kind = np.array([_CATS.get(c.lower(), Kind.OTHER) if isinstance(c, str) else Kind.OTHER for c in cats], dtype=np.int8)[cat_id]
    names, name = _ids(list(map(_NAME, xs)))
    # threads: (pid, tid) in first-seen order, without building a tuple per event
    pids, pid_id = _ids(list(map(_PID, xs)))
    tids, tid_id = _ids(list(map(_TID, xs)))
    key = pid_id.astype(np.int64) * len(tids) + tid_id
    distinct, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    rank_of = np.empty(order.size, dtype=np.int32)
    rank_of[order] = np.arange(order.size, dtype=np.int32)
    thread = rank_of[inverse.reshape(-1)]
    threads = [(pids[k // len(tids)], tids[k % len(tids)]) for k in distinct[order].tolist()]
    args = list(map(_ARGS, xs))
    del xs
    if None in args:
        args = [_NO_ARGS if a is None else a for a in args]
    if typed:  # validated integers
        corr = np.fromiter(map(_CORR, args), dtype=np.int64, count=len(args))
        stream = np.fromiter(map(_STREAM, args), dtype=np.int64, count=len(args))
    else:
        corr = _int_column(list(map(_CORR, args)))
        stream = _int_column(list(map(_STREAM, args)))
    comm_ids = np.array([i for i, nm in enumerate(names) if isinstance(nm, str) and COMM_CPU_OPS.match(nm)], dtype=np.int32)
    comm_rows = np.flatnonzero(np.isin(name, comm_ids) & ((kind == Kind.CPU_OP) | (kind == Kind.ANNOTATION)))
    info = meta.distributedInfo if isinstance(meta.distributedInfo, dict) else {}
    pg_config = [pg for pg in info.get("pg_config", []) if isinstance(pg, dict)] if isinstance(info.get("pg_config"), list) else []
    comms = _comm_records(comm_rows, args, names, name, pg_config)
    extra = _shape_columns(args, kind) if shapes else {}
    del args
    rank = _rank_of(info, path, problems)
    world = _int(info.get("world_size"), -1)
    if 0 < world <= rank:
        raise TraceError(f"{path.name!r} is rank {rank} of a world of {world} ranks (distributedInfo), but ranks run 0 to "
                         f"{world - 1}: the file's distributedInfo (or name) is wrong; pass the traces of one run as written")
    devices = meta.deviceProperties if isinstance(meta.deviceProperties, list) else []
    device = str(devices[0].get("name", "")) if devices and isinstance(devices[0], dict) else ""
    base = meta.baseTimeNanoseconds
    base_us = float(base) / 1e3 if isinstance(base, (int, float)) and not isinstance(base, bool) else 0.0
    thread_index = {k: i for i, k in enumerate(threads)}
    return RankTrace(
        path=str(path), rank=rank, world_size=world if world > 0 else None, backend=str(info.get("backend") or ""),
        schema_version=meta.schemaVersion, device=device, base_us=base_us, pg_config=pg_config,
        names=names, threads=threads, thread_names={thread_index[k]: v for k, v in thread_names.items() if k in thread_index},
        gpu_pids=gpu_pids, kind=kind, name=name, thread=thread, ts=ts, dur=dur, correlation=corr, stream=stream, comms=comms,
        ts_float=ts_float, problems=problems, bad_events=bad, **extra,
    )


def _thread_metadata(meta_events: list[Any]) -> tuple[dict[tuple[Any, Any], str], set[Any]]:
    """The metadata events' thread names per (pid, tid) and the pids Kineto labels as GPUs."""
    thread_names: dict[tuple[Any, Any], str] = {}
    gpu_pids: set[Any] = set()
    for e in meta_events:
        a = e.args
        if a is None:
            continue
        if e.name == "thread_name" and isinstance(a.name, str):
            thread_names[(e.pid, e.tid)] = a.name
        elif e.name == "process_labels" and isinstance(a.labels, str) and a.labels.startswith("GPU"):
            gpu_pids.add(e.pid)
    return thread_names, gpu_pids


def _comm_records(comm_rows: np.ndarray, args: list[Any], names: list[Any], name: np.ndarray,
                  pg_config: list[dict[str, Any]]) -> list[CommRecord]:
    """One :class:`CommRecord` per communication CPU op or annotation row: its collective, process
    group (a group known only by its name takes description and ranks from ``pg_config``), sizes,
    dtype and peer."""
    # a group known only by its name ("Process Group Name": "5") takes description and ranks from pg_config
    by_pg_name = {str(pg.get("pg_name")): (str(pg.get("pg_desc") or ""), _ranks(pg.get("ranks"))) for pg in pg_config
                  if pg.get("pg_name") is not None}
    ranks_memo: dict[str, tuple[int, ...]] = {}
    comms = []
    for idx in comm_rows.tolist():
        a = args[idx]
        nm = names[name[idx]]
        if a is _NO_ARGS:
            comms.append(CommRecord(idx, nm))
            continue
        coll = a.collective if isinstance(a.collective, str) else ""
        pg_name, pg_desc = str(a.pg_name or ""), str(a.pg_desc or "")
        raw_ranks = a.pg_ranks
        if isinstance(raw_ranks, str):  # Kineto writes "[0, 1]": parse each distinct text once
            ranks = ranks_memo.get(raw_ranks)
            if ranks is None:
                ranks = ranks_memo[raw_ranks] = _ranks(raw_ranks)
        else:
            ranks = _ranks(raw_ranks)
        if pg_name and pg_name in by_pg_name and not (pg_desc and ranks):
            desc, pg_ranks = by_pg_name[pg_name]
            pg_desc, ranks = pg_desc or desc, ranks or pg_ranks
        peer, peer_global = _peer(coll or nm, a)
        comms.append(CommRecord(
            idx, coll or nm, pg_name, pg_desc, ranks, max(_int(a.group_size, 0), 0),
            max(_int(a.in_nelems, 0), 0), max(_int(a.out_nelems, 0), 0), str(a.dtype or ""), peer, peer_global))
    return comms


def _rank_of(info: dict[str, Any], path: Path, problems: list[str]) -> int:
    """The trace's rank: distributedInfo's, else the file name's, else 0 (said in ``problems``)."""
    rank = _int(info.get("rank"), -1)
    if rank >= 0:
        return rank
    from_name = rank_from_name(path)
    if from_name is None:
        problems.append("no distributedInfo.rank and no rank in the file name; taken as rank 0")
        return 0
    return from_name


def _raw_value(value: Any) -> Any:
    """A value kept as ``msgspec.Raw`` (typed path) decoded; other values as they are."""
    if isinstance(value, msgspec.Raw):
        if not value:
            return None
        try:
            return msgspec.json.decode(value)
        except msgspec.DecodeError:
            return None
    return value


def _shape_columns(args: list[Any], kind: np.ndarray) -> dict[str, Any]:
    """``load_trace(..., shapes=True)``'s extra fields of :class:`RankTrace`."""
    external = _int_column([a.external_id for a in args])
    inputs: dict[int, tuple[Any, Any]] = {}
    for idx in np.flatnonzero(kind == Kind.CPU_OP).tolist():
        a = args[idx]
        dims = _raw_value(a.input_dims)
        if isinstance(dims, list) and dims:
            inputs[idx] = (dims, _raw_value(a.input_types))
    kernel_comms: dict[int, CommRecord] = {}
    for idx in np.flatnonzero(kind == Kind.KERNEL).tolist():
        a = args[idx]
        if a is _NO_ARGS or not isinstance(a.collective, str):
            continue
        kernel_comms[idx] = CommRecord(
            idx, a.collective, str(a.pg_name or ""), str(a.pg_desc or ""), _ranks(a.pg_ranks), max(_int(a.group_size, 0), 0),
            max(_int(a.in_nelems, 0), 0), max(_int(a.out_nelems, 0), 0), str(a.dtype or ""))
    sequence = _int_column([a.sequence for a in args])
    return {"external_id": external, "inputs": inputs, "kernel_comms": kernel_comms, "sequence": sequence}


def step_names(trace: RankTrace) -> np.ndarray:
    """Boolean mask of the ``ProfilerStep#N`` annotations."""
    ids = np.array([i for i, nm in enumerate(trace.names) if STEP_ANNOTATION.match(nm)], dtype=np.int32)
    return np.isin(trace.name, ids) & (trace.kind != Kind.GPU_ANNOTATION)


def step_windows(trace: RankTrace) -> list[tuple[float, float]]:
    """The CPU span of each ``ProfilerStep#N`` annotation in time order; empty when the trace has
    none (it is one step)."""
    rows = np.flatnonzero(step_names(trace))
    rows = rows[np.argsort(trace.ts[rows], kind="stable")]
    return [(float(trace.ts[i]), float(trace.ts[i] + trace.dur[i])) for i in rows.tolist()]
