"""Scaling studies: GPU-count parsing, the batch plan, efficiency and speed-up, where scaling
breaks down and why, and ``sweep --scaling`` end to end."""

from __future__ import annotations

import csv
import dataclasses
import html as htmllib
import json
import re
import shlex
from pathlib import Path

import pytest

from dml2comm import zoo
from dml2comm.errors import ConfigError
from dml2comm.hardware.cluster import get_cluster
from dml2comm.cli import main
from dml2comm.fmt import fmt_s
from dml2comm.cli.search import run_sweep_command
from dml2comm.search.reproduce import Hardware, scaling_reproduce
from dml2comm.search.scaling import (SCALING_COLUMNS, breakdown_reason, parse_gpu_counts, plan_scaling, run_scaling,
                                     scaling_summary)
from dml2comm.search.space import Constraints
from dml2comm.search.sweep import SweepSpace, run_sweep


def _builder(num_gpus):
    return dataclasses.replace(get_cluster("dgx-a100", num_gpus), collective_overhead_s=0.0)


@pytest.fixture(scope="module")
def gpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("scaling") / "gpt.onnx"
    zoo.save(zoo.build_gpt(layers=4, hidden=256, heads=8, vocab=1000, seq_len=128), path)
    return str(path)


#: A narrow space: a few configurations per count keeps each sweep well under a second.
TINY = Constraints(micro_batch_sizes=(1, 2), virtual_stages=(1,), zero_stages=(0,), recompute=("none",), sequence_parallel=(False,))
TINY_ARGS = ["--micro-batch-sizes", "1,2", "--virtual-stages", "1", "--zero", "0", "--recompute", "none", "--no-sp"]


# ---- parsing and the plan
def test_parse_gpu_counts():
    assert parse_gpu_counts("8,16,32") == (8, 16, 32)
    assert parse_gpu_counts("8, 16, ..., 1024") == (8, 16, 32, 64, 128, 256, 512, 1024)
    assert parse_gpu_counts("1,3,...,27,64") == (1, 3, 9, 27, 64)
    for bad, words in (("0,8", "positive"), ("8", "at least two"), ("16,8", "ascending"), ("8,8", "ascending"),
                       ("8,x", "positive GPU counts"), ("8,12,...,64", "whole ratio"), ("8,16,...,100", "not 16 times a power"),
                       ("8,...,64", "two counts before"), ("8,16,...", "ends with")):
        with pytest.raises(ConfigError, match=words) as info:
            parse_gpu_counts(bad)
        assert "\n" not in str(info.value)


def test_plan_strong_and_weak_batches():
    strong = plan_scaling((8, 16, 32), global_batch_size=512)
    assert strong.mode == "strong" and [strong.batch_for(n) for n in (8, 16, 32)] == [512, 512, 512]
    assert plan_scaling((8, 16)).global_batch_size == 16  # default: one sample per GPU at the largest count
    weak = plan_scaling((8, 16, 32), weak=True, global_batch_size=64)  # 8 per GPU, from the first count
    assert weak.per_gpu_batch == 8 and [weak.batch_for(n) for n in (8, 16, 32)] == [64, 128, 256]
    assert plan_scaling((8, 16), weak=True, per_gpu_batch=3).batch_for(16) == 48
    assert plan_scaling((8, 16), weak=True).per_gpu_batch == 1
    for kwargs, words in ((dict(weak=True, global_batch_size=100), "not a multiple of the first GPU count 8"),
                          (dict(per_gpu_batch=2), "--per-gpu-batch is for weak scaling"),
                          (dict(weak=True, per_gpu_batch=2, global_batch_size=64), "not both"),
                          (dict(threshold=0.0), "efficiency-threshold"), (dict(threshold=1.5), "efficiency-threshold")):
        with pytest.raises(ConfigError, match=words):
            plan_scaling((8, 16), **kwargs)


# ---- the math on synthetic points
def _row(t, compute, bubble=0.0, comm=0.0, opt=0.0, d=1, tp=1, p=1, m=8, bf=0.0):
    config = {"d": d, "t": tp, "p": p, "micro_batch_size": 1, "num_micro_batches": m, "virtual_stages": 1, "zero_stage": 0,
              "recompute": "none", "sequence_parallel": False, "schedule": "1f1b"}
    return {"index": 0, "config": config, "iteration_time_s": t, "compute_time_s": compute, "bubble_time_s": bubble,
            "exposed_comm_time_s": comm, "optimizer_time_s": opt, "bubble_fraction": bf, "fits": True, "error": None,
            "peak_memory_bytes": 1e9}


def _point(n, batch, best, status="ok", reason=None, dims=None):
    return {"gpus": n, "global_batch_size": batch, "status": status, "best": best, "reason": reason,
            "comm_time_by_dim_s": dims or {}}


def test_strong_efficiency_formula_and_bubble_breakdown():
    plan = plan_scaling((8, 16, 32), global_batch_size=64)
    points = [_point(8, 64, _row(1.0, 0.9, opt=0.1, d=8, m=8)),
              _point(16, 64, _row(0.55, 0.45, comm=0.05, opt=0.05, d=16, m=4)),  # E = 1*8 / (0.55*16) = 0.909
              _point(32, 64, _row(0.5, 0.225, bubble=0.2, opt=0.025, d=16, p=2, m=4, bf=0.8))]  # E = 8 / 16 = 0.5
    s = scaling_summary(points, plan, seq_len=128)
    assert s["baseline_gpus"] == 8
    assert [p["efficiency"] for p in points] == pytest.approx([1.0, 8 / (0.55 * 16), 8 / (0.5 * 32)])
    assert [p["speedup"] for p in points] == pytest.approx([1.0, 1 / 0.55, 2.0])
    assert [p["ideal_speedup"] for p in points] == [1.0, 2.0, 4.0]
    assert points[1]["samples_per_s"] == pytest.approx(64 / 0.55) and points[1]["tokens_per_s"] == pytest.approx(64 * 128 / 0.55)
    assert s["breakdown"]["gpus"] == 32 and s["breakdown"]["kind"] == "bubble"
    assert "pipeline bubble" in s["verdict"] and "scaling breaks down at 32 GPUs" in s["verdict"]


def test_weak_efficiency_formula_and_comm_breakdown():
    plan = plan_scaling((8, 16, 32), weak=True, per_gpu_batch=4)
    points = [_point(8, 32, _row(1.0, 0.95, comm=0.05, d=8)),
              _point(16, 64, _row(1.1, 0.95, comm=0.15, d=16)),  # E = 1 / 1.1
              _point(32, 128, _row(1.5, 0.95, comm=0.55, d=32), dims={"dp": 0.9, "tp": 0.0})]
    s = scaling_summary(points, plan, seq_len=None)
    assert [p["efficiency"] for p in points] == pytest.approx([1.0, 1 / 1.1, 1 / 1.5])
    assert [p["speedup"] for p in points] == pytest.approx([1.0, 2 / 1.1, 4 / 1.5])  # throughput ratio
    assert points[2]["tokens_per_s"] is None
    assert s["breakdown"]["gpus"] == 32 and s["breakdown"]["kind"] == "exposed_comm"
    assert "data-parallel gradient reduction over d=32" in s["breakdown"]["reason"]
    kind, words = breakdown_reason(points[0], points[1], "weak")
    assert kind == "exposed_comm" and "100% of the time lost" in words


def test_breakdown_at_a_count_that_cannot_split_the_batch_or_does_not_fit():
    plan = plan_scaling((8, 16, 32), global_batch_size=8)
    points = [_point(8, 8, _row(1.0, 1.0, d=8)), _point(16, 8, None, "no_config", "no valid configuration of 16 GPUs"),
              _point(32, 8, None, "no_fit", "no configuration fits in memory on 32 GPUs")]
    s = scaling_summary(points, plan, seq_len=128)
    assert s["breakdown"]["kind"] == "cannot_split" and s["breakdown"]["gpus"] == 16
    assert "cannot be split over 16 GPUs" in s["verdict"]
    # before the baseline nothing breaks down: the first fitting count is the baseline
    points = [_point(8, 8, None, "no_fit", "no configuration fits"), _point(16, 8, _row(1.0, 1.0, d=8)),
              _point(32, 8, _row(0.5, 0.5, d=8, tp=4))]
    s = scaling_summary(points, plan, seq_len=128)
    assert s["baseline_gpus"] == 16 and s["breakdown"] is None and points[2]["efficiency"] == pytest.approx(1.0)
    assert "scaling holds from 16 GPUs to 32 GPUs" in s["verdict"]
    kind, words = breakdown_reason(points[1], dict(points[2], best=_row(1.0, 0.5, opt=0.5, d=8, tp=4)), "strong")
    assert kind == "optimizer"


# ---- real sweeps on a small zoo model
def test_run_scaling_strong_matches_the_sweeps(gpt):
    plan = plan_scaling((2, 4, 8), global_batch_size=16)
    study = run_scaling(gpt, plan, _builder, SweepSpace(global_batch_size=1, constraints=TINY))
    pts = study.points
    assert [p["status"] for p in pts] == ["ok"] * 3
    direct = run_sweep(gpt, 8, _builder, SweepSpace(global_batch_size=16, constraints=TINY)).best
    assert pts[2]["best"]["iteration_time_s"] == direct["iteration_time_s"] and pts[2]["best"]["config"] == direct["config"]
    t = [p["best"]["iteration_time_s"] for p in pts]
    assert [p["efficiency"] for p in pts] == pytest.approx([1.0, t[0] * 2 / (t[1] * 4), t[0] * 2 / (t[2] * 8)])
    assert study.summary["verdict"].startswith("scaling")
    assert all(p["best"]["compute_time_s"] > 0 for p in pts)


def test_run_scaling_weak(gpt):
    plan = plan_scaling((1, 2, 4), weak=True, per_gpu_batch=4)
    study = run_scaling(gpt, plan, _builder, SweepSpace(global_batch_size=1, constraints=TINY))
    pts = study.points
    assert [p["global_batch_size"] for p in pts] == [4, 8, 16]
    assert [p["best"]["config"]["global_batch_size"] for p in pts] == [4, 8, 16]
    t = [p["best"]["iteration_time_s"] for p in pts]
    assert [p["efficiency"] for p in pts] == pytest.approx([1.0, t[0] / t[1], t[0] / t[2]])


# ---- the command
def test_sweep_scaling_command_strong_with_site(gpt, tmp_path, capsys):
    out = tmp_path / "strong"
    rc = run_sweep_command([gpt, "--scaling", "2,4,...,16", "--global-batch-size", "8", *TINY_ARGS, "--build-top", "1",
                            "--out", str(out)])
    assert rc == 0
    data = json.loads((out / "data.json").read_text())
    s = data["scaling"]
    assert s["mode"] == "strong" and s["gpu_counts"] == [2, 4, 8, 16] and s["global_batch_sizes"] == [8, 8, 8, 8]
    assert s["threshold"] == 0.8 and s["baseline_gpus"] == 2 and len(s["points"]) == 4
    with open(out / "scaling.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["gpus"] for r in rows] == ["2", "4", "8", "16"] and list(rows[0]) == list(SCALING_COLUMNS)
    assert float(rows[1]["efficiency"]) == pytest.approx(s["points"][1]["efficiency"])
    # B = 8 on 16 GPUs leaves d <= 8: scaling breaks down by then
    assert s["breakdown"] is not None and s["breakdown"]["gpus"] <= 16
    html = (out / "site" / "index.html").read_text()
    assert 'data-chart="efficiency"' in html and "Scaling study" in html and "breaks down" in html
    assert (out / "site" / "scaling.csv").exists() and (out / "sweep.parquet").exists()
    printed = capsys.readouterr().out
    assert "strong scaling" in printed and "comparison page" in printed
    # --build-top 1: the analysis site of the first count's best, built by the main command's code path
    first = s["points"][0]
    assert first["gpus"] == 2 and first["site"] == "top/2-gpus/site/index.html"
    built = json.loads((out / "top" / "2-gpus" / "data.json").read_text())
    assert built["summary"]["iteration_time_s"] == pytest.approx(first["best"]["iteration_time_s"], rel=1e-9)
    assert built["summary"]["peak_memory_bytes"] == first["best"]["peak_memory_bytes"]
    assert built["config"]["d"] == first["best"]["config"]["d"] and built["cluster"]["num_gpus"] == 2
    assert sorted(p.name for p in (out / "top").iterdir()) == ["2-gpus"]  # only the first count
    assert html.count('href="../top/') == 2  # the table's link and the "Full analyses" one
    assert 'href="../top/2-gpus/site/index.html"' in html and fmt_s(first["best"]["iteration_time_s"]) in html
    # every count with a best configuration shows its command line, on the page and in data.json
    with_best = [p for p in s["points"] if p.get("best")]
    commands = [htmllib.unescape(c) for c in re.findall(r'<code class="d2c-cmd">(.*?)</code>', html)]
    assert commands == [p["command"] for p in with_best] and len(commands) >= 2
    assert commands[0].endswith(f"--out {out / 'top' / '2-gpus'}") and commands[0] in printed
    assert f"--out {out / 'configs'}/" in commands[1] and "not built: run the command" in html
    assert "analysis site:" in printed and str(out / "top" / "2-gpus" / "site" / "index.html") in " ".join(printed.split())
    # the second count's command, run as written, analyses the row's configuration with the row's numbers
    argv = shlex.split(commands[1])
    assert argv[:2] == ["python", "main.py"] and main(argv[2:] + ["--no-site"]) == 0
    rerun = json.loads((Path(argv[argv.index("--out") + 1]) / "data.json").read_text())
    assert rerun["summary"]["iteration_time_s"] == pytest.approx(with_best[1]["best"]["iteration_time_s"], rel=1e-9)
    words = htmllib.unescape(re.sub(r"<[^>]+>", " ", html))
    assert "Full analyses" in words and "--build-top 1" in words and "sequence_parallel" not in words


def test_sweep_scaling_command_weak_json(gpt, tmp_path, capsys):
    out = tmp_path / "weak"
    rc = run_sweep_command([gpt, "--scaling", "1,2,4", "--weak", "--global-batch-size", "4", *TINY_ARGS, "--no-site",
                            "--json", "--out", str(out)])
    assert rc == 0
    s = json.loads(capsys.readouterr().out)
    assert s["mode"] == "weak" and s["per_gpu_batch"] == 4 and s["global_batch_sizes"] == [4, 8, 16]
    # each count's command carries that count's global batch (4 per GPU); --no-site builds none
    for p in s["points"]:
        assert f"--global-batch-size {p['global_batch_size']} " in p["command"] and p["site"] is None
    assert not (out / "site").exists() and (out / "scaling.csv").exists()


def test_scaling_reproduce_builds_the_first_counts_that_have_a_best():
    def point(n, d):
        config = {"d": d, "t": 1, "p": n // d, "micro_batch_size": 1, "global_batch_size": 8, "zero_stage": 0,
                  "recompute": "none", "sequence_parallel": False, "schedule": "1f1b", "virtual_stages": 1}
        return {"gpus": n, "best": {"config": config}}

    points = [point(2, 2), {"gpus": 4, "best": None}, point(8, 4), point(16, 8)]  # 4 GPUs: nothing fits
    out = Path("out/sweep")
    commands, jobs, sites = scaling_reproduce("m.onnx", out, points, Hardware(cluster="dgx-a100"), 2)
    assert list(commands) == [2, 8, 16] and sites == {2: "2-gpus", 8: "8-gpus"}  # the first two counts that have one
    assert [n for n, _ in jobs] == [2, 8] and jobs[0][1][-2:] == ["--out", "out/sweep/top/2-gpus"]
    assert commands[16] == ("python main.py m.onnx --d 8 --t 1 --p 2 --micro-batch-size 1 --global-batch-size 8 "
                            "--cluster dgx-a100 --out out/sweep/configs/d8-t1-p2-b1-zero0-none")
    # N at least the number of counts: every count with a best; 0: none
    assert list(scaling_reproduce("m.onnx", out, points, Hardware(), 3)[2]) == [2, 8, 16]
    assert list(scaling_reproduce("m.onnx", out, points, Hardware(), 9)[2]) == [2, 8, 16]
    assert scaling_reproduce("m.onnx", out, points, Hardware(), 0)[1:] == ([], {})


@pytest.mark.parametrize("argv, words", [
    (["--scaling", "0,8"], "positive GPU counts"),
    (["--scaling", "8"], "at least two"),
    (["--scaling", "4,8", "--gpus", "8"], "not both"),
    (["--scaling", "4,8", "--weak", "--global-batch-size", "10"], "not a multiple of the first GPU count 4"),
    (["--gpus", "8", "--weak"], "belong to a scaling study"),
    (["--scaling", "4,8", "--efficiency-threshold", "2"], "efficiency-threshold"),
    ([], "sweep needs --gpus"),
])
def test_sweep_scaling_bad_input(gpt, tmp_path, argv, words):
    with pytest.raises(ConfigError, match=words) as info:
        run_sweep_command([gpt, "--out", str(tmp_path / "o"), *argv])
    assert "\n" not in str(info.value)
    assert not (tmp_path / "o").exists()
