"""The two bundled H100 training steps the --profile and calibrate benchmarks read: per step its
dynamo export, its profiler trace, micro-batch and sequence; the measured step times
(dml2comm/validate/data/h100_steps.json: PyTorch 2.11, transformers 5.17, pure bf16, fused AdamW)."""

from __future__ import annotations

import json

from dml2comm.parallel.config import ParallelConfig

MODELS = "dml2comm/validate/data/models"
TRACES = "benchmarks/data/h100"
STEPS = "dml2comm/validate/data/h100_steps.json"
RUNS = {"gpt2-small": (f"{MODELS}/step_gpt2_small_dynamo.onnx", f"{TRACES}/trace_gpt2-small_bf16_b8.json.gz", 8, 1024),
        "llama-1b": (f"{MODELS}/step_llama_1b_dynamo.onnx", f"{TRACES}/trace_llama-1b_bf16_b4.json.gz", 4, 2048)}


def config(b: int, s: int) -> ParallelConfig:
    """One GPU, the profiled steps' stack: eager PyTorch, pure bf16, AdamW."""
    return ParallelConfig(dp_size=1, tp_size=1, pp_size=1, micro_batch_size=b, global_batch_size=b, seq_len=s, stack="pytorch",
                          precision="bf16", optimizer="adamw")


def measured_steps() -> dict[str, float]:
    """The mean of the runs' medians at the profiled shape, on the day and machine the traces
    were taken (GPT-2 small was run twice); the repeats measured on another machine a day later
    (the rows with ``host_issue_s_median``, ``benchmarks/data/gpu_steps/``) are left out."""
    runs = [r for r in json.load(open(STEPS))["runs"] if "host_issue_s_median" not in r]
    out = {}
    for name, (_, _, b, s) in RUNS.items():
        times = [r["step_s_median"] for r in runs if r["name"] == name and r["micro_batch"] == b and r["seq"] == s and r["mode"] == "bf16"]
        out[name] = sum(times) / len(times)
    return out
