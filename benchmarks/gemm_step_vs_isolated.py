"""The GEMMs inside the two bundled H100 training-step traces against the same shapes measured alone
(``kernels.json``) and against the GEMM law.  Prints figures; asserts nothing.

    PYTHONPATH=. .venv/bin/python benchmarks/gemm_step_vs_isolated.py

Each trace GEMM kernel is matched to its ``aten::mm`` / ``aten::addmm`` call by the profiler's
External id, and its ``[a, b] @ [b, c]`` input dims to the ``kernels.json`` rows and layouts that
compute that product: ``fwd`` of ``(M, N, K) = (a, c, b)``, ``dgrad`` of ``(a, b, c)``, ``wgrad``
of ``(b, a, c)`` (PROVENANCE.md: ``x @ W^T``, ``g @ W``, ``g^T @ x``).  Where several rows match,
the mean of their times is the isolated figure.  The law's figure for an LM-head GEMM is the
plain shape law (the analysis times those through ``training_gemms``), so only the totals over
the blocks' GEMMs compare like with like.  The law is
:func:`dml2comm.cost.gemm.gemm_time_s` on the ``h100`` preset in bf16 (its ``H100_SHAPE_LAW`` is
fitted on ``kernels.json``).
"""

from __future__ import annotations

import gzip
import json
import statistics
from collections import defaultdict
from pathlib import Path

from dml2comm.cost.gemm import gemm_time_s
from dml2comm.hardware.gpus import get_gpu

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "benchmarks" / "data" / "h100"
TRACES = ("trace_gpt2-small_bf16_b8.json.gz", "trace_llama-1b_bf16_b4.json.gz")
CALLS = ("aten::mm", "aten::addmm")
#: A dimension this large is the vocabulary: the LM-head GEMMs, left out of the blocks' totals
#: (GPT-2's 50,257 runs cuBLAS's sm_75 fallback; ``gpt2_step_vs_trace.py`` compares them apart).
HEAD_DIM = 50_000


def trace_gemms(name: str) -> dict[tuple[int, int, int], list[float]]:
    """(a, b, c) of ``[a, b] @ [b, c]`` -> the kernel seconds of each call in the trace."""
    events = json.load(gzip.open(DATA / name))["traceEvents"]
    dims = {}
    for e in events:
        if e.get("cat") == "cpu_op" and e["name"] in CALLS:
            d = e["args"].get("Input Dims") or []
            mats = [x for x in d if isinstance(x, list) and len(x) == 2]
            if len(mats) == 2:
                dims[e["args"].get("External id")] = (mats[0][0], mats[0][1], mats[1][1])
    out = defaultdict(list)
    for e in events:
        if e.get("cat") == "kernel" and e["args"].get("External id") in dims:
            out[dims[e["args"]["External id"]]].append(e["dur"] * 1e-6)
    return out


def isolated(rows: list[dict], a: int, b: int, c: int) -> float | None:
    """Mean measured seconds of the kernels.json layouts computing ``[a, b] @ [b, c]``."""
    want = {("fwd", (a, c, b)), ("dgrad", (a, b, c)), ("wgrad", (b, a, c))}
    got = [r[f"{lay}_s"] for r in rows for lay, mnk in want if (r["M"], r["N"], r["K"]) == mnk]
    return statistics.mean(got) if got else None


def blocks_totals(name: str, show: bool = False) -> dict[str, float]:
    """Over the blocks' GEMMs of trace ``name`` whose shape ``kernels.json`` holds (the LM head's
    left out): seconds in the step (each shape's median call), measured alone and by the law
    (``step_matched``, ``alone``, ``law_matched``); ``show`` prints each shape."""
    rows = json.load(open(DATA / "kernels.json"))["gemm"]
    h100 = get_gpu("h100")
    tot: dict[str, float] = defaultdict(float)
    for (a, b, c), durs in sorted(trace_gemms(name).items(), key=lambda kv: -sum(kv[1])):
        step = statistics.median(durs)
        alone = isolated(rows, a, b, c)
        law = gemm_time_s(h100, "bf16", 1, a, c, b)
        n = len(durs)
        if alone is not None and max(a, b, c) < HEAD_DIM:
            tot["step_matched"] += step * n
            tot["alone"] += alone * n
            tot["law_matched"] += law * n
        if show:
            iso = f"{alone * 1e6:9.1f} us ({step / alone - 1:+6.1%})" if alone else f"{'-':>23s}"
            print(f"  [{a:6d},{b:6d}]@[{b:6d},{c:6d}] x{n:3d}  step {step * 1e6:9.1f} us  alone {iso}"
                  f"  law {law * 1e6:9.1f} us (step/law {step / law - 1:+6.1%})")
    return tot


def main() -> None:
    shares = []
    for name in TRACES:
        print(name)
        tot = blocks_totals(name, show=True)
        shares.append(tot["step_matched"] / tot["law_matched"])
        print(f"  blocks' GEMMs where kernels.json has the shape: step {tot['step_matched'] * 1e3:.2f} ms, alone {tot['alone'] * 1e3:.2f} ms "
              f"({tot['step_matched'] / tot['alone'] - 1:+.1%}), law {tot['law_matched'] * 1e3:.2f} ms "
              f"(step/law {tot['step_matched'] / tot['law_matched'] - 1:+.1%})")
    print(f"mean step/law share {statistics.mean(shares):.3f} (dml2comm.cost.gemm.IN_STEP_GEMM_SHARE)")


if __name__ == "__main__":
    main()
