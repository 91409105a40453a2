"""The sweep's evaluator: the analysis's summary numbers for many configurations at once.

The analysis of one configuration and the sweep read the same stage tables
(:class:`dml2comm.cost.stages.StageCoster`, on the per-layer tables of
:class:`dml2comm.cost.layers.LayerCoster`) and run them the same way (:func:`dml2comm.model.run.run_batches`,
the run ``analyze_graph`` reads too).  What this module adds is speed for many configurations:
:class:`FastEvaluator` keeps one coster per imported model and cluster (its caches shared by
every configuration of a sweep), runs all its configurations' plans in one call, and turns each
batch into summaries with :func:`dml2comm.cost.summary.breakdown` vectorised.

What it returns equals ``analyze_graph``'s summary on iteration time, memory and the breakdown
(``tests/test_search.py`` and ``tests/test_cpep.py`` check it against full runs, ZeRO 0-3,
``--tp-comm-overlap``, CP/EP, interleaving and send-bound pipelines included).
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

from dml2comm.cost.bands import summary_band
from dml2comm.cost.layers import NotRepeating
from dml2comm.cost.memory import allocator_capacity_bytes
from dml2comm.cost.ops import infer_seq_len
from dml2comm.cost.stages import StageCoster, StagePlan
from dml2comm.cost.summary import Summary, breakdown, summary_of
from dml2comm.errors import ConfigError
from dml2comm.model.run import Batch, run_batches
from dml2comm.parallel.config import ParallelConfig

__all__ = ["FastEvaluator", "NotRepeating", "supports"]


def supports(config: ParallelConfig) -> bool:
    """Whether the fast path covers ``config`` (else the full analysis evaluates it): every
    configuration since issue 17 (ZeRO 0-3, ``--tp-comm-overlap``, any context and expert
    parallelism and capacity factor); kept as the sweep's routing point."""
    return True


class FastEvaluator(StageCoster):
    """Summary numbers of configurations of one imported model on one cluster (module docstring)."""

    @functools.cached_property
    def seq_len(self) -> int | None:
        """Tokens per sample when a configuration has no ``--seq-len`` (tokens/s), as the analysis infers it."""
        return infer_seq_len(self.imported.graph)

    def evaluate(self, configs: Sequence[ParallelConfig]) -> list[Summary | dict[str, Any]]:
        """The :class:`~dml2comm.cost.summary.Summary` of each configuration (the analysis's,
        without the fields only its comm nodes give); raises nothing: a failed configuration
        gets ``{"error": message}``."""
        out: list[Summary | dict[str, Any] | None] = [None] * len(configs)
        plans: list[StagePlan] = []
        where: list[int] = []
        for i, config in enumerate(configs):
            try:
                plans.append(self.prepare(config))
            except ConfigError as exc:
                out[i] = {"error": " ".join(str(exc).split())}
                continue
            where.append(i)
        for batch in run_batches(plans):
            for j, summary in zip(batch.index, _summaries(batch, self, self.seq_len)):
                out[where[j]] = summary
        return out  # type: ignore[return-value]


def _summaries(batch: Batch, coster: StageCoster, seq_len: int | None) -> list[Summary]:
    """Each plan's summary from its batch's run: the breakdown of the analysis's summary,
    vectorised, and the expected error its analysis states (:func:`dml2comm.cost.bands.summary_band`)."""
    cluster = coster.cluster
    parts = breakdown(batch.iteration_s, batch.free_iteration_s, batch.free_compute_end_s, batch.free_busy_s)
    hbm = allocator_capacity_bytes(cluster.gpu.hbm_bytes)  # the GPU less the CUDA context, as the analysis
    peaks: dict[str, float] = {}
    out = []
    for k, (pr, iteration) in enumerate(zip(batch.plans, batch.iteration_s.tolist())):
        config = pr.config
        peak = peaks.get(config.dtype)
        if peak is None:
            peak = peaks[config.dtype] = cluster.gpu.peak_flops(config.dtype)
        error, source = summary_band(config, cluster, coster, pr, iteration, float(parts.exposed_comm_s[k]))
        out.append(summary_of(parts, k, iteration, flops_fwd_per_sample=pr.flops_fwd_per_sample,
                              global_batch_size=config.global_batch_size, num_gpus=config.num_gpus, peak_flops=peak,
                              seq_len=config.seq_len or seq_len, peak_memory_bytes=pr.peak_memory, capacity_bytes=hbm,
                              expected_error=error, expected_error_source=source))
    return out
