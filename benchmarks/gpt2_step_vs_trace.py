"""GPT-2 small's training step on one H100 by kernel class: the tool's GPU times against the
bundled profiler trace.  Prints figures; asserts nothing.

    PYTHONPATH=. .venv/bin/python benchmarks/gpt2_step_vs_trace.py

Measured: ``benchmarks/data/h100/trace_gpt2-small_bf16_b8.json.gz`` (Hugging Face GPT-2 small,
b = 8, s = 1024, pure bf16, SDPA, AdamW fused; shared/tools/measure_gpu.py; the timed step took
51.5 ms, steps.json).  Its kernels are classed by name: GEMMs (``gemm``/``nvjet``/``cutlass``),
the LM head (the three GEMMs with the 50,257-wide vocabulary: cuBLAS's ``cutlass_75`` fallback),
attention (``sdpa``/``flash``/``fmha``/cuDNN's ``fusion`` kernels), the optimizer
(``multi_tensor_apply``), the loss (the log-softmax and NLL kernels, and the element-wise
kernels over the fp32 logits: the fp32 fills, the fp32 -> bf16 conversion, and single calls
over 0.3 ms; in this pure-bf16 model only the loss's ``logits.float()`` makes fp32 tensors,
and nothing else is large enough: its largest activation, 8 x 1024 x 3072 bf16, streams in 18
us), and element-wise / other (the rest: norms, point-wise ops, copies, reductions, the
embedding's backward).

Modelled: ``examples/gpt2-small.onnx`` (a real legacy export of GPT-2 small) at micro-batch 8 on
one H100 (``dgx-h100``), GPU time only (host model ``none``), per op from
:func:`dml2comm.cost.ops.shard_op_costs` with the stack and attention kernel named, the loss from
:func:`dml2comm.cost.loss.cross_entropy_s` for the stack (Hugging Face's loss with ``pytorch``), the optimizer from the stage table's optimizer term.
The export carries Dropout nodes; the measured run used p = 0 (no dropout kernel ran), so the
dropout ops' modelled time is printed apart and left out of the element-wise class.
"""

from __future__ import annotations

import gzip
import json
import sys
from collections import defaultdict
from pathlib import Path

from dml2comm.cost.compute import hbm_efficiency_of
from dml2comm.cost.host import NONE
from dml2comm.cost.loss import cross_entropy_s, logits_outputs
from dml2comm.cost.cache import flash_cores_of
from dml2comm.cost.ops import op_gemms, shard_op_costs
from dml2comm.cost.stages import StageCoster
from dml2comm.hardware.cluster import get_cluster
from dml2comm.ir.onnx_import import ImportOptions
from dml2comm.load import load_model
from dml2comm.parallel.config import ParallelConfig

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT / "benchmarks" / "data" / "h100" / "trace_gpt2-small_bf16_b8.json.gz"
MODEL = ROOT / "examples" / "gpt2-small.onnx"
MEASURED_STEP_S = 0.0515  # steps.json: step_s_median of gpt2-small bf16 b=8 (51.5 and 51.7 ms on two machine starts)
CLASSES = ("GEMM", "LM head GEMM", "attention", "element-wise/other", "loss", "optimizer")


def trace_classes() -> tuple[dict[str, float], dict[str, int]]:
    """Seconds and kernel counts per class in the trace (module docstring)."""
    events = json.load(gzip.open(TRACE))["traceEvents"]
    secs: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for e in events:
        if e.get("ph") != "X" or e.get("cat") != "kernel":
            continue
        name, dur = e["name"], e["dur"] * 1e-6
        low = name.lower()
        if "sdpa" in low or "flash" in low or "fmha" in low or "cudnn::fusion" in low:
            c = "attention"
        elif "cutlass_75" in low:
            c = "LM head GEMM"
        elif "gemm" in low or "nvjet" in low or "cutlass" in low:
            c = "GEMM"
        elif "multi_tensor_apply" in low:
            c = "optimizer"
        elif "softmax" in low or "nll_loss" in low or dur > 0.3e-3 or "bfloat16_copy" in low or "fillfunctor<float>" in low:
            c = "loss"
        else:
            c = "element-wise/other"
        secs[c] += dur
        count[c] += 1
    return secs, count


def model_classes(stack: str, attention: str) -> tuple[dict[str, float], dict[str, int], float]:
    """Seconds and op counts per class in the model, and the dropout ops' seconds."""
    cluster = get_cluster("dgx-h100", 1)
    gpu = cluster.gpu
    imported = load_model(MODEL, ImportOptions(batch_size=8))
    graph = imported.graph
    config = ParallelConfig(micro_batch_size=8, global_batch_size=8, stack=stack, attention=attention, precision="bf16")
    op_costs = shard_op_costs(graph, 1, False, "bf16", gpu, False, NONE, config.stack, config.attention, config.precision)
    costs, times = op_costs.costs, op_costs.times
    carriers = {core.context_op for core in flash_cores_of(graph)} if config.attention == "flash" else set()
    head = {p for _, p in logits_outputs(graph)}
    secs: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    dropout = 0.0
    for op, c, (f, b) in zip(graph.ops, costs, times):
        ins = [graph.tensor(n) if n else None for n in op.inputs]
        outs = [graph.tensor(n) if n else None for n in op.outputs]
        if op.index in head:
            k = "LM head GEMM"
        elif op.index in carriers:
            k = "attention"
        elif op_gemms(op.op_type, ins, outs, op.attrs) is not None:
            k = "GEMM"
        elif op.op_type == "Dropout":
            dropout += f + b
            continue
        else:
            k = "element-wise/other"
        secs[k] += f + b
        count[k] += 1
    for name, producer in logits_outputs(graph):
        numel = graph.tensors[name].numel
        secs["loss"] += sum(cross_entropy_s(numel, 2, gpu.hbm_bytes_per_s * hbm_efficiency_of(gpu), 0.0, config.stack))
    coster = StageCoster(imported, cluster, collapse=False)  # the optimizer term has no host part
    secs["optimizer"] += float(coster.prepare(config).optimizer.max())
    return secs, count, dropout


def main() -> int:
    measured, kernels = trace_classes()
    rows = [("trace (H100, measured)", measured, None)]
    for stack, attention in (("pytorch", "flash"), ("pytorch", "unfused"), ("megatron", "flash"), ("megatron", "unfused")):
        secs, _, dropout = model_classes(stack, attention)
        rows.append((f"--stack {stack} --attention {attention}", secs, dropout))
    print(f"{'':34s}" + "".join(f"{c:>20s}" for c in CLASSES) + f"{'sum':>10s}")
    for label, secs, dropout in rows:
        total = sum(secs.get(c, 0.0) for c in CLASSES)
        line = f"{label:34s}" + "".join(f"{secs.get(c, 0.0) * 1e3:17.2f} ms" for c in CLASSES) + f"{total * 1e3:8.2f} ms"
        if dropout is not None:
            line += f"   (+ dropout ops {dropout * 1e3:.2f} ms, not run in the measurement)"
        print(line)
    print("trace kernels per class: " + ", ".join(f"{c} {kernels.get(c, 0)}" for c in CLASSES)
          + f"; busy {sum(measured.values()) * 1e3:.2f} ms of a {MEASURED_STEP_S * 1e3:.1f} ms timed step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
