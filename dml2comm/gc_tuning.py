"""The cyclic garbage collector's thresholds while a command or a sweep runs.

An analysis allocates millions of small objects that live to its end (the graph, its
tensor-parallel shards, the op costs, the stage tables) and almost no reference cycles, so
CPython's default young-generation threshold of 700 allocations
(https://docs.python.org/3/library/gc.html#gc.set_threshold) runs some 400 collections on the
70B analysis, each walking the survivors, for nothing.  At 50,000 the 70B analysis
(``benchmarks/bench_analysis.py``) takes about 8% less CPU time (min of five runs, 1.18 ->
1.06 s with the bytecode cached) and the 530B sweep (``benchmarks/bench_sweep.py``) about 3%
less; every output is unchanged (the collector frees only cycles, and they are still freed,
later).  Memory: at most 50,000 young container objects wait for a collection (a few MB).

numpy's transparent-huge-page advice is left as it is.  Until 2026-11 the sweep turned it off
(a fault in a 2 MiB page compacts memory and zeroes all of it, kernel documentation,
admin-guide/mm/transhuge), which saved system time while its batched simulation allocated
fresh arrays per chunk; that simulation now keeps its scratch memory
(:func:`dml2comm.sim.levels.pipeline_end_times_many`), and with the advice off the 530B sweep
(``benchmarks/bench_sweep.py``) took 87,000 page faults in two workers instead of 48,000 and
0.02-0.04 s longer (four runs each), and no less with one.
"""

from __future__ import annotations

import contextlib
import gc
from typing import Iterator

__all__ = ["GC_THRESHOLDS", "collect_rarely"]

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
