"""Trace layouts from send/recv peers, flags checked against the traces, hand-written pipeline
markers, CPU-only traces against a GPU prediction (issue 16, part 8).

The real fixture ``tests/fixtures/traces/gloo_pp2_dp2/`` is a 4-process gloo run of a 2-stage
pipeline x 2 data-parallel replicas, made with PyTorch by ``make_gloo_pp2_dp2.py`` there (rank =
replica + 2 x stage: pipelines 0 -> 2 and 1 -> 3, data-parallel groups (0, 1) and (2, 3); 2
micro-batches in ``forward_mbN``/``backward_mbN`` ranges; 2 profiled steps).  Its timings are
real, so only what does not depend on them is asserted.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from dml2comm.cli import main
from dml2comm.traces.analyze import analyze_traces
from dml2comm.traces.layout import PeerCounts, RankLinks, pipelines_from_peers, rank_layout
from dml2comm.traces.load import find_trace_files

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "traces" / "gloo_pp2_dp2"
MODEL = Path(__file__).resolve().parents[1] / "examples" / "gpt2-small.onnx"


def _run(args: list[str], capsys) -> tuple[int, str, str]:
    code = main(["trace", *map(str, args)])
    out = capsys.readouterr()
    return code, out.out, out.err


# ---------------------------------------------------------------------------------------------
# the real 4-rank gloo fixture through the command line
# ---------------------------------------------------------------------------------------------


def test_real_gloo_fixture_layout_through_the_command(tmp_path, capsys):
    out = tmp_path / "out"
    code, stdout, err = _run([FIXTURE, "--no-site", "--json", "--out", out], capsys)
    assert code == 0 and err == ""
    assert [r["rank"] for r in json.loads(stdout)["ranks"]] == [0, 1, 2, 3]
    data = json.loads((out / "trace_analysis.json").read_text())
    lay = data["layout"]
    assert lay["method"] == "send/recv peers"
    assert "c10d::send/recv_ peer arguments" in lay["detail"] and "(0, 1), (2, 3)" in lay["detail"]
    # rank = replica + 2 x stage: replica 0 = ranks 0 (stage 0) -> 2 (stage 1), replica 1 = 1 -> 3
    assert [(r["replica"], r["ranks"]) for r in lay["replicas"]] == [(0, [0, 2]), (1, [1, 3])]
    assert [(r["rank"], r["replica"], r["dp"], r["pp"]) for r in lay["ranks"]] == [
        (0, 0, 0, 0), (1, 1, 1, 0), (2, 0, 0, 1), (3, 1, 1, 1)]
    assert lay["sizes"] == {"dp": 2, "pp": 2, "tp": 1, "cp": 1}  # tp = cp = 1: 2 x 2 fills the world of 4
    assert data["pipeline_groups"] == [[0, 2], [1, 3]]
    for r in data["ranks"]:
        mb = r["micro_batches"]
        assert mb["method"] == "markers" and [s["segment"] for s in mb["segments"]] == ["F1", "F2", "B1", "B2"]
        assert mb["markers"] == ["forward_mb0", "forward_mb1", "backward_mb0", "backward_mb1"]
        assert len(r["steps"]) == 2
        # the pipeline sends/recvs are pp, the gradient all-reduces dp, nothing else
        assert all(s["comm_s"]["pp"] > 0 and s["comm_s"]["dp"] > 0 and s["comm_s"]["tp"] == 0 for s in r["steps"])


def test_real_gloo_fixture_hta_overlap_not_applicable(tmp_path, capsys):
    """HTA counts GPU kernels: none on a CPU trace, so n/a; the ratio on CPU operators instead."""
    out = tmp_path / "out"
    assert _run([FIXTURE, "--no-site", "--out", out], capsys)[0] == 0
    data = json.loads((out / "trace_analysis.json").read_text())
    for r in data["ranks"]:
        hta = r["hta"]
        assert hta["comm_comp_overlap_pct"] is None and "no GPU kernels" in hta["not_applicable"]
        # 100 x sum(overlap) / sum(comm union) over the steps, rounded to 2 decimals
        expected = round(100 * math.fsum(s["overlap_s"] for s in r["steps"]) / math.fsum(s["comm_total_s"] for s in r["steps"]), 2)
        assert hta["cpu_comm_comp_overlap_pct"] == expected


@pytest.mark.parametrize("flags, message", [
    (["--p", "4"], "error: --p 4 contradicts the traces: they show 2 pipeline stages x 2 data-parallel replicas "
                   "(from send/recv peers: 2 pipeline stages); pass --p 2 or leave --p out"),
    (["--d", "3"], "error: --d 3 contradicts the traces: they show 2 pipeline stages x 2 data-parallel replicas "
                   "(from send/recv peers: 2 data-parallel replicas); pass --d 2 or leave --d out"),
    (["--d", "1", "--model", MODEL], "error: --d 1 contradicts the traces"),
    (["--t", "2"], "error: --t 2 contradicts the traces"),
    (["--schedule", "gpipe", "--gpu", "h100"], "error: --schedule, --gpu are used only by the prediction: add --model "
                                               "MODEL.onnx or drop them"),
    (["--rank-order", "dtp"], "error: --rank-order is not used: the ranks are placed from send/recv peers"),
])
def test_flags_the_traces_contradict_or_cannot_honour(tmp_path, capsys, flags, message):
    out = tmp_path / "out"
    code, stdout, err = _run([FIXTURE, "--no-site", "--out", out, *flags], capsys)
    assert code == 2 and err.startswith(message) and err.count("\n") == 1 and stdout == ""
    assert not out.exists()


def test_flags_that_agree_are_accepted(tmp_path, capsys):
    assert _run([FIXTURE, "--no-site", "--out", tmp_path / "out", "--d", "2", "--p", "2", "--t", "1"], capsys)[0] == 0


def test_cpu_traces_against_a_gpu_prediction(tmp_path, capsys):
    """The sizes come from the traces (d=2 p=2, not the default d=1); the CPU-only traces are not
    compared with the GPU prediction: a caveat instead of the error column."""
    out = tmp_path / "out"
    code, stdout, _ = _run([FIXTURE, "--no-site", "--out", out, "--model", MODEL], capsys)
    assert code == 0
    cmp = json.loads((out / "trace_analysis.json").read_text())["comparison"]
    assert "d=2 t=1 p=2 (from the traces' send/recv peers)" in cmp["what"]
    assert cmp["comparable"] is False and cmp["caveat"].startswith("the traces are CPU-only (gloo backend, no GPU kernels)")
    assert all(r["error"] is None for r in cmp["rows"]) and any(r["measured_s"] for r in cmp["rows"])
    assert "not comparable:" in stdout and "%" not in stdout.split("predicted vs measured")[1].split("not comparable")[0]


def test_comparison_caveat():
    from dml2comm.traces.compare import comparison_caveat, comparison_rows

    assert comparison_caveat(["gpu", "gpu"], {"nccl"}, "H100") is None
    assert comparison_caveat(["cpu", "gpu"], {"gloo", "nccl"}, "H100").startswith("1 of 2 traces are CPU-only (gloo, nccl backend")
    rows = comparison_rows({"compute": 1.0}, {"compute": 200.0}, comparable=False)
    assert rows[0]["error"] is None  # would be (1 - 200) / 200 = -99.5 %


# ---------------------------------------------------------------------------------------------
# the layout from peers, by hand
# ---------------------------------------------------------------------------------------------


def test_pipeline_from_peers_order_and_notes():
    # 4 -> 0 -> 2: rank 0's first operation with 4 is a receive (4 upstream), with 2 a send
    links = {0: RankLinks({4: PeerCounts(4, 2), 2: PeerCounts(4, -2)}), 2: RankLinks({0: PeerCounts(4, 2)}),
             4: RankLinks({0: PeerCounts(4, -2)})}
    pipes = pipelines_from_peers(links, 8)
    assert pipes.chains == ((4, 0, 2),) and dict(pipes.stage) == {4: 0, 0: 1, 2: 2} and pipes.notes == ()
    # a ring (interleaved schedule: the last stage sends to the first): stage 0 at the smallest rank
    ring = {r: RankLinks({(r + 1) % 3: PeerCounts(2, -1), (r - 1) % 3: PeerCounts(2, 1)}) for r in range(3)}
    pipes = pipelines_from_peers(ring, 3)
    assert pipes.chains == ((0, 1, 2),) and "ring" in pipes.notes[0]
    # rank 0 names peer 1 (a rank of a group, misread as global) but rank 1's trace names only 3:
    # ignored; 1 - 3 without direction: the smaller rank upstream, said in a note
    odd = {0: RankLinks({1: PeerCounts(1, -1)}), 1: RankLinks({3: PeerCounts(2, 0)}), 3: RankLinks({1: PeerCounts(2, 0)})}
    pipes = pipelines_from_peers(odd, 4)
    assert pipes.chains == ((1, 3),)
    assert pipes.notes == ("peers that the other rank's trace does not name are ignored (0-1)",
                           "the traffic does not tell the direction of 1-3: the smaller rank is taken as upstream")
    assert pipelines_from_peers({0: RankLinks({}), 1: RankLinks({})}, 2) is None


def test_peers_fix_a_send_over_the_default_group():
    """NCCL traces of the same loop: the sends run over the default group (all 4 ranks, read as a
    pipeline group by its ranks alone) and the all-reduces over (0, 1) and (2, 3).  Without the
    peers the 4 ranks are one replica; with them, 2 replicas of 2 stages."""
    world = (0, 1, 2, 3)
    groups = {r: {"dp": (0, 1) if r < 2 else (2, 3), "pp": world} for r in range(4)}
    assert rank_layout(groups, 4).replicas == ((0, 1, 2, 3),)
    links = {r: RankLinks({r + 2: PeerCounts(2, -2)} if r < 2 else {r - 2: PeerCounts(2, 2)}) for r in range(4)}
    lay = rank_layout(groups, 4, links=links)
    assert lay.method == "process groups" and lay.detail.endswith("; pipeline groups and stages from the send/recv peers")
    assert lay.replicas == ((0, 2), (1, 3)) and lay.replica_ids == (0, 1)
    assert [(p.dp, p.pp) for _, p in sorted(lay.places.items())] == [(0, 0), (1, 0), (0, 1), (1, 1)]
    assert (lay.sizes["dp"], lay.sizes["pp"]) == (2, 2)


def test_peers_without_a_data_parallel_group():
    """Two pipelines and no group joining them: replicas numbered by their smallest rank, the
    data-parallel size = the number of pipelines (they fill the world)."""
    links = {0: RankLinks({1: PeerCounts(1, -1)}, ((0, 1, 2, 3),)), 1: RankLinks({0: PeerCounts(1, 1)}),
             2: RankLinks({3: PeerCounts(1, -1)}), 3: RankLinks({2: PeerCounts(1, 1)})}
    lay = rank_layout({r: {} for r in range(4)}, 4, links=links)
    assert lay.method == "send/recv peers" and lay.replicas == ((0, 1), (2, 3)) and lay.replica_ids == (0, 1)
    assert "no process group joins the pipelines" in lay.detail
    assert [lay.places[r].dp for r in range(4)] == [None] * 4 and lay.sizes == {"dp": 2, "pp": 2, "cp": 1, "tp": 1}


# ---------------------------------------------------------------------------------------------
# synthetic CPU traces: peers from record_param_comms, markers, flags on an "assumed" layout
# ---------------------------------------------------------------------------------------------


def _x(name: str, ts: float, dur: float, cat: str = "cpu_op", tid: int = 1, **args) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 9, "tid": tid, "ts": ts, "dur": dur, "args": args}


def _write(path: Path, rank: int, world: int, events: list[dict]) -> Path:
    doc = {"distributedInfo": {"backend": "gloo", "rank": rank, "world_size": world},
           "traceEvents": [_x("ProfilerStep#1", 0, 1000, cat="user_annotation"), *events]}
    path.write_text(json.dumps(doc))
    return path


def test_forward_mb_markers_give_n_micro_batches(tmp_path):
    """forward_mb0..2 then backward_mb0..2 (each around one aten::mm of 10 us; 10 us apart): 6
    segments F1..F3 B1..B3 by markers; the backward_mbN ranges are the backward phase (forward
    30 us, backward 30 us)."""
    ev = []
    for k in range(3):
        ev += [_x(f"forward_mb{k}", 10 + 20 * k, 12, cat="user_annotation"), _x("aten::mm", 11 + 20 * k, 10)]
        ev += [_x(f"backward_mb{k}", 100 + 20 * k, 12, cat="user_annotation"), _x("aten::mm", 101 + 20 * k, 10)]
    r = analyze_traces([_write(tmp_path / "rank-0.json", 0, 1, ev)]).ranks[0]
    assert r.segment_method == "markers" and [s["segment"] for s in r.segments] == ["F1", "F2", "F3", "B1", "B2", "B3"]
    assert round(r.steps[0]["forward_s"] * 1e6, 6) == 30 and round(r.steps[0]["backward_s"] * 1e6, 6) == 30


def test_record_param_comms_peers_are_global_ranks(tmp_path):
    """``Dst Rank``/``Src Rank`` of record_param_comms are global ranks (PyTorch writes
    groupRanks[rank]); they win over the c10d operator around them (whose peer, 1, is a rank in
    the pipeline group (2, 6))."""
    def p2p(op: str, ts: float, peer: int) -> list[dict]:
        key = "Dst Rank" if op == "send" else "Src Rank"
        return [_x(f"c10d::{op}" + ("_" if op == "recv" else ""), ts, 5, **{"Concrete Inputs": ["", "", "1", "0"]}),
                _x("record_param_comms", ts + 1, 3, **{"Collective name": op, key: peer, "Process Group Ranks": "[2, 6]"})]

    paths = [_write(tmp_path / "rank-2.json", 2, 8, p2p("send", 10, 6)), _write(tmp_path / "rank-6.json", 6, 8, p2p("recv", 10, 2))]
    ts = analyze_traces(paths)
    assert [r.links.peers for r in ts.ranks] == [{6: PeerCounts(1, -1)}, {2: PeerCounts(1, 1)}]
    assert not ts.ranks[0].links.group_local
    assert ts.layout.method == "process groups"  # the (2, 6) group of the sends, read as pp, and the peers agree
    assert ts.layout.replicas == ((2, 6),) and (ts.layout.places[2].pp, ts.layout.places[6].pp) == (0, 1)


def test_sizes_that_do_not_fill_the_world(tmp_path, capsys):
    """4 ranks that name no group and no peer: --d 3 makes 3 ranks (refused); --d 2 --p 2 place
    them by the configuration (rank = d + 2 p)."""
    folder = tmp_path / "traces"
    folder.mkdir()
    for r in range(4):
        _write(folder / f"rank-{r}.json", r, 4, [_x("aten::mm", 10, 10), _x("c10d::allreduce_", 30, 10)])
    out = tmp_path / "out"
    code, _, err = _run([folder, "--no-site", "--out", out, "--d", "3"], capsys)
    assert code == 2 and err == ("error: --d 3 --t 1 --p 1 --cp 1 make 3 ranks, but the traces come from a world of 4 ranks; "
                                 "give sizes whose product is 4\n")
    assert not out.exists()
    assert _run([folder, "--no-site", "--out", out, "--d", "2", "--p", "2"], capsys)[0] == 0
    lay = json.loads((out / "trace_analysis.json").read_text())["layout"]
    assert lay["method"] == "configuration" and [r["ranks"] for r in lay["replicas"]] == [[0, 2], [1, 3]]


def test_hand_written_pipeline_marker_patterns():
    from dml2comm.traces.patterns import BACKWARD_MARKERS, BACKWARD_MICROBATCH, FORWARD_MICROBATCH

    assert [bool(FORWARD_MICROBATCH.search(n)) for n in ("forward_mb0", "forward_mb12", "fwd_mb_3", "forward_microbatch_2",
                                                         "forward_mb", "backward_mb0")] == [True, True, True, True, False, False]
    assert [bool(BACKWARD_MICROBATCH.search(n)) for n in ("backward_mb0", "bwd_mb_3", "backward_mb", "forward_mb0")] == [
        True, True, False, False]
    assert BACKWARD_MARKERS.search("backward_mb3") and not BACKWARD_MARKERS.search("forward_mb3")


def test_prediction_refuses_a_seq_len_the_model_cannot_take(tmp_path, capsys):
    """The bundled GPT-2 is a fixed-length (1,024) export: --seq-len 128 would only scale the
    prediction's tokens/s, so the trace command refuses it as the analysis does."""
    out = tmp_path / "out"
    code, _, err = _run([FIXTURE, "--no-site", "--out", out, "--model", MODEL, "--seq-len", "128"], capsys)
    assert code == 2
    assert "sequence length is fixed at 1024" in err and not out.exists()
