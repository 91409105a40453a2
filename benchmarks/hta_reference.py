"""Recompute the HolisticTraceAnalysis reference figures of tests/test_traces_hta.py (dev only).

HTA is NOT a dependency of dml2comm and is never imported by the tool or its tests.  Run this
with a throw-away virtual environment outside the repository:

    python3 -m venv /tmp/hta-venv && /tmp/hta-venv/bin/pip install holistictraceanalysis==0.5.0
    /tmp/hta-venv/bin/python benchmarks/hta_reference.py [../shared/traces/hta]

Each rank set is linked into its own folder (HTA's TraceAnalysis reads a folder per run); the
script prints get_comm_comp_overlap, the kernel-type table of get_gpu_kernel_breakdown and
get_temporal_breakdown for each.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

SETS = {
    "sampled pair": ["trace_filter__sampled_rank-0.json.gz", "trace_filter__sampled_rank-1.json.gz"],
    "nccl data": ["nccl_parser_config__nccl_data.json.gz"],
    "negative queue": ["negative_queue_length_values_check__rank0.json.gz"],
}


def main() -> None:
    from hta.trace_analysis import TraceAnalysis  # the throw-away venv's HTA

    src = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[2] / "shared" / "traces" / "hta")
    with tempfile.TemporaryDirectory() as tmp:
        for name, files in SETS.items():
            folder = Path(tmp) / name.replace(" ", "_")
            folder.mkdir()
            for f in files:
                (folder / f).symlink_to((src / f).resolve())
            ta = TraceAnalysis(trace_dir=str(folder))
            print(f"===== {name}")
            print(ta.get_comm_comp_overlap(visualize=False).to_string())
            kernel_types, _ = ta.get_gpu_kernel_breakdown(visualize=False)
            print(kernel_types.to_string())
            print(ta.get_temporal_breakdown(visualize=False).to_string())


if __name__ == "__main__":
    main()
