"""Regenerate dml2comm/cost/data/expected_error.csv: the per-run absolute errors that
dml2comm.cost.bands.expected_error_for reads (the error bands every prediction states).

    PYTHONPATH=. .venv/bin/python benchmarks/expected_error.py

Runs the end-to-end validation sources (Narayanan 2021 Table 1, vTrain's 1,440 single-node runs,
the H100 training steps, the one-GPU steps measured on H100 and H200 machines) with the shipped
cost model, writes one row per run, and prints the expected error the bands give
at a few configurations.  Rerun after any change to the cost model.
"""

from __future__ import annotations

from dml2comm.cost.bands import BANDS_PATH, expected_error_for
from dml2comm.hardware.cluster import get_cluster
from dml2comm.parallel.config import ParallelConfig
from dml2comm.validate import SOURCES
from dml2comm.validate.bands import band_rows, bands_csv

OUT = BANDS_PATH


def main() -> None:
    gpu = get_cluster("dgx-a100", 8).gpu.name  # both sources ran on DGX A100 nodes (PROVENANCE.md)
    cases = [c for name in ("narayanan2021", "vtrain", "h100-steps", "gpu-steps") for c in SOURCES[name].cases()]
    rows = band_rows(cases, gpu)
    OUT.write_text(bands_csv(rows), encoding="utf-8")
    print(f"wrote {len(rows)} rows to {OUT}")
    for params, gpus, t, p, d in ((3.5e8, 8, 2, 2, 2), (1.7e9, 8, 8, 1, 1), (1.75e11, 1024, 8, 16, 8), (1e9, 64, 1, 1, 64)):
        config = ParallelConfig(dp_size=d, tp_size=t, pp_size=p, micro_batch_size=1, global_batch_size=64 * d)
        for cluster_name in ("dgx-a100", "dgx-h100"):
            err, src = expected_error_for(config, get_cluster(cluster_name, gpus), params)
            print(f"{params:8.2g} params, {gpus:5} GPUs t={t} p={p} on {cluster_name}: +-{err:.1%}  ({src})")
    for params in (1.2e8, 1.2e9):  # one GPU, eager PyTorch
        config = ParallelConfig(micro_batch_size=8, global_batch_size=8, stack="pytorch")
        for cluster_name in ("dgx-h100", "hgx-h200", "dgx-a100"):
            err, src = expected_error_for(config, get_cluster(cluster_name, 1), params)
            print(f"{params:8.2g} params, one GPU, pytorch, on {cluster_name}: +-{err:.1%}  ({src})")


if __name__ == "__main__":
    main()
