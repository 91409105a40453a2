"""Training steps of Hugging Face models measured on one H100 (``data/h100_steps.json``): step
time and peak allocated memory, measured against the tool run on the real export of each model.

What ran (``data/PROVENANCE.md``; the project's ``tools/measure_gpu.py``): one NVIDIA H100 80GB
HBM3 (SXM, 700 W), PyTorch 2.11.0+cu130, cuDNN 9.19, Hugging Face transformers 5.17.0.  Each model
was built from a config with random weights (``AutoModelForCausalLM.from_config(cfg,
attn_implementation="sdpa")``, dropout 0), held wholly in bf16 (``model.to(torch.bfloat16)``:
parameters, gradients and both AdamW states bf16, no fp32 master copy), and trained eagerly:
``model(input_ids, labels=input_ids).loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)``
with ``torch.optim.AdamW(fused=True)``.  Attention is PyTorch SDPA, which runs the flash kernels
on sm_90; the loss is transformers' ``ForCausalLMLoss`` (logits upcast to fp32).  Step time is the
median wall time of 10 steps after 3 warm-ups, each bracketed by ``torch.cuda.synchronize()``;
peak memory is ``torch.cuda.max_memory_allocated()`` over those steps.

- ``gpt2-small``: GPT-2 small (12 layers, h 768, 12 heads, V 50,257, 1,024 positions), b = 8,
  s = 1,024; measured twice on two machine starts (51.5 and 51.7 ms, 10.346 and 10.337 GB) and
  twice more a day later on another H100 machine (49.3 and 49.5 ms): the case is the mean of
  the four;
- ``llama-1b``: Llama 3.2 1B's shape (16 layers, h 2,048, 32 query / 8 KV heads, FFN 8,192,
  V 128,256, tied embedding), b = 4, s = 2,048; measured once, then twice on the other machine
  (180.0, 180.6 and 181.4 ms).

The repeats of the second day are two rows of ``benchmarks/data/gpu_steps/h100_a.json`` and
``h100_b.json`` (the same script, which also measured these models at other shapes, and on an
H200: ``benchmarks/bench_gpu_steps.py`` reports the tool on all of them).

How the tool is run, as a user would run it on the export (``python main.py MODEL --cluster
dgx-h100 --micro-batch-size b --seq-len s --stack pytorch --precision bf16 --optimizer adamw``):
the model is ``data/models/step_<name>_dynamo.onnx``, the graph-only export of exactly the
measured config by today's default exporter (``torch.onnx.export(..., dynamo=True)``, opset 18,
symbolic batch and sequence; made by ``tests/fixtures/export_models.py``, whose README and
``fixtures_expected.json`` describe each file and record torch's parameter count); d = t = p = 1,
global batch = micro-batch, the pytorch stack's defaults otherwise (flash attention, its host
model), collectives at kernel time (none on one GPU).  The measured peak is the allocator's
(PyTorch docs, ``torch.cuda.max_memory_allocated``: "the maximum GPU memory occupied by
tensors"), which holds no CUDA context: so is the tool's ``peak_memory_bytes``, whose framework
constant (``dml2comm.cost.memory.FRAMEWORK_OVERHEAD_BYTES``) is taken off the capacity instead.

``validate`` refits nothing on these steps (``fit=False``), and the A100 refit does not move
them: the H100's GEMMs come from its measured table, which it does not scale (``compute=False``;
``compute_scale`` is accepted and ignored).  They are, though, two of the 30 measured steps the
pytorch host model's CPU time per kernel is fitted on (:data:`dml2comm.cost.host.PYTORCH`).  Two
cases per step: ``iteration_time_s`` and ``peak_memory_bytes``; the target is each within 5%.
"""

from __future__ import annotations

from dataclasses import replace
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any
from pathlib import Path

from dml2comm.analysis import Analysis, analyze_graph
from dml2comm.cost.bands import host_wait_share
from dml2comm.cost.host import STACK_HOST_MODEL
from dml2comm.cost.stages import StageCoster
from dml2comm.hardware.cluster import get_cluster
from dml2comm.ir.onnx_import import ImportOptions, check_seq_len
from dml2comm.load import load_model
from dml2comm.parallel.config import ParallelConfig, Precision, Stack
from dml2comm.validate.cases import Case, sample_indices
from dml2comm.validate.data import read_json

__all__ = ["CLUSTER", "FILE", "MODELS", "analyse_step", "cases", "model_path", "predict", "runs", "step_config"]

FILE = "h100_steps.json"
CLUSTER = "dgx-h100"
#: measured run name -> its export in ``data/models/`` (the dynamo export: today's default).
MODELS = {"gpt2-small": "step_gpt2_small_dynamo.onnx", "llama-1b": "step_llama_1b_dynamo.onnx"}


def runs() -> list[dict[str, Any]]:
    """One entry per measured (model, micro-batch, sequence, precision mode): ``name``, ``model``
    (the export's file name), ``micro_batch``, ``seq``, ``params`` (torch's count), ``time_s`` and
    ``peak_bytes`` (the mean over repeated measurements), ``repeats``.  Only the pure-bf16 steps of
    the models in :data:`MODELS`; a measured step without an export here is refused."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in read_json(FILE)["runs"]:
        if r["mode"] != "bf16":
            continue
        if r["name"] not in MODELS:
            raise ValueError(f"{FILE}: no export for measured model {r['name']!r}")  # the bundled file is fixed
        groups.setdefault((r["name"], r["micro_batch"], r["seq"]), []).append(r)
    out = []
    for (name, b, s), rows in groups.items():
        out.append({"name": name, "model": MODELS[name], "micro_batch": b, "seq": s, "params": rows[0]["params"],
                    "time_s": sum(r["step_s_median"] for r in rows) / len(rows),
                    "peak_bytes": sum(r["peak_alloc_bytes"] for r in rows) / len(rows), "repeats": len(rows)})
    return out


def model_path(file: str) -> Traversable:
    """The bundled export ``file`` (``data/models/``), as package data."""
    return resources.files("dml2comm.validate").joinpath("data", "models", file)


def config(run: dict[str, Any]) -> ParallelConfig:
    """The measured step as the tool's configuration: one GPU, pure bf16 under the pytorch stack,
    fused AdamW, one micro-batch per step."""
    return step_config(run["micro_batch"], run["seq"], Precision.BF16)


def step_config(b: int, seq: int | None, precision: Precision | str) -> ParallelConfig:
    """A measured one-GPU step as the tool's configuration: micro-batch ``b`` (one per step),
    sequence ``seq`` (None: the export's own, an image model's), bf16 under the pytorch stack in
    ``precision``, fused AdamW, the inputs made on the GPU (the measuring script's
    ``torch.randint``/``torch.randn(..., device=...)``: no host-to-device copy)."""
    seq_arg = {} if seq is None else {"seq_len": seq}
    return ParallelConfig(micro_batch_size=b, global_batch_size=b, dtype="bf16", optimizer="adamw",
                          stack=Stack.PYTORCH, precision=Precision.of(precision), inputs_on_gpu=True, **seq_arg)


def predict(run: dict[str, Any]) -> Analysis:
    """The analysis of one measured step (module docstring), as the main command runs it."""
    return analyse_step(run["model"], run["params"], CLUSTER, config(run))[0]


def analyse_step(file: str, params: int, cluster_name: str, cfg: ParallelConfig) -> tuple[Analysis, float | None]:
    """The analysis of a measured one-GPU step of the bundled export ``file`` (torch counted
    ``params`` parameters in the measured model) on the preset ``cluster_name`` under ``cfg``
    (:func:`step_config`), as the main command runs it: collectives at kernel time (none on one
    GPU), the stack's host model; and the share of its step the GPU waits for the CPU
    (:func:`dml2comm.cost.bands.host_wait_share`; None under a host model that states none).

    Raises
    ------
    ValueError
        The export is of another model than the one measured (its parameter count differs).
    """
    with resources.as_file(model_path(file)) as path:
        return analyse_step_at(path, params, cluster_name, cfg)


def analyse_step_at(path: Path, params: int, cluster_name: str, cfg: ParallelConfig) -> tuple[Analysis, float | None]:
    """:func:`analyse_step` of the export at ``path`` (a file, not package data: the held-out
    models of ``benchmarks/bench_held_out.py``)."""
    options = ImportOptions(batch_size=cfg.micro_batch_size) if cfg.seq_len is None else ImportOptions(batch_size=cfg.micro_batch_size, seq_len=cfg.seq_len)
    imported = load_model(path, options)
    if cfg.seq_len is not None:
        check_seq_len(imported, cfg.seq_len)
    if imported.graph.num_params != params:
        raise ValueError(f"{Path(path).name} has {imported.graph.num_params:,} parameters; the measured model had {params:,}")
    cluster = replace(get_cluster(cluster_name, cfg.num_gpus), collective_overhead_s=0.0, host_model=STACK_HOST_MODEL[cfg.stack])
    analysis = analyze_graph(imported, cfg, cluster, str(path), advise=False, timeline=False)
    # the GPU's wait for the CPU in the predicted step, which the bands rank runs by (the
    # analysis's own layer table: the coster reads it from the graph's cache)
    share = host_wait_share(StageCoster(imported, cluster, collapse=False), cfg, float(analysis.summary["iteration_time_s"]))
    return analysis, share


def cases(sample: int | None = None, compute_scale: float = 1.0) -> list[Case]:
    """Two cases per measured step (a deterministic sample of at most ``sample`` steps): the step
    time and the peak memory.  ``compute_scale`` is ignored (module docstring)."""
    table = runs()
    out = []
    for i in sample_indices(len(table), sample):
        run = table[i]
        cfg = config(run)
        analysis, host = analyse_step(run["model"], run["params"], CLUSTER, cfg)
        summary = analysis.summary
        setup = (f"{CLUSTER} d=t=p=1 b={run['micro_batch']} s={run['seq']} {cfg.stack_text()}, {cfg.optimizer}"
                 + (f"; mean of {run['repeats']} measurements" if run["repeats"] > 1 else ""))
        # where the run sits, for the expected-error bands (dml2comm.validate.bands.band_rows)
        where = (f"params={run['params']}", f"gpu={get_cluster(CLUSTER, 1).gpu.name}", f"stack={cfg.stack}", "gpus=1",
                 *([f"host={host:.4f}"] if host is not None else []))
        out.append(Case("h100-steps", f"{run['name']}/time", "iteration_time_s", run["time_s"], float(summary["iteration_time_s"]), setup,
                        where))
        out.append(Case("h100-steps", f"{run['name']}/memory", "peak_memory_bytes", run["peak_bytes"],
                        float(summary["peak_memory_bytes"]), setup))
    return out
