"""Held-out check of the compute model: predicted vs published TFLOP/s per GPU on published A100
runs that were NOT used to calibrate it (benchmarks/data/heldout_runs.json, each run with its
source).  Nothing is tuned to these numbers; the calibration is bench_narayanan.py (Table 1).

Runs: Narayanan et al. 2021 Table 2, PTD-P rows (GPT-3 175B on 384/768/1536 GPUs and the
529.6B model on 560/1120/2240 GPUs, micro-batch size 1 as published).  They are costed with
bench_narayanan.py's Megatron-LM 2021 setup (fp16 with fp16 gradient all-reduce after the
backward pass, full recomputation, interleaved schedule with the fewest chunks that split the
stage evenly), t = 8 and p = model-parallel size / 8 (the paper's heuristic; Table 2 gives the
model-parallel size only).  TFLOP/s counts the paper's eq. (3).

Second set: Korthikanti et al. 2022 Table 5 (benchmarks/data/heldout_korthikanti2022.json),
end-to-end iteration times of the Megatron-LM of 2022 on 8-2,240 A100s for four GPT models
(22B, 175B, 530B, 1T; Table 3's t, p, batch and micro-batch as published), each with full
recomputation and with the paper's sequence parallelism + selective recomputation, and the 530B
model with 8-way data parallelism (Sec. 6.3).  Costed with the 2022 code's semantics: bf16 with
fp32 gradient all-reduce (Megatron forces --accumulate-allreduce-grads-in-fp32 for bf16), the
asynchronous tensor-parallel all-reduce in backward (Sec. 6.2: "we overlap all-reduce
communication with the linear weight's gradient computation") and fused weight-gradient
accumulation (the tool's defaults), the gradient all-reduce after the backward pass (Sec. 6.3:
"we do not use any overlapping"), interleaving with three chunks for 175B and 530B (Sec. 6).
Only Table 4 (one layer of the 22B model) of that paper is a calibration source; Table 5 is not.

Third set: vTrain's multi-node runs (benchmarks/data/heldout_vtrain_multi.csv, provenance in
heldout_vtrain_multi.json): 109 measured iteration times of Megatron-DeepSpeed GPT training
(3.6B, 18.4B, 39.1B and 175B models, s = 2048) on 64-512 A100s in nodes of eight with 800 Gb/s
of network per node.  Costed exactly as the single-node calibration set
(:func:`dml2comm.validate.vtrain.predict`: fp16, full recomputation, 1F1B, no gradient overlap)
on ``dgx-a100`` with 4 NICs per node (``--nics-per-node 4``: 4 x 200 Gb/s = the runs' 800 Gb/s).
vTrain's single-node runs are a calibration source; these are not.

    .venv/bin/python benchmarks/bench_heldout.py
"""

from __future__ import annotations

import csv
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_narayanan import model_chunks, predict  # noqa: E402

from dml2comm import zoo  # noqa: E402
from dml2comm.analysis import analyze_graph  # noqa: E402
from dml2comm.hardware.cluster import get_cluster  # noqa: E402
from dml2comm.ir.onnx_import import ImportOptions  # noqa: E402
from dml2comm.load import load_model_proto  # noqa: E402
from dml2comm.parallel.config import ParallelConfig  # noqa: E402
from dml2comm.validate import vtrain  # noqa: E402

RUNS = Path(__file__).resolve().parent / "data" / "heldout_runs.json"
RUNS_2022 = Path(__file__).resolve().parent / "data" / "heldout_korthikanti2022.json"
RUNS_VTRAIN_MULTI = Path(__file__).resolve().parent / "data" / "heldout_vtrain_multi.csv"
#: The runs' 800 Gb/s of network per node (their configs' ``inter_node_bandwidth``) as 200 Gb/s NICs.
VTRAIN_MULTI_NICS = 4


def runs():
    for r in json.loads(RUNS.read_text())["runs"]:
        yield r["id"], r["model"], r["parallelism"], r["measured"]["tflops_per_gpu"]


def predict_2022(m: dict, par: dict) -> float:
    """Predicted iteration time (s) of one Korthikanti 2022 Table 5 run (module docstring)."""
    t, p, d, b, v = par["tensor"], par["pipeline"], par["data"], par["micro_batch"], par["virtual_stages"]
    model = zoo.build_gpt(layers=m["num_layers"], hidden=m["hidden_size"], heads=m["num_attention_heads"],
                          vocab=m["vocab_size"], seq_len=m["seq_len"])
    imported = load_model_proto(model, ImportOptions(batch_size=b))
    config = ParallelConfig(dp_size=d, tp_size=t, pp_size=p, micro_batch_size=b, global_batch_size=par["global_batch"],
                            seq_len=m["seq_len"], recompute=par["recompute"], sequence_parallel=par["sequence_parallel"],
                            schedule="interleaved" if v > 1 else "1f1b", virtual_stages=v,
                            overlap_grad_reduce=par["grad_allreduce_overlap"], dtype="bf16", grad_reduce_dtype="fp32")
    cluster = replace(get_cluster("dgx-a100", t * p * d), collective_overhead_s=0.0)  # as the CLI: kernel time
    analysis = analyze_graph(imported, config, cluster, advise=False, timeline=False)
    return analysis.summary["iteration_time_s"]


def main_2022() -> list[float]:
    errors = []
    print(f"\n{'run (Korthikanti 2022 Table 5)':40s} {'t':>2s} {'p':>3s} {'d':>2s} {'v':>2s} {'published':>9s} {'predicted':>9s} {'error':>7s} {'s':>5s}")
    for r in json.loads(RUNS_2022.read_text())["runs"]:
        start = time.perf_counter()
        par = r["parallelism"]
        pred = predict_2022(r["model"], par)
        published = r["measured"]["iteration_time_s"]
        err = pred / published - 1
        errors.append(abs(err))
        print(f"{r['id']:40s} {par['tensor']:2d} {par['pipeline']:3d} {par['data']:2d} {par['virtual_stages']:2d} {published:8.2f}s "
              f"{pred:8.2f}s {err:+7.1%} {time.perf_counter() - start:5.1f}")
        sys.stdout.flush()
    print(f"mean |error| {sum(errors) / len(errors):.1%}, worst {max(errors):.1%}")
    return errors


def main_vtrain_multi() -> list[float]:
    """vTrain's multi-node runs: per model size and overall mean |error|, signed mean, worst runs."""
    start = time.perf_counter()
    with RUNS_VTRAIN_MULTI.open(newline="") as f:
        table = vtrain.read_runs(csv.DictReader(f))
    pred = vtrain.predict(table, range(len(table)), nics_per_node=VTRAIN_MULTI_NICS)
    errors = [pred[i] / r["time_s"] - 1 for i, r in enumerate(table)]
    print(f"\n{'runs (vTrain multi-node, Megatron-DeepSpeed)':46s} {'runs':>4s} {'GPUs':>4s} {'mean |error|':>12s} {'signed':>7s} {'worst':>7s}")
    by_width: dict[tuple[int, int], list[float]] = {}
    for r, e in zip(table, errors):
        by_width.setdefault((r["h"], r["gpus"]), []).append(e)
    for (h, gpus), e in sorted(by_width.items()):
        print(f"{'h=' + str(h):46s} {len(e):4d} {gpus:4d} {sum(map(abs, e)) / len(e):12.1%} {sum(e) / len(e):+7.1%} "
              f"{max(e, key=abs):+7.1%}")
    worst = sorted(range(len(table)), key=lambda i: -abs(errors[i]))[:5]
    for i in worst:
        r = table[i]
        print(f"  worst: h={r['h']} t={r['t']} d={r['d']} p={r['p']} b={r['b']}: measured {r['time_s']:.2f}s, "
              f"predicted {pred[i]:.2f}s ({errors[i]:+.1%})")
    absolute = [abs(e) for e in errors]
    print(f"mean |error| {sum(absolute) / len(absolute):.1%}, median {sorted(absolute)[len(absolute) // 2]:.1%}, "
          f"signed {sum(errors) / len(errors):+.1%}, worst {max(absolute):.1%} ({time.perf_counter() - start:.1f} s)")
    return absolute


def main() -> None:
    errors = []
    print(f"{'run':36s} {'t':>2s} {'p':>3s} {'d':>3s} {'b':>2s} {'v':>2s} {'published':>9s} {'predicted':>9s} {'error':>7s} {'s':>5s}")
    for name, m, par, published in runs():
        start = time.perf_counter()
        b = par["micro_batch"]
        pred, _ = predict(m, par, b)
        v = model_chunks(m["num_layers"], par["pipeline"], par["global_batch"] // (b * par["data_derived"]))
        err = pred / published - 1
        errors.append(abs(err))
        print(f"{name:36s} {par['tensor']:2d} {par['pipeline']:3d} {par['data_derived']:3d} {b:2d} {v:2d} {published:9.0f} "
              f"{pred:9.1f} {err:+7.1%} {time.perf_counter() - start:5.1f}")
        sys.stdout.flush()
    print(f"mean |error| {sum(errors) / len(errors):.1%}, worst {max(errors):.1%}")
    main_2022()
    main_vtrain_multi()


if __name__ == "__main__":
    main()
