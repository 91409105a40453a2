"""Speed of trace ingestion: load + classify a synthetic ~100 MB Kineto trace, and a rank set.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_traces.py [--mb 100] [--ranks 4] [--processes 4]

The synthetic trace looks like a Megatron-LM step as PyTorch 2.x writes it: float ``ts`` with
nanosecond digits, ProfilerStep annotations, ``cpu_op`` nests on a main and an autograd thread,
``cudaLaunchKernel`` runtime events, ``ac2g`` flow pairs, compute kernels with long templated
names, NCCL kernels launched inside ``record_param_comms`` with Megatron group descriptions,
memcpy/memset, and the optimizer step.  Each figure is measured in a fresh child process (peak
RSS = that process's ``ru_maxrss``; CPU = its process time, less sensitive than the wall clock to
other jobs on the machine), and the load + classify runs are summarised by min/median/max.  It
prints figures; it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

KERNELS = [
    "void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn_align8>(cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn_align8::Params)",
    "ampere_bf16_s16816gemm_bf16_256x128_ldg8_f2f_stages_64x3_tn",
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, at::detail::Array<char*, 3>)",
    "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, at::native::(anonymous namespace)::SoftMaxForwardEpilogue>(float*, float const*, int)",
    "flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t>, false, true, false>",
]
COMMS = [("allreduce", "TENSOR_MODEL_PARALLEL_GROUP", "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"),
         ("reduce_scatter", "DATA_PARALLEL_GROUP", "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"),
         ("send", "PIPELINE_MODEL_PARALLEL_GROUP", "ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)")]


def synthesise(path: Path, target_mb: float, rank: int = 0, world: int = 8, seed: int = 0) -> int:
    """Write a trace of about ``target_mb`` MB; returns the number of events."""
    rnd = random.Random(seed + rank)
    dumps = json.dumps
    out = open(path, "w", encoding="utf-8")
    out.write('{"schemaVersion": 1, "distributedInfo": ' + dumps({"backend": "nccl", "rank": rank, "world_size": world}) +
              ', "baseTimeNanoseconds": 1700000000000000000, "traceEvents": [\n')
    out.write('{"ph": "M", "name": "thread_name", "pid": 1234, "tid": 77, "args": {"name": "thread 77 (pt_autograd_0)"}},\n')
    out.write('{"ph": "M", "name": "process_labels", "pid": 0, "tid": 0, "args": {"labels": "GPU 0"}}')
    written, events, corr, t, step = 0, 2, 1, 1000.0, 0
    target = target_mb * 1e6
    gpu_t = t
    while written < target:
        step_start = t
        parts = []
        for mb in range(8):  # micro-batches: forward then backward
            for phase, tid in (("fwd", 1234), ("bwd", 77)):
                for layer in range(40):
                    name = "aten::mm" if phase == "fwd" else "autograd::engine::evaluate_function: MmBackward0"
                    parts.append(dumps({"ph": "X", "cat": "cpu_op", "name": name, "pid": 1234, "tid": tid, "ts": round(t, 3),
                                        "dur": 9.123, "args": {"External id": corr, "Record function id": 0, "Sequence number": corr,
                                                               "Fwd thread id": 0}}))
                    parts.append(dumps({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1234, "tid": tid,
                                        "ts": round(t + 1.1, 3), "dur": 4.2, "args": {"External id": corr, "cbid": 211, "correlation": corr}}))
                    dur = rnd.uniform(5, 80)
                    gpu_t = max(gpu_t, t + 6) + rnd.uniform(0, 3)
                    parts.append(dumps({"ph": "X", "cat": "kernel", "name": rnd.choice(KERNELS), "pid": 0, "tid": 7,
                                        "ts": round(gpu_t, 3), "dur": round(dur, 3),
                                        "args": {"External id": corr, "queued": 0, "device": 0, "context": 1, "stream": 7,
                                                 "correlation": corr, "registers per thread": 128, "shared memory": 49152,
                                                 "blocks per SM": 1.2, "warps per SM": 4.8, "grid": [132, 1, 1], "block": [128, 1, 1],
                                                 "est. achieved occupancy %": 12}}))
                    parts.append(dumps({"ph": "s", "id": corr, "pid": 1234, "tid": tid, "ts": round(t + 1.1, 3), "cat": "ac2g", "name": "ac2g"}))
                    parts.append(dumps({"ph": "f", "id": corr, "pid": 0, "tid": 7, "ts": round(gpu_t, 3), "cat": "ac2g", "name": "ac2g", "bp": "e"}))
                    gpu_t += dur
                    corr += 1
                    t += 10.0
                    if layer % 4 == 0:  # a collective
                        coll, desc, kname = COMMS[(layer // 4) % 3]
                        parts.append(dumps({"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1234, "tid": tid,
                                            "ts": round(t, 3), "dur": 8.0, "args": {"External id": corr, "Collective name": coll,
                                            "Process Group Name": "3", "Process Group Description": desc, "Process Group Ranks": "[0, 1]",
                                            "Group size": 2, "In msg nelems": 4194304, "Out msg nelems": 4194304, "dtype": "BFloat16"}}))
                        parts.append(dumps({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernelExC", "pid": 1234, "tid": tid,
                                            "ts": round(t + 1, 3), "dur": 5.0, "args": {"External id": corr, "cbid": 430, "correlation": corr}}))
                        parts.append(dumps({"ph": "X", "cat": "kernel", "name": kname, "pid": 0, "tid": 20, "ts": round(gpu_t - 20, 3),
                                            "dur": round(rnd.uniform(10, 60), 3), "args": {"External id": corr, "device": 0, "stream": 20,
                                                                                           "correlation": corr}}))
                        corr += 1
                        t += 10.0
        parts.append(dumps({"ph": "X", "cat": "user_annotation", "name": "Optimizer.step#FusedAdam.step", "pid": 1234, "tid": 1234,
                            "ts": round(t, 3), "dur": 50.0, "args": {"External id": corr}}))
        parts.append(dumps({"ph": "X", "cat": "gpu_memset", "name": "Memset (Device)", "pid": 0, "tid": 7, "ts": round(gpu_t, 3),
                            "dur": 1.5, "args": {"device": 0, "stream": 7, "correlation": corr, "bytes": 4096}}))
        t += 60
        parts.append(dumps({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": 1234, "tid": 1234,
                            "ts": round(step_start - 1, 3), "dur": round(t - step_start + 2, 3), "args": {"External id": corr}}))
        text = ",\n" + ",\n".join(parts)
        out.write(text)
        written += len(text)
        events += len(parts)
        step += 1
        t = max(t, gpu_t) + 100
        gpu_t = t
    out.write("\n]}\n")
    out.close()
    return events


CHILD = """
import resource, sys, time
from dml2comm.traces.load import load_trace
from dml2comm.traces.classify import classify
from dml2comm.traces.metrics import step_metrics
w0, c0 = time.perf_counter(), time.process_time()
tr = load_trace(sys.argv[1]); w1, c1 = time.perf_counter(), time.process_time()
act = classify(tr); w2, c2 = time.perf_counter(), time.process_time()
steps = step_metrics(act); w3 = time.perf_counter()
print(f"{w1 - w0:.3f} {w2 - w1:.3f} {w3 - w2:.3f} {c2 - c0:.3f} {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} "
      f"{tr.num_events} {act.start.size} {len(steps)}")
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=100.0, help="size of the synthetic trace in MB (default 100)")
    ap.add_argument("--ranks", type=int, default=4, help="ranks for the set run (default 4)")
    ap.add_argument("--processes", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=5, help="fresh-process runs of load + classify (default 5)")
    ap.add_argument("--no-set", action="store_true", help="skip the rank-set run through the command")
    args = ap.parse_args()
    env = dict(os.environ, PYTHONPATH=str(REPO))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "rank-0.json"
        t = time.perf_counter()
        n = synthesise(path, args.mb)
        print(f"synthesised {path.stat().st_size / 1e6:.1f} MB, {n:,} events in {time.perf_counter() - t:.1f} s")
        if hasattr(os, "getloadavg"):
            print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
        totals, cpus = [], []
        for i in range(args.repeat):
            res = subprocess.run([sys.executable, "-c", CHILD, str(path)], capture_output=True, text=True, env=env, check=True)
            load_s, cls_s, met_s, cpu_s, rss, ev, act, steps = res.stdout.split()
            totals.append(float(load_s) + float(cls_s))
            cpus.append(float(cpu_s))
            print(f"run {i + 1}: load {load_s} s + classify {cls_s} s = {totals[-1]:.2f} s wall ({cpu_s} s CPU; "
                  f"+ step metrics {met_s} s); peak RSS {rss} MiB; {int(ev):,} events kept, {int(act):,} GPU events, {steps} steps")
        print(f"load + classify, {args.repeat} runs: wall min {min(totals):.2f} s, median {statistics.median(totals):.2f} s, "
              f"max {max(totals):.2f} s; CPU median {statistics.median(cpus):.2f} s")
        if args.no_set:
            return
        # a rank set through the command, serial and in processes
        folder = Path(tmp) / "torch_profile"
        folder.mkdir()
        per_rank = args.mb / args.ranks
        for r in range(args.ranks):
            synthesise(folder / f"rank-{r}.json", per_rank, rank=r, world=args.ranks)
        for procs in (1, args.processes):
            t = time.perf_counter()
            subprocess.run([sys.executable, str(REPO / "main.py"), "trace", str(folder), "--processes", str(procs), "--no-site",
                            "--out", str(Path(tmp) / f"out{procs}")], env=env, check=True, capture_output=True)
            print(f"trace command, {args.ranks} ranks x {per_rank:.0f} MB, --processes {procs}: {time.perf_counter() - t:.2f} s "
                  f"(includes interpreter start, Parquet and JSON)")


if __name__ == "__main__":
    main()
