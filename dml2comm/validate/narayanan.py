"""Narayanan et al. 2021 Table 1 (A100, V=51200, s=2048, full recomputation, interleaved
schedule): predicted vs measured TFLOP/s per GPU.  TFLOP/s counts eq. (3)'s FLOPs, as the
paper does: F = 96 B s L h^2 (1 + s/(6h) + V/(16 L h)) per iteration.

This table is the compute model's only calibration target (the A100's sustained GEMM factor,
``SUSTAINED_FACTOR`` in dml2comm/cost/gemm.py, fitted by ``benchmarks/fit_a100.py``).  ``benchmarks/bench_narayanan.py`` prints these rows (it imports this
module) and ``python main.py validate --source narayanan2021`` reports them.

Megatron-LM as the paper ran it (its released GPT-3 175B script,
examples/pretrain_gpt3_175B.sh of NVIDIA/Megatron-LM, 2021: ``--fp16``,
``--checkpoint-activations``, ``--micro-batch-size 1``):

- the backward tensor-parallel all-reduce waited for (``async_tp_allreduce=False``: Megatron-LM's
  asynchronous all-reduce overlapped with the weight gradient, ``--no-async-tensor-model-parallel-
  allreduce`` to turn off, is absent from the 2021 code the paper ran), and every gradient added
  to its ``main_grad`` buffer in its own pass per micro-batch (``grad_accumulation_fusion=False``:
  the fused weight-gradient accumulation came with the same later releases);
- fp16 training; gradients accumulated and all-reduced in fp16 (``--accumulate-allreduce-
  grads-in-fp32`` is off by default and only forced for bf16), after the backward pass (the
  overlap with backward came in 2023); full recomputation;
- Megatron-LM's fused kernels: bias-GeLU, bias-dropout-add, scale-mask-softmax, with the
  attention dropout after the softmax as its own kernel (Sec. 4.2);
- collectives at kernel time (``collective_overhead_s`` 0, as the CLI).

Assumptions the table does not state, each chosen by a rule, not per row:

- interleaved schedule (Sec. 5.1) with the fewest model chunks v >= 2 that split each stage's
  layers evenly (v = 2, or 3 for 76.1B and 529.6B whose 15 and 3 layers per stage 2 does not
  divide); plain 1F1B without pipelining;
- micro-batch size: the paper tuned it per model ("the optimal value of the microbatch size is
  problem-dependent", Sec. 1 and 5.5) and does not publish it.  Each row uses the micro-batch
  size in {1, 2, 4, 8} that the tool predicts fastest among those that fit in 80 GB, as a user
  sweeping it with the tool would pick (:func:`best_micro_batch`); its outcome is recorded in
  :data:`MICRO_BATCH` (the validation uses the record; ``bench_narayanan.py --sweep`` re-runs
  the sweep and reports any row where the record is stale).

The authors' reproduction script (NVIDIA/Megatron-LM ``examples/sc21/run_table_1.sh``) does set
them, and is not used yet (:data:`SC21`, ``bench_narayanan.py --sc21``): it agrees with the rule
on 18.4B and 76.1B-529.6B, sets b = 16 for 1.7B-7.5B, PyTorch DDP (the gradient all-reduce
overlapped with the last micro-batch's backward) for the four rows without pipelining, and no
interleaving for 39.1B and 1T, against the paper's Sec. 5.1 ("we use the interleaved pipeline
schedule with the scatter/gather optimization enabled").  README, *Known limitations*.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Iterator

from dml2comm import zoo
from dml2comm.analysis import Analysis, analyze_graph
from dml2comm.errors import ConfigError
from dml2comm.hardware.cluster import get_cluster
from dml2comm.ir.onnx_import import ImportOptions
from dml2comm.load import load_model_proto
from dml2comm.parallel.config import ParallelConfig
from dml2comm.validate.cases import Case, sample_indices, scaled_cluster
from dml2comm.validate.data import read_json

__all__ = ["MICRO_BATCH", "MICRO_BATCH_CANDIDATES", "SC21", "TABLE", "best_micro_batch", "cases", "eq3_flops", "model_chunks",
           "predict", "rows"]

#: The bundled table (``data/narayanan2021_table1.json``).
TABLE = "narayanan2021_table1.json"
MICRO_BATCH_CANDIDATES = (1, 2, 4, 8)
#: Outcome of :func:`best_micro_batch` (fastest micro-batch size that fits) per Table 1 row.
MICRO_BATCH = {
    "narayanan21_t1_1.7B": 8, "narayanan21_t1_3.6B": 8, "narayanan21_t1_7.5B": 8, "narayanan21_t1_18.4B": 8,
    "narayanan21_t1_39.1B": 4, "narayanan21_t1_76.1B": 2, "narayanan21_t1_145.6B": 2, "narayanan21_t1_310.1B": 1,
    "narayanan21_t1_529.6B": 1, "narayanan21_t1_1008.0B": 1,
}


#: NVIDIA/Megatron-LM ``examples/sc21/run_table_1.sh`` (the authors' scripts "used to produce the
#: results" of the paper, examples/sc21/README.md), per Table 1 row: (``MBS``, model chunks from
#: ``--num-layers-per-virtual-pipeline-stage`` or 1 without it, ``DDP=torch``).
SC21 = {
    "narayanan21_t1_1.7B": (16, 1, True), "narayanan21_t1_3.6B": (16, 1, True), "narayanan21_t1_7.5B": (16, 1, True),
    "narayanan21_t1_18.4B": (8, 1, True), "narayanan21_t1_39.1B": (4, 1, False), "narayanan21_t1_76.1B": (2, 3, False),
    "narayanan21_t1_145.6B": (2, 2, False), "narayanan21_t1_310.1B": (1, 2, False), "narayanan21_t1_529.6B": (1, 3, False),
    "narayanan21_t1_1008.0B": (1, 1, False),
}


def rows() -> Iterator[tuple[str, dict[str, Any], dict[str, Any], float]]:
    """(id, model, parallelism, measured TFLOP/s per GPU) per Table 1 row."""
    for r in read_json(TABLE):
        yield r["id"], r["model"], r["parallelism"], r["measured"]["tflops_per_gpu"]


def model_chunks(layers: int, p: int, m: int) -> int:
    """Model chunks per GPU of the interleaved schedule: the fewest (v >= 2) that split each
    stage's layers evenly; 1 (plain 1F1B) without pipelining or where Megatron-LM cannot
    interleave (m not a multiple of p, or a single layer per stage)."""
    if p == 1 or m % p or layers % p:
        return 1
    per_stage = layers // p
    return next((v for v in range(2, per_stage + 1) if per_stage % v == 0), 1)


def eq3_flops(m: dict[str, Any], global_batch: int) -> float:
    """Narayanan et al. 2021 eq. (3): FLOPs per iteration with full recomputation."""
    L, h, V, s = m["num_layers"], m["hidden_size"], m["vocab_size"], m["seq_len"]
    return 96 * global_batch * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))


def predict(m: dict[str, Any], par: dict[str, Any], micro_batch: int = 1, dtype: str = "fp16",
            grad_reduce_dtype: str | None = None, compute_scale: float = 1.0, chunks: int | None = None,
            overlap_grad_reduce: bool = False) -> tuple[float, Analysis]:
    """(TFLOP/s per GPU by eq. (3), the Analysis) of one Table 1 row at ``micro_batch``
    (``compute_scale``: :func:`~dml2comm.validate.cases.scaled_cluster`; ``chunks``: model
    chunks per GPU, default :func:`model_chunks`'s rule; ``overlap_grad_reduce``: PyTorch DDP's
    overlap of the gradient all-reduce with the backward, :data:`SC21`)."""
    L, h, a, V, s = m["num_layers"], m["hidden_size"], m["num_attention_heads"], m["vocab_size"], m["seq_len"]
    t, p, d, B = par["tensor"], par["pipeline"], par["data_derived"], par["global_batch"]
    model = zoo.build_gpt(layers=L, hidden=h, heads=a, vocab=V, seq_len=s, ffn_hidden=m.get("ffn_hidden_size"))
    imported = load_model_proto(model, ImportOptions(batch_size=micro_batch))
    v = model_chunks(L, p, B // (micro_batch * d)) if chunks is None else chunks
    config = ParallelConfig(dp_size=d, tp_size=t, pp_size=p, micro_batch_size=micro_batch, global_batch_size=B, seq_len=s,
                            recompute="full", schedule="interleaved" if v > 1 else "1f1b", virtual_stages=v,
                            overlap_grad_reduce=overlap_grad_reduce, async_tp_allreduce=False, grad_accumulation_fusion=False,
                            dtype=dtype, grad_reduce_dtype=grad_reduce_dtype)
    cluster = replace(get_cluster("dgx-a100", t * p * d), collective_overhead_s=0.0)  # as the CLI: kernel time
    analysis = analyze_graph(imported, config, scaled_cluster(cluster, compute_scale), advise=False, timeline=False)
    return eq3_flops(m, B) / analysis.summary["iteration_time_s"] / (t * p * d) / 1e12, analysis


def best_micro_batch(m: dict[str, Any], par: dict[str, Any]) -> tuple[int, float]:
    """(micro-batch size, TFLOP/s per GPU): the fastest of MICRO_BATCH_CANDIDATES that fits."""
    best = None
    per_replica = par["global_batch"] // par["data_derived"]
    for b in MICRO_BATCH_CANDIDATES:
        if per_replica % b:
            continue
        pred, analysis = predict(m, par, b)
        if analysis.summary["fits_in_memory"] and (best is None or pred > best[1]):
            best = (b, pred)
    if best is None:
        raise ConfigError(f"no micro-batch size in {MICRO_BATCH_CANDIDATES} fits in memory")
    return best


def cases(sample: int | None = None, compute_scale: float = 1.0) -> list[Case]:
    """One case per Table 1 row: TFLOP/s per GPU at the recorded micro-batch size."""
    table = list(rows())
    out = []
    for i in sample_indices(len(table), sample):
        name, m, par, measured = table[i]
        b = MICRO_BATCH[name]
        pred, _ = predict(m, par, b, compute_scale=compute_scale)
        v = model_chunks(m["num_layers"], par["pipeline"], par["global_batch"] // (b * par["data_derived"]))
        setup = (f"t={par['tensor']} p={par['pipeline']} d={par['data_derived']} b={b} v={v} "
                 f"B={par['global_batch']} fp16 full-recompute")
        out.append(Case("narayanan2021", name, "tflops_per_gpu", float(measured), pred, setup))
    return out
