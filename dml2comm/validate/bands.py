"""The expected-error bands from the validation side: the rows of the bands file from
``validate``'s end-to-end cases (:func:`band_rows`), the file's text (:func:`bands_csv`;
``benchmarks/expected_error.py`` writes it to ``dml2comm/cost/data/expected_error.csv``), and how
often the band holds on each source's own runs (:func:`band_coverage`, printed by ``validate``).

The band itself, which the analysis, the sweep and ``--profile`` read, is computed below the back
ends, in :mod:`dml2comm.cost.bands`.
"""

from __future__ import annotations

import csv
import io
from typing import Iterable, Sequence

from dml2comm.cost.bands import FIELDS, BandRow, expected_error_for
from dml2comm.parallel.config import ParallelConfig
from dml2comm.validate.cases import Case

__all__ = ["band_coverage", "band_rows", "bands_csv"]


def _setup(case: Case) -> dict[str, int]:
    return {k: int(v) for k, v in (x.split("=", 1) for x in case.setup.split() if "=" in x) if v.isdigit()}


def band_rows(cases: Iterable[Case], gpu: str, gpus_per_node: int = 8, vocab: int = 50257, seq_len: int = 1024) -> list[BandRow]:
    """Rows of the bands file from ``validate`` cases of ``narayanan2021`` (model size from the case
    id, ``narayanan21_t1_1.7B``) and ``vtrain`` (``12 L h^2 + (V + s) h`` parameters: the GPT
    layers' weights, Narayanan et al. 2021 eq. (2) without biases, plus the token and position
    embeddings), and step-time cases whose tags say where they sit (``params=``, ``gpu=``,
    ``stack=``, ``gpus=``, and ``host=`` where the prediction states its GPU's wait for the CPU:
    ``h100-steps``, ``gpu-steps``); other cases are skipped (not end-to-end runs)."""
    out = []
    for c in cases:
        s = _setup(c)
        tags = dict(t.split("=", 1) for t in c.tags if "=" in t)
        if c.quantity == "iteration_time_s" and "params" in tags:  # a source that says where its run sits
            gpus = int(tags.get("gpus", 1))
            host = tags.get("host")
            out.append(BandRow(c.source, c.case_id, tags.get("gpu", gpu), float(tags["params"]), gpus, max(gpus, 1),
                               int(tags.get("t", 1)), int(tags.get("p", 1)), abs(c.error), tags.get("stack", "megatron"),
                               None if host is None else float(host)))
            continue
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
    w.writerow(FIELDS)
    for r in rows:
        w.writerow([r.source, r.case, r.gpu, f"{r.params:.6g}", r.num_gpus, r.gpus_per_node, r.t, r.p, f"{r.abs_error:.6f}", r.stack,
                    "" if r.host_share is None else f"{r.host_share:.4f}"])
    return buf.getvalue()


def band_coverage(rows: Sequence[BandRow], bands: Sequence[BandRow] | None = None) -> dict[str, tuple[int, int]]:
    """Per source, (runs inside the band the tool prints for them, runs): each run's own
    :func:`~dml2comm.cost.bands.expected_error_for` (from ``bands``, default the bundled file) against its error."""
    from types import SimpleNamespace

    out: dict[str, tuple[int, int]] = {}
    for r in rows:
        d = max(1, r.num_gpus // (r.t * r.p))
        config = ParallelConfig(dp_size=d, tp_size=r.t, pp_size=r.p, global_batch_size=d, stack=r.stack)
        cluster = SimpleNamespace(num_gpus=r.num_gpus, gpus_per_node=r.gpus_per_node, gpu=SimpleNamespace(name=r.gpu))
        band, _ = expected_error_for(config, cluster, r.params, bands, host_share=r.host_share)  # type: ignore[arg-type]
        inside, total = out.get(r.source, (0, 0))
        out[r.source] = (inside + (r.abs_error <= band), total + 1)
    return out
