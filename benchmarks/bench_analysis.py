"""Speed of the analysis (no site): prints wall time (including Python start) and peak RSS.

Targets (issue 2): GPT-2 small export at d=2 p=4 t=2 under 2 s; zoo Llama-70B shape at
d=16 t=8 p=8 (1,024 GPUs) under 5 s and 1 GB, and at most 1.5x the time of d=1 t=8 p=8.

    .venv/bin/python benchmarks/bench_analysis.py [--repeat 3]
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

CHILD = (
    "import resource, runpy, sys; sys.argv = ['main.py'] + sys.argv[1:]\n"
    "try:\n    runpy.run_path('main.py', run_name='__main__')\nexcept SystemExit as e:\n    code = e.code\n"
    "print('RSS_KB', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)\nsys.exit(code)\n"
)


def run(args: list[str], repeat: int) -> tuple[float, float]:
    times, rss = [], []
    for _ in range(repeat):
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", CHILD, *args], cwd=ROOT, capture_output=True, text=True)
        times.append(time.perf_counter() - start)
        if proc.returncode != 0:
            raise SystemExit(f"failed: {' '.join(args)}\n{proc.stderr}")
        rss.append(int(next(l for l in proc.stderr.splitlines() if l.startswith("RSS_KB")).split()[1]) / 1024)
    return statistics.median(times), max(rss)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        llama = out / "llama70b.onnx"
        subprocess.run([sys.executable, "main.py", "zoo", "preset", "llama2-70b", "-o", str(llama)], cwd=ROOT, check=True, capture_output=True)
        cases = [
            ("GPT-2 small export, d=2 p=4 t=2", ["tests/fixtures/gpt2_legacy.onnx", "--d", "2", "--p", "4", "--t", "2", "--micro-batch-size", "1", "--seq-len", "1024"], 2.0),
            ("zoo Llama-70B, d=1 t=8 p=8 (64 GPUs)", [str(llama), "--d", "1", "--t", "8", "--p", "8", "--micro-batch-size", "1", "--global-batch-size", "64"], None),
            ("zoo Llama-70B, d=16 t=8 p=8 (1,024 GPUs)", [str(llama), "--d", "16", "--t", "8", "--p", "8", "--micro-batch-size", "1", "--global-batch-size", "1024"], 5.0),
        ]
        results = {}
        print(f"{'case':45s} {'wall s':>8s} {'peak RSS MiB':>13s} {'target s':>9s}")
        for label, argv, target in cases:
            wall, rss = run(argv + ["--no-site", "--json", "--out", str(out / "o")], args.repeat)
            results[label] = wall
            print(f"{label:45s} {wall:8.2f} {rss:13.0f} {target if target else '':>9}")
        ratio = results[cases[2][0]] / results[cases[1][0]]
        print(f"1,024 GPUs vs 64 GPUs time ratio: {ratio:.2f} (target <= 1.5)")


if __name__ == "__main__":
    main()
