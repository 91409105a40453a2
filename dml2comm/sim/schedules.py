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

The simulator computes these orders in one place, with array arithmetic
(:func:`dml2comm.sim.levels.compile_schedule`); ``tests/oracles.py`` writes them out step by
step (``build_schedule``), the reference the tests check it against and the step lists
:func:`dml2comm.sim.engine.simulate` also accepts.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from dml2comm.errors import ConfigError
from dml2comm.parallel.config import SCHEDULES, Schedule

__all__ = ["StepKind", "Step", "check_schedule"]


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
    if Schedule.of(name) is Schedule.INTERLEAVED and v >= 2 and m % p:
        raise ConfigError(
            f"the interleaved schedule needs the number of micro-batches ({m}) to be a multiple of --p {p} "
            "(Megatron-LM requires it); change --global-batch-size"
        )
