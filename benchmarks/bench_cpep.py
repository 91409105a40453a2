"""Speed of context and expert parallelism: prints seconds (no assertion on time).

Target (issue 9): the zoo Mixtral-8x7B shape (32 layers, 8 experts, top-2) at d=8 t=2 p=4 e=8
analyses in under 5 s through the real command line (import + analysis + data.json, no site);
the same with --cp 2 (Ulysses and ring) for comparison.

    .venv/bin/python benchmarks/bench_cpep.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        model = out / "mixtral.onnx"
        subprocess.run([sys.executable, "main.py", "zoo", "preset", "mixtral-8x7b", "-o", str(model)], cwd=ROOT, check=True, capture_output=True)
        common = ["--micro-batch-size", "1", "--global-batch-size", "256", "--no-site", "--json"]
        cases = [
            ("Mixtral-8x7B d=8 t=2 p=4 e=8 (64 GPUs)", ["--d", "8", "--t", "2", "--p", "4", "--ep", "8"], 5.0),
            ("Mixtral-8x7B d=8 t=2 p=4 e=8, no advice", ["--d", "8", "--t", "2", "--p", "4", "--ep", "8", "--no-advice"], None),
            ("Mixtral-8x7B d=4 t=2 p=4 c=2 ulysses e=8 (64 GPUs)", ["--d", "4", "--t", "2", "--p", "4", "--cp", "2", "--ep", "8"], None),
            ("Mixtral-8x7B d=4 t=2 p=4 c=2 ring e=8 (64 GPUs)", ["--d", "4", "--t", "2", "--p", "4", "--cp", "2", "--cp-scheme", "ring",
                                                                  "--ep", "8"], None),
        ]
        for label, extra, target in cases:
            times = []
            for _ in range(args.repeat):
                start = time.perf_counter()
                proc = subprocess.run([sys.executable, "main.py", str(model), *extra, *common, "--out", str(out / "o")], cwd=ROOT,
                                      capture_output=True, text=True)
                times.append(time.perf_counter() - start)
                if proc.returncode != 0:
                    raise SystemExit(f"failed: {label}\n{proc.stderr}")
            t = statistics.median(times)
            note = f" (target < {target:.0f} s: {'ok' if t < target else 'MISSED'})" if target else ""
            print(f"{label}: {t:.2f} s wall, median of {args.repeat}{note}")


if __name__ == "__main__":
    main()
