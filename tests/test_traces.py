"""Trace ingestion (issue 8): loading, classification, per-step metrics, bad input, the command.

Synthetic traces are built here by hand (a few events each, numbers checked in comments); the
real traces from HolisticTraceAnalysis's test data are in tests/test_traces_hta.py.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from dml2comm.cli import main
from dml2comm.traces.analyze import analyze_traces
from dml2comm.traces.classify import Category, classify, dim_of
from dml2comm.traces.compare import comparison_rows, measured_per_category
from dml2comm.traces.load import TraceError, load_trace
from dml2comm.traces.metrics import step_metrics
from dml2comm.traces.overlap import intersection_measure, union

MAIN, AUTOGRAD = 100, -7  # CPU threads; a negative tid as real traces have


def x(cat: str, name: str, ts: float, dur: float, tid: int = MAIN, pid: int = 42, **args) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def launch(corr: int, ts: float, tid: int = MAIN) -> dict:
    return x("cuda_runtime", "cudaLaunchKernel", ts, 1, tid, correlation=corr)


def kernel(name: str, corr: int, ts: float, dur: float, stream: int = 7, cat: str = "kernel") -> dict:
    return x(cat, name, ts, dur, tid=stream, pid=0, correlation=corr, stream=stream, device=0)


def rank_trace(rank: int = 0, world: int = 4, offset: float = 0.0) -> dict:
    """Two steps; in each (times relative to the step start T):

    - forward GEMM  [T+10, T+40)  launched at T+1 inside ``TENSOR_MODEL_PARALLEL_GROUP`` -> compute
    - TP all-reduce [T+30, T+50)  launched at T+2 from record_param_comms (tp group)
    - backward GEMM [T+60, T+100) launched at T+55 on the autograd thread
    - DP all-reduce [T+80, T+120) launched at T+56 (DATA_PARALLEL_GROUP)
    - pipeline send [T+130, T+140) (SendRecv kernel, PIPELINE_MODEL_PARALLEL_GROUP)
    - optimizer     [T+150, T+160) launched inside Optimizer.step#Adam.step

    Per step: window [10, 160) = 150 us; compute = 30 + 40 + 10 = 80 us; tp 20, dp 40, pp 10;
    comm union = [30,50) + [80,120) + [130,140) = 70 us; overlap = [30,40) + [80,100) = 30 us;
    exposed = 40 us; busy union = [10,50) + [60,120) + [130,140) + [150,160) = 120 -> idle 30 us.
    """
    ev: list[dict] = [
        {"ph": "M", "name": "thread_name", "pid": 42, "tid": AUTOGRAD, "args": {"name": "thread 7 (pt_autograd_0)"}},
        {"ph": "M", "name": "process_labels", "pid": 0, "tid": 0, "args": {"labels": "GPU 0"}},
        {"ph": "s", "id": 999, "pid": 42, "tid": MAIN, "ts": 1, "cat": "ac2g", "name": "ac2g"},  # unpaired flow
    ]
    for k in range(2):
        t = offset + 1000 * k
        c = 10 * k
        ev += [
            x("user_annotation", f"ProfilerStep#{k + 5}", t, 200),
            x("cpu_op", "aten::mm", t + 0.5, 1.0),
            launch(c + 1, t + 1),
            x("cpu_op", "record_param_comms", t + 1.8, 0.5, **{"Collective name": "allreduce", "Process Group Description":
                                                                 "TENSOR_MODEL_PARALLEL_GROUP", "Process Group Ranks": "[0, 1]"}),
            launch(c + 2, t + 2),
            # a slice that only partly overlaps the record above (as real traces have)
            x("cpu_op", "aten::copy_", t + 2.2, 5),
            x("cpu_op", "autograd::engine::evaluate_function: MmBackward0", t + 54, 10, tid=AUTOGRAD),
            launch(c + 3, t + 55, tid=AUTOGRAD),
            x("cpu_op", "record_param_comms", t + 55.9, 0.5, tid=AUTOGRAD,
              **{"Collective name": "allreduce", "Process Group Description": "DATA_PARALLEL_GROUP", "Group size": 2}),
            launch(c + 4, t + 56, tid=AUTOGRAD),
            x("cpu_op", "record_param_comms", t + 69.9, 0.5, **{"Collective name": "send", "Process Group Description":
                                                                  "PIPELINE_MODEL_PARALLEL_GROUP", "Process Group Ranks": [rank % 2, rank % 2 + 2]}),
            launch(c + 5, t + 70),
            x("user_annotation", "Optimizer.step#Adam.step", t + 80, 10),
            launch(c + 6, t + 81),
            kernel("ampere_bf16_gemm_fwd", c + 1, t + 10, 30),
            kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", c + 2, t + 30, 20, stream=20),
            kernel("ampere_bf16_gemm_bwd", c + 3, t + 60, 40),
            kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", c + 4, t + 80, 40, stream=21),
            kernel("ncclDevKernel_SendRecv", c + 5, t + 130, 10, stream=22),
            kernel("multi_tensor_apply_kernel", c + 6, t + 150, 10),
        ]
    return {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world},
            "baseTimeNanoseconds": 1_000_000, "traceEvents": ev}


def write(path: Path, doc: object, gz: bool = False) -> Path:
    data = json.dumps(doc).encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def test_union_and_intersection():
    s, e = union(np.array([0.0, 5, 20, 2]), np.array([3.0, 10, 30, 4]))
    assert list(s) == [0, 5, 20] and list(e) == [4, 10, 30]  # [0,3)+[2,4) merge
    a = union(np.array([0.0, 10]), np.array([5.0, 20]))
    b = union(np.array([3.0]), np.array([12.0]))
    assert intersection_measure(a, b) == 2 + 2  # [3,5) + [10,12)


def test_classification_and_step_metrics(tmp_path):
    trace = load_trace(write(tmp_path / "rank-0.json", rank_trace()))
    act = classify(trace)
    cats = [Category(c).name for c in act.category[act.step == 0]]
    assert sorted(cats) == sorted(["FORWARD", "COMM_TP", "BACKWARD", "COMM_DP", "COMM_PP", "OPTIMIZER"])
    steps = step_metrics(act)
    assert [s["step"] for s in steps] == [5, 6]
    s = steps[0]
    us = 1e-6
    assert s["wall_s"] == pytest.approx(150 * us)
    assert s["compute_s"] == pytest.approx(80 * us)
    assert s["comm_s"] == pytest.approx({"tp": 20 * us, "dp": 40 * us, "pp": 10 * us, "cp": 0.0, "ep": 0.0, "other": 0.0})
    assert s["overlap_s"] == pytest.approx(30 * us)
    assert s["exposed_comm_s"] == pytest.approx(40 * us)
    assert s["idle_s"] == pytest.approx(30 * us)
    assert s["forward_s"] == pytest.approx(30 * us) and s["backward_s"] == pytest.approx(40 * us)
    assert s["optimizer_s"] == pytest.approx(10 * us)
    # the global clock: baseTimeNanoseconds (1 ms) is added
    assert s["start_s"] == pytest.approx(1e-3 + 10 * us)


def test_schema_variants_give_the_same_numbers(tmp_path):
    """Integer ts (older schema), float ts (PyTorch >= 2.3), a bare event list, gzip."""
    doc = rank_trace()
    floats = json.loads(json.dumps(doc))
    for e in floats["traceEvents"]:
        if "ts" in e:
            e["ts"] = float(e["ts"]) + 0.0
    bare = doc["traceEvents"]
    results = []
    for name, d, gz in (("a.json", doc, False), ("b.json.gz", floats, True), ("rank-0.json", bare, False)):
        results.append(step_metrics(classify(load_trace(write(tmp_path / name, d, gz))))[0]["compute_s"])
    assert results[0] == pytest.approx(80e-6) and results[1] == pytest.approx(80e-6)
    assert results[2] == pytest.approx(80e-6)  # no base time: the numbers do not depend on it


def test_one_kernel_many_collectives():
    """SendRecv serves both pipeline sends and all-to-all: the CPU context decides."""
    assert dim_of(None, "nccl:all_to_all", Category.FORWARD, 8, "ncclKernel_SendRecv_RING") == "ep"
    assert dim_of(None, "", Category.FORWARD, 8, "ncclKernel_SendRecv_RING") == "pp"
    assert dim_of(None, "allreduce", Category.BACKWARD, 8, "ncclKernel_AllReduce") == "dp"


def test_gloo_cpu_only_trace(tmp_path):
    """No GPU: compute = top-level CPU operators, comm = c10d operators and gloo threads.

    Step [0, 100): aten::addmm [0, 40) (with a nested aten::mm, not counted twice),
    c10d::allreduce_ [30, 70) (overlaps 10 us of compute), work on a gloo thread [80, 90).
    compute 40, comm 40 + 10 = 50, overlap 10, exposed 40, idle 90 - 80 = 10."""
    ev = [
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 2, "args": {"name": "gloo worker"}},
        x("user_annotation", "ProfilerStep#0", 0, 100, pid=1),
        x("cpu_op", "aten::addmm", 0, 40, pid=1),
        x("cpu_op", "aten::mm", 5, 10, pid=1),
        x("cpu_op", "c10d::allreduce_", 30, 40, tid=3, pid=1),
        x("cpu_op", "gloo:all_reduce", 80, 10, tid=2, pid=1),
    ]
    act = classify(load_trace(write(tmp_path / "rank-0.json", {"distributedInfo": {"backend": "gloo", "rank": 0, "world_size": 2},
                                                                  "traceEvents": ev})))
    assert act.device == "cpu"
    s = step_metrics(act)[0]
    assert s["compute_s"] == pytest.approx(40e-6)
    assert s["comm_total_s"] == pytest.approx(50e-6)
    assert s["overlap_s"] == pytest.approx(10e-6)
    assert s["idle_s"] == pytest.approx(10e-6)


@pytest.mark.parametrize("content, message", [
    (b"", "empty"),
    (b"{not json", "not valid JSON"),
    (b'{"hello": 1}', "not a PyTorch-profiler trace"),
    (b'{"traceEvents": []}', "empty trace"),
])
def test_bad_files(tmp_path, content, message):
    p = tmp_path / "rank-0.json"
    p.write_bytes(content)
    with pytest.raises(TraceError, match=message):
        load_trace(p)


def test_truncated_gzip(tmp_path):
    p = tmp_path / "rank-0.json.gz"
    p.write_bytes(gzip.compress(json.dumps(rank_trace()).encode())[:200])
    with pytest.raises(TraceError, match="truncated or corrupt"):
        load_trace(p)


def test_set_with_bad_and_missing_ranks(tmp_path, capsys):
    """Ranks 0 and 2 good, rank 1 truncated, rank 3 absent (world 4): the good ones are analysed,
    the problems listed in trace_analysis.json and on stdout, exit code 0."""
    folder = tmp_path / "torch_profile"
    folder.mkdir()
    write(folder / "rank-0.json.gz", rank_trace(0), gz=True)
    write(folder / "rank-2.json.gz", rank_trace(2, offset=3.0), gz=True)
    (folder / "rank-1.json.gz").write_bytes(gzip.compress(b'{"traceEvents": [')[:-6])
    out = tmp_path / "out"
    assert main(["trace", str(folder), "--out", str(out), "--processes", "2", "--no-site"]) == 0
    data = json.loads((out / "trace_analysis.json").read_text())
    assert [r["rank"] for r in data["ranks"]] == [0, 2]
    assert any("rank-1.json.gz" in p and "truncated" in p for p in data["problems"])
    assert any("ranks 1, 3" in p for p in data["problems"])
    step = data["ranks"][0]["steps"][0]
    assert set(step) >= {"compute_s", "comm_s", "overlap_s", "exposed_comm_s", "idle_s"}
    assert set(step["comm_s"]) == {"tp", "dp", "pp", "cp", "ep", "other"}
    assert data["pipeline_groups"] == [[0, 2]]
    stdout = capsys.readouterr().out
    assert "truncated" in stdout and "problem" in stdout
    import pyarrow.parquet as pq

    events = pq.read_table(out / "events.parquet")
    assert events.num_rows == 2 * 12 and set(events.column("rank").to_pylist()) == {0, 2}
    steps = pq.read_table(out / "steps.parquet")
    assert steps.num_rows == 4 and "comm_tp_s" in steps.column_names


def test_no_good_rank_is_an_error(tmp_path, capsys):
    bad = tmp_path / "rank-0.json"
    bad.write_text('{"a": 1}')
    assert main(["trace", str(bad), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no rank could be analysed") and err.count("\n") == 1
    assert not (tmp_path / "out" / "trace_analysis.json").exists()
    assert main(["trace", str(tmp_path / "missing.json")]) == 2


def test_site_escapes_trace_strings(tmp_path):
    doc = rank_trace()
    for e in doc["traceEvents"]:
        if e.get("name") == "ampere_bf16_gemm_fwd":
            e["name"] = "<script>alert(1)</script>"
    path = write(tmp_path / "rank-0.json", doc)
    out = tmp_path / "out"
    assert main(["trace", str(path), "--out", str(out)]) == 0
    for page in ("index.html", "timeline.html"):
        assert "<script>alert(1)" not in (out / "site" / page).read_text()
    assert (out / "svg_file" / "trace_gantt_0.svg").is_file()
    html = (out / "site" / "timeline.html").read_text()
    assert 'data-chart="trace-gantt"' in html


def test_comparison_rows():
    steps = [{"forward_s": 1.0, "backward_s": 2.0, "recompute_s": 0.0, "optimizer_s": 0.5, "exposed_comm_s": 0.2, "idle_s": 0.1,
              "wall_s": 4.0, "comm_s": {"tp": 0.3, "dp": 0.4, "pp": 0.0, "cp": 0.0, "ep": 0.0, "other": 0.0}}]
    measured = measured_per_category([{"steps": steps}, {"steps": [dict(steps[0], forward_s=2.0)]}])
    assert measured["compute"] == 4.0  # the larger rank: 2 + 2
    rows = {r["category"]: r for r in comparison_rows({"compute": 5.0, "comm_pp": 0.1}, measured)}
    assert rows["compute"]["error"] == pytest.approx(0.25)
    assert rows["comm_pp"]["error"] is None  # nothing measured


@pytest.mark.slow
def test_predicted_vs_measured_command(tmp_path):
    model = Path(__file__).resolve().parents[1] / "examples" / "gpt2-small.onnx"
    path = write(tmp_path / "rank-0.json", rank_trace())
    out = tmp_path / "out"
    # the trace shows t=2 (TENSOR_MODEL_PARALLEL_GROUP [0, 1]) and p=2 (pipeline group [0, 2]) in a
    # world of 4: --p is taken from it and d = 4 / (2 x 2) = 1 (--d 2 would make 8 ranks: refused)
    assert main(["trace", str(path), "--out", str(out), "--model", str(model), "--t", "2",
                 "--global-batch-size", "4", "--no-site"]) == 0
    data = json.loads((out / "trace_analysis.json").read_text())
    # (the synthetic traces copy no batch to the GPU, so the prediction copies none either)
    assert "d=1 t=2 p=2 (from the flags and the traces' process groups; --d 1 = world size 4 / the others; no input copy " \
        "in the step)" in data["comparison"]["what"]
    assert data["comparison"]["comparable"] and data["comparison"]["caveat"] is None
    rows = {r["category"]: r for r in data["comparison"]["rows"]}
    assert rows["compute"]["measured_s"] == pytest.approx(70e-6)  # forward 30 + backward 40
    assert rows["compute"]["predicted_s"] > 0 and rows["compute"]["error"] is not None
    assert (out / "comparison.csv").read_text().startswith("category,predicted_s,measured_s,error")


def test_analyze_traces_in_processes(tmp_path):
    paths = [write(tmp_path / f"rank-{r}.json", rank_trace(r, world=2)) for r in range(2)]
    one = analyze_traces(paths, processes=1)
    two = analyze_traces(paths, processes=2)
    assert [r.steps for r in one.ranks] == [r.steps for r in two.ranks]
    assert one.problems == []


# ---------------------------------------------------------------------------------------------
# The synthetic fixtures of tests/fixtures/traces (figures worked out in make_traces.py)
# ---------------------------------------------------------------------------------------------

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "traces"
US = 1e-6


def _make_traces():
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_traces", FIXTURES / "make_traces.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _us(d: dict) -> dict:
    return {k: round(v / US, 6) for k, v in d.items()}


def test_fixtures_match_their_generator():
    """The committed files are what make_traces.py writes (edit the script, not the files)."""
    for rel, text in _make_traces().fixtures().items():
        assert (FIXTURES / rel).read_text(encoding="utf-8") == text, rel
        assert len(text) < 200_000


@pytest.fixture(scope="module")
def megatron():
    from dml2comm.traces.load import find_trace_files

    return analyze_traces(find_trace_files([str(FIXTURES / "megatron_tp2_pp2_dp2")]))


def test_megatron_fixture_figures(megatron):
    """t=2 p=2 d=2; stage 0 in the newer schema, stage 1 in an older one (make_traces.py)."""
    ts = megatron
    assert [r.rank for r in ts.ranks] == list(range(8)) and ts.problems == [] and ts.failures == []
    expected = {  # rank: (window, compute, tp, dp, pp, comm union, overlap, exposed, idle)
        0: (1070, 620, 80, 100, 40, 220, 60, 160, 290),
        2: (1110, 620, 80, 140, 40, 260, 60, 200, 290),
        4: (740, 620, 40, 50, 40, 130, 10, 120, 0),
        6: (780, 620, 40, 90, 40, 170, 10, 160, 0),
    }
    for r in ts.ranks:
        assert r.problems == []  # unpaired flows, negative tids, partly overlapping slices: no trouble
        assert [s["step"] for s in r.steps] == [10, 11]
        want = expected[r.rank - r.rank % 2]  # tensor ranks 0 and 1 run the same
        for s in r.steps:
            got = _us({k: s[k] for k in ("wall_s", "compute_s", "comm_total_s", "overlap_s", "exposed_comm_s", "idle_s")})
            comm = _us(s["comm_s"])
            assert (got["wall_s"], got["compute_s"], comm["tp"], comm["dp"], comm["pp"], got["comm_total_s"], got["overlap_s"],
                    got["exposed_comm_s"], got["idle_s"]) == want, r.rank
            assert comm["cp"] == comm["ep"] == comm["other"] == 0
            assert _us({k: s[k] for k in ("forward_s", "backward_s", "optimizer_s")}) == {"forward_s": 200, "backward_s": 400,
                                                                                       "optimizer_s": 20}
    new, old = ts.ranks[0], ts.ranks[4]
    assert (new.schema_version, old.schema_version) == (1, None)
    # the global clock: the newer schema's base time + relative ts equals the older absolute ts (over
    # every event: the rank's event table; its ``activity`` holds the drawn step only)
    first = {r.rank: r.events_table().column("start_us").to_numpy().min() for r in (new, old)}
    assert first[new.rank] == pytest.approx(1e9 + 110) and first[old.rank] == pytest.approx(1e9 + 230)


def test_megatron_fixture_micro_batches(megatron):
    """Stage 0: Megatron's forward_step/backward_step markers (the nested user forward_step is not
    a micro-batch of its own); stage 1 has none: the kernel-run heuristic."""
    by = {r.rank: r for r in megatron.ranks}
    r0, r4, r6 = by[0], by[4], by[6]
    assert r0.segment_method == "markers" and r4.segment_method == "heuristic"
    assert r0.activity.markers == ["megatron/core/pipeline_parallel/schedules.py(266): forward_step",
                                   "megatron/core/pipeline_parallel/schedules.py(380): backward_step"]

    def seg(r):
        return [(s["segment"], round(s["compute_s"] / US, 6), _us(s["comm_s"]), round(s["overlap_s"] / US, 6)) for s in r.segments]

    z = {"cp": 0, "ep": 0, "other": 0}
    assert seg(r0) == [("F1", 100, {"tp": 20, "dp": 0, "pp": 10, **z}, 0), ("F2", 100, {"tp": 20, "dp": 0, "pp": 10, **z}, 0),
                       ("B1", 200, {"tp": 20, "dp": 0, "pp": 10, **z}, 0), ("B2", 200, {"tp": 20, "dp": 100, "pp": 10, **z}, 60)]
    assert seg(r4) == [("F1", 100, {"tp": 20, "dp": 0, "pp": 10, **z}, 0), ("B1", 200, {"tp": 0, "dp": 0, "pp": 20, **z}, 10),
                       ("F2", 100, {"tp": 20, "dp": 0, "pp": 0, **z}, 0), ("B2", 200, {"tp": 0, "dp": 50, "pp": 10, **z}, 0)]
    assert seg(r6)[-1] == ("B2", 200, {"tp": 0, "dp": 90, "pp": 10, **z}, 0)
    d = r0.to_dict()["micro_batches"]
    assert d["method"] == "markers" and d["step"] == 11 and len(d["markers"]) == 2


def test_megatron_fixture_layout(megatron):
    """Replicas are the ranks with the same data-parallel index: stage 0 knows its groups from
    pg_config, stage 1 from the process-group ranks of its collectives."""
    lay = megatron.layout
    assert lay.method == "process groups"
    assert lay.replicas == ((0, 1, 4, 5), (2, 3, 6, 7)) and lay.replica_ids == (0, 1)
    assert [(p.dp, p.pp, p.tp, p.cp) for _, p in sorted(lay.places.items())] == [
        (0, 0, 0, None), (0, 0, 1, None), (1, 0, 0, None), (1, 0, 1, None),
        (0, 1, 0, None), (0, 1, 1, None), (1, 1, 0, None), (1, 1, 1, None)]
    assert megatron.pipeline_groups == [(0, 4), (1, 5), (2, 6), (3, 7)]
    assert lay.places[5].label() == "rank 5 · pp 1 · tp 1"


def test_megatron_fixture_through_the_command(tmp_path):
    """trace_analysis.json (layout with each replica's step and slowest rank, micro-batch method),
    the Parquet tables with the cp column and category, the drawings and both site pages."""
    out = tmp_path / "out"
    assert main(["trace", str(FIXTURES / "megatron_tp2_pp2_dp2"), "--out", str(out)]) == 0
    data = json.loads((out / "trace_analysis.json").read_text())
    lay = data["layout"]
    assert lay["method"] == "process groups"
    assert [(r["replica"], r["ranks"], round(r["step_s"] / US, 6), r["slowest_rank"]) for r in lay["replicas"]] == [
        (0, [0, 1, 4, 5], 1070, 0), (1, [2, 3, 6, 7], 1110, 2)]
    assert set(data["ranks"][0]["steps"][0]["comm_s"]) == {"tp", "dp", "pp", "cp", "ep", "other"}
    assert data["ranks"][4]["micro_batches"]["method"] == "heuristic"
    assert data["ranks"][0]["groups"] == {"dp": [0, 2], "pp": [0, 4], "tp": [0, 1]}
    import pyarrow.parquet as pq

    assert "comm_cp_s" in pq.read_table(out / "steps.parquet").column_names
    svgs = sorted(p.name for p in (out / "svg_file").iterdir())
    assert svgs[:2] == ["rank_bars.svg", "trace_gantt_0.svg"] and "trace_replica_1.svg" in svgs
    index = (out / "site" / "index.html").read_text().replace("\u00a0", " ")  # numbers keep their unit (no-break space)
    timeline = (out / "site" / "timeline.html").read_text()
    assert 'data-chart="trace-replicas"' in index and "Replica 1: step 1.11 ms, slowest rank 2" in index
    assert "Model replica 0: ranks 0, 1, 4, 5" in timeline and "Pipeline group 3: ranks 3, 7" in timeline
    assert ">B2</text>" in timeline  # micro-batch labels on the Gantt rows
    assert "explicit markers" in timeline and "kernel-run heuristic" in timeline


def test_cp_ep_fixture():
    """Context- and expert-parallel groups on the same ranks, told apart by descriptions (rank 0),
    by pg_config names (rank 1), by Transformer Engine's CP attention spans and the all-to-all
    name (ranks 2 and 3): every rank measures the same."""
    from dml2comm.traces.load import find_trace_files, load_trace

    ts = analyze_traces(find_trace_files([str(FIXTURES / "cp_ep")]))
    assert ts.problems == []
    for r in ts.ranks:
        s = r.steps[0]
        assert _us(s["comm_s"]) == {"tp": 0, "dp": 60, "pp": 0, "cp": 70, "ep": 60, "other": 0}, r.rank
        assert _us({k: s[k] for k in ("wall_s", "compute_s", "comm_total_s", "overlap_s", "exposed_comm_s", "idle_s")}) == {
            "wall_s": 500, "compute_s": 320, "comm_total_s": 190, "overlap_s": 70, "exposed_comm_s": 120, "idle_s": 60}
        assert r.segment_method == "heuristic"
        assert [(x["segment"], round(x["compute_s"] / US, 6), round(x["comm_total_s"] / US, 6), round(x["overlap_s"] / US, 6))
                for x in r.segments] == [("F1", 100, 70, 30), ("B1", 200, 120, 40)]
    rec = [c for c in load_trace(FIXTURES / "cp_ep" / "rank-1.json").comms if c.pg_name == "4"][0]
    assert (rec.pg_desc, rec.ranks) == ("CONTEXT_PARALLEL_GROUP", (0, 1))  # resolved through pg_config
    lay = ts.layout
    assert lay.replicas == ((0, 1), (2, 3)) and lay.replica_ids == (0, 1)
    assert [(p.dp, p.cp) for _, p in sorted(lay.places.items())] == [(0, 0), (0, 1), (None, 0), (None, 1)]


def test_gloo_fixture():
    from dml2comm.traces.load import find_trace_files

    ts = analyze_traces(find_trace_files([str(FIXTURES / "gloo_cpu")]))
    for r in ts.ranks:
        assert r.activity.device == "cpu" and len(r.steps) == 2
        for s in r.steps:
            assert _us({k: s[k] for k in ("wall_s", "compute_s", "comm_total_s", "overlap_s", "exposed_comm_s", "idle_s")}) == {
                "wall_s": 99, "compute_s": 73, "comm_total_s": 35, "overlap_s": 10, "exposed_comm_s": 25, "idle_s": 1}
            assert _us(s["comm_s"])["dp"] == 35
    assert ts.layout.replicas == ((0,), (1,)) and ts.layout.method == "process groups"


def test_process_group_dimensions():
    from dml2comm.traces.classify import pg_dim
    from dml2comm.traces.load import CommRecord

    cases = {
        "CONTEXT_PARALLEL_GROUP": "cp", "mesh_cp": "cp", "HIERARCHICAL_CONTEXT_PARALLEL_GROUPS": "cp",
        "DATA_PARALLEL_GROUP_WITH_CP": "dp", "INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP": "dp", "mesh_dp_shard_cp": "dp",
        "TENSOR_AND_CONTEXT_PARALLEL_GROUP": "other", "TENSOR_AND_DATA_PARALLEL_GROUP_WITH_CP": "other",
        "MODEL_PARALLEL_GROUP": "other", "EXPERT_DATA_PARALLEL_GROUP": "dp", "EXPERT_MODEL_PARALLEL_GROUP": "ep",
        "EXPERT_TENSOR_PARALLEL_GROUP": "tp", "TENSOR_MODEL_PARALLEL_GROUP": "tp", "mesh_tp": "tp",
        "PIPELINE_MODEL_PARALLEL_GROUP": "pp", "EMBEDDING_GROUP": "pp", "default_pg": None, "cpu_group": None, "5": None,
    }
    assert {k: pg_dim(k) for k in cases} == cases
    rec = CommRecord(0, "send", "", "", (2, 3), 2)
    assert dim_of(rec, "send", Category.FORWARD, 4, "ncclDevKernel_SendRecv") == "pp"
    assert dim_of(rec, "send", Category.FORWARD, 4, "ncclDevKernel_SendRecv", in_cp=True) == "cp"
    assert dim_of(rec, "allreduce", Category.BACKWARD, 4, "nccl", group_dim="tp") == "tp"  # the group's described dimension


def test_micro_batch_marker_patterns():
    from dml2comm.traces.patterns import BACKWARD_MICROBATCH, FORWARD_MICROBATCH, MICROBATCH

    forward = ["forward_step", "megatron/core/pipeline_parallel/schedules.py(266): forward_step", "Forward 3", "PP:0F3",
               "## forward ##"]
    backward = ["backward_step", "schedules.py(380): backward_step", "Backward 0", "PP:1B2", "PP:0I2", "PP:0W2", "## backward ##"]
    neither = ["## forward:sparse_arch ##", "DistributedDataParallel.forward", "PP:0SEND_F3", "forward", "aten::mm"]
    assert all(FORWARD_MICROBATCH.search(n) for n in forward) and not any(FORWARD_MICROBATCH.search(n) for n in backward + neither)
    assert all(BACKWARD_MICROBATCH.search(n) for n in backward) and not any(BACKWARD_MICROBATCH.search(n) for n in forward + neither)
    assert [bool(MICROBATCH.search(n)) for n in ("microbatch 3", "micro_batch_3", "mb7", "MicroBatch#2", "mbox")] == [
        True, True, True, True, False]


def test_whole_micro_batch_markers(tmp_path):
    """User ranges "microbatch N" around forward and backward: one segment each, labelled M."""
    doc = rank_trace()
    for k in range(2):
        t = 1000 * k
        doc["traceEvents"] += [x("user_annotation", "microbatch 0", t + 0.2, 50), x("user_annotation", "microbatch 1", t + 53, 40)]
    r = analyze_traces([write(tmp_path / "rank-0.json", doc)]).ranks[0]
    assert r.segment_method == "markers" and [s["segment"] for s in r.segments] == ["M1", "M2"]
    # M1: the forward GEMM and the TP all-reduce; M2: backward GEMM, DP all-reduce, pipeline send
    assert [round(s["compute_s"] / US, 6) for s in r.segments] == [30, 40]
    assert [round(s["comm_total_s"] / US, 6) for s in r.segments] == [20, 50]


def test_layout_fallbacks():
    from dml2comm.traces.layout import ParallelSizes, rank_layout

    # no groups, sizes given: Megatron's order (t fastest, then c, d, p) for t=2 c=2 d=2 p=1
    lay = rank_layout({r: {} for r in range(8)}, 8, ParallelSizes(dp=2, tp=2, pp=1, cp=2))
    assert lay.method == "configuration"
    assert lay.replicas == ((0, 1, 2, 3), (4, 5, 6, 7))  # rank = t + 2 c + 4 d; within a replica by (pp, cp, tp)
    assert (lay.places[6].dp, lay.places[6].cp, lay.places[6].tp) == (1, 1, 0)
    # sizes that do not match the world: assumed, each rank its own replica
    lay = rank_layout({r: {} for r in range(4)}, 4, ParallelSizes(dp=2))
    assert lay.method == "assumed" and lay.replicas == ((0,), (1,), (2,), (3,))
    # tensor groups only (no data-parallel index): joined ranks form replicas numbered by smallest
    # rank; rank 3 knows no group but rank 2's group names it; rank 5 is alone
    lay = rank_layout({0: {"tp": (0, 1)}, 1: {"tp": (0, 1)}, 2: {"tp": (2, 3)}, 3: {}, 5: {}}, 8)
    assert lay.method == "process groups" and lay.replicas == ((0, 1), (2, 3), (5,)) and lay.replica_ids == (0, 1, 2)
    assert lay.detail.endswith("; 1 rank without group information (5) forms a replica of its own")


def test_predicted_cp_row():
    from dml2comm.traces.compare import predicted_per_category

    predicted = predicted_per_category({"compute_time_s": 1.0}, {"cp": {"time_s": 0.25}, "tp": {"time_s": 0.5}})
    assert predicted["comm_cp"] == 0.25 and predicted["comm_ep"] is None
    steps = [{"forward_s": 1.0, "backward_s": 0.0, "recompute_s": 0.0, "optimizer_s": 0.0, "exposed_comm_s": 0.0, "idle_s": 0.0,
              "wall_s": 1.0, "comm_s": {"tp": 0.0, "dp": 0.0, "pp": 0.0, "cp": 0.2, "ep": 0.0, "other": 0.0}}]
    rows = {r["category"]: r for r in comparison_rows(predicted, measured_per_category([{"steps": steps}]))}
    assert rows["comm_cp"]["label"] == "context-parallel communication"
    assert rows["comm_cp"]["error"] == pytest.approx(0.25)  # (0.25 - 0.2) / 0.2
