"""Fit eager PyTorch's training-mode BatchNorm kernels (NCHW, CUDA) on the bundled H100 ResNet-18
trace, and check the law on the two ResNet-18 steps it was not fitted on.

    PYTHONPATH=. python benchmarks/fit_h100_batchnorm.py [TRACE ...]

It fits on ``benchmarks/data/gpu_steps/h100_trace_resnet18_bf16_b256_s224.json.gz`` and checks the
held-out ``..._bf16_b128_s224`` and ``..._amp_b256_s224`` traces of the same folder
(PROVENANCE.md there), then any TRACE given.  Each BatchNorm kernel is joined to the ``aten::native_batch_norm`` /
``aten::native_batch_norm_backward`` call that launched it (correlation id -> launch -> the CPU
op around it on the same thread), whose recorded input shape is ``[N, C, H, W]``.  The law is
:mod:`dml2comm.cost.norm`'s ``batch_norm_times_s``: per-channel blocks for the statistics and the
backward (``N H W / rate`` per wave of resident blocks), a bandwidth term for the
normalisation.  The rates are fitted as the time-weighted ratio of the summed measured time to the
summed work (sum of measured seconds over sum of per-wave elements), the transform's share as
summed bytes over summed seconds over the HBM bandwidth.
"""

from __future__ import annotations

import bisect
import gzip
import json
import sys
from collections import defaultdict
from pathlib import Path

from dml2comm.cost.norm import H100_BATCH_NORM_LAW, batch_norm_times_s, batch_norm_waves
from dml2comm.hardware.gpus import get_gpu

DATA = Path(__file__).resolve().parent / "data" / "gpu_steps"
FIT = DATA / "h100_trace_resnet18_bf16_b256_s224.json.gz"
KINDS = {"batch_norm_collect_statistics_kernel": "stats", "batch_norm_transform_input_kernel": "transform",
         "batch_norm_backward_kernel": "backward"}


def kernels(path: Path) -> list[tuple[str, tuple[int, ...], float, int]]:
    """(kind, [N, C, H, W], seconds, itemsize) of every BatchNorm kernel of a trace."""
    events = json.load(gzip.open(path))["traceEvents"]
    launches = {e["args"]["correlation"]: e for e in events if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}
    ops = defaultdict(list)
    for e in events:
        if e.get("cat") == "cpu_op" and e["name"] in ("aten::native_batch_norm", "aten::native_batch_norm_backward"):
            ops[e["tid"]].append(e)
    starts = {tid: [e["ts"] for e in sorted(v, key=lambda x: x["ts"])] for tid, v in ops.items()}
    ops = {tid: sorted(v, key=lambda x: x["ts"]) for tid, v in ops.items()}
    out = []
    for e in events:
        if e.get("cat") != "kernel":
            continue
        kind = next((k for name, k in KINDS.items() if name in e["name"]), None)
        launch = launches.get(e.get("args", {}).get("correlation"))
        if kind is None or launch is None or launch["tid"] not in ops:
            continue
        i = bisect.bisect_right(starts[launch["tid"]], launch["ts"]) - 1
        op = ops[launch["tid"]][i]
        dims = tuple(op["args"]["Input Dims"][0])
        itemsize = 2 if "BFloat16" in e["name"] or "Half" in e["name"] else 4
        out.append((kind, dims, e["dur"] * 1e-6, itemsize))
    return out


def fit(rows, gpu) -> dict[str, float]:
    """The law's three numbers from ``rows`` (module docstring)."""
    work = defaultdict(float)
    secs = defaultdict(float)
    for kind, (n, c, h, w), s, item in rows:
        secs[kind] += s
        if kind == "transform":
            work[kind] += 2 * n * c * h * w * item / gpu.kernel_hbm_bytes_per_s
        else:
            work[kind] += n * h * w * batch_norm_waves(c, gpu.sm_count)
    return {"stats_elements_per_s": work["stats"] / secs["stats"], "backward_elements_per_s": work["backward"] / secs["backward"],
            "transform_hbm_share": work["transform"] / secs["transform"]}


def check(path: Path, gpu) -> None:
    """A step's BatchNorm forward (statistics + transform) and backward, law against trace."""
    measured = {"forward": 0.0, "backward": 0.0}
    predicted = {"forward": 0.0, "backward": 0.0}
    for kind, dims, s, item in kernels(path):
        parts = batch_norm_times_s(*dims[:2], dims[2] * dims[3], item, gpu.kernel_hbm_bytes_per_s, gpu.sm_count, parts=True)
        side = "backward" if kind == "backward" else "forward"
        measured[side] += s
        predicted[side] += parts[kind]
    print(f"  {path.name}: " + "; ".join(f"{side} {predicted[side] * 1e3:.2f} ms predicted, {measured[side] * 1e3:.2f} measured "
                                         f"({predicted[side] / measured[side] - 1:+.1%})" for side in measured))


def main() -> None:
    gpu = get_gpu("h100")
    rows = kernels(FIT)
    print(f"{len(rows)} BatchNorm kernels in {FIT.name}")
    print(f"fitted: {fit(rows, gpu)}")
    print(f"shipped: {H100_BATCH_NORM_LAW}")
    print("per kernel (shipped law):")
    for kind, dims, s, item in rows:
        f = batch_norm_times_s(*dims[:2], dims[2] * dims[3], item, gpu.kernel_hbm_bytes_per_s, gpu.sm_count, parts=True)
        print(f"  {kind:9s} {str(dims):20s} measured {s * 1e6:8.1f} us  law {f[kind] * 1e6:8.1f} us  {f[kind] / s - 1:+6.1%}")
    print("whole steps (the fitted one, then the held-out ones):")
    held_out = [DATA / "h100_trace_resnet18_bf16_b128_s224.json.gz", DATA / "h100_trace_resnet18_amp_b256_s224.json.gz"]
    for path in [FIT, *held_out] + [Path(p) for p in sys.argv[1:]]:
        check(path, gpu)


if __name__ == "__main__":
    main()
