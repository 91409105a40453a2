"""Every name pattern the trace classifier uses, in one place.

Change these tables (not the code in :mod:`dml2comm.traces.classify`) when a framework or an
NCCL release renames something.  Matching order, first hit wins:

1. **process group** of the collective that launched a kernel (``record_param_comms`` args
   ``Process Group Description`` / ``Process Group Name``, or the description ``pg_config`` gives
   that name; Megatron-LM's group names such as ``TENSOR_MODEL_PARALLEL_GROUP``,
   ``CONTEXT_PARALLEL_GROUP``): :data:`PG_DIMS`;
2. **context-parallel attention** around the launch (Transformer Engine's ring/all-gather/
   all-to-all CP attention, PyTorch's ring attention, DeepSpeed-Ulysses): :data:`CP_MARKERS` -> cp;
3. the dimension a description gave the **same group** (same member ranks) elsewhere in the trace;
4. **collective name** (``Collective name`` of ``record_param_comms``, the ``c10d::*`` operator,
   or the ``nccl:*`` / ``gloo:*`` annotation around the launch): :data:`COLLECTIVE_DIMS`;
5. **kernel name** (only when the launch has no CPU context): :data:`KERNEL_DIMS`.  One NCCL
   kernel serves several collectives (``ncclKernel_SendRecv`` runs pipeline sends, ring
   attention *and* all-to-all), so this is the last resort.

Micro-batch markers (:data:`FORWARD_MICROBATCH`, :data:`BACKWARD_MICROBATCH`,
:data:`MICROBATCH`) and the pure groups that give a rank's coordinates (:data:`COORD_GROUPS`)
are here too.

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
    "P2P_OP",
    "PG_DIMS",
    "COORD_GROUPS",
    "CP_MARKERS",
    "FORWARD_MICROBATCH",
    "BACKWARD_MICROBATCH",
    "MICROBATCH",
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
    r"Backward\d*$|^backward_step|\.backward$|^(backward|bwd)[-_ ]?(mb|micro[-_ ]?batch)[-_ #:]?\d+$")
#: Activation recomputation: forward work launched inside a checkpointed block's backward.
RECOMPUTE_MARKERS = re.compile(r"CheckpointFunctionBackward|^## recompute|recompute_forward|^checkpoint")
#: The optimizer step (``Optimizer.step#FusedAdam.step``, DDP tutorials' ``## optimizer ##``,
#: Megatron's ``optimizer`` range).
OPTIMIZER_MARKERS = re.compile(r"^Optimizer\.step|^Optimizer\.zero_grad|## optimizer ##|^optimizer(\.step)?$|multi_tensor_apply")
#: Explicit micro-batch markers (CPU spans; see :mod:`dml2comm.traces.classify`), outermost wins:
#: Megatron-LM's ``forward_step`` / ``backward_step`` (``megatron/core/pipeline_parallel/
#: schedules.py``; a ``record_function`` or, with ``with_stack``, the Python function
#: ``.../schedules.py(NNN): forward_step``), ``torch.distributed.pipelining``'s ``Forward 3`` /
#: ``Backward 3`` (single-stage schedules) and ``PP:0F3`` / ``PP:0B3`` / ``PP:0I3`` / ``PP:0W3``
#: (multi-stage schedules: stage, action, micro-batch), the DDP tutorials' ``## forward ##`` /
#: ``## backward ##``, and the ``forward_mbN`` / ``backward_mbN`` ``record_function`` ranges of
#: hand-written pipeline loops (also ``forward_microbatch_N``, ``fwd_mb_N``, ``bwd_mbN``).
FORWARD_MICROBATCH = re.compile(r"^forward_step$|\): forward_step$|^Forward \d+$|^PP:\d+F\d+$|^## forward ##$|"
                                r"^(forward|fwd)[-_ ]?(mb|micro[-_ ]?batch)[-_ #:]?\d+$", re.I)
BACKWARD_MICROBATCH = re.compile(r"^backward_step$|\): backward_step$|^Backward \d+$|^PP:\d+[BIW]\d+$|^## backward ##$|"
                                 r"^(backward|bwd)[-_ ]?(mb|micro[-_ ]?batch)[-_ #:]?\d+$", re.I)
#: A whole micro-batch (forward and backward) in user annotations: ``microbatch 3``,
#: ``micro_batch_3``, ``mb3``, ``microbatch#3``.
MICROBATCH = re.compile(r"^(micro[-_ ]?batch|mb)[-_ #:]?\d+$", re.I)
#: Autograd engine worker threads run the backward pass (thread names from Kineto metadata).
BACKWARD_THREAD = re.compile(r"pt_autograd|autograd")

#: CPU events that carry or wrap a collective (c10d operators, NCCL/gloo annotations).
COMM_CPU_OPS = re.compile(r"^record_param_comms$|^c10d::|^nccl:|^gloo:|^ProcessGroupNCCL|^ProcessGroupGloo")
#: A point-to-point operation whose record names its peer (:func:`dml2comm.traces.load.load_trace`):
#: ``record_param_comms`` with ``Collective name`` ``send``/``recv``, the ``c10d::send`` /
#: ``c10d::recv_`` operators (``recv_any_source_`` names no peer).  Group 1: send or recv.
P2P_OP = re.compile(r"^(?:c10d::)?(send|recv)_?$", re.I)
#: Threads of the gloo backend (its collectives run there in CPU-only traces).
GLOO_THREAD = re.compile(r"gloo", re.IGNORECASE)

def _token(words: str) -> str:
    """``words`` (alternatives) as a whole name part: delimited by anything but a letter or a digit,
    so ``mesh_dp_shard_cp`` holds the tokens ``dp`` and ``cp`` while ``cpu`` holds neither."""
    return rf"(?<![A-Za-z0-9])(?:{words})(?![A-Za-z0-9])"


#: Process-group description or name -> parallel dimension, first match wins.  Megatron-LM's
#: descriptions (``megatron/core/parallel_state.py``: ``TENSOR_MODEL_PARALLEL_GROUP``,
#: ``CONTEXT_PARALLEL_GROUP``, ``DATA_PARALLEL_GROUP_WITH_CP``, ...) and torchtitan's DeviceMesh
#: groups (``mesh_tp``, ``mesh_cp``, ``mesh_dp_shard_cp``, ...).  Order matters: an expert
#: *data*-parallel group is data parallelism; the groups that combine dimensions
#: (``TENSOR_AND_DATA_PARALLEL_GROUP``, ``TENSOR_AND_CONTEXT_PARALLEL_GROUP``,
#: ``MODEL_PARALLEL_GROUP`` = tensor x pipeline) are "other"; the data-parallel group *with*
#: context parallelism (gradient reduction over d x c ranks) is data parallelism, so the
#: data-parallel rule comes before the context-parallel one.
PG_DIMS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"EXPERT_DATA|EXPERT_DP|expt_dp|" + _token("edp"), re.I), "dp"),
    (re.compile(r"^EXPERT_TENSOR_PARALLEL|" + _token("etp"), re.I), "tp"),
    (re.compile(r"EXPERT|" + _token("ep|moe"), re.I), "ep"),
    (re.compile(r"TENSOR_AND_DATA|TENSOR_AND_CONTEXT|^MODEL_PARALLEL_GROUP", re.I), "other"),
    (re.compile(r"DATA_PARALLEL|DISTRIBUTED_OPTIMIZER|" + _token("dp|fsdp|ddp|hsdp"), re.I), "dp"),
    (re.compile(r"CONTEXT|" + _token("cp|hcp"), re.I), "cp"),
    (re.compile(r"TENSOR_MODEL_PARALLEL|TENSOR_PARALLEL|" + _token("tp"), re.I), "tp"),
    (re.compile(r"PIPELINE|EMBEDDING|" + _token("pp"), re.I), "pp"),
)

#: The *pure* group of one dimension, which gives a rank's coordinate in that dimension (its
#: index in the sorted member list: PyTorch's group rank) for the model-replica layout
#: (:mod:`dml2comm.traces.layout`).  Combined groups (``DATA_PARALLEL_GROUP_WITH_CP``, ...) are
#: not coordinates.
COORD_GROUPS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"^(TENSOR_MODEL_PARALLEL_GROUP|(mesh_)?tp)$", re.I), "tp"),
    (re.compile(r"^(CONTEXT_PARALLEL_GROUP|(mesh_)?cp)$", re.I), "cp"),
    (re.compile(r"^(PIPELINE_MODEL_PARALLEL_GROUP|(mesh_)?pp)$", re.I), "pp"),
    (re.compile(r"^(DATA_PARALLEL_GROUP(_GLOO)?|(mesh_)?dp)$", re.I), "dp"),
)

#: CPU spans of context-parallel attention: a collective launched inside one is context-parallel
#: when its process group has no recognisable description.  Transformer Engine's autograd
#: functions ``AttnFuncWithCPAndKVP2P`` / ``AttnFuncWithCPAndKVAllGather`` /
#: ``AttnFuncWithCPAndQKVOA2A`` (their forward is recorded under the class name, their backward
#: as ``...Backward``) and ``attn_forward_func_with_cp``; PyTorch's experimental ring attention
#: (``torch.distributed.tensor.experimental.context_parallel``, ``_templated_ring_attention``);
#: DeepSpeed-Ulysses (``_SeqAllToAll``, ``DistributedAttention``).
CP_MARKERS = re.compile(r"AttnFuncWithCP|attn_forward_func_with_cp|context_parallel|_templated_ring_attention|"
                        r"ring_attention|_SeqAllToAll|DistributedAttention|ulysses", re.I)

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
