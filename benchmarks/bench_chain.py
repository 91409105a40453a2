"""Scaling of the analysis in the number of ops (issue 36): chains of N unscoped ops.

Two chains (:func:`chain_model`): MatMuls with their own weights alternating with Relu / Add,
and one MatMul followed by Relus only.  Without module scopes every op is a cut point of the
structure-based layer grouping; the shapes exposed quadratic loops (a chain of 4,000 ops took
33 s, 20,000 over 4 minutes).  Prints the wall time of
``main.py CHAIN.onnx --no-site --no-advice`` (including Python start) per size and the ratio to
the previous size: a linear tool gives about 2x per doubling.

    .venv/bin/python benchmarks/bench_chain.py [--sizes 2000 4000 8000 20000] [--profile N]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

ROOT = Path(__file__).resolve().parent.parent
SHAPES = ("alternating", "pointwise")


def chain_model(num_ops: int, shape: str = "alternating", hidden: int = 16, batch: int = 2, seq: int = 8) -> onnx.ModelProto:
    """A chain of ``num_ops`` unscoped ops on fixed dims.

    ``alternating``: MatMul(x, W_k) with its own weight, then Relu or Add(residual), in turn
    (every op a cut point of the structure-based layer grouping; the repeated unit is found among
    ``num_ops / 2`` segments).  ``pointwise``: one MatMul, then Relu after Relu (one weighted
    segment followed by weightless ones, and one fused point-wise region of ``num_ops - 1`` ops).
    """
    nodes, inits = [], []
    x, residual = "x", "x"
    zeros = np.zeros(hidden * hidden, np.float32).tobytes()
    for i in range(num_ops):
        out = f"t{i}"
        if i % 2 == 0 and (i == 0 or shape == "alternating"):
            w = f"w{i}"
            inits.append(helper.make_tensor(w, TensorProto.FLOAT, [hidden, hidden], zeros, raw=True))
            nodes.append(helper.make_node("MatMul", [x, w], [out]))
            residual = x
        elif i % 4 == 1 or shape == "pointwise":
            nodes.append(helper.make_node("Relu", [x], [out]))
        else:
            nodes.append(helper.make_node("Add", [x, residual], [out]))
        x = out
    graph = helper.make_graph(
        nodes, "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, seq, hidden])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [batch, seq, hidden])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def analyse(path: Path, out: Path) -> float:
    """Wall seconds of ``main.py path --no-site --no-advice`` (Python start included)."""
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "main.py", str(path), "--no-site", "--no-advice", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"failed on {path.name}:\n{proc.stderr}")
    return wall


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[2000, 4000, 8000, 20000])
    ap.add_argument("--shapes", nargs="+", choices=SHAPES, default=list(SHAPES))
    ap.add_argument("--profile", type=int, default=0, help="profile the chain of this many ops instead (cProfile, top 25)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        if args.profile:
            for shape in args.shapes:
                path = out / f"{shape}{args.profile}.onnx"
                onnx.save(chain_model(args.profile, shape), path)
                subprocess.run([sys.executable, "-m", "cProfile", "-s", "tottime", "main.py", str(path), "--no-site",
                                "--no-advice", "--out", str(out / "o")], cwd=ROOT, check=True)
            return
        print(f"{'chain':12s} {'ops':>7s} {'wall s':>8s}  time ratio to the previous size")
        for shape in args.shapes:
            previous = None
            for n in args.sizes:
                path = out / f"{shape}{n}.onnx"
                onnx.save(chain_model(n, shape), path)
                wall = analyse(path, out / "o")
                ratio = f"{wall / previous[1]:.2f}x for {n / previous[0]:.1f}x ops" if previous else ""
                print(f"{shape:12s} {n:7d} {wall:8.2f}  {ratio}", flush=True)
                previous = (n, wall)


if __name__ == "__main__":
    main()
