"""The held-out one-GPU steps: models and shapes no constant of the tool was fitted on, measured on
an H200 (``benchmarks/data/gpu_steps/h200_set6_*.json``: nine models the tool had never been run
against, among them a Mixtral-style MoE, Qwen3, Gemma, ResNet-50, and other shapes of the
validated ones; ``h200_set7_*.json``: two more mixture-of-experts shapes, top-1 of 4 experts and
top-4 of 16, measured after the grouped-GEMM import was built on set 6's; ``h200_set5_*.json``:
the host-bound steps of set 5, measured on an H100 before, now on the H200; PROVENANCE.md there), against the tool run as a user runs it: ``python main.py
MODEL --cluster hgx-h200 --micro-batch-size b --seq-len s --stack pytorch --precision MODE
--optimizer adamw`` on each model's dynamo export (``tests/fixtures/step_*_dynamo.onnx``, or the
validation's own in ``dml2comm/validate/data/models/``).

    PYTHONPATH=. python benchmarks/bench_held_out.py            # every set
    PYTHONPATH=. python benchmarks/bench_held_out.py --set 6

Each row: the mean step time of the processes that measured it (three for set 6, two for sets 5 and 7)
and their spread ((max - min) / min: what the measuring machine's CPU alone moves a host-bound
step), the prediction and its error, the predicted share of the step the GPU waits for the CPU
(``host``), the expected error the tool printed for it (``band``) and the peak memory's error.  Nothing here is fitted; the figures are the tool's
error on data it has not seen.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from dml2comm.validate import steps
from dml2comm.validate.gpu_steps import MODELS as VALIDATED

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "benchmarks" / "data" / "gpu_steps" / "held_out"
FIXTURES = ROOT / "tests" / "fixtures"
#: measured run name -> its dynamo export among the fixtures (the held-out models)
HELD_OUT = {"mixtral-8x0.1b": "step_mixtral_8x0_1b", "qwen3-0.6b": "step_qwen3_0_6b", "gemma-1b": "step_gemma_1b",
            "llama-3b-8l": "step_llama_3b_8l", "qwen2-0.5b": "step_qwen2_0_5b", "gpt2-large": "step_gpt2_large",
            "bert-base": "step_bert_base", "vit-base": "step_vit_base", "resnet50": "step_resnet50",
            "mixtral-4x0.3b-top1": "step_mixtral_4x0_3b_top1", "mixtral-16x0.03b-top4": "step_mixtral_16x0_03b_top4"}
IMAGES = frozenset({"vit-8l-512", "resnet18", "vit-base", "resnet50"})
#: predicted host wait under which a step counts as GPU-bound (its error is the GPU side's)
GPU_BOUND_HOST = 0.10


def model_path(name: str) -> Path:
    if name in HELD_OUT:
        return FIXTURES / f"{HELD_OUT[name]}_dynamo.onnx"
    return ROOT / "dml2comm" / "validate" / "data" / "models" / VALIDATED[name]


def measured(sets: list[str]) -> dict[tuple, list[dict]]:
    """(set, name, mode, b, s) -> the rows of every process that measured it."""
    groups: dict[tuple, list[dict]] = {}
    for k in sets:
        for f in sorted(DATA.glob(f"h200_set{k}_*.json")):
            for r in json.loads(f.read_text())["runs"]:
                groups.setdefault((k, r["name"], r["mode"], r["micro_batch"], r["seq"]), []).append(r)
    return groups


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--set", choices=("5", "6", "7"), action="append", help="the measuring sets (default all)")
    args = ap.parse_args()
    errors: dict[str, list[tuple[float, float, float]]] = {}
    for (k, name, mode, b, s), rows in measured(args.set or ["6", "7", "5"]).items():
        t = statistics.mean(r["step_s_median"] for r in rows)
        m = statistics.mean(r["peak_alloc_bytes"] for r in rows)
        times = [r["step_s_median"] for r in rows]
        cfg = steps.step_config(b, None if name in IMAGES else s, mode)
        analysis, host = steps.analyse_step_at(model_path(name), rows[0]["params"], "hgx-h200", cfg)
        pt, pm = analysis.summary["iteration_time_s"], analysis.summary["peak_memory_bytes"]
        band = analysis.summary["expected_error"]
        errors.setdefault(k, []).append((pt / t - 1, pm / m - 1, host or 0.0, band))
        print(f"set {k} {name:15s} {mode:4s} b={b:3d} s={s:4d}  measured {t * 1e3:7.2f} ms (spread {max(times) / min(times) - 1:5.1%})"
              f"  predicted {pt * 1e3:7.2f} ms {pt / t - 1:+6.1%} (band ±{band:.1%})  host {host or 0:4.2f}  memory {pm / m - 1:+6.1%}")
    for k, rows in sorted(errors.items()):
        time = [abs(e[0]) for e in rows]
        gpu = [abs(e[0]) for e in rows if e[2] < GPU_BOUND_HOST]
        inside = sum(abs(e[0]) <= e[3] for e in rows)
        print(f"set {k}: time {statistics.mean(time):.1%} mean |error|, {sum(e <= 0.05 for e in time)} of {len(time)} within 5%, "
              f"{inside} inside the band the tool printed; "
              f"GPU-bound (host wait < {GPU_BOUND_HOST:.0%}) {statistics.mean(gpu) if gpu else float('nan'):.1%} over {len(gpu)}; "
              f"memory {statistics.mean(abs(e[1]) for e in rows):.1%} mean, {max(abs(e[1]) for e in rows):.1%} worst")


if __name__ == "__main__":
    main()
