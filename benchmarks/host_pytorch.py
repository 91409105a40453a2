"""Host-side figures of eager PyTorch 2.x on an H100, read from two profiled training steps.

Prints, per trace (``benchmarks/data/h100/trace_*.json.gz``: one Hugging Face training step each,
PyTorch 2.11 + CUDA 13.0 on one H100 SXM, ``torch.profiler`` with CPU and CUDA activities and
``record_shapes=True``; measured by ``measure_gpu.py``, see ``dml2comm/validate/data`` provenance):

- GPU kernels (plus memsets and copies), their busy time (the union of their intervals) and the
  step's GPU span;
- the CPU span of the step's operators (``cpu_op`` events) and that span per GPU kernel (an
  upper bound: the span includes the CPU's waits when the launch queue is full);
- the CPU's issue time per GPU kernel: the intervals between consecutive launches (kernel,
  memset, copy) below 200 us, summed, over the kernels (a longer interval is the CPU blocked on a
  full queue or the loss/optimizer boundary, not issue work);
- the idle time between consecutive GPU work items whose gap is below 20 us (the queue was
  not empty: the GPU's own launch latency between back-to-back kernels), its median and mean.

These are the numbers behind :data:`dml2comm.cost.host.PYTORCH`::

    .venv/bin/python benchmarks/host_pytorch.py
"""

from __future__ import annotations

import gzip
import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).with_name("data") / "h100"
QUEUED_GAP_S = 20e-6  # below this an idle gap is launch latency, not a starved queue
ISSUE_GAP_S = 200e-6  # below this a launch-to-launch interval is the CPU issuing, not waiting


def figures(path: Path) -> dict[str, float]:
    with gzip.open(path, "rt") as fh:
        events = [e for e in json.load(fh)["traceEvents"] if e.get("ph") == "X"]
    gpu = sorted((e for e in events if e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy")), key=lambda e: e["ts"])
    kernels = sum(1 for e in gpu if e.get("cat") == "kernel")
    busy, start, end = 0.0, None, None
    for e in gpu:
        s, f = e["ts"], e["ts"] + e["dur"]
        if end is None or s > end:
            busy += (end - start) if end is not None else 0.0
            start, end = s, f
        else:
            end = max(end, f)
    busy += end - start
    gaps = [b["ts"] - (a["ts"] + a["dur"]) for a, b in zip(gpu, gpu[1:])]
    queued = [g for g in gaps if 0 <= g < QUEUED_GAP_S * 1e6]
    launches = sorted((e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")
                       and any(k in e["name"] for k in ("Launch", "Memset", "Memcpy"))), key=lambda e: e["ts"])
    issue = sum(d for d in (b["ts"] - a["ts"] for a, b in zip(launches, launches[1:])) if d < ISSUE_GAP_S * 1e6)
    cpu = [e for e in events if e.get("cat") == "cpu_op"]
    cpu_span = max(e["ts"] + e["dur"] for e in cpu) - min(e["ts"] for e in cpu)
    return {
        "kernels": kernels, "gpu_items": len(gpu), "gpu_busy_s": busy * 1e-6,
        "gpu_span_s": (gpu[-1]["ts"] + gpu[-1]["dur"] - gpu[0]["ts"]) * 1e-6,
        "cpu_span_s": cpu_span * 1e-6, "cpu_per_kernel_s": cpu_span * 1e-6 / kernels,
        "issue_per_kernel_s": issue * 1e-6 / kernels,
        "queued_gap_median_s": statistics.median(queued) * 1e-6, "queued_gap_mean_s": statistics.mean(queued) * 1e-6,
    }


def main() -> int:
    issue = []
    for path in sorted(HERE.glob("trace_*.json.gz")):
        f = figures(path)
        issue.append(f["issue_per_kernel_s"])
        print(f"{path.name}: {f['kernels']} kernels ({f['gpu_items']} GPU items), GPU busy {f['gpu_busy_s'] * 1e3:.1f} ms "
              f"of a {f['gpu_span_s'] * 1e3:.1f} ms span; CPU span {f['cpu_span_s'] * 1e3:.1f} ms = "
              f"{f['cpu_per_kernel_s'] * 1e6:.1f} us per kernel, issue time {f['issue_per_kernel_s'] * 1e6:.1f} us per kernel; queued gap median {f['queued_gap_median_s'] * 1e6:.2f} us, "
              f"mean {f['queued_gap_mean_s'] * 1e6:.2f} us")
    print(f"issue time per kernel, mean of the traces: {sum(issue) / len(issue) * 1e6:.1f} us (dml2comm.cost.host.PYTORCH.kernel_s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
