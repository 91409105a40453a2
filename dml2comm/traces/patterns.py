"""Every name pattern the trace classifier uses, in one place.

Change these tables (not the code in :mod:`dml2comm.traces.classify`) when a framework or an
NCCL release renames something.  Matching order, first hit wins:

1. **process group** of the collective that launched a kernel (``record_param_comms`` args
   ``Process Group Description`` / ``Process Group Name``, Megatron-LM's group names such as
   ``TENSOR_MODEL_PARALLEL_GROUP``): :data:`PG_DIMS`;
2. **collective name** (``Collective name`` of ``record_param_comms``, the ``c10d::*`` operator,
   or the ``nccl:*`` / ``gloo:*`` annotation around the launch): :data:`COLLECTIVE_DIMS`;
3. **kernel name** (only when the launch has no CPU context): :data:`KERNEL_DIMS`.  One NCCL
   kernel serves several collectives (``ncclKernel_SendRecv`` runs pipeline sends *and*
   all-to-all), so this is the last resort.

Kernel types for the HolisticTraceAnalysis-compatible figures use HTA's own regular expressions
(``hta/utils/utils.py`` of holistictraceanalysis 0.5.0): :data:`HTA_COMM_KERNEL`,
:data:`HTA_MEMORY_KERNEL`, :data:`HTA_NOT_COMPUTE_KERNEL`.

References: Kineto trace format (``libkineto/src/output_json.cpp``, pytorch/kineto);
PyTorch ``record_param_comms`` (``torch/csrc/distributed/c10d/ParamCommsUtils.hpp``);
Megatron-LM ``megatron/core/parallel_state.py`` (``pg_options``/group descriptions).
"""

from __future__ import annotations

import re

__all__ = [
    "STEP_ANNOTATION",
    "BACKWARD_MARKERS",
    "RECOMPUTE_MARKERS",
    "OPTIMIZER_MARKERS",
    "BACKWARD_THREAD",
    "COMM_CPU_OPS",
    "GLOO_THREAD",
    "PG_DIMS",
    "COLLECTIVE_DIMS",
    "KERNEL_DIMS",
    "COMM_KERNEL",
    "HTA_COMM_KERNEL",
    "HTA_MEMORY_KERNEL",
    "HTA_NOT_COMPUTE_KERNEL",
    "SYNC_EVENTS",
]

#: CPU annotation of one training step (``torch.profiler.profile.step()``).
STEP_ANNOTATION = re.compile(r"^ProfilerStep#(\d+)")

#: CPU operators/annotations whose span marks the backward pass (on the thread that runs them).
BACKWARD_MARKERS = re.compile(
    r"^autograd::engine::evaluate_function: (?!CheckpointFunctionBackward)|^## backward ##|"
    r"Backward\d*$|^backward_step|\.backward$")
#: Activation recomputation: forward work launched inside a checkpointed block's backward.
RECOMPUTE_MARKERS = re.compile(r"CheckpointFunctionBackward|^## recompute|recompute_forward|^checkpoint")
#: The optimizer step (``Optimizer.step#FusedAdam.step``, DDP tutorials' ``## optimizer ##``,
#: Megatron's ``optimizer`` range).
OPTIMIZER_MARKERS = re.compile(r"^Optimizer\.step|^Optimizer\.zero_grad|## optimizer ##|^optimizer(\.step)?$|multi_tensor_apply")
#: Autograd engine worker threads run the backward pass (thread names from Kineto metadata).
BACKWARD_THREAD = re.compile(r"pt_autograd|autograd")

#: CPU events that carry or wrap a collective (c10d operators, NCCL/gloo annotations).
COMM_CPU_OPS = re.compile(r"^record_param_comms$|^c10d::|^nccl:|^gloo:|^ProcessGroupNCCL|^ProcessGroupGloo")
#: Threads of the gloo backend (its collectives run there in CPU-only traces).
GLOO_THREAD = re.compile(r"gloo", re.IGNORECASE)

#: Process-group description or name -> parallel dimension (Megatron-LM group names first; an
#: expert *data*-parallel group is data parallelism; context parallelism is reported as other).
PG_DIMS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"EXPERT_DATA|EXPERT_DP|expt_dp", re.I), "dp"),
    (re.compile(r"EXPERT|TENSOR_AND_EXPERT|\bep\b|moe", re.I), "ep"),
    (re.compile(r"TENSOR_AND_DATA|TENSOR_AND_CONTEXT|CONTEXT_PARALLEL|\bcp\b|^MODEL_PARALLEL_GROUP", re.I), "other"),
    (re.compile(r"TENSOR_MODEL_PARALLEL|TENSOR_PARALLEL|\btp\b", re.I), "tp"),
    (re.compile(r"PIPELINE|EMBEDDING|\bpp\b", re.I), "pp"),
    (re.compile(r"DATA_PARALLEL|DISTRIBUTED_OPTIMIZER|\bdp\b|fsdp|ddp", re.I), "dp"),
)

#: Collective name (record_param_comms ``Collective name``, ``c10d::NAME_``, ``nccl:NAME``)
#: -> dimension, for groups without a recognisable description.  ``None`` = decide by phase:
#: reductions and gathers in the backward pass or the optimizer step are data-parallel
#: gradient/parameter traffic; in the forward pass over a group smaller than the world they
#: are tensor-parallel; otherwise data-parallel (DDP's broadcast, a whole-world all-reduce).
COLLECTIVE_DIMS: tuple[tuple[re.Pattern[str], str | None], ...] = (
    (re.compile(r"send|recv|p2p|batch_isend_irecv", re.I), "pp"),
    (re.compile(r"all_?to_?all", re.I), "ep"),
    (re.compile(r"all_?reduce|reduce_?scatter|all_?gather|broadcast|^_?reduce", re.I), None),
    (re.compile(r"barrier|monitored_barrier", re.I), "other"),
)

#: NCCL kernel name -> dimension, the last resort (no CPU context).  NCCL 2.19 renamed
#: ``ncclKernel_*`` to ``ncclDevKernel_*``; both are matched.
KERNEL_DIMS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"SendRecv|_Send|_Recv"), "pp"),
    (re.compile(r"AllToAll"), "ep"),
    (re.compile(r"AllReduce|ReduceScatter|AllGather|Broadcast|Reduce"), "dp"),
)

#: A communication kernel (any NCCL device kernel).
COMM_KERNEL = re.compile(r"^nccl")

#: HTA 0.5.0 ``hta.utils.utils``: ``NCCL_KERNEL_RE``, ``MEMORY_KERNEL_RE``, ``NCCL_COMPUTE_KERNEL_RE``.
HTA_COMM_KERNEL = re.compile(r"^nccl.*Kernel")
HTA_MEMORY_KERNEL = re.compile(r"(^Memcpy)|(^Memset)|(^dma)")
HTA_NOT_COMPUTE_KERNEL = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")
#: Device synchronisation events HTA counts as GPU events (``_filter_gpu_kernels_with_cuda_sync``).
SYNC_EVENTS = frozenset({"Event Sync", "Context Sync"})
