"""The profiler's slowdown of the CPU side, per measured step: the issue time the tool reads from
a step's trace (:func:`dml2comm.traces.host.host_figures`' ``issue_s``) over the time the same
step took to issue without the profiler (``host_issue_s_median`` of the measuring script's JSON).
Writes ``benchmarks/data/gpu_steps/profiler_slowdown.csv`` (one row per trace) and prints the
median that :data:`dml2comm.traces.host.PROFILER_CPU_SLOWDOWN` holds.

    PYTHONPATH=. python benchmarks/profiler_slowdown.py TRACES_DIR...

Each TRACES_DIR holds one measuring run: its ``gpu_measured_set<N>.json`` and the traces from
its ``traces_set<N>.tar``, unpacked (``benchmarks/data/gpu_steps/PROVENANCE.md``).  Only GPT-2 small's
steps enter the median: under a thousand kernels, their launch queue never fills, so the
unprofiled time is all issue work (Llama-1B's 2,000 kernels fill it and the CPU waits).
"""

from __future__ import annotations

import csv
import hashlib
import json
import statistics
import sys
from pathlib import Path

from dml2comm.traces.host import host_figures
from dml2comm.traces.load import load_trace

OUT = Path(__file__).resolve().parent / "data" / "gpu_steps" / "profiler_slowdown.csv"
FIELDS = ["run", "gpu", "trace", "sha256", "name", "mode", "micro_batch", "seq", "kernels", "full_queue_launches", "trace_issue_s",
          "host_issue_s_median", "slowdown"]


def rows_of(folder: Path) -> list[dict]:
    data = json.loads(next(folder.glob("gpu_measured_set*.json")).read_text())
    runs = {(r["name"], r["mode"], r["micro_batch"], r["seq"]): r for r in data["runs"]}
    out = []
    for t in data["traces"]:
        r = runs[(t["run"], t["mode"], t["micro_batch"], t["seq"])]
        path = folder / t["file"]
        fig = host_figures(load_trace(str(path)))
        out.append({"run": folder.name, "gpu": data["env"]["gpu"], "trace": t["file"], "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
                    "name": r["name"], "mode": r["mode"], "micro_batch": r["micro_batch"], "seq": r["seq"], "kernels": fig.kernels,
                    "full_queue_launches": fig.full_queue_launches,
                    "trace_issue_s": f"{fig.issue_s:.6e}", "host_issue_s_median": f"{r['host_issue_s_median']:.6e}",
                    "slowdown": f"{fig.issue_s / r['host_issue_s_median']:.4f}"})
    return out


def main() -> None:
    rows = [row for arg in sys.argv[1:] for row in rows_of(Path(arg))]
    with OUT.open("w", newline="") as f:
        w = csv.DictWriter(f, FIELDS)
        w.writeheader()
        w.writerows(rows)
    gpt2 = sorted(float(r["slowdown"]) for r in rows if r["name"] == "gpt2-small")
    print(f"{len(rows)} traces -> {OUT}; GPT-2 small: median {statistics.median(gpt2):.3f} over {len(gpt2)} "
          f"(10th-90th percentile {gpt2[len(gpt2) // 10]:.2f}-{gpt2[9 * len(gpt2) // 10]:.2f})")
    free = [r for r in rows if not int(r["full_queue_launches"])]
    per_model = {m: statistics.median(float(r["slowdown"]) for r in free if r["name"] == m) for m in sorted({r["name"] for r in free})}
    print(f"every step whose launch queue never filled: median {statistics.median(float(r['slowdown']) for r in free):.3f} over "
          f"{len(free)} of {len(rows)}, {len(per_model)} models (" + ", ".join(f"{m} {v:.3f}" for m, v in per_model.items()) + ")")


if __name__ == "__main__":
    main()
