"""Pipeline parallelism: contiguous stages that minimise the slowest stage, and their Send/Recv.

Stage assignment solves the linear-partition problem (split a sequence of layer costs into
``p`` contiguous non-empty parts minimising the largest part; Bokhari 1988, "Partitioning
problems in parallel, pipelined and distributed computing") by bisection on the bottleneck
value with a greedy feasibility check, then splits the largest parts until there are
exactly ``p``.  This is what the pipeline-balancing tools of PipeDream (Narayanan et al.,
SOSP'19, Sec. 3.1) and DeepSpeed's ``partition_method=parameters|type`` approximate.

Boundary traffic (Narayanan et al. 2021, Sec. 2.2): per micro-batch, each activation that is
produced before a boundary and read after it is sent forward, and its gradient backward.
Tensors that need no gradient (masks, position tables: they depend only on inputs) are
rebuilt by each stage from the inputs, as Megatron-LM does, and are not sent.
"""

from __future__ import annotations

from dataclasses import dataclass
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

    def greedy(limit: float) -> list[tuple[int, int]]:
        parts, start, acc = [], 0, 0.0
        for i, c in enumerate(costs):
            if acc + c > limit and i > start:
                parts.append((start, i))
                start, acc = i, 0.0
            acc += c
        parts.append((start, n))
        return parts

    for _ in range(100):
        mid = (lo + hi) / 2
        if len(greedy(mid)) <= p:
            hi = mid
        else:
            lo = mid
        if hi - lo <= 1e-12 * hi:
            break
    parts = greedy(hi)
    while len(parts) < p:  # split the costliest multi-layer part; never raises the maximum
        k = max((i for i, (a, b) in enumerate(parts) if b - a > 1), key=lambda i: sum(costs[parts[i][0]:parts[i][1]]))
        a, b = parts[k]
        best, cut = None, a + 1
        for c in range(a + 1, b):
            worst = max(sum(costs[a:c]), sum(costs[c:b]))
            if best is None or worst < best:
                best, cut = worst, c
        parts[k:k + 1] = [(a, cut), (cut, b)]
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
