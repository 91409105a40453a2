"""Speed of the whole command with the site: analysis + SVGs + mkdocs build, as a user runs it.

Prints wall time (including Python start), peak RSS of the Python process and of the largest
Graphviz child, pages produced, drawings (Graphviz drawings plus the generated memory chart and
timeline) and Graphviz layouts actually run (alike drawings share one layout), and the split
between the generated charts, Graphviz and MkDocs measured in-process.

Targets (issue 3), on 2 cores: GPT-2 small export at d=2 p=4 t=2 under 15 s; zoo Llama-70B
shape at d=16 t=8 p=8 under 60 s and 2 GB peak RSS.

    .venv/bin/python benchmarks/bench_site.py [--repeat 1]
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CHILD = (
    "import resource, runpy, sys; sys.argv = ['main.py'] + sys.argv[1:]\n"
    "try:\n    runpy.run_path('main.py', run_name='__main__')\nexcept SystemExit as e:\n    code = e.code\n"
    "print('RSS_KB', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,"
    " file=sys.stderr)\nsys.exit(code)\n"
)


def run(args: list[str], repeat: int) -> dict[str, float | str]:
    times, rss, child = [], [], []
    line = ""
    for _ in range(repeat):
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", CHILD, *args], cwd=ROOT, capture_output=True, text=True)
        times.append(time.perf_counter() - start)
        if proc.returncode != 0:
            raise SystemExit(f"failed: {' '.join(args)}\n{proc.stderr}")
        kb = next(l for l in proc.stderr.splitlines() if l.startswith("RSS_KB")).split()
        rss.append(int(kb[1]) / 1024)
        child.append(int(kb[2]) / 1024)
        line = " ".join(proc.stdout.split())
    m = re.search(r"\((\d+) pages; (\d+) drawings .* from (\d+) Graphviz layouts\)", line)
    pages, drawings, layouts = m.groups() if m else ("?", "?", "?")
    return {"wall": statistics.median(times), "rss": max(rss), "dot_rss": max(child), "pages": pages, "drawings": drawings, "layouts": layouts}


def split(model: str, **cfg: int) -> tuple[float, float, float, float, int]:
    """(analysis s, charts s, Graphviz s, MkDocs s, timeline boxes) of one in-process build.

    Charts: the memory chart and the timeline generated in Python (also inside the build)."""
    from dml2comm.analysis import analyze
    from dml2comm.hardware.cluster import make_cluster
    from dml2comm.parallel.config import ParallelConfig
    from dml2comm.render.facts import Facts
    from dml2comm.site.build import build
    from dml2comm.site.pages import site_charts

    start = time.perf_counter()
    config = ParallelConfig(**cfg)
    analysis = analyze(model, config, make_cluster("a100", config.num_gpus, min(8, config.num_gpus)))
    done = time.perf_counter() - start
    start = time.perf_counter()
    charts = site_charts(Facts.of(analysis))
    charts_s = time.perf_counter() - start
    with tempfile.TemporaryDirectory() as tmp:
        stats = build(analysis, Path(tmp))
    timeline = charts.get("timeline")
    return done, charts_s, stats.svg_seconds, stats.mkdocs_seconds, timeline.boxes if timeline else 0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        llama = out / "llama70b.onnx"
        subprocess.run([sys.executable, "main.py", "zoo", "preset", "llama2-70b", "-o", str(llama)], cwd=ROOT, check=True, capture_output=True)
        gpt2 = str(ROOT / "examples" / "gpt2-small.onnx")
        cases = [
            ("GPT-2 small export, d=2 p=4 t=2", [gpt2, "--d", "2", "--p", "4", "--t", "2"], "< 15 s",
             dict(dp_size=2, pp_size=4, tp_size=2, micro_batch_size=1, global_batch_size=8, seq_len=1024), gpt2),
            ("zoo Llama-70B, d=16 t=8 p=8 (1,024 GPUs)",
             [str(llama), "--d", "16", "--t", "8", "--p", "8", "--micro-batch-size", "1", "--global-batch-size", "1024"], "< 60 s, < 2 GB",
             dict(dp_size=16, pp_size=8, tp_size=8, micro_batch_size=1, global_batch_size=1024), str(llama)),
        ]
        print(f"{'case':42s} {'wall s':>7s} {'RSS MiB':>8s} {'dot MiB':>8s} {'pages':>6s} {'drawings':>9s} {'layouts':>8s}  target")
        for label, argv, target, _, _ in cases:
            r = run(argv + ["--out", str(out / "o")], args.repeat)
            print(f"{label:42s} {r['wall']:7.2f} {r['rss']:8.0f} {r['dot_rss']:8.0f} {r['pages']:>6s} {r['drawings']:>9s} {r['layouts']:>8s}  {target}")
        print("\nin-process split (seconds): analysis / charts (memory + timeline) / Graphviz (parallel) / MkDocs; timeline boxes")
        for label, _, _, cfg, model in cases:
            a, c, g, m, boxes = split(model, **cfg)
            print(f"{label:42s} {a:6.2f} / {c:6.2f} / {g:6.2f} / {m:6.2f}; {boxes:,} boxes")


if __name__ == "__main__":
    main()
