"""What ``sweep`` and ``compare`` report: the clusters they cost on, the rows' entries of
data.json (:func:`sweep_dict`), the Parquet table, the sweep space as data.json and the page show
it, and a ``--configs`` entry read into a configuration (:func:`parse_config_spec`).
``python main.py sweep`` / ``compare`` (:mod:`dml2comm.cli.search`) print and write them.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Sequence

from dml2comm.errors import ConfigError
from dml2comm.fmt import decimal_int
from dml2comm.cost.profile import ProfileScale
from dml2comm.hardware.cluster import Cluster, plan_cluster
from dml2comm.parallel.config import RECOMPUTE_MODES, ParallelConfig
from dml2comm.search.sweep import CONFIG_COLUMNS, CSV_COLUMNS, SweepResult, SweepSpace, headroom_caution

__all__ = ["SPEC_KEYS", "cluster_builder", "cluster_dict", "entry", "gpu_label", "parquet_bytes", "parse_config_spec", "space_dict",
           "space_view", "sweep_dict"]


#: Keys of a ``--configs`` entry.
SPEC_KEYS = {"d": "dp_size", "t": "tp_size", "p": "pp_size", "b": "micro_batch_size", "zero": "zero_stage",
             "recompute": "recompute", "sp": "sequence_parallel", "v": "virtual_stages", "c": "cp_size", "e": "ep_size"}


def cluster_builder(gpu: str | None, cluster: str | None, gpus_per_node: int, host_model: str = "eager",
                    nics_per_node: int | None = None, profile: ProfileScale | None = None) -> Callable[[int], Cluster]:
    """``num_gpus -> Cluster`` as the main command builds it, with no per-call host overhead,
    the host model ``host_model`` (:mod:`dml2comm.cost.host`) and a profile's measured ratios
    (``--profile``: :mod:`dml2comm.cost.profile`); a ``gpu`` that contradicts the ``cluster``
    preset's GPU is refused, as by the main command."""

    def build(num_gpus: int) -> Cluster:
        built = plan_cluster(gpu, cluster, num_gpus, gpus_per_node, nics_per_node=nics_per_node)
        return dataclasses.replace(built, collective_overhead_s=0.0, host_model=host_model, profile_scale=profile)

    return build


def entry(row: Mapping[str, Any]) -> dict[str, Any]:
    return {"index": row["index"], "config": row["config"], "iteration_time_s": row["iteration_time_s"],
            "tflops_per_gpu": row["tflops_per_gpu"], "mfu": row["mfu"], "peak_memory_bytes": row["peak_memory_bytes"],
            "fits": row["fits"], "bubble_fraction": row["bubble_fraction"],
            "compute_time_s": row.get("compute_time_s"), "bubble_time_s": row.get("bubble_time_s"),
            "exposed_comm_time_s": row["exposed_comm_time_s"], "optimizer_time_s": row.get("optimizer_time_s"),
            "expected_error": row.get("expected_error"), "error": row["error"]}


_INT_COLUMNS = {"index", "d", "t", "p", "c", "e", "micro_batch_size", "num_micro_batches", "virtual_stages", "zero_stage"}


_BOOL_COLUMNS = {"sequence_parallel", "fits"}


_TEXT_COLUMNS = {"schedule", "recompute", "error"}


def parquet_bytes(rows: Sequence[Mapping[str, Any]]) -> bytes:
    """The rows as Parquet: the columns of the CSV (:data:`CSV_COLUMNS`), typed (int64 sizes,
    bool flags, float64 metrics, strings; missing values null)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns: dict[str, Any] = {}
    for name in CSV_COLUMNS:
        if name in CONFIG_COLUMNS:
            values = [r["config"].get(name) for r in rows]
        else:
            values = [r.get(name) for r in rows]
        if name in _INT_COLUMNS:
            kind = pa.int64()
        elif name in _BOOL_COLUMNS:
            kind = pa.bool_()
        elif name in _TEXT_COLUMNS:
            kind = pa.string()
            values = [None if v is None else str(v) for v in values]
        else:
            kind = pa.float64()
        try:
            columns[name] = pa.array(values, type=kind)
        except (pa.ArrowInvalid, pa.ArrowTypeError):  # a column this writer does not know the type of
            columns[name] = pa.array([None if v is None else str(v) for v in values], type=pa.string())
    sink = pa.BufferOutputStream()
    pq.write_table(pa.table(columns), sink)
    return sink.getvalue().to_pybytes()


def sweep_dict(result: SweepResult, top: int = 10, capacity_bytes: float | None = None) -> dict[str, Any]:
    """The ``sweep`` object of data.json; with ``capacity_bytes`` (what the allocator can hold),
    ``memory_caution`` when the best leaves too little headroom
    (:func:`~dml2comm.search.sweep.headroom_caution`), else None."""
    evaluated = result.evaluated
    best = result.best
    caution = headroom_caution(result.ranked(), capacity_bytes) if capacity_bytes else None
    if caution is not None and caution["safer"] is not None:
        caution["safer"] = dict(entry(caution["safer"]["row"]), rank=caution["safer"]["rank"])
    return {
        "num_configs": result.num_configs,
        "num_evaluated": len(evaluated),
        "num_failed": len(result.failed),
        "num_fit": sum(1 for r in evaluated if r["fits"]),
        "failure_reasons": result.failure_reasons(),
        "interrupted": result.interrupted,
        "seconds": result.seconds,
        "configs_per_s": len(result.rows) / result.seconds if result.seconds else None,
        "best": entry(best) if best else None,
        "top": [entry(r) for r in result.top(top)],
        "pareto": [entry(r) for r in result.pareto()],
        "memory_caution": caution,
    }


def cluster_dict(cluster: Cluster) -> dict[str, Any]:
    out: dict[str, Any] = {"name": cluster.name, "gpu": cluster.gpu.name, "num_gpus": cluster.num_gpus,
                           "gpus_per_node": cluster.gpus_per_node}
    if cluster.source_file is not None:  # --cluster FILE.yaml: which file, by name and hash (issue 20)
        out["file"] = {"name": cluster.source_file[0], "sha256": cluster.source_file[1]}
    return out


def space_dict(space: SweepSpace, num_gpus: int) -> dict[str, Any]:
    c = space.constraints
    return {"num_gpus": num_gpus, "global_batch_size": space.global_batch_size, "seq_len": space.seq_len,
            "d": c.d, "t": c.t, "p": c.p, "max_d": c.max_d, "max_t": c.max_t, "max_p": c.max_p,
            "micro_batch_sizes": c.micro_batch_sizes, "virtual_stages": c.virtual_stages, "zero_stages": c.zero_stages,
            "recompute": c.recompute, "sequence_parallel": c.sequence_parallel, "allow_cross_node_tp": c.allow_cross_node_tp}


def gpu_label(cluster: Cluster) -> str:
    return f"{cluster.gpu.name}, {cluster.gpu.hbm_bytes / 1e9:g} GB less the CUDA context"


#: Labels of the sweep space's keys on the page (data.json keeps the keys).
_SPACE_LABELS = {"num_gpus": "GPUs", "global_batch_size": "global batch", "d": "data parallel d", "t": "tensor parallel t",
                 "p": "pipeline stages p", "max_d": "largest d", "max_t": "largest t", "max_p": "largest p",
                 "micro_batch_sizes": "micro-batch sizes", "virtual_stages": "virtual stages", "zero_stages": "ZeRO stage",
                 "recompute": "recomputation", "sequence_parallel": "sequence parallel",
                 "allow_cross_node_tp": "tensor parallel across nodes"}


def _space_value(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, (list, tuple)):
        return ", ".join(_space_value(v) for v in value)
    return str(value)


def space_view(space: Mapping[str, Any]) -> dict[str, Any]:
    """The constraints worth showing on the page, in words (``sequence parallel: off, on``, not
    ``sequence_parallel False, True``); d/t/p left at "every divisor" are left out."""
    return {_SPACE_LABELS.get(k, k.replace("_", " ")): _space_value(v) for k, v in space.items()
            if v is not None and k not in ("seq_len",)}


# ---- compare
def parse_config_spec(text: str, global_batch: int, seq_len: int | None, dtype: str = "bf16",
                      optimizer: str = "adam", stack: Mapping[str, str] | None = None) -> ParallelConfig:
    """``"d=2,t=2,p=4,b=1,zero=1,recompute=full,sp=1,v=2,c=2,e=2"`` -> :class:`ParallelConfig` (unset keys: defaults)."""
    kwargs: dict[str, Any] = {}
    for part in [x.strip() for x in text.split(",") if x.strip()]:
        key, sep, value = part.partition("=")
        key = key.strip().lower()
        if not sep or key not in SPEC_KEYS:
            raise ConfigError(f"--configs {text!r}: cannot read {part!r}; use KEY=VALUE with keys {','.join(SPEC_KEYS)}")
        name = SPEC_KEYS[key]
        value = value.strip()
        if name == "recompute":
            if value not in RECOMPUTE_MODES:
                raise ConfigError(f"--configs {text!r}: recompute={value!r}; choose one of {', '.join(RECOMPUTE_MODES)}")
            kwargs[name] = value
        elif name == "sequence_parallel":
            if value.lower() not in ("0", "1", "true", "false", "on", "off"):
                raise ConfigError(f"--configs {text!r}: sp={value!r}; use sp=1 or sp=0")
            kwargs[name] = value.lower() in ("1", "true", "on")
        else:
            try:
                kwargs[name] = decimal_int(value)
            except ValueError:
                raise ConfigError(f"--configs {text!r}: {key}={value!r} is not an integer") from None
    if kwargs.get("virtual_stages", 1) > 1:
        kwargs["schedule"] = "interleaved"
    if kwargs.get("sequence_parallel") and kwargs.get("tp_size", 1) == 1:
        raise ConfigError(f"--configs {text!r}: sp=1 needs t of 2 or more")
    try:
        return ParallelConfig(global_batch_size=global_batch, seq_len=seq_len, dtype=dtype, optimizer=optimizer, **(stack or {}), **kwargs)
    except ConfigError as exc:
        raise ConfigError(f"--configs {text!r}: {exc}") from None
