"""Per-GPU memory: model states, activations from the op graph, buffers, and the fit check.

Model states (Rajbhandari et al., "ZeRO", SC'20, arXiv:1910.02054, Sec. 3.1 and Table 1):
mixed-precision training keeps 2 bytes of 16-bit weights, 2 of 16-bit gradients and K bytes
of optimizer state per parameter (Adam: fp32 master weights, momentum, variance, K = 12;
SGD with momentum: master weights and momentum, K = 8).  ZeRO stage 1 shards the optimizer
states over the N_d data-parallel ranks, stage 2 also the gradients, stage 3 also the weights:
16 Psi, 4 Psi + 12 Psi / N_d, 2 Psi + 14 Psi / N_d, 16 Psi / N_d.  In fp32 training there is
no separate master copy (K - 4) and weights and gradients take 4 bytes.

Activations are read off the op graph, not a closed formula: every op keeps what its backward
needs, as PyTorch autograd does (``saved_tensors``), on its tensor-parallel shard:

- MatMul / Gemm / Conv / Einsum keep each activation operand whose partner needs a gradient
  (the input of a weight layer; both Q and K of Q.K^T).
- LayerNorm / RMSNorm / BatchNorm / GroupNorm keep their input; Softmax keeps its output;
  Dropout keeps its 1-byte mask; MaxPool its input and int64 indices; embedding Gather its ids;
  LSTM / GRU / RNN keep X, Y and cuDNN's reserve space (every step's gate activations).
- An op inlined from a Loop/Scan body (``Op.repeat`` > 1) keeps its tensors once per iteration.
- Point-wise ops are taken as fused kernels (Megatron-LM's fused bias-GeLU, bias-dropout-add
  and scale-mask-softmax; torch.compile): a connected region of point-wise ops keeps only the
  region inputs that its members' backward needs, and recomputes the rest.  A tanh-GeLU
  written as eight primitives therefore keeps one tensor, its input, as the fused kernel does.
- A tensor kept by several ops is stored once, and views (Reshape, Transpose, Split, ...) share
  their base's storage.
- A tensor is sized as its producer holds it: with sequence parallelism the input of a
  column-parallel layer is kept as the sequence shard and gathered again in backward
  (Korthikanti et al. 2022, Sec. 4.2.3).

For a GPT layer this reproduces Korthikanti et al. 2022 (arXiv:2205.05198), Table 2:
s b h (34 + 5 a s / h) bytes without parallelism, (10 + 24/t + 5 a s/(h t)) with tensor
parallelism, (34/t + 5 a s/(h t)) with sequence parallelism; selective recomputation drops the
attention core (the 5 a s / h terms); full recomputation keeps the layer input, 2 s b h.

In-flight micro-batches per stage s of p (Narayanan et al. 2021, Sec. 2.2; Korthikanti et al.
2022, Sec. 4.3): GPipe m; 1F1B min(p - s, m); interleaved 1F1B multiplies the 1F1B count by
1 + (p - 1) / (p m).  The first stage under 1F1B therefore holds L layers' worth whatever p.

Other memory: pipeline receive buffers (one activation and one gradient per boundary), one
data-parallel gradient bucket for NCCL, the largest transient of one op (its outputs while
it runs; under full recomputation also one layer's activations rebuilt for its backward), and
a framework constant of 1 GB for the CUDA context, cuBLAS/cuDNN workspaces and launch buffers
(NAIRR GPU-estimation guide: "300 MB to 1 GB per process", modelled as a 1 GB constant).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Sequence

from dml2comm.ir.graph import DType, Op, OpGraph, Tensor
from dml2comm.parallel.config import Schedule

__all__ = [
    "fusible_regions",
    "FRAMEWORK_OVERHEAD_BYTES",
    "ModelStates",
    "model_state_bytes",
    "in_flight_micro_batches",
    "ActivationModel",
    "POINTWISE_OPS",
    "VIEW_OPS",
]

#: CUDA context, cuBLAS/cuDNN workspaces, launch buffers (NAIRR GPU-estimation guide, 1 GB).
FRAMEWORK_OVERHEAD_BYTES = 1.0e9

VIEW_OPS = frozenset({"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Split", "Expand", "Slice"})

POINTWISE_OPS = frozenset(
    {
        "Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Reciprocal", "Neg", "Exp", "Log", "Abs", "Tanh",
        "Sigmoid", "Relu", "LeakyRelu", "Gelu", "Erf", "Sin", "Cos", "Max", "Min", "Clip", "Where",
        "Cast", "CastLike", "Dropout", "Elu", "Selu", "Celu", "Softplus", "Softsign", "HardSigmoid",
        "HardSwish", "Mish", "Sign", "Floor", "Ceil", "Round", "Equal", "Less", "Greater",
        "LessOrEqual", "GreaterOrEqual", "Not", "And", "Or", "Xor", "IsNaN", "IsInf", "Mod", "PRelu",
        "ThresholdedRelu", "BitShift",
    }
)

# What each point-wise op's backward reads, by operand: "in<i>" input i (only when the other
# operand needs a gradient for Mul/Div), "out" its output, "self" its inputs that need gradients.
_POINTWISE_NEEDS = {
    "Mul": "partner", "Div": "div", "Pow": "all", "Sqrt": "out", "Reciprocal": "out", "Exp": "out",
    "Tanh": "out", "Sigmoid": "out", "Relu": "out", "Log": "in0", "Abs": "in0", "Erf": "in0",
    "Gelu": "in0", "Sin": "in0", "Cos": "in0", "LeakyRelu": "in0", "Elu": "out", "Selu": "out",
    "Celu": "out", "Softplus": "in0", "Softsign": "in0", "HardSigmoid": "in0", "HardSwish": "in0",
    "Mish": "in0", "Max": "all", "Min": "all", "Clip": "in0", "PRelu": "all", "ThresholdedRelu": "in0",
}

_NORMS = frozenset(
    {"LayerNormalization", "RMSNormalization", "SimplifiedLayerNormalization", "BatchNormalization",
     "InstanceNormalization", "GroupNormalization", "SkipLayerNormalization", "SkipSimplifiedLayerNormalization"}
)
_KEEP_OUTPUT = frozenset({"Softmax", "LogSoftmax"})
_LINEAR = frozenset({"MatMul", "Gemm", "Conv", "ConvTranspose", "Einsum"})
#: Recurrent layers: keep X, Y and the reserve space of gate activations (ActivationModel).
_RECURRENT = frozenset({"LSTM", "GRU", "RNN"})


@dataclass(frozen=True, slots=True)
class ModelStates:
    weights_bytes: float
    grads_bytes: float
    optimizer_bytes: float

    @property
    def total_bytes(self) -> float:
        return self.weights_bytes + self.grads_bytes + self.optimizer_bytes


def model_state_bytes(params: float, dp_size: int, zero_stage: int, optimizer: str = "adam", dtype_bytes: int = 2) -> ModelStates:
    """Weights, gradients and optimizer states of ``params`` parameters on one GPU (see module
    docstring).  ``params`` is what the GPU holds after tensor and pipeline parallelism."""
    k = 12 if optimizer in ("adam", "adamw") else 8
    if dtype_bytes >= 4:
        k -= 4  # the fp32 weights are the master copy
    d = dp_size
    return ModelStates(
        weights_bytes=params * dtype_bytes / (d if zero_stage >= 3 else 1),
        grads_bytes=params * dtype_bytes / (d if zero_stage >= 2 else 1),
        optimizer_bytes=params * k / (d if zero_stage >= 1 else 1),
    )


def in_flight_micro_batches(schedule: str, pp_size: int, num_micro_batches: int, stage: int, virtual_stages: int = 1) -> float:
    """Micro-batches whose activations stage ``stage`` holds at its peak (module docstring)."""
    p, m = pp_size, num_micro_batches
    schedule = Schedule(schedule)
    if schedule is Schedule.GPIPE:
        return float(m)
    count = float(min(p - stage, m))
    if schedule is Schedule.INTERLEAVED and virtual_stages > 1:
        count *= 1 + (p - 1) / (p * m)
    return count


def fusible_regions(graph: OpGraph, kinds: frozenset[str], joins: Callable[[str, int], bool] | None = None) -> dict[int, int]:
    """op index -> region id: connected groups of ops of ``kinds`` joined by a tensor
    (union-find), i.e. what a fusing compiler or Megatron-LM's fused kernels run as one kernel.
    ``joins(tensor, producer)``, when given, says whether that tensor joins its producer's group
    to its reader's."""
    parent: dict[int, int] = {}

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for op in graph.ops:
        if op.op_type in kinds:
            parent[op.index] = op.index
    for op in graph.ops:
        if op.index not in parent:
            continue
        for name in op.inputs:
            prod = graph.producer(name) if name else None
            # ops that run a different number of times (a Loop body's and the ops around it,
            # Op.repeat) are separate kernels
            if (prod is not None and prod in parent and graph.ops[prod].repeat == op.repeat
                    and (joins is None or joins(name, prod))):
                a, b = find(op.index), find(prod)
                if a != b:
                    parent[a] = b
    return {i: find(i) for i in parent}


class ActivationModel:
    """Saved-for-backward bytes per micro-batch, per op set, on one tensor rank.

    Built once per analysis (linear in ops); :meth:`saved_bytes` answers for any set of ops.
    """

    def __init__(
        self,
        graph: OpGraph,
        local_inputs: Sequence[tuple[Tensor | None, ...]],
        local_outputs: Sequence[tuple[Tensor | None, ...]],
        needs_grad: frozenset[str],
        train_dtype: DType,
        assumed_dropout: bool = False,
    ) -> None:
        self.graph = graph
        self.needs_grad = needs_grad
        self.train_dtype = train_dtype
        # local (sharded) size of every tensor, in the training dtype for floats
        size: dict[str, float] = {}
        for op, ins, outs in zip(graph.ops, local_inputs, local_outputs):
            for name, t in list(zip(op.inputs, ins)) + list(zip(op.outputs, outs)):
                if name and t is not None and name not in size:
                    size[name] = float(t.nbytes_in(train_dtype))
        self.size = size
        self.base = self._view_bases()
        self.region = self._pointwise_regions()
        self.region_members: dict[int, list[int]] = {}
        for i, r in sorted(self.region.items()):
            self.region_members.setdefault(r, []).append(i)
        self.saved_by_op = [self._saved(op) for op in graph.ops]
        self._inside: dict[tuple[int, ...], frozenset[str]] = {}  # _region_saved: outputs of a region's ops
        self._inputs: dict[tuple[str, frozenset[str]], tuple[str, ...]] = {}  # _region_inputs answers
        if assumed_dropout and not any(op.op_type == "Dropout" for op in graph.ops):
            self._add_assumed_dropout()

    # -- structure ---------------------------------------------------------------------

    def _view_bases(self) -> dict[str, str]:
        base: dict[str, str] = {}
        for op in self.graph.ops:
            if op.op_type in VIEW_OPS and op.inputs and op.inputs[0]:
                src = base.get(op.inputs[0], op.inputs[0])
                for out in op.outputs:
                    if out:
                        base[out] = src
        return base

    def _pointwise_regions(self) -> dict[int, int]:
        return fusible_regions(self.graph, POINTWISE_OPS)

    def _is_activation(self, name: str) -> bool:
        """Produced by an op or fed as a graph input (not a weight, not a constant)."""
        t = self.graph.tensors.get(name) if name else None
        if t is None or t.is_weight:
            return False
        return t.is_input or self.graph.producer(name) is not None

    # -- per-op needs --------------------------------------------------------------------

    def _saved(self, op: Op) -> tuple[tuple[str, float], ...]:
        """(storage key, bytes) this op keeps for backward, before de-duplication."""
        grad = self.needs_grad
        kind = op.op_type
        keep: list[str] = []
        extra: list[tuple[str, float]] = []
        ins = [n for n in op.inputs if n]
        if kind in _LINEAR:
            acts = [n for n in op.inputs[:2] if n and self._is_activation(n)]
            others = [n for n in op.inputs[:2] if n]
            for n in acts:
                partners = [o for o in others if o != n]
                if any(o in grad for o in partners):
                    keep.append(n)
        elif kind in _NORMS:
            if ins and self._is_activation(ins[0]):
                keep.append(ins[0])
        elif kind in _KEEP_OUTPUT:
            keep.extend(o for o in op.outputs[:1] if o)
        elif kind == "Dropout":  # a 1-byte mask per element, whether the graph names it or not
            extra.append((f"mask:{op.index}", self._local_numel(op.outputs[0])))
        elif kind == "MaxPool":
            if ins and self._is_activation(ins[0]):
                keep.append(ins[0])
            extra.append((f"indices:{op.index}", self._local_numel(op.outputs[0]) * 8))
        elif kind in ("Gather", "GatherElements", "GatherND", "ScatterElements", "ScatterND", "TopK"):
            idx = op.inputs[1] if len(op.inputs) > 1 else ""
            if kind == "TopK":
                idx = op.outputs[1] if len(op.outputs) > 1 else ""
            if idx and idx in self.size:
                keep.append(idx)
        elif kind in ("ReduceMax", "ReduceMin", "ArgMax", "ArgMin"):
            keep.extend(n for n in ins[:1] if self._is_activation(n))
        elif kind in _RECURRENT:
            keep.extend(n for n in ins[:1] if self._is_activation(n))  # X, for dW
            keep.extend(o for o in op.outputs[:1] if o)  # Y, the hidden states, for dR
            extra.append((f"reserve:{op.index}", self._recurrent_reserve(op)))
        elif kind in _POINTWISE_NEEDS:
            keep.extend(self._pointwise_needs(op))
        # a kept view retains its base's whole storage (a view of Q keeps the fused QKV alive);
        # an op of an inlined Loop/Scan body (Op.repeat) keeps its tensors once per iteration:
        # those made in the body, and the loop-carried ones (bound to their initial value at
        # import, a new value each iteration)
        kept = (self.base.get(n, n) for n in keep if n in self.size)
        return (tuple((b, self.size.get(b, 0.0) * self._copies(b, op.repeat)) for b in kept)
                + tuple((k, v * op.repeat) for k, v in extra))

    def _copies(self, name: str, repeat: int) -> int:
        """Copies of ``name`` kept by an op that runs ``repeat`` times per forward pass: one per
        run of the op or of the producer, whichever runs more; none for an op that never runs
        (the branch of an ``If`` not taken, kept for its parameters)."""
        producer = self.graph.producer(name)
        return 0 if repeat == 0 else max(repeat, 1 if producer is None else self.graph.ops[producer].repeat)

    def _recurrent_reserve(self, op: Op) -> float:
        """What cuDNN's training reserve space holds for an LSTM/GRU/RNN's backward: the gate
        activations of every step and direction, ``T D B G H`` elements, plus the LSTM's cell
        states ``T D B H``, plus the hidden states when ``Y`` is not an output (cuDNN
        ``cudnnRNNForward``: "reserveSpace ... used to pass intermediate results from
        cudnnRNNForward() to the backward calls"; sizes as in :mod:`dml2comm.ops.recurrent`)."""
        from dml2comm.ops.recurrent import recurrent_shape

        s = recurrent_shape(op, self.graph.op_inputs(op))
        per_state = s.steps * s.directions * s.batch * s.hidden
        elements = s.gates * per_state + (s.states - 1) * per_state + (0 if op.outputs and op.outputs[0] else per_state)
        return float(elements * self.train_dtype.itemsize)

    def _local_numel(self, name: str) -> float:
        t = self.graph.tensor(name)
        if t is None:
            return 0.0
        full = self.size.get(name)
        return full / (self.train_dtype.itemsize if t.dtype.is_float else t.dtype.itemsize) if full else float(t.numel)

    def _pointwise_needs(self, op: Op) -> list[str]:
        rule = _POINTWISE_NEEDS[op.op_type]
        grad = self.needs_grad
        ins = [n for n in op.inputs if n]
        if not any(n in grad for n in ins):
            return []
        acts = [n for n in ins if self._is_activation(n)]
        if rule == "out":
            return [o for o in op.outputs[:1] if o]
        if rule == "in0":
            return [n for n in ins[:1] if n in acts]
        if rule == "partner":  # d(a*b)/da = b: keep b when a needs a gradient
            return [n for n in acts if any(o in grad for o in ins if o != n)]
        if rule == "div":  # d(a/b)/da = 1/b; d(a/b)/db = -a/b^2: keep b, and a if b needs one
            keep = [n for n in ins[1:2] if n in acts]
            if len(ins) > 1 and ins[1] in grad:
                keep.extend(n for n in ins[:1] if n in acts)
            return keep
        return acts

    def _add_assumed_dropout(self) -> None:
        """Exports are inference graphs: add the masks of the Dropout a training step runs
        where GPT-2 / Megatron-LM place it (Korthikanti et al. 2022, Sec. 4.1): on the attention
        probabilities (a 1-byte mask and the dropped-out copy the next MatMul keeps) and on each
        residual branch (a 1-byte mask), i.e. the branch input of an Add of two equal-shaped
        gradient-carrying activations (the later-produced one)."""
        g = self.graph
        for op in g.ops:
            extra: list[tuple[str, float]] = []
            if op.op_type == "Softmax":
                t = g.tensor(op.outputs[0])
                if t is not None and t.rank >= 2 and t.shape[-1] == t.shape[-2]:
                    extra.append((f"mask:{op.index}", self._local_numel(op.outputs[0])))
                    # the MatMul with V keeps the dropped-out copy; when it reads the softmax
                    # output itself (no Cast between) that copy is a tensor of its own
                    if any(g.ops[c].op_type in _LINEAR for c in g.consumers(op.outputs[0])):
                        extra.append((f"mask:{op.index}:dropped", self.size.get(op.outputs[0], 0.0)))
            elif op.op_type == "Add" and len(op.inputs) == 2:
                a, b = op.inputs
                ta, tb = g.tensor(a), g.tensor(b)
                if (ta is not None and tb is not None and ta.shape == tb.shape and a in self.needs_grad and b in self.needs_grad
                        and self._is_activation(a) and self._is_activation(b)):
                    branch = max((a, b), key=lambda n: g.producer(n) if g.producer(n) is not None else -1)
                    if self._from_linear(branch):
                        extra.append((f"mask:{op.index}", self._local_numel(branch)))
            if extra:
                self.saved_by_op[op.index] = self.saved_by_op[op.index] + tuple(extra)

    def _from_linear(self, name: str) -> bool:
        """Output of a weight layer, possibly through its bias Add (a residual branch's end)."""
        g = self.graph
        prod = g.producer(name)
        while prod is not None and g.ops[prod].op_type in VIEW_OPS:  # Gemm on [b*s, h], then Reshape
            prod = g.producer(g.ops[prod].inputs[0])
        if prod is None:
            return False
        op = g.ops[prod]
        if op.op_type in _LINEAR:
            return True
        if op.op_type == "Add":
            others = [n for n in op.inputs if n]
            weights = [n for n in others if (t := g.tensor(n)) is not None and t.is_weight]
            acts = [n for n in others if n not in weights]
            return len(weights) == 1 and len(acts) == 1 and (p := g.producer(acts[0])) is not None and g.ops[p].op_type in _LINEAR
        return False

    # -- queries -------------------------------------------------------------------------

    def saved_bytes(self, op_indices: Iterable[int], recompute: str = "none", attention_core: frozenset[int] = frozenset()) -> float:
        """Bytes kept for backward by ``op_indices`` for one micro-batch.

        ``recompute``: ``none``; ``selective`` drops what the ops in ``attention_core`` keep
        (their inputs from outside the core stay); ``full`` keeps only the inputs of the set.
        """
        ops = list(op_indices)
        members = set(ops)
        if recompute == "full":
            return self.boundary_bytes(members)
        stored: dict[str, float] = {}
        regions_seen: set[int] = set()
        core = attention_core if recompute == "selective" else frozenset()
        for i in ops:
            region = self.region.get(i)
            if region is not None:
                if region in regions_seen:
                    continue
                regions_seen.add(region)
                for key, nbytes in self._region_saved(region, members, core):
                    stored[key] = nbytes
                continue
            for key, nbytes in self.saved_by_op[i]:
                # selective recomputation rebuilds what the attention core produces (its masks
                # included) from the core's inputs, which stay
                if i in core and (key.startswith("mask:") or self._produced_in(key, core)):
                    continue
                stored[key] = max(stored.get(key, 0.0), nbytes)
        return sum(stored.values())

    def _produced_in(self, key: str, ops: frozenset[int]) -> bool:
        prod = self.graph.producer(key)
        return prod is not None and prod in ops

    def _region_saved(self, region: int, members: set[int], core: frozenset[int]) -> list[tuple[str, float]]:
        """A fused point-wise region keeps its masks and the region inputs its ops need."""
        ops = tuple(i for i in self.region_members[region] if i in members)
        inside = self._inside.get(ops)
        if inside is None:
            inside = self._inside[ops] = frozenset(o for i in ops for o in self.graph.ops[i].outputs if o)
        out: dict[str, float] = {}
        repeat = self.graph.ops[ops[0]].repeat if ops else 1  # a region never joins ops of different repeats
        for i in ops:
            for key, nbytes in self.saved_by_op[i]:
                if key.startswith(("mask:", "indices:")):
                    if i not in core:
                        out[key] = nbytes
                    continue
                if i in core and self._produced_in(key, core):
                    continue
                found = self._inputs.get((key, inside))
                if found is None:  # the same (part of a) region is asked about for many op sets
                    found = self._inputs[(key, inside)] = tuple(self._region_inputs(key, inside))
                for src in found:
                    out[src] = self.size.get(src, 0.0) * self._copies(src, repeat)
        return list(out.items())

    def _region_inputs(self, name: str, inside: frozenset[str]) -> set[str]:
        """Activation inputs of the region that ``name`` is computed from (itself if external)."""
        if name not in inside:
            return {self.base.get(name, name)} if self._is_activation(name) else set()
        seen, stack, found = set(), [name], set()
        while stack:
            n = stack.pop()
            if n in seen:
                continue
            seen.add(n)
            prod = self.graph.producer(n)
            if n in inside and prod is not None:
                stack.extend(x for x in self.graph.ops[prod].inputs if x)
            elif self._is_activation(n):
                found.add(self.base.get(n, n))
        return found

    def boundary_bytes(self, members: set[int]) -> float:
        """Activations entering ``members`` from outside that need gradients (a checkpoint)."""
        stored: dict[str, float] = {}
        for i in members:
            for name in self.graph.ops[i].inputs:
                if not name or name not in self.needs_grad or not self._is_activation(name):
                    continue
                prod = self.graph.producer(name)
                if prod is not None and prod not in members:
                    stored[self.base.get(name, name)] = self.size.get(name, 0.0)
        return sum(stored.values())

    def transient_bytes(self, op_indices: Iterable[int]) -> float:
        """The largest set of outputs one op materialises (its working set while it runs)."""
        best = 0.0
        for i in op_indices:
            op = self.graph.ops[i]
            if op.op_type in VIEW_OPS:
                continue
            best = max(best, sum(self.size.get(o, 0.0) for o in op.outputs if o))
        return best


def stage_memory_dict(states: ModelStates, activations: float, buffers: float, transient: float) -> Mapping[str, float]:
    total = states.total_bytes + activations + buffers + transient + FRAMEWORK_OVERHEAD_BYTES
    return {
        "weights_bytes": states.weights_bytes,
        "grads_bytes": states.grads_bytes,
        "optimizer_bytes": states.optimizer_bytes,
        "activations_bytes": activations,
        "buffers_bytes": buffers,
        "transient_bytes": transient,
        "framework_bytes": FRAMEWORK_OVERHEAD_BYTES,
        "total_bytes": total,
    }
