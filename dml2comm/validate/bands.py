"""Expected error of a prediction, from the validation residuals of the nearest published runs.

Every iteration time the tool predicts comes with the error it made on the bundled end-to-end
runs closest to it: :func:`expected_error_for` reads ``data/expected_error.csv`` (one row per
end-to-end validation case: Narayanan et al. 2021 Table 1 and vTrain's single-node runs, with the
run's GPU, model size, GPU count and t, p, and the tool's absolute error on it), precomputed by
``benchmarks/expected_error.py`` from ``validate`` (never at analysis time; rerun it after a cost
model change).

Nearest: runs in the same regime first (one node, or several), then by distance
``|log10(params / params_i)| + 0.5 |log2(t / t_i)| + 0.5 |log2(p / p_i)|``; the expected error is
the mean absolute error of the :data:`K` nearest (fewer where the regime has fewer).  A run on
another GPU than the validation runs' (all bundled end-to-end runs are A100s) gets the same figure
with the source naming the GPU it came from: there is no end-to-end measurement to do better.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterable, Sequence

from dml2comm.hardware.cluster import Cluster
from dml2comm.parallel.config import ParallelConfig
from dml2comm.validate.cases import Case
from dml2comm.validate.data import read_csv

__all__ = ["BANDS_FILE", "K", "BandRow", "band_rows", "bands_csv", "expected_error_for", "load_bands"]

BANDS_FILE = "expected_error.csv"
#: Nearest runs averaged.
K = 20
#: Decades of model size beyond which the nearest run of the same regime is too far to speak
#: for this one (a factor of 10 in parameters).
FAR = 1.0
_FIELDS = ("source", "case", "gpu", "params", "num_gpus", "gpus_per_node", "t", "p", "abs_error")


@dataclass(frozen=True)
class BandRow:
    """One end-to-end validation run: where it sits and the tool's absolute error on it."""

    source: str
    case: str
    gpu: str
    params: float
    num_gpus: int
    gpus_per_node: int
    t: int
    p: int
    abs_error: float

    @property
    def single_node(self) -> bool:
        return self.num_gpus <= self.gpus_per_node


def _setup(case: Case) -> dict[str, int]:
    return {k: int(v) for k, v in (x.split("=", 1) for x in case.setup.split() if "=" in x) if v.isdigit()}


def band_rows(cases: Iterable[Case], gpu: str, gpus_per_node: int = 8, vocab: int = 50257, seq_len: int = 1024) -> list[BandRow]:
    """Rows of the bands file from ``validate`` cases of ``narayanan2021`` (model size from the case
    id, ``narayanan21_t1_1.7B``) and ``vtrain`` (``12 L h^2 + (V + s) h`` parameters: the GPT
    layers' weights, Narayanan et al. 2021 eq. (2) without biases, plus the token and position
    embeddings); other sources are skipped (not end-to-end runs)."""
    out = []
    for c in cases:
        s = _setup(c)
        if c.source == "narayanan2021":
            params = float(c.case_id.rsplit("_", 1)[1].rstrip("B")) * 1e9
        elif c.source == "vtrain":
            params = 12.0 * s["L"] * s["h"] ** 2 + (vocab + seq_len) * s["h"]
        else:
            continue
        out.append(BandRow(c.source, c.case_id, gpu, params, s["t"] * s["p"] * s["d"], gpus_per_node, s["t"], s["p"], abs(c.error)))
    return out


def bands_csv(rows: Sequence[BandRow]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(_FIELDS)
    for r in rows:
        w.writerow([r.source, r.case, r.gpu, f"{r.params:.6g}", r.num_gpus, r.gpus_per_node, r.t, r.p, f"{r.abs_error:.6f}"])
    return buf.getvalue()


@lru_cache(maxsize=1)
def load_bands() -> tuple[BandRow, ...]:
    """The bundled rows (``data/expected_error.csv``)."""
    return tuple(BandRow(r["source"], r["case"], r["gpu"], float(r["params"]), int(r["num_gpus"]), int(r["gpus_per_node"]),
                         int(r["t"]), int(r["p"]), float(r["abs_error"])) for r in read_csv(BANDS_FILE))


def _distance(row: BandRow, params: float, t: int, p: int) -> float:
    return abs(math.log10(params / row.params)) + 0.5 * abs(math.log2(t / row.t)) + 0.5 * abs(math.log2(p / row.p))


def expected_error_for(config: ParallelConfig, cluster: Cluster, model_params: float,
                       rows: Sequence[BandRow] | None = None) -> tuple[float, str]:
    """(expected relative error, where it comes from) of an iteration time predicted for
    ``config`` on ``cluster`` for a model of ``model_params`` parameters (module docstring).

    ``rows`` defaults to the bundled file.  The source reads like ``"vtrain: mean |error| of the
    20 nearest single-node A100-SXM4-80GB runs (1.3e+08-3.5e+08 parameters)"``.

    Raises
    ------
    ValueError
        ``model_params`` not positive, or no rows (programming errors: the bundled file is fixed).
    """
    if not (model_params > 0):
        raise ValueError(f"model_params must be positive, got {model_params!r}")
    rows = load_bands() if rows is None else rows
    if not rows:
        raise ValueError("no validation rows to derive an expected error from")
    single = cluster.num_gpus <= cluster.gpus_per_node
    same = [r for r in rows if r.single_node == single] or list(rows)
    same_gpu = [r for r in same if r.gpu == cluster.gpu.name]
    pool = same_gpu or same

    def distance(r: BandRow) -> float:
        return _distance(r, model_params, config.tp_size, config.pp_size)

    far = ""
    if min(abs(math.log10(model_params / r.params)) for r in pool) > FAR:
        # no run of this regime within a decade of this one (a small model on many GPUs): the
        # nearest runs of either regime say more than distant runs of the same one
        pool = [r for r in rows if r.gpu == cluster.gpu.name] or list(rows)
        regime_runs = "single-node" if single else "multi-node"
        far = f"; no validated {regime_runs} run within 10x of this model's size: nearest runs of either kind"
    near = sorted(pool, key=lambda r: (distance(r), r.source, r.case))[:K]
    error = sum(r.abs_error for r in near) / len(near)
    sources = sorted({r.source for r in near})
    lo, hi = min(r.params for r in near), max(r.params for r in near)
    kinds = sorted({"single-node" if r.single_node else "multi-node" for r in near})
    regime = "/".join(kinds)
    gpus = sorted({r.gpu for r in near})
    note = ("" if same_gpu else f"; no validated run on {cluster.gpu.name}") + far
    return error, (f"{', '.join(sources)}: mean |error| of the {len(near)} nearest {regime} {'/'.join(gpus)} runs "
                   f"({lo:.2g}-{hi:.2g} parameters){note}")
