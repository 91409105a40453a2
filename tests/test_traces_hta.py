"""The real traces of ../shared/traces/hta: our HTA-compatible figures equal HolisticTraceAnalysis's.

Reference figures computed once with holistictraceanalysis 0.5.0 (Meta; installed in a
throw-away venv outside the repository, never a dependency) by ``benchmarks/hta_reference.py``,
each rank set in its own folder as HTA's ``TraceAnalysis(trace_dir=...)`` reads it:

- set ``trace_filter__sampled_rank-0/-1`` (ranks 0 and 1 of a 128-rank run, integer ts):
  ``get_comm_comp_overlap``: rank 0 11.81 %, rank 1 20.05 %;
  ``get_gpu_kernel_breakdown`` kernel types (us, both ranks): COMMUNICATION 305584,
  COMPUTATION 185023, COMPUTATION overlapping COMMUNICATION 56747, MEMORY 2288,
  COMMUNICATION overlapping MEMORY 1011, COMPUTATION overlapping MEMORY 18,
  COMPUTATION overlapping COMMUNICATION overlapping MEMORY 12 (55.5/33.6/10.3/0.4/0.2/0.0/0.0 %);
  ``get_temporal_breakdown`` (idle, compute, non-compute, kernel time, us): rank 0 321378,
  106252, 172428, 600058; rank 1 328671, 135548, 136455, 600674.
- ``nccl_parser_config__nccl_data`` (rank 0 of 2, float ts: HTA rounds to whole us):
  overlap 14.31 %; COMPUTATION 71696, COMMUNICATION 20621, COMPUTATION overlapping
  COMMUNICATION 3473, MEMORY 831, COMMUNICATION overlapping MEMORY 184; temporal 338781,
  75169, 21636, 435586.
- ``negative_queue_length_values_check__rank0`` (rank 0 of 16): overlap 1.37 %;
  COMPUTATION 138794, COMMUNICATION 134025, MEMORY 32246, COMPUTATION overlapping MEMORY 3171,
  COMPUTATION overlapping COMMUNICATION 1871, COMMUNICATION overlapping MEMORY 594; temporal
  705853, 143836, 166865, 1016554.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dml2comm.cli import main
from dml2comm.traces.load import load_trace
from dml2comm.traces.overlap import (hta_gpu_events, hta_kernel_type_breakdown, hta_overlap_pct, hta_temporal_breakdown,
                                     percentages)

HTA = Path(__file__).resolve().parent / "fixtures" / "traces" / "hta"

SETS = {
    "sampled pair": (
        ["trace_filter__sampled_rank-0", "trace_filter__sampled_rank-1"],
        [11.81, 20.05],
        {"COMMUNICATION": 305584, "COMPUTATION": 185023, "COMPUTATION overlapping COMMUNICATION": 56747, "MEMORY": 2288,
         "COMMUNICATION overlapping MEMORY": 1011, "COMPUTATION overlapping MEMORY": 18,
         "COMPUTATION overlapping COMMUNICATION overlapping MEMORY": 12},
        [(321378, 106252, 172428, 600058), (328671, 135548, 136455, 600674)],
    ),
    "nccl data": (
        ["nccl_parser_config__nccl_data"],
        [14.31],
        {"COMPUTATION": 71696, "COMMUNICATION": 20621, "COMPUTATION overlapping COMMUNICATION": 3473, "MEMORY": 831,
         "COMMUNICATION overlapping MEMORY": 184},
        [(338781, 75169, 21636, 435586)],
    ),
    "negative queue": (
        ["negative_queue_length_values_check__rank0"],
        [1.37],
        {"COMPUTATION": 138794, "COMMUNICATION": 134025, "MEMORY": 32246, "COMPUTATION overlapping MEMORY": 3171,
         "COMPUTATION overlapping COMMUNICATION": 1871, "COMMUNICATION overlapping MEMORY": 594},
        [(705853, 143836, 166865, 1016554)],
    ),
}


def _need_shared() -> None:
    assert HTA.is_dir(), f"{HTA} is missing: it is a bundled test fixture (restore it from git)"


@pytest.mark.parametrize("name", list(SETS))
def test_hta_figures(name):
    _need_shared()
    files, overlap, kernel_types, temporal = SETS[name]
    events = [hta_gpu_events(load_trace(HTA / f"{f}.json.gz")) for f in files]
    assert [hta_overlap_pct(e) for e in events] == overlap
    breakdown = hta_kernel_type_breakdown(events)
    assert breakdown == kernel_types
    assert list(percentages(breakdown).values())[:3] == [round(100 * v / sum(kernel_types.values()), 1)
                                                         for v in list(kernel_types.values())[:3]]
    for ev, (idle, compute, non_compute, kernel) in zip(events, temporal):
        t = hta_temporal_breakdown(ev)
        assert (t["idle_time_us"], t["compute_time_us"], t["non_compute_time_us"], t["kernel_time_us"]) == (idle, compute, non_compute, kernel)


def test_real_pair_through_the_command(tmp_path):
    """The command on the real pair: both ranks analysed, HTA's overlap in trace_analysis.json,
    NCCL kernels under nccl:all_to_all counted as expert-parallel and under nccl:all_reduce as
    data-parallel, and the 126 ranks of the 128-rank run without a trace listed as a problem."""
    _need_shared()
    import json

    out = tmp_path / "out"
    files = [str(HTA / f"trace_filter__sampled_rank-{r}.json.gz") for r in (0, 1)]
    assert main(["trace", *files, "--out", str(out), "--no-site", "--processes", "2"]) == 0
    data = json.loads((out / "trace_analysis.json").read_text())
    assert [r["hta"]["comm_comp_overlap_pct"] for r in data["ranks"]] == [11.81, 20.05]
    assert data["hta"]["kernel_type_breakdown_us"]["COMMUNICATION"] == 305584
    comm = data["ranks"][0]["summary"]["comm_s"]
    assert comm["ep"] > 0 and comm["dp"] > 0 and comm["tp"] == 0
    assert any("126 of 128 ranks" in p for p in data["problems"])
