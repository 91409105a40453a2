"""The comparison page of ``sweep`` and ``compare``: Parquet, the site, its charts, escaping and
"why the best wins"."""

from __future__ import annotations

import csv
import json

import pyarrow.parquet as pq
import pytest

from dml2comm import zoo
from dml2comm.render.sweep_charts import (BreakdownBar, MemoryItem, ParetoPoint, breakdown_chart, memory_bars_chart,
                                          pareto_chart)
from dml2comm.cli.search import run_compare_command, run_sweep_command
from dml2comm.search.explain import breakdown, why_best
from dml2comm.search.sweep import CSV_COLUMNS

EVIL = "<b>gpt</b>&\"x'"


@pytest.fixture(scope="module")
def gpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("cmpsite") / "gpt.onnx"
    zoo.save(zoo.build_gpt(layers=4, hidden=256, heads=8, vocab=1000, seq_len=128), path)
    return str(path)


@pytest.fixture(scope="module")
def sweep_out(gpt, tmp_path_factory):
    out = tmp_path_factory.mktemp("sweepsite")
    rc = run_sweep_command([gpt, "--gpus", "8", "--global-batch-size", "16", "--micro-batch-sizes", "1,2", "--zero", "0",
                            "--recompute", "none,full", "--virtual-stages", "1", "--build-top", "1", "--out", str(out)])
    assert rc == 0
    return out


def test_sweep_writes_parquet_with_the_csv_columns_typed(sweep_out):
    table = pq.read_table(sweep_out / "sweep.parquet")
    with open(sweep_out / "sweep.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert table.num_rows == len(rows) == json.loads((sweep_out / "data.json").read_text())["sweep"]["num_configs"]
    assert table.column_names == list(CSV_COLUMNS)
    types = {f.name: str(f.type) for f in table.schema}
    assert types["d"] == types["index"] == "int64" and types["fits"] == types["sequence_parallel"] == "bool"
    assert types["iteration_time_s"] == types["compute_time_s"] == "double" and types["recompute"] == "string"
    first = table.slice(0, 1).to_pylist()[0]
    assert first["iteration_time_s"] == float(rows[0]["iteration_time_s"]) and first["d"] == int(rows[0]["d"])


def test_sweep_site_has_tables_charts_and_reasons(sweep_out):
    html = (sweep_out / "site" / "index.html").read_text()
    for chart in ("breakdown", "memory-per-config", "pareto"):
        assert f'data-chart="{chart}"' in html
        assert (sweep_out / "site" / "charts").is_dir()
    assert "Why the best wins" in html and "the runner-up" in html and "headroom" in html
    assert "Top configurations" in html and "Pareto front" in html
    assert 'class="d2c-capacity"' in html
    assert (sweep_out / "site" / "sweep.csv").exists() and (sweep_out / "site" / "sweep.parquet").exists()
    assert "d2c-slot" not in html  # every chart landed in its place


def test_compare_site_side_by_side_and_run_all_csv(gpt, tmp_path, capsys):
    out = tmp_path / "cmp"
    specs = ["d=2,t=2,p=2", "d=4,t=2,p=1,b=2", "d=1,t=8,p=1,zero=1,recompute=full,sp=1"]
    assert run_compare_command([gpt, "--global-batch-size", "16", "--out", str(out), "--build-top", "1", "--configs", *specs]) == 0
    with open(out / "compare.csv", newline="") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
    assert reader.fieldnames == list(CSV_COLUMNS) and len(rows) == 3
    assert pq.read_table(out / "compare.parquet").num_rows == 3
    html = (out / "site" / "index.html").read_text()
    assert "Side by side" in html and all(s in html for s in specs)
    assert html.count('data-part="compute"') == 3  # one compute segment per configuration
    data = json.loads((out / "data.json").read_text())
    best = min(data["compare"], key=lambda e: e["iteration_time_s"])
    assert best["compute_time_s"] is not None and "The best configuration" in html
    assert "comparison page" in capsys.readouterr().out
    # --no-site: the files only
    out2 = tmp_path / "cmp2"
    assert run_compare_command([gpt, "--global-batch-size", "16", "--out", str(out2), "--no-site", "--configs", *specs[:2]]) == 0
    assert not (out2 / "site").exists() and (out2 / "compare.parquet").exists()


def test_page_escapes_model_text(sweep_out):
    from dml2comm.site.build import environment
    from dml2comm.site.compare import comparison_page

    data = json.loads((sweep_out / "data.json").read_text())
    rows = [dict(e, error=None) for e in data["sweep"]["top"]]
    sweep = dict(data["sweep"], failure_reasons={EVIL: 2})
    ctx, charts = comparison_page("sweep", rows, capacity_bytes=8e10, model={"name": EVIL, "num_layers": 6}, sweep=sweep,
                                  space={"d": [EVIL]}, downloads=["sweep.csv"])
    text = environment().get_template("compare.md.j2").render(**ctx, title="Sweep", charts={k: "" for k in charts})
    assert EVIL not in text and "&lt;b&gt;gpt&lt;/b&gt;&amp;" in text
    assert text.count("&lt;b&gt;gpt") == 3  # model, space, failure reason


# ---- pure pieces
def _r(index, time_s, compute, comm, fits=True, mem=1e9, **cfg):
    config = {"d": 1, "t": 1, "p": 1, "micro_batch_size": 1, "num_micro_batches": 4, "virtual_stages": 1, "zero_stage": 0,
              "recompute": "none", "sequence_parallel": False, "schedule": "1f1b", **cfg}
    return {"index": index, "config": config, "iteration_time_s": time_s, "compute_time_s": compute, "bubble_time_s": 0.0,
            "exposed_comm_time_s": comm, "optimizer_time_s": time_s - compute - comm, "fits": fits, "peak_memory_bytes": mem,
            "error": None}


def test_why_best_names_the_part_that_differs():
    rows = [_r(0, 1.0, 0.8, 0.1, d=8), _r(1, 1.5, 0.8, 0.6, t=8), _r(2, 2.0, 1.5, 0.4, p=8),
            _r(3, 0.5, 0.4, 0.05, fits=False, mem=9e10), _r(4, 3.0, 1.0, 1.9, p=4), _r(5, 4.0, 1.0, 2.9, p=2)]
    words = [w.replace("\u00a0", " ") for w in why_best(rows, capacity_bytes=8e10)]  # numbers keep their unit (no-break space)
    assert "d=8" in words[0] and "compute is its largest part" in words[0]
    assert "runner-up" in words[1] and "500.00 ms less exposed communication" in words[1] and "t=1 (not 8)" in words[1]
    assert "median of the 5 fitting configurations, d=1,t=1,p=8" in words[2] and "700.00 ms less compute" in words[2]
    assert any("headroom" in w for w in words)
    assert any("does not fit" in w and "fastest" in w for w in words)
    assert breakdown(rows[0])["other"] == pytest.approx(0.0)
    assert why_best([_r(0, 1.0, 1.0, 0.0, fits=False)]) == []


def test_charts_escape_text_and_draw_to_scale():
    svg = breakdown_chart([BreakdownBar("<x&>", {"compute_time_s": 1.0, "exposed_comm_time_s": 0.5}, 1.5, best=True),
                           BreakdownBar("y", {"compute_time_s": 0.5}, 0.5, over=True)])
    assert "<x&>" not in svg and "&lt;x&amp;&gt;" in svg and svg.count('class="d2c-seg"') == 3
    assert 'class="d2c-over"' in svg
    mem = memory_bars_chart([MemoryItem("a", 40 * 2**30), MemoryItem("b", 90 * 2**30)], 80e9)
    assert 'data-broken="false"' in mem and mem.count('class="d2c-mem"') == 2
    small = memory_bars_chart([MemoryItem("a", 2**30)], 80e9)
    assert 'data-broken="true"' in small and "off scale" in small
    pts = [ParetoPoint(i * 1e8, 1.0 / (i + 1), True, front=(i % 50 == 0), best=(i == 0)) for i in range(300)]
    thin = pareto_chart(pts, 8e10, max_points=100)
    assert thin.count('class="d2c-pt"') == 100 and "Simplified drawing" in thin
    assert thin.count('data-front="true"') == 6 and 'class="d2c-best"' in thin


def test_compare_numbers_each_configuration_once_in_the_table_the_sites_and_the_page(gpt, tmp_path, capsys, monkeypatch):
    """Issue 35.6: the table's "#1" and "analysis site: #1" were two configurations (the table
    counts --configs in order, the sites counted by speed).  Now "#K" is the K-th of --configs
    everywhere: the printed table, the "analysis site: #K" line, top/K and the page."""
    monkeypatch.setenv("COLUMNS", "250")  # one line per row
    out = tmp_path / "cmp"
    specs = ["d=1,t=1,p=4", "d=4,t=1,p=1"]  # the second is the faster: deep pipeline vs pure data parallelism
    assert run_compare_command([gpt, "--global-batch-size", "16", "--out", str(out), "--build-top", "1", "--configs", *specs]) == 0
    printed = capsys.readouterr().out
    data = json.loads((out / "data.json").read_text())
    times = [e["iteration_time_s"] for e in data["compare"]]
    assert times[1] < times[0]
    cells = [[c.strip() for c in line.split("\u2502")[1:3]] for line in printed.splitlines() if line.startswith("\u2502")]
    rows = dict(cells)  # the table's "#" -> config
    assert rows["1"].startswith("d=1,t=1,p=4") and rows["2"].startswith("d=4,t=1,p=1")
    site_lines = [line for line in printed.splitlines() if line.startswith("analysis site:")]
    assert len(site_lines) == 1 and site_lines[0].startswith(f"analysis site: #2 {rows['2']}:"), site_lines
    assert str(out / "top" / "2" / "site" / "index.html") in site_lines[0]
    assert (out / "top" / "2" / "site" / "index.html").exists() and not (out / "top" / "1").exists()
    html = (out / "site" / "index.html").read_text()
    full = html[html.index("Full analyses"):]
    assert "<td>2</td><td><code>d=4,t=1,p=1</code>" in full and 'href="../top/2/site/index.html"' in full
