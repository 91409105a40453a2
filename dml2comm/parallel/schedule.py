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
  ``forward_backward_pipelining_with_interleaving``, megatron/core/pipeline_parallel/schedules.py):
  ``min((p - s - 1) * 2 + (v - 1) * p, m v)`` warm-up forwards (Megatron-Core's
  ``num_warmup_microbatches`` with its default ``microbatch_group_size_per_vp_stage = p``),
  forwards visit chunks in groups of ``p`` micro-batches, backwards the chunks in reverse;
  needs ``m`` to be a multiple of ``p``.

This module is the one place the order is written: :func:`device_order` gives, for every
device, where its k-th forward and k-th backward sit in its list and which micro-batch and chunk
they run.  Two users read it: the simulator compiles it into its dependency arrays
(:func:`dml2comm.sim.levels.compile_schedule`), and the memory model counts the forwards in
flight on each device (:func:`dml2comm.cost.memory.in_flight_micro_batches`).
``tests/oracles.py`` writes the same orders out step by step (``build_schedule``), the
reference the tests check them against and the step lists :func:`dml2comm.sim.engine.simulate`
also accepts.
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass

import numpy as np

from dml2comm.errors import ConfigError
from dml2comm.parallel.config import SCHEDULES, Schedule

__all__ = ["StepKind", "Step", "check_schedule", "DeviceOrder", "device_order", "forward_position",
           "backward_position", "forward_index", "backward_index"]


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


@dataclass(frozen=True)
class DeviceOrder:
    """Every device's order under one schedule: each device runs ``T = m v`` forwards and ``T``
    backwards, ``2 T`` steps.  The k-th forward (backward) runs the same micro-batch and chunk on
    every device; only the warm-up, and so the positions, differ per device."""

    name: Schedule  # interleaved with v < 2 is 1F1B
    p: int
    m: int
    v: int  # model chunks per device (1 unless interleaved)
    warm: np.ndarray  # [p] warm-up forwards of each device
    forward_at: np.ndarray  # [p, T] position of each device's k-th forward in its list
    backward_at: np.ndarray  # [p, T] position of each device's k-th backward
    forward_micro_batch: np.ndarray  # [T] micro-batch of the k-th forward
    forward_chunk: np.ndarray  # [T] its chunk
    backward_micro_batch: np.ndarray  # [T] micro-batch of the k-th backward
    backward_chunk: np.ndarray  # [T] its chunk

    @property
    def total(self) -> int:
        """Forwards (and backwards) per device, ``m v``."""
        return self.m * self.v


@functools.lru_cache(maxsize=512)
def device_order(name: str, p: int, m: int, v: int = 1) -> DeviceOrder:
    """Schedule ``name``'s order on ``p`` devices for ``m`` micro-batches and ``v`` chunks.

    With ``W`` warm-up forwards (GPipe ``T``; 1F1B ``min(p - s - 1, m)``; interleaved
    ``min(2 (p - s - 1) + (v - 1) p, T)``) the k-th forward sits at position ``k`` (``k < W``)
    or ``2k - W``, the k-th backward at ``W + 2k + 1`` (``k < T - W``) or ``T + k``: warm-up
    forwards, then one forward and one backward in turn, then the remaining backwards.
    Cached (the simulator's compiled schedule and the memory model's in-flight count read the
    same order); its arrays are read-only.
    """
    check_schedule(name, p, m, v)
    name = Schedule.of(name)
    if name is Schedule.INTERLEAVED and v < 2:
        name = Schedule.ONE_F_ONE_B
    if name is not Schedule.INTERLEAVED:
        v = 1
    total = m * v
    s = np.arange(p)
    if name is Schedule.GPIPE:
        warm = np.full(p, total)
    elif name is Schedule.ONE_F_ONE_B:
        warm = np.minimum(p - s - 1, m)
    else:
        warm = np.minimum((p - s - 1) * 2 + (v - 1) * p, total)
    k = np.arange(total)
    w = warm[:, None]
    arrays = (warm, forward_position(w, k), backward_position(w, k, total), *_kth_ops(name, k, p, m, v))
    for a in arrays:  # cached: the simulator's compiled schedule and the memory model read one order
        a.flags.writeable = False
    return DeviceOrder(name, p, m, v, *arrays)


def forward_position(warm: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Position of the k-th forward in the list of a device with ``warm`` warm-up forwards."""
    return np.where(k < warm, k, 2 * k - warm)


def backward_position(warm: np.ndarray, k: np.ndarray, total: int) -> np.ndarray:
    """Position of the k-th backward in the list of a device with ``warm`` warm-up forwards and
    ``total`` forwards."""
    return np.where(k < total - warm, warm + 2 * k + 1, total + k)


def forward_index(micro_batch: np.ndarray, chunk: np.ndarray, p: int, v: int) -> np.ndarray:
    """k of the forward of ``(micro_batch, chunk)``: the inverse of the k-th forward's pair."""
    if v == 1:
        return micro_batch
    return (micro_batch // p) * p * v + chunk * p + micro_batch % p


def backward_index(name: Schedule, micro_batch: np.ndarray, chunk: np.ndarray, p: int, m: int, v: int) -> np.ndarray:
    """k of the backward of ``(micro_batch, chunk)`` (GPipe runs its backwards last micro-batch first)."""
    if name is Schedule.GPIPE:
        return m - 1 - micro_batch
    if v == 1:
        return micro_batch
    return (micro_batch // p) * p * v + (v - 1 - chunk) * p + micro_batch % p


def _kth_ops(name: Schedule, k: np.ndarray, p: int, m: int, v: int) -> tuple[np.ndarray, ...]:
    """(micro-batch, chunk) of every device's k-th forward and k-th backward: in order for one
    chunk (GPipe runs its backwards last micro-batch first); with ``v`` chunks, Megatron-LM's
    interleaved order (``p`` micro-batches per chunk in turn, backwards from the last chunk)."""
    if v == 1:
        zeros = np.zeros_like(k)
        return k, zeros, (m - 1 - k if name is Schedule.GPIPE else k), zeros
    mb_f = (k // (p * v)) * p + k % p
    return mb_f, (k // p) % v, mb_f, v - 1 - (k // p) % v
