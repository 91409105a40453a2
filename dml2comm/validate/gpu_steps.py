"""One-GPU training steps of nine Hugging Face models measured on H100 and H200 machines
(``data/gpu_steps.json``): step time and peak allocated memory, against the tool run on the
real export of each model, as a user runs it.

What ran (``data/PROVENANCE.md``; ``benchmarks/data/gpu_steps/PROVENANCE.md`` in the
repository): the project's ``measure_gpu.py`` on one H200 and four H100 machines, two timed
processes per machine, PyTorch 2.11, transformers 5.17; each model built from a config with
random weights (SDPA attention, dropout 0), trained eagerly with fused AdamW, in pure bf16
(``model.to(torch.bfloat16)``) or under AMP (fp32 model, ``torch.autocast(dtype=torch.bfloat16)``);
step time the median of 10 steps after warm-up, each bracketed by ``torch.cuda.synchronize()``;
peak memory ``torch.cuda.max_memory_allocated()``.  Models: GPT-2 small and medium and a
6-layer GPT-2, Llama-1B and -0.3B, Qwen2-1.5B, a 6-layer BERT (masked LM), an 8-layer ViT and
ResNet-18; micro-batches 1-256, bf16 and AMP.  A case is one (GPU, model, mode, micro-batch,
sequence): the mean over its measurements (the runs of one or two machines).  Left out: the two
H100 steps the ``h100-steps`` source holds (GPT-2 small b = 8 s = 1,024 and Llama-1B b = 4
s = 2,048 in bf16), which would count twice in the bands.

How the tool is run: ``python main.py MODEL --cluster dgx-h100|hgx-h200 --micro-batch-size b
--seq-len s --stack pytorch --precision bf16|amp --optimizer adamw`` on
``data/models/<model>_dynamo.onnx`` (the image models: their export's 224 x 224 image),
d = t = p = 1 (:func:`dml2comm.validate.steps.analyse_step`).

In sample: the pytorch host model's CPU time per kernel (:data:`dml2comm.cost.host.PYTORCH`) is
fitted on these steps, and the H200's ``kernel_bandwidth_share`` on kernels measured on the same
machine; ``benchmarks/bench_gpu_steps.py --kernel-us`` prints the leave-one-machine-out errors.
Host-bound steps (small micro-batches, where the CPU's kernel launches set the step) carry the
measuring machine's CPU speed, which differed 1.7 times between the machines: their error is the
host model's spread over machines, which the expected-error bands built from these cases state.
``validate`` refits nothing on them (``fit=False``, ``compute=False``).
"""

from __future__ import annotations

from typing import Any

from dml2comm.hardware.cluster import get_cluster
from dml2comm.parallel.config import Stack
from dml2comm.validate import steps
from dml2comm.validate.cases import Case, sample_indices
from dml2comm.validate.data import read_json

__all__ = ["CLUSTERS", "FILE", "MODELS", "cases", "runs"]

FILE = "gpu_steps.json"
#: GPU of a measurement -> the preset cluster the tool runs it on.
CLUSTERS = {"h100": "dgx-h100", "h200": "hgx-h200"}
#: measured run name -> its export in ``data/models/`` (the dynamo export: today's default);
#: ``None``: an image model (the export's fixed image size, no sequence to bind).
MODELS = {"gpt2-small": "step_gpt2_small_dynamo.onnx", "llama-1b": "step_llama_1b_dynamo.onnx",
          "llama-0.3b": "step_llama_0_3b_dynamo.onnx", "qwen2-1.5b": "step_qwen2_1_5b_dynamo.onnx",
          "gpt2-6l-512": "step_gpt2_6l_512_dynamo.onnx", "bert-6l-512": "step_bert_6l_512_dynamo.onnx",
          "vit-8l-512": "step_vit_8l_512_dynamo.onnx", "resnet18": "resnet18_dynamo.onnx",
          "gpt2-medium": "step_gpt2_medium_dynamo.onnx"}
#: Models whose measured ``seq`` is the image size, fixed by the export.
IMAGES = frozenset({"vit-8l-512", "resnet18"})


def _held_by_h100_steps() -> set[tuple[str, str, str, int, int]]:
    """The (gpu, model, mode, b, s) steps the ``h100-steps`` source already holds."""
    return {("h100", r["name"], "bf16", r["micro_batch"], r["seq"]) for r in steps.runs()}


def runs() -> list[dict[str, Any]]:
    """One entry per measured (GPU, model, mode, micro-batch, sequence) with a bundled export and
    not held by ``h100-steps``: ``gpu``, ``name``, ``model`` (the export's file name), ``mode``,
    ``micro_batch``, ``seq`` (None for an image model), ``params`` (torch's count), ``time_s`` and
    ``peak_bytes`` (the means over its measurements), ``repeats``."""
    held = _held_by_h100_steps()
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in read_json(FILE)["runs"]:
        if r["name"] not in MODELS:
            raise ValueError(f"{FILE}: no export for measured model {r['name']!r}")  # the bundled file is fixed
        key = (r["gpu"], r["name"], r["mode"], r["micro_batch"], r["seq"])
        if key not in held:
            groups.setdefault(key, []).append(r)
    return [{"gpu": gpu, "name": name, "model": MODELS[name], "mode": mode, "micro_batch": b,
             "seq": None if name in IMAGES else s, "params": rows[0]["params"],
             "time_s": sum(r["step_s_median"] for r in rows) / len(rows),
             "peak_bytes": sum(r["peak_alloc_bytes"] for r in rows) / len(rows), "repeats": len(rows)}
            for (gpu, name, mode, b, s), rows in groups.items()]


def cases(sample: int | None = None, compute_scale: float = 1.0) -> list[Case]:
    """Two cases per measured step (a deterministic sample of at most ``sample`` steps): the step
    time, tagged with where it sits for the expected-error bands (``params=``, ``gpu=``,
    ``stack=``, ``gpus=``, ``host=``: the share of the predicted step the GPU waits for the CPU),
    and the peak memory.  ``compute_scale`` is ignored (module docstring)."""
    table = runs()
    out = []
    for i in sample_indices(len(table), sample):
        run = table[i]
        cfg = steps.step_config(run["micro_batch"], run["seq"], run["mode"])
        cluster = CLUSTERS[run["gpu"]]
        analysis, host = steps.analyse_step(run["model"], run["params"], cluster, cfg)
        summary = analysis.summary
        shape = f"s={run['seq']}" if run["seq"] is not None else "224x224"
        setup = (f"{cluster} d=t=p=1 b={run['micro_batch']} {shape} {cfg.stack_text()}, {cfg.optimizer}"
                 + (f"; mean of {run['repeats']} measurements" if run["repeats"] > 1 else ""))
        case = f"{run['gpu']}/{run['name']}/{run['mode']}/b{run['micro_batch']}" + (f"/s{run['seq']}" if run["seq"] is not None else "")
        where = (f"params={run['params']}", f"gpu={get_cluster(cluster, 1).gpu.name}", f"stack={Stack.PYTORCH}", "gpus=1",
                 *([f"host={host:.4f}"] if host is not None else []))
        out.append(Case("gpu-steps", f"{case}/time", "iteration_time_s", run["time_s"], float(summary["iteration_time_s"]), setup, where))
        out.append(Case("gpu-steps", f"{case}/memory", "peak_memory_bytes", run["peak_bytes"], float(summary["peak_memory_bytes"]), setup))
    return out
