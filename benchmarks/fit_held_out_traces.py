"""The figures the cost model took from the held-out H200 traces (``benchmarks/data/gpu_steps/
held_out/``, PROVENANCE.md there), recomputed from the four traces bundled there:

- Hugging Face's grouped-GEMM expert routing (:data:`dml2comm.cost.ops.EXPERT_FILL_SHARE` and
  the constants beside it), from the Mixtral-style step at b = 4 and b = 2 (s = 2,048): the
  masked fills' rate over the routed rows, the sorts', gathers' and scatter-adds' time a layer as
  a fixed part plus bytes per routed element of the hidden size (the two batch sizes give the two
  numbers), and the launches beyond the ones the export's ops make;
- the 1x1 stride-1 convolutions that launch no cuDNN layout conversion
  (:func:`dml2comm.cost.ops._pointwise_conv`), from the ResNet-50 step at b = 128;
- the casts of Hugging Face's fp32 RMSNorm (:func:`dml2comm.cost.ops.eager_rms_norm_upcasts`),
  from the Llama-3B-like step at b = 4: ``aten::to`` per call and per block.

    PYTHONPATH=. python benchmarks/fit_held_out_traces.py

Each GPU kernel is joined to the innermost CPU operator around its launch (correlation id ->
runtime or driver launch -> the shortest ``cpu_op`` on the same thread that spans it); shapes are
the operator's recorded ``Input Dims``.
"""

from __future__ import annotations

import bisect
import gzip
import json
from collections import defaultdict
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data" / "gpu_steps" / "held_out"
MOE = {4: DATA / "h200_trace_mixtral-8x0.1b_bf16_b4_s2048.json.gz", 2: DATA / "h200_trace_mixtral-8x0.1b_bf16_b2_s2048.json.gz"}
MOE_MODEL = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "step_mixtral_8x0_1b_dynamo.onnx"
MOE_LAYERS, MOE_HIDDEN, MOE_TOP_K, MOE_SEQ = 8, 1024, 2, 2048
RESNET50 = DATA / "h200_trace_resnet50_bf16_b128_s224.json.gz"
LLAMA3B = DATA / "h200_trace_llama-3b-8l_bf16_b4_s2048.json.gz"
#: The operators of the routing around the grouped products (the masked fills aside).
ROUTING_OPS = ("aten::index", "aten::_index_put_impl_", "aten::sort", "aten::histc", "aten::cumsum", "aten::scatter_")
LAYOUT_KERNELS = ("nchwToNhwc", "nhwcToNchw")


def kernels_by_op(path: Path) -> list[tuple[dict, dict]]:
    """(innermost CPU operator, kernel) of every kernel of a trace (module docstring)."""
    events = json.load(gzip.open(path))["traceEvents"]
    kernel = {e["args"].get("correlation"): e for e in events if e.get("cat") == "kernel"}
    ops: dict[int, list[dict]] = defaultdict(list)
    for e in events:
        if e.get("cat") == "cpu_op":
            ops[e["tid"]].append(e)
    starts = {}
    for tid, rows in ops.items():
        rows.sort(key=lambda o: o["ts"])
        starts[tid] = [o["ts"] for o in rows]
    out = []
    for launch in events:
        if launch.get("cat") not in ("cuda_runtime", "cuda_driver") or "aunch" not in launch["name"]:
            continue
        k = kernel.get(launch["args"].get("correlation"))
        rows = ops.get(launch["tid"], [])
        if k is None or not rows:
            continue
        i = bisect.bisect_right(starts[launch["tid"]], launch["ts"])
        spans = [o for o in rows[max(0, i - 64):i] if o["ts"] <= launch["ts"] <= o["ts"] + o["dur"]]
        if spans:
            out.append((min(spans, key=lambda o: o["dur"]), k))
    return out


def expert_routing() -> dict[str, float]:
    """The routing figures (module docstring): ``fill_share`` of the H200's kernel bandwidth,
    ``layer_s`` and ``bytes_per_element`` of the routing a layer, ``launches_per_layer`` beyond the
    export's own ops' (b = 4: the trace's kernels less the modelled launches, plus the routing
    launches the model already charges)."""
    from dml2comm.cost.ops import EXPERT_ROUTING_KERNELS
    from dml2comm.hardware.gpus import get_gpu

    bandwidth = get_gpu("h200").kernel_hbm_bytes_per_s
    fill_bytes = fill_s = 0.0
    per_layer = {}
    for b, path in MOE.items():
        routing = 0.0
        for op, k in kernels_by_op(path):
            dims = op["args"].get("Input Dims") or [[]]
            if op["name"] == "aten::masked_fill_" and len(dims[0]) == 2:
                fill_bytes += 2 * dims[0][0] * dims[0][1] * 2  # read and write, bf16
                fill_s += k["dur"] * 1e-6
            elif op["name"] in ROUTING_OPS:
                routing += k["dur"] * 1e-6
        per_layer[b * MOE_SEQ * MOE_TOP_K * MOE_HIDDEN] = routing / MOE_LAYERS
    (small, t_small), (large, t_large) = sorted(per_layer.items())
    slope = (t_large - t_small) / (large - small)
    return {"fill_share": fill_bytes / fill_s / bandwidth, "layer_s": t_small - slope * small,
            "bytes_per_element": slope * bandwidth,
            "launches_per_layer": _extra_launches() / MOE_LAYERS + sum(EXPERT_ROUTING_KERNELS)}


def _extra_launches() -> float:
    """The b = 4 trace's kernels beyond the launches the tool models for the same step."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import bench_gpu_steps as bench
    from dml2comm.traces.predict import measured_and_modelled

    parts = measured_and_modelled(str(MOE[4]), str(MOE_MODEL), bench.config(4, MOE_SEQ, "bf16"))
    return parts["host"].kernels - parts["launches"]


def pointwise_conversions() -> dict[str, tuple[int, int]]:
    """Per kind of ResNet-50 convolution (``1x1 s1``, ``1x1 s2``, ``3x3``, ``7x7``), forward:
    (convolutions, those that launched a layout conversion)."""
    seen: dict[str, list[bool]] = defaultdict(list)
    converted: dict[int, bool] = {}
    calls = {}
    for op, k in kernels_by_op(RESNET50):
        if op["name"] == "aten::cudnn_convolution":
            calls[id(op)] = op
            converted[id(op)] = converted.get(id(op), False) or any(n in k["name"] for n in LAYOUT_KERNELS)
    events = json.load(gzip.open(RESNET50))["traceEvents"]
    for op in (e for e in events if e.get("cat") == "cpu_op" and e["name"] == "aten::cudnn_convolution"):
        w, stride = op["args"]["Input Dims"][1], op["args"]["Concrete Inputs"][3]
        kind = f"{w[2]}x{w[3]}" + (f" s{stride.strip('[]').split(',')[0]}" if w[2] == 1 else "")
        match = next((c for c in calls.values() if c["ts"] == op["ts"] and c["tid"] == op["tid"]), None)
        seen[kind].append(bool(match is not None and converted[id(match)]))
    return {kind: (len(v), sum(v)) for kind, v in sorted(seen.items())}


def rms_norm_casts() -> tuple[int, float]:
    """The Llama-3B-like step's forward ``aten::to`` kernels: (calls, mean seconds)."""
    rows = [k["dur"] * 1e-6 for op, k in kernels_by_op(LLAMA3B) if op["name"] in ("aten::to", "aten::_to_copy", "aten::copy_")
            and len(op["args"].get("Input Dims", [[]])[0]) == 3 and op["args"]["Input Dims"][0][-1] == 3072]
    return len(rows), sum(rows) / len(rows)


def main() -> None:
    from dml2comm.cost import ops

    fit = expert_routing()
    print("Hugging Face expert routing (the Mixtral-style step, b = 4 and 2):")
    print(f"  masked fills: {fit['fill_share']:.3f} of the kernel bandwidth (shipped EXPERT_FILL_SHARE {ops.EXPERT_FILL_SHARE})")
    print(f"  sorts, gathers, scatters: {fit['layer_s'] * 1e6:.0f} us a layer (shipped {ops.EXPERT_ROUTING_LAYER_S * 1e6:.0f}) + "
          f"{fit['bytes_per_element']:.1f} B per routed element (shipped {ops.EXPERT_ROUTING_BYTES})")
    print(f"  launches beyond the export's ops: {fit['launches_per_layer']:.1f} a layer (charged: {sum(ops.EXPERT_ROUTING_KERNELS)}, "
          "fitted on the step times: ops.EXPERT_ROUTING_KERNELS)")
    print("ResNet-50 convolutions, forward (convolutions, those launching a layout conversion):")
    for kind, (n, conv) in pointwise_conversions().items():
        print(f"  {kind:7s} {n:3d} {conv:3d}")
    calls, mean_s = rms_norm_casts()
    print(f"Llama-3B-like RMSNorm casts on its [4, 2048, 3072] stream: {calls} kernels, {mean_s * 1e6:.1f} us each")


if __name__ == "__main__":
    main()
