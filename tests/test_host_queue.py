"""The CPU's issue time of a profiled step leaves out the launches that found CUDA's launch queue
full (``dml2comm.traces.host``): there the CPU waits for the GPU, and its intervals are the GPU's."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from dml2comm.traces.host import ISSUE_GAP_S, QUEUE_FULL_LAUNCHES, host_figures
from dml2comm.traces.load import load_trace

from tests.h100_steps import GPT2, LLAMA

DISPATCH_US, CALL_US, DEPTH = 10.0, 5.0, 1022


def _queued_step(path: Path, kernel_us: list[float]) -> Path:
    """A one-stream step as CUDA runs it: the CPU dispatches each op (10 us), then its launch call
    (5 us) returns once fewer than 1,022 GPU items are pending (it waits for a slot otherwise)."""
    events: list[dict] = [{"ph": "M", "name": "process_labels", "pid": 0, "args": {"labels": "GPU 0"}}]
    cpu, gpu_free, ends = 1000.0, 0.0, []
    for i, dur in enumerate(kernel_us):
        cpu += DISPATCH_US
        call_end = cpu + CALL_US
        if len(ends) >= DEPTH:  # the slot frees when the item DEPTH back ends
            call_end = max(call_end, ends[-DEPTH] + 1.0)
        events.append({"ph": "X", "cat": "cpu_op", "name": "aten::mul", "pid": 1, "tid": 1, "ts": cpu - DISPATCH_US,
                       "dur": call_end - cpu + DISPATCH_US, "args": {"External id": i + 1}})
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": cpu,
                       "dur": call_end - cpu, "args": {"correlation": i + 1, "External id": i + 1}})
        start = max(gpu_free, cpu + 2.0)
        gpu_free = start + dur
        ends.append(gpu_free)
        events.append({"ph": "X", "cat": "kernel", "name": "void at::native::vectorized_elementwise_kernel<4>", "pid": 0,
                       "tid": 7, "ts": start, "dur": dur, "args": {"correlation": i + 1, "stream": 7, "device": 0}})
        cpu = call_end
    doc = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}], "traceEvents": events}
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return path


def test_a_full_queue_is_not_counted_as_issue_work(tmp_path):
    # 3,000 kernels of 100 us behind a CPU that issues one every 15 us: the queue fills after
    # about 1,200 launches, and from there every launch waits ~85 us for a slot, under the
    # 200 us that marks a wait: counted, the issue time per kernel would be about 70 us
    assert 100e-6 < ISSUE_GAP_S  # a full queue's intervals (one kernel each) pass the wait threshold
    full = host_figures(load_trace(str(_queued_step(tmp_path / "full.json.gz", [100.0] * 3000))))
    assert full.full_queue_launches > 1500
    assert full.kernel_s == pytest.approx((DISPATCH_US + CALL_US) * 1e-6, rel=0.01)
    assert full.pass_launches is None  # one thread launched everything: no backward thread to tell the passes apart
    # the same CPU in front of short kernels: the queue never fills, nothing is left out
    short = host_figures(load_trace(str(_queued_step(tmp_path / "short.json.gz", [3.0] * 3000))))
    assert short.full_queue_launches == 0
    assert short.kernel_s == pytest.approx((DISPATCH_US + CALL_US) * 1e-6, rel=0.01)


def test_the_bundled_llama_step_fills_its_queue_and_gpt2_does_not():
    llama = load_trace(LLAMA[1])
    fig = host_figures(llama)
    # its own count: launches at the deepest two levels of pending GPU items (1,021 and 1,022)
    assert fig.full_queue_launches == 273 and fig.full_queue_launches >= QUEUE_FULL_LAUNCHES
    assert host_figures(load_trace(GPT2[1])).full_queue_launches == 0
    assert fig.issue_s < fig.kernels * 40.64e-6  # the figure with them counted (its kernels x 40.64 us)
