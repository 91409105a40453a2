"""The two bundled H100 training steps the --profile tests read: (model, trace, micro-batch,
sequence, measured step seconds).  Measured steps: dml2comm/validate/data/h100_steps.json, the
mean of the medians of the runs made with the traces (2026-11-27, the machine the traces were
taken on; the file's repeats from another machine are left out, as benchmarks/bench_profile.py
does)."""

from __future__ import annotations

from dml2comm.parallel.config import ParallelConfig

MODELS = "dml2comm/validate/data/models"
TRACES = "benchmarks/data/h100"
GPT2 = (f"{MODELS}/step_gpt2_small_dynamo.onnx", f"{TRACES}/trace_gpt2-small_bf16_b8.json.gz", 8, 1024, 0.05160)
LLAMA = (f"{MODELS}/step_llama_1b_dynamo.onnx", f"{TRACES}/trace_llama-1b_bf16_b4.json.gz", 4, 2048, 0.17999)


def step_config(b: int, s: int, **kw) -> ParallelConfig:
    """One GPU, the profiled steps' stack: eager PyTorch, pure bf16, AdamW."""
    return ParallelConfig(dp_size=1, tp_size=1, pp_size=1, micro_batch_size=b, global_batch_size=b, seq_len=s, stack="pytorch",
                          precision="bf16", optimizer="adamw", **kw)


def run_profiled(tmp_path, model: str, trace: str, b: int, s: int, *extra: str) -> dict:
    """data.json of the command-line analysis of one step on one H100 with ``--profile trace``."""
    import json

    from dml2comm.cli import main

    out = tmp_path / "out"
    rc = main([model, "--cluster", "dgx-h100", "--gpus", "1", "--stack", "pytorch", "--precision", "bf16", "--optimizer", "adamw",
               "--micro-batch-size", str(b), "--seq-len", str(s), "--profile", trace, "--no-site", "--no-advice",
               "--out", str(out), *extra])
    assert rc == 0
    return json.loads((out / "data.json").read_text())
