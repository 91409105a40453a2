"""The two training steps measured on an H100 (shared/data/gpu_measured/h100/steps.json): the
tool's peak per GPU and its parts, under Megatron mixed precision (what the tool assumed before
``--stack``/``--precision``) and under the stack that ran (PyTorch, pure bf16), beside the
measured ``torch.cuda.max_memory_allocated()`` and the fake-tensor count's parts
(benchmarks/data/fake_memory_hf.json).  Prints only.

    .venv/bin/python benchmarks/bench_step_memory.py

GPT-2 small is the bundled legacy export (examples/gpt2-small.onnx); Llama-1B (L=16, h=2048,
32 heads, 8 KV heads, f=8192, V=128,256, tied) is the zoo's shape-only graph.  The measured peak
has no CUDA context, and neither has the tool's ``total_bytes`` (the context is off the capacity).

What it showed when ``--precision``/``--stack`` came in: the model states and the loss match
the fake-tensor count (GPT-2 small 0.75 + 4.94 GB, Llama-1B 7.41 + 12.61 GB), and what is left
is the body's activations, which the activation model still counts as Megatron's kernels with
an unfused attention core (8.64 GB for 4.56 counted; 44.4 for 14.4).
"""

from __future__ import annotations

import json
from pathlib import Path

from dml2comm import zoo
from dml2comm.analysis import analyze_graph
from dml2comm.hardware.cluster import make_cluster
from dml2comm.ir.onnx_import import ImportOptions
from dml2comm.load import load_model, load_model_proto
from dml2comm.parallel.config import ParallelConfig

ROOT = Path(__file__).resolve().parents[1]
FAKE = {(r["name"], r["mode"], r["micro_batch"]): r for r in json.loads((ROOT / "benchmarks/data/fake_memory_hf.json").read_text())["runs"]}
# name, micro-batch, sequence, measured peak_alloc_bytes (steps.json)
STEPS = [("gpt2-small", 8, 1024, 10346023936), ("llama-1b", 4, 2048, 34471360512)]


def imported(name: str, b: int, s: int):
    if name == "gpt2-small":
        return load_model(ROOT / "examples/gpt2-small.onnx", ImportOptions(batch_size=b))
    proto = zoo.build_llama(layers=16, hidden=2048, heads=32, kv_heads=8, ffn_hidden=8192, vocab=128256, seq_len=s,
                            tied_embeddings=True, dtype="bf16")
    return load_model_proto(proto, ImportOptions(batch_size=b))


def main() -> None:
    gb = 1e9
    for name, b, s, measured in STEPS:
        model = imported(name, b, s)
        fake = FAKE[(name, "bf16", b)]
        body = (fake["end_of_body_bytes"] - fake["start_bytes"]) / gb
        print(f"{name} b={b} s={s}: measured {measured / gb:.2f} GB; fake-tensor count {fake['peak_alloc_bytes'] / gb:.2f} "
              f"(states {fake['start_bytes'] / gb:.2f}, body activations {body:.2f}, "
              f"loss {(fake['peak_alloc_bytes'] - fake['end_of_body_bytes']) / gb:.2f})")
        for stack, precision in (("megatron", None), ("pytorch", "bf16")):
            config = ParallelConfig(micro_batch_size=b, global_batch_size=b, seq_len=s, stack=stack, precision=precision)
            m = analyze_graph(model, config, make_cluster("h100", 1), advise=False, timeline=False).stages[0].memory
            alloc = m["total_bytes"]
            print(f"  {stack:8s} {config.precision:5s} peak {alloc / gb:6.2f} GB ({alloc / measured - 1:+.0%}): weights "
                  f"{m['weights_bytes'] / gb:.2f} grads {m['grads_bytes'] / gb:.2f} optimizer {m['optimizer_bytes'] / gb:.2f} "
                  f"activations {m['activations_bytes'] / gb:.2f} transient {m['transient_bytes'] / gb:.2f}; "
                  f"optimizer step candidate {m['step_optimizer_bytes'] / gb:.2f}")


if __name__ == "__main__":
    main()
