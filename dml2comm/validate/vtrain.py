"""vTrain's single-node validation runs (Bang et al., MICRO-57 2024, arXiv:2312.12391;
repository VIA-Research/vTrain, ``config/validation/single``): 1,440 Megatron-DeepSpeed GPT
runs on 2-8 A100s of one DGX node, measured iteration time.

How each run is modelled (its config file: ``max_length`` 1024, ``use_checkpoint: true``,
``pipeline_scheduling: "1f1b"``, ``use_gradient_bucket: false``, ``node_size`` 8):

- the zoo GPT (:func:`dml2comm.zoo.build_gpt`: learned positions, tied LM head, 4h MLP) at the
  run's hidden size, heads and layers, s = 1024;
- vocabulary: GPT-2's 50,257 tokens (vTrain's ``vocab_size`` default, its GPT-2 BPE), padded as
  Megatron(-DeepSpeed) pads it: to a multiple of 128 x t (``_vocab_size_with_padding``,
  ``--make-vocab-size-divisible-by`` 128): 50,304 / 50,432 / 50,688 / 51,200 for t = 1 / 2 / 4 / 8;
- fp16 (vTrain's profiled model runs in half precision, as Megatron-DeepSpeed's GPT examples
  with ``--fp16``; on A100 the fp16 and bf16 peaks are equal);
- full recomputation, 1F1B, the run's micro-batch size (with p = 1 the micro-batches are
  gradient-accumulation steps: iteration times grow with B / (b d) as measured), gradients
  all-reduced after the backward pass (no bucketing: ``overlap_grad_reduce=False``);
- one DGX A100 node (``dgx-a100``, t d p GPUs), collectives at kernel time (overhead 0, as the
  main command and the sweep).

The runs are evaluated by the sweep's fast evaluator (:class:`~dml2comm.model.FastEvaluator`):
one import per (shape, t, micro-batch), all its runs of one GPU count in one call.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from functools import lru_cache
from typing import Iterable

from dml2comm import zoo
from dml2comm.hardware.cluster import get_cluster
from dml2comm.ir.onnx_import import ImportOptions, ImportResult
from dml2comm.load import load_model_proto
from dml2comm.parallel.config import ParallelConfig
from dml2comm.model import FastEvaluator, NotRepeating
from dml2comm.validate.cases import Case, sample_indices, scaled_cluster
from dml2comm.validate.data import read_csv

__all__ = ["FILE", "SEQ_LEN", "VOCAB", "cases", "clear_cache", "padded_vocab", "predict", "read_runs", "runs"]

FILE = "vtrain_ground_truth_single.csv"
SEQ_LEN = 1024
#: GPT-2's BPE vocabulary (vTrain ``vTrainConfig.vocab_size`` default).
VOCAB = 50257
#: Megatron's ``--make-vocab-size-divisible-by`` default.
VOCAB_DIVISOR = 128


def padded_vocab(vocab: int, t: int) -> int:
    """Megatron-LM's ``_vocab_size_with_padding``: the next multiple of 128 t."""
    multiple = VOCAB_DIVISOR * t
    return -(-vocab // multiple) * multiple


def read_runs(rows: Iterable[dict[str, str]]) -> list[dict[str, int | float]]:
    """vTrain's ground-truth rows (its CSV columns) as h, a, L, t, d, p, b, B, GPUs, s and the
    measured time in seconds."""
    out = []
    for r in rows:
        out.append({"h": int(r["hidden size"]), "a": int(r["attention heads"]), "L": int(r["# layers"]),
                    "t": int(r["tensor parallelism"]), "d": int(r["data parallelism"]), "p": int(r["pipeline parallelism"]),
                    "b": int(r["micro batch"]), "B": int(r["global batch"]), "gpus": int(r["# GPUs"]),
                    "s": int(r["sequence length"]), "time_s": float(r["iteration time (ms)"]) * 1e-3})
    return out


def runs() -> list[dict[str, int | float]]:
    """The bundled single-node runs (:func:`read_runs`)."""
    return read_runs(read_csv(FILE))


@lru_cache(maxsize=None)
def _imported(h: int, a: int, L: int, t: int, b: int, s: int = SEQ_LEN) -> ImportResult:
    """The zoo GPT of one shape at one micro-batch size and sequence length (cached: the import
    does not depend on the compute constant, so a refit re-imports nothing)."""
    model = zoo.build_gpt(layers=L, hidden=h, heads=a, vocab=padded_vocab(VOCAB, t), seq_len=s)
    return load_model_proto(model, ImportOptions(batch_size=b))


def clear_cache() -> None:
    """Forget the imported models (and the op times cached on them): needed after changing a
    module-level default the caches do not key on (``dml2comm.cost.host.DEFAULT`` in
    ``benchmarks/host_vtrain.py``)."""
    _imported.cache_clear()


def _config(run: dict) -> ParallelConfig:
    return ParallelConfig(dp_size=run["d"], tp_size=run["t"], pp_size=run["p"], micro_batch_size=run["b"],
                          global_batch_size=run["B"], seq_len=run["s"], dtype="fp16", schedule="1f1b", recompute="full",
                          overlap_grad_reduce=False)


def predict(table: list[dict[str, int | float]], indices: Iterable[int], *, nics_per_node: int | None = None,
            compute_scale: float = 1.0) -> dict[int, float]:
    """Predicted iteration time (seconds) of the runs ``table[i]`` for ``i`` in ``indices``, each
    modelled as the module docstring says, on DGX A100 nodes (``nics_per_node``: the cluster's
    NICs per node where it is not the preset's 8, as ``--nics-per-node``).  Runs of one shape,
    t, micro-batch, sequence length and GPU count share one import and one
    :class:`~dml2comm.model.FastEvaluator` call."""
    groups: dict[tuple, list[int]] = defaultdict(list)
    for i in indices:
        r = table[i]
        if r["t"] * r["d"] * r["p"] != r["gpus"]:
            raise ValueError(f"vTrain row {i}: t*d*p != GPUs")  # the bundled files are fixed
        groups[(r["h"], r["a"], r["L"], r["t"], r["b"], r["s"], r["gpus"])].append(i)
    predicted: dict[int, float] = {}
    for (h, a, L, t, b, s, gpus), members in sorted(groups.items()):
        cluster = dataclasses.replace(get_cluster("dgx-a100", gpus, nics_per_node=nics_per_node), collective_overhead_s=0.0)
        imported = _imported(h, a, L, t, b, s)
        configs = [_config(table[i]) for i in members]
        try:
            summaries = FastEvaluator(imported, scaled_cluster(cluster, compute_scale)).evaluate(configs)
        except NotRepeating:  # as the sweep: the collapsed model does not hold, use the whole one
            summaries = FastEvaluator(imported, scaled_cluster(cluster, compute_scale), collapse=False).evaluate(configs)
        for i, summary in zip(members, summaries):
            if summary.get("error"):
                raise ValueError(f"vTrain row {i} failed: {summary['error']}")
            predicted[i] = summary["iteration_time_s"]
    return predicted


def cases(sample: int | None = None, compute_scale: float = 1.0) -> list[Case]:
    """One case per run (a deterministic sample of at most ``sample``): iteration time."""
    table = runs()
    picked = sample_indices(len(table), sample)
    for i in picked:
        if table[i]["s"] != SEQ_LEN:
            raise ValueError(f"vTrain row {i}: seq != {SEQ_LEN}")  # the bundled file is fixed
    predicted = predict(table, picked, compute_scale=compute_scale)
    out = []
    for i in picked:
        r = table[i]
        setup = f"h={r['h']} a={r['a']} L={r['L']} t={r['t']} d={r['d']} p={r['p']} b={r['b']} B={r['B']}"
        out.append(Case("vtrain", f"vtrain_{i:04d}", "iteration_time_s", r["time_s"], predicted[i], setup))
    return out
