"""Data parallelism: the gradient (and, for ZeRO, parameter) collectives of one stage.

- ZeRO 0 (PyTorch DDP / Megatron-LM): gradients are all-reduced once per iteration, after
  the last micro-batch's backward, in buckets of ``bucket_bytes`` that overlap the backward
  pass (Li et al., "PyTorch Distributed", VLDB 2020, Sec. 3.2; default bucket 25 MB).
- ZeRO 1 (optimizer states sharded): one ReduceScatter of the gradients and one AllGather of
  the updated parameters per iteration; same 2 Psi volume as an AllReduce (Rajbhandari et al.,
  SC'20, Sec. 7.2.1).
- ZeRO 2 (+ gradients sharded): gradients are reduce-scattered as they are produced, i.e. in
  every micro-batch's backward (DeepSpeed ZeRO-2 reduces in backward hooks), plus the
  parameter AllGather after the step.
- ZeRO 3 (+ parameters sharded): parameters are all-gathered before use in every forward and
  every backward, gradients reduce-scattered in every backward: 3 Psi per micro-batch
  (Rajbhandari et al., Sec. 7.2.2).

Message sizes follow the nccl-tests convention (AllReduce/ReduceScatter: the full buffer;
AllGather: the gathered output).  Gradients travel in the training dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

from dml2comm.network.kinds import CollectiveKind, Phase

__all__ = ["DPComm", "data_parallel_comms", "buckets"]


@dataclass(frozen=True, slots=True)
class DPComm:
    kind: CollectiveKind
    phase: Phase
    message_bytes: float
    count: int  # how many such messages
    per_micro_batch: bool  # True: repeated every micro-batch; False: once per iteration
    reason: str


def buckets(total_bytes: float, bucket_bytes: int) -> list[tuple[float, int]]:
    """Split ``total_bytes`` into full buckets and a remainder: ``[(size, count), ...]``."""
    if total_bytes <= 0:
        return []
    full = int(total_bytes // bucket_bytes)
    rest = total_bytes - full * bucket_bytes
    out: list[tuple[float, int]] = []
    if full:
        out.append((float(bucket_bytes), full))
    if rest > 0:
        out.append((float(rest), 1))
    return out


def data_parallel_comms(param_bytes: float, dp_size: int, zero_stage: int, bucket_bytes: int) -> tuple[DPComm, ...]:
    """Collectives of one GPU's data-parallel group for a stage holding ``param_bytes`` of
    (tensor-sharded) parameters in the gradient dtype."""
    if dp_size <= 1 or param_bytes <= 0:
        return ()
    out: list[DPComm] = []
    if zero_stage == 0:
        for size, count in buckets(param_bytes, bucket_bytes):
            out.append(DPComm(CollectiveKind.ALL_REDUCE, Phase.BACKWARD, size, count, False, "gradient all-reduce (DDP buckets)"))
    elif zero_stage == 1:
        for size, count in buckets(param_bytes, bucket_bytes):
            out.append(DPComm(CollectiveKind.REDUCE_SCATTER, Phase.BACKWARD, size, count, False, "ZeRO-1 gradient reduce-scatter"))
        out.append(DPComm(CollectiveKind.ALL_GATHER, Phase.OPTIMIZER, param_bytes, 1, False, "ZeRO-1 updated-parameter all-gather"))
    elif zero_stage == 2:
        for size, count in buckets(param_bytes, bucket_bytes):
            out.append(DPComm(CollectiveKind.REDUCE_SCATTER, Phase.BACKWARD, size, count, True, "ZeRO-2 gradient reduce-scatter"))
        out.append(DPComm(CollectiveKind.ALL_GATHER, Phase.OPTIMIZER, param_bytes, 1, False, "ZeRO-2 updated-parameter all-gather"))
    else:
        for size, count in buckets(param_bytes, bucket_bytes):
            out.append(DPComm(CollectiveKind.ALL_GATHER, Phase.FORWARD, size, count, True, "ZeRO-3 parameter all-gather (forward)"))
            out.append(DPComm(CollectiveKind.ALL_GATHER, Phase.BACKWARD, size, count, True, "ZeRO-3 parameter all-gather (backward)"))
            out.append(DPComm(CollectiveKind.REDUCE_SCATTER, Phase.BACKWARD, size, count, True, "ZeRO-3 gradient reduce-scatter"))
    return tuple(out)
