"""Predicted vs measured TFLOP/s per GPU on Narayanan et al. 2021 Table 1 (A100, V=51200,
s=2048, full recomputation, interleaved schedule).  TFLOP/s counts eq. (3)'s FLOPs, as the
paper does: F = 96 B s L h^2 (1 + s/(6h) + V/(16 L h)) per iteration.

Megatron-LM as the paper ran it: gradients accumulated and all-reduced in fp32
(--accumulate-allreduce-grads-in-fp32, required for bf16) after the backward pass (the overlap
came in 2023).  Assumptions the table does not state: micro-batch size 1 and 2 model chunks per
GPU (interleaving) where p > 1 and the layers divide.

    .venv/bin/python benchmarks/bench_narayanan.py
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
import time
from pathlib import Path

from dml2comm import zoo
from dml2comm.analysis import analyze_graph
from dml2comm.hardware.cluster import get_cluster
from dml2comm.ir.onnx_import import ImportOptions, load_model_proto
from dml2comm.parallel.config import ParallelConfig

TABLE = Path(__file__).resolve().parents[2] / "shared" / "data" / "narayanan2021_table1.json"


def rows():
    for r in json.loads(TABLE.read_text()):
        m, p = r["model"], r["parallelism"]
        yield r["id"], m, p, r["measured"]["tflops_per_gpu"]


def predict(m, par, micro_batch=1, chunks=2):
    L, h, a, V, s = m["num_layers"], m["hidden_size"], m["num_attention_heads"], m["vocab_size"], m["seq_len"]
    t, p, d, B = par["tensor"], par["pipeline"], par["data_derived"], par["global_batch"]
    model = zoo.build_gpt(layers=L, hidden=h, heads=a, vocab=V, seq_len=s)
    imported = load_model_proto(model, ImportOptions(batch_size=micro_batch))
    v = chunks if p > 1 and (B // (micro_batch * d)) % p == 0 and L % (p * chunks) == 0 else 1
    config = ParallelConfig(dp_size=d, tp_size=t, pp_size=p, micro_batch_size=micro_batch, global_batch_size=B, seq_len=s,
                            recompute="full", schedule="interleaved" if v > 1 else "1f1b", virtual_stages=v,
                            overlap_grad_reduce=False, grad_reduce_dtype="fp32")
    cluster = replace(get_cluster("dgx-a100", t * p * d), collective_overhead_s=0.0)  # as the CLI: kernel time
    analysis = analyze_graph(imported, config, cluster, advise=False)
    flops = 96 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))
    return flops / analysis.summary["iteration_time_s"] / (t * p * d) / 1e12, analysis


def main() -> None:
    errors = []
    print(f"{'model':24s} {'t':>2s} {'p':>3s} {'d':>3s} {'measured':>9s} {'predicted':>9s} {'error':>7s} {'s':>5s}")
    for name, m, par, measured in rows():
        start = time.perf_counter()
        pred, _ = predict(m, par)
        err = pred / measured - 1
        errors.append(abs(err))
        print(f"{name:24s} {par['tensor']:2d} {par['pipeline']:3d} {par['data_derived']:3d} {measured:9.0f} {pred:9.1f} {err:+7.1%} {time.perf_counter() - start:5.1f}")
        sys.stdout.flush()
    print(f"mean |error| {sum(errors) / len(errors):.1%}, worst {max(errors):.1%}")


if __name__ == "__main__":
    main()
