"""Evaluate many configurations of one model: ``run_sweep`` and its ranking.

Configurations are evaluated by the fast path (:mod:`dml2comm.model`: the analysis's
numbers from per-layer parts shared across configurations, simulated in batches) where it
applies, else by :func:`dml2comm.analysis.analyze_graph` (``advise=False``) as the
single-configuration command does; either way a sweep's number for a configuration is the number
``python main.py MODEL --d .. --t .. --p ..`` reports (the tests hold the two paths together).
The model is imported once per micro-batch size (the batch axis is bound at import) in each
process.  Work goes out in chunks that keep the configurations sharing tables together.

Chunks run on an executor (:mod:`dml2comm.executors`).  Locally (``workers > 1``) they are
forked processes (:mod:`dml2comm.search.workers`): they inherit the imported model and the
configurations, each starts on its own chunks (grouped so that shared tables are built once)
and takes over others' at the end.  On Dask, each worker builds the evaluator once
(:func:`sweep_evaluator`, from the model's path) on its first chunk and keeps it for the
sweep's other chunks, which are dealt out by the same affinity groups.  Either way only plain
result dicts come back (``Analysis`` objects hold an ``OpGraph`` and are not sent back).  Results are handed to
``on_result`` as they arrive, so a caller can stream them to disk; Ctrl-C (or a callback that
raises ``KeyboardInterrupt``) stops the sweep and returns what finished, marked ``interrupted``.
"""

from __future__ import annotations

import csv
from fractions import Fraction
import functools
import gc
import io
import operator
import time
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence, TextIO

import onnx

from dml2comm.cost.summary import Summary
from dml2comm.errors import Dml2CommError
from dml2comm.gc_tuning import collect_rarely
from dml2comm.hardware.cluster import Cluster
from dml2comm.ir.onnx_import import ImportOptions, ImportResult, check_seq_len
from dml2comm.load import load_model, load_model_proto
from dml2comm.parallel.config import ParallelConfig
from dml2comm.search.space import Constraints, enumerate_configs

if TYPE_CHECKING:
    from dml2comm.cost.stages import Pricing
    from dml2comm.executors import Executor

__all__ = ["SweepSpace", "SweepResult", "Evaluator", "run_sweep", "model_shape", "pareto_front", "CSV_COLUMNS",
           "csv_row", "CsvStream", "sweep_evaluator", "evaluate_chunk", "HEADROOM_CAUTION_FRACTION", "headroom_caution"]

#: Metrics recorded per configuration (besides its config dict).
METRICS = ("iteration_time_s", "tflops_per_gpu", "mfu", "peak_memory_bytes", "fits", "bubble_fraction",
           "exposed_comm_time_s", "compute_time_s", "bubble_time_s", "optimizer_time_s", "expected_error")
#: Configuration fields shown in tables and the CSV.
CONFIG_COLUMNS = ("d", "t", "p", "c", "e", "micro_batch_size", "num_micro_batches", "schedule", "virtual_stages",
                  "zero_stage", "recompute", "sequence_parallel")
CSV_COLUMNS = ("index",) + CONFIG_COLUMNS + METRICS + ("error",)
#: A :class:`Summary`'s values of :data:`METRICS` (``fits``: its ``fits_in_memory``), in that order.
_SUMMARY_METRICS = operator.attrgetter(*("fits_in_memory" if k == "fits" else k for k in METRICS))


@dataclass(frozen=True)
class SweepSpace:
    """What to sweep: the batch, the sequence length and the constraints on the configuration.

    ``seq_len`` ``None``: the model's own (axis 1 of its integer input, as the main command reads it).
    """

    global_batch_size: int
    seq_len: int | None = None
    constraints: Constraints = field(default_factory=Constraints)
    dims: tuple[tuple[str, int], ...] = ()


def model_shape(imported: ImportResult) -> dict[str, Any]:
    """Layer count, attention heads, sequence length and experts per MoE layer (None: no
    experts) of an imported model (what the space needs)."""
    from dml2comm.cost.cache import layers_of
    from dml2comm.parallel.expert import find_moe
    from dml2comm.parallel.tensor import attention_heads

    graph = imported.graph
    heads, kv_heads = attention_heads(graph)
    seq = None
    for name in graph.inputs:
        tensor = graph.tensors[name]
        if not tensor.dtype.is_float and tensor.rank == 2:
            seq = tensor.shape[1]
            break
    layered = layers_of(graph)  # the fast path's collapse reuses it
    moe = find_moe(graph, layered.layer_of_op)
    return {"layers": len(layered.layers), "heads": heads, "kv_heads": kv_heads, "seq_len": seq,
            "experts": moe.experts if moe is not None else None}


def config_from_dict(data: Mapping[str, Any]) -> ParallelConfig:
    """Rebuild a :class:`ParallelConfig` from :meth:`ParallelConfig.to_dict` output."""
    names = {f.name for f in fields(ParallelConfig)}
    kwargs = {k: v for k, v in data.items() if k in names}
    kwargs.update(dp_size=data["d"], tp_size=data["t"], pp_size=data["p"], cp_size=data.get("c", 1), ep_size=data.get("e", 1))
    if data.get("grad_reduce_dtype") == ("fp32" if data.get("precision") == "amp" else data.get("dtype")):
        kwargs["grad_reduce_dtype"] = None
    return ParallelConfig(**kwargs)


class Evaluator:
    """Analyses configurations of one model; caches one import per micro-batch and one cluster per size."""

    def __init__(self, model_path: str, cluster_builder: Callable[[int], Cluster], dims: Sequence[tuple[str, int]] = (),
                 seq_len: int | None = None) -> None:
        self.model_path = str(model_path)
        self.cluster_builder = cluster_builder
        self.dims = dict(dims)
        self.seq_len = seq_len
        self._imports: dict[int, ImportResult] = {}
        self._clusters: dict[int, Cluster] = {}
        self._pricings: dict[int, Pricing] = {}  # per cluster size: its prices, shared by the micro-batch sizes' evaluators
        self._fast: dict[int, Any] = {}
        self._reduced: tuple[Any, Any] | None = None  # (collapsed ONNX model, Collapsed) from prepare_fast

    def imported(self, micro_batch: int) -> ImportResult:
        if micro_batch not in self._imports:
            options = ImportOptions(batch_size=micro_batch, seq_len=self.seq_len, dims=dict(self.dims))
            imported = load_model(self.model_path, options)
            check_seq_len(imported, self.seq_len)  # as the single analysis: never ignored silently
            self._imports[micro_batch] = imported
        return self._imports[micro_batch]

    def prepare_fast(self, micro_batch: int) -> None:
        """Find the collapsed model (:mod:`dml2comm.ir.repeats`) on the import of ``micro_batch``
        so that other micro-batch sizes import only the collapsed model (called before the
        workers fork: they inherit it, and the validation runs every row's expected error reads:
        :func:`dml2comm.cost.bands.load_bands`, about 13 ms to parse per process)."""
        from dml2comm.cost.bands import load_bands
        from dml2comm.cost.cache import collapsed_of
        from dml2comm.ir.repeats import reduced_model

        load_bands()
        full = self.imported(micro_batch).graph
        collapsed = collapsed_of(full)
        if collapsed is None:
            return
        try:
            proto = onnx.load(self.model_path, load_external_data=False)
        except Exception:  # noqa: BLE001 - the full import read it; a second read failing only costs speed
            return
        reduced = reduced_model(proto, full, collapsed)
        if reduced is not None:
            self._reduced = (reduced, collapsed)

    def fast_evaluator(self, micro_batch: int, num_gpus: int):
        """The fast path's evaluator for ``micro_batch``: on the collapsed model when
        :meth:`prepare_fast` found one and its import groups into the same layers."""
        from dml2comm.cost.cache import layers_of
        from dml2comm.ir.repeats import matches, rebind
        from dml2comm.model import FastEvaluator

        fe = self._fast.get(micro_batch)
        if fe is not None:
            return fe
        cluster = self.cluster(num_gpus)
        if self._reduced is not None and micro_batch not in self._imports:
            proto, collapsed = self._reduced
            options = ImportOptions(batch_size=micro_batch, seq_len=self.seq_len, dims=dict(self.dims))
            try:
                imported = load_model_proto(proto, options, name=Path(self.model_path).stem)
                layered = layers_of(imported.graph)  # the fused kernels read it too (cost.ops.fused_kernels)
            except Dml2CommError:
                imported = None
            if imported is not None and matches(collapsed, layered):
                fe = FastEvaluator(imported, cluster, collapsed=rebind(collapsed, imported.graph, layered),
                                   pricing=self.pricing(num_gpus))
        if fe is None:
            fe = FastEvaluator(self.imported(micro_batch), cluster, pricing=self.pricing(num_gpus))
        self._fast[micro_batch] = fe
        return fe

    def cluster(self, num_gpus: int) -> Cluster:
        if num_gpus not in self._clusters:
            self._clusters[num_gpus] = self.cluster_builder(num_gpus)
        return self._clusters[num_gpus]

    def pricing(self, num_gpus: int) -> Pricing:
        """The prices of the cluster of ``num_gpus`` (:class:`~dml2comm.cost.stages.Pricing`),
        one for every micro-batch size's fast evaluator."""
        from dml2comm.cost.stages import Pricing

        if num_gpus not in self._pricings:
            self._pricings[num_gpus] = Pricing(self.cluster(num_gpus))
        return self._pricings[num_gpus]

    def analyze(self, config: ParallelConfig):
        """The full :class:`~dml2comm.analysis.Analysis` (no advice); raises on an invalid config."""
        from dml2comm.analysis import analyze_graph

        return analyze_graph(self.imported(config.micro_batch_size), config, self.cluster(config.num_gpus),
                             self.model_path, advise=False, timeline=False)

    def evaluate_many(self, configs: Sequence[ParallelConfig], fast: bool = True) -> list[dict[str, Any]]:
        """Result rows for ``configs`` (one micro-batch size or several): the fast path
        (:mod:`dml2comm.model`) for what it covers, the full analysis for the rest."""
        from dml2comm.model import FastEvaluator, NotRepeating, supports

        rows: list[dict[str, Any] | None] = [None] * len(configs)
        by_batch: dict[int, list[int]] = {}
        for i, config in enumerate(configs):
            if fast and supports(config):
                by_batch.setdefault(config.micro_batch_size, []).append(i)
            else:
                rows[i] = self.evaluate(config)
        for b, indices in by_batch.items():
            batch = [configs[i] for i in indices]
            try:
                fe = self.fast_evaluator(b, batch[0].num_gpus)
                try:
                    summaries = fe.evaluate(batch)
                except NotRepeating:  # the collapsed model does not hold: the whole model
                    fe = self._fast[b] = FastEvaluator(self.imported(b), self.cluster(batch[0].num_gpus), collapse=False,
                                                       pricing=self.pricing(batch[0].num_gpus))
                    summaries = fe.evaluate(batch)
            except Dml2CommError as exc:  # the model cannot be bound to this micro-batch
                for i in indices:
                    rows[i] = self._failed(configs[i], exc)
                continue
            for i, summary in zip(indices, summaries):
                rows[i] = self._row(configs[i], summary)
        return rows  # type: ignore[return-value]

    @staticmethod
    def _failed(config: ParallelConfig, exc: Exception) -> dict[str, Any]:
        row: dict[str, Any] = {"config": config.to_dict(), **{k: None for k in METRICS}}
        row["error"] = " ".join(str(exc).split())
        row["fits"] = False
        return row

    @staticmethod
    def _row(config: ParallelConfig, summary: Mapping[str, Any]) -> dict[str, Any]:
        """A result row from a :class:`~dml2comm.cost.summary.Summary` (or ``{"error": ...}``);
        the CSV's ``fits`` column is the summary's ``fits_in_memory``."""
        if type(summary) is Summary:  # the fast path's (it has no error): its fields read as attributes, in C
            row = {"config": config.to_dict(), "error": None, **dict(zip(METRICS, _SUMMARY_METRICS(summary)))}
            row["fits"] = bool(row["fits"])
            return row
        row: dict[str, Any] = {"config": config.to_dict(), "error": summary.get("error"), **{k: None for k in METRICS}}
        if row["error"] is not None:
            row["fits"] = False
            return row
        row.update({k: summary[k] for k in METRICS if k != "fits"})
        row["fits"] = bool(summary["fits_in_memory"])
        return row

    def evaluate(self, config: ParallelConfig) -> dict[str, Any]:
        """One result row: ``config`` (its dict), the metrics, and ``error`` (None, or why it failed)."""
        row: dict[str, Any] = {"config": config.to_dict(), "error": None, **{k: None for k in METRICS}}
        try:
            analysis = self.analyze(config)
        except Dml2CommError as exc:
            row["error"] = " ".join(str(exc).split())
            row["fits"] = False
            return row
        return self._row(config, analysis.summary)  # the summary's own TFLOP/s (dml2comm.cost.summary)


@dataclass
class SweepResult:
    """Rows in enumeration order (``row["index"]``); failed rows carry ``error``."""

    rows: list[dict[str, Any]]
    num_configs: int
    seconds: float
    interrupted: bool = False
    model: dict[str, Any] = field(default_factory=dict)

    @property
    def evaluated(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if r["error"] is None]

    @property
    def failed(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if r["error"] is not None]

    def ranked(self) -> list[dict[str, Any]]:
        """Fitting configurations, fastest first (ties: enumeration order)."""
        return sorted((r for r in self.evaluated if r["fits"]), key=lambda r: (r["iteration_time_s"], r["index"]))

    @property
    def best(self) -> dict[str, Any] | None:
        ranked = self.ranked()
        return ranked[0] if ranked else None

    def top(self, n: int = 10) -> list[dict[str, Any]]:
        return self.ranked()[:n]

    def pareto(self) -> list[dict[str, Any]]:
        return pareto_front(self.evaluated)

    def failure_reasons(self) -> dict[str, int]:
        """How many configurations failed, by reason."""
        out: dict[str, int] = {}
        for r in self.failed:
            out[r["error"]] = out.get(r["error"], 0) + 1
        return dict(sorted(out.items()))


def pareto_front(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Rows not dominated in (iteration time, peak memory), fastest first.

    A row is dominated when another is no slower and uses no more memory, and is better in one
    of them; of identical points the first in enumeration order is kept."""
    front: list[dict[str, Any]] = []
    best_memory = float("inf")
    for r in sorted(rows, key=lambda r: (r["iteration_time_s"], r["peak_memory_bytes"], r["index"])):
        if r["peak_memory_bytes"] < best_memory:
            front.append(dict(r))
            best_memory = r["peak_memory_bytes"]
    return front


#: Memory headroom (a fraction of what the allocator can hold) below which the best pick gets a
#: caution.  The model's peak is the bytes the tensors occupy (``torch.cuda.max_memory_allocated``);
#: PyTorch's caching allocator reserves more than that, the difference being fragmentation, and a
#: request that no cached block can serve fails out of memory however much is free in pieces.
#: Measured fragmentation on 80 GB A100s, LLMs trained with recomputation, ZeRO or offloading:
#: GMLake (Guo et al., ASPLOS 2024, arXiv:2401.08156) removes 15% of it on average and up to 33%,
#: i.e. the caching allocator wasted at least that much; ZeRO (Rajbhandari et al., SC 2020, §3.2)
#: reports out-of-memory errors with over 30% of memory still free in extreme cases.  10% keeps
#: clear of the common case without ruling out the plans that are simply well packed; setting
#: ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` (PyTorch >= 2.1) narrows the gap.
HEADROOM_CAUTION_FRACTION = 0.10


def headroom_caution(ranked: Sequence[Mapping[str, Any]], capacity_bytes: float,
                     fraction: float = HEADROOM_CAUTION_FRACTION) -> dict[str, Any] | None:
    """A caution when the fastest fitting row (``ranked[0]``) leaves less than ``fraction`` of
    ``capacity_bytes`` (what the allocator can hold: the GPU's memory less the framework's share)
    free; None when it leaves enough, or when nothing fits.

    Returns ``headroom_bytes`` and ``headroom_fraction`` of the best, ``threshold_fraction``,
    ``keep_bytes`` (the headroom to keep) and ``safer``: the rank (1 = fastest) and row of the
    fastest fitting configuration that keeps it (None when none does)."""
    if not ranked or capacity_bytes <= 0:
        return None
    best = ranked[0]
    headroom = capacity_bytes - best["peak_memory_bytes"]
    if headroom >= fraction * capacity_bytes:
        return None
    keep = fraction * capacity_bytes
    safer = next(((i, r) for i, r in enumerate(ranked, 1) if capacity_bytes - r["peak_memory_bytes"] >= keep), None)
    return {"headroom_bytes": headroom, "headroom_fraction": headroom / capacity_bytes, "threshold_fraction": fraction,
            "keep_bytes": keep, "capacity_bytes": capacity_bytes,
            "safer": None if safer is None else {"rank": safer[0], "row": safer[1]}}


# ---- chunks on an executor (dml2comm.executors: forked local workers inherit the evaluator; Dask workers build it)
def sweep_evaluator(model_path: str, cluster_builder: Callable[[int], Cluster], dims: Sequence[tuple[str, int]],
                    seq_len: int | None, first_batch: int, fast: bool) -> Evaluator:
    """The evaluator as :func:`run_sweep` prepares it (import of ``first_batch``, then the
    collapsed model of the fast path), built from the model's path: what a Dask worker runs once
    per sweep."""
    collecting = gc.isenabled()
    gc.disable()  # as in run_sweep: the import builds many objects and keeps them all
    try:
        evaluator = Evaluator(model_path, cluster_builder, dims, seq_len)
        first = evaluator.imported(first_batch)
        if fast:
            evaluator.prepare_fast(first.model_batch or first_batch)
    finally:
        if collecting:
            gc.enable()
    return evaluator


def evaluate_chunk(evaluator: Evaluator, payload: tuple[Sequence[int], Sequence[ParallelConfig], bool]) -> list[dict[str, Any]]:
    """Rows of one chunk: ``payload`` = (enumeration indices, their configurations, fast); each
    row carries its ``index``."""
    indices, configs, fast = payload
    rows = evaluator.evaluate_many(list(configs), fast)
    for index, row in zip(indices, rows):
        row["index"] = index
    return rows


#: Configurations per unit of work: large enough that those sharing a schedule are simulated
#: together, small enough that results stream and Ctrl-C loses little.
CHUNK = 512


def _block(config: ParallelConfig) -> tuple:
    """What the fast path builds once and configurations then share (:mod:`dml2comm.model`):
    per micro-batch size an import, per (t, c, e) the layer tables (both SP settings: they
    share the schedules)."""
    return (config.micro_batch_size, config.tp_size, config.cp_size, config.cp_scheme, config.ep_size)


def _affinity(config: ParallelConfig) -> Fraction:
    """Chunks with equal t x c / b share compiled schedules (m = B t c p / (N b)) and the
    pipeline's and tensor-parallel messages (b s h / t per GPU, 1/c with context
    parallelism): a worker given them together builds those once (:mod:`dml2comm.search.workers`)."""
    return Fraction(config.tp_size * config.cp_size, config.micro_batch_size)


def _steps(config: ParallelConfig) -> int:
    return config.pp_size * config.num_micro_batches * config.chunks


def _chunks(configs: Sequence[ParallelConfig]) -> list[list[int]]:
    """Indices in chunks that keep each :func:`_block` whole where they can (a worker that
    gets a block builds its tables; a block split between workers is built in both), ordered
    by the schedule shape inside (so that configurations sharing a schedule are simulated
    together) and handed out largest first (so that the workers finish together).

    A chunk is one block, or consecutive blocks up to :data:`CHUNK` configurations; a larger
    block is cut into nearly equal pieces of at most :data:`CHUNK`.  Work is estimated by
    :func:`_work_of`."""
    blocks: dict[tuple, list[int]] = {}
    for i in sorted(range(len(configs)), key=lambda i: (_block(configs[i]), configs[i].pp_size, configs[i].num_micro_batches,
                                                       configs[i].schedule, configs[i].virtual_stages, i)):
        blocks.setdefault(_block(configs[i]), []).append(i)
    pieces: list[list[int]] = []
    for members in blocks.values():
        n = -(-len(members) // CHUNK)
        size = -(-len(members) // n)
        pieces.extend(members[k:k + size] for k in range(0, len(members), size))
    chunks: list[list[int]] = []
    for piece in pieces:
        if chunks and len(chunks[-1]) + len(piece) <= CHUNK and _block(configs[chunks[-1][0]])[0] == _block(configs[piece[0]])[0]:
            chunks[-1].extend(piece)
        else:
            chunks.append(list(piece))
    work = {id(c): _work_of(configs, c) for c in chunks}
    return sorted(chunks, key=lambda c: -work[id(c)])


#: The estimate of a chunk's work, in pipeline steps simulated (about 0.1 us each on the
#: 530B sweep): each configuration's own work (preparing its per-device costs and summary)
#: costs about as much as 600 steps, and building a block's tables (layer costs, sharding,
#: partitions, collective costs: tens of milliseconds) as 500,000.
_STEP_WEIGHT = 600
_BLOCK_WEIGHT = 500_000


def _work_of(configs: Sequence[ParallelConfig], chunk: list[int]) -> int:
    """Estimated work of a chunk (:data:`_STEP_WEIGHT`)."""
    blocks = {_block(configs[i]) for i in chunk}
    return _BLOCK_WEIGHT * len(blocks) + sum(_STEP_WEIGHT + _steps(configs[i]) for i in chunk)


def _prepare(evaluator: "Evaluator", num_gpus: int, space: SweepSpace, limit: int | None, fast: bool):
    """Import the model at the first micro-batch size, enumerate the configurations (the model's
    fixed batch and the cluster's node size constrain them) and prepare the fast path, with the
    garbage collector off: the import builds many objects and keeps them all.  Returns (the first
    import, its micro-batch, the model's shape, the sequence length, the configurations to run,
    how many the space has)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        first_batch = min(space.constraints.micro_batch_sizes or (1,))
        first = evaluator.imported(first_batch)
        shape = model_shape(first)
        seq_len = space.seq_len or shape["seq_len"]
        constraints = space.constraints
        if first.model_batch is not None:  # the model fixes its batch: that is the only micro-batch size
            constraints = replace(constraints, micro_batch_sizes=(first.model_batch,))
        cluster = evaluator.cluster(num_gpus)
        if constraints.gpus_per_node != cluster.gpus_per_node:
            constraints = replace(constraints, gpus_per_node=cluster.gpus_per_node)
        configs = list(enumerate_configs(num_gpus, space.global_batch_size, shape["layers"], shape["heads"],
                                         shape["kv_heads"], seq_len, constraints, shape["experts"]))
        num_configs = len(configs)
        if limit is not None:
            configs = configs[:limit]
        if fast:
            evaluator.prepare_fast(first.model_batch or first_batch)
    finally:
        if collecting:
            gc.enable()
    return first, first_batch, shape, seq_len, configs, num_configs


def _run_chunks(evaluator: "Evaluator", configs: list[ParallelConfig], model_path: str,
                cluster_builder: Callable[[int], Cluster], space: SweepSpace, first_batch: int, fast: bool,
                rows: list[dict[str, Any]], on_result: Callable[[dict[str, Any], int, int], None] | None,
                executor: "Executor | None", workers: int) -> bool:
    """Cut ``configs`` into chunks (:func:`_chunks`) and run them on ``executor`` (default: local,
    ``workers`` processes), appending each row to ``rows`` as it arrives; returns whether the
    sweep was interrupted."""
    chunks = _chunks(configs)

    def on_rows(chunk_rows: list[dict[str, Any]]) -> None:
        for row in chunk_rows:
            rows.append(row)
            if on_result is not None:
                on_result(row, len(rows), len(configs))

    from dml2comm.executors import ChunkPlan, LocalExecutor

    plan = ChunkPlan(
        work=[_work_of(configs, chunk) for chunk in chunks], affinity=[_affinity(configs[chunk[0]]) for chunk in chunks],
        setup=functools.partial(sweep_evaluator, str(model_path), cluster_builder, tuple(space.dims), space.seq_len,
                                first_batch, fast),
        run=evaluate_chunk, payloads=[(chunk, [configs[i] for i in chunk], fast) for chunk in chunks], state=evaluator)
    return (executor or LocalExecutor(workers)).run_chunks(plan, on_rows)


def run_sweep(
    model_path: str,
    num_gpus: int,
    cluster_builder: Callable[[int], Cluster],
    space: SweepSpace,
    workers: int = 1,
    on_result: Callable[[dict[str, Any], int, int], None] | None = None,
    limit: int | None = None,
    fast: bool = True,
    executor: "Executor | None" = None,
) -> SweepResult:
    """Evaluate every configuration of ``space`` on ``num_gpus`` GPUs.

    Parameters
    ----------
    cluster_builder
        ``num_gpus -> Cluster`` (the command passes one with ``collective_overhead_s=0``, as the
        main command does).
    workers
        Processes; 1 evaluates in this process (ignored with ``executor``).
    on_result
        ``on_result(row, done, total)`` after each configuration, in arrival order (with workers
        not the enumeration order); raising ``KeyboardInterrupt`` stops the sweep.
    limit
        Evaluate only the first ``limit`` configurations of the enumeration (benchmarks).
    fast
        Use the fast path (:mod:`dml2comm.model`, same numbers) where it applies;
        ``False`` runs the full analysis for every configuration.
    executor
        Where the chunks run (:mod:`dml2comm.executors`; default: local, ``workers``
        processes); the caller closes it.  The rows do not depend on it.

    Returns
    -------
    SweepResult
        Rows sorted by enumeration index; ``interrupted`` when stopped early.

    Raises
    ------
    ConfigError
        Bad constraints, or no valid configuration (from :func:`enumerate_configs`);
        the model cannot be imported (InputFileError / ModelError).
    """
    start = time.perf_counter()
    evaluator = Evaluator(model_path, cluster_builder, space.dims, space.seq_len)
    first, first_batch, shape, seq_len, configs, num_configs = _prepare(evaluator, num_gpus, space, limit, fast)
    rows: list[dict[str, Any]] = []
    # the imported model and the configurations live as long as the sweep: keep the collector
    # from walking them, from here on (chunking and planning allocate enough for a collection
    # over the whole import) and in forked workers (from copying their pages by touching them)
    gc.freeze()
    try:
        # the tables live to the end (dml2comm.gc_tuning); from the chunking on, whose few
        # thousand objects would otherwise run ten young collections at the default threshold
        # and so bring on a middle-generation one over every table built after (about 17 ms on
        # the 530B sweep)
        with collect_rarely():
            interrupted = _run_chunks(evaluator, configs, model_path, cluster_builder, space, first_batch, fast, rows,
                                      on_result, executor, workers)
    finally:
        gc.unfreeze()
    rows.sort(key=lambda r: r["index"])
    model = {"path": str(model_path), "name": first.graph.name, "num_layers": shape["layers"], "heads": shape["heads"],
             "kv_heads": shape["kv_heads"], "seq_len": seq_len, "params": first.graph.num_params}
    return SweepResult(rows, num_configs, time.perf_counter() - start, interrupted, model)


# ---- CSV (streamed row by row)
def csv_row(row: Mapping[str, Any]) -> list[Any]:
    config = row["config"]
    values: list[Any] = [row.get("index", "")]
    values += [config.get(k) for k in CONFIG_COLUMNS]
    values += [("" if row[k] is None else repr(row[k]) if isinstance(row[k], float) else row[k]) for k in METRICS]
    values.append(row["error"] or "")
    return values


def csv_text(rows: Sequence[Mapping[str, Any]]) -> str:
    """The whole CSV (header + rows) as text; floats in ``repr`` (round-trip exact)."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for r in rows:
        writer.writerow(csv_row(r))
    return buf.getvalue()


class CsvStream:
    """Appends one CSV row per result, so an interrupted sweep keeps what finished: rows reach
    the file at least every ``flush_s`` seconds (a flush per row costs a system call per
    configuration, a tenth of a second over a 5,000-configuration sweep) and on close, which
    the sweep command reaches on Ctrl-C and on errors."""

    def __init__(self, path: str | Path, flush_s: float = 0.5) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: TextIO = self.path.open("w", encoding="utf-8", newline="")
        self._writer = csv.writer(self._file, lineterminator="\n")
        self._writer.writerow(CSV_COLUMNS)
        self._file.flush()
        self._flush_s = flush_s
        self._flushed = time.monotonic()
        self.rows = 0

    def write(self, row: Mapping[str, Any]) -> None:
        self._writer.writerow(csv_row(row))
        self.rows += 1
        now = time.monotonic()
        if now - self._flushed >= self._flush_s:
            self._file.flush()
            self._flushed = now

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> "CsvStream":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
