"""Read one PyTorch-profiler (Kineto) trace into compact arrays.

A Kineto trace is Chrome Trace Event JSON: ``{"schemaVersion", "distributedInfo",
"deviceProperties", "baseTimeNanoseconds", "traceEvents": [...]}`` (or a bare list of events).
Complete events (``"ph": "X"``) carry ``cat`` (``cpu_op``, ``user_annotation``, ``cuda_runtime``,
``kernel``, ``gpu_memcpy``, ``gpu_memset``, ``gpu_user_annotation``, ...), ``ts``/``dur`` in
microseconds (integers in older schemas, floats with nanosecond digits since PyTorch 2.3),
``pid``/``tid`` (any integer, negative ones included, or a string), and ``args``.  A GPU event's
``args.correlation`` equals the one of the CUDA runtime call that launched it; flow events
(``ac2g``) repeat that link but are often unpaired, so they are not read.

The loader decodes with ``msgspec`` into structs that keep only the fields used here (every other
key is skipped while parsing, never materialised), then packs them into numpy arrays and drops
the structs: a 100 MB trace loads in about a second in well under 1 GB.

References: Chrome Trace Event Format (Google, "Trace Event Format" document);
Kineto ``libkineto/src/output_json.cpp``; HolisticTraceAnalysis ``hta/common/trace_parser.py``.
"""

from __future__ import annotations

import gc
import gzip
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from dml2comm.errors import InputFileError
from dml2comm.traces.patterns import COMM_CPU_OPS, STEP_ANNOTATION

__all__ = ["TraceError", "Kind", "CommRecord", "RankTrace", "load_trace", "find_trace_files", "rank_from_name"]


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
    correlation: Any = None
    external_id: Any = msgspec.field(name="External id", default=None)
    stream: Any = None
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


class _EventArgs(_Event, gc=False):
    """Typed shape (the fast path): what Kineto writes."""

    ph: str = ""
    cat: str = ""
    name: str = ""
    pid: int | str | None = None
    tid: int | str | None = None
    ts: int | float | None = None
    dur: int | float | None = None
    args: _Args | None = None


class _Trace(msgspec.Struct, gc=False):
    traceEvents: Any = None
    schemaVersion: Any = None
    distributedInfo: Any = None
    deviceProperties: Any = None
    baseTimeNanoseconds: Any = None


class _TraceEvents(_Trace, gc=False):
    traceEvents: list[_EventArgs] | None = None


@dataclass(frozen=True)
class CommRecord:
    """One CPU event that carries or wraps a collective (``record_param_comms``, ``c10d::*``,
    ``nccl:*``/``gloo:*``): where it ran and what the trace says about it."""

    index: int  # into the event arrays
    collective: str  # "allreduce", "c10d::alltoall_base_", "nccl:all_to_all", ...
    pg_name: str = ""
    pg_desc: str = ""
    ranks: tuple[int, ...] = ()
    group_size: int = 0
    in_nelems: int = 0
    out_nelems: int = 0
    dtype: str = ""


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


def _read_bytes(path: Path) -> bytes:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise TraceError(f"cannot read {path.name!r}: {exc.strerror or exc}") from exc
    if raw[:2] == b"\x1f\x8b":
        try:
            return gzip.decompress(raw)
        except (EOFError, OSError, zlib.error) as exc:
            raise TraceError(f"{path.name!r} is a truncated or corrupt .gz file ({exc}); copy it again from the run") from exc
    return raw


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
    if isinstance(value, list):
        return tuple(_int(v) for v in value if _int(v, -10**9) != -10**9)
    if isinstance(value, str):
        return tuple(int(x) for x in re.findall(r"-?\d+", value))
    return ()


def load_trace(path: str | Path) -> RankTrace:
    """Load one rank's trace.

    Parameters
    ----------
    path : a ``.json`` or ``.json.gz`` (gzip is recognised by its magic bytes) Kineto trace.

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
    raw = _read_bytes(path)
    enabled = gc.isenabled()
    gc.disable()  # millions of small objects: collections during the decode would only cost time
    try:
        typed = True
        try:
            doc = msgspec.json.decode(raw, type=_TraceEvents | list[_EventArgs])
        except msgspec.ValidationError:
            # a field of an unexpected type (a numeric name, args not an object): the lenient shape
            typed = False
            try:
                doc = msgspec.json.decode(raw, type=_Trace | list[_Event])
            except msgspec.DecodeError as exc:
                raise TraceError(f"{path.name!r} is not a PyTorch-profiler trace ({exc})") from exc
        except msgspec.DecodeError as exc:
            reason = "is empty" if not raw.strip() else f"is not valid JSON ({exc})"
            raise TraceError(f"{path.name!r} {reason}; a PyTorch-profiler trace is a JSON object with traceEvents") from exc
        del raw
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
        return _pack(path, events, meta, typed)
    finally:
        if enabled:
            gc.enable()


def _sanitise(events: list[Any]) -> tuple[list[_Event], int]:
    """Events of the lenient shape made regular: strings where strings belong, numbers or None
    for times, args as :class:`_Args` (slow path, only for files the typed decoder refused)."""
    out, bad = [], 0
    rename = {"External id": "external_id", "Collective name": "collective", "Process Group Name": "pg_name",
              "Process Group Description": "pg_desc", "Process Group Ranks": "pg_ranks", "Group size": "group_size",
              "In msg nelems": "in_nelems", "Out msg nelems": "out_nelems", "bytes": "nbytes"}
    keep = set(_Args.__struct_fields__)
    for e in events:
        if isinstance(e, dict):
            e = _Event(**{k: e.get(k) for k in _Event.__struct_fields__})
        if not isinstance(e, _Event):
            bad += 1
            continue
        a = e.args
        args = None
        if isinstance(a, dict):
            args = _Args(**{rename.get(k, k): v for k, v in a.items() if rename.get(k, k) in keep})
        ts = e.ts if isinstance(e.ts, (int, float)) and not isinstance(e.ts, bool) else None
        dur = e.dur if isinstance(e.dur, (int, float)) and not isinstance(e.dur, bool) else None
        out.append(_EventArgs(str(e.ph or ""), str(e.cat or ""), str(e.name if e.name is not None else ""),
                              e.pid if isinstance(e.pid, (int, str)) else str(e.pid), e.tid if isinstance(e.tid, (int, str)) else str(e.tid),
                              ts, dur, args))
    return out, bad


def _pack(path: Path, events: list[Any], meta: _Trace, typed: bool) -> RankTrace:
    """Column-wise conversion (list comprehensions, no per-event branches: a 100 MB trace's
    ~400k events take a fraction of a second)."""
    problems: list[str] = []
    bad = 0
    if not typed:
        events, bad = _sanitise(events)
    ts_float = any(type(e.ts) is not int for e in events)
    meta_events = [e for e in events if e.ph == "M"]
    xs = [e for e in events if e.ph == "X" and e.ts is not None and e.dur is not None]
    bad += sum(1 for e in events if e.ph == "X") - len(xs)
    del events
    if bad:
        problems.append(f"{bad} events without numeric ts/dur were skipped")
    if not xs:
        raise TraceError(f"{path.name!r} is an empty trace: no complete (ph X) events; profile at least one step")
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
    n = len(xs)
    cat_code = {c: (_CATS.get(c.lower(), Kind.OTHER) if isinstance(c, str) else Kind.OTHER) for c in {e.cat for e in xs}}
    kind = np.fromiter((cat_code[e.cat] for e in xs), dtype=np.int8, count=n)
    name_list = [e.name for e in xs]
    names = list(dict.fromkeys(name_list))
    name_id = {nm: i for i, nm in enumerate(names)}
    name = np.fromiter((name_id[nm] for nm in name_list), dtype=np.int32, count=n)
    del name_list
    keys = [(e.pid, e.tid) for e in xs]
    threads = list(dict.fromkeys(keys))
    thread_id = {k: i for i, k in enumerate(threads)}
    thread = np.fromiter((thread_id[k] for k in keys), dtype=np.int32, count=n)
    del keys
    ts = np.fromiter((e.ts for e in xs), dtype=np.float64, count=n)
    dur = np.fromiter((e.dur for e in xs), dtype=np.float64, count=n)
    args = [e.args for e in xs]
    corr = np.fromiter((a.correlation if a is not None and type(a.correlation) is int else -1 for a in args), dtype=np.int64, count=n)
    stream = np.fromiter((a.stream if a is not None and type(a.stream) is int else -1 for a in args), dtype=np.int64, count=n)
    comm_ids = np.array([i for i, nm in enumerate(names) if isinstance(nm, str) and COMM_CPU_OPS.match(nm)], dtype=np.int32)
    comm_rows = np.flatnonzero(np.isin(name, comm_ids) & ((kind == Kind.CPU_OP) | (kind == Kind.ANNOTATION)))
    comms = []
    for idx in comm_rows:
        a = args[idx]
        nm = names[name[idx]]
        if a is None:
            comms.append(CommRecord(int(idx), nm))
            continue
        coll = a.collective if isinstance(a.collective, str) else ""
        comms.append(CommRecord(
            int(idx), coll or nm, str(a.pg_name or ""), str(a.pg_desc or ""), _ranks(a.pg_ranks), max(_int(a.group_size, 0), 0),
            max(_int(a.in_nelems, 0), 0), max(_int(a.out_nelems, 0), 0), str(a.dtype or "")))
    del args, xs
    info = meta.distributedInfo if isinstance(meta.distributedInfo, dict) else {}
    rank = _int(info.get("rank"), -1)
    if rank < 0:
        from_name = rank_from_name(path)
        if from_name is None:
            problems.append("no distributedInfo.rank and no rank in the file name; taken as rank 0")
            rank = 0
        else:
            rank = from_name
    world = _int(info.get("world_size"), -1)
    devices = meta.deviceProperties if isinstance(meta.deviceProperties, list) else []
    device = str(devices[0].get("name", "")) if devices and isinstance(devices[0], dict) else ""
    base = meta.baseTimeNanoseconds
    base_us = float(base) / 1e3 if isinstance(base, (int, float)) and not isinstance(base, bool) else 0.0
    pg_config = [pg for pg in info.get("pg_config", []) if isinstance(pg, dict)] if isinstance(info.get("pg_config"), list) else []
    return RankTrace(
        path=str(path), rank=rank, world_size=world if world > 0 else None, backend=str(info.get("backend") or ""),
        schema_version=meta.schemaVersion, device=device, base_us=base_us, pg_config=pg_config,
        names=names, threads=threads, thread_names={thread_id[k]: v for k, v in thread_names.items() if k in thread_id},
        gpu_pids=gpu_pids, kind=kind, name=name, thread=thread, ts=ts, dur=dur, correlation=corr, stream=stream, comms=comms,
        ts_float=ts_float, problems=problems,
    )


def step_names(trace: RankTrace) -> np.ndarray:
    """Boolean mask of the ``ProfilerStep#N`` annotations."""
    ids = np.array([i for i, nm in enumerate(trace.names) if STEP_ANNOTATION.match(nm)], dtype=np.int32)
    return np.isin(trace.name, ids) & (trace.kind != Kind.GPU_ANNOTATION)
