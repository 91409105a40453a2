"""Steps timed after a profiled step in the same process issue their kernels more slowly: the
CPU's time per kernel of GPT-2 small's first step of each measuring process (timed before any
``torch.profiler`` session ran in it) against the same model's later steps (each timed after
the profiled step of the shape before it), from the bundled measurements alone.

    PYTHONPATH=. python benchmarks/profiler_linger.py

Why it matters: Kineto does not tear CUPTI down when a profiling session ends unless
``TEARDOWN_CUPTI=1`` is set (pytorch/pytorch#144455, "the torch profiler continues to affect
program performance even after profiling has completed"; pytorch/kineto#1539, open in 2026,
proposes it as the default), and the measuring script (``data/gpu_steps/measure_gpu.py``) times
each shape and then profiles it, so every timed step but the first of a process ran with the
profiler's callbacks still attached.  That slows the CPU side only: GPU-bound steps do not move,
host-bound ones do.

What is compared: ``host_issue_s_median`` (step start to ``step()`` returning, no profiler,
median of 10 steps) over the step's GPU kernels (``profiler_slowdown.csv``: the kernels of its
trace), for GPT-2 small in bf16, whose shapes launch the same ~700 kernels and never fill the
launch queue (the CPU's time is all issue work).  A ratio above 1: the later steps' CPU was
slower.  The shapes differ (b = 8 first, then b = 2-32), which the CPU's dispatch does not see;
the machine's own drift over the minutes between runs is not separated from the profiler's
lingering callbacks: ``measure_gpu.py``'s ``LINGER=1`` mode (a timed pass of every shape before
any profiling, then the traced pass) measures the two apart on the next lent GPU.
"""

from __future__ import annotations

import csv
import json
import statistics
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data" / "gpu_steps"


def kernels_of() -> dict[tuple[str, str, str, int, int], int]:
    """(run folder, model, mode, b, s) -> the GPU kernels of its trace."""
    with (DATA / "profiler_slowdown.csv").open() as f:
        return {(r["run"], r["name"], r["mode"], int(r["micro_batch"]), int(r["seq"])): int(r["kernels"]) for r in csv.DictReader(f)}


def per_process() -> list[tuple[str, float, list[float]]]:
    """(file, the first step's CPU time per kernel, the later GPT-2 small bf16 steps') per
    measuring process whose first step is GPT-2 small in bf16."""
    kernels = kernels_of()
    out = []
    for path in sorted(DATA.glob("h*_?.json")):
        gpu, run = path.stem.split("_")
        folder = f"{gpu}{run}" if run in "ab" else {"e": "h100ep1", "f": "h100ep2"}.get(run)
        runs = json.loads(path.read_text())["runs"]
        if folder is None or not runs or (runs[0]["name"], runs[0]["mode"]) != ("gpt2-small", "bf16"):
            continue

        def per_kernel(r: dict) -> float | None:
            k = kernels.get((folder, r["name"], r["mode"], r["micro_batch"], r["seq"]))
            return r["host_issue_s_median"] / k if k else None

        first = per_kernel(runs[0])
        later = [x for r in runs[1:] if (r["name"], r["mode"]) == ("gpt2-small", "bf16") and (x := per_kernel(r)) is not None]
        if first is not None and later:
            out.append((path.name, first, later))
    return out


def main() -> None:
    rows = per_process()
    ratios = []
    print("GPT-2 small, bf16: the CPU's time per kernel without the profiler (us), the process's first step against its later steps")
    for name, first, later in rows:
        ratio = statistics.median(later) / first
        ratios.append(ratio)
        print(f"  {name:12s} first {first * 1e6:5.1f}  later {', '.join(f'{x * 1e6:.1f}' for x in later):40s} median later / first {ratio:.3f}")
    print(f"median over {len(ratios)} processes: {statistics.median(ratios):.3f} (range {min(ratios):.3f}-{max(ratios):.3f}); "
          f"later steps slower in {sum(r > 1 for r in ratios)} of {len(ratios)}")


if __name__ == "__main__":
    main()
