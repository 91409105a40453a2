"""Pipeline parallelism: contiguous stages that minimise the slowest stage, and their Send/Recv.

Stage assignment solves the linear-partition problem (split a sequence of layer costs into
``p`` contiguous non-empty parts minimising the largest part; Bokhari 1988, "Partitioning
problems in parallel, pipelined and distributed computing") by bisection on the bottleneck
value with a greedy feasibility check (on prefix sums; each probe moves a bound to a value a
range can take), then splits the largest parts until there are
exactly ``p``.  This is what the pipeline-balancing tools of PipeDream (Narayanan et al.,
SOSP'19, Sec. 3.1) and DeepSpeed's ``partition_method=parameters|type`` approximate.

Boundary traffic (Narayanan et al. 2021, Sec. 2.2): per micro-batch, each activation that is
produced before a boundary and read after it is sent forward, and its gradient backward.
Tensors that need no gradient (masks, position tables: they depend only on inputs) are
rebuilt by each stage from the inputs, as Megatron-LM does, and are not sent.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
import itertools
from typing import Sequence

from dml2comm.errors import ConfigError

__all__ = ["partition_layers", "Boundary", "stage_boundaries"]


def partition_layers(costs: Sequence[float], p: int) -> tuple[tuple[int, int], ...]:
    """Split ``costs`` (one per layer) into ``p`` contiguous ranges ``[start, end)``.

    Minimises the largest range sum (to within 1e-9 relative).  Raises ConfigError when
    ``p`` exceeds the number of layers.
    """
    n = len(costs)
    if p > n:
        raise ConfigError(f"--p {p} is larger than the model's {n} layers; use --p {n} or fewer")
    if p == 1:
        return ((0, n),)
    lo = max(costs)
    hi = sum(costs)
    if hi <= 0:
        costs = [1.0] * n
        lo, hi = 1.0, float(n)
    prefix = list(itertools.accumulate(costs, initial=0.0))

    def greedy(limit: float, most: int) -> list[tuple[int, int]]:
        """Longest ranges of sum <= limit from the left (at least one layer each); stops once
        there are more than ``most``."""
        parts, start = [], 0
        while start < n and len(parts) <= most:
            end = max(bisect.bisect_right(prefix, prefix[start] + limit, start + 1) - 1, start + 1)
            parts.append((start, end))
            start = end
        return parts

    # bisection on the bottleneck, each probe moving a bound to a value the greedy can reach:
    # a feasible probe lowers ``hi`` to its largest range; an infeasible one raises ``lo`` to
    # the least limit at which one of its ranges would take one more layer
    lo = max(lo, hi / p)
    parts = [(0, n)]
    for _ in range(200):
        if hi - lo <= 1e-12 * hi:
            break
        mid = (lo + hi) / 2
        probe = greedy(mid, p)
        if len(probe) <= p:
            parts = probe
            hi = min(mid, max(prefix[b] - prefix[a] for a, b in probe))
        else:
            lo = max(mid, min(prefix[b + 1] - prefix[a] for a, b in probe if b < n))
    tight = greedy(hi, p)  # the greedy at the bottleneck itself: the fullest leading stages
    if len(tight) <= p:
        parts = tight
    sums = [sum(costs[a:b]) for a, b in parts]
    while len(parts) < p:  # split the costliest multi-layer part; never raises the maximum
        k = max((i for i, (a, b) in enumerate(parts) if b - a > 1), key=sums.__getitem__)
        a, b = parts[k]
        best, cut = None, a + 1
        for c in range(a + 1, b):
            worst = max(sum(costs[a:c]), sum(costs[c:b]))
            if best is None or worst < best:
                best, cut = worst, c
        parts[k:k + 1] = [(a, cut), (cut, b)]
        sums[k:k + 1] = [sum(costs[a:cut]), sum(costs[cut:b])]
    return tuple(parts)


@dataclass(frozen=True, slots=True)
class Boundary:
    """Activations crossing from stage ``stage`` to ``stage + 1`` (names; sizes come later)."""

    stage: int
    tensors: tuple[str, ...]


def stage_boundaries(
    producer_stage: dict[str, int], consumer_stages: dict[str, set[int]], needs_grad: frozenset[str], p: int
) -> tuple[Boundary, ...]:
    """For each boundary k (between stage k and k+1), the tensors that cross it."""
    crossing: list[list[str]] = [[] for _ in range(max(p - 1, 0))]
    for name, src in producer_stage.items():
        if name not in needs_grad:
            continue
        last = max(consumer_stages.get(name, ()), default=src)
        for k in range(src, last):
            crossing[k].append(name)
    return tuple(Boundary(k, tuple(sorted(c))) for k, c in enumerate(crossing))
