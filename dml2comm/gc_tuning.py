"""The cyclic garbage collector's thresholds while a command or a sweep runs, and numpy's
huge-page advice while a sweep runs.

An analysis allocates millions of small objects that live to its end (the graph, its
tensor-parallel shards, the op costs, the stage tables) and almost no reference cycles, so
CPython's default young-generation threshold of 700 allocations
(https://docs.python.org/3/library/gc.html#gc.set_threshold) runs some 400 collections on the
70B analysis, each walking the survivors, for nothing.  At 50,000 the 70B analysis
(``benchmarks/bench_analysis.py``) takes about 8% less CPU time (min of five runs, 1.18 ->
1.06 s with the bytecode cached) and the 530B sweep (``benchmarks/bench_sweep.py``) about 3%
less; every output is unchanged (the collector frees only cycles, and they are still freed,
later).  Memory: at most 50,000 young container objects wait for a collection (a few MB).

A sweep's batched simulation (:func:`dml2comm.sim.levels.pipeline_end_times_many`) allocates,
fills once and frees arrays of tens of MB per chunk.  numpy advises the kernel to back every
array of 4 MiB or more with transparent huge pages (``madvise(MADV_HUGEPAGE)``; numpy's
``NUMPY_MADVISE_HUGEPAGE`` environment variable, numpy reference "Environment variables"), and
with Linux's default ``defrag`` setting ``madvise`` a fault in such a region compacts memory
to find a free 2 MiB page and zeroes all of it (kernel documentation,
admin-guide/mm/transhuge).  For write-once arrays that is system time for nothing:
:func:`small_pages` turns the advice off inside the sweep (530B sweep,
``benchmarks/bench_sweep.py --workers 1``: 0.31 -> 0.23 s of system time, about 5% of the
whole run's CPU time, min of three on a shared 2-core machine); numbers are unchanged (only
where the pages come from changes).
"""

from __future__ import annotations

import contextlib
import gc
from typing import Iterator

__all__ = ["GC_THRESHOLDS", "collect_rarely", "small_pages"]

#: (young, middle, old) thresholds of :func:`gc.set_threshold` while :func:`collect_rarely` holds.
GC_THRESHOLDS = (50_000, 10, 10)


@contextlib.contextmanager
def collect_rarely() -> Iterator[None]:
    """Run the block with :data:`GC_THRESHOLDS`, restoring the caller's thresholds after (processes
    forked inside it, the sweep's workers, inherit them)."""
    before = gc.get_threshold()
    gc.set_threshold(*GC_THRESHOLDS)
    try:
        yield
    finally:
        gc.set_threshold(*before)


@contextlib.contextmanager
def small_pages() -> Iterator[None]:
    """Run the block with numpy's huge-page advice off (module docstring), restoring the
    caller's setting after (processes forked inside it, the sweep's workers, inherit it); a
    numpy without the switch runs the block unchanged."""
    import numpy as np

    core = getattr(np, "_core", None) or getattr(np, "core", None)
    switch = getattr(getattr(core, "multiarray", None), "_set_madvise_hugepage", None)
    if switch is None:  # pragma: no cover - every numpy since 1.20 has it
        yield
        return
    before = switch(False)
    try:
        yield
    finally:
        switch(before)
