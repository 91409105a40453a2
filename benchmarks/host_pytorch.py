"""Host-side figures of eager PyTorch 2.x on an H100, read from two profiled training steps.

Prints, per trace (``benchmarks/data/h100/trace_*.json.gz``: one Hugging Face training step each,
PyTorch 2.11 + CUDA 13.0 on one H100 SXM, ``torch.profiler`` with CPU and CUDA activities and
``record_shapes=True``; measured by ``measure_gpu.py``, see ``dml2comm/validate/data`` provenance):

- GPU kernels (plus memsets and copies), their busy time (the union of their intervals) and the
  step's GPU span;
- the CPU span of the step's operators (``cpu_op`` events) and that span per GPU kernel (an
  upper bound: the span includes the CPU's waits when the launch queue is full);
- the CPU's issue time per GPU kernel and the GPU's idle time per kernel while its queue was full,
  and whether the step is host-bound: :func:`dml2comm.traces.host.host_figures` (the same
  figures ``--profile`` fits its host model from).

These are the numbers behind :data:`dml2comm.cost.host.PYTORCH`::

    .venv/bin/python benchmarks/host_pytorch.py
"""

from __future__ import annotations

import sys
from pathlib import Path

from dml2comm.traces.host import host_figures
from dml2comm.traces.load import load_trace

HERE = Path(__file__).with_name("data") / "h100"


def main() -> int:
    issue = []
    for path in sorted(HERE.glob("trace_*.json.gz")):
        f = host_figures(load_trace(path))
        issue.append(f.kernel_s)
        print(f"{path.name}: {f.kernels} kernels ({f.gpu_items} GPU items), GPU busy {f.gpu_busy_s * 1e3:.1f} ms "
              f"of a {f.gpu_span_s * 1e3:.1f} ms span; CPU span {f.cpu_span_s * 1e3:.1f} ms = "
              f"{f.cpu_span_s / f.kernels * 1e6:.1f} us per kernel, issue time {f.kernel_s * 1e6:.1f} us per kernel; "
              f"GPU idle {f.gap_s * 1e6:.2f} us per queued kernel ({f.queued_gaps} gaps), starved {f.starved_idle_s * 1e3:.2f} ms: "
              f"{'host' if f.host_bound else 'GPU'}-bound")
    print(f"issue time per kernel, mean of the traces: {sum(issue) / len(issue) * 1e6:.1f} us (dml2comm.cost.host.PYTORCH.kernel_s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
