"""Issue 19, review-grade outputs: a number never wraps away from its unit, one unit style (µs),
terminal tables readable at 80 columns, and sweep/compare rows that lead to their analysis."""

from __future__ import annotations

import html as htmllib
import json
import re
import shlex

import pytest
from rich.cells import cell_len
from rich.console import Console
from rich.text import Text

from dml2comm import zoo
from dml2comm.cli import main
from dml2comm.network.units import format_bytes, format_rate, format_seconds
from dml2comm.fmt import UNIT_SPACE, fmt_bytes, fmt_count, fmt_flops, fmt_rate, fmt_s, fmt_share, plain
from dml2comm.render.terminal import fit_table, kv_table, line, table_width
from dml2comm.search.reproduce import Hardware, analysis_argv, command_line, config_slug

NB = "\u00a0"


@pytest.fixture(scope="module")
def gpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("review") / "gpt.onnx"
    zoo.save(zoo.build_gpt(layers=4, hidden=256, heads=8, vocab=1000, seq_len=128), path)
    return str(path)


# ---- number and unit together, one unit style
def test_formatters_join_number_and_unit_with_a_no_break_space():
    assert UNIT_SPACE == NB
    assert fmt_s(0.01235) == f"12.35{NB}ms" and fmt_s(620e-6) == f"620.0{NB}µs" and fmt_s(1.5) == f"1.500{NB}s"
    assert fmt_s(850e-9) == f"850{NB}ns" and fmt_s(0) == f"0{NB}s" and fmt_s(None) == "n/a"
    assert fmt_s(92.79e-6, sig=3) == f"92.8{NB}µs"  # the collective command's three significant digits
    assert fmt_bytes(1.5 * 2**20) == f"1.50{NB}MiB" and fmt_bytes(512) == f"512{NB}B" and fmt_bytes(64 * 2**20, sig=3) == f"64{NB}MiB"
    assert fmt_rate(2.039e12) == f"2.04{NB}TB/s" and fmt_flops(17.94e9) == f"17.9{NB}GFLOP" and fmt_count(124.4e6) == f"124.40{NB}M"
    assert plain(fmt_s(0.01235)) == "12.35 ms"


def test_collective_units_are_microseconds_never_us():
    # network/units.py routes through dml2comm/fmt.py: 92.79 µs -> 3 significant digits
    assert format_seconds(92.79e-6) == f"92.8{NB}µs" and format_seconds(8.284e-3) == f"8.28{NB}ms"
    assert format_bytes(2**30) == f"1{NB}GiB" and format_rate(230e9) == f"230.0{NB}GB/s"


def test_collective_command_prints_microseconds(capsys):
    assert main(["collective", "--op", "all_reduce", "--cluster", "dgx-a100", "--n", "8", "--size", "1MiB", "--verbose"]) == 0
    out = capsys.readouterr().out
    assert "µs" in out and not re.search(r"[0-9] ?us\b", out)
    assert main(["collective", "--op", "all_reduce", "--cluster", "dgx-a100", "--n", "8", "--table", "--min-bytes", "1KiB",
                 "--max-bytes", "4KiB"]) == 0
    table = capsys.readouterr().out
    assert "# time in µs" in table and "time(µs)" in table and "(us)" not in table and "time in us" not in table


# ---- terminal tables that fit
def _render(renderable, width: int) -> str:
    console = Console(width=width, record=True, file=open("/dev/null", "w"), soft_wrap=True)
    console.print(renderable)
    return console.export_text()


ROWS = [[str(i), f"{4 * i}-{4 * i + 3}", f"30.7{NB}M", fmt_s(683.8e-6), fmt_s(1.0e-3), fmt_s(359.5e-6), fmt_bytes(468.81 * 2**20),
         fmt_bytes(561.06 * 2**20), Text(fmt_bytes(1.98 * 2**30), style="red")] for i in range(4)]
COLS = ("stage", "layers", "params/GPU", "fwd", "bwd", "DP/iter", "model states", "activations", "memory")


@pytest.mark.parametrize("width", [30, 60, 80, 120])
def test_fit_table_never_cuts_a_value(width):
    text = _render(fit_table("stages", COLS, ROWS, width), width)
    assert "…" not in text
    assert max(cell_len(l) for l in text.splitlines()) <= width
    for row in ROWS:
        for cell in row:
            assert (cell.plain if isinstance(cell, Text) else cell) in text  # whole, with its no-break space
    # 9 columns at their widest value or header word ("model states" may wrap at its space): 1 + sum(w) + 3 per column
    assert table_width(COLS, ROWS) == 1 + (5 + 6 + 10 + 8 + 7 + 8 + 10 + 11 + 8) + 3 * 9


def test_fit_table_layouts():
    assert "(continued)" not in _render(fit_table("t", COLS, ROWS, 120), 120)  # one table
    assert "(continued)" in _render(fit_table("t", COLS, ROWS, 80), 80)  # split in two, "stage" repeated
    stacked = _render(fit_table("t", COLS, ROWS, 30), 30)  # stacked key/value blocks
    assert "(continued)" not in stacked and stacked.count("model states") == 4


def test_kv_table_and_line_wrap_at_ascii_spaces_only():
    value = f"3.71{NB}ms (23.6% of the iteration; 0.507 of the busiest GPU's busy time) and 12.35{NB}ms"
    for width in (30, 40, 80):
        text = _render(kv_table("iteration", [("pipeline bubble", value)], width), width)
        assert f"3.71{NB}ms" in text and f"12.35{NB}ms" in text and "…" not in text
        assert max(cell_len(l) for l in text.splitlines()) <= width
    wrapped = line(f"peak 1.98{NB}GiB on stage 0 of 74.51{NB}GiB per GPU: fits", 20, prefix="memory:").plain
    assert f"1.98{NB}GiB" in wrapped and f"74.51{NB}GiB" in wrapped and all(len(l) <= 20 for l in wrapped.splitlines())


@pytest.mark.parametrize("width", [80, 120])
def test_analysis_summary_fits_the_terminal(gpt, tmp_path, capsys, monkeypatch, width):
    monkeypatch.setenv("COLUMNS", str(width))
    out = tmp_path / "o"
    assert main([gpt, "--d", "2", "--p", "2", "--t", "2", "--no-site", "--no-advice", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    data = json.loads((out / "data.json").read_text())
    s = data["summary"]
    assert "…" not in text
    assert max(cell_len(l) for l in text.splitlines() if str(tmp_path) not in l) <= width  # a long path stays whole
    for value in (fmt_s(s["iteration_time_s"]), fmt_s(s["compute_time_s"]), fmt_s(s["exposed_comm_time_s"]),
                  fmt_bytes(s["peak_memory_bytes"]), fmt_share(s["mfu"]), f"{s['tokens_per_s']:,.0f}"):
        assert value in text, value
    for stage in data["stages"]:
        for key in ("time_fwd_s", "time_bwd_s"):
            assert fmt_s(stage[key]) in text
        assert fmt_bytes(stage["memory"]["total_bytes"]) in text


@pytest.mark.parametrize("width", [80, 120])
def test_compare_table_fits_the_terminal(gpt, tmp_path, capsys, monkeypatch, width):
    monkeypatch.setenv("COLUMNS", str(width))
    out = tmp_path / "c"
    specs = ["d=2,t=2,p=2", "d=1,t=8,p=1,zero=1,recompute=full,sp=1"]
    assert main(["compare", gpt, "--global-batch-size", "16", "--no-site", "--out", str(out), "--configs", *specs]) == 0
    text = capsys.readouterr().out
    assert "…" not in text and max(cell_len(l) for l in text.splitlines() if str(tmp_path) not in l) <= width
    for entry in json.loads((out / "data.json").read_text())["compare"]:
        for value in (fmt_s(entry["iteration_time_s"]), fmt_bytes(entry["peak_memory_bytes"]), fmt_share(entry["mfu"]),
                      fmt_s(entry["exposed_comm_time_s"])):
            assert value in text, value
    assert "d=1,t=8,p=1,b=1,zero=1,recompute=full,sp=1" in text


# ---- sweeps and comparisons that lead somewhere
def test_command_line_of_a_row():
    config = {"d": 2, "t": 2, "p": 4, "c": 1, "e": 1, "micro_batch_size": 1, "global_batch_size": 64, "virtual_stages": 2,
              "schedule": "interleaved", "zero_stage": 1, "recompute": "full", "sequence_parallel": True, "dtype": "bf16",
              "optimizer": "adam"}
    argv = analysis_argv("my model.onnx", config, Hardware(cluster="dgx-h100", seq_len=512), "out/sweep/top/1")
    assert command_line(argv) == ("python main.py 'my model.onnx' --d 2 --t 2 --p 4 --micro-batch-size 1 --global-batch-size 64 "
                                  "--seq-len 512 --sequence-parallel --zero 1 --recompute full --schedule interleaved "
                                  "--virtual-stages 2 --cluster dgx-h100 --out out/sweep/top/1")
    assert config_slug(config) == "d2-t2-p4-b1-v2-zero1-full-sp"


def _commands(page: str) -> list[str]:
    return [htmllib.unescape(c) for c in re.findall(r'<code class="d2c-cmd">(.*?)</code>', page)]


@pytest.mark.slow  # builds two analysis sites, reruns one command and a second sweep (~7 s)
def test_sweep_page_links_the_analysis_of_its_best_rows(gpt, tmp_path, capsys):
    """--build-top 2: the page links top/1 and top/2, each built by the main command's code path;
    the linked data.json has the row's numbers, and the command shown rebuilds that data.json."""
    out = tmp_path / "sweep"
    assert main(["sweep", gpt, "--gpus", "8", "--global-batch-size", "16", "--micro-batch-sizes", "1,2", "--zero", "0,1",
                 "--recompute", "none", "--virtual-stages", "1", "--build-top", "2", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    data = json.loads((out / "data.json").read_text())
    page = (out / "site" / "index.html").read_text()
    for rank, entry in enumerate(data["sweep"]["top"][:2], 1):
        built = json.loads((out / "top" / str(rank) / "data.json").read_text())
        assert built["summary"]["iteration_time_s"] == pytest.approx(entry["iteration_time_s"], rel=1e-9)
        assert built["summary"]["peak_memory_bytes"] == entry["peak_memory_bytes"]
        assert (out / "top" / str(rank) / "site" / "index.html").is_file()
        assert f'href="../top/{rank}/site/index.html"' in page
        assert fmt_s(entry["iteration_time_s"]) in page  # the row and its site show the same time
    assert not (out / "top" / "3").exists() and 'href="../top/3/' not in page
    commands = _commands(page)
    assert len(commands) == 2 and commands[0].endswith(f"--out {out / 'top' / '1'}") and commands[0] in printed
    # every table row carries its command (top 10 and the Pareto front)
    assert page.count('<details class="d2c-cmd">') >= min(10, len(data["sweep"]["top"]))
    # the first command, run as written, writes the same data.json
    before = (out / "top" / "1" / "data.json").read_text()
    argv = shlex.split(commands[0])
    assert argv[:2] == ["python", "main.py"]
    assert main(argv[2:] + ["--no-site"]) == 0
    assert (out / "top" / "1" / "data.json").read_text() == before
    # human labels
    words = htmllib.unescape(re.sub(r"<[^>]+>", " ", page))
    assert "sequence parallel" in words and "ZeRO stage" in words and "sequence_parallel" not in words
    assert "zero_stages" not in words and "micro_batch_sizes" not in words and "1 micro-batches" not in words
    assert re.search(r"sequence parallel\s+off, on", words)
    # a rerun with --build-top 0 removes the old sites with the links
    capsys.readouterr()
    assert main(["sweep", gpt, "--gpus", "8", "--global-batch-size", "16", "--micro-batch-sizes", "1", "--zero", "0",
                 "--recompute", "none", "--virtual-stages", "1", "--build-top", "0", "--out", str(out)]) == 0
    assert not (out / "top").exists() and "../top/" not in (out / "site" / "index.html").read_text()


def test_compare_page_links_its_fastest_configuration(gpt, tmp_path):
    out = tmp_path / "cmp"
    specs = ["d=2,t=2,p=2", "d=4,t=2,p=1,b=2"]
    assert main(["compare", gpt, "--global-batch-size", "16", "--build-top", "1", "--out", str(out), "--configs", *specs]) == 0
    entries = json.loads((out / "data.json").read_text())["compare"]
    best = min((e for e in entries if e["fits"]), key=lambda e: e["iteration_time_s"])
    number = entries.index(best) + 1  # top/K: K is the configuration's "#" in the table, its place in --configs (issue 35.6)
    built = json.loads((out / "top" / str(number) / "data.json").read_text())
    assert built["summary"]["iteration_time_s"] == pytest.approx(best["iteration_time_s"], rel=1e-9)
    assert built["config"]["d"] == best["config"]["d"] and built["config"]["micro_batch_size"] == best["config"]["micro_batch_size"]
    page = (out / "site" / "index.html").read_text()
    assert f'href="../top/{number}/site/index.html"' in page and page.count("python main.py") >= len(specs)
    assert "1 micro-batches" not in page


def test_build_top_refuses_a_negative_count(gpt, capsys):
    assert main(["sweep", gpt, "--gpus", "8", "--build-top", "-1"]) == 2
    assert "--build-top" in capsys.readouterr().err
