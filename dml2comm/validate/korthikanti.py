"""Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models",
MLSys 2023, arXiv:2205.05198) Table 4: the forward and backward time of one transformer layer
of the 22B model (Table 3: 64 heads, h = 6144, s = 2048, t = 8 on one DGX A100, micro-batch 4),
in five variants: baseline, sequence parallelism, full recomputation, selective
recomputation, selective recomputation with sequence parallelism.

The tool's time of one layer is read as the analysis reports it, per micro-batch on one GPU:
the stage's forward (backward, with its recomputation) time of the zoo GPT with two
transformer layers minus that of the same GPT with one.  The difference is one layer's
compute plus its tensor-parallel collectives; the embedding, the LM head and the input read
cancel.  bf16 (the paper: mixed precision; A100 fp16 and bf16 peaks are equal), collectives at
kernel time (overhead 0, as the main command).
"""

from __future__ import annotations

import dataclasses
from functools import lru_cache
from typing import Any

from dml2comm import zoo
from dml2comm.analysis import analyze_graph
from dml2comm.hardware.cluster import get_cluster
from dml2comm.ir.onnx_import import ImportOptions, ImportResult
from dml2comm.load import load_model_proto
from dml2comm.parallel.config import ParallelConfig
from dml2comm.validate.cases import Case, sample_indices, scaled_cluster
from dml2comm.validate.data import read_json

__all__ = ["FILE", "cases", "layer_times"]

FILE = "korthikanti2022_table4.json"


@lru_cache(maxsize=None)
def _imported(layers: int, hidden: int, heads: int, vocab: int, seq_len: int, micro_batch: int) -> ImportResult:
    model = zoo.build_gpt(layers=layers, hidden=hidden, heads=heads, vocab=vocab, seq_len=seq_len)
    return load_model_proto(model, ImportOptions(batch_size=micro_batch))


def layer_times(table: dict[str, Any], row: dict[str, Any], compute_scale: float = 1.0) -> tuple[float, float]:
    """(forward, backward) seconds of one transformer layer per micro-batch, by the analysis."""
    m, par = table["model"], table["parallelism"]
    t, b = par["tensor"], par["micro_batch"]
    config = ParallelConfig(dp_size=par["data"], tp_size=t, pp_size=par["pipeline"], micro_batch_size=b, global_batch_size=b,
                            seq_len=m["seq_len"], dtype="bf16", recompute=row["recompute"],
                            sequence_parallel=row["sequence_parallel"])
    cluster = dataclasses.replace(get_cluster("dgx-a100", t), collective_overhead_s=0.0)
    times = []
    for layers in (1, 2):
        imported = _imported(layers, m["hidden_size"], m["num_attention_heads"], m["vocab_size"], m["seq_len"], b)
        analysis = analyze_graph(imported, config, scaled_cluster(cluster, compute_scale), advise=False, timeline=False)
        (stage,) = analysis.stages
        times.append((stage.time_fwd_s, stage.time_bwd_s))
    return times[1][0] - times[0][0], times[1][1] - times[0][1]


def cases(sample: int | None = None, compute_scale: float = 1.0) -> list[Case]:
    """Two cases per Table 4 row: the layer's forward and backward time."""
    table = read_json(FILE)
    out = []
    for i in sample_indices(len(table["rows"]), sample):
        row = table["rows"][i]
        fwd, bwd = layer_times(table, row, compute_scale)
        setup = (f"t={table['parallelism']['tensor']} b={table['parallelism']['micro_batch']} s={table['model']['seq_len']} "
                 f"recompute={row['recompute']}" + (" sp" if row["sequence_parallel"] else ""))
        key = row["experiment"].lower().replace(" + ", "+").replace(" ", "_")
        out.append(Case("korthikanti2022", f"{key}/forward", "layer_forward_time_s", row["forward_ms"] / 1e3, fwd, setup))
        out.append(Case("korthikanti2022", f"{key}/backward", "layer_backward_time_s", row["backward_ms"] / 1e3, bwd, setup))
    return out
