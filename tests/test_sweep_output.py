"""What the sweep prints, and in which order: the ranking before the analysis sites are built,
the fitting part of the Pareto front first, and a caution when the best pick is close to the
GPU's capacity."""

from __future__ import annotations

import json

import pytest

from dml2comm import zoo
from dml2comm.cli import search as command
from dml2comm.cli.search import run_compare_command, run_sweep_command
from dml2comm.search.report import sweep_dict
from dml2comm.search.sweep import HEADROOM_CAUTION_FRACTION, SweepResult, headroom_caution

GiB = 2**30


@pytest.fixture(scope="module")
def gpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("sweep-output") / "gpt.onnx"
    zoo.save(zoo.build_gpt(layers=4, hidden=256, heads=8, vocab=512, seq_len=128), path)
    return str(path)


def _fake_builder(events, capsys):
    """A stand-in for the analysis-site builder: records what had been printed when it ran."""

    def build(jobs, dest, on_built=None):
        events.append(("build", capsys.readouterr().out))
        for rank, _argv in jobs:
            folder = dest(rank) / "site"
            folder.mkdir(parents=True)
            (folder / "index.html").write_text("<html></html>")
        return {}

    return build


SMALL = ["--gpus", "8", "--global-batch-size", "16", "--micro-batch-sizes", "1", "--zero", "0", "--recompute", "none",
         "--virtual-stages", "1"]


def test_sweep_prints_the_ranking_before_building_the_sites(gpt, tmp_path, capsys, monkeypatch):
    events: list[tuple[str, str]] = []
    monkeypatch.setattr(command, "build_sites", _fake_builder(events, capsys))
    assert run_sweep_command([gpt, *SMALL, "--build-top", "1", "--out", str(tmp_path / "s")]) == 0
    after = capsys.readouterr().out
    assert [e for e, _ in events] == ["build"]
    before = events[0][1]
    assert "top 10 (fitting configurations, fastest first)" in before and "Pareto front" in before
    assert "configurations, " in before and "evaluated" in before  # the counts too
    assert "wrote" not in before and "analysis site:" not in before  # what the building writes comes after it
    assert "wrote" in after and "comparison page:" in after and "analysis site: #1" in after


def test_compare_prints_its_table_before_building_the_sites(gpt, tmp_path, capsys, monkeypatch):
    events: list[tuple[str, str]] = []
    monkeypatch.setattr(command, "build_sites", _fake_builder(events, capsys))
    assert run_compare_command([gpt, "--global-batch-size", "16", "--build-top", "1", "--out", str(tmp_path / "c"),
                                "--configs", "d=2,t=2,p=2", "d=4,t=2,p=1"]) == 0
    assert "side by side" in events[0][1] and "wrote" not in events[0][1]
    assert "wrote" in capsys.readouterr().out


def _row(index, time_s, peak_gib, fits):
    config = {"d": 1, "t": 1, "p": index + 1, "micro_batch_size": 1, "virtual_stages": 1, "zero_stage": 0, "recompute": "none",
              "sequence_parallel": False}
    return {"index": index, "config": config, "iteration_time_s": time_s, "tflops_per_gpu": 100.0, "mfu": 0.3,
            "peak_memory_bytes": peak_gib * GiB, "fits": fits, "bubble_fraction": 0.0, "exposed_comm_time_s": 0.0,
            "error": None}


def test_headroom_caution_below_the_threshold_names_the_fastest_safe_pick():
    capacity = 100 * GiB
    ranked = [_row(0, 1.0, 96, True), _row(1, 1.1, 92, True), _row(2, 1.2, 85, True)]
    caution = headroom_caution(ranked, capacity)
    # 4 GiB of 100 left: 4% < 10%; #3 (85 GiB) is the first that keeps 10 GiB free (#2 keeps 8)
    assert caution["headroom_bytes"] == 4 * GiB and caution["headroom_fraction"] == pytest.approx(0.04)
    assert caution["keep_bytes"] == pytest.approx(10 * GiB) and caution["threshold_fraction"] == HEADROOM_CAUTION_FRACTION
    assert caution["safer"]["rank"] == 3 and caution["safer"]["row"] is ranked[2]
    assert headroom_caution([_row(0, 1.0, 90, True)], capacity) is None  # exactly 10% free: no caution
    assert headroom_caution([_row(0, 1.0, 99, True)], capacity)["safer"] is None
    assert headroom_caution([], capacity) is None


def _result(rows):
    return SweepResult(rows=rows, num_configs=len(rows), seconds=1.0)


def test_sweep_terminal_lists_the_fitting_front_and_counts_the_rest(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "200")
    capacity = 80 * GiB
    # fastest first: two that do not fit (1250 and 120 GiB), then three fitting with less and less memory
    rows = [_row(0, 1.0, 1250, False), _row(1, 1.1, 120, False), _row(2, 1.2, 79, True), _row(3, 1.3, 60, True),
            _row(4, 1.4, 40, True)]
    result = _result(rows)
    sweep = sweep_dict(result, 10, capacity)
    command._print_sweep(result, sweep, 10)
    out = capsys.readouterr().out
    front = out[out.index("Pareto front of the fitting configurations"):]
    assert "1.22\xa0TiB" not in front.split("faster configurations")[0] and "60.00\xa0GiB" in front  # the front's table lists only the fitting rows
    assert "2 faster configurations on the front do not fit (120.00 GiB to 1.22 TiB per GPU" in " ".join(out.split())
    # the caution: 1 GiB (1.25%) free of 80 GiB; the fastest keeping 8 GiB is #2 (60 GiB)
    text = " ".join(out.split())
    assert "caution: #1 leaves only 1.00 GiB (1.2%) of the 80.00 GiB the allocator can hold free" in text
    assert "Keep at least 10% (8.00 GiB) free: the fastest that does is #2" in text
    assert sweep["memory_caution"]["safer"]["rank"] == 2 and sweep["memory_caution"]["safer"]["index"] == 3
    json.dumps(sweep)  # data.json can hold it


def test_no_caution_with_enough_headroom(monkeypatch, capsys):
    result = _result([_row(0, 1.0, 50, True)])
    sweep = sweep_dict(result, 10, 80 * GiB)
    assert sweep["memory_caution"] is None
    command._print_sweep(result, sweep, 10)
    assert "caution" not in capsys.readouterr().out


def test_nothing_fits_shows_the_whole_front(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "200")
    result = _result([_row(0, 1.0, 200, False), _row(1, 1.1, 100, False)])
    command._print_sweep(result, sweep_dict(result, 10, 80 * GiB), 10)
    out = " ".join(capsys.readouterr().out.split())  # fmt_bytes joins number and unit with a no-break space
    assert "none fits" in out and "100.00 GiB" in out and "200.00 GiB" in out


def test_memory_chart_cuts_the_axis_past_one_and_a_half_capacities():
    import re

    from dml2comm.render.sweep_charts import MEMORY_AXIS_CLIP, MemoryItem, memory_bars_chart

    capacity = 80 * GiB
    svg = memory_bars_chart([MemoryItem("a", 50 * GiB), MemoryItem("b", 70 * GiB), MemoryItem("far over", 1250 * GiB)], capacity)
    widths = {int(m.group(2)): float(m.group(1)) for m in re.finditer(r'width="([0-9.]+)"[^>]*class="d2c-mem" data-row="(\d)"', svg)}
    # the axis ends at 1.5 x 80 = 120 GiB: the 50 GiB bar is 50/120 of the clipped one, not 50/1250
    assert MEMORY_AXIS_CLIP == 1.5
    assert widths[0] / widths[2] == pytest.approx(50 / 120, rel=1e-3)
    assert svg.count('data-clipped="true"') == 1 and f'data-bytes="{1250 * GiB}" data-clipped="true"' in svg
    assert "axis cut at 1.5× the GPU capacity (120.00\xa0GiB)" in svg and "1.22\xa0TiB over" in svg  # the true peak labelled
    # nothing past the clip: the axis is the usual one
    plain = memory_bars_chart([MemoryItem("a", 50 * GiB), MemoryItem("b", 110 * GiB)], capacity)
    assert "data-clipped" not in plain and "axis cut" not in plain
