"""Pipeline schedules: the order in which each pipeline rank runs its forward and backward passes.

A schedule is, per device (pipeline rank), a list of :class:`Step` ``(kind, micro_batch,
chunk)``; ``chunk`` is the model chunk of interleaved schedules (0 otherwise).  Virtual stage
``chunk * p + device`` holds the chunk's layers, so consecutive virtual stages live on
consecutive devices (Narayanan et al. 2021, Sec. 2.2.2, Fig. 4).

- GPipe (Huang et al. 2019): every forward, then every backward (last micro-batch first).
- 1F1B / PipeDream-Flush (Narayanan et al. 2021, Sec. 2.2.1): device ``s`` runs
  ``min(p - s - 1, m)`` warm-up forwards, then alternates one forward and one backward, then
  drains the remaining backwards.
- Interleaved 1F1B (Narayanan et al. 2021, Sec. 2.2.2; Megatron-LM
  ``forward_backward_pipelining_with_interleaving``): ``(p - s - 1) * 2 + (v - 1) * p``
  warm-up forwards, forwards visit chunks in groups of ``p`` micro-batches, backwards the
  chunks in reverse; needs ``m`` to be a multiple of ``p``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from dml2comm.errors import ConfigError
from dml2comm.parallel.config import SCHEDULES, Schedule

__all__ = ["StepKind", "Step", "build_schedule", "check_schedule"]


class StepKind(enum.Enum):
    FORWARD = "F"
    BACKWARD = "B"


@dataclass(frozen=True, slots=True)
class Step:
    kind: StepKind
    micro_batch: int
    chunk: int = 0


def check_schedule(name: str, p: int, m: int, v: int = 1) -> None:
    """Raise :class:`ConfigError` when schedule ``name`` cannot run ``m`` micro-batches on ``p`` stages."""
    if name not in SCHEDULES:
        raise ConfigError(f"unknown schedule {str(name)!r}; choose gpipe, 1f1b or interleaved")
    if Schedule(name) is Schedule.INTERLEAVED and v >= 2 and m % p:
        raise ConfigError(
            f"the interleaved schedule needs the number of micro-batches ({m}) to be a multiple of --p {p} "
            "(Megatron-LM requires it); change --global-batch-size"
        )


def build_schedule(name: str, p: int, m: int, v: int = 1) -> list[list[Step]]:
    """Per-device step lists for schedule ``name`` (``gpipe``, ``1f1b``, ``interleaved``)."""
    check_schedule(name, p, m, v)
    name = Schedule(name)
    if name is Schedule.GPIPE:
        return [_gpipe(m) for _ in range(p)]
    if name is Schedule.ONE_F_ONE_B or v < 2:
        return [_one_f_one_b(p, m, s) for s in range(p)]
    return [_interleaved(p, m, v, s) for s in range(p)]


def _gpipe(m: int) -> list[Step]:
    return [Step(StepKind.FORWARD, i) for i in range(m)] + [Step(StepKind.BACKWARD, i) for i in reversed(range(m))]


def _one_f_one_b(p: int, m: int, s: int) -> list[Step]:
    warmup = min(p - s - 1, m)
    steps = [Step(StepKind.FORWARD, i) for i in range(warmup)]
    for i in range(m - warmup):
        steps.append(Step(StepKind.FORWARD, warmup + i))
        steps.append(Step(StepKind.BACKWARD, i))
    steps.extend(Step(StepKind.BACKWARD, i) for i in range(m - warmup, m))
    return steps


def _interleaved(p: int, m: int, v: int, s: int) -> list[Step]:
    total = m * v

    def forward(k: int) -> Step:
        chunk = (k // p) % v
        return Step(StepKind.FORWARD, (k // (p * v)) * p + k % p, chunk)

    def backward(k: int) -> Step:
        chunk = v - 1 - (k // p) % v
        return Step(StepKind.BACKWARD, (k // (p * v)) * p + k % p, chunk)

    warmup = min((p - s - 1) * 2 + (v - 1) * p, total)
    steps = [forward(k) for k in range(warmup)]
    for i in range(total - warmup):
        steps.append(forward(warmup + i))
        steps.append(backward(i))
    steps.extend(backward(k) for k in range(total - warmup, total))
    return steps
