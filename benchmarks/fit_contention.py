"""Measure how much a GEMM slows down while a collective overlaps it, on the bundled real traces
(``tests/fixtures/traces/hta/``, HolisticTraceAnalysis's test traces; provenance in ``ORIGIN.txt``).

    PYTHONPATH=. .venv/bin/python benchmarks/fit_contention.py [TRACE ...]

For every compute kernel (HTA's kernel types: not a collective, copy, set or sync) that a
collective kernel on another stream overlaps, the sample is

- ``overlap``: microseconds of the kernel during which a collective runs (the union of the
  collectives' intervals intersected with the kernel's);
- ``extra``: its duration less the median duration of the same kernel (name, grid and block)
  where nothing overlaps it (at least two such runs are needed; kernels without are skipped).

It prints, per trace, the ratio ``sum(extra) / sum(overlap)`` over matrix-product kernels (the GEMM
kernel names of ``dml2comm.calibrate.samples.GEMM_KERNEL``) with a bootstrap 95% interval, and the
same over the other compute kernels.  A ratio k means: hiding a collective of c seconds behind a
GEMM of g seconds takes (1 - k) min(c, g) off the step, not min(c, g).

Measured (2026-11-25): the A100 trace (``nccl_parser_config``, NCCL ring all-reduce, LL protocol,
8 channels, overlapping a CNN's backward under DDP): 34 GEMM samples, k = 0.247 (95% 0.17-0.33),
other compute kernels 0.00 (-0.16 to 0.13); the two ``trace_filter`` ranks (pipeline send/recv,
GPU not recorded): k = 0.06 and -0.09 (43 and 62 samples); ``negative_queue_length_values_check``
has 4 GEMM samples, too few to read.  Not in the cost model: see the
README's known limitations for what it does to the bundled validation sources.
"""

from __future__ import annotations

import argparse
import gzip
import sys
import json
import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from dml2comm.calibrate.samples import GEMM_KERNEL  # noqa: E402
from dml2comm.errors import InputFileError  # noqa: E402
from dml2comm.traces.overlap import intersection_measure, union  # noqa: E402
from dml2comm.traces.patterns import HTA_COMM_KERNEL, HTA_NOT_COMPUTE_KERNEL  # noqa: E402



@dataclass(frozen=True, slots=True)
class ContentionSample:
    """One compute kernel overlapped by collectives (microseconds)."""

    name: str
    overlap_us: float
    extra_us: float
    gemm: bool


@dataclass(frozen=True, slots=True)
class ContentionFit:
    """``sum(extra) / sum(overlap)`` over the GEMM samples, a bootstrap 95% interval, and the
    same ratio over the other compute kernels (``None`` without samples)."""

    value: float
    low: float
    high: float
    gemm_samples: int
    other: float | None
    other_samples: int


def read_kernels(path: str | Path) -> list[dict[str, Any]]:
    """The GPU kernel events (``cat`` ``kernel``) of a Kineto trace, gzip or plain JSON."""
    p = Path(path)
    try:
        raw = p.read_bytes()
        text = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
        doc = json.loads(text)
    except (OSError, ValueError, EOFError) as exc:
        raise InputFileError(f"cannot read trace {p}: {exc}; pass a PyTorch profiler (Kineto) JSON trace") from exc
    events = doc.get("traceEvents", []) if isinstance(doc, dict) else []
    return [e for e in events if isinstance(e, dict) and e.get("cat") == "kernel" and isinstance(e.get("dur"), (int, float))]


def contention_samples(kernels: Iterable[dict[str, Any]]) -> list[ContentionSample]:
    """The overlapped compute kernels of one rank's kernel events (module docstring)."""
    comm: dict[Any, list[tuple[float, float]]] = defaultdict(list)
    compute = []
    for e in kernels:
        name = str(e.get("name", ""))
        args = e.get("args") or {}
        start, end = float(e["ts"]), float(e["ts"]) + float(e["dur"])
        if HTA_COMM_KERNEL.match(name):
            comm[args.get("stream")].append((start, end))
        elif not HTA_NOT_COMPUTE_KERNEL.match(name):
            compute.append((name, str(args.get("grid")), str(args.get("block")), args.get("stream"), start, end))
    # per stream, the union of the collectives on every other stream (the project's interval
    # arithmetic, dml2comm.traces.overlap), built once per stream, not once per kernel
    others: dict[Any, tuple[np.ndarray, np.ndarray]] = {}
    base: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    overlapped = []
    for name, grid, block, stream, start, end in compute:
        if stream not in others:
            spans = [iv for s, ivs in comm.items() if s != stream for iv in ivs]
            others[stream] = union(np.array([a for a, _ in spans], dtype=float), np.array([b for _, b in spans], dtype=float))
        o = intersection_measure((np.array([start]), np.array([end])), others[stream])
        if o > 0:
            overlapped.append(((name, grid, block), end - start, o))
        else:
            base[(name, grid, block)].append(end - start)
    out = []
    for key, dur, o in overlapped:
        if len(base[key]) >= 2:
            out.append(ContentionSample(key[0], o, dur - statistics.median(base[key]), bool(GEMM_KERNEL.search(key[0]))))
    return out


def _ratio(samples: Sequence[ContentionSample]) -> float:
    return sum(s.extra_us for s in samples) / sum(s.overlap_us for s in samples)


def fit_contention(samples: Sequence[ContentionSample], draws: int = 2000, seed: int = 0) -> ContentionFit:
    """The ratio estimator over the GEMM samples with a bootstrap 95% interval (``draws``
    resamples, fixed ``seed``).

    Raises
    ------
    InputFileError
        No overlapped GEMM kernel with a non-overlapped twin in the samples."""
    gemm = [s for s in samples if s.gemm]
    other = [s for s in samples if not s.gemm]
    if not gemm:
        raise InputFileError("no GEMM kernel overlapped by a collective (with two runs of it that are not) in the trace; "
                             "profile a step where the gradient all-reduce overlaps the backward pass")
    rng = np.random.default_rng(seed)
    extra = np.array([s.extra_us for s in gemm])
    overlap = np.array([s.overlap_us for s in gemm])
    picks = rng.integers(0, len(gemm), size=(draws, len(gemm)))
    boot = np.sort(extra[picks].sum(axis=1) / overlap[picks].sum(axis=1))
    return ContentionFit(_ratio(gemm), float(np.quantile(boot, 0.025)), float(np.quantile(boot, 0.975)), len(gemm),
                         _ratio(other) if other else None, len(other))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces", nargs="*", help="Kineto JSON traces (default: the bundled HTA traces)")
    args = ap.parse_args()
    paths = [Path(p) for p in args.traces] or sorted((REPO_ROOT / "tests" / "fixtures" / "traces" / "hta").glob("*.json.gz"))
    for path in paths:
        samples = contention_samples(read_kernels(path))
        try:
            fit = fit_contention(samples)
        except InputFileError as exc:
            print(f"{path.name}: {exc}")
            continue
        other = "n/a" if fit.other is None else f"{fit.other:+.3f} ({fit.other_samples} samples)"
        print(f"{path.name}: GEMMs k = {fit.value:+.3f} (95% {fit.low:+.3f} to {fit.high:+.3f}, {fit.gemm_samples} samples); "
              f"other compute kernels {other}")


if __name__ == "__main__":
    main()
